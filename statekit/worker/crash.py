"""Crash directives: how the App asks an instance to die at a chosen point.

The App (``App.crash``) writes ``<control_dir>/crash.json``::

    {"id": "<hex>", "instance": 1, "point": "records", "after_records": 25, "mode": "process"}

``point`` is one of ``records`` (after the task has processed ``after_records`` records of a batch),
``before_send`` (commit step 2, before the changelog records go out), ``before_commit`` (they are
acknowledged, the batch's transaction not committed), ``after_ack`` (acknowledged and committed,
RocksDB not yet written), ``after_rocksdb`` (RocksDB written, checkpoint file not yet),
``mid_restore`` (while restoring). At a commit point, ``after_records`` n > 0 means the commit of a
batch in which the task processed at least n records (not an empty one). ``instance`` None matches
any instance; ``subtopology`` (optional) limits the directive to the tasks of one sub-topology.

The worker side (``claim``, called by a task at each point): the first task on a matching instance
that reaches the point claims the directive with an atomic rename to ``crash.claimed.<id>.json`` —
so exactly one process dies per directive — writes who claimed it into that file, and SIGKILLs its
own process (the whole instance). No cleanup runs: RocksDB is not closed, the pending WriteBatch and
the record cache are lost, the changelog may hold records after the last marker.
"""
from __future__ import annotations

import json
import os
import signal
import time
import uuid
from typing import Optional

__all__ = [
    "POINTS", "DIRECTIVE", "write_directive", "read_directive", "clear", "claimed", "claim",
    "maybe_crash", "die", "on_death",
]

POINTS = ("records", "before_send", "before_commit", "after_ack", "after_rocksdb", "mid_restore")
DIRECTIVE = "crash.json"


def _path(control_dir: str) -> str:
    return os.path.join(control_dir, DIRECTIVE)


def _claimed_path(control_dir: str, directive_id: str) -> str:
    return os.path.join(control_dir, f"crash.claimed.{directive_id}.json")


def _atomic_write(path: str, body: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_directive(control_dir: str, instance: Optional[int] = None, point: str = "records",
                    after_records: Optional[int] = 0, mode: str = "process",
                    subtopology: Optional[int] = None) -> dict:
    """Write (or replace) the crash directive; returns it (with its ``id``)."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; use one of {', '.join(POINTS)}")
    os.makedirs(control_dir, exist_ok=True)
    body = {
        "id": uuid.uuid4().hex[:12],
        "instance": None if instance is None else int(instance),
        "point": point,
        "after_records": None if after_records is None else int(after_records),
        "mode": mode,
        "subtopology": None if subtopology is None else int(subtopology),
        "written_at": time.time(),
    }
    _atomic_write(_path(control_dir), body)
    return body


def read_directive(control_dir: str) -> Optional[dict]:
    try:
        with open(_path(control_dir)) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def clear(control_dir: str) -> None:
    """Withdraw a pending directive (one nobody claimed)."""
    try:
        os.unlink(_path(control_dir))
    except FileNotFoundError:
        pass


def claimed(control_dir: str, directive_id: str) -> Optional[dict]:
    """The claim record ``{"id", "task", "instance", "point", "pid", "batch", "records", "at"}`` once a
    worker took the directive; None while it is pending."""
    p = _claimed_path(control_dir, directive_id)
    for _ in range(20):  # the claimer writes its details right after the rename
        try:
            with open(p) as f:
                body = json.load(f)
            if "pid" in body:
                return body
        except FileNotFoundError:
            return None
        except ValueError:
            pass
        time.sleep(0.01)
    try:
        with open(p) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return {"id": directive_id}


def _matches(d: dict, instance: Optional[int], point: str, records: Optional[int],
             task=None) -> bool:
    if d.get("point") != point:
        return False
    sub = d.get("subtopology")
    if sub is not None and task is not None and str(task).split("_")[0] != str(sub):
        return False
    want = d.get("instance")
    if want is not None and instance is not None and int(want) != int(instance):
        return False
    if point == "mid_restore":
        return True
    n = d.get("after_records") or 0
    if point == "records" or n > 0:   # at a commit point: a batch of at least n records
        return records is not None and records >= n
    return True


def claim(control_dir: str, instance: Optional[int], point: str, records: Optional[int] = None,
          task: Optional[int] = None, batch: Optional[int] = None) -> Optional[dict]:
    """Claim the directive if it matches; returns it when this caller won (then it must die)."""
    if not control_dir:
        return None
    d = read_directive(control_dir)
    if d is None or not _matches(d, instance, point, records, task):
        return None
    dst = _claimed_path(control_dir, d["id"])
    try:
        os.rename(_path(control_dir), dst)
    except FileNotFoundError:
        return None  # another worker won
    d.update(task=task, instance_seen=instance, pid=os.getpid(), batch=batch, records=records,
             at=time.time())
    try:
        _atomic_write(dst, d)
    except OSError:
        pass
    return d


_DEATH = None


def on_death(fn) -> None:
    """How this process dies when it claims a directive: ``fn(directive)`` runs first (a Spark
    Python worker on an executor takes its executor, and for disk-loss the executor's state
    directory, with it: ``statekit.engine.spark.executors``); then the process SIGKILLs itself."""
    global _DEATH
    _DEATH = fn


def die(directive: Optional[dict] = None) -> None:  # pragma: no cover - the process ends here
    """A real, uncatchable death: no finally blocks, no atexit, no RocksDB close."""
    if _DEATH is not None and directive is not None:
        try:
            _DEATH(directive)
        except Exception:  # noqa: BLE001 - dying is what matters
            pass
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def maybe_crash(control_dir: str, instance: Optional[int], point: str, records: Optional[int] = None,
                task: Optional[int] = None, batch: Optional[int] = None) -> None:
    """The worker-side hook: claim a matching directive and SIGKILL this process."""
    if claim(control_dir, instance, point, records, task, batch) is not None:
        die()


def find_claim(control_dir: str, instance: Optional[int], pid: int) -> Optional[dict]:
    """The directive a dead process claimed (matched by its pid), once; None if it claimed none."""
    try:
        names = os.listdir(control_dir)
    except FileNotFoundError:
        return None
    for name in names:
        if not (name.startswith("crash.claimed.") and name.endswith(".json")):
            continue
        path = os.path.join(control_dir, name)
        try:
            with open(path) as f:
                body = json.load(f)
        except (FileNotFoundError, ValueError):
            continue
        if body.get("pid") == pid and not body.get("seen"):
            body["seen"] = True
            try:
                _atomic_write(path, body)
            except OSError:
                pass
            return body
    return None
