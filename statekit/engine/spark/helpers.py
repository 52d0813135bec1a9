"""The Python helper processes a Spark Connect server starts for statekit, and their end.

A Spark Connect server runs a client session's Python planners — and each streaming query run's,
which runs on a clone of its session — under an artifact id of its own
(``SPARK_JOB_ARTIFACT_UUID`` in the environment of the processes it starts), and keeps one
daemon per id and kind of planner (``lookup_data_sources``, ``create_data_source``,
``plan_data_source_read``, ...), with its worker. Spark 4.3 never ends them: a released session,
or a query that stopped, leaves them behind (here every start or restart of a query left a
daemon and a worker, ~35 MB each, and every client session two more pairs; one server held 29
helpers, 1.66 GiB, after ten client sessions). The Python workers of the queries' stages run
under ``default``, one pool for every session, which Spark trims itself (an idle worker goes
after a minute).

So the ``statekit-kafka`` source notes the id its stream reader is built under (``note``: in
the server's ``plan_data_source_read`` planner, a file per query and id in the application's
control directory), and once a query has stopped (``App.stop()``, or before ``restart()`` starts
it again) the driver ends that id's daemons on this machine (``reap``): SIGTERM to a daemon,
which hangs up on its worker. ``stop_session()`` does the same for the session statekit created
(its ids asked with one small job). Only processes of the ids statekit's own queries and own
session ran under are touched, never a session's the user made. A server on another machine
keeps them (the driver cannot reach its processes).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time

ENV = "SPARK_JOB_ARTIFACT_UUID"
NOTES = "spark-helpers"
_NOTED: set = set()
_DAEMONS = ("pyspark.daemon", "statekit.engine.spark.worker_daemon")


def artifact_id() -> str | None:
    """This Python worker's artifact id, or None under ``default`` (a classic session)."""
    got = os.environ.get(ENV)
    return got if got and got != "default" else None


def note(control_dir: str | None, query: str) -> None:
    """In a planner of ``query``: record its artifact id, once per process (best effort: a
    control directory the server does not see gets nothing)."""
    uid = artifact_id()
    if not uid or not control_dir or (query, uid) in _NOTED:
        return
    _NOTED.add((query, uid))
    d = os.path.join(control_dir, NOTES)
    try:
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{query}.{uid}.json")
        if not os.path.exists(path):
            with open(path, "w") as f:
                json.dump({"query": query, "id": uid, "host": socket.gethostname()}, f)
    except OSError:
        pass


def noted(control_dir: str, queries=None) -> list:
    """``[(query, id, host, path)]`` noted under ``control_dir`` (of ``queries`` only, if given)."""
    d = os.path.join(control_dir, NOTES)
    out = []
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(d, name)) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if queries is None or rec.get("query") in queries:
            out.append((rec.get("query"), rec.get("id"), rec.get("host"), os.path.join(d, name)))
    return out


def daemons_of(ids) -> list:
    """``[pid]`` of the Python worker daemons and planners on this machine that run under one of
    ``ids`` (read from /proc: processes of this user)."""
    ids = {i for i in ids if i and i != "default"}
    if not ids:
        return []
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if not any(m.encode() in cmd for m in _DAEMONS):
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(ENV.encode() + b"=") and item[len(ENV) + 1:].decode(errors="replace") in ids:
                out.append(int(name))
                break
    return out


def end(ids, wait: float = 5.0) -> list:
    """SIGTERM the daemons of ``ids`` on this machine (each hangs up on its workers); returns the
    pids signalled."""
    pids = daemons_of(ids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait
    while pids and time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{p}") and _running(p) for p in pids):
            break
        time.sleep(0.05)
    return pids


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def reap(control_dir: str, queries, wait: float = 5.0) -> list:
    """End the helpers of the stopped ``queries`` (their noted ids on this machine) and forget the
    notes; returns the pids signalled."""
    recs = noted(control_dir, set(queries))
    here = socket.gethostname()
    pids = end({uid for _q, uid, host, _p in recs if host == here}, wait=wait)
    for _q, _uid, host, path in recs:
        if host == here:
            try:
                os.unlink(path)
            except OSError:
                pass
    return pids
