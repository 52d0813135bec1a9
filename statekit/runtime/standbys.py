"""Standby replicas of an application: one ``statekit.state.StandbyReplica`` (a thread in the driver
process, tailing the task's changelogs) per (task, standby instance) of the assignment.

A standby of task ``t`` on instance ``i`` lives in ``<state_dir>/instance-<i>/<app>/<t>`` — the very
directory the active task would use on that instance — so a promotion hands the store over as is and
the active task replays only the standby's lag.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional

log = logging.getLogger("statekit.standbys")

__all__ = ["StandbyManager"]


class StandbyManager:
    def __init__(self, app):
        self.app = app
        self._replicas: dict[tuple[int, int], object] = {}
        self._paused: set[tuple[int, int]] = set()
        self._lock = threading.RLock()
        self.promotions: list[dict] = []

    # -- the set of replicas follows the assignment
    def _specs(self):
        from statekit.runtime.task_runner import store_specs

        return store_specs(self.app.plan)

    def _new(self, task: int, instance: int):
        from statekit.state.standby import StandbyReplica

        return StandbyReplica(self.app.name, task, self._specs(),
                              state_dir=self.app.layout.instance_dir(instance),
                              bootstrap=self.app.bootstrap)

    def sync(self, assignment) -> None:
        """Start the standbys the assignment wants, stop (close) the others."""
        want = {(t, i) for t, insts in assignment.standbys.items() for i in insts}
        with self._lock:
            for key in list(self._replicas):
                if key not in want:
                    self._close(key)
            for key in sorted(want):
                if key not in self._replicas:
                    try:
                        sb = self._new(*key)
                    except Exception as exc:  # e.g. the directory is still locked by a dying worker
                        log.warning("standby of task %s on instance %s did not start: %s", key[0], key[1],
                                    " ".join(str(exc).split())[:200])
                        continue
                    self._replicas[key] = sb
                    sb.start()
                    self._publish("standby_started", key)

    def _close(self, key) -> None:
        sb = self._replicas.pop(key, None)
        self._paused.discard(key)
        if sb is not None:
            try:
                sb.close()
            except Exception as exc:
                log.info("closing standby %s: %s", key, exc)

    def _publish(self, typ: str, key, **extra) -> None:
        ev = {"type": typ, "task": key[0], "instance": key[1], "role": "standby", "ts": time.time()}
        ev.update(extra)
        self.app._publish(ev)

    # -- queries
    def has(self, task: int, instance: int) -> bool:
        return (task, instance) in self._replicas

    def replica(self, task: int, instance: int):
        return self._replicas.get((task, instance))

    def keys(self) -> list:
        return sorted(self._replicas)

    def lag_rows(self) -> list:
        """``[{task, instance, store, offset, end, lag}]`` for every replica and logged store."""
        from statekit.state.task import changelog_topic

        rows = []
        with self._lock:
            items = list(self._replicas.items())
        k = self.app.kafka
        ends = {}
        for (t, i), sb in items:
            try:
                pos = sb.positions()
            except Exception:
                continue
            for store, off in pos.items():
                topic = changelog_topic(self.app.name, store)
                if topic not in ends:
                    try:
                        ends[topic] = k.end_offsets(topic)
                    except Exception:
                        ends[topic] = {}
                end = ends[topic].get(t)
                off = None if off is None or off < 0 else off
                lag = None if end is None else max(0, end - (off or 0))
                rows.append({"task": t, "instance": i, "store": store, "offset": off, "end": end,
                             "lag": lag, "paused": (t, i) in self._paused})
        return rows

    def wait_caught_up(self, timeout: float = 30.0) -> int:
        """Block until every running (not paused) standby has no lag; returns the total lag left."""
        deadline = time.monotonic() + timeout
        while True:
            total = sum(r["lag"] or 0 for r in self.lag_rows() if not r["paused"])
            if total == 0 or time.monotonic() > deadline:
                return total
            time.sleep(0.05)

    # -- control
    def pause(self, task: Optional[int] = None, instance: Optional[int] = None) -> list:
        """Stop tailing (the store stays open, its lag grows): to show a promotion replaying a lag."""
        out = []
        with self._lock:
            for key, sb in self._replicas.items():
                if (task is None or key[0] == task) and (instance is None or key[1] == instance):
                    sb.stop()
                    self._paused.add(key)
                    out.append(key)
        return out

    def resume(self, task: Optional[int] = None, instance: Optional[int] = None) -> list:
        out = []
        with self._lock:
            for key in sorted(self._paused):
                if (task is None or key[0] == task) and (instance is None or key[1] == instance):
                    sb = self._replicas.get(key)
                    if sb is not None:
                        sb._stop.clear()
                        sb.start()
                    self._paused.discard(key)
                    out.append(key)
        return out

    def promote(self, task: int, instance: int) -> dict:
        """Promote the standby of ``task`` on ``instance``: stop it, write its checkpoint, release the
        directory for the active task. Returns ``{task, instance, lag, offsets, task_dir}``: ``lag``
        is what the active task's restore will replay."""
        with self._lock:
            key = (task, instance)
            sb = self._replicas.pop(key)
            self._paused.discard(key)
            sb.stop()
            try:
                lag = sb.lag()
                offsets = sb.positions()
            except Exception:
                lag, offsets = None, {}
            task_dir = sb.promote()
        info = {"task": task, "instance": instance, "lag": lag, "offsets": offsets,
                "task_dir": task_dir, "at": time.time()}
        self.promotions.append(info)
        self._publish("standby_promoted", key, lag=lag)
        return info

    def stop_instance(self, instance: int) -> list:
        """The instance died: its standbys die with it (their directories stay unless wiped)."""
        with self._lock:
            keys = [k for k in self._replicas if k[1] == instance]
            for k in keys:
                self._close(k)
        return keys

    def stop_all(self) -> None:
        with self._lock:
            for k in list(self._replicas):
                self._close(k)
