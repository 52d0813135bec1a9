"""Consumer groups over the network against the embedded broker: kafka-python, confluent-kafka
(librdkafka) and kcat. Every wait is a poll with a deadline; every assertion is exact."""
from __future__ import annotations

import concurrent.futures
import queue
import shutil
import subprocess
import threading
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata

from waiting import wait_until

DEADLINE_S = 60


def create_topic(bootstrap, name, partitions):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()


def produce(bootstrap, topic, per_partition, partitions):
    """per_partition records on each partition, value b"p{p}-{i}"; returns {(p, offset): value}."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        futures = [(p, i, producer.send(topic, value=b"p%d-%d" % (p, i), key=b"k%d" % i, partition=p))
                   for p in range(partitions) for i in range(per_partition)]
        producer.flush()
        out = {}
        for p, i, f in futures:
            md = f.get(timeout=30)
            assert (md.partition, md.offset) == (p, i)
            out[(p, i)] = b"p%d-%d" % (p, i)
        return out
    finally:
        producer.close()


class Worker:
    """One KafkaConsumer polled by its own thread (a group member must keep polling for a
    rebalance to complete); other calls run in that thread via `call`."""

    def __init__(self, name, bootstrap, group, topic, **cfg):
        self.name = name
        self.records = {}  # (partition, offset) -> value, as received
        self.dupes = []
        self.assignments = []  # every assignment seen, in order
        self._cmds: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.error = None
        settings = dict(bootstrap_servers=bootstrap, group_id=group, client_id=name,
                        enable_auto_commit=False, auto_offset_reset="earliest",
                        session_timeout_ms=6000, heartbeat_interval_ms=300,
                        max_poll_interval_ms=30000, fetch_max_wait_ms=100)
        settings.update(cfg)
        self.consumer = KafkaConsumer(**settings)
        self.consumer.subscribe([topic])
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while not self._stop.is_set():
                # a poll long enough for a JoinGroup/SyncGroup round to finish inside it:
                # kafka-python 3.0 can lose a join that completes while no poll awaits it (the
                # member keeps its old generation and never heartbeats again, so the coordinator
                # rightly expires it), which a loaded machine made a matter of chance
                batch = self.consumer.poll(timeout_ms=500)
                for tp, recs in batch.items():
                    for r in recs:
                        key = (tp.partition, r.offset)
                        if key in self.records:
                            self.dupes.append(key)
                        self.records[key] = r.value
                assigned = frozenset(tp.partition for tp in self.consumer.assignment())
                if not self.assignments or self.assignments[-1] != assigned:
                    self.assignments.append(assigned)
                while True:
                    try:
                        fn, fut = self._cmds.get_nowait()
                    except queue.Empty:
                        break
                    try:
                        fut.set_result(fn(self.consumer))
                    except BaseException as e:  # noqa: BLE001 - handed to the caller
                        fut.set_exception(e)
        except BaseException as e:  # noqa: BLE001
            self.error = e
            raise

    def call(self, fn, timeout=30):
        fut = concurrent.futures.Future()
        self._cmds.put((fn, fut))
        return fut.result(timeout)

    def assigned(self):
        return self.assignments[-1] if self.assignments else frozenset()

    def close(self):
        """consumer.close() (LeaveGroup) in the polling thread, then stop it."""
        if self.thread.is_alive():
            def close(c):
                self._stop.set()
                c.close()
            try:
                self.call(close, timeout=30)
            finally:
                self._stop.set()
                self.thread.join(30)
        else:
            self.consumer.close()


def positions(worker, topic, partitions):
    return worker.call(lambda c: {p: c.position(TopicPartition(topic, p)) for p in partitions})


def test_kafka_python_group_of_two_rebalances_and_honours_commits(broker):
    topic, group, n = "orders", "billing", 40
    create_topic(broker.bootstrap, topic, 4)
    produced = produce(broker.bootstrap, topic, n, 4)
    w1 = Worker("w1", broker.bootstrap, group, topic)
    w2 = Worker("w2", broker.bootstrap, group, topic)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        # both members get 2 of the 4 partitions
        wait_until(lambda: len(w1.assigned()) == 2 and len(w2.assigned()) == 2
                   and not (w1.assigned() & w2.assigned()), DEADLINE_S, "a 2 + 2 assignment")
        p1, p2 = sorted(w1.assigned()), sorted(w2.assigned())
        assert sorted(p1 + p2) == [0, 1, 2, 3]
        # each consumes its partitions to the end (positions exactly at n)
        wait_until(lambda: positions(w1, topic, p1) == {p: n for p in p1}
                   and positions(w2, topic, p2) == {p: n for p in p2}, DEADLINE_S,
                   "both members at the end")
        assert w1.assigned() == frozenset(p1) and w2.assigned() == frozenset(p2)  # still stable

        # the group as the admin API sees it
        desc = admin.describe_groups([group])[group]
        assert (desc["group_state"], desc["protocol_type"]) == ("Stable", "consumer")
        assert sorted(m["client_id"] for m in desc["members"]) == ["w1", "w2"]
        listed = admin.list_groups()
        assert [g["group_id"] for g in listed] == [group]

        # commit explicit positions (not the consumed end) so the takeover is observable
        committed = {p: 5 + 7 * p for p in range(4)}
        w1.call(lambda c: c.commit({TopicPartition(topic, p): OffsetAndMetadata(committed[p], "w1", -1)
                                    for p in p1}))
        w2.call(lambda c: c.commit({TopicPartition(topic, p): OffsetAndMetadata(committed[p], "w2", -1)
                                    for p in p2}))
        offsets = admin.list_group_offsets(group)[group]
        assert {tp.partition: (om.offset, om.metadata) for tp, om in offsets.items()
                if tp.topic == topic} == {p: (o, "w1" if p in p1 else "w2") for p, o in committed.items()}

        w2.call(lambda c: w2.records.clear())
        w2.dupes.clear()
        # w1 leaves: w2 rebalances to own all 4. It resumes w1's partitions exactly at w1's
        # commits; the partitions it keeps keep their positions (kafka-python, like the Java
        # client, does not reset a retained partition), so nothing of those is read again.
        w1.close()
        wait_until(lambda: w2.assigned() == frozenset(range(4)), DEADLINE_S,
                   "w2 owning all 4 partitions")
        assert [a for a in w2.assignments if a][-2:] == [frozenset(p2), frozenset(range(4))]
        expected = {(p, o): produced[(p, o)] for p in p1 for o in range(committed[p], n)}
        wait_until(lambda: len(w2.records) >= len(expected), DEADLINE_S,
                   "w2 reading w1's partitions from the commits")
        assert w2.records == expected
        assert w2.dupes == []
        assert positions(w2, topic, range(4)) == {p: n for p in range(4)}
        desc = admin.describe_groups([group])[group]
        assert desc["group_state"] == "Stable"
        assert [m["client_id"] for m in desc["members"]] == ["w2"]
    finally:
        admin.close()
        for w in (w1, w2):
            w.close()
        assert w1.error is None and w2.error is None


# the member to be killed is librdkafka (confluent-kafka): an independent client, and one that
# does not lose a SyncGroup answer that arrives between two polls, as kafka-python 3.0 can (its
# poll gave up at 100 ms while the answer was on its way; the member never heartbeat again)
MEMBER_SCRIPT = r"""
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "client.id": "doomed",
              "enable.auto.commit": False, "session.timeout.ms": 1500,
              "heartbeat.interval.ms": 300, "partition.assignment.strategy": "range"})
c.subscribe([sys.argv[3]])
reported = []
while True:
    c.poll(0.1)
    now = sorted(tp.partition for tp in c.assignment())
    if now != reported:
        print("assigned", *now, flush=True)
        reported = now
"""


def test_a_killed_member_times_out_and_its_partitions_move(broker):
    import os
    import signal
    import sys

    topic, group = "jobs", "reaper"
    create_topic(broker.bootstrap, topic, 2)
    doomed = subprocess.Popen([sys.executable, "-c", MEMBER_SCRIPT, broker.bootstrap, group, topic],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    survivor = None
    try:
        lines, said = queue.Queue(), []
        threading.Thread(target=lambda: [lines.put(x.split()) for x in doomed.stdout], daemon=True).start()
        threading.Thread(target=lambda: said.extend(doomed.stderr), daemon=True).start()
        def next_assignment():  # skips the empty assignment seen while a rebalance runs
            while True:
                try:
                    got = lines.get(timeout=DEADLINE_S)
                except queue.Empty:
                    raise AssertionError(f"the member reported no assignment in {DEADLINE_S} s; "
                                         f"it said: {''.join(said)[-3000:]!r}") from None
                if got != ["assigned"]:
                    return frozenset(int(x) for x in got[1:])

        assert next_assignment() == {0, 1}
        survivor = Worker("survivor", broker.bootstrap, group, topic, session_timeout_ms=1500)
        # the survivor's join rebalances the group: one partition each
        theirs = next_assignment()
        wait_until(lambda: len(survivor.assigned()) == 1, DEADLINE_S,
                   "the survivor owning one partition")
        assert len(theirs) == 1 and theirs | survivor.assigned() == {0, 1}
        os.kill(doomed.pid, signal.SIGKILL)  # no LeaveGroup: only the session timeout can tell
        doomed.wait(10)
        t0 = time.monotonic()
        wait_until(lambda: survivor.assigned() == frozenset({0, 1}), DEADLINE_S,
                   "the survivor owning both partitions")
        assert time.monotonic() - t0 >= 0.5  # it took a session timeout, not a LeaveGroup
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(10)
        if survivor is not None:
            survivor.close()


def test_committed_offsets_survive_a_broker_restart(broker):
    from statekit import broker as broker_mod

    topic, group = "events", "restart-group"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 10, 2)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(3, "m", -1),
                         TopicPartition(topic, 1): OffsetAndMetadata(8, None, -1)})
    finally:
        consumer.close()
    broker.stop()
    again = broker_mod.start(dir=broker.dir, port=0)
    try:
        consumer = KafkaConsumer(bootstrap_servers=again.bootstrap, group_id=group,
                                 enable_auto_commit=False, auto_offset_reset="latest",
                                 fetch_max_wait_ms=100)
        try:
            tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
            consumer.assign(tps)
            assert {tp.partition: consumer.committed(tp) for tp in tps} == {0: 3, 1: 8}
            got = {}
            end = time.monotonic() + DEADLINE_S
            while len(got) < 9 and time.monotonic() < end:
                for tp, recs in consumer.poll(timeout_ms=200).items():
                    for r in recs:
                        got[(tp.partition, r.offset)] = r.value
            assert got == {**{(0, o): b"p0-%d" % o for o in range(3, 10)},
                           **{(1, o): b"p1-%d" % o for o in range(8, 10)}}
        finally:
            consumer.close()
    finally:
        again.stop()


def test_confluent_kafka_group_consumes_exactly_the_produced_records(broker):
    ck = pytest.importorskip("confluent_kafka")
    topic, group = "clicks", "librdkafka-group"
    create_topic(broker.bootstrap, topic, 4)
    produced = produce(broker.bootstrap, topic, 25, 4)
    conf = {"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
            "fetch.wait.max.ms": 100, "client.id": "rdk"}
    consumer = ck.Consumer(conf)
    got, dupes = {}, []
    try:
        consumer.subscribe([topic])
        end = time.monotonic() + DEADLINE_S
        while len(got) < len(produced) and time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            key = (msg.partition(), msg.offset())
            if key in got:
                dupes.append(key)
            got[key] = msg.value()
        assert got == produced
        assert dupes == []
        assert sorted(tp.partition for tp in consumer.assignment()) == [0, 1, 2, 3]
        consumer.commit(asynchronous=False)
        committed = consumer.committed([ck.TopicPartition(topic, p) for p in range(4)], timeout=10)
        assert {tp.partition: tp.offset for tp in committed} == {p: 25 for p in range(4)}
    finally:
        consumer.close()
    # a second librdkafka member of the same group starts at the commits: nothing is re-read
    produced_more = {}
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for p in range(4):
        producer.produce(topic, value=b"late-%d" % p, partition=p)
        produced_more[(p, 25)] = b"late-%d" % p
    assert producer.flush(30) == 0
    consumer = ck.Consumer(conf)
    got = {}
    try:
        consumer.subscribe([topic])
        end = time.monotonic() + DEADLINE_S
        while len(got) < 4 and time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            got[(msg.partition(), msg.offset())] = msg.value()
        assert got == produced_more
    finally:
        consumer.close()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_balanced_consumer(broker):
    topic, group = "kcat-topic", "kcat-group"
    create_topic(broker.bootstrap, topic, 3)
    produced = produce(broker.bootstrap, topic, 7, 3)
    # -G: balanced consumer group; -e: exit once every assigned partition reached its end
    proc = subprocess.run(
        ["kcat", "-b", broker.bootstrap, "-G", group, "-o", "beginning", "-e", "-q",
         "-X", "enable.auto.commit=true", "-X", "auto.commit.interval.ms=100",
         "-f", "%p %o %s\n", topic],
        capture_output=True, timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stderr.decode()
    rows = [line.split(" ", 2) for line in proc.stdout.decode().splitlines() if line]
    got = [((int(p), int(o)), v.encode()) for p, o, v in rows]
    assert len(got) == len(produced)
    assert dict(got) == produced
    # kcat committed what it consumed before leaving (offset commit on close)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        offsets = admin.list_group_offsets(group)[group]
        assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 7, 1: 7, 2: 7}
    finally:
        admin.close()
