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
        if sess.registry is not None and sess.registry.owned:
            sess.registry.stop()
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
    from statekit import registry as registry_mod

    sess = _session()
    ip.run_line_magic("statekit", "up --no-spark")
    first, reg = sess.broker, sess.registry
    assert first.owned and "started the embedded broker" in sess.cards[-1]
    # the schema registry beside it, its schemas in the broker's directory, on the card
    assert reg.owned and reg.dir == first.dir and registry_mod.status(first.dir)["url"] == reg.url
    assert reg.url in sess.cards[-1]
    ip.run_line_magic("statekit", "up --no-spark")
    assert sess.broker is first and sess.bootstrap == first.bootstrap and sess.registry is reg
    card = sess.cards[-1]
    assert f"reusing the embedded broker this kernel started (pid {first.pid})" in card
    assert "external cluster" not in card and "started by this kernel" in card
    assert os.environ["STATEKIT_BOOTSTRAP"] == first.bootstrap
    capsys.readouterr()
    ip.run_line_magic("statekit", "down")
    out = capsys.readouterr().out
    assert out.strip() == f"stopped: the schema registry at {reg.url}, the embedded broker at {first.bootstrap}"
    deadline = time.monotonic() + 10
    while (pid_alive(first.pid) or pid_alive(reg.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(first.pid) and not pid_alive(reg.pid)
    assert "STATEKIT_BOOTSTRAP" not in os.environ and sess.broker is None and sess.registry is None


def test_down_leaves_a_broker_another_process_started_running(ip, tmp_path, capsys):
    from statekit import broker as broker_mod

    theirs = broker_mod.start(dir=str(tmp_path / "home" / "broker"))
    try:
        sess = _session()
        ip.run_line_magic("statekit", "up --no-spark")
        assert sess.broker.pid == theirs.pid and not sess.broker.owned
        assert "reusing the embedded broker started by another process" in sess.cards[-1]
        # this test's process started it: it ends with that process, and the card says so
        assert "it stops when that process ends (`statekit broker start` runs one apart)" in sess.cards[-1]
        reg = sess.registry  # started by this kernel, beside their broker
        capsys.readouterr()
        ip.run_line_magic("statekit", "down")
        out = capsys.readouterr().out.strip().splitlines()
        assert out[0] == f"stopped: the schema registry at {reg.url}"
        assert out[1].startswith(f"left the embedded broker at {theirs.bootstrap} running: another "
                                 f"process started it (pid {theirs.pid})")
        assert pid_alive(theirs.pid)
    finally:
        theirs.stop()


def test_crash_before_start_is_refused_and_changes_nothing(ip, capsys):
    from statekit.kafka import Kafka

    ip.run_line_magic("statekit", "up --no-spark")
    with Kafka(_session().bootstrap) as k:
        k.ensure_topic("words", 4)
    ip.run_cell_magic("statekit", "app early --engine local",
                      "app.stream('words', value_serde='json').group_by_key().count(store='counts')\n")
    capsys.readouterr()
    ip.run_line_magic("statekit", "crash early")
    line = _one_red_line(capsys.readouterr().err)
    assert "%statekit crash: app 'early' is not started: start() it (or %statekit start early) before crash" in line
    assert str(_session().apps["early"].state) == "CREATED"


def test_a_misspelled_topic_is_said_when_the_app_cell_runs_and_defines_nothing(ip, capsys):
    """The README's promise: one red line with the closest topic name, and nothing changes — no
    app by that name, an app defined earlier under it still there, `app` as it was."""
    from statekit.kafka import Kafka

    ip.run_line_magic("statekit", "up --no-spark")
    k = Kafka(_session().bootstrap)
    k.ensure_topic("words", 2)
    k.close()
    ip.run_cell_magic("statekit", "app typo --engine local --partitions 2",
                      "app.stream('words', value_serde='json').group_by_key().count(store='counts')\n")
    first = _session().apps["typo"]
    assert ip.user_ns["app"] is first
    capsys.readouterr()
    ip.run_cell_magic("statekit", "app typo --engine local --partitions 2",
                      "words = app.stream('wrods', value_serde='json')\n"
                      "words.group_by_key().count(store='counts')\n")
    cap = capsys.readouterr()
    assert cap.out == ""   # no "defined"
    line = _one_red_line(cap.err)
    assert "source topic 'wrods' does not exist" in line and "did you mean 'words'?" in line
    assert "nothing was defined" in line
    assert _session().apps["typo"] is first and ip.user_ns["app"] is first
    assert "words" not in ip.user_ns


def test_down_names_only_what_it_stopped_and_twice_says_nothing_was_running(ip, capsys):
    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    datagen.produce("words", datagen.generate("words", seed=3, limit=100), _session().bootstrap, partitions=2)
    _local_app(ip, "dn", COUNT, "--partitions 2")
    ip.run_line_magic("statekit", "start dn")
    ip.run_line_magic("statekit", "stop dn")
    bootstrap, reg = _session().bootstrap, _session().registry
    capsys.readouterr()
    ip.run_line_magic("statekit", "down")
    assert capsys.readouterr().out == (f"stopped: the schema registry at {reg.url}, the embedded broker at "
                                       f"{bootstrap}\n")   # not "app dn" again
    ip.run_line_magic("statekit", "down")
    assert capsys.readouterr().out == "stopped: nothing was running\n"


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
    assert out.endswith("; live instances: 0\n")   # and no state word that goes stale
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
    assert re.fullmatch(r"one: revived instance 0 \(generation \d+\)\n", out), out   # no state word
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


def _hear(app, predicate):
    """Call the result to wait until the session's own event hook has seen an event matching
    `predicate` (callbacks run in order on the app's event thread, and this one is added after the
    session's): set it up before the action that causes the event."""
    import threading

    seen = threading.Event()
    app.on_event(lambda e: predicate(e) and seen.set())

    def wait(timeout=30):
        assert seen.wait(timeout), "the event never came"
    return wait


def test_start_says_what_it_started_without_a_state_that_goes_stale(ip, capsys):
    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    datagen.produce("words", datagen.generate("words", seed=8, limit=100), _session().bootstrap, partitions=2)
    _local_app(ip, "st", COUNT, "--partitions 2")
    capsys.readouterr()
    ip.run_line_magic("statekit", "start st")
    assert capsys.readouterr().out == ("st: started: 2 tasks on 1 instance, reading words "
                                       "(`%statekit watch st` shows it live)\n")


def test_wait_says_what_it_waits_for_and_an_asked_crash_is_said_once(ip, capsys):
    """`wait` names the records it waits for and says when it caught up; a crash armed with
    --after that takes the only instance is said once, in words, by the cell that waited — not
    again (or in red) by the event thread."""
    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    datagen.produce("words", datagen.generate("words", seed=9, limit=100), _session().bootstrap, partitions=2)
    app = _local_app(ip, "cw", COUNT, "--partitions 2")
    ip.run_line_magic("statekit", "start cw")
    ip.run_line_magic("statekit", "produce words --generator words --seed 9 --limit 200 --rate 400/s")
    capsys.readouterr()
    ip.run_line_magic("statekit", "wait cw")   # for the producer first, then for the app
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"cw: waiting for the producer of words to finish \([\d,]+ records sent so far\)…",
                        out[0]), out
    assert out[1] == "cw: waiting until the 300 records in words are processed and committed…"
    assert re.fullmatch(r"cw: caught up in \d+\.\d s", out[2]) and len(out) == 3
    assert not _session().producers["words"].running
    ip.run_line_magic("statekit", "crash cw --after 5")
    assert capsys.readouterr().out == ("cw: instance 0 will crash (process) once one of its tasks has "
                                       "processed 5 record(s) of a batch; with no other instance the app "
                                       "then stops until `%statekit restart cw`\n")
    heard = _hear(app, lambda e: e.type == "state" and e.state == "ERROR")
    datagen.produce("words", datagen.generate("words", seed=10, limit=200), _session().bootstrap, partitions=2)
    ip.run_line_magic("statekit", "wait cw")
    heard()
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    assert lines[0] == "cw: waiting until the 500 records in words are processed and committed…"
    assert len(lines) == 2 and cap.err == "", cap
    crash = app.events(types="crash")[-1]
    assert lines[1] == (f"cw: instance 0 crashed as asked in the middle of batch {crash.batch} (task "
                        f"{crash.task} had processed {crash.records} of its records); no instance is "
                        f"left: the app is in ERROR until `%statekit restart cw`")


def test_wait_on_an_app_that_fails_says_the_failure_once(ip, capsys):
    """The wait, the event thread and the exception all know of the failure: one red line."""
    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    datagen.produce("nums", datagen.generate("words", seed=5, limit=50), _session().bootstrap, partitions=2)
    app = _local_app(ip, "badw", "app.stream('nums', value_serde='json').map_values(lambda v: 1 / 0)"
                                 ".group_by_key().count(store='c')\n", "--partitions 2")
    heard = _hear(app, lambda e: e.type == "state" and e.state == "ERROR")
    ip.run_line_magic("statekit", "start badw")
    ip.run_line_magic("statekit", "wait badw")
    heard(timeout=60)
    line = _one_red_line(capsys.readouterr().err)
    assert "%statekit: app badw failed:" in line and "ZeroDivisionError: division by zero" in line


def test_a_failure_in_the_dashboards_own_cell_is_said_above_the_dashboard(ip, capsys, monkeypatch):
    """`start --watch` was the last cell run: ipykernel would put the red line below the dashboard
    (a thousand pixels down); it goes to the notice line above the dashboard instead."""
    import kernel_ext.commands as commands
    import kernel_ext.lines as lines
    from statekit import datagen

    monkeypatch.setattr(lines, "current_cell", lambda: "the-start-cell")
    monkeypatch.setattr(commands, "current_cell", lambda: "the-start-cell")
    from statekit.kafka import Kafka

    ip.run_line_magic("statekit", "up --no-spark")
    with Kafka(_session().bootstrap) as k:
        k.ensure_topic("nums", 2)
    app = _local_app(ip, "bad", "app.stream('nums', value_serde='json').map_values(lambda v: 1 / 0)"
                                ".group_by_key().count(store='c')\n", "--partitions 2")
    sess = _session()
    heard = _hear(app, lambda e: e.type == "state" and e.state == "ERROR")
    ip.run_line_magic("statekit", "start bad --watch")
    notice = sess.voice.notices["bad"]
    assert sess.cards.index(notice.widget) == len(sess.cards) - 2   # shown just before the dashboard
    assert notice.widget.layout.display == "none"
    datagen.produce("nums", datagen.generate("words", seed=5, limit=50), sess.bootstrap, partitions=2)
    heard(timeout=60)
    assert "app bad failed" not in capsys.readouterr().err
    assert notice.widget.layout.display == ""
    assert "%statekit: app bad failed:" in notice.widget.value
    assert "ZeroDivisionError: division by zero" in notice.widget.value
    sess.dashboards["bad"].stop(timeout=3)


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


def test_up_fresh_starts_the_registry_again_without_its_schemas(ip):
    import httpx

    sess = _session()
    ip.run_line_magic("statekit", "up --no-spark")
    old = sess.registry
    r = httpx.post(f"{old.url}/subjects/s/versions", json={"schema": '"string"'})
    assert r.json()["id"] == 1
    ip.run_line_magic("statekit", "up --no-spark --fresh")
    new = sess.registry
    assert new.pid != old.pid and not pid_alive(old.pid)
    assert httpx.get(f"{new.url}/subjects").json() == []  # deleted with the topics whose records used them


def test_up_tls_starts_a_tls_broker_and_a_mismatch_is_one_line(ip, capsys):
    from statekit import broker as broker_mod
    from statekit.kafka import Kafka

    ip.run_line_magic("statekit", "up --no-spark --tls")
    sess = _session()
    assert "TLS" in sess.cards[-1]
    assert broker_mod.status(sess.broker.dir)["tls"] is True
    assert sess.broker.credentials["security.protocol"] == "SSL"
    k = Kafka(sess.bootstrap)   # statekit's client finds the broker's CA by itself
    try:
        k.ensure_topic("over-tls", 1)
        assert "over-tls" in k.topics()
    finally:
        k.close()
    # the registry beside it serves HTTPS with the broker's certificate, one CA for both
    from statekit import registry as registry_mod

    assert sess.registry.url.startswith("https://")
    assert registry_mod.client_config(sess.broker.dir)["ssl.ca.location"] == sess.broker.credentials["ssl.ca.location"]
    capsys.readouterr()
    ip.run_line_magic("statekit", "up --no-spark --mtls")   # the running broker lacks client certificates
    line = _one_red_line(capsys.readouterr().err)
    assert "runs without client certificates: stop it (`%statekit down` in the kernel" in line
    assert "then start it with --mtls" in line
    ip.run_line_magic("statekit", "up --no-spark --bootstrap 127.0.0.1:9 --tls")
    line = _one_red_line(capsys.readouterr().err)
    assert "--tls is for the embedded broker" in line and "STATEKIT_KAFKA_CONFIG" in line
    assert sess.bootstrap == sess.broker.bootstrap   # neither mistake changed the connection


FAILING = ("app.stream('words', value_serde='json').group_by_key()"
           ".aggregate(lambda: 0, lambda k, v, n: n + {step}, store='totals')\n")


def test_a_lambda_that_failed_is_fixed_in_its_cell_and_started_again_in_the_same_kernel(ip, capsys):
    """The learner's path: the aggregate counted 300 words, then its lambda raises on a record that
    came later (ERROR); `start` and `restart` of the failed app say what to do instead of failing
    the same way; the app cell, fixed, runs again and replaces the failed app (its instance process
    ends, which frees its task directories); `restart` of the new definition starts it from the
    state the failed one committed, and the store is exactly the count of every record."""
    from collections import Counter

    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    first = list(datagen.generate("words", seed=11, limit=300))
    later = [datagen.Record("poison", {"word": "poison"}, 1), *datagen.generate("words", seed=12, limit=50)]
    datagen.produce("words", iter(first), _session().bootstrap, partitions=2)
    bad = _local_app(ip, "fix", FAILING.format(step="(1 / 0 if v['word'] == 'poison' else 1)"),
                     "--partitions 2")
    ip.run_line_magic("statekit", "start fix")
    assert bad.process_all_available(timeout=60)
    counted = bad.query_all("totals")
    assert dict(zip(counted["key"], counted["value"])) == dict(Counter(r.key for r in first))
    heard = _hear(bad, lambda e: e.type == "state" and e.state == "ERROR")
    datagen.produce("words", iter(later), _session().bootstrap, partitions=2)
    heard(timeout=60)
    old_pids = [int(p) for p in bad.instances_frame()["pid"] if p]
    assert old_pids and all(pid_alive(p) for p in old_pids)
    capsys.readouterr()
    todo = "fix the `%%statekit app fix` cell and run it again (that replaces the failed app), then `%statekit start fix`"
    for line in ("start fix", "restart fix"):
        ip.run_line_magic("statekit", line)
        got = _one_red_line(capsys.readouterr().err)
        assert "ZeroDivisionError" in got and todo in got, (line, got)
        assert str(bad.state) == "ERROR"
    fixed = _local_app(ip, "fix", FAILING.format(step="1"), "--partitions 2")
    out = capsys.readouterr().out
    assert fixed is not bad and str(bad.state) == "NOT_RUNNING"
    assert ("(the earlier definition, ERROR, was stopped; its state stays for this one). Next: "
            "%statekit start fix") in out
    assert not [p for p in old_pids if pid_alive(p)]   # stopped and reaped: no lock left behind
    ip.run_line_magic("statekit", "restart fix --no-watch")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "fix: not started yet: starting it" and out[1].startswith("fix: started: 2 tasks")
    assert fixed.process_all_available(timeout=60)
    store = fixed.query_all("totals")
    assert dict(zip(store["key"], store["value"])) == dict(Counter(r.key for r in first + later))
    assert str(fixed.state) == "RUNNING" and fixed.error is None
    # its tasks opened from the state the failed app committed, not from nothing
    opens = fixed.task_opens()
    assert len(opens) == 2 and set(opens["source"]) <= {"checkpoint"}, opens


def test_the_start_cell_run_twice_says_the_app_runs_and_shows_its_dashboard_again(ip, capsys):
    from statekit.kafka import Kafka

    ip.run_line_magic("statekit", "up --no-spark")
    with Kafka(_session().bootstrap) as k:
        k.ensure_topic("words", 2)
    app = _local_app(ip, "twice", COUNT, "--partitions 2")
    sess = _session()
    ip.run_line_magic("statekit", "start twice --watch")
    first = sess.dashboards["twice"]
    app.wait_for_state(["RUNNING"], timeout=60)
    capsys.readouterr()
    ip.run_line_magic("statekit", "start twice --watch")
    cap = capsys.readouterr()
    assert cap.err == "" and cap.out == "twice: already started (RUNNING); its dashboard below follows it\n"
    again = sess.dashboards["twice"]
    assert again is not first and again.running and sess.cards[-1] is again.view.root
    ip.run_line_magic("statekit", "start twice")
    assert capsys.readouterr().out == ("twice: already started (RUNNING); nothing to do; its dashboard "
                                       "above follows it\n")
    again.stop(timeout=3)


def test_redefining_a_running_app_stops_it_and_retires_its_dashboard(ip, capsys):
    from statekit.kafka import Kafka

    ip.run_line_magic("statekit", "up --no-spark")
    with Kafka(_session().bootstrap) as k:
        k.ensure_topic("words", 2)
    old = _local_app(ip, "redo", COUNT, "--partitions 2")
    sess = _session()
    ip.run_line_magic("statekit", "start redo --watch")
    d = sess.dashboards["redo"]
    old.wait_for_state(["RUNNING"], timeout=60)
    capsys.readouterr()
    new = _local_app(ip, "redo", COUNT, "--partitions 2")
    assert "(the earlier definition, RUNNING, was stopped; its state stays for this one)" in capsys.readouterr().out
    assert str(old.state) == "NOT_RUNNING" and "redo" not in sess.dashboards and not d.running
    assert "app redo was redefined: this dashboard no longer follows it" in d.view.header.value
    assert ">NOT_RUNNING<" in d.view.header.value
    ip.run_line_magic("statekit", "start redo")
    assert new.wait_for_state(["RUNNING"], timeout=60) is not None and new.error is None


def test_the_produce_cell_run_twice_writes_its_records_once(ip, capsys):
    """A seeded produce run again, nothing written to the topic since, writes nothing and says so;
    --again writes its records once more; a produce after another adds its records, and says that
    the topic held records already."""
    from statekit.kafka import Kafka

    ip.run_line_magic("statekit", "up --no-spark")
    line = "produce twice --generator words --seed 3 --limit 300 --partitions 2 --wait"
    ip.run_line_magic("statekit", line)
    assert capsys.readouterr().out == ""
    with Kafka(_session().bootstrap) as k:
        first = k.end_offsets("twice")
        assert sum(first.values()) == 300
        ip.run_line_magic("statekit", line)
        cap = capsys.readouterr()
        assert cap.err == "" and cap.out == ("twice already holds these 300 records, written when this "
                                             "produce ran before: nothing written (`--again` writes them "
                                             "once more)\n")
        assert k.end_offsets("twice") == first
        ip.run_line_magic("statekit", line + " --again")
        assert capsys.readouterr().out == "twice already holds 300 records: these are added to them\n"
        assert sum(k.end_offsets("twice").values()) == 600
        ip.run_line_magic("statekit", line)   # --again was this same produce: nothing written
        assert "twice already holds these 300 records" in capsys.readouterr().out
        other = "produce twice --generator words --seed 4 --limit 100 --wait"
        ip.run_line_magic("statekit", other)   # another produce: added, and said
        assert capsys.readouterr().out == "twice already holds 600 records: these are added to them\n"
        ip.run_line_magic("statekit", other)   # that one ran last: not again
        assert "twice already holds these 100 records" in capsys.readouterr().out
        ip.run_line_magic("statekit", line)   # the first one, after another: added again, said
        assert capsys.readouterr().out == "twice already holds 700 records: these are added to them\n"
        assert sum(k.end_offsets("twice").values()) == 1000


def test_a_cell_run_before_the_cell_that_sets_its_names_says_so_in_one_line(ip, capsys):
    """A notebook cell run early (out of order): its NameError is one line saying what to run first;
    a NameError inside a function the cell calls keeps its traceback (it is a bug to find)."""
    ip.run_cell("print(died_too_early)")
    cap = capsys.readouterr()
    line = _one_red_line(cap.err + cap.out)
    assert ("NameError: name 'died_too_early' is not defined: a cell above sets it; run the cells above "
            "this one first (or check the spelling)") in line
    ip.run_cell("def f():\n    return not_defined_anywhere\nf()")
    cap = capsys.readouterr()
    assert "Traceback" in cap.out + cap.err and "f()" in cap.out + cap.err


def test_cells_run_before_the_start_cell_say_what_to_run_first(ip, capsys):
    from statekit.errors import StatekitError
    from statekit.kafka import Kafka

    ip.run_line_magic("statekit", "up --no-spark")
    with Kafka(_session().bootstrap) as k:
        k.ensure_topic("words", 2)
    app = _local_app(ip, "early", COUNT, "--partitions 2")
    capsys.readouterr()
    ip.run_line_magic("statekit", "instances early")
    assert capsys.readouterr().out == "early: no instance runs: it is CREATED (`%statekit start early` starts it)\n"
    with pytest.raises(StatekitError) as ei:   # notebook 05's `died = app.last_event(...)`, run early
        app.last_event("instance_died", wait=0)
    assert str(ei.value) == ("app 'early' has no instance_died event yet: run the cell that causes one "
                             "first (the cells above, in order)")


def test_start_of_an_app_stopped_by_a_crash_restarts_it(ip, capsys):
    from statekit import datagen

    ip.run_line_magic("statekit", "up --no-spark")
    datagen.produce("words", datagen.generate("words", seed=4, limit=200), _session().bootstrap, partitions=2)
    app = _local_app(ip, "again", COUNT, "--partitions 2")
    ip.run_line_magic("statekit", "start again")
    assert app.process_all_available(timeout=60)
    ip.run_line_magic("statekit", "crash again")
    app.wait_for_state(["ERROR"], timeout=30)
    capsys.readouterr()
    ip.run_line_magic("statekit", "start again")   # what a learner types: it means "run it again"
    out = capsys.readouterr().out
    assert re.fullmatch(r"again: revived instance 0 \(generation \d+\)\n", out), out
    assert app.process_all_available(timeout=60) and str(app.state) == "RUNNING"
