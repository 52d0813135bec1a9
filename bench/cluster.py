"""A word count on a real Spark standalone cluster of three workers on this machine (executors
placement): do tasks stay where their state is, and what does losing an executor cost?

    .venv/bin/python bench/cluster.py [--batches 30] [--keys 20000] [--per-batch 2000]
                                      [--phases warmup,steady,baseline,instances,kill,kill-warm,kill-warm1]

Starts (and always stops) an embedded broker, a standalone master and three workers (one core,
512 MB executors each), and one SparkSession on it. The tour's word count (``group_by_key().count``
over ``words``, keyed by word), four tasks; the store is seeded with ``--keys`` words first.

* steady: ``--batches`` micro-batches of ``--per-batch`` records with nothing failing, after a
  first batch that opens every task. From the tasks' events: how often a task's executor changed
  between consecutive batches (moves), how many task opens and changelog records restored there
  were after the first batch, and the median micro-batch time;
* baseline: the same with the task-to-executor locality off (``STATEKIT_EXECUTOR_LOCALITY=off``:
  each task's batch runs wherever Spark puts it and reopens its store, what the executors
  placement did before tasks stayed put);
* instances: the same micro-batches with ``placement="instances"`` on the same session (instance
  processes beside the driver; every executor is on this machine), for the per-batch time;
* kill / kill-warm / kill-warm1: the store seeded with ``--kill-keys`` words, then records flow
  (a trigger every second); the executor running the
  most tasks is SIGKILLed (usually mid-batch: batches run back to back); measured: the seconds from
  the kill until every task it ran has committed again on another executor, and the changelog
  records those tasks restored — without a warm copy (``standby_replicas=0``), with one on every
  other executor (``standby_replicas=2``: a standby tailing each task's changelog on each of the
  two others, where this cluster has room), and with one on one other executor
  (``standby_replicas=1``: the retry of the batch in flight goes where Spark puts it, which may not
  be there).

A warm-up app (five micro-batches, not measured) runs first, so that no phase pays for the JVMs'
and Python workers' first batches.

Ends with its figures (baselines measured in this run), the summary line last:

    FIGURE name=cluster_restored_after_first value=<records> unit=records baseline=<locality off> ratio=...
    FIGURE name=cluster_batch_ms value=<ms, executors> unit=ms baseline=<ms, instances> ratio=...
    FIGURE name=cluster_batch_ms_locality_off value=<ms, executors> unit=ms baseline=<ms, locality off> ratio=...
    FIGURE name=cluster_kill_recovery value=<s, warm copies> unit=s baseline=<s, none> ratio=...
    FIGURE name=cluster_kill_restored value=<records, warm copies> unit=records baseline=<none> ratio=...
    FIGURE name=cluster_kill_recovery_one_standby value=<s, one standby> unit=s baseline=<s, none> ratio=...
    FIGURE name=cluster_kill_restored_one_standby value=<records, one standby> unit=records baseline=<none> ratio=...
    RESULT name=cluster_task_moves value=<moves> unit=moves baseline=<moves, locality off> ratio=...
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PARTITIONS = 4
WORKERS = 3
LOCALITY_ENV = "STATEKIT_EXECUTOR_LOCALITY"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def words(n: int) -> list:
    return [f"w{i:05d}" for i in range(n)]


def produce(kafka, topic: str, vocab: list, n: int, rnd: random.Random) -> None:
    """``n`` records keyed by a word of ``vocab`` (value: the word), each to its key's partition."""
    from statekit.partition import partition_for

    by_p: dict = {}
    for w in rnd.choices(vocab, k=n):
        kb = w.encode()
        by_p.setdefault(partition_for(kb, PARTITIONS), []).append((kb, kb))
    kafka.send_many([(topic, p, recs) for p, recs in sorted(by_p.items())])


def seed(kafka, topic: str, vocab: list) -> None:
    """Every word once: each task's store starts with about len(vocab)/4 keys."""
    from statekit.partition import partition_for

    by_p: dict = {}
    for w in vocab:
        kb = w.encode()
        by_p.setdefault(partition_for(kb, PARTITIONS), []).append((kb, kb))
    kafka.send_many([(topic, p, recs) for p, recs in sorted(by_p.items())])


def new_app(name: str, bootstrap: str, work: str, spark, placement: str, standby_replicas: int = 0):
    """The tour's word count over the topic ``<name>-words``."""
    import statekit

    app = statekit.App(name, bootstrap=bootstrap, partitions=PARTITIONS,
                       state_dir=os.path.join(work, "apps", name), spark=spark,
                       placement=placement, standby_replicas=standby_replicas,
                       checkpoint_location=os.path.join(work, "checkpoints", name))
    app.stream(f"{name}-words").group_by_key().count(store="counts")
    return app


def batch_executors(app) -> dict:
    """``{batch: {task: executor}}`` from the commit events."""
    out: dict = {}
    for e in app.events(types="commit"):
        out.setdefault(int(e.batch), {})[e.task] = e.instance
    return out


def steady(name, bootstrap, work, spark, kafka, vocab, args, placement="executors") -> dict:
    """The seed, then ``args.batches`` micro-batches of ``args.per_batch`` records (the seed takes
    the first few), nothing failing."""
    rnd = random.Random(7)
    topic = f"{name}-words"
    kafka.ensure_topic(topic, PARTITIONS)
    app = new_app(name, bootstrap, work, spark, placement)
    seed(kafka, topic, vocab)
    for _ in range(args.batches):
        produce(kafka, topic, vocab, args.per_batch, rnd)
    try:
        app.start(max_records_per_trigger=args.per_batch, sink="none")
        assert app.process_all_available(timeout=1800), "the batches did not finish"
        by_batch = batch_executors(app)
        first = min(by_batch)
        first_done = max(e.ts for e in app.events(types="commit") if e.batch == first)
        opens = [e for e in app.events(types="task_opened") if e.ts > first_done]
        prog = [p for p in app.progress() if (p.get("num_input_rows") or 0) > 0]
    finally:
        app.stop()
    batches = sorted(b for b in by_batch if b != first)
    moves = 0
    prev = dict(by_batch[first])
    for b in batches:
        for t, x in sorted(by_batch[b].items()):
            if t in prev and prev[t] != x:
                moves += 1
            prev[t] = x
    times = [p["batch_duration_ms"] for p in prog[-args.batches:]]
    res = {"batches": len(batches) + 1, "moves": moves, "opens": len(opens),
           "restored": sum(int(e.restored or 0) for e in opens),
           "batch_ms": statistics.median(times) if times else float("nan"),
           "executors": sorted({x for b in batches for x in by_batch[b].values()}, key=str)}
    log(f"{name} ({placement}): {res}")
    return res


class Producer(threading.Thread):
    def __init__(self, kafka, topic, vocab, rate: int):
        super().__init__(daemon=True)
        self.kafka, self.topic, self.vocab, self.rate = kafka, topic, vocab, rate
        self.halt = threading.Event()

    def run(self):
        rnd = random.Random(11)
        while not self.halt.wait(0.2):
            produce(self.kafka, self.topic, self.vocab, max(1, self.rate // 5), rnd)


def kill(name, bootstrap, work, spark, kafka, vocab, cluster, standby_replicas: int, args) -> dict:
    """Records flow; the executor with the most tasks is killed; its tasks' recovery."""
    topic = f"{name}-words"
    kafka.ensure_topic(topic, PARTITIONS)
    app = new_app(name, bootstrap, work, spark, "executors", standby_replicas)
    seed(kafka, topic, vocab)
    prod = Producer(kafka, topic, vocab, args.rate)
    try:
        app.start(trigger=1.0, sink="none")
        assert app.process_all_available(timeout=900), "the seed did not finish"
        prod.start()
        time.sleep(args.settle)                    # standbys catch up, batches flow
        last: dict = {}
        for e in app.events(types="commit"):
            last[e.task] = e.instance
        per_exec: dict = {}
        for t, x in last.items():
            per_exec.setdefault(x, []).append(t)
        victim = max(sorted(per_exec, key=str), key=lambda x: len(per_exec[x]))
        tasks = sorted(per_exec[victim])
        t_kill = time.time()
        cluster.kill_executor(str(victim))
        log(f"{name}: killed executor {victim} (tasks {tasks})")
        back: dict = {}
        deadline = time.monotonic() + 300
        while len(back) < len(tasks) and time.monotonic() < deadline:
            for e in app.events(types="commit", since=t_kill):
                if e.task in tasks and e.task not in back and e.instance != victim:
                    back[e.task] = e.ts - t_kill
            time.sleep(0.1)
        opens = [e for e in app.events(types="task_opened", since=t_kill) if e.task in tasks]
        prod.halt.set()
        prod.join()
        app.process_all_available(timeout=300)
    finally:
        prod.halt.set()
        app.stop()
    res = {"victim": victim, "tasks": tasks, "recovery_s": max(back.values()) if len(back) == len(tasks)
           else float("nan"), "per_task_s": {t: round(s, 2) for t, s in sorted(back.items())},
           "restored": sum(int(e.restored or 0) for e in opens),
           "opens": [(e.task, e.instance, e.source, e.restored) for e in opens]}
    log(f"{name} (standby_replicas={standby_replicas}): {res}")
    return res


def result(name, value, unit, baseline) -> str:
    ratio = value / baseline if baseline else float("nan")
    return (f"RESULT name={name} value={value:.6g} unit={unit} baseline={baseline:.6g} "
            f"ratio={ratio:.4g}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--per-batch", type=int, default=2_000)
    ap.add_argument("--kill-keys", type=int, default=200_000,
                    help="words seeded in the kill phases (the state a cold restore replays)")
    ap.add_argument("--rate", type=int, default=2_000, help="records/s during the kill phases")
    ap.add_argument("--settle", type=float, default=8.0, help="seconds of flow before the kill")
    ap.add_argument("--phases", default="warmup,steady,baseline,instances,kill,kill-warm,kill-warm1")
    args = ap.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from statekit import broker as broker_mod
    from statekit.engine.spark.session import get_session, stop_session
    from statekit.engine.spark.standalone import StandaloneCluster
    from statekit.kafka import Kafka

    work = tempfile.mkdtemp(prefix="statekit-bench-cluster-")
    handle = cluster = kafka = None
    out: dict = {}
    t0 = time.monotonic()
    try:
        handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
        cluster = StandaloneCluster(os.path.join(work, "cluster"), workers=WORKERS, cores=1,
                                    memory="768m").start()
        spark = get_session("statekit-bench-cluster", master=cluster.master_url,
                            extra_conf={"spark.executor.memory": "512m",
                                        "spark.executor.cores": "1"})
        cluster.wait_executors(WORKERS)
        log(f"cluster up in {time.monotonic() - t0:.0f}s: {cluster.executors()}")
        kafka = Kafka(handle.bootstrap)
        vocab = words(args.keys)
        for i, phase in enumerate(phases):
            name = f"wc{i}"
            if phase == "warmup":
                small = argparse.Namespace(**{**vars(args), "batches": 5, "per_batch": 500})
                steady(name, handle.bootstrap, work, spark, kafka, vocab[:2000], small)
            elif phase == "steady":
                out[phase] = steady(name, handle.bootstrap, work, spark, kafka, vocab, args)
            elif phase == "baseline":
                os.environ[LOCALITY_ENV] = "off"
                try:
                    out[phase] = steady(name, handle.bootstrap, work, spark, kafka, vocab, args)
                finally:
                    os.environ.pop(LOCALITY_ENV, None)
            elif phase == "instances":
                out[phase] = steady(name, handle.bootstrap, work, spark, kafka, vocab, args,
                                    placement="instances")
            elif phase in ("kill", "kill-warm", "kill-warm1"):
                k = {"kill": 0, "kill-warm": WORKERS - 1, "kill-warm1": 1}[phase]
                out[phase] = kill(name, handle.bootstrap, work, spark, kafka, words(args.kill_keys),
                                  cluster, k, args)
                cluster.wait_executors(WORKERS, timeout=180)
            else:
                raise SystemExit(f"unknown phase {phase!r}")
    finally:
        stop_session()
        if kafka is not None:
            kafka.close()
        left = cluster.stop() if cluster is not None else []
        if handle is not None:
            handle.stop()
        shutil.rmtree(work, ignore_errors=True)
        log(f"stopped everything after {time.monotonic() - t0:.0f}s (left running: {left})")
    lines = []
    s, b, i = out.get("steady"), out.get("baseline"), out.get("instances")
    if s and b:
        lines.append(result("cluster_task_moves", s["moves"], "moves", b["moves"]))
        lines.append(result("cluster_restored_after_first", s["restored"], "records", b["restored"]))
    if s and i:
        lines.append(result("cluster_batch_ms", s["batch_ms"], "ms", i["batch_ms"]))
    if s and b:
        lines.append(result("cluster_batch_ms_locality_off", s["batch_ms"], "ms", b["batch_ms"]))
    k, w, w1 = out.get("kill"), out.get("kill-warm"), out.get("kill-warm1")
    if k and w:
        lines.append(result("cluster_kill_recovery", w["recovery_s"], "s", k["recovery_s"]))
        lines.append(result("cluster_kill_restored", w["restored"], "records", k["restored"]))
    if k and w1:
        lines.append(result("cluster_kill_recovery_one_standby", w1["recovery_s"], "s",
                            k["recovery_s"]))
        lines.append(result("cluster_kill_restored_one_standby", w1["restored"], "records",
                            k["restored"]))
    # the headline (task moves with locality against without) is the one summary line, last
    head = [ln for ln in lines if " name=cluster_task_moves " in ln]
    rest = [ln.replace("RESULT ", "FIGURE ", 1) for ln in lines if ln not in head]
    print("\n".join(rest + head))
    return 0


if __name__ == "__main__":
    sys.exit(main())
