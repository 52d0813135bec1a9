"""Two engines, one input, one crash: the changelog engine (Kafka Streams' model: local RocksDB +
changelog topics, restore by replaying the changelog) against Spark's own RocksDB state store
(changelog checkpointing: restore = latest snapshot + the changelog files since).

Starts its own broker on port 0 in a temp dir and one local Spark session; both are stopped at the
end, also on failure. The scenario is `statekit.compare_engines.compare_engines`:

1. word count + 40 ms windowed click count over the same backlog, one engine at a time,
   `--per-trigger` records per micro-batch;
2. the crash: the changelog engine's instance loses its disk (query aborted, state dirs deleted);
   more input arrives and the Spark JVM is SIGKILLed while a native micro-batch runs, Spark's local
   RocksDB working dirs deleted;
3. both restart and catch up; results checked against plain Python.

Restore time is what each engine reports for loading its state, summed over tasks / state
partitions: the changelog engine's restore_end events, Spark's `rocksdbLoadLatencyMs` of the first
batch after the restart. Steady-state throughput: input records / micro-batch time (first batch of
each engine left out).

Last line: ``RESULT name=engines_restore value=<native restore s> unit=s baseline=<changelog engine
restore s> ratio=<native/changelog>``.
Options: ``--chunks N --lines L --clicks C --per-trigger M --min-deltas D``.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--lines", type=int, default=150)
    ap.add_argument("--clicks", type=int, default=100)
    ap.add_argument("--per-trigger", type=int, default=250)
    ap.add_argument("--min-deltas", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=2)
    args = ap.parse_args()

    from statekit.compare_engines import compare_engines
    from statekit.engine.spark_native.engine import stop_native_session

    work = tempfile.mkdtemp(prefix="statekit-bench-engines-")
    t0 = time.time()
    handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
    try:
        r = compare_engines(handle.bootstrap, handle.dir, work, chunks=args.chunks, lines=args.lines,
                            clicks=args.clicks, partitions=args.partitions,
                            max_records_per_trigger=args.per_trigger,
                            min_deltas_for_snapshot=args.min_deltas, maintenance_interval=1,
                            say=lambda s: print(f"[{time.time() - t0:6.1f}s] {s}", flush=True))
    finally:
        try:
            stop_native_session()
        finally:
            handle.stop()
            shutil.rmtree(work, ignore_errors=True)
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(r["table"].to_string(index=False))
    n, c = r["native"], r["changelog"]
    lag = n["changelog_lag_at_crash"]
    print(f"native changelog lag on disk at the crash: {lag.changelog_lag.tolist()} versions per partition "
          f"(last snapshots {lag.last_snapshot.tolist()}); replayed {n['replayed']} files, "
          f"snapshot load {n['snapshot_load_s']:.3f}s, replay {n['replay_s']:.3f}s, "
          f"{n['loaded_from_checkpoint']} partitions loaded from the checkpoint")
    print(f"changelog engine replayed {c['replayed']} changelog records over "
          f"{len(c['restore_summary'])} task-store restores")

    def ratio(a, b):
        return a / b if b else float("nan")

    print(f"restore (engine-reported, summed): native {n['restore_s']:.3f}s, changelog {c['restore_s']:.3f}s, "
          f"ratio {ratio(n['restore_s'], c['restore_s']):.2f}")
    print(f"first batch after restart: native {n['first_batch_after_restart_s']:.2f}s, changelog "
          f"{c['first_batch_after_restart_s']:.2f}s, ratio "
          f"{ratio(n['first_batch_after_restart_s'], c['first_batch_after_restart_s']):.2f}")
    print(f"steady state: native {n['steady_records_per_s']:.0f} records/s, changelog "
          f"{c['steady_records_per_s']:.0f} records/s, ratio "
          f"{ratio(n['steady_records_per_s'], c['steady_records_per_s']):.2f}")
    print(f"bytes on disk: native checkpoint {n['bytes_on_disk']}, changelog engine "
          f"{c['bytes_on_disk']} (changelog topics {c['changelog_topic_bytes']}); "
          f"correct: native={n['correct']} changelog={c['correct']}; total {time.time() - t0:.0f}s")
    print(f"RESULT name=engines_restore value={n['restore_s']:.4g} unit=s baseline={c['restore_s']:.4g} "
          f"ratio={ratio(n['restore_s'], c['restore_s']):.3g}")
    if not (n["correct"] and c["correct"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
