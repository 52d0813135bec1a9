"""Record batch (magic v2) header access without decoding records.

The broker stores the producer's batches as bytes. It only ever reads the fixed 61-byte header
(offsets, counts, timestamps, producer id/sequence) and patches the base offset, which lies before
the CRC-covered part, so assigning offsets never needs a new CRC. Decoding records (the cleaner,
timestamp lookups) goes through kafka-python's `kafka.record` module.
"""
from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

try:  # a C implementation; the pure-Python fallback is ~1000x slower
    from crc32c import crc32c as _crc32c

    FAST_CRC = True
except ImportError:  # pragma: no cover - the lock file pins crc32c
    from kafka.record.util import calc_crc32c as _crc32c

    FAST_CRC = False

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # base offset (8) + batch length (4)
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TS_OFFSET = 35
_Q = struct.Struct(">q")
_QI = struct.Struct(">qi")
_I = struct.Struct(">i")

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20


class BatchHeader(NamedTuple):
    base_offset: int
    length: int  # bytes after the length field
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int

    @property
    def size(self) -> int:
        return self.length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


class InvalidBatch(ValueError):
    """The bytes are not a whole, valid v2 record batch."""


def crc32c(data) -> int:
    return _crc32c(data)


def header_at(buf, pos: int) -> BatchHeader:
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def scan(buf, start: int = 0, end: int | None = None, check_crc: bool = False) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each whole batch in buf[start:end].

    Stops at the first incomplete batch; raises InvalidBatch at the first malformed one (with
    `.position` set) so recovery can truncate there.
    """
    end = len(buf) if end is None else end
    pos = start
    while pos + LOG_OVERHEAD <= end:
        _, length = _QI.unpack_from(buf, pos)
        if length < HEADER_SIZE - LOG_OVERHEAD:
            raise _invalid(pos, f"batch length {length} too small")
        if pos + LOG_OVERHEAD + length > end:
            if pos + HEADER_SIZE <= end and buf[pos + MAGIC_OFFSET] != 2:
                raise _invalid(pos, "not a v2 record batch")
            return
        h = header_at(buf, pos)
        if h.magic != 2:
            raise _invalid(pos, f"unsupported magic {h.magic}")
        if h.last_offset_delta < 0 or h.count < 0:
            raise _invalid(pos, "negative offset delta or count")
        if check_crc:
            body = memoryview(buf)[pos + ATTRIBUTES_OFFSET:pos + LOG_OVERHEAD + length]
            if _crc32c(body) != h.crc:
                raise _invalid(pos, "CRC mismatch")
        yield pos, h
        pos += LOG_OVERHEAD + length


def _invalid(pos: int, why: str) -> InvalidBatch:
    err = InvalidBatch(why)
    err.position = pos
    return err


def validate_produce(buf) -> list[tuple[int, BatchHeader]]:
    """All batches of a produce payload; every byte must belong to a whole, CRC-valid batch.

    The CRC is checked only with the C crc32c (~40 us per MB); the pure-Python one would cost
    seconds per MB on the hot path.
    """
    out = []
    end = 0
    for pos, h in scan(buf, check_crc=FAST_CRC):
        out.append((pos, h))
        end = pos + h.size
    if end != len(buf):
        raise InvalidBatch("trailing bytes or a partial batch in the produce request")
    if not out:
        raise InvalidBatch("no record batch in the produce request")
    return out


def set_base_offset(buf: bytearray, pos: int, base_offset: int) -> None:
    """Outside the CRC, so no recomputation."""
    _Q.pack_into(buf, pos, base_offset)
    _I.pack_into(buf, pos + 12, 0)  # partition leader epoch: also outside the CRC


def set_log_append_time(buf: bytearray, pos: int, h: BatchHeader, now_ms: int) -> None:
    """LogAppendTime topics: the broker's clock goes into the header, which the CRC covers."""
    struct.pack_into(">h", buf, pos + ATTRIBUTES_OFFSET, h.attributes | ATTR_TIMESTAMP_TYPE)
    _Q.pack_into(buf, pos + MAX_TS_OFFSET, now_ms)
    body = memoryview(buf)[pos + ATTRIBUTES_OFFSET:pos + h.size]
    struct.pack_into(">I", buf, pos + CRC_OFFSET, _crc32c(body))
