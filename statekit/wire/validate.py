"""What Kafka's LogValidator checks of a client's batches before the broker appends them: whole
CRC-valid v2 batches, a known codec, no control batch, a sequence with a producer id, a record
count that agrees with the offset span, and records that parse exactly to the end of the batch
with offset deltas 0, 1, 2, ... Any failure is :class:`InvalidBatch` (the produce answer is
CORRUPT_MESSAGE).

Records are walked two ways. :func:`walk_records` reads one record at a time and says exactly
what is wrong; it is the rule. :func:`records_valid` does the same checks column-wise with numpy
for batches of many records (the produce path's largest cost otherwise, ~1 us a record): it only
ever answers "valid" for bytes the record walk accepts, and anything else goes to the record walk
for its verdict and message.
"""
from __future__ import annotations

import numpy as np

from . import batch as B

from .columns import _rows, record_fields, record_starts
from .compression import decompress
from .errors import CodecUnavailable, InvalidBatch
from .varint import VARINT_MAX_BYTES, VARLONG_MAX_BYTES, read_varint_bounded

VECTOR_MIN = 200  # records in a batch from which the column-wise check is cheaper (~0.2 ms fixed)


def validate_produce(buf) -> list[tuple[int, B.BatchHeader]]:
    """All batches of a produce payload; every byte must belong to a whole, CRC-valid batch whose
    records parse (:func:`check_records`).

    The CRC is checked only with the C crc32c (~40 us per MB); the pure-Python one would cost
    seconds per MB on the hot path.
    """
    out = []
    end = 0
    for pos, h in B.scan(buf, check_crc=B.FAST_CRC):
        check_records(buf, pos, h)
        out.append((pos, h))
        end = pos + h.size
    if end != len(buf):
        raise InvalidBatch("trailing bytes or a partial batch in the produce request")
    if not out:
        raise InvalidBatch("no record batch in the produce request")
    return out


def check_records(buf, pos: int, h: B.BatchHeader) -> None:
    """The LogValidator rules for the batch at ``pos`` (header ``h``), beyond its CRC."""
    codec = h.attributes & B.ATTR_COMPRESSION_MASK
    if codec > 4:
        raise InvalidBatch(f"unknown compression codec {codec} in the record batch attributes")
    if h.attributes & B.ATTR_CONTROL:
        raise InvalidBatch("clients are not allowed to write control records")
    if h.producer_id >= 0 and h.base_sequence < 0:
        raise InvalidBatch(f"invalid sequence number {h.base_sequence} in a record batch with producer id {h.producer_id}")
    if h.count <= 0 or h.count != h.last_offset_delta + 1:
        raise InvalidBatch(f"inconsistent record batch: {h.count} records but last offset delta "
                           f"{h.last_offset_delta}")
    end = pos + h.size
    if codec == 0:
        start = pos + B.HEADER_SIZE
    else:
        try:
            buf = decompress(codec, memoryview(buf)[pos + B.HEADER_SIZE:end])
        except CodecUnavailable:
            return  # no library for this codec here: the header checks stand alone
        start, end = 0, len(buf)
    if h.count >= VECTOR_MIN and records_valid(buf, start, end, h.count):
        return
    walk_records(buf, start, end, h.count)


def records_valid(buf, p: int, end: int, count: int) -> bool:
    """True when the ``count`` records in ``buf[p:end]`` pass :func:`walk_records`, checked
    column-wise; False means "ask the record walk" (invalid, or unusual enough to leave to it)."""
    try:
        starts = record_starts(buf, p, count, end)
        if starts is None:
            return False
        a = np.frombuffer(buf, np.uint8)[:end]
        S = np.array(starts, np.int64)
        f = record_fields(a, S, VARINT_MAX_BYTES)
    except (IndexError, ValueError):
        return False
    rend = f.rend
    if rend[-1] != end or (count > 1 and not np.array_equal(rend[:-1], S[1:])):
        return False
    if not np.array_equal(f.od, np.arange(count, dtype=np.int64)):
        return False
    if f.klen.min() < -1 or f.vlen.min() < -1:
        return False
    ve = f.ve
    if (ve >= rend).any():
        return False
    plain = (rend - ve == 1) & (a[ve] == 0)  # no headers: the count 0
    if plain.all():
        return True
    # header sections: each distinct one is walked once; the records whose section equals the
    # first one's (a commit's records) are found with numpy, the others compared as bytes
    cand = np.flatnonzero(~plain)
    i0 = int(cand[0])
    ref = bytes(buf[int(ve[i0]):int(rend[i0])])
    if not _section_valid(ref, 0, len(ref)):
        return False
    L = len(ref)
    cve, crend = ve[cand], rend[cand]
    if L <= 256:
        fits = (crend - cve) == L
        rows = np.ascontiguousarray(_rows(a, L)[np.where(fits, cve, cve[0])])
        same = (rows.view(f"V{L}").ravel() == np.frombuffer(ref, f"V{L}")[0]) & fits
        others = cand[~same].tolist()
    else:
        others = cand.tolist()
    seen = {ref: True}
    for i in others:
        sec = bytes(buf[int(ve[i]):int(rend[i])])
        ok = seen.get(sec)
        if ok is None:
            ok = seen[sec] = _section_valid(sec, 0, len(sec))
        if not ok:
            return False
    return True


def _section_valid(buf, q: int, rend: int) -> bool:
    """A header section (count, then each key and value) that walk_records accepts, ending
    exactly at ``rend``."""
    try:
        hc, q = read_varint_bounded(buf, q, rend)
        if hc < 0:
            return False
        for _ in range(hc):
            n, q = read_varint_bounded(buf, q, rend)
            if n < 0:
                return False
            q += n
            n, q = read_varint_bounded(buf, q, rend)
            if n < -1:
                return False
            if n > 0:
                q += n
    except InvalidBatch:
        return False
    return q == rend


def walk_records(buf, p: int, end: int, count: int) -> None:
    """Every record parses and ends where its length says; offset deltas are 0..count-1.

    Reads one- and two-byte varints inline (records and values up to 8 KiB) and leaves bounds to
    Python: reading past the buffer raises IndexError, and a field that runs past its record shows
    as a record not ending where its length says. Lengths and counts are varints (at most 5
    bytes); the timestamp delta is a varlong and the offset delta is read as one too (at most 10
    bytes: a batch may span any range of timestamps)."""
    varint = read_varint_bounded
    long_ = VARLONG_MAX_BYTES
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
            if buf[q] < 0x80:  # timestamp delta: a varlong
                q += 1
            elif buf[q + 1] < 0x80:
                q += 2
            else:
                _, q = varint(buf, q, end, long_)
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
                        od, q = varint(buf, q, end, long_)
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
