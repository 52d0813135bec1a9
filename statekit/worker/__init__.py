"""The worker side: what runs in instance processes, and how engines reach it.

- ``instance``  the instance process (``python -m statekit.worker.instance``): serves its tasks
- ``host``      the tasks of one instance: active tasks open across batches, standby and warmup
                replicas, spools, assignment changes (Kafka Streams' TaskManager)
- ``task``      one stream task: open (restore), process a micro-batch, commit, close
- ``router``    the engines' side: deliver a task's micro-batch to its owner, or spool it
- ``spool``     micro-batches waiting for a task that cannot process them yet
- ``output``    the memory sink (per task and batch, in the control directory)
- ``protocol``  the authenticated calls between engines, the App and instances; the batch format
- ``crash``     crash directives: written by the App, claimed by the task that reaches the point
"""
