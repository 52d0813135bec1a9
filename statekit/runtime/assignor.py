"""Who runs what: a high-availability task assignor in the manner of Kafka Streams'
``HighAvailabilityTaskAssignor``.

A pure function — ``assign(...)`` takes the tasks, the live instances, the previous assignment and how
far behind the changelog every local copy of every task is, and returns the next ``Assignment``. No
I/O, no clocks, no randomness: the same inputs give the same output.

1. *An ideal, balanced and sticky placement.* Every eligible instance (alive and not leaving) gets
   ``floor`` or ``ceil`` of tasks / instances. A task stays on its previous active instance while that
   one has room; otherwise it goes to the eligible instance with the freshest copy of its state that
   has room, else to the least loaded.
2. *Actives only move to caught-up copies.* A copy is caught up when it is within
   ``acceptable_recovery_lag`` records of the changelog end (the running active is caught up by
   definition). When a task's ideal instance is not caught up but some live instance is, the task stays
   (or goes) there and gets a **warmup replica** on its ideal instance: the old owner keeps processing
   while the warmup catches up, and a later, *probing* rebalance moves the task once it has. When no
   live copy is caught up (its owner died without a standby), the task goes to its ideal instance and
   restores there: waiting would not make any copy fresher.
3. *At most* ``max_warmup_replicas`` warmups at once; warmups already catching up keep their place.
4. *Standbys* (``standby_replicas`` per task) never share an instance with the task's active or its
   warmup: previous standby instances first (sticky), then other holders of state, then the least loaded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from statekit.contracts import TaskId

__all__ = ["Assignment", "TaskMove", "assign", "moves"]


@dataclass(frozen=True)
class Assignment:
    """One generation's assignment: ``active[task] = instance``; ``standbys`` and ``warmups`` map a
    task to a tuple of instances."""

    generation: int
    active: Mapping[TaskId, int]
    standbys: Mapping[TaskId, tuple] = field(default_factory=dict)
    warmups: Mapping[TaskId, tuple] = field(default_factory=dict)

    @property
    def tasks(self) -> list[TaskId]:
        return sorted(self.active)

    def active_tasks(self, instance: int) -> list[TaskId]:
        return sorted(t for t, i in self.active.items() if i == instance)

    def standby_tasks(self, instance: int) -> list[TaskId]:
        return sorted(t for t, insts in self.standbys.items() if instance in insts)

    def warmup_tasks(self, instance: int) -> list[TaskId]:
        return sorted(t for t, insts in self.warmups.items() if instance in insts)

    def for_instance(self, instance: int) -> dict:
        """What one instance is told: ``{"active": [...], "standby": [...], "warmup": [...]}``."""
        return {"active": [str(t) for t in self.active_tasks(instance)],
                "standby": [str(t) for t in self.standby_tasks(instance)],
                "warmup": [str(t) for t in self.warmup_tasks(instance)]}

    def roles(self, task: TaskId) -> list[tuple[int, str]]:
        """``[(instance, "active" | "standby" | "warmup")]`` for one task."""
        out = [(self.active[task], "active")]
        out.extend((i, "standby") for i in self.standbys.get(task, ()))
        out.extend((i, "warmup") for i in self.warmups.get(task, ()))
        return out

    def to_dict(self) -> dict:
        return {
            "generation": self.generation,
            "active": {str(t): i for t, i in sorted(self.active.items())},
            "standbys": {str(t): list(s) for t, s in sorted(self.standbys.items()) if s},
            "warmups": {str(t): list(s) for t, s in sorted(self.warmups.items()) if s},
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "Assignment":
        return cls(
            generation=int(d.get("generation", 0)),
            active={TaskId.parse(t): int(i) for t, i in d.get("active", {}).items()},
            standbys={TaskId.parse(t): tuple(int(x) for x in s) for t, s in d.get("standbys", {}).items()},
            warmups={TaskId.parse(t): tuple(int(x) for x in s) for t, s in d.get("warmups", {}).items()},
        )


@dataclass(frozen=True)
class TaskMove:
    """A task whose active instance changed between two generations."""

    task: TaskId
    source: Optional[int]
    dest: int
    reason: str   # owner-died | owner-leaving | warmup-caught-up | balance

    def to_dict(self) -> dict:
        return {"task": str(self.task), "from": self.source, "to": self.dest, "reason": self.reason}


def _lag_key(lag) -> tuple:
    return (1, 0) if lag is None else (0, lag)


def _capacities(n_tasks: int, instances: list[int], prev_load: Mapping[int, int]) -> dict:
    """floor or ceil of n_tasks / len(instances) each, the extra ones to the busiest before (sticky)."""
    if not instances:
        return {}
    base, extra = divmod(n_tasks, len(instances))
    order = sorted(instances, key=lambda i: (-prev_load.get(i, 0), i))
    return {i: base + (1 if k < extra else 0) for k, i in enumerate(order)}


def assign(
    tasks: Iterable[TaskId],
    instances: Iterable[int],
    *,
    previous: Optional[Assignment] = None,
    lags: Optional[Mapping[TaskId, Mapping[int, Optional[int]]]] = None,
    leaving: Iterable[int] = (),
    standby_replicas: int = 0,
    acceptable_recovery_lag: int = 10_000,
    max_warmup_replicas: int = 2,
    generation: Optional[int] = None,
) -> Assignment:
    """The next assignment (see the module docstring).

    ``instances``: the live instances. ``leaving``: live instances about to leave (they keep a task
    only while no caught-up copy exists elsewhere). ``lags[task][instance]``: records behind the
    changelog end of each live copy of the task's state (None: a copy of unknown freshness; the
    current active counts as 0 when given so)."""
    task_list = sorted(TaskId.parse(t) for t in tasks)
    alive = sorted(set(int(i) for i in instances))
    if not alive:
        raise ValueError("no live instance to assign tasks to")
    leaving = set(int(i) for i in leaving) & set(alive)
    eligible = [i for i in alive if i not in leaving] or alive
    lags = {t: {int(i): l for i, l in (lags or {}).get(t, {}).items() if int(i) in alive}
            for t in task_list}
    acceptable = max(0, int(acceptable_recovery_lag))
    caught = {t: {i for i, l in lags[t].items() if l is not None and l <= acceptable} for t in task_list}
    prev_active = dict(previous.active) if previous is not None else {}
    prev_load = {}
    for t, i in prev_active.items():
        prev_load[i] = prev_load.get(i, 0) + 1

    # 1. the ideal placement over the eligible instances
    cap = _capacities(len(task_list), eligible, prev_load)
    load = {i: 0 for i in eligible}
    ideal: dict[TaskId, int] = {}
    for t in task_list:
        p = prev_active.get(t)
        if p in load and load[p] < cap[p]:
            ideal[t] = p
            load[p] += 1
    for t in task_list:
        if t in ideal:
            continue
        holders = sorted((i for i in lags[t] if i in load and load[i] < cap[i]),
                         key=lambda i: (_lag_key(lags[t][i]), load[i], i))
        choice = holders[0] if holders else min(eligible, key=lambda i: (load[i] >= cap[i], load[i], i))
        ideal[t] = choice
        load[choice] += 1

    # 2. actives move only to caught-up copies; otherwise a warmup goes to the ideal instance
    active: dict[TaskId, int] = {}
    wants_warmup: list[TaskId] = []
    for t in task_list:
        d = ideal[t]
        if d in caught[t] or not caught[t]:
            active[t] = d
            continue
        p = prev_active.get(t)
        if p in caught[t]:
            active[t] = p
        else:
            act_load: dict[int, int] = {}
            for i in active.values():
                act_load[i] = act_load.get(i, 0) + 1
            active[t] = min(caught[t], key=lambda i: (_lag_key(lags[t][i]), act_load.get(i, 0), i))
        wants_warmup.append(t)

    # 3. warmups, bounded; the ones already catching up first
    budget = max(0, int(max_warmup_replicas))
    warmups: dict[TaskId, tuple] = {}
    prev_warm = dict(previous.warmups) if previous is not None else {}
    ordered = sorted(wants_warmup, key=lambda t: (ideal[t] not in prev_warm.get(t, ()), t))
    for t in ordered:
        if budget <= 0:
            break
        warmups[t] = (ideal[t],)
        budget -= 1

    # 4. standbys on other instances than the active and the warmup
    want = min(max(0, int(standby_replicas)), len(alive) - 1)
    standbys: dict[TaskId, tuple] = {t: () for t in task_list}
    if want > 0:
        total = {i: 0 for i in alive}
        for i in active.values():
            total[i] += 1
        sb_cap = math.ceil(len(task_list) * want / len(eligible))
        sb_load = {i: 0 for i in eligible}
        chosen: dict[TaskId, list[int]] = {t: [] for t in task_list}

        def ok(t, i):
            return (i in sb_load and i != active[t] and i not in warmups.get(t, ())
                    and i not in chosen[t] and sb_load[i] < sb_cap)

        def take(t, i):
            chosen[t].append(i)
            sb_load[i] += 1
            total[i] += 1

        if previous is not None:
            for t in task_list:
                for i in previous.standbys.get(t, ()):
                    if len(chosen[t]) < want and ok(t, i):
                        take(t, i)
        for t in task_list:
            for i in sorted(lags[t], key=lambda i: (_lag_key(lags[t][i]), sb_load.get(i, 0), i)):
                if len(chosen[t]) < want and ok(t, i):
                    take(t, i)
        for t in task_list:
            while len(chosen[t]) < want:
                cands = [i for i in eligible if i != active[t] and i not in warmups.get(t, ())
                         and i not in chosen[t]]
                if not cands:
                    break
                i = min(cands, key=lambda i: (sb_load[i] >= sb_cap, total[i], sb_load[i], i))
                take(t, i)
        standbys = {t: tuple(sorted(chosen[t])) for t in task_list}
    gen = (previous.generation + 1 if previous is not None else 1) if generation is None else generation
    return Assignment(generation=gen, active=active, standbys=standbys, warmups=warmups)


def moves(old: Optional[Assignment], new: Assignment, dead: Iterable[int] = (),
          leaving: Iterable[int] = ()) -> list[TaskMove]:
    """The tasks whose active instance changed, and why. A first assignment moves nothing."""
    if old is None:
        return []
    dead, leaving = set(dead), set(leaving)
    out = []
    for t in new.tasks:
        o, n = old.active.get(t), new.active[t]
        if o is None or o == n:
            continue
        if o in dead:
            reason = "owner-died"
        elif o in leaving:
            reason = "owner-leaving"
        elif n in old.warmups.get(t, ()):
            reason = "warmup-caught-up"
        else:
            reason = "balance"
        out.append(TaskMove(t, o, n, reason))
    return out
