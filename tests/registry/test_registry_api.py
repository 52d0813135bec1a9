"""The REST API against confluent-kafka's SchemaRegistryClient and raw HTTP: subjects, versions,
ids, schema types, lookups, references, deletes, configs, and Confluent's error codes for bad input
(each bad request changes nothing)."""
from __future__ import annotations

import json

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

CT = "application/vnd.schemaregistry.v1+json"
HTTP = httpx.Client(timeout=60)  # one client: a new one costs ~0.1 s (its TLS context)


def avro(fields, name="Click"):
    return json.dumps({"type": "record", "name": name, "fields": fields})


V1 = avro([{"name": "user", "type": "string"}])
V2 = avro([{"name": "user", "type": "string"}, {"name": "n", "type": "long", "default": 0}])
V_BAD = avro([{"name": "user", "type": "string"}, {"name": "n", "type": "long"}])  # no default: not BACKWARD


def code(call) -> tuple[int, int]:
    with pytest.raises(SchemaRegistryError) as err:
        call()
    return err.value.http_status_code, err.value.error_code


def snapshot(url: str) -> dict:
    """Everything a client can list, to show that a refused request changed nothing."""
    subjects = HTTP.get(f"{url}/subjects", params={"deleted": "true"}).json()
    return {"subjects": subjects,
            "versions": {s: HTTP.get(f"{url}/subjects/{s}/versions", params={"deleted": "true"}).json()
                         for s in subjects},
            "schemas": HTTP.get(f"{url}/schemas", params={"deleted": "true"}).json(),
            "config": HTTP.get(f"{url}/config").json()}


def test_register_get_and_list(client, registry):
    sid = client.register_schema("api-a-value", Schema(V1, "AVRO"))
    assert client.register_schema("api-a-value", Schema(V1, "AVRO")) == sid  # the same schema: the same id
    # the same schema text with other whitespace is the same schema
    assert client.register_schema("api-a-value", Schema(json.dumps(json.loads(V1), indent=3), "AVRO")) == sid
    # ... and so is it with its keys in another order (Avro's parser writes them back in one order)
    reordered = json.dumps({"fields": [{"type": "string", "name": "user"}], "name": "Click", "type": "record"})
    assert client.register_schema("api-a-value", Schema(reordered, "AVRO")) == sid
    sid2 = client.register_schema("api-a-value", Schema(V2, "AVRO"))
    assert sid2 == sid + 1
    assert client.get_versions("api-a-value") == [1, 2]
    latest = client.get_latest_version("api-a-value")
    assert (latest.version, latest.schema_id, json.loads(latest.schema.schema_str)) == (2, sid2, json.loads(V2))
    v1 = client.get_version("api-a-value", 1)
    assert (v1.schema_id, json.loads(v1.schema.schema_str)) == (sid, json.loads(V1))
    assert json.loads(client.get_schema(sid).schema_str) == json.loads(V1)
    # an id is global: asked with any subject (a reader's own naming strategy), it is the same schema
    assert json.loads(client.get_schema(sid, subject_name="api-other").schema_str) == json.loads(V1)
    assert "api-a-value" in client.get_subjects()
    # ids are global: another subject registering V2 gets V2's id, as its version 1
    assert client.register_schema("api-b-value", Schema(V2, "AVRO")) == sid2
    assert client.get_version("api-b-value", 1).schema_id == sid2
    assert sorted(client.get_subjects_by_schema_id(sid2)) == ["api-a-value", "api-b-value"]
    assert sorted((v.subject, v.version) for v in client.get_schema_versions(sid2)) == \
        [("api-a-value", 2), ("api-b-value", 1)]
    assert sorted(client.get_schema_types()) == ["AVRO", "JSON", "PROTOBUF"]
    found = client.lookup_schema("api-a-value", Schema(V1, "AVRO"))
    assert (found.schema_id, found.version, found.subject) == (sid, 1, "api-a-value")
    # raw endpoints: /schema returns the text itself; the content type is the registry's
    r = HTTP.get(f"{registry.url}/subjects/api-a-value/versions/latest/schema")
    assert r.headers["content-type"] == CT and json.loads(r.text) == json.loads(V2)
    assert json.loads(HTTP.get(f"{registry.url}/schemas/ids/{sid}/schema").text) == json.loads(V1)
    body = HTTP.get(f"{registry.url}/subjects/api-a-value/versions/1").json()
    assert body == {"subject": "api-a-value", "version": 1, "id": sid, "schema": json.dumps(json.loads(V1), separators=(",", ":"))}


def test_bad_requests_get_confluents_codes_and_change_nothing(client, registry):
    url = registry.url
    client.register_schema("api-bad-value", Schema(V1, "AVRO"))
    before = snapshot(url)
    assert code(lambda: client.get_versions("api-nope")) == (404, 40401)
    assert code(lambda: client.get_latest_version("api-nope")) == (404, 40401)
    assert code(lambda: client.get_version("api-bad-value", 7)) == (404, 40402)
    assert code(lambda: client.get_schema(987654)) == (404, 40403)
    assert code(lambda: client.lookup_schema("api-bad-value", Schema(V2, "AVRO"))) == (404, 40403)
    assert code(lambda: client.lookup_schema("api-nope", Schema(V2, "AVRO"))) == (404, 40401)
    # an invalid schema of each type, an unknown type, an empty schema
    for schema in (Schema('{"type": "record", "name": "r"}', "AVRO"), Schema("{not json", "AVRO"),
                   Schema('{"type": "recrod", "name": "r", "fields": []}', "AVRO"),
                   Schema(avro([{"name": "a", "type": "int", "default": "x"}]), "AVRO"),
                   Schema(avro([{"name": "a", "type": ["null", "int"], "default": 3}]), "AVRO"),
                   Schema('{"type": 5}', "JSON"), Schema("[1, 2]", "JSON"),
                   Schema('syntax = "proto3"; message M { strng a = 1; }', "PROTOBUF"),
                   Schema("AAAA////", "PROTOBUF"),
                   Schema(V1, "XML"), Schema("", "AVRO")):
        assert code(lambda: client.register_schema("api-bad-value", schema)) == (422, 42201), schema
    # an incompatible change (the default level is BACKWARD)
    status, err = code(lambda: client.register_schema("api-bad-value", Schema(V_BAD, "AVRO")))
    assert (status, err) == (409, 409)
    # a version that is no version, a level that is no level
    r = HTTP.get(f"{url}/subjects/api-bad-value/versions/zero")
    assert (r.status_code, r.json()["error_code"]) == (422, 42202)
    assert HTTP.get(f"{url}/subjects/api-bad-value/versions/0").json()["error_code"] == 42202
    assert code(lambda: client.set_compatibility("api-bad-value", "SIDEWAYS")) == (422, 42203)
    # malformed JSON, a body that is no object, the wrong content type, an unknown path or method
    r = HTTP.post(f"{url}/subjects/api-bad-value/versions", content=b'{"schema": ', headers={"Content-Type": CT})
    assert (r.status_code, r.json()["error_code"]) == (400, 400)
    r = HTTP.post(f"{url}/subjects/api-bad-value/versions", content=b'["x"]', headers={"Content-Type": CT})
    assert (r.status_code, r.json()["error_code"]) == (422, 422)
    r = HTTP.post(f"{url}/subjects/api-bad-value/versions", content=json.dumps({"schema": V2}),
                   headers={"Content-Type": "text/plain"})
    assert (r.status_code, r.json()["error_code"]) == (415, 415)
    assert HTTP.get(f"{url}/nothing/here").json() == {"error_code": 404, "message": "HTTP 404 Not Found"}
    assert HTTP.put(f"{url}/subjects").json()["error_code"] == 405
    assert HTTP.get(f"{url}/subjects", headers={"Accept": "text/html"}).status_code == 406
    r = HTTP.post(f"{url}/subjects/api-bad-value/versions", json={"schema": V2, "references": [
        {"name": "x", "subject": "api-missing", "version": 1}]})
    assert (r.status_code, r.json()["error_code"]) == (422, 42201)
    # a Content-Length that is no number
    import socket

    with socket.create_connection((registry.host, registry.port), timeout=30) as sock:
        sock.sendall(b"POST /subjects/api-bad-value/versions HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 400 ")
    assert snapshot(url) == before


def test_messages_are_confluents(registry):
    r = HTTP.get(f"{registry.url}/subjects/api-msg/versions")
    assert r.json() == {"error_code": 40401, "message": "Subject 'api-msg' not found."}
    r = HTTP.get(f"{registry.url}/schemas/ids/4242")
    assert r.json() == {"error_code": 40403, "message": "Schema 4242 not found"}
    r = HTTP.get(f"{registry.url}/subjects/api-msg/versions/x")
    assert r.json()["message"] == ("The specified version 'x' is not a valid version id. Allowed values are "
                                   'between [1, 2^31-1] and the string "latest"')


def test_soft_and_hard_delete(client, registry):
    url, s = registry.url, "api-del-value"
    V1 = avro([{"name": "user", "type": "string"}], name="Deleted")  # schemas of this test's own
    V2 = avro([{"name": "user", "type": "string"}, {"name": "n", "type": "long", "default": 0}], name="Deleted")
    id1 = client.register_schema(s, Schema(V1, "AVRO"))
    id2 = client.register_schema(s, Schema(V2, "AVRO"))
    # a permanent delete needs a soft delete first
    assert code(lambda: client.delete_version(s, 1, permanent=True)) == (404, 40407)
    assert client.delete_version(s, 1) == 1
    assert code(lambda: client.delete_version(s, 1)) == (404, 40406)
    assert client.get_versions(s) == [2]
    assert HTTP.get(f"{url}/subjects/{s}/versions", params={"deleted": "true"}).json() == [1, 2]
    assert HTTP.get(f"{url}/subjects/{s}/versions", params={"deletedOnly": "true"}).json() == [1]
    assert code(lambda: client.get_version(s, 1)) == (404, 40402)
    assert HTTP.get(f"{url}/subjects/{s}/versions/1", params={"deleted": "true"}).json()["id"] == id1
    assert json.loads(client.get_schema(id1).schema_str) == json.loads(V1)  # soft-deleted: still read by id
    assert code(lambda: client.delete_subject(s, permanent=True)) == (404, 40405)
    assert client.delete_subject(s) == [2]
    assert s not in client.get_subjects()
    assert s in client.get_subjects(deleted=True)
    assert code(lambda: client.delete_subject(s)) == (404, 40404)
    assert code(lambda: client.get_latest_version(s)) == (404, 40401)
    # registering again: the next version after the soft-deleted ones, the same id
    assert client.register_schema(s, Schema(V2, "AVRO")) == id2
    assert client.get_versions(s) == [3]
    assert client.delete_subject(s) == [3]
    # registering V2 again dropped its soft-deleted version 2 (Confluent does the same)
    assert sorted(client.delete_subject(s, permanent=True)) == [1, 3]
    assert s not in client.get_subjects(deleted=True)
    assert code(lambda: client.get_schema(id2)) == (404, 40403)  # no version holds it any more
    # after a permanent delete versions start again at 1; the schema keeps its id
    assert client.register_schema(s, Schema(V2, "AVRO")) == id2
    assert client.get_versions(s) == [1]


def test_references(client, registry):
    url = registry.url
    address = json.dumps({"type": "record", "name": "Address", "namespace": "acme",
                          "fields": [{"name": "city", "type": "string"}]})
    client.register_schema("api-address", Schema(address, "AVRO"))
    person = json.dumps({"type": "record", "name": "Person", "namespace": "acme",
                         "fields": [{"name": "name", "type": "string"}, {"name": "home", "type": "acme.Address"}]})
    # without the reference the named type is unknown
    assert code(lambda: client.register_schema("api-person", Schema(person, "AVRO"))) == (422, 42201)
    ref = SchemaReference("acme.Address", "api-address", 1)
    pid = client.register_schema("api-person", Schema(person, "AVRO", [ref]))
    got = client.get_schema(pid)
    assert [(r.name, r.subject, r.version) for r in got.references] == [("acme.Address", "api-address", 1)]
    assert HTTP.get(f"{url}/subjects/api-address/versions/1/referencedby").json() == [pid]
    # a referenced version cannot be deleted while the referrer lives
    assert code(lambda: client.delete_version("api-address", 1)) == (422, 42206)
    assert code(lambda: client.delete_subject("api-address")) == (422, 42206)
    client.delete_subject("api-person")
    assert HTTP.get(f"{url}/subjects/api-address/versions/1/referencedby").json() == []
    # the soft-deleted referrer still pins it against a permanent delete
    client.delete_subject("api-address")
    assert code(lambda: client.delete_subject("api-address", permanent=True)) == (422, 42206)
    client.delete_subject("api-person", permanent=True)
    assert client.delete_subject("api-address", permanent=True) == [1]


def test_config_levels(fresh_registry):
    c = SchemaRegistryClient({"url": fresh_registry.url})
    url = fresh_registry.url
    assert c.get_compatibility() == "BACKWARD"
    assert code(lambda: c.get_compatibility("cfg")) == (404, 40408)
    assert HTTP.get(f"{url}/config/cfg", params={"defaultToGlobal": "true"}).json() == {"compatibilityLevel": "BACKWARD"}
    assert c.set_compatibility("cfg", "none") == {"compatibility": "NONE"}
    assert c.get_compatibility("cfg") == "NONE"
    c.register_schema("cfg", Schema(V1, "AVRO"))
    assert c.register_schema("cfg", Schema(V_BAD, "AVRO")) > 0  # NONE: anything goes
    assert HTTP.delete(f"{url}/config/cfg").json() == {"compatibilityLevel": "NONE"}
    assert code(lambda: c.get_compatibility("cfg")) == (404, 40408)
    assert c.set_compatibility(level="FULL") == {"compatibility": "FULL"}
    assert c.get_compatibility() == "FULL"
    assert HTTP.delete(f"{url}/config").json() == {"compatibilityLevel": "FULL"}
    assert c.get_compatibility() == "BACKWARD"
    assert HTTP.get(f"{url}/mode").json() == {"mode": "READWRITE"}
    assert HTTP.put(f"{url}/mode", json={"mode": "IMPORT"}).json()["error_code"] == 42204
    # a permanent delete of the subject takes its level with it
    c.set_compatibility("cfg", "FORWARD")
    c.delete_subject("cfg")
    c.delete_subject("cfg", permanent=True)
    assert code(lambda: c.get_compatibility("cfg")) == (404, 40408)


def test_json_references_and_a_transitive_refusal(fresh_registry):
    c = SchemaRegistryClient({"url": fresh_registry.url})
    money = {"type": "object", "properties": {"cents": {"type": "integer"}}, "required": ["cents"]}
    c.register_schema("money.json", Schema(json.dumps(money), "JSON"))
    order = {"type": "object", "properties": {"total": {"$ref": "money.json"}}}
    ref = SchemaReference("money.json", "money.json", 1)
    oid = c.register_schema("orders-value", Schema(json.dumps(order), "JSON", [ref]))
    assert [r.name for r in c.get_schema(oid).references] == ["money.json"]
    # the compatibility check follows the $ref into the referenced schema: cents integer -> number
    # widens (BACKWARD), a referenced schema that narrows it does not
    c.register_schema("money.json", Schema(json.dumps({**money, "properties": {"cents": {"type": "number"}}}), "JSON"))
    assert c.register_schema("orders-value", Schema(json.dumps(order), "JSON", [SchemaReference(
        "money.json", "money.json", 2)])) > oid
    c.set_compatibility("money.json", "NONE")
    c.register_schema("money.json", Schema(json.dumps({**money, "properties": {"cents": {"type": "string"}}}), "JSON"))
    assert code(lambda: c.register_schema("orders-value", Schema(json.dumps(order), "JSON", [SchemaReference(
        "money.json", "money.json", 3)]))) == (409, 409)
    # BACKWARD accepts a schema the latest version can feed but the first cannot; _TRANSITIVE refuses it
    v1 = avro([{"name": "a", "type": "int"}], name="T")
    v2 = avro([{"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": ""}], name="T")
    v3 = avro([{"name": "a", "type": "int"}, {"name": "b", "type": "string"}], name="T")
    for subject, level, accepted in (("t-plain", "BACKWARD", True), ("t-trans", "BACKWARD_TRANSITIVE", False)):
        c.set_compatibility(subject, level)
        c.register_schema(subject, Schema(v1, "AVRO"))
        c.register_schema(subject, Schema(v2, "AVRO"))
        if accepted:
            c.register_schema(subject, Schema(v3, "AVRO"))
        else:
            assert code(lambda: c.register_schema(subject, Schema(v3, "AVRO"))) == (409, 409)
        assert c.get_versions(subject) == ([1, 2, 3] if accepted else [1, 2])
