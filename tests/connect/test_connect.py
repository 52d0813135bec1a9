"""statekit on a Spark Connect server (issue 28), started by the test from pyspark's own files on an
ephemeral port and stopped after it, every process it started included:

- for each placement (``instances``, ``executors``), an application with a join and a windowed
  aggregate through a disk-loss crash and a process crash in the middle of a batch, ``restart()``
  and ``query()``: exact stores, exactly-once Kafka output read back read_committed, and on
  ``executors`` (the server's local master does not retry a task) one line for each failure, the
  line a classic session says (tests/connect/scenario.py, in a process of its own);
- the helper processes the server started for the application are gone once it stopped: what
  remains runs under the server's shared ``default`` pool;
- the magics in a real Jupyter kernel: ``%statekit up --master sc://...``, an app cell, start,
  crash, restart, query, down.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from alone import run_alone

pytestmark = pytest.mark.connect

HERE = os.path.dirname(os.path.abspath(__file__))
CLASSIC_LINE = "a Spark Python worker died mid-batch (killed or crashed); restart the query to replay the batch"


def _env(tmp_path) -> dict:
    env = dict(os.environ, STATEKIT_HOME=str(tmp_path / "home"))
    for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_API_MODE", "STATEKIT_SPARK_MASTER"):
        env.pop(k, None)
    return env


def _artifact_id(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"SPARK_JOB_ARTIFACT_UUID="):
                    return item.split(b"=", 1)[1].decode()
    except OSError:
        return None
    return None


def _outside_the_shared_pool(server) -> list:
    """The server's helpers that run under an artifact id of a session or query (not the shared
    ``default`` pool of the stages' Python workers)."""
    return [(p, c) for p, c in server.helpers()
            if _artifact_id(p) not in (None, "default") and "python" in c]


@pytest.fixture(scope="module", params=["instances", "executors"])
def scenario(request, connect_server, tmp_path_factory):
    root = str(tmp_path_factory.mktemp(f"connect-{request.param}"))
    t0 = time.monotonic()
    with open(os.path.join(root, "scenario.stderr"), "w") as err:
        p = run_alone([sys.executable, os.path.join(HERE, "scenario.py"), root, connect_server.url,
                       request.param], timeout=1200, env=_env(tmp_path_factory.mktemp("home")),
                      stdout=subprocess.DEVNULL, stderr=err, brokers=[os.path.join(root, "broker")])
    try:
        with open(os.path.join(root, "result.json")) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"exception": f"no result (exit {p.returncode}); see {root}/scenario.stderr"}
    res["seconds"] = time.monotonic() - t0
    res["helpers_left"] = _outside_the_shared_pool(connect_server)
    print(f"connect scenario {request.param}: {res['seconds']:.0f}s, marks {res.get('marks')}")
    return request.param, res


def test_exact_through_crashes_restart_and_queries(scenario):
    placement, res = scenario
    assert "exception" not in res, res.get("exception")
    assert res["connect"] is True and res["placement"] == placement
    assert res["exact_first"]["ok"] and res["exact_last"]["ok"], (res["exact_first"], res["exact_last"])
    crashes = [s for s in res["steps"] if "crash" in s]
    assert [c["crash"]["mode"] for c in crashes] == ["disk-loss", "process"]
    for c in crashes:
        assert c["claimed"] and c["drained"] is True and c["state"] == "RUNNING", c
        assert c["exact"]["ok"], c                      # counted once, through the crash
    r = res["restart"]
    assert r["generation"] == r["generation_before"] + 1 <= r["generation_now"], r
    assert all(got == want for got, want in res["queries"].values()), res["queries"]
    assert res["countries"][0] == res["countries"][1]   # the join, per country
    assert res["output"] == {"last": True, "duplicates": 0, "words": res["output"]["words"]}
    assert res["output"]["words"] > 5                 # read back read_committed, each count once
    assert res["state"] == "RUNNING"
    assert res["report"]["stopped"] and not res["report"]["left"]


def test_a_failure_is_the_line_a_classic_session_says(scenario):
    placement, res = scenario
    assert "exception" not in res, res.get("exception")
    errors = [s for s in res["steps"] if "error" in s]
    if placement == "instances":
        # the other instance takes a crashed one's tasks; the last one's crash stops the app, and
        # that is said by the app's state, not by an error
        assert all(s.get("error") is None for s in res["steps"])
        return
    # executors on a local master: the query fails at each crash, in one line, and restart() replays
    assert [s["what"] for s in errors] == ["disk-loss crash", "process crash"], res["steps"]
    for s in errors:
        assert s["error"] == CLASSIC_LINE, s
        assert s["state_after_error"] == "ERROR" and s["restarted"] and s["drained"] is True


def test_the_helpers_the_server_started_for_the_app_are_gone(scenario):
    placement, res = scenario
    assert "exception" not in res, res.get("exception")
    assert res["helpers_left"] == [], res["helpers_left"]


# -- the magics in a real kernel ----------------------------------------------------------------------

CELLS = [
    ("load", "%load_ext kernel_ext"),
    ("up", "%statekit up --master {url}"),
    ("produce", "%statekit produce lines --generator words --limit 3000 --partitions 2 --wait"),
    ("app", "%%statekit app wc --partitions 2 --instances 2\n"
            "app.stream('lines', value_serde='json').group_by_key().count(store='counts')"),
    ("start", "%statekit start wc"),
    ("wait", "%statekit wait wc"),
    ("crash", "%statekit crash wc --mode disk-loss --instance 0 --after 20"),
    ("more", "%statekit produce lines --generator words --limit 3000 --partitions 2 --seed 7 --wait"),
    ("wait2", "%statekit wait wc"),
    ("restart", "%statekit restart wc --no-watch"),
    ("wait3", "%statekit wait wc"),
    ("check", "import collections, kernel_ext\n"
              "from statekit.kafka import Kafka\n"
              "k = Kafka(); want = collections.Counter()\n"
              "for p, end in k.end_offsets('lines').items():\n"
              "    for ch in k.read('lines', p, None, end):\n"
              "        want.update(key.decode() for _o, _t, key, _v, _h in ch.records)\n"
              "df = kernel_ext.session().apps['wc'].query_all('counts')\n"
              "got = {key: int(v) for key, v in zip(df['key'], df['value'])}\n"
              "word = max(want, key=want.get)\n"
              "print('EXACT', got == dict(want), sum(got.values()), sum(want.values()), word, want[word])"),
    ("query", "%statekit query wc counts {word}"),
    ("down", "%statekit down"),
]


def _run_cell(kc, code: str, timeout: float = 600) -> dict:
    out = {"stdout": "", "stderr": "", "error": None}

    def hook(msg):
        t, c = msg["msg_type"], msg["content"]
        if t == "stream":
            out[c["name"]] += c["text"]
        elif t == "error":
            out["error"] = f"{c['ename']}: {c['evalue']}"
        elif t in ("execute_result", "display_data"):
            data = c.get("data", {})
            out["stdout"] += (data.get("text/html") or data.get("text/plain", "")) + "\n"

    kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    return out


def test_the_magics_run_on_a_connect_server_in_a_real_kernel(connect_server, tmp_path):
    from jupyter_client.manager import start_new_kernel

    env = _env(tmp_path)
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
    said: dict = {}
    helpers_at_down = None
    try:
        for name, code in CELLS:
            word = said["check"]["stdout"].split()[-2] if "check" in said else ""
            said[name] = _run_cell(kc, code.replace("{url}", connect_server.url).replace("{word}", word))
            assert said[name]["error"] is None, (name, said[name])
        helpers_at_down = _outside_the_shared_pool(connect_server)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        from statekit import broker as broker_mod

        broker_mod.stop(str(tmp_path / "home" / "broker"))   # its own session: not the kernel's group
    for name in ("up", "start", "wait", "crash", "wait2", "restart", "wait3", "down"):
        assert "Traceback" not in said[name]["stderr"], (name, said[name]["stderr"])
    assert "Spark Connect" in said["up"]["stdout"] and connect_server.url in said["up"]["stdout"]
    assert "started by statekit" in said["up"]["stdout"]
    assert "wc: caught up" in said["wait"]["stdout"]
    assert "instance 0 crashed and lost its disk" in said["crash"]["stdout"] or \
        "instance 0 will crash (disk-loss)" in said["crash"]["stdout"], said["crash"]
    assert "wc: caught up" in said["wait3"]["stdout"], said["wait3"]
    exact = said["check"]["stdout"].split("EXACT ", 1)[1].split()
    assert exact[0] == "True" and exact[1] == exact[2] == "6000", said["check"]
    word, n = exact[3], exact[4]
    assert said["query"]["stdout"].startswith(f"counts[{word!r}] = {n}"), said["query"]
    down = said["down"]["stdout"]
    assert "app wc" in down and "statekit's Spark Connect session" in down and "embedded broker" in down
    assert helpers_at_down == [], helpers_at_down


API_MODE = """
import json, os
from statekit.engine.spark import session as S, session_api
from statekit.engine.spark.connect_server import alive, descendants
spark = S.get_session()
server = S._OWNED.server
res = {"connect": session_api.is_connect(spark), "url": S.connect_url(spark), "server": server.url,
       "counted": spark.range(5).count(), "master": S.session_master(spark)}
pids = [server.pid, *descendants(server.pid)]
res["stopped"] = S.stop_session().stopped
res["alive_after"] = [p for p in pids if alive(p)]
res["env_after"] = "SPARK_CONNECT_MODE_ENABLED" in os.environ
print(json.dumps(res))
"""


def test_spark_api_mode_connect_starts_a_server_of_statekits_and_stops_it(tmp_path):
    """``SPARK_API_MODE=connect`` (Spark 4's ``spark.api.mode``): statekit's session is a Spark
    Connect client of a local server statekit starts (an ephemeral port); stopping the session
    stops the server and every process it started, and clears the Connect mode statekit set."""
    env = dict(_env(tmp_path), SPARK_API_MODE="connect", TMPDIR=str(tmp_path))
    p = run_alone([sys.executable, "-c", API_MODE], timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["connect"] is True and res["url"] == res["server"] and res["counted"] == 5
    assert res["master"] == "local[2]"
    assert res["stopped"] == ["spark (and the local Spark Connect server statekit started)"]
    assert res["alive_after"] == [] and res["env_after"] is False


LIFELINE = """
import os, sys, time
from statekit.engine.spark.connect_server import ConnectServer, descendants
server = ConnectServer(sys.argv[1]).start()
print(server.pid, *descendants(server.pid), flush=True)
time.sleep(600)
"""


def test_a_server_statekit_started_ends_with_the_process_that_started_it(tmp_path):
    """A kernel that dies (SIGKILL: no stop(), no atexit) leaves no Connect server behind: the
    lifeline's keeper ends the server's process group (``statekit spark serve`` detaches: it runs
    until ``statekit spark stop``)."""
    from statekit.engine.spark.connect_server import alive

    proc = subprocess.Popen([sys.executable, "-c", LIFELINE, str(tmp_path / "server")],
                            stdout=subprocess.PIPE, text=True, env=_env(tmp_path),
                            start_new_session=True)
    pids: list = []
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert pids and all(alive(p) for p in pids[:1]), pids
        os.kill(proc.pid, 9)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.2)
        assert [p for p in pids if alive(p)] == []
    finally:
        for p in pids:                       # only if the assertion failed: they are ours
            if alive(p):
                os.kill(p, 9)
        if proc.poll() is None:
            os.kill(proc.pid, 9)


def test_statekit_spark_serve_status_stop(tmp_path):
    """The teacher's commands: ``serve`` starts a server that outlives the command (detached) and
    says the URL participants set as SPARK_REMOTE; ``serve`` again says it already runs; ``status``
    names it; ``stop`` ends it and every process it started; ``status`` then says none runs."""
    from statekit.engine.spark.connect_server import alive, descendants, read_state

    root = str(tmp_path / "room")
    env = _env(tmp_path)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "statekit.cli", "spark", *args, "--dir", root],
                              capture_output=True, text=True, timeout=300, env=env)

    served = cli("serve", "--port", "0", "--master", "local[1]", "--driver-memory", "512m")
    st = read_state(root)
    pids = [st["pid"], *descendants(st["pid"])] if st else []
    try:
        assert served.returncode == 0, served.stderr[-2000:]
        assert st is not None and alive(st["pid"])          # the command ended, the server runs on
        url = st["url"]
        assert re.fullmatch(r"sc://127\.0\.0\.1:\d+", url)
        assert f"export SPARK_REMOTE={url}" in served.stdout, served.stdout
        again = cli("serve")
        assert again.returncode == 0 and f"already runs at {url}" in again.stderr, again
        status = cli("status")
        assert status.returncode == 0 and status.stdout.startswith(f"running: {url}"), status
        stopped = cli("stop")
        assert stopped.returncode == 0 and url in stopped.stdout, stopped
        assert [p for p in pids if alive(p)] == []
        none = cli("status")
        assert none.returncode == 1 and none.stdout.startswith("no Spark Connect server runs"), none
    finally:
        for p in pids:                       # only when an assertion failed: they are ours
            if alive(p):
                os.kill(p, 9)
