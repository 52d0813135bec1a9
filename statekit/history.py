"""A key's history, rebuilt from its changelog partition: the value as of every changelog offset.

The changelog is the store's journal: every flushed write of a key is a record (header
``statekit.batch``), each commit closes with a marker (``__statekit.commit__``). Reading one
partition with ``statekit.kafka.Kafka.read`` and keeping the records of one key gives the key's
versions; a version is *committed* when a commit marker follows it in the log (records after the
last marker belong to an attempt that crashed before committing; a restore drops them).
Compaction removes superseded versions: what survives is exactly what a restore would replay.

    from statekit.history import key_history
    for p in key_history(app, "counts", "kafka"):
        print(p.offset, p.value, p.batch, p.committed)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from statekit.errors import StatekitError
from statekit.state.restore import BATCH_HEADER, MARKER_HEADER, MARKER_KEY

__all__ = ["HistoryPoint", "read_key_history", "key_history", "value_as_of"]


@dataclass(frozen=True)
class HistoryPoint:
    offset: int
    value: Any  # decoded value; None = deleted (tombstone)
    batch: Optional[int]  # the input batch that wrote it (header statekit.batch)
    committed: bool  # a commit marker follows it in the log
    timestamp: int  # the changelog record's timestamp (ms)


def _header(headers, name: str) -> Optional[bytes]:
    for k, v in headers or ():
        if k == name:
            return v
    return None


def read_key_history(kafka, topic: str, partition: int, key_bytes: bytes,
                     decode=None, start: Optional[int] = None, end: Optional[int] = None) -> list[HistoryPoint]:
    """The versions of ``key_bytes`` in ``topic[partition]`` between ``start`` (default: the log
    start) and ``end`` (default: the end offset now), oldest first. ``decode(bytes) -> value``."""
    found: list[tuple[int, Optional[bytes], Optional[int], int]] = []
    last_marker = -1
    for chunk in kafka.read(topic, partition, start, end):
        for off, ts, key, value, headers in chunk.records:
            if key == MARKER_KEY and _header(headers, MARKER_HEADER) is not None:
                last_marker = off
                continue
            if key == key_bytes:
                b = _header(headers, BATCH_HEADER)
                try:
                    batch = int(b) if b is not None else None
                except ValueError:
                    batch = None
                found.append((off, value, batch, ts))
    out = []
    for off, value, batch, ts in found:
        v = None if value is None else (decode(value) if decode else value)
        out.append(HistoryPoint(off, v, batch, off < last_marker, ts))
    return out


def value_as_of(points: list[HistoryPoint], offset: int, committed_only: bool = True):
    """The key's value as of changelog ``offset``: the latest (committed) version at or before it;
    None when it had no value then."""
    best = None
    for p in points:
        if p.offset > offset:
            break
        if committed_only and not p.committed:
            continue
        best = p
    return None if best is None else best.value


def _store_spec(app, store: str):
    plan = getattr(app, "plan", None)
    if plan is None:
        try:
            app.describe()  # compiles the plan
        except Exception:
            pass
        plan = getattr(app, "plan", None) or app._compile()
    for s in getattr(plan, "stores", ()) or ():
        if s.name == store:
            return s
    names = ", ".join(s.name for s in getattr(plan, "stores", ()) or ()) or "none"
    raise StatekitError(f"app {app.name!r} has no store {store!r} (stores: {names})")


def key_history(app, store: str, key, *, kafka=None) -> list[HistoryPoint]:
    """The versions of ``key`` in ``store`` of a ``statekit.App``, read from the changelog
    partition of the task that owns the key."""
    from statekit.partition import partition_for
    from statekit.stores import get_serde

    spec = _store_spec(app, store)
    if getattr(spec, "kind", "kv") != "kv":
        raise StatekitError(f"store {store!r} is a {spec.kind} store; key history reads key-value stores")
    if not getattr(spec, "logging", True):
        raise StatekitError(f"store {store!r} has no changelog (logging is off)")
    kser, vser = get_serde(spec.key_serde), get_serde(spec.value_serde)
    try:
        kb = kser.to_bytes(key)
    except Exception as err:
        raise StatekitError(f"key {key!r} does not fit the key serde of {store!r}: {err}") from None
    partition = partition_for(kb, app.partitions)
    own = kafka is None
    k = kafka
    if own:
        from statekit.kafka import Kafka

        k = Kafka(app.bootstrap)
    try:
        return read_key_history(k, app.changelog_topic(store), partition, kb, vser.from_bytes)
    finally:
        if own:
            k.close()
