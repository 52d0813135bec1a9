"""The broker's log: compaction, retention, crash safety, torn tails, restarts."""
from __future__ import annotations

import glob
import os
import threading
import time

import pytest

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from statekit import broker as broker_mod

from _broker_util import consume_all, create_topic
from waiting import wait_until


def _stats(handle, topic, p=0):
    """The partition's row of log_stats (the broker refreshes them every second)."""
    return wait_until(lambda: next((s for s in broker_mod.log_stats(handle.dir, topic) if s["partition"] == p),
                                   None), 15, f"log_stats of {topic}-{p}")


def test_compaction_keeps_latest_per_key_with_original_offsets(broker):
    create_topic(broker.bootstrap, "compacted", configs={
        "cleanup.policy": "compact", "segment.bytes": "65536", "delete.retention.ms": "0"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20, batch_size=64 * 1024)
    n_keys, n = 1000, 100_000
    t0 = time.monotonic()
    expected = {}
    for i in range(n):
        key = b"key-%04d" % (i % n_keys)
        producer.send("compacted", key=key, value=b"%d" % i, partition=0)
        expected[key] = i
    tombstoned = [b"key-%04d" % k for k in range(0, n_keys, 10)]
    for j, key in enumerate(tombstoned):
        producer.send("compacted", key=key, value=None, partition=0)
        expected[key] = None
    producer.flush()
    producer.close()
    print("produced", time.monotonic() - t0)
    end = n + len(tombstoned)
    # make the whole log cleanable: as in Kafka, segment.ms rolls the active segment at the next
    # append (an idle one never rolls), so one more record, of its own key, starts a new segment
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "compacted", {"segment.ms": "100"})], incremental=True)
    finally:
        admin.close()
    time.sleep(0.3)  # the active segment gets older than segment.ms (100 ms): the next append rolls it
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    assert producer.send("compacted", key=b"roll", value=b"%d" % end, partition=0).get(timeout=10).offset == end
    producer.close()
    assert glob.glob(os.path.join(broker.dir, "logs", "compacted-0", "%020d.log" % end))
    t0 = time.monotonic()
    stats = broker_mod.request_clean(broker.dir)
    print("clean", time.monotonic() - t0)
    st = next(s for s in stats if s["topic"] == "compacted")
    live = {k: v for k, v in expected.items() if v is not None}
    assert st["high_watermark"] == end + 1
    assert st["cleaner_runs"] >= 1
    assert st["records"] == len(live) + 1
    assert st["records_removed"] == end - len(live)
    got = consume_all(broker.bootstrap, "compacted", [0])[0]
    # exactly one record per live key, at the offset it was produced at, with its latest value
    assert len(got) == len(live) + 1
    assert {k: int(v) for _, k, v in got} == {**live, b"roll": end}
    assert all(off == int(v) for off, _, v in got)
    assert [o for o, _, _ in got] == sorted(live.values()) + [end]
    assert max(live.values()) < n  # the records just before the active segment were removed
    # a consumer goes on past the records compacted away, to the end offset
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    tp = TopicPartition("compacted", 0)
    end += 1
    assert c.end_offsets([tp])[tp] == end
    c.assign([tp])
    c.seek(tp, got[-2][0])
    deadline = time.monotonic() + 10
    while c.position(tp) < end and time.monotonic() < deadline:
        c.poll(200)
    assert c.position(tp) == end
    c.close()
    ck = pytest.importorskip("confluent_kafka")
    cc = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "eof", "enable.partition.eof": True,
                      "enable.auto.commit": False})
    try:
        cc.assign([ck.TopicPartition("compacted", 0, 0)])
        seen, eof_at = 0, None
        deadline = time.monotonic() + 20
        while eof_at is None and time.monotonic() < deadline:
            m = cc.poll(0.5)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == ck.KafkaError._PARTITION_EOF, m.error()
                eof_at = m.offset()
            else:
                seen += 1
        assert (seen, eof_at) == (len(live) + 1, end)
    finally:
        cc.close()
    # producing continues at the next offset
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    assert producer.send("compacted", key=b"key-0001", value=b"new", partition=0).get(timeout=10).offset == end
    producer.close()


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compaction_of_compressed_batches(broker, codec):
    topic = "z-" + codec
    create_topic(broker.bootstrap, topic, configs={"cleanup.policy": "compact", "segment.bytes": "4000",
                                                   "delete.retention.ms": "0"})
    if codec == "zstd":
        ck = pytest.importorskip("confluent_kafka")
        producer = ck.Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "zstd", "linger.ms": 5})
        for i in range(2000):
            producer.produce(topic, key=b"k%02d" % (i % 50), value=b"%d" % i, partition=0)
            if i % 100 == 99:
                producer.flush(10)
        assert producer.flush(10) == 0
    else:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, linger_ms=5)
        for i in range(2000):
            producer.send(topic, key=b"k%02d" % (i % 50), value=b"%d" % i, partition=0)
            if i % 100 == 99:
                producer.flush()
        producer.close()
    wait_until(lambda: _stats(broker, topic)["high_watermark"] == 2000, 15, "stats after the 2000th record")
    st = next(s for s in broker_mod.request_clean(broker.dir) if s["topic"] == topic)
    assert st["records_removed"] > 0
    got = consume_all(broker.bootstrap, topic, [0])[0]
    latest = {}
    for off, k, v in got:
        assert int(v) == off  # every surviving record kept its offset
        latest[k] = int(v)
    assert latest == {b"k%02d" % k: 1950 + k for k in range(50)}
    assert len(got) < 2000


def test_cleaner_honours_dirty_ratio_and_keeps_fresh_tombstones(broker):
    create_topic(broker.bootstrap, "ratio", configs={
        "cleanup.policy": "compact", "segment.bytes": "3000", "min.cleanable.dirty.ratio": "0.9"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    for i in range(300):
        producer.send("ratio", key=b"k%02d" % (i % 30), value=b"v%d" % i, partition=0).get(timeout=10)
    for k in range(3):
        producer.send("ratio", key=b"k%02d" % k, value=None, partition=0).get(timeout=10)
    # the log was never cleaned: every closed segment is dirty (ratio 1.0 >= 0.9), the cleaner runs alone
    # (stats taken after the last append, so that no closed segment is left to make it dirty again)
    st = wait_until(lambda: (lambda s: s if s and s["high_watermark"] == 303 and s["cleaner_runs"] >= 1
                             and s["dirty_ratio"] < 0.9 else None)(_stats(broker, "ratio")),
                    15, "a cleaner pass over the 303 records")
    runs = st["cleaner_runs"]
    # a little more data: the dirty part is now far below 90% of the closed bytes
    for i in range(40):
        producer.send("ratio", key=b"k%02d" % (10 + i % 20), value=b"w%d" % i, partition=0).get(timeout=10)
    producer.close()
    time.sleep(2.5)  # the point: two of the cleaner's own passes go by and do not clean
    st = wait_until(lambda: (lambda s: s if s["high_watermark"] == 343 else None)(_stats(broker, "ratio")),
                    15, "stats after the 343rd record")
    assert st["cleaner_runs"] == runs
    assert 0 < st["dirty_ratio"] < 0.9
    st = next(s for s in broker_mod.request_clean(broker.dir) if s["topic"] == "ratio")
    assert st["cleaner_runs"] == runs + 1
    got = consume_all(broker.bootstrap, "ratio", [0])[0]
    latest = {}
    for off, k, v in got:
        latest[k] = v
    # tombstones are younger than delete.retention.ms (a day): they stay, as the latest for their key
    assert [latest[b"k%02d" % k] for k in range(3)] == [None, None, None]
    assert latest[b"k05"] == b"v275" and latest[b"k29"] == b"w39"
    assert sorted(latest) == [b"k%02d" % k for k in range(30)]
    assert len(got) == len({k for _, k, _ in got}) or len(got) - len(latest) < 40  # only the active segment repeats keys


def test_retention_bytes_deletes_old_segments(broker):
    create_topic(broker.bootstrap, "rb", configs={"segment.bytes": "2000", "retention.bytes": "5000"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    for i in range(200):
        producer.send("rb", key=b"k%03d" % i, value=b"x" * 50, partition=0).get(timeout=10)
    producer.close()
    # stats.json is rewritten every second: wait for one written after the last record
    st = wait_until(lambda: (lambda s: s if s["log_start_offset"] > 0 and s["high_watermark"] == 200
                             else None)(_stats(broker, "rb")), 15, "retention after the 200th record")
    files = sorted(glob.glob(os.path.join(broker.dir, "logs", "rb-0", "*.log")))
    sizes = [os.path.getsize(f) for f in files]
    assert int(os.path.basename(files[0])[:-4]) == st["log_start_offset"]
    # what is left is within retention.bytes but one segment more would not be
    assert sum(sizes) - sizes[0] < 5000
    assert sum(sizes) >= 5000 or st["log_start_offset"] == int(os.path.basename(files[0])[:-4])
    got = consume_all(broker.bootstrap, "rb", [0])[0]
    assert [o for o, _, _ in got] == list(range(st["log_start_offset"], 200))
    assert all(k == b"k%03d" % o for o, k, _ in got)


def test_retention_ms_deletes_old_segments(broker):
    create_topic(broker.bootstrap, "rms", configs={"segment.bytes": "1000", "retention.ms": "60000"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    old = int(time.time() * 1000) - 3_600_000
    for i in range(40):
        producer.send("rms", key=b"old%d" % i, value=b"y" * 40, partition=0, timestamp_ms=old).get(timeout=10)
    for i in range(5):
        producer.send("rms", key=b"new%d" % i, value=b"z", partition=0).get(timeout=10)
    producer.close()
    st = wait_until(lambda: (lambda s: s if s["log_start_offset"] > 0 else None)(_stats(broker, "rms")),
                    15, "retention.ms deleting the hour-old segments")
    start = st["log_start_offset"]
    bases = sorted(int(os.path.basename(f)[:-4]) for f in glob.glob(os.path.join(broker.dir, "logs", "rms-0", "*.log")))
    # every segment holding only hour-old records is gone; the first one left holds a new record
    assert bases[0] == start <= 40
    assert len(bases) == 1 or bases[1] > 40
    got = consume_all(broker.bootstrap, "rms", [0])[0]
    assert [o for o, _, _ in got] == list(range(start, 45))
    assert [k for _, k, _ in got] == [b"old%d" % i for i in range(start, 40)] + [b"new%d" % i for i in range(5)]


def test_kill9_during_produce_keeps_every_acked_record(tmp_path):
    d = str(tmp_path / "crash")
    h = broker_mod.start(dir=d, port=0)
    acked = {}
    try:
        create_topic(h.bootstrap, "crash")
        producer = KafkaProducer(bootstrap_servers=h.bootstrap, acks="all", linger_ms=2, retries=0,
                                 max_block_ms=2000, request_timeout_ms=2000, enable_idempotence=False)
        stop = threading.Event()
        lock = threading.Lock()

        def on_ok(i):
            def cb(meta):
                with lock:
                    acked[meta.offset] = i
            return cb

        def load():
            i = 0
            while not stop.is_set():
                try:
                    producer.send("crash", key=b"k%d" % i, value=b"v%d" % i, partition=0).add_callback(on_ok(i))
                except Exception:  # noqa: BLE001 - the broker is gone
                    break
                i += 1
                if i % 500 == 0:
                    time.sleep(0.001)  # pacing: the producer's I/O thread gets the GIL now and then

        t = threading.Thread(target=load, daemon=True)
        t.start()
        wait_until(lambda: len(acked) > 5000, 20, "5000 acknowledged records")
        h.kill()  # SIGKILL mid-load
        stop.set()
        t.join(10)
        # the broker is dead: fail the unsent records now (KafkaProducer.close() would first flush
        # them, time out and raise, and try again from __del__ at garbage collection). The sender
        # thread fails them itself on a forced close; failing them from this thread would race it
        # (it may be failing the same batch on the reset connection at that moment).
        producer._sender.force_close()
        producer._sender.join(10)
        assert not producer._sender.is_alive()
        producer.close(timeout=0)
    finally:
        h.stop()
    with lock:
        acked = dict(acked)
    assert len(acked) > 5000
    h = broker_mod.start(dir=d, port=0)
    try:
        got = consume_all(h.bootstrap, "crash", [0])[0]
        by_offset = {o: (k, v) for o, k, v in got}
        assert [o for o, _, _ in got] == list(range(len(got)))  # dense, each offset once
        for off, i in acked.items():
            assert by_offset[off] == (b"k%d" % i, b"v%d" % i)
        producer = KafkaProducer(bootstrap_servers=h.bootstrap, acks="all")
        assert producer.send("crash", key=b"after", value=b"crash", partition=0).get(timeout=10).offset == len(got)
        producer.close()
    finally:
        h.stop()


def _produce_batches(bootstrap, topic, n_batches, per_batch):
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=100, batch_size=1 << 20)
    i = 0
    for b in range(n_batches):
        fs = [producer.send(topic, key=b"k%d" % (i + j), value=b"v%d" % (i + j), partition=0) for j in range(per_batch)]
        producer.flush()
        assert fs[0].get().offset == i
        i += per_batch
    producer.close()


def test_torn_tail_is_truncated_on_start(tmp_path):
    d = str(tmp_path / "torn")
    h = broker_mod.start(dir=d, port=0)
    try:
        create_topic(h.bootstrap, "torn")
        _produce_batches(h.bootstrap, "torn", 10, 10)
    finally:
        h.stop()
    seg = sorted(glob.glob(os.path.join(d, "logs", "torn-0", "*.log")))[-1]
    size = os.path.getsize(seg)
    with open(seg, "r+b") as f:  # the last batch loses its tail, as a crash mid-write would leave it
        f.truncate(size - 7)
    h = broker_mod.start(dir=d, port=0)
    try:
        got = consume_all(h.bootstrap, "torn", [0])[0]
        assert got == [(i, b"k%d" % i, b"v%d" % i) for i in range(90)]
        producer = KafkaProducer(bootstrap_servers=h.bootstrap)
        assert producer.send("torn", key=b"x", value=b"y", partition=0).get(timeout=10).offset == 90
        producer.close()
    finally:
        h.stop()
    # garbage after the last whole batch, and a lost index
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00garbage" * 3)
    os.unlink(seg[:-4] + ".index")
    h = broker_mod.start(dir=d, port=0)
    try:
        got = consume_all(h.bootstrap, "torn", [0])[0]
        assert got == [(i, b"k%d" % i, b"v%d" % i) for i in range(90)] + [(90, b"x", b"y")]
        assert os.path.getsize(seg[:-4] + ".index") > 0
    finally:
        h.stop()


def test_corrupt_batch_crc_is_truncated_on_start(tmp_path):
    d = str(tmp_path / "crc")
    h = broker_mod.start(dir=d, port=0)
    try:
        create_topic(h.bootstrap, "crc")
        _produce_batches(h.bootstrap, "crc", 5, 4)
    finally:
        h.stop()
    seg = sorted(glob.glob(os.path.join(d, "logs", "crc-0", "*.log")))[-1]
    size = os.path.getsize(seg)
    with open(seg, "r+b") as f:  # flip a byte in the last record of the last batch
        f.seek(size - 2)
        b = f.read(1)
        f.seek(size - 2)
        f.write(bytes([b[0] ^ 0xFF]))
    h = broker_mod.start(dir=d, port=0)
    try:
        got = consume_all(h.bootstrap, "crc", [0])[0]
        assert got == [(i, b"k%d" % i, b"v%d" % i) for i in range(16)]
    finally:
        h.stop()


def test_topics_configs_and_data_survive_restart(tmp_path):
    d = str(tmp_path / "persist")
    h = broker_mod.start(dir=d, port=0)
    try:
        create_topic(h.bootstrap, "keep", partitions=2, configs={"cleanup.policy": "compact", "retention.ms": "12345"})
        producer = KafkaProducer(bootstrap_servers=h.bootstrap, linger_ms=5)
        for i in range(300):
            producer.send("keep", key=b"%d" % i, value=b"v%d" % i, partition=i % 2)
        producer.flush()
        producer.close()
        admin = KafkaAdminClient(bootstrap_servers=h.bootstrap)
        admin.delete_records({TopicPartition("keep", 1): 50})
        admin.close()
    finally:
        h.stop()
    assert not os.path.exists(os.path.join(d, "broker.json"))
    h = broker_mod.start(dir=d, port=0)
    try:
        admin = KafkaAdminClient(bootstrap_servers=h.bootstrap)
        try:
            assert "keep" in admin.list_topics()
            cfg = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "keep")])["topic"]["keep"]
            assert cfg["cleanup.policy"]["value"] == "compact"
            assert cfg["retention.ms"]["value"] == "12345"
        finally:
            admin.close()
        got = consume_all(h.bootstrap, "keep", [0, 1])
        assert got[0] == [(j, b"%d" % (2 * j), b"v%d" % (2 * j)) for j in range(150)]
        assert got[1] == [(j, b"%d" % (2 * j + 1), b"v%d" % (2 * j + 1)) for j in range(50, 150)]
        producer = KafkaProducer(bootstrap_servers=h.bootstrap)
        assert producer.send("keep", key=b"more", value=b"data", partition=0).get(timeout=10).offset == 150
        producer.close()
        got = consume_all(h.bootstrap, "keep", [0])
        assert got[0][-2:] == [(149, b"298", b"v298"), (150, b"more", b"data")]
    finally:
        h.stop()


def test_second_start_reuses_running_broker(tmp_path):
    d = str(tmp_path / "reuse")
    h = broker_mod.start(dir=d, port=0)
    try:
        h2 = broker_mod.start(dir=d, port=0)
        assert (h2.bootstrap, h2.pid, h2.owned) == (h.bootstrap, h.pid, False)
        h2.stop()  # not owned: a no-op
        assert h.alive
        assert broker_mod.status(d)["bootstrap"] == h.bootstrap
    finally:
        h.stop()
    assert not h.alive
    assert broker_mod.status(d) is None


def test_concurrent_starts_share_one_broker(tmp_path):
    d = str(tmp_path / "race")
    handles, errors = [None, None], []

    def go(i):
        try:
            handles[i] = broker_mod.start(dir=d, port=0)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert errors == []
        assert handles[0].pid == handles[1].pid
        assert sorted(h.owned for h in handles) == [False, True]
    finally:
        for h in handles:
            if h is not None:
                h.stop(force=True)


def test_cleaner_stops_at_the_first_uncleanable_offset(broker):
    """Kafka's rule: records in the active segment, or in a segment younger than
    min.compaction.lag.ms, neither go nor make older values of their key go."""
    create_topic(broker.bootstrap, "uncl", configs={
        "cleanup.policy": "compact", "segment.bytes": "1000", "delete.retention.ms": "0"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    for i in range(60):
        producer.send("uncl", key=b"k%d" % (i % 3), value=b"v%03d" % i, partition=0).get(timeout=10)
    # newer values of k0 and k1 (a tombstone) land in the active segment (the log rolls before it)
    seg_files = lambda: sorted(glob.glob(os.path.join(broker.dir, "logs", "uncl-0", "*.log")))  # noqa: E731
    before = len(seg_files())
    producer.send("uncl", key=b"pad", value=b"x" * 1000, partition=0).get(timeout=10)
    producer.send("uncl", key=b"k0", value=b"new", partition=0).get(timeout=10)
    producer.send("uncl", key=b"k1", value=None, partition=0).get(timeout=10)
    producer.close()
    assert len(seg_files()) > before
    active_base = int(os.path.basename(seg_files()[-1])[:-4])
    assert active_base <= 61  # pad, k0=new and k1=None are all in the active segment
    st = next(s for s in broker_mod.request_clean(broker.dir) if s["topic"] == "uncl")
    assert st["cleaner_runs"] >= 1
    got = consume_all(broker.bootstrap, "uncl", [0])[0]
    closed = [(o, k, v) for o, k, v in got if o < active_base]
    # one record per key below the active segment: the latest there, the active one's did not count
    assert sorted((k, v) for _, k, v in closed if k != b"pad") == [
        (b"k0", b"v057"), (b"k1", b"v058"), (b"k2", b"v059")]
    assert [(k, v) for o, k, v in got if o >= active_base][-2:] == [(b"k0", b"new"), (b"k1", None)]
    assert st["records_removed"] == 57

    # min.compaction.lag.ms: every closed segment is younger than an hour -> nothing is cleanable
    create_topic(broker.bootstrap, "lagged", configs={
        "cleanup.policy": "compact", "segment.bytes": "1000", "min.compaction.lag.ms": "3600000"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    for i in range(60):
        producer.send("lagged", key=b"k%d" % (i % 3), value=b"v%03d" % i, partition=0).get(timeout=10)
    producer.close()
    st = next(s for s in broker_mod.request_clean(broker.dir) if s["topic"] == "lagged")
    assert st["records_removed"] == 0 and st["records"] == 60
    assert len(consume_all(broker.bootstrap, "lagged", [0])[0]) == 60


def test_idle_segments_roll_only_for_retention(broker):
    """segment.ms rolls at the next append, as in Kafka: an idle compacted log keeps its active
    segment (its newest records stay out of the cleaner's reach), while an idle `delete` log whose
    records are all past retention.ms is rolled and emptied (Kafka deletes an expired active segment)."""
    old = int(time.time() * 1000) - 3_600_000
    create_topic(broker.bootstrap, "idle-c", configs={"cleanup.policy": "compact"})
    create_topic(broker.bootstrap, "idle-d", configs={"retention.ms": "60000"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    for i in range(5):
        producer.send("idle-c", key=b"k", value=b"%d" % i, partition=0).get(timeout=10)
        producer.send("idle-d", key=b"k", value=b"%d" % i, partition=0, timestamp_ms=old).get(timeout=10)
    producer.close()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, t, {"segment.ms": "100"})
                             for t in ("idle-c", "idle-d")], incremental=True)
    finally:
        admin.close()
    st = wait_until(lambda: (lambda s: s if s["log_start_offset"] == 5 else None)(_stats(broker, "idle-d")),
                    15, "retention deleting idle-d's old segment")
    assert st["high_watermark"] == 5 and st["records"] == 0, _stats(broker, "idle-d")
    assert consume_all(broker.bootstrap, "idle-d", [0])[0] == []
    time.sleep(1.5)  # well past segment.ms, several retention checks later
    files = glob.glob(os.path.join(broker.dir, "logs", "idle-c-0", "*.log"))
    assert len(files) == 1  # never rolled
    st = next(s for s in broker_mod.request_clean(broker.dir) if s["topic"] == "idle-c")
    assert st["records"] == 5 and st["records_removed"] == 0
