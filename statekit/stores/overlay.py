"""The pending overlay shared by the inner stores (RocksDB and memory).

Between two commits an inner store never touches its committed data: writes land in an overlay dict
(None = deleted) plus a list of pending range deletes, and every read consults the overlay first.
A commit writes the overlay out in one go (RocksDB: one WriteBatch for the whole task), so the
committed data only ever holds whole commits, and `discard()` rolls back to the last commit for free.
The overlay holds the latest value per key, so repeated writes to a key collapse even when the
record cache is switched off.
"""
from __future__ import annotations

from typing import Iterator, Optional

from statekit.stores.api import KV, SortedKeys, StoreBase, merge_overlay

_MISS = object()


class OverlayStore(StoreBase):
    """Base of the inner stores; subclasses provide `_committed_get` and `_committed_scan`."""

    persistent = False

    def __init__(self, name: str) -> None:
        self.name = name
        self._ov: dict = {}
        self._ovkeys = SortedKeys(self._ov)
        self._ranges: list = []  # pending range deletes [lo, hi), applied before the overlay

    # -- to be provided ---------------------------------------------------------------------
    def _committed_get(self, key: bytes) -> Optional[bytes]:
        raise NotImplementedError

    def _committed_scan(self, lo: Optional[bytes], hi: Optional[bytes]) -> Iterator[KV]:
        raise NotImplementedError

    def _committed_count(self) -> int:
        raise NotImplementedError

    def _committed_get_many(self, keys: list) -> list:
        get = self._committed_get
        return [get(k) for k in keys]

    # -- reads -----------------------------------------------------------------------------
    def get(self, key: bytes) -> Optional[bytes]:
        v = self._ov.get(key, _MISS)
        if v is not _MISS:
            return v
        if self._ranges and self._deleted_by_range(key):
            return None
        return self._committed_get(key)

    def get_many(self, keys: list) -> list:
        """Pending values first; the rest from the committed data in one bulk read."""
        ov = self._ov
        if not ov and not self._ranges:
            return self._committed_get_many(keys)
        out = [ov.get(k, _MISS) for k in keys]
        miss = [i for i, v in enumerate(out) if v is _MISS]
        if miss:
            found = self._committed_get_many([keys[i] for i in miss])
            ranged = self._ranges and self._deleted_by_range
            for i, v in zip(miss, found):
                out[i] = None if ranged and ranged(keys[i]) else v
        return out

    def scan(self, lo: Optional[bytes] = None, hi: Optional[bytes] = None) -> Iterator[KV]:
        ov = self._ov
        keys = self._ovkeys.keys_in(lo, hi)
        lower = self._committed_scan(lo, hi)
        if self._ranges:
            lower = (kv for kv in lower if not self._deleted_by_range(kv[0]))
        if not keys:
            return lower
        return merge_overlay([(k, ov[k]) for k in keys], lower)

    def approximate_count(self) -> int:
        """The committed count corrected by the pending writes: an overwrite adds nothing, a
        delete of a key that was never committed removes nothing, a pending range delete removes
        the committed keys it covers. Exact when the committed count is (memory stores; RocksDB's
        own count is an estimate that may count an overwritten key twice until compaction)."""
        n = self._committed_count()
        ranged = self._ranges and self._deleted_by_range
        ranges = self._ranges
        for i, (lo, hi) in enumerate(ranges):
            # committed keys under a pending range delete (each once: ranges may overlap)
            earlier = ranges[:i]
            for k, _ in self._committed_scan(lo, hi):
                if not any(elo <= k and (ehi is None or k < ehi) for elo, ehi in earlier):
                    n -= 1
        cget = self._committed_get
        for k, v in self._ov.items():
            had = (not ranged or not ranged(k)) and cget(k) is not None
            n += (v is not None) - had
        return max(n, 0)

    # -- writes (pending until commit) -----------------------------------------------------
    def put(self, key: bytes, value: Optional[bytes]) -> None:
        ov = self._ov
        if key not in ov:
            self._ovkeys.added(key)
        ov[key] = value

    def put_many(self, keys: list, values: list) -> None:
        ov = self._ov
        if ov:
            self._ovkeys.added_many([k for k in keys if k not in ov])
        else:
            self._ovkeys.added_many(keys)
        ov.update(zip(keys, values))

    def delete_range(self, lo: bytes, hi: Optional[bytes]) -> None:
        """Delete every key in [lo, hi) (pending, like every write). Retention drops segments so."""
        ov = self._ov
        for k in self._ovkeys.keys_in(lo, hi):
            del ov[k]
            self._ovkeys.removed()
        self._ranges.append((lo, hi))

    def _deleted_by_range(self, key: bytes) -> bool:
        for lo, hi in self._ranges:
            if lo <= key and (hi is None or key < hi):
                return True
        return False

    # -- commit support --------------------------------------------------------------------
    def pending_count(self) -> int:
        """Uncommitted writes (keys in the overlay, plus pending range deletes)."""
        return len(self._ov) + len(self._ranges)

    def discard(self) -> None:
        """Forget every uncommitted write: reads return the last commit again."""
        self._ov.clear()
        self._ovkeys.reset()
        self._ranges = []

    def _pending_ops(self):
        """(range_deletes, overlay_items): what a commit must write, in this order."""
        return self._ranges, self._ov.items()
