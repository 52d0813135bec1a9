"""Schema checks kafka-python's decoder does not make.

kafka-python decodes a length of -1 as None for any string, bytes or array field, nullable or not.
A request carrying such a null must be refused as malformed before a handler trips over it."""
from __future__ import annotations


def illegal_null(container, version: int) -> str | None:
    """The path of a field that decoded as null although the schema says it cannot be (kafka-python
    decodes a length of -1 as None for any string, bytes or array), else None."""
    struct_ = container._struct
    for field in struct_._fields:
        if not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        value = getattr(container, field.name)
        if value is None:
            if not field.nullable_for_version_q(version) and (
                    field.is_array() or field.is_struct() or field.type_str in ("string", "bytes", "records")):
                return field.name
            continue
        if field.is_struct_array():
            for item in value:
                bad = illegal_null(item, version)
                if bad:
                    return f"{field.name}.{bad}"
        elif field.is_array():
            if any(item is None for item in value):
                return f"{field.name}[]"
        elif field.is_struct():
            bad = illegal_null(value, version)
            if bad:
                return f"{field.name}.{bad}"
    return None
