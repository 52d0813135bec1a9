"""`make demo`: run the guided tour headless and report.

    python -m statekit.demo [--only 01,02] [--out build] [--timeout 300] [--jobs 3]

Executes every `notebooks/NN_*.ipynb` (01–16) in a real Jupyter kernel (nbclient; the kernel runs this
interpreter), writes the executed copies to `build/notebooks/` and every chart they draw as PNG to
`build/charts/`, then prints a short report: per notebook its time and checks, and every restore a
notebook measured (seconds, records and records/s per task, the forecast made before the crash when
there is one). Each run gets its own STATEKIT_HOME (a fresh broker and state directories), removed
afterwards unless --keep. Three notebooks run side by side (`--jobs`), each in its own process,
the longest first; before them, one at a time, the notebooks whose restore the report times
(`MEASURED`), so that a neighbour's work does not fall between a forecast and its restore.

What the report needs, a notebook hands over without showing it to the learner: a short cell tagged
`remove-cell` calls `record_restore(app, forecast)`, which reads the app's own figures and appends
them to the file named by STATEKIT_DEMO_FIGURES (set only here), and prints nothing. The exercises'
cells (tagged `exercise`) keep their reference answers in their metadata: `apply_solutions` puts them
in before the run, and STATEKIT_SOLUTIONS=1 makes a check that fails raise (`notebooks/exercises.py`).
"""
from __future__ import annotations

import argparse
import base64
import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
FIGURES_ENV = "STATEKIT_DEMO_FIGURES"
FORECAST_HOLDS = 1.5   # a forecast holds within this factor of the restore it forecast, either way
SOLUTIONS_ENV = "STATEKIT_SOLUTIONS"


@dataclass
class NotebookResult:
    name: str
    path: str
    seconds: float = 0.0
    ok_checks: int = 0
    errors: list = field(default_factory=list)  # one line each
    reports: list = field(default_factory=list)  # what the notebook recorded (record_figures)
    charts: list = field(default_factory=list)  # PNG paths written
    stderr_lines: list = field(default_factory=list)
    executed_path: str | None = None

    @property
    def passed(self) -> bool:
        return not self.errors and self.ok_checks > 0


def notebook_paths(only: list[str] | None = None) -> list[str]:
    paths = sorted(glob.glob(os.path.join(NOTEBOOKS, "[0-9][0-9]_*.ipynb")))
    if only:
        paths = [p for p in paths if any(os.path.basename(p).startswith(o) for o in only)]
    return paths


def record_figures(name: str, **figures) -> None:
    """Hand figures to `make demo`'s report (a JSON line in $STATEKIT_DEMO_FIGURES); prints
    nothing, and does nothing outside `make demo` and the tests."""
    path = os.environ.get(FIGURES_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"name": name, **figures}, default=_plain) + "\n")


def _plain(v):
    return v.item() if hasattr(v, "item") else str(v)


def record_restore(app, forecast=None) -> None:
    """The restore since the last restart, per task (seconds, records, records/s), beside the
    forecast of a restore from scratch made before the crash: from `app.restore_summary()` and
    `forecast.frame`, for the report."""
    rs = app.restore_summary()
    rs = rs[rs["records"] > 0].groupby(["task", "instance", "source"], as_index=False)[["records", "seconds"]].sum()
    fc = {}   # task -> its forecast from scratch: the seconds, and the rate and load they came from
    if forecast is not None:
        fc = {f.task: f for f in forecast.frame[forecast.frame.source == "scratch"].itertuples()}
    per_task = [{"task": r.task, "instance": int(r.instance), "source": r.source, "records": int(r.records),
                 "seconds": float(r.seconds),
                 "records/s": round(r.records / r.seconds) if r.seconds > 0 else None,
                 "forecast s": float(fc[r.task].seconds) if r.task in fc else None,
                 "forecast records/s": float(fc[r.task].apply_rate) if r.task in fc else None,
                 "forecast load": float(fc[r.task].load) if r.task in fc else None}
                for r in rs.itertuples()]
    record_figures("restore", restore_seconds=round(float(rs["seconds"].sum()), 3),
                   records_replayed=int(rs["records"].sum()),
                   forecast_seconds=round(float(sum(f.seconds for f in fc.values())), 3) if fc else None,
                   per_task=per_task)


def apply_solutions(nb) -> int:
    """Put each exercise cell's reference answer (metadata statekit.solution) in place of the
    learner's blank; returns how many."""
    n = 0
    for cell in nb.cells:
        solution = (cell.get("metadata", {}).get("statekit") or {}).get("solution")
        if cell.cell_type == "code" and solution is not None:
            cell.source = solution
            n += 1
    return n


def _ensure_kernel_env(home: str) -> dict:
    env = {
        "STATEKIT_HOME": home,
        FIGURES_ENV: os.path.join(home, "demo-figures.jsonl"),
        SOLUTIONS_ENV: "1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    pp = os.environ.get("PYTHONPATH", "")
    if ROOT not in pp.split(os.pathsep):
        env["PYTHONPATH"] = ROOT + (os.pathsep + pp if pp else "")
    return env


def hidden_cells_print_nothing(nb) -> list[str]:
    """The cells tagged `remove-cell` (there for the report or the tests, not the learner) that
    showed something: one line each."""
    return [f"cell {i}: a remove-cell cell showed output" for i, cell in enumerate(nb.cells)
            if cell.cell_type == "code" and "remove-cell" in cell.get("metadata", {}).get("tags", [])
            and cell.get("outputs")]


def _error_line(ename, evalue) -> str:
    """A cell's error as one line: its name and its value with the whitespace folded."""
    return f"{ename}: {' '.join(str(evalue).split())[:300]}"


def _outputs(nb):
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            yield i, cell, out


def analyze(nb, result: NotebookResult, charts_dir: str | None) -> None:
    n_png = 0
    for i, cell, out in _outputs(nb):
        ot = out.get("output_type")
        if ot == "error":
            result.errors.append(f"cell {i}: {_error_line(out.get('ename'), out.get('evalue'))}")
        elif ot == "stream":
            text = out.get("text", "")
            if out.get("name") == "stdout":
                result.ok_checks += sum(1 for line in text.splitlines() if line.strip() == "OK")
            else:
                result.stderr_lines += [line for line in text.splitlines() if line.strip()]
        elif ot in ("display_data", "execute_result"):
            data = out.get("data", {})
            if "image/png" in data and charts_dir:
                n_png += 1
                os.makedirs(charts_dir, exist_ok=True)
                path = os.path.join(charts_dir, f"{result.name}-cell{i:02d}-{n_png}.png")
                with open(path, "wb") as f:
                    f.write(base64.b64decode(data["image/png"]))
                result.charts.append(path)
    result.errors += hidden_cells_print_nothing(nb)
    # statekit one-line errors go to stderr in red: a notebook of the tour must not print any
    for line in result.stderr_lines:
        if "%statekit" in line:
            result.errors.append(f"stderr: {line.strip()[:300]}")


def _widget_pngs(nb, result: NotebookResult, charts_dir: str | None) -> None:
    """Dashboard charts (Image widgets) from the saved widget state."""
    if not charts_dir:
        return
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    n = 0
    for model_id, w in state.items():
        if w.get("model_name") != "ImageModel":
            continue
        for buf in w.get("buffers", []) or []:
            if buf.get("path") == ["value"] and buf.get("encoding") == "base64":
                raw = base64.b64decode(buf["data"])
                if raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 2000:
                    n += 1
                    os.makedirs(charts_dir, exist_ok=True)
                    path = os.path.join(charts_dir, f"{result.name}-dashboard-{n}.png")
                    with open(path, "wb") as f:
                        f.write(raw)
                    result.charts.append(path)


def run_notebook(path: str, out_dir: str | None = None, timeout: int = 300, home: str | None = None,
                 keep_home: bool = False, before_cell=None) -> NotebookResult:
    """Execute one notebook in a fresh kernel; never raises for a notebook failure (see .errors).
    ``before_cell(cell)``, called before each code cell runs: a learner's pace (the tests)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    name = os.path.splitext(os.path.basename(path))[0]
    result = NotebookResult(name, path)
    own_home = home is None
    home = home or tempfile.mkdtemp(prefix=f"statekit-demo-{name[:2]}-")
    nb = nbformat.read(path, as_version=4)
    apply_solutions(nb)
    env_before = {k: os.environ.get(k) for k in ("STATEKIT_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                                                  "MPLBACKEND", "PYTHONPATH", "STATEKIT_BOOTSTRAP",
                                                  FIGURES_ENV, SOLUTIONS_ENV)}
    kernel_env = _ensure_kernel_env(home)
    os.environ.update(kernel_env)
    os.environ.pop("STATEKIT_BOOTSTRAP", None)
    t0 = time.monotonic()
    sockets = tempfile.mkdtemp(prefix="sk-kernel-")   # short: a socket's path is at most 107 bytes
    # the kernel process's own stderr (ipykernel's log; what its children print there): a file,
    # not the report. Ctrl-C reaches the kernel and the runner together, and ipykernel then logs a
    # traceback for the reply it can no longer send. Its last line is said if the kernel died.
    kernel_log = os.path.join(sockets, "kernel.log")
    log_fh = open(kernel_log, "wb")
    try:
        for attempt in (0, 1):
            client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                                    store_widget_state=True, record_timing=True,
                                    resources={"metadata": {"path": NOTEBOOKS}},
                                    config=_local_sockets(sockets))
            if before_cell is not None:
                client.on_cell_execute = lambda cell, cell_index: before_cell(cell)
            try:
                client.execute(stderr=log_fh)
                break
            except RuntimeError as err:
                # a kernel that died before it answered, no cell run: started once more
                if attempt or "before replying to kernel_info" not in str(err):
                    raise
    except CellExecutionError as err:
        # the exception's own name and value: a statekit error hides its traceback, and the
        # message nbclient builds then ends in the cell's stream output, not in the error
        result.errors.append(_error_line(err.ename, err.evalue))
    except (CellTimeoutError, TimeoutError) as err:
        result.errors.append(f"{type(err).__name__}: {_first_line(err)}")
    except Exception as err:  # the kernel died, or did not start
        result.errors.append(f"{type(err).__name__}: {_first_line(err)}{_last_words(kernel_log)}")
    finally:
        log_fh.close()
        result.seconds = time.monotonic() - t0
        result.reports = _read_figures(kernel_env[FIGURES_ENV])
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _cleanup(home)
        shutil.rmtree(sockets, ignore_errors=True)
        if own_home and not keep_home:
            shutil.rmtree(home, ignore_errors=True)
    if getattr(client, "_async_cleanup_kernel_future", None) is not None:
        # nbclient's own SIGINT/SIGTERM handler shut the kernel down, and the cell failed: the
        # user (Ctrl-C) or the system meant stop, not "this notebook failed, run the next one"
        raise KeyboardInterrupt
    charts_dir = os.path.join(out_dir, "charts") if out_dir else None
    analyze(nb, result, charts_dir)
    _widget_pngs(nb, result, charts_dir)
    if out_dir:
        os.makedirs(os.path.join(out_dir, "notebooks"), exist_ok=True)
        result.executed_path = os.path.join(out_dir, "notebooks", f"{name}.ipynb")
        nbformat.write(nb, result.executed_path)
    return result


def _last_words(log_path: str) -> str:
    """`` (the kernel's last line: ...)`` from its log, or nothing."""
    try:
        with open(log_path, "rb") as f:
            lines = [ln.strip() for ln in f.read()[-4096:].decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return f" (the kernel's last line: {lines[-1][:300]})" if lines else ""


def _local_sockets(directory: str):
    """Kernel configuration: the kernel talks to this process over Unix sockets in ``directory``
    (ZeroMQ's ipc transport), not TCP ports on localhost: no port taken between being chosen and
    bound, and nothing another user of the machine can connect to (ipykernel prints a warning per
    kernel on TCP without encryption, which the tour's report is no place for)."""
    from traitlets.config import Config

    cfg = Config()
    cfg.KernelManager.transport = "ipc"
    cfg.KernelManager.ip = os.path.join(directory, "k")
    return cfg


def _read_figures(path: str) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _first_line(err) -> str:
    text = str(err)
    # nbclient's message holds the cell source and a traceback: keep the exception line
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        s = ln.strip()
        if ("Error" in s or "Exception" in s) and not s.startswith(("File ", "Traceback", "Cell ")):
            return s[:300]
    return (lines[-1] if lines else type(err).__name__)[:300]


def _cleanup(home: str) -> None:
    """If the notebook died before `%statekit down`, stop the broker and the schema registry it left
    behind (its Spark JVM exits with the kernel)."""
    try:
        from statekit import broker as broker_mod
        from statekit import registry as registry_mod

        registry_mod.stop(os.path.join(home, "broker"), grace=5)
        broker_mod.stop(os.path.join(home, "broker"), grace=5)
    except Exception:
        pass


def _number(v) -> bool:
    """A figure to print: a number, not None and not NaN."""
    return isinstance(v, (int, float)) and v == v


def _forecast_basis(t: dict) -> str:
    """The rate a task's forecast assumed and the load it was scaled by: ", at N records/s (load L)"."""
    rate, load = t.get("forecast records/s"), t.get("forecast load")
    if not _number(rate):
        return ""
    return f" at {rate:,.0f} records/s" + (f" (load {load:.2f})" if _number(load) else "")


def format_report(results: list[NotebookResult], wall: float | None = None) -> str:
    lines = ["statekit demo: the guided tour, executed headless", ""]
    w = max((len(r.name) for r in results), default=10)
    for r in results:
        status = "ok  " if r.passed else "FAIL"
        lines.append(f"  {status} {r.name:<{w}}  {r.seconds:6.1f} s  {r.ok_checks} check(s) OK"
                     + (f"  {len(r.charts)} chart(s)" if r.charts else ""))
        for e in r.errors[:3]:
            lines.append(f"         {e}")
    restores = [(r.name, p) for r in results for p in r.reports if p.get("name") == "restore"]
    held = []   # forecast / measured of every restore with a forecast
    for name, p in restores:
        fc, took = p.get("forecast_seconds"), p.get("restore_seconds")
        ratio = ""
        if isinstance(took, (int, float)) and isinstance(fc, (int, float)) and took > 0:
            held.append(fc / took)
            ratio = (f"; forecast / measured = {fc / took:.2f}, "
                     f"{'within' if 1 / FORECAST_HOLDS <= fc / took <= FORECAST_HOLDS else 'NOT within'} "
                     f"{FORECAST_HOLDS:g}x")
        lines += ["", f"  {name}: restore from scratch after a disk loss: {took} s of "
                      f"restore work, {p.get('records_replayed'):,} changelog records replayed"
                      + (f" (forecast before the crash: {fc} s{ratio})" if fc is not None else "")]
        for t in p.get("per_task") or []:
            rate = t.get("records/s")
            fc = t.get("forecast s")
            lines.append(f"    task {t.get('task')} (instance {t.get('instance')}, from {t.get('source')}): "
                         f"{float(t.get('seconds') or 0):.2f} s, {int(t.get('records') or 0):,} records"
                         + (f", {rate:,.0f} records/s" if _number(rate) else "")
                         + (f"; forecast {fc:.2f} s" if _number(fc) else "")
                         + _forecast_basis(t))
        ok = next((r.passed for r in results if r.name == name), False)
        lines.append(f"    invariant (store == plain-Python reference after the crashes): "
                     f"{'OK' if ok else 'FAILED'}")
    n_ok = sum(r.passed for r in results)
    took = f"{sum(r.seconds for r in results):.0f} s of notebook time" + \
        (f", {wall:.0f} s wall time" if wall is not None else "")
    lines += ["", f"  {n_ok}/{len(results)} notebooks passed; {took}"]
    if held:
        ok = sum(1 / FORECAST_HOLDS <= x <= FORECAST_HOLDS for x in held)
        lines.append(f"  restore forecasts within {FORECAST_HOLDS:g}x of the measured restore: {ok}/{len(held)} "
                     f"(forecast / measured: {', '.join(f'{x:.2f}' for x in held)})")
    return "\n".join(lines)


# The order the notebooks start in: the long ones first, so the pool ends on short notebooks
# instead of one long one running alone (seconds in a run of three at a time here: 03 169, 09 127,
# 02 116, 13 92, 10 84, 05 56, 11 44, 04 42, 01 41, 07 31, 06 28, 08 23, 12 11; 14 about 45
# alone in the tests). Notebook 13 starts a standalone cluster (8 JVMs) but mostly waits on it: it
# goes first, beside 09 and 03. Notebook 16 (a 10-second broker freeze and a restart: 77 alone)
# mostly waits: it starts among the long ones. 15 starts a Spark Connect server (one JVM) for a
# short word count.
LONGEST_FIRST = ("13_", "09_", "03_", "02_", "10_", "16_", "05_", "11_", "14_", "04_", "15_", "01_",
                 "07_", "06_", "08_", "12_")


# The notebooks whose restore the report sets against the forecast made before the crash. They run
# first, one at a time, each alone: a forecast measures the machine of its moment
# (`state.forecast.rate_now`), and a neighbour's phases come and go within seconds. In a pool of
# three the moment of 02's forecast fell on notebook 10's start (a JVM, five instances and their
# calibrations): its calibration got a sixth to a fifth of a core, its restore 20 s later half a
# core (forecast / measured 1.97–3.09 in four runs of five); beside 03 alone it fell on 03's bulk
# load (2.51 once: calibrated at 138,000 records/s, restored at 316,000–395,000). No figure taken
# before a crash can see the next seconds of a neighbour.
MEASURED = ("02_", "03_")


def schedule(paths: list) -> list:
    """``paths`` in the order they start: longest first, a notebook not measured yet last."""
    def rank(p):
        name = os.path.basename(p)
        return next((i for i, pre in enumerate(LONGEST_FIRST) if name.startswith(pre)),
                    len(LONGEST_FIRST))
    return sorted(paths, key=rank)


def timed(paths: list) -> list:
    """The notebooks of ``paths`` whose restore the report times (``MEASURED``), in ``schedule``
    order."""
    return [p for p in schedule(paths) if os.path.basename(p).startswith(MEASURED)]


def phases(paths: list) -> list:
    """The pool's phases: each timed notebook alone, then the rest together; in ``schedule``
    order."""
    alone = timed(paths)
    rest = [p for p in schedule(paths) if p not in alone]
    return [[p] for p in alone] + ([rest] if rest else [])


def _run_in_pool(*args) -> NotebookResult:
    """``run_notebook`` in a process of the pool: an interrupted notebook (Ctrl-C, or the SIGTERM
    the runner passed on) ends the process, so it takes no next notebook from the queue."""
    try:
        return run_notebook(*args)
    except KeyboardInterrupt:
        os._exit(130)    # its kernel, broker and registry are stopped (run_notebook's finally)


def _pass_sigterm_on() -> None:
    """SIGTERM to the runner alone (a CI job's timeout, ``kill PID``) stops the tour as Ctrl-C
    does, which reaches every process of the terminal: each notebook's process gets it too, and
    there nbclient's handler shuts the kernel down. Without it, the pool's processes went on
    running notebooks, kernels and all, after the runner had gone."""
    import multiprocessing

    def on_term(_signum, _frame):
        for child in multiprocessing.active_children():
            try:
                os.kill(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


def run_all(paths: list, out: str, timeout: int, keep: bool, jobs: int) -> list:
    """Every notebook's result, in ``paths`` order. Most of a notebook's time is spent waiting
    (a kernel, a JVM, a throttled restore), so ``jobs`` of them run side by side, each in a
    process of its own (``run_notebook`` sets the environment its kernel inherits)."""
    results = {}
    if jobs > 1 and len(paths) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        alone = timed(paths)
        print(f"running {len(paths)} notebooks: "
              + (f"{', '.join(os.path.basename(p)[:2] for p in alone)} alone first (their restores "
                 f"are timed), then " if alone else "")
              + f"{jobs} at a time ...", flush=True)
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            for phase in phases(paths):
                futures = {pool.submit(_run_in_pool, p, out, timeout, None, keep): p for p in phase}
                for f in as_completed(futures):
                    r = f.result()
                    results[futures[f]] = r
                    print(f"  {r.name}: {'ok' if r.passed else 'FAILED'} ({r.seconds:.0f} s)", flush=True)
    for p in paths:
        if p not in results:
            print(f"running {os.path.basename(p)} ...", flush=True)
            results[p] = run_notebook(p, out, timeout, keep_home=keep)
    return [results[p] for p in paths]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m statekit.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated notebook prefixes, e.g. 01,02")
    ap.add_argument("--out", default=os.path.join(ROOT, "build"))
    ap.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    ap.add_argument("--keep", action="store_true", help="keep each notebook's STATEKIT_HOME")
    ap.add_argument("--jobs", type=int, default=3,
                    help="notebooks run side by side (each in its own process, kernel and broker)")
    a = ap.parse_args(argv)
    only = [x.strip() for x in a.only.split(",")] if a.only else None
    paths = notebook_paths(only)
    if not paths:
        print("no notebooks found", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    _pass_sigterm_on()
    try:
        results = run_all(paths, a.out, a.timeout, a.keep, max(1, a.jobs))
    except KeyboardInterrupt:
        # each notebook's process got the Ctrl-C (or the SIGTERM) too: its kernel and broker
        # are stopped
        print("\nstatekit demo: interrupted; the notebooks' kernels and brokers are stopped",
              file=sys.stderr)
        return 130
    report = format_report(results, wall=time.monotonic() - t0)
    print()
    print(report)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "demo-report.txt"), "w") as f:
        f.write(report + "\n")
    print(f"\n  executed notebooks: {os.path.join(a.out, 'notebooks')}\n  charts: {os.path.join(a.out, 'charts')}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
