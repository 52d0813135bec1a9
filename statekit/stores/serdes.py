"""Serdes: the only place where typed keys and values become bytes (and back).

Stores below the metered layer see bytes only, so equal keys must give equal bytes: JSON is written
compact with sorted object keys. No pickle: state bytes outlive the code that wrote them and travel
through Kafka, where other tools read them.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Serde(Protocol):
    """Anything with these two methods is a serde."""

    def to_bytes(self, obj: Any) -> bytes: ...

    def from_bytes(self, data: bytes) -> Any: ...


class JsonSerde:
    """Compact JSON, sorted object keys (equal values -> equal bytes), ASCII-safe. The default."""

    name = "json"

    def __init__(self) -> None:
        enc = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=True,
                               allow_nan=True)
        self._encode = enc.encode
        self._decode = json.JSONDecoder().decode

    def to_bytes(self, obj: Any) -> bytes:
        t = type(obj)
        if t is int:  # hot path: counts
            return b"%d" % obj
        return self._encode(obj).encode("ascii")

    def from_bytes(self, data: bytes, _num: bytes = b"-0123456789") -> Any:
        if data[:1] in _num:  # hot path: an integer (int() reads what to_bytes wrote for ints)
            try:
                return int(data)
            except ValueError:  # a float, -Infinity, ...
                pass
        return self._decode(data.decode("utf-8"))


class StrSerde:
    """UTF-8 text."""

    name = "str"

    def __init__(self) -> None:
        # the C methods themselves: no Python frame on the hot path (both default to UTF-8)
        self.to_bytes = str.encode
        self.from_bytes = bytes.decode


class Int64Serde:
    """8-byte big-endian signed: byte order equals numeric order for non-negative numbers (ranges,
    timestamps); the same layout as Kafka's LongSerializer."""

    name = "int64"

    def __init__(self) -> None:
        s = struct.Struct(">q")
        self._pack = s.pack
        self._unpack = s.unpack

    def to_bytes(self, obj: int) -> bytes:
        return self._pack(obj)

    def from_bytes(self, data: bytes) -> int:
        return self._unpack(data)[0]


class BytesSerde:
    """Identity: the value already is bytes (bytearray/memoryview are copied to bytes)."""

    name = "bytes"

    def to_bytes(self, obj: bytes) -> bytes:
        return obj if type(obj) is bytes else bytes(obj)

    def from_bytes(self, data: bytes) -> bytes:
        return data


_REGISTRY: dict[str, Serde] = {
    "json": JsonSerde(),
    "str": StrSerde(),
    "string": StrSerde(),
    "int64": Int64Serde(),
    "long": Int64Serde(),
    "bytes": BytesSerde(),
    "raw": BytesSerde(),
}


def register_serde(name: str, serde: Serde) -> None:
    """Make `serde` available by name (for StoreSpec and inspection)."""
    if isinstance(serde, str):
        raise TypeError(f"serde {name!r}: register an object, not a name")
    try:
        _REGISTRY[name] = get_serde(serde)
    except TypeError:
        raise TypeError(f"serde {name!r} needs to_bytes(obj) and from_bytes(data) methods") from None


def get_serde(spec: Any = "json") -> Serde:
    """A registered name, or any object with to_bytes/from_bytes (returned as is); None -> json."""
    if spec is None:
        return _REGISTRY["json"]
    if isinstance(spec, str):
        try:
            return _REGISTRY[spec]
        except KeyError:
            raise ValueError(f"unknown serde {spec!r}; known: {', '.join(sorted(_REGISTRY))} "
                             f"(or pass an object with to_bytes/from_bytes)") from None
    if (not isinstance(spec, (int, type)) and callable(getattr(spec, "to_bytes", None))
            and callable(getattr(spec, "from_bytes", None))):
        return spec  # (ints have to_bytes/from_bytes too, with other meanings)
    raise TypeError(f"not a serde: {spec!r} (needs to_bytes/from_bytes, or a registered name)")


def serde_name(serde: Serde) -> str | None:
    """The registered name of a serde object, if it has one (recorded for inspection)."""
    for name, s in _REGISTRY.items():
        if s is serde:
            return name
    return getattr(serde, "name", None) if getattr(serde, "name", None) in _REGISTRY else None
