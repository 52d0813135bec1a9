"""Build state as fast as it restores: statekit's columnar data path against RocksDB alone, against
the same store's restore, and against Spark's own aggregation, in one run.

    .venv/bin/python bench/ingest.py [--records 1000000] [--partitions 4] [--instances 2]
                                     [--latency-seconds 20] [--skip latency,cold]

Starts its own embedded broker (temp dir, port 0) and one local Spark session, and stops both at the
end, also on failure. The input is the `accounts` generator (`statekit.datagen`): keys are account
ids (UTF-8), values JSON `{"account", "amount"}`; `--records` records over as many distinct keys.

0. warm-up: a count over 100,000 other records first (not reported), so the JVM's
   JIT and Spark's Python workers are as warm as in a notebook that has run a cell.
1. rocksdict alone: the store's keys and 8-byte counts written through WriteBatches of 50,000
   (fsync'd, as a commit is) into a fresh RocksDB: the floor any store pays.
2. build: `stream("accounts").group_by_key().count().to_stream().to(sink)` on `--instances`
   instances and `--partitions` tasks, exactly-once (one Kafka transaction per task and batch),
   Kafka sink, the App's default micro-batch bound; records / (the last commit - the first
   micro-batch's start). The store is checked (sampled keys count 1).
3. restore: every instance loses its disk; the App restarts and every task restores its store from
   scratch from its changelog; records restored / (last restore end - first restore start).
4. aggregate: the same input through `aggregate()` with a Python function (count and sum of
   `amount`).
5. a keyed count over 10,000 keys (the tour's word count, `group_by_key().count()`), against Spark's
   `groupBy("key").count()` with its RocksDB state store provider, both reading the same topic
   through the `statekit-kafka` source with the same micro-batch bound and writing to Kafka.
6. start: a new App's `start()` to its first committed micro-batch over a topic of 10,000 records,
   with the Spark session up; and cold, in a fresh Python process that has no session (`--skip cold`
   leaves it out).
7. latency, the App's defaults: a producer process writes 2,000 records/s over 10,000 keys, a
   consumer process (confluent-kafka, read_committed) reads the counts; a record's latency is from
   its send until its key's count reaches it (`--skip latency` leaves it out).

Last lines:

    FIGURE name=ingest_count_vs_rocksdb value=<records/s> unit=records/s baseline=<rocksdict puts/s> ratio=...
    FIGURE name=ingest_aggregate value=<records/s> unit=records/s baseline=<count records/s> ratio=...
    FIGURE name=ingest_keyed_count value=<records/s> unit=records/s baseline=<Spark groupBy records/s> ratio=...
    FIGURE name=ingest_start value=<s> unit=s baseline=<cold s> ratio=...
    FIGURE name=ingest_latency_p50 value=<ms> unit=ms baseline=<p95 ms> ratio=...
    RESULT name=ingest_count value=<records/s> unit=records/s baseline=<restore records/s> ratio=<build/restore>
"""
from __future__ import annotations

import argparse
import json
import os
import random
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


def pct(values, q):
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _iso(ts: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


# -- 1. rocksdict alone ---------------------------------------------------------------------------

def rocksdict_alone(work: str, keys: list) -> float:
    import struct

    import rocksdict as rd

    from statekit.stores.rocksdb import _options

    path = os.path.join(work, "rocksdict-alone")
    db = rd.Rdict(path, _options(), column_families={"counts": _options()})
    try:
        h = db.get_column_family_handle("counts")
        wo = rd.WriteOptions()
        wo.sync = True
        one = struct.pack(">q", 1)
        t0 = time.perf_counter()
        for i in range(0, len(keys), 50_000):
            wb = rd.WriteBatch(raw_mode=True)
            for k in keys[i:i + 50_000]:
                wb.put(k, one, h)
            db.write(wb, wo)
        dt = time.perf_counter() - t0
    finally:
        db.close()
        shutil.rmtree(path, ignore_errors=True)
    return len(keys) / dt


# -- 2..4. the App ------------------------------------------------------------------------------------

def build_rate(app, n: int, out: dict) -> float:
    """Start (Kafka sink), wait for everything; records / (last commit - first batch start)."""
    app.start(sink="kafka")
    if not app.process_all_available(timeout=1800):
        raise RuntimeError(f"{app.name} did not finish: {app.state} {app.error}")
    commits = app.events(types="commit")
    done = sum(e.records for e in commits)
    if done != n:
        raise RuntimeError(f"{app.name} committed {done} records, not {n}")
    firsts = [p for p in app.progress() if p.get("batch_id") == 0 and p.get("timestamp")]
    t0 = _iso(firsts[0]["timestamp"]) if firsts else min(
        e.ts - (e.process_ms + e.commit_ms) / 1000 for e in commits if e.records)
    t1 = max(e.ts for e in commits)
    batches = sorted({e.batch for e in commits})
    out.update(seconds=t1 - t0, batches=len(batches),
               process_ms=sum(e.process_ms for e in commits),
               commit_ms=sum(e.commit_ms for e in commits))
    return n / (t1 - t0)


def count_app(name, bootstrap, work, partitions, instances, topic="accounts"):
    import statekit

    app = statekit.App(name, bootstrap=bootstrap, partitions=partitions, instances=instances,
                       state_dir=os.path.join(work, name))
    app.stream(topic, value_serde="json").group_by_key().count(store="counts") \
        .to_stream().to(f"{name}-out")
    return app


def warm_up(bootstrap, work, partitions, instances, n: int = 100_000) -> float:
    """A small count first, as a notebook has run a cell or two before the one that matters: the
    JVM compiles its hot paths and Spark starts its Python workers outside the measured run."""
    from statekit.datagen import produce_fast

    produce_fast("warm-up", "accounts", seed=9, limit=n, keys=n, bootstrap=bootstrap,
                 partitions=partitions)
    app = count_app("warm-up", bootstrap, work, partitions, instances, topic="warm-up")
    try:
        return build_rate(app, n, {})
    finally:
        app.stop()


def restore_rate(app) -> tuple:
    """Every disk lost, restart: (records restored, seconds from the first restore start to the
    last restore end)."""
    app.stop()
    shutil.rmtree(app.state_dir)
    since = time.time()
    app.start(sink="kafka")
    deadline = time.time() + 900
    while time.time() < deadline:
        ends = [e for e in app.events(since=since, types="restore_end") if e.store == "counts"]
        if len(ends) == app.partitions:
            break
        time.sleep(0.1)
    else:
        raise RuntimeError("the restore did not end")
    starts = [e for e in app.events(since=since, types="restore_start") if e.store == "counts"]
    restored = sum(e.restored for e in ends)
    return restored, max(e.ts for e in ends) - min(e.ts for e in starts)


def sample_check(app, n: int, keys: int, want) -> None:
    from statekit.datagen import account_key

    rnd = random.Random(7)
    for i in rnd.sample(range(keys), 20):
        got = app.query(app.plan.stores[0].name, account_key(i, keys))
        if not want(got):
            raise RuntimeError(f"{app.name}: account {i} holds {got!r}")


# -- 5. Spark's own aggregation -----------------------------------------------------------------------

def spark_groupby(spark, bootstrap, topic, out_topic, work, partitions, batch) -> float:
    from pyspark.sql import functions as F

    from statekit.kafka import Kafka

    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    with Kafka(bootstrap) as k:
        k.ensure_topic(out_topic, partitions)
        n = sum(k.end_offsets(topic).values())
    src = (spark.readStream.format("statekit-kafka").option("bootstrap", bootstrap)
           .option("topic", topic).option("maxRecordsPerTrigger", batch)
           .option("startingOffsets", "earliest").load())
    counts = src.groupBy("key").count()
    out = counts.select("key", F.col("count").cast("string").cast("binary").alias("value"),
                        F.lit(out_topic).alias("topic"))

    def write_batch(df, batch_id):
        df.write.format("statekit-kafka").option("bootstrap", bootstrap).mode("append").save()

    q = (out.writeStream.queryName("groupby").option("checkpointLocation", os.path.join(work, "gb"))
         .outputMode("update").trigger(availableNow=True).foreachBatch(write_batch).start())
    q.awaitTermination()
    if q.exception():
        raise RuntimeError(str(q.exception()).splitlines()[0])
    prog = [json.loads(p.json) for p in q.recentProgress if p.numInputRows]
    t0 = _iso(prog[0]["timestamp"])
    last = prog[-1]
    t1 = _iso(last["timestamp"]) + last["durationMs"]["triggerExecution"] / 1000
    rows = sum(p["numInputRows"] for p in prog)
    if rows != n:
        raise RuntimeError(f"Spark's groupBy read {rows} records, not {n}")
    return n / (t1 - t0)


# -- 6. start -------------------------------------------------------------------------------------------

def first_commit_after_start(app) -> float:
    t0 = time.time()
    app.start(sink="kafka")
    e = app.wait_for_event(lambda e: e.type == "commit" and e.records > 0, 300)
    if e is None:
        raise RuntimeError("no commit")
    return e.ts - t0


COLD = r"""
import os, sys, time, json
sys.path.insert(0, {root!r})
import statekit
app = statekit.App("cold", bootstrap={bootstrap!r}, state_dir={state!r}, instances={instances})
app.stream("start", value_serde="json").group_by_key().count(store="counts")
t0 = time.time()
app.start()
e = app.wait_for_event(lambda e: e.type == "commit" and e.records > 0, 300)
print(json.dumps({{"first_commit": e.ts - t0}}))
app.stop()
from statekit.engine.spark.session import stop_session
stop_session()
"""


def cold_start(bootstrap, work, instances) -> float:
    code = COLD.format(root=ROOT, bootstrap=bootstrap, state=os.path.join(work, "cold"),
                       instances=instances)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)["first_commit"]
    raise RuntimeError(f"cold start failed: {r.stderr.strip().splitlines()[-1:]}")


# -- 7. latency -----------------------------------------------------------------------------------------

PRODUCER = r"""
import sys, time, json
from confluent_kafka import Producer
bootstrap, topic, rate, seconds, keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
p = Producer({{"bootstrap.servers": bootstrap, "linger.ms": 2, "enable.idempotence": False}})
sent, t0, i = [], time.time(), 0
while time.time() - t0 < seconds:
    due = t0 + i / rate
    now = time.time()
    if due > now:
        time.sleep(due - now)
    k = "k%05d" % (i * 7919 % keys)
    p.produce(topic, key=k.encode(), value=b'{{"amount": 1}}')
    sent.append((k, time.time()))
    i += 1
    p.poll(0)
p.flush(30)
print(json.dumps(sent))
"""

CONSUMER = r"""
import sys, time, json, struct
from confluent_kafka import Consumer
bootstrap, topic, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
c = Consumer({{"bootstrap.servers": bootstrap, "group.id": "latency", "isolation.level": "read_committed",
              "auto.offset.reset": "earliest", "enable.auto.commit": False}})
c.subscribe([topic])
got, t0 = [], time.time()
while time.time() - t0 < seconds:
    m = c.poll(0.05)
    if m is None or m.error():
        continue
    got.append((m.key().decode(), struct.unpack(">q", m.value())[0], time.time()))
c.close()
print(json.dumps(got))
"""


def latency(bootstrap, work, partitions, seconds, rate=2000, keys=10_000) -> tuple:
    """p50, p95 (ms) of the App's defaults, producer and consumer in their own processes."""
    import statekit
    from statekit.kafka import Kafka

    topic, out = "latency-in", "latency-out"
    with Kafka(bootstrap) as k:
        k.ensure_topic(topic, partitions)
        k.ensure_topic(out, partitions)
    app = statekit.App("latency", bootstrap=bootstrap, state_dir=os.path.join(work, "latency"))
    app.stream(topic, value_serde="json").group_by_key().count(store="counts").to_stream().to(out)
    app.start(sink="kafka")
    try:
        cons = subprocess.Popen([sys.executable, "-c", CONSUMER.format(), bootstrap, out,
                                 str(seconds + 8)], stdout=subprocess.PIPE, text=True)
        time.sleep(3)                # the consumer joined its group
        prod = subprocess.Popen([sys.executable, "-c", PRODUCER.format(), bootstrap, topic,
                                 str(rate), str(seconds), str(keys)], stdout=subprocess.PIPE,
                                text=True)
        sent = json.loads(prod.communicate(timeout=seconds + 60)[0])
        got = json.loads(cons.communicate(timeout=seconds + 60)[0])
    finally:
        app.stop()
    nth: dict = {}
    need = []
    for k, ts in sent:
        nth[k] = nth.get(k, 0) + 1
        need.append((k, nth[k], ts))
    arrivals: dict = {}
    for k, count, ts in got:
        arrivals.setdefault(k, []).append((count, ts))
    lat = []
    for k, n, ts in need:
        hit = next((t for c, t in arrivals.get(k, ()) if c >= n), None)
        if hit is not None:
            lat.append((hit - ts) * 1000)
    seen = len(lat) / max(1, len(need))
    return pct(lat, 0.5), pct(lat, 0.95), seen


# -- main ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--latency-seconds", type=float, default=20.0)
    ap.add_argument("--skip", default="", help="comma-separated: latency, cold, spark")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    n, parts = args.records, args.partitions

    from statekit import broker as broker_mod
    from statekit.datagen import account_key, produce_fast
    from statekit.engine.spark.session import get_session, stop_session

    work = tempfile.mkdtemp(prefix="statekit-bench-ingest-")
    handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
    try:
        boot = handle.bootstrap
        t = time.perf_counter()
        produce_fast("accounts", "accounts", seed=1, limit=n, keys=n, bootstrap=boot,
                     partitions=parts)
        say(f"input: {n} records over {n} keys, {parts} partitions, in {time.perf_counter() - t:.1f} s")
        keys = [account_key(i, n).encode() for i in range(n)]
        random.Random(3).shuffle(keys)
        rocks = rocksdict_alone(work, keys)
        say(f"rocksdict alone: {rocks:,.0f} puts/s (WriteBatches of 50,000, fsync'd)")
        spark = get_session()
        say(f"warm-up (100,000 records, not counted): {warm_up(boot, work, parts, args.instances):,.0f} "
            f"records/s")

        info: dict = {}
        app = count_app("count", boot, work, parts, args.instances)
        build = build_rate(app, n, info)
        sample_check(app, n, n, lambda v: v == 1)
        say(f"build: {build:,.0f} records/s ({n} records in {info['seconds']:.2f} s, "
            f"{info['batches']} micro-batches; tasks' processing {info['process_ms'] / 1000:.1f} s, "
            f"commits {info['commit_ms'] / 1000:.1f} s, summed over tasks)")
        restored, rs = restore_rate(app)
        sample_check(app, n, n, lambda v: v == 1)
        app.stop()
        restore = restored / rs
        say(f"restore from scratch: {restore:,.0f} records/s ({restored} records in {rs:.2f} s)")

        import statekit

        agg = statekit.App("agg", bootstrap=boot, partitions=parts, instances=args.instances,
                           state_dir=os.path.join(work, "agg"))
        (agg.stream("accounts", value_serde="json").group_by_key()
         .aggregate(lambda: {"n": 0, "sum": 0},
                    lambda k, v, a: {"n": a["n"] + 1, "sum": a["sum"] + v["amount"]},
                    store="totals").to_stream().to("agg-out", value_serde="json"))
        ainfo: dict = {}
        arate = build_rate(agg, n, ainfo)
        sample_check(agg, n, n, lambda v: v["n"] == 1)
        agg.stop()
        say(f"aggregate (Python function): {arate:,.0f} records/s ({ainfo['seconds']:.2f} s)")

        produce_fast("keyed", "accounts", seed=2, limit=n, keys=10_000, bootstrap=boot,
                     partitions=parts)
        kc = statekit.App("keyed", bootstrap=boot, partitions=parts, instances=args.instances,
                          state_dir=os.path.join(work, "keyed"))
        kc.stream("keyed", value_serde="json").group_by_key().count(store="kcounts") \
            .to_stream().to("keyed-out")
        kinfo: dict = {}
        krate = build_rate(kc, n, kinfo)
        kc.stop()
        say(f"keyed count over 10,000 keys: {krate:,.0f} records/s ({kinfo['seconds']:.2f} s, "
            f"{kinfo['batches']} micro-batches)")
        from statekit.app import DEFAULT_MAX_RECORDS_PER_TRIGGER

        gb = float("nan")
        if "spark" not in skip:
            gb = spark_groupby(spark, boot, "keyed", "groupby-out", work, parts,
                               DEFAULT_MAX_RECORDS_PER_TRIGGER)
            say(f"Spark groupBy(key).count(), RocksDB provider: {gb:,.0f} records/s")

        # the start's own cost: a topic of 10,000 records, so the first batch is not a quarter of a
        # million records' work (that is the build's figure above)
        produce_fast("start", "accounts", seed=4, limit=10_000, keys=10_000, bootstrap=boot,
                     partitions=parts)
        warm = count_app("warm", boot, work, parts, args.instances, topic="start")
        start_s = first_commit_after_start(warm)
        warm.stop()
        say(f"start() -> first committed micro-batch, Spark session up: {start_s:.2f} s")
        cold = float("nan")
        if "cold" not in skip:
            stop_session()
            cold = cold_start(boot, work, args.instances)
            say(f"start() -> first committed micro-batch, cold (no session): {cold:.2f} s")
            get_session()
        p50 = p95 = float("nan")
        if "latency" not in skip:
            p50, p95, seen = latency(boot, work, parts, args.latency_seconds)
            say(f"latency at 2,000 records/s over 10,000 keys (App defaults, read_committed): "
                f"p50 {p50:.0f} ms, p95 {p95:.0f} ms ({seen:.1%} of the records seen)")
        stop_session()

        say(f"FIGURE name=ingest_count_vs_rocksdb value={build:.0f} unit=records/s "
            f"baseline={rocks:.0f} ratio={build / rocks:.3f}")
        say(f"FIGURE name=ingest_aggregate value={arate:.0f} unit=records/s baseline={build:.0f} "
            f"ratio={arate / build:.3f}")
        say(f"FIGURE name=ingest_keyed_count value={krate:.0f} unit=records/s baseline={gb:.0f} "
            f"ratio={krate / gb:.3f}")
        say(f"FIGURE name=ingest_start value={start_s:.2f} unit=s baseline={cold:.2f} "
            f"ratio={start_s / cold:.3f}")
        say(f"FIGURE name=ingest_latency_p50 value={p50:.0f} unit=ms baseline={p95:.0f} "
            f"ratio={p50 / p95:.3f}")
        say(f"RESULT name=ingest_count value={build:.0f} unit=records/s baseline={restore:.0f} "
            f"ratio={build / restore:.3f}")
    finally:
        try:
            stop_session()
        finally:
            handle.stop()
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
