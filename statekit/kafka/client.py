"""The Kafka client: one small synchronous client over plain sockets (:class:`Kafka`).

Requests are kafka-python's protocol classes (``kafka.protocol``) sent over
:class:`~statekit.kafka.connection.Connection` s; record batches are read and written by
:mod:`statekit.wire`. There are no consumer or producer objects, no background threads and no
per-record objects on the read path:

* ``read()`` is the fast path used by restoration (and the Spark source). It issues Fetch requests
  itself, keeps the next Fetch in flight while it decodes the current response (the next offset is
  known from the batch headers alone), and yields :class:`Chunk` s of ``(offset, timestamp, key,
  value, headers)`` tuples. Offsets may have gaps (compacted logs); a log start offset that moved
  past the requested position (retention, ``DeleteRecords``) is skipped to. With
  ``columns=True`` it yields :class:`ColumnChunk` s instead (:class:`statekit.wire.Columns`:
  parallel lists and header runs, decoded with numpy): what restoration and standbys read.
  ``isolation="read_committed"`` reads up to the last stable offset and drops aborted
  transactions.
* ``send()`` writes with ``acks=all`` and waits for every acknowledgement; ``send_many()`` does
  several sends with every request in flight at once (a task commit: one round trip for all of its
  stores' changelogs), each item's records as tuples or as :class:`~statekit.wire.Columns`
  (encoded column-wise); ``offsets_many()`` gets (log start, end) of several topics in one round
  trip.
* ``send_encoded()`` writes record batches encoded already, every request in flight, acks
  collected later: the data generator's fast produce path.
* ``transactional_producer()`` gives a :class:`~statekit.kafka.transactions.TransactionalProducer`.
* Security for real clusters (SASL PLAIN/SCRAM, TLS) comes from ``kafka_config=`` and
  ``STATEKIT_KAFKA_CONFIG`` (:mod:`statekit.kafka.config`); for statekit's own broker started
  with ``auth=True`` or ``tls=True`` its settings (credentials, CA, client certificate) are found
  from the bootstrap address.

A ``Kafka`` object is not thread-safe: give each thread its own (standby replicas do).
"""
from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from statekit.errors import BrokerUnreachable, StatekitError, UnknownTopic
from statekit.wire import Columns, decode_batch, decode_batch_columns, decode_columns
from statekit.wire.batch import ATTR_CONTROL, split_batches
from statekit.wire.errors import InvalidBatch
from statekit.wire.records import committed_only

from .admin import TopicAdmin
from .config import configured_bootstrap, explicit_bootstrap, load_kafka_config, security_of
from .connection import Connection
from .encode import encode_records
from .errors import HINT as _HINT, RETRIABLE as _RETRIABLE, KafkaBusy, KafkaError, KafkaUnavailable
from .errors import Retry as _Retry
from .errors import raise_for as _raise_for
from .versions import TRANSACTIONS

__all__ = ["Kafka", "Chunk", "ColumnChunk", "PendingSend", "READ_COMMITTED", "READ_UNCOMMITTED"]

READ_UNCOMMITTED, READ_COMMITTED = "read_uncommitted", "read_committed"
_ISOLATION = {READ_UNCOMMITTED: 0, READ_COMMITTED: 1}


def _isolation(isolation: str) -> int:
    try:
        return _ISOLATION[isolation]
    except KeyError:
        raise StatekitError(f"isolation must be {READ_UNCOMMITTED!r} or {READ_COMMITTED!r}, "
                            f"got {isolation!r}") from None


@dataclass
class Chunk:
    """What one Fetch returned for one partition: decoded records plus the log's bounds."""

    records: list  # (offset, timestamp, key, value, headers)
    next_offset: int  # where the next read starts (past compaction gaps and control batches)
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int = -1  # below it every transaction is decided (read_committed stops there)

    def __len__(self):
        return len(self.records)

    def __iter__(self):
        return iter(self.records)


@dataclass
class ColumnChunk:
    """What one Fetch returned, column-wise (``read(..., columns=True)``): the restore path."""

    columns: Columns
    next_offset: int
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int = -1

    def __len__(self):
        return len(self.columns)

    @property
    def records(self) -> list:
        return list(self.columns.tuples())


# a Fetch answer may hold at most this much (the connection's receive limit is 256 MiB)
_MAX_FETCH_BYTES = 128 << 20


class _Patience:
    """Waits out Fetch answers that bring nothing below the end: an empty response, or one that
    holds only part of a batch (a broker that cuts answers at ``max_bytes``: the next ask is
    bigger). A broker may answer a Fetch with nothing (Kafka does while it throttles a client;
    one was seen to answer ``max_wait_ms=0`` so); the next answer brings the records. Only a whole
    client timeout without progress is an error."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.since: float | None = None
        self.delay = 0.002

    def reset(self) -> None:
        self.since = None
        self.delay = 0.002

    def wait(self, where: str, offset: int, end: int | None = None) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.since > self.timeout:
            below = f" below its end {end}" if end is not None and end >= 0 else ""
            raise KafkaError(f"{where} returned no records at offset {offset}{below} for "
                             f"{self.timeout:.0f}s: the broker answers Fetch with nothing there")
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 0.1)


def _scan_batches(data) -> tuple[list, int | None]:
    """A Fetch answer's whole batches (bytes) and the offset after the last one."""
    try:
        return split_batches(data)
    except InvalidBatch as e:
        raise KafkaError(f"the broker returned records statekit cannot read ({e}); statekit needs "
                         f"the v2 message format") from None


class Kafka(TopicAdmin):
    """A small synchronous Kafka client. See the module docstring (admin requests: :class:`TopicAdmin`)."""

    def __init__(self, bootstrap: str | None = None, *, timeout: float = 30.0,
                 client_id: str = "statekit", fetch_max_bytes: int = 8 << 20,
                 kafka_config: dict | str | None = None):
        """``kafka_config``: Kafka client settings over those of ``STATEKIT_KAFKA_CONFIG`` (see
        :func:`load_kafka_config`); without security settings, a statekit broker started with
        ``auth=True`` or ``tls=True`` at this bootstrap address is reached with its generated
        settings (SASL credentials, the CA to trust, the client certificate)."""
        cfg = load_kafka_config(kafka_config)
        # an explicit bootstrap.servers beats the environment's
        self.bootstrap = configured_bootstrap(bootstrap or explicit_bootstrap(kafka_config))
        if not self.bootstrap:
            raise BrokerUnreachable(f"no Kafka to connect to: pass bootstrap=, set STATEKIT_BOOTSTRAP "
                                    f"(or bootstrap.servers in STATEKIT_KAFKA_CONFIG), or {_HINT}")
        if "security.protocol" not in cfg:
            from statekit.broker import credentials_for  # the embedded broker's, when it has auth

            cfg.update(credentials_for(self.bootstrap) or {})
        self._security = security_of(cfg)
        self.timeout = timeout
        self.client_id = cfg.get("client.id") or client_id
        self.fetch_max_bytes = fetch_max_bytes
        self._boot_conn: Connection | None = None
        self._conns: dict[int, Connection] = {}
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._lock = threading.RLock()
        self._any()  # fail fast, one line, when nothing listens

    def _connect(self, host: str, port: int) -> Connection:
        return Connection(host, port, self.timeout, self.client_id, self._security)

    # -- connections ---------------------------------------------------------------------
    def _any(self) -> Connection:
        if self._boot_conn is not None and self._boot_conn.usable():
            return self._boot_conn
        last = None
        for hp in self.bootstrap.split(","):
            hp = hp.strip()
            if not hp:
                continue
            host, _, port = hp.rpartition(":")
            try:
                self._boot_conn = self._connect(host or "127.0.0.1", int(port))
                return self._boot_conn
            except BrokerUnreachable as e:
                last = e
        if last is not None:  # the last address's own reason (refused, closed, not TLS, ...); a
            # configured broker that is away (not a bad address or TLS setting) is worth retrying
            cls = KafkaUnavailable if isinstance(last, KafkaUnavailable) else BrokerUnreachable
            raise cls(str(last)) from None
        raise BrokerUnreachable(f"cannot reach Kafka at {self.bootstrap}: {_HINT}")

    def _node(self, node_id: int) -> Connection:
        c = self._conns.get(node_id)
        if c is not None and c.usable():
            return c
        host, port = self._brokers[node_id]
        boot = self._any()
        if boot.addr == f"{host}:{port}":
            c = boot
        else:
            c = self._connect(host, port)
        self._conns[node_id] = c
        return c

    def _metadata(self, topics: list[str] | None, auto_create: bool = False):
        conn = self._any()
        v = conn.version(MetadataRequest)
        req = MetadataRequest(
            version=v,
            topics=None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=auto_create,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        resp = conn.request(req)
        if not resp.brokers or any(t.error_code == 58 for t in resp.topics):
            if self._security is None or self._security.mechanism is None:
                _raise_for(58, f"metadata from {conn.addr}")
            raise KafkaError(f"the broker at {conn.addr} answered metadata without any broker: check that "
                             f"{self.bootstrap} is a Kafka cluster")
        self._brokers = {b.node_id: (b.host, b.port) for b in resp.brokers}
        for t in resp.topics:
            if t.error_code == 0:
                for p in t.partitions:
                    self._leaders[(t.name, p.partition_index)] = p.leader_id
        return resp

    def _leader(self, topic: str, partition: int) -> Connection:
        key = (topic, partition)
        if key not in self._leaders:
            resp = self._metadata([topic])
            for t in resp.topics:
                if t.name == topic and t.error_code == 3:
                    _raise_for(3, "metadata", topic)
            if key not in self._leaders:
                raise UnknownTopic(f"topic {topic!r} has no partition {partition}: it has "
                                   f"{self._partition_count(resp, topic)} partition(s)")
        leader = self._leaders[key]
        if leader < 0 or leader not in self._brokers:
            self._leaders.pop(key, None)
            raise KafkaBusy(f"{topic}[{partition}] has no leader right now; retry shortly")
        return self._node(leader)

    @staticmethod
    def _partition_count(resp, topic):
        for t in resp.topics:
            if t.name == topic:
                return len(t.partitions)
        return 0

    def _forget(self, topic: str):
        for k in [k for k in self._leaders if k[0] == topic]:
            del self._leaders[k]

    # -- offsets -----------------------------------------------------------------------------
    def _list_offsets(self, topic: str, timestamp: int, partitions=None, isolation_level: int = 0) -> dict[int, int]:
        with self._lock:
            if partitions is None:
                self._forget(topic)
                resp = self._metadata([topic])
                parts = None
                for t in resp.topics:
                    if t.name == topic:
                        if t.error_code == 3:
                            _raise_for(3, "offsets", topic)
                        parts = [p.partition_index for p in t.partitions]
                if parts is None:
                    _raise_for(3, "offsets", topic)
            else:
                parts = list(partitions)
            by_node: dict[int, list[int]] = {}
            for p in parts:
                self._leader(topic, p)
                by_node.setdefault(self._leaders[(topic, p)], []).append(p)
            out = {}
            for node, ps in by_node.items():
                conn = self._node(node)
                v = conn.version(ListOffsetsRequest, 2 if isolation_level else None)
                T = ListOffsetsRequest.ListOffsetsTopic
                req = ListOffsetsRequest(
                    version=v, replica_id=-1, isolation_level=isolation_level,
                    topics=[T(name=topic, partitions=[
                        T.ListOffsetsPartition(partition_index=p, current_leader_epoch=-1,
                                               timestamp=timestamp) for p in ps])])
                resp = conn.request(req)
                for t in resp.topics:
                    for p in t.partitions:
                        if p.error_code in _RETRIABLE:
                            self._forget(topic)
                        _raise_for(p.error_code, f"cannot list offsets of {topic}[{p.partition_index}]", topic)
                        out[p.partition_index] = p.offset
            return dict(sorted(out.items()))

    def end_offsets(self, topic: str, partitions=None, isolation: str = READ_UNCOMMITTED) -> dict[int, int]:
        """``{partition: offset of the next record to be written}`` (the high watermark), or with
        ``isolation="read_committed"`` the last stable offset (the first offset of the oldest open
        transaction, else the high watermark)."""
        return self._list_offsets(topic, -1, partitions, _isolation(isolation))

    def begin_offsets(self, topic: str, partitions=None) -> dict[int, int]:
        """``{partition: log start offset}``."""
        return self._list_offsets(topic, -2, partitions)

    def offsets_many(self, topics: Iterable[str], partition: int,
                     isolation: str = READ_UNCOMMITTED) -> dict[str, tuple[int, int]]:
        """``{topic: (log start offset, end offset)}`` of one partition of several topics, with
        every ListOffsets request in flight at once (one round trip instead of two per topic);
        ``isolation="read_committed"``: the end is the last stable offset."""
        level = _isolation(isolation)
        names = list(dict.fromkeys(topics))
        if not names:
            return {}
        with self._lock:
            for _attempt in range(10):
                by_node: dict[int, list[str]] = {}
                for t in names:
                    self._leader(t, partition)
                    by_node.setdefault(self._leaders[(t, partition)], []).append(t)
                T = ListOffsetsRequest.ListOffsetsTopic
                inflight = []
                for node, ts in by_node.items():
                    conn = self._node(node)
                    v = conn.version(ListOffsetsRequest, 2 if level else None)
                    for stamp in (-2, -1):
                        req = ListOffsetsRequest(
                            version=v, replica_id=-1, isolation_level=level,
                            topics=[T(name=t, partitions=[T.ListOffsetsPartition(
                                partition_index=partition, current_leader_epoch=-1,
                                timestamp=stamp)]) for t in ts])
                        inflight.append((conn, stamp, conn.send(req)))
                found: dict[tuple[str, int], int] = {}
                retry = False
                first_error = None
                for conn, stamp, cid in inflight:
                    resp = conn.recv(cid)
                    for t in resp.topics:
                        for p in t.partitions:
                            if p.error_code in _RETRIABLE:
                                self._forget(t.name)
                                retry = True
                            elif p.error_code:
                                first_error = first_error or (p.error_code, t.name)
                            else:
                                found[(t.name, stamp)] = p.offset
                if first_error:
                    code, t = first_error
                    _raise_for(code, f"cannot list offsets of {t}[{partition}]", t)
                if not retry:
                    return {t: (found[(t, -2)], found[(t, -1)]) for t in names}
                time.sleep(0.05)
            raise KafkaBusy(f"could not list offsets of {', '.join(names)}[{partition}]: the "
                             f"partition kept answering with a retriable error")

    # -- produce -------------------------------------------------------------------------------
    def send(self, topic: str, partition: int, records: Iterable, headers=None,
             batch_bytes: int = 900_000) -> int:
        """Append ``records`` (``(key, value)`` or ``(key, value, headers)`` tuples; ``headers`` a
        list of ``(str, bytes)``, the ``headers`` argument applying to records that carry none; or
        a :class:`~statekit.wire.Columns`) to one partition with acks=all and wait for every
        acknowledgement. Returns the offset of the last record written (-1 when ``records`` is
        empty)."""
        payloads = self._payloads(records, headers, batch_bytes)
        if not payloads:
            return -1
        with self._lock:
            return self._produce_retrying(topic, partition, payloads)

    def send_many(self, items: Iterable, batch_bytes: int = 900_000) -> list[int]:
        """Several :meth:`send` calls at once: ``items`` is ``[(topic, partition, records)]``;
        every Produce request goes out before the first acknowledgement is awaited (one round
        trip instead of one per item). ``records`` is a list of ``(key, value[, headers])``
        tuples or a :class:`~statekit.wire.Columns` (``Columns.of(keys, values, headers=...,
        timestamp=...)``: encoded column-wise with numpy, no Python loop per record, into as many
        batches as ``batch_bytes`` allows). Returns each item's last offset, as :meth:`send`
        does. The order within an item is kept; across items there is no order (a failure may
        leave any subset of the items written, as a crash between sequential sends may)."""
        built = [(t, p, self._payloads(recs, None, batch_bytes)) for t, p, recs in items]
        out = [-1] * len(built)
        with self._lock:
            for topic, partition, payloads in built:  # unknown topics fail before anything is sent
                if payloads:
                    self._leader(topic, partition)
            inflight = []
            for i, (topic, partition, payloads) in enumerate(built):
                if payloads:
                    inflight.append((i, self._produce_send(topic, partition, payloads)))
            redo = []
            first_error = None
            for i, sent in inflight:
                topic, partition, payloads = built[i]
                try:
                    out[i] = self._produce_collect(topic, partition, payloads, sent)
                except _Retry:
                    redo.append(i)
                except KafkaError as e:  # keep collecting: no ack is left behind on the socket
                    first_error = first_error or e
            if first_error is not None:
                raise first_error
            for i in redo:
                topic, partition, payloads = built[i]
                self._forget(topic)
                out[i] = self._produce_retrying(topic, partition, payloads)
        return out

    def send_encoded(self, topic: str, batches: Iterable, *, wait: bool = True):
        """Write record batches encoded already (``[(partition, v2 batch bytes, record count)]``,
        e.g. by :func:`statekit.wire.encode_batches_flat`) with acks=all, every request in flight at once and
        the order within a partition kept. Returns ``{partition: last offset}``; with
        ``wait=False`` a :class:`PendingSend` whose ``wait()`` collects the acks, so the caller
        can encode the next batches meanwhile (the fast produce path of ``statekit.datagen``)."""
        by_part: dict[int, list] = {}
        for partition, data, n in batches:
            by_part.setdefault(int(partition), []).append((data, n))
        with self._lock:
            for partition in by_part:  # an unknown topic fails before anything is sent
                self._leader(topic, partition)
            sent = {p: self._produce_send(topic, p, payloads) for p, payloads in by_part.items()}
        pending = PendingSend(self, topic, by_part, sent)
        return pending.wait() if wait else pending

    @staticmethod
    def _payloads(records, headers, batch_bytes: int, ts: int | None = None) -> list:
        """``[(record batch bytes, record count)]``: v2 batches of at most ~``batch_bytes``."""
        return encode_records(records, batch_bytes, int(time.time() * 1000) if ts is None else ts,
                              headers=headers)

    def _produce_retrying(self, topic, partition, payloads, transactional_id=None) -> int:
        for attempt in range(20):
            try:
                return self._produce(topic, partition, payloads, transactional_id)
            except _Retry:
                self._forget(topic)
                time.sleep(min(0.05 * (attempt + 1), 0.5))
        raise KafkaBusy(f"could not write to {topic}[{partition}]: the partition kept "
                         f"answering with a retriable error")

    def _produce(self, topic, partition, payloads, transactional_id=None) -> int:
        return self._produce_collect(topic, partition, payloads,
                                     self._produce_send(topic, partition, payloads, transactional_id))

    def _produce_send(self, topic, partition, payloads, transactional_id=None) -> tuple:
        conn = self._leader(topic, partition)
        v = conn.version(ProduceRequest)
        T = ProduceRequest.TopicProduceData
        # pipeline: every batch in flight at once, then collect the acks in order
        cids = []
        for data, _n in payloads:
            cids.append(conn.send(ProduceRequest(
                version=v, transactional_id=transactional_id, acks=-1, timeout_ms=int(self.timeout * 1000),
                topic_data=[T(name=topic, partition_data=[
                    T.PartitionProduceData(index=partition, records=data)])])))
        return conn, cids

    def _produce_collect(self, topic, partition, payloads, sent) -> int:
        conn, cids = sent
        last = -1
        retry = False
        first_error = None
        for cid, (data, n) in zip(cids, payloads):
            resp = conn.recv(cid)
            for t in resp.responses:
                for p in t.partition_responses:
                    if p.error_code in _RETRIABLE:
                        retry = True
                    elif p.error_code:
                        first_error = first_error or p.error_code
                    else:
                        last = p.base_offset + n - 1
        if first_error:
            _raise_for(first_error, f"cannot write to {topic}[{partition}]", topic)
        if retry:
            # Only the first batch can be safely retried as a whole; statekit sends one commit's
            # records per call, and a retry after a partial write would duplicate absolute values,
            # which restoration tolerates (values are absolute, markers close groups).
            raise _Retry()
        return last

    # -- fetch -------------------------------------------------------------------------------
    def _fetch_request(self, conn, topic, partition, offset, max_wait_ms, max_bytes, isolation_level=0):
        v = conn.version(FetchRequest)
        T = FetchRequest.FetchTopic
        return FetchRequest(
            version=v, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1,
            max_bytes=max_bytes, isolation_level=isolation_level, session_id=0, session_epoch=-1,
            topics=[T(topic=topic, partitions=[T.FetchPartition(
                partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=max_bytes)])],
            forgotten_topics_data=[], rack_id="")

    @staticmethod
    def _partition_data(resp, topic):
        """The one partition of a Fetch answer; None when the broker answered with none (an
        empty response is no news, waited out by the caller)."""
        for t in resp.responses:
            for p in t.partitions:
                return p
        return None

    def fetch(self, topic: str, partition: int, offset: int, max_wait_ms: int = 0,
              max_bytes: int | None = None, isolation: str = READ_UNCOMMITTED, *,
              columns: bool = False) -> Chunk:
        """One Fetch at ``offset``; waits up to ``max_wait_ms`` for data. Moves past a log start
        offset that overtook ``offset``. ``isolation="read_committed"``: only committed records,
        up to the last stable offset. ``columns``: a :class:`ColumnChunk` instead. An answer with
        nothing below the partition's end (or no partition at all) is asked again, up to the
        client's ``timeout``: an empty chunk means there is nothing at ``offset``."""
        max_bytes = max_bytes or self.fetch_max_bytes
        level = _isolation(isolation)
        with self._lock:
            patience = _Patience(self.timeout)
            for _attempt in range(10):
                while True:  # an answer with nothing below the end is no news: ask again
                    conn = self._leader(topic, partition)
                    cid = conn.send(self._fetch_request(conn, topic, partition, offset, max_wait_ms,
                                                        max_bytes, level))
                    p = self._partition_data(conn.recv(cid), topic)
                    if p is not None and p.error_code:
                        break
                    batches, nxt = _scan_batches(p.records or b"") if p is not None else ([], None)
                    end = None if p is None else p.last_stable_offset if level else p.high_watermark
                    if p is not None and (nxt is not None or end is None or end <= offset):
                        break
                    if p is not None and p.records and max_bytes < _MAX_FETCH_BYTES:
                        max_bytes = min(max_bytes * 2, _MAX_FETCH_BYTES)  # part of a batch only
                    patience.wait(f"{topic}[{partition}]", offset, end)
                if p.error_code == 1:  # OFFSET_OUT_OF_RANGE: the log start moved (or offset > end)
                    lso = self.begin_offsets(topic, [partition])[partition]
                    if offset < lso:
                        offset = lso
                        continue
                    hwm = self.end_offsets(topic, [partition])[partition]
                    if columns:
                        return ColumnChunk(Columns(), max(min(offset, hwm), lso), hwm, lso, hwm)
                    return Chunk([], max(min(offset, hwm), lso), hwm, lso, hwm)
                if p.error_code in _RETRIABLE:
                    self._forget(topic)
                    time.sleep(0.05)
                    continue
                _raise_for(p.error_code, f"cannot read {topic}[{partition}]", topic)
                if level:
                    batches = committed_only(batches, p.aborted_transactions)
                if columns:
                    return ColumnChunk(decode_columns(batches, offset),
                                       nxt if nxt is not None and nxt > offset else offset,
                                       p.high_watermark, p.log_start_offset, p.last_stable_offset)
                out: list = []
                for raw in batches:
                    decode_batch(raw, out, offset)
                return Chunk(out, nxt if nxt is not None and nxt > offset else offset,
                             p.high_watermark, p.log_start_offset, p.last_stable_offset)
            raise KafkaBusy(f"could not read {topic}[{partition}]: no leader")

    def wait_for_data(self, positions: dict, max_wait_ms: int,
                      isolation: str = READ_UNCOMMITTED) -> bool:
        """Block until any of ``positions`` (``{(topic, partition): offset}``) has a record at or
        after its offset, at most ``max_wait_ms``: Kafka's long poll (one Fetch per leader with
        ``min_bytes=1``; the broker answers as soon as data arrives). True when data is there.
        An idle reader polls so without spinning, and wakes at once for a new record."""
        if not positions:
            return False
        level = _isolation(isolation)
        by_leader: dict = {}
        with self._lock:
            for (topic, partition), offset in positions.items():
                conn = self._leader(topic, partition)
                by_leader.setdefault(id(conn), (conn, []))[1].append((topic, partition, offset))
            if len(by_leader) != 1:       # several brokers: ask each in turn, briefly
                max_wait_ms = max(1, max_wait_ms // len(by_leader))
            for conn, parts in by_leader.values():
                v = conn.version(FetchRequest)
                T = FetchRequest.FetchTopic
                topics: dict = {}
                for topic, partition, offset in parts:
                    topics.setdefault(topic, []).append(T.FetchPartition(
                        partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                        last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1))
                req = FetchRequest(
                    version=v, replica_id=-1, max_wait_ms=int(max_wait_ms), min_bytes=1,
                    max_bytes=1, isolation_level=level, session_id=0, session_epoch=-1,
                    topics=[T(topic=t, partitions=ps) for t, ps in topics.items()],
                    forgotten_topics_data=[], rack_id="")
                old = conn.sock.gettimeout()
                conn.sock.settimeout(max(old or 0, max_wait_ms / 1000.0 + self.timeout))
                try:
                    resp = conn.recv(conn.send(req))
                finally:
                    if conn.sock.fileno() >= 0:   # (a failed long poll closed it: its error stands)
                        conn.sock.settimeout(old)
                for t in resp.responses:
                    for p in t.partitions:
                        at = positions.get((t.topic, p.partition_index), 0)
                        end = p.last_stable_offset if level else p.high_watermark
                        if p.records or (p.error_code == 0 and end is not None and end > at):
                            return True
        return False

    def read(self, topic: str, partition: int, start: int | None = None, end: int | None = None,
             *, max_bytes: int | None = None, pipeline: bool = True,
             isolation: str = READ_UNCOMMITTED, columns: bool = False,
             values_kept: bytes | None = None) -> Iterator[Chunk]:
        """Read ``[start, end)`` of one partition as an iterator of :class:`Chunk` (one per Fetch
        response). ``start`` None = the log start; ``end`` None = the end offset when called (the
        last stable offset for read_committed). Offsets may have gaps (compaction, control
        batches, aborted transactions); when the log start is past ``start`` the read begins
        there. Ends early if the log ends before ``end`` (e.g. it was truncated), or, reading
        committed, where an open transaction begins. ``isolation="read_committed"`` drops the
        records of aborted transactions (Kafka's read_committed consumer). ``columns``:
        :class:`ColumnChunk` s instead (no tuple per record; the restore path); with
        ``values_kept`` their values are not cut out (see ``statekit.wire.decode_batch_columns``:
        a count needs only which values are null)."""
        max_bytes = max_bytes or self.fetch_max_bytes
        level = _isolation(isolation)
        with self._lock:
            if start is None or start < 0:
                start = self.begin_offsets(topic, [partition])[partition]
            if end is None:
                end = self.end_offsets(topic, [partition], isolation)[partition]
        pos = start
        if pos >= end:
            return
        state = {"conn": None, "inflight": None}
        try:
            yield from self._read_loop(topic, partition, pos, end, max_bytes, pipeline, state,
                                       level, columns, values_kept)
        finally:
            if state["inflight"] is not None:  # abandoned mid-read: drain the answer nobody wants
                with self._lock:
                    try:
                        state["conn"].recv(state["inflight"])
                    except StatekitError:
                        pass

    def _read_loop(self, topic, partition, pos, end, max_bytes, pipeline, state, level=0,
                   columns=False, values_kept=None):
        patience = _Patience(self.timeout)
        conn = None
        while pos < end:
            with self._lock:
                if state["inflight"] is None:
                    conn = self._leader(topic, partition)
                    state["conn"] = conn
                    state["inflight"] = conn.send(self._fetch_request(conn, topic, partition, pos,
                                                                      0, max_bytes, level))
                conn = state["conn"]
                resp = conn.recv(state["inflight"])
                state["inflight"] = None
                p = self._partition_data(resp, topic)
                if p is None:  # an empty answer below the end: wait it out
                    patience.wait(f"{topic}[{partition}]", pos)
                    continue
                if p.error_code:
                    if p.error_code == 1:  # OFFSET_OUT_OF_RANGE
                        lso = self.begin_offsets(topic, [partition])[partition]
                        hwm = self.end_offsets(topic, [partition])[partition]
                        if pos < lso:
                            pos = lso
                            continue
                        end = min(end, hwm)
                        continue
                    if p.error_code in _RETRIABLE:
                        self._forget(topic)
                        time.sleep(0.05)
                        continue
                    _raise_for(p.error_code, f"cannot read {topic}[{partition}]", topic)
                batches, nxt = _scan_batches(p.records or b"")
                if level:
                    batches = committed_only(batches, p.aborted_transactions)
                hwm = p.high_watermark
                lso = p.log_start_offset
                stable = p.last_stable_offset if level else hwm
                if nxt is None or nxt <= pos:
                    if lso is not None and lso > pos:
                        pos = lso  # the log start moved past us
                        continue
                    if stable <= pos:
                        return  # the log ends (or an open transaction begins) before `end`
                    if nxt is None and p.records and max_bytes < _MAX_FETCH_BYTES:
                        max_bytes = min(max_bytes * 2, _MAX_FETCH_BYTES)  # a short answer: part of a batch
                    # nothing below the end this time (a broker may answer max_wait_ms=0 so): again
                    patience.wait(f"{topic}[{partition}]", pos, hwm)
                    continue
                patience.reset()
                start_pos = pos
                pos = nxt
                if pipeline and pos < end and pos < stable:
                    # the next Fetch goes out before we decode this one: the broker works while we do
                    state["inflight"] = conn.send(self._fetch_request(conn, topic, partition,
                                                                      pos, 0, max_bytes, level))
            if columns:
                yield ColumnChunk(decode_columns(batches, start_pos, end, values_kept), pos, hwm,
                                  lso, p.last_stable_offset)
                continue
            out: list = []
            for raw in batches:
                decode_batch(raw, out, start_pos)
            if out and out[-1][0] >= end:
                out = [r for r in out if r[0] < end]
            yield Chunk(out, pos, hwm, lso, p.last_stable_offset)

    # -- transactions ----------------------------------------------------------------------------
    def supports_transactions(self) -> bool:
        """Does the broker offer Kafka transactions (FindCoordinator, InitProducerId,
        AddPartitionsToTxn, EndTxn, at versions statekit speaks)? False for a broker without them
        (then statekit's output is at-least-once)."""
        with self._lock:
            conn = self._any()
            return all(conn.offers(cls) for cls in TRANSACTIONS)

    def transactional_producer(self, transactional_id: str, timeout_ms: int = 60000) -> "TransactionalProducer":
        """A :class:`TransactionalProducer` for ``transactional_id`` (InitProducerId: an older
        producer with the same id is fenced and its open transaction aborted)."""
        from .transactions import TransactionalProducer  # it drives this client: a cycle otherwise

        return TransactionalProducer(self, transactional_id, timeout_ms)

    def _coordinator(self, key: str, key_type: int) -> Connection:
        """The connection to the coordinator of a group (0) or transactional id (1)."""
        conn = self._any()
        v = conn.version(FindCoordinatorRequest)
        for _attempt in range(50):
            if v >= 4:
                resp = conn.request(FindCoordinatorRequest(version=v, key_type=key_type, coordinator_keys=[key]))
                c = resp.coordinators[0]
                code, node, host, port = c.error_code, c.node_id, c.host, c.port
            else:
                resp = conn.request(FindCoordinatorRequest(version=v, key=key, key_type=key_type))
                code, node, host, port = resp.error_code, resp.node_id, resp.host, resp.port
            if code in (14, 15):  # loading, not available: retry
                time.sleep(0.05)
                continue
            if code == 53:
                raise KafkaError(f"the broker at {conn.addr} denies transactional id {key!r} "
                                 f"(TRANSACTIONAL_ID_AUTHORIZATION_FAILED): check its ACLs")
            _raise_for(code, f"cannot find the coordinator of {key!r}")
            self._brokers.setdefault(node, (host, port))
            return self._node(node)
        raise KafkaBusy(f"no coordinator for {key!r}: the broker kept answering COORDINATOR_NOT_AVAILABLE")

    def count_records(self, topic: str, partition: int, start: int, end: int,
                      max_bytes: int = 4 << 20) -> int:
        """How many records ``[start, end)`` of one partition holds (fewer than ``end - start``
        where compaction removed some), from the record batch headers: only a batch that crosses
        ``start`` or ``end`` is decoded. Costs a read of the bytes, not of the records."""
        n = 0
        patience = _Patience(self.timeout)
        with self._lock:
            lso = self.begin_offsets(topic, [partition])[partition]
            pos = max(start, lso)
            while pos < end:
                conn = self._leader(topic, partition)
                p = self._partition_data(conn.recv(conn.send(self._fetch_request(
                    conn, topic, partition, pos, 0, max_bytes))), topic)
                if p is None:
                    patience.wait(f"{topic}[{partition}]", pos)
                    continue
                if p.error_code == 1:  # OFFSET_OUT_OF_RANGE: the log start moved past pos
                    lso = self.begin_offsets(topic, [partition])[partition]
                    if pos < lso:
                        pos = lso
                        continue
                    break
                _raise_for(p.error_code, f"cannot read {topic}[{partition}]", topic)
                batches, nxt = _scan_batches(p.records or b"")
                if nxt is None or nxt <= pos:
                    if p.high_watermark <= pos:
                        break  # the log ends before `end`
                    if nxt is None and p.records and max_bytes < _MAX_FETCH_BYTES:
                        max_bytes = min(max_bytes * 2, _MAX_FETCH_BYTES)
                    patience.wait(f"{topic}[{partition}]", pos, p.high_watermark)
                    continue
                patience.reset()
                for raw in batches:
                    base, = struct.unpack_from(">q", raw, 0)
                    last = base + struct.unpack_from(">i", raw, 23)[0]
                    count = struct.unpack_from(">i", raw, 57)[0]
                    if base >= pos and last < end:
                        if not raw[22] & ATTR_CONTROL:
                            n += count
                    else:
                        cols = decode_batch_columns(raw, pos)
                        if cols is not None:
                            n += sum(1 for o in cols.offsets if o < end)
                pos = nxt
        return n

    def interrupt(self) -> None:
        """End a request in flight on another thread now (it fails as a closed connection; the
        client reconnects at its next request). Takes no lock, which that request holds: a
        reader stopping need not wait out its long poll."""
        for c in list(self._conns.values()) + [self._boot_conn]:
            if c is not None:
                c.shutdown()

    def close(self) -> None:
        with self._lock:
            for c in set(self._conns.values()) | ({self._boot_conn} if self._boot_conn else set()):
                c.close()
            self._conns.clear()
            self._boot_conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PendingSend:
    """Produce requests in flight (:meth:`Kafka.send_encoded` with ``wait=False``)."""

    def __init__(self, kafka: Kafka, topic: str, by_part: dict, sent: dict):
        self._kafka = kafka
        self.topic = topic
        self._by_part = by_part
        self._sent = sent
        self.records = sum(n for payloads in by_part.values() for _d, n in payloads)
        self._result: dict | None = None

    def wait(self) -> dict:
        """Collect every acknowledgement; ``{partition: last offset}``."""
        if self._result is not None:
            return self._result
        out: dict = {}
        first_error = None
        with self._kafka._lock:
            for p, sent in self._sent.items():
                try:  # collect every ack, even after an error: none is left on the socket
                    out[p] = self._kafka._produce_collect(self.topic, p, self._by_part[p], sent)
                except _Retry:
                    first_error = first_error or KafkaError(
                        f"{self.topic}[{p}] refused pre-encoded batches with a retriable error "
                        f"(its leader moved?); some may be written: produce into a new topic")
                except KafkaError as e:
                    first_error = first_error or e
        self._sent = {}
        if first_error is not None:
            raise first_error
        self._result = out
        return out

