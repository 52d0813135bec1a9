"""Every notebook of the tour runs top to bottom in a real Jupyter kernel (nbclient), prints OK in
its reference-check cell(s) and shows no error output (no traceback, no red %statekit line), within
the tour's budget of 3 minutes per notebook (STATEKIT_NOTEBOOK_BUDGET seconds to change it on a
slow or shared machine). The notebooks that build workshop-scale state (02, 05, 10) run here with
fewer users (STATEKIT_TOUR_KEYS, default 20,000): the same cells, a smaller store; `make demo` runs
them at full size."""
from __future__ import annotations

import os

import pytest

from statekit.demo import notebook_paths, run_notebook

PATHS = notebook_paths()
BUDGET = float(os.environ.get("STATEKIT_NOTEBOOK_BUDGET", "180"))


# 09 runs Spark's own state store engine too: also part of `make test-native`
_NATIVE = ("09_",)
CASES = [pytest.param(p, id=os.path.basename(p).split(".")[0],
                      marks=[pytest.mark.native] if os.path.basename(p).startswith(_NATIVE) else [])
         for p in PATHS]


@pytest.mark.parametrize("path", CASES)
def test_notebook_runs_and_checks_hold(path, tmp_path, monkeypatch):
    monkeypatch.setenv("STATEKIT_TOUR_KEYS", os.environ.get("STATEKIT_TOUR_KEYS", "20000"))
    r = run_notebook(path, out_dir=str(tmp_path / "build"), timeout=240, home=str(tmp_path / "home"))
    assert not r.errors, f"{r.name}: " + " | ".join(r.errors)
    assert r.ok_checks >= 1, f"{r.name}: the reference check did not print OK"
    assert r.seconds < BUDGET, f"{r.name} took {r.seconds:.0f} s (budget {BUDGET:.0f} s)"


def test_ctrl_c_stops_the_runner_and_everything_it_started(tmp_path):
    """Ctrl-C during `make demo` / `make test`: nbclient's handler shuts the kernel down and fails
    the cell; the runner must then stop (KeyboardInterrupt), not go on to the next notebook, and the
    broker the notebook started must be gone."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from statekit.broker.process import pid_alive

    home = tmp_path / "home"
    code = ("import sys; from statekit.demo import run_notebook; "
            f"run_notebook({PATHS[0]!r}, timeout=120, home={str(home)!r}); print('RETURNED')")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    info = home / "broker" / "broker.json"
    try:
        deadline = time.monotonic() + 90
        while not info.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert info.exists(), "the notebook did not start its broker"
        broker_pid = int(json.loads(info.read_text())["pid"])
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0 and "RETURNED" not in out
    assert err.rstrip().splitlines()[-1] == "KeyboardInterrupt", err[-500:]
    deadline = time.monotonic() + 15
    while pid_alive(broker_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pid_alive(broker_pid)
