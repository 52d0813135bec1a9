"""The serdes the topology adds: windowed result keys, repartition records and the internal stores
of joins (their bytes are what the changelogs and internal topics hold).

All are `statekit.stores.serdes.CompositeSerde`s: the inner serdes are kept as given and resolved on
first use, so a plan pickles to Spark workers with them.
"""
from __future__ import annotations

import struct
from typing import Any

from statekit.stores.serdes import CompositeSerde, serde_label

_q = struct.Struct(">q")
_Q = struct.Struct(">Q")
_i = struct.Struct(">i")
_I = struct.Struct(">I")
_BIAS = 1 << 63


class WindowedSerde(CompositeSerde):
    """Keys of time-windowed results, `(key, window_start)`: the inner key's bytes followed by the
    8-byte big-endian window start — Kafka's TimeWindowedSerializer layout."""

    kind = "windowed"

    def __init__(self, inner: Any = "str") -> None:
        super().__init__(inner)

    @property
    def inner(self):
        return self.inners[0]

    def to_bytes(self, obj) -> bytes:
        key, start = obj
        return self._inner()[0].to_bytes(key) + _Q.pack(int(start))

    def from_bytes(self, data: bytes):
        return (self._inner()[0].from_bytes(data[:-8]), _Q.unpack(data[-8:])[0])


class SessionWindowedSerde(CompositeSerde):
    """Keys of session-windowed results, `(key, start, end)`: the key's bytes, then the 8-byte end
    and the 8-byte start (Kafka's SessionKeySchema layout)."""

    kind = "sessionwindowed"

    def __init__(self, inner: Any = "str") -> None:
        super().__init__(inner)

    def to_bytes(self, obj) -> bytes:
        key, start, end = obj
        return self._inner()[0].to_bytes(key) + _Q.pack(int(end)) + _Q.pack(int(start))

    def from_bytes(self, data: bytes):
        return (self._inner()[0].from_bytes(data[:-16]), _Q.unpack(data[-8:])[0],
                _Q.unpack(data[-16:-8])[0])


def _put_opt(parts: list, enc, value) -> None:
    if value is None:
        parts.append(_i.pack(-1))
    else:
        b = enc(value)
        parts.append(_i.pack(len(b)))
        parts.append(b)


def _get_opt(data: bytes, pos: int, dec) -> tuple:
    (n,) = _i.unpack_from(data, pos)
    pos += 4
    if n < 0:
        return None, pos
    return dec(data[pos:pos + n]), pos + n


class RepartitionSerde(CompositeSerde):
    """Values of a repartition topic that carries a table's changes: `(new, old)`, each
    length-prefixed (-1: None) with the inner serde (Kafka Streams' ChangedSerializer). A stream's
    repartition topic needs none: its values are written with the stream's own serde and its event
    time is the Kafka record's timestamp, as Kafka Streams writes them."""

    kind = "repartition"

    def __init__(self, inner: Any = "json", changes: bool = True) -> None:
        super().__init__(inner)
        self.changes = True
        self.name = f"repartition-changes({serde_label(self.inners[0])})"

    def __getstate__(self):
        return dict(super().__getstate__(), changes=True)

    def __setstate__(self, st):
        super().__setstate__(st)
        self.changes = True

    def to_bytes(self, obj) -> bytes:
        enc = self._inner()[0].to_bytes
        parts: list = []
        _put_opt(parts, enc, obj[0])
        _put_opt(parts, enc, obj[1])
        return b"".join(parts)

    def from_bytes(self, data: bytes):
        dec = self._inner()[0].from_bytes
        new, pos = _get_opt(data, 0, dec)
        old, _ = _get_opt(data, pos, dec)
        return new, old


class JoinSideKeySerde(CompositeSerde):
    """Keys of a stream-stream join's outer store, `(timestamp, is_left, key)`: 8-byte time (order
    preserving), one side byte (right 0, left 1) and the key's bytes, so the store is in (time,
    side, key) order — the order unmatched records are emitted in (Kafka's TimestampedKeyAndJoinSide)."""

    kind = "joinside"

    def to_bytes(self, obj) -> bytes:
        ts, is_left, key = obj
        return _Q.pack(int(ts) + _BIAS) + (b"\x01" if is_left else b"\x00") + self._inner()[0].to_bytes(key)

    def from_bytes(self, data: bytes):
        return (_Q.unpack_from(data, 0)[0] - _BIAS, data[8:9] == b"\x01",
                self._inner()[0].from_bytes(data[9:]))


class SideListSerde(CompositeSerde):
    """Values of a stream-stream join's outer store, `(is_left, [values])`: the values of one side
    (left or right serde) still waiting for a partner."""

    kind = "sidelist"

    def to_bytes(self, obj) -> bytes:
        is_left, values = obj
        enc = self._inner()[0 if is_left else 1].to_bytes
        parts = [b"\x01" if is_left else b"\x00", _I.pack(len(values))]
        for v in values:
            b = enc(v)
            parts.append(_I.pack(len(b)))
            parts.append(b)
        return b"".join(parts)

    def from_bytes(self, data: bytes):
        is_left = data[:1] == b"\x01"
        dec = self._inner()[0 if is_left else 1].from_bytes
        (n,) = _I.unpack_from(data, 1)
        pos, out = 5, []
        for _ in range(n):
            (ln,) = _I.unpack_from(data, pos)
            pos += 4
            out.append(dec(data[pos:pos + ln]))
            pos += ln
        return is_left, out


class CombinedKeySerde(CompositeSerde):
    """Keys of a foreign-key join's subscription store, `(foreign_key, primary_key)`: a 4-byte length
    and the foreign key's bytes, then the primary key's bytes (Kafka's CombinedKeySchema), so every
    subscription to one foreign key is one prefix scan (`prefix(fk)`)."""

    kind = "combined"

    def prefix(self, fk) -> bytes:
        fb = self._inner()[0].to_bytes(fk)
        return _I.pack(len(fb)) + fb

    def to_bytes(self, obj) -> bytes:
        fk, pk = obj
        return self.prefix(fk) + self._inner()[1].to_bytes(pk)

    def from_bytes(self, data: bytes):
        (n,) = _I.unpack_from(data, 0)
        fk_s, pk_s = self._inner()
        return fk_s.from_bytes(data[4:4 + n]), pk_s.from_bytes(data[4 + n:])


def _put_hash(parts: list, h) -> None:
    parts.append(bytes((255,)) if h is None else bytes((len(h),)) + h)


def _get_hash(data: bytes, pos: int) -> tuple:
    n = data[pos]
    if n == 255:
        return None, pos + 1
    return bytes(data[pos + 1:pos + 1 + n]), pos + 1 + n


class SubscriptionSerde(CompositeSerde):
    """A foreign-key join's subscription `(instruction, hash, primary_key)`: the instruction byte,
    the hash of the left value it was made for (None: the left row was deleted), the primary key."""

    kind = "subscription"

    def to_bytes(self, obj) -> bytes:
        instruction, h, pk = obj
        parts = [bytes((int(instruction),))]
        _put_hash(parts, h)
        parts.append(self._inner()[0].to_bytes(pk))
        return b"".join(parts)

    def from_bytes(self, data: bytes):
        h, pos = _get_hash(data, 1)
        return data[0], h, self._inner()[0].from_bytes(data[pos:])


class ResponseSerde(CompositeSerde):
    """A foreign-key join's response `(hash, foreign_value)`: the hash the subscription carried (the
    left side drops a response whose hash no longer matches its current value) and the foreign
    table's value (None: no row)."""

    kind = "response"

    def to_bytes(self, obj) -> bytes:
        h, fv = obj
        parts = []
        _put_hash(parts, h)
        _put_opt(parts, self._inner()[0].to_bytes, fv)
        return b"".join(parts)

    def from_bytes(self, data: bytes):
        h, pos = _get_hash(data, 0)
        fv, _ = _get_opt(data, pos, self._inner()[0].from_bytes)
        return h, fv
