"""The transaction coordinator: Kafka's transactions (KIP-98) in the embedded broker.

Every `transactional.id` has one `TxnMetadata` (Kafka's TransactionMetadata, transaction version
1: the epoch changes only on InitProducerId and fencing)::

    Empty ──AddPartitions──► Ongoing ──EndTxn(commit)──► PrepareCommit ──markers──► CompleteCommit
      ▲                        │  └───EndTxn(abort) / timeout / fencing──► PrepareAbort ──► CompleteAbort
      └── InitProducerId (epoch + 1) ◄──────────────────────────────────────────────────────┘

* InitProducerId gives a new producer id at epoch 0, or the same id at epoch + 1 (a new id once the
  epoch is exhausted). An open transaction of the id is aborted first with a fencing epoch bump:
  the zombie's next request gets PRODUCER_FENCED (INVALID_PRODUCER_EPOCH for old request versions,
  and for its produce requests, as Kafka answers). Kafka then answers the new producer with
  CONCURRENT_TRANSACTIONS and lets it retry; here the abort completes within the request, so the
  answer is the new epoch at once.
* The state survives a restart: each change is a JSON line appended to `DIR/transactions.jsonl`
  (flushed to the OS before the answer, so it survives `kill -9`) before it takes effect, and the
  file is rewritten compactly when it grows. On start, a transaction found in PrepareCommit or
  PrepareAbort has its markers written (again) and completes; an Ongoing one stays open until its
  producer ends it or its timeout aborts it.
* EndTxn writes PrepareCommit/PrepareAbort, then a control batch (the marker) to every partition
  of the transaction, commits the offsets sent with TxnOffsetCommit to the group coordinator (on
  commit only), then CompleteCommit/CompleteAbort, all in one turn of the event loop: when the
  answer leaves, the markers are in the logs and the last stable offsets have moved. (Kafka answers
  after PrepareCommit and writes the markers asynchronously.)
* Produce requests with transactional batches are verified against this state (Kafka's KIP-890
  verification): the producer id and epoch must be current and the partition added to the open
  transaction, so no batch can open a transaction that no marker will ever close.
* Transactions open longer than their `transaction.timeout.ms` are aborted (with a fencing epoch
  bump) by a duty every `transaction.abort.timed.out.transaction.cleanup.interval.ms`; ids idle
  for `transactional.id.expiration.ms` are forgotten.
"""
from __future__ import annotations

import json
import logging
import os
import time

from . import records as R
from .log import fsync_dir

log = logging.getLogger("statekit.broker.transactions")

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REQUEST = 42
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
OPERATION_NOT_ATTEMPTED = 55
PRODUCER_FENCED = 90

EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"

MAX_EPOCH = 32767
FILE = "transactions.jsonl"


def _exhausted(epoch: int) -> bool:
    return epoch >= MAX_EPOCH - 1


class TxnMetadata:
    __slots__ = ("tid", "pid", "epoch", "prev_pid", "last_epoch", "timeout_ms", "state",
                 "partitions", "groups", "offsets", "start_ms", "update_ms")

    def __init__(self, tid: str, pid: int, timeout_ms: int, now_ms: int):
        self.tid = tid
        self.pid = pid
        self.epoch = -1
        self.prev_pid = -1
        self.last_epoch = -1
        self.timeout_ms = timeout_ms
        self.state = EMPTY
        self.partitions: set[tuple[str, int]] = set()
        self.groups: set[str] = set()
        self.offsets: dict[str, dict[tuple[str, int], tuple[int, int, str]]] = {}
        self.start_ms = -1
        self.update_ms = now_ms

    def copy(self) -> "TxnMetadata":
        m = TxnMetadata.__new__(TxnMetadata)
        for name in self.__slots__:
            setattr(m, name, getattr(self, name))
        m.partitions = set(self.partitions)
        m.groups = set(self.groups)
        m.offsets = {g: dict(o) for g, o in self.offsets.items()}
        return m

    def to_json(self) -> dict:
        return {"id": self.tid, "pid": self.pid, "epoch": self.epoch, "prev_pid": self.prev_pid,
                "last_epoch": self.last_epoch, "timeout": self.timeout_ms, "state": self.state,
                "parts": sorted([t, p] for t, p in self.partitions), "groups": sorted(self.groups),
                "offsets": {g: [[t, p, o, e, m] for (t, p), (o, e, m) in sorted(offs.items())]
                            for g, offs in self.offsets.items()},
                "start": self.start_ms, "ts": self.update_ms}

    @classmethod
    def from_json(cls, d: dict) -> "TxnMetadata":
        m = cls(d["id"], int(d["pid"]), int(d["timeout"]), int(d.get("ts", 0)))
        m.epoch = int(d["epoch"])
        m.prev_pid = int(d.get("prev_pid", -1))
        m.last_epoch = int(d.get("last_epoch", -1))
        m.state = d["state"]
        m.partitions = {(t, int(p)) for t, p in d.get("parts", [])}
        m.groups = set(d.get("groups", []))
        m.offsets = {g: {(t, int(p)): (int(o), int(e), m_ or "") for t, p, o, e, m_ in rows}
                     for g, rows in d.get("offsets", {}).items()}
        m.start_ms = int(d.get("start", -1))
        return m


class TransactionCoordinator:
    def __init__(self, broker):
        self.broker = broker
        self.path = os.path.join(broker.dir, FILE)
        self.txns: dict[str, TxnMetadata] = {}
        self._file = None
        self._lines = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._load()
        if self._lines > 2 * len(self.txns) + 1000:
            self._rewrite()
        self._file = open(self.path, "a", encoding="utf-8")
        for meta in list(self.txns.values()):
            if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                log.info("completing transaction %s (%s) left by a restart", meta.tid, meta.state)
                self._complete(meta)

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            finally:
                self._file.close()
                self._file = None

    def _load(self) -> None:
        self._lines = 0
        try:
            f = open(self.path, encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        with f:
            for line in f:
                self._lines += 1
                try:
                    d = json.loads(line)
                    if d.get("del"):
                        self.txns.pop(d["id"], None)
                    else:
                        self.txns[d["id"]] = TxnMetadata.from_json(d)
                except (ValueError, KeyError, TypeError):
                    log.warning("skipping a torn line in %s", self.path)  # a crash mid-write

    def _persist(self, meta: TxnMetadata | None, deleted_tid: str | None = None) -> None:
        """Append the new state of one id (raises OSError: then nothing changed in memory)."""
        line = json.dumps({"id": deleted_tid, "del": 1} if meta is None else meta.to_json(),
                          separators=(",", ":")) + "\n"
        self._file.write(line)
        self._file.flush()  # in the page cache: survives kill -9 of the broker
        self._lines += 1
        if self._lines > max(10_000, 4 * len(self.txns)):
            self._rewrite()

    def _rewrite(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            for meta in self.txns.values():
                out.write(json.dumps(meta.to_json(), separators=(",", ":")) + "\n")
            out.flush()
            os.fsync(out.fileno())
        if self._file is not None:
            self._file.close()
        os.replace(tmp, self.path)
        fsync_dir(os.path.dirname(self.path))
        self._lines = len(self.txns)
        if self._file is not None:
            self._file = open(self.path, "a", encoding="utf-8")

    def _commit_change(self, meta: TxnMetadata, change) -> None:
        """Apply ``change(copy)`` durably: persist the changed copy first, then adopt it."""
        new = meta.copy()
        change(new)
        new.update_ms = _now_ms()
        self._persist(new)
        self.txns[new.tid] = new

    # -- InitProducerId ------------------------------------------------------------------------
    def init_producer_id(self, tid: str, timeout_ms: int, expected_pid: int = -1,
                         expected_epoch: int = -1) -> tuple[int, int, int]:
        """(error code, producer id, epoch)."""
        if tid == "":
            return INVALID_REQUEST, -1, -1
        if timeout_ms <= 0 or timeout_ms > self.broker.config.get("transaction.max.timeout.ms"):
            return INVALID_TRANSACTION_TIMEOUT, -1, -1
        meta = self.txns.get(tid)
        now = _now_ms()
        if meta is None:
            meta = TxnMetadata(tid, self.broker.next_producer_id(), timeout_ms, now)
        if expected_pid >= 0 and not (meta.epoch == -1 or expected_pid == meta.pid or (
                expected_pid == meta.prev_pid and _exhausted(expected_epoch))):
            return PRODUCER_FENCED, -1, -1
        if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
            self._complete(meta)  # markers that failed before: try again
            meta = self.txns[tid]
            if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return CONCURRENT_TRANSACTIONS, -1, -1
        if meta.state == ONGOING:
            self._fence_and_abort(meta)
            meta = self.txns[tid]
            if meta.state != COMPLETE_ABORT:
                return CONCURRENT_TRANSACTIONS, -1, -1
        if expected_pid >= 0 and meta.epoch >= 0 and expected_pid == meta.pid:
            if expected_epoch == meta.last_epoch and meta.last_epoch >= 0:
                return NONE, meta.pid, meta.epoch  # a retry of a bump whose answer was lost
            if expected_epoch != meta.epoch:
                return PRODUCER_FENCED, -1, -1

        def change(m: TxnMetadata) -> None:
            if _exhausted(m.epoch):
                m.prev_pid, m.pid, m.epoch = m.pid, self.broker.next_producer_id(), 0
                m.last_epoch = -1
            else:
                m.last_epoch = m.epoch
                m.epoch += 1
            m.timeout_ms = timeout_ms
            m.state = EMPTY
            m.partitions, m.groups, m.offsets = set(), set(), {}
            m.start_ms = -1

        self._commit_change(meta, change)
        meta = self.txns[tid]
        log.info("transactional id %s: producer id %d, epoch %d", tid, meta.pid, meta.epoch)
        return NONE, meta.pid, meta.epoch

    # -- the open transaction -------------------------------------------------------------------
    def _check(self, tid: str, pid: int, epoch: int) -> tuple[int, TxnMetadata | None]:
        if not tid:
            return INVALID_REQUEST, None
        meta = self.txns.get(tid)
        if meta is None or meta.pid != pid:
            return INVALID_PRODUCER_ID_MAPPING, meta
        if epoch != meta.epoch:
            return PRODUCER_FENCED, meta
        if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return CONCURRENT_TRANSACTIONS, meta
        return NONE, meta

    def add_partitions(self, tid: str, pid: int, epoch: int, partitions) -> int:
        code, meta = self._check(tid, pid, epoch)
        if code:
            return code
        parts = set(partitions)
        if meta.state == ONGOING and parts <= meta.partitions:
            return NONE

        def change(m: TxnMetadata) -> None:
            if m.state != ONGOING:
                m.state = ONGOING
                m.start_ms = _now_ms()
                m.partitions, m.groups, m.offsets = set(), set(), {}
            m.partitions |= parts

        self._commit_change(meta, change)
        return NONE

    def add_offsets(self, tid: str, pid: int, epoch: int, group: str) -> int:
        code, meta = self._check(tid, pid, epoch)
        if code:
            return code
        if meta.state == ONGOING and group in meta.groups:
            return NONE

        def change(m: TxnMetadata) -> None:
            if m.state != ONGOING:
                m.state = ONGOING
                m.start_ms = _now_ms()
                m.partitions, m.groups, m.offsets = set(), set(), {}
            m.groups.add(group)

        self._commit_change(meta, change)
        return NONE

    def txn_offset_commit(self, tid: str, group: str, pid: int, epoch: int, offsets: dict) -> int:
        """``offsets``: {(topic, partition): (offset, leader epoch, metadata)}; pending until the
        transaction commits (dropped if it aborts)."""
        code, meta = self._check(tid, pid, epoch)
        if code == PRODUCER_FENCED:
            return INVALID_PRODUCER_EPOCH  # what Kafka's offsets log answers an old epoch
        if code:
            return code
        if meta.state != ONGOING or group not in meta.groups:
            return INVALID_TXN_STATE  # AddOffsetsToTxn first

        def change(m: TxnMetadata) -> None:
            m.offsets.setdefault(group, {}).update(offsets)

        self._commit_change(meta, change)
        return NONE

    def verify_produce(self, tid: str | None, pid: int, epoch: int, topic: str, partition: int) -> int:
        """May this transactional batch be appended? (KIP-890 verification)."""
        meta = self.txns.get(tid) if tid else None
        if meta is None or meta.pid != pid:
            return INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.epoch:
            return INVALID_PRODUCER_EPOCH
        if meta.state != ONGOING or (topic, partition) not in meta.partitions:
            return INVALID_TXN_STATE
        return NONE

    # -- ending --------------------------------------------------------------------------------
    def end_txn(self, tid: str, pid: int, epoch: int, commit: bool) -> int:
        if not tid:
            return INVALID_REQUEST
        meta = self.txns.get(tid)
        if meta is None or meta.pid != pid:
            return INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.epoch:
            return PRODUCER_FENCED
        if meta.state == ONGOING:
            self._commit_change(meta, lambda m: setattr(m, "state", PREPARE_COMMIT if commit else PREPARE_ABORT))
            self._complete(self.txns[tid])
            return NONE
        if meta.state == (COMPLETE_COMMIT if commit else COMPLETE_ABORT):
            return NONE  # a retry
        if meta.state == (PREPARE_COMMIT if commit else PREPARE_ABORT):
            self._complete(meta)
            return NONE if self.txns[tid].state.startswith("Complete") else CONCURRENT_TRANSACTIONS
        return INVALID_TXN_STATE

    def _fence_and_abort(self, meta: TxnMetadata) -> None:
        """Abort an open transaction with the epoch bumped (a zombie of the old epoch is fenced)."""
        def change(m: TxnMetadata) -> None:
            if m.epoch < MAX_EPOCH:
                m.epoch += 1
            m.last_epoch = -1
            m.state = PREPARE_ABORT

        self._commit_change(meta, change)
        self._complete(self.txns[meta.tid])

    def _complete(self, meta: TxnMetadata) -> None:
        """Write the markers (and, on commit, the pending offsets), then the Complete state. On an
        I/O error the transaction stays prepared; the timeout duty tries again."""
        commit = meta.state == PREPARE_COMMIT
        kind = R.CONTROL_COMMIT if commit else R.CONTROL_ABORT
        now = _now_ms()
        tm = self.broker.topics
        try:
            for topic, partition in sorted(meta.partitions):
                plog = tm.get_partition(topic, partition)
                if plog is not None:
                    plog.append_marker(meta.pid, meta.epoch, kind, 0, now)
            if commit and meta.offsets and self.broker.coordinator is not None:
                for group, offs in meta.offsets.items():
                    self.broker.coordinator.commit_txn_offsets(group, offs)
        except OSError as e:
            log.error("transaction %s: writing its markers failed (%s); will retry", meta.tid, e)
            return
        finally:
            self.broker.notify_append()

        def change(m: TxnMetadata) -> None:
            m.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
            m.partitions, m.groups, m.offsets = set(), set(), {}
            m.start_ms = -1

        try:
            self._commit_change(meta, change)
        except OSError as e:
            log.error("transaction %s: recording its completion failed (%s); will retry", meta.tid, e)

    # -- duties --------------------------------------------------------------------------------
    def tick(self) -> None:
        """Abort transactions past their timeout, finish prepared ones, forget idle ids."""
        now = _now_ms()
        expire_ms = self.broker.config.get("transactional.id.expiration.ms")
        for meta in list(self.txns.values()):
            if meta.state == ONGOING and now - meta.start_ms > meta.timeout_ms:
                log.info("transaction of %s (producer %d, epoch %d) is past its timeout of %d ms: aborting it",
                         meta.tid, meta.pid, meta.epoch, meta.timeout_ms)
                self._fence_and_abort(meta)
            elif meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                self._complete(meta)
            elif meta.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) and now - meta.update_ms > expire_ms:
                self._persist(None, deleted_tid=meta.tid)
                del self.txns[meta.tid]

    def open(self) -> bool:
        """Is a transaction under way (its timeout or its completion still to come)?"""
        return any(m.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT) for m in self.txns.values())

    def describe(self) -> dict:
        return {tid: {"producer_id": m.pid, "epoch": m.epoch, "state": m.state,
                      "partitions": sorted(f"{t}-{p}" for t, p in m.partitions)}
                for tid, m in self.txns.items()}


def _now_ms() -> int:
    return int(time.time() * 1000)
