"""This machine's processes, read from /proc: a process's parent and command line (a Python
worker finds its executor's JVM so), and what a Spark process started below it (a standalone
cluster's daemons, a Connect server's Python helpers), so that statekit stops exactly the
processes it started. No Spark import: the modules that start JVMs share it."""
from __future__ import annotations

import os
from typing import Optional


_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def parent(pid: int) -> Optional[int]:
    """``pid``'s parent (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _children() -> dict:
    """{ppid: [pid]} of every process on the machine."""
    out: dict = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid = parent(int(name))
            if ppid is not None:
                out.setdefault(ppid, []).append(int(name))
    return out


def children(pid: int) -> list:
    """The processes whose parent is ``pid``: from its threads' ``children`` files (Linux with
    CONFIG_PROC_CHILDREN), else from a look at every process."""
    if not _CHILDREN_FILES:
        return _children().get(pid, [])
    out: list = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass   # a thread that ended meanwhile
    return out


def descendants(pid: int) -> list:
    """Every process below ``pid``."""
    kids = _children()
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def _nul_separated(pid: int, name: str) -> list:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return [x.decode(errors="surrogateescape") for x in f.read().split(b"\0") if x]
    except OSError:
        return []


def arguments(pid: int) -> list:
    """``pid``'s command line as its arguments ([] once it is gone)."""
    return _nul_separated(pid, "cmdline")


def environment(pid: int) -> dict:
    """The environment ``pid`` was started with ({} once it is gone, or not this user's)."""
    return dict(x.split("=", 1) for x in _nul_separated(pid, "environ") if "=" in x)


def cmdline(pid: int) -> str:
    """``pid``'s command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def spark_home() -> str:
    """pyspark's own directory: its jars, bin/ and sbin/."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))
