"""Seeded data generators: Zipf-distributed words, clickstream events, sensor readings, and
bank-account movements over up to millions of accounts (for stores of >= 1,000,000 keys).

Every generator yields `Record(key, value, timestamp)`: `key` a str (or None), `value` a JSON-able
dict, `timestamp` epoch milliseconds. The same seed always yields the same records, so a notebook can
compute a plain-Python reference over exactly what it produced (`accounts_reference` does it for
`accounts` without walking the records).

    python -m statekit.datagen --out sample_data          # small JSON-lines files
    python -m statekit.datagen --generator words --limit 5 # print a few records

Event time: the generators above write their timestamp into the value ("ts"); `produce` sends
records at the produce time. For joins and windows over event time, `shop_events` (orders with
their payments) and `session_clicks` (clicks in visits) return finite lists in arrival order (a
bounded number of ms out of order), and `produce_timed` writes each record's timestamp as its Kafka
timestamp.

`produce(topic, records, ...)` streams records to a topic through `statekit.kafka` (rate limit,
limit, stop event, progress callback); `%statekit produce --rate` runs it in a background thread.
`produce_fast(topic, generator, seed, limit)` writes the first `limit` records of a generator as fast
as the broker takes them (millions per run): records are built and encoded column-wise with numpy
into record batches per partition and written with raw, pipelined Produce requests
(`Kafka.send_encoded`); `accounts` is defined block-wise with numpy, so it is vectorized end to
end, the other generators are walked in Python and encoded in bulk. `%statekit produce --limit N`
without `--rate` uses it. Both take `value_format="avro"` (`protobuf`, `json_schema`): the values
in that registry format with the generator's schema (`statekit.generator_schemas`); `produce` also
takes `value_serde=` (a schema serde) for records of your own.
"""
from __future__ import annotations

import argparse
import bisect
import functools
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


# -- accounts: defined block-wise with numpy, so a fast path can compute the same records at once

ACCOUNTS_BLOCK = 1 << 16
AMOUNT_MIN, AMOUNT_MAX = -500, 1000


def _np_seed(seed) -> int:
    return int(seed) % (1 << 64)


@functools.lru_cache(maxsize=4)
def _account_order(seed: int, keys: int):
    """The seeded order in which the first `keys` records visit every account once."""
    import numpy as np

    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([_np_seed(seed), 1, keys])))
    order = rng.permutation(keys)
    order.flags.writeable = False
    return order


def _accounts_block(seed: int, keys: int, j: int):
    """Block `j` of the accounts generator (its records j*ACCOUNTS_BLOCK ...): (ids, amounts).
    This *is* the generator's definition; `accounts()` and the fast path both read it."""
    import numpy as np

    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([_np_seed(seed), 0, keys, j])))
    ids = rng.integers(0, keys, ACCOUNTS_BLOCK, dtype=np.int64)
    amounts = rng.integers(AMOUNT_MIN, AMOUNT_MAX + 1, ACCOUNTS_BLOCK, dtype=np.int64)
    start = j * ACCOUNTS_BLOCK
    if start < keys:
        m = min(keys - start, ACCOUNTS_BLOCK)
        ids[:m] = _account_order(seed, keys)[start:start + m]
    return ids, amounts


def _accounts_range(seed: int, keys: int, start: int, stop: int):
    """(ids, amounts) of records [start, stop)."""
    import numpy as np

    ids, amounts = [], []
    for j in range(start // ACCOUNTS_BLOCK, (stop - 1) // ACCOUNTS_BLOCK + 1):
        a, b = _accounts_block(seed, keys, j)
        lo = max(start - j * ACCOUNTS_BLOCK, 0)
        hi = min(stop - j * ACCOUNTS_BLOCK, ACCOUNTS_BLOCK)
        ids.append(a[lo:hi])
        amounts.append(b[lo:hi])
    return np.concatenate(ids), np.concatenate(amounts)


def _check_keys(keys) -> int:
    if not isinstance(keys, int) or isinstance(keys, bool) or not 1 <= keys <= 10**9:
        from statekit.errors import StatekitError

        raise StatekitError(f"keys must be a whole number of accounts from 1 to 1e9 (got {keys!r})")
    return keys


def account_key(i: int, keys: int = 1_000_000) -> str:
    """The key of account number `i` (0 .. keys-1): "acct-" and at least 7 digits."""
    return f"acct-{i:0{max(7, len(str(keys - 1)))}d}"


def accounts(seed: int = 42, keys: int = 1_000_000, gap_ms: int = 1) -> Iterator[Record]:
    """Bank-account movements over `keys` accounts: key = account id (`account_key`), value =
    {"account": id, "amount": a} with a whole amount in [-500, 1000]. The first `keys` records
    visit every account once (in a seeded order), so a store keyed by account holds exactly
    min(records, keys) keys; later records pick accounts uniformly. Amounts and accounts come
    from numpy's PCG64, block by block (`_accounts_block`)."""
    keys = _check_keys(keys)
    width = max(7, len(str(keys - 1)))
    for j in itertools.count():
        ids, amounts = _accounts_block(seed, keys, j)
        ts = BASE_TS_MS + j * ACCOUNTS_BLOCK * gap_ms
        for i, a in zip(ids.tolist(), amounts.tolist()):
            ts += gap_ms
            key = f"acct-{i:0{width}d}"
            yield Record(key, {"account": key, "amount": a}, ts)


def accounts_reference(seed: int = 42, limit: int = 1_000_000,
                       keys: int = 1_000_000) -> tuple[dict, dict]:
    """What the first `limit` records of `accounts(seed, keys)` add up to, without walking them:
    ``(counts, sums)``, dicts from account key to the number of its records and the sum of their
    amounts (accounts without a record are absent). For checking a count / sum app's stores."""
    import numpy as np

    keys = _check_keys(keys)
    counts = np.zeros(keys, np.int64)
    sums = np.zeros(keys, np.int64)
    for start in range(0, limit, 16 * ACCOUNTS_BLOCK):
        ids, amounts = _accounts_range(seed, keys, start, min(limit, start + 16 * ACCOUNTS_BLOCK))
        counts += np.bincount(ids, minlength=keys)
        sums += np.bincount(ids, weights=amounts, minlength=keys).astype(np.int64)
    present = np.flatnonzero(counts).tolist()
    width = max(7, len(str(keys - 1)))
    names = [f"acct-{i:0{width}d}" for i in present]
    return (dict(zip(names, counts[present].tolist())), dict(zip(names, sums[present].tolist())))


GENERATORS: dict[str, Callable[..., Iterator[Record]]] = {
    "words": words,
    "clicks": clicks,
    "sensors": sensors,
    "accounts": accounts,
}

# the parameter that sets how many distinct keys a generator draws from (`--keys K`)
KEYS_PARAM = {"words": "vocabulary", "clicks": "users", "sensors": "count", "accounts": "keys"}

SAMPLE_COUNTS = {"words": 2000, "clicks": 800, "sensors": 800}


def _generator_kwargs(name: str, keys: int | None, kwargs: dict) -> dict:
    from statekit.errors import StatekitError

    if name not in GENERATORS:
        raise StatekitError(f"unknown generator {name!r}; use one of {', '.join(GENERATORS)}")
    kw = dict(kwargs)
    if keys is not None:
        if not isinstance(keys, int) or isinstance(keys, bool) or keys < 1:
            raise StatekitError(f"keys must be a whole number >= 1 (got {keys!r})")
        kw[KEYS_PARAM[name]] = keys
    return kw


def generate(name: str, seed: int = 42, limit: int | None = None, keys: int | None = None,
             **kwargs) -> Iterator[Record]:
    """The records of generator `name` (first `limit` of them when given). `keys`: how many
    distinct keys it draws from (words: vocabulary, clicks: users, sensors: count, accounts:
    keys)."""
    kw = _generator_kwargs(name, keys, kwargs)
    it = GENERATORS[name](seed=seed, **kw)
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


class _SerdeEncoder:
    """Values through a schema serde (`statekit.serdes.avro(schema=...)`, ...), bound to the
    topic it writes (the subject of its schema)."""

    def __init__(self, serde, topic: str) -> None:
        from statekit.errors import StatekitError
        from statekit.schemas.serdes import SchemaSerde

        if not isinstance(serde, SchemaSerde):
            raise StatekitError(f"value_serde= takes statekit.serdes.avro(...), protobuf(...) or "
                                f"json_schema(...), not {serde!r}")
        self.to_bytes = serde.bind(topic).to_bytes

    def encode_many(self, values: list) -> list:
        enc = self.to_bytes
        return [None if v is None else enc(v) for v in values]


def _encoded(records: list, encoder) -> list:
    """[(key bytes, value bytes)] of `records`: `encode`, or keys as text and the values through
    `encoder` in bulk."""
    if encoder is None:
        return [encode(rec) for rec in records]
    values = encoder.encode_many([rec.value for rec in records])
    return [(None if rec.key is None else rec.key.encode("utf-8"), v)
            for rec, v in zip(records, values)]


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


def _encoder(value_format: str, generator: str | None, topic: str):
    """None for JSON (`encode`); else the generator's `ValueEncoder` for that format."""
    from statekit.generator_schemas import ValueEncoder, check_format

    if check_format(value_format) == "json":
        return None
    if generator is None:
        from statekit.errors import StatekitError

        raise StatekitError(f"--format {value_format} needs --generator: each generator has a "
                            f"schema, a file's records have none")
    return ValueEncoder(value_format, generator, topic)


def produce(topic: str, records: Iterable[Record], bootstrap: str | None = None, *,
            partitions: int = 4, rate: float | None = None, limit: int | None = None,
            stop: threading.Event | None = None, batch_size: int = 500,
            progress: Callable[[ProduceProgress], None] | None = None,
            kafka=None, value_format: str = "json", generator: str | None = None,
            value_serde=None) -> ProduceProgress:
    """Send `records` to `topic` (created with `partitions` partitions if missing), keyed records
    to Kafka's default-partitioner partition, at most `rate` records/s, at most `limit` records,
    until `stop` is set. Returns the final progress. `value_format` "avro", "protobuf" or
    "json_schema" writes the values of `generator`'s records in that format with its schema
    (`statekit.generator_schemas`), registered under ``<topic>-value``; `value_serde` writes
    them with that serde instead (e.g. ``statekit.serdes.avro(schema=...)``)."""
    from statekit.bootstrap import resolve_bootstrap
    from statekit.kafka import Kafka
    from statekit.partition import partition_for

    encoder = _encoder(value_format, generator, topic) if value_serde is None \
        else _SerdeEncoder(value_serde, topic)
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
            for key, value in _encoded(chunk, encoder):
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


# ---------------------------------------------------------------------------------------------
# the fast path: records built, partitioned and encoded column-wise, written pre-encoded

FAST_CHUNK = 1 << 18  # records encoded per round; the previous round's acks are awaited meanwhile


def _digits(x, width: int):
    """Zero-padded ASCII digits of the non-negative ints `x`, as an (n, width) uint8 matrix."""
    import numpy as np

    out = np.empty((len(x), width), np.uint8)
    v = x.astype(np.uint64)
    ten = np.uint64(10)
    for c in range(width - 1, -1, -1):
        q = v // ten
        out[:, c] = v - q * ten
        v = q
    out += 48
    return out


def _account_keys(ids, keys: int):
    import numpy as np

    width = max(7, len(str(keys - 1)))
    mat = np.empty((len(ids), 5 + width), np.uint8)
    mat[:, :5] = np.frombuffer(b"acct-", np.uint8)
    mat[:, 5:] = _digits(ids, width)
    return mat


@functools.lru_cache(maxsize=2)
def _account_partitions(keys: int, partitions: int):
    import numpy as np

    from statekit.partition import partitions_of_rows

    out = np.empty(keys, np.int64)
    step = 1 << 20
    for lo in range(0, keys, step):
        ids = np.arange(lo, min(keys, lo + step), dtype=np.int64)
        out[lo:lo + len(ids)] = partitions_of_rows(_account_keys(ids, keys), partitions)
    out.flags.writeable = False
    return out


def _accounts_encoded(seed: int, start: int, stop: int, partitions: int, ts: int,
                      keys: int = 1_000_000, encoder=None) -> list | None:
    """[(partition, batch bytes, count)] for records [start, stop) of `accounts`: the records of
    each partition in generation order, byte for byte what `encode(record)` gives (`encoder`:
    its format's bytes; None when that format has no column-wise path)."""
    import numpy as np

    keys = _check_keys(keys)
    ids, amounts = _accounts_range(seed, keys, start, stop)
    part = _account_partitions(keys, partitions)[ids]
    order = np.argsort(part, kind="stable")
    ids, amounts, part = ids[order], amounts[order], part[order]
    kmat = _account_keys(ids, keys)
    n, klen = kmat.shape
    if encoder is not None and encoder.format not in ("avro", "json_schema"):
        return None
    first = {"account": kmat[0].tobytes().decode("ascii"), "amount": int(amounts[0])}
    if encoder is not None and encoder.format == "avro":
        got = encoder.accounts_columns(first, kmat, amounts)
        if got is None:
            return None
        vflat, vlen = got
        return _column_batches(kmat, vflat, vlen, part, partitions, ts)
    # value: {"account":"<key>","amount":<a>} (json.dumps, compact, sorted keys)
    head = np.frombuffer(b'{"account":"', np.uint8)
    mid = np.frombuffer(b'","amount":', np.uint8)
    p0 = len(head) + klen + len(mid)
    neg = (amounts < 0).astype(np.int64)
    mag = np.abs(amounts)
    nd = np.ones(n, np.int64)
    for b in (10, 100, 1000, 10_000, 100_000, 1_000_000):
        nd += mag >= b
    alen = nd + neg
    width = p0 + int(alen.max()) + 1
    vmat = np.zeros((n, width), np.uint8)
    vmat[:, :len(head)] = head
    vmat[:, len(head):len(head) + klen] = kmat
    vmat[:, len(head) + klen:p0] = mid
    dig = _digits(mag, int(nd.max()))  # right-aligned digits
    cols = np.arange(width - p0)
    # amount characters left-aligned after p0: '-' if negative, then the nd digits, then '}'
    j = cols[None, :] - neg[:, None]                      # index among the digits
    src = j + (dig.shape[1] - nd)[:, None]                # column of that digit in `dig`
    ok = (j >= 0) & (j < nd[:, None])
    chars = np.where(ok, np.take_along_axis(dig, np.clip(src, 0, dig.shape[1] - 1), 1), 0)
    chars = np.where((cols[None, :] == 0) & (neg[:, None] == 1), ord("-"), chars)
    chars = np.where(cols[None, :] == alen[:, None], ord("}"), chars)
    vmat[:, p0:] = chars
    vlen = p0 + alen + 1
    if encoder is not None:             # json_schema: the registry header, then the same JSON
        if encoder.header is None:
            encoder.encode_many([first])
        h = len(encoder.header)
        vmat = np.concatenate([np.broadcast_to(np.frombuffer(encoder.header, np.uint8), (n, h)),
                               vmat], axis=1)
        vlen = vlen + h
        width += h
    vflat = vmat[np.arange(width)[None, :] < vlen[:, None]]
    return _column_batches(kmat, vflat, vlen, part, partitions, ts)


def _column_batches(kmat, vflat, vlen, part, partitions: int, ts: int) -> list:
    """Record batches per partition from the keys' matrix and the values' flat buffer, the
    records sorted by partition."""
    import numpy as np

    from statekit.wire import encode_batches_flat

    n, klen = kmat.shape
    kflat = kmat.ravel()
    klens = np.full(n, klen, np.int64)
    out = []
    bounds = np.searchsorted(part, np.arange(partitions + 1))
    vstarts = np.concatenate(([0], np.cumsum(vlen)))
    for p in range(partitions):
        lo, hi = int(bounds[p]), int(bounds[p + 1])
        if lo == hi:
            continue
        for data, c in encode_batches_flat(kflat[lo * klen:hi * klen], klens[lo:hi],
                                           vflat[vstarts[lo]:vstarts[hi]], vlen[lo:hi], ts):
            out.append((p, data, c))
    return out


def _records_encoded(records: list, partitions: int, ts: int, rr, encoder=None) -> list:
    """The general path: records walked in Python, encoded in bulk per partition."""
    from statekit.wire import encode_batches
    from statekit.partition import partition_for

    by_part: dict[int, list] = {}
    for key, value in _encoded(records, encoder):
        p = partition_for(key, partitions) if key is not None else next(rr) % partitions
        by_part.setdefault(p, []).append((key, value))
    return [(p, data, c) for p, recs in sorted(by_part.items())
            for data, c in encode_batches(recs, None, 900_000, ts)]


FAST_GENERATORS = {"accounts": _accounts_encoded}  # vectorized end to end


def produce_fast(topic: str, generator: str = "accounts", seed: int = 42, limit: int = 1_000_000,
                 bootstrap: str | None = None, *, keys: int | None = None, partitions: int = 4,
                 stop: threading.Event | None = None,
                 progress: Callable[[ProduceProgress], None] | None = None, kafka=None,
                 chunk: int = FAST_CHUNK, value_format: str = "json", **kwargs) -> ProduceProgress:
    """Write the first `limit` records of generator `generator` (seeded; `keys`: see `generate`)
    to `topic` (created with `partitions` partitions if missing) as fast as the broker takes
    them: exactly the records `generate(generator, seed, limit, keys)` yields, each in the
    partition `produce` would pick, in the same order per partition. Rounds of `chunk` records
    are built and encoded column-wise (vectorized for `accounts`) and written as pre-encoded
    record batches with raw Produce requests; the next round is encoded while the broker writes
    the previous one. Returns the final progress (also given to `progress` after each round).
    `value_format`: as for `produce`."""
    from statekit.errors import StatekitError
    from statekit.bootstrap import resolve_bootstrap
    from statekit.kafka import Kafka

    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise StatekitError(f"limit must be a whole number of records >= 1 (got {limit!r})")
    kw = _generator_kwargs(generator, keys, kwargs)
    fast = FAST_GENERATORS.get(generator)
    encoder = _encoder(value_format, generator, topic)
    own = kafka is None
    if own:
        kafka = Kafka(resolve_bootstrap(bootstrap))
    prog = ProduceProgress(limit=limit)
    t0 = time.monotonic()
    pending = None
    try:
        if topic not in kafka.topics():
            kafka.ensure_topic(topic, partitions, {})
        n = len(kafka.end_offsets(topic)) or partitions
        rr = itertools.count()
        it = None
        for start in range(0, limit, chunk):
            if stop is not None and stop.is_set():
                break
            stop_at = min(limit, start + chunk)
            ts = int(time.time() * 1000)
            batches = None if fast is None else fast(seed, start, stop_at, n, ts, encoder=encoder, **kw)
            if batches is None:          # walked in Python (this generator, or this format)
                if it is None:
                    it = itertools.islice(GENERATORS[generator](seed=seed, **kw), start, None)
                batches = _records_encoded(list(itertools.islice(it, stop_at - start)), n, ts, rr,
                                           encoder)
            sent = kafka.send_encoded(topic, batches, wait=False)
            if pending is not None:
                pending.wait()
                prog.sent += pending.records
                prog.elapsed = time.monotonic() - t0
                if progress is not None:
                    progress(prog)
            pending = sent
        if pending is not None:
            pending.wait()
            prog.sent += pending.records
            pending = None
    except Exception as err:  # reported to the caller through progress, re-raised
        prog.error = " ".join(str(err).split()) or type(err).__name__
        if pending is not None:
            try:
                pending.wait()  # no ack left on the socket
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
        raise
    finally:
        prog.elapsed = time.monotonic() - t0
        prog.done = True
        if progress is not None:
            progress(prog)
        if own:
            kafka.close()
    return prog


# ---------------------------------------------------------------------------------------------
# event-time streams for joins and sessions: here the record timestamp is the event time


def now_ms(round_to: int = 1000) -> int:
    """The current time in ms, rounded down: a `start_ms` for the event-time generators below
    (data far in the past would be removed by a topic's retention.ms, which Kafka judges by the
    record timestamps)."""
    return int(time.time() * 1000) // round_to * round_to


def _arrival_order(events: list, rng: random.Random, late_ms: int) -> list:
    """`events` ((timestamp, seq, key, value)) in the order they arrive: by timestamp, each
    delayed by up to `late_ms`, so a record is at most `late_ms` older than any record before it."""
    keyed = [(ts + (rng.randint(0, late_ms) if late_ms > 0 else 0), seq, ts, k, v)
             for ts, seq, k, v in events]
    keyed.sort(key=lambda e: (e[0], e[1]))
    return [Record(k, v, ts) for _a, _s, ts, k, v in keyed]


def shop_events(seed: int = 42, orders: int = 60, start_ms: int | None = None,
                spacing_ms: int = 1000, pay_after_ms: int = 60_000, pay_before_ms: int = 0,
                unpaid: float = 0.15, late_pay: float = 0.1, split: float = 0.1,
                customers: int = 12, late_ms: int = 0) -> list:
    """Orders and their payments, keyed by order id, in the order they arrive (a finite list):
    `{"type": "order", "order", "customer", "amount"}` about every `spacing_ms`, and
    `{"type": "payment", "order", "amount"}` — none for a share `unpaid`, one later than
    `pay_after_ms` for a share `late_pay` (outside a join window of that size), two halves for a
    share `split`, one up to `pay_before_ms` *before* the order for a tenth of the rest when
    `pay_before_ms` > 0, else one within (0, pay_after_ms]. The record timestamp is the event time
    (`produce_timed` keeps it); a record arrives at most `late_ms` after a younger one."""
    rng = random.Random(seed)
    t0 = now_ms() if start_ms is None else int(start_ms)
    events: list = []
    for n in range(orders):
        oid = f"o{n:04d}"
        t = t0 + n * spacing_ms + rng.randint(0, max(0, spacing_ms - 1))
        amount = round(rng.uniform(5, 200), 2)
        events.append((t, len(events), oid, {"type": "order", "order": oid,
                                             "customer": f"c{rng.randrange(customers):02d}",
                                             "amount": amount}))
        r = rng.random()
        if r < unpaid:
            delays, amounts = [], []
        elif r < unpaid + late_pay:
            delays, amounts = [pay_after_ms + rng.randint(1, max(1, pay_after_ms))], [amount]
        elif r < unpaid + late_pay + split:
            d1 = rng.randint(1, max(1, pay_after_ms - 1))
            d2 = rng.randint(1, max(1, pay_after_ms))
            if d2 == d1:
                d2 = d1 + 1
            delays, amounts = [d1, d2], [round(amount / 2, 2), round(amount - round(amount / 2, 2), 2)]
        elif pay_before_ms > 0 and rng.random() < 0.1:
            delays, amounts = [-rng.randint(1, pay_before_ms)], [amount]
        else:
            delays, amounts = [rng.randint(1, max(1, pay_after_ms))], [amount]
        for d, a in zip(delays, amounts):
            events.append((t + d, len(events), oid, {"type": "payment", "order": oid, "amount": a}))
    return _arrival_order(events, rng, late_ms)


def session_clicks(seed: int = 42, users: int = 8, sessions: tuple = (1, 4), clicks: tuple = (1, 6),
                   start_ms: int | None = None, gap_ms: int = 30_000, late_ms: int = 0) -> list:
    """Clicks keyed by user (`{"user", "page"}`) in visits: each user has `sessions` (min, max)
    visits of `clicks` (min, max) clicks less than `gap_ms` apart, and more than `gap_ms` between
    two visits — so each visit is one session window of that gap. A finite list in arrival order;
    the record timestamp is the event time; a click arrives at most `late_ms` after a younger one
    (a late click can split a session until it arrives and bridges it)."""
    rng = random.Random(seed)
    t0 = now_ms() if start_ms is None else int(start_ms)
    events: list = []
    for u in range(users):
        user = f"u{u:02d}"
        t = t0 + rng.randint(0, gap_ms)
        for _s in range(rng.randint(*sessions)):
            for c in range(rng.randint(*clicks)):
                if c:
                    t += rng.randint(1, max(1, gap_ms * 2 // 3))
                events.append((t, len(events), user, {"user": user, "page": rng.choice(PAGES)}))
            t += gap_ms + 1 + rng.randint(0, 2 * gap_ms)
    events.sort(key=lambda e: (e[0], e[1]))
    return _arrival_order(events, rng, late_ms)


def produce_timed(topic: str, records: Iterable, bootstrap: str | None = None, *,
                  partitions: int = 4, kafka=None) -> int:
    """Send `records` (`Record`s; a None value is a tombstone) with each one's timestamp as its
    Kafka timestamp — the event time joins and windows see — in the order given within a
    partition: keyed records to Kafka's default-partitioner partition, unkeyed ones round robin.
    Creates the topic with `partitions` partitions if missing. Returns the number sent."""
    from statekit.bootstrap import resolve_bootstrap
    from statekit.kafka import Kafka
    from statekit.partition import partition_for
    from statekit.wire import Columns

    own = kafka is None
    if own:
        kafka = Kafka(resolve_bootstrap(bootstrap))
    try:
        if topic not in kafka.topics():
            kafka.ensure_topic(topic, partitions, {})
        n = len(kafka.end_offsets(topic)) or partitions
        rr = itertools.count()
        by_part: dict = {}       # partition -> (keys, values, timestamps), in the order given
        count = 0
        for rec in records:
            key = None if rec.key is None else rec.key.encode("utf-8")
            value = (None if rec.value is None
                     else json.dumps(rec.value, separators=(",", ":"), sort_keys=True).encode("utf-8"))
            p = partition_for(key, n) if key is not None else next(rr) % n
            keys, values, stamps = by_part.setdefault(p, ([], [], []))
            keys.append(key)
            values.append(value)
            stamps.append(int(rec.timestamp))
            count += 1
        items = [(topic, p, Columns.of(k, v, timestamps=t)) for p, (k, v, t) in sorted(by_part.items())]
        if items:
            kafka.send_many(items)
        return count
    finally:
        if own:
            kafka.close()


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
