"""Window stores on the same layer stack as key-value stores.

Layout. Above the inner store a window record is a key-value record whose key is
`key_bytes + 8-byte big-endian window_start` (the changelog carries exactly that, as Kafka Streams'
window changelogs do), so caching and change-logging are the ordinary KV layers. Just above the inner
store, `SegmentedStore` prefixes the segment id: the inner key is
`segment(8 bytes BE) + key_bytes + window_start(8 bytes BE)`, with segment = window_start // segment_ms.

Why segment-first: retention drops a whole segment with one range delete of its 8-byte prefix (no
scan, one tombstone in RocksDB), and within a segment a key's windows are adjacent and in time order,
so `fetch(key, t_from, t_to)` is one seek per live segment (few: retention / segment_ms + 1) and the
per-segment results are already in time order. `fetch_all(t_from, t_to)` walks the live data and
filters by time (an inspection operation). All in one column family per store, so a window store
commits with the task's WriteBatch like any other store.

Retention: stream time is the largest window start seen. A window is expired when
`window_start < stream_time - retention_ms`; puts of expired windows are dropped, reads hide them,
and a segment is removed (pending, committed with the next commit) once all its windows expired.
"""
from __future__ import annotations

import heapq
import struct
from bisect import bisect_left, insort
from operator import itemgetter
from time import perf_counter_ns as _now
from typing import Any, Iterable, Iterator, Optional

from statekit.stores.api import KV, StoreBase
from statekit.stores.metered import Meter
from statekit.stores.serdes import get_serde

_Q = struct.Struct(">Q")
_pack = _Q.pack
_unpack_from = _Q.unpack_from


def window_key(key_bytes: bytes, window_start: int) -> bytes:
    """The composite key above the segmented layer (and in the changelog)."""
    return key_bytes + _pack(window_start)


def split_window_key(composite: bytes) -> tuple:
    """(key_bytes, window_start) of a composite key."""
    return composite[:-8], _unpack_from(composite, len(composite) - 8)[0]


def default_segment_ms(retention_ms: Optional[int]) -> int:
    """Kafka Streams' default: half the retention, at least a minute (a day without retention)."""
    if retention_ms is None:
        return 86_400_000
    return max(retention_ms // 2, 60_000)


class SegmentedStore(StoreBase):
    """KV store on composite keys that files every record under its time segment (see module doc)."""

    def __init__(self, inner, segment_ms: int, retention_ms: Optional[int] = None,
                 stream_time_source=None) -> None:
        if segment_ms <= 0:
            raise ValueError("segment_ms must be > 0")
        self.name = inner.name
        self.inner = inner
        self.segment_ms = int(segment_ms)
        self.retention_ms = None if retention_ms is None else int(retention_ms)
        self.stream_time = -1
        self.min_live = 0           # segments below this are dropped (or about to be)
        self._segments: list = []   # sorted ids of segments that may hold data
        self.segments_dropped = 0
        self.expired_dropped = 0
        # the committed stream time (the task meta): data alone can under-state it, e.g. when the
        # latest window was deleted, and then expired windows would come back after a restart
        self.stream_time_source = stream_time_source
        self.reload()

    # -- time and segments -------------------------------------------------------------------
    def expiry_floor(self) -> Optional[int]:
        """Windows starting before this are expired (None: no retention)."""
        if self.retention_ms is None or self.stream_time < 0:
            return None
        return self.stream_time - self.retention_ms

    def _advance(self, ts: int) -> bool:
        """Move stream time; True when segments became droppable."""
        if ts <= self.stream_time:
            return False
        self.stream_time = ts
        if self.retention_ms is None:
            return False
        floor = ts - self.retention_ms
        if floor <= 0:
            return False
        live = floor // self.segment_ms
        if live > self.min_live:
            self.min_live = live
            return bool(self._segments) and self._segments[0] < live
        return False

    def _drop_expired(self) -> int:
        i = bisect_left(self._segments, self.min_live)
        dropped = self._segments[:i]
        if dropped:
            del self._segments[:i]
            self.segments_dropped += len(dropped)
        return len(dropped)

    def observe(self, ts: int) -> None:
        """Stream time saw `ts`: drop (pending) every segment whose windows all expired."""
        if self._advance(ts) and self._drop_expired():
            self.inner.delete_range(b"", _pack(self.min_live))

    def segments(self) -> list:
        return list(self._segments)

    def reload(self) -> None:
        """Recompute segments and stream time from what the inner store holds (open, rollback)."""
        segs = []
        scan = self.inner.scan
        lo = b""
        while True:
            first = next(iter(scan(lo, None)), None)
            if first is None:
                break
            s = _unpack_from(first[0], 0)[0]
            segs.append(s)
            lo = _pack(s + 1)
        self._segments = segs
        self.stream_time = -1
        self.min_live = 0
        top = -1
        if self.stream_time_source is not None:
            top = self.stream_time_source()
        if segs:
            last = segs[-1]
            for k, _ in scan(_pack(last), _pack(last + 1)):
                ts = _unpack_from(k, len(k) - 8)[0]
                if ts > top:
                    top = ts
        if top >= 0:
            self._advance(top)
            if self._drop_expired():
                self.inner.delete_range(b"", _pack(self.min_live))

    # -- KeyValueStore on composite keys ------------------------------------------------------
    def get(self, key: bytes) -> Optional[bytes]:
        seg = _unpack_from(key, len(key) - 8)[0] // self.segment_ms
        if seg < self.min_live:
            return None
        return self.inner.get(_pack(seg) + key)

    def put(self, key: bytes, value: Optional[bytes]) -> None:
        ts = _unpack_from(key, len(key) - 8)[0]
        self.observe(ts)
        seg = ts // self.segment_ms
        if seg < self.min_live:
            self.expired_dropped += 1
            return
        segs = self._segments
        if not segs or segs[-1] < seg:
            segs.append(seg)
        elif seg not in segs:
            insort(segs, seg)
        self.inner.put(_pack(seg) + key, value)

    def scan(self, lo: Optional[bytes] = None, hi: Optional[bytes] = None) -> Iterator[KV]:
        parts = []
        for s in list(self._segments):
            p = _pack(s)
            parts.append(self._strip(self.inner.scan(p + lo if lo is not None else p,
                                                     p + hi if hi is not None else _pack(s + 1))))
        if not parts:
            return iter(())
        if len(parts) == 1:
            return parts[0]
        return heapq.merge(*parts, key=itemgetter(0))

    @staticmethod
    def _strip(it: Iterable[KV]) -> Iterator[KV]:
        for k, v in it:
            yield k[8:], v

    def approximate_count(self) -> int:
        return self.inner.approximate_count()

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()

    # -- restore path (TaskDB.write_batch_raw) --------------------------------------------------
    def _restore_into(self, batch, items: Iterable[tuple]) -> int:
        out = []
        segs = self._segments
        for ck, v in items:
            ts = _unpack_from(ck, len(ck) - 8)[0]
            if v is not None:
                # a tombstone is no evidence that stream time got there: it may be a seal's
                # (statekit.state.task) for a window only a crashed attempt wrote. The committed
                # stream time comes from the task meta (stream_time_source) when the task reopens.
                self._advance(ts)
            seg = ts // self.segment_ms
            if seg < self.min_live:
                self.expired_dropped += 1
                continue
            if not segs or segs[-1] < seg:
                segs.append(seg)
            elif seg not in segs:
                insort(segs, seg)
            out.append((_pack(seg) + ck, v))
        n = self.inner._restore_into(batch, out)
        if self._drop_expired():
            # after the puts in the same batch: records of now-expired segments go too
            self.inner._restore_delete_range(batch, b"", _pack(self.min_live))
        return n

    def stats(self) -> dict:
        return {"stream_time": self.stream_time, "segments": len(self._segments),
                "segments_dropped": self.segments_dropped, "expired_dropped": self.expired_dropped,
                "min_live_segment": self.min_live}


class MeteredWindowStore(Meter):
    """Typed window store (the WindowStore protocol): serdes, metrics, retention on reads."""

    OPS = ("put", "get", "fetch", "fetch_all", "all", "flush")

    def __init__(self, inner, segmented: SegmentedStore, key_serde: Any = "json",
                 value_serde: Any = "json", window_size_ms: Optional[int] = None) -> None:
        self.name = inner.name
        self.inner = inner
        self.segmented = segmented
        self.window_size_ms = window_size_ms
        self.retention_ms = segmented.retention_ms
        self.key_serde = get_serde(key_serde)
        self.value_serde = get_serde(value_serde)
        self._kb = self.key_serde.to_bytes
        self._kd = self.key_serde.from_bytes
        self._vb = self.value_serde.to_bytes
        self._vd = self.value_serde.from_bytes
        self.expired_puts = 0
        self._init_meter()

    def _expired(self, ws: int) -> bool:
        floor = self.segmented.expiry_floor()
        return floor is not None and ws < floor

    def put(self, key: Any, value: Any, window_start: int) -> None:
        t = _now()
        if window_start < 0:
            raise ValueError(f"window_start must be >= 0 (got {window_start})")
        if self._expired(window_start):
            self.expired_puts += 1
        else:
            self.segmented.observe(window_start)
            self.inner.put(self._kb(key) + _pack(window_start),
                           None if value is None else self._vb(value))
        self._ns_put += _now() - t
        self._n_put += 1

    def delete(self, key: Any, window_start: int) -> None:
        self.put(key, None, window_start)

    def get(self, key: Any, window_start: int) -> Any:
        t = _now()
        v = None
        if not self._expired(window_start):
            v = self.inner.get(self._kb(key) + _pack(window_start))
            if v is not None:
                v = self._vd(v)
        self._ns_get += _now() - t
        self._n_get += 1
        return v

    def fetch(self, key: Any, t_from: int, t_to: int) -> Iterator[tuple]:
        """(window_start, value) for t_from <= window_start <= t_to, in time order."""
        t = _now()
        floor = self.segmented.expiry_floor()
        if floor is not None and t_from < floor:
            t_from = floor
        kb = self._kb(key)
        if t_to < t_from:
            it = iter(())
        else:
            it = self.inner.range(kb + _pack(max(t_from, 0)), kb + _pack(t_to))
        self._ns_fetch += _now() - t
        self._n_fetch += 1
        return self._fetch_decode(it, len(kb) + 8)

    def _fetch_decode(self, it, n: int) -> Iterator[tuple]:
        vd = self._vd
        for k, v in it:
            if len(k) == n:  # keys extending `key` sort in range too: keep exact matches only
                yield _unpack_from(k, n - 8)[0], vd(v)

    def fetch_all(self, t_from: int, t_to: int) -> Iterator[tuple]:
        """(key, window_start, value) with t_from <= window_start <= t_to, in composite-key byte
        order: by key bytes then time, except that a key which is a byte prefix of another
        interleaves with it (as in Kafka Streams)."""
        t = _now()
        floor = self.segmented.expiry_floor()
        if floor is not None and t_from < floor:
            t_from = floor
        it = self.inner.all()
        self._ns_fetch_all += _now() - t
        self._n_fetch_all += 1
        return self._all_decode(it, t_from, t_to)

    def all(self) -> Iterator[tuple]:
        """Every live window: (key, window_start, value)."""
        t = _now()
        floor = self.segmented.expiry_floor()
        it = self.inner.all()
        self._ns_all += _now() - t
        self._n_all += 1
        return self._all_decode(it, -1 if floor is None else floor, None)

    def _all_decode(self, it, t_from: int, t_to: Optional[int]) -> Iterator[tuple]:
        kd = self._kd
        vd = self._vd
        for k, v in it:
            ts = _unpack_from(k, len(k) - 8)[0]
            if ts >= t_from and (t_to is None or ts <= t_to):
                yield kd(k[:-8]), ts, vd(v)

    def approximate_count(self) -> int:
        return self.inner.approximate_count()

    def flush(self) -> None:
        t = _now()
        self.inner.flush()
        self._ns_flush += _now() - t
        self._n_flush += 1

    def close(self) -> None:
        self.inner.close()

    def metrics(self) -> dict:
        out = super().metrics()
        out["window"] = dict(self.segmented.stats(), expired_puts=self.expired_puts)
        return out

    def to_pandas(self, limit: Optional[int] = None):
        import pandas as pd

        rows = []
        for i, row in enumerate(self.all()):
            if limit is not None and i >= limit:
                break
            rows.append(row)
        return pd.DataFrame(rows, columns=["key", "window_start", "value"])

    def __repr__(self) -> str:
        return f"MeteredWindowStore({self.name!r})"
