from __future__ import annotations

import sys

from pyspark import cloudpickle
import pytest

import fakes  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules["fakes"])


@pytest.mark.spark
def test_engine_mechanics_with_rate_source(spark, tmp_path, monkeypatch):
    from pyspark.sql import functions as F

    from statekit.engine.spark.engine import SparkEngine
    from statekit.engine.spec import RunSpec

    def fake_source(self, run):
        return (spark.readStream.format("rate").option("rowsPerSecond", 200).load()
                .select(F.lit(None).cast("binary").alias("key"),
                        F.concat_ws(" ", F.lit("a"), (F.col("value") % 7).cast("string")).cast("binary").alias("value"),
                        F.lit("lines").alias("topic"), F.lit(0).alias("partition"),
                        F.col("value").alias("offset"), F.col("timestamp"), F.lit(0).alias("timestampType")))

    monkeypatch.setattr(SparkEngine, "source_frame", fake_source)
    monkeypatch.setattr(SparkEngine, "_check_topics", lambda self, run: None)
    run = RunSpec(app="smoke", bootstrap="none", plan=fakes.WordCountPlan(), partitions=3,
                  checkpoint_dir=str(tmp_path / "ck"), sink="memory", memory_table="smoke_out",
                  task_fn=fakes.json_count_task, task_spec={"dir": str(tmp_path), "sink": "counts"},
                  trigger="1 second")
    events = []
    q = SparkEngine(spark).start(run, on_progress=events.append)
    try:
        import time
        deadline = time.time() + 60
        while q.last_batch_id < 2 and time.time() < deadline:
            time.sleep(0.2)
            assert q.exception() is None
    finally:
        q.stop()
    rows = spark.table("smoke_out").collect()
    assert rows
    print(q.recent_progress[-1], events[-1:])
    assert events
