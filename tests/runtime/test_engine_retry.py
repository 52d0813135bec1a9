"""A query that fails for a reason of the moment (Spark's ten seconds for a Python worker to
connect back, run out on a loaded machine) is started again from its checkpoint by the App itself:
the batch it failed in runs again under the same id and is counted once; retries used up, ERROR."""
from __future__ import annotations

import logging

import pytest

from harness import unique
from statekit.engine import local_stream
from statekit.errors import StatekitError
from statekit.runtime import runner
from statekit.runtime.lifecycle import AppState
from test_app import LINES, counts, one_line, reference, send_lines, wordcount_app

TRANSIENT = "Python worker failed to connect back."


def fail_batches(monkeypatch, fails: dict):
    """Batch id -> how many of its attempts fail, after every task has run its part (the commit
    log not yet written: the worst moment, as when Spark loses the batch's last step)."""
    real = local_stream.LocalQuery._deliver
    attempts: dict = {}

    def deliver(self, batch, by_task):
        real(self, batch, by_task)
        attempts[batch] = attempts.get(batch, 0) + 1
        if attempts[batch] <= fails.get(batch, 0):
            raise StatekitError(f"query {self.name} failed: SparkException: {TRANSIENT}")

    monkeypatch.setattr(local_stream.LocalQuery, "_deliver", deliver)
    return attempts


def test_a_transient_engine_failure_restarts_the_query_and_counts_the_batch_once(
        shared_broker, kafka, tmp_path, monkeypatch, caplog):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    attempts = fail_batches(monkeypatch, {2: 1})
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2, instances=1)
    try:
        send_lines(kafka, topic, LINES)
        with caplog.at_level(logging.INFO, logger="statekit.app"):
            app.start(max_records_per_trigger=3)
            assert app.process_all_available(timeout=120)
        assert attempts[2] == 2                      # batch 2 ran again, under the same id
        assert counts(app) == reference(LINES)       # and counted once
        assert app.state == AppState.RUNNING
        said = [r.getMessage() for r in caplog.records if "starts again" in r.getMessage()]
        assert len(said) == 1 and "(1 of 3)" in said[0], said
    finally:
        app.stop()


def test_retries_used_up_fail_the_app_in_one_line(shared_broker, kafka, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "ENGINE_RETRIES", 2)
    monkeypatch.setattr(runner, "ENGINE_BACKOFF", 0.0)
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    attempts = fail_batches(monkeypatch, {1: 99})
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2, instances=1)
    try:
        send_lines(kafka, topic, LINES)
        app.start(max_records_per_trigger=3)
        with pytest.raises(StatekitError) as err:
            app.process_all_available(timeout=120)
        assert TRANSIENT in one_line(err.value)
        assert app.state == AppState.ERROR
        assert attempts[1] == 3                      # the first run and two retries
    finally:
        app.stop()
