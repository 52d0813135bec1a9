"""PROTOBUF schemas in the registry.

A schema arrives either as confluent-kafka's ProtobufSerializer sends it, a base64 serialized
``FileDescriptorProto``, or as ``.proto`` text, which protoc (grpcio-tools) compiles into one. The
registry keeps and returns the base64 descriptor (the ``format=serialized`` form of Confluent's
API, the one confluent-kafka's serdes ask for); it is built into a protobuf ``DescriptorPool``
beside its references and the well-known types, so an unresolved type is refused at registration.

Compatibility follows Confluent's protobuf rules (its ``SchemaDiff``), for a reader and a writer:
a changed package, a removed message, a field (by number) whose kind (scalar / message / map),
scalar group ({int32, int64, uint32, uint64, bool, enum}, {sint32, sint64}, {string, bytes},
{fixed32, sfixed32}, {fixed64, sfixed64}, float, double), message type name or numeric
repeated-ness changed, a required field added or removed, a removed member of a surviving oneof,
and fields that were independent moved into one oneof are incompatible; everything else (fields,
messages, enums and their values added or removed, renames) is compatible. A message-typed field
keeps its type by full name; the message itself is compared by these rules too, on its own when it
is in the file, through the field when it comes from a reference (another version of it)."""
from __future__ import annotations

import base64
import binascii
import os
import subprocess
import sys
import tempfile

from .errors import InvalidSchema

_GENERAL, _SIGNED, _STRING, _FIXED32, _FIXED64, _FLOAT, _DOUBLE = range(7)
# FieldDescriptorProto.Type -> Confluent's scalar group
_SCALAR_GROUP = {5: _GENERAL, 3: _GENERAL, 13: _GENERAL, 4: _GENERAL, 8: _GENERAL, 14: _GENERAL,
                 17: _SIGNED, 18: _SIGNED, 9: _STRING, 12: _STRING, 7: _FIXED32, 15: _FIXED32,
                 6: _FIXED64, 16: _FIXED64, 2: _FLOAT, 1: _DOUBLE}
_MESSAGE, _GROUP = 11, 10
_REQUIRED, _REPEATED = 2, 3


class ProtobufSchema:
    schema_type = "PROTOBUF"

    def __init__(self, canonical: str, proto, refs=()):
        # proto: the FileDescriptorProto; refs: those of every file it references (for their messages)
        self.canonical, self.proto, self.refs = canonical, proto, list(refs)


def _is_builtin(name: str) -> bool:
    return name.startswith(("google/protobuf/", "google/type/"))


def _well_known_pool():
    from google.protobuf import (any_pb2, api_pb2, descriptor_pb2, descriptor_pool, duration_pb2, empty_pb2,
                                 field_mask_pb2, source_context_pb2, struct_pb2, timestamp_pb2, type_pb2,
                                 wrappers_pb2)

    pool = descriptor_pool.DescriptorPool()
    for mod in (any_pb2, source_context_pb2, type_pb2, api_pb2, descriptor_pb2, duration_pb2, empty_pb2,
                field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(mod.DESCRIPTOR.serialized_pb)
    return pool


def _decode(text: str):
    """The FileDescriptorProto a base64 text holds, or None when the text is not base64."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    fdp = descriptor_pb2.FileDescriptorProto()
    try:
        fdp.ParseFromString(raw)
    except DecodeError as e:
        raise InvalidSchema(f"Invalid PROTOBUF schema: not a serialized FileDescriptorProto ({e})") from None
    return fdp


def _compile(text: str, references: list):
    """.proto text -> FileDescriptorProto, with protoc from grpcio-tools; imports resolve against
    the references (given to protoc as a descriptor set) and the well-known types."""
    from google.protobuf import descriptor_pb2

    try:
        import grpc_tools
    except ImportError:
        raise InvalidSchema("Invalid PROTOBUF schema: .proto text needs grpcio-tools (pip install grpcio-tools); "
                            "or send the base64 serialized FileDescriptorProto") from None
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory(prefix="statekit-proto-") as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        with open(os.path.join(src, "schema.proto"), "w") as f:
            f.write(text)
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{src}", f"-I{include}",
               f"--descriptor_set_out={os.path.join(tmp, 'out.pb')}"]
        refs = descriptor_pb2.FileDescriptorSet()
        for name, proto in references:
            if not _is_builtin(name):
                ref = refs.file.add()
                ref.CopyFrom(proto)
                ref.name = name
        if len(refs.file):
            with open(os.path.join(tmp, "refs.pb"), "wb") as f:
                f.write(refs.SerializeToString())
            cmd.append(f"--descriptor_set_in={os.path.join(tmp, 'refs.pb')}")
        run = subprocess.run(cmd + ["schema.proto"], capture_output=True, text=True, timeout=60, cwd=tmp)
        if run.returncode != 0:
            lines = [ln.strip() for ln in (run.stderr or run.stdout).splitlines() if ln.strip()]
            reason = "; ".join(ln.replace(src + os.sep, "") for ln in lines[:3]) or f"protoc exited {run.returncode}"
            raise InvalidSchema(f"Invalid PROTOBUF schema: {reason}")
        out = descriptor_pb2.FileDescriptorSet()
        with open(os.path.join(tmp, "out.pb"), "rb") as f:
            out.ParseFromString(f.read())
    return out.file[-1]


def parse(text: str, references: list, normalize: bool = False) -> ProtobufSchema:
    """``references``: ``(name, ProtobufSchema)`` of every referenced file, dependencies first."""
    references = [(name, ref.proto) for name, ref in references]
    fdp = _decode(text)
    if fdp is None:
        fdp = _compile(text, references)
    fdp.ClearField("source_code_info")
    if not fdp.name:
        fdp.name = "schema.proto"
    pool = _well_known_pool()
    try:
        for name, proto in references:
            if _is_builtin(name):
                continue
            ref = type(proto)()
            ref.CopyFrom(proto)
            ref.name = name
            pool.Add(ref)
        missing = [d for d in fdp.dependency if not _is_builtin(d) and d not in {n for n, _ in references}]
        if missing:
            raise InvalidSchema(f"Invalid PROTOBUF schema: imports {', '.join(missing)}, which no reference "
                                f"names (register it and pass it in `references`)")
        pool.Add(fdp)
    except InvalidSchema:
        raise
    except (TypeError, ValueError, KeyError) as e:
        raise InvalidSchema(f"Invalid PROTOBUF schema: {str(e).splitlines()[0][:300]}") from None
    raw = fdp.SerializeToString(deterministic=True)
    return ProtobufSchema(base64.standard_b64encode(raw).decode("ascii"), fdp,
                          [proto for name, proto in references if not _is_builtin(name)])


# -------------------------------------------------------------------------------- compatibility
class _Diff:
    def __init__(self, writer: ProtobufSchema, reader: ProtobufSchema):
        self.writer, self.reader = writer.proto, reader.proto
        self.wmsgs, self.rmsgs = _messages(self.writer), _messages(self.reader)
        # every message the two can name, by full name (".pkg.Outer.Inner"): theirs and their references'
        self.windex = {k: m for f in [self.writer, *writer.refs] for k, m in _full_names(f).items()}
        self.rindex = {k: m for f in [self.reader, *reader.refs] for k, m in _full_names(f).items()}
        self.problems: list[str] = []
        self.visited: set = set()

    def add(self, kind: str, path: str, what: str) -> None:
        self.problems.append(f"{{errorType:'{kind}', description:'{what} at path #/{path}'}}")


def _messages(fdp) -> dict:
    """{local name (Outer.Inner): DescriptorProto} of every message of a file, nested ones too."""
    out = {}

    def walk(prefix, msgs):
        for m in msgs:
            name = f"{prefix}{m.name}"
            out[name] = m
            walk(name + ".", m.nested_type)

    walk("", fdp.message_type)
    return out


def _full_names(fdp) -> dict:
    prefix = f".{fdp.package}." if fdp.package else "."
    return {prefix + local: m for local, m in _messages(fdp).items()}


def _kind(index: dict, field):
    """('scalar', group) | ('map', entry message) | ('message', full type name)."""
    if field.type in (_MESSAGE, _GROUP):
        entry = index.get(field.type_name)
        if entry is not None and entry.options.map_entry:
            return "map", entry
        return "message", field.type_name
    return "scalar", _SCALAR_GROUP.get(field.type, field.type)


def _compare_types(d: _Diff, path: str, wfield, rfield, labels: bool = True) -> None:
    wkind, rkind = _kind(d.windex, wfield), _kind(d.rindex, rfield)
    if wkind[0] != rkind[0]:
        d.add("FIELD_KIND_CHANGED", path, f"The kind of the field changed from {wkind[0]} to {rkind[0]}")
    elif wkind[0] == "scalar":
        if wkind[1] != rkind[1]:
            d.add("FIELD_SCALAR_KIND_CHANGED", path, "The scalar type of the field changed to an incompatible one")
        elif labels and wkind[1] not in (_STRING,) and (wfield.label == _REPEATED) != (rfield.label == _REPEATED):
            d.add("FIELD_NUMERIC_LABEL_CHANGED", path, "A numeric field changed between repeated and singular")
    elif wkind[0] == "message":
        if wkind[1] != rkind[1]:
            d.add("FIELD_NAMED_TYPE_CHANGED", path, f"The field's type changed from {wkind[1]} to {rkind[1]}")
            return
        wmsg, rmsg = d.windex.get(wkind[1]), d.rindex.get(rkind[1])
        local = _full_names(d.writer).get(wkind[1]) is not None and _full_names(d.reader).get(rkind[1]) is not None
        # a message of the file itself is compared on its own; one from a reference is compared here
        if not local and wmsg is not None and rmsg is not None and wmsg != rmsg and wkind[1] not in d.visited:
            d.visited.add(wkind[1])
            _compare_message(d, wkind[1].lstrip("."), wmsg, rmsg)
    else:
        wk, wv = (f for f in sorted(wkind[1].field, key=lambda f: f.number))
        rk, rv = (f for f in sorted(rkind[1].field, key=lambda f: f.number))
        _compare_types(d, path + "/key", wk, rk, labels=False)
        _compare_types(d, path + "/value", wv, rv, labels=False)


def _compare_message(d: _Diff, name: str, wmsg, rmsg) -> None:
    wby = {f.number: f for f in wmsg.field}
    rby = {f.number: f for f in rmsg.field}

    def oneofs(msg):
        names = [o.name for o in msg.oneof_decl]
        # a proto3 `optional` field is a synthetic oneof of its own: not a oneof to these rules
        return {f.number: names[f.oneof_index] for f in msg.field
                if f.HasField("oneof_index") and not f.proto3_optional}

    woneof, roneof = oneofs(wmsg), oneofs(rmsg)
    dropped_whole = {o for o in set(woneof.values()) - set(roneof.values())
                     if not any(n in rby for n, name_ in woneof.items() if name_ == o)}
    for oneof in sorted(set(roneof.values())):
        groups, moved_in = set(), 0
        for n, o in roneof.items():
            if o != oneof or n not in wby:
                continue
            if n in woneof:
                groups.add("oneof:" + woneof[n])
            else:
                groups.add(f"field:{n}")
                moved_in += 1
        if len(groups) > 1:
            kind = "MULTIPLE_FIELDS_MOVED_TO_ONEOF" if moved_in > 1 else "FIELD_MOVED_TO_EXISTING_ONEOF"
            d.add(kind, f"{name}/{oneof}", "Fields that could be set together were moved into one oneof")
    for n in sorted(set(wby) | set(rby)):
        path = f"{name}/{n}"
        wf, rf = wby.get(n), rby.get(n)
        if rf is None:
            if n in woneof and woneof[n] not in dropped_whole:
                d.add("ONEOF_FIELD_REMOVED", f"{name}/{woneof[n]}/{n}", "A member of a oneof was removed")
            elif n not in woneof and wf.label == _REQUIRED:
                d.add("REQUIRED_FIELD_REMOVED", path, "A required field was removed")
        elif wf is None:
            if n not in roneof and rf.label == _REQUIRED:
                d.add("REQUIRED_FIELD_ADDED", path, "A required field was added")
        else:
            _compare_types(d, path, wf, rf)


def incompatibilities(reader: ProtobufSchema, writer: ProtobufSchema) -> list[str]:
    """Why ``reader`` cannot read data written with ``writer`` (Confluent's diff of writer -> reader)."""
    d = _Diff(writer, reader)
    if d.writer.package != d.reader.package:
        d.add("PACKAGE_CHANGED", "", f"The package changed from '{d.writer.package}' to '{d.reader.package}'")
    for name, wmsg in d.wmsgs.items():
        if wmsg.options.map_entry:
            continue
        rmsg = d.rmsgs.get(name)
        if rmsg is None:
            d.add("MESSAGE_REMOVED", name, f"The message {name} was removed")
        else:
            _compare_message(d, name, wmsg, rmsg)
    return d.problems
