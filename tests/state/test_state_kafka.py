"""The thin Kafka client layer against the embedded broker: send/read round trips, offset gaps,
a log start that moves, compressed batches, one-line errors."""
from __future__ import annotations

import pytest

from statekit.bootstrap import resolve_bootstrap
from statekit.errors import BrokerUnreachable, UnknownTopic
from statekit.kafka import Kafka


def test_send_read_roundtrip(kafka):
    assert kafka.ensure_topic("kc-rt", 2, {"cleanup.policy": "compact"}) is True
    assert kafka.ensure_topic("kc-rt", 2) is False
    assert kafka.topics()["kc-rt"] == 2
    recs = [(b"k%d" % i, b"v%d" % i) for i in range(5000)] + [(b"gone", None)]
    last = kafka.send("kc-rt", 1, recs, headers=[("statekit.batch", b"7")])
    assert last == 5000
    assert kafka.end_offsets("kc-rt") == {0: 0, 1: 5001}
    assert kafka.begin_offsets("kc-rt") == {0: 0, 1: 0}
    for pipeline in (True, False):
        got = [r for ch in kafka.read("kc-rt", 1, 0, None, max_bytes=20_000, pipeline=pipeline)
               for r in ch.records]
        assert [r[0] for r in got] == list(range(5001))
        assert [(r[2], r[3]) for r in got] == recs
        assert all(r[4] == (("statekit.batch", b"7"),) for r in got)
    mid = [r[0] for ch in kafka.read("kc-rt", 1, 1234, 1300, max_bytes=500) for r in ch.records]
    assert mid == list(range(1234, 1300))
    # other requests between the chunks of a pipelined read (a Fetch in flight) do not mix up
    seen = []
    for ch in kafka.read("kc-rt", 1, 0, None, max_bytes=5000):
        assert kafka.end_offsets("kc-rt") == {0: 0, 1: 5001}
        seen.extend(r[0] for r in ch.records)
    assert seen == list(range(5001))
    # an abandoned read leaves the connection usable
    it = kafka.read("kc-rt", 1, 0, None, max_bytes=2000)
    next(it)
    it.close()
    assert kafka.end_offsets("kc-rt")[1] == 5001
    assert kafka.describe_configs("kc-rt")["cleanup.policy"] == "compact"


def test_log_start_moves(kafka):
    kafka.ensure_topic("kc-lso", 1)
    kafka.send("kc-lso", 0, [(b"k", b"%d" % i) for i in range(100)])
    assert kafka.delete_records("kc-lso", 0, 40) == 40
    assert kafka.begin_offsets("kc-lso") == {0: 40}
    got = [r[0] for ch in kafka.read("kc-lso", 0, 0, None) for r in ch.records]
    assert got == list(range(40, 100))
    ch = kafka.fetch("kc-lso", 0, 3)
    assert ch.records[0][0] == 40 and ch.log_start_offset == 40


def test_compressed_batches_decode(kafka, shared_broker):
    from kafka import KafkaProducer

    kafka.ensure_topic("kc-gzip", 1)
    p = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, compression_type="gzip",
                      linger_ms=50, acks="all")
    for i in range(300):
        p.send("kc-gzip", key=b"k%d" % i, value=b"x" * 50, partition=0,
               headers=[("h", b"%d" % i)])
    p.flush()
    p.close()
    got = [r for ch in kafka.read("kc-gzip", 0) for r in ch.records]
    assert [r[2] for r in got] == [b"k%d" % i for i in range(300)]
    assert got[299][4] == (("h", b"299"),)


def test_one_line_errors(kafka):
    with pytest.raises(UnknownTopic) as e:
        kafka.end_offsets("kc-no-such-topic")
    assert "kc-no-such-topic" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UnknownTopic):
        list(kafka.read("kc-no-such-topic", 0, 0, 10))
    with pytest.raises(BrokerUnreachable) as e:
        Kafka("127.0.0.1:1")
    msg = str(e.value)
    assert msg.startswith("cannot reach Kafka at 127.0.0.1:1: start one with `statekit broker start`")
    assert "STATEKIT_BOOTSTRAP" in msg and "\n" not in msg


def test_resolve_bootstrap(monkeypatch):
    monkeypatch.setenv("STATEKIT_BOOTSTRAP", "h:1")
    assert resolve_bootstrap("x:2") == "x:2"
    assert resolve_bootstrap() == "h:1"


def test_pipelined_offsets_and_sends(kafka):
    kafka.ensure_topic("kc-pipe-a", 2)
    kafka.ensure_topic("kc-pipe-b", 2)
    assert kafka.partition_counts(["kc-pipe-a", "kc-pipe-missing", "kc-pipe-b"]) == {
        "kc-pipe-a": 2, "kc-pipe-b": 2}
    assert kafka.partition_counts([]) == {}
    # several topics' records in flight at once; each item keeps its order and its own offsets
    lasts = kafka.send_many([("kc-pipe-a", 1, [(b"a%d" % i, b"%d" % i) for i in range(3)]),
                             ("kc-pipe-b", 1, [(b"b", b"x", [("h", b"1")])]),
                             ("kc-pipe-a", 0, [])])
    assert lasts == [2, 0, -1]
    lasts = kafka.send_many([("kc-pipe-b", 1, [(b"b%d" % i, None) for i in range(4)]),
                             ("kc-pipe-a", 1, [(b"a9", b"9")])])
    assert lasts == [4, 3]
    assert [(r[2], r[3]) for ch in kafka.read("kc-pipe-a", 1) for r in ch.records] == [
        (b"a0", b"0"), (b"a1", b"1"), (b"a2", b"2"), (b"a9", b"9")]
    got = [r for ch in kafka.read("kc-pipe-b", 1) for r in ch.records]
    assert [(r[0], r[2], r[3], r[4]) for r in got] == [(0, b"b", b"x", (("h", b"1"),))] + [
        (i + 1, b"b%d" % i, None, ()) for i in range(4)]
    kafka.delete_records("kc-pipe-b", 1, 2)
    assert kafka.offsets_many(["kc-pipe-a", "kc-pipe-b"], 1) == {"kc-pipe-a": (0, 4),
                                                                  "kc-pipe-b": (2, 5)}
    assert kafka.offsets_many(["kc-pipe-a"], 0) == {"kc-pipe-a": (0, 0)}
    with pytest.raises(UnknownTopic):
        kafka.offsets_many(["kc-pipe-a", "kc-pipe-missing"], 1)
    with pytest.raises(UnknownTopic):
        kafka.offsets_many(["kc-pipe-a"], 5)  # no such partition
    # the connection is still in step after the errors
    assert kafka.offsets_many(["kc-pipe-b"], 1) == {"kc-pipe-b": (2, 5)}
    with pytest.raises(UnknownTopic):
        kafka.send_many([("kc-pipe-a", 1, [(b"z", b"z")]), ("kc-pipe-missing", 0, [(b"z", b"z")])])
    assert kafka.end_offsets("kc-pipe-a", [1]) == {1: 4}


def test_record_batches_are_byte_for_byte_kafka_pythons():
    """The produce path encodes v2 batches itself; they equal MemoryRecordsBuilder's output, also
    where a batch is split (null keys and values, headers with null values, big values)."""
    import random

    from kafka.record.memory_records import MemoryRecordsBuilder

    from statekit.kafka import encode_batches

    def reference(records, headers, batch_bytes, ts):
        out, builder, count = [], None, 0
        for rec in records:
            key, value = rec[0], rec[1]
            hdrs = list(rec[2]) if len(rec) == 3 and rec[2] else list(headers)
            if builder is None:
                builder, count = MemoryRecordsBuilder(2, 0, batch_bytes), 0
            if builder.append(ts, key, value, hdrs) is None:
                builder.close()
                out.append((bytes(builder.buffer()), count))
                builder, count = MemoryRecordsBuilder(2, 0, batch_bytes), 0
                builder.append(ts, key, value, hdrs)
            count += 1
        if builder is not None and count:
            builder.close()
            out.append((bytes(builder.buffer()), count))
        return out

    r = random.Random(7)
    recs = []
    for _ in range(3000):
        k = None if r.random() < 0.05 else r.randbytes(r.choice([0, 3, 200]))
        v = None if r.random() < 0.1 else r.randbytes(r.choice([0, 5, 300, 20_000]))
        h = r.choice([None, [], [("statekit.batch", b"12")], [("a", None), ("statekit.marker", b"1")]])
        recs.append((k, v) if h is None else (k, v, h))
    for batch_bytes in (900_000, 50_000, 100):
        got = encode_batches(recs, [("d", b"x")], batch_bytes, 1_700_000_000_123)
        assert got == reference(recs, [("d", b"x")], batch_bytes, 1_700_000_000_123)
        assert sum(n for _b, n in got) == len(recs)
    assert encode_batches([], None, 1000, 0) == []
