"""The copies of a task's store an interactive query may read, and how far behind each one is.

A task's store lives in several places at once: the active task's RocksDB (running, or restoring
after a move or a disk loss), its standby and warmup replicas, and on the ``executors`` placement
the driver's query replica. Every copy records the changelog offset it has applied in the same
RocksDB WriteBatch as the data (meta ``changelog.<store>``: committed groups only), so how far
behind a copy is, is exact, and read from the very snapshot a query reads:

* ``lag`` = the changelog's end when the query was called (its last stable offset: committed
  records only) - the copy's offset. ``lag == 0``: the copy holds every commit made before the call.
* ``lag_s`` = the same in seconds of commits: the timestamp of the changelog's last record before
  the end minus that of the last record the copy applied (a copy with nothing: the first record).
* ``eta_s`` = for a copy that is moving (a restore), the time left at the rate the queries saw.

``Copy`` is one copy as a query saw it, ``Answer`` a value with the copies it came from (Kafka
Streams' ``KeyQueryMetadata`` + ``LagInfo``), ``refusal`` the one-line ``StaleRead`` a query raises
when no copy is current in time, ``instance_places`` where the copies of a task are on the
``instances`` placement and what their owners last reported of them.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from statekit.contracts import TaskId
from statekit.errors import StaleRead

__all__ = ["Answer", "Copy", "Place", "TimeLag", "instance_places", "refusal", "stale_note"]

# the order copies are preferred in, among equally fresh ones
ROLE_ORDER = {"active": 0, "standby": 1, "warmup": 2, "query-replica": 3, "checkpoint": 4}
# copy states that still read as current without a changelog to compare with
_SETTLED = ("running", "committed")


@dataclass(frozen=True)
class Place:
    """Where one copy of a task lives and what its owner last reported of it. ``state``: an active
    copy is running, restoring, moving (assigned, its restore not started), failed, dead (its
    instance died) or stopped; a replica is tailing, paused, starting or dead."""

    instance: Optional[int]
    role: str
    state: str
    task_dir: str
    source: Optional[str] = None      # a restoring active: scratch | checkpoint | standby | warmup
    error: Optional[str] = None


@dataclass(frozen=True)
class Copy:
    """One copy of a task's store as a query saw it (see the module docstring for the figures)."""

    task: TaskId
    store: str
    instance: Optional[int]
    role: str                      # active | standby | warmup | query-replica | checkpoint
    state: str                     # see Place
    offset: Optional[int] = None   # changelog offset applied (None: no copy there to read)
    end: Optional[int] = None      # the changelog's end at the call (None: the store has none)
    lag: Optional[int] = None      # changelog records not applied (None: no changelog)
    lag_s: Optional[float] = None  # seconds of commits not applied (None: not known)
    eta_s: Optional[float] = None  # a restoring copy: seconds to go at the rate seen
    source: Optional[str] = None
    state_dir: Optional[str] = None
    error: Optional[str] = None

    @property
    def current(self) -> bool:
        """Holds every commit made before the call."""
        if self.end is None:   # no changelog to compare with: what its running owner has
            return self.state in _SETTLED
        return self.lag == 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["task"] = str(self.task)
        return d

    def where(self) -> str:
        """"the active on instance 1", "the standby on instance 2", "the query replica"."""
        name = {"query-replica": "query replica"}.get(self.role, self.role)
        if self.role == "active" and self.state == "restoring" and not self.current:
            name = "restoring active"
        return f"the {name}" + (f" on instance {self.instance}" if self.instance is not None and
                                self.role != "query-replica" else "")

    def behind(self) -> str:
        """"current" or "412,345 records (3.1 s) behind"."""
        if self.current:
            return "current"
        if self.lag is None:
            return f"{self.state}, lag unknown"
        secs = f" ({_secs(self.lag_s)})" if self.lag_s is not None and self.lag_s >= 0.1 else ""
        return f"{self.lag:,} record{'s' * (self.lag != 1)}{secs} behind"

    def __str__(self) -> str:
        return f"{self.where()}, {self.behind()}"

    def summary(self) -> str:
        """One phrase for a task's rows read from this copy, e.g. "task 0_1: restoring on
        instance 1, 1,522 records (0.7 s) behind" (what the magic and the dashboard print)."""
        label = _LABELS.get(self.state, self.state)
        if self.role == "query-replica":
            where = f"its query replica is {label}"
        elif self.role == "active":
            where = f"{label} {'to' if self.state == 'moving' else 'on'} instance {self.instance}"
        else:
            where = f"read from its {self.role} on instance {self.instance} ({label})"
        return f"task {self.task}: {where}, {self.behind()}"


_LABELS = {"dead": "owner dead", "tailing": "catching up"}


def stale_note(copies) -> str:
    """"" when every copy is current, else one line naming each task whose copy is not:
    "not current — task 0_1: restoring on instance 1, 1,522 records (0.7 s) behind"."""
    behind = [c for c in copies if not c.current]
    return "" if not behind else "not current — " + "; ".join(c.summary() for c in behind)


@dataclass(frozen=True)
class Answer:
    """A query's value with the copy (one per task read) it came from. Unpacks as
    ``value, copy``; ``lag``/``lag_s`` are the stalest copy's, ``current`` that every copy was."""

    value: Any
    copies: tuple

    @property
    def copy(self) -> Optional[Copy]:
        """The copy read (of several tasks: the one furthest behind)."""
        if not self.copies:
            return None
        return max(self.copies, key=lambda c: (not c.current, c.lag or 0, c.lag_s or 0.0))

    @property
    def current(self) -> bool:
        return all(c.current for c in self.copies)

    @property
    def lag(self) -> Optional[int]:
        lags = [c.lag for c in self.copies if c.lag is not None]
        return max(lags) if lags else None

    @property
    def lag_s(self) -> Optional[float]:
        lags = [c.lag_s for c in self.copies if c.lag_s is not None]
        return max(lags) if lags else None

    @property
    def role(self) -> Optional[str]:
        c = self.copy
        return None if c is None else c.role

    def __iter__(self):
        return iter((self.value, self.copy))

    def __repr__(self) -> str:
        c = self.copy
        return f"Answer({self.value!r}, from {c})" if c is not None else f"Answer({self.value!r})"


def _secs(s: Optional[float]) -> str:
    if s is None:
        return "? s"
    return f"{s:.1f} s" if s < 100 else f"{s:,.0f} s"


# -- where the copies are (instances placement) -------------------------------------------------

_ACTIVE_STATES = {"queued": "moving", "closed": "moving", "restoring": "restoring",
                  "running": "running", "failed": "failed"}


def instance_places(co, layout, task: TaskId) -> list:
    """The copies of ``task`` the current assignment names, active first, each with the state its
    instance last reported. The statuses are the ones the coordinator's loop polled last (at most
    about half a second old), read without its lock: a rebalance holds that lock for as long as the
    instances take to answer, and a query must not wait for it."""
    a = co.assignment
    statuses = dict(getattr(co, "_statuses", None) or {})
    out = []
    for inst, role in a.roles(task):
        m = co.members.get(inst)
        st = statuses.get(inst) or {}
        d = layout.task_dir(inst, task)
        if m is None or not m.live:
            state = "stopped" if m is not None and m.status == "stopped" else "dead"
            out.append(Place(inst, role, state, d))
            continue
        if role == "active":
            row = (st.get("tasks") or {}).get(str(task))
            if row is None:   # assigned a moment ago: its new owner has not reported it yet
                out.append(Place(inst, role, "moving", d))
            else:
                out.append(Place(inst, role, _ACTIVE_STATES.get(row.get("state"), "moving"), d,
                                 source=row.get("source"), error=row.get("error")))
            continue
        row = (st.get("replicas") or {}).get(str(task))
        if row is None:
            out.append(Place(inst, role, "starting", d))
        else:
            state = "paused" if st.get("replicas_paused") else "tailing"
            out.append(Place(inst, role, state, d, error=row.get("error")))
    return out


# -- seconds of commits ----------------------------------------------------------------------

class TimeLag:
    """``lag_s`` from the changelog's record timestamps (each commit's records and marker carry the
    time they were written). Reads a few records before each offset; remembers what it read (the
    record before an offset does not change)."""

    LOOK_BACK = 32

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self._kafka = None
        self._lock = threading.Lock()
        self._times: dict = {}

    def _client(self):
        if self._kafka is None:
            from statekit.kafka import Kafka

            self._kafka = Kafka(self.bootstrap)
        return self._kafka

    def _time_before(self, topic: str, partition: int, offset: int) -> Optional[float]:
        """Epoch seconds of the last committed record before ``offset`` (None: none there)."""
        from statekit.state.restore import COMMITTED

        key = (topic, partition, offset)
        if key in self._times:
            return self._times[key]
        k = self._client()
        ts = None
        start = max(0, offset - self.LOOK_BACK)
        for chunk in k.read(topic, partition, start, offset, isolation=COMMITTED):
            for off, t, _k, _v, _h in chunk.records:
                if off < offset and t is not None and t >= 0:
                    ts = t / 1000.0
        if ts is None and offset > self.LOOK_BACK:   # compacted: any earlier record will do
            for chunk in k.read(topic, partition, None, offset, isolation=COMMITTED):
                for off, t, _k, _v, _h in chunk.records:
                    if off < offset and t is not None and t >= 0:
                        ts = t / 1000.0
        if len(self._times) > 4096:
            self._times.clear()
        self._times[key] = ts
        return ts

    def _first_time(self, topic: str, partition: int, end: int) -> Optional[float]:
        from statekit.state.restore import COMMITTED

        for chunk in self._client().read(topic, partition, None, end, isolation=COMMITTED):
            for off, t, _k, _v, _h in chunk.records:
                if t is not None and t >= 0:
                    return t / 1000.0
        return None

    def seconds(self, topic: str, partition: int, offset: Optional[int],
                end: int) -> Optional[float]:
        """Seconds of commits between ``offset`` (what a copy applied) and ``end``."""
        if offset is not None and offset >= end:
            return 0.0
        try:
            with self._lock:
                newest = self._time_before(topic, partition, end)
                oldest = (self._time_before(topic, partition, offset) if offset else None) \
                    or self._first_time(topic, partition, end)
        except Exception:  # noqa: BLE001 - a figure for people: unknown rather than an error
            return None
        if newest is None or oldest is None:
            return None
        return max(0.0, newest - oldest)

    def close(self) -> None:
        with self._lock:
            if self._kafka is not None:
                self._kafka.close()
                self._kafka = None


# -- the refusal ------------------------------------------------------------------------------

_SOURCES = {"scratch": "from scratch", "checkpoint": "from its checkpoint",
            "standby": "from its promoted standby", "warmup": "from its promoted warmup"}


def task_state(active: Optional[Copy], no_live: bool) -> tuple:
    """``(state word, detail)`` of a task whose copies are not current: restoring, moving, owner
    dead, failed, stopped, paused (a query replica) or behind."""
    if active is None:
        return "owner dead", "no instance holds it"
    i = active.instance
    if active.role == "query-replica":
        if active.state == "paused":
            return "paused", "its query replica is paused: resume_standbys() lets it catch up"
        return "behind", "its query replica is still reading the changelog"
    s = active.state
    if s == "restoring":
        how = _SOURCES.get(active.source or "", "")
        return "restoring", f"on instance {i}" + (f", {how}" if how else "")
    if s == "moving":   # assigned; its new owner reported it queued (source known), or not yet
        return "moving", f"to instance {i}" + (", its restore not started yet" if active.source else "")
    if s == "dead":
        if no_live:
            return "owner dead", f"instance {i} died and no instance is alive"
        return "owner dead", f"instance {i} died; the task moves to a live instance"
    if s == "stopped":
        return "stopped", "the app is not running"
    if s == "failed":
        return "failed", f"on instance {i}: {active.error or 'see app.error'}"
    return "behind", f"on instance {i}, committing"


def refusal(store: str, task: TaskId, copies: list, *, waited: float, wait: float,
            no_live: bool = False, stale: bool = False) -> StaleRead:
    """The one-line ``StaleRead`` for a task none of whose ``copies`` (active first) was current
    (``stale``: none could be read at all): the task, its state, its lag (records, seconds where
    known, time to go) and what to do."""
    active = next((c for c in copies if c.role in ("active", "query-replica")), None)
    state, detail = task_state(active, no_live)
    lead = active if active is not None else (copies[0] if copies else None)
    if lead is not None and lead.lag is not None:
        known = lead.lag_s is not None and lead.lag_s >= 0.1
        secs = f" ({_secs(lead.lag_s)} of commits)" if known else ""
        eta = f", ≈ {_secs(lead.eta_s)} to go" if lead.eta_s is not None else ""
        lag = f"{lead.lag:,} changelog record{'s' * (lead.lag != 1)}{secs} behind{eta}"
    else:
        lag = "lag unknown"
    if state in ("owner dead",) and no_live:
        todo = "revive() an instance or restart() the app"
    elif state == "failed":
        todo = "restart() the app"
    elif state == "stopped":
        todo = "start() the app"
    elif state == "paused":
        todo = "resume_standbys()"
    else:
        todo = "query again" + (f", wait longer (wait={max(30, round(2 * wait))})" if wait >= 0.05
                                else " with wait= seconds to wait for it")
    if stale:
        msg = (f"store {store!r}, task {task}: {state} ({detail}), {lag}; no copy to read yet: "
               f"{todo}")
    else:
        readable = [c for c in copies if c.offset is not None]
        best = max(readable, key=lambda c: c.offset) if readable else None
        waited_s = f"after waiting {waited:.1f} s" if wait >= 0.05 and waited >= 0.05 else "at once"
        other = (f", or pass stale=True to read {best.where()} ({best.behind()})"
                 if best is not None else "; no copy to read with stale=True yet either")
        msg = (f"store {store!r}, task {task}: {state} ({detail}), {lag}; no current copy "
               f"{waited_s}: {todo}{other}")
    return StaleRead(msg, task=task, store=store, state=state,
                     instance=None if active is None else active.instance,
                     lag=None if lead is None else lead.lag,
                     lag_s=None if lead is None else lead.lag_s, waited=waited)


def with_time_lag(c: Copy, timelag: Optional[TimeLag], topic: str) -> Copy:
    """``c`` with its ``lag_s`` filled in (0 when current)."""
    if c.end is None or c.lag_s is not None:
        return c
    if c.lag == 0:
        return replace(c, lag_s=0.0)
    if timelag is None:
        return c
    return replace(c, lag_s=timelag.seconds(topic, c.task.partition, c.offset, c.end))
