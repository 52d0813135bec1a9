"""statekit.state — task state: checkpoint files, the commit protocol, restoration, standby replicas,
inspection. See docs/ARCHITECTURE.md ("Task state and the commit protocol").

Public API::

    from statekit.state import TaskState, StandbyReplica, inspect_task, SimulatedCrash

    task = TaskState("wordcount", 3, [StoreSpec("counts")], state_dir="/state", kafka=k, num_tasks=8)
    task.restore_metrics           # {store: RestoreMetrics} of the restore done on open
    if not task.already_applied(batch_id):
        task["counts"].put("word", 1)
        task.commit(batch_id)       # the 4 steps; crash hooks: crash="after_ack@7" / STATEKIT_CRASH
    task.close()

    sb = StandbyReplica("wordcount", 3, [StoreSpec("counts")], state_dir="/standby", bootstrap=b)
    sb.start(); sb.lag(); task_dir = sb.promote()

    f = forecast_task(k, "wordcount", 3, [StoreSpec("counts")], None)   # from scratch, now
    f.describe()                   # "≈ 4.1 s from scratch (1,000,100 records at 245,000 records/s, ...)"
"""
from __future__ import annotations

from statekit.state.checkpoint import StoreCheckpoint
from statekit.state.crash import POINTS as CRASH_POINTS, CrashPlan, SimulatedCrash
from statekit.state.restore import (BATCH_HEADER, MARKER_HEADER, MARKER_KEY, RestoreListener,
                                    RestoreMetrics, StoreReplay)
from statekit.state.task import (ChangelogBuffer, CommitInfo, TaskState, changelog_configs,
                                 task_dir_for)


def __getattr__(name):  # the standby and inspection modules load on demand
    if name == "StandbyReplica":
        from statekit.state.standby import StandbyReplica

        return StandbyReplica
    if name in ("forecast_task", "TaskForecast", "StoreForecast"):
        from statekit.state import forecast as _forecast

        return getattr(_forecast, name)
    if name in ("inspect_task", "TaskInspector"):
        from statekit.state import inspect as _inspect

        return getattr(_inspect, name)
    raise AttributeError(f"module 'statekit.state' has no attribute {name!r}")


__all__ = [
    "TaskState", "StandbyReplica", "inspect_task", "TaskInspector", "SimulatedCrash", "CrashPlan",
    "CRASH_POINTS", "RestoreMetrics", "RestoreListener", "StoreReplay", "StoreCheckpoint",
    "ChangelogBuffer", "CommitInfo", "changelog_configs", "task_dir_for",
    "MARKER_KEY", "MARKER_HEADER", "BATCH_HEADER", "forecast_task", "TaskForecast", "StoreForecast",
]
