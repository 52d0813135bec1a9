"""Compaction pays: after the broker has cleaned a changelog, a restore from scratch replays at most
the live keys plus the uncleaned tail (and the latest commit marker), not every write ever made."""
from __future__ import annotations

import random
import shutil

from statekit import broker as broker_mod
from statekit.kafka import Kafka
from statekit.state import TaskState
from statekit.stores import StoreSpec

KEYS = [f"k{i:02d}" for i in range(40)]


def _sixty_commits(k, app: str, state: str) -> dict:
    """Batches 0-59 of a count over small segments; k00-k04 are written only in batches 0-2, so
    their committed values sit in long-closed segments. Returns the committed counts."""
    cfg = {"segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01",
           "delete.retention.ms": "0", "min.compaction.lag.ms": "0"}
    ref: dict = {}
    with TaskState(app, 0, [StoreSpec("counts")], state_dir=state, kafka=k,
                   topic_configs=cfg) as t:
        for b in range(60):
            for key in KEYS[:5] if b < 3 else KEYS[10 + b % 20: 12 + b % 20]:
                ref[key] = ref.get(key, 0) + 1
                t["counts"].put(key, ref[key])
            t.commit(b)
    return ref


def _crash_mid_send(k, topic: str) -> None:
    """Batch 60 crashed mid-send: new values for k00 and k01 reached the log, the marker did not."""
    k.send(topic, 0, [(b'"k00"', b"999"), (b'"k01"', None)], headers=[("statekit.batch", b"60")])


def test_restore_after_compaction(broker, tmp_path):
    k = Kafka(broker.bootstrap)
    try:
        cfg = {"segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01",
               "delete.retention.ms": "0", "min.compaction.lag.ms": "0"}
        ref = {}
        r = random.Random(3)
        with TaskState("cmp", 0, [StoreSpec("counts")], state_dir=str(tmp_path / "a"), kafka=k,
                       topic_configs=cfg) as t:
            for b in range(150):
                for key in r.sample(KEYS, 10):
                    t["counts"].put(key, ref.get(key, 0) + 1)
                    ref[key] = ref.get(key, 0) + 1
                t.commit(b)
        topic = "cmp-counts-changelog"
        written = k.end_offsets(topic)[0]
        assert written == 150 * 11  # 10 records + 1 marker per commit

        stats = broker_mod.request_clean(broker.dir)
        st = [s for s in stats if s["topic"] == topic][0]
        assert st["cleaner_runs"] >= 1 and st["records_removed"] > 0
        assert st["segments"] >= 2  # cleaned segments (merged) + the active one

        with TaskState("cmp", 0, [StoreSpec("counts")], state_dir=str(tmp_path / "b"),
                       kafka=k) as t:
            m = t.restore_metrics["counts"]
            assert dict(t["counts"].all()) == ref   # still exact
            assert t.last_batch == 149
            restored = m.records_restored
            offsets = [o for ch in k.read(topic, 0) for o in (r[0] for r in ch.records)]
        # the restore read exactly what the cleaned log holds, once
        assert restored == st["records"] == len(offsets)
        # the uncleaned tail is the active segment: a run of consecutive offsets ending at the end
        tail = 1
        while tail < len(offsets) and offsets[-tail - 1] == offsets[-tail] - 1:
            tail += 1
        live = len(ref)
        assert restored <= live + 1 + tail, (restored, live, tail)
        assert restored < written / 4, (restored, written)
    finally:
        k.close()


def test_dropped_tail_is_sealed_before_the_cleaner_can_eat_committed_values(broker, tmp_path):
    """A crashed attempt leaves uncommitted records after the last marker. They are later than the
    committed values of the same keys, so compaction would keep them and drop the committed ones;
    restoration drops them too -> the keys would vanish. Restoring with local state therefore
    re-commits those keys (their restored values + a marker), so a later cleaner pass and a
    restore from scratch still give the committed state."""
    k = Kafka(broker.bootstrap)
    topic = "seal-counts-changelog"
    try:
        state = str(tmp_path / "s")
        ref = _sixty_commits(k, "seal", state)
        _crash_mid_send(k, topic)
        with TaskState("seal", 0, [StoreSpec("counts")], state_dir=state, kafka=k) as t:
            m = t.restore_metrics["counts"]
            assert m.dropped_uncommitted == 2 and m.as_dict()["sealed"] == 2
            assert dict(t["counts"].all()) == ref and t.last_batch == 59
        broker_mod.request_clean(broker.dir)
        shutil.rmtree(tmp_path / "s")  # then the disk is lost
        with TaskState("seal", 0, [StoreSpec("counts")], state_dir=state, kafka=k) as t:
            assert t.replayed_from == "scratch"
            assert dict(t["counts"].all()) == ref
            assert t.last_batch == 59
    finally:
        k.close()


def test_crash_then_cleaner_then_disk_loss_before_any_reopen_loses_nothing(broker, tmp_path):
    """The double failure the seal cannot cover (the task never reopens in between): a commit crashes
    mid-send, the cleaner runs, then the local state is lost. The crashed records are the newest of
    their keys, but they sit past the cleaner's first uncleanable offset (the active segment), so
    they cannot make the committed values go; a restore from scratch drops them and is exact."""
    k = Kafka(broker.bootstrap)
    topic = "dbl-counts-changelog"
    try:
        state = str(tmp_path / "s")
        ref = _sixty_commits(k, "dbl", state)
        assert ref["k00"] == 3 and "k01" in ref  # written only in batches 0-2: long since closed
        _crash_mid_send(k, topic)
        stats = broker_mod.request_clean(broker.dir)
        st = next(s for s in stats if s["topic"] == topic)
        assert st["cleaner_runs"] >= 1 and st["records_removed"] > 0
        shutil.rmtree(tmp_path / "s")  # the disk is lost before the task ever opens again
        with TaskState("dbl", 0, [StoreSpec("counts")], state_dir=state, kafka=k) as t:
            m = t.restore_metrics["counts"]
            assert t.replayed_from == "scratch"
            assert m.dropped_uncommitted == 2
            assert dict(t["counts"].all()) == ref
            assert t.last_batch == 59
    finally:
        k.close()
