"""The committed offsets of the consumer groups: OffsetCommit, OffsetFetch, OffsetDelete,
TxnOffsetCommit's commit, and the file that keeps them across restarts.

Split from the membership state machine (``groups.py``) because what a group has committed is a
separate concern from who is in it: it outlives the members (a group with offsets and no members
stays, ``Empty``), it is the only part written to disk, and the transaction coordinator writes to
it too. The state machine decides whether a member may commit (``Membership.commit_error``); this
module keeps what was committed.

* Committed offsets are appended to ``DATA_DIR/group-offsets.jsonl`` (one JSON object per
  partition, flushed to the OS before the response, so they survive ``kill -9``; ``fsync=True``
  for power loss) and reloaded at start. The file is rewritten atomically (temp, fsync, rename)
  when it has grown to several times its live content. Deletions (DeleteGroups, OffsetDelete)
  append a ``"del"`` line.
"""
from __future__ import annotations

import json
import logging
import os
import time
import uuid
from typing import Any, Callable, Protocol

from kafka.protocol.consumer.group import (
    OffsetCommitResponse, OffsetDeleteResponse, OffsetFetchResponse,
)

from .group_model import (
    COORDINATOR_NOT_AVAILABLE, DEAD, GROUP_ID_NOT_FOUND, GROUP_SUBSCRIBED_TO_TOPIC,
    INVALID_GROUP_ID, NO_LEADER_EPOCH, NONE, OFFSET_METADATA_TOO_LARGE, UNKNOWN_TOPIC_ID,
    Group, OffsetEntry,
)

log = logging.getLogger(__name__)

OFFSETS_FILE = "group-offsets.jsonl"


class Membership(Protocol):
    """What the offsets need from the membership state machine (``GroupCoordinator``)."""

    groups: dict[str, Group]

    @property
    def closed(self) -> bool: ...

    def commit_error(self, v: int, req) -> int:
        """NONE when the OffsetCommit's member and generation may commit, else the error code."""

    def forget_if_unused(self, group: Group) -> None:
        """Drop a group with no members, no pending joins and no offsets."""


class CommittedOffsets:
    """The offsets of every group (kept on ``Group.offsets``) and their file."""

    def __init__(self, membership: Membership, data_dir: str, *, fsync: bool = False,
                 max_metadata_bytes: int = 4096,
                 topic_name_for_id: Callable[[Any], str | None] | None = None,
                 topic_id_for_name: Callable[[str], Any] | None = None):
        self.membership = membership
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, OFFSETS_FILE)
        self.fsync = fsync
        self.max_metadata_bytes = max_metadata_bytes
        self.topic_name_for_id = topic_name_for_id
        self.topic_id_for_name = topic_id_for_name
        self._file = None
        self._lines = 0

    @property
    def groups(self) -> dict[str, Group]:
        return self.membership.groups

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Load the file into the groups, compact it if it has grown, and open it for appends."""
        os.makedirs(self.data_dir, exist_ok=True)
        self._load()
        if self._lines > 2 * self._live_entries() + 1000:
            self._rewrite()
        self._file = open(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    # ------------------------------------------------------------------ OffsetCommit
    def _topic_name(self, v: int, topic) -> str | None:
        if v >= 10:
            if self.topic_name_for_id is None:
                return None
            return self.topic_name_for_id(topic.topic_id)
        return topic.name

    def commit_response(self, v: int, req, codes: dict, default: int = NONE):
        """The OffsetCommit response of ``req``'s version: per partition its code in ``codes``
        (keyed ``(id(topic), partition)``), else ``default``."""
        topics = []
        for t in req.topics or []:
            parts = [OffsetCommitResponse.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                partition_index=p.partition_index,
                error_code=codes.get((id(t), p.partition_index), default))
                for p in t.partitions or []]
            if v >= 10:
                topics.append(OffsetCommitResponse.OffsetCommitResponseTopic(
                    topic_id=t.topic_id, partitions=parts))
            else:
                topics.append(OffsetCommitResponse.OffsetCommitResponseTopic(
                    name=t.name, partitions=parts))
        return OffsetCommitResponse(version=v, topics=topics)

    def offset_commit(self, v: int, req):
        code = self.membership.commit_error(v, req)
        if code != NONE:
            return self.commit_response(v, req, {}, default=code)
        group = self.groups.get(req.group_id)
        if group is None:
            group = self.groups[req.group_id] = Group(req.group_id)
        now = _now_ms()
        codes = {}
        lines = []
        for t in req.topics or []:
            name = self._topic_name(v, t)
            for p in t.partitions or []:
                key = (id(t), p.partition_index)
                if name is None:
                    codes[key] = UNKNOWN_TOPIC_ID
                    continue
                metadata = p.committed_metadata if p.committed_metadata is not None else ""
                if len(metadata.encode("utf-8")) > self.max_metadata_bytes:
                    codes[key] = OFFSET_METADATA_TOO_LARGE
                    continue
                epoch = p.committed_leader_epoch if v >= 6 else NO_LEADER_EPOCH
                entry = OffsetEntry(p.committed_offset, epoch, metadata, now)
                group.offsets[(name, p.partition_index)] = entry
                lines.append(_line(group.group_id, name, p.partition_index, entry))
                codes[key] = NONE
        self._append(lines)
        self.membership.forget_if_unused(group)
        return self.commit_response(v, req, codes)

    # ------------------------------------------------------------------ transactional offsets
    def commit_txn_offsets(self, group_id: str, offsets: dict) -> None:
        """Make the offsets of a committed transaction visible: ``{(topic, partition): (offset,
        leader epoch, metadata)}``, called by the transaction coordinator once its markers are
        written."""
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        now = _now_ms()
        lines = []
        for (topic, part), (offset, epoch, metadata) in offsets.items():
            entry = OffsetEntry(offset, epoch, metadata or "", now)
            group.offsets[(topic, part)] = entry
            lines.append(_line(group_id, topic, part, entry))
        self._append(lines)

    # ------------------------------------------------------------------ OffsetFetch
    def _fetch_group(self, group_id: str, topics):
        """``topics``: list of (name, partitions) or None for every committed offset.
        Returns [(name, [(partition, offset, epoch, metadata)])]."""
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None else {}
        out = []
        if topics is None:
            by_topic: dict[str, list] = {}
            for (name, part), e in sorted(offsets.items()):
                by_topic.setdefault(name, []).append((part, e.offset, e.leader_epoch, e.metadata))
            return list(by_topic.items())
        for name, parts in topics:
            rows = []
            for part in parts:
                e = offsets.get((name, part))
                rows.append((part, -1, NO_LEADER_EPOCH, "") if e is None
                            else (part, e.offset, e.leader_epoch, e.metadata))
            out.append((name, rows))
        return out

    def offset_fetch(self, v: int, req):
        top = COORDINATOR_NOT_AVAILABLE if self.membership.closed else NONE
        if v < 8:
            if req.topics is None:
                wanted = None
            else:
                wanted = [(t.name, list(t.partition_indexes or [])) for t in req.topics]
            rows = [] if top != NONE else self._fetch_group(req.group_id, wanted)
            part_cls = OffsetFetchResponse.OffsetFetchResponseTopic.OffsetFetchResponsePartition
            topics = [OffsetFetchResponse.OffsetFetchResponseTopic(name=name, partitions=[
                part_cls(partition_index=p, committed_offset=o, committed_leader_epoch=e,
                         metadata=m, error_code=top) for p, o, e, m in parts])
                for name, parts in rows]
            return OffsetFetchResponse(version=v, topics=topics, error_code=top)
        groups = []
        g_cls = OffsetFetchResponse.OffsetFetchResponseGroup
        t_cls = g_cls.OffsetFetchResponseTopics
        p_cls = t_cls.OffsetFetchResponsePartitions
        for g in req.groups or []:
            if g.topics is None:
                wanted = None
            else:
                wanted = []
                for t in g.topics:
                    name = (self.topic_name_for_id(t.topic_id) if self.topic_name_for_id else None) \
                        if v >= 10 else t.name
                    wanted.append((name, list(t.partition_indexes or [])))
            rows = [] if top != NONE else self._fetch_group(g.group_id, wanted)
            topics = []
            for name, parts in rows:
                partitions = [p_cls(partition_index=p, committed_offset=o, committed_leader_epoch=e,
                                    metadata=m, error_code=(UNKNOWN_TOPIC_ID if name is None else NONE))
                              for p, o, e, m in parts]
                if v >= 10:
                    tid = self.topic_id_for_name(name) if (self.topic_id_for_name and name) else None
                    topics.append(t_cls(topic_id=tid or uuid.UUID(int=0), partitions=partitions))
                else:
                    topics.append(t_cls(name=name, partitions=partitions))
            groups.append(g_cls(group_id=g.group_id, topics=topics, error_code=top))
        return OffsetFetchResponse(version=v, groups=groups)

    # ------------------------------------------------------------------ deletion
    def drop_group(self, group: Group) -> None:
        """DeleteGroups of an empty group: forget its offsets, on file too."""
        if group.offsets:
            self._append([json.dumps({"g": group.group_id, "del": 1}) + "\n"])
        group.offsets.clear()

    def offset_delete(self, v: int, req):
        group = self.groups.get(req.group_id)
        if self.membership.closed:
            return OffsetDeleteResponse(version=v, error_code=COORDINATOR_NOT_AVAILABLE, topics=[])
        if not req.group_id:
            return OffsetDeleteResponse(version=v, error_code=INVALID_GROUP_ID, topics=[])
        if group is None or group.state == DEAD:
            return OffsetDeleteResponse(version=v, error_code=GROUP_ID_NOT_FOUND, topics=[])
        subscribed = group.subscribed_topics()
        lines, topics = [], []
        t_cls = OffsetDeleteResponse.OffsetDeleteResponseTopic
        p_cls = t_cls.OffsetDeleteResponsePartition
        for t in req.topics or []:
            parts = []
            for p in t.partitions or []:
                if subscribed is None or t.name in subscribed:
                    code = GROUP_SUBSCRIBED_TO_TOPIC
                else:
                    code = NONE
                    if group.offsets.pop((t.name, p.partition_index), None) is not None:
                        lines.append(json.dumps({"g": group.group_id, "t": t.name,
                                                 "p": p.partition_index, "del": 1}) + "\n")
                parts.append(p_cls(partition_index=p.partition_index, error_code=code))
            topics.append(t_cls(name=t.name, partitions=parts))
        self._append(lines)
        self.membership.forget_if_unused(group)
        return OffsetDeleteResponse(version=v, error_code=NONE, topics=topics)

    # ------------------------------------------------------------------ the file
    def _live_entries(self) -> int:
        return sum(len(g.offsets) for g in self.groups.values())

    def _load(self) -> None:
        self._lines = 0
        try:
            f = open(self.path, "r", encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        with f:
            for raw in f:
                self._lines += 1
                try:
                    rec = json.loads(raw)
                    if rec.get("del"):
                        group = self.groups.get(rec["g"])
                        if group is not None:
                            if "t" in rec:
                                group.offsets.pop((rec["t"], int(rec["p"])), None)
                            else:
                                group.offsets.clear()
                            if not group.offsets:
                                del self.groups[rec["g"]]
                        continue
                    gid, topic, part = rec["g"], rec["t"], int(rec["p"])
                    entry = OffsetEntry(int(rec["o"]), int(rec.get("e", -1)), rec.get("m") or "",
                                        int(rec.get("ts", 0)))
                except (ValueError, KeyError, TypeError):
                    log.warning("skipping a torn line in %s", self.path)  # e.g. a crash mid-write
                    continue
                group = self.groups.get(gid)
                if group is None:
                    group = self.groups[gid] = Group(gid)
                group.offsets[(topic, part)] = entry

    def _append(self, lines: list[str]) -> None:
        if not lines:
            return
        if self._file is None:
            raise RuntimeError("GroupCoordinator.start() was not awaited")
        self._file.write("".join(lines))
        self._file.flush()  # in the OS page cache: survives a kill -9 of the broker
        if self.fsync:
            os.fsync(self._file.fileno())
        self._lines += len(lines)
        if self._lines > max(10_000, 4 * self._live_entries()):
            self._rewrite()

    def _rewrite(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            count = 0
            for group in self.groups.values():
                for (topic, part), e in group.offsets.items():
                    out.write(_line(group.group_id, topic, part, e))
                    count += 1
            out.flush()
            os.fsync(out.fileno())
        if self._file is not None:
            self._file.close()
        os.replace(tmp, self.path)
        try:
            dfd = os.open(self.data_dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
        self._lines = count
        if self._file is not None:
            self._file = open(self.path, "a", encoding="utf-8")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _line(group_id: str, topic: str, partition: int, e: OffsetEntry) -> str:
    return json.dumps({"g": group_id, "t": topic, "p": partition, "o": e.offset,
                       "e": e.leader_epoch, "m": e.metadata, "ts": e.commit_ms},
                      separators=(",", ":")) + "\n"
