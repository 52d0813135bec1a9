"""statekit: watch stateful stream processing keep its state.

Local RocksDB stores, a record cache, changelog topics in Kafka, restoration and standby replicas,
run as Spark Structured Streaming queries. See docs/ARCHITECTURE.md for the layers.
"""
from __future__ import annotations

__version__ = "0.1.0"

from statekit.kafka_import import defer_clients as _defer_kafka_clients  # noqa: E402

_defer_kafka_clients()   # kafka-python's clients import only when asked for (kafka_import.py)


def __getattr__(name):  # lazy: importing statekit must not pull in Spark
    if name == "App":
        from statekit.app import App

        return App
    if name == "NativeApp":
        from statekit.engine.spark_native import NativeApp

        return NativeApp
    raise AttributeError(f"module 'statekit' has no attribute {name!r}")
