"""Run word-count batches with the local engine in a separate process (the crash tests kill it).

    python crash_worker.py BOOTSTRAP STATE_DIR CONTROL_DIR SEED FIRST_BATCH LAST_BATCH

The words come keyed by word (what a word count's repartition topic holds), so each task's count
is fed straight by its source: the bulk path, which a crash "after N records" cuts in two.
Prints one JSON line per completed batch: {"batch": b, "outputs": n}.
"""
from __future__ import annotations

import json
import random
import sys

APP = "crashwc"
PARTITIONS = 3
VOCAB = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]


def build_plan():
    from statekit.topology import TopologyBuilder

    b = TopologyBuilder()
    (b.stream("words").group_by_key()
     .count(store="counts").to_stream().to("counts-out", value_serde="int64"))
    return b.compile()


def batches(seed: int, n: int = 6, lines: int = 30) -> list:
    """Batches of (topic, word, word, ts): a line's words, line after line."""
    rnd = random.Random(seed)
    out = []
    ts = 0
    for _ in range(n):
        batch = []
        for _ in range(lines):
            ts += 1
            batch.extend(("words", w, w, ts) for w in
                         (rnd.choice(VOCAB) for _ in range(rnd.randint(1, 6))))
        out.append(batch)
    return out


def engine(bootstrap: str, state_dir: str, control_dir: str | None):
    from statekit.engine.local import LocalEngine

    return LocalEngine(build_plan(), APP, bootstrap, state_dir, PARTITIONS, control_dir=control_dir,
                       task_instances={t: 0 for t in range(PARTITIONS)})


def main(argv) -> None:
    bootstrap, state_dir, control_dir, seed, first, last = argv
    eng = engine(bootstrap, state_dir, control_dir)
    data = batches(int(seed))
    for b in range(int(first), int(last) + 1):
        out = eng.run_batch(data[b], batch_id=b)
        print(json.dumps({"batch": b, "outputs": len(out)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
