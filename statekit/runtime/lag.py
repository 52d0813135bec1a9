"""``App.lag()``: how far each copy of each store is behind its changelog.

One row per (task, instance, store): the active copy (its ``.checkpoint``: the changelog offset of
its last commit) and every standby replica (the offset it has applied so far). ``lag`` = changelog
end - checkpoint offset: the records a restore (or a promotion) of that copy would replay.
"""
from __future__ import annotations

COLUMNS = ["task", "instance", "role", "store", "checkpoint_offset", "changelog_end", "lag"]


def lag_frame(app):
    import pandas as pd

    from statekit.state import checkpoint as ckpt

    a = app.assignment
    if a is None:
        return pd.DataFrame(columns=COLUMNS)
    plan = app.plan or app._compile()
    stores = [s.name for s in plan.stores if getattr(s, "logging", True)]
    ends = {}
    for s in stores:
        try:
            ends[s] = app.kafka.end_offsets(app.changelog_topic(s))
        except Exception:
            ends[s] = {}
    standby_rows = {}
    if app.standbys is not None:
        for row in app.standbys.lag_rows():
            standby_rows[(row["task"], row["instance"], row["store"])] = row
    rows = []
    for t in a.tasks:
        for inst, role in a.instances_of(t):
            if role == "active":
                cp = ckpt.read(app.layout.task_dir(inst, t), warn=lambda m: None) or {}
                for s in stores:
                    end = ends[s].get(t)
                    off = cp[s].changelog_offset if s in cp else None
                    lag = None if end is None else end - (off or 0)
                    rows.append({"task": t, "instance": inst, "role": role, "store": s,
                                 "checkpoint_offset": off, "changelog_end": end,
                                 "lag": None if lag is None else max(0, lag)})
            else:
                for s in stores:
                    r = standby_rows.get((t, inst, s))
                    end = ends[s].get(t)
                    off = r.get("offset") if r else None
                    if r and r.get("end") is not None and end is not None:
                        end = max(end, r["end"])
                    lag = None if end is None else end - (off or 0)
                    rows.append({"task": t, "instance": inst, "role": role, "store": s,
                                 "checkpoint_offset": off, "changelog_end": end,
                                 "lag": None if lag is None else max(0, lag)})
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df
