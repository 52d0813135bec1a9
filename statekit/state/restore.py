"""Restoration: bring a task's RocksDB up to its changelogs' ends, honouring the commit markers.

The shape follows Kafka Streams' ``StoreChangelogReader`` (a restore listener with start / batch /
end callbacks, restore from the checkpointed offset to the end offset captured at the start) and
Quix Streams' ``recovery.py`` (a changelog record header tells which processed input produced it).

Changelog records (see docs/ARCHITECTURE.md, "Task state and the commit protocol"):

* data: key/value as the store holds them, header ``statekit.batch`` = the input batch id (ASCII);
* commit marker: key ``__statekit.commit__``, header ``statekit.marker=1``, value ``{"batch": b}``.

Replay per store (:class:`StoreReplay`): records are *pending* until a marker commits them; records
after the last marker (a crashed, uncommitted attempt) are dropped. A task's stores may disagree on
their last committed batch only when a crash hit between the markers of one commit, so only the
records of a store's *latest* committed batch are *held* back until every store of the task has been
read; then every store is restored up to the smallest latest batch (the held records of a store that
is ahead are dropped, and Spark replays that batch). Records of older batches are applied as soon as
their group is committed — also when compaction dropped the markers in between and merged groups:
batch ids never decrease along a changelog, so a record whose batch is older than the marker that
closes its group belongs to a commit that completed (possibly on a re-run with the same values).
The one exception is the *seal* (see ``TaskState._seal_dropped``): after a crashed attempt of batch
b, the reopened task re-writes the dropped keys and closes them with a marker of its batch, below b.
So a record whose batch is *newer* than the marker closing its group is a crashed attempt that a seal
superseded: it is skipped, never applied (applied, a window of it could move stream time ahead and
expire committed windows before the seal's values arrive).

Progress is written with the data (``TaskDB.write_batch_raw(store, items, meta)``: one atomic
WriteBatch), as ``changelog.<store> = {"offset": o, "batch": b}`` where ``o`` is a point from which
replaying again is always safe (values are absolute, so re-applying committed records is harmless).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Optional, Protocol

MARKER_KEY = b"__statekit.commit__"
BATCH_HEADER = "statekit.batch"
MARKER_HEADER = "statekit.marker"
NO_BATCH = -1


def meta_key(store: str) -> str:
    return f"changelog.{store}"


def _record_batch(headers) -> Optional[int]:
    for k, v in headers:
        if k == BATCH_HEADER:
            try:
                return int(v)
            except (TypeError, ValueError):
                return None
    return None


def _is_marker(key, headers) -> bool:
    if key != MARKER_KEY:
        return False
    for k, v in headers:
        if k == MARKER_HEADER:
            return True
    return False


def _marker_batch(value, headers) -> int:
    try:
        return int(json.loads(value)["batch"])
    except (TypeError, ValueError, KeyError):
        b = _record_batch(headers)
        return NO_BATCH if b is None else b


class StoreReplay:
    """Replays one store's changelog with commit-marker semantics (used by restore and standby)."""

    def __init__(self, store: str, offset: int, batch: int = NO_BATCH):
        self.store = store
        self.position = offset          # next offset to read
        self.safe_offset = offset       # replaying from here is always safe
        self.group_start = offset       # right after the last marker read
        self.batch = batch              # latest committed batch seen (M)
        self.applied_batch = batch      # every commit up to this batch is applied (held excluded)
        self.pending: list = []         # (key, value, headers) since the last marker
        self.held: list = []            # committed records of batch M, not yet applied
        self.held_safe = offset         # safe offset to report while `held` is not applied
        self.records_read = 0
        self.records_applied = 0
        self.superseded = 0             # crashed-attempt records skipped at a seal's marker
        self.markers = 0

    def feed(self, records, next_offset: int | None = None) -> list:
        """Consume decoded records ``(offset, ts, key, value, headers)``; return the ``(key, value)``
        pairs that are committed and safe to apply now, in log order."""
        out: list = []
        pending = self.pending
        pend = pending.append
        mk = MARKER_KEY
        for rec in records:
            key = rec[2]
            if key == mk and _is_marker(key, rec[4]):
                self._commit(_marker_batch(rec[3], rec[4]), rec[0] + 1, out)
                pending = self.pending
                pend = pending.append
            else:
                pend(rec)
        self.records_read += len(records)
        if next_offset is not None:
            self.position = next_offset
        elif records:
            self.position = records[-1][0] + 1
        self.records_applied += len(out)
        return out

    def _commit(self, m: int, after: int, out: list) -> None:
        self.markers += 1
        group_start = self.group_start
        if m > self.batch:
            # a newer batch is committed here: the held records (batch M < m) are safe now
            if self.held:
                out.extend(self.held)
                self.held = []
            self.applied_batch = self.batch if self.batch > self.applied_batch else self.applied_batch
            self.batch = m
            self.held_safe = group_start
        held = self.held
        M = self.batch
        pending = self.pending
        # the common case: every record of the group carries exactly the header of batch M
        hm = ((BATCH_HEADER, str(M).encode()),)
        same = [(r[2], r[3]) for r in pending if r[4] == hm] if m == M else ()
        if len(same) == len(pending):
            held.extend(same)
        else:
            for rec in pending:
                b = _record_batch(rec[4])
                if b is not None and b > m:
                    self.superseded += 1
                    continue
                if b is None or b >= M:
                    held.append((rec[2], rec[3]))
                else:
                    out.append((rec[2], rec[3]))
        self.pending = []
        self.group_start = after
        if not held:
            self.applied_batch = M
            self.safe_offset = after
            self.held_safe = after
        else:
            self.safe_offset = self.held_safe

    def release_held(self, out: list | None = None) -> list:
        """Every store agrees the latest batch is committed: apply the held records."""
        out = [] if out is None else out
        if self.held:
            out.extend(self.held)
            self.records_applied += len(self.held)
            self.held = []
        self.applied_batch = self.batch
        self.safe_offset = self.group_start
        self.held_safe = self.group_start
        return out

    def drop_held(self) -> int:
        """Another store did not commit the latest batch: forget it here too (Spark replays it)."""
        n = len(self.held)
        self.held = []
        self.batch = self.applied_batch
        return n

    def meta(self) -> dict:
        return {"offset": self.safe_offset, "batch": self.applied_batch}


class RestoreListener(Protocol):
    def on_restore_start(self, store: str, partition: int, start_offset: int, end_offset: int) -> None: ...

    def on_batch_restored(self, store: str, partition: int, batch_end_offset: int, num_restored: int) -> None: ...

    def on_restore_end(self, store: str, partition: int, total_restored: int) -> None: ...


@dataclass
class RestoreMetrics:
    store: str
    partition: int
    replayed_from: str          # "checkpoint" | "scratch" | "meta" | "none"
    start_offset: int = 0
    end_offset: int = 0
    records_restored: int = 0   # changelog records read (data + markers)
    records_applied: int = 0    # records written to the store
    records_remaining: int = 0
    duration_s: float = 0.0
    dropped_uncommitted: int = 0
    superseded: int = 0         # records of a crashed attempt that a seal after them superseded
    # keys of the dropped records (uncommitted tail, or a batch another store did not commit)
    dropped_keys: set = field(default_factory=set, repr=False)

    @property
    def rate(self) -> float:
        return self.records_restored / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def lag(self) -> int:
        return max(0, self.end_offset - self.start_offset)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.pop("dropped_keys", None)
        d["rate"] = self.rate
        d["lag"] = self.lag
        return d


class _Crash(Protocol):
    def hit(self, point: str, batch: int | None = None) -> None: ...


def restore_stores(db, kafka, partition: int, plan: dict, *, listener=None, crash=None,
                   max_bytes: int | None = None, exclude=()) -> tuple[dict, int]:
    """Replay every store of ``plan`` (``{store: (topic, start_offset, end_offset, base_batch,
    replayed_from)}``) into ``db``. Returns ``({store: RestoreMetrics}, task_batch)``. Stores in
    ``exclude`` (changelogs created just now, empty) do not take part in settling the batch."""
    replays: dict[str, StoreReplay] = {}
    metrics: dict[str, RestoreMetrics] = {}
    writes = 0
    for store, (topic, start, end, base_batch, origin) in plan.items():
        rp = StoreReplay(store, start, base_batch)
        replays[store] = rp
        m = RestoreMetrics(store, partition, origin, start, end, records_remaining=max(0, end - start))
        metrics[store] = m
        t0 = time.perf_counter()
        if listener is not None:
            listener.on_restore_start(store, partition, start, end)
        if end > start:
            reader = kafka.read(topic, partition, start, end, max_bytes=max_bytes)
            try:
                for chunk in reader:
                    items = rp.feed(chunk.records, chunk.next_offset)
                    db.write_batch_raw(store, items, {meta_key(store): rp.meta()})
                    writes += 1
                    m.records_restored = rp.records_read
                    m.records_remaining = max(0, end - rp.position)
                    if listener is not None:
                        listener.on_batch_restored(store, partition, chunk.next_offset,
                                                   len(chunk.records))
                    if crash is not None:
                        crash.hit("mid_restore", writes)
            finally:
                reader.close()  # an abandoned read drains its in-flight Fetch now, not at GC
        m.records_restored = rp.records_read
        m.records_remaining = 0
        m.duration_s = time.perf_counter() - t0
    # every store read: settle the latest batch
    voters = [rp.batch for name, rp in replays.items() if name not in exclude]
    task_batch = min(voters, default=NO_BATCH)
    for store, rp in replays.items():
        m = metrics[store]
        m.dropped_uncommitted = len(rp.pending)
        m.dropped_keys.update(r[2] for r in rp.pending)
        rp.pending = []
        if rp.batch <= task_batch or store in exclude:
            items = rp.release_held()
        else:
            m.dropped_keys.update(k for k, _v in rp.held)
            m.dropped_uncommitted += rp.drop_held()
            rp.applied_batch = min(rp.applied_batch, task_batch)
            items = []
        db.write_batch_raw(store, items, {meta_key(store): rp.meta(), "batch": task_batch})
        m.records_applied = rp.records_applied
        m.superseded = rp.superseded
        if listener is not None:
            listener.on_restore_end(store, partition, m.records_restored)
    return metrics, task_batch
