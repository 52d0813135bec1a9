"""Helpers for the runtime tests: seeded input, plain-Python references, crash schedules."""
from __future__ import annotations

import collections
import random
import time

from waiting import wait_until

WINDOW_MS = 40
POINTS = ("records", "records", "before_send", "after_ack", "after_rocksdb")
VOCAB = ["the", "a", "of", "stream", "state", "kafka", "rocks", "spark", "task", "store", "log",
         "commit", "crash", "replay", "standby", "window", "änder", "日本"]
USERS = [f"user-{i}" for i in range(9)]


def zipf_words(rnd: random.Random, n: int) -> list:
    weights = [1.0 / (i + 1) for i in range(len(VOCAB))]
    return rnd.choices(VOCAB, weights=weights, k=n)


def make_chunks(seed: int, chunks: int, lines_per_chunk: int, clicks_per_chunk: int) -> list:
    """[(lines, clicks)]: lines are str, clicks are (user, page) pairs."""
    rnd = random.Random(seed)
    out = []
    for _ in range(chunks):
        lines = [" ".join(zipf_words(rnd, rnd.randint(1, 7))) for _ in range(lines_per_chunk)]
        clicks = [(rnd.choice(USERS), f"/p{rnd.randint(0, 5)}") for _ in range(clicks_per_chunk)]
        out.append((lines, clicks))
    return out


def produce_chunk(kafka, chunk, lines_topic="lines", clicks_topic="clicks", rnd=None, parts=None,
                  sends=3) -> None:
    """Send one chunk, split into a few sends (each send gets its own timestamp, so the windowed
    count sees several windows); `parts`: the topics' partitions (default: the lines topic's)."""
    from statekit.partition import partition_for

    lines, clicks = chunk
    rnd = rnd or random.Random(0)
    parts = parts or len(kafka.end_offsets(lines_topic))
    for s in range(sends):
        part_lines = lines[s::sends]
        by_p = collections.defaultdict(list)
        for ln in part_lines:
            by_p[rnd.randrange(parts)].append((None, ln.encode()))
        for p, recs in by_p.items():
            kafka.send(lines_topic, p, recs)
        part_clicks = clicks[s::sends]
        by_p = collections.defaultdict(list)
        for u, page in part_clicks:
            kb = u.encode()
            by_p[partition_for(kb, parts)].append((kb, page.encode()))
        for p, recs in by_p.items():
            kafka.send(clicks_topic, p, recs)
        time.sleep(WINDOW_MS / 1000.0 * 0.6)  # spacing: each send lands in a later time window


def read_topic(kafka, topic) -> list:
    """Every record of a topic: (partition, offset, timestamp, key, value)."""
    out = []
    for p, end in sorted(kafka.end_offsets(topic).items()):
        for chunk in kafka.read(topic, p, None, end):
            for off, ts, k, v, _h in chunk.records:
                out.append((p, off, ts, k, v))
    return out


def wordcount_reference(kafka, topic="lines") -> dict:
    c = collections.Counter()
    for _p, _o, _ts, _k, v in read_topic(kafka, topic):
        c.update(v.decode().split())
    return dict(c)


def windowed_reference(kafka, topic="clicks", size_ms=WINDOW_MS) -> dict:
    c = collections.Counter()
    for _p, _o, ts, k, _v in read_topic(kafka, topic):
        c[(k.decode(), ts - ts % size_ms)] += 1
    return dict(c)


def build_topology(app, size_ms=WINDOW_MS):
    from statekit.topology.graph import tumbling

    app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
    (app.stream("clicks").group_by_key().windowed_by(tumbling(size_ms), grace_ms=10 ** 9)
     .count(store="clicks-per-window"))


def store_as_dict(app, store) -> dict:
    df = app.query_all(store)
    if "window_start" in df.columns:
        return {(k, int(ws)): int(v) for k, ws, v in zip(df["key"], df["window_start"], df["value"])}
    return {k: int(v) for k, v in zip(df["key"], df["value"])}


_n = [0]


def unique(prefix: str) -> str:
    """An app or topic name no other test of the session uses (they share one broker)."""
    _n[0] += 1
    return f"{prefix}{_n[0]}-{int(time.time() * 1000) % 100000}"


def seeded_app(name, broker, state_dir, seed, engine="local", **over):
    """An App sized by the seed: partitions, instances, standbys, record cache and warmup knobs."""
    import statekit

    rnd = random.Random(seed)
    kw = dict(partitions=rnd.choice([2, 3, 4]), instances=rnd.choice([1, 2, 3, 3]),
              cache_bytes=rnd.choice([0, 2048, 10 << 20]), probing_rebalance_interval=0.3,
              acceptable_recovery_lag=rnd.choice([0, 40, 10_000]), max_warmup_replicas=rnd.choice([1, 2]))
    kw["standby_replicas"] = rnd.choice([0, 1]) if kw["instances"] > 1 else 0
    kw.update(over)
    return statekit.App(name, bootstrap=broker.bootstrap, state_dir=state_dir, engine=engine, **kw)


def build_app(name, broker, state_dir, seed, engine="local", clicks=True, **over):
    """A word count (with a sink) and a windowed click count, sized by the seed."""
    app = seeded_app(name, broker, state_dir, seed, engine, **over)
    (app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
     .to_stream().to("counts-out", value_serde="int64"))
    if clicks:
        (app.stream("clicks").group_by_key()
         .windowed_by(__import__("statekit").topology.tumbling(WINDOW_MS), grace_ms=10 ** 9)
         .count(store="clicks-per-window"))
    return app


def check_exact(app, kafka, sink="memory") -> None:
    """Stores equal the plain-Python references; the memory sink holds every batch's outputs once."""
    want_words = wordcount_reference(kafka)
    assert store_as_dict(app, "counts") == want_words
    assert store_as_dict(app, "clicks-per-window") == windowed_reference(kafka)
    if sink != "memory":
        return
    df = app.output()
    # (with the record cache off a key is forwarded at every update, each with its new count)
    assert not df.duplicated(["batch", "task", "key", "value"]).any(), "a batch's output written twice"
    last: dict = {}
    for key, value in zip(df.key, df.value):   # batch order
        assert value > last.get(key, 0), (key, value, last.get(key))   # counts only grow
        last[key] = value
    assert last == want_words


POINTS_ALL = ("records", "records", "before_send", "before_commit", "after_ack", "after_rocksdb",
              "mid_restore")


def random_crash(rnd: random.Random, live: list) -> dict:
    point = rnd.choice(POINTS_ALL)
    return {"mode": rnd.choice(["process", "disk-loss"]), "instance": rnd.choice(live),
            "point": point, "after_records": rnd.randint(0, 12) if point == "records" else None}


def sink_outputs(kafka, topic="counts-out", isolation="read_committed") -> dict:
    """{word: [counts in the order they were written]} of the word count's Kafka sink."""
    import struct

    out: dict = {}
    for p, end in sorted(kafka.end_offsets(topic, None, isolation).items()):
        for chunk in kafka.read(topic, p, None, end, isolation=isolation):
            for _off, _ts, k, v, _h in chunk.records:
                out.setdefault(k.decode(), []).append(struct.unpack(">q", v)[0])
    return out


def output_duplicates(outputs: dict) -> int:
    """Outputs written twice: a word's count that does not grow from one output to the next."""
    return sum(1 for vals in outputs.values() for a, b in zip(vals, vals[1:]) if b <= a)


def run_membership_schedule(app, kafka, seed: int, steps: int = 5, log=None,
                            first_crash: dict | None = None, produce=None) -> dict:
    """Feed seeded chunks while instances die (kills and crash directives of both modes at every
    point, restores included), come back (with or without their disk), join and leave. Ends with
    everything processed. Returns what happened. `produce(i)`: sends step i's input instead of the
    word-count chunks."""
    from statekit.runtime.coordinator import MembershipError
    from statekit.runtime.lifecycle import AppState

    rnd = random.Random(seed * 7919 + 1)
    data = make_chunks(seed, steps, lines_per_chunk=12, clicks_per_chunk=20)
    done: list = []
    say = log or (lambda *a: None)
    co = app._coordinator
    for i, chunk in enumerate(data):
        live = co.live()
        dead = [m for m, mem in co.members.items() if mem.status == "dead"]
        ops = ["crash", "crash"] if app.pending_crash is None else []
        if len(live) >= 2:
            ops += ["kill", "remove"]
        if dead:
            ops += ["revive", "revive"]
        if len(live) < 4:
            ops += ["add"]
        if app.state == AppState.ERROR or not ops or not live:
            ops = ["restart"]
        op = rnd.choice(ops)
        say(i, op, "live", live, "dead", dead, app.state)
        if op == "crash" or (i == 0 and first_crash):
            c = random_crash(rnd, live)
            if i == 0 and first_crash:
                c.update(first_crash)
                sub = first_crash.get("subtopology")
                busy = [x for x in live if any(sub is None or t.subtopology == sub
                                               for t in co.assignment.active_tasks(x))]
                c["instance"] = busy[rnd.randrange(len(busy))]
            app.crash(c["mode"], instance=c["instance"], after_records=c["after_records"],
                      point=c["point"], subtopology=c.get("subtopology"))
            done.append(("crash", c))
        elif op == "kill":
            i_ = rnd.choice(live)
            try:
                app.kill(i_)
                done.append(("kill", i_))
            except MembershipError as exc:   # an armed crash took the other live one meanwhile
                assert any(m in str(exc) for m in ("last live instance", "is already ")), exc
                done.append(("kill refused", i_))
        elif op == "revive":
            i_, disk = rnd.choice(dead), rnd.random() < 0.6
            app.revive(i_, disk=disk)
            done.append(("revive", i_, disk))
        elif op == "add":
            done.append(("add", app.add_instance()))
        elif op == "remove":
            i_ = rnd.choice(live)
            try:
                app.remove_instance(i_, timeout=20)
                done.append(("remove", i_))
            except MembershipError as exc:   # an armed crash killed it, or every other one, meanwhile
                assert any(m in str(exc) for m in ("did not leave", "last live instance",
                                                   "is already dead")), exc
                done.append(("remove refused", i_))
        elif op == "restart":
            cd = None
            if rnd.random() < 0.3:
                cd = {"mode": rnd.choice(["process", "disk-loss"]), "point": "mid_restore"}
            app.restart(crash_during=cd)
            done.append(("restart", cd))
        if produce is None:
            produce_chunk(kafka, chunk, rnd=rnd)
        else:
            produce(i)
        if i == 0 and first_crash:   # the first crash fires before anything else happens
            from statekit.worker import crash as crash_mod

            wait_until(lambda: crash_mod.claimed(app.layout.control_dir, app.crashes[0]["id"])
                       is not None, 60, "the first crash to fire")
        if rnd.random() < 0.5:
            app.process_all_available(timeout=60)
    # the end: a crash still armed is withdrawn, whatever is dead comes back, everything drains
    for _ in range(8):
        app.cancel_crash()
        if app.state == AppState.ERROR or not co.live():
            app.restart()
            done.append(("restart", None))
        if app.process_all_available(timeout=120):
            return {"ops": done}
    raise AssertionError(f"the app did not settle: {app.state} {app.error} {done}")
