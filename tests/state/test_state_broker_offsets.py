"""Changelog positions come from the broker, never from arithmetic on transaction markers: a
changelog without markers (at-least-once, or a broker that writes none: librdkafka's mock), one
with Kafka's one-offset markers, and one with wider gaps between commits (another producer's
aborted transactions) each restores exactly, and a commit's checkpoint is where a read_committed
reader of the changelog stands. And Fetch answers with nothing in them are waited out."""
from __future__ import annotations

import statehelpers as H

from statekit.kafka import Kafka
from statekit.state.restore import COMMITTED, meta_key
from statekit.state.task import TaskState

SEED = 7
STORES = ("counts", "sums", "latest")


def committed_ends(k, app, partition=0) -> dict:
    return {s: k.end_offsets(f"{app}-{s}-changelog", [partition], COMMITTED)[partition] for s in STORES}


def positions(task) -> dict:
    meta = task.db.read_meta()
    return {s: meta[meta_key(s)]["offset"] for s in STORES}


def reopen_and_wipe(app, state_dir, k, producer=None):
    """The same task on a fresh disk: a restore from scratch."""
    return TaskState(app, 0, H.specs(), state_dir=state_dir, kafka=k, producer=producer)


def run_and_check(app, tmp_path, k, make_producer=None, between=None):
    """Commit batches 0..5, checking each commit's positions against the broker's committed ends;
    reopen from the checkpoint (nothing to replay) and on a new disk (everything), both exact."""
    state = str(tmp_path / "a")
    txp = make_producer() if make_producer else None
    with TaskState(app, 0, H.specs(), state_dir=state, kafka=k, producer=txp) as t:
        for b in range(6):
            H.run_batches(t, SEED, [b])
            ends = committed_ends(k, app)
            assert t.last_batch == b
            assert positions(t) == ends, (b, positions(t), ends)
            if between is not None:
                between(b)
        want = H.reference(SEED, range(6))
        assert H.contents(t) == want
    if txp is not None:
        txp.close()
    ends = committed_ends(k, app)
    txp = make_producer() if make_producer else None
    with TaskState(app, 0, H.specs(), state_dir=state, kafka=k, producer=txp) as t:
        assert t.notices == [], t.notices  # the checkpoint is trusted: not past the changelog's end
        assert t.replayed_from == "checkpoint"
        assert sum(m.records_applied for m in t.restore_metrics.values()) == 0
        assert H.contents(t) == want and t.last_batch == 5
        assert positions(t) == ends
    if txp is not None:
        txp.close()
    txp = make_producer() if make_producer else None
    with reopen_and_wipe(app, str(tmp_path / "b"), k, txp) as t:
        assert t.replayed_from == "scratch"
        assert H.contents(t) == want and t.last_batch == 5
        assert positions(t) == ends
        for s, m in t.restore_metrics.items():
            assert m.end_offset == ends[s] and m.dropped_uncommitted == 0
    if txp is not None:
        txp.close()


def test_at_least_once_changelogs_have_no_markers_and_restore_exactly(shared_broker, tmp_path):
    with Kafka(shared_broker.bootstrap) as k:
        run_and_check("pos-alo", tmp_path, k)
        # offsets are records: nothing in the changelogs but statekit's own records
        for s in STORES:
            t = f"pos-alo-{s}-changelog"
            end = k.end_offsets(t)[0]
            assert k.count_records(t, 0, 0, end) == end


def test_exactly_once_positions_are_the_brokers_last_stable_offset(shared_broker, tmp_path):
    with Kafka(shared_broker.bootstrap) as k:
        run_and_check("pos-eos", tmp_path, k, lambda: k.transactional_producer("pos-eos-0", 10000))
        # Kafka's end markers take one offset each: 6 commits, 6 markers per changelog
        for s in STORES:
            t = f"pos-eos-{s}-changelog"
            end = k.end_offsets(t)[0]
            assert k.count_records(t, 0, 0, end) == end - 6


def test_wider_gaps_between_commits_restore_exactly(shared_broker, tmp_path):
    """Another producer's aborted transactions leave offsets no read_committed reader sees (its
    record and its abort marker): between statekit's commits the changelog has gaps of 1, 3, 5...
    offsets; positions and restores still match the broker's."""
    with Kafka(shared_broker.bootstrap) as k:
        other = k.transactional_producer("pos-gap-other", 10000)

        def aborted_writes(b):
            other.begin()
            other.send_many([(f"pos-gap-{s}-changelog", 0, [(b"x", b"y")] * b) for s in STORES])
            other.abort()

        run_and_check("pos-gap", tmp_path, k, lambda: k.transactional_producer("pos-gap-0", 10000),
                      between=aborted_writes)
        other.close()


def test_exactly_once_on_a_broker_that_writes_no_markers(mock_cluster, tmp_path):
    """librdkafka's mock commits transactions without end markers: the checkpoint is the
    changelog's end (not one past it, which would distrust the local state at the next open)."""
    for s in STORES:
        mock_cluster.create_topic(f"pos-mock-{s}-changelog")
    with Kafka(mock_cluster.bootstrap) as k:
        run_and_check("pos-mock", tmp_path, k, lambda: k.transactional_producer("pos-mock-0", 10000))
        for s in STORES:
            t = f"pos-mock-{s}-changelog"
            end = k.end_offsets(t)[0]
            assert k.count_records(t, 0, 0, end) == end


def test_fetch_answers_with_nothing_in_them_are_waited_out(shared_broker, tmp_path):
    """A broker may answer a Fetch with no partition data (Kafka does while it throttles a
    client): reads, single fetches and restores wait it out."""
    with Kafka(shared_broker.bootstrap) as k:
        state = str(tmp_path / "a")
        with TaskState("pos-empty", 0, H.specs(), state_dir=state, kafka=k) as t:
            H.run_batches(t, SEED, range(4))
        real = k._partition_data
        calls = {"n": 0}

        def every_other_empty(resp, topic):
            calls["n"] += 1
            return None if calls["n"] % 2 else real(resp, topic)

        k._partition_data = every_other_empty
        topic = "pos-empty-counts-changelog"
        end = k.end_offsets(topic)[0]
        got = [r[0] for c in k.read(topic, 0, 0, end, max_bytes=64) for r in c.records]
        assert got == list(range(end))
        calls["n"] = 0
        first = k.fetch(topic, 0, 0)  # the empty answer is asked again
        assert calls["n"] == 2 and first.records and first.records[0][0] == 0
        calls["n"] = 0
        assert k.fetch(topic, 0, end, max_wait_ms=10).records == []  # at the end: nothing, at once
        assert calls["n"] == 2
        assert k.count_records(topic, 0, 0, end) == end
        calls["n"] = 0
        with TaskState("pos-empty", 0, H.specs(), state_dir=str(tmp_path / "b"), kafka=k) as t:
            assert t.replayed_from == "scratch" and calls["n"] > 2
            assert H.contents(t) == H.reference(SEED, range(4))
