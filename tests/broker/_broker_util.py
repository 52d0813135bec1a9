"""Helpers for the broker tests: a raw protocol connection and record batch building."""
from __future__ import annotations

import socket
import struct
import time

from kafka.record.default_records import DefaultRecordBatchBuilder


class Raw:
    """One TCP connection speaking kafka.protocol messages, for requests clients never send."""

    def __init__(self, bootstrap: str, timeout: float = 10.0):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
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
        except (ConnectionResetError, BrokenPipeError):
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
