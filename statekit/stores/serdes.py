"""Serdes: the only place where typed keys and values become bytes (and back).

Stores below the metered layer see bytes only, so equal keys must give equal bytes: JSON is written
compact with sorted object keys. No pickle: state bytes outlive the code that wrote them and travel
through Kafka, where other tools read them.
"""
from __future__ import annotations

import json
import re
import struct
from itertools import repeat as _repeat
from json.encoder import c_make_encoder as _c_make_encoder
from json.encoder import encode_basestring_ascii as _encode_ascii
from operator import itemgetter
from typing import Any, Protocol, runtime_checkable

from statekit.schemas.serdes import FORMATS as _SCHEMA_FORMATS
from statekit.schemas.serdes import SchemaSerde


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
        dec = json.JSONDecoder()
        self._decode = dec.decode
        # json's C encoder and scanner called directly: `encode` builds a C encoder per call
        # and `decode` adds two regex matches per value (half the time of a small dict each)
        self._c_encode = None if _c_make_encoder is None else _c_make_encoder(
            None, enc.default, _encode_ascii, None, ":", ",", True, False, True)
        self._scan = dec.scan_once

    def to_bytes(self, obj: Any) -> bytes:
        t = type(obj)
        if t is int:  # hot path: counts
            return b"%d" % obj
        if self._c_encode is not None:
            try:
                return "".join(self._c_encode(obj, 0)).encode("ascii")
            except RecursionError:    # a value that contains itself: json.encode says so
                pass
        return self._encode(obj).encode("ascii")

    def from_bytes(self, data: bytes, _num: bytes = b"-0123456789") -> Any:
        if data[:1] in _num:  # hot path: an integer (int() reads what to_bytes wrote for ints)
            try:
                return int(data)
            except ValueError:  # a float, -Infinity, ...
                pass
        s = data.decode("utf-8")
        try:
            obj, end = self._scan(s, 0)
            if end == len(s):
                return obj
        except (StopIteration, ValueError):
            pass
        return self._decode(s)    # whitespace around the value, or json's own error


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
    # the Confluent wire format: read with the writer's schema from the registry (the configured
    # one, else the embedded one); `statekit.serdes.avro(schema=...)` etc. to write new values
    **{name: cls() for name, cls in _SCHEMA_FORMATS.items()},
}


# -- composite serdes: values made of other values (the stores of joins, sessions, sliding windows) ---

_Q = struct.Struct(">q")
_I = struct.Struct(">I")


def serde_label(serde: Any) -> str:
    """A serde's name (registered name, composite name, or its type's name)."""
    if isinstance(serde, str):
        return serde
    return getattr(serde, "name", None) or type(serde).__name__


class CompositeSerde:
    """Base of serdes built from other serdes. The inner serdes are kept as given (names or objects)
    and resolved on first use, so a composite pickles to Spark workers like a name does; its `name`
    (`list(json)`, `timestamped(int64)`) is what `get_serde` parses back, so inspection can decode
    a store written with it when its inner serdes are registered ones."""

    kind = ""

    def __init__(self, *inners: Any) -> None:
        self.inners = tuple("json" if i is None else i for i in inners)
        self._resolved = None
        self.name = f"{self.kind}({','.join(serde_label(i) for i in self.inners)})"

    def _inner(self) -> tuple:
        r = self._resolved
        if r is None:
            r = self._resolved = tuple(get_serde(i) for i in self.inners)
        return r

    def __getstate__(self):
        return {"inners": self.inners, "name": self.name}

    def __setstate__(self, st):
        self.inners, self.name, self._resolved = st["inners"], st["name"], None

    def __eq__(self, other):
        return type(other) is type(self) and other.inners == self.inners

    def __hash__(self):
        return hash((self.kind, tuple(serde_label(i) for i in self.inners)))

    def __repr__(self) -> str:
        return self.name


class ListSerde(CompositeSerde):
    """A list of values, each with the inner serde: a 4-byte count, then a 4-byte length and the
    bytes of every item. A stream-join buffer keeps every record of one (key, timestamp) so, in
    arrival order (Kafka Streams' window store with duplicates)."""

    kind = "list"

    def to_bytes(self, items) -> bytes:
        enc = self._inner()[0].to_bytes
        parts = [_I.pack(len(items))]
        for item in items:
            b = enc(item)
            parts.append(_I.pack(len(b)))
            parts.append(b)
        return b"".join(parts)

    def from_bytes(self, data: bytes) -> list:
        dec = self._inner()[0].from_bytes
        (n,) = _I.unpack_from(data, 0)
        pos, out = 4, []
        for _ in range(n):
            (ln,) = _I.unpack_from(data, pos)
            pos += 4
            out.append(dec(data[pos:pos + ln]))
            pos += ln
        return out


class TimestampedSerde(CompositeSerde):
    """A pair (timestamp, value): 8-byte big-endian signed timestamp, a presence byte, the value's
    bytes. A sliding window's (max record timestamp, aggregate); a session's (start, aggregate)."""

    kind = "timestamped"

    def to_bytes(self, pair) -> bytes:
        ts, value = pair
        if value is None:
            return _Q.pack(int(ts)) + b"\x00"
        return _Q.pack(int(ts)) + b"\x01" + self._inner()[0].to_bytes(value)

    def from_bytes(self, data: bytes) -> tuple:
        ts = _Q.unpack_from(data, 0)[0]
        if data[8:9] != b"\x01":
            return ts, None
        return ts, self._inner()[0].from_bytes(data[9:])


_COMPOSITES = {c.kind: c for c in (ListSerde, TimestampedSerde)}


def _split_args(text: str) -> list:
    """Top-level comma-separated parts of `text` (commas inside parentheses belong to the part)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        depth += (ch == "(") - (ch == ")")
        cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _parse_composite(spec: str):
    """`list(json)` -> ListSerde("json"), nested names too; None when `spec` is no composite name."""
    m = re.match(r"^([a-z_]+)\((.*)\)$", spec)
    if m is None or m.group(1) not in _COMPOSITES:
        return None
    inners = _split_args(m.group(2))
    for i in inners:
        get_serde(i)  # an unknown inner name fails here, with its own message
    return _COMPOSITES[m.group(1)](*inners)


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
            composite = _parse_composite(spec)
            if composite is not None:
                return composite
            raise ValueError(f"unknown serde {spec!r}; known: {', '.join(sorted(_REGISTRY))} "
                             f"(or pass an object with to_bytes/from_bytes)") from None
    if (not isinstance(spec, (int, type)) and callable(getattr(spec, "to_bytes", None))
            and callable(getattr(spec, "from_bytes", None))):
        return spec  # (ints have to_bytes/from_bytes too, with other meanings)
    raise TypeError(f"not a serde: {spec!r} (needs to_bytes/from_bytes, or a registered name)")


def bound(serde: Any, topic: str, key: bool) -> Any:
    """``serde`` as it writes to ``topic`` (a key when ``key``): a schema serde registers new
    schemas under that topic's subject; every other serde is the same object."""
    bind = getattr(serde, "bind", None)
    return bind(topic, key) if callable(bind) else serde


def serde_name(serde: Serde) -> str | None:
    """The registered name of a serde object, if it has one (recorded for inspection)."""
    for name, s in _REGISTRY.items():
        if s is serde:
            return name
    if isinstance(serde, CompositeSerde):
        try:
            return serde.name if get_serde(serde.name) == serde else None
        except (TypeError, ValueError):
            return None
    return getattr(serde, "name", None) if getattr(serde, "name", None) in _REGISTRY else None


def decode_column(serde: Any, blobs: list) -> list | None:
    """``[serde.from_bytes(b) for b in blobs]`` without a Python frame per item, for the serdes
    that allow it (JSON through the C decoder, int64); None when the serde does not, or when an
    item is None or does not decode so (the caller then goes one item at a time, and says which
    one failed)."""
    t = type(serde)
    try:
        if t is JsonSerde:
            strs = list(map(bytes.decode, blobs))
            found = list(map(serde._scan, strs, _repeat(0)))
            if list(map(_second, found)) != list(map(len, strs)):
                return None           # a value with whitespace around it
            return list(map(_first, found))
        if isinstance(serde, SchemaSerde):
            return serde.decode_many(blobs)
        if t is Int64Serde and blobs:
            if len(set(map(len, blobs))) == 1 and len(blobs[0]) == 8:
                return [v for (v,) in struct.iter_unpack(">q", b"".join(blobs))]
    except (ValueError, TypeError, StopIteration):   # None is a TypeError
        return None
    return None


_first, _second = itemgetter(0), itemgetter(1)
