"""The interfaces every store layer implements, and the few helpers they share.

`KeyValueStore` is bytes in, bytes out, at every layer below the metered one, so a layer can wrap any
other (Kafka Streams' `KeyValueStore<Bytes, byte[]>` stack). Ranges follow Kafka Streams: `range(lo,
hi)` includes both ends; `None` means unbounded. The one primitive each layer really implements is
`scan(lo, hi)`: half-open [lo, hi), ascending byte order — `range`, `prefix_scan` and `all` derive from
it (the key right after `hi` in byte order is `hi + b"\\x00"`, so inclusive becomes half-open exactly).
"""
from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any, Iterable, Iterator, Optional, Protocol, runtime_checkable

Bytes = bytes
KV = tuple  # (key_bytes, value_bytes)


@runtime_checkable
class KeyValueStore(Protocol):
    """Bytes-level key-value store: the contract of every layer (and, typed, of MeteredStore)."""

    name: str

    def get(self, key: bytes) -> Optional[bytes]: ...

    def put(self, key: bytes, value: Optional[bytes]) -> None:
        """Insert or overwrite; value None deletes."""

    def put_if_absent(self, key: bytes, value: bytes) -> Optional[bytes]:
        """Put only when the key has no value; returns the existing value (None if it was put)."""

    def delete(self, key: bytes) -> Optional[bytes]:
        """Remove the key; returns the old value."""

    def scan(self, lo: Optional[bytes] = None, hi: Optional[bytes] = None) -> Iterator[KV]:
        """Half-open [lo, hi) in ascending byte order."""

    def range(self, lo: Optional[bytes], hi: Optional[bytes]) -> Iterator[KV]:
        """Inclusive [lo, hi] (Kafka Streams semantics)."""

    def prefix_scan(self, prefix: bytes) -> Iterator[KV]: ...

    def all(self) -> Iterator[KV]: ...

    def approximate_count(self) -> int: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class WindowStore(Protocol):
    """Windowed store: a value per (key, window_start); old time segments are dropped as a whole."""

    name: str

    def put(self, key: Any, value: Any, window_start: int) -> None: ...

    def get(self, key: Any, window_start: int) -> Any: ...

    def fetch(self, key: Any, t_from: int, t_to: int) -> Iterator[tuple]:
        """(window_start, value) for t_from <= window_start <= t_to, ascending."""

    def fetch_all(self, t_from: int, t_to: int) -> Iterator[tuple]:
        """(key, window_start, value) in (key_bytes + window_start) byte order."""

    def flush(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class ChangelogSink(Protocol):
    """Receives every write the change-logging layer forwards; owned by the task state manager."""

    def append(self, store: str, key: bytes, value: Optional[bytes]) -> None: ...

    def extend(self, store: str, keys: list, values: list) -> None: ...


class RecordingSink:
    """An in-memory changelog for tests and benches: `records` is a list of (store, key, value)."""

    def __init__(self) -> None:
        self.records: list = []
        self.append_calls = 0

    def append(self, store: str, key: bytes, value: Optional[bytes]) -> None:
        self.records.append((store, key, value))

    def extend(self, store: str, keys: list, values: list) -> None:
        self.records.extend(zip([store] * len(keys), keys, values))

    def for_store(self, store: str) -> list:
        return [(k, v) for s, k, v in self.records if s == store]

    def clear(self) -> None:
        self.records.clear()


# -- helpers shared by the layers -------------------------------------------------------------

def successor(key: bytes) -> bytes:
    """The smallest key greater than `key`: inclusive upper bounds become exclusive ones."""
    return key + b"\x00"


def prefix_end(prefix: bytes) -> Optional[bytes]:
    """The smallest key greater than every key starting with `prefix` (None: unbounded)."""
    p = prefix.rstrip(b"\xff")
    if not p:
        return None
    return p[:-1] + bytes((p[-1] + 1,))


class StoreBase:
    """Derives range/prefix_scan/all/put_if_absent from get/put/scan, so each layer stays small."""

    name: str = ""

    def range(self, lo: Optional[bytes], hi: Optional[bytes]) -> Iterator[KV]:
        return self.scan(lo, None if hi is None else hi + b"\x00")

    def prefix_scan(self, prefix: bytes) -> Iterator[KV]:
        return self.scan(prefix, prefix_end(prefix))

    def all(self) -> Iterator[KV]:
        return self.scan(None, None)

    def put_if_absent(self, key: bytes, value: bytes) -> Optional[bytes]:
        old = self.get(key)
        if old is None:
            self.put(key, value)
        return old

    def get_many(self, keys: list) -> list:
        """The values of `keys` (None where absent), in order. Layers override it to read in bulk."""
        get = self.get
        return [get(k) for k in keys]

    def put_many(self, keys: list, values: list) -> None:
        """`put` each key (distinct keys). Layers override it to write in bulk."""
        for k, v in zip(keys, values):
            self.put(k, v)

    def delete(self, key: bytes) -> Optional[bytes]:
        old = self.get(key)
        self.put(key, None)
        return old

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def merge_overlay(upper: Iterable[tuple], lower: Iterable[KV]) -> Iterator[KV]:
    """Merge two ascending (key, value) streams; `upper` wins on equal keys and its None values hide
    the key (tombstones). Used wherever a layer holds newer data than the one below it."""
    up = iter(upper)
    lo = iter(lower)
    _end = object()
    u = next(up, _end)
    l = next(lo, _end)
    while u is not _end and l is not _end:
        uk = u[0]
        lk = l[0]
        if uk < lk:
            if u[1] is not None:
                yield u
            u = next(up, _end)
        elif lk < uk:
            yield l
            l = next(lo, _end)
        else:
            if u[1] is not None:
                yield u
            u = next(up, _end)
            l = next(lo, _end)
    while u is not _end:
        if u[1] is not None:
            yield u
        u = next(up, _end)
    while l is not _end:
        yield l
        l = next(lo, _end)


class SortedKeys:
    """A sorted view of a dict's keys that costs nothing per write.

    Writers call `added(key)` when a key enters the dict (a list append) and `removed()` when one
    leaves; the sort happens lazily when a range is asked for: new keys are sorted on their own and
    merged (Timsort merges two sorted runs in linear time) or, when they are few against a long view,
    inserted one by one (so a scan after every write costs a memmove, not a copy and a merge of the
    whole view); stale keys are skipped while reading and purged when they pile up. Point reads and
    writes, the hot path, never pay for ordering.
    """

    __slots__ = ("_d", "_sorted", "_new", "_stale")

    def __init__(self, d: dict) -> None:
        self._d = d
        self._sorted: list = sorted(d)
        self._new: list = []
        self._stale = 0

    def added(self, key: bytes) -> None:
        self._new.append(key)

    def added_many(self, keys) -> None:
        new = self._new
        if len(new) > 2 * len(self._d) + 4096:
            # keys that left the dict before any scan (a cache evicting a build's keys batch
            # after batch) would otherwise pile up here, holding their bytes, until one. Only
            # the keys told before: a writer may tell these before it puts them in the dict
            d = self._d
            new = self._new = [k for k in new if k in d]
        new.extend(keys)

    def removed(self, n: int = 1) -> None:
        self._stale += n

    def reset(self) -> None:
        self._sorted = sorted(self._d)
        self._new = []
        self._stale = 0

    def _refresh(self) -> list:
        d = self._d
        srt = self._sorted
        if self._stale > 64 and self._stale * 2 > len(srt):
            srt = [k for k in srt if k in d]
            self._stale = 0
        if self._new:
            new = sorted({k for k in self._new if k in d})
            self._new = []
            if srt:
                n = len(srt)
                fresh = []
                for k in new:
                    i = bisect_left(srt, k)
                    if i == n or srt[i] != k:
                        fresh.append(k)
                new = fresh
            if len(new) * 8 < len(srt):
                # a few keys into a long view (a scan after each write, as session windows and
                # joins do): one memmove each, instead of copying and re-sorting the whole view
                for k in new:
                    insort(srt, k)
            elif new:
                srt = srt + new
                srt.sort()
        self._sorted = srt
        return srt

    def keys_in(self, lo: Optional[bytes], hi: Optional[bytes]) -> list:
        """Keys of the dict in [lo, hi), ascending (a snapshot: callers may write while iterating)."""
        srt = self._refresh()
        i = 0 if lo is None else bisect_left(srt, lo)
        j = len(srt) if hi is None else bisect_left(srt, hi)
        if i >= j:
            return []
        d = self._d
        if self._stale:
            return [k for k in srt[i:j] if k in d]
        return srt[i:j]
