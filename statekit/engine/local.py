"""A tiny in-process engine: runs a topology `Plan` over Python lists of records, no Spark.

The same task path as the Spark engine, minus Spark and Kafka sources: every input record is
serialized with its source's serdes and goes to task = its source partition (given, else Kafka's
default partitioner on the key bytes, 0 without key), each task's part of the batch is a `Records`
in Kafka Streams' order, handed to `statekit.worker.task.run_task_batch` with an incrementing batch
id (each task opened, run and closed in this process). Stores, changelogs, commits and restoration
are the real ones, so the whole stack is testable in seconds:

    eng = LocalEngine(plan, "wordcount", broker.bootstrap, state_dir=tmp, partitions=4)
    out = eng.run_batch([("lines", None, "a b a", 1000), ("lines", None, "b", 1001)])
    eng.decode(out)               # [(topic, key, value)] with the sink serdes
    eng.store("lines-count")      # {key: value} merged over the tasks (committed state)
    eng.replay()                  # the last batch again, same id: skipped, nothing re-applied
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

from statekit.contracts import TaskId
from statekit.partition import partition_for
from statekit.worker.task import WorkerSpec, run_task_batch, store_specs


class LocalEngine:
    def __init__(self, plan, application: str, bootstrap: str, state_dir: str, partitions: int = 2, *,
                 cache_bytes: int = 10 << 20, control_dir: Optional[str] = None, events: bool = False,
                 task_instances: Optional[dict] = None,
                 state_dirs: Optional[dict] = None, first_batch_id: int = 0) -> None:
        self.plan = plan
        self.application = application
        self.bootstrap = bootstrap
        self.partitions = int(partitions)
        self.state_dir = state_dir
        self.state_dirs = dict(state_dirs or {})
        self.task_instances = dict(task_instances or {})
        self.events = events
        self.spec = WorkerSpec(application=application, bootstrap=bootstrap, plans={0: plan},
                               partitions=self.partitions, control_dir=control_dir or "",
                               cache_bytes=cache_bytes, sink="none", events=events)
        self.next_batch_id = int(first_batch_id)
        self._offsets: dict = {}
        self.last_batch: Optional[tuple] = None   # (batch_id, {task: records})
        self._kafka = None

    def state_dir_for(self, task: int) -> str:
        return self.state_dirs.get(task, self.state_dir)

    def _publisher(self):
        if not self.events:
            return None
        from statekit.event_bus import EventPublisher

        return EventPublisher(self.bootstrap, self.application).publish

    def task_fn(self, task: int, batch_id: int, records) -> list:
        """Run one task's batch; its outputs [(topic, key bytes, value bytes)]."""
        from statekit.worker.task import StreamTask

        t = StreamTask(self.spec, TaskId(0, task), self.state_dir_for(task),
                       instance=self.task_instances.get(task),
                       publish=self._publisher() or (lambda e: None))
        try:
            t.process(batch_id, records)
            return t.flat_outputs()
        finally:
            t.close(reason="stopped")

    # -- input -----------------------------------------------------------------------------------
    def _encode(self, records: Iterable) -> dict:
        """{task: Records} for one batch of input records.

        An input record is (topic, key, value[, timestamp[, partition]]) with Python key and
        value (serialized here with the source's serdes); the timestamp defaults to the position in
        the input, the partition (= the task) to murmur2(key bytes) % partitions (0 without key)."""
        from statekit.topology.records import Records

        plan = self.plan
        rows: dict = {}
        for i, r in enumerate(records):
            topic, key, value = r[0], r[1], r[2]
            ts = int(r[3]) if len(r) > 3 and r[3] is not None else i
            si = plan.source_index(topic)
            ks, vs = plan.source_serdes(si)
            kb = None if key is None else ks.to_bytes(key)
            vb = None if value is None else vs.to_bytes(value)
            if len(r) > 4 and r[4] is not None:
                part = int(r[4])
            else:
                part = 0 if kb is None else partition_for(kb, self.partitions)
            off = self._offsets.get((topic, part), 0)
            self._offsets[(topic, part)] = off + 1
            for s in plan.sources:
                if s.topic == topic:
                    rows.setdefault(part, {}).setdefault(s.index, []).append(
                        (s.index, part, off, ts, kb, vb))
        return {t: Records.merge([Records.from_rows(r) for _si, r in sorted(by_src.items())])
                for t, by_src in rows.items()}

    # -- running ---------------------------------------------------------------------------------
    def run_tasks(self, batch_id: int, by_task: dict) -> list:
        outputs = []
        for task in sorted(by_task):
            outputs.extend(self.task_fn(task, batch_id, by_task[task]))
        return outputs

    def run_batch(self, records: Iterable, batch_id: Optional[int] = None) -> list:
        """One micro-batch; returns [(sink_topic, key_bytes, value_bytes)]. Tasks without records
        are not called (as in the Spark engine)."""
        if batch_id is None:
            batch_id = self.next_batch_id
        batch_id = int(batch_id)
        self.next_batch_id = max(self.next_batch_id, batch_id + 1)
        by_task = self._encode(records)
        self.last_batch = (batch_id, by_task)
        return self.run_tasks(batch_id, by_task)

    def run(self, records: Iterable, batch_size: Optional[int] = None) -> list:
        """Every record, `batch_size` records per batch (all in one batch when None)."""
        records = list(records)
        if not batch_size:
            return self.run_batch(records)
        out = []
        for i in range(0, len(records), batch_size):
            out.extend(self.run_batch(records[i:i + batch_size]))
        return out

    def replay(self) -> list:
        """Run the last batch again with the same id and the same records (what Spark does after
        a failure)."""
        if self.last_batch is None:
            return []
        batch_id, by_task = self.last_batch
        return self.run_tasks(batch_id, by_task)

    # -- output and state ------------------------------------------------------------------------
    def decode(self, outputs: Iterable) -> list:
        """[(topic, key, value)] decoded with the sink serdes."""
        out = []
        for topic, kb, vb in outputs:
            ks, vs = self.plan.sink_serdes(topic)
            out.append((topic, None if kb is None else ks.from_bytes(kb),
                        None if vb is None else vs.from_bytes(vb)))
        return out

    def task_dir(self, task: int) -> str:
        from statekit.contracts import task_dir

        return task_dir(self.state_dir_for(task), self.application, TaskId(0, task))

    def store_by_task(self, name: str) -> dict:
        """{task: {key: value}} ({(key, window_start): value} for window stores) as committed,
        read through the store API (a TaskState opened without restoring)."""
        from statekit.state import TaskState

        spec = next(s for s in store_specs(self.plan) if s.name == name)
        out = {}
        for task in range(self.partitions):
            if not os.path.isdir(self.task_dir(task)):
                continue
            st = TaskState(self.application, TaskId(0, task), store_specs(self.plan),
                           state_dir=self.state_dir_for(task), kafka=self._client(),
                           num_tasks=self.partitions, restore=False)
            try:
                store = st.store(name)
                if spec.kind == "window":
                    out[task] = {(k, ws): v for k, ws, v in store.all()}
                else:
                    out[task] = dict(store.all())
            finally:
                st.close()
        return out

    def store(self, name: str) -> dict:
        merged: dict = {}
        for rows in self.store_by_task(name).values():
            merged.update(rows)
        return merged

    def _client(self):
        if self._kafka is None:
            from statekit.kafka import Kafka

            self._kafka = Kafka(self.bootstrap)
        return self._kafka

    def close(self) -> None:
        if self._kafka is not None:
            self._kafka.close()
            self._kafka = None
