"""Topics of one broker: the catalogue (`DIR/topics.json`) and each partition's log.

Every change of the catalogue (create, add partitions, delete, configs) is written durably
(temp file, fsync, rename, fsync of the directory) *before* it takes effect in memory, and
nothing of it remains when that write fails: a client is never told a topic exists that a
restart would not find. New partition logs are opened before the catalogue names them and
removed again when anything fails, so a failed request leaves no directories behind.

Each partition holds open files (the active segment's log and index, one per closed segment);
the broker refuses partitions that would take it past the budget it derives from its open-file
limit (`fd_budget`), instead of failing halfway through a request.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import uuid

from .config import TopicConfig, validate_topic_configs
from .log import PartitionLog, write_json_atomic

log = logging.getLogger("statekit.broker")

_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")
MAX_NAME_LENGTH = 249
FDS_PER_PARTITION = 2  # the active segment's log and index files


def topic_name_problem(name) -> str | None:
    """Kafka's reason a topic name is invalid (a full match: no trailing newline slips through)."""
    if not isinstance(name, str) or not name:
        return "Topic name is invalid: the empty string is not allowed"
    if name in (".", ".."):
        return f"Topic name is invalid: '{name}' is not allowed"
    if len(name) > MAX_NAME_LENGTH:
        return (f"Topic name is invalid: the length of '{name}' is longer than the max allowed length "
                f"{MAX_NAME_LENGTH}")
    if not _LEGAL.fullmatch(name):
        return (f"Topic name is invalid: '{name}' contains one or more characters other than ASCII "
                f"alphanumerics, '.', '_' and '-'")
    return None


class Topic:
    def __init__(self, name: str, topic_id: uuid.UUID, config: TopicConfig):
        self.name = name
        self.id = topic_id
        self.config = config
        self.partitions: list[PartitionLog] = []


class PartitionBudgetExceeded(Exception):
    """More partitions than the open-file budget allows (INVALID_PARTITIONS)."""


class TopicManager:
    def __init__(self, data_dir: str, defaults: dict | None = None, fd_budget: int | None = None):
        self.dir = data_dir
        self.logs_dir = os.path.join(data_dir, "logs")
        self.catalogue = os.path.join(data_dir, "topics.json")
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[uuid.UUID, Topic] = {}
        self.defaults = defaults if defaults is not None else {}  # broker-level topic defaults
        self.fd_budget = fd_budget  # open files the logs may use; None: unlimited

    def open(self) -> None:
        import json

        os.makedirs(self.logs_dir, exist_ok=True)
        try:
            with open(self.catalogue) as f:
                cat = json.load(f)
        except FileNotFoundError:
            cat = {"topics": {}}
        for name, t in sorted(cat.get("topics", {}).items()):
            topic = Topic(name, uuid.UUID(t["id"]), self._config(t.get("configs", {})))
            for p in range(int(t["partitions"])):
                plog = PartitionLog(self._pdir(name, p), name, p, topic.config)
                plog.open()
                topic.partitions.append(plog)
            self._add(topic)

    def _config(self, overrides: dict) -> TopicConfig:
        return TopicConfig(overrides, self.defaults)

    def _add(self, topic: Topic) -> None:
        self.topics[topic.name] = topic
        self.by_id[topic.id] = topic

    def _pdir(self, name: str, p: int) -> str:
        return os.path.join(self.logs_dir, f"{name}-{p}")

    # -- the catalogue ---------------------------------------------------------------------
    def _entry(self, t: Topic, partitions: int | None = None, configs: dict | None = None) -> dict:
        return {"id": str(t.id), "partitions": len(t.partitions) if partitions is None else partitions,
                "configs": t.config.overrides if configs is None else configs}

    def _write(self, changed: dict) -> None:
        """Write the catalogue as it will be after ``changed`` ({name: entry or None to drop})."""
        doc = {n: self._entry(t) for n, t in self.topics.items() if n not in changed}
        doc.update({n: e for n, e in changed.items() if e is not None})
        write_json_atomic(self.catalogue, {"topics": doc})

    def save(self) -> None:
        self._write({})

    # -- the open-file budget --------------------------------------------------------------
    def open_fds(self) -> int:
        return sum(p.open_fds for p in self.all_partitions())

    def partition_room(self) -> int | None:
        """How many more partitions the open-file budget allows (None: no limit)."""
        if self.fd_budget is None:
            return None
        return max(0, (self.fd_budget - self.open_fds()) // FDS_PER_PARTITION)

    def check_room(self, wanted: int) -> None:
        room = self.partition_room()
        if room is not None and wanted > room:
            total = sum(len(t.partitions) for t in self.topics.values())
            raise PartitionBudgetExceeded(
                f"{wanted} new partitions would exceed this broker's limit: it holds {total} partitions and "
                f"has room for {room} more within its open-file budget ({self.fd_budget} files, two per "
                f"partition plus one per closed segment); raise the open-file limit (ulimit -n) and restart "
                f"the broker, or use fewer partitions")

    # -- changes: durable first, then in memory ----------------------------------------------
    def _open_new(self, name: str, config: TopicConfig, first: int, total: int) -> list[PartitionLog]:
        opened: list[PartitionLog] = []
        try:
            for p in range(first, total):
                d = self._pdir(name, p)
                if os.path.exists(d):  # a leftover of a delete or create interrupted by a crash
                    shutil.rmtree(d)
                plog = PartitionLog(d, name, p, config)
                opened.append(plog)
                plog.open()
        except BaseException:
            self._discard(opened)
            raise
        return opened

    @staticmethod
    def _discard(logs: list[PartitionLog]) -> None:
        for plog in logs:
            plog.deleted = True
            plog.close()
            shutil.rmtree(plog.dir, ignore_errors=True)

    def create(self, name: str, partitions: int, configs: dict | None = None) -> Topic:
        """Raises ConfigError, PartitionBudgetExceeded or OSError (then nothing was created)."""
        overrides = validate_topic_configs(configs or {})
        self.check_room(partitions)
        topic = Topic(name, uuid.uuid4(), self._config(overrides))
        opened = self._open_new(name, topic.config, 0, partitions)
        try:
            self._write({name: self._entry(topic, partitions=partitions)})
        except BaseException:
            self._discard(opened)
            raise
        topic.partitions.extend(opened)
        self._add(topic)
        return topic

    def add_partitions(self, topic: Topic, total: int) -> None:
        self.check_room(total - len(topic.partitions))
        opened = self._open_new(topic.name, topic.config, len(topic.partitions), total)
        try:
            self._write({topic.name: self._entry(topic, partitions=total)})
        except BaseException:
            self._discard(opened)
            raise
        topic.partitions.extend(opened)

    def set_configs(self, topic: Topic, overrides: dict) -> None:
        self._write({topic.name: self._entry(topic, configs=dict(overrides))})
        topic.config.replace(overrides)

    def delete(self, name: str) -> None:
        topic = self.topics[name]
        self._write({name: None})
        self.topics.pop(name)
        self.by_id.pop(topic.id, None)
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
