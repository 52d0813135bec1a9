"""An App end to end on a Kafka statekit did not write: librdkafka's mock cluster of three brokers
(partition leaders spread over them; no CreateTopics, DeleteTopics or DescribeConfigs; topics
auto-created on request; no transaction markers). The user creates the topics up front; the app
runs at-least-once on the local engine, its stores and its Kafka output are exact, a restore from
the marker-free changelog is exact, and what statekit cannot check or do there is said in one
line."""
from __future__ import annotations

import collections
import logging
import os
import struct

import pytest

import statekit
from harness import unique
from statekit.contracts import TaskId
from statekit.kafka import Kafka, UnsupportedApi
from statekit.runtime.lifecycle import AppState
from waiting import wait_until


def read_all(bootstrap, topic):
    """Every record of ``topic`` as librdkafka's consumer reads them, per partition in order."""
    import confluent_kafka

    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"),
                                  "enable.auto.commit": False, "log_level": 3})
    try:
        md = c.list_topics(topic, timeout=10)
        parts = sorted(md.topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=10)[1]
                for p in parts}
        c.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in parts])
        out, pos = [], {p: 0 for p in parts}
        while any(pos[p] < ends[p] for p in parts):
            m = c.poll(10)
            assert m is not None, ("no record within 10 s", pos, ends)
            assert m.error() is None, m.error()
            out.append((m.key(), m.value()))
            pos[m.partition()] = m.offset() + 1
        return out
    finally:
        c.close()


@pytest.mark.parametrize("mock_cluster", [3], indirect=True, ids=["3 brokers"])
def test_a_stateful_app_at_least_once_on_the_mock_cluster_with_its_topics_created_up_front(
        mock_cluster, tmp_path, caplog):
    name, src, out = unique("mockwc"), unique("lines"), unique("counts-out")
    changelog = f"{name}-counts-changelog"
    # the user creates every topic up front, as this broker allows (auto-creation: 4 partitions)
    for t in (src, out, changelog, f"{name}-events"):
        assert mock_cluster.create_topic(t) == 4
    first = [f"w{i % 23}" for i in range(400)]
    mock_cluster.produce(src, [(w.encode(), w.encode()) for w in first])
    app = statekit.App(name, bootstrap=mock_cluster.bootstrap, state_dir=str(tmp_path / "st"),
                       engine="local", processing_guarantee="at_least_once")
    app.stream(src).group_by_key().count(store="counts").to_stream().to(out, value_serde="int64")
    k = Kafka(mock_cluster.bootstrap)
    try:
        with caplog.at_level(logging.WARNING):
            app.start(sink="kafka", max_records_per_trigger=60)  # several commits per task
            assert app.process_all_available()
        assert app.partitions == 4 and not app.exactly_once
        said = [r.getMessage() for r in caplog.records if "DescribeConfigs" in r.getMessage()]
        assert said == [f"statekit: the broker at {k._any().addr} does not offer DescribeConfigs: "
                        f"statekit cannot check cleanup.policy of the changelogs {changelog}; check "
                        f"them yourself (a changelog that is not compacted loses state once its "
                        f"records age out)"]
        want = dict(collections.Counter(first))
        assert app.query_all("counts").set_index("key")["value"].to_dict() == want
        # the output, read back by librdkafka: the last count of each key is the exact count
        last = {}
        for key, value in read_all(mock_cluster.bootstrap, out):
            last[key.decode()] = struct.unpack(">q", value)[0]
        assert last == want
        # the changelog holds no transaction markers: offsets = records; every copy's position is
        # the broker's end, exactly
        ends = k.end_offsets(changelog)
        assert all(k.count_records(changelog, p, 0, e) == e for p, e in ends.items())
        lag = app.lag()
        assert dict(zip(lag.task, lag.checkpoint_offset)) == {str(TaskId(0, p)): e for p, e in ends.items()}
        assert (lag.lag == 0).all(), lag

        # a restore from that marker-free changelog, from scratch, is exact
        rec = app.crash("disk-loss", instance=0)
        assert rec["status"] == "applied" and app.state == AppState.ERROR
        more = [f"w{i % 29}" for i in range(150)]
        mock_cluster.produce(src, [(w.encode(), w.encode()) for w in more])
        app.restart()
        assert app.process_all_available()
        # (the restore events arrive through the events topic: wait for all four)
        df = wait_until(lambda: (lambda d: [d] if len(d) == 4 else None)(app.restore_summary()), 30,
                        "every task's restore_end event")[0]
        assert sorted(df.task) == [str(TaskId(0, p)) for p in range(4)], df
        for row in df.itertuples():
            p = TaskId.parse(row.task).partition
            assert row.source == "scratch" and row.records == ends[p] and row.end_offset == ends[p], row
        want = dict(collections.Counter(first + more))
        assert app.query_all("counts").set_index("key")["value"].to_dict() == want
        last = {}
        for key, value in read_all(mock_cluster.bootstrap, out):
            last[key.decode()] = struct.unpack(">q", value)[0]
        assert last == want
        assert app.state == AppState.RUNNING

        # reset() cannot delete the app's topics there: refused in one line, nothing lost
        app.stop()
        ends_now = k.end_offsets(changelog)
        with pytest.raises(UnsupportedApi) as e:
            app.reset()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(
            f"the broker at {k._any().addr} does not offer DeleteTopics, so reset() cannot delete the "
            f"topics of app '{name}' (")
        assert changelog in msg and "reset(topics=False)" in msg
        assert os.path.isdir(app.layout.root) and app.layout.tasks_on_disk(0)
        assert k.end_offsets(changelog) == ends_now
    finally:
        app.close()
        k.close()


def test_an_existing_changelog_whose_cleanup_policy_would_lose_state_is_said(kafka):
    from statekit.runtime.app_topics import changelog_config_notes

    kafka.ensure_topic("cfgnote-a-changelog", 1, {"cleanup.policy": "delete"})
    kafka.ensure_topic("cfgnote-b-changelog", 1, {"cleanup.policy": "compact"})
    kafka.ensure_topic("cfgnote-w-changelog", 1, {"cleanup.policy": "delete,compact"})
    notes = changelog_config_notes(kafka, {"cfgnote-a-changelog": {"cleanup.policy": "compact"},
                                           "cfgnote-b-changelog": {"cleanup.policy": "compact"},
                                           "cfgnote-w-changelog": {"cleanup.policy": "compact,delete"}})
    assert notes == ["changelog cfgnote-a-changelog has cleanup.policy=delete, statekit creates it with "
                     "compact: its state is lost once records age past retention.ms; set "
                     "cleanup.policy=compact"]
