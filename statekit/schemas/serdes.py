"""Avro, Protobuf and JSON Schema keys and values in the Confluent wire format: the magic byte 0,
the schema id (4 bytes, big-endian), for Protobuf the message-index array, then the payload.

Reading needs no schema: the writer's schema comes from the registry by its id, once per id and
process (the registry client caches it; `statekit.schemas.client`). Avro payloads are read with
fastavro, Protobuf with a message class built from the registered descriptor, JSON with the C
decoder — the writer's schema, no reader schema, so a topic holding two versions of a schema reads
as records of either shape. confluent-kafka's deserializers do the same work per record with their
rule and migration machinery around it, about five times the cost of the decoding itself (23 µs
against 5 µs a small Avro record here); the tests check that both read the same records.

A decoded record is a `SchemaDict`: a dict that remembers the header it was read with, so a step
that passes it on (a table, a reduce that keeps the latest record, a repartition topic) writes it
back with the same schema id, the Avro or Protobuf payload byte for byte as it came. Any other
value is written with the serde's own schema (`avro(schema=...)`) through confluent-kafka's
serializers (`AvroSerializer`, `ProtobufSerializer`, `JSONSerializer`: registration under the
subject, validation), registered under the subject of the topic it is written to
(TopicNameStrategy: ``<topic>-key`` / ``<topic>-value``; the plan binds a sink's serde to its
topic and a store's to its changelog) or under ``subject=``. Avro also writes a plain str, int,
float, bool or bytes without a schema (as Confluent's Avro serializer does: the primitive schema).

Serdes keep text only (the schema, the registry's URL or settings): they pickle to instance
processes and Spark's Python workers, which make their own registry client from it.
"""
from __future__ import annotations

import base64
import io
import json
import struct
import weakref
from typing import Any

from statekit.errors import StatekitError
from statekit.schemas import client as registry_client

MAGIC = 0
_ID = struct.Struct(">I")
_live: "weakref.WeakSet[SchemaSerde]" = weakref.WeakSet()   # for forget_registries()


def forget_registries() -> None:
    """Every serde of this process asks for its registry again (and drops what it cached from
    the one before): tests, or a configuration that now names another registry."""
    registry_client.forget_clients()
    for s in list(_live):
        s._reset()


class SchemaDict(dict):
    """A record read from a registry-framed key or value: a dict that remembers the schema id
    (`schema_id`) and the header it was read with, so it is written back with them."""

    __slots__ = ("schema_id", "header", "format")


def _ctx_module():
    from confluent_kafka.serialization import MessageField, SerializationContext

    return MessageField, SerializationContext


def _hex_start(data: bytes) -> str:
    first = data[:1]
    if not first:
        return "are empty"
    c = first[0]
    shown = f" ({chr(c)!r})" if 32 <= c < 127 else ""
    guess = ""
    if first in (b"{", b"["):
        guess = ": it looks like plain JSON (serde 'json')"
    elif 32 <= c < 127:
        guess = ": it looks like text (serde 'str')"
    return f"begin with 0x{c:02x}{shown}, not the magic byte 0{guess}"


def _registry_error(err: Exception, settings: dict, doing: str) -> StatekitError:
    """A registry failure as one line: what was asked, the registry's answer, what to do."""
    where = registry_client.shown(settings)
    code = getattr(err, "error_code", None)
    if code is not None and getattr(err, "http_status_code", None) is not None:
        msg = " ".join(str(getattr(err, "error_message", err)).split())
        return StatekitError(f"the schema registry at {where} refused to {doing}: {msg} "
                             f"(HTTP {err.http_status_code}, error {code})")
    return StatekitError(f"cannot reach the schema registry at {where} to {doing} "
                         f"({type(err).__name__}: {' '.join(str(err).split())[:160]}); "
                         f"{registry_client.HINT}")


class SchemaSerde:
    """Base of the three serdes; see the module docstring. ``schema``: what writing new values
    needs (reading never does). ``registry``: a URL, settings or a handle (default: the
    configured one, see `statekit.schemas.client`). ``subject``: register under this subject
    instead of the topic's. ``auto_register=False``: the schema must already be registered
    under the subject (it is looked up, never added)."""

    format = ""          # the serde's registered name
    schema_type = ""     # the registry's name for the format

    def __init__(self, schema: Any = None, registry: Any = None, *, subject: str | None = None,
                 auto_register: bool = True, topic: str | None = None, key: bool = False) -> None:
        self.schema = None if schema is None else self._schema_text(schema)
        if registry is not None and not isinstance(registry, (str, dict)):
            registry = registry_client.settings_for(registry)   # a handle: its settings (text)
        self.registry = registry
        self.subject = subject
        self.auto_register = bool(auto_register)
        self.topic = topic
        self.key = bool(key)
        self.name = self.format
        self._reset()
        _live.add(self)

    def _reset(self) -> None:
        self._settings = None
        self._client = None
        self._readers: dict = {}     # header bytes (Avro, JSON) or schema id -> reader
        self._writer = None
        self._primitive: dict = {}

    # -- identity and pickling: text only ---------------------------------------------------------
    def _state(self) -> tuple:
        reg = json.dumps(self.registry, sort_keys=True) if isinstance(self.registry, dict) \
            else self.registry
        return (type(self).__name__, self.schema, reg, self.subject, self.auto_register,
                self.topic, self.key)

    def __getstate__(self):
        return {"schema": self.schema, "registry": self.registry, "subject": self.subject,
                "auto_register": self.auto_register, "topic": self.topic, "key": self.key}

    def __setstate__(self, st) -> None:
        self.__dict__.update(st)
        self.name = self.format
        self._reset()
        _live.add(self)

    def __eq__(self, other) -> bool:
        return isinstance(other, SchemaSerde) and other._state() == self._state()

    def __hash__(self) -> int:
        return hash(self._state())

    def __repr__(self) -> str:
        extra = [] if self.schema is None else ["schema=..."]
        if self.subject:
            extra.append(f"subject={self.subject!r}")
        if self.topic:
            extra.append(f"topic={self.topic!r}")
        return f"{self.format}({', '.join(extra)})"

    def bind(self, topic: str, key: bool = False) -> "SchemaSerde":
        """This serde writing to ``topic`` (its key when ``key``): the subject of new schemas is
        the topic's (TopicNameStrategy) unless ``subject=`` was given."""
        if self.topic == topic and self.key == bool(key):
            return self
        out = type(self).__new__(type(self))
        out.__setstate__(dict(self.__getstate__(), topic=topic, key=bool(key)))
        return out

    # -- the registry -----------------------------------------------------------------------------
    def settings(self) -> dict:
        if self._settings is None:
            self._settings = registry_client.settings_for(self.registry)
        return self._settings

    def client(self):
        if self._client is None:
            self._client = registry_client.client_for(self.settings())
        return self._client

    def _moved(self) -> bool:
        """Does the configuration now name another registry than the one this serde asked (the
        embedded registry restarted on another port)? Then ask that one."""
        if self.registry is not None or self._settings is None:
            return False
        try:
            now = registry_client.settings_for(None)
        except StatekitError:
            return False
        if now == self._settings:
            return False
        self._settings, self._client = now, None
        return True

    def _fetch(self, schema_id: int, fmt: str | None = None):
        try:
            try:
                schema = self.client().get_schema(schema_id, fmt=fmt)
            except Exception as e:  # noqa: BLE001
                if getattr(e, "http_status_code", None) is not None or not self._moved():
                    raise
                schema = self.client().get_schema(schema_id, fmt=fmt)
        except StatekitError:
            raise
        except Exception as e:  # noqa: BLE001 - the registry's answer, said in one line
            if getattr(e, "http_status_code", None) == 404:
                raise StatekitError(
                    f"schema id {schema_id} is not in the schema registry at "
                    f"{registry_client.shown(self.settings())}: the record was written against "
                    f"another registry; point {registry_client.ENV_URL} (or "
                    f"schema.registry.url in STATEKIT_KAFKA_CONFIG) at that one") from None
            raise _registry_error(e, self.settings(), f"give schema id {schema_id}") from None
        kind = schema.schema_type or "AVRO"
        if kind != self.schema_type:
            name = {"AVRO": "avro", "PROTOBUF": "protobuf", "JSON": "json_schema"}.get(kind, kind)
            raise StatekitError(f"schema id {schema_id} is a {kind} schema, not {self.schema_type}: "
                                f"read it with the serde {name!r}")
        return schema

    # -- reading ----------------------------------------------------------------------------------
    def from_bytes(self, data: bytes):
        r = self._readers.get(data[:5])
        if r is None:
            r = self._reader_for(data)
        return r(data)

    def _header_id(self, data: bytes) -> int:
        if len(data) < 5 or data[0] != MAGIC:
            what = "are shorter than the 5-byte header" if 0 < len(data) < 5 and data[0] == MAGIC \
                else _hex_start(data)
            raise StatekitError(f"the {self.format} serde reads the Confluent wire format, and "
                                f"these bytes {what}")
        return _ID.unpack_from(data, 1)[0]

    def _reader_for(self, data: bytes):
        sid = self._header_id(data)
        read = self._make_reader(sid, self._fetch(sid, self._fetch_format))
        self._readers[bytes(data[:5])] = read
        return read

    _fetch_format: str | None = None

    def decode_many(self, blobs: list) -> list | None:
        """The values of ``blobs`` (None when one does not decode: the caller then goes one at a
        time and says which)."""
        try:
            dec = self.from_bytes
            return [None if b is None else dec(b) for b in blobs]
        except Exception:  # noqa: BLE001
            return None

    # -- writing ----------------------------------------------------------------------------------
    def to_bytes(self, obj) -> bytes:
        if type(obj) is SchemaDict and obj.format == self.format:
            return self._write_back(obj)
        if self.schema is not None:
            return self._write_new(obj)
        return self._write_schemaless(obj)

    def _subject(self) -> str:
        if self.subject:
            return self.subject
        if self.topic:
            return f"{self.topic}-{'key' if self.key else 'value'}"
        raise StatekitError(
            f"the {self.format} serde registers its schema under the subject of the topic it "
            f"writes to, and this one writes to none: give it subject=")

    def _context(self):
        field, ctx = _ctx_module()
        return ctx(self.topic or "", field.KEY if self.key else field.VALUE)

    def _serializer_conf(self) -> dict:
        subject = self._subject()
        return {"auto.register.schemas": self.auto_register,
                "subject.name.strategy": lambda _ctx, _name, _s=subject: _s}

    def _write_new(self, obj) -> bytes:
        w = self._writer
        if w is None:
            w = self._writer = self._make_serializer()
        try:
            return w(self._prepare(obj), self._context())
        except StatekitError:
            raise
        except Exception as e:  # noqa: BLE001
            if getattr(e, "http_status_code", None) is not None:
                raise _registry_error(e, self.settings(),
                                      f"register the {self.format} schema under {self._subject()}") from None
            if type(e).__name__ in ("ConnectError", "ConnectTimeout", "ReadTimeout", "HTTPError"):
                raise _registry_error(e, self.settings(), f"register under {self._subject()}") from None
            raise StatekitError(f"the value does not fit the {self.format} schema: "
                                f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None

    def _write_schemaless(self, obj) -> bytes:
        raise StatekitError(
            f"the {self.format} serde writes back the records it read (they keep their schema "
            f"id); for a new {type(obj).__name__} give it a schema: "
            f"statekit.serdes.{self.format}(schema=...), or use the serde 'json'")

    def _prepare(self, obj):
        return obj

    # -- per format -------------------------------------------------------------------------------
    def _schema_text(self, schema) -> Any:
        raise NotImplementedError

    def _make_reader(self, schema_id: int, schema):
        raise NotImplementedError

    def _write_back(self, rec: SchemaDict) -> bytes:
        raise NotImplementedError

    def _make_serializer(self):
        raise NotImplementedError


def _wrap(value, sid: int, header: bytes, fmt: str):
    if type(value) is dict:
        value = SchemaDict(value)
        value.schema_id, value.header, value.format = sid, header, fmt
    return value


# -- Avro ------------------------------------------------------------------------------------------

_PRIMITIVES = ((bool, "boolean"), (int, "long"), (float, "double"), (str, "string"),
               (bytes, "bytes"))


class AvroSerde(SchemaSerde):
    """Avro in the Confluent wire format (fastavro; confluent-kafka's ``AvroSerializer``)."""

    format = "avro"
    schema_type = "AVRO"

    def _schema_text(self, schema) -> str:
        from fastavro import parse_schema

        doc = schema
        if isinstance(schema, str):
            try:
                doc = json.loads(schema)
            except ValueError:
                doc = schema.strip()       # a bare type name: string
        try:
            parse_schema(doc)
        except Exception as e:  # noqa: BLE001
            raise StatekitError(f"not an Avro schema: {type(e).__name__}: "
                                f"{' '.join(str(e).split())[:200]}") from None
        return json.dumps(doc)

    def _parsed(self, schema) -> Any:
        """fastavro's parsed writer schema, with the named types its references define."""
        from fastavro import parse_schema

        named: dict = {}
        self._add_references(schema, named, set())
        return parse_schema(json.loads(schema.schema_str), named_schemas=named)

    def _add_references(self, schema, named: dict, seen: set) -> None:
        from fastavro import parse_schema

        for ref in schema.references or ():
            if (ref.subject, ref.version) in seen:
                continue
            seen.add((ref.subject, ref.version))
            try:
                got = self.client().get_version(ref.subject, ref.version).schema
            except Exception as e:  # noqa: BLE001
                raise _registry_error(e, self.settings(),
                                      f"give {ref.subject} version {ref.version}") from None
            self._add_references(got, named, seen)
            parse_schema(json.loads(got.schema_str), named_schemas=named)

    def _make_reader(self, schema_id: int, schema):
        from fastavro import schemaless_reader

        parsed = self._parsed(schema)
        header = _ID.pack(schema_id)
        header = bytes((MAGIC,)) + header
        BytesIO = io.BytesIO

        def read(data: bytes, _r=schemaless_reader, _p=parsed):
            fo = BytesIO(data)
            fo.seek(5)
            try:
                v = _r(fo, _p, None)
            except Exception as e:  # noqa: BLE001
                raise StatekitError(f"the Avro payload does not match schema id {schema_id}: "
                                    f"{type(e).__name__}: {' '.join(str(e).split())[:120]}") from None
            return _wrap(v, schema_id, header, "avro")

        read.parsed = parsed
        return read

    def _write_back(self, rec: SchemaDict) -> bytes:
        from fastavro import schemaless_writer

        r = self._readers.get(rec.header)
        if r is None:
            r = self._reader_for(rec.header)
        fo = io.BytesIO()
        fo.write(rec.header)
        schemaless_writer(fo, r.parsed, rec)
        return fo.getvalue()

    def _make_serializer(self):
        sr = registry_client._schema_registry()
        from confluent_kafka.schema_registry.avro import AvroSerializer

        return AvroSerializer(self.client(), sr.Schema(self.schema, "AVRO"),
                              conf=self._serializer_conf())

    def _write_schemaless(self, obj) -> bytes:
        """A plain Python value of one Avro primitive type, with that type as its schema."""
        for t, name in _PRIMITIVES:
            if type(obj) is t:
                w = self._primitive.get(name)
                if w is None:
                    w = self._primitive[name] = type(self)(
                        {"type": name}, self.registry, subject=self.subject,
                        auto_register=self.auto_register, topic=self.topic, key=self.key)
                return w.to_bytes(obj)
        return super()._write_schemaless(obj)


# -- JSON Schema -----------------------------------------------------------------------------------

class JsonSchemaSerde(SchemaSerde):
    """JSON documents checked against a JSON Schema, in the Confluent wire format
    (confluent-kafka's ``JSONSerializer``, over jsonschema)."""

    format = "json_schema"
    schema_type = "JSON"

    def _schema_text(self, schema) -> str:
        from jsonschema.validators import validator_for

        doc = schema
        if isinstance(schema, str):
            try:
                doc = json.loads(schema)
            except ValueError as e:
                raise StatekitError(f"not a JSON Schema: not JSON ({e})") from None
        if not isinstance(doc, (dict, bool)):
            raise StatekitError(f"not a JSON Schema: a JSON object, not {type(doc).__name__}")
        try:
            validator_for(doc).check_schema(doc)
        except Exception as e:  # noqa: BLE001
            raise StatekitError(f"not a JSON Schema: {' '.join(str(e).split())[:200]}") from None
        return json.dumps(doc)

    def _make_reader(self, schema_id: int, schema):
        header = bytes((MAGIC,)) + _ID.pack(schema_id)
        decode = json.JSONDecoder().decode

        def read(data: bytes):
            try:
                v = decode(bytes(data[5:]).decode("utf-8"))
            except ValueError as e:
                raise StatekitError(f"the JSON payload of schema id {schema_id} is not JSON: "
                                    f"{e}") from None
            return _wrap(v, schema_id, header, "json_schema")
        return read

    def _write_back(self, rec: SchemaDict) -> bytes:
        return rec.header + json.dumps(rec, separators=(",", ":")).encode("utf-8")

    def _make_serializer(self):
        sr = registry_client._schema_registry()
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        return JSONSerializer(sr.Schema(self.schema, "JSON"), self.client(),
                              conf=self._serializer_conf())


# -- Protobuf --------------------------------------------------------------------------------------

def _compile_proto(text: str) -> bytes:
    """``.proto`` text -> a serialized FileDescriptorSet (grpcio-tools' protoc)."""
    import os
    import tempfile

    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "schema.proto")
        with open(src, "w") as f:
            f.write(text)
        out = os.path.join(d, "schema.desc")
        import grpc_tools
        include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        rc = protoc.main(["protoc", f"-I{d}", f"-I{include}", "--include_imports",
                          f"--descriptor_set_out={out}", src])
        if rc != 0 or not os.path.exists(out):
            raise StatekitError("not a Protobuf schema: protoc could not compile the .proto text "
                                "(its errors are above)")
        with open(out, "rb") as f:
            return f.read()


def _file_set_of(descriptor) -> bytes:
    """The FileDescriptorSet of a message class's file and every file it imports."""
    from google.protobuf import descriptor_pb2

    files, seen = [], set()

    def add(fd):
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in fd.dependencies:
            add(dep)
        p = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(p)
        files.append(p)
    add(descriptor.file)
    return descriptor_pb2.FileDescriptorSet(file=files).SerializeToString()


def _pool_with(files) -> Any:
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    for fp in files:
        pool.Add(fp)
    return pool


def _message_dict(msg) -> dict:
    """A message as a dict of Python values: every field (proto3's defaults included), ints as
    ints (json_format would make int64 text), enums by name, sub-messages as dicts (None when
    unset), repeated fields as lists, maps as dicts."""
    out = {}
    for f in msg.DESCRIPTOR.fields:
        v = getattr(msg, f.name)
        mt = f.message_type
        if mt is not None and mt.GetOptions().map_entry:
            vf = mt.fields_by_name["value"]
            out[f.name] = {k: _field_value(vf, x) for k, x in v.items()}
        elif f.is_repeated:
            out[f.name] = [_field_value(f, x) for x in v]
        elif f.has_presence and not msg.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _field_value(f, v)
    return out


def _field_value(f, v):
    if f.message_type is not None:
        return _message_dict(v)
    if f.enum_type is not None:
        ev = f.enum_type.values_by_number.get(v)
        return ev.name if ev is not None else v
    return v


def _fill(msg, d: dict):
    """Set a message's fields from a dict of Python values (the inverse of `_message_dict`: ints
    as ints, enums by name or number, sub-messages and map values as dicts, None as unset)."""
    fields = msg.DESCRIPTOR.fields_by_name
    for name, v in d.items():
        f = fields.get(name)
        if f is None:
            raise StatekitError(f"the Protobuf message {msg.DESCRIPTOR.full_name} has no field "
                                f"{name!r} (it has {', '.join(fields)})")
        if v is None:
            continue
        mt = f.message_type
        if mt is not None and mt.GetOptions().map_entry:
            vf = mt.fields_by_name["value"]
            target = getattr(msg, name)
            for k, x in v.items():
                if vf.message_type is not None:
                    _fill(target[k], x)
                else:
                    target[k] = _scalar(vf, x)
        elif f.is_repeated:
            target = getattr(msg, name)
            for x in v:
                if mt is not None:
                    _fill(target.add(), x)
                else:
                    target.append(_scalar(f, x))
        elif mt is not None:
            _fill(getattr(msg, name), v)
            getattr(msg, name).SetInParent()     # an empty sub-message is set, not None
        else:
            setattr(msg, name, _scalar(f, v))
    return msg


def _scalar(f, v):
    if f.enum_type is not None and isinstance(v, str):
        ev = f.enum_type.values_by_name.get(v)
        if ev is None:
            raise StatekitError(f"{v!r} is not a value of the enum {f.enum_type.full_name} "
                                f"({', '.join(f.enum_type.values_by_name)})")
        return ev.number
    return v


def _to_message(cls, obj):
    from google.protobuf.message import Message

    if isinstance(obj, Message):
        return obj
    if not isinstance(obj, dict):
        raise StatekitError(f"a Protobuf value is a dict or a message, not {type(obj).__name__}")
    try:
        return _fill(cls(), obj)
    except (TypeError, ValueError, AttributeError) as e:
        raise StatekitError(f"the value does not fit the Protobuf message "
                            f"{cls.DESCRIPTOR.full_name}: {' '.join(str(e).split())[:200]}") from None


class ProtobufSerde(SchemaSerde):
    """Protobuf in the Confluent wire format (confluent-kafka's ``ProtobufSerializer``). ``schema``
    is a generated message class, or ``.proto`` text (compiled with grpcio-tools' protoc; the
    first message is written unless ``message=`` names another)."""

    format = "protobuf"
    schema_type = "PROTOBUF"
    _fetch_format = "serialized"

    def __init__(self, schema: Any = None, registry: Any = None, *, message: str | None = None,
                 **kw) -> None:
        self.message = message
        super().__init__(schema, registry, **kw)

    def __getstate__(self):
        return dict(super().__getstate__(), message=self.message)

    def _state(self) -> tuple:
        return super()._state() + (self.message,)

    def _reset(self) -> None:
        super()._reset()
        self._cls = None

    def _schema_text(self, schema):
        """(FileDescriptorSet bytes, message full name): text a pickle carries."""
        from google.protobuf import descriptor_pb2

        if isinstance(schema, tuple):
            return schema
        if isinstance(schema, str):
            fds = _compile_proto(schema)
            files = descriptor_pb2.FileDescriptorSet.FromString(fds).file
            main = files[-1]
            names = [m.name for m in main.message_type]
            if not names:
                raise StatekitError("not a Protobuf schema: the .proto text defines no message")
            name = self.message or names[0]
            if name not in names:
                raise StatekitError(f"the .proto text has no message {name!r} "
                                    f"(it has {', '.join(names)})")
            full = f"{main.package}.{name}" if main.package else name
            return fds, full
        desc = getattr(schema, "DESCRIPTOR", None)
        if desc is None or not hasattr(desc, "full_name"):
            raise StatekitError(f"a Protobuf schema is a generated message class or .proto "
                                f"text, not {type(schema).__name__}")
        return _file_set_of(desc), desc.full_name

    def _message_class(self):
        if self._cls is None:
            from google.protobuf import descriptor_pb2, message_factory

            fds, full = self.schema
            pool = _pool_with(descriptor_pb2.FileDescriptorSet.FromString(fds).file)
            self._cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
        return self._cls

    def from_bytes(self, data: bytes):
        sid = self._header_id(data)
        r = self._readers.get(sid)
        if r is None:
            r = self._readers[sid] = self._make_reader(sid, self._fetch(sid, "serialized"))
        return r(data)

    def _files(self, schema, seen: set) -> list:
        """FileDescriptorProtos of ``schema`` and of its references, dependencies first."""
        from google.protobuf import descriptor_pb2

        files = []
        for ref in schema.references or ():
            if ref.name in seen:
                continue
            seen.add(ref.name)
            try:
                got = self.client().get_version(ref.subject, ref.version, fmt="serialized").schema
            except Exception as e:  # noqa: BLE001
                raise _registry_error(e, self.settings(),
                                      f"give {ref.subject} version {ref.version}") from None
            files += self._files(got, seen)
            fp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(got.schema_str))
            fp.name = ref.name
            files.append(fp)
        return files

    def _make_reader(self, schema_id: int, schema):
        from google.protobuf import descriptor_pb2, message_factory
        from google.protobuf.message import DecodeError

        main = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema.schema_str))
        main.name = main.name or "default"
        files = self._files(schema, {main.name})
        have = {f.name for f in files}
        wkt = _well_known(main, have)
        pool = _pool_with(wkt + files + [main])
        classes: dict = {}

        def message_class(indexes: tuple):
            cls = classes.get(indexes)
            if cls is None:
                names, msgs = [], main.message_type
                for i in indexes:
                    if i >= len(msgs):
                        raise StatekitError(f"message index {list(indexes)} is not in schema id "
                                            f"{schema_id}")
                    names.append(msgs[i].name)
                    msgs = msgs[i].nested_type
                full = ".".join(([main.package] if main.package else []) + names)
                cls = classes[indexes] = message_factory.GetMessageClass(
                    pool.FindMessageTypeByName(full))
            return cls

        def read(data: bytes):
            pos, indexes = _read_indexes(data, 5)
            msg = message_class(indexes)()
            try:
                msg.ParseFromString(bytes(data[pos:]))
            except DecodeError as e:
                raise StatekitError(f"the Protobuf payload does not match schema id {schema_id}: "
                                    f"{e}") from None
            return _wrap(_message_dict(msg), schema_id, bytes(data[:pos]), "protobuf")

        read.message_class = message_class
        return read

    def _write_back(self, rec: SchemaDict) -> bytes:
        r = self._readers.get(rec.schema_id)
        if r is None:
            r = self._readers[rec.schema_id] = self._make_reader(
                rec.schema_id, self._fetch(rec.schema_id, "serialized"))
        _, indexes = _read_indexes(rec.header, 5)
        msg = _to_message(r.message_class(indexes), rec)
        return rec.header + msg.SerializeToString()

    def _prepare(self, obj):
        return _to_message(self._message_class(), obj)

    def _make_serializer(self):
        registry_client._schema_registry()
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        conf = dict(self._serializer_conf(), **{"use.deprecated.format": False})
        return ProtobufSerializer(self._message_class(), self.client(), conf=conf)


def _well_known(main, have: set) -> list:
    """The google/protobuf files a schema imports (protoc never registers them)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf import (any_pb2, duration_pb2, empty_pb2, struct_pb2, timestamp_pb2,
                                 wrappers_pb2)

    known = {m.DESCRIPTOR.name: m.DESCRIPTOR for m in (any_pb2, duration_pb2, empty_pb2,
                                                        struct_pb2, timestamp_pb2, wrappers_pb2)}
    out = []
    for dep in main.dependency:
        if dep in known and dep not in have:
            p = descriptor_pb2.FileDescriptorProto()
            known[dep].CopyToProto(p)
            out.append(p)
    return out


def _read_indexes(data: bytes, pos: int) -> tuple:
    """The message-index array after the header: (payload start, indexes); a lone 0 is [0]."""
    from statekit.wire.varint import read_varint

    try:
        count, pos = read_varint(data, pos)
        if count == 0:
            return pos, (0,)
        out = []
        for _ in range(count):
            i, pos = read_varint(data, pos)
            out.append(i)
    except (IndexError, ValueError):
        raise StatekitError("the Protobuf message-index array runs past the end of the "
                            "value") from None
    return pos, tuple(out)


FORMATS = {"avro": AvroSerde, "protobuf": ProtobufSerde, "json_schema": JsonSchemaSerde}
