"""A task's micro-batch, read where the task runs: its offset ranges into `Records`.

A micro-batch of a sub-topology is one offset range per source partition (the engine plans it and
logs it: Spark's offset log, or the local engine's). Task p owns partition p of every source, so
its part of the batch is the ranges of partition p, and the task reads them itself — one pipelined
Fetch stream per range, each record batch decoded column-wise (`statekit.kafka`) — as Spark's own
Kafka source reads a partition on the executor that runs it. Nothing of the record crosses a process
boundary between the broker and the task.

Sources are read committed: an upstream sub-topology's aborted output never counts.
"""
from __future__ import annotations

from statekit.errors import StatekitError
from statekit.topology.records import Records

ISOLATION = "read_committed"


def read_ranges(kafka, plan, ranges, isolation: str = ISOLATION, values_kept=None) -> Records:
    """`ranges`: ``[(topic, partition, start, end)]`` of one task; every source index reading a
    topic gets its records. Returns the batch in Kafka Streams' processing order.

    ``values_kept``: ``{source index: first bytes}`` for the sources whose steps need to know
    only which values are null (a count: ``TaskProcessor.values_kept``); a topic read by no other
    source is decoded cutting out only the values that begin so
    (``statekit.wire.decode_batch_columns``)."""
    values_kept = values_kept or {}
    by_topic: dict = {}
    for s in plan.sources:
        by_topic.setdefault(s.topic, []).append(s.index)
    parts = []
    for topic, partition, start, end in ranges:
        if end <= start:
            continue
        indexes = by_topic.get(topic)
        if not indexes:
            raise StatekitError(f"{topic} is not a source of sub-topology {plan.subtopology_index}")
        kept = None
        if all(si in values_kept for si in indexes):
            kept = bytes(sorted(set(b"".join(values_kept[si] for si in indexes))))
        cols = None
        for chunk in kafka.read(topic, partition, start, end, isolation=isolation, columns=True,
                                values_kept=kept):
            if cols is None:
                cols = chunk.columns
            else:
                cols.extend(chunk.columns)
        if cols is None or not len(cols):
            continue
        for si in indexes:
            parts.append(Records.of(si, partition, cols.offsets, cols.timestamps, cols.keys,
                                    cols.values))
    return Records.merge(parts)
