"""A learner's mistakes in JupyterLab (headless Chromium, 1366×900, the file browser open): an app
whose lambda raises, fixed in its cell and started again in the same kernel, counts exactly; a
kernel restarted without `%statekit down` leaves no process statekit started (broker, Spark's JVM,
instances, spares: checked by pid) and its dashboard says the app is gone. Screenshots land in
build/browser/ (tests/notebook/_lab.py is the harness)."""
from __future__ import annotations

import json
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

import _lab
from statekit.broker.process import pid_alive

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _needs_chromium():
    reason = _lab.skip_reason()
    if reason:
        pytest.skip(reason)


def _notebook(path, cells) -> None:
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, str(path))


APP = ("%%statekit app totals --partitions 2\n"
       "(app.stream('words', value_serde='json').group_by_key()\n"
       "    .aggregate(lambda: 0, lambda key, value, n: n + {step}, store='totals'))")

CHECK = """
from collections import Counter
from statekit.datagen import generate
expected = Counter(r.key for r in generate("words", seed=1, limit=300))
store = app.query_all("totals") if str(app.state) == "RUNNING" else None
same = store is not None and dict(zip(store["key"], store["value"])) == dict(expected)
print("CHECK " + ("OK" if same else "not yet"))
"""

RUN_FROM_JS = """
(args) => {
  const w = window.jupyterapp.shell.currentWidget;
  const cell = w.content.widgets[args.index];
  if (args.source !== null) cell.model.sharedModel.setSource(args.source);
  w.content.activeCellIndex = args.index;
  window.jupyterapp.commands.execute('notebook:run-all-below');
  return true;
}
"""


def test_a_lambda_that_failed_is_fixed_in_its_cell_and_runs_again_in_the_same_kernel(tmp_path):
    nb = tmp_path / "fix_the_lambda.ipynb"
    _notebook(nb, [
        "%load_ext kernel_ext\n%statekit up --fresh",
        "%statekit produce words --generator words --seed 1 --limit 300 --partitions 2 --wait",
        APP.format(step="1 / 0"),
        "%statekit start totals --watch",
        "%statekit wait totals",
        CHECK,
    ])
    with _lab.jupyterlab(tmp_path, [str(nb)]) as lab, _lab.browser_page() as page:
        _lab.open_notebook(page, lab, nb.name)
        _lab.run_all(page)
        _lab.wait_for_output(page, "CHECK not yet", timeout=400)
        # said by `wait`, or by the kernel's event thread when it noticed first, whose output
        # ipykernel sends on its own flush: a moment after the cells that ran meanwhile (one run
        # of make test-browser read the page before it came)
        _lab.wait_for_output(page, "app totals failed", timeout=30)
        streams = _lab.cell_streams(page)
        assert "caught up" not in streams[4], streams    # `wait` never calls a failed app caught up
        failed = [t for t in _lab.stderr_lines(page) if "app totals failed" in t]
        assert len(failed) == 1 and "ZeroDivisionError" in failed[0], \
            (_lab.stderr_lines(page), streams)
        assert "fix the `%%statekit app totals` cell, run it again, then `%statekit start totals`" in failed[0]
        _lab.screenshot(page, "fix-lambda-failed.png", page.locator(".statekit-dashboard").first)
        # the learner fixes the lambda in its cell and runs it and the cells below again
        page.evaluate(RUN_FROM_JS, {"index": 2, "source": APP.format(step="1")})
        _lab.wait_for_output(page, "CHECK OK", timeout=400)
        streams = _lab.cell_streams(page)
        assert ("(the earlier definition, ERROR, was stopped; its state stays for this one). Next: "
                "%statekit start totals") in streams[2], streams[2]
        assert streams[3].startswith("totals: started: 2 tasks on 1 instance"), streams[3]
        assert "caught up" in streams[4], streams[4]
        assert not [t for t in _lab.stderr_lines(page) if "%statekit" in t or "Traceback" in t], \
            _lab.stderr_lines(page)
        badge = page.locator(".statekit-dashboard .sk-badge").first
        page.wait_for_function("() => document.querySelector('.statekit-dashboard .sk-badge')"
                               ".textContent === 'RUNNING'", timeout=30_000)
        assert page.locator(".statekit-dashboard").count() == 1 and badge.text_content() == "RUNNING"
        dash = page.locator(".statekit-dashboard").first
        dash.scroll_into_view_if_needed()
        _lab.screenshot(page, "fix-lambda-running-again.png", dash)


PIDS = """
import json, time, kernel_ext
from statekit.runtime import supervisor
from statekit.engine.spark_native.engine import jvm_pid
_s = kernel_ext.session()
_t = time.monotonic() + supervisor.REPLACE_WITHIN_S + 10   # the spare taken is replaced once
while not supervisor.spares() and time.monotonic() < _t:     # the machine is quiet
    time.sleep(0.5)
print("PIDS " + json.dumps({"broker": _s.broker.pid, "registry": _s.registry.pid, "jvm": jvm_pid(),
                            "instances": [int(p) for p in app.instances_frame()["pid"] if p],
                            "spares": [sp.pid for sp in supervisor.SPARES._spares if sp.poll() is None]}))
"""

# what the dashboard's header shows once JupyterLab has marked its widgets disconnected
GONE_JS = """
() => {
  const t = document.querySelector('.statekit-dashboard .sk-title');
  const b = document.querySelector('.statekit-dashboard .sk-badge');
  const gone = t ? getComputedStyle(t, '::after').content : 'none';
  return gone && gone !== 'none' ? {gone: gone, badge: getComputedStyle(b).display} : null;
}
"""

RESTART_JS = """
async () => {
  const ctx = window.jupyterapp.shell.currentWidget.sessionContext;
  await ctx.session.kernel.restart();
  return true;
}
"""


def test_a_kernel_restarted_without_down_leaves_no_statekit_process_and_its_dashboard_says_so(tmp_path):
    nb = tmp_path / "restart_me.ipynb"
    _notebook(nb, [
        "%load_ext kernel_ext\n%statekit up --fresh",
        "%statekit produce words --generator words --seed 1 --limit 300 --partitions 2 --wait",
        "%%statekit app counts --partitions 2 --instances 2\n"
        "app.stream('words', value_serde='json').group_by_key().count(store='c')",
        "%statekit start counts --watch",
        "%statekit wait counts",
        PIDS,
    ])
    with _lab.jupyterlab(tmp_path, [str(nb)]) as lab, _lab.browser_page() as page:
        _lab.open_notebook(page, lab, nb.name)
        _lab.run_all(page)
        _lab.wait_for_output(page, "PIDS ", timeout=400)
        line = next(o for o in _lab.outputs_text(page) if "PIDS " in o)
        pids = json.loads(line.split("PIDS ", 1)[1].strip())
        everything = [pids["broker"], pids["registry"], pids["jvm"], *pids["instances"], *pids["spares"]]
        assert len(pids["instances"]) == 2 and pids["spares"] and pids["jvm"], pids
        assert all(pid_alive(p) for p in everything), pids
        page.evaluate(RESTART_JS)   # what Kernel → Restart Kernel does, without its dialog
        deadline = time.monotonic() + 60
        while [p for p in everything if pid_alive(p)]:
            assert time.monotonic() < deadline, f"still running after the restart: " \
                f"{[p for p in everything if pid_alive(p)]} of {pids}"
            time.sleep(0.2)
        dash = page.locator(".statekit-dashboard").first
        dash.scroll_into_view_if_needed()
        shown = page.wait_for_function(GONE_JS, timeout=30_000).json_value()
        assert shown["gone"].startswith('"GONE — the kernel restarted or stopped: app counts and its '
                                        'processes ended with it'), shown
        assert shown["badge"] == "none", shown   # no RUNNING badge on an app that is gone
        _lab.screenshot(page, "kernel-restarted-dashboard-gone.png", dash)
