"""Issue 12's operator families on Spark — `App(engine="changelog")`: Spark reads the topics and
shuffles each micro-batch to the instance's tasks — against the plain-Python models of
tests/topology/topo_models.py, over seeded random input with records out of order within and
beyond the grace periods, tombstones, and None keys and values. Two applications (each Spark query
costs seconds): one with the stream operators (stream-stream inner/left/outer joins, a session
count with suppress(until_window_closes()), a sliding count), one with the table operators
(table-table inner/left/outer joins, a time-limited suppression, a foreign-key join, a
re-aggregation behind a repartition topic) and a stream-time punctuator.

The input is produced in chunks, each processed before the next (`process_all_available`), in
micro-batches of a few records (`max_records_per_trigger`), so Spark cuts every chunk at places of
its own choosing. The data is laid out so that the answers do not depend on those cuts (see
`stream_input`): the models run over each chunk in the engine's order (topo_models.engine_order).
"""
from __future__ import annotations

import collections
import importlib.util
import os
import random

import pytest

pytestmark = pytest.mark.spark

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "topo_models", os.path.join(HERE, "..", "topology", "topo_models.py"))
M = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)

PARTS = 2
CHUNKS = 6


def utf8(k):
    return k.encode("utf-8")


def pair(a, b):
    return [a, b]


def produce_chunk(kafka, records):
    """records: (topic, key, value, timestamp), sent in this order per partition: a keyed record to
    Kafka's default partition, one without a key to partition 0 (where the models put it)."""
    import json

    from statekit.partition import partition_for
    from statekit.wire import Columns

    parts = collections.defaultdict(lambda: ([], [], []))
    for topic, k, v, ts in records:
        key = None if k is None else k.encode("utf-8")
        p = 0 if key is None else partition_for(key, PARTS)
        keys, values, stamps = parts[(topic, p)]
        keys.append(key)
        values.append(None if v is None else json.dumps(v, separators=(",", ":"), sort_keys=True).encode())
        stamps.append(int(ts))
    kafka.send_many([(t, p, Columns.of(k, v, timestamps=s)) for (t, p), (k, v, s) in sorted(parts.items())])


def start_app(name, broker, tmp_path, build, topics, engine="changelog"):
    import statekit

    from statekit.kafka import Kafka

    kafka = Kafka(broker.bootstrap)
    for t, n in topics.items():
        kafka.ensure_topic(t, n)
    app = statekit.App(name, bootstrap=broker.bootstrap, state_dir=str(tmp_path / name),
                       partitions=PARTS, instances=1, engine=engine)
    build(app)
    app.start(max_records_per_trigger=25)
    return app, kafka


def outputs(app) -> dict:
    """{topic: [(key, value)]} of the memory sink, each task's rows in its batch order."""
    df = app.output().sort_values(["task", "batch"], kind="stable")
    out = collections.defaultdict(list)
    for t, k, v in zip(df["topic"], df["key"], df["value"]):
        out[t].append((k, v))
    return out


def last_per_key(rows) -> dict:
    last = {}
    for k, v in rows:
        last[k] = v
    return last


# -- the stream operators ------------------------------------------------------------------------------------

BEFORE, AFTER, JGRACE = 80, 100, 90         # the joins: JoinWindows(before, after, grace)
GAP, SGRACE = 15, 90                        # sessions
DIFF, LGRACE = 15, 90                       # sliding windows
SPAN, LATE, BEYOND = 40, 30, 1000           # a chunk's event time; late within / beyond grace


def stream_input(seed, t0):
    """CHUNKS chunks of (topic, key, value, ts) for L, R (the joins) and clicks (sessions, sliding).

    Chunk c holds records at [t0 + c*SPAN, t0 + (c+1)*SPAN) in random order, some LATE ms before
    it (late, within every grace: a task's stream time is at most SPAN + LATE = 70 ahead of any of
    its records, less than every grace, and not more than the joins' before/after), and from chunk
    1 on some BEYOND ms before the first record of all, with keys whose task had records of the same
    input in the chunk before: those are dropped (or, in a left/outer join, emitted at once as
    unmatched) however the chunk is cut into batches."""
    rng = random.Random(seed)
    chunks = []
    for c in range(CHUNKS):
        lo = t0 + c * SPAN
        recs = []
        for _ in range(36):
            topic = rng.choice(["L", "R", "clicks", "clicks"])
            keys = "abcde" if topic != "clicks" else "uvwxyz"
            k = None if rng.random() < 0.06 else rng.choice(keys)
            v = None if rng.random() < 0.06 else rng.randint(0, 99)
            ts = lo + rng.randrange(SPAN)
            if c and rng.random() < 0.2:
                ts = lo - 1 - rng.randrange(LATE)
            recs.append((topic, k, v, ts))
        if c:
            prev = [r for r in chunks[-1] if r[1] is not None and r[2] is not None
                    and r[3] >= t0 + (c - 1) * SPAN]
            for _ in range(3):
                topic, k, _v, _ts = rng.choice(prev)
                recs.append((topic, k, rng.randint(100, 199), t0 - BEYOND - rng.randrange(50)))
        rng.shuffle(recs)
        chunks.append(recs)
    return chunks


def build_streams(app):
    from statekit.topology import (JoinWindows, SessionWindowedSerde, SessionWindows,
                                   SlidingWindows, WindowedSerde, until_window_closes)

    left = app.stream("L", value_serde="json")
    right = app.stream("R", value_serde="json")
    w = JoinWindows(BEFORE, AFTER, JGRACE)
    for how in ("inner", "left", "outer"):
        left.join(right, lambda a, b: [a, b], w, how=how, store=f"j-{how}",
                  value_serde="json").to(f"{how}-out", value_serde="json")
    clicks = app.stream("clicks", value_serde="json").group_by_key()
    (clicks.windowed_by(SessionWindows(GAP, SGRACE)).count(store="s", retention_ms=10 ** 9)
     .suppress(until_window_closes(), store="s-final").to_stream()
     .to("s-final-out", key_serde=SessionWindowedSerde("str"), value_serde="int64"))
    (clicks.windowed_by(SlidingWindows(DIFF, LGRACE)).count(store="sl").to_stream()
     .to("sl-out", key_serde=WindowedSerde("str"), value_serde="int64"))


def stream_reference(chunks, source_index):
    from statekit.topology import SessionWindowedSerde

    joins = {how: collections.defaultdict(
        lambda how=how: M.StreamJoinModel(BEFORE, AFTER, JGRACE, how, pair, utf8))
        for how in ("inner", "left", "outer")}
    sessions = collections.defaultdict(lambda: M.SessionModel(GAP, SGRACE, retention=10 ** 9))
    supps = collections.defaultdict(lambda: M.SuppressModel(
        lambda wk, ts: wk[2], GAP + SGRACE, True, SessionWindowedSerde("str").to_bytes))
    want = {"joined": {how: collections.Counter() for how in joins},
            "finals": collections.Counter(), "clicks": collections.defaultdict(list)}
    offsets = {}
    for chunk in chunks:
        # the joins keep None keys (a None-keyed record goes to the task of its source partition, 0)
        for task, recs in M.engine_order([r for r in chunk if r[0] != "clicks"], PARTS,
                                         source_index, utf8, offsets, null_task=0).items():
            for topic, k, v, ts in recs:
                for how, models in joins.items():
                    for kk, vv, _t in models[task].step("left" if topic == "L" else "right", k, v, ts):
                        want["joined"][how][(kk, tuple(vv))] += 1
        clicks = [r for r in chunk if r[0] == "clicks" and r[1] is not None]
        for task, recs in M.engine_order(clicks, PARTS, source_index, utf8, offsets).items():
            for _t, k, v, ts in recs:
                for wk, new, _old, t in sessions[task].step(k, v, ts):
                    want["finals"].update((k2, v2) for k2, v2, _ in supps[task].step(wk, new, t))
                want["clicks"][task].append((k, v, ts))
    want["sessions"] = {}
    for m in sessions.values():
        want["sessions"].update(m.sessions())
    want["late_sessions"] = sum(m.dropped for m in sessions.values())
    want["sliding"] = {}
    want["late_sliding"] = 0
    for recs in want["clicks"].values():
        w, dropped = M.sliding_model(recs, DIFF, LGRACE)
        want["sliding"].update(w)
        want["late_sliding"] += dropped
    return want


def test_stream_operators_on_spark_match_the_models(broker, tmp_path, spark_session):
    from statekit.datagen import now_ms

    app, kafka = start_app("sparkstreams", broker, tmp_path, build_streams,
                           {"L": PARTS, "R": PARTS, "clicks": PARTS})
    try:
        chunks = stream_input(7, now_ms())
        for chunk in chunks:
            produce_chunk(kafka, chunk)
            assert app.process_all_available(timeout=120)
        want = stream_reference(chunks, app.plan.source_index)
        got = outputs(app)
        # the input has what it promises
        assert want["late_sessions"] >= 3 and want["late_sliding"] >= 3
        unmatched_null_key = [(k, v) for k, v in want["joined"]["left"] if k is None]
        assert unmatched_null_key and want["finals"]
        for how in ("inner", "left", "outer"):
            assert collections.Counter((k, tuple(v)) for k, v in got[f"{how}-out"]) == \
                want["joined"][how], how
        # sessions: every one in the store, each closed one emitted once with its final count
        df = app.query_all("s")
        assert {(k, int(s), int(e)): int(v) for k, s, e, v in
                zip(df["key"], df["start"], df["end"], df["value"])} == want["sessions"]
        assert collections.Counter((tuple(k), v) for k, v in got["s-final-out"]) == want["finals"]
        # sliding windows: what the store holds is right, and every window's last output is its count
        df = app.query_all("sl")
        stored = {(k, int(ws)): v for k, ws, v in zip(df["key"], df["window_start"], df["value"])}
        assert stored and all(want["sliding"][kw] == (c, m) for kw, (m, c) in stored.items())
        last = last_per_key((tuple(k), v) for k, v in got["sl-out"])
        assert last == {kw: c for kw, (c, _m) in want["sliding"].items()}
    finally:
        app.stop()
        kafka.close()


# -- the table operators, and punctuation ----------------------------------------------------------------------

TICK, TLIMIT = 100, 150          # a chunk's event time = the punctuator's interval; the time limit


def beats_processor():
    """A processor class (made here: the instances unpickle it by value) that counts records per
    key and, every TICK ms of stream time, forwards (its task's partition, ts // TICK)."""
    from statekit.topology import Processor, PunctuationType

    class Beats(Processor):
        def init(self, context):
            self.context = context
            self.seen = context.get_store("beats-seen")
            context.schedule(TICK, PunctuationType.STREAM_TIME, self.tick)

        def process(self, key, value):
            if key is not None:
                self.seen.put(key, (self.seen.get(key) or 0) + 1)

        def tick(self, ts):
            self.context.forward(str(self.context.task_id), ts // TICK)

    return Beats


def table_input(seed, t0):
    """Chunk c: records at t0 + c*TICK + i (i-th record of the chunk: a key's updates keep their
    order whatever the batches), None keys (skipped by tables), None values (tombstones)."""
    rng = random.Random(seed)
    chunks = []
    for c in range(CHUNKS):
        recs = []
        for i in range(40):
            topic = rng.choice(["lt", "rt", "orders", "customers", "users", "beats"])
            ts = t0 + c * TICK + i
            if topic in ("lt", "rt"):
                k, v = rng.choice("abcdef"), rng.randint(0, 9)
            elif topic == "orders":
                k, v = f"o{rng.randint(0, 7)}", {"c": rng.choice(["c1", "c2", "c3", None]), "n": i}
            elif topic == "customers":
                k, v = rng.choice(["c1", "c2", "c3"]), f"name{c}.{i}"
            elif topic == "users":
                k, v = f"u{rng.randint(0, 9)}", {"region": rng.choice("nesw")}
            else:
                k, v = f"b{rng.randint(0, 5)}", "beat"
            if rng.random() < 0.2 and topic != "beats":
                v = None
            if rng.random() < 0.05:
                k = None
            recs.append((topic, k, v, ts))
        chunks.append(recs)
    return chunks


def build_tables(app):
    from statekit.topology import kv_store, until_time_limit

    lt = app.table("lt", store="lt", value_serde="json")
    rt = app.table("rt", store="rt", value_serde="json")
    for how in ("inner", "left", "outer"):
        joined = lt.join(rt, lambda a, b: [a, b], how=how, value_serde="json")
        joined.to_stream().to(f"tj-{how}", value_serde="json")
        if how == "outer":
            joined.suppress(until_time_limit(TLIMIT), store="held").to_stream().to(
                "settled", value_serde="json")
    orders = app.table("orders", store="orders", value_serde="json")
    customers = app.table("customers", store="customers", value_serde="json")
    orders.left_join(customers, lambda o: o["c"], lambda o, c: f"{o['n']}/{c}", store="oc",
                     value_serde="str")
    (app.table("users", store="users", value_serde="json").group_by(lambda k, v: v["region"])
     .count(store="per-region"))
    app.stream("beats").process(beats_processor(), stores=[kv_store("beats-seen")]).to("ticks", value_serde="int64")


def test_table_operators_and_punctuation_on_spark_match_the_models(broker, tmp_path, spark_session):
    from statekit.datagen import now_ms

    t0 = now_ms()
    app, kafka = start_app("sparktables", broker, tmp_path, build_tables,
                           {"lt": 2, "rt": 2, "orders": 2, "customers": 2, "users": 2, "beats": 2})
    try:
        assert len(app.subplans) >= 2 and app.plan.repartition_topics
        chunks = table_input(11, t0)
        for chunk in chunks:
            produce_chunk(kafka, chunk)
            assert app.process_all_available(timeout=120)
        got = outputs(app)
        tables = collections.defaultdict(dict)
        for chunk in chunks:
            for topic, k, v, _ts in chunk:
                if k is None:
                    continue
                if v is None:
                    tables[topic].pop(k, None)
                else:
                    tables[topic][k] = v
        # table-table joins: every key's last result is the join of the final tables
        for how in ("inner", "left", "outer"):
            model = M.TableJoinModel(how, pair)
            for chunk in chunks:
                for topic, k, v, _ts in chunk:
                    if topic in ("lt", "rt"):
                        model.step("left" if topic == "lt" else "right", k, v)
            final = model.final()
            last = last_per_key(got[f"tj-{how}"])
            assert {k: v for k, v in last.items() if v is not None} == final, how
        # the time-limited suppression: a key's latest value is held or went out last
        held = app.query_all("held")
        pending = {k: v for k, v in zip(held["key"], held["value"])}
        settled = last_per_key(got["settled"])
        final = M.TableJoinModel("outer", pair)
        for chunk in chunks:
            for topic, k, v, _ts in chunk:
                if topic in ("lt", "rt"):
                    final.step("left" if topic == "lt" else "right", k, v)
        final = final.final()
        assert settled and pending
        for k in set(final) | set(pending) | set(settled):
            latest = pending[k] if k in pending else settled.get(k)
            latest = None if latest is None or latest != latest else latest
            assert latest == final.get(k), k
        # the foreign-key join, the re-aggregation and the processor's store
        oc = app.query_all("oc")
        cust = tables["customers"]
        assert dict(zip(oc["key"], oc["value"])) == {
            k: f"{o['n']}/{cust.get(o['c']) if o['c'] is not None else None}"
            for k, o in tables["orders"].items()}
        _u, regions, rows = M.regroup_model(
            [(k, v) for chunk in chunks for topic, k, v, _ts in chunk if topic == "users" and k],
            lambda k, v: v["region"])
        per = app.query_all("per-region")
        assert {k: int(v) for k, v in zip(per["key"], per["value"]) if int(v)} == \
            {k: n for k, n in regions.items() if n}
        beats = collections.Counter(k for chunk in chunks for t, k, _v, _ts in chunk
                                    if t == "beats" and k is not None)
        seen = app.query_all("beats-seen")
        assert dict(zip(seen["key"], seen["value"])) == dict(beats)
        # punctuation: each task fires once per interval its stream time reaches, never twice
        ticks = collections.defaultdict(list)
        for task, v in got["ticks"]:
            ticks[task].append(v)
        intervals = {(t0 + c * TICK) // TICK for c in range(CHUNKS)}
        for c, chunk in enumerate(chunks):
            for t, k, _v, _ts in chunk:
                if t == "beats" and k is not None:     # (context.task_id: the task's partition)
                    task = str(M.partition_for(utf8(k), PARTS))
                    assert (t0 + c * TICK) // TICK in ticks[task], (task, c)
        for task, vs in ticks.items():
            assert vs == sorted(set(vs)) and set(vs) <= intervals, (task, vs)
    finally:
        app.stop()
        kafka.close()
