"""Spark's Python worker daemon for statekit's sessions (`spark.python.daemon.module`): pyspark's
own daemon, started with statekit's worker-side modules loaded and frozen out of the garbage
collector, and forking workers that import pyarrow themselves.

pyspark's daemon forks a worker per concurrent task, and each worker runs a full `gc.collect()`
after every task it runs. A worker that imported statekit's modules and pyarrow holds about
75,000 objects for each of those collections to walk (~25 ms a task here: about 30% of the Python
workers' CPU in notebook 10). So the pure-Python modules are imported here once, before the fork,
and frozen (`gc.freeze()`: kept out of every later collection); a worker imports pyarrow (pandas
too for a cluster's executors placement, `STATEKIT_DAEMON_PANDAS=1`, set by `session.get_session`
through `spark.executorEnv`) before its first task and freezes again.

pyarrow and numpy stay out of the daemon because the daemon outlives its workers: Spark ends a
worker after a minute without a task, and the daemon of an idle app would go on holding about
65 MB of their libraries for no one. A worker pays ~0.15 s to import them, once in its life: the
first batch after a minute idle waits for it (a record queryable ~0.2 s later than before).
Importing them after the fork is also what pyspark itself does: both start threads at import.
"""
import gc
import os

import pyspark.daemon
import pyspark.sql.pandas.serializers  # noqa: F401
import pyspark.worker

import statekit.engine.spark.engine  # noqa: F401
from statekit.engine.spark.quiet import quiet_daemon
import statekit.engine.spark.sink  # noqa: F401
import statekit.engine.spark.source  # noqa: F401
import statekit.event_bus  # noqa: F401
import statekit.worker.exchange  # noqa: F401

gc.freeze()


def with_worker_imports(main):
    """pyspark's worker ``main``, preceded in each worker, once, by the imports that stay out of
    the daemon, frozen as the daemon's are."""
    ready = False

    def first_imports_then_main(infile, outfile):
        nonlocal ready
        if not ready:       # the daemon's False, inherited by each fork; True after its first task
            import pyarrow  # noqa: F401

            if os.environ.get("STATEKIT_DAEMON_PANDAS") == "1":
                import pandas  # noqa: F401
            gc.freeze()
            ready = True
        return main(infile, outfile)

    return first_imports_then_main


if __name__ == "__main__":
    pyspark.worker.main = with_worker_imports(pyspark.worker.main)  # pyspark.daemon looks it up per fork
    quiet_daemon()          # no one-second poll while no task comes
    pyspark.daemon.manager()
