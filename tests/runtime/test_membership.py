"""Instances that live and die on their own (issue 10), on the local engine with real instance
processes: a kill mid-batch while records flow (the survivors keep committing), warmups before a
task moves to a new instance, a graceful leave, scaling, and every bad membership call refused."""
from __future__ import annotations

import collections
import threading
import time

import pytest

import statekit
from statekit.contracts import TaskId
from statekit.errors import StatekitError
from statekit.runtime.lifecycle import AppState
from waiting import wait_until

WORDS = ["the", "state", "kafka", "stream", "store", "task", "log", "commit", "crash", "replay",
         "standby", "window", "alpha", "beta", "gamma", "delta"]


def wordcount(broker, tmp_path, name, **kw):
    app = statekit.App(name, bootstrap=broker.bootstrap, state_dir=str(tmp_path / "st"), engine="local",
                       **kw)
    (app.stream("lines").group_by_key().count(store="counts")
     .to_stream().to("out", value_serde="int64"))
    return app


class Feeder:
    """Sends seeded lines to `lines` from a thread until stopped, each word a record keyed by the
    word in its key's partition (a task reads its own partition); remembers what it sent."""

    def __init__(self, kafka, seed=1, every=0.01):
        import random

        self.kafka, self.rnd, self.every = kafka, random.Random(seed), every
        self.sent = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from statekit.partition import partition_for

        parts = len(self.kafka.end_offsets("lines"))
        while not self._stop.is_set():
            line = " ".join(self.rnd.choice(WORDS) for _ in range(self.rnd.randint(2, 8)))
            by_p: dict = {}
            for w in line.split():
                by_p.setdefault(partition_for(w.encode(), parts), []).append((w.encode(), w.encode()))
            for p, recs in sorted(by_p.items()):
                self.kafka.send("lines", p, recs)
            self.sent.append(line)
            time.sleep(self.every)  # pacing: records keep arriving while instances come and go

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def reference(lines):
    return dict(collections.Counter(w for ln in lines for w in ln.split()))


def counts(app):
    return app.query_all("counts").set_index("key")["value"].to_dict()


def check_output(app, want):
    df = app.output()
    assert not df.duplicated(["batch", "task", "key"]).any()
    last = {}
    for k, v in zip(df.key, df.value):
        assert v > last.get(k, 0)
        last[k] = v
    assert last == want


@pytest.mark.parametrize("mode", ["process", "disk-loss"])
def test_kill_one_of_three_mid_batch_and_the_others_keep_committing(broker, own_kafka, tmp_path, mode):
    own_kafka.ensure_topic("lines", 6)
    app = wordcount(broker, tmp_path, f"k3{mode[0]}", partitions=6, instances=3, restore_rate=400)
    states = []
    app.on_event(lambda e: states.append(e.state) if e.type == "state" else None)
    try:
        app.start()
        with Feeder(own_kafka) as feed:
            wait_until(lambda: app.state == AppState.RUNNING and len(feed.sent) > 150, 60, "warm-up")
            victim = 1
            moved = {str(t) for t in app.assignment.active_tasks(victim)}
            # what the victim's tasks had committed before the crash was armed: a restore from
            # scratch reads from the changelog's start to at least this (the log's later
            # compaction may drop records from the count, never from this range)
            topic = app.changelog_topic("counts")
            committed = own_kafka.end_offsets(topic, isolation="read_committed")
            before = {t: committed[TaskId.parse(t).partition] for t in moved}
            assert all(before.values()), before
            rec = app.crash(mode, instance=victim, after_records=3)   # dies in the middle of a batch
            died = wait_until(lambda: app.wait_for_event(lambda e: e.type == "instance_died", 0.1),
                              60, "the death")
            opened = {}
            for t in moved:
                e = app.wait_for_event(lambda e, t=t: e.type == "task_opened" and e.task == t
                                       and e.ts >= died.ts, 60)
                assert e is not None and e.instance != victim, t
                opened[t] = e
            failover_end = max(e.ts for e in opened.values())
            wait_until(lambda: app.wait_for_event(lambda e: e.type == "commit" and e.task in moved
                                                  and e.ts > failover_end, 0.1),
                       60, "a moved task committing new input on its new instance")
        assert rec["status"] == "applied" and died.instance == victim and died.mode == mode
        assert died.cause == "crash" and died.point == "records"
        assert sorted(died.tasks) == sorted(moved)
        # the survivors committed new batches while the dead instance's tasks restored elsewhere
        during = [e for e in app.events(types="commit")
                  if died.ts < e.ts < failover_end and e.task not in moved]
        assert len({e.batch for e in during}) >= 2, (died.ts, failover_end)
        assert {e.instance for e in during} <= {0, 2}
        # no copy anywhere: the moved tasks restored their whole changelog, throttled
        ends = {e.task: e for e in app.events(types="restore_end") if e.ts >= died.ts}
        begins = own_kafka.begin_offsets(topic)
        # the new owner said, when it was given the task, which offsets its restore would cross:
        # the dashboard counts a queued task's lag from them (the internal store is not counted)
        # — said before the new owner fenced the dead one's transaction: its abort marker (one,
        # on a changelog partition the transaction had touched) may come after; the restore's
        # start then says the exact range it reads
        queued = {e.task: e for e in app.events(types="restore_queued") if e.ts >= died.ts}
        started = {e.task: e for e in app.events(types="restore_start") if e.ts >= died.ts}
        for t in moved:
            e = ends[t]
            assert e.source == "scratch" and e.restored > 0, e
            assert e.start_offset <= begins[TaskId.parse(t).partition], (e, begins)
            assert e.end_offset >= before[t], (e, before[t])
            s = started[t]
            assert (s.start_offset, s.end_offset) == (e.start_offset, e.end_offset), (s, e)
            assert s.to_replay == e.end_offset - e.start_offset >= e.restored, (s, e)
            (q_start, q_end), = queued[t].stores.values()
            assert list(queued[t].stores) == ["counts"] and q_start == e.start_offset, (queued[t], e)
            assert e.end_offset - q_end in (0, 1), (queued[t], e)
            assert queued[t].to_replay == q_end - q_start, queued[t]
        assert app.process_all_available(timeout=120)
        assert "ERROR" not in states and set(states) <= {"RESTORING", "RUNNING", "REBALANCING"}
        want = reference(feed.sent)
        assert counts(app) == want
        check_output(app, want)
        rb = [r for r in app.rebalances if r["reason"] == f"instance {victim} died"]
        assert len(rb) == 1 and {m["task"] for m in rb[0]["moves"]} == moved
        assert all(m["reason"] == "owner-died" and m["from"] == victim for m in rb[0]["moves"])
    finally:
        app.stop()


def test_a_new_instance_warms_up_before_a_task_moves_to_it(broker, own_kafka, tmp_path):
    own_kafka.ensure_topic("lines", 4)
    app = wordcount(broker, tmp_path, "warm", partitions=4, instances=2, acceptable_recovery_lag=5,
                    probing_rebalance_interval=0.5, max_warmup_replicas=1)
    seen = []
    app.on_event(seen.append)
    try:
        with Feeder(own_kafka, every=0.005) as backlog:
            wait_until(lambda: len(backlog.sent) >= 150, 30, "a backlog of 150 lines")
        app.start()
        assert app.process_all_available()
        before = dict(app.assignment.active)
        new = app.add_instance()
        assert new == 2 and app.instances == 3
        assert dict(app.assignment.active) == before, "nothing moves to a cold instance"
        assert len(app.assignment.warmups) == 1
        (task, (dest,)), = app.assignment.warmups.items()
        assert dest == new
        wait_until(lambda: new in app.assignment.active.values(), 60, "the move")
        assert app.process_all_available()
        wait_until(lambda: not app.assignment.warmups and
                 sorted(app.assignment.active.values()).count(new) == 1, 60, "balance")
        wait_until(lambda: any(e.type == "task_opened" and e.instance == new and e.task == str(task)
                               for e in seen), 30, f"task {task} opened on instance {new}")
        evs = [e for e in seen if getattr(e, "task", None) == str(task) or e.type == "rebalance"]
        order = [e.type for e in evs]
        i_warm = next(i for i, e in enumerate(evs) if e.type == "replica_started" and e.role == "warmup"
                      and e.instance == new)
        i_caught = next(i for i, e in enumerate(evs) if e.type == "warmup_caught_up" and e.instance == new)
        i_move = next(i for i, e in enumerate(evs) if e.type == "rebalance" and any(
            m["task"] == str(task) and m["to"] == new for m in e.moves))
        i_open = next(i for i, e in enumerate(evs) if e.type == "task_opened" and e.instance == new)
        assert i_warm < i_caught < i_move < i_open, order
        assert evs[i_open].source == "warmup"
        mv = next(m for m in evs[i_move].moves if m["task"] == str(task))
        assert mv["reason"] == "warmup-caught-up" and mv["from"] == before[task]
        # before the move, no rebalance moved any task at all
        assert all(not e.moves for e in evs[:i_move] if e.type == "rebalance")
        assert counts(app) == reference_from(own_kafka)
    finally:
        app.stop()


def reference_from(kafka):
    lines = []
    for p, end in sorted(kafka.end_offsets("lines").items()):
        for chunk in kafka.read("lines", p, None, end):
            lines += [v.decode() for _o, _ts, _k, v, _h in chunk.records]
    return reference(lines)


def test_remove_instance_is_graceful_and_scale_goes_both_ways(broker, own_kafka, tmp_path):
    own_kafka.ensure_topic("lines", 4)
    app = wordcount(broker, tmp_path, "rm", partitions=4, instances=3, acceptable_recovery_lag=10,
                    probing_rebalance_interval=0.3)
    states = []
    app.on_event(lambda e: states.append(e.state) if e.type == "state" else None)
    try:
        app.start()
        with Feeder(own_kafka):
            wait_until(lambda: app.state == AppState.RUNNING, 60, "running")
            app.remove_instance(2)
            assert app.instances == 2 and not app.assignment.active_tasks(2)
            left = app.wait_for_event(lambda e: e.type == "instance_left", 10)
            assert left is not None and left.instance == 2
            moves = [m for r in app.rebalances for m in r["moves"]]
            assert moves and all(m["from"] == 2 and m["reason"] == "owner-leaving" for m in moves)
            assert app.scale(3) == [3]
            assert app.instances == 3
            assert app.scale(2) == [3]
        assert app.process_all_available()
        assert app.instances_frame().set_index("instance")["status"].to_dict() == {
            0: "alive", 1: "alive", 2: "stopped", 3: "stopped"}
        assert counts(app) == reference_from(own_kafka)
        assert "ERROR" not in states
        assert not any(e.type == "instance_died" for e in app.events())
    finally:
        app.stop()


def test_bad_membership_calls_are_refused_and_change_nothing(broker, own_kafka, tmp_path):
    own_kafka.ensure_topic("lines", 2)
    app = wordcount(broker, tmp_path, "bad", partitions=2, instances=2)
    with pytest.raises(StatekitError, match="not started"):
        app.kill(0)
    with pytest.raises(StatekitError, match="not started"):
        app.scale(3)
    try:
        app.start()
        assert app.process_all_available()
        app.kill(1)
        wait_until(lambda: app.state == AppState.RUNNING, 60, "running after the kill")
        before = (app.assignment, app.instances_frame().to_dict(), app.generation)
        calls = [
            (lambda: app.kill(7), "no instance 7"),
            (lambda: app.kill("x"), "must be a number"),
            (lambda: app.kill(0), "last live instance"),
            (lambda: app.kill(1), "already dead"),
            (lambda: app.remove_instance(0), "last live instance"),
            (lambda: app.scale(0), "at least 1"),
            (lambda: app.revive(0), "alive"),
            (lambda: app.revive(9), "no instance 9"),
        ]
        for call, what in calls:
            with pytest.raises(StatekitError) as ei:
                call()
            msg = str(ei.value)
            assert what in msg and "\n" not in msg, msg
        assert (app.assignment, app.instances_frame().to_dict(), app.generation) == before
        assert app.state == AppState.RUNNING
    finally:
        app.stop()
