"""Where tasks run and which Spark session runs them: ``App(spark=an_existing_session)`` uses that
session and leaves it running; ``placement="executors"`` (tasks in Spark's Python workers, state on
the executors' disks, queries on the driver's query replicas) on a local session, exact across a
crash; the refusals of that placement. The same placement on a real standalone cluster is
tests/cluster."""
from __future__ import annotations

import collections
import os
import random

import pytest

import harness as H
from harness import unique
import statekit
from statekit import events as ev
from statekit.contracts import TaskId
from statekit.errors import StatekitError
from statekit.runtime.coordinator import MembershipError
from statekit.runtime.lifecycle import AppState
from statekit.runtime.placement import PlacementError, prepare, resolve_placement
from statekit.runtime.query_replicas import StaleRead


def one_line(err) -> str:
    s = str(err)
    assert s and "\n" not in s and "Traceback" not in s, s
    return s


# -- the user's session ------------------------------------------------------------------------------

@pytest.mark.spark
def test_app_uses_the_session_it_is_given_and_leaves_it_running(shared_broker, kafka, tmp_path,
                                                                spark_session):
    mine = spark_session.newSession()       # the user's session: its own SQL conf and queries
    mine.conf.set("spark.sql.shuffle.partitions", "7")
    mine.conf.set("spark.sql.adaptive.enabled", "true")
    topic = unique("lines")
    kafka.ensure_topic(topic, 3)                 # a task reads its own partition of each source
    lines = ["the user owns this session", "the app borrows it"]
    for i, ln in enumerate(lines):
        kafka.send(topic, i % 3, [(None, ln.encode())])
    app = statekit.App(unique("own"), bootstrap=shared_broker.bootstrap, partitions=3,
                       state_dir=str(tmp_path / "st"), spark=mine)
    app.stream(topic).flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
    before = {q.id for q in spark_session.streams.active}
    try:
        app.start()
        assert app.placement == "instances"          # a local master
        assert app.process_all_available(timeout=120)
        ours = [q for q in mine.streams.active if q.name == app.name]
        assert len(ours) == 1                        # the query runs on the given session ...
        assert {q.id for q in spark_session.streams.active} == before   # ... not on another one
        assert app._get_engine().session() is mine
        assert H.store_as_dict(app, "counts") == dict(collections.Counter(
            w for ln in lines for w in ln.split()))
        # the user's settings are as they were, while the query runs
        assert mine.conf.get("spark.sql.shuffle.partitions") == "7"
        assert mine.conf.get("spark.sql.adaptive.enabled") == "true"
    finally:
        app.stop()
    assert app.state == AppState.NOT_RUNNING
    assert not [q for q in mine.streams.active if q.name == app.name]
    assert mine.sparkContext._jsc is not None        # still running, and usable
    assert mine.range(5).count() == 5
    assert mine.conf.get("spark.sql.shuffle.partitions") == "7"


def test_a_session_cannot_go_with_the_local_engine(tmp_path):
    class Fake:
        pass

    with pytest.raises(StatekitError) as ei:
        statekit.App("x", bootstrap="127.0.0.1:1", state_dir=str(tmp_path), engine="local", spark=Fake())
    assert "engine='changelog'" in one_line(ei.value)


# -- the executors placement on a local session -------------------------------------------------------

@pytest.mark.slow     # 40 s: `make test-slow`; `make test-cluster` runs this placement on a cluster
@pytest.mark.spark
def test_executors_placement_is_exact_across_a_disk_loss_and_queries_read_replicas(
        shared_broker, kafka, tmp_path, spark_session):
    lines, clicks = unique("lines"), unique("clicks")
    kafka.ensure_topic(lines, 3)
    kafka.ensure_topic(clicks, 3)
    app = statekit.App(unique("exe"), bootstrap=shared_broker.bootstrap, partitions=3,
                       state_dir=str(tmp_path / "st"), placement="executors", cache_bytes=2048)
    (app.stream(lines).flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
     .to_stream().to("counts-out", value_serde="int64"))
    (app.stream(clicks).group_by_key().windowed_by(statekit.topology.tumbling(H.WINDOW_MS),
                                                    grace_ms=10 ** 9).count(store="clicks-per-window"))
    rnd = random.Random(5)
    chunks = H.make_chunks(5, 3, lines_per_chunk=10, clicks_per_chunk=12)

    def exact():
        assert H.store_as_dict(app, "counts") == H.wordcount_reference(kafka, lines)
        assert H.store_as_dict(app, "clicks-per-window") == H.windowed_reference(kafka, clicks)
        out = app.output()
        assert not out.duplicated(["batch", "task", "key", "value"]).any()
        last = {}
        for key, value in zip(out.key, out.value):
            last[key] = value
        assert last == H.wordcount_reference(kafka, lines)

    try:
        H.produce_chunk(kafka, chunks[0], lines_topic=lines, clicks_topic=clicks, rnd=rnd)
        app.start()
        assert app.placement == "executors"
        assert app.process_all_available(timeout=180)
        exact()
        # the tasks ran in this session's Python workers, with their state under the app's state dir
        # (the word count repartitions by word: the count is sub-topology 1's, beside the lines'
        # stateless part and the click count in sub-topology 0)
        tasks = sorted(str(t) for t in app.tasks())
        assert tasks == ["0_0", "0_1", "0_2", "1_0", "1_1", "1_2"]
        root = os.path.join(app.state_dir, "executors", app._placement_extra["scope"], app.name)
        assert sorted(os.listdir(root)) == tasks
        first = app.task_opens().drop_duplicates("task", keep="first")   # later opens find it there
        assert sorted(first.task) == tasks and set(first.source) == {"scratch"}
        # queries are answered by the driver's query replicas, caught up
        owner = app.key_owner("counts", "the")
        assert owner.role == "query-replica" and owner.lag == 0
        assert owner.state_dir == os.path.join(app.state_dir, "query-replicas", app.name, str(owner.task))
        lag = app.lag()
        assert set(lag.role) == {"active", "query-replica"}
        assert (lag.lag == 0).all() and len(lag) == 3 * 2 * 2   # tasks x stores x (active, replica)

        # membership belongs to Spark here: refused, one line each
        for call in (lambda: app.kill(0), lambda: app.revive(0), app.add_instance,
                     lambda: app.remove_instance(0), lambda: app.scale(2)):
            with pytest.raises(MembershipError) as ei:
                call()
            assert "Spark places the tasks" in one_line(ei.value)

        # a disk loss in the middle of a commit: changelog acknowledged, RocksDB not written
        crash = app.crash("disk-loss", after_records=None, point="after_ack")
        assert crash["status"] == "pending" and crash["placement"] == "executors"
        H.produce_chunk(kafka, chunks[1], lines_topic=lines, clicks_topic=clicks, rnd=rnd)
        with pytest.raises(StatekitError):
            app.process_all_available(timeout=180)   # local Spark does not retry a task
        assert app.wait_for_state([AppState.ERROR], 30) == AppState.ERROR
        claimed = app.wait_for_event(lambda e: isinstance(e, ev.Crashed), 30)
        assert claimed is not None and claimed.point == "after_ack" and claimed.mode == "disk-loss"
        # the crashed task's state went with the disk (on a local master the driver's other Python
        # workers may still write their tasks' directories: they are not the executor that died)
        assert not os.path.exists(os.path.join(root, claimed.task))
        app.restart()
        assert app.process_all_available(timeout=180)
        exact()                                   # the replayed batch counted once
        reopened = app.task_opens().drop_duplicates("task", keep="first")   # since the restart
        assert sorted(reopened.task) == tasks
        again = reopened[reopened.task == claimed.task].iloc[0]
        assert again.source == "scratch" and again.restored > 0

        # paused query replicas: queries say they are stale; stale=True answers what they have
        app.pause_standbys()
        word = "the"
        had = app.query("counts", word, stale=True)
        H.produce_chunk(kafka, ([f"{word} {word}"] * 4, []), lines_topic=lines, clicks_topic=clicks,
                        rnd=rnd, sends=1)
        assert app.process_all_available(timeout=180)
        with pytest.raises(StaleRead) as ei:
            app.query("counts", word)
        assert "paused" in one_line(ei.value)
        assert app.query("counts", word, stale=True) == had
        lag = app.lag()
        t = str(app.key_owner("counts", word).task)
        rep = lag[(lag.task == t) & (lag.store == "counts") & (lag.role == "query-replica")].iloc[0]
        act = lag[(lag.task == t) & (lag.store == "counts") & (lag.role == "active")].iloc[0]
        assert act.lag == 0 and act.checkpoint_offset == rep.changelog_end
        assert rep.lag == rep.changelog_end - rep.checkpoint_offset and rep.lag > 0
        app.resume_standbys()
        assert app.process_all_available(timeout=180)
        assert app.query("counts", word) == had + 8
        exact()

        # stop and start again: the same executors' directories (the deployment id is kept), the
        # query replicas resume from what they applied, the Spark checkpoint from its last batch
        gen = app.generation
        app.stop()
        app.start()
        assert app.generation == gen + 1
        H.produce_chunk(kafka, chunks[2], lines_topic=lines, clicks_topic=clicks, rnd=rnd)
        assert app.process_all_available(timeout=180)
        exact()
        opens = app.task_opens(since_generation=gen + 1).drop_duplicates("task", keep="first")
        assert len(opens) and set(opens.source) == {"checkpoint"} and (opens.restored == 0).all()
    finally:
        app.stop()


# -- choices and refusals (no Spark) ------------------------------------------------------------------

def test_auto_placement_follows_the_master_and_bad_values_are_refused(tmp_path):
    assert resolve_placement("auto", engine="changelog", master="local[2]") == "instances"
    assert resolve_placement("auto", engine="changelog", master="spark://h:7077") == "executors"
    assert resolve_placement("auto", engine="local", master=None) == "instances"
    assert resolve_placement("instances", engine="changelog", master="spark://h:7077") == "instances"
    with pytest.raises(PlacementError) as ei:
        resolve_placement("executors", engine="local", master=None)
    assert "engine='changelog'" in one_line(ei.value)
    with pytest.raises(StatekitError) as ei:
        statekit.App("x", bootstrap="127.0.0.1:1", state_dir=str(tmp_path), placement="cluster")
    assert "auto, instances, executors" in one_line(ei.value)


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, k, default=None):
        return self.values.get(k, default)


class _FakeSpark:
    def __init__(self, **conf):
        self.conf = _Conf(conf)


def test_what_the_executors_placement_needs_on_a_cluster(tmp_path, monkeypatch):
    from statekit.contracts import Layout
    from statekit.engine.spark import cluster

    layout = Layout(str(tmp_path / "st"), "app")
    kw = dict(placement="executors", master="spark://h:7077", layout=layout, bootstrap="b:1",
              sink="kafka", executor_state_dir=None)
    with pytest.raises(PlacementError) as ei:
        prepare(spark=_FakeSpark(), checkpoint_location=None, **kw)
    assert "checkpoint_location=" in one_line(ei.value)
    with pytest.raises(PlacementError) as ei:
        prepare(spark=_FakeSpark(**{"spark.speculation": "true"}), checkpoint_location="s3a://b/c", **kw)
    assert "spark.speculation=false" in one_line(ei.value)

    seen = {}
    monkeypatch.setattr(cluster, "check_shared", lambda spark, paths: {k: seen.get(k) for k in paths})
    seen.update(checkpoint="executor 1 on host-b", control=None)
    with pytest.raises(PlacementError) as ei:
        prepare(spark=_FakeSpark(), checkpoint_location="/mnt/ckpt", **kw)
    assert "/mnt/ckpt is not visible from executor 1 on host-b" in one_line(ei.value)
    seen.update(checkpoint=None, control="executor 0 on host-a")
    with pytest.raises(PlacementError) as ei:
        prepare(spark=_FakeSpark(), checkpoint_location="/mnt/ckpt", **dict(kw, sink="memory"))
    assert "use sink='kafka'" in one_line(ei.value)
    got = prepare(spark=_FakeSpark(), checkpoint_location="/mnt/ckpt", **kw)   # sink=kafka is fine
    assert got["placement"] == "executors" and got["control_shared"] is False
    assert got["executor_state_dir"] is None and len(got["scope"]) == 8
    # the deployment id is kept in the state dir: same scope on the next start, a new one after reset
    assert prepare(spark=_FakeSpark(), checkpoint_location="/mnt/ckpt", **kw)["scope"] == got["scope"]
    os.unlink(os.path.join(layout.root, "deployment"))
    assert prepare(spark=_FakeSpark(), checkpoint_location="/mnt/ckpt", **kw)["scope"] != got["scope"]


def test_instances_on_a_cluster_need_every_executor_on_this_machine(tmp_path, monkeypatch):
    import socket

    from statekit.contracts import Layout
    from statekit.engine.spark import cluster

    kw = dict(placement="instances", spark=_FakeSpark(), master="spark://h:7077",
              layout=Layout(str(tmp_path), "app"), bootstrap="b:1", sink="memory",
              checkpoint_location=None, executor_state_dir=None)
    monkeypatch.setattr(cluster, "executor_hosts", lambda spark: {socket.gethostname()})
    assert prepare(**kw) == {"placement": "instances"}      # a one-machine cluster
    monkeypatch.setattr(cluster, "executor_hosts", lambda spark: {socket.gethostname(), "host-b"})
    with pytest.raises(PlacementError) as ei:
        prepare(**kw)
    assert "executors run on host-b: use placement='executors'" in one_line(ei.value)


def test_checkpoint_location_holds_the_engine_checkpoint_and_reset_deletes_it(shared_broker, kafka,
                                                                               tmp_path):
    topic = unique("lines")
    kafka.ensure_topic(topic, 2)
    kafka.send(topic, 0, [(None, b"a b a")])
    ckpt = tmp_path / "shared" / "ckpt"
    app = statekit.App(unique("ck"), bootstrap=shared_broker.bootstrap, partitions=2, engine="local",
                       state_dir=str(tmp_path / "st"), checkpoint_location=f"file://{ckpt}")
    app.stream(topic).flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
    try:
        app.start()
        assert app.process_all_available(timeout=120)
        assert app.runs[0].checkpoint_dir == str(ckpt / "0")
        assert H.store_as_dict(app, "counts") == {"a": 2, "b": 1}
    finally:
        app.stop()
    assert os.listdir(ckpt / "0")                        # the engine's offset and commit logs
    assert not os.path.exists(app.layout.checkpoint_dir(0))
    app.reset()
    assert not os.path.exists(ckpt / "0")


def test_crash_without_a_shared_control_dir_is_refused_in_one_line(tmp_path):
    from statekit.contracts import Layout
    from statekit.runtime.placement import ExecutorsCoordinator
    from statekit.worker.task import WorkerSpec

    spec = WorkerSpec(application="a", bootstrap="b:1", plans={}, partitions=2,
                      control_dir=str(tmp_path / "control"))
    co = ExecutorsCoordinator(application="a", layout=Layout(str(tmp_path), "a"), spec=spec,
                              tasks=[TaskId(0, 0)], extra={"control_shared": False},
                              publish=lambda e: None, subscribe=lambda cb: None,
                              unsubscribe=lambda cb: None)
    with pytest.raises(StatekitError) as ei:
        co.crash_directive("executor", None, 3, "records")
    assert "shared file system" in one_line(ei.value)
    with pytest.raises(StatekitError) as ei:
        co.crash_directive("reboot", None, 3, "records")
    assert "process, executor, disk-loss" in one_line(ei.value)


def test_executor_state_root_order(monkeypatch, tmp_path):
    from statekit.engine.spark.executors import STATE_DIR_ENV, state_root

    monkeypatch.delenv(STATE_DIR_ENV, raising=False)
    local = tmp_path / "w1" / "local"
    spark_dirs = (local / "spark-f76942ad-3a00-4b5d-889c-75e8290889b7" /
                  "executor-e0772c99-8771-4686-b0d4-9ffe47967211" /
                  "blockmgr-da3da1eb-52bb-4b88-b556-a823c419495b")
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{spark_dirs},/other")
    assert state_root() == str(local / "statekit")          # outlives the Spark application
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "env"))
    assert state_root() == str(tmp_path / "env")
    assert state_root(str(tmp_path / "given")) == str(tmp_path / "given")


def test_session_master_choice(monkeypatch):
    from statekit.engine.spark.session import MASTER_ENV, is_local_master, resolve_master

    monkeypatch.delenv(MASTER_ENV, raising=False)
    assert resolve_master() == "local[2]"
    monkeypatch.setenv(MASTER_ENV, "spark://h:7077")
    assert resolve_master() == "spark://h:7077"
    assert resolve_master("local[4]") == "local[4]"
    assert is_local_master("local[2,3]") and not is_local_master("spark://h:7077")
    assert not is_local_master("yarn")


def test_moves_the_commits_show_are_a_new_generation(tmp_path):
    """Spark moving a task to another executor is a new assignment: the Rebalance event that
    announces it carries the next generation (notebook 13's dashboard kept generation 1 after the
    moves)."""
    from statekit.contracts import Layout
    from statekit.runtime.placement import ExecutorsCoordinator
    from statekit.worker.task import WorkerSpec

    spec = WorkerSpec(application="a", bootstrap="b:1", plans={}, partitions=2,
                      control_dir=str(tmp_path / "control"))
    out = []
    co = ExecutorsCoordinator(application="a", layout=Layout(str(tmp_path), "a"), spec=spec,
                              tasks=[TaskId(0, 0), TaskId(0, 1)], extra={}, generation=1,
                              publish=out.append, subscribe=lambda cb: None, unsubscribe=lambda cb: None)
    co.stopped = False
    for task, inst in (("0_0", 1), ("0_1", 2)):
        co._on_event(ev.Committed(task=task, instance=inst, batch=0, offsets={"c": 3}))
    co._announce_moves()
    assert [(type(e).__name__, e.generation, e.moves) for e in out] == [("Rebalance", 1, [])]
    co._on_event(ev.Committed(task="0_0", instance=2, batch=1, offsets={"c": 5}))
    co._announce_moves()
    co._announce_moves()    # nothing moved since: no event, no generation
    assert [(e.generation, [m["task"] for m in e.moves]) for e in out[1:]] == [(2, ["0_0"])]
    assert co.generation == 2 and co.assignment.generation == 2
