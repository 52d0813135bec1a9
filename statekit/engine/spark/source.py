"""`statekit-kafka`: Kafka as a Spark data source (streaming and batch reads, streaming and batch
writes), built on Spark 4's Python data source API and `statekit.kafka` (no Spark Kafka jars).

    spark.readStream.format("statekit-kafka")
        .option("bootstrap", "127.0.0.1:9092")
        .option("topic", "words")                 # or .option("topics", "a,b")
        .option("maxRecordsPerTrigger", 10000)    # admission control (ReadMaxRows)
        .option("startingOffsets", "earliest")    # | "latest" | '{"words": {"0": 42}}'
        .load()

The schema is Spark's Kafka source schema: `key binary, value binary, topic string, partition int,
offset long, timestamp timestamp, timestampType int` (+ `headers array<struct<key string, value
binary>>` with `.option("includeHeaders", "true")`; + `split int, splits int` with
`.option("includeSplits", "true")`: which of the micro-batch's input partitions a row came from, and
how many there are — every partition then yields at least one row, a marker with offset -1 when its
range holds no record, so that a reader of each partition always learns both).

`.option("tasks", N)` reads no record: it plans one input partition per stream task p (0..N-1) and
yields one row `task int, ranges string` for it — the JSON list of `[topic, partition, start, end]`
ranges of partition p of every topic in the micro-batch (possibly none); with
`.option("taskGroups", 1)` all N rows come from one input partition (one Spark task). statekit's engine runs its
queries so: each task reads its own ranges where it runs (`statekit.worker.batch_input`), and Spark
moves no record. Every topic must then have N partitions.

Offsets are `{topic: {"partition": next offset}}` JSON dicts, kept in Spark's checkpoint (the offset log), so a restarted query continues
where the last committed batch ended. One input partition per Kafka partition range (split further
with `minPartitions`). `read()` runs in a Python worker and yields pyarrow RecordBatches decoded by
`statekit.kafka.Kafka.read` (one Fetch pipeline per range, no consumer objects).

`.option("helpers.dir", DIR).option("helpers.query", NAME)`: where the query's planner notes the
artifact id a Spark Connect server runs it under (`statekit.engine.spark.helpers`).

Batch reads (`spark.read.format("statekit-kafka")`) take `startingOffsets` (default earliest) and
`endingOffsets` (default latest). Writes: see `statekit.engine.spark.sink`.
"""
from __future__ import annotations

import json
import time
from typing import Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from statekit.errors import StatekitError

NAME = "statekit-kafka"

BASE_FIELDS = [
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("timestampType", IntegerType(), False),
]
HEADERS_FIELD = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType(), False), StructField("value", BinaryType(), True)])),
    True,
)


class SourceOptionError(StatekitError):
    pass


SPLIT_FIELDS = [StructField("split", IntegerType(), False), StructField("splits", IntegerType(), False)]


TASK_SCHEMA = StructType([StructField("task", IntegerType(), False),
                          StructField("ranges", StringType(), False)])


def kafka_schema(include_headers: bool = False, include_splits: bool = False) -> StructType:
    return StructType(BASE_FIELDS + ([HEADERS_FIELD] if include_headers else [])
                      + (SPLIT_FIELDS if include_splits else []))


class TaskRanges(InputPartition):
    """Stream task `task`'s part of a micro-batch: `ranges`, [(topic, partition, start, end)]."""

    def __init__(self, task: int, ranges: list):
        self.task, self.ranges = task, ranges
        super().__init__((task, tuple(map(tuple, ranges))))

    def __repr__(self):
        return f"TaskRanges({self.task}: {self.ranges})"


class AllTaskRanges(InputPartition):
    """Every stream task's part of a micro-batch in one input partition (`taskGroups` 1): one
    Spark task hands them all out at once."""

    def __init__(self, parts: list):
        self.parts = parts                 # [TaskRanges]
        super().__init__(tuple(p.value for p in parts))

    def __repr__(self):
        return f"AllTaskRanges({len(self.parts)} tasks)"


def _truthy(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


class KafkaPartition(InputPartition):
    """Offsets [start, end) of one Kafka partition; the `split`-th of the batch's `splits`."""

    def __init__(self, topic: str, partition: int, start: int, end: int, split: int = 0,
                 splits: int = 1):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.split, self.splits = split, splits
        super().__init__((topic, partition, start, end, split, splits))

    def __repr__(self):
        return f"KafkaPartition({self.topic}[{self.partition}] {self.start}..{self.end})"


# --- offsets -----------------------------------------------------------------------------------


def allocate(start: dict, end: dict, max_rows: int) -> dict:
    """Advance `start` towards `end` by at most `max_rows` offsets in total, shared in proportion to
    each partition's backlog (largest remainder), so a backlog of R offsets takes exactly
    ceil(R / max_rows) micro-batches. Both are `{(topic, partition): offset}`."""
    lag = {tp: max(0, end[tp] - start.get(tp, 0)) for tp in end}
    total = sum(lag.values())
    if total <= max_rows:
        return dict(end)
    out = {tp: start.get(tp, 0) for tp in end}
    shares = {tp: lag[tp] * max_rows / total for tp in lag}
    given = {tp: int(shares[tp]) for tp in lag}
    left = max_rows - sum(given.values())
    for tp in sorted(lag, key=lambda t: (-(shares[t] - given[t]), t)):
        if left <= 0:
            break
        if given[tp] < lag[tp]:
            given[tp] += 1
            left -= 1
    for tp in out:
        out[tp] += min(given[tp], lag[tp])
    return out


def to_json(offsets: dict) -> dict:
    """`{(topic, partition): off}` → `{topic: {"partition": off}}` (Spark's Kafka offset shape)."""
    out: dict = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def from_json(d: dict | None) -> dict:
    out = {}
    for t, parts in (d or {}).items():
        for p, off in parts.items():
            out[(t, int(p))] = int(off)
    return out


# --- reading one range into Arrow ------------------------------------------------------------------


def read_range(bootstrap: str, topic: str, partition: int, start: int, end: int, schema: StructType,
               batch_rows: int = 50_000, isolation: str = "read_uncommitted",
               split: tuple | None = None) -> Iterator:
    """Yield pyarrow RecordBatches (in `schema`) for offsets [start, end) of topic[partition].
    `split`: (index, count) for the `split`/`splits` columns; a range without any record then
    yields one marker row (offset -1)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from statekit.kafka import Kafka

    pa_schema = to_arrow_schema(schema, timezone="UTC")
    with_headers = "headers" in schema.fieldNames()
    ts_type = pa_schema.field("timestamp").type
    client = Kafka(bootstrap)
    try:
        pending: list = []
        rows = 0
        for chunk in client.read(topic, partition, start, end, isolation=isolation):
            pending.extend(chunk.records)
            if len(pending) >= batch_rows:
                rows += len(pending)
                yield _to_batch(pending, topic, partition, pa_schema, ts_type, with_headers, pa, split)
                pending = []
        if pending or (split is not None and not rows):
            yield _to_batch(pending or [(-1, 0, None, None, ())], topic, partition, pa_schema,
                            ts_type, with_headers, pa, split)
    finally:
        client.close()


def task_batch(rows: list):
    """The `tasks` rows [(task, ranges json)] as one Arrow batch in `TASK_SCHEMA`, built from its
    buffers. Rows handed back as tuples go through `pa.array` of a Python list, whose pandas shim
    imports pandas to ask whether the list is a pandas object: ~0.2 s of CPU in the Python worker
    that reads them, on the path of a query's first micro-batch (and of the first after Spark ended
    its idle workers), for a worker that never uses pandas."""
    import struct

    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    n = len(rows)
    texts = [r.encode() for _, r in rows]
    ends = [0]
    for t in texts:
        ends.append(ends[-1] + len(t))
    tasks = struct.pack(f"<{n}i", *(t for t, _ in rows))
    task = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(tasks)])
    ranges = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(struct.pack(f"<{n + 1}i", *ends)),
                                                    pa.py_buffer(b"".join(texts))])
    return pa.RecordBatch.from_arrays([task, ranges], schema=to_arrow_schema(TASK_SCHEMA, timezone="UTC"))


def _to_batch(records, topic, partition, pa_schema, ts_type, with_headers, pa, split=None):
    n = len(records)
    offsets, stamps, keys, values, headers = zip(*records)
    cols = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array([s * 1000 for s in stamps], pa.int64()).cast(ts_type),
        pa.array([0] * n, pa.int32()),
    ]
    if with_headers:
        cols.append(pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in headers],
                             pa_schema.field("headers").type))
    if split is not None:
        cols.append(pa.array([split[0]] * n, pa.int32()))
        cols.append(pa.array([split[1]] * n, pa.int32()))
    return pa.RecordBatch.from_arrays(cols, schema=pa_schema)


# --- the data source -------------------------------------------------------------------------------


class _Options:
    def __init__(self, options):
        o = {str(k).lower(): v for k, v in dict(options).items()}
        self.bootstrap = o.get("bootstrap") or o.get("kafka.bootstrap.servers")
        if not self.bootstrap:
            from statekit.bootstrap import resolve_bootstrap

            self.bootstrap = resolve_bootstrap(None)
        raw = o.get("topics") or o.get("topic") or o.get("subscribe")
        if not raw:
            raise SourceOptionError('statekit-kafka needs .option("topic", NAME) or .option("topics", "a,b")')
        self.topics = [t.strip() for t in str(raw).split(",") if t.strip()]
        mr = o.get("maxrecordspertrigger") or o.get("maxoffsetspertrigger")
        self.max_records = int(mr) if mr not in (None, "", "0") else None
        if self.max_records is not None and self.max_records <= 0:
            self.max_records = None
        self.starting = o.get("startingoffsets", "earliest")
        self.ending = o.get("endingoffsets", "latest")
        self.include_headers = _truthy(o.get("includeheaders", "false"))
        self.include_splits = _truthy(o.get("includesplits", "false"))
        self.tasks = int(o.get("tasks") or 0)
        self.task_groups = int(o.get("taskgroups") or 0)   # 1: every task in one input partition
        self.min_partitions = int(o.get("minpartitions") or 0)
        # Kafka's isolation.level: read_committed ends at the last stable offset and drops the
        # records of aborted transactions (exactly-once output of an upstream sub-topology)
        self.isolation = str(o.get("isolation.level") or o.get("isolation") or "read_uncommitted")
        # how long the source waits for a broker that is away before the query fails
        # (statekit's App passes its task_timeout; Kafka Streams' task.timeout.ms)
        self.task_timeout = float(o.get("tasktimeout") or 300.0)
        if self.isolation not in ("read_uncommitted", "read_committed"):
            raise SourceOptionError(f"isolation.level must be read_uncommitted or read_committed, "
                                    f"not {self.isolation!r}")


class KafkaDataSource(DataSource):
    """Registered as `statekit-kafka`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        o = {str(k).lower(): v for k, v in dict(self.options).items()}
        if int(o.get("tasks") or 0):
            return TASK_SCHEMA
        return kafka_schema(_truthy(o.get("includeheaders", "false")),
                            _truthy(o.get("includesplits", "false")))

    def streamReader(self, schema: StructType) -> "KafkaStreamReader":
        o = {str(k).lower(): v for k, v in dict(self.options).items()}
        if o.get("helpers.dir"):   # the planner a Spark Connect server keeps for this query run
            from statekit.engine.spark.helpers import note

            note(o["helpers.dir"], o.get("helpers.query") or "")
        return KafkaStreamReader(_Options(self.options), schema)

    def reader(self, schema: StructType) -> "KafkaBatchReader":
        return KafkaBatchReader(_Options(self.options), schema)

    def streamWriter(self, schema, overwrite):
        from statekit.engine.spark.sink import KafkaStreamWriter

        return KafkaStreamWriter(dict(self.options), schema)

    def writer(self, schema, overwrite):
        from statekit.engine.spark.sink import KafkaBatchWriter

        return KafkaBatchWriter(dict(self.options), schema)


class _OffsetsMixin:
    opts: _Options

    def _client(self):
        from statekit.kafka import Kafka
        from statekit.kafka.retry import request_timeout_for

        k = getattr(self, "_kafka", None)
        if k is None:
            k = self._kafka = Kafka(self.opts.bootstrap,
                                    timeout=request_timeout_for(getattr(self.opts, "task_timeout", 300.0)))
        return k

    def _drop_client(self) -> None:
        k = getattr(self, "_kafka", None)
        self._kafka = None
        if k is not None:
            try:
                k.close()
            except Exception:
                pass

    def _call(self, fn):
        """``fn(client)``; a broker that is away is waited for (a fresh connection each attempt,
        with backoff) up to the task timeout, then the query fails in one line; any other error
        gets one more try on a fresh connection."""
        from statekit.errors import KafkaTimeout, UnknownTopic
        from statekit.kafka.retry import retrying

        try:
            return retrying(lambda: fn(self._client()), timeout=getattr(self.opts, "task_timeout", 300.0),
                            what="the query's source", bootstrap=self.opts.bootstrap,
                            on_failure=self._drop_client)
        except StatekitError as e:
            self._drop_client()
            if isinstance(e, (UnknownTopic, KafkaTimeout)):
                raise
            return fn(self._client())  # one retry on a fresh connection

    def _ends(self) -> dict:
        def f(k):
            out = {}
            for t in self.opts.topics:
                for p, off in k.end_offsets(t, None, self.opts.isolation).items():
                    out[(t, p)] = off
            return out

        return self._call(f)

    def _begins(self) -> dict:
        def f(k):
            out = {}
            for t in self.opts.topics:
                for p, off in k.begin_offsets(t).items():
                    out[(t, p)] = off
            return out

        return self._call(f)

    def _resolve(self, spec: str, default_latest: bool) -> dict:
        spec = (spec or "").strip()
        if spec.lower() == "earliest":
            return self._begins()
        if spec.lower() == "latest":
            return self._ends()
        try:
            given = json.loads(spec)
        except ValueError:
            raise SourceOptionError(f"offsets must be 'earliest', 'latest' or JSON like "
                                    f'{{"topic": {{"0": 42}}}}, not {spec!r}') from None
        begins, ends = self._begins(), self._ends()
        out = {}
        for tp in ends:
            off = from_json(given).get(tp)
            if off is None:
                off = ends[tp] if default_latest else begins[tp]
            elif off == -2:
                off = begins[tp]
            elif off == -1:
                off = ends[tp]
            out[tp] = off
        return out

    def _task_partitions(self, start: dict, end: dict) -> list:
        n = self.opts.tasks
        ranges: dict = {p: [] for p in range(n)}
        for (t, p), e in sorted(end.items()):
            s = start.get((t, p), 0)
            if p >= n:
                raise SourceOptionError(f"topic {t} has a partition {p} but the query has {n} tasks: "
                                        f"each task reads its own partition, so every source topic "
                                        f"needs exactly {n} partitions")
            if e > s:
                ranges[p].append([t, p, s, e])
        parts = [TaskRanges(p, ranges[p]) for p in range(n)]
        return [AllTaskRanges(parts)] if self.opts.task_groups == 1 else parts

    def _partitions(self, start: dict, end: dict) -> list:
        if self.opts.tasks:
            return self._task_partitions(start, end)
        parts = []
        for tp in sorted(end):
            s, e = start.get(tp, 0), end[tp]
            if e > s:
                parts.append((tp[0], tp[1], s, e))
        n = self.opts.min_partitions
        if n and len(parts) < n and parts:
            total = sum(e - s for _, _, s, e in parts)
            split = []
            for t, p, s, e in parts:
                pieces = max(1, round(n * (e - s) / total))
                step = -(-(e - s) // pieces)
                for a in range(s, e, step):
                    split.append((t, p, a, min(e, a + step)))
            parts = split
        return [KafkaPartition(*x, i, len(parts)) for i, x in enumerate(parts)]

    def read(self, partition: KafkaPartition):
        if isinstance(partition, TaskRanges):
            return iter([task_batch([(partition.task, json.dumps(partition.ranges))])])
        if isinstance(partition, AllTaskRanges):
            return iter([task_batch([(p.task, json.dumps(p.ranges)) for p in partition.parts])])
        return read_range(self.opts.bootstrap, partition.topic, partition.partition, partition.start,
                          partition.end, self.schema, isolation=self.opts.isolation,
                          split=(partition.split, partition.splits) if self.opts.include_splits
                          else None)

    def __getstate__(self):
        d = dict(self.__dict__)
        d.pop("_kafka", None)
        return d


class KafkaStreamReader(_OffsetsMixin, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: _Options, schema: StructType):
        self.opts = opts
        self.schema = schema
        self._target: dict | None = None
        self._idle_since: float | None = None   # monotonic time the current idle spell began
        self._latest: dict | None = None        # the ends the last ask found (before any limit)
        self._quiet: tuple | None = None        # (offsets, when): the last ask found nothing past them

    def initialOffset(self) -> dict:
        return to_json(self._resolve(self.opts.starting, default_latest=False))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records:
            return ReadMaxRows(self.opts.max_records)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends()

    # An idle query asks for new data through Kafka's long poll: the broker holds the request
    # until a record arrives (answered at once) or this long has passed. Spark would otherwise
    # ask again every 10 ms, a Python call and a broker round trip each time. A query idle for
    # LONG_IDLE_S waits longer per ask: an idle notebook costs less CPU, and a record still
    # starts its batch at once. Stopping the query does not wait for the ask (`RunningQuery.stop`
    # stops a trigger that is getting offsets at once: 0.08 s after 40 s idle).
    # While nothing arrives, an ask is that one Fetch: the ends are asked for (metadata and
    # ListOffsets, two round trips) only when it finds data, or every ENDS_REFRESH_S (a topic
    # that grew partitions); and the ends Spark asks for right after each ask
    # (reportLatestOffset, its progress) are the ones the ask found. An idle app's broker had
    # answered five requests per ask.
    IDLE_WAIT_MS = 500
    LONG_IDLE_WAIT_MS = 5000
    LONG_IDLE_S = 30.0
    ENDS_REFRESH_S = 10.0

    def _idle_wait_ms(self) -> int:
        now = time.monotonic()
        since = self._idle_since
        if since is None:
            self._idle_since = since = now
        return self.LONG_IDLE_WAIT_MS if now - since >= self.LONG_IDLE_S else self.IDLE_WAIT_MS

    def _long_poll(self, s: dict) -> bool:
        wait_ms = self._idle_wait_ms()
        return self._call(lambda k: k.wait_for_data(s, wait_ms, self.opts.isolation))

    def latestOffset(self, start: dict, limit: ReadLimit = None) -> dict:
        s = from_json(start)
        quiet, self._quiet = self._quiet, None
        polled = False
        asked = None           # when the ends were last asked for, if this ask relies on them
        if self._target is not None:
            ends = dict(self._target)
        else:
            if quiet is not None and quiet[0] == s and time.monotonic() - quiet[1] < self.ENDS_REFRESH_S:
                polled = True
                if not self._long_poll(s):
                    ends, asked = dict(s), quiet[1]      # still nothing past the same offsets
            if asked is None:
                asked, ends = time.monotonic(), self._ends()
                if not polled and self._caught_up(s, ends) and self._long_poll(s):
                    asked, ends = time.monotonic(), self._ends()
        if any(ends.get(tp, 0) > off for tp, off in s.items()) or set(ends) - set(s):
            self._idle_since = None   # new data: the next idle spell starts from short asks
        begins = None
        for tp in ends:
            if tp not in s:  # a partition (or topic) that appeared after the query started
                begins = begins or self._begins()
                s[tp] = begins.get(tp, 0)
            ends[tp] = max(ends[tp], s[tp])
        for tp in s:  # keep partitions we know even if the broker forgot them
            ends.setdefault(tp, s[tp])
        self._latest = dict(ends)
        if asked is not None and ends == s:
            self._quiet = (dict(s), asked)
        if isinstance(limit, ReadMaxRows):
            ends = allocate(s, ends, int(limit.max_rows))
        return to_json(ends)

    @staticmethod
    def _caught_up(s: dict, ends: dict) -> bool:
        return bool(s) and all(ends.get(tp, 0) <= off for tp, off in s.items()) and set(ends) <= set(s)

    def reportLatestOffset(self):
        if self._latest is not None:
            return to_json(self._latest)
        try:
            return to_json(self._ends())
        except Exception:
            return None

    def partitions(self, start: dict, end: dict):
        return self._partitions(from_json(start), from_json(end))

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        k = getattr(self, "_kafka", None)
        self._kafka = None
        if k is not None:
            k.close()


class KafkaBatchReader(_OffsetsMixin, DataSourceReader):
    def __init__(self, opts: _Options, schema: StructType):
        self.opts = opts
        self.schema = schema
        self._parts = None

    def partitions(self):
        start = self._resolve(self.opts.starting, default_latest=False)
        end = self._resolve(self.opts.ending, default_latest=True)
        parts = self._partitions(start, end)
        self.stop()
        return parts or [KafkaPartition(self.opts.topics[0], 0, 0, 0)]

    def stop(self):
        k = getattr(self, "_kafka", None)
        self._kafka = None
        if k is not None:
            k.close()

    def read(self, partition: KafkaPartition):
        if partition.end <= partition.start:
            return iter(())
        return super().read(partition)


def _register_in_session(spark) -> None:
    from pyspark.sql.udf import _wrap_function

    sc = spark.sparkContext
    ds = getattr(sc._jvm, "org.apache.spark.sql.execution.datasources.v2.python."
                          "UserDefinedPythonDataSource")(_wrap_function(sc, KafkaDataSource))
    spark._jsparkSession.sessionState().dataSourceManager().registerDataSource(NAME, ds)


def register(spark) -> None:
    """Register `statekit-kafka` on this session (idempotent)."""
    if getattr(spark, "_statekit_kafka_registered", False):
        return
    try:
        spark.dataSource.register(KafkaDataSource)
    except Exception as exc:
        if "already exists" not in str(exc):
            raise
        # Spark's duplicate check looks the name up in the JVM's *active* session: another session
        # of this context (the user's spark.newSession(), or statekit's own) has it, this one not
        _register_in_session(spark)
    try:
        spark._statekit_kafka_registered = True
    except Exception:
        pass
