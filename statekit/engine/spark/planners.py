"""Spark's planners for Python data sources, ended once Spark is done with them.

Spark runs a Python data source's driver-side steps (`lookup_data_sources`, `create_data_source`,
`plan_data_source_read`, ...) in Python processes the JVM starts: one `pyspark.daemon` per kind of
step (`python -m pyspark.daemon pyspark.sql.worker.<step>`, whatever `spark.python.daemon.module`
says), which forks the worker that runs the step. A streaming query over `statekit-kafka` needs them
while it is created and while it plans its first micro-batch (the reader is made once per run), and
never again. Spark closes a released worker after a minute without use (its idle timeout, fixed),
but keeps the daemons for the whole session: three idle interpreters, ~25 MB of PSS each here.

`REAPER` ends a planner daemon once it has had no worker for a whole pass (`EVERY_S`: Spark has
closed them, nothing is in flight on it, Spark keeps nothing it would ask that daemon about, and it
is not one Spark is still starting) while no statekit query is
being created or is waiting for its first micro-batch, and only in a session whose JVM statekit
started. A step that needs the daemon again (the next query's start) finds its port closed, which
Spark reads as a daemon that quit ("Failed to open socket to Python daemon ... attempting to
restart") and starts a new one: ~0.3 s of CPU. A daemon that still has a worker is never ended:
Spark would ask it to end that worker, and the step that asked would fail.

The reaper's thread runs only while planner daemons are alive (a few seconds every `EVERY_S`), so
an idle app pays nothing for it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref

from statekit import lifeline
from statekit.engine.spark.fork_server import stand_ins
from statekit.engine.spark.procs import children, cmdline

PLANNER_MODULE = "pyspark.sql.worker."
EVERY_S = 5.0


def planner_daemons(jvm_pid: int) -> dict:
    """{pid: step} of the planner daemons the JVM `jvm_pid` started."""
    found = {}
    for pid in children(jvm_pid):
        args = cmdline(pid).split()
        if "pyspark.daemon" in args:
            step = next((a for a in args if a.startswith(PLANNER_MODULE)), None)
            if step is not None:
                found[pid] = step[len(PLANNER_MODULE):]
    return found


def end_idle_planners(jvm_pid: int, seen_idle: set | None = None,
                      fork_server: str | None = None) -> list:
    """End the planner daemons of `jvm_pid` that have no worker and had none when the previous
    pass looked (``seen_idle``: that pass's idle daemons, updated in place; None: end every idle
    one). A daemon Spark is starting has no worker either, until it has written its port: ended
    then, the step that started it fails ("EOFException ... reading the port number"), whereas a
    daemon idle across two passes is one Spark is done with. Returns the steps ended. The caller
    makes sure no statekit planner step starts meanwhile (see the module docstring). A daemon the
    fork server runs (``fork_server``: its socket) has its workers below its child, not below the
    stand-in the JVM started (engine.spark.fork_server)."""
    ended, idle_now, real = [], set(), stand_ins(fork_server)
    for pid, step in planner_daemons(jvm_pid).items():
        if children(real.get(pid, pid)):
            continue
        me = (pid, lifeline.start_time(pid))   # (a reused pid is another daemon)
        if seen_idle is not None and me not in seen_idle:
            idle_now.add(me)
            continue
        try:
            os.kill(pid, signal.SIGTERM)   # pyspark's daemon exits on SIGTERM (and ends its group)
            ended.append(step)
        except ProcessLookupError:
            pass
    if seen_idle is not None:
        seen_idle.clear()
        seen_idle.update(idle_now)
    return ended


def _ran(progress) -> bool:
    """A progress of a micro-batch that ran (not of a trigger that found no data)."""
    if progress is None:
        return False
    d = progress.get("durationMs") if isinstance(progress, dict) else getattr(progress, "durationMs", None)
    return "addBatch" in (d or {})


class _Reaper:
    def __init__(self):
        self._lock = threading.Lock()
        self._jvm: int | None = None
        self._fork_server: str | None = None   # the socket of the session's fork server
        self._busy = 0
        self._queries: weakref.WeakSet = weakref.WeakSet()
        self._thread: threading.Thread | None = None
        self._kicked = False
        self._wake = threading.Event()
        self.ended: list = []          # the steps whose daemons were ended, oldest first
        self._seen_idle: set = set()   # (pid, start time) of the daemons idle at the last pass

    def own(self, jvm_pid: int | None, fork_server: str | None = None) -> None:
        """The JVM statekit started for its session (None: none, or it stopped), and the socket of
        the fork server its Python processes start from (engine.spark.fork_server), if any."""
        with self._lock:
            self._jvm, self._fork_server = jvm_pid, fork_server
            self._queries = weakref.WeakSet()
        self._wake.set()

    @contextlib.contextmanager
    def busy(self):
        """Around creating a query's DataFrame or starting it: planner steps run in there."""
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1

    def watch(self, query) -> None:
        """A query started in statekit's session (a py4j StreamingQuery): its first micro-batch
        still runs a planner step; the daemons are ended once it has had one."""
        with self._lock:
            if self._jvm is None:
                return
            self._queries.add(query)
            self._kicked = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="statekit-planner-reaper",
                                                daemon=True)
                self._thread.start()

    def starting(self) -> bool:
        """A statekit query is being created or started, or waits for its first micro-batch."""
        with self._lock:
            return bool(self._busy) or self._waiting_for_first_batch()

    def _waiting_for_first_batch(self) -> bool:
        """Some watched query is active and has not run a micro-batch yet (a trigger that found
        no data also reports progress, without ``addBatch``)."""
        for q in list(self._queries):
            try:
                if q.isActive and not _ran(q.lastProgress) and not any(
                        _ran(p) for p in q.recentProgress):
                    return True
            except Exception:  # noqa: BLE001 - the JVM went away: nothing to wait for
                continue
            self._queries.discard(q)          # planned (or stopped): never asked again
        return False

    def _run(self) -> None:
        while True:
            self._wake.wait(EVERY_S)
            self._wake.clear()
            with self._lock:
                jvm, busy = self._jvm, self._busy
                self._kicked = False
            if jvm is None or not planner_daemons(jvm):
                with self._lock:
                    if not self._kicked:      # nothing left to end: back when a query starts
                        self._thread = None
                        return
                continue
            if busy:
                continue
            with self._lock:        # no query is created, started or watched meanwhile
                if self._busy or self._jvm != jvm or self._waiting_for_first_batch():
                    self._seen_idle.clear()
                    continue
                self.ended.extend(end_idle_planners(jvm, self._seen_idle, self._fork_server))


REAPER = _Reaper()
