"""Run a repartitioned topology on the real stack: one LocalEngine per sub-topology, each batch's
repartition-topic records fed to the sub-topology that reads them (a foreign-key join's answers back
upstream), as the runtime runs one query per sub-topology.

A repartition record goes where the runtime's producer sends it — partition murmur2(key bytes) %
partitions, the writing task's partition for a None key — with its Kafka timestamp (the event time
of the record that made it), in the order its tasks wrote it.
"""
from __future__ import annotations

import os
from collections import defaultdict

from statekit.contracts import TaskId
from statekit.engine.local import LocalEngine
from statekit.kafka import Kafka
from statekit.partition import partition_for
from statekit.worker.task import StreamTask, store_specs


class TimedEngine(LocalEngine):
    """LocalEngine that also keeps each output's timestamp and task (`out_meta`, parallel to what
    run_batch returns): LocalEngine.run_batch returns (topic, key, value) only, and a chain needs
    the timestamp a repartition record carries to the next sub-topology."""

    out_meta: list = []

    def run_tasks(self, batch_id, by_task):
        self.out_meta = []
        return super().run_tasks(batch_id, by_task)

    def task_fn(self, task, batch_id, records):
        t = StreamTask(self.spec, TaskId(0, task), self.state_dir_for(task),
                       instance=self.task_instances.get(task),
                       publish=self._publisher() or (lambda e: None))
        try:
            t.process(batch_id, records)
            outs = [(topic, k, v, ts) for topic, ks, vs, stamps in t.last_outputs
                    for k, v, ts in zip(ks, vs, stamps)]
        finally:
            t.close(reason="stopped")
        self.out_meta.extend((ts, task) for *_x, ts in outs)
        return [o[:3] for o in outs]


class Chain:
    """One TimedEngine per sub-topology (each with its own state dir and application name
    `<app>-s<i>`: the runtime's internal `_task` store must not be shared between sub-topologies'
    tasks)."""

    def __init__(self, plan, app, broker, tmp_path, partitions, **engine_kw):
        self.plan = plan
        self.app = app
        self.broker = broker
        self.partitions = partitions
        self.subs = plan.subtopologies
        self.engines = [TimedEngine(sp, f"{app}-s{i}", broker.bootstrap,
                                    str(tmp_path / f"state-{i}"), partitions, **engine_kw)
                        for i, sp in enumerate(self.subs)]
        self.readers = {s.topic: i for i, sp in enumerate(self.subs) for s in sp.sources}
        self.last = []

    def engine_of(self, store):
        return self.engines[self.index_of(store)]

    def index_of(self, store):
        return next(i for i, sp in enumerate(self.subs) if store in sp.store_names)

    def changelog(self, store):
        return f"{self.engine_of(store).application}-{store}-changelog"

    def run_batch(self, records):
        """Run one batch through every sub-topology; returns the external outputs (topic, k, v)."""
        pending = defaultdict(list)
        for r in records:
            pending[self.readers[r[0]]].append(r)
        external, self.last = [], []
        while pending:
            i = min(pending)
            recs = pending.pop(i)
            eng = self.engines[i]
            out = eng.run_batch(recs)
            self.last.append((i, eng.last_batch, out))
            for (topic, k, v), (raw, (ts, task)) in zip(eng.decode(out), zip(out, eng.out_meta)):
                if topic in self.readers:
                    kb = raw[1]
                    part = task if kb is None else partition_for(kb, self.partitions)
                    pending[self.readers[topic]].append((topic, k, v, ts, part))
                else:
                    external.append((topic, k, v))
        return external

    def last_runs(self):
        """Each engine's last batch of the last chain batch (the one Spark may replay)."""
        last = {i: (i, b, out) for i, b, out in self.last}
        return [last[i] for i in sorted(last)]

    def replay(self):
        """Those batches again, same ids: applied already, so skipped."""
        return [(i, (bid, by_task), self.engines[i].run_tasks(bid, by_task))
                for i, (bid, by_task), _o in self.last_runs()]

    def store(self, name, restore_into=None):
        """{key: value} of a store over its tasks ({(key, ws): v} windows, {(key, s, e): v}
        sessions, {key: (time, value)} buffers), read through the store API. restore_into: open the
        tasks in that fresh state dir instead, restoring from the changelogs."""
        i = self.index_of(name)
        eng, sp = self.engines[i], self.subs[i]
        out = {}
        with Kafka(self.broker.bootstrap) as kafka:
            for task in range(self.partitions):
                if restore_into is None and not os.path.isdir(eng.task_dir(task)):
                    continue
                out.update(self._read_task(eng, sp, task, name,
                                           restore_into or eng.state_dir_for(task),
                                           restore_into is not None, kafka))
        return out

    def _read_task(self, eng, sp, task, name, state_dir, restore, kafka) -> dict:
        from statekit.state import TaskState

        kind = sp.store(name).kind
        st = TaskState(eng.spec.application, TaskId(0, task), store_specs(sp), state_dir=state_dir,
                       kafka=kafka, num_tasks=self.partitions, restore=restore)
        try:
            s = st.store(name)
            if kind == "window":
                return {(k, ws): v for k, ws, v in s.all()}
            if kind == "session":
                return {(k, a, e): v for k, a, e, v in s.all()}
            if kind == "buffer":
                return {r.key: (r.time, r.value) for r in s.all()}
            return dict(s.all())
        finally:
            st.close()


def check_replay_and_restore(chain, tmp_path, stores):
    """The last batch replayed (same ids) changes nothing and emits nothing; each store restored
    from its changelog into a fresh state directory equals the original."""
    before = {name: chain.store(name) for name in stores}
    assert any(out for _i, _b, out in chain.last_runs())
    assert all(out == [] for _i, _b, out in chain.replay())   # applied: nothing is done twice
    for name in stores:
        assert chain.store(name) == before[name], name
        fresh = str(tmp_path / f"fresh-{name}")
        assert chain.store(name, restore_into=fresh) == chain.store(name), name
