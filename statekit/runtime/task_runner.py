"""Run one task's micro-batch: the code an engine calls in its workers (Spark stage 2, or the local
engine in tests).

    outputs = run_task_batch(spec, task, batch_id, records)

1. open the task's state (``statekit.state.TaskState``): restoration, with restore events;
2. a batch id already applied (Spark replays a batch after a failure) is skipped, and the outputs
   that batch produced are re-emitted from the task's *outbox*;
3. otherwise the records (as given: the engine orders them) run through ``plan.new_processor``,
   then the processor is flushed. Forwarding rule (``statekit.topology.plan.TaskProcessor``): an
   aggregation whose store has caching on (the default; the task's ``cache_bytes > 0``) forwards only
   the latest value of each key it updated in the batch, once, at that flush, in first-update order
   (one output per key per commit, as Kafka Streams' KTable cache); with caching off
   (``caching=False`` or ``cache_bytes <= 0``) it forwards every update;
4. the batch's outputs are written to the outbox and the task's stream time saved, then
   ``TaskState.commit(batch_id)`` commits them with the stores' data in one RocksDB WriteBatch
   (and their changelog, like every store);
5. events are published, the task closed, the outputs returned as
   ``[(sink_topic, key_bytes, value_bytes)]`` (serialized with the plan's sink serdes).

The outbox and the stream time live in an internal kv store, ``_task`` (bytes/bytes, logged: a task
restored on another instance re-emits the same outputs). It exists only when the plan says it needs
it (``plan.needs_task_store``: sinks, windows, joins, suppression, processors). Its keys:
``stream_time`` (8-byte big-endian), ``meta`` (JSON: the processor's ``ctx.meta``, its operators'
stream times and punctuation schedules), ``outbox`` (JSON ``{"batch", "chunks", "records"}``) and
``outbox.00000``... (the records, length-prefixed binary, <= 256 KB per chunk).

Crash directives (``statekit.runtime.crash``): ``records`` is checked after every record of the
batch (and before the first when ``after_records`` is 0); the commit and restore points through the
state layer's crash hooks. The task that claims a directive publishes a ``crash`` event and SIGKILLs
its own process.

``records``: ``(route, source_partition, offset, timestamp, key_pickle, value_pickle)`` tuples as
``Plan.shuffle`` makes them.
"""
from __future__ import annotations

import json
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from statekit.errors import ProcessorError, StatekitError

TASK_STORE = "_task"
CHUNK_BYTES = 256 * 1024
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_H = struct.Struct(">H")


@dataclass
class TaskRunSpec:
    """What a task needs to run a batch (picklable: it travels to Spark workers)."""

    application: str
    bootstrap: str
    partitions: int
    plan: Any
    state_dirs: dict = field(default_factory=dict)      # task -> state dir (the instance's disk)
    state_dir: Optional[str] = None                      # for tasks missing from state_dirs
    task_instances: dict = field(default_factory=dict)  # task -> instance id
    cache_bytes: int = 10 << 20
    control_dir: Optional[str] = None
    events: bool = True
    extra: dict = field(default_factory=dict)            # e.g. {"generation": 3}

    def state_dir_for(self, task: int) -> str:
        d = self.state_dirs.get(task)
        if d is None:
            d = self.state_dirs.get(str(task))
        if d is None:
            d = self.state_dir
        if d is None:
            raise StatekitError(f"no state directory for task {task} of {self.application}: the run "
                                f"spec's state_dirs covers tasks {sorted(self.state_dirs)}")
        return d

    def instance_for(self, task: int):
        inst = self.task_instances.get(task)
        return self.task_instances.get(str(task)) if inst is None else inst

    @classmethod
    def from_run(cls, run) -> "TaskRunSpec":
        """From a ``statekit.engine.spec.RunSpec`` (what the App hands the Spark engine)."""
        extra = dict(getattr(run, "extra", None) or {})
        return cls(application=run.app, bootstrap=run.bootstrap, partitions=run.partitions,
                   plan=run.plan, state_dirs=dict(getattr(run, "state_dirs", None) or {}),
                   state_dir=extra.get("state_dir"),
                   task_instances=dict(getattr(run, "task_instances", None) or {}),
                   cache_bytes=getattr(run, "cache_bytes", 10 << 20),
                   control_dir=getattr(run, "control_dir", None),
                   events=bool(extra.get("events", True)), extra=extra)


def as_task_spec(spec) -> TaskRunSpec:
    if isinstance(spec, TaskRunSpec):
        return spec
    if hasattr(spec, "app") and hasattr(spec, "plan"):
        return TaskRunSpec.from_run(spec)
    raise TypeError(f"run_task_batch needs a TaskRunSpec or a RunSpec, got {type(spec).__name__}")


# -- per-process Kafka clients for task state (workers are reused; not shared across threads) ----

_KAFKA: dict = {}


def _kafka(bootstrap: str):
    from statekit.kafka import Kafka

    key = (os.getpid(), threading.get_ident(), bootstrap)
    k = _KAFKA.get(key)
    if k is None:
        k = _KAFKA[key] = Kafka(bootstrap)
    return k


def _drop_kafka(bootstrap: str) -> None:
    k = _KAFKA.pop((os.getpid(), threading.get_ident(), bootstrap), None)
    if k is not None:
        try:
            k.close()
        except Exception:
            pass


def close_clients() -> None:
    for k in list(_KAFKA.values()):
        try:
            k.close()
        except Exception:
            pass
    _KAFKA.clear()


# -- outbox encoding ---------------------------------------------------------------------------

def encode_outputs(outputs) -> list:
    """[(topic, key_bytes|None, value_bytes|None)] -> list of chunks (bytes)."""
    chunks, buf, size = [], [], 0
    for topic, k, v in outputs:
        tb = topic.encode("utf-8")
        parts = [_H.pack(len(tb)), tb]
        for b in (k, v):
            if b is None:
                parts.append(_I.pack(-1))
            else:
                parts.append(_I.pack(len(b)))
                parts.append(bytes(b))
        rec = b"".join(parts)
        if buf and size + len(rec) > CHUNK_BYTES:
            chunks.append(b"".join(buf))
            buf, size = [], 0
        buf.append(rec)
        size += len(rec)
    if buf:
        chunks.append(b"".join(buf))
    return chunks


def decode_outputs(chunk: bytes) -> list:
    out, pos, n = [], 0, len(chunk)
    mv = memoryview(chunk)
    while pos < n:
        (tl,) = _H.unpack_from(chunk, pos)
        pos += 2
        topic = bytes(mv[pos:pos + tl]).decode("utf-8")
        pos += tl
        kv = []
        for _ in (0, 1):
            (ln,) = _I.unpack_from(chunk, pos)
            pos += 4
            if ln < 0:
                kv.append(None)
            else:
                kv.append(bytes(mv[pos:pos + ln]))
                pos += ln
        out.append((topic, kv[0], kv[1]))
    return out


def _chunk_key(i: int) -> bytes:
    return b"outbox.%05d" % i


def read_outbox(store) -> tuple:
    """(batch, outputs) saved by the last commit of a task (batch -1 when there is none)."""
    head = store.get(b"outbox")
    if head is None:
        return -1, []
    meta = json.loads(head)
    outs = []
    for i in range(int(meta.get("chunks", 0))):
        c = store.get(_chunk_key(i))
        if c is None:
            raise StatekitError(f"outbox chunk {i} of batch {meta.get('batch')} is missing")
        outs.extend(decode_outputs(c))
    return int(meta.get("batch", -1)), outs


def write_outbox(store, batch_id: int, outputs) -> None:
    head = store.get(b"outbox")
    old_chunks = int(json.loads(head).get("chunks", 0)) if head is not None else 0
    chunks = encode_outputs(outputs)
    for i, c in enumerate(chunks):
        store.put(_chunk_key(i), c)
    for i in range(len(chunks), old_chunks):
        store.put(_chunk_key(i), None)
    store.put(b"outbox", json.dumps({"batch": int(batch_id), "chunks": len(chunks),
                                     "records": len(outputs)}).encode())


def task_store_spec():
    from statekit.stores import StoreSpec

    return StoreSpec(TASK_STORE, kind="kv", key_serde="bytes", value_serde="bytes", caching=False)


def store_specs(plan) -> list:
    specs = list(plan.stores)
    if getattr(plan, "needs_task_store", plan.sinks or getattr(plan, "has_windows", False)):
        specs.append(task_store_spec())
    return specs


# -- crash hooks -------------------------------------------------------------------------------

def _crash_base():
    from statekit.state import CrashPlan

    return CrashPlan


class _CrashMixin:
    """The state layer's crash hook (``hit(point, n)``) plus the runtime's crash directives."""

    def __init__(self, control_dir, instance, task, batch, publish, env_plan=None) -> None:
        _crash_base().__init__(self, "", "kill")  # no plan of its own; STATEKIT_CRASH -> env_plan
        self.control_dir = control_dir
        self.instance = instance
        self.task = task
        self.batch = batch
        self.records = None
        self.publish = publish
        self.env = env_plan
        self._path = os.path.join(control_dir, "crash.json") if control_dir else None

    def __bool__(self) -> bool:
        return True

    def pending(self) -> Optional[dict]:
        if self._path is None or not os.path.exists(self._path):
            return None
        from statekit.runtime.crash import read_directive

        return read_directive(self.control_dir)

    def check(self, point: str, records: Optional[int] = None) -> None:
        if self._path is None or not os.path.exists(self._path):
            return
        from statekit.runtime import crash as crash_mod

        d = crash_mod.claim(self.control_dir, self.instance, point, records, self.task, self.batch)
        if d is None:
            return
        try:
            self.publish({"type": "crash", "point": point, "directive": d.get("id"),
                          "after_records": d.get("after_records"), "records": records,
                          "mode": d.get("mode")})
        finally:
            crash_mod.die()

    def hit(self, point: str, n: Optional[int] = None) -> None:
        self.check(point, self.records)
        if self.env:
            self.env.hit(point, n)


_CRASH_CLASS = None


def _crash_class():
    """`_CrashMixin` over statekit.state.CrashPlan (TaskState accepts CrashPlan instances only)."""
    global _CRASH_CLASS
    if _CRASH_CLASS is None:
        _CRASH_CLASS = type("TaskCrashHooks", (_CrashMixin, _crash_base()), {})
    return _CRASH_CLASS


class _RestoreEvents:
    """The state layer's restore listener -> restore_start / restore_batch / restore_end events."""

    def __init__(self, publish) -> None:
        self.publish = publish
        self.starts: dict = {}
        self.last_emit: dict = {}
        self.restored: dict = {}
        self.started = False
        self.on_first_start = None

    def on_restore_start(self, store, partition, start_offset, end_offset) -> None:
        if not self.started and self.on_first_start is not None and end_offset > start_offset:
            self.started = True
            self.on_first_start()
        self.starts[store] = (time.perf_counter(), start_offset, end_offset)
        self.restored[store] = 0
        if end_offset <= start_offset:
            return  # nothing to restore (every open reports every store)
        self.publish({"type": "restore_start", "store": store, "start_offset": start_offset,
                      "end_offset": end_offset, "lag": max(0, end_offset - start_offset)})

    def on_batch_restored(self, store, partition, batch_end_offset, num_restored) -> None:
        self.restored[store] = self.restored.get(store, 0) + num_restored
        now = time.perf_counter()
        if now - self.last_emit.get(store, 0.0) < 0.2:
            return
        self.last_emit[store] = now
        t0, start, end = self.starts.get(store, (now, 0, 0))
        el = max(now - t0, 1e-9)
        self.publish({"type": "restore_batch", "store": store, "offset": batch_end_offset,
                      "restored": self.restored[store], "remaining": max(0, end - batch_end_offset),
                      "rate": self.restored[store] / el})

    def on_restore_end(self, store, partition, total_restored) -> None:
        t0, start, end = self.starts.get(store, (time.perf_counter(), 0, 0))
        self.restored[store] = total_restored
        # the TaskState's RestoreMetrics are richer; the task runner adds them in task_opened


class _TaskContext:
    """What plan.new_processor gets: task/batch ids, stores, forward to sinks, stream time, and the
    task's record cache size (`cache_bytes > 0`: aggregations over caching stores forward on flush)."""

    def __init__(self, task, batch_id, state, stream_time, cache_bytes=0) -> None:
        self.task_id = task
        self.batch_id = batch_id
        self._state = state
        self.stream_time = stream_time
        self.cache_bytes = cache_bytes
        self.outputs: list = []

    def get_store(self, name: str):
        return self._state.store(name)

    def forward(self, topic: str, key, value) -> None:
        self.outputs.append((topic, key, value))


def _serialize_outputs(plan, outputs) -> list:
    out = []
    cache: dict = {}
    for topic, k, v in outputs:
        sd = cache.get(topic)
        if sd is None:
            sd = cache[topic] = plan.sink_serdes(topic)
        ks, vs = sd
        try:
            kb = None if k is None else ks.to_bytes(k)
            vb = None if v is None else vs.to_bytes(v)
        except Exception as e:
            from statekit.errors import ProcessorError
            from statekit.topology.graph import serde_label

            spec = next(s for s in plan.sinks if s.topic == topic)
            raise ProcessorError(
                f"cannot serialize an output to {topic} (key={_short(k)} value={_short(v)}) with "
                f"serdes {serde_label(spec.key_serde)}/{serde_label(spec.value_serde)}: "
                f"{type(e).__name__}: {e}; pass key_serde=/value_serde= to .to()") from e
        out.append((topic, kb, vb))
    return out


def _short(x, n=40) -> str:
    s = " ".join(repr(x).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _store_stats(state) -> tuple:
    cache, rows = {}, {}
    try:
        stats = state.db.stats() if state.db is not None else {}
    except Exception:
        stats = {}
    for name, st in (stats or {}).items():
        if name == TASK_STORE or not isinstance(st, dict):
            continue
        c = dict(st.get("cache") or {})
        c["ops"] = {op: v.get("count") for op, v in st.items() if isinstance(v, dict) and "count" in v}
        cache[name] = c
    for name, store in state.stores.items():
        if name == TASK_STORE:
            continue
        try:
            rows[name] = store.approximate_count()
        except Exception:
            pass
    return cache, rows


def _records_threshold(directive, instance) -> Optional[int]:
    """after_records of a pending "records" directive meant for this instance, else None."""
    if not directive or directive.get("point") != "records":
        return None
    want = directive.get("instance")
    if want is not None and instance is not None and int(want) != int(instance):
        return None
    return int(directive.get("after_records") or 0)


def run_task_batch(spec, task: int, batch_id: int, records: Iterable) -> list:
    """Run one micro-batch of one task. See the module docstring."""
    from statekit.runtime.events import EventPublisher, NullPublisher
    from statekit.state import CrashPlan, TaskState

    spec = as_task_spec(spec)
    task = int(task)
    batch_id = int(batch_id)
    plan = spec.plan
    instance = spec.instance_for(task)
    base = {"task": task, "batch": batch_id, "instance": instance,
            "generation": spec.extra.get("generation")}
    pub = EventPublisher(spec.bootstrap, spec.application, base) if spec.events else NullPublisher()
    publish = pub.publish

    env_plan = CrashPlan(None, None)
    crash = _crash_class()(spec.control_dir, instance, task, batch_id, publish, env_plan if env_plan else None)
    listener = _RestoreEvents(publish)
    listener.on_first_start = lambda: publish({"type": "state_change", "old": "CREATED",
                                               "new": "RESTORING"})
    t_open = time.perf_counter()
    notices: list = []
    try:
        kafka = _kafka(spec.bootstrap)
        state = TaskState(spec.application, task, store_specs(plan),
                          state_dir=spec.state_dir_for(task), kafka=kafka,
                          num_tasks=spec.partitions, cache_bytes=spec.cache_bytes, crash=crash,
                          listener=listener, warn=notices.append)
    except Exception as exc:
        _drop_kafka(spec.bootstrap)
        publish({"type": "state_change", "old": "CREATED", "new": "ERROR",
                 "error": " ".join(str(exc).split())[:300]})
        raise
    open_ms = (time.perf_counter() - t_open) * 1000.0
    try:
        restore = {n: m.as_dict() for n, m in (state.restore_metrics or {}).items()}
        evs = [{"type": "task_opened", "replayed_from": state.replayed_from,
                "last_batch": state.last_batch, "open_ms": open_ms, "notices": notices,
                "stores": [s.name for s in plan.stores]}]
        for name, m in restore.items():
            if name == TASK_STORE or not (m.get("lag") or m.get("records_restored")):
                continue
            evs.append({"type": "restore_end", "store": name, "restored": m.get("records_restored"),
                        "applied": m.get("records_applied"), "duration_s": m.get("duration_s"),
                        "rate": m.get("rate"), "from": m.get("replayed_from"),
                        "start_offset": m.get("start_offset"), "end_offset": m.get("end_offset"),
                        "dropped_uncommitted": m.get("dropped_uncommitted")})
        if listener.started:
            evs.append({"type": "state_change", "old": "RESTORING", "new": "RUNNING"})
        pub.publish_many(evs)

        tstore = state.stores.get(TASK_STORE)
        if state.already_applied(batch_id):
            outputs = []
            if tstore is not None:
                ob_batch, outputs = read_outbox(tstore)
                if ob_batch != batch_id:
                    outputs = []
            publish({"type": "batch_skipped", "last_batch": state.last_batch,
                     "reemitted": len(outputs)})
            state.close()
            return outputs

        stream_time = -1
        meta_raw = None
        if tstore is not None:
            raw = tstore.get(b"stream_time")
            if raw is not None:
                stream_time = _Q.unpack(raw)[0]
            meta_raw = tstore.get(b"meta")   # processor state (punctuation, operators' time)
        meta = json.loads(meta_raw) if meta_raw is not None else {}
        ctx = _TaskContext(task, batch_id, state, stream_time, spec.cache_bytes)
        ctx.meta = meta
        t_proc = time.perf_counter()
        proc = plan.new_processor(ctx)
        threshold = _records_threshold(crash.pending(), instance)
        if threshold is not None and threshold <= 0:
            crash.check("records", 0)
            threshold = None  # claimed by another worker (or we are dead)
        on_record = None
        if threshold is not None:
            def on_record(i, _t=[threshold]):
                if _t[0] is not None and i >= _t[0]:
                    crash.records = i
                    crash.check("records", i)
                    _t[0] = None
        n = proc.process_records(records, on_record)
        if hasattr(proc, "punctuate_wall_clock"):
            proc.punctuate_wall_clock(int(time.time() * 1000))
        proc.flush()   # cached aggregations forward the latest value per key, once per batch
        proc.close()
        crash.records = n
        outputs = _serialize_outputs(plan, ctx.outputs)
        if tstore is not None:
            if plan.sinks:
                write_outbox(tstore, batch_id, outputs)
            if proc.stream_time >= 0:
                tstore.put(b"stream_time", _Q.pack(proc.stream_time))
            meta_new = json.dumps(ctx.meta, sort_keys=True).encode() if ctx.meta else None
            if meta_new != meta_raw:
                tstore.put(b"meta", meta_new)
        process_ms = (time.perf_counter() - t_proc) * 1000.0
        cache, rows = _store_stats(state)  # before commit: the cache still holds this batch
        info = state.commit(batch_id)
        rows_after = _store_stats(state)[1]
        publish({"type": "commit", "records": n, "outputs": len(outputs),
                 "changelog": {k: v for k, v in info.records.items() if k != TASK_STORE},
                 "offsets": {k: v for k, v in info.offsets.items() if k != TASK_STORE},
                 "commit_ms": info.ms, "process_ms": process_ms, "cache": cache,
                 "rows": rows_after or rows, "stream_time": proc.stream_time,
                 "dropped_late": proc.dropped_late, "skipped_null": proc.skipped_null})
        state.close()
        return outputs
    except BaseException as exc:
        try:
            state.close()  # drops the uncommitted writes: Spark replays the batch
        except Exception:
            pass
        if not isinstance(exc, ProcessorError):
            _drop_kafka(spec.bootstrap)  # a client that saw an error is not reused
        if isinstance(exc, Exception):
            publish({"type": "state_change", "old": "RUNNING", "new": "ERROR",
                     "error": " ".join(str(exc).split())[:300]})
        raise
