"""The processes statekit starts end with the process that started them, however it ends (here:
SIGKILL, which runs no atexit and no finally): the embedded broker, spare and instance processes,
and what the keeper holds (a process that is not Python). A broker started apart
(`statekit broker start`) outlives its starter. Checked by pid."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from statekit.broker.process import pid_alive
from tests.waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _starter(code: str, tmp_path):
    """A Python process that runs `code` (which prints one JSON line of pids, then sleeps)."""
    env = dict(os.environ, PYTHONPATH=ROOT, STATEKIT_HOME=str(tmp_path / "home"))
    env.pop("STATEKIT_BOOTSTRAP", None)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(proc.stderr.read()[-2000:])
    return proc, json.loads(line)


def _kill9(proc) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    proc.stderr.close()


def _gone(pids, timeout=20):
    wait_until(lambda: not [p for p in pids if pid_alive(p)], timeout, f"pids {pids} to exit")


def test_a_broker_and_spares_die_with_the_process_that_started_them(tmp_path):
    proc, pids = _starter(f"""
        import json, sys, threading, time
        from statekit import broker
        from statekit.runtime import supervisor
        h = broker.start(dir={str(tmp_path / 'broker')!r})
        # a spare started from a thread that then ends: it must not die with the thread
        t = threading.Thread(target=supervisor.warm); t.start(); t.join()
        time.sleep(1.0)
        spares = [sp.pid for sp in supervisor.SPARES._spares if sp.poll() is None]
        print(json.dumps({{"broker": h.pid, "spares": spares}}), flush=True)
        time.sleep(600)
        """, tmp_path)
    try:
        assert pid_alive(pids["broker"]) and len(pids["spares"]) == 1
        assert all(pid_alive(p) for p in pids["spares"])
        info = json.loads((tmp_path / "broker" / "broker.json").read_text())
        assert info["pid"] == pids["broker"] and info["tied"] is True
    finally:
        _kill9(proc)
    _gone([pids["broker"], *pids["spares"]])
    assert not (tmp_path / "broker" / "broker.json").exists()   # it stopped as on SIGTERM


def test_a_detached_broker_outlives_its_starter(tmp_path):
    from statekit import broker as broker_mod

    proc, pids = _starter(f"""
        import json, time
        from statekit import broker
        h = broker.start(dir={str(tmp_path / 'broker')!r}, detach=True)
        print(json.dumps({{"broker": h.pid}}), flush=True)
        time.sleep(600)
        """, tmp_path)
    _kill9(proc)
    try:
        h = broker_mod.start(dir=str(tmp_path / "broker"))
        assert h.pid == pids["broker"] and not h.owned and not h.tied
        assert pid_alive(pids["broker"])
    finally:
        broker_mod.stop(str(tmp_path / "broker"))
    _gone([pids["broker"]])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc")
def test_the_keeper_ends_a_process_group_that_cannot_watch_a_pipe(tmp_path):
    proc, pids = _starter("""
        import json, subprocess, time
        from statekit import lifeline
        # a shell and its child in a session of their own, as a standalone cluster's daemons run
        p = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"], stdout=subprocess.PIPE,
                             start_new_session=True, text=True)
        child = int(p.stdout.readline())
        lifeline.keep(p.pid, group=True)
        print(json.dumps({"leader": p.pid, "child": child, "keeper": lifeline.keeper_pid()}), flush=True)
        time.sleep(600)
        """, tmp_path)
    try:
        assert pid_alive(pids["leader"]) and pid_alive(pids["child"]) and pid_alive(pids["keeper"])
    finally:
        _kill9(proc)
    _gone([pids["leader"], pids["child"], pids["keeper"]])


def test_the_keeper_ends_once_it_holds_nothing_and_signals_no_one(tmp_path):
    """A kernel whose Spark has started keeps nothing: it pays for no keeper process."""
    proc, pids = _starter("""
        import json, subprocess, time
        from statekit import lifeline
        p = subprocess.Popen(["sleep", "600"])
        lifeline.keep(p.pid)
        keeper = lifeline.keeper_pid()
        lifeline.forget(p.pid)
        print(json.dumps({"keeper": keeper, "after": lifeline.keeper_pid(), "sleep": p.pid}),
              flush=True)
        time.sleep(600)
        """, tmp_path)
    try:
        assert isinstance(pids["keeper"], int) and pids["after"] is None
        _gone([pids["keeper"]], timeout=5)
    finally:
        _kill9(proc)
    try:
        time.sleep(0.5)
        assert pid_alive(pids["sleep"])   # forgotten: nobody ended it
    finally:
        os.kill(pids["sleep"], signal.SIGKILL)


def test_the_keeper_never_signals_a_pid_given_to_another_process():
    from statekit import lifeline

    me = os.getpid()
    assert lifeline._alive(me, lifeline.start_time(me))
    assert not lifeline._alive(me, "1")   # another start time: another process


def test_a_registry_dies_with_the_process_that_started_it(tmp_path):
    proc, pids = _starter(f"""
        import json, time
        from statekit import registry
        h = registry.start(dir={str(tmp_path / 'reg')!r})
        print(json.dumps({{"registry": h.pid}}), flush=True)
        time.sleep(600)
        """, tmp_path)
    assert pid_alive(pids["registry"])
    _kill9(proc)
    _gone([pids["registry"]])


@pytest.mark.spark
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_jvm_that_ignores_the_end_of_its_stdin_dies_with_a_start_cut_short(tmp_path):
    """The local JVM exits at EOF on its stdin, but not once it is in its shutdown hooks (a kernel
    shut down while Spark starts SIGTERMs it mid-construction, and the hooks can wait forever).
    Here the JVM is stopped (SIGSTOP: it reads nothing) as soon as it is launched, and its starter
    is killed before `getOrCreate` returns: the keeper still ends it."""
    proc, pids = _starter("""
        import json, os, threading, time
        from statekit.engine.spark import procs
        from statekit.engine.spark.session import get_session
        threading.Thread(target=get_session, daemon=True).start()
        deadline = time.monotonic() + 120
        jvm = []
        def launched(p):   # bash spark-submit, spark-class, java; not a child still between
            try:           # fork and exec (its command line is still this code's, words and all)
                if os.path.basename(os.readlink(f"/proc/{p}/exe")).startswith("python"):
                    return False
            except OSError:
                return False
            return "spark-submit" in procs.cmdline(p) or "SparkSubmit" in procs.cmdline(p)

        while not jvm and time.monotonic() < deadline:
            jvm = [p for p in procs.children(os.getpid()) if launched(p)]
            time.sleep(0.02)
        print(json.dumps({"jvm": jvm[0] if jvm else None}), flush=True)
        time.sleep(600)
        """, tmp_path)
    if pids["jvm"] is None:
        _kill9(proc)
        raise AssertionError("no JVM was launched within 120 s")
    _stop_then_kill_the_starter(proc, pids["jvm"])


def _stop_then_kill_the_starter(proc, jvm: int) -> None:
    from statekit import lifeline

    try:
        os.kill(jvm, signal.SIGSTOP)
        time.sleep(1.0)   # (the starter's watcher looks every 0.2 s)
    finally:
        _kill9(proc)
    try:
        _gone([jvm], timeout=lifeline.KEEPER_GRACE_S + 20)
    finally:
        if pid_alive(jvm):
            os.kill(jvm, signal.SIGKILL)


@pytest.mark.spark
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_started_jvm_that_ignores_the_end_of_its_stdin_dies_with_its_starter(tmp_path):
    """The same once Spark has started (a kernel interrupted later: its JVM was found alive 30 s
    after, its shutdown hooks not done): kept until statekit stops it."""
    proc, pids = _starter("""
        import json, time
        from statekit import lifeline
        from statekit.engine.spark.session import _jvm_pid, get_session
        get_session()
        print(json.dumps({"jvm": _jvm_pid(), "keeper": lifeline.keeper_pid()}), flush=True)
        time.sleep(600)
        """, tmp_path)
    try:
        assert isinstance(pids["keeper"], int), pids
    finally:
        _stop_then_kill_the_starter(proc, pids["jvm"])


def test_what_pysparks_popen_launches_is_kept_before_the_watcher_looks(tmp_path):
    """A kernel shut down while its session starts can end before the watcher's first look (seen
    in CI: that JVM's main thread failed on the connection file pyspark had removed, and py4j's
    server thread kept it alive for good, its stdin never read). What pyspark's Popen launches is
    kept as it returns: a process the watcher would not even recognise dies with its starter."""
    proc, pids = _starter("""
        import json, os
        import pyspark.java_gateway as gateway
        from statekit.engine.spark.jvm_launch import JvmKeeper
        with JvmKeeper():
            p = gateway.Popen(["sleep", "600"])
            print(json.dumps({"sleep": p.pid}), flush=True)
            os._exit(0)   # at once: the watcher (every 0.2 s) has not looked
        """, tmp_path)
    try:
        proc.wait(10)
        _gone([pids["sleep"]], timeout=20)
    finally:
        if pid_alive(pids["sleep"]):
            os.kill(pids["sleep"], signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()


def test_a_jvm_launched_by_a_start_that_was_interrupted_is_ended_at_once():
    """Ctrl-C landing in pyspark's wait for the JVM: the start raises, and what it launched must
    not live on in a kernel that goes on (its main thread dead, py4j's server thread alive)."""
    import pyspark.java_gateway as gateway

    from statekit import lifeline
    from statekit.engine.spark.jvm_launch import JvmKeeper

    keeper = JvmKeeper()
    with pytest.raises(KeyboardInterrupt):
        with keeper:
            assert lifeline.keeper_pid() is not None     # running before the launch
            p = gateway.Popen(["sleep", "600"])
            raise KeyboardInterrupt
    assert p.poll() is not None                           # ended and reaped, not at exit
    assert p.pid not in keeper.kept


def test_a_launch_interrupted_inside_pysparks_popen_is_ended_too(monkeypatch):
    """Ctrl-C landing inside pyspark's Popen, after the fork and before it returned (seen in CI on
    a loaded machine: the JVM outlived its kernel, its main thread dead on the connection file
    pyspark had removed): no Popen object names that child, yet it is ended and reaped; a Spark
    launch that was already this process's child (a session that runs) is left alone."""
    import subprocess
    import sys

    import pyspark.java_gateway as gateway

    from statekit.engine.spark.jvm_launch import JvmKeeper

    def launch():   # a child whose command line says SparkSubmit, as a JVM's does
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                 "org.apache.spark.deploy.SparkSubmit"])

    older = launch()                       # before the start: not the start's to end
    lost = []

    def interrupted_popen(*args, **kwargs):
        lost.append(launch().pid)          # forked, then the interrupt: nothing returned
        raise KeyboardInterrupt

    monkeypatch.setattr(gateway, "Popen", interrupted_popen)
    try:
        keeper = JvmKeeper()
        with pytest.raises(KeyboardInterrupt):
            with keeper:
                gateway.Popen(["spark-submit"])
        assert not pid_alive(lost[0])       # ended and reaped (no zombie left either)
        with pytest.raises(ChildProcessError):
            os.waitpid(lost[0], os.WNOHANG)
        assert older.poll() is None
    finally:
        older.kill()
        older.wait()
        for pid in lost:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_jvm_of_a_start_that_succeeded_is_left_running():
    import pyspark.java_gateway as gateway

    from statekit.engine.spark.jvm_launch import JvmKeeper

    keeper = JvmKeeper()
    with keeper:
        p = gateway.Popen(["sleep", "600"])
    try:
        assert p.poll() is None and p.pid in keeper.kept
    finally:
        p.kill()
        p.wait()
        keeper.release()


def test_the_jvm_keeper_puts_pysparks_popen_back():
    import pyspark.java_gateway as gateway

    from statekit.engine.spark.jvm_launch import JvmKeeper

    before = gateway.Popen
    with JvmKeeper():
        assert gateway.Popen is not before
    assert gateway.Popen is before


def test_statekits_python_children_get_two_malloc_arenas_unless_told_otherwise(monkeypatch):
    from statekit import lifeline

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert lifeline.child_options()["env"]["MALLOC_ARENA_MAX"] == "2"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert lifeline.child_options()["env"]["MALLOC_ARENA_MAX"] == "4"
