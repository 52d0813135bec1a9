"""Riding out a broker that is away: which failures are worth retrying, how long to wait between
attempts, and for how long at most.

Kafka's clients retry a request that failed on a connection (refused, reset, closed) or timed out
(``request.timeout.ms``, 30 s by default), and Kafka Streams gives a task ``task.timeout.ms``
(5 minutes, KIP-572) to get going again before it fails the application. statekit does the same
in one place: :func:`retriable` sorts the client's errors, :class:`Backoff` spaces the attempts
(Kafka's ``retry.backoff.ms`` 100 ms, doubling to ``retry.backoff.max.ms`` 1 s; here up to 2 s,
with jitter), and :func:`retrying` runs a call until it succeeds or the task timeout has passed
since its first failure, then raises :class:`~statekit.errors.KafkaTimeout` in one line.

What retries where (docs/ARCHITECTURE.md, "When Kafka goes away"): an instance's task closes its
state without committing and reopens it (the reopen aborts the transaction in flight); the
engine's source and the App's control side call :func:`retrying`; standby replicas, the events
reader and publisher keep trying on their own with :class:`Backoff`.
"""
from __future__ import annotations

import random
import time
from typing import Callable, Optional, TypeVar

from statekit.errors import KafkaTimeout, KafkaUnavailable

from .errors import RETRIABLE, KafkaBusy, KafkaError, ProducerFenced

__all__ = ["DEFAULT_TASK_TIMEOUT", "request_timeout_for", "retriable", "Backoff", "retrying",
           "timed_out", "KafkaTimeout", "KafkaUnavailable"]

T = TypeVar("T")

# Kafka Streams' task.timeout.ms default (KIP-572)
DEFAULT_TASK_TIMEOUT = 300.0

# broker answers after which the same request may succeed a moment later (Kafka's
# RetriableException codes the client does not already retry itself)
RETRIABLE_CODES = (set(RETRIABLE) - {21}) | {16, 51}   # + NOT_COORDINATOR, CONCURRENT_TRANSACTIONS


def request_timeout_for(task_timeout: float) -> float:
    """The request timeout of the clients that serve a task: a tenth of the task timeout, as
    Kafka's defaults are (``request.timeout.ms`` 30 s, ``task.timeout.ms`` 5 min), between 2 s
    and 30 s, so that a broker that stopped answering is retried several times before the task
    gives up."""
    return max(2.0, min(30.0, float(task_timeout) / 10.0))


def retriable(exc: BaseException) -> bool:
    """Is ``exc`` a broker that is away or busy for now (retry), rather than a mistake or a
    refusal that another attempt would meet again?"""
    if isinstance(exc, ProducerFenced):
        return False
    if isinstance(exc, (KafkaUnavailable, KafkaBusy)):
        return True
    return isinstance(exc, KafkaError) and getattr(exc, "code", None) in RETRIABLE_CODES


class Backoff:
    """Exponential backoff with jitter: ``first`` seconds, doubling up to ``cap``, each delay
    within ±20 % (clients that lost the same broker do not all come back in the same instant)."""

    def __init__(self, first: float = 0.1, cap: float = 2.0):
        self.first, self.cap = float(first), float(cap)
        self.attempts = 0

    def next(self) -> float:
        d = min(self.cap, self.first * (2 ** min(self.attempts, 30)))
        self.attempts += 1
        return d * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.attempts = 0


def timed_out(since: Optional[float], timeout: float, now: Optional[float] = None) -> bool:
    """Has a wait that began at ``since`` (epoch seconds) outlived ``timeout`` seconds?"""
    return since is not None and (time.time() if now is None else now) - since > float(timeout)


def give_up(what: str, bootstrap: str, waited: float, timeout: float, last: BaseException) -> KafkaTimeout:
    """The one line of a wait for Kafka that outlived the task timeout."""
    return KafkaTimeout(f"{what} waited {waited:.0f} s for Kafka at {bootstrap} and gave up "
                        f"(task_timeout={timeout:g} s): {' '.join(str(last).split())[:200]}; "
                        f"bring the broker back, then restart()")


def retrying(fn: Callable[[], T], *, timeout: float, what: str, bootstrap: str,
             stop: Optional[Callable[[], bool]] = None,
             on_wait: Optional[Callable[[float, BaseException], None]] = None,
             on_failure: Optional[Callable[[], None]] = None, backoff: Optional[Backoff] = None) -> T:
    """``fn()``, retried while it fails with a :func:`retriable` error, with backoff, until
    ``timeout`` seconds after its first failure; then :class:`KafkaTimeout` (``what`` names who
    waited). ``on_failure()`` runs after each failed attempt (e.g. drop a broken client);
    ``on_wait(since, error)`` before each wait; ``stop()`` true ends the wait with the error."""
    b = backoff or Backoff()
    since = None
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - sorted just below
            if not retriable(exc):
                raise
            if on_failure is not None:
                on_failure()
            now = time.time()
            since = since or now
            if timed_out(since, timeout, now):
                raise give_up(what, bootstrap, now - since, timeout, exc) from None
            if stop is not None and stop():
                raise
            if on_wait is not None:
                on_wait(since, exc)
            time.sleep(min(b.next(), max(0.05, since + timeout - now)))
