"""The machine's load a restore forecast divides by: sampled by a process in a session of its own,
for a while after each question, gone when the asker is."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from statekit.broker.process import pid_alive
from statekit.state import machine_load as M


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def test_beside_busy_sessions_the_load_is_theirs_and_the_sampler_stops_when_asked(monkeypatch):
    """Beside twice as many spinning processes as CPUs, each in a session of its own as other
    notebooks' kernels are, the sampler's session gets about 1/(2 * CPUs + 1) of the machine: a
    CPU-second takes about 2.5 wall seconds on two CPUs. Quiet, about 1."""
    monkeypatch.setattr(M, "WINDOW_S", 2.0)
    sampler = M.LoadSampler()
    assert sampler.current() is None and sampler.pid() is None   # a look starts nothing
    quiet = sampler.load()
    assert quiet is not None and quiet >= 1.0 and sampler.current() is not None
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(M.WINDOW_S + 0.5)          # the quiet samples leave the window
        assert sampler.load() >= 1.8
    finally:
        for h in hogs:
            h.kill()
            h.wait(5)
        pid = sampler.pid()
        sampler.stop()
    assert pid is not None and _gone_within(pid, 2) and sampler.pid() is None


def test_the_sampler_stops_a_while_after_the_last_question(monkeypatch):
    monkeypatch.setattr(M, "SAMPLE_FOR_S", 1.0)
    sampler = M.LoadSampler()
    sampler.start()
    pid = sampler.pid()
    assert pid is not None and _gone_within(pid, 4)
    assert sampler.pid() is None
    sampler.start()                              # asked again: sampling again
    again = sampler.pid()
    sampler.stop()
    assert again not in (None, pid) and _gone_within(again, 2)


def test_the_sampler_ends_with_the_process_that_asked():
    """Killed outright, the asker leaves no sampler behind: its stdin closes and it exits."""
    code = ("import sys; from statekit.state.machine_load import SAMPLER; SAMPLER.load(); "
            "print(SAMPLER.pid(), flush=True); import os; os._exit(0)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=root)
    pid = int(out.stdout.strip())
    assert _gone_within(pid, 3)
