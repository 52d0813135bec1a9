"""One exception family, one line each: a message that says what went wrong and what to do."""
from __future__ import annotations


class StatekitError(Exception):
    """Base class; str(err) is a single line meant for a person."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class BrokerUnreachable(StatekitError):
    pass


class UnknownTopic(StatekitError):
    pass


class CorruptState(StatekitError):
    pass


class StateLocked(StatekitError):
    pass


class TopologyError(StatekitError):
    pass


class ProcessorError(StatekitError):
    pass


class StaleRead(StatekitError):
    """An interactive query that must hold every commit made before it found no copy of a task at
    its changelog's end in time (Kafka Streams' ``InvalidStateStoreException`` for a restoring
    store). The line names the task, its state and its lag; the same facts as attributes."""

    def __init__(self, message: str, *, task=None, store: str | None = None,
                 state: str | None = None, instance=None, lag: int | None = None,
                 lag_s: float | None = None, waited: float | None = None):
        super().__init__(message)
        self.task, self.store, self.state, self.instance = task, store, state, instance
        self.lag, self.lag_s, self.waited = lag, lag_s, waited
