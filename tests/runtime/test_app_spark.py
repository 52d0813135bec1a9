"""The App on the real Spark engine: interactive queries while the Spark query runs, key routing, a
processor that raises (in a Spark stage, and in a task) surfacing as one ProcessorError line, and an
instance killed mid-batch while Spark keeps running the others' tasks."""
from __future__ import annotations

import collections

import pytest

import statekit
from statekit.contracts import TaskId
from statekit.errors import ProcessorError
from statekit.partition import partition_for
from statekit.runtime.lifecycle import AppState

pytestmark = pytest.mark.spark

LINES = ["the quick brown fox", "jumps over the lazy dog", "the state of the art", "a b c the"]


def test_queries_failover_and_processor_errors_on_spark(broker, tmp_path, spark_session):
    from statekit.kafka import Kafka

    k = Kafka(broker.bootstrap)
    k.ensure_topic("lines", 3)                # a task reads its own partition of each source
    k.ensure_topic("nums", 2)
    for i, ln in enumerate(LINES):
        k.send("lines", i % 3, [(None, ln.encode())])
    app = statekit.App("sparkq", bootstrap=broker.bootstrap, partitions=3, instances=2,
                       state_dir=str(tmp_path / "a"), engine="changelog")
    (app.stream("lines").flat_map_values(str.split).group_by(lambda key, w: w).count(store="counts")
     .to_stream().to("out", value_serde="int64"))
    bad = statekit.App("sparkbad", bootstrap=broker.bootstrap, partitions=2,
                       state_dir=str(tmp_path / "b"), engine="changelog")
    bad.stream("nums").group_by_key().aggregate(lambda: 0, lambda key, v, a: a + 10 // (len(v) - 3),
                                                store="c", value_serde="int64")
    try:
        app.start()
        assert app.process_all_available()
        assert app.wait_for_state(AppState.RUNNING, 30) == AppState.RUNNING
        want = collections.Counter(w for ln in LINES for w in ln.split())
        assert all(q.is_active for q in app._queries.values())  # reads while the Spark query runs
        for w, n in want.items():
            assert app.query("counts", w) == n
            owner = app.key_owner("counts", w)
            # the count runs after the repartition by word: sub-topology 1
            assert owner.task == TaskId(app.store_subtopology("counts"), partition_for(w.encode(), 3))
            assert owner.instance == app.assignment.active[owner.task]
        df = app.query_all("counts")
        assert dict(zip(df.key, df.value)) == dict(want)
        assert app.metrics()["records_processed"] == len(LINES)
        # an instance dies in the middle of a batch: Spark's query goes on, its tasks move
        app.crash("disk-loss", instance=0, after_records=2)
        for i, ln in enumerate(LINES):
            k.send("lines", i % 3, [(None, ln.encode())])
        assert app.process_all_available(timeout=120)
        assert app.instances == 1 and app.state == AppState.RUNNING
        assert all(q.is_active for q in app._queries.values())
        want.update(w for ln in LINES for w in ln.split())
        assert app.query_all("counts").set_index("key")["value"].to_dict() == dict(want)
        last = {}
        out = app.output()
        assert not out.duplicated(["batch", "task", "key"]).any()
        for key, v in zip(out.key, out.value):
            last[key] = v
        assert last == dict(want)

        k.send("nums", 0, [(b"k", b"abc")])
        bad.start()
        with pytest.raises(ProcessorError) as ei:
            bad.process_all_available()
        msg = str(ei.value)
        assert "\n" not in msg and "ZeroDivisionError" in msg, msg
        assert bad.state == AppState.ERROR
    finally:
        bad.stop()
        app.stop()
        k.close()
