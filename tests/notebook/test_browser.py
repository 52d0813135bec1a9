"""JupyterLab in headless Chromium: notebook 01 runs top to bottom in a real browser, the live
dashboard renders with store rows, and a screenshot lands in build/.

JupyterLab runs on an ephemeral port with a known token over a scratch copy of the notebooks (so
autosave never writes outputs into the repository), with its own Jupyter config/runtime dirs and
STATEKIT_HOME. Chromium is Debian's (/usr/bin/chromium) driven by Playwright; no browser download.
Everything started here is stopped afterwards, also on failure.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = os.environ.get("STATEKIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NOTEBOOK = "01_quickstart.ipynb"

pytestmark = pytest.mark.browser


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


@pytest.fixture
def lab(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium, or set STATEKIT_CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install playwright; no browser download needed)")
    work = tmp_path / "lab"
    (work / "notebooks").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "notebooks", NOTEBOOK), work / "notebooks" / NOTEBOOK)
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
        # the kernels first (their Spark JVMs exit with them), then the server, then any broker
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

            broker_mod.stop(str(home / "broker"), grace=5)
        except Exception:
            pass


def test_notebook_01_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    build = os.path.join(ROOT, "build")
    os.makedirs(build, exist_ok=True)
    url = f"{lab['base']}/lab/tree/notebooks/{NOTEBOOK}?token={lab['token']}&reset"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1300}, device_scale_factor=1)
            page.goto(url, wait_until="domcontentloaded", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            # wait for the kernel, then run every cell
            page.wait_for_function(
                "() => { const a = window.jupyterapp; if (!a) return false;"
                " const w = a.shell.currentWidget; return !!(w && w.sessionContext &&"
                " w.sessionContext.session && w.sessionContext.session.kernel &&"
                " w.sessionContext.session.kernel.status === 'idle'); }", timeout=120_000)
            # fire and forget: the command's promise resolves only when every cell has run
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); return true; }")
            # the last cell (`%statekit down`) prints "stopped:": the whole notebook ran; meanwhile
            # the dashboard refreshes (its footer says when; printed with `pytest -s`)
            done = ("() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
                    ".some(e => e.textContent.includes('stopped: '))")
            deadline = time.monotonic() + 300
            seen = []  # distinct dashboard headers while the notebook runs: it refreshes live
            while True:
                trace = page.evaluate(
                    "() => { const d = document.querySelector('.statekit-dashboard');"
                    " if (!d) return null; const h = d.querySelector('.sk-head');"
                    " const f = Array.from(d.querySelectorAll('.sk-note')).map(e => e.textContent).filter(t => t.includes('refresh'));"
                    " return (h ? h.textContent : '') + ' | ' + f.slice(-1).join(''); }")
                print(f"[{time.strftime('%H:%M:%S')}] {trace}", flush=True)
                head_now = trace.split(" | ")[0] if trace else None
                if head_now and (not seen or seen[-1] != head_now):
                    seen.append(head_now)
                if page.evaluate(done):
                    break
                assert time.monotonic() < deadline, "notebook 01 did not finish within 300 s"
                time.sleep(2)
            # the dashboard (a widget) rendered, and changed while the notebook ran
            page.wait_for_selector(".statekit-dashboard .sk-head", timeout=60_000)
            assert len(seen) >= 2, f"the dashboard never refreshed in the browser: {seen}"
            errors = page.evaluate(
                "() => Array.from(document.querySelectorAll('.jp-OutputArea-output[data-mime-type=\"application/vnd.jupyter.stderr\"], .jp-RenderedText[data-mime-type=\"application/vnd.jupyter.error\"]'))"
                ".map(e => e.textContent).filter(t => t.includes('%statekit') || t.includes('Traceback') || t.includes('Error'))")
            assert not errors, f"error output in the notebook: {errors[:3]}"
            outputs = page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
                                    ".map(e => e.textContent)")
            assert any(o.strip().endswith("OK") or "\nOK" in o for o in outputs), "the reference check did not print OK"
            dash = page.locator(".statekit-dashboard").first
            dash.scroll_into_view_if_needed()
            head = dash.locator(".sk-head").first.text_content()
            m = re.search(r"([\d,]+)store rows", head or "")
            assert m and int(m.group(1).replace(",", "")) > 0, f"no store rows in the dashboard header: {head!r}"
            tasks = dash.locator("table.sk").first.text_content()
            assert "counts" in tasks and "active" in tasks, tasks
            store = dash.locator("text=Store").first
            assert store.count() == 1
            time.sleep(0.5)
            dash.screenshot(path=os.path.join(build, "browser-dashboard.png"))
            page.screenshot(path=os.path.join(build, "browser-notebook.png"))
        finally:
            browser.close()
