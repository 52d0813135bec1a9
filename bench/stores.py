"""Bench: cached operations through the full store stack vs raw rocksdict, in the same run.

Workload: a word count's read-modify-write (get then put) over a zipf-ish key set that fits in the
record cache, with a task commit (flush -> RecordingSink, one RocksDB WriteBatch) every
COMMIT_EVERY records. Stack = MeteredStore(str keys, json values) -> CachingStore ->
ChangeLoggingStore(RecordingSink) -> RocksDBStore. Raw = Rdict.get/put of the same key and value
bytes (no serdes, no cache, WAL on: RocksDB's defaults).

Final line: RESULT name=stores_cached_ops value=<ops/s> unit=ops/s baseline=<raw ops/s> ratio=<x>
"""
from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import rocksdict as rd  # noqa: E402

from statekit.stores import RecordingSink, StoreSpec, build_stores  # noqa: E402

RECORDS = int(os.environ.get("STATEKIT_BENCH_RECORDS", "300000"))
KEYS = 10_000
COMMIT_EVERY = 50_000
REPEATS = 5
TARGET = 300_000


def workload(seed: int = 7) -> list:
    rnd = random.Random(seed)
    # zipf-like: a few hot words, a long tail
    weights = [1.0 / (i + 1) for i in range(KEYS)]
    words = [f"word-{i}" for i in range(KEYS)]
    return rnd.choices(words, weights=weights, k=RECORDS)


def run_stack(keys: list, tmp: str) -> tuple:
    sink = RecordingSink()
    stores, db = build_stores([StoreSpec("counts", key_serde="str", value_serde="json")],
                              os.path.join(tmp, "task"), sink, cache_bytes=64 << 20)
    counts = stores["counts"]
    get = counts.get
    put = counts.put
    t0 = time.perf_counter()
    c0 = time.process_time()
    i = 0
    for w in keys:
        n = get(w)
        put(w, 1 if n is None else n + 1)
        i += 1
        if i % COMMIT_EVERY == 0:
            db.flush()
            sink.clear()
            db.commit({"batch": i})
    db.flush()
    db.commit({"batch": i})
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    m = counts.metrics()
    check = counts.get(keys[0])
    db.close()
    shutil.rmtree(os.path.join(tmp, "task"), ignore_errors=True)
    return 2 * len(keys) / dt, 2 * len(keys) / cpu, m, check


def run_raw(keys: list, tmp: str) -> tuple:
    path = os.path.join(tmp, "raw")
    db = rd.Rdict(path, rd.Options(raw_mode=True))
    kb = [w.encode() for w in keys]
    get = db.get
    put = db.__setitem__
    t0 = time.perf_counter()
    c0 = time.process_time()
    for k in kb:
        v = get(k)
        put(k, b"1" if v is None else b"%d" % (int(v) + 1))
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    check = int(db.get(kb[0]))
    db.close()
    rd.Rdict.destroy(path)
    shutil.rmtree(path, ignore_errors=True)
    return 2 * len(keys) / dt, 2 * len(keys) / cpu, check


def main() -> int:
    keys = workload()
    tmp = tempfile.mkdtemp(prefix="statekit-bench-stores-")
    try:
        print(f"{RECORDS:,} records (get+put each), {KEYS:,} keys, commit every {COMMIT_EVERY:,}; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
        stack_rates, raw_rates = [], []
        for r in range(REPEATS):  # interleaved, best of REPEATS: both see the same machine
            rate, cpu_rate, m, c1 = run_stack(keys, tmp)
            raw, raw_cpu, c2 = run_raw(keys, tmp)
            assert c1 == c2, (c1, c2)
            stack_rates.append(rate)
            raw_rates.append(raw)
            print(f"run {r + 1}: stack {rate:,.0f} ops/s ({cpu_rate:,.0f} per cpu-second)   "
                  f"raw rocksdict {raw:,.0f} ops/s ({raw_cpu:,.0f} per cpu-second)")
        cache = m.get("cache", {})
        print(f"cache: hits={cache.get('hits')} misses={cache.get('misses')} "
              f"evictions={cache.get('evictions')} forwarded={cache.get('forwarded')}")
        print(f"latency: get avg {m['get']['avg_us']:.2f} us, put avg {m['put']['avg_us']:.2f} us")
        best = max(stack_rates)
        base = max(raw_rates)
        ratio = best / base
        verdict = "meets" if best >= TARGET else "MISSES"
        print(f"stack {best:,.0f} ops/s {verdict} the {TARGET:,} ops/s target; "
              f"{ratio:.2f}x raw rocksdict ({base:,.0f} ops/s)")
        print(f"RESULT name=stores_cached_ops value={best:.0f} unit=ops/s baseline={base:.0f} "
              f"ratio={ratio:.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
