"""The Kafka address of the App, the CLI and the kernel extension: the configured one, else the
embedded broker of ``STATEKIT_HOME``, started (or reused) here. The client never starts a broker
itself (:func:`statekit.kafka.config.configured_bootstrap` is its part of this)."""
from __future__ import annotations

from statekit.contracts import default_broker_dir
from statekit.kafka.config import configured_bootstrap


def resolve_bootstrap(bootstrap: str | None = None, detach: bool = False) -> str:
    """Explicit value, else ``STATEKIT_BOOTSTRAP``, else ``bootstrap.servers`` of
    ``STATEKIT_KAFKA_CONFIG``, else start (or reuse) the embedded broker in ``STATEKIT_HOME``
    (default ``~/.statekit``) ``/broker`` (with authentication when
    ``statekit.broker.should_auth()``: under JupyterHub, or STATEKIT_BROKER_AUTH=1; with TLS when
    ``statekit.broker.should_tls()``: STATEKIT_BROKER_TLS=1). A broker started
    here stops when this process ends, unless ``detach`` (the CLI's commands: the broker serves the
    next one)."""
    found = configured_bootstrap(bootstrap)
    if found:
        return found
    from statekit import broker as broker_mod  # the embedded broker: only when nothing is configured

    handle = broker_mod.start(dir=default_broker_dir(), auth=broker_mod.should_auth(), tls=broker_mod.should_tls(),
                              detach=detach)
    return handle.bootstrap
