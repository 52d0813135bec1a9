"""tests/engine_native: one embedded broker and one Spark session (native state store settings) per
module, both stopped at the end even on failure; the helpers beside this file are importable."""
from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(scope="module")
def native_broker(tmp_path_factory):
    from statekit import broker as broker_mod

    handle = broker_mod.start(dir=str(tmp_path_factory.mktemp("native-broker")), port=0)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def native_spark():
    """One session for the module (maintenance every second so snapshots reach the checkpoint
    quickly). A test that kills the JVM leaves a new session behind: whatever is active at the end
    is stopped, JVM included. A session another module left running is stopped first:
    native_session would reuse it, without the spark.local.dir of statekit's own under which a
    crash finds the RocksDB working dirs to delete."""
    from statekit.engine.spark.session import stop_session
    from statekit.engine.spark_native.engine import native_session, stop_native_session

    stop_session()
    try:
        yield native_session(min_deltas_for_snapshot=10, maintenance_interval=1)
    finally:
        stop_native_session()
