"""Every notebook of the tour runs top to bottom in a real Jupyter kernel (nbclient), prints OK in
its reference-check cell(s) and shows no error output (no traceback, no red %statekit line), within
the tour's budget of 3 minutes per notebook (STATEKIT_NOTEBOOK_BUDGET seconds to change it on a
slow or shared machine)."""
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
def test_notebook_runs_and_checks_hold(path, tmp_path):
    r = run_notebook(path, out_dir=str(tmp_path / "build"), timeout=240, home=str(tmp_path / "home"))
    assert not r.errors, f"{r.name}: " + " | ".join(r.errors)
    assert r.ok_checks >= 1, f"{r.name}: the reference check did not print OK"
    assert r.seconds < BUDGET, f"{r.name} took {r.seconds:.0f} s (budget {BUDGET:.0f} s)"
