"""What a task open and commit cost on the Kafka side and on disk, when nothing is to restore:
no checkpoint rewrite on a clean reopen, no Metadata request when every changelog exists, every
store's changelog sent in one pipelined round trip — and the same state as before in every case."""
from __future__ import annotations

import os

import statehelpers as H
from statekit.kafka import Kafka
from statekit.state import TaskState, checkpoint

SEED = 5


class _Counting:
    """Counts calls of some Kafka methods of one client (then delegates)."""

    def __init__(self, kafka, monkeypatch, names):
        self.calls = {n: 0 for n in names}
        for n in names:
            real = getattr(kafka, n)

            def wrapped(*a, _n=n, _real=real, **kw):
                self.calls[_n] += 1
                return _real(*a, **kw)

            monkeypatch.setattr(kafka, n, wrapped)


def _ckpt(task_dir):
    p = checkpoint.path_for(task_dir)
    st = os.stat(p)
    with open(p, "rb") as f:
        return st.st_ino, f.read()


def test_clean_reopen_keeps_the_checkpoint_and_skips_metadata(kafka, tmp_path, monkeypatch):
    app = "oc-clean"
    with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "a"), kafka=kafka) as t:
        H.run_batches(t, SEED, range(3))
    task_dir = str(tmp_path / "a" / app / "0")
    before = _ckpt(task_dir)
    counting = _Counting(kafka, monkeypatch, ["topics", "partition_counts", "offsets_many",
                                              "send", "send_many"])
    with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "a"), kafka=kafka) as t:
        assert t.replayed_from == "checkpoint" and t.last_batch == 2
        assert H.contents(t) == H.reference(SEED, range(3))
    # the same file (not rewritten: same inode, same bytes); one round trip for every offset
    assert _ckpt(task_dir) == before
    assert counting.calls == {"topics": 0, "partition_counts": 0, "offsets_many": 1, "send": 0,
                              "send_many": 0}
    # a commit sends the three stores' changelogs together, and the checkpoint follows it
    with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "a"), kafka=kafka) as t:
        assert H.run_batches(t, SEED, range(4)) == [3]
        info = t.db.read_meta()
    assert counting.calls["send_many"] == 1 and counting.calls["send"] == 0
    ends = {s: kafka.end_offsets(f"{app}-{s}-changelog")[0] for s in ("counts", "sums", "latest")}
    assert {s: info[f"changelog.{s}"]["offset"] for s in ends} == ends
    assert checkpoint.read(task_dir) == {s: checkpoint.StoreCheckpoint(ends[s], 3) for s in ends}
    assert _ckpt(task_dir)[0] != before[0]


def test_reopen_after_the_changelog_moved_on_rewrites_the_checkpoint(kafka, tmp_path):
    app = "oc-moved"
    with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "a"), kafka=kafka) as t:
        H.run_batches(t, SEED, range(3))
    # the task ran elsewhere for two batches (another instance's disk)
    with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "b"), kafka=kafka) as t:
        H.run_batches(t, SEED, range(5))
    task_dir = str(tmp_path / "a" / app / "0")
    with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "a"), kafka=kafka) as t:
        assert t.replayed_from == "checkpoint" and t.last_batch == 4
        assert H.contents(t) == H.reference(SEED, range(5))
        assert sum(m.records_restored for m in t.restore_metrics.values()) > 0
    ends = {s: kafka.end_offsets(f"{app}-{s}-changelog")[0] for s in ("counts", "sums", "latest")}
    assert checkpoint.read(task_dir) == {s: checkpoint.StoreCheckpoint(ends[s], 4) for s in ends}


def test_missing_changelog_falls_back_to_metadata(kafka, tmp_path):
    app = "oc-missing"
    with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "a"), kafka=kafka) as t:
        H.run_batches(t, SEED, range(2))
    kafka.delete_topic(f"{app}-latest-changelog")
    notices: list = []
    with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "a"), kafka=kafka,
                   warn=notices.append) as t:
        assert len(notices) == 1 and "re-seeding" in notices[0], notices
        assert H.contents(t) == H.reference(SEED, range(2))
        H.run_batches(t, SEED, range(3))
    with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "b"), kafka=kafka) as t:
        assert t.replayed_from == "scratch"
        assert H.contents(t) == H.reference(SEED, range(3))
