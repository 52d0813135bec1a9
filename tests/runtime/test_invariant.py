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

from harness import (build_app, check_exact, output_duplicates, run_membership_schedule,
                     sink_outputs, store_as_dict, wordcount_reference)

FAST_SEEDS = list(range(8))          # `make test`; the rest with `make test-slow`
SLOW_SEEDS = list(range(8, 60))


def _run(seed, broker, tmp_path, engine="local", steps=5, sink="memory"):
    from statekit.kafka import Kafka

    kafka = Kafka(broker.bootstrap)
    app = build_app(f"inv{seed}", broker, str(tmp_path / "state"), seed, engine=engine)
    try:
        kafka.ensure_topic("lines", app.partitions)   # a task reads its own partition of each
        kafka.ensure_topic("clicks", app.partitions)
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
@pytest.mark.parametrize("seed", [101, pytest.param(202, marks=pytest.mark.slow)])
def test_membership_schedule_spark(seed, broker, tmp_path, spark_session):
    _run(seed, broker, tmp_path, engine="changelog", steps=4)


EOS_SEEDS = list(range(100, 110))


def _run_kafka_sink(seed, broker, tmp_path, guarantee):
    """A word count whose first crash lands between a batch's writes (its sink records among them)
    and its transaction's commit; returns (committed view, uncommitted view, reference) of its
    Kafka sink and the records of the batch the crash cut."""
    from statekit.kafka import Kafka

    kafka = Kafka(broker.bootstrap)
    app = build_app(f"eos{seed}", broker, str(tmp_path / "state"), seed, clicks=False,
                    processing_guarantee=guarantee, cache_bytes=10 << 20)
    try:
        for t in ("lines", "clicks", "counts-out"):
            kafka.ensure_topic(t, app.partitions)
        app.start(sink="kafka")
        # the crash hits the count's task (the sub-topology with the sink), between its writes
        # and its transaction's commit
        run_membership_schedule(app, kafka, seed, steps=4,
                                first_crash={"point": "before_commit", "after_records": None,
                                             "subtopology": app.store_subtopology("counts")})
        assert app.state.is_running(), (app.state, app.error)
        from statekit.worker import crash as crash_mod

        first = app.crashes[0]
        assert first["point"] == "before_commit"
        assert crash_mod.claimed(app.layout.control_dir, first["id"]) is not None, app.crashes
        assert store_as_dict(app, "counts") == wordcount_reference(kafka)
        cut = [e.records for e in app.events(types="crash") if e.directive == first["id"]]
        return (sink_outputs(kafka, isolation="read_committed"),
                sink_outputs(kafka, isolation="read_uncommitted"), wordcount_reference(kafka),
                cut[0] if cut else None)
    finally:
        app.stop()
        kafka.close()


@pytest.mark.parametrize("seed", [s if s < 105 else pytest.param(s, marks=pytest.mark.slow)
                                  for s in EOS_SEEDS])
def test_exactly_once_kafka_sink_has_no_duplicates(seed, broker, tmp_path):
    committed, uncommitted, want, cut = _run_kafka_sink(seed, broker, tmp_path, "exactly_once")
    assert output_duplicates(committed) == 0
    assert {k: v[-1] for k, v in committed.items()} == want
    # a crash that cut a batch with records left a transaction with outputs that the next owner
    # aborted: a reader that does not read committed sees them again (an empty batch sent none)
    if cut:
        assert sum(map(len, uncommitted.values())) > sum(map(len, committed.values()))
    else:
        assert sum(map(len, uncommitted.values())) >= sum(map(len, committed.values()))


def test_at_least_once_kafka_sink_has_one_view(broker, tmp_path):
    """Without transactions there is one view of the sink; a crash after a batch's records and
    markers were acknowledged does not repeat them (the batch is committed), so its final counts
    are exact too. (What at-least-once can repeat: a crash between the acknowledgements of one
    batch's sink records and of its markers, sent together.)"""
    committed, uncommitted, want, _cut = _run_kafka_sink(EOS_SEEDS[0], broker, tmp_path,
                                                         "at_least_once")
    assert committed == uncommitted
    assert {k: v[-1] for k, v in committed.items()} == want
