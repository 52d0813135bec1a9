"""This machine's processes, read from /proc: what a Spark process started below it (a
standalone cluster's daemons, a Connect server's Python helpers), so that statekit stops exactly
the processes it started. No Spark import: the modules that start JVMs share it."""
from __future__ import annotations

import os


def _children() -> dict:
    """{ppid: [pid]} of every process on the machine."""
    out: dict = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(name))
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
