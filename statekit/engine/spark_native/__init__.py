"""statekit on Spark's own state store (RocksDBStateStoreProvider, changelog checkpointing), side by
side with the changelog engine (`statekit.engine.spark`). See engine.py, translate.py, inspect.py and
app.py (`NativeApp`: start / stop / crash / restart / query_all / metrics)."""
from __future__ import annotations

_ENGINE = ("SparkNativeEngine", "NativeQuery", "native_session", "native_conf", "kill_jvm",
           "wipe_rocksdb_dirs", "rocksdb_working_dirs", "unload_state_stores", "stop_native_session")
_INSPECT = ("checkpoint_files", "changelog_lag", "read_store", "state_metadata", "state_operator_metrics",
            "restore_metrics", "checkpoint_bytes")


def __getattr__(name):  # lazy: importing the package must not import Spark
    if name in _ENGINE:
        from statekit.engine.spark_native import engine

        return getattr(engine, name)
    if name in _INSPECT:
        from statekit.engine.spark_native import inspect

        return getattr(inspect, name)
    if name == "NativeApp":
        from statekit.engine.spark_native.app import NativeApp

        return NativeApp
    raise AttributeError(f"module 'statekit.engine.spark_native' has no attribute {name!r}")


__all__ = list(_ENGINE + _INSPECT + ("NativeApp",))
