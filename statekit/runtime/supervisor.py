"""Instance processes: start them, and stop or kill them for real.

An instance is ``python -m statekit.worker.instance`` run as a child of the App's process, with its
own state directory. ``launch`` starts one, ``wait_ready`` returns once it listens (its
``control/instances/<i>.json`` names the incarnation we started); ``kill`` is a SIGKILL, nothing
else: what the instance had in memory is gone, as after a real crash.

Most of an instance's start-up is Python importing Kafka, RocksDB and numpy, so the supervisor
keeps one *spare*: a process that has imported all of it and waits to be told which instance to
become. ``launch`` hands the spare its identity when there is one (and starts the next spare a
moment later, once the machine is not busy), so a revived or added instance serves at once;
``warm()`` starts the spare ahead of time. One, never more: a spare costs the memory of an idle
instance (~37 MB PSS here), and the other instances of a start are imported while Spark's JVM
boots, which takes longer.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

from statekit import lifeline
from statekit.contracts import ControlDir
from statekit.errors import StatekitError


class InstanceStartFailed(StatekitError):
    pass


@dataclass
class InstanceProcess:
    instance: int
    incarnation: int
    proc: subprocess.Popen
    port: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_code(self) -> Optional[int]:
        return self.proc.poll()


def _project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _child() -> dict:
    """Popen options of an instance process: the project on its path, and the lifeline that ends
    it with this process (`statekit.lifeline`)."""
    env = dict(os.environ)
    root = _project_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return lifeline.child_options(env)


REPLACE_AFTER_S = 3.0
REPLACE_WITHIN_S = 30.0   # a busy machine defers the replacement, at most this long after the take
BUSY_SHARE = 0.75         # of the machine's CPU time over the last look: busy
MAX_SPARES = 1


def _cpu_times() -> Optional[tuple]:
    """(idle, total) clock ticks of the whole machine since boot (Linux's /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return ticks[3] + ticks[4], sum(ticks)


def _busy_since(mark: Optional[tuple]) -> float:
    """The machine's busy share of CPU time since ``mark`` (0 when unknown)."""
    now = _cpu_times()
    if mark is None or now is None or now[1] <= mark[1]:
        return 0.0
    return 1.0 - (now[0] - mark[0]) / (now[1] - mark[1])


class _Spares:
    """Warm processes waiting for an identity (per App process, shared by every app): at most
    ``MAX_SPARES``, whatever the number of instances an app asks for."""

    def __init__(self):
        self._lock = threading.Lock()
        self._spares: list = []
        self._timer: Optional[threading.Timer] = None
        self.size = MAX_SPARES
        atexit.register(self.close)

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "statekit.worker.instance", "--spare"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, close_fds=True, **_child())

    def warm(self) -> None:
        with self._lock:
            self._spares = [sp for sp in self._spares if sp.poll() is None]
            while len(self._spares) < self.size:
                self._spares.append(self._start())

    def take(self) -> Optional[subprocess.Popen]:
        """A spare, or None when there is none alive. The spare taken is replaced a moment later
        (REPLACE_AFTER_S), and later still while the machine is busy (up to REPLACE_WITHIN_S), so
        that the replacement's imports do not compete with the app that is starting now: on a
        workshop's shared machine, eight kernels' replacements took 6 s of CPU from their first
        numbers."""
        with self._lock:
            live = [sp for sp in self._spares if sp.poll() is None]
            sp = live.pop(0) if live else None
            self._spares = live
            if self._timer is None:
                self._arm(time.monotonic())
        return sp

    def _arm(self, taken_at: float) -> None:
        mark = _cpu_times()
        self._timer = threading.Timer(REPLACE_AFTER_S, self._replace, args=(taken_at, mark))
        self._timer.daemon = True
        self._timer.start()

    def _replace(self, taken_at: float, mark: Optional[tuple]) -> None:
        with self._lock:
            if self._timer is None:          # closed meanwhile
                return
            if (_busy_since(mark) > BUSY_SHARE
                    and time.monotonic() - taken_at + REPLACE_AFTER_S <= REPLACE_WITHIN_S):
                self._arm(taken_at)
                return
            self._timer = None
        self.warm()

    def close(self) -> None:
        with self._lock:
            spares, self._spares = self._spares, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for sp in spares:
            if sp.poll() is None:
                try:
                    sp.stdin.close()    # it reads EOF and exits
                    sp.wait(timeout=5)
                except Exception:  # noqa: BLE001
                    sp.kill()


SPARES = _Spares()


def warm() -> None:
    """Keep a spare instance process ready (one per App process, whatever the apps' sizes)."""
    SPARES.warm()


def close_spares() -> None:
    """End the spare processes and reap them (a process that is about to exit: a spare left
    unreaped stays a zombie child, which ipykernel's shutdown waits on for half a minute)."""
    SPARES.close()


def spares() -> list:
    """The pids of the spare processes alive now."""
    with SPARES._lock:
        return [sp.pid for sp in SPARES._spares if sp.poll() is None]


def launch(control: ControlDir, instance: int, incarnation: int, state_dir: str) -> InstanceProcess:
    """Start the process (do not wait for it): a spare becomes it, else a new process starts."""
    try:
        os.unlink(control.instance_file(instance))
    except FileNotFoundError:
        pass
    log_path = os.path.join(control.path, "instances", f"{int(instance)}.log")
    spare = SPARES.take()
    if spare is not None:
        who = {"control": control.path, "instance": int(instance), "incarnation": int(incarnation),
               "state_dir": state_dir, "log": log_path,
               # settings read from the environment at use (crash plans, Kafka security): as now
               "env": {k: v for k, v in os.environ.items() if k.startswith("STATEKIT_")}}
        try:
            spare.stdin.write((json.dumps(who) + "\n").encode())
            spare.stdin.flush()
            spare.stdin.close()
            return InstanceProcess(int(instance), int(incarnation), spare)
        except OSError:   # the spare died meanwhile: start one the slow way
            pass
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "statekit.worker.instance", "--control", control.path,
             "--instance", str(int(instance)), "--incarnation", str(int(incarnation)),
             "--state-dir", state_dir],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True, **_child())
    return InstanceProcess(int(instance), int(incarnation), proc)


def wait_ready(control: ControlDir, ip: InstanceProcess, timeout: float = 60.0) -> InstanceProcess:
    """Block until the instance listens (its file names our incarnation and pid)."""
    path = control.instance_file(ip.instance)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                info = json.load(f)
            if info.get("pid") == ip.pid and info.get("incarnation") == ip.incarnation:
                ip.port = int(info["port"])
                return ip
        except (FileNotFoundError, ValueError):
            pass
        if not ip.alive():
            raise InstanceStartFailed(f"instance {ip.instance} exited during start (code "
                                      f"{ip.exit_code()}): {_tail(control, ip.instance)}")
        if time.monotonic() > deadline:
            kill(ip)
            raise InstanceStartFailed(f"instance {ip.instance} did not start within {timeout:.0f}s: "
                                      f"{_tail(control, ip.instance)}")
        time.sleep(0.02)


def _tail(control: ControlDir, instance: int) -> str:
    path = os.path.join(control.path, "instances", f"{int(instance)}.log")
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except FileNotFoundError:
        return "no log"
    last = [ln for ln in lines if ln.strip()][-1:] or ["(empty log)"]
    return f"{last[0][:300]} (log: {path})"


def kill(ip: InstanceProcess, timeout: float = 30.0) -> Optional[int]:
    """SIGKILL and reap; returns the exit code."""
    try:
        ip.proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        return ip.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def reap(ip: InstanceProcess, timeout: float = 30.0) -> Optional[int]:
    """Wait for an instance that was asked to stop; SIGKILL it if it does not."""
    try:
        return ip.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return kill(ip)
