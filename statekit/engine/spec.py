"""`RunSpec`: everything an engine needs to run one sub-topology of a topology as a query.

The App builds one per sub-topology; `SparkEngine.start(run)` (or the local engine) runs it. It is
pickled into Spark's Python workers, so every field must be picklable (the plan is).

The changelog engines do not run tasks themselves: stage 2 hands each task's micro-batch to the
instance that owns the task (`statekit.worker.router.deliver`, through `control_dir`), which
processes, commits and writes the outputs. Spark's own sink is then `noop`. The Spark-native engine
(`engine="spark"`) runs its state inside Spark and uses `sink` and `memory_table`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunSpec:
    app: str                                 # application name (topics `<app>-...`, query name)
    bootstrap: str                           # Kafka bootstrap servers
    plan: Any                                # the sub-topology's statekit.topology.Plan (picklable)
    partitions: int                          # tasks = shuffle partitions = changelog partitions
    checkpoint_dir: str                      # Spark checkpoint (offset log, commit log) of the query
    control_dir: str | None = None           # the application's control directory (assignment, spool)
    subtopology: int = 0                     # which sub-topology this query runs
    trigger: Any = None                      # None (as fast as possible) | "availableNow" | "once" |
    #                                          "2 seconds" / 2.0 (processing time)
    max_records_per_trigger: int | None = None
    starting_offsets: str = "earliest"       # for a new checkpoint: "earliest" | "latest" | JSON
    sink: str = "none"                       # Spark's sink: "none" for the changelog engines (tasks
    #                                          write their outputs); "memory" | "kafka" for native
    memory_table: str | None = None          # the native engine's memory table (default `<app>_output`)
    query_name: str | None = None            # Spark query name (default: `<app>`)
    isolation: str = "read_committed"        # how sources are read (Kafka's isolation.level): an
    #                                          upstream sub-topology's aborted output never counts
    events: bool = True                      # engine-side events (a batch spooled for a dead owner)
    task_timeout: float = 300.0              # seconds the source waits for Kafka before the query
    #                                          fails (App(task_timeout=...); statekit.kafka.retry)
    extra: dict = field(default_factory=dict)
