"""Query replicas: the driver's own copies of the tasks' stores, fed from the changelogs.

When the tasks run on Spark's executors (the ``executors`` placement) their RocksDB lives on other
hosts, where the driver cannot open it. Interactive queries and the dashboard read a **query
replica** instead: one ``statekit.state.standby.StandbyReplica`` per task, in a driver-local
directory (``<state_dir>/query-replicas/<app>/<task>/``), tailing the task's changelog partitions
and applying committed groups only — the same loop as a standby replica. So a replica never shows an
uncommitted write, and it is as fresh as its lag (changelog records not applied yet).

A read with ``stale=False`` (the default) first waits until the replica has read every changelog of
its task up to the end offsets of the moment of the call — so it answers with every commit made
before the call — for at most ``wait_s`` seconds, then raises ``StaleRead`` naming the lag. With
``stale=True`` it answers at once from what the replica has. ``key_owner`` says which replica
answers and its lag; ``App.lag()`` shows every replica's lag.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

from statekit.contracts import TaskId, changelog_topic
from statekit.errors import StaleRead, StatekitError  # noqa: F401 - StaleRead: its old home
from statekit.runtime.copies import Place
from statekit.runtime.queries import KeyOwner, QueryRouter

ROLE = "query-replica"


@dataclass(frozen=True)
class ReplicaKeyOwner(KeyOwner):
    """``KeyOwner`` of the executors placement: ``instance`` is the executor that last committed
    the task (None before its first commit), ``role`` is ``"query-replica"``, ``state_dir`` the
    replica's directory on the driver, ``lag`` the changelog records the replica has not applied."""

    lag: Optional[int] = None


class QueryReplicas:
    """One StandbyReplica per task with logged stores, in ``root`` on the driver."""

    def __init__(self, application: str, plans: dict, partitions: int, root: str, bootstrap: str,
                 poll_ms: int = 50):
        from statekit.worker.task import store_specs

        self.application = application
        self.root = root
        self.bootstrap = bootstrap
        self.poll_ms = poll_ms
        self.specs = {}
        for sub, plan in sorted(plans.items()):
            specs = [s for s in store_specs(plan, sub) if getattr(s, "logging", True)]
            if specs:
                for p in range(int(partitions)):
                    self.specs[TaskId(sub, p)] = specs
        self.replicas: dict = {}
        self.paused = False
        self._kafka = None

    @property
    def tasks(self) -> list:
        return sorted(self.specs)

    def task_dir(self, task) -> str:
        from statekit.contracts import task_dir

        return task_dir(self.root, self.application, TaskId.parse(task))

    def start(self) -> "QueryReplicas":
        from statekit.state.standby import StandbyReplica

        os.makedirs(self.root, exist_ok=True)
        try:
            for t, specs in self.specs.items():
                if t not in self.replicas:
                    self.replicas[t] = StandbyReplica(self.application, t, specs, state_dir=self.root,
                                                      bootstrap=self.bootstrap, poll_ms=self.poll_ms)
                if not self.paused:
                    self.replicas[t].start()
        except BaseException:
            self.close()
            raise
        return self

    def pause(self, paused: bool) -> list:
        """Stop (or resume) tailing: the replicas' lag grows while paused (for teaching)."""
        self.paused = bool(paused)
        for r in self.replicas.values():
            r.stop() if paused else r.start()
        return [str(t) for t in self.replicas]

    def close(self) -> None:
        reps, self.replicas = dict(self.replicas), {}
        for r in reps.values():
            try:
                r.close()
            except Exception:  # noqa: BLE001
                pass
        if self._kafka is not None:
            self._kafka.close()
            self._kafka = None

    # -- freshness
    @property
    def kafka(self):
        if self._kafka is None:
            from statekit.kafka import Kafka

            self._kafka = Kafka(self.bootstrap)
        return self._kafka

    def ends(self, task) -> dict:
        """``{store: changelog end offset}`` of one task now."""
        t = TaskId.parse(task)
        topics = [changelog_topic(self.application, s.name) for s in self.specs.get(t, ())]
        if not topics:
            return {}
        got = self.kafka.offsets_many(topics, t.partition)
        return {s.name: got[changelog_topic(self.application, s.name)][1] for s in self.specs[t]}

    def read_to(self, task) -> dict:
        """``{store: next changelog offset the replica will read}``."""
        r = self.replicas.get(TaskId.parse(task))
        return {} if r is None else {n: rp.position for n, rp in r.replays.items()}

    def lag(self, task, ends: Optional[dict] = None) -> Optional[int]:
        """Changelog records (data and markers) the replica has not applied yet."""
        r = self.replicas.get(TaskId.parse(task))
        if r is None:
            return None
        ends = self.ends(task) if ends is None else ends
        pos = r.positions()
        return sum(max(0, e - max(pos.get(s, 0), 0)) for s, e in ends.items())

    def caught_up(self, task, ends: Optional[dict] = None) -> bool:
        """True once the replica has read each changelog of ``task`` up to ``ends`` (default: the
        ends now): every commit made before then is applied (an uncommitted tail never is)."""
        ends = self.ends(task) if ends is None else ends
        have = self.read_to(task)
        return all(have.get(s, -1) >= e for s, e in ends.items())

    def wait(self, task, wait_s: float) -> None:
        """Wait until the replica of ``task`` has every commit made before this call; raise
        ``StaleRead`` after ``wait_s`` seconds."""
        t = TaskId.parse(task)
        if t not in self.replicas:
            return
        ends = self.ends(t)
        deadline = time.monotonic() + wait_s
        while not self.caught_up(t, ends):
            if self.paused or time.monotonic() > deadline:
                lag = self.lag(t, ends)
                why = "paused" if self.paused else f"after {wait_s:g}s"
                raise StaleRead(f"the query replica of task {t} is {lag} changelog records behind "
                                f"({why}): query again, or pass stale=True to read what it has")
            time.sleep(0.01)

    def all_caught_up(self) -> bool:
        return all(self.caught_up(t) for t in self.replicas)

    def rows(self) -> list:
        """``[(task, store, offset applied, changelog end, lag)]`` (internal stores left out)."""
        from statekit.worker.task import is_task_store

        out = []
        for t in self.tasks:
            r = self.replicas.get(t)
            try:
                ends = self.ends(t)
            except StatekitError:
                ends = {}
            pos = r.positions() if r is not None else {}
            for s in self.specs[t]:
                if is_task_store(s.name):
                    continue
                end, off = ends.get(s.name), pos.get(s.name)
                lag = None if end is None else max(0, end - max(off or 0, 0))
                out.append((t, s.name, off, end, lag))
        return out


class ReplicaQueryRouter(QueryRouter):
    """``runtime.queries.QueryRouter`` over the driver's query replicas (same reads, same serdes and
    partitioner, same freshness rules; the one copy of each task is its replica). A paused replica
    is refused at once with ``stale=False``: waiting cannot help."""

    def __init__(self, app, replicas: QueryReplicas, owner_of, wait_s: float = 30.0):
        super().__init__(app)
        self.replicas = replicas
        self.owner_of = owner_of      # task -> the executor number that last committed it
        self.wait_s = self.default_wait = wait_s

    def _places(self, task: TaskId) -> list:
        state = "paused" if self.replicas.paused else "tailing"
        return [Place(None, ROLE, state, self.replicas.task_dir(task))]

    def _no_live(self) -> bool:
        return False

    def _hopeless(self, copies: list) -> bool:
        return bool(copies) and copies[0].state == "paused"

    def _owner(self, c) -> ReplicaKeyOwner:
        return ReplicaKeyOwner(c.task, self.owner_of(c.task), ROLE, c.state_dir, c.state, c.lag,
                               c.lag_s, c.offset, c.end, c.source)
