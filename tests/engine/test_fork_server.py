"""The fork server of a local session's Python processes (`engine.spark.fork_server`), driven with
pyspark's own daemon as Spark starts it (`python -m pyspark.daemon`): the daemon answers from a
child of the server, through the process that was started; signals, exit codes and deaths pass
through; what the server cannot serve starts as before."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from statekit.engine.spark import procs
from statekit.engine.spark.fork_server import ENV, ForkServer, real_pid
from waiting import ended_within

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def server(tmp_path):
    fs = ForkServer(str(tmp_path))
    try:
        assert fs.proc.stdout.readline() == b"ready\n"
        yield fs
    finally:
        fs.stop()


def _daemon(env: dict):
    """`python -m pyspark.daemon` as Spark starts it; returns (process, the port it wrote)."""
    p = subprocess.Popen([sys.executable, "-m", "pyspark.daemon"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    return p, struct.unpack("!i", p.stdout.read(4))[0]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update({"PYTHONHASHSEED": "0", "PYTHON_WORKER_FACTORY_SECRET": "s3cret"}, **extra)
    return env


def test_a_served_module_answers_from_a_child_of_the_server_and_exits_as_it_does(server):
    direct, _ = _daemon(_env())
    time.sleep(0.5)              # pyspark's daemon takes SIGTERM right after it writes its port
    direct.send_signal(signal.SIGTERM)
    direct_code = direct.wait(30)

    standin, port = _daemon(_env(**{ENV: server.path}))
    try:
        child = real_pid(standin.pid, server.path)
        # the port came from the child: the stand-in's own stdout is closed to /dev/null
        assert port > 0 and child != standin.pid
        assert procs.parent(child) == server.proc.pid
        assert procs.children(standin.pid) == []
        time.sleep(0.5)
        standin.send_signal(signal.SIGTERM)          # as Spark ends a daemon: passed on
        assert standin.wait(30) == direct_code
        assert ended_within(child)
        assert real_pid(standin.pid, server.path) == standin.pid   # forgotten once it ended
    finally:
        if standin.poll() is None:
            standin.kill()
            standin.wait()


def test_a_killed_stand_in_takes_its_child_and_a_stopped_server_takes_every_child(server):
    standin, _ = _daemon(_env(**{ENV: server.path}))
    child = real_pid(standin.pid, server.path)
    assert child != standin.pid
    standin.kill()
    standin.wait()
    assert ended_within(child)

    standin, _ = _daemon(_env(**{ENV: server.path}))
    child = real_pid(standin.pid, server.path)
    assert child != standin.pid
    server.stop()
    assert standin.wait(30) == 1                          # its child gone without a word
    assert ended_within(child)
    assert not os.path.exists(server.path)


def test_what_the_server_cannot_serve_starts_as_before(server, tmp_path):
    # another hash secret than the server's: its children would hash strings otherwise
    p, port = _daemon(_env(**{ENV: server.path, "PYTHONHASHSEED": "7"}))
    try:
        assert port > 0 and real_pid(p.pid, server.path) == p.pid
        assert procs.children(server.proc.pid) == []      # refused: nothing forked for it
    finally:
        p.kill()
        p.wait()
    # no server at that path
    p, port = _daemon(_env(**{ENV: str(tmp_path / "nothing.sock")}))
    try:
        assert port > 0 and procs.children(p.pid) == []
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_the_venv_pth_hands_over_under_the_servers_variable():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import spark_workers_pth
    finally:
        sys.path.pop(0)
    assert f'os.environ.get("{ENV}")' in spark_workers_pth.FORK
    assert '"statekit.engine.spark.fork_server"' in spark_workers_pth.FORK
    assert spark_workers_pth.FORK.endswith(".hand_over()\n")


def test_a_child_of_the_server_drops_from_its_path_what_the_venv_pth_drops(monkeypatch):
    """A child takes its PYTHONPATH from the process Spark started, less what that process's
    `.pth` would have dropped (pyspark's zips, pip's jars): the two filters are written twice (a
    .pth line may use `sys` alone), and must agree."""
    from statekit.engine.spark import fork_server

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import spark_workers_pth
    finally:
        sys.path.pop(0)
    samples = ["/v/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip",
               "/v/lib/python3.11/site-packages/pyspark/python/lib/py4j-0.10.9.9-src.zip",
               "/v/lib/python3.11/site-packages/pyspark/jars/spark-core_2.13-4.1.0.jar",
               "C:\\v\\Lib\\site-packages\\pyspark\\python\\lib\\pyspark.zip",
               "/opt/spark/python/lib/pyspark.zip", "/v/pyspark/jars/README.md",
               "/v/lib/python3.11/site-packages/pyspark/python/lib", "/work/statekit", "/x/y.zip"]
    monkeypatch.setattr(sys, "path", list(samples))
    exec(spark_workers_pth.LINE, {})
    kept_by_pth = list(sys.path)
    monkeypatch.undo()
    assert kept_by_pth == [p for p in samples if not fork_server._dropped(p)]
    assert len(kept_by_pth) == len(samples) - 4    # both zips, the jar, the Windows zip


def test_a_thread_a_library_started_keeps_the_server_from_forking():
    """A fork copies every lock of the process, also those a thread held: the server serves only
    while it runs no thread, Python's or a library's (pyarrow's jemalloc starts one at import,
    which `threading` does not see)."""
    code = ("import sys; from statekit.engine.spark.fork_server import threads_started as t; "
            "a = t(); import pyarrow; print(a, t())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != "JE_ARROW_MALLOC_CONF"},
                         timeout=60)
    assert out.stdout.split() == ["False", "True"], (out.stdout, out.stderr[-2000:])


@pytest.mark.spark
def test_a_local_start_that_fails_leaves_no_fork_server(tmp_path):
    """The server starts before the JVM; a JVM that cannot start takes it down with the start."""
    import json
    import textwrap

    code = textwrap.dedent("""
        import json
        from statekit.engine.spark import procs, session
        try:
            session.get_session(master="local[1]", driver_memory="lots")
            said = "started"
        except Exception as exc:
            said = type(exc).__name__
        kids = [procs.cmdline(p) for p in procs.children(__import__("os").getpid())]
        print(json.dumps({"said": said, "server": session._OWNED.fork_server is None,
                          "left": [k for k in kids if "fork_server" in k]}))
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"said": "SparkFailure", "server": True,
                                                             "left": []}


def test_a_socket_name_unix_cannot_hold_is_refused_before_anything_starts(tmp_path):
    """(`get_session` then starts without a server: every process as before.)"""
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    before = procs.children(os.getpid())
    with pytest.raises(OSError, match="cannot be named"):
        ForkServer(str(deep))
    assert procs.children(os.getpid()) == before
