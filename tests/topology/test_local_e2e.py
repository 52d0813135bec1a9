"""End to end with the local engine: topology + task runner + real stores, task state, changelogs in
the embedded broker. Every test compares exact store contents with a plain-Python reference computed
from the same seeded input."""
from __future__ import annotations

import importlib.util
import os
import random
import shutil
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from statekit.engine.local import LocalEngine
from statekit.errors import ProcessorError
from statekit.partition import partition_for
from statekit.topology import Processor, TopologyBuilder, WindowedSerde, hopping, kv_store, tumbling

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "cat", "émigré", "日本"]


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


C = _load("topo_chain", "chain.py")


def _load_worker():
    return _load("crash_worker", "crash_worker.py")


def make_engine(plan, broker, tmp_path, app, partitions=3, **kw):
    return LocalEngine(plan, app, broker.bootstrap, str(tmp_path / "state"), partitions, **kw)


def check_partitioning(eng, store, key_bytes=lambda k: k.encode()):
    for task, rows in eng.store_by_task(store).items():
        for k in rows:
            kk = k[0] if isinstance(k, tuple) else k
            assert partition_for(key_bytes(kk), eng.partitions) == task, (store, k, task)


def changelog_latest(broker, topic, partitions):
    """{key_bytes: value_bytes} of the data records of a changelog (last value wins)."""
    from statekit.kafka import Kafka

    latest = {}
    with Kafka(broker.bootstrap) as k:
        for p in range(partitions):
            for chunk in k.read(topic, p):
                for _off, _ts, key, value, headers in chunk.records:
                    if any(h[0] == "statekit.marker" for h in headers):
                        continue
                    latest[key] = value
    return {k: v for k, v in latest.items() if v is not None}


def end_offsets(broker, topics):
    from statekit.kafka import Kafka

    with Kafka(broker.bootstrap) as k:
        return {t: k.end_offsets(t) for t in topics}


# -- word count ----------------------------------------------------------------------------------

def wordcount_plan(caching=True, app="wc"):
    """Two sub-topologies: the lines are split and re-keyed by word, which goes through the
    repartition topic <app>-counts-repartition to the count."""
    b = TopologyBuilder()
    (b.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w)
     .count(store=kv_store("counts", caching=caching)).to_stream().to("counts-out", value_serde="int64"))
    plan = b.compile(app)
    assert [sp.store_names for sp in plan.subtopologies] == [[], ["counts"]]
    assert plan.repartition_topics == [f"{app}-counts-repartition"]
    return plan


def keyed_wordcount_plan():
    """The counting half of a word count (records already keyed by word): one sub-topology, the
    count fed straight by its source (the bulk path)."""
    b = TopologyBuilder()
    (b.stream("words").group_by_key().count(store="counts")
     .to_stream().to("counts-out", value_serde="int64"))
    return b.compile()


def wordcount_outputs(batches, partitions, every_update=False):
    """The exact outputs of the word count, batch by batch. A line goes to the task of its source
    partition (its 5th field); the first sub-topology's tasks run in order, each writing its lines'
    words (in line order) to the repartition topic, so a word's task of the count reads them in
    that order. Caching on: per batch and task (in order), the final count of each word updated in
    the batch, once, in first-update order. `every_update`: every count."""
    running = Counter()
    want = []
    for batch in batches:
        per_task = defaultdict(dict)   # task -> {word: count}, insertion order = first update
        updates = defaultdict(list)    # task -> [(word, count)]
        for _t, _k, line, _ts, _p in sorted(batch, key=lambda r: r[4]):   # stable: line order
            for w in line.split():
                running[w] += 1
                task = partition_for(w.encode(), partitions)
                per_task[task][w] = running[w]
                updates[task].append((w, running[w]))
        for task in sorted(per_task):
            pairs = updates[task] if every_update else per_task[task].items()
            want.extend(("counts-out", w, c) for w, c in pairs)
    return want


def word_batches(seed, n_batches=4, lines=50, partitions=3):
    """Lines (topic, None, line, ts, source partition), spread over the source partitions."""
    rnd = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(len(VOCAB))]
    ts = 1000
    out = []
    for _ in range(n_batches):
        batch = []
        for _ in range(lines):
            ts += rnd.randint(0, 5)
            words = rnd.choices(VOCAB, weights, k=rnd.randint(0, 8))
            batch.append(("lines", None, " ".join(words), ts, rnd.randrange(partitions)))
        out.append(batch)
    return out


def keyed_words(batches):
    """The same words as records keyed by word (what the repartition topic holds)."""
    return [[("words", w, w, ts) for _t, _k, line, ts, _p in b for w in line.split()]
            for b in batches]


def test_wordcount_exact(broker, tmp_path):
    plan = wordcount_plan()
    chain = C.Chain(plan, "wc", broker, tmp_path, 3)
    eng = chain.engine_of("counts")
    data = word_batches(7)
    ref = Counter()
    seq = defaultdict(list)
    outputs = []
    for batch in data:
        outputs.extend(chain.run_batch(batch))
        for _t, _k, line, _ts, _p in batch:
            ref.update(line.split())
    assert eng.store("counts") == dict(ref)
    check_partitioning(eng, "counts")
    # the store caches (the default): one output per word per batch, its count at the end of the
    # batch, in first-update order within each task
    assert outputs == wordcount_outputs(data, 3)
    assert len(outputs) < sum(ref.values())
    for topic, k, v in outputs:
        seq[k].append(v)
    assert {k: v[-1] for k, v in seq.items()} == dict(ref)
    # the changelog holds the same state (latest value per key)
    from statekit.stores import get_serde

    cl = changelog_latest(broker, chain.changelog("counts"), 3)
    ks, vs = get_serde("str"), get_serde("int64")
    assert {ks.from_bytes(k): vs.from_bytes(v) for k, v in cl.items()} == dict(ref)


@pytest.mark.parametrize("how", ["caching on", "store caching=False", "cache_bytes=0"])
def test_forwarding_rule_cache_on_vs_off(broker, tmp_path, how):
    """Kafka Streams' KTable cache: with caching, an aggregation forwards the latest value per key
    once per commit (here: per batch); without (the store's caching=False, or no record cache in the
    task), every update."""
    plan = wordcount_plan(caching=(how != "store caching=False"), app="fwd")
    kw = {"cache_bytes": 0} if how == "cache_bytes=0" else {}
    chain = C.Chain(plan, "fwd", broker, tmp_path, 2, **kw)
    data = [[("lines", None, "a b a", 1, 0), ("lines", None, "a c b", 2, 0)],
            [("lines", None, "b b", 3, 0)],
            [("lines", None, "c a", 4, 0)]]
    outs = [chain.run_batch(b) for b in data]
    assert chain.store("counts") == {"a": 4, "b": 4, "c": 2}
    task = {w: partition_for(w.encode(), 2) for w in "abc"}

    def ordered(pairs):   # tasks in order, records in input order within a task
        return [("counts-out", w, n) for t in (0, 1) for w, n in pairs if task[w] == t]

    if how == "caching on":
        assert outs == [ordered([("a", 3), ("b", 2), ("c", 1)]),   # a: 1,2,3 -> 3; b: 1,2 -> 2
                        ordered([("b", 4)]),
                        ordered([("c", 2), ("a", 4)])]
    else:
        assert outs == [ordered([("a", 1), ("b", 1), ("a", 2), ("a", 3), ("c", 1), ("b", 2)]),
                        ordered([("b", 3), ("b", 4)]),
                        ordered([("c", 2), ("a", 4)])]
    assert outs == _split(wordcount_outputs(data, 2, every_update=(how != "caching on")),
                          [len(o) for o in outs])
    # a replayed batch is skipped: its outputs were written with its commit
    assert all(out == [] for _i, _b, out in chain.replay())


def _split(items, sizes):
    out, i = [], 0
    for n in sizes:
        out.append(items[i:i + n])
        i += n
    assert i == len(items)
    return out


def test_replay_skips_an_applied_batch(broker, tmp_path):
    plan = keyed_wordcount_plan()
    eng = make_engine(plan, broker, tmp_path, "wcr", partitions=3)
    data = keyed_words(word_batches(11, n_batches=3))
    first = [eng.run_batch(b) for b in data]
    assert first[-1]
    before = eng.store("counts")
    topics = ["wcr-counts-changelog"]
    ends = end_offsets(broker, topics)
    # batch 2 again, same id: skipped; its outputs went out with its commit, nothing is re-emitted
    assert eng.replay() == []
    assert eng.store("counts") == before
    assert end_offsets(broker, topics) == ends  # nothing written: the batch was skipped
    assert eng.run_tasks(0, eng._encode(data[0])) == []
    assert eng.store("counts") == before
    # the next batch continues normally
    eng.run_batch(data[0])
    ref = Counter(w for batch in data + [data[0]] for _t, w, _v, _ts in batch)
    assert eng.store("counts") == dict(ref)


def test_restore_from_scratch_then_replay_skips(broker, tmp_path):
    from statekit.event_bus import EventReader

    plan = keyed_wordcount_plan()
    reader = EventReader(broker.bootstrap, "wcs")
    try:
        eng = make_engine(plan, broker, tmp_path, "wcs", partitions=2, events=True)
        data = keyed_words(word_batches(5, n_batches=3))
        outs = [eng.run_batch(b) for b in data]
        shutil.rmtree(tmp_path / "state")       # disk loss: every task restores from its changelog
        assert outs[-1]
        assert eng.replay() == []               # opens (restores), sees batch 2 applied, skips it
        ref = Counter(w for b in data for _t, w, _v, _ts in b)
        assert eng.store("counts") == dict(ref)
        ev = reader.wait_for(lambda e: e.type == "batch_skipped" and e.task == "0_1", timeout=10)
        assert ev is not None and ev.batch == 2 and ev.last_batch == 2
        evs = reader.events()
        types = Counter(e.type for e in evs)
        assert types["commit"] >= 3 and types["task_opened"] >= 5
        ends = [e for e in evs if e.type == "restore_end" and e.store == "counts"]
        assert {e.task for e in ends} == {"0_0", "0_1"}
        assert all(e.source == "scratch" and e.restored > 0 for e in ends)
        starts = [e for e in evs if e.type == "restore_start"]
        assert starts and all(e.to_replay > 0 for e in starts)
        commit = next(e for e in evs if e.type == "commit")
        assert commit.app == "wcs" and "counts" in commit.offsets and commit.records > 0
        assert commit.changelog["counts"] > 0 and commit.rows["counts"] > 0
    finally:
        reader.close()


# -- windows -------------------------------------------------------------------------------------

def window_events(seed, n=400, keys=6, late_every=7):
    rnd = random.Random(seed)
    ts = 0
    out = []
    for i in range(n):
        ts += rnd.randint(0, 900)
        t = ts - rnd.randint(0, 25_000) if i % late_every == 0 else ts   # some late records
        out.append(("clicks", f"user{rnd.randrange(keys)}", "click", max(t, 0)))
    return out


def window_reference(batches, windows, grace, partitions, outputs=None):
    """The window store after `batches` (each task's records in input order: late ones arrive
    late); `outputs` (a list), when given, gets what a caching window store forwards: per batch and
    task (in order), the final count of each (key, window start) the batch updated, once, in
    first-update order."""
    store = Counter()
    stream_time = defaultdict(lambda: -1)
    for batch in batches:
        by_task = defaultdict(list)    # a task takes its partition's records in offset order
        for _t, k, _v, ts in batch:
            by_task[partition_for(k.encode(), partitions)].append((ts, k))
        for task in sorted(by_task):
            updated = {}
            for ts, k in by_task[task]:
                stream_time[task] = max(stream_time[task], ts)
                for start in windows.starts(ts):
                    if start + windows.size_ms > stream_time[task] - grace:
                        store[(k, start)] += 1
                        updated[(k, start)] = store[(k, start)]
            if outputs is not None:
                outputs.extend(updated.items())
    return dict(store)


@pytest.mark.parametrize("windows", [tumbling(10_000), hopping(10_000, 2_500)],
                         ids=["tumbling", "hopping"])
def test_windowed_count_exact(broker, tmp_path, windows):
    b = TopologyBuilder()
    (b.stream("clicks").group_by_key().windowed_by(windows, grace_ms=3_000)
     .count(store="wcount", retention_ms=10**10)
     .to_stream().to("wout", key_serde=WindowedSerde("str"), value_serde="int64"))
    plan = b.compile()
    eng = make_engine(plan, broker, tmp_path, "win", partitions=3)
    ev = window_events(3)
    batches = [ev[i:i + 90] for i in range(0, len(ev), 90)]
    outs = []
    for batch in batches:
        outs.extend(eng.decode(eng.run_batch(batch)))
    want_outs = []
    ref = window_reference(batches, windows, 3_000, 3, want_outs)
    got = eng.store("wcount")
    assert got == ref
    assert any(len(windows.starts(ts)) > 1 for *_x, ts in ev) == (windows.kind == "hopping")
    check_partitioning(eng, "wcount")
    # caching store: one output per (key, window) per batch, with its count at the end of the batch
    assert [(kw, v) for _t, kw, v in outs] == want_outs
    last = {}
    for _t, (k, start), v in outs:
        last[(k, start)] = v
    assert last == ref
    # some records really were late and dropped
    total = sum(len(windows.starts(ts)) for *_x, ts in ev)
    assert sum(ref.values()) < total


# -- stream-table join ---------------------------------------------------------------------------------

def test_stream_table_join_exact(broker, tmp_path):
    b = TopologyBuilder()
    users = b.table("users", store="users")
    (b.stream("clicks").map(lambda k, v: (v.split(":")[0], v.split(":")[1]))   # re-key
     .join(users, lambda click, user: f"{click}|{user}", how="left").to("enriched"))
    plan = b.compile("join")
    # the re-keyed clicks reach the join through a repartition topic, in the users' sub-topology
    [topic] = plan.repartition_topics
    assert topic.startswith("join-") and topic.endswith("-repartition")
    assert [sp.source_topics for sp in plan.subtopologies] == [["clicks"], ["users", topic]]
    chain = C.Chain(plan, "join", broker, tmp_path, 4)
    eng = chain.engine_of("users")
    rnd = random.Random(21)
    names = [f"u{i}" for i in range(12)]
    records = []
    for i in range(600):
        ts = i * 10
        if rnd.random() < 0.3:
            u = rnd.choice(names)
            records.append(("users", u, None if rnd.random() < 0.1 else f"name-{u}-{i}", ts))
        else:
            records.append(("clicks", None, f"{rnd.choice(names)}:page{rnd.randrange(9)}", ts))
    table = {}
    ref_out = defaultdict(list)
    for topic, k, v, _ts in records:
        if topic == "users":
            if v is None:
                table.pop(k, None)
            else:
                table[k] = v
        else:
            u, page = v.split(":")
            ref_out[u].append(f"{page}|{table.get(u)}")
    # the clicks (no key: source partition 0) keep their order through the repartition topic and
    # their event time as its records' timestamps, so each task of the join merges them with its
    # users partition in timestamp order: the reference takes the records in input order
    got_out = defaultdict(list)
    for i in range(0, len(records), 150):
        for topic, k, v in chain.run_batch(records[i:i + 150]):
            assert topic == "enriched"
            got_out[k].append(v)
    assert eng.store("users") == table
    assert dict(got_out) == dict(ref_out)
    check_partitioning(eng, "users")


# -- processor API -------------------------------------------------------------------------------------

class Dedupe(Processor):
    """Forwards the first occurrence of each (key, value); counts duplicates per key."""

    def init(self, context):
        self.context = context
        self.seen = context.get_store("seen")
        self.dups = context.get_store("dups")

    def process(self, key, value):
        if self.seen.get(f"{key}/{value}") is None:
            self.seen.put(f"{key}/{value}", self.context.timestamp)
            self.context.forward(key, value)
        else:
            self.dups.put(key, (self.dups.get(key) or 0) + 1)


def test_processor_api_exact(broker, tmp_path):
    b = TopologyBuilder()
    (b.stream("events").process(Dedupe, stores=[kv_store("seen", "str", "int64"), kv_store("dups")])
     .to("unique"))
    plan = b.compile()
    eng = make_engine(plan, broker, tmp_path, "dedupe", partitions=3)
    rnd = random.Random(99)
    records = [("events", f"k{rnd.randrange(8)}", f"v{rnd.randrange(5)}", i) for i in range(300)]
    seen, dups, fwd = {}, Counter(), []
    for _t, k, v, ts in records:
        if f"{k}/{v}" not in seen:
            seen[f"{k}/{v}"] = ts
            fwd.append((k, v))
        else:
            dups[k] += 1
    out = []
    for i in range(0, 300, 70):
        out.extend(eng.decode(eng.run_batch(records[i:i + 70])))
    assert eng.store("seen") == seen
    assert eng.store("dups") == dict(dups)
    assert sorted((k, v) for _t, k, v in out) == sorted(fwd)
    check_partitioning(eng, "dups")


# -- reduce / aggregate ----------------------------------------------------------------------------------

def test_reduce_and_aggregate_exact(broker, tmp_path):
    b = TopologyBuilder()
    g = b.stream("readings", value_serde="json").group_by(lambda k, v: v["sensor"])
    g.reduce(lambda a, v: {"sensor": v["sensor"], "temp": a["temp"] + v["temp"]}, store="sum")
    g.aggregate(lambda: {"n": 0, "min": None, "max": None},
                lambda k, v, a: {"n": a["n"] + 1,
                                 "min": v["temp"] if a["min"] is None else min(a["min"], v["temp"]),
                                 "max": v["temp"] if a["max"] is None else max(a["max"], v["temp"])},
                store="stats").to_stream().to("stats-out", value_serde="json")
    plan = b.compile("agg")
    assert plan.subtopologies[0].store_names == [] and len(plan.subtopologies) == 2
    chain = C.Chain(plan, "agg", broker, tmp_path, 2)
    rnd = random.Random(5)
    # readings without a key, over both source partitions (sums, counts, min and max do not
    # depend on the order the re-keyed readings arrive in)
    records = [("readings", None, {"sensor": f"s{rnd.randrange(5)}", "temp": rnd.randint(-20, 40)},
                i, i % 2) for i in range(250)]
    sums, stats = {}, {}
    for _t, _k, v, _ts, _p in records:
        s = v["sensor"]
        sums[s] = {"sensor": s, "temp": sums.get(s, {"temp": 0})["temp"] + v["temp"]}
        a = stats.get(s, {"n": 0, "min": None, "max": None})
        stats[s] = {"n": a["n"] + 1, "min": v["temp"] if a["min"] is None else min(a["min"], v["temp"]),
                    "max": v["temp"] if a["max"] is None else max(a["max"], v["temp"])}
    for i in range(0, len(records), 60):
        chain.run_batch(records[i:i + 60])
    assert chain.store("sum") == sums
    assert chain.store("stats") == stats
    check_partitioning(chain.engine_of("stats"), "stats", key_bytes=lambda k: k.encode())
    check_partitioning(chain.engine_of("sum"), "sum", key_bytes=lambda k: k.encode())


# -- errors ----------------------------------------------------------------------------------------------

def test_processor_error_one_line_and_nothing_committed(broker, tmp_path):
    b = TopologyBuilder()
    (b.stream("nums").group_by_key()
     .reduce(lambda a, v: str(int(a) + 100 // int(v)), store="acc"))
    plan = b.compile()
    eng = make_engine(plan, broker, tmp_path, "err", partitions=2)
    eng.run_batch([("nums", "a", "1", 1), ("nums", "a", "2", 2), ("nums", "b", "5", 3)])
    before = eng.store("acc")
    assert before == {"a": str(1 + 50), "b": "5"}
    with pytest.raises(ProcessorError) as ei:
        eng.run_batch([("nums", "a", "4", 4), ("nums", "a", "0", 5)])
    msg = str(ei.value)
    assert "\n" not in msg
    for part in ("reduce", "key='a'", "value='0'", "nums partition 0 offset 4", "ZeroDivisionError"):
        assert part in msg, (part, msg)
    assert eng.store("acc") == before          # the failed batch left nothing behind
    eng.run_batch([("nums", "a", "4", 6)])      # and the task still works
    assert eng.store("acc") == {"a": str(51 + 25), "b": "5"}


# -- crashes (a real SIGKILL of a worker process) ------------------------------------------------------------

@pytest.mark.parametrize("point", ["records", "mid_restore", "after_ack",
                                   pytest.param("before_send", marks=pytest.mark.slow),
                                   pytest.param("after_rocksdb", marks=pytest.mark.slow)])
def test_crash_directive_then_replay_is_exactly_once(broker, tmp_path, point):
    from statekit.worker import crash as crash_mod

    w = _load_worker()
    state, control = str(tmp_path / "state"), str(tmp_path / "control")
    env = dict(os.environ)

    def run(first, last):
        return subprocess.run([sys.executable, os.path.join(HERE, "crash_worker.py"), broker.bootstrap,
                               state, control, "3", str(first), str(last)],
                              capture_output=True, text=True, timeout=120, env=env)

    r = run(0, 1)
    assert r.returncode == 0, r.stderr[-2000:]
    if point == "mid_restore":
        shutil.rmtree(state)
    d = crash_mod.write_directive(control, instance=0, point=point, after_records=5)
    r = run(2, 2)
    assert r.returncode == -9, (r.returncode, r.stdout, r.stderr[-2000:])
    claim = crash_mod.claimed(control, d["id"])
    assert claim and claim.get("pid") and claim.get("point") == point
    if point == "records":           # inside a task's batch (each has about 35 words): cut at 5
        assert claim.get("records") == 5 and claim.get("batch") == 2
    r = run(2, 3)                                # Spark replays batch 2, then goes on
    assert r.returncode == 0, r.stderr[-2000:]
    ref = Counter(wd for b in w.batches(3)[:4] for _t, wd, _v, _ts in b)
    eng = w.engine(broker.bootstrap, state, None)
    assert eng.store("counts") == dict(ref)


def test_stateless_topology_keeps_source_partition_order(broker, tmp_path):
    b = TopologyBuilder()
    (b.stream("in").filter(lambda k, v: int(v) % 3 != 0).map_values(lambda v: str(int(v) * 2))
     .peek(lambda k, v: None).to("out"))
    plan = b.compile()
    assert plan.stores == [] and [r.keyed for r in plan.routes] == [False]
    eng = make_engine(plan, broker, tmp_path, "stateless", partitions=4)
    # timestamps against the offsets: a task keeps its partition's offset order, not time order
    records = [("in", None, str(i), 1000 - i, i % 4) for i in range(40)]
    raw = eng.run_batch(records)
    out = eng.decode(raw)
    # task = source partition: the tasks run in order, each its partition's records in offset order
    want = [("out", None, str(i * 2)) for p in range(4) for i in range(p, 40, 4) if i % 3]
    assert out == want
    assert raw and eng.replay() == []            # applied: its outputs went out with its commit
