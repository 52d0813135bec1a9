"""Where tasks run: ``instances`` (statekit's instance processes beside the driver) or ``executors``
(Spark's Python workers, wherever Spark schedules them) — and the control side of the latter.

``App(placement="auto")`` (the default) picks ``executors`` when the Spark master is not local
(``spark://``, ``yarn``, ``k8s://``, a Spark Connect session) and ``instances`` otherwise. The
instances listen on 127.0.0.1 and read the control directory, so they serve a cluster only when
every executor runs on the driver's machine; the executors placement works on any cluster.

With ``executors`` (``statekit.engine.spark.executors`` runs the tasks):

* Spark places every task of every micro-batch; statekit has no instances to kill, revive, add,
  remove or scale, and refuses those calls in one line. ``crash()`` still works: a crash directive in
  the control directory, claimed by the Python worker that runs the task (see
  ``engine.spark.executors`` for the modes ``process``, ``executor`` and ``disk-loss``); Spark
  retries the failed task, which replays the batch with its id.
* What must be shared, and is checked at ``start()`` (``engine.spark.cluster.check_shared``): the
  Spark checkpoint (``App(checkpoint_location=...)``, required on a cluster: a shared mount or an
  object store URI); the control directory (``<state_dir>/control``) when ``sink="memory"`` (the
  tasks write the outputs there) — on a real cluster use ``sink="kafka"`` — and for ``crash()``.
* Queries and ``lag()`` read the driver's query replicas (``runtime.query_replicas``).
* ``ExecutorsCoordinator`` stands where ``runtime.coordinator.Coordinator`` stands for instances:
  the App calls the same methods; what it observes comes from the tasks' events.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Callable, Optional

from statekit import events as ev
from statekit.contracts import Layout, TaskId
from statekit.errors import StatekitError
from statekit.runtime.assignor import Assignment
from statekit.runtime.coordinator import MembershipError

log = logging.getLogger("statekit.placement")

PLACEMENTS = ("auto", "instances", "executors")
EXECUTOR_CRASH_MODES = ("process", "executor", "disk-loss")


class PlacementError(StatekitError):
    """A placement that cannot work with this session, storage or sink."""


def check_placement(placement: str) -> str:
    if placement not in PLACEMENTS:
        raise StatekitError(f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}")
    return placement


def resolve_placement(requested: str, *, engine: str, master: Optional[str]) -> str:
    """``auto`` -> ``executors`` on a non-local master, else ``instances``; an explicit choice is
    checked against the engine."""
    from statekit.engine.spark.session import is_local_master

    check_placement(requested)
    spark_engine = engine == "changelog"
    if requested == "auto":
        return "executors" if spark_engine and master and not is_local_master(master) else "instances"
    if requested == "executors" and not spark_engine:
        raise PlacementError(f"placement='executors' runs the tasks inside Spark's executors: use "
                             f"engine='changelog' (not {engine!r})")
    return requested


def deployment_id(layout: Layout) -> str:
    """A random id kept in ``<state_dir>/deployment``: part of the executors' state directory names,
    so that a ``reset()`` (which deletes the state dir) never meets an old executor copy again."""
    path = os.path.join(layout.root, "deployment")
    try:
        with open(path) as f:
            got = f.read().strip()
        if got:
            return got
    except FileNotFoundError:
        pass
    os.makedirs(layout.root, exist_ok=True)
    new = uuid.uuid4().hex
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(new + "\n")
    os.replace(tmp, path)
    return new


def prepare(*, placement: str, spark, master: Optional[str], layout: Layout, bootstrap: str,
            sink: str, checkpoint_location: Optional[str], executor_state_dir: Optional[str]) -> dict:
    """Check that ``placement`` can work here and return what its runs need (``RunSpec.extra``
    without the worker spec): ``{"placement", "scope", "executor_state_dir", "control_shared"}``.
    Raises ``PlacementError`` (one line, says what to do)."""
    import socket

    from statekit.engine.spark import cluster
    from statekit.engine.spark.executors import deployment_scope
    from statekit.engine.spark.session import is_local_master

    local = master is None or is_local_master(master)
    if placement == "instances":
        if not local and spark is not None:
            hosts = cluster.executor_hosts(spark) - {socket.gethostname()}
            if hosts:
                raise PlacementError(
                    f"placement='instances' needs every executor on this machine (instances listen "
                    f"on 127.0.0.1), but executors run on {', '.join(sorted(hosts))}: use "
                    f"placement='executors'")
        return {"placement": "instances"}
    if cluster.speculation_on(spark):
        raise PlacementError("placement='executors' needs spark.speculation=false: two attempts of "
                             "one task would both write its changelog")
    control_shared = True
    if not local:
        if not checkpoint_location:
            raise PlacementError(
                f"on a cluster (master {master}) name the Spark checkpoint on storage every node and "
                f"the next driver reach: App(checkpoint_location='s3a://…' / 'hdfs://…' / a shared "
                f"mount)")
        seen = cluster.check_shared(spark, {"checkpoint": checkpoint_location,
                                            "control": layout.control_dir})
        if seen["checkpoint"] is not None:
            raise PlacementError(
                f"checkpoint_location {checkpoint_location} is not visible from {seen['checkpoint']}: "
                f"use a shared file system mounted at the same path everywhere, or an object store URI")
        control_shared = seen["control"] is None
        if sink == "memory" and not control_shared:
            raise PlacementError(
                f"sink='memory' needs the control directory {layout.control_dir} visible from the "
                f"executors (the tasks write their outputs there; {seen['control']} does not see "
                f"it): use sink='kafka' on a cluster, or a state_dir on a shared file system")
    if executor_state_dir is None and local:
        executor_state_dir = os.path.join(layout.root, "executors")
    return {"placement": "executors", "executor_state_dir": executor_state_dir,
            "scope": deployment_scope(bootstrap, deployment_id(layout)),
            "control_shared": control_shared}


# -- the control side of the executors placement ------------------------------------------------------

def _refusal(what: str) -> MembershipError:
    return MembershipError(f"{what}: with placement='executors' Spark places the tasks on its executors "
                           f"and statekit has no instances to manage; crash() kills a Python worker or "
                           f"an executor (Spark retries its task), or use placement='instances'")


class ExecutorsCoordinator:
    """What ``runtime.coordinator.Coordinator`` is for instances, for the executors placement: no
    processes and no rebalances; the executors that ran each task come from the tasks' events, the
    stores from the driver's query replicas."""

    def __init__(self, *, application: str, layout: Layout, spec, tasks: list, extra: dict,
                 publish: Callable[[ev.Event], None], subscribe: Callable, unsubscribe: Callable,
                 generation: int = 0):
        from statekit.runtime.query_replicas import QueryReplicas

        self.application = application
        self.layout = layout
        self.spec = spec
        self.tasks = sorted(TaskId.parse(t) for t in tasks)
        self.extra = dict(extra)
        self.publish = publish
        self._subscribe, self._unsubscribe = subscribe, unsubscribe
        self.replicas = QueryReplicas(application, spec.plans, spec.partitions,
                                      os.path.join(layout.root, "query-replicas"), spec.bootstrap)
        self.options: dict = {}
        self.members: dict = {}
        self.rebalances: list = []
        self.stopped = True
        self.generation = int(generation or 0)   # +1 per start or restart (no rebalances here)
        self._lock = threading.Lock()
        self._last: dict = {}      # task -> its last commit {instance, batch, offsets, at}
        self._opens: dict = {}     # task -> its last open {instance, source, restored}
        self._executors: dict = {}  # executor number -> {"status", "first_seen", "last_seen"}
        self._errors: dict = {}    # task -> the last TaskFailed
        self._kafka = None

    # -- life
    def run_extra(self) -> dict:
        """``RunSpec.extra`` of this placement's queries."""
        return dict(self.extra, worker_spec=self.spec, generation=self.generation)

    def start(self, instances: int = 1, options: Optional[dict] = None) -> Assignment:
        self.options = dict(options or {})
        self.stopped = False
        self.generation += 1
        self._subscribe(self._on_event)
        self.replicas.start()
        return self.assignment

    def stop(self) -> None:
        self.stopped = True
        self._unsubscribe(self._on_event)
        self.replicas.close()
        if self._kafka is not None:
            self._kafka.close()
            self._kafka = None

    abort = stop

    def restart_instances(self) -> list:
        """Nothing to revive: Spark replaces lost executors. The query replicas keep tailing."""
        if not self.replicas.replicas:
            self.replicas.start()
        self.generation += 1
        return []

    # -- what the tasks' events say
    def _on_event(self, e: ev.Event) -> None:
        if self.stopped:
            return
        now = time.time()
        with self._lock:
            inst = getattr(e, "instance", None)
            if isinstance(e, (ev.Committed, ev.TaskOpened)):
                x = self._executors.setdefault(inst, {"status": "alive", "first_seen": now})
                x["last_seen"] = now
                if x["status"] != "alive" and (e.ts or now) > x.get("lost_at", 0):
                    x["status"] = "alive"
            if isinstance(e, ev.Committed):
                self._last[TaskId.parse(e.task)] = {"instance": inst, "batch": e.batch,
                                                    "offsets": dict(e.offsets), "at": e.ts}
                self._errors.pop(TaskId.parse(e.task), None)
            elif isinstance(e, ev.TaskOpened):
                self._opens[TaskId.parse(e.task)] = {"instance": inst, "source": e.source,
                                                     "restored": e.restored}
            elif isinstance(e, ev.Crashed) and e.mode in ("executor", "disk-loss"):
                x = self._executors.setdefault(inst, {"first_seen": now})
                x.update(status="lost", lost_at=e.ts or now)
            elif isinstance(e, ev.TaskFailed) and e.task:
                self._errors[TaskId.parse(e.task)] = e

    def owner_of(self, task) -> Optional[int]:
        """The executor number that last committed ``task`` (None before its first commit)."""
        return (self._last.get(TaskId.parse(task)) or {}).get("instance")

    @property
    def assignment(self) -> Assignment:
        """Observed, not decided: each task's executor is the one of its last commit."""
        return Assignment(generation=self.generation, active={t: self.owner_of(t) for t in self.tasks})

    def live(self) -> list:
        """The executors seen running tasks and not lost; ``[None]`` (Spark's, not known yet)
        before the first commit: processing never lacks an instance here."""
        with self._lock:
            alive = [i for i, x in self._executors.items() if x.get("status") == "alive"]
        return sorted(alive, key=lambda i: (i is None, i)) or [None]

    def statuses(self, fresh: bool = False) -> dict:
        out: dict = {}
        with self._lock:
            last, opens, errors = dict(self._last), dict(self._opens), dict(self._errors)
        for t in self.tasks:
            c, o, err = last.get(t), opens.get(t), errors.get(t)
            inst = (c or o or {}).get("instance")
            if c is None and o is None and err is None:
                continue
            row = {"role": "active", "state": "failed" if err is not None else "running",
                   "source": (o or {}).get("source"), "error": err.error if err is not None else None,
                   "backlog": 0, "to_replay": (o or {}).get("restored"),
                   "last_batch": (c or {}).get("batch"), "positions": (c or {}).get("offsets", {})}
            out.setdefault(inst, {"instance": inst, "tasks": {}, "replicas": {}})["tasks"][str(t)] = row
        return out

    def tasks_ready(self, fresh: bool = False) -> bool:
        """Every query replica has read its changelogs to their ends: what the executors committed is
        what queries see. Paused replicas hold nothing back (their reads raise ``StaleRead``)."""
        if self.stopped or self.replicas.paused:
            return True
        try:
            return self.replicas.all_caught_up()
        except StatekitError:
            return False

    def failed_tasks(self) -> list:
        # a task that fails on an executor fails its Spark task: Spark retries it, and fails the
        # query (which the App reports) once the retries are spent
        return []

    def members_frame_rows(self) -> list:
        with self._lock:
            execs = {i: dict(x) for i, x in self._executors.items()}
        rows = []
        a = self.assignment
        for i in sorted(execs, key=lambda i: (i is None, i)):
            rows.append({"instance": i, "status": "alive" if execs[i].get("status") == "alive"
                         else "dead", "incarnation": 1, "pid": None,
                         "active": [str(t) for t, o in a.active.items() if o == i],
                         "standby": [], "warmup": [], "reported": True})
        return rows

    # -- refused membership calls
    def kill(self, instance, mode: str = "process", cause: str = "kill", allow_last: bool = False):
        raise _refusal("kill()")

    def revive(self, instance, disk: bool = True):
        raise _refusal("revive()")

    def add_instance(self):
        raise _refusal("add_instance()")

    def remove_instance(self, instance, timeout: float = 120.0):
        raise _refusal("remove_instance()")

    def scale(self, n: int):
        raise _refusal("scale()")

    def pause_replicas(self, paused: bool, instance=None) -> list:
        """Pause (or resume) the driver's query replicas: their lag grows, queries with
        ``stale=False`` raise ``StaleRead``."""
        return [(None, t) for t in self.replicas.pause(paused)]

    # -- crashes
    def crash_directive(self, mode: str, instance, after_records, point: str) -> dict:
        """Arm a crash directive for the Python worker that next runs a task on executor
        ``instance`` (None: any executor). ``after_records=None`` with point ``records`` means
        before the first record of the next batch (there is nothing to kill between batches)."""
        from statekit.worker import crash as crash_mod

        if mode not in EXECUTOR_CRASH_MODES:
            raise StatekitError(f"unknown crash mode {mode!r} for placement='executors'; use one of "
                                f"{', '.join(EXECUTOR_CRASH_MODES)}")
        if point not in crash_mod.POINTS:
            raise StatekitError(f"unknown crash point {point!r}; use one of {', '.join(crash_mod.POINTS)}")
        if not self.extra.get("control_shared", True):
            raise StatekitError(f"crash() on executors reads its directive from {self.layout.control_dir}, "
                                f"which the executors do not see: put state_dir on a shared file system")
        if instance is not None:
            try:
                instance = int(instance)
            except (TypeError, ValueError):
                raise StatekitError(f"instance must be an executor number, got {instance!r}") from None
        n = 0 if after_records is None else int(after_records)
        d = crash_mod.write_directive(self.layout.control_dir, instance, point, n, mode)
        return {"mode": mode, "instance": instance, "point": point, "after_records": n,
                "requested_at": time.time(), "generation": self.generation, "status": "pending", "id": d["id"],
                "placement": "executors", "tasks": []}

    # -- observation for the App
    @property
    def kafka(self):
        if self._kafka is None:
            from statekit.kafka import Kafka

            self._kafka = Kafka(self.spec.bootstrap)
        return self._kafka

    def lag_rows(self) -> list:
        """``App.lag()``'s rows: each task's last commit on its executor (role ``active``) and the
        driver's query replica (role ``query-replica``, instance None)."""
        from statekit.runtime.query_replicas import ROLE

        rows = []
        state = "paused" if self.replicas.paused else "tailing"
        for t, store, off, end, lag in self.replicas.rows():
            c = self._last.get(t)
            if c is not None:
                coff = c["offsets"].get(store)
                rows.append({"task": str(t), "instance": c["instance"], "role": "active",
                             "state": "committed", "store": store, "checkpoint_offset": coff,
                             "changelog_end": end,
                             "lag": None if end is None or coff is None else max(0, end - coff)})
            rows.append({"task": str(t), "instance": None, "role": ROLE, "state": state,
                         "store": store, "checkpoint_offset": off, "changelog_end": end, "lag": lag})
        return rows

    def query_router(self, app, wait_s: float = 30.0):
        from statekit.runtime.query_replicas import ReplicaQueryRouter

        return ReplicaQueryRouter(app, self.replicas, self.owner_of, wait_s=wait_s)
