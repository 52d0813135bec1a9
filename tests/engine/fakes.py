"""Small stand-ins for the topology Plan and the runtime's task runner, so the engine can be tested
on its own. The task function keeps per-task word counts in a JSON file and skips batch ids it has
already applied (the same rule the real task runner follows)."""
from __future__ import annotations

import json
import os


class WordCountPlan:
    """lines topic -> split into words -> count per word -> (sink, word, count)."""

    def __init__(self, topic="lines", sink="counts"):
        self.sources = [{"topic": topic, "role": "stream"}]
        self.sinks = [sink]
        self.sink = sink

    def pre_shuffle_bytes(self, source_index, key, value, timestamp):
        for w in (value or b"").split():
            yield w, b"1"


def json_count_task(spec, task, batch_id, records):
    """spec: {"dir": DIR, "sink": TOPIC}; state in DIR/task-<t>.json = {"batch": b, "counts": {}}"""
    path = os.path.join(spec["dir"], f"task-{task}.json")
    state = {"batch": -1, "counts": {}}
    if os.path.exists(path):
        with open(path) as fh:
            state = json.load(fh)
    if batch_id <= state["batch"]:
        return []
    counts = state["counts"]
    touched = {}
    for _si, key, _value, _ts, _off in records:
        w = key.decode()
        counts[w] = counts.get(w, 0) + 1
        touched[w] = counts[w]
    state["batch"] = batch_id
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)
    with open(os.path.join(spec["dir"], f"log-{task}.jsonl"), "a") as fh:
        fh.write(json.dumps({"batch": batch_id, "n": len(records),
                             "keys": sorted({r[1].decode() for r in records})}) + "\n")
    return [(spec["sink"], w.encode(), str(c).encode()) for w, c in sorted(touched.items())]
