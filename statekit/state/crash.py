"""Crash hooks: named points in the commit protocol and in restoration where a test (or the Spark
engine's crash simulation) makes the process die.

A plan is ``"<point>"`` or ``"<point>@<n>"``: for the commit points ``n`` is the input batch id whose
commit dies; for ``mid_restore`` it is the number of restore WriteBatches written before dying
(default 1). It comes from the ``crash=`` argument or the ``STATEKIT_CRASH`` environment variable;
the mode from ``STATEKIT_CRASH_MODE`` (or ``mode=``):

* ``kill`` (default): ``os.kill(os.getpid(), SIGKILL)`` — a real crash;
* ``raise``: raise :class:`SimulatedCrash`. The caller then *abandons* the task (``TaskState.abandon``):
  the RocksDB handle is closed with nothing written, the lock is released, every buffer is dropped.
  That models a kill because the protocol keeps nothing durable in memory: what a kill leaves behind
  is exactly what reached Kafka (acked), RocksDB (whole WriteBatches, in its WAL) and the checkpoint
  file (fsync'd, renamed) before the crash point; caches, pending overlays and unsent changelog
  records live only in the process and vanish either way. (RocksDB flushing its memtable on close is
  not a difference: a killed process's WAL brings the same writes back on the next open.)

Points: ``before_send`` (cache flushed, nothing sent), ``mid_send`` (half of the first store's
changelog records reached the log, its marker did not: an uncommitted tail), ``between_stores`` (one store's changelog
records and marker acked, the next store's not sent), ``before_commit`` (every record and marker
acked; with exactly-once, the transaction not committed yet, so a crash here leaves one for the next
owner to abort), ``after_ack`` (every marker acked and, with exactly-once, the transaction
committed; RocksDB not written), ``after_rocksdb`` (RocksDB written, checkpoint not),
``mid_restore``.
"""
from __future__ import annotations

import os
import signal

POINTS = ("before_send", "mid_send", "between_stores", "before_commit", "after_ack", "after_rocksdb",
          "mid_restore")


class SimulatedCrash(BaseException):
    """Raised at a crash point in ``raise`` mode. A BaseException, so ``except Exception`` handlers
    on the way up do not swallow it (a kill cannot be caught either)."""


class CrashPlan:
    def __init__(self, spec: str | None = None, mode: str | None = None):
        spec = spec if spec is not None else os.environ.get("STATEKIT_CRASH", "")
        self.mode = (mode or os.environ.get("STATEKIT_CRASH_MODE") or "kill").strip()
        self.point = None
        self.n = None
        if spec:
            point, _, n = spec.strip().partition("@")
            if point not in POINTS:
                raise ValueError(f"unknown crash point {point!r}: use one of {', '.join(POINTS)}")
            self.point = point
            self.n = int(n) if n else None
        if self.mode not in ("kill", "raise"):
            raise ValueError(f"unknown crash mode {self.mode!r}: use kill or raise")

    def __bool__(self):
        return self.point is not None

    def armed(self, point: str, n: int | None = None) -> bool:
        """Would :meth:`hit` fire here? (For points that must prepare the damage first.)"""
        if point != self.point:
            return False
        want = self.n if self.n is not None else (1 if point == "mid_restore" else None)
        return want is None or n == want

    def hit(self, point: str, n: int | None = None) -> None:
        if not self.armed(point, n):
            return
        self.point = None  # fire once
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimulatedCrash(f"simulated crash at {point}" + (f"@{n}" if n is not None else ""))

    def __repr__(self):
        return f"CrashPlan({self.point!r}@{self.n}, mode={self.mode!r})"
