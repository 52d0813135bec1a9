"""AVRO schemas in the registry: parsed by fastavro (the parser confluent-kafka's AvroSerializer
uses, which also checks that a field's default matches its type) and by Apache Avro's own `avro`
package, whose `avro.compatibility` checker applies the schema resolution rules of the Avro
specification (the Java checker Confluent's registry uses is its twin).

Named types from references: each referenced schema is parsed first into the same name space, so
``{"type": "com.acme.Address"}`` resolves when a reference brings ``com.acme.Address``.

What is checked beyond parsing: a union field's default must match the union's first branch (the
Avro specification's rule; fastavro accepts any branch)."""
from __future__ import annotations

import json

from .errors import InvalidSchema


class AvroSchema:
    """A parsed AVRO schema: ``canonical`` is its text as the registry keeps and returns it."""

    schema_type = "AVRO"

    def __init__(self, canonical: str, avro_schema, names):
        self.canonical, self.avro_schema, self.names = canonical, avro_schema, names


_KEY_ORDER = {k: i for i, k in enumerate(
    ("name", "type", "namespace", "doc", "aliases", "fields", "symbols", "items", "values", "size", "default",
     "order", "logicalType", "precision", "scale"))}


def _ordered(obj):
    """Object keys in one fixed order (Avro's own attributes first, then the rest by name), as
    Avro's parser writes a schema back: the order a schema's author chose never makes two differ."""
    if isinstance(obj, list):
        return [_ordered(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    keys = sorted(obj, key=lambda k: (_KEY_ORDER.get(k, len(_KEY_ORDER)), k))
    if obj.get("type") in ("record", "error", "enum", "fixed") and "name" in obj:
        keys.remove("type")
        keys.insert(0, "type")  # {"type": "record", "name": ...}, a field is {"name": ..., "type": ...}
    return {k: (obj[k] if k == "default" else _ordered(obj[k])) for k in keys}


def canonical_text(obj, normalize: bool = False) -> str:
    """Compact JSON in a fixed key order (the registry's stored form): neither whitespace nor the
    order of keys makes two schemas differ (``normalize`` changes nothing more for Avro)."""
    return json.dumps(_ordered(obj), separators=(",", ":"), ensure_ascii=False)


def parse(text: str, references: list, normalize: bool = False) -> AvroSchema:
    """``references``: ``(name, AvroSchema)`` of every referenced schema, dependencies first."""
    import avro.errors
    import avro.name
    import avro.schema
    import fastavro

    try:
        obj = json.loads(text)
    except ValueError as e:
        raise InvalidSchema(f"Invalid AVRO schema: not JSON ({e})") from None
    named: dict = {}
    names = avro.name.Names(validate_names=True)
    try:
        for _name, ref in references:
            ref_obj = json.loads(ref.canonical)
            fastavro.parse_schema(ref_obj, named_schemas=named)
            avro.schema.make_avsc_object(ref_obj, names)
        fastavro.parse_schema(obj, named_schemas=dict(named))
        parsed = avro.schema.make_avsc_object(obj, names)
        _check_union_defaults(obj, named)
    except InvalidSchema:
        raise
    except (avro.errors.AvroException, fastavro.schema.SchemaParseException, fastavro.schema.UnknownType,
            ValueError, TypeError, KeyError, AttributeError) as e:
        raise InvalidSchema(f"Invalid AVRO schema: {_reason(e)}") from None
    return AvroSchema(canonical_text(obj, normalize), parsed, names)


def _reason(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    if type(e).__name__ == "UnknownType":
        text = f"Unknown type: {text}"
    return text.splitlines()[0][:300]


def _check_union_defaults(obj, named: dict) -> None:
    """A union field's default must be a value of the union's first branch."""
    if isinstance(obj, list):
        for branch in obj:
            _check_union_defaults(branch, named)
        return
    if not isinstance(obj, dict):
        return
    for f in obj.get("fields", []) if obj.get("type") == "record" else []:
        ftype = f.get("type")
        if isinstance(ftype, list) and ftype and "default" in f:
            first = ftype[0]
            kind = first if isinstance(first, str) else first.get("type") if isinstance(first, dict) else None
            if kind not in ("bytes", "fixed") and not _valid(f["default"], first, named):
                raise InvalidSchema(f"Invalid AVRO schema: Invalid default for field {f.get('name')}: "
                                    f"{json.dumps(f['default'])} not a {json.dumps(ftype)} (a union's default "
                                    f"must match its first branch)")
        _check_union_defaults(ftype, named)
    for key in ("items", "values"):
        if key in obj:
            _check_union_defaults(obj[key], named)


def _valid(value, schema, named: dict) -> bool:
    import fastavro
    from fastavro.validation import validate

    try:
        return validate(value, fastavro.parse_schema(schema, named_schemas=dict(named)), raise_errors=False)
    except Exception:  # a branch fastavro cannot check on its own (a bare named-type reference)
        return True


def incompatibilities(reader: AvroSchema, writer: AvroSchema) -> list[str]:
    """Why ``reader`` cannot read data written with ``writer`` (empty: it can)."""
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    result = ReaderWriterCompatibilityChecker().get_compatibility(reader.avro_schema, writer.avro_schema)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = sorted({str(getattr(i, "value", i)).upper() for i in result.incompatibilities})
    where = ", ".join(sorted(result.locations)) or "/"
    what = "; ".join(sorted(str(m) for m in result.messages))
    if kinds == ["READER_FIELD_MISSING_DEFAULT_VALUE"]:
        what = f"The reader's field(s) {what} have no default value and are missing in the writer"
    return [f"{{errorType:'{','.join(kinds)}', description:'{what} at path {where}'}}"]
