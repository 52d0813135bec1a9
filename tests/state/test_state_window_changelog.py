"""Window stores and the two changelog hazards kv stores were already covered for:

* a crashed attempt's records of a window (key + window_start) shadow that window's committed value
  under compaction, so restoration must seal them (re-write the restored values + a marker);
* a lost changelog topic with intact local state is re-seeded from the store, in changelog form
  (key + window_start, no segment prefix), so a later restore from scratch gives the same windows.
"""
from __future__ import annotations

import shutil
import struct

from statekit import broker as broker_mod
from statekit.kafka import Kafka
from statekit.state import TaskState
from statekit.stores import StoreSpec

USERS = [f"u{i}" for i in range(6)]
CLEAN = {"segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01",
         "delete.retention.ms": "0", "min.compaction.lag.ms": "0"}


def _specs():
    return [StoreSpec("clicks", kind="window", window_size_ms=1000, retention_ms=3_600_000,
                      segment_ms=60_000),
            StoreSpec("totals")]


def _wkey(user: str, ws: int) -> bytes:
    return f'"{user}"'.encode() + struct.pack(">Q", ws)


def _apply(t, b: int, ref: dict, tot: dict) -> None:
    """Batch b: six clicks in windows that spread over several 60 s segments."""
    for i in range(6):
        user = USERS[(b + i) % len(USERS)]
        ws = ((b * 37 + i * 11) % 240) * 1000
        v = (t["clicks"].get(user, ws) or 0) + 1
        t["clicks"].put(user, v, ws)
        ref[(user, ws)] = v
        tot[user] = tot.get(user, 0) + 1
        t["totals"].put(user, tot[user])


def _windows(t) -> dict:
    return {(k, ws): v for k, ws, v in t["clicks"].all()}


def test_window_dropped_tail_is_sealed_before_the_cleaner_eats_committed_windows(broker, tmp_path):
    k = Kafka(broker.bootstrap)
    topic = "wseal-clicks-changelog"
    try:
        ref, tot = {}, {}
        state = str(tmp_path / "s")
        with TaskState("wseal", 0, _specs(), state_dir=state, kafka=k, topic_configs=CLEAN) as t:
            for b in range(40):
                _apply(t, b, ref, tot)
                t.commit(b)
        victims = sorted(ref)[:2]  # two committed windows
        assert all(ref[w] >= 1 for w in victims)
        # batch 40 crashed mid-send: a new value for one window and a tombstone for the other
        # reached the log, the marker did not
        crash_last = k.send(topic, 0, [(_wkey(*victims[0]), b"999"), (_wkey(*victims[1]), None)],
               headers=[("statekit.batch", b"40")])
        with TaskState("wseal", 0, _specs(), state_dir=state, kafka=k) as t:
            m = t.restore_metrics["clicks"]
            assert m.dropped_uncommitted == 2
            sealed = m.as_dict().get("sealed")
            assert _windows(t) == ref and t.last_batch == 39
            # the task goes on with windows of other users, so the crashed records' segment rolls
            # and the cleaner reaches them
            for b in range(41, 61):
                for i in range(4):
                    ws = (b * 1000 + i * 250) // 1000 * 1000 + 300_000
                    t["clicks"].put("z", (t["clicks"].get("z", ws) or 0) + 1, ws)
                    ref[("z", ws)] = t["clicks"].get("z", ws)
                t.commit(b)
            assert _windows(t) == ref
        stats = broker_mod.request_clean(broker.dir)
        st = [s for s in stats if s["topic"] == topic][0]
        assert st["cleaner_runs"] >= 1 and st["records_removed"] > 0
        shutil.rmtree(tmp_path / "s")  # then the disk is lost
        with TaskState("wseal", 0, _specs(), state_dir=state, kafka=k) as t:
            assert t.replayed_from == "scratch"
            assert _windows(t) == ref
            assert dict(t["totals"].all()) == tot
            assert t.last_batch == 60
        assert sealed == 2
        # why this matters: the cleaner removed every committed record of the victims (all that is
        # left of each is at or after the crashed attempt), so only the seal's repair, the last
        # record of the key, carries its committed value
        by_key: dict = {}
        for ch in k.read(topic, 0):
            for off, _ts, key, value, headers in ch.records:
                by_key.setdefault(key, []).append((off, value, dict(headers).get("statekit.batch")))
        for user, ws in victims:
            recs = by_key[_wkey(user, ws)]
            assert all(off >= crash_last - 1 for off, _v, _b in recs), recs
            assert recs[-1][1] == str(ref[(user, ws)]).encode() and recs[-1][2] == b"39", recs
    finally:
        k.close()



def test_a_sealed_crashed_window_far_ahead_does_not_expire_committed_windows(broker, tmp_path):
    """A crashed attempt wrote a window ten hours ahead (retention: one hour); the reopened task
    sealed it with a tombstone; then the disk is lost. Restoring from scratch must give exactly the
    committed windows: the crashed record is skipped (superseded by the seal) and the seal's
    tombstone does not move stream time, so nothing committed expires."""
    k = Kafka(broker.bootstrap)
    topic = "wfar-clicks-changelog"
    try:
        ref, tot = {}, {}
        state = str(tmp_path / "s")
        with TaskState("wfar", 0, _specs(), state_dir=state, kafka=k) as t:
            for b in range(10):
                _apply(t, b, ref, tot)
                t.commit(b)
            stream_time = t["clicks"].segmented.stream_time
        assert stream_time == max(ws for _u, ws in ref)
        k.send(topic, 0, [(_wkey("u0", 10 * 3_600_000), b"5")], headers=[("statekit.batch", b"10")])
        with TaskState("wfar", 0, _specs(), state_dir=state, kafka=k) as t:
            assert t.restore_metrics["clicks"].as_dict()["sealed"] == 1
            assert _windows(t) == ref
        shutil.rmtree(tmp_path / "s")
        with TaskState("wfar", 0, _specs(), state_dir=state, kafka=k) as t:
            m = t.restore_metrics["clicks"]
            assert t.replayed_from == "scratch" and m.superseded == 1
            assert _windows(t) == ref and dict(t["totals"].all()) == tot
            assert t["clicks"].segmented.stream_time == stream_time
            assert t.last_batch == 9
    finally:
        k.close()

def test_lost_window_changelog_is_reseeded_from_the_local_store(shared_broker, tmp_path):
    k = Kafka(shared_broker.bootstrap)
    app = "wreseed"
    try:
        ref, tot = {}, {}
        with TaskState(app, 0, _specs(), state_dir=str(tmp_path / "a"), kafka=k) as t:
            for b in range(12):
                _apply(t, b, ref, tot)
                t.commit(b)
        assert len({ws // 60_000 for _u, ws in ref}) >= 3  # several segments (prefix stripped)
        k.delete_topic(f"{app}-clicks-changelog")
        notices: list = []
        with TaskState(app, 0, _specs(), state_dir=str(tmp_path / "a"), kafka=k,
                       warn=notices.append) as t:
            reopen_notices, seeded = list(notices), len(ref)
            assert _windows(t) == ref and t.last_batch == 11
            for b in range(12, 15):  # keeps working on the recreated topic
                _apply(t, b, ref, tot)
                t.commit(b)
        assert k.describe_configs(f"{app}-clicks-changelog")["cleanup.policy"] == "compact,delete"
        # the re-seeded changelog alone restores the same windows
        notices = []
        with TaskState(app, 0, _specs(), state_dir=str(tmp_path / "b"), kafka=k,
                       warn=notices.append) as t:
            assert t.replayed_from == "scratch"
            assert _windows(t) == ref
            assert dict(t["totals"].all()) == tot
            assert t.last_batch == 14
            assert notices == []
        hits = [n for n in reopen_notices if "re-seeding" in n and f"{app}-clicks-changelog" in n]
        assert len(hits) == 1 and len(reopen_notices) == 1, reopen_notices
        assert f"({seeded} records)" in hits[0]
    finally:
        k.close()
