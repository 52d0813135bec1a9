"""Spark beyond this machine: a session the user already has, and what must be shared with executors.

* ``SessionEngine`` — the changelog engine on a given SparkSession (``App(spark=session)``): the
  ``statekit-kafka`` source is registered on it and its Python workers warmed once, and it is left
  running, with its SQL settings as they were, when the App stops.
* ``check_shared(spark, path, ...)`` — is a directory the driver names visible from the executors?
  A local path (``/mnt/shared/x``, ``file:/...``) is checked for real: the driver writes a marker
  file, a small Spark job looks for it from the executors. A URI of another scheme (``hdfs://``,
  ``s3a://``, ``gs://``, ``abfss://``, ``dbfs:/``) is storage every node reaches by construction.
* ``delete_checkpoint(spark, location)`` — ``App.reset()`` for a checkpoint outside the state dir.
* ``live_executors(spark)`` — the executors the driver has now (id -> host), for the executors
  placement's membership; ``prefer_executor(...)`` — tell Spark's ``StateStoreCoordinator`` that a
  task's state partition lives on an executor, so that Spark schedules its next batch there (what
  an executor reports itself when it loads the partition; the executors placement uses it to send
  a lost executor's task to the executor with its warm copy).
"""
from __future__ import annotations

import os
import re
import uuid
from typing import Optional

from statekit.engine.spark import session_api
from statekit.engine.spark.engine import SparkEngine
from statekit.engine.spark.session import session_master
from statekit.errors import StatekitError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_MARKER = ".statekit-shared-"


class NotShared(StatekitError):
    """A directory that must be shared with the executors is not visible from them."""


class SessionStopped(StatekitError):
    """The SparkSession given to the App was stopped."""


def is_remote_uri(path: str) -> bool:
    """True for a URI whose scheme is not ``file`` (storage every node reaches by construction)."""
    m = _SCHEME.match(str(path))
    return bool(m) and len(m.group(1)) > 1 and m.group(1).lower() != "file"


def local_path(path: str) -> str:
    """``file:/x`` or ``file:///x`` -> ``/x``; a plain path as an absolute path."""
    p = str(path)
    if p.lower().startswith("file:"):
        p = re.sub(r"^file:(//)?", "", p, flags=re.IGNORECASE)
    return os.path.abspath(os.path.expanduser(p))


def join(location: str, *parts: str) -> str:
    """``location``/parts, for a local path or a URI."""
    if is_remote_uri(location):
        return "/".join([location.rstrip("/"), *[str(p).strip("/") for p in parts]])
    return os.path.join(local_path(location), *map(str, parts))


# -- the probe ---------------------------------------------------------------------------------------

def _probe_partition(paths: list):
    def probe(batches):
        import socket
        import time as _time

        import pyarrow as pa

        from statekit.engine.spark.executor_id import executor_identity

        for _ in batches:
            pass
        _time.sleep(0.3)   # long enough that every idle executor gets some of the probe's tasks
        eid, _pid = executor_identity()
        seen = [os.path.exists(p) for p in paths]
        yield pa.RecordBatch.from_arrays(
            [pa.array([socket.gethostname()]), pa.array([eid or "driver"]),
             pa.array([",".join("1" if s else "0" for s in seen)])],
            names=["host", "executor", "seen"])

    return probe


def probe_executors(spark, paths: list, tasks: Optional[int] = None) -> list:
    """``[{"host", "executor", "seen": [bool per path]}]``, one row per probe task: what the
    executors that ran the probe see. Best effort: Spark decides where the tasks go."""
    try:
        n = tasks or max(4, 2 * session_api.of(spark).default_parallelism())
    except Exception:  # noqa: BLE001 - a session going away: the probe says so
        n = tasks or 8
    try:
        rows = (spark.range(n, numPartitions=n)
                .mapInArrow(_probe_partition(list(paths)), "host string, executor string, seen string")
                .collect())
    except Exception as exc:  # noqa: BLE001
        if "No module named 'statekit'" in str(exc) or "No module named statekit" in str(exc):
            raise NotShared("the executors' Python cannot import statekit: install statekit and its "
                            "dependencies in the Python PYSPARK_PYTHON names on every host (or ship "
                            "them with spark.archives)") from None
        raise
    return [{"host": r["host"], "executor": r["executor"],
             "seen": [c == "1" for c in r["seen"].split(",")] if paths else []} for r in rows]


def check_shared(spark, paths: dict) -> dict:
    """For every ``{name: path}``, whether the executors see it: ``{name: None}`` (seen, or a
    remote URI) or ``{name: "executor 1 on host-a"}`` (the first that did not). The driver
    creates each local path and a marker file in it for the duration of the check."""
    local = {name: local_path(p) for name, p in paths.items() if not is_remote_uri(p)}
    out = {name: None for name in paths}
    if not local:
        return out
    markers = {}
    token = uuid.uuid4().hex[:12]
    try:
        for name, p in local.items():
            os.makedirs(p, exist_ok=True)
            m = os.path.join(p, _MARKER + token)
            with open(m, "w") as f:
                f.write("statekit checks that the executors see this directory\n")
            markers[name] = m
        names = list(markers)
        for row in probe_executors(spark, [markers[n] for n in names]):
            for name, seen in zip(names, row["seen"]):
                if not seen and out[name] is None:
                    out[name] = f"executor {row['executor']} on {row['host']}"
    finally:
        for m in markers.values():
            try:
                os.unlink(m)
            except OSError:
                pass
    return out


def executor_hosts(spark) -> set:
    """The host names of the executors that ran a probe (best effort)."""
    return {r["host"] for r in probe_executors(spark, [])}


def speculation_on(spark) -> bool:
    try:
        return str(spark.conf.get("spark.speculation", "false")).lower() == "true"
    except Exception:  # noqa: BLE001
        return False


def task_max_failures(spark) -> Optional[int]:
    try:
        return int(spark.conf.get("spark.task.maxFailures", "4"))
    except Exception:  # noqa: BLE001
        return None


def delete_checkpoint(spark, location: str) -> bool:
    """Delete a checkpoint directory (a local path, or a URI through Hadoop's FileSystem)."""
    if not is_remote_uri(location):
        import shutil

        p = local_path(location)
        existed = os.path.exists(p)
        shutil.rmtree(p, ignore_errors=True)
        return existed
    if spark is None:
        raise StatekitError(f"cannot delete the checkpoint {location} without a Spark session: "
                            f"delete it with your storage's tools")
    jvm = session_api.of(spark).jvm(f"reset() of the checkpoint {location} (Hadoop's FileSystem)",
                                    "delete it with your storage's tools, or use a local path")
    path = jvm.org.apache.hadoop.fs.Path(location)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.delete(path, True))


# -- the executors and their state partitions ---------------------------------------------------------

def live_executors(spark) -> Optional[dict]:
    """``{executor id: host}`` of the live executors (the driver left out); None when the session
    cannot tell (Spark Connect: no SparkContext)."""
    if spark is None:
        return None
    return session_api.of(spark).executors()


def _state_partition(spark, query_name: str, partition: int):
    """(StateStoreProviderId of ``partition`` of the query's stateful operator, the coordinator)."""
    q = next((q for q in spark.streams.active if q.name == query_name), None)
    if q is None:
        return None, None
    if session_api.is_connect(spark):   # Spark Connect: no coordinator to ask
        return None, None
    ex = q._jsq.streamingQuery().lastExecution()
    if ex is None:
        return None, None
    jvm = session_api.of(spark).jvm()
    pkg = jvm.org.apache.spark.sql.execution.streaming.state
    sid = pkg.StateStoreId.apply(ex.checkpointLocation(), 0, int(partition),
                                 pkg.StateStoreId.DEFAULT_STORE_NAME())
    pid = pkg.StateStoreProviderId.apply(sid, jvm.java.util.UUID.fromString(str(q.runId)))
    return pid, spark._jsparkSession.streams().stateStoreCoordinator()


def state_location(spark, query_name: str, partition: int) -> Optional[str]:
    """The executor Spark's ``StateStoreCoordinator`` has for ``partition`` of the query's stateful
    operator (its executor id), or None."""
    try:
        pid, coord = _state_partition(spark, query_name, partition)
        if pid is None:
            return None
        loc = coord.getLocation(pid)
        if loc.isEmpty():
            return None
        return str(loc.get()).rsplit("_", 1)[1]     # executor_<host>_<id>
    except Exception:  # noqa: BLE001
        return None


def prefer_executor(spark, query_name: str, partition: int, executor_id: str, host: str) -> bool:
    """Record in Spark's ``StateStoreCoordinator`` that ``partition`` of the query's stateful
    operator lives on ``executor_id``: the scheduler sends its next batch there. False when the
    query or its operator is not known (yet)."""
    try:
        pid, coord = _state_partition(spark, query_name, partition)
        if pid is None:
            return False
        jvm = session_api.of(spark).jvm()
        none = jvm.org.apache.spark.api.python.PythonUtils.toSeq(jvm.java.util.ArrayList())
        coord.reportActiveInstance(pid, str(host), str(executor_id), none)
        return True
    except Exception:  # noqa: BLE001 - a best effort: without it Spark picks any executor
        return False


# -- the user's session ------------------------------------------------------------------------------

_KEEP_CONF = ("spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled")


class SessionEngine(SparkEngine):
    """``SparkEngine`` on a session the user owns: registered and warmed once, never stopped by
    statekit, its SQL settings put back after each query starts (a streaming query keeps the
    settings it started with; the user's other jobs keep theirs)."""

    def __init__(self, spark):
        super().__init__(spark)
        self._ready = False

    def session(self):
        spark = self._spark
        api = session_api.of(spark)
        if not api.alive():
            raise SessionStopped("the SparkSession given to App(spark=...) was stopped: create a "
                                 "new App with a running session")
        if not self._ready:
            from statekit.engine.spark.session import warm_workers

            api.register_source()
            if not getattr(spark, "_statekit_warm", False):
                warm_workers(spark)
                try:
                    spark._statekit_warm = True
                except Exception:  # noqa: BLE001
                    pass
            self._ready = True
        return spark

    def start(self, run, on_progress=None):
        spark = self.session()
        saved = {}
        for k in _KEEP_CONF:
            try:
                saved[k] = spark.conf.get(k, None)
            except Exception:  # noqa: BLE001
                saved[k] = None
        try:
            return super().start(run, on_progress)
        finally:
            for k, v in saved.items():
                try:
                    if v is None:
                        spark.conf.unset(k)
                    else:
                        spark.conf.set(k, v)
                except Exception:  # noqa: BLE001
                    pass

    @property
    def master(self) -> Optional[str]:
        return session_master(self._spark)
