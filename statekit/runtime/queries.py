"""Interactive queries: route a key to its task with the shuffle's partitioner, read that task's RocksDB
through a secondary (read-only) instance while the query runs.

A key's task is ``partition_for(key_serde.to_bytes(key), partitions)`` — the same murmur2 the engine's
shuffle uses on the same bytes — and the task's active instance comes from the current assignment.
Reads see the task's last commit (RocksDB only ever holds whole commits), like a Kafka Streams query
against a store whose cache has been flushed.
"""
from __future__ import annotations

import struct
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Optional

from statekit.contracts import TaskId, has_state
from statekit.errors import StatekitError
from statekit.partition import partition_for

__all__ = ["KeyOwner", "QueryRouter", "UnknownStore"]

_Q = struct.Struct(">Q")


class UnknownStore(StatekitError):
    pass


@dataclass(frozen=True)
class KeyOwner:
    task: TaskId
    instance: int
    role: str            # "active" | "standby" | "warmup"
    state_dir: str       # the task directory on that instance

    def __iter__(self):  # unpacks as (task, instance, role)
        return iter((self.task, self.instance, self.role))


# query_all's columns per store kind (statekit.stores.inspect.frame decodes them)
STORE_COLUMNS = {"window": ["key", "window_start", "value"],
                 "session": ["key", "start", "end", "value"],
                 "buffer": ["time", "key", "value", "old", "prior", "timestamp"]}


class QueryRouter:
    """Routes and reads; one secondary RocksDB handle per task directory, refreshed on each read."""

    def __init__(self, app):
        self.app = app
        self._handles: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._closed = False

    # -- routing
    def _spec(self, store: str):
        return self.app.store_spec(store)

    @staticmethod
    def _serde(spec, which: str):
        from statekit.stores.serdes import get_serde

        return get_serde(getattr(spec, which, "json"))

    def key_bytes(self, store: str, key) -> bytes:
        spec = self._spec(store)
        return self._serde(spec, "key_serde").to_bytes(key)

    def task_for(self, store: str, key) -> TaskId:
        return self._task(store, partition_for(self.key_bytes(store, key), self.app.partitions))

    def _task(self, store: str, partition: int) -> TaskId:
        return TaskId(self.app.store_subtopology(store), partition)

    def _assignment(self):
        a = self.app.assignment
        if a is None:
            raise StatekitError(f"app '{self.app.name}' has no assignment yet: start() it first")
        return a

    def key_owner(self, store: str, key) -> KeyOwner:
        t = self.task_for(store, key)
        inst = self._assignment().active[t]
        return KeyOwner(t, inst, "active", self.app.layout.task_dir(inst, t))

    def key_owners(self, store: str, key) -> list:
        t = self.task_for(store, key)
        a = self._assignment()
        return [KeyOwner(t, i, role, self.app.layout.task_dir(i, t)) for i, role in a.roles(t)]

    # -- handles
    def _open(self, task_dir: str):
        from statekit.stores import open_readonly

        with self._lock:
            if self._closed:
                raise StatekitError(f"app '{self.app.name}' is changing its assignment (crash or "
                                    f"restart); query again")
            h = self._handles.get(task_dir)
            if h is not None:
                try:
                    h.refresh()
                    if not self._behind(h, task_dir):
                        return h
                except Exception:
                    pass
                # the writer reopened the DB since (a new MANIFEST the secondary does not follow
                # every time): open a fresh secondary instance
                self._drop(task_dir)
            if not has_state(task_dir):
                return None
            try:
                h = open_readonly(task_dir)
            except StatekitError:
                return None  # no commit yet
            self._handles[task_dir] = h
            return h

    @staticmethod
    def _behind(h, task_dir: str) -> bool:
        """True when the task's checkpoint file names a later commit than the secondary sees."""
        from statekit.state import checkpoint as ckpt

        cp = ckpt.read(task_dir, warn=lambda m: None)
        if not cp:
            return False
        want = max(c.batch for c in cp.values())
        try:
            have = int(h.read_meta().get("batch", -1))
        except Exception:
            return True
        return have < want

    def _drop(self, task_dir: str) -> None:
        h = self._handles.pop(task_dir, None)
        if h is not None:
            try:
                h.close()
            except Exception:
                pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for d in list(self._handles):
                self._drop(d)

    def _copies(self, task: TaskId, stale: bool) -> list:
        a = self._assignment()
        roles = a.roles(task)
        return roles if stale else roles[:1]

    def _handle_for(self, task: TaskId, store: str, stale: bool):
        """The first readable copy of the task that has the store: the active, then (stale) standbys."""
        for inst, _role in self._copies(task, stale):
            d = self.app.layout.task_dir(inst, task)
            h = self._open(d)
            if h is not None and store not in h.store_names:
                # opened while the writer was still creating its column families: open again
                self._drop(d)
                h = self._open(d)
            if h is not None and store in h.store_names:
                return h
        return None

    # -- reads
    def get(self, store: str, key, stale: bool = False):
        spec = self._spec(store)
        if getattr(spec, "kind", "kv") == "window":
            raise StatekitError(f"store '{store}' is a window store: use query_window(store, key, "
                                f"t_from, t_to)")
        kb = self._serde(spec, "key_serde").to_bytes(key)
        t = self._task(store, partition_for(kb, self.app.partitions))
        with self._lock:
            h = self._handle_for(t, store, stale)
            if h is None:
                return None
            raw = h.get(store, kb)
        return None if raw is None else self._serde(spec, "value_serde").from_bytes(raw)

    def range(self, store: str, lo, hi, stale: bool = False) -> list:
        spec = self._spec(store)
        if getattr(spec, "kind", "kv") == "window":
            raise StatekitError(f"store '{store}' is a window store: use query_window")
        ks, vs = self._serde(spec, "key_serde"), self._serde(spec, "value_serde")
        lo_b = None if lo is None else ks.to_bytes(lo)
        hi_b = None if hi is None else ks.to_bytes(hi) + b"\x00"  # inclusive
        rows = []
        with self._lock:
            for p in range(self.app.partitions):
                h = self._handle_for(self._task(store, p), store, stale)
                if h is None:
                    continue
                for k, v in h.items(store, lo_b, hi_b):
                    rows.append((bytes(k), v))
        rows.sort(key=lambda kv: kv[0])
        return [(ks.from_bytes(k), vs.from_bytes(v)) for k, v in rows]

    def all(self, store: str, stale: bool = False, limit_per_task: Optional[int] = None):
        import pandas as pd

        spec = self._spec(store)
        frames = []
        a = self._assignment()
        with self._lock:
            for p in range(self.app.partitions):
                t = self._task(store, p)
                h = self._handle_for(t, store, stale)
                if h is None:
                    continue
                df = h.to_pandas(store, getattr(spec, "key_serde", None), getattr(spec, "value_serde", None),
                                 limit=limit_per_task)
                df["task"] = str(t)
                df["instance"] = a.active[t]
                frames.append(df)
        cols = STORE_COLUMNS.get(getattr(spec, "kind", "kv"), ["key", "value"]) + ["task", "instance"]
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame(columns=cols)
        with warnings.catch_warnings():
            # a task whose column is all None (a buffer's old values) may pick the column's dtype
            # in a future pandas: the values stay the same
            warnings.filterwarnings("ignore", "The behavior of DataFrame concatenation", FutureWarning)
            out = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        return out[cols]

    def window(self, store: str, key, t_from: int, t_to: int, stale: bool = False) -> list:
        spec = self._spec(store)
        if getattr(spec, "kind", "kv") != "window":
            raise StatekitError(f"store '{store}' is not a window store: use query(store, key)")
        from statekit.stores.window import default_segment_ms

        kb = self._serde(spec, "key_serde").to_bytes(key)
        vs = self._serde(spec, "value_serde")
        t = self._task(store, partition_for(kb, self.app.partitions))
        seg_ms = getattr(spec, "segment_ms", None) or default_segment_ms(getattr(spec, "retention_ms", None))
        t_from, t_to = max(0, int(t_from)), int(t_to)
        out = []
        with self._lock:
            h = self._handle_for(t, store, stale)
            if h is None:
                return []
            want_len = 16 + len(kb)
            seg = t_from // seg_ms
            last = t_to // seg_ms
            while seg <= last:
                # skip-scan: jump to the next segment that exists
                first = next(iter(h.items(store, _Q.pack(seg), None)), None)
                if first is None:
                    break
                seg = _Q.unpack_from(bytes(first[0]), 0)[0]
                if seg > last:
                    break
                prefix = _Q.pack(seg) + kb
                lo = prefix + _Q.pack(t_from)
                hi = prefix + _Q.pack(t_to) + b"\x00"
                for k, v in h.items(store, lo, hi):
                    k = bytes(k)
                    if len(k) != want_len or k[8:-8] != kb:
                        continue
                    ws = _Q.unpack_from(k, len(k) - 8)[0]
                    if t_from <= ws <= t_to:
                        out.append((ws, vs.from_bytes(v)))
                seg += 1
        out.sort(key=lambda x: x[0])
        return out
