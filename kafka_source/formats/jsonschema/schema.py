"""JSON Schemas and their types: what a schema's text means as a Spark and Arrow type (the reader
side), and the schema of a Spark type (the writer side, :func:`json_schema_of`).

The reader schema's type:

* ``object`` with ``properties`` -- struct, the properties in order; ``array`` with ``items``
  -- array; ``string`` -- string (``format: date-time`` -- timestamp); ``integer`` -- long;
  ``number`` -- double; ``boolean``; ``enum``/``const`` of strings -- string;
* ``$ref`` to ``#/definitions/...`` or ``#/$defs/...`` is followed; a type made nullable by a
  ``null`` alternative (``"type": ["string", "null"]``, ``oneOf``/``anyOf`` with
  ``{"type": "null"}``) is that type; ``["integer", "number"]`` is double.

Every field is nullable (a JSON document may leave any property out). A schema the mapping cannot
type -- a free-form object (``additionalProperties`` without ``properties``), a union of
different types, a recursive ``$ref`` -- is an error naming where, when the query is defined.
"""

from __future__ import annotations

import json

import pyarrow as pa


class JsonSchemaError(ValueError):
    """A JSON Schema that has no Spark type here."""


def parse_json_schema(text: str) -> dict:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonSchemaError(f"not JSON: {e}") from None
    if not isinstance(schema, dict):
        raise JsonSchemaError("a JSON Schema is a JSON object")
    return schema


def _resolve(schema: dict, root: dict, where: str, seen: tuple) -> tuple[dict, tuple]:
    ref = schema.get("$ref")
    if ref is None:
        return schema, seen
    if ref in seen:
        raise JsonSchemaError(f"{where}: the schema is recursive ({ref}); a recursive type has "
                              "no Spark type")
    node = root
    if not ref.startswith("#"):
        raise JsonSchemaError(f"{where}: only references inside the schema are followed, not "
                              f"{ref!r}")
    for part in ref.lstrip("#/").split("/"):
        if part:
            if not isinstance(node, dict) or part not in node:
                raise JsonSchemaError(f"{where}: {ref!r} names nothing in the schema")
            node = node[part]
    return _resolve(node, root, where, seen + (ref,))


def _types(schema: dict, root: dict, where: str, seen: tuple) -> tuple[pa.DataType, object]:
    """(Arrow type, Spark type) of a (sub)schema."""
    from pyspark.sql import types as T

    schema, seen = _resolve(schema, root, where, seen)
    for key in ("oneOf", "anyOf"):
        if key in schema:
            options = [_resolve(s, root, where, seen)[0] for s in schema[key]]
            others = [s for s in options if s.get("type") != "null"]
            if len(others) != 1:
                raise JsonSchemaError(f"{where}: {key} of {len(others)} non-null alternatives "
                                      "has no single Spark type")
            return _types(others[0], root, where, seen)
    t = schema.get("type")
    if isinstance(t, list):
        others = [x for x in t if x != "null"]
        if sorted(others) == ["integer", "number"]:
            t = "number"
        elif len(others) == 1:
            t = others[0]
        else:
            raise JsonSchemaError(f"{where}: a value of types {others} has no single Spark type")
    if t is None:
        if "properties" in schema:
            t = "object"
        elif "items" in schema:
            t = "array"
        elif "enum" in schema or "const" in schema:
            t = "string"
        else:
            raise JsonSchemaError(f"{where}: no type (a schema that allows any value has no "
                                  "Spark type)")
    if t == "object":
        props = schema.get("properties")
        if not props:
            raise JsonSchemaError(f"{where}: an object without properties (free-form, or a map "
                                  "through additionalProperties) has no struct type here")
        fields = [(name, _types(sub, root, f"{where}.{name}", seen))
                  for name, sub in props.items()]
        return (pa.struct([pa.field(n, a, nullable=True) for n, (a, _) in fields]),
                T.StructType([T.StructField(n, s, True) for n, (_, s) in fields]))
    if t == "array":
        items = schema.get("items")
        if not isinstance(items, dict):
            raise JsonSchemaError(f"{where}: an array needs one 'items' schema")
        a, s = _types(items, root, f"{where}[]", seen)
        return pa.list_(pa.field("element", a, nullable=True)), T.ArrayType(s, True)
    if t == "string":
        if schema.get("format") == "date-time":
            return pa.timestamp("us", tz="UTC"), T.TimestampType()
        return pa.string(), T.StringType()
    simple = {"integer": (pa.int64(), T.LongType()), "number": (pa.float64(), T.DoubleType()),
              "boolean": (pa.bool_(), T.BooleanType()), "null": (pa.null(), T.NullType())}
    if t in simple:
        return simple[t]
    raise JsonSchemaError(f"{where}: unknown type {t!r}")


def json_types(text: str) -> tuple[pa.DataType, object]:
    """(Arrow type, Spark type) of a JSON Schema's text: the column's types."""
    schema = parse_json_schema(text)
    return _types(schema, schema, "the schema", ())




# --- the writer side: a Spark type's JSON Schema -------------------------------------------------

DRAFT = "http://json-schema.org/draft-07/schema#"


def json_schema_of(dt, title: str | None = None) -> dict:
    """The JSON Schema (draft-07) of the documents the sink writes for a column of Spark type
    ``dt``; ``title`` names the top-level object (the record name that ``RecordNameStrategy``
    takes, as Confluent's serializer reads it from ``title``).

    Objects are closed (``additionalProperties: false``) and list their non-nullable fields as
    ``required``; a nullable field is ``oneOf`` null and its type. A closed object is what makes
    schema evolution work under the registry's compatibility checks: a new optional property is a
    compatible change of a closed object, and an incompatible one of an open object (whose old
    documents could hold that property with any type)."""
    schema = _json_of(dt)
    schema = {"$schema": DRAFT, **({"title": title} if title else {}), **schema}
    return schema


def _nullable(schema: dict, nullable: bool) -> dict:
    return {"oneOf": [{"type": "null"}, schema]} if nullable else schema


def _json_of(dt) -> dict:
    from pyspark.sql import types as T

    if isinstance(dt, T.StructType):
        return {"type": "object",
                "properties": {f.name: _nullable(_json_of(f.dataType), f.nullable)
                               for f in dt.fields},
                "required": [f.name for f in dt.fields if not f.nullable],
                "additionalProperties": False}
    if isinstance(dt, T.ArrayType):
        return {"type": "array", "items": _nullable(_json_of(dt.elementType), dt.containsNull)}
    if isinstance(dt, T.MapType):
        if not isinstance(dt.keyType, (T.StringType, T.ByteType, T.ShortType, T.IntegerType,
                                       T.LongType)):
            raise JsonSchemaError(f"a map with {dt.keyType.simpleString()} keys has no JSON "
                                  "object type (keys are strings)")
        return {"type": "object",
                "additionalProperties": _nullable(_json_of(dt.valueType), dt.valueContainsNull)}
    if isinstance(dt, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return {"type": "integer"}
    if isinstance(dt, (T.FloatType, T.DoubleType, T.DecimalType)):
        return {"type": "number"}
    if isinstance(dt, T.BooleanType):
        return {"type": "boolean"}
    if isinstance(dt, T.BinaryType):
        return {"type": "string", "contentEncoding": "base64"}
    if isinstance(dt, T.DateType):
        return {"type": "string", "format": "date"}
    if isinstance(dt, T.TimestampNTZType):
        return {"type": "string"}
    if isinstance(dt, T.TimestampType):
        return {"type": "string", "format": "date-time"}
    if isinstance(dt, (T.StringType, T.VarcharType, T.CharType)):
        return {"type": "string"}
    if isinstance(dt, T.NullType):
        return {"type": "null"}
    raise JsonSchemaError(f"Spark type {dt.simpleString()} has no JSON Schema type")
