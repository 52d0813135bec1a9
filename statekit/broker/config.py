"""Topic and broker configs: names, defaults, validation, and the broker settings that are the
defaults of topics which do not set their own.

Names, meanings and error messages follow Kafka's, so every tool's `--config` works and clients
that match on Kafka's wording (e.g. "Unknown topic config name: X") see it. Defaults are Kafka's
except where a teaching tool wants to see things happen quickly (the cleaner backoff, the
transaction timeout check) or where Kafka is unbounded (the request memory pool).

`group.initial.rebalance.delay.ms` defaults to 0, not Kafka's 3000: the value Kafka's own
`config/server.properties` ships with "for a better out-of-the-box experience for development
and testing". A consumer group on this broker (a notebook's consumer, the tests' groups of
kafka-python, librdkafka and kcat members) gets its first assignment at once instead of 3 s
later; a member that joins a moment after the first costs one more rebalance, which these
groups wait for anyway. Set it (e.g. `--config group.initial.rebalance.delay.ms=3000`) to see
Kafka's production behaviour: members starting together land in one generation.

A topic config's value comes from, in order: the topic's override, the broker setting that is its
synonym (`log.retention.ms` > `log.retention.minutes` > `log.retention.hours` for `retention.ms`,
`log.segment.bytes` for `segment.bytes`, `message.max.bytes` for `max.message.bytes`, ...), the
built-in default.
"""
from __future__ import annotations

import re

from dataclasses import dataclass


class ConfigError(ValueError):
    """A config name or value Kafka would reject (INVALID_CONFIG); str() is Kafka's wording."""


def _bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("true", "false"):
        return s == "true"
    raise ConfigError("Expected value to be either true or false")


def _long(lo: int | None = None):
    def conv(v):
        try:
            n = int(str(v).strip())
        except ValueError:
            raise ConfigError("Not a number of type LONG") from None
        if lo is not None and n < lo:
            raise ConfigError(f"Value must be at least {lo}")
        return n

    return conv


def _ratio(v):
    try:
        f = float(str(v).strip())
    except ValueError:
        raise ConfigError("Not a number of type DOUBLE") from None
    if f < 0.0:
        raise ConfigError("Value must be at least 0")
    if f > 1.0:
        raise ConfigError("Value must be no more than 1")
    return f


def _policy(v):
    parts = sorted({p.strip() for p in str(v).split(",") if p.strip()})
    if not parts or any(p not in ("compact", "delete") for p in parts):
        raise ConfigError("String must be one of: compact, delete")
    return ",".join(parts)


def _choice(*options):
    def conv(v):
        s = str(v).strip()
        if s not in options:
            raise ConfigError(f"String must be one of: {', '.join(options)}")
        return s

    return conv


def _mechanisms(v):
    parts = [p.strip() for p in str(v).split(",") if p.strip()]
    known = ("PLAIN", "SCRAM-SHA-256")
    if not parts or any(p not in known for p in parts):
        raise ConfigError(f"String must be a list of: {', '.join(known)}")
    return ",".join(parts)


def _listener(v):
    """Kafka's ``advertised.listeners`` for one plaintext listener: ``PLAINTEXT://HOST:PORT``."""
    m = re.fullmatch(r"PLAINTEXT://([^:/\s]+):(\d{1,5})", str(v).strip())
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ConfigError("expected PLAINTEXT://HOST:PORT")
    return f"PLAINTEXT://{m.group(1)}:{int(m.group(2))}"


@dataclass(frozen=True)
class ConfigDef:
    name: str
    default: str | None
    convert: object
    doc: str = ""


TOPIC_CONFIGS = {
    c.name: c
    for c in [
        ConfigDef("cleanup.policy", "delete", _policy, "delete old segments, compact by key, or both"),
        ConfigDef("retention.ms", "604800000", _long(-1), "-1 keeps segments forever"),
        ConfigDef("retention.bytes", "-1", _long(-1), "per partition; -1 means no size limit"),
        ConfigDef("segment.bytes", "1073741824", _long(14), "roll the active segment at this size"),
        ConfigDef("segment.ms", "604800000", _long(1), "roll the active segment at this age, on the next append"),
        ConfigDef("segment.index.bytes", "10485760", _long(4)),
        ConfigDef("index.interval.bytes", "4096", _long(0), "bytes between offset index entries"),
        ConfigDef("delete.retention.ms", "86400000", _long(0),
                  "how long tombstones and the markers of emptied transactions survive cleaning"),
        ConfigDef("min.cleanable.dirty.ratio", "0.5", _ratio, "clean when dirty/total >= this"),
        ConfigDef("min.compaction.lag.ms", "0", _long(0)),
        ConfigDef("max.compaction.lag.ms", "9223372036854775807", _long(1)),
        ConfigDef("max.message.bytes", "1048588", _long(0), "largest record batch accepted"),
        ConfigDef("message.timestamp.type", "CreateTime", _choice("CreateTime", "LogAppendTime")),
        ConfigDef("compression.type", "producer", _choice("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")),
        ConfigDef("min.insync.replicas", "1", _long(1)),
        ConfigDef("flush.messages", "9223372036854775807", _long(1)),
        ConfigDef("flush.ms", "9223372036854775807", _long(0)),
        ConfigDef("file.delete.delay.ms", "60000", _long(0)),
        ConfigDef("preallocate", "false", _bool),
        ConfigDef("unclean.leader.election.enable", "false", _bool),
        ConfigDef("message.downconversion.enable", "true", _bool),
    ]
}

# topic config -> [(broker config, factor to the topic's unit)], first set one wins (Kafka's synonyms)
TOPIC_SYNONYMS = {
    "retention.ms": [("log.retention.ms", 1), ("log.retention.minutes", 60_000), ("log.retention.hours", 3_600_000)],
    "retention.bytes": [("log.retention.bytes", 1)],
    "cleanup.policy": [("log.cleanup.policy", None)],
    "segment.bytes": [("log.segment.bytes", 1)],
    "segment.ms": [("log.roll.ms", 1), ("log.roll.hours", 3_600_000)],
    "segment.index.bytes": [("log.index.size.max.bytes", 1)],
    "index.interval.bytes": [("log.index.interval.bytes", 1)],
    "delete.retention.ms": [("log.cleaner.delete.retention.ms", 1)],
    "min.cleanable.dirty.ratio": [("log.cleaner.min.cleanable.ratio", None)],
    "min.compaction.lag.ms": [("log.cleaner.min.compaction.lag.ms", 1)],
    "max.compaction.lag.ms": [("log.cleaner.max.compaction.lag.ms", 1)],
    "max.message.bytes": [("message.max.bytes", 1)],
    "message.timestamp.type": [("log.message.timestamp.type", None)],
    "compression.type": [("compression.type", None)],
    "min.insync.replicas": [("min.insync.replicas", 1)],
    "flush.messages": [("log.flush.interval.messages", 1)],
    "file.delete.delay.ms": [("log.segment.delete.delay.ms", 1)],
    "preallocate": [("log.preallocate", None)],
    "unclean.leader.election.enable": [("unclean.leader.election.enable", None)],
}

BROKER_CONFIGS = {
    c.name: c
    for c in [
        ConfigDef("auto.create.topics.enable", "false", _bool, "create unknown topics on metadata/produce"),
        ConfigDef("num.partitions", "1", _long(1), "partitions of an auto-created topic"),
        ConfigDef("default.replication.factor", "1", _long(1)),
        ConfigDef("broker.id", "0", _long(0)),
        ConfigDef("advertised.listeners", None, _listener,
                  "the address Metadata and FindCoordinator give clients, PLAINTEXT://HOST:PORT "
                  "(a proxy in front of the broker); default: the one it listens on"),
        # defaults of topics that do not set their own (see TOPIC_SYNONYMS)
        ConfigDef("log.retention.ms", None, _long(-1), "retention.ms of topics without their own; -1: forever"),
        ConfigDef("log.retention.minutes", None, _long(-1), "used when log.retention.ms is not set"),
        ConfigDef("log.retention.hours", "168", _long(-1), "used when log.retention.ms/.minutes are not set"),
        ConfigDef("log.retention.bytes", "-1", _long(-1), "retention.bytes of topics without their own"),
        ConfigDef("log.cleanup.policy", "delete", _policy, "cleanup.policy of topics without their own"),
        ConfigDef("log.segment.bytes", "1073741824", _long(14), "segment.bytes of topics without their own"),
        ConfigDef("log.roll.ms", None, _long(1)),
        ConfigDef("log.roll.hours", "168", _long(1)),
        ConfigDef("log.index.size.max.bytes", "10485760", _long(4)),
        ConfigDef("log.index.interval.bytes", "4096", _long(0)),
        ConfigDef("log.cleaner.delete.retention.ms", "86400000", _long(0)),
        ConfigDef("log.cleaner.min.cleanable.ratio", "0.5", _ratio),
        ConfigDef("log.cleaner.min.compaction.lag.ms", "0", _long(0)),
        ConfigDef("log.cleaner.max.compaction.lag.ms", "9223372036854775807", _long(1)),
        ConfigDef("log.message.timestamp.type", "CreateTime", _choice("CreateTime", "LogAppendTime")),
        ConfigDef("compression.type", "producer", _choice("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")),
        ConfigDef("min.insync.replicas", "1", _long(1)),
        ConfigDef("log.flush.interval.messages", "9223372036854775807", _long(1)),
        ConfigDef("log.segment.delete.delay.ms", "60000", _long(0)),
        ConfigDef("log.preallocate", "false", _bool),
        ConfigDef("unclean.leader.election.enable", "false", _bool),
        ConfigDef("message.max.bytes", "1048588", _long(0), "largest record batch accepted (max.message.bytes of topics without their own)"),
        # the broker's own duties
        ConfigDef("log.cleaner.backoff.ms", "1000", _long(10), "pause between log cleaner passes"),
        ConfigDef("log.cleaner.enable", "true", _bool),
        ConfigDef("log.retention.check.interval.ms", "1000", _long(10)),
        ConfigDef("log.flush.interval.ms", "1000", _long(10), "fsync dirty logs this often"),
        # bounded resources
        ConfigDef("socket.request.max.bytes", "104857600", _long(1), "largest request frame accepted"),
        ConfigDef("queued.max.request.bytes", "134217728", _long(-1),
                  "bytes of requests read but not yet handled, all connections together (-1: unbounded)"),
        ConfigDef("fetch.max.bytes", "57671680", _long(0),
                  "largest Fetch response; also the bytes of answers one connection may have waiting to be sent"),
        # transactions
        ConfigDef("transaction.max.timeout.ms", "900000", _long(1), "largest transaction.timeout.ms a producer may ask for"),
        ConfigDef("transactional.id.expiration.ms", "604800000", _long(1),
                  "forget a transactional id idle this long"),
        ConfigDef("transaction.abort.timed.out.transaction.cleanup.interval.ms", "1000", _long(1),
                  "how often transactions past their timeout are looked for (and aborted)"),
        # consumer groups
        ConfigDef("group.initial.rebalance.delay.ms", "0", _long(0),
                  "how long the first rebalance of an empty group waits for more members, extended "
                  "by as much while they keep joining (up to the rebalance timeout); 0: at once"),
        # authentication (enabled by `--auth`)
        ConfigDef("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-256", _mechanisms),
    ]
}


def invalid_value(name: str, value, reason: str) -> ConfigError:
    return ConfigError(f"Invalid value {value} for configuration {name}: {reason}")


def validate_topic_configs(configs: dict) -> dict:
    """Normalised string values for the given overrides; ConfigError in Kafka's words."""
    out = {}
    for name, value in (configs or {}).items():
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise ConfigError(f"Unknown topic config name: {name}")
        if value is None:
            raise invalid_value(name, value, "a value is required")
        try:
            conv = d.convert(value)
        except ConfigError as e:
            raise invalid_value(name, value, str(e)) from None
        out[name] = _to_str(conv)
    return out


def validate_broker_configs(configs: dict) -> dict:
    out = {}
    for name, value in (configs or {}).items():
        d = BROKER_CONFIGS.get(name)
        if d is None:
            raise ConfigError(f"unknown broker config {name!r} (known: {', '.join(sorted(BROKER_CONFIGS))})")
        try:
            out[name] = _to_str(d.convert(value))
        except ConfigError as e:
            raise invalid_value(name, value, str(e)) from None
    pool = int(out.get("queued.max.request.bytes", BROKER_CONFIGS["queued.max.request.bytes"].default))
    frame = int(out.get("socket.request.max.bytes", BROKER_CONFIGS["socket.request.max.bytes"].default))
    if 0 <= pool < frame:
        raise ConfigError(f"queued.max.request.bytes ({pool}) must be at least socket.request.max.bytes ({frame}) "
                          f"or -1, else a largest request could never be read")
    return out


def _to_str(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class TopicConfig:
    """Effective config of one topic: overrides over the broker's topic defaults over built-in
    defaults, typed on access. `defaults` is shared with the broker (see
    `BrokerConfig.topic_defaults`)."""

    __slots__ = ("overrides", "defaults", "_cache")

    def __init__(self, overrides: dict | None = None, defaults: dict | None = None):
        self.overrides = dict(overrides or {})
        self.defaults = defaults if defaults is not None else {}
        self._cache = {}

    def get(self, name: str):
        v = self._cache.get(name)
        if v is None:
            v = TOPIC_CONFIGS[name].convert(self.raw(name))
            self._cache[name] = v
        return v

    def raw(self, name: str) -> str:
        v = self.overrides.get(name)
        if v is None:
            v = self.defaults.get(name)
        return v if v is not None else TOPIC_CONFIGS[name].default

    def source(self, name: str) -> str:
        """'topic' (an override), 'broker' (a broker setting) or 'default'."""
        if name in self.overrides:
            return "topic"
        return "broker" if name in self.defaults else "default"

    def set(self, name: str, value: str | None) -> None:
        if value is None:
            self.overrides.pop(name, None)
        else:
            self.overrides[name] = value
        self._cache.clear()

    def replace(self, overrides: dict) -> None:
        self.overrides = dict(overrides)
        self._cache.clear()

    @property
    def compact(self) -> bool:
        return "compact" in self.get("cleanup.policy")

    @property
    def delete(self) -> bool:
        return "delete" in self.get("cleanup.policy")


class BrokerConfig:
    def __init__(self, overrides: dict | None = None):
        self.overrides = validate_broker_configs(overrides or {})

    def raw(self, name: str) -> str | None:
        return self.overrides.get(name, BROKER_CONFIGS[name].default)

    def get(self, name: str):
        raw = self.raw(name)
        return None if raw is None else BROKER_CONFIGS[name].convert(raw)

    def topic_defaults(self) -> dict:
        """Topic config -> value (string, the topic's unit) for every topic config a broker
        setting given at start decides; topics without their own override use these."""
        out = {}
        for topic_name, synonyms in TOPIC_SYNONYMS.items():
            for broker_name, factor in synonyms:
                if broker_name in self.overrides:
                    v = self.overrides[broker_name]
                    if factor not in (None, 1):
                        n = int(v)
                        v = str(n if n < 0 else n * factor)
                    out[topic_name] = v
                    break
        return out

    def topic_default_synonym(self, topic_name: str) -> tuple[str, str] | None:
        """(broker config, its value) that sets this topic config's default, if any."""
        for broker_name, _ in TOPIC_SYNONYMS.get(topic_name, ()):
            if broker_name in self.overrides:
                return broker_name, self.overrides[broker_name]
        return None
