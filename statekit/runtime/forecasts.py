"""``App.restore_forecast()``: before anything crashes, how long each task's restore would take.

For every active task, three ways it could come back: from its checkpoint (its instance crashes and
comes back with its disk), from a standby or warmup replica (a promotion: only the replica's lag),
and from scratch (the disk is lost and no replica exists: the whole changelog). The records come
from the changelogs (``statekit.state.forecast``), the seconds from the apply rate of the last
full-speed restore the instances reported (their ``RestoreEnded`` events), else a calibration: a
real restore of part of a changelog into a throw-away RocksDB, run by the instance that owns the task.
Per instance, one sentence a person can read: "if instance 0 died now: ≈ 4.1 s from scratch for
0_0 and 0_2 (1,002,003 records), 0.2 s from their standbys".

One forecast per application at a time: every forecast made is remembered (``latest``), so a
notebook cell and the dashboard show the same figure — the dashboard shows the latest one whoever
made it, and makes one itself only when none is recent.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Optional

COLUMNS = ["task", "instance", "source", "from_instance", "records", "seconds", "apply_rate",
           "rate_source", "load", "exact"]


@dataclass
class RestoreForecast:
    """``frame``: one row per (task, way back); ``lines``: per instance, what its death would cost."""

    frame: object
    lines: dict = field(default_factory=dict)
    made_at: float = field(default_factory=time.time)   # epoch seconds

    def line(self, instance: int) -> str:
        return self.lines.get(int(instance), f"instance {instance} runs no task")

    def __repr__(self) -> str:
        return "\n".join(self.lines.values()) or "no task to forecast"

    def _repr_html_(self) -> str:
        import html

        items = "".join(f"<li>{html.escape(v)}</li>" for v in self.lines.values())
        return f"<ul>{items}</ul>" + self.frame.to_html(index=False)


_latest: dict = {}   # application -> its latest RestoreForecast
_latest_lock = threading.Lock()
_making: dict = {}   # application -> forecasts being made now


class making:
    """``with making(app):`` around a forecast being made (its calibration takes seconds on a busy
    machine): the dashboard starts none of its own meanwhile, so the one a cell prints is the
    latest, and the one the dashboard shows."""

    def __init__(self, application: str):
        self.application = application

    def __enter__(self):
        with _latest_lock:
            _making[self.application] = _making.get(self.application, 0) + 1
        return self

    def __exit__(self, *exc):
        with _latest_lock:
            n = _making.get(self.application, 1) - 1
            if n > 0:
                _making[self.application] = n
            else:
                _making.pop(self.application, None)


def in_flight(application: str) -> bool:
    """Whether a forecast for ``application`` is being made now."""
    with _latest_lock:
        return _making.get(application, 0) > 0


def latest(application: str) -> Optional[RestoreForecast]:
    """The latest forecast made for ``application`` in this process (None: none yet)."""
    with _latest_lock:
        return _latest.get(application)


def _remember(application: str, fc: RestoreForecast) -> RestoreForecast:
    with _latest_lock:
        old = _latest.get(application)
        if old is None or fc.made_at >= old.made_at:
            _latest[application] = fc
    return fc


def last_apply_rate(events) -> Optional[float]:
    """The rate of the most recent full-speed restore big enough to say something."""
    for e in reversed(events):
        if e.type == "restore_end" and not e.throttle_rps and e.restored >= 10_000 and e.rate_rps:
            return float(e.rate_rps)
    return None


def _secs(s: float) -> str:
    return f"{s:.1f} s" if s >= 0.1 else f"{s * 1000:.0f} ms"


def forecast(application: str, assignment, statuses: dict, plans: dict, kafka, layout,
             apply_rate: Optional[float] = None, rate_source: Optional[str] = None,
             calibrator=None) -> RestoreForecast:
    """``apply_rate`` (labelled ``rate_source``): records/s; without it, one calibration
    (``calibrator(topic, partition)``: by an instance) serves every task."""
    import pandas as pd

    from statekit.state import checkpoint as ckpt
    from statekit.state.forecast import forecast_task
    from statekit.worker.task import store_specs

    made_at = time.time()
    rows = []
    load = None   # the load of the one calibration every task's seconds are based on
    if assignment is None:
        return _remember(application, RestoreForecast(pd.DataFrame(columns=COLUMNS), made_at=made_at))
    for t in assignment.tasks:
        specs = store_specs(plans[t.subtopology], t.subtopology)
        owner = assignment.active[t]
        ways = [("scratch", None, None)]
        cp = ckpt.read(layout.task_dir(owner, t), warn=lambda m: None)
        if cp:
            ways.append(("checkpoint", owner, {k: v.changelog_offset for k, v in cp.items()}))
        for inst, role in assignment.roles(t)[1:]:
            rep = ((statuses.get(inst) or {}).get("replicas") or {}).get(str(t))
            if rep is not None:
                ways.append((role, inst, rep.get("positions") or {}))
        for source, inst, positions in ways:
            f = forecast_task(kafka, application, t.partition, specs, positions, source=source,
                              apply_rate=apply_rate, rate_source=rate_source,
                              calibrator=calibrator)
            rows.append({"task": str(t), "instance": owner, "source": source, "from_instance": inst,
                         "records": f.records, "seconds": f.seconds, "apply_rate": f.apply_rate,
                         "rate_source": f.rate_source, "load": f.load if load is None else load,
                         "exact": f.exact})
            if apply_rate is None and f.records:   # one calibration is enough
                apply_rate, rate_source, load = f.apply_rate, f.rate_source, f.load
    df = pd.DataFrame(rows, columns=COLUMNS)
    lines = {}
    for inst in sorted(set(assignment.active.values())):
        mine = df[df.instance == inst]
        tasks = sorted(set(mine.task))
        scratch = mine[mine.source == "scratch"]
        text = (f"if instance {inst} died now: ≈ {_secs(scratch.seconds.sum())} from scratch for "
                f"{', '.join(tasks)} ({int(scratch.records.sum()):,} records)")
        promo = mine[mine.source.isin(["standby", "warmup"])]
        if len(promo):
            best = promo.groupby("task").seconds.min()
            covered = len(best)
            text += (f", {_secs(best.sum())} from their standbys" if covered == len(tasks) else
                     f", {_secs(best.sum())} for the {covered} of them with a standby")
        cpt = mine[mine.source == "checkpoint"]
        if len(cpt):
            text += f"; back with its disk: {_secs(cpt.seconds.sum())} from its checkpoints"
        lines[inst] = text
    return _remember(application, RestoreForecast(df, lines, made_at))
