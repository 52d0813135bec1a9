"""The new operators on the real stack: LocalEngine (stream tasks, RocksDB stores, changelogs in a
real embedded broker), several tasks and several batches, against the plain-Python models of
topo_models.py. A repartitioned topology runs as one LocalEngine per sub-topology, each batch's
repartition-topic outputs fed to the next (and a foreign-key join's answers back), as the runtime
runs one query per sub-topology. A replay of an applied batch id changes nothing and emits nothing
(its outputs went out with its commit); the stores restored from their changelogs into a fresh state
directory must equal the originals."""
from __future__ import annotations

import importlib.util
import os
import random
from collections import defaultdict

import pytest

from statekit.engine.local import LocalEngine
from statekit.errors import ProcessorError
from statekit.partition import partition_for
from statekit.topology import (JoinWindows, Processor, PunctuationType, SessionWindowedSerde,
                               SessionWindows, SlidingWindows, TopologyBuilder, WindowedSerde,
                               kv_store, tumbling, until_window_closes)

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("topo_models", os.path.join(HERE, "topo_models.py"))
M = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)
_spec = importlib.util.spec_from_file_location("topo_chain", os.path.join(HERE, "chain.py"))
C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(C)

PARTS = 3


def utf8(k):
    return k.encode("utf-8")


def pair(a, b):
    return [a, b]


# -- harness: tests/topology/chain.py -----------------------------------------------------------

def Chain(plan, app, broker, tmp_path, partitions=PARTS):
    return C.Chain(plan, app, broker, tmp_path, partitions)


check_replay_and_restore = C.check_replay_and_restore


def jitter(rng, ts, spread, late_by):
    return max(0, ts - rng.randint(0, late_by)) if rng.random() < 0.25 else ts


# -- stream-stream join --------------------------------------------------------------------------------------

@pytest.mark.parametrize("how,seed", [("inner", 1), ("outer", 3),
                                      pytest.param("left", 2, marks=pytest.mark.slow),
                                      pytest.param("outer", 4, marks=pytest.mark.slow),
                                      pytest.param("left", 5, marks=pytest.mark.slow)])
def test_stream_join_on_real_stores(shared_broker, tmp_path, how, seed):
    rng = random.Random(seed)
    before, after, grace = 8, 4, 6
    b = TopologyBuilder()
    left, right = b.stream("L", value_serde="json"), b.stream("R", value_serde="json")
    left.join(right, pair, JoinWindows(before, after, grace), how=how, store="j",
              value_serde="json").to("out", value_serde="json")
    plan = b.compile(f"sj{seed}")
    chain = Chain(plan, f"sj{seed}", shared_broker, tmp_path)
    models = defaultdict(lambda: M.StreamJoinModel(before, after, grace, how, pair, utf8))
    offsets, ts = {}, 0
    src = plan.source_index
    n_batches = 4 if seed < 4 else 14
    for _ in range(n_batches):
        batch = []
        for _ in range(20):
            ts += rng.randint(0, 3)
            k = rng.choice(["a", "b", "c", "d", "e", None] if rng.random() < 0.1 else "abcde")
            v = None if rng.random() < 0.07 else rng.randint(0, 99)
            batch.append((rng.choice("LR"), k, v, jitter(rng, ts, 0, 25)))
        got = chain.run_batch(batch)
        want = []
        for task, recs in sorted(M.engine_order(batch, PARTS, src, utf8, offsets, null_task=0).items()):
            for topic, k, v, t in recs:
                want.extend(("out", kk, vv) for kk, vv, _t in
                            models[task].step("left" if topic == "L" else "right", k, v, t))
        assert got == want
    check_replay_and_restore(chain, tmp_path, ["j-left", "j-right"] + (["j-outer"] if how != "inner" else []))
    by_task = chain.engines[0].store_by_task("j-left")
    assert sum(len(rows) for rows in by_task.values()) > 0
    for task, rows in by_task.items():   # each key waits in its own task
        assert all(partition_for(utf8(k), PARTS) == task for k, _ws in rows)


# -- sessions (+ suppress) -----------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_session_count_and_final_results_on_real_stores(shared_broker, tmp_path, seed):
    rng = random.Random(seed)
    gap, grace = 5, 4
    b = TopologyBuilder()
    t = b.stream("clicks").group_by_key().windowed_by(SessionWindows(gap, grace)).count(store="s")
    t.to_stream().to("updates", key_serde=SessionWindowedSerde("str"), value_serde="int64")
    (t.suppress(until_window_closes(), store="s-final").to_stream()
     .to("final", key_serde=SessionWindowedSerde("str"), value_serde="int64"))
    plan = b.compile(f"ses{seed}")
    chain = Chain(plan, f"ses{seed}", shared_broker, tmp_path)
    models = defaultdict(lambda: M.SessionModel(gap, grace))
    supps = defaultdict(lambda: M.SuppressModel(lambda wk, ts: wk[2], gap + grace, True,
                                                SessionWindowedSerde("str").to_bytes))
    offsets, ts = {}, 0
    for _ in range(4 if seed == 1 else 15):
        batch = []
        for _ in range(25):
            ts += rng.randint(0, 4)
            batch.append(("clicks", rng.choice("abcdefg"), None if rng.random() < 0.1 else "x",
                          jitter(rng, ts, 0, 30)))
        got = chain.run_batch(batch)
        want = []
        for task, recs in sorted(M.engine_order(batch, PARTS, plan.source_index, utf8, offsets).items()):
            ups = M.cache_collapse([u for _t, k, v, t in recs for u in models[task].step(k, v, t)])
            # at flush each held update goes to the table's children in order: to_stream (the
            # "updates" sink), then the suppression, which may let final results out
            for wk, new, _old, t in ups:
                want.append(("updates", wk, new))
                want.extend(("final", fk, fv) for fk, fv, _t in supps[task].step(wk, new, t))
        assert got == want
    sessions = {}
    for m in models.values():
        sessions.update(m.sessions())
    assert chain.store("s") == sessions
    check_replay_and_restore(chain, tmp_path, ["s", "s-final"])


# -- sliding windows -----------------------------------------------------------------------------------------

def test_sliding_count_on_real_stores(shared_broker, tmp_path):
    rng = random.Random(9)
    dd, grace = 10, 8
    b = TopologyBuilder()
    (b.stream("e").group_by_key().windowed_by(SlidingWindows(dd, grace)).count(store="sl")
     .to_stream().to("out", key_serde=WindowedSerde("str"), value_serde="int64"))
    plan = b.compile("sl")
    chain = Chain(plan, "sl", shared_broker, tmp_path)
    per_task = defaultdict(list)
    offsets, last = {}, {}
    base, span = 0, 30
    for n in range(6):
        # this batch's range starts within the grace period; a task takes its records in offset
        # order, so they come out of order by less than the grace period (a sort key with noise
        # below it), and some are beyond the grace period for every window they touch
        stamps = [base + rng.randint(0, span) for _ in range(24)]
        stamps.sort(key=lambda t: t + rng.uniform(0, grace - 1))
        for _ in range(4 if n else 0):
            stamps.insert(rng.randrange(len(stamps) + 1),
                          max(0, base - span - grace - dd - 1 - rng.randint(0, 10)))
        batch = [("e", rng.choice("abcd"), "x", ts) for ts in stamps]
        base += span - grace
        for o in chain.run_batch(batch):
            last[o[1]] = o[2]
        for task, recs in M.engine_order(batch, PARTS, plan.source_index, utf8, offsets).items():
            per_task[task].extend((k, v, t) for _tp, k, v, t in recs)
    want, dropped = {}, 0
    for recs in per_task.values():
        st = -1
        for _k, _v, t in recs:     # the precondition of the declarative model, checked
            assert not (st - grace - dd <= t < st - grace), (t, st)
            st = max(st, t)
        w, dr = M.sliding_model(recs, dd, grace)
        want.update(w)
        dropped += dr
    assert dropped > 3
    assert last == {k: c for k, (c, _m) in want.items()}
    stored = chain.store("sl")
    assert all(want[k] == (c, m) for k, (m, c) in stored.items()) and len(stored) > 10
    check_replay_and_restore(chain, tmp_path, ["sl"])


# -- table re-aggregation behind a repartition topic ---------------------------------------------------------

@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_regroup_through_a_repartition_topic(shared_broker, tmp_path, seed):
    rng = random.Random(seed)
    b = TopologyBuilder()
    users = b.table("users", store="users", value_serde="json")
    users.group_by(lambda k, v: v["region"]).count(store="per-region").to_stream().to(
        "counts", value_serde="int64")
    plan = b.compile(f"rg{seed}")
    assert [sp.store_names for sp in plan.subtopologies] == [["users"], ["per-region"]]
    chain = Chain(plan, f"rg{seed}", shared_broker, tmp_path)
    rows, seen, last = {}, set(), {}
    offsets = {}
    for i in range(4 if seed == 1 else 15):
        batch = []
        for j in range(20):
            k = "u%d" % rng.randint(0, 12)
            v = None if rng.random() < 0.2 else {"region": rng.choice("nesw"), "age": j}
            batch.append(("users", k, v, i * 100 + j))
        for _topic, k, v in chain.run_batch(batch):
            last[k] = v
        for task, recs in M.engine_order(batch, PARTS, plan.source_index, utf8, offsets).items():
            for _t, k, v, _ts in recs:
                if v is None:
                    rows.pop(k, None)
                else:
                    rows[k] = v
                    seen.add(v["region"])
    seen |= set(last)
    want = {g: sum(1 for r in rows.values() if r["region"] == g) for g in seen}
    assert chain.store("per-region") == want
    assert last == want
    check_replay_and_restore(chain, tmp_path, ["users", "per-region"])


# -- foreign-key join: two sub-topologies that feed each other -----------------------------------------------

def test_fk_join_on_real_stores(shared_broker, tmp_path):
    rng = random.Random(4)
    b = TopologyBuilder()
    orders = b.table("orders", store="orders", value_serde="json")
    customers = b.table("customers", store="customers")
    orders.left_join(customers, lambda o: o["c"], lambda o, c: f"{o['n']}/{c}", store="oc",
                     value_serde="str")
    plan = b.compile("fk")
    chain = Chain(plan, "fk", shared_broker, tmp_path)
    oft, cust = {}, {}
    for i in range(4):
        batch = []
        for j in range(18):
            if rng.random() < 0.5:
                k = "o%d" % rng.randint(0, 6)
                v = None if rng.random() < 0.15 else {"c": rng.choice(["c1", "c2", "c3", None]), "n": j}
                batch.append(("orders", k, v, i * 100 + j))
            else:
                batch.append(("customers", rng.choice(["c1", "c2", "c3"]),
                              None if rng.random() < 0.2 else f"name{i}.{j}", i * 100 + j))
        chain.run_batch(batch)
        for topic, k, v, _ts in sorted(batch, key=lambda r: r[3]):
            (oft if topic == "orders" else cust)[k] = v
    want = {k: f"{o['n']}/{cust.get(o['c']) if o['c'] is not None else None}"
            for k, o in oft.items() if o is not None}
    assert chain.store("oc") == want
    check_replay_and_restore(chain, tmp_path, ["oc", "oc-subscription", "orders", "customers"])


# -- a join, then a new key, then a count: three kinds of state behind one repartition ------------------------

def test_join_then_rekey_then_windowed_count(shared_broker, tmp_path):
    b = TopologyBuilder()
    left, right = b.stream("L"), b.stream("R")
    joined = left.join(right, lambda a, c: a + c, JoinWindows.of(50), store="j")
    (joined.map(lambda k, v: (v, k)).group_by_key().windowed_by(tumbling(100)).count(store="w")
     .to_stream().to("out", key_serde=WindowedSerde("str"), value_serde="int64"))
    plan = b.compile("jr")
    assert plan.repartition_topics == ["jr-w-repartition"]
    chain = Chain(plan, "jr", shared_broker, tmp_path)
    out = []
    out += chain.run_batch([("L", "k1", "x", 10), ("R", "k1", "y", 20), ("L", "k2", "x", 30)])
    out += chain.run_batch([("R", "k2", "y", 40), ("R", "k3", "z", 150), ("L", "k3", "x", 160)])
    assert chain.store("w") == {("xy", 0): 2, ("xz", 100): 1}
    assert out == [("out", ("xy", 0), 1), ("out", ("xy", 0), 2), ("out", ("xz", 100), 1)]
    check_replay_and_restore(chain, tmp_path, ["w", "j-left", "j-right"])


# -- punctuation through the task runner: the schedule lives in the task's meta -----------------------------

class Ticker(Processor):
    def init(self, context):
        self.context = context
        self.store = context.get_store("ticks")
        context.schedule(10, PunctuationType.STREAM_TIME, self.emit)

    def process(self, k, v):
        self.store.put(k, (self.store.get(k) or 0) + 1)

    def emit(self, ts):
        self.context.forward("tick", f"{sum(n for _k, n in self.store.all())}@{ts}")


def test_punctuation_schedule_survives_batches_and_a_restore(shared_broker, tmp_path):
    b = TopologyBuilder()
    b.stream("in").process(Ticker, stores=[kv_store("ticks")]).to("out")
    plan = b.compile("pt")
    eng = LocalEngine(plan, "pt", shared_broker.bootstrap, str(tmp_path / "a"), 1)

    def run(e, recs):
        return [v for _t, _k, v in e.decode(e.run_batch([("in", "k", "x", ts) for ts in recs]))]

    assert run(eng, [3]) == ["1@3"]                 # first data: fires
    assert run(eng, [5, 9]) == []                   # next at 10
    assert run(eng, [12, 14]) == ["4@12"]           # crossed 10 in this batch: next at 20
    # the same task on another instance, its state restored from the changelogs (meta included)
    other = LocalEngine(plan, "pt", shared_broker.bootstrap, str(tmp_path / "b"), 1, first_batch_id=3)
    assert run(other, [15, 19]) == []               # still next at 20, not "first data"
    assert run(other, [44]) == ["8@44"]             # 20, 30, 40 missed: once, next at 50


# -- a batch that fails half-way is replayed with the same id: the same outputs as a clean run ---------------

def test_failed_batch_replayed_gives_the_clean_outputs(shared_broker, tmp_path):
    fail = {"armed": True}

    def joiner(a, c):
        if fail["armed"] and a == 13:
            fail["armed"] = False
            raise RuntimeError("boom")
        return [a, c]

    def topology():
        b = TopologyBuilder()
        left, right = b.stream("L", value_serde="json"), b.stream("R", value_serde="json")
        j = left.outer_join(right, joiner, JoinWindows(5, 5, 2), store="j", value_serde="json")
        j.to("joined", value_serde="json")
        (j.group_by_key().windowed_by(SessionWindows(4, 2)).count(store="s").to_stream()
         .to("sessions", key_serde=SessionWindowedSerde("str"), value_serde="int64"))
        return b.compile("fb")

    rng = random.Random(12)
    batches, ts = [], 0
    for _ in range(4):
        batch = []
        for _ in range(15):
            ts += rng.randint(0, 3)
            batch.append((rng.choice("LR"), rng.choice("abc"), rng.randint(0, 20), ts))
        batches.append(batch)
    batches[2].append(("L", "a", 13, ts))
    fail["armed"] = False
    clean = LocalEngine(topology(), "fb-clean", shared_broker.bootstrap, str(tmp_path / "c"), 2)
    want = [clean.decode(clean.run_batch(bt)) for bt in batches]
    fail["armed"] = True
    eng = LocalEngine(topology(), "fb", shared_broker.bootstrap, str(tmp_path / "f"), 2)
    got = []
    for bt in batches:
        try:
            got.append(eng.decode(eng.run_batch(bt)))
        except ProcessorError as e:
            assert "boom" in str(e) and "\n" not in str(e)
            got.append(eng.decode(eng.replay()))   # Spark replays the failed batch, same id
    assert not fail["armed"] and got == want
    assert eng.store("j-left") == clean.store("j-left")


# -- table-table joins and a time-limited suppression --------------------------------------------------------

@pytest.mark.parametrize("how", ["outer", pytest.param("inner", marks=pytest.mark.slow),
                                 pytest.param("left", marks=pytest.mark.slow)])
def test_table_join_and_time_limit_on_real_stores(shared_broker, tmp_path, how):
    from statekit.topology import until_time_limit

    rng = random.Random(21)
    b = TopologyBuilder()
    lt = b.table("lt", store="lt", value_serde="json")
    rt = b.table("rt", store="rt", value_serde="json")
    joined = lt.join(rt, pair, how=how, value_serde="json")
    joined.to_stream().to("joined", value_serde="json")
    joined.suppress(until_time_limit(50), store="held").to_stream().to("settled", value_serde="json")
    plan = b.compile(f"tj{how}")
    chain = Chain(plan, f"tj{how}", shared_broker, tmp_path)
    models = defaultdict(lambda: M.TableJoinModel(how, pair))
    supps = defaultdict(lambda: M.SuppressModel(lambda k, ts: ts, 50, False, utf8))
    offsets, ts = {}, 0
    for _ in range(4):
        batch = []
        for _ in range(20):
            ts += rng.randint(0, 9)
            batch.append((rng.choice(["lt", "rt"]), rng.choice("abcdef"),
                          None if rng.random() < 0.25 else rng.randint(0, 9), ts))
        got = chain.run_batch(batch)
        want = []
        for task, recs in sorted(M.engine_order(batch, PARTS, plan.source_index, utf8, offsets).items()):
            for topic, k, v, t in recs:
                for kk, res in models[task].step("left" if topic == "lt" else "right", k, v):
                    want.append(("joined", kk, res))      # to_stream first, then the suppression
                    want.extend(("settled", sk, sv) for sk, sv, _t in supps[task].step(kk, res, t))
        assert got == want
    final = {}
    for m in models.values():
        final.update(m.final())
    held = chain.store("held")
    assert all(final.get(k) == v for k, (_t, v) in held.items())
    check_replay_and_restore(chain, tmp_path, ["lt", "rt", "held"])
