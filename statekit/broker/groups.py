"""The group coordinator of the embedded broker: the classic consumer-group protocol's membership.

The server owns one ``GroupCoordinator(data_dir)``; it calls ``await start()`` once the event loop
runs, ``await close()`` on shutdown, and routes the group API keys here::

    response = await coordinator.handle(api_key, api_version, request, client_id=..., client_host=...)

``request`` is a decoded ``kafka.protocol`` message object; the response is the matching response
class built at the *same* version. FindCoordinator is answered by the server itself (node 0).

State machine (as Kafka's ``GroupMetadata``)::

    Empty ──join──► PreparingRebalance ──all joined / timeout──► CompletingRebalance
      ▲                 ▲      ▲                                      │ leader SyncGroup
      │ last member     │      └──── join / leave / session expiry ───┤
      └─ leaves ────────┴──────────────────────────────────────── Stable
    (Dead: a group with no members and no committed offsets is forgotten.)

* JoinGroup v4+ with an empty member id gets ``MEMBER_ID_REQUIRED`` and a fresh member id (KIP-394),
  as the real broker does; the member then re-joins with it.
* A rebalance of an ``Empty`` group waits ``initial_rebalance_delay_ms`` (the broker config
  ``group.initial.rebalance.delay.ms``; see ``config.py`` for its default) even when every member
  has joined, as Kafka's ``InitialDelayedJoin``: while new members keep arriving in a group that
  never completed a rebalance (generation 0) the wait is extended by the same delay, bounded by
  the rebalance timeout; 0 completes it at once. Later rebalances complete as soon as every known
  member has re-joined, or after the largest member rebalance timeout (members that did not
  re-join are removed).
* Waiting requests (JoinGroup until the rebalance completes, a follower's SyncGroup until the
  leader's) are asyncio futures: nothing here ever blocks the event loop.
* Committed offsets (OffsetCommit, OffsetFetch, OffsetDelete, TxnOffsetCommit's commit, their
  file) are ``group_offsets.CommittedOffsets``; this module decides who may commit.
* Static membership (``group.instance.id``) is minimal: a re-join with a known instance id replaces the
  old member id (fencing it with ``FENCED_INSTANCE_ID``) and triggers a normal rebalance.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Callable

from kafka.protocol.admin.groups import (
    DeleteGroupsResponse, DescribeGroupsResponse, ListGroupsResponse,
)
from kafka.protocol.consumer.group import (
    HeartbeatResponse, JoinGroupResponse, LeaveGroupResponse, OffsetCommitResponse,
    OffsetFetchResponse, OffsetDeleteResponse, SyncGroupResponse,
)

from .group_model import (
    COMPLETING_REBALANCE, COORDINATOR_NOT_AVAILABLE, DEAD, DELETE_GROUPS, DESCRIBE_GROUPS, EMPTY,
    FENCED_INSTANCE_ID, GROUP_API_KEYS, GROUP_ID_NOT_FOUND, HEARTBEAT, ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL, INVALID_GROUP_ID, INVALID_REQUEST, INVALID_SESSION_TIMEOUT,
    JOIN_GROUP, LEAVE_GROUP, LIST_GROUPS, MEMBER_ID_REQUIRED, NON_EMPTY_GROUP, NONE, OFFSET_COMMIT,
    OFFSET_DELETE, OFFSET_FETCH, PREPARING_REBALANCE, REBALANCE_IN_PROGRESS, STABLE,
    SUPPORTED_VERSIONS, SYNC_GROUP, UNKNOWN_MEMBER_ID, Group, Member, client_id_of, env_int,
)
from .group_offsets import CommittedOffsets
from .schema_check import illegal_null

log = logging.getLogger(__name__)


class GroupCoordinator:
    """The groups table and their membership; the committed offsets are ``self.offsets``."""

    def __init__(self, data_dir: str, *, initial_rebalance_delay_ms: int | None = None,
                 min_session_timeout_ms: int | None = None,
                 max_session_timeout_ms: int | None = None,
                 max_metadata_bytes: int = 4096, fsync: bool = False,
                 topic_name_for_id: Callable[[Any], str | None] | None = None,
                 topic_id_for_name: Callable[[str], Any] | None = None):
        self.data_dir = data_dir
        self.initial_rebalance_delay_ms = int(initial_rebalance_delay_ms or 0)
        # Kafka's defaults are 6 s .. 30 min; a teaching kit wants to show expiry quickly.
        self.min_session_timeout_ms = (
            min_session_timeout_ms if min_session_timeout_ms is not None
            else env_int("STATEKIT_GROUP_MIN_SESSION_TIMEOUT_MS", 100))
        self.max_session_timeout_ms = (
            max_session_timeout_ms if max_session_timeout_ms is not None
            else env_int("STATEKIT_GROUP_MAX_SESSION_TIMEOUT_MS", 1_800_000))
        self.topic_name_for_id = topic_name_for_id
        self.topic_id_for_name = topic_id_for_name
        self.groups: dict[str, Group] = {}
        self.offsets = CommittedOffsets(
            self, data_dir, fsync=fsync, max_metadata_bytes=max_metadata_bytes,
            topic_name_for_id=topic_name_for_id, topic_id_for_name=topic_id_for_name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    SUPPORTED_VERSIONS = SUPPORTED_VERSIONS

    def supported_versions(self) -> dict[int, tuple[int, int]]:
        """{api_key: (min, max)} this coordinator implements, for ApiVersions."""
        versions = dict(SUPPORTED_VERSIONS)
        if self.topic_name_for_id is not None and self.topic_id_for_name is not None:
            versions[OFFSET_COMMIT] = (0, 10)
            versions[OFFSET_FETCH] = (0, 10)
        return versions

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.offsets.open()

    async def close(self) -> None:
        self._closed = True
        for group in list(self.groups.values()):
            self._cancel(group.join_timer)
            for handle in group.pending.values():
                handle.cancel()
            for member in group.members.values():
                self._cancel(member.timer)
                self._resolve(member.join_waiters, {"error_code": COORDINATOR_NOT_AVAILABLE})
                self._resolve(member.sync_waiters, {"error_code": COORDINATOR_NOT_AVAILABLE})
        self.offsets.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ dispatch
    async def handle(self, api_key: int, api_version: int, request, *, client_id: str | None = None,
                     client_host: str = "/127.0.0.1"):
        if client_id is None:
            client_id = client_id_of(request)
        v = api_version
        if api_key in GROUP_API_KEYS:
            bad = illegal_null(request, v)
            if bad is not None:
                log.info("api %d v%d: %s is null; answering INVALID_REQUEST", api_key, v, bad)
                return self.error_response(api_key, v, request, INVALID_REQUEST, minimal=True)
        if api_key == JOIN_GROUP:
            return await self._join_group(v, request, client_id, client_host)
        if api_key == SYNC_GROUP:
            return await self._sync_group(v, request)
        if api_key == HEARTBEAT:
            return HeartbeatResponse(version=v, error_code=self._heartbeat(request))
        if api_key == LEAVE_GROUP:
            return self._leave_group(v, request)
        if api_key == OFFSET_COMMIT:
            return self.offsets.offset_commit(v, request)
        if api_key == OFFSET_FETCH:
            return self.offsets.offset_fetch(v, request)
        if api_key == LIST_GROUPS:
            return self._list_groups(v, request)
        if api_key == DESCRIBE_GROUPS:
            return self._describe_groups(v, request)
        if api_key == DELETE_GROUPS:
            return self._delete_groups(v, request)
        if api_key == OFFSET_DELETE:
            return self.offsets.offset_delete(v, request)
        raise ValueError(f"the group coordinator does not handle API key {api_key}")

    def error_response(self, api_key: int, api_version: int, request, error_code: int,
                       minimal: bool = False):
        """A response of the request's version carrying ``error_code`` (for the server, e.g. when
        a handler raised). ``minimal``: echo nothing of a request that may hold illegal nulls."""
        v = api_version
        if minimal:
            if api_key == OFFSET_COMMIT:
                return OffsetCommitResponse(version=v, topics=[])
            if api_key == OFFSET_FETCH:
                if v >= 8:
                    return OffsetFetchResponse(version=v, groups=[])
                return OffsetFetchResponse(version=v, topics=[], error_code=error_code)
            if api_key == DESCRIBE_GROUPS:
                return DescribeGroupsResponse(version=v, groups=[])
            if api_key == DELETE_GROUPS:
                return DeleteGroupsResponse(version=v, results=[])
        if api_key == JOIN_GROUP:
            return JoinGroupResponse(version=v, error_code=error_code, generation_id=-1,
                                     protocol_type=None, protocol_name=None if v >= 7 else "",
                                     leader="", member_id=(request.member_id or "") if not minimal else "",
                                     members=[])
        if api_key == SYNC_GROUP:
            return SyncGroupResponse(version=v, error_code=error_code, assignment=b"")
        if api_key == HEARTBEAT:
            return HeartbeatResponse(version=v, error_code=error_code)
        if api_key == LEAVE_GROUP:
            return LeaveGroupResponse(version=v, error_code=error_code, members=[])
        if api_key == OFFSET_COMMIT:
            return self.offsets.commit_response(v, request, {}, default=error_code)
        if api_key == OFFSET_FETCH:
            if v >= 8:
                return OffsetFetchResponse(version=v, groups=[
                    OffsetFetchResponse.OffsetFetchResponseGroup(
                        group_id=g.group_id, topics=[], error_code=error_code)
                    for g in request.groups])
            return OffsetFetchResponse(version=v, topics=[], error_code=error_code)
        if api_key == LIST_GROUPS:
            return ListGroupsResponse(version=v, error_code=error_code, groups=[])
        if api_key == DESCRIBE_GROUPS:
            return DescribeGroupsResponse(version=v, groups=[
                self._described(v, gid, None, error_code) for gid in request.groups])
        if api_key == DELETE_GROUPS:
            return DeleteGroupsResponse(version=v, results=[
                DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=error_code)
                for g in request.groups_names])
        if api_key == OFFSET_DELETE:
            return OffsetDeleteResponse(version=v, error_code=error_code, topics=[])
        raise ValueError(f"the group coordinator does not handle API key {api_key}")

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _cancel(handle) -> None:
        if handle is not None:
            handle.cancel()

    @staticmethod
    def _resolve(waiters: list, result: dict) -> None:
        for fut in waiters:
            if not fut.done():
                fut.set_result(result)
        waiters.clear()

    def _schedule_expiry(self, group: Group, member: Member) -> None:
        self._cancel(member.timer)
        if self._closed or self._loop is None:
            return
        member.timer = self._loop.call_later(
            member.session_timeout_ms / 1000.0, self._member_expired, group, member)

    def _member_expired(self, group: Group, member: Member) -> None:
        member.timer = None
        if group.members.get(member.member_id) is not member:
            return
        if member.awaiting_join or member.awaiting_sync:
            # a member whose JoinGroup / SyncGroup is parked is alive; the rebalance timeout
            # (join) or the leader's own expiry (sync) bounds the wait
            self._schedule_expiry(group, member)
            return
        log.info("group %s: member %s session expired", group.group_id, member.member_id)
        self._remove_member(group, member, UNKNOWN_MEMBER_ID)

    def _pending_expired(self, group: Group, member_id: str) -> None:
        if group.pending.pop(member_id, None) is None:
            return
        if group.state == PREPARING_REBALANCE:
            self._try_complete_join(group)
        self.forget_if_unused(group)

    def _add_member(self, group: Group, member: Member) -> None:
        if not group.members:
            group.protocol_type = member.protocol_type
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static[member.instance_id] = member.member_id
        if group.leader_id is None:
            group.leader_id = member.member_id
        if group.state == PREPARING_REBALANCE and group.generation == 0:
            group.new_member_added = True  # the initial delay may wait longer (Kafka's rule)

    def _remove_member(self, group: Group, member: Member, error_code: int) -> None:
        """Drop a member (left, expired, fenced or not re-joined) and rebalance what remains."""
        group.members.pop(member.member_id, None)
        self._cancel(member.timer)
        member.timer = None
        if member.instance_id is not None and group.static.get(member.instance_id) == member.member_id:
            del group.static[member.instance_id]
        member.awaiting_join = member.awaiting_sync = False
        self._resolve(member.join_waiters, {"error_code": error_code, "member_id": member.member_id})
        self._resolve(member.sync_waiters, {"error_code": error_code})
        if group.leader_id == member.member_id:
            group.leader_id = next(iter(group.members), None)
        if group.state in (STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        elif group.state == PREPARING_REBALANCE:
            self._try_complete_join(group)
        self.forget_if_unused(group)

    def forget_if_unused(self, group: Group) -> None:
        """Drop a group with no members, no pending joins and no offsets."""
        if (group.state == EMPTY and not group.members and not group.pending
                and not group.offsets and self.groups.get(group.group_id) is group):
            group.state = DEAD
            del self.groups[group.group_id]

    # ------------------------------------------------------------------ rebalance
    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == COMPLETING_REBALANCE:
            for m in group.members.values():
                m.awaiting_sync = False
                m.assignment = b""
                self._resolve(m.sync_waiters, {"error_code": REBALANCE_IN_PROGRESS})
        self._cancel(group.join_timer)
        was_empty = group.state == EMPTY
        group.state = PREPARING_REBALANCE
        group.new_member_added = False
        if self._loop is None:
            raise RuntimeError("GroupCoordinator.start() was not awaited")
        rebalance_ms = group.rebalance_timeout_ms()
        if was_empty:
            delay = self.initial_rebalance_delay_ms
            remaining = max(rebalance_ms - delay, 0)
            group.initial_delay_active = True
            group.join_timer = self._loop.call_later(
                delay / 1000.0, self._initial_delay_fired, group, delay, remaining)
        else:
            group.initial_delay_active = False
            group.join_timer = self._loop.call_later(
                rebalance_ms / 1000.0, self._complete_join, group)
            self._try_complete_join(group)

    def _initial_delay_fired(self, group: Group, delay: int, remaining: int) -> None:
        group.join_timer = None
        if group.state != PREPARING_REBALANCE:
            return
        if group.new_member_added and remaining > 0:
            group.new_member_added = False
            step = min(delay, remaining)
            group.join_timer = self._loop.call_later(
                step / 1000.0, self._initial_delay_fired, group, delay, remaining - step)
            return
        group.initial_delay_active = False
        self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if (group.state == PREPARING_REBALANCE and not group.initial_delay_active
                and group.all_members_joined()):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.state != PREPARING_REBALANCE:
            return
        self._cancel(group.join_timer)
        group.join_timer = None
        group.initial_delay_active = False
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            log.info("group %s: member %s did not re-join in time", group.group_id, member.member_id)
            group.members.pop(member.member_id, None)
            self._cancel(member.timer)
            if member.instance_id is not None and group.static.get(member.instance_id) == member.member_id:
                del group.static[member.instance_id]
            self._resolve(member.sync_waiters, {"error_code": UNKNOWN_MEMBER_ID})
        group.generation += 1
        if not group.members:
            group.protocol_name = None
            group.leader_id = None
            group.state = EMPTY
            self.forget_if_unused(group)
            return
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.protocol_name = group.select_protocol()
        group.state = COMPLETING_REBALANCE
        for member in group.members.values():
            member.awaiting_join = False
            member.is_new = False
            self._resolve(member.join_waiters, self._join_result(group, member))
            self._schedule_expiry(group, member)

    def _join_result(self, group: Group, member: Member) -> dict:
        is_leader = member.member_id == group.leader_id
        return {
            "error_code": NONE,
            "generation_id": group.generation,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol_name,
            "leader": group.leader_id,
            "member_id": member.member_id,
            "members": [(m.member_id, m.instance_id, m.metadata_for(group.protocol_name))
                        for m in group.members.values()] if is_leader else [],
        }

    # ------------------------------------------------------------------ JoinGroup
    def _join_response(self, v: int, result: dict):
        error = result["error_code"]
        if error != NONE:
            return JoinGroupResponse(
                version=v, error_code=error, generation_id=-1, protocol_type=None,
                protocol_name=None if v >= 7 else "", leader="",
                member_id=result.get("member_id") or "", members=[])
        members = [JoinGroupResponse.JoinGroupResponseMember(
            member_id=mid, group_instance_id=iid, metadata=meta)
            for mid, iid, meta in result["members"]]
        return JoinGroupResponse(
            version=v, error_code=NONE, generation_id=result["generation_id"],
            protocol_type=result["protocol_type"], protocol_name=result["protocol_name"],
            leader=result["leader"], skip_assignment=False, member_id=result["member_id"],
            members=members)

    async def _join_group(self, v: int, req, client_id: str, client_host: str):
        def fail(code, member_id=""):
            return self._join_response(v, {"error_code": code, "member_id": member_id})

        if self._closed:
            return fail(COORDINATOR_NOT_AVAILABLE, req.member_id)
        group_id = req.group_id
        member_id = req.member_id or ""
        instance_id = req.group_instance_id if v >= 5 else None
        if not group_id:
            return fail(INVALID_GROUP_ID, member_id)
        session = req.session_timeout_ms
        if not self.min_session_timeout_ms <= session <= self.max_session_timeout_ms:
            return fail(INVALID_SESSION_TIMEOUT, member_id)
        rebalance = req.rebalance_timeout_ms if v >= 1 and req.rebalance_timeout_ms > 0 else session
        protocols = [(p.name, bytes(p.metadata)) for p in (req.protocols or [])]
        group = self.groups.get(group_id)

        if not member_id:
            if group is None:
                group = self.groups[group_id] = Group(group_id)
            if not group.supports(req.protocol_type, protocols):
                self.forget_if_unused(group)
                return fail(INCONSISTENT_GROUP_PROTOCOL)
            if instance_id is not None:
                return await self._join_static(v, group, req, instance_id, client_id, client_host,
                                               session, rebalance, protocols)
            new_id = f"{client_id}-{uuid.uuid4()}"
            if v >= 4:
                # KIP-394: hand out the id, count the member once it comes back with it
                group.pending[new_id] = self._loop.call_later(
                    session / 1000.0, self._pending_expired, group, new_id)
                return fail(MEMBER_ID_REQUIRED, new_id)
            member = Member(new_id, None, client_id, client_host, session, rebalance,
                            req.protocol_type, protocols)
            return await self._add_and_wait(v, group, member)

        # a member id was given
        if group is None or group.state == DEAD:
            return fail(UNKNOWN_MEMBER_ID, member_id)
        if instance_id is not None:
            known = group.static.get(instance_id)
            if known is not None and known != member_id:
                return fail(FENCED_INSTANCE_ID, member_id)
        if not group.supports(req.protocol_type, protocols, member_id):
            return fail(INCONSISTENT_GROUP_PROTOCOL, member_id)
        pending = group.pending.pop(member_id, None)
        if pending is not None:
            pending.cancel()
            member = Member(member_id, instance_id, client_id, client_host, session, rebalance,
                            req.protocol_type, protocols)
            return await self._add_and_wait(v, group, member)
        member = group.members.get(member_id)
        if member is None:
            return fail(UNKNOWN_MEMBER_ID, member_id)

        member.session_timeout_ms = session
        member.rebalance_timeout_ms = rebalance
        if len(group.members) == 1:
            group.protocol_type = req.protocol_type  # the only member may switch protocol type
        if group.state == PREPARING_REBALANCE:
            self._update_member(member, req.protocol_type, protocols, client_id, client_host)
            return await self._wait_join(v, group, member)
        if group.state in (COMPLETING_REBALANCE, STABLE):
            unchanged = member.protocols == protocols
            is_leader = member_id == group.leader_id
            if unchanged and (group.state == COMPLETING_REBALANCE or not is_leader):
                # a lost JoinGroup response, or a follower re-joining with nothing new:
                # answer with the current generation without a rebalance
                self._schedule_expiry(group, member)
                return self._join_response(v, self._join_result(group, member))
            self._update_member(member, req.protocol_type, protocols, client_id, client_host)
            fut = self._park_join(group, member)
            self._prepare_rebalance(group)
            return self._join_response(v, await fut)
        return fail(UNKNOWN_MEMBER_ID, member_id)  # Empty: a stale member of an old generation

    async def _join_static(self, v, group, req, instance_id, client_id, client_host, session,
                           rebalance, protocols):
        new_id = f"{instance_id}-{uuid.uuid4()}"
        old_id = group.static.get(instance_id)
        if old_id is not None and old_id in group.members:
            old = group.members[old_id]
            # fence the old incarnation: it gets FENCED_INSTANCE_ID from now on
            self._resolve(old.join_waiters, {"error_code": FENCED_INSTANCE_ID, "member_id": old_id})
            self._resolve(old.sync_waiters, {"error_code": FENCED_INSTANCE_ID})
            self._cancel(old.timer)
            del group.members[old_id]
            if group.leader_id == old_id:
                group.leader_id = None
        member = Member(new_id, instance_id, client_id, client_host, session, rebalance,
                        req.protocol_type, protocols)
        return await self._add_and_wait(v, group, member)

    @staticmethod
    def _update_member(member, protocol_type, protocols, client_id, client_host):
        member.protocol_type = protocol_type
        member.protocols = protocols
        member.client_id = client_id
        member.client_host = client_host

    def _park_join(self, group: Group, member: Member) -> asyncio.Future:
        fut = self._loop.create_future()
        member.join_waiters.append(fut)
        member.awaiting_join = True
        return fut

    async def _add_and_wait(self, v: int, group: Group, member: Member):
        self._add_member(group, member)
        fut = self._park_join(group, member)
        if group.state in (EMPTY, STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        else:
            self._try_complete_join(group)
        return self._join_response(v, await fut)

    async def _wait_join(self, v: int, group: Group, member: Member):
        fut = self._park_join(group, member)
        self._try_complete_join(group)
        return self._join_response(v, await fut)

    # ------------------------------------------------------------------ SyncGroup
    def _sync_response(self, v: int, group: Group | None, result: dict):
        ok = result["error_code"] == NONE
        return SyncGroupResponse(
            version=v, error_code=result["error_code"],
            protocol_type=group.protocol_type if (ok and group is not None and v >= 5) else None,
            protocol_name=group.protocol_name if (ok and group is not None and v >= 5) else None,
            assignment=result.get("assignment", b"") if ok else b"")

    async def _sync_group(self, v: int, req):
        def fail(code):
            return self._sync_response(v, None, {"error_code": code})

        if self._closed:
            return fail(COORDINATOR_NOT_AVAILABLE)
        if not req.group_id:
            return fail(INVALID_GROUP_ID)
        group = self.groups.get(req.group_id)
        if group is None or group.state == DEAD:
            return fail(UNKNOWN_MEMBER_ID)
        code = self._check_member(group, req.member_id, req.group_instance_id if v >= 3 else None)
        if code != NONE:
            return fail(code)
        if req.generation_id != group.generation:
            return fail(ILLEGAL_GENERATION)
        if v >= 5 and ((req.protocol_type is not None and req.protocol_type != group.protocol_type)
                       or (req.protocol_name is not None and req.protocol_name != group.protocol_name)):
            return fail(INCONSISTENT_GROUP_PROTOCOL)
        member = group.members[req.member_id]
        if group.state == PREPARING_REBALANCE:
            return fail(REBALANCE_IN_PROGRESS)
        if group.state == STABLE:
            self._schedule_expiry(group, member)
            return self._sync_response(v, group, {"error_code": NONE, "assignment": member.assignment})
        if group.state != COMPLETING_REBALANCE:
            return fail(UNKNOWN_MEMBER_ID)
        fut = self._loop.create_future()
        member.sync_waiters.append(fut)
        member.awaiting_sync = True
        self._schedule_expiry(group, member)
        if member.member_id == group.leader_id:
            given = {a.member_id: bytes(a.assignment) for a in (req.assignments or [])}
            group.state = STABLE
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
                m.awaiting_sync = False
                self._resolve(m.sync_waiters, {"error_code": NONE, "assignment": m.assignment})
                self._schedule_expiry(group, m)
        return self._sync_response(v, group, await fut)

    def _check_member(self, group: Group, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            known = group.static.get(instance_id)
            if known is not None and known != member_id:
                return FENCED_INSTANCE_ID
        if member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        return NONE

    # ------------------------------------------------------------------ Heartbeat
    def _heartbeat(self, req) -> int:
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE
        if not req.group_id:
            return INVALID_GROUP_ID
        group = self.groups.get(req.group_id)
        if group is None or group.state == EMPTY:
            return UNKNOWN_MEMBER_ID
        if group.state == DEAD:
            return COORDINATOR_NOT_AVAILABLE
        code = self._check_member(group, req.member_id, req.group_instance_id)
        if code != NONE:
            return code
        if req.generation_id != group.generation:
            return ILLEGAL_GENERATION
        self._schedule_expiry(group, group.members[req.member_id])
        return REBALANCE_IN_PROGRESS if group.state == PREPARING_REBALANCE else NONE

    # ------------------------------------------------------------------ LeaveGroup
    def _leave_group(self, v: int, req):
        if v >= 3:
            leaving = [(m.member_id or "", m.group_instance_id) for m in (req.members or [])]
        else:
            leaving = [(req.member_id or "", None)]
        if self._closed:
            top, codes = COORDINATOR_NOT_AVAILABLE, [COORDINATOR_NOT_AVAILABLE] * len(leaving)
        elif not req.group_id:
            top, codes = INVALID_GROUP_ID, [INVALID_GROUP_ID] * len(leaving)
        else:
            group = self.groups.get(req.group_id)
            codes = [self._leave_one(group, mid, iid) for mid, iid in leaving]
            top = NONE if v >= 3 else codes[0]
        if v < 3:
            return LeaveGroupResponse(version=v, error_code=top)
        return LeaveGroupResponse(version=v, error_code=top, members=[
            LeaveGroupResponse.MemberResponse(member_id=mid, group_instance_id=iid, error_code=code)
            for (mid, iid), code in zip(leaving, codes)])

    def _leave_one(self, group: Group | None, member_id: str, instance_id: str | None) -> int:
        if group is None or group.state == DEAD:
            return UNKNOWN_MEMBER_ID
        if instance_id is not None:
            known = group.static.get(instance_id)
            if known is None:
                return UNKNOWN_MEMBER_ID
            if member_id and known != member_id:
                return FENCED_INSTANCE_ID
            member_id = known
        pending = group.pending.pop(member_id, None)
        if pending is not None:
            pending.cancel()
            if group.state == PREPARING_REBALANCE:
                self._try_complete_join(group)
            self.forget_if_unused(group)
            return NONE
        member = group.members.get(member_id)
        if member is None:
            return UNKNOWN_MEMBER_ID
        log.info("group %s: member %s left", group.group_id, member_id)
        self._remove_member(group, member, UNKNOWN_MEMBER_ID)
        return NONE

    # ------------------------------------------------------------------ who may commit offsets
    def commit_error(self, v: int, req) -> int:
        """NONE when the OffsetCommit's member and generation may commit, else the error code."""
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE
        generation = req.generation_id_or_member_epoch if v >= 1 else -1
        member_id = req.member_id if v >= 1 else ""
        instance_id = req.group_instance_id if v >= 7 else None
        group = self.groups.get(req.group_id)
        if group is None:
            # no group management (assign() + commit): allowed; else a member of a forgotten group
            return NONE if generation < 0 else ILLEGAL_GENERATION
        if group.state == DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if generation < 0 and group.state == EMPTY:
            return NONE
        if group.state == COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        code = self._check_member(group, member_id, instance_id)
        if code != NONE:
            return code
        if generation != group.generation:
            return ILLEGAL_GENERATION
        self._schedule_expiry(group, group.members[member_id])
        return NONE

    def check_txn_commit(self, group_id: str, generation: int, member_id: str,
                         instance_id: str | None) -> int:
        """TxnOffsetCommit v3+ names the member and generation of the consumer (KIP-447): check
        them as OffsetCommit does; generation -1 (a producer outside any group) passes."""
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE
        if generation < 0:
            return NONE
        group = self.groups.get(group_id)
        if group is None:
            return ILLEGAL_GENERATION
        code = self._check_member(group, member_id, instance_id)
        if code != NONE:
            return code
        return NONE if generation == group.generation else ILLEGAL_GENERATION

    def commit_txn_offsets(self, group_id: str, offsets: dict) -> None:
        """The transaction coordinator's entry: see ``CommittedOffsets.commit_txn_offsets``."""
        self.offsets.commit_txn_offsets(group_id, offsets)
    # ------------------------------------------------------------------ List / Describe
    def _list_groups(self, v: int, req):
        states = {s.lower() for s in (req.states_filter or [])} if v >= 4 else set()
        types = {t.lower() for t in (req.types_filter or [])} if v >= 5 else set()
        listed = []
        for group in self.groups.values():
            if group.state == DEAD:
                continue
            if states and group.state.lower() not in states:
                continue
            if types and "classic" not in types:
                continue
            listed.append(ListGroupsResponse.ListedGroup(
                group_id=group.group_id, protocol_type=group.protocol_type or "",
                group_state=group.state, group_type="classic"))
        return ListGroupsResponse(version=v, error_code=NONE, groups=listed)

    def _described(self, v: int, group_id: str, group: Group | None, error_code: int = NONE):
        cls = DescribeGroupsResponse.DescribedGroup
        if group is None:
            if error_code == NONE and v >= 6:
                error_code = GROUP_ID_NOT_FOUND
            return cls(error_code=error_code,
                       error_message=(f"Group {group_id} not found." if error_code == GROUP_ID_NOT_FOUND
                                      else None),
                       group_id=group_id, group_state=DEAD, protocol_type="", protocol_data="",
                       members=[])
        stable = group.state == STABLE
        members = [cls.DescribedGroupMember(
            member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
            client_host=m.client_host,
            member_metadata=m.metadata_for(group.protocol_name) if stable else b"",
            member_assignment=m.assignment if stable else b"")
            for m in group.members.values()]
        return cls(error_code=NONE, error_message=None, group_id=group_id, group_state=group.state,
                   protocol_type=group.protocol_type or "",
                   protocol_data=(group.protocol_name or "") if stable else "", members=members)

    def _describe_groups(self, v: int, req):
        if self._closed:
            return self.error_response(DESCRIBE_GROUPS, v, req, COORDINATOR_NOT_AVAILABLE)
        return DescribeGroupsResponse(version=v, groups=[
            self._described(v, gid, self.groups.get(gid)) for gid in (req.groups or [])])

    # ------------------------------------------------------------------ DeleteGroups
    def _delete_groups(self, v: int, req):
        results = []
        for gid in req.groups_names or []:
            group = self.groups.get(gid)
            if self._closed:
                code = COORDINATOR_NOT_AVAILABLE
            elif not gid:
                code = INVALID_GROUP_ID
            elif group is None or group.state == DEAD:
                code = GROUP_ID_NOT_FOUND
            elif group.members or group.pending or group.state != EMPTY:
                code = NON_EMPTY_GROUP
            else:
                code = NONE
                self.offsets.drop_group(group)
                group.state = DEAD
                del self.groups[gid]
            results.append(DeleteGroupsResponse.DeletableGroupResult(group_id=gid, error_code=code))
        return DeleteGroupsResponse(version=v, results=results)

    # ------------------------------------------------------------------ inspection
    def describe(self) -> dict:
        """A plain-dict view of every group (for log_stats-like tooling and tests)."""
        return {gid: {"state": g.state, "generation": g.generation, "protocol": g.protocol_name,
                      "leader": g.leader_id, "members": list(g.members),
                      "offsets": {f"{t}-{p}": e.offset for (t, p), e in g.offsets.items()}}
                for gid, g in self.groups.items()}


__all__ = ["GroupCoordinator", "SUPPORTED_VERSIONS", "GROUP_API_KEYS"]
