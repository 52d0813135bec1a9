"""Task cycle bench: what one micro-batch of one task costs when there is nothing to restore.

``run_task_batch`` opens a ``TaskState`` per task per micro-batch. This bench runs that cycle with
the task state layer alone (no Spark): open the task (RocksDB, checkpoint, changelog end offsets)
-> process 1k records (a word count: get + put on a kv store, plus the runtime's ``_task`` store
holding an outbox and the stream time) -> commit (changelog records + markers, acks=all, one
fsynced RocksDB WriteBatch, checkpoint) -> close. Cycles per second over ``--cycles`` cycles.

Baseline, in the same run and on the same disk: a bare rocksdict cycle with the same durability
and the same data written — open a RocksDB with two column families, put the 1k records' results in
one WriteBatch, write it with fsync, close. No Kafka, no checkpoint, no caches.

Starts its own broker on port 0 in a temp dir (stopped at the end, also on failure).
``--profile`` prints a cProfile of the TaskState cycles (cumulative time, top entries).

Last line: ``RESULT name=task_cycle value=... unit=cycles/s baseline=... ratio=...``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from statekit import broker as broker_mod  # noqa: E402
from statekit.kafka import Kafka  # noqa: E402
from statekit.state import TaskState  # noqa: E402
from statekit.stores import StoreSpec  # noqa: E402

APP = "tcycle"
RECORDS = 1000
WORDS = [f"word{i:04d}" for i in range(500)]


def specs():
    return [StoreSpec("counts"),
            StoreSpec("_task", key_serde="bytes", value_serde="bytes", caching=False)]


def one_cycle(kafka: Kafka, state_dir: str, batch: int) -> None:
    with TaskState(APP, 0, specs(), state_dir=state_dir, kafka=kafka, num_tasks=1) as t:
        if t.already_applied(batch):
            raise RuntimeError(f"batch {batch} already applied")
        counts = t["counts"]
        base = batch * 7
        for i in range(RECORDS):
            w = WORDS[(base + i * 13) % len(WORDS)]
            counts.put(w, (counts.get(w) or 0) + 1)
        t["_task"].put(b"stream_time", (batch * 1000).to_bytes(8, "big"))
        t["_task"].put(b"outbox", json.dumps({"batch": batch, "chunks": 0, "records": 0}).encode())
        t.commit(batch)


def bare_cycle(path: str, batch: int) -> None:
    import rocksdict as rd

    o = rd.Options(raw_mode=True)
    o.create_if_missing(True)
    o.create_missing_column_families(True)
    db = rd.Rdict(path, o, column_families={"counts": rd.Options(raw_mode=True),
                                            "_task": rd.Options(raw_mode=True)})
    counts = db.get_column_family_handle("counts")
    task = db.get_column_family_handle("_task")
    wb = rd.WriteBatch(raw_mode=True)
    base = batch * 7
    seen = {}
    for i in range(RECORDS):
        w = WORDS[(base + i * 13) % len(WORDS)]
        seen[w] = seen.get(w, 0) + 1
    for w, n in seen.items():
        wb.put(json.dumps(w).encode(), str(n).encode(), counts)
    wb.put(b"stream_time", (batch * 1000).to_bytes(8, "big"), task)
    wo = rd.WriteOptions()
    wo.sync = True
    db.write(wb, wo)
    db.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="statekit-task-cycle-")
    handle = broker_mod.start(dir=os.path.join(tmp, "broker"), port=0)
    try:
        kafka = Kafka(handle.bootstrap)
        state_dir = os.path.join(tmp, "state")
        one_cycle(kafka, state_dir, 0)  # creates the changelogs, first checkpoint
        one_cycle(kafka, state_dir, 1)
        batch = 2
        prof = None
        if args.profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        c0 = time.process_time()
        for _ in range(args.cycles):
            one_cycle(kafka, state_dir, batch)
            batch += 1
        el = time.perf_counter() - t0
        cpu = time.process_time() - c0
        if prof is not None:
            import pstats

            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
        value = args.cycles / el
        # sanity: the state is exactly what the cycles wrote, and a reopen replays nothing
        with TaskState(APP, 0, specs(), state_dir=state_dir, kafka=kafka) as t:
            assert t.last_batch == batch - 1, t.last_batch
            assert all(m.records_restored == 0 for m in t.restore_metrics.values())
            total = sum(v for _k, v in t["counts"].all())
            assert total == RECORDS * batch, (total, RECORDS * batch)
        kafka.close()

        bare = os.path.join(tmp, "bare")
        bare_cycle(bare, 0)
        t0 = time.perf_counter()
        for i in range(args.cycles):
            bare_cycle(bare, i + 1)
        bel = time.perf_counter() - t0
        baseline = args.cycles / bel
        print(f"task cycle: {1000 * el / args.cycles:.2f} ms/cycle ({1000 * cpu / args.cycles:.2f} "
              f"ms CPU in this process); bare rocksdict cycle: {1000 * bel / args.cycles:.2f} "
              f"ms/cycle")
        print(f"RESULT name=task_cycle value={value:.1f} unit=cycles/s baseline={baseline:.1f} "
              f"ratio={value / baseline:.3f}")
    finally:
        handle.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
