"""What a started app costs a workshop server while it waits for input: CPU and memory of every
process it started (the broker, Spark's JVM and Python workers, the instances, and this process,
the kernel's stand-in), against the same figures of a plain Spark query over the same source.

    .venv/bin/python bench/footprint.py [--seconds 20] [--instances 2]

Starts its own embedded broker (temp dir, port 0) and the local Spark session, starts an App (a
count, `--instances` instances), feeds it a little input, waits until it is idle, then samples
/proc for `--seconds` once Spark's idle Python workers have gone (`session.PYTHON_WORKER_IDLE_S`):
CPU (utime + stime of every process in the tree, in cores) and memory (the
sum of their resident sets; shared pages count once per process, as `ps` shows them). The baseline,
in the same run, is a Spark query reading the same topic with the same source into a noop sink.
Then, for "returns to full speed on new data", a record is sent and the time until its count is
queryable is printed.

Last line:

    RESULT name=footprint_idle_cpu value=<cores> unit=cores baseline=<spark query cores> ratio=...
(after `FIGURE name=footprint_rss value=<MB> unit=MB baseline=<spark query MB> ratio=...`)
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def tree(root: int) -> list:
    """`root` and every descendant (from /proc)."""
    kids: dict = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def cpu_seconds(pids) -> float:
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass
    return total / _TICK


def rss_mb(pids) -> float:
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e6


def sample(pids_fn, seconds: float) -> tuple:
    """(cores used over `seconds`, peak RSS MB) of the processes `pids_fn()` lists."""
    pids = pids_fn()
    c0, t0 = cpu_seconds(pids), time.monotonic()
    peak = rss_mb(pids)
    while time.monotonic() - t0 < seconds:
        time.sleep(1.0)
        pids = pids_fn()
        peak = max(peak, rss_mb(pids))
    return (cpu_seconds(pids) - c0) / (time.monotonic() - t0), peak


def _idle_wait(given) -> float:
    from statekit.engine.spark.session import PYTHON_WORKER_IDLE_S

    return PYTHON_WORKER_IDLE_S + 15 if given is None else given


def measure_app(boot, work, instances, seconds, idle_wait=None) -> dict:
    import statekit
    from statekit.datagen import produce_fast

    produce_fast("idle", "accounts", seed=1, limit=20_000, keys=20_000, bootstrap=boot,
                 partitions=4)
    app = statekit.App("idle", bootstrap=boot, instances=instances,
                       state_dir=os.path.join(work, "idle"))
    app.stream("idle", value_serde="json").group_by_key().count(store="counts")
    app.start()
    try:
        if not app.process_all_available(timeout=300):
            raise RuntimeError(f"the app did not catch up: {app.state} {app.error}")
        time.sleep(_idle_wait(idle_wait))              # idle: nothing left to do
        cpu, rss = sample(lambda: tree(os.getpid()), seconds)
        # back to full speed on new data: one record, until its count is queryable
        from statekit.kafka import Kafka
        from statekit.partition import partition_for

        with Kafka(boot) as k:
            key = b"acct-new"
            t0 = time.monotonic()
            k.send("idle", partition_for(key, 4), [(key, b'{"amount": 1}')])
        while app.query("counts", "acct-new") != 1:
            time.sleep(0.005)
        wake = time.monotonic() - t0
    finally:
        app.stop()
    return {"cpu": cpu, "rss": rss, "wake": wake}


def measure_plain_query(boot, work, seconds, idle_wait=None) -> dict:
    from statekit.engine.spark.session import get_session

    spark = get_session()
    q = (spark.readStream.format("statekit-kafka").option("bootstrap", boot)
         .option("topic", "idle").load()
         .writeStream.format("noop").option("checkpointLocation", os.path.join(work, "plain"))
         .start())
    try:
        q.processAllAvailable()
        time.sleep(_idle_wait(idle_wait))
        cpu, rss = sample(lambda: tree(os.getpid()), seconds)
    finally:
        q.stop()
    return {"cpu": cpu, "rss": rss}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--idle-wait", type=float, default=None,
                    help="seconds idle before sampling (default: until Spark's idle Python "
                         "workers have gone)")
    args = ap.parse_args(argv)

    from statekit import broker as broker_mod
    from statekit.engine.spark.session import stop_session

    work = tempfile.mkdtemp(prefix="statekit-bench-footprint-")
    handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
    try:
        app = measure_app(handle.bootstrap, work, args.instances, args.seconds, args.idle_wait)
        plain = measure_plain_query(handle.bootstrap, work, args.seconds, args.idle_wait)
        print(f"started app, idle ({args.instances} instances): {app['cpu']:.3f} cores, "
              f"{app['rss']:.0f} MB resident (broker, JVM, Python workers, instances, this "
              f"process); a new record counted {app['wake'] * 1000:.0f} ms after its send", flush=True)
        print(f"a plain Spark query on the same source, idle: {plain['cpu']:.3f} cores, "
              f"{plain['rss']:.0f} MB", flush=True)
        print(f"FIGURE name=footprint_rss value={app['rss']:.0f} unit=MB baseline={plain['rss']:.0f} "
              f"ratio={app['rss'] / plain['rss']:.3f}", flush=True)
        print(f"RESULT name=footprint_idle_cpu value={app['cpu']:.3f} unit=cores "
              f"baseline={plain['cpu']:.3f} ratio={app['cpu'] / max(plain['cpu'], 1e-6):.3f}",
              flush=True)
    finally:
        try:
            stop_session()
        finally:
            handle.stop()
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
