"""Tasks that stay open in a Spark Python worker across micro-batches, and the standbys beside them.

On the ``executors`` placement Spark sends each stream task's micro-batch to the executor that
holds its state (``engine.spark.executors``); this module is that executor's side. pyspark reuses
its Python workers (``spark.python.worker.reuse``), so a worker keeps, per process:

* **open tasks** (``StreamTask``, RocksDB open, its transactional producer initialised): the next
  batch of a task finds it here and runs at once. A copy is used only while it is the task's
  latest — its last batch is the one before, and no record follows its last commit marker in any
  of its changelogs (another executor that ran the task in between would have written some);
  otherwise it is closed (``TaskClosed`` reason ``stale``) and the task reopened, which replays
  only what the others committed;
* **standbys** (``state.standby.StandbyReplica``, tailing a task's changelogs in a thread, in the
  directory the task would use here): the driver's plan (``ExecutorsCoordinator``, published to
  ``<app>-placement``) names the executors that keep a warm copy of each task; a background thread
  in the worker reads the plan every half second and opens or closes this executor's standbys.
  When Spark moves a task onto an executor that has its standby, the standby is promoted and the
  task replays only its lag;
* a **release** protocol within one executor: two Python workers of an executor cannot hold the
  same task directory (its lock); a worker that needs a directory another one holds writes
  ``<task dir>/.release`` and waits, and the holder's thread closes (or promotes) its copy.

Everything of an application closes when the plan says its run stopped (``App.stop``), and when a
newer run of it reaches the worker (a restart). A worker that dies takes its open copies with it:
the local RocksDB and checkpoint stay, and the next open replays from them.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Optional

from statekit import events as ev
from statekit.contracts import TaskId, changelog_topic, task_dir
from statekit.errors import StateLocked, StatekitError

log = logging.getLogger("statekit.executors")

RELEASE_FILE = ".release"
TICK_S = 0.5
LOCK_WAIT_S = 30.0


def placement_topic(application: str) -> str:
    """The topic of the driver's placement plan (one partition, the latest record counts)."""
    return f"{application}-placement"


class _App:
    """One run of an application, as this worker saw it in a micro-batch."""

    def __init__(self, run, root: str, eid: Optional[str]) -> None:
        from statekit.engine.spark.executor_id import instance_number

        x = run.extra
        self.app = run.app
        self.bootstrap = run.bootstrap
        self.spec = x["worker_spec"]
        self.run_id = x.get("run_id")
        self.generation = x.get("generation")
        self.root = root
        self.instance = instance_number(eid)
        self.events = bool(run.events)
        self.publisher = None
        self.plan_offset = 0
        self.plan: Optional[dict] = None
        self.plan_error = False

    def publish(self, e) -> None:
        if not self.events:
            return
        if self.publisher is None:
            from statekit.event_bus import EventPublisher

            self.publisher = EventPublisher(self.bootstrap, self.app)
        if e.generation is None:
            e.generation = self.generation
        self.publisher.publish(e)

    def read_plan(self, kafka) -> Optional[dict]:
        """The driver's latest plan for this application (None before the first)."""
        from statekit.errors import UnknownTopic

        topic = placement_topic(self.app)
        try:
            while True:
                chunk = kafka.fetch(topic, 0, self.plan_offset, max_wait_ms=0)
                for _off, _ts, _k, value, _h in chunk.records:
                    try:
                        self.plan = json.loads(value)
                    except (TypeError, ValueError):
                        pass
                if chunk.next_offset == self.plan_offset:
                    break
                self.plan_offset = chunk.next_offset
        except UnknownTopic:
            return None
        return self.plan


class _Open:
    __slots__ = ("task", "app", "busy")

    def __init__(self, task, app: _App) -> None:
        self.task = task
        self.app = app
        self.busy = False


class Resident:
    """This Python worker's open tasks and standbys (one per process: ``resident()``)."""

    def __init__(self, background: bool = True) -> None:
        self.background = background   # the thread that calls tick() (tests call it themselves)
        self.lock = threading.RLock()
        self.tasks: dict = {}       # (root, app, TaskId) -> _Open
        self.standbys: dict = {}    # (root, app, TaskId) -> (StandbyReplica, _App)
        self.apps: dict = {}        # (root, app) -> _App (the latest run seen)
        self.opening: set = set()   # keys the main thread is opening as tasks
        self.pid = os.getpid()
        self._thread: Optional[threading.Thread] = None
        self._kafka: dict = {}

    # -- the micro-batch side (the worker's main thread) ------------------------------------
    def app_for(self, run, root: str, eid: Optional[str]) -> _App:
        """The application's context for this run; a newer run closes what an older one left."""
        key = (root, run.app)
        with self.lock:
            cur = self.apps.get(key)
            if cur is not None and cur.run_id == run.extra.get("run_id") \
                    and cur.generation == run.extra.get("generation"):
                return cur
            if cur is not None:
                self._close_app(cur, "stopped")
            cur = self.apps[key] = _App(run, root, eid)
        self._ensure_thread()
        return cur

    def run_batch(self, app: _App, task: TaskId, batch_id: int, ranges, kafka) -> int:
        """Process one micro-batch of ``task`` on its open copy (opened first when needed)."""
        key = (app.root, app.app, task)
        with self.lock:
            ent = self.tasks.get(key)
            if ent is not None:
                ent.busy = True
        try:
            if ent is not None and not self._current(ent, batch_id, kafka):
                self._drop(key, "stale")
                ent = None
            if ent is None:
                ent = self._open(app, task, kafka)
            try:
                return ent.task.process(batch_id, ranges)
            except BaseException as exc:
                from statekit.kafka.retry import retriable

                # the retry reopens it from what was committed (Kafka away: without an EndTxn
                # that would only wait out the request timeout)
                self._drop(key, "failed", dirty=retriable(exc))
                raise
        finally:
            if ent is not None:
                ent.busy = False

    @staticmethod
    def _current(ent: _Open, batch_id: int, kafka) -> bool:
        """Is this open copy the task's latest state? (See the module docstring.)"""
        t = ent.task
        if t.state.closed:
            return False
        if t.last_batch >= batch_id:
            return True                    # a replay of a batch it committed: it will skip it
        if t.last_batch != batch_id - 1:
            return False                   # another executor ran the batches in between
        from statekit.state.restore import COMMITTED

        app = t.spec.application
        for store, off in t.positions().items():
            if off is None:
                continue
            chunk = kafka.fetch(changelog_topic(app, store), t.task.partition, off, max_wait_ms=0,
                                max_bytes=4096, isolation=COMMITTED)
            if chunk.records:
                return False               # committed by another executor since ours
        return True

    def _open(self, app: _App, task: TaskId, kafka) -> _Open:
        from statekit.worker.task import StreamTask

        key = (app.root, app.app, task)
        with self.lock:
            self.opening.add(key)          # the background thread opens no standby for it now
        try:
            d = task_dir(app.root, app.app, task)
            deadline = time.monotonic() + LOCK_WAIT_S
            source, asked = "checkpoint", False
            while True:
                if self._promote(app, key):
                    source = "standby"
                try:
                    t = StreamTask(app.spec, task, app.root, instance=app.instance,
                                   publish=app.publish, kafka=kafka, generation=app.generation,
                                   source=source)
                    break
                except StateLocked:
                    # another Python worker of this executor holds it (or a dying attempt's)
                    if not asked:
                        _ask_release(d)
                        asked = True
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            if asked or os.path.exists(os.path.join(d, RELEASE_FILE)):
                _clear_release(d)
            ent = _Open(t, app)
            ent.busy = True
            with self.lock:
                self.tasks[key] = ent
            return ent
        finally:
            with self.lock:
                self.opening.discard(key)

    def _promote(self, app: _App, key) -> bool:
        """Hand this worker's standby of the task (if any) over to the task: True if there was one."""
        with self.lock:
            sb = self.standbys.pop(key, None)
        if sb is None:
            return False
        replica = sb[0]
        try:
            lag = replica.lag()
        except StatekitError:
            lag = None
        replica.promote()
        app.publish(ev.StandbyPromoted(task=str(key[2]), instance=app.instance, role="standby",
                                       lag=lag))
        return True

    def _drop(self, key, reason: str, only_idle: bool = False, dirty: bool = False) -> bool:
        """Close an open task (``only_idle``: unless a micro-batch is using it right now;
        ``dirty``: without a word to Kafka, as a kill would)."""
        with self.lock:
            ent = self.tasks.get(key)
            if ent is None or (only_idle and ent.busy):
                return False
            del self.tasks[key]
        try:
            if dirty:
                ent.task.abandon()
                return True
            ent.task.close(reason=reason)
        except Exception:  # noqa: BLE001 - a task that failed mid-commit: let the lock go
            try:
                ent.task.abandon()
            except Exception:  # noqa: BLE001
                pass
        return True

    # -- the background thread: the plan, standbys, releases ----------------------------------
    def _ensure_thread(self) -> None:
        if not self.background:
            return
        if self._thread is not None and self._thread.is_alive() and self.pid == os.getpid():
            return
        self.pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="statekit-resident", daemon=True)
        self._thread.start()

    def _client(self, bootstrap: str):
        k = self._kafka.get(bootstrap)
        if k is None:
            from statekit.kafka import Kafka

            k = self._kafka[bootstrap] = Kafka(bootstrap)
        return k

    def _loop(self) -> None:
        while True:
            time.sleep(TICK_S)
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - keep the thread; say it once per kind
                log.warning("statekit resident tasks: %s", exc)

    def tick(self) -> None:
        """One round: follow every application's plan, serve release requests."""
        with self.lock:
            apps = list(self.apps.values())
        for app in apps:
            try:
                plan = app.read_plan(self._client(app.bootstrap))
            except StatekitError:
                self._kafka.pop(app.bootstrap, None)
                continue
            if plan is None or plan.get("run") != app.run_id:
                continue                    # no plan yet, or a newer run's: its batches decide
            if plan.get("stopped"):
                with self.lock:
                    if self.apps.get((app.root, app.app)) is app:
                        del self.apps[(app.root, app.app)]
                self._close_app(app, "stopped")
                continue
            self._follow(app, plan)
        self._serve_releases()

    def _follow(self, app: _App, plan: dict) -> None:
        """Open the standbys the plan gives this executor, close the others."""
        from statekit.state.standby import StandbyReplica
        from statekit.worker.task import store_specs

        if app.instance is None:
            return
        want = set()
        for t, owners in (plan.get("standbys") or {}).items():
            if app.instance in [int(o) for o in owners]:
                want.add(TaskId.parse(t))
        moved = {TaskId.parse(t): int(b) for t, (o, b) in (plan.get("active") or {}).items()
                 if o is not None and int(o) != app.instance and b is not None}
        with self.lock:
            gone = [k for k, e in self.tasks.items() if e.app is app and k[2] in moved
                    and moved[k[2]] > e.task.last_batch]
        for k in gone:   # another executor committed it since: this copy is stale, a standby is not
            self._drop(k, "moved", only_idle=True)
        with self.lock:
            have = {k[2] for k, (_r, a) in self.standbys.items() if a is app}
            active = {k[2] for k, e in self.tasks.items() if e.app is app}
            active |= {k[2] for k in self.opening if k[:2] == (app.root, app.app)}
            stale = {k[2] for k, (_r, a) in self.standbys.items()
                     if k[:2] == (app.root, app.app) and a is not app}
        for t in sorted((have | stale) - want):
            self._stop_standby((app.root, app.app, t), "unassigned")
        for t in sorted(want - have - active):
            specs = [s for s in store_specs(app.spec.plan(t.subtopology), t.subtopology)
                     if getattr(s, "logging", True)]
            if not specs:
                continue
            key = (app.root, app.app, t)
            try:
                r = StandbyReplica(app.app, t, specs, state_dir=app.root, bootstrap=app.bootstrap)
            except StateLocked:
                continue                    # the active copy is in another worker here: not a standby
            with self.lock:
                taken = key in self.opening or key in self.tasks
                if not taken:
                    self.standbys[key] = (r, app)
            if taken:                       # the task arrived meanwhile: it takes the directory
                r.close()
                continue
            r.start()
            try:
                lag = r.lag()
            except StatekitError:
                lag = None
            app.publish(ev.ReplicaStarted(task=str(t), instance=app.instance, role="standby",
                                          lag=lag))

    def _stop_standby(self, key, reason: str) -> None:
        with self.lock:
            sb = self.standbys.pop(key, None)
        if sb is None:
            return
        r, app = sb
        try:
            r.close()
        finally:
            app.publish(ev.ReplicaStopped(task=str(key[2]), instance=app.instance, role="standby",
                                          reason=reason))

    def _close_app(self, app: _App, reason: str) -> None:
        with self.lock:
            tasks = [k for k, e in self.tasks.items() if e.app is app]
            sbs = [k for k, (_r, a) in self.standbys.items() if a is app]
        for k in tasks:
            self._drop(k, reason, only_idle=True)
        for k in sbs:
            self._stop_standby(k, reason)

    def _serve_releases(self) -> None:
        """Close (a task) or promote (a standby) what another worker of this executor asked for."""
        with self.lock:
            tasks = list(self.tasks.items())
            sbs = list(self.standbys.items())
        for k, e in tasks:
            if _asked(e.task.state.task_dir):
                self._drop(k, "released", only_idle=True)
        for k, (r, app) in sbs:
            if _asked(r.task_dir):
                with self.lock:
                    if self.standbys.get(k, (None,))[0] is not r:
                        continue
                    self.standbys.pop(k)
                r.promote()         # the checkpoint for the worker that takes the directory
                app.publish(ev.ReplicaStopped(task=str(k[2]), instance=app.instance,
                                              role="standby", reason="released"))

    # -- observation (tests) -------------------------------------------------------------------
    def open_tasks(self) -> list:
        with self.lock:
            return sorted(str(k[2]) for k in self.tasks)

    def open_standbys(self) -> list:
        with self.lock:
            return sorted(str(k[2]) for k in self.standbys)


def _ask_release(d: str) -> None:
    try:
        with open(os.path.join(d, RELEASE_FILE), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass


def _asked(d: str) -> bool:
    """Does a live process other than this one ask for the directory ``d``?"""
    try:
        with open(os.path.join(d, RELEASE_FILE)) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return False
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _clear_release(d: str) -> None:
    try:
        os.unlink(os.path.join(d, RELEASE_FILE))
    except OSError:
        pass


_RESIDENT: Optional[Resident] = None


def resident() -> Resident:
    """This process's ``Resident`` (a forked child gets its own)."""
    global _RESIDENT
    if _RESIDENT is None or _RESIDENT.pid != os.getpid():
        _RESIDENT = Resident()
    return _RESIDENT
