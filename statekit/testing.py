"""TopologyTestDriver: unit-test a topology in-process, without Spark or a broker (Kafka Streams'
TopologyTestDriver).

    from statekit.testing import TopologyTestDriver

    with TopologyTestDriver(app) as driver:          # an App, or a TopologyBuilder
        driver.pipe_input("words", "k", "a b a", timestamp=1_000)
        assert driver.read_output("counts-out") == [("a", 1), ("b", 1), ("a", 2)]
        assert driver.get_store("counts").get("a") == 2
        driver.advance_wall_clock(60_000)            # wall-clock punctuators fire

It runs the real thing: the task processors of each sub-topology with their stores (RocksDB in a
temporary directory, record caches, change-logging into an in-memory changelog you can read with
`changelog(store)`), fed `Records` batches as a task is, and commits after each batch. Inputs are serialized with the source
serdes and outputs with the sink serdes (then read back), so a serde mistake shows here as it would
in a real run. One task per sub-topology; the records written to a repartition topic are fed to the
next sub-topology at once (and a foreign-key join's answers back to the first), until nothing is left.

`pipe_input` processes one record as one micro-batch, like Kafka's driver, so a cached aggregation
forwards every update; `pipe_batch` processes several records as one micro-batch per sub-topology
(in the order a task uses: each topic in input order, topics merged by timestamp), so it forwards
once per key, as a real commit interval would.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections import deque
from typing import Any, Iterable, Optional

from statekit.contracts import changelog_topic
from statekit.errors import ProcessorError, StatekitError
from statekit.stores import RecordingSink, build_stores
from statekit.stores.serdes import bound
from statekit.topology.graph import serde_label

DEFAULT_APPLICATION = "test-driver"


def _plan_of(app_or_builder: Any, application: Optional[str]):
    from statekit.topology import Plan, TopologyBuilder

    if isinstance(app_or_builder, Plan):
        return app_or_builder, application or app_or_builder.application or DEFAULT_APPLICATION, None
    builder = getattr(app_or_builder, "builder", None)
    if isinstance(builder, TopologyBuilder):            # a statekit.App
        name = application or getattr(app_or_builder, "name", None) or DEFAULT_APPLICATION
        return builder.compile(name), name, getattr(app_or_builder, "cache_bytes", None)
    if isinstance(app_or_builder, TopologyBuilder):
        name = application or DEFAULT_APPLICATION
        return app_or_builder.compile(name), name, None
    raise TypeError(f"TopologyTestDriver needs a statekit.App, a TopologyBuilder or a Plan, got "
                    f"{type(app_or_builder).__name__}")


class _Context:
    """What the driver hands plan.new_processor (the host side of the task protocol)."""

    def __init__(self, task: "_Task", batch_id: int) -> None:
        self.task_id = 0
        self.batch_id = batch_id
        self.stream_time = task.stream_time
        self.cache_bytes = task.driver.cache_bytes
        self.meta = json.loads(json.dumps(task.meta))   # a failed batch leaves the task's untouched
        self.outputs: list = []
        self.proc = None
        self._task = task

    def get_store(self, name: str):
        return self._task.stores[name]

    def forward(self, topic: str, key, value, timestamp=None) -> None:
        if timestamp is None and self.proc is not None:
            timestamp = self.proc.rec.timestamp
        self.outputs.append((topic, key, value, timestamp))

    def wall_clock_ms(self) -> int:
        return self._task.driver.wall_clock


class _Task:
    """The one task of a sub-topology: its stores, committed per batch; its stream time and meta
    (what the runtime keeps in its internal `_task` store) in memory."""

    def __init__(self, driver: "TopologyTestDriver", plan, state_dir: str) -> None:
        self.driver = driver
        self.plan = plan
        self.sink = RecordingSink()
        self.stores, self.db = build_stores(
            list(plan.stores), state_dir, self.sink, cache_bytes=driver.cache_bytes, sync=False,
            changelog_topic=lambda store: changelog_topic(driver.application, store))
        self.stream_time = -1
        self.meta: dict = {}
        self.batches = 0

    def run(self, records: list, punctuate: bool = True) -> list:
        """One micro-batch of (source index, key bytes, value bytes, timestamp, partition, offset)
        records: process, punctuate, flush, commit. Returns the forwarded outputs
        [(topic, key, value, timestamp)]."""
        from statekit.topology.records import Records

        by_src: dict = {}
        for si, kb, vb, ts, part, off in records:
            by_src.setdefault(si, []).append((si, part, off, ts, kb, vb))
        batch = Records.merge([Records.from_rows(r) for _si, r in sorted(by_src.items())])
        ctx = _Context(self, self.batches)
        try:
            proc = self.plan.new_processor(ctx)
            ctx.proc = proc
            proc.process_batch(batch)
            if punctuate:
                proc.punctuate_wall_clock(self.driver.wall_clock)
            proc.flush()
            proc.close()
            outputs = [(t, k, v, ts) for t, k, v, ts in ctx.outputs]
            self.driver._check_outputs(self.plan, outputs)
            self.db.flush()
            self.db.commit({"batch": self.batches})
        except BaseException:
            self.db.discard()
            self.sink.records[:] = self.sink.records[:self._logged]
            raise
        self._logged = len(self.sink.records)
        self.batches += 1
        self.stream_time = proc.stream_time
        self.meta = ctx.meta
        d = self.driver
        d.dropped_late += proc.dropped_late
        d.skipped_null += proc.skipped_null
        return outputs

    _logged = 0

    def close(self) -> None:
        self.db.close()


class TopologyTestDriver:
    """See the module docstring. `application` names internal topics and changelogs (default: the
    App's name, else "test-driver"); `cache_bytes` the record cache of each task (default: the App's,
    else 10 MB; 0 forwards every update); `wall_clock_ms` where the mock wall clock starts."""

    def __init__(self, app_or_builder: Any, application: Optional[str] = None, *,
                 cache_bytes: Optional[int] = None, wall_clock_ms: int = 0,
                 state_dir: Optional[str] = None) -> None:
        plan, self.application, app_cache = _plan_of(app_or_builder, application)
        self.plan = plan
        self.cache_bytes = int(cache_bytes if cache_bytes is not None else
                               (app_cache if app_cache is not None else 10 << 20))
        self.wall_clock = int(wall_clock_ms)
        self.dropped_late = 0
        self.skipped_null = 0
        self._own_dir = state_dir is None
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="statekit-driver-")
        self._tasks: list = []
        self._outputs: dict = {}
        self._offsets: dict = {}
        self._closed = False
        try:
            for i, sp in enumerate(plan.subtopologies):
                self._tasks.append(_Task(self, sp, f"{self.state_dir}/{i}"))
            self._readers = {}    # topic -> [(task index, source index)]
            for i, t in enumerate(self._tasks):
                for s in t.plan.sources:
                    self._readers.setdefault(s.topic, []).append((i, s.index))
            self._sinks = {}
            for t in self._tasks:
                for s in t.plan.sinks:
                    if not s.internal:
                        self._sinks[s.topic] = t.plan.sink_serdes(s.topic)
            for t in self._tasks:   # processors' init() now, as Kafka's driver: schedules start here
                if any(n.kind == "process" for n in t.plan.nodes):
                    self._run_task(t, [], per_record=True)
        except BaseException:
            self.close()
            raise

    # -- input -----------------------------------------------------------------------------------
    def _encode(self, topic: str, key: Any, value: Any, timestamp: Optional[int]) -> list:
        readers = self._readers.get(topic)
        if not readers or any(self._tasks[i].plan.sources[si].internal for i, si in readers):
            external = sorted(t for t, rs in self._readers.items()
                              if not any(self._tasks[i].plan.sources[si].internal for i, si in rs))
            raise StatekitError(f"{topic!r} is not an input topic of this topology; pipe into one "
                                f"of {', '.join(external)}")
        ts = self.wall_clock if timestamp is None else int(timestamp)
        off = self._offsets.get(topic, 0)
        self._offsets[topic] = off + 1
        out = []
        for i, si in readers:
            ks, vs = self._tasks[i].plan.source_serdes(si)
            ks, vs = bound(ks, topic, True), bound(vs, topic, False)   # the driver writes the topic
            src = self._tasks[i].plan.sources[si]
            try:
                kb = None if key is None else ks.to_bytes(key)
                vb = None if value is None else vs.to_bytes(value)
            except Exception as e:
                raise StatekitError(f"cannot serialize the input {key!r}/{value!r} for {topic} with "
                                    f"serdes {serde_label(src.key_serde)}/"
                                    f"{serde_label(src.value_serde)}: {type(e).__name__}: {e}") from e
            out.append((i, (si, kb, vb, ts, 0, off)))
        return out

    def pipe_input(self, topic: str, key: Any = None, value: Any = None,
                   timestamp: Optional[int] = None) -> None:
        """Process one record (timestamp: the mock wall clock when left out) as one micro-batch,
        then everything it sends through repartition topics."""
        self._check_open()
        queue = deque((i, [r]) for i, r in self._encode(topic, key, value, timestamp))
        self._drain(queue, per_record=True)

    def pipe_batch(self, records: Iterable) -> None:
        """Process (topic, key, value[, timestamp]) records as one micro-batch per sub-topology,
        in the order a task processes a batch (each topic in input order, topics merged by
        timestamp)."""
        self._check_open()
        by_task: dict = {}
        for r in records:
            topic, key, value = r[0], r[1], r[2]
            ts = r[3] if len(r) > 3 else None
            for i, rec in self._encode(topic, key, value, ts):
                by_task.setdefault(i, []).append(rec)
        queue = deque(sorted(by_task.items()))
        self._drain(queue, per_record=False)

    def _drain(self, queue: deque, per_record: bool) -> None:
        while queue:
            i, records = queue.popleft()
            if per_record and len(records) > 1:
                queue.extendleft((i, [r]) for r in reversed(records))
                continue
            for j, recs in self._run_task(self._tasks[i], records, per_record):
                queue.append((j, recs))

    def _run_task(self, task: _Task, records: list, per_record: bool) -> list:
        """Run one batch; route its outputs (external topics to the output queues, repartition
        topics to the sub-topologies that read them). Returns [(task index, records)]."""
        outputs = task.run(records)
        fed: dict = {}
        for topic, k, v, ts in outputs:
            serdes = task.plan.sink_serdes(topic)
            kb = None if k is None else serdes[0].to_bytes(k)
            vb = None if v is None else serdes[1].to_bytes(v)
            if topic in self._sinks:
                ks, vs = serdes
                self._outputs.setdefault(topic, deque()).append(
                    (None if kb is None else ks.from_bytes(kb), None if vb is None else vs.from_bytes(vb),
                     ts))
                continue
            off = self._offsets.get(topic, 0)
            self._offsets[topic] = off + 1
            for j, si in self._readers.get(topic, ()):
                fed.setdefault(j, []).append((si, kb, vb, ts, 0, off))
        return sorted(fed.items())

    def _check_outputs(self, plan, outputs: list) -> None:
        """Serialize every output with its sink serdes first: a bad one fails the batch (one line)."""
        for topic, k, v, _ts in outputs:
            ks, vs = plan.sink_serdes(topic)
            try:
                None if k is None else ks.to_bytes(k)
                None if v is None else vs.to_bytes(v)
            except Exception as e:
                spec = next(s for s in plan.sinks if s.topic == topic)
                hint = ("pass key_serde=/value_serde= to the step before it (map, group_by, ...): "
                        "a repartition topic uses that step's serdes" if spec.internal
                        else "pass key_serde=/value_serde= to .to()")
                raise ProcessorError(
                    f"cannot serialize an output to {topic} (key={k!r:.40} value={v!r:.40}) with "
                    f"serdes {serde_label(spec.key_serde)}/{serde_label(spec.value_serde)}: "
                    f"{type(e).__name__}: {e}; {hint}") from e

    # -- time ------------------------------------------------------------------------------------
    def advance_wall_clock(self, ms: int) -> None:
        """Move the mock wall clock forward; wall-clock punctuators that are due fire (each
        sub-topology with processors runs an empty batch, as a real task would at its next one)."""
        self._check_open()
        if int(ms) < 0:
            raise StatekitError(f"advance_wall_clock needs ms >= 0, got {ms}")
        self.wall_clock += int(ms)
        queue = deque()
        for i, t in enumerate(self._tasks):
            if any(n.kind == "process" for n in t.plan.nodes):
                for j, recs in self._run_task(t, [], per_record=True):
                    queue.append((j, recs))
        self._drain(queue, per_record=True)

    # -- output and state ------------------------------------------------------------------------
    def read_output(self, topic: str) -> list:
        """[(key, value)] written to an output topic since the last read (deserialized)."""
        return [(k, v) for k, v, _ts in self.read_output_records(topic)]

    def read_output_records(self, topic: str) -> list:
        """[(key, value, timestamp)] written to an output topic since the last read."""
        self._check_open()
        if topic not in self._sinks:
            raise StatekitError(f"{topic!r} is not an output topic of this topology; outputs: "
                                f"{', '.join(sorted(self._sinks)) or 'none'}")
        q = self._outputs.get(topic)
        out = list(q) if q else []
        if q:
            q.clear()
        return out

    def get_store(self, name: str):
        """The typed store (kv, window, session or buffer), as the processors see it."""
        self._check_open()
        for t in self._tasks:
            if name in t.stores:
                return t.stores[name]
        names = sorted(n for t in self._tasks for n in t.stores)
        raise StatekitError(f"no store {name!r} in this topology; stores: {', '.join(names)}")

    def changelog(self, name: str) -> list:
        """[(key_bytes, value_bytes or None)] the store wrote to its changelog, committed batches."""
        self.get_store(name)
        return [(k, v) for t in self._tasks for s, k, v in t.sink.records[:t._logged] if s == name]

    def stream_time(self, subtopology: int = 0) -> int:
        return self._tasks[subtopology].stream_time

    # -- life cycle ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StatekitError("this TopologyTestDriver is closed; create a new one")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            try:
                t.close()
            except Exception:
                pass
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "TopologyTestDriver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["TopologyTestDriver"]
