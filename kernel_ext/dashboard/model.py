"""The dashboard's data model: pure Python, no widgets, no IPython.

`collect(app, ...)` takes a `Snapshot` of a running app (state, metrics, the lag table, task and
instance status, store contents, new typed events from `statekit.events`, changelog figures, the
restore forecast). `DashboardModel.update(snapshot)` turns a stream of snapshots into what the panels
show: the badge and its reason, the input rate, rows changed since the last refresh, lag history per
task with markers, the restore rounds (`restore.RestoreBoard`), the ownership timeline and
per-instance rates (`membership`), changelog compaction figures, and a column layout of the topology.
"""
from __future__ import annotations

import heapq
import math
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from kernel_ext.dashboard.membership import InstanceRates, OwnershipTimeline
from kernel_ext.dashboard.restore import RestoreBoard, _get, _type

# ---------------------------------------------------------------------------------------------
# snapshots


@dataclass
class Snapshot:
    """What the dashboard knows about an app at one instant (plain data and typed events)."""

    t: float
    state: str = "UNKNOWN"
    app_error: str | None = None        # the app's one-line error (state ERROR)
    metrics: dict = field(default_factory=dict)
    tasks: list[dict] = field(default_factory=list)     # App.lag() rows
    status: dict = field(default_factory=dict)          # App.task_status(): task -> {...}
    instances: list[dict] = field(default_factory=list)  # App.instances_frame() rows
    stores: dict[str, dict] = field(default_factory=dict)  # store -> {key: value}
    events: list = field(default_factory=list)  # new statekit.events records since the last snapshot
    changelog: list[dict] = field(default_factory=list)  # one dict per changelog partition
    task_rows: dict = field(default_factory=dict)  # (task, store) -> keys, counted from the store read
    forecast: dict | None = None  # App.restore_forecast() as forecast_data() (None: not asked, not there)
    has_events: bool = True  # the app publishes statekit.events (Spark's own state store does not)
    error: str | None = None  # a panel that could not be read (one line)


def _num(x, default=None):
    if x is None:
        return default
    try:
        f = float(x)
    except (TypeError, ValueError):
        return default
    if math.isnan(f):
        return default
    return int(f) if f.is_integer() else f


def task_id(x) -> str | None:
    """Any spelling of a task ("0_3", 3, (0, 3), TaskId) as Kafka Streams' "0_3"."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    from statekit.contracts import TaskId

    try:
        return str(TaskId.parse(int(x) if isinstance(x, float) else x))
    except (ValueError, TypeError):
        return str(x)


def task_order(t) -> tuple:
    from statekit.contracts import TaskId

    try:
        return (0, TaskId.parse(t))
    except (ValueError, TypeError):
        return (1, (0, 0), str(t))


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
        out[k] = _num(out[k])
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


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1:
        return "<1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def fmt_secs(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 100:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s"


def fmt_num(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:,.2f}".rstrip("0").rstrip(".")
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def fmt_rate(x) -> str:
    if x is None:
        return "–"
    if x >= 10_000:
        return f"{x / 1000:,.0f}k/s"
    return f"{x:,.0f}/s"


def clip(text, n: int) -> str:
    """At most `n` characters of one line of text (raw, before any HTML escaping: an escaped entity is
    never cut), with an ellipsis when shortened."""
    s = " ".join(str(text).split())
    return s if len(s) <= n else s[: max(0, n - 1)].rstrip() + "…"


_EXC_RE = re.compile(r"\b[A-Z][A-Za-z0-9_]*(?:Error|Exception|Interrupt|Exit)\b: .*$")
_STEP_RE = re.compile(r"\(([a-z][a-z -]{1,40})\) failed")


def short_error(text: str) -> str:
    """The part of a one-line error a badge can show: "map values failed: ZeroDivisionError:
    division by zero" for a user function's error (the whole line stays on the error strip)."""
    text = " ".join(str(text).split())
    m = _EXC_RE.search(text)
    if not m or m.start() == 0:
        return text
    step = _STEP_RE.search(text[: m.start()])
    return f"{step.group(1)} failed: {m.group(0)}" if step else m.group(0)


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


def as_event(e):
    """A typed `statekit.events` record (a dict from an older reader is converted)."""
    if isinstance(e, dict):
        from statekit.events import from_dict

        return from_dict(e)
    return e


def layout_topology(nodes: Iterable[dict], edges: Iterable[tuple]) -> dict[str, tuple[float, float]]:
    """Place nodes in columns: sources → processors → stores → changelogs → sinks.

    `nodes`: dicts with "id" and "kind" ("source", "processor", "store", "changelog", "sink", or
    anything else, treated as a processor). `edges`: (from_id, to_id). Processors are spread over
    several columns by their longest path from a source. Returns id -> (x, y), x = column index,
    y in [0, 1] (top to bottom)."""
    nodes = list(nodes)
    edges = [(e[0], e[1]) for e in edges]
    kinds = {n["id"]: (n.get("kind") or "processor") for n in nodes}
    succ: dict[str, list[str]] = {n: [] for n in kinds}
    pred: dict[str, list[str]] = {n: [] for n in kinds}
    for a, b in edges:
        if a in kinds and b in kinds:
            succ[a].append(b)
            pred[b].append(a)
    # depth of each processor = longest path from a source through processors
    depth: dict[str, int] = {}

    def proc_depth(n, seen=()):
        if n in depth:
            return depth[n]
        ps = [p for p in pred[n] if kinds[p] not in ("source",) and p not in seen and kinds[p] not in ("store", "changelog")]
        d = 0 if not ps else 1 + max(proc_depth(p, seen + (n,)) for p in ps)
        depth[n] = d
        return d

    proc_cols = 1
    for n, k in kinds.items():
        if k not in ("source", "store", "changelog", "sink"):
            proc_cols = max(proc_cols, proc_depth(n) + 1)
    col: dict[str, int] = {}
    for n, k in kinds.items():
        if k == "source":
            col[n] = 0
        elif k == "store":
            col[n] = 1 + proc_cols
        elif k == "changelog":
            col[n] = 2 + proc_cols
        elif k == "sink":
            col[n] = 3 + proc_cols
        else:
            col[n] = 1 + depth.get(n, 0)
    # drop empty columns so the drawing stays compact
    used = sorted(set(col.values()))
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
# the restore forecast (App.restore_forecast(): one row per task and way back, a line per instance)


def forecast_data(obj) -> dict | None:
    """`App.restore_forecast()`'s result as plain data: ``{"rows": [{task, instance, source, records,
    seconds, ...}], "lines": {instance: "if instance 0 died now: ..."}}``."""
    if obj is None:
        return None
    if isinstance(obj, dict) and "rows" in obj:
        return obj
    frame = getattr(obj, "frame", obj)
    lines = getattr(obj, "lines", None) or {}
    return {"rows": _records(frame), "lines": {int(k): str(v) for k, v in dict(lines).items()}}


def forecast_seconds(fc: dict | None, task: str, source: str, records: int | None = None) -> float | None:
    """The forecast seconds of `task` restoring from `source` (scratch, checkpoint, standby, warmup).
    With `records` (what the restore really had to read): None when the forecast counted none of
    them (it was made before they were written) rather than a forecast of nothing."""
    best = None
    for r in (fc or {}).get("rows") or []:
        if task_id(r.get("task")) == task and r.get("source") == source:
            sec = _num(r.get("seconds"))
            if records and not _num(r.get("records")):
                continue
            if sec is not None and (best is None or sec < best):
                best = sec
    return best


def forecast_by_instance(fc: dict | None) -> list[dict]:
    """Per instance, what a restore of its active tasks would take if it died now: ``{"instance",
    "tasks", "scratch_s", "standby_s", "line"}`` (standby_s: its tasks with a replica, each at its
    best replica; None when none has one)."""
    out: dict = {}
    promo: dict = {}
    for r in (fc or {}).get("rows") or []:
        inst = _num(r.get("instance"))
        if inst is None:
            continue
        o = out.setdefault(inst, {"instance": inst, "tasks": [], "scratch_s": 0.0, "standby_s": None,
                                  "line": ((fc or {}).get("lines") or {}).get(inst)})
        t = task_id(r.get("task"))
        if t not in o["tasks"]:
            o["tasks"].append(t)
        sec = _num(r.get("seconds")) or 0.0
        if r.get("source") == "scratch":
            o["scratch_s"] += sec
        elif r.get("source") in ("standby", "warmup"):
            key = (inst, t)
            promo[key] = min(sec, promo.get(key, sec))
    for (inst, _t), sec in promo.items():
        out[inst]["standby_s"] = (out[inst]["standby_s"] or 0.0) + sec
    return [out[i] for i in sorted(out)]


# ---------------------------------------------------------------------------------------------
# the model


@dataclass
class StoreRow:
    key: Any
    value: Any
    status: str | None  # "new" | "changed" | None
    last_change: float | None


@dataclass
class ChartMarker:
    t: float
    kind: str   # crash | restart | restored | rebalance | join | revive | leave
    label: str = ""


LIVE_STATES = ("RESTORING", "REBALANCING", "RUNNING")
NOISY_EVENTS = ("commit", "restore_batch", "batch_spooled")


class DashboardModel:
    """Feed snapshots with `update`; read what to draw from the properties and methods."""

    def __init__(self, top_k: int = 15, history_points: int = 600, sort_by: str = "value",
                 rate_window: float = 5.0):
        self.top_k = top_k
        self.sort_by = sort_by  # "value" | "recency" | "key"
        self.key_filter = ""
        self.store: str | None = None  # the store shown in the contents panel
        self.snapshot: Snapshot | None = None
        self.previous: Snapshot | None = None
        self.refreshes = 0
        self.lag_history: dict[str, deque] = {}
        self.standby_lag_history: dict[str, deque] = {}
        self._history_points = history_points
        self.diffs: dict[str, Diff] = {}
        self.last_change: dict[str, dict] = {}  # store -> key -> time of its last change
        self.restores = RestoreBoard()
        self.ownership = OwnershipTimeline()
        self.instance_rates = InstanceRates(rate_window)
        self.input = CounterRate(rate_window)
        self.events: deque = deque(maxlen=200)   # the latest non-noisy events (Events tab)
        self.markers: deque = deque(maxlen=60)   # lag chart markers
        self.task_info: dict[tuple, dict] = {}   # (task, store) -> rows, dirty from commit events
        self.state_changes: list[tuple[float, str]] = []
        self.last_rebalance = None               # the latest Rebalance event
        self.failed_tasks: dict = {}             # task -> its TaskFailed error, until it opens again
        self.state_reason = ""                   # the reason of the latest state event
        self.last_error: str | None = None       # the app's last one-line error (kept after restart)
        self.forecast: dict | None = None
        self.forecast_at: float | None = None
        self.round_forecasts: dict[int, tuple] = {}  # id(round) -> (time, forecast) made before it
        self.t0: float | None = None
        self._round_done_seen: set = set()

    # -- feeding ------------------------------------------------------------------------------

    def update(self, snap: Snapshot) -> "DashboardModel":
        if self.t0 is None:  # the charts' time origin: the first refresh, or the first event before it
            self.t0 = min([snap.t] + [float(_get(e, "ts", snap.t) or snap.t) for e in snap.events])
        snap.tasks = [normalize_task(r) for r in snap.tasks]
        self.previous, self.snapshot = self.snapshot, snap
        self.refreshes += 1
        if self.previous is None or self.previous.state != snap.state:
            self.state_changes.append((snap.t, snap.state))
        if snap.app_error:
            self.last_error = snap.app_error
        self.input.add(snap.t, _num(snap.metrics.get("records_processed")))
        self._update_stores(snap)
        for e in snap.events:
            self._on_event(e)
        if snap.forecast is not None and snap.forecast is not self.forecast and not self.restores.restoring:
            self.forecast, self.forecast_at = snap.forecast, snap.t  # after a round opened: not its own
        self._update_lag(snap)
        for r in snap.tasks:
            info = self.task_info.get((r["task"], r["store"]))
            if r["role"] == "active":
                if r["rows"] is None and (r["task"], r["store"]) in snap.task_rows:
                    r["rows"] = snap.task_rows[(r["task"], r["store"])]
                if info:
                    if r["rows"] is None:
                        r["rows"] = info["rows"]
                    if r["dirty"] is None:
                        r["dirty"] = info["dirty"]
        return self

    def _update_stores(self, snap: Snapshot) -> None:
        for store, rows in snap.stores.items():
            before = self.previous.stores.get(store) if self.previous else None
            if before is None or before is rows:  # first sight, or not re-read (no commit since)
                d = Diff()
            else:
                d = diff_rows(before, rows)
            self.diffs[store] = d
            times = self.last_change.setdefault(store, {})
            for k in d.touched:
                times[k] = snap.t
            for k in d.removed:
                times.pop(k, None)
        if self.store is None and snap.stores:
            self.store = sorted(snap.stores)[0]

    def _update_lag(self, snap: Snapshot) -> None:
        seen: dict = {}
        for r in snap.tasks:
            if r["task"] is None or r["lag"] is None:
                continue
            hist = self.lag_history if r["role"] == "active" else self.standby_lag_history
            key = (id(hist), r["task"])
            seen[key] = seen.get(key, 0) + r["lag"]  # several stores: sum per task
        for (hid, task), lag in seen.items():
            hist = self.lag_history if hid == id(self.lag_history) else self.standby_lag_history
            hist.setdefault(task, deque(maxlen=self._history_points)).append((snap.t, lag))

    def _on_event(self, e) -> None:
        e = as_event(e)
        kind = _type(e)
        ts = float(_get(e, "ts", 0.0) or 0.0)
        if kind not in NOISY_EVENTS:
            self.events.append(e)
        if kind == "commit":
            self.instance_rates.feed(e)
            rows = _get(e, "rows", {}) or {}
            cache = _get(e, "cache", {}) or {}
            task = task_id(_get(e, "task"))
            for store in set(rows) | set(cache):
                c = cache.get(store) or {}
                c = c.get("cache", c) if isinstance(c, dict) else {}
                self.task_info[(task, store)] = {"rows": _num(rows.get(store)),
                                                 "dirty": _num(c.get("dirty")) if isinstance(c, dict) else None}
            return
        if kind == "task_failed":
            self.failed_tasks[task_id(_get(e, "task"))] = _get(e, "error", "")
        elif kind == "task_opened":
            self.failed_tasks.pop(task_id(_get(e, "task")), None)
        opened = self.restores.feed(e)
        if opened is not None and self.forecast is not None:
            self.round_forecasts[id(opened)] = (self.forecast_at, self.forecast)
        self._round_finished(ts)
        self.ownership.feed(e)
        if kind == "state":
            self.state_reason = str(_get(e, "reason", "") or "")
            if _get(e, "reason") == "restart":
                self.markers.append(ChartMarker(ts, "restart", "restart"))
        elif kind == "instance_died":
            self.markers.append(ChartMarker(ts, "crash", f"instance {_get(e, 'instance')} died"))
        elif kind == "rebalance":
            self.last_rebalance = e
            n = len(_get(e, "moves", []) or [])
            if n:
                self.markers.append(ChartMarker(ts, "rebalance", f"g{_get(e, 'generation', '')}: "
                                                                 f"{n} move(s)"))
        elif kind == "instance_started" and _get(e, "reason") in ("add", "revive"):
            self.markers.append(ChartMarker(ts, "join" if _get(e, "reason") == "add" else "revive",
                                            f"instance {_get(e, 'instance')}"))

    def _round_finished(self, ts: float) -> None:
        cur = self.restores.current
        if cur is None or not cur.final or id(cur) in self._round_done_seen:
            return
        self._round_done_seen.add(id(cur))
        s = cur.summary()
        if s is not None and s.restored_tasks:
            self.markers.append(ChartMarker(s.finished, "restored", f"restored in {s.seconds:.1f} s"))

    # -- reading ------------------------------------------------------------------------------

    @property
    def restoring(self) -> bool:
        return self.restores.restoring

    def badge_reason(self) -> str:
        """One line on the badge: why the app is in its state (the error, what it waits for)."""
        s = self.snapshot
        if s is None:
            return ""
        if s.state == "ERROR":
            return short_error(s.app_error or self.last_error or self.state_reason or "failed")
        cur = self.restores.current
        if cur is not None and not cur.final:
            rows = list(cur.rows.values())
            restoring = sum(r.status == "restoring" for r in rows)
            queued = sum(r.status == "queued" for r in rows)
            parts = []
            if restoring:
                parts.append(f"restoring {restoring} task(s)")
            if queued:
                parts.append(f"{queued} queued")
            if parts:
                return ", ".join(parts)
        if s.state == "REBALANCING" and self.last_rebalance is not None:
            e = self.last_rebalance
            moves = _get(e, "moves", []) or []
            what = f": moving {', '.join(str(m.get('task')) for m in moves[:4])}" if moves else ""
            return f"generation {_get(e, 'generation', '?')} ({_get(e, 'reason', '')}){what}"
        if s.state in LIVE_STATES and s.metrics.get("batches") == 0:
            return "waiting for Spark's first micro-batch"
        if s.state == "RESTORING":
            return self.state_reason or "opening tasks"
        if s.state == "NOT_RUNNING":
            return "stopped"
        return ""

    def header(self) -> dict:
        s = self.snapshot or Snapshot(t=time.time())
        m = s.metrics or {}

        def pick(*names):
            for n in names:
                if m.get(n) is not None:
                    return _num(m[n], m[n])
            return None

        live = [r for r in s.instances if str(r.get("status")) in ("alive", "leaving")]
        rate = self.input.rate
        if rate is None:
            rate = pick("input_rate")
        return {
            "state": s.state,
            "reason": self.badge_reason(),
            "input_rate": rate,
            "records": pick("records_processed"),
            "batch_ms": pick("last_batch_latency_ms"),
            "batch_id": pick("last_batch_id"),
            "rows": sum(r["rows"] or 0 for r in s.tasks if r["role"] == "active"),
            "lag": sum(r["lag"] or 0 for r in s.tasks if r["role"] == "active"),
            "instances": (len(live), len(s.instances)) if s.instances else None,
            "generation": pick("generation"),
            # Spark's state operator figures (the native engine reports them; the changelog engine not)
            "state_rows": pick("state_rows"),
            "state_memory_bytes": pick("state_memory_bytes"),
            "commit_ms": pick("commit_ms"),
            "error": s.error,
        }

    def tasks(self) -> list[dict]:
        s = self.snapshot
        if s is None:
            return []
        order = {"active": 0, "standby": 1, "warmup": 2}
        return sorted(s.tasks, key=lambda r: (task_order(r["task"]), order.get(r["role"], 3),
                                              r["store"] or "", r["instance"] or 0))

    def task_chips(self) -> list[dict]:
        """One chip per task for the header: instance, state, restore fraction, backlog."""
        s = self.snapshot
        if s is None:
            return []
        chips: dict = {}
        for r in s.tasks:
            if r["role"] == "active" and r["task"] is not None:
                c = chips.setdefault(r["task"], {"task": r["task"], "instance": r["instance"],
                                                 "state": r.get("state"), "lag": 0, "backlog": 0})
                c["lag"] += r["lag"] or 0
        for t, st in (s.status or {}).items():
            t = task_id(t)
            c = chips.setdefault(t, {"task": t, "instance": None, "state": None, "lag": 0, "backlog": 0})
            c["instance"] = _num(st.get("instance"), c["instance"])
            c["state"] = st.get("state") or c["state"]
            c["backlog"] = _num(st.get("backlog"), 0) or 0
        cur = self.restores.current
        for c in chips.values():
            row = cur.rows.get(c["task"]) if cur is not None else None
            c["fraction"] = row.fraction if row is not None and row.status in ("queued", "restoring") else None
            c["state"] = str(c["state"] or "").lower() or "unknown"
            if c["task"] in self.failed_tasks:   # a batch failed: the task holds until a restart
                c["state"], c["fraction"] = "failed", None
        return [chips[t] for t in sorted(chips, key=task_order)]

    def instance_rows(self) -> list[dict]:
        """The Instances panel: status, tasks by role, records/s committed over the last seconds."""
        s = self.snapshot
        if s is None:
            return []
        now = max(s.t, self.instance_rates.latest)
        out = []
        for r in s.instances:
            inst = _num(r.get("instance"))
            out.append({
                "instance": inst, "status": str(r.get("status") or "?"),
                "incarnation": _num(r.get("incarnation")),
                "active": [str(x) for x in (r.get("active") or [])],
                "standby": [str(x) for x in (r.get("standby") or [])],
                "warmup": [str(x) for x in (r.get("warmup") or [])],
                "rate": self.instance_rates.rate(inst, now) if inst is not None else None,
            })
        return out

    def store_names(self) -> list[str]:
        return sorted(self.snapshot.stores) if self.snapshot else []

    def store_rows(self, store: str | None = None) -> list[StoreRow]:
        """Top-k rows of a store after the key filter, by value, recency or key."""
        store = store or self.store
        if not self.snapshot or store not in self.snapshot.stores:
            return []
        rows = self.snapshot.stores[store]
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
        items = heapq.nsmallest(self.top_k, items, key=order)
        out = []
        for k, v in items:
            status = "new" if k in d.added else "changed" if k in d.changed else None
            out.append(StoreRow(k, v, status, times.get(k)))
        return out

    def changed_count(self, store: str | None = None) -> int:
        d = self.diffs.get(store or self.store or "")
        return len(d.touched) if d else 0

    def lag_series(self, standby: bool = False) -> dict[str, tuple[list[float], list[float]]]:
        """task -> (seconds since the first refresh, lag) for the lag-over-time chart."""
        hist = self.standby_lag_history if standby else self.lag_history
        t0 = self.t0 or 0.0
        return {t: ([p[0] - t0 for p in dq], [p[1] for p in dq])
                for t, dq in sorted(hist.items(), key=lambda kv: task_order(kv[0]))}

    def chart_markers(self) -> list[tuple[float, str, str]]:
        """(seconds since the first refresh, kind, label) of the markers on the lag chart."""
        t0 = self.t0 or 0.0
        return [(m.t - t0, m.kind, m.label) for m in self.markers if m.t >= t0 - 1]

    def round_forecast(self, rnd=None):
        """(time, per-instance forecast) made before `rnd` (default: the current round) began."""
        rnd = rnd or self.restores.current
        return self.round_forecasts.get(id(rnd)) if rnd is not None else None

    def changelog_rows(self) -> list[dict]:
        """Per changelog partition: records in the log, live keys, dirty ratio, cleaner runs."""
        s = self.snapshot
        if s is None:
            return []
        live = {}
        for r in s.tasks:
            if r["role"] == "active" and r["task"] is not None and r["rows"] is not None:
                live[(r["store"], r["task"])] = r["rows"]
        names = self.store_names() or sorted({r["store"] for r in s.tasks if r["store"]})
        out = []
        for c in s.changelog:
            topic, part = c.get("topic"), _num(c.get("partition"))
            store = c.get("store")
            if store is None and topic and topic.endswith("-changelog"):
                # <application>-<store>-changelog: match a store name we know
                for name in sorted(names, key=len, reverse=True):
                    if topic.endswith(f"-{name}-changelog"):
                        store = name
                        break
            records = _num(c.get("records"))
            if records is None and c.get("high_watermark") is not None:
                records = _num(c.get("high_watermark")) - (_num(c.get("log_start_offset")) or 0)
            keys = None
            for (st, t), n in live.items():  # the task that owns partition `part`
                if st == store and t is not None and t.endswith(f"_{part}"):
                    keys = (keys or 0) + n
            out.append({
                "topic": topic, "partition": part, "store": store,
                "log_start": _num(c.get("log_start_offset")), "end": _num(c.get("high_watermark", c.get("end_offset"))),
                "records": records, "live_keys": _num(c.get("live_keys"), keys),
                "dirty_ratio": _num(c.get("dirty_ratio")),
                "cleaner_runs": _num(c.get("cleaner_runs")),
                "records_removed": _num(c.get("records_removed")),
                "segments": _num(c.get("segments")),
                "bytes": _num(c.get("bytes")),
            })
        out.sort(key=lambda r: (r["topic"] or "", r["partition"] or 0))
        return out


# ---------------------------------------------------------------------------------------------
# taking a snapshot of a live app (the only part that calls the library)


def _records(obj) -> list[dict]:
    """A pandas DataFrame, a list of dicts or a dict of dicts -> list of dicts."""
    if obj is None:
        return []
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):
        return obj.to_dict("records")
    if isinstance(obj, dict):
        return [dict(v, task=k) if isinstance(v, dict) else {"task": k, "value": v} for k, v in obj.items()]
    return [dict(r) if not isinstance(r, dict) else r for r in obj]


class EventFeed:
    """The app's new events at each poll, oldest first, each once (by its offset in the events
    topic). Pushed by `app.on_event` when the app has it (no scan of the app's event buffer every
    second), with the history since start read once from `app.events()`; polled otherwise.
    `close()` stops collecting (a stopped dashboard); `resume()` reads the history again, so a
    dashboard that comes back misses nothing."""

    def __init__(self, app, maxlen: int = 50_000):
        import threading

        self.app = app
        self._lock = threading.Lock()
        self._queue: deque = deque(maxlen=maxlen)
        self._last = -1
        self._closed = False
        self._need_history = True
        on = getattr(app, "on_event", None)
        self.push = callable(on)
        if self.push:
            on(self._on_event)

    def _on_event(self, e) -> None:
        if not self._closed:
            with self._lock:
                self._queue.append(e)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._queue.clear()

    def resume(self) -> None:
        self._closed = False
        self._need_history = True

    def poll(self) -> list:
        got = []
        if self._need_history or not self.push:
            ev = getattr(self.app, "events", None)
            got = list(ev() or []) if callable(ev) else []
            self._need_history = False
        with self._lock:
            got.extend(self._queue)
            self._queue.clear()
        got = [as_event(e) for e in got]
        with_offset = sorted((e for e in got if getattr(e, "offset", None) is not None),
                             key=lambda e: e.offset)
        out = []
        for e in with_offset:
            if e.offset > self._last:
                out.append(e)
                self._last = e.offset
        return out


class StoreCache:
    """Re-reads a store only after a commit. A store's contents only change when one of its tasks
    commits, and every commit moves what `signature` looks at: the task's changelog checkpoint
    (lag table), the last completed micro-batch and generation (metrics) or the app state. While the signature of
    a store is the one it was read at, `collect` reuses the rows read then (the very same dict, so
    the model knows nothing changed). An unknown signature (no checkpoint or batch figures) always
    reads; `max_age` bounds how long rows are reused in any case."""

    def __init__(self, max_age: float = 30.0):
        self.max_age = max_age
        self._read: dict[str, tuple] = {}  # store -> (signature, time read, (rows, per_task))
        self.reads = 0
        self.skips = 0

    @staticmethod
    def signature(name: str, state: str, metrics: dict, tasks: list[dict]):
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
        """The (rows, per_task) read at `sig`, or None when the store must be read again."""
        got = self._read.get(name)
        if sig is None or got is None or got[0] != sig or now - got[1] > self.max_age:
            return None
        self.skips += 1
        return got[2]

    def last(self, name: str):
        """The rows read last, whatever their signature (the app stopped: nothing to re-read)."""
        got = self._read.get(name)
        return got[2] if got is not None else None

    def put(self, name: str, sig, now: float, value) -> None:
        self.reads += 1
        self._read[name] = (sig, now, value)


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


def collect(app, stores: Iterable[str] | None = None, max_rows: int = 2000,
            events: EventFeed | None = None, changelog=None, cache: StoreCache | None = None,
            forecast=None) -> Snapshot:
    """A Snapshot of `app` (a statekit.App or NativeApp). Never raises: a failing part leaves its
    panel empty and says so in `snapshot.error`. With a `cache`, a store is only read again after
    one of its tasks committed (see `StoreCache`); while the app is not running (ERROR, stopped) the
    stores are not read and the last rows read stay. `changelog` and `forecast` are callables (the
    caller throttles them)."""
    snap = Snapshot(t=time.time())
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
    snap.metrics = guard("metrics", lambda: dict(app.metrics() or {})) or {}
    snap.tasks = guard("lag", lambda: _records(app.lag())) or []
    if callable(getattr(app, "task_status", None)):
        snap.status = guard("task status", app.task_status) or {}
    if callable(getattr(app, "instances_frame", None)):
        snap.instances = guard("instances", lambda: _records(app.instances_frame())) or []
    names = list(stores) if stores is not None else guard("stores", lambda: _store_names(app)) or []
    live = snap.state in LIVE_STATES
    for name in names:
        sig = got = None
        if cache is not None:
            sig = StoreCache.signature(name, snap.state, snap.metrics, snap.tasks)
            got = cache.get(name, sig, snap.t) if live else cache.last(name)
        if got is None and live:
            got = guard(f"store {name}", lambda: _read_store(app, name, max_rows))
            if got is not None and cache is not None:
                cache.put(name, sig, snap.t, got)
        if got is not None:
            snap.stores[name], per_task = got
            for t, n in per_task.items():
                snap.task_rows[(t, name)] = n
    snap.has_events = callable(getattr(app, "events", None))
    if events is not None:
        snap.events = guard("events", events.poll) or []
    if changelog is not None:
        snap.changelog = guard("changelog", changelog) or []
    if forecast is not None and snap.state in LIVE_STATES:
        try:  # optional: a forecast that cannot be made now leaves the panel without one
            snap.forecast = forecast_data(forecast())   # the same dict while a Throttled caller caches it
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


def _read_store(app, name: str, max_rows: int) -> tuple[dict, dict]:
    """({key: value} for up to max_rows keys, {task: number of keys}) of one store. A store of a
    million keys is not read whole every commit: at most max_rows / tasks rows of each task (the
    first in key order), when the app can (`query_all(limit_per_task=...)`); the per-task counts
    then come from the commits instead."""
    limit = None
    if _accepts(app.query_all, "limit_per_task"):
        limit = max(1, max_rows // max(1, int(getattr(app, "partitions", 1) or 1)))
        res = app.query_all(name, limit_per_task=limit)
    else:
        res = app.query_all(name)
    per_task: dict = {}
    if hasattr(res, "to_dict") and hasattr(res, "columns"):
        cols = list(res.columns)
        if "task" in cols:
            per_task = {task_id(t): int(n) for t, n in res["task"].value_counts().items()
                        if limit is None or int(n) < limit}   # a count cut by the limit says nothing
        kcol = "key" if "key" in cols else cols[0]
        vcol = "value" if "value" in cols else cols[-1]
        if "window_start" in cols:
            keys = list(zip(res[kcol].head(max_rows), res["window_start"].head(max_rows)))
        else:
            keys = list(res[kcol].head(max_rows))
        return {_hashable(k): v for k, v in zip(keys, res[vcol].head(max_rows))}, per_task
    if isinstance(res, dict):
        return {_hashable(k): v for k, v in list(res.items())[:max_rows]}, per_task
    out = {}
    for i, kv in enumerate(res):
        if i >= max_rows:
            break
        k, v = kv
        out[_hashable(k)] = v
    return out, per_task


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
