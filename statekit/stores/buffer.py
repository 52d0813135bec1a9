"""Suppression buffers: records held back until a time, evicted in time order (Kafka Streams'
TimeOrderedKeyValueBuffer), as a store with a changelog like any other.

One entry per key. Each entry has a *buffer time* (when it may go: a window's end, or the time its
first update arrived), the latest change (`value` and the `old` value that change replaced), the
value before the key entered the buffer (`prior`: what was last emitted downstream), and the
metadata of the record that wrote it. `evict_until(t)` removes
and returns every entry whose time is <= t in (time, key bytes) order; `pop_oldest()` the first one.

Layout on an ordinary key-value stack (so caching, change-logging, commit and restore are the kv
ones, and the changelog is a compacted topic):

    b"\\x00" + time (8 bytes, order-preserving) + key bytes  ->  the entry (see `_encode`)
    b"\\x01" + key bytes                                     ->  time (8 bytes): find a key's entry
    b"\\x02"                                                 ->  the number of entries (8 bytes)

so the oldest entries are one seek away and a key's entry is one point read away.
"""
from __future__ import annotations

import struct
from time import perf_counter_ns as _now
from typing import Any, Iterator, NamedTuple, Optional

from statekit.stores.metered import Meter
from statekit.stores.serdes import get_serde

_T = struct.Struct(">Q")
_HEAD = struct.Struct(">qqiBH")    # timestamp, offset, partition, flags, topic length
_L = struct.Struct(">I")
_BIAS = 1 << 63                    # signed time -> unsigned, order-preserving
ENTRY, INDEX, COUNT = b"\x00", b"\x01", b"\x02"


class BufferedRecord(NamedTuple):
    time: int
    key: Any
    value: Any          # the latest value (None: a tombstone)
    old: Any            # the value the latest change replaced
    prior: Any          # the value before the key entered the buffer
    timestamp: int      # metadata of the record that last wrote the entry
    offset: Optional[int] = None
    partition: Optional[int] = None
    topic: Optional[str] = None


class MeteredBufferStore(Meter):
    """Typed suppression buffer (see the module docstring)."""

    OPS = ("put", "get", "delete", "evict", "all", "flush")

    def __init__(self, inner, key_serde: Any = "json", value_serde: Any = "json") -> None:
        self.name = inner.name
        self.inner = inner
        self.key_serde = get_serde(key_serde)
        self.value_serde = get_serde(value_serde)
        self._kb = self.key_serde.to_bytes
        self._kd = self.key_serde.from_bytes
        self._vb = self.value_serde.to_bytes
        self._vd = self.value_serde.from_bytes
        # no entry is older than this (time bytes; None: unknown). An eviction deletes its entries in
        # the record cache while RocksDB still holds them until the commit, so a scan from the start
        # would walk every entry evicted earlier in the batch again (quadratic in a batch)
        self._floor: Optional[bytes] = None
        self._init_meter()

    # -- encoding ---------------------------------------------------------------------------------
    def _encode(self, value, old, prior, timestamp, offset, partition, topic) -> bytes:
        tb = (topic or "").encode("utf-8")
        flags = ((value is not None) | ((old is not None) << 1) | ((prior is not None) << 3)
                 | ((topic is not None) << 2))
        parts = [_HEAD.pack(int(timestamp), -1 if offset is None else int(offset),
                            -1 if partition is None else int(partition), flags, len(tb)), tb]
        for present, v in ((value is not None, value), (old is not None, old),
                           (prior is not None, prior)):
            if present:
                b = self._vb(v)
                parts.append(_L.pack(len(b)))
                parts.append(b)
        return b"".join(parts)

    def _decode(self, time: int, kb: bytes, raw: bytes) -> BufferedRecord:
        ts, off, part, flags, tl = _HEAD.unpack_from(raw, 0)
        pos = _HEAD.size
        topic = raw[pos:pos + tl].decode("utf-8") if flags & 4 else None
        pos += tl
        vals = []
        for bit in (1, 2, 8):
            if flags & bit:
                (ln,) = _L.unpack_from(raw, pos)
                pos += 4
                vals.append(self._vd(raw[pos:pos + ln]))
                pos += ln
            else:
                vals.append(None)
        return BufferedRecord(time, self._kd(kb), vals[0], vals[1], vals[2], ts,
                              None if off < 0 else off, None if part < 0 else part, topic)

    def reset_floor(self) -> None:
        """Forget what was evicted: a rollback (TaskDB.discard) or a restore brought entries back."""
        self._floor = None

    def _count(self) -> int:
        raw = self.inner.get(COUNT)
        return 0 if raw is None else _T.unpack(raw)[0]

    def _set_count(self, n: int) -> None:
        self.inner.put(COUNT, _T.pack(n) if n else None)

    # -- operations -------------------------------------------------------------------------------
    def put(self, key: Any, time: int, value: Any, old: Any, prior: Any, timestamp: int,
            offset: Optional[int] = None, partition: Optional[int] = None,
            topic: Optional[str] = None) -> None:
        """Write the entry of `key` at buffer time `time` (replacing any entry of the key)."""
        t = _now()
        kb = self._kb(key)
        tk = _T.pack(int(time) + _BIAS)
        was = self.inner.get(INDEX + kb)
        if was is None:
            self._set_count(self._count() + 1)
        elif was != tk:
            self.inner.put(ENTRY + was + kb, None)
        if was != tk:
            self.inner.put(INDEX + kb, tk)
        if self._floor is not None and tk < self._floor:
            self._floor = tk
        self.inner.put(ENTRY + tk + kb, self._encode(value, old, prior, timestamp, offset, partition,
                                                     topic))
        self._ns_put += _now() - t
        self._n_put += 1

    def get(self, key: Any) -> Optional[BufferedRecord]:
        t = _now()
        kb = self._kb(key)
        out = None
        tk = self.inner.get(INDEX + kb)
        if tk is not None:
            raw = self.inner.get(ENTRY + tk + kb)
            if raw is not None:
                out = self._decode(_T.unpack(tk)[0] - _BIAS, kb, raw)
        self._ns_get += _now() - t
        self._n_get += 1
        return out

    def delete(self, key: Any) -> Optional[BufferedRecord]:
        t = _now()
        old = self.get(key)
        if old is not None:
            self._remove(_T.pack(old.time + _BIAS), self._kb(key))
        self._ns_delete += _now() - t
        self._n_delete += 1
        return old

    def _remove(self, tk: bytes, kb: bytes) -> None:
        self.inner.put(ENTRY + tk + kb, None)
        self.inner.put(INDEX + kb, None)
        self._set_count(self._count() - 1)

    def _entries(self, hi: Optional[bytes] = None) -> Iterator[tuple]:
        """(time bytes, key bytes, raw entry) in (time, key bytes) order, below `hi`."""
        lo = ENTRY if self._floor is None else ENTRY + self._floor
        for k, v in self.inner.scan(lo, hi if hi is not None else INDEX):
            yield k[1:9], k[9:], v

    def evict_until(self, time: int) -> list:
        """Remove and return every entry with buffer time <= `time`, oldest first."""
        t = _now()
        hi = ENTRY + _T.pack(int(time) + _BIAS + 1) if time + _BIAS + 1 < (1 << 64) else None
        out = [(tk, kb, raw) for tk, kb, raw in self._entries(hi)]   # read all, then write
        recs = []
        for tk, kb, raw in out:
            recs.append(self._decode(_T.unpack(tk)[0] - _BIAS, kb, raw))
            self.inner.put(ENTRY + tk + kb, None)
            self.inner.put(INDEX + kb, None)
        if out:
            self._set_count(self._count() - len(out))
        if hi is not None:
            self._floor = hi[1:]     # every entry older than hi is gone now
        self._ns_evict += _now() - t
        self._n_evict += 1
        return recs

    def pop_oldest(self) -> Optional[BufferedRecord]:
        """Remove and return the entry with the smallest (time, key bytes), if any."""
        t = _now()
        first = next(iter(self._entries()), None)
        rec = None
        if first is not None:
            tk, kb, raw = first
            rec = self._decode(_T.unpack(tk)[0] - _BIAS, kb, raw)
            self._remove(tk, kb)
            self._floor = tk
        self._ns_evict += _now() - t
        self._n_evict += 1
        return rec

    def min_time(self) -> Optional[int]:
        first = next(iter(self._entries()), None)
        return None if first is None else _T.unpack(first[0])[0] - _BIAS

    def count(self) -> int:
        """How many entries the buffer holds (exact: kept in the store itself)."""
        return self._count()

    def all(self) -> Iterator[BufferedRecord]:
        """Every entry, oldest first."""
        t = _now()
        it = self._entries()
        self._ns_all += _now() - t
        self._n_all += 1
        return (self._decode(_T.unpack(tk)[0] - _BIAS, kb, raw) for tk, kb, raw in it)

    def approximate_count(self) -> int:
        return self._count()

    def flush(self) -> None:
        t = _now()
        self.inner.flush()
        self._ns_flush += _now() - t
        self._n_flush += 1

    def close(self) -> None:
        self.inner.close()

    def to_pandas(self, limit: Optional[int] = None):
        import pandas as pd

        rows = []
        for i, r in enumerate(self.all()):
            if limit is not None and i >= limit:
                break
            rows.append((r.time, r.key, r.value, r.old, r.prior, r.timestamp))
        return pd.DataFrame(rows, columns=["time", "key", "value", "old", "prior", "timestamp"])

    def __repr__(self) -> str:
        return f"MeteredBufferStore({self.name!r})"
