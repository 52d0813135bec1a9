"""Events (the typed contract and its transport), the memory sink's encoding, the worker spec."""
from __future__ import annotations

import pickle
import time

from statekit import events as ev
from statekit.contracts import events_topic
from statekit.event_bus import EventPublisher, EventReader
from waiting import wait_until


def test_publish_and_read_typed_events(broker):
    reader = EventReader(broker.bootstrap, "evapp")
    got = []
    try:
        reader.subscribe(got.append)
        pub = EventPublisher(broker.bootstrap, "evapp", {"instance": 3})
        assert pub.publish(ev.Committed(task="0_1", batch=4, records=5))
        assert pub.publish_many([ev.RestoreStarted(task="0_1", store="s", to_replay=7),
                                 ev.RestoreEnded(task="0_1", store="s", restored=7, seconds=0.5)])
        e = reader.wait_for(lambda e: e.type == "restore_end", timeout=10)
        assert isinstance(e, ev.RestoreEnded) and e.restored == 7 and e.seconds == 0.5
        evs = reader.events()
        assert [type(e) for e in evs] == [ev.Committed, ev.RestoreStarted, ev.RestoreEnded]
        assert all(e.app == "evapp" and e.instance == 3 and e.ts > 0 and e.pid > 0 for e in evs)
        assert evs[0].records == 5 and evs[0].batch == 4 and evs[1].to_replay == 7
        assert [e.offset for e in reader.events(since=evs[0].offset)] == [evs[1].offset, evs[2].offset]
        assert [e.type for e in reader.events(types="commit")] == ["commit"]
        assert reader.events(since_ts=time.time() + 60) == []
        wait_until(lambda: len(got) >= 3, 5, "three events pushed to the callback")
        assert [e.type for e in got] == ["commit", "restore_start", "restore_end"]
        assert [e.type for e in reader.poll(0.1)] == ["commit", "restore_start", "restore_end"]
        assert reader.poll(0.1) == []
        from statekit.kafka import Kafka

        with Kafka(broker.bootstrap) as k:
            assert k.topics()[events_topic("evapp")] == 1
            assert k.describe_configs(events_topic("evapp")).get("cleanup.policy") == "delete"
    finally:
        reader.close()
    assert not reader.running


def test_a_quiet_reader_long_polls_and_stop_does_not_wait_the_poll_out(broker, monkeypatch):
    """A quiet app's reader asks every QUIET_POLL_MS; an event still arrives at once, and stop()
    ends the poll in flight rather than waiting for it (and counts no error)."""
    from statekit import event_bus

    monkeypatch.setattr(event_bus, "QUIET_S", 0.0)        # quiet from the first ask
    monkeypatch.setattr(event_bus, "QUIET_POLL_MS", 30_000)
    reader = EventReader(broker.bootstrap, "evquiet")
    try:
        time.sleep(0.5)                                   # the 30 s poll is in flight
        pub = EventPublisher(broker.bootstrap, "evquiet", {"instance": 0})
        t0 = time.monotonic()
        assert pub.publish(ev.Committed(task="0_0", batch=1, records=2))
        e = reader.wait_for(lambda e: e.type == "commit", timeout=10)
        assert e is not None and e.records == 2 and time.monotonic() - t0 < 10
        time.sleep(0.5)                                   # the next 30 s poll is in flight
    finally:
        t1 = time.monotonic()
        reader.stop(timeout=10)
    assert not reader._thread.is_alive() and time.monotonic() - t1 < 10
    assert reader.errors == 0, reader.last_error


def test_unknown_type_and_unknown_fields_survive(broker):
    EventPublisher(broker.bootstrap, "evb").publish({"type": "from_the_future", "x": 1})
    EventPublisher(broker.bootstrap, "evb").publish({"type": "commit", "task": "0_0", "newfield": 2})
    with EventReader(broker.bootstrap, "evb", start="beginning") as r:
        e = r.wait_for(lambda e: e.type == "commit", timeout=10)
        assert e is not None and e.extra == {"newfield": 2} and e.get("newfield") == 2
        assert e.to_dict()["newfield"] == 2
        old = r.events()[0]
        assert type(old) is ev.Event and old.get("x") == 1 and old.extra["type"] == "from_the_future"


def test_every_event_round_trips_through_its_dict():
    for cls in ev.EVENT_TYPES.values():
        e = cls(app="a", ts=1.5, pid=7, generation=3)
        back = ev.from_dict(e.to_dict())
        assert type(back) is cls and back.to_dict() == e.to_dict()


def test_publisher_never_raises_without_broker():
    """A broker that is away: the events are held for it in order (sent once it is back), the
    publisher returns at once and never raises."""
    from statekit import event_bus

    pub = EventPublisher("127.0.0.1:1", "nobroker")
    try:
        t = time.time()
        assert pub.publish(ev.Committed()) is False
        assert event_bus.held("127.0.0.1:1") == 1 and pub.dropped == 0 and time.time() - t < 30
        t = time.time()
        assert pub.publish(ev.Committed()) is False      # backing off: no new connection attempt
        assert event_bus.held("127.0.0.1:1") == 2 and time.time() - t < 0.5
    finally:
        event_bus.close_clients()                        # what is held is dropped with them
    assert event_bus.held("127.0.0.1:1") == 0


def test_memory_sink_encoding_roundtrip(tmp_path):
    from statekit.worker.output import decode, encode, read_outputs, write_outputs

    outs = [("t", b"k", b"v"), ("topic-2", None, b""), ("t", b"", None), ("é", b"x" * 300_000, b"y")]
    assert decode(encode(outs)) == outs
    assert encode([]) == b""
    write_outputs(str(tmp_path / "0_1"), 3, outs[:2])
    write_outputs(str(tmp_path / "0_0"), 3, outs[2:])
    write_outputs(str(tmp_path / "0_0"), 3, outs[2:])       # a replay rewrites the same file
    write_outputs(str(tmp_path / "0_1"), 1, [("t", b"a", b"b")])
    assert read_outputs(str(tmp_path)) == (
        [(1, "0_1", "t", b"a", b"b")] + [(3, "0_0") + o for o in outs[2:]] + [(3, "0_1") + o for o in outs[:2]])


def test_worker_spec_pickles_with_user_functions():
    from pyspark import cloudpickle

    from statekit.topology import TopologyBuilder
    from statekit.worker.task import WorkerSpec, store_specs

    b = TopologyBuilder()
    b.stream("a").map_values(lambda v: v + "!").group_by_key().count(store="c")
    spec = WorkerSpec(application="x", bootstrap="h:1", plans={0: b.compile()}, partitions=4,
                      control_dir="/ctl", cache_bytes=123)
    spec2 = pickle.loads(cloudpickle.dumps(spec))
    assert spec2.plan(0).store_names == ["c"] and spec2.cache_bytes == 123
    assert [s.name for s in store_specs(spec2.plan(0), 0)] == ["c"]
    import pytest
    from statekit.errors import StatekitError

    with pytest.raises(StatekitError, match="no sub-topology 2"):
        spec.plan(2)
