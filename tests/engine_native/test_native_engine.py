"""Spark's own RocksDB state store (statekit.engine.spark_native) side by side with the changelog
engine: equal results to plain Python with and without a crash, and the snapshot interval
(minDeltasForSnapshot) changing the changelog replay of a restore, read from Spark's metrics."""
from __future__ import annotations

import time

import pytest

import nativehelpers as H
from waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.native]


def _topics(kafka):
    kafka.ensure_topic("lines", 2)
    kafka.ensure_topic("clicks", 2)


@pytest.mark.slow   # 64 s: `make test-native` runs it; notebook 09 runs both engines in `make test`
def test_both_engines_equal_reference_with_and_without_crash(native_broker, native_spark, tmp_path):
    import statekit
    from statekit.engine.spark_native import NativeApp
    from statekit.kafka import Kafka

    k = Kafka(native_broker.bootstrap)
    _topics(k)
    chunks = H.make_chunks(7, 4, 40, 30)
    native = NativeApp("wcnative", bootstrap=native_broker.bootstrap, partitions=2,
                       state_dir=str(tmp_path / "native"))
    H.build_topology(native)
    cl = statekit.App("wcchangelog", bootstrap=native_broker.bootstrap, partitions=2,
                      state_dir=str(tmp_path / "changelog"), engine="changelog")
    H.build_topology(cl)
    try:
        for c in chunks[:2]:
            H.produce(k, c)
        # --- no crash yet: both engines equal the reference
        native.start(max_records_per_trigger=60)
        cl.start(max_records_per_trigger=60)
        native.process_all_available(timeout=300)
        assert cl.process_all_available(timeout=300)
        want_wc, want_win, want_pages = H.wordcount_reference(k), H.windowed_reference(k), H.pages_reference(k)
        assert native.store_dict("counts") == want_wc
        assert native.store_dict("clicks-per-window") == want_win
        assert native.store_dict("pages") == want_pages
        assert H.as_dict(cl.query_all("counts")) == want_wc
        assert H.as_dict(cl.query_all("clicks-per-window")) == want_win
        assert native.metrics()["records_processed"] == len(H.read_topic(k, "lines")) + \
            len(H.read_topic(k, "clicks"))

        # --- a crash of each engine, more input, restart, equal again
        # the changelog engine's only instance dies and loses its disk
        cl.crash("disk-loss")
        died = cl.wait_for_event(lambda e: e.type == "instance_died", 30)
        # every task's state is gone (the word count's two sub-topologies: 2 x 2 tasks)
        assert died is not None and died.deleted == len(cl.tasks()) == 4, died
        for c in chunks[2:]:
            H.produce(k, c)
        rec = native.crash(mode="jvm", during_batch=True)      # SIGKILL the JVM while a batch runs
        assert rec["pid"] and rec["wiped"]["dirs"] >= 1, rec   # RocksDB working dirs deleted
        lag = native.changelog_lag()
        assert len(lag) == 2 and (lag.changelog_files > 0).all()
        native.restart()
        cl.restart()
        native.process_all_available(timeout=300)
        assert cl.process_all_available(timeout=300)
        want_wc, want_win, want_pages = H.wordcount_reference(k), H.windowed_reference(k), H.pages_reference(k)
        assert native.store_dict("counts") == want_wc
        assert native.store_dict("clicks-per-window") == want_win
        assert native.store_dict("pages") == want_pages
        assert H.as_dict(cl.query_all("counts")) == want_wc
        assert H.as_dict(cl.query_all("clicks-per-window")) == want_win
        assert rec["batch_running"], rec                       # the JVM died mid-batch
        # the restart loaded every state partition from the checkpoint (Spark's own metrics)
        r = native.restore_report()
        assert r["rocksdbNumLoadedFromDfs"] == 2, r
        assert r["rocksdbLoadLatencyMs"] is not None and r["rocksdbLoadLatencyMs"] > 0, r
        sm = native.state_metrics()
        assert {"numRowsTotal", "memoryUsedBytes", "commitTimeMs", "rocksdbNumReplayChangelogFiles"} <= set(sm.columns)
        meta = native.state_metadata()
        assert meta.operatorName.iloc[0] == "transformWithStateInPandasExec"
    finally:
        cl.stop()
        native.stop()
        k.close()


def _replay_after_restart(bootstrap, kafka, tmp_path, name, min_deltas, chunks):
    """Run `chunks` (one micro-batch each), wait for the maintenance thread to upload, crash
    (query mode: abort + unload + wipe local dirs), restart on one more chunk. Returns (restore
    metrics of the first batch, changelog lag on disk at the crash, state)."""
    from statekit.engine.spark_native import NativeApp

    app = NativeApp(name, bootstrap=bootstrap, partitions=1, state_dir=str(tmp_path / name),
                    min_deltas_for_snapshot=min_deltas, maintenance_interval=1)
    app.stream(f"{name}-in").group_by_key().count(store="c")
    kafka.ensure_topic(f"{name}-in", 1)
    from statekit.engine.spark_native.engine import native_session, unload_state_stores

    # Spark starts its maintenance thread with the interval in force at the first store load of
    # the JVM: unloading every store restarts it with this app's 1 s
    unload_state_stores(native_session(min_deltas, maintenance_interval=1))
    try:
        app.start()
        for i, c in enumerate(chunks[:-1]):
            kafka.send(f"{name}-in", 0, [(f"k{j % 5}".encode(), b"x") for j in range(c)])
            app.process_all_available(timeout=300)          # one batch per chunk: one version each
        if min_deltas == 1:   # every version is due: the maintenance thread (1 s) uploads it
            def snapshotted():   # the last version too: an upload after the lag is read below
                df = app.changelog_lag()   # would leave fewer files to replay than it says
                return len(df) > 0 and int(df.changelog_lag.iloc[0]) == 0

            wait_until(snapshotted, 30, "the maintenance thread's snapshot of the last version")
        else:                 # nothing is due: that none comes is seen only by waiting 2 maintenance runs
            time.sleep(2.5)
        lag = app.changelog_lag()
        app.crash(mode="query", during_batch=False)
        kafka.send(f"{name}-in", 0, [(f"k{j % 5}".encode(), b"x") for j in range(chunks[-1])])
        app.restart()
        app.process_all_available(timeout=300)
        return app.restore_report(), lag, app.store_dict("c")
    finally:
        app.stop()


@pytest.mark.slow   # 21 s: `make test-native` and `make test-slow` run it, `make test` has no room
def test_snapshot_interval_changes_replay(native_broker, native_spark, tmp_path):
    from statekit.kafka import Kafka

    k = Kafka(native_broker.bootstrap)
    chunks = [5, 5, 5, 5, 5, 5, 5]       # 6 versions before the crash, 1 after
    try:
        often, lag_often, st1 = _replay_after_restart(native_broker.bootstrap, k, tmp_path, "snap1", 1, chunks)
        rarely, lag_rarely, st2 = _replay_after_restart(native_broker.bootstrap, k, tmp_path, "snap50", 50, chunks)
    finally:
        k.close()
    want = {f"k{i}": 7 for i in range(5)}
    assert st1 == want and st2 == want
    # on disk, 6 versions: minDeltasForSnapshot=1 snapshots every version (the maintenance thread
    # uploads it within a second), =50 leaves every version after the first snapshot as changelog
    assert len(lag_rarely) == 1 == len(lag_often)      # one state partition: partitions=1
    assert int(lag_rarely.latest_version.iloc[0]) == 6 == int(lag_often.latest_version.iloc[0])
    assert int(lag_often.changelog_lag.iloc[0]) <= 1
    assert int(lag_rarely.changelog_lag.iloc[0]) >= 4
    # Spark's own restore metrics agree: files replayed = changelog versions since the snapshot
    assert rarely["rocksdbNumReplayChangelogFiles"] == int(lag_rarely.changelog_lag.iloc[0]), (rarely, lag_rarely)
    assert often["rocksdbNumReplayChangelogFiles"] == int(lag_often.changelog_lag.iloc[0]), (often, lag_often)
    assert rarely["rocksdbNumReplayChangelogFiles"] > often["rocksdbNumReplayChangelogFiles"]
    assert rarely["rocksdbNumLoadedFromDfs"] == 1 and often["rocksdbNumLoadedFromDfs"] == 1
