"""The runtime: an application's lifecycle, instances, assignment, crashes, restarts, standbys,
interactive queries and lag (``statekit.app`` + this package), and the task runner that executes one
task's micro-batch inside an engine worker (``task_runner``, ``events``).

- ``assignment``  sticky task assignment (a pure function), standbys never with their active
- ``lifecycle``   CREATED -> RESTORING -> RUNNING -> ERROR / PENDING_SHUTDOWN -> NOT_RUNNING
- ``layout``      ``<state_dir>/instance-<i>/<app>/<task>``, the engine checkpoint, the control dir
- ``crash``       crash directives (``<control_dir>/crash.json``): written by ``App.crash``, claimed
                  by the first matching task, which SIGKILLs its own worker process
- ``standbys``    one ``state.StandbyReplica`` thread per (task, standby instance); promotion
- ``queries``     key -> task (murmur2 of the serialized key) -> instance -> RocksDB secondary read
- ``lag``         ``App.lag()``: checkpoint / standby position vs changelog end
- ``local_query`` ``App(engine="local")``: Spark's micro-batch contract (offset log, commit log,
                  replay of an uncommitted batch) without Spark, batches in a worker subprocess so a
                  crash is a real process death
"""
