"""Helpers for the broker tests: a raw protocol connection and record batch building."""
from __future__ import annotations

import socket
import ssl
import struct
import time

from kafka.record.default_records import DefaultRecordBatchBuilder


class Reach:
    """How a test reaches a statekit broker: raw sockets (TLS when the broker listens with TLS),
    kafka-python's and librdkafka's security settings, from the broker's generated client settings."""

    def __init__(self, handle):
        self.bootstrap = handle.bootstrap
        self.settings = dict(handle.credentials or {})
        self.ssl = None
        if "ssl.ca.location" in self.settings:
            self.ssl = ssl.create_default_context(cafile=self.settings["ssl.ca.location"])
            if "ssl.certificate.location" in self.settings:
                self.ssl.load_cert_chain(self.settings["ssl.certificate.location"], self.settings["ssl.key.location"])

    def connect(self, timeout: float = 10.0) -> socket.socket:
        return connect(self.bootstrap, timeout, self.ssl)

    def raw(self, timeout: float = 10.0) -> "Raw":
        return Raw(self.bootstrap, timeout, self.ssl)

    def kafka_python(self) -> dict:
        """KafkaProducer/KafkaConsumer/KafkaAdminClient keyword arguments."""
        s = self.settings
        if not s:
            return {}
        out = {"security_protocol": s["security.protocol"]}
        if "sasl.username" in s:
            out.update(sasl_mechanism=s["sasl.mechanism"], sasl_plain_username=s["sasl.username"],
                       sasl_plain_password=s["sasl.password"])
        if "ssl.ca.location" in s:
            out["ssl_cafile"] = s["ssl.ca.location"]
        if "ssl.certificate.location" in s:
            out.update(ssl_certfile=s["ssl.certificate.location"], ssl_keyfile=s["ssl.key.location"])
        return out

    def librdkafka(self) -> dict:
        """confluent-kafka settings (bootstrap.servers included)."""
        out = {"bootstrap.servers": self.bootstrap}
        out.update({("sasl.mechanisms" if k == "sasl.mechanism" else k): v for k, v in self.settings.items()})
        return out


def connect(bootstrap: str, timeout: float = 10.0, ssl_context=None) -> socket.socket:
    """A TCP connection to the broker, TLS over it with `ssl_context`."""
    host, port = bootstrap.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    if ssl_context is not None:
        s = ssl_context.wrap_socket(s, server_hostname=host)
    return s


class Raw:
    """One connection speaking kafka.protocol messages, for requests clients never send (TLS with
    an `ssl_context`)."""

    def __init__(self, bootstrap: str, timeout: float = 10.0, ssl_context=None):
        self.sock = connect(bootstrap, timeout, ssl_context)
        self.corr = 0

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, req):
        self.corr += 1
        req.with_header(correlation_id=self.corr, client_id="statekit-test")
        self.sock.sendall(req.encode(header=True, framed=True))
        return self.corr

    def send_bytes(self, data: bytes):
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        (n,) = struct.unpack(">i", self._recvn(4))
        return self._recvn(n)

    def _recvn(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("connection closed by the broker")
            buf += chunk
        return bytes(buf)

    def call(self, req, resp_cls):
        corr = self.send(req)
        data = self.recv_frame()
        resp = resp_cls[req.API_VERSION].decode(data, header=True)
        assert resp.header.correlation_id == corr
        return resp

    def closed_by_peer(self, wait: float = 5.0) -> bool:
        self.sock.settimeout(wait)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError):
            return True
        except socket.timeout:
            return False


def build_batch(records, base_offset=0, producer_id=-1, producer_epoch=-1, base_sequence=-1, timestamp=None):
    """records: list of (key, value) or (key, value, headers)."""
    b = DefaultRecordBatchBuilder(2, 0, False, producer_id, producer_epoch, base_sequence, 1 << 30)
    ts = timestamp if timestamp is not None else int(time.time() * 1000)
    for i, rec in enumerate(records):
        key, value = rec[0], rec[1]
        headers = rec[2] if len(rec) > 2 else []
        b.append(i, ts, key, value, headers)
    return bytes(b.build())


def produce_request(topic, partition, batch, acks=-1, version=9):
    from kafka.protocol.producer import ProduceRequest

    TD = ProduceRequest.TopicProduceData
    return ProduceRequest(version=version, transactional_id=None, acks=acks, timeout_ms=5000,
                          topic_data=[TD(name=topic, partition_data=[TD.PartitionProduceData(index=partition, records=batch)])])


def fetch_request(topic, partition, offset, max_wait_ms=0, min_bytes=1, max_bytes=50 << 20,
                  partition_max_bytes=10 << 20, version=12):
    from kafka.protocol.consumer import FetchRequest

    FT = FetchRequest.FetchTopic
    return FetchRequest(version=version, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                        max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
                        topics=[FT(topic=topic, partitions=[FT.FetchPartition(
                            partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=partition_max_bytes)])],
                        forgotten_topics_data=[], rack_id="")


def decode_records(data: bytes):
    """[(offset, key, value)] of every record in the batches."""
    from kafka.record.memory_records import MemoryRecords

    out = []
    mr = MemoryRecords(bytes(data))
    while mr.has_next():
        batch = mr.next_batch()
        if batch is None:
            break
        for r in batch:
            out.append((r.offset, r.key, r.value))
    return out


def create_topic(bootstrap, name, partitions=1, configs=None):
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
    finally:
        admin.close()


def consume_all(bootstrap, topic, partitions, timeout=20.0):
    """{partition: [(offset, key, value), ...]} read with assign() from the log start to the end."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = c.end_offsets(tps)
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out = {p: [] for p in partitions}
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for tp, recs in c.poll(500).items():
                out[tp.partition].extend((r.offset, r.key, r.value) for r in recs)
        return out
    finally:
        c.close()
