"""The crash invariant for issue 12's operators on the real runtime: one application with a
stream-stream left join (orders with their payments), a session-windowed count emitted once per
session with suppress(until_window_closes()), and a table re-aggregation (users per region) behind
a repartition topic — run through harness.py's random membership schedules (kills, crash
directives of both modes at every point including mid_restore and before_commit, revives with and
without disk, joins, leaves; several instances). Its stores (read with `app.query_all`) and its
output (the memory sink, or the Kafka sink read read_committed: exactly-once is the default) equal
plain-Python references (tests/topology/topo_models.py's models, checked against declarative ones).

Why the references do not depend on how the input was cut into micro-batches or when a crash hit:
the topics have one partition per task and every record goes to its key's partition (Kafka's
default partitioner), in event-time order except that a record is at most LATE ms older than any
record before it, with LATE within the grace periods and within the join's after-window. A task
reads its partition in offset order, so its stream time at a record is at most LATE ahead of it:
nothing is dropped as late, nothing joins or closes early, and a window that closed can no longer
change. The users table is keyed, so each user's updates keep their order; regrouping is
commutative.
"""
from __future__ import annotations

import collections
import importlib.util
import os
import random

import pytest

from harness import run_membership_schedule, seeded_app

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "topo_models", os.path.join(HERE, "..", "topology", "topo_models.py"))
M = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)

# the join: a payment meets its order when it is at most BEFORE ms earlier or AFTER ms later
BEFORE, AFTER, JGRACE = 40, 60, 40
# sessions: clicks less than GAP ms apart
GAP, SGRACE = 30, 20
LATE_SHOP, LATE_CLICKS = 30, 15          # <= AFTER, < JGRACE; < SGRACE
REGIONS = "nesw"

FAST_SEEDS = list(range(5))          # `make test`; the rest with `make test-slow`
SLOW_SEEDS = list(range(5, 40))


def utf8(k):
    return k.encode("utf-8")


def paid(order, payment):
    return [order["order"], order["amount"], None if payment is None else payment["amount"]]


def build(app):
    """The topology (joiner as a lambda: the instances unpickle the plan by value)."""
    from statekit.topology import JoinWindows, SessionWindowedSerde, SessionWindows, until_window_closes

    shop = app.stream("shop", value_serde="json")
    orders = shop.filter(lambda k, v: v["type"] == "order")
    payments = shop.filter(lambda k, v: v["type"] == "payment")
    (orders.left_join(payments, lambda o, p: [o["order"], o["amount"], None if p is None else p["amount"]],
                      JoinWindows(BEFORE, AFTER, JGRACE), store="pay", value_serde="json")
     .to("paid", value_serde="json"))
    (app.stream("clicks", value_serde="json").group_by_key()
     .windowed_by(SessionWindows(GAP, SGRACE)).count(store="visits", retention_ms=10 ** 9)
     .suppress(until_window_closes(), store="visits-final").to_stream()
     .to("visits-out", key_serde=SessionWindowedSerde("str"), value_serde="int64"))
    (app.table("users", store="users", value_serde="json")
     .group_by(lambda k, v: v["region"]).count(store="per-region")
     .to_stream().to("region-counts", value_serde="int64"))


def make_app(name, broker, state_dir, seed, engine="local", **over):
    app = seeded_app(name, broker, state_dir, seed, engine, **over)
    build(app)
    return app


# -- the input ------------------------------------------------------------------------------------------

def make_input(seed: int, start_ms: int) -> dict:
    from statekit.datagen import Record, session_clicks, shop_events

    rng = random.Random(seed * 31 + 7)
    shop = shop_events(seed, orders=30, start_ms=start_ms, spacing_ms=20, pay_after_ms=AFTER,
                       pay_before_ms=BEFORE, unpaid=0.15, late_pay=0.15, split=0.15,
                       late_ms=LATE_SHOP)
    clicks = session_clicks(seed, users=6, sessions=(2, 4), clicks=(1, 5), start_ms=start_ms,
                            gap_ms=GAP, late_ms=LATE_CLICKS)
    users = []
    for i in range(28):
        v = None if rng.random() < 0.2 else {"region": rng.choice(REGIONS), "v": i}
        users.append(Record(f"user{rng.randint(0, 9)}", v, start_ms + i))
    return {"shop": shop, "clicks": clicks, "users": users}


def chunks(records: list, n: int) -> list:
    """n contiguous parts."""
    size = -(-len(records) // n)
    return [records[i * size:(i + 1) * size] for i in range(n)]


# -- the references -------------------------------------------------------------------------------------

class Reference:
    """What the application must hold and have written, from the input and the task count."""

    def __init__(self, data: dict, partitions: int) -> None:
        from statekit.topology import SessionWindowedSerde

        def task(k):
            return M.partition_for(utf8(k), partitions)

        # the join: the model per task, in arrival order, against the declarative answer
        joins = collections.defaultdict(
            lambda: M.StreamJoinModel(BEFORE, AFTER, JGRACE, "left", paid, utf8))
        self.paid = collections.Counter()
        for r in data["shop"]:
            side = "left" if r.value["type"] == "order" else "right"
            for k, v, _ts in joins[task(r.key)].step(side, r.key, r.value, r.timestamp):
                self.paid[(k, tuple(v))] += 1
        st = collections.defaultdict(lambda: -1)
        for r in data["shop"]:
            st[task(r.key)] = max(st[task(r.key)], r.timestamp)
        orders = [r for r in data["shop"] if r.value["type"] == "order"]
        pays = [r for r in data["shop"] if r.value["type"] == "payment"]
        declared = collections.Counter()
        waiting = {}
        for o in orders:
            mine = [p for p in pays if p.key == o.key and
                    o.timestamp - BEFORE <= p.timestamp <= o.timestamp + AFTER]
            for p in mine:
                declared[(o.key, tuple(paid(o.value, p.value)))] += 1
            if not mine:
                if o.timestamp + AFTER + JGRACE < st[task(o.key)]:
                    declared[(o.key, tuple(paid(o.value, None)))] += 1
                else:
                    waiting[(o.timestamp, True, o.key)] = (True, [o.value])
        assert self.paid == declared       # the input keeps to its promise (see the docstring)
        self.waiting = waiting
        self.buffers = {"pay-left": {}, "pay-right": {}}
        for r in data["shop"]:
            side = "pay-left" if r.value["type"] == "order" else "pay-right"
            self.buffers[side].setdefault((r.key, r.timestamp), []).append(r.value)
        # sessions and their final results
        sessions = collections.defaultdict(lambda: M.SessionModel(GAP, SGRACE, retention=10 ** 9))
        supps = collections.defaultdict(lambda: M.SuppressModel(
            lambda wk, ts: wk[2], GAP + SGRACE, True, SessionWindowedSerde("str").to_bytes))
        self.finals = collections.Counter()
        for r in data["clicks"]:
            t = task(r.key)
            for wk, new, _old, ts in sessions[t].step(r.key, r.value, r.timestamp):
                for k, v, _t in supps[t].step(wk, new, ts):
                    self.finals[(tuple(k), v)] += 1
        self.sessions = {}
        for m in sessions.values():
            assert m.dropped == 0
            self.sessions.update(m.sessions())
        by_user = collections.defaultdict(list)
        for r in data["clicks"]:
            by_user[r.key].append(r.timestamp)
        assert self.sessions == M.sessions_by_gap(by_user, GAP)
        self.open_sessions = {wk: n for wk, n in self.sessions.items()
                              if (wk, n) not in self.finals}
        assert sum(self.finals.values()) + len(self.open_sessions) == len(self.sessions)
        # users per region
        self.updates, self.regions, self.rows = M.regroup_model(
            [(r.key, r.value) for r in data["users"]], lambda k, v: v["region"])
        self.seen_regions = {v["region"] for r in data["users"] if r.value for v in [r.value]}


# -- reading what the application holds and wrote -------------------------------------------------------

def window_rows(app, store) -> dict:
    df = app.query_all(store)
    return {(k, int(ws)): v for k, ws, v in zip(df["key"], df["window_start"], df["value"])}


def check_state(app, ref: Reference) -> None:
    import pandas as pd

    # the join's buffers: every record still inside the retention is there, nothing else is wrong
    retention = BEFORE + AFTER + JGRACE
    for store, want in ref.buffers.items():
        got = window_rows(app, store)
        newest = max(ts for _k, ts in want)
        assert all(want.get(kt) == v for kt, v in got.items()), store
        live = {kt: v for kt, v in want.items() if kt[1] > newest - retention}
        assert {kt: got.get(kt) for kt in live} == live, store
    outer = app.query_all("pay-outer")
    assert dict(zip(outer["key"], outer["value"])) == ref.waiting
    # the sessions, and the ones still held back by the suppression
    df = app.query_all("visits")
    assert {(k, int(s), int(e)): int(v) for k, s, e, v in
            zip(df["key"], df["start"], df["end"], df["value"])} == ref.sessions
    buf = app.query_all("visits-final")
    held = {tuple(k): None if pd.isna(v) else int(v) for k, v in zip(buf["key"], buf["value"])}
    assert {k: v for k, v in held.items() if v is not None} == ref.open_sessions
    assert not {k for k, v in held.items() if v is None} & set(ref.sessions)   # merged-away ones
    # the table and its re-aggregation
    users = app.query_all("users")
    assert dict(zip(users["key"], users["value"])) == ref.rows
    per = app.query_all("per-region")
    got = {k: int(v) for k, v in zip(per["key"], per["value"])}
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in ref.regions.items() if v}
    assert {k for k, v in got.items() if not v} <= ref.seen_regions


def check_output(rows, ref: Reference) -> None:
    """rows: (topic, key, value) in the order each task wrote them."""
    by = collections.defaultdict(list)
    for topic, k, v in rows:
        by[topic].append((k, v))
    assert collections.Counter((k, tuple(v)) for k, v in by["paid"]) == ref.paid
    assert collections.Counter((tuple(k), v) for k, v in by["visits-out"]) == ref.finals
    last = {}
    for k, v in by["region-counts"]:
        last[k] = v
    assert {k: v for k, v in last.items() if v} == {k: v for k, v in ref.regions.items() if v}
    assert all(ref.regions.get(k, 0) == 0 for k, v in last.items() if not v)


def memory_rows(app) -> list:
    df = app.output()
    assert not df.empty
    # a region's counts all come from one task, in its batch order
    df = df.sort_values(["task", "batch"], kind="stable")
    return list(zip(df["topic"], df["key"], df["value"]))


def kafka_rows(app, kafka) -> list:
    rows = []
    for topic in ("paid", "visits-out", "region-counts"):
        ks, vs = next(p.sink_serdes(topic) for p in app.subplans.values()
                      if any(s.topic == topic for s in p.sinks))
        for p, end in sorted(kafka.end_offsets(topic, None, "read_committed").items()):
            for chunk in kafka.read(topic, p, None, end, isolation="read_committed"):
                for _off, _ts, kb, vb, _h in chunk.records:
                    rows.append((topic, ks.from_bytes(kb), None if vb is None else vs.from_bytes(vb)))
    return rows


# -- the runs -------------------------------------------------------------------------------------------

def run(seed, broker, tmp_path, engine="local", steps=5, sink=None) -> dict:
    from statekit.datagen import now_ms, produce_timed
    from statekit.kafka import Kafka

    sink = sink or ("kafka" if seed % 3 == 2 else "memory")
    kafka = Kafka(broker.bootstrap)
    app = make_app(f"topo{seed}", broker, str(tmp_path / "state"), seed, engine=engine)
    data = make_input(seed, now_ms())
    parts = {t: chunks(recs, steps) for t, recs in data.items()}
    try:
        for t in ("shop", "clicks", "users"):      # a task reads its own partition of each
            kafka.ensure_topic(t, app.partitions)
        app.start(max_records_per_trigger=[None, 15, 40][seed % 3], sink=sink)

        def produce(i):
            for topic, cs in parts.items():
                produce_timed(topic, cs[i], kafka=kafka)

        # with the Kafka sink the first crash lands between a batch's writes and its transaction's
        # commit: its outputs are aborted, a read_committed reader sees them once, from the replay
        first = {"point": "before_commit", "after_records": None} if sink == "kafka" else None
        summary = run_membership_schedule(app, kafka, seed, steps=steps, produce=produce,
                                          first_crash=first)
        assert app.state.is_running(), (app.state, app.error)
        ref = Reference(data, app.partitions)
        check_state(app, ref)
        check_output(memory_rows(app) if sink == "memory" else kafka_rows(app, kafka), ref)
        assert ref.finals and ref.open_sessions is not None and ref.paid
        return summary
    finally:
        app.stop()
        kafka.close()


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_topology_crash_invariant_local(seed, broker, tmp_path):
    run(seed, broker, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_topology_crash_invariant_local_slow(seed, broker, tmp_path):
    run(seed, broker, tmp_path, steps=8)


@pytest.mark.spark
@pytest.mark.parametrize("seed,sink", [pytest.param(301, "memory", marks=pytest.mark.slow),
                                       (302, "kafka")])
def test_topology_crash_invariant_spark(seed, sink, broker, tmp_path, spark_session):
    run(seed, broker, tmp_path, engine="changelog", steps=4, sink=sink)
