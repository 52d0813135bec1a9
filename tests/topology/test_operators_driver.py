"""The new operators on the TopologyTestDriver (real processors and stores, no Spark, no broker),
against the plain-Python models of topo_models.py over seeded random inputs: out-of-order records
within and beyond the grace period, tombstones, None keys and values. Bigger runs: `slow`."""
from __future__ import annotations

import importlib.util
import os
import random
from collections import defaultdict

import pytest

from statekit.errors import ProcessorError, StatekitError
from statekit.testing import TopologyTestDriver
from statekit.topology import (JoinWindows, Processor, PunctuationType, SessionWindowedSerde,
                               SessionWindows, SlidingWindows, TopologyBuilder, WindowedSerde,
                               kv_store, tumbling, until_time_limit, until_window_closes)

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("topo_models", os.path.join(HERE, "topo_models.py"))
M = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)

SLOW_SEEDS = range(4, 40)


def utf8(k):
    return k.encode("utf-8")


def jitter_times(rng, n, spread, late_every=5, late_by=40):
    """Mostly increasing timestamps; every few records one that is late by up to `late_by` ms."""
    t, out = 0, []
    for i in range(n):
        t += rng.randint(0, spread)
        out.append(max(0, t - rng.randint(0, late_by)) if rng.random() < 1 / late_every else t)
    return out


# -- stream-stream joins ---------------------------------------------------------------------------------

def join_records(rng, n):
    recs = []
    for ts in jitter_times(rng, n, 4, late_every=4, late_by=30):
        side = rng.choice(["left", "right"])
        k = rng.choice(["a", "b", "c", "d", None] if rng.random() < 0.1 else ["a", "b", "c", "d"])
        v = None if rng.random() < 0.08 else rng.randint(0, 99)
        recs.append((side, k, v, ts))
    return recs


def pair(left, right):
    return [left, right]


def join_builder(how, windows):
    b = TopologyBuilder()
    left = b.stream("L", value_serde="json")
    right = b.stream("R", value_serde="json")
    left.join(right, pair, windows, how=how, value_serde="json", store="j").to("out", value_serde="json")
    return b


def run_stream_join(how, seed, n=80):
    rng = random.Random(seed)
    before, after, grace = rng.choice([(5, 5, 0), (10, 3, 4), (0, 8, 10), (7, 0, 2), (3, 3, 20)])
    recs = join_records(rng, n)
    model = M.StreamJoinModel(before, after, grace, how, pair, utf8)
    want = [o for r in recs for o in model.step(*r)]
    with TopologyTestDriver(join_builder(how, JoinWindows(before, after, grace)), "sj") as d:
        for side, k, v, ts in recs:
            d.pipe_input("L" if side == "left" else "R", k, v, ts)
        got = d.read_output_records("out")
        assert d.skipped_null == sum(1 for s, k, v, _ in recs
                                     if (k is None and not (v is not None and (
                                         how == "outer" or (how == "left" and s == "left"))))
                                     or (k is not None and v is None))
    assert got == want, (before, after, grace)
    return want


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
@pytest.mark.parametrize("seed", range(4))
def test_stream_join_matches_model(how, seed):
    want = run_stream_join(how, seed)
    assert any(v[0] is not None and v[1] is not None for _k, v, _t in want)    # some matches
    if how != "inner":
        assert any(None in v for _k, v, _t in want)                              # some unmatched


@pytest.mark.slow
@pytest.mark.parametrize("how", ["inner", "left", "outer"])
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_stream_join_matches_model_many(how, seed):
    run_stream_join(how, seed, n=300)


def test_stream_join_semantics_by_hand():
    """The rules, one by one (windows before 10, after 5, grace 3)."""
    b = join_builder("outer", JoinWindows(10, 5, 3))
    with TopologyTestDriver(b, "sj") as d:
        d.pipe_input("L", "k", 1, 100)
        d.pipe_input("R", "k", 2, 104)      # 104 in [100 - 10, 100 + 5]: joins, at time 104
        d.pipe_input("R", "k", 3, 92)       # late: a right record sees lefts in [t - 5, t + 10]
        d.pipe_input("L", "k", 4, 96)       # the left at 96 sees rights in [86, 101]: 92, not 104
        assert d.read_output_records("out") == [("k", [1, 2], 104), ("k", [1, 3], 100),
                                                ("k", [4, 3], 96)]
        d.pipe_input("L", "u", 5, 110)      # no partner yet: waits in the outer store
        d.pipe_input(
            "L", None, 6, 111)              # None key on the left of an outer join: unmatched at once
        assert d.read_output_records("out") == [(None, [6, None], 111)]
        assert [(k, v) for k, v in d.get_store("j-outer").all()] == [((110, True, "u"), (True, [5]))]
        d.pipe_input("R", "z", 7, 118)      # 110 + 5 + 3 = 118, not < 118: still waiting
        assert d.read_output_records("out") == []
        d.pipe_input("R", "z", 8, 119)      # now it closed: [5, None] at its own time
        assert d.read_output_records("out") == [("u", [5, None], 110)]
        d.pipe_input("L", "k", 9, 50)       # far too late: the right store no longer holds 92/104...
        assert d.read_output_records("out") == [("k", [9, None], 50)]   # ...and 50+5 < 119: at once
        # retention: the right store keeps records while ts > 119 - (10 + 5 + 3)
        assert sorted(ts for _k, ts, _v in d.get_store("j-right").all()) == [104, 118, 119]


# -- session windows ----------------------------------------------------------------------------------------

def session_builder(gap, grace, suppressed=False):
    b = TopologyBuilder()
    t = b.stream("clicks").group_by_key().windowed_by(SessionWindows(gap, grace)).count(store="s")
    if suppressed:
        t = t.suppress(until_window_closes())
    t.to_stream().to("out", key_serde=SessionWindowedSerde("str"), value_serde="int64")
    return b


def session_records(rng, n):
    out = []
    for ts in jitter_times(rng, n, 6, late_every=4, late_by=40):
        k = rng.choice(["a", "b", None] if rng.random() < 0.1 else ["a", "b", "c"])
        out.append((k, None if rng.random() < 0.1 else "x", ts))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_session_count_matches_model(seed):
    rng = random.Random(seed)
    gap, grace = rng.choice([(5, 0), (8, 10), (3, 4), (12, 2)])
    recs = session_records(rng, 70)
    model = M.SessionModel(gap, grace)
    want = []
    for r in recs:   # one record per batch: the cache forwards the record's collapsed updates
        want.extend((wk, new, ts) for wk, new, _old, ts in M.cache_collapse(model.step(*r)))
    with TopologyTestDriver(session_builder(gap, grace), "ss") as d:
        for k, v, ts in recs:
            d.pipe_input("clicks", k, v, ts)
        assert d.read_output_records("out") == want
        got = {(k, s, e): a for k, s, e, a in d.get_store("s").all()}
        assert got == model.sessions()
        assert d.dropped_late == model.dropped and model.dropped > 0


def test_session_in_order_is_gap_clustering():
    rng = random.Random(3)
    recs, by_key = [], defaultdict(list)
    t = 0
    for _ in range(120):
        t += rng.choice([1, 2, 3, 9, 15])
        k = rng.choice("ab")
        recs.append((k, "x", t))
        by_key[k].append(t)
    with TopologyTestDriver(session_builder(8, 1000), "ss") as d:
        d.pipe_batch([("clicks", k, v, ts) for k, v, ts in recs])
        got = {(k, s, e): a for k, s, e, a in d.get_store("s").all()}
    assert got == M.sessions_by_gap(by_key, 8)


@pytest.mark.parametrize("seed", range(3))
def test_session_suppressed_emits_each_final_session_once(seed):
    rng = random.Random(100 + seed)
    gap, grace = 6, 5
    recs = session_records(rng, 90)
    model = M.SessionModel(gap, grace)
    supp = M.SuppressModel(lambda wk, ts: wk[2], gap + grace, True,
                           lambda wk: SessionWindowedSerde("str").to_bytes(wk))
    want, ever = [], {}
    for r in recs:
        for wk, new, _old, ts in M.cache_collapse(model.step(*r)):
            ever[wk] = new
            want.extend(supp.step(wk, new, ts))
    with TopologyTestDriver(session_builder(gap, grace, suppressed=True), "ss") as d:
        for k, v, ts in recs:
            d.pipe_input("clicks", k, v, ts)
        got = d.read_output_records("out")
    assert got == want and len(got) > 5
    keys = [wk for wk, _v, _t in got]
    assert len(keys) == len(set(keys))                       # each session once...
    assert all(ever[wk] == v and v is not None for wk, v, _t in got)   # ...with its final count
    assert all(t == wk[2] for wk, _v, t in got)              # at the session's end


def test_session_updated_in_place_then_merged_in_one_batch_is_not_emitted():
    """A second record on a one-point session [72, 72] updates it in place; when a record in the
    same batch then merges it away, the record cache must forward its removal (it existed before
    the batch), or the suppression would emit [72, 72] as a final result (found on Spark)."""
    for batches in ([[72], [72, 79], [300]], [[72], [72], [79], [300]], [[72, 72, 79], [300]]):
        with TopologyTestDriver(session_builder(15, 90, suppressed=True), "ss") as d:
            for bt in batches:
                d.pipe_batch([("clicks", "u", "x", t) for t in bt])
            assert d.read_output("out") == [(("u", 72, 79), 3)], batches
    model = M.SessionModel(15, 90)
    model.step("u", "x", 72)
    assert model.step("u", "x", 72) == [(("u", 72, 72), 2, 1, 72)]   # new 2, old 1


# -- sliding windows --------------------------------------------------------------------------------------------

def sliding_builder(d, grace):
    b = TopologyBuilder()
    (b.stream("e").group_by_key().windowed_by(SlidingWindows(d, grace)).count(store="sl")
     .to_stream().to("out", key_serde=WindowedSerde("str"), value_serde="int64"))
    return b


def sliding_records(rng, n, dd, grace, keys="ab"):
    """In time, late within the grace period, or late beyond it for all its windows (the inputs
    the declarative model is exact for: see topo_models.sliding_model)."""
    st, out = -1, []
    for _ in range(n):
        r = rng.random()
        ts = st + rng.randint(0, 5) if st >= 0 else rng.randint(0, 5)
        if st >= 0 and r < 0.15 and st - grace - dd - 1 >= 0:
            ts = max(0, st - grace - dd - 1 - rng.randint(0, 20))
        elif st >= 0 and r < 0.45:
            ts = max(0, st - rng.randint(0, grace))
        st = max(st, ts)
        out.append((rng.choice(keys), None if rng.random() < 0.05 else "x", ts))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_sliding_count_matches_model(seed):
    rng = random.Random(seed)
    # (difference >= 2: below that Kafka's store retention of 2 * difference + grace can hide a
    # window that is still open, the model's other precondition)
    dd, grace = rng.choice([(10, 0), (10, 30), (5, 8), (20, 3), (2, 5)])
    recs = sliding_records(rng, 60, dd, grace)
    want, dropped = M.sliding_model(recs, dd, grace)
    with TopologyTestDriver(sliding_builder(dd, grace), "sl") as d:
        for k, v, ts in recs:
            d.pipe_input("e", k, v, ts)
        store = d.get_store("sl")
        got = {(k, ws): (v[1], v[0]) for k, ws, v in store.all()}
        # the store holds what its retention still shows: compare on those
        floor = max(ws for _k, ws in want) - (2 * dd + grace) if want else 0
        assert got == {k: v for k, v in want.items() if k[1] >= floor}
        assert d.dropped_late == dropped and (dropped > 0 or seed % 4 == 0)
        last = {}
        for (k, ws), c, _t in d.read_output_records("out"):
            last[(k, ws)] = c
        assert last == {k: v[0] for k, v in want.items()}


def test_sliding_late_record_inside_the_grace_band_keeps_kafkas_seeding():
    """A record late enough that some of its windows closed (t >= stream time - grace - d but
    t < stream time - grace) updates only its open windows and, like Kafka Streams, cannot seed the
    next record's left window from windows that were never created: [110, 120] misses 111."""
    with TopologyTestDriver(sliding_builder(10, 6), "sl") as d:
        for ts in (103, 121, 111, 120):
            d.pipe_input("e", "a", "x", ts)
        windows = {ws: c for _k, ws, (_t, c) in d.get_store("sl").all()}
    # 111 arrives at stream time 121 (close 115): its left window [101, 111] and 103's right window
    # [104, 114] end before 115 and are not created; [111, 121] (121's left window) gets it, and
    # its own right window [112, 122] is seeded with 121. 120 then finds no window ending before
    # it to seed [110, 120] from: it starts empty. (103's left window [93, 103] is past retention.)
    assert windows == {111: 3, 112: 2, 110: 1, 121: 1}


def test_sliding_by_hand_matches_kafka_example():
    """Kafka Streams' docs example: difference 10, records at 8, 15, 24 (one key)."""
    with TopologyTestDriver(sliding_builder(10, 100), "sl") as d:
        for ts in (8, 15, 24):
            d.pipe_input("e", "k", "x", ts)
        windows = {ws: v for _k, ws, v in d.get_store("sl").all()}
    # [0,10] holds 8 (early record); [5,15] 8,15; [9,19] (8's right window) 15; [14,24] 15,24;
    # [16,26] (15's right window) 24
    assert {ws: c for ws, (_t, c) in windows.items()} == {0: 1, 5: 2, 9: 1, 14: 2, 16: 1}


# -- suppression ------------------------------------------------------------------------------------------------

def test_windowed_count_until_window_closes_is_final_and_once():
    rng = random.Random(7)
    size, grace = 10, 4
    b = TopologyBuilder()
    (b.stream("e").group_by_key().windowed_by(tumbling(size), grace_ms=grace).count(store="w")
     .suppress(until_window_closes(), store="w-final")
     .to_stream().to("out", key_serde=WindowedSerde("str"), value_serde="int64"))
    recs = [(rng.choice("abc"), "x", ts) for ts in jitter_times(rng, 150, 3, 3, 20)]
    st, counts, accepted = -1, defaultdict(int), 0
    for k, _v, ts in recs:
        st = max(st, ts)
        start = ts - ts % size
        if start + size > st - grace:
            counts[(k, start)] += 1
            accepted += 1
    with TopologyTestDriver(b, "sup") as d:
        for k, v, ts in recs:
            d.pipe_input("e", k, v, ts)
        got = d.read_output_records("out")
        left = [(r.key, r.value) for r in d.get_store("w-final").all()]
    want = {w: c for w, c in counts.items() if w[1] + size <= st - grace}
    assert [w for w, _c, _t in got] == sorted(want, key=lambda w: (w[1], w[0])) or \
        len(got) == len(want)
    assert {w: c for w, c, _t in got} == want and len(got) == len(want)
    assert sorted(left) == sorted((w, c) for w, c in counts.items() if w not in want)


def test_until_time_limit_emits_latest_per_key_after_the_limit():
    b = TopologyBuilder()
    t = b.table("t", store="t", value_serde="json")
    t.suppress(until_time_limit(10), store="held").to_stream().to("out", value_serde="json")
    with TopologyTestDriver(b, "tl") as d:
        d.pipe_input("t", "a", 1, 100)
        d.pipe_input("t", "a", 2, 105)     # same key: held, keeps its buffer time 100
        d.pipe_input("t", "b", 3, 106)
        assert d.read_output_records("out") == []
        d.pipe_input("t", "c", 4, 110)     # stream time 110: a's time 100 <= 110 - 10 goes out
        assert d.read_output_records("out") == [("a", 2, 105)]
        d.pipe_input("t", "b", None, 117)  # a tombstone is held and emitted like a value
        assert d.read_output_records("out") == [("b", None, 117)]
        assert d.get_store("held").get("c").value == 4


def test_suppress_buffer_limits():
    b = TopologyBuilder()
    b.table("t", store="t").suppress(until_time_limit(1000, max_records=2)).to_stream().to("o")
    with TopologyTestDriver(b, "bl") as d:
        for i, k in enumerate("abc"):
            d.pipe_input("t", k, k.upper(), i)
        assert d.read_output("o") == [("a", "A")]      # full: the oldest goes out early
    b = TopologyBuilder()
    (b.stream("e").group_by_key().windowed_by(tumbling(10)).count()
     .suppress(until_window_closes(max_records=1)).to_stream()
     .to("o", key_serde=WindowedSerde("str"), value_serde="int64"))
    with TopologyTestDriver(b, "bl") as d:
        d.pipe_input("e", "a", "x", 1)
        with pytest.raises(ProcessorError, match="max_records=1") as ei:
            d.pipe_input("e", "b", "x", 2)
        assert "\n" not in str(ei.value)


# -- table-table joins ------------------------------------------------------------------------------------------

def table_updates(rng, n, keys="abcd"):
    return [(rng.choice(["left", "right"]), rng.choice(keys),
             None if rng.random() < 0.25 else rng.randint(0, 9)) for _ in range(n)]


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
@pytest.mark.parametrize("seed", range(3))
def test_table_join_matches_model(how, seed):
    rng = random.Random(seed)
    b = TopologyBuilder()
    lt = b.table("lt", store="lt", value_serde="json")
    rt = b.table("rt", store="rt", value_serde="json")
    lt.join(rt, pair, how=how, value_serde="json").to_stream().to("out", value_serde="json")
    recs = table_updates(rng, 80)
    model = M.TableJoinModel(how, pair)
    want = [o for side, k, v in recs for o in model.step(side, k, v)]
    with TopologyTestDriver(b, "tj") as d:
        for i, (side, k, v) in enumerate(recs):
            d.pipe_input("lt" if side == "left" else "rt", k, v, i)
        got = d.read_output("out")
    assert got == want
    latest = {}
    for k, v in got:
        latest[k] = v
    assert {k: v for k, v in latest.items() if v is not None} == model.final()


def test_table_join_result_is_a_table_that_can_be_joined():
    b = TopologyBuilder()
    lt = b.table("lt", store="lt")
    rt = b.table("rt", store="rt")
    joined = lt.left_join(rt, lambda l, r: f"{l}+{r}")
    b.stream("s").join(joined, lambda s, j: f"{s}:{j}").to("out")
    with TopologyTestDriver(b, "tj") as d:
        d.pipe_input("lt", "k", "L", 1)
        d.pipe_input("s", "k", "s1", 2)
        d.pipe_input("rt", "k", "R", 3)
        d.pipe_input("s", "k", "s2", 4)
        d.pipe_input("s", "x", "s3", 5)
        assert d.read_output("out") == [("k", "s1:L+None"), ("k", "s2:L+R")]


# -- foreign-key joins --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("seed", range(3))
def test_fk_join_final_state_is_the_join_of_the_final_tables(how, seed):
    rng = random.Random(seed)
    b = TopologyBuilder()
    orders = b.table("orders", store="orders", value_serde="json")
    customers = b.table("customers", store="customers", value_serde="json")
    joined = orders.join(customers, lambda o: o["c"], lambda o, c: {"o": o["n"], "c": c},
                         how=how, store="oc", value_serde="json")
    joined.to_stream().to("out", value_serde="json")
    oft, cust = {}, {}
    with TopologyTestDriver(b, "fk") as d:
        assert len(d.plan.subtopologies) == 2 and sorted(d.plan.repartition_topics) == [
            "fk-oc-subscription-registration-repartition", "fk-oc-subscription-response-repartition"]
        for i in range(90):
            if rng.random() < 0.55:
                k = rng.choice(["o1", "o2", "o3", "o4", "o5"])
                v = None if rng.random() < 0.2 else {"c": rng.choice(["c1", "c2", "c3"]), "n": i}
                d.pipe_input("orders", k, v, i)
                oft[k] = v
            else:
                k = rng.choice(["c1", "c2", "c3"])
                v = None if rng.random() < 0.25 else f"name{i}"
                d.pipe_input("customers", k, v, i)
                cust[k] = v
        want = {}
        for k, o in oft.items():
            if o is None:
                continue
            c = cust.get(o["c"])
            if c is None and how == "inner":
                continue
            want[k] = {"o": o["n"], "c": c}
        assert dict(d.get_store("oc").all()) == want
        latest = {}
        for k, v in d.read_output("out"):
            latest[k] = v
        assert {k: v for k, v in latest.items() if v is not None} == want
        subs = {(fk, pk) for (fk, pk), _v in d.get_store("oc-subscription").all()}
        assert subs == {(o["c"], k) for k, o in oft.items() if o is not None}


# -- table re-aggregation ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_regroup_count_and_sum_follow_rows_between_groups(seed):
    rng = random.Random(seed)
    b = TopologyBuilder()
    users = b.table("users", store="users", value_serde="json")
    g = users.group_by(lambda k, v: v["region"])
    g.count(store=kv_store("per-region", caching=False)).to_stream().to("counts", value_serde="int64")
    g.aggregate(lambda: 0, lambda k, v, a: a + v["age"], lambda k, v, a: a - v["age"],
                store="age-sum", value_serde="int64")
    recs = []
    for i in range(80):
        k = rng.choice(["u%d" % j for j in range(8)])
        v = None if rng.random() < 0.2 else {"region": rng.choice("xyz"), "age": rng.randint(1, 90)}
        recs.append((k, v))
    updates, counts, rows = M.regroup_model(recs, lambda k, v: v["region"])
    with TopologyTestDriver(b, "rg") as d:
        for i, (k, v) in enumerate(recs):
            d.pipe_input("users", k, v, i)
        assert d.read_output("counts") == updates
        assert dict(d.get_store("per-region").all()) == counts
        sums = defaultdict(int)
        for r in rows.values():
            sums[r["region"]] += r["age"]
        assert dict(d.get_store("age-sum").all()) == {g: sums.get(g, 0) for g in counts}
    assert counts == {g: sum(1 for r in rows.values() if r["region"] == g) for g in counts}


# -- repartitioning after a join, a process step, an aggregation -------------------------------------------------

def test_repartition_after_join_process_and_aggregation():
    class Swap(Processor):
        def process(self, k, v):
            self.context.forward(v, k)

    b = TopologyBuilder()
    left, right = b.stream("L"), b.stream("R")
    joined = left.join(right, lambda a, c: a + c, JoinWindows.of(100), store="j")
    joined.map(lambda k, v: (v, k)).group_by_key().count(store="by-value")
    b.stream("P").process(Swap).group_by_key().count(store="swapped")
    first = b.stream("W").group_by_key().count(store="first")
    first.to_stream().map(lambda k, n: (str(n), k), value_serde="str").group_by_key().count(
        store="second")
    plan = b.compile("rp")
    assert sorted(plan.repartition_topics) == ["rp-by-value-repartition", "rp-second-repartition",
                                               "rp-swapped-repartition"]
    with TopologyTestDriver(b, "rp") as d:
        for i, (t, k, v) in enumerate([("L", "k", "x"), ("R", "k", "y"), ("R", "j", "y"),
                                       ("L", "j", "x"), ("P", "a", "b"), ("P", "c", "b"),
                                       ("W", "u", "1"), ("W", "u", "1"), ("W", "v", "1")]):
            d.pipe_input(t, k, v, i)
        assert dict(d.get_store("by-value").all()) == {"xy": 2}
        assert dict(d.get_store("swapped").all()) == {"b": 2}
        # "first" counted u twice (1 then 2) and v once: "second" counts how many keys are at
        # each count *and* sees u's moves (a stream, not a table: 1 -> 1 -> 2 adds, never subtracts)
        assert dict(d.get_store("second").all()) == {"1": 2, "2": 1}


# -- punctuation --------------------------------------------------------------------------------------------------

class Ticker(Processor):
    """Counts records per key; a stream-time punctuator emits the counts every 10 ms of stream time,
    a wall-clock one emits a heartbeat every 1000 ms."""

    def init(self, context):
        self.context = context
        self.store = context.get_store("ticks")
        context.schedule(10, PunctuationType.STREAM_TIME, self.emit_counts)
        context.schedule(1000, PunctuationType.WALL_CLOCK_TIME, self.heartbeat)

    def process(self, k, v):
        self.store.put(k, (self.store.get(k) or 0) + 1)

    def emit_counts(self, ts):
        for k, n in self.store.all():
            self.context.forward(k, f"{n}@{ts}")

    def heartbeat(self, ts):
        self.context.forward("hb", f"wall@{ts}")


def ticker_builder():
    b = TopologyBuilder()
    b.stream("in").process(Ticker, stores=[kv_store("ticks")]).to("out")
    return b


def test_stream_time_punctuation_fires_at_each_interval_crossing():
    with TopologyTestDriver(ticker_builder(), "pt") as d:
        d.pipe_input("in", "a", "x", 3)     # first data: fires at once (schedules start at 0)
        d.pipe_input("in", "a", "x", 9)
        d.pipe_input("in", "b", "x", 10)    # reaches 10
        d.pipe_input("in", "a", "x", 7)     # stream time stays 10
        d.pipe_input("in", "a", "x", 45)    # 20, 30, 40 missed: one firing, next at 50
        d.pipe_input("in", "b", "x", 50)
        assert d.read_output("out") == [("a", "1@3"), ("a", "2@10"), ("b", "1@10"),
                                        ("a", "4@45"), ("b", "1@45"), ("a", "4@50"), ("b", "2@50")]


def test_wall_clock_punctuation_follows_the_mock_clock():
    with TopologyTestDriver(ticker_builder(), "pw", wall_clock_ms=500) as d:
        d.advance_wall_clock(999)           # 1499: first firing due at 500 + 1000
        assert d.read_output("out") == []
        d.advance_wall_clock(1)
        assert d.read_output("out") == [("hb", "wall@1500")]
        d.advance_wall_clock(2600)          # 4100: fires once, next at 4500
        d.advance_wall_clock(399)
        assert d.read_output("out") == [("hb", "wall@4100")]
        d.advance_wall_clock(1)
        assert d.read_output("out") == [("hb", "wall@4500")]


def test_punctuator_interval_refused_at_compile_and_at_run():
    class Bad(Processor):
        def init(self, context):
            context.schedule(0, PunctuationType.STREAM_TIME, lambda ts: None)

        def process(self, k, v):
            pass

    b = TopologyBuilder()
    b.stream("in").process(Bad)
    with pytest.raises(StatekitError) as ei:
        b.compile()
    msg = str(ei.value)
    assert "interval > 0" in msg and "KSTREAM-PROCESSOR" in msg and "\n" not in msg


def test_cancelled_schedule_stays_cancelled():
    class Once(Processor):
        def init(self, context):
            self.context = context
            self.c = context.schedule(5, PunctuationType.STREAM_TIME, self.tick)

        def process(self, k, v):
            pass

        def tick(self, ts):
            self.context.forward("t", str(ts))
            self.c.cancel()

    b = TopologyBuilder()
    b.stream("in").process(Once).to("out")
    with TopologyTestDriver(b, "pc") as d:
        for ts in (1, 6, 20, 40):
            d.pipe_input("in", "k", "v", ts)
        assert d.read_output("out") == [("t", "1")]


# -- batches, describe, driver errors ------------------------------------------------------------------------------

def test_pipe_batch_forwards_once_per_key_per_batch():
    b = TopologyBuilder()
    b.stream("w").group_by_key().count(store="c").to_stream().to("o", value_serde="int64")
    with TopologyTestDriver(b, "pb") as d:
        d.pipe_batch([("w", "a", "x", 1), ("w", "b", "x", 2), ("w", "a", "x", 3)])
        assert d.read_output("o") == [("a", 2), ("b", 1)]
        d.pipe_input("w", "a", "x", 4)
        assert d.read_output("o") == [("a", 3)]
    with TopologyTestDriver(b, "pb", cache_bytes=0) as d:
        d.pipe_batch([("w", "a", "x", 1), ("w", "a", "x", 3)])
        assert d.read_output("o") == [("a", 1), ("a", 2)]


def test_describe_shows_subtopologies_and_repartition_topics():
    b = TopologyBuilder()
    users = b.table("users", store="users", value_serde="json")
    users.group_by(lambda k, v: v["region"]).count(store="per-region")
    d = b.compile("app").describe()
    assert [s["index"] for s in d["subtopologies"]] == [0, 1]
    assert d["subtopologies"][0]["repartition_out"] == ["app-per-region-repartition"]
    assert d["subtopologies"][1]["repartition_in"] == ["app-per-region-repartition"]
    topic = next(n for n in d["nodes"] if n["type"] == "topic")
    assert topic["id"] == "app-per-region-repartition" and topic["kind"] == "repartition"
    edges = {(e["from"], e["to"]) for e in d["edges"] if e["kind"] == "repartition"}
    assert edges == {("KSTREAM-SINK-per-region-repartition", "app-per-region-repartition"),
                     ("app-per-region-repartition", "KSTREAM-SOURCE-per-region-repartition")}
    text = b.compile("app").describe_text()
    assert "Sub-topology 0:" in text and "Sub-topology 1: reads app-per-region-repartition" in text
    assert b.describe()["subtopologies"][0]["repartition_out"] == [
        "<application>-per-region-repartition"]


def test_driver_errors_are_one_line():
    b = TopologyBuilder()
    b.stream("w").group_by_key().count(store="c").to_stream().to("o", value_serde="str")
    with TopologyTestDriver(b, "e") as d:
        with pytest.raises(StatekitError, match="not an input topic"):
            d.pipe_input("nope", "a", "x", 1)
        with pytest.raises(ProcessorError, match="value_serde") as ei:
            d.pipe_input("w", "a", "x", 1)
        assert "\n" not in str(ei.value)
        assert d.get_store("c").get("a") is None        # the failed batch left nothing behind
        assert d.changelog("c") == []
        with pytest.raises(StatekitError, match="no store"):
            d.get_store("zz")
    with pytest.raises(StatekitError, match="closed"):
        d.pipe_input("w", "a", "x", 2)
    b = TopologyBuilder()   # a repartition topic's serdes come from the step before it
    b.stream("w").group_by_key().count().to_stream().map(lambda k, n: (str(n), k)).group_by_key().count()
    with TopologyTestDriver(b, "e") as d:
        with pytest.raises(ProcessorError) as ei:
            d.pipe_input("w", "a", "x", 1)
    msg = str(ei.value)
    assert "e-w-count-2-repartition" in msg and "value_serde= to the step before" in msg


def test_readme_example():
    b = TopologyBuilder()
    (b.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w)
      .count(store="counts").to_stream().to("counts-out", value_serde="int64"))
    with TopologyTestDriver(b) as driver:
        driver.pipe_input("lines", None, "a b a", timestamp=1_000)
        # one record, one commit, as in Kafka's driver: the words reach the count through the
        # repartition topic, each record processed and committed on its own (every update)
        assert driver.read_output("counts-out") == [("a", 1), ("b", 1), ("a", 2)]
        assert driver.get_store("counts").get("a") == 2
        driver.advance_wall_clock(60_000)
        assert driver.read_output("counts-out") == []
        # a micro-batch: its repartition records are one batch too (one update per key)
        driver.pipe_batch([("lines", None, "a b a", 2_000), ("lines", None, "b", 2_001)])
        assert driver.read_output_records("counts-out") == [("a", 4, 2_000), ("b", 3, 2_001)]
