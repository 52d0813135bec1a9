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
