"""Restore bench: a 1,000,000-key changelog from the embedded broker into RocksDB.

Starts its own broker on port 0 in a temp dir (stopped at the end, also on failure), writes a
changelog the way a task does (records with the ``statekit.batch`` header, a commit marker after
every 10k records), then

* restores it into a fresh task's RocksDB through ``TaskState`` (statekit.kafka.read, column-wise
  decoding, the replay loop, RocksDB WriteBatches), with a progress listener attached:
  records/s = changelog records read / restore wall time; prints how often the listener heard;
* a standby replica catching up on the same changelog from nothing (the same replay path);
* baseline: rocksdict alone writing the same keys and values (already bytes in memory) through
  WriteBatches of 50k records into a fresh RocksDB with the same options, in the same run.

The keys come in a seeded random order, as a task's changelog has them (hashed keys, arriving as
records do): a sorted run would let RocksDB move its level-0 files down without compacting them and
restore about three times faster than any real changelog does (``--order sorted`` shows it).

Last line: ``RESULT name=restore value=... unit=records/s baseline=... ratio=...``.
Options: ``--records N --keys K --order random|sorted`` (defaults 1_000_000 / 1_000_000 / random).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from statekit import broker as broker_mod  # noqa: E402
from statekit.kafka import Kafka  # noqa: E402
from statekit.state import TaskState  # noqa: E402
from statekit.state.restore import BATCH_HEADER, MARKER_HEADER, MARKER_KEY  # noqa: E402
from statekit.stores import StoreSpec  # noqa: E402

APP = "bench"
STORE = "counts"
TOPIC = f"{APP}-{STORE}-changelog"


def key_bytes(keys: int, order: str) -> list:
    keyb = [json.dumps(f"key-{i:06d}").encode() for i in range(keys)]
    if order == "random":
        random.Random(7).shuffle(keyb)
    return keyb


def seed(kafka: Kafka, n: int, keys: int, order: str, per_commit: int = 10_000) -> int:
    kafka.ensure_topic(TOPIC, 1, {"cleanup.policy": "compact"})
    keyb = key_bytes(keys, order)
    written = 0
    batch = 0
    while written < n:
        m = min(per_commit, n - written)
        bh = [(BATCH_HEADER, str(batch).encode())]
        recs = [(keyb[(written + i) % keys], b"%d" % (written + i), bh) for i in range(m)]
        recs.append((MARKER_KEY, json.dumps({"batch": batch}).encode(),
                     [(MARKER_HEADER, b"1"), (BATCH_HEADER, str(batch).encode())]))
        kafka.send(TOPIC, 0, recs)
        written += m
        batch += 1
    return kafka.end_offsets(TOPIC)[0]


def baseline(work: str, n: int, keys: int, order: str) -> float:
    """rocksdict alone: the same keys and values, in the same order, through 50k-record
    WriteBatches."""
    import rocksdict as rd

    from statekit.stores.rocksdb import _options

    keyb = key_bytes(keys, order)
    ks = [keyb[i % keys] for i in range(n)]
    vs = [b"%d" % i for i in range(n)]
    path = os.path.join(work, "baseline-rocksdb")
    db = rd.Rdict(path, _options(), column_families={STORE: _options()})
    try:
        h = db.get_column_family_handle(STORE)
        wo = rd.WriteOptions()
        wo.sync = False
        t0 = time.perf_counter()
        for i in range(0, n, 50_000):
            wb = rd.WriteBatch(raw_mode=True)
            for k, v in zip(ks[i:i + 50_000], vs[i:i + 50_000]):
                wb.put(k, v, h)
            db.write(wb, wo)
        dt = time.perf_counter() - t0
    finally:
        db.close()
    return n / dt


class Progress:
    """A restore listener that notes when it is called (what a progress bar would see)."""

    def __init__(self):
        self.times = []

    def on_restore_start(self, store, partition, start, end):
        self.times.append(time.perf_counter())

    def on_batch_restored(self, store, partition, end_offset, n):
        self.times.append(time.perf_counter())

    def on_restore_end(self, store, partition, total):
        self.times.append(time.perf_counter())


def standby_catch_up(bootstrap: str, work: str, end: int) -> float:
    from statekit.state import StandbyReplica

    sb = StandbyReplica(APP, 0, [StoreSpec(STORE)], state_dir=os.path.join(work, "standby"),
                        bootstrap=bootstrap)
    try:
        t0 = time.perf_counter()
        sb.start()
        lag = sb.wait_caught_up(timeout=120)
        dt = time.perf_counter() - t0
        assert lag == 0, f"standby still {lag} records behind"
    finally:
        sb.close()
    return end / dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--order", choices=["random", "sorted"], default="random")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="statekit-bench-restore-")
    handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
    kafka = None
    try:
        kafka = Kafka(handle.bootstrap)
        t0 = time.perf_counter()
        end = seed(kafka, args.records, args.keys, args.order)
        print(f"seeded {end} changelog records ({args.records} data + markers) over {args.keys} "
              f"keys ({args.order} order) in {time.perf_counter() - t0:.1f}s", flush=True)

        base_rate = baseline(work, args.records, args.keys, args.order)
        print(f"baseline rocksdict WriteBatch: {args.records} puts = {base_rate:,.0f} records/s",
              flush=True)

        prog = Progress()
        t0 = time.perf_counter()
        task = TaskState(APP, 0, [StoreSpec(STORE)], state_dir=os.path.join(work, "state"),
                         kafka=kafka, num_tasks=1, listener=prog)
        dt = time.perf_counter() - t0
        try:
            m = task.restore_metrics[STORE]
            n = m.records_restored
            count = sum(1 for _ in task.db.items(STORE))
            assert count == min(args.keys, args.records), f"restored {count} keys"
            assert m.replayed_from == "scratch"
        finally:
            task.close()
        rate = n / dt
        gaps = [b - a for a, b in zip(prog.times, prog.times[1:])]
        print(f"statekit restore: {n} records ({m.records_applied} applied, {count} keys) in "
              f"{dt:.2f}s = {rate:,.0f} records/s (restore loop alone {m.rate:,.0f}/s); progress "
              f"heard {len(prog.times) - 2} times, longest gap {max(gaps, default=0) * 1000:.0f} ms",
              flush=True)
        sb_rate = standby_catch_up(handle.bootstrap, work, end)
        print(f"standby catching up from nothing: {sb_rate:,.0f} records/s", flush=True)
        print(f"RESULT name=restore value={rate:.0f} unit=records/s baseline={base_rate:.0f} "
              f"ratio={rate / base_rate:.2f}")
        return 0
    finally:
        if kafka is not None:
            kafka.close()
        handle.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
