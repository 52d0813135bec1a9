"""The two live charts as inline SVG text: the changelog lag per task over time, and who owned each
task when. A refresh builds a few kilobytes of markup (a millisecond or two, whatever the load) and
the browser draws it; matplotlib, whose figures cost a hundred milliseconds of the kernel's time
and its GIL, stays for the charts drawn rarely (the restore timeline, the topology)."""
from __future__ import annotations

import html
import math

from kernel_ext.dashboard.charts import MARKER_STYLE, PALETTE, POINT_STYLE, axis_limit, instance_color

W, H = 441, 211                      # pixels: the width the layout reserves for each chart
LEFT, RIGHT, TOP, BOTTOM = 52, 116, 22, 34   # plot margins (the legend sits right of the plot)
FONT = "font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif"
DASH = {"-": "", "--": "5,3", ":": "1.5,2.5", "-.": "6,2,1.5,2"}
MAX_POINTS = 300                     # per line: more than the plot's width in pixels is not seen


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _ticks(limit: float, most: int = 6) -> list[float]:
    """0 and multiples of a 1-2-5 step up to `limit`, at most `most` steps."""
    if limit <= 0:
        return [0.0]
    mag = 10 ** math.floor(math.log10(limit / most))
    step = next(m * mag for m in (1, 2, 5, 10) if limit / (m * mag) <= most)
    return [i * step for i in range(int(limit / step + 1e-9) + 1)]


def _label(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{round(v, 6):g}"


def _thin(xs, ys, n: int = MAX_POINTS):
    """At most `n` points of a line, the first and last kept, evenly spaced between."""
    if len(xs) <= n:
        return xs, ys
    step = (len(xs) - 1) / (n - 1)
    idx = [round(i * step) for i in range(n)]
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _frame(title: str, xlabel: str, height: int) -> list[str]:
    return [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{height}' viewBox='0 0 {W} {height}' "
            f"style='{FONT};background:white;display:block'>",
            f"<text x='6' y='14' font-size='12' fill='#222'>{_e(title)}</text>",
            f"<text x='{LEFT + (W - LEFT - RIGHT) / 2:.0f}' y='{height - 4}' font-size='10' fill='#444' "
            f"text-anchor='middle'>{_e(xlabel)}</text>"]


def _legend(items: list[tuple[str, str]], y0: int = TOP) -> list[str]:
    """`items`: (svg of a 16x8 swatch drawn at the origin, label)."""
    out = []
    x = W - RIGHT + 8
    for i, (swatch, label) in enumerate(items[:12]):
        y = y0 + 4 + i * 12
        out.append(f"<g transform='translate({x},{y})'>{swatch}</g>"
                   f"<text x='{x + 20}' y='{y + 7}' font-size='9' fill='#333'>{_e(label)}</text>")
    return out


def _line_swatch(color: str, dash: str = "", width: float = 1.8) -> str:
    d = f" stroke-dasharray='{dash}'" if dash else ""
    return f"<line x1='0' y1='4' x2='16' y2='4' stroke='{color}' stroke-width='{width}'{d}/>"


def task_colors(tasks) -> dict:
    """task -> its colour in the lag chart: by its place among every task shown, so a task's
    standby line wears its colour."""
    from kernel_ext.dashboard.formats import task_order

    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(sorted(set(tasks), key=task_order))}


OUTAGE_FILL = "#8d6e63"   # the bands of the times Kafka was away


def lag_chart(series: dict, standby: dict | None = None, markers=(), outages=()) -> str:
    """The lag-over-time chart: `series` and `standby` map a task to (seconds, lag) lists;
    `markers` are (seconds, kind, label): crash, restart, restored, rebalance, join, revive, leave;
    `outages` (start, end, label) are drawn as bands behind the lines: Kafka was away."""
    standby = standby or {}
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    xmax, ymax = 1.0, 0
    for xs, ys in list(series.values()) + list(standby.values()):
        if xs:
            xmax, ymax = max(xmax, xs[-1]), max(ymax, max(ys))
    for x, _k, _l in markers:
        xmax = max(xmax, x)
    for _a, b, _l in outages:
        xmax = max(xmax, b)
    xl, yl = axis_limit(xmax, floor=30.0), axis_limit(max(4, ymax * 1.15), floor=4)

    def px(x):
        return LEFT + pw * min(max(x, 0.0), xl) / xl

    def py(y):
        return TOP + ph * (1 - min(max(y, 0.0), yl) / yl)

    out = _frame("changelog lag per task", "seconds", H)
    for v in _ticks(yl):
        y = py(v)
        out.append(f"<line x1='{LEFT}' y1='{y:.1f}' x2='{LEFT + pw}' y2='{y:.1f}' stroke='#e6e6e6'/>"
                   f"<text x='{LEFT - 4}' y='{y + 3:.1f}' font-size='9' fill='#444' text-anchor='end'>{_label(v)}</text>")
    for v in _ticks(xl):
        x = px(v)
        out.append(f"<line x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{TOP + ph}' stroke='#f0f0f0'/>"
                   f"<text x='{x:.1f}' y='{TOP + ph + 12}' font-size='9' fill='#444' text-anchor='middle'>{_label(v)}</text>")
    out.append(f"<text x='12' y='{TOP + ph / 2:.0f}' font-size='10' fill='#444' text-anchor='middle' "
               f"transform='rotate(-90 12 {TOP + ph / 2:.0f})'>records behind</text>")
    out.append(f"<line x1='{LEFT}' y1='{TOP + ph}' x2='{LEFT + pw}' y2='{TOP + ph}' stroke='#999'/>"
               f"<line x1='{LEFT}' y1='{TOP}' x2='{LEFT}' y2='{TOP + ph}' stroke='#999'/>")
    for i, (a, b, label) in enumerate(outages):
        x0, x1 = px(a), px(b)
        out.append(f"<rect x='{x0:.1f}' y='{TOP}' width='{max(x1 - x0, 2.0):.1f}' height='{ph}' "
                   f"fill='{OUTAGE_FILL}' fill-opacity='0.18' class='kafka-away'><title>{_e(label)}</title></rect>")
        for j, part in enumerate(label.split(" · ")[:2]):   # its length, then what it aborted
            y = TOP + 9 + 9 * j + 18 * (i % 2)               # (close bands: their labels on other lines)
            out.append(f"<text x='{x0 + 2:.1f}' y='{y}' font-size='8' fill='{OUTAGE_FILL}' "
                       f"class='kafka-away-label'>{_e(part)}</text>")
    kinds = []
    for x, kind, label in markers:
        color, style, _ = MARKER_STYLE.get(kind, ("#999", ":", kind))
        d = DASH.get(style, "")
        out.append(f"<line x1='{px(x):.1f}' y1='{TOP}' x2='{px(x):.1f}' y2='{TOP + ph}' stroke='{color}' "
                   f"stroke-width='1'{f' stroke-dasharray={chr(39)}{d}{chr(39)}' if d else ''}>"
                   f"<title>{_e(label)}</title></line>")
        if kind not in kinds:
            kinds.append(kind)
    legend = []
    colors = task_colors(list(series) + list(standby))
    for dash, group in ((False, series), (True, standby)):
        for task, (xs, ys) in group.items():
            if not xs:
                continue
            color = colors[task]
            xs, ys = _thin(xs, ys)
            pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
            extra = " stroke-dasharray='5,3'" if dash else ""
            out.append(f"<polyline fill='none' stroke='{color}' stroke-width='{1.2 if dash else 1.8}'{extra} "
                       f"points='{pts}'><title>{'standby' if dash else 'task'} {_e(task)}</title></polyline>")
            if not dash:
                legend.append((_line_swatch(color), f"task {task}"))
    if not any(xs for xs, _ys in list(series.values()) + list(standby.values())):
        out.append(f"<text x='{LEFT + pw / 2:.0f}' y='{TOP + ph / 2:.0f}' font-size='10' fill='#888' "
                   f"text-anchor='middle'>waiting for the first lag sample</text>")
    if any(xs for xs, _ys in standby.values()):
        legend.append((_line_swatch("#777", "5,3", 1.2), "dashed: standby"))
    for k in sorted(kinds):
        color, style, label = MARKER_STYLE.get(k, ("#999", ":", k))
        legend.append((_line_swatch(color, DASH.get(style, ""), 1.2), label))
    if outages:
        legend.append((f"<rect x='0' y='0' width='16' height='8' fill='{OUTAGE_FILL}' "
                       f"fill-opacity='0.3'/>", "Kafka away"))
    out += _legend(legend)
    out.append("</svg>")
    return "".join(out)


_POINT = POINT_STYLE
_POINT_LABELS = {"crash": "crash", "promoted": "replica promoted", "restored": "restored",
                 "caught-up": "warmup caught up"}


def _point(kind: str, x: float, y: float) -> str:
    color, sym = _POINT[kind]
    if sym == "x":
        return (f"<path d='M{x - 3:.1f},{y - 3:.1f}L{x + 3:.1f},{y + 3:.1f}M{x - 3:.1f},{y + 3:.1f}"
                f"L{x + 3:.1f},{y - 3:.1f}' stroke='{color}' stroke-width='1.6'/>")
    if sym == "^":
        return f"<path d='M{x:.1f},{y - 4:.1f}L{x + 3.5:.1f},{y + 3:.1f}L{x - 3.5:.1f},{y + 3:.1f}Z' fill='{color}'/>"
    if sym == "D":
        return f"<path d='M{x:.1f},{y - 4:.1f}L{x + 3.5:.1f},{y:.1f}L{x:.1f},{y + 4:.1f}L{x - 3.5:.1f},{y:.1f}Z' fill='{color}'/>"
    return f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3' fill='{color}'/>"


def ownership_chart(timeline, t0: float, now: float) -> str:
    """Tasks × time, coloured by the instance that owned each task (pale while it restored there),
    warmup replicas as thin bars under their task, markers for crashes, promotions, restores and
    warmups that caught up, dotted lines for rebalances."""
    tasks = timeline.tasks()
    rowh = 19
    height = max(90, TOP + BOTTOM + rowh * max(1, len(tasks)))
    pw, ph = W - LEFT - RIGHT, height - TOP - BOTTOM
    xl = axis_limit(max(1.0, now - t0), floor=30.0)

    def px(t):
        return LEFT + pw * min(max(t - t0, 0.0), xl) / xl

    out = _frame("task ownership (colour = instance)", "seconds", height)
    for v in _ticks(xl):
        x = LEFT + pw * v / xl
        out.append(f"<line x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{TOP + ph}' stroke='#eee'/>"
                   f"<text x='{x:.1f}' y='{TOP + ph + 12}' font-size='9' fill='#444' text-anchor='middle'>{_label(v)}</text>")
    if not tasks:
        out.append(f"<text x='{LEFT + pw / 2:.0f}' y='{TOP + ph / 2:.0f}' font-size='10' fill='#888' "
                   f"text-anchor='middle'>no assignment yet</text>")
    insts, kinds = set(), set()
    for m in timeline.markers:
        if m.task is None and m.kind == "rebalance":
            x = px(m.t)
            out.append(f"<line x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{TOP + ph}' stroke='#9E9E9E' "
                       f"stroke-dasharray='1.5,2.5'><title>{_e(m.label)}</title></line>")
            kinds.add("rebalance")
    for i, t in enumerate(tasks):
        yc = TOP + rowh * i + rowh / 2
        out.append(f"<text x='{LEFT - 4}' y='{yc + 3:.1f}' font-size='9' fill='#444' text-anchor='end'>task {_e(t)}</text>")
        for s in timeline.segments.get(t, []):
            insts.add(s.instance)
            c = instance_color(s.instance)
            a, b = px(s.start), px(s.end if s.end is not None else now)
            ready = px(s.opened) if s.opened is not None else b
            tip = f"<title>task {_e(t)} on instance {s.instance}</title>"
            if ready > a:
                out.append(f"<rect x='{a:.1f}' y='{yc - 6:.1f}' width='{ready - a:.1f}' height='10' fill='{c}' "
                           f"fill-opacity='0.3' stroke='{c}' stroke-width='0.5'>{tip}</rect>")
            if b > ready:
                out.append(f"<rect x='{ready:.1f}' y='{yc - 6:.1f}' width='{b - ready:.1f}' height='10' "
                           f"fill='{c}'>{tip}</rect>")
        for s in timeline.warmups.get(t, []):
            insts.add(s.instance)
            a, b = px(s.start), px(s.end if s.end is not None else now)
            out.append(f"<rect x='{a:.1f}' y='{yc + 5:.1f}' width='{max(0.0, b - a):.1f}' height='3' "
                       f"fill='{instance_color(s.instance)}' fill-opacity='0.7'/>")
    rows = {t: i for i, t in enumerate(tasks)}
    for m in timeline.markers:
        if m.task in rows and m.kind in _POINT:
            out.append(_point(m.kind, px(m.t), TOP + rowh * rows[m.task] + rowh / 2 - 1))
            kinds.add(m.kind)
    out.append(f"<line x1='{LEFT}' y1='{TOP + ph}' x2='{LEFT + pw}' y2='{TOP + ph}' stroke='#999'/>")
    legend = [(f"<rect x='0' y='0' width='16' height='8' fill='{instance_color(i)}'/>", f"instance {i}")
              for i in sorted(insts)]
    if any(timeline.warmups.values()):
        legend.append(("<rect x='0' y='3' width='16' height='3' fill='#bbb'/>", "thin: warmup"))
    for k in sorted(kinds - {"rebalance"}):
        legend.append((_point(k, 8, 4), _POINT_LABELS[k]))
    if "rebalance" in kinds:
        legend.append((_line_swatch("#9E9E9E", "1.5,2.5", 1), "rebalance"))
    out += _legend(legend)
    out.append("</svg>")
    return "".join(out)


RESTORE_COLORS = {"queued": "#BDBDBD", "restoring": "#EF6C00", "done": "#2E7D32", "promoted": "#6A1B9A",
                  "nothing": "#90A4AE", "failed": "#C62828", "moved": "#9E9E9E"}
TIMELINE_W = 558


def restore_timeline(rnd, cursor: float | None = None, now: float | None = None) -> str:
    """One restore round, tasks × seconds since it began: grey while queued, orange while restoring
    (a tick per progress report), a dot when the task opened (green: restored, purple: a promoted
    replica, grey: nothing to replay); `cursor` draws the replay's position."""
    rows = rnd.ordered() if rnd is not None else []
    rowh, width = 19, TIMELINE_W
    height = max(90, TOP + BOTTOM + rowh * max(1, len(rows)))
    pw, ph = width - LEFT - RIGHT, height - TOP - BOTTOM
    t0 = rnd.started if rnd is not None else 0.0
    end = now if now is not None else (rnd.finished if rnd is not None and rnd.finished else t0 + 1)
    for r in rows:
        for t in (r.finished, r.started):
            if t is not None:
                end = max(end, t)
    span = axis_limit(max(0.05, end - t0) * 1.04, floor=0.5)

    def px(t):
        return LEFT + pw * min(max(t - t0, 0.0), span) / span

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
           f"style='{FONT};background:white;display:block'>",
           f"<text x='6' y='14' font-size='12' fill='#222'>restore timeline (seconds since the round began)</text>",
           f"<text x='{LEFT + pw / 2:.0f}' y='{height - 4}' font-size='10' fill='#444' text-anchor='middle'>seconds</text>"]
    for v in _ticks(span):
        x = LEFT + pw * v / span
        out.append(f"<line x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{TOP + ph}' stroke='#eee'/>"
                   f"<text x='{x:.1f}' y='{TOP + ph + 12}' font-size='9' fill='#444' text-anchor='middle'>{_label(v)}</text>")
    for i, r in enumerate(rows):
        yc = TOP + rowh * i + rowh / 2
        out.append(f"<text x='{LEFT - 4}' y='{yc + 3:.1f}' font-size='9' fill='#444' text-anchor='end'>task {_e(r.task)}</text>")
        q = r.queued_at if r.queued_at is not None else t0
        stop = r.finished if r.finished is not None else t0 + span
        first = r.started if r.started is not None else stop
        if first > q:
            out.append(f"<rect x='{px(q):.1f}' y='{yc - 5:.1f}' width='{px(first) - px(q):.1f}' height='10' "
                       f"fill='{RESTORE_COLORS['queued']}'/>")
        if r.started is not None:
            out.append(f"<rect x='{px(r.started):.1f}' y='{yc - 5:.1f}' width='{max(0.0, px(stop) - px(r.started)):.1f}' "
                       f"height='10' fill='{RESTORE_COLORS['restoring']}'/>")
            xs, _ys = _thin([ts for ts, _n in r.samples], [0] * len(r.samples), 120)
            out.append("".join(f"<line x1='{px(ts):.1f}' y1='{yc - 6:.1f}' x2='{px(ts):.1f}' y2='{yc + 6:.1f}' "
                               f"stroke='#5D4037'/>" for ts in xs))
        if r.finished is not None:
            out.append(f"<circle cx='{px(r.finished):.1f}' cy='{yc:.1f}' r='3.5' "
                       f"fill='{RESTORE_COLORS.get(r.status, '#666')}'><title>{_e(r.label)}</title></circle>")
    if cursor is not None:
        x = px(t0 + cursor)
        out.append(f"<line x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{TOP + ph}' stroke='#1565C0' stroke-width='1.4'/>")
    if not rows:
        out.append(f"<text x='{LEFT + pw / 2:.0f}' y='{TOP + ph / 2:.0f}' font-size='10' fill='#888' "
                   f"text-anchor='middle'>no restore yet</text>")
    out.append(f"<line x1='{LEFT}' y1='{TOP + ph}' x2='{LEFT + pw}' y2='{TOP + ph}' stroke='#999'/>")
    dot = "<circle cx='8' cy='4' r='3.5' fill='{}'/>".format
    legend = [(f"<rect x='0' y='0' width='16' height='8' fill='{RESTORE_COLORS['queued']}'/>", "queued"),
              (f"<rect x='0' y='0' width='16' height='8' fill='{RESTORE_COLORS['restoring']}'/>", "restoring"),
              ("<line x1='8' y1='-2' x2='8' y2='10' stroke='#5D4037'/>", "progress report"),
              (dot(RESTORE_COLORS["done"]), "restored"), (dot(RESTORE_COLORS["promoted"]), "promoted"),
              (dot(RESTORE_COLORS["nothing"]), "nothing to replay")]
    for j, (swatch, label) in enumerate(legend):
        x, y = width - RIGHT + 8, TOP + 4 + j * 12
        out.append(f"<g transform='translate({x},{y})'>{swatch}</g>"
                   f"<text x='{x + 20}' y='{y + 7}' font-size='9' fill='#333'>{_e(label)}</text>")
    out.append("</svg>")
    return "".join(out)
