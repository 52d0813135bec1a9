"""Seeded data generators: Zipf-distributed words, clickstream events, sensor readings.

Every generator yields `Record(key, value, timestamp)`: `key` a str (or None), `value` a JSON-able
dict, `timestamp` epoch milliseconds. The same seed always yields the same records, so a notebook can
compute a plain-Python reference over exactly what it produced.

    python -m statekit.datagen --out sample_data          # small JSON-lines files
    python -m statekit.datagen --generator words --limit 5 # print a few records

`produce(topic, records, ...)` streams records to a topic through `statekit.kafka` (rate limit,
limit, stop event, progress callback); `%statekit produce` runs it in a background thread.
"""
from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

# 2026-01-01T00:00:00Z: timestamps are synthetic and reproducible, not wall-clock.
BASE_TS_MS = 1767225600000

VOCABULARY = (
    "the of and to in is was for on that with as by at from his it an were are which this be or "
    "has had not but first one their its new after who they have her she two been other when there "
    "all also into during time more only most some would over states years may about world state "
    "stream kafka spark rocksdb store cache commit changelog offset partition task replica standby "
    "restore compaction segment cleaner broker topic record key value window session lag batch "
    "trigger checkpoint query instance crash failover snapshot marker header serde producer "
    "consumer leader follower watermark tombstone retention ledger journal"
).split()

PAGES = ("/", "/search", "/product", "/product/reviews", "/cart", "/checkout", "/account", "/help")
ACTIONS = ("view", "view", "view", "click", "click", "scroll", "add_to_cart", "purchase")


@dataclass(frozen=True)
class Record:
    key: str | None
    value: dict
    timestamp: int

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "value": self.value, "timestamp": self.timestamp},
                          separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> "Record":
        d = json.loads(line)
        key = d.get("key")
        return Record(None if key is None else str(key), d.get("value"),
                      int(d.get("timestamp") or BASE_TS_MS))


class _Zipf:
    """Draw ranks 0..n-1 with P(rank r) proportional to 1/(r+1)^s (inverse CDF, exact, seeded)."""

    def __init__(self, n: int, s: float, rng: random.Random):
        weights = [1.0 / (r + 1) ** s for r in range(n)]
        total = sum(weights)
        acc, self.cdf = 0.0, []
        for w in weights:
            acc += w / total
            self.cdf.append(acc)
        self.cdf[-1] = 1.0
        self.rng = rng

    def draw(self) -> int:
        return bisect.bisect_left(self.cdf, self.rng.random())


def words(seed: int = 42, vocabulary: int = 100, s: float = 1.1, gap_ms: int = 10) -> Iterator[Record]:
    """One word per record, Zipf-distributed over a fixed vocabulary: key = the word."""
    rng = random.Random(seed)
    vocab = list(VOCABULARY[:vocabulary])
    while len(vocab) < vocabulary:  # pad a bigger vocabulary with synthetic words
        vocab.append(f"w{len(vocab):04d}")
    order = vocab[:]
    random.Random(seed + 1).shuffle(order)  # which word is most frequent depends on the seed
    zipf = _Zipf(len(order), s, rng)
    ts = BASE_TS_MS
    for i in itertools.count():
        word = order[zipf.draw()]
        ts += rng.randint(1, 2 * gap_ms)
        yield Record(word, {"word": word, "seq": i, "ts": ts}, ts)


def clicks(seed: int = 42, users: int = 100, s: float = 1.05, gap_ms: int = 50) -> Iterator[Record]:
    """Clickstream events: key = user id, value = page, action, session, duration."""
    rng = random.Random(seed)
    zipf = _Zipf(users, s, rng)
    sessions: dict[int, int] = {}
    last_seen: dict[int, int] = {}
    ts = BASE_TS_MS
    for i in itertools.count():
        u = zipf.draw()
        ts += rng.randint(1, 2 * gap_ms)
        if u not in sessions or ts - last_seen[u] > 30 * 60 * 1000 or rng.random() < 0.02:
            sessions[u] = sessions.get(u, 0) + 1
        last_seen[u] = ts
        user = f"u{u:04d}"
        yield Record(user, {
            "user": user,
            "page": rng.choice(PAGES),
            "action": rng.choice(ACTIONS),
            "session": f"{user}-{sessions[u]}",
            "duration_ms": int(rng.expovariate(1 / 4000)),
            "seq": i,
            "ts": ts,
        }, ts)


def sensors(seed: int = 42, count: int = 20, gap_ms: int = 100) -> Iterator[Record]:
    """Sensor readings, a bounded random walk per sensor: key = sensor id."""
    rng = random.Random(seed)
    temps = [18 + rng.random() * 8 for _ in range(count)]
    hums = [35 + rng.random() * 30 for _ in range(count)]
    ts = BASE_TS_MS
    for i in itertools.count():
        k = rng.randrange(count)
        temps[k] = min(45.0, max(-10.0, temps[k] + rng.gauss(0, 0.4)))
        hums[k] = min(100.0, max(0.0, hums[k] + rng.gauss(0, 1.0)))
        ts += rng.randint(1, 2 * gap_ms)
        sensor = f"s{k:02d}"
        yield Record(sensor, {
            "sensor": sensor,
            "temperature": round(temps[k], 2),
            "humidity": round(hums[k], 1),
            "battery": round(max(0.0, 100 - i * 0.001 - k * 0.5), 2),
            "seq": i,
            "ts": ts,
        }, ts)


GENERATORS: dict[str, Callable[..., Iterator[Record]]] = {
    "words": words,
    "clicks": clicks,
    "sensors": sensors,
}

SAMPLE_COUNTS = {"words": 2000, "clicks": 800, "sensors": 800}


def generate(name: str, seed: int = 42, limit: int | None = None, **kwargs) -> Iterator[Record]:
    """The records of generator `name` (first `limit` of them when given)."""
    try:
        gen = GENERATORS[name]
    except KeyError:
        from statekit.errors import StatekitError

        raise StatekitError(f"unknown generator {name!r}; use one of {', '.join(GENERATORS)}") from None
    it = gen(seed=seed, **kwargs)
    return itertools.islice(it, limit) if limit is not None else it


def read_jsonl(path: str, limit: int | None = None) -> Iterator[Record]:
    """Records from a JSON-lines file written by `write_samples` (or by hand: key, value, timestamp)."""
    from statekit.errors import StatekitError

    if not os.path.exists(path):
        raise StatekitError(f"no such file: {path}")
    n = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Record.from_json(line)
            except (ValueError, TypeError, AttributeError) as err:
                raise StatekitError(f"{path}:{lineno}: not a JSON record ({err})") from None
            n += 1
            if limit is not None and n >= limit:
                return


def write_samples(out: str, seed: int = 42, counts: dict[str, int] | None = None) -> list[str]:
    """Write `<out>/<generator>.jsonl` for every generator; returns the paths."""
    os.makedirs(out, exist_ok=True)
    paths = []
    for name, n in (counts or SAMPLE_COUNTS).items():
        path = os.path.join(out, f"{name}.jsonl")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in generate(name, seed=seed, limit=n):
                f.write(rec.to_json() + "\n")
        os.replace(tmp, path)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------
# producing to Kafka


def encode(rec: Record) -> tuple[bytes | None, bytes]:
    """The bytes on the wire: key as UTF-8 text, value as compact JSON (whose "ts" field carries
    the event time; the Kafka timestamp is the produce time)."""
    key = None if rec.key is None else rec.key.encode("utf-8")
    value = json.dumps(rec.value, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return key, value


@dataclass
class ProduceProgress:
    sent: int = 0
    limit: int | None = None
    elapsed: float = 0.0
    done: bool = False
    error: str | None = None

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed if self.elapsed > 0 else 0.0


def produce(topic: str, records: Iterable[Record], bootstrap: str | None = None, *,
            partitions: int = 4, rate: float | None = None, limit: int | None = None,
            stop: threading.Event | None = None, batch_size: int = 500,
            progress: Callable[[ProduceProgress], None] | None = None,
            kafka=None) -> ProduceProgress:
    """Send `records` to `topic` (created with `partitions` partitions if missing), keyed records
    to Kafka's default-partitioner partition, at most `rate` records/s, at most `limit` records,
    until `stop` is set. Returns the final progress."""
    from statekit.kafka import Kafka, resolve_bootstrap
    from statekit.partition import partition_for

    own = kafka is None
    if own:
        kafka = Kafka(resolve_bootstrap(bootstrap))
    prog = ProduceProgress(limit=limit)
    t0 = time.monotonic()
    try:
        if topic not in kafka.topics():
            kafka.ensure_topic(topic, partitions, {})
        n = len(kafka.end_offsets(topic)) or partitions
        rr = itertools.count()
        it = iter(records) if limit is None else itertools.islice(records, limit)
        last_report = 0.0
        while not (stop is not None and stop.is_set()):
            now = time.monotonic()
            if rate:
                allowed = int((now - t0) * rate) + 1 - prog.sent
                if allowed <= 0:
                    time.sleep(min(0.05, max(0.001, (prog.sent + 1) / rate - (now - t0))))
                    continue
                want = min(batch_size, allowed)
            else:
                want = batch_size
            chunk = list(itertools.islice(it, want))
            if not chunk:
                break
            by_part: dict[int, list] = {}
            for rec in chunk:
                key, value = encode(rec)
                p = partition_for(key, n) if key is not None else next(rr) % n
                by_part.setdefault(p, []).append((key, value))
            for p, recs in sorted(by_part.items()):
                kafka.send(topic, p, recs)
            prog.sent += len(chunk)
            prog.elapsed = time.monotonic() - t0
            if progress is not None and (prog.elapsed - last_report >= 0.2):
                last_report = prog.elapsed
                progress(prog)
    except Exception as err:  # reported to the caller through progress, re-raised
        prog.error = " ".join(str(err).split()) or type(err).__name__
        raise
    finally:
        prog.elapsed = time.monotonic() - t0
        prog.done = True
        if progress is not None:
            progress(prog)
        if own:
            kafka.close()
    return prog


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m statekit.datagen", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the sample JSON-lines files into this directory")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--generator", choices=sorted(GENERATORS), help="print records of one generator")
    ap.add_argument("--limit", type=int, default=10)
    a = ap.parse_args(argv)
    if a.out:
        for path in write_samples(a.out, seed=a.seed):
            print(f"{path}: {os.path.getsize(path) / 1024:.0f} KB")
        return 0
    if a.generator:
        for rec in generate(a.generator, seed=a.seed, limit=a.limit):
            print(rec.to_json())
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
