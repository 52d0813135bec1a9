"""The errors of the record-batch codec: bytes that are not a valid batch, and a codec this
interpreter cannot (de)compress. Both are ``ValueError`` s, so callers that parse untrusted bytes
catch one kind."""
from __future__ import annotations


class WireError(ValueError):
    """Record-batch bytes this codec cannot read or write."""


class InvalidBatch(WireError):
    """The bytes are not a whole, valid v2 record batch (the broker answers CORRUPT_MESSAGE).
    ``position``: where the bad batch starts, when known (log recovery truncates there)."""

    position: int | None = None


class CodecUnavailable(WireError):
    """A compression codec whose library is not installed here (snappy, lz4 are optional)."""
