"""Spark's lookup of the Python data sources that installed packages declare, started early.

Spark runs that lookup (a `lookup_data_sources` planner: a Python process, ~0.35 s) when a session
first registers or reads a Python data source: statekit's source, right after the session is
built, on the critical path of every cold launch. Started from a thread as soon as the
SparkContext exists, the same lookup runs on the other core while the JVM builds the SparkSession
(~0.6 s of Scala initialisation), and the session finds the JVM-wide result cached
(`DataSourceManager.dataSourceBuilders`). The names called are Spark 4.3's (a Scala object's
private method, public in bytecode); on another Spark the call fails and the session looks the
sources up itself, as before.
"""
from __future__ import annotations

import threading
import time

_LOOKUP = ("org.apache.spark.sql.execution.datasources.DataSourceManager$",
           "org$apache$spark$sql$execution$datasources$DataSourceManager$$initialStaticDataSourceBuilders")
EARLY_LOOKUP: dict = {}   # how the last early lookup went: {"ok": bool}


def look_up_data_sources_early(timeout: float = 60.0) -> threading.Thread:
    """Start the lookup from a thread that waits (up to ``timeout``) for the SparkContext; on
    anything unexpected it does nothing, and the session looks the sources up itself."""
    EARLY_LOOKUP.clear()

    def run():
        from pyspark import SparkContext

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sc = SparkContext._active_spark_context
            if sc is not None and getattr(sc, "_jsc", None) is not None:
                break
            time.sleep(0.01)
        else:
            return
        try:
            manager = getattr(getattr(sc._jvm, _LOOKUP[0]), "MODULE$")
            getattr(manager, _LOOKUP[1])()
            EARLY_LOOKUP["ok"] = True
        except Exception:  # noqa: BLE001 - the session's own lookup runs as it always did
            EARLY_LOOKUP["ok"] = False

    t = threading.Thread(target=run, name="statekit-spark-lookup", daemon=True)
    t.start()
    return t
