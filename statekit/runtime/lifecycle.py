"""The application's lifecycle, with Kafka Streams' state names.

    CREATED ──start──► RESTORING ──every task open──► RUNNING ◄──► REBALANCING
                          │  ▲                           │ ▲         (tasks move between instances:
                          │  └──── WAITING ◄─────────────┘ │          a death, a join, a leave, a
                          │        (Kafka is away) ────────┘          warmup that caught up)
                          ▼                              ▼
                        ERROR ◄── a task failed, no live instance, the engine failed, Kafka stayed
                          │       away longer than task_timeout
                          └─ restart ─► RESTORING          stop ─► PENDING_SHUTDOWN ─► NOT_RUNNING

An instance that dies does not stop the application: it goes REBALANCING while the dead instance's
tasks move, and back to RUNNING once they are open again. Kafka going away does not stop it
either: it goes WAITING (``App.waiting`` says for what, since when, what it aborted; Kafka Streams
stays RUNNING and logs) and back by itself — to RUNNING, or RESTORING while tasks replay what
waited. ``Lifecycle.state`` is readable at any time from any thread; listeners get ``(new, old)``
like ``KafkaStreams.StateListener``.
"""
from __future__ import annotations

import enum
import threading
import time
from typing import Callable

from statekit.errors import StatekitError

__all__ = ["AppState", "AppStateError", "Lifecycle", "IllegalTransition", "NoLiveInstance"]


class AppState(str, enum.Enum):
    CREATED = "CREATED"
    RESTORING = "RESTORING"
    REBALANCING = "REBALANCING"
    RUNNING = "RUNNING"
    WAITING = "WAITING"            # for Kafka: statekit's, not Kafka Streams'
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    ERROR = "ERROR"

    def __str__(self) -> str:  # prints as the bare name in a notebook
        return self.value

    def is_running(self) -> bool:
        return self in (AppState.RESTORING, AppState.REBALANCING, AppState.RUNNING, AppState.WAITING)


_VALID = {
    AppState.CREATED: {AppState.RESTORING, AppState.PENDING_SHUTDOWN, AppState.NOT_RUNNING, AppState.ERROR},
    AppState.RESTORING: {AppState.RUNNING, AppState.REBALANCING, AppState.WAITING, AppState.ERROR,
                         AppState.PENDING_SHUTDOWN},
    AppState.REBALANCING: {AppState.RUNNING, AppState.RESTORING, AppState.WAITING, AppState.ERROR,
                           AppState.PENDING_SHUTDOWN},
    AppState.RUNNING: {AppState.RESTORING, AppState.REBALANCING, AppState.WAITING, AppState.ERROR,
                       AppState.PENDING_SHUTDOWN},
    AppState.WAITING: {AppState.RUNNING, AppState.RESTORING, AppState.REBALANCING, AppState.ERROR,
                       AppState.PENDING_SHUTDOWN},
    AppState.PENDING_SHUTDOWN: {AppState.NOT_RUNNING, AppState.ERROR},
    AppState.NOT_RUNNING: {AppState.RESTORING, AppState.PENDING_SHUTDOWN},
    AppState.ERROR: {AppState.RESTORING, AppState.REBALANCING, AppState.PENDING_SHUTDOWN, AppState.NOT_RUNNING},
}


class IllegalTransition(RuntimeError):
    pass


class AppStateError(StatekitError):
    """An operation that the application's current state does not allow."""


class NoLiveInstance(StatekitError):
    """Every instance is dead: nothing processes until one is revived (or the app restarted)."""


class Lifecycle:
    """A small thread-safe state machine with listeners and a history."""

    def __init__(self):
        self._state = AppState.CREATED
        self._cond = threading.Condition()
        self._listeners: list[Callable[[AppState, AppState], None]] = []
        self.history: list[tuple[float, AppState, AppState]] = []
        self.reason: str | None = None

    @property
    def state(self) -> AppState:
        return self._state

    def add_listener(self, fn: Callable[[AppState, AppState], None]) -> None:
        self._listeners.append(fn)

    def can(self, new: AppState) -> bool:
        return new in _VALID[self._state]

    def transition(self, new: AppState, reason: str | None = None, *, strict: bool = True) -> bool:
        """Move to ``new``; returns False (or raises when ``strict``) when the move is not allowed.
        A move to the current state is a no-op that returns False."""
        new = AppState(new)
        with self._cond:
            old = self._state
            if new == old:
                return False
            if new not in _VALID[old]:
                if strict:
                    raise IllegalTransition(f"cannot go from {old} to {new}")
                return False
            self._state = new
            self.reason = reason
            self.history.append((time.time(), old, new))
            self._cond.notify_all()
        for fn in list(self._listeners):
            try:
                fn(new, old)
            except Exception:  # a listener never breaks the lifecycle
                pass
        return True

    def wait_for(self, states, timeout: float | None = None) -> AppState:
        """Block until the state is one of ``states``; returns the state (which may be another one
        when the timeout ran out)."""
        want = {AppState(s) for s in ([states] if isinstance(states, (str, AppState)) else states)}
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._state not in want:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left if left is not None else 1.0)
            return self._state
