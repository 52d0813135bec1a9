"""The compatibility rules, without a server: tables of changes per schema type and level, and
properties that hold them to what the data says (a verdict of "compatible" must mean fastavro
really resolves every record, and jsonschema really accepts every document)."""
from __future__ import annotations

import io
import json

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekit.registry import avro_format, json_format, protobuf_format
from statekit.registry.formats import check, parse


def A(fields, name="R", **extra):
    return parse("AVRO", json.dumps({"type": "record", "name": name, "fields": fields, **extra}), [])


def f(name, type_, **kw):
    return {"name": name, "type": type_, **kw}


def can_read(fmt, reader, writer) -> bool:
    return not fmt.incompatibilities(reader, writer)


# (old, new, BACKWARD ok, FORWARD ok): BACKWARD = the new schema reads old data; FORWARD = the old reads new
AVRO_TABLE = [
    ("add a field with a default", [f("a", "int")], [f("a", "int"), f("b", "string", default="")], True, True),
    ("add a field without a default", [f("a", "int")], [f("a", "int"), f("b", "string")], False, True),
    ("drop a field without a default", [f("a", "int"), f("b", "string")], [f("a", "int")], True, False),
    ("drop a field with a default", [f("a", "int"), f("b", "string", default="x")], [f("a", "int")], True, True),
    ("int -> long", [f("a", "int")], [f("a", "long")], True, False),
    ("long -> int", [f("a", "long")], [f("a", "int")], False, True),
    ("float -> double", [f("a", "float")], [f("a", "double")], True, False),
    ("string <-> bytes", [f("a", "string")], [f("a", "bytes")], True, True),
    ("string -> int", [f("a", "string")], [f("a", "int")], False, False),
    ("string -> [null, string]", [f("a", "string")], [f("a", ["null", "string"], default=None)], True, False),
    ("enum gains a symbol", [f("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]})],
     [f("e", {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]})], True, False),
    ("enum gains a symbol, old reader has a default",
     [f("e", {"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "A"})],
     [f("e", {"type": "enum", "name": "E", "symbols": ["A", "B", "C"], "default": "A"})], True, True),
    ("array items int -> long", [f("xs", {"type": "array", "items": "int"})],
     [f("xs", {"type": "array", "items": "long"})], True, False),
    ("map values string -> int", [f("m", {"type": "map", "values": "string"})],
     [f("m", {"type": "map", "values": "int"})], False, False),
]


@pytest.mark.parametrize("what,old,new,backward,forward", AVRO_TABLE, ids=[t[0] for t in AVRO_TABLE])
def test_avro_rules(what, old, new, backward, forward):
    o, n = A(old), A(new)
    assert can_read(avro_format, n, o) is backward
    assert can_read(avro_format, o, n) is forward
    assert (check("BACKWARD", n, [(1, o)]) == []) is backward
    assert (check("FORWARD", n, [(1, o)]) == []) is forward
    assert (check("FULL", n, [(1, o)]) == []) is (backward and forward)
    assert check("NONE", n, [(1, o)]) == []


def test_a_renamed_record_needs_an_alias():
    old = A([f("a", "int")], name="Old")
    assert not can_read(avro_format, A([f("a", "int")], name="New"), old)
    assert can_read(avro_format, A([f("a", "int")], name="New", aliases=["Old"]), old)


def test_transitive_levels_check_every_live_version():
    v1 = A([f("a", "int")])
    v2 = A([f("a", "int"), f("b", "string", default="")])
    v3 = A([f("a", "int"), f("b", "string")])  # reads v2 (b is there), not v1 (no b, no default)
    assert check("BACKWARD", v3, [(1, v1), (2, v2)]) == []
    problems = check("BACKWARD_TRANSITIVE", v3, [(1, v1), (2, v2)])
    assert "{oldSchemaVersion: 1}" in problems and "{oldSchemaVersion: 2}" not in problems
    assert "{compatibility: 'BACKWARD_TRANSITIVE'}" in problems
    # FORWARD_TRANSITIVE: every old schema must read the new one's data
    w1 = A([f("a", "int"), f("b", "string")])
    w2 = A([f("a", "int"), f("b", "string", default="")])
    w3 = A([f("a", "int")])  # v2 reads it (b has a default), v1 does not
    assert check("FORWARD", w3, [(1, w1), (2, w2)]) == []
    assert "{oldSchemaVersion: 1}" in check("FORWARD_TRANSITIVE", w3, [(1, w1), (2, w2)])
    assert check("FULL_TRANSITIVE", w3, [(1, w1), (2, w2)]) != []


def test_a_change_of_schema_type_is_incompatible():
    j = parse("JSON", '{"type": "object"}', [])
    problems = check("BACKWARD", j, [(1, A([f("a", "int")]))])
    assert problems and "SCHEMA_TYPE_CHANGED" in problems[0]


# -- JSON Schema ------------------------------------------------------------------------------------
def J(doc):
    return parse("JSON", json.dumps(doc), [])


OBJ = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
       "required": ["name"]}
CLOSED = {**OBJ, "additionalProperties": False}
JSON_TABLE = [
    ("integer -> number", {"type": "integer"}, {"type": "number"}, True, False),
    ("string -> [string, null]", {"type": "string"}, {"type": ["string", "null"]}, True, False),
    ("string -> integer", {"type": "string"}, {"type": "integer"}, False, False),
    ("enum gains a value", {"enum": ["a", "b"]}, {"enum": ["a", "b", "c"]}, True, False),
    ("maxLength loosens", {"type": "string", "maxLength": 5}, {"type": "string", "maxLength": 9}, True, False),
    ("minimum tightens", {"type": "integer", "minimum": 0}, {"type": "integer", "minimum": 1}, False, True),
    ("closed: add an optional property", CLOSED,
     {**CLOSED, "properties": {**CLOSED["properties"], "email": {"type": "string"}}}, True, False),
    ("closed: add a required property", CLOSED,
     {**CLOSED, "properties": {**CLOSED["properties"], "email": {"type": "string"}},
      "required": ["name", "email"]}, False, False),
    ("open: add a property", OBJ, {**OBJ, "properties": {**OBJ["properties"], "email": {"type": "string"}}},
     False, True),
    ("open: drop a property", OBJ, {**OBJ, "properties": {"name": {"type": "string"}}}, True, False),
    ("closed: drop a property", CLOSED, {**CLOSED, "properties": {"name": {"type": "string"}}}, False, True),
    ("make a property required", OBJ, {**OBJ, "required": ["name", "age"]}, False, True),
    ("make a required property with a default", OBJ,
     {**OBJ, "properties": {**OBJ["properties"], "age": {"type": "integer", "default": 0}},
      "required": ["name", "age"]}, True, True),
    ("open -> closed", OBJ, CLOSED, False, True),
    ("items integer -> number", {"type": "array", "items": {"type": "integer"}},
     {"type": "array", "items": {"type": "number"}}, True, False),
    ("oneOf gains a branch", {"oneOf": [{"type": "string"}, {"type": "integer"}]},
     {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}]}, True, False),
    ("a local $ref followed", {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"},
     {"$defs": {"n": {"type": "number"}}, "$ref": "#/$defs/n"}, True, False),
]


@pytest.mark.parametrize("what,old,new,backward,forward", JSON_TABLE, ids=[t[0] for t in JSON_TABLE])
def test_json_rules(what, old, new, backward, forward):
    o, n = J(old), J(new)
    assert can_read(json_format, n, o) is backward
    assert can_read(json_format, o, n) is forward


# -- Protobuf ---------------------------------------------------------------------------------------
def P(fields, package="demo", messages=("M",), oneofs=(), syntax="proto3"):
    """A file with messages; fields: (message, name, number, type, label[, oneof index])."""
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FileDescriptorProto(name="t.proto", package=package, syntax=syntax)
    msgs = {name: fdp.message_type.add(name=name) for name in messages}
    for msg, name in oneofs:
        msgs[msg].oneof_decl.add(name=name)
    for spec in fields:
        msg, name, number, type_, label = spec[:5]
        fld = msgs[msg].field.add(name=name, number=number, type=type_, label=label)
        if len(spec) > 5:
            fld.oneof_index = spec[5]
    import base64

    return parse("PROTOBUF", base64.b64encode(fdp.SerializeToString()).decode(), [])


INT32, INT64, SINT32, STRING, BYTES, ENUMLIKE_UINT32, DOUBLE = 5, 3, 17, 9, 12, 13, 1
OPT, REQ, REP = 1, 2, 3
BASE = [("M", "a", 1, INT32, OPT), ("M", "b", 2, STRING, OPT)]
PROTO_TABLE = [
    ("add a field", BASE, BASE + [("M", "c", 3, DOUBLE, OPT)], True),
    ("drop a field", BASE, BASE[:1], True),
    ("rename a field", BASE, [("M", "x", 1, INT32, OPT), BASE[1]], True),
    ("int32 -> int64", BASE, [("M", "a", 1, INT64, OPT), BASE[1]], True),
    ("int32 -> uint32", BASE, [("M", "a", 1, ENUMLIKE_UINT32, OPT), BASE[1]], True),
    ("int32 -> sint32", BASE, [("M", "a", 1, SINT32, OPT), BASE[1]], False),
    ("int32 -> string", BASE, [("M", "a", 1, STRING, OPT), BASE[1]], False),
    ("string -> bytes", BASE, [BASE[0], ("M", "b", 2, BYTES, OPT)], True),
    ("int32 -> repeated int32", BASE, [("M", "a", 1, INT32, REP), BASE[1]], False),
    ("string -> repeated string", BASE, [BASE[0], ("M", "b", 2, STRING, REP)], True),
]


@pytest.mark.parametrize("what,old,new,ok", PROTO_TABLE, ids=[t[0] for t in PROTO_TABLE])
def test_protobuf_rules(what, old, new, ok):
    o, n = P(old), P(new)
    assert can_read(protobuf_format, n, o) is ok
    assert can_read(protobuf_format, o, n) is ok  # Confluent's protobuf changes are symmetric here


def test_protobuf_messages_packages_required_and_oneofs():
    two = P(BASE + [("N", "z", 1, INT32, OPT)], messages=("M", "N"))
    assert not can_read(protobuf_format, P(BASE), two)  # N removed
    assert can_read(protobuf_format, two, P(BASE))  # N added
    assert not can_read(protobuf_format, P(BASE, package="other"), P(BASE))
    req = P(BASE + [("M", "r", 3, INT32, REQ)], syntax="proto2")
    assert not can_read(protobuf_format, req, P(BASE, syntax="proto2"))  # a required field added
    assert not can_read(protobuf_format, P(BASE, syntax="proto2"), req)  # ... or removed
    one_in = P([("M", "a", 1, INT32, OPT, 0), BASE[1]], oneofs=[("M", "o")])
    assert can_read(protobuf_format, one_in, P(BASE))  # one field moved into a new oneof
    both_in = P([("M", "a", 1, INT32, OPT, 0), ("M", "b", 2, STRING, OPT, 0)], oneofs=[("M", "o")])
    assert not can_read(protobuf_format, both_in, P(BASE))  # two independent fields made exclusive
    assert not can_read(protobuf_format, P([BASE[1]]), both_in)  # a member of a surviving... removed oneof
    assert can_read(protobuf_format, P(BASE), both_in)  # the oneof dissolved, members top-level


# -- properties: a verdict of "compatible" holds for the data ---------------------------------------
AVRO_TYPES = ["int", "long", "float", "double", "string", "bytes", "boolean", ["null", "int"], ["null", "string"]]
DEFAULTS = {"int": 0, "long": 0, "float": 0.0, "double": 0.0, "string": "", "bytes": "", "boolean": False}


@st.composite
def avro_record(draw):
    names = draw(st.lists(st.sampled_from("abcde"), unique=True, max_size=5))
    fields = []
    for n in names:
        t = draw(st.sampled_from(AVRO_TYPES))
        fld = {"name": n, "type": t}
        if draw(st.booleans()):
            fld["default"] = None if isinstance(t, list) else DEFAULTS[t]
        fields.append(fld)
    return {"type": "record", "name": "R", "fields": fields}


def _value(t, draw):
    if isinstance(t, list):
        return draw(st.sampled_from([None, 7 if "int" in t else "s"]))
    return {"int": 3, "long": 2 ** 40, "float": 1.5, "double": 2.25, "string": "x", "bytes": b"y",
            "boolean": True}[t]


@settings(max_examples=150)
@given(avro_record(), avro_record(), st.data())
def test_avro_verdict_matches_fastavros_resolution(writer, reader, data):
    w, r = parse("AVRO", json.dumps(writer), []), parse("AVRO", json.dumps(reader), [])
    compatible = can_read(avro_format, r, w)
    record = {fld["name"]: _value(fld["type"], data.draw) for fld in writer["fields"]}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer), record)
    buf.seek(0)
    try:
        fastavro.schemaless_reader(buf, fastavro.parse_schema(writer), fastavro.parse_schema(reader))
        read_ok = True
    except Exception:
        read_ok = False
    if compatible:
        assert read_ok, (writer, reader, record)
    # fastavro failing on a record means a record the reader cannot read exists: incompatible
    if not read_ok:
        assert not compatible


JSON_TYPES = ["string", "integer", "number", "boolean"]


@st.composite
def json_object(draw):
    props = {n: {"type": draw(st.sampled_from(JSON_TYPES))}
             for n in draw(st.lists(st.sampled_from("abcd"), unique=True, max_size=4))}
    doc = {"type": "object", "properties": props}
    if props:
        doc["required"] = draw(st.lists(st.sampled_from(sorted(props)), unique=True))
    if draw(st.booleans()):
        doc["additionalProperties"] = False
    return doc


@settings(max_examples=150)
@given(json_object(), json_object(), st.data())
def test_json_verdict_holds_for_documents_the_writer_accepts(writer, reader, data):
    import jsonschema

    # built without parse(): the property is about the comparison (the meta-schema check would triple its time)
    w, r = (json_format.JsonSchema(json.dumps(d), d, {}) for d in (writer, reader))
    if not can_read(json_format, r, w):
        return
    sample = {"string": "s", "integer": 3, "number": 1.5, "boolean": True}
    doc = {}
    for name, spec in writer["properties"].items():
        if name in writer.get("required", []) or data.draw(st.booleans()):
            doc[name] = sample[spec["type"]]
    if writer.get("additionalProperties") is not False and data.draw(st.booleans()):
        extra = data.draw(st.sampled_from("abcdxyz"))
        if extra not in writer["properties"]:
            doc[extra] = data.draw(st.sampled_from(list(sample.values())))
    jsonschema.Draft202012Validator(writer).validate(doc)
    jsonschema.Draft202012Validator(reader).validate(doc)  # compatible: the reader accepts it too


def test_protobuf_follows_a_message_type_into_its_reference():
    """Order.total is an acme.Money from a referenced file: a new version of that file that changes
    Money's field kind makes Order incompatible; one that adds a field does not."""
    def money(kind, extra=False):
        fields = [("Money", "cents", 1, kind, OPT)] + ([("Money", "currency", 2, STRING, OPT)] if extra else [])
        return P(fields, package="acme", messages=("Money",))

    def order(ref):
        from google.protobuf import descriptor_pb2
        import base64

        fdp = descriptor_pb2.FileDescriptorProto(name="order.proto", package="shop", syntax="proto3",
                                                 dependency=["acme/money.proto"])
        m = fdp.message_type.add(name="Order")
        m.field.add(name="total", number=1, type=11, label=OPT, type_name=".acme.Money")
        return parse("PROTOBUF", base64.b64encode(fdp.SerializeToString()).decode(), [("acme/money.proto", ref)])

    v1 = order(money(INT64))
    assert can_read(protobuf_format, order(money(INT64, extra=True)), v1)
    assert can_read(protobuf_format, order(money(INT32)), v1)  # same scalar group
    assert not can_read(protobuf_format, order(money(STRING)), v1)
