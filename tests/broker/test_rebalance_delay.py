"""`group.initial.rebalance.delay.ms` as Kafka takes it (GroupCoordinator / InitialDelayedJoin):
the first rebalance of an empty group waits the delay even when every member has joined; while
new members keep joining a group that never completed a rebalance the wait is extended by the
same delay, up to the rebalance timeout; 0 answers at once. The broker takes the setting as a
config and shows it in DescribeConfigs.

Members arrive at fixed times here (the scenario is timing), with margins of 400 ms or more
against a loaded event loop; every assertion is on who landed in which generation."""
from __future__ import annotations

import asyncio
import time

from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.protocol.consumer.group import LeaveGroupRequest

from _broker_util import create_topic
from test_groups_unit import NONE, call, commit, join_known, new_coord, run, stable_group, state


async def _arrive(coord, at_s, loop, t0, **kw):
    await asyncio.sleep(max(0.0, t0 + at_s - loop.time()))  # the point: a member arriving at t0 + at_s
    mid, task = await join_known(coord, **kw)
    return mid, task


def test_the_first_rebalance_waits_the_delay_even_with_every_member_joined(tmp_path):
    async def go():
        coord = await new_coord(tmp_path, initial_rebalance_delay_ms=600)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        a, ta = await join_known(coord, client_id="a")
        resp = await ta
        assert loop.time() - t0 >= 0.6 * 0.95
        assert (resp.error_code, resp.generation_id, len(resp.members)) == (NONE, 1, 1)
        await coord.close()
    run(go())


def test_zero_delay_completes_the_first_rebalance_at_once(tmp_path):
    async def go():
        coord = await new_coord(tmp_path, initial_rebalance_delay_ms=0)
        a, ta = await join_known(coord, client_id="a")
        for _ in range(5):          # call_later(0): the next turns of the loop
            await asyncio.sleep(0)
        assert ta.done()
        assert (ta.result().generation_id, state(coord)) == (1, "CompletingRebalance")
        await coord.close()
    run(go())


def test_members_joining_during_the_delay_extend_it_into_one_generation(tmp_path):
    """delay 1 s: a at 0, b at 0.2 s (first window), c at 1.4 s (after the first window, inside
    the one b's arrival added): one generation of three."""
    async def go():
        coord = await new_coord(tmp_path, initial_rebalance_delay_ms=1000)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        a, ta = await join_known(coord, client_id="a")
        b, tb = await _arrive(coord, 0.2, loop, t0, client_id="b")
        c, tc = await _arrive(coord, 1.4, loop, t0, client_id="c")
        ra, rb, rc = await asyncio.gather(ta, tb, tc)
        assert {r.generation_id for r in (ra, rb, rc)} == {1}
        leader = next(r for r in (ra, rb, rc) if r.members)
        assert sorted(m.member_id for m in leader.members) == sorted([a, b, c])
        assert loop.time() - t0 >= 2.0 * 0.95   # two windows: the second began at 1.0 s
        await coord.close()
    run(go())


def test_the_extension_stops_at_the_rebalance_timeout(tmp_path):
    """delay 1 s, rebalance timeout 1.2 s: b's arrival extends the wait by 0.2 s only, so the
    rebalance completes at 1.2 s and c (at 1.6 s) is not in it (unbounded it would end at 2 s)."""
    async def go():
        coord = await new_coord(tmp_path, initial_rebalance_delay_ms=1000)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        a, ta = await join_known(coord, client_id="a", rebalance=1200)
        b, tb = await _arrive(coord, 0.2, loop, t0, client_id="b", rebalance=1200)
        ra, rb = await asyncio.gather(ta, tb)
        assert loop.time() - t0 >= 1.2 * 0.95
        assert (ra.generation_id, rb.generation_id) == (1, 1)
        leader = ra if ra.members else rb
        assert sorted(m.member_id for m in leader.members) == sorted([a, b])
        await coord.close()
    run(go())


def test_no_extension_once_the_group_has_completed_a_rebalance(tmp_path):
    """Kafka extends only a group at generation 0: a group that emptied (offsets kept) waits the
    delay once, and a member arriving after it starts a new generation."""
    async def go():
        coord = await new_coord(tmp_path, initial_rebalance_delay_ms=0)
        gen, (m,), _ = await stable_group(coord, 1)
        assert (await commit(coord, "g", {("t", 0): 3}, gen, m)).topics[0].partitions[0].error_code == NONE
        lv = await call(coord, LeaveGroupRequest, 1, group_id="g", member_id=m)
        assert lv.error_code == NONE and state(coord) == "Empty"
        generation = coord.groups["g"].generation
        assert generation >= 1
        coord.initial_rebalance_delay_ms = 1000
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        a, ta = await join_known(coord, client_id="a")
        b, tb = await _arrive(coord, 0.2, loop, t0, client_id="b")
        ra, rb = await asyncio.gather(ta, tb)
        assert ra.generation_id == rb.generation_id == generation + 1   # one window: a and b
        c, tc = await _arrive(coord, 1.4, loop, t0, client_id="c")
        await asyncio.sleep(0.05)  # the point: c's join stays parked while the loop runs on
        assert not tc.done() and state(coord) == "PreparingRebalance"  # c starts a new round
        await coord.close()
    run(go())


def test_the_default_is_zero_and_shown(shared_broker):
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        res = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")], config_filter="all")
    finally:
        admin.close()
    assert res["broker"]["0"]["group.initial.rebalance.delay.ms"]["value"] == "0"


def test_the_broker_takes_the_config_and_shows_it(tmp_path):
    from statekit import broker as broker_mod

    h = broker_mod.start(dir=str(tmp_path / "b"), port=0,
                         configs={"group.initial.rebalance.delay.ms": "1500"})
    try:
        admin = KafkaAdminClient(bootstrap_servers=h.bootstrap)
        try:
            res = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")], config_filter="all")
        finally:
            admin.close()
        assert res["broker"]["0"]["group.initial.rebalance.delay.ms"]["value"] == "1500"
        create_topic(h.bootstrap, "delay-t")
        c = KafkaConsumer(bootstrap_servers=h.bootstrap, group_id="delayed", session_timeout_ms=6000,
                          heartbeat_interval_ms=300)
        try:
            t0 = time.monotonic()
            c.subscribe(["delay-t"])
            deadline = t0 + 30
            while not c.assignment() and time.monotonic() < deadline:
                c.poll(100)
            assert {tp.partition for tp in c.assignment()} == {0}
            assert time.monotonic() - t0 >= 1.5 * 0.95   # the first rebalance waited the delay
        finally:
            c.close()
    finally:
        h.stop()
