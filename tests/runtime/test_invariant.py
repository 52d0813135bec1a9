"""The invariant: whatever crashes (process death or disk loss, at any point of a batch, a commit or a
restore), the final state equals a plain-Python reference computed from the same input.

The local engine runs every batch in a worker *subprocess*; a crash directive makes that process
SIGKILL itself (statekit.runtime.crash): the RocksDB handle, record cache and unsent changelog records
die with it, exactly like a Spark Python worker. A few schedules also run on Spark itself.
"""
from __future__ import annotations

import random

import pytest

import statekit
from harness import (build_topology, run_crash_schedule, store_as_dict, windowed_reference,
                     wordcount_reference)

FAST_SEEDS = list(range(10))
SLOW_SEEDS = list(range(10, 40))


def _topics(kafka):
    kafka.ensure_topic("lines", 3)
    kafka.ensure_topic("clicks", 3)


def _run(seed, broker, tmp_path, engine="local", chunks=5, sink="memory"):
    from statekit.kafka import Kafka

    rnd = random.Random(seed)
    instances = rnd.choice([1, 2, 2, 3])
    standbys = rnd.choice([0, 1]) if instances > 1 else 0
    partitions = rnd.choice([2, 3, 4])
    kafka = Kafka(broker.bootstrap)
    app = statekit.App(f"inv{seed}", bootstrap=broker.bootstrap, partitions=partitions,
                       instances=instances, standby_replicas=standbys,
                       state_dir=str(tmp_path / "state"), engine=engine,
                       cache_bytes=rnd.choice([0, 2048, 10 << 20]))
    try:
        _topics(kafka)
        build_topology(app)
        app.start(max_records_per_trigger=rnd.choice([None, 15, 40]), sink=sink)
        summary = run_crash_schedule(app, kafka, seed, chunks=chunks)
        assert app.state.is_running(), (app.state, app.error)
        got_words = store_as_dict(app, "counts")
        got_windows = store_as_dict(app, "clicks-per-window")
        want_words = wordcount_reference(kafka)
        want_windows = windowed_reference(kafka)
        assert got_words == want_words, (summary, app.crashes)
        assert got_windows == want_windows, (summary, app.crashes)
        fired = [c for c in app.crashes if c.get("applied")]
        assert fired, app.crashes  # at least one worker really died
        summary["fired"] = fired
        return summary
    finally:
        app.stop()
        kafka.close()


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_crash_schedule_local(seed, broker, tmp_path):
    s = _run(seed, broker, tmp_path)
    assert s["fired"][0]["mode"] == ("process" if seed % 2 == 0 else "disk-loss")


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_crash_schedule_local_slow(seed, broker, tmp_path):
    _run(seed, broker, tmp_path, chunks=8)


@pytest.mark.spark
@pytest.mark.parametrize("seed", [101, 202])
def test_crash_schedule_spark(seed, broker, tmp_path, spark_session):
    _run(seed, broker, tmp_path, engine="changelog", chunks=4, sink="none")
