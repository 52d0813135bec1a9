"""Events (publisher/reader) and the task runner's spec handling."""
from __future__ import annotations

import pickle
import time

from statekit.runtime.events import EventPublisher, EventReader, events_topic
from statekit.runtime.task_runner import (TaskRunSpec, as_task_spec, decode_outputs, encode_outputs)


def test_publish_and_read_subscribe_since(broker):
    reader = EventReader(broker.bootstrap, "evapp")
    got = []
    try:
        reader.subscribe(got.append)
        pub = EventPublisher(broker.bootstrap, "evapp", {"task": 3})
        assert pub.publish({"type": "commit", "records": 5})
        assert pub.publish_many([{"type": "restore_start", "store": "s"}, {"type": "restore_end"}])
        ev = reader.wait_for(lambda e: e["type"] == "restore_end", timeout=10)
        assert ev is not None
        evs = reader.events()
        assert [e["type"] for e in evs] == ["commit", "restore_start", "restore_end"]
        assert all(e["app"] == "evapp" and e["task"] == 3 and "ts" in e and "pid" in e for e in evs)
        assert [e["offset"] for e in reader.events(since=evs[0]["offset"])] == [evs[1]["offset"], evs[2]["offset"]]
        assert [e["type"] for e in reader.events(types="commit")] == ["commit"]
        assert reader.events(since_ts=time.time() + 60) == []
        deadline = time.time() + 5
        while len(got) < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert [e["type"] for e in got] == ["commit", "restore_start", "restore_end"]
        assert [e["type"] for e in reader.poll(0.1)] == ["commit", "restore_start", "restore_end"]
        assert reader.poll(0.1) == []
        from statekit.kafka import Kafka

        with Kafka(broker.bootstrap) as k:
            assert k.topics()[events_topic("evapp")] == 1
            assert k.describe_configs(events_topic("evapp")).get("cleanup.policy") == "delete"
    finally:
        reader.close()
    assert not reader.running


def test_reader_from_beginning(broker):
    EventPublisher(broker.bootstrap, "evb").publish({"type": "x"})
    with EventReader(broker.bootstrap, "evb", start="beginning") as r:
        assert r.wait_for(lambda e: e["type"] == "x", timeout=10) is not None


def test_publisher_never_raises_without_broker():
    pub = EventPublisher("127.0.0.1:1", "nobroker")
    t = time.time()
    assert pub.publish({"type": "commit"}) is False
    assert pub.dropped == 1 and time.time() - t < 30
    t = time.time()
    assert pub.publish({"type": "commit"}) is False      # backing off: no new connection attempt
    assert pub.dropped == 2 and time.time() - t < 0.5


def test_outbox_encoding_roundtrip():
    outs = [("t", b"k", b"v"), ("topic-2", None, b""), ("t", b"", None), ("é", b"x" * 300_000, b"y")]
    chunks = encode_outputs(outs)
    assert len(chunks) == 2          # the big record starts a chunk of its own
    assert [o for c in chunks for o in decode_outputs(c)] == outs
    assert encode_outputs([]) == []


def test_task_run_spec_from_run_spec_and_pickle():
    from statekit.engine.spec import RunSpec
    from statekit.topology import TopologyBuilder

    b = TopologyBuilder()
    b.stream("a").group_by_key().count(store="c")
    run = RunSpec(app="x", bootstrap="h:1", plan=b.compile(), partitions=4, checkpoint_dir="/ck",
                  control_dir="/ctl", state_dirs={0: "/s0", 1: "/s1"}, task_instances={0: 0, 1: 1},
                  cache_bytes=123, extra={"generation": 2})
    spec = as_task_spec(run)
    assert isinstance(spec, TaskRunSpec)
    assert (spec.application, spec.partitions, spec.cache_bytes, spec.control_dir) == ("x", 4, 123, "/ctl")
    assert spec.state_dir_for(1) == "/s1" and spec.instance_for(1) == 1 and spec.extra["generation"] == 2
    from pyspark import cloudpickle

    spec2 = pickle.loads(cloudpickle.dumps(spec))
    assert spec2.plan.store_names == ["c"] and spec2.state_dirs == {0: "/s0", 1: "/s1"}
    import pytest
    from statekit.errors import StatekitError

    with pytest.raises(StatekitError, match="no state directory"):
        spec.state_dir_for(3)
