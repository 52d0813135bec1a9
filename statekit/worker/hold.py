"""A restore held for a learner: ``App.hold_restores(tasks, at)`` writes
``<control_dir>/restore-hold.json`` (``{"tasks": ["0_1"] | null, "at": 0.5}``); the restore of each
named task (every task when ``tasks`` is null) stops once it has crossed ``at`` of its changelog's
offsets and stays there until ``App.release_restores()`` deletes the file, however long the
learner takes to read the cells in between. A held task is restoring, not readable: a query
refuses it (``StaleRead``) or, with ``stale=True``, reads the half-restored store and says how far
behind it is. Read by the instances (and executors) from the restore's progress listener; a file,
as crash directives are, so the App, an instance and a Python worker on an executor all see it.
"""
from __future__ import annotations

import json
import os
from typing import Optional

HOLD_FILE = "restore-hold.json"


def path(control_dir: str) -> str:
    return os.path.join(control_dir, HOLD_FILE)


def write(control_dir: str, tasks: Optional[list], at: float) -> dict:
    """Hold the restores of ``tasks`` (None: every task) at ``at`` of their offsets (atomic)."""
    body = {"tasks": None if tasks is None else sorted(str(t) for t in tasks), "at": float(at)}
    os.makedirs(control_dir, exist_ok=True)
    tmp = path(control_dir) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, path(control_dir))
    return body


def clear(control_dir: str) -> bool:
    """Release every held restore; True if one was held."""
    try:
        os.remove(path(control_dir))
        return True
    except FileNotFoundError:
        return False


def read(control_dir: Optional[str]) -> Optional[dict]:
    if not control_dir:
        return None
    try:
        with open(path(control_dir)) as f:
            body = json.load(f)
    except (FileNotFoundError, ValueError, OSError):
        return None
    return body if isinstance(body, dict) else None


def holds(control_dir: Optional[str], task: str, crossed: int, span: int) -> bool:
    """Whether the restore of ``task``, ``crossed`` of ``span`` offsets in, must stop here now."""
    if not control_dir or not os.path.exists(path(control_dir)):
        return False
    body = read(control_dir)
    if body is None:
        return False
    tasks = body.get("tasks")
    if tasks is not None and str(task) not in tasks:
        return False
    try:
        at = float(body.get("at", 0.5))
    except (TypeError, ValueError):
        at = 0.5
    return span > 0 and crossed < span and crossed >= at * span
