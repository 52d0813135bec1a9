"""The statekit-kafka data source against the embedded broker: exact records, admission control,
availableNow, restart from the checkpoint, one-line errors."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def _produce(client, topic, counts, tag):
    """counts[p] records into partition p; returns {(p, offset): (key, value)}."""
    out = {}
    for p, n in enumerate(counts):
        recs = [(f"k{p}-{i % 5}".encode(), f"{tag}-{p}-{i}".encode()) for i in range(n)]
        last = client.send(topic, p, recs)
        for j, rec in enumerate(recs):
            out[(p, last - n + 1 + j)] = rec
    return out


def _rows(rows):
    return {(r.partition, r.offset): (bytes(r.key), bytes(r.value)) for r in rows}


def test_batch_read_returns_exact_records(spark, kafka_broker):
    handle, client = kafka_broker
    client.ensure_topic("exact", 3)
    expected = _produce(client, "exact", [7, 0, 12], "a")
    client.send("exact", 1, [(None, b"null-key")], headers=[("h", b"v")])
    expected[(1, 0)] = (None, b"null-key")
    df = (spark.read.format("statekit-kafka").option("bootstrap", handle.bootstrap)
          .option("topic", "exact").option("includeHeaders", "true").load())
    rows = df.collect()
    assert len(rows) == len(expected)
    got = {(r.partition, r.offset): (None if r.key is None else bytes(r.key), bytes(r.value)) for r in rows}
    assert got == expected
    assert {r.topic for r in rows} == {"exact"}
    hdr = [r.headers for r in rows if r.partition == 1][0]
    assert [(h.key, bytes(h.value)) for h in hdr] == [("h", b"v")]
    assert df.schema["timestamp"].dataType.typeName() == "timestamp"


def test_stream_admission_control_available_now_and_restart(spark, kafka_broker, tmp_path):
    handle, client = kafka_broker
    client.ensure_topic("stream", 3)
    first = _produce(client, "stream", [40, 35, 25], "one")
    ck = str(tmp_path / "ck")

    client.ensure_topic("stream-out", 3)
    seen: dict = {}

    def run(name):
        """One availableNow run from the same checkpoint, writing through the statekit-kafka sink
        (key, value, partition kept) to stream-out; returns (rows per batch, new output records)."""
        from pyspark.sql import functions as F

        q = (spark.readStream.format("statekit-kafka").option("bootstrap", handle.bootstrap)
             .option("topic", "stream").option("maxRecordsPerTrigger", 30)
             .option("startingOffsets", "earliest").load()
             .select("key", F.concat(F.col("value"), F.lit("@"), F.col("offset").cast("string").cast("binary")).alias("value"),
                     F.lit("stream-out").alias("topic"), "partition")
             .writeStream.format("statekit-kafka").option("bootstrap", handle.bootstrap)
             .queryName(name).option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        assert q.exception() is None
        batches = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
        rows = (spark.read.format("statekit-kafka").option("bootstrap", handle.bootstrap)
                .option("topic", "stream-out").load().collect())
        new = {}
        for r in rows:
            if (r.partition, r.offset) in seen:
                continue
            seen[(r.partition, r.offset)] = True
            value, _, off = bytes(r.value).rpartition(b"@")
            assert (r.partition, int(off)) not in new, "a record was written twice"
            new[(r.partition, int(off))] = (bytes(r.key), value)
        return batches, new

    batches, got = run("stream_run1")
    assert batches == [30, 30, 30, 10]  # ceil(100 / 30) micro-batches, admission control respected
    assert got == first

    second = _produce(client, "stream", [5, 0, 50], "two")
    batches, got = run("stream_run2")
    assert got == second                 # continues at the checkpointed offsets: no gaps, no dups
    assert batches == [30, 25]

    batches, got = run("stream_run3")    # nothing new: nothing read
    assert batches == [] and got == {}


def test_unknown_topic_is_one_line(spark, kafka_broker):
    from statekit.engine.spark.session import one_line
    from statekit.errors import StatekitError

    handle, _client = kafka_broker
    with pytest.raises(Exception) as info:
        (spark.read.format("statekit-kafka").option("bootstrap", handle.bootstrap)
         .option("topic", "no-such-topic").load().collect())
    err = one_line(info.value)
    assert isinstance(err, StatekitError)
    msg = str(err)
    assert "no-such-topic" in msg and "does not exist" in msg, msg
    assert "\n" not in msg and "at org.apache" not in msg and "Traceback" not in msg


def test_split_columns_and_the_marker_of_a_split_without_records(spark, kafka_broker):
    """includeSplits: every row says which input split of the micro-batch it is from and how many
    there are; a split whose range holds no record (all aborted, say) still yields one marker row
    (offset -1), so a reader of each split learns both."""
    from statekit.engine.spark.source import kafka_schema, read_range

    handle, client = kafka_broker
    client.ensure_topic("splits", 2)
    _produce(client, "splits", [4, 3], "s")
    df = (spark.read.format("statekit-kafka").option("bootstrap", handle.bootstrap)
          .option("topic", "splits").option("includeSplits", "true").load())
    rows = df.collect()
    assert len(rows) == 7
    assert sorted({(r.partition, r.split, r.splits) for r in rows}) == [(0, 0, 2), (1, 1, 2)]
    schema = kafka_schema(include_splits=True)
    batches = list(read_range(handle.bootstrap, "splits", 0, 2, 2, schema, split=(3, 5)))
    marker = [b.to_pylist() for b in batches]
    assert len(marker) == 1 and len(marker[0]) == 1
    assert marker[0][0]["offset"] == -1 and (marker[0][0]["split"], marker[0][0]["splits"]) == (3, 5)
    assert list(read_range(handle.bootstrap, "splits", 0, 2, 2, kafka_schema())) == []
