"""statekit stops only what it started (issue 28): a user's own session with a running streaming
query survives ``App.stop()`` and ``%statekit down``, on a classic session and on Spark Connect; a
session statekit started keeps running while a query of the user's runs on it, and ``down`` says
so. Each mode runs in a process of its own (tests/connect/owner.py): pyspark runs one mode per
process."""
from __future__ import annotations

import json
import os
import sys

import pytest
from alone import run_alone

pytestmark = pytest.mark.spark

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(tmp_path, mode, url, bootstrap) -> dict:
    env = dict(os.environ, STATEKIT_HOME=str(tmp_path / "home"))
    for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_API_MODE", STATEKIT_MASTER):
        env.pop(k, None)
    p = run_alone([sys.executable, os.path.join(HERE, "owner.py"), str(tmp_path), mode, url or "",
                   bootstrap], timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    # no raw traceback from a thread (a Connect session made first, then `up`, printed one)
    assert "Traceback" not in p.stderr and "Exception in thread" not in p.stderr, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


STATEKIT_MASTER = "STATEKIT_SPARK_MASTER"


def _check(res: dict) -> None:
    assert res["drained"] is True and res["counted"] == 9        # the words of the two lines
    assert res["app_queries_running"]                      # the app's queries ran on the session
    stop = res["after_app_stop"]
    assert stop == {"mine_active": True, "app_queries": [], "usable": True}
    assert res["same_session"] is True                    # %statekit up reuses the user's session
    assert "spark" not in res["down"].splitlines()[0]      # it stopped no Spark ...
    assert "left the Spark session running: you created it" in res["down"]   # ... and says why
    assert res["after_down"] == {"mine_active": True, "usable": True}
    # statekit's own session, a query of the user's on it: left running, said in one line
    assert res["handed_out_statekits"] is True
    assert res["mine_2_active"] is True and res["usable_2"] is True
    left = [ln for ln in res["down_with_mine"].splitlines() if ln.startswith("left the Spark session")]
    assert len(left) == 1 and "1 streaming query statekit did not start runs on it (my_query_2)" in left[0]
    assert res["down_after"].startswith("stopped: spark")
    assert res["stopped_at_last"] is True


def test_a_users_classic_session_survives_app_stop_and_down(tmp_path, shared_broker):
    _check(_run(tmp_path, "classic", None, shared_broker.bootstrap))


def test_a_users_connect_session_survives_app_stop_and_down(tmp_path, shared_broker, connect_server):
    _check(_run(tmp_path, "connect", connect_server.url, shared_broker.bootstrap))
