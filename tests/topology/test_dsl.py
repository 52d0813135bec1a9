"""DSL unit tests: graph shape, compile errors, pickling, windows, the task processor over fake stores.
No broker, no Spark."""
from __future__ import annotations

import pickle

import pytest

from statekit.errors import ProcessorError, TopologyError
from statekit.topology import (Processor, TopologyBuilder, WindowedSerde, hopping, kv_store, tumbling,
                               window_store)


def wordcount(store="counts"):
    b = TopologyBuilder()
    (b.stream("lines").flat_map_values(str.split)
     .group_by(lambda k, w: w).count(store=store)
     .to_stream().to("counts-out", value_serde="int64"))
    return b


# -- fake task context ---------------------------------------------------------------------------

class FakeKV:
    def __init__(self):
        self.d = {}

    def get(self, k):
        return self.d.get(k)

    def put(self, k, v):
        if v is None:
            self.d.pop(k, None)
        else:
            self.d[k] = v

    def all(self):
        return iter(sorted(self.d.items()))


class FakeWindow:
    def __init__(self):
        self.d = {}

    def get(self, k, ws):
        return self.d.get((k, ws))

    def put(self, k, v, ws):
        self.d[(k, ws)] = v


class FakeCtx:
    """No `cache_bytes`: no record cache, so aggregations forward every update (unless a test sets
    cache_bytes > 0 and calls the processor's flush())."""

    def __init__(self, plan, task_id=0, batch_id=0, cache_bytes=None):
        self.task_id = task_id
        self.batch_id = batch_id
        if cache_bytes is not None:
            self.cache_bytes = cache_bytes
        self.stores = {s.name: (FakeWindow() if s.kind == "window" else FakeKV()) for s in plan.stores}
        self.out = []

    def get_store(self, name):
        return self.stores[name]

    def forward(self, topic, k, v):
        self.out.append((topic, k, v))


def run_local(plan, records, partitions=1, cache_bytes=None):
    """records: (topic, key, value, ts). Runs stage 1 and one TaskProcessor per task over fakes
    (then flushes them: the end of the batch)."""
    ctxs, procs = {}, {}
    for i, (topic, k, v, ts) in enumerate(records):
        si = plan.source_index(topic)
        ks, vs = plan.source_serdes(si)
        kb = None if k is None else ks.to_bytes(k)
        vb = None if v is None else vs.to_bytes(v)
        for task, rec in plan.shuffle(si, kb, vb, ts, 0, i, partitions):
            if task not in procs:
                ctxs[task] = FakeCtx(plan, task, cache_bytes=cache_bytes)
                procs[task] = plan.new_processor(ctxs[task])
            procs[task].process_record(rec)
    for p in procs.values():
        p.flush()
    return ctxs, procs


# -- shape -----------------------------------------------------------------------------------------

def test_wordcount_plan_shape():
    plan = wordcount().compile()
    assert plan.source_topics == ["lines"]
    assert [s.role for s in plan.sources] == ["stream"]
    assert plan.store_names == ["counts"]
    assert plan.sink_topics == ["counts-out"]
    assert len(plan.routes) == 1
    r = plan.routes[0]
    assert r.keyed and r.key_serde == "str" and r.target.startswith("KSTREAM-AGGREGATE-")
    spec = plan.store("counts")
    assert (spec.kind, spec.key_serde, spec.value_serde) == ("kv", "str", "int64")
    assert plan.changelog_topics("wc") == {"counts": "wc-counts-changelog"}


def test_pre_shuffle_is_the_stateless_part():
    plan = wordcount().compile()
    assert list(plan.pre_shuffle(0, None, "a b a", 5)) == [("a", "a"), ("b", "b"), ("a", "a")]


def test_describe_nodes_and_edges():
    plan = wordcount().compile()
    d = plan.describe("wc")
    ids = {n["id"]: n for n in d["nodes"]}
    types = sorted({n["type"] for n in d["nodes"]})
    assert types == ["changelog", "processor", "sink", "source", "store"]
    assert ids["counts"]["kind"] == "kv"
    assert ids["wc-counts-changelog"]["cleanup_policy"] == "compact"
    kinds = {(e["from"].split("-0")[0], e["to"].split("-0")[0], e["kind"]) for e in d["edges"]}
    assert ("KSTREAM-KEY-SELECT", "KSTREAM-AGGREGATE", "shuffle") in kinds
    assert ("counts", "wc-counts-changelog", "changelog") in kinds
    phases = {n["kind"]: n["phase"] for n in d["nodes"] if n["type"] != "store"}
    assert phases["flat_map_values"] == "pre-shuffle" and phases["aggregate"] == "task"
    text = plan.describe_text("wc")
    assert "==shuffle==>" in text and "wc-counts-changelog" in text


def test_branch_before_shuffle_gives_two_routes():
    b = TopologyBuilder()
    words = b.stream("lines").flat_map_values(str.split)
    words.to("words")
    words.group_by(lambda k, w: w).count(store="c")
    plan = b.compile()
    assert len(plan.routes) == 2
    routed = plan.pre_shuffle_routed(0, None, "x y", 1)
    assert sorted(routed, key=lambda r: (r[0], r[2])) == [(0, None, "x"), (0, None, "y"),
                                                         (1, "x", "x"), (1, "y", "y")]
    # unkeyed route: None keys go to partition % N, keyed route drops None keys
    tasks = [(t, rec[0]) for t, rec in plan.shuffle(0, None, b"x", 1, 3, 0, 4)]
    assert (3, 0) in tasks and any(r == 1 for _t, r in tasks)


def test_table_and_join_plan():
    b = TopologyBuilder()
    users = b.table("users", store="users")
    b.stream("clicks").join(users, lambda c, u: f"{c}@{u}", how="left").to("enriched")
    plan = b.compile()
    assert [(s.topic, s.role) for s in plan.sources] == [("users", "table"), ("clicks", "stream")]
    assert {r.target.split("-0")[0] for r in plan.routes} == {"KTABLE-SOURCE", "KSTREAM-JOIN"}
    lookups = [e for e in plan.describe()["edges"] if e["kind"] == "lookup"]
    assert lookups and lookups[0]["from"] == "users"


def test_windowed_plan():
    b = TopologyBuilder()
    (b.stream("clicks").group_by_key().windowed_by(hopping(10_000, 5_000), grace_ms=2_000)
     .count(store="wc"))
    plan = b.compile()
    s = plan.store("wc")
    assert (s.kind, s.window_size_ms, s.retention_ms) == ("window", 10_000, 12_000)
    assert plan.has_windows
    assert plan.describe("a")["nodes"][1]["windows"] == "hopping(10000ms every 5000ms)"


# -- store names -------------------------------------------------------------------------------------

def test_auto_store_names_are_readable_and_unique():
    b = TopologyBuilder()
    s = b.stream("words")
    s.group_by_key().count()
    s.group_by_key().count()
    s.group_by_key().windowed_by(tumbling(1000)).count()
    b.table("users")
    plan = b.compile()
    assert plan.store_names == ["words-count", "words-count-2", "words-windowed-count", "users-table"]


def test_explicit_name_wins_over_auto_name():
    b = TopologyBuilder()
    s = b.stream("words")
    s.group_by_key().count()                      # would be words-count
    s.group_by_key().reduce(lambda a, v: a + v, store="words-count")
    plan = b.compile()
    assert sorted(plan.store_names) == ["words-count", "words-count-2"]
    assert plan.store("words-count").value_serde == "str"   # the reduce's store


def test_store_name_used_twice_is_one_line_error():
    b = TopologyBuilder()
    s = b.stream("words")
    s.group_by_key().count(store="x")
    s.group_by_key().reduce(lambda a, v: a, store="x")
    with pytest.raises(TopologyError) as ei:
        b.compile()
    msg = str(ei.value)
    assert "'x' is used twice" in msg and "\n" not in msg


def test_require_store_names():
    b = TopologyBuilder(require_store_names=True)
    with pytest.raises(TopologyError, match="no store name"):
        b.stream("words").group_by_key().count()


@pytest.mark.parametrize("bad", ["a b", "", "x/y", "é"])
def test_invalid_store_name(bad):
    b = TopologyBuilder()
    with pytest.raises(TopologyError, match="not a valid name"):
        b.stream("w").group_by_key().count(store=bad)


def test_reserved_store_name():
    b = TopologyBuilder()
    b.stream("w").group_by_key().count(store="_task")
    with pytest.raises(TopologyError, match="reserved"):
        b.compile()


def test_processor_store_declared_twice_vs_shared_by_name():
    class P(Processor):
        def process(self, k, v):
            pass

    b = TopologyBuilder()
    s = b.stream("w")
    s.process(P, stores=[kv_store("seen")])
    s.process(P, stores=[kv_store("seen")])
    with pytest.raises(TopologyError, match="used twice"):
        b.compile()
    b = TopologyBuilder()
    s = b.stream("w")
    s.process(P, stores=[kv_store("seen")])
    s.process(P, stores=["seen"])                 # a reference: shared
    plan = b.compile()
    assert plan.store_names == ["seen"]


# -- structural errors -------------------------------------------------------------------------------

def test_second_repartition_needs_the_application_name():
    b = TopologyBuilder()
    counts = b.stream("w").group_by(lambda k, v: v).count(store="c1")
    counts.to_stream().map(lambda k, v: (str(v), k)).group_by_key().count(store="c2")
    with pytest.raises(TopologyError) as ei:
        b.compile()
    msg = str(ei.value)
    assert "KSTREAM-MAP" in msg and "<application>-c2-repartition" in msg and "\n" not in msg
    assert "builder.compile(application=...)" in msg
    plan = b.compile("app")
    assert [sp.store_names for sp in plan.subtopologies] == [["c1"], ["c2"]]
    assert plan.repartition_topics == ["app-c2-repartition"]


def test_keyed_step_after_task_side_key_change_processor_repartitions():
    class P(Processor):
        def process(self, k, v):
            self.context.forward(v, k)

    b = TopologyBuilder()
    b.stream("w").process(P).group_by_key().count(store="c")
    with pytest.raises(TopologyError, match="needs a repartition topic"):
        b.compile()
    plan = b.compile("a")
    up, down = plan.subtopologies
    assert up.sink_topics == ["a-c-repartition"] and down.source_topics == ["a-c-repartition"]
    assert down.sources[0].internal and up.sinks[0].internal


def test_keyless_steps_after_aggregation_are_fine():
    b = TopologyBuilder()
    t = b.stream("w").group_by(lambda k, v: v).count(store="c")
    t.to_stream().map(lambda k, v: (k.upper(), v)).filter(lambda k, v: v > 1).to("out")
    t.filter(lambda k, v: v % 2 == 0).map_values(lambda v: v * 10).to_stream().to("even")
    b.compile()


def test_join_needs_same_key_serde():
    b = TopologyBuilder()
    users = b.table("users", store="users", key_serde="json")
    b.stream("clicks").join(users, lambda c, u: c)
    with pytest.raises(TopologyError, match="not co-partitioned"):
        b.compile()


def test_join_after_rekey_in_stage1_is_fine_and_routes_by_new_key():
    b = TopologyBuilder()
    users = b.table("users", store="users")
    (b.stream("clicks").map(lambda k, v: (v.split(":")[0], v))
     .join(users, lambda c, u: (c, u)).to("out", value_serde="json"))
    plan = b.compile()
    [(task, rec)] = list(plan.shuffle(1, None, b"bob:home", 7, 0, 0, 8))
    from statekit.partition import partition_for
    assert task == partition_for(b"bob", 8)


def test_other_errors():
    b = TopologyBuilder()
    b.stream("a")
    with pytest.raises(TopologyError, match="already a source"):
        b.stream("a")
    with pytest.raises(TopologyError, match="class"):
        b.stream("b").process(Processor())
    with pytest.raises(TopologyError, match="needs windows=JoinWindows"):
        b.stream("c").join(b.stream("d"), lambda a, b: a)
    with pytest.raises(TopologyError, match="needs a function"):
        b.stream("e").map(42)
    with pytest.raises(TopologyError):
        hopping(10, 20)
    with pytest.raises(TopologyError, match="empty"):
        TopologyBuilder().compile()
    b2 = TopologyBuilder()
    b2.stream("x").to("o", value_serde="int64")
    b2.stream("y").to("o", value_serde="json")
    with pytest.raises(TopologyError, match="two different serdes"):
        b2.compile()


# -- pickling -------------------------------------------------------------------------------------------

def test_plan_pickles_with_cloudpickle_and_runs_after():
    from pyspark import cloudpickle

    class Upper(Processor):
        def process(self, k, v):
            self.context.forward(k, v.upper())

    factor = 3
    b = TopologyBuilder()
    users = b.table("users", store="users")
    s = b.stream("lines").flat_map_values(lambda line: line.split())
    s.group_by(lambda k, w: w).count(store="counts").to_stream().to("out", value_serde="int64")
    s.map_values(lambda w: len(w) * factor, value_serde="json").to("lens", value_serde="json")
    s.process(Upper).to("upper")
    b.stream("clicks").join(users, lambda c, u: [c, u], how="left").to("j", value_serde="json")
    (b.stream("ticks").group_by_key().windowed_by(tumbling(100)).aggregate(
        lambda: 0, lambda k, v, a: a + int(v), store="w"))
    plan = b.compile()
    plan.stores  # materialize cached specs: they must not break pickling
    plan._pre_funcs()
    blob = cloudpickle.dumps(plan)
    plan2 = pickle.loads(blob)
    assert plan2.store_names == plan.store_names
    count_route = next(r.index for r in plan2.routes if r.keyed and r.source_index == plan2.source_index("lines"))
    routed = plan2.pre_shuffle_routed(plan2.source_index("lines"), None, "ab c", 0)
    assert [(k, v) for r, k, v in routed if r == count_route] == [("ab", "ab"), ("c", "c")]
    ctxs, _ = run_local(plan2, [("lines", None, "ab c ab", 1)])
    out = ctxs[0].out
    assert ("out", "ab", 2) in out and ("lens", None, 6) in out and ("upper", None, "AB") in out


# -- windows -------------------------------------------------------------------------------------------------

def test_window_starts():
    assert tumbling(10).starts(0) == [0]
    assert tumbling(10).starts(19) == [10]
    assert hopping(10, 5).starts(12) == [5, 10]
    assert hopping(10, 3).starts(12) == [3, 6, 9, 12]
    assert hopping(10, 5).starts(3) == [0]
    for ts in range(0, 200, 7):
        for size, adv in ((10, 5), (10, 3), (30, 10), (7, 7)):
            want = [s for s in range(0, ts + 1) if s % adv == 0 and s <= ts < s + size]
            assert hopping(size, adv).starts(ts) == want


def test_windowed_serde_roundtrip():
    s = WindowedSerde("str")
    assert s.from_bytes(s.to_bytes(("k", 1234))) == ("k", 1234)
    assert s.to_bytes(("k", 1)) == b"k" + (1).to_bytes(8, "big")
    assert pickle.loads(pickle.dumps(s)) == s


# -- the task processor over fakes -----------------------------------------------------------------------

def test_aggregations_forward_every_update():
    b = TopologyBuilder()
    g = b.stream("nums", value_serde="json").group_by_key()
    g.reduce(lambda a, v: a + v, store="sum").to_stream().to("sums", value_serde="json")
    g.aggregate(lambda: {"n": 0, "max": None},
                lambda k, v, a: {"n": a["n"] + 1, "max": v if a["max"] is None else max(a["max"], v)},
                store="agg")
    plan = b.compile()
    ctxs, _ = run_local(plan, [("nums", "a", 3, 1), ("nums", "a", 5, 2), ("nums", "b", 1, 3),
                               ("nums", None, 9, 4), ("nums", "a", None, 5)])
    c = ctxs[0]
    assert c.out == [("sums", "a", 3), ("sums", "a", 8), ("sums", "b", 1)]
    assert c.stores["sum"].d == {"a": 8, "b": 1}
    assert c.stores["agg"].d == {"a": {"n": 2, "max": 5}, "b": {"n": 1, "max": 1}}


def test_aggregations_forward_on_flush_with_a_record_cache():
    """cache_bytes > 0 and caching stores: nothing is forwarded until flush(), then the latest value
    per key, once, in first-update order, with the metadata of the key's last update; a store with
    caching=False still forwards every update; a cached aggregation downstream of another one is
    flushed after it."""
    seen = []

    class Stamp(Processor):
        def process(self, k, v):
            seen.append((k, v, self.context.timestamp, self.context.offset))
            self.context.forward(k, v)

    b = TopologyBuilder()
    g = b.stream("nums", value_serde="json").group_by_key()
    sums = g.reduce(lambda a, v: a + v, store="sum")
    sums.to_stream().process(Stamp).to("sums", value_serde="json")
    g.count(store=kv_store("raw", caching=False)).to_stream().to("raw", value_serde="int64")
    (g.windowed_by(tumbling(10)).count(store="w")
     .to_stream().to("w", key_serde=WindowedSerde("str"), value_serde="int64"))
    sums.to_stream().group_by_key().count(store="sum-updates").to_stream().to("n", value_serde="int64")
    plan = b.compile()
    recs = [("nums", "a", 3, 1), ("nums", "b", 1, 2), ("nums", "a", 5, 13), ("nums", None, 9, 14),
            ("nums", "b", 2, 15), ("nums", "a", 1, 16)]
    ctx = FakeCtx(plan, cache_bytes=1 << 20)
    proc = plan.new_processor(ctx)
    for i, (topic, k, v, ts) in enumerate(recs):
        for _task, rec in plan.shuffle(0, plan.source_serdes(0)[0].to_bytes(k) if k else None,
                                       plan.source_serdes(0)[1].to_bytes(v), ts, 0, i, 1):
            proc.process_record(rec)
    # before the flush: only the uncached store's updates went out
    assert ctx.out == [("raw", "a", 1), ("raw", "b", 1), ("raw", "a", 2), ("raw", "b", 2),
                       ("raw", "a", 3)]
    assert ctx.stores["sum"].d == {"a": 9, "b": 3}      # the stores are up to date all along
    ctx.out.clear()
    assert proc.flush() == 2 + 4 + 2
    assert ctx.out == [("sums", "a", 9), ("sums", "b", 3),                       # first-update order
                       ("w", ("a", 0), 1), ("w", ("b", 0), 1), ("w", ("a", 10), 2),
                       ("w", ("b", 10), 1),
                       ("n", "a", 1), ("n", "b", 1)]                              # flushed after "sum"
    assert seen == [("a", 9, 16, 5), ("b", 3, 15, 4)]  # timestamp/offset of the key's last update
    assert proc.flush() == 0 and proc.rec.offset == 5  # nothing held; metadata restored
    # the same records over a context without a record cache: every update, at once
    ctxs, _ = run_local(plan, recs)
    assert [o for o in ctxs[0].out if o[0] == "sums"] == [("sums", "a", 3), ("sums", "b", 1),
                                                          ("sums", "a", 8), ("sums", "b", 3),
                                                          ("sums", "a", 9)]
    assert [o for o in ctxs[0].out if o[0] == "n"] == [("n", "a", 1), ("n", "b", 1), ("n", "a", 2),
                                                       ("n", "b", 2), ("n", "a", 3)]


def test_windowed_grace_drops_late_records():
    b = TopologyBuilder()
    (b.stream("e").group_by_key().windowed_by(tumbling(10), grace_ms=5).count(store="w")
     .to_stream().to("o", key_serde=WindowedSerde("str"), value_serde="int64"))
    plan = b.compile()
    ctxs, procs = run_local(plan, [("e", "k", "x", 3), ("e", "k", "x", 12), ("e", "k", "x", 14),
                                   ("e", "k", "x", 9),    # stream time 14, window [0,10) closes at 15: ok
                                   ("e", "k", "x", 16),
                                   ("e", "k", "x", 8)])   # window [0,10) closed (10 <= 16 - 5)
    c = ctxs[0]
    assert c.stores["w"].d == {("k", 0): 2, ("k", 10): 3}
    assert procs[0].dropped_late == 1 and procs[0].stream_time == 16
    assert c.out[-1] == ("o", ("k", 10), 3)


def test_table_filter_and_map_values_views_on_join():
    b = TopologyBuilder()
    users = b.table("users", store="users")
    view = users.filter(lambda k, v: not v.startswith("x")).map_values(str.upper)
    b.stream("clicks").join(view, lambda c, u: f"{c}/{u}", how="left").to("o")
    view.to_stream().to("view")
    plan = b.compile()
    ctxs, _ = run_local(plan, [("users", "a", "ann", 1), ("users", "b", "xbob", 2),
                               ("clicks", "a", "c1", 3), ("clicks", "b", "c2", 4),
                               ("clicks", "z", "c3", 5), ("users", "a", None, 6),
                               ("clicks", "a", "c4", 7)])
    c = ctxs[0]
    assert [o for o in c.out if o[0] == "o"] == [("o", "a", "c1/ANN"), ("o", "b", "c2/None"),
                                                  ("o", "z", "c3/None"), ("o", "a", "c4/None")]
    assert [o for o in c.out if o[0] == "view"] == [("view", "a", "ANN"), ("view", "b", None),
                                                     ("view", "a", None)]
    assert c.stores["users"].d == {"b": "xbob"}


def test_processor_api_context():
    seen = []

    class P(Processor):
        def init(self, context):
            self.context = context
            self.store = context.get_store("s")
            self.w = context.get_store("w")

        def process(self, k, v):
            c = self.context
            seen.append((c.task_id, c.batch_id, c.timestamp, c.offset, c.topic, c.partition))
            self.store.put(k, (self.store.get(k) or 0) + 1)
            self.w.put(k, v, c.timestamp - c.timestamp % 10)
            c.forward(k + "!", v)

        def close(self):
            seen.append("closed")

    b = TopologyBuilder()
    b.stream("in").process(P, stores=[kv_store("s"), window_store("w", 10)]).to("out")
    plan = b.compile()
    ctxs, procs = run_local(plan, [("in", "a", "1", 15), ("in", "a", "2", 17)])
    procs[0].close()
    c = ctxs[0]
    assert c.out == [("out", "a!", "1"), ("out", "a!", "2")]
    assert c.stores["s"].d == {"a": 2} and c.stores["w"].d == {("a", 10): "2"}
    assert seen == [(0, 0, 15, 0, "in", 0), (0, 0, 17, 1, "in", 0), "closed"]


def test_processor_asking_for_undeclared_store():
    class P(Processor):
        def init(self, context):
            context.get_store("nope")

        def process(self, k, v):
            pass

    b = TopologyBuilder()
    b.stream("in").process(P, stores=[kv_store("s")])
    plan = b.compile()
    with pytest.raises(TopologyError, match="nope"):
        plan.new_processor(FakeCtx(plan))


def test_processor_error_is_one_line_and_names_the_record():
    b = TopologyBuilder()
    b.stream("in").map_values(lambda v: 1 // int(v)).group_by_key().count(store="c")
    plan = b.compile()
    with pytest.raises(ProcessorError) as ei:
        list(plan.shuffle(0, b"key-1", b"0", 5, 2, 41, 4))
    msg = str(ei.value)
    assert "\n" not in msg
    for part in ("KSTREAM-MAPVALUES", "key='key-1'", "value='0'", "in partition 2 offset 41",
                 "ZeroDivisionError"):
        assert part in msg, (part, msg)


def test_processor_error_in_task_step():
    b = TopologyBuilder()
    long_value = "v" * 500
    b.stream("in").group_by_key().reduce(lambda a, v: a + int(v), store="r")
    plan = b.compile()
    with pytest.raises(ProcessorError) as ei:
        run_local(plan, [("in", "k", "x", 1), ("in", "k", long_value, 2)])
    msg = str(ei.value)
    assert "\n" not in msg and "KSTREAM-AGGREGATE" in msg and "reduce" in msg
    assert "in partition 0 offset 1" in msg and "…" in msg and len(msg) < 400


def test_key_serde_mismatch_in_shuffle_is_one_line():
    b = TopologyBuilder()
    b.stream("in").group_by(lambda k, v: len(v)).count(store="c")
    plan = b.compile()
    with pytest.raises(ProcessorError, match="key_serde"):
        list(plan.shuffle(0, None, b"abc", 1, 0, 0, 2))


def test_store_decl_serdes_inherit_and_mismatch():
    b = TopologyBuilder()
    b.stream("w").group_by_key().count(store=kv_store("c"))
    b.stream("v", key_serde="json").group_by_key().windowed_by(tumbling(10)).count(
        store=window_store("wc", 10, retention_ms=100))
    plan = b.compile()
    assert (plan.store("c").key_serde, plan.store("c").value_serde) == ("str", "int64")
    assert (plan.store("wc").key_serde, plan.store("wc").retention_ms) == ("json", 100)
    b = TopologyBuilder()
    b.stream("w").group_by_key().count(store=kv_store("c", key_serde="json"))
    with pytest.raises(TopologyError, match="wrong task"):
        b.compile()
    b = TopologyBuilder()
    b.stream("w").process(Processor, stores=[kv_store("p")])
    assert b.compile().store("p").key_serde == "json"
