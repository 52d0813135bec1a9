"""Interactive queries: route a key to its task with the shuffle's partitioner, pick a copy of that
task's store that is fresh enough, read it through a secondary (read-only) RocksDB instance while
its owner keeps writing.

A key's task is ``partition_for(key_serde.to_bytes(key), partitions)`` — the same murmur2 the
engine's shuffle uses on the same bytes. The task's copies are the ones the assignment names (the
active, its standbys and warmups: ``runtime.copies.instance_places``); each read measures the copy
it reads against the store's changelog end at the call (``runtime.copies``: the offset is in the
snapshot read).

* ``stale=False`` (the default) answers only from a copy that holds every commit made before the
  call — the active when it is current, else any current copy — and otherwise waits up to ``wait``
  seconds (default ``DEFAULT_WAIT_S``) for one, re-checking, then raises one ``StaleRead`` line
  naming the task, its state (restoring, moving, owner dead, ...) and its lag. Nothing missing or
  older is ever returned as if current: a store restoring from scratch is refused, not read.
* A running copy behind its changelog is one whose commit is landing (the changelog's transaction
  committed, RocksDB a few milliseconds later): every query gives it up to ``COMMIT_GRACE_S``.
* ``stale=True`` answers at once from the freshest copy there is (a current one, else the one
  with the highest offset: a standby, a warmup, the restoring store), and says which with
  ``with_lag=True`` (an ``Answer``: the value and the copies read, with their role, state and lag)
  and in ``query_all``'s ``role``/``state``/``lag``/``lag_s`` columns. With no copy at all to read
  (a lost disk, no other copy) it waits up to ``wait`` seconds (default none) for one to appear,
  then raises ``StaleRead`` too: an empty answer would say the keys do not exist.

RocksDB only ever holds whole commits, so a current copy reads like a Kafka Streams query against a
store whose cache has been flushed.
"""
from __future__ import annotations

import struct
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from statekit.contracts import TaskId, has_state
from statekit.errors import StatekitError
from statekit.partition import partition_for
from statekit.runtime.copies import (
    ROLE_ORDER, Answer, Copy, Place, TimeLag, instance_places, refusal, with_time_lag,
)

__all__ = ["Answer", "Copy", "DEFAULT_WAIT_S", "KeyOwner", "QueryRouter", "UnknownStore"]

_Q = struct.Struct(">Q")

# how long a stale=False query waits for a current copy by default (a restore, a move)
DEFAULT_WAIT_S = 5.0
# how long any query gives a running copy whose commit is landing (its changelog is a few records
# ahead of its RocksDB for the milliseconds between the two steps of a commit)
COMMIT_GRACE_S = 0.5


class UnknownStore(StatekitError):
    pass


@dataclass(frozen=True)
class KeyOwner:
    """One copy of a key's task (Kafka Streams' ``KeyQueryMetadata`` host + its ``LagInfo``):
    ``state`` as in ``runtime.copies.Place``; ``lag`` the changelog records it has not applied
    (``lag_s`` in seconds of commits, where known) against the changelog end when asked;
    ``offset``/``end`` those two offsets."""

    task: TaskId
    instance: Optional[int]
    role: str            # "active" | "standby" | "warmup" | "query-replica"
    state_dir: str       # the task directory of that copy
    state: Optional[str] = None
    lag: Optional[int] = None
    lag_s: Optional[float] = None
    offset: Optional[int] = None
    end: Optional[int] = None
    source: Optional[str] = None

    def __iter__(self):  # unpacks as (task, instance, role)
        return iter((self.task, self.instance, self.role))


# query_all's columns per store kind (statekit.stores.inspect.frame decodes them)
STORE_COLUMNS = {"window": ["key", "window_start", "value"],
                 "session": ["key", "start", "end", "value"],
                 "buffer": ["time", "key", "value", "old", "prior", "timestamp"]}
# and what says where each row came from (stale=True or with_lag=True)
COPY_COLUMNS = ["role", "state", "lag", "lag_s"]


class QueryRouter:
    """Routes, picks a copy, reads; one secondary RocksDB handle per task directory, refreshed on
    each read. Thread-safe: reads of several threads are serialised, waits are not."""

    default_wait = DEFAULT_WAIT_S

    def __init__(self, app):
        self.app = app
        self._handles: dict[str, Any] = {}
        self._ids: dict[str, Optional[str]] = {}   # task dir -> its database's IDENTITY
        self._lock = threading.RLock()
        self._closed = False
        self._klock = threading.Lock()
        self._k = None
        self._timelag: Optional[TimeLag] = None
        self._seen: dict[str, tuple] = {}   # task dir -> (monotonic, offset, records/s)

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

    # -- where the copies are (the executors placement's router has its own)
    def _places(self, task: TaskId) -> list:
        self._assignment()
        return instance_places(self.app._coordinator, self.app.layout, task)

    def _no_live(self) -> bool:
        co = self.app._coordinator
        return co is not None and not any(m.live for m in co.members.values())

    def _hopeless(self, copies: list) -> bool:
        """Waiting cannot help: the task failed, the app stopped, or no instance is alive."""
        a = copies[0] if copies else None
        return a is None or a.state in ("failed", "stopped") or \
            (a.state == "dead" and self._no_live())

    # -- how fresh
    def _kafka(self):
        if self._k is None:
            from statekit.kafka import Kafka

            self._k = Kafka(self.app.bootstrap)
        return self._k

    def _topic(self, store: str) -> str:
        return self.app.changelog_topic(store)

    def _ends(self, store: str) -> Optional[dict]:
        """``{partition: end}`` of the store's changelog now (committed records: its last stable
        offset); None for a store without a changelog."""
        from statekit.errors import UnknownTopic
        from statekit.state.restore import COMMITTED

        if not getattr(self._spec(store), "logging", True):
            return None
        with self._klock:
            try:
                return dict(self._kafka().end_offsets(self._topic(store), None, COMMITTED))
            except UnknownTopic:
                return {}   # not created yet: nothing committed

    @staticmethod
    def _end(ends: Optional[dict], task: TaskId) -> Optional[int]:
        return None if ends is None else int(ends.get(task.partition, 0))

    def _time_lag(self) -> TimeLag:
        if self._timelag is None:
            self._timelag = TimeLag(self.app.bootstrap)
        return self._timelag

    def _eta(self, d: str, off: Optional[int], lag: Optional[int], state: str) -> Optional[float]:
        """Seconds to go for a copy that is restoring, at the rate earlier reads saw it move."""
        now = time.monotonic()
        prev = self._seen.get(d)
        if prev is None or off is None or off < prev[1]:
            self._seen[d] = (now, off or 0, None)
            return None
        rate = prev[2]
        if off > prev[1] and now - prev[0] >= 0.2:
            rate = (off - prev[1]) / (now - prev[0])
            self._seen[d] = (now, off, rate)
        if state != "restoring" or not rate or not lag:
            return None
        return lag / rate

    def _measure(self, task: TaskId, store: str, p: Place, h, end: Optional[int]) -> Copy:
        from statekit.state.restore import meta_key

        off = None
        if h is not None:
            try:
                m = h.read_meta().get(meta_key(store))
                off = 0 if m is None else int(m["offset"])
            except Exception:  # noqa: BLE001 - a meta written later: nothing applied yet
                off = 0
        lag = None if end is None else max(0, end - (off or 0))
        return Copy(task, store, p.instance, p.role, p.state, off, end, lag, None,
                    self._eta(p.task_dir, off, lag, p.state), p.source, p.task_dir, p.error)

    # -- handles
    def _open(self, task_dir: str):
        from statekit.stores import open_readonly

        with self._lock:
            if self._closed:
                raise StatekitError(f"app '{self.app.name}' is changing its assignment (crash or "
                                    f"restart); query again")
            h = self._handles.get(task_dir)
            if h is not None and (not has_state(task_dir) or
                                  _identity(h.path) != self._ids.get(task_dir)):
                # a lost disk (the open handle would read a deleted copy), or a new database in
                # the same place since (its files may even have the same names as the old one's)
                self._drop(task_dir)
                h = None
                if not has_state(task_dir):
                    return None
            if h is not None:
                try:
                    h.refresh()   # (reopens itself when the writer did)
                    self._ids[task_dir] = _identity(h.path)
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
            self._ids[task_dir] = _identity(h.path)
            self._handles[task_dir] = h
            return h

    def _handle(self, task_dir: str, store: str):
        """A fresh handle on the copy in ``task_dir`` that has ``store`` (None: none there yet)."""
        h = self._open(task_dir)
        if h is not None and store not in h.store_names:
            # opened while the writer was still creating its column families: open again
            self._drop(task_dir)
            h = self._open(task_dir)
        return h if h is not None and store in h.store_names else None

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
        with self._klock:
            if self._k is not None:
                self._k.close()
                self._k = None
        if self._timelag is not None:
            self._timelag.close()

    # -- picking a copy
    def _deadline(self, wait: Optional[float], stale: bool) -> float:
        # a stale read answers at once unless told to wait for a copy to exist (a lost disk)
        w = (0.0 if stale else self.default_wait) if wait is None else float(wait)
        if w < 0:
            raise StatekitError(f"wait must be >= 0 seconds, got {wait}")
        return time.monotonic() + w

    def _read(self, task: TaskId, store: str, fn: Callable, stale: bool, deadline: float,
              end: Optional[int]) -> tuple:
        """``(fn(handle), Copy)`` from a copy of ``task`` as ``stale`` allows (module docstring);
        ``fn`` gets None for a current task that has committed nothing yet."""
        t0 = time.monotonic()
        while True:
            with self._lock:
                seen = []
                for p in self._places(task):
                    h = self._handle(p.task_dir, store)
                    c = self._measure(task, store, p, h, end)
                    if c.current and (h is not None or not c.end):
                        return fn(h), c
                    seen.append((c, h))
                # a copy that keeps up (a running active, a tailing query replica) is behind only
                # while a commit lands: give it that moment, whatever stale and wait say
                lead = seen[0][0] if seen else None
                landing = lead is not None and lead.state in ("running", "tailing") and \
                    time.monotonic() - t0 < COMMIT_GRACE_S
                if stale and not landing:
                    readable = [(c, h) for c, h in seen if h is not None]
                    if readable:
                        c, h = max(readable, key=lambda ch: (ch[0].offset or 0,
                                                             -ROLE_ORDER.get(ch[0].role, 9)))
                        return fn(h), c
            copies = [c for c, _h in seen]
            now = time.monotonic()
            if not landing and (now >= deadline or self._hopeless(copies)):
                raise self._refuse(store, task, copies, now - t0, deadline - t0, stale)
            time.sleep(0.02 if landing else 0.05)

    def _refuse(self, store: str, task: TaskId, copies: list, waited: float, wait: float,
                stale: bool):
        tl, topic = self._time_lag(), self._topic(store)
        copies = [with_time_lag(c, tl, topic) for c in copies]
        return refusal(store, task, copies, waited=waited, wait=wait, no_live=self._no_live(),
                       stale=stale)

    def _answer(self, value, copies: list, store: str, with_lag: bool):
        if not with_lag:
            return value
        tl, topic = self._time_lag(), self._topic(store)
        return Answer(value, tuple(with_time_lag(c, tl, topic) for c in copies))

    # -- who holds a key
    def _copies_of(self, store: str, key, first_only: bool) -> list:
        t = self.task_for(store, key)
        end = self._end(self._ends(store), t)
        with self._lock:
            places = self._places(t)
            if first_only:
                places = places[:1]
            copies = [self._measure(t, store, p, self._handle(p.task_dir, store), end)
                      for p in places]
        tl, topic = self._time_lag(), self._topic(store)
        return [with_time_lag(c, tl, topic) for c in copies]

    def _owner(self, c: Copy) -> KeyOwner:
        return KeyOwner(c.task, c.instance, c.role, c.state_dir, c.state, c.lag, c.lag_s, c.offset,
                        c.end, c.source)

    def key_owner(self, store: str, key) -> KeyOwner:
        return self._owner(self._copies_of(store, key, True)[0])

    def key_owners(self, store: str, key) -> list:
        return [self._owner(c) for c in self._copies_of(store, key, False)]

    # -- reads
    def get(self, store: str, key, stale: bool = False, wait: Optional[float] = None,
            with_lag: bool = False):
        spec = self._spec(store)
        if getattr(spec, "kind", "kv") == "window":
            raise StatekitError(f"store '{store}' is a window store: use query_window(store, key, "
                                f"t_from, t_to)")
        kb = self._serde(spec, "key_serde").to_bytes(key)
        t = self._task(store, partition_for(kb, self.app.partitions))
        deadline = self._deadline(wait, stale)
        raw, c = self._read(t, store, lambda h: None if h is None else h.get(store, kb), stale,
                            deadline, self._end(self._ends(store), t))
        value = None if raw is None else self._serde(spec, "value_serde").from_bytes(raw)
        return self._answer(value, [c], store, with_lag)

    def range(self, store: str, lo, hi, stale: bool = False, wait: Optional[float] = None,
              with_lag: bool = False):
        spec = self._spec(store)
        if getattr(spec, "kind", "kv") == "window":
            raise StatekitError(f"store '{store}' is a window store: use query_window")
        ks, vs = self._serde(spec, "key_serde"), self._serde(spec, "value_serde")
        lo_b = None if lo is None else ks.to_bytes(lo)
        hi_b = None if hi is None else ks.to_bytes(hi) + b"\x00"  # inclusive
        deadline = self._deadline(wait, stale)
        ends = self._ends(store)
        rows, copies = [], []
        for p in range(self.app.partitions):
            t = self._task(store, p)
            got, c = self._read(t, store, lambda h: [] if h is None else
                                [(bytes(k), v) for k, v in h.items(store, lo_b, hi_b)],
                                stale, deadline, self._end(ends, t))
            rows.extend(got)
            copies.append(c)
        rows.sort(key=lambda kv: kv[0])
        out = [(ks.from_bytes(k), vs.from_bytes(v)) for k, v in rows]
        return self._answer(out, copies, store, with_lag)

    def all(self, store: str, stale: bool = False, limit_per_task: Optional[int] = None,
            wait: Optional[float] = None, with_lag: bool = False):
        """The store as a DataFrame; ``stale`` or ``with_lag`` add the copy columns, and
        ``.attrs["copies"]`` always maps each task to the ``Copy`` its rows came from (a task with
        no rows too)."""
        import pandas as pd

        spec = self._spec(store)
        a = self._assignment()
        deadline = self._deadline(wait, stale)
        ends = self._ends(store)
        kser, vser = getattr(spec, "key_serde", None), getattr(spec, "value_serde", None)
        frames, copies = [], {}
        for p in range(self.app.partitions):
            t = self._task(store, p)
            df, c = self._read(t, store, lambda h: None if h is None else
                               h.to_pandas(store, kser, vser, limit=limit_per_task),
                               stale, deadline, self._end(ends, t))
            copies[t] = c
            if df is not None and len(df):
                df["task"] = str(t)
                df["instance"] = c.instance if c.instance is not None else a.active.get(t)
                frames.append((t, df))
        cols = STORE_COLUMNS.get(getattr(spec, "kind", "kv"), ["key", "value"]) + \
            ["task", "instance"]
        marked = stale or with_lag
        if marked:
            tl, topic = self._time_lag(), self._topic(store)
            copies = {t: with_time_lag(c, tl, topic) for t, c in copies.items()}
            cols = cols + COPY_COLUMNS
            for t, df in frames:
                c = copies[t]
                df["role"], df["state"], df["lag"], df["lag_s"] = c.role, c.state, c.lag, c.lag_s
        frames = [f for _t, f in frames]
        if not frames:
            out = pd.DataFrame(columns=cols)
        else:
            with warnings.catch_warnings():
                # a task whose column is all None (a buffer's old values) may pick the column's
                # dtype in a future pandas: the values stay the same
                warnings.filterwarnings("ignore", "The behavior of DataFrame concatenation",
                                        FutureWarning)
                out = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            out = out[cols]
        out.attrs["copies"] = {str(t): c for t, c in sorted(copies.items())}
        return out

    def window(self, store: str, key, t_from: int, t_to: int, stale: bool = False,
               wait: Optional[float] = None, with_lag: bool = False):
        spec = self._spec(store)
        if getattr(spec, "kind", "kv") != "window":
            raise StatekitError(f"store '{store}' is not a window store: use query(store, key)")
        from statekit.stores.window import default_segment_ms

        kb = self._serde(spec, "key_serde").to_bytes(key)
        vs = self._serde(spec, "value_serde")
        t = self._task(store, partition_for(kb, self.app.partitions))
        seg_ms = getattr(spec, "segment_ms", None) or \
            default_segment_ms(getattr(spec, "retention_ms", None))
        t_from, t_to = max(0, int(t_from)), int(t_to)
        deadline = self._deadline(wait, stale)
        raw, c = self._read(t, store, lambda h: [] if h is None else
                            _window_rows(h, store, kb, t_from, t_to, seg_ms),
                            stale, deadline, self._end(self._ends(store), t))
        out = sorted(((ws, vs.from_bytes(v)) for ws, v in raw), key=lambda x: x[0])
        return self._answer(out, [c], store, with_lag)


def _identity(db_dir: str) -> Optional[str]:
    """The unique id RocksDB wrote when it created the database in ``db_dir``."""
    import os

    try:
        with open(os.path.join(db_dir, "IDENTITY")) as f:
            return f.read().strip()
    except OSError:
        return None


def _window_rows(h, store: str, kb: bytes, t_from: int, t_to: int, seg_ms: int) -> list:
    """``[(window_start, raw value)]`` of one key in a window store's segments."""
    out = []
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
                out.append((ws, v))
        seg += 1
    return out
