"""Crash tests with real processes: a writer subprocess is killed with SIGKILL at each point of the
commit protocol and in the middle of a restoration; reopening (which restores) and replaying the
un-applied input batches (same batch ids, as Spark does) gives exactly the reference state."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import statehelpers as H
from statekit.kafka import Kafka
from statekit.state import TaskState

HERE = os.path.dirname(os.path.abspath(__file__))
WRITER = os.path.join(HERE, "writer.py")
N = 6
SEED = 7


def run_writer(broker, state_dir, app, batches, crash=None, extra=()):
    env = dict(os.environ)
    env.pop("STATEKIT_CRASH", None)
    env.pop("STATEKIT_CRASH_MODE", None)
    if crash:
        env["STATEKIT_CRASH"] = crash
    cmd = [sys.executable, WRITER, "--bootstrap", broker.bootstrap, "--state-dir", str(state_dir),
           "--app", app, "--seed", str(SEED), "--batches", str(batches), *extra]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    out = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
    return p, out


def fresh_restore(broker, tmp_path, app):
    """An independent restore from the changelog alone, into an empty state dir."""
    k = Kafka(broker.bootstrap)
    try:
        with TaskState(app, 0, H.specs(), state_dir=str(tmp_path / "fresh"), kafka=k) as t:
            return t.last_batch, H.contents(t)
    finally:
        k.close()


# point -> the last applied batch after the crash (the crash hits the commit of batch 3)
CASES = {
    "before_send": 2,      # nothing of batch 3 left the process
    "mid_send": 2,         # part of store 1's records reached the log, no marker: a tail
    "between_stores": 2,   # store 1 committed batch 3 in its changelog, stores 2-3 did not
    "after_ack": 3,        # every marker acked: the changelog has batch 3, RocksDB not
    "after_rocksdb": 3,    # RocksDB has batch 3, the checkpoint does not
}


@pytest.mark.parametrize("point", list(CASES))
def test_sigkill_during_commit(broker, tmp_path, point):
    app = f"crash-{point.replace('_', '')}"
    state = tmp_path / "state"
    p, _ = run_writer(broker, state, app, N, crash=f"{point}@3")
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]

    p, out = run_writer(broker, state, app, N)
    assert p.returncode == 0, p.stderr[-2000:]
    assert out["start_batch"] == CASES[point]
    assert out["done"] == list(range(CASES[point] + 1, N))  # replayed exactly the un-applied ones
    ref = H.reference(SEED, range(N))
    assert out["contents"] == ref  # nothing lost, nothing applied twice

    last, contents = fresh_restore(broker, tmp_path, app)
    assert last == N - 1
    assert contents == ref


def test_sigkill_mid_restore_resumes(broker, tmp_path):
    app = "crash-midrestore"
    state = tmp_path / "state"
    p, out = run_writer(broker, state, app, 8)
    assert p.returncode == 0, p.stderr[-2000:]
    shutil.rmtree(state / app / "0")  # disk loss: the next open restores everything

    small = ("--fetch-max-bytes", "200")  # one record batch per Fetch: many restore WriteBatches
    p, _ = run_writer(broker, state, app, 8, crash="mid_restore@3", extra=small)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert not (state / app / "0" / ".checkpoint").exists()  # removed before restoring

    p, out = run_writer(broker, state, app, 8, extra=small)
    assert p.returncode == 0, p.stderr[-2000:]
    assert out["start_batch"] == 7 and out["done"] == []
    # resumed from the progress RocksDB recorded, not from scratch
    first = out["restored"]["counts"]
    assert first["replayed_from"] == "meta" and first["start_offset"] > 0
    assert out["contents"] == H.reference(SEED, range(8))


def test_second_writer_is_locked_out(broker, tmp_path):
    from statekit.errors import StateLocked

    k = Kafka(broker.bootstrap)
    try:
        with TaskState("locked", 0, H.specs(), state_dir=str(tmp_path), kafka=k):
            p = subprocess.run(
                [sys.executable, WRITER, "--bootstrap", broker.bootstrap, "--state-dir",
                 str(tmp_path), "--app", "locked", "--batches", "1"],
                capture_output=True, text=True, timeout=60)
            assert p.returncode != 0
            assert "StateLocked" in p.stderr and "in use by another process" in p.stderr
            with pytest.raises(StateLocked) as e:
                TaskState("locked", 0, H.specs(), state_dir=str(tmp_path), kafka=k)
            assert "\n" not in str(e.value)
    finally:
        k.close()
