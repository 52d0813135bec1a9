"""The broker's periodic duties (retention, transaction timeouts, stats, flush) on one timer, and
the slower pace of an idle broker.

Four duties a second, each on a timer of its own, woke an idle broker four times a second; on a
virtual machine an idle core's wake-up costs more CPU than these duties' work. So they share one
timer: each runs once its interval has passed since it last ran, and duties due together run on
one wake-up. An idle broker (the broker's ``idle()``: nothing written for a few runs, no
transaction open) has nothing to flush, expire or rewrite: it runs them every IDLE_DUTIES_S, and
a write (``wake()``) puts them back on their own pace at once.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional

log = logging.getLogger("statekit.broker")

SLACK_S = 0.05        # a duty due this soon runs on the wake-up of the one due now
IDLE_DUTIES_S = 5.0


class Duties:
    def __init__(self, idle: Callable[[], bool]):
        self._is_idle = idle
        self.idle = False                     # at the idle pace now
        self._pause: Optional[asyncio.Future] = None

    async def run(self, duties: list) -> None:
        """Run ``[(interval_ms, fn)]`` (``fn`` a function or a coroutine function) until cancelled."""
        loop = asyncio.get_running_loop()
        due = [loop.time() + ms / 1000.0 for ms, _ in duties]
        while True:
            delay = max(0.0, min(due) - loop.time())
            if self.idle:
                pause = self._pause = loop.create_future()
                timer = loop.call_later(delay, lambda: pause.done() or pause.set_result(False))
                try:
                    woken = await pause
                finally:
                    timer.cancel()
                    self._pause = None
                if woken:                         # a write ended the idle pace
                    now = loop.time()
                    due = [min(d, now + ms / 1000.0) for d, (ms, _) in zip(due, duties)]
                    continue
            else:
                await asyncio.sleep(delay)
            now = loop.time()
            for i, (ms, fn) in enumerate(duties):
                if due[i] <= now + SLACK_S:
                    await self._run_one(fn)
                    due[i] = now + ms / 1000.0
            self.idle = self._is_idle()
            if self.idle:
                due = [max(d, now + IDLE_DUTIES_S) for d in due]

    def wake(self) -> bool:
        """Something was written: back on the duties' own pace now. True if they were idle."""
        if not self.idle:
            return False
        self.idle = False
        if self._pause is not None and not self._pause.done():
            self._pause.set_result(True)
        return True

    def pace(self, seconds: float) -> float:
        """Another periodic task's pause (the log cleaner's): at least IDLE_DUTIES_S while idle."""
        return max(seconds, IDLE_DUTIES_S) if self.idle else seconds

    @staticmethod
    async def _run_one(fn) -> None:
        try:
            r = fn()
            if asyncio.iscoroutine(r):
                await r
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a duty failing once must not stop it for good
            log.exception("background duty %s failed", getattr(fn, "__name__", fn))
