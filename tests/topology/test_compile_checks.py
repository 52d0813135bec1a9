"""Topologies that cannot work are refused when they are built or compiled (the app cell), with one
line that says what to change; and the Plan contract the runtime relies on."""
from __future__ import annotations

import pickle

import pytest

from statekit.errors import StatekitError, TopologyError
from statekit.topology.plan import RouteSpec
from statekit.topology.records import Records
from statekit.topology import (JoinWindows, Processor, PunctuationType, SessionWindows,
                               SlidingWindows, TopologyBuilder, kv_store, session_store, tumbling,
                               until_time_limit, until_window_closes)


class Memory:
    """A kv store in a dict (what a task's store does, without RocksDB)."""

    def __init__(self):
        self.d = {}

    def get(self, k):
        return self.d.get(k)

    def put(self, k, v):
        if v is None:
            self.d.pop(k, None)
        else:
            self.d[k] = v


def one_line(excinfo, *parts):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for p in parts:
        assert p in msg, (p, msg)
    return msg


# -- refused ---------------------------------------------------------------------------------------------

def test_stream_stream_join_of_differently_keyed_streams():
    b = TopologyBuilder()
    left = b.stream("L", key_serde="str")
    right = b.stream("R", key_serde="json")
    left.join(right, lambda a, c: a, JoinWindows.of(10))
    with pytest.raises(TopologyError) as ei:
        b.compile("a")
    one_line(ei, "not co-partitioned", "'str'", "'json'", "same key serde")


def test_table_table_join_of_differently_keyed_tables():
    b = TopologyBuilder()
    t1 = b.table("t1", key_serde="str")
    t2 = b.table("t2", key_serde="int64")
    t1.join(t2, lambda a, c: a)
    with pytest.raises(TopologyError) as ei:
        b.compile("a")
    one_line(ei, "not co-partitioned", "'int64'")


def test_stream_table_join_after_a_task_side_rekey_is_repartitioned_not_refused():
    b = TopologyBuilder()
    users = b.table("users", store="users")
    counts = b.stream("clicks").group_by_key().count(store="c")
    counts.to_stream().map(lambda k, n: (str(n), k), value_serde="str").join(
        users, lambda a, u: f"{a}/{u}").to("o")
    with pytest.raises(TopologyError) as ei:
        b.compile()
    one_line(ei, "needs a repartition topic", "compile(application=...)")
    plan = b.compile("a")
    assert len(plan.subtopologies) == 2
    assert plan.subtopology_of("users") is plan.subtopologies[1]


@pytest.mark.parametrize("make", [
    lambda: JoinWindows(5, 5, -1),
    lambda: JoinWindows(-6, 5, 0),
    lambda: SessionWindows(10, -1),
    lambda: SessionWindows(0, 1),
    lambda: SlidingWindows(10, -5),
    lambda: SlidingWindows(-1, 0),
    lambda: TopologyBuilder().stream("x").group_by_key().windowed_by(tumbling(10), grace_ms=-1),
    lambda: until_time_limit(-3),
    lambda: until_window_closes(max_records=0),
])
def test_bad_windows_and_suppressions(make):
    with pytest.raises(TopologyError) as ei:
        make()
    msg = one_line(ei)
    assert "must be" in msg or "needs" in msg


def test_until_window_closes_needs_a_windowed_table():
    b = TopologyBuilder()
    t = b.stream("x").group_by_key().count()
    with pytest.raises(TopologyError) as ei:
        t.suppress(until_window_closes())
    one_line(ei, "needs a windowed table", "until_time_limit")
    with pytest.raises(TopologyError) as ei:
        b.table("y").suppress(until_window_closes())
    one_line(ei, "windowed table")
    # through views it finds the window (and its grace) of the table behind
    b = TopologyBuilder()
    (b.stream("x").group_by_key().windowed_by(SessionWindows(10, 3)).count()
     .filter(lambda k, v: v > 1).suppress(until_window_closes()))
    sup = next(n for n in b.compile().nodes if n.kind == "suppress")
    assert sup.params["grace_ms"] == 13 and sup.params["window"] == ("session", 0)


def test_punctuator_interval_and_type_refused_when_compiled():
    class Neg(Processor):
        def init(self, context):
            context.schedule(-5, PunctuationType.WALL_CLOCK_TIME, lambda ts: None)

    class WrongType(Processor):
        def init(self, context):
            context.schedule(5, "stream", lambda ts: None)

    for cls, part in ((Neg, "interval > 0"), (WrongType, "PunctuationType.STREAM_TIME")):
        b = TopologyBuilder()
        b.stream("x").process(cls)
        with pytest.raises(TopologyError) as ei:
            b.compile()
        one_line(ei, part, "process(")


def test_other_refusals():
    b = TopologyBuilder()
    s = b.stream("x")
    with pytest.raises(TopologyError) as ei:
        s.join(b.stream("y"), lambda a, c: a)
    one_line(ei, "windows=JoinWindows")
    with pytest.raises(TopologyError) as ei:
        s.join(b.table("t"), lambda a, c: a, how="outer")
    one_line(ei, "'inner' or 'left'")
    with pytest.raises(TopologyError) as ei:
        b.table("u").join(b.table("v"), lambda v: v, lambda a, c: a, how="outer")
    one_line(ei, "foreign-key join")
    windowed = b.stream("w").group_by_key().windowed_by(tumbling(5)).count()
    with pytest.raises(TopologyError) as ei:
        windowed.group_by(lambda k, v: k)
    one_line(ei, "to_stream()")
    with pytest.raises(TopologyError) as ei:
        b.stream("s").group_by_key().windowed_by(SessionWindows(10, 5)).count(
            store=session_store("s", retention_ms=12))
    one_line(ei, "shorter than gap + grace (15 ms)")
    with pytest.raises(TopologyError) as ei:
        b.stream("z").group_by_key().windowed_by(SlidingWindows(10)).count(store=kv_store("k"))
    one_line(ei, "window store")
    with pytest.raises(TopologyError, match="application must be"):
        b.compile("")


# -- the Plan contract ------------------------------------------------------------------------------------

def three_part_topology():
    b = TopologyBuilder()
    users = b.table("users", store="users", value_serde="json")
    per_region = users.group_by(lambda k, v: v["region"]).count(store="per-region")
    (per_region.to_stream().map(lambda r, n: (str(n), r), value_serde="str").group_by_key()
     .count(store="regions-per-size").to_stream().to("sizes", value_serde="int64"))
    b.stream("clicks").group_by_key().windowed_by(tumbling(10)).count(store="clicks-w")
    return b


def test_plan_contract_of_a_repartitioned_topology():
    plan = three_part_topology().compile("app")
    subs = plan.subtopologies
    assert [sp.subtopology_index for sp in subs] == [0, 1, 2]
    assert plan.subtopology_index is None and plan.is_composite
    assert [sp.store_names for sp in subs] == [["users", "clicks-w"], ["per-region"],
                                               ["regions-per-size"]]
    assert plan.store_names == ["users", "clicks-w", "per-region", "regions-per-size"]
    assert plan.repartition_topics == ["app-per-region-repartition",
                                       "app-regions-per-size-repartition"]
    assert plan.source_topics == ["users", "clicks"] and plan.sink_topics == ["sizes"]
    # a repartition topic: a sink of the upstream part, a stream source of the downstream one,
    # with the same serdes
    up, mid, down = subs
    sink = next(s for s in up.sinks if s.topic == "app-per-region-repartition")
    src = next(s for s in mid.sources if s.topic == "app-per-region-repartition")
    assert sink.internal and src.internal and src.role == "stream"
    assert up.sink_serdes(sink.topic)[1] == mid.source_serdes(src.index)[1]
    assert up.repartition_topics == ["app-per-region-repartition"]
    assert mid.repartition_topics == ["app-per-region-repartition",
                                      "app-regions-per-size-repartition"]
    assert all(sp.needs_task_store for sp in subs)
    assert up.has_windows and not mid.has_windows
    with pytest.raises(TopologyError) as ei:
        plan.new_processor(object())
    one_line(ei, "3 sub-topologies", "each of plan.subtopologies")
    for sp in subs:
        assert sp.subtopologies == [sp] and not sp.is_composite
        # a task reads its partition of every source: one route per source, into its source node
        assert sp.routes == [RouteSpec(s.index, s.index, s.node, s.key_serde, False)
                             for s in sp.sources]
        assert all(sp.post.values()) and not sp.engine_shuffle


def test_plan_contract_without_repartition_is_the_plan_itself():
    b = TopologyBuilder()
    b.stream("w").group_by_key().count(store="c").to_stream().to("o", value_serde="int64")
    plan = b.compile()
    assert plan.subtopologies == [plan] and plan.subtopology_index == 0
    assert plan.repartition_topics == [] and not plan.is_composite
    assert b.compile("named").subtopologies[0].store_names == ["c"]
    b = TopologyBuilder()
    b.stream("w").filter(lambda k, v: True).to("o")
    assert b.compile().needs_task_store        # sinks: the outbox
    b = TopologyBuilder()
    b.table("t", store="t")
    assert not b.compile().needs_task_store    # nothing of the task's own to keep


def test_subplans_pickle_and_run_alone():
    from pyspark import cloudpickle

    plan = three_part_topology().compile("app")
    for sp in plan.subtopologies:
        again = pickle.loads(cloudpickle.dumps(sp))
        assert again.store_names == sp.store_names and again.sources == sp.sources
        assert again.subtopologies == [again]
    mid = pickle.loads(cloudpickle.dumps(plan.subtopologies[1]))
    ks, vs = mid.source_serdes(0)
    # a table's changes travel as (new, old); the record's event time is its Kafka timestamp, and
    # what the task makes of it keeps that time (the next repartition record's timestamp)
    assert vs.to_bytes(({"region": "eu"}, None)) == (
        b"\x00\x00\x00\x0f" + b'{"region":"eu"}' + b"\xff\xff\xff\xff")
    out = []

    class Ctx:
        task_id, batch_id = 2, 0
        stores = {"per-region": Memory()}

        def get_store(self, name):
            return self.stores[name]

        def forward(self, topic, key, value, timestamp=None):
            out.append((topic, key, value, timestamp))

    proc = mid.new_processor(Ctx())
    proc.process_batch(Records.of(0, 2, [7], [1234], [ks.to_bytes("eu")],
                                  [vs.to_bytes(({"region": "eu"}, None))]))
    assert out == [("app-regions-per-size-repartition", "1", "eu", 1234)]
    assert proc.stream_time == 1234


def test_compiling_twice_or_with_another_name_leaves_the_builder_alone():
    b = three_part_topology()
    n = len(b.nodes)
    a1 = b.compile("one")
    a2 = b.compile("two")
    assert len(b.nodes) == n
    assert a1.repartition_topics[0].startswith("one-") and a2.repartition_topics[0].startswith("two-")
    with pytest.raises(StatekitError):
        b.compile()
