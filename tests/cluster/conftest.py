"""tests/cluster: a local SparkSession for the tests that check Spark's own rules (the salts); the
cluster scenario starts its own cluster in a process of its own."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from statekit.engine.spark.session import get_session, stop_session

    session = get_session("statekit-tests")
    try:
        yield session
    finally:
        stop_session()
