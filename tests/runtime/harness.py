"""Helpers for the runtime tests: seeded input, plain-Python references, crash schedules."""
from __future__ import annotations

import collections
import random
import time

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


def produce_chunk(kafka, chunk, lines_topic="lines", clicks_topic="clicks", rnd=None, parts=3,
                  sends=3) -> None:
    """Send one chunk, split into a few sends (each send gets its own timestamp, so the windowed
    count sees several windows)."""
    from statekit.partition import partition_for

    lines, clicks = chunk
    rnd = rnd or random.Random(0)
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
        time.sleep(WINDOW_MS / 1000.0 * 0.6)


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


def random_crash(rnd: random.Random, instances: int) -> dict:
    point = rnd.choice(POINTS)
    return {"mode": rnd.choice(["process", "disk-loss"]), "instance": rnd.randrange(instances),
            "point": point, "after_records": rnd.randint(0, 12) if point == "records" else None}


def run_crash_schedule(app, kafka, seed: int, chunks: int = 5, crash_p: float = 0.7,
                       log=None) -> dict:
    """Feed the chunks, crashing at random points; recover after each crash. Returns a summary."""
    rnd = random.Random(seed * 7919 + 1)
    data = make_chunks(seed, chunks, lines_per_chunk=12, clicks_per_chunk=20)
    summary = {"crashes": [], "restarts": 0}
    say = log or (lambda *a: None)
    for i, chunk in enumerate(data):
        if (i == 0 or rnd.random() < crash_p) and app.pending_crash is None and app.state.is_running():
            c = random_crash(rnd, app.instances)
            if i == 0:  # every schedule crashes at least once; both modes over consecutive seeds
                c["mode"] = "process" if seed % 2 == 0 else "disk-loss"
            if c["point"] == "records" and c["after_records"] is None:
                c["after_records"] = 0
            app.crash(c["mode"], instance=c["instance"], after_records=c["after_records"],
                      point=c["point"])
            summary["crashes"].append(c)
            say("crash armed", c)
        produce_chunk(kafka, chunk, rnd=rnd)
        _settle(app, rnd, summary, say)
    # a directive that never fired is withdrawn; everything left is processed
    first = app.cancel_crash()
    if first is not None and not any(c.get("applied") for c in app.crashes):
        # it never found enough records in one batch: crash now instead (the query is idle: abort)
        app.crash(first["mode"], instance=first["instance"])
        say("crash now", first["mode"])
    _settle(app, rnd, summary, say)
    return summary


def _settle(app, rnd, summary, say, rounds: int = 12) -> None:
    from statekit.runtime.lifecycle import AppState

    for _ in range(rounds):
        if app.state == AppState.ERROR:
            crash_during = None
            if rnd.random() < 0.25:
                crash_during = {"mode": rnd.choice(["process", "disk-loss"]),
                                "instance": rnd.randrange(app.instances), "point": "mid_restore"}
                summary["crashes"].append(dict(crash_during))
            say("restart", app.error, "crash_during", crash_during)
            app.restart(crash_during=crash_during)
            summary["restarts"] += 1
            if crash_during is None:
                pass
        say("pa begin", app.state)
        ok = app.process_all_available(timeout=120)
        say("pa end", ok, app.state)
        if ok and app.state != AppState.ERROR:
            pc = app.pending_crash
            if pc is not None and pc.get("point") == "mid_restore":
                app.cancel_crash()  # no restore happened to crash in
            return
    raise AssertionError(f"the app did not settle: {app.state} {app.error}")
