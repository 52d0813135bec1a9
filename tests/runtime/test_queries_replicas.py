"""Issue 19 on the ``executors`` placement: the driver's query replicas are the copies queries read,
under the same rules. A replica behind its changelog is never read as current: ``stale=False``
refuses in one line (at once when the replica is paused: waiting cannot help), ``stale=True``
answers with the replica's lag, ``key_owner`` and ``query_all`` say the same.

The router over query replicas is checked fast, without Spark, on replicas of an instances app's
changelogs; the whole placement on a local Spark session (slow: a minute on a shared machine)."""
from __future__ import annotations

import os
import time

import pytest

import statekit
from harness import unique
from statekit.errors import StaleRead
from statekit.partition import partition_for
from statekit.runtime import query_replicas


def send_words(kafka, topic, words, parts=2):
    by_p: dict = {}
    for w in words:
        by_p.setdefault(partition_for(w.encode(), parts), []).append((w.encode(), b"1"))
    for p, recs in sorted(by_p.items()):
        kafka.send(topic, p, recs)


def test_the_replica_router_refuses_a_replica_behind_and_says_its_lag(shared_broker, kafka,
                                                                     tmp_path):
    lines = unique("lines")
    kafka.ensure_topic(lines, 2)
    app = statekit.App(unique("qrr"), bootstrap=shared_broker.bootstrap, partitions=2,
                       state_dir=str(tmp_path / "st"), engine="local")
    app.stream(lines).group_by_key().count(store="counts")
    words = [f"w{i}" for i in range(40)]
    reps = query_replicas.QueryReplicas(app.name, app.subplans, 2, str(tmp_path / "replicas"),
                                        shared_broker.bootstrap, poll_ms=20)
    router = None
    try:
        send_words(kafka, lines, words * 2)
        app.start()
        assert app.process_all_available(timeout=60)
        reps.start()
        owners = dict(app.assignment.active)
        router = query_replicas.ReplicaQueryRouter(app, reps, owners.get, wait_s=10)
        assert router.get("counts", "w1") == 2          # waits for the replica to catch up
        owner = router.key_owner("counts", "w1")
        assert (owner.role, owner.state, owner.lag) == ("query-replica", "tailing", 0)
        assert owner.instance == owners[owner.task]
        assert owner.state_dir == os.path.join(str(tmp_path / "replicas"), app.name, str(owner.task))
        reps.pause(True)
        send_words(kafka, lines, words)
        assert app.process_all_available(timeout=60)
        t0 = time.monotonic()
        with pytest.raises(StaleRead) as ei:
            router.get("counts", "w1")
        assert time.monotonic() - t0 < 1.0, "a paused replica is refused at once"
        e = ei.value
        assert "\n" not in str(e) and e.state == "paused" and e.lag > 0 and e.task == owner.task
        a = router.get("counts", "w1", stale=True, with_lag=True)
        assert (a.value, a.role, a.current, a.lag) == (2, "query-replica", False, e.lag)
        df = router.all("counts", stale=True)
        assert set(df.state) == {"paused"} and (df.lag > 0).all() and set(df.value) == {2}
        assert list(df.columns) == ["key", "value", "task", "instance", "role", "state", "lag",
                                    "lag_s"]
        reps.pause(False)
        assert router.get("counts", "w1", wait=30) == 3
        assert router.key_owner("counts", "w1").lag == 0
    finally:
        if router is not None:
            router.close()
        reps.close()
        app.stop()


@pytest.mark.spark
@pytest.mark.slow
def test_query_replicas_say_how_far_behind_they_are(shared_broker, kafka, tmp_path, spark_session):
    lines = unique("lines")
    kafka.ensure_topic(lines, 2)
    app = statekit.App(unique("qrep"), bootstrap=shared_broker.bootstrap, partitions=2,
                       state_dir=str(tmp_path / "st"), placement="executors")
    app.stream(lines).group_by_key().count(store="counts")
    words = [f"w{i}" for i in range(40)]
    try:
        send_words(kafka, lines, words * 2)
        app.start()
        assert app.process_all_available(timeout=180)
        owner = app.key_owner("counts", "w1")
        assert isinstance(owner, query_replicas.ReplicaKeyOwner)
        assert (owner.role, owner.state, owner.lag, owner.lag_s) == ("query-replica", "tailing", 0, 0.0)
        assert owner.instance == app.assignment.active[owner.task]   # the executor it mirrors
        a = app.query("counts", "w1", with_lag=True)
        assert (a.value, a.role, a.current, a.copy.instance) == (2, "query-replica", True, None)

        app.pause_standbys()
        send_words(kafka, lines, words)
        assert app.process_all_available(timeout=180)
        with pytest.raises(StaleRead) as ei:
            app.query("counts", "w1")                 # paused: refused at once, not after 30 s
        e = ei.value
        msg = str(e)
        assert "\n" not in msg and f"task {owner.task}" in msg and e.state == "paused"
        assert e.lag > 0 and f"{e.lag:,} changelog records" in msg and "resume_standbys()" in msg
        assert e.waited < 1.0
        a = app.query("counts", "w1", stale=True, with_lag=True)
        assert (a.value, a.role, a.current) == (2, "query-replica", False) and a.lag == e.lag
        assert a.copy.state == "paused" and a.lag_s is not None
        df = app.query_all("counts", stale=True)
        assert set(df.state) == {"paused"} and (df.lag > 0).all() and set(df.value) == {2}
        assert app.key_owner("counts", "w1").lag == e.lag

        app.resume_standbys()
        assert app.process_all_available(timeout=180)
        assert app.query("counts", "w1") == 3
        assert app.key_owner("counts", "w1").lag == 0
        whole = app.query_all("counts")
        assert dict(zip(whole.key, whole.value)) == {w: 3 for w in words}
    finally:
        app.stop()
