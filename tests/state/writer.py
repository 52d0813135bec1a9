"""A task writer process for the crash tests: opens (restores) a task and processes seeded input
batches [0, N), skipping the applied ones, as a Spark task would on a replay. Crash hooks come from
STATEKIT_CRASH (SIGKILL by default). Prints one JSON line with what it saw."""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from statekit.kafka import Kafka  # noqa: E402
from statekit.state import TaskState  # noqa: E402

import statehelpers as H  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--app", required=True)
    ap.add_argument("--task", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batches", type=int, required=True)
    ap.add_argument("--fetch-max-bytes", type=int, default=None)
    ap.add_argument("--no-cache", action="store_true")
    a = ap.parse_args()
    k = Kafka(a.bootstrap)
    task = TaskState(a.app, a.task, H.specs(not a.no_cache), state_dir=a.state_dir, kafka=k,
                     num_tasks=a.task + 1, fetch_max_bytes=a.fetch_max_bytes)
    restored = {n: m.as_dict() for n, m in task.restore_metrics.items()}
    start_batch = task.last_batch
    done = H.run_batches(task, a.seed, range(a.batches))
    out = {"start_batch": start_batch, "done": done, "restored": restored, "notices": task.notices,
           "contents": H.contents(task)}
    task.close()
    k.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
