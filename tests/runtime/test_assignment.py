"""Sticky task assignment: a pure function, tested without any broker or engine."""
from __future__ import annotations

import random

import pytest

from statekit.runtime.assignment import Assignment, assign, moves


def counts(a: Assignment, instances):
    return {i: len(a.active_tasks(i)) for i in instances}


def check_valid(a: Assignment, tasks, alive, replicas):
    assert sorted(a.active) == sorted(tasks)
    assert set(a.active.values()) <= set(alive)
    want = min(replicas, len(alive) - 1)
    for t in tasks:
        sb = a.standbys.get(t, ())
        assert len(sb) == want
        assert len(set(sb)) == len(sb)
        assert a.active[t] not in sb, f"task {t}: a standby on its own active instance"
        assert set(sb) <= set(alive)


@pytest.mark.parametrize("tasks,instances", [(1, 1), (4, 1), (4, 2), (6, 4), (7, 3), (12, 5), (3, 5)])
def test_fresh_assignment_is_balanced(tasks, instances):
    a = assign(tasks, instances)
    c = counts(a, range(instances))
    assert max(c.values()) - min(c.values()) <= 1
    check_valid(a, range(tasks), range(instances), 0)


def test_deterministic():
    prev = assign(8, 3, standby_replicas=1)
    assert assign(8, 3, 1, previous=prev) == assign(8, 3, 1, previous=prev)


@pytest.mark.parametrize("replicas", [0, 1, 2])
def test_sticky_when_nothing_changes(replicas):
    a = assign(8, 3, standby_replicas=replicas)
    b = assign(8, 3, standby_replicas=replicas, previous=a)
    assert b == a
    # and with the state on disk reported explicitly
    state = {t: [a.active[t], *a.standbys[t]] for t in range(8)}
    assert assign(8, 3, standby_replicas=replicas, previous=a, state=state) == a


def test_sticky_keeps_an_unusual_but_balanced_layout():
    prev = Assignment(active={0: 1, 1: 0, 2: 1, 3: 0}, standbys={t: () for t in range(4)})
    assert assign(4, 2, previous=prev).active == prev.active


def test_rebalance_moves_only_the_excess_when_an_instance_joins():
    prev = assign(6, 2)
    new = assign(6, 3, previous=prev, state={t: [prev.active[t]] for t in range(6)})
    # state holders are all full or preferred, so balance waits for warm-up... with no standby state
    # the new instance only gets tasks when an old one is over its share
    kept = sum(1 for t in range(6) if new.active[t] == prev.active[t])
    assert kept >= 4
    # without state reports (fresh instance 2 just joined and old dirs assumed), move at most the excess
    new2 = assign(6, 3, previous=prev, state={})
    assert max(counts(new2, range(3)).values()) - min(counts(new2, range(3)).values()) <= 1


@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("tasks,instances", [(4, 2), (6, 3), (8, 4), (5, 3), (2, 4)])
def test_standbys_never_with_their_active(tasks, instances, replicas):
    a = assign(tasks, instances, standby_replicas=replicas)
    check_valid(a, range(tasks), range(instances), replicas)


def test_standbys_spread_evenly():
    a = assign(8, 4, standby_replicas=1)
    sb_counts = {i: len(a.standby_tasks(i)) for i in range(4)}
    assert max(sb_counts.values()) - min(sb_counts.values()) <= 1


def test_single_instance_gets_no_standbys():
    a = assign(4, 1, standby_replicas=2)
    assert all(s == () for s in a.standbys.values())


def test_failover_prefers_the_standby_holder_when_an_instance_is_gone():
    prev = assign(6, 3, standby_replicas=1)
    dead = 0
    lost = prev.active_tasks(dead)
    alive = [1, 2]
    state = {t: [i for i in [prev.active[t], *prev.standbys[t]] if i != dead] for t in range(6)}
    new = assign(6, alive, standby_replicas=1, previous=prev, state=state)
    check_valid(new, range(6), alive, 1)
    for t in lost:
        assert new.active[t] == prev.standbys[t][0], f"task {t} did not go to its standby"
    # tasks on surviving instances did not move
    for t in range(6):
        if prev.active[t] != dead:
            assert new.active[t] == prev.active[t]
    assert {m.task: m.reason for m in moves(prev, new, state)}[lost[0]] == "standby"


def test_disk_loss_failover_moves_to_the_standby_even_above_the_even_share():
    # 2 instances, 4 tasks, 1 standby: instance 0 loses its disk and comes back empty.
    prev = assign(4, 2, standby_replicas=1)
    lost = prev.active_tasks(0)
    assert len(lost) == 2 and prev.standby_tasks(1) == lost
    state = {t: [i for i in [prev.active[t], *prev.standbys[t]] if i != 0] for t in range(4)}
    new = assign(4, 2, standby_replicas=1, previous=prev, state=state)
    check_valid(new, range(4), [0, 1], 1)
    assert new.active_tasks(1) == [0, 1, 2, 3]  # the promoted standbys replay only their lag
    assert new.standby_tasks(0) == [0, 1, 2, 3]  # the empty instance warms up as the standby
    assert {m.reason for m in moves(prev, new, state) if m.task in lost} == {"standby"}
    # next rebalance, once instance 0 holds caught-up standbys, restores the balance
    state2 = {t: {0: 0, 1: 0} for t in range(4)}
    again = assign(4, 2, standby_replicas=1, previous=new, state=state2)
    assert counts(again, [0, 1]) == {0: 2, 1: 2}
    check_valid(again, range(4), [0, 1], 1)


def test_failover_prefers_the_least_lagging_holder():
    prev = Assignment(active={0: 0}, standbys={0: (1, 2)})
    new = assign([0], [1, 2], standby_replicas=1, previous=prev, state={0: {1: 50, 2: 3}})
    assert new.active[0] == 2
    assert new.standbys[0] == (1,)


def test_disk_loss_without_standby_restores_in_place():
    prev = assign(4, 2)
    state = {t: [prev.active[t]] for t in range(4) if prev.active[t] != 0}
    new = assign(4, 2, previous=prev, state=state)
    assert new == Assignment(active=prev.active, standbys=prev.standbys)
    assert {m.reason for m in moves(prev, new, state) if m.new_active == 0} == {"fresh"}


def test_process_crash_keeps_everything():
    prev = assign(6, 3, standby_replicas=2)
    state = {t: [prev.active[t], *prev.standbys[t]] for t in range(6)}
    assert assign(6, 3, standby_replicas=2, previous=prev, state=state) == prev


def test_old_state_directory_counts_as_a_holder():
    # task 3 once ran on instance 2 and its directory is still there
    prev = Assignment(active={0: 0, 1: 1, 2: 2, 3: 0}, standbys={})
    state = {0: [0], 1: [1], 2: [2], 3: [2]}
    new = assign(4, [1, 2], previous=prev, state=state)
    assert new.active[3] == 2


@pytest.mark.parametrize("seed", range(30))
def test_random_histories_stay_valid_and_sticky(seed):
    rnd = random.Random(seed)
    tasks = rnd.randint(1, 12)
    n = rnd.randint(1, 5)
    replicas = rnd.randint(0, 2)
    a = assign(tasks, n, replicas)
    for _ in range(10):
        alive = sorted(rnd.sample(range(n), rnd.randint(1, n)))
        state = {t: [i for i in [a.active[t], *a.standbys.get(t, ())] if i in alive and rnd.random() > 0.2]
                 for t in range(tasks)}
        b = assign(tasks, alive, replicas, previous=a, state=state)
        check_valid(b, range(tasks), alive, replicas)
        cap = -(-tasks // len(alive))
        for t in range(tasks):
            p = a.active[t]
            # a task whose active is alive, holds its state and is within its fair share never moves
            if p in alive and p in state[t] and len(a.active_tasks(p)) <= cap:
                assert b.active[t] == p
            # a task with a holder goes to a holder
            if state[t]:
                assert b.active[t] in state[t]
        a = b


def test_round_trip_dict():
    a = assign(5, 3, 1)
    assert Assignment.from_dict(a.to_dict()) == a
