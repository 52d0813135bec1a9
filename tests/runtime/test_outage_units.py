"""The parts of riding out an outage, one at a time: which errors are retried, the backoff, the
give-up line, the events publisher holding events for a broker that is away, and the App's watch
folding its probe and the instances' reports into one outage."""
from __future__ import annotations

import time

import pytest

from statekit import events as ev
from statekit.errors import BrokerUnreachable, KafkaTimeout, KafkaUnavailable, StatekitError
from statekit.kafka.errors import KafkaBusy, KafkaError, ProducerFenced
from statekit.kafka.retry import Backoff, request_timeout_for, retriable, retrying
from statekit.runtime.outage import KafkaWatch, Wait


def test_what_is_retried():
    assert retriable(KafkaUnavailable("Kafka at x closed the connection"))
    assert retriable(KafkaBusy("kept answering"))
    assert retriable(KafkaError("NOT_COORDINATOR", 16)) and retriable(KafkaError("timed out", 7))
    assert not retriable(ProducerFenced("fenced", 47))
    assert not retriable(KafkaError("CORRUPT_MESSAGE", 2))
    assert not retriable(BrokerUnreachable("TLS handshake failed"))   # a setting, not an outage
    assert not retriable(StatekitError("no"))
    assert [request_timeout_for(t) for t in (3, 60, 300, 3000)] == [2.0, 6.0, 30.0, 30.0]


def test_backoff_doubles_to_its_cap_with_jitter():
    b = Backoff(first=0.1, cap=1.0)
    d = [b.next() for _ in range(7)]
    for got, want in zip(d, [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]):
        assert want * 0.8 <= got <= want * 1.2
    b.reset()
    assert b.next() <= 0.12
    b.attempts = 5000          # a thread that retried for hours still waits the cap, no overflow
    assert b.next() <= 1.2


def test_retrying_rides_out_failures_then_gives_up_in_one_line():
    calls = []

    def flaky():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise KafkaUnavailable("Kafka at h:1 closed the connection")
        return "ok"

    failures = []
    assert retrying(flaky, timeout=10, what="the test", bootstrap="h:1",
                    on_failure=lambda: failures.append(1)) == "ok"
    assert len(calls) == 3 and len(failures) == 2
    with pytest.raises(KafkaError, match="CORRUPT"):    # not retried
        retrying(lambda: (_ for _ in ()).throw(KafkaError("CORRUPT_MESSAGE", 2)), timeout=10,
                 what="x", bootstrap="h:1")
    t0 = time.monotonic()
    with pytest.raises(KafkaTimeout) as info:
        retrying(lambda: (_ for _ in ()).throw(KafkaUnavailable("refused")), timeout=0.5,
                 what="query q", bootstrap="h:1")
    assert 0.5 <= time.monotonic() - t0 < 3
    line = str(info.value)
    assert "\n" not in line and line.startswith("query q waited") and "task_timeout=0.5 s" in line \
        and "Kafka at h:1" in line and "restart()" in line


def test_the_publisher_holds_events_while_kafka_is_away_and_sends_them_in_order(tmp_path):
    from statekit import broker as broker_mod
    from statekit import event_bus
    from statekit.kafka import Kafka

    h = broker_mod.start(dir=str(tmp_path / "b"), port=0)
    port = int(h.bootstrap.rsplit(":", 1)[1])
    pub = event_bus.EventPublisher(h.bootstrap, "held")
    try:
        assert pub.publish(ev.TaskWaiting(task="0_0", instance=0, batch=1))
        h.kill()
        for i in range(5):
            assert not pub.publish(ev.TaskWaiting(task="0_0", instance=0, batch=10 + i))   # held
        assert event_bus.held(h.bootstrap) == 5
        h = broker_mod.start(dir=str(tmp_path / "b"), port=port)
        pub.publish(ev.TaskResumed(task="0_0", instance=0))     # after the held ones
        deadline = time.monotonic() + 30
        while event_bus.held(h.bootstrap) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert event_bus.held(h.bootstrap) == 0
        reader = event_bus.EventReader(h.bootstrap, "held", start="beginning")
        try:
            deadline = time.monotonic() + 30
            while len(reader.events()) < 7 and time.monotonic() < deadline:
                time.sleep(0.05)
            got = [(e.type, e.get("batch")) for e in reader.events()]
        finally:
            reader.close()
        assert got[:6] == [("task_waiting", b) for b in (1, 10, 11, 12, 13, 14)]
        assert got[6][0] == "task_resumed" and len(got) == 7
    finally:
        event_bus.close_clients()
        h.stop()


def test_the_watch_folds_probe_and_instances_into_one_outage():
    published = []
    w = KafkaWatch("h:1", "t-events", 2.0, published.append)   # (its probe thread not started)
    calm = {0: {"pid": 11, "aborted": 1, "tasks": {"0_0": {"state": "running"}}}}
    assert w.update(calm) is None and not published
    now = time.time()
    waiting = {0: {"pid": 11, "aborted": 3, "tasks": {
        "0_0": {"state": "waiting", "waiting_since": now - 4}, "0_1": {"state": "running"}}}}
    got = w.update(waiting)
    assert isinstance(got, Wait) and got.tasks == ["0_0"] and got.aborted == 2   # 3 - 1 before
    assert abs(got.since - (now - 4)) < 0.01
    assert str(got).startswith("waiting for Kafka at h:1 since 4 s; 2 transactions aborted; "
                               "tasks waiting: 0_0")
    assert [type(e) for e in published] == [ev.KafkaUnavailable]
    w.probe_error = "refused"          # the tasks reopened, the probe still fails: still away
    assert w.update({0: {"pid": 11, "aborted": 3, "tasks": {}}}) is got
    w.probe_error = None
    assert w.update({0: {"pid": 11, "aborted": 3, "tasks": {}}}) is None
    back = published[-1]
    assert isinstance(back, ev.KafkaAvailable) and back.aborted == 2 and back.tasks_waited == ["0_0"]
    assert w.outages[-1]["aborted"] == 2


def test_an_outage_right_after_another_begins_after_it_ended():
    """The last answer Kafka gave can predate the end of the outage just over (the probe asks once
    a second); the next outage still begins after it, so outages never overlap."""
    published = []
    w = KafkaWatch("h:1", "t-events", 2.0, published.append)
    w.last_ok = time.time() - 5
    w.probe_error = "refused"
    first = w.update({})
    w.probe_error = None
    assert w.update({}) is None
    ended = first.since + w.outages[-1]["seconds"]
    w.probe_error = "refused"          # killed again before the probe's next answer
    second = w.update({})
    assert second is not first and second.since == ended and w.last_ok < ended
    assert [type(e) for e in published] == [ev.KafkaUnavailable, ev.KafkaAvailable, ev.KafkaUnavailable]
    assert published[-1].since == ended
