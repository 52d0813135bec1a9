"""The broker with real Kafka clients: kafka-python, confluent-kafka (librdkafka) and kcat."""
from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.protocol.consumer import OffsetSpec

from _broker_util import consume_all, create_topic


def test_kafka_python_produce_consume_exact(shared_broker):
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        admin.create_topics([NewTopic("cl-orders", 3, 1)])
        assert "cl-orders" in admin.list_topics()
    finally:
        admin.close()
    # big batches: linger and a large batch size put hundreds of records in one batch
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, acks="all", linger_ms=50, batch_size=256 * 1024)
    n = 3000
    futures = [producer.send("cl-orders", key=b"k%05d" % i, value=b"value-%d" % i, partition=i % 3) for i in range(n)]
    producer.flush()
    metas = [f.get(timeout=10) for f in futures]
    producer.close()
    for i, m in enumerate(metas):
        assert (m.partition, m.offset) == (i % 3, i // 3)
    consumer = KafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
    tps = [TopicPartition("cl-orders", p) for p in range(3)]
    assert consumer.end_offsets(tps) == {tp: n // 3 for tp in tps}
    assert consumer.beginning_offsets(tps) == {tp: 0 for tp in tps}
    consumer.close()
    got = consume_all(shared_broker.bootstrap, "cl-orders", range(3))
    for p in range(3):
        assert got[p] == [(j, b"k%05d" % (3 * j + p), b"value-%d" % (3 * j + p)) for j in range(n // 3)]


def test_list_offsets_by_timestamp_and_max(shared_broker):
    # the timestamps are years old: with the default retention.ms (7 days) the broker's retention
    # check would roll and delete them while the test runs, as Kafka does
    create_topic(shared_broker.bootstrap, "cl-ts", configs={"retention.ms": "-1"})
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, linger_ms=0)
    base = 1_700_000_000_000
    for i in range(10):
        producer.send("cl-ts", key=b"k", value=b"%d" % i, partition=0, timestamp_ms=base + 1000 * i).get(timeout=10)
    producer.close()
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        tp = TopicPartition("cl-ts", 0)
        res = admin.list_partition_offsets({tp: base + 3500})
        assert res[tp].offset == 4
        res = admin.list_partition_offsets({tp: OffsetSpec.LATEST})
        assert res[tp].offset == 10
        res = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST})
        assert res[tp].offset == 0
        res = admin.list_partition_offsets({tp: OffsetSpec.MAX_TIMESTAMP})
        assert res[tp].offset == 9
        res = admin.list_partition_offsets({tp: base + 100_000})
        assert res[tp].offset == -1
    finally:
        admin.close()


def test_delete_records_moves_log_start(shared_broker):
    create_topic(shared_broker.bootstrap, "cl-dr", partitions=2)
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, linger_ms=5)
    for i in range(100):
        producer.send("cl-dr", key=b"%d" % i, value=b"v%d" % i, partition=i % 2)
    producer.flush()
    producer.close()
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        res = admin.delete_records({TopicPartition("cl-dr", 0): 30})
        assert res[TopicPartition("cl-dr", 0)]["low_watermark"] == 30
    finally:
        admin.close()
    c = KafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
    tps = [TopicPartition("cl-dr", 0), TopicPartition("cl-dr", 1)]
    assert c.beginning_offsets(tps) == {tps[0]: 30, tps[1]: 0}
    assert c.end_offsets(tps) == {tps[0]: 50, tps[1]: 50}
    c.close()
    got = consume_all(shared_broker.bootstrap, "cl-dr", [0])
    assert got[0] == [(j, b"%d" % (2 * j), b"v%d" % (2 * j)) for j in range(30, 50)]


def test_describe_and_incremental_alter_configs(shared_broker):
    create_topic(shared_broker.bootstrap, "cl-cfg", configs={"cleanup.policy": "compact", "segment.bytes": "100000"})
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "cl-cfg")], config_filter="all")
        configs = res["topic"]["cl-cfg"]
        assert configs["cleanup.policy"]["value"] == "compact"
        assert configs["segment.bytes"]["value"] == "100000"
        assert configs["retention.ms"]["value"] == "604800000"
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "cl-cfg",
                                            {"retention.ms": "1000", "segment.bytes": ("DELETE", None)})],
                            incremental=True)
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "cl-cfg")], config_filter="all")["topic"]["cl-cfg"]
        assert configs["retention.ms"]["value"] == "1000"
        assert configs["segment.bytes"]["value"] == "1073741824"
        assert configs["cleanup.policy"]["value"] == "compact"
        bad = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "cl-cfg", {"retention.ms": "soon"})],
                                  incremental=True, raise_on_unknown=False)
        assert "InvalidConfig" in repr(bad["topic"]["cl-cfg"]), bad
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "cl-cfg")], config_filter="all")["topic"]["cl-cfg"]
        assert configs["retention.ms"]["value"] == "1000"
        res = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")], config_filter="all")
        assert res["broker"]["0"]["auto.create.topics.enable"]["value"] == "false"
    finally:
        admin.close()


def test_create_topic_errors(shared_broker):
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        admin.create_topics([NewTopic("cl-dup", 1, 1)])
        res = admin.create_topics([NewTopic("cl-dup", 1, 1)], raise_errors=False)
        assert res["topics"][0]["error_code"] == 36  # TOPIC_ALREADY_EXISTS
        res = admin.create_topics([NewTopic("cl-bad name!", 1, 1)], raise_errors=False)
        assert res["topics"][0]["error_code"] == 17  # INVALID_TOPIC_EXCEPTION
        res = admin.create_topics([NewTopic("cl-rf", 1, 3)], raise_errors=False)
        assert res["topics"][0]["error_code"] == 38  # INVALID_REPLICATION_FACTOR
        res = admin.create_topics([NewTopic("cl-badcfg", 1, 1, topic_configs={"cleanup.policy": "shred"})], raise_errors=False)
        assert res["topics"][0]["error_code"] == 40  # INVALID_CONFIG
        admin.delete_topics(["cl-dup"])
        assert "cl-dup" not in admin.list_topics()
    finally:
        admin.close()


def test_unknown_topic_is_not_auto_created(shared_broker):
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, max_block_ms=1500)
    try:
        with pytest.raises(Exception):
            producer.send("cl-nope", b"x").get(timeout=5)
    finally:
        producer.close(timeout=2)
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        assert "cl-nope" not in admin.list_topics()
    finally:
        admin.close()


def test_kafka_python_idempotent_producer(shared_broker):
    create_topic(shared_broker.bootstrap, "cl-idem", partitions=2)
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, enable_idempotence=True, acks="all", linger_ms=10)
    futures = [producer.send("cl-idem", key=b"%d" % i, value=b"%d" % i, partition=i % 2) for i in range(1000)]
    producer.flush()
    offsets = [f.get(timeout=10).offset for f in futures]
    producer.close()
    assert offsets == [i // 2 for i in range(1000)]
    got = consume_all(shared_broker.bootstrap, "cl-idem", [0, 1])
    assert [k for _, k, _ in got[0]] == [b"%d" % i for i in range(0, 1000, 2)]
    assert [o for o, _, _ in got[1]] == list(range(500))


def test_confluent_kafka_producer_consumer(shared_broker):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin import NewTopic as CNewTopic

    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    for f in admin.create_topics([CNewTopic("cl-rd", num_partitions=2, replication_factor=1)]).values():
        f.result(10)
    producer = ck.Producer({"bootstrap.servers": shared_broker.bootstrap, "enable.idempotence": True, "linger.ms": 20})
    acked = []

    def on_delivery(err, msg):
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.key()))

    n = 4000
    for i in range(n):
        producer.produce("cl-rd", key=b"k%d" % i, value=b"v%d" % i, partition=i % 2, on_delivery=on_delivery)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(20) == 0
    assert sorted(acked) == sorted((i % 2, i // 2, b"k%d" % i) for i in range(n))

    consumer = ck.Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": "rd-test",
                            "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        assert consumer.get_watermark_offsets(ck.TopicPartition("cl-rd", 0), timeout=10) == (0, n // 2)
        consumer.assign([ck.TopicPartition("cl-rd", 0, 0), ck.TopicPartition("cl-rd", 1, 100)])
        got = {0: [], 1: []}
        deadline = time.monotonic() + 20
        while len(got[0]) + len(got[1]) < n - 100 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[msg.partition()].append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    assert got[0] == [(j, b"k%d" % (2 * j), b"v%d" % (2 * j)) for j in range(n // 2)]
    assert got[1] == [(j, b"k%d" % (2 * j + 1), b"v%d" % (2 * j + 1)) for j in range(100, n // 2)]


def test_kcat_metadata_produce_consume(shared_broker):
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    create_topic(shared_broker.bootstrap, "cl-kc", partitions=2)
    meta = subprocess.run([kcat, "-b", shared_broker.bootstrap, "-L", "-t", "cl-kc"], capture_output=True, text=True, timeout=30)
    assert meta.returncode == 0, meta.stderr
    assert 'topic "cl-kc" with 2 partitions' in meta.stdout
    assert "partition 1, leader 0" in meta.stdout
    lines = "".join(f"key{i}:value{i}\n" for i in range(50))
    p = subprocess.run([kcat, "-b", shared_broker.bootstrap, "-P", "-t", "cl-kc", "-p", "1", "-K:"], input=lines,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    c = subprocess.run([kcat, "-b", shared_broker.bootstrap, "-C", "-t", "cl-kc", "-p", "1", "-o", "beginning", "-e",
                        "-f", "%o %k %s\n"], capture_output=True, text=True, timeout=30)
    assert c.returncode == 0, c.stderr
    assert c.stdout.splitlines() == [f"{i} key{i} value{i}" for i in range(50)]
    got = consume_all(shared_broker.bootstrap, "cl-kc", [1])
    assert got[1] == [(i, b"key%d" % i, b"value%d" % i) for i in range(50)]


def test_auto_create_topics_when_enabled(tmp_path):
    from statekit import broker as broker_mod

    h = broker_mod.start(dir=str(tmp_path / "auto"), port=0,
                         configs={"auto.create.topics.enable": "true", "num.partitions": "2"})
    try:
        producer = KafkaProducer(bootstrap_servers=h.bootstrap)
        try:
            assert producer.send("auto-made", key=b"k", value=b"v", partition=1).get(timeout=10).offset == 0
        finally:
            producer.close()
        admin = KafkaAdminClient(bootstrap_servers=h.bootstrap)
        try:
            assert [t["partitions"] for t in admin.describe_topics(["auto-made"])][0].__len__() == 2
        finally:
            admin.close()
    finally:
        h.stop()


def test_admin_cluster_partitions_and_legacy_alter(shared_broker):
    from kafka.admin import NewPartitions

    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        cluster = admin.describe_cluster()
        assert [(b["broker_id"], f"{b['host']}:{b['port']}") for b in cluster["brokers"]] == [(0, shared_broker.bootstrap)]
        assert cluster["controller_id"] == 0
        admin.create_topics([NewTopic("cl-grow", 1, 1, topic_configs={"retention.ms": "5000"})])
        admin.create_partitions({"cl-grow": NewPartitions(3)})
        assert len(admin.describe_topics(["cl-grow"])[0]["partitions"]) == 3
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "cl-grow", {"segment.bytes": "70000"})],
                            incremental=False)
        cfg = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "cl-grow")])["topic"]["cl-grow"]
        assert {k: v["value"] for k, v in cfg.items()} == {"retention.ms": "5000", "segment.bytes": "70000"}
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap)
    assert producer.send("cl-grow", b"x", partition=2).get(timeout=10).offset == 0
    producer.close()


def test_confluent_kafka_consumer_group_subscribe(shared_broker):
    ck = pytest.importorskip("confluent_kafka")
    create_topic(shared_broker.bootstrap, "cl-grp", partitions=3)
    producer = ck.Producer({"bootstrap.servers": shared_broker.bootstrap, "linger.ms": 5})
    for i in range(600):
        producer.produce("cl-grp", key=b"%d" % i, value=b"v%d" % i, partition=i % 3)
    assert producer.flush(20) == 0
    consumer = ck.Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": "cl-grp-g",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False,
                            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    got = []
    try:
        consumer.subscribe(["cl-grp"])
        deadline = time.monotonic() + 30
        while len(got) < 600 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        consumer.commit(asynchronous=False)
        committed = consumer.committed([ck.TopicPartition("cl-grp", p) for p in range(3)], timeout=10)
    finally:
        consumer.close()
    assert sorted(got) == sorted((i % 3, i // 3, b"%d" % i, b"v%d" % i) for i in range(600))
    assert sorted((tp.partition, tp.offset) for tp in committed) == [(0, 200), (1, 200), (2, 200)]
