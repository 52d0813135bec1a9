"""Where tasks run: ``instances`` (statekit's instance processes beside the driver) or ``executors``
(Spark's Python workers, wherever Spark schedules them) — and the control side of the latter.

``App(placement="auto")`` (the default) picks ``executors`` when the Spark master is not local
(``spark://``, ``yarn``, ``k8s://``, a Spark Connect session) and ``instances`` otherwise. The
instances listen on 127.0.0.1 and read the control directory, so they serve a cluster only when
every executor runs on the driver's machine; the executors placement works on any cluster.

With ``executors`` (``statekit.engine.spark.executors`` runs the tasks):

* Spark places every task of every micro-batch, on the executor that holds its state (a stateful
  operator's locality; the task stays open there: ``engine.spark.resident``); statekit has no
  instances to kill, revive, add, remove or scale, and refuses those calls in one line.
  ``crash()`` still works: a crash directive in the control directory, claimed by the Python worker
  that runs the task (see ``engine.spark.executors`` for the modes ``process``, ``executor`` and
  ``disk-loss``); Spark retries the failed task, which replays the batch with its id.
* The executors are the members: ``ExecutorsCoordinator`` watches the session's executor list and
  publishes ``InstanceStarted`` / ``InstanceDied`` (instance = executor number) and a ``Rebalance``
  whenever a task's executor changes (reason ``owner-died`` when its executor was lost, ``spark``
  otherwise). It plans ``standby_replicas`` warm copies per task on other live executors (sticky,
  fewest copies first) and publishes the plan to ``<app>-placement``, which the executors' Python
  workers follow. When an executor is lost, each of its tasks is pointed (in Spark's
  ``StateStoreCoordinator``) at the live executor with the freshest copy — a standby, else the
  executor that committed the task last — so that its next batch goes there.
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

    WATCH_S = 0.5

    def __init__(self, *, application: str, layout: Layout, spec, tasks: list, extra: dict,
                 publish: Callable[[ev.Event], None], subscribe: Callable, unsubscribe: Callable,
                 generation: int = 0, standby_replicas: int = 0):
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
        # +1 per start or restart, and per set of moves the commits show (Spark placed tasks
        # elsewhere: a new assignment took effect, as a rebalance's generation says elsewhere)
        self.generation = int(generation or 0)
        self._lock = threading.Lock()
        self._last: dict = {}      # task -> its last commit {instance, batch, offsets, at}
        self._opens: dict = {}     # task -> its last open {instance, source, restored}
        self._executors: dict = {}  # executor number -> {"status", "first_seen", "last_seen"}
        self._errors: dict = {}    # task -> the last TaskFailed
        self._kafka = None
        self.standby_replicas = int(standby_replicas or 0)
        self.run_id: Optional[str] = None    # one per start/restart: executors reopen on a new one
        self.standbys: dict = {}   # task -> [executor numbers] (the plan)
        self._warm: dict = {}      # task -> {executor}: standbys the executors say they run
        self._copies: dict = {}    # task -> {executor: last batch it committed there}
        self._announced: dict = {}  # task -> executor, as the last Rebalance said
        self._hosts: dict = {}     # executor number -> host
        self._listed = False       # the session lists its executors (not Spark Connect)
        self._sent: Optional[tuple] = None
        self._halt = threading.Event()
        self._watcher: Optional[threading.Thread] = None

    # -- life
    def run_extra(self) -> dict:
        """``RunSpec.extra`` of this placement's queries."""
        return dict(self.extra, worker_spec=self.spec, generation=self.generation,
                    run_id=self.run_id)

    def start(self, instances: int = 1, options: Optional[dict] = None) -> Assignment:
        from statekit.engine.spark.resident import placement_topic

        self.options = dict(options or {})
        self.stopped = False
        self.generation += 1
        self.run_id = uuid.uuid4().hex
        self._sent = None
        self.kafka.ensure_topic(placement_topic(self.application), 1,
                                configs={"cleanup.policy": "compact"})
        self._subscribe(self._on_event)
        self.replicas.start()
        self._send_plan()
        self._halt.clear()
        self._watcher = threading.Thread(target=self._watch, name=f"statekit-executors-"
                                         f"{self.application}", daemon=True)
        self._watcher.start()
        return self.assignment

    def stop(self) -> None:
        was = self.stopped
        self.stopped = True
        self._halt.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
            self._watcher = None
        self._unsubscribe(self._on_event)
        if not was:
            try:
                self._send_plan(stopped=True)   # the executors close the run's tasks and standbys
            except StatekitError as exc:
                log.info("could not publish the stop to the executors: %s", exc)
        self.replicas.close()
        if self._kafka is not None:
            self._kafka.close()
            self._kafka = None

    abort = stop

    def restart_instances(self) -> list:
        """Nothing to revive: Spark replaces lost executors. The query replicas keep tailing; the
        relaunched queries are a new run (the executors reopen their tasks)."""
        if not self.replicas.replicas:
            self.replicas.start()
        self.generation += 1
        self.run_id = uuid.uuid4().hex
        self._send_plan()
        return []

    # -- the executors: membership, moves, the standby plan
    def _spark(self):
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is None:
            return None
        from pyspark.sql import SparkSession

        return SparkSession.getActiveSession() or SparkSession(sc)

    def _watch(self) -> None:
        while not self._halt.wait(self.WATCH_S):
            try:
                self.observe()
            except Exception as exc:  # noqa: BLE001 - keep watching; the next round may do
                log.info("executors watch: %s", exc)

    def observe(self, executors: Optional[dict] = None) -> None:
        """One round: the executor list (``{id: host}``, default the session's), the moves the
        commits show, the standby plan."""
        if executors is None:
            from statekit.engine.spark.cluster import live_executors

            spark = self._spark()
            executors = live_executors(spark) if spark is not None else None
        if executors is not None:
            self._membership({int(k): v for k, v in executors.items() if str(k).isdigit()})
        self._announce_moves()
        self._send_plan()

    def _membership(self, now: dict) -> None:
        t = time.time()
        started, lost = [], []
        with self._lock:
            first = not self._listed
            self._listed = True
            self._hosts.update(now)
            for n in sorted(now):
                x = self._executors.get(n)
                if x is None or x.get("status") != "alive":
                    self._executors[n] = {"status": "alive", "first_seen": t, "last_seen": t}
                    started.append(n)
            for n, x in sorted(self._executors.items(), key=lambda kv: (kv[0] is None, kv[0])):
                if n is None or n in now or x.get("status") != "alive":
                    continue
                x.update(status="lost", lost_at=t)
                tasks = sorted(str(k) for k, c in self._last.items() if c.get("instance") == n)
                lost.append((n, tasks))
            self._executors.pop(None, None)
        for n in started:
            self.publish(ev.InstanceStarted(instance=n, incarnation=1, disk="new",
                                            reason="start" if first else "add",
                                            generation=self.generation))
        for n, tasks in lost:
            self.publish(ev.InstanceDied(instance=n, incarnation=1, cause="exit", mode="process",
                                         tasks=tasks, generation=self.generation))
            self._redirect(n, tasks)

    def _alive(self) -> list:
        with self._lock:
            return sorted(i for i, x in self._executors.items()
                          if i is not None and x.get("status") == "alive")

    def freshest_copy(self, task, exclude=()) -> Optional[int]:
        """The live executor with the freshest copy of ``task``: one of its standbys, else the one
        that committed it last (None: no live executor has any)."""
        t = TaskId.parse(task)
        alive = [i for i in self._alive() if i not in exclude]
        with self._lock:
            warm = set(self._warm.get(t, ()))
        for s in self.standbys.get(t, []):
            if s in alive and s in warm:
                return s
        copies = {i: b for i, b in (self._copies.get(t) or {}).items() if i in alive}
        if not copies:
            return None
        return max(sorted(copies), key=lambda i: copies[i])

    def _redirect(self, lost: int, tasks: list) -> None:
        """Point each task of a lost executor at the freshest copy, in Spark's coordinator."""
        from statekit.engine.spark.cluster import prefer_executor

        spark = self._spark()
        if spark is None:
            return
        for t in tasks:
            tid = TaskId.parse(t)
            to = self.freshest_copy(tid, exclude=(lost,))
            if to is None:
                continue
            name = self.application if tid.subtopology == 0 else f"{self.application}_{tid.subtopology}"
            ok = prefer_executor(spark, name, tid.partition, str(to), self._hosts.get(to, "127.0.0.1"))
            log.info("task %s of lost executor %s -> executor %s (%s)", t, lost, to,
                     "told Spark" if ok else "Spark not told")

    def _announce_moves(self) -> None:
        """A ``Rebalance`` event when a task's executor (of its last commit) changed."""
        with self._lock:
            now = {str(t): c.get("instance") for t, c in self._last.items()}
            moves = []
            for t, inst in sorted(now.items()):
                was = self._announced.get(t)
                if was == inst:
                    continue
                if was is not None:
                    lost = (self._executors.get(was) or {}).get("status") != "alive"
                    moves.append({"task": t, "from": was, "to": inst,
                                  "reason": "owner-died" if lost else "spark"})
            if not moves and (set(now) == set(self._announced) or len(now) < len(self.tasks)):
                return                      # nothing moved, or not every task has committed yet
            self._announced = dict(now)
            if moves:
                self.generation += 1
            live = [i for i, x in self._executors.items() if i is not None and x.get("status") == "alive"]
            standbys = {str(t): list(v) for t, v in self.standbys.items()}
        reason = "; ".join(f"task {m['task']}: executor {m['from']} -> {m['to']} ({m['reason']})"
                           for m in moves) or "first commits"
        self.publish(ev.Rebalance(reason=reason, live=sorted(live), active=now, standbys=standbys,
                                  moves=moves, generation=self.generation))

    def plan_standbys(self) -> dict:
        """``{task: [executor]}``: ``standby_replicas`` copies per task on live executors other
        than its active's — the ones it had (sticky: a lost executor's tasks keep theirs, which are
        about to be promoted), then the executors with the fewest copies."""
        alive = self._alive()
        with self._lock:
            active = {t: c.get("instance") for t, c in self._last.items()}
            old = dict(self.standbys)
            fresh = {t: dict(c) for t, c in self._copies.items()}
        load = {i: sum(1 for a in active.values() if a == i) for i in alive}
        plan: dict = {}
        for t in self.tasks:
            a = active.get(t)
            if a is None or self.standby_replicas <= 0:
                continue
            keep = [i for i in old.get(t, []) if i in alive and i != a][:self.standby_replicas]
            for i in keep:
                load[i] += 1
            plan[t] = keep
        for t, keep in plan.items():
            a = active.get(t)
            while len(keep) < self.standby_replicas:
                cands = [i for i in alive if i != a and i not in keep]
                if not cands:
                    break
                f = fresh.get(t) or {}
                best = min(cands, key=lambda i: (load[i], -f.get(i, -2), i))
                keep.append(best)
                load[best] += 1
        return {t: v for t, v in plan.items() if v}

    def _send_plan(self, stopped: bool = False) -> None:
        """The plan to ``<app>-placement`` when it changed (the executors follow it)."""
        import json

        from statekit.engine.spark.resident import placement_topic

        if not stopped:
            self.standbys = self.plan_standbys()
        with self._lock:
            active = {str(t): [c.get("instance"), c.get("batch")] for t, c in self._last.items()}
        owners = {t: a[0] for t, a in active.items()}
        sig = (self.run_id, stopped, tuple(sorted(owners.items())),
               tuple(sorted((str(t), tuple(v)) for t, v in self.standbys.items())))
        if sig == self._sent:
            return
        body = {"run": self.run_id, "generation": self.generation, "stopped": stopped,
                "active": active, "ts": time.time(),
                "standbys": {str(t): list(v) for t, v in self.standbys.items()}}
        self.kafka.send(placement_topic(self.application), 0,
                        [(b"plan", json.dumps(body).encode())])
        self._sent = sig

    # -- what the tasks' events say
    def _on_event(self, e: ev.Event) -> None:
        if self.stopped:
            return
        now = time.time()
        with self._lock:
            inst = getattr(e, "instance", None)
            if isinstance(e, (ev.Committed, ev.TaskOpened)) and not self._listed:
                x = self._executors.setdefault(inst, {"status": "alive", "first_seen": now})
                x["last_seen"] = now
                if x["status"] != "alive" and (e.ts or now) > x.get("lost_at", 0):
                    x["status"] = "alive"
            if isinstance(e, ev.Committed):
                t = TaskId.parse(e.task)
                self._last[t] = {"instance": inst, "batch": e.batch,
                                 "offsets": dict(e.offsets), "at": e.ts}
                self._copies.setdefault(t, {})[inst] = e.batch
                self._errors.pop(t, None)
            elif isinstance(e, ev.TaskOpened):
                self._opens[TaskId.parse(e.task)] = {"instance": inst, "source": e.source,
                                                     "restored": e.restored}
            elif isinstance(e, ev.ReplicaStarted):
                self._warm.setdefault(TaskId.parse(e.task), set()).add(inst)
            elif isinstance(e, (ev.ReplicaStopped, ev.StandbyPromoted)):
                self._warm.setdefault(TaskId.parse(e.task), set()).discard(inst)
            elif isinstance(e, ev.Crashed) and e.mode in ("executor", "disk-loss"):
                if e.mode == "disk-loss":
                    for copies in self._copies.values():
                        copies.pop(inst, None)
                if not self._listed:
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
                         "standby": [str(t) for t, s in sorted(self.standbys.items()) if i in s],
                         "warmup": [], "reported": True})
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

            self._kafka = Kafka(self.spec.bootstrap, timeout=self.spec.request_timeout)
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
