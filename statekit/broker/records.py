"""The broker's view of record batches: all of it is :mod:`statekit.wire` (one codec for the
broker, its cleaner, the client and the sink). The broker stores a producer's batches as bytes,
reads only their 61-byte headers (offsets, counts, timestamps, producer id/sequence), patches the
base offset (outside the CRC) and validates produce payloads with :mod:`statekit.wire.validate`.
"""
from __future__ import annotations

from statekit.wire.batch import (  # noqa: F401 - the names the broker's modules use
    ATTR_COMPRESSION_MASK, ATTR_CONTROL, ATTR_DELETE_HORIZON, ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL, ATTRIBUTES_OFFSET, CONTROL_ABORT, CONTROL_COMMIT, CRC_OFFSET, FAST_CRC,
    HEADER, HEADER_SIZE, LOG_OVERHEAD, MAGIC_OFFSET, MAX_TS_OFFSET, BatchHeader, _invalid,
    control_batch, control_type, crc32c, header_at, recompute_crc, scan, set_base_offset,
    set_log_append_time,
)
from statekit.wire.compression import MAX_DECOMPRESSED, decompress  # noqa: F401
from statekit.wire.errors import InvalidBatch  # noqa: F401
from statekit.wire.validate import check_records, validate_produce, walk_records  # noqa: F401
