"""Column-wise produce: ``Kafka.send_many`` and ``TransactionalProducer.send_many`` take a
``Columns`` per item (keys, values, optional timestamps, header runs) and write the same records
as the tuple path: same keys, values, headers, offsets."""
from __future__ import annotations

import random

import pytest

from statekit.wire import Columns, WireError

MARKER = [("__marker", b"1"), ("__batch", b"7")]
COMMIT = [("__batch", b"7")]


def changelog_like(rng: random.Random, n: int):
    """A commit's records (one header tuple) and its marker (another): None keys and values, long
    values."""
    keys = [None if rng.random() < 0.05 else b"k%d" % rng.randrange(10**6) for _ in range(n)]
    values = [None if rng.random() < 0.1 else
              rng.randbytes(rng.choice([0, 3, 40, 300, 300, 300, 5000]) if rng.random() > 0.005 else 70_000)
              for _ in range(n)]
    keys.append(b"__marker__")
    values.append(b'{"batch":7}')
    return keys, values, [(0, n, tuple(COMMIT)), (n, n + 1, tuple(MARKER))]


def read_all(k, topic, partition):
    return [chunk_rec for chunk in k.read(topic, partition) for chunk_rec in chunk]


@pytest.mark.parametrize("seed", [1, 2])
def test_columns_and_tuples_write_the_same_records(kafka, seed):
    rng = random.Random(seed)
    t_tup, t_col = f"sc-tup-{seed}", f"sc-col-{seed}"
    for t in (t_tup, t_col):
        kafka.ensure_topic(t, 2)
    items_tup, items_col = [], []
    for p in range(2):
        keys, values, runs = changelog_like(rng, rng.randrange(50, 3000))
        cols = Columns.of(keys, values, runs=runs)
        hdrs = cols.headers()
        items_tup.append((t_tup, p, [(k, v, list(h)) for k, v, h in zip(keys, values, hdrs)]))
        items_col.append((t_col, p, cols))
    lasts_tup = kafka.send_many(items_tup, batch_bytes=64 << 10)
    lasts_col = kafka.send_many(items_col, batch_bytes=64 << 10)
    assert lasts_col == lasts_tup == [len(i[2]) - 1 for i in items_tup]
    for p in range(2):
        a = [r[:1] + r[2:] for r in read_all(kafka, t_tup, p)]
        b = [r[:1] + r[2:] for r in read_all(kafka, t_col, p)]
        assert a == b
        want = [(i, k, v, tuple(h)) for i, (k, v, h) in enumerate(items_tup[p][2])]
        assert b == want


def test_columns_with_a_timestamp_and_one_header_for_all(kafka):
    # a 1970 timestamp: without retention.ms=-1 the retention check could delete it mid-test
    kafka.ensure_topic("sc-ts", 1, configs={"retention.ms": "-1"})
    cols = Columns.of([b"a", b"b", None], [b"1", None, b"3"], headers=[("h", b"x")], timestamp=12345)
    assert kafka.send_many([("sc-ts", 0, cols)]) == [2]
    assert kafka.send("sc-ts", 0, Columns.of([b"c"], [b"4"])) == 3
    recs = read_all(kafka, "sc-ts", 0)
    assert [r[:4] for r in recs[:3]] == [(0, 12345, b"a", b"1"), (1, 12345, b"b", None), (2, 12345, None, b"3")]
    assert [r[4] for r in recs] == [(("h", b"x"),)] * 3 + [()]
    assert kafka.send_many([("sc-ts", 0, Columns.of([], []))]) == [-1]
    with pytest.raises(WireError, match="2 keys but 1 values"):
        Columns.of([b"a", b"b"], [b"1"])


def test_transactional_send_many_with_columns(kafka):
    kafka.ensure_topic("sc-txn", 2)
    rng = random.Random(5)
    txp = kafka.transactional_producer("sc-txn-1")
    try:
        items = []
        for p in range(2):
            keys, values, runs = changelog_like(rng, 400)
            items.append(("sc-txn", p, Columns.of(keys, values, runs=runs)))
        txp.begin()
        lasts = txp.send_many(items, batch_bytes=32 << 10)
        txp.commit()
        assert lasts == [400, 400]
        txp.begin()
        assert txp.send_many([("sc-txn", 0, Columns.of([b"gone"], [b"x"]))]) == [402]  # after the marker
        txp.abort()
        txp.begin()
        assert txp.send_many([("sc-txn", 1, Columns.of([b"kept"], [b"y"]))]) == [402]
        txp.commit()
    finally:
        txp.close()
    for p, (_t, _p, cols) in enumerate(items):
        got = [r for c in kafka.read("sc-txn", p, isolation="read_committed") for r in c]
        want = list(zip(cols.keys, cols.values, cols.headers()))
        if p == 1:
            want.append((b"kept", b"y", ()))
        assert [(r[2], r[3], r[4]) for r in got] == want


def test_the_spark_sink_writes_columns_where_kafkas_partitioner_would(kafka, shared_broker):
    """statekit-kafka's writer (no Spark needed: it takes Arrow batches): string and binary keys to
    murmur2's partition, null keys round robin, an explicit partition column wins."""
    pa = pytest.importorskip("pyarrow")
    from statekit.engine.spark.sink import write_batches
    from statekit.partition import partition_for, partitions_for

    kafka.ensure_topic("sink-a", 3)
    kafka.ensure_topic("sink-b", 2)
    keys = ["k%d" % i if i % 5 else None for i in range(40)]
    b1 = pa.RecordBatch.from_pydict({
        "topic": ["sink-a" if i % 2 else "sink-b" for i in range(40)],
        "key": keys, "value": [b"v%d" % i for i in range(40)]})
    b2 = pa.RecordBatch.from_pydict({"key": [b"x", b"y"], "value": ["1", None], "partition": [2, None]})
    assert write_batches({"bootstrap": shared_broker.bootstrap, "topic": "sink-a"}, [b1, b2]) == 42
    want: dict = {}
    rr = {"sink-a": 0, "sink-b": 0}
    for i in range(40):
        t = "sink-a" if i % 2 else "sink-b"
        n = 3 if t == "sink-a" else 2
        if keys[i] is None:
            p = rr[t] % n
            rr[t] += 1
        else:
            p = partition_for(keys[i].encode(), n)
        want.setdefault((t, p), []).append((None if keys[i] is None else keys[i].encode(), b"v%d" % i))
    want.setdefault(("sink-a", 2), []).append((b"x", b"1"))
    want.setdefault(("sink-a", partition_for(b"y", 3)), []).append((b"y", None))
    for (t, p), recs in want.items():
        got = [(r[2], r[3]) for c in kafka.read(t, p) for r in c]
        assert got == recs, (t, p)
    assert partitions_for([b"x", None, b"yy"], 3).tolist() == [partition_for(b"x", 3), -1,
                                                               partition_for(b"yy", 3)]


def test_big_damaged_batches_get_the_record_walks_verdict(kafka, shared_broker):
    """A produce of 500-record batches goes through the column-wise check; a damaged one is
    refused with the record walk's exact reason, a whole one is appended."""
    from kafka.protocol.producer import ProduceResponse

    from _broker_util import Raw, produce_request
    from statekit import wire as W

    kafka.ensure_topic("sc-big", 1)
    n = 500
    h = [("b", b"1")]
    rows = [(i, b"k%d" % i, b"v" * (i % 90), h if i != n - 1 else [("m", b"1")] + h) for i in range(n)]

    def batch(bad_at=None, bad_len_at=None):
        recs = []
        for i, k, v, hh in rows:
            r = W.encode_record(i + 1 if i == bad_at else i, k, v, W.encode_headers(hh), i)
            if i == bad_len_at:  # the record claims one byte more than it has
                assert len(r) - 1 < 63  # a one-byte length
                r = W.write_varint(len(r)) + r[1:]
            recs.append(r)
        return W.build_batch(b"".join(recs), n, first_timestamp=0, max_timestamp=n - 1)

    good = batch()
    assert W.records_valid(good, 61, len(good), n)
    with Raw(shared_broker.bootstrap) as raw:
        def produce(data):
            resp = raw.call(produce_request("sc-big", 0, data), ProduceResponse)
            p = resp.responses[0].partition_responses[0]
            return p.error_code, p.error_message, p.base_offset

        assert produce(batch(bad_at=321))[:2] == (2, "record 321 has offset delta 322: deltas must be 0, 1, 2, ...")
        assert produce(batch(bad_len_at=7))[:2] == (2, "record 7 does not end where its length says")
        assert produce(good)[0::2] == (0, 0)
    got = [r for c in kafka.read("sc-big", 0) for r in c]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in got] == [
        (i, i, k, v, tuple(hh)) for i, k, v, hh in rows]
