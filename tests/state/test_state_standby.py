"""Standby replicas: tailing brings the lag to 0; a promoted standby restores only its lag."""
from __future__ import annotations

import time

import statehelpers as H
from statekit.kafka import Kafka
from statekit.state import StandbyReplica, TaskState, inspect_task
from waiting import wait_until

SEED = 5


def test_standby_tails_and_promotion_replays_only_its_lag(broker, tmp_path):
    k = Kafka(broker.bootstrap)
    active_dir, standby_dir = str(tmp_path / "active"), str(tmp_path / "standby")
    try:
        active = TaskState("sb", 0, H.specs(), state_dir=active_dir, kafka=k)
        H.run_batches(active, SEED, range(4))
        sb = StandbyReplica("sb", 0, H.specs(), state_dir=standby_dir,
                            bootstrap=broker.bootstrap, poll_ms=20).start()
        try:
            H.run_batches(active, SEED, range(10))
            assert sb.wait_caught_up(timeout=30) == 0
            assert sb.last_batch == 9
            assert sb.error is None
            # the standby's copy is already the state, readable while it tails
            with inspect_task(standby_dir, "sb", 0) as view:
                assert view.last_batch() == 9
                got = {n: {} for n in ("counts", "sums", "latest")}
                import json
                for n in got:
                    got[n] = {json.loads(kk): json.loads(v) for kk, v in view.items(n)}
                assert got == H.reference(SEED, range(10))
        finally:
            positions = sb.positions()
            task_dir = sb.promote()  # stops tailing at lag 0
        assert task_dir.startswith(standby_dir)

        # the active goes on for 3 more batches, then dies (its disk with it)
        H.run_batches(active, SEED, range(13))
        active.abandon()
        ends = {n: k.end_offsets(f"sb-{n}-changelog")[0] for n in positions}
        lag = sum(ends[n] - positions[n] for n in positions)
        assert lag > 0

        with TaskState("sb", 0, H.specs(), state_dir=standby_dir, kafka=k) as t:
            restored = sum(m.records_restored for m in t.restore_metrics.values())
            assert restored == lag  # only the standby's lag, not the whole changelog
            assert restored < sum(ends.values())
            assert all(t.restore_metrics[n].start_offset == positions[n] for n in positions)
            assert t.replayed_from == "checkpoint"
            assert t.last_batch == 12
            assert H.contents(t) == H.reference(SEED, range(13))
    finally:
        k.close()


def test_standby_holds_an_uncommitted_tail(broker, tmp_path):
    """Records without their marker (a crashed attempt) never reach the standby's store."""
    from statekit.state import CrashPlan, SimulatedCrash

    k = Kafka(broker.bootstrap)
    try:
        sb = StandbyReplica("sbt", 0, H.specs(), state_dir=str(tmp_path / "s"),
                            bootstrap=broker.bootstrap, poll_ms=20)
        t = TaskState("sbt", 0, H.specs(), state_dir=str(tmp_path / "a"), kafka=k,
                      crash=CrashPlan("between_stores@3", mode="raise"))
        sb.start()
        try:
            H.run_batches(t, SEED, range(5))
        except SimulatedCrash:
            t.abandon()
        wait_until(lambda: sb.last_batch >= 2, 20, "the standby applying batch 2")
        time.sleep(0.3)  # the point: a few more polls (20 ms) go by and batch 3 is not applied
        assert sb.last_batch == 2  # batch 3 reached only the first store's changelog
        sb.close()
        # the standby store equals the reference after batch 2 (TaskState reopens its dir)
        with TaskState("sbt", 0, H.specs(), state_dir=str(tmp_path / "s"), kafka=k) as t2:
            assert t2.last_batch == 2
            assert H.contents(t2) == H.reference(SEED, range(3))
            H.run_batches(t2, SEED, range(5))
            assert H.contents(t2) == H.reference(SEED, range(5))
    finally:
        k.close()


def test_standby_of_a_task_id_of_another_subtopology(broker, tmp_path):
    """The instances name tasks `TaskId`s ("1_2"): the replica tails partition 2 into `<app>/1_2`."""
    from statekit.contracts import TaskId

    sb = StandbyReplica("sbid", TaskId(1, 2), H.specs(), state_dir=str(tmp_path / "s"),
                        bootstrap=broker.bootstrap)
    try:
        assert sb.partition == 2 and sb.task_id == TaskId(1, 2)
        assert sb.task_dir == str(tmp_path / "s" / "sbid" / "1_2")
    finally:
        sb.close()
