"""statekit's client against a Kafka-protocol broker it did not write: librdkafka's mock cluster,
started through confluent-kafka (``mock_cluster`` in tests/conftest.py). It answers ApiVersions v3
in v0 framing, offers fewer APIs than statekit's broker, auto-creates topics and writes no
transaction markers."""
from __future__ import annotations

import logging

import pytest
from kafka.protocol.admin import (CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest,
                                  DescribeConfigsRequest)
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from statekit.kafka import Kafka, UnsupportedApi
from statekit.kafka.versions import SPOKEN, api_name

# what the mock lacks of the APIs statekit's client sends (it never sends CreatePartitions: a task's
# partition count is fixed)
LACKING = [CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest, DeleteRecordsRequest,
           SaslHandshakeRequest, SaslAuthenticateRequest]


def one_line(err) -> str:
    s = str(err)
    assert s and "\n" not in s and "Traceback" not in s, s
    return s


def test_the_client_negotiates_with_a_broker_that_answers_apiversions_v3_in_v0_framing(mock_cluster):
    k = Kafka(mock_cluster.bootstrap)
    try:
        conn = k._any()
        assert conn.versions[18][1] < 3  # the mock knows ApiVersions v0-2: it was asked v0
        assert conn.version(MetadataRequest) == min(conn.versions[3][1], SPOKEN[3].hi)
        assert mock_cluster.create_topic("neg") == 4
        assert k.topics() == {"neg": 4}
        assert k.send("neg", 1, [(b"k%d" % i, b"v%d" % i) for i in range(5)]) == 4
        assert k.end_offsets("neg") == {0: 0, 1: 5, 2: 0, 3: 0}
        got = [(r[2], r[3]) for c in k.read("neg", 1, 0, None) for r in c.records]
        assert got == [(b"k%d" % i, b"v%d" % i) for i in range(5)]
        assert k.supports_transactions()
    finally:
        k.close()


@pytest.mark.parametrize("cls", LACKING, ids=api_name)
def test_every_api_the_mock_lacks_is_refused_in_one_line_before_sending(mock_cluster, cls):
    k = Kafka(mock_cluster.bootstrap)
    try:
        conn = k._any()
        assert cls.API_KEY not in conn.versions
        with pytest.raises(UnsupportedApi) as e:
            conn.version(cls)
        msg = one_line(e.value)
        assert msg == f"the broker at {conn.addr} does not offer {api_name(cls)}: {SPOKEN[cls.API_KEY].without}"
        assert "statekit broker start" not in msg
        # nothing was sent: the mock would have closed the connection on a request it lacks
        assert k._metadata(None) is not None and conn.sock.fileno() >= 0
    finally:
        k.close()


def test_what_statekit_calls_refuse_against_the_mock_and_what_still_works(mock_cluster):
    mock_cluster.create_topic("have")
    mock_cluster.produce("have", [(b"a", b"1"), (b"b", b"2")], partition=0)
    k = Kafka(mock_cluster.bootstrap)
    try:
        addr = k._any().addr
        with pytest.raises(UnsupportedApi, match=rf"^the broker at {addr} does not offer DeleteTopics: "
                                                 r"statekit cannot delete topic 'have': delete it with"):
            k.delete_topic("have")
        with pytest.raises(UnsupportedApi, match=rf"^the broker at {addr} does not offer DescribeConfigs: "
                                                 r"statekit cannot read the configs of topic 'have'"):
            k.describe_configs("have")
        with pytest.raises(UnsupportedApi, match=rf"^the broker at {addr} does not offer DeleteRecords: "
                                                 r"statekit cannot delete records of have\[0\]"):
            k.delete_records("have", 0, 1)
        # the topic is still there, whole, and the client still talks to the broker
        assert k.end_offsets("have")[0] == 2 and k.begin_offsets("have")[0] == 0
        # an existing topic is taken as it is (no CreateTopics sent)
        assert k.ensure_topic("have", 4, {"cleanup.policy": "compact"}) is False
    finally:
        k.close()


def test_sasl_against_a_broker_without_it_is_one_line(mock_cluster):
    cfg = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u",
           "sasl.password": "p"}
    with pytest.raises(UnsupportedApi) as e:
        Kafka(mock_cluster.bootstrap, kafka_config=cfg)
    assert "does not offer SaslHandshake: it has no SASL authentication: check security.protocol" in \
        one_line(e.value)


def test_a_missing_topic_is_auto_created_without_createtopics_and_what_was_not_set_is_said(
        mock_cluster, caplog):
    k = Kafka(mock_cluster.bootstrap)
    try:
        with caplog.at_level(logging.WARNING, logger="statekit.kafka"):
            assert k.ensure_topic("made", 2, {"cleanup.policy": "compact"}) is True
        assert k.topics()["made"] == 4  # the mock's own default, not the 2 asked for
        said = [r.getMessage() for r in caplog.records if r.name == "statekit.kafka"]
        assert len(said) == 1
        assert "has no CreateTopics and auto-created topic 'made' with its own defaults " \
               "(4 partition(s), not 2): statekit could not set cleanup.policy=compact" in one_line(said[0])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="statekit.kafka"):
            assert k.ensure_topic("made", 2, {"cleanup.policy": "compact"}) is False
        assert not [r for r in caplog.records if r.name == "statekit.kafka"]
    finally:
        k.close()


def test_transactions_on_a_broker_that_writes_no_markers_leave_no_offset_gaps(mock_cluster):
    mock_cluster.create_topic("txn")
    k = Kafka(mock_cluster.bootstrap)
    try:
        txp = k.transactional_producer("mock-txn", 10000)
        txp.begin()
        assert txp.send_many([("txn", 0, [(b"a", b"1"), (b"b", b"2")])]) == [1]
        txp.commit()
        # no end marker: the committed end is right after the last record, not one further
        assert k.end_offsets("txn", [0], "read_committed") == {0: 2}
        assert k.end_offsets("txn", [0]) == {0: 2}
        txp.close()
    finally:
        k.close()
