"""The driver stays light: a statekit query's plan (`session.map_in_arrow`) and the py4j calls of a
session never import pandas or pyarrow into the kernel (pyspark's numpy converters and `mapInArrow` would:
~45 MB of the driver's PSS), Spark's idle data source planners are ended
(`engine.spark.planners`), and Spark's lookup of installed data sources runs beside the session's
construction."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from statekit.child_server import pid_alive
from waiting import ended_within

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.spark
def test_a_statekit_stage_runs_without_pandas_in_the_driver(tmp_path):
    code = textwrap.dedent("""
        import json, sys
        from statekit.engine.spark import session
        spark = session.get_session()
        def double(batches):
            import pyarrow as pa
            import pyarrow.compute as pc
            for b in batches:
                yield pa.RecordBatch.from_arrays([pc.multiply(b.column(0), 2)], names=["x"])
        try:
            import time
            deadline = time.monotonic() + 60
            from statekit.engine.spark.data_source_lookup import EARLY_LOOKUP
            while "ok" not in EARLY_LOOKUP and time.monotonic() < deadline:
                time.sleep(0.05)
            df = session.map_in_arrow(spark.range(5).repartition(2), double, "x long")
            rows = sorted(r.x for r in df.collect())
            spark.sparkContext.parallelize([1, 2, 3]).count()     # a list through py4j
            from statekit.engine.spark import procs
            from statekit.engine.spark.fork_server import real_pid
            fs = session._OWNED.fork_server
            daemons = [p for p in procs.children(session._jvm_pid())
                       if "statekit.engine.spark.worker_daemon" in procs.cmdline(p)]
            served = bool(daemons) and all(procs.parent(real_pid(p, fs.path)) == fs.proc.pid
                                           for p in daemons)
            print(json.dumps({"rows": rows, "pandas": "pandas" in sys.modules,
                              "pyarrow": "pyarrow" in sys.modules,
                              "early_lookup": EARLY_LOOKUP.get("ok"), "served": served}), flush=True)
        finally:
            session.stop_session()
        print(json.dumps({"server_ended": fs.proc.poll() is not None}), flush=True)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-2])
    # Spark's lookup of installed Python data sources ran beside the session's construction
    # (`engine.spark.data_source_lookup`): the names it calls are this Spark's. The workers'
    # daemon runs as a child of the session's fork server (engine.spark.fork_server), which
    # ends with the session
    assert got == {"rows": [0, 2, 4, 6, 8], "pandas": False, "pyarrow": False, "early_lookup": True,
                   "served": True}
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"server_ended": True}


@contextlib.contextmanager
def _fake_jvm(*children):
    """A stand-in JVM (its own process group, killed at the end) that starts ``children``, each
    (module, busy): ``python -m pyspark.daemon <module>`` (no module: a plain process), with a
    child of its own when busy (a daemon's forked worker). Yields (the JVM, their pids), once every
    busy one has its child."""
    from statekit.engine.spark import procs

    code = textwrap.dedent(f"""
        import subprocess, sys, time
        sleep = "import time; time.sleep(120)"
        busy = ("import subprocess, sys, time; "
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
                "time.sleep(120)")
        kids = [subprocess.Popen([sys.executable, "-c", busy if b else sleep]
                                 + (["-m", "pyspark.daemon", m] if m else []))
                for m, b in {list(children)!r}]
        print(*[k.pid for k in kids], flush=True)
        time.sleep(120)
        """)
    jvm = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        pids = [int(p) for p in jvm.stdout.readline().split()]
        deadline = time.monotonic() + 30
        while (not all(procs.children(p) for p, (_m, b) in zip(pids, children) if b)
               and time.monotonic() < deadline):
            time.sleep(0.05)
        yield jvm, pids
    finally:
        os.killpg(jvm.pid, signal.SIGKILL)
        jvm.wait()


def test_idle_planner_daemons_are_ended_busy_ones_kept(tmp_path):
    from statekit.engine.spark import planners

    # two planner daemons, one of which has a worker forked, and the workers' daemon
    with _fake_jvm(("pyspark.sql.worker.lookup_data_sources", False),
                   ("pyspark.sql.worker.plan_data_source_read", True),
                   ("pyspark.worker", False)) as (jvm, (idle, worked, other)):
        assert planners.planner_daemons(jvm.pid) == {idle: "lookup_data_sources",
                                                     worked: "plan_data_source_read"}
        # idle on this pass only (it could be one Spark is starting): kept until the next pass
        seen: set = set()
        assert planners.end_idle_planners(jvm.pid, seen) == [] and pid_alive(idle)
        assert [pid for pid, _t in seen] == [idle]
        assert planners.end_idle_planners(jvm.pid, seen) == ["lookup_data_sources"] and not seen
        assert ended_within(idle, 30) and pid_alive(worked) and pid_alive(other)


def test_a_planner_daemon_the_fork_server_runs_is_judged_by_its_child(tmp_path):
    """The reaper looks for a daemon's workers below the fork server's child it stands for
    (engine.spark.fork_server), not below the stand-in the JVM started."""
    from statekit.engine.spark import planners

    with _fake_jvm(("pyspark.sql.worker.create_data_source", False),
                   ("pyspark.sql.worker.lookup_data_sources", False),
                   (None, True)) as (jvm, (a, b, child)):
        sock = str(tmp_path / "fs.sock")
        with open(sock + ".pids", "w") as f:
            json.dump({str(a): child}, f)                 # a stands for a daemon with a worker
        assert planners.end_idle_planners(jvm.pid, None, sock) == ["lookup_data_sources"]
        assert ended_within(b) and not ended_within(a, timeout=0.3)
        assert planners.end_idle_planners(jvm.pid, None, None) == ["create_data_source"]
        assert ended_within(a)
