"""Builds notebooks/14_schemas.ipynb (unexecuted): a topic in Avro with its schema in the embedded
Schema Registry, a schema change the registry refuses, one it accepts, and an app that reads both
versions.

    .venv/bin/python notebooks/_build.py 14_schemas
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cells import DOWN, SETUP, code, md  # noqa: E402

NOTEBOOKS: dict[str, list] = {}

NOTEBOOKS["14_schemas"] = [
    md("""
# 14 · Schemas: a topic in Avro, and a schema that changes

Topics that other teams write rarely hold JSON: most hold **Avro** (or Protobuf, or JSON Schema)
in the Confluent wire format, with the schemas kept in a **Schema Registry** beside the brokers.
Each value starts with a magic byte and the **id** of the schema it was written with, so a reader
needs no schema of its own: it asks the registry for that id. The registry also guards each topic's
**subject**: a new version of a schema must be **compatible** with the versions before it, so
that the apps reading the topic keep working.

**What you will see:** `%statekit up` starting a registry next to the broker; a topic of clicks
written in Avro, byte by byte; an app that reads it with `value_serde="avro"` and keeps the last
click of each user in a store (the store, and its changelog, hold the Avro bytes as they came);
a schema change the registry refuses and one it accepts; clicks of both versions in one topic,
counted and aggregated by the same app; the stores checked against plain Python.
"""),
    SETUP,
    md("""
## A topic in Avro

`--format avro` writes the `clicks` generator's values in Avro: the first value registers the
generator's schema under the subject `clicks-value` (the topic's name and `-value`: Confluent's
TopicNameStrategy), every value carries the id the registry gave it. The keys (user ids) stay
plain text.
"""),
    code("%statekit produce clicks --generator clicks --format avro --limit 3000 --keys 20 --partitions 4 --wait"),
    code("""
import json
import statekit.serdes
from statekit.kafka import Kafka

registry = statekit.serdes.registry_client()          # confluent-kafka's SchemaRegistryClient
v1 = registry.get_latest_version("clicks-value")
click_v1 = json.loads(v1.schema.schema_str)
print(f"subject clicks-value: version {v1.version}, schema id {v1.schema_id}")
print("fields:", ", ".join(f"{f['name']} ({f['type']})" for f in click_v1["fields"]))

with Kafka() as kafka:
    first = next(iter(kafka.read("clicks", 0, 0, 1))).records[0]
key, value = first[2], first[3]
print(f"\\nthe first record of partition 0: key {key!r}")
print("  header :", value[:5].hex(" "), f"(magic byte 0, schema id {int.from_bytes(value[1:5], 'big')})")
print("  payload:", value[5:].hex(" "))
print("  decoded:", statekit.serdes.avro().from_bytes(value))
"""),
    md("""
## An app that reads it

`value_serde="avro"` is all a reader needs: each record's schema comes from the registry by its id
(fetched once per id, not once per record). The values arrive as Python dicts. The app counts
clicks per page, per country, and keeps each user's last click.
"""),
    code("""
%%statekit app pages --partitions 4
clicks = app.stream("clicks", value_serde="avro")
clicks.group_by(lambda user, click: click["page"]).count(store="page-views")
clicks.group_by(lambda user, click: click.get("country", "unknown")).count(store="by-country")
clicks.group_by_key().reduce(lambda previous, click: click, store="last-click")
"""),
    code("%statekit start pages --watch"),
    code("%statekit wait pages"),
    code("%statekit query pages last-click u0001"),
    md("""
The store `last-click` holds each user's last click as it came from the topic: its bytes are the
Avro bytes, header and all, and so are the records of its changelog. A query decodes them, with the
schema id they carry.
"""),
    code("""
with Kafka() as kafka:
    logged = next(r for chunk in kafka.read(app.changelog_topic("last-click"), 0, 0, 10)
                  for r in chunk.records if r[3] and r[3][:1] == b"\\x00")
print("a changelog record of last-click:", logged[3][:5].hex(" "), "…",
      f"schema id {int.from_bytes(logged[3][1:5], 'big')}: the topic's")
"""),
    md("""
## A change the registry refuses

The clicks' team wants to add the visitor's country. The subject's compatibility level is
**BACKWARD** (the registry's default): an app using the new schema must be able to read every
record written with the old one. A new field **without a default** breaks that — an old record has
no value for it — so the registry refuses the schema, and nothing changes.
"""),
    code("""
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

country_required = dict(click_v1, fields=click_v1["fields"] + [{"name": "country", "type": "string"}])
print("compatibility level:", registry.get_compatibility())
print("compatible with version 1?",
      registry.test_compatibility("clicks-value", Schema(json.dumps(country_required), "AVRO")))
try:
    registry.register_schema("clicks-value", Schema(json.dumps(country_required), "AVRO"))
except SchemaRegistryError as refused:
    print(f"refused (error {refused.error_code}):", refused.error_message[:160])
print("versions of clicks-value:", registry.get_versions("clicks-value"))
"""),
    md("""
## A change it accepts

With a **default**, an old record reads as if it had `"country": "unknown"`: the registry accepts
the schema as version 2, under a new id.
"""),
    code("""
click_v2 = dict(click_v1, fields=click_v1["fields"] + [{"name": "country", "type": "string", "default": "unknown"}])
v2_id = registry.register_schema("clicks-value", Schema(json.dumps(click_v2), "AVRO"))
print("versions of clicks-value:", registry.get_versions("clicks-value"), f"· version 2 has schema id {v2_id}")
"""),
    md("""
Newer producers now write clicks with a country — here 600 clicks of the first ten users.
`statekit.serdes.avro(schema=...)` is the serde that writes: it finds the schema in the subject and
writes its id into each value.
"""),
    code("""
import random
from statekit.datagen import PAGES, Record, produce

rng = random.Random(7)
new_clicks = []
for i in range(600):
    user = f"u{rng.randrange(10):04d}"
    new_clicks.append(Record(user, {"user": user, "page": rng.choice(PAGES), "action": "view",
                                    "session": f"{user}-new", "duration_ms": rng.randrange(9000),
                                    "seq": 3000 + i, "ts": 0, "country": rng.choice(["PT", "BR", "AO", "MZ"])}, 0))
produce("clicks", new_clicks, value_serde=statekit.serdes.avro(schema=click_v2))
print(f"{len(new_clicks)} clicks written with schema id {v2_id}")
"""),
    code("%statekit wait pages"),
    md("""
## One app, both versions

The app did not change and did not restart: each record is read with the schema it was written
with. A version-1 click has no `country` (the app's `.get("country", "unknown")` counts it as
unknown); a version-2 click has one. The last click of the first ten users is now of version 2,
the others' still of version 1: the store holds records of both schema ids side by side.
"""),
    code("""
last = app.query_all("last-click")
last["schema id"] = last.value.map(lambda click: click.schema_id)
last["country"] = last.value.map(lambda click: click.get("country", "—"))
last["page"] = last.value.map(lambda click: click["page"])
print(last.sort_values("key")[["key", "schema id", "country", "page"]].to_string(index=False))
countries = app.query_all("by-country")
print()
print(countries.sort_values("key")[["key", "value"]].to_string(index=False))
"""),
    md("""
## Check against plain Python

The same counts and last clicks, computed from the generator's seeded clicks (version 1) and the
list written above (version 2).
"""),
    code("""
from collections import Counter
from statekit.datagen import generate

old_clicks = [r.value for r in generate("clicks", seed=42, limit=3000, keys=20)]
every_click = old_clicks + [r.value for r in new_clicks]
views = app.query_all("page-views")
assert dict(zip(views.key, views.value)) == dict(Counter(c["page"] for c in every_click))
assert dict(zip(countries.key, countries.value)) == dict(Counter(c.get("country", "unknown") for c in every_click))
expected_last = {c["user"]: c for c in every_click}
assert dict(zip(last.key, last.value)) == expected_last
assert set(last["schema id"]) == {v1.schema_id, v2_id}
print(f"{len(every_click):,} clicks of two schema versions: every count and every last click matches")
print("OK")
"""),
    code("%statekit stop pages"),
    DOWN,
    md("""
## What happened

Every value in the topic carried the id of its schema, and the app read each with the schema it
was written with: it needed no schema of its own and no restart when version 2 arrived. The
registry kept the subject's versions compatible: it refused a field that old records cannot have,
and accepted the same field with a default. The store of last clicks held the records' own Avro
bytes, so its changelog is in the same wire format as the topic and any Avro reader with access to
the registry can read it.
"""),
]
