"""The data generators' records in a registry format: `produce --format avro` (or `protobuf`,
`json_schema`) writes each generator's values with a schema of its own, registered under
``<topic>-value`` in the configured (or embedded) Schema Registry; keys stay UTF-8 text.

The first value of a run goes through the serde (`statekit.schemas.serdes`: confluent-kafka's
serializer registers the schema, and the registry refuses one that is incompatible with the
subject's); every other value is the same 5-byte header (6 for Protobuf: its message index) and
a payload encoded here in bulk: fastavro's `schemaless_writer` into one buffer, the message's
own serializer, or the compact JSON `produce` writes anyway — per-record serializer calls cost
about twice as much (`bench/datagen.py` measures the fast path). The `accounts` generator's Avro
and JSON Schema values are built column-wise with numpy, as its JSON ones are.
"""
from __future__ import annotations

import io
import json
from typing import Any

from statekit.errors import StatekitError
from statekit.schemas.serdes import FORMATS

FORMAT_NAMES = ("json",) + tuple(FORMATS)

_NS = "statekit.datagen"
# field name -> Avro type; the order is the records' (and the Protobuf field numbers')
FIELDS = {
    "words": ("Word", [("word", "string"), ("seq", "long"), ("ts", "long")]),
    "clicks": ("Click", [("user", "string"), ("page", "string"), ("action", "string"),
                         ("session", "string"), ("duration_ms", "long"), ("seq", "long"),
                         ("ts", "long")]),
    "sensors": ("SensorReading", [("sensor", "string"), ("temperature", "double"),
                                  ("humidity", "double"), ("battery", "double"), ("seq", "long"),
                                  ("ts", "long")]),
    "accounts": ("AccountMovement", [("account", "string"), ("amount", "long")]),
}


def avro_schema(generator: str) -> dict:
    name, fields = _fields(generator)
    return {"type": "record", "name": name, "namespace": _NS,
            "fields": [{"name": f, "type": t} for f, t in fields]}


def json_schema(generator: str) -> dict:
    name, fields = _fields(generator)
    kinds = {"string": "string", "long": "integer", "double": "number"}
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": name, "type": "object",
            "properties": {f: {"type": kinds[t]} for f, t in fields},
            "required": [f for f, _ in fields], "additionalProperties": False}


def protobuf_class(generator: str):
    """A message class for the generator's values, built from a descriptor (no protoc)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    name, fields = _fields(generator)
    kinds = {"string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
             "long": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
             "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE}
    fp = descriptor_pb2.FileDescriptorProto(name=f"statekit/datagen/{generator}.proto",
                                            package=_NS, syntax="proto3")
    msg = fp.message_type.add(name=name)
    for i, (f, t) in enumerate(fields, 1):
        msg.field.add(name=f, number=i, type=kinds[t],
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_NS}.{name}"))


def _fields(generator: str):
    try:
        return FIELDS[generator]
    except KeyError:
        raise StatekitError(f"the generator {generator!r} has no schema; --format works with "
                            f"{', '.join(FIELDS)}") from None


def check_format(fmt: str) -> str:
    if fmt not in FORMAT_NAMES:
        raise StatekitError(f"unknown format {fmt!r}; use one of {', '.join(FORMAT_NAMES)}")
    return fmt


class ValueEncoder:
    """A generator's values -> bytes in `fmt` for `topic` (see the module docstring)."""

    def __init__(self, fmt: str, generator: str, topic: str, registry: Any = None) -> None:
        self.format = check_format(fmt)
        self.generator = generator
        self.topic = topic
        self.header: bytes | None = None
        if fmt == "avro":
            from fastavro import parse_schema

            schema = avro_schema(generator)
            self._parsed = parse_schema(schema)
        elif fmt == "protobuf":
            schema = self._cls = protobuf_class(generator)
        elif fmt == "json_schema":
            schema = json_schema(generator)
        else:
            schema = None
        self.serde = None if schema is None else FORMATS[fmt](schema, registry).bind(topic)

    def _first(self, value: dict) -> bytes:
        """The first value through the serde: it registers the schema; its header is every
        other value's."""
        first = self.serde.to_bytes(value)
        n = 6 if self.format == "protobuf" else 5
        self.header = first[:n]
        return first

    def encode_many(self, values: list) -> list:
        if self.format == "json":
            dumps = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode
            return [dumps(v).encode("utf-8") for v in values]
        out = []
        if self.header is None and values:
            out.append(self._first(values[0]))
            values = values[1:]
        h = self.header
        if self.format == "avro":
            from fastavro import schemaless_writer

            fo, ends, parsed = io.BytesIO(), [], self._parsed
            for v in values:
                schemaless_writer(fo, parsed, v)
                ends.append(fo.tell())
            buf, start = fo.getbuffer(), 0
            for end in ends:
                out.append(h + buf[start:end])
                start = end
            del buf
        elif self.format == "protobuf":
            from statekit.schemas.serdes import _fill

            cls = self._cls
            out += [h + _fill(cls(), v).SerializeToString() for v in values]
        else:
            dumps = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode
            out += [h + dumps(v).encode("utf-8") for v in values]
        return out

    def accounts_columns(self, head: Any, kmat, amounts):
        """The `accounts` values column-wise (numpy), or None where this format has no such
        path: (flat uint8 buffer, lengths). `head`: the first record's value, for the header."""
        import numpy as np

        if self.format not in ("avro",):
            return None
        if self.header is None:
            self._first(head)
        n, klen = kmat.shape
        # Avro: the account as zigzag length + bytes, then the amount as a zigzag varint
        z = (amounts.astype(np.int64) << 1) ^ (amounts.astype(np.int64) >> 63)
        two = z >= 0x80
        if (z >= 1 << 14).any() or 2 * klen >= 0x80:
            return None
        vlen = 5 + 1 + klen + 1 + two.astype(np.int64)
        width = int(vlen.max())
        mat = np.zeros((n, width), np.uint8)
        mat[:, :5] = np.frombuffer(self.header, np.uint8)
        mat[:, 5] = 2 * klen
        mat[:, 6:6 + klen] = kmat
        p = 6 + klen
        mat[:, p] = np.where(two, (z & 0x7F) | 0x80, z).astype(np.uint8)
        mat[:, p + 1] = np.where(two, z >> 7, 0).astype(np.uint8)
        flat = mat[np.arange(width)[None, :] < vlen[:, None]]
        return flat, vlen
