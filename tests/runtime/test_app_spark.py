"""The App on the real Spark engine: interactive queries while the Spark query runs, key routing, and a
processor that raises inside a Spark Python worker surfacing as one ProcessorError line."""
from __future__ import annotations

import collections

import pytest

import statekit
from statekit.errors import ProcessorError
from statekit.partition import partition_for
from statekit.runtime.lifecycle import AppState

pytestmark = pytest.mark.spark

LINES = ["the quick brown fox", "jumps over the lazy dog", "the state of the art", "a b c the"]


def test_queries_and_processor_error_on_spark(broker, tmp_path, spark_session):
    from statekit.kafka import Kafka

    k = Kafka(broker.bootstrap)
    k.ensure_topic("lines", 2)
    k.ensure_topic("nums", 1)
    for i, ln in enumerate(LINES):
        k.send("lines", i % 2, [(None, ln.encode())])
    app = statekit.App("sparkq", bootstrap=broker.bootstrap, partitions=3, instances=2,
                       state_dir=str(tmp_path / "a"), engine="changelog")
    app.stream("lines").flat_map_values(str.split).group_by(lambda key, w: w).count(store="counts")
    bad = statekit.App("sparkbad", bootstrap=broker.bootstrap, partitions=2,
                       state_dir=str(tmp_path / "b"), engine="changelog")
    bad.stream("nums").map_values(lambda v: 10 // (len(v) - 3)).group_by_key().count(store="c")
    try:
        app.start()
        assert app.process_all_available()
        assert app.wait_for_state(AppState.RUNNING, 30) == AppState.RUNNING
        want = collections.Counter(w for ln in LINES for w in ln.split())
        assert app._query.is_active  # the queries below read while the Spark query runs
        for w, n in want.items():
            assert app.query("counts", w) == n
            owner = app.key_owner("counts", w)
            assert owner.task == partition_for(w.encode(), 3)
            assert owner.instance == app.assignment.active[owner.task]
        df = app.query_all("counts")
        assert dict(zip(df.key, df.value)) == dict(want)
        assert set(zip(df.key, df.task)) == {(w, partition_for(w.encode(), 3)) for w in want}
        m = app.metrics()
        assert m["records_processed"] == len(LINES)
        out = app.output()  # the memory sink (no sinks in this topology: empty)
        assert list(out.columns) == ["batch", "topic", "key", "value"] and out.empty

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
