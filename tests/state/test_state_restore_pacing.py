"""A restore you can watch: progress in small steps, and a throttle for teaching (restore_rate)."""
from __future__ import annotations

import json

import pytest

from statekit.errors import StatekitError
from statekit.kafka import Kafka
from statekit.state import TaskState
from statekit.state.restore import (BATCH_HEADER, MARKER_HEADER, MARKER_KEY, PROGRESS_RECORDS,
                                    PROGRESS_S, Pacer)
from statekit.stores import StoreSpec


class Listener:
    def __init__(self):
        self.starts, self.batches, self.ends = [], [], []

    def on_restore_start(self, store, partition, start, end):
        self.starts.append((store, start, end))

    def on_batch_restored(self, store, partition, end_offset, n):
        self.batches.append((store, end_offset, n))

    def on_restore_end(self, store, partition, total):
        self.ends.append((store, total))


def seed_changelog(k, topic: str, n: int, keys: int, per_commit: int) -> int:
    k.ensure_topic(topic, 1, {"cleanup.policy": "compact"})
    written, batch = 0, 0
    while written < n:
        m = min(per_commit, n - written)
        bh = [(BATCH_HEADER, str(batch).encode())]
        recs = [(b"k%d" % ((written + i) % keys), b"%d" % (written + i), bh) for i in range(m)]
        recs.append((MARKER_KEY, json.dumps({"batch": batch}).encode(),
                     [(MARKER_HEADER, b"1"), (BATCH_HEADER, str(batch).encode())]))
        k.send(topic, 0, recs)
        written += m
        batch += 1
    return k.end_offsets(topic)[0]


def test_progress_is_reported_in_small_steps(broker, tmp_path):
    k = Kafka(broker.bootstrap)
    try:
        end = seed_changelog(k, "pg-counts-changelog", 160_000, 40_000, 20_000)
        lis = Listener()
        with TaskState("pg", 0, [StoreSpec("counts")], state_dir=str(tmp_path), kafka=k,
                       listener=lis) as t:
            m = t.restore_metrics["counts"]
            assert m.throttled_to is None
            assert m.records_restored == end == 160_008
            assert sum(1 for _ in t.db.items("counts")) == 40_000
        # every record read is reported, in steps of at most PROGRESS_RECORDS, in offset order
        assert sum(n for _s, _o, n in lis.batches) == end
        assert max(n for _s, _o, n in lis.batches) <= PROGRESS_RECORDS
        assert len(lis.batches) >= end // PROGRESS_RECORDS + 1
        offs = [o for _s, o, _n in lis.batches]
        assert offs == sorted(offs) and offs[-1] == end
        assert lis.ends == [("counts", end)]
    finally:
        k.close()


def test_a_throttled_restore_is_paced_in_small_steps_and_says_so(broker, tmp_path):
    k = Kafka(broker.bootstrap)
    try:
        end = seed_changelog(k, "th-counts-changelog", 3_000, 500, 1_000)
        rate = 20_000.0
        lis = Listener()
        with TaskState("th", 0, [StoreSpec("counts")], state_dir=str(tmp_path), kafka=k,
                       listener=lis, restore_rate=rate) as t:
            m = t.restore_metrics["counts"]
            assert m.throttled_to == rate and m.as_dict()["throttled_to"] == rate
            assert m.records_restored == end == 3_003
            assert dict(t.db.items("counts"))[b"k499"] == b"2999"
        step = int(rate * PROGRESS_S)
        assert [n for _s, _o, n in lis.batches][:3] == [step] * 3  # many small WriteBatches
        assert sum(n for _s, _o, n in lis.batches) == end
        # the pacer sleeps until each step is due: the restore cannot be faster than the rate
        assert m.duration_s >= (end - step) / rate
    finally:
        k.close()


def test_the_pacer_sleeps_a_little_before_each_step_never_once_at_the_end():
    now = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    p = Pacer(1_000, clock=lambda: now[0], sleep=sleep)
    assert p.step() == int(1_000 * PROGRESS_S)
    p.start()
    for _ in range(20):
        now[0] += 0.01          # 10 ms of work per step of 50 records (5x faster than allowed)
        p.pace(p.step())
    assert len(sleeps) == 20 and all(abs(s - 0.04) < 1e-9 for s in sleeps)
    assert abs(now[0] - 1.0) < 1e-9 and abs(p.slept - 0.8) < 1e-9  # 1000 records in 1 s
    # after a stall there is no burst to catch up: the next steps are paced at the rate again
    now[0] += 0.5
    p.pace(50)
    assert len(sleeps) == 20  # this step is late already
    p.pace(50)
    assert len(sleeps) == 21 and abs(sleeps[-1] - 0.05) < 1e-9


@pytest.mark.parametrize("bad", [0, -5, "fast", float("nan"), float("inf")])
def test_a_bad_restore_rate_is_one_line_that_says_what_to_give(tmp_path, bad):
    with pytest.raises(StatekitError) as e:
        TaskState("bad", 0, [StoreSpec("counts")], state_dir=str(tmp_path), kafka=object(),
                  restore_rate=bad)
    msg = str(e.value)
    assert "\n" not in msg and "records per second" in msg and repr(bad) in msg
    assert not (tmp_path / "bad").exists()  # nothing was opened or created
