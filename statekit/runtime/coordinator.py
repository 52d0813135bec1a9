"""The control side of an application's instances: membership, rebalances, warmups, deaths.

Kafka Streams spreads this over the group coordinator (who is in the group, generations) and the
``StreamsPartitionAssignor`` (who runs what); statekit's instances are children of the App's process,
so one coordinator in that process does both:

* **membership** — instances are started (``start``, ``add_instance``, ``revive``), stopped
  gracefully (``remove_instance``: its tasks move first, through warmups) or killed (``kill``, or a
  crash directive an instance claims). A loop notices every death within ~50 ms;
* **rebalances** — every membership change computes a new ``Assignment`` (``runtime.assignor``) from
  how fresh each live copy of each task is, sends every instance its part (revocations first, so no
  task is ever active twice), then publishes it (``control/assignment.json``, which the engines'
  routers read, and a ``Rebalance`` event). Each rebalance has a generation number;
* **probing rebalances** — while warmups exist, every ``probing_rebalance_interval`` seconds the
  coordinator looks at their lags and rebalances once one is within ``acceptable_recovery_lag``.

It takes an explicit context (the application's names, layout, worker spec, settings and a publish
function) and never reaches into the App.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from statekit import events as ev
from statekit.contracts import Layout, TaskId, changelog_topic
from statekit.errors import StatekitError
from statekit.runtime import supervisor
from statekit.runtime.assignor import Assignment, assign, moves
from statekit.worker.protocol import InstanceUnreachable, call, connect, ensure_authkey
from statekit.worker.task import WorkerSpec, store_specs

log = logging.getLogger("statekit.coordinator")


STATUS_S = 0.5
STATUS_QUIET_S = 2.0
QUIET_AFTER = 4
LOOP_MAX_S = 1.0


class MembershipError(StatekitError):
    """A membership change that cannot be made (unknown instance, the last live one, ...)."""


@dataclass
class Settings:
    """Kafka Streams' names: ``num.standby.replicas``, ``acceptable.recovery.lag``,
    ``max.warmup.replicas``, ``probing.rebalance.interval.ms`` (here in seconds; Kafka's default is
    10 minutes, a notebook's is 10 seconds)."""

    standby_replicas: int = 0
    acceptable_recovery_lag: int = 10_000
    max_warmup_replicas: int = 2
    probing_rebalance_interval: float = 10.0


@dataclass
class Member:
    instance: int
    status: str = "alive"            # alive | leaving | dead | stopped
    incarnation: int = 0
    process: Optional[supervisor.InstanceProcess] = None
    conn: object = None
    kill_request: Optional[dict] = None   # what App.kill / a crash asked for
    died_at: Optional[float] = None
    history: list = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.status in ("alive", "leaving")


class Coordinator:
    def __init__(self, *, application: str, layout: Layout, spec: WorkerSpec, tasks: list,
                 settings: Settings, publish: Callable[[ev.Event], None],
                 on_change: Optional[Callable[[str], None]] = None):
        self.application = application
        self.layout = layout
        self.control = layout.control.ensure()
        self.spec = spec
        self.tasks = sorted(TaskId.parse(t) for t in tasks)
        self.settings = settings
        self.publish = publish
        self.on_change = on_change or (lambda what: None)
        self.members: dict[int, Member] = {}
        self.assignment: Optional[Assignment] = None
        self.options: dict = {}
        self._starting: list = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._loop_wake = threading.Event()   # a member died, a probe was scheduled, or stop
        self._thread: Optional[threading.Thread] = None
        self._statuses: dict[int, dict] = {}
        self._status_at = 0.0
        self._status_seen: Optional[dict] = None
        self._status_same = 0     # asks in a row that the instances answered as the one before
        self._next_probe: Optional[float] = None
        self._kafka = None
        self._last_ends: dict = {}
        # is Kafka away right now (the App's KafkaWatch)? Then lags come from the last ends known
        self.kafka_down: Callable[[], bool] = lambda: False
        self._key = ensure_authkey(self.control.authkey)
        self.rebalances: list[dict] = []
        self.stopped = False

    # -- plumbing ----------------------------------------------------------------------------
    @property
    def kafka(self):
        if self._kafka is None:
            from statekit.kafka import Kafka

            self._kafka = Kafka(self.spec.bootstrap, timeout=self.spec.request_timeout)
        return self._kafka

    def _call(self, m: Member, *msg, timeout: float = 300.0):
        if m.conn is None:
            m.conn = connect(m.process.port, self._key)
        try:
            return call(m.conn, *msg, timeout=timeout)
        except InstanceUnreachable:
            try:
                m.conn.close()
            except Exception:  # noqa: BLE001
                pass
            m.conn = None
            raise

    def _write_assignment(self, state: str = "running") -> None:
        a = self.assignment
        body = a.to_dict() if a is not None else {"generation": 0, "active": {}}
        body.update(application=self.application, state=state, partitions=self.spec.partitions,
                    instances={str(i): {"status": m.status if m.live else "dead",
                                        "port": m.process.port if m.process else None,
                                        "pid": m.process.pid if m.process else None,
                                        "incarnation": m.incarnation}
                               for i, m in sorted(self.members.items())})
        path = self.control.assignment
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(body, f)
        os.replace(tmp, path)

    # -- life --------------------------------------------------------------------------------
    def _write_runspec(self) -> None:
        """What instance processes load: the worker spec, with the plans' user functions."""
        import pickle

        from pyspark import cloudpickle

        path = self.control.runspec
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(cloudpickle.dumps(self.spec, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)

    def start(self, instances: int, options: Optional[dict] = None) -> Assignment:
        """Start instances 0..n-1 (a previous run's disks are kept) and the first assignment."""
        self.begin(instances, options)
        return self.finish()

    def begin(self, instances: int, options: Optional[dict] = None) -> None:
        """The first half of ``start``: the processes are launched, not waited for, and the
        assignment file says "starting" (the exchange holds a batch that comes now until its
        owner is ready), so the engine's queries can start meanwhile."""
        with self._lock:
            self.options = dict(options or {})
            self.stopped = False
            self._write_runspec()
            self.assignment = self._saved_assignment()
            self._starting = []
            for i in range(int(instances)):
                m = self.members.get(i) or Member(i)
                self.members[i] = m
                m.incarnation += 1
                self._starting.append((m, supervisor.launch(self.control, i, m.incarnation,
                                                            self.layout.instance_dir(i))))
            self._write_assignment(state="starting")

    def finish(self) -> Assignment:
        """The second half of ``start``: every instance listens, the first rebalance is made."""
        with self._lock:
            procs, self._starting = self._starting, []
            for m, ip in procs:
                m.process = supervisor.wait_ready(self.control, ip)
                m.status, m.conn = "alive", None
                self._watch_death(m)
                self.publish(ev.InstanceStarted(instance=m.instance, incarnation=m.incarnation,
                                                instance_pid=ip.pid, reason="start",
                                                disk="kept" if self.layout.tasks_on_disk(m.instance)
                                                else "new"))
            self._rebalance("start")
        self._thread = threading.Thread(target=self._loop, name=f"statekit-coordinator-"
                                        f"{self.application}", daemon=True)
        self._thread.start()
        return self.assignment

    def _saved_assignment(self) -> Optional[Assignment]:
        """The last run's assignment, for stickiness across stop/start."""
        if self.assignment is not None:
            return self.assignment
        try:
            with open(self.control.assignment) as f:
                body = json.load(f)
            a = Assignment.from_dict(body)
            if set(a.active) == set(self.tasks):
                return a
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            pass
        return None

    def stop(self) -> None:
        """Stop every instance gracefully (tasks closed, replicas closed) and the loop."""
        self._stop.set()
        self._loop_wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        with self._lock:
            self.stopped = True
            if self.members:
                self._write_assignment(state="stopped")
            for m in self.members.values():
                if m.live and m.process is not None:
                    try:
                        self._call(m, "stop", timeout=60)
                    except InstanceUnreachable:
                        pass
                    supervisor.reap(m.process)
                    m.status = "stopped"
                if m.conn is not None:
                    try:
                        m.conn.close()
                    except Exception:  # noqa: BLE001
                        pass
                    m.conn = None
            if self._kafka is not None:
                self._kafka.close()
                self._kafka = None

    def abort(self) -> None:
        """Kill every instance now (the App's process is going away, or a test ends)."""
        self._stop.set()
        self._loop_wake.set()
        with self._lock:
            for m in self.members.values():
                if m.process is not None and m.process.alive():
                    supervisor.kill(m.process)
                if m.live:
                    m.status = "stopped"
            self.stopped = True

    # -- the loop ----------------------------------------------------------------------------
    def _watch_death(self, m: Member) -> None:
        """Wake the loop the moment ``m``'s process ends (a thread waits for it): the loop
        sleeps until its next status refresh or probe instead of looking every 50 ms."""
        proc = getattr(m.process, "proc", None)
        if proc is None:
            return

        def wait():
            try:
                proc.wait()
            except Exception:  # noqa: BLE001 - reaped elsewhere: the loop sees it either way
                pass
            self._loop_wake.set()

        threading.Thread(target=wait, name=f"statekit-instance-{m.instance}-exit",
                         daemon=True).start()

    def _loop_timeout(self) -> float:
        """Seconds until the loop has something to do unless woken: the next status refresh or
        probe (at most LOOP_MAX_S, so that a process the loop was not told about is seen too)."""
        now = time.monotonic()
        due = self._status_at + self._status_every() - now
        if self._next_probe is not None:
            due = min(due, self._next_probe - now)
        return min(LOOP_MAX_S, max(0.01, due))

    def _loop(self) -> None:
        while True:
            self._loop_wake.wait(self._loop_timeout())
            self._loop_wake.clear()
            if self._stop.is_set():
                return
            try:
                with self._lock:
                    if self.stopped:
                        return
                    for m in list(self.members.values()):
                        if m.live and m.process is not None and not m.process.alive():
                            self._on_death(m)
                    now = time.monotonic()
                    if now - self._status_at > self._status_every():
                        self._refresh_statuses()
                    if self._next_probe is not None and now >= self._next_probe:
                        self._probe()
            except Exception as exc:  # noqa: BLE001 - the loop must survive, and say why
                log.warning("coordinator: %s", " ".join(str(exc).split())[:300])

    def _refresh_statuses(self) -> dict:
        out = {}
        for i, m in self.members.items():
            if not m.live:
                continue
            try:
                reply = self._call(m, "status", timeout=30)
                if reply[0] == "ok":
                    out[i] = reply[1]
            except InstanceUnreachable:
                continue
        self._statuses = out
        self._status_at = time.monotonic()
        seen = {i: {k: v for k, v in st.items() if k != "at"} for i, st in out.items()}
        self._status_same = self._status_same + 1 if seen == self._status_seen else 0
        self._status_seen = seen
        return out

    def _status_every(self) -> float:
        """How often the instances are asked how they are: every STATUS_S while anything
        moves, every STATUS_QUIET_S once they answered the same QUIET_AFTER times in a row (an
        idle app; a death is seen from the process at once either way)."""
        return STATUS_QUIET_S if self._status_same >= QUIET_AFTER else STATUS_S

    def _on_death(self, m: Member, rebalance: bool = True) -> None:
        from statekit.worker import crash as crash_mod

        code = m.process.exit_code()
        req = m.kill_request or {}
        cause, mode, point = req.get("cause", "exit"), req.get("mode", "process"), None
        claim = crash_mod.find_claim(self.control.path, m.instance, m.process.pid)
        if claim is not None:
            cause, mode, point = "crash", claim.get("mode", "process"), claim.get("point")
        if cause == "exit" and code is not None and code < 0:
            cause = "kill"
        tasks = [str(t) for t in self.assignment.active_tasks(m.instance)] if self.assignment else []
        m.status, m.died_at, m.kill_request = "dead", time.time(), None
        if m.conn is not None:
            try:
                m.conn.close()
            except Exception:  # noqa: BLE001
                pass
            m.conn = None
        deleted = []
        if mode == "disk-loss":
            deleted = self.layout.wipe_instance(m.instance)
        m.history.append({"died_at": m.died_at, "cause": cause, "mode": mode, "point": point})
        self.publish(ev.InstanceDied(instance=m.instance, incarnation=m.incarnation, cause=cause,
                                     mode=mode, point=point, exit_code=code, tasks=tasks,
                                     deleted=len(deleted), generation=self.generation))
        self._write_assignment()   # the routers stop calling it at once
        if not rebalance:
            return
        if self.live():
            self._rebalance(f"instance {m.instance} died", dead={m.instance})
        else:
            self.on_change("no-live-instance")

    def _probe(self) -> None:
        self._next_probe = None
        if self.assignment is None:
            return
        lags = self._lags()
        caught = False
        for t, insts in self.assignment.warmups.items():
            for i in insts:
                lag = lags.get(t, {}).get(i)
                if lag is not None and lag <= self.settings.acceptable_recovery_lag:
                    self.publish(ev.WarmupCaughtUp(task=str(t), instance=i, lag=lag,
                                                   acceptable_lag=self.settings.acceptable_recovery_lag,
                                                   generation=self.generation))
                    caught = True
        leaving_done = [m for m in self.members.values()
                        if m.status == "leaving" and not self.assignment.active_tasks(m.instance)]
        for m in leaving_done:
            try:
                self._leave(m)
            except MembershipError as exc:   # the one who asked hears it from remove_instance
                m.history.append({"refused_leave": str(exc), "at": time.time()})
        if caught:
            self._rebalance("probing rebalance: a warmup caught up", lags=lags)
        elif self.assignment.warmups or any(m.status == "leaving" for m in self.members.values()):
            self._next_probe = time.monotonic() + self.settings.probing_rebalance_interval
            self._loop_wake.set()

    # -- assignment --------------------------------------------------------------------------
    @property
    def generation(self) -> Optional[int]:
        return self.assignment.generation if self.assignment is not None else None

    def live(self) -> list[int]:
        return sorted(i for i, m in self.members.items() if m.live)

    def _ends(self) -> dict:
        """Every changelog's end offsets; while Kafka is away, the last ones known (a rebalance
        must not wait out request timeouts, and must not take every copy for caught up)."""
        if self.kafka_down():
            return dict(self._last_ends)
        ends = {}
        for sub, plan in self.spec.plans.items():
            for s in store_specs(plan, sub):
                if getattr(s, "logging", True):
                    topic = changelog_topic(self.application, s.name)
                    try:
                        ends[(sub, s.name)] = self.kafka.end_offsets(topic)
                    except StatekitError:
                        ends[(sub, s.name)] = self._last_ends.get((sub, s.name), {})
        self._last_ends = ends
        return ends

    def _copy_lag(self, task: TaskId, positions: dict, ends: dict) -> Optional[int]:
        total = 0
        for (sub, store), e in ends.items():
            if sub != task.subtopology:
                continue
            end = e.get(task.partition, 0)
            pos = positions.get(store)
            if pos is None or pos < 0:
                pos = 0
            total += max(0, end - pos)
        return total

    def _lags(self) -> dict:
        """``{task: {instance: lag}}`` for every live copy: running actives count as 0, replicas
        by their position, other state directories on live disks by their checkpoint."""
        from statekit.state import checkpoint as ckpt

        ends = self._ends()
        statuses = self._refresh_statuses()
        lags: dict = {t: {} for t in self.tasks}
        for i in self.live():
            st = statuses.get(i) or {}
            held = set()
            for t, row in (st.get("tasks") or {}).items():
                t = TaskId.parse(t)
                if t in lags:
                    lags[t][i] = 0
                    held.add(t)
            for t, row in (st.get("replicas") or {}).items():
                t = TaskId.parse(t)
                if t in lags:
                    lags[t][i] = self._copy_lag(t, row.get("positions") or {}, ends)
                    held.add(t)
            for t in self.layout.tasks_on_disk(i):
                if t in held or t not in lags:
                    continue
                cp = ckpt.read(self.layout.task_dir(i, t), warn=lambda msg: None)
                if cp:
                    lags[t][i] = self._copy_lag(t, {k: v.changelog_offset for k, v in cp.items()}, ends)
        return lags

    def _rebalance(self, reason: str, dead=(), lags=None) -> Assignment:
        self._status_same = 0
        live = self.live()
        if not live:
            raise MembershipError("no live instance to run the tasks")
        leaving = [i for i, m in self.members.items() if m.status == "leaving"]
        old = self.assignment
        lags = self._lags() if lags is None else lags
        new = assign(self.tasks, live, previous=old, lags=lags, leaving=leaving,
                     standby_replicas=self.settings.standby_replicas,
                     acceptable_recovery_lag=self.settings.acceptable_recovery_lag,
                     max_warmup_replicas=self.settings.max_warmup_replicas,
                     generation=(old.generation + 1) if old is not None else 1)
        dead = set(dead) | {i for i, m in self.members.items() if not m.live}
        mv = moves(old, new, dead=dead, leaving=leaving)
        # revocations first: an instance that loses an active task closes it before another opens it
        losing = [i for i in live if old is not None and
                  set(old.active_tasks(i)) - set(new.active_tasks(i))]
        order = losing + [i for i in live if i not in losing]
        self.assignment = new
        opening = {}
        for i in order:
            m = self.members[i]
            try:
                reply = self._call(m, "assign", new.generation, new.for_instance(i), self.options)
                if reply[0] == "ok":
                    opening.update(reply[1])
            except InstanceUnreachable:
                continue   # it died: the loop notices and rebalances again
        self._write_assignment()
        rec = {"generation": new.generation, "reason": reason, "at": time.time(),
               "moves": [m_.to_dict() for m_ in mv], "assignment": new.to_dict(), "opening": opening}
        self.rebalances.append(rec)
        self.publish(ev.Rebalance(reason=reason, live=live, active=rec["assignment"]["active"],
                                  standbys=rec["assignment"].get("standbys", {}),
                                  warmups=rec["assignment"].get("warmups", {}), moves=rec["moves"],
                                  probing=bool(new.warmups), generation=new.generation))
        if new.warmups or leaving:
            self._next_probe = time.monotonic() + self.settings.probing_rebalance_interval
            self._loop_wake.set()
        self.on_change("rebalance")
        return new

    # -- membership changes ------------------------------------------------------------------
    def _member(self, instance, want_live: bool = True) -> Member:
        try:
            i = int(instance)
        except (TypeError, ValueError):
            raise MembershipError(f"instance must be a number, got {instance!r}") from None
        m = self.members.get(i)
        if m is None:
            known = ", ".join(str(k) for k in sorted(self.members)) or "none"
            raise MembershipError(f"there is no instance {i} (instances: {known})")
        if want_live and not m.live:
            raise MembershipError(f"instance {i} is already {m.status}; revive({i}) brings it back")
        return m

    def kill(self, instance, mode: str = "process", cause: str = "kill", allow_last: bool = False) -> dict:
        """SIGKILL an instance now. The loop then handles its death like any other."""
        with self._lock:
            m = self._member(instance)
            if not allow_last and self.live() == [m.instance]:
                raise MembershipError(f"instance {m.instance} is the last live instance; kill would "
                                      f"stop all processing: add_instance() first, or crash() it")
            m.kill_request = {"cause": cause, "mode": mode}
            code = supervisor.kill(m.process)
            self._on_death(m)
            return {"instance": m.instance, "exit_code": code, "mode": mode}

    def revive(self, instance, disk: bool = True) -> Assignment:
        """Start a dead instance again, with its state directory as it was or without it."""
        with self._lock:
            m = self._member(instance, want_live=False)
            if m.live:
                raise MembershipError(f"instance {m.instance} is alive; kill it first")
            if not disk:
                self.layout.wipe_instance(m.instance)
            kept = bool(self.layout.tasks_on_disk(m.instance))
            self._spawn(m, reason="revive", disk=("kept" if kept else "wiped") if disk else "wiped")
            return self._rebalance(f"instance {m.instance} revived")

    def restart_instances(self) -> list[int]:
        """Bring every instance back at once: the dead ones are revived with their disks; when none
        is dead, every live one is killed (a process crash of all of them) and revived. One
        rebalance at the end. Returns the instances started."""
        with self._lock:
            dead = [i for i, m in sorted(self.members.items()) if m.status == "dead"]
            if not dead:
                for i in self.live():
                    m = self.members[i]
                    m.kill_request = {"cause": "kill", "mode": "process"}
                    supervisor.kill(m.process)
                    self._on_death(m, rebalance=False)
                dead = [i for i, m in sorted(self.members.items()) if m.status == "dead"]
            procs = []
            for i in dead:
                m = self.members[i]
                m.incarnation += 1
                procs.append((m, supervisor.launch(self.control, i, m.incarnation,
                                                   self.layout.instance_dir(i))))
            for m, ip in procs:
                m.process = supervisor.wait_ready(self.control, ip)
                m.status, m.conn = "alive", None
                self._watch_death(m)
                self.publish(ev.InstanceStarted(
                    instance=m.instance, incarnation=m.incarnation, instance_pid=ip.pid,
                    reason="restart", generation=self.generation,
                    disk="kept" if self.layout.tasks_on_disk(m.instance) else "wiped"))
            self._rebalance("restart")
            return dead

    def add_instance(self) -> int:
        with self._lock:
            i = max(self.members) + 1 if self.members else 0
            m = self.members[i] = Member(i)
            self.layout.wipe_instance(i)   # a new instance starts with an empty disk
            self._spawn(m, reason="add", disk="new")
            self._rebalance(f"instance {i} joined")
            return i

    def _spawn(self, m: Member, reason: str, disk: str) -> None:
        m.incarnation += 1
        ip = supervisor.launch(self.control, m.instance, m.incarnation,
                               self.layout.instance_dir(m.instance))
        m.process = supervisor.wait_ready(self.control, ip)
        m.status, m.conn = "alive", None
        self._watch_death(m)
        self.publish(ev.InstanceStarted(instance=m.instance, incarnation=m.incarnation,
                                        instance_pid=ip.pid, disk=disk, reason=reason,
                                        generation=self.generation))

    def remove_instance(self, instance, timeout: float = 120.0) -> None:
        """Graceful: the instance's tasks move first (warmups catch up elsewhere, probing
        rebalances move them), then it stops. Blocks until it left."""
        with self._lock:
            m = self._member(instance)
            if self.live() == [m.instance]:
                raise MembershipError(f"instance {m.instance} is the last live instance; an "
                                      f"application needs one: add_instance() first")
            m.status = "leaving"
            self._rebalance(f"instance {m.instance} is leaving")
            if not self.assignment.active_tasks(m.instance):
                self._leave(m)
                return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if m.status == "stopped" or not m.live:
                    return
                if m.status == "alive":   # it stayed: every other instance died meanwhile
                    raise MembershipError(f"instance {m.instance} did not leave: every other "
                                          f"instance died meanwhile, and an application needs one")
            time.sleep(0.05)
        with self._lock:   # warmups did not catch up in time: move the rest now
            if m.live:
                self._leave(m)

    def _leave(self, m: Member) -> None:
        """Stop a leaving instance (it closes its tasks and replicas), then rebalance without it.
        Tasks it still held (its warmups did not catch up in time) open elsewhere. When every other
        instance died meanwhile it stays: it is the last one."""
        if not [i for i in self.live() if i != m.instance]:
            m.status = "alive"
            self._rebalance(f"instance {m.instance} stays: it is the last live instance")
            raise MembershipError(f"instance {m.instance} did not leave: every other instance died "
                                  f"meanwhile, and an application needs one")
        try:
            self._call(m, "stop", timeout=60)
        except InstanceUnreachable:
            pass
        supervisor.reap(m.process)
        m.status, m.conn = "stopped", None
        self.publish(ev.InstanceLeft(instance=m.instance, generation=self.generation))
        self._write_assignment()
        self._rebalance(f"instance {m.instance} left")

    def scale(self, n: int) -> list[int]:
        """Add or remove instances (the highest numbers leave first) until ``n`` are live."""
        n = int(n)
        if n < 1:
            raise MembershipError(f"scale needs at least 1 instance, got {n}")
        changed = []
        while len(self.live()) < n:
            changed.append(self.add_instance())
        while len(self.live()) > n:
            i = max(self.live())
            self.remove_instance(i)
            changed.append(i)
        return changed

    def pause_replicas(self, paused: bool, instance=None) -> list:
        """Stop (or resume) the standby and warmup replicas of one live instance, or of all."""
        with self._lock:
            ms = [self._member(instance)] if instance is not None else \
                [m for m in self.members.values() if m.live]
            out = []
            for m in ms:
                reply = self._call(m, "pause_replicas", bool(paused))
                out += [(m.instance, t) for t in reply[1]]
            return out

    # -- observation -------------------------------------------------------------------------
    def statuses(self, fresh: bool = False, wait: bool = True) -> Optional[dict]:
        """The instances' reports, asked again when older than the polling interval (``fresh``:
        now). ``wait=False``: None instead of waiting for the coordinator's lock, which its loop
        may hold for request timeouts while Kafka is away (a probing rebalance reads the
        changelogs' ends): the App's monitor must go on watching Kafka meanwhile."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            if fresh or time.monotonic() - self._status_at > max(1.0, self._status_every()):
                self._refresh_statuses()
            return dict(self._statuses)
        finally:
            self._lock.release()

    def calibrate(self, topic: str, partition: int, settle: float = 0.0) -> Optional[tuple]:
        """``(records/s, load)`` of a restore now, as the instance owning ``partition``'s task
        measures it (None when no live instance answers). On a connection of its own: a calibration takes a second or
        more, and status calls must not wait for it."""
        with self._lock:
            owners = [i for t, i in (self.assignment.active.items() if self.assignment else ())
                      if t.partition == partition]
            ports = [(m.process.port) for m in (self.members.get(i) for i in owners + self.live())
                     if m is not None and m.live and m.process is not None]
        for port in ports:
            try:
                conn = connect(port, self._key)
            except InstanceUnreachable:
                continue
            try:
                reply = call(conn, "calibrate", topic, partition, settle, timeout=120 + settle)
            except InstanceUnreachable:
                continue
            finally:
                conn.close()
            if reply[0] == "ok":
                return float(reply[1]), float(reply[2]) if len(reply) > 2 else 1.0
        return None

    def tasks_ready(self, fresh: bool = False, wait: bool = True) -> bool:
        """Every active task is open and running, with no spooled batch waiting (the spools are
        read from the control directory, so a batch an engine spooled a moment ago counts).
        ``wait=False``: False, not known yet, while the coordinator's lock is held."""
        from statekit.worker.exchange import backlog

        if self.assignment is None or backlog(os.path.join(self.control.path, "spool")):
            return False
        st = self.statuses(fresh=fresh, wait=wait)
        if st is None:
            return False
        for t, i in self.assignment.active.items():
            row = (st.get(i) or {}).get("tasks", {}).get(str(t))
            if row is None or row.get("state") != "running" or row.get("backlog"):
                return False
        return True

    def failed_tasks(self, wait: bool = True) -> list[tuple]:
        """``(task, instance, error, kind)`` of every failed task. ``wait=False``: from the last
        reports while the coordinator's lock is held (a failure stays in them)."""
        out = []
        reports = self.statuses(wait=wait)
        for i, st in (self.last_statuses() if reports is None else reports).items():
            for t, row in (st.get("tasks") or {}).items():
                if row.get("state") == "failed":
                    out.append((t, i, row.get("error"), row.get("kind")))
        return out

    def last_statuses(self) -> dict:
        """The instances' reports of the last poll (every half second), without waiting for the
        coordinator's lock: what the App's KafkaWatch reads."""
        return dict(self._statuses)

    def members_frame_rows(self) -> list[dict]:
        st = self._statuses
        rows = []
        a = self.assignment
        for i, m in sorted(self.members.items()):
            rows.append({"instance": i, "status": m.status, "incarnation": m.incarnation,
                         "pid": m.process.pid if m.process else None,
                         "active": [str(t) for t in a.active_tasks(i)] if a else [],
                         "standby": [str(t) for t in a.standby_tasks(i)] if a else [],
                         "warmup": [str(t) for t in a.warmup_tasks(i)] if a else [],
                         "reported": bool(st.get(i))})
        return rows
