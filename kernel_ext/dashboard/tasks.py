"""Tasks and instances as they are now: one record per task (its active copy), per replica and per
instance, kept from the app's typed events as they arrive and filled in from its polled status
where no event told (a dashboard opened long after the start, an app without events). Pure Python.

Every fact carries the time it was observed. A polled figure is taken only when it was observed
after what the events last said (a status fetched before a crash must not bring the dead instance
back); a task's state, once an event said it, comes from the events only, so the task chips, the
Tasks tab and the Restoration panel (which reads the same events) cannot disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kernel_ext.dashboard.formats import num, task_id, task_order
from statekit import events as ev

TASK_STATES = ("queued", "restoring", "running", "failed", "closed", "unknown")
LIVE_STATUSES = ("alive", "leaving")
NEVER = float("-inf")   # the observation time of a fact nothing has said yet


@dataclass
class StoreFigures:
    """One store of one task: keys, the changelog position of its state, the changelog end."""

    rows: Optional[int] = None        # keys in the store (Committed.rows)
    dirty: Optional[int] = None       # record-cache entries flushed at the last commit
    checkpoint: Optional[int] = None  # changelog offset its state stands at (commit, restore position)
    end: Optional[int] = None         # the changelog partition's end
    at: float = NEVER                   # when checkpoint/end were observed

    @property
    def lag(self) -> Optional[int]:
        if self.end is None or self.checkpoint is None:
            return None
        return max(0, self.end - self.checkpoint)


@dataclass
class TaskFact:
    task: str
    instance: Optional[int] = None    # its active instance (None: its instance died, none yet)
    state: str = "unknown"            # queued | restoring | running | failed | closed | unknown
    source: Optional[str] = None
    at: float = NEVER                   # when the state was observed
    from_events: bool = False         # an event said its state (polls no longer do)
    stores: dict = field(default_factory=dict)   # store -> StoreFigures
    backlog: int = 0                  # micro-batches spooled for it
    backlog_at: float = NEVER
    last_batch: Optional[int] = None
    records: int = 0                  # input records its commits processed (since the dashboard began)


@dataclass
class InstanceFact:
    instance: int
    status: str = "alive"             # alive | leaving | dead | stopped | left
    incarnation: Optional[int] = None
    active: list = field(default_factory=list)
    standby: list = field(default_factory=list)
    warmup: list = field(default_factory=list)
    at: float = NEVER                   # when status was observed
    lists_at: float = NEVER             # when its task lists were observed
    from_events: bool = False           # an event said its status (polls no longer do)


@dataclass
class ReplicaFact:
    task: str
    instance: int
    role: str = "standby"             # standby | warmup
    positions: dict = field(default_factory=dict)   # store -> changelog offset applied
    lag: Optional[int] = None         # as its last event or poll said
    at: float = NEVER


class TaskBoard:
    """Feed typed events with `apply`, polled status with `absorb_*`; read `tasks`, `instances`,
    `replicas`, `app_state`."""

    def __init__(self):
        self.tasks: dict[str, TaskFact] = {}
        self.instances: dict[int, InstanceFact] = {}
        self.replicas: dict[tuple, ReplicaFact] = {}
        self.app_state: Optional[str] = None
        self.state_at = NEVER
        self.state_reason = ""
        self.generation: Optional[int] = None
        self.committed_records = 0        # input records of every commit seen
        self.first_commit_at: Optional[float] = None

    # -- helpers -----------------------------------------------------------------------------

    def task(self, t) -> TaskFact:
        t = task_id(t)
        f = self.tasks.get(t)
        if f is None:
            f = self.tasks[t] = TaskFact(t)
        return f

    def instance(self, i) -> InstanceFact:
        i = int(i)
        f = self.instances.get(i)
        if f is None:
            f = self.instances[i] = InstanceFact(i)
        return f

    def _set(self, f: TaskFact, state: str, ts: float, instance=-1) -> None:
        f.state, f.at, f.from_events = state, max(f.at, ts), True
        if instance != -1:
            f.instance = instance

    def store_names(self, task: str) -> list:
        """The stores of `task`: its own, else those of its sub-topology's other tasks."""
        f = self.tasks.get(task)
        if f is not None and f.stores:
            return sorted(f.stores)
        sub = task.split("_")[0] if task else ""
        names = set()
        for t, g in self.tasks.items():
            if t.split("_")[0] == sub:
                names.update(g.stores)
        return sorted(names)

    def stores(self) -> list:
        return sorted({s for f in self.tasks.values() for s in f.stores})

    # -- events ------------------------------------------------------------------------------

    def apply(self, e) -> None:
        """One typed event (``statekit.events``)."""
        ts = e.ts
        if e.generation is not None and (self.generation is None or e.generation > self.generation):
            self.generation = e.generation
        if isinstance(e, ev.StateChanged):
            if ts >= self.state_at:
                self.app_state, self.state_at, self.state_reason = e.state, ts, e.reason or ""
            if e.state == "NOT_RUNNING":
                self._all_stopped(ts)
        elif isinstance(e, ev.InstanceStarted):
            f = self.instance(e.instance)
            f.status, f.incarnation, f.at, f.from_events = "alive", e.incarnation, ts, True
        elif isinstance(e, ev.InstanceDied):
            f = self.instance(e.instance)
            f.status, f.at, f.from_events = "dead", ts, True
            f.active, f.standby, f.warmup, f.lists_at = [], [], [], ts
            held = self.orphans(e)
            for t in self.tasks.values():
                # a task that failed there stays failed unless the death names it (then it is
                # queued again): the Restoration panel keeps such a task's final row too
                if t.task in held or (t.instance == e.instance and t.state not in ("closed", "failed")):
                    self._set(t, "queued", ts, None)
                    for sf in t.stores.values():   # its lag is known once a new owner is told
                        sf.checkpoint, sf.at = None, max(sf.at, ts)
            for k in [k for k in self.replicas if k[1] == e.instance]:
                del self.replicas[k]
        elif isinstance(e, ev.InstanceLeft):
            f = self.instance(e.instance)
            f.status, f.at, f.from_events = "left", ts, True
            f.active, f.standby, f.warmup, f.lists_at = [], [], [], ts
        elif isinstance(e, ev.Rebalance):
            self._rebalance(e)
        elif isinstance(e, ev.RestoreQueued):
            f = self.task(e.task)
            self._set(f, "queued", ts, e.instance)
            f.source = e.source
            for store, span in (e.stores or {}).items():   # what its restore will read: its lag
                try:
                    start, end = int(span[0]), int(span[1])
                except (TypeError, ValueError, IndexError):
                    continue
                sf = f.stores.setdefault(str(store), StoreFigures())
                sf.checkpoint, sf.end, sf.at = start, end, max(sf.at, ts)
        elif isinstance(e, ev.RestoreStarted):
            f = self.task(e.task)
            self._set(f, "restoring", ts, e.instance)
            sf = f.stores.setdefault(e.store, StoreFigures())
            sf.checkpoint, sf.end, sf.at = e.start_offset, e.end_offset, ts
            f.source = e.source or f.source
        elif isinstance(e, ev.RestoreProgress):
            f = self.task(e.task)
            if f.state in ("queued", "restoring", "unknown"):
                self._set(f, "restoring", ts, e.instance)
            sf = f.stores.setdefault(e.store, StoreFigures())
            if e.remaining is not None and sf.end is not None:
                sf.checkpoint = max(0, sf.end - int(e.remaining))
            else:
                sf.checkpoint = e.offset
            sf.at = ts
        elif isinstance(e, ev.RestoreEnded):
            f = self.task(e.task)
            sf = f.stores.setdefault(e.store, StoreFigures())
            sf.checkpoint = sf.end = e.end_offset
            sf.at = ts
        elif isinstance(e, ev.TaskOpened):
            f = self.task(e.task)
            self._set(f, "running", ts, e.instance)
            f.last_batch = e.last_batch if e.last_batch is not None and e.last_batch >= 0 else f.last_batch
            for sf in f.stores.values():
                if sf.end is not None:
                    sf.checkpoint = sf.end
        elif isinstance(e, ev.TaskClosed):
            f = self.task(e.task)
            if f.instance == e.instance and f.state not in ("failed",):
                self._set(f, "closed", ts)
        elif isinstance(e, ev.TaskFailed):
            f = self.task(e.task)
            self._set(f, "failed", ts, e.instance)
        elif isinstance(e, ev.Committed):
            self._commit(e)
        elif isinstance(e, ev.BatchSpooled):
            f = self.task(e.task)
            if ts >= f.backlog_at:
                f.backlog, f.backlog_at = int(e.backlog or 0), ts
        elif isinstance(e, (ev.ReplicaStarted, ev.WarmupCaughtUp)):
            r = self.replicas.get((task_id(e.task), e.instance))
            if r is None:
                r = self.replicas[(task_id(e.task), e.instance)] = ReplicaFact(
                    task_id(e.task), e.instance, getattr(e, "role", "warmup"))
            r.lag, r.at = e.lag, ts
        elif isinstance(e, ev.ReplicaStopped):
            self.replicas.pop((task_id(e.task), e.instance), None)

    def orphans(self, e) -> set:
        """The tasks an `InstanceDied` leaves without an owner: those it names that still run (or
        wait) there, not one already opened on another instance (an executor's death is noticed
        after Spark ran its tasks elsewhere)."""
        out = set()
        for t in e.tasks or ():
            f = self.tasks.get(task_id(t))
            if f is None or f.instance in (None, e.instance):
                out.add(task_id(t))
        return out

    def _all_stopped(self, ts: float) -> None:
        for f in self.instances.values():
            if f.status in LIVE_STATUSES:
                f.status, f.at = "stopped", ts
        for t in self.tasks.values():
            if t.state not in ("failed",):
                self._set(t, "closed", ts)
        self.replicas.clear()

    def _rebalance(self, e) -> None:
        ts = e.ts
        live = {int(i) for i in (e.live or ())}
        active = {task_id(t): int(i) for t, i in (e.active or {}).items()}
        lists: dict = {i: ([], [], []) for i in live}
        for t, i in active.items():
            lists.setdefault(i, ([], [], []))[0].append(t)
        roles = {}
        for k, (name, idx) in (("standbys", ("standby", 1)), ("warmups", ("warmup", 2))):
            for t, insts in (getattr(e, k) or {}).items():
                for i in insts:
                    lists.setdefault(int(i), ([], [], []))[idx].append(task_id(t))
                    roles[(task_id(t), int(i))] = name
        for i, (a, s, w) in lists.items():
            f = self.instance(i)
            if ts >= f.lists_at:
                f.active, f.standby, f.warmup = (sorted(x, key=task_order) for x in (a, s, w))
                f.lists_at = ts
            if i in live and f.status in ("dead", "left", "stopped") and ts > f.at:
                f.status, f.at, f.from_events = "alive", ts, True
        for t, i in active.items():
            f = self.task(t)
            if not f.from_events:
                f.instance = i
        for k in [k for k in self.replicas if k not in roles]:
            del self.replicas[k]
        for (t, i), role in roles.items():
            r = self.replicas.get((t, i))
            if r is None:
                self.replicas[(t, i)] = ReplicaFact(t, i, role, at=ts)
            else:
                r.role = role

    def _commit(self, e) -> None:
        f = self.task(e.task)
        ts = e.ts
        self.committed_records += int(e.records or 0)
        if self.first_commit_at is None:
            self.first_commit_at = ts
        f.records += int(e.records or 0)
        if e.batch is not None and e.batch >= 0:
            f.last_batch = e.batch
        if f.instance in (None, e.instance) and f.state in ("unknown", "queued", "restoring", "running"):
            # a commit is a task that runs there (its TaskOpened may be older than the history)
            if f.state != "running" or f.instance is None:
                self._set(f, "running", ts, e.instance)
        if e.from_spool and ts >= f.backlog_at:
            f.backlog, f.backlog_at = max(0, f.backlog - 1), ts
        names = set(e.rows or {}) | set(e.offsets or {}) | set(e.cache or {})
        for store in names:
            sf = f.stores.setdefault(store, StoreFigures())
            rows = num((e.rows or {}).get(store))
            if rows is not None:
                sf.rows = rows
            c = (e.cache or {}).get(store)
            if isinstance(c, dict):
                c = c.get("cache", c)
                sf.dirty = num(c.get("dirty")) if isinstance(c, dict) else sf.dirty
            off = num((e.offsets or {}).get(store))
            if off is not None and ts >= sf.at:
                sf.checkpoint = sf.end = off   # the active copy writes the partition: its end
                sf.at = ts

    # -- polls -------------------------------------------------------------------------------

    def absorb_state(self, state: Optional[str], at: float) -> None:
        if state and at > self.state_at:
            self.app_state, self.state_at = state, at

    def absorb_instances(self, rows: list, at: float) -> None:
        """`App.instances_frame()` rows, observed at `at`. An instance's status, once an event
        said it, comes from events only (a poll that saw a death before its event arrived would
        leave its tasks running on a dead instance for a moment)."""
        for r in rows:
            i = num(r.get("instance"))
            if i is None:
                continue
            f = self.instance(i)
            if at > f.at and not f.from_events:
                f.status = str(r.get("status") or f.status)
                f.incarnation = num(r.get("incarnation"), f.incarnation)
                f.at = at
            if at > f.lists_at:
                f.active, f.standby, f.warmup = ([task_id(x) for x in (r.get(k) or [])]
                                                 for k in ("active", "standby", "warmup"))
                f.lists_at = at
                roles = {(t, i): "standby" for t in f.standby}
                roles.update({(t, i): "warmup" for t in f.warmup})
                for k, rep in list(self.replicas.items()):
                    if k[1] == i and k not in roles and at > rep.at:
                        del self.replicas[k]
                for k, role in roles.items():
                    if k not in self.replicas:
                        self.replicas[k] = ReplicaFact(k[0], i, role, at=at)

    def absorb_status(self, status: dict, at: float) -> None:
        """`App.task_status()` (the instances' own word, at most a second old at `at`)."""
        for t, st in (status or {}).items():
            f = self.task(t)
            if not f.from_events and at > f.at:
                f.state = str(st.get("state") or f.state).lower()
                f.instance = num(st.get("instance"), f.instance)
                f.source = st.get("source") or f.source
                f.at = at
            if at > f.backlog_at and st.get("backlog") is not None:
                f.backlog, f.backlog_at = int(num(st.get("backlog"), 0) or 0), at
            lb = num(st.get("last_batch"))
            if lb is not None and lb >= 0 and (f.last_batch is None or lb > f.last_batch):
                f.last_batch = lb

    def absorb_lag(self, rows: list, at: float) -> None:
        """`App.lag()` rows (normalized: task, instance, role, state, store, checkpoint,
        changelog_end, rows, dirty): positions and ends newer than what the events said."""
        for r in rows:
            t, store = r.get("task"), r.get("store")
            if t is None or not store:
                continue
            if r.get("checkpoint") is None and r.get("changelog_end") is not None and r.get("lag") is not None:
                r = dict(r, checkpoint=r["changelog_end"] - r["lag"])
            if r.get("role", "active") == "active":
                f = self.task(t)
                sf = f.stores.setdefault(store, StoreFigures())
                # a task waiting or restoring: its position is what its restore events said (the
                # Restoration panel reads the same), not an instance's status of a moment before
                opening = f.from_events and f.state in ("queued", "restoring")
                if at > sf.at and not opening:
                    if r.get("checkpoint") is not None:
                        sf.checkpoint = r["checkpoint"]
                    if r.get("changelog_end") is not None:
                        sf.end = r["changelog_end"]
                    sf.at = at
                for k in ("rows", "dirty"):
                    if getattr(sf, k) is None and r.get(k) is not None:
                        setattr(sf, k, r[k])
                if not f.from_events and at > f.at:
                    f.instance = num(r.get("instance"), f.instance)
                    if r.get("state"):
                        f.state = str(r["state"]).lower()
                    f.at = at
                elif f.instance is None and not f.from_events:
                    f.instance = num(r.get("instance"))
            else:
                inst = num(r.get("instance"))
                if inst is None:
                    continue
                rep = self.replicas.get((t, inst))
                if rep is None:
                    rep = self.replicas[(t, inst)] = ReplicaFact(t, inst, r["role"])
                if at > rep.at or rep.lag is None:
                    rep.role = r["role"]
                    if r.get("checkpoint") is not None:
                        rep.positions[store] = r["checkpoint"]
                    rep.lag = None
                    rep.at = at
                f = self.task(t)
                sf = f.stores.setdefault(store, StoreFigures())
                if r.get("changelog_end") is not None and (sf.end is None or at > sf.at):
                    sf.end = r["changelog_end"]

    # -- reading -----------------------------------------------------------------------------

    def replica_lag(self, rep: ReplicaFact, store: str) -> Optional[int]:
        pos = rep.positions.get(store)
        f = self.tasks.get(rep.task)
        end = f.stores[store].end if f is not None and store in f.stores else None
        if pos is None or end is None:
            return rep.lag
        return max(0, end - pos)
