"""Records of a v2 batch one at a time: decoding a batch to ``(offset, timestamp, key, value,
headers)`` tuples, encoding ``(key, value[, headers])`` tuples into batches (byte for byte what
kafka-python's ``MemoryRecordsBuilder`` writes, at a fraction of its cost), header sections, and
the read_committed filter over a Fetch answer's batches.

A record::

    length varint | attributes int8 | timestamp delta varlong | offset delta varint |
    key length varint, key | value length varint, value | header count varint,
    (key length varint, key utf-8 | value length varint, value) * count

Lengths of -1 are nulls. Columns of many records are :mod:`statekit.wire.columns`' business.
"""
from __future__ import annotations

import struct
from typing import Iterable

from . import batch as B
from .compression import decompress
from .varint import NULL, read_varint, write_varint

_HDR = B.HEADER
_HDR_LEN = B.HEADER_SIZE


def decode_headers(raw, count: int) -> tuple:
    """A record's headers (the bytes after the count): ``((str, bytes|None), ...)``."""
    out = []
    pos = 0
    for _ in range(count):
        n, pos = read_varint(raw, pos)
        hk = bytes(raw[pos:pos + n]).decode("utf-8")
        pos += n
        n, pos = read_varint(raw, pos)
        if n >= 0:
            hv = bytes(raw[pos:pos + n])
            pos += n
        else:
            hv = None
        out.append((hk, hv))
    return tuple(out)


def encode_headers(hdrs) -> bytes:
    """A record's header section, count first: ``hdrs`` is ``[(str|bytes, bytes|None)]``."""
    parts = [write_varint(len(hdrs))]
    for hk, hv in hdrs:
        kb = hk.encode("utf-8") if isinstance(hk, str) else bytes(hk)
        parts.append(write_varint(len(kb)))
        parts.append(kb)
        if hv is None:
            parts.append(NULL)
        else:
            parts.append(write_varint(len(hv)))
            parts.append(hv)
    return b"".join(parts)


_HCACHE: dict = {}  # raw header bytes -> decoded tuple (a batch's records repeat theirs)


def records_bytes(raw, attrs: int):
    """(buffer, position of the first record) of batch ``raw``: decompressed when it is."""
    codec = attrs & B.ATTR_COMPRESSION_MASK
    if codec:
        return decompress(codec, memoryview(raw)[_HDR_LEN:]), 0
    return (raw if type(raw) is bytes else bytes(raw)), _HDR_LEN


def decode_rows(raw, out: list, min_offset: int = 0, control: bool = False) -> None:
    """Append the records of batch ``raw`` (bytes from its base offset) to ``out`` as
    ``(offset, timestamp, key, value, headers)``, one at a time; ``headers`` is ``()`` or a tuple
    of ``(str, bytes|None)``. Records below ``min_offset`` are skipped, and control batches
    unless ``control``. The reference decoder (and the faster one for small batches)."""
    (base_offset, _length, _epoch, _magic, _crc, attrs, _lod, first_ts, max_ts, _pid, _pe, _bs,
     count) = _HDR.unpack_from(raw, 0)
    if attrs & B.ATTR_CONTROL and not control:
        return
    buf, pos = records_bytes(raw, attrs)
    log_append = attrs & B.ATTR_TIMESTAMP_TYPE
    append = out.append
    hcache = _HCACHE
    slow = read_varint
    for _ in range(count):
        # record length: not needed, skip its bytes; then the attributes byte
        if buf[pos] < 0x80:
            pos += 2
        elif buf[pos + 1] < 0x80:
            pos += 3
        else:
            _, pos = slow(buf, pos)
            pos += 1
        b = buf[pos]  # timestamp delta: a varlong
        if b < 0x80:
            tsd = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            tsd, pos = slow(buf, pos)
        b = buf[pos]  # offset delta: one or two bytes for batches up to 8k records
        if b < 0x80:
            od = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            b2 = buf[pos + 1]
            if b2 < 0x80:
                od = (b & 0x7F) | (b2 << 7)
                od = (od >> 1) ^ -(od & 1)
                pos += 2
            else:
                od, pos = slow(buf, pos)
        b = buf[pos]
        if b < 0x80:
            n = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            n, pos = slow(buf, pos)
        if n >= 0:
            key = buf[pos:pos + n]
            pos += n
        else:
            key = None
        b = buf[pos]
        if b < 0x80:
            n = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            n, pos = slow(buf, pos)
        if n >= 0:
            value = buf[pos:pos + n]
            pos += n
        else:
            value = None
        b = buf[pos]
        if b < 0x80:
            hc = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            hc, pos = slow(buf, pos)
        if hc:
            hstart = pos
            for _h in range(hc):
                b = buf[pos]
                if b < 0x80:
                    pos += 1 + (b >> 1)
                else:
                    n, pos = slow(buf, pos)
                    pos += n
                b = buf[pos]
                if b < 0x80:
                    n = (b >> 1) ^ -(b & 1)
                    pos += 1
                else:
                    n, pos = slow(buf, pos)
                if n > 0:
                    pos += n
            hraw = buf[hstart:pos]
            headers = hcache.get(hraw)
            if headers is None:
                headers = decode_headers(hraw, hc)
                if len(hcache) < 4096:
                    hcache[hraw] = headers
        else:
            headers = ()
        offset = base_offset + od
        if offset >= min_offset:
            append((offset, max_ts if log_append else first_ts + tsd, key, value, headers))


# -- encoding, one record at a time ----------------------------------------------------------

def encode_record(offset_delta: int, key, value, header_section: bytes = b"\x00",
                  timestamp_delta: int = 0) -> bytes:
    """One record, its length first (attributes 0)."""
    parts = [b"\x00", write_varint(timestamp_delta), write_varint(offset_delta)]
    if key is None:
        parts.append(NULL)
    else:
        parts.append(write_varint(len(key)))
        parts.append(key)
    if value is None:
        parts.append(NULL)
    else:
        parts.append(write_varint(len(value)))
        parts.append(value)
    parts.append(header_section)
    r = b"".join(parts)
    return write_varint(len(r)) + r


def close_batch(recs: list, ts: int, producer=None, max_ts: int | None = None) -> bytes:
    """A batch of the encoded records ``recs``. ``producer``: None, or ``[producer id, epoch,
    next sequence]`` of an idempotent or transactional producer (a list: the sequence advances
    by the record count; a fourth item False makes the batch idempotent only)."""
    n = len(recs)
    if producer is None:
        attrs, pid, epoch, seq = 0, -1, -1, -1
    else:
        pid, epoch, seq = producer[0], producer[1], producer[2]
        attrs = B.ATTR_TRANSACTIONAL if len(producer) < 4 or producer[3] else 0
        producer[2] = (seq + n) % (1 << 31)
    return B.build(b"".join(recs), n, first_timestamp=ts, max_timestamp=ts if max_ts is None else max_ts,
                   attributes=attrs, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def encode_batches(records: Iterable, headers, batch_bytes: int, ts: int, producer=None) -> list:
    """Encode ``(key, value)`` / ``(key, value, headers)`` records (one timestamp for all) into
    ``[(v2 record batch bytes, record count)]``; a new batch starts when the record would take the
    current one past ``batch_bytes`` (a batch holds at least one record). ``producer`` (a list
    ``[producer id, epoch, next sequence]``, advanced in place) makes transactional batches."""
    default_hdrs = encode_headers(list(headers or []))
    out: list = []
    recs: list = []
    size = _HDR_LEN
    for rec in records:
        if len(rec) == 3:
            key, value, hdrs = rec
            hb = encode_headers(hdrs) if hdrs else default_hdrs
        else:
            key, value = rec
            hb = default_hdrs
        r = encode_record(len(recs), key, value, hb)
        if recs and size + len(r) > batch_bytes:
            out.append((close_batch(recs, ts, producer), len(recs)))
            recs = []
            size = _HDR_LEN
            r = encode_record(0, key, value, hb)
        recs.append(r)
        size += len(r)
    if recs:
        out.append((close_batch(recs, ts, producer), len(recs)))
    return out


# -- read_committed ----------------------------------------------------------------------------

def committed_only(batches: list, aborted) -> list:
    """The batches of a read_committed Fetch answer minus those of aborted transactions (Kafka's
    consumer rule: a transactional batch of a producer with an aborted transaction that began at or
    before it is dropped until that producer's abort marker). ``aborted``: objects with
    ``first_offset`` and ``producer_id``."""
    if not aborted:
        return batches
    pending = sorted((a.first_offset, a.producer_id) for a in aborted)
    i = 0
    active: set = set()
    out = []
    for raw in batches:
        base, _l, _e, _m, _c, attrs, lod = _HDR.unpack_from(raw, 0)[:7]
        pid = struct.unpack_from(">q", raw, 43)[0]
        while i < len(pending) and pending[i][0] <= base + lod:
            active.add(pending[i][1])
            i += 1
        if attrs & B.ATTR_CONTROL:
            if pid in active and B.control_type(raw, 0) == B.CONTROL_ABORT:
                active.discard(pid)
            continue
        if attrs & B.ATTR_TRANSACTIONAL and pid in active:
            continue
        out.append(raw)
    return out
