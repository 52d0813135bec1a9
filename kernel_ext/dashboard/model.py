"""The dashboard's data model: pure Python, no widgets, no IPython.

Two inputs, one output:

* `DashboardModel.apply(event)`: every typed event (`statekit.events`) the moment the app's event
  reader delivers it (`App.on_event`): a crash, a rebalance, a restore's start, progress and end,
  an error, a state change is on the model at once, not at the next collection.
* `DashboardModel.absorb(snapshot)`: what is only known by asking the app (a `Snapshot`: its state,
  metrics, task status, instances, store contents, changelog figures, the restore forecast),
  polled off the refresh path (`collect.Poller`). A polled fact is kept only where it is newer than
  what the events said (`tasks.TaskBoard`).
* `DashboardModel.picture()`: one `Picture`, taken under the model's lock, that every panel of a
  refresh reads: the badge, the header figures, the task chips, the Tasks tab, the Instances and
  Restoration panels, the store, the changelog, the events, the charts' series. A task's state is
  the same everywhere in it (`disagreements` checks).
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from kernel_ext.dashboard.formats import (clip, fmt_eta, fmt_num, fmt_rate, fmt_secs, num,  # noqa: F401
                                          short_error, task_id, task_order)
from kernel_ext.dashboard.membership import InstanceRates, OwnershipTimeline
from kernel_ext.dashboard.forecast import (forecast_behind, forecast_by_instance, forecast_data,  # noqa: F401
                                           forecast_seconds)
from kernel_ext.dashboard.restore import RestoreBoard, RestoreRound
from kernel_ext.dashboard.tasks import LIVE_STATUSES, TaskBoard
from statekit import events as ev

_num = num

# ---------------------------------------------------------------------------------------------
# snapshots: what polling the app found


@dataclass
class Snapshot:
    """What asking an app found at one instant (plain data). A field left None was not asked."""

    t: float
    state: str = "UNKNOWN"
    app_error: str | None = None        # the app's one-line error (state ERROR)
    metrics: dict = field(default_factory=dict)
    tasks: list[dict] = field(default_factory=list)     # App.lag() rows
    status: dict = field(default_factory=dict)          # App.task_status(): task -> {...}
    instances: list[dict] = field(default_factory=list)  # App.instances_frame() rows
    stores: dict[str, dict] = field(default_factory=dict)  # store -> {key: value}
    store_marks: dict = field(default_factory=dict)  # store -> rows not current (collect.store_marks)
    events: list = field(default_factory=list)  # typed events to apply first (tests; the feed applies them live)
    changelog: list[dict] | None = None  # one dict per changelog partition (None: not read this time)
    task_rows: dict = field(default_factory=dict)  # (task, store) -> keys, counted from the store read
    forecast: dict | None = None  # the restore forecast as forecast_data() (None: not asked, not there)
    has_events: bool = True  # the app publishes statekit.events (Spark's own state store does not)
    error: str | None = None  # a panel that could not be read (one line)
    asked_at: float | None = None  # when the polling began (what it read is at least this new)
    waiting: dict | None = None  # App.waiting while WAITING: line, since, aborted, tasks


TASK_FIELDS = ("task", "instance", "role", "store", "rows", "dirty", "checkpoint", "changelog_end",
               "lag", "state")

# App.lag()'s columns (both engines), and the dashboard's names for them
_TASK_COLUMNS = {"task": "task", "instance": "instance", "role": "role", "store": "store",
                 "rows": "rows", "dirty": "dirty", "checkpoint_offset": "checkpoint",
                 "changelog_end": "changelog_end", "lag": "lag", "state": "state"}


def normalize_task(row: dict) -> dict:
    """An `App.lag()` row as the dashboard's task row (TASK_FIELDS; task as "0_3")."""
    out = {name: None for name in TASK_FIELDS}
    for col, name in _TASK_COLUMNS.items():
        v = row.get(col, row.get(name))
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            out[name] = v
    out["task"] = task_id(out["task"])
    for k in ("instance", "rows", "dirty", "checkpoint", "changelog_end", "lag"):
        out[k] = num(out[k])
    if out["lag"] is None and out["changelog_end"] is not None and out["checkpoint"] is not None:
        out["lag"] = max(0, out["changelog_end"] - out["checkpoint"])
    role = str(out["role"] or "active").lower()
    out["role"] = role if role in ("active", "standby", "warmup") else "active"
    return out


# ---------------------------------------------------------------------------------------------
# pure helpers (unit-tested)


@dataclass
class Diff:
    added: set = field(default_factory=set)
    changed: set = field(default_factory=set)
    removed: set = field(default_factory=set)

    @property
    def touched(self) -> set:
        return self.added | self.changed

    def __len__(self):
        return len(self.added) + len(self.changed) + len(self.removed)


def _behind(mark: dict | None) -> str | None:
    """A row's mark when its task's copy is not current: "restoring · 1,522 behind"."""
    if not mark:
        return None
    state = {"dead": "owner dead", "tailing": "catching up"}.get(mark.get("state"), mark.get("state"))
    lag = mark.get("lag")
    return f"{state} · {fmt_num(lag)} behind" if lag is not None else str(state)


def diff_rows(before: dict | None, after: dict) -> Diff:
    """Keys added, changed (value differs) and removed between two store contents."""
    before = before or {}
    d = Diff()
    for k, v in after.items():
        if k not in before:
            d.added.add(k)
        elif before[k] != v:
            d.changed.add(k)
    d.removed = set(before) - set(after)
    return d


class CounterRate:
    """Rate of a growing counter over the last `window` seconds: (newest - oldest sample in the
    window) / their time apart. A counter that stops growing reads 0 once `window` has passed (the
    producer stopped); a counter that goes down (a new app) starts over."""

    def __init__(self, window: float = 5.0):
        self.window = window
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, t: float, count) -> None:
        if count is None:
            return
        if self.samples and count < self.samples[-1][1]:
            self.samples.clear()
        if self.samples and t <= self.samples[-1][0]:
            self.samples[-1] = (self.samples[-1][0], count)
            return
        self.samples.append((t, count))
        while len(self.samples) > 2 and t - self.samples[1][0] >= self.window:
            self.samples.popleft()

    @property
    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
        return max(0.0, (c1 - c0) / (t1 - t0)) if t1 > t0 else None


def _sort_value(v):
    """A number to rank a store value by: the value itself, or a count/sum/value field."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, dict):
        for k in ("count", "sum", "value", "total", "n", "max", "avg"):
            if isinstance(v.get(k), (int, float)) and not isinstance(v.get(k), bool):
                return v[k]
    return None


def layout_topology(nodes: Iterable[dict], edges: Iterable[tuple]) -> dict[str, tuple[float, float]]:
    """Place nodes in columns: sources → processors → stores → changelogs → sinks.

    `nodes`: dicts with "id" and "kind" ("source", "processor", "store", "changelog", "sink", or
    anything else, treated as a processor). `edges`: (from_id, to_id). Processors are spread over
    several columns by their longest path from a source. Returns id -> (x, y), x = column index,
    y in [0, 1] (top to bottom)."""
    nodes = list(nodes)
    edges = [(e[0], e[1]) for e in edges]
    kinds = {n["id"]: (n.get("kind") or "processor") for n in nodes}
    pred: dict[str, list[str]] = {n: [] for n in kinds}
    for a, b in edges:
        if a in kinds and b in kinds:
            pred[b].append(a)
    depth: dict[str, int] = {}  # of each processor: the longest path from a source through processors

    def proc_depth(n, seen=()):
        if n in depth:
            return depth[n]
        ps = [p for p in pred[n] if kinds[p] not in ("source", "store", "changelog") and p not in seen]
        d = 0 if not ps else 1 + max(proc_depth(p, seen + (n,)) for p in ps)
        depth[n] = d
        return d

    proc_cols = 1
    for n, k in kinds.items():
        if k not in ("source", "store", "changelog", "sink"):
            proc_cols = max(proc_cols, proc_depth(n) + 1)
    fixed = {"source": 0, "store": 1 + proc_cols, "changelog": 2 + proc_cols, "sink": 3 + proc_cols}
    col = {n: fixed[k] if k in fixed else 1 + depth.get(n, 0) for n, k in kinds.items()}
    used = sorted(set(col.values()))   # drop empty columns so the drawing stays compact
    remap = {c: i for i, c in enumerate(used)}
    col = {n: remap[c] for n, c in col.items()}
    # order inside a column: by the mean y of predecessors (one sweep), else by declaration
    order = {n["id"]: i for i, n in enumerate(nodes)}
    pos: dict[str, tuple[float, float]] = {}
    for c in range(len(used)):
        members = [n for n in kinds if col[n] == c]

        def key(n):
            ys = [pos[p][1] for p in pred[n] if p in pos]
            return (sum(ys) / len(ys) if ys else 0.5, order[n])

        members.sort(key=key)
        k = len(members)
        for i, n in enumerate(members):
            pos[n] = (float(c), 0.5 if k == 1 else 0.1 + 0.8 * i / (k - 1))
    return pos


# ---------------------------------------------------------------------------------------------
# what the panels read


@dataclass
class StoreRow:
    key: Any
    value: Any
    status: str | None  # "new" | "changed" | None
    last_change: float | None
    behind: str | None = None  # its task's copy is not current: "restoring · 1,522 behind"


@dataclass
class ChartMarker:
    t: float
    kind: str   # crash | restart | restored | rebalance | join | revive | leave
    label: str = ""


LIVE_STATES = ("RESTORING", "REBALANCING", "RUNNING", "WAITING")
NOISY_EVENTS = (ev.Committed, ev.RestoreProgress, ev.BatchSpooled)
# the events a picture must show at once (the refresh thread is woken for them)
URGENT_EVENTS = (ev.StateChanged, ev.InstanceDied, ev.InstanceStarted, ev.InstanceLeft, ev.Rebalance,
                 ev.RestoreQueued, ev.RestoreStarted, ev.RestoreEnded, ev.TaskOpened, ev.TaskFailed,
                 ev.StandbyPromoted, ev.Crashed)


@dataclass
class Picture:
    """Everything one refresh shows, read from the model at one instant (under its lock): no two
    panels of a refresh can disagree."""

    t: float
    version: int
    state: str
    reason: str
    app_error: str | None
    last_error: str | None
    error: str | None                 # a part that could not be read (one line)
    has_events: bool
    header: dict
    chips: list
    tasks: list                       # the Tasks tab, active rows first per task
    instances: list
    round: RestoreRound | None        # the current restore round (a frozen copy)
    round_forecast: tuple | None      # (time, forecast) made before that round began
    forecast: dict | None
    forecast_at: float | None
    forecast_behind: bool             # made before the app's last commit, and the app has stopped
    store: str | None
    store_names: list
    store_rows: list
    store_total: int                  # rows read of the shown store
    store_held: int                   # keys the store holds (the tasks' commits say)
    store_changed: int
    store_hidden: list                # changed keys outside the top k
    top_k: int
    sort_by: str
    changelog: list
    events: list
    lag: dict                         # task -> (seconds since t0, lag)
    standby_lag: dict
    markers: list                     # (seconds since t0, kind, label)
    ownership: OwnershipTimeline
    t0: float
    store_stale: list = field(default_factory=list)   # one line per task whose rows are not current
    outages: list = field(default_factory=list)   # Kafka away: (start, end, label), seconds since t0


class DashboardModel:
    """Feed typed events with `apply` (any thread) and polled facts with `absorb`; read one
    consistent `picture()` per refresh."""

    def __init__(self, top_k: int = 15, history_points: int = 600, sort_by: str = "value",
                 rate_window: float = 5.0, name: str = ""):
        self.name = name
        self.top_k = top_k
        self.sort_by = sort_by  # "value" | "recency" | "key"
        self.key_filter = ""
        self.store: str | None = None  # the store shown in the contents panel
        self.lock = threading.RLock()
        self.version = 0
        self.board = TaskBoard()
        self.restores = RestoreBoard()
        self.ownership = OwnershipTimeline()
        self.instance_rates = InstanceRates(rate_window)
        self.input = CounterRate(rate_window)
        self.events: deque = deque(maxlen=200)   # the latest non-noisy events (Events tab)
        self.markers: deque = deque(maxlen=60)   # lag chart markers
        self.lag_history: dict[str, deque] = {}
        self.standby_lag_history: dict[str, deque] = {}
        self._history_points = history_points
        self._sampled_at: float | None = None
        self.snapshot: Snapshot | None = None    # the last poll
        self.refreshes = 0
        self.metrics: dict = {}
        self.app_error: str | None = None
        self.last_error: str | None = None       # the app's last one-line error (kept after restart)
        self.panel_error: str | None = None
        self.has_events = True
        self.last_rebalance = None               # the latest Rebalance event
        self.started_at: float | None = None     # the app's (latest) start, from its state events
        self.stores: dict[str, dict] = {}        # store -> the rows read last
        self.store_read_at: dict[str, float] = {}
        self.store_marks: dict[str, dict] = {}   # store -> its rows that are not current
        self.task_rows: dict = {}                # (task, store) -> keys counted by the last read
        self.diffs: dict = {}
        self.last_change: dict[str, dict] = {}   # store -> key -> time of its last change
        self.changelog: list = []
        self.forecast: dict | None = None
        self.forecast_at: float | None = None
        self.t0: float | None = None
        self.ignored = 0                          # non-typed events (the model reads typed ones only)
        self.commits = 0                          # commit events applied
        self.committed_at: float | None = None    # the latest commit event's time
        self.store_commits: dict[str, int] = {}   # store -> commits that wrote it (the store reader's signal)
        self._round_done_seen: set = set()
        self._own_frozen: tuple = (None, None)
        self.outages: list = []    # Kafka away: [since, until or None, aborted] (epoch seconds)
        self.waiting: dict | None = None   # the app's own line while it waits for Kafka
        self.live = False          # a live dashboard: pictures are taken now (else at the latest fact)
        self._latest: float | None = None   # the time of the latest event or poll

    # -- events -----------------------------------------------------------------------------

    def apply(self, e) -> bool:
        """One typed event, applied now. Returns True when a picture should show it at once."""
        if not isinstance(e, ev.Event):
            self.ignored += 1
            return False
        with self.lock:
            self.version += 1
            if self.t0 is None:
                self.t0 = e.ts
            self._latest = e.ts if self._latest is None else max(self._latest, e.ts)
            self._apply(e)
        return isinstance(e, URGENT_EVENTS)

    def _apply(self, e) -> None:
        ts = e.ts
        if isinstance(e, ev.InstanceDied) and e.tasks:
            # its tasks already opened elsewhere (Spark ran them on another executor before the
            # death was noticed) are not queued again: not in the board, the round or the timeline
            keep = self.board.orphans(e)
            if len(keep) != len(e.tasks):
                e = dataclasses.replace(e, tasks=[t for t in e.tasks if task_id(t) in keep])
        self.board.apply(e)
        if not isinstance(e, NOISY_EVENTS):
            self.events.append(e)
        if isinstance(e, ev.Committed):
            self.commits += 1
            self.committed_at = max(ts, self.committed_at or ts)
            for store in set(e.rows or ()) | set(e.offsets or ()):
                self.store_commits[store] = self.store_commits.get(store, 0) + 1
            self.instance_rates.feed(e)
            return
        if isinstance(e, (ev.RestoreQueued, ev.InstanceDied, ev.StandbyPromoted, ev.RestoreStarted)):
            self._take_latest_forecast()   # the one a cell printed just before the crash, if any
        opened = self.restores.feed(e, self.forecast)
        if opened is not None:
            opened.forecast_at = self.forecast_at
        self._round_finished()
        self.ownership.feed(e)
        if isinstance(e, ev.StateChanged):
            if e.state in LIVE_STATES and e.old in ("CREATED", "NOT_RUNNING", "ERROR", ""):
                self.started_at = ts
            if e.state == "ERROR" and e.reason:
                self.last_error = e.reason
            if e.reason == "restart":
                self.markers.append(ChartMarker(ts, "restart", "restart"))
        elif isinstance(e, ev.InstanceDied):
            self.markers.append(ChartMarker(ts, "crash", f"instance {e.instance} died"))
        elif isinstance(e, ev.Rebalance):
            self.last_rebalance = e
            if e.moves:
                self.markers.append(ChartMarker(ts, "rebalance", f"g{e.generation if e.generation is not None else ''}: "
                                                                 f"{len(e.moves)} move(s)"))
        elif isinstance(e, ev.KafkaUnavailable):
            self._outage(e.since or ts, None)
        elif isinstance(e, ev.KafkaAvailable):
            self._outage(e.since or ts, (e.since or ts) + (e.seconds or 0.0), e.aborted)
        elif isinstance(e, ev.InstanceStarted) and e.reason in ("add", "revive"):
            self.markers.append(ChartMarker(ts, "join" if e.reason == "add" else "revive",
                                            f"instance {e.instance}"))

    def _take_latest_forecast(self) -> None:
        """The latest forecast made for the app in this process (`statekit.runtime.forecasts`), when
        it is newer than the one shown: a round opened a moment after a cell made one keeps that
        figure, not the dashboard's older one (the poll has not brought it yet)."""
        if not self.name or self.restores.restoring:
            return
        from statekit.runtime import forecasts

        fc = forecasts.latest(self.name)
        made = getattr(fc, "made_at", None)
        if fc is not None and made is not None and (self.forecast_at is None or made > self.forecast_at):
            self.forecast, self.forecast_at = forecast_data(fc), made

    def _outage(self, since: float, until: float | None, aborted: int | None = None) -> None:
        """An outage seen by a poll (WAITING) or an event: merged with the one it belongs to."""
        for o in self.outages:
            if abs(o[0] - since) < 1.0 or (o[1] is None and since >= o[0]):
                o[0] = min(o[0], since)
                if until is not None:
                    o[1] = until
                if aborted is not None:
                    o[2] = aborted
                return
        self.outages.append([since, until, aborted or 0])
        del self.outages[:-20]

    def _round_finished(self) -> None:
        cur = self.restores.current
        if cur is None or not cur.final or id(cur) in self._round_done_seen:
            return
        self._round_done_seen.add(id(cur))
        s = cur.summary()
        if s is not None and s.restored_tasks:
            self.markers.append(ChartMarker(s.finished, "restored", f"restored in {s.seconds:.1f} s"))

    # -- polls ------------------------------------------------------------------------------

    def absorb(self, snap: Snapshot) -> None:
        """What a poll found: kept where it is newer than what the events said."""
        at = snap.asked_at if snap.asked_at is not None else snap.t
        with self.lock:
            self.version += 1
            if self.t0 is None:
                self.t0 = snap.t
            self._latest = snap.t if self._latest is None else max(self._latest, snap.t)
            self.snapshot = snap
            self.refreshes += 1
            self.has_events = snap.has_events
            self.metrics = dict(snap.metrics or {})
            self.panel_error = snap.error
            b = self.board
            b.absorb_state(snap.state, at)
            if b.app_state == "NOT_RUNNING" and b.state_at == at:
                b._all_stopped(at)
            self.app_error = snap.app_error if snap.state == "ERROR" else None
            self.waiting = snap.waiting if snap.state == "WAITING" else None
            if self.waiting:
                self._outage(float(self.waiting.get("since") or snap.t), None,
                             self.waiting.get("aborted"))
            elif self.outages and self.outages[-1][1] is None and snap.state != "UNKNOWN":
                self.outages[-1][1] = snap.t   # over (its event may come a moment later)
            if snap.app_error:
                self.last_error = snap.app_error
            self.input.add(snap.t, num(self.metrics.get("records_processed")))
            if snap.instances:
                b.absorb_instances(snap.instances, at)
            if snap.status:
                b.absorb_status(snap.status, at - 1.0)   # the coordinator's statuses: up to 1 s old
            if snap.tasks:
                b.absorb_lag([normalize_task(r) for r in snap.tasks], at)
            self._absorb_stores(snap)
            if snap.changelog is not None:
                self.changelog = list(snap.changelog)
            if snap.forecast is not None and snap.forecast is not self.forecast and not self.restores.restoring:
                # (after a round opened: not its own). When it was made, not when the poll brought
                # it: a cell's forecast made after it is newer, though the poll came later
                self.forecast = snap.forecast
                self.forecast_at = snap.forecast.get("made_at") or snap.t
            self._sample(snap.t)

    def update(self, snap: Snapshot) -> "DashboardModel":
        """Apply a snapshot's events, then absorb it (tests and replays feed the model this way)."""
        for e in snap.events:
            self.apply(e)
        self.absorb(snap)
        return self

    def _absorb_stores(self, snap: Snapshot) -> None:
        for store, rows in snap.stores.items():
            self.store_marks[store] = snap.store_marks.get(store) or {}
            before = self.stores.get(store)
            d = Diff() if before is None or before is rows else diff_rows(before, rows)
            self.diffs[store] = d
            self.stores[store] = rows
            if before is not rows:
                self.store_read_at[store] = snap.t
            times = self.last_change.setdefault(store, {})
            for k in d.touched:
                times[k] = snap.t
            for k in d.removed:
                times.pop(k, None)
        for key, n in snap.task_rows.items():
            self.task_rows[key] = n
        if self.store is None and self.stores:
            self.store = sorted(self.stores)[0]

    def sample(self, now: float | None = None) -> None:
        """Append a point per task to the lag history (at most every half second)."""
        with self.lock:
            self._sample(time.time() if now is None else now)

    def _sample(self, now: float) -> None:
        if self._sampled_at is not None and now - self._sampled_at < 0.5:
            return
        self._sampled_at = now
        b = self.board
        for t, f in b.tasks.items():
            if any(sf.lag is None and sf.end is not None for sf in f.stores.values()):
                continue    # not known now (its instance died, no new owner told): a gap, not a guess
            lags = [sf.lag for sf in f.stores.values() if sf.lag is not None]
            if lags and f.state != "closed":
                self.lag_history.setdefault(t, deque(maxlen=self._history_points)).append((now, sum(lags)))
        per_task: dict = {}
        for rep in b.replicas.values():
            lags = [b.replica_lag(rep, s) for s in b.store_names(rep.task)]
            lags = [x for x in lags if x is not None] or ([rep.lag] if rep.lag is not None else [])
            if lags:
                per_task[rep.task] = per_task.get(rep.task, 0) + sum(lags)
        for t, lag in per_task.items():
            self.standby_lag_history.setdefault(t, deque(maxlen=self._history_points)).append((now, lag))

    def final(self, state) -> None:
        """The app stopped (or failed) and nothing more will be polled: show it so."""
        state = str(getattr(state, "value", state))
        with self.lock:
            self.version += 1
            now = time.time()
            self.board.app_state, self.board.state_at = state, now
            if state == "NOT_RUNNING":
                self.board._all_stopped(now)
            self.panel_error = None

    # -- the picture ------------------------------------------------------------------------

    @property
    def restoring(self) -> bool:
        return self.restores.restoring

    @property
    def state(self) -> str:
        return self.board.app_state or (self.snapshot.state if self.snapshot else "UNKNOWN")

    def picture(self) -> Picture:
        """One consistent view of everything (see `Picture`)."""
        with self.lock:
            return self._picture()

    def _picture(self) -> Picture:
        now = time.time() if self.live or self._latest is None else self._latest
        state = self.state
        cur = self.restores.current
        rnd = cur.frozen() if cur is not None else None
        chips, tasks = self._tasks(rnd)
        instances = self._instances(chips, now)
        store = self.store
        srows, total, held, changed, hidden, stale = self._store_view(store, tasks)
        t0 = self.t0 if self.t0 is not None else now
        alive = sum(r["status"] in LIVE_STATUSES for r in instances)
        header = self._header(state, chips, tasks, instances, alive)
        pic = Picture(
            t=now, version=self.version, state=state, reason="", app_error=self.app_error,
            last_error=self.last_error, error=self.panel_error, has_events=self.has_events,
            header=header, chips=chips, tasks=tasks, instances=instances, round=rnd,
            round_forecast=((getattr(cur, "forecast_at", None), cur.forecast)
                            if cur is not None and cur.forecast is not None else None),
            forecast=self.forecast, forecast_at=self.forecast_at,
            forecast_behind=self.forecast is not None and forecast_behind(
                self.forecast_at, self.committed_at, live=state in LIVE_STATES), store=store,
            store_names=sorted(self.stores), store_rows=srows, store_total=total, store_held=held,
            store_changed=changed, store_hidden=hidden, top_k=self.top_k, sort_by=self.sort_by,
            changelog=self._changelog_rows(tasks), events=list(self.events)[-14:],
            lag=self._series(self.lag_history, t0), standby_lag=self._series(self.standby_lag_history, t0),
            markers=[(m.t - t0, m.kind, m.label) for m in self.markers if m.t >= t0 - 1],
            ownership=self._ownership(), t0=t0, store_stale=stale,
            outages=[(a - t0, (b if b is not None else now) - t0,
                      f"Kafka away {(b if b is not None else now) - a:.0f} s"
                      + (f" · {n} transaction{'' if n == 1 else 's'} aborted" if n else ""))
                     for a, b, n in self.outages if (b if b is not None else now) >= t0 - 1])
        pic.reason = self._reason(pic)
        header["reason"] = pic.reason
        return pic

    def _ownership(self) -> OwnershipTimeline:
        v, frozen = self._own_frozen
        if v != self.ownership.version or frozen is None:
            frozen = self.ownership.frozen()
            self._own_frozen = (self.ownership.version, frozen)
        return frozen

    @staticmethod
    def _series(hist: dict, t0: float) -> dict:
        return {t: ([p[0] - t0 for p in dq], [p[1] for p in dq])
                for t, dq in sorted(hist.items(), key=lambda kv: task_order(kv[0]))}

    def _tasks(self, rnd) -> tuple[list, list]:
        """The chips and the Tasks tab rows. A task with an unfinished row in the current round has
        that row's status and instance everywhere (the Restoration panel reads the same row)."""
        b = self.board
        chips, rows = [], []
        order = {"active": 0, "standby": 1, "warmup": 2}
        replicas_of: dict = {}
        for rep in b.replicas.values():
            replicas_of.setdefault(rep.task, []).append(rep)
        for t in sorted(set(b.tasks) | set(replicas_of), key=task_order):
            f = b.tasks.get(t)
            if f is None:
                continue
            state, inst = f.state, f.instance
            row = rnd.rows.get(t) if rnd is not None else None
            fraction = None
            if row is not None and not row.final:
                state, inst, fraction = row.status, row.instance, row.fraction
            elif row is not None and row.status == "failed":
                state = "failed"
            names = b.store_names(t)
            lag, unknown = 0, False
            batch = f.last_batch if f.last_batch is not None and f.last_batch >= 0 else None
            for s in names or [None]:
                sf = f.stores.get(s) if s is not None else None
                r = {"task": t, "instance": inst, "role": "active", "state": state, "store": s,
                     "rows": sf.rows if sf else None, "dirty": sf.dirty if sf else None,
                     "checkpoint": sf.checkpoint if sf else None, "changelog_end": sf.end if sf else None,
                     "lag": sf.lag if sf else None, "backlog": f.backlog,
                     "records": f.records, "batch": batch}
                if r["rows"] is None and (t, s) in self.task_rows:
                    r["rows"] = self.task_rows[(t, s)]
                lag += r["lag"] or 0
                unknown = unknown or (r["lag"] is None and s is not None and sf is not None and sf.end is not None)
                rows.append(r)
            for rep in sorted(replicas_of.get(t, ()), key=lambda x: (order.get(x.role, 3), x.instance)):
                for s in names or [None]:
                    pos = rep.positions.get(s) if s is not None else None
                    sf = f.stores.get(s) if s is not None else None
                    rows.append({"task": t, "instance": rep.instance, "role": rep.role, "state": rep.role,
                                 "store": s, "rows": None, "dirty": None, "checkpoint": pos,
                                 "changelog_end": sf.end if sf else None,
                                 "lag": b.replica_lag(rep, s) if s is not None else rep.lag, "backlog": None})
            chips.append({"task": t, "instance": inst, "state": state or "unknown", "lag": lag,
                          # its lag is not known yet (its instance died, no new owner told)
                          "lag_unknown": unknown and state == "queued",
                          "backlog": f.backlog or 0, "fraction": fraction,
                          "records": f.records, "batch": batch})
        return chips, rows

    def _instances(self, chips: list, now: float) -> list:
        """The Instances panel: status, tasks by role (active from the same chips the header
        shows), records/s committed over the last seconds."""
        b = self.board
        latest = max(now, self.instance_rates.latest)
        active: dict = {}
        for c in chips:
            if c["instance"] is not None and c["state"] not in ("closed", "failed"):
                active.setdefault(c["instance"], []).append(c["task"])
        repl: dict = {}
        for rep in b.replicas.values():
            repl.setdefault((rep.instance, rep.role), []).append(rep.task)
        out = []
        for i, f in sorted(b.instances.items()):
            out.append({
                "instance": i, "status": f.status, "incarnation": f.incarnation,
                "active": active.get(i, []) if f.status in LIVE_STATUSES else [],
                "standby": sorted(repl.get((i, "standby"), []), key=task_order),
                "warmup": sorted(repl.get((i, "warmup"), []), key=task_order),
                # what it commits now: nothing once it is dead, stopped or gone (its last commits
                # are not "now"; the header, their sum, reads 0 for a stopped app)
                "rate": (self.instance_rates.rate(i, latest) if f.status in LIVE_STATUSES else 0.0)
                if self.has_events else None,
            })
        return out

    def _header(self, state: str, chips: list, tasks: list, instances: list, alive: int) -> dict:
        """The header's figures, each the total of what a panel of the same picture shows: store
        rows and lag of the Tasks tab (a queued task's lag included), records and batches of the
        tasks' commits, the committed rate of the Instances panel. An app without events (Spark's
        own state store) has only the engine's metrics."""
        m = self.metrics or {}

        def pick(*names):
            for n in names:
                if m.get(n) is not None:
                    return num(m[n], m[n])
            return None

        stopped = state in ("NOT_RUNNING", "ERROR", "PENDING_SHUTDOWN")
        if self.has_events:
            rates = [r["rate"] for r in instances if r["rate"] is not None]
            rate = sum(rates) if rates else None
            processed = sum(c["records"] or 0 for c in chips)
            batches = [c["batch"] for c in chips if c["batch"] is not None]
            batch = max(batches) if batches else None
            # the engine's last micro-batch time, only beside the batch it timed
            batch_ms = pick("last_batch_latency_ms") if batch is not None and pick("last_batch_id") == batch else None
        else:
            rate = self.input.rate
            if rate is None:
                rate = pick("input_rate")
            if stopped and rate is not None:
                rate = 0.0                        # stopped or failed: nothing comes in
            processed = pick("records_processed")
            if not processed and self.board.committed_records:
                processed = self.board.committed_records
            batch, batch_ms = pick("last_batch_id"), pick("last_batch_latency_ms")
        active = [r for r in tasks if r["role"] == "active"]
        rows = [r["rows"] for r in active if r["rows"] is not None]
        return {
            "state": state, "reason": "", "input_rate": rate, "records": processed,
            "batch_ms": batch_ms, "batch_id": batch,
            "rows": sum(rows) if rows else None,
            "lag": sum(r["lag"] or 0 for r in active),
            # queued tasks whose lag is not known yet (no new owner told): the lag is at least that
            "lag_unknown": sum(bool(c.get("lag_unknown")) for c in chips),
            "instances": (alive, len(instances)) if instances else None,
            # the newest of the metrics' (polled) and the events' (a rebalance the poll has not seen)
            "generation": max((g for g in (pick("generation"), self.board.generation) if g is not None),
                              default=None),
            # Spark's state operator figures (the native engine reports them; the changelog engine not)
            "state_rows": pick("state_rows"), "state_memory_bytes": pick("state_memory_bytes"),
            "commit_ms": pick("commit_ms"), "error": self.panel_error,
        }

    def _reason(self, pic: Picture) -> str:
        """One line on the badge: why the app is in its state (the error, what it waits for)."""
        state = pic.state
        if state == "ERROR":
            return short_error(pic.app_error or self.last_error or self.board.state_reason or "failed")
        rnd = pic.round
        if rnd is not None and not rnd.final:
            rows = list(rnd.rows.values())
            restoring = sum(r.status == "restoring" for r in rows)
            queued = sum(r.status == "queued" for r in rows)
            parts = []
            if restoring:
                parts.append(f"restoring {restoring} task(s)")
            if queued:
                parts.append(f"{queued} queued")
            if parts:
                return ", ".join(parts)
        if state == "WAITING":
            return (self.waiting or {}).get("line") or "waiting for Kafka"
        if state == "REBALANCING" and self.last_rebalance is not None:
            e = self.last_rebalance
            moves = e.moves or []
            what = f": moving {', '.join(str(mv.get('task')) for mv in moves[:4])}" if moves else ""
            return f"generation {e.generation if e.generation is not None else '?'} ({e.reason}){what}"
        if state in LIVE_STATES and self.metrics.get("batches") == 0:
            since = self.started_at or self.t0
            secs = f"running {pic.t - since:.0f} s; " if since is not None and pic.t - since >= 1 else ""
            got = f"{fmt_num(d)} records committed so far" if (d := self.board.committed_records) else "no commit yet"
            ran = pic.header.get("batch_id") is not None   # the tasks committed part of it: it runs
            return f"{'the first micro-batch is not over' if ran else 'waiting for the first micro-batch'} ({secs}{got})"
        if state == "RESTORING":
            return self.board.state_reason or "opening tasks"
        if state == "NOT_RUNNING":
            return "stopped"
        return ""

    def _store_view(self, store, tasks):
        rows = self.stores.get(store) if store else None
        held = sum(r["rows"] or 0 for r in tasks if r["role"] == "active" and r["store"] == store)
        if rows is None:
            return [], 0, held, 0, [], []
        d = self.diffs.get(store, Diff())
        times = self.last_change.get(store, {})
        flt = self.key_filter.strip().lower()
        items = rows.items() if not flt else [(k, v) for k, v in rows.items() if flt in str(k).lower()]
        if self.sort_by == "recency":
            def order(kv):
                return (-(times.get(kv[0]) or 0), str(kv[0]))
        elif self.sort_by == "key":
            def order(kv):
                return str(kv[0])
        else:
            def order(kv):
                sv = _sort_value(kv[1])
                return (sv is None, -(sv or 0), str(kv[0]))

        # the top k without sorting the whole store (same result as sorted(...)[:k])
        top = heapq.nsmallest(self.top_k, items, key=order)
        marks = self.store_marks.get(store) or {}
        late, of_key = marks.get("tasks") or {}, marks.get("keys") or {}
        out = [StoreRow(k, v, "new" if k in d.added else "changed" if k in d.changed else None, times.get(k),
                        _behind(late.get(of_key.get(k))))
               for k, v in top]
        shown = {r.key for r in out}
        hidden = sorted(d.touched - shown, key=str)
        stale = [late[t]["line"] for t in sorted(late, key=task_order)]
        return out, len(rows), held, len(d.touched), hidden, stale

    def _changelog_rows(self, tasks: list) -> list[dict]:
        """Per changelog partition: records in the log, live keys, dirty ratio, cleaner runs."""
        from statekit.contracts import changelog_topic

        live = {}
        for r in tasks:
            if r["role"] == "active" and r["task"] is not None and r["rows"] is not None:
                live[(r["store"], r["task"])] = r["rows"]
        names = sorted(set(self.stores) | set(self.board.stores()))
        by_topic = {changelog_topic(self.name, n): n for n in names} if self.name else {}
        out = []
        for c in self.changelog:
            topic, part = c.get("topic"), num(c.get("partition"))
            store = c.get("store") or by_topic.get(topic)
            if store is None and topic:
                # an app name not known here: the longest store name whose changelog it could be
                for n in sorted(names, key=len, reverse=True):
                    if topic == changelog_topic(topic[: len(topic) - len(changelog_topic("", n))], n):
                        store = n
                        break
            records = num(c.get("records"))
            if records is None and c.get("high_watermark") is not None:
                records = num(c.get("high_watermark")) - (num(c.get("log_start_offset")) or 0)
            keys = None
            for (st, t), n in live.items():  # the task that owns partition `part`
                if st == store and t is not None and t.endswith(f"_{part}"):
                    keys = (keys or 0) + n
            out.append({
                "topic": topic, "partition": part, "store": store,
                "log_start": num(c.get("log_start_offset")), "end": num(c.get("high_watermark", c.get("end_offset"))),
                "records": records, "live_keys": num(c.get("live_keys"), keys),
                "dirty_ratio": num(c.get("dirty_ratio")), "cleaner_runs": num(c.get("cleaner_runs")),
                "records_removed": num(c.get("records_removed")), "segments": num(c.get("segments")),
                "bytes": num(c.get("bytes")),
            })
        out.sort(key=lambda r: (r["topic"] or "", r["partition"] or 0))
        return out

    # -- reading (one picture each: tests, the benchmark and `make demo` read these) ---------

    def header(self) -> dict:
        return self.picture().header

    def badge_reason(self) -> str:
        return self.picture().reason

    def tasks(self) -> list[dict]:
        return self.picture().tasks

    def task_chips(self) -> list[dict]:
        return self.picture().chips

    def instance_rows(self) -> list[dict]:
        return self.picture().instances

    def store_names(self) -> list[str]:
        return sorted(self.stores)

    def store_rows(self, store: str | None = None) -> list[StoreRow]:
        """Top-k rows of a store after the key filter, by value, recency or key."""
        if store is not None and store != self.store:
            keep, self.store = self.store, store
            try:
                return self.picture().store_rows
            finally:
                self.store = keep
        return self.picture().store_rows

    def changed_count(self, store: str | None = None) -> int:
        d = self.diffs.get(store or self.store or "")
        return len(d.touched) if d else 0

    def lag_series(self, standby: bool = False) -> dict[str, tuple[list[float], list[float]]]:
        """task -> (seconds since the first refresh, lag) for the lag-over-time chart."""
        p = self.picture()
        return p.standby_lag if standby else p.lag

    def chart_markers(self) -> list[tuple[float, str, str]]:
        return self.picture().markers

    def round_forecast(self, rnd=None):
        """(time, forecast) made before `rnd` (default: the current round) began."""
        rnd = rnd or self.restores.current
        if rnd is None or rnd.forecast is None:
            return None
        return (getattr(rnd, "forecast_at", None), rnd.forecast)

    def changelog_rows(self) -> list[dict]:
        return self.picture().changelog


# what two panels of one picture say differently (kept here: the model's public API)
from kernel_ext.dashboard.invariants import disagreements  # noqa: E402,F401
