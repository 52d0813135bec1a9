"""The App on the local engine (micro-batches planned in this process, tasks in real instance
processes): restoration counts after a disk loss, a standby's promotion replaying exactly its lag,
interactive queries while the application runs, lifecycle, events, the memory sink, and one-line
errors."""
from __future__ import annotations

import collections
import os
import threading
import time

import pytest

import statekit
from harness import unique
from statekit import events as ev
from statekit.contracts import TaskId
from statekit.errors import BrokerUnreachable, ProcessorError, StatekitError, TopologyError, UnknownTopic
from statekit.partition import partition_for
from statekit.runtime.lifecycle import AppState
from waiting import wait_until

LINES = ["the quick brown fox", "jumps over the lazy dog", "a stream of words", "the state of the art",
         "kafka streams keeps state", "rocksdb holds the store", "a b c d e f g", "the end"]


def send_lines(kafka, topic, lines, parts=None):
    """Each word of each line as a record keyed by the word, in the partition Kafka's default
    partitioner picks (a task reads its own partition: a keyed count needs no repartition)."""
    from statekit.partition import partition_for

    parts = parts or len(kafka.end_offsets(topic))
    for ln in lines:
        by_p: dict = {}
        for w in ln.split():
            by_p.setdefault(partition_for(w.encode(), parts), []).append((w.encode(), w.encode()))
        for p, recs in sorted(by_p.items()):
            kafka.send(topic, p, recs)


def wordcount_app(shared_broker, tmp_path, topic, **kw):
    app = statekit.App(unique("app"), bootstrap=shared_broker.bootstrap, state_dir=str(tmp_path / "st"),
                       engine="local", **kw)
    app.stream(topic).group_by_key().count(store="counts")
    return app


def reference(lines):
    return dict(collections.Counter(w for ln in lines for w in ln.split()))


def counts(app, store="counts"):
    return app.query_all(store).set_index("key")["value"].to_dict()


def changelog_sizes(kafka, app, store="counts"):
    """Records per changelog partition (offsets minus the transactions' control markers)."""
    topic = app.changelog_topic(store)
    b, e = kafka.begin_offsets(topic), kafka.end_offsets(topic)
    return {p: kafka.count_records(topic, p, b[p], e[p]) for p in e}


def one_line(err):
    s = str(err)
    assert s and "\n" not in s and "Traceback" not in s, s
    return s


def test_disk_loss_of_the_only_instance_then_restart_replays_the_whole_changelog(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2, instances=1)
    try:
        send_lines(kafka, topic, LINES)
        app.start(max_records_per_trigger=3)  # several commits -> several markers per task
        assert app.process_all_available()
        sizes = changelog_sizes(kafka, app)
        assert all(sizes.values())
        rec = app.crash("disk-loss", instance=0)
        assert rec["status"] == "applied"
        assert app.state == AppState.ERROR and "every instance" in one_line(app.error)
        assert app.layout.tasks_on_disk(0) == []
        died = app.wait_for_event(lambda e: e.type == "instance_died", 10)
        assert died.instance == 0 and died.mode == "disk-loss" and died.cause == "crash"
        assert died.deleted == 2 and sorted(died.tasks) == ["0_0", "0_1"]
        send_lines(kafka, topic, LINES)    # no live instance: the batches wait in the spool
        assert app.process_all_available(timeout=30) is False
        app.restart()
        assert app.process_all_available()
        df = app.restore_summary()
        assert sorted(df.task) == ["0_0", "0_1"], df
        for row in df.itertuples():
            assert row.source == "scratch" and row.instance == 0
            assert row.records == sizes[TaskId.parse(row.task).partition], (row, sizes)
        assert counts(app) == reference(LINES + LINES)
        assert app.state == AppState.RUNNING
    finally:
        app.stop()


def test_failover_to_a_paused_standby_replays_exactly_its_lag(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2, instances=2, standby_replicas=1)
    states = []
    app.on_event(lambda e: states.append(e.state) if e.type == "state" else None)
    try:
        send_lines(kafka, topic, LINES)
        app.start(max_records_per_trigger=4)
        assert app.process_all_available()
        wait_until(lambda: (app.lag()["lag"] == 0).all(), 30, "every copy at lag 0")
        lag = app.lag()
        assert set(lag["role"]) == {"active", "standby"} and (lag["lag"] == 0).all(), lag
        app.pause_standbys()                # the standbys stop tailing: their lag grows
        send_lines(kafka, topic, LINES[:5])
        assert app.process_all_available()
        lag = app.lag()
        lost = [str(t) for t in app.assignment.active_tasks(0)]
        behind = {r.task: int(r.lag) for r in lag.itertuples() if r.role == "standby" and r.task in lost}
        assert set(behind) == set(lost) and any(v > 0 for v in behind.values()), lag
        sizes = changelog_sizes(kafka, app)
        app.crash("disk-loss", instance=0)   # instance 1 holds every standby of instance 0
        assert app.state in (AppState.REBALANCING, AppState.RUNNING)
        send_lines(kafka, topic, LINES[5:])
        assert app.process_all_available()
        assert {str(t) for t in app.assignment.active_tasks(1)} == {"0_0", "0_1"}
        promoted = {e.task: e for e in app.events(types="standby_promoted")}
        assert set(promoted) == set(lost)
        restored = {e.task: e for e in app.events(types="restore_end")}
        topic = app.changelog_topic("counts")
        for t in lost:
            assert promoted[t].lag == behind[t]                 # offsets, transaction markers too
            if behind[t]:
                p = TaskId.parse(t).partition
                end = restored[t].end_offset
                records = kafka.count_records(topic, p, end - behind[t], end)
                assert restored[t].source == "standby" and restored[t].restored == records > 0
                assert records < sizes[p]
        assert counts(app) == reference(LINES + LINES[:5] + LINES[5:])
        assert "ERROR" not in states and states[-1] == "RUNNING"
    finally:
        app.stop()


def test_interactive_queries_while_the_application_runs(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 3)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=3, instances=2)
    try:
        app.start()
        stop = threading.Event()
        sent = []

        def feed():
            i = 0
            while not stop.is_set() and i < 40:
                ln = LINES[i % len(LINES)]
                send_lines(kafka, topic, [ln])
                sent.append(ln)
                i += 1
                time.sleep(0.02)  # pacing: the lines arrive while the queries run

        th = threading.Thread(target=feed)
        th.start()
        seen = []
        try:
            while th.is_alive():
                seen.append(app.query("counts", "the") or 0)
                time.sleep(0.03)  # sampling: a count read now and then while the feeder runs
        finally:
            stop.set()
            th.join()
        assert seen == sorted(seen), "a committed count never goes back"
        assert app.process_all_available()
        assert app.state == AppState.RUNNING
        want = reference(sent)
        for word, n in want.items():
            assert app.query("counts", word) == n
        assert app.query("counts", "no-such-word") is None
        assert app.query_range("counts", "a", "f") == sorted((k, v) for k, v in want.items() if "a" <= k <= "f")
        df = app.query_all("counts")
        assert dict(zip(df.key, df.value)) == want
        # routing: the owner's task is the murmur2 partition of the serialized key, and the key is
        # stored in that task's RocksDB only
        from statekit.stores import open_readonly

        for key in want:
            task, inst, role = app.key_owner("counts", key)
            assert role == "active" and task == TaskId(0, partition_for(key.encode("utf-8"), 3))
            assert inst == app.assignment.active[task]
            for t in app.assignment.tasks:
                with open_readonly(app.layout.task_dir(app.assignment.active[t], t)) as ro:
                    assert (ro.get("counts", key.encode("utf-8")) is not None) == (t == task), (key, t)
        assert set(zip(df.key, df.task)) == {(k, str(app.key_owner("counts", k).task)) for k in want}
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
        assert sum(v for _ws, v in app.query_window("w", "ann", 0, 2 ** 62)) == 3
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
    app.on_event(seen.append)
    d = app.describe()
    assert {"nodes", "edges"} <= set(d)
    assert app.state == AppState.CREATED
    try:
        send_lines(kafka, topic, LINES)
        app.start()
        assert app.process_all_available()
        assert app.wait_for_state(AppState.RUNNING, 10) == AppState.RUNNING
        m = app.metrics()
        assert m["records_processed"] == sum(map(len, map(str.split, LINES)))
        assert m["instances"] == 2
        assert m["last_batch_latency_ms"] is not None and m["batches"] >= 1
        app.crash("process", instance=1)           # one of two: the app keeps running
        send_lines(kafka, topic, LINES[:2])
        assert app.process_all_available()
        assert app.state == AppState.RUNNING and app.instances == 1
        app.restart(wait=True)                     # revives instance 1
        assert app.state == AppState.RUNNING and app.instances == 2
        app.stop()
        assert app.state == AppState.NOT_RUNNING
        states = [(s.value, n.value) for _t, s, n in app._life.history]
        assert states[0] == ("CREATED", "RESTORING") and states[-2:] == [
            ("RUNNING", "PENDING_SHUTDOWN"), ("PENDING_SHUTDOWN", "NOT_RUNNING")]
        assert ("RUNNING", "REBALANCING") in states and "ERROR" not in {n for _o, n in states}
        types = {e.type for e in seen}
        assert {"task_opened", "commit", "state", "rebalance", "instance_died",
                "instance_started", "restore_queued"} <= types, types
        gens = [e.generation for e in seen if e.type == "rebalance"]
        assert gens == sorted(gens) and len(set(gens)) == len(gens) >= 3
        commit = next(e for e in seen if e.type == "commit")
        assert isinstance(commit, ev.Committed) and commit.task in ("0_0", "0_1") and commit.records > 0
        assert commit.instance in (0, 1) and commit.generation == 1
        assert counts(app) == reference(LINES + LINES[:2])
    finally:
        app.stop()


# -- errors: one line each -------------------------------------------------------------------------

def test_error_unknown_topic_names_the_closest_one(shared_broker, kafka, tmp_path):
    kafka.ensure_topic("sensor-readings", 1)
    app = statekit.App(unique("e"), bootstrap=shared_broker.bootstrap, state_dir=str(tmp_path), engine="local")
    app.stream("sensor-reading").group_by_key().count(store="c")
    with pytest.raises(UnknownTopic) as ei:
        app.check_topics()
    msg = one_line(ei.value)
    assert "'sensor-reading'" in msg and "did you mean 'sensor-readings'" in msg and "produce" in msg
    with pytest.raises(UnknownTopic):
        app.start()
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


@pytest.mark.parametrize("where", ["before the shuffle", "in the task"])
def test_error_processor_raises(shared_broker, kafka, tmp_path, where):
    topic = unique("t")
    kafka.ensure_topic(topic, 1)
    app = statekit.App(unique("e"), bootstrap=shared_broker.bootstrap, state_dir=str(tmp_path), engine="local")
    if where == "before the shuffle":
        app.stream(topic).map_values(lambda v: 1 // (len(v) - 3)).group_by_key().count(store="c")
    else:
        app.stream(topic).group_by_key().aggregate(lambda: 0, lambda k, v, a: a + 1 // (len(v) - 3),
                                                   store="c", value_serde="int64")
    try:
        kafka.send(topic, 0, [(b"k", b"abc")])
        app.start()
        with pytest.raises(ProcessorError) as ei:
            app.process_all_available()
        msg = one_line(ei.value)
        assert "ZeroDivisionError" in msg
        assert app.state == AppState.ERROR
        assert isinstance(app.error, ProcessorError) and one_line(app.error) == msg
        if where == "in the task":   # the instance says which task failed
            failed = app.wait_for_event(lambda e: e.type == "task_failed", 10)
            assert failed is not None and "ZeroDivisionError" in failed.error and failed.task == "0_0"
            assert failed.instance == 0 and failed.batch == 0
    finally:
        app.stop()


def test_crash_before_start_and_bad_crash_arguments_are_refused(shared_broker, kafka, tmp_path):
    topic = unique("t")
    kafka.ensure_topic(topic, 1)
    app = wordcount_app(shared_broker, tmp_path, topic)
    with pytest.raises(StatekitError, match="not started") as ei:
        app.crash("process")
    one_line(ei.value)
    with pytest.raises(StatekitError, match="unknown crash mode"):
        app.crash("meteor")
    assert app.state == AppState.CREATED and app.crashes == []
    try:
        app.start()
        for bad in (5, "x"):
            with pytest.raises(StatekitError) as ei:
                app.crash("process", instance=bad)
            one_line(ei.value)
        assert app.crashes == [] and app.instances == 1 and app.state.is_running()
    finally:
        app.stop()


def test_memory_sink_output_is_exactly_once_across_a_crash(shared_broker, kafka, tmp_path):
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
        assert app.process_all_available(timeout=30) is False and app.state == AppState.ERROR
        from statekit.worker import crash as crash_mod

        claim = crash_mod.claimed(app.layout.control_dir, rec["id"])
        assert claim["pid"] != os.getpid() and claim["records"] == 1
        with pytest.raises(ProcessLookupError):   # a real process died mid-batch
            os.kill(claim["pid"], 0)
        app.restart()
        assert app.process_all_available()
        df = app.output()
        assert list(df.columns) == ["batch", "task", "topic", "key", "value"]
        assert (df.topic == out).all()
        assert not df.duplicated(["batch", "task", "key"]).any()
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
        assert counts(app) == reference(LINES)
        app.stop()
        with pytest.raises(StatekitError):
            app.restart(crash_during={"mode": "bogus"})
        assert app.state == AppState.NOT_RUNNING
        out = app.reset()
        assert app.changelog_topic("counts") in out["topics"]
        assert app.changelog_topic("counts") not in kafka.topics()
        assert not (tmp_path / "st").exists()
        app.start()  # from scratch: the whole topic once, not twice
        assert app.process_all_available()
        assert counts(app) == reference(LINES)
    finally:
        app.stop()


def test_engine_spark_is_its_own_class(tmp_path):
    from statekit.engine.spark_native import NativeApp

    with pytest.raises(StatekitError, match="NativeApp") as ei:
        statekit.App("nat", bootstrap="127.0.0.1:1", engine="spark")
    one_line(ei.value)
    assert statekit.NativeApp is NativeApp
    with pytest.raises(StatekitError, match="unknown engine"):
        statekit.App("nat3", engine="flink")


def test_available_now_trigger_ends_in_not_running(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2)
    try:
        send_lines(kafka, topic, LINES[:4])
        words = sum(len(ln.split()) for ln in LINES[:4])
        app.start(trigger="availableNow", max_records_per_trigger=-(-words // 2))
        assert app.wait_for_state(AppState.NOT_RUNNING, 60) == AppState.NOT_RUNNING
        assert counts(app) == reference(LINES[:4])
        assert app.metrics()["batches"] == 2
        send_lines(kafka, topic, LINES[4:])
        app.start(trigger="availableNow")
        assert app.wait_for_state(AppState.NOT_RUNNING, 60) == AppState.NOT_RUNNING
        assert counts(app) == reference(LINES)
    finally:
        app.stop()


def test_commit_interval_is_the_micro_batch_trigger(shared_broker, kafka, tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 1)
    app = wordcount_app(shared_broker, tmp_path, topic, commit_interval=0.25)
    try:
        app.start()
        assert app.runs[0].trigger == 0.25
        send_lines(kafka, topic, ["a b a"])
        assert app.process_all_available()
        assert app.query("counts", "a") == 2
    finally:
        app.stop()
    app2 = wordcount_app(shared_broker, tmp_path / "two", topic, commit_interval=0.25)
    try:
        app2.start(trigger="availableNow")
        assert app2.runs[0].trigger == "availableNow"  # an explicit trigger wins
    finally:
        app2.stop()


def test_restore_forecast_names_the_records_a_restore_then_reads(shared_broker, kafka, tmp_path,
                                                                 monkeypatch):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=2, instances=2, standby_replicas=1)
    try:
        send_lines(kafka, topic, LINES * 3)
        app.start(max_records_per_trigger=5)
        assert app.process_all_available()
        from statekit.state import forecast as F

        F.clear_calibration()
        f = app.restore_forecast()
        df = f.frame
        assert set(df.source) == {"scratch", "checkpoint", "standby"} and set(df.task) == {"0_0", "0_1"}
        assert all(df.seconds >= 0) and all(df.apply_rate > 0)
        # no restore yet: one calibration, made by an instance (where a restore runs), not here
        assert set(df.rate_source) == {"calibrated"} and df.apply_rate.nunique() == 1
        assert F._calibrated == {}
        victim = 0
        mine = sorted(str(t) for t in app.assignment.active_tasks(victim))
        line = f.line(victim)
        assert line.startswith(f"if instance {victim} died now:") and all(t in line for t in mine), line
        assert "from their standbys" in line
        # no instance answers (one died during the call): a dashboard's forecast (settle=0) is not
        # calibrated here, beside the notebook, but refused; a cell's (it waits) is, as before
        with monkeypatch.context() as m:
            m.setattr(app._coordinator, "calibrate", lambda *a, **k: None)
            with pytest.raises(StatekitError, match="no live instance answered"):
                app.restore_forecast(settle=0)
            assert F._calibrated == {}
            assert set(app.restore_forecast(settle=0.1).frame.rate_source) == {"calibrated"}
            assert len(F._calibrated) == 1
        F.clear_calibration()
        scratch = df[df.source == "scratch"].set_index("task").records.to_dict()
        sizes = changelog_sizes(kafka, app)
        app.crash("disk-loss", instance=1)      # one instance left, and no standby any more
        assert app.process_all_available()
        app.crash("disk-loss", instance=0)      # every disk lost: a restart restores from scratch
        app.restart()
        assert app.process_all_available()
        restored = {}
        for e in app.events(types="restore_end"):
            if e.source == "scratch":
                restored.setdefault(e.task, {})[e.store] = e.restored
        for t, n in scratch.items():
            assert n == sizes[TaskId.parse(t).partition]        # every record the changelog holds
            assert sum(restored[t].values()) == n, (t, restored[t], n)
    finally:
        app.stop()


def test_a_task_reads_its_ranges_and_a_retried_batch_is_not_applied_twice(shared_broker, kafka,
                                                                         tmp_path):
    """The exchange hands a task its offset ranges; the owner reads them from Kafka itself, in
    offset order, commits, and answers once committed; the same batch again (Spark retried the
    task) is a no-op; a batch for a dead owner waits in the spool, then goes first."""
    from statekit.worker.exchange import Spool, deliver

    topic = unique("lines")
    kafka.ensure_topic(topic, 1)
    app = wordcount_app(shared_broker, tmp_path, topic, partitions=1)
    try:
        app.start()
        assert app.process_all_available()
        for q in app._queries.values():       # the engine stops: only these batches reach the task
            q.stop()
        task, ctl = TaskId(0, 0), app.layout.control_dir
        lines = ["a b", "b c", "c d", "a a"]
        send_lines(kafka, topic, lines)
        end = kafka.end_offsets(topic)[0]
        assert deliver(ctl, task, 500, [(topic, 0, 0, 4)]) == ("done", 0)
        assert counts(app) == reference(["a b", "b c"])       # offsets 0..3: the first 4 words
        assert deliver(ctl, task, 500, [(topic, 0, 0, 4)]) == ("done", 0)   # Spark retried it
        assert counts(app) == reference(["a b", "b c"])
        commit = app.wait_for_event(lambda e: e.type == "commit" and e.batch == 500, 10)
        assert commit.records == 4
        assert deliver(ctl, task, 501, [(topic, 0, 4, end)])[0] == "done"
        assert counts(app) == reference(lines)
        assert Spool(app.layout.control.spool_dir(str(task))).batches() == []
    finally:
        app.stop()


def test_an_app_made_again_after_its_code_failed_starts_where_the_failed_one_held_the_state(
        shared_broker, kafka, tmp_path):
    """A notebook's Python cell run twice: `app = statekit.App(same name)`, fixed, then start(). The
    earlier object in ERROR held its task directories (its instance still ran): start() stops it
    first, and the fixed app counts every record exactly. A running earlier object is left alone
    and the start refused in one line."""
    topic, name = unique("t"), unique("again")
    kafka.ensure_topic(topic, 2)

    def make(step):
        a = statekit.App(name, bootstrap=shared_broker.bootstrap, state_dir=str(tmp_path / "st"),
                         engine="local", partitions=2)
        a.stream(topic).group_by_key().aggregate(lambda: 0, lambda k, v, n: n + step(v), store="c",
                                                 value_serde="int64")
        return a

    bad = make(lambda v: 1 // 0)
    fixed = make(lambda v: 1)
    third = make(lambda v: 1)
    try:
        send_lines(kafka, topic, LINES)
        bad.start()
        with pytest.raises(ProcessorError):
            bad.process_all_available()
        pids = [int(p) for p in bad.instances_frame()["pid"] if p]
        assert pids and all(os.path.exists(f"/proc/{p}") for p in pids)
        fixed.start()
        assert bad.state == AppState.NOT_RUNNING
        assert fixed.process_all_available(timeout=60)
        assert counts(fixed, "c") == reference(LINES)
        with pytest.raises(StatekitError) as ei:
            third.start()
        assert f"an earlier App('{name}') of this process is RUNNING" in one_line(ei.value)
        assert third.state == AppState.CREATED and fixed.state == AppState.RUNNING
    finally:
        for a in (third, fixed, bad):
            a.stop()
