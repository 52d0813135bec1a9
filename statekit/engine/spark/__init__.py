"""statekit on Spark: the `statekit-kafka` data source and sink, the local session, and the engine
that runs a topology Plan as one Structured Streaming query (see engine.py)."""
from __future__ import annotations


def __getattr__(name):  # lazy: importing the package must not start or even import Spark
    if name in ("SparkEngine", "RunningQuery", "EngineError"):
        from statekit.engine.spark import engine

        return getattr(engine, name)
    if name == "RunSpec":
        from statekit.engine.spec import RunSpec

        return RunSpec
    if name in ("get_session", "stop_session"):
        from statekit.engine.spark import session

        return getattr(session, name)
    raise AttributeError(f"module 'statekit.engine.spark' has no attribute {name!r}")
