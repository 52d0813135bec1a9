"""Kafka's admin requests for :class:`statekit.kafka.client.Kafka`: topics (list, create, delete),
their configs, moving a log start (DeleteRecords). A mixin: it uses the client's connections,
metadata and lock.

Against a broker without CreateTopics (a Kafka statekit did not set up, e.g. librdkafka's mock
cluster), ``ensure_topic`` takes a topic that exists as it is and asks for a missing one with a
Metadata request that allows auto-creation; DeleteTopics, DescribeConfigs and DeleteRecords are
refused before sending (:class:`~statekit.kafka.errors.UnsupportedApi`, one line)."""
from __future__ import annotations

import logging
import time
from typing import Iterable

from kafka.protocol.admin import (CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest,
                                  DescribeConfigsRequest)
from kafka.protocol.metadata import MetadataRequest

from .errors import KafkaError, UnsupportedApi
from .errors import raise_for as _raise_for

log = logging.getLogger("statekit.kafka")

__all__ = ["TopicAdmin"]


class TopicAdmin:
    """The admin half of :class:`~statekit.kafka.client.Kafka` (see the module docstring)."""

    def topics(self) -> dict[str, int]:
        """``{topic: number of partitions}`` for every topic."""
        with self._lock:
            resp = self._metadata(None)
            return {t.name: len(t.partitions) for t in resp.topics if t.error_code == 0}

    def partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """``{topic: number of partitions}`` for those of ``topics`` that exist (one Metadata
        request for just these topics; missing ones are left out)."""
        names = list(dict.fromkeys(topics))
        if not names:
            return {}
        with self._lock:
            for t in names:
                self._forget(t)
            resp = self._metadata(names)
            return {t.name: len(t.partitions) for t in resp.topics
                    if t.error_code == 0 and t.name in names}

    def ensure_topic(self, name: str, partitions: int = 1, configs: dict | None = None,
                     replication_factor: int = 1) -> bool:
        """Create the topic unless it exists. Returns True when it was created.

        Against a broker without CreateTopics: a topic that exists is taken as it is (its
        configs unchecked); a missing one is asked for with a Metadata request that allows
        auto-creation, which a broker with ``auto.create.topics.enable`` honours with its own
        defaults (said in one line: statekit could not set ``configs``); otherwise
        :class:`UnsupportedApi`, in one line that says what to create."""
        with self._lock:
            conn = self._any()
            if not conn.offers(CreateTopicsRequest):
                return self._ensure_without_create_topics(conn, name, partitions, configs)
            v = conn.version(CreateTopicsRequest)
            T = CreateTopicsRequest.CreatableTopic
            req = CreateTopicsRequest(
                version=v,
                topics=[T(name=name, num_partitions=partitions, replication_factor=replication_factor,
                          assignments=[],
                          configs=[T.CreatableTopicConfig(name=k, value=str(val))
                                   for k, val in (configs or {}).items()])],
                timeout_ms=int(self.timeout * 1000),
                validate_only=False,
            )
            resp = conn.request(req)
            created = True
            for t in resp.topics:
                if t.error_code == 36:  # TOPIC_ALREADY_EXISTS
                    created = False
                elif t.error_code:
                    msg = getattr(t, "error_message", None) or ""
                    _raise_for(t.error_code, f"cannot create topic {name!r} {msg}".strip())
            # wait until every partition has a leader
            deadline = time.monotonic() + self.timeout
            while True:
                self._forget(name)
                resp = self._metadata([name])
                ok = [t for t in resp.topics if t.name == name and t.error_code == 0]
                if ok and all(p.leader_id >= 0 for p in ok[0].partitions) and ok[0].partitions:
                    return created
                if time.monotonic() > deadline:
                    raise KafkaError(f"topic {name!r} was created but has no leader after "
                                     f"{self.timeout:.0f}s")
                time.sleep(0.05)

    def _ensure_without_create_topics(self, conn, name: str, partitions: int, configs) -> bool:
        if name in self.partition_counts([name]):
            return False
        wanted = f"{partitions} partition(s)" + "".join(f", {k}={v}" for k, v in (configs or {}).items())
        created = None
        if conn.offers(MetadataRequest, 4):  # v4+ says whether auto-creation is allowed
            deadline = time.monotonic() + self.timeout
            while True:
                self._forget(name)
                t = next((t for t in self._metadata([name], auto_create=True).topics if t.name == name), None)
                if t is not None and t.error_code == 0 and t.partitions and all(
                        p.leader_id >= 0 for p in t.partitions):
                    created = len(t.partitions)
                    break
                if t is None or t.error_code != 5 or time.monotonic() > deadline:
                    break  # not created (LEADER_NOT_AVAILABLE: being created, ask again)
                time.sleep(0.05)
        if created is None:
            raise UnsupportedApi(f"the broker at {conn.addr} does not offer CreateTopics and did not "
                                 f"create topic {name!r} on request: create it yourself ({wanted}), or "
                                 f"enable auto.create.topics.enable on the broker", "CreateTopics", conn.addr)
        if created != partitions or configs:
            unset = ", ".join(f"{k}={v}" for k, v in (configs or {}).items())
            log.warning("statekit: the broker at %s has no CreateTopics and auto-created topic %r with "
                        "its own defaults (%d partition(s)%s)%s", conn.addr, name, created,
                        f", not {partitions}" if created != partitions else "",
                        f": statekit could not set {unset}; set it yourself" if unset else "")
        return True

    def delete_topic(self, name: str, missing_ok: bool = True) -> bool:
        with self._lock:
            conn = self._any()
            v = conn.version(DeleteTopicsRequest, todo=f"statekit cannot delete topic {name!r}: delete it "
                                                       f"with the cluster's own tools")
            if v >= 6:  # topics by name or id
                req = DeleteTopicsRequest(version=v, topics=[DeleteTopicsRequest.DeleteTopicState(
                    name=name, topic_id=None)], timeout_ms=int(self.timeout * 1000))
            else:
                req = DeleteTopicsRequest(version=v, topic_names=[name], timeout_ms=int(self.timeout * 1000))
            resp = conn.request(req)
            self._forget(name)
            for r in resp.responses:
                if r.error_code == 3:
                    if missing_ok:
                        return False
                    _raise_for(3, "delete", name)
                _raise_for(r.error_code, f"cannot delete topic {name!r}")
            return True

    def describe_configs(self, topic: str) -> dict[str, str]:
        with self._lock:
            conn = self._any()
            v = conn.version(DescribeConfigsRequest, todo=f"statekit cannot read the configs of topic "
                                                          f"{topic!r}: check them yourself")
            R = DescribeConfigsRequest.DescribeConfigsResource
            resp = conn.request(DescribeConfigsRequest(
                version=v, resources=[R(resource_type=2, resource_name=topic, configuration_keys=None)],
                include_synonyms=False, include_documentation=False))
            out = {}
            for r in resp.results:
                if r.error_code == 3:
                    _raise_for(3, "describe", topic)
                _raise_for(r.error_code, f"cannot describe topic {topic!r}: {r.error_message or ''}")
                for c in r.configs:
                    out[c.name] = c.value
            return out

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Move the log start of one partition to ``before_offset`` (Kafka's DeleteRecords).
        Returns the new log start offset."""
        with self._lock:
            conn = self._leader(topic, partition)
            v = conn.version(DeleteRecordsRequest, todo=f"statekit cannot delete records of {topic}"
                                                        f"[{partition}]: use the cluster's own tools")
            T = DeleteRecordsRequest.DeleteRecordsTopic
            resp = conn.request(DeleteRecordsRequest(
                version=v, topics=[T(name=topic, partitions=[T.DeleteRecordsPartition(
                    partition_index=partition, offset=before_offset)])],
                timeout_ms=int(self.timeout * 1000)))
            for t in resp.topics:
                for p in t.partitions:
                    _raise_for(p.error_code, f"cannot delete records of {topic}[{partition}]", topic)
                    return p.low_watermark
            raise KafkaError(f"empty DeleteRecords response for {topic}[{partition}]")
