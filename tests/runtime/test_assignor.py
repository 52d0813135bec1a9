"""The high-availability assignor: a pure function, tested without any broker, engine or process."""
from __future__ import annotations

import random

import pytest

from statekit.contracts import TaskId
from statekit.runtime.assignor import Assignment, TaskMove, assign, moves


def tasks(n, sub=0):
    return [TaskId(sub, p) for p in range(n)]


def counts(a: Assignment, instances):
    return {i: len(a.active_tasks(i)) for i in instances}


def running(a: Assignment, alive=None):
    """The lags a coordinator reports for a running assignment: actives 0, standbys 0."""
    lags = {}
    for t in a.tasks:
        for i, _role in a.roles(t):
            if alive is None or i in alive:
                lags.setdefault(t, {})[i] = 0
    return lags


def check_valid(a: Assignment, ts, alive, replicas, leaving=()):
    assert sorted(a.active) == sorted(ts)
    assert set(a.active.values()) <= set(alive)
    eligible = [i for i in alive if i not in leaving] or list(alive)
    for t in ts:
        sb = a.standbys.get(t, ())
        room = [i for i in eligible if i != a.active[t] and i not in a.warmups.get(t, ())]
        assert len(sb) == min(replicas, len(alive) - 1, len(room)), (t, sb, room)
        assert len(set(sb)) == len(sb)
        assert a.active[t] not in sb, f"task {t}: a standby on its own active instance"
        assert a.active[t] not in a.warmups.get(t, ()), f"task {t}: a warmup on its own active instance"
        assert not set(sb) & set(a.warmups.get(t, ())), f"task {t}: standby and warmup on one instance"
        assert set(sb) <= set(alive)


@pytest.mark.parametrize("n,instances", [(1, 1), (4, 1), (4, 2), (6, 4), (7, 3), (12, 5), (3, 5)])
def test_fresh_assignment_is_balanced(n, instances):
    a = assign(tasks(n), range(instances))
    c = counts(a, range(instances))
    assert max(c.values()) - min(c.values()) <= 1
    check_valid(a, tasks(n), range(instances), 0)
    assert a.generation == 1 and a.warmups == {}


def test_deterministic_and_generations_count_up():
    prev = assign(tasks(8), range(3), standby_replicas=1)
    a = assign(tasks(8), range(3), standby_replicas=1, previous=prev, lags=running(prev))
    assert a == assign(tasks(8), range(3), standby_replicas=1, previous=prev, lags=running(prev))
    assert a.generation == prev.generation + 1 == 2


@pytest.mark.parametrize("replicas", [0, 1, 2])
def test_sticky_when_nothing_changes(replicas):
    a = assign(tasks(8), range(3), standby_replicas=replicas)
    b = assign(tasks(8), range(3), standby_replicas=replicas, previous=a, lags=running(a))
    assert (b.active, b.standbys, b.warmups) == (a.active, a.standbys, {})
    assert moves(a, b) == []


def test_sticky_keeps_an_unusual_but_balanced_layout():
    t = tasks(4)
    prev = Assignment(1, active={t[0]: 1, t[1]: 0, t[2]: 1, t[3]: 0})
    assert assign(t, [0, 1], previous=prev, lags=running(prev)).active == prev.active


def test_standbys_never_with_their_active_and_spread_evenly():
    a = assign(tasks(6), range(3), standby_replicas=1)
    check_valid(a, tasks(6), range(3), 1)
    per = [len(a.standby_tasks(i)) for i in range(3)]
    assert max(per) - min(per) <= 1
    assert assign(tasks(4), [0], standby_replicas=2).standbys == {t: () for t in tasks(4)}


def test_a_dead_owner_fails_over_to_its_caught_up_standby():
    t = tasks(4)
    prev = assign(t, range(3), standby_replicas=1)
    dead = 0
    alive = [1, 2]
    new = assign(t, alive, previous=prev, lags=running(prev, alive), standby_replicas=1)
    for task in prev.active_tasks(dead):
        assert new.active[task] in prev.standbys[task], "the standby holder takes over"
    # balance comes back through warmups, never by moving a task to a cold copy
    assert all(i not in prev.standbys[x] for x, (i,) in new.warmups.items())
    mv = moves(prev, new, dead=[dead])
    assert {m.task for m in mv} == set(prev.active_tasks(dead))
    assert all(m.reason == "owner-died" and m.source == dead for m in mv)
    check_valid(new, t, alive, 1)


def test_without_any_copy_a_task_restores_on_its_ideal_instance_at_once():
    t = tasks(4)
    prev = assign(t, range(2))
    lost = prev.active_tasks(0)
    new = assign(t, [1, 2], previous=prev, lags={x: {1: 0} for x in prev.active_tasks(1)})
    for x in lost:
        assert new.active[x] in (1, 2)       # no caught-up copy anywhere: no reason to wait
    assert new.warmups == {}
    assert counts(new, [1, 2]) == {1: 2, 2: 2}


def test_a_new_instance_gets_warmups_before_any_task_moves():
    t = tasks(6)
    prev = assign(t, range(2), generation=4)
    new = assign(t, range(3), previous=prev, lags=running(prev), max_warmup_replicas=2)
    assert new.active == prev.active, "nothing moves to a cold instance"
    assert len(new.warmups) == 2 and all(v == (2,) for v in new.warmups.values())
    assert moves(prev, new) == []
    # the probing rebalance: the warmups are within the acceptable lag
    lags = running(new)
    for task in new.warmups:
        lags[task][2] = 5
    later = assign(t, range(3), previous=new, lags=lags, acceptable_recovery_lag=10)
    moved = moves(new, later)
    assert {m.task for m in moved} == set(new.warmups)
    assert all(m.dest == 2 and m.reason == "warmup-caught-up" for m in moved)
    assert counts(later, range(3)) == {0: 2, 1: 2, 2: 2}
    assert later.warmups == {}


def test_warmups_still_behind_keep_their_place_and_the_bound_holds():
    t = tasks(8)
    prev = assign(t, range(2))
    w1 = assign(t, range(4), previous=prev, lags=running(prev), max_warmup_replicas=1)
    assert len(w1.warmups) == 1
    lags = running(w1)
    (task, (inst,)), = w1.warmups.items()
    lags[task][inst] = 50_000                       # still far behind
    w2 = assign(t, range(4), previous=w1, lags=lags, max_warmup_replicas=1, acceptable_recovery_lag=100)
    assert w2.warmups == w1.warmups and w2.active == w1.active
    w3 = assign(t, range(4), previous=w1, lags=lags, max_warmup_replicas=0)
    assert w3.warmups == {} and w3.active == w1.active


def test_a_leaving_instance_keeps_its_tasks_until_a_copy_elsewhere_caught_up():
    t = tasks(4)
    prev = assign(t, range(2), standby_replicas=0)
    mine = prev.active_tasks(1)
    a = assign(t, range(2), previous=prev, lags=running(prev), leaving=[1])
    assert a.active == prev.active and set(a.warmups) == set(mine)
    assert all(v == (0,) for v in a.warmups.values())
    lags = running(a)
    b = assign(t, range(2), previous=a, lags=lags, leaving=[1])
    assert all(b.active[x] == 0 for x in t)
    assert {m.reason for m in moves(a, b, leaving=[1])} == {"owner-leaving"}


def test_move_reasons():
    t = tasks(3)
    old = Assignment(3, active={t[0]: 0, t[1]: 1, t[2]: 2}, warmups={t[1]: (0,)})
    new = Assignment(4, active={t[0]: 1, t[1]: 0, t[2]: 0})
    got = {m.task: m.reason for m in moves(old, new, dead=[2])}
    assert got == {t[0]: "balance", t[1]: "warmup-caught-up", t[2]: "owner-died"}
    assert moves(None, new) == []
    assert TaskMove(t[0], 0, 1, "balance").to_dict() == {"task": "0_0", "from": 0, "to": 1,
                                                         "reason": "balance"}


@pytest.mark.parametrize("seed", range(40))
def test_random_histories_stay_valid(seed):
    rnd = random.Random(seed)
    t = tasks(rnd.randint(1, 12)) + (tasks(rnd.randint(0, 4), sub=1))
    ids = list(range(rnd.randint(1, 5)))
    replicas = rnd.randint(0, 2)
    acceptable = rnd.choice([0, 10, 1000])
    a = assign(t, ids, standby_replicas=replicas)
    for _ in range(12):
        alive = sorted(rnd.sample(ids, rnd.randint(1, len(ids))))
        leaving = [i for i in alive if rnd.random() < 0.2][: len(alive) - 1]
        lags = {}
        for x in t:
            for i, role in a.roles(x):
                if i in alive and rnd.random() > 0.2:
                    lags.setdefault(x, {})[i] = 0 if role == "active" else rnd.choice([0, 5, 50, 5000, None])
        b = assign(t, alive, previous=a, lags=lags, leaving=leaving, standby_replicas=replicas,
                   acceptable_recovery_lag=acceptable, max_warmup_replicas=2)
        check_valid(b, t, alive, replicas, leaving)
        assert len(b.warmups) <= 2
        caught = {x: {i for i, l in lags.get(x, {}).items() if l is not None and l <= acceptable}
                  for x in t}
        for x in t:
            # an active goes only where a caught-up copy is, unless none exists at all
            if caught[x]:
                assert b.active[x] in caught[x], (x, b.active[x], lags.get(x))
        assert b.generation == a.generation + 1
        a = b


def test_round_trip_dict():
    a = assign(tasks(5) + tasks(2, sub=1), range(3), standby_replicas=1)
    assert Assignment.from_dict(a.to_dict()) == Assignment(
        a.generation, a.active, {k: v for k, v in a.standbys.items() if v}, a.warmups)
    assert a.for_instance(0)["active"] == [str(x) for x in a.active_tasks(0)]


def test_lag_of_a_copy_whose_position_is_not_reported_yet_is_unknown(tmp_path):
    """A task just assigned (a promoted standby, a new owner) has no position in its instance's
    status yet and no checkpoint: its lag is unknown, not the whole changelog (a dashboard drew
    that as a 250k spike for a promotion that replayed nothing)."""
    from types import SimpleNamespace

    from statekit.contracts import Layout, TaskId
    from statekit.runtime.lag import lag_rows
    from statekit.stores import StoreSpec

    plan = SimpleNamespace(stores=[StoreSpec("counts")], needs_task_store=False)
    a = Assignment(generation=2, active={TaskId(0, 0): 1, TaskId(0, 1): 1})
    statuses = {1: {"tasks": {"0_0": {"state": "running", "positions": {"counts": 40}},
                              "0_1": {"state": "restoring"}}}}
    kafka = SimpleNamespace(end_offsets=lambda topic: {0: 50, 1: 250_000})
    rows = {r["task"]: r for r in lag_rows("a", a, statuses, {0: plan}, kafka, Layout(str(tmp_path), "a"))}
    assert (rows["0_0"]["checkpoint_offset"], rows["0_0"]["lag"]) == (40, 10)
    assert (rows["0_1"]["checkpoint_offset"], rows["0_1"]["changelog_end"], rows["0_1"]["lag"]) == (None, 250_000, None)
