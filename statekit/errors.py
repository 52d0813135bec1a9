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
