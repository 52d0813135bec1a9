"""Kafka's zigzag varints (int32 fields) and varlongs (int64: a record's timestamp delta), one
value at a time and numpy-vectorised over many positions. Every reader accepts the full 10-byte
varlong form; the validating reader takes the width limit of the field it reads (5 bytes for a
varint, as Kafka's ``ByteUtils.readVarint``)."""
from __future__ import annotations

import numpy as np

from .errors import InvalidBatch

VARINT_MAX_BYTES = 5
VARLONG_MAX_BYTES = 10


def zigzag(n: int) -> int:
    """The unsigned zigzag form of a signed 64-bit ``n``."""
    return ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF


def _encode(n: int) -> bytes:
    v = zigzag(n)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_SMALL = [_encode(i) for i in range(1 << 14)]  # 0 .. 16383: every small length and offset delta
NULL = _encode(-1)  # the length of a null key, value or header value


def write_varint(n: int) -> bytes:
    """``n`` (any signed 64-bit int: varint or varlong) in zigzag varint bytes."""
    return _SMALL[n] if 0 <= n < 16384 else _encode(n)


def varint_size(n: int) -> int:
    z = zigzag(n)
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def read_varint(buf, pos: int) -> tuple[int, int]:
    """The zigzag varint or varlong at ``pos``: (value, next position). IndexError past the end;
    InvalidBatch for more than 10 bytes."""
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift >= 70:
            raise InvalidBatch("a varlong in a record is longer than 10 bytes")


def read_varint_bounded(buf, p: int, end: int, max_bytes: int = VARINT_MAX_BYTES) -> tuple[int, int]:
    """:func:`read_varint` that stays before ``end`` and takes at most ``max_bytes`` bytes (5 for
    Kafka's varint fields, 10 for a varlong); InvalidBatch otherwise."""
    v = shift = 0
    for _ in range(max_bytes):
        if p >= end:
            raise InvalidBatch("a record is cut short")
        b = buf[p]
        p += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return (v >> 1) ^ -(v & 1), p
        shift += 7
    raise InvalidBatch(f"a varint in a record is longer than {max_bytes} bytes")


# -- numpy: many varints at once ---------------------------------------------------------------

def read_varints(a, pos, max_bytes: int = VARLONG_MAX_BYTES):
    """Zigzag varints at positions ``pos`` (int64 array) of the uint8 array ``a``: (values int64,
    widths). ``widths`` is the int 1 when every varint is one byte (the common case). IndexError
    when one runs past ``a``; ValueError when one is longer than ``max_bytes``."""
    b = a[pos]
    more = b >= 0x80
    if not more.any():
        v = b.astype(np.int64)
        return (v >> 1) ^ -(v & 1), 1
    v = (b & 0x7F).astype(np.uint64)
    w = np.ones(len(pos), np.int64)
    idx = np.flatnonzero(more)
    shift = 7
    while idx.size:
        if shift >= 7 * max_bytes:
            raise ValueError(f"varint longer than {max_bytes} bytes")
        b = a[pos[idx] + w[idx]]
        v[idx] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        w[idx] += 1
        idx = idx[b >= 0x80]
        shift += 7
    z = (v >> np.uint64(1)).astype(np.int64) ^ -(v & np.uint64(1)).astype(np.int64)
    return z, w


def zigzag_array(v) -> np.ndarray:
    """The zigzag forms (uint64) of the int64 array ``v``."""
    v = np.asarray(v, np.int64)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


_BOUNDS = [np.uint64(1 << (7 * k)) for k in range(1, 10)]


def varint_sizes(z) -> np.ndarray:
    """Bytes of the varints of the zigzag forms ``z`` (uint64)."""
    sz = np.ones(len(z), np.int64)
    for bound in _BOUNDS:
        more = z >= bound
        if not more.any():
            break
        sz += more
    return sz


def put_varints(out, pos, z, sz) -> None:
    """Write the varints of the zigzag forms ``z`` (``sz`` bytes each) at ``out[pos]``."""
    z = np.asarray(z, np.uint64)
    for j in range(int(sz.max()) if len(sz) else 0):
        m = sz > j if j else slice(None)
        p = pos[m] + j
        b = (z[m] >> np.uint64(7 * j)) & np.uint64(0x7F)
        out[p] = (b | ((sz[m] > j + 1) * np.uint64(0x80))).astype(np.uint8)
