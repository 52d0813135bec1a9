"""Where the client connects and how it authenticates: Kafka client settings from
``STATEKIT_KAFKA_CONFIG`` and ``kafka_config=`` (JSON or .properties), the bootstrap address they
name, and the SASL / TLS parameters of a connection. Nothing here starts a broker: an address
that is not configured is the caller's to find (``statekit.bootstrap`` starts the embedded one
for the App and the CLI)."""
from __future__ import annotations

import json
import os
import re
import ssl
from dataclasses import dataclass

from statekit.errors import StatekitError

__all__ = ["load_kafka_config", "configured_bootstrap", "Security", "security_of"]


_SECURITY_KEYS = {
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "sasl.jaas.config", "ssl.ca.location", "ssl.truststore.location", "ssl.truststore.type",
    "ssl.certificate.location", "ssl.keystore.location", "ssl.keystore.type", "ssl.key.location",
    "ssl.key.password", "ssl.keystore.password", "ssl.endpoint.identification.algorithm",
}
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_CONFIG_HINT = ("STATEKIT_KAFKA_CONFIG takes a JSON object, or the path of a .json or .properties "
                "file, of Kafka client settings (bootstrap.servers, security.protocol, sasl.mechanism, "
                "sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location, "
                "ssl.key.location, ...)")


def _parse_properties(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if m is None:
            raise StatekitError(f"cannot read the Kafka client setting {line!r}: write KEY=VALUE")
        out[m.group(1)] = m.group(2)
    return out


def _read_config_source(text: str, origin: str) -> dict:
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise StatekitError(f"{origin} is not valid JSON ({e}); {_CONFIG_HINT}") from None
    else:
        path = os.path.expanduser(text)
        try:
            with open(path) as f:
                body = f.read()
        except OSError as e:
            raise StatekitError(f"{origin}: cannot read {path} ({e.strerror}); {_CONFIG_HINT}") from None
        if path.endswith(".json") or body.lstrip().startswith("{"):
            try:
                doc = json.loads(body)
            except ValueError as e:
                raise StatekitError(f"{path} is not valid JSON ({e}); {_CONFIG_HINT}") from None
        else:
            doc = _parse_properties(body)
    if not isinstance(doc, dict):
        raise StatekitError(f"{origin} must be a JSON object of settings; {_CONFIG_HINT}")
    return {str(k): ("" if v is None else str(v)) for k, v in doc.items()}


def load_kafka_config(kafka_config: dict | str | None = None) -> dict:
    """Kafka client settings: ``STATEKIT_KAFKA_CONFIG`` (a JSON object, or the path of a .json /
    .properties file) overridden by ``kafka_config`` (a dict, or the same kinds of text). Keys are
    Kafka's (librdkafka's or Java's): ``bootstrap.servers``, ``security.protocol``,
    ``sasl.mechanism``, ``sasl.username``, ``sasl.password`` (or ``sasl.jaas.config``),
    ``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
    ``ssl.endpoint.identification.algorithm``. Other keys (producer or consumer tuning) are ignored;
    an unknown ``security.``/``sasl.``/``ssl.`` key or a bad value is an error."""
    cfg = _read_config_source(os.environ.get("STATEKIT_KAFKA_CONFIG", ""), "STATEKIT_KAFKA_CONFIG")
    if isinstance(kafka_config, str):
        cfg.update(_read_config_source(kafka_config, "kafka_config"))
    elif kafka_config:
        cfg.update({str(k): ("" if v is None else str(v)) for k, v in kafka_config.items()})
    for k in cfg:
        if k.split(".", 1)[0] in ("security", "sasl", "ssl") and k not in _SECURITY_KEYS:
            raise StatekitError(f"unknown Kafka client setting {k!r}: statekit understands "
                                f"{', '.join(sorted(_SECURITY_KEYS))}")
    security_of(cfg)  # validate now: a bad setting fails here, in one line
    return cfg


@dataclass
class Security:
    protocol: str
    mechanism: str | None
    username: str | None
    password: str | None
    ssl_context: ssl.SSLContext | None
    check_hostname: bool
    client_cert: str | None = None  # the certificate this client shows (mutual TLS)


def security_of(cfg: dict) -> Security | None:
    proto = (cfg.get("security.protocol") or "PLAINTEXT").upper()
    if proto not in _PROTOCOLS:
        raise StatekitError(f"security.protocol must be one of {', '.join(_PROTOCOLS)}, got {proto!r}")
    if proto == "PLAINTEXT":
        return None
    mech = user = password = None
    if proto.startswith("SASL"):
        mech = (cfg.get("sasl.mechanism") or cfg.get("sasl.mechanisms") or "PLAIN").upper()
        if mech not in _MECHANISMS:
            raise StatekitError(f"sasl.mechanism must be one of {', '.join(_MECHANISMS)}, got {mech!r}")
        user, password = cfg.get("sasl.username"), cfg.get("sasl.password")
        jaas = cfg.get("sasl.jaas.config")
        if jaas and not (user and password):
            u = re.search(r'username\s*=\s*"([^"]*)"', jaas)
            p = re.search(r'password\s*=\s*"([^"]*)"', jaas)
            user, password = (u.group(1) if u else None), (p.group(1) if p else None)
        if not user or password is None:
            raise StatekitError(f"security.protocol={proto} needs sasl.username and sasl.password "
                                f"(or sasl.jaas.config)")
    ctx = cert = None
    check = True
    if proto.endswith("SSL"):
        for k in ("ssl.truststore.type", "ssl.keystore.type"):
            if cfg.get(k) and cfg[k].upper() != "PEM":
                raise StatekitError(f"{k}={cfg[k]}: statekit reads PEM files only; convert the store "
                                    f"with keytool/openssl and use ssl.ca.location / ssl.certificate.location")
        ca = cfg.get("ssl.ca.location") or cfg.get("ssl.truststore.location")
        cert = cfg.get("ssl.certificate.location") or cfg.get("ssl.keystore.location")
        key = cfg.get("ssl.key.location")
        try:
            ctx = ssl.create_default_context(cafile=ca or None)
            if cert:
                ctx.load_cert_chain(cert, key or None,
                                    password=cfg.get("ssl.key.password") or cfg.get("ssl.keystore.password") or None)
        except (OSError, ssl.SSLError) as e:
            raise StatekitError(f"cannot load the TLS files ({e}): check ssl.ca.location, "
                                f"ssl.certificate.location and ssl.key.location") from None
        check = (cfg.get("ssl.endpoint.identification.algorithm", "https") or "none").lower() == "https"
        ctx.check_hostname = check
    return Security(proto, mech, user, password, ctx, check, cert or None)


def configured_bootstrap(bootstrap: str | None = None) -> str | None:
    """Explicit value, else ``STATEKIT_BOOTSTRAP``, else ``bootstrap.servers`` of
    ``STATEKIT_KAFKA_CONFIG``; None when none is set."""
    if bootstrap:
        return bootstrap
    env = os.environ.get("STATEKIT_BOOTSTRAP")
    if env:
        return env
    return load_kafka_config().get("bootstrap.servers") or None


def explicit_bootstrap(kafka_config: dict | str | None) -> str | None:
    """``bootstrap.servers`` of an explicit ``kafka_config`` (it beats the environment's)."""
    if not kafka_config:
        return None
    explicit = _read_config_source(kafka_config, "kafka_config") if isinstance(kafka_config, str) \
        else kafka_config
    return explicit.get("bootstrap.servers") or None
