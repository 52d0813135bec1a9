"""A restore held for a learner (``App.hold_restores``): the listener the restore reports to stops
it once it has crossed the share asked, for the tasks named, until the hold is released; the time
held is not the restore's. No broker: the listener is driven as a restore drives it."""
from __future__ import annotations

import threading
import time

from statekit import events as ev
from statekit.worker import hold
from statekit.worker.task import _RestoreEvents


def test_a_held_restore_stops_at_its_share_until_released(tmp_path):
    control = str(tmp_path / "control")
    hold.write(control, ["0_1"], 0.5)
    out = []
    other = _RestoreEvents(out.append, "0_0", 0, "scratch", control_dir=control)
    other.on_restore_start("c", 0, 100, 200)
    for off in range(110, 201, 10):        # another task: not held
        other.on_batch_restored("c", 0, off, 10)
    mine = _RestoreEvents(out.append, "0_1", 0, "scratch", control_dir=control)
    mine.on_restore_start("c", 1, 0, 40)
    for off in (10, 19):
        mine.on_batch_restored("c", 1, off, 10)   # below half: goes on at once
    done = threading.Event()

    def restore_on():
        mine.on_batch_restored("c", 1, 20, 1)      # half: held here
        mine.on_batch_restored("c", 1, 30, 10)
        done.set()

    th = threading.Thread(target=restore_on)
    th.start()
    time.sleep(0.6)
    assert not done.is_set()                        # still held
    held = [e for e in out if isinstance(e, ev.RestoreProgress) and e.task == "0_1" and e.held]
    assert [(e.offset, e.remaining) for e in held] == [(20, 20)]
    assert hold.clear(control) and not hold.clear(control)
    th.join(5)
    assert done.is_set() and mine.held_s["c"] >= 0.5
    last = [e for e in out if isinstance(e, ev.RestoreProgress) and e.task == "0_1"][-1]
    assert not last.held


def test_every_task_is_held_without_names_and_a_revoked_task_is_let_go(tmp_path):
    import pytest

    from statekit.worker.task import RestoreCancelled

    control = str(tmp_path / "control")
    hold.write(control, None, 0.0)
    revoked = threading.Event()
    r = _RestoreEvents(lambda e: None, "1_3", 2, "scratch", cancel=revoked.is_set, control_dir=control)
    r.on_restore_start("c", 3, 0, 10)
    threading.Timer(0.3, revoked.set).start()
    with pytest.raises(RestoreCancelled):
        r.on_batch_restored("c", 3, 1, 1)          # held at once (at=0), until taken away
    assert hold.read(control) == {"tasks": None, "at": 0.0}
