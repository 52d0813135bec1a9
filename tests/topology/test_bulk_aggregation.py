"""Bulk aggregation (issues 14 and 21): with a record cache, the records of a source that feeds an
aggregation straight (its store read by nothing else) are applied column-wise, per key. Everything
observable must be what one record at a time gives (`TaskProcessor.bulk_aggregation = False`):
outputs (bytes, order, metadata), store contents and changelog bytes, skipped counts — for keys
and values as they come off the wire (None, JSON null, JSON whose bytes are not the store's
canonical ones), for a batch cut in two (a crash "after N records") and for user functions that
depend on the order of the records (they see a key's records in offset order on both paths)."""
from __future__ import annotations

import importlib.util
import os
import random
from collections import defaultdict

import pytest

from statekit.engine.local import LocalEngine
from statekit.errors import ProcessorError
from statekit.stores import RecordingSink, build_stores
from statekit.topology import Processor, TaskProcessor, TopologyBuilder, kv_store
from statekit.topology import bulk as bulk_mod
from statekit.topology.records import Records

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("topo_models", os.path.join(HERE, "topo_models.py"))
M = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)

# key bytes as producers write them; several are JSON the store's serde writes otherwise
KEYS = [None, b'"a"', b' "a"', b'"\\u0061"', b'"b"', b'"\xc3\xa9"', b'"\\u00e9"', b'"\x7f"',
        b"1", b" 1", b"01", b"1.0", b"true", b"-0", b"0", b"null", b" null",
        b'{"b": 1, "a": 2}', b'{"a":2,"b":1}', b"[1, 2]", b"[1,2]"]
VALUES = [None, b"null", b" null", b"null\n", b"\tnull ", b"0", b"3", b" 4", b"-2", b"17"]


class Ctx:
    """A task's context without `forward_columns`: a bulk aggregation forwards key by key."""

    def __init__(self, plan, stores, batch, cache_bytes=1 << 20):
        self.plan = plan
        self.task_id = 0
        self.batch_id = batch
        self.stream_time = -1
        self.cache_bytes = cache_bytes
        self.meta = {}
        self.stores = stores
        self.out = []
        self.proc = None

    def get_store(self, name):
        return self.stores[name]

    def _bytes(self, topic, k, v):
        ks, vs = self.plan.sink_serdes(topic)
        return None if k is None else ks.to_bytes(k), None if v is None else vs.to_bytes(v)

    def forward(self, topic, k, v, timestamp=None):
        r = self.proc.rec
        assert timestamp == r.timestamp
        self.out.append((topic, *self._bytes(topic, k, v), timestamp, r.offset, r.partition,
                         r.topic))


class ColumnCtx(Ctx):
    """A context with `forward_columns` (the worker's): outputs as (topic, key, value, timestamp)
    bytes, whichever way they come."""

    def forward(self, topic, k, v, timestamp=None):
        self.out.append((topic, *self._bytes(topic, k, v), timestamp))

    def forward_columns(self, topic, keys, values, timestamps):
        self.out.extend(zip([topic] * len(keys), keys, values, timestamps))


def run(plan, batches, tmp_path, bulk, tag, cuts=None, ctx_cls=Ctx):
    """Every batch (a `Records`) through a TaskProcessor over real stores, committed; `cuts[i]`:
    positions where batch i is cut into several process_batch calls. Returns (outputs per batch,
    store contents as bytes, each commit's changelog as what a restore reads of it — per store,
    the last record of each key, in the order the keys were first logged — skipped_null). (A bulk
    write logs a key when it is applied, so a batch cut in two may log a key twice; the second
    record is the one a restore keeps.)"""
    sink = RecordingSink()
    stores, db = build_stores(plan.stores, str(tmp_path / tag), sink, cache_bytes=1 << 20, sync=False)
    old = TaskProcessor.bulk_aggregation
    TaskProcessor.bulk_aggregation = bulk
    outs, skipped, engaged, logs = [], 0, [], []
    run.engaged = engaged      # did each batch have bulk aggregations
    try:
        for i, batch in enumerate(batches):
            ctx = ctx_cls(plan, stores, i)
            proc = plan.new_processor(ctx)
            ctx.proc = proc
            engaged.append(bool(proc._bulk))
            edges = [0] + list((cuts or {}).get(i, [])) + [len(batch)]
            for a, b in zip(edges, edges[1:]):
                proc.process_batch(batch.slice(a, b))
            proc.flush()
            proc.close()
            skipped += proc.skipped_null
            db.flush()
            db.commit({"batch": i})
            outs.append(ctx.out)
            per_store: dict = {}
            for store, k, v in sink.records:
                per_store.setdefault(store, {})[k] = v
            logs.append(per_store)
            sink.records.clear()
        contents = {name: sorted(s.inner.all()) for name, s in stores.items()}
        return outs, contents, [{st: list(d.items()) for st, d in sorted(c.items())}
                                for c in logs], skipped
    finally:
        TaskProcessor.bulk_aggregation = old
        db.close()


def batch_of(plan, rows, offsets):
    """A task's `Records` from (topic, key bytes, value bytes, timestamp) rows: each topic's
    records in row order (its offsets continue from `offsets`), the sources merged as a task
    merges its partitions."""
    by_src = defaultdict(list)
    for topic, kb, vb, ts in rows:
        si = plan.source_index(topic)
        off = offsets.get(topic, 0)
        offsets[topic] = off + 1
        by_src[si].append((si, 0, off, ts, kb, vb))
    return Records.merge([Records.from_rows(r) for _si, r in sorted(by_src.items())])


def seq(k, v, agg):
    """Not order-insensitive, and it must get the aggregate as the json store gives it back (a
    list), though it returns a tuple: the bulk path must go through the store's serde between two
    records of a key, as one record at a time does."""
    if type(agg) is not list:
        raise TypeError(f"the aggregate should come back from the store as a list: {agg!r}")
    return tuple(agg) + (v,)


def plan_three_sources():
    """Three sources, each feeding one aggregation (bulk), and a fourth one a stateless step
    (always record by record), all in one task."""
    b = TopologyBuilder()
    js = {"key_serde": "json", "value_serde": "json"}
    b.stream("n1", **js).group_by_key().count(store="n").to_stream().to(
        "n-out", key_serde="json", value_serde="int64")
    b.stream("n2", **js).group_by_key().reduce(lambda a, v: a * 31 + v, store="r").to_stream().to(
        "r-out", key_serde="json", value_serde="json")
    b.stream("n3", **js).group_by_key().aggregate(lambda: [], seq, store="seq").to_stream().to(
        "seq-out", key_serde="json", value_serde="json")
    b.stream("n4", **js).filter(lambda k, v: v is not None).to("f-out", key_serde="json",
                                                               value_serde="json")
    return b.compile()


def random_batches(plan, seed, n_batches=5, size=80):
    rng = random.Random(seed)
    offsets, out, ts = {}, [], 0
    for _ in range(n_batches):
        rows = []
        for _ in range(size):
            ts += rng.randint(-2, 3)          # timestamps against the offsets now and then
            rows.append((rng.choice(["n1", "n2", "n3", "n3", "n4"]), rng.choice(KEYS),
                         rng.choice(VALUES), max(ts, 0)))
        out.append((batch_of(plan, rows, offsets), rows))
    return out


@pytest.mark.parametrize("seed", [5, 6])
def test_bulk_equals_per_record_when_every_key_comes_once(tmp_path, seed):
    """A build: every key once per batch in each source (the count keeps the records' own order and
    metadata), keys coming back in later batches, batches cut in two or three."""
    plan = plan_three_sources()
    rng = random.Random(seed)
    offsets, batches, ts = {}, [], 0
    for _ in range(4):
        rows = []
        for topic in ("n1", "n2", "n3"):
            for i in rng.sample(range(300), 120):
                ts += rng.randint(-2, 3)
                rows.append((topic, b'"k%d"' % i, rng.choice(VALUES), max(ts, 0)))
        batches.append(batch_of(plan, rows, offsets))
    cuts = {i: sorted(rng.sample(range(1, len(b)), rng.randint(1, 2)))
            for i, b in enumerate(batches)}
    one = run(plan, batches, tmp_path, False, "one")
    assert run(plan, batches, tmp_path, True, "bulk") == one
    assert run(plan, batches, tmp_path, True, "cut", cuts) == one
    cols = run(plan, batches, tmp_path, True, "columns", cuts, ColumnCtx)
    assert cols[1:] == one[1:] and cols[0] == [[o[:4] for o in batch] for batch in one[0]]
    outs, contents, _log, skipped = one
    assert skipped > 0 and all(len(contents[s]) > 120 for s in ("n", "r", "seq"))
    assert all(len(o) > 90 for o in outs)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_bulk_equals_per_record(tmp_path, seed):
    plan = plan_three_sources()
    data = random_batches(plan, seed)
    batches = [b for b, _rows in data]
    rng = random.Random(seed)
    cuts = {i: sorted(rng.sample(range(1, len(b)), rng.randint(1, 2)))
            for i, b in enumerate(batches)}
    one = run(plan, batches, tmp_path, False, "one")
    assert run.engaged == [False] * len(batches)
    bulk = run(plan, batches, tmp_path, True, "bulk")
    assert run.engaged == [True] * len(batches)
    assert bulk == one
    # a batch cut in two or three process_batch calls (a crash "after N records") stores, logs and
    # forwards what the whole batch does
    assert run(plan, batches, tmp_path, True, "cut", cuts) == one
    # a worker's context takes the results as columns: the same records
    cols = run(plan, batches, tmp_path, True, "columns", cuts, ColumnCtx)
    assert cols[1:] == one[1:]
    assert cols[0] == [[o[:4] for o in batch] for batch in one[0]]
    outs, contents, changelog, skipped = one
    assert skipped > 0 and sum(len(o) for o in outs) < sum(len(b) for b in batches)
    # keys are stored as the store's serde writes them (a query finds them), one entry per key
    for name in ("n", "r", "seq"):
        assert all(kb in (b'"a"', b'"b"', b'"\\u00e9"', b'"\\u007f"', b"1", b"1.0", b"true",
                          b"0", b'{"a":2,"b":1}', b"[1,2]") for kb, _vb in contents[name])
    # the sequence holds every value of a key in the order of its records (offset order)
    ks, vs = plan.source_serdes(plan.source_index("n3"))
    want = defaultdict(list)
    for _b, rows in data:
        for topic, kb, vb, _ts in rows:
            if topic == "n3" and None not in (kb, vb) and ks.from_bytes(kb) is not None \
                    and vs.from_bytes(vb) is not None:
                want[ks.to_bytes(ks.from_bytes(kb))].append(vs.from_bytes(vb))
    assert {kb: vs.from_bytes(vb) for kb, vb in contents["seq"]} == dict(want)


def test_bulk_applies_only_where_nothing_reads_the_store(tmp_path):
    b = TopologyBuilder()
    counts = b.stream("nums", value_serde="json").group_by_key().count(store="n")
    b.stream("lookups").join(counts, lambda x, n: f"{x}:{n}").to("o")   # reads "n" mid-batch
    plan = b.compile()
    rows = [("nums", b"a", b"1", 1), ("lookups", b"a", b"x", 2), ("nums", b"a", b"1", 3),
            ("lookups", b"a", b"y", 4)]
    out = run(plan, [batch_of(plan, rows, {})], tmp_path, True, "t")[0]
    assert [o[:3] for o in out[0]] == [("o", b"a", b"x:1"), ("o", b"a", b"y:2")]
    assert run.engaged == [False]

    class Peek(Processor):
        def process(self, k, v):
            self.context.forward(k, self.context.get_store("m").get(k))

    b = TopologyBuilder()
    s = b.stream("nums", value_serde="json")
    s.group_by_key().count(store=kv_store("m"))
    s.process(Peek, stores=["m"], value_serde="json").to("p", value_serde="json")
    plan = b.compile()
    ctx = Ctx(plan, build_stores(plan.stores, str(tmp_path / "p"), RecordingSink())[0], 0)
    assert not plan.new_processor(ctx)._bulk                  # the processor shares the store
    b = TopologyBuilder()
    g = b.stream("nums", value_serde="json").group_by_key()
    g.count(store="c1")
    g.count(store="c2")
    plan = b.compile()
    ctx = Ctx(plan, build_stores(plan.stores, str(tmp_path / "g"), RecordingSink())[0], 0)
    assert not plan.new_processor(ctx)._bulk                  # the source feeds two steps


@pytest.mark.parametrize("op,rows,key", [
    ("reduce", [(b"a", b"10"), (b"b", b"3"), (b"a", b"0")], "a"),          # its key came before
    ("aggregate", [(b"a", b"10"), (b"b", b"3"), (b"c", b"0"), (b"d", b"1")], "c"),  # a build's batch
])
def test_bulk_error_names_the_failing_record(tmp_path, op, rows, key):
    """A failing user function names its record (offset 2), whether its key came before in the
    batch or every key comes once."""
    b = TopologyBuilder()
    g = b.stream("nums", value_serde="json").group_by_key()
    if op == "reduce":
        g.reduce(lambda a, v: a // v, store="r", value_serde="json")
    else:
        g.aggregate(lambda: 100, lambda k, v, a: a // v, store="r", value_serde="json")
    plan = b.compile()
    rows = [("nums", k, v, i + 1) for i, (k, v) in enumerate(rows)]
    with pytest.raises(ProcessorError) as ei:
        run(plan, [batch_of(plan, rows, {})], tmp_path, True, "e")
    assert run.engaged == [True]
    msg = str(ei.value)
    assert "ZeroDivisionError" in msg and "offset 2" in msg and f"key='{key}'" in msg and "\n" not in msg


def undecodable_error(plan, rows, tmp_path, bulk, name) -> str:
    """The one-line error of a batch holding a record that does not decode."""
    with pytest.raises(ProcessorError) as ei:
        run(plan, [batch_of(plan, rows, {})], tmp_path, bulk, name)
    assert run.engaged == [bulk]
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "per-record"])
def test_undecodable_key_is_the_same_one_line_error_on_both_paths(tmp_path, bulk):
    b = TopologyBuilder()
    b.stream("nums", key_serde="json", value_serde="json").group_by_key().count(store="n")
    plan = b.compile()
    rows = [("nums", b'"a"', b"1", 1), ("nums", b'"a', b"1", 2)]
    msg = undecodable_error(plan, rows, tmp_path, bulk, "u")
    assert msg.startswith("cannot decode a record of nums partition 0 offset 1")
    assert "key_serde=" in msg


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "per-record"])
def test_undecodable_value_of_an_aggregate_is_the_same_one_line_error_on_both_paths(tmp_path, bulk):
    """The bulk path decodes a batch's values as one column; one that does not decode sends it
    back to one record at a time, which names that record."""
    b = TopologyBuilder()
    b.stream("nums", key_serde="json", value_serde="json").group_by_key().aggregate(
        lambda: 0, lambda k, v, a: a + v, store="s")
    plan = b.compile()
    rows = [("nums", b'"a"', b"1", 1), ("nums", b'"b"', b"2", 2), ("nums", b'"a"', b"[3", 3)]
    msg = undecodable_error(plan, rows, tmp_path, bulk, "v")
    assert msg.startswith("cannot decode a record of nums partition 0 offset 2")
    assert "value_serde=" in msg


def test_no_bulk_without_a_cache_and_a_cut_batch_stays_bulk(tmp_path, monkeypatch):
    plan = plan_three_sources()
    stores, db = build_stores(plan.stores, str(tmp_path / "x"), RecordingSink(), sync=False)
    try:
        assert sorted(plan.new_processor(Ctx(plan, stores, 0))._bulk) == [0, 1, 2]
        assert not plan.new_processor(Ctx(plan, stores, 0, cache_bytes=0))._bulk
    finally:
        db.close()
    applied = []
    real = bulk_mod.BulkAggregate.apply
    monkeypatch.setattr(bulk_mod.BulkAggregate, "apply",
                        lambda self, records, idx: applied.append(self.topic) or
                        real(self, records, idx))
    rows = [("n3", b'"a"', b"%d" % i, i) for i in range(6)]
    batch = batch_of(plan, rows, {})
    whole = run(plan, [batch], tmp_path, True, "whole")
    assert applied == ["n3"]
    cut = run(plan, [batch], tmp_path, True, "cut", {0: [4]})   # a crash "after 4 records"
    assert applied == ["n3", "n3", "n3"] and cut == whole
    assert whole[1]["seq"] == [(b'"a"', b"[0,1,2,3,4,5]")]
    # one update per key per batch, with the last record's metadata, the function's own value
    assert whole[0] == [[("seq-out", b'"a"', b"[0,1,2,3,4,5]", 5, 5, 0, "n3")]]


def test_forwards_the_functions_own_value_as_one_record_at_a_time(tmp_path):
    """With caching, one record at a time forwards at flush the value the user's function last
    returned (a tuple here), not the store's copy of it (a list): the bulk path does too."""
    b = TopologyBuilder()
    (b.stream("n3", key_serde="json", value_serde="json").group_by_key()
     .aggregate(lambda: [], seq, store="seq").to_stream()
     .map_values(lambda v: [type(v).__name__, *v])
     .to("t-out", key_serde="json", value_serde="json"))
    plan = b.compile()
    rows = [("n3", b'"a"', b"1", 1), ("n3", b'"b"', b"2", 2), ("n3", b'"a"', b"3", 3)]
    batches = [batch_of(plan, rows, {}), batch_of(plan, rows[:1], {"n3": 3})]
    one = run(plan, batches, tmp_path, False, "one")
    assert run(plan, batches, tmp_path, True, "bulk", {0: [2]}) == one
    assert run.engaged == [True, True]
    assert [[o[1:3] for o in batch] for batch in one[0]] == [
        [(b'"a"', b'["tuple",1,3]'), (b'"b"', b'["tuple",2]')], [(b'"a"', b'["tuple",1,3,1]')]]


# -- a key's records in offset order, on both paths, over several partitions and sources ----------

def concat(k, v, agg):
    return agg + v


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "per-record"])
def test_user_aggregator_sees_a_keys_records_in_offset_order(shared_broker, tmp_path, monkeypatch,
                                                              bulk):
    """String concatenation and a list append (not commutative) over 3 partitions: s1 and s2 each
    feed their own aggregation (the bulk path when bulk is on), m1 and m2 are merged first (always
    record by record). Timestamps run against the offsets: a task takes its partitions in offset
    order, merged across sources by head timestamp, never sorted by time."""
    b = TopologyBuilder()
    b.stream("s1").group_by_key().aggregate(lambda: "", concat, store="cat").to_stream().to(
        "cat-out")
    b.stream("s2").group_by_key().aggregate(lambda: [], lambda k, v, a: a + [v], store="lst",
                                            value_serde="json")
    b.stream("m1").merge(b.stream("m2")).group_by_key().aggregate(lambda: "", concat, store="both")
    plan = b.compile()
    assert len(plan.subtopologies) == 1
    applied = []
    real = bulk_mod.BulkAggregate.apply
    monkeypatch.setattr(bulk_mod.BulkAggregate, "apply",
                        lambda self, records, idx: applied.append(self.topic) or
                        real(self, records, idx))
    monkeypatch.setattr(TaskProcessor, "bulk_aggregation", bulk)
    eng = LocalEngine(plan, f"order-{int(bulk)}", shared_broker.bootstrap, str(tmp_path / "s"), 3)
    rng = random.Random(5)
    want = {"cat": defaultdict(str), "lst": defaultdict(list), "both": defaultdict(str)}
    offsets, n = {}, 0
    for _ in range(4):
        batch = []
        for _ in range(120):
            n += 1
            batch.append((rng.choice(["s1", "s2", "m1", "m2"]), rng.choice("abcdefg"), f"{n},",
                          rng.randint(0, 1000)))
        outs = eng.decode(eng.run_batch(batch))
        for _t, k, v, _ts in batch:          # one source per key: input order is offset order
            if _t == "s1":
                want["cat"][k] += v
            elif _t == "s2":
                want["lst"][k].append(v)
        for _task, recs in M.engine_order(batch, 3, plan.source_index, str.encode, offsets).items():
            for topic, k, v, _ts in recs:
                if topic in ("m1", "m2"):
                    want["both"][k] += v
        # the cached aggregation forwards each key's value at the end of the batch, once
        assert sorted(outs) == sorted(("cat-out", k, want["cat"][k]) for k in
                                      {k for t, k, _v, _ts in batch if t == "s1"})
    assert eng.store("cat") == dict(want["cat"])
    assert eng.store("lst") == dict(want["lst"])
    assert eng.store("both") == dict(want["both"])
    # the merged order is neither the input order nor time order for some key
    by_input, by_time = defaultdict(str), defaultdict(str)
    recs = [r for r in batch if r[0] in ("m1", "m2")]
    for _t, k, v, _ts in recs:
        by_input[k] += v
    for _t, k, v, _ts in sorted(recs, key=lambda r: r[3]):
        by_time[k] += v
    last = defaultdict(str)
    for _task, rs in M.engine_order(batch, 3, plan.source_index, str.encode, {}).items():
        for _t, k, v, _ts in rs:
            if _t in ("m1", "m2"):
                last[k] += v
    assert last != by_input and last != by_time
    assert (set(applied) == {"s1", "s2"}) if bulk else applied == []
    eng.close()
