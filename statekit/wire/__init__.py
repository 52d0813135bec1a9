"""The one codec of Kafka v2 record batches in statekit: the broker (produce validation, log,
cleaner), the client (fetch decoding, produce encoding) and the Spark sink all read and write
batches through this package, and nothing else in statekit parses record bytes.

* :mod:`.varint` - zigzag varints and varlongs, scalar and numpy-vectorised;
* :mod:`.compression` - codec ids, ``decompress`` (bounded: 64 MiB), ``compress``;
* :mod:`.batch` - the batch header, CRC32C, building batches, control batches (markers);
* :mod:`.records` - records one at a time: decode to tuples, encode tuples, header sections;
* :mod:`.columns` - records column-wise: :class:`Columns`, numpy decode and encode;
* :mod:`.validate` - the broker's LogValidator rules, record by record and column-wise.

It depends on numpy, crc32c and zstandard only (no kafka-python).
"""
from __future__ import annotations

from .batch import (BatchHeader, build as build_batch, control_batch, control_type, header_at,
                    scan, split_batches)
from .columns import (NOT_READ, Columns, decode_batch_columns, decode_columns,
                      encode_batches_flat, encode_columns, encode_flat)
from .compression import MAX_DECOMPRESSED, compress, decompress
from .errors import CodecUnavailable, InvalidBatch, WireError
from .records import (committed_only, decode_headers, decode_rows, encode_batches, encode_headers,
                      encode_record)
from .validate import check_records, records_valid, validate_produce, walk_records
from .varint import read_varint, write_varint


def decode_batch(raw, out: list, min_offset: int = 0) -> None:
    """Decode one v2 record batch (``raw``: its bytes, starting at the base offset) into ``out``
    as ``(offset, timestamp, key, value, headers)`` tuples; ``headers`` is ``()`` or a tuple of
    ``(str, bytes|None)``. Records below ``min_offset`` and control batches are skipped. Large
    batches go through :func:`decode_batch_columns`, small ones through :func:`decode_rows`;
    both give the same tuples."""
    cols = decode_batch_columns(raw, min_offset)
    if cols is not None and cols.offsets:
        out.extend(cols.tuples())


__all__ = [
    "BatchHeader", "CodecUnavailable", "Columns", "InvalidBatch", "MAX_DECOMPRESSED", "NOT_READ",
    "WireError",
    "build_batch", "check_records", "committed_only", "compress", "control_batch", "control_type",
    "decode_batch", "decode_batch_columns", "decode_columns", "decode_headers", "decode_rows",
    "decompress", "encode_batches", "encode_batches_flat", "encode_columns", "encode_flat",
    "encode_headers", "encode_record", "header_at", "read_varint", "records_valid", "scan",
    "split_batches", "validate_produce", "walk_records", "write_varint",
]
