"""Small stand-ins for the topology Plan and the runtime's task runner, so the engine can be tested
on its own (same seams: `Plan.shuffle` and `run_task_batch(spec, task, batch_id, records)`).

The task function keeps per-task word counts in a JSON file, skips batch ids it has already applied
(the rule the real task runner follows) and obeys a one-shot crash file: it SIGKILLs its own Python
worker mid-batch, which fails the Spark query."""
from __future__ import annotations

import json
import os
import pickle
import signal

from statekit.partition import partition_for


class WordCountPlan:
    """lines topic -> split into words -> count per word -> (sink, word, count)."""

    def __init__(self, topic="lines", sink="counts"):
        self.sources = [{"topic": topic, "role": "stream"}]
        self.sinks = [sink]

    def shuffle(self, source_index, key, value, timestamp, partition, offset, partitions):
        for w in (value or b"").split():
            yield partition_for(w, partitions), (0, partition, offset, timestamp,
                                                  pickle.dumps(w.decode()), pickle.dumps(1))


def json_count_task(spec, task, batch_id, records):
    """spec: {"dir": DIR, "sink": TOPIC}; state in DIR/task-<t>.json = {"batch": b, "counts": {}}.
    A file DIR/crash-<t>-<b> makes task t kill its worker in batch b (once: the file is claimed)."""
    d = spec["dir"]
    path = os.path.join(d, f"task-{task}.json")
    state = {"batch": -1, "counts": {}}
    if os.path.exists(path):
        with open(path) as fh:
            state = json.load(fh)
    with open(os.path.join(d, f"log-{task}.jsonl"), "a") as fh:
        fh.write(json.dumps({"batch": batch_id, "n": len(records), "applied": state["batch"],
                             "pid": os.getpid()}) + "\n")
    if batch_id <= state["batch"]:
        return []
    counts = state["counts"]
    touched = {}
    for i, (_route, _part, _off, _ts, kp, vp) in enumerate(records):
        w = pickle.loads(kp)
        counts[w] = counts.get(w, 0) + pickle.loads(vp)
        touched[w] = counts[w]
        if i == len(records) // 2:
            crash = os.path.join(d, f"crash-{task}-{batch_id}")
            try:
                os.rename(crash, crash + ".claimed")
            except OSError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
    state["batch"] = batch_id
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)
    return [(spec["sink"], w.encode(), str(c).encode()) for w, c in sorted(touched.items())]


def read_counts(d):
    out = {}
    for name in os.listdir(d):
        if name.startswith("task-") and name.endswith(".json"):
            with open(os.path.join(d, name)) as fh:
                for w, c in json.load(fh)["counts"].items():
                    assert w not in out, f"{w} counted by two tasks"
                    out[w] = c
    return out
