"""The topology drawing (matplotlib, drawn once when its tab first shows) and what every chart
shares: colours, marker styles, axis limits (the charts drawn while the app runs are SVG: `svg`).
No pyplot: a figure is its own `Figure` on an Agg canvas, so drawing from a thread touches no global
state. matplotlib is imported when the topology is first drawn, not with the dashboard: its import
is ~0.4 s of CPU that a kernel whose learner never opens that tab (or eight kernels of a workshop
starting at once) need not pay before the first numbers."""
from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING, Iterable

from kernel_ext.dashboard.model import layout_topology

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The colours of tasks (the lag chart's lines) and instances (the ownership bars, the chips' badges):
# none of them near a marker's colour (red: crash, green: restored, black and grey: restarts,
# rebalances, instances coming and going) nor a status's: a crash line must never read as a task's
# line (tests/notebook/test_dashboard_property.py measures the distance, CIE76 ΔE >= MIN_DELTA_E).
PALETTE = ["#4C72B0", "#DD8452", "#8172B3", "#17A2B8", "#DA8BC3", "#CCB974", "#1F3A93", "#E6AB02",
           "#6A3D9A", "#0B4F6C"]
MIN_DELTA_E = 30.0
KIND_COLORS = {"source": "#DCEBFA", "processor": "#FFF3D6", "store": "#DDF2E3", "changelog": "#F3E1F5",
               "sink": "#FBE0E0"}
KIND_EDGES = {"source": "#4C72B0", "processor": "#C99A2E", "store": "#55A868", "changelog": "#8172B3",
              "sink": "#C44E52"}


def to_png(fig: "Figure", dpi: int = 100) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


INSTANCE_COLORS = PALETTE
CRASH, RESTORED, INK, SOFT = "#C62828", "#2E7D32", "#212121", "#9E9E9E"
MARKER_STYLE = {  # kind -> (colour, line style, legend label)
    "crash": (CRASH, "-", "crash"),
    "restart": (INK, "--", "restart"),
    "restored": (RESTORED, "-", "restored"),
    "rebalance": (SOFT, ":", "rebalance"),
    "join": (INK, "-.", "instance joined"),
    "revive": (INK, "-.", "instance revived"),
    "leave": (INK, ":", "instance left"),
}
# the ownership chart's point markers: kind -> (colour, symbol)
POINT_STYLE = {"crash": (CRASH, "x"), "promoted": (INK, "^"), "restored": (RESTORED, "o"),
               "caught-up": (SOFT, "D")}
MARKER_COLORS = sorted({c for c, _s, _l in MARKER_STYLE.values()} | {c for c, _s in POINT_STYLE.values()})


def delta_e(a: str, b: str) -> float:
    """How far apart two colours look (CIE76 ΔE in Lab; 2.3 is just noticeable, 30 is another
    colour), for the check that no marker wears a task's colour."""
    def lab(h):
        h = h.lstrip("#")
        rgb = [int(h[i:i + 2], 16) / 255 for i in (0, 2, 4)]
        r, g, b_ = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        x = (0.4124 * r + 0.3576 * g + 0.1805 * b_) / 0.95047
        y = 0.2126 * r + 0.7152 * g + 0.0722 * b_
        z = (0.0193 * r + 0.1192 * g + 0.9505 * b_) / 1.08883

        def f(t):
            return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

        fx, fy, fz = f(x), f(y), f(z)
        return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)

    return sum((p - q) ** 2 for p, q in zip(lab(a), lab(b))) ** 0.5


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
                    width: float | None = None, height: float | None = None) -> "Figure":
    """Columns: sources → processors → stores → changelogs → sinks, boxes coloured by kind."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

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
