"""What the client sends: one item's records, tuples or columns, as v2 record batches (both kinds
are encoded by :mod:`statekit.wire`)."""
from __future__ import annotations

from statekit.wire.columns import Columns, encode_columns
from statekit.wire.records import encode_batches


def encode_records(records, batch_bytes: int, ts: int, producer=None, headers=None) -> list:
    """``[(batch bytes, record count)]`` of ``records``: a :class:`Columns` (keys, values,
    optional timestamps, header runs; encoded column-wise, no Python loop per record) or an
    iterable of ``(key, value[, headers])`` tuples (``headers`` for the records that carry none).
    ``ts``: the timestamp of records without their own. ``producer``: ``[producer id, epoch, next
    sequence]`` of a transactional producer, advanced in place."""
    if isinstance(records, Columns):
        return encode_columns(records, batch_bytes=batch_bytes, timestamp=ts, producer=producer)
    return encode_batches(records, headers, batch_bytes, ts, producer)
