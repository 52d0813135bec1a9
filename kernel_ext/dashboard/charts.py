"""Matplotlib drawings for the dashboard's rarely drawn charts (the restore timeline, the topology)
and the colours and axis limits every chart shares (the live charts are SVG: `svg`). No pyplot: every
chart is its own `Figure` on an Agg canvas, so drawing from a thread touches no global state."""
from __future__ import annotations

import io
import math
from typing import Iterable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from kernel_ext.dashboard.model import layout_topology

PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
           "#CCB974", "#64B5CD"]
KIND_COLORS = {"source": "#DCEBFA", "processor": "#FFF3D6", "store": "#DDF2E3", "changelog": "#F3E1F5",
               "sink": "#FBE0E0"}
KIND_EDGES = {"source": "#4C72B0", "processor": "#C99A2E", "store": "#55A868", "changelog": "#8172B3",
              "sink": "#C44E52"}


def to_png(fig: Figure, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


def _style(ax):
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(True, color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=8, colors="#444")


INSTANCE_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#C44E52", "#937860", "#DA8BC3",
                   "#64B5CD", "#CCB974", "#8C8C8C"]
MARKER_STYLE = {  # kind -> (colour, line style, legend label)
    "crash": ("#C62828", "-", "crash"),
    "restart": ("#1565C0", "--", "restart"),
    "restored": ("#2E7D32", "-", "restored"),
    "rebalance": ("#757575", ":", "rebalance"),
    "join": ("#6A1B9A", "--", "instance joined"),
    "revive": ("#6A1B9A", "--", "instance revived"),
    "leave": ("#6A1B9A", ":", "instance left"),
}


def instance_color(i) -> str:
    try:
        return INSTANCE_COLORS[int(i) % len(INSTANCE_COLORS)]
    except (TypeError, ValueError):
        return "#9E9E9E"


def axis_limit(v: float, floor: float = 1.0) -> float:
    """`v` rounded up to a multiple of a 1-2-5 step of about a fifth of it (so an axis that grows
    a little each second keeps its limit, ticks and labels for a while): 37 -> 40, 123 -> 150."""
    v = max(float(v), floor)
    raw = v / 5.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return math.ceil(v / step - 1e-9) * step


_POINT_MARKERS = {"crash": ("x", "#C62828"), "promoted": ("^", "#6A1B9A"), "restored": ("o", "#2E7D32"),
                  "caught-up": ("D", "#00838F")}
_POINT_LABELS = {"crash": "crash", "promoted": "replica promoted", "restored": "restored",
                 "caught-up": "warmup caught up"}


def _task_axes(fig, tasks, xmax, title):
    ax = fig.add_subplot(111)
    _style(ax)
    ax.grid(True, axis="x", color="#e6e6e6", linewidth=0.8)
    ax.grid(False, axis="y")
    ax.set_title(title, fontsize=9, color="#222", loc="left")
    ax.set_xlabel("seconds", fontsize=7.5, color="#444", labelpad=1)
    ax.set_yticks(range(len(tasks)), [f"task {t}" for t in tasks])
    ax.set_ylim(len(tasks) - 0.5, -0.5)
    ax.set_xlim(0, xmax)
    ax.tick_params(axis="y", labelsize=7)
    return ax


RESTORE_COLORS = {"queued": "#BDBDBD", "restoring": "#EF6C00", "done": "#2E7D32",
                  "promoted": "#6A1B9A", "nothing": "#90A4AE", "failed": "#C62828",
                  "moved": "#9E9E9E", "interrupted": "#C62828"}


def restore_timeline_figure(rnd, cursor: float | None = None, now: float | None = None,
                            width: float = 6.2, height: float | None = None) -> Figure:
    """One restore round, tasks × time (seconds since the round began): grey while queued, orange
    while restoring (a tick per progress report), a dot when the task opened (green: restored,
    purple: a promoted replica, grey: nothing to replay). `cursor` draws the replay position."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = rnd.ordered() if rnd is not None else []
    tasks = [r.task for r in rows]
    height = height or max(1.6, 0.9 + 0.24 * len(tasks))
    fig = Figure(figsize=(width, height))
    t0 = rnd.started if rnd is not None else 0.0
    end = now if now is not None else (rnd.finished if rnd is not None and rnd.finished else t0 + 1)
    if rnd is not None:
        for r in rows:
            for t in (r.finished, r.started):
                if t is not None:
                    end = max(end, t)
    span = max(0.05, end - t0)
    ax = _task_axes(fig, tasks, span * 1.04, "restore timeline (seconds since the round began)")
    for y, r in enumerate(rows):
        q = (r.queued_at if r.queued_at is not None else t0) - t0
        st = (r.started - t0) if r.started is not None else None
        fin = (r.finished - t0) if r.finished is not None else None
        stop = fin if fin is not None else span
        first = st if st is not None else stop
        if first > q:
            ax.broken_barh([(q, first - q)], (y - 0.25, 0.5), facecolors=RESTORE_COLORS["queued"])
        if st is not None:
            ax.broken_barh([(st, max(0.0, stop - st))], (y - 0.25, 0.5), facecolors=RESTORE_COLORS["restoring"])
            xs = [ts - t0 for ts, _n in r.samples]
            ax.plot(xs, [y] * len(xs), linestyle="none", marker="|", color="#5D4037", markersize=6)
        if fin is not None:
            ax.plot([fin], [y], marker="o", color=RESTORE_COLORS.get(r.status, "#666"), markersize=5.5,
                    linestyle="none", zorder=5)
    if cursor is not None:
        ax.axvline(cursor, color="#1565C0", linewidth=1.4)
    handles = [Patch(facecolor=RESTORE_COLORS["queued"], label="queued"),
               Patch(facecolor=RESTORE_COLORS["restoring"], label="restoring"),
               Line2D([], [], marker="|", color="#5D4037", linestyle="none", label="progress report"),
               Line2D([], [], marker="o", color=RESTORE_COLORS["done"], linestyle="none", label="restored"),
               Line2D([], [], marker="o", color=RESTORE_COLORS["promoted"], linestyle="none", label="promoted"),
               Line2D([], [], marker="o", color=RESTORE_COLORS["nothing"], linestyle="none",
                      label="nothing to replay")]
    ax.legend(handles=handles, fontsize=6.5, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.02),
              borderaxespad=0.0, handlelength=1.4)
    if not rows:
        ax.text(0.5, 0.5, "no restore yet", ha="center", va="center", transform=ax.transAxes,
                fontsize=8.5, color="#888")
    fig.subplots_adjust(left=0.12, right=0.76, top=1 - 0.32 / height, bottom=0.42 / height)
    return fig


def graph_from_describe(d) -> tuple[list[dict], list[tuple[str, str]]]:
    """Nodes and edges from `App.describe()` / `Plan.describe()`, whatever the exact shape:
    a dict with "nodes" (dicts with id/name and kind/type) and "edges" ((a, b) or dicts), plus
    optional "stores" / "sources" / "sinks"; a changelog node is added for every store that has
    none."""
    if d is None:
        return [], []
    if not isinstance(d, dict):
        d = getattr(d, "__dict__", {}) or {}
    topo = d.get("topology") if isinstance(d.get("topology"), dict) else d
    nodes: dict[str, dict] = {}
    edges: list[tuple[str, str]] = []

    def add(nid, kind, label=None):
        nid = str(nid)
        if nid not in nodes:
            nodes[nid] = {"id": nid, "kind": kind, "label": label or nid}
        return nid

    raw = [n for n in topo.get("nodes", []) or []]
    for n in raw:
        if isinstance(n, str):
            add(n, "processor")
            continue
        nid = n.get("id") or n.get("name")
        kind = str(n.get("type") or n.get("kind") or "processor").lower()
        kind = ("source" if "source" in kind else "sink" if "sink" in kind else
                "store" if "store" in kind else "changelog" if "changelog" in kind else "processor")
        label = n.get("label") or n.get("name") or nid
        if kind in ("source", "sink") and n.get("topic"):
            label = str(n["topic"])
        add(nid, kind, label)
    for n in raw:
        if isinstance(n, str):
            continue
        nid = str(n.get("id") or n.get("name"))
        for s in n.get("stores", []) or []:
            sid = str(s) if str(s) in nodes else add(f"store:{s}", "store", s)
            edges.append((nid, sid))
        for c in n.get("children", []) or n.get("successors", []) or []:
            edges.append((nid, str(c)))
    kinds_of_edges = {}
    for e in topo.get("edges", []) or []:
        if isinstance(e, dict):
            a, b = e.get("from", e.get("source")), e.get("to", e.get("target"))
            if e.get("kind"):
                kinds_of_edges[(str(a), str(b))] = str(e["kind"])
        else:
            a, b = e[0], e[1]
        edges.append((str(a), str(b)))
    from statekit.contracts import changelog_topic

    app = d.get("app") or d.get("name") or d.get("application")

    def changelog_of(store: str) -> str:
        return changelog_topic(app, store) if app else f"{store} changelog"

    for s in topo.get("stores", []) or d.get("stores", []) or []:
        name = s if isinstance(s, str) else (s.get("name") if isinstance(s, dict) else getattr(s, "name", None))
        if not name:
            continue
        sid = name if nodes.get(name, {}).get("kind") == "store" else add(f"store:{name}", "store", name)
        changelog = (s.get("changelog") if isinstance(s, dict) else None) or changelog_of(name)
        cid = add(f"changelog:{changelog}", "changelog", changelog)
        edges.append((sid, cid))
    for nid, n in list(nodes.items()):
        if n["kind"] == "store" and not any(a == nid and nodes.get(b, {}).get("kind") == "changelog" for a, b in edges):
            topic = changelog_of(n["label"])
            cid = add(f"changelog:{topic}", "changelog", topic)
            edges.append((nid, cid))
    seen = set()
    uniq = []
    for a, b in edges:
        if a in nodes and b in nodes and (a, b) not in seen:
            seen.add((a, b))
            kind = kinds_of_edges.get((a, b))
            uniq.append((a, b, kind) if kind else (a, b))
    return list(nodes.values()), uniq


def short_label(label: str) -> str:
    """KSTREAM-FLATMAPVALUES-0000000001 -> FLATMAPVALUES-1 (Kafka Streams-style names, shortened)."""
    import re

    m = re.match(r"^(?:KSTREAM|KTABLE|STATEKIT)-(.+?)-0*(\d+)$", str(label))
    return f"{m.group(1)}-{m.group(2)}" if m else str(label)


def _wrap(label: str, width: int = 18) -> str:
    label = short_label(label)
    if len(label) <= width:
        return label
    parts, line = [], ""
    for tok in label.replace("-", "-\u200b").split("\u200b"):
        if len(line) + len(tok) > width and line:
            parts.append(line)
            line = tok
        else:
            line += tok
    parts.append(line)
    return "\n".join(parts[:3])


def topology_figure(nodes: Iterable[dict], edges: Iterable[tuple], title: str = "topology",
                    width: float | None = None, height: float | None = None) -> Figure:
    """Columns: sources → processors → stores → changelogs → sinks, boxes coloured by kind."""
    nodes = list(nodes)
    edges = list(edges)
    pos = layout_topology(nodes, edges)
    ncols = int(max((x for x, _ in pos.values()), default=0)) + 1
    per_col = {}
    for x, _ in pos.values():
        per_col[x] = per_col.get(x, 0) + 1
    rows = max(per_col.values(), default=1)
    width = width or max(4.0, 1.9 * ncols)
    height = height or max(2.0, 0.75 * rows + 0.9)
    fig = Figure(figsize=(width, height))
    ax = fig.add_axes([0, 0, 1, 0.9 if title else 1])
    ax.set_xlim(-0.6, ncols - 0.4)
    ax.set_ylim(1.15, -0.3)
    ax.axis("off")
    if title:
        fig.text(0.01, 0.97, title, fontsize=9.5, va="top", color="#222")
    bw, bh = 0.82, min(0.16, 0.6 / max(rows, 1) + 0.05)
    for e in edges:
        a, b = e[0], e[1]
        if a in pos and b in pos:
            (x0, y0), (x1, y1) = pos[a], pos[b]
            skip = x1 - x0 > 1.5  # jumps over columns: arc above them
            if skip:
                start, end, rad = (x0, y0 + bh / 2), (x1, y1 + bh / 2), 0.22
            else:
                start, end, rad = (x0 + bw / 2, y0), (x1 - bw / 2, y1), 0.0
            arrow = FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, color="#888",
                                    linewidth=1.0, connectionstyle=f"arc3,rad={rad}",
                                    shrinkA=1, shrinkB=1, linestyle="--" if skip else "-")
            ax.add_patch(arrow)
            if len(e) > 2 and e[2] == "shuffle" and not skip:
                ax.text((x0 + x1) / 2, (y0 + y1) / 2 - 0.05, "shuffle", ha="center", va="bottom",
                        fontsize=6.5, color="#C44E52", style="italic")
    kinds = {n["id"]: n for n in nodes}
    for nid, (x, y) in pos.items():
        n = kinds[nid]
        k = n.get("kind", "processor")
        box = FancyBboxPatch((x - bw / 2, y - bh / 2), bw, bh, boxstyle="round,pad=0.01,rounding_size=0.03",
                             facecolor=KIND_COLORS.get(k, "#eee"), edgecolor=KIND_EDGES.get(k, "#999"),
                             linewidth=1.1)
        ax.add_patch(box)
        ax.text(x, y, _wrap(n.get("label", nid)), ha="center", va="center", fontsize=7, color="#222")
    # column captions
    caps = {}
    for nid, (x, _) in pos.items():
        caps.setdefault(int(x), set()).add(kinds[nid].get("kind", "processor"))
    for x, ks in caps.items():
        label = "processors" if ks == {"processor"} else "/".join(sorted(k + "s" for k in ks))
        ax.text(x, -0.06, label, ha="center", va="bottom", fontsize=7, color="#777", style="italic")
    if not nodes:
        ax.text((ncols - 1) / 2, 0.5, "no topology yet", ha="center", va="center", color="#888")
    return fig
