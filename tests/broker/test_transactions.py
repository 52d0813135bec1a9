"""Kafka transactions on the embedded broker with real clients: kafka-python 3.0, confluent-kafka
(librdkafka) and kcat. Commit and abort as read_committed and read_uncommitted consumers see them,
a zombie fenced, the coordinator killed mid-transaction, a transaction timeout, and compaction of
a log with aborted transactions."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError as KPError
from kafka.structs import OffsetAndMetadata

from _broker_util import Raw, create_topic, fetch_request
from waiting import wait_until

ck = pytest.importorskip("confluent_kafka")


def _read(bootstrap, topic, partition, isolation, expect=None, timeout=20.0):
    """[(offset, key, value)] from the log start with a kafka-python consumer."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    tp = TopicPartition(topic, partition)
    try:
        c.assign([tp])
        c.seek_to_beginning(tp)
        end = c.end_offsets([tp])[tp]  # the last stable offset for read_committed
        out = []
        deadline = time.monotonic() + timeout
        while c.position(tp) < end and time.monotonic() < deadline:
            for recs in c.poll(200).values():
                out.extend((r.offset, r.key, r.value) for r in recs)
        return out, end
    finally:
        c.close()


def _lso_and_hw(bootstrap, topic, partition=0):
    from statekit.kafka import Kafka

    k = Kafka(bootstrap)
    try:
        return (k.end_offsets(topic, [partition], isolation="read_committed")[partition],
                k.end_offsets(topic, [partition])[partition])
    finally:
        k.close()


# ---------------------------------------------------------------------------------------------
def test_kafka_python_commit_abort_and_offsets(shared_broker):
    b = shared_broker.bootstrap
    create_topic(b, "tx-kp", partitions=2)
    create_topic(b, "tx-kp-src")
    p = KafkaProducer(bootstrap_servers=b, transactional_id="tx-kp-1", linger_ms=5)
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(6):
            p.send("tx-kp", key=b"c%d" % i, value=b"committed", partition=i % 2)
        p.send_offsets_to_transaction({TopicPartition("tx-kp-src", 0): OffsetAndMetadata(7, "m", -1)}, "tx-kp-g")
        p.flush()
        # open: read_committed stops where the transaction began; read_uncommitted sees it
        assert _lso_and_hw(b, "tx-kp") == (0, 3)
        assert [k for _, k, _ in _read(b, "tx-kp", 0, "read_uncommitted")[0]] == [b"c0", b"c2", b"c4"]
        assert _read(b, "tx-kp", 0, "read_committed") == ([], 0)
        p.commit_transaction()
        p.begin_transaction()
        for i in range(3):
            p.send("tx-kp", key=b"a%d" % i, value=b"aborted", partition=0)
        p.send_offsets_to_transaction({TopicPartition("tx-kp-src", 0): OffsetAndMetadata(99, "", -1)}, "tx-kp-g")
        p.flush()
        p.abort_transaction()
        p.begin_transaction()
        p.send("tx-kp", key=b"last", value=b"x", partition=0)
        p.commit_transaction()
    finally:
        p.close()
    # partition 0: c0 c2 c4 @0-2, commit marker @3, a0-a2 @4-6, abort marker @7, last @8, marker @9
    committed, end = _read(b, "tx-kp", 0, "read_committed")
    assert committed == [(0, b"c0", b"committed"), (1, b"c2", b"committed"), (2, b"c4", b"committed"),
                         (8, b"last", b"x")]
    assert end == 10
    uncommitted, _ = _read(b, "tx-kp", 0, "read_uncommitted")
    assert [(o, k) for o, k, _ in uncommitted] == [(0, b"c0"), (1, b"c2"), (2, b"c4"), (4, b"a0"), (5, b"a1"),
                                                  (6, b"a2"), (8, b"last")]
    assert [k for _, k, _ in _read(b, "tx-kp", 1, "read_committed")[0]] == [b"c1", b"c3", b"c5"]
    c = KafkaConsumer(bootstrap_servers=b, group_id="tx-kp-g")
    try:
        assert c.committed(TopicPartition("tx-kp-src", 0)) == 7  # the aborted 99 never became visible
    finally:
        c.close()


def test_confluent_commit_abort_and_read_committed(shared_broker):
    b = shared_broker.bootstrap
    create_topic(b, "tx-ck", partitions=1)
    p = ck.Producer({"bootstrap.servers": b, "transactional.id": "tx-ck-1", "linger.ms": 5})
    p.init_transactions(20)
    p.begin_transaction()
    for i in range(4):
        p.produce("tx-ck", key=b"c%d" % i, value=b"v%d" % i, partition=0)
    p.commit_transaction(20)
    p.begin_transaction()
    for i in range(2):
        p.produce("tx-ck", key=b"a%d" % i, value=b"no", partition=0)
    p.flush(20)
    p.abort_transaction(20)
    p.begin_transaction()
    p.produce("tx-ck", key=b"open", value=b"pending", partition=0)
    p.flush(20)  # written, not committed

    def consume(isolation, n):
        c = ck.Consumer({"bootstrap.servers": b, "group.id": f"tx-ck-{isolation}", "isolation.level": isolation,
                         "enable.auto.commit": False, "fetch.wait.max.ms": 50})
        out = []
        try:
            c.assign([ck.TopicPartition("tx-ck", 0, 0)])
            deadline = time.monotonic() + 20
            while len(out) < n and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    out.append((m.offset(), m.key()))
            end = c.get_watermark_offsets(ck.TopicPartition("tx-ck", 0), timeout=10)
        finally:
            c.close()
        return out, end

    # offsets: c0-c3 0-3, marker 4, a0 a1 5-6, marker 7, open 8
    got, _ = consume("read_uncommitted", 7)
    assert got == [(0, b"c0"), (1, b"c1"), (2, b"c2"), (3, b"c3"), (5, b"a0"), (6, b"a1"), (8, b"open")]
    got, _ = consume("read_committed", 4)
    assert got == [(0, b"c0"), (1, b"c1"), (2, b"c2"), (3, b"c3")]
    assert _lso_and_hw(b, "tx-ck") == (8, 9)
    p.commit_transaction(20)
    got, _ = consume("read_committed", 5)
    assert got == [(0, b"c0"), (1, b"c1"), (2, b"c2"), (3, b"c3"), (8, b"open")]
    assert _lso_and_hw(b, "tx-ck") == (10, 10)


def test_kcat_read_committed_and_uncommitted(shared_broker):
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    b = shared_broker.bootstrap
    create_topic(b, "tx-kc")
    p = KafkaProducer(bootstrap_servers=b, transactional_id="tx-kc-1")
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send("tx-kc", key=b"k1", value=b"committed", partition=0)
        p.commit_transaction()
        p.begin_transaction()
        p.send("tx-kc", key=b"k2", value=b"aborted", partition=0)
        p.flush()
        p.abort_transaction()
        p.begin_transaction()
        p.send("tx-kc", key=b"k3", value=b"committed", partition=0)
        p.commit_transaction()
    finally:
        p.close()

    def kc(*extra):
        r = subprocess.run([kcat, "-b", b, "-C", "-t", "tx-kc", "-p", "0", "-o", "beginning", "-e",
                            "-f", "%o %k %s\n", *extra], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()

    assert kc("-X", "isolation.level=read_committed") == ["0 k1 committed", "4 k3 committed"]
    assert kc("-X", "isolation.level=read_uncommitted") == ["0 k1 committed", "2 k2 aborted", "4 k3 committed"]


# ---------------------------------------------------------------------------------------------
def test_a_zombie_producer_is_fenced(shared_broker):
    b = shared_broker.bootstrap
    create_topic(b, "tx-z")
    old = KafkaProducer(bootstrap_servers=b, transactional_id="tx-z-1")
    new = None
    try:
        old.init_transactions()
        old.begin_transaction()
        old.send("tx-z", key=b"zombie", value=b"1", partition=0)
        old.flush()
        # a new instance with the same transactional id fences the old one and aborts its transaction
        new = KafkaProducer(bootstrap_servers=b, transactional_id="tx-z-1")
        new.init_transactions()
        with pytest.raises(KPError) as e:
            old.commit_transaction()
        assert "Fenced" in type(e.value).__name__ or "Epoch" in type(e.value).__name__, repr(e.value)
        new.begin_transaction()
        new.send("tx-z", key=b"new", value=b"2", partition=0)
        new.commit_transaction()
    finally:
        old.close(timeout=5)
        if new is not None:
            new.close()
    assert [k for _, k, _ in _read(b, "tx-z", 0, "read_committed")[0]] == [b"new"]
    assert [k for _, k, _ in _read(b, "tx-z", 0, "read_uncommitted")[0]] == [b"zombie", b"new"]

    # librdkafka: the zombie's next transactional call fails fatally
    z = ck.Producer({"bootstrap.servers": b, "transactional.id": "tx-z-ck"})
    z.init_transactions(20)
    z.begin_transaction()
    z.produce("tx-z", key=b"ck-zombie", value=b"3", partition=0)
    z.flush(20)
    n = ck.Producer({"bootstrap.servers": b, "transactional.id": "tx-z-ck"})
    n.init_transactions(20)
    with pytest.raises(ck.KafkaException) as e:
        z.commit_transaction(20)
    assert e.value.args[0].code() in (ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED,
                                      ck.KafkaError.INVALID_PRODUCER_EPOCH), e.value
    assert [k for _, k, _ in _read(b, "tx-z", 0, "read_committed")[0]] == [b"new"]
    # librdkafka's handles end here: the raised exception's traceback keeps this frame alive, and
    # they would otherwise outlive the shared broker, reconnecting to it at the session's end
    del z, n


def test_fencing_at_the_protocol_level(shared_broker):
    """Old epochs get Kafka's answers: PRODUCER_FENCED from EndTxn v2+, INVALID_PRODUCER_EPOCH from
    v0-1 and from Produce."""
    from kafka.protocol.producer import (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, EndTxnRequest,
                                         EndTxnResponse, InitProducerIdRequest, InitProducerIdResponse,
                                         ProduceResponse)

    from _broker_util import build_batch, produce_request

    b = shared_broker.bootstrap
    create_topic(b, "tx-pl")
    with Raw(b) as raw:
        def init():
            r = raw.call(InitProducerIdRequest(version=4, transactional_id="tx-pl-1", transaction_timeout_ms=60000,
                                               producer_id=-1, producer_epoch=-1), InitProducerIdResponse)
            assert r.error_code == 0
            return r.producer_id, r.producer_epoch

        pid, e0 = init()
        pid2, e1 = init()
        assert (pid2, e1) == (pid, e0 + 1)
        T = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        r = raw.call(AddPartitionsToTxnRequest(version=3, v3_and_below_transactional_id="tx-pl-1",
                                               v3_and_below_producer_id=pid, v3_and_below_producer_epoch=e0,
                                               v3_and_below_topics=[T(name="tx-pl", partitions=[0])]),
                     AddPartitionsToTxnResponse)
        assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 90
        for v, code in ((3, 90), (1, 47)):
            r = raw.call(EndTxnRequest(version=v, transactional_id="tx-pl-1", producer_id=pid, producer_epoch=e0,
                                       committed=True), EndTxnResponse)
            assert r.error_code == code
        req = produce_request("tx-pl", 0, build_batch([(b"k", b"v")], producer_id=pid, producer_epoch=e0,
                                                      base_sequence=0))
        req.transactional_id = "tx-pl-1"
        txn = bytearray(req.topic_data[0].partition_data[0].records)
        import struct

        from crc32c import crc32c

        struct.pack_into(">h", txn, 21, 0x10)
        struct.pack_into(">I", txn, 17, crc32c(bytes(txn[21:])))
        req.topic_data[0].partition_data[0].records = bytes(txn)
        r = raw.call(req, ProduceResponse)
        assert r.responses[0].partition_responses[0].error_code == 47
        # the current epoch, but the partition was never added: INVALID_TXN_STATE, nothing written
        struct.pack_into(">h", txn, 51, e1)
        struct.pack_into(">I", txn, 17, crc32c(bytes(txn[21:])))
        req.topic_data[0].partition_data[0].records = bytes(txn)
        r = raw.call(req, ProduceResponse)
        assert r.responses[0].partition_responses[0].error_code == 48
    assert _lso_and_hw(b, "tx-pl") == (0, 0)


# ---------------------------------------------------------------------------------------------
def test_coordinator_killed_mid_transaction(tmp_path):
    """kill -9 with a transaction open: after the restart its records stay invisible to read_committed
    (the last stable offset holds) until its producer's successor aborts it; a transaction whose
    PrepareCommit was recorded before the kill is completed at the restart."""
    from statekit import broker as broker_mod

    d = str(tmp_path / "b")
    h = broker_mod.start(dir=d, port=0)
    port = h.port
    try:
        create_topic(h.bootstrap, "tx-kill", partitions=2)
        p = KafkaProducer(bootstrap_servers=h.bootstrap, transactional_id="tx-kill-1")
        p.init_transactions()
        p.begin_transaction()
        p.send("tx-kill", key=b"before", value=b"1", partition=0)
        p.commit_transaction()
        p.begin_transaction()
        p.send("tx-kill", key=b"open", value=b"2", partition=0)
        p.send("tx-kill", key=b"open", value=b"3", partition=1)
        p.flush()
        q = KafkaProducer(bootstrap_servers=h.bootstrap, transactional_id="tx-kill-2")
        q.init_transactions()
        q.begin_transaction()
        q.send("tx-kill", key=b"decided", value=b"4", partition=1)
        q.flush()
        h.kill()
        p.close(timeout=1)
        q.close(timeout=1)
        # the broker died after recording PrepareCommit of tx-kill-2 (and before its markers)
        with open(os.path.join(d, "transactions.jsonl")) as f:
            last = [json.loads(line) for line in f if '"tx-kill-2"' in line][-1]
        assert last["state"] == "Ongoing" and last["parts"] == [["tx-kill", 1]]
        last.update(state="PrepareCommit")
        with open(os.path.join(d, "transactions.jsonl"), "a") as f:
            f.write(json.dumps(last) + "\n")
        h = broker_mod.start(dir=d, port=port)
        b = h.bootstrap
        assert _lso_and_hw(b, "tx-kill", 0) == (2, 3)  # "open" (offset 2) is still undecided
        assert [k for _, k, _ in _read(b, "tx-kill", 0, "read_committed")[0]] == [b"before"]
        # tx-kill-2 was completed at the restart; tx-kill-1's open records hold partition 1 at offset 0
        assert _lso_and_hw(b, "tx-kill", 1) == (0, 3)
        p2 = KafkaProducer(bootstrap_servers=b, transactional_id="tx-kill-1")
        p2.init_transactions()  # aborts the transaction the crash left open
        p2.close()
        assert _lso_and_hw(b, "tx-kill", 0) == (4, 4)
        assert [k for _, k, _ in _read(b, "tx-kill", 0, "read_committed")[0]] == [b"before"]
        assert [(k, v) for _, k, v in _read(b, "tx-kill", 1, "read_committed")[0]] == [(b"decided", b"4")]
        with open(os.path.join(d, "transactions.jsonl")) as f:
            states = {}
            for line in f:
                rec = json.loads(line)
                states[rec["id"]] = rec["state"]
        assert states == {"tx-kill-1": "Empty", "tx-kill-2": "CompleteCommit"}
    finally:
        h.stop()


def test_transaction_timeout_aborts(shared_broker):
    from statekit.kafka import Kafka, ProducerFenced

    b = shared_broker.bootstrap
    create_topic(b, "tx-to")
    p = KafkaProducer(bootstrap_servers=b, transactional_id="tx-to-1", transaction_timeout_ms=500)
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send("tx-to", key=b"slow", value=b"1", partition=0)
        p.flush()
        assert _lso_and_hw(b, "tx-to") == (0, 1)
        wait_until(lambda: _lso_and_hw(b, "tx-to") == (2, 2), 20,
                   "the timed-out transaction's abort marker")
        with pytest.raises(KPError):
            p.commit_transaction()
    finally:
        p.close(timeout=5)
    assert _read(b, "tx-to", 0, "read_committed")[0] == []
    # statekit's own producer: the same, as ProducerFenced
    k = Kafka(b)
    txp = k.transactional_producer("tx-to-2", timeout_ms=300)
    txp.begin()
    assert txp.send_many([("tx-to", 0, [(b"k", b"v")])]) == [2]
    wait_until(lambda: _lso_and_hw(b, "tx-to") == (4, 4), 20, "the abort marker")
    with pytest.raises(ProducerFenced):
        txp.commit()
    k.close()
    assert _read(b, "tx-to", 0, "read_committed")[0] == []


# ---------------------------------------------------------------------------------------------
def test_compaction_keeps_exactly_the_committed_latest_values(tmp_path):
    from statekit import broker as broker_mod
    from statekit.kafka import Kafka

    h = broker_mod.start(dir=str(tmp_path / "b"), port=0, configs={"log.cleaner.backoff.ms": "100000"})
    try:
        k = Kafka(h.bootstrap)
        k.ensure_topic("tx-cmp", 1, {"cleanup.policy": "compact", "segment.bytes": "2000",
                                     "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "300"})
        txp = k.transactional_producer("tx-cmp-1")
        expected = {}
        for round_ in range(12):
            txp.begin()
            recs = [(b"k%d" % (i % 5), b"r%d-%d" % (round_, i)) for i in range(6)]
            txp.send_many([("tx-cmp", 0, recs)])
            if round_ % 3 == 2:
                txp.abort()  # these values must never reach a reader nor shadow a committed one
            else:
                txp.commit()
                expected.update(recs)
        # an open transaction at the end: past the last stable offset, the cleaner leaves it alone
        txp.begin()
        txp.send_many([("tx-cmp", 0, [(b"k0", b"open")])])
        k.send("tx-cmp", 0, [(b"pad%d" % i, b"x" * 300) for i in range(8)])  # roll segments past it
        assert k.end_offsets("tx-cmp", isolation="read_committed")[0] < k.end_offsets("tx-cmp")[0]
        hw = k.end_offsets("tx-cmp")[0]

        def latest(isolation):
            out = {}
            for chunk in k.read("tx-cmp", 0, 0, hw if isolation == "read_uncommitted" else None,
                                isolation=isolation):
                for _, _, key, value, _ in chunk:
                    out[bytes(key)] = bytes(value)
            return out

        before = latest("read_committed")
        broker_mod.request_clean(h.dir)
        after_committed = latest("read_committed")
        assert after_committed == before
        assert {kk: v for kk, v in after_committed.items() if kk.startswith(b"k")} == expected
        # the open transaction's record is still there, and k0's committed value with it
        assert latest("read_uncommitted")[b"k0"] == b"open"
        assert after_committed[b"k0"] == expected[b"k0"]
        txp.abort()
        k.send("tx-cmp", 0, [(b"pad-end%d" % i, b"x" * 300) for i in range(8)])
        broker_mod.request_clean(h.dir)  # drops the aborted data (and superseded committed data)
        broker_mod.request_clean(h.dir)  # markers whose transactions are now empty get a delete horizon
        time.sleep(0.4)  # the point: time past delete.retention.ms, which no request can shorten
        broker_mod.request_clean(h.dir)  # ... and go
        hw = k.end_offsets("tx-cmp")[0]
        # every record of the log, aborted data included if any were left: exactly one per key, the
        # committed latest value
        final = [(bytes(kk), bytes(v)) for chunk in k.read("tx-cmp", 0, 0, hw) for _, _, kk, v, _ in chunk
                 if bytes(kk).startswith(b"k")]
        assert sorted(final) == sorted(expected.items())
        # markers below the active segment: each one still has data of its transaction before it
        # (since the previous marker); those of emptied transactions are gone
        seg_dir = os.path.join(h.dir, "logs", "tx-cmp-0")
        active_base = max(int(n[:-4]) for n in os.listdir(seg_dir) if n.endswith(".log"))
        with Raw(h.bootstrap) as raw:
            from kafka.protocol.consumer import FetchResponse
            from kafka.record.memory_records import MemoryRecords

            resp = raw.call(fetch_request("tx-cmp", 0, 0, max_bytes=10 << 20, partition_max_bytes=10 << 20),
                            FetchResponse)
            mr = MemoryRecords(bytes(resp.responses[0].partitions[0].records))
        markers = kept_with_data = 0
        data_since_marker = False
        while mr.has_next():
            batch = mr.next_batch()
            n = len(list(batch))
            if batch.is_control_batch:
                if n and batch.base_offset < active_base:
                    markers += 1
                    assert data_since_marker, f"marker at {batch.base_offset} outlived its transaction's data"
                    kept_with_data += 1
                data_since_marker = False
            elif batch.is_transactional and n:
                data_since_marker = True
        assert markers == kept_with_data
        assert markers < 12  # 13 transactions ended; the emptied ones lost their markers
        stats = broker_mod.log_stats(h.dir, "tx-cmp")[0]
        assert stats["records_removed"] > 0 and stats["last_stable_offset"] == stats["high_watermark"]
        k.close()
    finally:
        h.stop()
