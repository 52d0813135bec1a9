"""Who ran what, when: the ownership timeline and per-instance processing rates, from the app's
typed events. Pure Python.

``OwnershipTimeline`` turns ``restore_queued`` events (an instance was given a task) and
``rebalance`` events (the active instance of every task), deaths,
replica starts and stops, promotions and task openings into, per task, segments of time owned by an
instance (``opened`` says when the task was ready there: before that it was restoring) plus warmup
segments and markers (crash, rebalance, promotion, restored, warmup caught up, join, revive).
``InstanceRates`` counts the records each instance committed in the last seconds.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from kernel_ext.dashboard.restore import _get, _type


@dataclass
class Segment:
    instance: int
    start: float
    end: Optional[float] = None
    opened: Optional[float] = None    # when the task was ready on this instance


@dataclass
class Marker:
    t: float
    kind: str                  # crash | rebalance | promoted | restored | caught-up | join | revive | leave
    task: Optional[str] = None  # None: the whole app
    label: str = ""


class OwnershipTimeline:
    def __init__(self, max_markers: int = 400):
        self.segments: dict[str, list[Segment]] = {}
        self.warmups: dict[str, list[Segment]] = {}
        self.markers: deque = deque(maxlen=max_markers)
        self.moves = 0             # tasks whose active instance changed, over every rebalance seen
        self.last_moves: list = []  # the moves of the latest rebalance that moved tasks
        self.last_moves_at: Optional[float] = None
        self.last_moves_generation = None
        self.t0: Optional[float] = None
        self.version = 0           # bumps on every change (the chart redraws only then)

    def _open(self, task: str) -> Optional[Segment]:
        segs = self.segments.get(task)
        return segs[-1] if segs and segs[-1].end is None else None

    def _assign(self, task: str, inst: int, ts: float) -> None:
        """`task` is active on `inst` from `ts` on (a move when another instance had it last)."""
        cur = self._open(task)
        if cur is not None:
            if cur.instance == inst:
                return
            cur.end = ts
        segs = self.segments.setdefault(task, [])
        if segs and segs[-1].instance != inst:
            self.moves += 1
        segs.append(Segment(inst, ts))

    def feed(self, e) -> None:
        kind = _type(e)
        ts = float(_get(e, "ts", 0.0) or 0.0)
        if kind not in ("restore_queued", "rebalance", "instance_died", "task_opened", "standby_promoted",
                        "warmup_caught_up", "replica_started", "replica_stopped", "instance_started",
                        "instance_left", "task_closed"):
            return
        if self.t0 is None:
            self.t0 = ts
        self.version += 1
        if kind == "restore_queued":
            # the new owner was told (published before the rebalance that announces it)
            self._assign(str(_get(e, "task")), int(_get(e, "instance")), ts)
        elif kind == "rebalance":
            if _get(e, "moves"):
                self.last_moves = [dict(m) for m in _get(e, "moves")]
                self.last_moves_at, self.last_moves_generation = ts, _get(e, "generation")
            for task, inst in (_get(e, "active", {}) or {}).items():
                cur = self._open(str(task))
                if cur is None or cur.instance != int(inst):
                    self._assign(str(task), int(inst), ts)   # no restore_queued seen for it
            warm = {(str(t), int(i)) for t, insts in (_get(e, "warmups", {}) or {}).items() for i in insts}
            for task, segs in self.warmups.items():
                for s in segs:
                    if s.end is None and (task, s.instance) not in warm:
                        s.end = ts
            for task, inst in warm:
                if not any(s.end is None and s.instance == inst for s in self.warmups.get(task, [])):
                    self.warmups.setdefault(task, []).append(Segment(inst, ts))
            self.markers.append(Marker(ts, "rebalance", None, f"g{_get(e, 'generation', '')}"))
        elif kind == "instance_died":
            inst = _get(e, "instance")
            for task in [str(t) for t in (_get(e, "tasks", []) or [])] or list(self.segments):
                cur = self._open(task)
                if cur is not None and cur.instance == inst:
                    cur.end = ts
                    self.markers.append(Marker(ts, "crash", task, f"instance {inst} died"))
            for segs in self.warmups.values():
                for s in segs:
                    if s.end is None and s.instance == inst:
                        s.end = ts
            self.markers.append(Marker(ts, "crash", None, f"instance {inst} died"))
        elif kind == "task_opened":
            task = str(_get(e, "task"))
            cur = self._open(task)
            if cur is not None and cur.instance == _get(e, "instance") and cur.opened is None:
                cur.opened = ts
            if int(_get(e, "restored", 0) or 0) > 0:
                self.markers.append(Marker(ts, "restored", task, f"{int(_get(e, 'restored')):,} records"))
        elif kind == "standby_promoted":
            task = str(_get(e, "task"))
            self.markers.append(Marker(ts, "promoted", task, f"{_get(e, 'role', 'standby')} promoted"))
            for s in self.warmups.get(task, []):
                if s.end is None and s.instance == _get(e, "instance"):
                    s.end = ts
        elif kind == "warmup_caught_up":
            self.markers.append(Marker(ts, "caught-up", str(_get(e, "task")), "warmup caught up"))
        elif kind == "replica_started" and _get(e, "role") == "warmup":
            task, inst = str(_get(e, "task")), _get(e, "instance")
            if not any(s.end is None and s.instance == inst for s in self.warmups.get(task, [])):
                self.warmups.setdefault(task, []).append(Segment(inst, ts))
        elif kind == "replica_stopped" and _get(e, "role") == "warmup":
            for s in self.warmups.get(str(_get(e, "task")), []):
                if s.end is None and s.instance == _get(e, "instance"):
                    s.end = ts
        elif kind == "instance_started" and _get(e, "reason") in ("add", "revive"):
            verb = "joined" if _get(e, "reason") == "add" else "revived"
            self.markers.append(Marker(ts, "join" if verb == "joined" else "revive", None,
                                       f"instance {_get(e, 'instance')} {verb}"))
        elif kind == "instance_left":
            self.markers.append(Marker(ts, "leave", None, f"instance {_get(e, 'instance')} left"))

    def tasks(self) -> list[str]:
        from statekit.contracts import TaskId

        def key(t):
            try:
                return (0, TaskId.parse(t))
            except ValueError:
                return (1, t)

        return sorted(set(self.segments) | set(self.warmups), key=key)

    def owner_history(self, task: str) -> list[int]:
        """The instances a task was active on, in order (repeats collapsed)."""
        out: list[int] = []
        for s in self.segments.get(task, []):
            if not out or out[-1] != s.instance:
                out.append(s.instance)
        return out


class InstanceRates:
    """Records each instance committed over the last ``window`` seconds (commit events)."""

    def __init__(self, window: float = 5.0):
        self.window = window
        self.commits: dict[int, deque] = {}
        self.latest = 0.0

    def feed(self, e) -> None:
        if _type(e) != "commit":
            return
        inst = _get(e, "instance")
        if inst is None:
            return
        ts = float(_get(e, "ts", 0.0) or 0.0)
        self.latest = max(self.latest, ts)
        dq = self.commits.setdefault(int(inst), deque())
        dq.append((ts, int(_get(e, "records", 0) or 0)))

    def rate(self, instance: int, now: float) -> float:
        dq = self.commits.get(int(instance))
        if not dq:
            return 0.0
        while dq and dq[0][0] < now - 10 * self.window:
            dq.popleft()
        return sum(n for t, n in dq if now - self.window <= t <= now) / self.window
