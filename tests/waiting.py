"""Waiting on a condition instead of sleeping: a test that sleeps a fixed time either waits too
long or, on a loaded machine, too little; one that waits for the condition it needs does neither,
and says what it waited for when the condition never comes."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(pred: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``pred()`` until it returns something truthy, and return that; after ``timeout``
    seconds fail the test with one line naming ``what`` was awaited and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; last: {value!r}")
        time.sleep(interval)


async def async_wait_until(pred: Callable[[], T], timeout: float, what: str,
                           interval: float = 0.01) -> T:
    """``wait_until`` for a test running on an asyncio loop: the loop runs while it waits."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; last: {value!r}")
        await asyncio.sleep(interval)


def ended_within(pid: int, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Has process ``pid`` exited (a zombie no one has reaped yet counts: it is dead) within
    ``timeout`` seconds? A bool, not a failure: tests also assert that a process is still there."""
    from statekit.child_server import pid_alive

    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True
