"""Interactive queries while a store restores (issue 19), on real instance processes: a disk-loss
restore from scratch, a promoted standby with lag, a dead owner with and without a copy, a move
through a warmup. In each, a ``stale=False`` query returns the committed value or raises one
``StaleRead`` line naming the task, its state and its lag — never a missing or older value — and a
``stale=True`` answer says which copy it came from and how far behind it is."""
from __future__ import annotations

import time

import pytest

import statekit
from statekit.contracts import TaskId
from statekit.errors import StaleRead
from statekit.partition import partition_for
from statekit.runtime.copies import Answer
from statekit.runtime.lifecycle import AppState

KEYS_PER_ROUND = 1200


def wordcount(broker, tmp_path, name, **kw):
    app = statekit.App(name, bootstrap=broker.bootstrap, state_dir=str(tmp_path / "st"),
                       engine="local", **kw)
    app.stream("lines").group_by_key().count(store="counts")
    return app


def produce_round(kafka, parts: int, keys: int = KEYS_PER_ROUND) -> None:
    """Every key ``k0..`` once, in its own partition (a task reads its own partition)."""
    by_p: dict = {}
    for i in range(keys):
        k = f"k{i}".encode()
        by_p.setdefault(partition_for(k, parts), []).append((k, b"x"))
    for p, recs in sorted(by_p.items()):
        kafka.send("lines", p, recs)


def rounds(app, kafka, n: int, parts: int) -> None:
    """``n`` rounds, each processed and committed before the next (a changelog of many commits)."""
    for _ in range(n):
        produce_round(kafka, parts)
        assert app.process_all_available(timeout=120)


def wait_for(pred, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def check_refusal(e: StaleRead, task, states) -> None:
    msg = str(e)
    assert "\n" not in msg and f"task {task}" in msg and "behind" in msg, msg
    assert e.task == task and e.state in states and e.state in msg, (e.state, msg)
    assert e.lag is not None and e.lag > 0, msg
    assert f"{e.lag:,} changelog records" in msg, msg


def poll_until_current(app, key, want, states, timeout=90, extra=None) -> dict:
    """Query ``key`` until a stale=False read (wait=0) answers. Every answer is ``want``; every
    refusal is one StaleRead line in one of ``states``; every stale=True answer that is not
    current says so (a lag > 0), one that is current is ``want``. Returns what was seen."""
    task = app.key_owner("counts", key).task
    seen = {"refused": [], "stale": [], "current": 0}
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"no current answer in {timeout} s: {seen['refused'][-1:]}"
        try:
            got = app.query("counts", key, wait=0)
        except StaleRead as e:
            check_refusal(e, task, states)
            seen["refused"].append(e)
        else:
            assert got == want, (got, want)
            seen["current"] += 1
            return seen
        try:
            a = app.query("counts", key, stale=True, with_lag=True)
        except StaleRead as e:   # no copy at all to read yet
            check_refusal(e, task, states)
            assert "no copy to read yet" in str(e)
        else:
            assert isinstance(a, Answer) and a.copy.task == task
            if a.current:
                assert a.value == want and a.lag == 0, a
            else:
                # an older count (or the same, when the commits it lacks left this key alone),
                # said to be older
                assert a.lag > 0 and a.copy.offset < a.copy.end, a
                assert a.value is None or a.value <= want, a
                seen["stale"].append(a)
        if extra is not None:
            extra(seen)
        time.sleep(0.05)


def test_disk_loss_restore_from_scratch(broker, own_kafka, tmp_path):
    own_kafka.ensure_topic("lines", 2)
    app = wordcount(broker, tmp_path, "qdl", partitions=2, instances=2, restore_rate=1500)
    try:
        app.start()
        rounds(app, own_kafka, 4, 2)
        key = "k7"
        owner = app.key_owner("counts", key)
        assert (owner.role, owner.state, owner.lag, owner.lag_s) == ("active", "running", 0, 0.0)
        assert owner.offset == owner.end > KEYS_PER_ROUND
        assert app.query("counts", key, with_lag=True).value == 4
        other = next(t for t in app.assignment.tasks if t != owner.task)
        frames = []

        def whole_store(seen):   # once, mid-restore: the whole store with its copies' marks
            if frames or not seen["refused"]:
                return
            try:
                app.query_all("counts", wait=0)
            except StaleRead as e:
                check_refusal(e, owner.task, ("moving", "restoring"))
            else:
                return   # restored meanwhile
            try:
                df = app.query_all("counts", stale=True)
            except StaleRead as e:   # the new owner has no copy to read yet: the next poll
                check_refusal(e, owner.task, ("moving", "restoring"))
                assert "no copy to read yet" in str(e)
                return
            if not df.attrs["copies"][str(owner.task)].current:
                frames.append(df)

        app.crash("disk-loss", instance=owner.instance)
        seen = poll_until_current(app, key, 4, ("moving", "restoring"), extra=whole_store)
        assert any(e.state == "restoring" and "from scratch" in str(e) for e in seen["refused"])
        assert any(a.copy.state == "restoring" and a.copy.lag_s is not None for a in seen["stale"])
        # the restoring task's rows are marked, the other task's are current
        assert frames, "the whole store was never read during the restore"
        df = frames[0]
        copies = df.attrs["copies"]
        assert copies[str(other)].current and not copies[str(owner.task)].current
        assert copies[str(owner.task)].lag > 0
        mine = df[df.task == str(owner.task)]
        assert (mine.lag > 0).all() and set(mine.state) <= {"moving", "restoring"}
        theirs = df[df.task == str(other)]
        assert len(theirs) and (theirs.lag == 0).all() and set(theirs.state) == {"running"}
        assert set(theirs.value) == {4}
        # once restored: every key, exactly
        assert app.query("counts", key, wait=30) == 4
        whole = app.query_all("counts")
        assert list(whole.columns) == ["key", "value", "task", "instance"]
        assert dict(zip(whole.key, whole.value)) == {f"k{i}": 4 for i in range(KEYS_PER_ROUND)}
        assert all(c.current for c in whole.attrs["copies"].values())
    finally:
        app.stop()


def test_promoted_standby_with_lag(broker, own_kafka, tmp_path):
    own_kafka.ensure_topic("lines", 2)
    app = wordcount(broker, tmp_path, "qsb", partitions=2, instances=2, standby_replicas=1,
                    restore_rate=1000)
    try:
        app.start()
        rounds(app, own_kafka, 2, 2)
        key = "k3"
        wait_for(lambda: all(o.lag == 0 for o in app.key_owners("counts", key)), 30,
                 "the standby to catch up")
        app.pause_standbys()
        rounds(app, own_kafka, 3, 2)
        active, standby = app.key_owners("counts", key)
        assert (active.role, active.state, active.lag) == ("active", "running", 0)
        assert (standby.role, standby.state) == ("standby", "paused") and standby.lag > 0
        assert standby.offset + standby.lag == standby.end == active.offset
        # stale=True reads the freshest copy: the active, not the lagging standby
        a = app.query("counts", key, stale=True, with_lag=True)
        assert (a.value, a.role, a.copy.instance, a.current) == (5, "active", active.instance, True)
        app.kill(active.instance)
        seen = poll_until_current(app, key, 5, ("moving", "restoring"))
        assert any(e.state == "restoring" and "promoted standby" in str(e)
                   for e in seen["refused"]), [str(e) for e in seen["refused"]]
        # the standby's copy, read while it replayed its lag: an older count, said so
        assert seen["stale"] and all(s.copy.instance == standby.instance for s in seen["stale"])
        assert {s.value for s in seen["stale"]} <= {2, 3, 4}
        opened = app.wait_for_event(lambda e: e.type == "task_opened" and e.task == str(active.task)
                                    and e.instance == standby.instance, 30)
        assert opened is not None and opened.source == "standby"
        assert app.query("counts", key, wait=30) == 5
    finally:
        app.stop()


def test_dead_owner_with_and_without_a_copy(broker, own_kafka, tmp_path):
    own_kafka.ensure_topic("lines", 2)
    app = wordcount(broker, tmp_path, "qdo", partitions=2, instances=1)
    try:
        app.start()
        rounds(app, own_kafka, 3, 2)
        key = "k5"
        task = app.key_owner("counts", key).task
        # the only instance dies, its disk kept: that copy still holds every commit, and says so
        app.crash("process")
        wait_for(lambda: app.state == AppState.ERROR, 30, "ERROR")
        owner = app.key_owner("counts", key)
        assert (owner.state, owner.lag) == ("dead", 0)
        assert app.query("counts", key) == 3
        app.restart(wait=True)
        # now with its disk: nothing to read anywhere, and waiting cannot help (no live instance)
        app.crash("disk-loss")
        wait_for(lambda: app.state == AppState.ERROR, 30, "ERROR")
        t0 = time.monotonic()
        with pytest.raises(StaleRead) as ei:
            app.query("counts", key)           # the default wait: refused at once, not after 5 s
        assert time.monotonic() - t0 < 2.0
        check_refusal(ei.value, task, ("owner dead",))
        assert "no instance is alive" in str(ei.value) and "revive()" in str(ei.value)
        with pytest.raises(StaleRead) as ei:
            app.query("counts", key, stale=True)
        assert "no copy to read yet" in str(ei.value) and ei.value.state == "owner dead"
        t0 = time.monotonic()
        with pytest.raises(StaleRead):       # waiting for a copy to appear cannot help either
            app.query("counts", key, stale=True, wait=30)
        assert time.monotonic() - t0 < 2.0
        owner = app.key_owner("counts", key)
        assert (owner.state, owner.offset) == ("dead", None) and owner.lag == owner.end > 0
        app.restart(restore_rate=1000)
        seen = poll_until_current(app, key, 3, ("moving", "restoring", "owner dead"))
        assert any(e.state == "restoring" for e in seen["refused"])
        assert app.query_all("counts").value.tolist() == [3] * KEYS_PER_ROUND
    finally:
        app.stop()


def test_a_move_through_a_warmup(broker, own_kafka, tmp_path):
    own_kafka.ensure_topic("lines", 2)
    # the probe that moves the task comes 4 s after the warmup starts: time to pause it and make
    # it lag; any lag is acceptable, so the move then replays that lag at restore_rate
    app = wordcount(broker, tmp_path, "qwm", partitions=2, instances=1, restore_rate=1000,
                    acceptable_recovery_lag=1_000_000, probing_rebalance_interval=4.0,
                    max_warmup_replicas=1)
    try:
        app.start()
        rounds(app, own_kafka, 2, 2)
        new = app.add_instance()
        (task, (dest,)), = app.assignment.warmups.items()
        assert dest == new and app.assignment.active[task] == 0
        key = next(f"k{i}" for i in range(100)
                   if TaskId(0, partition_for(f"k{i}".encode(), 2)) == task)
        app.pause_standbys(new)
        rounds(app, own_kafka, 3, 2)
        assert new not in app.assignment.active.values(), "the probe came too early"
        active, warm = app.key_owners("counts", key)
        assert (active.role, active.instance, active.lag) == ("active", 0, 0)
        assert (warm.role, warm.instance, warm.state) == ("warmup", new, "paused") and warm.lag > 0
        # while the warmup lags, the active answers, current
        a = app.query("counts", key, with_lag=True)
        assert (a.value, a.role, a.current) == (5, "active", True)
        seen = poll_until_current_after_move(app, key, task, new)
        assert any(e.state == "restoring" and "promoted warmup" in str(e) for e in seen["refused"])
        opened = app.wait_for_event(lambda e: e.type == "task_opened" and e.task == str(task)
                                    and e.instance == new, 30)
        assert opened is not None and opened.source == "warmup" and opened.restored > 0
        assert app.query("counts", key, wait=30) == 5
    finally:
        app.stop()


def poll_until_current_after_move(app, key, task, new) -> dict:
    """Before the move every stale=False read answers 5; after it, 5 or a refusal."""
    deadline = time.monotonic() + 60
    while new not in app.assignment.active.values() or app.assignment.active[task] != new:
        assert time.monotonic() < deadline, "the warmup never took the task over"
        try:
            assert app.query("counts", key, wait=0) == 5
        except StaleRead as e:   # the move happened between the check above and this read
            check_refusal(e, task, ("moving", "restoring"))
        time.sleep(0.05)
    return poll_until_current(app, key, 5, ("moving", "restoring"))
