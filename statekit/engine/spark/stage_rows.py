"""What a statekit query's stage reads and writes: the `tasks` source's rows (a stream task and its
offset ranges) and the output schema, shared by the instances placement (`engine.spark.engine`) and
the executors placement (`engine.spark.executors`); and the per-task trace both write."""
from __future__ import annotations

OUTPUT_SCHEMA = "topic string, key binary, value binary"


def trace(entry: dict) -> None:
    """STATEKIT_ENGINE_TRACE=/path.jsonl: workers append per-task timings (a debugging aid)."""
    import os

    path = os.environ.get("STATEKIT_ENGINE_TRACE")
    if path:
        import json

        with open(path, "a") as fh:
            fh.write(json.dumps(entry) + "\n")


def task_rows(batches):
    """The (task, ranges) rows of the source's `tasks` mode, from Arrow record batches."""
    import json

    for rb in batches:
        if rb.num_rows == 0:
            continue
        for task, ranges in zip(rb.column("task").to_pylist(), rb.column("ranges").to_pylist()):
            yield int(task), [tuple(r) for r in json.loads(ranges)]
