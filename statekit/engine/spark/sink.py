"""Writing to Kafka from Spark (`statekit-kafka` writer), and helpers for Spark's memory sink.

    df.writeStream.format("statekit-kafka").option("bootstrap", B)
        .option("checkpointLocation", DIR).start()

Rows carry `topic` (or `.option("topic", NAME)` for all of them), `key` and `value` (binary or
string), and optionally `partition`; without one, a record goes where Kafka's default partitioner
(murmur2 of the key) sends it, round robin over partitions for a null key. Each Spark task sends its
rows with `statekit.kafka.Kafka.send` (acks=all, waits), so when a micro-batch commits every output
record is in Kafka: at-least-once (a replayed batch writes its records again).
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


def _as_bytes(v):
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    return bytes(v)


# --- a fast path for Kafka.send: v2 record batches encoded here, ~10x cheaper per record than
# kafka-python's MemoryRecordsBuilder (1.2 vs 14 us). Used only while `statekit.kafka` has no fast
# encoder of its own (it is getting one: then this steps aside), when the client exposes its produce
# step and the `crc32c` extension is importable; otherwise `Kafka.send` does the work.

_VARINT = [bytes([2 * i]) if i < 64 else None for i in range(64)]


def _varint(n: int) -> bytes:
    """Kafka's zigzag varint."""
    if 0 <= n < 64:
        return _VARINT[n]
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_BATCH_HDR = None


def encode_batches(records, timestamp_ms: int, max_bytes: int = 512 * 1024) -> list:
    """[(record batch bytes, count)] for (key, value) pairs: magic 2, no compression, no headers."""
    import struct

    import crc32c

    global _BATCH_HDR
    if _BATCH_HDR is None:
        _BATCH_HDR = struct.Struct(">hiqqqhii")
    v = _varint
    out = []
    parts: list = []
    size = 0
    count = 0

    def flush():
        body = b"".join(parts)
        tail = _BATCH_HDR.pack(0, count - 1, timestamp_ms, timestamp_ms, -1, -1, -1, count) + body
        crc = crc32c.crc32c(tail)
        head = struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, crc)
        out.append((head + tail, count))

    for key, value in records:
        if key is None:
            kpart = b"\x01"
        else:
            kpart = v(len(key)) + key
        if value is None:
            vpart = b"\x01"
        else:
            vpart = v(len(value)) + value
        rec = b"\x00\x00" + v(count) + kpart + vpart + b"\x00"
        parts.append(v(len(rec)) + rec)
        size += len(rec) + 2
        count += 1
        if size >= max_bytes:
            flush()
            parts, size, count = [], 0, 0
    if count:
        flush()
    return out


def send_fast(client, topic: str, partition: int, records: list) -> int:
    """`client.send(topic, partition, records)` with the records encoded here (see above)."""
    import statekit.kafka as kmod

    produce = getattr(client, "_produce", None)
    retry = getattr(kmod, "_Retry", None)
    lock = getattr(client, "_lock", None)
    try:
        import crc32c  # noqa: F401
    except ImportError:
        produce = None
    if hasattr(kmod, "crc32c_fn"):  # statekit.kafka encodes record batches itself: use it
        produce = None
    if produce is None or retry is None or lock is None or not records:
        return client.send(topic, partition, records)
    import time

    payloads = encode_batches(records, int(time.time() * 1000))
    with lock:
        for attempt in range(20):
            try:
                return produce(topic, partition, payloads)
            except TypeError:  # the client's produce step changed shape: use its public send
                break
            except retry:
                forget = getattr(client, "_forget", None)
                if forget is not None:
                    forget(topic)
                time.sleep(min(0.05 * (attempt + 1), 0.5))
    return client.send(topic, partition, records)


def write_batches(options: dict, batches) -> int:
    """Send every row of the pyarrow RecordBatches to Kafka; returns the number of records."""
    from statekit.kafka import Kafka
    from statekit.partition import partition_for

    o = {str(k).lower(): v for k, v in options.items()}
    bootstrap = o.get("bootstrap") or o.get("kafka.bootstrap.servers")
    default_topic = o.get("topic")
    client = None
    groups: dict = {}
    counts: dict = {}
    rr: dict = {}
    memo: dict = {}
    sent = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if client is None:
                client = Kafka(bootstrap)
            names = batch.schema.names
            topics = batch.column("topic").to_pylist() if "topic" in names else None
            if topics is None and not default_topic:
                raise SinkOptionError('statekit-kafka writer needs a `topic` column or .option("topic", NAME)')
            keys = batch.column("key").to_pylist() if "key" in names else [None] * batch.num_rows
            values = batch.column("value").to_pylist()
            parts = batch.column("partition").to_pylist() if "partition" in names else None
            for i in range(batch.num_rows):
                topic = (topics[i] if topics is not None else None) or default_topic
                key = _as_bytes(keys[i])
                n = counts.get(topic)
                if n is None:
                    n = counts[topic] = len(client.end_offsets(topic))
                p = parts[i] if parts is not None and parts[i] is not None else None
                if p is None:
                    if key is None:
                        p = rr[topic] = (rr.get(topic, -1) + 1) % n
                    else:
                        p = memo.get((key, n))
                        if p is None:
                            p = memo[(key, n)] = partition_for(key, n)
                groups.setdefault((topic, p), []).append((key, _as_bytes(values[i])))
        for (topic, p), recs in sorted(groups.items()):
            send_fast(client, topic, p, recs)
            sent += len(recs)
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
