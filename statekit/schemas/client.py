"""Which Schema Registry a serde talks to, and one client per registry and process.

A serde keeps only text (a URL, or settings without live objects), so it pickles to instance
processes and Spark's Python workers; each process makes its own confluent-kafka
``SchemaRegistryClient`` from that text on first use, and every serde of the process that names the
same registry shares it — and its cache, which holds every schema fetched by id, so a batch costs
no request per record.

Where the settings come from, first found:
1. the serde's own ``registry=``: a URL (``https://user:secret@host:8081`` carries basic auth), a
   dict of settings, or the embedded registry's handle (its ``client_config``: URL and auth);
2. ``STATEKIT_SCHEMA_REGISTRY_URL``;
3. ``schema.registry.url`` in ``STATEKIT_KAFKA_CONFIG``, with ``basic.auth.user.info`` (Java's
   ``schema.registry.basic.auth.user.info`` too) and ``schema.registry.ssl.*`` beside it;
4. the embedded registry of ``STATEKIT_HOME`` when it runs (``%statekit up`` starts it), with its
   basic auth when it has one (``statekit.registry.client_config``: found from any process).
Settings use the Java clients' names or confluent-kafka's (``url``, ``basic.auth.user.info``,
``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``).
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from statekit.errors import StatekitError

ENV_URL = "STATEKIT_SCHEMA_REGISTRY_URL"

# Java client names (in STATEKIT_KAFKA_CONFIG or a settings dict) -> confluent-kafka's
_NAMES = {
    "schema.registry.url": "url",
    "schema.registry.basic.auth.user.info": "basic.auth.user.info",
    "schema.registry.ssl.ca.location": "ssl.ca.location",
    "schema.registry.ssl.truststore.location": "ssl.ca.location",
    "schema.registry.ssl.certificate.location": "ssl.certificate.location",
    "schema.registry.ssl.keystore.location": "ssl.certificate.location",
    "schema.registry.ssl.key.location": "ssl.key.location",
    "schema.registry.ssl.key.password": "ssl.key.password",
}
_OWN = {"url", "basic.auth.user.info", "ssl.ca.location", "ssl.certificate.location",
        "ssl.key.location", "ssl.key.password", "timeout", "max.retries"}
_IGNORED = {"basic.auth.credentials.source"}   # Java's: where the user info is; both are read here
HINT = ("start the embedded one with %statekit up (or `statekit registry start`), or set "
        f"{ENV_URL} (or schema.registry.url in STATEKIT_KAFKA_CONFIG)")

_clients: dict = {}
_lock = threading.Lock()


def _normalize(settings: dict, origin: str) -> dict:
    out: dict = {}
    for k, v in settings.items():
        k = str(k)
        name = _NAMES.get(k, k)
        if name in _IGNORED:
            continue
        if name not in _OWN:
            raise StatekitError(f"unknown schema registry setting {k!r} in {origin}: use "
                                f"{', '.join(sorted(_NAMES))}")
        out[name] = v if name in ("timeout", "max.retries") else str(v)
    if not out.get("url"):
        raise StatekitError(f"{origin} names no registry URL (schema.registry.url)")
    return out


def _from_kafka_config() -> dict | None:
    from statekit.kafka.config import load_kafka_config

    cfg = load_kafka_config()
    if not cfg.get("schema.registry.url"):
        return None
    picked = {k: v for k, v in cfg.items()
              if k in _NAMES or (k in _OWN and k != "url" and not k.startswith("ssl."))}
    return _normalize(picked, "STATEKIT_KAFKA_CONFIG")


def _embedded() -> dict | None:
    """The settings of the embedded registry of ``STATEKIT_HOME`` when it runs (its URL, and its
    basic auth when it has one); never starts one: a Spark worker or an instance process must
    not."""
    from statekit import registry as embedded

    return embedded.client_config()


def settings_for(registry: Any = None) -> dict:
    """The client settings (confluent-kafka's names) of ``registry`` or of the configuration; a
    one-line ``StatekitError`` when none is configured and no embedded registry runs."""
    if registry is not None:
        if isinstance(registry, str):
            return _normalize({"url": registry}, "registry=")
        if isinstance(registry, dict):
            return _normalize(registry, "registry=")
        conf = getattr(registry, "client_config", None)   # the embedded registry's handle
        if isinstance(conf, dict):
            return _normalize(conf, "registry=")
        url = getattr(registry, "url", None)
        if isinstance(url, str):
            return _normalize({"url": url}, "registry=")
        raise StatekitError(f"registry= takes a URL, a dict of settings or the embedded "
                            f"registry's handle, not {type(registry).__name__}")
    env = os.environ.get(ENV_URL)
    if env:
        return _normalize({"url": env}, ENV_URL)
    found = _from_kafka_config()
    if found is not None:
        return found
    found = _embedded()
    if found:
        return _normalize(found, "the embedded registry")
    raise StatekitError(f"no schema registry is running or configured: {HINT}")


def shown(settings: dict) -> str:
    """The registry's URL without its credentials (for messages)."""
    parts = urlsplit(settings["url"].split(",")[0])
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _key(settings: dict) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def client_for(settings: dict):
    """This process's ``SchemaRegistryClient`` for ``settings`` (one per registry: the cache is
    shared by every serde that reads it)."""
    key = _key(settings)
    c = _clients.get(key)
    if c is not None:
        return c
    with _lock:
        c = _clients.get(key)
        if c is None:
            c = _clients[key] = _schema_registry().SchemaRegistryClient.new_client(dict(settings))
    return c


def _schema_registry():
    """confluent_kafka.schema_registry, imported on first use (it pulls httpx and authlib, which
    a kernel that reads no schema does not need), without the notice authlib gives its own
    users about its httpx integration as it is imported: it is not for a notebook. (authlib
    puts its warnings first in the filters as it is imported, so ours goes in after that.)"""
    with warnings.catch_warnings():
        import authlib.deprecate  # noqa: F401
        warnings.filterwarnings("ignore", message="The httpx module is deprecated")
        from confluent_kafka import schema_registry
    return schema_registry


def forget_clients() -> None:
    """Drop this process's clients (tests; a registry restarted at another address)."""
    with _lock:
        _clients.clear()
