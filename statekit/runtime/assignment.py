"""Sticky task assignment, shaped like Kafka Streams' StickyTaskAssignor / HighAvailabilityTaskAssignor.

A pure function: ``assign(...)`` takes the number of tasks, the live instances, the previous
assignment and which instances hold a local copy of each task's state, and returns a new
:class:`Assignment`. No I/O, no clocks, no randomness: the same inputs give the same output.

Rules, in order of priority:

1. *Actives stay where their state is.* A task keeps its previous active instance when that
   instance is alive, still holds the task's state and is under its even share
   (``ceil(tasks / instances)``).
2. *Failover prefers state holders.* A task that must move goes to an alive instance that holds its
   state (a standby replica, or an old state directory), the least lagging first, then the least
   loaded. Among holders, one under its even share wins; when every holder is full the task still
   goes to a holder (a promoted standby replays only its lag; a fresh instance would replay the whole
   changelog), which may leave the assignment uneven until the next rebalance, when the other
   instance's standby has caught up (Kafka Streams does the same with warm-up replicas and probing
   rebalances).
3. *Otherwise balance.* A task with no state anywhere goes to the least loaded instance (ties: the
   lowest instance id).
4. *Standbys are never placed with their active.* Each task gets ``min(standby_replicas, instances -
   1)`` standbys on distinct instances other than its active: previous standbys and other state
   holders first (sticky), then the least loaded instances (actives + standbys).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

__all__ = ["Assignment", "assign", "TaskMove"]


@dataclass(frozen=True)
class Assignment:
    """Who runs what. ``active[task] = instance``; ``standbys[task] = (instance, ...)``."""

    active: Mapping[int, int]
    standbys: Mapping[int, tuple] = field(default_factory=dict)

    @property
    def tasks(self) -> list[int]:
        return sorted(self.active)

    def active_tasks(self, instance: int) -> list[int]:
        return sorted(t for t, i in self.active.items() if i == instance)

    def standby_tasks(self, instance: int) -> list[int]:
        return sorted(t for t, insts in self.standbys.items() if instance in insts)

    def instances_of(self, task: int) -> list[tuple[int, str]]:
        """``[(instance, "active"), (instance, "standby"), ...]`` for one task."""
        out = [(self.active[task], "active")]
        out.extend((i, "standby") for i in self.standbys.get(task, ()))
        return out

    def instances(self) -> list[int]:
        seen = set(self.active.values())
        for insts in self.standbys.values():
            seen.update(insts)
        return sorted(seen)

    def to_dict(self) -> dict:
        return {
            "active": {str(t): i for t, i in sorted(self.active.items())},
            "standbys": {str(t): list(s) for t, s in sorted(self.standbys.items())},
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "Assignment":
        return cls(
            active={int(t): int(i) for t, i in d.get("active", {}).items()},
            standbys={int(t): tuple(int(x) for x in s) for t, s in d.get("standbys", {}).items()},
        )


@dataclass(frozen=True)
class TaskMove:
    """One task's change between two assignments (for the notebook and the restart summary)."""

    task: int
    old_active: Optional[int]
    new_active: int
    reason: str  # "sticky" | "standby" | "state" | "fresh"


def _norm_state(state, tasks, alive, previous):
    """task -> {instance: lag} for alive instances holding state; lag None = unknown."""
    holders: dict[int, dict[int, Optional[int]]] = {t: {} for t in tasks}
    if state is None:
        # Without a report from disk, assume the previous owners still hold their copies.
        if previous is not None:
            for t in tasks:
                if t in previous.active and previous.active[t] in alive:
                    holders[t][previous.active[t]] = None
                for i in previous.standbys.get(t, ()):
                    if i in alive:
                        holders[t].setdefault(i, None)
        return holders
    for t in tasks:
        got = state.get(t, {})
        if isinstance(got, Mapping):
            items = got.items()
        else:  # an iterable of instances
            items = ((i, None) for i in got)
        for i, lag in items:
            if i in alive:
                holders[t][i] = lag
    return holders


def _lag_key(lag):
    return (1, 0) if lag is None else (0, lag)


def assign(
    tasks: int | Iterable[int],
    instances: int | Iterable[int],
    standby_replicas: int = 0,
    previous: Optional[Assignment] = None,
    state: Optional[Mapping[int, object]] = None,
) -> Assignment:
    """Assign ``tasks`` to the alive ``instances``.

    tasks: a count (tasks ``0..n-1``) or an iterable of task ids.
    instances: a count (instances ``0..n-1``) or an iterable of *alive* instance ids.
    standby_replicas: standbys wanted per task (capped at ``len(instances) - 1``).
    previous: the last assignment, for stickiness.
    state: ``{task: {instance: lag_or_None}}`` (or ``{task: [instance, ...]}``): which instances hold a
      local copy of the task's state right now, and how far behind the changelog end it is. When
      ``None`` the previous active and standby instances are assumed to hold it.
    """
    task_list = sorted(range(tasks) if isinstance(tasks, int) else set(tasks))
    alive = sorted(range(instances) if isinstance(instances, int) else set(instances))
    if not alive:
        raise ValueError("no alive instance to assign tasks to")
    alive_set = set(alive)
    holders = _norm_state(state, task_list, alive_set, previous)

    capacity = math.ceil(len(task_list) / len(alive)) if task_list else 0
    load = {i: 0 for i in alive}
    active: dict[int, int] = {}

    # 1. sticky: previous active, alive, still holding state, under the even share
    if previous is not None:
        for t in task_list:
            p = previous.active.get(t)
            if p in alive_set and p in holders[t] and load[p] < capacity:
                active[t] = p
                load[p] += 1

    # 2. failover to state holders (previous standbys / old directories), least lag then least load
    for t in task_list:
        if t in active or not holders[t]:
            continue
        ranked = sorted(holders[t], key=lambda i: (_lag_key(holders[t][i]), load[i], i))
        under = [i for i in ranked if load[i] < capacity]
        choice = under[0] if under else ranked[0]
        active[t] = choice
        load[choice] += 1

    # 3. no state anywhere: least loaded
    for t in task_list:
        if t in active:
            continue
        choice = min(alive, key=lambda i: (load[i], i))
        active[t] = choice
        load[choice] += 1

    # 4. standbys
    want = min(max(0, int(standby_replicas)), len(alive) - 1)
    standbys: dict[int, tuple] = {}
    if want > 0:
        sb_capacity = math.ceil(len(task_list) * want / len(alive))
        sb_load = {i: 0 for i in alive}
        total = dict(load)  # actives + standbys
        chosen: dict[int, list[int]] = {t: [] for t in task_list}
        # sticky pass: previous standbys that still hold state
        if previous is not None:
            for t in task_list:
                for i in previous.standbys.get(t, ()):
                    if (len(chosen[t]) < want and i in alive_set and i != active[t]
                            and i in holders[t] and i not in chosen[t] and sb_load[i] < sb_capacity):
                        chosen[t].append(i)
                        sb_load[i] += 1
                        total[i] += 1
        # other state holders (e.g. the old active whose task moved), least lag first
        for t in task_list:
            ranked = sorted(holders[t], key=lambda i: (_lag_key(holders[t][i]), sb_load[i], i))
            for i in ranked:
                if len(chosen[t]) >= want:
                    break
                if i != active[t] and i not in chosen[t] and sb_load[i] < sb_capacity:
                    chosen[t].append(i)
                    sb_load[i] += 1
                    total[i] += 1
        # fill up with the least loaded instances
        for t in task_list:
            while len(chosen[t]) < want:
                cands = [i for i in alive if i != active[t] and i not in chosen[t]]
                i = min(cands, key=lambda i: (sb_load[i] >= sb_capacity, total[i], sb_load[i], i))
                chosen[t].append(i)
                sb_load[i] += 1
                total[i] += 1
        standbys = {t: tuple(sorted(chosen[t])) for t in task_list}
    else:
        standbys = {t: () for t in task_list}
    return Assignment(active=active, standbys=standbys)


def moves(old: Optional[Assignment], new: Assignment,
          state: Optional[Mapping[int, object]] = None) -> list[TaskMove]:
    """Explain, per task, where its active came from."""
    out = []
    for t in new.tasks:
        o = old.active.get(t) if old is not None else None
        n = new.active[t]
        held = state.get(t, {}) if state is not None else {}
        held = set(held) if not isinstance(held, Mapping) else set(held.keys())
        if o == n and (state is None or n in held):
            reason = "sticky"
        elif old is not None and n in old.standbys.get(t, ()) and (state is None or n in held):
            reason = "standby"
        elif n in held:
            reason = "state"
        else:
            reason = "fresh"
        out.append(TaskMove(task=t, old_active=o, new_active=n, reason=reason))
    return out
