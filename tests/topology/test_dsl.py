"""DSL unit tests: graph shape, compile errors, pickling, windows, the task processor over fake stores.
No broker, no Spark."""
from __future__ import annotations

import pickle

import pytest

from statekit.errors import ProcessorError, TopologyError
from statekit.partition import partition_for
from statekit.topology import (Processor, TopologyBuilder, WindowedSerde, hopping, kv_store, tumbling,
                               window_store)
from statekit.topology.plan import RouteSpec, SinkSpec
from statekit.topology.records import Records


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
        self.stamps = []

    def get_store(self, name):
        return self.stores[name]

    def forward(self, topic, k, v, timestamp=None):
        self.out.append((topic, k, v))
        self.stamps.append(timestamp)


def batch_of(plan, rows):
    """One task's `Records` from (source index, partition, offset, timestamp, key, value) rows
    with Python keys and values (serialized with the source serdes), merged as a task merges its
    partitions."""
    by_src = {}
    for si, part, off, ts, k, v in rows:
        ks, vs = plan.source_serdes(si)
        by_src.setdefault(si, []).append((si, part, off, ts, None if k is None else ks.to_bytes(k),
                                          None if v is None else vs.to_bytes(v)))
    return Records.merge([Records.from_rows(r) for _si, r in sorted(by_src.items())])


def run_local(plan, records, partitions=1, cache_bytes=None):
    """records: (topic, key, value, ts[, partition]). One TaskProcessor per task over fakes, each
    task's records one batch (task = source partition; default murmur2(key bytes) % partitions, 0
    without key), flushed at the end."""
    rows, offsets = {}, {}
    for topic, k, v, ts, *part in records:
        si = plan.source_index(topic)
        if part:
            p = part[0]
        else:
            p = 0 if k is None else partition_for(plan.source_serdes(si)[0].to_bytes(k), partitions)
        off = offsets.get((topic, p), 0)
        offsets[(topic, p)] = off + 1
        rows.setdefault(p, []).append((si, p, off, ts, k, v))
    ctxs, procs = {}, {}
    for task in sorted(rows):
        ctxs[task] = FakeCtx(plan, task, cache_bytes=cache_bytes)
        procs[task] = plan.new_processor(ctxs[task])
        procs[task].process_batch(batch_of(plan, rows[task]))
        procs[task].flush()
    return ctxs, procs


def run_subtopologies(plan, records):
    """Every sub-topology of `plan` in order (one task each, over fakes), the records a
    sub-topology writes to a repartition topic serialized with the sink serdes and read back by
    the one that reads it, with the record's timestamp. Returns the external outputs."""
    pending = list(records)
    external = []
    for sp in plan.subtopologies:
        mine = [r for r in pending if r[0] in sp.source_topics]
        ctxs, _ = run_local(sp, mine)
        for c in ctxs.values():
            for (topic, k, v), ts in zip(c.out, c.stamps):
                if topic in plan.repartition_topics:
                    ks, vs = sp.sink_serdes(topic)
                    pending.append((topic, ks.from_bytes(ks.to_bytes(k)),
                                    vs.from_bytes(vs.to_bytes(v)), ts))
                else:
                    external.append((topic, k, v))
    return external


# -- shape -----------------------------------------------------------------------------------------

def test_wordcount_plan_shape():
    """A key change before the count: two sub-topologies joined by <app>-counts-repartition; a
    route per source, straight into its source node (every step runs in the task)."""
    b = wordcount()
    with pytest.raises(TopologyError, match="needs a repartition topic"):
        b.compile()
    plan = b.compile("wc")
    assert plan.is_composite and plan.repartition_topics == ["wc-counts-repartition"]
    assert plan.source_topics == ["lines"]
    assert [s.role for s in plan.sources] == ["stream"]
    assert plan.store_names == ["counts"]
    assert plan.sink_topics == ["counts-out"]
    up, down = plan.subtopologies
    assert up.source_topics == ["lines"] and up.store_names == []
    assert up.sinks == [SinkSpec("wc-counts-repartition", "str", "str", internal=True)]
    assert [(s.topic, s.key_serde, s.value_serde, s.internal) for s in down.sources] == [
        ("wc-counts-repartition", "str", "str", True)]
    for sp in (up, down):
        [src] = sp.sources
        assert sp.routes == [RouteSpec(0, 0, src.node, src.key_serde, False)]
        assert all(sp.post.values())                         # no stage before a shuffle
    assert down.store_names == ["counts"] and down.sink_topics == ["counts-out"]
    spec = plan.store("counts")
    assert (spec.kind, spec.key_serde, spec.value_serde) == ("kv", "str", "int64")
    assert plan.changelog_topics("wc") == {"counts": "wc-counts-changelog"}


def test_pre_shuffle_only_for_engine_shuffle_plans():
    """The stateless part before a shuffle exists only for an engine that shuffles itself
    (compile(engine_shuffle=True), Spark's own state store): there the word count needs no
    repartition topic and pre_shuffle yields the re-keyed words; a normal plan refuses it."""
    plan = wordcount().compile(engine_shuffle=True)
    assert not plan.is_composite and plan.repartition_topics == []
    assert list(plan.pre_shuffle(0, None, "a b a", 5)) == [("a", "a"), ("b", "b"), ("a", "a")]
    [r] = plan.routes
    assert r.keyed and r.key_serde == "str" and r.target.startswith("KSTREAM-AGGREGATE-")
    b = TopologyBuilder()
    b.stream("w").flat_map_values(str.split).to("o")
    with pytest.raises(TopologyError, match="engine_shuffle=True"):
        list(b.compile().pre_shuffle(0, None, "a b", 5))
    with pytest.raises(TopologyError, match="each of plan.subtopologies"):
        wordcount().compile("wc").pre_shuffle_routed(0, None, "a b", 5)


def test_describe_nodes_and_edges():
    plan = wordcount().compile("wc")
    d = plan.describe("wc")
    ids = {n["id"]: n for n in d["nodes"]}
    types = sorted({n["type"] for n in d["nodes"]})
    assert types == ["changelog", "processor", "sink", "source", "store", "topic"]
    assert ids["counts"]["kind"] == "kv"
    assert ids["wc-counts-changelog"]["cleanup_policy"] == "compact"
    assert ids["wc-counts-repartition"]["kind"] == "repartition"
    kinds = {(e["from"].split("-0")[0], e["to"].split("-0")[0], e["kind"]) for e in d["edges"]}
    assert ("KSTREAM-KEY-SELECT", "KSTREAM-SINK-counts-repartition", "flow") in kinds
    assert ("KSTREAM-SINK-counts-repartition", "wc-counts-repartition", "repartition") in kinds
    assert ("wc-counts-repartition", "KSTREAM-SOURCE-counts-repartition", "repartition") in kinds
    assert ("KSTREAM-SOURCE-counts-repartition", "KSTREAM-AGGREGATE", "flow") in kinds
    assert ("counts", "wc-counts-changelog", "changelog") in kinds
    assert not any(e["kind"] == "shuffle" for e in d["edges"])
    phases = {n["kind"]: n["phase"] for n in d["nodes"] if n["type"] not in ("store", "topic")}
    assert phases["flat_map_values"] == "task" and phases["aggregate"] == "task"
    subs = {n["kind"]: n["subtopology"] for n in d["nodes"] if n["type"] == "processor"}
    assert subs == {"flat_map_values": 0, "key_select": 0, "aggregate": 1, "to_stream": 1}
    text = plan.describe_text("wc")
    assert "==repartition topic==> wc-counts-repartition" in text and "wc-counts-changelog" in text
    assert "shuffle" not in text and "Stage 1" not in text
    assert text.count("Tasks (one per source partition, every step):") == 2
    native = wordcount().compile("wc", engine_shuffle=True).describe_text("wc")
    assert "Stage 1 (stateless, where records are read):" in native and "==shuffle==>" in native


def test_branch_gives_one_route_per_source():
    """A branch is steps of the task like any other: one route per source; the branch that
    re-keys for a count writes the repartition topic, the other writes its sink, both in the
    first sub-topology's task. A None key cannot be partitioned: the repartition sink skips it."""
    b = TopologyBuilder()
    words = b.stream("lines").flat_map_values(str.split)
    words.to("words")
    words.group_by(lambda k, w: w if w != "skip" else None).count(store="c")
    plan = b.compile("br")
    up, down = plan.subtopologies
    assert up.routes == [RouteSpec(0, 0, up.sources[0].node, "str", False)]
    assert up.sink_topics == ["words", "br-c-repartition"]
    ctx = FakeCtx(up)
    proc = up.new_processor(ctx)
    proc.process_batch(batch_of(up, [(0, 3, 7, 100, "k", "x y skip")]))
    proc.flush()
    assert ctx.out == [("words", "k", "x"), ("br-c-repartition", "x", "x"),
                       ("words", "k", "y"), ("br-c-repartition", "y", "y"),
                       ("words", "k", "skip")]
    assert ctx.stamps == [100] * 5 and proc.skipped_null == 1


@pytest.mark.parametrize("steps,topics", [
    (lambda s: s.group_by_key(), []),
    (lambda s: s.map_values(str.upper).filter(lambda k, v: True).peek(print)
     .flat_map_values(str.split).group_by_key(), []),
    (lambda s: s.group_by_key(key_serde="json"), ["a-c-repartition"]),      # other key bytes
    (lambda s: s.select_key(lambda k, v: v).group_by_key(), ["a-c-repartition"]),
    (lambda s: s.map(lambda k, v: (k, v)).group_by_key(), ["a-c-repartition"]),
    (lambda s: s.group_by(lambda k, v: k), ["a-c-repartition"]),
], ids=["group_by_key", "value_steps", "key_serde", "select_key", "map", "group_by"])
def test_a_repartition_topic_exactly_where_the_key_may_have_changed(steps, topics):
    """Steps that keep the key (and its bytes) leave a record in its source partition's task; a
    step that may change the key sends it through a repartition topic before the count."""
    b = TopologyBuilder()
    steps(b.stream("w")).count(store="c")
    plan = b.compile("a")
    assert plan.repartition_topics == topics
    assert len(plan.subtopologies) == 1 + len(topics)


def test_table_and_join_plan():
    b = TopologyBuilder()
    users = b.table("users", store="users")
    b.stream("clicks").join(users, lambda c, u: f"{c}@{u}", how="left").to("enriched")
    plan = b.compile()
    assert [(s.topic, s.role) for s in plan.sources] == [("users", "table"), ("clicks", "stream")]
    assert plan.routes == [RouteSpec(s.index, s.index, s.node, s.key_serde, False)
                           for s in plan.sources]
    assert [plan._by_name[r.target].children[0].name.split("-0")[0] for r in plan.routes] == [
        "KTABLE-SOURCE", "KSTREAM-JOIN"]
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

def test_repartition_after_an_aggregation_needs_the_application_name():
    b = TopologyBuilder()
    counts = b.stream("w").group_by_key().count(store="c1")
    counts.to_stream().map(lambda k, v: (str(v), k)).group_by_key().count(store="c2")
    with pytest.raises(TopologyError) as ei:
        b.compile()
    msg = str(ei.value)
    assert "KSTREAM-MAP" in msg and "<application>-c2-repartition" in msg and "\n" not in msg
    assert "builder.compile(application=...)" in msg
    plan = b.compile("app")
    assert [sp.store_names for sp in plan.subtopologies] == [["c1"], ["c2"]]
    assert plan.repartition_topics == ["app-c2-repartition"]
    # a group_by(fn) straight off the source changes the key as well: a topic of its own
    b = TopologyBuilder()
    counts = b.stream("w").group_by(lambda k, v: v).count(store="c1")
    counts.to_stream().map(lambda k, v: (str(v), k)).group_by_key().count(store="c2")
    with pytest.raises(TopologyError) as ei:
        b.compile()
    assert "KSTREAM-KEY-SELECT" in str(ei.value) and "<application>-c1-repartition" in str(ei.value)
    plan = b.compile("app")
    assert [sp.store_names for sp in plan.subtopologies] == [[], ["c1"], ["c2"]]
    assert plan.repartition_topics == ["app-c1-repartition", "app-c2-repartition"]


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
    plan = b.compile("a")
    assert plan.repartition_topics == ["a-c-repartition"]        # the group_by's only
    assert plan.subtopologies[1].sink_topics == ["out", "even"]


def test_join_needs_same_key_serde():
    b = TopologyBuilder()
    users = b.table("users", store="users", key_serde="json")
    b.stream("clicks").join(users, lambda c, u: c)
    with pytest.raises(TopologyError, match="not co-partitioned"):
        b.compile()


def test_join_after_rekey_goes_through_a_repartition_topic_keyed_by_the_new_key():
    """A task is its source partition: a click re-keyed by user is not in the task of that user's
    table partition, so the join reads the clicks back from a repartition topic, keyed (and so
    partitioned by the producer) by the new key; the table's sub-topology does the join."""
    b = TopologyBuilder()
    users = b.table("users", store="users")
    (b.stream("clicks").map(lambda k, v: (v.split(":")[0], v))
     .join(users, lambda c, u: (c, u)).to("out", value_serde="json"))
    with pytest.raises(TopologyError) as ei:
        b.compile()
    assert "KSTREAM-MAP" in str(ei.value) and "needs a repartition topic" in str(ei.value)
    plan = b.compile("a")
    up, down = plan.subtopologies
    [topic] = plan.repartition_topics
    assert up.source_topics == ["clicks"] and up.sink_topics == [topic]
    assert down.source_topics == ["users", topic] and down.store_names == ["users"]
    ctx = FakeCtx(up)
    up.new_processor(ctx).process_batch(batch_of(up, [(0, 5, 0, 7, None, "bob:home")]))
    assert ctx.out == [(topic, "bob", "bob:home")] and ctx.stamps == [7]
    assert up.sink_serdes(topic)[0].to_bytes("bob") == b"bob"   # murmur2(b"bob") picks its task
    out = run_subtopologies(plan, [("users", "bob", "Bob", 1), ("clicks", None, "bob:home", 7)])
    assert out == [("out", "bob", ("bob:home", "Bob"))]


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
    plan = b.compile("app")
    for sp in plan.subtopologies:
        sp.stores                  # materialize cached specs: they must not break pickling
        sp.source_serdes(0)
    blob = cloudpickle.dumps(plan)
    plan2 = pickle.loads(blob)
    assert plan2.store_names == plan.store_names
    assert [sp.store_names for sp in plan2.subtopologies] == [
        sp.store_names for sp in plan.subtopologies]
    out = run_subtopologies(plan2, [("lines", None, "ab c ab", 1)])
    assert [o for o in out if o[0] == "out"] == [("out", "ab", 1), ("out", "c", 1),
                                                 ("out", "ab", 2)]
    assert [o for o in out if o[0] != "out"] == [
        ("lens", None, 6), ("upper", None, "AB"), ("lens", None, 3), ("upper", None, "C"),
        ("lens", None, 6), ("upper", None, "AB")]
    # each sub-topology pickled alone (as an engine ships it) runs the same
    again = [pickle.loads(cloudpickle.dumps(sp)) for sp in plan.subtopologies]
    assert [sp.store_names for sp in again] == [sp.store_names for sp in plan.subtopologies]


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
    assert proc._bulk is None        # the source feeds several steps: record by record
    proc.process_batch(batch_of(plan, [(0, 0, i, ts, k, v)
                                       for i, (_t, k, v, ts) in enumerate(recs)]))
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
    proc = plan.new_processor(FakeCtx(plan))
    with pytest.raises(ProcessorError) as ei:
        proc.process_batch(batch_of(plan, [(0, 2, 40, 4, "key-0", "1"),
                                           (0, 2, 41, 5, "key-1", "0")]))
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


def test_key_serde_mismatch_before_a_repartition_is_one_line():
    """A group_by whose new key the repartition topic's key serde cannot write fails the batch in
    one line that names the topic and says where the serde goes."""
    from statekit.testing import TopologyTestDriver

    b = TopologyBuilder()
    b.stream("in").group_by(lambda k, v: len(v)).count(store="c")
    with TopologyTestDriver(b, "a") as driver:
        with pytest.raises(ProcessorError, match="key_serde") as ei:
            driver.pipe_input("in", None, "abc", 1)
        assert list(driver.get_store("c").all()) == []      # the failed batch left nothing
    msg = str(ei.value)
    assert "\n" not in msg and "a-c-repartition" in msg and "to the step before it" in msg


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
