"""The group coordinator's state machine, driven with plain kafka.protocol request objects (no
network). Every request goes through encode/decode at its version (as the server would hand it
over) and every response is encoded and decoded back at the same version, so a response that the
server could not put on the wire fails here."""
from __future__ import annotations

import asyncio
import json
import os

import pytest
from kafka.protocol.admin.groups import (
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    ListGroupsRequest, ListGroupsResponse,
)
from kafka.protocol.consumer.group import (
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchResponse, SyncGroupRequest,
    SyncGroupResponse,
)

from statekit.broker.groups import GroupCoordinator, SUPPORTED_VERSIONS
from waiting import async_wait_until

NONE, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL, INVALID_GROUP_ID = 0, 22, 23, 24
UNKNOWN_MEMBER_ID, INVALID_SESSION_TIMEOUT, REBALANCE_IN_PROGRESS = 25, 26, 27
COORDINATOR_NOT_AVAILABLE, GROUP_ID_NOT_FOUND, MEMBER_ID_REQUIRED, FENCED_INSTANCE_ID = 15, 69, 79, 82

RESPONSES = {
    11: JoinGroupResponse, 14: SyncGroupResponse, 12: HeartbeatResponse, 13: LeaveGroupResponse,
    8: OffsetCommitResponse, 9: OffsetFetchResponse, 16: ListGroupsResponse,
    15: DescribeGroupsResponse, 42: DeleteGroupsResponse, 47: OffsetDeleteResponse,
}
DELAY_MS = 60  # initial rebalance delay used by these tests


def run(coro, timeout=10):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def call(coord, request_cls, v, client_id="cli", **fields):
    """Build a request, put it through the wire format, hand it to the coordinator, and return the
    response after the same round trip."""
    req = request_cls(version=v, **fields)
    req.with_header(correlation_id=1, client_id=client_id)
    decoded = request_cls.decode(req.encode(header=True), version=v, header=True)
    resp = await coord.handle(request_cls.API_KEY, v, decoded)
    assert resp.API_VERSION == v, (resp, v)
    resp_cls = RESPONSES[request_cls.API_KEY]
    assert isinstance(resp, resp_cls)
    return resp_cls.decode(resp.encode(version=v), version=v)


def proto(name, meta=b""):
    return JoinGroupRequest.JoinGroupRequestProtocol(name=name, metadata=meta)


def join(coord, group="g", member_id="", v=5, session=10_000, rebalance=30_000, protocols=None,
         protocol_type="consumer", instance=None, client_id="cli"):
    kw = dict(group_id=group, session_timeout_ms=session, member_id=member_id,
              protocol_type=protocol_type,
              protocols=protocols if protocols is not None else [proto("range", b"meta-" + client_id.encode())])
    if v >= 1:
        kw["rebalance_timeout_ms"] = rebalance
    if v >= 5:
        kw["group_instance_id"] = instance
    return call(coord, JoinGroupRequest, v, client_id=client_id, **kw)


def sync(coord, group, generation, member_id, assignments=(), v=3, instance=None):
    kw = dict(group_id=group, generation_id=generation, member_id=member_id,
              assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=m, assignment=a)
                           for m, a in assignments])
    if v >= 3:
        kw["group_instance_id"] = instance
    return call(coord, SyncGroupRequest, v, **kw)


def heartbeat(coord, group, generation, member_id, v=3, instance=None):
    kw = dict(group_id=group, generation_id=generation, member_id=member_id)
    if v >= 3:
        kw["group_instance_id"] = instance
    return call(coord, HeartbeatRequest, v, **kw)


def commit(coord, group, offsets, generation=-1, member_id="", v=7):
    """offsets: {(topic, partition): offset}"""
    by_topic = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append(
            OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=p, committed_offset=o, committed_metadata="m%d" % o))
    kw = dict(group_id=group, topics=[
        OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()])
    if v >= 1:
        kw.update(generation_id_or_member_epoch=generation, member_id=member_id)
    if v >= 7:
        kw["group_instance_id"] = None
    return call(coord, OffsetCommitRequest, v, **kw)


def commit_codes(resp):
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def fetch(coord, group, topics, v=7):
    """topics: {topic: [partitions]} or None (all). Returns {(topic, p): (offset, metadata, err)}."""
    if v >= 8:
        g = OffsetFetchRequest.OffsetFetchRequestGroup(
            group_id=group, topics=None if topics is None else [
                OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(
                    name=t, partition_indexes=ps) for t, ps in topics.items()])
        kw = dict(groups=[g], require_stable=False)
        if v >= 9:
            g.member_id, g.member_epoch = None, -1

        async def go():
            resp = await call(coord, OffsetFetchRequest, v, **kw)
            assert [x.group_id for x in resp.groups] == [group]
            rg = resp.groups[0]
            assert rg.error_code == NONE
            return {(t.name, p.partition_index): (p.committed_offset, p.metadata, p.error_code)
                    for t in rg.topics for p in t.partitions}
        return go()
    kw = dict(group_id=group, topics=None if topics is None else [
        OffsetFetchRequest.OffsetFetchRequestTopic(name=t, partition_indexes=ps)
        for t, ps in topics.items()])
    if v >= 7:
        kw["require_stable"] = False

    async def go_old():
        resp = await call(coord, OffsetFetchRequest, v, **kw)
        if v >= 2:
            assert resp.error_code == NONE
        return {(t.name, p.partition_index): (p.committed_offset, p.metadata, p.error_code)
                for t in resp.topics for p in t.partitions}
    return go_old()


async def new_coord(tmp_path, **kw):
    kw.setdefault("initial_rebalance_delay_ms", DELAY_MS)
    coord = GroupCoordinator(str(tmp_path), **kw)
    await coord.start()
    return coord


async def join_known(coord, group="g", v=5, **kw):
    """The KIP-394 dance: MEMBER_ID_REQUIRED, then the real join (returned as a task)."""
    first = await join(coord, group, "", v=v, **kw)
    assert first.error_code == MEMBER_ID_REQUIRED and first.member_id
    assert first.generation_id == -1
    return first.member_id, asyncio.ensure_future(join(coord, group, first.member_id, v=v, **kw))


async def stable_group(coord, n, group="g", v=5, **kw):
    """n members joined in one initial window and synced; returns (generation, [member ids],
    leader id)."""
    tasks = []
    for i in range(n):
        _, t = await join_known(coord, group, v=v, client_id=f"c{i}", **kw)
        tasks.append(t)
    resps = await asyncio.gather(*tasks)
    gen = resps[0].generation_id
    leader = resps[0].leader
    ids = [r.member_id for r in resps]
    syncs = [asyncio.ensure_future(sync(coord, group, gen, m)) for m in ids if m != leader]
    await asyncio.sleep(0)  # one turn of the loop: the followers' syncs park before the leader's
    await sync(coord, group, gen, leader, [(m, m.encode()) for m in ids])
    for s in await asyncio.gather(*syncs):
        assert s.error_code == NONE
    return gen, ids, leader


def state(coord, group="g"):
    g = coord.groups.get(group)
    return None if g is None else g.state


# ---------------------------------------------------------------------------------------------

def test_supported_versions_match_kafka_python_schemas():
    classes = {11: JoinGroupRequest, 14: SyncGroupRequest, 12: HeartbeatRequest, 13: LeaveGroupRequest,
               8: OffsetCommitRequest, 9: OffsetFetchRequest, 16: ListGroupsRequest,
               15: DescribeGroupsRequest, 42: DeleteGroupsRequest, 47: OffsetDeleteRequest}
    for key, (lo, hi) in SUPPORTED_VERSIONS.items():
        assert lo == 0 and hi <= classes[key].max_version


def test_single_member_member_id_required_join_sync_heartbeat(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        first = await join(coord, "g", "", v=5, client_id="alice")
        assert first.error_code == MEMBER_ID_REQUIRED
        assert first.member_id.startswith("alice-")
        assert state(coord) == "Empty"  # a pending member is not a member yet
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        resp = await join(coord, "g", first.member_id, v=5, client_id="alice")
        waited = loop.time() - t0
        assert waited >= DELAY_MS / 1000 * 0.9  # the initial rebalance delay was honoured
        assert resp.error_code == NONE
        assert resp.generation_id == 1
        assert resp.leader == resp.member_id == first.member_id
        assert resp.protocol_name == "range"
        assert [(m.member_id, m.metadata) for m in resp.members] == [(first.member_id, b"meta-alice")]
        assert state(coord) == "CompletingRebalance"
        s = await sync(coord, "g", 1, first.member_id, [(first.member_id, b"A")])
        assert (s.error_code, s.assignment) == (NONE, b"A")
        assert state(coord) == "Stable"
        assert (await heartbeat(coord, "g", 1, first.member_id)).error_code == NONE
        await coord.close()
    run(go())


@pytest.mark.parametrize("v", [0, 1, 2, 3])
def test_old_join_versions_get_an_id_without_member_id_required(tmp_path, v):
    async def go():
        coord = await new_coord(tmp_path)
        resp = await join(coord, "g", "", v=v, client_id="old")
        assert resp.error_code == NONE and resp.member_id.startswith("old-")
        assert resp.generation_id == 1 and resp.leader == resp.member_id
        s = await sync(coord, "g", 1, resp.member_id, [(resp.member_id, b"x")], v=min(v, 3))
        assert s.assignment == b"x"
        await coord.close()
    run(go())


@pytest.mark.parametrize("v", range(0, 10))
def test_every_join_version_round_trips(tmp_path, v):
    async def go():
        coord = await new_coord(tmp_path, initial_rebalance_delay_ms=0)
        resp = await join(coord, "g", "", v=v)
        if v >= 4:
            assert resp.error_code == MEMBER_ID_REQUIRED
            resp = await join(coord, "g", resp.member_id, v=v)
        assert resp.error_code == NONE and resp.generation_id == 1
        if v >= 7:
            assert resp.protocol_type == "consumer"
        await coord.close()
    run(go())


def test_two_members_in_the_initial_window_leader_gets_members_follower_waits(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        a, ta = await join_known(coord, client_id="a")
        b, tb = await join_known(coord, client_id="b")
        ra, rb = await asyncio.gather(ta, tb)
        assert ra.generation_id == rb.generation_id == 1
        assert ra.leader == rb.leader == a  # the first member to join leads
        assert sorted((m.member_id, m.metadata) for m in ra.members) == sorted(
            [(a, b"meta-a"), (b, b"meta-b")])
        assert rb.members == []
        # the follower's SyncGroup parks until the leader's arrives
        fb = asyncio.ensure_future(sync(coord, "g", 1, b))
        await async_wait_until(lambda: coord.groups["g"].members[b].awaiting_sync, 5, "b's parked sync")
        await asyncio.sleep(0.05)  # the point: it stays parked while the loop runs on
        assert not fb.done()
        # ... and the event loop is not blocked meanwhile
        assert (await heartbeat(coord, "g", 1, b)).error_code == NONE
        sa = await sync(coord, "g", 1, a, [(a, b"for-a"), (b, b"for-b")])
        sb = await fb
        assert (sa.error_code, sa.assignment) == (NONE, b"for-a")
        assert (sb.error_code, sb.assignment) == (NONE, b"for-b")
        # a member missing from the leader's assignment gets empty bytes, not an error
        assert state(coord) == "Stable"
        await coord.close()
    run(go())


def test_new_member_triggers_rebalance_that_completes_when_all_rejoined(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        gen, (a,), leader = await stable_group(coord, 1, rebalance=60_000)
        assert gen == 1
        c, tc = await join_known(coord, client_id="c", rebalance=60_000)
        await async_wait_until(lambda: state(coord) == "PreparingRebalance", 5,
                               "c's join to start a rebalance")
        assert (await heartbeat(coord, "g", 1, a)).error_code == REBALANCE_IN_PROGRESS
        assert (await sync(coord, "g", 1, a)).error_code == REBALANCE_IN_PROGRESS
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ra = await join(coord, "g", a, rebalance=60_000, client_id="c0")
        rc = await tc
        assert loop.time() - t0 < 5  # did not wait for the 60 s rebalance timeout
        assert ra.generation_id == rc.generation_id == 2
        assert ra.leader == a and len(ra.members) == 2 and rc.members == []
        await coord.close()
    run(go())


def test_leave_rebalances_the_rest_and_last_leave_empties_group(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        gen, ids, leader = await stable_group(coord, 2)
        follower = next(m for m in ids if m != leader)
        # the leader leaves (v0-2 style single member)
        resp = await call(coord, LeaveGroupRequest, 1, group_id="g", member_id=leader)
        assert resp.error_code == NONE
        assert state(coord) == "PreparingRebalance"
        assert (await heartbeat(coord, "g", gen, follower)).error_code == REBALANCE_IN_PROGRESS
        r = await join(coord, "g", follower, client_id="c1")
        assert r.generation_id == gen + 1 and r.leader == follower
        assert [m.member_id for m in r.members] == [follower]
        assert (await sync(coord, "g", gen + 1, follower, [(follower, b"all")])).assignment == b"all"
        # v3+ batch leave: one known, one unknown member
        resp = await call(coord, LeaveGroupRequest, 4, group_id="g", members=[
            LeaveGroupRequest.MemberIdentity(member_id=follower, group_instance_id=None),
            LeaveGroupRequest.MemberIdentity(member_id="nobody", group_instance_id=None)])
        assert resp.error_code == NONE
        assert [(m.member_id, m.error_code) for m in resp.members] == [
            (follower, NONE), ("nobody", UNKNOWN_MEMBER_ID)]
        # no members and no offsets: the group is forgotten
        assert state(coord) is None
        resp = await call(coord, LeaveGroupRequest, 0, group_id="g", member_id=follower)
        assert resp.error_code == UNKNOWN_MEMBER_ID
        await coord.close()
    run(go())


def test_group_with_offsets_becomes_empty_not_dead(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        gen, (a,), _ = await stable_group(coord, 1)
        assert commit_codes(await commit(coord, "g", {("t", 0): 5}, gen, a)) == {("t", 0): NONE}
        await call(coord, LeaveGroupRequest, 2, group_id="g", member_id=a)
        assert state(coord) == "Empty"
        assert coord.groups["g"].generation == gen + 1
        assert (await heartbeat(coord, "g", gen, a)).error_code == UNKNOWN_MEMBER_ID
        await coord.close()
    run(go())


def test_session_timeout_expires_a_silent_member(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        gen, ids, leader = await stable_group(coord, 2, session=300)
        silent, alive = ids[0], ids[1]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3
        code = NONE
        while loop.time() < deadline:  # `alive` heartbeats; `silent` does not
            code = (await heartbeat(coord, "g", gen, alive)).error_code
            if code != NONE:
                break
            await asyncio.sleep(0.05)  # pacing: alive's heartbeats, well inside its session
        assert code == REBALANCE_IN_PROGRESS
        assert silent not in coord.groups["g"].members
        r = await join(coord, "g", alive, session=300, client_id="c1")
        assert r.generation_id == gen + 1 and [m.member_id for m in r.members] == [alive]
        assert (await heartbeat(coord, "g", gen, silent)).error_code == UNKNOWN_MEMBER_ID
        await coord.close()
    run(go())


def test_member_that_does_not_rejoin_within_rebalance_timeout_is_dropped(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        gen, ids, leader = await stable_group(coord, 2, rebalance=400, session=10_000)
        stays = ids[1]
        # stays re-joins with new metadata, which starts a rebalance; ids[0] never re-joins
        t = asyncio.ensure_future(join(coord, "g", stays, rebalance=400,
                                       protocols=[proto("range", b"new")], client_id="c1"))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        r = await t
        assert 0.3 < loop.time() - t0 < 3
        assert r.generation_id == gen + 1 and r.leader == stays
        assert [(m.member_id, m.metadata) for m in r.members] == [(stays, b"new")]
        await coord.close()
    run(go())


def test_generation_and_member_checks(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        gen, (a,), _ = await stable_group(coord, 1)
        assert (await heartbeat(coord, "g", gen + 7, a)).error_code == ILLEGAL_GENERATION
        assert (await heartbeat(coord, "g", gen, "ghost")).error_code == UNKNOWN_MEMBER_ID
        assert (await heartbeat(coord, "nogroup", gen, a)).error_code == UNKNOWN_MEMBER_ID
        assert (await sync(coord, "g", gen + 1, a)).error_code == ILLEGAL_GENERATION
        assert (await sync(coord, "g", gen, "ghost")).error_code == UNKNOWN_MEMBER_ID
        # Stable: a repeated SyncGroup returns the same assignment
        s = await sync(coord, "g", gen, a)
        assert (s.error_code, s.assignment) == (NONE, a.encode())
        assert commit_codes(await commit(coord, "g", {("t", 0): 1}, gen + 1, a)) == {
            ("t", 0): ILLEGAL_GENERATION}
        assert commit_codes(await commit(coord, "g", {("t", 0): 1}, gen, "ghost")) == {
            ("t", 0): UNKNOWN_MEMBER_ID}
        # a known member id on a group that does not exist
        assert (await join(coord, "other", "ghost-1")).error_code == UNKNOWN_MEMBER_ID
        assert (await join(coord, "g", "ghost-2")).error_code == UNKNOWN_MEMBER_ID
        assert (await join(coord, "", "")).error_code == INVALID_GROUP_ID
        assert (await join(coord, "g", "", session=10)).error_code == INVALID_SESSION_TIMEOUT
        assert (await heartbeat(coord, "", gen, a)).error_code == INVALID_GROUP_ID
        await coord.close()
    run(go())


def test_protocol_selection_and_inconsistent_protocols(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        a, ta = await join_known(coord, protocols=[proto("range", b"ra"), proto("roundrobin", b"rra")])
        b, tb = await join_known(coord, protocols=[proto("roundrobin", b"rrb"), proto("sticky", b"sb")])
        ra, rb = await asyncio.gather(ta, tb)
        assert ra.protocol_name == rb.protocol_name == "roundrobin"
        assert sorted(m.metadata for m in ra.members) == [b"rra", b"rrb"]
        bad_type = await join(coord, "g", "", protocol_type="connect")
        assert bad_type.error_code == INCONSISTENT_GROUP_PROTOCOL
        no_common = await join(coord, "g", "", protocols=[proto("cooperative-sticky")])
        assert no_common.error_code == INCONSISTENT_GROUP_PROTOCOL
        assert (await join(coord, "fresh", "", protocols=[])).error_code == INCONSISTENT_GROUP_PROTOCOL
        assert state(coord, "fresh") is None
        # SyncGroup v5 checks protocol type/name
        s = await call(coord, SyncGroupRequest, 5, group_id="g", generation_id=1, member_id=a,
                       group_instance_id=None, protocol_type="consumer", protocol_name="range",
                       assignments=[])
        assert s.error_code == INCONSISTENT_GROUP_PROTOCOL
        fb = asyncio.ensure_future(call(coord, SyncGroupRequest, 5, group_id="g", generation_id=1,
                                        member_id=b, group_instance_id=None, protocol_type="consumer",
                                        protocol_name="roundrobin", assignments=[]))
        s = await call(coord, SyncGroupRequest, 5, group_id="g", generation_id=1, member_id=a,
                       group_instance_id=None, protocol_type="consumer", protocol_name="roundrobin",
                       assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=b, assignment=b"B")])
        assert (s.error_code, s.protocol_type, s.protocol_name, s.assignment) == (
            NONE, "consumer", "roundrobin", b"")
        assert (await fb).assignment == b"B"
        await coord.close()
    run(go())


def test_rejoin_in_completing_rebalance_returns_current_generation(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        a, ta = await join_known(coord)
        ra = await ta
        # a lost JoinGroup response: the same member joins again with the same metadata
        again = await join(coord, "g", a)
        assert (again.generation_id, again.leader, len(again.members)) == (ra.generation_id, a, 1)
        assert state(coord) == "CompletingRebalance"
        await coord.close()
    run(go())


def test_rebalance_during_completing_rebalance_fails_parked_syncs(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        a, ta = await join_known(coord, client_id="a")
        b, tb = await join_known(coord, client_id="b")
        await asyncio.gather(ta, tb)
        fb = asyncio.ensure_future(sync(coord, "g", 1, b))
        await async_wait_until(lambda: coord.groups["g"].members[b].awaiting_sync, 5, "b's parked sync")
        # the leader leaves before it syncs
        await call(coord, LeaveGroupRequest, 3, group_id="g", members=[
            LeaveGroupRequest.MemberIdentity(member_id=a, group_instance_id=None)])
        assert (await fb).error_code == REBALANCE_IN_PROGRESS
        r = await join(coord, "g", b, client_id="b")
        assert (r.generation_id, r.leader) == (2, b)
        await coord.close()
    run(go())


def test_pending_member_that_never_returns_expires(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        gen, (a,), _ = await stable_group(coord, 1, session=10_000)
        first = await join(coord, "g", "", session=300)  # MEMBER_ID_REQUIRED, never comes back
        assert first.error_code == MEMBER_ID_REQUIRED
        assert first.member_id in coord.groups["g"].pending
        # a rebalance waits for the pending member until its session times out
        t = asyncio.ensure_future(join(coord, "g", a, protocols=[proto("range", b"v2")], client_id="c0"))
        r = await asyncio.wait_for(t, 3)
        assert r.error_code == NONE and r.generation_id == gen + 1
        assert coord.groups["g"].pending == {}
        await coord.close()
    run(go())


def test_offsets_commit_fetch_and_survive_restart(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        # standalone commits (no group management): generation -1, empty member id
        r = await commit(coord, "g1", {("t", 0): 10, ("t", 1): 20, ("u", 0): 3}, v=2)
        assert set(commit_codes(r).values()) == {NONE}
        r = await commit(coord, "g1", {("t", 0): 11}, v=8)
        assert set(commit_codes(r).values()) == {NONE}
        await commit(coord, "g2", {("t", 0): 99}, v=0)
        assert await fetch(coord, "g1", {"t": [0, 1, 2]}, v=1) == {
            ("t", 0): (11, "m11", NONE), ("t", 1): (20, "m20", NONE), ("t", 2): (-1, "", NONE)}
        for v in (2, 5, 7, 8, 9):
            assert await fetch(coord, "g1", None, v=v) == {
                ("t", 0): (11, "m11", NONE), ("t", 1): (20, "m20", NONE), ("u", 0): (3, "m3", NONE)}
        assert await fetch(coord, "nobody", {"t": [0]}, v=8) == {("t", 0): (-1, "", NONE)}
        assert await fetch(coord, "nobody", None, v=3) == {}
        await coord.close()

        # a torn last line (a crash mid-write) is skipped on reload
        with open(os.path.join(tmp_path, "group-offsets.jsonl"), "a") as f:
            f.write('{"g":"g1","t":"t","p":0,"o":12')
        coord2 = await new_coord(tmp_path)
        assert await fetch(coord2, "g1", None, v=8) == {
            ("t", 0): (11, "m11", NONE), ("t", 1): (20, "m20", NONE), ("u", 0): (3, "m3", NONE)}
        assert await fetch(coord2, "g2", {"t": [0]}, v=6) == {("t", 0): (99, "m99", NONE)}
        lg = await call(coord2, ListGroupsRequest, 4, states_filter=[])
        assert sorted((g.group_id, g.group_state) for g in lg.groups) == [
            ("g1", "Empty"), ("g2", "Empty")]
        await coord2.close()
    run(go())


def test_offset_file_is_compacted(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        for i in range(12_000):
            await commit(coord, "g", {("t", i % 3): i})
        await coord.close()
        with open(os.path.join(tmp_path, "group-offsets.jsonl")) as f:
            lines = [json.loads(x) for x in f]
        assert len(lines) < 10_010
        coord = await new_coord(tmp_path)
        assert await fetch(coord, "g", {"t": [0, 1, 2]}) == {
            ("t", 0): (11_997, "m11997", NONE), ("t", 1): (11_998, "m11998", NONE),
            ("t", 2): (11_999, "m11999", NONE)}
        await coord.close()
    run(go())


def test_commit_rules_follow_kafka(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        # a member of a group this coordinator does not know (e.g. before a restart)
        assert commit_codes(await commit(coord, "g", {("t", 0): 1}, 3, "m")) == {
            ("t", 0): ILLEGAL_GENERATION}
        a, ta = await join_known(coord, client_id="a")
        ra = await ta
        # CompletingRebalance: commits wait for the new assignment
        assert commit_codes(await commit(coord, "g", {("t", 0): 1}, 1, a)) == {
            ("t", 0): REBALANCE_IN_PROGRESS}
        await sync(coord, "g", 1, a, [(a, b"x")])
        # a standalone commit into a group with live members is rejected
        assert commit_codes(await commit(coord, "g", {("t", 0): 1})) == {("t", 0): UNKNOWN_MEMBER_ID}
        assert commit_codes(await commit(coord, "g", {("t", 0): 42}, 1, a)) == {("t", 0): NONE}
        # PreparingRebalance: members may still commit what they processed
        b, tb = await join_known(coord, client_id="b")
        await async_wait_until(lambda: state(coord) == "PreparingRebalance", 5,
                               "b's join to start a rebalance")
        assert commit_codes(await commit(coord, "g", {("t", 0): 43}, 1, a)) == {("t", 0): NONE}
        assert await fetch(coord, "g", {"t": [0]}) == {("t", 0): (43, "m43", NONE)}
        await join(coord, "g", a, client_id="a")
        await tb
        await coord.close()
    run(go())


def test_list_and_describe_groups(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        gen, ids, leader = await stable_group(coord, 2)
        await commit(coord, "offsets-only", {("t", 0): 1})
        for v in range(0, 6):
            kw = {}
            if v >= 4:
                kw["states_filter"] = []
            if v >= 5:
                kw["types_filter"] = []
            lg = await call(coord, ListGroupsRequest, v, **kw)
            assert lg.error_code == NONE
            assert sorted((g.group_id, g.protocol_type) for g in lg.groups) == [
                ("g", "consumer"), ("offsets-only", "")]
        lg = await call(coord, ListGroupsRequest, 4, states_filter=["stable"])
        assert [(g.group_id, g.group_state) for g in lg.groups] == [("g", "Stable")]
        lg = await call(coord, ListGroupsRequest, 5, states_filter=[], types_filter=["consumer"])
        assert lg.groups == []
        lg = await call(coord, ListGroupsRequest, 5, states_filter=[], types_filter=["Classic"])
        assert len(lg.groups) == 2

        for v in range(0, 7):
            kw = {"groups": ["g", "missing"]}
            if v >= 3:
                kw["include_authorized_operations"] = False
            d = await call(coord, DescribeGroupsRequest, v, **kw)
            g, missing = d.groups
            assert (g.error_code, g.group_id, g.group_state, g.protocol_type, g.protocol_data) == (
                NONE, "g", "Stable", "consumer", "range")
            assert sorted(m.member_id for m in g.members) == sorted(ids)
            by_id = {m.member_id: m for m in g.members}
            assert by_id[ids[1]].member_assignment == ids[1].encode()
            assert by_id[ids[1]].member_metadata == b"meta-c1"
            assert by_id[ids[1]].client_id == "c1"
            if v >= 6:
                assert missing.error_code == GROUP_ID_NOT_FOUND
            else:
                assert (missing.error_code, missing.group_state) == (NONE, "Dead")
        await coord.close()
    run(go())


def test_static_membership_fences_the_old_incarnation(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        r1 = await join(coord, "g", "", instance="inst-1", v=5)
        assert r1.error_code == NONE  # static members skip MEMBER_ID_REQUIRED
        old = r1.member_id
        assert old.startswith("inst-1-")
        await sync(coord, "g", r1.generation_id, old, [(old, b"x")], instance="inst-1")
        # the same instance restarts (new process, no member id)
        r2 = await join(coord, "g", "", instance="inst-1", v=5)
        assert r2.error_code == NONE and r2.member_id != old
        assert r2.generation_id == r1.generation_id + 1
        assert (await heartbeat(coord, "g", r2.generation_id, old, instance="inst-1")).error_code == \
            FENCED_INSTANCE_ID
        assert (await join(coord, "g", old, instance="inst-1")).error_code == FENCED_INSTANCE_ID
        # static leave by instance id only
        lv = await call(coord, LeaveGroupRequest, 5, group_id="g", members=[
            LeaveGroupRequest.MemberIdentity(member_id="", group_instance_id="inst-1", reason="bye")])
        assert [m.error_code for m in lv.members] == [NONE]
        assert state(coord) is None
        await coord.close()
    run(go())


def test_close_answers_parked_requests(tmp_path):
    async def go():
        coord = await new_coord(tmp_path, initial_rebalance_delay_ms=5_000)
        a, ta = await join_known(coord)
        await async_wait_until(lambda: coord.groups["g"].members.get(a) is not None
                               and coord.groups["g"].members[a].awaiting_join, 5, "a's parked join")
        assert not ta.done()
        await coord.close()
        assert (await ta).error_code == COORDINATOR_NOT_AVAILABLE
        assert (await heartbeat(coord, "g", 1, a)).error_code == COORDINATOR_NOT_AVAILABLE
    run(go())


def test_cancelled_join_does_not_break_the_group(tmp_path):
    """A client that disconnects while its JoinGroup is parked (the server cancels the handler)."""
    async def go():
        coord = await new_coord(tmp_path)
        a, ta = await join_known(coord, client_id="a")
        b, tb = await join_known(coord, client_id="b")
        await async_wait_until(lambda: coord.groups["g"].members.get(b) is not None
                               and coord.groups["g"].members[b].awaiting_join, 5, "b's parked join")
        tb.cancel()
        ra = await ta
        assert ra.error_code == NONE and len(ra.members) == 2
        await coord.close()
    run(go())


def test_delete_groups_and_offset_delete(tmp_path):
    async def go():
        coord = await new_coord(tmp_path)
        await commit(coord, "idle", {("t", 0): 5, ("t", 1): 6, ("u", 0): 7})
        gen, (a,), _ = await stable_group(coord, 1, protocols=[proto("range", CONSUMER_META_T)])
        await commit(coord, "g", {("t", 0): 1, ("other", 0): 2}, gen, a)
        for v in (0, 1, 2):
            d = await call(coord, DeleteGroupsRequest, v, groups_names=["g", "missing"])
            assert [(r.group_id, r.error_code) for r in d.results] == [("g", 68), ("missing", 69)]
        # OffsetDelete: refused for a topic the live members subscribe to, done for the others
        od = await call(coord, OffsetDeleteRequest, 0, group_id="g", topics=[
            OffsetDeleteRequest.OffsetDeleteRequestTopic(name=n, partitions=[
                OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=0)])
            for n in ("t", "other")])
        assert od.error_code == NONE
        assert [(t.name, [p.error_code for p in t.partitions]) for t in od.topics] == [
            ("t", [86]), ("other", [NONE])]
        assert await fetch(coord, "g", None) == {("t", 0): (1, "m1", NONE)}
        od = await call(coord, OffsetDeleteRequest, 0, group_id="idle", topics=[
            OffsetDeleteRequest.OffsetDeleteRequestTopic(name="t", partitions=[
                OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=1)])])
        assert [p.error_code for p in od.topics[0].partitions] == [NONE]
        d = await call(coord, DeleteGroupsRequest, 2, groups_names=["idle"])
        assert [r.error_code for r in d.results] == [NONE]
        assert state(coord, "idle") is None
        await coord.close()
        coord = await new_coord(tmp_path)  # the deletions were persisted
        assert state(coord, "idle") is None
        assert await fetch(coord, "g", None) == {("t", 0): (1, "m1", NONE)}
        await coord.close()
    run(go())


# ConsumerProtocolSubscription v0 subscribing to topic "t"
CONSUMER_META_T = b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\xff\xff\xff\xff"


def test_mutated_group_requests_never_raise(tmp_path):
    """Every group request that still decodes after random edits gets a response of its version
    that encodes; nothing raises. (The network fuzz test rarely gets a mutated group request past
    the decoder; this drives the coordinator directly.)"""
    import random
    import struct

    rng = random.Random(7)
    samples = [
        (JoinGroupRequest, 5, dict(group_id="g", session_timeout_ms=10_000, rebalance_timeout_ms=500,
                                   member_id="", group_instance_id=None, protocol_type="consumer",
                                   protocols=[proto("range", b"\x00\x01")])),
        (JoinGroupRequest, 1, dict(group_id="g", session_timeout_ms=10_000, rebalance_timeout_ms=500,
                                   member_id="", protocol_type="consumer", protocols=[proto("range")])),
        (SyncGroupRequest, 5, dict(group_id="g", generation_id=1, member_id="m", group_instance_id=None,
                                   protocol_type="consumer", protocol_name="range", assignments=[
                                       SyncGroupRequest.SyncGroupRequestAssignment(member_id="m", assignment=b"a")])),
        (HeartbeatRequest, 4, dict(group_id="g", generation_id=1, member_id="m", group_instance_id="i")),
        (LeaveGroupRequest, 5, dict(group_id="g", members=[
            LeaveGroupRequest.MemberIdentity(member_id="m", group_instance_id="i", reason="r")])),
        (LeaveGroupRequest, 0, dict(group_id="g", member_id="m")),
        (OffsetCommitRequest, 8, dict(group_id="g", generation_id_or_member_epoch=-1, member_id="",
                                      group_instance_id=None, topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(name="t", partitions=[
                OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=5, committed_leader_epoch=1, committed_metadata="x")])])),
        (OffsetFetchRequest, 8, dict(groups=[OffsetFetchRequest.OffsetFetchRequestGroup(group_id="g", topics=[
            OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name="t", partition_indexes=[0, 1])])],
            require_stable=True)),
        (OffsetFetchRequest, 3, dict(group_id="g", topics=[
            OffsetFetchRequest.OffsetFetchRequestTopic(name="t", partition_indexes=[0])])),
        (ListGroupsRequest, 5, dict(states_filter=["Stable"], types_filter=["classic"])),
        (DescribeGroupsRequest, 6, dict(groups=["g", "h"], include_authorized_operations=True)),
        (DeleteGroupsRequest, 2, dict(groups_names=["g"])),
        (OffsetDeleteRequest, 0, dict(group_id="g", topics=[OffsetDeleteRequest.OffsetDeleteRequestTopic(
            name="t", partitions=[OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(
                partition_index=0)])])),
    ]
    encoded = [(cls, v, bytes(cls(version=v, **kw).encode())) for cls, v, kw in samples]

    def mutate(body: bytes) -> bytes:
        b = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            if not b:
                b += b"\x00"
            i = rng.randrange(len(b))
            op = rng.randrange(4)
            if op == 0:
                b[i] ^= 1 << rng.randrange(8)
            elif op == 1 and i + 4 <= len(b):
                struct.pack_into(">i", b, i, rng.choice([-1, 0, 1, 0x7FFFFFFF, -0x80000000]))
            elif op == 2:
                b[i:i] = rng.randbytes(rng.randint(1, 8))
            else:
                del b[i:i + rng.randint(1, 8)]
        return bytes(b)

    async def go():
        coord = await new_coord(tmp_path, initial_rebalance_delay_ms=0)
        handled = 0
        for _ in range(6000):
            cls, v, body = rng.choice(encoded)
            try:
                req = cls.decode(mutate(body), version=v)
            except Exception:  # noqa: BLE001 - the server closes the connection on these
                continue
            try:
                resp = await asyncio.wait_for(coord.handle(cls.API_KEY, v, req, client_id="fz"), 0.05)
            except asyncio.TimeoutError:
                continue  # a join or sync parked on a rebalance: legitimate
            RESPONSES[cls.API_KEY].decode(resp.encode(version=v), version=v)
            handled += 1
        assert handled > 1000
        await coord.close()
    run(go(), timeout=120)
