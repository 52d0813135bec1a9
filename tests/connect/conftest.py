"""tests/connect: one local Spark Connect server per module, started from pyspark's own files on an
ephemeral port and stopped after it (every process it started included), even on failure."""
from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    from statekit.engine.spark.connect_server import ConnectServer

    server = ConnectServer(str(tmp_path_factory.mktemp("connect-server")), master="local[2]")
    server.start()
    try:
        yield server
    finally:
        left = server.stop()
        assert left == [], f"processes of the Connect server still alive: {left}"

