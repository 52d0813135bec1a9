"""tests/runtime: the helpers beside this file are importable (harness)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import pytest


@pytest.fixture(scope="session")
def spark_session():
    """One local SparkSession for the runtime's Spark tests, stopped (JVM included) at the end."""
    from statekit.engine.spark.session import get_session, stop_session

    session = get_session("statekit-runtime-tests")
    try:
        yield session
    finally:
        stop_session()


@pytest.fixture
def own_kafka(broker):
    """A statekit Kafka client on this test's own broker (``broker``), closed after the test; the
    shared ``kafka`` fixture talks to the session's shared broker instead."""
    from statekit.kafka import Kafka

    k = Kafka(broker.bootstrap)
    try:
        yield k
    finally:
        k.close()
