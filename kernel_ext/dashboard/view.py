"""The dashboard's view: ipywidgets that render a `DashboardModel`, and `LiveDashboard`, which
refreshes them from a background thread (about 1 Hz) until the app stops or the widget is closed.

Only HTML and Image widgets are updated from the thread (no Output-widget capture), so a refresh
never waits for the kernel and the kernel never waits for a refresh.
"""
from __future__ import annotations

import html
import json
import threading
import time
from typing import Callable

import ipywidgets as W

from kernel_ext.dashboard import charts
from kernel_ext.dashboard.model import (DashboardModel, EventCursor, Snapshot, StoreCache, Throttled,
                                        collect, fmt_eta, fmt_num)

TERMINAL_STATES = {"NOT_RUNNING", "ERROR", "STOPPED", "DEAD", "CRASHED", "FAILED"}
STATE_COLORS = {"RUNNING": "#2e7d32", "RESTORING": "#ef6c00", "REBALANCING": "#ef6c00",
                "CREATED": "#546e7a", "STARTING": "#546e7a", "NOT_RUNNING": "#616161",
                "ERROR": "#c62828", "CRASHED": "#c62828", "PENDING_SHUTDOWN": "#8d6e63"}

CSS = """
<style>
.sk-dash { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; font-size: 12.5px; color: #222; line-height: 1.35; }
.sk-dash * { line-height: 1.35; }
.sk-head { display: flex; align-items: center; gap: 18px; flex-wrap: wrap; padding: 8px 12px;
  background: linear-gradient(90deg, #f7f9fc, #eef3f9); border: 1px solid #dde4ee; border-radius: 8px; }
.sk-title { font-size: 15px; font-weight: 600; }
.sk-badge { color: white; padding: 2px 9px; border-radius: 10px; font-size: 11.5px; font-weight: 600; letter-spacing: .3px; }
.sk-kpi { display: flex; flex-direction: column; line-height: 1.15; }
.sk-kpi b { font-size: 14px; font-variant-numeric: tabular-nums; }
.sk-kpi span { font-size: 10.5px; color: #667; text-transform: uppercase; letter-spacing: .4px; }
.sk-err { color: #b71c1c; font-size: 11.5px; margin-top: 4px; }
.sk-h { font-weight: 600; font-size: 12.5px; margin: 4px 0 4px 2px; color: #333; }
.sk-note { color: #777; font-size: 11px; margin-left: 4px; }
table.sk { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
table.sk th { text-align: right; font-weight: 600; color: #555; border-bottom: 1px solid #ccd; padding: 3px 7px; font-size: 11px; background: #fafbfd; white-space: nowrap; }
table.sk td { text-align: right; padding: 2px 7px; border-bottom: 1px solid #eef0f3; font-size: 12px; }
table.sk.kv { width: auto; min-width: 380px; }
table.sk.kv td:nth-child(2) { font-weight: 600; }
table.sk th:first-child, table.sk td:first-child, table.sk td.l, table.sk th.l { text-align: left; }
table.sk tr.standby td { color: #667; font-style: italic; }
table.sk tr.new td { background: #e6f6ea; }
table.sk tr.changed td { background: #fff6d9; }
table.sk td.lagbad { color: #c62828; font-weight: 600; }
.sk-bar { background: #eceff3; border-radius: 4px; height: 12px; width: 100%; overflow: hidden; }
.sk-bar > div { background: linear-gradient(90deg, #ffa726, #ef6c00); height: 100%; }
.sk-bar.done > div { background: linear-gradient(90deg, #66bb6a, #2e7d32); }
.sk-sum { background: #eef8ef; border: 1px solid #cfe8d2; border-radius: 6px; padding: 6px 9px; margin-top: 6px; }
.sk-hist td.cur { background: #e3f0ff; font-weight: 600; }
.sk-empty { color: #888; font-style: italic; padding: 6px; }
</style>
"""


def _e(x) -> str:
    if isinstance(x, (dict, list)):
        x = json.dumps(x, sort_keys=True, separators=(", ", ": "))
    return html.escape(str(x))


def _fmt_value(v) -> str:
    if isinstance(v, float):
        return fmt_num(round(v, 3))
    if isinstance(v, int) and not isinstance(v, bool):
        return fmt_num(v)
    s = _e(v)
    return s if len(s) < 90 else s[:87] + "…"


def _fmt_key(k) -> str:
    if isinstance(k, tuple) and len(k) == 2 and isinstance(k[1], int) and k[1] > 1e11:
        t = time.strftime("%H:%M:%S", time.gmtime(k[1] / 1000))
        return f"{_e(k[0])} <span class='sk-note'>@{t}</span>"
    return _e(k)


def table(headers: list[str], rows: list[list[str]], row_classes: list[str] | None = None,
          left: set[int] = frozenset(), cls: str = "", titles: dict | None = None) -> str:
    titles = titles or {}
    th = "".join(f"<th class='{'l' if i in left else ''}' title='{_e(titles.get(h, ''))}'>{h}</th>"
                 for i, h in enumerate(headers))
    body = []
    for i, r in enumerate(rows):
        cls = row_classes[i] if row_classes else ""
        tds = "".join(f"<td class='{'l' if j in left else ''}'>{c}</td>" for j, c in enumerate(r))
        body.append(f"<tr class='{cls}'>{tds}</tr>")
    return f"<table class='sk {cls}'><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


# ---------------------------------------------------------------------------------------------
# HTML fragments from the model (pure functions of the model: easy to test and to benchmark)


def render_header(name: str, m: DashboardModel, note: str = "") -> str:
    h = m.header()
    color = STATE_COLORS.get(h["state"], "#455a64")
    rate = h["input_rate"]
    kpis = [
        ("input", f"{fmt_num(round(rate, 1)) if isinstance(rate, (int, float)) else '–'} rec/s"),
        ("processed", fmt_num(h["records"])),
        ("last batch", f"{fmt_num(h['batch_ms'])} ms" if h["batch_ms"] is not None else "–"),
        ("batch", fmt_num(h["batch_id"])),
        ("store rows", fmt_num(h["rows"])),
        ("changelog lag", fmt_num(h["lag"])),
    ]
    if h.get("state_rows") is not None:  # Spark's own state store: its state operator metrics
        kpis += [("state rows (Spark)", fmt_num(h["state_rows"])),
                 ("state memory", f"{fmt_num(round((h['state_memory_bytes'] or 0) / 1024))} KiB"),
                 ("state commit", f"{fmt_num(h['commit_ms'])} ms")]
    k = "".join(f"<div class='sk-kpi'><b>{v}</b><span>{label}</span></div>" for label, v in kpis)
    err = f"<div class='sk-err'>{_e(h['error'])}</div>" if h.get("error") else ""
    note = f"<span class='sk-note'>{_e(note)}</span>" if note else ""
    return (f"{CSS}<div class='sk-dash'><div class='sk-head'><span class='sk-title'>{_e(name)}</span>"
            f"<span class='sk-badge' style='background:{color}'>{_e(h['state'])}</span>{k}{note}</div>{err}</div>")


TASK_TITLES = {
    "store rows": "keys in the task's store (after its last commit)",
    "dirty cache": "dirty record-cache entries flushed to the changelog at the last commit",
    "checkpoint": "changelog offset in the task's .checkpoint (or a standby's applied offset)",
    "changelog end": "end offset of the task's changelog partition",
    "lag": "changelog end - checkpoint: what a restore of this copy would replay",
    "standby lag": "what a promotion of this standby would replay",
}


def render_tasks(m: DashboardModel) -> str:
    tasks = m.tasks()
    if not tasks:
        return "<div class='sk-dash'><div class='sk-h'>Tasks</div><div class='sk-empty'>no tasks yet</div></div>"
    standby = any(r["role"] == "standby" or r["standby_lag"] is not None for r in tasks)
    states = any(r.get("state") for r in tasks)
    headers = ["task", "instance", "role", "store", "store rows", "dirty cache", "checkpoint",
               "changelog end", "lag"] + (["standby lag"] if standby else []) + (["state"] if states else [])
    rows, classes = [], []
    for r in tasks:
        lag = r["lag"]
        lag_html = fmt_num(lag) if lag is None or lag < 1000 else f"<span class='lagbad'>{fmt_num(lag)}</span>"
        row = [fmt_num(r["task"]), fmt_num(r["instance"]), r["role"], _e(r["store"] or "–"),
               fmt_num(r["rows"]), fmt_num(r["dirty"]), fmt_num(r["checkpoint"]),
               fmt_num(r["changelog_end"]), lag_html]
        if standby:
            row.append(fmt_num(r["standby_lag"] if r["standby_lag"] is not None else
                               (r["lag"] if r["role"] == "standby" else None)))
        if states:
            row.append(_e((r.get("state") or "").lower() or "–"))
        rows.append(row)
        classes.append(r["role"])
    t = table(headers, rows, classes, left={2, 3, len(headers) - 1} if states else {2, 3}, titles=TASK_TITLES)
    return f"<div class='sk-dash'><div class='sk-h'>Tasks</div>{t}</div>"


def render_store(m: DashboardModel) -> str:
    store = m.store
    rows = m.store_rows()
    total = len(m.snapshot.stores.get(store, {})) if m.snapshot and store else 0
    changed = m.changed_count(store)
    head = (f"<div class='sk-h'>Store <code>{_e(store or '–')}</code>"
            f"<span class='sk-note'>{fmt_num(total)} rows read · {changed} changed since last refresh · "
            f"top {m.top_k} by {m.sort_by}</span></div>")
    if not rows:
        return f"<div class='sk-dash'>{head}<div class='sk-empty'>no rows yet</div></div>"
    body = [[_fmt_key(r.key), _fmt_value(r.value), {"new": "new", "changed": "changed"}.get(r.status, "")]
            for r in rows]
    t = table(["key", "value", ""], body, [r.status or "" for r in rows], left={0, 2}, cls="kv")
    shown = {r.key for r in rows}
    d = m.diffs.get(store)
    hidden = sorted((d.touched - shown) if d else set(), key=str)
    more = ""
    if hidden:
        names = ", ".join(_e(k) for k in hidden[:6]) + (" …" if len(hidden) > 6 else "")
        more = (f"<div class='sk-note' style='margin-top:3px'>also changed, outside the top {m.top_k}: "
                f"{names}</div>")
    return f"<div class='sk-dash'>{head}{t}{more}</div>"


def render_restore(m: DashboardModel) -> str:
    rows = m.restore_rows()
    head = "<div class='sk-h'>Restoration</div>"
    if not rows:
        return f"<div class='sk-dash'>{head}<div class='sk-empty'>nothing restored yet: crash the app, then restart it</div></div>"
    body = []
    for r in rows:
        pct = 100 * r.fraction
        bar = f"<div class='sk-bar{' done' if r.done else ''}'><div style='width:{pct:.1f}%'></div></div>"
        rate = f"{fmt_num(round(r.rate))}/s" if r.rate else "–"
        body.append([fmt_num(r.task), _e(r.store or "–"), bar,
                     f"{fmt_num(r.restored)} / {fmt_num(r.total)}", rate,
                     "done" if r.done else fmt_eta(r.eta), _e(r.source or "–")])
    t = table(["task", "store", "progress", "restored / total", "rate", "ETA", "from"], body, left={1, 6})
    summary = ""
    if m.restore_summary is not None:
        summary = f"<div class='sk-sum'>✔ {_e(m.restore_summary.line())}</div>"
    return f"<div class='sk-dash'>{head}{t}{summary}</div>"


CHANGELOG_TITLES = {
    "start": "log start offset", "end": "end offset (high watermark)",
    "in log": "records still in the log (what a restore from scratch reads)",
    "live keys": "keys in the task's store", "dirty": "share of the log the cleaner has not compacted yet",
    "cleaner runs": "log cleaner passes over this partition", "removed": "records the cleaner removed",
}


def render_changelog(m: DashboardModel) -> str:
    rows = m.changelog_rows()
    head = "<div class='sk-h'>Changelog partitions</div>"
    if not rows:
        return (f"<div class='sk-dash'>{head}<div class='sk-empty'>no changelog figures "
                f"(shown for the embedded broker)</div></div>")
    out = [head]
    for topic in sorted({r["topic"] for r in rows}):
        body = []
        for r in (x for x in rows if x["topic"] == topic):
            ratio = f"{100 * r['dirty_ratio']:.0f}%" if isinstance(r["dirty_ratio"], (int, float)) else "–"
            body.append([fmt_num(r["partition"]), fmt_num(r["log_start"]), fmt_num(r["end"]),
                         fmt_num(r["records"]), fmt_num(r["live_keys"]), ratio, fmt_num(r["cleaner_runs"]),
                         fmt_num(r["records_removed"])])
        out.append(f"<div class='sk-note' style='margin:2px 0 1px 2px'><code>{_e(topic)}</code></div>")
        out.append(table(["partition", "start", "end", "in log", "live keys", "dirty", "cleaner runs",
                          "removed"], body, titles=CHANGELOG_TITLES))
    return f"<div class='sk-dash'>{''.join(out)}</div>"


def render_events(m: DashboardModel, n: int = 12) -> str:
    evs = list(m.events)[-n:][::-1]
    if not evs:
        return "<div class='sk-dash'><div class='sk-empty'>no events yet</div></div>"
    body = []
    for e in evs:
        kind = e.get("type") or e.get("event") or e.get("kind") or "?"
        rest = {k: v for k, v in e.items() if k not in ("type", "event", "kind")}
        body.append([_e(kind), _fmt_value(rest)])
    return f"<div class='sk-dash'>{table(['event', 'details'], body, left={0, 1})}</div>"


def _point(p):
    """(offset, value, batch[, committed]) -> a 4-tuple."""
    return (p[0], p[1], p[2], p[3] if len(p) > 3 else True)


def as_of(points: list, offset: int):
    """Index of the latest committed version at or before `offset` (None: no value yet)."""
    best = None
    for i, p in enumerate(points):
        o, _v, _b, committed = _point(p)
        if o > offset:
            break
        if committed:
            best = i
    return best


def render_history(key, points: list, offset: int) -> str:
    """points: [(offset, value-or-None, batch, committed)], the versions of `key` in its changelog
    partition; shows the value as of changelog `offset` and the versions around it."""
    if not points:
        return f"<div class='sk-dash'><div class='sk-empty'>no changelog record for key {_e(key)}</div></div>"
    pts = [_point(p) for p in points]
    idx = as_of(pts, offset)
    if idx is None:
        shown, note = "<i>no value yet</i>", ""
    else:
        o, v, b, _c = pts[idx]
        shown = "<i>deleted</i>" if v is None else _fmt_value(v)
        note = f" · written at offset {fmt_num(o)} by batch {fmt_num(b)}"
    centre = idx if idx is not None else 0
    lo = max(0, min(centre - 4, len(pts) - 9))
    rows, classes = [], []
    for i in range(lo, min(len(pts), lo + 9)):
        o, v, b, c = pts[i]
        rows.append([fmt_num(o), "<i>deleted</i>" if v is None else _fmt_value(v), fmt_num(b),
                     "" if c else "<i>uncommitted (dropped by a restore)</i>"])
        classes.append("cur" if i == idx else "")
    return (f"<div class='sk-dash sk-hist'><div class='sk-h'>{_e(key)} = {shown} "
            f"<span class='sk-note'>as of changelog offset {fmt_num(offset)}{note} · "
            f"{len(pts)} version(s) left in the log</span></div>"
            f"{table(['offset', 'value', 'batch', ''], rows, classes, left={1, 3})}</div>")


# ---------------------------------------------------------------------------------------------
# widgets


class HistoryPanel:
    """A key's value as of any changelog offset, with a slider over the offsets. `history_fn(store,
    key)` returns [(offset, value-or-None, batch, committed)], rebuilt from the changelog by
    `statekit.history`."""

    def __init__(self, history_fn: Callable | None, stores: list[str] | None = None):
        lay = W.Layout
        self.history_fn = history_fn
        self.key = W.Text(placeholder="key", description="key", layout=lay(width="220px"))
        self.store = W.Dropdown(options=list(stores or []), description="store", layout=lay(width="200px"))
        self.button = W.Button(description="load history", icon="history", layout=lay(width="130px"))
        self.slider = W.IntSlider(value=0, min=0, max=0, description="offset", continuous_update=True,
                                  layout=lay(width="460px"), disabled=True)
        self.out = W.HTML(CSS + "<div class='sk-dash'><div class='sk-empty'>type a key and load its "
                          "history, rebuilt from the changelog</div></div>")
        self.points: list = []
        self._key = None
        self.button.on_click(lambda _b: self.load(self.store.value, self._typed_key()))
        self.slider.observe(self._on_slider, names="value")
        self.root = W.VBox([W.HBox([self.store, self.key, self.button]), self.slider, self.out])

    def _typed_key(self):
        return self.key.value.strip()

    def set_stores(self, names):
        if list(self.store.options) != list(names):
            self.store.options = list(names)

    def load(self, store, key):
        if store is None or key in (None, "") or self.history_fn is None:
            return
        if store not in self.store.options:
            self.store.options = sorted(set(list(self.store.options) + [store]))
        self.store.value = store
        self.key.value = str(key)
        try:
            points = list(self.history_fn(store, key))
            if not points and isinstance(key, str) and key.lstrip("-").isdigit():
                points = list(self.history_fn(store, int(key)))  # an int-keyed store
        except Exception as err:  # shown in the panel, one line
            self.out.value = CSS + f"<div class='sk-dash'><div class='sk-err'>{_e(' '.join(str(err).split()))}</div></div>"
            return
        self.points, self._key = points, key
        self.slider.unobserve(self._on_slider, names="value")
        if points:
            lo, hi = points[0][0], points[-1][0]
            self.slider.min, self.slider.max = 0, 0  # avoid min > max while both move
            self.slider.max = hi
            self.slider.min = lo
            self.slider.value = hi
        self.slider.observe(self._on_slider, names="value")
        self.slider.disabled = len(points) <= 1
        self.out.value = CSS + render_history(key, points, self.slider.value)

    def _on_slider(self, change):
        if self._key is not None:
            self.out.value = CSS + render_history(self._key, self.points, change["new"])


class DashboardView:
    """The widget tree. `render(model)` updates it; safe to call from a background thread."""

    def __init__(self, name: str, model: DashboardModel, history_fn: Callable | None = None,
                 on_stop: Callable | None = None, topology: tuple | None = None):
        self.name = name
        self.model = model
        self.history_fn = history_fn
        self._on_stop = on_stop
        lay = W.Layout
        self.header = W.HTML(layout=lay(width="100%"))
        self.tasks = W.HTML(layout=lay(width="100%"))
        self.lag = W.Image(format="png", layout=lay(width="100%", max_width="560px"))
        self.store = W.HTML(layout=lay(width="100%"))
        self.restore = W.HTML(layout=lay(width="100%"))
        self.changelog = W.HTML(layout=lay(width="100%"))
        self.events = W.HTML(layout=lay(width="100%"))
        self.topology = W.Image(format="png", layout=lay(width="100%", max_width="1000px"))
        self.store_pick = W.Dropdown(options=[], layout=lay(width="130px"))
        self.sort = W.ToggleButtons(options=[("by value", "value"), ("recent", "recency"), ("by key", "key")],
                                    value=model.sort_by, style={"button_width": "76px"},
                                    tooltips=["largest values first", "most recently changed first", "key order"])
        self.filter = W.Text(placeholder="filter keys…", layout=lay(width="150px"))
        self.stop_button = W.Button(description="stop refreshing", icon="stop", layout=lay(width="150px"),
                                    button_style="")
        self.status = W.HTML()
        self.history = HistoryPanel(history_fn)

        self.store_pick.observe(self._on_store, names="value")
        self.sort.observe(self._on_sort, names="value")
        self.filter.observe(self._on_filter, names="value")
        self.stop_button.on_click(lambda _b: self.stop())

        controls = W.HBox([self.store_pick, self.sort, self.filter],
                          layout=lay(align_items="center", flex_flow="row wrap"))
        left = W.VBox([self.tasks, controls, self.store], layout=lay(width="58%", padding="0 8px 0 0"))
        right = W.VBox([self.lag, self.restore, self.changelog], layout=lay(width="42%"))
        self.tabs = W.Tab(children=[self.topology, self.history.root, self.events])
        for i, t in enumerate(("Topology", "Key history", "Events")):
            self.tabs.set_title(i, t)
        footer = W.HBox([self.stop_button, self.status], layout=lay(align_items="center"))
        self.root = W.VBox([self.header, W.HBox([left, right], layout=lay(width="100%")), self.tabs, footer],
                           layout=lay(width="100%", padding="4px"))
        self.root.add_class("statekit-dashboard")
        self._stopped = False
        self._last_lag_png = None
        self._lag_chart = charts.LagChart()
        if topology is not None:
            self.set_topology(*topology)

    # -- callbacks ------------------------------------------------------------------------------

    def _on_store(self, change):
        if change["new"]:
            self.model.store = change["new"]
            self.store.value = render_store(self.model)

    def _on_sort(self, change):
        self.model.sort_by = change["new"]
        self.store.value = render_store(self.model)

    def _on_filter(self, change):
        self.model.key_filter = change["new"] or ""
        self.store.value = render_store(self.model)

    def show_history(self, store: str, key):
        """Open the Key history tab on `key`."""
        self.tabs.selected_index = 1
        self.history.load(store, key)

    # -- rendering ------------------------------------------------------------------------------

    def set_topology(self, nodes, edges):
        self.topology.value = charts.to_png(charts.topology_figure(nodes, edges, title=f"{self.name}: topology"), dpi=90)

    def render_header(self, m: DashboardModel | None = None, note: str = "") -> None:
        self.header.value = render_header(self.name, m or self.model, note)

    def render(self, m: DashboardModel | None = None, note: str = "", charts_too: bool = True) -> None:
        m = m or self.model
        self.header.value = render_header(self.name, m, note)
        self.tasks.value = render_tasks(m)
        names = m.store_names()
        if list(self.store_pick.options) != names:
            self.store_pick.options = names
            if m.store in names:
                self.store_pick.value = m.store
            self.history.set_stores(names)
        self.store.value = render_store(m)
        self.restore.value = render_restore(m)
        self.changelog.value = render_changelog(m)
        self.events.value = render_events(m)
        if charts_too:
            png = self._lag_chart.png(m.lag_series(), m.lag_series(standby=True))
            if png is not None and png != self._last_lag_png:
                self.lag.value = png
                self._last_lag_png = png
        if m.restoring and self.tabs.selected_index != 0:
            pass  # the restoration panel is always visible on the right

    def set_status(self, text: str):
        self.status.value = f"<span class='sk-note' style='font-family:sans-serif'>{_e(text)}</span>"

    @property
    def closed(self) -> bool:
        return self._stopped or getattr(self.root, "comm", True) is None

    def stop(self):
        self._stopped = True
        self.stop_button.disabled = True
        if self._on_stop is not None:
            self._on_stop()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.root)


class LiveDashboard:
    """Snapshot → model → view, every `interval` seconds, in a daemon thread.

    Stops when the app reaches a terminal state, when the view is closed or its stop button is
    pressed, or on `stop()`. `refresh()` does one round synchronously (tests, the benchmark)."""

    def __init__(self, app, name: str | None = None, interval: float = 1.0, top: int = 15,
                 history_fn: Callable | None = None, changelog_fn: Callable | None = None,
                 stores: list[str] | None = None, max_rows: int = 2000, view: bool = True,
                 heavy_interval: float = 5.0):
        self.app = app
        self.name = name or getattr(app, "name", "app")
        self.interval = interval
        self.model = DashboardModel(top_k=top)
        self.cursor = EventCursor(app)
        # changelog figures scan the broker's segments: every few seconds, not every refresh
        self.changelog_fn = Throttled(changelog_fn, heavy_interval) if changelog_fn is not None else None
        self.store_cache = StoreCache()  # a store is read again only after a commit
        self.stores = stores
        self.max_rows = max_rows
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0
        self.last_refresh_s = 0.0
        self.cpu_s = 0.0  # CPU time spent refreshing (this thread's), for the benchmark
        self.last_error: str | None = None  # traceback of the last failed refresh
        self.stop_reason: str | None = None
        self.view = None
        if view:
            topo = None
            try:
                plan = getattr(app, "plan", None)
                d = plan.describe(self.name) if plan is not None else app.describe()
                if isinstance(d, dict) and plan is None:
                    d = dict(d, app=self.name)
                topo = charts.graph_from_describe(d)
            except Exception:  # the topology panel stays empty
                topo = None
            self.view = DashboardView(self.name, self.model, history_fn=history_fn, on_stop=self._stop.set,
                                      topology=topo)

    def refresh(self) -> Snapshot:
        t0 = time.perf_counter()
        c0 = time.thread_time()
        snap = collect(self.app, stores=self.stores, max_rows=self.max_rows, events=self.cursor,
                       changelog=self.changelog_fn, cache=self.store_cache)
        self.model.update(snap)
        if self.view is not None:
            self.view.render(self.model)
        self.refreshes += 1
        self.last_refresh_s = time.perf_counter() - t0
        self.cpu_s += time.thread_time() - c0
        return snap

    def _loop(self):
        import traceback

        terminal_seen = 0
        failures = 0
        reason = "stopped"
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                snap = self.refresh()
                failures = 0
                terminal_seen = terminal_seen + 1 if snap.state in TERMINAL_STATES else 0
                if self.view is not None:
                    self.view.set_status(f"refreshed {time.strftime('%H:%M:%S')} · every {self.interval:g} s · "
                                         f"{self.last_refresh_s * 1000:.0f} ms per refresh")
            except Exception as err:  # never let the thread die silently; keep trying
                failures += 1
                self.last_error = traceback.format_exc()
                if self.view is not None:
                    try:
                        self.view.set_status(f"refresh failed ({failures}x): {type(err).__name__}: "
                                             f"{' '.join(str(err).split())[:200]}")
                    except Exception:
                        pass
                if failures >= 30:
                    reason = f"stopped after {failures} failed refreshes ({type(err).__name__}: {err})"
                    break
            if self.view is not None and self.view.closed:
                reason = "the dashboard was closed"
                break
            if terminal_seen >= 2:
                reason = f"the app is {self.model.snapshot.state}"
                break
            self._stop.wait(max(0.05, self.interval - (time.monotonic() - started)))
        self.stop_reason = reason
        if self.view is not None:
            try:
                self.view.stop_button.disabled = True
                self.view.set_status(f"stopped refreshing at {time.strftime('%H:%M:%S')}: {reason} "
                                     f"(`%statekit watch {self.name}` to follow it again)")
            except Exception:
                pass

    def start(self) -> "LiveDashboard":
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"statekit-dashboard-{self.name}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def final(self, state) -> None:
        """After the app stopped: show its last state without querying its (closed) stores."""
        if self.model.snapshot is not None:
            self.model.snapshot.state = str(getattr(state, "value", state))
            self.model.snapshot.error = None
        if self.view is not None:
            self.view.render_header(self.model)
            err = f"; last refresh error: {self.last_error.strip().splitlines()[-1]}" if self.last_error else ""
            self.view.set_status(f"stopped refreshing: the app is {self.model.snapshot.state if self.model.snapshot else state} "
                                 f"(`%statekit start {self.name}` or `restart` to run it again){err}")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.view.root)
