"""The dashboard's data model: pure Python, no widgets, no IPython.

`collect(app, ...)` takes a `Snapshot` of a running `statekit.App` (state, metrics, the lag table,
store contents, new events, changelog figures). `DashboardModel.update(snapshot)` turns a stream of
snapshots into what the panels show: rows changed since the last refresh, lag history per task,
restore progress with rate and ETA, the restore summary, changelog compaction figures, and a
column layout of the topology graph.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

# ---------------------------------------------------------------------------------------------
# snapshots


@dataclass
class Snapshot:
    """What the dashboard knows about an app at one instant (all plain data)."""

    t: float
    state: str = "UNKNOWN"
    metrics: dict = field(default_factory=dict)
    tasks: list[dict] = field(default_factory=list)
    stores: dict[str, dict] = field(default_factory=dict)  # store -> {key: value}
    events: list[dict] = field(default_factory=list)  # new events since the last snapshot
    changelog: list[dict] = field(default_factory=list)  # one dict per changelog partition
    task_rows: dict = field(default_factory=dict)  # (task, store) -> keys, counted from the store read
    error: str | None = None


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


TASK_FIELDS = ("task", "instance", "role", "store", "rows", "dirty", "checkpoint", "changelog_end",
               "lag", "standby_lag", "state")

# names the runtime may use for each task-table column (first match wins)
_TASK_ALIASES = {
    "task": ("task", "task_id", "partition"),
    "instance": ("instance", "owner", "active_instance"),
    "role": ("role", "kind", "type"),
    "store": ("store", "store_name"),
    "rows": ("rows", "store_rows", "num_rows", "records", "entries", "approximate_num_entries"),
    "dirty": ("dirty", "dirty_entries", "cache_dirty", "dirty_cache_entries"),
    "checkpoint": ("checkpoint", "checkpoint_offset", "committed_offset", "local_offset"),
    "changelog_end": ("changelog_end", "end_offset", "changelog_end_offset", "log_end_offset"),
    "lag": ("lag", "changelog_lag"),
    "standby_lag": ("standby_lag",),
    "state": ("state", "task_state", "status"),
}


def normalize_task(row: dict) -> dict:
    """Map a lag-table row (whatever its column names) onto TASK_FIELDS."""
    out = {}
    for name, aliases in _TASK_ALIASES.items():
        val = None
        for a in aliases:
            if a in row and row[a] is not None and not (isinstance(row[a], float) and math.isnan(row[a])):
                val = row[a]
                break
        out[name] = val
    for k in ("task", "instance", "rows", "dirty", "checkpoint", "changelog_end", "lag", "standby_lag"):
        out[k] = _num(out[k])
    if out["lag"] is None and out["changelog_end"] is not None and out["checkpoint"] is not None:
        out["lag"] = max(0, out["changelog_end"] - out["checkpoint"])
    role = str(out["role"] or "active").lower()
    out["role"] = "standby" if role.startswith("standby") else "active"
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


class RateEstimator:
    """Progress rate over a sliding window of (time, done) samples, and the ETA it implies."""

    def __init__(self, window: float = 5.0):
        self.window = window
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, t: float, done: float) -> None:
        if self.samples and t <= self.samples[-1][0]:
            self.samples[-1] = (self.samples[-1][0], done)
            return
        self.samples.append((t, done))
        while len(self.samples) > 2 and t - self.samples[0][0] > self.window:
            self.samples.popleft()

    @property
    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        if t1 <= t0:
            return None
        return max(0.0, (d1 - d0) / (t1 - t0))

    def eta(self, total: float) -> float | None:
        """Seconds until `done` reaches `total`; 0 when already there, None when unknown."""
        if not self.samples:
            return None
        remaining = total - self.samples[-1][1]
        if remaining <= 0:
            return 0.0
        r = self.rate
        if not r:
            return None
        return remaining / r


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


@dataclass
class RestoreTask:
    task: int
    store: str | None = None
    total: int | None = None  # records (offsets) to replay
    restored: int = 0
    start_offset: int | None = None
    end_offset: int | None = None
    source: str | None = None  # "checkpoint" | "scratch" | "standby"
    started: float | None = None
    finished: float | None = None
    estimator: RateEstimator = field(default_factory=RateEstimator)

    @property
    def done(self) -> bool:
        return self.finished is not None

    @property
    def fraction(self) -> float:
        if self.done:
            return 1.0
        if not self.total:
            return 0.0
        return min(1.0, self.restored / self.total)

    @property
    def rate(self) -> float | None:
        if self.done:
            if self.started is not None and self.finished - self.started >= 0.01:
                return self.restored / (self.finished - self.started)
            return None
        return self.estimator.rate

    @property
    def eta(self) -> float | None:
        if self.done:
            return 0.0
        if self.total is None:
            return None
        return self.estimator.eta(self.total)


@dataclass
class RestoreSummary:
    seconds: float
    records_replayed: int
    offsets_spanned: int
    tasks: int
    from_checkpoint: int
    from_scratch: int
    from_standby: int = 0

    @property
    def saved_by_compaction(self) -> int:
        """Offsets the restore did not have to read because the cleaner had removed them."""
        return max(0, self.offsets_spanned - self.records_replayed)

    def line(self) -> str:
        src = []
        if self.from_checkpoint:
            src.append(f"{self.from_checkpoint} from checkpoint")
        if self.from_scratch:
            src.append(f"{self.from_scratch} from scratch")
        if self.from_standby:
            src.append(f"{self.from_standby} from a standby")
        return (f"restored {self.tasks} task(s) in {self.seconds:.1f} s: {self.records_replayed:,} "
                f"records replayed ({', '.join(src) or 'no source reported'}); compaction saved "
                f"{self.saved_by_compaction:,} records")


def _event_kind(e: dict) -> str:
    k = str(e.get("type") or e.get("event") or e.get("kind") or "").lower().replace("-", "_")
    if "restor" in k:
        if any(w in k for w in ("start", "begin")):
            return "restore_start"
        if any(w in k for w in ("end", "done", "complete", "finish")):
            return "restore_end"
        return "restore_batch"
    if "state" in k:
        return "state"
    return k


def _event_time(e: dict, default: float) -> float:
    for k in ("t", "ts", "time", "timestamp"):
        v = e.get(k)
        if isinstance(v, (int, float)):
            return v / 1000.0 if v > 1e11 else float(v)  # ms or s
    return default


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
# the model


@dataclass
class StoreRow:
    key: Any
    value: Any
    status: str | None  # "new" | "changed" | None
    last_change: float | None


class DashboardModel:
    """Feed snapshots with `update`; read what to draw from the properties."""

    def __init__(self, top_k: int = 15, history_points: int = 600, sort_by: str = "value"):
        self.top_k = top_k
        self.sort_by = sort_by  # "value" | "recency" | "key"
        self.key_filter = ""
        self.store: str | None = None  # the store shown in the contents panel
        self.snapshot: Snapshot | None = None
        self.previous: Snapshot | None = None
        self.refreshes = 0
        self.lag_history: dict[int, deque] = {}
        self.standby_lag_history: dict[int, deque] = {}
        self._history_points = history_points
        self.diffs: dict[str, Diff] = {}
        self.last_change: dict[str, dict] = {}  # store -> key -> time of its last change
        self.restore: dict[int, RestoreTask] = {}
        self.restore_summary: RestoreSummary | None = None
        self._restore_round_started: float | None = None
        self.events: deque = deque(maxlen=200)
        self.task_info: dict[tuple, dict] = {}  # (task, store) -> rows, dirty from commit events
        self.state_changes: list[tuple[float, str]] = []
        self.t0: float | None = None

    # -- feeding ------------------------------------------------------------------------------

    def update(self, snap: Snapshot) -> "DashboardModel":
        if self.t0 is None:
            self.t0 = snap.t
        snap.tasks = [normalize_task(r) for r in snap.tasks]
        self.previous, self.snapshot = self.snapshot, snap
        self.refreshes += 1
        if self.previous is None or self.previous.state != snap.state:
            self.state_changes.append((snap.t, snap.state))
        # changed rows
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
        # lag history (active lag; standby lag separately)
        for r in snap.tasks:
            if r["task"] is None:
                continue
            hist = self.lag_history if r["role"] == "active" else self.standby_lag_history
            lag = r["lag"] if r["role"] == "active" else (r["standby_lag"] if r["standby_lag"] is not None else r["lag"])
            if lag is None:
                continue
            dq = hist.setdefault(r["task"], deque(maxlen=self._history_points))
            if dq and dq[-1][0] == snap.t:
                dq[-1] = (snap.t, dq[-1][1] + lag)  # several stores: sum per task
            else:
                dq.append((snap.t, lag))
        # events: restoration, rows and cache figures of the last commit
        for e in snap.events:
            self.events.append(e)
            self._on_event(e, snap.t)
        for r in snap.tasks:
            if r["role"] == "active" and r["rows"] is None and (r["task"], r["store"]) in snap.task_rows:
                r["rows"] = snap.task_rows[(r["task"], r["store"])]
            info = self.task_info.get((r["task"], r["store"]))
            if info and r["role"] == "active":
                if r["rows"] is None:
                    r["rows"] = info["rows"]
                if r["dirty"] is None:
                    r["dirty"] = info["dirty"]
        self._restore_from_tasks(snap)
        self._maybe_summarize(snap.t)
        return self

    def _new_round(self, t: float) -> None:
        """A restore after the previous one finished: start a fresh set of progress bars."""
        self.restore = {}
        self.restore_summary = None
        self._restore_round_started = t

    def _on_event(self, e: dict, now: float) -> None:
        kind = _event_kind(e)
        task = _num(e.get("task"))
        t = _event_time(e, now)
        if kind == "commit" and task is not None:
            rows = e.get("rows") or {}
            cache = e.get("cache") or {}
            for store in set(rows) | set(cache):
                c = cache.get(store) or {}
                c = c.get("cache", c) if isinstance(c, dict) else {}
                self.task_info[(task, store)] = {"rows": _num(rows.get(store)),
                                                 "dirty": _num(c.get("dirty")) if isinstance(c, dict) else None}
            return
        if task is None or not kind.startswith("restore") or str(e.get("role", "")) == "standby":
            return
        key = (task, e.get("store"))
        rt = self.restore.get(key)
        round_done = bool(self.restore) and all(x.done for x in self.restore.values())
        if kind == "restore_start" or rt is None or rt.done:
            if round_done or (rt is not None and rt.done):
                self._new_round(t)
            if self._restore_round_started is None:
                self._restore_round_started = t
            rt = RestoreTask(task=task, store=e.get("store"), started=t)
            self.restore[key] = rt
        start, end = _num(e.get("start_offset")), _num(e.get("end_offset"))
        if start is not None:
            rt.start_offset = start
        if end is not None:
            rt.end_offset = end
        total = _num(e.get("total"))
        if total is None and rt.start_offset is not None and rt.end_offset is not None:
            total = max(0, rt.end_offset - rt.start_offset)
        if total is None and kind == "restore_batch" and e.get("remaining") is not None:
            total = (_num(e.get("restored")) or 0) + _num(e.get("remaining"))
        if total is not None:
            rt.total = total
        restored = _num(e.get("restored", e.get("records_restored")))
        if restored is not None:
            rt.restored = restored
        src = e.get("from") or e.get("source") or e.get("replayed_from")
        if src:
            rt.source = str(src)
        elif rt.source is None and rt.start_offset is not None:
            rt.source = "scratch" if rt.start_offset == 0 else "checkpoint"
        if kind == "restore_end":
            rt.finished = t
            dur = _num(e.get("duration_s"))
            if dur is not None:
                rt.started = min(rt.started if rt.started is not None else t, t - dur)
            if rt.total is None:
                rt.total = rt.restored
        rt.estimator.add(t, rt.restored)

    def _restore_from_tasks(self, snap: Snapshot) -> None:
        """Without restore events, follow the lag of RESTORING tasks."""
        for r in snap.tasks:
            if r["role"] != "active" or r["task"] is None:
                continue
            st = str(r.get("state") or "").upper()
            key = (r["task"], r["store"])
            rt = self.restore.get(key)
            if st == "RESTORING":
                if rt is None or rt.done:
                    if rt is not None and all(x.done for x in self.restore.values()):
                        self._new_round(snap.t)
                    rt = RestoreTask(task=r["task"], started=snap.t, store=r["store"],
                                     total=r["lag"] or 0, source="checkpoint" if r["checkpoint"] else "scratch")
                    self.restore[key] = rt
                    if self._restore_round_started is None:
                        self._restore_round_started = snap.t
                if rt.total is not None and r["lag"] is not None:
                    rt.restored = max(rt.restored, rt.total - r["lag"])
                rt.estimator.add(snap.t, rt.restored)
            elif rt is not None and not rt.done and st in ("RUNNING",) and not snap.events:
                rt.finished = snap.t
                rt.restored = rt.total or rt.restored

    def _maybe_summarize(self, now: float) -> None:
        if not self.restore or self.restore_summary is not None:
            return
        if not all(r.done for r in self.restore.values()):
            return
        started = min((r.started for r in self.restore.values() if r.started is not None), default=now)
        finished = max((r.finished for r in self.restore.values()), default=now)
        self.restore_summary = RestoreSummary(
            seconds=max(0.0, finished - started),
            records_replayed=sum(r.restored for r in self.restore.values()),
            offsets_spanned=sum((r.end_offset - r.start_offset) if r.end_offset is not None and r.start_offset is not None
                                else r.restored for r in self.restore.values()),
            tasks=len(self.restore),
            from_checkpoint=sum(1 for r in self.restore.values() if (r.source or "").startswith("checkpoint")),
            from_scratch=sum(1 for r in self.restore.values() if (r.source or "") in ("scratch", "log_start", "beginning")),
            from_standby=sum(1 for r in self.restore.values() if (r.source or "").startswith("standby")),
        )
        self._restore_round_started = None

    # -- reading ------------------------------------------------------------------------------

    @property
    def restoring(self) -> bool:
        return any(not r.done for r in self.restore.values())

    def header(self) -> dict:
        s = self.snapshot or Snapshot(t=time.time())
        m = s.metrics or {}

        def pick(*names):
            for n in names:
                if m.get(n) is not None:
                    return _num(m[n], m[n])
            return None

        return {
            "state": s.state,
            "input_rate": pick("input_rate", "inputRowsPerSecond", "input_rows_per_second"),
            "processed_rate": pick("processed_rate", "processedRowsPerSecond", "processed_rows_per_second"),
            "records": pick("records_processed", "records", "processed", "numInputRows_total"),
            "batch_ms": pick("last_batch_latency_ms", "last_batch_ms", "batch_duration_ms", "latency_ms"),
            "batch_id": pick("last_batch_id", "batch_id", "batchId"),
            "rows": sum(r["rows"] or 0 for r in s.tasks if r["role"] == "active"),
            "lag": sum(r["lag"] or 0 for r in s.tasks if r["role"] == "active"),
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
        return sorted(s.tasks, key=lambda r: (r["task"] if r["task"] is not None else -1,
                                              r["role"] != "active", r["store"] or "", r["instance"] or 0))

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

    def lag_series(self, standby: bool = False) -> dict[int, tuple[list[float], list[float]]]:
        """task -> (seconds since the first refresh, lag) for the lag-over-time chart."""
        hist = self.standby_lag_history if standby else self.lag_history
        t0 = self.t0 or 0.0
        return {t: ([p[0] - t0 for p in dq], [p[1] for p in dq]) for t, dq in sorted(hist.items())}

    def restore_rows(self) -> list[RestoreTask]:
        return [self.restore[k] for k in sorted(self.restore, key=lambda k: (k[0], str(k[1])))]

    def changelog_rows(self) -> list[dict]:
        """Per changelog partition: records in the log, live keys, dirty ratio, cleaner runs."""
        s = self.snapshot
        if s is None:
            return []
        live = {}
        for r in s.tasks:
            if r["role"] == "active" and r["task"] is not None and r["rows"] is not None:
                live[(r["store"], r["task"])] = r["rows"]
        out = []
        for c in s.changelog:
            topic, part = c.get("topic"), _num(c.get("partition"))
            store = c.get("store")
            if store is None and topic and topic.endswith("-changelog"):
                # <application>-<store>-changelog: match a store name we know
                for name in self.store_names() or [r["store"] for r in s.tasks if r["store"]]:
                    if topic.endswith(f"-{name}-changelog"):
                        store = name
                        break
            records = _num(c.get("records"))
            if records is None and c.get("high_watermark") is not None:
                records = _num(c.get("high_watermark")) - (_num(c.get("log_start_offset")) or 0)
            keys = _num(c.get("live_keys"), live.get((store, part)))
            out.append({
                "topic": topic, "partition": part, "store": store,
                "log_start": _num(c.get("log_start_offset")), "end": _num(c.get("high_watermark", c.get("end_offset"))),
                "records": records, "live_keys": keys,
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


class EventCursor:
    """Reads an app's new events since the last poll (non-blocking)."""

    def __init__(self, app):
        self.app = app
        self._offset = None  # events carry their offset in the events topic
        self._seen = 0

    def poll(self, limit: int = 5000) -> list[dict]:
        ev = getattr(self.app, "events", None)
        if ev is None:
            return []
        if _accepts(ev, "since_offset"):
            res = ev(since_offset=self._offset) if self._offset is not None else ev()
        else:
            res = ev()
        recs = _records(res)
        offs = [e.get("offset") for e in recs]
        if recs and all(isinstance(o, int) for o in offs):
            new = recs if self._offset is None else [e for e in recs if e["offset"] > self._offset]
            # app-level events (published by the kernel) and worker events share the topic
            if new:
                self._offset = max(self._offset or -1, max(e["offset"] for e in new))
        else:
            if len(recs) < self._seen:  # a bounded buffer wrapped around
                self._seen = 0
            new = recs[self._seen:]
            self._seen = len(recs)
        return new[-limit:]


def _accepts(fn, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


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
        batch = None
        for k in ("last_batch_id", "batch_id", "batchId"):
            if metrics.get(k) is not None:
                batch = metrics[k]
                break
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
            events: EventCursor | None = None, changelog=None, cache: StoreCache | None = None) -> Snapshot:
    """A Snapshot of `app` (a statekit.App). Never raises: a failing part leaves its panel empty
    and the message in `snapshot.error`. With a `cache`, a store is only read again after one of
    its tasks committed (see `StoreCache`)."""
    snap = Snapshot(t=time.time())
    errors = []

    def guard(what, fn):
        try:
            return fn()
        except Exception as err:  # a panel must not kill the dashboard
            errors.append(f"{what}: {' '.join(str(err).split())[:200]}")
            return None

    st = guard("state", lambda: app.state)
    snap.state = str(getattr(st, "name", st) or "UNKNOWN")
    snap.metrics = guard("metrics", lambda: dict(app.metrics() or {})) or {}
    snap.tasks = guard("lag", lambda: _records(app.lag())) or []
    names = list(stores) if stores is not None else guard("stores", lambda: _store_names(app)) or []
    for name in names:
        sig = got = None
        if cache is not None:
            sig = StoreCache.signature(name, snap.state, snap.metrics, snap.tasks)
            got = cache.get(name, sig, snap.t)
        if got is None:
            got = guard(f"store {name}", lambda: _read_store(app, name, max_rows))
            if got is not None and cache is not None:
                cache.put(name, sig, snap.t, got)
        if got is not None:
            snap.stores[name], per_task = got
            for t, n in per_task.items():
                snap.task_rows[(t, name)] = n
    if events is not None:
        snap.events = guard("events", events.poll) or []
    if changelog is not None:
        snap.changelog = guard("changelog", changelog) or []
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
    """({key: value} for up to max_rows keys, {task: number of keys}) of one store."""
    res = app.query_all(name)
    per_task: dict = {}
    if hasattr(res, "to_dict") and hasattr(res, "columns"):
        cols = list(res.columns)
        if "task" in cols:
            per_task = {int(t): int(n) for t, n in res["task"].value_counts().items()}
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


def _hashable(k):
    if isinstance(k, (list, dict)):
        import json

        return json.dumps(k, sort_keys=True)
    return k
