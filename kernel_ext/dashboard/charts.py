"""Matplotlib drawings for the dashboard (and for `make demo`'s PNGs). No pyplot: every chart is
its own `Figure` on an Agg canvas, so drawing from the refresh thread touches no global state."""
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


def lag_figure(series: dict, standby: dict | None = None, width: float = 5.2, height: float = 2.6,
               title: str = "changelog lag per task") -> Figure:
    """Lag over time, one line per task (dashed: standby lag)."""
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot(111)
    _style(ax)
    any_line = False
    for i, (task, (xs, ys)) in enumerate(sorted(series.items())):
        if xs:
            ax.plot(xs, ys, color=PALETTE[i % len(PALETTE)], linewidth=1.8, label=f"task {task}")
            any_line = True
    for i, (task, (xs, ys)) in enumerate(sorted((standby or {}).items())):
        if xs:
            ax.plot(xs, ys, color=PALETTE[i % len(PALETTE)], linewidth=1.2, linestyle="--",
                    label=f"standby {task}")
            any_line = True
    ax.set_title(title, fontsize=9.5, color="#222", loc="left")
    ax.set_xlabel("seconds", fontsize=8, color="#444")
    ax.set_ylabel("records behind", fontsize=8, color="#444")
    ymax = max([max(ys) for _, ys in list(series.values()) + list((standby or {}).values()) if ys] or [0])
    ax.set_ylim(0, max(4, ymax * 1.15))
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
    if any_line:
        ax.legend(fontsize=7, frameon=False, ncol=4, loc="upper right")
    else:
        ax.text(0.5, 0.5, "waiting for the first lag sample", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="#888")
    fig.tight_layout(pad=0.6)
    return fig


class LagChart:
    """The lag-over-time chart, built once and updated in place (new data on the same lines, the
    same axes), which costs a fraction of building a figure every second. `png(series, standby)`
    returns PNG bytes, or None when nothing visible changed and the last picture is recent."""

    def __init__(self, width: float = 5.4, height: float = 2.5, dpi: int = 90, max_age: float = 5.0):
        from matplotlib.ticker import MaxNLocator

        self.dpi = dpi
        self.max_age = max_age
        self.fig = Figure(figsize=(width, height), dpi=dpi)
        self.canvas = FigureCanvasAgg(self.fig)
        self.ax = self.fig.add_subplot(111)
        _style(self.ax)
        self.ax.set_title("changelog lag per task", fontsize=9.5, color="#222", loc="left")
        self.ax.set_xlabel("seconds", fontsize=8, color="#444")
        self.ax.set_ylabel("records behind", fontsize=8, color="#444")
        self.ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
        self.empty = self.ax.text(0.5, 0.5, "waiting for the first lag sample", ha="center", va="center",
                                  transform=self.ax.transAxes, fontsize=9, color="#888")
        self.lines: dict = {}
        self._sig = None
        self._drawn_at = 0.0
        self._layout = None
        self._background = None
        self.full_draws = 0
        # fixed margins (tight_layout once would clip wider tick labels later): room for 6 digits
        self.fig.subplots_adjust(left=0.15, right=0.98, top=0.88, bottom=0.2)

    def _line(self, key, i: int, standby: bool):
        ln = self.lines.get(key)
        if ln is None:
            (ln,) = self.ax.plot([], [], color=PALETTE[i % len(PALETTE)], linewidth=1.2 if standby else 1.8,
                                 linestyle="--" if standby else "-",
                                 label=f"{'standby' if standby else 'task'} {key[1]}")
            self.lines[key] = ln
            # above the plot, right of the title: drawn with the background, never over a line
            self.ax.legend(fontsize=7, frameon=False, ncol=4, loc="lower right", bbox_to_anchor=(1.0, 1.0),
                           borderaxespad=0.1)
        return ln

    def png(self, series: dict, standby: dict | None = None, now: float | None = None) -> bytes | None:
        """PNG of the chart, or None when nothing visible changed and the last picture is recent.

        Cheap in the steady state: the axes limits are rounded up to "nice" values, so most
        refreshes keep the same axes, ticks and labels; then only the lines are redrawn over a
        saved background (blitting) and the canvas is encoded at a low PNG compression. A full
        draw happens only when a limit, the set of lines or the placeholder text changes."""
        import time as _time

        now = _time.monotonic() if now is None else now
        data = [(("a", t), i, False, xs, ys) for i, (t, (xs, ys)) in enumerate(sorted(series.items()))]
        data += [(("s", t), i, True, xs, ys) for i, (t, (xs, ys)) in enumerate(sorted((standby or {}).items()))]
        sig = tuple((k, tuple(ys[-120:])) for k, _i, _s, _x, ys in data)
        if sig == self._sig and now - self._drawn_at < self.max_age:
            return None  # the same lags: a redraw would only stretch the time axis
        self._sig, self._drawn_at = sig, now
        xmax, ymax = 1.0, 0
        n_lines = len(self.lines)
        for key, i, sb, xs, ys in data:
            self._line(key, i, sb).set_data(xs, ys)
            if xs:
                xmax = max(xmax, xs[-1])
                ymax = max(ymax, max(ys))
        empty = not any(xs for *_r, xs, _ys in data)
        limits = (axis_limit(xmax, floor=30.0), axis_limit(max(4, ymax * 1.15), floor=4))
        layout = (limits, len(self.lines), empty)
        if layout != self._layout or n_lines != len(self.lines) or self._background is None:
            self._layout = layout
            self.empty.set_visible(empty)
            self.ax.set_xlim(0, limits[0])
            self.ax.set_ylim(0, limits[1])
            for ln in self.lines.values():
                ln.set_visible(False)
            self.canvas.draw()  # axes, ticks, labels, grid, legend (outside the axes): the background
            self._background = self.canvas.copy_from_bbox(self.ax.bbox)
            for ln in self.lines.values():
                ln.set_visible(True)
            self.full_draws += 1
        else:
            self.canvas.restore_region(self._background)
        for ln in self.lines.values():
            self.ax.draw_artist(ln)
        return self._encode()

    def _encode(self) -> bytes:
        from PIL import Image

        w, h = self.canvas.get_width_height()
        img = Image.frombuffer("RGBA", (w, h), self.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        buf = io.BytesIO()
        img.convert("RGB").save(buf, format="png", compress_level=1)
        return buf.getvalue()


def axis_limit(v: float, floor: float = 1.0) -> float:
    """`v` rounded up to a multiple of a 1-2-5 step of about a fifth of it (so an axis that grows
    a little each second keeps its limit, ticks and labels for a while): 37 -> 40, 123 -> 150."""
    v = max(float(v), floor)
    raw = v / 5.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return math.ceil(v / step - 1e-9) * step


def bar_figure(labels: list, values: list, title: str, ylabel: str, width=5.0, height=2.6,
               color="#4C72B0") -> Figure:
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot(111)
    _style(ax)
    ax.bar([str(x) for x in labels], values, color=color)
    ax.set_title(title, fontsize=9.5, color="#222", loc="left")
    ax.set_ylabel(ylabel, fontsize=8, color="#444")
    fig.tight_layout(pad=0.6)
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
    app = d.get("app") or d.get("name") or d.get("application")
    if app:
        for n in nodes.values():
            if n["kind"] == "changelog" and not str(n["label"]).startswith(f"{app}-"):
                n["label"] = f"{app}-{n['label']}"
    for s in topo.get("stores", []) or d.get("stores", []) or []:
        name = s if isinstance(s, str) else (s.get("name") if isinstance(s, dict) else getattr(s, "name", None))
        if not name:
            continue
        sid = name if nodes.get(name, {}).get("kind") == "store" else add(f"store:{name}", "store", name)
        changelog = (s.get("changelog") if isinstance(s, dict) else None) or (
            f"{app}-{name}-changelog" if app else f"{name}-changelog")
        cid = add(f"changelog:{changelog}", "changelog", changelog)
        edges.append((sid, cid))
    for nid, n in list(nodes.items()):
        if n["kind"] == "store" and not any(a == nid and nodes.get(b, {}).get("kind") == "changelog" for a, b in edges):
            name = n["label"]
            cid = add(f"changelog:{app}-{name}-changelog" if app else f"changelog:{name}-changelog", "changelog",
                      f"{app}-{name}-changelog" if app else f"{name}-changelog")
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
