"""Kafka going away under a running application (issue 31), with no restart() from anyone: the
broker behind a fault-injecting proxy (tests/runtime/faultproxy.py: blackholes, resets, answers or
requests cut in the middle, a slow broker) or killed with SIGKILL and started again on the same
directory and port. The app — a stream-table join, a windowed count and a word count with a Kafka
sink, exactly-once, two instances and a standby — goes WAITING and comes back by itself; at the
end its stores equal plain-Python references and its sinks, read read_committed, hold every
output once (a key's count only grows). Past ``task_timeout`` it goes to ERROR in one line, and
``restart()`` brings it back.

Why the references hold whatever the faults: the users table is written and applied before any
click, every record goes to its key's partition, counts are sums, and a window's count does not
depend on how the clicks were cut into batches (the grace is longer than the test).
"""
from __future__ import annotations

import collections
import os
import random
import struct
import time

import pytest
from hypothesis import given, settings, strategies as st

from faultproxy import FaultProxy
from harness import (WINDOW_MS, make_chunks, produce_chunk, read_topic, store_as_dict, unique,
                     windowed_reference, wordcount_reference)
from waiting import wait_until

REGIONS = "nesw"
USERS = [f"user-{i}" for i in range(9)]
KINDS = ("blackhole", "reset", "slow", "restart", "cut-answer", "cut-request")
CUTS = ("cut-answer", "cut-request")
CUT_BYTES = 32 << 10     # only a task's input Fetch or its commit's Produce is this big here


def region_of(user: str) -> str:
    return REGIONS[int(user.rsplit("-", 1)[1]) % len(REGIONS)]


def build(app):
    """The word count with a Kafka sink (a repartition topic between its two sub-topologies), a
    windowed click count, and clicks joined with the users table, counted by region into a sink."""
    from statekit.topology.graph import tumbling

    (app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
     .to_stream().to("counts-out", value_serde="int64"))
    clicks = app.stream("clicks")
    clicks.group_by_key().windowed_by(tumbling(WINDOW_MS), grace_ms=10 ** 9).count(
        store="clicks-per-window")
    users = app.table("users", store="users")
    (clicks.join(users, lambda page, region: region).group_by(lambda user, region: region)
     .count(store="per-region").to_stream().to("region-out", value_serde="int64"))


class Env:
    """A broker behind a proxy, and an app on it (through the proxy)."""

    def __init__(self, tmp_path, task_timeout=20.0, seed=0, instances=2, engine="local", proxy=True):
        import statekit
        from statekit import broker as broker_mod
        from statekit.kafka import Kafka

        self.tmp = tmp_path
        self.proxy = FaultProxy() if proxy else None   # without: the app talks to the broker itself
        self.broker_dir = str(tmp_path / "broker")
        self.broker = broker_mod.start(dir=self.broker_dir, port=0, configs={
            "advertised.listeners": self.proxy.listener} if proxy else None)
        self.port = int(self.broker.bootstrap.rsplit(":", 1)[1])
        if proxy:
            self.proxy.upstream = self.broker.bootstrap
        self.bootstrap = self.proxy.bootstrap if proxy else self.broker.bootstrap
        self.kafka = Kafka(self.bootstrap)
        self.app = None
        for t in ("lines", "clicks", "users", "counts-out", "region-out"):
            self.kafka.ensure_topic(t, 2)
        self.name = unique("outage")
        self.app = statekit.App(self.name, bootstrap=self.bootstrap, partitions=2,
                                instances=instances, standby_replicas=1 if instances > 1 else 0,
                                state_dir=str(tmp_path / "state"), engine=engine,
                                task_timeout=task_timeout, probing_rebalance_interval=0.3)
        build(self.app)
        self.states: list = []
        self.app._life.add_listener(lambda new, old: self.states.append(str(new)))
        self.rnd = random.Random(seed)
        self.chunks = make_chunks(seed, 12, lines_per_chunk=14, clicks_per_chunk=24)

    def start(self):
        from statekit.partition import partition_for

        users = collections.defaultdict(list)
        for u in USERS:
            users[partition_for(u.encode(), 2)].append((u.encode(), region_of(u).encode()))
        for p, recs in users.items():
            self.kafka.send("users", p, recs)
        self.app.start(sink="kafka")
        assert self.app.process_all_available(timeout=120)

    def produce(self, i):
        produce_chunk(self.kafka, self.chunks[i % len(self.chunks)], rnd=self.rnd, parts=2)

    def produce_big(self, seed):
        """Lines enough that the word count's next Fetch answer and its commit's Produce request
        are bigger than CUT_BYTES (nothing else here sends that much at once): one send per
        partition, so that its Fetch answer holds them all."""
        produce_chunk(self.kafka, make_chunks(seed, 1, 4000, 0)[0], rnd=self.rnd, parts=2, sends=1)

    def own_port(self, port) -> bool:
        """Is ``port`` a client port of the test's own connections (spared by a cut)?"""
        k = self.kafka
        conns = list(k._conns.values()) + ([k._boot_conn] if k._boot_conn else [])
        ports = set()
        for c in conns:
            try:
                ports.add(c.sock.getsockname()[1])
            except OSError:
                pass
        return port in ports

    # -- faults ----------------------------------------------------------------------------------
    def restart_broker(self, down: float):
        from statekit import broker as broker_mod

        self.broker.kill()
        time.sleep(down)
        self.broker = broker_mod.start(dir=self.broker_dir, port=self.port,
                                       configs={"advertised.listeners": self.proxy.listener})

    def outage(self, kind: str, seconds: float):
        """Inject one fault for about ``seconds`` (a cut is one moment), then heal."""
        p = self.proxy
        if kind == "blackhole":
            p.blackhole()
            time.sleep(seconds)
        elif kind == "reset":
            p.reset(hold=seconds)
            time.sleep(seconds)
        elif kind in CUTS:
            # the connection of a task reading its input (an answer cut mid-Fetch) or committing
            # (a transaction's produce request cut in the middle): it waits, aborts, replays. Armed
            # before the input is written (so the app cannot have read it all already), sparing
            # the test's own client
            p.cut("down" if kind == "cut-answer" else "up", min_bytes=CUT_BYTES, spare=self.own_port)
            self.produce_big(int(seconds * 1000))
            wait_until(lambda: p._cut is None, 60, "a connection to be cut")
        elif kind == "slow":
            # slower than the request timeout (a tenth of task_timeout, at least 2 s): requests
            # time out while the broker still answers, late
            p.delay(3.0)
            time.sleep(seconds)
        elif kind == "restart":
            self.restart_broker(seconds)
        p.heal()

    # -- the checks ------------------------------------------------------------------------------
    def settle(self, timeout=180):
        from statekit.runtime.lifecycle import AppState

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.app.state != AppState.ERROR, self.app.error
            if self.app.process_all_available(timeout=60) and \
                    self.app.wait_for_state(AppState.RUNNING, 5) == AppState.RUNNING:
                return
        raise AssertionError(f"the app did not settle: {self.app.state} {self.app.waiting}")

    def check_exact(self):
        """Stores equal the references; each sink, read committed, has every count once."""
        k = self.kafka
        assert store_as_dict(self.app, "counts") == wordcount_reference(k)
        assert store_as_dict(self.app, "clicks-per-window") == windowed_reference(k)
        regions = collections.Counter(region_of(kk.decode()) for _p, _o, _t, kk, _v in
                                      read_topic(k, "clicks"))
        assert store_as_dict(self.app, "per-region") == dict(regions)
        for topic, want in (("counts-out", wordcount_reference(k)), ("region-out", dict(regions))):
            out = sink_values(k, topic)
            dup = {key: v for key, v in out.items() if any(b <= a for a, b in zip(v, v[1:]))}
            assert not dup, f"{topic}: a count written twice (or out of order): {dup}"
            assert {key: v[-1] for key, v in out.items()} == want, topic

    def close(self):
        try:
            if self.app is not None:
                self.app.stop()
        finally:
            self.kafka.close()
            if self.proxy is not None:
                self.proxy.close()
            self.broker.stop()


def sink_values(kafka, topic) -> dict:
    out: dict = {}
    for p, end in sorted(kafka.end_offsets(topic, None, "read_committed").items()):
        for chunk in kafka.read(topic, p, None, end, isolation="read_committed"):
            for _o, _ts, key, v, _h in chunk.records:
                out.setdefault(key.decode(), []).append(struct.unpack(">q", v)[0])
    return out


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()


def waits_seen(app, since: float) -> list:
    return [e for e in app.events(since=since) if e.type in ("task_waiting", "kafka_unavailable")]


def test_every_kind_of_outage_is_ridden_out(env):
    """Each kind of fault in turn, with records in flight, and one instance crashing during an
    outage: WAITING, back by itself, exact in the end; the events say who waited."""
    from statekit.runtime.lifecycle import AppState

    env.start()
    aborted = 0
    for i, kind in enumerate(KINDS):
        t0 = time.time()
        env.produce(i)
        n_states = len(env.states)
        if kind == "reset":   # an instance dies while Kafka is away: its tasks wait elsewhere
            env.app.crash("process", instance=1, point="records", after_records=1)
        # a fault the app can only see by a request outliving its 2 s timeout (a blackhole, a slow
        # broker) is seen up to 3 s after it begins (the probe asks once a second): it lasts twice
        # that, or whether the app saw it is a matter of chance on a busy machine (CI, twice). A
        # broker that is down is seen by the first probe while it is: the probe asks every 3 s
        # once the app idles (PROBE_IDLE_S), so it stays down longer than that (1.5 s went unseen
        # once in CI: no request failed, nothing waited, and the app rode it out unseen)
        env.outage(kind, {"blackhole": 6.0, "slow": 8.0, "restart": 3.5}.get(kind, 2.0))
        env.produce(i + len(KINDS))
        env.settle()
        try:
            wait_until(lambda: waits_seen(env.app, t0), 90, f"the events of the {kind} outage")
        except AssertionError as e:   # what the app did see, for the next one to read
            w = env.app._outage
            raise AssertionError(f"{e}; states {env.states[n_states:]}; events "
                                 f"{[x.type for x in env.app.events(since=t0)][:40]}; outages "
                                 f"{w.outages[-3:] if w else None}") from None
        if kind not in CUTS:   # (a cut task may be back before the App's next look)
            assert "WAITING" in env.states[n_states:], (kind, env.states)
            back = env.app.wait_for_event(lambda e: e.type == "kafka_available" and e.ts >= t0, 30)
            assert back is not None and back.seconds > 0, kind
            # a task that moved while it waited (the crashed instance's, or one a rebalance after a
            # revive took) reopens elsewhere after a restore: its abort is told by the outage's
            # event, not by a task_resumed
            if not any(e.type == "rebalance" for e in env.app.events(since=t0)):
                aborted += back.aborted
        if env.app.pending_crash is not None:
            env.app.cancel_crash()
        if any(m.status == "dead" for m in env.app._coordinator.members.values()):
            env.app.revive(1)
    assert env.app.state == AppState.RUNNING and env.app.error is None
    env.check_exact()
    assert env.app.restarts == []
    # the transactions that were open when Kafka went away were aborted, and said so
    resumed = [e for e in env.app.events() if e.type == "task_resumed"]
    assert resumed and sum(e.aborted for e in resumed) >= aborted


def test_past_the_task_timeout_the_app_fails_in_one_line_and_restart_works(tmp_path):
    from statekit.errors import KafkaTimeout
    from statekit.runtime.lifecycle import AppState

    env = Env(tmp_path, task_timeout=3.0, instances=1)
    try:
        env.start()
        env.produce(0)
        env.proxy.blackhole()
        assert env.app.wait_for_state(AppState.ERROR, 60) == AppState.ERROR, env.app.state
        err = env.app.error
        assert isinstance(err, KafkaTimeout), repr(err)
        line = str(err)
        assert "\n" not in line and "task_timeout=3 s" in line and env.proxy.bootstrap in line, line
        env.proxy.heal()
        env.app.restart()
        env.produce(1)
        env.settle()
        env.check_exact()
    finally:
        env.close()


def test_the_app_says_waiting_while_its_coordinator_waits_on_kafka(tmp_path):
    """The coordinator's loop holds its lock over Kafka requests (a probing rebalance reads the
    changelogs' ends, each request up to its timeout): the App's monitor must not wait for that
    lock, or the App says RUNNING through the outage (seen in CI: no event of a slow broker)."""
    from statekit.runtime.lifecycle import AppState

    env = Env(tmp_path, instances=1)
    try:
        env.start()
        assert env.app.state == AppState.RUNNING
        with env.app._coordinator._lock:   # the loop, stuck on Kafka
            env.proxy.blackhole()
            got = env.app.wait_for_state(AppState.WAITING, 30)
            assert got == AppState.WAITING, (got, env.states)
            assert env.app.waiting is not None and env.bootstrap in str(env.app.waiting)
            # the dashboard's task table answers meanwhile (from another thread, as the dashboard's
            # poll does), from the last reports
            import threading
            got: list = []
            asker = threading.Thread(target=lambda: got.append(env.app.task_status()), daemon=True)
            asker.start()
            asker.join(5)
            assert got, "the task table waited for the coordinator's lock"
            rows, last = got[0], env.app._coordinator.last_statuses()
            assert rows and sorted(rows) == sorted(t for st in last.values() for t in st.get("tasks") or {})
        env.proxy.heal()
        env.produce(0)
        env.settle()
        env.check_exact()
    finally:
        env.close()


@pytest.mark.slow   # (40 s on a busy machine: two outages, waited out)
def test_the_app_freezes_and_restarts_its_own_broker_and_rides_both_out(tmp_path):
    """``App.pause_kafka`` / ``App.restart_kafka`` (what notebook 16 does with `%statekit broker`)
    act on the broker the app uses; it waits (the request timeout is 2 s, the freeze 5 s), comes
    back by itself, and ends exact."""
    env = Env(tmp_path, proxy=False)
    try:
        env.start()
        for i, (what, act) in enumerate((("pause", lambda: env.app.pause_kafka(5.0)),
                                         ("restart", lambda: env.app.restart_kafka(down=1.0)))):
            t0, n_states = time.time(), len(env.states)
            env.produce(i)
            done = act()
            if what == "pause":
                assert done["bootstrap"] == env.bootstrap and done["until"] - done["since"] == pytest.approx(5.0)
            else:
                old_pid, env.broker = env.broker.pid, done
                assert done.bootstrap == env.bootstrap and done.pid != old_pid
            env.produce(i + 2)
            env.settle()
            assert wait_until(lambda: waits_seen(env.app, t0), 30, f"the events of the {what}")
            assert "WAITING" in env.states[n_states:], (what, env.states)
        env.check_exact()
        assert env.app.restarts == []
    finally:
        env.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_one_kind_of_outage_during_a_crash_point(kind, tmp_path):
    """Each kind alone, with a crash directive armed at a commit point of the same batch."""
    env = Env(tmp_path, seed=KINDS.index(kind))
    try:
        env.start()
        point = ["before_send", "before_commit", "after_ack", "after_rocksdb", "records",
                 "mid_restore"][KINDS.index(kind)]
        env.app.crash("process", instance=0, point=point, after_records=1 if point != "mid_restore" else None)
        env.produce(0)
        env.outage(kind, 4.0)
        env.produce(1)
        if env.app.pending_crash is not None:
            env.app.cancel_crash()
        env.settle()
        if any(m.status == "dead" for m in env.app._coordinator.members.values()):
            env.app.revive(0)
            env.settle()
        env.check_exact()
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.spark
def test_outages_on_spark(tmp_path, spark_session):
    """The Spark engine: its source waits through the outages (the Python data source's
    latestOffset), the instances as on the local engine."""
    env = Env(tmp_path, engine="changelog")
    try:
        env.start()
        for i, kind in enumerate(("blackhole", "restart", "cut-request")):
            t0 = time.time()
            env.produce(i)
            env.outage(kind, 3.0)
            env.produce(i + 3)
            env.settle()
            assert wait_until(lambda: waits_seen(env.app, t0), 90, f"the events of the {kind} outage")
        env.check_exact()
        assert env.app.restarts == []
    finally:
        env.close()


OUTAGE = st.tuples(st.sampled_from(KINDS), st.floats(0.5, 4.0), st.integers(0, 3))
POINTS = st.sampled_from([None, "records", "before_send", "before_commit", "after_ack",
                          "after_rocksdb", "mid_restore"])


def _property(tmp_path_factory, schedule, point, seed):
    """A schedule of outages (kind, length, how many chunks are produced before it), one crash
    directive (at ``point``, armed before the first outage), then the checks."""
    import shutil

    d = tmp_path_factory.mktemp("outage")
    env = Env(d, seed=seed)
    try:
        env.start()
        if point is not None:
            env.app.crash(random.Random(seed).choice(["process", "disk-loss"]),
                          instance=seed % 2, point=point,
                          after_records=None if point == "mid_restore" else 1 + seed % 5)
        i = 0
        for kind, seconds, before in schedule:
            for _ in range(before):
                env.produce(i)
                i += 1
                time.sleep(0.05)
            env.outage(kind, seconds)
        env.produce(i)
        if env.app.pending_crash is not None:
            env.app.cancel_crash()
        env.settle()
        dead = [m for m, mem in env.app._coordinator.members.items() if mem.status == "dead"]
        for m in dead:
            env.app.revive(m)
        if dead:
            env.settle()
        env.check_exact()
        assert env.app.restarts == []
    finally:
        env.close()
        shutil.rmtree(d, ignore_errors=True)


@settings(max_examples=1, deadline=None)
@given(schedule=st.lists(OUTAGE, min_size=1, max_size=1), point=POINTS, seed=st.integers(0, 999))
def test_random_outages_over_random_crash_points(tmp_path_factory, schedule, point, seed):
    _property(tmp_path_factory, schedule, point, seed)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("STATEKIT_OUTAGE_EXAMPLES", "12")), deadline=None)
@given(schedule=st.lists(OUTAGE, min_size=1, max_size=4), point=POINTS, seed=st.integers(0, 999))
def test_random_outages_over_random_crash_points_slow(tmp_path_factory, schedule, point, seed):
    _property(tmp_path_factory, schedule, point, seed)
