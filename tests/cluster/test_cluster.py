"""The same topology on a real Spark standalone cluster (issues 14, 18): a master and two workers on
this machine, each with its own work and local directories, every port ephemeral; the word count and
the windowed count run with ``placement="auto"``, which picks the executors placement, with one
standby per task. While nothing fails each task opens once and stays on its executor, batch after
batch; an executor is killed mid-batch twice (state kept, then state lost) and its tasks reopen on
the other executor — from their standbys the first time. The stores, read through the driver's
query replicas, and the memory sink equal the plain-Python references, and every process of the
cluster is gone afterwards.

The scenario runs in a process of its own (tests/cluster/scenario.py): a process has one
SparkContext, and the other Spark tests keep a local one for the whole session."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.cluster

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 900


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _sweep(root: str) -> list:
    """Kill whatever the scenario left (it should be nothing); returns what was alive."""
    try:
        with open(os.path.join(root, "pids.json")) as f:
            pids = json.load(f)
    except (FileNotFoundError, ValueError):
        return []
    alive = [p for p in pids if _alive(p)]
    for p in alive:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cluster"))
    t0 = time.monotonic()
    with open(os.path.join(root, "scenario.stderr"), "wb") as err:
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "scenario.py"), root],
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
        try:
            proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            left = _sweep(root)
    try:
        with open(os.path.join(root, "result.json")) as f:
            res = json.load(f)
    except (FileNotFoundError, ValueError):
        res = {"exception": f"no result (exit {proc.returncode}); see {root}/scenario.stderr"}
    res["swept"] = left
    res["seconds"] = time.monotonic() - t0
    res["root"] = root
    print(f"cluster scenario: {res['seconds']:.0f}s, marks {res.get('marks')}")
    return res


def test_scenario_ran(result):
    assert "exception" not in result, result.get("exception")
    assert result["placement"] == "executors"
    assert len(result["executors_at_start"]) == 2
    assert {e["worker"] for e in result["executors_at_start"]} == {0, 1}


def test_the_clusters_jvms_run_with_the_drivers_lean_options(result):
    """The master, the workers and the executors share this machine's cores with everything
    else: serial GC, C1 only, and the class archive when make wrote it."""
    from statekit.engine.spark.session import built_class_archive

    archive = built_class_archive()
    jvms = result["cluster_jvms"]
    roles = {"deploy.master.Master": 0, "deploy.worker.Worker": 0,
             "executor.CoarseGrainedExecutorBackend": 0}
    for c in jvms:
        role = next((r for r in roles if f"org.apache.spark.{r} " in c + " "), None)
        if role is None or "launcher.Main" in c:   # spark-class's launcher, gone by now
            continue
        roles[role] += 1
        assert "-XX:TieredStopAtLevel=1" in c and "-XX:+UseSerialGC" in c, c[-400:]
        if archive:
            assert f"-XX:SharedArchiveFile={archive}" in c, c[-400:]
    assert roles == {"deploy.master.Master": 1, "deploy.worker.Worker": 2,
                     "executor.CoarseGrainedExecutorBackend": 2}, roles


def test_a_task_stays_open_on_its_executor_batch_after_batch(result):
    assert "exception" not in result, result.get("exception")
    steady = result["steady"]
    tasks = result["tasks"]
    opens: dict = {}
    for o in steady["opens"]:
        opens.setdefault(o["task"], []).append(o)
    # one open per task (RocksDB, producer and caches stay open between micro-batches), none closed
    assert sorted(opens) == sorted(tasks)
    assert all(len(v) == 1 for v in opens.values()), {t: len(v) for t, v in opens.items()}
    assert steady["closes"] == []
    for t in tasks:
        commits = [c for c in steady["commits"] if c["task"] == t]
        assert len({c["batch"] for c in commits}) >= 4, (t, len(commits))   # several batches
        # every batch of the task ran on the executor it opened on
        assert {c["instance"] for c in commits} == {opens[t][0]["instance"]}, (t, commits)
    # both executors ran tasks (Spark spread them), and each task's warm copy is on the other one
    assert len({o[0]["instance"] for o in opens.values()}) == 2
    assert result["standbys_ready"]
    for r in result["standbys"]:
        assert r["instance"] != opens[r["task"]][0]["instance"], r


def test_stores_and_output_equal_the_references(result):
    assert "exception" not in result, result.get("exception")
    assert result["after_steady"]["counts"] == result["after_steady"]["reference"]
    assert result["first_drain"] and result["last_drain"]
    assert result["state"] == "RUNNING" and result["error"] is None
    assert result["stores"]["counts"] == result["reference"]["counts"]
    assert result["stores"]["clicks-per-window"] == result["reference"]["clicks-per-window"]
    # the memory sink: each task's outputs of each batch once, counts only grow, the last = reference
    seen, last = set(), {}
    for batch, task, key, value in result["output"]:
        assert (batch, task, key, value) not in seen
        seen.add((batch, task, key, value))
        assert value > last.get(key, 0)
        last[key] = value
    assert sorted(last.items()) == [tuple(x) for x in result["reference"]["counts"]]
    # the driver's query replicas caught up; the actives' last commits are the changelog ends
    lag = result["lag"]
    assert {r["role"] for r in lag} == {"active", "query-replica"}
    assert all(r["lag"] == 0 for r in lag)


def test_executors_died_mid_batch_and_spark_replayed_the_batch(result):
    assert "exception" not in result, result.get("exception")
    crashes = result["crashes"]
    assert [c["mode"] for c in crashes] == ["executor", "disk-loss"]
    start_ids = {e["executor_id"] for e in result["executors_at_start"]}
    for c in crashes:
        claim = c["claim"]
        assert claim is not None, c
        assert claim["point"] == "records" and claim["records"] >= 1   # mid-batch
        assert c["drained"] and c["state"] == "RUNNING"                  # Spark retried the task
        # the batch the dead executor was running was committed afterwards, by a live executor
        commits = [e for e in result["commits"] if e["task"] == claim["task"] and
                   e["batch"] == claim["batch"]]
        assert len(commits) == 1, commits
        assert commits[0]["instance"] != claim["instance"]
        # the driver saw the executor go (the dashboard's instances)
        assert c["died"] is not None and c["died"]["instance"] == claim["instance"]
    # Spark replaced the lost executors: two executors at the end, new ids
    end_ids = {e["executor_id"] for e in result["executors_at_end"]}
    assert len(end_ids) == 2 and end_ids != start_ids
    frame = {r["instance"]: r["status"] for r in result["instances_frame"]}
    assert all(frame[c["claim"]["instance"]] == "dead" for c in crashes)
    assert sum(s == "alive" for s in frame.values()) == 2


def test_a_lost_executors_tasks_reopen_from_their_standbys(result):
    assert "exception" not in result, result.get("exception")
    first = result["crashes"][0]
    dead, ts = first["claim"]["instance"], first["claim"]["ts"]
    held = sorted(first["died"]["tasks"])
    # what it ran: its tasks' last commits before the crash
    last: dict = {}
    for c in result["commits"]:
        if c["ts"] < ts:
            last[c["task"]] = c["instance"]
    assert held == sorted(t for t, x in last.items() if x == dead) and held
    for t in held:
        after = [o for o in result["opens"] if o["task"] == t and o["ts"] > ts]
        assert after, t
        # the only other executor holds its standby: promoted, it replays only its lag
        assert after[0]["instance"] != dead and after[0]["source"] == "standby", after[0]
        assert any(p["task"] == t and p["instance"] == after[0]["instance"] and p["ts"] > ts
                   for p in result["promoted"]), t
    moves = [m for r in result["rebalances"] for m in r["moves"] if m["from"] == dead]
    assert sorted(m["task"] for m in moves) == held
    assert all(m["reason"] == "owner-died" for m in moves)


def test_the_dashboard_sees_executors_moves_and_restores(result):
    """The dashboard's own models, fed the app's events: each task's executor over time, the
    executors' deaths, and the restore round of the first kill with its promotions."""
    assert "exception" not in result, result.get("exception")
    from kernel_ext.dashboard.membership import OwnershipTimeline
    from kernel_ext.dashboard.restore import RestoreBoard
    from statekit import events as ev

    timeline, board = OwnershipTimeline(), RestoreBoard()
    for d in result["events"]:
        e = ev.from_dict(d)
        timeline.feed(e)
        board.feed(e)
    first = result["crashes"][0]
    dead = first["claim"]["instance"]
    for t in first["died"]["tasks"]:
        history = timeline.owner_history(t)
        assert dead in history and history[history.index(dead) + 1] != dead, (t, history)
    deaths = [m for m in timeline.markers if m.kind == "crash" and m.task is None]
    assert [m.label for m in deaths] == [f"instance {c['claim']['instance']} died"
                                         for c in result["crashes"]]
    rnd = next(r for r in board.rounds if set(first["died"]["tasks"]) <= set(r.rows))
    rows = [rnd.rows[t] for t in first["died"]["tasks"]]
    assert all(r.final and r.promoted == "standby" and r.instance != dead for r in rows), rows


def test_state_lives_on_the_executors_local_disks(result):
    assert "exception" not in result, result.get("exception")
    dirs = result["worker_task_dirs"]
    on_disk = {d.rsplit("/", 1)[1] for ds in dirs.values() for d in ds}
    assert on_disk == set(result["tasks"])
    assert all(d.startswith(result["scope"] + "/wc/") for ds in dirs.values() for d in ds)
    assert result["driver_executor_dirs"] == []          # nothing ran on the driver
    # the Spark checkpoint went where the App was told, not into the driver's state dir
    assert {"commits", "offsets", "state"} <= set(result["checkpoint"])
    assert result["driver_checkpoint"] is False
    executors = {e["instance"] for e in result["commits"]}
    assert len(executors) >= 3                           # two at the start, and replacements
    owner = result["owner"]
    assert owner[2] == "query-replica"


def test_every_process_is_stopped(result):
    assert result.get("left_running") == []
    assert result["swept"] == []
    assert result.get("app_stopped_state") == "NOT_RUNNING"
