"""Every bench/*.py still runs on its own, prints its figures (``FIGURE`` lines) and ends with one
summary line (``RESULT``), at tiny sizes: this checks that the benches work, not how fast anything
is; speed is only ever read from `make bench`."""
from __future__ import annotations

import glob
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# small arguments per bench, and the names it must print (in order; the last one is the RESULT)
SMALL = {
    "aggregate_bulk": (["--batches", "2", "--batch", "2000", "--keys", "200", "--rounds", "1"], {},
                       ["aggregate_bulk_count"]),
    "broker": (["--records-in", "40000", "--tls-records", "20000", "--client-records", "20000",
                "--txn-records", "20000", "--compact-records", "20000"],
               {}, ["broker_in", "broker_out", "tls_in", "tls_out", "client_produce", "client_consume",
                    "txn_produce", "compact_1m"]),
    "stores": ([], {"STATEKIT_BENCH_RECORDS": "20000"}, ["stores_cached_ops"]),
    "restore": (["--records", "20000", "--keys", "2000"], {}, ["restore"]),
    "datagen": (["--records", "30000", "--baseline-records", "3000", "--keys", "20000"], {},
                ["datagen_fast"]),
    "task_cycle": (["--cycles", "5"], {}, ["task_cycle"]),
    "pipeline": (["--words", "20000", "--batch-words", "5000", "--warmup-words", "5000",
                  "--rounds", "1", "--latency-rate", "200", "--latency-seconds", "3",
                  "--events", "4000", "--event-batch", "1000", "--warmup-events", "1000"],
                 {}, ["pipeline_exactly_once", "pipeline_latency_p50", "pipeline_latency_p95",
                      "pipeline_first_batch", "pipeline_join", "pipeline_session",
                      "pipeline_wordcount"]),
    "dashboard": (["--keys", "20000", "--rounds", "1", "--idle-s", "5"], {},
                  ["restore_forecast_over_measured_quiet", "restore_forecast_over_measured_loaded"]
                  + [f"dashboard_refresh_p{p}_{phase}_{cond}" for cond in ("quiet", "loaded")
                   for phase in ("idle", "restoring") for p in (50, 95)
                   if (p, phase, cond) != (95, "restoring", "loaded")]
                  + ["dashboard_refresh_p95_restoring_loaded"]),
    "failover": (["--rate", "1000", "--window", "2", "--restart-words", "5000"], {}, ["failover_recovery", "failover_survivors", "restart_first_record"]),
    "engines": (["--chunks", "2", "--lines", "20", "--clicks", "10", "--per-trigger", "100"], {},
                ["engines_restore"]),
    "ingest": (["--records", "20000", "--latency-seconds", "3"], {},
               ["ingest_count_vs_rocksdb", "ingest_aggregate", "ingest_keyed_count", "ingest_start",
                "ingest_latency_p50", "ingest_count"]),
    "serdes": (["--records", "20000", "--rounds", "1"], {},
               ["serdes_produce", "serdes_aggregate", "serdes_count"]),
    "footprint": (["--records", "2000", "--seconds", "2", "--idle-wait", "2", "--launches", "2"], {},
                  ["footprint_idle_cpu", "footprint_cold_launch", "footprint_pss"]),
    "connect": (["--records", "20000", "--warm-records", "5000"], {}, ["connect_count"]),
    "workshop": (["--kernels", "2", "--idle-seconds", "2"], {},
                 ["workshop_first_numbers_max", "workshop_kernel_pss_max", "workshop_room_idle_cpu",
                  "workshop_room_pss"]),
    "cluster": (["--batches", "3", "--keys", "2000", "--per-batch", "500", "--kill-keys", "5000",
                 "--settle", "2"], {},
                ["cluster_restored_after_first", "cluster_batch_ms",
                 "cluster_batch_ms_locality_off", "cluster_kill_recovery", "cluster_kill_restored",
                 "cluster_kill_recovery_one_standby", "cluster_kill_restored_one_standby",
                 "cluster_task_moves"]),
}
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
LINE = re.compile(rf"^(?:FIGURE|RESULT) name=(\w+) value=({NUM}) unit=(\S+) baseline=({NUM}) "
                  rf"ratio=({NUM})$")


# what decides a bench's shape (tasks, instances, topics, the phases it runs): the small runs keep
# each bench's defaults for these and shrink only record counts and durations
SHAPE = ("--partitions", "--instances", "--skip", "--skip-tws", "--only", "--phases", "--order")


def test_small_runs_keep_every_bench_s_shape():
    changed = {name: [a for a in args if a.split("=")[0] in SHAPE] for name, (args, _e, _n) in SMALL.items()}
    assert not {k: v for k, v in changed.items() if v}


def test_every_bench_has_small_arguments_here():
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "bench", "*.py")))
    assert names == sorted(SMALL)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a bench at its defaults' shape on a busy machine (pipeline: Spark's own engine too)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_bench_runs_and_ends_with_its_result_lines(name, tmp_path):
    args, env, expected = SMALL[name]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", f"{name}.py"), *args],
                          cwd=str(tmp_path), env={**os.environ, **env, "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FIGURE ", "RESULT "))]
    assert lines, proc.stdout[-2000:]
    summary = [ln for ln in lines if ln.startswith("RESULT ")]
    assert len(summary) == 1, summary                               # one summary line ...
    assert proc.stdout.rstrip().splitlines()[-1] == summary[0]     # ... and it ends the output
    got = [LINE.match(ln) for ln in lines]
    assert all(got), lines
    assert [m.group(1) for m in got] == expected
    for m in got:
        # a measured figure and a measured, positive baseline (an overhead may come out negative
        # on a run this small: noise, not a failure)
        assert math.isfinite(float(m.group(2))) and float(m.group(4)) > 0, m.group(0)
