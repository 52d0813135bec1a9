"""`SparkNativeEngine`: the same `RunSpec` as `SparkEngine`, state in Spark's RocksDB state store.

    SparkNativeEngine(min_deltas_for_snapshot=10, maintenance_interval=None).start(run) -> NativeQuery

Spark settings it applies (SQL confs, set before every start):

    spark.sql.streaming.stateStore.providerClass = ...RocksDBStateStoreProvider
    spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled = true
    spark.sql.streaming.stateStore.minDeltasForSnapshot = <min_deltas_for_snapshot>
    spark.sql.streaming.stateStore.maintenanceInterval = <maintenance_interval>

Snapshots are made at commit once `minDeltasForSnapshot` changelog versions piled up since the last
one and uploaded to the checkpoint by the maintenance thread, so the maintenance interval bounds how
soon a snapshot reaches the checkpoint. The maintenance thread is started once per JVM with the
interval in force at the first state store load: `native_session()` sets it when it creates the
session; on a session that already ran a stateful query, a new value waits for the next JVM.

A "real" failure (`kill_jvm`): SIGKILL the driver JVM (executors, RocksDB instances, the maintenance
thread die with it), delete the RocksDB working directories Spark keeps under its local dir, and
forget PySpark's handles on the dead JVM; the next `native_session()` starts a new JVM, and the query
restarts from the checkpoint: every state partition loads its latest snapshot and replays the
changelog files written since (reported by the first batch's state operator metrics).
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import sys
import tempfile
import time

from statekit.engine.spark import session_api
from statekit.engine.spark.engine import RunningQuery, SparkEngine, progress_dict
from statekit.engine.spark.session import (forget_owned_session, get_session, log_dir, one_line,
                                           quiet_accumulator_hangup, statekit_owns)
from statekit.engine.spec import RunSpec
from statekit.errors import StatekitError

PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CONF_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
CONF_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
CONF_MIN_DELTAS = "spark.sql.streaming.stateStore.minDeltasForSnapshot"
CONF_MAINTENANCE = "spark.sql.streaming.stateStore.maintenanceInterval"


class NativeEngineError(StatekitError):
    pass


def _interval(v) -> str:
    if isinstance(v, (int, float)):
        return f"{int(round(float(v) * 1000))}ms"
    return str(v)


def native_conf(min_deltas_for_snapshot: int = 10, maintenance_interval=None) -> dict:
    """The SQL confs of the native engine; `maintenance_interval` None leaves the session's value
    (Spark's default: 60 s)."""
    conf = {
        CONF_PROVIDER: PROVIDER,
        CONF_CHANGELOG: "true",
        "spark.sql.codegen.wholeStage": "true",   # its operators compute in the JVM
        "spark.sql.codegen.factoryMode": "FALLBACK",
        CONF_MIN_DELTAS: str(int(min_deltas_for_snapshot)),
    }
    if maintenance_interval is not None:
        conf[CONF_MAINTENANCE] = _interval(maintenance_interval)
    return conf


def default_local_dir() -> str:
    """The spark.local.dir statekit gives a session it creates (RocksDB working dirs live below)."""
    return os.path.join(tempfile.gettempdir(), f"statekit-spark-local-{os.getuid()}", str(os.getpid()))


def native_session(min_deltas_for_snapshot: int = 10, maintenance_interval=None, local_dir=None):
    """The active SparkSession, or a new one with the native state store settings and a
    statekit-owned spark.local.dir (so the RocksDB working dirs can be found and deleted)."""
    from pyspark.sql import SparkSession

    conf = native_conf(min_deltas_for_snapshot, maintenance_interval)
    spark = SparkSession.getActiveSession()
    if spark is None:
        ld = local_dir or default_local_dir()
        os.makedirs(ld, exist_ok=True)
        extra = dict(conf)
        extra["spark.local.dir"] = ld
        spark = get_session("statekit", extra_conf=extra)
    for k, v in conf.items():
        spark.conf.set(k, v)
    return spark


def local_dirs(spark=None) -> list:
    """This application's own local root dirs (`<spark.local.dir>/spark-<uuid>`, asked from the
    live JVM), where Spark keeps the RocksDB working dirs. Never a shared dir such as /tmp itself:
    other Spark applications on the machine keep theirs there too."""
    if spark is not None and not session_api.is_connect(spark):
        try:
            sc = spark.sparkContext
            roots = sc._jvm.org.apache.spark.util.Utils.getOrCreateLocalRootDirs(sc._jsc.sc().conf())
            return [str(r) for r in roots]
        except Exception:
            pass
    own = default_local_dir()
    return [own] if os.path.isdir(own) else []


def rocksdb_working_dirs(roots) -> list:
    """Spark's local RocksDB working dirs (`StateStoreId(...)` temp dirs) under the given roots."""
    out = []
    for root in roots:
        for pat in ("StateStoreId*", "spark-*/StateStoreId*"):
            out.extend(glob.glob(os.path.join(root, pat)))
    return sorted(set(p for p in out if os.path.isdir(p)))


def _du(path: str) -> int:
    total = 0
    for dp, _dn, fn in os.walk(path):
        for f in fn:
            try:
                total += os.path.getsize(os.path.join(dp, f))
            except OSError:
                pass
    return total


def wipe_rocksdb_dirs(roots) -> dict:
    """Delete Spark's local RocksDB working dirs (a lost disk); {"dirs", "bytes"}."""
    dirs = rocksdb_working_dirs(roots)
    size = 0
    for d in dirs:
        size += _du(d)
        shutil.rmtree(d, ignore_errors=True)
    return {"dirs": len(dirs), "bytes": size, "paths": dirs}


def jvm_pid():
    """The pid of this process's Spark driver JVM (None when there is none)."""
    from pyspark import SparkContext

    gw = getattr(SparkContext, "_gateway", None)
    proc = getattr(gw, "proc", None) if gw is not None else None
    if proc is None:
        return None
    pid = proc.pid
    # spark-submit execs java: the Popen child is the JVM itself; otherwise look for a java child
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        if b"java" in cmd.split(b"\0")[0]:
            return pid
        for child in glob.glob(f"/proc/{pid}/task/*/children"):
            with open(child) as f:
                for c in f.read().split():
                    with open(f"/proc/{c}/cmdline", "rb") as g:
                        if b"java" in g.read().split(b"\0")[0]:
                            return int(c)
    except OSError:
        pass
    return pid


def forget_dead_session() -> None:
    """Drop PySpark's references to a JVM that died, so that the next session starts a new one."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gw = getattr(SparkContext, "_gateway", None)
    if gw is not None:
        try:
            gw.shutdown_callback_server(raise_exception=False)
        except Exception:
            pass
        try:
            gw.close(keep_callback_server=False, close_callback_server_connections=True)
        except Exception:
            pass
        proc = getattr(gw, "proc", None)
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except Exception:
                pass
    with SparkContext._lock:
        sc = SparkContext._active_spark_context
        if sc is not None:
            sc._jsc = None  # holders of the old session (SparkEngine.session()) see it as stopped
            try:
                sc._accumulatorServer.shutdown()
            except Exception:
                pass
        SparkContext._active_spark_context = None
        SparkContext._gateway = None
        SparkContext._jvm = None
    forget_owned_session()
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    eng = sys.modules.get("statekit.engine.spark.engine")
    if eng is not None:
        eng._Listener._installed.clear()
    _RawListener._installed.clear()


def kill_jvm(spark=None, wipe_local: bool = True) -> dict:
    """SIGKILL the driver JVM now (a machine failure: nothing is flushed, no query stops cleanly),
    then delete the local RocksDB working dirs. Returns {"pid", "killed_at", "wiped": {...}}."""
    roots = local_dirs(spark)
    pid = jvm_pid()
    if pid is None:
        raise NativeEngineError("no Spark JVM is running in this process")
    from pyspark import SparkContext

    quiet_accumulator_hangup(SparkContext._active_spark_context)   # a dead JVM is what we want
    t = time.time()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.02)
    forget_dead_session()
    wiped = wipe_rocksdb_dirs(roots) if wipe_local else {"dirs": 0, "bytes": 0, "paths": []}
    return {"pid": pid, "killed_at": t, "wiped": wiped}


def unload_state_stores(spark) -> None:
    """Unload every state store provider of this JVM (closes their RocksDB instances)."""
    jvm = session_api.of(spark).jvm("unloading Spark's state stores", "crash() the changelog "
                                    "engine's App instead, or use a classic session")
    jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()


# --- the query ---------------------------------------------------------------------------------------


class NativeQuery(RunningQuery):
    """A RunningQuery (stop, abort, is_active, exception, process_all_available, recent_progress,
    last_batch_id) plus Spark's raw progress JSON with `stateOperators` (`raw_progress()`)."""

    def __init__(self, spark, query, run, engine):
        super().__init__(spark, query, run)
        self.engine = engine
        self.progress_log: list = []   # raw progress dicts received by the listener (live)

    def raw_progress(self) -> list:
        """Spark's progress JSON of every batch seen (listener + recentProgress), by batch id."""
        import json

        seen = {p.get("batchId"): p for p in self.progress_log}
        try:
            for p in self.query.recentProgress:
                d = json.loads(p.json)
                seen.setdefault(d.get("batchId"), d)
        except Exception:
            pass
        return [seen[b] for b in sorted(k for k in seen if k is not None)]


class SparkNativeEngine(SparkEngine):
    """`start(run)` runs the plan with Spark's RocksDB state store (see translate.py). Parameters:
    `min_deltas_for_snapshot`, `maintenance_interval` (seconds or "5s"; None = the session's);
    `run.extra["native"]` may override both per run, and `{"mode": "groupby"}` runs a plain count
    as groupBy().count()."""

    def __init__(self, spark=None, min_deltas_for_snapshot: int = 10, maintenance_interval=None,
                 mode: str = "tws"):
        super().__init__(spark)
        self.min_deltas_for_snapshot = int(min_deltas_for_snapshot)
        self.maintenance_interval = maintenance_interval
        self.mode = mode

    def _opts(self, run: RunSpec | None) -> dict:
        o = {"min_deltas_for_snapshot": self.min_deltas_for_snapshot,
             "maintenance_interval": self.maintenance_interval, "mode": self.mode}
        if run is not None:
            o.update((run.extra or {}).get("native") or {})
        return o

    def session(self, run: RunSpec | None = None):
        """The session, with `run`'s state store settings; without a run (SparkEngine.start's own
        call, after ours) the settings stay as the run set them."""
        o = self._opts(run)
        if self._spark is None or not session_api.of(self._spark).alive():
            self._spark = native_session(o["min_deltas_for_snapshot"], o["maintenance_interval"])
        elif run is not None:
            for k, v in native_conf(o["min_deltas_for_snapshot"], o["maintenance_interval"]).items():
                self._spark.conf.set(k, v)
        return self._spark

    def forget_session(self) -> None:
        self._spark = None

    def build(self, run: RunSpec):
        from pyspark.sql import functions as F

        from statekit.engine.spark_native import translate

        self.session(run)
        src = self.source_frame(run, tasks=False)
        src = src.select("key", "value", "topic", "partition", "offset",
                         F.unix_millis("timestamp").alias("ts"))
        if self._opts(run)["mode"] == "groupby":
            if translate.simple_count(run.plan) is None:
                raise NativeEngineError("mode='groupby' needs a topology that is one plain count")
            return translate.build_groupby_count(src, run.plan)
        return translate.build_native(src, run.plan)

    def spark_sink(self, run: RunSpec) -> str:
        return run.sink

    def output(self, run: RunSpec):
        """The memory sink's rows so far (pandas: topic, key, value, batch)."""
        from statekit.engine.spark.sink import memory_table

        return memory_table(self.memory_table_name(run))

    def _check_topics(self, run: RunSpec) -> None:
        from statekit.engine.spark.engine import sink_topics, source_topics
        from statekit.kafka import Kafka

        with Kafka(run.bootstrap) as k:
            for t in dict.fromkeys(source_topics(run.plan)):
                k.end_offsets(t)  # UnknownTopic, one line
            if run.sink == "kafka":
                for t in dict.fromkeys(sink_topics(run.plan)):
                    k.ensure_topic(t, run.partitions)

    def start(self, run: RunSpec, on_progress=None) -> NativeQuery:
        self._check_topics(run)
        # Spark's state partitions: one per app partition (a query restarted from its checkpoint
        # keeps the number it began with, whatever is set here)
        spark = self.session(run)
        spark.conf.set("spark.sql.shuffle.partitions", str(run.partitions))
        if self._opts(run)["mode"] == "groupby":
            rq = self._start_update(spark, run, on_progress)
        else:
            rq = super().start(run, on_progress=on_progress)
        q = NativeQuery(rq.spark, rq.query, run, self)
        _RawListener.subscribe(rq.spark, q)
        return q

    def _start_update(self, spark, run: RunSpec, on_progress=None) -> RunningQuery:
        """groupBy().count() needs outputMode "update"; memory or no sink."""
        from statekit.engine.spark.engine import launch

        name = run.query_name or run.app
        try:
            out = self.build(run)
        except StatekitError:
            raise
        except Exception as e:
            raise one_line(e, f"cannot build {name}") from None
        return launch(spark, out, run, self.memory_table_name(run), output_mode="update",
                      sink="memory" if run.sink == "memory" else "none", on_progress=on_progress)

    # -- what a runtime needs besides start() -------------------------------------------------------
    def crash(self, query: NativeQuery | None, mode: str = "jvm", during_batch: bool = True,
              wipe_local: bool = True, timeout: float = 30.0) -> dict:
        """Lose the state of the running query as in a real failure.

        mode="jvm": SIGKILL the driver JVM (with `during_batch`, first wait up to `timeout` s for a
        micro-batch to be running), delete the local RocksDB working dirs, forget the dead session;
        the next start() brings up a new JVM. mode="query": abort the query, unload every state
        store of this JVM (StateStore.stop()) and delete the working dirs: same restore work, no JVM
        cold start. Returns {"mode", "batch_running", "last_batch_id", "killed_at", "wiped", ...}."""
        if mode not in ("jvm", "query"):
            raise NativeEngineError(f"unknown crash mode {mode!r}; use 'jvm' or 'query'")
        spark = self._spark
        if session_api.is_connect(spark):
            raise NativeEngineError("a crash of Spark's own state store kills or unloads the Spark "
                                    "driver's JVM, which a Spark Connect session does not reach: "
                                    "crash an App (the changelog engine) instead, or use a classic "
                                    "session")
        if mode == "jvm" and spark is not None and not statekit_owns(spark):
            raise NativeEngineError("crash(mode='jvm') kills this process's Spark JVM, which runs a "
                                    "session statekit did not start: use crash(mode='query'), or "
                                    "let statekit start the session")
        running = False
        last = None
        if query is not None:
            deadline = time.monotonic() + (timeout if during_batch else 0)
            while True:
                st = query.status()
                running = bool(st.get("isTriggerActive")) and bool(st.get("isDataAvailable"))
                if running or time.monotonic() >= deadline or not query.is_active:
                    break
                time.sleep(0.01)
            last = query.last_batch_id
        roots = local_dirs(spark)
        if mode == "jvm":
            rec = kill_jvm(spark, wipe_local=wipe_local)
            self._spark = None
        else:
            t = time.time()
            if query is not None:
                query.abort()
            if spark is not None:
                # tasks of an interrupted batch may still run (and load a store) for a moment
                tracker = spark.sparkContext.statusTracker()   # classic: Connect refused above
                deadline = time.monotonic() + 15
                while tracker.getActiveJobsIds() and time.monotonic() < deadline:
                    time.sleep(0.05)
                unload_state_stores(spark)
            wiped = wipe_rocksdb_dirs(roots) if wipe_local else {"dirs": 0, "bytes": 0, "paths": []}
            rec = {"pid": None, "killed_at": t, "wiped": wiped}
        rec.update(mode=mode, batch_running=running, last_batch_id=last)
        return rec

    def query_all(self, run: RunSpec, store: str):
        """A store's committed contents (Spark's state data source reader), decoded."""
        from statekit.engine.spark_native.inspect import read_store

        grouped = self._opts(run)["mode"] == "groupby"
        return read_store(self.session(run), run.checkpoint_dir, run.plan, store, groupby=grouped)

    def checkpoint_files(self, run: RunSpec):
        from statekit.engine.spark_native.inspect import checkpoint_files

        return checkpoint_files(run.checkpoint_dir)

    def changelog_lag(self, run: RunSpec):
        from statekit.engine.spark_native.inspect import changelog_lag

        return changelog_lag(run.checkpoint_dir)

    @staticmethod
    def state_metrics(query: NativeQuery):
        from statekit.engine.spark_native.inspect import state_operator_metrics

        return state_operator_metrics(query.raw_progress())

    @staticmethod
    def restore_report(query: NativeQuery) -> dict:
        from statekit.engine.spark_native.inspect import restore_metrics

        return restore_metrics(query.raw_progress())


class _RawListener:
    """Keeps Spark's full progress JSON (with stateOperators) of native queries, live."""

    _installed: dict = {}
    _queries: dict = {}

    @classmethod
    def subscribe(cls, spark, q: NativeQuery) -> None:
        import json

        from pyspark.sql.streaming import StreamingQueryListener

        lst = cls._installed.get(id(spark))
        if lst is None:
            queries = cls._queries

            class L(StreamingQueryListener):
                def onQueryStarted(self, event):
                    pass

                def onQueryProgress(self, event):
                    nq = queries.get(str(event.progress.id))
                    if nq is not None:
                        try:
                            nq.progress_log.append(json.loads(event.progress.json))
                        except Exception:
                            pass

                def onQueryIdle(self, event):
                    pass

                def onQueryTerminated(self, event):
                    pass

            lst = L()
            spark.streams.addListener(lst)
            cls._installed[id(spark)] = lst
        cls._queries[q.id] = q

    @classmethod
    def forget(cls) -> None:
        cls._installed.clear()


def stop_native_session() -> None:
    """Stop the session cleanly (JVM included)."""
    from statekit.engine.spark.session import stop_session

    stop_session()
    _RawListener.forget()
    shutil.rmtree(default_local_dir(), ignore_errors=True)  # this process's spark.local.dir


__all__ = ["SparkNativeEngine", "NativeQuery", "native_session", "native_conf", "kill_jvm",
           "wipe_rocksdb_dirs", "rocksdb_working_dirs", "unload_state_stores", "stop_native_session",
           "progress_dict", "one_line", "log_dir"]
