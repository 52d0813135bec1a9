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


# Everything one dashboard shows as numbers and states, read from the page in one go: the header's
# figures, the chips, the Tasks tab, the Instances panel, the Restoration panel (rows, summary,
# note, forecast lines), the moves line. `read_dashboard` reads until two reads agree (nothing in
# flight between the kernel's widget messages); `disagreements` lists what two of them say
# differently.
DASHBOARD_JS = """
(i) => {
  const d = Array.from(document.querySelectorAll('.statekit-dashboard'))[i || 0];
  if (!d) return null;
  const text = e => (e ? e.textContent.trim() : null);
  const head = d.querySelector('.sk-head');
  const kpis = {};
  if (head) for (const k of head.querySelectorAll('.sk-kpi')) kpis[text(k.querySelector('span'))] = text(k.querySelector('b'));
  const chips = Array.from(d.querySelectorAll('.sk-chip')).map(c => c.getAttribute('title'));
  const tableWith = (word) => Array.from(d.querySelectorAll('table.sk'))
    .find(t => Array.from(t.querySelectorAll('th')).some(th => th.textContent === word));
  const rows = (t) => t ? Array.from(t.querySelectorAll('tbody tr')).map(tr => ({
      cls: tr.className, cells: Array.from(tr.children).map(td => td.textContent.trim())})) : [];
  const heads = (t) => t ? Array.from(t.querySelectorAll('th')).map(th => th.textContent) : [];
  const panel = (title) => Array.from(d.querySelectorAll('.sk-dash'))
    .filter(p => { const h = p.querySelector('.sk-h'); return h && h.textContent.startsWith(title); }).pop();
  const rp = panel('Restoration');
  const ip = panel('Instances');
  const tasks = tableWith('changelog end');
  const rt = rp ? rp.querySelector('table.sk') : null;
  const it = ip ? ip.querySelector('table.sk') : null;
  return {
    badge: text(d.querySelector('.sk-badge')), reason: text(d.querySelector('.sk-reason')), kpis: kpis,
    chips: chips,
    tasks: {heads: heads(tasks), rows: rows(tasks)},
    instances: {heads: heads(it), rows: rows(it)},
    restore: {heads: heads(rt), rows: rows(rt), note: rp ? text(rp.querySelector('.sk-h .sk-note')) : null,
              summary: rp ? text(rp.querySelector('.sk-sum')) : null,
              summaryBad: rp ? !!rp.querySelector('.sk-sum.bad') : null,
              forecast: rp ? Array.from(rp.querySelectorAll('.sk-fc li')).map(li => li.textContent.trim()) : []},
    moves: text(d.querySelector('.sk-moves')),
  };
}
"""


def read_dashboard(page, index: int = 0, tries: int = 12, gap: float = 0.4):
    """The dashboard as two reads `gap` seconds apart both show it (None: it kept changing)."""
    last = page.evaluate(DASHBOARD_JS, index)
    for _ in range(tries):
        time.sleep(gap)
        now = page.evaluate(DASHBOARD_JS, index)
        if now == last and now is not None:
            return now
        last = now
    return None


def _n(s):
    """A number as the dashboard prints it ("1,234", "12k/s", "≥ 5", "–": None)."""
    import re

    if s is None:
        return None
    m = re.search(r"([\d,]+(?:\.\d+)?)\s*(k)?", s.replace("≥", ""))
    if not m or s.strip() in ("–", ""):
        return None
    v = float(m.group(1).replace(",", ""))
    return v * 1000 if m.group(2) else v


def _col(table, name):
    return table["heads"].index(name) if name in table["heads"] else None


def disagreements(r) -> list[str]:
    """What two panels of one read of the page (`read_dashboard`) say differently."""
    import re

    out = []
    k = r["kpis"]
    tasks, inst, rest = r["tasks"], r["instances"], r["restore"]
    chips = {}
    for title in r["chips"]:
        m = re.match(r"task (\S+) · instance (\S+) · (\w+)(?: · \d+% restored)? · lag ([\d,]+)", title or "")
        if m:
            chips[m.group(1)] = {"instance": m.group(2), "state": m.group(3), "lag": int(m.group(4).replace(",", ""))}
    active = [row["cells"] for row in tasks["rows"] if row["cells"][_col(tasks, "role")] == "active"] \
        if tasks["heads"] else []
    if active:
        c = {h: _col(tasks, h) for h in ("task", "instance", "state", "processed", "batch", "store rows", "lag")}
        per_task = {}
        for cells in active:
            per_task.setdefault(cells[c["task"]], cells)
        for name, col, total in (("processed", "processed", sum), ("store rows", "store rows", sum)):
            if name not in k:
                continue
            vals = [_n(cells[c[col]]) for cells in (per_task.values() if col == "processed" else active)]
            vals = [v for v in vals if v is not None]
            if vals and _n(k[name]) != total(vals):
                out.append(f"header {name} {k[name]} vs the Tasks tab's {total(vals):,.0f}")
        batches = [_n(cells[c["batch"]]) for cells in per_task.values() if _n(cells[c["batch"]]) is not None]
        if batches and "batch" in k and _n(k["batch"].split("·")[0]) != max(batches):
            out.append(f"header batch {k['batch']} vs the Tasks tab's latest {max(batches):,.0f}")
        lags = [_n(cells[c["lag"]]) or 0 for cells in active]
        if "changelog lag" in k and not k["changelog lag"].startswith("≥") and _n(k["changelog lag"]) != sum(lags):
            out.append(f"header lag {k['changelog lag']} vs the Tasks tab's {sum(lags):,.0f}")
        for t, cells in per_task.items():
            ch = chips.get(t)
            if ch is not None and (ch["state"], ch["instance"]) != (cells[c["state"]], cells[c["instance"]].replace("–", "none")):
                out.append(f"task {t}: chip {ch['state']}@{ch['instance']} vs Tasks tab "
                           f"{cells[c['state']]}@{cells[c['instance']]}")
        if chips and sum(ch["lag"] for ch in chips.values()) != sum(lags):
            out.append(f"the chips' lag {sum(ch['lag'] for ch in chips.values())} vs the Tasks tab's {sum(lags):,.0f}")
    if inst["heads"]:
        ci = {h: _col(inst, h) for h in ("instance", "status", "active", "committed")}
        alive = [row["cells"] for row in inst["rows"] if row["cells"][ci["status"]] in ("alive", "leaving")]
        if "instances" in k and int(k["instances"].split()[0]) != len(alive):
            out.append(f"header {k['instances']} vs {len(alive)} alive in the Instances panel")
        rates = [_n(row["cells"][ci["committed"]]) for row in inst["rows"]]
        rates = [v for v in rates if v is not None]
        shown = k.get("committed (5 s)")
        rounding = 0.5 * (len(rates) + 1) + 500 * sum("k/s" in row["cells"][ci["committed"]] for row in inst["rows"])
        if rates and shown is not None and abs(_n(shown) - sum(rates)) > rounding:
            out.append(f"header {shown} committed vs the Instances panel's {sum(rates):,.0f}/s")
        for row in inst["rows"]:
            for t in row["cells"][ci["active"]].split():
                if t != "–" and chips.get(t, {}).get("instance") != row["cells"][ci["instance"]]:
                    out.append(f"Instances panel: {t} on {row['cells'][ci['instance']]}, its chip on "
                               f"{chips.get(t, {}).get('instance')}")
    if rest["heads"]:
        cr = {h: _col(rest, h) for h in ("task", "instance", "replayed / to replay", "status")}
        done = 0
        for row in rest["rows"]:
            cells, status = row["cells"], row["cells"][cr["status"]]
            t = cells[cr["task"]]
            replayed = cells[cr["replayed / to replay"]]
            if status.startswith("done"):
                a, _, b = replayed.partition("/")
                if _n(a) != _n(b) or "≤" in b:
                    out.append(f"task {t}: done, replayed {replayed}")
                done += _n(a) or 0
            if status.startswith("failed") != ("dead" in row["cls"]):
                out.append(f"task {t}: {status} in a {'red' if 'dead' in row['cls'] else 'plain'} row")
            ch = chips.get(t)
            if ch is not None and status in ("queued", "restoring") and ch["state"] != status:
                out.append(f"task {t}: Restoration {status} vs chip {ch['state']}")
            if ch is not None and not status.startswith(("queued", "restoring")) and ch["state"] in ("queued", "restoring"):
                out.append(f"task {t}: Restoration {status} vs chip {ch['state']}")
        if rest["summary"]:
            failed = any(row["cells"][cr["status"]].startswith("failed") for row in rest["rows"])
            if failed != rest["summaryBad"] or (failed and rest["summary"].startswith("✔")):
                out.append(f"the summary {rest['summary'][:40]!r} drawn {'red' if rest['summaryBad'] else 'green'}")
            m = re.search(r": ([\d,]+) records", rest["summary"])
            if m and done and int(m.group(1).replace(",", "")) != done:
                out.append(f"the summary's {m.group(1)} records vs the done rows' {done:,.0f}")
        g = re.search(r"generation (\d+)", rest["note"] or "")
        if g and "generation" in k and int(g.group(1)) > _n(k["generation"]):
            out.append(f"header generation {k['generation']} vs the Restoration panel's {g.group(1)}")
    g = re.search(r"\(generation (\d+),", r["moves"] or "")
    if g and "generation" in k and int(g.group(1)) > _n(k["generation"]):
        out.append(f"header generation {k['generation']} vs the moves line's {g.group(1)}")
    return out


class Agreement:
    """Reads the dashboard whenever it holds still and keeps what its panels said differently."""

    def __init__(self, page, index: int = 0):
        self.page, self.index = page, index
        self.reads = 0
        self.problems: list = []

    def check(self):
        r = read_dashboard(self.page, self.index, tries=3)
        if r is None or not r["kpis"]:
            return None
        self.reads += 1
        for p in disagreements(r):
            if p not in self.problems:
                self.problems.append(p)
        return r
