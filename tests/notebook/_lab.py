"""JupyterLab in headless Chromium, for the browser tests: a server on an ephemeral port with a
known token over a scratch copy of the notebooks (autosave never writes outputs into the
repository), its own Jupyter config/runtime dirs and STATEKIT_HOME; Debian's Chromium driven by
Playwright (no browser download). Everything started here is stopped afterwards, also on failure.

The page checks measure the page as a user sees it: `CLIPPED_JS` lists every table cell of the
dashboard whose text is cut (its content wider than the cell) or that lies outside the visible box of
an ancestor that clips (overflow hidden/auto/scroll, the notebook's output area); `OVERLAP_JS` lists
dashboard panels that overlap each other. `cpu_hog` keeps both cores busy while a test runs, as a
shared JupyterHub during a workshop does.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = os.environ.get("STATEKIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BUILD = os.path.join(ROOT, "build", "browser")


def skip_reason() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium, or set STATEKIT_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright; no browser download needed)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode() or "null")


def _request(url: str, method: str):
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


@contextlib.contextmanager
def jupyterlab(tmp_path, notebooks: list[str], env_extra: dict | None = None):
    """A running JupyterLab over copies of `notebooks` (paths, or names under notebooks/)."""
    work = tmp_path / "lab"
    (work / "notebooks").mkdir(parents=True)
    for nb in notebooks:
        src = nb if os.path.isabs(nb) else os.path.join(ROOT, "notebooks", nb)
        shutil.copy(src, work / "notebooks" / os.path.basename(src))
    shutil.copytree(os.path.join(ROOT, "sample_data"), work / "sample_data")
    home = tmp_path / "statekit-home"
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update({
        "STATEKIT_HOME": str(home),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""),
    })
    env.update(env_extra or {})
    env.pop("STATEKIT_BOOTSTRAP", None)
    # no "get notified about Jupyter news?" toast, no update check
    notif = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--ServerApp.port_retries=0",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--MappingKernelManager.cull_idle_timeout=0"] + (["--allow-root"] if os.geteuid() == 0 else []),
        cwd=str(work), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _get(f"{base}/api/status?token={token}")
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    raise RuntimeError("JupyterLab did not start: " +
                                       open(tmp_path / "jupyterlab.log").read()[-2000:])
                time.sleep(0.5)
        yield {"base": base, "token": token, "work": work, "home": home}
    finally:
        # the kernels first (their Spark JVMs and instances exit with them), then the server, then
        # any broker
        try:
            for k in _get(f"{base}/api/kernels?token={token}", timeout=5) or []:
                try:
                    _request(f"{base}/api/kernels/{k['id']}?token={token}", "DELETE")
                except Exception:
                    pass
        except Exception:
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        try:
            from statekit import broker as broker_mod
            from statekit import registry as registry_mod

            registry_mod.stop(str(home / "broker"), grace=5)
            broker_mod.stop(str(home / "broker"), grace=5)
        except Exception:
            pass


@contextlib.contextmanager
def browser_page(width: int = 1366, height: int = 900):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
        finally:
            browser.close()


def open_notebook(page, lab, name: str, file_browser: bool = True) -> None:
    """Open notebooks/NAME in JupyterLab, wait for an idle kernel; the file browser stays open on the
    left as a user has it."""
    url = f"{lab['base']}/lab/tree/notebooks/{name}?token={lab['token']}&reset"
    page.goto(url, wait_until="domcontentloaded", timeout=120_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.wait_for_function(
        "() => { const a = window.jupyterapp; if (!a) return false;"
        " const w = a.shell.currentWidget; return !!(w && w.sessionContext &&"
        " w.sessionContext.session && w.sessionContext.session.kernel &&"
        " w.sessionContext.session.kernel.status === 'idle'); }", timeout=120_000)
    if file_browser:
        page.evaluate("() => { const a = window.jupyterapp; if (a.shell.leftCollapsed)"
                      " a.commands.execute('filebrowser:toggle-main'); return true; }")
        page.wait_for_function("() => !window.jupyterapp.shell.leftCollapsed", timeout=20_000)
    page.wait_for_timeout(500)


_STARTED_JS = ("() => Array.from(document.querySelectorAll('.jp-Notebook .jp-InputPrompt'))"
               ".some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))")


def run_all(page, timeout: float = 30.0) -> None:
    """Run every cell (fire and forget: the command resolves only when all have run), and see a
    cell start: a Run All sent while JupyterLab was still settling was sometimes dropped, and the
    test then waited its whole timeout for a notebook that never ran."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _attempt in range(3):
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); return true; }")
        try:
            page.wait_for_function(_STARTED_JS, timeout=timeout * 1000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"Run All started no cell in {3 * timeout:.0f} s")


def outputs_text(page) -> list[str]:
    return page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
                         ".map(e => e.textContent)")


ERRORS_JS = ("() => Array.from(document.querySelectorAll('.jp-RenderedText[data-mime-type=\"application/vnd.jupyter.error\"]'))"
             ".map(e => e.textContent)")


def wait_for_output(page, text: str, timeout: float = 300.0, poll=None) -> None:
    """Until some cell output contains `text` (calls `poll()` every second meanwhile); a cell that
    fails meanwhile ends the wait with its error."""
    deadline = time.monotonic() + timeout
    js = ("(t) => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
          ".some(e => e.textContent.includes(t))")
    while not page.evaluate(js, text):
        if poll is not None:
            poll()
        failed = page.evaluate(ERRORS_JS)
        if failed:
            raise AssertionError(f"a cell failed while waiting for {text!r}: {failed[0][-1500:]}")
        if time.monotonic() > deadline:
            last = [" ".join(o.split())[-300:] for o in outputs_text(page)[-3:]]
            busy = page.evaluate("() => Array.from(document.querySelectorAll('.jp-InputPrompt'))"
                                 ".filter(e => e.textContent.includes('*')).length")
            raise AssertionError(f"no output contains {text!r} after {timeout:.0f} s ({busy} cell(s) "
                                 f"running or queued; the last outputs: {last})")
        time.sleep(1.0)


CELL_STREAMS_JS = """
() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell')).map(c =>
  Array.from(c.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stdout"],'
                                + ' .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
    .map(e => e.textContent).join('\\n'))
"""


def cell_streams(page) -> list[str]:
    """Per code cell, the text it printed (stdout and stderr)."""
    return page.evaluate(CELL_STREAMS_JS)


def learner_text_problems(page, app: str) -> list[str]:
    """What a learner should not read in the printed lines: two messages run together on one line,
    a line printed twice by one cell, a state word in a command's line (it goes stale above a
    dashboard that has moved on)."""
    import re

    problems = []
    for i, text in enumerate(cell_streams(page)):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        problems += [f"cell {i}: run together: {ln!r}" for ln in lines if re.search(rf"\S{re.escape(app)}: ", ln)]
        problems += [f"cell {i}: printed twice: {ln!r}" for n, ln in enumerate(lines) if ln in lines[:n]]
        problems += [f"cell {i}: stale state: {ln!r}" for ln in lines if ln.startswith(f"{app}: ")
                     and re.search(r"\b(RESTORING|REBALANCING|RUNNING|PENDING_SHUTDOWN)\b", ln)]
    return problems


def stderr_lines(page) -> list[str]:
    return page.evaluate(
        "() => Array.from(document.querySelectorAll('.jp-OutputArea-output[data-mime-type=\"application/vnd.jupyter.stderr\"],"
        " .jp-RenderedText[data-mime-type=\"application/vnd.jupyter.error\"]')).map(e => e.textContent)")


# Every visible table cell of a dashboard: is its text cut (content wider than the cell), or is it
# outside the visible part of an ancestor that clips? Returns [{text, why}] (empty: nothing clipped).
CLIPPED_JS = """
(root) => {
  const out = [];
  const dashes = root ? [root] : Array.from(document.querySelectorAll('.statekit-dashboard'));
  for (const d of dashes) {
    for (const el of d.querySelectorAll('td, th, .sk-kpi, .sk-chip, .sk-title, .sk-badge')) {
      const r = el.getBoundingClientRect();
      if (r.width === 0 || r.height === 0) continue;          // not shown (another tab)
      if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflow !== 'visible')
        out.push({text: el.textContent.trim().slice(0, 60), why: `content ${el.scrollWidth}px > box ${el.clientWidth}px`});
      let a = el.parentElement;
      while (a && a !== document.body) {
        const st = getComputedStyle(a);
        const clips = ['hidden', 'auto', 'scroll', 'clip'].includes(st.overflowX)
                      || a.classList.contains('jp-OutputArea-output');
        if (clips) {
          const b = a.getBoundingClientRect();
          if (r.right > b.right + 1 || r.left < b.left - 1) {
            out.push({text: el.textContent.trim().slice(0, 60),
                      why: `${Math.round(r.left)}..${Math.round(r.right)} outside ${a.className.toString().slice(0, 40)} ${Math.round(b.left)}..${Math.round(b.right)}`});
            break;
          }
        }
        a = a.parentElement;
      }
    }
  }
  return out;
}
"""

# Dashboard panels (children of the rows that wrap, and the rows themselves) that overlap.
OVERLAP_JS = """
() => {
  const out = [];
  for (const d of document.querySelectorAll('.statekit-dashboard')) {
    const boxes = [];
    for (const row of d.querySelectorAll('.sk-row')) {
      for (const c of row.children) {
        const r = c.getBoundingClientRect();
        if (r.width && r.height) boxes.push([c, r]);
      }
    }
    for (let i = 0; i < boxes.length; i++)
      for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i][1], b = boxes[j][1];
        if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1)
          out.push(`${boxes[i][0].className} overlaps ${boxes[j][0].className}`);
      }
  }
  return out;
}
"""


@contextlib.contextmanager
def cpu_hog(processes: int = 2):
    """Keep every core busy (a shared workshop server): `processes` busy loops at normal priority,
    started here and killed on the way out, also on failure."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(10)


def screenshot(page, name: str, element=None) -> str:
    """What the user sees at this moment (the viewport), with `element` scrolled to the top."""
    os.makedirs(BUILD, exist_ok=True)
    path = os.path.join(BUILD, name)
    if element is not None:
        element.evaluate("e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)
    page.screenshot(path=path)
    return path
