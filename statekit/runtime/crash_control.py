"""The crashes a notebook asks for: every request on record (``App.crashes``), the directive that
has not fired yet, its withdrawal, and one armed for a restart; and restores held for a learner
(``hold_restores``/``release_restores``: ``statekit.worker.hold``).

How a crash happens depends on where the tasks run (an instance process, or a Python worker on an
executor): the placement does that part (``runtime.deployment``). What is kept about crashes is the
same for both, and lives here.
"""
from __future__ import annotations

import time
from typing import Optional

from statekit import events as ev
from statekit.errors import StatekitError
from statekit.worker import crash as crash_mod
from statekit.worker import hold as hold_mod

CRASH_MODES = ("process", "disk-loss")


def check_mode_and_point(mode: str, point: str) -> None:
    if mode not in CRASH_MODES:
        raise StatekitError(f"unknown crash mode {mode!r}; use 'process' or 'disk-loss'")
    if point not in crash_mod.POINTS:
        raise StatekitError(f"unknown crash point {point!r}; use one of {', '.join(crash_mod.POINTS)}")


class Crashes:
    """The crashes of one ``App`` (``app``: its façade; crash directives go to its control
    directory)."""

    def __init__(self, app):
        self.app = app
        self.control_dir = app.layout.control_dir
        self._lock = app._lock
        self.records: list[dict] = []
        self.current: Optional[dict] = None   # the last directive written (pending until it fires)

    def crash(self, mode: str = "process", instance: Optional[int] = None,
              after_records: Optional[int] = None, point: str = "records", wait: bool = True,
              timeout: float = 60, subtopology: Optional[int] = None) -> dict:
        """Crash an instance for real.

        With ``after_records=n`` (or another ``point``: "before_send", "before_commit" (the batch's
        records are written, its transaction not committed), "after_ack", "after_rocksdb",
        "mid_restore"), write a crash directive: the first task of that instance that has processed
        ``n`` records of one batch (or reaches the commit or restore point) SIGKILLs its own
        instance; at a commit point, ``after_records=n`` waits for a batch in which the task
        processed at least n records. With ``after_records=None`` and ``point="records"`` the
        instance is killed now.
        ``subtopology`` limits a directive to that sub-topology's tasks.
        ``mode="disk-loss"`` also deletes the instance's state directories once it is dead. The
        other instances take over its tasks; a one-instance app goes to ERROR until ``restart()``.
        With ``wait`` a crash now returns when it is done. Returns the crash record.

        With ``placement="executors"``, ``instance`` is an executor number (None: any), the modes
        are "process" (the Python worker), "executor" (its executor JVM too) and "disk-loss" (and
        the executor's state directory), and a crash "now" fires before the first record of the
        next batch (docs/ARCHITECTURE.md, "Running on a cluster")."""
        return self.app._deploy.placement.crash(self.app, mode, instance, after_records, point,
                                                subtopology)

    def record(self, rec: dict, directive: bool) -> dict:
        """Keep ``rec``; a directive is the pending crash until it fires or is withdrawn."""
        self.records.append(rec)
        if directive:
            self.current = rec
        return rec

    def on_event(self, e: ev.Event) -> None:
        """An event hook: the directive fired (a task claimed it)."""
        rec = self.current
        if isinstance(e, ev.Crashed) and rec is not None and e.directive == rec.get("id"):
            rec.update(status="applied", applied=True, claim={"task": e.task, "batch": e.batch})

    @property
    def pending(self) -> Optional[dict]:
        """The crash directive written but not fired yet (None otherwise)."""
        rec = self.current
        if rec is None or rec.get("status") != "pending":
            return None
        if crash_mod.claimed(self.control_dir, rec["id"]) is not None:
            rec.update(status="applied", applied=True)
            return None
        return rec

    def cancel(self) -> Optional[dict]:
        """Withdraw a crash directive that has not fired yet; returns it (None if there was none)."""
        with self._lock:
            rec = self.current
            if rec is None or rec.get("status") != "pending":
                return None
            crash_mod.clear(self.control_dir)
            if rec.get("id") and crash_mod.claimed(self.control_dir, rec["id"]) is not None:
                rec.update(status="applied", applied=True)
                return None  # it fired meanwhile
            rec["status"] = "withdrawn"
            self.current = None
            return rec

    def clear_directives(self) -> None:
        """A directive left over from another session goes."""
        crash_mod.clear(self.control_dir)

    def write_directive(self, instance, point: str, after_records, mode: str,
                        subtopology: Optional[int] = None) -> dict:
        return crash_mod.write_directive(self.control_dir, instance, point, after_records, mode,
                                         subtopology)

    @staticmethod
    def check_during(crash_during: Optional[dict]) -> None:
        """``restart(crash_during=...)`` refused before anything happens."""
        if crash_during is not None:
            cd = dict(crash_during)
            check_mode_and_point(cd.get("mode", "process"), cd.get("point", "mid_restore"))

    def arm_during_restart(self, crash_during: dict) -> None:
        """A crash directive for the restart about to happen (a crash during the restore itself)."""
        cd = dict(crash_during)
        d = self.write_directive(cd.get("instance"), cd.get("point", "mid_restore"),
                                 cd.get("after_records") or 0, cd.get("mode", "process"))
        self.record({**cd, "id": d["id"], "status": "pending", "requested_at": time.time()},
                    directive=True)

    def hold_restores(self, tasks=None, at: float = 0.5) -> dict:
        """Hold the next restore of ``tasks`` (task ids or a list of them; None: every task) once
        it has crossed ``at`` (0 <= at < 1) of its changelog, until ``release_restores()``: a
        restore that waits for the learner, however long they take to read (notebook 07). A
        held task is restoring: queries refuse it, ``stale=True`` reads it half restored."""
        from statekit.contracts import TaskId

        try:
            at = float(at)
        except (TypeError, ValueError):
            at = float("nan")
        if not 0.0 <= at < 1.0:
            raise StatekitError(f"hold_restores(at=...) is the share of a changelog to restore "
                                f"first: 0 <= at < 1 (got {at!r})")
        names = None
        if tasks is not None:
            given = [tasks] if isinstance(tasks, (str, TaskId)) else list(tasks)
            known = {str(t) for t in self.app.tasks()}
            names = []
            for t in given:
                try:
                    name = str(TaskId.parse(t))
                except (TypeError, ValueError):
                    name = None
                if name not in known:
                    raise StatekitError(f"app '{self.app.name}' has no task {t!r} (tasks: "
                                        f"{', '.join(sorted(known))})")
                names.append(name)
        return hold_mod.write(self.control_dir, names, at)

    def release_restores(self) -> bool:
        """Let every held restore go on (True if one was held)."""
        return hold_mod.clear(self.control_dir)
