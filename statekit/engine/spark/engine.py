"""`SparkEngine`: run a topology `Plan` (one sub-topology) as one Spark Structured Streaming query.

Spark plans the micro-batches (offset ranges of the source topics, in its offset log), gives each
its id, schedules one Spark task per stream task, retries a failed one, and commits the batch in
its commit log. A stream task is its source partition (`statekit.topology.plan`), so the query
needs no shuffle and moves no record: its one stage is

    source     statekit-kafka with ``tasks=N``: one input partition per stream task, one row each —
               the task's part of the micro-batch, the offset ranges of its partition of every
               source topic (`statekit.engine.spark.source`)
    deliver    mapInArrow: the row goes to the task (`statekit.worker.exchange.deliver`: to the
               instance that owns it, which reads those ranges from Kafka itself, processes and
               commits them, and answers once committed; or the task's spool when it cannot take
               them now). With the ``executors`` placement (a cluster) the task runs right here in
               the Spark Python worker instead (`engine.spark.executors`)
    sink       noop: the tasks wrote their outputs (Kafka topics, or the memory sink's files)

A record is read once, by the process that owns its task, and decoded there column-wise: the way
Spark's own Kafka source reads a partition on the executor that runs it. batch_id is the
micro-batch id Spark replays after a failure, which the task skips once it has applied it.

`RunningQuery` wraps the StreamingQuery; errors come out as one-line `StatekitError`s. Progress can
be forwarded live to a callback (`start(run, on_progress=fn)`, dicts from `progress_dict`).
Set STATEKIT_ENGINE_TRACE=/path.jsonl to have workers log per-task timings.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from statekit.engine.spark import session_api
from statekit.engine.spark.data_source_lookup import plan_reader_early
from statekit.engine.spark.planners import REAPER
from statekit.engine.spark.session import SparkFailure, get_session, map_in_arrow, one_line, own_query
from statekit.engine.spark.stage_rows import OUTPUT_SCHEMA, task_rows, trace
from statekit.engine.spec import RunSpec
from statekit.errors import StatekitError



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


_POOL = None


def _pool(n: int):
    """The Python worker's delivering threads, kept across micro-batches (Spark reuses the worker)
    so that each keeps its connections to the instances."""
    global _POOL
    if _POOL is None or _POOL._max_workers < min(n, 16):
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=min(max(n, 4), 16),
                                   thread_name_prefix="statekit-deliver")
    return _POOL


def make_deliver(run: RunSpec):
    """The one stage of the instances placement (see the module docstring): every task's ranges to
    the instance that owns it, all at once; the Spark task ends when every one is committed (or
    spooled), and fails with the first task's failure."""
    control_dir, sub = run.control_dir, int(run.subtopology)
    app, bootstrap, events = run.app, run.bootstrap, run.events

    def deliver_tasks(batches):
        import time as _time

        from pyspark import TaskContext

        from statekit.contracts import TaskId
        from statekit.worker.exchange import deliver

        batch_id = int(TaskContext.get().getLocalProperty("streaming.sql.batchId") or -1)
        publish = None
        if events:
            from statekit.event_bus import EventPublisher

            publish = EventPublisher(bootstrap, app).publish
        rows = list(task_rows(batches))

        def one(row):
            task, ranges = row
            t0 = _time.perf_counter()
            reply = deliver(control_dir, TaskId(sub, task), batch_id, ranges, publish=publish)
            trace({"stage": "deliver", "task": task, "batch": batch_id, "ranges": ranges,
                   "reply": reply[0], "s": round(_time.perf_counter() - t0, 3)})
            return reply

        if len(rows) == 1:
            one(rows[0])
        elif rows:
            list(_pool(len(rows)).map(one, rows))   # the first failure raises here
        return
        yield  # a generator that yields nothing: the instances wrote the outputs

    return deliver_tasks


def _offset_span(sources) -> "int | None":
    """Records a micro-batch read, from its sources' start and end offsets (a statekit query's
    source yields one row per task, not per record). None when the offsets are not Kafka's."""
    by_topic = topic_spans(sources)
    return None if by_topic is None else sum(by_topic.values())


def topic_spans(sources) -> "dict | None":
    """{topic: records the micro-batch read of it}, from the sources' offsets (None: not Kafka's)."""
    import json

    def parse(x):
        while isinstance(x, str):          # (a listener's progress has them as text, "None" too)
            x = None if x in ("None", "null", "") else json.loads(x)
        return x or {}

    out: dict = {}
    for src in sources or ():
        try:
            start, end = parse(src.get("startOffset")), parse(src.get("endOffset"))
            for topic, parts in end.items():
                for part, off in parts.items():
                    out[topic] = out.get(topic, 0) + max(
                        0, int(off) - int((start.get(topic) or {}).get(part, 0)))
        except (TypeError, ValueError, AttributeError):
            return None
    return out if sources else None


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
    rows = p.get("numInputRows") or 0
    spans = topic_spans(p.get("sources"))
    records = None if spans is None else sum(spans.values())
    scale = (records / rows) if (records is not None and rows) else 1.0
    return {
        "batch_id": p.get("batchId"),
        "num_input_rows": records if records is not None else rows,
        "records_by_topic": spans or {},
        "input_rows_per_second": (p.get("inputRowsPerSecond") or 0.0) * scale,
        "processed_rows_per_second": (p.get("processedRowsPerSecond") or 0.0) * scale,
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
        the query fails). With `timeout`, raise `EngineError` after that many seconds.

        "Now" is the sources' end offsets at the call (read committed when the query reads so);
        the query is caught up once a completed micro-batch ended at or past them. (Spark's own
        processAllAvailable waits for a trigger that finds nothing new, which an idle source's
        long poll would delay by up to its wait.)"""
        if self.run is None:
            return self._spark_process_all_available(timeout)
        from statekit.kafka import Kafka

        deadline = None if timeout is None else time.monotonic() + timeout
        with Kafka(self.run.bootstrap) as k:
            want = {(t, p): e for t in dict.fromkeys(source_topics(self.run.plan))
                    for p, e in k.end_offsets(t, None, self.run.isolation).items()}
        while True:
            err = self.exception()
            if err is not None:
                raise EngineError(f"query {self.name} failed: {err}")
            if not self.is_active:
                # asked again: over Spark Connect each answer is a call of its own, and a query
                # that failed between the two looks stopped, not failed, to the first
                err = self.exception()
                if err is not None:
                    raise EngineError(f"query {self.name} failed: {err}")
                return
            got = self._committed_ends(want)
            if got is None:           # no micro-batch yet (a query that started at "latest")
                if not self.status().get("isDataAvailable", True):
                    left = None if deadline is None else max(0.1, deadline - time.monotonic())
                    return self._spark_process_all_available(left)
            elif all(off >= want[tp] for tp, off in got.items()):
                return
            if deadline is not None and time.monotonic() > deadline:
                raise EngineError(f"query {self.name} did not catch up within {timeout:.0f}s")
            time.sleep(0.02)

    def _committed_ends(self, want: dict):
        """{(topic, partition): end offset of the last completed micro-batch} for `want`'s
        partitions (one no batch has read: 0); None before the first micro-batch."""
        import json

        got = {tp: 0 for tp in want}
        try:
            last = self.query.lastProgress
        except Exception:  # noqa: BLE001 - the JVM went away: is_active says so next
            return {tp: -1 for tp in want}
        if last is None:
            return None if any(want.values()) else got
        for src in (last.get("sources") if isinstance(last, dict) else
                    json.loads(last.json).get("sources")) or ():
            end = src.get("endOffset")
            while isinstance(end, str):
                end = None if end in ("None", "null", "") else json.loads(end)
            for t, parts in (end or {}).items():
                for part, off in parts.items():
                    if (t, int(part)) in got:
                        got[(t, int(part))] = int(off)
        return got

    def _spark_process_all_available(self, timeout: float | None = None) -> None:
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
        """Stop after the running micro-batch (if any) finishes. A trigger that is only asking
        the source for new offsets (an idle source long-polls there, up to 5 s at a time) has no
        batch in flight: it stops at once. Waiting for a moment between two such asks took 6-8 s
        on an idle query, as Spark's gap between them is ~50 ms."""
        deadline = time.monotonic() + timeout
        while self.is_active and time.monotonic() < deadline:
            st = self.status()
            if not st.get("isTriggerActive", False) or str(st.get("message", "")).startswith(
                    "Getting offsets"):
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
        if self._spark is None or not session_api.of(self._spark).alive():
            self._spark = get_session()
        return self._spark

    def source_frame(self, run: RunSpec, tasks: bool = True):
        """The query's source: one row per task and micro-batch (its offset ranges), or with
        ``tasks=False`` the records themselves (an engine whose operators read them)."""
        spark = self.session()
        r = (spark.readStream.format("statekit-kafka")
             .option("bootstrap", run.bootstrap)
             .option("topics", ",".join(dict.fromkeys(source_topics(run.plan))))
             .option("startingOffsets", run.starting_offsets)
             .option("isolation.level", run.isolation)
             .option("taskTimeout", str(float(run.task_timeout))))
        if tasks:
            r = r.option("tasks", str(int(run.partitions)))
            if run.extra.get("placement") != "executors":
                # one Spark task hands every stream task its ranges at once: the instances run
                # them side by side (Spark's task slots would run them a few at a time)
                r = r.option("taskGroups", "1")
        if run.max_records_per_trigger:
            r = r.option("maxRecordsPerTrigger", str(int(run.max_records_per_trigger)))
        if run.control_dir and session_api.is_connect(spark):
            r = (r.option("helpers.dir", run.control_dir)
                 .option("helpers.query", run.query_name or run.app))
        with REAPER.busy():                  # Spark's planners look the source up and create it
            df = r.load()
        plan_reader_early(df)   # planned while the query and its runner start (data_source_lookup)
        return df

    def build(self, run: RunSpec):
        """The streaming DataFrame of output rows (topic, key, value), not started."""
        src = self.source_frame(run)
        if run.extra.get("placement") == "executors":
            from statekit.engine.spark.executors import executor_frame

            return executor_frame(self.session(), src, run)
        return map_in_arrow(src, make_deliver(run), OUTPUT_SCHEMA)

    @staticmethod
    def memory_table_name(run: RunSpec) -> str:
        return run.memory_table or f"{run.app}_output".replace("-", "_")

    def start(self, run: RunSpec, on_progress: Callable[[dict], None] | None = None) -> RunningQuery:
        if run.partitions < 1:
            raise EngineError("partitions must be >= 1")
        spark = self.session()
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

    def keeps_helpers(self) -> bool:
        """Whether the session's server keeps Python helpers per query (Spark Connect)."""
        return session_api.is_connect(self._spark)

    def release_helpers(self, control_dir: str | None, queries) -> list:
        """End the Python helpers a Spark Connect server keeps for these stopped queries
        (``engine.spark.helpers``); a classic session has none to end. Returns their pids."""
        if not control_dir or not session_api.is_connect(self._spark):
            return []
        from statekit.engine.spark.helpers import reap

        return reap(control_dir, queries)


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
        with REAPER.busy():
            q = w.start()
            REAPER.watch(q)   # Spark's planners are ended once its first micro-batch planned
    except Exception as e:
        raise one_line(e, f"cannot start {name}") from None
    own_query(q)      # statekit stops it (stop_session); a query the user started, never
    rq = RunningQuery(spark, q, run)
    if on_progress is not None:
        _Listener.subscribe(spark, rq.id, on_progress)
    return rq

def start(run: RunSpec, on_progress=None) -> RunningQuery:
    return SparkEngine().start(run, on_progress)


__all__ = ["SparkEngine", "RunningQuery", "RunSpec", "EngineError", "SparkFailure", "start", "launch",
           "progress_dict", "make_deliver", "task_rows", "trace"]
