"""Session stores: one aggregate per session (key, start, end), on the window-store layout.

Sessions of one key never overlap (a record that bridges two sessions merges them), so a session is
identified by its key and its *end*: the composite key above the segmented layer is
`key_bytes + 8-byte big-endian end` and the value is `8-byte start + value bytes`. Everything the
window store does comes for free: segments by end time, retention by end time, the changelog
(`key + end` -> `start + value`, `compact,delete`), restoration and the seal after a crash. A session
is expired when `end <= stream_time - retention_ms` (stream time being the largest end written):
Kafka Streams' session store rule, one millisecond stricter than the window stores'; its segment
is dropped by the window rule, later.

`find_sessions(key, earliest_end, latest_start)` is Kafka Streams' `findSessions`: every session of
the key with `end >= earliest_end` and `start <= latest_start`, in end order (one seek).
"""
from __future__ import annotations

import struct
from time import perf_counter_ns as _now
from typing import Any, Iterator, Optional

from statekit.stores.metered import Meter
from statekit.stores.serdes import get_serde

_Q = struct.Struct(">Q")
_q = struct.Struct(">q")
_pack = _Q.pack
_unpack_from = _Q.unpack_from
_END_MAX = (1 << 63) - 1


class MeteredSessionStore(Meter):
    """Typed session store (see the module docstring)."""

    OPS = ("put", "fetch_session", "find_sessions", "fetch", "all", "flush")

    def __init__(self, inner, segmented, key_serde: Any = "json", value_serde: Any = "json") -> None:
        self.name = inner.name
        self.inner = inner
        self.segmented = segmented
        self.retention_ms = segmented.retention_ms
        self.key_serde = get_serde(key_serde)
        self.value_serde = get_serde(value_serde)
        self._kb = self.key_serde.to_bytes
        self._kd = self.key_serde.from_bytes
        self._vb = self.value_serde.to_bytes
        self._vd = self.value_serde.from_bytes
        self.expired_puts = 0
        self._init_meter()

    def _floor(self) -> Optional[int]:
        """Sessions ending before this are expired (None: no retention)."""
        f = self.segmented.expiry_floor()
        return None if f is None else f + 1

    def _expired(self, end: int) -> bool:
        floor = self._floor()
        return floor is not None and end < floor

    def put(self, key: Any, start: int, end: int, value: Any) -> None:
        """Write the session [start, end] of `key` (value None removes it)."""
        t = _now()
        if not 0 <= start <= end:
            raise ValueError(f"a session needs 0 <= start <= end (got start={start} end={end})")
        if self._expired(end):
            self.expired_puts += 1
        else:
            self.segmented.observe(end)
            self.inner.put(self._kb(key) + _pack(end),
                           None if value is None else _q.pack(start) + self._vb(value))
        self._ns_put += _now() - t
        self._n_put += 1

    def remove(self, key: Any, start: int, end: int) -> None:
        self.put(key, start, end, None)

    def fetch_session(self, key: Any, start: int, end: int) -> Any:
        """The aggregate of exactly the session [start, end] of `key`, or None."""
        t = _now()
        out = None
        if not self._expired(end):
            raw = self.inner.get(self._kb(key) + _pack(end))
            if raw is not None and _q.unpack_from(raw, 0)[0] == start:
                out = self._vd(raw[8:])
        self._ns_fetch_session += _now() - t
        self._n_fetch_session += 1
        return out

    def find_sessions(self, key: Any, earliest_end: int, latest_start: int) -> list:
        """[(start, end, value)] of `key` with end >= earliest_end and start <= latest_start, in end
        order (live sessions only)."""
        t = _now()
        floor = self._floor()
        lo = max(earliest_end, 0 if floor is None else floor, 0)
        kb = self._kb(key)
        n = len(kb) + 8
        out = []
        vd = self._vd
        for k, v in self.inner.range(kb + _pack(lo), kb + _pack(_END_MAX)):
            if len(k) != n:   # a longer key that starts with these bytes
                continue
            start = _q.unpack_from(v, 0)[0]
            if start <= latest_start:
                out.append((start, _unpack_from(k, n - 8)[0], vd(v[8:])))
        self._ns_find_sessions += _now() - t
        self._n_find_sessions += 1
        return out

    def fetch(self, key: Any) -> list:
        """Every live session of `key`: [(start, end, value)] in end order."""
        t = _now()
        out = self.find_sessions(key, 0, _END_MAX)
        self._ns_fetch += _now() - t
        self._n_fetch += 1
        return out

    def all(self) -> Iterator[tuple]:
        """Every live session: (key, start, end, value), in composite-key byte order."""
        t = _now()
        floor = self._floor()
        it = self.inner.all()
        self._ns_all += _now() - t
        self._n_all += 1
        return self._all_decode(it, -1 if floor is None else floor)

    def _all_decode(self, it, floor: int) -> Iterator[tuple]:
        kd, vd = self._kd, self._vd
        for k, v in it:
            end = _unpack_from(k, len(k) - 8)[0]
            if end >= floor:
                yield kd(k[:-8]), _q.unpack_from(v, 0)[0], end, vd(v[8:])

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
        return pd.DataFrame(rows, columns=["key", "start", "end", "value"])

    def __repr__(self) -> str:
        return f"MeteredSessionStore({self.name!r})"
