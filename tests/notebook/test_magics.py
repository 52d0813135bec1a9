"""%statekit in a real IPython shell, against a fake app: output, and one-line errors (no traceback)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from statekit.errors import StatekitError


class FakeApp:
    name = "fake"
    partitions, instances, standby_replicas = 2, 1, 0
    state = "RUNNING"

    def query(self, store, key):
        if store != "counts":
            raise StatekitError(f"app 'fake' has no store {store!r} (stores: counts)")
        return {"kafka": 3}.get(key)

    def key_owner(self, store, key):
        return type("Owner", (), {"task": 1, "instance": 0, "role": "active"})()

    def query_range(self, store, lo, hi):
        return [("a", 1), ("b", 2)]

    WINDOWS = {"u1": [(1000, 2), (2000, 1), (3000, 5)]}

    def store_spec(self, store):
        return type("Spec", (), {"kind": "window" if store == "clicks" else "kv"})()

    def query_window(self, store, key, t_from, t_to):
        return [(w, n) for w, n in self.WINDOWS.get(key, []) if t_from <= w <= t_to]

    def query_all(self, store):
        return pd.DataFrame({"key": ["a", "b"], "value": [1, 2]})

    def lag(self):
        return pd.DataFrame([{"task": 0, "lag": 0}])

    def crash(self, mode, instance=None, after_records=None, timeout=60):
        raise StatekitError("instance 7 does not exist (instances: 0..0)")


@pytest.fixture
def ip():
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()
    shell.run_line_magic("load_ext", "kernel_ext")
    import kernel_ext

    sess = kernel_ext.session()
    sess.apps["fake"] = FakeApp()
    sess._ensure_up = lambda spark=False: None
    yield shell
    sess.apps.clear()


def test_query_prints_value_and_owner(ip, capsys):
    ip.run_line_magic("statekit", "query fake counts kafka")
    out = capsys.readouterr().out
    assert "counts['kafka'] = 3" in out and "task 1" in out


def test_query_of_a_missing_key_says_it_is_missing(ip, capsys):
    assert ip.run_line_magic("statekit", "query fake counts nokey") is None
    cap = capsys.readouterr()
    assert cap.out == "key 'nokey' is not in store counts (task 1, current copy)\n" and cap.err == ""


def test_range_and_all_return_frames(ip):
    df = ip.run_line_magic("statekit", "query fake counts --range a z")
    assert list(df["key"]) == ["a", "b"]
    assert len(ip.run_line_magic("statekit", "query fake counts --all --limit 1")) == 1
    assert list(ip.run_line_magic("statekit", "lag fake")["lag"]) == [0]


def test_query_of_a_window_store_returns_the_key_windows(ip, capsys):
    df = ip.run_line_magic("statekit", "query fake clicks u1")
    assert df.values.tolist() == [[1000, 2], [2000, 1], [3000, 5]]
    assert list(df.columns) == ["window_start", "value"]
    assert "clicks['u1']: 3 window(s)" in capsys.readouterr().out
    df = ip.run_line_magic("statekit", "query fake clicks u1 --from 1500 --to 3000 --limit 1")
    assert df.values.tolist() == [[2000, 1]]
    assert "2 window(s); first 1" in capsys.readouterr().out


@pytest.mark.parametrize("line,expect", [
    ("query fake nostore k", "%statekit query: app 'fake' has no store 'nostore'"),
    ("query ghost counts k", "no app named 'ghost'"),
    ("crash fake --instance 7", "%statekit crash: instance 7 does not exist"),
    ("crash fake --mode nope", "invalid choice"),
    ("frobnicate", "unknown subcommand"),
    ("query fake counts 1.5 --key-type int", "not a whole number"),
])
def test_errors_are_one_red_line(ip, capsys, line, expect):
    assert ip.run_line_magic("statekit", line) is None
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(lines) == 1, cap.err
    assert expect in lines[0] and "Traceback" not in cap.err and "\x1b[31m" in lines[0]


def test_app_cell_mistake_is_one_line(ip, capsys):
    ip.run_cell_magic("statekit", "app broken --partitions 2", "x = 1\napp.stream('t').no_such_step()\n")
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "line 2" in err and "AttributeError" in err
    assert "broken" not in __import__("kernel_ext").session().apps


def _on(broker, monkeypatch):
    """The session's apps use `broker` (whatever an earlier test left in the kernel's session)."""
    import kernel_ext

    monkeypatch.setenv("STATEKIT_BOOTSTRAP", broker.bootstrap)
    monkeypatch.setattr(kernel_ext.session(), "bootstrap", broker.bootstrap)


def test_app_cell_defines_an_app(ip, capsys, kafka, shared_broker, monkeypatch):
    _on(shared_broker, monkeypatch)
    kafka.ensure_topic("words-good", 3)
    ip.run_cell_magic("statekit", "app good --partitions 3",
                      "app.stream('words-good', value_serde='json').group_by_key().count(store='counts')\n")
    import kernel_ext

    app = kernel_ext.session().apps["good"]
    assert app.partitions == 3 and ip.user_ns["app"] is app
    assert "app 'good' defined: 3 task(s)" in capsys.readouterr().out


def test_a_refused_app_cell_defines_nothing(ip, capsys, kafka, shared_broker, monkeypatch):
    """The topic is misspelled: one red line with the closest name, and the cell changes nothing —
    no app by that name, `app` and every other name of the namespace as they were."""
    import kernel_ext

    _on(shared_broker, monkeypatch)
    kafka.ensure_topic("words-typo", 2)
    ip.user_ns["app"] = sentinel = object()
    ip.user_ns["counts"] = "mine"
    ip.run_cell_magic("statekit", "app typo --partitions 2",
                      "helper = 1\ncounts = app.stream('wrods-typo', value_serde='json').group_by_key()"
                      ".count(store='counts')\n")
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "\x1b[31m" in lines[0], cap.err
    assert "source topic 'wrods-typo' does not exist" in lines[0]
    assert "did you mean 'words-typo'?" in lines[0] and lines[0].endswith("nothing was defined\x1b[0m")
    assert cap.out == ""
    assert "typo" not in kernel_ext.session().apps
    assert ip.user_ns["app"] is sentinel and ip.user_ns["counts"] == "mine" and "helper" not in ip.user_ns


def test_help_prints_usage(ip, capsys):
    ip.run_line_magic("statekit", "crash --help")
    out = capsys.readouterr().out
    assert "usage: %statekit crash" in out and "--mode" in out


def test_produce_with_a_limit_takes_the_fast_path_and_writes_the_generators_records(ip, broker):
    import kernel_ext
    from statekit import datagen
    from statekit.kafka import Kafka

    sess = kernel_ext.session()
    old = sess.bootstrap
    sess.bootstrap = broker.bootstrap
    try:
        ip.run_line_magic("statekit", "produce acc --generator accounts --limit 70000 --keys 5000 "
                                      "--seed 3 --partitions 2 --wait")
        job = sess.producers.pop("acc")
        assert job.progress.done and job.progress.sent == 70_000 and job.progress.error is None
        counts, sums = {}, {}
        with Kafka(broker.bootstrap) as k:
            for p, end in k.end_offsets("acc").items():
                for ch in k.read("acc", p, 0, end):
                    for r in ch.records:
                        v = json.loads(r[3])
                        key = r[2].decode()
                        counts[key] = counts.get(key, 0) + 1
                        sums[key] = sums.get(key, 0) + v["amount"]
        assert (counts, sums) == datagen.accounts_reference(3, 70_000, 5_000)
    finally:
        sess.bootstrap = old


def test_the_start_line_counts_executors_as_spark_places_them():
    """On a cluster (placement executors) the app's instance setting says nothing about where its
    tasks run: the line names Spark's executors (notebook 13 said "4 tasks on 1 instance" beside
    three executors)."""
    from kernel_ext.commands import Session

    class App:
        partitions, instances = 4, 1

        def __init__(self, placement):
            self.placement = placement

        def tasks(self):
            return ["0_0", "0_1", "0_2", "0_3"]

    assert Session._tasks_on(App("executors")) == "4 tasks on Spark's executors"
    assert Session._tasks_on(App("instances")) == "4 tasks on 1 instance"


def test_broker_pause_and_restart_act_on_the_embedded_broker_this_kernel_runs(ip, broker, capsys):
    import time

    import kernel_ext
    from statekit.kafka import Kafka

    sess = kernel_ext.session()
    old = (sess.bootstrap, sess.broker)
    sess.bootstrap, sess.broker = broker.bootstrap, broker
    try:
        with Kafka(broker.bootstrap, timeout=30) as k:
            k.ensure_topic("bounced", 1)
            ip.run_line_magic("statekit", "broker pause 1.5")
            assert "stops answering for 1.5 s" in capsys.readouterr().out
            t0 = time.monotonic()
            k.send("bounced", 0, [(b"k", b"v")])
            assert time.monotonic() - t0 > 0.5          # it waited for the pause to end
            pid = broker.pid
            ip.run_line_magic("statekit", "broker restart --down 0.2")
            out = capsys.readouterr().out
            assert "killed (kill -9) and started again 0.2 s later" in out
            assert sess.broker.pid != pid and sess.broker.bootstrap == broker.bootstrap
            assert k.end_offsets("bounced") == {0: 1}     # its data survived, the client reconnected
        ip.run_line_magic("statekit", "broker pause 0")
        assert "a pause needs more than 0 seconds" in capsys.readouterr().err
    finally:
        if sess.broker is not broker:
            sess.broker.stop()     # the one the restart started
        sess.bootstrap, sess.broker = old


def test_a_shutdown_request_stops_the_apps_before_ipykernel_ends_the_kernels_children(ip, monkeypatch):
    """ipykernel signals every child of the kernel's process group until none is left (half a
    minute at most): the apps stop and the spare is reaped first, so none is left to wait for."""
    import asyncio
    import subprocess
    import sys

    import kernel_ext
    from statekit.runtime import supervisor

    order = []

    class Kernel:
        async def do_shutdown(self, restart):
            order.append(("ipykernel", restart, supervisor.spares()))
            return {"status": "ok", "restart": restart}

    class Running(FakeApp):
        def stop(self):
            order.append(("stop", self.name))

    spare = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    monkeypatch.setattr(supervisor.SPARES, "_spares", [spare])
    kernel = Kernel()
    kernel_ext._watch_shutdown_request(kernel)
    kernel_ext.session().apps["fake"] = Running()
    reply = asyncio.run(kernel.do_shutdown(True))
    assert reply == {"status": "ok", "restart": True}
    assert order == [("stop", "fake"), ("ipykernel", True, [])]
    assert spare.returncode == 0   # ended and reaped: no zombie child left
