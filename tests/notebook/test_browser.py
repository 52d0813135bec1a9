"""The tour in JupyterLab, in headless Chromium, as a new user sees it: 1366×900 with the file browser
open. Notebook 01 runs top to bottom with a live dashboard; notebook 02's Restoration panel is right
while the disk-loss restore runs (every restoring task with a bar below 100% and an ETA) and after it
(each task "done"); notebook 05's failover shows on the dashboard while a CPU hog keeps both cores
busy; notebook 10's input rate stays up through a kill, the ownership timeline shows the move, and
its chart is drawn; notebook 11 runs with its live dashboard and its chart; a failing lambda shows its
one-line reason in the notebook — above the dashboard when the dashboard's cell is the last one run —
and on the badge. What the learner reads is checked too: no two messages on one line, no line twice
in a cell, no state word left to go stale. No table cell of the dashboard is clipped and no panel
overlaps another (measured in the page). Screenshots land in build/browser/ (see
tests/notebook/_lab.py for the harness). The tests of 05, 11 and the notice above the dashboard are
also marked slow: `make test-browser` runs them, `make test` (20 minutes) does not."""
from __future__ import annotations

import contextlib
import re
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

import _lab

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _needs_chromium():
    reason = _lab.skip_reason()
    if reason:
        pytest.skip(reason)


HEAD_JS = ("() => { const d = document.querySelector('.statekit-dashboard .sk-head');"
           " return d ? d.textContent : null; }")

# The rows of the Restoration panel: task, source, bar width (%), ETA text, status text.
RESTORE_ROWS_JS = """
() => {
  const panels = Array.from(document.querySelectorAll('.statekit-dashboard .sk-dash'))
    .filter(p => { const h = p.querySelector('.sk-h'); return h && h.textContent.startsWith('Restoration'); });
  if (!panels.length) return null;
  const p = panels[panels.length - 1];
  const rows = Array.from(p.querySelectorAll('table.sk tbody tr')).map(tr => {
    const td = Array.from(tr.children);
    const bar = tr.querySelector('.sk-bar > div');
    return {task: td[0].textContent, source: td[2].textContent,
            width: bar ? parseFloat(bar.style.width) : null,
            eta: td[6].textContent, status: td[td.length - 1].textContent.trim()};
  });
  const sum = p.querySelector('.sk-sum');
  return {rows: rows, summary: sum ? sum.textContent : null};
}
"""


def _no_clipping(page, where: str) -> None:
    clipped = page.evaluate(_lab.CLIPPED_JS, None)
    assert not clipped, f"{where}: clipped table cells: {clipped[:5]}"
    overlaps = page.evaluate(_lab.OVERLAP_JS)
    assert not overlaps, f"{where}: overlapping panels: {overlaps}"


def _errors(page) -> list[str]:
    return [t for t in _lab.stderr_lines(page) if "%statekit" in t or "Traceback" in t or "Error" in t]


def test_notebook_01_in_jupyterlab(tmp_path):
    with _lab.jupyterlab(tmp_path, ["01_quickstart.ipynb"]) as lab, _lab.browser_page() as page:
        _lab.open_notebook(page, lab, "01_quickstart.ipynb")
        _lab.run_all(page)
        seen = []  # distinct dashboard headers while the notebook runs: it refreshes live

        def poll():
            head = page.evaluate(HEAD_JS)
            if head and (not seen or seen[-1] != head):
                seen.append(head)

        # the last cell (`%statekit down`) prints "stopped:": the whole notebook ran
        _lab.wait_for_output(page, "stopped: ", timeout=300, poll=poll)
        assert len(seen) >= 2, f"the dashboard never refreshed in the browser: {seen}"
        assert not _errors(page), _errors(page)[:3]
        assert any(o.strip().endswith("OK") or "\nOK" in o for o in _lab.outputs_text(page))
        dash = page.locator(".statekit-dashboard").first
        dash.scroll_into_view_if_needed()
        head = dash.locator(".sk-head").first.text_content()
        m = re.search(r"([\d,]+)store rows", head or "")
        assert m and int(m.group(1).replace(",", "")) > 0, f"no store rows in the dashboard header: {head!r}"
        tasks = page.evaluate("() => Array.from(document.querySelectorAll('.statekit-dashboard table.sk'))"
                              ".map(t => t.textContent).filter(t => t.includes('changelog end'))")
        assert tasks and "counts" in tasks[0] and "active" in tasks[0], tasks
        _no_clipping(page, "notebook 01")
        _lab.screenshot(page, "nb01-dashboard.png", dash)
        _lab.screenshot(page, "nb01-notebook.png")


FORECAST_LINE = re.compile(r"if instance (\d+) died now: ≈ ([\d.]+) (m?s) from scratch for ([\d_, ]+) \(([\d,]+) records\)")
SAID = re.compile(r"the restore replayed ([\d,]+) changelog records in ([\d.]+) s; the forecast before the crash "
                  r"said ≈ ([\d.]+) s")


def _secs(v: str, unit: str) -> float:
    return float(v) / (1000 if unit == "ms" else 1)


def _run_02(tmp_path, keys: int, busy: bool):
    """Notebook 02 in JupyterLab: the Restoration panel while the disk-loss restore runs (every
    restoring task with a bar below 100% and an ETA) and after it (each task "done"); every number
    the dashboard shows twice, read from the page whenever it holds still, agrees with its other
    place (header against the Tasks tab, the Instances panel, the Restoration panel); the forecast
    the cell printed is the one the Restoration panel shows beside the restore, and the records
    the cell says were replayed are the panel's. Returns (forecast s, measured s)."""
    hog = _lab.cpu_hog(2) if busy else contextlib.nullcontext()
    with _lab.jupyterlab(tmp_path, ["02_crash_and_restore.ipynb"], {"STATEKIT_TOUR_KEYS": str(keys)}) \
            as lab, _lab.browser_page() as page, hog:
        _lab.open_notebook(page, lab, "02_crash_and_restore.ipynb")
        _lab.run_all(page)
        agree = _lab.Agreement(page)
        _lab.wait_for_output(page, "after the process crash", timeout=600, poll=agree.check)
        restoring = []     # every restoring row seen in the scratch round
        shot = {}
        seen = []          # what the panel showed, for the failure message

        def poll():
            panel = page.evaluate(RESTORE_ROWS_JS)
            rows = (panel or {}).get("rows") or []
            states = [(r["task"], r["source"], r["status"]) for r in rows]
            if not seen or seen[-1] != states:
                seen.append(states)
            live = [r for r in rows if r["source"] == "scratch" and r["status"] == "restoring"]
            restoring.extend(live)
            if live and "during" not in shot:
                # (beside the hogs, no picture: a screenshot costs the browser a good part of the
                # second-long restore whose time the forecast is compared with)
                shot["during"] = None if busy else _lab.screenshot(
                    page, "nb02-restoring.png", page.locator(".statekit-dashboard").first)
                _no_clipping(page, "notebook 02 during the restore")

        deadline = time.monotonic() + 600
        js = ("() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
              ".some(e => e.textContent.includes('after the disk loss'))")
        while not page.evaluate(js):
            poll()
            assert time.monotonic() < deadline, "the disk-loss restore did not finish"
            time.sleep(0.2)
        assert restoring, f"no restoring task was ever shown while the restore from scratch ran: {seen}"
        for r in restoring:
            assert r["width"] is not None and r["width"] < 100, r
            assert r["eta"] not in ("", "–"), r
        deadline = time.monotonic() + 15   # the dashboard refreshes once a second
        panel = page.evaluate(RESTORE_ROWS_JS)
        while not (panel["summary"] and all(r["status"] == "done" for r in panel["rows"])) \
                and time.monotonic() < deadline:
            time.sleep(0.3)
            panel = page.evaluate(RESTORE_ROWS_JS)
        tasks = sorted(r["task"] for r in panel["rows"])
        assert tasks == ["0_0", "0_1", "0_2", "0_3"], panel
        for r in panel["rows"]:
            assert (r["status"], r["source"], r["width"]) == ("done", "scratch", 100.0), r
            assert r["eta"].startswith("took "), r
        assert panel["summary"] and "restored 4 task(s)" in panel["summary"], panel
        _lab.wait_for_output(page, "the forecast before the crash said", timeout=120, poll=agree.check)
        # the forecast a cell printed, and the restore's records, are the dashboard's
        outs = _lab.cell_streams(page)      # what the cells printed (not the dashboard's own panels)
        printed = [m for o in outs for m in FORECAST_LINE.finditer(o)]
        assert len(printed) == 1, printed
        fc_inst, fc_s, fc_unit, fc_tasks, fc_records = printed[0].groups()
        said = [m for o in outs for m in SAID.finditer(o)]
        assert len(said) == 1, [o for o in outs if "replayed" in o]
        replayed, measured, said_s = said[0].groups()
        r = agree.check() or _lab.read_dashboard(page)   # a still moment: its panels compared too
        assert r is not None, "the dashboard never held still after the restore"
        summary = r["restore"]["summary"]
        assert f": {replayed} records" in summary, (replayed, summary)
        before = re.search(r"forecast before: ≈ ([\d.]+) (m?s) of replay", summary)
        assert before and abs(_secs(*before.groups()) - float(said_s)) <= 0.051, (said_s, summary)
        fcol = r["restore"]["heads"].index("forecast")
        per_task = [re.match(r"≈ ([\d.]+) (m?s)", row["cells"][fcol]) for row in r["restore"]["rows"]]
        assert all(per_task), r["restore"]["rows"]
        assert abs(sum(_secs(*m.groups()) for m in per_task) - _secs(fc_s, fc_unit)) <= 0.05 * 5, \
            (fc_s, [row["cells"][fcol] for row in r["restore"]["rows"]])
        agree.check()
        _lab.wait_for_output(page, "stopped: ", timeout=300, poll=agree.check)
        # and once more as the stopped app's dashboard is left on the page (beside two hogs the
        # whole notebook can run with only two still moments before it)
        agree.check()
        assert agree.reads >= 3, f"the dashboard held still only {agree.reads} time(s)"
        assert not agree.problems, agree.problems[:8]
        assert not _errors(page), _errors(page)[:3]
        assert not _lab.learner_text_problems(page, "bank"), _lab.learner_text_problems(page, "bank")
        said_crash = [t for t in _lab.cell_streams(page) if "crashed as asked" in t]
        assert len(said_crash) == 1 and said_crash[0].count("crashed as asked") == 1, said_crash
        dash = page.locator(".statekit-dashboard").first
        dash.scroll_into_view_if_needed()
        _no_clipping(page, "notebook 02 after the restore")
        _lab.screenshot(page, f"nb02{'-busy' if busy else ''}-restored.png", dash)
        _lab.screenshot(page, f"nb02{'-busy' if busy else ''}-notebook.png")
        return float(said_s), float(measured)


def test_notebook_02_restoration_panel_while_a_restore_from_scratch_runs(tmp_path):
    # 1.6 million accounts (the tour has 2.5 million): a restore of about three seconds, several
    # dashboard refreshes while tasks restore (at a million, one run saw none), and the test suite
    # keeps its time
    _run_02(tmp_path, 1_600_000, busy=False)


@pytest.mark.slow   # make test-browser
@pytest.mark.timeout(1500)   # the whole notebook beside two hogs: three times its quiet time
def test_notebook_02_with_both_cores_busy_agrees_with_itself_and_its_forecast_holds(tmp_path):
    """The same beside two CPU hogs (a shared workshop server): the panels still agree, and the
    forecast the cell printed before the crash is within 1.5x of the restore that followed.
    1,000,000 accounts: a restore of about two seconds under the hogs, not of minutes. At 400,000
    it had become a restore of 0.6 to 0.9 s as restores got faster, where the cell's figures,
    printed to 0.1 s, moved the ratio by up to 15% by their rounding alone, and where the fixed
    costs of a restart (the restoring process's first task, Spark's query started again, the
    dashboard drawing the restore) weighed most. Forecast / measured, from the cell's figures:
    0.67 to 1.00 over 8 runs at 400,000, 0.78 to 1.05 over 12 at 1,000,000."""
    forecast, measured = _run_02(tmp_path, 1_000_000, busy=True)
    assert 1 / 1.5 <= forecast / measured <= 1.5, (
        f"the forecast said {forecast} s, the restore took {measured} s ({forecast / measured:.2f}x)")


def _notebook(path, cells) -> None:
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, str(path))


def test_a_failing_lambda_shows_its_one_line_reason_in_the_notebook_and_on_the_badge(tmp_path):
    nb = tmp_path / "failing_lambda.ipynb"
    _notebook(nb, [
        "%load_ext kernel_ext\n%statekit up --fresh",
        "%statekit produce nums --generator words --limit 200 --partitions 2 --wait",
        "%%statekit app bad --partitions 2\n"
        "(app.stream('nums', value_serde='json').map_values(lambda v: 1 / 0)\n"
        "    .group_by_key().count(store='c'))",
        "%statekit start bad --watch",
        "app.wait_for_state(['ERROR'], timeout=180)\nimport time; time.sleep(3)\nprint('FAILED' + ' AS EXPECTED')",
    ])
    with _lab.jupyterlab(tmp_path, [str(nb)]) as lab, _lab.browser_page() as page:
        _lab.open_notebook(page, lab, nb.name)
        _lab.run_all(page)
        _lab.wait_for_output(page, "FAILED AS EXPECTED", timeout=300)
        time.sleep(1.5)
        lines = [t for t in _lab.stderr_lines(page) if "app bad failed" in t]
        assert len(lines) == 1, _lab.stderr_lines(page)
        assert "ZeroDivisionError: division by zero" in lines[0] and "\n" not in lines[0].strip()
        badge = page.locator(".statekit-dashboard .sk-badge").first.text_content()
        reason = page.locator(".statekit-dashboard .sk-reason").first.text_content()
        err = page.locator(".statekit-dashboard .sk-err").first.text_content()
        assert badge == "ERROR"
        assert "ZeroDivisionError: division by zero" in reason and "ZeroDivisionError" in err
        dash = page.locator(".statekit-dashboard").first
        dash.scroll_into_view_if_needed()
        _no_clipping(page, "the failed app's dashboard")
        _lab.screenshot(page, "failing-lambda.png")


NOTICE_JS = """
() => {
  const d = document.querySelector('.statekit-dashboard');
  const lines = Array.from(document.querySelectorAll('.statekit-notice, .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
    .filter(e => e.textContent.includes('app bad failed'))
    .map(e => ({text: e.textContent, top: e.getBoundingClientRect().top}));
  return {lines: lines, dashTop: d ? d.getBoundingClientRect().top : null};
}
"""


@pytest.mark.slow   # make test-browser and make test-slow: make test keeps its 20-minute budget
def test_a_failure_while_the_dashboards_cell_is_the_last_one_run_is_said_above_the_dashboard(tmp_path):
    nb = tmp_path / "failing_late.ipynb"
    _notebook(nb, [
        "%load_ext kernel_ext\n%statekit up --fresh",
        "%statekit produce nums --generator words --limit 400 --partitions 2 --wait",
        "%%statekit app late --partitions 2\n"
        "(app.stream('nums', value_serde='json').map_values(lambda v: 1 / (v['seq'] < 300))\n"
        "    .group_by_key().count(store='c'))",
        "%statekit start late --watch --max-records 40",
    ])
    with _lab.jupyterlab(tmp_path, [str(nb)]) as lab, _lab.browser_page() as page:
        _lab.open_notebook(page, lab, nb.name)
        _lab.run_all(page)
        page.wait_for_function("() => { const b = document.querySelector('.statekit-dashboard .sk-badge');"
                               " return b && b.textContent === 'ERROR'; }", timeout=300_000)
        page.wait_for_function("() => Array.from(document.querySelectorAll('.statekit-notice,"
                               " .jp-OutputArea-output[data-mime-type=\"application/vnd.jupyter.stderr\"]'))"
                               ".some(e => e.textContent.includes('app late failed'))", timeout=30_000)
        time.sleep(1.5)   # nothing more comes
        got = page.evaluate(NOTICE_JS.replace("app bad failed", "app late failed"))
        assert len(got["lines"]) == 1, got
        (line,) = got["lines"]
        assert "ZeroDivisionError" in line["text"] and line["top"] < got["dashTop"], got
        _lab.screenshot(page, "failing-lambda-above-dashboard.png",
                        page.locator(".jp-Cell").filter(has_text="start late").first)


@pytest.mark.slow   # make test-browser and make test-slow: make test keeps its 20-minute budget
def test_notebook_05_failover_shows_on_the_dashboard_while_a_cpu_hog_keeps_both_cores_busy(tmp_path):
    with _lab.jupyterlab(tmp_path, ["05_standby_replicas.ipynb"], {"STATEKIT_TOUR_KEYS": "50000"}) as lab, \
            _lab.browser_page() as page:
        _lab.open_notebook(page, lab, "05_standby_replicas.ipynb")
        _lab.run_all(page)
        agree = _lab.Agreement(page)
        _lab.wait_for_output(page, "waiting until every standby has replayed", timeout=400, poll=agree.check)
        with _lab.cpu_hog(2):
            _lab.wait_for_output(page, "pages: instance 0 crashed and lost its disk", timeout=300,
                                 poll=agree.check)
            crashed = [o for o in _lab.outputs_text(page) if "instance 0 crashed and lost its disk" in o][0]
            moved = re.findall(r"(\d+_\d+) 0→(\d+)", crashed)
            assert moved, crashed
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.statekit-dashboard .sk-moves'))"
                ".some(e => e.textContent.includes('its instance died'))", timeout=60_000)
            caption = page.locator(".statekit-dashboard .sk-moves").first.text_content()
            for task, to in moved:
                assert f"{task} 0→{to} (its instance died)" in caption, caption
            dash = page.locator(".statekit-dashboard").first
            _lab.screenshot(page, "nb05-failover-cpu-hog.png", dash)
            _no_clipping(page, "notebook 05 after the crash, CPU hog running")
            # the promotions, as the panels show them beside the hogs: every number shown twice agrees
            _lab.wait_for_output(page, "was promoted", timeout=300, poll=agree.check)
            for _ in range(3):
                agree.check()
        _lab.wait_for_output(page, "stopped: ", timeout=400, poll=agree.check)
        assert agree.reads >= 3, f"the dashboard held still only {agree.reads} time(s)"
        assert not agree.problems, agree.problems[:8]
        assert not _errors(page), _errors(page)[:3]
        assert not _lab.learner_text_problems(page, "pages"), _lab.learner_text_problems(page, "pages")
        assert any("the failover lost nothing" in o for o in _lab.outputs_text(page))
        dash.scroll_into_view_if_needed()
        _lab.screenshot(page, "nb05-end.png", dash)


@pytest.mark.slow   # make test-browser and make test-slow: make test keeps its 20-minute budget
def test_notebook_11_runs_with_its_live_dashboard_and_draws_every_page_per_minute(tmp_path):
    with _lab.jupyterlab(tmp_path, ["11_joins_sessions_final_results.ipynb"]) as lab, _lab.browser_page() as page:
        _lab.open_notebook(page, lab, "11_joins_sessions_final_results.ipynb")
        _lab.run_all(page)
        seen = []

        def poll():
            head = page.evaluate(HEAD_JS)
            if head and (not seen or seen[-1] != head):
                seen.append(head)

        _lab.wait_for_output(page, "shop: instance 1 will crash", timeout=400, poll=poll)
        _lab.wait_for_output(page, "shop: revived instance 1", timeout=400, poll=poll)
        dash = page.locator(".statekit-dashboard").first
        _lab.screenshot(page, "nb11-dashboard-after-crash.png", dash)
        restoration = dash.locator(".sk-dash").filter(has_text="Restoration").first
        _lab.screenshot(page, "nb11-restoration-after-crash.png", restoration)
        _no_clipping(page, "notebook 11 after the crash")
        _lab.wait_for_output(page, "each bar is the clicks of all pages", timeout=400, poll=poll)
        assert len(seen) >= 2, f"the dashboard never refreshed in the browser: {seen}"
        chart = page.locator(".jp-Cell").filter(has_text="clicks per minute (final results, all pages)").first
        assert chart.locator("img").count() >= 1, "no chart drawn"
        _lab.screenshot(page, "nb11-chart.png", chart.locator("img").first)
        _lab.wait_for_output(page, "stopped: ", timeout=200)
        assert not _errors(page), _errors(page)[:3]
        assert not _lab.learner_text_problems(page, "shop"), _lab.learner_text_problems(page, "shop")


def test_notebook_10_input_rate_stays_up_through_a_kill_and_the_timeline_shows_the_move(tmp_path):
    # the story here is the flow through a kill, not the size of the stores: fewer accounts
    with _lab.jupyterlab(tmp_path, ["10_rebalancing.ipynb"], {"STATEKIT_TOUR_KEYS": "50000"}) as lab, \
            _lab.browser_page() as page:
        _lab.open_notebook(page, lab, "10_rebalancing.ipynb")
        _lab.run_all(page)
        _lab.wait_for_output(page, "rb: instance 1 killed", timeout=400)
        killed = [o for o in _lab.outputs_text(page) if "rb: instance 1 killed" in o][0]
        moved = re.findall(r"(\d+_\d+) 1→(\d+)", killed)
        assert moved, killed
        rates = []
        t_end = time.monotonic() + 8
        while time.monotonic() < t_end:
            head = page.evaluate(HEAD_JS) or ""
            m = re.search(r"([\d,]+) rec/scommitted", head)
            rates.append(int(m.group(1).replace(",", "")) if m else None)
            time.sleep(0.5)
        assert rates and all(r is not None and r > 0 for r in rates), rates
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.statekit-dashboard .sk-moves'))"
            ".some(e => e.textContent.includes('its instance died'))", timeout=30_000)
        caption = page.locator(".statekit-dashboard .sk-moves").first.text_content()
        for task, to in moved:
            assert f"{task} 1→{to} (its instance died)" in caption, caption
        dash = page.locator(".statekit-dashboard").first
        _lab.screenshot(page, "nb10-after-kill.png", dash)
        _no_clipping(page, "notebook 10 after the kill")
        _lab.wait_for_output(page, "since the kill, instances 0 and 2 committed", timeout=200)
        chart = page.locator(".jp-Cell").filter(has_text="letting the two survivors work").first
        assert chart.locator("img").count() >= 1, "no chart of the commits around the kill"
        _lab.screenshot(page, "nb10-commits-chart.png", chart.locator("img").first)
        _lab.wait_for_output(page, "stopped: ", timeout=400)
        assert not _errors(page), _errors(page)[:3]
        assert not _lab.learner_text_problems(page, "rb"), _lab.learner_text_problems(page, "rb")
        dash.scroll_into_view_if_needed()
        _lab.screenshot(page, "nb10-end.png", dash)


@pytest.mark.cluster   # a standalone cluster of three workers: make test-browser-cluster
def test_notebook_13_on_a_cluster_every_number_shown_twice_agrees(tmp_path):
    """Notebook 13 in JupyterLab: the word count on a standalone cluster, one executor killed. The
    dashboard's panels agree with each other whenever it holds still (the header's instances,
    generation, rates and totals against the Instances panel, the chips, the Tasks tab and the
    Restoration panel); the start line names Spark's executors, not "1 instance"; after the kill
    the moved tasks are not left queued, the generation moves with them, and promoted rows are not
    red under a green summary."""
    with _lab.jupyterlab(tmp_path, ["13_cluster.ipynb"]) as lab, _lab.browser_page() as page:
        _lab.open_notebook(page, lab, "13_cluster.ipynb")
        _lab.run_all(page)
        agree = _lab.Agreement(page)
        _lab.wait_for_output(page, "wordcount: started", timeout=900, poll=agree.check)
        started = [o for o in _lab.outputs_text(page) if "wordcount: started" in o][0]
        assert "tasks on Spark's executors" in started and "on 1 instance" not in started, started
        _lab.wait_for_output(page, "killed executor", timeout=600, poll=agree.check)
        generation = None
        _lab.wait_for_output(page, "moved off executor", timeout=900, poll=agree.check)
        r = None
        for _ in range(10):
            r = agree.check()
            if r is not None and r["restore"]["rows"]:
                break
            time.sleep(1)
        assert r is not None and r["restore"]["rows"], "no Restoration round after the kill"
        statuses = [row["cells"][-1] for row in r["restore"]["rows"]]
        assert not any(s.startswith(("queued", "restoring")) for s in statuses), statuses
        generation = int(r["kpis"]["generation"])
        moves = re.search(r"\(generation (\d+),", r["moves"] or "")
        assert moves and generation >= int(moves.group(1)) > 1, (r["kpis"], r["moves"])
        dash = page.locator(".statekit-dashboard").first
        dash.scroll_into_view_if_needed()
        _no_clipping(page, "notebook 13 after the kill")
        _lab.screenshot(page, "nb13-after-kill.png", dash)
        _lab.wait_for_output(page, "stopped: ", timeout=600, poll=agree.check)
        assert agree.reads >= 3, f"the dashboard held still only {agree.reads} time(s)"
        assert not agree.problems, agree.problems[:8]
        assert not _errors(page), _errors(page)[:3]
        _lab.screenshot(page, "nb13-notebook.png")


def test_notebook_16_shows_the_outage_on_the_dashboard(tmp_path):
    """The broker frozen for 10 s, then killed and restarted: the badge says WAITING and what for
    while it lasts, the lag chart gets a band per outage (labelled with its length and what it
    aborted), and the notebook's check (nothing lost, nothing written twice, no restart) prints OK."""
    badge_js = ("() => { const d = document.querySelector('.statekit-dashboard .sk-head');"
                " return d ? d.textContent : ''; }")
    bands_js = ("() => Array.from(document.querySelectorAll('.statekit-dashboard rect.kafka-away'))"
                ".map(r => r.textContent)")
    with _lab.jupyterlab(tmp_path, ["16_when_kafka_goes_away.ipynb"], {"STATEKIT_TOUR_KEYS": "20000"}) \
            as lab, _lab.browser_page() as page:
        _lab.open_notebook(page, lab, "16_when_kafka_goes_away.ipynb")
        _lab.run_all(page)
        waiting = []

        def poll():
            head = page.evaluate(badge_js) or ""
            if "WAITING" in head and "waiting for Kafka at" in head:
                waiting.append(head)

        _lab.wait_for_output(page, "stopped: ", timeout=420, poll=poll)
        assert not _errors(page), _errors(page)[:3]
        assert any(o.strip().endswith("OK") or "\nOK" in o for o in _lab.outputs_text(page))
        assert waiting, "the badge never said WAITING (waiting for Kafka at ...)"
        bands = page.evaluate(bands_js)
        assert len(bands) == 2 and all(b.startswith("Kafka away") for b in bands), bands   # freeze, restart
        assert "aborted" in bands[0], bands        # --mid-transaction caught a commit open
        labels = page.evaluate("() => Array.from(document.querySelectorAll("
                               "'.statekit-dashboard text.kafka-away-label')).map(t => t.textContent)")
        assert bands[0].split(" · ")[1] in labels, labels   # written on the chart, not only in a tooltip
        _no_clipping(page, "notebook 16")
        dash = page.locator(".statekit-dashboard").first
        _lab.screenshot(page, "nb16-dashboard.png", dash)
