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


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    """One embedded broker per test module (+ a statekit.kafka client on it)."""
    from statekit import broker as broker_mod
    from statekit.kafka import Kafka

    handle = broker_mod.start(dir=str(tmp_path_factory.mktemp("broker")), port=0)
    client = None
    try:
        client = Kafka(handle.bootstrap)
        yield handle, client
    finally:
        if client is not None:
            client.close()
        handle.stop()
