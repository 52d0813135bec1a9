"""What a consumer group is, shared by the two halves of the group coordinator.

The membership state machine (``groups.py``: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, the
group listing) and the committed offsets (``group_offsets.py``: OffsetCommit, OffsetFetch,
OffsetDelete, TxnOffsetCommit and their file) both work on the same ``Group`` records, error codes
and API keys; they live here so that neither half imports the other's module for them.
"""
from __future__ import annotations

import asyncio
import os
import struct

# API keys handled by the group coordinator.
OFFSET_COMMIT, OFFSET_FETCH = 8, 9
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS = 15, 16
DELETE_GROUPS, OFFSET_DELETE = 42, 47

#: Versions the coordinator implements, for the server's ApiVersions answer. OffsetCommit and
#: OffsetFetch v10 address topics by id only; they are supported when the server passes the
#: ``topic_name_for_id`` / ``topic_id_for_name`` callables, else advertise up to 9.
SUPPORTED_VERSIONS = {
    OFFSET_COMMIT: (0, 9),
    OFFSET_FETCH: (0, 9),
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 6),
    LIST_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
}
GROUP_API_KEYS = frozenset(SUPPORTED_VERSIONS)

# Error codes (kafka.errors).
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_NOT_AVAILABLE = 15
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82
GROUP_SUBSCRIBED_TO_TOPIC = 86
UNKNOWN_TOPIC_ID = 100

# Group states (the strings DescribeGroups / ListGroups report).
EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"

NO_LEADER_EPOCH = -1


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def client_id_of(request) -> str:
    try:
        header = request._header  # set by ApiMessage.decode(..., header=True)
    except AttributeError:
        return ""
    return (getattr(header, "client_id", None) or "") if header is not None else ""


class Member:
    __slots__ = (
        "member_id", "instance_id", "client_id", "client_host", "session_timeout_ms",
        "rebalance_timeout_ms", "protocol_type", "protocols", "assignment",
        "awaiting_join", "join_waiters", "awaiting_sync", "sync_waiters", "timer", "is_new",
    )

    def __init__(self, member_id, instance_id, client_id, client_host, session_timeout_ms,
                 rebalance_timeout_ms, protocol_type, protocols):
        self.member_id = member_id
        self.instance_id = instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.protocol_type = protocol_type
        self.protocols: list[tuple[str, bytes]] = protocols
        self.assignment = b""
        self.awaiting_join = False
        self.join_waiters: list[asyncio.Future] = []
        self.awaiting_sync = False
        self.sync_waiters: list[asyncio.Future] = []
        self.timer: asyncio.TimerHandle | None = None
        self.is_new = True

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


class OffsetEntry:
    __slots__ = ("offset", "leader_epoch", "metadata", "commit_ms")

    def __init__(self, offset, leader_epoch, metadata, commit_ms):
        self.offset = offset
        self.leader_epoch = leader_epoch
        self.metadata = metadata
        self.commit_ms = commit_ms


class Group:
    def __init__(self, group_id: str):
        self.group_id = group_id
        self.state = EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.pending: dict[str, asyncio.TimerHandle] = {}  # member ids handed out, not yet joined
        self.static: dict[str, str] = {}  # group.instance.id -> member id
        self.join_timer: asyncio.TimerHandle | None = None
        self.initial_delay_active = False
        self.new_member_added = False
        self.offsets: dict[tuple[str, int], OffsetEntry] = {}

    # -- protocol bookkeeping --
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_members_joined(self) -> bool:
        return not self.pending and all(m.awaiting_join for m in self.members.values())

    def candidate_protocols(self) -> list[str]:
        members = list(self.members.values())
        if not members:
            return []
        common = set(members[0].protocol_names())
        for m in members[1:]:
            common &= set(m.protocol_names())
        return [p for p in members[0].protocol_names() if p in common]

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]],
                 member_id: str | None = None) -> bool:
        if not protocol_type or not protocols:
            return False
        others = [m for mid, m in self.members.items() if mid != member_id]
        if not others:
            return True
        if self.protocol_type is not None and protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in protocols}
        for m in others:
            names &= set(m.protocol_names())
        return bool(names)

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        votes = {p: 0 for p in candidates}
        for m in self.members.values():
            for name in m.protocol_names():
                if name in votes:
                    votes[name] += 1
                    break
        # max() keeps the first of equal votes: ties go to the first member's preference order
        return max(candidates, key=lambda p: votes[p])

    def subscribed_topics(self) -> set[str] | None:
        """Topics the live members subscribe to (consumer protocol metadata: int16 version,
        array of strings, ...); None when some member's metadata cannot be read."""
        if not self.members:
            return set()
        if self.protocol_type != "consumer":
            return None
        topics: set[str] = set()
        for m in self.members.values():
            meta = m.metadata_for(self.protocol_name) or (m.protocols[0][1] if m.protocols else b"")
            try:
                n = struct.unpack_from(">i", meta, 2)[0]
                pos = 6
                for _ in range(n):
                    size = struct.unpack_from(">h", meta, pos)[0]
                    topics.add(meta[pos + 2:pos + 2 + size].decode("utf-8"))
                    pos += 2 + size
            except (struct.error, UnicodeDecodeError):
                return None
        return topics
