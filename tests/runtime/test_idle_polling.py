"""An idle app leaves the kernel idle: the runner asks Spark for the recent progress only when the
last one changed, and less often once no batch has committed for a while (its monitor then looks
less often too); the coordinator asks the instances how they are less often once they keep
answering the same (it sleeps until then; a death wakes it)."""
from __future__ import annotations

import time

from types import SimpleNamespace

from statekit import events as ev
from statekit.runtime import coordinator as co_mod
from statekit.runtime import runner as runner_mod
from statekit.runtime.app_events import AppEvents
from statekit.runtime.lifecycle import AppState
from statekit.runtime.runner import Runner


class FakeQuery:
    def __init__(self):
        self.batches = []
        self.recent_asks = 0

    @property
    def last_progress(self):
        return self.batches[-1] if self.batches else {}

    @property
    def recent_progress(self):
        self.recent_asks += 1
        return list(self.batches)


def _batch(bid, rows, ran=True):
    return {"batch_id": bid, "num_input_rows": rows, "timestamp": f"t{bid}{ran}",
            "duration_ms": {"addBatch": 5, "triggerExecution": 9} if ran else {"triggerExecution": 1}}


def test_recent_progress_is_asked_only_when_the_last_changed():
    r = Runner.__new__(Runner)
    r.progress, r._last_batch, r.records_processed = {}, {}, 0
    q = FakeQuery()
    q.batches = [_batch(0, 10), _batch(1, 5)]
    r.poll_progress(0, q)
    assert (q.recent_asks, r.records_processed) == (1, 15)
    for _ in range(5):                       # idle: the same last progress, nothing asked
        r.poll_progress(0, q)
    assert q.recent_asks == 1
    q.batches.append(_batch(2, 0, ran=False))   # a trigger that found nothing: its own progress
    r.poll_progress(0, q)
    q.batches.append(_batch(2, 7))              # then that batch id ran
    r.poll_progress(0, q)
    assert (q.recent_asks, r.records_processed) == (3, 22)


def test_the_coordinator_asks_less_often_once_the_answers_repeat():
    c = co_mod.Coordinator.__new__(co_mod.Coordinator)
    c._status_seen, c._status_same, c._status_at, c._next_probe = None, 0, time.monotonic(), None
    c.members = {0: co_mod.Member(0)}
    c.members[0].status = "alive"
    answers = iter([{"tasks": {"0_0": {"state": "restoring"}}, "at": 0.5}]
                   + [{"tasks": {"0_0": {"state": "running"}}, "at": float(n)} for n in range(9)])
    c._call = lambda m, what, timeout: ("ok", next(answers))
    c._refresh_statuses()
    assert c._status_every() == co_mod.STATUS_S
    for _ in range(co_mod.QUIET_AFTER):       # the same answer ("at" aside) again and again
        assert c._status_every() == co_mod.STATUS_S
        c._refresh_statuses()
    assert c._status_every() == co_mod.STATUS_S   # the first "running" was a change
    c._refresh_statuses()
    assert c._status_every() == co_mod.STATUS_QUIET_S
    assert c._loop_timeout() > 0.5              # the loop sleeps, it does not look every 50 ms
    c._next_probe = time.monotonic() + 0.2      # unless a probe is due sooner
    assert c._loop_timeout() <= 0.2


def _runner_of(state, trigger=None, started_ago=60.0):
    bus = AppEvents("idle", lambda: None)
    app = SimpleNamespace(state=state, _bus=bus)
    r = Runner(app)
    r.run_opts = {"trigger": trigger}
    r.started_at = time.time() - started_ago
    return r, bus


def test_the_engine_is_asked_every_second_while_batches_commit_and_seldom_once_idle():
    r, bus = _runner_of(AppState.RUNNING)
    now = time.monotonic()
    # no batch has committed (or none for longer than PROGRESS_IDLE_S): idle
    assert r.progress_every(now) == runner_mod.PROGRESS_IDLE_S
    assert r.monitor_every() == runner_mod.MONITOR_IDLE_S
    # a task reports a committed batch (its event, as the App's reader hands it over): busy
    bus.handle(ev.Committed(task="0_0", batch=3, records=5))
    assert r.progress_every(time.monotonic()) == runner_mod.PROGRESS_S
    assert r.monitor_every() == runner_mod.MONITOR_S
    # ... until PROGRESS_IDLE_S without another
    later = bus.last_commit_at + runner_mod.PROGRESS_IDLE_S + 0.01
    assert r.progress_every(later) == runner_mod.PROGRESS_IDLE_S
    assert runner_mod.PROGRESS_IDLE_S > runner_mod.PROGRESS_S
    assert runner_mod.MONITOR_IDLE_S > runner_mod.MONITOR_S


def test_the_engine_is_asked_every_second_whenever_the_app_is_not_simply_running():
    now = time.monotonic()
    for state in (AppState.RESTORING, AppState.REBALANCING, AppState.WAITING):
        r, _ = _runner_of(state)
        assert r.progress_every(now) == runner_mod.PROGRESS_S, state
        assert r.monitor_every() == runner_mod.MONITOR_S, state
    r, _ = _runner_of(AppState.RUNNING, trigger="availableNow")   # its end is its result
    assert r.progress_every(now) == runner_mod.PROGRESS_S
    r, _ = _runner_of(AppState.RUNNING, started_ago=1.0)          # just started
    assert r.progress_every(now) == runner_mod.PROGRESS_S
