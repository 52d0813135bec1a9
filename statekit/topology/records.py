"""`Records`: one task's micro-batch, column-wise, in the order the task processes it.

A task is its source partition, so its micro-batch is a few offset ranges — one per source topic,
all of the same partition — read from Kafka by the task itself and decoded into columns once
(`statekit.kafka` decodes record batches column-wise). Nothing travels a record at a time: the task
applies the batch column-wise wherever the result is the same as one record at a time
(`statekit.topology.bulk`), and runs a user's function once per record, on decoded values, where
one is in the way.

Order, as Kafka Streams processes a task: the records of one partition in offset order; across the
partitions of a task (several sources) the record with the lowest timestamp first, ties to the
lower source index (`merge`).
"""
from __future__ import annotations

from typing import Iterable, Optional


class Records:
    """Parallel columns: `sources` (source index), `partitions`, `offsets`, `timestamps`, `keys`,
    `values` (bytes or None). `source` is the one source index of a single-source batch, else
    None."""

    __slots__ = ("sources", "partitions", "offsets", "timestamps", "keys", "values", "source")

    def __init__(self, sources: list, partitions: list, offsets: list, timestamps: list, keys: list,
                 values: list, source: Optional[int] = None) -> None:
        self.sources = sources
        self.partitions = partitions
        self.offsets = offsets
        self.timestamps = timestamps
        self.keys = keys
        self.values = values
        self.source = source

    def __len__(self) -> int:
        return len(self.offsets)

    def __repr__(self) -> str:
        return f"Records({len(self)} records, sources={sorted(set(self.sources))})"

    @classmethod
    def empty(cls) -> "Records":
        return cls([], [], [], [], [], [])

    @classmethod
    def of(cls, source: int, partition: int, offsets: list, timestamps: list, keys: list,
           values: list) -> "Records":
        """The records of one range of one source partition (already in offset order)."""
        n = len(offsets)
        return cls([source] * n, [partition] * n, offsets, timestamps, keys, values, source)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple]) -> "Records":
        """From `(source, partition, offset, timestamp, key, value)` tuples, kept in their order."""
        rows = list(rows)
        if not rows:
            return cls.empty()
        cols = [list(c) for c in zip(*rows)]
        srcs = set(cols[0])
        return cls(*cols, source=next(iter(srcs)) if len(srcs) == 1 else None)

    def rows(self):
        """`(source, partition, offset, timestamp, key, value)` per record, in order."""
        return zip(self.sources, self.partitions, self.offsets, self.timestamps, self.keys,
                   self.values)

    def slice(self, i: int, j: int) -> "Records":
        return Records(self.sources[i:j], self.partitions[i:j], self.offsets[i:j],
                       self.timestamps[i:j], self.keys[i:j], self.values[i:j], self.source)

    def take(self, idx: list) -> "Records":
        """The records at positions `idx` (in that order)."""
        pick = [self.sources, self.partitions, self.offsets, self.timestamps, self.keys,
                self.values]
        cols = [[c[i] for i in idx] for c in pick]
        return Records(*cols, source=self.source)

    @classmethod
    def merge(cls, parts: list) -> "Records":
        """One batch from per-partition parts (each a single-source `Records` in offset order):
        Kafka Streams' order — within a partition by offset; across partitions the head record with
        the lowest timestamp goes first (ties: lower source index, then partition). Choosing the
        lowest head each time is the same as a stable sort by each record's running maximum
        timestamp within its partition (a head's key is never below the records before it)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        import numpy as np

        keys, order_src, order_part, order_pos = [], [], [], []
        for p in parts:
            ts = np.asarray(p.timestamps, dtype=np.int64)
            keys.append(np.maximum.accumulate(ts))
            order_src.append(np.full(len(ts), p.sources[0], dtype=np.int64))
            order_part.append(np.full(len(ts), p.partitions[0], dtype=np.int64))
            order_pos.append(np.arange(len(ts), dtype=np.int64))
        runmax = np.concatenate(keys)
        order = np.lexsort((np.concatenate(order_pos), np.concatenate(order_part),
                            np.concatenate(order_src), runmax)).tolist()
        cat = [[], [], [], [], [], []]
        for p in parts:
            for col, src in zip(cat, (p.sources, p.partitions, p.offsets, p.timestamps, p.keys,
                                      p.values)):
                col.extend(src)
        cols = [[c[i] for i in order] for c in cat]
        srcs = {p.source for p in parts}
        return cls(*cols, source=next(iter(srcs)) if len(srcs) == 1 else None)
