"""Word count end to end on Spark: statekit's engine against plain Spark, in the same run.

    .venv/bin/python bench/pipeline.py [--words 1000000] [--batch-words 100000] [--partitions 2]

Starts its own embedded broker (temp dir, port 0) and one local Spark session, and stops both at the
end (also on failure). The input topic holds lines of 10 Zipf-distributed words
(`statekit.datagen.words`, 1000-word vocabulary) in `--partitions` partitions; every pipeline reads it
through the `statekit-kafka` source with `maxRecordsPerTrigger` and `Trigger.AvailableNow`, counts
words, and writes the updated counts of each micro-batch to its own Kafka topic through the
`statekit-kafka` sink. A record here is a word.

* statekit: a `statekit.App` (2 instances, engine "changelog") running the DSL topology
  `stream.flat_map_values(split).group_by(word).count().to_stream().to(...)` — the Spark query reads
  and shuffles, the instances' tasks keep RocksDB stores (rocksdict) with a record cache and a
  changelog topic in Kafka, and commit per micro-batch per task; measured from `start()` until the
  app has processed everything and stopped.
* groupBy: `explode(split(value)) .groupBy(word).count()`, update mode, Spark's RocksDB state store
  provider; written with foreachBatch (Python data source writers accept Append mode only).
* transformWithStateInPandas: the same with a `StatefulProcessor` holding a ValueState count per word
  (RocksDB state store provider), emitting each batch's updated counts in Append mode.

Each pipeline runs once on a small warm-up topic first (JIT, Python workers), then `--rounds` timed
runs (interleaved, fresh checkpoint and state each) are measured from `start()` to termination; the
best run of each pipeline counts (the machine is shared). statekit runs exactly-once (the default:
one Kafka transaction per task and micro-batch) and, for the ratio, at-least-once.

Latency: a producer writes `--latency-rate` records/s of unique keys (`--latency-seconds` long) to
a topic that a keyed count reads (statekit, and Spark's groupBy in the same run), both as fast as
they can (no trigger interval: `commit_interval` is the knob that trades latency for throughput);
a consumer reads each pipeline's output topic read_committed; a record's latency is the time from
its send to the arrival of its key's count. First batch: from `App.start()` on the warm session to
the first committed micro-batch (Spark: from `start()` to its first micro-batch with rows).

Prints rates, micro-batch durations p50/p95 (triggerExecution) and:

    FIGURE name=pipeline_exactly_once value=<EOS words/s> unit=records/s baseline=<at-least-once words/s> ratio=<EOS/ALOS>
    FIGURE name=pipeline_latency_p50 value=<ms> unit=ms baseline=<groupBy ms> ratio=<statekit/groupBy>
    FIGURE name=pipeline_latency_p95 value=<ms> unit=ms baseline=<groupBy ms> ratio=<statekit/groupBy>
    FIGURE name=pipeline_first_batch value=<s> unit=s baseline=<groupBy s> ratio=<statekit/groupBy>

Then two event-time pipelines (`--events` input records each, `--event-batch` per micro-batch; the
record timestamps are event times, `statekit.datagen.produce_timed`, at one-second resolution), each
against Spark's own operator in the same session, best of `--rounds`:

* a windowed stream-stream join: orders joined with their payments (`statekit.datagen.shop_events`,
  two topics) — statekit's `join(..., JoinWindows(10 s before, 60 s after, 10 s grace))` (each
  side buffered in a RocksDB window store with a changelog) against Spark's inner stream-stream
  `join` of the two sources with 10 s watermarks and the same time-range condition (state in
  the RocksDB state store provider), both written to Kafka in append mode;
* a session-window count: clicks in visits (`statekit.datagen.session_clicks`, 30 s gap) —
  statekit's `windowed_by(SessionWindows(30 s, 10 s grace)).count().suppress(until_window_closes())`
  (one final count per session, as Spark emits them) against Spark's
  `groupBy(session_window(ts, "30 seconds"), key).count()` with a 10 s watermark in append mode
  (Spark refuses update mode for session windows).

A record here is an input event (an order, a payment, a click); each ends with its line:

    FIGURE name=pipeline_join value=<statekit events/s> unit=records/s baseline=<Spark join events/s> ratio=<statekit/Spark>
    FIGURE name=pipeline_session value=<statekit events/s> unit=records/s baseline=<Spark session_window events/s> ratio=<statekit/Spark>

and last the summary line:

    RESULT name=pipeline_wordcount value=<statekit words/s> unit=records/s baseline=<groupBy words/s> ratio=<statekit/groupBy>
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

WORDS_PER_LINE = 10


def produce_lines(client, topic: str, words: int, partitions: int, seed: int) -> int:
    from statekit.datagen import words as word_gen

    client.ensure_topic(topic, partitions)
    gen = word_gen(seed=seed, vocabulary=1000)
    lines = words // WORDS_PER_LINE
    per_part: list = [[] for _ in range(partitions)]
    for i in range(lines):
        text = " ".join(next(gen).key for _ in range(WORDS_PER_LINE))
        per_part[i % partitions].append((None, text.encode()))
    for p, recs in enumerate(per_part):
        for j in range(0, len(recs), 20000):
            client.send(topic, p, recs[j:j + 20000])
    return lines * WORDS_PER_LINE


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(name, words, seconds, progress):
    durations = [p["batch_duration_ms"] for p in progress if p.get("num_input_rows")]
    rate = words / seconds
    print(f"{name:>28}: {words} words in {seconds:6.2f} s = {rate:10.0f} words/s; "
          f"{len(durations)} micro-batches, latency p50 {pct(durations, .5):6.0f} ms "
          f"p95 {pct(durations, .95):6.0f} ms", flush=True)
    return rate


# --- the three pipelines -------------------------------------------------------------------------


def run_to_end(a, app: str, batch: int):
    """Run an app over its whole input (availableNow, ``batch`` records per micro-batch, Kafka
    sink): (seconds from start() to its end, its progress)."""
    t0 = time.perf_counter()
    a.start(trigger="availableNow", max_records_per_trigger=batch, sink="kafka")
    state = a.wait_for_state("NOT_RUNNING", None)
    elapsed = time.perf_counter() - t0
    try:
        if str(state) != "NOT_RUNNING":
            raise RuntimeError(f"{app} ended {state}: {a.error}")
        return elapsed, a.progress()
    finally:
        a.stop()


def run_statekit(spark, bootstrap, topic, out_topic, work, partitions, batch_lines, app,
                 guarantee="exactly_once"):
    import statekit

    a = statekit.App(app, bootstrap=bootstrap, partitions=partitions, instances=2,
                     state_dir=os.path.join(work, app), engine="changelog",
                     processing_guarantee=guarantee)
    (a.stream(topic).flat_map_values(str.split).group_by(lambda k, w: w)
     .count(store="counts").to_stream().to(out_topic, value_serde="int64"))
    return run_to_end(a, app, batch_lines)


def run_statekit_alos(spark, bootstrap, topic, out_topic, work, partitions, batch_lines, app):
    return run_statekit(spark, bootstrap, topic, out_topic, work, partitions, batch_lines, app,
                        guarantee="at_least_once")


# --- latency and the first batch -------------------------------------------------------------


class _Flow:
    """A producer of unique keys at a steady rate and a consumer of the output topic."""

    def __init__(self, bootstrap, in_topic, out_topic, rate, partitions):
        import threading

        from statekit.kafka import Kafka

        self.bootstrap, self.in_topic, self.out_topic = bootstrap, in_topic, out_topic
        self.rate, self.partitions = rate, partitions
        self.sent: dict = {}
        self.got: dict = {}
        self.stop = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]
        self._kafka = Kafka

    def _produce(self):
        k = self._kafka(self.bootstrap)
        tick = 0.01
        per = max(1, int(self.rate * tick))
        i = 0
        nxt = time.monotonic()
        while not self.stop.is_set():
            now = time.time()
            recs = []
            for _ in range(per):
                key = b"k%d" % i
                self.sent[key] = now
                recs.append((key, b"x"))
                i += 1
            k.send(self.in_topic, i % self.partitions, recs)
            nxt += tick
            self.stop.wait(max(0.0, nxt - time.monotonic()))
        k.close()

    def _consume(self):
        k = self._kafka(self.bootstrap)
        pos = {p: 0 for p in range(self.partitions)}
        while not self.stop.is_set():
            for p in pos:
                ch = k.fetch(self.out_topic, p, pos[p], max_wait_ms=20, isolation="read_committed")
                now = time.time()
                for _off, _ts, key, _v, _h in ch.records:
                    self.got.setdefault(key, now)
                pos[p] = ch.next_offset
        k.close()

    def run(self, seconds):
        for t in self._threads:
            t.start()
        time.sleep(seconds)
        time.sleep(2.0)            # the last records' way out
        self.stop.set()
        for t in self._threads:
            t.join()
        cut = time.time() - 2.0 - seconds * 0.8   # the first fifth warms up
        lats = sorted((self.got[k] - t) * 1000 for k, t in self.sent.items()
                      if k in self.got and t >= cut)
        return lats


def latency_statekit(spark, bootstrap, work, partitions, rate, seconds):
    import statekit
    from statekit.kafka import Kafka

    with Kafka(bootstrap) as k:
        k.ensure_topic("lat-in-sk", partitions)
        k.ensure_topic("lat-out-sk", partitions)
    a = statekit.App("lat_sk", bootstrap=bootstrap, partitions=partitions, instances=2,
                     state_dir=os.path.join(work, "lat_sk"), engine="changelog")
    a.stream("lat-in-sk").group_by_key().count(store="c").to_stream().to("lat-out-sk",
                                                                          value_serde="int64")
    try:
        a.start(sink="kafka")
        return _Flow(bootstrap, "lat-in-sk", "lat-out-sk", rate, partitions).run(seconds)
    finally:
        a.stop()


def latency_groupby(spark, bootstrap, work, partitions, rate, seconds):
    from pyspark.sql import functions as F

    from statekit.kafka import Kafka

    with Kafka(bootstrap) as k:
        k.ensure_topic("lat-in-gb", partitions)
        k.ensure_topic("lat-out-gb", partitions)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    src = (spark.readStream.format("statekit-kafka").option("bootstrap", bootstrap)
           .option("topic", "lat-in-gb").option("startingOffsets", "earliest").load())
    counts = src.groupBy(F.col("key")).count()
    out = counts.select(F.col("key"), F.col("count").cast("string").cast("binary").alias("value"),
                        F.lit("lat-out-gb").alias("topic"))

    def write_batch(batch_df, batch_id):
        batch_df.write.format("statekit-kafka").option("bootstrap", bootstrap).mode("append").save()

    q = (out.writeStream.queryName("lat_gb").option("checkpointLocation", os.path.join(work, "lat_gb"))
         .outputMode("update").foreachBatch(write_batch).start())
    try:
        return _Flow(bootstrap, "lat-in-gb", "lat-out-gb", rate, partitions).run(seconds)
    finally:
        q.stop()


def first_batch_statekit(spark, bootstrap, work, partitions):
    import statekit

    a = statekit.App("first_sk", bootstrap=bootstrap, partitions=partitions, instances=2,
                     state_dir=os.path.join(work, "first_sk"), engine="changelog")
    a.stream("first-lines").flat_map_values(str.split).group_by(lambda k, w: w).count(store="c")
    try:
        t0 = time.time()
        a.start(sink="none")
        e = a.wait_for_event(lambda e: e.type == "commit" and e.records > 0, 120)
        return e.ts - t0
    finally:
        a.stop()


def first_batch_groupby(spark, bootstrap, work, partitions):
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    src = (spark.readStream.format("statekit-kafka").option("bootstrap", bootstrap)
           .option("topic", "first-lines").option("startingOffsets", "earliest").load())
    counts = src.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("w")) \
        .groupBy("w").count()
    t0 = time.time()
    q = (counts.writeStream.queryName("first_gb").option("checkpointLocation",
                                                          os.path.join(work, "first_gb"))
         .outputMode("update").format("noop").start())
    try:
        while not any((p.numInputRows or 0) > 0 for p in q.recentProgress):
            time.sleep(0.01)
        return time.time() - t0
    finally:
        q.stop()


def _words_frame(spark, bootstrap, topic, batch_lines):
    from pyspark.sql import functions as F

    src = (spark.readStream.format("statekit-kafka").option("bootstrap", bootstrap)
           .option("topic", topic).option("maxRecordsPerTrigger", batch_lines)
           .option("startingOffsets", "earliest").load())
    return src.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))


def _to_kafka(df, bootstrap, out_topic, checkpoint, name, mode):
    """Write (word, count) rows to out_topic. Python data source writers take Append only, so an
    Update-mode aggregation goes through foreachBatch (the batch writer of statekit-kafka)."""
    from pyspark.sql import functions as F

    from statekit.kafka import Kafka

    with Kafka(bootstrap) as k:
        k.ensure_topic(out_topic, int(df.sparkSession.conf.get("spark.sql.shuffle.partitions")))
    out = df.select(F.col("word").cast("binary").alias("key"),
                    F.col("count").cast("string").cast("binary").alias("value"),
                    F.lit(out_topic).alias("topic"))
    w = (out.writeStream.queryName(name).option("checkpointLocation", checkpoint)
         .outputMode(mode).trigger(availableNow=True))
    if mode == "append":
        return w.format("statekit-kafka").option("bootstrap", bootstrap)

    def write_batch(batch_df, batch_id):
        batch_df.write.format("statekit-kafka").option("bootstrap", bootstrap).mode("append").save()

    return w.foreachBatch(write_batch)


def _timed(spark, writer):
    from statekit.engine.spark.engine import progress_dict

    t0 = time.perf_counter()
    q = writer.start()
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    if q.exception():
        raise RuntimeError(str(q.exception()).splitlines()[0])
    return elapsed, [progress_dict(p) for p in q.recentProgress]


def run_groupby(spark, bootstrap, topic, out_topic, work, partitions, batch_lines, name):
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    counts = _words_frame(spark, bootstrap, topic, batch_lines).groupBy("word").count()
    return _timed(spark, _to_kafka(counts, bootstrap, out_topic, os.path.join(work, name), name,
                                   "update"))


def run_tws(spark, bootstrap, topic, out_topic, work, partitions, batch_lines, name):
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class WordCounter(StatefulProcessor):
        def init(self, handle):
            self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))

        def handleInputRows(self, key, rows, timerValues):
            import pandas as pd

            n = sum(len(pdf) for pdf in rows)
            old = self.count.get() if self.count.exists() else None
            total = (old[0] if old else 0) + n
            self.count.update((total,))
            yield pd.DataFrame({"word": [key[0]], "count": [total]})

        def close(self):
            pass

    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    schema = StructType([StructField("word", StringType()), StructField("count", LongType())])
    counts = (_words_frame(spark, bootstrap, topic, batch_lines).groupBy("word")
              .transformWithStateInPandas(statefulProcessor=WordCounter(), outputStructType=schema,
                                          outputMode="Append", timeMode="None"))
    return _timed(spark, _to_kafka(counts, bootstrap, out_topic, os.path.join(work, name), name,
                                   "append"))



# --- event-time pipelines: a windowed stream-stream join and a session-window count -----------------

JOIN_BEFORE_MS, JOIN_AFTER_MS, JOIN_GRACE_MS = 10_000, 60_000, 10_000
SESSION_GAP_MS, SESSION_GRACE_MS = 30_000, 10_000


def _to_second(records):
    """Event times at one-second resolution: records of equal time share a record batch, so a few
    hundred thousand of them go out in a few thousand produce requests."""
    from statekit.datagen import Record

    return [Record(r.key, r.value, r.timestamp - r.timestamp % 1000) for r in records]


def produce_events(client, prefix: str, events: int, partitions: int, seed: int) -> dict:
    """`<prefix>-orders`, `<prefix>-payments` and `<prefix>-clicks`, about `events` records for
    the join (orders + payments) and as many clicks. Returns {"join": n, "session": n}."""
    from statekit.datagen import produce_timed, session_clicks, shop_events

    shop = _to_second(shop_events(seed, orders=max(1, events // 2), spacing_ms=20,
                                  pay_after_ms=JOIN_AFTER_MS, pay_before_ms=JOIN_BEFORE_MS))
    orders = [r for r in shop if r.value["type"] == "order"]
    payments = [r for r in shop if r.value["type"] == "payment"]
    clicks = _to_second(session_clicks(seed, users=max(1, events // 20), sessions=(1, 5),
                                       clicks=(1, 12), gap_ms=SESSION_GAP_MS))
    for topic, recs in ((f"{prefix}-orders", orders), (f"{prefix}-payments", payments),
                        (f"{prefix}-clicks", clicks)):
        client.ensure_topic(topic, partitions)
        produce_timed(topic, recs, kafka=client)
    return {"join": len(shop), "session": len(clicks)}


def run_statekit_events(kind, bootstrap, prefix, out_topic, work, partitions, batch, app):
    """statekit's join or session count (`kind`), as run_statekit runs the word count."""
    import statekit
    from statekit.topology import (JoinWindows, SessionWindowedSerde, SessionWindows,
                                   until_window_closes)

    a = statekit.App(app, bootstrap=bootstrap, partitions=partitions, instances=2,
                     state_dir=os.path.join(work, app), engine="changelog")
    if kind == "join":
        (a.stream(f"{prefix}-orders").join(
            a.stream(f"{prefix}-payments"), lambda o, p: p,
            JoinWindows(JOIN_BEFORE_MS, JOIN_AFTER_MS, JOIN_GRACE_MS), store="paid")
         .to(out_topic))
    else:
        (a.stream(f"{prefix}-clicks").group_by_key()
         .windowed_by(SessionWindows(SESSION_GAP_MS, SESSION_GRACE_MS)).count(store="visits")
         .suppress(until_window_closes(), store="visits-final").to_stream()
         .to(out_topic, key_serde=SessionWindowedSerde("str"), value_serde="int64"))
    return run_to_end(a, app, batch)


def _event_frame(spark, bootstrap, topic, batch):
    from pyspark.sql import functions as F

    src = (spark.readStream.format("statekit-kafka").option("bootstrap", bootstrap)
           .option("topic", topic).option("maxRecordsPerTrigger", batch)
           .option("startingOffsets", "earliest").load())
    return src.select(F.col("key").cast("string").alias("k"), F.col("value").alias("v"),
                      F.col("timestamp").alias("ts"))


def run_spark_events(kind, spark, bootstrap, prefix, out_topic, work, partitions, batch, name):
    """Spark's own stream-stream join with watermarks, or session_window count, append mode."""
    from pyspark.sql import functions as F

    from statekit.kafka import Kafka

    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    if kind == "join":
        # two sources, each limited to half a micro-batch: the same records per batch as statekit
        o = _event_frame(spark, bootstrap, f"{prefix}-orders", max(1, batch // 2)).select(
            F.col("k").alias("ok"), F.col("ts").alias("ots")).withWatermark(
            "ots", f"{JOIN_GRACE_MS} milliseconds")
        p = _event_frame(spark, bootstrap, f"{prefix}-payments", max(1, batch // 2)).select(
            F.col("k").alias("pk"), F.col("v").alias("pv"), F.col("ts").alias("pts")).withWatermark(
            "pts", f"{JOIN_GRACE_MS} milliseconds")
        joined = o.join(p, F.expr(
            f"ok = pk AND pts >= ots - INTERVAL {JOIN_BEFORE_MS} MILLISECONDS "
            f"AND pts <= ots + INTERVAL {JOIN_AFTER_MS} MILLISECONDS"))
        out = joined.select(F.col("ok").cast("binary").alias("key"), F.col("pv").alias("value"))
    else:
        c = _event_frame(spark, bootstrap, f"{prefix}-clicks", batch).withWatermark(
            "ts", f"{SESSION_GRACE_MS} milliseconds")
        counts = c.groupBy(F.session_window("ts", f"{SESSION_GAP_MS} milliseconds"), "k").count()
        out = counts.select(F.col("k").cast("binary").alias("key"),
                            F.col("count").cast("string").cast("binary").alias("value"))
    with Kafka(bootstrap) as k:
        k.ensure_topic(out_topic, partitions)
    writer = (out.withColumn("topic", F.lit(out_topic)).writeStream.queryName(name)
              .option("checkpointLocation", os.path.join(work, name)).outputMode("append")
              .trigger(availableNow=True).format("statekit-kafka").option("bootstrap", bootstrap))
    return _timed(spark, writer)


def event_benches(spark, bootstrap, client, work, n, args) -> None:
    """The join and session pipelines, each against Spark's own; prints their FIGURE lines."""
    counts = produce_events(client, "bench", args.events, n, seed=11)
    produce_events(client, "warm", args.warmup_events, n, seed=12)
    batch = max(1, args.event_batch)
    print(f"events: {counts['join']} orders and payments, {counts['session']} clicks, {n} "
          f"partitions; {batch} records per micro-batch", flush=True)
    for kind, label in (("join", "windowed join"), ("session", "session-window count")):
        pipelines = [("statekit", lambda *a, _k=kind: run_statekit_events(_k, *a[1:])),
                     ("Spark", lambda *a, _k=kind: run_spark_events(_k, *a))]
        for who, fn in pipelines:
            t0 = time.perf_counter()
            fn(spark, bootstrap, "warm", f"warm-{kind}-{who}-out", work, n, batch,
               f"warm_{kind}_{who.lower()}")
            print(f"{who + ' ' + label:>28}: warm-up {time.perf_counter() - t0:.1f} s", flush=True)
        rates: dict = {}
        for r in range(args.rounds):
            for who, fn in pipelines:
                secs, progress = fn(spark, bootstrap, "bench", f"{kind}-{who}-out-{r}", work, n,
                                    batch, f"bench_{kind}_{who.lower()}_{r}")
                rate = counts[kind] / secs
                batches = sum(1 for p in progress if p.get("num_input_rows"))
                print(f"{who + ' ' + label + ' #' + str(r + 1):>28}: {counts[kind]} records in "
                      f"{secs:6.2f} s = {rate:10.0f} records/s; {batches} micro-batches", flush=True)
                rates[who] = max(rates.get(who, 0.0), rate)
        sk, sp = rates["statekit"], rates["Spark"]
        print(f"{label}: statekit / Spark = {sk / sp:.2f}", flush=True)
        print(f"FIGURE name=pipeline_{kind} value={sk:.0f} unit=records/s baseline={sp:.0f} "
              f"ratio={sk / sp:.3f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--words", type=int, default=1_000_000)
    ap.add_argument("--batch-words", type=int, default=100_000,
                    help="words per micro-batch (maxRecordsPerTrigger = this / 10 lines)")
    ap.add_argument("--partitions", type=int, default=2, help="input partitions = tasks")
    ap.add_argument("--warmup-words", type=int, default=100_000)
    ap.add_argument("--skip-tws", action="store_true")
    ap.add_argument("--latency-rate", type=int, default=2000, help="records/s for the latency runs")
    ap.add_argument("--latency-seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2,
                    help="timed runs per pipeline, interleaved; the best of each is reported "
                         "(the machine is shared: the best run is the least disturbed one)")
    ap.add_argument("--events", type=int, default=200_000,
                    help="input records of the join and of the session pipeline")
    ap.add_argument("--event-batch", type=int, default=20_000, help="records per micro-batch")
    ap.add_argument("--warmup-events", type=int, default=20_000)
    args = ap.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from statekit import broker as broker_mod
    from statekit.engine.spark.session import get_session, stop_session
    from statekit.kafka import Kafka

    work = tempfile.mkdtemp(prefix="statekit-bench-pipeline-")
    handle = client = None
    try:
        handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
        client = Kafka(handle.bootstrap)
        n = args.partitions
        batch_lines = max(1, args.batch_words // WORDS_PER_LINE)
        words = produce_lines(client, "bench-lines", args.words, n, seed=7)
        warm = produce_lines(client, "warm-lines", args.warmup_words, n, seed=8)
        print(f"input: {words} words in {words // WORDS_PER_LINE} lines, {n} partitions; "
              f"{args.batch_words} words per micro-batch; {n} tasks", flush=True)

        spark = get_session("statekit-bench", shuffle_partitions=n,
                            extra_conf={"spark.sql.streaming.stateStore.providerClass":
                                        "org.apache.spark.sql.execution.streaming.state."
                                        "RocksDBStateStoreProvider"})
        pipelines = [("statekit", run_statekit), ("statekit at-least-once", run_statekit_alos),
                     ("groupBy+RocksDB", run_groupby)]
        if not args.skip_tws:
            pipelines.append(("transformWithStateInPandas", run_tws))
        rates: dict = {}
        for label, fn in pipelines:
            tag = label.split("+")[0].lower().replace(" ", "_").replace("-", "_")
            t0 = time.perf_counter()
            fn(spark, handle.bootstrap, "warm-lines", f"warm-{tag}-out", work, n, batch_lines, f"warm_{tag}")
            print(f"{label:>28}: warm-up {time.perf_counter() - t0:.1f} s", flush=True)
        for r in range(args.rounds):
            for label, fn in pipelines:
                tag = label.split("+")[0].lower().replace(" ", "_").replace("-", "_")
                secs, progress = fn(spark, handle.bootstrap, "bench-lines", f"{tag}-out-{r}", work, n,
                                    batch_lines, f"bench_{tag}_{r}")
                rate = summarize(f"{label} #{r + 1}", words, secs, progress)
                rates[label] = max(rates.get(label, 0.0), rate)
        print("best of each: " + ", ".join(f"{k} {v:.0f} words/s" for k, v in rates.items()))
        sk, gb = rates["statekit"], rates["groupBy+RocksDB"]
        if "transformWithStateInPandas" in rates:
            tws = rates["transformWithStateInPandas"]
            print(f"statekit / transformWithStateInPandas = {sk / tws:.2f} (target >= 1.0)")
        print(f"statekit / groupBy+RocksDB = {sk / gb:.2f} (target >= 1.0)")
        eos, alos = rates["statekit"], rates["statekit at-least-once"]
        print(f"exactly-once / at-least-once = {eos / alos:.2f} (target >= 0.8)")

        lat_sk = latency_statekit(spark, handle.bootstrap, work, n, args.latency_rate,
                                  args.latency_seconds)
        lat_gb = latency_groupby(spark, handle.bootstrap, work, n, args.latency_rate,
                                 args.latency_seconds)
        sk50, sk95, gb50, gb95 = (pct(lat_sk, .5), pct(lat_sk, .95), pct(lat_gb, .5), pct(lat_gb, .95))
        print(f"latency at {args.latency_rate} records/s: statekit p50 {sk50:.0f} ms p95 {sk95:.0f} ms "
              f"({len(lat_sk)} records); groupBy p50 {gb50:.0f} ms p95 {gb95:.0f} ms ({len(lat_gb)})",
              flush=True)
        produce_lines(client, "first-lines", 20_000, n, seed=9)
        fb_sk = first_batch_statekit(spark, handle.bootstrap, work, n)
        fb_gb = first_batch_groupby(spark, handle.bootstrap, work, n)
        print(f"first committed batch after start, warm session: statekit {fb_sk:.2f} s, "
              f"groupBy {fb_gb:.2f} s", flush=True)
        print(f"FIGURE name=pipeline_exactly_once value={eos:.0f} unit=records/s baseline={alos:.0f} "
              f"ratio={eos / alos:.3f}", flush=True)
        print(f"FIGURE name=pipeline_latency_p50 value={sk50:.0f} unit=ms baseline={gb50:.0f} "
              f"ratio={sk50 / gb50:.3f}", flush=True)
        print(f"FIGURE name=pipeline_latency_p95 value={sk95:.0f} unit=ms baseline={gb95:.0f} "
              f"ratio={sk95 / gb95:.3f}", flush=True)
        print(f"FIGURE name=pipeline_first_batch value={fb_sk:.3f} unit=s baseline={fb_gb:.3f} "
              f"ratio={fb_sk / fb_gb:.3f}", flush=True)
        event_benches(spark, handle.bootstrap, client, work, n, args)
        print(f"RESULT name=pipeline_wordcount value={sk:.0f} unit=records/s baseline={gb:.0f} "
              f"ratio={sk / gb:.3f}", flush=True)
        return 0
    finally:
        try:
            stop_session()
        finally:
            if client is not None:
                client.close()
            if handle is not None:
                handle.stop()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
