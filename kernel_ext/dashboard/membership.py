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

from statekit import events as ev


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

    _KINDS = (ev.RestoreQueued, ev.Rebalance, ev.InstanceDied, ev.TaskOpened, ev.StandbyPromoted,
              ev.WarmupCaughtUp, ev.ReplicaStarted, ev.ReplicaStopped, ev.InstanceStarted,
              ev.InstanceLeft, ev.TaskClosed)

    def feed(self, e) -> None:
        """Apply one typed event (``statekit.events``); others are ignored."""
        if not isinstance(e, self._KINDS):
            return
        ts = e.ts
        if self.t0 is None:
            self.t0 = ts
        self.version += 1
        if isinstance(e, ev.RestoreQueued):
            # the new owner was told (published before the rebalance that announces it)
            self._assign(str(e.task), int(e.instance), ts)
        elif isinstance(e, ev.Rebalance):
            if e.moves:
                self.last_moves = [dict(m) for m in e.moves]
                self.last_moves_at, self.last_moves_generation = ts, e.generation
            for task, inst in (e.active or {}).items():
                cur = self._open(str(task))
                if cur is None or cur.instance != int(inst):
                    self._assign(str(task), int(inst), ts)   # no restore_queued seen for it
            warm = {(str(t), int(i)) for t, insts in (e.warmups or {}).items() for i in insts}
            for task, segs in self.warmups.items():
                for s in segs:
                    if s.end is None and (task, s.instance) not in warm:
                        s.end = ts
            for task, inst in warm:
                if not any(s.end is None and s.instance == inst for s in self.warmups.get(task, [])):
                    self.warmups.setdefault(task, []).append(Segment(inst, ts))
            self.markers.append(Marker(ts, "rebalance", None, f"g{e.generation if e.generation is not None else ''}"))
        elif isinstance(e, ev.InstanceDied):
            inst = e.instance
            for task in [str(t) for t in (e.tasks or [])] or list(self.segments):
                cur = self._open(task)
                if cur is not None and cur.instance == inst:
                    cur.end = ts
                    self.markers.append(Marker(ts, "crash", task, f"instance {inst} died"))
            for segs in self.warmups.values():
                for s in segs:
                    if s.end is None and s.instance == inst:
                        s.end = ts
            self.markers.append(Marker(ts, "crash", None, f"instance {inst} died"))
        elif isinstance(e, ev.TaskOpened):
            task = str(e.task)
            cur = self._open(task)
            if cur is not None and cur.instance == e.instance and cur.opened is None:
                cur.opened = ts
            if (e.restored or 0) > 0:
                self.markers.append(Marker(ts, "restored", task, f"{int(e.restored):,} records"))
        elif isinstance(e, ev.StandbyPromoted):
            task = str(e.task)
            self.markers.append(Marker(ts, "promoted", task, f"{e.role or 'standby'} promoted"))
            for s in self.warmups.get(task, []):
                if s.end is None and s.instance == e.instance:
                    s.end = ts
        elif isinstance(e, ev.WarmupCaughtUp):
            self.markers.append(Marker(ts, "caught-up", str(e.task), "warmup caught up"))
        elif isinstance(e, ev.ReplicaStarted) and e.role == "warmup":
            task, inst = str(e.task), e.instance
            if not any(s.end is None and s.instance == inst for s in self.warmups.get(task, [])):
                self.warmups.setdefault(task, []).append(Segment(inst, ts))
        elif isinstance(e, ev.ReplicaStopped) and e.role == "warmup":
            for s in self.warmups.get(str(e.task), []):
                if s.end is None and s.instance == e.instance:
                    s.end = ts
        elif isinstance(e, ev.InstanceStarted) and e.reason in ("add", "revive"):
            verb = "joined" if e.reason == "add" else "revived"
            self.markers.append(Marker(ts, "join" if verb == "joined" else "revive", None,
                                       f"instance {e.instance} {verb}"))
        elif isinstance(e, ev.InstanceLeft):
            self.markers.append(Marker(ts, "leave", None, f"instance {e.instance} left"))

    def frozen(self) -> "OwnershipTimeline":
        """A copy the chart can draw while events keep changing this one."""
        import copy

        c = OwnershipTimeline(self.markers.maxlen or 400)
        c.segments = copy.deepcopy(self.segments)
        c.warmups = copy.deepcopy(self.warmups)
        c.markers = deque(self.markers, maxlen=self.markers.maxlen)
        c.moves, c.last_moves = self.moves, list(self.last_moves)
        c.last_moves_at, c.last_moves_generation = self.last_moves_at, self.last_moves_generation
        c.t0, c.version = self.t0, self.version
        return c

    def tasks(self) -> list[str]:
        from kernel_ext.dashboard.formats import task_order

        return sorted(set(self.segments) | set(self.warmups), key=task_order)

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
        if not isinstance(e, ev.Committed) or e.instance is None:
            return
        self.latest = max(self.latest, e.ts)
        dq = self.commits.setdefault(int(e.instance), deque())
        dq.append((e.ts, int(e.records or 0)))
        while dq and dq[0][0] < e.ts - 10 * self.window:
            dq.popleft()

    def rate(self, instance: int, now: float) -> float:
        """Records/s committed over the ``window`` seconds before ``now`` (read-only: a picture
        may call it from another thread than the one feeding)."""
        dq = list(self.commits.get(int(instance)) or ())
        return sum(n for t, n in dq if now - self.window <= t <= now) / self.window
