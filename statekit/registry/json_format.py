"""JSON schemas in the registry: checked against their draft's meta-schema by `jsonschema`, and
compared for compatibility by a subset of Confluent's strict rules for JSON Schema.

A reader can read what a writer wrote when every document valid under the writer is valid under
the reader. Checked: ``type`` (a reader may add types; ``integer`` -> ``number`` widens),
``enum`` and ``const`` (a reader may add values), ``properties``, ``required`` and the content
model (``additionalProperties``: open when absent or true, closed when false, partially open when
a schema): a property the reader adds is fine when the writer's model is closed and the property
is optional or has a default, or when it has an empty schema; a property the reader drops is fine
when the reader's model is open (or covers it); a property newly required needs a default; string,
number, array and object bounds (``maxLength``, ``minimum``, ``exclusiveMaximum``, ``multipleOf``,
``maxItems``, ``uniqueItems``, ``maxProperties``, ...) may only loosen; ``items`` (one schema) and
``additionalProperties`` schemas recursively; ``anyOf``/``oneOf`` (every writer branch must be
readable by a reader branch) and ``allOf`` (the reader may drop branches); local ``$ref``s
(``#/...``) and ``$ref``s to references by name are followed. Other keywords (``pattern`` changes,
``patternProperties``, ``if``/``then``, ``not``, tuples, ``dependencies``) are compared as equal or
not: a change to them is reported as incompatible."""
from __future__ import annotations

import json

from .errors import InvalidSchema

_BOUNDS_UP = ("maxLength", "maximum", "exclusiveMaximum", "maxItems", "maxProperties", "maxContains")
_BOUNDS_DOWN = ("minLength", "minimum", "exclusiveMinimum", "minItems", "minProperties", "minContains")
_HANDLED = {"type", "enum", "const", "properties", "required", "additionalProperties", "items", "anyOf",
            "oneOf", "allOf", "$ref", "multipleOf", "uniqueItems", "title", "description", "default",
            "$id", "id", "$schema", "$comment", "examples", "definitions", "$defs", "format", "readOnly",
            "writeOnly", "deprecated", "pattern", *_BOUNDS_UP, *_BOUNDS_DOWN}


class JsonSchema:
    schema_type = "JSON"

    def __init__(self, canonical: str, doc, refs: dict):
        self.canonical, self.doc, self.refs = canonical, doc, refs  # refs: {reference name: document}


def parse(text: str, references: list, normalize: bool = False) -> JsonSchema:
    """``references``: ``(name, JsonSchema)`` of every referenced schema."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InvalidSchema(f"Invalid JSON schema: not JSON ({e})") from None
    if not isinstance(doc, (dict, bool)):
        raise InvalidSchema("Invalid JSON schema: a JSON schema is an object or a boolean, not "
                            f"{type(doc).__name__}")
    try:
        validator_for(doc).check_schema(doc)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        raise InvalidSchema(f"Invalid JSON schema: {e.message}" + (f" at #/{where}" if where else "")) from None
    refs = {name: ref.doc for name, ref in references}
    canonical = json.dumps(doc, separators=(",", ":"), sort_keys=normalize, ensure_ascii=False)
    return JsonSchema(canonical, doc, refs)


# -------------------------------------------------------------------------------- compatibility
class _Ctx:
    def __init__(self, writer: JsonSchema, reader: JsonSchema):
        self.writer, self.reader = writer, reader
        self.problems: list[str] = []
        self.seen: set = set()

    def add(self, kind: str, path: str, what: str) -> None:
        self.problems.append(f"{{errorType:'{kind}', description:'{what} at path #{path or '/'}'}}")

    def resolve(self, schema, side: str):
        """Follow $ref (local pointers and references by name) until a schema without one."""
        root = self.writer if side == "w" else self.reader
        hops = 0
        while isinstance(schema, dict) and "$ref" in schema and hops < 32:
            ref = schema["$ref"]
            target = _pointer(root.doc, ref) if ref.startswith("#") else None
            if target is None and not ref.startswith("#"):
                name, _, frag = ref.partition("#")
                if name in root.refs:
                    target = _pointer(root.refs[name], "#" + frag) if frag else root.refs[name]
            if target is None:
                return schema
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest} if isinstance(target, dict) and rest else target
            hops += 1
        return schema


def _pointer(doc, ref: str):
    node = doc
    for part in [p for p in ref.lstrip("#").split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _types(schema) -> set | None:
    t = schema.get("type")
    if t is None:
        return None
    return set(t) if isinstance(t, list) else {t}


def _is_empty(schema) -> bool:
    return schema is True or schema == {}


def _open(schema):
    """The content model: 'open', 'closed' or the additionalProperties schema (partially open)."""
    ap = schema.get("additionalProperties", True)
    if ap is True or ap == {}:
        return "open"
    if ap is False:
        return "closed"
    return ap


def _compare(ctx: _Ctx, path: str, w, r) -> None:
    w, r = ctx.resolve(w, "w"), ctx.resolve(r, "r")
    key = (id(w), id(r))
    if key in ctx.seen:
        return
    ctx.seen.add(key)
    if r is True or r == {} or (w == r and not ctx.writer.refs and not ctx.reader.refs):
        return  # (equal texts may still $ref different versions of a referenced schema)
    if w is False:
        return
    if r is False:
        ctx.add("SCHEMA_REMOVED_TO_FALSE", path, "The new schema accepts nothing")
        return
    if w is True or w == {}:
        ctx.add("TYPE_NARROWED", path, "The old schema accepted anything, the new one does not")
        return
    for comb in ("anyOf", "oneOf"):
        if comb in w or comb in r:
            _compare_sum(ctx, path, comb, w, r)
            return
    if "allOf" in w or "allOf" in r:
        _compare_product(ctx, path, w, r)
        return
    wt, rt = _types(w), _types(r)
    if rt is not None:
        widened = set(rt) | ({"integer"} if "number" in rt else set())
        if wt is None or not wt <= widened:
            ctx.add("TYPE_NARROWED" if wt and wt & widened else "TYPE_CHANGED", path,
                    f"The type changed from {sorted(wt) if wt else 'any'} to {sorted(rt)}")
            return
    if "enum" in r and ("enum" not in w or not all(v in r["enum"] for v in w["enum"])):
        ctx.add("ENUM_ARRAY_NARROWED" if "enum" in w else "ENUM_ARRAY_ADDED", path, "The new enum lacks old values")
    if "const" in r and w.get("const", object()) != r["const"] and not ("enum" in w and w["enum"] == [r["const"]]):
        ctx.add("CONST_CHANGED", path, "The const value changed")
    _compare_bounds(ctx, path, w, r)
    if (wt is None or wt & {"object"}) and (rt is None or "object" in rt):
        _compare_object(ctx, path, w, r)
    if "items" in r and isinstance(r["items"], (dict, bool)):
        wi = w.get("items", True)
        if isinstance(wi, (dict, bool)):
            _compare(ctx, path + "/items", wi, r["items"])
    for k in sorted((set(w) | set(r)) - _HANDLED):
        if w.get(k) != r.get(k):
            ctx.add("KEYWORD_CHANGED", path, f"The keyword {k} changed (not compared further)")
    if w.get("pattern") != r.get("pattern") and "pattern" in r:
        ctx.add("PATTERN_CHANGED" if "pattern" in w else "PATTERN_ADDED", path, "The pattern changed")


def _compare_bounds(ctx: _Ctx, path: str, w, r) -> None:
    for k in _BOUNDS_UP:
        if k in r and (k not in w or _num(w[k]) > _num(r[k])):
            ctx.add(k.upper() + ("_DECREASED" if k in w else "_ADDED"), path, f"{k} is tighter")
    for k in _BOUNDS_DOWN:
        if k in r and (k not in w or _num(w[k]) < _num(r[k])):
            ctx.add(k.upper() + ("_INCREASED" if k in w else "_ADDED"), path, f"{k} is tighter")
    if "multipleOf" in r:
        wm, rm = w.get("multipleOf"), r["multipleOf"]
        if wm is None or (wm / rm) != int(wm / rm):
            ctx.add("MULTIPLE_OF_CHANGED", path, "multipleOf is tighter")
    if r.get("uniqueItems") and not w.get("uniqueItems"):
        ctx.add("UNIQUE_ITEMS_ADDED", path, "uniqueItems was added")


def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _compare_object(ctx: _Ctx, path: str, w, r) -> None:
    wp, rp = w.get("properties", {}), r.get("properties", {})
    wreq, rreq = set(w.get("required", [])), set(r.get("required", []))
    wmodel, rmodel = _open(w), _open(r)
    for name in sorted(set(wp) | set(rp)):
        p = f"{path}/properties/{name}"
        if name not in wp:  # the reader adds it
            prop = rp[name]
            has_default = isinstance(prop, dict) and "default" in prop
            if wmodel == "closed":
                if name in rreq and not has_default:
                    ctx.add("REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL", p, "A required property was added")
            elif wmodel == "open":
                if not _is_empty(prop):
                    ctx.add("PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL", p,
                            "A property was added while the old schema allowed any additional property")
            else:
                sub = _Ctx(ctx.writer, ctx.reader)
                _compare(sub, p, wmodel, prop)
                if sub.problems:
                    ctx.add("PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", p,
                            "A property was added that the old additionalProperties schema does not cover")
        elif name not in rp:  # the reader drops it
            if rmodel == "closed" and wp[name] is not False:
                ctx.add("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL", p,
                        "A property was removed while the new schema allows no additional property")
            elif rmodel not in ("open", "closed"):
                _compare(ctx, p, wp[name], rmodel)
        else:
            _compare(ctx, p, wp[name], rp[name])
    for name in sorted(rreq - wreq):
        prop = rp.get(name)
        if not (isinstance(prop, dict) and "default" in prop):
            ctx.add("REQUIRED_ATTRIBUTE_ADDED", f"{path}/required/{name}", f"The property {name} became required")
    if wmodel != rmodel:
        if rmodel == "closed" or (wmodel == "open" and rmodel != "open"):
            if rmodel == "closed":
                ctx.add("ADDITIONAL_PROPERTIES_REMOVED", path, "The new schema allows no additional property")
            else:
                ctx.add("ADDITIONAL_PROPERTIES_NARROWED", path, "The new schema narrows additional properties")
        elif wmodel not in ("open", "closed") and rmodel not in ("open", "closed"):
            _compare(ctx, path + "/additionalProperties", wmodel, rmodel)


def _compare_sum(ctx: _Ctx, path: str, comb: str, w, r) -> None:
    wb = w.get("anyOf", w.get("oneOf", [w]))
    rb = r.get("anyOf", r.get("oneOf", [r]))
    if "oneOf" in r and "oneOf" not in w and len(rb) > 1 and "anyOf" in w:
        ctx.add("COMBINED_TYPE_CHANGED", path, "anyOf became oneOf")
        return
    for i, branch in enumerate(wb):
        if not any(not _problems(ctx, f"{path}/{comb}/{i}", branch, rbr) for rbr in rb):
            ctx.add("SUM_TYPE_NARROWED", f"{path}/{comb}/{i}", "No branch of the new schema reads this old branch")


def _compare_product(ctx: _Ctx, path: str, w, r) -> None:
    wb = w.get("allOf", [w])
    for j, rbr in enumerate(r.get("allOf", [r])):
        if not any(not _problems(ctx, f"{path}/allOf/{j}", wbr, rbr) for wbr in wb):
            ctx.add("PRODUCT_TYPE_EXTENDED", f"{path}/allOf/{j}", "The new schema adds a constraint")


def _problems(ctx: _Ctx, path: str, w, r) -> list[str]:
    sub = _Ctx(ctx.writer, ctx.reader)
    _compare(sub, path, w, r)
    return sub.problems


def incompatibilities(reader: JsonSchema, writer: JsonSchema) -> list[str]:
    """Why ``reader`` may refuse a document valid under ``writer`` (empty: it accepts them all)."""
    ctx = _Ctx(writer, reader)
    _compare(ctx, "", writer.doc, reader.doc)
    return ctx.problems
