"""Writing to Kafka from Spark (`statekit-kafka` writer), and helpers for Spark's memory sink.

    df.writeStream.format("statekit-kafka").option("bootstrap", B)
        .option("checkpointLocation", DIR).start()

Rows carry `topic` (or `.option("topic", NAME)` for all of them), `key` and `value` (binary or
string), and optionally `partition`; without one, a record goes where Kafka's default partitioner
(murmur2 of the key) sends it, round robin over partitions for a null key. Each Spark task sends its
rows with `statekit.kafka.Kafka.send_many` (column-wise batches, acks=all, waits), so when a
micro-batch commits every output record is in Kafka: at-least-once (a replayed batch writes its
records again).
"""
from __future__ import annotations

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from statekit.errors import StatekitError


class SinkOptionError(StatekitError):
    pass


class SentMessage(WriterCommitMessage):
    def __init__(self, records: int):
        self.records = records


def _binary(col):
    """An Arrow column of keys or values as a list of bytes / None (strings as UTF-8)."""
    import pyarrow as pa

    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary())
    elif not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        return [v if v is None or isinstance(v, bytes) else str(v).encode("utf-8")
                for v in col.to_pylist()]
    return col.to_pylist()


def write_batches(options: dict, batches) -> int:
    """Send every row of the pyarrow RecordBatches to Kafka; returns the number of records. The
    rows of each (topic, partition) go as one :class:`statekit.wire.Columns` (encoded
    column-wise) and every partition's writes are in flight at once (``Kafka.send_many``)."""
    import numpy as np

    from statekit.bootstrap import resolve_bootstrap
    from statekit.kafka import Kafka
    from statekit.partition import partitions_for
    from statekit.wire import Columns

    o = {str(k).lower(): v for k, v in options.items()}
    bootstrap = o.get("bootstrap") or o.get("kafka.bootstrap.servers")
    default_topic = o.get("topic")
    client = None
    groups: dict = {}   # (topic, partition) -> ([keys], [values])
    counts: dict = {}
    rr: dict = {}
    sent = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if client is None:
                client = Kafka(resolve_bootstrap(bootstrap))
            names = batch.schema.names
            n = batch.num_rows
            topics = batch.column("topic").to_pylist() if "topic" in names else None
            if topics is None and not default_topic:
                raise SinkOptionError('statekit-kafka writer needs a `topic` column or .option("topic", NAME)')
            keys = _binary(batch.column("key")) if "key" in names else [None] * n
            values = _binary(batch.column("value"))
            parts = batch.column("partition").to_pylist() if "partition" in names else None
            if topics is None:
                by_topic = {default_topic: np.arange(n)}
            else:
                tcol = [t or default_topic for t in topics]
                by_topic = {}
                for i, t in enumerate(tcol):
                    by_topic.setdefault(t, []).append(i)
                by_topic = {t: np.array(ix, np.int64) for t, ix in by_topic.items()}
            for topic, idx in by_topic.items():
                np_ = counts.get(topic)
                if np_ is None:
                    np_ = counts[topic] = len(client.end_offsets(topic))
                tkeys = [keys[i] for i in idx.tolist()] if len(idx) != n else keys
                tvals = [values[i] for i in idx.tolist()] if len(idx) != n else values
                p = partitions_for(tkeys, np_)
                if parts is not None:
                    given = np.array([parts[i] if parts[i] is not None else -1 for i in idx.tolist()],
                                     np.int64)
                    p = np.where(given >= 0, given, p)
                nulls = np.flatnonzero(p < 0)
                if len(nulls):  # null keys: round robin over the partitions, as Kafka's producer
                    start = rr.get(topic, -1) + 1
                    p[nulls] = (start + np.arange(len(nulls))) % np_
                    rr[topic] = int(start + len(nulls) - 1) % np_
                order = np.argsort(p, kind="stable")
                bounds = np.searchsorted(p[order], np.arange(np_ + 1))
                for part in range(np_):
                    sel = order[bounds[part]:bounds[part + 1]].tolist()
                    if sel:
                        ks, vs = groups.setdefault((topic, part), ([], []))
                        ks.extend(tkeys[i] for i in sel)
                        vs.extend(tvals[i] for i in sel)
        items = [(t, p, Columns.of(ks, vs)) for (t, p), (ks, vs) in sorted(groups.items())]
        if items:
            client.send_many(items)
            sent = sum(len(c) for _t, _p, c in items)
    finally:
        if client is not None:
            client.close()
    return sent


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict, schema):
        self.options = options

    def write(self, iterator):
        return SentMessage(write_batches(self.options, iterator))

    def commit(self, messages, batchId) -> None:
        pass

    def abort(self, messages, batchId) -> None:
        pass


class KafkaBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: dict, schema):
        self.options = options

    def write(self, iterator):
        return SentMessage(write_batches(self.options, iterator))


# --- memory sinks --------------------------------------------------------------------------------
#
# Spark's own memory sink cannot restart from a checkpoint in append mode ("This query does not
# support recovering from checkpoint location"), and statekit restarts queries after crashes. So the
# engine's "memory" sink is a foreachBatch that keeps each micro-batch's rows in the driver, keyed by
# batch id: a batch Spark replays after a failure replaces its first attempt instead of adding to it.

import threading as _threading

_TABLES: dict = {}
_TABLES_LOCK = _threading.Lock()


class MemoryTable:
    """Rows of a statekit memory sink, by micro-batch id (in this Python process)."""

    def __init__(self, name: str):
        self.name = name
        self.batches: dict = {}
        self.lock = _threading.Lock()

    def put(self, batch_id: int, pdf) -> None:
        with self.lock:
            self.batches[int(batch_id)] = pdf

    def frame(self):
        """All rows as one pandas DataFrame with a `batch` column, in batch order."""
        import pandas as pd

        with self.lock:
            items = sorted(self.batches.items())
        parts = [p.assign(batch=b) for b, p in items if len(p)]
        if not parts:
            return pd.DataFrame(columns=["topic", "key", "value", "batch"])
        return pd.concat(parts, ignore_index=True)

    def clear(self) -> None:
        with self.lock:
            self.batches.clear()

    def __len__(self):
        with self.lock:
            return sum(len(p) for p in self.batches.values())


def memory_table_obj(name: str) -> MemoryTable:
    with _TABLES_LOCK:
        t = _TABLES.get(name)
        if t is None:
            t = _TABLES[name] = MemoryTable(name)
        return t


def memory_sink(df, table: str, checkpoint: str | None = None):
    """A DataStreamWriter appending `df`'s rows to the statekit memory table `table` (restartable
    from `checkpoint`; read it with `memory_table(table)`)."""
    t = memory_table_obj(table)

    def write(batch_df, batch_id):
        t.put(batch_id, batch_df.toPandas())

    w = df.writeStream.foreachBatch(write).outputMode("append")
    if checkpoint:
        w = w.option("checkpointLocation", checkpoint)
    return w


def memory_table(table: str):
    """The rows of a statekit memory table as a pandas DataFrame (empty if it does not exist)."""
    return memory_table_obj(table).frame()


def spark_memory_table(spark, table: str):
    """The rows of one of Spark's own memory-sink tables (format("memory")) as pandas."""
    import pandas as pd

    if not spark.catalog.tableExists(table):
        return pd.DataFrame()
    return spark.table(table).toPandas()
