"""Damaged local state and a missing changelog: each detected with one line, restored from the
changelog where that is possible, a clear one-line failure where it is not."""
from __future__ import annotations

import glob
import os
import shutil

import pytest

import statehelpers as H
from statekit.errors import BrokerUnreachable, StatekitError
from statekit.state import TaskState, checkpoint

SEED = 11
N = 5


def _open(kafka, state_dir, app, **kw):
    notices = []
    t = TaskState(app, 0, H.specs(), state_dir=str(state_dir), kafka=kafka, warn=notices.append, **kw)
    return t, notices


def _written(kafka, tmp_path, app, n=N):
    t, notices = _open(kafka, tmp_path, app)
    H.run_batches(t, SEED, range(n))
    t.close()
    return os.path.join(str(tmp_path), app, "0")


def _one_line(notices, *words):
    hits = [m for m in notices if all(w in m for w in words)]
    assert len(hits) == 1, notices
    assert "\n" not in hits[0]
    return hits[0]


def test_clean_reopen_replays_nothing(kafka, tmp_path):
    _written(kafka, tmp_path, "rec-clean")
    t, notices = _open(kafka, tmp_path, "rec-clean")
    with t:
        assert notices == []
        assert t.replayed_from == "checkpoint"
        assert all(m.records_restored == 0 and m.lag == 0 for m in t.restore_metrics.values())
        assert H.contents(t) == H.reference(SEED, range(N))
        assert t.already_applied(N - 1) and not t.already_applied(N)


def test_corrupt_checkpoint(kafka, tmp_path):
    d = _written(kafka, tmp_path, "rec-ckpt")
    with open(os.path.join(d, ".checkpoint"), "wb") as f:
        f.write(b"\x00\xffnot json at all")
    t, notices = _open(kafka, tmp_path, "rec-ckpt")
    with t:
        _one_line(notices, "checkpoint", "corrupt")
        assert len(notices) == 1, notices
        assert t.last_batch == N - 1
        assert H.contents(t) == H.reference(SEED, range(N))
    assert checkpoint.read(d) is not None  # rewritten


def test_checkpoint_reader_never_crashes(tmp_path):
    bad = [b"", b"{", b"[]", b'{"version": 1}', b'{"version": 2, "stores": {}}',
           b'{"version": 1, "stores": {"a": {"changelog_offset": "x", "batch": 1}}}',
           b'{"version": 1, "stores": {"a": {"changelog_offset": -5, "batch": 1}}}']
    for raw in bad:
        with open(tmp_path / ".checkpoint", "wb") as f:
            f.write(raw)
        seen = []
        assert checkpoint.read(str(tmp_path), warn=seen.append) is None
        assert len(seen) == 1 and "\n" not in seen[0]
    checkpoint.write(str(tmp_path), {"a": {"changelog_offset": 5, "batch": 2}})
    assert checkpoint.read(str(tmp_path))["a"].changelog_offset == 5
    assert not os.path.exists(tmp_path / ".checkpoint.tmp")


def test_deleted_rocksdb_dir(kafka, tmp_path):
    d = _written(kafka, tmp_path, "rec-norocks")
    shutil.rmtree(os.path.join(d, "rocksdb"))
    t, notices = _open(kafka, tmp_path, "rec-norocks")
    with t:
        _one_line(notices, "checkpoint exists", "RocksDB", "missing")
        assert len(notices) == 1, notices
        assert t.replayed_from == "scratch"
        assert t.last_batch == N - 1
        assert H.contents(t) == H.reference(SEED, range(N))


def test_corrupt_rocksdb_dir(kafka, tmp_path):
    d = _written(kafka, tmp_path, "rec-badrocks")
    for p in glob.glob(os.path.join(d, "rocksdb", "*")):
        if os.path.basename(p).startswith(("MANIFEST", "CURRENT")):
            with open(p, "wb") as f:
                f.write(b"garbage" * 10)
    t, notices = _open(kafka, tmp_path, "rec-badrocks")
    with t:
        _one_line(notices, "RocksDB is unreadable")
        assert len(notices) == 1, notices
        assert t.replayed_from == "scratch"
        assert H.contents(t) == H.reference(SEED, range(N))


def test_missing_changelog_with_intact_local_state(kafka, tmp_path):
    _written(kafka, tmp_path, "rec-notopic")
    kafka.delete_topic("rec-notopic-sums-changelog")
    t, notices = _open(kafka, tmp_path, "rec-notopic")
    with t:
        _one_line(notices, "rec-notopic-sums-changelog", "is missing", "re-seeding")
        assert len(notices) == 1
        assert H.contents(t) == H.reference(SEED, range(N))
        H.run_batches(t, SEED, range(N + 2))  # keeps working on the recreated topic
    assert "rec-notopic-sums-changelog" in kafka.topics()
    # the re-seeded changelog alone restores the same state
    t, notices = _open(kafka, tmp_path / "elsewhere", "rec-notopic")
    with t:
        assert t.replayed_from == "scratch" and notices == []
        assert H.contents(t) == H.reference(SEED, range(N + 2))


def test_missing_changelog_and_no_local_state(kafka, tmp_path):
    _written(kafka, tmp_path, "rec-nothing")
    kafka.delete_topic("rec-nothing-counts-changelog")
    shutil.rmtree(os.path.join(str(tmp_path), "rec-nothing"))
    t, notices = _open(kafka, tmp_path, "rec-nothing")
    with t:
        _one_line(notices, "rec-nothing-counts-changelog", "no local state", "starting empty")
        assert len(notices) == 1
        assert H.contents(t)["counts"] == {}  # lost with the topic: said so above
        assert H.contents(t)["sums"] == H.reference(SEED, range(N))["sums"]


def test_checkpoint_ahead_of_log_is_not_trusted(kafka, tmp_path):
    _written(kafka, tmp_path, "rec-ahead")
    # the topic is recreated by someone else with one committed record: local offsets are past its end
    kafka.delete_topic("rec-ahead-latest-changelog")
    kafka.ensure_topic("rec-ahead-latest-changelog", 1, {"cleanup.policy": "compact"})
    kafka.send("rec-ahead-latest-changelog", 0, [
        (b'"zz"', b"1", [("statekit.batch", b"4")]),
        (b"__statekit.commit__", b'{"batch": 4}', [("statekit.marker", b"1"), ("statekit.batch", b"4")])])
    t, notices = _open(kafka, tmp_path, "rec-ahead")
    with t:
        _one_line(notices, "not trusting local state")
        assert len(notices) == 1, notices
        assert t.replayed_from == "scratch"
        assert H.contents(t)["latest"] == {"zz": 1}


def test_unreachable_broker_fails_in_one_line(tmp_path):
    with pytest.raises(BrokerUnreachable) as e:
        TaskState("rec-x", 0, H.specs(), state_dir=str(tmp_path), bootstrap="127.0.0.1:1")
    assert "\n" not in str(e.value) and "STATEKIT_BOOTSTRAP" in str(e.value)


def test_partition_count_mismatch_fails_clearly(kafka, tmp_path):
    for s in ("counts", "sums", "latest"):
        kafka.ensure_topic(f"rec-parts-{s}-changelog", 2, {"cleanup.policy": "compact"})
    with pytest.raises(StatekitError) as e:
        TaskState("rec-parts", 3, H.specs(), state_dir=str(tmp_path), kafka=kafka, num_tasks=4)
    assert "number of tasks changed" in str(e.value) and "\n" not in str(e.value)
    # the lock was released: the directory can be opened again
    with pytest.raises(StatekitError):
        TaskState("rec-parts", 3, H.specs(), state_dir=str(tmp_path), kafka=kafka, num_tasks=4)


class _Listener:
    def __init__(self):
        self.calls = []

    def on_restore_start(self, store, partition, start_offset, end_offset):
        self.calls.append(("start", store, partition, start_offset, end_offset))

    def on_batch_restored(self, store, partition, batch_end_offset, num_restored):
        self.calls.append(("batch", store, partition, batch_end_offset, num_restored))

    def on_restore_end(self, store, partition, total_restored):
        self.calls.append(("end", store, partition, total_restored))


def test_restore_listener_and_metrics(kafka, tmp_path):
    d = _written(kafka, tmp_path, "rec-listen")
    shutil.rmtree(d)
    lis = _Listener()
    t, notices = _open(kafka, tmp_path, "rec-listen", listener=lis, fetch_max_bytes=100)
    with t:
        ends = {s: kafka.end_offsets(f"rec-listen-{s}-changelog")[0] for s in ("counts", "sums", "latest")}
        for s, end in ends.items():
            starts = [c for c in lis.calls if c[0] == "start" and c[1] == s]
            batches = [c for c in lis.calls if c[0] == "batch" and c[1] == s]
            finish = [c for c in lis.calls if c[0] == "end" and c[1] == s]
            assert starts == [("start", s, 0, 0, end)]
            assert len(batches) >= N and batches[-1][3] == end  # one per Fetch (small max bytes)
            assert sum(c[4] for c in batches) == end
            assert finish == [("end", s, 0, end)]
            m = t.restore_metrics[s]
            assert m.replayed_from == "scratch" and m.records_restored == end
            assert m.records_remaining == 0 and m.duration_s > 0 and m.rate > 0
            assert m.as_dict()["lag"] == end


def test_inspect_while_the_task_writes(kafka, tmp_path):
    from statekit.state import inspect_task

    t, _ = _open(kafka, tmp_path, "rec-insp")
    with t:
        H.run_batches(t, SEED, range(2))
        with inspect_task(str(tmp_path), "rec-insp", 0) as view:
            assert view.last_batch() == 1
            H.run_batches(t, SEED, range(4))
            assert view.refresh().last_batch() == 3
            df = view.to_pandas("counts")
            assert len(df) == len(H.reference(SEED, range(4))["counts"])
            assert view.checkpoint()["counts"]["batch"] == 3


def test_window_store_restores_and_uses_compact_delete(kafka, tmp_path):
    from statekit.stores import StoreSpec

    specs = [StoreSpec("clicks", kind="window", window_size_ms=1000, retention_ms=3_600_000),
             StoreSpec("totals")]
    ref = {}
    with TaskState("rec-win", 0, specs, state_dir=str(tmp_path / "a"), kafka=kafka) as t:
        for b in range(4):
            for i in range(10):
                user, ws = f"u{i % 3}", 1_000 * (b * 10 + i) // 7 // 1000 * 1000
                v = (t["clicks"].get(user, ws) or 0) + 1
                t["clicks"].put(user, v, ws)
                ref[(user, ws)] = v
                t["totals"].put(user, (t["totals"].get(user) or 0) + 1)
            t.commit(b)
        before = sorted(t["clicks"].all())
    cfg = kafka.describe_configs("rec-win-clicks-changelog")
    assert cfg["cleanup.policy"] == "compact,delete"
    assert kafka.describe_configs("rec-win-totals-changelog")["cleanup.policy"] == "compact"
    with TaskState("rec-win", 0, specs, state_dir=str(tmp_path / "b"), kafka=kafka) as t:
        assert t.replayed_from == "scratch" and t.last_batch == 3
        assert sorted(t["clicks"].all()) == before
        assert {(k, ws): v for k, ws, v in t["clicks"].fetch_all(0, 10**9)} == ref
