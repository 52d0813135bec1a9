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
ATTR_DELETE_HORIZON = 0x40  # KIP-534: first_timestamp holds the time a marker may be removed
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
MAX_DECOMPRESSED = 64 << 20  # a produce batch inflating past this is refused (compression bombs)


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
    """All batches of a produce payload; every byte must belong to a whole, CRC-valid batch whose
    records parse (`check_records`).

    The CRC is checked only with the C crc32c (~40 us per MB); the pure-Python one would cost
    seconds per MB on the hot path.
    """
    out = []
    end = 0
    for pos, h in scan(buf, check_crc=FAST_CRC):
        check_records(buf, pos, h)
        out.append((pos, h))
        end = pos + h.size
    if end != len(buf):
        raise InvalidBatch("trailing bytes or a partial batch in the produce request")
    if not out:
        raise InvalidBatch("no record batch in the produce request")
    return out


def check_records(buf, pos: int, h: BatchHeader) -> None:
    """What Kafka's LogValidator checks of a client's batch, beyond its CRC: a known codec, no
    control batch, a sequence when there is a producer id, a record count that agrees with the
    offset span, and records that parse exactly to the end of the batch with offset deltas
    0, 1, 2, ... Raises InvalidBatch (the produce answer is CORRUPT_MESSAGE)."""
    codec = h.attributes & ATTR_COMPRESSION_MASK
    if codec > 4:
        raise InvalidBatch(f"unknown compression codec {codec} in the record batch attributes")
    if h.attributes & ATTR_CONTROL:
        raise InvalidBatch("clients are not allowed to write control records")
    if h.producer_id >= 0 and h.base_sequence < 0:
        raise InvalidBatch(f"invalid sequence number {h.base_sequence} in a record batch with producer id {h.producer_id}")
    if h.count <= 0 or h.count != h.last_offset_delta + 1:
        raise InvalidBatch(f"inconsistent record batch: {h.count} records but last offset delta "
                           f"{h.last_offset_delta}")
    end = pos + h.size
    if codec == 0:
        _walk_records(buf, pos + HEADER_SIZE, end, h.count)
        return
    body = decompress(codec, bytes(memoryview(buf)[pos + HEADER_SIZE:end]))
    if body is not None:  # None: no library for this codec here; the header checks stand alone
        _walk_records(body, 0, len(body), h.count)


_DECOMPRESSORS: dict = {}


def decompress(codec: int, data: bytes):
    """The records bytes of a compressed batch, at most MAX_DECOMPRESSED; None when this
    interpreter has no library for the codec (snappy, lz4 are optional)."""
    try:
        if codec == 1:
            import zlib

            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = d.decompress(data, MAX_DECOMPRESSED + 1)
        elif codec == 4:
            import io

            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as r:
                out = r.read(MAX_DECOMPRESSED + 1)
        else:
            from kafka import codec as kcodec

            if codec == 2:
                if not kcodec.has_snappy():
                    return None
                out = kcodec.snappy_decode(data)
            else:
                if not kcodec.has_lz4():
                    return None
                out = kcodec.lz4_decode(data)
    except ImportError:
        return None
    except Exception as e:  # noqa: BLE001 - any codec failure is a corrupt batch
        raise InvalidBatch(f"the compressed records do not decompress ({type(e).__name__})") from None
    if len(out) > MAX_DECOMPRESSED:
        raise InvalidBatch(f"the compressed records inflate past {MAX_DECOMPRESSED >> 20} MiB")
    return out


def _varint(buf, p: int, end: int):
    """A zigzag varint (at most 5 bytes, Kafka's varint) at p: (value, next position)."""
    v = shift = 0
    for _ in range(5):
        if p >= end:
            raise InvalidBatch("a record is cut short")
        b = buf[p]
        p += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return (v >> 1) ^ -(v & 1), p
        shift += 7
    raise InvalidBatch("a varint in a record is longer than 5 bytes")


def _walk_records(buf, p: int, end: int, count: int) -> None:
    """Every record parses and ends where its length says; offset deltas are 0..count-1.

    This loop is the produce path's per-record cost, so it reads one- and two-byte varints inline
    (records and values up to 8 KiB) and leaves bounds to Python: reading past the buffer raises
    IndexError, and a field that runs past its record shows as a record not ending where its
    length says."""
    varint = _varint
    try:
        for i in range(count):
            b = buf[p]
            if b < 0x80:
                p += 1
            else:
                b2 = buf[p + 1]
                if b2 < 0x80:
                    b = (b & 0x7F) | (b2 << 7)
                    p += 2
                else:
                    b, p = varint(buf, p, end)
                    b = (b << 1) if b >= 0 else ((-b << 1) - 1)  # back to zigzag form
            rend = p + ((b >> 1) ^ -(b & 1))
            q = p + 1  # attributes: not checked (Kafka ignores them in v2)
            if buf[q] < 0x80:  # timestamp delta
                q += 1
            elif buf[q + 1] < 0x80:
                q += 2
            else:
                _, q = varint(buf, q, end)
            b = buf[q]
            if b < 0x80:
                od = (b >> 1) ^ -(b & 1)
                q += 1
            else:   # offset deltas past 63 take two bytes, past 8191 three: inline too
                b2 = buf[q + 1]
                if b2 < 0x80:
                    b = (b & 0x7F) | (b2 << 7)
                    od = (b >> 1) ^ -(b & 1)
                    q += 2
                else:
                    b3 = buf[q + 2]
                    if b3 < 0x80:
                        b = (b & 0x7F) | ((b2 & 0x7F) << 7) | (b3 << 14)
                        od = (b >> 1) ^ -(b & 1)
                        q += 3
                    else:
                        od, q = varint(buf, q, end)
            if od != i:
                raise InvalidBatch(f"record {i} has offset delta {od}: deltas must be 0, 1, 2, ...")
            # key, then value: length -1 (null) or >= 0
            b = buf[q]
            if b < 0x80:
                if b & 1:
                    if b != 1:
                        raise InvalidBatch(f"record {i} has a negative key length")
                    q += 1
                else:
                    q += 1 + (b >> 1)
            else:
                n, q = varint(buf, q, end)
                if n < -1:
                    raise InvalidBatch(f"record {i} has a negative key length")
                if n > 0:
                    q += n
            b = buf[q]
            if b < 0x80:
                if b & 1:
                    if b != 1:
                        raise InvalidBatch(f"record {i} has a negative value length")
                    q += 1
                else:
                    q += 1 + (b >> 1)
            else:
                b2 = buf[q + 1]
                if b2 < 0x80 and not b & 1:
                    q += 2 + (((b & 0x7F) | (b2 << 7)) >> 1)
                else:
                    n, q = varint(buf, q, end)
                    if n < -1:
                        raise InvalidBatch(f"record {i} has a negative value length")
                    if n > 0:
                        q += n
            b = buf[q]
            if b == 0:  # no headers (zigzag 0)
                q += 1
            else:
                if b < 0x80:
                    hc = (b >> 1) ^ -(b & 1)
                    q += 1
                else:
                    hc, q = varint(buf, q, end)
                if hc < 0:
                    raise InvalidBatch(f"record {i} has a negative header count")
                for _h in range(hc):
                    b = buf[q]
                    if b < 0x80 and not b & 1:
                        q += 1 + (b >> 1)
                    else:
                        n, q = varint(buf, q, end)
                        if n < 0:
                            raise InvalidBatch(f"record {i} has a header with a null key")
                        q += n
                    b = buf[q]
                    if b < 0x80:
                        if b & 1:
                            if b != 1:
                                raise InvalidBatch(f"record {i} has a header of negative length")
                            q += 1
                        else:
                            q += 1 + (b >> 1)
                    else:
                        n, q = varint(buf, q, end)
                        if n < -1:
                            raise InvalidBatch(f"record {i} has a header of negative length")
                        if n > 0:
                            q += n
            if q != rend:
                raise InvalidBatch(f"record {i} does not end where its length says")
            p = rend
    except IndexError:
        raise InvalidBatch(f"the batch says {count} records but its records are cut short") from None
    if p != end:
        raise InvalidBatch(f"the batch's {count} records do not end where the batch does")


def control_batch(producer_id: int, producer_epoch: int, control_type: int, coordinator_epoch: int,
                  ts: int) -> bytearray:
    """A transaction marker (Kafka's EndTransactionMarker): one control record, key (version 0,
    type), value (version 0, coordinator epoch); base offset 0 until appended."""
    key = struct.pack(">hh", 0, control_type)
    value = struct.pack(">hi", 0, coordinator_epoch)
    rec = b"\x00\x00\x00" + bytes([len(key) << 1]) + key + bytes([len(value) << 1]) + value + b"\x00"
    body = bytes([len(rec) << 1]) + rec
    out = bytearray(HEADER.pack(0, HEADER_SIZE - LOG_OVERHEAD + len(body), 0, 2, 0,
                                ATTR_TRANSACTIONAL | ATTR_CONTROL, 0, ts, ts, producer_id, producer_epoch,
                                -1, 1))
    out += body
    struct.pack_into(">I", out, CRC_OFFSET, _crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return out


def control_type(buf, pos: int, h: BatchHeader) -> int | None:
    """CONTROL_ABORT or CONTROL_COMMIT of the control batch at pos (None: no record, or a type we
    do not know)."""
    if h.count < 1 or h.attributes & ATTR_COMPRESSION_MASK:
        return None
    try:
        p = pos + HEADER_SIZE
        end = pos + h.size
        _, p = _varint(buf, p, end)  # length
        p += 1  # attributes
        _, p = _varint(buf, p, end)  # timestamp delta
        _, p = _varint(buf, p, end)  # offset delta
        klen, p = _varint(buf, p, end)
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
    body = memoryview(buf)[pos + ATTRIBUTES_OFFSET:pos + h.size]
    struct.pack_into(">I", buf, pos + CRC_OFFSET, _crc32c(body))
