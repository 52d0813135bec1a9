"""The App on the local engine (batches in a worker subprocess): restoration counts after a disk loss,
promotion of a standby replaying only its lag, interactive queries while the query runs, lifecycle,
events, lag, and one-line errors."""
from __future__ import annotations

import collections
import threading
import time

import pytest

import statekit
from statekit.errors import BrokerUnreachable, ProcessorError, TopologyError, UnknownTopic
from statekit.partition import partition_for
from statekit.runtime.lifecycle import AppState

LINES = ["the quick brown fox", "jumps over the lazy dog", "a stream of words", "the state of the art",
         "kafka streams keeps state", "rocksdb holds the store", "a b c d e f g", "the end"]


@pytest.fixture
def kafka(shared_broker):
    from statekit.kafka import Kafka

    k = Kafka(shared_broker.bootstrap)
    try:
        yield k
    finally:
        k.close()


_n = [0]


def unique(prefix):
    _n[0] += 1
    return f"{prefix}{_n[0]}-{int(time.time() * 1000) % 100000}"


def send_lines(kafka, topic, lines, parts=2):
    for i, ln in enumerate(lines):
        kafka.send(topic, i % parts, [(None, ln.encode())])


def wordcount_app(shared_broker, tmp_path, topic, **kw):
    kw.setdefault("partitions", 2)
    app = statekit.App(unique("app"), bootstrap=shared_broker.bootstrap, state_dir=str(tmp_path / "st"),
                       engine="local", **kw)
    app.stream(topic).flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
    return app


def reference(lines):
    return dict(collections.Counter(w for ln in lines for w in ln.split()))


def changelog_sizes(kafka, app, store="counts"):
    topic = app.changelog_topic(store)
    b, e = kafka.begin_offsets(topic), kafka.end_offsets(topic)
    return {p: e[p] - b[p] for p in e}


def wait_restores(app, tasks, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        df = app.restore_summary()
        if set(df["task"]) >= set(tasks):
            return df
        time.sleep(0.1)
    return app.restore_summary()


def test_disk_loss_restart_replays_the_whole_changelog(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2, instances=2)
    try:
        send_lines(kafka, topic, LINES)
        app.start(max_records_per_trigger=3)  # several commits -> several markers per task
        assert app.process_all_available()
        lost = app.assignment.active_tasks(0)
        assert lost
        sizes = changelog_sizes(kafka, app)
        rec = app.crash("disk-loss", instance=0)
        assert app.state == AppState.ERROR
        assert rec["deleted"] and all(str(app.layout.instance_dir(0)) in d for d in rec["deleted"])
        assert app.layout.tasks_on_disk(0) == []
        app.restart()
        send_lines(kafka, topic, LINES)  # the tasks open (and restore) with their next batch
        assert app.process_all_available()
        df = wait_restores(app, lost)
        for t in lost:
            rows = df[df.task == t]
            assert len(rows) == 1, df
            row = rows.iloc[0]
            assert row["source"] == "scratch"
            assert row["records"] == sizes[t], (t, row.to_dict(), sizes)
            assert row["instance"] == 0  # no standby: the instance restores in place
        # the tasks that kept their disk replayed nothing
        assert set(df["task"]) == set(lost)
        assert app.query_all("counts").set_index("key")["value"].to_dict() == reference(LINES + LINES)
        assert app.state == AppState.RUNNING
    finally:
        app.stop()


def test_failover_to_a_standby_replays_only_its_lag(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2, instances=2, standby_replicas=1)
    try:
        send_lines(kafka, topic, LINES)
        app.start(max_records_per_trigger=4)
        assert app.process_all_available()
        assert app.standbys.wait_caught_up(30) == 0
        lag = app.lag()
        assert set(lag["role"]) == {"active", "standby"}
        assert (lag["lag"] == 0).all(), lag
        # the standbys stop tailing for a while: their lag grows with the next batches
        app.standbys.pause()
        send_lines(kafka, topic, LINES[:5])
        assert app.process_all_available()
        lag = app.lag()
        lost = app.assignment.active_tasks(0)
        behind = {int(r.task): int(r.lag) for r in lag.itertuples() if r.role == "standby" and r.task in lost}
        assert any(v > 0 for v in behind.values()), lag
        sizes = changelog_sizes(kafka, app)
        app.crash("disk-loss", instance=0)
        r = app.restart()
        promoted = {p["task"]: p for p in r["promotions"]}
        assert set(promoted) == set(lost)  # failover: the tasks moved to their standby's instance
        for t in lost:
            assert app.assignment.active[t] == 1
            assert promoted[t]["lag"] == behind[t]
        assert app.assignment.standby_tasks(0) == sorted(app.assignment.tasks)  # the empty one warms up
        send_lines(kafka, topic, LINES[5:])
        assert app.process_all_available()
        df = wait_restores(app, [t for t in lost if behind[t] > 0])
        for t in lost:
            rows = df[df.task == t]
            if behind[t] == 0:
                assert rows.empty or int(rows.iloc[0]["records"]) == 0
                continue
            row = rows.iloc[0]
            assert row["source"] == "standby"
            assert int(row["records"]) == behind[t] < sizes[t]
        want = reference(LINES + LINES[:5] + LINES[5:])
        assert app.query_all("counts").set_index("key")["value"].to_dict() == want
    finally:
        app.stop()


def test_interactive_queries_while_the_query_runs(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=3, instances=2)
    try:
        app.start()
        stop = threading.Event()
        sent = []

        def feed():
            i = 0
            while not stop.is_set() and i < 40:
                ln = LINES[i % len(LINES)]
                kafka.send(topic, i % 2, [(None, ln.encode())])
                sent.append(ln)
                i += 1
                time.sleep(0.02)

        th = threading.Thread(target=feed)
        th.start()
        seen = []
        try:
            while th.is_alive():
                v = app.query("counts", "the")
                seen.append(v or 0)
                time.sleep(0.03)
        finally:
            stop.set()
            th.join()
        assert seen == sorted(seen), "a committed count never goes back"
        assert app.process_all_available()
        assert app.state == AppState.RUNNING and app._query.is_active
        want = reference(sent)
        for word, n in want.items():
            assert app.query("counts", word) == n
        assert app.query("counts", "no-such-word") is None
        # range and all
        rng = app.query_range("counts", "a", "f")
        assert rng == sorted((k, v) for k, v in want.items() if "a" <= k <= "f")
        df = app.query_all("counts")
        assert dict(zip(df.key, df.value)) == want
        # routing: the owner's task is the murmur2 partition of the serialized key, and the key is
        # stored in that task's RocksDB only
        from statekit.stores import open_readonly

        for key in want:
            owner = app.key_owner("counts", key)
            task, inst, role = owner
            assert role == "active"
            assert task == partition_for(key.encode("utf-8"), 3)
            assert inst == app.assignment.active[task]
            for t in range(3):
                i = app.assignment.active[t]
                with open_readonly(app.layout.task_dir(i, t)) as ro:
                    has = ro.get("counts", key.encode("utf-8")) is not None
                assert has == (t == task), (key, t, task)
        assert set(zip(df.key, df.task)) == {(k, app.key_owner("counts", k).task) for k in want}
    finally:
        app.stop()


def test_window_queries(shared_broker, kafka, tmp_path):
    from statekit.topology.graph import tumbling

    topic = unique("clicks")
    kafka.ensure_topic(topic, 2)
    app = statekit.App(unique("win"), bootstrap=shared_broker.bootstrap, partitions=2,
                       state_dir=str(tmp_path / "st"), engine="local")
    app.stream(topic).group_by_key().windowed_by(tumbling(1000), grace_ms=10 ** 9).count(store="w")
    try:
        for u in ["ann", "bob", "ann", "cy", "ann"]:
            kafka.send(topic, partition_for(u.encode(), 2), [(u.encode(), b"/x")])
        app.start()
        assert app.process_all_available()
        from harness import read_topic

        want = collections.Counter()
        for _p, _o, ts, k, _v in read_topic(kafka, topic):
            want[(k.decode(), ts - ts % 1000)] += 1
        for (user, ws), n in want.items():
            assert (ws, n) in app.query_window("w", user, ws - 5000, ws + 5000)
        assert app.query_window("w", "ann", 0, 10) == []
        assert app.query_window("w", "nobody", 0, 2 ** 62) == []
        total = sum(v for _ws, v in app.query_window("w", "ann", 0, 2 ** 62))
        assert total == 3
        df = app.query_all("w")
        assert list(df.columns) == ["key", "window_start", "value", "task", "instance"]
        assert {(k, ws): v for k, ws, v in zip(df.key, df.window_start, df.value)} == dict(want)
    finally:
        app.stop()


def test_lifecycle_events_metrics_and_describe(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2, instances=2)
    seen = []
    app.on_event(lambda e: seen.append(e))
    d = app.describe()
    assert {"nodes", "edges"} <= set(d)
    assert app.state == AppState.CREATED
    try:
        send_lines(kafka, topic, LINES)
        app.start()
        assert app.process_all_available()
        assert app.wait_for_state(AppState.RUNNING, 10) == AppState.RUNNING
        m = app.metrics()
        assert m["records_processed"] == len(LINES)
        assert m["last_batch_latency_ms"] is not None and m["batches"] >= 1
        app.crash("process", instance=1)
        assert app.state == AppState.ERROR
        app.restart(wait=True)
        assert app.state == AppState.RUNNING
        app.stop()
        assert app.state == AppState.NOT_RUNNING
        states = [(s.value, n.value) for _t, s, n in app._life.history]
        assert states == [("CREATED", "RESTORING"), ("RESTORING", "RUNNING"), ("RUNNING", "ERROR"),
                          ("ERROR", "RESTORING"), ("RESTORING", "RUNNING"), ("RUNNING", "PENDING_SHUTDOWN"),
                          ("PENDING_SHUTDOWN", "NOT_RUNNING")]
        types = {e.get("type") for e in seen}
        assert {"task_opened", "commit", "state", "crash", "rebalance"} <= types, types
        st = [e["state"] for e in seen if e.get("type") == "state"]
        assert st[:2] == ["RESTORING", "RUNNING"] and "ERROR" in st
    finally:
        app.stop()


# -- errors: one line each -------------------------------------------------------------------------

def one_line(err):
    s = str(err)
    assert s and "\n" not in s and "Traceback" not in s, s
    return s


def test_error_unknown_topic_at_start(shared_broker, tmp_path):
    app = statekit.App(unique("e"), bootstrap=shared_broker.bootstrap, state_dir=str(tmp_path), engine="local")
    app.stream("no-such-topic-here").group_by_key().count(store="c")
    with pytest.raises(UnknownTopic) as ei:
        app.start()
    assert "no-such-topic-here" in one_line(ei.value)
    assert app.state == AppState.CREATED
    app.stop()


def test_error_store_name_used_twice(shared_broker, kafka, tmp_path):
    topic = unique("t")
    kafka.ensure_topic(topic, 1)
    app = statekit.App(unique("e"), bootstrap=shared_broker.bootstrap, state_dir=str(tmp_path), engine="local")
    s = app.stream(topic)
    s.group_by_key().count(store="same")
    s.group_by(lambda k, v: v).count(store="same")
    with pytest.raises(TopologyError) as ei:
        app.start()
    assert "same" in one_line(ei.value)
    app.stop()


def test_error_broker_not_reachable(tmp_path):
    app = statekit.App(unique("e"), bootstrap="127.0.0.1:1", state_dir=str(tmp_path), engine="local")
    app.stream("x").group_by_key().count(store="c")
    with pytest.raises(BrokerUnreachable) as ei:
        app.start()
    assert "127.0.0.1:1" in one_line(ei.value)
    app.stop()


def test_error_processor_raises(shared_broker, kafka, tmp_path):
    topic = unique("t")
    kafka.ensure_topic(topic, 1)
    app = statekit.App(unique("e"), bootstrap=shared_broker.bootstrap, state_dir=str(tmp_path), engine="local")
    app.stream(topic).map_values(lambda v: 1 // (len(v) - 3)).group_by_key().count(store="c")
    try:
        kafka.send(topic, 0, [(b"k", b"abc")])
        app.start()
        with pytest.raises(ProcessorError) as ei:
            app.process_all_available()
        msg = one_line(ei.value)
        assert "ZeroDivisionError" in msg
        assert app.state == AppState.ERROR
        assert isinstance(app.error, ProcessorError) and one_line(app.error) == msg
    finally:
        app.stop()


def test_memory_sink_output_survives_a_crash(shared_broker, kafka, tmp_path):
    topic, out = unique("lines"), unique("out")
    kafka.ensure_topic(topic, 2)
    app = statekit.App(unique("mem"), bootstrap=shared_broker.bootstrap, partitions=2,
                       state_dir=str(tmp_path / "st"), engine="local")
    (app.stream(topic).flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
     .to_stream().to(out))
    try:
        send_lines(kafka, topic, LINES[:4])
        app.start(sink="memory", max_records_per_trigger=2)
        assert app.process_all_available()
        rec = app.crash("process", after_records=1)
        send_lines(kafka, topic, LINES[4:])
        assert app.process_all_available() is False and app.state == AppState.ERROR
        # a real process died mid-batch: the worker that claimed the directive is gone
        import os

        pid = rec["claim"]["pid"]
        assert pid != os.getpid() and rec["claim"]["records"] == 1
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        app.restart()
        assert app.process_all_available()
        df = app.output()
        assert list(df.columns) == ["batch", "topic", "key", "value"]
        assert (df.topic == out).all()
        last = {}
        for k, v in zip(df.key, df.value):  # batch order: the last update per key is the count
            last[k] = v
        assert last == reference(LINES)
    finally:
        app.stop()


def test_stop_start_resumes_and_reset_forgets(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2, instances=2, standby_replicas=1)
    try:
        send_lines(kafka, topic, LINES[:3])
        app.start()
        assert app.process_all_available()
        first = dict(app.assignment.active)
        app.stop()
        assert app.state == AppState.NOT_RUNNING
        send_lines(kafka, topic, LINES[3:])
        app.start()  # same checkpoint: continues where it stopped, same (sticky) assignment
        assert app.process_all_available()
        assert dict(app.assignment.active) == first
        assert app.query_all("counts").set_index("key")["value"].to_dict() == reference(LINES)
        app.stop()
        with pytest.raises(statekit.errors.StatekitError):
            app.restart(crash_during={"mode": "bogus"})
        assert app.state == AppState.NOT_RUNNING
        out = app.reset()
        assert app.changelog_topic("counts") in out["topics"]
        assert app.changelog_topic("counts") not in kafka.topics()
        assert not (tmp_path / "st").exists()
        app.start()  # from scratch: the whole topic once, not twice
        assert app.process_all_available()
        assert app.query_all("counts").set_index("key")["value"].to_dict() == reference(LINES)
    finally:
        app.stop()


def test_engine_spark_is_spark_own_state_store(tmp_path):
    from statekit.engine.spark_native import NativeApp

    app = statekit.App("nat", bootstrap="127.0.0.1:1", partitions=2, state_dir=str(tmp_path), engine="spark")
    assert isinstance(app, NativeApp)
    with pytest.raises(statekit.errors.StatekitError) as ei:
        statekit.App("nat2", instances=2, engine="spark")
    one_line(ei.value)
    with pytest.raises(statekit.errors.StatekitError):
        statekit.App("nat3", engine="flink")


def test_available_now_trigger_ends_in_not_running(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2)
    try:
        send_lines(kafka, topic, LINES[:4])
        app.start(trigger="availableNow", max_records_per_trigger=2)
        assert app.process_all_available(timeout=60)
        assert app.wait_for_state(AppState.NOT_RUNNING, 10) == AppState.NOT_RUNNING
        assert app.query_all("counts").set_index("key")["value"].to_dict() == reference(LINES[:4])
        assert app.metrics()["batches"] == 2
        send_lines(kafka, topic, LINES[4:])
        app.start(trigger="availableNow")
        assert app.process_all_available(timeout=60)
        assert app.query_all("counts").set_index("key")["value"].to_dict() == reference(LINES)
    finally:
        app.stop()


def test_commit_interval_is_the_micro_batch_trigger(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 1)
    app = wordcount_app(shared_broker, tmp_path, topic, commit_interval=0.25)
    try:
        app.start()
        assert app._run.trigger == 0.25
        kafka.send(topic, 0, [(None, b"a b a")])
        assert app.process_all_available()
        assert app.query("counts", "a") == 2
    finally:
        app.stop()
    app2 = wordcount_app(shared_broker, tmp_path / "two", topic, commit_interval=0.25)
    try:
        app2.start(trigger="availableNow")
        assert app2._run.trigger == "availableNow"  # an explicit trigger wins
    finally:
        app2.stop()
