"""Run a test's process in a process group of its own, so that nothing it started outlives it."""
from __future__ import annotations

import os
import signal
import subprocess


def run_alone(cmd: list, timeout: float, env: dict, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
              brokers=()) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a process group of its own; past ``timeout`` the whole group is killed, and
    the embedded brokers under ``brokers`` (their own sessions) are stopped either way."""
    from statekit import broker as broker_mod

    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err = (err or "") + f"\n(killed after {timeout:.0f} s)"
    finally:
        for d in brokers:
            broker_mod.stop(d)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
