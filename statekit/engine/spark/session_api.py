"""What statekit asks of a SparkSession, classic or Spark Connect: one small interface, so that
nothing else reaches for ``sparkContext``, ``_jvm`` or ``_jsc``.

    api = session_api.of(spark)          # ClassicSession or ConnectSession
    api.connect                          # a Spark Connect client (no JVM in this process)
    api.master()                         # "local[2]", "spark://h:7077", ... (None: cannot tell)
    api.default_parallelism()
    api.alive()                          # not stopped
    api.register_source()                # the statekit-kafka Python data source, on the server too
    api.executors()                      # {executor id: host} now, or None (Connect: not visible)
    api.jvm("reset() of an s3a:// checkpoint", "delete it with your storage's tools")

A Spark Connect session is one whose class is ``pyspark.sql.connect.session.SparkSession`` (what
``SparkSession.builder.remote(...)``, ``SPARK_REMOTE`` and ``spark.api.mode=connect`` give). Its
queries, SQL settings, Python data sources and Python workers live on the server; what needs the
driver's JVM (Hadoop's FileSystem, Spark's status store, the state store coordinator, killing the
JVM) is refused by ``jvm()`` in one line that says what to do instead, or done another way by the
caller.
"""
from __future__ import annotations

import re
from typing import Optional

from statekit.errors import StatekitError


class ConnectUnsupported(StatekitError):
    """Something that needs the Spark driver's JVM, asked of a Spark Connect session."""


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect client session."""
    if spark is None:
        return False
    return type(spark).__module__.startswith("pyspark.sql.connect")


def of(spark) -> "ClassicSession":
    """The interface to ``spark``: ``ConnectSession`` for a Spark Connect client, else
    ``ClassicSession``."""
    return ConnectSession(spark) if is_connect(spark) else ClassicSession(spark)


_LOCAL_CORES = re.compile(r"^local\[(\d+|\*)(?:,\d+)?\]$")


class ClassicSession:
    """A session whose driver JVM runs in this process (pyspark's Py4J gateway)."""

    connect = False

    def __init__(self, spark):
        self.spark = spark

    def master(self) -> Optional[str]:
        try:
            return str(self.spark.sparkContext.master)
        except Exception:  # noqa: BLE001 - a session going away
            return None

    def default_parallelism(self) -> int:
        return int(self.spark.sparkContext.defaultParallelism)

    def alive(self) -> bool:
        try:
            return self.spark.sparkContext._jsc is not None
        except Exception:  # noqa: BLE001
            return False

    def register_source(self) -> None:
        from statekit.engine.spark.source import register

        register(self.spark)

    def executors(self) -> Optional[dict]:
        """``{executor id: host}`` of the live executors (the driver left out)."""
        try:
            store = self.spark.sparkContext._jsc.sc().statusStore()
            rows = store.executorList(True)
            out = {}
            it = rows.iterator()
            while it.hasNext():
                x = it.next()
                eid = str(x.id())
                if eid == "driver" or not x.isActive():
                    continue
                out[eid] = str(x.hostPort()).rsplit(":", 1)[0]
            return out
        except Exception:  # noqa: BLE001 - a session going away
            return None

    def jvm(self, what: str = "", instead: str = ""):
        """The driver's JVM view (Py4J)."""
        return self.spark.sparkContext._jvm


class ConnectSession(ClassicSession):
    """A Spark Connect client: the driver (and its JVM) is the server's."""

    connect = True

    def master(self) -> Optional[str]:
        try:
            return self.spark.conf.get("spark.master", None)
        except Exception:  # noqa: BLE001
            return None

    def default_parallelism(self) -> int:
        """``spark.default.parallelism`` when the server sets it, the cores of a ``local[N]``
        master, else the partitions of a range the server plans by its own default (one small
        job, no Python)."""
        try:
            conf = self.spark.conf.get("spark.default.parallelism", None)
            if conf:
                return int(conf)
        except Exception:  # noqa: BLE001
            pass
        m = _LOCAL_CORES.match(self.master() or "")
        if m and m.group(1) != "*":
            return int(m.group(1))
        try:
            from pyspark.sql import functions as F

            row = self.spark.range(0, 1 << 16).select(F.max(F.spark_partition_id()).alias("p")).first()
            return int(row["p"]) + 1
        except Exception:  # noqa: BLE001
            return 2

    def alive(self) -> bool:
        try:
            return not bool(self.spark.is_stopped)
        except Exception:  # noqa: BLE001
            return False

    def register_source(self) -> None:
        """Register on the server (the server's Python workers import the class's module)."""
        if getattr(self.spark, "_statekit_kafka_registered", False):
            return
        from statekit.engine.spark.source import KafkaDataSource

        try:
            self.spark.dataSource.register(KafkaDataSource)
        except Exception as exc:  # noqa: BLE001
            if "already exists" not in str(exc):
                raise
        try:
            self.spark._statekit_kafka_registered = True
        except Exception:  # noqa: BLE001
            pass

    def executors(self) -> Optional[dict]:
        return None

    def jvm(self, what: str = "this", instead: str = ""):
        raise ConnectUnsupported(f"{what} needs the Spark driver's JVM, which a Spark Connect session "
                                 f"does not reach" + (f": {instead}" if instead else ""))
