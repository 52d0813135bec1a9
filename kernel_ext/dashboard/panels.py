"""The dashboard's panels as HTML: pure functions of one `model.Picture` (every panel of a refresh
reads the same picture, so no two disagree), easy to test and to benchmark. The layout fits a
notebook at 1366 px with JupyterLab's file browser open: panels wrap onto the next line rather than
overlap, and table cells never wrap or clip (`white-space: nowrap`, the panels sized to their
tables)."""
from __future__ import annotations

import html
import json
import time

from kernel_ext.dashboard import charts
from kernel_ext.dashboard.formats import clip, fmt_eta, fmt_num, fmt_rate, fmt_secs
from kernel_ext.dashboard.forecast import forecast_by_instance, forecast_seconds
from kernel_ext.dashboard.restore import SKIPPED_WHY
from kernel_ext.dashboard.model import DashboardModel, Picture


def _pic(m) -> Picture:
    """A picture of `m` (a model: the picture it gives now)."""
    return m.picture() if isinstance(m, DashboardModel) else m


STATE_COLORS = {"RUNNING": "#2e7d32", "RESTORING": "#ef6c00", "REBALANCING": "#f9a825",
                "CREATED": "#546e7a", "NOT_RUNNING": "#616161", "ERROR": "#c62828",
                "PENDING_SHUTDOWN": "#8d6e63", "WAITING": "#6d4c41"}
CHIP_COLORS = {"running": "#43a047", "restoring": "#ef6c00", "queued": "#b0bec5", "failed": "#c62828",
               "waiting": "#8d6e63",
               "closed": "#9e9e9e", "unknown": "#cfd8dc"}
# a Restoration row's class: red only for a failed task (a promoted or done row of a task whose
# instance died is a success, drawn as one)
ROW_CLASSES = {"failed": "dead", "queued": "waiting"}

CSS = """
<style>
.sk-dash { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; font-size: 12.5px; color: #222; line-height: 1.35; }
.sk-dash * { line-height: 1.35; box-sizing: border-box; }
.sk-head { display: flex; align-items: center; column-gap: 16px; row-gap: 4px; flex-wrap: wrap; padding: 6px 10px;
  background: linear-gradient(90deg, #f7f9fc, #eef3f9); border: 1px solid #dde4ee; border-radius: 8px; }
.sk-title { font-size: 15px; font-weight: 600; white-space: nowrap; }
.sk-badge { color: white; padding: 2px 9px; border-radius: 10px; font-size: 11.5px; font-weight: 600; letter-spacing: .3px; white-space: nowrap; }
.jupyter-widgets-disconnected .sk-title::after { content: attr(data-gone); margin-left: 12px; color: #b71c1c; font-weight: 600; font-size: 12px; }
.jupyter-widgets-disconnected .sk-badge, .jupyter-widgets-disconnected .sk-reason { display: none; }
.jupyter-widgets-disconnected .sk-kpis, .jupyter-widgets-disconnected .sk-chips,
.statekit-dashboard .jupyter-widgets-disconnected.widget-html:not(:has(.sk-head)),
.statekit-dashboard .jupyter-widgets-disconnected.widget-image { opacity: .5; }
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
table.sk tr.waiting td { color: #546e7a; }
table.sk tr.stale td { color: #8a5a00; background: #fff3e0; font-style: italic; }
.sk-stale { color: #8a5a00; background: #fff3e0; border: 1px solid #ffd8a8; border-radius: 4px; padding: 2px 6px; margin: 2px 0 4px 0; }
table.sk td.lagbad { color: #c62828; font-weight: 600; }
.sk-dot { display: inline-block; width: 8px; height: 8px; border-radius: 4px; margin-right: 4px; }
.sk-bar { background: #eceff3; border-radius: 4px; height: 11px; width: 90px; overflow: hidden; display: inline-block; vertical-align: middle; }
.sk-bar > div { background: linear-gradient(90deg, #ffa726, #ef6c00); height: 100%; }
.sk-bar.done > div { background: linear-gradient(90deg, #66bb6a, #2e7d32); }
.sk-bar.promoted > div { background: #8e7cc3; }
.sk-bar.nothing > div, .sk-bar.moved > div { background: #b0bec5; }
.sk-bar.failed > div, .sk-bar.interrupted > div { background: #c62828; }
.sk-sum { background: #eef8ef; border: 1px solid #cfe8d2; border-radius: 6px; padding: 5px 9px; margin-top: 6px; overflow-wrap: anywhere; }
.sk-sum.bad { background: #fdecea; border-color: #f5c6c2; color: #b71c1c; }
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


def render_header(name: str, m, note: str = "") -> str:
    m = _pic(m)
    h = m.header
    state = h["state"]
    color = STATE_COLORS.get(state, "#455a64")
    rate = h["input_rate"]
    # with events, the rate is the Instances panel's committed records/s summed (the same window)
    kpis = [("committed (5 s)" if m.has_events else "input (5 s)",
             f"{fmt_num(round(rate)) if isinstance(rate, (int, float)) else '–'} rec/s"),
            ("processed", fmt_num(h["records"])),
            ("batch", f"{fmt_num(h['batch_id'])}" + (f" · {fmt_num(h['batch_ms'])} ms" if h["batch_ms"] is not None else "")),
            ("store rows", fmt_num(h["rows"])),
            ("changelog lag", ("≥ " if h.get("lag_unknown") else "") + fmt_num(h["lag"]))]
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
        full = m.app_error or m.last_error or reason
        err = f"<div class='sk-err'>⚠ {_e(clip(full, 600))}</div>" if full else ""
    warn = f"<div class='sk-warn'>not shown: {_e(clip(h['error'], 300))}</div>" if h.get("error") else ""
    note = f"<span class='sk-note'>{_e(note)}</span>" if note else ""
    # the page says it alone once the kernel is gone (JupyterLab marks the widget disconnected)
    gone = (f"GONE — the kernel restarted or stopped: app {name} and its processes ended with it "
            f"(run the notebook again)")
    return (f"{CSS}<div class='sk-dash'><div class='sk-head'><span class='sk-title' data-gone='{_e(gone)}'>"
            f"{_e(name)}</span><span class='sk-badge' style='background:{color}'>{_e(state)}</span>{rs}"
            f"<div class='sk-kpis'>{k}</div>{note}</div>{chips}{err}{warn}</div>")


def render_chips(m) -> str:
    chips = _pic(m).chips
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
    "processed": "input records the task's commits processed (their sum is the header's)",
    "batch": "the last micro-batch the task committed",
    "store rows": "keys in the task's store (after its last commit)",
    "dirty": "dirty record-cache entries flushed to the changelog at the last commit",
    "offset": "changelog offset of the task's last commit (a replica: the offset it has applied)",
    "changelog end": "end offset of the task's changelog partition",
    "lag": "changelog end - offset: what a restore (or a promotion) of this copy would replay",
    "waiting": "micro-batches spooled for the task while it could not process them",
}


def render_tasks(m) -> str:
    tasks = _pic(m).tasks
    if not tasks:
        return _dash("<div class='sk-empty'>no tasks yet</div>")
    headers = ["task", "instance", "role", "state", "store", "processed", "batch", "store rows", "dirty",
               "offset", "changelog end", "lag", "waiting"]
    rows, classes = [], []
    for r in tasks:
        lag = r["lag"]
        lag_html = fmt_num(lag) if lag is None or lag < 1000 else f"<span class='lagbad'>{fmt_num(lag)}</span>"
        active = r["role"] == "active"
        backlog = r.get("backlog") if active else None
        rows.append([_e(r["task"]), fmt_num(r["instance"]), r["role"], _e(str(r.get("state") or "–").lower()),
                     _e(r["store"] or "–"), fmt_num(r.get("records")) if active else "",
                     fmt_num(r.get("batch")) if active else "", fmt_num(r["rows"]), fmt_num(r["dirty"]),
                     fmt_num(r["checkpoint"]), fmt_num(r["changelog_end"]), lag_html,
                     fmt_num(backlog) if backlog else ""])
        classes.append(r["role"])
    return _dash(table(headers, rows, classes, left={2, 3, 4}, titles=TASK_TITLES))


def render_store(m) -> str:
    m = _pic(m)
    store = m.store
    rows = m.store_rows
    total, changed, held = m.store_total, m.store_changed, m.store_held
    of = f" of {fmt_num(held)}" if held > total else ""
    head = (f"<div class='sk-h'>Store <code>{_e(store or '–')}</code>"
            f"<span class='sk-note'>{fmt_num(total)} rows read{of} · {changed} changed since last refresh · "
            f"top {m.top_k} by {m.sort_by}{' among them' if of else ''}</span></div>")
    stale = getattr(m, "store_stale", None) or []
    if stale:   # the rows of these tasks come from a copy behind its changelog: never as if current
        head += (f"<div class='sk-stale' title='read from the freshest copy there is; a query with "
                 f"stale=False waits for it or says why not'>"
                 f"{'<br>'.join(_e('not current — ' + line) for line in stale)}</div>")
    if not rows:
        return _dash(f"{head}<div class='sk-empty'>no rows yet</div>")
    body = [[_fmt_key(r.key), _fmt_value(r.value),
             _e(r.behind) if getattr(r, "behind", None) else
             {"new": "new", "changed": "changed"}.get(r.status, "")]
            for r in rows]
    classes = ["stale" if getattr(r, "behind", None) else (r.status or "") for r in rows]
    t = table(["key", "value", ""], body, classes, left={0, 2}, cls="kv")
    hidden = m.store_hidden
    more = ""
    if hidden:
        names = ", ".join(_clip_e(k, 30) for k in hidden[:6]) + (" …" if len(hidden) > 6 else "")
        more = (f"<div class='sk-note' style='margin-top:3px'>also changed, outside the top {m.top_k}: "
                f"{names}</div>")
    return _dash(f"{head}{t}{more}")


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
        if total is None and not r.restored:
            replayed = "–"
        elif r.exact or r.final:
            # done: what it read, both sides; the offsets without a record are said, not hidden
            why = (f" title='{r.skipped:,} of the offsets it crossed held no record ({SKIPPED_WHY})'"
                   if r.skipped else "")
            replayed = f"<span{why}>{fmt_num(r.restored)} / {fmt_num(total)}</span>"
        else:
            replayed = (f"<span title='changelog offsets to cross: at most this many records (a "
                        f"compacted log holds fewer, a transaction marker takes an offset)'>"
                        f"{fmt_num(r.restored)} / ≤ {fmt_num(total)}</span>")
        if r.status in ("nothing",):
            replayed = "0 / 0"
        if r.status == "done":
            eta = f"took {fmt_secs(r.seconds)}"
        elif r.status in ("restoring", "queued"):
            # the instance's smoothed rate; before it has one, the forecast (≈)
            q, guessed = rnd.estimate(r, forecast)
            approx = guessed or (r.status == "queued" and q is not None and q >= 1)
            eta = "–" if q is None else f"≈ {fmt_eta(q)}" if approx else fmt_eta(q)
        else:
            eta = "–"
        line = [_e(r.task), fmt_num(r.instance), _e(r.source if r.source != "?" else "–"), bar, replayed, fmt_rate(r.rate), eta,
                _e(r.label) + (f" <span title='{_e(r.error)}'>⚠</span>" if r.error else "")]
        if with_fc:
            fc = forecast_seconds(forecast, r.task, r.source, r.total)
            line.insert(7, f"≈ {fmt_secs(fc)}" if fc is not None else "–")
        body.append(line)
        classes.append(ROW_CLASSES.get(r.status, ""))
    return table(headers, body, classes, left={2, len(headers) - 1},
                 titles={"from": "checkpoint: local state, replays its tail; standby / warmup: a promoted "
                                 "replica, replays its lag; scratch: the whole changelog",
                         "forecast": "the restore forecast made before this round began",
                         "rate": "records/s over the last progress reports (when done: the average)"})


def render_forecast(m) -> str:
    m = _pic(m)
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
    what = ("made before the app's last commits: its changelogs hold more now" if m.forecast_behind else
            "the records in the compacted changelogs at the rate restores run here")
    return (f"<div class='sk-fc'><b>Restore forecast</b><span class='sk-note'>{when} · {what}</span>"
            f"<ul style='margin:2px 0 0 0;padding-left:18px'>{''.join(lines)}</ul></div>")


def render_restore(m) -> str:
    m = _pic(m)
    rnd = m.round
    head = "<div class='sk-h'>Restoration"
    if rnd is None:
        fc = render_forecast(m)
        if not m.has_events:
            hint = ("<div class='sk-empty'>Spark's own state store restores inside Spark: its load "
                    "figures are in <code>app.restore_report()</code> (notebook 09)</div>")
        else:
            hint = ("<div class='sk-empty'>no task has opened yet: tasks are listed here from the moment "
                    "they are assigned (queued, restoring, done)</div>")
        return _dash(f"{head}</div>{hint}{fc}")
    when = time.strftime("%H:%M:%S", time.localtime(rnd.started))
    throttle = max((r.throttle or 0 for r in rnd.rows.values()), default=0)
    # the rebalance that queued the round's restores (the "latest moves" line says the same); a
    # crash's round carries the generation it ended until then
    gen = max(rnd.generations) if rnd.generations else rnd.generation
    note = f"round began {when}" + (f" · generation {gen}" if gen else "")
    if throttle:
        note += f" · throttled to {throttle:,.0f} records/s (restart --restore-rate)"
    fc_before = m.round_forecast
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
        mark, cls = ("✔", "sk-sum") if s.ok else ("✘", "sk-sum bad")
        summary = f"<div class='{cls}'>{mark} {_e(s.line())}{_e(extra)}</div>"
    fc = render_forecast(m) if rnd.final else ""
    return _dash(f"{head}<span class='sk-note'>{_e(note)}</span></div>{t}{summary}{fc}")


MOVE_REASONS = {"owner-died": "its instance died", "owner-leaving": "its instance is leaving",
                "warmup-caught-up": "a warmup caught up", "balance": "balance"}


def render_moves(m) -> str:
    """The chart's words: the latest tasks that moved, and why (also what a screen reader gets)."""
    own = _pic(m).ownership
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


INSTANCE_STATUS_COLORS = {"alive": "#43a047", "leaving": "#f9a825", "dead": "#c62828", "stopped": "#9e9e9e",
                          "left": "#9e9e9e"}


def render_instances(m) -> str:
    rows = _pic(m).instances
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


def render_changelog(m) -> str:
    rows = _pic(m).changelog
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


def render_events(m, n: int = 14) -> str:
    evs = list(_pic(m).events)[-n:][::-1]
    if not evs:
        return _dash("<div class='sk-empty'>no events yet</div>")
    body = []
    for e in evs:
        d = e.to_dict()
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

