"""The Restoration panel's summary line: a round in which a task failed is never a green tick."""
from __future__ import annotations

import time

from kernel_ext.dashboard.model import DashboardModel
from kernel_ext.dashboard.panels import render_restore
from statekit import events as ev


def _round(fail: bool) -> str:
    m = DashboardModel(name="fix")
    t = time.time()
    out = [ev.RestoreQueued(task=t_, instance=0, source="checkpoint", to_replay=5, generation=1, ts=t)
           for t_ in ("0_0", "0_1")]
    out += [ev.RestoreStarted(task="0_0", instance=0, store="c", start_offset=0, end_offset=5,
                              to_replay=5, ts=t + 0.1),
            ev.RestoreEnded(task="0_0", instance=0, store="c", restored=5, seconds=0.1, source="checkpoint",
                            ts=t + 0.2),
            ev.TaskOpened(task="0_0", instance=0, source="checkpoint", restored=5, ts=t + 0.21)]
    out.append(ev.TaskFailed(task="0_1", instance=0, error="ZeroDivisionError: division by zero", ts=t + 0.3)
               if fail else ev.TaskOpened(task="0_1", instance=0, source="checkpoint", restored=0, ts=t + 0.3))
    for i, e in enumerate(out):
        e.offset = i
        m.apply(e)
    return render_restore(m)


def test_a_round_with_a_failed_task_is_never_green():
    bad = _round(fail=True)
    assert "<div class='sk-sum bad'>✘ 1 failed; " in bad and "✔" not in bad
    good = _round(fail=False)
    assert "<div class='sk-sum'>✔ " in good and "failed" not in good.split("sk-sum")[-1]


def test_a_task_that_fails_long_after_its_restore_keeps_its_restores_end():
    """The row turns failed (red), but its restore ended when it ended: its bar, the round's
    duration and the lag chart's restore window do not run on to the failure a minute later."""
    m = DashboardModel(name="fix")
    t = time.time()
    out = [ev.RestoreQueued(task="0_0", instance=0, source="checkpoint", to_replay=5, generation=1, ts=t),
           ev.RestoreStarted(task="0_0", instance=0, store="c", start_offset=0, end_offset=5,
                             to_replay=5, ts=t + 0.1),
           ev.RestoreEnded(task="0_0", instance=0, store="c", restored=5, seconds=0.1,
                           source="checkpoint", ts=t + 0.2),
           ev.TaskOpened(task="0_0", instance=0, source="checkpoint", restored=5, ts=t + 0.25),
           ev.TaskFailed(task="0_0", instance=0, error="ZeroDivisionError: division by zero", ts=t + 60)]
    for i, e in enumerate(out):
        e.offset = i
        m.apply(e)
    rnd = m.restores.current
    row = rnd.rows["0_0"]
    assert (row.status, row.finished, row.error) == ("failed", t + 0.25, "ZeroDivisionError: division by zero")
    assert rnd.finished == t + 0.25
    assert "✘ 1 failed" in render_restore(m)
