"""StoreReplay, the marker logic shared by restoration and standby replicas, on hand-made logs."""
from __future__ import annotations

import json

from statekit.state.restore import BATCH_HEADER, MARKER_HEADER, MARKER_KEY, StoreReplay


def log(*entries):
    """entries: ("d", key, value, batch) | ("m", batch) -> decoded records with offsets."""
    out = []
    for off, e in enumerate(entries):
        if e[0] == "m":
            out.append((off, 0, MARKER_KEY, json.dumps({"batch": e[1]}).encode(),
                        ((MARKER_HEADER, b"1"), (BATCH_HEADER, str(e[1]).encode()))))
        else:
            out.append((off, 0, e[1], e[2], ((BATCH_HEADER, str(e[3]).encode()),)))
    return out


def test_groups_wait_for_their_marker_and_the_tail_is_dropped():
    rp = StoreReplay("s", 0)
    recs = log(("d", b"a", b"1", 0), ("m", 0), ("d", b"a", b"2", 1), ("d", b"b", b"1", 1), ("m", 1),
               ("d", b"a", b"3", 2))  # batch 2 never committed
    applied = rp.feed(recs)
    assert applied == [(b"a", b"1")]          # batch 0: safe once batch 1 committed
    assert rp.held == [(b"a", b"2"), (b"b", b"1")]  # batch 1: the latest, held for the task
    assert rp.batch == 1 and rp.applied_batch == 0
    assert rp.safe_offset == 2                 # replaying from after marker 0 is safe
    assert len(rp.pending) == 1                # the tail
    assert rp.release_held() == [(b"a", b"2"), (b"b", b"1")]
    assert rp.meta() == {"offset": 5, "batch": 1}


def test_a_store_ahead_drops_its_latest_batch():
    rp = StoreReplay("s", 0)
    rp.feed(log(("d", b"a", b"1", 0), ("m", 0), ("d", b"a", b"2", 1), ("m", 1)))
    assert rp.drop_held() == 1
    assert rp.batch == 0 and rp.meta() == {"offset": 2, "batch": 0}


def test_merged_groups_after_compaction_apply_older_batches_at_once():
    # compaction removed markers 0..2: one group, closed by marker 3, holds records of batches 0-3
    rp = StoreReplay("s", 0)
    applied = rp.feed(log(("d", b"a", b"1", 0), ("d", b"b", b"1", 2), ("d", b"c", b"9", 3),
                          ("m", 3)))
    assert applied == [(b"a", b"1"), (b"b", b"1")]
    assert rp.held == [(b"c", b"9")]



def test_a_crashed_attempt_before_a_seal_is_skipped():
    # batch 5 crashed mid-send (a, b reached the log); the reopened task sealed a and b at its
    # batch 4: a record newer than the marker closing its group is never applied
    rp = StoreReplay("s", 0)
    applied = rp.feed(log(("d", b"a", b"1", 4), ("m", 4), ("d", b"a", b"9", 5), ("d", b"b", b"9", 5),
                          ("d", b"a", b"1", 4), ("d", b"b", None, 4), ("m", 4)))
    assert applied == []
    assert rp.held == [(b"a", b"1"), (b"a", b"1"), (b"b", None)]
    assert rp.superseded == 2 and rp.batch == 4 and not rp.pending
    # the same rule when the store had already seen a newer marker (it committed batch 6, another
    # store did not; the reopened task went back to 5): records of batch 6 before marker 5 are skipped
    rp = StoreReplay("s", 0)
    rp.feed(log(("d", b"a", b"1", 6), ("m", 6), ("d", b"a", b"2", 6), ("m", 5)))
    assert rp.held == [(b"a", b"1")] and rp.superseded == 1

def test_a_rerun_of_a_batch_accumulates_in_held():
    rp = StoreReplay("s", 0)
    rp.feed(log(("d", b"a", b"1", 4), ("m", 4), ("d", b"a", b"1", 4), ("d", b"b", b"2", 4), ("m", 4)))
    assert rp.held == [(b"a", b"1"), (b"a", b"1"), (b"b", b"2")]
    assert rp.safe_offset == 0 and rp.batch == 4


def test_resume_from_the_middle_keeps_counting():
    rp = StoreReplay("s", 10, batch=7)
    recs = [(10 + r[0], *r[1:]) for r in log(("d", b"x", b"1", 8), ("m", 8))]
    assert rp.feed(recs, next_offset=12) == []
    assert rp.held == [(b"x", b"1")] and rp.position == 12 and rp.safe_offset == 10
