"""Committed store contents as pandas DataFrames (for the notebook and for debugging).

Raw RocksDB bytes are decoded with the serdes recorded in the task's meta at commit (or given);
bytes that do not decode are shown as they are rather than failing the whole table.
"""
from __future__ import annotations

from itertools import islice
from typing import Any, Iterable, Optional

from statekit.stores.serdes import decode_column, get_serde


def _serde(spec):
    """A serde by name or object; an unknown name (a custom serde this process has not
    registered) shows raw bytes."""
    try:
        return get_serde(spec)
    except (TypeError, ValueError):
        return get_serde("bytes")


def _decoder(serde):
    def dec(b: bytes):
        try:
            return serde.from_bytes(b)
        except Exception:
            return b
    dec.serde = serde
    return dec


def _column(blobs: list, dec) -> list:
    """Decode a column of a store's bytes at once where the serde allows (a million-key store is
    read in a notebook cell); else, or when one item does not decode so, one item at a time."""
    out = decode_column(dec.serde, blobs)
    return out if out is not None else [dec(b) for b in blobs]


def frame(items: Iterable[tuple], spec: dict, key_serde: Any = None, value_serde: Any = None,
          limit: Optional[int] = None):
    """DataFrame of (key, value) — (key, window_start, value) for window stores, whose raw keys are
    segment(8) + key + window_start(8); (key, start, end, value) for session stores (raw key
    segment(8) + key + end(8), value start(8) + value); (time, key, value, old, prior, timestamp)
    for suppression buffers."""
    import pandas as pd

    kd = _decoder(_serde(key_serde if key_serde is not None else spec.get("key_serde", "json")))
    vd = _decoder(_serde(value_serde if value_serde is not None
                         else spec.get("value_serde", "json")))
    kind = spec.get("kind", "kv")
    if kind == "buffer":
        return _buffer_frame(items, kd, vd, limit)
    if kind == "kv":
        ks, vs = [], []
        addk, addv = ks.append, vs.append
        for k, v in (items if limit is None else islice(items, limit)):
            addk(k)
            addv(v)
        return pd.DataFrame({"key": _column(ks, kd), "value": _column(vs, vd)})
    rows = []
    for i, (k, v) in enumerate(items):
        if limit is not None and i >= limit:
            break
        if kind == "window":
            rows.append((kd(k[8:-8]), int.from_bytes(k[-8:], "big"), vd(v)))
        elif kind == "session":
            rows.append((kd(k[8:-8]), int.from_bytes(v[:8], "big", signed=True),
                         int.from_bytes(k[-8:], "big"), vd(v[8:])))
        else:
            rows.append((kd(k), vd(v)))
    cols = {"window": ["key", "window_start", "value"],
            "session": ["key", "start", "end", "value"]}.get(kind, ["key", "value"])
    return pd.DataFrame(rows, columns=cols)


def _buffer_frame(items, kd, vd, limit):
    import pandas as pd

    from statekit.stores.buffer import ENTRY, MeteredBufferStore

    store = MeteredBufferStore.__new__(MeteredBufferStore)   # only its decoder, with ours
    store._kd, store._vd = kd, vd
    rows = []
    for k, v in items:
        if k[:1] != ENTRY:
            continue
        if limit is not None and len(rows) >= limit:
            break
        r = store._decode(int.from_bytes(k[1:9], "big") - (1 << 63), k[9:], v)
        rows.append((r.time, r.key, r.value, r.old, r.prior, r.timestamp))
    return pd.DataFrame(rows, columns=["time", "key", "value", "old", "prior", "timestamp"])
