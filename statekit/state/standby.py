"""Standby replicas: the restore loop that never stops, in another state directory.

A :class:`StandbyReplica` keeps a copy of a task's stores in its own ``<state_dir>/<app>/<task>/``
and tails the task's changelog partitions from a background thread (its own Kafka connection),
applying committed groups only (the same :class:`~statekit.state.restore.StoreReplay` as
restoration: records wait for their marker; the latest batch waits until every store of the task
has committed it). Its progress goes to RocksDB with the data, as during a restore.

``lag()`` is what a promotion would still replay: changelog end - the standby's safe offset, summed
over the stores. ``promote()`` stops tailing, writes the checkpoint and returns the task directory;
a ``TaskState`` opened on it replays only that lag.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from statekit.contracts import TaskId, changelog_topic
from statekit.errors import StatekitError, UnknownTopic
from statekit.state import checkpoint as ckpt
from statekit.state.restore import COMMITTED, NO_BATCH, StoreReplay, meta_key
from statekit.state.task import _Lock, task_dir_for

log = logging.getLogger("statekit.state")


class _NoSink:
    def append(self, store, key, value):
        raise StatekitError("a standby replica does not process records: promote it first")

    def extend(self, store, keys, values):
        self.append(store, None, None)


class StandbyReplica:
    def __init__(self, application: str, task_id: int, specs, *, state_dir: str,
                 bootstrap: str | None = None, poll_ms: int = 100,
                 fetch_max_bytes: int | None = None, listener=None,
                 request_timeout: float = 30.0):
        from statekit.bootstrap import resolve_bootstrap
        from statekit.stores import build_stores

        self.application = application
        # a contracts.TaskId (sub-topology, partition), or a bare partition
        self.task_id = task_id if isinstance(task_id, TaskId) else int(task_id)
        self.partition = int(getattr(task_id, "partition", task_id))
        self.specs = [s for s in specs if getattr(s, "logging", True)]
        self.state_dir = state_dir
        self.task_dir = task_dir_for(state_dir, application, task_id)
        self.bootstrap = resolve_bootstrap(bootstrap)
        self.poll_ms = poll_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.listener = listener
        self.request_timeout = float(request_timeout)
        os.makedirs(self.task_dir, exist_ok=True)
        self._lock = _Lock(self.task_dir)
        try:
            self.stores, self.db = build_stores(list(specs), task_dir=self.task_dir, sink=_NoSink(),
                                                cache_bytes=0)
        except BaseException:
            self._lock.release()
            raise
        meta = self.db.read_meta()
        self._kafka = None                   # the thread's client (made when it first polls)
        self._query = None                   # for lag() from other threads
        self.replays: dict[str, StoreReplay] = {}
        for spec in self.specs:
            m = meta.get(meta_key(spec.name))
            if m is not None and self.db.persistent(spec.name):
                self.replays[spec.name] = StoreReplay(spec.name, int(m["offset"]), int(m["batch"]))
            else:
                self.replays[spec.name] = StoreReplay(spec.name, -1, NO_BATCH)
        self.records_applied = 0
        self.error: BaseException | None = None
        self.waiting_since: float | None = None   # epoch s: Kafka has been away since then
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dblock = threading.Lock()

    # -- the tailing loop ---------------------------------------------------------------------
    def start(self) -> "StandbyReplica":
        """Start (or resume, after :meth:`stop`) tailing in a background thread."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"standby-{self.application}-"
                                            f"{self.task_id}", daemon=True)
            self._thread.start()
        return self

    def _client(self):
        from statekit.kafka import Kafka

        if self._kafka is None:
            self._kafka = Kafka(self.bootstrap, timeout=self.request_timeout)
        return self._kafka

    def _run(self):
        from statekit.kafka.retry import Backoff, retriable

        backoff = Backoff(first=self.poll_ms / 1000.0)
        while not self._stop.is_set():
            try:
                got = self.poll_once(self._client())
                self.error = self.waiting_since = None
                backoff.reset()
            except UnknownTopic as e:  # the active task has not created the changelog yet
                self.error = e
                got = 0
            except StatekitError as e:
                self.error = e
                got = 0
                if retriable(e):   # Kafka is away: keep trying, further apart, and say it once
                    k, self._kafka = self._kafka, None
                    if k is not None:
                        k.close()
                    if self.waiting_since is None:
                        self.waiting_since = time.time()
                        log.info("standby %s/%s waits for Kafka: %s", self.application, self.task_id, e)
                    self._stop.wait(backoff.next())
                    continue
                log.warning("standby %s/%s: %s", self.application, self.task_id, e)
            if not got:
                self._stop.wait(self.poll_ms / 1000.0)

    def poll_once(self, kafka=None) -> int:
        """One round over the stores: fetch, apply committed groups. Returns records read."""
        k = kafka or self._client()
        got = 0
        for name, rp in self.replays.items():
            topic = changelog_topic(self.application, name)
            if rp.position < 0:
                lso = k.begin_offsets(topic, [self.partition])[self.partition]
                rp.position = rp.safe_offset = rp.group_start = rp.held_safe = lso
            chunk = k.fetch(topic, self.partition, rp.position, max_wait_ms=0,
                            max_bytes=self.fetch_max_bytes, isolation=COMMITTED, columns=True)
            n = len(chunk)
            if n or chunk.next_offset != rp.position:
                keys, values = rp.feed_columns(chunk.columns, chunk.next_offset)
                got += n
                with self._dblock:
                    self.db.write_batch_columns(name, keys, values, {meta_key(name): rp.meta()})
                self.records_applied += len(keys)
                if self.listener is not None and n:
                    self.listener.on_batch_restored(name, self.partition, chunk.next_offset, n)
        self._settle()
        return got

    def _settle(self):
        """Apply the latest batch of the stores once every store has committed it."""
        low = min((rp.batch for rp in self.replays.values()), default=NO_BATCH)
        for name, rp in self.replays.items():
            if rp.batch <= low and (rp.has_held() or rp.safe_offset != rp.group_start):
                keys, values = rp.release_held_columns()
                with self._dblock:
                    self.db.write_batch_columns(name, keys, values,
                                                {meta_key(name): rp.meta(), "batch": low})
                self.records_applied += len(keys)

    # -- observation -------------------------------------------------------------------------
    def positions(self) -> dict:
        """``{store: offset}`` from which a promoted task would replay."""
        return {n: rp.safe_offset for n, rp in self.replays.items()}

    def lag(self) -> int:
        """Changelog records a promotion would still replay (end offset - safe offset, summed)."""
        from statekit.kafka import Kafka

        if self._query is None:
            self._query = Kafka(self.bootstrap, timeout=self.request_timeout)
        total = 0
        for name, rp in self.replays.items():
            try:
                end = self._query.end_offsets(changelog_topic(self.application, name),
                                              [self.partition], COMMITTED)[self.partition]
            except UnknownTopic:
                continue
            total += max(0, end - max(rp.safe_offset, 0))
        return total

    def wait_caught_up(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            lag = self.lag()
            if lag == 0 or time.monotonic() > deadline:
                return lag
            time.sleep(0.05)

    @property
    def last_batch(self) -> int:
        return min((rp.applied_batch for rp in self.replays.values()), default=NO_BATCH)

    # -- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop tailing (the store stays open; its lag grows until :meth:`start` again)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def promote(self) -> str:
        """Stop tailing and hand the directory over: returns the task dir for the active task
        (open ``TaskState(app, task, specs, state_dir=<this state_dir>)``)."""
        self.stop()
        meta = self.db.read_meta()
        stores = {}
        for spec in self.specs:
            m = meta.get(meta_key(spec.name))
            if m is not None and self.db.persistent(spec.name):
                stores[spec.name] = {"changelog_offset": m["offset"], "batch": m["batch"]}
        if stores:
            self.db.sync_wal()
            ckpt.write(self.task_dir, stores)
        self.close()
        return self.task_dir

    def close(self) -> None:
        self.stop()
        for k in (self._kafka, self._query):
            if k is not None:
                k.close()
        self._kafka = self._query = None
        if self.db is not None:
            self.db.close()
            self.db = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
