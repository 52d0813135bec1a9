"""Datagen bench: how fast seeded records reach the embedded broker.

Starts its own broker on port 0 in a temp dir (stopped at the end, also on failure), then writes
the first N records of the ``accounts`` generator (1,000,000 accounts) to a 4-partition topic

* with ``statekit.datagen.produce_fast`` (records built, partitioned and encoded column-wise with
  numpy, pre-encoded record batches written with raw pipelined Produce requests), from a cold
  process (the generator's caches are built inside the timing);
* baseline: the existing path, ``datagen.produce`` over ``generate("accounts")`` (a record at a
  time, ``Kafka.send`` per 500 records), on a smaller count, in the same run;
* for information: ``produce_fast`` with the ``words`` generator (walked in Python, encoded in bulk).

Every topic's end offsets are checked to add up to what was written.
Last line: ``RESULT name=datagen_fast value=... unit=records/s baseline=... ratio=...``.
Options: ``--records N`` (default 2,000,000), ``--baseline-records N`` (default 100,000),
``--keys K`` (default 1,000,000).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from statekit import broker as broker_mod  # noqa: E402
from statekit import datagen  # noqa: E402
from statekit.kafka import Kafka  # noqa: E402


def written(kafka: Kafka, topic: str) -> int:
    return sum(kafka.end_offsets(topic).values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--baseline-records", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="statekit-bench-datagen-")
    handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
    kafka = None
    try:
        kafka = Kafka(handle.bootstrap)
        t0 = time.perf_counter()
        datagen.produce_fast("fast", "accounts", 42, args.records, keys=args.keys, kafka=kafka)
        dt = time.perf_counter() - t0
        assert written(kafka, "fast") == args.records
        rate = args.records / dt
        print(f"produce_fast accounts: {args.records:,} records in {dt:.2f}s = {rate:,.0f} "
              f"records/s", flush=True)

        n = args.baseline_records
        t0 = time.perf_counter()
        datagen.produce("slow", datagen.generate("accounts", 42, keys=args.keys), limit=n,
                        kafka=kafka)
        dt = time.perf_counter() - t0
        assert written(kafka, "slow") == n
        base = n / dt
        print(f"baseline produce() accounts: {n:,} records in {dt:.2f}s = {base:,.0f} records/s",
              flush=True)

        t0 = time.perf_counter()
        datagen.produce_fast("words", "words", 42, n, kafka=kafka)
        dt = time.perf_counter() - t0
        assert written(kafka, "words") == n
        print(f"produce_fast words (generated in Python): {n:,} records = {n / dt:,.0f} "
              f"records/s", flush=True)
        print(f"RESULT name=datagen_fast value={rate:.0f} unit=records/s baseline={base:.0f} "
              f"ratio={rate / base:.2f}")
        return 0
    finally:
        if kafka is not None:
            kafka.close()
        handle.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
