"""The cluster test's scenario, run in a process of its own (``python tests/cluster/scenario.py ROOT``):
one SparkContext per process, so a cluster session cannot share a process with the local session
of the other Spark tests.

A real standalone cluster (master + two workers, each with its own work and local directories,
every port ephemeral) and an embedded broker; the harness's word count and windowed count with
``placement="auto"`` on the cluster's master (the executors placement), one standby per task, the
session passed as ``App(spark=...)``:

1. steady: two chunks of input in small micro-batches, nothing failing (every task should open once
   and stay on its executor);
2. an executor killed mid-batch by a crash directive (its JVM SIGKILLed by the Python worker that
   claims it; its state directory stays): its tasks move to the other executor, which holds their
   standbys;
3. another one killed mid-batch with its state directory deleted (disk-loss);
4. a last chunk.

Writes ``ROOT/result.json`` with what the assertions need (the stores as the driver's query replicas
hold them, the plain-Python references, the memory sink, events, state directories, lag) and keeps
``ROOT/pids.json`` current with every process of the cluster, so the parent can check — and make —
that every one of them is gone.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))                      # tests/ (the shared helpers)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "runtime"))

import harness as H  # noqa: E402
from standalone import StandaloneCluster, cmdline, descendants  # noqa: E402
from statekit.engine.spark.procs import parent  # noqa: E402

SEED = 14
PARTITIONS = 4
STEADY_BATCH = 12        # records per micro-batch in the steady phase


def _write(path: str, body) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(body, f, default=str)
    os.replace(tmp, path)


def _task_dirs(root: str) -> list:
    """Task directories under an executors' state root: ``<deployment>/<app>/<task>``."""
    import glob

    return sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "*", "*", "*_*"))
                  if os.path.isdir(p))


def _events(app, types) -> list:
    return [e.to_dict() for e in app.events(types=types)]


def run(root: str) -> dict:
    from statekit import broker as broker_mod
    from statekit.engine.spark.session import get_session, stop_session
    from statekit.kafka import Kafka

    t0 = time.monotonic()
    marks = {}
    res: dict = {"marks": marks}
    pids_path = os.path.join(root, "pids.json")
    cluster = StandaloneCluster(os.path.join(root, "cluster"), workers=2, cores=1, memory="1g")
    broker = k = app = None
    try:
        broker = broker_mod.start(dir=os.path.join(root, "broker"), port=0)
        cluster.start()
        _write(pids_path, sorted(cluster._seen))
        marks["cluster_up"] = time.monotonic() - t0
        spark = get_session("statekit-cluster-test", master=cluster.master_url,
                            extra_conf={"spark.executor.memory": "512m", "spark.executor.cores": "1"})
        executors = cluster.wait_executors(2)
        _write(pids_path, sorted(cluster._seen))
        res["executors_at_start"] = executors
        pids = {p for r in cluster._seen for p in [r, *descendants(r)]}
        # (a JVM forking a child shows that child with its own command line until it execs)
        res["cluster_jvms"] = [c for p, c in ((p, cmdline(p)) for p in sorted(pids))
                               if "java" in c.split(" ")[0] and cmdline(parent(p) or 0) != c]
        marks["session_up"] = time.monotonic() - t0

        k = Kafka(broker.bootstrap)
        k.ensure_topic("lines", PARTITIONS)
        k.ensure_topic("clicks", PARTITIONS)
        app = H.build_app("wc", broker, os.path.join(root, "driver-state"), SEED, engine="changelog",
                          partitions=PARTITIONS, instances=1, standby_replicas=1, cache_bytes=2048,
                          checkpoint_location=os.path.join(root, "shared", "checkpoint"), spark=spark)
        rnd = random.Random(SEED)
        chunks = H.make_chunks(SEED, 5, lines_per_chunk=12, clicks_per_chunk=20)

        # 1. steady: small micro-batches, nothing failing
        H.produce_chunk(k, chunks[0], rnd=rnd)
        H.produce_chunk(k, chunks[1], rnd=rnd)
        app.start(max_records_per_trigger=STEADY_BATCH)
        res["placement"] = app.placement
        res["scope"] = app._placement_extra.get("scope")
        res["first_drain"] = app.process_all_available(timeout=600)
        marks["steady"] = time.monotonic() - t0
        res["after_steady"] = {"counts": sorted(H.store_as_dict(app, "counts").items()),
                               "reference": sorted(H.wordcount_reference(k).items())}
        res["steady"] = {"opens": _events(app, "task_opened"), "commits": _events(app, "commit"),
                         "closes": _events(app, "task_closed")}
        # every task's warm copy is on the other executor before the first kill
        want = {str(t) for t in app.tasks()}
        deadline = time.monotonic() + 120
        while want - {e.task for e in app.events(types="replica_started")}:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        res["standbys_ready"] = not (want - {e.task for e in app.events(types="replica_started")})
        res["standbys"] = _events(app, "replica_started")

        crashes = []
        for chunk, mode, after in ((chunks[2], "executor", 3), (chunks[3], "disk-loss", 2)):
            before = time.time()
            rec = app.crash(mode, after_records=after)   # any executor, mid-batch
            H.produce_chunk(k, chunk, rnd=rnd)
            drained = app.process_all_available(timeout=600)
            claim = app.wait_for_event(lambda e: e.type == "crash" and
                                       e.get("directive") == rec["id"], 60)
            died = app.wait_for_event(lambda e: e.type == "instance_died" and e.ts >= before, 60)
            crashes.append({"mode": mode, "drained": drained, "state": str(app.state),
                            "claim": claim.to_dict() if claim is not None else None,
                            "died": died.to_dict() if died is not None else None})
            _write(pids_path, sorted(cluster._seen | {e["pid"] for e in cluster.executors()}))
            marks[f"after_{mode}"] = time.monotonic() - t0
        res["crashes"] = crashes
        H.produce_chunk(k, chunks[4], rnd=rnd)
        res["last_drain"] = app.process_all_available(timeout=600)
        marks["last_batch"] = time.monotonic() - t0

        res["state"] = str(app.state)
        res["error"] = str(app.error) if app.error else None
        res["stores"] = {
            "counts": sorted(H.store_as_dict(app, "counts").items()),
            "clicks-per-window": sorted([list(kk) + [v] for kk, v in
                                         H.store_as_dict(app, "clicks-per-window").items()])}
        res["reference"] = {
            "counts": sorted(H.wordcount_reference(k).items()),
            "clicks-per-window": sorted([list(kk) + [v] for kk, v in H.windowed_reference(k).items()])}
        out = app.output()
        res["output"] = [[int(b), t, key, int(v)] for b, t, key, v in
                         zip(out.batch, out.task, out.key, out.value)]
        res["commits"] = _events(app, "commit")
        res["opens"] = _events(app, "task_opened")
        res["promoted"] = _events(app, "standby_promoted")
        res["rebalances"] = _events(app, "rebalance")
        res["membership"] = _events(app, ["instance_started", "instance_died"])
        res["instances_frame"] = app.instances_frame().to_dict(orient="records")
        res["events"] = [e.to_dict() for e in app.events()]
        res["tasks"] = [str(t) for t in app.tasks()]
        res["lag"] = app.lag().to_dict(orient="records")
        res["owner"] = list(app.key_owner("counts", "the"))
        res["executors_at_end"] = cluster.executors()
        res["worker_task_dirs"] = {i: _task_dirs(os.path.join(cluster.local_dir(i), "statekit"))
                                   for i in range(cluster.n_workers)}
        res["driver_executor_dirs"] = _task_dirs(os.path.join(root, "driver-state", "executors"))
        res["checkpoint"] = sorted(os.listdir(os.path.join(root, "shared", "checkpoint", "0")))
        res["driver_checkpoint"] = os.path.exists(app.layout.checkpoint_root)
        _write(pids_path, sorted(cluster._seen))
    finally:
        if app is not None:
            app.stop()
        res["app_stopped_state"] = str(app.state) if app is not None else None
        stop_session()
        if k is not None:
            k.close()
        res["left_running"] = cluster.stop()
        if broker is not None:
            broker.stop()
        marks["stopped"] = time.monotonic() - t0
    return res


def main(root: str) -> int:
    out = os.path.join(root, "result.json")
    try:
        res = run(root)
    except BaseException:  # noqa: BLE001 - the parent reads the traceback
        _write(out, {"exception": traceback.format_exc()})
        return 1
    _write(out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
