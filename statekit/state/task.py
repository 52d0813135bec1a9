"""The task state manager: one task's directory, stores, changelog sink and commit protocol.

``TaskState`` owns ``<state_dir>/<application>/<task>/`` (RocksDB in ``rocksdb/``, the
``.checkpoint`` file, a ``.lock`` file held with ``fcntl.flock`` while the task is open), builds the
task's stores over one RocksDB (``statekit.stores.build_stores``), restores them on open
(:mod:`statekit.state.restore`) and commits an input batch with the four steps of the commit
protocol (docs/ARCHITECTURE.md):

1. ``db.flush()``: every cache hands its dirty entries to the change-logging layer, which appends
   them to this module's sink (buffered per store, in memory);
2. per store changelog: the buffered records (header ``statekit.batch=b``) then one commit marker
   (key ``__statekit.commit__``, header ``statekit.marker=1``, value ``{"batch": b}``), acks=all;
3. one RocksDB WriteBatch: every store's pending writes + meta (``batch`` = b and, per store,
   ``changelog.<store>`` = the changelog position after the commit: the offset right after its
   marker, or with a transaction the broker's last stable offset once it is past that — never
   offset arithmetic on the transaction's own end marker, whose size is the broker's business);
4. the checkpoint file, written atomically.

Trust on open (what local state restoration starts from):

* RocksDB meta and checkpoint agree, or the meta is *ahead* of the checkpoint (a crash between steps 3
  and 4: RocksDB only ever holds whole commits, so its meta is right) -> replay from the meta offsets;
* no checkpoint (never written, deleted, or corrupt — one line says so) -> the RocksDB meta;
* the checkpoint is ahead of the meta (RocksDB replaced by an older copy, or its directory deleted or
  unreadable — one line says so), or a store's offset is past its changelog's end (the topic was
  recreated with other data) -> the local state is not trusted: wiped, replayed from the log start.

A missing changelog topic: when the local store is intact and trusted it is the only copy of the
state, so we warn in one line, recreate the topic and re-seed it from the store (its records plus a
commit marker), so future restores work; when the local state is missing too there is nothing to
restore: the topic is created and the store starts empty, said in one line. The same applies when
the topic exists but its partition is empty while the trusted local state says it held data (it
was deleted and recreated, e.g. by another task of the application).
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from statekit import contracts
from statekit.errors import CorruptState, StatekitError, StateLocked, UnknownTopic
from statekit.state import checkpoint as ckpt
from statekit.state.crash import CrashPlan, SimulatedCrash
from statekit.state.restore import (BATCH_HEADER, COMMITTED, MARKER_HEADER, MARKER_KEY, NO_BATCH,
                                    RestoreMetrics, check_rate, meta_key, restore_stores)

log = logging.getLogger("statekit.state")

LOCK_FILE = ".lock"


def task_dir_for(state_dir: str, application: str, task_id) -> str:
    return contracts.task_dir(state_dir, application, task_id)


def _segmented(spec) -> bool:
    """Window and session stores: retention by time, changelog keys `key + time`."""
    return getattr(spec, "kind", "kv") in ("window", "session")


# Kafka Streams' windowstore.changelog.additional.retention.ms: a changelog's retention runs on the
# records' (wall-clock) append time, the store's on event time, so the topic keeps a day more
CHANGELOG_ADDITIONAL_RETENTION_MS = 86_400_000


def changelog_configs(spec) -> dict:
    if _segmented(spec):
        cfg = {"cleanup.policy": "compact,delete"}
        ret = getattr(spec, "retention_ms", None)
        if ret:
            cfg["retention.ms"] = str(int(ret) + int(getattr(spec, "window_size_ms", 0) or 0)
                                      + CHANGELOG_ADDITIONAL_RETENTION_MS)
        return cfg
    return {"cleanup.policy": "compact"}


class _Lock:
    """An exclusive ``flock`` on ``<task_dir>/.lock``; the kernel drops it when the process dies."""

    def __init__(self, task_dir: str):
        self.path = os.path.join(task_dir, LOCK_FILE)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = ""
            try:
                holder = os.pread(self.fd, 32, 0).decode().strip()
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateLocked(f"task directory {task_dir} is in use by another process"
                                  f"{' (pid ' + holder + ')' if holder else ''}: stop it, or give "
                                  f"this one another state_dir") from None
            raise
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def release(self):
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None


class ChangelogBuffer:
    """The task's ``ChangelogSink``: buffers every write per store, as parallel key and value
    lists, until the commit sends them (encoded column-wise)."""

    def __init__(self):
        self.buffers: dict[str, tuple] = {}

    def _lists(self, store: str) -> tuple:
        b = self.buffers.get(store)
        if b is None:
            b = self.buffers[store] = ([], [])
        return b

    def append(self, store: str, key: bytes, value: Optional[bytes]) -> None:
        keys, values = self._lists(store)
        keys.append(key)
        values.append(value)

    def extend(self, store: str, keys: list, values: list) -> None:
        ks, vs = self._lists(store)
        ks.extend(keys)
        vs.extend(values)

    def take(self, store: str) -> list:
        """The store's buffered records as ``[(key, value)]`` (and forget them)."""
        keys, values = self.buffers.pop(store, ([], []))
        return list(zip(keys, values))

    def take_columns(self, store: str) -> tuple:
        """The store's buffered ``(keys, values)`` lists (and forget them)."""
        return self.buffers.pop(store, ([], []))

    def clear(self) -> None:
        self.buffers.clear()

    def __len__(self):
        return sum(len(b[0]) for b in self.buffers.values())


@dataclass
class CommitInfo:
    batch: int
    records: dict  # store -> changelog records sent (markers excluded)
    offsets: dict  # store -> changelog position after the commit (see the module docstring)
    ms: float


def _armed(crash, point: str, batch: int) -> bool:
    """Would ``crash.hit(point, batch)`` fire? (Its own plan, or the environment plan the
    runtime's crash hooks forward to.)"""
    for plan in (crash, getattr(crash, "env", None)):
        armed = getattr(plan, "armed", None)
        if armed is not None and armed(point, batch):
            return True
    return False


def _build(specs, task_dir, sink, cache_bytes, changelog_topic=None):
    from statekit.stores import build_stores

    return build_stores(specs, task_dir=task_dir, sink=sink, cache_bytes=cache_bytes,
                        changelog_topic=changelog_topic)


class TaskState:
    """One task's state. See the module docstring for the protocol and the trust rules.

    ``kafka``: a ``statekit.kafka.Kafka`` (or ``bootstrap``). ``num_tasks``: the partition count of
    the changelog topics created on demand (= the number of tasks). ``crash``: a crash plan string
    (``"after_ack@3"``) or :class:`CrashPlan`; default: ``STATEKIT_CRASH``. ``listener``: restore
    callbacks (``on_restore_start`` / ``on_batch_restored`` / ``on_restore_end``). ``warn``: where
    one-line notices go (default: the ``statekit.state`` logger); every notice is also kept in
    ``self.notices``. ``restore_rate``: hold the restore to this many changelog records per second
    (smoothly, for teaching: a restore slow enough to watch); None = full speed. It shows in
    ``restore_metrics[store].throttled_to``.
    """

    def __init__(self, application: str, task_id: int, specs: Iterable, *, state_dir: str,
                 kafka=None, bootstrap: str | None = None, num_tasks: int = 1,
                 cache_bytes: int = 10 * 1024 * 1024, crash=None, crash_mode: str | None = None,
                 listener=None, warn: Callable[[str], None] | None = None,
                 fetch_max_bytes: int | None = None, topic_configs: dict | None = None,
                 restore: bool = True, restore_rate: float | None = None, producer=None):
        self.restore_rate = check_rate(restore_rate)  # bad input: one line, before anything opens
        # a transactional producer (statekit.kafka.TransactionalProducer): each commit is one
        # Kafka transaction; created before the restore, it has aborted what a dead owner left open
        self.producer = producer
        self.application = application
        # a contracts.TaskId (sub-topology, partition), or a bare partition
        self.task_id = task_id if isinstance(task_id, contracts.TaskId) else int(task_id)
        self.partition = int(getattr(task_id, "partition", task_id))
        self.specs = list(specs)
        self.state_dir = state_dir
        self.task_dir = task_dir_for(state_dir, application, task_id)
        self.num_tasks = max(int(num_tasks), self.partition + 1)
        self.cache_bytes = cache_bytes
        self.listener = listener
        self.fetch_max_bytes = fetch_max_bytes
        self.topic_configs = dict(topic_configs or {})
        self.notices: list[str] = []
        self._warn_fn = warn
        self.crash = crash if isinstance(crash, CrashPlan) else CrashPlan(crash, crash_mode)
        self._own_kafka = kafka is None
        if kafka is None:
            from statekit.kafka import Kafka

            kafka = Kafka(bootstrap)
        self.kafka = kafka
        self.sink = ChangelogBuffer()
        self.db = None
        self.stores: dict = {}
        self.last_batch = NO_BATCH
        self.restore_metrics: dict[str, RestoreMetrics] = {}
        self.replayed_from = "none"
        # the transaction of the last commit: None (none open), "open" (records sent, no EndTxn
        # yet: a failure now means it aborts) or "ending" (EndTxn sent: committed or not)
        self.txn_phase: Optional[str] = None
        self.closed = False
        os.makedirs(self.task_dir, exist_ok=True)
        self._lock = _Lock(self.task_dir)
        try:
            self._open(restore)
        except SimulatedCrash:
            self.abandon()
            raise
        except BaseException:
            self._teardown()
            raise

    # -- notices -------------------------------------------------------------------------------
    def _warn(self, msg: str, level: int = logging.WARNING) -> None:
        msg = " ".join(str(msg).split())
        self.notices.append(msg)
        if self._warn_fn is not None:
            self._warn_fn(msg)
        else:
            log.log(level, msg)

    # -- properties ------------------------------------------------------------------------------
    @property
    def logged_specs(self) -> list:
        return [s for s in self.specs if getattr(s, "logging", True)]

    def topic(self, store: str) -> str:
        return contracts.changelog_topic(self.application, store)

    # -- open & restore --------------------------------------------------------------------------
    def _open_db(self):
        try:
            return _build(self.specs, self.task_dir, self.sink, self.cache_bytes, self.topic)
        except CorruptState as e:
            self._warn(f"task {self.application}/{self.task_id}: local RocksDB is unreadable "
                       f"({str(e)[:120]}); deleting it and restoring from the changelog")
            from statekit.stores import TaskDB

            TaskDB.destroy(self.task_dir)
            self._rocks_reset = True
            return _build(self.specs, self.task_dir, self.sink, self.cache_bytes, self.topic)

    def _open(self, restore: bool) -> None:
        rocks_dir = os.path.join(self.task_dir, "rocksdb")
        had_rocks = os.path.isdir(rocks_dir) and os.path.exists(os.path.join(rocks_dir, "CURRENT"))
        cp = ckpt.read(self.task_dir, warn=self._warn)
        self.stores, self.db = self._open_db()
        meta = self.db.read_meta()
        names = [s.name for s in self.logged_specs]
        had_local = cp is not None or bool(meta) or had_rocks
        if cp is not None and not meta:
            if not getattr(self, "_rocks_reset", False):  # (already said in one line)
                self._warn(f"task {self.application}/{self.task_id}: a checkpoint exists but the "
                           f"local RocksDB {'is empty' if had_rocks else 'directory is missing'}; "
                           f"restoring from the changelog start")
            ckpt.remove(self.task_dir)
            cp = None
        trusted = bool(meta)
        if trusted and cp is not None:
            for name in names:
                m = meta.get(meta_key(name))
                c = cp.get(name)
                if c is None:
                    continue
                if m is None or c.changelog_offset > m["offset"] or c.batch > m["batch"]:
                    self._warn(f"task {self.application}/{self.task_id}: checkpoint and RocksDB "
                               f"disagree for store {name!r} (checkpoint {c.changelog_offset}/batch "
                               f"{c.batch}, RocksDB {m}); not trusting local state, restoring from "
                               f"the changelog start")
                    trusted = False
                    break
        if not restore:
            self.last_batch = int(meta.get("batch", NO_BATCH)) if trusted else NO_BATCH
            return

        ends: dict[str, int] = {}
        begins: dict[str, int] = {}
        missing: list[str] = []
        present = [s.name for s in self.logged_specs]
        # the common case, every changelog there: each (begin, end) offset pair in one pipelined
        # round trip. A missing topic or partition answers UnknownTopic: then look (Metadata for
        # this task's changelogs only) and ask again for the ones that exist.
        try:
            offs = self.kafka.offsets_many([self.topic(n) for n in present], self.partition, COMMITTED)
        except UnknownTopic:
            existing = self.kafka.partition_counts(self.topic(n) for n in present)
            present = []
            for spec in self.logged_specs:
                t = self.topic(spec.name)
                if t not in existing:
                    missing.append(spec.name)
                    continue
                if existing[t] <= self.partition:
                    raise StatekitError(f"changelog {t} has {existing[t]} partition(s) but task "
                                        f"{self.task_id} needs partition {self.partition}: the "
                                        f"number of tasks changed; reset the application's state")
                present.append(spec.name)
            offs = self.kafka.offsets_many([self.topic(n) for n in present], self.partition, COMMITTED)
        for name in present:
            begins[name], ends[name] = offs[self.topic(name)]

        # a store whose changelog lost its data while the trusted local copy has some: re-seed
        reseed: list[str] = []
        if trusted:
            for spec in self.logged_specs:
                name = spec.name
                m = meta.get(meta_key(name))
                if name in missing:
                    if m and m["offset"] > 0 and self.db.persistent(name):
                        reseed.append(name)
                    continue
                if m is None:
                    continue
                if m["offset"] > ends[name]:
                    if ends[name] == 0 and self.db.persistent(name):
                        reseed.append(name)
                    else:
                        self._warn(f"task {self.application}/{self.task_id}: local state of store "
                                   f"{name!r} is at changelog offset {m['offset']} but "
                                   f"{self.topic(name)} ends at {ends[name]}; not trusting local "
                                   f"state, restoring from the changelog start")
                        trusted = False
                        break
        if not trusted:
            reseed = []
            if meta:
                self.db.wipe()
            meta = {}
        fresh = [n for n in missing if n not in reseed]
        if fresh:
            self._warn(f"task {self.application}/{self.task_id}: changelog topic(s) "
                       f"{', '.join(self.topic(n) for n in fresh)} do not exist and there is no "
                       f"local state for {', '.join(repr(n) for n in fresh)}: nothing to restore, "
                       f"starting empty (topics created)",
                       logging.INFO if not had_local and len(fresh) == len(names)
                       else logging.WARNING)  # a brand-new task is no cause for alarm
        for name in missing:
            spec = next(s for s in self.logged_specs if s.name == name)
            self._create_topic(spec)
            ends[name] = begins[name] = 0
        for name in reseed:
            self._reseed(name, meta, name in missing)
            meta = self.db.read_meta()
            ends[name] = meta[meta_key(name)]["offset"]

        # the restore plan
        base_batch = int(meta.get("batch", NO_BATCH)) if meta else NO_BATCH
        plan = {}
        origins = set()
        for spec in self.logged_specs:
            name = spec.name
            m = meta.get(meta_key(name)) if meta else None
            if m is not None and self.db.persistent(name):
                start, b = int(m["offset"]), int(m["batch"])
                origin = "checkpoint" if cp is not None and name in cp else "meta"
                if start < begins[name]:
                    if not _segmented(spec):
                        self._warn(f"task {self.application}/{self.task_id}: {self.topic(name)} "
                                   f"starts at {begins[name]}, past the local state's offset "
                                   f"{start}; records in between were deleted, restoring from "
                                   f"{begins[name]}")
            else:
                start, b, origin = begins[name], NO_BATCH, "scratch"
            origins.add(origin)
            plan[name] = (self.topic(name), start, ends[name], b, origin)
        lag = sum(max(0, p[2] - p[1]) for p in plan.values())
        on_plan = getattr(self.listener, "on_restore_plan", None)
        if on_plan is not None:  # where each store restores from, before it starts
            on_plan({name: p[4] for name, p in plan.items()})
        if lag > 0:
            ckpt.remove(self.task_dir)  # from now on RocksDB's meta is the record of progress
            cp = None  # (gone from disk: written again below)
            self.restore_metrics, task_batch = restore_stores(
                self.db, self.kafka, self.partition, plan, listener=self.listener, crash=self.crash,
                max_bytes=self.fetch_max_bytes, exclude=fresh, rate=self.restore_rate)
            self.db.sync_wal()
        else:
            self.restore_metrics = {}
            for name, (t, s, e, b, origin) in plan.items():
                self.restore_metrics[name] = RestoreMetrics(name, self.partition, origin, s, e,
                                                            throttled_to=self.restore_rate)
                if self.listener is not None:
                    self.listener.on_restore_start(name, self.partition, s, e)
                    self.listener.on_restore_end(name, self.partition, 0)
            task_batch = base_batch
        self._seal_dropped(task_batch)
        if fresh and task_batch != NO_BATCH:
            # a store that starts empty beside restored ones: its new changelog gets a marker at the
            # task's batch, so a later restore does not read it as "never committed anything"
            for name in fresh:
                last = self._send_store(name, [], task_batch)
                self.db.write_batch_raw(name, [], {meta_key(name): {"offset": last + 1,
                                                                    "batch": task_batch}})
        self.replayed_from = ("scratch" if origins == {"scratch"} else
                              "checkpoint" if "scratch" not in origins else "mixed") if plan else "none"
        self.db.recount()   # a restore does not keep its stores' exact key counts
        meta = self.db.read_meta()
        self.last_batch = int(meta.get("batch", task_batch)) if meta else task_batch
        if meta and any(meta_key(n) in meta for n in names):
            # unchanged (nothing restored, sealed, re-seeded or wiped): the file on disk already
            # says exactly this, and rewriting it costs two fsyncs per open
            if self._checkpoint_entries(meta) != cp:
                self._write_checkpoint(meta)

    def _seal_dropped(self, task_batch: int) -> None:
        """Re-commit the keys of dropped changelog records. Log compaction keeps the *latest*
        record per key, and a dropped record (an uncommitted tail, or a batch another store did
        not commit) is later than the committed value it shadows: once the cleaner runs, that
        committed value would be gone from the log. Until the task writes again the dropped records
        sit in the active segment, past the first uncleanable offset (the broker's cleaner, like
        Kafka's, never maps them), so this is the moment to act: after a restore that dropped
        records, each such key gets its restored value (or a tombstone) again, closed by a marker
        at the task's batch. Window stores too: their changelog key is ``key + window_start``, so a crashed
        attempt's record of a window shadows that window's committed value in the same way; their
        restored values are read in changelog form (``TaskDB.changelog_items``). A window that has
        expired locally gets a tombstone (a restore from scratch drops it by retention anyway)."""
        for spec in self.logged_specs:
            m = self.restore_metrics.get(spec.name)
            if m is None or not m.dropped_keys:
                continue
            keys = sorted(k for k in m.dropped_keys if k is not None and k != MARKER_KEY)
            if _segmented(spec):
                want = set(keys)
                found = {k: v for k, v in self.db.changelog_items(spec.name) if k in want}
                repairs = [(key, found.get(key)) for key in keys]
            else:
                repairs = []
                for key in keys:
                    hit = next(iter(self.db.items(spec.name, key, key + b"\x00")), None)
                    repairs.append((key, hit[1] if hit is not None and hit[0] == key else None))
            last = self._send_store(spec.name, repairs, task_batch)
            self.db.write_batch_raw(spec.name, [], {meta_key(spec.name): {"offset": last + 1,
                                                                          "batch": task_batch}})
            m.sealed = len(repairs)
        if any(getattr(m, "sealed", 0) for m in self.restore_metrics.values()):
            self.db.sync_wal()

    def _create_topic(self, spec) -> None:
        cfg = changelog_configs(spec)
        cfg.update(self.topic_configs)
        self.kafka.ensure_topic(self.topic(spec.name), self.num_tasks, cfg)

    def _reseed(self, name: str, meta: dict, missing: bool) -> None:
        spec = next(s for s in self.logged_specs if s.name == name)
        # changelog form: for a window store, key + window_start without the segment prefix
        items = list(self.db.changelog_items(name))
        self._warn(f"task {self.application}/{self.task_id}: changelog topic {self.topic(name)} "
                   f"{'is missing' if missing else 'was emptied'} but the local store {name!r} is "
                   f"intact; {'recreating it and ' if missing else ''}re-seeding it from the store "
                   f"({len(items)} records)")
        self._create_topic(spec)
        batch = int(meta.get("batch", NO_BATCH))
        last = self._send_store(name, items, batch)
        self.db.write_batch_raw(name, [], {meta_key(name): {"offset": last + 1, "batch": batch}})

    @staticmethod
    def _changelog_records(keys: list, values: list, batch: int):
        """A store's changelog records of one commit (header ``statekit.batch``) + its marker, as
        columns (encoded without a Python step per record)."""
        from statekit.wire import Columns

        bh = ((BATCH_HEADER, str(batch).encode()),)
        n = len(keys)
        runs = [(0, n, bh)] if n else []
        runs.append((n, n + 1, ((MARKER_HEADER, b"1"), (BATCH_HEADER, str(batch).encode()))))
        return Columns.of(list(keys) + [MARKER_KEY],
                          list(values) + [json.dumps({"batch": batch}).encode()], runs=runs)

    def _send_store(self, name: str, records: list, batch: int) -> int:
        keys = [k for k, _v in records]
        values = [v for _k, v in records]
        return self.kafka.send_many([(self.topic(name), self.partition,
                                      self._changelog_records(keys, values, batch))])[0]

    def _checkpoint_entries(self, meta: dict) -> dict:
        stores = {}
        for spec in self.logged_specs:
            m = meta.get(meta_key(spec.name))
            if m is not None and self.db.persistent(spec.name):
                stores[spec.name] = ckpt.StoreCheckpoint(int(m["offset"]), int(m["batch"]))
        return stores

    def _write_checkpoint(self, meta: dict) -> None:
        ckpt.write(self.task_dir, self._checkpoint_entries(meta))

    # -- processing ------------------------------------------------------------------------------
    def already_applied(self, batch_id: int) -> bool:
        """True when input batch ``batch_id`` is already in the state (skip it: Spark replays)."""
        return int(batch_id) <= self.last_batch

    def store(self, name: str):
        return self.stores[name]

    def __getitem__(self, name: str):
        return self.stores[name]

    def commit(self, batch_id: int, extra=()) -> CommitInfo:
        """Commit the writes made since the last commit as input batch ``batch_id``.

        ``extra``: ``[(topic, partition, [(key, value)])]`` the task produced for the batch (sink and
        repartition topics); they go out with the changelog records in step 2, so that a committed
        batch's outputs are acknowledged before its marker counts."""
        self._check_open()
        b = int(batch_id)
        if b <= self.last_batch:
            raise StatekitError(f"batch {b} is already applied by task {self.task_id} (last "
                                f"{self.last_batch}): check already_applied() before processing")
        t0 = time.perf_counter()
        crash = self.crash
        try:
            # 1. caches -> sink
            self.db.flush()
            crash.hit("before_send", b)
            # 2. changelog records + one marker per store, acked (one Kafka transaction with a
            #    producer: nothing of the batch is visible to read_committed readers before step 2
            #    ends, and a crash before then leaves a transaction the next owner aborts)
            txp = self.producer
            send_many = txp.send_many if txp is not None else self.kafka.send_many
            if txp is not None:
                txp.begin()
                self.txn_phase = "open"
            offsets, counts = {}, {}
            extra = [x for x in extra if x[2]]
            together = ((len(self.logged_specs) > 1 or extra) and not _armed(crash, "between_stores", b)
                        and not _armed(crash, "mid_send", b))
            if together:
                # every store's records + marker in flight at once, then every ack (a kill in
                # between leaves any subset of the stores committed: restoration settles on the
                # smallest committed batch, exactly as for a kill between sequential sends)
                names = [spec.name for spec in self.logged_specs]
                recs = {n: self.sink.take_columns(n) for n in names}
                lasts = send_many(
                    extra + [(self.topic(n), self.partition, self._changelog_records(*recs[n], b))
                             for n in names])
                for n, last in zip(names, lasts[len(extra):]):
                    counts[n] = len(recs[n][0])
                    offsets[n] = last + 1   # right after the store's commit marker
            elif extra:
                send_many(extra)
            for i, spec in enumerate(self.logged_specs if not together else ()):
                if i:
                    crash.hit("between_stores", b)
                keys, values = self.sink.take_columns(spec.name)
                recs = list(zip(keys, values))
                if i == 0 and _armed(crash, "mid_send", b):
                    # the damage a kill in the middle of the send leaves: part of the records, no marker
                    part = recs[: max(1, len(recs) // 2)] if recs else []
                    bh = [(BATCH_HEADER, str(b).encode())]
                    if part:
                        send_many([(self.topic(spec.name), self.partition,
                                    [(k, v, bh) for k, v in part])])
                    crash.hit("mid_send", b)
                counts[spec.name] = len(recs)
                last = send_many([(self.topic(spec.name), self.partition,
                                   self._changelog_records(keys, values, b))])[0]
                offsets[spec.name] = last + 1
            crash.hit("before_commit", b)
            if txp is not None:
                self.txn_phase = "ending"   # from here a lost answer leaves the outcome unknown
                txp.commit()
                offsets = self._positions_after_commit(offsets)
            self.txn_phase = None
            crash.hit("after_ack", b)
            # 3. one RocksDB WriteBatch: data + meta
            meta = {"batch": b}
            for name, off in offsets.items():
                meta[meta_key(name)] = {"offset": off, "batch": b}
            self.db.commit(meta)
            self.last_batch = b
            crash.hit("after_rocksdb", b)
        except SimulatedCrash:
            raise
        except BaseException as exc:
            # the batch failed: drop its writes; Spark replays it (same id, same values)
            self.abort()
            from statekit.kafka.retry import retriable

            if self.producer is not None and not retriable(exc):
                # (a broker that is away would only let the EndTxn wait out its timeout: the task's
                # next producer aborts the transaction, its txn_phase says how far it got)
                self.txn_phase = None
                try:
                    self.producer.abort()
                except StatekitError:
                    pass   # fenced or gone: whoever owns the task now aborted it
            raise
        # 4. checkpoint
        try:
            self._write_checkpoint(meta)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            from statekit.errors import DiskFull

            # RocksDB holds batch b (its meta is ahead of the old checkpoint: trusted at open)
            raise DiskFull(f"the disk of the state directory is full: the checkpoint of task "
                           f"{self.task_id} (stores {', '.join(repr(s.name) for s in self.logged_specs)}) "
                           f"could not be written at {self.task_dir} ({e.strerror}); its stores hold "
                           f"batch {b}: free space there, then restart()") from None
        return CommitInfo(b, counts, offsets, (time.perf_counter() - t0) * 1000.0)

    def _positions_after_commit(self, offsets: dict) -> dict:
        """Where each changelog stands for a read_committed reader once the transaction is
        committed: the broker's last stable offset, past the transaction's end marker however many
        offsets the broker gave it (one on Kafka, none on a broker that writes no markers), but
        never before the offset right after the store's own commit marker (Kafka writes the end
        markers just after EndTxn answers: until then its last stable offset is lower). The
        changelog has no other writer (the producer fenced any). One pipelined round trip; if it
        fails, the offset after the marker stands (a restore reads past the end marker)."""
        try:
            ends = self.kafka.offsets_many([self.topic(n) for n in offsets], self.partition, COMMITTED)
        except StatekitError:
            return offsets
        return {n: max(off, ends[self.topic(n)][1]) for n, off in offsets.items()}

    def abort(self) -> None:
        """Drop every write since the last commit (the batch will be replayed)."""
        self.sink.clear()
        if self.db is not None:
            self.db.discard()

    def lag(self) -> dict:
        """``{store: changelog end - local offset}`` right now."""
        meta = self.db.read_meta()
        out = {}
        for spec in self.logged_specs:
            m = meta.get(meta_key(spec.name), {"offset": 0})
            end = self.kafka.end_offsets(self.topic(spec.name), [self.partition],
                                         COMMITTED)[self.partition]
            out[spec.name] = max(0, end - m["offset"])
        return out

    # -- shutdown ----------------------------------------------------------------------------------
    def _check_open(self):
        if self.closed:
            raise StatekitError(f"task {self.application}/{self.task_id} is closed")

    def _teardown(self):
        try:
            if self.db is not None:
                self.db.close()
        finally:
            self.db = None
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            if self._own_kafka and self.kafka is not None:
                self.kafka.close()
            self.closed = True

    def close(self) -> None:
        """Clean close: uncommitted writes are dropped (they were never committed)."""
        if self.closed:
            return
        self.abort()
        self._teardown()

    def abandon(self) -> None:
        """The in-process model of a kill: drop every buffer, close the RocksDB handle with nothing
        written, release the lock. See :mod:`statekit.state.crash` for why this equals SIGKILL."""
        if self.closed:
            return
        self.sink.clear()
        try:
            if self.db is not None:
                self.db.discard()  # memory only: drops caches and pending overlays
        except Exception:  # noqa: BLE001 - a crashed task may be in any state
            pass
        self._teardown()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, SimulatedCrash):
            self.abandon()
        else:
            self.close()
