"""`Records`: a task's micro-batch in the order Kafka Streams processes it. `Records.merge` (a
stable sort by each record's running maximum timestamp within its partition) must give exactly the
order of Kafka Streams' own rule — always the head record with the lowest timestamp, ties to the
lower source index, then partition — which topo_models.kstreams_merge transcribes step by step."""
from __future__ import annotations

import importlib.util
import os
import random

import pytest

from statekit.topology.records import Records

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("topo_models", os.path.join(HERE, "topo_models.py"))
M = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)


def random_parts(rng):
    """1-4 single-source parts (distinct (source, partition)), 0-12 records each, timestamps from
    a small range (many ties, runs that go back in time), some None keys and values."""
    pairs = rng.sample([(s, p) for s in range(4) for p in range(3)], rng.randint(1, 4))
    parts = []
    for src, part in pairs:
        n = rng.randint(0, 12)
        start = rng.randint(0, 1000)
        offsets = list(range(start, start + n))
        stamps = [rng.randint(0, 15) for _ in range(n)]
        keys = [None if rng.random() < 0.2 else b"k%d" % rng.randint(0, 3) for _ in range(n)]
        values = [None if rng.random() < 0.2 else b"v%d" % o for o in offsets]
        parts.append(Records.of(src, part, offsets, stamps, keys, values))
    return parts


@pytest.mark.parametrize("seed", range(8))
def test_merge_is_kafka_streams_head_timestamp_choice(seed):
    rng = random.Random(seed)
    for _ in range(250):
        parts = random_parts(rng)
        got = list(Records.merge(parts).rows())
        want = M.kstreams_merge([(p.source, p.partitions[0] if len(p) else 0, list(p.rows()))
                                 for p in parts], lambda r: r[3])
        assert got == want, [list(p.rows()) for p in parts]


def test_merge_keeps_offset_order_within_a_partition_and_the_single_source():
    a = Records.of(0, 2, [5, 6, 7], [30, 10, 20], [b"a", b"b", None], [b"1", None, b"3"])
    b = Records.of(1, 2, [0, 1], [15, 40], [b"x", b"y"], [b"4", b"5"])
    m = Records.merge([b, a])
    # heads 30 vs 15: b's 15; then 30 vs 40: a's 30, then a's 10 and 20 (a's head stays below 40)
    assert list(zip(m.sources, m.offsets)) == [(1, 0), (0, 5), (0, 6), (0, 7), (1, 1)]
    assert m.source is None and len(m) == 5
    assert m.keys == [b"x", b"a", b"b", None, b"y"] and m.values == [b"4", b"1", None, b"3", b"5"]
    assert Records.merge([a, Records.empty()]) is a and Records.merge([a]).source == 0
    assert len(Records.merge([])) == 0
    # ties: the lower source index first, then the lower partition
    c = Records.of(1, 0, [0], [7], [b"c"], [b"c"])
    d = Records.of(0, 1, [0], [7], [b"d"], [b"d"])
    e = Records.of(0, 0, [0], [7], [b"e"], [b"e"])
    assert Records.merge([c, d, e]).keys == [b"e", b"d", b"c"]


def test_slices_of_a_merged_batch_are_the_batch():
    rng = random.Random(3)
    parts = random_parts(rng) + random_parts(rng)[:1]
    parts = list({(p.source, p.partitions[0] if len(p) else -1): p for p in parts}.values())
    m = Records.merge(parts)
    for cut in range(len(m) + 1):
        first, rest = m.slice(0, cut), m.slice(cut, len(m))
        assert list(first.rows()) + list(rest.rows()) == list(m.rows())
    idx = list(range(0, len(m), 2))
    assert list(m.take(idx).rows()) == [r for i, r in enumerate(m.rows()) if i % 2 == 0]
    rows = list(m.rows())
    again = Records.from_rows(rows)
    assert list(again.rows()) == rows and again.source == m.source
