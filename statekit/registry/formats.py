"""The schema types the registry knows and the compatibility levels, over the three formats'
modules (avro_format, protobuf_format, json_format): each parses a schema text with its
references into an object with ``.canonical`` (the text the registry keeps, answers with and
compares for identity) and answers ``incompatibilities(reader, writer)``.

Levels (Confluent's): BACKWARD, the default, means the new schema reads data written with the
latest version; FORWARD, the latest version reads data written with the new schema; FULL, both;
the _TRANSITIVE ones against every live version, not only the latest; NONE checks nothing."""
from __future__ import annotations

from . import avro_format, json_format, protobuf_format
from .errors import InvalidSchema

FORMATS = {"AVRO": avro_format, "PROTOBUF": protobuf_format, "JSON": json_format}
TYPES = ["JSON", "PROTOBUF", "AVRO"]  # GET /schemas/types answers them in Confluent's order
LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE")
DEFAULT_LEVEL = "BACKWARD"


def parse(schema_type: str, text: str, references: list, normalize: bool = False):
    """``references``: what each format takes for its references (see the format's ``parse``)."""
    fmt = FORMATS.get(schema_type)
    if fmt is None:
        raise InvalidSchema(f"Invalid schema type {schema_type!r}: use one of {', '.join(TYPES)}")
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchema("Empty schema")
    return fmt.parse(text, references, normalize)


def check(level: str, new, previous: list) -> list[str]:
    """Why ``new`` may not follow ``previous`` (``[(version, parsed), ...]``, oldest first) at
    ``level``; empty when it may. Each message names the version it fails against."""
    if level == "NONE" or not previous:
        return []
    against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
    base = level.replace("_TRANSITIVE", "")
    out = []
    for version, old in reversed(against):
        found = []
        if old.schema_type != new.schema_type:
            found.append(f"{{errorType:'SCHEMA_TYPE_CHANGED', description:'The new schema is {new.schema_type}, "
                         f"version {version} is {old.schema_type}'}}")
        else:
            fmt = FORMATS[new.schema_type]
            if base in ("BACKWARD", "FULL"):
                found += [f"{p} (the new schema cannot read data written with version {version})"
                          for p in fmt.incompatibilities(new, old)]
            if base in ("FORWARD", "FULL"):
                found += [f"{p} (version {version} cannot read data written with the new schema)"
                          for p in fmt.incompatibilities(old, new)]
        if found:
            out += found + [f"{{oldSchemaVersion: {version}}}", f"{{oldSchema: '{old.canonical}'}}",
                            f"{{compatibility: '{level}'}}"]
    return out
