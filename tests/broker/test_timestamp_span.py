"""Record batches whose timestamps span 1970 to now: a record's timestamp delta is a varlong (here
6 bytes), which the broker once read as a 5-byte varint and refused with CORRUPT_MESSAGE. Each
client writes such a batch (kafka-python and confluent-kafka stamp records themselves; kcat
cannot stamp a record, so it writes "now" records after them) and every client reads all of it
back exactly: keys, values, timestamps."""
from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from _broker_util import Raw, create_topic, fetch_request
from statekit.kafka import Kafka
from statekit.wire import Columns, header_at, scan

NOW = int(time.time() * 1000)
LINGER_MS = 10_000   # each writer's records in one batch: its flush() sends them, not the linger


def batch_headers(bootstrap, topic):
    """Headers of the partition's record batches as stored (raw Fetch, nothing decoded)."""
    from kafka.protocol.consumer import FetchResponse

    with Raw(bootstrap) as raw:
        resp = raw.call(fetch_request(topic, 0, 0), FetchResponse)
    data = resp.responses[0].partitions[0].records
    return [header_at(data, pos) for pos, _h in scan(data)]


def kafka_python_records(bootstrap, topic, n):
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        out, deadline = [], time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            for recs in c.poll(500).values():
                out += [(r.offset, r.timestamp, r.key, r.value) for r in recs]
        return out
    finally:
        c.close()


def confluent_records(bootstrap, topic, n):
    ck = pytest.importorskip("confluent_kafka")
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})
    try:
        c.assign([ck.TopicPartition(topic, 0, 0)])
        out, deadline = [], time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append((m.offset(), m.timestamp()[1], m.key(), m.value()))
        return out
    finally:
        c.close()


def kcat_records(kcat, bootstrap, topic):
    c = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
                        "-f", "%o %T %k %s\n"], capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stderr
    out = []
    for line in c.stdout.splitlines():
        o, t, k, v = line.split(" ")
        out.append((int(o), int(t), k.encode(), v.encode()))
    return out


def statekit_records(bootstrap, topic):
    with Kafka(bootstrap) as k:
        rows = [r[:4] for chunk in k.read(topic, 0) for r in chunk]
        cols = [r[:4] for chunk in k.read(topic, 0, columns=True) for r in chunk.records]
    assert rows == cols
    return rows


def test_batches_spanning_1970_to_now_from_every_client_read_back_exactly(shared_broker):
    b = shared_broker.bootstrap
    topic = "span-1970"
    create_topic(b, topic)
    want = []
    # kafka-python: 0, then now (one batch: a linger longer than any stall of a loaded machine
    # keeps them together, and flush() sends at once)
    p = KafkaProducer(bootstrap_servers=b, acks="all", linger_ms=LINGER_MS)
    futs = [p.send(topic, key=b"kp%d" % i, value=b"v%d" % i, partition=0, timestamp_ms=ts)
            for i, ts in enumerate([0, NOW - 1, NOW])]
    p.flush()
    assert [f.get(timeout=30).offset for f in futs] == [0, 1, 2]
    p.close()
    want += [(i, ts, b"kp%d" % i, b"v%d" % i) for i, ts in enumerate([0, NOW - 1, NOW])]
    # confluent-kafka (librdkafka): timestamp 0 means "now" to it, so 1 ms past 1970
    ck = pytest.importorskip("confluent_kafka")
    prod = ck.Producer({"bootstrap.servers": b, "linger.ms": LINGER_MS, "acks": "all"})
    errors = []
    for i, ts in enumerate([1, NOW - 1, NOW]):
        prod.produce(topic, key=b"ck%d" % i, value=b"w%d" % i, partition=0, timestamp=ts,
                     on_delivery=lambda err, msg: err and errors.append(err))
    assert prod.flush(30) == 0 and errors == []
    del prod  # librdkafka closes its connections
    want += [(3 + i, ts, b"ck%d" % i, b"w%d" % i) for i, ts in enumerate([1, NOW - 1, NOW])]
    # statekit's own client: per-record timestamps, column-wise
    with Kafka(b) as k:
        last = k.send_many([(topic, 0, Columns.of([b"sk0", b"sk1", b"sk2"], [b"x0", b"x1", b"x2"],
                                                  timestamps=[NOW, 0, NOW - 1]))])
    assert last == [8]
    want += [(6, NOW, b"sk0", b"x0"), (7, 0, b"sk1", b"x1"), (8, NOW - 1, b"sk2", b"x2")]
    # every writer's records are in one batch per writer, spanning 1970 to now
    spans = [(h.base_offset, h.count, h.first_timestamp, h.max_timestamp) for h in batch_headers(b, topic)]
    assert spans == [(0, 3, 0, NOW), (3, 3, 1, NOW), (6, 3, NOW, NOW)]
    kcat = shutil.which("kcat")
    if kcat is not None:
        lines = "".join(f"kc{i}:z{i}\n" for i in range(3))
        before = int(time.time() * 1000)
        r = subprocess.run([kcat, "-b", b, "-P", "-t", topic, "-p", "0", "-K:"], input=lines,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    n = len(want) + (3 if kcat else 0)
    got_kp = kafka_python_records(b, topic, n)
    got_ck = confluent_records(b, topic, n)
    got_sk = statekit_records(b, topic)
    if kcat is None:
        print("kcat is not installed (apt-get install kcat): its part was skipped")
        for got in (got_kp, got_ck, got_sk):
            assert got == want
        return
    for got in (got_kp, got_ck, got_sk, kcat_records(kcat, b, topic)):
        assert got[:9] == want
        tail = got[9:]
        assert [(o, k, v) for o, _t, k, v in tail] == [(9 + i, b"kc%d" % i, b"z%d" % i) for i in range(3)]
        assert all(before <= t <= int(time.time() * 1000) for _o, t, _k, _v in tail)
