"""Build state over Spark Connect as fast as over a classic session: the distinct-key count (bench/
ingest.py's build) on a local Spark Connect server against the same on a classic local session, in
one run.

    .venv/bin/python bench/connect.py [--records 1000000] [--partitions 4] [--instances 2]
                                      [--rounds 3]

Starts its own embedded broker (temp dir, port 0) and a local Spark Connect server
(``statekit.engine.spark.connect_server``, ``local[2]``, ephemeral port), and stops both at the
end, also on failure. The input is the ``accounts`` generator: ``--records`` records over as many
distinct keys, ``--partitions`` partitions. Each build runs in a process of its own (pyspark runs
one mode per process): a warm-up count over 100,000 other records (not reported: the JVM's hot
paths, the server's planners), then ``stream("accounts").group_by_key().count().to_stream().to(sink)``
on ``--instances`` instances, exactly-once, Kafka sink, the App's default micro-batch bound;
records / (the last commit - the first micro-batch's start). Classic and Connect alternate for
``--rounds`` rounds; the best of each is reported (three by default: in each of three three-round
runs measured here, the first build over Connect was its run's slowest, at 69-88% of the best's pace).

Last line:

    RESULT name=connect_count value=<records/s over Connect> unit=records/s baseline=<classic records/s> ratio=...
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def say(msg: str) -> None:
    print(msg, flush=True)


def _iso(ts: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def count_app(name, bootstrap, work, partitions, instances, topic):
    import statekit

    app = statekit.App(name, bootstrap=bootstrap, partitions=partitions, instances=instances,
                       state_dir=os.path.join(work, name))
    app.stream(topic, value_serde="json").group_by_key().count(store="counts") \
        .to_stream().to(f"{name}-out")
    return app


def build(app, n: int) -> dict:
    """Start (Kafka sink), wait for everything; records / (last commit - first batch start)."""
    app.start(sink="kafka")
    if not app.process_all_available(timeout=3600):
        raise RuntimeError(f"{app.name} did not finish: {app.state} {app.error}")
    commits = app.events(types="commit")
    done = sum(e.records for e in commits)
    if done != n:
        raise RuntimeError(f"{app.name} committed {done} records, not {n}")
    firsts = [p for p in app.progress() if p.get("batch_id") == 0 and p.get("timestamp")]
    t0 = _iso(firsts[0]["timestamp"]) if firsts else min(
        e.ts - (e.process_ms + e.commit_ms) / 1000 for e in commits if e.records)
    t1 = max(e.ts for e in commits)
    return {"rate": n / (t1 - t0), "seconds": t1 - t0, "batches": len({e.batch for e in commits})}


def child(args) -> int:
    """One build in this process, on ``--url`` (Spark Connect) or a classic local session."""
    from statekit.engine.spark.session import get_session, stop_session

    work = args.work
    get_session(master=args.url or None)
    try:
        warm = count_app(f"warm-{args.tag}", args.bootstrap, work, args.partitions, args.instances,
                         "warm-up")
        build(warm, args.warm_records)
        warm.stop()
        app = count_app(f"count-{args.tag}", args.bootstrap, work, args.partitions, args.instances,
                        "accounts")
        got = build(app, args.records)
        app.stop()
    finally:
        stop_session()
    print("BUILD " + json.dumps(got), flush=True)
    return 0


def run_child(mode: str, tag: str, url: str, bootstrap: str, work: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--tag", tag, "--bootstrap", bootstrap,
           "--work", work, "--records", str(args.records), "--warm-records", str(args.warm_records),
           "--partitions", str(args.partitions), "--instances", str(args.instances)]
    if mode == "connect":
        cmd += ["--url", url]
    env = dict(os.environ)
    for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_API_MODE", "STATEKIT_SPARK_MASTER"):
        env.pop(k, None)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=7200, env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("BUILD ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"the {mode} build failed: {p.stderr[-2000:]}")
    return json.loads(lines[-1][6:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--warm-records", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="", help=argparse.SUPPRESS)
    ap.add_argument("--url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", default="", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    from statekit import broker as broker_mod
    from statekit.datagen import produce_fast
    from statekit.engine.spark.connect_server import ConnectServer

    work = tempfile.mkdtemp(prefix="statekit-bench-connect-")
    handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
    server = None
    try:
        boot = handle.bootstrap
        n, parts = args.records, args.partitions
        t = time.perf_counter()
        produce_fast("accounts", "accounts", seed=1, limit=n, keys=n, bootstrap=boot, partitions=parts)
        produce_fast("warm-up", "accounts", seed=9, limit=args.warm_records, keys=args.warm_records,
                     bootstrap=boot, partitions=parts)
        say(f"input: {n} records over {n} keys, {parts} partitions, in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        server = ConnectServer(os.path.join(work, "connect-server"), master="local[2]").start()
        say(f"Spark Connect server at {server.url} in {time.perf_counter() - t:.1f} s")
        best = {"classic": None, "connect": None}
        for r in range(args.rounds):
            for mode in ("classic", "connect"):
                got = run_child(mode, f"{mode}{r}", server.url, boot, work, args)
                say(f"round {r + 1}, {mode}: {got['rate']:,.0f} records/s ({got['seconds']:.2f} s, "
                    f"{got['batches']} micro-batches)")
                if best[mode] is None or got["rate"] > best[mode]["rate"]:
                    best[mode] = got
        c, k = best["connect"]["rate"], best["classic"]["rate"]
        say(f"RESULT name=connect_count value={c:.0f} unit=records/s baseline={k:.0f} ratio={c / k:.3f}")
    finally:
        if server is not None:
            server.stop()
        handle.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
