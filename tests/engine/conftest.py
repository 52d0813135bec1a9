"""Spark fixtures for the engine tests: one local SparkSession for the whole test session, stopped
(JVM included) at the end, even when tests fail."""
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
