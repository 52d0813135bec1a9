"""A stream task: one partition of one sub-topology, open on an instance across micro-batches.

    task = StreamTask(spec, TaskId(0, 3), state_dir, instance=1, publish=pub.publish)  # restores
    task.process(batch_id, records)      # runs the batch, commits it, returns its output count
    task.close()

Opening restores the task's stores (``statekit.state.TaskState``: checkpoint, standby copy or the
whole changelog), publishing restore events. ``process``:

1. a batch id already applied (a replay after a crash) is skipped: its outputs were acknowledged
   with its commit, nothing is done twice;
2. otherwise the records (in the order the engine gives: timestamp, source, partition, offset,
   sequence) run through ``plan.new_processor``, which is then flushed (an aggregation over a
   caching store forwards the latest value of each key it updated, once per batch, in first-update
   order, as Kafka Streams' KTable cache does; with caching off every update);
3. the outputs: to Kafka for sink and repartition topics (sent with the changelog records in commit
   step 2), or to the memory sink's file for this batch (``statekit.worker.output``), written before
   the commit so that a replay rewrites the same file;
4. ``TaskState.commit(batch_id)``: the changelog records and markers, one RocksDB WriteBatch, the
   checkpoint;
5. a ``Committed`` event.

The task's stream time and the processor's ``ctx.meta`` live in an internal kv store (``_task``,
logged: a task restored elsewhere resumes them). It exists when the plan needs it (windows,
punctuation, suppress: ``Plan.needs_task_store``).

``run_task_batch`` opens a task, runs one batch and closes it: for engines that cannot keep a task
open (a Spark cluster's executors, where the next batch may land on another host) and for tests.

Crash directives (``statekit.worker.crash``): ``records`` is checked after every record of a batch
(and before the first when ``after_records`` is 0); the commit and restore points through the state
layer's crash hooks. The claimer publishes a ``Crashed`` event and SIGKILLs its process.
"""
from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from statekit import events as ev
from statekit.contracts import ControlDir, TaskId
from statekit.errors import ProcessorError, StatekitError
from statekit.worker import hold

_Q = struct.Struct(">q")


def task_store_name(subtopology: int) -> str:
    """The internal store of a sub-topology's tasks (its changelog partition is the task's)."""
    return "_task" if int(subtopology) == 0 else f"_task{int(subtopology)}"


def is_task_store(name: str) -> bool:
    return name == "_task" or (name.startswith("_task") and name[5:].isdigit())


def transactional_id(application: str, task) -> str:
    """A task's Kafka ``transactional.id``: one per task, so a new owner fences the old one."""
    return f"{application}-{task}"


def _needs_task_store(plan) -> bool:
    need = getattr(plan, "needs_task_store", None)
    return bool(need) if need is not None else bool(getattr(plan, "has_windows", False))


def store_specs(plan, subtopology: int = 0) -> list:
    """The StoreSpecs of a sub-topology's task: its plan's stores, plus ``_task`` when needed."""
    from statekit.stores import StoreSpec

    specs = list(plan.stores)
    if _needs_task_store(plan):
        specs.append(StoreSpec(task_store_name(subtopology), kind="kv", key_serde="bytes",
                               value_serde="bytes", caching=False))
    return specs


@dataclass
class WorkerSpec:
    """What an instance needs to run an application's tasks (picklable: plans hold user code)."""

    application: str
    bootstrap: str
    plans: dict                          # sub-topology -> its Plan
    partitions: int                      # tasks per sub-topology (= changelog partitions)
    control_dir: str
    cache_bytes: int = 10 << 20
    sink: str = "memory"                 # memory | kafka | none: where the plans' sink topics go
    repartition_topics: tuple = ()       # always written to Kafka
    exactly_once: bool = False           # every commit one Kafka transaction (transactional.id
    #                                      "<app>-<task>"); else at-least-once output
    events: bool = True
    task_timeout: float = 300.0          # seconds a task waits for Kafka before it fails
    #                                      (Kafka Streams' task.timeout.ms; statekit.kafka.retry)
    extra: dict = field(default_factory=dict)

    @property
    def request_timeout(self) -> float:
        """The request timeout of the instances' Kafka clients (a tenth of the task timeout)."""
        from statekit.kafka.retry import request_timeout_for

        return request_timeout_for(self.task_timeout)

    def kafka(self):
        """A Kafka client for a task or a replica of this application."""
        from statekit.kafka import Kafka

        return Kafka(self.bootstrap, timeout=self.request_timeout)

    def plan(self, subtopology: int):
        p = self.plans.get(int(subtopology))
        if p is None:
            raise StatekitError(f"{self.application} has no sub-topology {subtopology} "
                                f"(it has {sorted(self.plans)})")
        return p

    @property
    def control(self) -> ControlDir:
        return ControlDir(self.control_dir)


# -- crash hooks -------------------------------------------------------------------------------

_CRASH_CLASS = None


def _crash_hooks(control_dir, instance, task, publish):
    """The state layer's crash hook (``hit(point, n)``) that also obeys the App's directives."""
    global _CRASH_CLASS
    if _CRASH_CLASS is None:
        from statekit.state import CrashPlan

        class TaskCrashHooks(CrashPlan):
            def __init__(self, control_dir, instance, task, publish):
                super().__init__("", "kill")
                self.control_dir = control_dir
                self.instance = instance
                self.task = task
                self.batch = None
                self.records = None
                self.publish = publish
                env = CrashPlan(None, None)   # STATEKIT_CRASH, as the state layer's own tests use it
                self.env = env if env else None
                self._path = os.path.join(control_dir, "crash.json") if control_dir else None

            def __bool__(self) -> bool:
                return True

            def pending(self) -> Optional[dict]:
                if self._path is None or not os.path.exists(self._path):
                    return None
                from statekit.worker.crash import read_directive

                return read_directive(self.control_dir)

            def check(self, point: str, records: Optional[int] = None) -> None:
                if self._path is None or not os.path.exists(self._path):
                    return
                from statekit.worker import crash as crash_mod

                d = crash_mod.claim(self.control_dir, self.instance, point, records,
                                    str(self.task), self.batch)
                if d is None:
                    return
                try:
                    self.publish(ev.Crashed(instance=self.instance, task=str(self.task), point=point,
                                            mode=d.get("mode", "process"), directive=d.get("id", ""),
                                            batch=self.batch, records=records))
                finally:
                    crash_mod.die(d)

            def hit(self, point: str, n: Optional[int] = None) -> None:
                self.check(point, self.records)
                if self.env:
                    self.env.hit(point, n)

        _CRASH_CLASS = TaskCrashHooks
    return _CRASH_CLASS(control_dir, instance, task, publish)


def _records_threshold(directive, instance) -> Optional[int]:
    """after_records of a pending "records" directive meant for this instance, else None."""
    if not directive or directive.get("point") != "records":
        return None
    want = directive.get("instance")
    if want is not None and instance is not None and int(want) != int(instance):
        return None
    return int(directive.get("after_records") or 0)


# -- restore events ----------------------------------------------------------------------------

class RestoreCancelled(StatekitError):
    """The task was taken away from this instance while it restored."""


class _RestoreEvents:
    """The state layer's restore listener -> RestoreStarted / RestoreProgress events; it also
    stops a restore whose task was taken away (``cancel()`` true)."""

    INTERVAL_S = 0.2

    def __init__(self, publish, task, instance, source, throttle=None, cancel=None,
                 control_dir=None) -> None:
        self.cancel = cancel
        self.control_dir = control_dir    # where App.hold_restores() writes (statekit.worker.hold)
        self.held_s: dict = {}            # store -> seconds its restore was held
        self.publish = publish
        self.task = str(task)
        self.instance = instance
        self.source = source
        self.throttle = throttle
        self.starts: dict = {}
        self.last_emit: dict = {}
        self.restored: dict = {}
        self.origins: dict = {}

    def on_restore_plan(self, origins: dict) -> None:
        """The state layer's plan: per store, "checkpoint" (local state) or "scratch" (none)."""
        self.origins = dict(origins)

    def on_restore_start(self, store, partition, start_offset, end_offset) -> None:
        self.starts[store] = (time.perf_counter(), start_offset, end_offset)
        self.restored[store] = 0
        if end_offset <= start_offset or is_task_store(store):
            return  # nothing to restore (every open reports every store)
        source = "scratch" if self.origins.get(store) == "scratch" else self.source
        self.publish(ev.RestoreStarted(task=self.task, instance=self.instance, store=store,
                                       source=source, start_offset=start_offset,
                                       end_offset=end_offset, to_replay=end_offset - start_offset,
                                       throttle_rps=self.throttle))

    def on_batch_restored(self, store, partition, batch_end_offset, num_restored) -> None:
        if self.cancel is not None and self.cancel():
            raise RestoreCancelled(f"task {self.task} was revoked while it restored")
        self.restored[store] = self.restored.get(store, 0) + num_restored
        if is_task_store(store):
            return
        now = time.perf_counter()
        t0, start, end = self.starts.get(store, (now, 0, 0))
        if hold.holds(self.control_dir, self.task, batch_end_offset - start, end - start):
            self._hold(store, batch_end_offset, end, t0)
            return
        if now - self.last_emit.get(store, 0.0) < self.INTERVAL_S:
            return
        self.last_emit[store] = now
        self._progress(store, batch_end_offset, end, t0)

    def _progress(self, store, offset, end, t0, held: bool = False) -> None:
        took = max(time.perf_counter() - t0 - self.held_s.get(store, 0.0), 1e-9)
        self.publish(ev.RestoreProgress(task=self.task, instance=self.instance, store=store,
                                        offset=offset, restored=self.restored[store],
                                        remaining=max(0, end - offset),
                                        rate_rps=self.restored[store] / took, held=held))

    def _hold(self, store, offset, end, t0) -> None:
        """Stop here until the hold is released (``App.release_restores()``) or the task is
        taken away; the time held is not the restore's."""
        self._progress(store, offset, end, t0, held=True)
        since = time.perf_counter()
        try:
            while os.path.exists(hold.path(self.control_dir)) and \
                    hold.holds(self.control_dir, self.task, offset - self.starts[store][1],
                               end - self.starts[store][1]):
                if self.cancel is not None and self.cancel():
                    raise RestoreCancelled(f"task {self.task} was revoked while its restore was held")
                time.sleep(0.1)
        finally:
            self.held_s[store] = self.held_s.get(store, 0.0) + time.perf_counter() - since
        self.last_emit[store] = time.perf_counter()
        self._progress(store, offset, end, t0)

    def on_restore_end(self, store, partition, total_restored) -> None:
        self.restored[store] = total_restored  # the RestoreEnded event carries TaskState's metrics


# -- the processor's view of the task -----------------------------------------------------------

class _TaskContext:
    """What ``plan.new_processor`` gets: ids, stores, forward, stream time, the record cache size
    (``cache_bytes > 0``: aggregations over caching stores forward on flush) and ``meta``, a
    JSON-able dict persisted with each commit (processor bookkeeping that must survive a crash).
    Outputs are kept in forwarding order as segments: Python objects (``forward``) or bytes
    already in the sink's serdes (``forward_columns``, from a bulk aggregation)."""

    def __init__(self, task: TaskId, batch_id, state, stream_time, cache_bytes, meta) -> None:
        self.task = task
        self.task_id = task.partition
        self.partition = task.partition
        self.subtopology = task.subtopology
        self.batch_id = batch_id
        self._state = state
        self.stream_time = stream_time
        self.cache_bytes = cache_bytes
        self.meta = meta
        self.outputs: list = []     # segments: [topic, encoded?, keys, values, timestamps]
        self.count = 0

    def get_store(self, name: str):
        return self._state.store(name)

    def forward(self, topic: str, key, value, timestamp=None) -> None:
        segs = self.outputs
        if segs and segs[-1][0] == topic and not segs[-1][1]:
            seg = segs[-1]
        else:
            seg = [topic, False, [], [], []]
            segs.append(seg)
        seg[2].append(key)
        seg[3].append(value)
        seg[4].append(timestamp)
        self.count += 1

    def forward_columns(self, topic: str, keys: list, values: list, timestamps: list) -> None:
        self.outputs.append([topic, True, keys, values, timestamps])
        self.count += len(keys)


def _short(x, n=40) -> str:
    s = " ".join(repr(x).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _serialize_outputs(plan, segments) -> list:
    """Output segments in the sink topics' serdes: ``[(topic, keys, values, timestamps)]``."""
    out = []
    cache: dict = {}
    for topic, encoded, keys, values, stamps in segments:
        if encoded:
            out.append((topic, keys, values, stamps))
            continue
        sd = cache.get(topic)
        if sd is None:
            sd = cache[topic] = plan.sink_serdes(topic)
        kenc, venc = sd[0].to_bytes, sd[1].to_bytes
        kbs, vbs = [], []
        for k, v in zip(keys, values):
            try:
                kbs.append(None if k is None else kenc(k))
                vbs.append(None if v is None else venc(v))
            except Exception as e:
                from statekit.topology.graph import serde_label

                spec = next(s for s in plan.sinks if s.topic == topic)
                raise ProcessorError(
                    f"cannot serialize an output to {topic} (key={_short(k)} value={_short(v)}) "
                    f"with serdes {serde_label(spec.key_serde)}/{serde_label(spec.value_serde)}: "
                    f"{type(e).__name__}: {e}; pass key_serde=/value_serde= to .to()") from e
        out.append((topic, kbs, vbs, stamps))
    return out


def _by_partition(arr):
    """``(partition, positions)`` groups of a segment's records (``arr``: their partitions, an
    int array), each in record order (positions None: every record is in that one partition)."""
    import numpy as np

    if not len(arr):
        return []
    if (arr == arr[0]).all():
        return [(int(arr[0]), None)]
    order = np.argsort(arr, kind="stable")
    keys, starts = np.unique(arr[order], return_index=True)
    bounds = list(starts[1:]) + [len(arr)]
    return [(int(p), order[a:b].tolist()) for p, a, b in zip(keys.tolist(), starts.tolist(), bounds)]


def _cache_stats(state) -> dict:
    cache = {}
    try:
        stats = state.db.stats() if state.db is not None else {}
    except Exception:
        stats = {}
    for name, st in (stats or {}).items():
        if is_task_store(name) or not isinstance(st, dict):
            continue
        c = dict(st.get("cache") or {})
        c["ops"] = {op: v.get("count") for op, v in st.items() if isinstance(v, dict) and "count" in v}
        cache[name] = c
    return cache


def _store_rows(state) -> dict:
    rows = {}
    for name, store in state.stores.items():
        if is_task_store(name):
            continue
        try:
            rows[name] = store.approximate_count()
        except Exception:
            pass
    return rows


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


class StreamTask:
    """See the module docstring. Not thread-safe: its host serialises calls per task."""

    def __init__(self, spec: WorkerSpec, task: TaskId, state_dir: str, *, instance: Optional[int],
                 publish: Callable, kafka=None, generation: Optional[int] = None,
                 source: str = "checkpoint", restore_rate: Optional[float] = None,
                 sink_partitions: Optional[dict] = None,
                 cancel: Optional[Callable[[], bool]] = None) -> None:
        from statekit.state import TaskState

        self.spec = spec
        self.task = TaskId.parse(task)
        self.instance = instance
        self.generation = generation
        self.publish = publish
        self.plan = spec.plan(self.task.subtopology)
        self.tstore_name = task_store_name(self.task.subtopology)
        self.crash = _crash_hooks(spec.control_dir, instance, self.task, publish)
        self._sink_partitions = dict(sink_partitions or {})
        t0 = time.perf_counter()
        self.notices: list = []
        listener = _RestoreEvents(publish, self.task, instance, source, restore_rate, cancel,
                                  control_dir=spec.control_dir)
        self._own_kafka = None
        self.producer = None
        if kafka is None:
            kafka = self._own_kafka = spec.kafka()
        try:
            if spec.exactly_once:
                # before the restore: it fences a previous owner and aborts what it left open, so
                # the restore reads up to the end of the changelog
                self.producer = kafka.transactional_producer(transactional_id(spec.application,
                                                                              self.task))
            self.state = TaskState(spec.application, self.task,
                                   store_specs(self.plan, self.task.subtopology),
                                   state_dir=state_dir, kafka=kafka, num_tasks=spec.partitions,
                                   cache_bytes=spec.cache_bytes, crash=self.crash, listener=listener,
                                   warn=self.notices.append, restore_rate=restore_rate,
                                   producer=self.producer)
        except BaseException:
            self._release()
            raise
        self.open_ms = (time.perf_counter() - t0) * 1000.0
        self.source = source if self.state.replayed_from != "scratch" else "scratch"
        restored = 0
        evs = []
        for name, m in (self.state.restore_metrics or {}).items():
            md = m.as_dict()
            restored += int(md.get("records_restored") or 0)
            if is_task_store(name) or not (md.get("lag") or md.get("records_restored")):
                continue
            held = listener.held_s.get(name, 0.0)   # a learner's hold is not restore time
            secs = max(0.0, (md.get("duration_s") or 0.0) - held)
            rate = (md.get("records_restored") or 0) / secs if held and secs > 0 else md.get("rate") or 0.0
            evs.append(ev.RestoreEnded(
                task=str(self.task), instance=instance, store=name, source=self.source,
                start_offset=md.get("start_offset") or 0, end_offset=md.get("end_offset") or 0,
                restored=md.get("records_restored") or 0, applied=md.get("records_applied") or 0,
                seconds=secs, rate_rps=rate,
                dropped_uncommitted=md.get("dropped_uncommitted") or 0,
                throttle_rps=md.get("throttled_to")))
        self.restored = restored
        evs.append(ev.TaskOpened(task=str(self.task), instance=instance, source=self.source,
                                 last_batch=self.state.last_batch, restored=restored,
                                 open_ms=self.open_ms, notices=list(self.notices)))
        for e in evs:
            publish(e)

    @property
    def last_batch(self) -> int:
        return self.state.last_batch

    # -- outputs ---------------------------------------------------------------------------
    def _partitions_of(self, topic: str) -> int:
        n = self._sink_partitions.get(topic)
        if n is None:
            n = self._sink_partitions[topic] = self.state.kafka.partition_counts([topic]).get(topic, 0)
            if n <= 0:
                raise StatekitError(f"sink topic {topic} does not exist: create it, or start with "
                                    f"sink='memory'")
        return n

    def _route_outputs(self, outputs) -> tuple:
        """(records for Kafka per (topic, partition), in forwarding order; outputs for the memory
        sink). A record's partition is Kafka's default partitioner's (all keys of a segment
        hashed at once); a None key goes to the task's partition."""
        from statekit.partition import partitions_for
        from statekit.wire import Columns

        to_kafka: dict = {}
        memory = []
        repart = set(self.spec.repartition_topics)
        sink = self.spec.sink
        for topic, kbs, vbs, stamps in outputs:
            if topic in repart or sink == "kafka":
                n = self._partitions_of(topic)
                parts = partitions_for(kbs, n)            # -1 for a None key: the task's own
                if None in kbs:
                    parts[parts < 0] = self.task.partition % n
                for p, sel in _by_partition(parts):
                    cols = to_kafka.get((topic, p))
                    if cols is None:
                        cols = to_kafka[(topic, p)] = ([], [], [])
                    if sel is None:
                        cols[0].extend(kbs)
                        cols[1].extend(vbs)
                        cols[2].extend(stamps)
                    else:
                        cols[0].extend(map(kbs.__getitem__, sel))
                        cols[1].extend(map(vbs.__getitem__, sel))
                        cols[2].extend(map(stamps.__getitem__, sel))
            elif sink == "memory":
                memory.extend(zip([topic] * len(kbs), kbs, vbs))
        now = int(time.time() * 1000)
        items = []
        for (t, p), (ks, vs, ts) in sorted(to_kafka.items()):
            if None in ts:   # a punctuator's output has no record time: the wall clock's
                ts = [now if x is None else x for x in ts]
            items.append((t, p, Columns.of(ks, vs, timestamps=ts)))
        return items, memory

    # -- a micro-batch ---------------------------------------------------------------------
    def read_input(self, ranges, values_kept=None) -> "Records":
        """The batch's records from its offset ranges ``[(topic, partition, start, end)]``
        (``values_kept``: see ``read_ranges``)."""
        from statekit.worker.batch_input import read_ranges

        return read_ranges(self.state.kafka, self.plan, ranges, values_kept=values_kept)

    def process(self, batch_id: int, batch, from_spool: bool = False) -> int:
        """Run and commit one micro-batch: ``batch`` is its offset ranges (read here) or its
        `Records`. Returns the number of outputs (none for a skipped batch: they were written with
        its first commit)."""
        from statekit.topology.records import Records
        from statekit.worker.output import write_outputs

        batch_id = int(batch_id)
        state = self.state
        task_s = str(self.task)
        if state.already_applied(batch_id):
            self.publish(ev.BatchSkipped(task=task_s, instance=self.instance, batch=batch_id,
                                         last_batch=state.last_batch))
            return 0
        crash = self.crash
        crash.batch = batch_id
        crash.records = None
        t_proc = time.perf_counter()
        try:
            tstore = state.stores.get(self.tstore_name)
            stream_time, meta = -1, {}
            if tstore is not None:
                raw = tstore.get(b"stream_time")
                if raw is not None:
                    stream_time = _Q.unpack(raw)[0]
                raw = tstore.get(b"meta")
                if raw is not None:
                    meta = json.loads(raw)
            ctx = _TaskContext(self.task, batch_id, state, stream_time, self.spec.cache_bytes, meta)
            proc = self.plan.new_processor(ctx)
            t_read = time.perf_counter()
            kept = getattr(proc, "values_kept", None)
            records = batch if isinstance(batch, Records) else \
                self.read_input(batch, kept() if kept is not None else None)
            read_ms = (time.perf_counter() - t_read) * 1000.0
            threshold = _records_threshold(crash.pending(), self.instance)
            if threshold is not None and threshold <= 0:
                crash.check("records", 0)
                threshold = None  # claimed by another worker
            n = len(records)
            if threshold is not None and threshold < n:
                # a crash "after N records": the first N go through, then the directive is
                # claimed (the process dies here); if another instance claimed it, the rest follow
                proc.process_batch(records.slice(0, threshold))
                crash.records = threshold
                crash.check("records", threshold)
                proc.process_batch(records.slice(threshold, n))
            else:
                proc.process_batch(records)
            punctuate = getattr(proc, "punctuate_wall_clock", None)
            if punctuate is not None:
                punctuate(int(time.time() * 1000))
            proc.flush()   # cached aggregations forward the latest value per key, once per batch
            proc.close()
            crash.records = n
            outputs = self.last_outputs = _serialize_outputs(self.plan, ctx.outputs)
            to_kafka, memory = self._route_outputs(outputs)
            if tstore is not None:
                if proc.stream_time >= 0:
                    tstore.put(b"stream_time", _Q.pack(proc.stream_time))
                if ctx.meta:
                    tstore.put(b"meta", json.dumps(ctx.meta, sort_keys=True).encode())
            process_ms = (time.perf_counter() - t_proc) * 1000.0
            if memory:
                write_outputs(self.spec.control.output_dir(task_s), batch_id, memory)
            cache = _cache_stats(state)  # before commit: the cache still holds this batch
            info = state.commit(batch_id, extra=to_kafka)
        except BaseException as exc:
            state.abort()  # drop the uncommitted writes: the batch is replayed
            from statekit.kafka.retry import retriable

            if isinstance(exc, Exception) and not retriable(exc):   # Kafka away: its host waits
                self.publish(ev.TaskFailed(task=task_s, instance=self.instance, batch=batch_id,
                                           error=one_line(exc), kind=type(exc).__name__))
            raise
        self.publish(ev.Committed(
            task=task_s, instance=self.instance, batch=batch_id, records=n, outputs=ctx.count,
            changelog={k: v for k, v in info.records.items() if not is_task_store(k)},
            offsets={k: v for k, v in info.offsets.items() if not is_task_store(k)},
            commit_ms=info.ms, process_ms=process_ms, read_ms=read_ms, cache=cache,
            rows=_store_rows(state),
            stream_time=proc.stream_time, dropped_late=proc.dropped_late,
            skipped_null=proc.skipped_null, from_spool=from_spool))
        return ctx.count

    last_outputs: list = []

    def flat_outputs(self) -> list:
        """The last processed batch's outputs, ``[(topic, key bytes, value bytes)]`` in order."""
        return [(t, k, v) for t, ks, vs, _ts in self.last_outputs for k, v in zip(ks, vs)]

    def positions(self) -> dict:
        """``{store: changelog offset of the local state}`` (what a restore would start from)."""
        from statekit.state.restore import meta_key

        meta = self.state.db.read_meta() if self.state.db is not None else {}
        return {s.name: (meta.get(meta_key(s.name)) or {}).get("offset")
                for s in self.state.logged_specs}

    @property
    def txn_phase(self):
        """How far the last commit's transaction got (``TaskState.txn_phase``)."""
        return self.state.txn_phase

    def _release(self, abort: bool = True) -> None:
        p, self.producer = self.producer, None
        if p is not None:
            try:
                p.close(abort=abort)
            except Exception:  # noqa: BLE001 - fenced or gone: nothing left to release
                pass
        k, self._own_kafka = self._own_kafka, None
        if k is not None:
            k.close()

    def close(self, reason: str = "revoked") -> None:
        if self.state.closed:
            return
        self.state.close()
        self._release()
        self.publish(ev.TaskClosed(task=str(self.task), instance=self.instance, reason=reason))

    def abandon(self) -> None:
        """Close without a word to Kafka (a kill, or a broker that is away): memory dropped,
        nothing committed; the next open aborts the transaction left open and replays."""
        self.state.abandon()
        self._release(abort=False)


def run_task_batch(spec: WorkerSpec, task, batch_id: int, batch, *, state_dir: str,
                   instance: Optional[int] = None, publish: Optional[Callable] = None,
                   kafka=None) -> int:
    """Open ``task`` in ``state_dir``, run one batch (offset ranges or `Records`), close it (see
    the module docstring)."""
    publish = publish or (lambda e: None)
    t = StreamTask(spec, task, state_dir, instance=instance, publish=publish, kafka=kafka)
    try:
        return t.process(batch_id, batch)
    except BaseException as exc:
        from statekit.kafka.retry import retriable

        if retriable(exc):   # Kafka is away: no EndTxn that would only wait out its timeout
            t.abandon()
        raise
    finally:
        t.close(reason="stopped")
