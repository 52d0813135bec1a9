"""Committed store contents as pandas DataFrames (for the notebook and for debugging).

Raw RocksDB bytes are decoded with the serdes recorded in the task's meta at commit (or given);
bytes that do not decode are shown as they are rather than failing the whole table.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from statekit.stores.serdes import get_serde


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
    return dec


def frame(items: Iterable[tuple], spec: dict, key_serde: Any = None, value_serde: Any = None,
          limit: Optional[int] = None):
    """DataFrame of (key, value) — or (key, window_start, value) for window stores, whose raw keys
    are segment(8) + key + window_start(8)."""
    import pandas as pd

    kd = _decoder(_serde(key_serde if key_serde is not None else spec.get("key_serde", "json")))
    vd = _decoder(_serde(value_serde if value_serde is not None
                         else spec.get("value_serde", "json")))
    window = spec.get("kind") == "window"
    rows = []
    for i, (k, v) in enumerate(items):
        if limit is not None and i >= limit:
            break
        if window:
            rows.append((kd(k[8:-8]), int.from_bytes(k[-8:], "big"), vd(v)))
        else:
            rows.append((kd(k), vd(v)))
    cols = ["key", "window_start", "value"] if window else ["key", "value"]
    return pd.DataFrame(rows, columns=cols)
