"""Processor API: what a `KStream.process(MyProcessor, stores=[...])` class sees.

    class Dedupe(Processor):
        def init(self, context):
            self.context = context
            self.seen = context.get_store("seen")
        def process(self, key, value):
            if self.seen.get(key) is None:
                self.seen.put(key, self.context.timestamp)
                self.context.forward(key, value)

One instance per task, created when the task opens its batch; `init` runs before the first record of
the batch and `close` after the last (a task is opened and closed for every micro-batch: keep nothing
that matters in instance fields — state belongs in stores).

Punctuation (Kafka Streams' `ProcessorContext#schedule`)::

    def init(self, context):
        self.context = context
        context.schedule(60_000, PunctuationType.STREAM_TIME, self.flush_idle)

    def flush_idle(self, timestamp):       # stream time (or the wall clock) when it fires
        ...                                # read/write stores, context.forward(k, v)

STREAM_TIME punctuators fire while the task processes records, each time the task's stream time
reaches the next multiple of the interval (the first as soon as there is data); WALL_CLOCK_TIME ones
fire after a batch's records, once the wall clock passed `interval` since the last firing. Their
store writes and forwarded records commit with the batch. Because `init` runs for every batch, a
schedule is identified by the processor node and the order of its schedule() calls: the next firing
time is kept in the task's state (it survives restarts), and a schedule cancelled with
`Cancellable.cancel()` stays cancelled.
"""
from __future__ import annotations

from enum import Enum
from typing import Any, Callable

from statekit.errors import TopologyError


class PunctuationType(Enum):
    STREAM_TIME = "stream_time"
    WALL_CLOCK_TIME = "wall_clock_time"


class Cancellable:
    """What schedule() returns: cancel() stops the punctuator (for good: see the module docstring)."""

    __slots__ = ("_schedule",)

    def __init__(self, schedule) -> None:
        self._schedule = schedule

    def cancel(self) -> None:
        self._schedule.cancel()

    @property
    def cancelled(self) -> bool:
        return self._schedule.cancelled


class Processor:
    """Base class (optional: any class with init(context) and process(key, value) works)."""

    context: Any = None

    def init(self, context: "ProcessorContext") -> None:
        self.context = context

    def process(self, key: Any, value: Any) -> None:  # pragma: no cover - to be overridden
        raise NotImplementedError

    def close(self) -> None:
        pass


class ProcessorContext:
    """The running task as a processor sees it. `timestamp`, `offset`, `partition` and `topic` are
    those of the source record being processed; `forward(key, value)` sends a record downstream."""

    __slots__ = ("_task", "_rec", "_down", "_stores", "_node")

    def __init__(self, task_processor, node_name: str, store_names, downstream) -> None:
        self._task = task_processor
        self._rec = task_processor.rec
        self._down = downstream
        self._stores = set(store_names)
        self._node = node_name

    def get_store(self, name: str):
        if name not in self._stores:
            raise TopologyError(f"processor {self._node} asked for store {name!r} but declared "
                                f"{sorted(self._stores) or 'no stores'}: list it in "
                                f"process(..., stores=[...])")
        return self._task.store(name)

    def forward(self, key: Any, value: Any) -> None:
        self._down(key, value)

    def schedule(self, interval_ms: int, punctuation_type: PunctuationType,
                 callback: Callable[[int], None]) -> Cancellable:
        """Call callback(timestamp) every interval_ms of stream time or wall-clock time (see the
        module docstring)."""
        return self._task.schedule(self._node, interval_ms, punctuation_type, callback)

    @property
    def timestamp(self) -> int:
        return self._rec.timestamp

    @property
    def offset(self) -> int:
        return self._rec.offset

    @property
    def partition(self) -> int:
        return self._rec.partition

    @property
    def topic(self) -> str:
        return self._rec.topic

    @property
    def task_id(self) -> int:
        return self._task.task_id

    @property
    def batch_id(self) -> int:
        return self._task.batch_id

    @property
    def stream_time(self) -> int:
        """The highest record timestamp this task has seen (persisted with its state)."""
        return self._task.stream_time
