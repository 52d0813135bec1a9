"""The Restoration panel's model: restore rounds built from the app's typed events. Pure Python.

A *round* is every task opening that belongs to one episode (a start, a crash and its failover, a
restart, a warmup that moved): it begins with the first ``restore_queued`` (or the death of an
instance that held tasks) after the previous round ended (tasks queued by the same rebalance
generation, or within a moment of its end, still join it) and ends when every task in it reached a
final status. Each task's row walks through

    queued (records to replay known at assignment) → restoring (progress, rate, ETA) → done

or ends as *nothing to replay*, *promoted* (a standby or warmup replica took over), *failed* or
*moved* (revoked before it opened). A task whose instance dies is queued again at once, without an
instance until its new owner is told (``restore_queued``): the panel shows the crash the moment its
event arrives.

ETAs come from one smoothed rate per instance (its records restored per second, an exponential
average over a few seconds, never below a third of its average since the round began), started
from the restore forecast's rate: a dip in one progress report moves an ETA by a fraction, never
50-fold. Before an instance has a rate, the ETA is the forecast's seconds.

A round keeps its events, so ``RestoreRound.at(t)`` rebuilds the panel as it was at time ``t``: the
restore timeline can be replayed after the fact.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Optional

from kernel_ext.dashboard.forecast import forecast_rows, forecast_seconds
from statekit import events as ev

FINAL = {"done", "nothing", "promoted", "failed", "moved"}
STATUS_LABELS = {
    "queued": "queued", "restoring": "restoring", "done": "done", "nothing": "nothing to replay",
    "promoted": "promoted", "failed": "failed", "moved": "moved away",
}
RESTORE_TYPES = (ev.RestoreQueued, ev.RestoreStarted, ev.RestoreProgress, ev.RestoreEnded,
                 ev.TaskOpened, ev.StandbyPromoted, ev.TaskFailed, ev.TaskClosed, ev.InstanceDied,
                 ev.Rebalance)
# why a restore read fewer records than the offsets it crossed
SKIPPED_WHY = "compacted away, or transaction markers"


@dataclass
class StoreProgress:
    """One store's restore. Counted in changelog offsets until it ends (``span``: the offsets to
    cross, an upper bound of the records: a compacted log holds fewer, and a transaction's end
    marker takes an offset), then in the records it read: a done store's ``total`` is what it read,
    and ``skipped`` the offsets that held no record."""

    total: int = 0           # offsets to cross (span); once done: the records read
    restored: int = 0        # records read so far
    done: bool = False
    start_offset: Optional[int] = None
    end_offset: Optional[int] = None
    remaining: Optional[int] = None   # offsets left to cross (the last progress report)
    skipped: int = 0         # offsets that held no record (known once done)

    @property
    def crossed(self) -> int:
        """Offsets crossed so far (the progress bar's measure)."""
        if self.done:
            return self.total + self.skipped
        if self.remaining is not None:
            return max(0, self.total - self.remaining)
        return min(self.restored, self.total)

    def finish(self, read: int) -> None:
        span = max(self.total, int(read))
        self.restored = int(read)
        self.skipped = max(0, span - self.restored)
        self.total = self.restored
        self.remaining = 0
        self.done = True


@dataclass
class RestoreRow:
    """One task's opening in a round."""

    task: str
    instance: Optional[int] = None   # None: its instance died, no new owner yet
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
    died: Optional[int] = None                   # the instance that died under it (queued again)
    held: bool = False                           # stopped for a learner (App.hold_restores)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def copy(self) -> "RestoreRow":
        """A copy that later events do not change (cheaper than deepcopy: a refresh makes one)."""
        r = copy.copy(self)
        r.stores = {k: copy.copy(v) for k, v in self.stores.items()}
        r.samples = list(self.samples)
        return r

    @property
    def total(self) -> Optional[int]:
        """"To replay": the offsets its restore will cross (an upper bound of the records) until
        it is done, then the records it read."""
        if self.stores:
            return sum(s.total for s in self.stores.values())
        if self.replayed is not None and self.final:
            return self.replayed
        return self.to_replay

    @property
    def exact(self) -> bool:
        """Whether ``total`` counts records (done), not offsets (an upper bound)."""
        if self.stores:
            return all(s.done for s in self.stores.values())
        return self.final

    @property
    def skipped(self) -> int:
        """Offsets its restore crossed that held no record (compacted away, transaction markers)."""
        return sum(s.skipped for s in self.stores.values())

    @property
    def restored(self) -> int:
        if self.stores:
            return sum(s.restored for s in self.stores.values())
        return self.replayed or 0 if self.final else 0

    @property
    def remaining(self) -> Optional[int]:
        """Offsets left to cross (None: unknown)."""
        if self.stores:
            return sum(0 if s.done else max(0, s.total - s.crossed) for s in self.stores.values())
        if self.final:
            return 0
        return None if self.to_replay is None else self.to_replay

    @property
    def fraction(self) -> float:
        if self.status in ("done", "nothing", "promoted"):
            return 1.0
        if not self.stores:
            return 0.0
        span = sum(s.total + s.skipped if s.done else s.total for s in self.stores.values())
        if not span:
            return 0.0
        # every record read is not a finished restore (the last write, the checkpoint): a bar reaches
        # 100% when the task is done, not before
        top = 0.99 if self.status == "restoring" else 1.0
        return max(0.0, min(top, sum(s.crossed for s in self.stores.values()) / span))

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
    def label(self) -> str:
        if self.status == "promoted":
            lag = f", lag {self.promoted_lag:,}" if self.promoted_lag else ""
            return f"promoted {self.promoted or 'standby'}{lag}"
        if self.status == "queued" and self.died is not None:
            return f"queued: instance {self.died} died"
        if self.status == "restoring" and self.held:
            return "held: app.release_restores()"
        return STATUS_LABELS.get(self.status, self.status)


class SmoothedRate:
    """Records/s of one instance's restores: an exponential average (time constant ``tau``) of the
    rate between reports at least ``min_dt`` apart, started from ``prior`` (the forecast's rate)
    and never below a third of the average since the first report (a stalled tail moves an ETA
    by at most three-fold)."""

    def __init__(self, prior: Optional[float] = None, tau: float = 4.0, min_dt: float = 0.2):
        self.value = prior if prior and prior > 0 else None
        self.tau, self.min_dt = tau, min_dt
        self.first: Optional[tuple] = None
        self.last: Optional[tuple] = None

    def add(self, ts: float, total: int) -> None:
        if self.first is None:
            self.first = self.last = (ts, total)
            return
        dt = ts - self.last[0]
        if dt < self.min_dt or total < self.last[1]:
            return
        inst = (total - self.last[1]) / dt
        alpha = 1.0 - math.exp(-dt / self.tau)
        self.value = inst if self.value is None else self.value + alpha * (inst - self.value)
        self.last = (ts, total)

    @property
    def rate(self) -> Optional[float]:
        if self.value is None:
            return None
        floor = 0.0
        if self.first is not None and self.last[0] > self.first[0]:
            floor = (self.last[1] - self.first[1]) / (self.last[0] - self.first[0]) / 3.0
        return max(self.value, floor) or None


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
    skipped: int = 0           # offsets the restores crossed that held no record

    @property
    def ok(self) -> bool:
        """No task of the round failed (its summary is drawn as a success)."""
        return not self.failed

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
        parts = [f"{self.failed} failed"] if self.failed else []   # the news first
        if self.restored_tasks:
            src = ", ".join(f"{n} from {s}" for s, n in sorted(self.by_source.items()))
            rate = f" at {self.rate:,.0f} records/s" if self.rate else ""
            work = f" ({self.replay_seconds:.1f} s replaying)" if self.replay_seconds else ""
            skipped = (f"; {self.skipped:,} offsets held no record ({SKIPPED_WHY})"
                       if self.skipped else "")
            parts.append(f"restored {self.restored_tasks} task(s) in {self.seconds:.1f} s{work}: "
                         f"{self.records:,} records{rate} ({src}{skipped})")
        if self.promoted:
            parts.append(f"{self.promoted} promoted replica(s)")
        if self.nothing:
            parts.append(f"{self.nothing} task(s) with nothing to replay")
        if self.throttle:
            parts.append(f"throttled to {self.throttle:,.0f} records/s")
        return "; ".join(parts) or "no task opened"


class RestoreRound:
    """The rows of one round, fed event by event (oldest first). ``forecast``: the restore forecast
    made before the round began (its rate starts the ETAs)."""

    def __init__(self, started: float, generation: Optional[int] = None, forecast: Optional[dict] = None):
        self.started = started
        self.generation = generation
        self.forecast = forecast
        self.forecast_at: Optional[float] = None   # when that forecast was made
        self.rows: dict[str, RestoreRow] = {}
        self.events: list = []
        self.generations: set = set()
        self.rates: dict = {}     # instance -> SmoothedRate

    @property
    def final(self) -> bool:
        return bool(self.rows) and all(r.final for r in self.rows.values())

    @property
    def finished(self) -> Optional[float]:
        if not self.final:
            return None
        return max((r.finished or r.queued_at or self.started) for r in self.rows.values())

    def ordered(self) -> list[RestoreRow]:
        from kernel_ext.dashboard.formats import task_order

        return sorted(self.rows.values(), key=lambda r: task_order(r.task))

    def frozen(self) -> "RestoreRound":
        """A copy the panels can read while events keep changing this one (events not copied)."""
        r = RestoreRound(self.started, self.generation, self.forecast)
        r.forecast_at = self.forecast_at
        r.rows = {k: v.copy() for k, v in self.rows.items()}
        r.generations = set(self.generations)
        r.rates = {k: copy.copy(v) for k, v in self.rates.items()}
        r.events = list(self.events)   # the replay reads them
        return r

    # -- ETAs --------------------------------------------------------------------------------

    def _prior(self, instance) -> Optional[float]:
        """The forecast's records/s for the tasks of this round on `instance` (any, if none)."""
        from kernel_ext.dashboard.formats import num

        if not self.forecast:
            return None
        for pick in (lambda r: r.instance == instance, lambda r: True):
            recs = secs = 0.0
            for row in self.rows.values():
                if not pick(row):
                    continue
                for f in forecast_rows(self.forecast, row.task, row.source):
                    n, s = num(f.get("records")), num(f.get("seconds"))
                    if n and s:
                        recs, secs = recs + n, secs + s
                        break
            if recs and secs:
                return recs / secs
        return None

    def rate(self, instance) -> Optional[float]:
        """The smoothed records/s `instance` restores at in this round (None: not measured yet)."""
        r = self.rates.get(instance)
        return None if r is None or r.last is r.first else r.rate

    def _forecast_eta(self, row: RestoreRow, forecast: Optional[dict]) -> Optional[float]:
        """Before `row`'s instance has a rate: the forecast seconds of what is left of the tasks
        ahead of it on its instance (one opens at a time) and of its own."""
        def left(r):
            fc = forecast_seconds(forecast, r.task, r.source, r.total) if forecast else None
            return None if fc is None else fc * (1.0 - r.fraction)

        mine = left(row)
        if mine is None or row.status == "restoring" or row.instance is None:
            return mine
        others = [left(r) for r in self._ahead(row)]
        return None if any(x is None for x in others) else mine + sum(others)

    def _ahead(self, row: RestoreRow) -> list:
        return [r for r in self.rows.values() if r is not row and r.instance == row.instance and (
            r.status == "restoring" or (r.status == "queued" and (r.queued_at or 0, r.task) < (row.queued_at or 0, row.task)))]

    def estimate(self, row: RestoreRow, forecast: Optional[dict] = None) -> tuple:
        """(seconds until `row`'s task is restored, whether it is the forecast's): what is left of
        it — for a queued task also of the tasks ahead of it on its instance — at the instance's
        smoothed rate; before that rate is measured, the forecast's seconds (`forecast`, default
        the one made before the round). (0, False) when final, (None, False) when unknown."""
        fc = forecast if forecast is not None else self.forecast
        if row.final:
            return 0.0, False
        if row.status not in ("restoring", "queued"):
            return None, False
        rate = self.rate(row.instance) if row.instance is not None else None
        if not rate:
            q = self._forecast_eta(row, fc)
            return q, q is not None
        mine = row.remaining
        if mine is None:
            return None, False
        if row.status == "restoring":
            return mine / rate, False
        ahead = self._ahead(row)
        if any(r.remaining is None for r in ahead):
            return None, False
        return (mine + sum(r.remaining for r in ahead)) / rate, False

    def eta(self, row: RestoreRow, forecast: Optional[dict] = None) -> Optional[float]:
        """Seconds until `row`'s task is restored (see `estimate`)."""
        return self.estimate(row, forecast)[0]

    # -- feeding -----------------------------------------------------------------------------

    def feed(self, e) -> None:
        self.events.append(e)
        if isinstance(e, ev.RestoreQueued) and e.generation is not None:
            self.generations.add(e.generation)
        if isinstance(e, ev.Rebalance):
            # the rebalance that moved this round's tasks names its generation (an executors
            # placement publishes no restore_queued)
            if e.generation is not None and any(str(m.get("task")) in self.rows for m in e.moves or ()):
                self.generations.add(e.generation)
            return
        apply_event(self.rows, e)
        if isinstance(e, (ev.RestoreStarted, ev.RestoreProgress, ev.RestoreEnded, ev.TaskOpened)):
            inst = e.instance
            sr = self.rates.get(inst)
            if sr is None:
                sr = self.rates[inst] = SmoothedRate(self._prior(inst))
            sr.add(e.ts, sum(r.restored for r in self.rows.values() if r.instance == inst))

    def at(self, t: float) -> "RestoreRound":
        """The round as it was at time ``t`` (its events up to then, replayed)."""
        r = RestoreRound(self.started, self.generation, self.forecast)
        r.forecast_at = self.forecast_at
        for e in self.events:
            if e.ts <= t:
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
            task_seconds={r.task: (r.seconds or 0.0, r.restored, r.rate or 0.0) for r in restored},
            skipped=sum(r.skipped for r in restored))


def apply_event(rows: dict, e) -> None:
    """One typed event's effect on the rows of a round."""
    ts = e.ts
    if isinstance(e, ev.InstanceDied):
        for r in rows.values():
            if r.instance == e.instance and not r.final:
                # waiting for a new owner: what it will replay is known once one is told
                r.status, r.instance, r.died, r.samples = "queued", None, e.instance, []
                r.stores, r.to_replay = {}, None
        for t in e.tasks or ():
            t = str(t)
            if t not in rows or rows[t].final:
                rows[t] = RestoreRow(task=t, instance=None, source="?", queued_at=ts, died=e.instance)
        return
    task = getattr(e, "task", None)
    if not task:
        return
    task = str(task)
    inst = e.instance
    row = rows.get(task)
    if isinstance(e, ev.RestoreQueued):
        waiting = row is not None and not row.final and row.instance is None
        row = rows[task] = RestoreRow(task=task, instance=inst, source=str(e.source or "checkpoint"),
                                      to_replay=e.to_replay, queued_at=row.queued_at if waiting else ts)
        for store, span in (e.stores or {}).items():
            try:
                start, end = int(span[0]), int(span[1])
            except (TypeError, ValueError, IndexError):
                continue
            row.stores[str(store)] = StoreProgress(total=max(0, end - start), start_offset=start,
                                                   end_offset=end)
        return
    if row is None:
        if not isinstance(e, (ev.RestoreStarted, ev.RestoreProgress, ev.RestoreEnded, ev.TaskOpened,
                              ev.StandbyPromoted)):
            return
        row = rows[task] = RestoreRow(task=task, instance=inst, queued_at=ts)
    if inst is not None and inst != row.instance and not isinstance(e, ev.TaskClosed):
        if row.final and isinstance(e, (ev.RestoreStarted, ev.StandbyPromoted)):
            row = rows[task] = RestoreRow(task=task, instance=inst, queued_at=ts)
        elif not row.final:
            row.instance = inst
    if isinstance(e, ev.StandbyPromoted):
        row.promoted = str(e.role or "standby")
        row.promoted_lag = e.lag
        row.source = row.promoted
    elif isinstance(e, ev.RestoreStarted):
        sp = row.stores.get(str(e.store))
        if sp is None or sp.done:
            sp = row.stores[str(e.store)] = StoreProgress()
        sp.total = int(e.to_replay or 0) or max(0, int(e.end_offset or 0) - int(e.start_offset or 0))
        sp.start_offset, sp.end_offset = e.start_offset, e.end_offset
        sp.restored, sp.remaining = 0, sp.total
        row.status = "restoring"
        row.started = ts if row.started is None else min(row.started, ts)
        row.throttle = e.throttle_rps or row.throttle
        if row.promoted is None and e.source:
            row.source = str(e.source)
        row.samples.append((ts, row.restored))
    elif isinstance(e, ev.RestoreProgress):
        sp = row.stores.setdefault(str(e.store), StoreProgress())
        if sp.done:
            return
        sp.restored = int(e.restored or 0)
        row.held = bool(getattr(e, "held", False))
        if e.remaining is not None:
            sp.remaining = int(e.remaining)
            if not sp.total:   # its start not seen: the offsets crossed so far are at least its records
                sp.total = sp.restored + sp.remaining
        row.status = "restoring" if not row.final else row.status
        if row.started is None:
            row.started = ts
        row.reported_rate = e.rate_rps or row.reported_rate
        row.samples.append((ts, row.restored))
    elif isinstance(e, ev.RestoreEnded):
        sp = row.stores.setdefault(str(e.store), StoreProgress())
        if e.end_offset is not None and e.start_offset is not None and e.end_offset > e.start_offset:
            sp.start_offset, sp.end_offset = e.start_offset, e.end_offset
            sp.total = max(0, int(e.end_offset) - int(e.start_offset))
        sp.finish(int(e.restored or 0))
        row.held = False
        secs = float(e.seconds or 0.0)
        row.seconds = (row.seconds or 0.0) + secs
        if row.started is None or row.started > ts - secs:
            row.started = ts - secs
        row.reported_rate = e.rate_rps or row.reported_rate
        row.throttle = e.throttle_rps or row.throttle
        if row.promoted is None and e.source:
            row.source = str(e.source)   # the state layer's final word (scratch, checkpoint)
        row.samples.append((ts, row.restored))
    elif isinstance(e, ev.TaskOpened):
        replayed = int(e.restored or 0)
        row.replayed = replayed
        row.finished = ts
        for sp in row.stores.values():
            if not sp.done:   # a store whose end was not seen: what it read so far is all it read
                sp.finish(sp.restored)
        if row.promoted is None and e.source not in (None, "none"):
            row.source = str(e.source)
        read = any(sp.restored for sp in row.stores.values())
        if read or (replayed and not row.stores and row.promoted is None):
            row.status = "done"
            if row.seconds is None and row.started is not None:
                row.seconds = max(0.0, ts - row.started)
        elif row.promoted is not None:
            row.status = "promoted"
        else:
            row.status = "nothing"
    elif isinstance(e, ev.TaskFailed):
        if not row.final:
            row.status, row.finished = "failed", ts
            row.error = e.error
        elif row.status == "done":   # failed after its restore: the restore still ended when it did
            row.status, row.error = "failed", e.error
    elif isinstance(e, ev.TaskClosed):
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

    def _same_episode(self, cur: RestoreRound, e) -> bool:
        """A task queued by the same rebalance generation, or within `episode_gap` seconds after the
        round ended (a start or a restart rebalances once per instance), joins the round; the death
        of an instance never does."""
        if isinstance(e, ev.InstanceDied):
            return False   # a crash begins an episode (it carries the generation it ended)
        if e.generation is not None and e.generation in cur.generations:
            return True
        return cur.finished is not None and e.ts - cur.finished <= self.episode_gap

    def feed(self, e, forecast: Optional[dict] = None) -> Optional[RestoreRound]:
        """Apply one event; returns the round it opened, if it opened one (with `forecast`, the
        forecast made before it)."""
        if not isinstance(e, RESTORE_TYPES):
            return None
        opened = None
        cur = self.current
        if isinstance(e, ev.Rebalance):
            if cur is not None and (not cur.final or e.ts - cur.finished <= self.episode_gap):
                cur.feed(e)
            return None
        # a restore or a promotion nobody queued (an executor opens a task where Spark runs it)
        # is an episode too
        opens = isinstance(e, (ev.RestoreQueued, ev.StandbyPromoted, ev.RestoreStarted)) or (
            isinstance(e, ev.InstanceDied) and e.tasks)
        if opens and (cur is None or (cur.final and not self._same_episode(cur, e))):
            cur = opened = RestoreRound(e.ts, e.generation, forecast)
            self.rounds.append(cur)
            del self.rounds[:-self.keep]
        if cur is None:
            return None
        cur.feed(e)
        return opened
