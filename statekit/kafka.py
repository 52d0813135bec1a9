"""The thin Kafka client layer: the only statekit module that imports ``kafka`` (the broker aside).

One small synchronous client over plain sockets. Requests are kafka-python's protocol classes
(``kafka.protocol``), framed and correlated by ``kafka.protocol.parser.KafkaProtocol``; record
batches are encoded here (:func:`encode_batches`: byte for byte what kafka-python's
``MemoryRecordsBuilder`` writes, at a fraction of its cost) and split with ``MemoryRecords`` /
``DefaultRecordBatch``. There are no consumer or producer objects, no background threads and no
per-record objects on the read path:

* ``read()`` is the fast path used by restoration (and the Spark source). It issues Fetch requests
  itself, keeps the next Fetch in flight while it decodes the current response (the next offset is
  known from the batch headers alone), and decodes records with a tight varint loop into plain
  tuples ``(offset, timestamp, key, value, headers)``. Offsets may have gaps (compacted logs); a log
  start offset that moved past the requested position (retention, ``DeleteRecords``) is skipped to.
  With ``columns=True`` it yields :class:`ColumnChunk` s instead (parallel key / value / offset
  lists and runs of records sharing one headers tuple, decoded with numpy, no tuple per record):
  what restoration and standby replicas read.
* ``send()`` writes with ``acks=all`` and waits for every acknowledgement; ``send_many()`` does
  several sends with every request in flight at once (a task commit: one round trip for all of its
  stores' changelogs); ``offsets_many()`` gets (log start, end) of several topics in one round trip.
* ``send_encoded()`` writes record batches encoded already (:func:`encode_batches_flat` encodes
  column-wise records), every request in flight, acks collected later: the fast produce path.

A ``Kafka`` object is not thread-safe: give each thread its own (standby replicas do).
"""
from __future__ import annotations

import bisect
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as _np
from numpy.lib.stride_tricks import sliding_window_view as _window

import kafka.errors as kerrors
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.admin import (CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest,
                                  DescribeConfigsRequest)
from kafka.record.memory_records import MemoryRecords
from kafka.record.default_records import DefaultRecordBatch
from kafka import codec as kcodec

from statekit.errors import BrokerUnreachable, StatekitError, UnknownTopic

try:
    from crc32c import crc32c as _crc32c  # a declared dependency (C speed)
except ImportError:  # pragma: no cover - kafka-python's own (pure Python unless crc32c is there)
    from kafka.record.util import calc_crc32c as _crc32c

__all__ = [
    "resolve_bootstrap", "Kafka", "Chunk", "ColumnChunk", "Columns", "PendingSend", "KafkaError", "BrokerUnreachable", "UnknownTopic",
]

_HINT = "start one with `statekit broker start` or set STATEKIT_BOOTSTRAP"


class KafkaError(StatekitError):
    """A broker answered with an error this layer does not handle itself."""


def resolve_bootstrap(bootstrap: str | None = None) -> str:
    """Explicit value, else ``STATEKIT_BOOTSTRAP``, else start (or reuse) the embedded broker in
    ``STATEKIT_HOME`` (default ``~/.statekit``) ``/broker``."""
    if bootstrap:
        return bootstrap
    env = os.environ.get("STATEKIT_BOOTSTRAP")
    if env:
        return env
    home = os.environ.get("STATEKIT_HOME") or os.path.join(os.path.expanduser("~"), ".statekit")
    from statekit import broker as broker_mod  # local: the broker is optional for most callers

    handle = broker_mod.start(dir=os.path.join(home, "broker"))
    return handle.bootstrap


# --------------------------------------------------------------------------------------------
# record decoding (the hot loop)

_REC_HDR = struct.Struct(">qiibIhiqqqhii")  # DefaultRecordBatch header, 61 bytes
_HDR_LEN = 61
_CODEC_MASK = 0x07
_CONTROL_MASK = 0x20
_LOG_APPEND = 0x08


def _varint_slow(buf, pos):
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


_HCACHE: dict = {}


def _headers(raw: bytes, count: int) -> tuple:
    """Decode a record's header section: ``((str, bytes|None), ...)``."""
    out = []
    pos = 0
    for _ in range(count):
        n, pos = _varint_slow(raw, pos)
        hk = raw[pos:pos + n].decode("utf-8")
        pos += n
        n, pos = _varint_slow(raw, pos)
        if n >= 0:
            hv = raw[pos:pos + n]
            pos += n
        else:
            hv = None
        out.append((hk, hv))
    return tuple(out)


def _decompress(codec: int, data: bytes) -> bytes:
    if codec == 1:
        return kcodec.gzip_decode(data)
    if codec == 2:
        return kcodec.snappy_decode(data)
    if codec == 3:
        return kcodec.lz4_decode(data)
    if codec == 4:
        return kcodec.zstd_decode(data)
    raise KafkaError(f"unknown compression codec {codec} in a record batch")


def decode_batch(raw, out: list, min_offset: int = 0) -> None:
    """Decode one v2 record batch (``raw``: its bytes, starting at the base offset) into ``out`` as
    ``(offset, timestamp, key, value, headers)`` tuples; ``headers`` is ``()`` or a tuple of
    ``(str, bytes|None)``. Records below ``min_offset`` are skipped. Control batches are skipped.
    Large batches go through :func:`decode_batch_columns` (numpy over the fields), small ones
    through a plain loop; both give the same tuples."""
    cols = decode_batch_columns(raw, min_offset)
    if cols is not None and cols.offsets:
        out.extend(cols.tuples())


def _decode_loop(raw, out: list, min_offset: int = 0) -> None:
    """The record-by-record decoder (small batches, and the reference for the columnar one)."""
    (base_offset, _length, _epoch, _magic, _crc, attrs, _lod, first_ts, max_ts, _pid, _pe, _bs,
     count) = _REC_HDR.unpack_from(raw, 0)
    if attrs & _CONTROL_MASK:
        return
    codec = attrs & _CODEC_MASK
    if codec:
        buf = _decompress(codec, bytes(raw[_HDR_LEN:]))
        pos = 0
    else:
        buf = raw if type(raw) is bytes else bytes(raw)
        pos = _HDR_LEN
    log_append = attrs & _LOG_APPEND
    append = out.append
    hcache = _HCACHE
    slow = _varint_slow
    for _ in range(count):
        # record length: not needed, skip its bytes; then the attributes byte
        if buf[pos] < 0x80:
            pos += 2
        elif buf[pos + 1] < 0x80:
            pos += 3
        else:
            _, pos = slow(buf, pos)
            pos += 1
        b = buf[pos]  # timestamp delta
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
            # the header bytes repeat from record to record (same batch id): cache the decoded
            # tuple by its raw bytes instead of building it again
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
                headers = _headers(hraw, hc)
                if len(hcache) < 4096:
                    hcache[hraw] = headers
        else:
            headers = ()
        offset = base_offset + od
        if offset >= min_offset:
            append((offset, max_ts if log_append else first_ts + tsd, key, value, headers))


# --------------------------------------------------------------------------------------------
# columnar decoding (the restore path): one sequential pass finds where each record starts, numpy
# decodes every other field of all records at once, and consecutive records with the same header
# bytes share one decoded headers tuple. Exactly the records of _decode_loop, without a tuple per
# record.

_COLUMNAR_MIN = 48  # below this many records per batch the plain loop is cheaper
_RUN_CACHE: dict = {}  # raw header section (count varint included) -> decoded headers tuple


class Columns:
    """Records column-wise: ``offsets``, ``timestamps``, ``keys``, ``values`` (parallel lists) and
    ``runs``, a list of ``(start, stop, headers)`` covering the records in order, where the records
    of one run carry the same ``headers`` tuple (a changelog's records of one commit all do)."""

    __slots__ = ("offsets", "timestamps", "keys", "values", "runs")

    def __init__(self, offsets=None, timestamps=None, keys=None, values=None, runs=None):
        self.offsets = [] if offsets is None else offsets
        self.timestamps = [] if timestamps is None else timestamps
        self.keys = [] if keys is None else keys
        self.values = [] if values is None else values
        self.runs = [] if runs is None else runs

    def __len__(self) -> int:
        return len(self.offsets)

    def headers(self) -> list:
        """The headers of every record (one list entry per record)."""
        out: list = []
        for s, e, h in self.runs:
            out.extend((h,) * (e - s))
        return out

    def tuples(self):
        """``(offset, timestamp, key, value, headers)`` per record, as :func:`decode_batch` gives."""
        return zip(self.offsets, self.timestamps, self.keys, self.values, self.headers())

    def extend(self, other: "Columns") -> None:
        n = len(self.offsets)
        self.offsets.extend(other.offsets)
        self.timestamps.extend(other.timestamps)
        self.keys.extend(other.keys)
        self.values.extend(other.values)
        runs = self.runs
        for s, e, h in other.runs:
            if runs and runs[-1][1] == s + n and (runs[-1][2] is h or runs[-1][2] == h):
                runs[-1] = (runs[-1][0], e + n, runs[-1][2])
            else:
                runs.append((s + n, e + n, h))

    def slice(self, i: int, j: int) -> "Columns":
        """Records ``[i, j)`` as new Columns."""
        runs = [(max(s, i) - i, min(e, j) - i, h) for s, e, h in self.runs if s < j and e > i]
        return Columns(self.offsets[i:j], self.timestamps[i:j], self.keys[i:j], self.values[i:j],
                       runs)

    @classmethod
    def from_tuples(cls, records) -> "Columns":
        c = cls()
        if not records:
            return c
        offs, tss, keys, values, hdrs = (list(x) for x in zip(*records))
        runs = c.runs
        start = 0
        cur = hdrs[0]
        for i in range(1, len(hdrs)):
            h = hdrs[i]
            if h is not cur and h != cur:
                runs.append((start, i, cur))
                start, cur = i, h
        runs.append((start, len(hdrs), cur))
        c.offsets, c.timestamps, c.keys, c.values = offs, tss, keys, values
        return c


def _varints(a, pos):
    """Zigzag varints at positions ``pos`` of the uint8 array ``a``: (values, widths); widths is
    the int 1 when every varint is one byte (the common case: small lengths and deltas)."""
    b = a[pos]
    more = b >= 0x80
    if not more.any():
        v = b.astype(_np.int64)
        return (v >> 1) ^ -(v & 1), 1
    v = (b & 0x7F).astype(_np.uint64)
    w = _np.ones(len(pos), _np.int64)
    idx = _np.flatnonzero(more)
    shift = 7
    while idx.size:
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
        b = a[pos[idx] + w[idx]]
        v[idx] |= (b & 0x7F).astype(_np.uint64) << _np.uint64(shift)
        w[idx] += 1
        idx = idx[b >= 0x80]
        shift += 7
    z = (v >> _np.uint64(1)).astype(_np.int64) ^ -(v & _np.uint64(1)).astype(_np.int64)
    return z, w


def _run_headers(raw: bytes) -> tuple:
    """Decode a header section (count varint first); checks it is consumed exactly."""
    h = _RUN_CACHE.get(raw)
    if h is None:
        hc, pos = _varint_slow(raw, 0)
        body = raw[pos:]
        h = _headers(body, hc) if hc else ()
        if _encode_headers(h) != raw:
            raise ValueError("header section does not match its count")
        if len(_RUN_CACHE) < 4096:
            _RUN_CACHE[raw] = h
    return h


def _header_runs(a, buf: bytes, ve, rend, hs: list, he: list, n: int) -> list:
    """``[(start, stop, headers)]``: maximal runs of records with byte-identical header sections.
    The records whose section equals the first record's are found in numpy, comparing fixed-width
    rows (a commit's records all carry the same batch header); only the others (its marker) are
    compared as bytes."""
    ref = buf[hs[0]:he[0]]
    L = len(ref)
    h0 = _run_headers(ref)
    if L <= 256:
        fits = (rend - ve) == L
        rows = _np.ascontiguousarray(_window(a, L)[_np.where(fits, ve, ve[0])])
        same = (rows.view(f"V{L}").ravel() == _np.frombuffer(ref, f"V{L}")[0]) & fits
        odd = _np.flatnonzero(~same).tolist()
    else:
        odd = [i for i in range(n) if buf[hs[i]:he[i]] != ref]
    runs: list = []
    s = 0
    cur = None       # the raw section of the current run; None: `ref`
    prev = -1
    for i in odd:
        if i > prev + 1 and cur is not None:  # `ref` records between the odd ones
            runs.append((s, prev + 1, _run_headers(cur)))
            s, cur = prev + 1, None
        raw = buf[hs[i]:he[i]]
        if cur is None or raw != cur:
            if i > s:
                runs.append((s, i, h0 if cur is None else _run_headers(cur)))
            s, cur = i, raw
        prev = i
    if prev < n - 1 and cur is not None:
        runs.append((s, prev + 1, _run_headers(cur)))
        s, cur = prev + 1, None
    runs.append((s, n, h0 if cur is None else _run_headers(cur)))
    return runs


def decode_batch_columns(raw, min_offset: int = 0):
    """Decode one v2 record batch into :class:`Columns` (records below ``min_offset`` skipped);
    None for a control batch. The same records as :func:`decode_batch`."""
    (base_offset, _length, _epoch, _magic, _crc, attrs, _lod, first_ts, max_ts, _pid, _pe, _bs,
     count) = _REC_HDR.unpack_from(raw, 0)
    if attrs & _CONTROL_MASK:
        return None
    if count < _COLUMNAR_MIN:
        out: list = []
        _decode_loop(raw, out, min_offset)
        return Columns.from_tuples(out)
    codec = attrs & _CODEC_MASK
    if codec:
        buf = _decompress(codec, bytes(raw[_HDR_LEN:]))
        pos = 0
    else:
        buf = raw if type(raw) is bytes else bytes(raw)
        pos = _HDR_LEN
    try:
        cols = _columns(buf, pos, count, base_offset, first_ts, max_ts, attrs & _LOG_APPEND,
                        min_offset)
    except (IndexError, ValueError):
        cols = None
    if cols is None:  # malformed or unusual (offsets not increasing): the loop says what it finds
        out = []
        _decode_loop(raw, out, min_offset)
        return Columns.from_tuples(out)
    return cols


def _columns(buf: bytes, pos: int, count: int, base_offset: int, first_ts: int, max_ts: int,
             log_append: int, min_offset: int):
    # the one sequential step: where each record starts (each begins with its length)
    starts = []
    add = starts.append
    end = len(buf)
    for _ in range(count):
        add(pos)
        b = buf[pos]
        if b < 0x80:
            pos += 1 + (b >> 1)
        else:
            b2 = buf[pos + 1]
            if b2 < 0x80:
                pos += 2 + (((b & 0x7F) | (b2 << 7)) >> 1)
            else:
                n, pos = _varint_slow(buf, pos)
                pos += n
    if pos != end:
        return None
    a = _np.frombuffer(buf, _np.uint8)
    S = _np.array(starts, _np.int64)
    rlen, w = _varints(a, S)
    rend = S + w + rlen
    p = S + w + 1                      # after the attributes byte
    tsd, w = _varints(a, p)
    p = p + w
    od, w = _varints(a, p)
    p = p + w
    klen, w = _varints(a, p)
    ks = p + w
    ke = ks + _np.maximum(klen, 0)
    vlen, w = _varints(a, ke)
    vs = ke + w
    ve = vs + _np.maximum(vlen, 0)     # the header section: [ve, rend)
    if (ve >= rend).any() or (rlen < 0).any():
        return None
    offs = od + base_offset
    n = count
    first = 0
    if offs[0] < min_offset:
        keep = offs >= min_offset
        first = n - int(keep.sum())
        if not keep[first:].all():
            return None
    if n - first > 1 and (offs[first + 1:] <= offs[first:-1]).any():
        return None
    if first:
        rend, ks, ke, vs, ve, klen, vlen, offs, tsd = (x[first:] for x in (
            rend, ks, ke, vs, ve, klen, vlen, offs, tsd))
        n -= first
    if n == 0:
        return Columns()
    keys = [buf[i:j] for i, j in zip(ks.tolist(), ke.tolist())]
    if klen.min() < 0:
        for i in _np.flatnonzero(klen < 0).tolist():
            keys[i] = None
    values = [buf[i:j] for i, j in zip(vs.tolist(), ve.tolist())]
    if vlen.min() < 0:
        for i in _np.flatnonzero(vlen < 0).tolist():
            values[i] = None
    # header runs: records whose header sections are byte-identical share one decoded tuple
    he = rend.tolist()
    hs = ve.tolist()
    if (rend - ve == 1).all() and not a[ve].any():
        runs = [(0, n, ())]                 # no record has headers
    else:
        runs = _header_runs(a, buf, ve, rend, hs, he, n)
    if log_append:
        timestamps = [max_ts] * n
    else:
        timestamps = (tsd + first_ts).tolist()
    return Columns(offs.tolist(), timestamps, keys, values, runs)


# --------------------------------------------------------------------------------------------
# record encoding (the produce path): v2 record batches, uncompressed, byte for byte what
# kafka-python's MemoryRecordsBuilder writes, without its per-record Python objects

_BATCH_HDR = struct.Struct(">qiibIhiqqqhii")


def _zz_varint(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_ZZ = [_zz_varint(i) for i in range(1 << 14)]  # 0 .. 16383: every small length and offset delta
_ZZ_NULL = _zz_varint(-1)


def _zz(n: int) -> bytes:
    return _ZZ[n] if 0 <= n < 16384 else _zz_varint(n)


def _encode_headers(hdrs) -> bytes:
    parts = [_zz(len(hdrs))]
    for hk, hv in hdrs:
        kb = hk.encode("utf-8") if isinstance(hk, str) else bytes(hk)
        parts.append(_zz(len(kb)))
        parts.append(kb)
        if hv is None:
            parts.append(_ZZ_NULL)
        else:
            parts.append(_zz(len(hv)))
            parts.append(hv)
    return b"".join(parts)


def _close_batch(recs: list, ts: int) -> bytes:
    body = b"".join(recs)
    n = len(recs)
    hdr = bytearray(_BATCH_HDR.pack(0, _HDR_LEN - 12 + len(body), 0, 2, 0, 0, n - 1, ts, ts,
                                    -1, -1, -1, n))
    struct.pack_into(">I", hdr, 17, _crc32c(bytes(hdr[21:]) + body))  # attributes .. end
    return bytes(hdr) + body


def _encode_record(i: int, key, value, hb: bytes) -> bytes:
    """One record of a batch: attributes 0, timestamp delta 0, offset delta ``i``."""
    parts = [b"\x00\x00", _zz(i)]
    if key is None:
        parts.append(_ZZ_NULL)
    else:
        parts.append(_zz(len(key)))
        parts.append(key)
    if value is None:
        parts.append(_ZZ_NULL)
    else:
        parts.append(_zz(len(value)))
        parts.append(value)
    parts.append(hb)
    r = b"".join(parts)
    return _zz(len(r)) + r


def encode_batches(records: Iterable, headers, batch_bytes: int, ts: int) -> list:
    """Encode ``(key, value)`` / ``(key, value, headers)`` records (one timestamp for all) into
    ``[(v2 record batch bytes, record count)]``; a new batch starts when the record would take the
    current one past ``batch_bytes`` (a batch holds at least one record)."""
    default_hdrs = _encode_headers(list(headers or []))
    out: list = []
    recs: list = []
    size = _HDR_LEN
    for rec in records:
        if len(rec) == 3:
            key, value, hdrs = rec
            hb = _encode_headers(hdrs) if hdrs else default_hdrs
        else:
            key, value = rec
            hb = default_hdrs
        r = _encode_record(len(recs), key, value, hb)
        if recs and size + len(r) > batch_bytes:
            out.append((_close_batch(recs, ts), len(recs)))
            recs = []
            size = _HDR_LEN
            r = _encode_record(0, key, value, hb)
        recs.append(r)
        size += len(r)
    if recs:
        out.append((_close_batch(recs, ts), len(recs)))
    return out


def _varint_sizes(z):
    """Bytes of the (already zigzagged, non-negative) varints ``z``."""
    sz = _np.ones(len(z), _np.int64)
    for bound in (1 << 7, 1 << 14, 1 << 21, 1 << 28, 1 << 35, 1 << 42, 1 << 49, 1 << 56, 1 << 63):
        more = z >= bound
        if not more.any():
            break
        sz += more
    return sz


def _put_varints(out, pos, z, sz) -> None:
    for j in range(int(sz.max()) if len(sz) else 0):
        m = sz > j
        p = pos[m] + j
        b = (z[m] >> (7 * j)) & 0x7F
        out[p] = (b | ((sz[m] > j + 1) * 0x80)).astype(_np.uint8)


def _scatter(out, dest_starts, lengths, src) -> None:
    """Copy the segments of ``src`` (one after the other, ``lengths`` bytes each) to
    ``out[dest_starts[i]:]``."""
    total = int(lengths.sum())
    if total == 0:
        return
    shift = _np.repeat(dest_starts - (_np.cumsum(lengths) - lengths), lengths)
    shift += _np.arange(total, dtype=_np.int64)
    out[shift] = src[:total]


def encode_batches_flat(kbuf, klen, vbuf, vlen, ts: int, batch_bytes: int = 900_000) -> list:
    """:func:`encode_batches` for records given column-wise, without a Python loop per record
    (the fast produce path): ``kbuf``/``vbuf`` are uint8 arrays of the keys/values one after the
    other, ``klen``/``vlen`` their lengths (-1: null). No headers; one timestamp. Returns
    ``[(v2 record batch bytes, record count)]``, batches of at most ~``batch_bytes`` (at least
    one record each). The records decode exactly as ``encode_batches`` ones do."""
    klen = _np.asarray(klen, _np.int64)
    vlen = _np.asarray(vlen, _np.int64)
    kbuf = _np.asarray(kbuf, _np.uint8)
    vbuf = _np.asarray(vbuf, _np.uint8)
    n = len(klen)
    if n == 0:
        return []
    kl = _np.maximum(klen, 0)
    vl = _np.maximum(vlen, 0)
    kstart = _np.cumsum(kl) - kl
    vstart = _np.cumsum(vl) - vl
    zk = (klen << 1) ^ (klen >> 63)
    zv = (vlen << 1) ^ (vlen >> 63)
    ksz = _varint_sizes(zk)
    vsz = _varint_sizes(zv)
    fixed = 3 + ksz + kl + vsz + vl  # attributes, timestamp delta, header count + key + value
    # batch cuts: greedy by size, counting the largest offset-delta and length varints
    worst = fixed + 3 + 3
    cum = _np.cumsum(worst)
    out = []
    s = 0
    while s < n:
        before = cum[s - 1] if s else 0
        e = int(_np.searchsorted(cum, before + batch_bytes - _HDR_LEN, side="right"))
        e = max(e, s + 1)
        out.append(_encode_flat_batch(kbuf, vbuf, klen[s:e], vlen[s:e], kl[s:e], vl[s:e],
                                      kstart[s:e], vstart[s:e], zk[s:e], zv[s:e], ksz[s:e],
                                      vsz[s:e], fixed[s:e], ts))
        s = e
    return out


def _encode_flat_batch(kbuf, vbuf, klen, vlen, kl, vl, kstart, vstart, zk, zv, ksz, vsz, fixed,
                       ts) -> tuple:
    c = len(klen)
    od = _np.arange(c, dtype=_np.int64) << 1
    osz = _varint_sizes(od)
    body = fixed + osz
    zb = body << 1
    bsz = _varint_sizes(zb)
    rec = bsz + body
    pos = _np.cumsum(rec) - rec
    buf = _np.zeros(int(rec.sum()), _np.uint8)
    _put_varints(buf, pos, zb, bsz)
    p = pos + bsz + 2                 # attributes 0, timestamp delta 0 (zeros already)
    _put_varints(buf, p, od, osz)
    p = p + osz
    _put_varints(buf, p, zk, ksz)
    p = p + ksz
    _scatter(buf, p, kl, kbuf[kstart[0]:] if c else kbuf)
    p = p + kl
    _put_varints(buf, p, zv, vsz)
    p = p + vsz
    _scatter(buf, p, vl, vbuf[vstart[0]:] if c else vbuf)  # then the header count 0 (zero)
    data = buf.tobytes()
    hdr = bytearray(_BATCH_HDR.pack(0, _HDR_LEN - 12 + len(data), 0, 2, 0, 0, c - 1, ts, ts,
                                    -1, -1, -1, c))
    struct.pack_into(">I", hdr, 17, _crc32c(bytes(hdr[21:]) + data))
    return bytes(hdr) + data, c



def _scan_batches(data) -> tuple[list, int | None]:
    """Split a Fetch response's records bytes into complete batches (memoryviews) without decoding
    records. Returns (batches, next_offset after the last complete batch or None)."""
    batches = []
    next_offset = None
    mr = MemoryRecords(data)
    while mr.has_next():
        b = mr.next_batch()
        if not isinstance(b, DefaultRecordBatch):
            raise KafkaError("the broker returned an old (v0/v1) message format; statekit needs v2")
        batches.append(bytes(b._buffer))  # one copy; slicing bytes then yields bytes
        next_offset = b.last_offset + 1
    return batches, next_offset


@dataclass
class Chunk:
    """What one Fetch returned for one partition: decoded records plus the log's bounds."""

    records: list  # (offset, timestamp, key, value, headers)
    next_offset: int  # where the next read starts (past compaction gaps and control batches)
    high_watermark: int
    log_start_offset: int

    def __len__(self):
        return len(self.records)

    def __iter__(self):
        return iter(self.records)


@dataclass
class ColumnChunk:
    """What one Fetch returned, column-wise (``read(..., columns=True)``): the restore path."""

    columns: Columns
    next_offset: int
    high_watermark: int
    log_start_offset: int

    def __len__(self):
        return len(self.columns)

    @property
    def records(self) -> list:
        return list(self.columns.tuples())


def _decode_columns(batches, min_offset: int, end: int | None = None) -> Columns:
    cols = Columns()
    for raw in batches:
        c = decode_batch_columns(raw, min_offset)
        if c is not None and c.offsets:
            cols.extend(c)
    if end is not None and cols.offsets and cols.offsets[-1] >= end:
        cols = cols.slice(0, bisect.bisect_left(cols.offsets, end))
    return cols


# --------------------------------------------------------------------------------------------
# one broker connection


class _Conn:
    def __init__(self, host: str, port: int, timeout: float, client_id: str):
        self.addr = f"{host}:{port}"
        self.timeout = timeout
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise BrokerUnreachable(f"cannot reach Kafka at {self.addr}: {_HINT} ({e.strerror or e})")
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        except OSError:
            pass
        self.proto = KafkaProtocol(client_id=client_id, receive_message_max_bytes=256 << 20)
        self.ready: dict = {}  # correlation id -> decoded response not yet claimed
        self.versions: dict[int, tuple[int, int]] = {}
        self._negotiate()

    def _negotiate(self):
        try:
            resp = self.request(ApiVersionsRequest(version=0))
        except BrokerUnreachable:
            raise
        except Exception:  # noqa: BLE001 - an old broker: fall back to the lowest versions
            return
        for k in resp.api_keys:
            self.versions[k.api_key] = (k.min_version, k.max_version)

    def version(self, cls, lo: int, hi: int) -> int:
        rng = self.versions.get(cls.API_KEY)
        if rng is None:
            return lo
        v = min(hi, rng[1], cls.max_version)
        if v < max(lo, rng[0]):
            raise KafkaError(f"the broker at {self.addr} supports {cls.__name__} "
                             f"v{rng[0]}-{rng[1]}; statekit needs v{lo}-{hi}")
        return v

    def send(self, req) -> int:
        """Queue and write one request; returns its correlation id (for :meth:`recv`)."""
        cid = self.proto.send_request(req)
        data = self.proto.send_bytes()
        try:
            self.sock.sendall(data)
        except OSError as e:
            self.close()
            raise BrokerUnreachable(f"lost the connection to Kafka at {self.addr}: {e}; {_HINT}")
        return cid

    def recv(self, cid: int):
        """The response to request ``cid`` (others that arrive first are kept for their callers,
        so a pipelined Fetch and an interleaved ListOffsets on one connection do not mix up)."""
        while cid not in self.ready:
            try:
                data = self.sock.recv(4 << 20)
            except socket.timeout:
                self.close()
                raise BrokerUnreachable(f"Kafka at {self.addr} did not answer within "
                                        f"{self.timeout:.0f}s; is the broker alive? ({_HINT})")
            except OSError as e:
                self.close()
                raise BrokerUnreachable(f"lost the connection to Kafka at {self.addr}: {e}")
            if not data:
                self.close()
                raise BrokerUnreachable(f"Kafka at {self.addr} closed the connection; {_HINT}")
            for rcid, resp in self.proto.receive_bytes(data):
                self.ready[rcid] = resp
        return self.ready.pop(cid)

    def request(self, req):
        return self.recv(self.send(req))

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def _raise_for(code: int, what: str, topic: str | None = None):
    if code == 0:
        return
    if code == 3 and topic is not None:
        raise UnknownTopic(f"topic {topic!r} does not exist: create it first (or let statekit "
                           f"create it) and check the name")
    err = kerrors.for_code(code)
    raise KafkaError(f"{what}: {err.__name__} (error code {code})")


_RETRIABLE = {5, 6, 7, 13, 14, 15, 19, 20, 21, 56, 74, 75, 103}


# --------------------------------------------------------------------------------------------


class Kafka:
    """A small synchronous Kafka client. See the module docstring."""

    def __init__(self, bootstrap: str | None = None, *, timeout: float = 30.0,
                 client_id: str = "statekit", fetch_max_bytes: int = 8 << 20):
        self.bootstrap = resolve_bootstrap(bootstrap)
        self.timeout = timeout
        self.client_id = client_id
        self.fetch_max_bytes = fetch_max_bytes
        self._boot_conn: _Conn | None = None
        self._conns: dict[int, _Conn] = {}
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._lock = threading.RLock()
        self._any()  # fail fast, one line, when nothing listens

    # -- connections ---------------------------------------------------------------------
    def _any(self) -> _Conn:
        if self._boot_conn is not None and self._boot_conn.sock.fileno() >= 0:
            return self._boot_conn
        last = None
        for hp in self.bootstrap.split(","):
            hp = hp.strip()
            if not hp:
                continue
            host, _, port = hp.rpartition(":")
            try:
                self._boot_conn = _Conn(host or "127.0.0.1", int(port), self.timeout, self.client_id)
                return self._boot_conn
            except BrokerUnreachable as e:
                last = e
        raise BrokerUnreachable(f"cannot reach Kafka at {self.bootstrap}: {_HINT}") from last

    def _node(self, node_id: int) -> _Conn:
        c = self._conns.get(node_id)
        if c is not None and c.sock.fileno() >= 0:
            return c
        host, port = self._brokers[node_id]
        boot = self._any()
        if boot.addr == f"{host}:{port}":
            c = boot
        else:
            c = _Conn(host, port, self.timeout, self.client_id)
        self._conns[node_id] = c
        return c

    def _metadata(self, topics: list[str] | None):
        conn = self._any()
        v = conn.version(MetadataRequest, 1, 12)
        req = MetadataRequest(
            version=v,
            topics=None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        resp = conn.request(req)
        self._brokers = {b.node_id: (b.host, b.port) for b in resp.brokers}
        for t in resp.topics:
            if t.error_code == 0:
                for p in t.partitions:
                    self._leaders[(t.name, p.partition_index)] = p.leader_id
        return resp

    def _leader(self, topic: str, partition: int) -> _Conn:
        key = (topic, partition)
        if key not in self._leaders:
            resp = self._metadata([topic])
            for t in resp.topics:
                if t.name == topic and t.error_code == 3:
                    _raise_for(3, "metadata", topic)
            if key not in self._leaders:
                raise UnknownTopic(f"topic {topic!r} has no partition {partition}: it has "
                                   f"{self._partition_count(resp, topic)} partition(s)")
        leader = self._leaders[key]
        if leader < 0 or leader not in self._brokers:
            self._leaders.pop(key, None)
            raise KafkaError(f"{topic}[{partition}] has no leader right now; retry shortly")
        return self._node(leader)

    @staticmethod
    def _partition_count(resp, topic):
        for t in resp.topics:
            if t.name == topic:
                return len(t.partitions)
        return 0

    def _forget(self, topic: str):
        for k in [k for k in self._leaders if k[0] == topic]:
            del self._leaders[k]

    # -- admin -----------------------------------------------------------------------------
    def topics(self) -> dict[str, int]:
        """``{topic: number of partitions}`` for every topic."""
        with self._lock:
            resp = self._metadata(None)
            return {t.name: len(t.partitions) for t in resp.topics if t.error_code == 0}

    def partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """``{topic: number of partitions}`` for those of ``topics`` that exist (one Metadata
        request for just these topics; missing ones are left out)."""
        names = list(dict.fromkeys(topics))
        if not names:
            return {}
        with self._lock:
            for t in names:
                self._forget(t)
            resp = self._metadata(names)
            return {t.name: len(t.partitions) for t in resp.topics
                    if t.error_code == 0 and t.name in names}

    def ensure_topic(self, name: str, partitions: int = 1, configs: dict | None = None,
                     replication_factor: int = 1) -> bool:
        """Create the topic unless it exists. Returns True when it was created."""
        with self._lock:
            conn = self._any()
            v = conn.version(CreateTopicsRequest, 2, 4)  # v5+ echo configs back; we need none
            T = CreateTopicsRequest.CreatableTopic
            req = CreateTopicsRequest(
                version=v,
                topics=[T(name=name, num_partitions=partitions, replication_factor=replication_factor,
                          assignments=[],
                          configs=[T.CreatableTopicConfig(name=k, value=str(val))
                                   for k, val in (configs or {}).items()])],
                timeout_ms=int(self.timeout * 1000),
                validate_only=False,
            )
            resp = conn.request(req)
            created = True
            for t in resp.topics:
                if t.error_code == 36:  # TOPIC_ALREADY_EXISTS
                    created = False
                elif t.error_code:
                    msg = getattr(t, "error_message", None) or ""
                    _raise_for(t.error_code, f"cannot create topic {name!r} {msg}".strip())
            # wait until every partition has a leader
            deadline = time.monotonic() + self.timeout
            while True:
                self._forget(name)
                resp = self._metadata([name])
                ok = [t for t in resp.topics if t.name == name and t.error_code == 0]
                if ok and all(p.leader_id >= 0 for p in ok[0].partitions) and ok[0].partitions:
                    return created
                if time.monotonic() > deadline:
                    raise KafkaError(f"topic {name!r} was created but has no leader after "
                                     f"{self.timeout:.0f}s")
                time.sleep(0.05)

    def delete_topic(self, name: str, missing_ok: bool = True) -> bool:
        with self._lock:
            conn = self._any()
            v = conn.version(DeleteTopicsRequest, 1, 5)
            resp = conn.request(DeleteTopicsRequest(version=v, topic_names=[name],
                                                    timeout_ms=int(self.timeout * 1000)))
            self._forget(name)
            for r in resp.responses:
                if r.error_code == 3:
                    if missing_ok:
                        return False
                    _raise_for(3, "delete", name)
                _raise_for(r.error_code, f"cannot delete topic {name!r}")
            return True

    def describe_configs(self, topic: str) -> dict[str, str]:
        with self._lock:
            conn = self._any()
            v = conn.version(DescribeConfigsRequest, 1, 4)
            R = DescribeConfigsRequest.DescribeConfigsResource
            resp = conn.request(DescribeConfigsRequest(
                version=v, resources=[R(resource_type=2, resource_name=topic, configuration_keys=None)],
                include_synonyms=False, include_documentation=False))
            out = {}
            for r in resp.results:
                if r.error_code == 3:
                    _raise_for(3, "describe", topic)
                _raise_for(r.error_code, f"cannot describe topic {topic!r}: {r.error_message or ''}")
                for c in r.configs:
                    out[c.name] = c.value
            return out

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Move the log start of one partition to ``before_offset`` (Kafka's DeleteRecords).
        Returns the new log start offset."""
        with self._lock:
            conn = self._leader(topic, partition)
            v = conn.version(DeleteRecordsRequest, 0, 2)
            T = DeleteRecordsRequest.DeleteRecordsTopic
            resp = conn.request(DeleteRecordsRequest(
                version=v, topics=[T(name=topic, partitions=[T.DeleteRecordsPartition(
                    partition_index=partition, offset=before_offset)])],
                timeout_ms=int(self.timeout * 1000)))
            for t in resp.topics:
                for p in t.partitions:
                    _raise_for(p.error_code, f"cannot delete records of {topic}[{partition}]", topic)
                    return p.low_watermark
            raise KafkaError(f"empty DeleteRecords response for {topic}[{partition}]")

    # -- offsets -----------------------------------------------------------------------------
    def _list_offsets(self, topic: str, timestamp: int, partitions=None) -> dict[int, int]:
        with self._lock:
            if partitions is None:
                self._forget(topic)
                resp = self._metadata([topic])
                parts = None
                for t in resp.topics:
                    if t.name == topic:
                        if t.error_code == 3:
                            _raise_for(3, "offsets", topic)
                        parts = [p.partition_index for p in t.partitions]
                if parts is None:
                    _raise_for(3, "offsets", topic)
            else:
                parts = list(partitions)
            by_node: dict[int, list[int]] = {}
            for p in parts:
                self._leader(topic, p)
                by_node.setdefault(self._leaders[(topic, p)], []).append(p)
            out = {}
            for node, ps in by_node.items():
                conn = self._node(node)
                v = conn.version(ListOffsetsRequest, 1, 7)
                T = ListOffsetsRequest.ListOffsetsTopic
                req = ListOffsetsRequest(
                    version=v, replica_id=-1, isolation_level=0,
                    topics=[T(name=topic, partitions=[
                        T.ListOffsetsPartition(partition_index=p, current_leader_epoch=-1,
                                               timestamp=timestamp) for p in ps])])
                resp = conn.request(req)
                for t in resp.topics:
                    for p in t.partitions:
                        if p.error_code in _RETRIABLE:
                            self._forget(topic)
                        _raise_for(p.error_code, f"cannot list offsets of {topic}[{p.partition_index}]", topic)
                        out[p.partition_index] = p.offset
            return dict(sorted(out.items()))

    def end_offsets(self, topic: str, partitions=None) -> dict[int, int]:
        """``{partition: offset of the next record to be written}`` (the high watermark)."""
        return self._list_offsets(topic, -1, partitions)

    def begin_offsets(self, topic: str, partitions=None) -> dict[int, int]:
        """``{partition: log start offset}``."""
        return self._list_offsets(topic, -2, partitions)

    def offsets_many(self, topics: Iterable[str], partition: int) -> dict[str, tuple[int, int]]:
        """``{topic: (log start offset, end offset)}`` of one partition of several topics, with
        every ListOffsets request in flight at once (one round trip instead of two per topic)."""
        names = list(dict.fromkeys(topics))
        if not names:
            return {}
        with self._lock:
            for _attempt in range(10):
                by_node: dict[int, list[str]] = {}
                for t in names:
                    self._leader(t, partition)
                    by_node.setdefault(self._leaders[(t, partition)], []).append(t)
                T = ListOffsetsRequest.ListOffsetsTopic
                inflight = []
                for node, ts in by_node.items():
                    conn = self._node(node)
                    v = conn.version(ListOffsetsRequest, 1, 7)
                    for stamp in (-2, -1):
                        req = ListOffsetsRequest(
                            version=v, replica_id=-1, isolation_level=0,
                            topics=[T(name=t, partitions=[T.ListOffsetsPartition(
                                partition_index=partition, current_leader_epoch=-1,
                                timestamp=stamp)]) for t in ts])
                        inflight.append((conn, stamp, conn.send(req)))
                found: dict[tuple[str, int], int] = {}
                retry = False
                first_error = None
                for conn, stamp, cid in inflight:
                    resp = conn.recv(cid)
                    for t in resp.topics:
                        for p in t.partitions:
                            if p.error_code in _RETRIABLE:
                                self._forget(t.name)
                                retry = True
                            elif p.error_code:
                                first_error = first_error or (p.error_code, t.name)
                            else:
                                found[(t.name, stamp)] = p.offset
                if first_error:
                    code, t = first_error
                    _raise_for(code, f"cannot list offsets of {t}[{partition}]", t)
                if not retry:
                    return {t: (found[(t, -2)], found[(t, -1)]) for t in names}
                time.sleep(0.05)
            raise KafkaError(f"could not list offsets of {', '.join(names)}[{partition}]: the "
                             f"partition kept answering with a retriable error")

    # -- produce -------------------------------------------------------------------------------
    def send(self, topic: str, partition: int, records: Iterable, headers=None,
             batch_bytes: int = 900_000) -> int:
        """Append ``records`` (``(key, value)`` or ``(key, value, headers)`` tuples; ``headers`` a
        list of ``(str, bytes)``, the ``headers`` argument applying to records that carry none) to
        one partition with acks=all and wait for every acknowledgement. Returns the offset of the
        last record written (-1 when ``records`` is empty)."""
        payloads = self._payloads(records, headers, batch_bytes)
        if not payloads:
            return -1
        with self._lock:
            return self._produce_retrying(topic, partition, payloads)

    def send_many(self, items: Iterable, batch_bytes: int = 900_000) -> list[int]:
        """Several :meth:`send` calls at once: ``items`` is ``[(topic, partition, records)]``;
        every Produce request goes out before the first acknowledgement is awaited (one round
        trip instead of one per item). Returns each item's last offset, as :meth:`send` does.
        The order within an item is kept; across items there is no order (a failure may leave
        any subset of the items written, as a crash between sequential sends may)."""
        built = [(t, p, self._payloads(recs, None, batch_bytes)) for t, p, recs in items]
        out = [-1] * len(built)
        with self._lock:
            for topic, partition, payloads in built:  # unknown topics fail before anything is sent
                if payloads:
                    self._leader(topic, partition)
            inflight = []
            for i, (topic, partition, payloads) in enumerate(built):
                if payloads:
                    inflight.append((i, self._produce_send(topic, partition, payloads)))
            redo = []
            first_error = None
            for i, sent in inflight:
                topic, partition, payloads = built[i]
                try:
                    out[i] = self._produce_collect(topic, partition, payloads, sent)
                except _Retry:
                    redo.append(i)
                except KafkaError as e:  # keep collecting: no ack is left behind on the socket
                    first_error = first_error or e
            if first_error is not None:
                raise first_error
            for i in redo:
                topic, partition, payloads = built[i]
                self._forget(topic)
                out[i] = self._produce_retrying(topic, partition, payloads)
        return out

    def send_encoded(self, topic: str, batches: Iterable, *, wait: bool = True):
        """Write record batches encoded already (``[(partition, v2 batch bytes, record count)]``,
        e.g. by :func:`encode_batches_flat`) with acks=all, every request in flight at once and
        the order within a partition kept. Returns ``{partition: last offset}``; with
        ``wait=False`` a :class:`PendingSend` whose ``wait()`` collects the acks, so the caller
        can encode the next batches meanwhile (the fast produce path of ``statekit.datagen``)."""
        by_part: dict[int, list] = {}
        for partition, data, n in batches:
            by_part.setdefault(int(partition), []).append((data, n))
        with self._lock:
            for partition in by_part:  # an unknown topic fails before anything is sent
                self._leader(topic, partition)
            sent = {p: self._produce_send(topic, p, payloads) for p, payloads in by_part.items()}
        pending = PendingSend(self, topic, by_part, sent)
        return pending.wait() if wait else pending

    @staticmethod
    def _payloads(records: Iterable, headers, batch_bytes: int, ts: int | None = None) -> list:
        """``[(record batch bytes, record count)]``: v2 batches of at most ~``batch_bytes``."""
        return encode_batches(records, headers, batch_bytes,
                              int(time.time() * 1000) if ts is None else ts)

    def _produce_retrying(self, topic, partition, payloads) -> int:
        for attempt in range(20):
            try:
                return self._produce(topic, partition, payloads)
            except _Retry:
                self._forget(topic)
                time.sleep(min(0.05 * (attempt + 1), 0.5))
        raise KafkaError(f"could not write to {topic}[{partition}]: the partition kept "
                         f"answering with a retriable error")

    def _produce(self, topic, partition, payloads) -> int:
        return self._produce_collect(topic, partition, payloads,
                                     self._produce_send(topic, partition, payloads))

    def _produce_send(self, topic, partition, payloads) -> tuple:
        conn = self._leader(topic, partition)
        v = conn.version(ProduceRequest, 3, 12)
        T = ProduceRequest.TopicProduceData
        # pipeline: every batch in flight at once, then collect the acks in order
        cids = []
        for data, _n in payloads:
            cids.append(conn.send(ProduceRequest(
                version=v, transactional_id=None, acks=-1, timeout_ms=int(self.timeout * 1000),
                topic_data=[T(name=topic, partition_data=[
                    T.PartitionProduceData(index=partition, records=data)])])))
        return conn, cids

    def _produce_collect(self, topic, partition, payloads, sent) -> int:
        conn, cids = sent
        last = -1
        retry = False
        first_error = None
        for cid, (data, n) in zip(cids, payloads):
            resp = conn.recv(cid)
            for t in resp.responses:
                for p in t.partition_responses:
                    if p.error_code in _RETRIABLE:
                        retry = True
                    elif p.error_code:
                        first_error = first_error or p.error_code
                    else:
                        last = p.base_offset + n - 1
        if first_error:
            _raise_for(first_error, f"cannot write to {topic}[{partition}]", topic)
        if retry:
            # Only the first batch can be safely retried as a whole; statekit sends one commit's
            # records per call, and a retry after a partial write would duplicate absolute values,
            # which restoration tolerates (values are absolute, markers close groups).
            raise _Retry()
        return last

    # -- fetch -------------------------------------------------------------------------------
    def _fetch_request(self, conn, topic, partition, offset, max_wait_ms, max_bytes):
        v = conn.version(FetchRequest, 4, 12)
        T = FetchRequest.FetchTopic
        return FetchRequest(
            version=v, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1,
            max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[T(topic=topic, partitions=[T.FetchPartition(
                partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=max_bytes)])],
            forgotten_topics_data=[], rack_id="")

    @staticmethod
    def _partition_data(resp, topic):
        for t in resp.responses:
            for p in t.partitions:
                return p
        raise KafkaError(f"the broker sent an empty Fetch response for {topic}")

    def fetch(self, topic: str, partition: int, offset: int, max_wait_ms: int = 0,
              max_bytes: int | None = None, *, columns: bool = False) -> Chunk:
        """One Fetch at ``offset``; waits up to ``max_wait_ms`` for data. Moves past a log start
        offset that overtook ``offset``. ``columns``: a :class:`ColumnChunk` instead."""
        max_bytes = max_bytes or self.fetch_max_bytes
        with self._lock:
            for _attempt in range(10):
                conn = self._leader(topic, partition)
                cid = conn.send(self._fetch_request(conn, topic, partition, offset, max_wait_ms,
                                                    max_bytes))
                p = self._partition_data(conn.recv(cid), topic)
                if p.error_code == 1:  # OFFSET_OUT_OF_RANGE: the log start moved (or offset > end)
                    lso = self.begin_offsets(topic, [partition])[partition]
                    if offset < lso:
                        offset = lso
                        continue
                    hwm = self.end_offsets(topic, [partition])[partition]
                    if columns:
                        return ColumnChunk(Columns(), max(min(offset, hwm), lso), hwm, lso)
                    return Chunk([], max(min(offset, hwm), lso), hwm, lso)
                if p.error_code in _RETRIABLE:
                    self._forget(topic)
                    time.sleep(0.05)
                    continue
                _raise_for(p.error_code, f"cannot read {topic}[{partition}]", topic)
                batches, nxt = _scan_batches(p.records or b"")
                if columns:
                    return ColumnChunk(_decode_columns(batches, offset),
                                       nxt if nxt is not None and nxt > offset else offset,
                                       p.high_watermark, p.log_start_offset)
                out: list = []
                for raw in batches:
                    decode_batch(raw, out, offset)
                return Chunk(out, nxt if nxt is not None and nxt > offset else offset,
                             p.high_watermark, p.log_start_offset)
            raise KafkaError(f"could not read {topic}[{partition}]: no leader")

    def read(self, topic: str, partition: int, start: int | None = None, end: int | None = None,
             *, max_bytes: int | None = None, pipeline: bool = True,
             columns: bool = False) -> Iterator[Chunk]:
        """Read ``[start, end)`` of one partition as an iterator of :class:`Chunk` (one per Fetch
        response). ``start`` None = the log start; ``end`` None = the end offset when called.
        Offsets may have gaps (compaction); when the log start is past ``start`` the read begins
        there. Ends early if the log ends before ``end`` (e.g. it was truncated). ``columns``:
        :class:`ColumnChunk` s instead (no tuple per record; the restore path)."""
        max_bytes = max_bytes or self.fetch_max_bytes
        with self._lock:
            if start is None or start < 0:
                start = self.begin_offsets(topic, [partition])[partition]
            if end is None:
                end = self.end_offsets(topic, [partition])[partition]
        pos = start
        if pos >= end:
            return
        state = {"conn": None, "inflight": None}
        try:
            yield from self._read_loop(topic, partition, pos, end, max_bytes, pipeline, state,
                                       columns)
        finally:
            if state["inflight"] is not None:  # abandoned mid-read: drain the answer nobody wants
                with self._lock:
                    try:
                        state["conn"].recv(state["inflight"])
                    except StatekitError:
                        pass

    def _read_loop(self, topic, partition, pos, end, max_bytes, pipeline, state, columns=False):
        empty_rounds = 0
        conn = None
        while pos < end:
            with self._lock:
                if state["inflight"] is None:
                    conn = self._leader(topic, partition)
                    state["conn"] = conn
                    state["inflight"] = conn.send(self._fetch_request(conn, topic, partition, pos,
                                                                      0, max_bytes))
                conn = state["conn"]
                resp = conn.recv(state["inflight"])
                state["inflight"] = None
                p = self._partition_data(resp, topic)
                if p.error_code:
                    if p.error_code == 1:  # OFFSET_OUT_OF_RANGE
                        lso = self.begin_offsets(topic, [partition])[partition]
                        hwm = self.end_offsets(topic, [partition])[partition]
                        if pos < lso:
                            pos = lso
                            continue
                        end = min(end, hwm)
                        continue
                    if p.error_code in _RETRIABLE:
                        self._forget(topic)
                        time.sleep(0.05)
                        continue
                    _raise_for(p.error_code, f"cannot read {topic}[{partition}]", topic)
                batches, nxt = _scan_batches(p.records or b"")
                hwm = p.high_watermark
                lso = p.log_start_offset
                if nxt is None or nxt <= pos:
                    if lso is not None and lso > pos:
                        pos = lso  # the log start moved past us
                        continue
                    if hwm <= pos:
                        return  # the log ends before `end` (truncated or deleted)
                    empty_rounds += 1
                    if empty_rounds > 100:
                        raise KafkaError(f"{topic}[{partition}] returned no records at offset "
                                         f"{pos} below its high watermark {hwm}")
                    time.sleep(0.01)
                    continue
                empty_rounds = 0
                start_pos = pos
                pos = nxt
                if pipeline and pos < end and pos < hwm:
                    # the next Fetch goes out before we decode this one: the broker works while we do
                    state["inflight"] = conn.send(self._fetch_request(conn, topic, partition,
                                                                      pos, 0, max_bytes))
            if columns:
                yield ColumnChunk(_decode_columns(batches, start_pos, end), pos, hwm, lso)
                continue
            out: list = []
            for raw in batches:
                decode_batch(raw, out, start_pos)
            if out and out[-1][0] >= end:
                out = [r for r in out if r[0] < end]
            yield Chunk(out, pos, hwm, lso)

    def count_records(self, topic: str, partition: int, start: int, end: int,
                      max_bytes: int = 4 << 20) -> int:
        """How many records ``[start, end)`` of one partition holds (fewer than ``end - start``
        where compaction removed some), from the record batch headers: only a batch that crosses
        ``start`` or ``end`` is decoded. Costs a read of the bytes, not of the records."""
        n = 0
        with self._lock:
            lso = self.begin_offsets(topic, [partition])[partition]
            pos = max(start, lso)
            while pos < end:
                conn = self._leader(topic, partition)
                p = self._partition_data(conn.recv(conn.send(self._fetch_request(
                    conn, topic, partition, pos, 0, max_bytes))), topic)
                if p.error_code == 1:  # OFFSET_OUT_OF_RANGE: the log start moved past pos
                    lso = self.begin_offsets(topic, [partition])[partition]
                    if pos < lso:
                        pos = lso
                        continue
                    break
                _raise_for(p.error_code, f"cannot read {topic}[{partition}]", topic)
                batches, nxt = _scan_batches(p.records or b"")
                if nxt is None or nxt <= pos:
                    break
                for raw in batches:
                    base, = struct.unpack_from(">q", raw, 0)
                    last = base + struct.unpack_from(">i", raw, 23)[0]
                    count = struct.unpack_from(">i", raw, 57)[0]
                    if base >= pos and last < end:
                        if not raw[22] & _CONTROL_MASK:
                            n += count
                    else:
                        cols = decode_batch_columns(raw, pos)
                        if cols is not None:
                            n += sum(1 for o in cols.offsets if o < end)
                pos = nxt
        return n

    def close(self) -> None:
        with self._lock:
            for c in set(self._conns.values()) | ({self._boot_conn} if self._boot_conn else set()):
                c.close()
            self._conns.clear()
            self._boot_conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Retry(Exception):
    pass


class PendingSend:
    """Produce requests in flight (:meth:`Kafka.send_encoded` with ``wait=False``)."""

    def __init__(self, kafka: Kafka, topic: str, by_part: dict, sent: dict):
        self._kafka = kafka
        self.topic = topic
        self._by_part = by_part
        self._sent = sent
        self.records = sum(n for payloads in by_part.values() for _d, n in payloads)
        self._result: dict | None = None

    def wait(self) -> dict:
        """Collect every acknowledgement; ``{partition: last offset}``."""
        if self._result is not None:
            return self._result
        out: dict = {}
        first_error = None
        with self._kafka._lock:
            for p, sent in self._sent.items():
                try:  # collect every ack, even after an error: none is left on the socket
                    out[p] = self._kafka._produce_collect(self.topic, p, self._by_part[p], sent)
                except _Retry:
                    first_error = first_error or KafkaError(
                        f"{self.topic}[{p}] refused pre-encoded batches with a retriable error "
                        f"(its leader moved?); some may be written: produce into a new topic")
                except KafkaError as e:
                    first_error = first_error or e
        self._sent = {}
        if first_error is not None:
            raise first_error
        self._result = out
        return out
