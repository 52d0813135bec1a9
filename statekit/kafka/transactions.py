"""Kafka transactions over the client's produce path: :class:`TransactionalProducer`, the
exactly-once output of a task (one transaction per task and micro-batch). It owns the producer id
and epoch, the per-partition sequences, the partitions added to the open transaction and the
coordinator connection; the client (:class:`statekit.kafka.client.Kafka`) sends the batches."""
from __future__ import annotations

import time
from typing import Iterable

from kafka.protocol.producer import AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest

from statekit.errors import BrokerUnreachable, StatekitError

from .connection import Connection
from .encode import encode_records
from .errors import KafkaBusy, KafkaError, ProducerFenced, Retry, raise_for

__all__ = ["TransactionalProducer"]

TXN_VERIFICATION_FEATURE = "statekit.txn.verification"  # see statekit.broker.handlers
_COORDINATOR_MOVED = {14, 15, 16}  # loading, not available, not coordinator: find it again, retry
_CONCURRENT = 51  # the previous transaction's markers are still being written: retry shortly


class TransactionalProducer:
    """Kafka transactions over :class:`Kafka`'s fast produce path: exactly-once output.

    ::

        txp = kafka.transactional_producer("wordcount-0_3", timeout_ms=60000)
        txp.begin()
        lasts = txp.send_many([(topic, partition, records), ...])   # as Kafka.send_many
        txp.commit()      # or txp.abort()
        txp.close()

    ``begin()`` is local. ``send_many()`` adds the partitions new to the transaction
    (AddPartitionsToTxn) and writes every batch, all requests in flight at once: one round trip
    against statekit's broker (which verifies transactional writes, so the AddPartitionsToTxn can
    be pipelined with the writes on the same connection); elsewhere the AddPartitionsToTxn is
    answered first (two round trips), so no batch can land in a partition the transaction does
    not hold. ``commit()`` is one EndTxn: against statekit's broker it returns once the commit
    markers are in every partition (read_committed readers see the records at once); a Kafka
    cluster answers once the commit is decided and writes the markers right after. A failed
    ``send_many`` leaves the transaction to ``abort()``. ``abort()`` also takes a new epoch
    (sequence numbers start again), so nothing of an uncertain write can be taken for a later one.
    ``ProducerFenced`` from any call: another producer with the same id took over (or the
    transaction outlived ``timeout_ms``); this producer is done.
    """

    def __init__(self, kafka, transactional_id: str, timeout_ms: int = 60000):
        """``kafka``: the :class:`statekit.kafka.client.Kafka` whose connections and produce
        path this producer uses (``Kafka.transactional_producer`` makes one)."""
        if not transactional_id:
            raise StatekitError("a transactional producer needs a non-empty transactional_id")
        self._k = kafka
        self.transactional_id = transactional_id
        self.timeout_ms = int(timeout_ms)
        self.producer_id = -1
        self.epoch = -1
        self._seq: dict[tuple[str, int], int] = {}
        self._added: set[tuple[str, int]] = set()
        self._asked = False  # an AddPartitionsToTxn went out in this transaction
        self._in_txn = False
        self._closed = False
        self._fenced: ProducerFenced | None = None
        self._coord: Connection | None = None  # the transaction coordinator, found once
        with kafka._lock:
            self._init()

    def __repr__(self):
        return (f"TransactionalProducer({self.transactional_id!r}, producer_id={self.producer_id}, "
                f"epoch={self.epoch}, open={self._in_txn})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- coordinator requests ----------------------------------------------------------------------
    def _coordinator(self, refresh: bool = False) -> Connection:
        c = self._coord
        if refresh or c is None or not c.usable():
            c = self._coord = self._k._coordinator(self.transactional_id, 1)
        return c

    def _coord_request(self, make, what: str):
        """Send ``make(conn)`` to the transaction coordinator; retry while it moves or is busy."""
        delay = 0.005
        refresh = False
        for _attempt in range(200):
            conn = self._coordinator(refresh)
            try:
                resp = conn.request(make(conn))
            except BrokerUnreachable:
                if refresh:
                    raise
                refresh = True  # the connection went: find the coordinator again, once
                continue
            refresh = False
            code = _txn_code(resp)
            if code in _COORDINATOR_MOVED:
                refresh = True
                time.sleep(0.05)
                continue
            if code == _CONCURRENT:
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
                continue
            return resp, code
        raise KafkaBusy(f"{what} for transactional id {self.transactional_id!r}: the coordinator kept "
                         f"answering that it is busy or moving")

    def _init(self, bump: bool = False) -> None:
        def make(conn):
            v = conn.version(InitProducerIdRequest)
            expected = bump and v >= 3 and self.producer_id >= 0
            return InitProducerIdRequest(
                version=v, transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms,
                producer_id=self.producer_id if expected else -1, producer_epoch=self.epoch if expected else -1)

        resp, code = self._coord_request(make, "InitProducerId")
        if code == 50:
            raise KafkaError(f"the broker refuses transaction timeout {self.timeout_ms} ms "
                             f"(INVALID_TRANSACTION_TIMEOUT): use one at most its transaction.max.timeout.ms")
        if code == 53:
            raise KafkaError(f"the broker denies transactional id {self.transactional_id!r} "
                             f"(TRANSACTIONAL_ID_AUTHORIZATION_FAILED): it may not support transactions "
                             f"(check Kafka.supports_transactions()) or its ACLs forbid the id")
        self._check(code, "InitProducerId")
        self.producer_id, self.epoch = resp.producer_id, resp.producer_epoch
        self._seq.clear()

    def _check(self, code: int, what: str) -> None:
        if code in (47, 90):
            self._fenced = ProducerFenced(
                f"transactional id {self.transactional_id!r} (producer {self.producer_id}, epoch {self.epoch}) "
                f"was fenced at {what}: a newer producer with the same id took over, or the transaction "
                f"outlived its timeout of {self.timeout_ms} ms and the broker aborted it; this producer "
                f"can do nothing more")
            self._in_txn = False
            raise self._fenced
        raise_for(code, f"{what} of transactional id {self.transactional_id!r}")

    def _usable(self) -> None:
        if self._fenced is not None:
            raise self._fenced
        if self._closed:
            raise StatekitError(f"the transactional producer {self.transactional_id!r} is closed")

    # -- the transaction ---------------------------------------------------------------------------
    def begin(self) -> None:
        """Start a transaction (nothing is sent until send_many)."""
        self._usable()
        if self._in_txn:
            raise StatekitError(f"transactional producer {self.transactional_id!r} already has an open "
                                f"transaction: commit() or abort() it first")
        self._in_txn = True
        self._added = set()
        self._asked = False

    def send_many(self, items: Iterable, batch_bytes: int = 900_000) -> list[int]:
        """Write ``[(topic, partition, records)]`` in the open transaction; ``records`` is a list of
        ``(key, value[, headers])`` tuples or a :class:`statekit.wire.Columns` (encoded
        column-wise), as for :meth:`Kafka.send_many`. Returns each item's last offset (-1 for an
        empty item)."""
        self._usable()
        if not self._in_txn:
            raise StatekitError("send_many() outside a transaction: call begin() first")
        k = self._k
        ts = int(time.time() * 1000)
        with k._lock:
            # encode first (sequences advance only once the batches are acknowledged)
            built = []
            for topic, partition, recs in items:
                tp = (topic, partition)
                prod = [self.producer_id, self.epoch, self._seq.get(tp, 0)]
                built.append((tp, encode_records(recs, batch_bytes, ts, prod), prod[2]))
            for (topic, partition), payloads, _ in built:  # unknown topics fail before anything is sent
                if payloads:
                    k._leader(topic, partition)
            new = sorted({tp for tp, payloads, _ in built if payloads and tp not in self._added})
            coord = self._coordinator() if new else None
            add_cid = None
            if new:
                pipelined = TXN_VERIFICATION_FEATURE in coord.features and all(
                    k._leader(t, p) is coord for t, p in new)
                req = self._add_request(coord, new)
                self._asked = True
                if pipelined:
                    add_cid = coord.send(req)
                else:
                    self._add_partitions(coord, new, req)
            out = [-1] * len(built)
            inflight = []
            for i, (tp, payloads, _) in enumerate(built):
                if payloads:
                    inflight.append((i, k._produce_send(tp[0], tp[1], payloads, self.transactional_id)))
            first_error = None
            if add_cid is not None:
                try:
                    self._add_result(coord.recv(add_cid), new)
                except StatekitError as e:  # keep collecting: no answer is left behind on the socket
                    first_error = e
            redo = []
            for i, sent in inflight:
                tp, payloads, _ = built[i]
                try:
                    out[i] = k._produce_collect(tp[0], tp[1], payloads, sent)
                except Retry:
                    redo.append(i)
                except ProducerFenced as e:
                    first_error = first_error or e
                except StatekitError as e:   # (after a lost connection, the first error says why)
                    first_error = first_error or e
            if first_error is not None:
                if isinstance(first_error, ProducerFenced):
                    self._check(47, "produce")
                raise first_error
            for i in redo:  # the same batches again: the broker drops what it already has
                tp, payloads, _ = built[i]
                k._forget(tp[0])
                out[i] = k._produce_retrying(tp[0], tp[1], payloads, self.transactional_id)
            for tp, payloads, next_seq in built:
                if payloads:
                    self._seq[tp] = next_seq
        return out

    def _add_request(self, conn, parts):
        v = conn.version(AddPartitionsToTxnRequest)
        by_topic: dict[str, list[int]] = {}
        for t, p in parts:
            by_topic.setdefault(t, []).append(p)
        T = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        return AddPartitionsToTxnRequest(
            version=v, v3_and_below_transactional_id=self.transactional_id,
            v3_and_below_producer_id=self.producer_id, v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()])

    def _add_partitions(self, conn, parts, req) -> None:
        """AddPartitionsToTxn answered before any write (brokers that do not verify writes)."""
        delay = 0.005
        for _attempt in range(200):
            resp = conn.request(req)
            code = _add_code(resp)
            if code == _CONCURRENT or code in _COORDINATOR_MOVED:
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
                if code in _COORDINATOR_MOVED:
                    conn = self._coordinator(refresh=True)
                continue
            self._add_result(resp, parts)
            return
        raise KafkaBusy(f"AddPartitionsToTxn of {self.transactional_id!r}: the coordinator stayed busy")

    def _add_result(self, resp, parts) -> None:
        code = _add_code(resp)
        self._check(code, "AddPartitionsToTxn")
        self._added.update(parts)

    def commit(self) -> None:
        """Commit the open transaction (EndTxn): its records become visible to read_committed
        readers, all at once."""
        self._end(True)

    def abort(self) -> None:
        """Abort the open transaction: its records are never visible to read_committed readers."""
        self._end(False)

    def _end(self, commit: bool, renew: bool = True) -> None:
        self._usable()
        if not self._in_txn:
            raise StatekitError(f"{'commit' if commit else 'abort'}() without an open transaction: "
                                f"call begin() first")
        what = "EndTxn(commit)" if commit else "EndTxn(abort)"
        with self._k._lock:
            if self._added or (self._asked and not commit):
                def make(conn):
                    return EndTxnRequest(version=conn.version(EndTxnRequest),
                                         transactional_id=self.transactional_id, producer_id=self.producer_id,
                                         producer_epoch=self.epoch, committed=commit)

                _resp, code = self._coord_request(make, what)
                if not (code == 48 and not commit and not self._added):  # nothing was added: nothing to abort
                    self._check(code, what)
            self._in_txn = False
            self._added = set()
            self._asked = False
            if not commit and renew:
                self._init(bump=True)

    def close(self, abort: bool = True) -> None:
        """Abort an open transaction (best effort) and stop using the producer. ``abort=False``
        leaves it to the next producer of the same id (its InitProducerId aborts it): for a broker
        that is away, where the EndTxn would only wait out the request timeout."""
        if self._closed:
            return
        try:
            if abort and self._in_txn and self._fenced is None:
                self._end(False, renew=False)
        except StatekitError:
            pass
        finally:
            self._closed = True


def _txn_code(resp) -> int:
    code = getattr(resp, "error_code", 0)
    if code == 0 and hasattr(resp, "results_by_topic_v3_and_below"):
        return _add_code(resp)
    return code


def _add_code(resp) -> int:
    """The error of an AddPartitionsToTxn answer (the first partition error that matters)."""
    codes = [p.partition_error_code for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition]
    for c in codes:
        if c not in (0, 55):  # OPERATION_NOT_ATTEMPTED only says another partition failed
            return c
    return 0
