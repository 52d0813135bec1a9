"""The dashboard's view: ipywidgets that render a `DashboardModel`, and `LiveDashboard`, which
refreshes them from a background thread (about 1 Hz) until the app stops or the widget is closed.

Only HTML and Image widgets are updated from the thread (no Output-widget capture), so a refresh
never waits for the kernel and the kernel never waits for a refresh. The layout fits a notebook at
1366 px with JupyterLab's file browser open: panels wrap onto the next line rather than overlap, and
table cells never wrap or clip (`white-space: nowrap`, the panels sized to their tables).
"""
from __future__ import annotations

import functools
import html
import json
import threading
import time
from typing import Callable

import ipywidgets as W

from kernel_ext.dashboard import charts
from kernel_ext.dashboard.model import (DashboardModel, EventFeed, Snapshot, StoreCache, Throttled,
                                        clip, collect, fmt_eta, fmt_num, fmt_rate, fmt_secs,
                                        forecast_by_instance, forecast_data, forecast_seconds,
                                        task_id)

TERMINAL_STATES = {"NOT_RUNNING"}
STATE_COLORS = {"RUNNING": "#2e7d32", "RESTORING": "#ef6c00", "REBALANCING": "#f9a825",
                "CREATED": "#546e7a", "NOT_RUNNING": "#616161", "ERROR": "#c62828",
                "PENDING_SHUTDOWN": "#8d6e63"}
CHIP_COLORS = {"running": "#43a047", "restoring": "#ef6c00", "queued": "#b0bec5", "failed": "#c62828",
               "closed": "#9e9e9e", "unknown": "#cfd8dc"}

CSS = """
<style>
.sk-dash { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; font-size: 12.5px; color: #222; line-height: 1.35; }
.sk-dash * { line-height: 1.35; box-sizing: border-box; }
.sk-head { display: flex; align-items: center; column-gap: 16px; row-gap: 4px; flex-wrap: wrap; padding: 6px 10px;
  background: linear-gradient(90deg, #f7f9fc, #eef3f9); border: 1px solid #dde4ee; border-radius: 8px; }
.sk-title { font-size: 15px; font-weight: 600; white-space: nowrap; }
.sk-badge { color: white; padding: 2px 9px; border-radius: 10px; font-size: 11.5px; font-weight: 600; letter-spacing: .3px; white-space: nowrap; }
.sk-reason { font-size: 11.5px; color: #37474f; max-width: 520px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.sk-reason.bad { color: #b71c1c; font-weight: 600; }
.sk-kpis { display: flex; column-gap: 14px; row-gap: 2px; flex-wrap: wrap; }
.sk-kpi { display: flex; flex-direction: column; line-height: 1.15; white-space: nowrap; }
.sk-kpi b { font-size: 13.5px; font-variant-numeric: tabular-nums; }
.sk-kpi span { font-size: 10px; color: #667; text-transform: uppercase; letter-spacing: .4px; }
.sk-chips { display: flex; flex-wrap: wrap; gap: 4px 6px; margin: 5px 2px 0 2px; }
.sk-chip { display: inline-flex; align-items: center; gap: 3px; font-size: 11px; border: 1px solid #dde4ee; border-radius: 5px; padding: 1px 5px; background: #fff; white-space: nowrap; }
.sk-chip i { font-style: normal; color: white; border-radius: 3px; padding: 0 4px; font-size: 10.5px; }
.sk-chipbar { display: inline-block; width: 42px; height: 7px; background: #eceff3; border-radius: 3px; overflow: hidden; }
.sk-chipbar > span { display: block; height: 100%; }
.sk-chip .bk { color: #ef6c00; font-weight: 600; }
.sk-err { color: #b71c1c; font-size: 12px; margin: 5px 2px 0 2px; padding: 4px 8px; background: #fdecea; border-radius: 5px; border: 1px solid #f5c6c2; overflow-wrap: anywhere; }
.sk-warn { color: #8d6e63; font-size: 11px; margin: 3px 2px 0 2px; overflow-wrap: anywhere; }
.sk-h { font-weight: 600; font-size: 12.5px; margin: 4px 0 4px 2px; color: #333; white-space: nowrap; }
.sk-note { color: #777; font-size: 11px; margin-left: 4px; font-weight: normal; }
table.sk { border-collapse: collapse; font-variant-numeric: tabular-nums; }
table.sk th { text-align: right; font-weight: 600; color: #555; border-bottom: 1px solid #ccd; padding: 3px 6px; font-size: 11px; background: #fafbfd; white-space: nowrap; }
table.sk td { text-align: right; padding: 2px 6px; border-bottom: 1px solid #eef0f3; font-size: 12px; white-space: nowrap; }
table.sk.kv td:nth-child(2) { font-weight: 600; }
table.sk th:first-child, table.sk td:first-child, table.sk td.l, table.sk th.l { text-align: left; }
table.sk tr.standby td, table.sk tr.warmup td { color: #667; font-style: italic; }
table.sk tr.new td { background: #e6f6ea; }
table.sk tr.changed td { background: #fff6d9; }
table.sk tr.dead td { color: #b71c1c; }
table.sk td.lagbad { color: #c62828; font-weight: 600; }
.sk-dot { display: inline-block; width: 8px; height: 8px; border-radius: 4px; margin-right: 4px; }
.sk-bar { background: #eceff3; border-radius: 4px; height: 11px; width: 90px; overflow: hidden; display: inline-block; vertical-align: middle; }
.sk-bar > div { background: linear-gradient(90deg, #ffa726, #ef6c00); height: 100%; }
.sk-bar.done > div { background: linear-gradient(90deg, #66bb6a, #2e7d32); }
.sk-bar.promoted > div { background: #8e7cc3; }
.sk-bar.nothing > div, .sk-bar.moved > div { background: #b0bec5; }
.sk-bar.failed > div, .sk-bar.interrupted > div { background: #c62828; }
.sk-sum { background: #eef8ef; border: 1px solid #cfe8d2; border-radius: 6px; padding: 5px 9px; margin-top: 6px; overflow-wrap: anywhere; }
.sk-fc { background: #f3f6fb; border: 1px solid #dde4ee; border-radius: 6px; padding: 5px 9px; margin-top: 6px; }
.sk-hist td.cur { background: #e3f0ff; font-weight: 600; }
.sk-empty { color: #888; font-style: italic; padding: 6px; white-space: normal; }
.sk-scroll { overflow-x: auto; max-width: 100%; }
.sk-row { column-gap: 14px; row-gap: 6px; }
.sk-moves { white-space: normal; margin: 0 0 0 6px; }
</style>
"""


def _e(x) -> str:
    if isinstance(x, (dict, list)):
        x = json.dumps(x, sort_keys=True, separators=(", ", ": "), default=str, ensure_ascii=False)
    return html.escape(str(x), quote=True)


def _clip_e(x, n: int) -> str:
    """Escaped, clipped text whose title attribute holds the whole of it (escaped too)."""
    raw = x if isinstance(x, str) else (json.dumps(x, sort_keys=True, default=str, ensure_ascii=False)
                                        if isinstance(x, (dict, list)) else str(x))
    short = clip(raw, n)
    if short == " ".join(raw.split()):
        return _e(short)
    return f"<span title='{_e(clip(raw, 2000))}'>{_e(short)}</span>"


def _fmt_value(v) -> str:
    if isinstance(v, float):
        return fmt_num(round(v, 3))
    if isinstance(v, int) and not isinstance(v, bool):
        return fmt_num(v)
    return _clip_e(v, 80)


def _fmt_key(k) -> str:
    if isinstance(k, tuple) and len(k) == 2 and isinstance(k[1], int) and k[1] > 1e11:
        t = time.strftime("%H:%M:%S", time.gmtime(k[1] / 1000))
        return f"{_clip_e(k[0], 40)} <span class='sk-note'>@{t}</span>"
    return _clip_e(k, 40)


def table(headers: list[str], rows: list[list[str]], row_classes: list[str] | None = None,
          left: set[int] = frozenset(), cls: str = "", titles: dict | None = None) -> str:
    titles = titles or {}
    th = "".join(f"<th class='{'l' if i in left else ''}' title='{_e(titles.get(h, ''))}'>{h}</th>"
                 for i, h in enumerate(headers))
    body = []
    for i, r in enumerate(rows):
        rc = row_classes[i] if row_classes else ""
        tds = "".join(f"<td class='{'l' if j in left else ''}'>{c}</td>" for j, c in enumerate(r))
        body.append(f"<tr class='{rc}'>{tds}</tr>")
    return (f"<div class='sk-scroll'><table class='sk {cls}'><thead><tr>{th}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _dash(inner: str) -> str:
    return f"<div class='sk-dash'>{inner}</div>"


# ---------------------------------------------------------------------------------------------
# HTML fragments from the model (pure functions of the model: easy to test and to benchmark)


def render_header(name: str, m: DashboardModel, note: str = "") -> str:
    h = m.header()
    state = h["state"]
    color = STATE_COLORS.get(state, "#455a64")
    rate = h["input_rate"]
    kpis = [("input (5 s)", f"{fmt_num(round(rate)) if isinstance(rate, (int, float)) else '–'} rec/s"),
            ("processed", fmt_num(h["records"])),
            ("batch", f"{fmt_num(h['batch_id'])}" + (f" · {fmt_num(h['batch_ms'])} ms" if h["batch_ms"] is not None else "")),
            ("store rows", fmt_num(h["rows"])),
            ("changelog lag", fmt_num(h["lag"]))]
    if h["instances"] is not None:
        alive, total = h["instances"]
        kpis.append(("instances", f"{alive} alive" + (f" / {total}" if total != alive else "")))
    if h["generation"]:
        kpis.append(("generation", fmt_num(h["generation"])))
    if h.get("state_rows") is not None:  # Spark's own state store: its state operator metrics
        kpis += [("state rows (Spark)", fmt_num(h["state_rows"])),
                 ("state memory", f"{fmt_num(round((h['state_memory_bytes'] or 0) / 1024))} KiB"),
                 ("state commit", f"{fmt_num(h['commit_ms'])} ms")]
    k = "".join(f"<div class='sk-kpi'><b>{v}</b><span>{label}</span></div>" for label, v in kpis)
    reason = h["reason"]
    bad = state == "ERROR"
    rs = (f"<span class='sk-reason{' bad' if bad else ''}' title='{_e(reason)}'>{_e(clip(reason, 160))}</span>"
          if reason else "")
    chips = render_chips(m)
    err = ""
    if bad:
        full = m.snapshot.app_error if m.snapshot and m.snapshot.app_error else m.last_error or reason
        err = f"<div class='sk-err'>⚠ {_e(clip(full, 600))}</div>" if full else ""
    warn = f"<div class='sk-warn'>not shown: {_e(clip(h['error'], 300))}</div>" if h.get("error") else ""
    note = f"<span class='sk-note'>{_e(note)}</span>" if note else ""
    return (f"{CSS}<div class='sk-dash'><div class='sk-head'><span class='sk-title'>{_e(name)}</span>"
            f"<span class='sk-badge' style='background:{color}'>{_e(state)}</span>{rs}"
            f"<div class='sk-kpis'>{k}</div>{note}</div>{chips}{err}{warn}</div>")


def render_chips(m: DashboardModel) -> str:
    chips = m.task_chips()
    if not chips:
        return ""
    out = []
    for c in chips:
        state = c["state"]
        frac = c["fraction"]
        width = 100 if frac is None else max(4, round(100 * frac))
        color = CHIP_COLORS.get(state, "#90a4ae")
        inst = c["instance"]
        badge = (f"<i style='background:{charts.instance_color(inst)}'>{inst}</i>" if inst is not None
                 else "<i style='background:#9e9e9e'>–</i>")
        backlog = f"<span class='bk'>+{c['backlog']}</span>" if c["backlog"] else ""
        title = (f"task {c['task']} · instance {inst if inst is not None else 'none'} · {state}"
                 + (f" · {round(100 * frac)}% restored" if frac is not None else "")
                 + f" · lag {c['lag']:,}" + (f" · {c['backlog']} batch(es) waiting" if c["backlog"] else ""))
        out.append(f"<span class='sk-chip' title='{_e(title)}'><b>{_e(c['task'])}</b>{badge}"
                   f"<span class='sk-chipbar'><span style='width:{width}%;background:{color}'></span></span>"
                   f"{backlog}</span>")
    return f"<div class='sk-chips'>{''.join(out)}</div>"


TASK_TITLES = {
    "store rows": "keys in the task's store (after its last commit)",
    "dirty": "dirty record-cache entries flushed to the changelog at the last commit",
    "offset": "changelog offset of the task's last commit (a replica: the offset it has applied)",
    "changelog end": "end offset of the task's changelog partition",
    "lag": "changelog end - offset: what a restore (or a promotion) of this copy would replay",
    "waiting": "micro-batches spooled for the task while it could not process them",
}


def render_tasks(m: DashboardModel) -> str:
    tasks = m.tasks()
    if not tasks:
        return _dash("<div class='sk-empty'>no tasks yet</div>")
    status = (m.snapshot.status or {}) if m.snapshot else {}
    headers = ["task", "instance", "role", "state", "store", "store rows", "dirty", "offset",
               "changelog end", "lag", "waiting"]
    rows, classes = [], []
    for r in tasks:
        lag = r["lag"]
        lag_html = fmt_num(lag) if lag is None or lag < 1000 else f"<span class='lagbad'>{fmt_num(lag)}</span>"
        st = status.get(r["task"]) or {}
        backlog = st.get("backlog") if r["role"] == "active" else None
        rows.append([_e(r["task"]), fmt_num(r["instance"]), r["role"], _e(str(r.get("state") or "–").lower()),
                     _e(r["store"] or "–"), fmt_num(r["rows"]), fmt_num(r["dirty"]), fmt_num(r["checkpoint"]),
                     fmt_num(r["changelog_end"]), lag_html, fmt_num(backlog) if backlog else ""])
        classes.append(r["role"])
    return _dash(table(headers, rows, classes, left={2, 3, 4}, titles=TASK_TITLES))


def render_store(m: DashboardModel) -> str:
    store = m.store
    rows = m.store_rows()
    total = len(m.snapshot.stores.get(store, {})) if m.snapshot and store else 0
    changed = m.changed_count(store)
    held = sum(r["rows"] or 0 for r in (m.snapshot.tasks if m.snapshot else [])
               if r["role"] == "active" and r["store"] == store)
    of = f" of {fmt_num(held)}" if held > total else ""
    head = (f"<div class='sk-h'>Store <code>{_e(store or '–')}</code>"
            f"<span class='sk-note'>{fmt_num(total)} rows read{of} · {changed} changed since last refresh · "
            f"top {m.top_k} by {m.sort_by}{' among them' if of else ''}</span></div>")
    if not rows:
        return _dash(f"{head}<div class='sk-empty'>no rows yet</div>")
    body = [[_fmt_key(r.key), _fmt_value(r.value), {"new": "new", "changed": "changed"}.get(r.status, "")]
            for r in rows]
    t = table(["key", "value", ""], body, [r.status or "" for r in rows], left={0, 2}, cls="kv")
    shown = {r.key for r in rows}
    d = m.diffs.get(store)
    hidden = sorted((d.touched - shown) if d else set(), key=str)
    more = ""
    if hidden:
        names = ", ".join(_clip_e(k, 30) for k in hidden[:6]) + (" …" if len(hidden) > 6 else "")
        more = (f"<div class='sk-note' style='margin-top:3px'>also changed, outside the top {m.top_k}: "
                f"{names}</div>")
    return _dash(f"{head}{t}{more}")


def _forecast_eta(rnd, forecast, row) -> float | None:
    """Seconds until ``row``'s task is restored, from the forecast made before the round, while the
    round has no rate of its own yet: what is left of the task restoring on its instance (tasks
    open one at a time), the queued tasks ahead of it, and its own."""
    def left(r):
        fc = forecast_seconds(forecast, r.task, r.source, r.total) if forecast else None
        return None if fc is None else fc * (1.0 - r.fraction)

    mine = left(row)
    if mine is None:
        return None
    if row.status == "restoring":
        return mine
    mates = [r for r in rnd.rows.values() if r.instance == row.instance and r is not row]
    ahead = [r for r in mates if r.status == "restoring" or (
        r.status == "queued" and (r.queued_at or 0, r.task) < (row.queued_at or 0, row.task))]
    others = [left(r) for r in ahead]
    return None if any(x is None for x in others) else mine + sum(others)


def render_restore_table(rnd, forecast=None) -> str:
    """The rows of one restore round (also what the replay shows at its cursor)."""
    rows = rnd.ordered()
    with_fc = bool(forecast and forecast.get("rows"))
    headers = ["task", "instance", "from", "progress", "replayed / to replay", "rate", "ETA", "status"]
    if with_fc:
        headers.insert(7, "forecast")
    body, classes = [], []
    for r in rows:
        pct = 100 * r.fraction
        bar = (f"<span class='sk-bar {r.status}' title='{pct:.0f}%'>"
               f"<div style='width:{pct:.1f}%'></div></span>")
        total = r.total
        replayed = f"{fmt_num(r.restored)} / {fmt_num(total)}" if total is not None or r.restored else "–"
        if r.status in ("nothing",):
            replayed = "0 / 0"
        if r.status == "done":
            eta = f"took {fmt_secs(r.seconds)}"
        elif r.status == "restoring":
            q = rnd.eta(r)
            if q is None:      # no progress report yet in this round: what the forecast says is left
                q = _forecast_eta(rnd, forecast, r)
                eta = "–" if q is None else f"≈ {fmt_eta(q)}"
            else:
                eta = fmt_eta(q)
        elif r.status == "queued":
            q = rnd.eta(r)
            if q is None:
                q = _forecast_eta(rnd, forecast, r)
            eta = "–" if q is None else fmt_eta(q) if q < 1 else f"≈ {fmt_eta(q)}"
        else:
            eta = "–"
        line = [_e(r.task), fmt_num(r.instance), _e(r.source), bar, replayed, fmt_rate(r.rate), eta,
                _e(r.label) + (f" <span title='{_e(r.error)}'>⚠</span>" if r.error else "")]
        if with_fc:
            fc = forecast_seconds(forecast, r.task, r.source, r.total)
            line.insert(7, f"≈ {fmt_secs(fc)}" if fc is not None else "–")
        body.append(line)
        classes.append("dead" if r.status in ("failed", "interrupted") else "")
    return table(headers, body, classes, left={2, len(headers) - 1},
                 titles={"from": "checkpoint: local state, replays its tail; standby / warmup: a promoted "
                                 "replica, replays its lag; scratch: the whole changelog",
                         "forecast": "the restore forecast made before this round began",
                         "rate": "records/s over the last progress reports (when done: the average)"})


def render_forecast(m: DashboardModel) -> str:
    by = forecast_by_instance(m.forecast)
    if not by:
        return ""
    lines = []
    for f in by:
        if f["line"]:
            lines.append(f"<li>{_e(f['line'])}</li>")
            continue
        sb = f", {fmt_secs(f['standby_s'])} from its standbys" if f["standby_s"] is not None else ""
        lines.append(f"<li>if instance {f['instance']} died now: ≈ {fmt_secs(f['scratch_s'])} from scratch "
                     f"for {_e(', '.join(t for t in f['tasks'] if t))}{sb}</li>")
    when = time.strftime("%H:%M:%S", time.localtime(m.forecast_at)) if m.forecast_at else ""
    return (f"<div class='sk-fc'><b>Restore forecast</b><span class='sk-note'>{when} · the records in "
            f"the compacted changelogs at the rate restores run here</span>"
            f"<ul style='margin:2px 0 0 0;padding-left:18px'>{''.join(lines)}</ul></div>")


def render_restore(m: DashboardModel) -> str:
    rnd = m.restores.current
    head = "<div class='sk-h'>Restoration"
    if rnd is None:
        fc = render_forecast(m)
        if m.snapshot is not None and not m.snapshot.has_events:
            hint = ("<div class='sk-empty'>Spark's own state store restores inside Spark: its load "
                    "figures are in <code>app.restore_report()</code> (notebook 09)</div>")
        else:
            hint = ("<div class='sk-empty'>no task has opened yet: tasks are listed here from the moment "
                    "they are assigned (queued, restoring, done)</div>")
        return _dash(f"{head}</div>{hint}{fc}")
    when = time.strftime("%H:%M:%S", time.localtime(rnd.started))
    throttle = max((r.throttle or 0 for r in rnd.rows.values()), default=0)
    note = f"round began {when}" + (f" · generation {rnd.generation}" if rnd.generation else "")
    if throttle:
        note += f" · throttled to {throttle:,.0f} records/s (restart --restore-rate)"
    fc_before = m.round_forecast(rnd)
    t = render_restore_table(rnd, fc_before[1] if fc_before else None)
    summary = ""
    s = rnd.summary()
    if s is not None:
        extra = ""
        if fc_before and s.restored_tasks:
            fcs = [forecast_seconds(fc_before[1], task, r.source, r.restored) for task, r in rnd.rows.items()
                   if r.status == "done" and r.restored]
            fcs = [x for x in fcs if x is not None]
            if fcs:
                extra = f" · forecast before: ≈ {fmt_secs(sum(fcs))} of replay"
        summary = f"<div class='sk-sum'>✔ {_e(s.line())}{_e(extra)}</div>"
    fc = render_forecast(m) if rnd.final else ""
    return _dash(f"{head}<span class='sk-note'>{_e(note)}</span></div>{t}{summary}{fc}")


MOVE_REASONS = {"owner-died": "its instance died", "owner-leaving": "its instance is leaving",
                "warmup-caught-up": "a warmup caught up", "balance": "balance"}


def render_moves(m: DashboardModel) -> str:
    """The chart's words: the latest tasks that moved, and why (also what a screen reader gets)."""
    own = m.ownership
    if not own.segments:
        return ""
    if not own.last_moves:
        return _dash("<div class='sk-note'>no task has moved yet</div>")
    when = time.strftime("%H:%M:%S", time.localtime(own.last_moves_at))
    moves = ", ".join(f"{_e(mv.get('task'))} {_e(mv.get('from'))}→{_e(mv.get('to'))}"
                      f" ({_e(MOVE_REASONS.get(mv.get('reason'), mv.get('reason') or ''))})"
                      for mv in own.last_moves[:6]) + (" …" if len(own.last_moves) > 6 else "")
    return _dash(f"<div class='sk-note sk-moves'>latest move{'s' if len(own.last_moves) > 1 else ''} "
                 f"(generation {_e(own.last_moves_generation)}, {when}): {moves} · {own.moves} move(s) "
                 f"so far</div>")


INSTANCE_STATUS_COLORS = {"alive": "#43a047", "leaving": "#f9a825", "dead": "#c62828", "stopped": "#9e9e9e"}


def render_instances(m: DashboardModel) -> str:
    rows = m.instance_rows()
    if not rows:
        return ""
    alive = sum(r["status"] in ("alive", "leaving") for r in rows)
    dead = sum(r["status"] == "dead" for r in rows)
    head = (f"<div class='sk-h'>Instances<span class='sk-note'>{alive} alive"
            + (f", {dead} dead" if dead else "") + "</span></div>")
    body, classes = [], []
    for r in rows:
        dot = f"<span class='sk-dot' style='background:{INSTANCE_STATUS_COLORS.get(r['status'], '#999')}'></span>"
        sw = f"<span class='sk-dot' style='background:{charts.instance_color(r['instance'])};border-radius:2px'></span>"
        body.append([f"{sw}{fmt_num(r['instance'])}", f"{dot}{_e(r['status'])}",
                     _e(" ".join(r["active"]) or "–"), _e(" ".join(r["standby"]) or "–"),
                     _e(" ".join(r["warmup"]) or "–"),
                     fmt_rate(r["rate"]) if r["status"] in ("alive", "leaving") else "–"])
        classes.append("dead" if r["status"] == "dead" else "")
    t = table(["instance", "status", "active", "standby", "warmup", "committed"], body, classes,
              left={0, 1, 2, 3, 4},
              titles={"committed": "input records its tasks committed per second, last 5 s"})
    return _dash(f"{head}{t}")


CHANGELOG_TITLES = {
    "start": "log start offset", "end": "end offset (high watermark)",
    "in log": "records still in the log (what a restore from scratch reads)",
    "live keys": "keys in the task's store", "dirty": "share of the log the cleaner has not compacted yet",
    "cleaner runs": "log cleaner passes over this partition", "removed": "records the cleaner removed",
}


def render_changelog(m: DashboardModel) -> str:
    rows = m.changelog_rows()
    if not rows:
        return _dash("<div class='sk-empty'>no changelog figures (shown for the embedded broker)</div>")
    out = []
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
    return _dash("".join(out))


def render_events(m: DashboardModel, n: int = 14) -> str:
    evs = list(m.events)[-n:][::-1]
    if not evs:
        return _dash("<div class='sk-empty'>no events yet</div>")
    body = []
    for e in evs:
        d = e.to_dict() if hasattr(e, "to_dict") else dict(e)
        kind = d.pop("type", "?")
        ts = d.pop("ts", None)
        for k in ("app", "pid", "offset"):
            d.pop(k, None)
        d = {k: v for k, v in d.items() if v not in (None, "", [], {})}
        when = time.strftime("%H:%M:%S", time.localtime(ts)) if isinstance(ts, (int, float)) else ""
        body.append([when, _e(kind), _clip_e(d, 110)])
    note = "<div class='sk-note'>the latest first; commits and restore progress are not listed</div>"
    return _dash(table(["time", "event", "details"], body, left={1, 2}) + note)


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


class RestoreReplay:
    """The restore timeline of a round, and a replay of it: a slider (and a play button) over the
    round's seconds; at each position the timeline has a cursor and the table below shows every
    task as it was then (`RestoreRound.at`)."""

    STEP = 0.1  # seconds per slider step

    def __init__(self, model: DashboardModel):
        lay = W.Layout
        self.model = model
        self.rounds = W.Dropdown(options=[], layout=lay(width="250px"), description="round",
                                 style={"description_width": "42px"})
        self.slider = W.IntSlider(value=0, min=0, max=1, description="t (0.1 s)", readout=False,
                                  continuous_update=True, layout=lay(width="260px"),
                                  style={"description_width": "62px"})
        self.play = W.Play(value=0, min=0, max=1, step=1, interval=100, layout=lay(width="90px"))
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.clock = W.HTML()
        self.image = W.Image(format="png", layout=lay(max_width="100%"))
        self.table = W.HTML()
        self.root = W.VBox([W.HBox([self.rounds, self.play, self.slider, self.clock],
                                   layout=lay(flex_flow="row wrap", align_items="center")),
                            self.image, self.table])
        self._sig = None
        self._replaying = False
        self.rounds.observe(self._on_round, names="value")
        self.slider.observe(self._on_slider, names="value")

    def _round(self):
        rs = self.model.restores.rounds
        i = self.rounds.value
        return rs[i] if isinstance(i, int) and 0 <= i < len(rs) else (rs[-1] if rs else None)

    def refresh(self, force: bool = False) -> None:
        """Follow the latest round (cheap when nothing changed)."""
        rs = self.model.restores.rounds
        opts = [(f"{time.strftime('%H:%M:%S', time.localtime(r.started))} · {len(r.rows)} task(s)"
                 + ("" if r.final else " · running"), i) for i, r in enumerate(rs)]
        if opts != list(self.rounds.options):
            follow = self.rounds.value is None or self.rounds.value == len(self.rounds.options) - 1
            self.rounds.options = opts
            if follow and opts:
                self.rounds.value = opts[-1][1]
        rnd = self._round()
        sig = (id(rnd), len(rnd.events) if rnd else 0, rnd.final if rnd else None)
        if sig == self._sig and not force:
            return
        self._sig = sig
        end = self._end(rnd)
        steps = max(1, int(round((end - rnd.started) / self.STEP)) + 1) if rnd else 1
        self.play.max = self.slider.max = steps
        if not self._replaying:
            self.slider.value = steps
            self._draw(rnd, None)

    @staticmethod
    def _end(rnd) -> float:
        if rnd is None:
            return 0.0
        end = rnd.finished or rnd.started
        for r in rnd.rows.values():
            for t in (r.finished, r.started, r.queued_at):
                if t is not None:
                    end = max(end, t)
        return end if rnd.final else max(end, time.time())

    def _draw(self, rnd, cursor: float | None) -> None:
        view = rnd.at(rnd.started + cursor) if (rnd is not None and cursor is not None) else rnd
        end = self._end(rnd)
        self.image.value = charts.to_png(charts.restore_timeline_figure(
            rnd, cursor=cursor, now=end if not (rnd and rnd.final) else None), dpi=90)
        if view is None:
            self.table.value = CSS + _dash("<div class='sk-empty'>no restore yet</div>")
            self.clock.value = ""
            return
        self.table.value = CSS + _dash(render_restore_table(view))
        at = cursor if cursor is not None else (end - rnd.started)
        self.clock.value = f"<span class='sk-note'>t = {at:.1f} s of {end - rnd.started:.1f} s</span>"

    def _on_round(self, change) -> None:
        self._sig = None
        self._replaying = False
        self.refresh(force=True)

    def _on_slider(self, change) -> None:
        rnd = self._round()
        if rnd is None:
            return
        self._replaying = change["new"] < self.slider.max
        self._draw(rnd, change["new"] * self.STEP if self._replaying else None)


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
        self.lag = W.Image(format="png", layout=lay(width="441px", height="auto", flex="0 0 auto"))
        self.ownership = W.Image(format="png", layout=lay(width="441px", height="auto"))
        self.moves = W.HTML(layout=lay(width="441px"))
        self.ownership_box = W.VBox([self.ownership, self.moves], layout=lay(flex="0 0 auto", width="441px"))
        self.restore = W.HTML(layout=lay(flex="1 1 640px", min_width="0", width="auto"))
        self.instances = W.HTML(layout=lay(flex="1 1 320px", min_width="0", width="auto"))
        self.tasks = W.HTML(layout=lay(width="100%"))
        self.store = W.HTML(layout=lay(width="100%"))
        self.changelog = W.HTML(layout=lay(width="100%"))
        self.events = W.HTML(layout=lay(width="100%"))
        self.topology = W.Image(format="png", layout=lay(max_width="100%"))
        self.replay = RestoreReplay(model)
        self.store_pick = W.Dropdown(options=[], layout=lay(width="150px"))
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

        wrap = dict(flex_flow="row wrap", align_items="flex-start", width="100%")
        self.charts = W.HBox([self.lag, self.ownership_box], layout=lay(margin="6px 0 0 0", **wrap))
        self.panels = W.HBox([self.restore, self.instances], layout=lay(**wrap))
        for box in (self.charts, self.panels):
            box.add_class("sk-row")  # gaps between wrapped panels (CSS below)
        controls = W.HBox([self.store_pick, self.sort, self.filter],
                          layout=lay(align_items="center", flex_flow="row wrap"))
        store_tab = W.VBox([controls, self.store])
        self.tabs = W.Tab(children=[self.tasks, store_tab, self.changelog, self.replay.root, self.topology,
                                    self.history.root, self.events], layout=lay(margin="6px 0 0 0"))
        for i, t in enumerate(("Tasks", "Store", "Changelog", "Restore timeline", "Topology",
                               "Key history", "Events")):
            self.tabs.set_title(i, t)
        self.tabs.observe(lambda _c: self._render_tab(), names="selected_index")
        footer = W.HBox([self.stop_button, self.status], layout=lay(align_items="center"))
        self.root = W.VBox([self.header, self.charts, self.panels, self.tabs, footer],
                           layout=lay(width="100%", padding="4px"))
        self.root.add_class("statekit-dashboard")
        self._stopped = False
        self._last_lag_png = None
        self._own_sig = None
        self._own_at = 0.0
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
        self.tabs.selected_index = 5
        self.history.load(store, key)

    # -- rendering ------------------------------------------------------------------------------

    def set_topology(self, nodes, edges):
        self.topology.value = charts.to_png(charts.topology_figure(nodes, edges, title=f"{self.name}: topology"), dpi=90)

    def render_header(self, m: DashboardModel | None = None, note: str = "") -> None:
        self.header.value = render_header(self.name, m or self.model, note)

    def _render_tab(self) -> None:
        m = self.model
        i = self.tabs.selected_index
        if i == 0:
            self.tasks.value = render_tasks(m)
        elif i == 2:
            self.changelog.value = render_changelog(m)
        elif i == 3:
            self.replay.refresh()
        elif i == 6:
            self.events.value = render_events(m)

    def render(self, m: DashboardModel | None = None, note: str = "", charts_too: bool = True) -> None:
        m = m or self.model
        self.header.value = render_header(self.name, m, note)
        names = m.store_names()
        if list(self.store_pick.options) != names:
            self.store_pick.options = names
            if m.store in names:
                self.store_pick.value = m.store
            self.history.set_stores(names)
        self.store.value = render_store(m)  # always: the "changed since the last refresh" marks
        self.restore.value = render_restore(m)
        inst = render_instances(m)
        self.instances.value = inst
        self.instances.layout.display = None if inst else "none"
        self._render_tab()
        if charts_too:
            png = self._lag_chart.png(m.lag_series(), m.lag_series(standby=True), m.chart_markers())
            if png is not None and png != self._last_lag_png:
                self.lag.value = png
                self._last_lag_png = png
            self._render_ownership(m)

    def _render_ownership(self, m: DashboardModel) -> None:
        """Redrawn when the ownership changed, else every 5 s while the app runs (the bars grow)."""
        own = m.ownership
        if not own.segments:
            self.ownership_box.layout.display = "none"
            return
        self.ownership_box.layout.display = None
        self.moves.value = render_moves(m)
        now = m.snapshot.t if m.snapshot else time.time()
        sig = own.version
        running = m.snapshot is not None and m.snapshot.state in ("RUNNING", "RESTORING", "REBALANCING")
        if sig == self._own_sig and (not running or now - self._own_at < 5.0):
            return
        self._own_sig, self._own_at = sig, now
        t0 = min(x for x in (m.t0, own.t0) if x is not None)
        fig = charts.ownership_figure(own, t0, now)
        FigureCanvas = charts.FigureCanvasAgg
        canvas = FigureCanvas(fig)
        canvas.draw()
        self.ownership.value = charts.encode_canvas(canvas)

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


def _no_wait(forecast):
    """``restore_forecast`` as a refresh calls it: never waiting for a quiet machine to calibrate
    on (the forecast of a busy machine stands until a quiet one is measured)."""
    import inspect

    if not callable(forecast):
        return None
    try:
        takes = "settle" in inspect.signature(forecast).parameters
    except (TypeError, ValueError):
        takes = False
    return functools.partial(forecast, settle=0.0) if takes else forecast


class LiveDashboard:
    """Snapshot → model → view, every `interval` seconds, in a daemon thread.

    Stops when the app is stopped (NOT_RUNNING), when the view is closed or its stop button is
    pressed, or on `stop()`; in ERROR it keeps the last picture and goes on refreshing the light
    panels, so a `restart()` from Python shows up too. `refresh()` does one round synchronously
    (tests, the benchmark); `follow()` restarts the refresh thread after it stopped."""

    def __init__(self, app, name: str | None = None, interval: float = 1.0, top: int = 15,
                 history_fn: Callable | None = None, changelog_fn: Callable | None = None,
                 stores: list[str] | None = None, max_rows: int = 2000, view: bool = True,
                 heavy_interval: float = 5.0):
        self.app = app
        self.name = name or getattr(app, "name", "app")
        self.interval = interval
        self.model = DashboardModel(top_k=top)
        self.feed = EventFeed(app)
        # changelog figures scan the broker's segments: every few seconds, not every refresh
        self.changelog_fn = Throttled(changelog_fn, heavy_interval) if changelog_fn is not None else None
        fc = _no_wait(getattr(app, "restore_forecast", None))   # reads the changelogs: every 5 s
        self.forecast_fn = Throttled(lambda: forecast_data(fc()), heavy_interval) if callable(fc) else None
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
        snap = collect(self.app, stores=self.stores, max_rows=self.max_rows, events=self.feed,
                       changelog=self.changelog_fn, cache=self.store_cache,
                       forecast=None if self.model.restoring else self.forecast_fn)
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
                                             f"{clip(err, 200)}")
                    except Exception:
                        pass
                if failures >= 30:
                    reason = f"stopped after {failures} failed refreshes ({type(err).__name__}: {clip(err, 200)})"
                    break
            if self.view is not None and self.view.closed:
                reason = "the dashboard was closed"
                break
            if terminal_seen >= 2:
                reason = f"the app is {self.model.snapshot.state}"
                break
            self._stop.wait(max(0.05, self.interval - (time.monotonic() - started)))
        self.stop_reason = reason
        self.feed.close()
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
            self.feed.resume()
            if self.view is not None:
                self.view._stopped = False
                self.view.stop_button.disabled = False
            self._thread = threading.Thread(target=self._loop, name=f"statekit-dashboard-{self.name}",
                                            daemon=True)
            self._thread.start()
        return self

    follow = start

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.feed.close()

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
