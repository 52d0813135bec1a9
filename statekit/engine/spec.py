"""`RunSpec`: everything an engine needs to run one application's topology (engine-agnostic).

The runtime builds it; `statekit.engine.spark.SparkEngine.start(run)` runs it. It is pickled into
Spark's Python workers, so every field must be picklable (the plan is).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_TASK_FN = "statekit.runtime.task_runner:run_task_batch"


@dataclass
class RunSpec:
    app: str                                 # application name (topics `<app>-...`, query name)
    bootstrap: str                           # Kafka bootstrap servers
    plan: Any                                # statekit.topology.Plan (picklable)
    partitions: int                          # tasks = shuffle partitions = changelog partitions
    checkpoint_dir: str                      # Spark checkpoint (offset log, commit log) of the query
    control_dir: str | None = None           # crash directives (`crash.json`) and other control files
    state_dirs: dict[int, str] = field(default_factory=dict)  # task -> state dir of its active instance
    task_instances: dict[int, Any] = field(default_factory=dict)  # task -> instance that runs it
    cache_bytes: int = 10 << 20              # record cache per task
    commit_interval: float | None = None     # seconds; the App's default trigger (tasks commit at
    #                                          the end of every micro-batch)
    trigger: Any = None                      # None (as fast as possible) | "availableNow" | "once" |
    #                                          "2 seconds" / 2.0 (processing time)
    max_records_per_trigger: int | None = None
    starting_offsets: str = "earliest"       # for a new checkpoint: "earliest" | "latest" | JSON
    sink: str = "kafka"                      # "kafka" (the plan's sink topics) | "memory" | "none"
    memory_table: str | None = None          # the memory sink's table (default: `<app>_output`)
    query_name: str | None = None            # Spark query name (default: `<app>`)
    task_fn: Any = DEFAULT_TASK_FN           # "module:function" or a picklable callable, called as
    #                                          task_fn(task_spec, task, batch_id, records) -> outputs
    task_spec: Any = None                    # what task_fn gets as its spec (None: this RunSpec)
    extra: dict = field(default_factory=dict)  # anything else the runtime wants to hand to tasks

    def resolve_task_fn(self):
        fn = self.task_fn
        if isinstance(fn, str):
            import importlib

            mod, _, name = fn.partition(":")
            fn = getattr(importlib.import_module(mod), name)
        return fn
