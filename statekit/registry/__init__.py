"""statekit's embedded Schema Registry: the REST API of Confluent's Schema Registry (subjects,
versions, schemas by id, AVRO / PROTOBUF / JSON schemas, references, compatibility levels and
checks, soft and hard deletes, Confluent's error codes), so confluent-kafka's SchemaRegistryClient
and its Avro / Protobuf / JSON Schema serdes work against it with no setup.

It runs as a child process beside the embedded broker and keeps its data in a file in the broker's
data directory. Modules: process.py (the child process, ``DIR/registry.json``), api.py (HTTP and
routing), store.py (the state, its log file and the API's rules), formats.py (schema types and
compatibility levels), avro_format.py / protobuf_format.py / json_format.py (parsing and
reader/writer compatibility of each type), errors.py (Confluent's error codes)."""
from __future__ import annotations

import os

from .process import RegistryHandle, default_dir, running_info, start, stop

__all__ = ["start", "stop", "status", "client_config", "RegistryHandle", "default_dir"]


def status(dir: str | None = None) -> dict | None:
    """registry.json of the registry running on dir (``pid``, ``host``, ``port``, ``url``, ``dir``,
    ``auth``), or None."""
    return running_info(os.path.abspath(dir or default_dir()))


def client_config(dir: str | None = None) -> dict | None:
    """The settings confluent-kafka's ``SchemaRegistryClient`` takes for the registry running on dir
    (``url``, and ``basic.auth.user.info`` when it requires auth), or None; never starts one (for
    processes that must not: Spark's workers, an app's instances)."""
    data_dir = os.path.abspath(dir or default_dir())
    info = running_info(data_dir)
    return None if info is None else RegistryHandle(data_dir, info, owned=False).client_config
