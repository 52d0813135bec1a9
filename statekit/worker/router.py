"""The engine's side of a task: hand a micro-batch to the instance that owns the task.

An engine (a Spark Python worker reading one input split, or the local engine's driver) calls

    deliver(control_dir, task, batch_id, fragment_ipc, split=s, splits=n)

once per task and split: the task's part of split ``s`` of the micro-batch (``worker.protocol``).
It reads the current assignment (``control/assignment.json``, rewritten atomically by the App's
coordinator at every rebalance generation) and sends the fragment to the task's active instance,
which keeps it (``("stored",)``) until the batch's last fragment arrives, then processes and commits
the batch before it answers that one (``("done", n)``); when the task is not ready (restoring, just
moved) the instance spools the fragments (``("spooled", backlog)``). When the owner is dead or dies during the call, the router
spools the batch itself: the next owner processes it, in order, before anything newer. Either way
the micro-batch goes on, so one instance's failure never holds the others back — Spark's own tasks
never fail for it.

A batch that reached the dead owner and was committed before it died is spooled too, and skipped by
the next owner (its batch id is already applied): nothing is lost, nothing is applied twice.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Optional

from statekit.contracts import ControlDir
from statekit.errors import ProcessorError, StatekitError
from statekit.worker.protocol import InstanceUnreachable, call, connect, ipc_count, read_authkey
from statekit.worker.spool import Spool


class EngineStopping(StatekitError):
    """The application is stopping: the engine should not deliver more batches."""


_local = threading.local()


class _Routes:
    """Per-process, per-thread cache of the assignment file and of instance connections."""

    def __init__(self, control_dir: str):
        self.control = ControlDir(control_dir)
        self._stat = None
        self.assignment: Optional[dict] = None
        self.conns: dict = {}
        self.key: Optional[bytes] = None

    def current(self) -> Optional[dict]:
        path = self.control.assignment
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        if sig != self._stat:
            try:
                with open(path) as f:
                    self.assignment = json.load(f)
                self._stat = sig
            except (FileNotFoundError, ValueError):
                return self.assignment
        return self.assignment

    def conn(self, instance: str, info: dict):
        ident = (instance, info.get("port"), info.get("incarnation"))
        c = self.conns.get(instance)
        if c is not None and c[0] == ident:
            return c[1]
        if c is not None:
            self.drop(instance)
        if self.key is None:
            self.key = read_authkey(self.control.authkey)
        conn = connect(info["port"], self.key)
        self.conns[instance] = (ident, conn)
        return conn

    def drop(self, instance: str) -> None:
        c = self.conns.pop(instance, None)
        if c is not None:
            try:
                c[1].close()
            except Exception:  # noqa: BLE001
                pass


def _routes(control_dir: str) -> _Routes:
    cache = getattr(_local, "routes", None)
    if cache is None:
        cache = _local.routes = {}
    r = cache.get(control_dir)
    if r is None:
        r = cache[control_dir] = _Routes(control_dir)
    return r


def _spool(routes: _Routes, task: str, batch: int, records_ipc: bytes, publish, split: int = 0,
           splits: int = 1) -> tuple:
    sp = Spool(routes.control.spool_dir(task))
    sp.put(batch, records_ipc, split, splits)
    backlog = len(sp.batches())
    if publish is not None:
        from statekit.events import BatchSpooled

        publish(BatchSpooled(task=task, instance=None, batch=batch, records=ipc_count(records_ipc),
                             backlog=backlog))
    return ("spooled", backlog)


def deliver(control_dir: str, task, batch: int, records_ipc: bytes, publish=None,
            not_owner_wait: float = 5.0, split: int = 0, splits: int = 1) -> tuple:
    """Deliver one fragment of a micro-batch of ``task``; returns ``("done", outputs)``,
    ``("stored",)`` or ``("spooled", backlog)``. Raises ``ProcessorError`` when the task's
    processing failed (the engine fails the batch, as Spark fails a task) and ``EngineStopping``
    when the application stops."""
    routes = _routes(control_dir)
    task = str(task)
    deadline = time.monotonic() + not_owner_wait
    while True:
        a = routes.current()
        if a is None:
            raise StatekitError(f"no assignment in {control_dir}: the application is not running")
        if a.get("state") == "stopped":
            raise EngineStopping(f"{a.get('application', 'the application')} is stopping")
        owner = a.get("active", {}).get(task)
        info = a.get("instances", {}).get(str(owner)) if owner is not None else None
        if info is None or info.get("status") != "alive":
            return _spool(routes, task, batch, records_ipc, publish, split, splits)
        try:
            reply = call(routes.conn(str(owner), info), "batch", task, int(batch),
                         a.get("generation"), int(split), int(splits), records_ipc)
        except InstanceUnreachable:
            routes.drop(str(owner))
            return _spool(routes, task, batch, records_ipc, publish, split, splits)
        kind = reply[0]
        if kind in ("done", "spooled", "stored"):
            return reply
        if kind == "not_owner":
            # the owner already acts on a newer generation than our file: wait for the file
            if time.monotonic() > deadline:
                return _spool(routes, task, batch, records_ipc, publish, split, splits)
            time.sleep(0.02)
            continue
        if kind == "failed":
            raise ProcessorError(reply[1]) if reply[2] in ("ProcessorError", None) else \
                StatekitError(reply[1])
        raise StatekitError(f"instance {owner}: {reply[1] if len(reply) > 1 else reply}")


def close_connections() -> None:
    """Close this thread's connections to instances (tests, engine shutdown)."""
    cache = getattr(_local, "routes", None) or {}
    for r in cache.values():
        for inst in list(r.conns):
            r.drop(inst)
