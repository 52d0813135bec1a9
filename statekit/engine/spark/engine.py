"""`SparkEngine`: run a topology `Plan` as one Spark Structured Streaming query.

    source(s)  statekit-kafka, every topic of plan.sources in one reader
    stage 1    mapInArrow: plan.shuffle per record (decode, pre_shuffle, task = partition_for(key
               bytes, N)) -> (task, salt, route, source_index, src_partition, offset, timestamp,
               seq, key, value)
    shuffle    repartition(N, "salt"): salt = salts(N)[task], so Spark partition p holds task p only
    stage 2    mapInArrow: the records of task p, sorted by (timestamp, source_index, src_partition,
               offset, seq), handed to the instance that owns task p (statekit.worker.router), which
               processes, commits and writes the outputs; batch_id is the micro-batch id Spark
               replays after a failure
    sink       noop: the tasks wrote their outputs (Kafka topics, or the memory sink's files)

`RunningQuery` wraps the StreamingQuery; errors come out as one-line `StatekitError`s. Progress can
be forwarded live to a callback (`start(run, on_progress=fn)`, dicts from `progress_dict`).
Set STATEKIT_ENGINE_TRACE=/path.jsonl to have workers log per-stage timings.

A task's records travel as Arrow IPC with the columns of `statekit.worker.protocol.BATCH_FIELDS`.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from statekit.engine.spark.salt import salts
from statekit.engine.spark.session import SparkFailure, get_session, one_line
from statekit.engine.spec import RunSpec
from statekit.errors import StatekitError

STAGE1_SCHEMA = ("task int, salt int, route int, source_index int, src_partition int, offset long, "
                 "timestamp long, seq int, key binary, value binary")
OUTPUT_SCHEMA = "topic string, key binary, value binary"


class EngineError(StatekitError):
    pass


# --- the plan, as the engine sees it ----------------------------------------------------------------


def _topic_of(x) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, dict):
        return x["topic"]
    return x.topic


def source_topics(plan) -> list:
    return [_topic_of(s) for s in plan.sources]


def sink_topics(plan) -> list:
    return [_topic_of(s) for s in getattr(plan, "sinks", ()) or ()]


_STAGE1_FIELDS = (("task", "int32"), ("salt", "int32"), ("route", "int32"), ("source_index", "int32"),
                  ("src_partition", "int32"), ("offset", "int64"), ("timestamp", "int64"),
                  ("seq", "int32"), ("key", "binary"), ("value", "binary"))
_SORT_KEYS = [("timestamp", "ascending"), ("source_index", "ascending"), ("src_partition", "ascending"),
              ("offset", "ascending"), ("seq", "ascending")]
_EMIT_ROWS = 100_000


def _pylist(col) -> list:
    """An Arrow (chunked) array as a Python list, ~10x faster than `.to_pylist()`."""
    return col.to_pandas().tolist()


def _trace(entry: dict) -> None:
    """STATEKIT_ENGINE_TRACE=/path.jsonl: workers append per-stage timings (a debugging aid)."""
    import os

    path = os.environ.get("STATEKIT_ENGINE_TRACE")
    if path:
        import json

        with open(path, "a") as fh:
            fh.write(json.dumps(entry) + "\n")


def make_stage1(plan, partitions: int):
    """Stage 1 (mapInArrow, where records are read): `plan.shuffle` per source record."""
    topics = source_topics(plan)
    by_topic: dict = {}
    for i, t in enumerate(topics):
        by_topic.setdefault(t, []).append(i)
    salt_of = salts(partitions)
    n = partitions

    def stage1(batches):
        import time as _time

        import pyarrow as pa

        types = [getattr(pa, t)() for _, t in _STAGE1_FIELDS]
        names = [f for f, _ in _STAGE1_FIELDS]
        shuffle = plan.shuffle
        for rb in batches:
            if rb.num_rows == 0:
                continue
            t0 = _time.perf_counter()
            o_task, o_route, o_src, o_part, o_off, o_ts, o_seq, o_key, o_val = ([] for _ in range(9))
            for key, value, topic, part, off, ts in zip(
                    _pylist(rb.column("key")), _pylist(rb.column("value")),
                    _pylist(rb.column("topic")), _pylist(rb.column("partition")),
                    _pylist(rb.column("offset")), _pylist(rb.column("ts"))):
                for si in by_topic.get(topic, ()):
                    seq = 0
                    for task, rec in shuffle(si, key, value, ts, part, off, n):
                        o_task.append(task)
                        o_route.append(rec[0])
                        o_src.append(si)
                        o_part.append(rec[1])
                        o_off.append(rec[2])
                        o_ts.append(rec[3])
                        o_key.append(rec[4])
                        o_val.append(rec[5])
                        o_seq.append(seq)
                        seq += 1
            if not o_task:
                continue
            cols = (o_task, [salt_of[t] for t in o_task], o_route, o_src, o_part, o_off, o_ts, o_seq,
                    o_key, o_val)
            out = pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, types)], names=names)
            _trace({"stage": 1, "rows": rb.num_rows, "records": len(o_task),
                    "shuffle_s": round(_time.perf_counter() - t0, 3)})
            yield out

    return stage1


def make_stage2(run: RunSpec):
    """Stage 2 (mapInArrow; one Spark partition = one task): the task's records of the micro-batch,
    sorted by (timestamp, source_index, src_partition, offset, seq), handed to the instance that owns
    the task (`statekit.worker.router.deliver`). The instance writes the outputs; nothing comes back
    to Spark. With the ``executors`` placement the task runs here instead (`engine.spark.executors`)."""
    if run.extra.get("placement") == "executors":
        from statekit.engine.spark.executors import make_executor_stage2

        return make_executor_stage2(run)
    control_dir, sub = run.control_dir, int(run.subtopology)
    app, bootstrap, events = run.app, run.bootstrap, run.events

    def stage2(batches):
        import time as _time

        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        from statekit.contracts import TaskId
        from statekit.worker.protocol import table_to_ipc
        from statekit.worker.router import deliver

        t0 = _time.perf_counter()
        parts = [b for b in batches if b.num_rows]
        if not parts:
            return
        tbl = pa.Table.from_batches(parts)
        ctx = TaskContext.get()
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or -1)
        pid = ctx.partitionId()
        tasks = pc.unique(tbl.column("task")).to_pylist()
        if tasks != [pid]:
            raise EngineError(f"shuffle partition {pid} received tasks {sorted(tasks)}; the salt "
                              f"mapping does not match this Spark version")
        tbl = tbl.take(pc.sort_indices(tbl, sort_keys=_SORT_KEYS))
        t1 = _time.perf_counter()
        publish = None
        if events:
            from statekit.event_bus import EventPublisher

            publish = EventPublisher(bootstrap, app).publish
        reply = deliver(control_dir, TaskId(sub, pid), batch_id, table_to_ipc(tbl), publish=publish)
        _trace({"stage": 2, "task": pid, "batch": batch_id, "records": tbl.num_rows,
                "reply": reply[0], "prepare_s": round(t1 - t0, 3),
                "deliver_s": round(_time.perf_counter() - t1, 3)})
        return
        yield  # a generator that yields nothing: the instance wrote the outputs

    return stage2


# --- progress ---------------------------------------------------------------------------------------


def progress_dict(p) -> dict:
    """The parts of a StreamingQueryProgress a dashboard wants, as a plain dict."""
    if p is None:
        return {}
    if not isinstance(p, dict):
        try:
            import json

            p = json.loads(p.json)
        except Exception:
            p = {"batchId": getattr(p, "batchId", -1), "numInputRows": getattr(p, "numInputRows", 0),
                 "inputRowsPerSecond": getattr(p, "inputRowsPerSecond", 0.0),
                 "processedRowsPerSecond": getattr(p, "processedRowsPerSecond", 0.0),
                 "durationMs": dict(getattr(p, "durationMs", {}) or {})}
    d = p.get("durationMs") or {}
    return {
        "batch_id": p.get("batchId"),
        "num_input_rows": p.get("numInputRows") or 0,
        "input_rows_per_second": p.get("inputRowsPerSecond") or 0.0,
        "processed_rows_per_second": p.get("processedRowsPerSecond") or 0.0,
        "batch_duration_ms": d.get("triggerExecution") or 0,
        "duration_ms": dict(d),
        "timestamp": p.get("timestamp"),
        "sources": p.get("sources"),
    }


class _Listener:
    """One StreamingQueryListener per session, dispatching progress to per-query callbacks."""

    _lock = threading.Lock()
    _installed: dict = {}  # id(spark) -> listener

    @classmethod
    def subscribe(cls, spark, query_id: str, callback: Callable[[dict], None]) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        with cls._lock:
            lst = cls._installed.get(id(spark))
            if lst is None:
                class L(StreamingQueryListener):
                    callbacks: dict = {}

                    def onQueryStarted(self, event):
                        pass

                    def onQueryProgress(self, event):
                        p = event.progress
                        cb = self.callbacks.get(str(p.id))
                        if cb is not None:
                            try:
                                cb(progress_dict(p))
                            except Exception:
                                pass

                    def onQueryIdle(self, event):
                        pass

                    def onQueryTerminated(self, event):
                        self.callbacks.pop(str(event.id), None)

                lst = L()
                spark.streams.addListener(lst)
                cls._installed[id(spark)] = lst
            lst.callbacks[query_id] = callback

    @classmethod
    def unsubscribe(cls, spark, query_id: str) -> None:
        with cls._lock:
            lst = cls._installed.get(id(spark))
            if lst is not None:
                lst.callbacks.pop(query_id, None)

    @classmethod
    def forget(cls, spark) -> None:
        with cls._lock:
            cls._installed.pop(id(spark), None)


# --- the running query ------------------------------------------------------------------------------


class RunningQuery:
    """A started query: `.stop()`, `.abort()`, `.is_active`, `.exception()`, `.process_all_available()`,
    `.recent_progress`, `.last_batch_id`, `.await_termination(timeout)`."""

    def __init__(self, spark, query, run: RunSpec | None = None):
        self.spark = spark
        self.query = query
        self.run = run
        self.id = str(query.id)
        self.name = query.name

    @property
    def is_active(self) -> bool:
        try:
            return bool(self.query.isActive)
        except Exception:
            return False

    def exception(self) -> str | None:
        """One line saying why the query failed, or None."""
        try:
            exc = self.query.exception()
        except Exception as e:  # the JVM went away
            return str(one_line(e))
        return None if exc is None else str(one_line(exc))

    def process_all_available(self, timeout: float | None = None) -> None:
        """Block until every record available now has been processed (raises a one-line error if
        the query fails). With `timeout`, raise `EngineError` after that many seconds."""
        if timeout is None:
            try:
                self.query.processAllAvailable()
            except Exception as e:
                raise one_line(e, f"query {self.name} failed") from None
            return
        box: dict = {}

        def target():
            try:
                self.query.processAllAvailable()
            except Exception as e:  # noqa: BLE001
                box["err"] = e

        t = threading.Thread(target=target, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise EngineError(f"query {self.name} did not catch up within {timeout:.0f}s")
        if "err" in box:
            raise one_line(box["err"], f"query {self.name} failed") from None

    def await_termination(self, timeout: float | None = None) -> bool:
        try:
            if timeout is None:
                self.query.awaitTermination()
                return True
            return bool(self.query.awaitTermination(timeout))
        except Exception as e:
            raise one_line(e, f"query {self.name} failed") from None

    @property
    def recent_progress(self) -> list:
        try:
            return [progress_dict(p) for p in self.query.recentProgress]
        except Exception:
            return []

    @property
    def last_progress(self) -> dict:
        try:
            return progress_dict(self.query.lastProgress)
        except Exception:
            return {}

    @property
    def last_batch_id(self) -> int:
        """The id of the last micro-batch that completed (-1 before the first)."""
        lp = self.last_progress
        bid = lp.get("batch_id")
        return -1 if bid is None else int(bid)

    def status(self) -> dict:
        try:
            return dict(self.query.status)
        except Exception:
            return {}

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after the running micro-batch (if any) finishes."""
        deadline = time.monotonic() + timeout
        while self.is_active and time.monotonic() < deadline:
            if not self.status().get("isTriggerActive", False):
                break
            time.sleep(0.05)
        self._stop()

    def abort(self) -> None:
        """Stop now: the running micro-batch is interrupted (Spark replays it on the next start)."""
        self._stop()

    def _stop(self) -> None:
        # the listener forgets the query on its QueryTerminated event, after the last progress
        try:
            self.query.stop()
        except Exception:
            pass

    def __repr__(self):
        return f"RunningQuery({self.name}, active={self.is_active}, last_batch={self.last_batch_id})"


# --- the engine --------------------------------------------------------------------------------------


def _apply_trigger(w, trigger):
    if trigger is None:
        return w
    if isinstance(trigger, (int, float)):
        return w.trigger(processingTime=f"{float(trigger)} seconds")
    if isinstance(trigger, dict):
        return w.trigger(**trigger)
    t = str(trigger)
    if t.replace("_", "").lower() in ("availablenow", "available"):
        return w.trigger(availableNow=True)
    if t.lower() == "once":
        return w.trigger(once=True)
    return w.trigger(processingTime=t)


class SparkEngine:
    def __init__(self, spark=None):
        self._spark = spark

    def session(self):
        if self._spark is None or self._spark.sparkContext._jsc is None:
            self._spark = get_session()
        return self._spark

    def source_frame(self, run: RunSpec):
        spark = self.session()
        r = (spark.readStream.format("statekit-kafka")
             .option("bootstrap", run.bootstrap)
             .option("topics", ",".join(dict.fromkeys(source_topics(run.plan))))
             .option("startingOffsets", run.starting_offsets)
             .option("isolation.level", run.isolation))
        if run.max_records_per_trigger:
            r = r.option("maxRecordsPerTrigger", str(int(run.max_records_per_trigger)))
        return r.load()

    def build(self, run: RunSpec):
        """The streaming DataFrame of output rows (topic, key, value), not started."""
        from pyspark.sql import functions as F

        src = self.source_frame(run)
        src = src.select("key", "value", "topic", "partition", "offset",
                         F.unix_millis("timestamp").alias("ts"))
        staged = src.mapInArrow(make_stage1(run.plan, run.partitions), STAGE1_SCHEMA)
        shuffled = staged.repartition(run.partitions, "salt")
        return shuffled.mapInArrow(make_stage2(run), OUTPUT_SCHEMA)

    @staticmethod
    def memory_table_name(run: RunSpec) -> str:
        return run.memory_table or f"{run.app}_output".replace("-", "_")

    def start(self, run: RunSpec, on_progress: Callable[[dict], None] | None = None) -> RunningQuery:
        if run.partitions < 1:
            raise EngineError("partitions must be >= 1")
        spark = self.session()
        spark.conf.set("spark.sql.shuffle.partitions", str(run.partitions))
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        name = run.query_name or run.app
        try:
            out = self.build(run)
        except StatekitError:
            raise
        except Exception as e:
            raise one_line(e, f"cannot build {name}") from None
        return launch(spark, out, run, self.memory_table_name(run), sink=self.spark_sink(run),
                      on_progress=on_progress)

    def spark_sink(self, run: RunSpec) -> str:
        """Spark's sink for this engine's queries: none, since the tasks write their outputs."""
        return "none"


def launch(spark, out, run: RunSpec, memory_table: str, output_mode: str = "append",
           sink: str | None = None, on_progress: Callable[[dict], None] | None = None) -> RunningQuery:
    """Write `out` to a sink (default: the run's) and start the query: one place for the sink
    choice, the trigger and the one-line start error, shared by both Spark engines."""
    name = run.query_name or run.app
    sink = run.sink if sink is None else sink
    w = out.writeStream.queryName(name).option("checkpointLocation", run.checkpoint_dir)
    if sink == "kafka":
        w = w.format("statekit-kafka").option("bootstrap", run.bootstrap)
    elif sink == "memory":
        from statekit.engine.spark.sink import memory_table_obj

        table = memory_table_obj(memory_table)

        def write(batch_df, batch_id):
            table.put(batch_id, batch_df.toPandas())

        w = w.foreachBatch(write)
    elif sink in ("none", "noop", None):
        w = w.format("noop")
    else:
        raise EngineError(f"unknown sink {sink!r}: use 'kafka', 'memory' or 'none'")
    w = _apply_trigger(w.outputMode(output_mode), run.trigger)
    try:
        q = w.start()
    except Exception as e:
        raise one_line(e, f"cannot start {name}") from None
    rq = RunningQuery(spark, q, run)
    if on_progress is not None:
        _Listener.subscribe(spark, rq.id, on_progress)
    return rq

def start(run: RunSpec, on_progress=None) -> RunningQuery:
    return SparkEngine().start(run, on_progress)


__all__ = ["SparkEngine", "RunningQuery", "RunSpec", "EngineError", "SparkFailure", "start", "launch",
           "progress_dict", "make_stage1", "make_stage2"]
