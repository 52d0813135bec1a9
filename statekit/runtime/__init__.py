"""The runtime: an application's lifecycle, instances, assignment, crashes, restarts, standbys,
interactive queries and lag (statekit.app + this package), and the task runner that executes one
task's micro-batch inside an engine worker (task_runner, events)."""
