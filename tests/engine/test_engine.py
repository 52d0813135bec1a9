"""The Spark engine end to end on the embedded broker: the real topology Plan and task runner
(RocksDB stores, changelogs, commits), word count equal to a plain-Python reference, and a batch
replayed after a worker is killed mid-batch gives exactly the reference."""
from __future__ import annotations

import collections
import os
import random

import pytest

pytestmark = pytest.mark.spark

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _lines(seed, n):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS[: rng.randint(3, len(WORDS))]) for _ in range(rng.randint(1, 8)))
            for _ in range(n)]


def _produce(client, topic, lines, partitions):
    for p in range(partitions):
        client.send(topic, p, [(f"line-{i}".encode(), ln.encode()) for i, ln in enumerate(lines)
                               if i % partitions == p])


def _final_counts(client, topic):
    """The last value per key of the output topic (each key lives in one partition, in order)."""
    import struct

    last = {}
    for p in client.end_offsets(topic):
        for chunk in client.read(topic, p, 0):
            for _off, _ts, key, value, _h in chunk.records:
                last[key.decode()] = struct.unpack(">q", value)[0]
    return last


def _plan():
    from statekit.topology import TopologyBuilder

    b = TopologyBuilder()
    (b.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w)
     .count(store="word-counts").to_stream().to("counts", value_serde="int64"))
    return b.compile()


def test_word_count_and_replay_after_worker_kill(spark, kafka_broker, tmp_path):
    from statekit.engine.spark import SparkEngine
    from statekit.engine.spec import RunSpec
    from statekit.runtime import crash

    handle, client = kafka_broker
    n = 3
    client.ensure_topic("lines", 2)
    first = _lines(1, 240)
    _produce(client, "lines", first, 2)
    control = str(tmp_path / "control")
    os.makedirs(control)
    run = RunSpec(app="wc", bootstrap=handle.bootstrap, plan=_plan(), partitions=n,
                  checkpoint_dir=str(tmp_path / "ck"), control_dir=control,
                  state_dirs={t: str(tmp_path / "state") for t in range(n)},
                  trigger="availableNow", max_records_per_trigger=100, sink="kafka")
    engine = SparkEngine(spark)
    progress = []
    q = engine.start(run, on_progress=progress.append)
    assert q.await_termination(180)
    assert q.exception() is None
    assert [p["num_input_rows"] for p in q.recent_progress] == [100, 100, 40]
    ref = collections.Counter(w for ln in first for w in ln.split())
    assert _final_counts(client, "counts") == dict(ref)
    assert q.last_batch_id == 2

    # a worker dies mid-batch: the query fails with one line, a restart replays the batch
    second = _lines(2, 150)
    _produce(client, "lines", second, 2)
    d = crash.write_directive(control, instance=None, point="records", after_records=20)
    q = engine.start(run)
    with pytest.raises(Exception):
        q.await_termination(180)
    msg = q.exception()
    print("crash message:", msg)
    assert msg and "\n" not in msg and "at org.apache" not in msg, msg
    assert "worker" in msg, msg
    assert crash.claimed(control, d["id"]) is not None
    assert not q.is_active

    q = engine.start(run)
    assert q.await_termination(180)
    assert q.exception() is None, q.exception()
    ref.update(w for ln in second for w in ln.split())
    assert _final_counts(client, "counts") == dict(ref)
    assert progress and progress[0]["num_input_rows"] == 100


def test_continuous_trigger_process_all_available_and_stop(spark, kafka_broker, tmp_path):
    """A processing-time query: process_all_available() catches up, progress reaches the callback
    live, stop() ends it cleanly, and abort() of a second run stops it at once."""
    from statekit.engine.spark import SparkEngine
    from statekit.engine.spec import RunSpec

    handle, client = kafka_broker
    client.ensure_topic("lines2", 1)
    lines = _lines(3, 60)
    _produce(client, "lines2", lines, 1)
    from statekit.topology import TopologyBuilder

    b = TopologyBuilder()
    (b.stream("lines2").flat_map_values(str.split).group_by(lambda k, w: w)
     .count(store="wc2").to_stream().to("counts2", value_serde="int64"))
    run = RunSpec(app="wc2", bootstrap=handle.bootstrap, plan=b.compile(), partitions=2,
                  checkpoint_dir=str(tmp_path / "ck"), state_dirs={0: str(tmp_path / "s"), 1: str(tmp_path / "s")},
                  trigger="0.2 seconds", sink="memory", memory_table="wc2_out", extra={"events": False})
    events = []
    engine = SparkEngine(spark)
    q = engine.start(run, on_progress=events.append)
    try:
        q.process_all_available(timeout=120)
        assert q.is_active and q.exception() is None
        more = _lines(4, 30)
        _produce(client, "lines2", more, 1)
        q.process_all_available(timeout=120)
    finally:
        q.stop()
    assert not q.is_active
    assert sum(p["num_input_rows"] for p in q.recent_progress) == 90
    import time

    deadline = time.time() + 10  # listener events arrive asynchronously (~100 ms after a batch)
    while sum(e["num_input_rows"] for e in events) < 90 and time.time() < deadline:
        time.sleep(0.1)
    assert sum(e["num_input_rows"] for e in events) == 90
    import struct

    rows = engine.output(run)
    assert sorted(rows["batch"].unique()) == [p["batch_id"] for p in q.recent_progress if p["num_input_rows"]]
    last = {}
    for k, v in zip(rows["key"], rows["value"]):  # batch order; within a task, processing order
        last[bytes(k).decode()] = struct.unpack(">q", bytes(v))[0]
    assert last == dict(collections.Counter(w for ln in lines + more for w in ln.split()))

    _produce(client, "lines2", _lines(5, 2000), 1)
    q = engine.start(run)  # restarts from the checkpoint (the memory sink allows it)
    time.sleep(2)
    q.abort()
    assert not q.is_active and q.exception() is None
