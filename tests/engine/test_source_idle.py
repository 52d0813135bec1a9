"""An idle streaming source asks the broker as little as a record's latency allows: one long poll
per ask while nothing arrives, the ends asked for only when data came or every ENDS_REFRESH_S,
and Spark's progress ends (``reportLatestOffset``) the ones the last ask found."""
from __future__ import annotations

from statekit.engine.spark import source as src


class Counting:
    """The source's Kafka client, with each request kind counted."""

    def __init__(self, kafka):
        self.kafka = kafka
        self.asks = {"end_offsets": 0, "begin_offsets": 0, "wait_for_data": 0}

    def __getattr__(self, name):
        fn = getattr(self.kafka, name)
        if name not in self.asks:
            return fn

        def counted(*a, **kw):
            self.asks[name] += 1
            return fn(*a, **kw)
        return counted


def _reader(handle, client, topic):
    client.ensure_topic(topic, 2)
    r = src.KafkaStreamReader(src._Options({"bootstrap": handle.bootstrap, "topic": topic}), None)
    r.IDLE_WAIT_MS = r.LONG_IDLE_WAIT_MS = 50
    counting = Counting(r._client())
    r._kafka = counting
    return r, counting


def test_an_idle_ask_is_one_long_poll_and_a_record_ends_it(kafka_broker):
    handle, client = kafka_broker
    r, c = _reader(handle, client, "idle-asks")
    start = r.initialOffset()
    assert src.from_json(start) == {("idle-asks", 0): 0, ("idle-asks", 1): 0}
    c.asks = dict.fromkeys(c.asks, 0)

    first = r.latestOffset(start)                 # the ends, then the long poll
    assert src.from_json(first) == {("idle-asks", 0): 0, ("idle-asks", 1): 0}
    assert c.asks == {"end_offsets": 1, "begin_offsets": 0, "wait_for_data": 1}
    for _ in range(4):                            # nothing new: a long poll each, nothing else
        assert r.latestOffset(first) == first
        assert r.reportLatestOffset() == first
    assert c.asks == {"end_offsets": 1, "begin_offsets": 0, "wait_for_data": 5}

    client.send("idle-asks", 1, [(b"k", b"v"), (b"k", b"w")])
    nxt = r.latestOffset(first)                   # the poll finds them; the ends are asked again
    assert src.from_json(nxt) == {("idle-asks", 0): 0, ("idle-asks", 1): 2}
    assert r.reportLatestOffset() == nxt
    assert c.asks == {"end_offsets": 2, "begin_offsets": 0, "wait_for_data": 6}

    assert r.latestOffset(nxt) == nxt             # new offsets: the ends first, then the poll
    assert c.asks == {"end_offsets": 3, "begin_offsets": 0, "wait_for_data": 7}
    assert r.latestOffset(nxt) == nxt
    assert c.asks == {"end_offsets": 3, "begin_offsets": 0, "wait_for_data": 8}


def test_an_idle_source_asks_for_the_ends_again_every_refresh_and_sees_a_new_partition(
        kafka_broker, monkeypatch):
    from kafka.admin import KafkaAdminClient, NewPartitions

    handle, client = kafka_broker
    r, c = _reader(handle, client, "idle-grows")
    start = r.latestOffset(r.initialOffset())
    assert r.latestOffset(start) == start
    admin = KafkaAdminClient(bootstrap_servers=handle.bootstrap)
    try:
        admin.create_partitions({"idle-grows": NewPartitions(total_count=3)})
    finally:
        admin.close()
    asked = c.asks["end_offsets"]
    assert r.latestOffset(start) == start         # within the refresh: the poll alone
    assert c.asks["end_offsets"] == asked

    monkeypatch.setattr(src.KafkaStreamReader, "ENDS_REFRESH_S", 0.0)
    got = src.from_json(r.latestOffset(start))    # the refresh: the third partition, from 0
    assert got == {("idle-grows", 0): 0, ("idle-grows", 1): 0, ("idle-grows", 2): 0}
    assert c.asks["end_offsets"] == asked + 1
