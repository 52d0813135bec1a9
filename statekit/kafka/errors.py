"""The errors the Kafka client raises, and the one mapping from a broker's error code to them
(every request of the client answers errors through :func:`raise_for`)."""
from __future__ import annotations

import kafka.errors as kerrors

from statekit.errors import BrokerUnreachable, KafkaTimeout, KafkaUnavailable, StatekitError, UnknownTopic

__all__ = ["KafkaError", "KafkaBusy", "ProducerFenced", "UnsupportedApi", "BrokerUnreachable", "KafkaUnavailable",
           "KafkaTimeout", "UnknownTopic", "raise_for", "RETRIABLE", "HINT"]

HINT = "start one with `statekit broker start` or set STATEKIT_BOOTSTRAP"

# codes after which the same request may succeed once metadata is refreshed
RETRIABLE = {5, 6, 7, 13, 14, 15, 19, 20, 21, 56, 74, 75, 103}


class KafkaError(StatekitError):
    """A broker answered with an error this layer does not handle itself (``code``: Kafka's error
    code when one was answered, for ``statekit.kafka.retry.retriable``)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class KafkaBusy(KafkaError):
    """The broker kept answering with a retriable error (a leader or coordinator moving or
    loading, a transaction's markers being written) past the client's own short retries."""


class ProducerFenced(KafkaError):
    """The transactional producer's epoch is no longer current: another producer with the same
    ``transactional.id`` started (a newer instance of the task), or the broker aborted the open
    transaction because it outlived its timeout. Its open transaction is aborted; this producer
    can do nothing more (a new one fences the other instance in turn)."""


class UnsupportedApi(KafkaError):
    """The broker does not offer a Kafka API (or no version of it statekit speaks) that this call
    needs. Nothing was sent: the connection stays usable. ``api``: Kafka's name of the API;
    ``broker``: ``host:port``."""

    def __init__(self, message: str, api: str = "", broker: str = ""):
        super().__init__(message)
        self.api = api
        self.broker = broker


class Retry(Exception):
    """A produce answered with a retriable error: the caller refreshes metadata and sends again."""


def raise_for(code: int, what: str, topic: str | None = None):
    """Nothing for code 0; else the error a caller of the client can act on, in one line."""
    if code == 0:
        return
    if code == 3 and topic is not None:
        raise UnknownTopic(f"topic {topic!r} does not exist: create it first (or let statekit "
                           f"create it) and check the name")
    if code == 58:
        raise KafkaError(f"{what}: the broker requires SASL authentication (SASL_AUTHENTICATION_FAILED): "
                         f"pass kafka_config= or set STATEKIT_KAFKA_CONFIG with security.protocol, "
                         f"sasl.mechanism, sasl.username and sasl.password (statekit's own broker, "
                         f"started with auth, has them in DIR/credentials.json)")
    if code in (47, 90):
        raise ProducerFenced(f"{what}: the producer was fenced ({kerrors.for_code(code).__name__}): "
                             f"a newer producer with the same transactional id took over, or the "
                             f"transaction outlived its timeout and the broker aborted it")
    err = kerrors.for_code(code)
    raise KafkaError(f"{what}: {err.__name__} (error code {code})", code)
