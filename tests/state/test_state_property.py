"""Property test: random crash schedules against the embedded broker; after every crash the task is
reopened (restored) and the input batches are replayed as Spark would; the final state must equal
the reference exactly.

Most examples run in-process: the crash plan's ``raise`` mode throws ``SimulatedCrash`` at the
point and the test *abandons* the TaskState (no commit, no flush, RocksDB handle closed with
nothing written, lock released, every buffer dropped). That is what a kill leaves behind: only what
reached Kafka (acked), RocksDB (whole WriteBatches) and the checkpoint file (fsync + rename) before
the point survives — see statekit/state/crash.py. A smaller set of examples uses real subprocesses
and SIGKILL. Optional disk damage after a crash: the task directory deleted (disk loss) or the
checkpoint file overwritten with garbage.

Every example crashes at least once: its first crash hits a commit within the first three batches
and every example has at least three, so 200 examples are >= 200 random crash points (about 300 in
practice; `--hypothesis-show-statistics` prints how often each point fired).
"""
from __future__ import annotations

import itertools
import os
import shutil
import signal
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

import statehelpers as H
from statekit.kafka import Kafka
from statekit.state import CRASH_POINTS, CrashPlan, SimulatedCrash, TaskState

_ids = itertools.count()

# The in-process examples keep their state dirs (and their broker's log) in tmpfs when there is one:
# they test the protocol, not the disk, and RocksDB open/close and fsync on a loaded disk cost 20x
# more there. The real-SIGKILL tests (here and in test_state_crash.py) use the real disk.
SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture(scope="module")
def fast_broker():
    from statekit import broker as broker_mod

    d = tempfile.mkdtemp(prefix="statekit-prop-broker-", dir=SHM)
    handle = broker_mod.start(dir=d, port=0)
    try:
        yield handle
    finally:
        handle.stop()
        shutil.rmtree(d, ignore_errors=True)

COMMIT_POINTS = [p for p in CRASH_POINTS if p != "mid_restore"]

# A commit crash (point, k) dies in the commit of the k-th (0-2) batch after the last applied one;
# ("mid_restore", k) dies after k restore WriteBatches of the next open. The first crash of a
# schedule is a commit crash, so later opens have something to restore.
commit_crash = st.tuples(st.sampled_from(COMMIT_POINTS), st.integers(0, 2))
crash_event = st.one_of(commit_crash, st.tuples(st.just("mid_restore"), st.integers(1, 4)))
damage = st.sampled_from(["none", "none", "none", "disk_loss", "corrupt_checkpoint"])
schedules = st.tuples(st.tuples(commit_crash, damage),
                      st.lists(st.tuples(crash_event, damage), max_size=2)).map(
    lambda t: [t[0], *t[1]])


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(crashes=schedules, n=st.integers(3, 7), seed=st.integers(0, 10_000), cache=st.booleans())
def test_random_crash_points_in_process(fast_broker, crashes, n, seed, cache):
    k = _kafka(fast_broker)
    app = f"prop-{os.getpid()}-{next(_ids)}"
    state_dir = tempfile.mkdtemp(prefix="statekit-prop-", dir=SHM)
    task_dir = os.path.join(state_dir, app, "0")
    plans = list(crashes)
    try:
        for _attempt in range(len(plans) + 2):
            (point, at), dmg = plans.pop(0) if plans else ((None, None), "none")
            on_open = CrashPlan(f"mid_restore@{at}" if point == "mid_restore" else "", mode="raise")
            task = None
            try:
                task = TaskState(app, 0, H.specs(cache), state_dir=state_dir, kafka=k,
                                 crash=on_open, fetch_max_bytes=256)
                if point in COMMIT_POINTS:
                    task.crash = CrashPlan(f"{point}@{task.last_batch + 1 + at}", mode="raise")
                H.run_batches(task, seed, range(n))
            except SimulatedCrash:
                event(f"crashed at {point}")
                if task is not None:
                    task.abandon()
                _damage(task_dir, dmg)
                continue
            try:
                assert task.last_batch == n - 1
                assert H.contents(task) == H.reference(seed, range(n))
            finally:
                task.close()
            break
        else:
            raise AssertionError("the task never finished")
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def _damage(task_dir, dmg):
    if dmg == "disk_loss":
        shutil.rmtree(task_dir, ignore_errors=True)
    elif dmg == "corrupt_checkpoint" and os.path.isdir(task_dir):
        with open(os.path.join(task_dir, ".checkpoint"), "wb") as f:
            f.write(b'{"version": 1, "stores": {"counts": {"changelog_off')


_KAFKA = {}


def _kafka(broker):
    k = _KAFKA.get(broker.bootstrap)
    if k is None:
        k = _KAFKA[broker.bootstrap] = Kafka(broker.bootstrap)
    return k


# -- a smaller set with real processes and SIGKILL ----------------------------------------------


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(point=st.sampled_from(COMMIT_POINTS), at=st.integers(0, 4), seed=st.integers(0, 1000))
def test_random_crash_points_sigkill(shared_broker, point, at, seed):
    _sigkill_example(shared_broker, point, at, seed)


@pytest.mark.slow
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(point=st.sampled_from(COMMIT_POINTS), at=st.integers(0, 4), seed=st.integers(0, 10_000))
def test_random_crash_points_sigkill_many(shared_broker, point, at, seed):
    _sigkill_example(shared_broker, point, at, seed)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(crashes=schedules, n=st.integers(2, 9), seed=st.integers(0, 10_000), cache=st.booleans())
def test_random_crash_points_in_process_many(fast_broker, crashes, n, seed, cache):
    test_random_crash_points_in_process.hypothesis.inner_test(fast_broker, crashes, n, seed, cache)


def _sigkill_example(shared_broker, point, at, seed):
    from test_state_crash import run_writer
    import test_state_crash as C

    app = f"propkill-{os.getpid()}-{next(_ids)}"
    state_dir = tempfile.mkdtemp(prefix="statekit-propkill-")
    old = C.SEED
    C.SEED = seed
    try:
        p, _ = run_writer(shared_broker, state_dir, app, 5, crash=f"{point}@{at}")
        assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
        p, out = run_writer(shared_broker, state_dir, app, 5)
        assert p.returncode == 0, p.stderr[-2000:]
        assert out["contents"] == H.reference(seed, range(5))
    finally:
        C.SEED = old
        shutil.rmtree(state_dir, ignore_errors=True)
