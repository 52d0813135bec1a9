"""A Python worker's resident tasks and standbys (``engine.spark.resident``), without Spark: two
``Resident`` objects with their own state roots stand for two executors. A task stays open across
batches; a copy another executor committed past is never used; standbys follow the driver's plan
and are promoted; a plan that says stopped closes everything; a directory another worker process
holds is released on request."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from statekit import events as ev
from statekit.contracts import TaskId
from statekit.engine.spark.resident import Resident, placement_topic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK = TaskId(0, 0)


def unique(prefix: str) -> str:
    return f"{prefix}{time.monotonic_ns() % 10 ** 9}"


def _plan(topic: str):
    from statekit.topology import TopologyBuilder

    b = TopologyBuilder()
    b.stream(topic).group_by_key().count(store="counts")
    return b.compile()


class Executor:
    """A ``Resident`` with its own state root and executor number; events go to ``self.events``."""

    def __init__(self, run, root: str, number: int):
        self.r = Resident(background=False)     # the test calls tick() itself
        self.app = self.r.app_for(run, root, str(number))
        self.events: list = []
        self.app.publish = self.events.append
        from statekit.kafka import Kafka

        self.kafka = Kafka(run.bootstrap)

    def batch(self, b: int, ranges) -> int:
        return self.r.run_batch(self.app, TASK, b, ranges, self.kafka)

    def of(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    def close(self):
        self.r._close_app(self.app, "stopped")
        self.kafka.close()


@pytest.fixture
def setup(shared_broker, kafka, tmp_path):
    from statekit.worker.task import WorkerSpec

    app = unique("res")
    topic = unique("words")
    kafka.ensure_topic(topic, 1)
    spec = WorkerSpec(application=app, bootstrap=shared_broker.bootstrap, plans={0: _plan(topic)},
                      partitions=1, control_dir=str(tmp_path / "control"), sink="none")
    run = SimpleNamespace(app=app, bootstrap=shared_broker.bootstrap, events=True,
                          extra={"worker_spec": spec, "run_id": "r1", "generation": 1})
    pos = [0]

    def produce(words: list) -> list:
        """Append words; the ranges of a batch holding them."""
        kafka.send(topic, 0, [(w.encode(), w.encode()) for w in words])
        start, pos[0] = pos[0], pos[0] + len(words)
        return [(topic, 0, start, pos[0])]

    made: list = []

    def executor(number: int) -> Executor:
        x = Executor(run, str(tmp_path / f"executor-{number}"), number)
        made.append(x)
        return x

    yield SimpleNamespace(app=app, topic=topic, run=run, produce=produce, executor=executor,
                          kafka=kafka)
    for x in made:
        x.close()


def test_a_task_stays_open_across_batches(setup):
    a = setup.executor(1)
    for b in range(5):
        a.batch(b, setup.produce(["x", "y", "x"]))
    assert len(a.of(ev.TaskOpened)) == 1
    assert a.of(ev.TaskClosed) == []
    assert [e.batch for e in a.of(ev.Committed)] == [0, 1, 2, 3, 4]
    assert a.r.open_tasks() == [str(TASK)]
    # a replay of a committed batch (Spark's retry) is skipped on the same open copy
    a.batch(4, [(setup.topic, 0, 12, 15)])
    assert len(a.of(ev.TaskOpened)) == 1 and len(a.of(ev.BatchSkipped)) == 1


def test_a_copy_another_executor_committed_past_is_reopened(setup):
    a, b = setup.executor(1), setup.executor(2)
    for i in range(3):
        a.batch(i, setup.produce(["x"]))
    b.batch(3, setup.produce(["x", "y"]))         # the task ran elsewhere for a batch
    assert b.of(ev.TaskOpened)[0].restored > 0    # ... restored there from the changelog
    a.batch(4, setup.produce(["y"]))              # back: a's copy is behind
    closed = a.of(ev.TaskClosed)
    assert [c.reason for c in closed] == ["stale"]
    opened = a.of(ev.TaskOpened)
    assert len(opened) == 2 and opened[1].restored > 0   # replayed what b committed
    # the same batch id again where the other executor committed it after a's last commit (a
    # retry after an attempt whose success was lost): a's copy is at b-1 but must not be used
    five = setup.produce(["z"])
    b.batch(5, five)
    a.batch(5, five)
    assert [c.reason for c in a.of(ev.TaskClosed)] == ["stale", "stale"]
    assert a.of(ev.BatchSkipped)[-1].batch == 5          # reopened: it knows 5 is applied
    a.batch(6, setup.produce(["x"]))
    got = dict(_store_items(a))
    assert got == {"x": 5, "y": 2, "z": 1}


def _store_items(x: Executor):
    import struct

    ent = x.r.tasks[(x.app.root, x.app.app, TASK)]
    for k, v in ent.task.state.stores["counts"].all():
        yield (k.decode() if isinstance(k, bytes) else k,
               struct.unpack(">q", v)[0] if isinstance(v, bytes) else v)


def _send_plan(setup, **body):
    setup.kafka.ensure_topic(placement_topic(setup.app), 1)
    body = {"run": "r1", "generation": 1, "stopped": False, "active": {}, "standbys": {}, **body}
    setup.kafka.send(placement_topic(setup.app), 0, [(b"plan", json.dumps(body).encode())])


def _until(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_standbys_follow_the_plan_and_a_promoted_one_replays_only_its_lag(setup):
    a, b = setup.executor(1), setup.executor(2)
    a.batch(0, setup.produce(["x", "y"]))
    _send_plan(setup, active={str(TASK): [1, 0]}, standbys={str(TASK): [2]})
    b.r.tick()
    assert b.r.open_standbys() == [str(TASK)]
    assert [e.role for e in b.of(ev.ReplicaStarted)] == ["standby"]
    a.r.tick()                                    # the active's executor opens no standby
    assert a.r.open_standbys() == []
    for i in range(1, 4):
        a.batch(i, setup.produce(["x"]))
    sb = b.r.standbys[(b.app.root, b.app.app, TASK)][0]
    _until(lambda: sb.lag() == 0)
    b.batch(4, setup.produce(["y"]))              # the executor with the standby takes over
    promoted = b.of(ev.StandbyPromoted)
    assert len(promoted) == 1 and promoted[0].lag == 0
    opened = b.of(ev.TaskOpened)
    assert len(opened) == 1 and opened[0].source == "standby" and opened[0].restored == 0
    assert b.r.open_standbys() == [] and b.r.open_tasks() == [str(TASK)]
    assert dict(_store_items(b)) == {"x": 4, "y": 2}
    # the plan moves the standby away: closed
    _send_plan(setup, active={str(TASK): [2, 4]}, standbys={str(TASK): [1]})
    b.r.tick()
    assert b.r.open_standbys() == []
    # a's stale copy is closed when the plan says another executor committed past it
    a.r.tick()
    assert [c.reason for c in a.of(ev.TaskClosed)] == ["moved"]
    assert a.r.open_standbys() == [str(TASK)]     # ... and it becomes the standby
    # the run stops: everything of it closes
    _send_plan(setup, stopped=True)
    a.r.tick()
    b.r.tick()
    assert a.r.open_standbys() == [] and b.r.open_tasks() == []
    assert b.of(ev.TaskClosed)[-1].reason == "stopped"


_HOLDER = textwrap.dedent("""
    import sys, time, json
    from types import SimpleNamespace
    sys.path.insert(0, {root!r})
    from statekit.contracts import TaskId
    from statekit.engine.spark.resident import Resident
    from statekit.kafka import Kafka
    from statekit.topology import TopologyBuilder
    from statekit.worker.task import WorkerSpec
    b = TopologyBuilder()
    b.stream({topic!r}).group_by_key().count(store="counts")
    spec = WorkerSpec(application={app!r}, bootstrap={bootstrap!r}, plans={{0: b.compile()}},
                      partitions=1, control_dir={control!r}, sink="none")
    run = SimpleNamespace(app={app!r}, bootstrap={bootstrap!r}, events=False,
                          extra={{"worker_spec": spec, "run_id": "r1", "generation": 1}})
    r = Resident()
    app = r.app_for(run, {state!r}, "1")
    k = Kafka({bootstrap!r})
    r.run_batch(app, TaskId(0, 0), 0, [({topic!r}, 0, 0, 2)], k)
    print("open", flush=True)
    while r.open_tasks():
        time.sleep(0.05)
    print("released", flush=True)
""")


def test_a_directory_another_worker_holds_is_released_on_request(setup, tmp_path):
    setup.produce(["x", "y"])
    state = str(tmp_path / "executor-1")
    code = _HOLDER.format(root=ROOT, topic=setup.topic, app=setup.app,
                          bootstrap=setup.run.bootstrap, control=str(tmp_path / "control"),
                          state=state)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        a = Executor(setup.run, state, 1)             # another Python worker of that executor
        a.batch(1, setup.produce(["x"]))               # waits for the holder to let go
        assert holder.stdout.readline().strip() == "released"
        opened = a.of(ev.TaskOpened)
        assert len(opened) == 1 and opened[0].restored == 0 and opened[0].last_batch == 0
        assert dict(_store_items(a)) == {"x": 2, "y": 1}
        a.close()
    finally:
        holder.kill()
        holder.wait()
