"""Lifecycle state machine, crash directives and the state-directory layout: no broker, no engine."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from statekit.contracts import Layout, TaskId, has_state
from statekit.runtime.lifecycle import AppState, IllegalTransition, Lifecycle
from statekit.worker import crash as crash_mod


def test_lifecycle_happy_path_and_listeners():
    lc = Lifecycle()
    seen = []
    lc.add_listener(lambda new, old: seen.append((str(old), str(new))))
    assert lc.state == AppState.CREATED
    lc.transition(AppState.RESTORING)
    lc.transition(AppState.RUNNING)
    lc.transition(AppState.ERROR, "worker died")
    assert lc.reason == "worker died"
    lc.transition(AppState.RESTORING)
    lc.transition(AppState.RUNNING)
    lc.transition(AppState.REBALANCING, "instance 1 died")
    lc.transition(AppState.RUNNING)
    lc.transition(AppState.WAITING, "waiting for Kafka at h:1 since 3 s; 0 transactions aborted")
    lc.transition(AppState.RESTORING, "Kafka is back")   # tasks replay what waited
    lc.transition(AppState.RUNNING)
    lc.transition(AppState.PENDING_SHUTDOWN)
    lc.transition(AppState.NOT_RUNNING)
    assert seen == [("CREATED", "RESTORING"), ("RESTORING", "RUNNING"), ("RUNNING", "ERROR"),
                    ("ERROR", "RESTORING"), ("RESTORING", "RUNNING"), ("RUNNING", "REBALANCING"),
                    ("REBALANCING", "RUNNING"), ("RUNNING", "WAITING"), ("WAITING", "RESTORING"),
                    ("RESTORING", "RUNNING"), ("RUNNING", "PENDING_SHUTDOWN"),
                    ("PENDING_SHUTDOWN", "NOT_RUNNING")]
    assert [str(s) for s in AppState] == ["CREATED", "RESTORING", "REBALANCING", "RUNNING", "WAITING",
                                          "PENDING_SHUTDOWN", "NOT_RUNNING", "ERROR"]
    assert AppState.WAITING.is_running()
    assert not Lifecycle().can(AppState.WAITING)     # not before the app has started


def test_lifecycle_rejects_illegal_moves():
    lc = Lifecycle()
    with pytest.raises(IllegalTransition):
        lc.transition(AppState.RUNNING)
    assert lc.transition(AppState.RUNNING, strict=False) is False
    assert lc.state == AppState.CREATED
    assert lc.transition(AppState.CREATED) is False  # no-op


def test_lifecycle_wait_for_from_another_thread():
    lc = Lifecycle()
    lc.transition(AppState.RESTORING)
    threading.Timer(0.1, lambda: lc.transition(AppState.RUNNING)).start()
    assert lc.wait_for(AppState.RUNNING, timeout=5) == AppState.RUNNING
    assert lc.wait_for([AppState.ERROR], timeout=0.05) == AppState.RUNNING


def test_a_listener_that_raises_does_not_break_the_machine():
    lc = Lifecycle()
    lc.add_listener(lambda new, old: 1 / 0)
    lc.transition(AppState.RESTORING)
    assert lc.state == AppState.RESTORING


def test_crash_directive_write_read_claim(tmp_path):
    ctl = str(tmp_path / "control")
    d = crash_mod.write_directive(ctl, instance=1, point="records", after_records=5, mode="disk-loss")
    assert crash_mod.read_directive(ctl)["id"] == d["id"]
    # wrong instance, wrong point, too few records: no claim
    assert crash_mod.claim(ctl, 0, "records", 10) is None
    assert crash_mod.claim(ctl, 1, "after_ack") is None
    assert crash_mod.claim(ctl, 1, "records", 4) is None
    assert crash_mod.claimed(ctl, d["id"]) is None
    got = crash_mod.claim(ctl, 1, "records", 5, task=3, batch=7)
    assert got is not None and got["task"] == 3
    assert crash_mod.read_directive(ctl) is None
    assert crash_mod.claim(ctl, 1, "records", 50) is None  # fired once
    c = crash_mod.claimed(ctl, d["id"])
    assert c["task"] == 3 and c["batch"] == 7 and c["pid"] == os.getpid()


def test_crash_directive_any_instance_and_bad_point(tmp_path):
    ctl = str(tmp_path)
    crash_mod.write_directive(ctl, instance=None, point="after_rocksdb")
    assert crash_mod.claim(ctl, 4, "after_rocksdb") is not None
    with pytest.raises(ValueError):
        crash_mod.write_directive(ctl, point="sometime")


def test_exactly_one_claimer_among_racing_processes(tmp_path):
    ctl = str(tmp_path)
    d = crash_mod.write_directive(ctl, instance=0, point="records", after_records=0)
    code = ("import sys; from statekit.worker import crash as c; "
            "r = c.claim(sys.argv[1], 0, 'records', 1); print('WON' if r else 'LOST')")
    procs = [subprocess.Popen([sys.executable, "-c", code, ctl], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs.count("WON") == 1, outs
    assert crash_mod.claimed(ctl, d["id"]) is not None


def test_maybe_crash_really_kills_the_process(tmp_path):
    ctl = str(tmp_path)
    crash_mod.write_directive(ctl, instance=2, point="before_send")
    code = ("import sys; from statekit.worker import crash as c; "
            "c.maybe_crash(sys.argv[1], 2, 'before_send', task=1, batch=0); print('survived')")
    p = subprocess.run([sys.executable, "-c", code, ctl], capture_output=True, text=True, timeout=60)
    assert p.returncode == -9
    assert "survived" not in p.stdout


def test_a_commit_point_with_after_records_skips_an_empty_batch(tmp_path):
    ctl = str(tmp_path)
    d = crash_mod.write_directive(ctl, instance=0, point="before_commit", after_records=1)
    assert crash_mod.claim(ctl, 0, "before_commit", records=0, task="0_0", batch=3) is None
    assert crash_mod.claim(ctl, 0, "before_send", records=5, task="0_1", batch=3) is None
    got = crash_mod.claim(ctl, 0, "before_commit", records=2, task="0_1", batch=3)
    assert (got["id"], got["task"], got["records"]) == (d["id"], "0_1", 2)
    # without after_records any commit matches, an empty batch's too
    crash_mod.write_directive(ctl, instance=0, point="before_commit")
    assert crash_mod.claim(ctl, 0, "before_commit", records=0, task="0_0", batch=4)["batch"] == 4


def test_find_claim_matches_the_dead_process_once(tmp_path):
    ctl = str(tmp_path)
    d = crash_mod.write_directive(ctl, instance=1, point="after_ack", mode="disk-loss")
    assert crash_mod.claim(ctl, 1, "after_ack", task="0_2", batch=4)["id"] == d["id"]
    assert crash_mod.find_claim(ctl, 1, os.getpid() + 1) is None       # another process
    got = crash_mod.find_claim(ctl, 1, os.getpid())
    assert got["mode"] == "disk-loss" and got["task"] == "0_2" and got["point"] == "after_ack"
    assert crash_mod.find_claim(ctl, 1, os.getpid()) is None           # consumed


def test_layout_and_disk_loss(tmp_path):
    lay = Layout(str(tmp_path / "app"), "wc")
    assert lay.task_dir(1, TaskId(0, 3)) == str(tmp_path / "app" / "instance-1" / "wc" / "0_3")
    assert lay.task_dir(1, "1_2") == str(tmp_path / "app" / "instance-1" / "wc" / "1_2")
    td = lay.task_dir(1, "0_3")
    os.makedirs(os.path.join(td, "rocksdb"))
    assert not has_state(td)
    open(os.path.join(td, "rocksdb", "CURRENT"), "w").close()
    assert has_state(td)
    os.makedirs(lay.task_dir(1, "1_0"))
    open(os.path.join(lay.task_dir(1, "1_0"), ".checkpoint"), "w").close()
    os.makedirs(lay.task_dir(0, "0_0"))
    assert lay.tasks_on_disk(1) == [TaskId(0, 3), TaskId(1, 0)]
    assert lay.tasks_on_disk(0) == []
    assert lay.instances_on_disk() == [0, 1]
    gone = lay.wipe_instance(1)
    assert len(gone) == 2 and lay.tasks_on_disk(1) == []
    assert os.path.isdir(lay.instance_dir(1))
    assert lay.checkpoint_dir(1) == str(tmp_path / "app" / "spark-checkpoint" / "1")
    ctl = lay.control.ensure()
    assert os.path.isdir(os.path.join(ctl.path, "instances"))
    assert ctl.spool_dir("0_1") == os.path.join(ctl.path, "spool", "0_1")


def test_task_ids_parse_and_print():
    assert str(TaskId(1, 3)) == "1_3" and TaskId.parse("1_3") == TaskId(1, 3)
    assert TaskId.parse(2) == TaskId(0, 2) and TaskId.parse("7") == TaskId(0, 7)
    assert TaskId.parse((2, 5)) == TaskId(2, 5) and TaskId.parse(TaskId(0, 1)) == TaskId(0, 1)
    with pytest.raises(ValueError, match="subtopology"):
        TaskId.parse("a_b")
