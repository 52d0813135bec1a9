"""Regression tests for the hostile-input findings of issue 13: each failed on the broker before
the fix (resource exhaustion by partition counts, metadata acknowledged before it was durable,
record batches with a valid CRC but bad contents, unbounded buffering of answers and of partial
frames, broker-level settings refused or not enforced, loose topic names, config error wording,
no authentication). The ones about connections (buffering, bad batches, authentication) run at a
TLS listener too: the limits hold behind the decryption."""
from __future__ import annotations

import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from kafka.protocol.admin import (
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
)
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceResponse

from _broker_util import Raw, Reach, build_batch, connect, fetch_request, produce_request
from waiting import wait_until

CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
INVALID_PARTITIONS = 37
INVALID_CONFIG = 40
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58


# ---------------------------------------------------------------------------------------------
# helpers
class Spawned:
    """`python -m statekit.broker` as a child with an optional open-file limit (set in the child,
    so this test process keeps its own)."""

    def __init__(self, d, nofile=None, configs=(), port=0, tls=False):
        self.dir = d
        os.makedirs(d, exist_ok=True)
        cmd = [sys.executable, "-m", "statekit.broker", "--dir", d, "--port", str(port)]
        for c in configs:
            cmd += ["--config", c]
        if tls:
            cmd.append("--tls")
        self.ssl = None

        def limit():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.log = open(os.path.join(d, "test-broker.log"), "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, preexec_fn=limit, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                with open(os.path.join(d, "broker.json")) as f:
                    info = json.load(f)
                if info.get("pid") == self.proc.pid:
                    self.bootstrap = info["bootstrap"]
                    self.port = info["port"]
                    if tls:
                        import ssl

                        self.ssl = ssl.create_default_context(cafile=os.path.join(d, "tls", "ca.pem"))
                    return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                self.log.close()
                with open(os.path.join(d, "test-broker.log")) as f:
                    raise RuntimeError(f"broker exited: {f.read()[-2000:]}")
            assert time.monotonic() < deadline, "broker did not start"
            time.sleep(0.02)  # polling for broker.json (a dead child is reported above)

    def raw(self) -> Raw:
        return Raw(self.bootstrap, ssl_context=self.ssl)

    def stop(self, kill=False):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def peak_rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")


def _create(raw, name, partitions=1, configs=None):
    T = CreateTopicsRequest.CreatableTopic
    resp = raw.call(CreateTopicsRequest(version=7, topics=[T(
        name=name, num_partitions=partitions, replication_factor=1, assignments=[],
        configs=[T.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()])],
        timeout_ms=5000, validate_only=False), CreateTopicsResponse)
    return resp.topics[0]


def _metadata_names(raw):
    resp = raw.call(MetadataRequest(version=9, topics=None, allow_auto_topic_creation=False,
                                    include_topic_authorized_operations=False), MetadataResponse)
    return {t.name: len(t.partitions) for t in resp.topics if t.error_code == 0}


def _produce(raw, topic, batch, partition=0):
    resp = raw.call(produce_request(topic, partition, batch), ProduceResponse)
    p = resp.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def _latest(raw, topic, partition=0):
    T = ListOffsetsRequest.ListOffsetsTopic
    resp = raw.call(ListOffsetsRequest(version=7, replica_id=-1, isolation_level=0, topics=[T(
        name=topic, partitions=[T.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1,
                                                      timestamp=-1)])]), ListOffsetsResponse)
    return resp.topics[0].partitions[0].offset


def _logs(d, prefix):
    return sorted(n for n in os.listdir(os.path.join(d, "logs")) if n.startswith(prefix + "-"))


def _recrc(batch: bytearray) -> bytes:
    from crc32c import crc32c

    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


# ---------------------------------------------------------------------------------------------
# partitions beyond the descriptor limit
def test_partition_counts_beyond_the_open_file_budget_are_refused_whole(tmp_path):
    d = str(tmp_path / "b")
    b = Spawned(d, nofile=512)
    try:
        with Raw(b.bootstrap) as raw:
            assert _create(raw, "ok", 3).error_code == 0
            # CreatePartitions to a huge count: refused, nothing created
            R = CreatePartitionsRequest.CreatePartitionsTopic
            resp = raw.call(CreatePartitionsRequest(version=3, topics=[R(name="ok", count=100_000, assignments=None)],
                                                    timeout_ms=5000, validate_only=False), CreatePartitionsResponse)
            assert resp.results[0].error_code == INVALID_PARTITIONS, resp
            assert "open-file" in resp.results[0].error_message
            # CreateTopics with 10,000 partitions: refused, no directory left
            res = _create(raw, "huge", 10_000)
            assert res.error_code == INVALID_PARTITIONS, res
            assert _logs(d, "huge") == []
            assert _logs(d, "ok") == ["ok-0", "ok-1", "ok-2"]
            assert _metadata_names(raw) == {"ok": 3}
        # the broker still accepts connections and serves them
        conns = [Raw(b.bootstrap) for _ in range(40)]
        try:
            for c in conns:
                assert c.call(ApiVersionsRequest(version=0), ApiVersionsResponse).error_code == 0
        finally:
            for c in conns:
                c.close()
        with Raw(b.bootstrap) as raw:
            assert _create(raw, "more", 10).error_code == 0
            assert _produce(raw, "more", build_batch([(b"k", b"v")]), partition=9) == (0, 0)
    finally:
        b.stop()


# ---------------------------------------------------------------------------------------------
# metadata durable before it takes effect
def test_metadata_changes_that_cannot_be_written_are_refused_and_leave_nothing(tmp_path):
    d = str(tmp_path / "b")
    b = Spawned(d)
    try:
        with Raw(b.bootstrap) as raw:
            assert _create(raw, "kept", 1, {"retention.ms": "1000"}).error_code == 0
            assert _produce(raw, "kept", build_batch([(b"k", b"v")]))[0] == 0
            os.mkdir(os.path.join(d, "topics.json.tmp"))  # every catalogue write now fails
            res = _create(raw, "ghost", 2)
            assert res.error_code == KAFKA_STORAGE_ERROR, res
            assert _metadata_names(raw) == {"kept": 1}
            assert _logs(d, "ghost") == []
            err, _ = _produce(raw, "ghost", build_batch([(b"k", b"v")]))
            assert err != 0  # never acknowledged
            R = CreatePartitionsRequest.CreatePartitionsTopic
            resp = raw.call(CreatePartitionsRequest(version=3, topics=[R(name="kept", count=4, assignments=None)],
                                                    timeout_ms=5000, validate_only=False), CreatePartitionsResponse)
            assert resp.results[0].error_code == KAFKA_STORAGE_ERROR
            assert _metadata_names(raw) == {"kept": 1} and _logs(d, "kept") == ["kept-0"]
            A = IncrementalAlterConfigsRequest.AlterConfigsResource
            resp = raw.call(IncrementalAlterConfigsRequest(version=1, resources=[A(
                resource_type=2, resource_name="kept", configs=[A.AlterableConfig(
                    name="retention.ms", config_operation=0, value="5")])], validate_only=False),
                IncrementalAlterConfigsResponse)
            assert resp.responses[0].error_code == KAFKA_STORAGE_ERROR
            resp = raw.call(DeleteTopicsRequest(version=4, topic_names=["kept"], timeout_ms=5000), DeleteTopicsResponse)
            assert resp.responses[0].error_code == KAFKA_STORAGE_ERROR
            R2 = DescribeConfigsRequest.DescribeConfigsResource
            resp = raw.call(DescribeConfigsRequest(version=4, resources=[R2(
                resource_type=2, resource_name="kept", configuration_keys=["retention.ms"])],
                include_synonyms=False, include_documentation=False), DescribeConfigsResponse)
            assert [c.value for c in resp.results[0].configs] == ["1000"]
    finally:
        b.stop(kill=True)
    os.rmdir(os.path.join(d, "topics.json.tmp"))
    b = Spawned(d)  # what was acknowledged is what a restart finds
    try:
        with Raw(b.bootstrap) as raw:
            assert _metadata_names(raw) == {"kept": 1}
            assert _latest(raw, "kept") == 1
    finally:
        b.stop()


# ---------------------------------------------------------------------------------------------
# record batches with a valid CRC but bad contents
@pytest.fixture(params=["plaintext", "tls"])
def any_broker(request, tmp_path):
    """A fresh broker with a plaintext listener, or a TLS one."""
    from statekit import broker as broker_mod

    handle = broker_mod.start(dir=str(tmp_path / "broker"), port=0, tls=request.param == "tls")
    try:
        yield handle
    finally:
        handle.stop()


def test_batches_with_valid_crc_but_bad_contents_are_refused(any_broker):
    import confluent_kafka as ck

    broker, reach = any_broker, Reach(any_broker)
    with reach.raw() as raw:
        assert _create(raw, "val").error_code == 0
        assert _produce(raw, "val", build_batch([(b"a", b"1"), (b"b", b"2")])) == (0, 0)
        good = bytearray(build_batch([(b"k%d" % i, b"v" * 20) for i in range(3)]))
        # garbage records (the header and CRC are fine)
        bad = bytearray(good)
        bad[61:] = bytes((i * 37 + 11) % 256 for i in range(len(bad) - 61))
        assert _produce(raw, "val", _recrc(bad))[0] == CORRUPT_MESSAGE
        # an unknown compression codec
        bad = bytearray(good)
        struct.pack_into(">h", bad, 21, 5)
        assert _produce(raw, "val", _recrc(bad))[0] == CORRUPT_MESSAGE
        # lastOffsetDelta of 2^31-1 (it used to move the high watermark by two billion)
        bad = bytearray(good)
        struct.pack_into(">i", bad, 23, 2**31 - 1)
        assert _produce(raw, "val", _recrc(bad))[0] == CORRUPT_MESSAGE
        # a record count that disagrees with the records
        bad = bytearray(good)
        struct.pack_into(">i", bad, 57, 5)
        struct.pack_into(">i", bad, 23, 4)
        assert _produce(raw, "val", _recrc(bad))[0] == CORRUPT_MESSAGE
        # a control batch from a client
        bad = bytearray(good)
        struct.pack_into(">h", bad, 21, 0x20)
        assert _produce(raw, "val", _recrc(bad))[0] == CORRUPT_MESSAGE
        assert _latest(raw, "val") == 2
        assert _produce(raw, "val", bytes(good)) == (0, 2)
        assert _latest(raw, "val") == 5
    c = ck.Consumer({**reach.librdkafka(), "group.id": "val", "enable.auto.commit": False})
    got = []
    try:
        c.assign([ck.TopicPartition("val", 0, 0)])
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.offset(), m.key()))
    finally:
        c.close()
    assert got == [(0, b"a"), (1, b"b"), (2, b"k0"), (3, b"k1"), (4, b"k2")]


# ---------------------------------------------------------------------------------------------
# memory: pipelined fetches that are never read, partial giant frames
@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_pipelined_fetches_never_read_do_not_grow_the_broker(tmp_path, tls):
    d = str(tmp_path / "b")
    b = Spawned(d, tls=tls)
    try:
        with b.raw() as raw:
            assert _create(raw, "big").error_code == 0
            for i in range(16):  # 8 MB
                assert _produce(raw, "big", build_batch([(b"k%d" % i, b"x" * (512 << 10))]))[0] == 0
        base = b.peak_rss_mb()
        s = socket.create_connection(("127.0.0.1", b.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        if b.ssl is not None:
            s = b.ssl.wrap_socket(s, server_hostname="127.0.0.1")
        req = fetch_request("big", 0, 0, max_bytes=50 << 20, partition_max_bytes=50 << 20)
        frames = b""
        for corr in range(200):
            req.with_header(correlation_id=corr, client_id="never-reads")
            frames += req.encode(header=True, framed=True)
        s.sendall(frames)
        time.sleep(3)  # the point: the broker reads and answers what it will of a client that never reads
        with b.raw() as raw:  # still serving others
            assert _latest(raw, "big") == 16
        peak = b.peak_rss_mb()
        s.close()
        assert peak - base < 250, f"the broker grew from {base:.0f} MB to {peak:.0f} MB"
    finally:
        b.stop()


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_partial_giant_frames_wait_for_the_request_pool(tmp_path, tls):
    d = str(tmp_path / "b")
    b = Spawned(d, tls=tls)
    socks = []
    try:
        base = b.peak_rss_mb()
        size = 90 << 20
        partial = struct.pack(">i", size) + bytes(size - (1 << 20))  # all but the last MB: never complete

        def send(s):
            try:
                s.sendall(partial)
            except OSError:
                pass  # blocked: the broker does not read this one (the point)

        threads = []
        for _ in range(5):
            s = connect(b.bootstrap, 8, b.ssl)
            socks.append(s)
            t = threading.Thread(target=send, args=(s,))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(30)
        with b.raw() as raw:  # small requests still pass
            assert raw.call(ApiVersionsRequest(version=0), ApiVersionsResponse).error_code == 0
        peak = b.peak_rss_mb()
        assert peak - base < 200, f"the broker grew from {base:.0f} MB to {peak:.0f} MB"
    finally:
        for s in socks:
            s.close()
        b.stop()


# ---------------------------------------------------------------------------------------------
# broker-level settings as topic defaults; message.max.bytes enforced
def test_broker_retention_settings_are_topic_defaults(tmp_path):
    d = str(tmp_path / "b")
    b = Spawned(d, configs=["auto.create.topics.enable=true", "log.retention.ms=-1", "log.segment.bytes=2000",
                            "log.retention.check.interval.ms=50"])
    try:
        old = 1_000_000_000_000  # 2001: far past a week's retention
        with Raw(b.bootstrap) as raw:
            raw.call(MetadataRequest(version=9, topics=[MetadataRequest.MetadataRequestTopic(name="auto")],
                                     allow_auto_topic_creation=True, include_topic_authorized_operations=False),
                     MetadataResponse)
            for i in range(30):
                assert _produce(raw, "auto", build_batch([(b"k%d" % i, b"v" * 200)], timestamp=old))[0] == 0
            R2 = DescribeConfigsRequest.DescribeConfigsResource
            resp = raw.call(DescribeConfigsRequest(version=4, resources=[R2(
                resource_type=2, resource_name="auto", configuration_keys=["retention.ms", "segment.bytes"])],
                include_synonyms=True, include_documentation=False), DescribeConfigsResponse)
            got = {c.name: (c.value, c.config_source, [s.name for s in c.synonyms]) for c in resp.results[0].configs}
            assert got == {"retention.ms": ("-1", 4, ["log.retention.ms"]),
                           "segment.bytes": ("2000", 4, ["log.segment.bytes"])}
            time.sleep(0.5)  # the point: ten retention checks go by and delete nothing
            T = ListOffsetsRequest.ListOffsetsTopic
            resp = raw.call(ListOffsetsRequest(version=7, replica_id=-1, isolation_level=0, topics=[T(
                name="auto", partitions=[T.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                                               timestamp=-2)])]), ListOffsetsResponse)
            assert resp.topics[0].partitions[0].offset == 0  # nothing deleted
            assert _latest(raw, "auto") == 30
    finally:
        b.stop()
    b = Spawned(d, configs=["log.retention.hours=1", "log.retention.check.interval.ms=50"])
    try:
        with Raw(b.bootstrap) as raw:
            T = ListOffsetsRequest.ListOffsetsTopic

            def log_start():
                resp = raw.call(ListOffsetsRequest(version=7, replica_id=-1, isolation_level=0, topics=[T(
                    name="auto", partitions=[T.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                                                   timestamp=-2)])]), ListOffsetsResponse)
                return resp.topics[0].partitions[0].offset

            # now the hour applies: the old closed segments go
            wait_until(lambda: log_start() > 0, 20, "retention deleting the hour-old segments")
    finally:
        b.stop()


def test_message_max_bytes_is_enforced(tmp_path):
    from statekit import broker as broker_mod

    h = broker_mod.start(dir=str(tmp_path / "b"), port=0, configs={"message.max.bytes": "2000"})
    try:
        with Raw(h.bootstrap) as raw:
            assert _create(raw, "small").error_code == 0
            assert _create(raw, "roomy", 1, {"max.message.bytes": "100000"}).error_code == 0
            big = build_batch([(b"k", b"v" * 5000)])
            assert _produce(raw, "small", big)[0] == MESSAGE_TOO_LARGE
            assert _produce(raw, "small", build_batch([(b"k", b"v" * 100)])) == (0, 0)
            assert _produce(raw, "roomy", big) == (0, 0)
            assert _latest(raw, "small") == 1
    finally:
        h.stop()


# ---------------------------------------------------------------------------------------------
# names and messages
def test_topic_names_are_matched_whole_and_config_errors_use_kafkas_words(broker):
    with Raw(broker.bootstrap) as raw:
        res = _create(raw, "trailing\n")
        assert res.error_code == INVALID_TOPIC_EXCEPTION, res
        res = _create(raw, "x\ny")
        assert res.error_code == INVALID_TOPIC_EXCEPTION
        assert _metadata_names(raw) == {}
        res = _create(raw, "cfg", 1, {"retention.hours": "1"})
        assert (res.error_code, res.error_message) == (INVALID_CONFIG, "Unknown topic config name: retention.hours")
        res = _create(raw, "cfg", 1, {"retention.ms": "soon"})
        assert (res.error_code, res.error_message) == (
            INVALID_CONFIG, "Invalid value soon for configuration retention.ms: Not a number of type LONG")
        assert _create(raw, "cfg", 1).error_code == 0
        A = IncrementalAlterConfigsRequest.AlterConfigsResource
        resp = raw.call(IncrementalAlterConfigsRequest(version=1, resources=[A(
            resource_type=2, resource_name="cfg", configs=[A.AlterableConfig(
                name="segment.size", config_operation=0, value="5")])], validate_only=False),
            IncrementalAlterConfigsResponse)
        r = resp.responses[0]
        assert (r.error_code, r.error_message) == (INVALID_CONFIG, "Unknown topic config name: segment.size")


# ---------------------------------------------------------------------------------------------
# authentication on a shared host
@pytest.mark.parametrize("tls", [False, True], ids=["sasl_plaintext", "sasl_ssl"])
def test_an_unauthenticated_client_cannot_delete_topics(tmp_path, tls):
    from statekit import broker as broker_mod
    from statekit.kafka import Kafka

    h = broker_mod.start(dir=str(tmp_path / "b"), port=0, auth=True, tls=tls)
    try:
        k = Kafka(h.bootstrap)  # picks up the generated credentials
        k.ensure_topic("mine", 1)
        with Reach(h).raw() as raw:  # TLS, without SASL
            resp = raw.call(DeleteTopicsRequest(version=4, topic_names=["mine"], timeout_ms=5000),
                            DeleteTopicsResponse)
            assert [r.error_code for r in resp.responses] == [SASL_AUTHENTICATION_FAILED]
            assert raw.closed_by_peer()
        assert k.topics() == {"mine": 1}
        k.close()
    finally:
        h.stop()
