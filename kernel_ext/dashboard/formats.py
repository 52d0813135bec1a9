"""How the dashboard spells things: task ids, numbers, durations, rates and clipped one-line text.
Pure Python, shared by the model and the panels (so a figure reads the same in every panel)."""
from __future__ import annotations

import functools
import math
import re


def num(x, default=None):
    """A finite number as int when whole, else float; `default` for None, NaN or garbage."""
    if x is None:
        return default
    try:
        f = float(x)
    except (TypeError, ValueError):
        return default
    if math.isnan(f) or math.isinf(f):
        return default
    return int(f) if f.is_integer() else f


def task_id(x) -> str | None:
    """Any spelling of a task ("0_3", 3, (0, 3), TaskId) as Kafka Streams' "0_3"."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    if isinstance(x, str):
        return _task_id_str(x)
    from statekit.contracts import TaskId

    try:
        return str(TaskId.parse(int(x) if isinstance(x, float) else x))
    except (ValueError, TypeError):
        return str(x)


@functools.lru_cache(maxsize=4096)
def _task_id_str(x: str) -> str:
    from statekit.contracts import TaskId

    try:
        return str(TaskId.parse(x))
    except (ValueError, TypeError):
        return x


@functools.lru_cache(maxsize=4096)
def task_order(t) -> tuple:
    """Sort key of a task id: sub-topology, then partition; anything else after them."""
    from statekit.contracts import TaskId

    try:
        return (0, TaskId.parse(t))
    except (ValueError, TypeError):
        return (1, (0, 0), str(t))


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1:
        return "<1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def fmt_secs(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 100:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s"


def fmt_num(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:,.2f}".rstrip("0").rstrip(".")
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def fmt_rate(x) -> str:
    if x is None:
        return "–"
    if x >= 10_000:
        return f"{x / 1000:,.0f}k/s"
    return f"{x:,.0f}/s"


def clip(text, n: int) -> str:
    """At most `n` characters of one line of text (raw, before any HTML escaping: an escaped entity is
    never cut), with an ellipsis when shortened."""
    s = " ".join(str(text).split())
    return s if len(s) <= n else s[: max(0, n - 1)].rstrip() + "…"


_EXC_RE = re.compile(r"\b[A-Z][A-Za-z0-9_]*(?:Error|Exception|Interrupt|Exit)\b: .*$")
_STEP_RE = re.compile(r"\(([a-z][a-z -]{1,40})\) failed")


def short_error(text: str) -> str:
    """The part of a one-line error a badge can show: "map values failed: ZeroDivisionError:
    division by zero" for a user function's error (the whole line stays on the error strip)."""
    text = " ".join(str(text).split())
    m = _EXC_RE.search(text)
    if not m or m.start() == 0:
        return text
    step = _STEP_RE.search(text[: m.start()])
    return f"{step.group(1)} failed: {m.group(0)}" if step else m.group(0)


def records(obj) -> list[dict]:
    """A pandas DataFrame, a list of dicts or a dict of dicts -> list of dicts."""
    if obj is None:
        return []
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):
        return obj.to_dict("records")
    if isinstance(obj, dict):
        return [dict(v, task=k) if isinstance(v, dict) else {"task": k, "value": v} for k, v in obj.items()]
    return [dict(r) if not isinstance(r, dict) else r for r in obj]
