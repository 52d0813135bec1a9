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
  ``isolation="read_committed"`` reads up to the last stable offset and drops aborted transactions.
* ``send()`` writes with ``acks=all`` and waits for every acknowledgement; ``send_many()`` does
  several sends with every request in flight at once (a task commit: one round trip for all of its
  stores' changelogs); ``offsets_many()`` gets (log start, end) of several topics in one round trip.
* ``transactional_producer()`` gives a :class:`TransactionalProducer`: Kafka transactions for
  exactly-once output (one transaction per task and micro-batch).
* Security for real clusters (SASL PLAIN/SCRAM, TLS) comes from ``kafka_config=`` and the
  ``STATEKIT_KAFKA_CONFIG`` environment variable (:func:`load_kafka_config`); for statekit's own
  broker started with ``auth=True`` the credentials are found from the bootstrap address.

A ``Kafka`` object is not thread-safe: give each thread its own (standby replicas do).
"""
from __future__ import annotations

import bisect
import json
import os
import re
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as _np
from numpy.lib.stride_tricks import sliding_window_view as _window

import kafka.errors as kerrors
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.producer import (AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest,
                                     ProduceRequest)
from kafka.protocol.admin import (CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest,
                                  DescribeConfigsRequest)
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from kafka.record.memory_records import MemoryRecords
from kafka.record.default_records import DefaultRecordBatch
from kafka import codec as kcodec

from statekit.errors import BrokerUnreachable, StatekitError, UnknownTopic

try:
    from crc32c import crc32c as _crc32c  # a declared dependency (C speed)
except ImportError:  # pragma: no cover - kafka-python's own (pure Python unless crc32c is there)
    from kafka.record.util import calc_crc32c as _crc32c

__all__ = [
    "resolve_bootstrap", "load_kafka_config", "Kafka", "TransactionalProducer", "Chunk",
    "ColumnChunk", "Columns", "PendingSend", "KafkaError", "ProducerFenced", "BrokerUnreachable",
    "UnknownTopic",
]

_HINT = "start one with `statekit broker start` or set STATEKIT_BOOTSTRAP"
READ_UNCOMMITTED, READ_COMMITTED = "read_uncommitted", "read_committed"
_ISOLATION = {READ_UNCOMMITTED: 0, READ_COMMITTED: 1}
_TXN_VERIFICATION_FEATURE = "statekit.txn.verification"  # see statekit.broker.handlers


class KafkaError(StatekitError):
    """A broker answered with an error this layer does not handle itself."""


class ProducerFenced(KafkaError):
    """The transactional producer's epoch is no longer current: another producer with the same
    ``transactional.id`` started (a newer instance of the task), or the broker aborted the open
    transaction because it outlived its timeout. Its open transaction is aborted; this producer
    can do nothing more (a new one fences the other instance in turn)."""


def _isolation(isolation: str) -> int:
    try:
        return _ISOLATION[isolation]
    except KeyError:
        raise StatekitError(f"isolation must be {READ_UNCOMMITTED!r} or {READ_COMMITTED!r}, "
                            f"got {isolation!r}") from None


# --------------------------------------------------------------------------------------------
# configuration: bootstrap and security

_SECURITY_KEYS = {
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "sasl.jaas.config", "ssl.ca.location", "ssl.truststore.location", "ssl.truststore.type",
    "ssl.certificate.location", "ssl.keystore.location", "ssl.keystore.type", "ssl.key.location",
    "ssl.key.password", "ssl.keystore.password", "ssl.endpoint.identification.algorithm",
}
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_CONFIG_HINT = ("STATEKIT_KAFKA_CONFIG takes a JSON object, or the path of a .json or .properties "
                "file, of Kafka client settings (bootstrap.servers, security.protocol, sasl.mechanism, "
                "sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location, "
                "ssl.key.location, ...)")


def _parse_properties(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if m is None:
            raise StatekitError(f"cannot read the Kafka client setting {line!r}: write KEY=VALUE")
        out[m.group(1)] = m.group(2)
    return out


def _read_config_source(text: str, origin: str) -> dict:
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise StatekitError(f"{origin} is not valid JSON ({e}); {_CONFIG_HINT}") from None
    else:
        path = os.path.expanduser(text)
        try:
            with open(path) as f:
                body = f.read()
        except OSError as e:
            raise StatekitError(f"{origin}: cannot read {path} ({e.strerror}); {_CONFIG_HINT}") from None
        if path.endswith(".json") or body.lstrip().startswith("{"):
            try:
                doc = json.loads(body)
            except ValueError as e:
                raise StatekitError(f"{path} is not valid JSON ({e}); {_CONFIG_HINT}") from None
        else:
            doc = _parse_properties(body)
    if not isinstance(doc, dict):
        raise StatekitError(f"{origin} must be a JSON object of settings; {_CONFIG_HINT}")
    return {str(k): ("" if v is None else str(v)) for k, v in doc.items()}


def load_kafka_config(kafka_config: dict | str | None = None) -> dict:
    """Kafka client settings: ``STATEKIT_KAFKA_CONFIG`` (a JSON object, or the path of a .json /
    .properties file) overridden by ``kafka_config`` (a dict, or the same kinds of text). Keys are
    Kafka's (librdkafka's or Java's): ``bootstrap.servers``, ``security.protocol``,
    ``sasl.mechanism``, ``sasl.username``, ``sasl.password`` (or ``sasl.jaas.config``),
    ``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
    ``ssl.endpoint.identification.algorithm``. Other keys (producer or consumer tuning) are ignored;
    an unknown ``security.``/``sasl.``/``ssl.`` key or a bad value is an error."""
    cfg = _read_config_source(os.environ.get("STATEKIT_KAFKA_CONFIG", ""), "STATEKIT_KAFKA_CONFIG")
    if isinstance(kafka_config, str):
        cfg.update(_read_config_source(kafka_config, "kafka_config"))
    elif kafka_config:
        cfg.update({str(k): ("" if v is None else str(v)) for k, v in kafka_config.items()})
    for k in cfg:
        if k.split(".", 1)[0] in ("security", "sasl", "ssl") and k not in _SECURITY_KEYS:
            raise StatekitError(f"unknown Kafka client setting {k!r}: statekit understands "
                                f"{', '.join(sorted(_SECURITY_KEYS))}")
    _security(cfg)  # validate now: a bad setting fails here, in one line
    return cfg


@dataclass
class _Security:
    protocol: str
    mechanism: str | None
    username: str | None
    password: str | None
    ssl_context: ssl.SSLContext | None
    check_hostname: bool


def _security(cfg: dict) -> _Security | None:
    proto = (cfg.get("security.protocol") or "PLAINTEXT").upper()
    if proto not in _PROTOCOLS:
        raise StatekitError(f"security.protocol must be one of {', '.join(_PROTOCOLS)}, got {proto!r}")
    if proto == "PLAINTEXT":
        return None
    mech = user = password = None
    if proto.startswith("SASL"):
        mech = (cfg.get("sasl.mechanism") or cfg.get("sasl.mechanisms") or "PLAIN").upper()
        if mech not in _MECHANISMS:
            raise StatekitError(f"sasl.mechanism must be one of {', '.join(_MECHANISMS)}, got {mech!r}")
        user, password = cfg.get("sasl.username"), cfg.get("sasl.password")
        jaas = cfg.get("sasl.jaas.config")
        if jaas and not (user and password):
            u = re.search(r'username\s*=\s*"([^"]*)"', jaas)
            p = re.search(r'password\s*=\s*"([^"]*)"', jaas)
            user, password = (u.group(1) if u else None), (p.group(1) if p else None)
        if not user or password is None:
            raise StatekitError(f"security.protocol={proto} needs sasl.username and sasl.password "
                                f"(or sasl.jaas.config)")
    ctx = None
    check = True
    if proto.endswith("SSL"):
        for k in ("ssl.truststore.type", "ssl.keystore.type"):
            if cfg.get(k) and cfg[k].upper() != "PEM":
                raise StatekitError(f"{k}={cfg[k]}: statekit reads PEM files only; convert the store "
                                    f"with keytool/openssl and use ssl.ca.location / ssl.certificate.location")
        ca = cfg.get("ssl.ca.location") or cfg.get("ssl.truststore.location")
        cert = cfg.get("ssl.certificate.location") or cfg.get("ssl.keystore.location")
        key = cfg.get("ssl.key.location")
        try:
            ctx = ssl.create_default_context(cafile=ca or None)
            if cert:
                ctx.load_cert_chain(cert, key or None,
                                    password=cfg.get("ssl.key.password") or cfg.get("ssl.keystore.password") or None)
        except (OSError, ssl.SSLError) as e:
            raise StatekitError(f"cannot load the TLS files ({e}): check ssl.ca.location, "
                                f"ssl.certificate.location and ssl.key.location") from None
        check = (cfg.get("ssl.endpoint.identification.algorithm", "https") or "none").lower() == "https"
        ctx.check_hostname = check
    return _Security(proto, mech, user, password, ctx, check)


def resolve_bootstrap(bootstrap: str | None = None) -> str:
    """Explicit value, else ``STATEKIT_BOOTSTRAP``, else ``bootstrap.servers`` of
    ``STATEKIT_KAFKA_CONFIG``, else start (or reuse) the embedded broker in ``STATEKIT_HOME``
    (default ``~/.statekit``) ``/broker`` (with authentication when
    ``statekit.broker.should_auth()``: under JupyterHub, or STATEKIT_BROKER_AUTH=1)."""
    if bootstrap:
        return bootstrap
    env = os.environ.get("STATEKIT_BOOTSTRAP")
    if env:
        return env
    servers = load_kafka_config().get("bootstrap.servers")
    if servers:
        return servers
    home = os.environ.get("STATEKIT_HOME") or os.path.join(os.path.expanduser("~"), ".statekit")
    from statekit import broker as broker_mod  # local: the broker is optional for most callers

    handle = broker_mod.start(dir=os.path.join(home, "broker"), auth=broker_mod.should_auth())
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


_TRANSACTIONAL = 0x10


def _close_batch(recs: list, ts: int, producer=None) -> bytes:
    """``producer``: None, or [producer id, epoch, next sequence] of a transactional producer (the
    sequence advances by the batch's record count)."""
    body = b"".join(recs)
    n = len(recs)
    if producer is None:
        attrs, pid, epoch, seq = 0, -1, -1, -1
    else:
        attrs, (pid, epoch, seq) = _TRANSACTIONAL, producer
        producer[2] = (seq + n) % (1 << 31)
    hdr = bytearray(_BATCH_HDR.pack(0, _HDR_LEN - 12 + len(body), 0, 2, 0, attrs, n - 1, ts, ts,
                                    pid, epoch, seq, n))
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


def encode_batches(records: Iterable, headers, batch_bytes: int, ts: int, producer=None) -> list:
    """Encode ``(key, value)`` / ``(key, value, headers)`` records (one timestamp for all) into
    ``[(v2 record batch bytes, record count)]``; a new batch starts when the record would take the
    current one past ``batch_bytes`` (a batch holds at least one record). ``producer`` (a list
    ``[producer id, epoch, next sequence]``, advanced in place) makes transactional batches."""
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
            out.append((_close_batch(recs, ts, producer), len(recs)))
            recs = []
            size = _HDR_LEN
            r = _encode_record(0, key, value, hb)
        recs.append(r)
        size += len(r)
    if recs:
        out.append((_close_batch(recs, ts, producer), len(recs)))
    return out


def _committed_only(batches: list, aborted) -> list:
    """The batches of a read_committed Fetch answer minus those of aborted transactions (Kafka's
    consumer rule: a transactional batch of a producer with an aborted transaction that began at or
    before it is dropped until that producer's abort marker)."""
    if not aborted:
        return batches
    pending = sorted((a.first_offset, a.producer_id) for a in aborted)
    i = 0
    active: set = set()
    out = []
    for raw in batches:
        base, _l, _e, _m, _c, attrs, lod = _REC_HDR.unpack_from(raw, 0)[:7]
        pid = struct.unpack_from(">q", raw, 43)[0]
        while i < len(pending) and pending[i][0] <= base + lod:
            active.add(pending[i][1])
            i += 1
        if attrs & _CONTROL_MASK:
            if pid in active and len(raw) > _HDR_LEN:
                # the control record's key: (version, type); type 0 = abort
                try:
                    _n, p = _varint_slow(raw, _HDR_LEN)
                    p += 1
                    for _ in range(2):
                        _x, p = _varint_slow(raw, p)
                    klen, p = _varint_slow(raw, p)
                    if klen >= 4 and struct.unpack_from(">h", raw, p + 2)[0] == 0:
                        active.discard(pid)
                except (IndexError, struct.error):
                    pass
            continue
        if attrs & _TRANSACTIONAL and pid in active:
            continue
        out.append(raw)
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
    last_stable_offset: int = -1  # below it every transaction is decided (read_committed stops there)

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
    last_stable_offset: int = -1

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
    def __init__(self, host: str, port: int, timeout: float, client_id: str,
                 security: _Security | None = None):
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
        if security is not None and security.ssl_context is not None:
            try:
                self.sock = security.ssl_context.wrap_socket(self.sock, server_hostname=host)
            except (ssl.SSLError, OSError) as e:
                self.close()
                raise BrokerUnreachable(f"TLS handshake with Kafka at {self.addr} failed ({e}): check "
                                        f"security.protocol and the ssl.* settings") from None
        self.proto = KafkaProtocol(client_id=client_id, receive_message_max_bytes=256 << 20)
        self.ready: dict = {}  # correlation id -> decoded response not yet claimed
        self.versions: dict[int, tuple[int, int]] = {}
        self.features: set[str] = set()
        self.sasl = security is not None and security.mechanism is not None
        self._negotiate()
        if self.sasl:
            self._authenticate(security)

    def _negotiate(self):
        try:
            resp = self.request(ApiVersionsRequest(version=3, client_software_name="statekit",
                                                   client_software_version="1"))
            if resp.error_code:
                raise ValueError("ApiVersions v3 refused")
        except BrokerUnreachable:
            raise
        except Exception:  # noqa: BLE001 - an older broker: ask in v0, else assume the lowest versions
            try:
                resp = self.request(ApiVersionsRequest(version=0))
            except BrokerUnreachable:
                raise
            except Exception:  # noqa: BLE001
                return
        for k in resp.api_keys:
            self.versions[k.api_key] = (k.min_version, k.max_version)
        for f in getattr(resp, "supported_features", None) or []:
            self.features.add(f.name)

    def _authenticate(self, security: _Security) -> None:
        """SaslHandshake v1 + SaslAuthenticate, with kafka-python's SASL mechanisms."""
        from kafka.net.sasl import get_sasl_mechanism

        if SaslAuthenticateRequest.API_KEY not in self.versions:
            self.close()
            raise KafkaError(f"the broker at {self.addr} does not offer SASL authentication: check "
                             f"security.protocol (it may want PLAINTEXT or SSL)")
        resp = self.request(SaslHandshakeRequest(version=1, mechanism=security.mechanism))
        if resp.error_code:
            self.close()
            raise KafkaError(f"the broker at {self.addr} does not accept SASL mechanism {security.mechanism} "
                             f"(it offers {', '.join(resp.mechanisms or []) or 'none'}): set sasl.mechanism")
        mech = get_sasl_mechanism(security.mechanism)(
            host=self.addr.rsplit(":", 1)[0], sasl_mechanism=security.mechanism,
            sasl_plain_username=security.username, sasl_plain_password=security.password)
        v = self.version(SaslAuthenticateRequest, 0, 1)
        while not mech.is_done():
            resp = self.request(SaslAuthenticateRequest(version=v, auth_bytes=mech.auth_bytes()))
            if resp.error_code:
                self.close()
                raise KafkaError(f"the broker at {self.addr} refused the SASL credentials of "
                                 f"{security.username!r} ({resp.error_message or 'SASL_AUTHENTICATION_FAILED'}): "
                                 f"check sasl.username and sasl.password")
            try:
                mech.receive(resp.auth_bytes)
            except Exception as e:  # noqa: BLE001 - e.g. a SCRAM server signature that does not verify
                self.close()
                raise KafkaError(f"SASL {security.mechanism} with {self.addr} failed: {e}") from None
        if not mech.is_authenticated():
            self.close()
            raise KafkaError(f"SASL {security.mechanism} with {self.addr} did not authenticate "
                             f"{security.username!r}: check the credentials")

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
    if code == 58:
        raise KafkaError(f"{what}: the broker requires SASL authentication (SASL_AUTHENTICATION_FAILED): "
                         f"pass kafka_config= or set STATEKIT_KAFKA_CONFIG with security.protocol, "
                         f"sasl.mechanism, sasl.username and sasl.password (statekit's own broker, "
                         f"started with auth, has them in DIR/credentials.json)")
    if code in (47, 90):
        raise ProducerFenced(f"{what}: the producer was fenced ({kerrors.for_code(code).__name__}): "
                             f"a newer producer with the same transactional id took over, or the "
                             f"transaction outlived its timeout and the broker aborted it")
    err = kerrors.for_code(code)
    raise KafkaError(f"{what}: {err.__name__} (error code {code})")


_RETRIABLE = {5, 6, 7, 13, 14, 15, 19, 20, 21, 56, 74, 75, 103}


# --------------------------------------------------------------------------------------------


class Kafka:
    """A small synchronous Kafka client. See the module docstring."""

    def __init__(self, bootstrap: str | None = None, *, timeout: float = 30.0,
                 client_id: str = "statekit", fetch_max_bytes: int = 8 << 20,
                 kafka_config: dict | str | None = None):
        """``kafka_config``: Kafka client settings over those of ``STATEKIT_KAFKA_CONFIG`` (see
        :func:`load_kafka_config`); without security settings, a statekit broker started with
        ``auth=True`` at this bootstrap address is authenticated with its generated credentials."""
        cfg = load_kafka_config(kafka_config)
        if not bootstrap and kafka_config:  # an explicit bootstrap.servers beats the environment's
            explicit = _read_config_source(kafka_config, "kafka_config") if isinstance(kafka_config, str) \
                else kafka_config
            bootstrap = explicit.get("bootstrap.servers") or None
        self.bootstrap = resolve_bootstrap(bootstrap)
        if "security.protocol" not in cfg:
            from statekit.broker import credentials_for  # the embedded broker's, when it has auth

            cfg.update(credentials_for(self.bootstrap) or {})
        self._security = _security(cfg)
        self.timeout = timeout
        self.client_id = cfg.get("client.id") or client_id
        self.fetch_max_bytes = fetch_max_bytes
        self._boot_conn: _Conn | None = None
        self._conns: dict[int, _Conn] = {}
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._lock = threading.RLock()
        self._any()  # fail fast, one line, when nothing listens

    def _connect(self, host: str, port: int) -> _Conn:
        return _Conn(host, port, self.timeout, self.client_id, self._security)

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
                self._boot_conn = self._connect(host or "127.0.0.1", int(port))
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
            c = self._connect(host, port)
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
        if not resp.brokers or any(t.error_code == 58 for t in resp.topics):
            if self._security is None or self._security.mechanism is None:
                _raise_for(58, f"metadata from {conn.addr}")
            raise KafkaError(f"the broker at {conn.addr} answered metadata without any broker: check that "
                             f"{self.bootstrap} is a Kafka cluster")
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
    def _list_offsets(self, topic: str, timestamp: int, partitions=None, isolation_level: int = 0) -> dict[int, int]:
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
                v = conn.version(ListOffsetsRequest, 2 if isolation_level else 1, 7)
                T = ListOffsetsRequest.ListOffsetsTopic
                req = ListOffsetsRequest(
                    version=v, replica_id=-1, isolation_level=isolation_level,
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

    def end_offsets(self, topic: str, partitions=None, isolation: str = READ_UNCOMMITTED) -> dict[int, int]:
        """``{partition: offset of the next record to be written}`` (the high watermark), or with
        ``isolation="read_committed"`` the last stable offset (the first offset of the oldest open
        transaction, else the high watermark)."""
        return self._list_offsets(topic, -1, partitions, _isolation(isolation))

    def begin_offsets(self, topic: str, partitions=None) -> dict[int, int]:
        """``{partition: log start offset}``."""
        return self._list_offsets(topic, -2, partitions)

    def offsets_many(self, topics: Iterable[str], partition: int,
                     isolation: str = READ_UNCOMMITTED) -> dict[str, tuple[int, int]]:
        """``{topic: (log start offset, end offset)}`` of one partition of several topics, with
        every ListOffsets request in flight at once (one round trip instead of two per topic);
        ``isolation="read_committed"``: the end is the last stable offset."""
        level = _isolation(isolation)
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
                    v = conn.version(ListOffsetsRequest, 2 if level else 1, 7)
                    for stamp in (-2, -1):
                        req = ListOffsetsRequest(
                            version=v, replica_id=-1, isolation_level=level,
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

    def _produce_retrying(self, topic, partition, payloads, transactional_id=None) -> int:
        for attempt in range(20):
            try:
                return self._produce(topic, partition, payloads, transactional_id)
            except _Retry:
                self._forget(topic)
                time.sleep(min(0.05 * (attempt + 1), 0.5))
        raise KafkaError(f"could not write to {topic}[{partition}]: the partition kept "
                         f"answering with a retriable error")

    def _produce(self, topic, partition, payloads, transactional_id=None) -> int:
        return self._produce_collect(topic, partition, payloads,
                                     self._produce_send(topic, partition, payloads, transactional_id))

    def _produce_send(self, topic, partition, payloads, transactional_id=None) -> tuple:
        conn = self._leader(topic, partition)
        v = conn.version(ProduceRequest, 3, 12)
        T = ProduceRequest.TopicProduceData
        # pipeline: every batch in flight at once, then collect the acks in order
        cids = []
        for data, _n in payloads:
            cids.append(conn.send(ProduceRequest(
                version=v, transactional_id=transactional_id, acks=-1, timeout_ms=int(self.timeout * 1000),
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
    def _fetch_request(self, conn, topic, partition, offset, max_wait_ms, max_bytes, isolation_level=0):
        v = conn.version(FetchRequest, 4, 12)
        T = FetchRequest.FetchTopic
        return FetchRequest(
            version=v, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1,
            max_bytes=max_bytes, isolation_level=isolation_level, session_id=0, session_epoch=-1,
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
              max_bytes: int | None = None, isolation: str = READ_UNCOMMITTED, *,
              columns: bool = False) -> Chunk:
        """One Fetch at ``offset``; waits up to ``max_wait_ms`` for data. Moves past a log start
        offset that overtook ``offset``. ``isolation="read_committed"``: only committed records,
        up to the last stable offset. ``columns``: a :class:`ColumnChunk` instead."""
        max_bytes = max_bytes or self.fetch_max_bytes
        level = _isolation(isolation)
        with self._lock:
            for _attempt in range(10):
                conn = self._leader(topic, partition)
                cid = conn.send(self._fetch_request(conn, topic, partition, offset, max_wait_ms,
                                                    max_bytes, level))
                p = self._partition_data(conn.recv(cid), topic)
                if p.error_code == 1:  # OFFSET_OUT_OF_RANGE: the log start moved (or offset > end)
                    lso = self.begin_offsets(topic, [partition])[partition]
                    if offset < lso:
                        offset = lso
                        continue
                    hwm = self.end_offsets(topic, [partition])[partition]
                    if columns:
                        return ColumnChunk(Columns(), max(min(offset, hwm), lso), hwm, lso, hwm)
                    return Chunk([], max(min(offset, hwm), lso), hwm, lso, hwm)
                if p.error_code in _RETRIABLE:
                    self._forget(topic)
                    time.sleep(0.05)
                    continue
                _raise_for(p.error_code, f"cannot read {topic}[{partition}]", topic)
                batches, nxt = _scan_batches(p.records or b"")
                if level:
                    batches = _committed_only(batches, p.aborted_transactions)
                if columns:
                    return ColumnChunk(_decode_columns(batches, offset),
                                       nxt if nxt is not None and nxt > offset else offset,
                                       p.high_watermark, p.log_start_offset, p.last_stable_offset)
                out: list = []
                for raw in batches:
                    decode_batch(raw, out, offset)
                return Chunk(out, nxt if nxt is not None and nxt > offset else offset,
                             p.high_watermark, p.log_start_offset, p.last_stable_offset)
            raise KafkaError(f"could not read {topic}[{partition}]: no leader")

    def read(self, topic: str, partition: int, start: int | None = None, end: int | None = None,
             *, max_bytes: int | None = None, pipeline: bool = True,
             isolation: str = READ_UNCOMMITTED, columns: bool = False) -> Iterator[Chunk]:
        """Read ``[start, end)`` of one partition as an iterator of :class:`Chunk` (one per Fetch
        response). ``start`` None = the log start; ``end`` None = the end offset when called (the
        last stable offset for read_committed). Offsets may have gaps (compaction, control
        batches, aborted transactions); when the log start is past ``start`` the read begins
        there. Ends early if the log ends before ``end`` (e.g. it was truncated), or, reading
        committed, where an open transaction begins. ``isolation="read_committed"`` drops the
        records of aborted transactions (Kafka's read_committed consumer). ``columns``:
        :class:`ColumnChunk` s instead (no tuple per record; the restore path)."""
        max_bytes = max_bytes or self.fetch_max_bytes
        level = _isolation(isolation)
        with self._lock:
            if start is None or start < 0:
                start = self.begin_offsets(topic, [partition])[partition]
            if end is None:
                end = self.end_offsets(topic, [partition], isolation)[partition]
        pos = start
        if pos >= end:
            return
        state = {"conn": None, "inflight": None}
        try:
            yield from self._read_loop(topic, partition, pos, end, max_bytes, pipeline, state,
                                       level, columns)
        finally:
            if state["inflight"] is not None:  # abandoned mid-read: drain the answer nobody wants
                with self._lock:
                    try:
                        state["conn"].recv(state["inflight"])
                    except StatekitError:
                        pass

    def _read_loop(self, topic, partition, pos, end, max_bytes, pipeline, state, level=0,
                   columns=False):
        empty_rounds = 0
        conn = None
        while pos < end:
            with self._lock:
                if state["inflight"] is None:
                    conn = self._leader(topic, partition)
                    state["conn"] = conn
                    state["inflight"] = conn.send(self._fetch_request(conn, topic, partition, pos,
                                                                      0, max_bytes, level))
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
                if level:
                    batches = _committed_only(batches, p.aborted_transactions)
                hwm = p.high_watermark
                lso = p.log_start_offset
                stable = p.last_stable_offset if level else hwm
                if nxt is None or nxt <= pos:
                    if lso is not None and lso > pos:
                        pos = lso  # the log start moved past us
                        continue
                    if stable <= pos:
                        return  # the log ends (or an open transaction begins) before `end`
                    empty_rounds += 1
                    if empty_rounds > 100:
                        raise KafkaError(f"{topic}[{partition}] returned no records at offset "
                                         f"{pos} below its high watermark {hwm}")
                    time.sleep(0.01)
                    continue
                empty_rounds = 0
                start_pos = pos
                pos = nxt
                if pipeline and pos < end and pos < stable:
                    # the next Fetch goes out before we decode this one: the broker works while we do
                    state["inflight"] = conn.send(self._fetch_request(conn, topic, partition,
                                                                      pos, 0, max_bytes, level))
            if columns:
                yield ColumnChunk(_decode_columns(batches, start_pos, end), pos, hwm, lso,
                                  p.last_stable_offset)
                continue
            out: list = []
            for raw in batches:
                decode_batch(raw, out, start_pos)
            if out and out[-1][0] >= end:
                out = [r for r in out if r[0] < end]
            yield Chunk(out, pos, hwm, lso, p.last_stable_offset)

    # -- transactions ----------------------------------------------------------------------------
    def supports_transactions(self) -> bool:
        """Does the broker offer Kafka transactions (InitProducerId, AddPartitionsToTxn, EndTxn)?
        False for a broker without them (then statekit's output is at-least-once)."""
        with self._lock:
            versions = self._any().versions
            return all(k in versions for k in (InitProducerIdRequest.API_KEY, AddPartitionsToTxnRequest.API_KEY,
                                               EndTxnRequest.API_KEY))

    def transactional_producer(self, transactional_id: str, timeout_ms: int = 60000) -> "TransactionalProducer":
        """A :class:`TransactionalProducer` for ``transactional_id`` (InitProducerId: an older
        producer with the same id is fenced and its open transaction aborted)."""
        return TransactionalProducer(self, transactional_id, timeout_ms)

    def _coordinator(self, key: str, key_type: int) -> _Conn:
        """The connection to the coordinator of a group (0) or transactional id (1)."""
        conn = self._any()
        v = conn.version(FindCoordinatorRequest, 1, 4)
        for _attempt in range(50):
            if v >= 4:
                resp = conn.request(FindCoordinatorRequest(version=v, key_type=key_type, coordinator_keys=[key]))
                c = resp.coordinators[0]
                code, node, host, port = c.error_code, c.node_id, c.host, c.port
            else:
                resp = conn.request(FindCoordinatorRequest(version=v, key=key, key_type=key_type))
                code, node, host, port = resp.error_code, resp.node_id, resp.host, resp.port
            if code in (14, 15):  # loading, not available: retry
                time.sleep(0.05)
                continue
            if code == 53:
                raise KafkaError(f"the broker at {conn.addr} denies transactional id {key!r} "
                                 f"(TRANSACTIONAL_ID_AUTHORIZATION_FAILED): check its ACLs")
            _raise_for(code, f"cannot find the coordinator of {key!r}")
            self._brokers.setdefault(node, (host, port))
            return self._node(node)
        raise KafkaError(f"no coordinator for {key!r}: the broker kept answering COORDINATOR_NOT_AVAILABLE")

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

# --------------------------------------------------------------------------------------------
# transactions

_COORDINATOR_MOVED = {14, 15, 16}  # loading, not available, not coordinator: find it again, retry
_CONCURRENT = 51  # the previous transaction's markers are still being written: retry shortly


class TransactionalProducer:
    """Kafka transactions over :class:`Kafka`'s fast produce path: exactly-once output.

    ::

        txp = kafka.transactional_producer("wordcount-0_3", timeout_ms=60000)
        txp.begin()
        lasts = txp.send_many([(topic, partition, records), ...])   # as Kafka.send_many
        txp.commit()      # or txp.abort()
        txp.close()

    ``begin()`` is local. ``send_many()`` adds the partitions new to the transaction
    (AddPartitionsToTxn) and writes every batch, all requests in flight at once: one round trip
    against statekit's broker (which verifies transactional writes, so the AddPartitionsToTxn can
    be pipelined with the writes on the same connection); elsewhere the AddPartitionsToTxn is
    answered first (two round trips), so no batch can land in a partition the transaction does
    not hold. ``commit()`` is one EndTxn: against statekit's broker it returns once the commit
    markers are in every partition (read_committed readers see the records at once); a Kafka
    cluster answers once the commit is decided and writes the markers right after. A failed
    ``send_many`` leaves the transaction to ``abort()``. ``abort()`` also takes a new epoch
    (sequence numbers start again), so nothing of an uncertain write can be taken for a later one.
    ``ProducerFenced`` from any call: another producer with the same id took over (or the
    transaction outlived ``timeout_ms``); this producer is done.
    """

    def __init__(self, kafka: Kafka, transactional_id: str, timeout_ms: int = 60000):
        if not transactional_id:
            raise StatekitError("a transactional producer needs a non-empty transactional_id")
        self._k = kafka
        self.transactional_id = transactional_id
        self.timeout_ms = int(timeout_ms)
        self.producer_id = -1
        self.epoch = -1
        self._seq: dict[tuple[str, int], int] = {}
        self._added: set[tuple[str, int]] = set()
        self._asked = False  # an AddPartitionsToTxn went out in this transaction
        self._in_txn = False
        self._closed = False
        self._fenced: ProducerFenced | None = None
        self._coord: _Conn | None = None  # the transaction coordinator, found once
        with kafka._lock:
            self._init()

    def __repr__(self):
        return (f"TransactionalProducer({self.transactional_id!r}, producer_id={self.producer_id}, "
                f"epoch={self.epoch}, open={self._in_txn})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- coordinator requests ----------------------------------------------------------------------
    def _coordinator(self, refresh: bool = False) -> _Conn:
        c = self._coord
        if refresh or c is None or c.sock.fileno() < 0:
            c = self._coord = self._k._coordinator(self.transactional_id, 1)
        return c

    def _coord_request(self, make, what: str):
        """Send ``make(conn)`` to the transaction coordinator; retry while it moves or is busy."""
        delay = 0.005
        refresh = False
        for _attempt in range(200):
            conn = self._coordinator(refresh)
            try:
                resp = conn.request(make(conn))
            except BrokerUnreachable:
                if refresh:
                    raise
                refresh = True  # the connection went: find the coordinator again, once
                continue
            refresh = False
            code = _txn_code(resp)
            if code in _COORDINATOR_MOVED:
                refresh = True
                time.sleep(0.05)
                continue
            if code == _CONCURRENT:
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
                continue
            return resp, code
        raise KafkaError(f"{what} for transactional id {self.transactional_id!r}: the coordinator kept "
                         f"answering that it is busy or moving")

    def _init(self, bump: bool = False) -> None:
        def make(conn):
            v = conn.version(InitProducerIdRequest, 0, 4)
            expected = bump and v >= 3 and self.producer_id >= 0
            return InitProducerIdRequest(
                version=v, transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms,
                producer_id=self.producer_id if expected else -1, producer_epoch=self.epoch if expected else -1)

        resp, code = self._coord_request(make, "InitProducerId")
        if code == 50:
            raise KafkaError(f"the broker refuses transaction timeout {self.timeout_ms} ms "
                             f"(INVALID_TRANSACTION_TIMEOUT): use one at most its transaction.max.timeout.ms")
        if code == 53:
            raise KafkaError(f"the broker denies transactional id {self.transactional_id!r} "
                             f"(TRANSACTIONAL_ID_AUTHORIZATION_FAILED): it may not support transactions "
                             f"(check Kafka.supports_transactions()) or its ACLs forbid the id")
        self._check(code, "InitProducerId")
        self.producer_id, self.epoch = resp.producer_id, resp.producer_epoch
        self._seq.clear()

    def _check(self, code: int, what: str) -> None:
        if code in (47, 90):
            self._fenced = ProducerFenced(
                f"transactional id {self.transactional_id!r} (producer {self.producer_id}, epoch {self.epoch}) "
                f"was fenced at {what}: a newer producer with the same id took over, or the transaction "
                f"outlived its timeout of {self.timeout_ms} ms and the broker aborted it; this producer "
                f"can do nothing more")
            self._in_txn = False
            raise self._fenced
        _raise_for(code, f"{what} of transactional id {self.transactional_id!r}")

    def _usable(self) -> None:
        if self._fenced is not None:
            raise self._fenced
        if self._closed:
            raise StatekitError(f"the transactional producer {self.transactional_id!r} is closed")

    # -- the transaction ---------------------------------------------------------------------------
    def begin(self) -> None:
        """Start a transaction (nothing is sent until send_many)."""
        self._usable()
        if self._in_txn:
            raise StatekitError(f"transactional producer {self.transactional_id!r} already has an open "
                                f"transaction: commit() or abort() it first")
        self._in_txn = True
        self._added = set()
        self._asked = False

    def send_many(self, items: Iterable, batch_bytes: int = 900_000) -> list[int]:
        """Write ``[(topic, partition, records)]`` (records as for :meth:`Kafka.send`) in the open
        transaction; returns each item's last offset (-1 for an empty item)."""
        self._usable()
        if not self._in_txn:
            raise StatekitError("send_many() outside a transaction: call begin() first")
        k = self._k
        ts = int(time.time() * 1000)
        with k._lock:
            # encode first (sequences advance only once the batches are acknowledged)
            built = []
            for topic, partition, recs in items:
                tp = (topic, partition)
                prod = [self.producer_id, self.epoch, self._seq.get(tp, 0)]
                built.append((tp, encode_batches(recs, None, batch_bytes, ts, prod), prod[2]))
            for (topic, partition), payloads, _ in built:  # unknown topics fail before anything is sent
                if payloads:
                    k._leader(topic, partition)
            new = sorted({tp for tp, payloads, _ in built if payloads and tp not in self._added})
            coord = self._coordinator() if new else None
            add_cid = None
            if new:
                pipelined = _TXN_VERIFICATION_FEATURE in coord.features and all(
                    k._leader(t, p) is coord for t, p in new)
                req = self._add_request(coord, new)
                self._asked = True
                if pipelined:
                    add_cid = coord.send(req)
                else:
                    self._add_partitions(coord, new, req)
            out = [-1] * len(built)
            inflight = []
            for i, (tp, payloads, _) in enumerate(built):
                if payloads:
                    inflight.append((i, k._produce_send(tp[0], tp[1], payloads, self.transactional_id)))
            first_error = None
            if add_cid is not None:
                try:
                    self._add_result(coord.recv(add_cid), new)
                except StatekitError as e:  # keep collecting: no answer is left behind on the socket
                    first_error = e
            redo = []
            for i, sent in inflight:
                tp, payloads, _ = built[i]
                try:
                    out[i] = k._produce_collect(tp[0], tp[1], payloads, sent)
                except _Retry:
                    redo.append(i)
                except ProducerFenced as e:
                    first_error = first_error or e
                except KafkaError as e:
                    first_error = first_error or e
            if first_error is not None:
                if isinstance(first_error, ProducerFenced):
                    self._check(47, "produce")
                raise first_error
            for i in redo:  # the same batches again: the broker drops what it already has
                tp, payloads, _ = built[i]
                k._forget(tp[0])
                out[i] = k._produce_retrying(tp[0], tp[1], payloads, self.transactional_id)
            for tp, payloads, next_seq in built:
                if payloads:
                    self._seq[tp] = next_seq
        return out

    def _add_request(self, conn, parts):
        v = conn.version(AddPartitionsToTxnRequest, 0, 3)
        by_topic: dict[str, list[int]] = {}
        for t, p in parts:
            by_topic.setdefault(t, []).append(p)
        T = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        return AddPartitionsToTxnRequest(
            version=v, v3_and_below_transactional_id=self.transactional_id,
            v3_and_below_producer_id=self.producer_id, v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()])

    def _add_partitions(self, conn, parts, req) -> None:
        """AddPartitionsToTxn answered before any write (brokers that do not verify writes)."""
        delay = 0.005
        for _attempt in range(200):
            resp = conn.request(req)
            code = _add_code(resp)
            if code == _CONCURRENT or code in _COORDINATOR_MOVED:
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
                if code in _COORDINATOR_MOVED:
                    conn = self._coordinator(refresh=True)
                continue
            self._add_result(resp, parts)
            return
        raise KafkaError(f"AddPartitionsToTxn of {self.transactional_id!r}: the coordinator stayed busy")

    def _add_result(self, resp, parts) -> None:
        code = _add_code(resp)
        self._check(code, "AddPartitionsToTxn")
        self._added.update(parts)

    def commit(self) -> None:
        """Commit the open transaction (EndTxn): its records become visible to read_committed
        readers, all at once."""
        self._end(True)

    def abort(self) -> None:
        """Abort the open transaction: its records are never visible to read_committed readers."""
        self._end(False)

    def _end(self, commit: bool, renew: bool = True) -> None:
        self._usable()
        if not self._in_txn:
            raise StatekitError(f"{'commit' if commit else 'abort'}() without an open transaction: "
                                f"call begin() first")
        what = "EndTxn(commit)" if commit else "EndTxn(abort)"
        with self._k._lock:
            if self._added or (self._asked and not commit):
                def make(conn):
                    return EndTxnRequest(version=conn.version(EndTxnRequest, 0, 3),
                                         transactional_id=self.transactional_id, producer_id=self.producer_id,
                                         producer_epoch=self.epoch, committed=commit)

                _resp, code = self._coord_request(make, what)
                if not (code == 48 and not commit and not self._added):  # nothing was added: nothing to abort
                    self._check(code, what)
            self._in_txn = False
            self._added = set()
            self._asked = False
            if not commit and renew:
                self._init(bump=True)

    def close(self) -> None:
        """Abort an open transaction (best effort) and stop using the producer."""
        if self._closed:
            return
        try:
            if self._in_txn and self._fenced is None:
                self._end(False, renew=False)
        except StatekitError:
            pass
        finally:
            self._closed = True


def _txn_code(resp) -> int:
    code = getattr(resp, "error_code", 0)
    if code == 0 and hasattr(resp, "results_by_topic_v3_and_below"):
        return _add_code(resp)
    return code


def _add_code(resp) -> int:
    """The error of an AddPartitionsToTxn answer (the first partition error that matters)."""
    codes = [p.partition_error_code for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition]
    for c in codes:
        if c not in (0, 55):  # OPERATION_NOT_ATTEMPTED only says another partition failed
            return c
    return 0
