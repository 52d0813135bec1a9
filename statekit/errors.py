"""One exception family, one line each: a message that says what went wrong and what to do."""
from __future__ import annotations


class StatekitError(Exception):
    """Base class; str(err) is a single line meant for a person."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class BrokerUnreachable(StatekitError):
    pass


class KafkaUnavailable(BrokerUnreachable):
    """A configured broker that cannot be reached right now: the connection was refused, reset or
    closed, or a request went unanswered for the request timeout. Worth retrying (a broker
    restarting, a network blip); ``statekit.kafka.retry`` decides for how long."""


class KafkaTimeout(BrokerUnreachable):
    """Kafka stayed unavailable for longer than the task timeout (``App(task_timeout=...)``,
    Kafka Streams' ``task.timeout.ms``): what waited gives up, in one line."""


class UnknownTopic(StatekitError):
    pass


class CorruptState(StatekitError):
    pass


class StateLocked(StatekitError):
    pass


class DiskFull(StatekitError):
    """A state directory's disk is full (ENOSPC): the write that failed left nothing behind (a
    RocksDB WriteBatch is all or nothing, a checkpoint is written to a temp file first), so the
    store holds its last commit and the changelog every commit; free space, then restart."""


NO_SPACE = "No space left on device"


def store_disk_full(stores, path: str) -> DiskFull:
    """The one line of a store write that met a full disk: the stores, the path, what to do."""
    names = ", ".join(repr(n) for n in stores) or "its stores"
    return DiskFull(f"the disk of the state directory is full: store {names} could not be "
                    f"written at {path} ({NO_SPACE}); nothing of this write is in the store "
                    f"(the changelog holds every commit): free space there, then restart()")


def is_disk_full(err: BaseException) -> bool:
    """An ENOSPC from the OS, or RocksDB's IO error that carries one."""
    return (isinstance(err, OSError) and err.errno == 28) or NO_SPACE in str(err) \
        or "ENOSPC" in str(err)


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
