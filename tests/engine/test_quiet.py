"""pyspark's idle loops without their one-second timers: a poll that waits for its event."""
from __future__ import annotations

import os
import select
import threading
import time

from statekit.engine.spark.quiet import EventSelect


def test_an_event_poll_waits_past_the_timeout_it_is_given_for_its_event():
    r, w = os.pipe()
    try:
        p = EventSelect().poll()
        p.register(r, select.POLLIN)
        threading.Timer(0.3, lambda: os.write(w, b"x")).start()
        t0 = time.monotonic()
        got = p.poll(10)                   # pyspark's timeout (ms): not a reason to wake
        assert [fd for fd, _ev in got] == [r] and time.monotonic() - t0 >= 0.25
        p.unregister(r)                    # (the rest of select.poll's interface is there)
    finally:
        os.close(r)
        os.close(w)


def test_the_rest_of_select_is_select():
    s = EventSelect()
    assert s.POLLIN == select.POLLIN and s.select is select.select and s.error is select.error
