"""pyspark's and py4j's idle loops that wake on a timer to do nothing: an idle session's
Python processes then sleep until there is something to do.

On a virtual machine each wake-up of an idle core costs more CPU than the look it makes (about
0.2 ms here), and an idle app's processes had a dozen such timers between them:

* pyspark's worker daemon polls its stdin and socket every second, and acts only on their events;
* py4j's finalizer worker looks for Java objects to release every second (they are released
  in one go every ``FINALIZER_S`` instead).

Not the driver's accumulator server, which also polls the JVM's connection every second: that
poll is how it sees its own shutdown (`SparkContext.stop` waits for it, and the JVM keeps the
connection open), so a longer one made every session's stop that much slower.
"""
from __future__ import annotations

import select as _select

FINALIZER_S = 10


class EventPoll:
    """``select.poll()`` whose ``poll(timeout)`` waits for an event, whatever the timeout."""

    def __init__(self):
        self._poller = _select.poll()

    def poll(self, _timeout=None):
        return self._poller.poll()

    def __getattr__(self, name):
        return getattr(self._poller, name)


class EventSelect:
    """The ``select`` module, with ``poll()`` an :class:`EventPoll`: what a module's global
    ``select`` is replaced with."""

    poll = EventPoll

    def __getattr__(self, name):
        return getattr(_select, name)


def quiet_driver() -> None:
    """The driver's side (a classic session's process)."""
    import py4j.clientserver

    py4j.clientserver.DEFAULT_WORKER_SLEEP_TIME = FINALIZER_S


def quiet_daemon() -> None:
    """pyspark's worker daemon (``worker_daemon``), before its manager runs."""
    import pyspark.daemon

    pyspark.daemon.select = EventSelect()
