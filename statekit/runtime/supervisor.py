"""Instance processes: start them, and stop or kill them for real.

An instance is ``python -m statekit.worker.instance`` run as a child of the App's process, with its
own state directory. ``spawn`` returns once it listens (its ``control/instances/<i>.json`` names the
incarnation we started); ``kill`` is a SIGKILL, nothing else: what the instance had in memory is
gone, as after a real crash.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

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


def launch(control: ControlDir, instance: int, incarnation: int, state_dir: str) -> InstanceProcess:
    """Start the process (do not wait for it)."""
    try:
        os.unlink(control.instance_file(instance))
    except FileNotFoundError:
        pass
    env = dict(os.environ)
    root = _project_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log_path = os.path.join(control.path, "instances", f"{int(instance)}.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "statekit.worker.instance", "--control", control.path,
             "--instance", str(int(instance)), "--incarnation", str(int(incarnation)),
             "--state-dir", state_dir],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True)
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
