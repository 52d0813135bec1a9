"""Shared by the state tests and the writer subprocess: a seeded workload and its reference model.

Three stores exercise puts, read-modify-writes and tombstones: ``counts`` (word -> events),
``sums`` (word -> total amount) and ``latest`` (word -> last amount, deleted when it is a multiple
of 5). The reference applies the same events to dicts, so "nothing lost, nothing counted twice" is
an equality check.
"""
from __future__ import annotations

import random

from statekit.stores import StoreSpec

WORDS = [f"w{i:02d}" for i in range(24)]


def specs(cache: bool = True):
    return [StoreSpec("counts", caching=cache), StoreSpec("sums", caching=cache),
            StoreSpec("latest", caching=cache)]


def batch_events(seed: int, batch: int) -> list:
    r = random.Random(seed * 100_003 + batch)
    return [(r.choice(WORDS), r.randint(1, 50)) for _ in range(r.randint(3, 25))]


def apply_events(task, events) -> None:
    counts, sums, latest = task["counts"], task["sums"], task["latest"]
    for w, a in events:
        counts.put(w, (counts.get(w) or 0) + 1)
        sums.put(w, (sums.get(w) or 0) + a)
        if a % 5 == 0:
            latest.delete(w)
        else:
            latest.put(w, a)


def reference(seed: int, batches) -> dict:
    out = {"counts": {}, "sums": {}, "latest": {}}
    for b in batches:
        for w, a in batch_events(seed, b):
            out["counts"][w] = out["counts"].get(w, 0) + 1
            out["sums"][w] = out["sums"].get(w, 0) + a
            if a % 5 == 0:
                out["latest"].pop(w, None)
            else:
                out["latest"][w] = a
    return out


def run_batches(task, seed: int, batches) -> list:
    """Process the input batches Spark would hand the task (skipping those already applied)."""
    done = []
    for b in batches:
        if task.already_applied(b):
            continue
        apply_events(task, batch_events(seed, b))
        task.commit(b)
        done.append(b)
    return done


def contents(task) -> dict:
    return {name: dict(task[name].all()) for name in ("counts", "sums", "latest")}
