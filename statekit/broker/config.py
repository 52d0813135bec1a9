"""Topic and broker configs: names, defaults, validation.

Names and meanings follow Kafka's so every tool's `--config` works. Defaults are Kafka's except
where a teaching tool wants to see things happen quickly (the cleaner backoff).
"""
from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    """A config name or value Kafka would reject (INVALID_CONFIG)."""


def _bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("true", "false"):
        return s == "true"
    raise ConfigError(f"expected true or false, got {v!r}")


def _long(lo: int | None = None):
    def conv(v):
        try:
            n = int(str(v).strip())
        except ValueError:
            raise ConfigError(f"expected an integer, got {v!r}") from None
        if lo is not None and n < lo:
            raise ConfigError(f"must be >= {lo}, got {n}")
        return n

    return conv


def _ratio(v):
    try:
        f = float(str(v).strip())
    except ValueError:
        raise ConfigError(f"expected a number between 0 and 1, got {v!r}") from None
    if not 0.0 <= f <= 1.0:
        raise ConfigError(f"expected a number between 0 and 1, got {v!r}")
    return f


def _policy(v):
    parts = sorted({p.strip() for p in str(v).split(",") if p.strip()})
    if not parts or any(p not in ("compact", "delete") for p in parts):
        raise ConfigError(f"cleanup.policy must be delete, compact or compact,delete; got {v!r}")
    return ",".join(parts)


def _choice(*options):
    def conv(v):
        s = str(v).strip()
        if s not in options:
            raise ConfigError(f"expected one of {', '.join(options)}; got {v!r}")
        return s

    return conv


@dataclass(frozen=True)
class ConfigDef:
    name: str
    default: str
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
        ConfigDef("delete.retention.ms", "86400000", _long(0), "how long tombstones survive cleaning"),
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

BROKER_CONFIGS = {
    c.name: c
    for c in [
        ConfigDef("auto.create.topics.enable", "false", _bool, "create unknown topics on metadata/produce"),
        ConfigDef("num.partitions", "1", _long(1), "partitions of an auto-created topic"),
        ConfigDef("default.replication.factor", "1", _long(1)),
        ConfigDef("log.cleaner.backoff.ms", "1000", _long(10), "pause between log cleaner passes"),
        ConfigDef("log.cleaner.enable", "true", _bool),
        ConfigDef("log.retention.check.interval.ms", "1000", _long(10)),
        ConfigDef("log.flush.interval.ms", "1000", _long(10), "fsync dirty logs this often"),
        ConfigDef("message.max.bytes", "1048588", _long(0)),
        ConfigDef("socket.request.max.bytes", "104857600", _long(1)),
        ConfigDef("broker.id", "0", _long(0)),
    ]
}


def validate_topic_configs(configs: dict) -> dict:
    """Normalised string values for the given overrides; ConfigError names the bad one."""
    out = {}
    for name, value in (configs or {}).items():
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise ConfigError(f"unknown topic config {name!r}")
        if value is None:
            raise ConfigError(f"{name}: a value is required")
        try:
            conv = d.convert(value)
        except ConfigError as e:
            raise ConfigError(f"{name}: {e}") from None
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
            raise ConfigError(f"{name}: {e}") from None
    return out


def _to_str(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class TopicConfig:
    """Effective config of one topic: overrides over defaults, typed on access."""

    __slots__ = ("overrides", "_cache")

    def __init__(self, overrides: dict | None = None):
        self.overrides = dict(overrides or {})
        self._cache = {}

    def get(self, name: str):
        v = self._cache.get(name)
        if v is None:
            d = TOPIC_CONFIGS[name]
            v = d.convert(self.overrides.get(name, d.default))
            self._cache[name] = v
        return v

    def raw(self, name: str) -> str:
        return self.overrides.get(name, TOPIC_CONFIGS[name].default)

    def set(self, name: str, value: str | None) -> None:
        if value is None:
            self.overrides.pop(name, None)
        else:
            self.overrides[name] = value
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

    def raw(self, name: str) -> str:
        return self.overrides.get(name, BROKER_CONFIGS[name].default)

    def get(self, name: str):
        return BROKER_CONFIGS[name].convert(self.raw(name))
