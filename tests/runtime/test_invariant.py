"""The invariant: whatever happens to the instances — killed, crashed at any point of a batch, a
commit or a restore (process death or disk loss), revived with or without their disk, joining,
leaving — while records flow, the final state and the memory sink's output equal a plain-Python
reference computed from the same input.

Instances are real processes: a crash directive makes one SIGKILL itself (statekit.worker.crash) and
its RocksDB handles, record caches and unsent changelog records die with it. A few schedules also
run on Spark itself.
"""
from __future__ import annotations

import pytest

from harness import build_app, check_exact, run_membership_schedule

FAST_SEEDS = list(range(20))
SLOW_SEEDS = list(range(20, 60))


def _run(seed, broker, tmp_path, engine="local", steps=5, sink="memory"):
    from statekit.kafka import Kafka

    kafka = Kafka(broker.bootstrap)
    app = build_app(f"inv{seed}", broker, str(tmp_path / "state"), seed, engine=engine)
    try:
        kafka.ensure_topic("lines", 3)
        kafka.ensure_topic("clicks", 3)
        app.start(max_records_per_trigger=[None, 15, 40][seed % 3], sink=sink)
        summary = run_membership_schedule(app, kafka, seed, steps=steps)
        assert app.state.is_running(), (app.state, app.error)
        check_exact(app, kafka, sink)
        return summary
    finally:
        app.stop()
        kafka.close()


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_membership_schedule_local(seed, broker, tmp_path):
    _run(seed, broker, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_membership_schedule_local_slow(seed, broker, tmp_path):
    _run(seed, broker, tmp_path, steps=9)


@pytest.mark.spark
@pytest.mark.parametrize("seed", [101, 202])
def test_membership_schedule_spark(seed, broker, tmp_path, spark_session):
    _run(seed, broker, tmp_path, engine="changelog", steps=4)
