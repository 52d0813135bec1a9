"""Records column-wise: :class:`Columns`, decoding a batch into columns with numpy (the restore
path: no tuple per record) and encoding columns into batches without a Python loop per record
(the produce path of changelogs, sinks and the data generator).

Decoding: one sequential pass finds where each record starts (each begins with its length),
numpy decodes every other field of all records at once, and consecutive records with the same
header bytes share one decoded headers tuple. Exactly the records of
:func:`statekit.wire.records.decode_rows`.

Encoding: keys, values and header sections are laid end to end in flat byte buffers, every
varint (lengths, timestamp and offset deltas) is sized and written with numpy, and the bytes are
scattered into place; batches are cut greedily at ``batch_bytes``.
"""
from __future__ import annotations

import bisect
import time

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import batch as B
from .compression import compress
from .errors import WireError
from .records import decode_headers, decode_rows, encode_headers, records_bytes
from .varint import put_varints, read_varint, read_varints, varint_sizes, zigzag_array

COLUMNAR_MIN = 48  # below this many records per batch the plain loop is cheaper
_RUN_CACHE: dict = {}  # raw header section (count varint included) -> decoded headers tuple


class _NotRead:
    """The value of a record decoded with ``values_kept`` (a count needs to know only which values
    are null): not bytes, so a step that did try to read it fails loudly instead of seeing bytes
    that are not the record's."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<value not read>"


NOT_READ = _NotRead()


class Columns:
    """Records column-wise: ``keys``, ``values`` (parallel lists of bytes or None), ``offsets``
    and ``timestamps`` (parallel lists of ints; on the produce side ``offsets`` is unused and
    ``timestamps`` may be None: the send time, or one int for all) and ``runs``, a list of
    ``(start, stop, headers)`` covering the records in order, where the records of one run carry
    the same ``headers`` tuple (a changelog's records of one commit all do); no runs: no headers.
    """

    __slots__ = ("offsets", "timestamps", "keys", "values", "runs")

    def __init__(self, offsets=None, timestamps=None, keys=None, values=None, runs=None):
        self.offsets = [] if offsets is None else offsets
        self.timestamps = [] if timestamps is None else timestamps
        self.keys = [] if keys is None else keys
        self.values = [] if values is None else values
        self.runs = [] if runs is None else runs

    @classmethod
    def of(cls, keys, values, headers=(), timestamp=None, *, timestamps=None,
           runs=None) -> "Columns":
        """Records to produce: ``keys`` and ``values`` (lists of bytes or None, same length),
        every record carrying ``headers`` (``[(str, bytes|None)]``) unless ``runs`` gives
        ``(start, stop, headers)`` runs; ``timestamp`` (ms, one for all; None: the send time) or
        ``timestamps`` (one per record). Costs nothing per record."""
        n = len(keys)
        if len(values) != n:
            raise WireError(f"Columns.of: {n} keys but {len(values)} values")
        if runs is None:
            runs = [(0, n, tuple(headers))] if n and headers else []
        if timestamps is None:
            timestamps = timestamp
        elif len(timestamps) != n:
            raise WireError(f"Columns.of: {n} keys but {len(timestamps)} timestamps")
        c = cls(None, None, keys, values, runs)
        c.timestamps = timestamps
        return c

    def __len__(self) -> int:
        return len(self.keys)

    def headers(self) -> list:
        """The headers of every record (one list entry per record)."""
        out: list = []
        for s, e, h in self.runs:
            out.extend((h,) * (e - s))
        if not self.runs:
            out = [()] * len(self.keys)
        return out

    def tuples(self):
        """``(offset, timestamp, key, value, headers)`` per record, as ``decode_rows`` gives."""
        return zip(self.offsets, self.timestamps, self.keys, self.values, self.headers())

    def extend(self, other: "Columns") -> None:
        """Append ``other``'s records (timestamps: both one per record, or the same one)."""
        n = len(self.keys)
        ta, tb = self.timestamps, other.timestamps
        if isinstance(ta, list) and isinstance(tb, list) and len(ta) == n and len(tb) == len(other.keys):
            ta.extend(tb)
        elif not (n == 0 and not other.keys) and ta != tb:
            if n == 0 and isinstance(ta, list) and not ta:
                self.timestamps = tb if not isinstance(tb, list) else list(tb)
            elif not other.keys:
                pass
            else:
                raise WireError("Columns.extend: give both one timestamp per record, or the same one")
        self.offsets.extend(other.offsets)
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
        ts = self.timestamps
        return Columns(self.offsets[i:j], ts[i:j] if isinstance(ts, (list, np.ndarray)) else ts,
                       self.keys[i:j], self.values[i:j], runs)

    @classmethod
    def from_tuples(cls, records) -> "Columns":
        """From ``(offset, timestamp, key, value, headers)`` tuples."""
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


# -- decoding --------------------------------------------------------------------------------

def _run_headers(raw: bytes) -> tuple:
    """Decode a header section (count varint first); checks it is consumed exactly."""
    h = _RUN_CACHE.get(raw)
    if h is None:
        hc, pos = read_varint(raw, 0)
        body = raw[pos:]
        h = decode_headers(body, hc) if hc else ()
        if encode_headers(h) != raw:
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
    h0 = _run_headers(ref)
    odd = _odd_sections(a, buf, ve, rend, hs, he, n, ref)
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


def _blobs(a, buf, starts, ends, lens) -> list:
    """``buf[s:e]`` for each pair. Items of one length (ids, account numbers, 8-byte counts) are
    gathered with numpy as fixed-width strings, three times faster than slicing one at a time;
    numpy drops the trailing NUL bytes of such a string, so the few that end in one are sliced."""
    n = len(lens)
    L = int(lens[0]) if n else 0
    if n > 64 and 0 < L <= 64 and (lens == L).all():
        out = np.ascontiguousarray(_rows(a, L)[starts]).view(f"S{L}").ravel().tolist()
        for i in np.flatnonzero(a[ends - 1] == 0).tolist():
            out[i] = buf[int(starts[i]):int(ends[i])]
        return out
    return [buf[i:j] for i, j in zip(starts.tolist(), ends.tolist())]


def _rows(a, L: int):
    """Every window of ``L`` bytes of ``a`` as a read-only (len(a) - L + 1, L) view."""
    return as_strided(a, shape=(len(a) - L + 1, L), strides=(a.strides[0], a.strides[0]),
                      writeable=False)


def _odd_sections(a, buf, ve, rend, hs, he, n, ref) -> list:
    """Indexes of the records whose header section (``[ve, rend)``) differs from ``ref``."""
    L = len(ref)
    if L <= 256:
        fits = (rend - ve) == L
        rows = np.ascontiguousarray(_rows(a, L)[np.where(fits, ve, ve[0])])
        same = (rows.view(f"V{L}").ravel() == np.frombuffer(ref, f"V{L}")[0]) & fits
        return np.flatnonzero(~same).tolist()
    return [i for i in range(n) if buf[hs[i]:he[i]] != ref]


def decode_batch_columns(raw, min_offset: int = 0, values_kept: bytes | None = None):
    """Decode one v2 record batch into :class:`Columns` (records below ``min_offset`` skipped);
    None for a control batch. The same records as ``decode_rows``, except with ``values_kept``
    (first bytes, e.g. those a JSON ``null`` can begin with): then only the values that begin
    with one of them are cut out; a null value stays None, every other value is
    :data:`NOT_READ` (a count needs to know only which values are null)."""
    (base_offset, _length, _epoch, _magic, _crc, attrs, _lod, first_ts, max_ts, _pid, _pe, _bs,
     count) = B.HEADER.unpack_from(raw, 0)
    if attrs & B.ATTR_CONTROL:
        return None
    if count < COLUMNAR_MIN:
        out: list = []
        decode_rows(raw, out, min_offset)
        return Columns.from_tuples(out)
    buf, pos = records_bytes(raw, attrs)
    try:
        cols = _columns(buf, pos, count, base_offset, first_ts, max_ts,
                        attrs & B.ATTR_TIMESTAMP_TYPE, min_offset, values_kept)
    except (IndexError, ValueError):
        cols = None
    if cols is None:  # malformed or unusual (offsets not increasing): the loop says what it finds
        out = []
        decode_rows(raw, out, min_offset)
        return Columns.from_tuples(out)
    return cols


def record_starts(buf, pos: int, count: int, end: int | None = None) -> list | None:
    """Where each of ``count`` records starting at ``pos`` begins (each begins with its length),
    or None when they do not end exactly at ``end`` (default: the end of ``buf``). The one
    sequential step; a negative length is misread here, so callers check the lengths again."""
    starts = []
    add = starts.append
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
                n, pos = read_varint(buf, pos)
                pos += n
    return starts if pos == (len(buf) if end is None else end) else None


class Fields:
    """Positions and values of every record's fields, from :func:`record_fields`."""

    __slots__ = ("rlen", "rend", "lenw", "tsd", "tsdw", "od", "odw", "klen", "ks", "ke", "vlen",
                 "vs", "ve")


def record_fields(a, S, varint_bytes: int = 10) -> Fields:
    """Decode the fields of the records starting at ``S`` (int64 array) of the uint8 array ``a``
    with numpy; lengths and deltas may take up to ``varint_bytes`` bytes (ValueError past that,
    IndexError past the array)."""
    f = Fields()
    f.rlen, f.lenw = read_varints(a, S, varint_bytes)
    f.rend = S + f.lenw + f.rlen
    p = S + f.lenw + 1                      # after the attributes byte
    f.tsd, f.tsdw = read_varints(a, p)      # a varlong: up to 10 bytes
    p = p + f.tsdw
    f.od, f.odw = read_varints(a, p)
    p = p + f.odw
    f.klen, w = read_varints(a, p, varint_bytes)
    f.ks = p + w
    f.ke = f.ks + np.maximum(f.klen, 0)
    f.vlen, w = read_varints(a, f.ke, varint_bytes)
    f.vs = f.ke + w
    f.ve = f.vs + np.maximum(f.vlen, 0)     # the header section: [ve, rend)
    return f


def _kept(a, buf, vs, ve, vlen, values_kept: bytes) -> list:
    """The value column without most values: None (null), the bytes of a value that begins with
    one of ``values_kept``, else NOT_READ; found in numpy, only those few are sliced."""
    out = np.full(len(vlen), NOT_READ, dtype=object)
    out[vlen < 0] = None
    if values_kept:
        first = a[np.minimum(vs, len(a) - 1)]
        cut = (vlen > 0) & np.isin(first, np.frombuffer(values_kept, np.uint8))
        for i in np.flatnonzero(cut).tolist():
            out[i] = buf[int(vs[i]):int(ve[i])]
    return out.tolist()


def _columns(buf: bytes, pos: int, count: int, base_offset: int, first_ts: int, max_ts: int,
             log_append: int, min_offset: int, values_kept: bytes | None = None):
    starts = record_starts(buf, pos, count)
    if starts is None:
        return None
    a = np.frombuffer(buf, np.uint8)
    S = np.array(starts, np.int64)
    f = record_fields(a, S)
    rend, ve = f.rend, f.ve
    if (ve >= rend).any() or (f.rlen < 0).any():
        return None
    ks, ke, vs, klen, vlen, tsd = f.ks, f.ke, f.vs, f.klen, f.vlen, f.tsd
    offs = f.od + base_offset
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
    keys = _blobs(a, buf, ks, ke, klen)
    if klen.min() < 0:
        for i in np.flatnonzero(klen < 0).tolist():
            keys[i] = None
    if values_kept is not None:
        values = _kept(a, buf, vs, ve, vlen, values_kept)
    else:
        values = _blobs(a, buf, vs, ve, vlen)
        if vlen.min() < 0:
            for i in np.flatnonzero(vlen < 0).tolist():
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


def decode_columns(batches, min_offset: int, end: int | None = None,
                   values_kept: bytes | None = None) -> Columns:
    """The records of several batches (``[offset, end)``) as one :class:`Columns`
    (``values_kept``: as for :func:`decode_batch_columns`)."""
    cols = Columns()
    for raw in batches:
        c = decode_batch_columns(raw, min_offset, values_kept)
        if c is not None and c.offsets:
            cols.extend(c)
    if end is not None and cols.offsets and cols.offsets[-1] >= end:
        cols = cols.slice(0, bisect.bisect_left(cols.offsets, end))
    return cols


# -- encoding --------------------------------------------------------------------------------

def _scatter(out, dest_starts, lengths, src) -> None:
    """Copy the segments of ``src`` (one after the other, ``lengths`` bytes each) to
    ``out[dest_starts[i]:]``."""
    total = int(lengths.sum())
    if total == 0:
        return
    shift = np.repeat(dest_starts - (np.cumsum(lengths) - lengths), lengths)
    shift += np.arange(total, dtype=np.int64)
    out[shift] = src[:total]


def flat(blobs) -> tuple:
    """(uint8 buffer of the non-null ``blobs`` end to end, int64 lengths with -1 for None),
    without a Python loop per item."""
    n = len(blobs)
    try:  # no None (the common case): join and len refuse one, so nothing scans for it first
        data = b"".join(blobs)
        lens = np.fromiter(map(len, blobs), np.int64, n)
    except TypeError:
        arr = np.empty(n, object)
        arr[:] = blobs
        null = arr == None  # noqa: E711 - element-wise
        arr[null] = b""
        lens = np.fromiter(map(len, arr), np.int64, n)
        lens[null] = -1
        data = b"".join(arr.tolist())
    return np.frombuffer(data, np.uint8), lens


def _header_sections(runs, n: int):
    """(flat uint8 buffer of every record's header section, int64 lengths): from runs."""
    if not runs or all(not h for _s, _e, h in runs):
        return None, None
    covered = 0
    parts = []
    lens = np.empty(n, np.int64)
    for s, e, h in runs:
        if s != covered or e < s:
            raise WireError(f"header runs must cover the records in order: ({s}, {e}) after {covered}")
        hb = encode_headers(list(h))
        parts.append(hb * (e - s))
        lens[s:e] = len(hb)
        covered = e
    if covered != n:
        raise WireError(f"header runs cover {covered} of {n} records")
    return np.frombuffer(b"".join(parts), np.uint8), lens


def encode_flat(kbuf, klen, vbuf, vlen, timestamps, *, hbuf=None, hlen=None,
                batch_bytes: int = 900_000, producer=None, codec: int = 0) -> list:
    """Encode records given column-wise into ``[(v2 record batch bytes, record count)]``:
    ``kbuf``/``vbuf`` are uint8 arrays of the keys/values end to end, ``klen``/``vlen`` their
    lengths (-1: null); ``timestamps`` one int for all or an int64 array; ``hbuf``/``hlen`` the
    records' header sections (count included) end to end, or None for no headers. Batches hold at
    most ~``batch_bytes`` (at least one record); ``producer`` as for ``close_batch``; ``codec``
    compresses each batch's records."""
    klen = np.asarray(klen, np.int64)
    vlen = np.asarray(vlen, np.int64)
    kbuf = np.asarray(kbuf, np.uint8)
    vbuf = np.asarray(vbuf, np.uint8)
    n = len(klen)
    if n == 0:
        return []
    per_record_ts = not isinstance(timestamps, (int, np.integer))
    ts = np.asarray(timestamps, np.int64) if per_record_ts else int(timestamps)
    kl = np.maximum(klen, 0)
    vl = np.maximum(vlen, 0)
    kstart = np.cumsum(kl) - kl
    vstart = np.cumsum(vl) - vl
    zk = zigzag_array(klen)
    zv = zigzag_array(vlen)
    ksz = varint_sizes(zk)
    vsz = varint_sizes(zv)
    if hlen is None:
        hl = np.ones(n, np.int64)           # the header count 0
        hstart = None
    else:
        hl = np.asarray(hlen, np.int64)
        hstart = np.cumsum(hl) - hl
    fixed = 1 + ksz + kl + vsz + vl + hl    # attributes + key + value + header section
    if per_record_ts:
        # worst case per record: the timestamp delta against any first timestamp of its batch
        spread = int(ts.max()) - int(ts.min())
        tsw = int(varint_sizes(zigzag_array(np.array([spread, -spread], np.int64))).max())
    else:
        tsw = 1
    odw = int(varint_sizes(zigzag_array(np.array([n], np.int64)))[0])
    lw = int(varint_sizes(zigzag_array(np.array([int(fixed.max()) + tsw + odw], np.int64)))[0])
    cum = np.cumsum(fixed + (tsw + odw + lw))
    out = []
    s = 0
    while s < n:
        before = int(cum[s - 1]) if s else 0
        e = int(np.searchsorted(cum, before + batch_bytes - B.HEADER_SIZE, side="right"))
        e = max(e, s + 1)
        sl = slice(s, e)
        out.append(_encode_one(kbuf, vbuf, hbuf, kl[sl], vl[sl], hl[sl], kstart[sl], vstart[sl],
                               None if hstart is None else hstart[sl], zk[sl], zv[sl], ksz[sl],
                               vsz[sl], fixed[sl], ts[sl] if per_record_ts else ts, producer,
                               codec))
        s = e
    return out


def _encode_one(kbuf, vbuf, hbuf, kl, vl, hl, kstart, vstart, hstart, zk, zv, ksz, vsz, fixed,
                ts, producer, codec) -> tuple:
    c = len(kl)
    if isinstance(ts, int):
        first = max_ts = ts
        zt = None
        tsz = np.ones(c, np.int64)
    else:
        first, max_ts = int(ts[0]), int(ts.max())
        zt = zigzag_array(ts - first)
        tsz = varint_sizes(zt)
    zo = zigzag_array(np.arange(c, dtype=np.int64))
    osz = varint_sizes(zo)
    body = fixed + tsz + osz
    zb = zigzag_array(body)
    bsz = varint_sizes(zb)
    rec = bsz + body
    pos = np.cumsum(rec) - rec
    buf = np.zeros(int(rec.sum()), np.uint8)
    put_varints(buf, pos, zb, bsz)
    p = pos + bsz + 1                 # attributes 0 (zero already)
    if zt is not None:
        put_varints(buf, p, zt, tsz)  # else timestamp delta 0 (zero already)
    p = p + tsz
    put_varints(buf, p, zo, osz)
    p = p + osz
    put_varints(buf, p, zk, ksz)
    p = p + ksz
    pk = p
    p = p + kl
    put_varints(buf, p, zv, vsz)
    pv = p + vsz
    # keys, values and header sections: one scatter of their bytes (each kind end to end)
    kseg = kbuf[kstart[0]:kstart[-1] + kl[-1]]
    vseg = vbuf[vstart[0]:vstart[-1] + vl[-1]]
    if hbuf is None:  # the header count 0 is there already (zeros)
        _scatter(buf, np.concatenate((pk, pv)), np.concatenate((kl, vl)),
                 np.concatenate((kseg, vseg)))
    else:
        hseg = hbuf[hstart[0]:hstart[-1] + hl[-1]]
        _scatter(buf, np.concatenate((pk, pv, pv + vl)), np.concatenate((kl, vl, hl)),
                 np.concatenate((kseg, vseg, hseg)))
    data = buf.tobytes()
    attrs = codec
    if codec:
        data = compress(codec, data)
    if producer is None:
        pid, epoch, seq = -1, -1, -1
    else:
        pid, epoch, seq = producer[0], producer[1], producer[2]
        attrs |= B.ATTR_TRANSACTIONAL if len(producer) < 4 or producer[3] else 0
        producer[2] = (seq + c) % (1 << 31)
    return B.build(data, c, first_timestamp=first, max_timestamp=max_ts, attributes=attrs,
                   producer_id=pid, producer_epoch=epoch, base_sequence=seq), c


def encode_columns(cols: Columns, *, batch_bytes: int = 900_000, timestamp: int | None = None,
                   producer=None, codec: int = 0) -> list:
    """:class:`Columns` (``keys``, ``values``, ``timestamps``, ``runs``) encoded into
    ``[(v2 record batch bytes, record count)]`` column-wise. Timestamps: ``cols.timestamps`` when
    it is one int or one per record, else ``timestamp``, else now."""
    n = len(cols.keys)
    if n == 0:
        return []
    kbuf, klen = flat(cols.keys)
    vbuf, vlen = flat(cols.values)
    ts = cols.timestamps
    if ts is None or (not isinstance(ts, (int, np.integer)) and len(ts) == 0):
        ts = int(time.time() * 1000) if timestamp is None else int(timestamp)
    elif not isinstance(ts, (int, np.integer)):
        if len(ts) != n:
            raise WireError(f"{n} records but {len(ts)} timestamps")
        ts = np.asarray(ts, np.int64)
    hbuf, hlen = _header_sections(cols.runs, n)
    return encode_flat(kbuf, klen, vbuf, vlen, ts, hbuf=hbuf, hlen=hlen, batch_bytes=batch_bytes,
                       producer=producer, codec=codec)


def encode_batches_flat(kbuf, klen, vbuf, vlen, ts: int, batch_bytes: int = 900_000) -> list:
    """:func:`encode_flat` without headers and one timestamp: ``[(batch bytes, count)]`` (the
    data generator's fast path)."""
    return encode_flat(kbuf, klen, vbuf, vlen, int(ts), batch_bytes=batch_bytes)
