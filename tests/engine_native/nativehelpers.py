"""Seeded input and plain-Python references for the native engine tests and bench/engines.py."""
from __future__ import annotations

import collections
import json
import random
import time

WINDOW_MS = 40
VOCAB = ["the", "a", "of", "stream", "state", "kafka", "rocks", "spark", "task", "store", "log",
         "commit", "crash", "replay", "window", "änder", "日本"]
USERS = [f"user-{i}" for i in range(7)]


def make_chunks(seed: int, chunks: int, lines: int, clicks: int) -> list:
    rnd = random.Random(seed)
    w = [1.0 / (i + 1) for i in range(len(VOCAB))]
    out = []
    for _ in range(chunks):
        ls = [" ".join(rnd.choices(VOCAB, weights=w, k=rnd.randint(1, 6))) for _ in range(lines)]
        cs = [(rnd.choice(USERS), f"/p{rnd.randint(0, 4)}") for _ in range(clicks)]
        out.append((ls, cs))
    return out


def produce(kafka, chunk, parts: int = 2, sends: int = 2) -> None:
    """One chunk in a few sends (each send its own append time, so windows differ)."""
    from statekit.partition import partition_for

    ls, cs = chunk
    for s in range(sends):
        by_p = collections.defaultdict(list)
        for i, ln in enumerate(ls[s::sends]):
            by_p[i % parts].append((None, ln.encode()))
        for p, recs in by_p.items():
            kafka.send("lines", p, recs)
        by_p = collections.defaultdict(list)
        for u, page in cs[s::sends]:
            by_p[partition_for(u.encode(), parts)].append((u.encode(), page.encode()))
        for p, recs in by_p.items():
            kafka.send("clicks", p, recs)
        time.sleep(WINDOW_MS / 1000.0 * 0.7)  # spacing: each send lands in a later time window


def read_topic(kafka, topic) -> list:
    out = []
    for p, end in sorted(kafka.end_offsets(topic).items()):
        for chunk in kafka.read(topic, p, None, end):
            for off, ts, k, v, _h in chunk.records:
                out.append((p, off, ts, k, v))
    return out


def wordcount_reference(kafka) -> dict:
    c = collections.Counter()
    for _p, _o, _ts, _k, v in read_topic(kafka, "lines"):
        c.update(v.decode().split())
    return dict(c)


def windowed_reference(kafka, size_ms: int = WINDOW_MS) -> dict:
    c = collections.Counter()
    for _p, _o, ts, k, _v in read_topic(kafka, "clicks"):
        c[(k.decode(), ts - ts % size_ms)] += 1
    return dict(c)


def pages_reference(kafka) -> dict:
    seen = collections.defaultdict(set)
    for _p, _o, _ts, k, v in read_topic(kafka, "clicks"):
        seen[k.decode()].add(v.decode())
    return {u: sorted(s) for u, s in seen.items()}


def build_topology(app, size_ms: int = WINDOW_MS, processor: bool = True) -> None:
    """Word count, windowed click count and (processor API) the distinct pages of each user."""
    from statekit.topology import Processor, tumbling

    app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
    clicks = app.stream("clicks")
    clicks.group_by_key().windowed_by(tumbling(size_ms), grace_ms=10 ** 9).count(store="clicks-per-window")
    if processor:
        class DistinctPages(Processor):   # local class: pickled by value into the workers
            def init(self, context):
                self.context = context
                self.pages = context.get_store("pages")

            def process(self, key, value):
                old = self.pages.get(key) or []
                if value not in old:
                    self.pages.put(key, sorted(old + [value]))

        clicks.process(DistinctPages, stores=["pages"])


def as_dict(df) -> dict:
    if "window_start" in df.columns:
        return {(k, int(w)): int(v) for k, w, v in zip(df["key"], df["window_start"], df["value"])}
    return {k: (v if isinstance(v, list) else int(v)) for k, v in zip(df["key"], df["value"])}


def dumps(d) -> str:
    return json.dumps(d, sort_keys=True, default=str)
