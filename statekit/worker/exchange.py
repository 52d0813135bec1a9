"""The exchange: split a micro-batch by task and hand each part to the task's owner — for every
engine (a Spark query, the local streaming engine).

A task is its source partition, so a micro-batch splits by task for free: task p's part is the
offset range of partition p of each source topic (`split`). Its records stay in Kafka until the
task reads them (`statekit.worker.batch_input`); what travels is the ranges.

    deliver(control_dir, task, batch_id, ranges)      # ranges: [(topic, partition, start, end)]

reads the current assignment (``control/assignment.json``, rewritten atomically by the App's
coordinator at every rebalance generation) and calls the task's active instance, which processes
and commits the batch before it answers (``("done", outputs)``). When the task cannot take it now —
its owner is restoring, the task just moved, or the owner is dead or dies during the call — the
batch goes to the task's *spool* on disk (``("spooled", backlog)``) and the micro-batch goes on: one
instance's failure never holds the others back. The owner processes its spool in batch order,
before anything newer, as soon as it can.

The spool (``control/spool/<task>/<batch>.json``) holds a batch's ranges, a few bytes: the control
directory is not an instance's disk, so a spooled batch survives the death and the disk loss of
the instance that was to process it. A batch id the task has already applied is skipped, so a
batch spooled by an engine whose call to a dying instance went unanswered is never applied twice.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Optional

from statekit.contracts import ControlDir
from statekit.errors import ProcessorError, StatekitError
from statekit.worker.protocol import InstanceUnreachable, call, connect, read_authkey


class EngineStopping(StatekitError):
    """The application is stopping: the engine should not deliver more batches."""


def split(ranges: dict, partitions: int) -> dict:
    """A micro-batch's ranges ``{(topic, partition): (start, end)}`` -> ``{task partition:
    [(topic, partition, start, end)]}``, every task included (possibly with no records: its batch
    still commits, so its punctuators and its batch id move on)."""
    out: dict = {p: [] for p in range(partitions)}
    for (topic, p), (s, e) in sorted(ranges.items()):
        if p not in out:
            raise StatekitError(f"{topic} has a partition {p} but the application has "
                                f"{partitions} tasks: its sources must have {partitions} partitions")
        out[p].append((topic, p, int(s), int(e)))
    return out


def range_records(ranges) -> int:
    """Offsets a batch's ranges span (records, up to transaction markers and compaction gaps)."""
    return sum(max(0, int(e) - int(s)) for _t, _p, s, e in ranges)


# -- the spool ------------------------------------------------------------------------------------

_NAME = re.compile(r"^(\d+)\.json$")


class Spool:
    """A task's batches waiting for it, ``<dir>/<batch>.json`` (its ranges), oldest first."""

    def __init__(self, directory: str):
        self.dir = directory

    def put(self, batch: int, ranges) -> None:
        """Write one batch atomically (a reader never sees half a file)."""
        os.makedirs(self.dir, exist_ok=True)
        path = os.path.join(self.dir, f"{int(batch)}.json")
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"batch": int(batch), "ranges": [list(r) for r in ranges]}, f)
        os.replace(tmp, path)

    def batches(self) -> list:
        """Batch ids waiting here, oldest first."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)

    def __len__(self) -> int:
        return len(self.batches())

    def get(self, batch: int) -> list:
        with open(os.path.join(self.dir, f"{int(batch)}.json")) as f:
            return [tuple(r) for r in json.load(f)["ranges"]]

    def remove(self, batch: int) -> None:
        try:
            os.unlink(os.path.join(self.dir, f"{int(batch)}.json"))
        except FileNotFoundError:
            pass


def backlog(spool_root: str) -> dict:
    """``{task: [batch ids]}`` of every non-empty spool under ``control/spool``."""
    out = {}
    try:
        names = os.listdir(spool_root)
    except FileNotFoundError:
        return out
    for name in names:
        b = Spool(os.path.join(spool_root, name)).batches()
        if b:
            out[name] = b
    return out


# -- delivering -----------------------------------------------------------------------------------

_local = threading.local()


class _Routes:
    """Per-process, per-thread cache of the assignment file and of instance connections."""

    def __init__(self, control_dir: str):
        self.control = ControlDir(control_dir)
        self._stat = None
        self.assignment: Optional[dict] = None
        self.conns: dict = {}
        self.key: Optional[bytes] = None
        self._key_stat = None   # the authkey file the key was read from (a reset() writes a new one)

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
        # an app made again under the same name (reset(), `up --fresh`) has a new key in the same
        # place: a worker process that outlives the first app must not offer it the old one
        st = os.stat(self.control.authkey)
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self.key is None or sig != self._key_stat:
            self.key, self._key_stat = read_authkey(self.control.authkey), sig
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


def _spool(routes: _Routes, task: str, batch: int, ranges, publish) -> tuple:
    sp = Spool(routes.control.spool_dir(task))
    sp.put(batch, ranges)
    n = len(sp)
    if publish is not None:
        from statekit.events import BatchSpooled

        publish(BatchSpooled(task=task, instance=None, batch=batch, records=range_records(ranges),
                             backlog=n))
    return ("spooled", n)


def deliver(control_dir: str, task, batch: int, ranges, publish=None,
            not_owner_wait: float = 5.0, starting_wait: float = 60.0) -> tuple:
    """Hand one task's part of a micro-batch to its owner; returns ``("done", outputs)`` or
    ``("spooled", backlog)``. Raises ``ProcessorError`` when the task's processing failed (the
    engine fails the batch, as Spark fails a task) and ``EngineStopping`` when the application
    stops. While the application starts (the queries start beside the instances), a batch waits
    for the first assignment, up to ``starting_wait`` seconds, then goes to the spool."""
    routes = _routes(control_dir)
    task = str(task)
    ranges = [tuple(r) for r in ranges]
    now = time.monotonic()
    deadline, starting_deadline = now + not_owner_wait, now + starting_wait
    while True:
        a = routes.current()
        if a is None:
            raise StatekitError(f"no assignment in {control_dir}: the application is not running")
        if a.get("state") == "stopped":
            raise EngineStopping(f"{a.get('application', 'the application')} is stopping")
        if a.get("state") == "starting":
            if time.monotonic() > starting_deadline:
                return _spool(routes, task, batch, ranges, publish)
            time.sleep(0.01)
            continue
        owner = a.get("active", {}).get(task)
        info = a.get("instances", {}).get(str(owner)) if owner is not None else None
        if info is None or info.get("status") != "alive":
            return _spool(routes, task, batch, ranges, publish)
        try:
            reply = call(routes.conn(str(owner), info), "batch", task, int(batch),
                         a.get("generation"), ranges)
        except InstanceUnreachable:
            routes.drop(str(owner))
            return _spool(routes, task, batch, ranges, publish)
        kind = reply[0]
        if kind in ("done", "spooled"):
            return reply
        if kind == "not_owner":
            # the owner already acts on a newer generation than our file: wait for the file
            if time.monotonic() > deadline:
                return _spool(routes, task, batch, ranges, publish)
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
