"""The v2 record batch (magic 2) as bytes: its 61-byte header, CRC32C, building one around
encoded records, control batches (transaction markers), and walking the batches of a byte run
without decoding records.

Header layout (big-endian), offsets from the batch start::

    0 base offset q | 8 length i | 12 leader epoch i | 16 magic b | 17 crc I |
    21 attributes h | 23 last offset delta i | 27 first timestamp q | 35 max timestamp q |
    43 producer id q | 51 producer epoch h | 53 base sequence i | 57 record count i | 61 records

The CRC covers bytes 21.. to the end; the base offset, length and leader epoch lie before it, so
a broker assigns offsets without a new CRC.
"""
from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

from .errors import InvalidBatch
from .varint import VARLONG_MAX_BYTES, read_varint_bounded

from crc32c import crc32c as _crc32c  # C speed (a declared dependency)

FAST_CRC = True  # the broker checks produce CRCs only with a fast implementation

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # base offset (8) + batch length (4)
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
FIRST_TS_OFFSET = 27
MAX_TS_OFFSET = 35

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08  # LogAppendTime: every record's timestamp is the batch's max timestamp
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40  # KIP-534: first_timestamp holds the time a marker may be removed
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

_Q = struct.Struct(">q")
_QI = struct.Struct(">qi")
_I = struct.Struct(">i")
_CRC = struct.Struct(">I")


def crc32c(data) -> int:
    return _crc32c(data)


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


def header_at(buf, pos: int = 0) -> BatchHeader:
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def _invalid(pos: int, why: str) -> InvalidBatch:
    err = InvalidBatch(why)
    err.position = pos
    return err


def scan(buf, start: int = 0, end: int | None = None, check_crc: bool = False) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each whole batch in buf[start:end].

    Stops at the first incomplete batch; raises InvalidBatch at the first malformed one (with
    ``.position`` set) so recovery can truncate there.
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
            if crc32c(body) != h.crc:
                raise _invalid(pos, "CRC mismatch")
        yield pos, h
        pos += LOG_OVERHEAD + length


def split_batches(data) -> tuple[list, int | None]:
    """The whole batches of a Fetch answer's records bytes, each as ``bytes``, and the offset
    after the last one (None: no whole batch). A partial batch at the end (the broker cuts at
    its byte limit) is left out. InvalidBatch for a batch that is not v2."""
    out = []
    nxt = None
    mv = memoryview(data) if data else b""
    if not data:
        return out, None
    for pos, h in scan(mv):
        out.append(bytes(mv[pos:pos + h.size]))
        nxt = h.base_offset + h.last_offset_delta + 1
    return out, nxt


def build(body: bytes, count: int, *, first_timestamp: int, max_timestamp: int,
          last_offset_delta: int | None = None, attributes: int = 0, producer_id: int = -1,
          producer_epoch: int = -1, base_sequence: int = -1, base_offset: int = 0) -> bytes:
    """A batch around ``body`` (``count`` encoded records, compressed already when the
    attributes say so), its CRC computed."""
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    hdr = bytearray(HEADER.pack(base_offset, HEADER_SIZE - LOG_OVERHEAD + len(body), 0, 2, 0,
                                attributes, lod, first_timestamp, max_timestamp, producer_id,
                                producer_epoch, base_sequence, count))
    _CRC.pack_into(hdr, CRC_OFFSET, _crc32c(body, _crc32c(memoryview(hdr)[ATTRIBUTES_OFFSET:])))
    return bytes(hdr) + body


def recompute_crc(buf: bytearray, pos: int = 0, size: int | None = None) -> None:
    """Write the CRC of the batch at ``pos`` after its header or records were patched."""
    end = pos + (size if size is not None else _I.unpack_from(buf, pos + 8)[0] + LOG_OVERHEAD)
    _CRC.pack_into(buf, pos + CRC_OFFSET, crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:end]))


def control_batch(producer_id: int, producer_epoch: int, control_type: int, coordinator_epoch: int,
                  ts: int) -> bytearray:
    """A transaction marker (Kafka's EndTransactionMarker): one control record, key (version 0,
    type), value (version 0, coordinator epoch); base offset 0 until appended."""
    key = struct.pack(">hh", 0, control_type)
    value = struct.pack(">hi", 0, coordinator_epoch)
    rec = b"\x00\x00\x00" + bytes([len(key) << 1]) + key + bytes([len(value) << 1]) + value + b"\x00"
    body = bytes([len(rec) << 1]) + rec
    return bytearray(build(body, 1, first_timestamp=ts, max_timestamp=ts,
                           attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL, producer_id=producer_id,
                           producer_epoch=producer_epoch))


def control_type(buf, pos: int = 0, h: BatchHeader | None = None) -> int | None:
    """CONTROL_ABORT or CONTROL_COMMIT of the control batch at pos (None: no record, or a type we
    do not know)."""
    if h is None:
        h = header_at(buf, pos)
    if h.count < 1 or h.attributes & ATTR_COMPRESSION_MASK:
        return None
    try:
        p = pos + HEADER_SIZE
        end = pos + h.size
        _, p = read_varint_bounded(buf, p, end)  # length
        p += 1  # attributes
        _, p = read_varint_bounded(buf, p, end, VARLONG_MAX_BYTES)  # timestamp delta
        _, p = read_varint_bounded(buf, p, end, VARLONG_MAX_BYTES)  # offset delta
        klen, p = read_varint_bounded(buf, p, end)
        if klen < 4:
            return None
        _version, kind = struct.unpack_from(">hh", buf, p)
    except (InvalidBatch, struct.error, IndexError):
        return None
    return kind if kind in (CONTROL_ABORT, CONTROL_COMMIT) else None


def set_base_offset(buf: bytearray, pos: int, base_offset: int) -> None:
    """Outside the CRC, so no recomputation."""
    _Q.pack_into(buf, pos, base_offset)
    _I.pack_into(buf, pos + 12, 0)  # partition leader epoch: also outside the CRC


def set_log_append_time(buf: bytearray, pos: int, h: BatchHeader, now_ms: int) -> None:
    """LogAppendTime topics: the broker's clock goes into the header, which the CRC covers."""
    struct.pack_into(">h", buf, pos + ATTRIBUTES_OFFSET, h.attributes | ATTR_TIMESTAMP_TYPE)
    _Q.pack_into(buf, pos + MAX_TS_OFFSET, now_ms)
    recompute_crc(buf, pos, h.size)
