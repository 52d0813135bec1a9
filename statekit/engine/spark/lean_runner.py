"""pyspark's streaming source runner, without pyarrow.

Spark starts one `python -m pyspark.sql.streaming.python_streaming_source_runner` per running
query with a Python source, and it lives as long as the query. That module imports
`records_to_arrow_batches` from `pyspark.sql.worker.plan_data_source_read`, which imports pyarrow
and numpy at its top: about 30 MB of the runner's memory and 0.1 s of its start, on the path of
every query's start, for a function only a `SimpleDataSourceStreamReader` calls. statekit's reader
hands Spark offsets and partitions, never rows, so its runner never calls it.

The venv's `statekit-spark-workers.pth` (scripts/spark_workers_pth.py) calls `install()` in that
process only, before the runner's imports: a stand-in module then holds a `records_to_arrow_batches`
that imports the real module on its first call and hands over to it, so a source whose reader does
return rows still gets the real function.
"""
from __future__ import annotations

import importlib
import sys
import types

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
HEAVY = "pyspark.sql.worker.plan_data_source_read"


def _real():
    """The real module, imported now (the stand-in leaves ``sys.modules`` first)."""
    if isinstance(sys.modules.get(HEAVY), _StandIn):
        del sys.modules[HEAVY]
    return importlib.import_module(HEAVY)


def records_to_arrow_batches(*args, **kwargs):
    return _real().records_to_arrow_batches(*args, **kwargs)


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):     # the import system's questions (a __path__?): not the module's
            raise AttributeError(name)
        return getattr(_real(), name)  # anything else the module has: the real one's


def install() -> bool:
    """Put the stand-in in place of ``HEAVY`` unless it is imported already; whether it did."""
    if HEAVY in sys.modules:
        return False
    stand_in = _StandIn(HEAVY, __doc__)
    stand_in.records_to_arrow_batches = records_to_arrow_batches
    sys.modules[HEAVY] = stand_in
    return True
