"""In-memory bytes store: the same interface and commit semantics as RocksDBStore, nothing on disk.

Committed data is a dict plus a lazily sorted key list (see api.SortedKeys; no dependency needed).
Writes wait in the overlay until `commit()` like in RocksDB, so a task rolls back the same way
whatever its backend. After a restart a memory store is empty: it always restores from the log start.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional

from statekit.stores.api import KV, SortedKeys
from statekit.stores.overlay import OverlayStore


class MemoryStore(OverlayStore):
    persistent = False

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._data: dict = {}
        self._keys = SortedKeys(self._data)

    def _committed_get(self, key: bytes) -> Optional[bytes]:
        return self._data.get(key)

    def _committed_scan(self, lo: Optional[bytes], hi: Optional[bytes]) -> Iterator[KV]:
        get = self._data.get
        return ((k, v) for k in self._keys.keys_in(lo, hi) if (v := get(k)) is not None)

    def _committed_count(self) -> int:
        return len(self._data)

    def _committed_get_many(self, keys: list) -> list:
        get = self._data.get
        return [get(k) for k in keys]

    def commit(self) -> None:
        """Apply the pending writes (TaskDB.commit calls this after its RocksDB batch, if any)."""
        ranges, items = self._pending_ops()
        for lo, hi in ranges:
            self._delete_committed_range(lo, hi)
        self._apply(items)
        self.discard()

    def _delete_committed_range(self, lo: bytes, hi: Optional[bytes]) -> None:
        data = self._data
        for k in self._keys.keys_in(lo, hi):
            del data[k]
            self._keys.removed()

    def _apply(self, items: Iterable[tuple]) -> int:
        data = self._data
        keys = self._keys
        n = 0
        for k, v in items:
            n += 1
            if v is None:
                if data.pop(k, None) is not None:
                    keys.removed()
            else:
                if k not in data:
                    keys.added(k)
                data[k] = v
        return n

    def _restore_into(self, batch, items: Iterable[tuple]) -> int:
        """Restore path: straight into the committed data (memory stores are not in the batch)."""
        return self._apply(items)

    def _restore_delete_range(self, batch, lo: bytes, hi: Optional[bytes]) -> None:
        self._delete_committed_range(lo, hi)

    def wipe(self) -> None:
        self.discard()
        self._data.clear()
        self._keys.reset()

    def close(self) -> None:
        pass
