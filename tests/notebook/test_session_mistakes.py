"""%statekit against a real broker and real apps (the local engine: no Spark): the mistakes a new user
makes get one clear line and change nothing, `up`/`down` know what they started, membership commands
say what moved, and a failing user function is reported under the running cell and on the badge."""
from __future__ import annotations

import os
import re
import time

import pytest

from statekit.broker.process import pid_alive


@pytest.fixture
def ip(tmp_path, monkeypatch):
    from IPython.testing.globalipapp import get_ipython

    import kernel_ext
    from kernel_ext.commands import Session

    monkeypatch.setenv("STATEKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STATEKIT_BOOTSTRAP", raising=False)
    shell = get_ipython()
    shell.run_line_magic("load_ext", "kernel_ext")
    sess = kernel_ext._magics.session = Session(shell)
    sess.cards = []
    sess.display = lambda obj=None, html_text=None: sess.cards.append(html_text if html_text else obj)
    try:
        yield shell
    finally:
        for app in list(sess.apps.values()):
            try:
                app.stop()
            except Exception:
                pass
        if sess.broker is not None and sess.broker.owned:
            sess.broker.stop()
        os.environ.pop("STATEKIT_BOOTSTRAP", None)


def _session():
    import kernel_ext

    return kernel_ext.session()


def _one_red_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "\x1b[31m" in lines[0] and "Traceback" not in err
    return lines[0]


def test_up_twice_reuses_its_own_broker_and_down_stops_it(ip, capsys):
    sess = _session()
    ip.run_line_magic("statekit", "up --no-spark")
    first = sess.broker
    assert first.owned and "started the embedded broker" in sess.cards[-1]
    ip.run_line_magic("statekit", "up --no-spark")
    assert sess.broker is first and sess.bootstrap == first.bootstrap
    card = sess.cards[-1]
    assert f"reusing the embedded broker this kernel started (pid {first.pid})" in card
    assert "external cluster" not in card and "started by this kernel" in card
    assert os.environ["STATEKIT_BOOTSTRAP"] == first.bootstrap
    capsys.readouterr()
    ip.run_line_magic("statekit", "down")
    out = capsys.readouterr().out
    assert out.strip() == f"stopped: the embedded broker at {first.bootstrap}"
    deadline = time.monotonic() + 10
    while pid_alive(first.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(first.pid)
    assert "STATEKIT_BOOTSTRAP" not in os.environ and sess.broker is None


def test_down_leaves_a_broker_another_process_started_running(ip, tmp_path, capsys):
    from statekit import broker as broker_mod

    theirs = broker_mod.start(dir=str(tmp_path / "home" / "broker"))
    try:
        sess = _session()
        ip.run_line_magic("statekit", "up --no-spark")
        assert sess.broker.pid == theirs.pid and not sess.broker.owned
        assert "reusing the embedded broker started by another process" in sess.cards[-1]
        capsys.readouterr()
        ip.run_line_magic("statekit", "down")
        out = capsys.readouterr().out.strip().splitlines()
        assert out[0] == "stopped: nothing was running"
        assert out[1].startswith(f"left the embedded broker at {theirs.bootstrap} running: another "
                                 f"process started it (pid {theirs.pid})")
        assert pid_alive(theirs.pid)
    finally:
        theirs.stop()


def test_crash_before_start_is_refused_and_changes_nothing(ip, capsys):
    ip.run_line_magic("statekit", "up --no-spark")
    ip.run_cell_magic("statekit", "app early --engine local",
                      "app.stream('words', value_serde='json').group_by_key().count(store='counts')\n")
    capsys.readouterr()
    ip.run_line_magic("statekit", "crash early")
    line = _one_red_line(capsys.readouterr().err)
    assert "%statekit crash: app 'early' is not started: start() it (or %statekit start early) before crash" in line
    assert str(_session().apps["early"].state) == "CREATED"


def test_a_topic_typo_is_reported_when_the_app_cell_runs(ip, capsys):
    from statekit.kafka import Kafka

    ip.run_line_magic("statekit", "up --no-spark")
    k = Kafka(_session().bootstrap)
    k.ensure_topic("words", 2)
    k.close()
    capsys.readouterr()
    ip.run_cell_magic("statekit", "app typo --engine local",
                      "app.stream('wrods', value_serde='json').group_by_key().count(store='counts')\n")
    cap = capsys.readouterr()
    assert "app 'typo' defined" in cap.out  # defined: the topic may still be produced
    line = _one_red_line(cap.err)
    assert "source topic 'wrods' does not exist" in line and "did you mean 'words'?" in line
    assert "%statekit produce wrods" in line


def _local_app(ip, name, body, opts="--partitions 4 --instances 2"):
    ip.run_cell_magic("statekit", f"app {name} --engine local {opts}", body)
    return _session().apps[name]


COUNT = "app.stream('words', value_serde='json').group_by_key().count(store='counts')\n"


def test_membership_commands_say_what_moved_and_bad_arguments_change_nothing(ip, capsys):
    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    datagen.produce("words", datagen.generate("words", seed=3, limit=400), _session().bootstrap, partitions=4)
    app = _local_app(ip, "mem", COUNT)
    ip.run_line_magic("statekit", "start mem")
    app.process_all_available(timeout=60)
    before = app.instances_frame().to_dict("records")
    gen = app.generation
    capsys.readouterr()
    bad = {
        "kill mem --instance 7": "%statekit kill: there is no instance 7 (instances: 0, 1)",
        "revive mem --instance 1": "%statekit revive: instance 1 is alive; kill it first",
        "remove-instance mem --instance 9": "%statekit remove-instance: there is no instance 9",
        "scale mem 0": "%statekit scale: argument N: an app needs at least 1 live instance, got 0",
        "kill ghost --instance 0": "%statekit kill: no app named 'ghost'",
    }
    for line, expect in bad.items():
        ip.run_line_magic("statekit", line)
        got = _one_red_line(capsys.readouterr().err)
        assert expect in got, (line, got)
    assert app.instances_frame().to_dict("records") == before and app.generation == gen
    # a real kill: exactly the moves of the rebalance it caused
    held = app.assignment.active_tasks(1)
    ip.run_line_magic("statekit", "kill mem --instance 1")
    out = capsys.readouterr().out
    moves = [m for r in app.rebalances if r["generation"] > gen for m in r["moves"]]
    assert sorted(m["task"] for m in moves) == sorted(str(t) for t in held)
    assert f"mem: instance 1 killed; {len(moves)} task move(s): " in out
    for m in moves:
        assert f"{m['task']} 1→0" in out
    assert "live instances: 0;" in out
    # the last live instance
    ip.run_line_magic("statekit", "kill mem --instance 0")
    got = _one_red_line(capsys.readouterr().err)
    assert "instance 0 is the last live instance" in got
    assert app.instances == 1


def test_restart_of_a_one_instance_app_reports_no_move(ip, capsys):
    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    datagen.produce("words", datagen.generate("words", seed=4, limit=200), _session().bootstrap, partitions=2)
    app = _local_app(ip, "one", COUNT, "--partitions 2")
    ip.run_line_magic("statekit", "start one")
    app.process_all_available(timeout=60)
    ip.run_line_magic("statekit", "crash one --mode disk-loss")
    app.wait_for_state(["ERROR"], timeout=30)
    capsys.readouterr()
    ip.run_line_magic("statekit", "restart one --no-watch")
    out = capsys.readouterr().out
    assert re.search(r"one: revived instance\(s\) 0 \(generation \d+\); (RESTORING|REBALANCING|RUNNING)", out), out
    assert "move" not in out  # its tasks came back to the instance they were on
    assert app.process_all_available(timeout=60)
    assert int(app.restore_summary()["records"].sum()) > 0
    # the disk is gone: the restores say "scratch" from their first event on (the dashboard shows it)
    since = app.events(types="instance_died")[-1].ts
    starts = app.events(types="restore_start", since=since)
    assert sorted(e.task for e in starts) == ["0_0", "0_1"] and {e.source for e in starts} == {"scratch"}
    queued = [e for e in app.events(types="restore_queued", since=since)]
    assert sorted(e.task for e in queued) == ["0_0", "0_1"] and {e.source for e in queued} == {"scratch"}


def test_restart_with_a_restore_rate_throttles_and_says_so(ip, capsys):
    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    datagen.produce("words", datagen.generate("words", seed=6, limit=300), _session().bootstrap, partitions=2)
    app = _local_app(ip, "slow", COUNT, "--partitions 2")
    ip.run_line_magic("statekit", "start slow")
    app.process_all_available(timeout=60)
    ip.run_line_magic("statekit", "crash slow --mode disk-loss")
    app.wait_for_state(["ERROR"], timeout=30)
    capsys.readouterr()
    ip.run_line_magic("statekit", "restart slow --no-watch --restore-rate 2k/s")
    assert "restores throttled to 2,000 records/s" in capsys.readouterr().out
    assert app.process_all_available(timeout=60)
    ends = app.events(types="restore_end")
    assert ends and all(e.throttle_rps == 2000.0 for e in ends)


def test_a_failing_user_function_is_reported_in_the_notebook_and_on_the_badge(ip, capsys):
    from kernel_ext.dashboard.view import LiveDashboard
    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    datagen.produce("nums", datagen.generate("words", seed=5, limit=50), _session().bootstrap, partitions=2)
    app = _local_app(ip, "bad", "app.stream('nums', value_serde='json').map_values(lambda v: 1 / 0)"
                                ".group_by_key().count(store='c')\n", "--partitions 2")
    d = LiveDashboard(app, interval=0.2)
    ip.run_line_magic("statekit", "start bad")
    assert str(app.wait_for_state(["ERROR"], timeout=60)) == "ERROR"
    deadline = time.monotonic() + 10
    err = ""
    while "ZeroDivisionError" not in err and time.monotonic() < deadline:
        time.sleep(0.1)
        err += capsys.readouterr().err
    line = _one_red_line(err)
    assert "%statekit: app bad failed:" in line and "ZeroDivisionError: division by zero" in line
    assert str(app.error) in line
    d.refresh()
    h = d.view.header.value
    assert ">ERROR<" in h and "sk-reason bad" in h and "ZeroDivisionError: division by zero" in h


def test_engine_spark_makes_a_native_app_and_refuses_what_it_cannot_do(ip, capsys):
    from statekit.engine.spark_native import NativeApp

    ip.run_line_magic("statekit", "up --no-spark")
    capsys.readouterr()
    ip.run_cell_magic("statekit", "app nat --engine spark --partitions 2", COUNT)
    app = _session().apps["nat"]
    assert isinstance(app, NativeApp) and app.partitions == 2
    assert "app 'nat' defined: 2 task(s), Spark's own state store" in capsys.readouterr().out
    ip.run_cell_magic("statekit", "app nat2 --engine spark --instances 2", COUNT)
    line = _one_red_line(capsys.readouterr().err)
    assert "--engine spark (Spark's own state store) runs one instance without standbys or warmups: " \
           "drop --instances" in line
    assert "nat2" not in _session().apps
    ip.run_line_magic("statekit", "kill nat --instance 0")
    assert "runs Spark's own state store (one instance): no membership changes" in \
        _one_red_line(capsys.readouterr().err)


def test_a_native_app_cell_refuses_what_spark_cannot_run_when_it_runs(ip, capsys):
    ip.run_line_magic("statekit", "up --no-spark")
    capsys.readouterr()
    ip.run_cell_magic("statekit", "app sess --engine spark",
                      "from statekit.topology import SessionWindows\n"
                      "app.stream('clicks').group_by_key().windowed_by(SessionWindows(30_000))"
                      ".count(store='visits')\n")
    line = _one_red_line(capsys.readouterr().err)
    assert "the spark engine" in line and "statekit.App(...) (the changelog engine)" in line
    assert "sess" not in _session().apps


def test_up_master_without_spark_is_refused(ip, capsys):
    ip.run_line_magic("statekit", "up --no-spark --master spark://127.0.0.1:7077")
    line = _one_red_line(capsys.readouterr().err)
    assert "--master starts Spark on that master: drop --no-spark" in line
    assert _session().bootstrap is None and _session().spark is None


def test_up_on_a_shared_host_starts_a_broker_that_requires_authentication(ip, monkeypatch, capsys):
    from statekit import broker as broker_mod
    from statekit.kafka import Kafka

    monkeypatch.setenv("STATEKIT_BROKER_AUTH", "1")
    ip.run_line_magic("statekit", "up --no-spark")
    sess = _session()
    assert "SASL authentication required" in sess.cards[-1]
    assert broker_mod.status(sess.broker.dir)["auth"] is True
    k = Kafka(sess.bootstrap)   # statekit's client finds the credentials of the embedded broker
    try:
        k.ensure_topic("private", 1)
        assert "private" in k.topics()
    finally:
        k.close()
