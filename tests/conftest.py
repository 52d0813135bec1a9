"""Shared fixtures: every server a test needs is started here on an ephemeral port and stopped
afterwards, even when the test fails."""
from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `make test` runs two pytest processes on two cores beside brokers and JVMs: Hypothesis' timing
# checks (a slow draw, a slow example) would fail a property on how busy the machine is, not on
# what it asserts. Each property keeps its own example count.
settings.register_profile("statekit", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("statekit")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session", autouse=True)
def _statekit_home(tmp_path_factory):
    """Nothing a test runs may use (or leave a broker in) the user's ~/.statekit: every test gets a
    session STATEKIT_HOME unless it sets its own, and a broker (or schema registry) left running there is
    stopped."""
    from statekit import broker as broker_mod
    from statekit import registry as registry_mod

    home = tmp_path_factory.mktemp("statekit-home")
    old = os.environ.get("STATEKIT_HOME")
    os.environ["STATEKIT_HOME"] = str(home)
    try:
        yield home
    finally:
        registry_mod.stop(str(home / "broker"))
        broker_mod.stop(str(home / "broker"))
        if old is None:
            os.environ.pop("STATEKIT_HOME", None)
        else:
            os.environ["STATEKIT_HOME"] = old


@pytest.fixture
def broker(tmp_path):
    """A fresh embedded broker for one test."""
    from statekit import broker as broker_mod

    handle = broker_mod.start(dir=str(tmp_path / "broker"), port=0)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory):
    """One embedded broker for a whole session, for tests that only need distinct topic names."""
    from statekit import broker as broker_mod

    handle = broker_mod.start(dir=str(tmp_path_factory.mktemp("shared-broker")), port=0)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def kafka(shared_broker):
    """A statekit Kafka client on the session's shared broker, closed after the test."""
    from statekit.kafka import Kafka

    k = Kafka(shared_broker.bootstrap)
    try:
        yield k
    finally:
        k.close()


class MockCluster:
    """librdkafka's mock cluster, which confluent-kafka starts on real ports: a Kafka-protocol
    broker statekit did not write, with fewer APIs than statekit's (no CreateTopics, DeleteTopics,
    DescribeConfigs, DeleteRecords, SASL; topics are auto-created, 4 partitions, on a Metadata
    request that allows it; transactions write no end markers). ``client`` owns it: the cluster
    lives as long as that client."""

    def __init__(self, brokers: int = 1):
        import confluent_kafka

        # murmur2: a key goes to the partition statekit (and the Java client) would pick
        self.client = confluent_kafka.Producer({"test.mock.num.brokers": brokers, "log_level": 3,
                                                "partitioner": "murmur2_random"})
        md = self.client.list_topics(timeout=10)
        self.bootstrap = ",".join(f"{b.host}:{b.port}" for b in sorted(md.brokers.values(),
                                                                         key=lambda b: b.id))

    def create_topic(self, name: str) -> int:
        """Create a topic as a user of this cluster can: librdkafka asks for it with auto-creation
        allowed. Returns its partition count."""
        md = self.client.list_topics(topic=name, timeout=10)
        return len(md.topics[name].partitions)

    def produce(self, topic: str, records, partition: int | None = None) -> None:
        for k, v in records:
            if partition is None:
                self.client.produce(topic, key=k, value=v)
            else:
                self.client.produce(topic, key=k, value=v, partition=partition)
        assert self.client.flush(30) == 0

    def close(self) -> None:
        import gc

        self.client.flush(10)
        self.client = None
        gc.collect()  # the mock cluster goes with the last reference to its client


@pytest.fixture
def mock_cluster(request):
    """A librdkafka mock cluster for one test (one broker; ``indirect`` parametrization gives
    another count), closed after it."""
    m = MockCluster(getattr(request, "param", 1))
    try:
        yield m
    finally:
        m.close()
