"""api.SortedKeys against sorted(dict) under random interleavings of writes, deletes and scans —
including the scan-after-every-write pattern of session windows and joins, where new keys are
inserted one by one into a long view instead of re-sorting it."""
from __future__ import annotations

import random

import pytest

from statekit.stores.api import SortedKeys


@pytest.mark.parametrize("seed", range(6))
def test_sorted_view_matches_the_dict(seed):
    rng = random.Random(seed)
    d: dict = {}
    view = SortedKeys(d)
    for step in range(3000):
        op = rng.random()
        k = rng.randrange(2000).to_bytes(2, "big") + bytes(rng.randrange(3))
        if op < 0.55:
            if k not in d:
                view.added(k)
            d[k] = b"v"
        elif op < 0.7:
            if d.pop(k, None) is not None:
                view.removed()
        else:
            lo = rng.randrange(2000).to_bytes(2, "big") if rng.random() < 0.8 else None
            hi = rng.randrange(2000).to_bytes(2, "big") if rng.random() < 0.8 else None
            want = sorted(x for x in d if (lo is None or x >= lo) and (hi is None or x < hi))
            assert view.keys_in(lo, hi) == want, step
    assert view.keys_in(None, None) == sorted(d)


def test_keys_that_leave_before_any_scan_do_not_pile_up():
    """A cache evicts a build's keys batch after batch and nothing scans it: the view must not
    keep every key it was ever told about."""
    d: dict = {}
    view = SortedKeys(d)
    for batch in range(40):
        keys = [b"%d-%06d" % (batch, i) for i in range(5000)]
        d.update(dict.fromkeys(keys, b"v"))
        view.added_many(keys)
        for k in keys[:4500]:            # evicted: only the last 500 of each batch stay
            del d[k]
        view.removed(4500)
        # at most twice the dict's keys (as they were when told) plus a margin, and the batch
        # just told: without the trim it would hold all 5000 * (batch + 1) keys
        assert len(view._new) <= 2 * (len(d) + 4500) + 4096 + 5000
    assert len(d) == 20000 and view.keys_in(None, None) == sorted(d)


def test_keys_told_before_they_enter_the_dict_stay_in_the_view():
    """The overlay tells the view about a bulk write's keys, then puts them in its dict."""
    d: dict = {}
    view = SortedKeys(d)
    for batch in range(3):
        keys = [b"%d-%06d" % (batch, i) for i in range(6000)]
        view.added_many(keys)
        d.update(dict.fromkeys(keys, b"v"))
        assert view.keys_in(None, None) == sorted(d)
