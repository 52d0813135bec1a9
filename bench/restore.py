"""Restore bench: 1M changelog records over 100k keys, from the embedded broker into RocksDB.

Starts its own broker on port 0 in a temp dir (stopped at the end, also on failure), writes a
changelog the way a task does (records with the ``statekit.batch`` header, a commit marker after
every 10k records), then

* restores it into a fresh task's RocksDB through ``TaskState`` (statekit.kafka.read + the replay
  loop + RocksDB WriteBatches): records/s = changelog records read / restore wall time;
* baseline: a bare kafka-python ``KafkaConsumer`` reading the same partition start to end (no
  RocksDB at all), in the same run.

Last line: ``RESULT name=restore value=... unit=records/s baseline=... ratio=...``.
Options: ``--records N --keys K`` (defaults 1_000_000 / 100_000).
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
from statekit.state.restore import BATCH_HEADER, MARKER_HEADER, MARKER_KEY  # noqa: E402
from statekit.stores import StoreSpec  # noqa: E402

APP = "bench"
STORE = "counts"
TOPIC = f"{APP}-{STORE}-changelog"


def seed(kafka: Kafka, n: int, keys: int, per_commit: int = 10_000) -> int:
    kafka.ensure_topic(TOPIC, 1, {"cleanup.policy": "compact"})
    keyb = [json.dumps(f"key-{i:06d}").encode() for i in range(keys)]
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


def baseline(bootstrap: str, end: int) -> tuple[float, int]:
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(TOPIC, 0)
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                      auto_offset_reset="earliest")
    try:
        c.assign([tp])
        c.seek_to_beginning(tp)
        t0 = time.perf_counter()
        n = 0
        pos = 0
        while pos < end:
            for _tp, recs in c.poll(timeout_ms=1000).items():
                n += len(recs)
                if recs:
                    pos = recs[-1].offset + 1
        dt = time.perf_counter() - t0
    finally:
        c.close()
    return n / dt, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="statekit-bench-restore-")
    handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
    kafka = None
    try:
        kafka = Kafka(handle.bootstrap)
        t0 = time.perf_counter()
        end = seed(kafka, args.records, args.keys)
        print(f"seeded {end} changelog records ({args.records} data + markers) over {args.keys} "
              f"keys in {time.perf_counter() - t0:.1f}s", flush=True)

        base_rate, base_n = baseline(handle.bootstrap, end)
        print(f"baseline KafkaConsumer: {base_n} records in {base_n / base_rate:.2f}s = "
              f"{base_rate:,.0f} records/s", flush=True)

        t0 = time.perf_counter()
        task = TaskState(APP, 0, [StoreSpec(STORE)], state_dir=os.path.join(work, "state"),
                         kafka=kafka, num_tasks=1)
        dt = time.perf_counter() - t0
        try:
            m = task.restore_metrics[STORE]
            n = m.records_restored
            count = sum(1 for _ in task.db.items(STORE))
            assert count == args.keys, f"restored {count} keys, expected {args.keys}"
            assert m.replayed_from == "scratch"
        finally:
            task.close()
        rate = n / dt
        print(f"statekit restore: {n} records ({m.records_applied} applied, {count} keys) in "
              f"{dt:.2f}s = {rate:,.0f} records/s (restore loop alone {m.rate:,.0f}/s)", flush=True)
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
