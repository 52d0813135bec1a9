"""Serdes for topics with schemas: Avro, Protobuf and JSON Schema in the Confluent wire format.

Reading needs no schema (the writer's comes from the registry by the id each record carries)::

    app.stream("orders", value_serde="avro")          # records come as dicts

Writing a new value needs one, registered under the subject of the topic written to
(``<topic>-value``) unless ``subject=`` says otherwise::

    stream.to("totals", value_serde=statekit.serdes.avro(schema=TOTALS_SCHEMA))

Records read from a topic are written back with the schema id they were read with (a table's
store, a reduce that keeps the latest record): no schema needed there. ``registry=`` points a serde
at a registry of its own (a URL, ``https://user:secret@host``, or a dict of settings such as
``{"url": ..., "basic.auth.user.info": "user:secret"}``); by default it is
``STATEKIT_SCHEMA_REGISTRY_URL``, else ``schema.registry.url`` in ``STATEKIT_KAFKA_CONFIG``, else the
embedded registry that ``%statekit up`` starts.
"""
from __future__ import annotations

from typing import Any

from statekit.schemas.serdes import AvroSerde, JsonSchemaSerde, ProtobufSerde, SchemaDict

__all__ = ["avro", "protobuf", "json_schema", "SchemaDict", "registry_client"]


def avro(schema: Any = None, registry: Any = None, *, subject: str | None = None,
         auto_register: bool = True) -> AvroSerde:
    """Avro keys or values. ``schema``: the Avro schema (JSON text or a dict) new values are
    written with; reading needs none."""
    return AvroSerde(schema, registry, subject=subject, auto_register=auto_register)


def protobuf(schema: Any = None, registry: Any = None, *, message: str | None = None,
             subject: str | None = None, auto_register: bool = True) -> ProtobufSerde:
    """Protobuf keys or values, read as dicts. ``schema``: a generated message class or ``.proto``
    text (``message=`` picks one of its messages; default the first)."""
    return ProtobufSerde(schema, registry, message=message, subject=subject,
                         auto_register=auto_register)


def json_schema(schema: Any = None, registry: Any = None, *, subject: str | None = None,
                auto_register: bool = True) -> JsonSchemaSerde:
    """JSON documents checked against a JSON Schema (text or a dict) when written."""
    return JsonSchemaSerde(schema, registry, subject=subject, auto_register=auto_register)


def registry_client(registry: Any = None):
    """confluent-kafka's ``SchemaRegistryClient`` for the configured registry (or ``registry``):
    subjects, versions, ``test_compatibility``, ``register_schema``... The same client, and cache,
    as the serdes of this process use."""
    from statekit.schemas.client import client_for, settings_for

    return client_for(settings_for(registry))
