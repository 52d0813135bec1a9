"""confluent-kafka's Avro, Protobuf and JSON Schema serdes against the embedded registry: each
registers its schema, evolves it, is refused an incompatible change, and reads records written
with the old and the new version."""
from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

PROTO_CONF = {"use.deprecated.format": False}


def schema_id(framed: bytes) -> int:
    assert framed[0] == 0  # Confluent's wire format: magic byte, then the id
    return int.from_bytes(framed[1:5], "big")


def test_avro_register_evolve_refuse_and_read_both(client):
    ctx = SerializationContext("avro-orders", MessageField.VALUE)
    v1 = {"type": "record", "name": "Order", "namespace": "shop",
          "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
    v2 = {**v1, "fields": v1["fields"] + [{"name": "qty", "type": "int", "default": 1}]}
    old = AvroSerializer(client, json.dumps(v1))(dict(id=1, item="tea"), ctx)
    new = AvroSerializer(client, json.dumps(v2))(dict(id=2, item="jam", qty=3), ctx)
    assert client.get_versions("avro-orders-value") == [1, 2]
    assert schema_id(old) == client.get_version("avro-orders-value", 1).schema_id
    assert schema_id(new) == client.get_version("avro-orders-value", 2).schema_id
    # a reader without a schema of its own reads each record with its writer's schema
    plain = AvroDeserializer(client)
    assert plain(old, ctx) == {"id": 1, "item": "tea"}
    assert plain(new, ctx) == {"id": 2, "item": "jam", "qty": 3}
    # a reader on v2 reads a v1 record with qty's default
    assert AvroDeserializer(client, json.dumps(v2))(old, ctx) == {"id": 1, "item": "tea", "qty": 1}
    # dropping `item` without a default is fine BACKWARD (the new reader ignores it)... but not FORWARD
    v3 = {**v1, "fields": [v1["fields"][0], {"name": "qty", "type": "int", "default": 1}]}
    client.set_compatibility("avro-orders-value", "FORWARD")
    with pytest.raises(SchemaRegistryError) as err:
        AvroSerializer(client, json.dumps(v3))(dict(id=3, qty=2), ctx)
    assert err.value.http_status_code == 409
    # changing a field's type (string -> int) is refused at the default level
    client.set_compatibility("avro-orders-value", "BACKWARD")
    bad = {**v2, "fields": [v2["fields"][0], {"name": "item", "type": "int"}, v2["fields"][2]]}
    with pytest.raises(SchemaRegistryError) as err:
        AvroSerializer(client, json.dumps(bad))(dict(id=4, item=5, qty=1), ctx)
    assert (err.value.http_status_code, err.value.error_code) == (409, 409)
    assert client.get_versions("avro-orders-value") == [1, 2]


def clicks_class(with_count: bool, count_type: int = 3, name: str = "clicks.proto"):
    """A generated-at-run-time message class demo.Click (user, at; and n when with_count)."""
    fdp = descriptor_pb2.FileDescriptorProto(name=name, package="demo", syntax="proto3")
    fdp.dependency.append("google/protobuf/timestamp.proto")
    m = fdp.message_type.add(name="Click")
    m.field.add(name="user", number=1, type=9, label=1)
    m.field.add(name="at", number=2, type=11, label=1, type_name=".google.protobuf.Timestamp")
    if with_count:
        m.field.add(name="n", number=3, type=count_type, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("demo.Click"))


def test_protobuf_register_evolve_refuse_and_read_both(client):
    ctx = SerializationContext("pb-clicks", MessageField.VALUE)
    Click1, Click2 = clicks_class(False), clicks_class(True)
    old = ProtobufSerializer(Click1, client, PROTO_CONF)(Click1(user="ann"), ctx)
    new = ProtobufSerializer(Click2, client, PROTO_CONF)(Click2(user="bob", n=7), ctx)
    assert client.get_versions("pb-clicks-value") == [1, 2]
    assert schema_id(new) == client.get_latest_version("pb-clicks-value").schema_id != schema_id(old)
    read_new = ProtobufDeserializer(Click2, PROTO_CONF, client)
    assert (read_new(old, ctx).user, read_new(old, ctx).n) == ("ann", 0)
    assert (read_new(new, ctx).user, read_new(new, ctx).n) == ("bob", 7)
    assert ProtobufDeserializer(Click1, PROTO_CONF, client)(new, ctx).user == "bob"
    # n: int64 -> string is a change of scalar kind: refused
    ClickBad = clicks_class(True, count_type=9)
    with pytest.raises(SchemaRegistryError) as err:
        ProtobufSerializer(ClickBad, client, PROTO_CONF)(ClickBad(user="cy", n="7"), ctx)
    assert err.value.http_status_code == 409
    # int64 -> int32 stays in the same group: accepted
    ClickInt = clicks_class(True, count_type=5)
    ProtobufSerializer(ClickInt, client, PROTO_CONF)(ClickInt(user="di", n=1), ctx)
    assert client.get_versions("pb-clicks-value") == [1, 2, 3]


def test_protobuf_text_and_references(client):
    """.proto text is compiled by protoc; an import resolves against a reference."""
    common = 'syntax = "proto3"; package acme; message Money { int64 cents = 1; string currency = 2; }'
    client.register_schema("acme/money.proto", Schema(common, "PROTOBUF"))
    order = ('syntax = "proto3"; package acme; import "acme/money.proto"; '
             'message Order { string id = 1; acme.Money total = 2; }')
    from confluent_kafka.schema_registry import SchemaReference

    with pytest.raises(SchemaRegistryError) as err:
        client.register_schema("pb-orders-value", Schema(order, "PROTOBUF"))
    assert err.value.error_code == 42201
    sid = client.register_schema("pb-orders-value", Schema(order, "PROTOBUF",
                                                           [SchemaReference("acme/money.proto", "acme/money.proto", 1)]))
    stored = client.get_schema(sid, fmt="serialized")
    fdp = descriptor_pb2.FileDescriptorProto()
    import base64

    fdp.ParseFromString(base64.b64decode(stored.schema_str))
    assert [m.name for m in fdp.message_type] == ["Order"] and list(fdp.dependency) == ["acme/money.proto"]
    # the same schema sent as the descriptor it compiled to is the same schema: same id
    assert client.register_schema("pb-orders-value", Schema(stored.schema_str, "PROTOBUF", stored.references)) == sid


def test_json_schema_register_evolve_refuse_and_read_both(client):
    ctx = SerializationContext("js-users", MessageField.VALUE)
    v1 = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
          "additionalProperties": False}
    v2 = {**v1, "properties": {**v1["properties"], "age": {"type": "integer"}}}  # closed model: optional add ok
    old = JSONSerializer(json.dumps(v1), client)({"name": "ann"}, ctx)
    new = JSONSerializer(json.dumps(v2), client)({"name": "bob", "age": 40}, ctx)
    assert client.get_versions("js-users-value") == [1, 2]
    read = JSONDeserializer(None, schema_registry_client=client)
    assert read(old, ctx) == {"name": "ann"} and read(new, ctx) == {"name": "bob", "age": 40}
    # making age required (no default) is refused; so is narrowing name's type
    v3 = {**v2, "required": ["name", "age"]}
    v4 = {**v2, "properties": {"name": {"type": "integer"}, "age": {"type": "integer"}}}
    for bad in (v3, v4):
        with pytest.raises(SchemaRegistryError) as err:
            JSONSerializer(json.dumps(bad), client)({"name": 1, "age": 2}, ctx)
        assert err.value.http_status_code == 409
    assert client.get_versions("js-users-value") == [1, 2]


def test_compatibility_endpoint(client, registry):
    import httpx

    s = "compat-value"
    v1 = json.dumps({"type": "record", "name": "C", "fields": [{"name": "a", "type": "int"}]})
    v2 = json.dumps({"type": "record", "name": "C", "fields": [{"name": "a", "type": "int"},
                                                               {"name": "b", "type": "int", "default": 0}]})
    v3 = json.dumps({"type": "record", "name": "C", "fields": [{"name": "b", "type": "int", "default": 0}]})
    # nothing registered yet: compatible with "latest"
    assert client.test_compatibility(s, Schema(v1, "AVRO")) is True
    client.register_schema(s, Schema(v1, "AVRO"))
    client.register_schema(s, Schema(v2, "AVRO"))
    # v3 drops a (v1: required) field: BACKWARD fine (non-transitive and transitive), FORWARD not
    assert client.test_compatibility(s, Schema(v3, "AVRO")) is True
    client.set_compatibility(s, "FORWARD_TRANSITIVE")
    r = httpx.post(f"{registry.url}/compatibility/subjects/{s}/versions/1?verbose=true",
                   json={"schema": v3}).json()
    assert r["is_compatible"] is False and any("version 1" in m for m in r["messages"])
    r = httpx.post(f"{registry.url}/compatibility/subjects/{s}/versions?verbose=true", json={"schema": v3}).json()
    assert r["is_compatible"] is False
    r = httpx.post(f"{registry.url}/compatibility/subjects/{s}/versions/9", json={"schema": v3}).json()
    assert r["error_code"] == 40402
    r = httpx.post(f"{registry.url}/compatibility/subjects/{s}/versions/latest?verbose=true",
                   json={"schema": "{oops"}).json()
    assert r["is_compatible"] is False and "Invalid AVRO schema" in r["messages"][0]
