"""An application's events, as the App sees them: the reader that tails ``<app>-events`` from
``start()`` on, the publisher of the control side's own events, and the callbacks registered with
``App.on_event``.

One object owns the three so that the reader's thread, the callbacks and the failures the tasks
report (which turn an engine failure into the task's one-line ``ProcessorError``) have one place.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Optional

from statekit import events as ev
from statekit.errors import StatekitError

log = logging.getLogger("statekit.app")


class AppEvents:
    """``bootstrap``: a function returning the broker address once it is known, else None (no
    broker yet: nothing to publish to). ``hooks`` see every event before the callbacks do."""

    def __init__(self, name: str, bootstrap: Callable[[], Optional[str]], hooks=()):
        self.name = name
        self._bootstrap = bootstrap
        self._hooks = list(hooks)
        self.callbacks: list[Callable[[ev.Event], None]] = []
        self.reader = None
        self._publisher = None
        self.task_errors: list[ev.TaskFailed] = []
        self.last_commit_at = 0.0     # monotonic: when a task last reported a committed batch
        self._outbox: Optional[queue.Queue] = None   # what publish() hands to its thread
        self._outbox_lock = threading.Lock()

    def start(self) -> None:
        if self.reader is not None:
            return
        from statekit.event_bus import EventReader

        self.reader = EventReader(self._bootstrap(), self.name, start="end")
        self.reader.subscribe(self.handle)

    def stop(self) -> None:
        self._drain_outbox()
        r, self.reader = self.reader, None
        if r is not None:
            try:
                r.close()
            except Exception:  # noqa: BLE001
                pass
        self._publisher = None

    def forget_task_errors(self) -> None:
        self.task_errors = []

    def handle(self, e: ev.Event) -> None:
        """Called by the EventReader's thread for every event of the app's events topic."""
        if isinstance(e, ev.TaskFailed):
            self.task_errors.append(e)
        elif isinstance(e, ev.Committed):
            self.last_commit_at = time.monotonic()
        for hook in self._hooks:
            hook(e)
        for cb in list(self.callbacks):
            try:
                cb(e)
            except Exception as exc:  # noqa: BLE001 - a callback never stops the reader
                log.info("event callback failed: %s", exc)

    def publish(self, e: ev.Event) -> None:
        """The control side's events (state changes, membership, rebalances) go to the same topic,
        in order, from a thread of their own: the first event after Kafka went away may wait out
        the publisher's request timeout, and the App's monitor, which changes the state, must not
        (its state says WAITING at once)."""
        if not e.ts:
            e.ts = time.time()   # when it happened, not when the thread sends it
        with self._outbox_lock:
            if self._outbox is None:
                self._outbox = queue.Queue()
                threading.Thread(target=self._send_loop, args=(self._outbox,), daemon=True,
                                 name=f"statekit-publish-{self.name}").start()
            self._outbox.put(e)

    def _send_loop(self, outbox) -> None:
        while True:
            e = outbox.get()
            try:
                if e is not None:
                    self._send(e)
            finally:
                outbox.task_done()

    def _drain_outbox(self, timeout: float = 10.0) -> None:
        """Wait (a little) until what was published has been handed to the publisher."""
        q = self._outbox
        deadline = time.monotonic() + timeout
        while q is not None and q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def _send(self, e: ev.Event) -> None:
        try:
            if self._publisher is None:
                bootstrap = self._bootstrap()
                if bootstrap is None:
                    return  # no broker yet: nothing to publish to (CREATED -> NOT_RUNNING)
                from statekit.event_bus import EventPublisher

                self._publisher = EventPublisher(bootstrap, self.name)
            self._publisher.publish(e)
        except Exception as exc:  # noqa: BLE001
            log.info("could not publish an event: %s", exc)

    def events(self, since: Optional[float] = None, types=None) -> list:
        """The events (``statekit.events`` records) read since start(), oldest first; optionally
        from time ``since`` (epoch seconds) on and of some ``types``."""
        r = self.reader
        return [] if r is None else r.events(since_ts=since, types=types)

    def last(self, type: str, since: Optional[float] = None, wait: float = 2.0) -> ev.Event:
        """The latest event of ``type`` (from time ``since`` on), waiting up to ``wait`` seconds for
        one to be read; none is a one-line error that says what to run first (a notebook cell run
        before the one that causes the event)."""
        found = self.events(since=since, types=type)
        if not found and wait > 0 and self.wait_for(
                lambda e: e.type == type and (since is None or e.ts >= since), wait) is not None:
            found = self.events(since=since, types=type)
        if not found:
            raise StatekitError(f"app '{self.name}' has no {type} event yet: run the cell that causes "
                                f"one first (the cells above, in order)")
        return found[-1]

    def frame(self, **kw):
        """``events(**kw)`` as a DataFrame, one row per event."""
        import pandas as pd

        return pd.DataFrame([e.to_dict() for e in self.events(**kw)])

    def wait_for(self, predicate: Callable[[ev.Event], bool],
                 timeout: float = 30) -> Optional[ev.Event]:
        """The first event (already read or new) matching ``predicate``, or None after ``timeout``."""
        r = self.reader
        return None if r is None else r.wait_for(predicate, timeout)

    def on_event(self, callback: Callable[[ev.Event], None]) -> Callable[[ev.Event], None]:
        """Call ``callback(event)`` for every event from now on (from the reader thread)."""
        self.callbacks.append(callback)
        return callback

    def unsubscribe(self, callback) -> None:
        if callback in self.callbacks:
            self.callbacks.remove(callback)
