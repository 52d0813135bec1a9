"""The Restoration panel's model: restore rounds built from the app's typed events. Pure Python.

A *round* is every task opening that belongs to one episode (a start, a crash and its failover, a
restart, a warmup that moved): it begins with the first ``restore_queued`` after the previous round
ended (tasks queued by the same rebalance generation, or within a moment of its end, still join it)
and ends when every task in it reached a final status. Each task's row walks through

    queued (records to replay known at assignment) → restoring (progress, rate, ETA) → done

or ends as *nothing to replay*, *promoted* (a standby or warmup replica took over), *failed*,
*moved* (revoked before it opened) or *interrupted* (its instance died while it restored).

A round keeps its events, so ``RestoreRound.at(t)`` rebuilds the panel as it was at time ``t``: the
restore timeline can be replayed after the fact.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

FINAL = {"done", "nothing", "promoted", "failed", "moved", "interrupted"}
STATUS_LABELS = {
    "queued": "queued", "restoring": "restoring", "done": "done", "nothing": "nothing to replay",
    "promoted": "promoted", "failed": "failed", "moved": "moved away", "interrupted": "instance died",
}
RESTORE_TYPES = {"restore_queued", "restore_start", "restore_batch", "restore_end", "task_opened",
                 "standby_promoted", "task_failed", "task_closed", "instance_died"}


def _get(e, name, default=None):
    if isinstance(e, dict):
        return e.get(name, default)
    v = getattr(e, name, default)
    return default if v is None else v


def _type(e) -> str:
    return str(_get(e, "type", "") or "")


@dataclass
class StoreProgress:
    total: int = 0
    restored: int = 0
    done: bool = False
    start_offset: Optional[int] = None
    end_offset: Optional[int] = None


@dataclass
class RestoreRow:
    """One task's opening in a round."""

    task: str
    instance: Optional[int] = None
    source: str = "checkpoint"       # checkpoint | standby | warmup | scratch
    status: str = "queued"
    to_replay: Optional[int] = None  # known at assignment (restore_queued)
    stores: dict = field(default_factory=dict)   # store -> StoreProgress
    queued_at: Optional[float] = None
    started: Optional[float] = None
    finished: Optional[float] = None
    promoted: Optional[str] = None   # "standby" | "warmup"
    promoted_lag: Optional[int] = None
    throttle: Optional[float] = None
    samples: list = field(default_factory=list)  # [(ts, records restored)] while restoring
    reported_rate: Optional[float] = None        # rate_rps of the last event
    seconds: Optional[float] = None              # restore time the instance measured
    replayed: Optional[int] = None               # records replayed (task_opened)
    error: Optional[str] = None

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def total(self) -> Optional[int]:
        if self.stores:
            return sum(s.total for s in self.stores.values())
        return self.to_replay

    @property
    def restored(self) -> int:
        if self.replayed is not None and self.final:
            return self.replayed
        return sum(s.restored for s in self.stores.values())

    @property
    def fraction(self) -> float:
        if self.status in ("done", "nothing", "promoted"):
            return 1.0
        total = self.total
        if not total:
            return 0.0
        # every record read is not a finished restore (the last write, the checkpoint): a bar reaches
        # 100% when the task is done, not before
        top = 0.99 if self.status == "restoring" else 1.0
        return max(0.0, min(top, self.restored / total))

    @property
    def rate(self) -> Optional[float]:
        """Records/s: over the last two progress reports while restoring; the average once done."""
        if self.status == "done":
            if self.seconds and self.seconds > 0 and self.restored:
                return self.restored / self.seconds
            return self.reported_rate
        if len(self.samples) >= 2:
            (t0, r0), (t1, r1) = self.samples[-2], self.samples[-1]
            if t1 > t0 and r1 >= r0:
                return (r1 - r0) / (t1 - t0)
        return self.reported_rate or None

    @property
    def eta(self) -> Optional[float]:
        """Seconds left (0 when final, None when unknown)."""
        if self.final:
            return 0.0
        total, rate = self.total, self.rate
        if self.status != "restoring" or total is None or not rate:
            return None
        return max(0.0, (total - self.restored) / rate)

    @property
    def label(self) -> str:
        if self.status == "promoted":
            lag = f", lag {self.promoted_lag:,}" if self.promoted_lag else ""
            return f"promoted {self.promoted or 'standby'}{lag}"
        return STATUS_LABELS.get(self.status, self.status)


@dataclass
class RoundSummary:
    started: float
    finished: float
    tasks: int
    restored_tasks: int        # tasks that replayed records
    records: int
    promoted: int
    nothing: int
    failed: int
    by_source: dict            # source -> tasks that replayed from it
    throttle: Optional[float]
    task_seconds: dict = field(default_factory=dict)  # task -> (seconds, records, records/s)

    @property
    def seconds(self) -> float:
        return max(0.0, self.finished - self.started)

    @property
    def replay_seconds(self) -> float:
        """The tasks' own restore times, summed (the rest of the wall time is opening, waiting)."""
        return sum(sec for sec, _n, _r in self.task_seconds.values())

    @property
    def rate(self) -> Optional[float]:
        """Records/s while replaying."""
        secs = self.replay_seconds or self.seconds
        return self.records / secs if secs > 0 and self.records else None

    def line(self) -> str:
        parts = []
        if self.restored_tasks:
            src = ", ".join(f"{n} from {s}" for s, n in sorted(self.by_source.items()))
            rate = f" at {self.rate:,.0f} records/s" if self.rate else ""
            work = f" ({self.replay_seconds:.1f} s replaying)" if self.replay_seconds else ""
            parts.append(f"restored {self.restored_tasks} task(s) in {self.seconds:.1f} s{work}: "
                         f"{self.records:,} records{rate} ({src})")
        if self.promoted:
            parts.append(f"{self.promoted} promoted replica(s)")
        if self.nothing:
            parts.append(f"{self.nothing} task(s) with nothing to replay")
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.throttle:
            parts.append(f"throttled to {self.throttle:,.0f} records/s")
        return "; ".join(parts) or "no task opened"


class RestoreRound:
    """The rows of one round, fed event by event (oldest first)."""

    def __init__(self, started: float, generation: Optional[int] = None):
        self.started = started
        self.generation = generation
        self.rows: dict[str, RestoreRow] = {}
        self.events: list = []
        self.generations: set = set()

    @property
    def final(self) -> bool:
        return bool(self.rows) and all(r.final for r in self.rows.values())

    @property
    def finished(self) -> Optional[float]:
        if not self.final:
            return None
        return max((r.finished or r.queued_at or self.started) for r in self.rows.values())

    def ordered(self) -> list[RestoreRow]:
        from statekit.contracts import TaskId

        def key(r):
            try:
                return (0, TaskId.parse(r.task))
            except ValueError:
                return (1, r.task)

        return sorted(self.rows.values(), key=key)

    def eta(self, row: RestoreRow) -> Optional[float]:
        """Seconds until `row`'s task is restored: its own ETA while it restores; for a queued task,
        what the tasks ahead of it on its instance (one opens at a time) and its own records to
        replay take at the rate its instance restores now."""
        if row.status == "restoring":
            if row.eta is not None:
                return row.eta
            rate = self._rate_so_far(row.instance)   # no progress report yet: this round's rate
            total = row.total
            return None if not rate or total is None else max(0.0, (total - row.restored) / rate)
        if row.status != "queued":
            return row.eta
        mates = [r for r in self.rows.values() if r.instance == row.instance]
        running = [r for r in mates if r.status == "restoring"]
        if not running or row.to_replay is None:
            return None
        cur = running[0]
        rate = cur.rate or self._rate_so_far(row.instance)
        if not rate:
            return None
        ahead = [r for r in mates if r.status == "queued" and (r.queued_at or 0, r.task) < (row.queued_at or 0, row.task)]
        left = max(0, (cur.total or 0) - cur.restored) + sum(r.to_replay or 0 for r in ahead) + row.to_replay
        return left / rate

    def _rate_so_far(self, instance) -> Optional[float]:
        """The mean rate of the tasks this round restored (on `instance` if any, else anywhere)."""
        for pick in (lambda r: r.instance == instance, lambda r: True):
            rates = [r.rate for r in self.rows.values() if r.status == "done" and pick(r) and r.rate]
            if rates:
                return sum(rates) / len(rates)
        return None

    def feed(self, e) -> None:
        self.events.append(e)
        if _type(e) == "restore_queued" and _get(e, "generation") is not None:
            self.generations.add(_get(e, "generation"))
        apply_event(self.rows, e)

    def at(self, t: float) -> "RestoreRound":
        """The round as it was at time ``t`` (its events up to then, replayed)."""
        r = RestoreRound(self.started, self.generation)
        for e in self.events:
            if float(_get(e, "ts", 0.0)) <= t:
                r.feed(e)
        return r

    def summary(self) -> Optional[RoundSummary]:
        if not self.final:
            return None
        rows = list(self.rows.values())
        restored = [r for r in rows if r.status == "done" and r.restored]
        by_source: dict = {}
        for r in restored:
            by_source[r.source] = by_source.get(r.source, 0) + 1
        starts = [r.started for r in restored if r.started is not None] or [self.started]
        ends = [r.finished for r in restored if r.finished is not None] or [self.finished or self.started]
        throttles = [r.throttle for r in rows if r.throttle]
        return RoundSummary(
            started=min(starts), finished=max(ends), tasks=len(rows), restored_tasks=len(restored),
            records=sum(r.restored for r in restored),
            promoted=sum(r.status == "promoted" or (r.promoted is not None and r.status == "done")
                         for r in rows),
            nothing=sum(r.status == "nothing" for r in rows),
            failed=sum(r.status == "failed" for r in rows), by_source=by_source,
            throttle=max(throttles) if throttles else None,
            task_seconds={r.task: (r.seconds or 0.0, r.restored, r.rate or 0.0) for r in restored})


def apply_event(rows: dict, e) -> None:
    """One event's effect on the rows of a round."""
    kind = _type(e)
    ts = float(_get(e, "ts", 0.0) or 0.0)
    task = _get(e, "task")
    task = None if task is None else str(task)
    inst = _get(e, "instance")
    if kind == "instance_died":
        for r in rows.values():
            if r.instance == inst and not r.final:
                r.status, r.finished = "interrupted", ts
        return
    if task is None:
        return
    row = rows.get(task)
    if kind == "restore_queued":
        if row is not None and not row.final and row.instance != inst:
            pass  # replaced below: the task went to another instance before it opened
        rows[task] = RestoreRow(task=task, instance=inst, source=str(_get(e, "source", "checkpoint")),
                                to_replay=_get(e, "to_replay"), queued_at=ts)
        return
    if row is None:
        if kind not in ("restore_start", "restore_batch", "restore_end", "task_opened", "standby_promoted"):
            return
        row = rows[task] = RestoreRow(task=task, instance=inst, queued_at=ts)
    if inst is not None and row.instance is not None and inst != row.instance and kind != "task_closed":
        if row.final and kind in ("restore_start", "standby_promoted"):
            row = rows[task] = RestoreRow(task=task, instance=inst, queued_at=ts)
        elif not row.final:
            row.instance = inst
    if kind == "standby_promoted":
        row.promoted = str(_get(e, "role", "standby"))
        row.promoted_lag = _get(e, "lag")
        row.source = row.promoted
    elif kind == "restore_start":
        store = str(_get(e, "store", ""))
        sp = row.stores.setdefault(store, StoreProgress())
        sp.total = int(_get(e, "to_replay", 0) or 0) or max(
            0, int(_get(e, "end_offset", 0) or 0) - int(_get(e, "start_offset", 0) or 0))
        sp.start_offset, sp.end_offset = _get(e, "start_offset"), _get(e, "end_offset")
        row.status = "restoring"
        row.started = ts if row.started is None else min(row.started, ts)
        row.throttle = _get(e, "throttle_rps") or row.throttle
        if row.promoted is None and _get(e, "source"):
            row.source = str(_get(e, "source"))
        row.samples.append((ts, row.restored))
    elif kind == "restore_batch":
        store = str(_get(e, "store", ""))
        sp = row.stores.setdefault(store, StoreProgress())
        sp.restored = int(_get(e, "restored", 0) or 0)
        remaining = _get(e, "remaining")
        if remaining is not None:
            sp.total = max(sp.total, sp.restored + int(remaining))
        row.status = "restoring" if not row.final else row.status
        if row.started is None:
            row.started = ts
        row.reported_rate = _get(e, "rate_rps") or row.reported_rate
        row.samples.append((ts, row.restored))
    elif kind == "restore_end":
        store = str(_get(e, "store", ""))
        sp = row.stores.setdefault(store, StoreProgress())
        sp.restored = int(_get(e, "restored", 0) or 0)
        sp.total = max(sp.total, sp.restored)
        sp.done = True
        secs = float(_get(e, "seconds", 0.0) or 0.0)
        row.seconds = (row.seconds or 0.0) + secs
        if row.started is None or row.started > ts - secs:
            row.started = ts - secs
        row.reported_rate = _get(e, "rate_rps") or row.reported_rate
        row.throttle = _get(e, "throttle_rps") or row.throttle
        if row.promoted is None and _get(e, "source"):
            row.source = str(_get(e, "source"))   # the state layer's final word (scratch, checkpoint)
        row.samples.append((ts, row.restored))
    elif kind == "task_opened":
        replayed = int(_get(e, "restored", 0) or 0)
        row.replayed = replayed
        row.finished = ts
        if row.promoted is None and _get(e, "source") not in (None, "none"):
            row.source = str(_get(e, "source"))
        if row.promoted is not None and not replayed:
            row.status = "promoted"
        elif replayed or any(s.restored for s in row.stores.values()):
            row.status = "done"
            if row.seconds is None and row.started is not None:
                row.seconds = max(0.0, ts - row.started)
        else:
            row.status = "nothing"
    elif kind == "task_failed":
        if not row.final or row.status == "done":
            row.status, row.finished = "failed", ts
            row.error = _get(e, "error")
    elif kind == "task_closed":
        if not row.final and row.instance == inst:
            row.status, row.finished = "moved", ts


class RestoreBoard:
    """Every round so far (the last ``keep``), fed with the app's events in order."""

    def __init__(self, keep: int = 20, episode_gap: float = 2.0):
        self.rounds: list[RestoreRound] = []
        self.keep = keep
        self.episode_gap = episode_gap

    @property
    def current(self) -> Optional[RestoreRound]:
        return self.rounds[-1] if self.rounds else None

    @property
    def restoring(self) -> bool:
        c = self.current
        return c is not None and not c.final

    def _same_episode(self, cur: RestoreRound, e, ts: float) -> bool:
        """A task queued by the same rebalance generation, or within `episode_gap` seconds after the
        round ended (a start or a restart rebalances once per instance), joins the round."""
        gen = _get(e, "generation")
        if gen is not None and cur.generations and gen in cur.generations:
            return True
        return cur.finished is not None and ts - cur.finished <= self.episode_gap

    def feed(self, e) -> Optional[RestoreRound]:
        """Apply one event; returns the round it opened, if it opened one."""
        kind = _type(e)
        if kind not in RESTORE_TYPES:
            return None
        opened = None
        cur = self.current
        ts = float(_get(e, "ts", 0.0) or 0.0)
        if kind == "restore_queued" and (cur is None or (cur.final and not self._same_episode(cur, e, ts))):
            cur = opened = RestoreRound(ts, _get(e, "generation"))
            self.rounds.append(cur)
            del self.rounds[:-self.keep]
        if cur is None:
            return None
        cur.feed(e)
        return opened
