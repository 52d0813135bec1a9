"""Embedded broker throughput, against baselines measured in the same run.

    .venv/bin/python bench/broker.py [--records-in N] [--tls-records N] [--client-records N]
                                     [--txn-records N] [--compact-records N]

Starts its own broker (temp dir, port 0), stops it at the end, prints its figures and one line per
measurement (``FIGURE name=... value=... unit=... baseline=... ratio=...``), the last of them, the
compaction, as the summary line ``RESULT name=compact_1m ...``.

* broker_in / broker_out: a raw-socket load generator. One ~1 MB record batch of 100-byte records is
  encoded once (kafka.record); every Produce request re-sends those bytes with only the correlation
  id patched (producer id -1: the broker assigns base offsets, no sequence to refresh), several
  requests in flight over several connections. Fetch requests read the records back; responses are
  not decoded, only the batch headers are walked to find the next offset. Baseline: writing the same
  bytes to a plain file (1 MB os.write calls, no fsync: the broker does not fsync per request either)
  and reading them back (8 MB preads). ratio = broker rate / file rate.
* tls_in / tls_out: the same raw load (N records each way) against a second broker that listens
  with TLS (TLS 1.3, the load generator's sockets wrapped by Python's ssl), alternating with the
  plaintext broker in the same run, best of two of each. ratio = TLS rate / plaintext rate (goal
  >= 0.7). Both brokers and the load generator share the two cores, as they do in a notebook.
* client_produce / client_consume: kafka-python's KafkaProducer and KafkaConsumer through the broker,
  beside kafka-python's own no-network ceiling for the same records. Encode: KafkaProducer.send()
  with the producer's I/O thread stopped, then every accumulated batch closed into wire bytes (the
  client's whole produce path minus the sockets; the bare MemoryRecordsBuilder loop is printed
  too). Decode: MemoryRecords over the same bytes. ratio = client / ceiling.
* txn_produce: statekit.kafka's TransactionalProducer writing N records of 100 bytes, one
  transaction (begin, send_many, commit) per 1,000 records, the way a task commits a micro-batch
  exactly once. Baseline: Kafka.send_many of the same 1,000-record chunks without transactions (the
  at-least-once commit path), in the same run. ratio = transactional rate / plain rate. Checked:
  a read_committed read finds every record.
* compact_1m: compacting N records over 10k keys (value in seconds). Baseline: one pass that reads
  the partition's segment files and decodes every record's key with kafka.record (the work any
  Python cleaner must at least do once). ratio = compaction time / that pass.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import struct
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from kafka.protocol.consumer.fetch import FetchRequest  # noqa: E402
from kafka.protocol.producer import ProduceRequest, ProduceResponse  # noqa: E402
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kafka.record.memory_records import MemoryRecords  # noqa: E402

VALUE_SIZE = 100
PRODUCE_V = 7
FETCH_V = 4
RESULTS: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)


def result(name: str, value: float, unit: str, baseline: float, note: str = "") -> None:
    ratio = value / baseline if baseline else float("nan")
    RESULTS.append(f"RESULT name={name} value={value:.6g} unit={unit} baseline={baseline:.6g} "
                   f"ratio={ratio:.4g}")
    log(f"{name}: {value:.6g} {unit} vs baseline {baseline:.6g} (ratio {ratio:.4g}){'; ' + note if note else ''}")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


BROKER_PID = 0


# ------------------------------------------------------------------------------ raw protocol
class Conn:
    def __init__(self, bootstrap: str, ssl_context=None):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        self.tls = ssl_context is not None
        if self.tls:
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname=host)

    def buffered(self) -> bool:
        """Bytes TLS has decrypted but not handed out yet (invisible to select())."""
        return self.tls and self.sock.pending() > 0

    def send(self, data) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytearray:
        head = self._exact(4)
        (size,) = struct.unpack(">i", head)
        return self._exact(size)

    def _exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ConnectionError("broker closed the connection")
            got += k
        return buf

    def close(self) -> None:
        self.sock.close()


def framed(req, corr: int) -> bytearray:
    req.with_header(correlation_id=corr, client_id="bench")
    return bytearray(req.encode(header=True, framed=True))


def build_batch(n_records: int, value: bytes, keys=None) -> bytearray:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 30)
    ts = int(time.time() * 1000)
    for i in range(n_records):
        b.append(i, timestamp=ts, key=None if keys is None else keys[i], value=value, headers=[])
    return bytearray(b.build())


def records_per_mb(value: bytes) -> int:
    """How many 100-byte records fit in one batch of at most 1,000,000 bytes."""
    probe = build_batch(1000, value)
    per = (len(probe) - 61) / 1000
    return int((1_000_000 - 61) // per)


def produce_frame(topic: str, partition: int, batch) -> bytearray:
    req = ProduceRequest(version=PRODUCE_V, transactional_id=None, acks=-1, timeout_ms=30000,
                         topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[
                             ProduceRequest.TopicProduceData.PartitionProduceData(index=partition,
                                                                                  records=bytes(batch))])])
    return framed(req, 0)


def check_produce_response(frame: bytearray) -> None:
    resp = ProduceResponse.decode(memoryview(frame)[4:], version=PRODUCE_V)
    for t in resp.responses:
        for p in t.partition_responses:
            if p.error_code != 0:
                raise RuntimeError(f"produce to {t.name}-{p.index} failed: error {p.error_code}")


def fetch_frame(topic: str, partition: int, offset: int, max_bytes: int, corr: int) -> bytearray:
    req = FetchRequest(version=FETCH_V, replica_id=-1, max_wait_ms=500, min_bytes=1,
                       max_bytes=max_bytes, isolation_level=0, topics=[
                           FetchRequest.FetchTopic(topic=topic, partitions=[
                               FetchRequest.FetchTopic.FetchPartition(
                                   partition=partition, fetch_offset=offset,
                                   partition_max_bytes=max_bytes)])])
    return framed(req, corr)


def parse_fetch_v4(frame: bytearray):
    """(error, high_watermark, records memoryview) of a one-partition Fetch v4 response, without
    decoding the records."""
    pos = 4 + 4  # correlation id, throttle
    (ntopics,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    assert ntopics == 1, ntopics
    (tlen,) = struct.unpack_from(">h", frame, pos)
    pos += 2 + tlen
    (nparts,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    assert nparts == 1, nparts
    _, err, hw, _lso = struct.unpack_from(">ihqq", frame, pos)
    pos += 4 + 2 + 8 + 8
    (naborted,) = struct.unpack_from(">i", frame, pos)
    pos += 4 + 16 * max(naborted, 0)
    (rlen,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    if rlen < 0:
        rlen = 0
    return err, hw, memoryview(frame)[pos:pos + rlen]


def walk_batches(records) -> tuple[int, int]:
    """(records in whole batches, next offset) from batch headers only."""
    pos, n, nxt = 0, 0, -1
    end = len(records)
    while pos + 61 <= end:
        base, length = struct.unpack_from(">qi", records, pos)
        if pos + 12 + length > end:
            break  # a partial batch at the end of the response
        (last_delta,) = struct.unpack_from(">i", records, pos + 23)
        (count,) = struct.unpack_from(">i", records, pos + 57)
        n += count
        nxt = base + last_delta + 1
        pos += 12 + length
    return n, nxt


# ------------------------------------------------------------------------------ broker_in / out
def file_baseline(tmp: str, batch, count: int) -> tuple[float, float]:
    """Seconds to write `count` copies of the batch to a new file (1 MB os.write calls, no fsync)
    and to read them back (8 MB preads)."""
    path = os.path.join(tmp, "baseline.bin")
    data = bytes(batch)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t0 = time.perf_counter()
    for _ in range(count):
        os.write(fd, data)
    dt_w = time.perf_counter() - t0
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    t0 = time.perf_counter()
    off = 0
    chunk = 8 * len(data)
    while True:
        b = os.pread(fd, chunk, off)
        if not b:
            break
        off += len(b)
    dt_r = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    assert off == count * len(data)
    return dt_w, dt_r


def raw_load(bootstrap: str, admin, topic: str, total_records: int, partitions: int = 4, conns: int = 2,
             inflight: int = 4, ssl_context=None, pid: int = 0, label: str = "broker") -> dict:
    """Produce `total_records` 100-byte records in ~1 MB batches over `conns` connections (TLS
    with `ssl_context`), then fetch them all back; returns rates and what was sent."""
    from kafka.admin import NewTopic

    pid = pid or BROKER_PID
    admin.create_topics([NewTopic(topic, partitions, 1)])
    per_batch, batch, n_batches = raw_plan(total_records, partitions)
    total = n_batches * per_batch
    templates = [produce_frame(topic, p, batch) for p in range(partitions)]

    # -- in
    sockets = [Conn(bootstrap, ssl_context) for _ in range(conns)]
    # warm-up: one batch per partition (not counted; these records are read back below)
    for p in range(partitions):
        sockets[0].send(templates[p])
        check_produce_response(sockets[0].read_frame())
    sent = [0] * conns
    corr = 1
    plan = [(i % partitions) for i in range(n_batches - partitions)]
    per_conn = [plan[c::conns] for c in range(conns)]
    b0 = proc_cpu(pid)
    t0 = time.perf_counter()
    import selectors

    sel = selectors.DefaultSelector()
    for c, s in enumerate(sockets):
        sel.register(s.sock, selectors.EVENT_READ, c)

    def send_next(c: int) -> None:
        nonlocal corr
        frame = templates[per_conn[c][sent[c]]]
        struct.pack_into(">i", frame, 8, corr)  # correlation id: size(4) key(2) version(2) corr
        corr += 1
        sockets[c].send(frame)
        sent[c] += 1

    for c in range(conns):
        while sent[c] < min(inflight, len(per_conn[c])):
            send_next(c)
    remaining = sum(len(x) for x in per_conn)
    while remaining:
        for key, _ in sel.select():
            c = key.data
            while True:  # and the answers TLS has already decrypted: select() cannot see those
                check_produce_response(sockets[c].read_frame())
                remaining -= 1
                if sent[c] < len(per_conn[c]):
                    send_next(c)
                if not sockets[c].buffered():
                    break
    dt_in = time.perf_counter() - t0
    sel.close()
    rate_in = (n_batches - partitions) * per_batch / dt_in
    mb_in = (n_batches - partitions) * len(batch) / dt_in / 1e6
    cpu_in = proc_cpu(pid) - b0
    log(f"{label} in : {rate_in:,.0f} records/s ({mb_in:,.0f} MB/s) in {dt_in:.2f} s, broker CPU {cpu_in:.2f} s")

    # -- out: one fetch in flight per partition, spread over the connections
    max_bytes = 8 * len(batch) + 1024
    end_offset = n_batches // partitions * per_batch
    next_off = [0] * partitions
    got = [0] * partitions
    b0 = proc_cpu(pid)
    t0 = time.perf_counter()
    sel = selectors.DefaultSelector()
    pending: dict[int, list[int]] = {c: [] for c in range(conns)}
    for c, s in enumerate(sockets):
        sel.register(s.sock, selectors.EVENT_READ, c)

    def fetch_next(p: int) -> None:
        nonlocal corr
        c = p % conns
        sockets[c].send(fetch_frame(topic, p, next_off[p], max_bytes, corr))
        corr += 1
        pending[c].append(p)

    for p in range(partitions):
        fetch_next(p)
    active = partitions
    while active:
        for key, _ in sel.select():
            c = key.data
            while True:
                frame = sockets[c].read_frame()
                p = pending[c].pop(0)
                err, _hw, recs = parse_fetch_v4(frame)
                if err:
                    raise RuntimeError(f"fetch {topic}-{p} failed: error {err}")
                n, nxt = walk_batches(recs)
                if n == 0:
                    raise RuntimeError(f"fetch {topic}-{p} at {next_off[p]} returned no whole batch")
                got[p] += n
                next_off[p] = nxt
                if next_off[p] < end_offset:
                    fetch_next(p)
                else:
                    active -= 1
                if not sockets[c].buffered():
                    break
    dt_out = time.perf_counter() - t0
    sel.close()
    total_out = sum(got)
    if total_out != total:
        raise RuntimeError(f"read back {total_out} records, produced {total}")
    rate_out = total_out / dt_out
    log(f"{label} out: {rate_out:,.0f} records/s ({total_out * len(batch) / per_batch / dt_out / 1e6:,.0f} MB/s) "
        f"in {dt_out:.2f} s, every record accounted for, broker CPU {proc_cpu(pid) - b0:.2f} s")
    for s in sockets:
        s.close()
    admin.delete_topics([topic])
    return {"in": rate_in, "out": rate_out, "batch": batch, "batches": n_batches, "per_batch": per_batch,
            "partitions": partitions}


def raw_plan(total_records: int, partitions: int) -> tuple[int, bytearray, int]:
    """(records per batch, the ~1 MB batch, batches in all): the same number of batches in every
    partition, one per partition for the warm-up and at least one per partition measured."""
    value = bytes((i % 94) + 33 for i in range(VALUE_SIZE))
    per_batch = records_per_mb(value)
    batch = build_batch(per_batch, value)
    n_batches = max(2 * partitions, -(-total_records // per_batch))
    n_batches += (-n_batches) % partitions
    return per_batch, batch, n_batches


def bench_raw(bootstrap: str, admin, tmp: str, total_records: int, partitions: int = 4,
              conns: int = 2, inflight: int = 4) -> None:
    per_batch, batch, n_batches = raw_plan(total_records, partitions)
    log(f"raw load: {n_batches} batches x {per_batch} records ({len(batch)} bytes), "
        f"{partitions} partitions, {conns} connections x {inflight} in flight")
    fw1, fr1 = file_baseline(tmp, batch, n_batches - partitions)
    r = raw_load(bootstrap, admin, "bench-raw", total_records, partitions, conns, inflight)
    # -- baseline: the same bytes to and from a plain file (best of a run before and one after)
    fw2, fr2 = file_baseline(tmp, batch, n_batches - partitions)
    base_in = (n_batches - partitions) * per_batch / min(fw1, fw2)
    base_out = (n_batches - partitions) * per_batch / min(fr1, fr2)
    log(f"file      : write {base_in:,.0f} records/s, read {base_out:,.0f} records/s (same bytes)")
    result("broker_in", r["in"], "records/s", base_in, "target >= 500k records/s")
    result("broker_out", r["out"], "records/s", base_out, "target >= 1M records/s")


# ------------------------------------------------------------------------------ TLS
def bench_tls(bootstrap: str, admin, tmp: str, total_records: int, rounds: int = 2) -> None:
    """The raw load against a second broker listening with TLS, alternating with the plaintext
    one in the same run (best of `rounds` each: the host is shared)."""
    import ssl

    from kafka.admin import KafkaAdminClient
    from statekit import broker as broker_mod

    h = broker_mod.start(dir=os.path.join(tmp, "broker-tls"), port=0, tls=True)
    tls_admin = None
    try:
        ca = h.credentials["ssl.ca.location"]
        ctx = ssl.create_default_context(cafile=ca)
        tls_admin = KafkaAdminClient(bootstrap_servers=h.bootstrap, security_protocol="SSL", ssl_cafile=ca)
        log(f"TLS broker pid {h.pid} at {h.bootstrap} ({ssl.OPENSSL_VERSION}); {total_records:,} records each way, "
            f"alternating with plaintext, best of {rounds}")
        best = {"plain": {"in": 0.0, "out": 0.0}, "tls": {"in": 0.0, "out": 0.0}}
        for i in range(rounds):
            for name in ("plain", "tls"):
                if name == "plain":
                    r = raw_load(bootstrap, admin, f"bench-plain-{i}", total_records, label="plaintext")
                else:
                    r = raw_load(h.bootstrap, tls_admin, f"bench-tls-{i}", total_records, ssl_context=ctx,
                                 pid=h.pid, label="TLS      ")
                for d in ("in", "out"):
                    best[name][d] = max(best[name][d], r[d])
        result("tls_in", best["tls"]["in"], "records/s", best["plain"]["in"],
               "produce over TLS; baseline = the same load over plaintext, same run; goal ratio >= 0.7")
        result("tls_out", best["tls"]["out"], "records/s", best["plain"]["out"],
               "consume over TLS; baseline = the same load over plaintext, same run; goal ratio >= 0.7")
    finally:
        if tls_admin is not None:
            tls_admin.close()
        h.stop()


# ------------------------------------------------------------------------------ clients
def bench_clients(bootstrap: str, admin, n: int) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    topic, ceiling_topic = "bench-client", "bench-client-ceiling"
    admin.create_topics([NewTopic(topic, 1, 1), NewTopic(ceiling_topic, 1, 1)])
    value = bytes((i % 94) + 33 for i in range(VALUE_SIZE))
    batch_size = 1 << 20

    # ceilings, no network, best of 3 over (up to) 300k of the same records.
    # encode: the client's own produce path with its I/O thread stopped. KafkaProducer.send() runs
    # as usual (checks, partitioning, size estimate, accumulator, MemoryRecordsBuilder) and each
    # accumulated batch is then closed into its wire bytes; only the sockets are missing. That is
    # the fastest kafka-python can produce, whatever the broker. The bare MemoryRecordsBuilder loop
    # is printed beside it: no client reaches it, because send() costs several times the encoding.
    from kafka.record.memory_records import MemoryRecordsBuilder

    m = min(n, 300_000)
    producer_opts = dict(acks=1, linger_ms=50, batch_size=batch_size, max_request_size=4 << 20,
                         compression_type=None)

    def encode_producer_once():
        p = KafkaProducer(bootstrap_servers=bootstrap, **producer_opts)
        try:
            p.send(ceiling_topic, value=value, partition=0)  # metadata fetched, then offline
            p.flush()
            sender = p._sender
            sender._force_close, sender._running = True, False
            sender.wakeup()
            sender.join()
            t0, c0 = time.perf_counter(), time.process_time()
            send = p.send
            for _ in range(m):
                send(ceiling_topic, value=value, partition=0)
            encoded = 0
            for queue in p._accumulator._batches.values():
                for b in queue:
                    b.records.close()
                    encoded += b.records.next_offset()
                    b.records.buffer()
            dt, dcpu = time.perf_counter() - t0, time.process_time() - c0
            assert encoded == m, (encoded, m)
            return dt, dcpu
        finally:
            p._accumulator.abort_incomplete_batches()
            p.close(timeout=0)

    def encode_raw_once():
        t0 = time.perf_counter()
        b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=batch_size)
        now_ms = time.time
        built = []
        for _ in range(m):
            if b.append(timestamp=int(now_ms() * 1000), key=None, value=value) is None:
                b.close()
                built.append(bytes(b.buffer()))
                b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=batch_size)
                b.append(timestamp=int(now_ms() * 1000), key=None, value=value)
        b.close()
        built.append(bytes(b.buffer()))
        return time.perf_counter() - t0, b"".join(built)

    def decode_once(blob):
        count = 0
        mr = MemoryRecords(blob)
        while mr.has_next():
            for rec in mr.next_batch():
                rec.value  # noqa: B018 - what a consumer touches
                count += 1
        assert count == m
        return count

    enc, enc_cpu, raw, dec, dec_cpu = [], [], [], [], []
    for _ in range(3):
        dt, dcpu = encode_producer_once()
        enc.append(dt)
        enc_cpu.append(dcpu)
        dt, blob = encode_raw_once()
        raw.append(dt)
        t0, c0 = time.perf_counter(), time.process_time()
        decode_once(blob)
        dec.append(time.perf_counter() - t0)
        dec_cpu.append(time.process_time() - c0)
    encode_rate = m / min(enc)
    raw_rate = m / min(raw)
    decode_rate = m / min(dec)
    encode_rate_cpu = m / min(enc_cpu)
    decode_rate_cpu = m / min(dec_cpu)
    log(f"kafka-python ceiling (best of 3 x {m:,} records, no network): KafkaProducer.send() "
        f"path {encode_rate:,.0f} records/s (the bare MemoryRecordsBuilder loop: {raw_rate:,.0f}); "
        f"decode (MemoryRecords) {decode_rate:,.0f} records/s")
    del blob

    producer = KafkaProducer(bootstrap_servers=bootstrap, **producer_opts)
    try:
        b0, c0 = proc_cpu(BROKER_PID), time.process_time()
        t0 = time.perf_counter()
        send = producer.send
        for _ in range(n):
            send(topic, value=value, partition=0)
        t1 = time.perf_counter()
        producer.flush()
        t2 = time.perf_counter()
        produce_rate = n / (t2 - t0)
        b1, c1 = proc_cpu(BROKER_PID), time.process_time()
    finally:
        producer.close()
    log(f"KafkaProducer: {produce_rate:,.0f} records/s (send() loop {t1 - t0:.2f} s, then flush "
        f"{t2 - t1:.2f} s: the time after the last send() is what the broker still owed); CPU: "
        f"client {c1 - c0:.1f} s, broker {b1 - b0:.1f} s; by client CPU time "
        f"{n / (c1 - c0):,.0f} records/s vs encode ceiling {encode_rate_cpu:,.0f} (ratio "
        f"{n / (c1 - c0) / encode_rate_cpu:.2f})")

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_bytes=64 << 20,
                             max_partition_fetch_bytes=16 << 20, max_poll_records=100_000,
                             fetch_max_wait_ms=100)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        b0, c0 = proc_cpu(BROKER_PID), time.process_time()
        t0 = time.perf_counter()
        got = 0
        last = -1
        deadline = time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=1000).values():
                got += len(recs)
                last = recs[-1].offset
        consume_rate = got / (time.perf_counter() - t0)
        b1, c1 = proc_cpu(BROKER_PID), time.process_time()
    finally:
        consumer.close()
    if got != n or last != n - 1:
        raise RuntimeError(f"KafkaConsumer read {got} records (last offset {last}), expected {n}")
    log(f"KafkaConsumer: {consume_rate:,.0f} records/s; CPU: client {c1 - c0:.1f} s, broker "
        f"{b1 - b0:.1f} s; by client CPU time {got / (c1 - c0):,.0f} records/s vs decode ceiling "
        f"{decode_rate_cpu:,.0f} (ratio {got / (c1 - c0) / decode_rate_cpu:.2f})")
    result("client_produce", produce_rate, "records/s", encode_rate,
           "baseline = KafkaProducer.send() path without network; target ratio >= 0.5")
    result("client_consume", consume_rate, "records/s", decode_rate,
           "baseline = kafka-python decode ceiling; target >= 50k records/s")
    admin.delete_topics([topic, ceiling_topic])


# ------------------------------------------------------------------------------ compaction
def bench_compact(bootstrap: str, admin, broker_dir: str, n: int, keys: int = 10_000) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
    from statekit import broker as broker_mod

    try:  # crc32c is a dependency of the broker; kafka.record's pure-Python one is slow
        from crc32c import crc32c
    except ImportError:  # pragma: no cover
        from kafka.record.util import calc_crc32c as crc32c

    topic = "bench-compact"
    rounds = max(1, n // keys)
    total = rounds * keys
    # 8 MB segments for the real run (1M records: 15 of them); a small run still gets several
    # closed segments, since the active one is never cleaned
    seg_bytes = min(8 << 20, max(1 << 16, total * (VALUE_SIZE + 20) // 8))
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={
        "cleanup.policy": "delete", "segment.bytes": str(seg_bytes)})])
    per_batch = keys // 2
    key_list = [b"key-%06d" % k for k in range(keys)]
    marker = b"ROUND=000000|"
    value = marker + bytes(VALUE_SIZE - len(marker))
    templates = [build_batch(per_batch, value, key_list[h * per_batch:(h + 1) * per_batch])
                 for h in range(2)]
    spots = []
    for t in templates:
        pos, found = 0, []
        while True:
            pos = t.find(b"ROUND=", pos)
            if pos < 0:
                break
            found.append(pos + 6)
            pos += 6
        assert len(found) == per_batch
        spots.append(found)
    conn = Conn(bootstrap)
    frames = [produce_frame(topic, 0, t) for t in templates]
    # the batch sits at the end of the Produce frame: patch the values and the CRC there
    t0 = time.perf_counter()
    corr = 1
    inflight = 0
    for r in range(rounds):
        digits = b"%06d" % r
        for h in range(2):
            frame = frames[h]
            start = len(frame) - len(templates[h])
            for s in spots[h]:
                frame[start + s:start + s + 6] = digits
            struct.pack_into(">I", frame, start + 17, crc32c(memoryview(frame)[start + 21:]))
            struct.pack_into(">i", frame, 8, corr)
            corr += 1
            conn.send(frame)
            inflight += 1
            if inflight >= 4:
                check_produce_response(conn.read_frame())
                inflight -= 1
    while inflight:
        check_produce_response(conn.read_frame())
        inflight -= 1
    log(f"compaction input: {total:,} records over {keys:,} keys in {time.perf_counter() - t0:.1f} s")
    conn.close()

    pdir = None
    for cand in glob.glob(os.path.join(broker_dir, "**", f"{topic}-0"), recursive=True):
        if os.path.isdir(cand):
            pdir = cand
    segs = sorted(glob.glob(os.path.join(pdir, "*.log"))) if pdir else []

    # baseline: read the segments and decode every key once
    t0 = time.perf_counter()
    seen = 0
    for path in segs:
        with open(path, "rb") as f:
            mr = MemoryRecords(f.read())
        while mr.has_next():
            batch = mr.next_batch()
            if batch is None:
                break
            for rec in batch:
                rec.key  # noqa: B018
                seen += 1
    base = time.perf_counter() - t0
    t0 = time.perf_counter()
    nbytes = 0
    for path in segs:
        with open(path, "rb") as f:
            nbytes += len(f.read())
    raw_read = time.perf_counter() - t0
    log(f"segments: {len(segs)} files, {nbytes / 1e6:.0f} MB; read once {raw_read:.3f} s; "
        f"read + decode keys once {base:.2f} s ({seen:,} records)")

    deadline = time.monotonic() + 30  # the broker refreshes its stats file every second
    while True:
        before = next(iter(broker_mod.log_stats(broker_dir, topic)), None)
        if (before is not None and before["high_watermark"] == total) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if before is None:
        raise RuntimeError(f"no log stats for {topic} after 30 s")
    log(f"before cleaning: records={before['records']:,} segments={before['segments']} "
        f"bytes={before['bytes']:,} cleaner_runs={before['cleaner_runs']}")
    b0 = proc_cpu(BROKER_PID)
    t0 = time.perf_counter()
    admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs={
        "cleanup.policy": "compact", "segment.bytes": str(seg_bytes)})])
    stats = broker_mod.request_clean(broker_dir, timeout=300)  # returns once a full pass is done
    dt = time.perf_counter() - t0
    log(f"broker CPU during the cleaning: {proc_cpu(BROKER_PID) - b0:.2f} s")
    st = next(p for p in stats if p["topic"] == topic)
    log(f"after cleaning: records={st['records']:,} segments={st['segments']} bytes={st['bytes']:,} "
        f"cleaner_runs={st['cleaner_runs']} records_removed={st['records_removed']:,}")
    if st["records"] >= total:
        raise RuntimeError("the cleaner removed nothing")

    # check: every key survives, with the value of the last round
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100,
                             max_partition_fetch_bytes=16 << 20)
    latest = {}
    count = 0
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = time.monotonic() + 120
        while count < st["records"] and time.monotonic() < end:
            for recs in consumer.poll(timeout_ms=500).values():
                for r in recs:
                    latest[r.key] = r.value[6:12]
                    count += 1
    finally:
        consumer.close()
    want = b"%06d" % (rounds - 1)
    if len(latest) != keys or any(v != want for v in latest.values()):
        raise RuntimeError(f"compaction lost data: {len(latest)} keys, "
                           f"{sum(v != want for v in latest.values())} with an old value")
    log(f"compaction of {total:,} records: {dt:.2f} s, {st['records']:,} records left "
        f"(every key present with its latest value)")
    result("compact_1m", dt, "s", base,
           "baseline = one pass reading the segments and decoding every key (kafka.record); target < 10 s")


# ------------------------------------------------------------------------------ transactions
def bench_txn(bootstrap: str, records: int, per_commit: int = 1000) -> None:
    from statekit.kafka import Kafka

    k = Kafka(bootstrap)
    try:
        k.ensure_topic("bench-txn", 1)
        k.ensure_topic("bench-plain", 1)
        chunk = [(b"k%07d" % i, b"v" * VALUE_SIZE) for i in range(per_commit)]
        commits = max(records // per_commit, 1)
        txp = k.transactional_producer("bench-txn-0", timeout_ms=60000)

        def plain(n):
            for _ in range(n):
                k.send_many([("bench-plain", 0, chunk)])

        def txn(n):
            for _ in range(n):
                txp.begin()
                txp.send_many([("bench-txn", 0, chunk)])
                txp.commit()

        plain(5)
        txn(5)  # warm-up: connections, coordinator, first segment
        best = {"plain": 0.0, "txn": 0.0}
        for _round in range(2):  # alternate, keep the best of each: the host is shared
            for name, fn in (("plain", plain), ("txn", txn)):
                t0 = time.perf_counter()
                fn(commits // 2 or 1)
                rate = (commits // 2 or 1) * per_commit / (time.perf_counter() - t0)
                best[name] = max(best[name], rate)
        txp.close()
        want = (5 + 2 * (commits // 2 or 1)) * per_commit
        got = sum(len(ch) for ch in k.read("bench-txn", 0, isolation="read_committed"))
        if got != want:
            raise RuntimeError(f"read_committed found {got} records, {want} were committed")
        log(f"transactions: {best['txn']:,.0f} records/s ({per_commit / best['txn'] * 1000:.2f} ms per commit of "
            f"{per_commit} records) vs plain send_many {best['plain']:,.0f} records/s "
            f"({per_commit / best['plain'] * 1000:.2f} ms per chunk); {got:,} committed records read back")
        result("txn_produce", best["txn"], "records/s", best["plain"],
               f"one transaction per {per_commit} records; baseline = Kafka.send_many of the same chunks")
    finally:
        k.close()


# ------------------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records-in", type=int, default=3_000_000)
    ap.add_argument("--client-records", type=int, default=1_000_000)
    ap.add_argument("--txn-records", type=int, default=400_000)
    ap.add_argument("--compact-records", type=int, default=1_000_000)
    ap.add_argument("--tls-records", type=int, default=1_000_000)
    ap.add_argument("--only", choices=["raw", "tls", "clients", "txn", "compact"], action="append")
    args = ap.parse_args()
    only = set(args.only or ["raw", "tls", "clients", "txn", "compact"])

    from kafka.admin import KafkaAdminClient
    from statekit import broker as broker_mod

    tmp = tempfile.mkdtemp(prefix="statekit-bench-")
    handle = None
    admin = None
    try:
        handle = broker_mod.start(dir=os.path.join(tmp, "broker"), port=0)
        global BROKER_PID
        BROKER_PID = handle.pid
        log(f"broker pid {handle.pid} at {handle.bootstrap}, data in {handle.dir}; "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
        admin = KafkaAdminClient(bootstrap_servers=handle.bootstrap)
        if "raw" in only:
            bench_raw(handle.bootstrap, admin, tmp, args.records_in)
        if "tls" in only:
            bench_tls(handle.bootstrap, admin, tmp, args.tls_records)
        if "clients" in only:
            bench_clients(handle.bootstrap, admin, args.client_records)
        if "txn" in only:
            bench_txn(handle.bootstrap, args.txn_records)
        if "compact" in only:
            bench_compact(handle.bootstrap, admin, handle.dir, args.compact_records)
    finally:
        if admin is not None:
            admin.close()
        if handle is not None:
            handle.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"load average at the end {os.getloadavg()[0]:.2f} (2 shared cores: figures may be noisy)")
    # one summary line ends the output; the other figures go just above it
    print("\n".join([r.replace("RESULT ", "FIGURE ", 1) for r in RESULTS[:-1]] + RESULTS[-1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
