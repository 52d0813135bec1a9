"""The control side of an application (``statekit.app.App`` is its façade).

- ``coordinator`` membership (instances start, die, join, leave), rebalances with generations,
                  probing rebalances for warmups; writes ``control/assignment.json``
- ``assignor``    the high-availability assignment (a pure function): sticky, balanced, actives
                  move only to caught-up copies, warmups, standbys never with their active
- ``supervisor``  instance processes: start, stop, SIGKILL
- ``lifecycle``   CREATED -> RESTORING -> RUNNING <-> REBALANCING -> ERROR / NOT_RUNNING
- ``queries``     key -> task (murmur2 of the serialized key) -> a copy fresh enough -> RocksDB
                  secondary read
- ``copies``      a task's copies, how far behind its changelog each is, the answer and the refusal
- ``lag``         ``App.lag()``: every copy's position vs its changelog's end

The App's parts (``statekit.app.App`` holds one of each and delegates to it):

- ``runner``        start, the monitor, ``process_all_available``, stop, restart
- ``inspection``    read-only views: lag, forecasts, task status, restores, progress, output
- ``app_events``    the events read, published and called back
- ``crash_control`` crash requests, the pending directive, its withdrawal
- ``deployment``    the engine and the placement object (instances or executors)
- ``app_topics``    source topics checked, internal topics created and deleted

The worker side (instances, tasks, the engines' router, crash directives) is ``statekit.worker``.
"""
