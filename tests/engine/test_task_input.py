"""A task reads its micro-batch from Kafka itself (`statekit.worker.batch_input`). A count needs
to know only which values are null: its source is decoded without cutting the values out, and
what it stores and forwards is what reading every value gives (None, JSON null with whitespace
around it, values that merely begin like null)."""
from __future__ import annotations

import json
import random

import pytest

import statekit
from statekit.contracts import TaskId
from statekit.kafka import Kafka
from statekit.topology import TaskProcessor
from statekit.wire import NOT_READ
from statekit.worker import batch_input
from statekit.worker.task import StreamTask, WorkerSpec

VALUES = [None, b"null", b" null", b"null\n", b"\tnull\t", b'{"n": 1}', b"1", b'"null"', b"[null]"]


def _count_task(tmp_path, broker, tag, values, bulk=True):
    app = statekit.App(tag, bootstrap=broker.bootstrap, partitions=1, instances=1,
                       state_dir=str(tmp_path / tag / "app"))
    app.stream("src", value_serde="json").group_by_key().count(store="counts") \
        .to_stream().to(f"{tag}-out")
    k = Kafka(broker.bootstrap)
    k.ensure_topic(f"{tag}-out", 1)
    k.ensure_topic(f"{tag}-counts-changelog", 1, {"cleanup.policy": "compact"})
    k.close()
    spec = WorkerSpec(application=tag, bootstrap=broker.bootstrap, plans=dict(app.subplans),
                      partitions=1, control_dir=str(tmp_path / tag / "ctl"), sink="kafka",
                      exactly_once=True)
    (tmp_path / tag / "ctl").mkdir(parents=True)
    old = TaskProcessor.bulk_aggregation
    TaskProcessor.bulk_aggregation = bulk
    task = StreamTask(spec, TaskId(0, 0), str(tmp_path / tag / "task"), instance=0,
                      publish=lambda e: None, sink_partitions={f"{tag}-out": 1})
    try:
        step = len(values) // 3
        edges = [0, step, 2 * step, len(values)]
        for b, (s, e) in enumerate(zip(edges, edges[1:])):
            task.process(b, [("src", 0, s, e)])
        return dict(task.state["counts"].scan())
    finally:
        task.close(reason="stopped")
        TaskProcessor.bulk_aggregation = old


def test_a_count_reads_no_values_and_counts_what_reading_them_counts(tmp_path, broker,
                                                                     monkeypatch):
    rng = random.Random(21)
    values = [(json.dumps(f"k{rng.randrange(40)}").encode(), rng.choice(VALUES))
              for _ in range(3000)]
    k = Kafka(broker.bootstrap)
    k.ensure_topic("src", 1)
    k.send_many([("src", 0, values)])
    k.close()
    seen = []
    real = batch_input.read_ranges

    def spy(kafka, plan, ranges, isolation=batch_input.ISOLATION, values_kept=None):
        out = real(kafka, plan, ranges, isolation, values_kept)
        seen.append((values_kept, sum(v is NOT_READ for v in out.values)))
        return out
    monkeypatch.setattr(batch_input, "read_ranges", spy)
    bulk = _count_task(tmp_path, broker, "bulk", values)
    assert len(seen) == 3 and all(kept == {0: b" \t\n\rn"} for kept, _n in seen)
    assert sum(n for _k, n in seen) == sum(1 for _k, v in values
                                           if v is not None and v[:1] not in b" \t\n\rn")
    seen.clear()
    one = _count_task(tmp_path, broker, "one", values, bulk=False)
    assert seen == [({}, 0)] * 3       # one record at a time reads every value
    want: dict = {}
    for kb, v in values:
        if v is not None and json.loads(v) is not None:
            want[kb.decode()] = want.get(kb.decode(), 0) + 1      # str keys (the default)
    assert bulk == one == want
