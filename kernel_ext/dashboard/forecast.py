"""The restore forecast as the dashboard reads it: `App.restore_forecast()`'s result (one row per
task and way back — scratch, checkpoint, standby, warmup — and a line per instance) as plain data,
per task and per instance. The figures are the forecast's own (`statekit.runtime.forecasts`): the
dashboard shows the one a notebook cell printed, never a second opinion."""
from __future__ import annotations

from typing import Optional

from kernel_ext.dashboard.formats import num, records, task_id


def forecast_data(obj) -> dict | None:
    """`App.restore_forecast()`'s result as plain data: ``{"rows": [{task, instance, source, records,
    seconds, ...}], "lines": {instance: "if instance 0 died now: ..."}, "made_at": epoch s}``."""
    if obj is None:
        return None
    if isinstance(obj, dict) and "rows" in obj:
        return obj
    frame = getattr(obj, "frame", obj)
    lines = getattr(obj, "lines", None) or {}
    return {"rows": records(frame), "lines": {int(k): str(v) for k, v in dict(lines).items()},
            "made_at": getattr(obj, "made_at", None)}


def forecast_behind(made_at: Optional[float], committed_at: Optional[float], live: bool) -> bool:
    """A forecast made before the app's last commit, when no newer one can come (the app is not
    running): its records are fewer than the changelogs hold."""
    return made_at is not None and committed_at is not None and made_at < committed_at and not live


def forecast_by_instance(fc: dict | None) -> list[dict]:
    """Per instance, what a restore of its active tasks would take if it died now: ``{"instance",
    "tasks", "scratch_s", "standby_s", "line"}`` (standby_s: its tasks with a replica, each at its
    best replica; None when none has one)."""
    out: dict = {}
    promo: dict = {}
    for r in (fc or {}).get("rows") or []:
        inst = num(r.get("instance"))
        if inst is None:
            continue
        o = out.setdefault(inst, {"instance": inst, "tasks": [], "scratch_s": 0.0, "standby_s": None,
                                  "line": ((fc or {}).get("lines") or {}).get(inst)})
        t = task_id(r.get("task"))
        if t not in o["tasks"]:
            o["tasks"].append(t)
        sec = num(r.get("seconds")) or 0.0
        if r.get("source") == "scratch":
            o["scratch_s"] += sec
        elif r.get("source") in ("standby", "warmup"):
            key = (inst, t)
            promo[key] = min(sec, promo.get(key, sec))
    for (inst, _t), sec in promo.items():
        out[inst]["standby_s"] = (out[inst]["standby_s"] or 0.0) + sec
    return [out[i] for i in sorted(out)]


def forecast_rows(forecast: Optional[dict], task: str, source: Optional[str] = None) -> list:
    return [r for r in (forecast or {}).get("rows") or []
            if task_id(r.get("task")) == task and (source is None or r.get("source") == source)]


def forecast_seconds(fc: Optional[dict], task: str, source: str, records: Optional[int] = None) -> Optional[float]:
    """The forecast seconds of `task` restoring from `source` (scratch, checkpoint, standby, warmup).
    With `records` (what the restore really had to read): None when the forecast counted none of
    them (it was made before they were written) rather than a forecast of nothing."""
    best = None
    for r in forecast_rows(fc, task, source):
        sec = num(r.get("seconds"))
        if records and not num(r.get("records")):
            continue
        if sec is not None and (best is None or sec < best):
            best = sec
    return best
