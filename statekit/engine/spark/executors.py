"""The ``executors`` placement: each stream task runs in a Spark Python worker, on the executor that
holds its state — the placement for a cluster, where the driver's instance processes are out of the
executors' reach.

The query (``executor_frame``) is the ``statekit-kafka`` source's one row per task and micro-batch
(its offset ranges), routed through a stateful operator keyed by task:
``groupBy(salt).applyInPandasWithState(...)``, whose only state is the task's last batch id. Spark
keeps a stateful operator's partition on the executor that loaded its state store (the
``StateStoreCoordinator`` records where each store lives and the scheduler prefers that executor),
so Spark itself keeps sending task p to the executor that ran it last. The salt
(``engine.spark.salt``) puts task p alone in state partition p. There, in the Python worker
(``engine.spark.resident``), the task stays open across micro-batches: its RocksDB, its producer,
its record caches. It moves only when its executor is lost (Spark retries the Spark task elsewhere,
and the task opens there from the freshest local copy: a standby that tailed its changelog, an old
copy of its own, or the changelog) or when Spark cannot wait for it (the scheduler's locality wait,
``spark.locality.wait``, 3 s by default, runs out while its executor is busy).

Per micro-batch the task does what ``statekit.worker.task.StreamTask.process`` does: skip the batch
if its id is already applied, read its ranges, process, commit (changelog records and markers, the
outputs, one RocksDB WriteBatch, the checkpoint). So:

* a Spark task that fails (its executor lost mid-batch, its Python worker killed) is retried by
  Spark, elsewhere or here, with the same batch id: a batch committed before the failure is skipped,
  one that was not is processed from the last commit (exactly-once state, as on instances);
* ``STATEKIT_EXECUTOR_LOCALITY=off`` (read when the query starts) runs the tasks the simple way
  instead: one stage, each batch's task wherever Spark puts it, opened and closed per batch
  (``run_on_executor``; a baseline for bench/cluster.py).

Where the state lives on an executor (``state_root``), first match wins:

1. ``App(executor_state_dir=...)`` — the same path on every executor host;
2. ``$STATEKIT_EXECUTOR_STATE_DIR`` in the executor's environment (``spark.executorEnv.…``, or the
   cluster's ``spark-env.sh``);
3. the root of Spark's local directories on that executor (``SPARK_LOCAL_DIRS``, without the
   per-application ``spark-<uuid>/executor-<uuid>/blockmgr-<uuid>`` part, which Spark deletes when the
   application ends) + ``/statekit``;
4. ``<tmp>/statekit-executor-<uid>``.

Under it, ``<deployment>/<app>/<task>/`` where ``<deployment>`` is a digest of the bootstrap servers
and the driver's state dir, so that two applications of the same name on different brokers never
share a directory. The App passes 1 as ``<state_dir>/executors`` on a local master (there the
driver's disk is the executor's).

Crash directives (``App.crash``) are claimed by the Python worker running the task, which then dies
by mode: ``process`` — the Python worker only (Spark retries its task); ``executor`` — its executor
JVM too (the executor is lost; its state directory stays, as a host's disk after a reboot);
``disk-loss`` — the executor JVM and this application's state directory on that executor.
"""
from __future__ import annotations

import hashlib
import os
import re
import signal
import tempfile
import time
from typing import Optional

from statekit.engine.spark.executor_id import executor_identity, instance_number
from statekit.engine.spark.procs import descendants, parent
from statekit.engine.spark.stage_rows import OUTPUT_SCHEMA, task_rows, trace
from statekit.engine.spec import RunSpec

STATE_DIR_ENV = "STATEKIT_EXECUTOR_STATE_DIR"
LOCALITY_ENV = "STATEKIT_EXECUTOR_LOCALITY"
PLACEMENT = "executors"
STAGE_OUTPUT = "task int, outputs long"
STAGE_STATE = "batch long"
_SPARK_APP_DIR = re.compile(r"^(?:spark|executor|blockmgr)-[0-9a-f]{8}-[0-9a-f-]{27}$")
_LOCK_WAIT_S = 30.0


def deployment_scope(bootstrap: str, driver_state_dir: str) -> str:
    """Eight hex digits naming one deployment of an application (its broker and driver state)."""
    return hashlib.sha1(f"{bootstrap}\0{driver_state_dir}".encode()).hexdigest()[:8]


def state_root(configured: Optional[str] = None) -> str:
    """This executor's root for statekit state (see the module docstring for the order)."""
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    local = (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0].strip()
    if local:
        d = os.path.abspath(local)
        while _SPARK_APP_DIR.match(os.path.basename(d)):
            d = os.path.dirname(d)
        return os.path.join(d, "statekit")
    return os.path.join(tempfile.gettempdir(), f"statekit-executor-{os.getuid()}")


def _gone(pids: list, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except OSError:
                break
            time.sleep(0.01)


def _holders(root: str) -> list:
    """Processes of this user, but this one and its ancestors, with a file open under ``root``
    (the Python workers holding this application's tasks there: their RocksDB, their locks)."""
    me, mine = os.getpid(), set()
    p = parent(os.getpid())
    while p and p > 1:
        mine.add(p)
        p = parent(p)
    prefix = os.path.realpath(root) + os.sep
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me or int(name) in mine:
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}").startswith(prefix):
                    out.append(int(name))
                    break
            except OSError:
                continue
    return out


def _die_with_executor(task_root: str):
    """A crash directive's death on an executor (``statekit.worker.crash.on_death``): for the
    ``executor`` and ``disk-loss`` modes the executor JVM and every other process it runs (its
    Python workers) die first — so nothing of that executor writes afterwards — then, for
    disk-loss, this application's state directory on it is deleted; then this worker dies. On a
    local master (no executor JVM: the driver, or a Spark Connect server, runs the tasks) the
    Python workers that hold this application's tasks there die instead of a JVM (others' work
    on that driver goes on): no task of it writes into a directory deleted under it."""

    def death(directive: dict) -> None:
        import shutil

        mode = directive.get("mode", "process")
        if mode == "process":
            return
        for sig in (signal.SIGHUP, signal.SIGTERM):   # the daemon's farewell must not stop us yet
            signal.signal(sig, signal.SIG_IGN)
        _eid, jvm = executor_identity()
        if jvm is not None:
            others = [p for p in descendants(jvm) if p != os.getpid()]
            os.kill(jvm, signal.SIGKILL)
            for p in others:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _gone([jvm, *others])
        else:
            holders = _holders(task_root)
            for p in holders:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _gone(holders)
        if mode == "disk-loss":
            shutil.rmtree(task_root, ignore_errors=True)

    return death


_KAFKA: dict = {}


def _kafka(bootstrap: str, task_timeout: float = 300.0):
    """One Kafka client per Python worker process (Spark reuses workers across batches)."""
    key = (os.getpid(), bootstrap)
    k = _KAFKA.get(key)
    if k is None:
        from statekit.kafka import Kafka
        from statekit.kafka.retry import request_timeout_for

        k = _KAFKA[key] = Kafka(bootstrap, timeout=request_timeout_for(task_timeout))
    return k


def _riding_out(run: RunSpec, attempt):
    """``attempt()`` (a batch of a task here), again with backoff while Kafka is away, up to the
    task timeout (``statekit.kafka.retry``): each failed attempt dropped its copy of the task, so
    the next reopens it — aborting the transaction left in flight — and replays the batch, or
    skips it when its commit landed after all."""
    from statekit.kafka.retry import retrying

    return retrying(attempt, timeout=run.task_timeout, what=f"a task of {run.app}",
                    bootstrap=run.bootstrap, on_failure=lambda: _drop_kafka(run.bootstrap))


def _drop_kafka(bootstrap: str) -> None:
    k = _KAFKA.pop((os.getpid(), bootstrap), None)
    if k is not None:
        try:
            k.close()
        except Exception:  # noqa: BLE001
            pass


def run_resident(run: RunSpec, task, batch_id: int, ranges) -> int:
    """Run one batch of ``task`` on its copy open in this Python worker (opened first when
    needed: ``engine.spark.resident``). Returns the outputs' count."""
    from statekit.engine.spark.resident import resident
    from statekit.errors import BrokerUnreachable
    from statekit.worker import crash as crash_mod

    x = run.extra
    root = os.path.join(state_root(x.get("executor_state_dir")), x["scope"])
    eid, _jvm = executor_identity()
    crash_mod.on_death(_die_with_executor(root))
    r = resident()
    app = r.app_for(run, root, eid)
    try:
        return _riding_out(run, lambda: r.run_batch(app, task, batch_id, ranges,
                                                    _kafka(run.bootstrap, run.task_timeout)))
    except (BrokerUnreachable, OSError):
        _drop_kafka(run.bootstrap)   # the next attempt starts on a fresh connection
        raise


def run_on_executor(run: RunSpec, task, batch_id: int, ranges) -> int:
    """Open ``task`` in this executor's state directory, run one batch, close it (the
    ``STATEKIT_EXECUTOR_LOCALITY=off`` way). Returns the outputs' count."""
    from statekit.errors import BrokerUnreachable, StateLocked
    from statekit.worker import crash as crash_mod
    from statekit.worker.task import run_task_batch

    x = run.extra
    spec = x["worker_spec"]
    root = os.path.join(state_root(x.get("executor_state_dir")), x["scope"])
    eid, _jvm = executor_identity()
    crash_mod.on_death(_die_with_executor(root))
    publish = _publisher(run)
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            return _riding_out(run, lambda: run_task_batch(
                spec, task, batch_id, ranges, state_dir=root, instance=instance_number(eid),
                publish=publish, kafka=_kafka(run.bootstrap, run.task_timeout)))
        except StateLocked:
            # the previous attempt's Python worker is still going away: its lock goes with it
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        except (BrokerUnreachable, OSError):
            _drop_kafka(run.bootstrap)   # the next attempt starts on a fresh connection
            raise


def _publisher(run: RunSpec):
    """Events of the task to ``<app>-events`` (the driver reads them), without the per-batch
    ``TaskClosed`` (closing after every batch is how this placement works, not news)."""
    if not run.events:
        return lambda e: None
    from statekit import events as ev
    from statekit.event_bus import EventPublisher

    pub = EventPublisher(run.bootstrap, run.app)
    generation = run.extra.get("generation")

    def publish(e) -> None:
        if isinstance(e, ev.TaskClosed):
            return
        if e.generation is None:
            e.generation = generation
        pub.publish(e)

    return publish


def locality_enabled() -> bool:
    """False when ``STATEKIT_EXECUTOR_LOCALITY`` is ``off`` (or 0/false/no)."""
    return os.environ.get(LOCALITY_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def executor_frame(spark, src, run: RunSpec):
    """The executors placement's query over the source's task rows (see the module docstring)."""
    if not locality_enabled():

        return src.mapInArrow(make_executor_stage(run), OUTPUT_SCHEMA)
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from statekit.engine.spark.salt import salts

    n = int(run.partitions)
    # the stateful operator's partitions (= state partitions) are the session's shuffle
    # partitions when the query first starts (kept in its checkpoint afterwards)
    spark.conf.set("spark.sql.shuffle.partitions", str(n))
    salt = F.element_at(F.array(*[F.lit(v) for v in salts(n)]), F.col("task") + 1)
    return (src.withColumn("salt", salt).groupBy("salt")
            .applyInPandasWithState(make_resident_stage(run), STAGE_OUTPUT, STAGE_STATE, "append",
                                    GroupStateTimeout.NoTimeout))


def make_resident_stage(run: RunSpec):
    """The stateful operator's function: the task of this group (one row: its ranges) runs on its
    resident copy; the group's state becomes the batch id."""
    sub = int(run.subtopology)

    def stage(key, frames, state):
        import json as _json
        import time as _time

        from pyspark import TaskContext

        from statekit.contracts import TaskId

        ctx = TaskContext.get()
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or -1)
        for pdf in frames:
            for task, ranges in zip(pdf["task"].tolist(), pdf["ranges"].tolist()):
                t0 = _time.perf_counter()
                rs = [tuple(r) for r in _json.loads(ranges)]
                n = run_resident(run, TaskId(sub, int(task)), batch_id, rs)
                trace({"stage": "resident", "placement": PLACEMENT, "task": int(task),
                       "batch": batch_id, "ranges": rs, "outputs": n, "pid": os.getpid(),
                       "executor": executor_identity()[0], "attempt": ctx.attemptNumber(),
                       "s": round(_time.perf_counter() - t0, 3)})
        state.update((batch_id,))
        return iter(())

    return stage


def make_executor_stage(run: RunSpec):
    """The query's one stage with ``STATEKIT_EXECUTOR_LOCALITY=off``: each task's micro-batch
    opened, processed, committed and closed in whichever Python worker received it."""
    sub = int(run.subtopology)

    def stage(batches):
        import time as _time

        from pyspark import TaskContext

        from statekit.contracts import TaskId

        ctx = TaskContext.get()
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or -1)
        for task, ranges in task_rows(batches):
            t0 = _time.perf_counter()
            n = run_on_executor(run, TaskId(sub, task), batch_id, ranges)
            trace({"stage": "task", "placement": PLACEMENT, "task": task, "batch": batch_id,
                   "ranges": ranges, "outputs": n, "attempt": ctx.attemptNumber(),
                   "s": round(_time.perf_counter() - t0, 3)})
        return
        yield  # a generator that yields nothing: the task wrote its outputs

    return stage
