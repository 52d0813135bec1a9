"""Spark's Python worker daemon for statekit's sessions (`spark.python.daemon.module`): pyspark's
own daemon, started with what statekit's Python workers import already loaded and frozen out of
the garbage collector.

pyspark's daemon forks a worker per concurrent task, each worker imports pyarrow (pandas too for
the executors placement's `applyInPandasWithState`) and the statekit modules of its first task,
and runs a full `gc.collect()` after every task it runs. With those imports a worker holds about
75,000 objects for each of those collections to walk (~25 ms a task here: about 30% of the Python
workers' CPU in notebook 10), and each new worker pays about 0.3 s of CPU to import them. Imported
here once, before the fork, and frozen (`gc.freeze()`: kept out of every later collection), they
are shared by every worker the daemon forks.

pandas is imported only where the session runs on a cluster (`STATEKIT_DAEMON_PANDAS=1`, set by
`session.get_session` through `spark.executorEnv`): the instances placement's stage (`mapInArrow`)
never imports it, and the daemon outlives its workers (Spark ends a worker after a minute without
a task), so an idle local session would keep ~45 MB of pandas for nothing.

Forking after these imports is safe: numpy's OpenBLAS and Arrow's jemalloc start threads at import,
and both prepare for a fork (pthread_atfork) and restart them in the child when needed.
"""
import gc
import os

import pyarrow  # noqa: F401

if os.environ.get("STATEKIT_DAEMON_PANDAS") == "1":
    import pandas  # noqa: F401

import pyspark.daemon
import pyspark.sql.pandas.serializers  # noqa: F401
import pyspark.worker  # noqa: F401

import statekit.engine.spark.engine  # noqa: F401
from statekit.engine.spark.quiet import quiet_daemon
import statekit.engine.spark.sink  # noqa: F401
import statekit.engine.spark.source  # noqa: F401
import statekit.event_bus  # noqa: F401
import statekit.worker.exchange  # noqa: F401

gc.freeze()


if __name__ == "__main__":
    quiet_daemon()          # no one-second poll while no task comes
    pyspark.daemon.manager()
