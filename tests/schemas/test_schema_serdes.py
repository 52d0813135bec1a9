"""The serdes avro, protobuf and json_schema in the Confluent wire format, against confluent-kafka's
own serializers and its in-memory registry (`mock://`), the round trips also against statekit's
embedded registry: round trips through topologies (the TopologyTestDriver: real processors and
RocksDB stores), stores that hold the wire bytes, records
written back byte for byte, bad payloads refused in one line, and how a serde finds its registry
(URL, credentials, STATEKIT_KAFKA_CONFIG) — checked over HTTP against a small fake registry that
records what it is sent."""
from __future__ import annotations

import base64
import http.server
import json
import pickle
import threading
import uuid

import pytest

import statekit.serdes as S
from statekit.errors import ProcessorError, StatekitError
from statekit.schemas.serdes import SchemaDict, forget_registries
from statekit.stores.serdes import get_serde
from statekit.testing import TopologyTestDriver
from statekit.topology import TopologyBuilder

CLICK = {"type": "record", "name": "Click", "namespace": "demo",
         "fields": [{"name": "user", "type": "string"}, {"name": "page", "type": "string"},
                    {"name": "ms", "type": "long"}]}
TOTAL = {"type": "record", "name": "Total", "fields": [{"name": "user", "type": "string"},
                                                       {"name": "clicks", "type": "long"}]}
ORDER_PROTO = """
syntax = "proto3";
package shop;
message Order {
  string id = 1;
  int64 amount_cents = 2;
  repeated string items = 3;
  Address ship_to = 4;
  Status status = 5;
  map<string, int32> counts = 6;
  message Address { string city = 1; }
  enum Status { NEW = 0; PAID = 1; }
}
"""
SUMMARY_PROTO = """
syntax = "proto3";
package shop;
message Summary { string id = 1; int64 total = 2; int32 items = 3; }
"""
READING = {"type": "object", "properties": {"sensor": {"type": "string"},
                                            "celsius": {"type": "number"}},
           "required": ["sensor", "celsius"], "additionalProperties": False}


@pytest.fixture
def mock_registry(monkeypatch):
    """confluent-kafka's in-memory registry, this process only, fresh for each test."""
    url = f"mock://{uuid.uuid4().hex}"
    monkeypatch.setenv("STATEKIT_SCHEMA_REGISTRY_URL", url)
    forget_registries()
    yield url
    forget_registries()


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """statekit's embedded registry, for the module."""
    from statekit import registry

    handle = registry.start(dir=str(tmp_path_factory.mktemp("registry")), port=0)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(params=["mock", "embedded"])
def any_registry(request, monkeypatch):
    """The round trips run against confluent-kafka's in-memory registry and against statekit's
    embedded one (its Protobuf descriptors, JSON Schema checks and ids, over HTTP)."""
    url = (f"mock://{uuid.uuid4().hex}" if request.param == "mock"
           else request.getfixturevalue("embedded").url)
    monkeypatch.setenv("STATEKIT_SCHEMA_REGISTRY_URL", url)
    forget_registries()
    yield url
    forget_registries()


def confluent(kind: str, url: str):
    from statekit.schemas.client import client_for

    return client_for({"url": url})


def ctx(topic, field="value"):
    from confluent_kafka.serialization import MessageField, SerializationContext

    return SerializationContext(topic, MessageField.VALUE if field == "value" else MessageField.KEY)


def clicks(n=30):
    users = ["ana", "bo", "cy"]
    return [(users[i % 3], {"user": users[i % 3], "page": f"/p{i % 4}", "ms": 100 + i}) for i in range(n)]


# -- Avro ------------------------------------------------------------------------------------------

def test_avro_round_trip_through_a_topology_store_holds_the_wire_bytes(any_registry):
    b = TopologyBuilder()
    src = b.stream("clicks", value_serde=S.avro(CLICK))
    grouped = src.group_by_key()
    grouped.count(store="counts")
    grouped.reduce(lambda old, new: new, store="latest")
    src.map_values(lambda v: {"user": v["user"], "clicks": v["ms"]},
                   value_serde=S.avro(TOTAL)).to("totals")
    records = clicks()
    with TopologyTestDriver(b, "avroapp") as d:
        for k, v in records:
            d.pipe_input("clicks", k, v)
        want_counts = {u: sum(1 for k, _ in records if k == u) for u in {k for k, _ in records}}
        assert dict(d.get_store("counts").all()) == want_counts
        latest = dict(d.get_store("latest").all())
        last = {k: v for k, v in records}
        assert latest == last and all(type(v) is SchemaDict for v in latest.values())
        # the store's bytes are the wire bytes: its changelog holds each record as the topic did
        reader = get_serde("avro")
        log = d.changelog("latest")
        assert log and all(v[0] == 0 for _, v in log)
        assert [reader.from_bytes(v) for _, v in log] == [v for _, v in records]
        assert log[-1][1] == S.avro(CLICK).bind("clicks").to_bytes(records[-1][1])
        assert d.read_output("totals") == [(k, {"user": v["user"], "clicks": v["ms"]})
                                           for k, v in records]
    client = confluent("avro", any_registry)
    assert {"clicks-value", "totals-value"} <= set(client.get_subjects())
    # confluent-kafka's own deserializer reads what the changelog holds, the same records
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    de = AvroDeserializer(client)
    assert [de(v, ctx("avroapp-latest-changelog")) for _, v in log] == [v for _, v in records]


def test_avro_reads_confluents_serializer_and_writes_records_back_byte_for_byte(mock_registry):
    from confluent_kafka.schema_registry.avro import AvroSerializer

    client = confluent("avro", mock_registry)
    ser = AvroSerializer(client, json.dumps(CLICK))
    blobs = [ser(v, ctx("clicks")) for _, v in clicks(10)]
    reader = get_serde("avro")
    decoded = [reader.from_bytes(b) for b in blobs]
    assert decoded == [v for _, v in clicks(10)]
    assert {d.schema_id for d in decoded} == {client.get_latest_version("clicks-value").schema_id}
    assert [reader.to_bytes(d) for d in decoded] == blobs       # no schema needed to write back
    assert pickle.loads(pickle.dumps(decoded[0])).schema_id == decoded[0].schema_id
    # a serde pickles as text, never with its client, and works again on the other side
    used = S.avro(CLICK).bind("clicks")
    used.to_bytes(clicks(1)[0][1])
    again = pickle.loads(pickle.dumps(used))
    assert again == used and again._client is None
    assert again.to_bytes(clicks(1)[0][1]) == blobs[0]


def test_avro_schema_evolution_reads_both_versions_with_the_writers_schema(mock_registry):
    v2 = dict(CLICK, fields=CLICK["fields"] + [{"name": "country", "type": "string",
                                                "default": "??"}])
    w1, w2 = S.avro(CLICK).bind("clicks"), S.avro(v2).bind("clicks")
    a = w1.to_bytes({"user": "ana", "page": "/", "ms": 1})
    b = w2.to_bytes({"user": "bo", "page": "/", "ms": 2, "country": "PT"})
    reader = get_serde("avro")
    assert reader.from_bytes(a) == {"user": "ana", "page": "/", "ms": 1}
    assert reader.from_bytes(b) == {"user": "bo", "page": "/", "ms": 2, "country": "PT"}
    assert reader.from_bytes(a).schema_id != reader.from_bytes(b).schema_id
    assert sorted(confluent("avro", mock_registry).get_versions("clicks-value")) == [1, 2]


def test_avro_writes_primitive_keys_without_a_schema_and_refuses_a_new_record(mock_registry):
    key = S.avro().bind("clicks", key=True)
    kb = key.to_bytes("ana")
    assert kb[0] == 0 and get_serde("avro").from_bytes(kb) == "ana"
    assert confluent("avro", mock_registry).get_latest_version("clicks-key").schema.schema_str
    with pytest.raises(StatekitError, match=r"statekit.serdes.avro\(schema=...\)"):
        S.avro().bind("clicks").to_bytes({"user": "ana"})
    with pytest.raises(StatekitError, match="give it subject="):
        S.avro(CLICK).to_bytes(clicks(1)[0][1])               # no topic, no subject
    with pytest.raises(StatekitError, match="does not fit the avro schema"):
        S.avro(CLICK).bind("clicks").to_bytes({"user": "ana"})
    with pytest.raises(StatekitError, match="not an Avro schema"):
        S.avro({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})


# -- bad payloads: one line naming the topic, partition, offset and what to do --------------------

@pytest.mark.parametrize("payload,expect", [
    (b'{"user":"ana"}', r"begin with 0x7b \('\{'\), not the magic byte 0: it looks like plain JSON"),
    (b"\x00\x00\x00\x03\xe7rest", r"schema id 999 is not in the schema registry at mock://.*point "
                                  r"STATEKIT_SCHEMA_REGISTRY_URL"),
    (b"\x00\x01", "shorter than the 5-byte header"),
])
def test_a_bad_payload_fails_the_batch_in_one_line(mock_registry, payload, expect):
    b = TopologyBuilder()
    b.stream("clicks", value_serde="avro").group_by_key().reduce(lambda a, v: v, store="latest")
    with TopologyTestDriver(b, "bad") as d:
        good = S.avro(CLICK).bind("clicks").to_bytes(clicks(1)[0][1])
        task = d._tasks[0]
        recs = [(0, b"ana", good, 5, 0, 0), (0, b"bo", payload, 6, 0, 1)]
        with pytest.raises(ProcessorError) as err:
            task.run(recs)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("cannot decode a record of clicks partition 0 offset 1 with serdes str/avro: ")
    import re

    assert re.search(expect, msg), msg


def test_a_record_of_another_format_names_the_serde_to_read_it_with(mock_registry):
    pb = S.protobuf(SUMMARY_PROTO).bind("s").to_bytes({"id": "x", "total": 1, "items": 1})
    with pytest.raises(StatekitError, match="is a PROTOBUF schema, not AVRO: read it with the serde 'protobuf'"):
        get_serde("avro").from_bytes(pb)


# -- Protobuf --------------------------------------------------------------------------------------

def test_protobuf_round_trip_through_a_topology(any_registry):
    orders = [("o1", {"id": "o1", "amount_cents": 12_345_678_901, "items": ["tea", "cup"],
                      "ship_to": {"city": "Porto"}, "status": "PAID", "counts": {"tea": 2}}),
              ("o2", {"id": "o2", "amount_cents": 250, "items": [], "status": "NEW"}),
              ("o1", {"id": "o1", "amount_cents": 99, "items": ["pot"], "ship_to": {"city": "Braga"}})]
    b = TopologyBuilder()
    src = b.stream("orders", value_serde=S.protobuf(ORDER_PROTO))
    src.group_by_key().reduce(lambda a, v: v, store="latest")
    src.map_values(lambda o: {"id": o["id"], "total": o["amount_cents"], "items": len(o["items"])},
                   value_serde=S.protobuf(SUMMARY_PROTO)).to("summaries")
    with TopologyTestDriver(b, "pbapp") as d:
        for k, v in orders:
            d.pipe_input("orders", k, v)
        full = {"id": "o1", "amount_cents": 99, "items": ["pot"], "ship_to": {"city": "Braga"},
                "status": "NEW", "counts": {}}
        latest = dict(d.get_store("latest").all())
        assert latest["o1"] == full
        assert latest["o2"] == {"id": "o2", "amount_cents": 250, "items": [], "ship_to": None,
                                "status": "NEW", "counts": {}}
        assert d.read_output("summaries") == [
            ("o1", {"id": "o1", "total": 12_345_678_901, "items": 2}),
            ("o2", {"id": "o2", "total": 250, "items": 0}),
            ("o1", {"id": "o1", "total": 99, "items": 1})]
        log = d.changelog("latest")
        assert log[-1][1] == S.protobuf(ORDER_PROTO).bind("orders").to_bytes(orders[-1][1])
    # confluent-kafka's ProtobufDeserializer, given the message class, reads the same bytes
    from google.protobuf import json_format
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

    cls = S.protobuf(ORDER_PROTO)._message_class()
    de = ProtobufDeserializer(cls, {"use.deprecated.format": False})
    msg = de(log[-1][1], ctx("orders"))
    assert json_format.MessageToDict(msg, preserving_proto_field_name=True)["ship_to"] == {"city": "Braga"}
    assert msg.amount_cents == 99


def test_protobuf_from_a_generated_class_and_a_nested_message(mock_registry):
    from google.protobuf import timestamp_pb2

    ts = S.protobuf(timestamp_pb2.Timestamp).bind("times")
    blob = ts.to_bytes({"seconds": 1_767_225_600, "nanos": 5})
    assert get_serde("protobuf").from_bytes(blob) == {"seconds": 1_767_225_600, "nanos": 5}
    inner = S.protobuf(ORDER_PROTO, message="Order").bind("o")
    with pytest.raises(StatekitError, match="has no message 'Nope'"):
        S.protobuf(ORDER_PROTO, message="Nope")
    assert get_serde("protobuf").from_bytes(inner.to_bytes({"id": "a"}))["id"] == "a"


# -- JSON Schema -----------------------------------------------------------------------------------

def test_json_schema_round_trip_through_a_topology_and_validation(any_registry):
    b = TopologyBuilder()
    src = b.stream("readings", value_serde=S.json_schema(READING))
    src.group_by_key().aggregate(lambda: {"n": 0, "max": None},
                                 lambda k, v, a: {"n": a["n"] + 1,
                                                  "max": v["celsius"] if a["max"] is None
                                                  else max(a["max"], v["celsius"])},
                                 store="stats")
    src.filter(lambda k, v: v["celsius"] > 20).to("hot", value_serde=S.json_schema(READING))
    rows = [("s1", {"sensor": "s1", "celsius": 19.5}), ("s2", {"sensor": "s2", "celsius": 22.0}),
            ("s1", {"sensor": "s1", "celsius": 21.25})]
    with TopologyTestDriver(b, "jsapp") as d:
        for k, v in rows:
            d.pipe_input("readings", k, v)
        assert dict(d.get_store("stats").all()) == {"s1": {"n": 2, "max": 21.25},
                                                   "s2": {"n": 1, "max": 22.0}}
        assert d.read_output("hot") == [("s2", rows[1][1]), ("s1", rows[2][1])]
        with pytest.raises(StatekitError, match="'celsius' is a required property"):
            d.pipe_input("readings", "s3", {"sensor": "s3"})
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer

    client = confluent("json", any_registry)
    blob = S.json_schema(READING).bind("readings").to_bytes(rows[0][1])
    assert JSONDeserializer(json.dumps(READING), schema_registry_client=client)(
        blob, ctx("readings")) == rows[0][1]


# -- where the registry is: settings, credentials, one request per schema --------------------------

class FakeRegistry(http.server.ThreadingHTTPServer):
    """Answers GET /schemas/ids/<id> with one Avro schema, recording each request's path and its
    Authorization header."""

    def __init__(self):
        self.seen: list = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.seen.append((self.path.split("?")[0], self.headers.get("Authorization")))
                if self.path.startswith("/schemas/ids/7"):
                    body = json.dumps({"schema": json.dumps(CLICK), "schemaType": "AVRO"}).encode()
                    self.send_response(200)
                else:
                    body = json.dumps({"error_code": 40403, "message": "Schema not found"}).encode()
                    self.send_response(404)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def fake_registry(monkeypatch):
    monkeypatch.delenv("STATEKIT_SCHEMA_REGISTRY_URL", raising=False)
    monkeypatch.delenv("STATEKIT_KAFKA_CONFIG", raising=False)
    forget_registries()
    srv = FakeRegistry()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        forget_registries()


def framed(record, schema_id=7):
    import io

    from fastavro import parse_schema, schemaless_writer

    fo = io.BytesIO()
    fo.write(b"\x00" + schema_id.to_bytes(4, "big"))
    schemaless_writer(fo, parse_schema(CLICK), record)
    return fo.getvalue()


def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_registry_from_kafka_config_with_credentials_and_one_request_per_schema(fake_registry, monkeypatch):
    monkeypatch.setenv("STATEKIT_KAFKA_CONFIG", json.dumps({
        "bootstrap.servers": "127.0.0.1:9",
        "schema.registry.url": fake_registry.url,
        "basic.auth.credentials.source": "USER_INFO",
        "basic.auth.user.info": "team:s3cret"}))
    records = [v for _, v in clicks(500)]
    reader = get_serde("avro")
    assert [reader.from_bytes(framed(r)) for r in records] == records
    assert fake_registry.seen == [("/schemas/ids/7", basic("team", "s3cret"))]


def test_registry_url_with_credentials_and_per_serde_registry(fake_registry, monkeypatch):
    host = fake_registry.url.split("//")[1]
    monkeypatch.setenv("STATEKIT_SCHEMA_REGISTRY_URL", f"http://env:pw@{host}")
    assert get_serde("avro").from_bytes(framed({"user": "a", "page": "/", "ms": 1}))["user"] == "a"
    own = S.avro(registry={"schema.registry.url": fake_registry.url,
                           "schema.registry.basic.auth.user.info": "own:pw2"})
    own.from_bytes(framed({"user": "b", "page": "/", "ms": 2}))
    assert [a for _, a in fake_registry.seen] == [basic("env", "pw"), basic("own", "pw2")]
    with pytest.raises(StatekitError, match="schema id 8 is not in the schema registry at "
                                            rf"{fake_registry.url}"):
        own.from_bytes(framed({"user": "c", "page": "/", "ms": 3}, schema_id=8))


def test_no_registry_configured_and_bad_settings_are_one_line(fake_registry, monkeypatch):
    with pytest.raises(StatekitError, match=r"no schema registry is running or configured: start "
                                            r"the embedded one with %statekit up"):
        get_serde("avro").from_bytes(framed({"user": "a", "page": "/", "ms": 1}))
    with pytest.raises(StatekitError, match="unknown schema registry setting 'schema.registry.colour'"):
        S.avro(registry={"url": fake_registry.url, "schema.registry.colour": "red"}).settings()
    monkeypatch.setenv("STATEKIT_SCHEMA_REGISTRY_URL", "http://127.0.0.1:9")  # nobody listens
    forget_registries()
    with pytest.raises(StatekitError, match=r"cannot reach the schema registry at http://127.0.0.1:9"):
        S.avro(registry={"url": "http://127.0.0.1:9", "max.retries": 0}).from_bytes(
            framed({"user": "a", "page": "/", "ms": 1}))
