"""Bad input over raw sockets: at least 10,000 random or mutated frames (truncated frames, bad length
prefixes, unknown API keys and versions, garbage, mutated valid requests), pipelined over several
connections, while a kafka-python producer and consumer do real work on the same broker; then
3,200 of them at a TLS listener (the same guards behind the decryption; every connection the
broker closes costs a new handshake there, so fewer frames keep the run short).

The broker must answer each frame with a response (or an error response), or close only that
connection; the healthy client's results are checked exactly; the broker is alive at the end; and
every acknowledged record is still there. Seeded: a failure reproduces with the same seed."""
from __future__ import annotations

import collections
import os
import random
import re
import socket
import struct
import threading
import time
import warnings

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.protocol.admin.groups import DescribeGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.group import (
    HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, OffsetCommitRequest, OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata import (
    ApiVersionsRequest, ApiVersionsResponse, FindCoordinatorRequest, MetadataRequest,
)
from kafka.protocol.producer import ProduceRequest
from kafka.record.default_records import DefaultRecordBatchBuilder

from _broker_util import Reach

SEED = int(os.environ.get("STATEKIT_FUZZ_SEED", "20261121"))
CONNECTIONS = 8
FRAMES_PER_CONNECTION = {"plaintext": 1300, "tls": 400}  # 8 x 1300 = 10,400 frames; over TLS 3,200
BATCH = 8  # frames pipelined (then a sentinel ApiVersions) before reading the answers
HEALTHY = "healthy"  # never named in a fuzz frame
FUZZ_TOPIC = "fuzz-target-topic"
SENTINEL_BASE = 0x7E000000
READ_DEADLINE_S = 3.0


# ---------------------------------------------------------------------------------------------
# frames
def _records(n: int, rng: random.Random) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i,
                 value=bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))), headers=[])
    return bytes(b.build())


def templates(rng: random.Random) -> list[bytes]:
    """Valid framed requests (correlation id 0, patched later) the broker should answer."""
    reqs = []
    for v in range(0, 4):
        reqs.append(ApiVersionsRequest(version=v, **({"client_software_name": "fuzz",
                                                      "client_software_version": "1"} if v >= 3 else {})))
    for v in (1, 4, 9, 12):
        reqs.append(MetadataRequest(version=v, topics=[MetadataRequest.MetadataRequestTopic(name=FUZZ_TOPIC)],
                                    allow_auto_topic_creation=False))
    reqs.append(MetadataRequest(version=1, topics=None))
    for v in (3, 7, 9, 11):
        reqs.append(ProduceRequest(version=v, transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
            ProduceRequest.TopicProduceData(name=FUZZ_TOPIC, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=_records(3, rng))])]))
    for v in (4, 11, 12):
        reqs.append(FetchRequest(version=v, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 16,
                                 isolation_level=0, topics=[FetchRequest.FetchTopic(topic=FUZZ_TOPIC, partitions=[
                                     FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                                                            partition_max_bytes=1 << 16)])]))
    for v in (1, 5, 8):
        reqs.append(ListOffsetsRequest(version=v, replica_id=-1, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name=FUZZ_TOPIC, partitions=[
                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1)])]))
    for v in (0, 2, 4):
        kw = {"key": "fuzz-group"} if v < 4 else {"coordinator_keys": ["fuzz-group"]}
        reqs.append(FindCoordinatorRequest(version=v, **kw))
    reqs.append(ListGroupsRequest(version=4, states_filter=[]))
    reqs.append(DescribeGroupsRequest(version=5, groups=["fuzz-group", "other"], include_authorized_operations=True))
    reqs.append(OffsetFetchRequest(version=7, group_id="fuzz-group", topics=None, require_stable=False))
    reqs.append(OffsetCommitRequest(version=7, group_id="fuzz-group", generation_id_or_member_epoch=-1,
                                    member_id="", group_instance_id=None, topics=[
        OffsetCommitRequest.OffsetCommitRequestTopic(name=FUZZ_TOPIC, partitions=[
            OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=1, committed_metadata="x")])]))
    reqs.append(HeartbeatRequest(version=4, group_id="fuzz-group", generation_id=3, member_id="m",
                                 group_instance_id=None))
    reqs.append(SyncGroupRequest(version=5, group_id="fuzz-group", generation_id=1, member_id="m",
                                 group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                 assignments=[]))
    reqs.append(LeaveGroupRequest(version=4, group_id="fuzz-group", members=[
        LeaveGroupRequest.MemberIdentity(member_id="m", group_instance_id=None)]))
    # v5+: an empty member id is answered at once with MEMBER_ID_REQUIRED (never parked)
    reqs.append(JoinGroupRequest(version=5, group_id="fuzz-join", session_timeout_ms=10000,
                                 rebalance_timeout_ms=10000, member_id="", group_instance_id=None,
                                 protocol_type="consumer", protocols=[
                                     JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00")]))
    out = []
    for r in reqs:
        r.with_header(correlation_id=0, client_id="fuzzer")
        out.append(bytes(r.encode(header=True, framed=True)))
    return out


def with_corr(frame: bytes, corr: int) -> bytes:
    b = bytearray(frame)
    struct.pack_into(">i", b, 8, corr)
    return bytes(b)


def reframe(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def mutate(frame: bytes, rng: random.Random, keep_header: bool) -> bytes:
    """1-4 random edits of a framed request's payload; the length prefix stays consistent."""
    body = bytearray(frame[4:])
    lo = 12 if keep_header else 0  # api key, version, correlation id (+ client id length)
    for _ in range(rng.randint(1, 4)):
        if len(body) <= lo + 1:
            body += bytes(rng.randrange(256) for _ in range(4))
        op = rng.randrange(7)
        i = rng.randrange(lo, len(body))
        if op == 0:
            body[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            body[i] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        elif op == 2:  # an int32 somewhere becomes extreme (array lengths, sizes)
            if i + 4 <= len(body):
                struct.pack_into(">i", body, i, rng.choice([-1, -2, 0x7FFFFFFF, -0x80000000, 1 << 20]))
        elif op == 3:
            body[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 4:
            del body[i:i + rng.randint(1, 16)]
        elif op == 5:
            del body[i:]  # cut short, and say so in the length prefix
        else:
            j = rng.randrange(lo, len(body))
            body[i:i] = body[j:j + rng.randint(1, 32)]
    if len(body) < 8:
        body += bytes(8 - len(body))
    return reframe(bytes(body))


def unknown_key(rng: random.Random, corr: int) -> bytes:
    key = rng.choice([rng.randint(93, 32767), rng.randint(-32768, -1), 4, 5, 6, 7, 27, 52, 58])
    body = struct.pack(">hhi", key, rng.randint(-5, 40), corr) + struct.pack(">h", 4) + b"fuzz"
    return reframe(body + rng.randbytes(rng.randint(0, 64)))


def unknown_version(rng: random.Random, corr: int, valid: list[bytes]) -> bytes:
    b = bytearray(with_corr(rng.choice(valid), corr))
    struct.pack_into(">h", b, 6, rng.choice([rng.randint(19, 32767), rng.randint(-32768, -1)]))
    return bytes(b)


def garbage(rng: random.Random) -> bytes:
    n = rng.randint(8, 3000)
    return reframe(rng.randbytes(n))


def terminal(rng: random.Random, valid: list[bytes]) -> tuple[str, bytes]:
    """A frame after which the broker cannot go on reading this connection."""
    kind = rng.randrange(3)
    if kind == 0:  # length prefix far beyond socket.request.max.bytes, or negative, or too short
        size = rng.choice([0x7FFFFFFF, 200 << 20, -1, -0x80000000, 0, 3, 7])
        return "bad_length", struct.pack(">i", size) + bytes(rng.randrange(256) for _ in range(16))
    if kind == 1:  # truncated: the prefix promises more than ever arrives
        f = rng.choice(valid)
        return "truncated", f[:rng.randint(1, len(f) - 1)]
    return "bad_length", struct.pack(">i", rng.randint(200 << 20, 0x7FFFFFFF))


# ---------------------------------------------------------------------------------------------
class FuzzConn(threading.Thread):
    def __init__(self, idx: int, reach: Reach, stats: dict, lock: threading.Lock, frames: int):
        super().__init__(name=f"fuzz-{idx}", daemon=True)
        self.idx = idx
        self.reach = reach
        self.frames = frames
        self.rng = random.Random(SEED * 1000 + idx)
        self.valid = templates(random.Random(SEED * 1000 + idx))
        self.stats = stats
        self.lock = lock
        self.error: BaseException | None = None
        self.violations: list[str] = []
        self.parked: list = []  # (api key, version) of frames left unanswered for READ_DEADLINE_S

    def _count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + n

    def _connect(self) -> socket.socket:
        s = self.reach.connect(timeout=READ_DEADLINE_S)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._count("connections")
        return s

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def _new_frame(self, corr: int) -> tuple[str, bytes, int | None]:
        rng = self.rng
        kind = rng.choices(["valid", "unknown_key", "unknown_version", "garbage", "mutated",
                            "mutated_header"], weights=[10, 15, 15, 15, 40, 5])[0]
        if kind == "valid":
            f = with_corr(rng.choice(self.valid), corr)
        elif kind == "unknown_key":
            f = unknown_key(rng, corr)
        elif kind == "unknown_version":
            f = unknown_version(rng, corr, self.valid)
        elif kind == "garbage":
            f = garbage(rng)
        else:
            f = mutate(with_corr(rng.choice(self.valid), corr), rng, keep_header=kind == "mutated")
        return kind, f, (struct.unpack_from(">i", f, 8)[0] if len(f) >= 12 else None)

    def _run(self) -> None:
        """Pipelines BATCH frames, then a sentinel ApiVersions (or, now and then, a frame that
        must end the connection). When the broker closes the connection on a frame, the frames
        after it never reached the parser: they go first into the next batch on a new connection.
        So every counted frame was really read by the broker."""
        from collections import deque

        rng = self.rng
        corr = self.idx << 20
        sentinel = SENTINEL_BASE + (self.idx << 16)
        todo: deque = deque()
        processed = 0
        sock = self._connect()
        while processed < self.frames:
            if rng.random() < 0.08:
                # a frame after which the broker cannot go on reading: it must close this connection
                kind, frame = terminal(rng, self.valid)
                try:
                    sock.sendall(frame)
                    if kind == "truncated":  # end of stream, under TLS too (its TCP FIN)
                        socket.socket.shutdown(sock, socket.SHUT_WR)
                except OSError:
                    pass
                outcome, _ = self._read_answers(sock, [], None)
                if outcome != "closed":
                    self.violations.append(f"{kind} frame {frame[:8].hex()}: {outcome}, not closed")
                self._count(kind)
                self._count("frames")
                processed += 1
                sock.close()
                sock = self._connect()
                continue
            while len(todo) < BATCH:
                corr += 1
                todo.append(self._new_frame(corr))
            batch = [todo.popleft() for _ in range(BATCH)]
            sentinel += 1
            try:
                sock.sendall(b"".join(f for _, f, _ in batch) + with_corr(self.valid[0], sentinel))
            except OSError:
                self._count("send_failed")  # the read below tells how far the broker got
            outcome, matched = self._read_answers(sock, [c for _, _, c in batch], sentinel,
                                                  [f for _, f, _ in batch])
            self._count(outcome)
            if outcome == "answered":
                done = len(batch)
            else:
                # batch[matched + 1] ended the connection (or is parked); later ones were not read
                done = min(matched + 2, len(batch))
                if outcome == "parked" and matched + 1 < len(batch):
                    f = batch[matched + 1][1]
                    self.parked.append(struct.unpack_from(">hh", f, 4) if len(f) >= 8 else None)
                todo.extendleft(reversed(batch[done:]))
            for kind, _, _ in batch[:done]:
                self._count(kind)
            processed += done
            self._count("frames", done)
            if outcome != "answered":
                sock.close()
                sock = self._connect()
        sock.close()

    def _read_answers(self, sock: socket.socket, corrs: list, sentinel: int | None,
                      frames: list | None = None) -> tuple[str, int]:
        """Read responses until the sentinel's (all frames before it were handled), or until the
        broker closes the connection. Responses must come in request order. Returns the outcome
        and the index of the last frame that got a response (-1: none)."""
        pos = 0  # responses must match a subsequence of corrs, in order
        last = -1
        buf = bytearray()
        deadline = time.monotonic() + READ_DEADLINE_S
        while True:
            while len(buf) >= 4:
                (n,) = struct.unpack_from(">i", buf, 0)
                if n < 4:
                    self.violations.append(f"response frame of size {n}")
                    return "bad_response", last
                if len(buf) < 4 + n:
                    break
                (c,) = struct.unpack_from(">i", buf, 4)
                del buf[:4 + n]
                self._count("responses")
                if sentinel is not None and c == sentinel:
                    return "answered", len(corrs) - 1
                while pos < len(corrs) and corrs[pos] != c:
                    pos += 1
                if pos == len(corrs):
                    self.violations.append(f"response with correlation id {c} matches no request in order")
                    return "bad_response", last
                last = pos
                pos += 1
            left = deadline - time.monotonic()
            if left <= 0:
                # a fuzzed Fetch may long-poll (its max_wait_ms mutated); anything else gets a
                # much longer grace (a loaded machine) before it counts as parked
                nxt = frames[last + 1] if frames and last + 1 < len(frames) else b""
                is_fetch = len(nxt) >= 6 and struct.unpack_from(">h", nxt, 4)[0] == 1
                if is_fetch or time.monotonic() - deadline > 20:
                    return "parked", last  # checked by the test: only Fetch may park
                left = 0.5
            sock.settimeout(left)
            try:
                chunk = sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                return "closed", last
            if not chunk:
                return "closed", last
            buf += chunk


# ---------------------------------------------------------------------------------------------
class Healthy(threading.Thread):
    """A producer (acks=all) and a consumer doing real work while the fuzzers run."""

    def __init__(self, reach: Reach, stop: threading.Event):
        super().__init__(name="healthy", daemon=True)
        self.reach = reach
        self.stop_event = stop
        self.acked: dict[tuple[int, int], bytes] = {}
        self.failed: list = []
        self.rounds = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = KafkaProducer(bootstrap_servers=self.reach.bootstrap, acks="all", linger_ms=2,
                                     retries=0, request_timeout_ms=20000, **self.reach.kafka_python())
            try:
                i = 0
                while not self.stop_event.is_set() or self.rounds < 3:
                    futs = []
                    for _ in range(100):
                        value = b"v-%08d" % i
                        futs.append((value, producer.send(HEALTHY, key=b"%d" % (i % 17), value=value,
                                                          partition=i % 2)))
                        i += 1
                    producer.flush(timeout=30)
                    for value, f in futs:
                        try:
                            md = f.get(timeout=30)
                        except Exception as e:  # noqa: BLE001 - counted, asserted empty
                            self.failed.append((value, repr(e)))
                            continue
                        self.acked[(md.partition, md.offset)] = value
                    self.rounds += 1
            finally:
                producer.close()
        except BaseException as e:  # noqa: BLE001
            self.error = e


def consume_all(reach: Reach, expected_count: int, timeout: float = 60) -> dict:
    consumer = KafkaConsumer(bootstrap_servers=reach.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100, **reach.kafka_python())
    got: dict = {}
    try:
        tps = [TopicPartition(HEALTHY, 0), TopicPartition(HEALTHY, 1)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = time.monotonic() + timeout
        while len(got) < expected_count and time.monotonic() < end:
            for tp, recs in consumer.poll(timeout_ms=200).items():
                for r in recs:
                    assert (tp.partition, r.offset) not in got
                    got[(tp.partition, r.offset)] = r.value
        return got
    finally:
        consumer.close()


@pytest.fixture(params=["plaintext", "tls"])
def fuzz_broker(request, tmp_path):
    """A fresh broker for the fuzzers: a plaintext listener, or a TLS one."""
    from statekit import broker as broker_mod

    handle = broker_mod.start(dir=str(tmp_path / "broker"), port=0, tls=request.param == "tls")
    try:
        yield handle
    finally:
        handle.stop()


def test_fuzzed_frames_do_not_hurt_the_broker_or_its_clients(fuzz_broker):
    broker = fuzz_broker
    reach = Reach(broker)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, **reach.kafka_python())
    try:
        admin.create_topics([NewTopic(HEALTHY, 2, 1), NewTopic(FUZZ_TOPIC, 1, 1)])
    finally:
        admin.close()
    stats: dict = {}
    lock = threading.Lock()
    stop = threading.Event()
    healthy = Healthy(reach, stop)
    healthy.start()
    # a consumer reads the healthy topic live while the fuzzers run
    live: dict = {}
    live_error: list = []

    def live_consumer():
        try:
            consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                                     auto_offset_reset="earliest", fetch_max_wait_ms=50, **reach.kafka_python())
            try:
                consumer.assign([TopicPartition(HEALTHY, 0), TopicPartition(HEALTHY, 1)])
                while not stop.is_set() or healthy.is_alive() or len(live) < len(healthy.acked):
                    for tp, recs in consumer.poll(timeout_ms=100).items():
                        for r in recs:
                            live[(tp.partition, r.offset)] = r.value
                    if stop.is_set() and not healthy.is_alive() and time.monotonic() > live_deadline[0]:
                        break
            finally:
                consumer.close()
        except BaseException as e:  # noqa: BLE001
            live_error.append(e)

    live_deadline = [float("inf")]
    live_thread = threading.Thread(target=live_consumer, daemon=True)
    live_thread.start()

    t0 = time.monotonic()
    per_connection = FRAMES_PER_CONNECTION["tls" if broker.tls else "plaintext"]
    fuzzers = [FuzzConn(i, reach, stats, lock, per_connection) for i in range(CONNECTIONS)]
    for f in fuzzers:
        f.start()
    for f in fuzzers:
        f.join(120)
    fuzz_s = time.monotonic() - t0
    stop.set()
    healthy.join(60)
    live_deadline[0] = time.monotonic() + 30
    live_thread.join(60)

    summary = ", ".join(f"{k}={v}" for k, v in sorted(stats.items()))
    print(f"fuzz seed {SEED}: {fuzz_s:.1f} s; {summary}; healthy rounds {healthy.rounds}, "
          f"acked {len(healthy.acked)}; parked (api, version): {[f.parked for f in fuzzers]}")
    for f in fuzzers:
        assert not f.is_alive(), f"{f.name} did not finish"
        assert f.error is None, f"{f.name}: {f.error!r}"
        assert f.violations == [], f"{f.name}: {f.violations[:5]}"
    assert stats["frames"] >= CONNECTIONS * per_connection
    assert stats.get("answered", 0) > 0 and stats.get("closed", 0) > 0
    assert stats.get("bad_length", 0) > 0 and stats.get("truncated", 0) > 0
    # only a fuzzed Fetch may legitimately wait (its max_wait_ms was mutated into a long poll)
    parked = [p for f in fuzzers for p in f.parked]
    assert all(p is not None and p[0] == 1 for p in parked), parked
    # the broker process is alive and still answers a new connection
    os.kill(broker.pid, 0)
    with reach.connect(timeout=10) as s:
        req = ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1")
        req.with_header(correlation_id=4242, client_id="after-fuzz")
        s.sendall(req.encode(header=True, framed=True))
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = s.recv(65536)
            assert chunk, "the broker closed a fresh connection"
            data += chunk
        resp = ApiVersionsResponse.decode(data[4:], version=3, header=True)
        assert resp.header.correlation_id == 4242 and resp.error_code == 0
    # A request that decodes but breaks a handler also ends only its connection (checked above).
    # The group coordinator must never be that handler; crashes elsewhere are reported.
    with open(os.path.join(broker.dir, "broker.log"), errors="replace") as f:
        log_text = f.read()
    crash_sites = collections.Counter(
        site for site in re.findall(r'File "[^"]*/statekit/broker/(\w+\.py)", line (\d+), in (\w+)', log_text)
        if site[0] != "server.py")
    assert not any(site[0] == "groups.py" for site in crash_sites), crash_sites
    handler_crashes = log_text.count("request failed")
    if handler_crashes:
        warnings.warn(f"{handler_crashes} fuzzed requests that decoded made a broker handler raise "
                      f"(the connection was closed): {dict(crash_sites)}")
    # the healthy client's work: everything sent was acked, read live exactly, and is all still there
    assert healthy.error is None, repr(healthy.error)
    assert not live_error, repr(live_error)
    assert healthy.failed == []
    assert healthy.rounds >= 3 and len(healthy.acked) == healthy.rounds * 100
    assert sorted(healthy.acked.values()) == [b"v-%08d" % i for i in range(len(healthy.acked))]
    assert live == healthy.acked
    assert consume_all(reach, len(healthy.acked)) == healthy.acked
