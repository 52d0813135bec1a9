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

The replay works on runs of records that share one headers tuple (see :class:`StoreReplay`), and
restoration reads column-wise (``Kafka.read(..., columns=True)``) and writes parallel key / value
lists (``TaskDB.write_batch_columns``): no Python work per record beyond RocksDB's own put.

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
# every changelog reader reads committed: with exactly-once commits a crashed attempt's records
# (and its commit markers) are in an aborted transaction; without transactions this reads the same
COMMITTED = "read_committed"
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


class _Segment:
    """Pending records (since the last marker) that share one headers tuple, column-wise."""

    __slots__ = ("offsets", "timestamps", "keys", "values", "headers", "batch")

    def __init__(self, offsets, timestamps, keys, values, headers, batch):
        self.offsets = offsets
        self.timestamps = timestamps
        self.keys = keys
        self.values = values
        self.headers = headers
        self.batch = batch


class StoreReplay:
    """Replays one store's changelog with commit-marker semantics (used by restore and standby).

    It works on *runs*: consecutive records carrying the same headers (a commit's records all
    carry ``statekit.batch=b``) are judged once per run, not once per record, which is exactly
    the per-record rule since that rule depends only on a record's batch header. Records are fed
    either as tuples (:meth:`feed`) or column-wise (:meth:`feed_columns`, the restore path:
    ``statekit.kafka.Columns``); both may be mixed on one replay."""

    def __init__(self, store: str, offset: int, batch: int = NO_BATCH):
        self.store = store
        self.position = offset          # next offset to read
        self.safe_offset = offset       # replaying from here is always safe
        self.group_start = offset       # right after the last marker read
        self.batch = batch              # latest committed batch seen (M)
        self.applied_batch = batch      # every commit up to this batch is applied (held excluded)
        self._segments: list = []       # pending records since the last marker (_Segment)
        self._held_keys: list = []      # committed records of batch M, not yet applied
        self._held_values: list = []
        self.held_safe = offset         # safe offset to report while `held` is not applied
        self.records_read = 0
        self.records_applied = 0
        self.superseded = 0             # crashed-attempt records skipped at a seal's marker
        self.markers = 0
        self._runinfo: dict = {}        # headers -> (batch header or None, may hold markers)

    # -- inspection ------------------------------------------------------------------------------
    @property
    def pending(self) -> list:
        """The records since the last marker, ``(offset, ts, key, value, headers)``."""
        out: list = []
        for g in self._segments:
            out.extend(zip(g.offsets, g.timestamps, g.keys, g.values, (g.headers,) * len(g.keys)))
        return out

    def pending_count(self) -> int:
        return sum(len(g.keys) for g in self._segments)

    @property
    def held(self) -> list:
        """The committed records of the latest batch, ``(key, value)``, not yet applied."""
        return list(zip(self._held_keys, self._held_values))

    def has_held(self) -> bool:
        return bool(self._held_keys)

    # -- feeding ---------------------------------------------------------------------------------
    def feed(self, records, next_offset: int | None = None) -> list:
        """Consume decoded records ``(offset, ts, key, value, headers)``; return the ``(key, value)``
        pairs that are committed and safe to apply now, in log order."""
        from statekit.kafka import Columns

        keys, values = self.feed_columns(Columns.from_tuples(records), next_offset)
        return list(zip(keys, values))

    def feed_columns(self, cols, next_offset: int | None = None) -> tuple[list, list]:
        """:meth:`feed` for ``statekit.kafka.Columns``: returns ``(keys, values)`` to apply now."""
        out_k: list = []
        out_v: list = []
        info = self._runinfo
        offsets, keys = cols.offsets, cols.keys
        whole = len(cols.runs) == 1
        for s, e, h in cols.runs:
            try:
                ri = info.get(h)
            except TypeError:  # headers given as a list (hand-made records): not cacheable
                ri = h = tuple(tuple(x) for x in h)
                ri = None
            if ri is None:
                if len(info) > 4096:
                    info.clear()
                ri = info[h] = (_record_batch(h), any(k == MARKER_HEADER for k, _v in h))
            b, markers = ri
            if markers:
                # a run that may hold commit markers: record by record (a marker ends its group)
                for i in range(s, e):
                    if keys[i] == MARKER_KEY:
                        self._commit(_marker_batch(cols.values[i], h), offsets[i] + 1, out_k, out_v)
                    else:
                        self._segments.append(_Segment(
                            offsets[i:i + 1], cols.timestamps[i:i + 1], keys[i:i + 1],
                            cols.values[i:i + 1], h, b))
            elif whole:
                self._segments.append(_Segment(offsets, cols.timestamps, keys, cols.values, h, b))
            else:
                self._segments.append(_Segment(offsets[s:e], cols.timestamps[s:e], keys[s:e],
                                               cols.values[s:e], h, b))
        self.records_read += len(offsets)
        if next_offset is not None:
            self.position = next_offset
            if not self._segments and next_offset > self.group_start:
                # nothing since the last marker but offsets without records (a transaction's
                # control marker, a compaction gap): replaying from past them is as safe
                self.group_start = next_offset
                if not self._held_keys:
                    self.safe_offset = self.held_safe = next_offset
        elif offsets:
            self.position = offsets[-1] + 1
        self.records_applied += len(out_k)
        return out_k, out_v

    def _commit(self, m: int, after: int, out_k: list, out_v: list) -> None:
        self.markers += 1
        group_start = self.group_start
        if m > self.batch:
            # a newer batch is committed here: the held records (batch M < m) are safe now
            if self._held_keys:
                out_k.extend(self._held_keys)
                out_v.extend(self._held_values)
                self._held_keys = []
                self._held_values = []
            self.applied_batch = self.batch if self.batch > self.applied_batch else self.applied_batch
            self.batch = m
            self.held_safe = group_start
        hk, hv = self._held_keys, self._held_values
        M = self.batch
        for g in self._segments:
            b = g.batch
            if b is not None and b > m:
                self.superseded += len(g.keys)   # a crashed attempt a seal superseded
            elif b is None or b >= M:
                hk.extend(g.keys)
                hv.extend(g.values)
            else:
                out_k.extend(g.keys)
                out_v.extend(g.values)
        self._segments = []
        self.group_start = after
        if not hk:
            self.applied_batch = M
            self.safe_offset = after
            self.held_safe = after
        else:
            self.safe_offset = self.held_safe

    # -- settling the task's batch ------------------------------------------------------------------
    def drop_pending(self) -> list:
        """Forget the uncommitted tail (records after the last marker); returns their keys."""
        keys = [k for g in self._segments for k in g.keys]
        self._segments = []
        return keys

    def release_held_columns(self) -> tuple[list, list]:
        """Every store agrees the latest batch is committed: ``(keys, values)`` to apply."""
        keys, values = self._held_keys, self._held_values
        self.records_applied += len(keys)
        self._held_keys = []
        self._held_values = []
        self.applied_batch = self.batch
        self.safe_offset = self.group_start
        self.held_safe = self.group_start
        return keys, values

    def release_held(self, out: list | None = None) -> list:
        """Every store agrees the latest batch is committed: apply the held records."""
        out = [] if out is None else out
        out.extend(zip(*self.release_held_columns()))
        return out

    def drop_held(self) -> int:
        """Another store did not commit the latest batch: forget it here too (Spark replays it)."""
        n = len(self._held_keys)
        self._held_keys = []
        self._held_values = []
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
    throttled_to: Optional[float] = None  # records/s the restore was held to (None: full speed)
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


# progress: the listener hears of every WriteBatch; a batch holds at most this many records and
# about PROGRESS_S seconds of work, so a progress bar moves at least every ~0.1 s
PROGRESS_RECORDS = 50_000
PROGRESS_S = 0.05
MIN_STEP = 1_000
# Fetch size of a restore: small responses keep the broker reading the next one while this one
# is decoded and applied (measured on the embedded broker: 1 MB restores ~1.5x faster than 8 MB,
# and the progress bar moves every ~15 ms instead of every ~150 ms)
RESTORE_FETCH_BYTES = 1 << 20


def check_rate(rate) -> Optional[float]:
    """A restore rate limit: None (full speed) or records per second > 0."""
    if rate is None:
        return None
    try:
        r = float(rate)
    except (TypeError, ValueError):
        r = float("nan")
    if not r > 0 or r == float("inf"):
        from statekit.errors import StatekitError

        raise StatekitError(f"restore_rate must be a number of records per second > 0, or None "
                            f"for full speed (got {rate!r})")
    return r


class Pacer:
    """Holds a restore to ``rate`` records/s, smoothly: it sleeps after each small WriteBatch
    until its records are due, never once at the end; after a stall (a slow fetch) it does not
    burst to catch up, so no window longer than ``PROGRESS_S`` runs faster than the rate."""

    def __init__(self, rate: float, clock=time.monotonic, sleep=time.sleep):
        self.rate = float(rate)
        self.clock = clock
        self.sleep = sleep
        self.due: Optional[float] = None
        self.slept = 0.0

    def start(self) -> None:
        if self.due is None:
            self.due = self.clock()

    def step(self) -> int:
        """Records per WriteBatch so that each wait is at most ~PROGRESS_S."""
        return max(1, int(self.rate * PROGRESS_S))

    def pace(self, n: int) -> None:
        self.start()
        now = self.clock()
        self.due = max(self.due, now - PROGRESS_S) + n / self.rate
        wait = self.due - now
        if wait > 0:
            self.slept += wait
            self.sleep(wait)


# the apply rate of the last full-speed restore of this process (statekit.state.forecast uses it)
_last_rate: Optional[tuple[float, int]] = None  # (records/s, records)
MEASURE_MIN = 20_000  # a restore shorter than this says little about the rate


def last_restore_rate() -> Optional[float]:
    """Records/s of the last unthrottled restore of at least MEASURE_MIN records in this
    process (None if there was none)."""
    return _last_rate[0] if _last_rate is not None else None


def restore_stores(db, kafka, partition: int, plan: dict, *, listener=None, crash=None,
                   max_bytes: int | None = None, exclude=(), rate: float | None = None,
                   remember: bool = True) -> tuple[dict, int]:
    """Replay every store of ``plan`` (``{store: (topic, start_offset, end_offset, base_batch,
    replayed_from)}``) into ``db``. Returns ``({store: RestoreMetrics}, task_batch)``. Stores in
    ``exclude`` (changelogs created just now, empty) do not take part in settling the batch.
    ``rate``: at most this many changelog records per second over the whole task (teaching).
    ``remember``: an unthrottled restore's rate becomes ``last_restore_rate()`` (not a forecast's
    calibration).

    Each Fetch response (``max_bytes``, default ``RESTORE_FETCH_BYTES``) is decoded column-wise
    and applied in WriteBatches of up to ``PROGRESS_RECORDS`` records (about ``PROGRESS_S`` of
    work each), the next Fetch already in flight; the listener hears of each."""
    rate = check_rate(rate)
    pacer = Pacer(rate) if rate is not None else None
    replays: dict[str, StoreReplay] = {}
    metrics: dict[str, RestoreMetrics] = {}
    writes = 0
    step = pacer.step() if pacer is not None else PROGRESS_RECORDS
    write_columns = getattr(db, "write_batch_columns", None)
    for store, (topic, start, end, base_batch, origin) in plan.items():
        rp = StoreReplay(store, start, base_batch)
        replays[store] = rp
        m = RestoreMetrics(store, partition, origin, start, end, records_remaining=max(0, end - start),
                           throttled_to=rate)
        metrics[store] = m
        t0 = time.perf_counter()
        if listener is not None:
            listener.on_restore_start(store, partition, start, end)
        if end > start:
            if pacer is not None:
                pacer.start()
            reader = kafka.read(topic, partition, start, end, columns=True,
                                max_bytes=max_bytes or RESTORE_FETCH_BYTES, isolation=COMMITTED)
            mk = meta_key(store)
            try:
                for chunk in reader:
                    cols = chunk.columns
                    n = len(cols)
                    i = 0
                    while True:
                        j = min(n, i + step)
                        last = j >= n
                        piece = cols if i == 0 and last else cols.slice(i, j)
                        tw = time.perf_counter()
                        keys, values = rp.feed_columns(piece, chunk.next_offset if last else None)
                        if write_columns is not None:
                            write_columns(store, keys, values, {mk: rp.meta()})
                        else:
                            db.write_batch_raw(store, list(zip(keys, values)), {mk: rp.meta()})
                        writes += 1
                        m.records_restored = rp.records_read
                        m.records_remaining = max(0, end - rp.position)
                        if listener is not None:
                            listener.on_batch_restored(store, partition, rp.position, j - i)
                        if crash is not None:
                            crash.hit("mid_restore", writes)
                        if pacer is not None:
                            pacer.pace(j - i)
                        elif j - i >= MIN_STEP:
                            # about PROGRESS_S of work per WriteBatch at the pace just measured
                            per = (time.perf_counter() - tw) / (j - i)
                            step = max(MIN_STEP, min(PROGRESS_RECORDS, int(PROGRESS_S / per)
                                                     if per > 0 else PROGRESS_RECORDS))
                        i = j
                        if last:
                            break
            finally:
                reader.close()  # an abandoned read drains its in-flight Fetch now, not at GC
        m.records_restored = rp.records_read
        m.records_remaining = 0
        m.duration_s = time.perf_counter() - t0
    read = sum(m.records_restored for m in metrics.values())
    took = sum(m.duration_s for m in metrics.values())
    if remember and pacer is None and read >= MEASURE_MIN and took > 0:
        global _last_rate
        _last_rate = (read / took, read)
    # every store read: settle the latest batch
    voters = [rp.batch for name, rp in replays.items() if name not in exclude]
    task_batch = min(voters, default=NO_BATCH)
    for store, rp in replays.items():
        m = metrics[store]
        tail = rp.drop_pending()
        m.dropped_uncommitted = len(tail)
        m.dropped_keys.update(tail)
        if rp.batch <= task_batch or store in exclude:
            keys, values = rp.release_held_columns()
        else:
            m.dropped_keys.update(rp._held_keys)
            m.dropped_uncommitted += rp.drop_held()
            rp.applied_batch = min(rp.applied_batch, task_batch)
            keys, values = [], []
        meta = {meta_key(store): rp.meta(), "batch": task_batch}
        if write_columns is not None:
            write_columns(store, keys, values, meta)
        else:
            db.write_batch_raw(store, list(zip(keys, values)), meta)
        m.records_applied = rp.records_applied
        m.superseded = rp.superseded
        if listener is not None:
            listener.on_restore_end(store, partition, m.records_restored)
    return metrics, task_batch
