"""``App.lag()``: how far each copy of each store is behind its changelog.

One row per (task, instance, store) for every copy the assignment names: the active one (the
changelog offset of its last commit, or of its restore so far) and every standby and warmup replica
(the offset it has applied so far), as the instances report them. ``lag`` = changelog end - offset:
the records a restore (or a promotion) of that copy would replay.
"""
from __future__ import annotations

COLUMNS = ["task", "instance", "role", "state", "store", "checkpoint_offset", "changelog_end", "lag"]


def lag_rows(application: str, assignment, statuses: dict, plans: dict, kafka, layout) -> list:
    from statekit.contracts import changelog_topic
    from statekit.state import checkpoint as ckpt
    from statekit.worker.task import is_task_store, store_specs

    if assignment is None:
        return []
    stores = {sub: [s.name for s in store_specs(p, sub)
                    if getattr(s, "logging", True) and not is_task_store(s.name)]
              for sub, p in plans.items()}
    ends: dict = {}
    for sub, names in stores.items():
        for s in names:
            try:
                ends[s] = kafka.end_offsets(changelog_topic(application, s))
            except Exception:  # noqa: BLE001 - a changelog not created yet
                ends[s] = {}
    rows = []
    for t in assignment.tasks:
        for inst, role in assignment.roles(t):
            st = statuses.get(inst) or {}
            row = (st.get("tasks") if role == "active" else st.get("replicas") or {}) or {}
            row = row.get(str(t)) or {}
            positions = row.get("positions") or {}
            if role == "active" and not positions:
                cp = ckpt.read(layout.task_dir(inst, t), warn=lambda m: None) or {}
                positions = {k: v.changelog_offset for k, v in cp.items()}
            for s in stores.get(t.subtopology, ()):
                end = ends.get(s, {}).get(t.partition)
                off = positions.get(s)
                # no position reported yet (a task just promoted or assigned): unknown, not the
                # whole changelog (a dashboard would draw the end as a lag spike)
                lag = None if end is None or off is None else max(0, end - off)
                rows.append({"task": str(t), "instance": inst, "role": role,
                             "state": row.get("state", role if row else "unknown"), "store": s,
                             "checkpoint_offset": off, "changelog_end": end, "lag": lag})
    return rows


def lag_frame(rows: list):
    import pandas as pd

    return pd.DataFrame(rows, columns=COLUMNS)
