"""pyspark's and py4j's idle loops that wake on a timer to do nothing: an idle session's
Python processes then sleep until there is something to do.

On a virtual machine each wake-up of an idle core costs more CPU than the look it makes (about
0.2 ms here), and an idle app's processes had a dozen such timers between them:

* pyspark's worker daemon polls its stdin and socket every second, and acts only on their events;
* the driver's accumulator server polls the JVM's connection every second, to notice its own
  shutdown (its thread is a daemon, and the JVM closing the connection ends the poll anyway);
* py4j's finalizer worker looks for Java objects to release every second (they are released
  in one go every ``FINALIZER_S`` instead).
"""
from __future__ import annotations

import select as _select

FINALIZER_S = 10
LONGEST_POLL_MS = 60_000     # the accumulator server's handler still sees its shutdown


class EventPoll:
    """``select.poll()`` whose ``poll(timeout)`` waits for an event (at most ``longest_ms``)."""

    def __init__(self, longest_ms: int | None = None):
        self._poller = _select.poll()
        self._longest = longest_ms

    def poll(self, _timeout=None):
        return self._poller.poll(self._longest)

    def __getattr__(self, name):
        return getattr(self._poller, name)


class EventSelect:
    """The ``select`` module, with ``poll()`` an :class:`EventPoll`: what a module's global
    ``select`` is replaced with."""

    def __init__(self, longest_ms: int | None = None):
        self._longest = longest_ms

    def poll(self):
        return EventPoll(self._longest)

    def __getattr__(self, name):
        return getattr(_select, name)


def quiet_driver() -> None:
    """The driver's side (a classic session's process): before its gateway starts."""
    import py4j.clientserver
    import pyspark.accumulators

    py4j.clientserver.DEFAULT_WORKER_SLEEP_TIME = FINALIZER_S
    if not isinstance(pyspark.accumulators.select, EventSelect):
        pyspark.accumulators.select = EventSelect(LONGEST_POLL_MS)


def quiet_daemon() -> None:
    """pyspark's worker daemon (``worker_daemon``), before its manager runs."""
    import pyspark.daemon

    pyspark.daemon.select = EventSelect()
