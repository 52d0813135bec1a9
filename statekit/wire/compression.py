"""The compression codecs of a record batch's records section (attributes bits 0-2): ids, one
``decompress`` with a bound against compression bombs, and ``compress`` for the codecs this
interpreter has. gzip (zlib) and zstd (zstandard) are dependencies; snappy and lz4 work when
their libraries (``python-snappy`` or ``cramjam``; ``lz4``) are installed, else
:class:`CodecUnavailable`."""
from __future__ import annotations

import io
import struct
import zlib

from .errors import CodecUnavailable, InvalidBatch

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
CODEC_MASK = 0x07
MAX_DECOMPRESSED = 64 << 20  # a batch inflating past this is refused (compression bombs)
_XERIAL = b"\x82SNAPPY\x00"


def _snappy():
    try:
        import snappy

        return snappy.decompress, snappy.compress
    except ImportError:
        pass
    try:
        import cramjam

        return (lambda b: bytes(cramjam.snappy.decompress_raw(b)),
                lambda b: bytes(cramjam.snappy.compress_raw(b)))
    except ImportError:
        raise CodecUnavailable("snappy-compressed records need python-snappy or cramjam "
                               "(pip install cramjam)") from None


def _lz4():
    try:
        import lz4.frame as f
    except ImportError:
        raise CodecUnavailable("lz4-compressed records need the lz4 package (pip install lz4)") from None
    return f


def available(codec: int) -> bool:
    """Can this interpreter decompress and compress ``codec``?"""
    try:
        if codec == SNAPPY:
            _snappy()
        elif codec == LZ4:
            _lz4()
        return codec in NAMES
    except CodecUnavailable:
        return False


def decompress(codec: int, data, limit: int = MAX_DECOMPRESSED) -> bytes:
    """The records bytes of a batch compressed with ``codec``, at most ``limit`` bytes.
    InvalidBatch: an unknown codec, bytes that do not decompress, or more than ``limit``;
    CodecUnavailable: no library for the codec here."""
    if codec not in NAMES or codec == NONE:
        raise InvalidBatch(f"unknown compression codec {codec} in a record batch")
    data = bytes(data)
    if codec == SNAPPY:
        dec, _ = _snappy()
    elif codec == LZ4:
        frame = _lz4()
    try:
        if codec == GZIP:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = d.decompress(data, limit + 1)
        elif codec == ZSTD:
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as r:
                out = r.read(limit + 1)
        elif codec == SNAPPY:
            if data.startswith(_XERIAL):  # the Java client's framing: 16-byte header, sized blocks
                parts, pos, total = [], 16, 0
                while pos < len(data):
                    (n,) = struct.unpack_from(">i", data, pos)
                    pos += 4
                    parts.append(dec(data[pos:pos + n]))
                    total += len(parts[-1])
                    pos += n
                    if total > limit:
                        break
                out = b"".join(parts)
            else:
                out = dec(data)
        else:
            out = frame.decompress(data)
    except Exception as e:  # noqa: BLE001 - any codec failure is a corrupt batch
        raise InvalidBatch(f"the compressed records do not decompress ({type(e).__name__})") from None
    if len(out) > limit:
        raise InvalidBatch(f"the compressed records inflate past {limit >> 20} MiB")
    return out


def compress(codec: int, data: bytes) -> bytes:
    """``data`` compressed with ``codec`` as Kafka clients write it (gzip stream, raw snappy,
    lz4 frame, zstd frame)."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return c.compress(data) + c.flush()
    if codec == ZSTD:
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    if codec == SNAPPY:
        return _snappy()[1](data)
    if codec == LZ4:
        return _lz4().compress(data)
    raise InvalidBatch(f"unknown compression codec {codec}")
