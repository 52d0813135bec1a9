"""The outermost layer: typed keys and values in, serdes applied, every operation counted and timed.

Counting is two integer additions per operation (a perf_counter_ns delta and a count); no objects
are made for it, so the numbers cost little enough to be always on, as Kafka Streams' metered stores.
Range operations are counted when the iterator is created (their time is the seek, not the walk).
"""
from __future__ import annotations

from time import perf_counter_ns as _now
from typing import Any, Iterator, Optional

from statekit.stores.serdes import get_serde

OPS = ("get", "put", "put_if_absent", "delete", "range", "prefix_scan", "all", "flush")


class Meter:
    """Counts and nanoseconds per operation, as plain attributes (cheapest to bump)."""

    OPS = OPS

    def _init_meter(self) -> None:
        for op in self.OPS:
            setattr(self, f"_n_{op}", 0)
            setattr(self, f"_ns_{op}", 0)

    def metrics(self) -> dict:
        """{op: {"count", "total_ms", "avg_us"}} plus the cache's stats when there is one."""
        out: dict = {"store": self.name}
        for op in self.OPS:
            n = getattr(self, f"_n_{op}")
            ns = getattr(self, f"_ns_{op}")
            out[op] = {"count": n, "total_ms": ns / 1e6, "avg_us": (ns / n / 1e3) if n else 0.0}
        layer = getattr(self, "inner", None)
        while layer is not None:
            if hasattr(layer, "hits") and hasattr(layer, "stats"):
                out["cache"] = layer.stats()
                break
            layer = getattr(layer, "inner", None)
        return out


class MeteredStore(Meter):
    """Typed view of a bytes KeyValueStore stack (same method names, objects instead of bytes)."""

    def __init__(self, inner, key_serde: Any = "json", value_serde: Any = "json") -> None:
        self.name = inner.name
        self.inner = inner
        self.key_serde = get_serde(key_serde)
        self.value_serde = get_serde(value_serde)
        self._kb = self.key_serde.to_bytes
        self._kd = self.key_serde.from_bytes
        self._vb = self.value_serde.to_bytes
        self._vd = self.value_serde.from_bytes
        self._get = inner.get
        self._put = inner.put
        self._init_meter()

    def get(self, key: Any) -> Any:
        t = _now()
        v = self._get(self._kb(key))
        if v is not None:
            v = self._vd(v)
        self._ns_get += _now() - t
        self._n_get += 1
        return v

    def put(self, key: Any, value: Any) -> None:
        t = _now()
        self._put(self._kb(key), None if value is None else self._vb(value))
        self._ns_put += _now() - t
        self._n_put += 1

    def put_if_absent(self, key: Any, value: Any) -> Any:
        t = _now()
        old = self.inner.put_if_absent(self._kb(key), self._vb(value))
        self._ns_put_if_absent += _now() - t
        self._n_put_if_absent += 1
        return None if old is None else self._vd(old)

    def delete(self, key: Any) -> Any:
        t = _now()
        old = self.inner.delete(self._kb(key))
        self._ns_delete += _now() - t
        self._n_delete += 1
        return None if old is None else self._vd(old)

    def _decode(self, it) -> Iterator[tuple]:
        kd = self._kd
        vd = self._vd
        for k, v in it:
            yield kd(k), vd(v)

    def range(self, lo: Any, hi: Any) -> Iterator[tuple]:
        """Inclusive at both ends, in key *byte* order (use int64/str serdes for ordered ranges)."""
        t = _now()
        it = self.inner.range(None if lo is None else self._kb(lo), None if hi is None else self._kb(hi))
        self._ns_range += _now() - t
        self._n_range += 1
        return self._decode(it)

    def scan(self, lo: Any = None, hi: Any = None) -> Iterator[tuple]:
        """Half-open [lo, hi) in key byte order (counted as a range)."""
        t = _now()
        it = self.inner.scan(None if lo is None else self._kb(lo), None if hi is None else self._kb(hi))
        self._ns_range += _now() - t
        self._n_range += 1
        return self._decode(it)

    def prefix_scan(self, prefix: Any, raw: bool = False) -> Iterator[tuple]:
        """Keys whose bytes start with the prefix's bytes (`raw=True`: prefix is given as bytes;
        note a JSON-encoded string prefix ends with a quote, so raw prefixes are usually meant)."""
        t = _now()
        p = prefix if raw else self._kb(prefix)
        it = self.inner.prefix_scan(p)
        self._ns_prefix_scan += _now() - t
        self._n_prefix_scan += 1
        return self._decode(it)

    def all(self) -> Iterator[tuple]:
        t = _now()
        it = self.inner.all()
        self._ns_all += _now() - t
        self._n_all += 1
        return self._decode(it)

    def approximate_count(self) -> int:
        return self.inner.approximate_count()

    def flush(self) -> None:
        t = _now()
        self.inner.flush()
        self._ns_flush += _now() - t
        self._n_flush += 1

    def close(self) -> None:
        self.inner.close()

    def to_pandas(self, limit: Optional[int] = None):
        """Everything the store holds now (cache and uncommitted writes included) as a DataFrame."""
        import pandas as pd

        rows = []
        for i, (k, v) in enumerate(self.all()):
            if limit is not None and i >= limit:
                break
            rows.append((k, v))
        return pd.DataFrame(rows, columns=["key", "value"])

    def __repr__(self) -> str:
        return f"MeteredStore({self.name!r})"
