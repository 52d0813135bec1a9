"""The Kafka APIs statekit's client speaks, the versions it speaks of each, and what a broker that
does not offer one costs: the contract a Kafka cluster must meet (docs/ARCHITECTURE.md shows the
same table; a test holds the two together).

A connection asks the broker for its versions (ApiVersions) and every request goes out at the
highest version both sides have (:meth:`statekit.kafka.connection.Connection.version`). An API the
broker does not offer is refused before anything is sent, with :class:`UnsupportedApi`: one line
naming the API, the broker and what to do (``without`` below, or the caller's own advice).
"""
from __future__ import annotations

from dataclasses import dataclass

from kafka.protocol.admin import (CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest,
                                  DescribeConfigsRequest)
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest,
                                     ProduceRequest)
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from .errors import UnsupportedApi

__all__ = ["Api", "SPOKEN", "TRANSACTIONS", "api_name", "spoken", "UnsupportedApi"]


@dataclass(frozen=True)
class Api:
    request: type       # kafka-python's request class
    lo: int             # the versions statekit speaks
    hi: int
    why: str            # what statekit uses it for
    without: str        # what happens against a broker without it


_WHOLE = "statekit cannot work with this broker: it needs a Kafka-protocol broker of Kafka 0.11 or later"

SPOKEN: dict[int, Api] = {a.request.API_KEY: a for a in (
    Api(ApiVersionsRequest, 0, 3, "the versions of every other API (v3 first; v0 on a new connection "
        "when the broker answers UNSUPPORTED_VERSION)", _WHOLE),
    Api(MetadataRequest, 1, 12, "brokers, partitions, leaders; auto-creation when CreateTopics is "
        "missing", _WHOLE),
    Api(ProduceRequest, 3, 12, "changelogs, commit markers, sinks, repartition topics, produce", _WHOLE),
    Api(FetchRequest, 4, 12, "restoration, standbys, sources, query replicas (v13+ name topics by id "
        "only)", _WHOLE),
    Api(ListOffsetsRequest, 1, 7, "log start, high watermark; last stable offset (v2+, "
        "read_committed)", _WHOLE),
    Api(CreateTopicsRequest, 2, 7, "creating internal topics (changelogs, repartition, events) with "
        "their configs",
        "create the topics yourself (or let the broker auto-create them: auto.create.topics.enable); "
        "statekit then cannot set their configs (cleanup.policy, retention.ms)"),
    Api(DeleteTopicsRequest, 1, 6, "App.reset() deleting internal topics",
        "delete the topics with the cluster's own tools; App.reset(topics=False) forgets the local state"),
    Api(DescribeConfigsRequest, 1, 4, "checking an existing changelog's cleanup.policy; %statekit topics",
        "statekit cannot check the configs of existing topics (cleanup.policy of changelogs): check "
        "them yourself"),
    Api(DeleteRecordsRequest, 0, 2, "Kafka.delete_records (moving a log start by hand)",
        "delete records with the cluster's own tools"),
    Api(FindCoordinatorRequest, 1, 4, "the transaction coordinator",
        "no transactions: exactly_once apps run at-least-once"),
    Api(InitProducerIdRequest, 0, 4, "transactional producers (exactly-once commits)",
        "no transactions: exactly_once apps run at-least-once"),
    Api(AddPartitionsToTxnRequest, 0, 3, "transactional producers", "no transactions: exactly_once "
        "apps run at-least-once"),
    Api(EndTxnRequest, 0, 3, "transactional producers", "no transactions: exactly_once apps run "
        "at-least-once"),
    Api(SaslHandshakeRequest, 1, 1, "SASL authentication (security.protocol SASL_*)",
        "it has no SASL authentication: check security.protocol (the broker may want PLAINTEXT or SSL)"),
    Api(SaslAuthenticateRequest, 0, 1, "SASL authentication", "it has no SASL authentication: check "
        "security.protocol (the broker may want PLAINTEXT or SSL)"),
)}

#: the APIs of Kafka transactions (exactly-once commits need every one)
TRANSACTIONS = (FindCoordinatorRequest, InitProducerIdRequest, AddPartitionsToTxnRequest, EndTxnRequest)


def api_name(cls) -> str:
    """Kafka's name of the API of a kafka-python request class (``CreateTopicsRequest`` ->
    ``CreateTopics``)."""
    name = cls.__name__
    return name[:-len("Request")] if name.endswith("Request") else name


def spoken(cls) -> Api:
    return SPOKEN[cls.API_KEY]
