"""Bulk aggregation bench (issues 14 and 21): a task's micro-batches through `TaskProcessor` with
the record cache on, an aggregation applied column-wise per key (bulk) vs one record at a time.

The plan is a word count's second sub-topology (`group_by(word)` compiles to a repartition topic;
its task reads the repartition topic's partition, the words keyed by word). Each cycle: a batch of
`--batch` word records (zipf-distributed over `--keys` keys), a `Records` of key and value bytes as
the task reads them -> `plan.new_processor(ctx).process_batch(records)` -> flush -> close -> the
stores' flush and commit (RocksDB, one WriteBatch; the changelog into memory). The context has
`forward_columns`, as a worker's does. Records per second over `--batches` batches, for a count and
for a reduce with a Python function; bulk and per-record rounds alternate, the best of `--rounds`
is kept for each.

Baseline, in the same run: the same cycles with bulk aggregation off (`TaskProcessor.
bulk_aggregation = False`), i.e. the per-record path.

Last line: ``RESULT name=aggregate_bulk_count value=... unit=records/s baseline=... ratio=...``.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from statekit.stores import RecordingSink, build_stores  # noqa: E402
from statekit.topology import TaskProcessor, TopologyBuilder  # noqa: E402
from statekit.topology.records import Records  # noqa: E402


class Ctx:
    def __init__(self, stores, batch):
        self.task_id = 0
        self.batch_id = batch
        self.stream_time = -1
        self.cache_bytes = 10 << 20
        self.meta = {}
        self.stores = stores
        self.outputs = []

    def get_store(self, name):
        return self.stores[name]

    def forward(self, topic, k, v, timestamp=None):
        self.outputs.append((topic, k, v))

    def forward_columns(self, topic, keys, values, timestamps):
        self.outputs.append((topic, keys, values))


def plan_for(op: str):
    """The counting sub-topology of a word count (it reads <app>-agg-repartition)."""
    b = TopologyBuilder()
    g = b.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w)
    if op == "count":
        t = g.count(store="agg")
        t.to_stream().to("out", value_serde="int64")
    else:
        t = g.reduce(lambda a, v: a if len(a) >= len(v) else v, store="agg")
        t.to_stream().to("out")
    plan = b.compile("bench").subtopologies[1]
    assert plan.source_topics == ["bench-agg-repartition"] and plan.store_names == ["agg"]
    return plan


def batches_for(plan, n_batches: int, size: int, keys: int, seed: int = 7) -> list:
    """`Records` batches of one partition of the repartition topic: key = value = the word."""
    rng = random.Random(seed)
    words = [f"w{i:05d}".encode() for i in range(keys)]
    weights = [1.0 / (i + 1) for i in range(keys)]
    out = []
    for b in range(n_batches):
        ws = rng.choices(words, weights, k=size)
        offs = list(range(b * size, (b + 1) * size))
        out.append(Records.of(0, 0, offs, list(offs), ws, list(ws)))
    return out


def run(plan, batches, bulk: bool, workdir: str) -> float:
    """Records per second over all batches (a fresh task db each time)."""
    path = tempfile.mkdtemp(dir=workdir)
    stores, db = build_stores(plan.stores, path, RecordingSink(), cache_bytes=10 << 20, sync=False)
    TaskProcessor.bulk_aggregation = bulk
    n = 0
    try:
        t0 = time.perf_counter()
        for i, batch in enumerate(batches):
            ctx = Ctx(stores, i)
            proc = plan.new_processor(ctx)
            assert bool(proc._bulk) == bulk, "the bulk path should be on exactly when asked"
            n += proc.process_batch(batch)
            proc.flush()
            proc.close()
            db.flush()
            db.commit({"batch": i})
        return n / (time.perf_counter() - t0)
    finally:
        TaskProcessor.bulk_aggregation = True
        db.close()
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--keys", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="statekit-bench-bulk-")
    try:
        figures = {}
        for op in ("reduce", "count"):
            plan = plan_for(op)
            batches = batches_for(plan, a.batches, a.batch, a.keys)
            best = {True: 0.0, False: 0.0}
            for _ in range(a.rounds):
                for bulk in (False, True):
                    best[bulk] = max(best[bulk], run(plan, batches, bulk, workdir))
            figures[op] = best
            print(f"{op:7s} per record {best[False]:12,.0f} records/s   bulk {best[True]:12,.0f} "
                  f"records/s   x{best[True] / best[False]:.2f}   ({a.batches} batches of {a.batch}, "
                  f"{a.keys} keys)")
        c = figures["count"]
        print(f"RESULT name=aggregate_bulk_count value={c[True]:.0f} unit=records/s "
              f"baseline={c[False]:.0f} ratio={c[True] / c[False]:.3f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
