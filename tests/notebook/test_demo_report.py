"""`make demo`'s report and how a notebook hands it figures: a restore is printed per task, with the
forecast made before the crash beside it and how far the measurement was from it; the figures come
from the app's own restore summary and forecast through a file, never from output a learner sees;
the exercises run with their reference answers."""
from __future__ import annotations

import json

import nbformat
import pandas as pd
from nbformat.v4 import new_code_cell, new_notebook

from statekit import demo
from statekit.demo import NotebookResult, format_report


def test_the_report_puts_the_forecast_beside_the_measured_restore():
    r = NotebookResult("02_crash_and_restore", "x", seconds=12.5, ok_checks=2)
    r.reports.append({"name": "restore", "restore_seconds": 5.0, "records_replayed": 2_520_008,
                      "forecast_seconds": 4.0,
                      "per_task": [{"task": "0_0", "instance": 0, "source": "scratch",
                                    "seconds": 2.5, "records": 1_260_004, "records/s": 504_001.6,
                                    "forecast s": 2.0, "forecast records/s": 630_002.0,
                                    "forecast load": 1.25}]})
    text = format_report([r])
    assert ("02_crash_and_restore: restore from scratch after a disk loss: 5.0 s of restore work, "
            "2,520,008 changelog records replayed (forecast before the crash: 4.0 s; forecast / "
            "measured = 0.80, within 1.5x)") in text
    assert "restore forecasts within 1.5x of the measured restore: 1/1 (forecast / measured: 0.80)" in text
    assert ("task 0_0 (instance 0, from scratch): 2.50 s, 1,260,004 records, 504,002 records/s; "
            "forecast 2.00 s at 630,002 records/s (load 1.25)") in text
    assert "invariant (store == plain-Python reference after the crashes): OK" in text
    assert "1/1 notebooks passed" in text
    r.reports.append(dict(r.reports[0], restore_seconds=9.0))
    text = format_report([r])
    assert "forecast / measured = 0.44, NOT within 1.5x" in text
    assert "restore forecasts within 1.5x of the measured restore: 1/2 (forecast / measured: 0.80, 0.44)" in text
    del r.reports[1]
    r.reports[0].pop("forecast_seconds")
    assert "forecast before the crash" not in format_report([r])
    r.errors.append("cell 3: AssertionError: 2 keys differ")
    assert "after the crashes): FAILED" in format_report([r])


class _Forecast:
    frame = pd.DataFrame([{"task": "0_0", "source": "scratch", "seconds": 2.0, "apply_rate": 500.0, "load": 2.0},
                          {"task": "0_0", "source": "checkpoint", "seconds": 0.0, "apply_rate": 500.0, "load": 2.0},
                          {"task": "0_1", "source": "scratch", "seconds": 1.0, "apply_rate": 500.0, "load": 2.0}])


class _App:
    def restore_summary(self):
        return pd.DataFrame([
            {"task": "0_0", "instance": 0, "store": "a", "source": "scratch", "records": 600, "seconds": 1.0},
            {"task": "0_0", "instance": 0, "store": "b", "source": "scratch", "records": 400, "seconds": 1.0},
            {"task": "0_1", "instance": 0, "store": "a", "source": "scratch", "records": 0, "seconds": 0.0},
        ])


def test_record_restore_writes_the_apps_figures_to_the_demo_file_and_prints_nothing(tmp_path, monkeypatch, capsys):
    path = tmp_path / "figures.jsonl"
    monkeypatch.delenv(demo.FIGURES_ENV, raising=False)
    demo.record_restore(_App(), _Forecast())          # outside make demo: nothing at all
    assert not path.exists()
    monkeypatch.setenv(demo.FIGURES_ENV, str(path))
    demo.record_restore(_App(), _Forecast())
    assert capsys.readouterr() == ("", "")
    (fig,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert fig == {"name": "restore", "restore_seconds": 2.0, "records_replayed": 1000,
                   "forecast_seconds": 3.0,
                   "per_task": [{"task": "0_0", "instance": 0, "source": "scratch", "records": 1000,
                                 "seconds": 2.0, "records/s": 500, "forecast s": 2.0,
                                 "forecast records/s": 500.0, "forecast load": 2.0}]}


def test_a_hidden_cell_that_shows_something_is_an_error_and_solutions_replace_the_blanks():
    hidden = new_code_cell("x = 1", metadata={"tags": ["remove-cell"]})
    hidden.outputs = [nbformat.v4.new_output("stream", name="stdout", text="{'restore': 1}\n")]
    quiet = new_code_cell("y = 2", metadata={"tags": ["remove-cell"]})
    ex = new_code_cell("moved = ...", metadata={"tags": ["exercise"], "statekit": {"solution": "moved = 'k'"}})
    nb = new_notebook(cells=[hidden, quiet, ex])
    assert demo.hidden_cells_print_nothing(nb) == ["cell 0: a remove-cell cell showed output"]
    assert demo.apply_solutions(nb) == 1 and nb.cells[2].source == "moved = 'k'"


def test_the_tour_starts_its_longest_notebooks_first_and_reports_in_tour_order(monkeypatch):
    paths = demo.notebook_paths()
    names = [p.rsplit("/", 1)[-1][:3] for p in demo.schedule(paths)]
    assert names == list(demo.LONGEST_FIRST) and len(names) == len(paths)   # every one measured
    new = paths[0].replace("01_quickstart", "99_new")
    assert demo.schedule([new] + paths[:2])[-1] == new     # one not measured yet starts last
    # one process each, without a pool: results come back in the order of the tour
    ran = []
    monkeypatch.setattr(demo, "run_notebook", lambda p, *a, **k: ran.append(p) or NotebookResult(p, p))
    assert [r.name for r in demo.run_all(paths[:3], "out", 10, False, jobs=1)] == paths[:3]
    assert ran == paths[:3]


def test_a_kernel_that_dies_before_it_answers_is_started_once_more(tmp_path, monkeypatch):
    """jupyter_client picks a kernel's ports by binding and releasing them; on a busy machine
    another process can take one first and the kernel dies at once: no cell ran, so the
    notebook runs in a second kernel. A second death is the notebook's error."""
    import nbclient

    path = tmp_path / "tiny.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(6 * 7)")]), str(path))
    real, calls = nbclient.NotebookClient.execute, []

    def flaky(self, *a, **kw):
        calls.append(1)
        if len(calls) <= deaths:
            raise RuntimeError("Kernel died before replying to kernel_info")
        return real(self, *a, **kw)

    monkeypatch.setattr(nbclient.NotebookClient, "execute", flaky)
    deaths = 1
    r = demo.run_notebook(str(path), out_dir=str(tmp_path / "out"), timeout=60)
    assert r.errors == [] and len(calls) == 2
    out = nbformat.read(r.executed_path, as_version=4).cells[0].outputs
    assert out[0]["text"] == "42\n"
    calls.clear()
    deaths = 2
    r = demo.run_notebook(str(path), out_dir=str(tmp_path / "out2"), timeout=60)
    assert r.errors == ["RuntimeError: Kernel died before replying to kernel_info"] and len(calls) == 2


def test_the_notebooks_whose_restore_is_measured_run_first_and_alone():
    """`make demo` sets a restore against its forecast only where a notebook records it; each of
    those notebooks runs in a phase of its own, so no other notebook's work falls between a forecast
    and its restore; every notebook runs once, the rest longest first, side by side."""
    import os

    paths = demo.notebook_paths(None)
    recording = [p for p in demo.schedule(paths) if "record_restore(" in open(p).read()]
    assert recording and all(os.path.basename(p).startswith(demo.MEASURED) for p in recording)
    got = demo.phases(list(reversed(paths)))
    rest = [p for p in demo.schedule(paths) if p not in recording]
    assert got == [[p] for p in recording] + [rest]
    assert sorted(p for ph in got for p in ph) == sorted(paths)
    assert demo.phases(rest) == [rest]                      # none measured: one phase
    assert demo.phases(recording[:1]) == [recording[:1]]    # only a measured one: itself
