"""Which executor a Spark Python worker belongs to: its executor id and JVM, read from /proc.

A Python worker's ancestors include the JVM running an ``...ExecutorBackend`` with its
``--executor-id``; on a local master there is none (the driver runs the tasks). The executor's
number is the ``instance`` of the events published there; its JVM is what a crash "executor"
directive kills.
"""
from __future__ import annotations

import os
import re
from typing import Optional

from statekit.engine.spark.procs import cmdline, parent

EXECUTOR_ID = re.compile(r"--executor-id\s+(\S+)")
_EXECUTOR_ID = EXECUTOR_ID


_IDENTITY: dict = {}


def executor_identity() -> tuple:
    """``(executor id, executor JVM pid)`` of this Python worker — found among its ancestors (the
    JVM running an ``...ExecutorBackend``); ``(None, None)`` on the driver (a local master)."""
    me = os.getpid()
    if me in _IDENTITY:
        return _IDENTITY[me]
    found = (None, None)
    pid = parent(me)
    for _ in range(6):
        if pid is None or pid <= 1:
            break
        cl = cmdline(pid)
        if "ExecutorBackend" in cl:
            m = _EXECUTOR_ID.search(cl)
            found = (m.group(1) if m else None, pid)
            break
        pid = parent(pid)
    _IDENTITY[me] = found
    return found


def instance_number(executor_id: Optional[str]) -> Optional[int]:
    """The ``instance`` field of events published on an executor: its number (None: the driver)."""
    return int(executor_id) if executor_id is not None and str(executor_id).isdigit() else None
