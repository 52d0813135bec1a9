"""Bulk aggregation (issue 14): with a record cache, a batch's records of an aggregation whose store
nothing else reads are applied per key at once. Everything observable must be what the per-record
path gives: outputs (values, order, metadata), store contents, changelog, skipped counts — also for a
user function that depends on the order of the records."""
from __future__ import annotations

import random

import pytest

from statekit.errors import ProcessorError
from statekit.stores import RecordingSink, build_stores
from statekit.topology import Processor, TaskProcessor, TopologyBuilder, kv_store

VOCAB = ["a", "b", "c", "d", "e", "f", "é", "日本"]


class Ctx:
    def __init__(self, stores, batch, cache_bytes=1 << 20):
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

    def forward(self, topic, k, v):
        r = self.proc.rec
        self.out.append((topic, k, v, r.timestamp, r.offset, r.partition, r.topic))


def run(plan, batches, tmp_path, bulk, tag):
    """Every batch through a TaskProcessor over real stores, committed; returns (outputs per batch,
    store contents, changelog records, skipped_null)."""
    sink = RecordingSink()
    stores, db = build_stores(plan.stores, str(tmp_path / tag), sink, cache_bytes=1 << 20, sync=False)
    old = TaskProcessor.bulk_aggregation
    TaskProcessor.bulk_aggregation = bulk
    outs, skipped, engaged = [], 0, []
    run.engaged = engaged      # did each batch take the bulk path
    try:
        for i, batch in enumerate(batches):
            recs = []
            for j, (topic, k, v, ts) in enumerate(batch):
                si = plan.source_index(topic)
                ks, vs = plan.source_serdes(si)
                recs.extend(rec for _t, rec in plan.shuffle(
                    si, None if k is None else ks.to_bytes(k), None if v is None else vs.to_bytes(v),
                    ts, 0, i * 1000 + j, 1))
            ctx = Ctx(stores, i)
            proc = plan.new_processor(ctx)
            ctx.proc = proc
            engaged.append(proc._bulk is not None)
            proc.process_records(recs)
            proc.flush()
            proc.close()
            skipped += proc.skipped_null
            db.flush()
            db.commit({"batch": i})
            outs.append(ctx.out)
        contents = {name: sorted(map(repr, s.all())) for name, s in stores.items()}
        return outs, contents, list(sink.records), skipped
    finally:
        TaskProcessor.bulk_aggregation = old
        db.close()


def batches_of(seed, n_batches=5, size=60, nulls=True):
    rng = random.Random(seed)
    out, ts = [], 0
    for _ in range(n_batches):
        batch = []
        for _ in range(size):
            ts += rng.randint(0, 3)
            k = rng.choice(VOCAB + ([None] if nulls else []))
            v = None if nulls and rng.random() < 0.05 else rng.randint(0, 50)
            batch.append(("nums", k, v, ts))
        out.append(batch)
    return out


def plan_all_three():
    b = TopologyBuilder()
    g = b.stream("nums", value_serde="json").group_by_key()
    g.count(store="n").to_stream().to("n-out", value_serde="int64")
    g.reduce(lambda a, v: a * 31 + v, store="r", value_serde="json").to_stream().to(
        "r-out", value_serde="json")
    # not order-insensitive: the aggregate is the sequence of values, as a tuple it gets back as
    # a list from its json store (the function must see exactly that)
    g.aggregate(lambda: [], lambda k, v, agg: agg + [v] if isinstance(agg, list) else None,
                store="seq").to_stream().to("seq-out", value_serde="json")
    return b.compile()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bulk_equals_per_record(tmp_path, seed):
    plan = plan_all_three()
    data = batches_of(seed)
    bulk = run(plan, data, tmp_path, True, "bulk")
    assert run.engaged == [True] * len(data)
    one = run(plan, data, tmp_path, False, "one")
    assert run.engaged == [False] * len(data)
    assert bulk == one
    outs, contents, changelog, skipped = bulk
    assert skipped == one[3] > 0
    assert sum(len(o) for o in outs) < sum(len(b) for b in data)     # once per key per batch
    # the sequence aggregate holds every value in the order the records came
    want = {}
    for batch in data:
        for _t, k, v, _ts in batch:
            if k is not None and v is not None:
                want.setdefault(k, []).append(v)
    assert contents["seq"] == sorted(map(repr, want.items()))


def test_bulk_applies_only_where_nothing_reads_the_store(tmp_path):
    b = TopologyBuilder()
    counts = b.stream("nums", value_serde="json").group_by_key().count(store="n")
    b.stream("lookups").join(counts, lambda x, n: f"{x}:{n}").to("o")   # reads "n" mid-batch
    plan = b.compile()
    out = run(plan, [[("nums", "a", 1, 1), ("lookups", "a", "x", 2), ("nums", "a", 1, 3),
                      ("lookups", "a", "y", 4)]], tmp_path, True, "t")[0]
    assert [o[:3] for o in out[0]] == [("o", "a", "x:1"), ("o", "a", "y:2")]
    assert run.engaged == [False]

    class Peek(Processor):
        def process(self, k, v):
            self.context.forward(k, self.context.get_store("m").get(k))

    b = TopologyBuilder()
    s = b.stream("nums", value_serde="json")
    s.group_by_key().count(store=kv_store("m"))
    s.process(Peek, stores=["m"], value_serde="json").to("p", value_serde="json")
    plan = b.compile()
    ctx = Ctx(*build_stores(plan.stores, str(tmp_path / "p"), RecordingSink())[:1], 0)
    assert not plan.new_processor(ctx)._bulk                  # the processor shares the store


def test_bulk_error_names_the_failing_record(tmp_path):
    b = TopologyBuilder()
    b.stream("nums", value_serde="json").group_by_key().reduce(lambda a, v: a // v, store="r",
                                                               value_serde="json")
    plan = b.compile()
    with pytest.raises(ProcessorError) as ei:
        run(plan, [[("nums", "a", 10, 1), ("nums", "b", 3, 2), ("nums", "a", 0, 3)]], tmp_path,
            True, "e")
    assert run.engaged == [True]
    msg = str(ei.value)
    assert "ZeroDivisionError" in msg and "offset 2" in msg and "key='a'" in msg and "\n" not in msg


def test_no_bulk_with_a_per_record_callback_or_without_a_cache(tmp_path):
    plan = plan_all_three()
    stores, db = build_stores(plan.stores, str(tmp_path / "x"), RecordingSink(), sync=False)
    try:
        assert plan.new_processor(Ctx(stores, 0))._bulk
        assert not plan.new_processor(Ctx(stores, 0, cache_bytes=0))._bulk
        ctx = Ctx(stores, 0)
        proc = plan.new_processor(ctx)
        ctx.proc = proc
        seen = []
        ks, vs = plan.source_serdes(0)
        recs = [rec for i in range(3) for _t, rec in plan.shuffle(0, b"a", vs.to_bytes(i), i, 0, i, 1)]
        proc.process_records(recs, seen.append)           # a crash directive counts records
        assert seen == list(range(1, 10)) and stores["n"].get("a") == 3   # 3 routes per record
        assert stores["seq"].get("a") == [0, 1, 2]
    finally:
        db.close()
