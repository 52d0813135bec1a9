"""Topics of one broker: the catalogue (`DIR/topics.json`) and each partition's log."""
from __future__ import annotations

import logging
import os
import re
import shutil
import uuid

from .config import TopicConfig, validate_topic_configs
from .log import PartitionLog, write_json_atomic

log = logging.getLogger("statekit.broker")

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")


def topic_name_problem(name) -> str | None:
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return "topic name cannot be '.' or '..'"
    if len(name) > 249:
        return "topic name is longer than 249 characters"
    if not _LEGAL.match(name):
        return f"topic name {name!r} has characters other than ASCII letters, digits, '.', '_' and '-'"
    return None


class Topic:
    def __init__(self, name: str, topic_id: uuid.UUID, config: TopicConfig):
        self.name = name
        self.id = topic_id
        self.config = config
        self.partitions: list[PartitionLog] = []


class TopicManager:
    def __init__(self, data_dir: str):
        self.dir = data_dir
        self.logs_dir = os.path.join(data_dir, "logs")
        self.catalogue = os.path.join(data_dir, "topics.json")
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[uuid.UUID, Topic] = {}

    def open(self) -> None:
        import json

        os.makedirs(self.logs_dir, exist_ok=True)
        try:
            with open(self.catalogue) as f:
                cat = json.load(f)
        except FileNotFoundError:
            cat = {"topics": {}}
        for name, t in sorted(cat.get("topics", {}).items()):
            topic = Topic(name, uuid.UUID(t["id"]), TopicConfig(t.get("configs", {})))
            for p in range(int(t["partitions"])):
                plog = PartitionLog(self._pdir(name, p), name, p, topic.config)
                plog.open()
                topic.partitions.append(plog)
            self._add(topic)

    def _add(self, topic: Topic) -> None:
        self.topics[topic.name] = topic
        self.by_id[topic.id] = topic

    def _pdir(self, name: str, p: int) -> str:
        return os.path.join(self.logs_dir, f"{name}-{p}")

    def save(self) -> None:
        write_json_atomic(self.catalogue, {"topics": {
            t.name: {"id": str(t.id), "partitions": len(t.partitions), "configs": t.config.overrides}
            for t in self.topics.values()
        }})

    def create(self, name: str, partitions: int, configs: dict | None = None) -> Topic:
        overrides = validate_topic_configs(configs or {})
        topic = Topic(name, uuid.uuid4(), TopicConfig(overrides))
        for p in range(partitions):
            d = self._pdir(name, p)
            if os.path.exists(d):  # a leftover of a delete interrupted by a crash
                shutil.rmtree(d)
            plog = PartitionLog(d, name, p, topic.config)
            plog.open()
            topic.partitions.append(plog)
        self._add(topic)
        self.save()
        return topic

    def add_partitions(self, topic: Topic, total: int) -> None:
        for p in range(len(topic.partitions), total):
            plog = PartitionLog(self._pdir(topic.name, p), topic.name, p, topic.config)
            plog.open()
            topic.partitions.append(plog)
        self.save()

    def delete(self, name: str) -> None:
        topic = self.topics.pop(name)
        self.by_id.pop(topic.id, None)
        self.save()
        for plog in topic.partitions:
            plog.deleted = True  # a cleaner pass in flight drops its result
            plog.close()
            shutil.rmtree(plog.dir, ignore_errors=True)

    def get_partition(self, name: str, p: int) -> PartitionLog | None:
        t = self.topics.get(name)
        if t is None or not 0 <= p < len(t.partitions):
            return None
        return t.partitions[p]

    def all_partitions(self):
        for t in list(self.topics.values()):
            yield from t.partitions

    def close(self) -> None:
        for plog in self.all_partitions():
            plog.close()
