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
"""
from __future__ import annotations

from typing import Any

from statekit.errors import TopologyError


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
