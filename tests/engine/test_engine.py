"""The Spark engine end to end on the embedded broker, with real instance processes (a coordinator,
no App): the topology's tasks run in the instances, the Spark query delivers their micro-batches;
word count equal to a plain-Python reference, and an instance killed mid-batch while the query keeps
running gives exactly the reference."""
from __future__ import annotations

import collections
import os
import random
import struct

import pytest

from statekit.contracts import Layout, TaskId
from statekit.runtime.coordinator import Coordinator, Settings
from statekit.worker.task import WorkerSpec
from waiting import wait_until

pytestmark = pytest.mark.spark

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _lines(seed, n):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS[: rng.randint(3, len(WORDS))]) for _ in range(rng.randint(1, 8)))
            for _ in range(n)]


def _produce(client, topic, lines, partitions):
    """Every word of the lines as a record keyed by the word, in its key's partition (a task reads
    its own partition); returns the number of records."""
    from statekit.partition import partition_for

    by_p: dict = {}
    for ln in lines:
        for w in ln.split():
            by_p.setdefault(partition_for(w.encode(), partitions), []).append((w.encode(), w.encode()))
    for p, recs in sorted(by_p.items()):
        client.send(topic, p, recs)
    return sum(map(len, by_p.values()))


def _final_counts(client, topic):
    """The last value per key of the output topic (each key lives in one partition, in order)."""
    last = {}
    for p in client.end_offsets(topic):
        for chunk in client.read(topic, p, 0):
            for _off, _ts, key, value, _h in chunk.records:
                last[key.decode()] = struct.unpack(">q", value)[0]
    return last


def _plan(src, store, out):
    from statekit.topology import TopologyBuilder

    b = TopologyBuilder()
    b.stream(src).group_by_key().count(store=store).to_stream().to(out, value_serde="int64")
    return b.compile()


def _instances(handle, tmp_path, app, plan, partitions, instances, sink):
    layout = Layout(str(tmp_path / app), app)
    spec = WorkerSpec(application=app, bootstrap=handle.bootstrap, plans={0: plan},
                      partitions=partitions, control_dir=layout.control_dir, sink=sink, events=False)
    co = Coordinator(application=app, layout=layout, spec=spec,
                     tasks=[TaskId(0, p) for p in range(partitions)], settings=Settings(),
                     publish=lambda e: None)
    co.start(instances)
    return co, layout


def test_word_count_and_an_instance_killed_mid_batch(spark, kafka_broker, tmp_path):
    from statekit.engine.spark import SparkEngine
    from statekit.engine.spec import RunSpec
    from statekit.worker import crash

    handle, client = kafka_broker
    n = 3
    client.ensure_topic("lines", n)
    client.ensure_topic("counts", 2)
    first = _lines(1, 240)
    words = _produce(client, "lines", first, n)
    co, layout = _instances(handle, tmp_path, "wc", _plan("lines", "word-counts", "counts"), n, 2, "kafka")
    try:
        run = RunSpec(app="wc", bootstrap=handle.bootstrap, plan=co.spec.plan(0), partitions=n,
                      checkpoint_dir=layout.checkpoint_dir(0), control_dir=layout.control_dir,
                      trigger="availableNow", max_records_per_trigger=100, events=False)
        engine = SparkEngine(spark)
        progress = []
        # the JVM-wide count of classes Spark compiled (Janino)
        compiled = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics \
            .METRIC_COMPILATION_TIME().getCount
        compiled_before = compiled()
        q = engine.start(run, on_progress=progress.append)
        assert q.await_termination(180)
        assert q.exception() is None
        # its stages only hand tasks and offset ranges to Python: their few rows are projected
        # by interpreted code, nothing compiled (a cold launch's first output came ~0.2 s later)
        assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
        assert compiled() == compiled_before
        # its source's reader was planned while the query started, not at its first micro-batch
        # (engine.spark.data_source_lookup): the names called are this Spark's
        from statekit.engine.spark.data_source_lookup import EARLY_READER
        wait_until(lambda: "ok" in EARLY_READER, 60, "the early planning of the reader")
        assert EARLY_READER == {"ok": True}
        # the session was built without Spark ML's session extension (pyspark's jars declare no
        # other), which was applied once the query was past its start: its functions are in
        # Spark's registry, pyspark.ml's work on the session, and the context no longer holds the
        # setting that left it out (engine.spark.session_extensions)
        from statekit.engine.spark.session_extensions import LOAD_FROM_CLASSPATH

        jvm = spark.sparkContext._jvm
        registry = getattr(getattr(jvm, "org.apache.spark.sql.catalyst.analysis.FunctionRegistry$"),
                           "MODULE$").internal()
        name = getattr(getattr(jvm, "org.apache.spark.sql.catalyst.FunctionIdentifier$"), "MODULE$")
        assert spark._statekit_ml_extension_later is True
        wait_until(lambda: registry.functionExists(name.apply("vector_to_array")), 60,
                   "Spark ML's functions registered")
        assert not spark.sparkContext._jsc.sc().conf().contains(LOAD_FROM_CLASSPATH)
        from pyspark.ml.functions import array_to_vector, vector_to_array

        arrays = spark.range(2).selectExpr("array(double(id), 0.5D) AS a")
        assert [r.a for r in arrays.select(vector_to_array(array_to_vector("a")).alias("a"))
                .collect()] == [[0.0, 0.5], [1.0, 0.5]]
        # a backlog of R records takes ceil(R / 100) micro-batches of 100, the last one the rest
        full, rest = divmod(words, 100)
        assert [p["num_input_rows"] for p in q.recent_progress] == [100] * full + ([rest] if rest else [])
        assert co.tasks_ready(fresh=True)
        ref = collections.Counter(w for ln in first for w in ln.split())
        assert _final_counts(client, "counts") == dict(ref)
        assert q.last_batch_id == len(q.recent_progress) - 1
        # its checkpoint, on this machine's disk, written by the FileSystem checkpoint manager
        # (the FileContext one runs a `readlink` process per file): every batch's offsets and
        # commit, and no temporary file left
        assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass").endswith(
            ".FileSystemBasedCheckpointFileManager")
        ckpt = layout.checkpoint_dir(0)
        for log in ("offsets", "commits"):
            assert sorted(int(f) for f in os.listdir(os.path.join(ckpt, log)) if f.isdigit()) == \
                list(range(q.last_batch_id + 1)), log
        assert not [f for _d, _s, fs in os.walk(ckpt) for f in fs if ".tmp" in f]

        # an instance dies mid-batch: the query is not affected, the task moves and the batch is
        # completed by its new owner
        second = _lines(2, 150)
        _produce(client, "lines", second, n)
        d = crash.write_directive(layout.control_dir, instance=0, point="records", after_records=20)
        q = engine.start(run)
        assert q.await_termination(180)
        assert q.exception() is None, q.exception()
        assert crash.claimed(layout.control_dir, d["id"]) is not None
        wait_until(lambda: co.tasks_ready(fresh=True), 60, "the moved tasks ready on instance 1")
        assert co.live() == [1] and co.tasks_ready()
        ref.update(w for ln in second for w in ln.split())
        assert _final_counts(client, "counts") == dict(ref)
        assert progress and progress[0]["num_input_rows"] == 100
    finally:
        co.stop()


def test_continuous_trigger_process_all_available_and_stop(spark, kafka_broker, tmp_path):
    """A processing-time query: process_all_available() catches up, progress reaches the callback
    live, stop() ends it cleanly, and abort() of a second run stops it at once."""
    from statekit.engine.spark import SparkEngine
    from statekit.engine.spec import RunSpec
    from statekit.worker.output import read_outputs

    handle, client = kafka_broker
    client.ensure_topic("lines2", 2)
    lines = _lines(3, 60)
    sent = _produce(client, "lines2", lines, 2)
    co, layout = _instances(handle, tmp_path, "wc2", _plan("lines2", "wc2", "counts2"), 2, 1, "memory")
    try:
        run = RunSpec(app="wc2", bootstrap=handle.bootstrap, plan=co.spec.plan(0), partitions=2,
                      checkpoint_dir=layout.checkpoint_dir(0), control_dir=layout.control_dir,
                      trigger="0.2 seconds", events=False)
        events = []
        engine = SparkEngine(spark)
        q = engine.start(run, on_progress=events.append)
        try:
            q.process_all_available(timeout=120)
            assert q.is_active and q.exception() is None
            more = _lines(4, 30)
            sent += _produce(client, "lines2", more, 2)
            q.process_all_available(timeout=120)
        finally:
            q.stop()
        assert not q.is_active
        assert sum(p["num_input_rows"] for p in q.recent_progress) == sent
        # listener events arrive asynchronously (~100 ms after a batch)
        wait_until(lambda: sum(e["num_input_rows"] for e in events) >= sent, 10,
                   "the listener's progress events of every batch")
        assert sum(e["num_input_rows"] for e in events) == sent
        rows = read_outputs(layout.control.output_dir())
        assert sorted({r[0] for r in rows}) == [p["batch_id"] for p in q.recent_progress
                                                 if p["num_input_rows"]]
        last = {}
        for _b, _t, _topic, k, v in rows:  # batch order; within a task, processing order
            last[k.decode()] = struct.unpack(">q", v)[0]
        assert last == dict(collections.Counter(w for ln in lines + more for w in ln.split()))

        # abort() stops a query in the middle of a batch; the next start replays that batch (the
        # tasks skip what they had committed) and the counts stay exact
        third = _lines(5, 2000)
        _produce(client, "lines2", third, 2)
        q = engine.start(run)  # restarts from the checkpoint
        wait_until(lambda: q.status().get("isTriggerActive"), 60, "a micro-batch running",
                   interval=0.01)
        q.abort()
        assert not q.is_active and q.exception() is None
        q = engine.start(run)
        try:
            q.process_all_available(timeout=120)
        finally:
            q.stop()
        last = {}
        for _b, _t, _topic, k, v in read_outputs(layout.control.output_dir()):
            last[k.decode()] = struct.unpack(">q", v)[0]
        assert last == dict(collections.Counter(w for ln in lines + more + third for w in ln.split()))
    finally:
        co.stop()
