"""Where the dashboard's model gets its facts: the app's events, pushed as they happen
(`EventFeed`), and what only asking the app tells (`collect`, run by a `Poller` thread).

Asking is kept off the refresh path and bounded: the light figures (state, metrics, instances, task
status) once a second; `App.lag()` (which asks every instance) only while replicas exist or the
Tasks tab shows, else every few seconds; a store's contents only while its tab shows and after one
of its tasks committed, at most `max_rows` of it (`App.query_all(limit_per_task=...)`: a million-key
store is not read whole), from the freshest copy of each task at once (`stale=True`), the rows of a
task whose copy is behind its changelog marked (`store_marks`) and read again at every poll; the
changelog figures only while their tab shows, every few seconds; the restore forecast the latest
one made (`statekit.runtime.forecasts.latest`: the figure a notebook cell printed), else one made
here, when something changed, never during a restore.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Iterable

from kernel_ext.dashboard.forecast import forecast_data
from kernel_ext.dashboard.formats import clip, records, task_id
from kernel_ext.dashboard.model import LIVE_STATES, DashboardModel, Snapshot, normalize_task

ALL_PANELS = frozenset({"tasks", "store", "changelog", "timeline", "topology", "history", "events"})


class EventFeed:
    """Applies the app's events to the model the moment they arrive, oldest first, each once (by
    its offset in the events topic): pushed by `app.on_event` from the app's event reader, with the
    history since start read once from `app.events()`. `wake()` is called after an event a picture
    must show at once (a crash, a state change, a restore's start or end). `close()` stops applying
    (a stopped dashboard); `resume()` reads the history again, so a dashboard that comes back misses
    nothing. Apps without `on_event` are read with `poll()`."""

    def __init__(self, app, model: DashboardModel, wake: Callable[[], None] | None = None):
        self.app = app
        self.model = model
        self.wake = wake
        self._lock = threading.Lock()
        self._pending: deque = deque(maxlen=50_000)
        self._last = -1
        self._closed = True
        self.applied = 0
        self.cpu_s = 0.0                           # CPU time spent applying events (the reader's thread)
        self.delays: deque = deque(maxlen=2000)   # seconds from an event's ts to its application
        on = getattr(app, "on_event", None)
        self.push = callable(on)
        if self.push:
            on(self._on_event)

    def _on_event(self, e) -> None:
        if self._closed:
            return
        with self._lock:
            if self._closed:
                return
            if self._pending is not None and self._reading:
                self._pending.append(e)
                return
            self._apply(e)

    _reading = False

    def _apply(self, e) -> None:
        off = getattr(e, "offset", None)
        if off is not None:
            if off <= self._last:
                return
            self._last = off
        c0 = time.thread_time()
        urgent = self.model.apply(e)
        self.cpu_s += time.thread_time() - c0
        self.applied += 1
        ts = getattr(e, "ts", None)
        if ts:
            self.delays.append(time.time() - ts)
        if urgent and self.wake is not None:
            self.wake()

    def _history(self) -> list:
        ev = getattr(self.app, "events", None)
        try:
            return list(ev() or []) if callable(ev) else []
        except Exception:  # an app that cannot list its events yet (not started)
            return []

    def resume(self) -> None:
        """Start (again): the history since start, then every event as it arrives."""
        with self._lock:
            self._closed, self._reading = False, True
        hist = self._history()
        with self._lock:
            got = sorted(hist + list(self._pending), key=lambda e: (getattr(e, "offset", None) is None,
                                                                    getattr(e, "offset", 0) or 0))
            self._pending.clear()
            for e in got:
                self._apply(e)
            self._reading = False

    start = resume

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._pending.clear()

    def poll(self) -> int:
        """Apply what is new (apps that do not push); returns how many events were applied."""
        if self.push and not self._closed:
            return 0
        n = self.applied
        with self._lock:
            for e in self._history():
                self._apply(e)
        return self.applied - n


class StoreCache:
    """Re-reads a store only after a commit. A store's contents only change when one of its tasks
    commits; with events, every commit is a `Committed` event (the signature is their count); without
    them, every commit moves what `signature` looks at: the task's changelog checkpoint (lag table),
    the last completed micro-batch and generation (metrics) or the app state. While the signature of
    a store is the one it was read at, the rows read then are reused (the very same dict, so the
    model knows nothing changed). An unknown signature always reads; `max_age` bounds how long rows
    are reused in any case."""

    def __init__(self, max_age: float = 30.0):
        self.max_age = max_age
        self._read: dict[str, tuple] = {}  # store -> (signature, time read, (rows, per_task))
        self.reads = 0
        self.skips = 0

    @staticmethod
    def signature(name: str, state: str, metrics: dict, tasks: list[dict], commits: int | None = None):
        if commits is not None:
            return (state, metrics.get("generation"), "commits", commits)
        batch = metrics.get("last_batch_id")
        cps = []
        for raw in tasks:
            r = normalize_task(raw)
            if r["store"] != name or r["role"] != "active":
                continue
            cps.append((r["task"], r["instance"], r["checkpoint"]))
        if batch is None and (not cps or any(c[2] is None for c in cps)):
            return None  # nothing tells us when it committed: read every time
        # the generation: batch ids start again after a restart
        return (state, metrics.get("generation"), batch, tuple(sorted(cps, key=repr)))

    def get(self, name: str, sig, now: float):
        """What was read at `sig`, or None when the store must be read again (also when it was
        put with `reuse=False`)."""
        got = self._read.get(name)
        if sig is None or got is None or got[0] != sig or now - got[1] > self.max_age or \
                not got[3]:
            return None
        self.skips += 1
        return got[2]

    def last(self, name: str):
        """The rows read last, whatever their signature (the app stopped: nothing to re-read)."""
        got = self._read.get(name)
        return got[2] if got is not None else None

    def put(self, name: str, sig, now: float, value, reuse: bool = True) -> None:
        self.reads += 1
        self._read[name] = (sig, now, value, reuse)


class Throttled:
    """Calls `fn` at most every `every` seconds; in between, returns its last result (the heavy
    panels: changelog figures scan the broker's log segments)."""

    def __init__(self, fn, every: float = 5.0, clock=time.monotonic):
        self.fn, self.every, self.clock = fn, every, clock
        self._at: float | None = None
        self._last = None
        self.calls = 0

    def __call__(self):
        now = self.clock()
        if self._at is None or now - self._at >= self.every:
            self._at = now  # also on failure: a failing panel is not retried every second
            self.calls += 1
            self._last = self.fn()
        return self._last


def collect(app, stores: Iterable[str] | None = None, max_rows: int = 2000, events=None,
            changelog=None, cache: StoreCache | None = None, forecast=None, lag: bool = True,
            commits: dict | None = None) -> Snapshot:
    """A Snapshot of `app` (a statekit.App or NativeApp). Never raises: a failing part leaves its
    panel empty and says so in `snapshot.error`. With a `cache`, a store is only read again after
    one of its tasks committed (see `StoreCache`; `commits`: store -> commit events seen); while
    the app is not running (ERROR, stopped) the stores are not read and the last rows read stay.
    `changelog` and `forecast` are callables (the caller throttles them); `stores=[]` reads none,
    `lag=False` skips `App.lag()`."""
    snap = Snapshot(t=time.time())
    snap.asked_at = snap.t
    errors = []

    def guard(what, fn):
        try:
            return fn()
        except Exception as err:  # a panel must not kill the dashboard
            errors.append(f"{what}: {clip(err, 200)}")
            return None

    st = guard("state", lambda: app.state)
    snap.state = str(getattr(st, "value", st) or "UNKNOWN")
    if snap.state == "ERROR":
        err = guard("error", lambda: getattr(app, "error", None))
        snap.app_error = clip(err, 400) if err else None
    waiting = snap.state == "WAITING"   # Kafka is away: what needs it would only time out
    if waiting:
        w = guard("waiting", lambda: getattr(app, "waiting", None))
        if w is not None:
            snap.waiting = {"line": str(w), "since": w.since, "aborted": w.aborted,
                            "tasks": list(w.tasks)}
    snap.metrics = guard("metrics", lambda: dict(app.metrics() or {})) or {}
    if lag and not waiting:
        snap.tasks = guard("lag", lambda: records(app.lag())) or []
    if callable(getattr(app, "task_status", None)):
        snap.status = guard("task status", app.task_status) or {}
    if callable(getattr(app, "instances_frame", None)):
        snap.instances = guard("instances", lambda: records(app.instances_frame())) or []
    names = list(stores) if stores is not None else guard("stores", lambda: _store_names(app)) or []
    live = snap.state in LIVE_STATES and not waiting
    for name in names:
        sig = got = None
        if cache is not None:
            sig = StoreCache.signature(name, snap.state, snap.metrics, snap.tasks,
                                       None if commits is None else commits.get(name, 0))
            got = cache.get(name, sig, snap.t) if live else cache.last(name)
        if got is None and live:
            got = guard(f"store {name}", lambda: _read_store(
                app, name, max_rows, cache.last(name) if cache is not None else None))
            if got is not None and cache is not None:
                # rows that are not current are read again at every poll: a restore moves
                # without commits
                cache.put(name, sig, snap.t, got, reuse=not (got[2] or {}).get("tasks"))
        if got is not None:
            snap.stores[name], per_task, snap.store_marks[name] = got
            for t, n in per_task.items():
                snap.task_rows[(t, name)] = n
    snap.has_events = callable(getattr(app, "events", None))
    if events is not None:
        guard("events", events.poll)
    if changelog is not None and not waiting:
        snap.changelog = guard("changelog", changelog) or []
    if forecast is not None and live:
        try:  # optional: a forecast that cannot be made now leaves the panel without one
            snap.forecast = forecast_data(forecast())   # the same dict while a caller caches it
        except Exception:
            snap.forecast = None
    if errors:
        snap.error = "; ".join(errors)
    return snap


def _store_names(app) -> list[str]:
    plan = getattr(app, "plan", None)
    if plan is not None and getattr(plan, "stores", None):
        return [s.name for s in plan.stores]
    d = app.describe()
    stores = d.get("stores") if isinstance(d, dict) else getattr(d, "stores", None)
    if not stores and isinstance(d, dict):
        stores = [n.get("id") for n in d.get("nodes", []) if n.get("type") == "store"]
    names = []
    for s in stores or []:
        names.append(s if isinstance(s, str) else (s.get("name") if isinstance(s, dict) else getattr(s, "name")))
    return [n for n in names if n]


def _read_store(app, name: str, max_rows: int, last=None) -> tuple[dict, dict, dict]:
    """({key: value} for up to max_rows keys, {task: number of keys}, marks) of one store. A store
    of a million keys is not read whole every commit: at most max_rows / tasks rows of each task
    (the first in key order), when the app can (`query_all(limit_per_task=...)`); the per-task
    counts then come from the commits instead.

    The rows come from the freshest copy of each task (`query_all(stale=True)`), never waiting
    for a restore; `marks` says which rows are not current: {"tasks": {task: what its copy is},
    "keys": {key: task}} (see `store_marks`). When a task has no copy at all to read (a lost disk,
    its restore not begun) the rows read `last` stay, that task's marked."""
    from statekit.errors import StaleRead

    limit = None
    kw = {"stale": True} if _accepts(app.query_all, "stale") else {}
    if _accepts(app.query_all, "limit_per_task"):
        limit = max(1, max_rows // max(1, int(getattr(app, "partitions", 1) or 1)))
        kw["limit_per_task"] = limit
    try:
        res = app.query_all(name, **kw)
    except StaleRead as err:
        if last is None:
            raise
        rows, per_task, marks = last
        marks = dict(marks or {})
        marks["tasks"] = dict(marks.get("tasks") or {})
        marks["tasks"][task_id(err.task)] = {"state": err.state, "lag": err.lag,
                                             "line": f"task {err.task}: {err.state}, no copy to "
                                                     f"read; the rows shown are from before"}
        return rows, per_task, marks
    per_task: dict = {}
    if hasattr(res, "to_dict") and hasattr(res, "columns"):
        cols = list(res.columns)
        if "task" in cols:
            per_task = {task_id(t): int(n) for t, n in res["task"].value_counts().items()
                        if limit is None or int(n) < limit}   # a count cut by the limit says nothing
        kcol = "key" if "key" in cols else cols[0]
        vcol = "value" if "value" in cols else cols[-1]
        if "window_start" in cols:
            keys = [_hashable(k) for k in zip(res[kcol].head(max_rows),
                                              res["window_start"].head(max_rows))]
        else:
            keys = [_hashable(k) for k in res[kcol].head(max_rows)]
        marks = store_marks(res, keys)
        return dict(zip(keys, res[vcol].head(max_rows))), per_task, marks
    if isinstance(res, dict):
        return {_hashable(k): v for k, v in list(res.items())[:max_rows]}, per_task, {}
    out = {}
    for i, kv in enumerate(res):
        if i >= max_rows:
            break
        k, v = kv
        out[_hashable(k)] = v
    return out, per_task, {}


def store_marks(res, keys: list) -> dict:
    """Which rows of a `query_all` frame are not current: {"tasks": {task: {state, instance, role,
    lag, lag_s, line}} for the tasks whose copy was behind its changelog (`res.attrs["copies"]`,
    `statekit.runtime.copies.Copy`), "keys": {key: task} for every row read}."""
    copies = (getattr(res, "attrs", None) or {}).get("copies") or {}
    tasks = {task_id(t): {"state": c.state, "instance": c.instance, "role": c.role, "lag": c.lag,
                          "lag_s": c.lag_s, "line": c.summary()}
             for t, c in copies.items() if not c.current}
    by_key = {}
    if "task" in res.columns:
        by_key = {k: task_id(t) for k, t in zip(keys, res["task"].head(len(keys)))}
    return {"tasks": tasks, "keys": by_key}


def _accepts(fn, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _hashable(k):
    if isinstance(k, (list, dict)):
        import json

        return json.dumps(k, sort_keys=True)
    return k


class Poller:
    """Asks `app` what its events do not say, into `model`, from a thread of its own (never the
    refresh's): see the module docstring for what and how often. `visible()` returns the tabs that
    show (`ALL_PANELS` without a view). `poll()` does one round now (tests, `LiveDashboard.refresh`)."""

    def __init__(self, app, model: DashboardModel, stores: list[str] | None = None, max_rows: int = 2000,
                 changelog_fn: Callable | None = None, forecast_fn: Callable | None = None,
                 interval: float = 1.0, heavy_interval: float = 5.0,
                 visible: Callable[[], set] | None = None, feed: EventFeed | None = None):
        self.app, self.model = app, model
        self.stores, self.max_rows = stores, max_rows
        self.changelog_fn, self.forecast_fn = changelog_fn, forecast_fn
        self.interval, self.heavy_interval = interval, heavy_interval
        self.visible = visible or (lambda: ALL_PANELS)
        self.feed = feed
        self.cache = StoreCache()
        self._lag_at = self._changelog_at = None
        self._fc_seen = None            # (forecast object, its plain data)
        self._fc_made = None            # the latest forecast made here
        self._fc_busy = False
        self._fc_thread: threading.Thread | None = None   # the forecast being made, if any
        self._fc_sig = None             # what the last forecast made here was made on
        self._fc_at = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0
        self.times: deque = deque(maxlen=2000)   # seconds per poll (wall)
        self.cpu_s = 0.0

    # -- one round ---------------------------------------------------------------------------

    def _due(self, at, every, now) -> bool:
        return at is None or now - at >= every

    def poll(self, force: bool = False, final: bool = False) -> Snapshot:
        """One round; ``final``: the last before the app stops (see `_recount`)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        now = time.monotonic()
        vis = self.visible()
        m = self.model
        has_events = getattr(self.feed, "push", False) or callable(getattr(self.app, "events", None))
        replicas = bool(m.board.replicas)
        lag_every = self.interval if not has_events else (
            2.0 if (replicas or "tasks" in vis) else 4 * self.heavy_interval)
        do_lag = force or self._due(self._lag_at, lag_every, now)
        do_changelog = self.changelog_fn is not None and (force or (
            "changelog" in vis and self._due(self._changelog_at, self.heavy_interval, now)))
        stores = self.stores if (force or "store" in vis) else []
        with m.lock:
            commits = dict(m.store_commits) if has_events and m.commits else None
        snap = collect(self.app, stores=stores, max_rows=self.max_rows,
                       events=self.feed if (self.feed is not None and not self.feed.push) else None,
                       changelog=self.changelog_fn if do_changelog else None, cache=self.cache,
                       forecast=None, lag=do_lag,
                       commits=commits)
        if do_lag:
            self._lag_at = now
        if do_changelog:
            self._changelog_at = now
        if final:
            self._recount(snap)
        snap.forecast = self._forecast(snap, force)
        m.absorb(snap)
        self.polls += 1
        self.times.append(time.perf_counter() - t0)
        self.cpu_s += time.thread_time() - c0
        return snap

    def _forecast(self, snap: Snapshot, force: bool):
        """The latest forecast made for the app (a notebook cell's), else one made here when
        something changed since the last (commits, the generation) and none is recent; never
        during a restore. Made in a thread of its own (a first one calibrates: a second or more),
        so the light polls go on meanwhile; `force` waits for it up to `FORCE_WAIT_S`."""
        if not self._can_forecast(snap):
            return None
        from statekit.runtime import forecasts

        name = getattr(self.app, "name", None)
        m = self.model
        sig = (m.board.generation, m.commits)
        now = time.monotonic()
        latest = forecasts.latest(name) if isinstance(name, str) else None
        stale = latest is None or time.time() - getattr(latest, "made_at", 0) >= self.heavy_interval
        # (never beside one being made: a cell's, whose figure it prints, must stay the latest)
        if (stale and not m.restoring and sig != self._fc_sig and not self._fc_busy
                and not (isinstance(name, str) and forecasts.in_flight(name))
                and not self._stop.is_set() and (force or self._due(self._fc_at, self.heavy_interval, now))):
            self._fc_sig, self._fc_at = sig, now
            # (a refresh in a cell waits a moment for it, not for a calibration)
            self._start_forecast("forecast", self.FORCE_WAIT_S if force else 0.0)
        made = [f for f in (latest, self._fc_made, self._fc_seen[0] if self._fc_seen else None) if f is not None]
        if not made:
            return None
        fc = max(made, key=lambda f: getattr(f, "made_at", 0))
        if self._fc_seen is None or self._fc_seen[0] is not fc:
            self._fc_seen = (fc, forecast_data(fc))
        return self._fc_seen[1]

    FORCE_WAIT_S = 1.0
    FINAL_WAIT_S = 3.0

    def _recount(self, snap: Snapshot) -> None:
        """Before the app stops, when the forecast shown predates its last commit: the records
        counted again, at that forecast's rate (no calibration while the app stops), so the panel
        left on the page does not say fewer records than the changelogs hold."""
        m = self.model
        with m.lock:
            shown, at, committed = m.forecast, m.forecast_at, m.committed_at
        if (not self._can_forecast(snap) or shown is None or committed is None or (at or 0) >= committed
                or self._fc_busy):
            return
        rated = [r for r in shown.get("rows") or () if r.get("apply_rate")]
        if not rated:
            return
        self._start_forecast("recount", self.FINAL_WAIT_S, apply_rate=float(rated[0]["apply_rate"]),
                             rate_source=rated[0].get("rate_source") or "given")

    def _can_forecast(self, snap: Snapshot) -> bool:
        return self.forecast_fn is not None and snap.state in LIVE_STATES and snap.state != "WAITING"

    def _start_forecast(self, kind: str, wait: float, **given) -> None:
        """`_make_forecast(**given)` in a thread of its own (at most one: `_fc_busy`), waited for
        up to `wait` seconds."""
        self._fc_busy = True
        th = self._fc_thread = threading.Thread(
            target=self._make_forecast, kwargs=given, daemon=True,
            name=f"statekit-dashboard-{kind}-{getattr(self.app, 'name', 'app')}")
        th.start()
        if wait > 0:
            th.join(wait)

    def _make_forecast(self, **given) -> None:
        try:
            got = self.forecast_fn(**given)
            if got is not None:
                self._fc_made = got
        except Exception:  # no forecast now: the panel keeps the last one, and it is tried again
            self._fc_sig = None   # at the next round, not only after the next commit (an idle app
        finally:                  # kept a forecast of its first commits for good)
            self._fc_busy = False

    # -- the thread --------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.poll()
            except Exception:  # a poll that failed is tried again at the next round
                pass
            self._stop.wait(max(0.05, self.interval - (time.monotonic() - started)))

    def start(self) -> "Poller":
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name=f"statekit-dashboard-poll-{getattr(self.app, 'name', 'app')}")
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling, and wait up to `timeout` for the poll and a forecast being made to end (a
        calibration stuck in the app ends when the app stops: its Kafka client is closed)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for th in (self._thread, self._fc_thread):
            if th is not None and th is not threading.current_thread():
                th.join(max(0.0, deadline - time.monotonic()))
