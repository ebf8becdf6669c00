"""JSON Schema payloads: the schema's Spark and Arrow types, and a column of JSON bodies decoded
with Arrow's JSON reader.

Confluent's JSON Schema serializer writes a compact JSON document per record (after the wire
format's magic byte and schema id). The reader schema's type:

* ``object`` with ``properties`` -- struct, the properties in order; ``array`` with ``items``
  -- array; ``string`` -- string (``format: date-time`` -- timestamp); ``integer`` -- long;
  ``number`` -- double; ``boolean``; ``enum``/``const`` of strings -- string;
* ``$ref`` to ``#/definitions/...`` or ``#/$defs/...`` is followed; a type made nullable by a
  ``null`` alternative (``"type": ["string", "null"]``, ``oneOf``/``anyOf`` with
  ``{"type": "null"}``) is that type; ``["integer", "number"]`` is double.

Every field is nullable (a JSON document may leave any property out). A schema the mapping cannot
type -- a free-form object (``additionalProperties`` without ``properties``), a union of
different types, a recursive ``$ref`` -- is an error naming where, when the query is defined.

Decoding: the bodies of a column are joined into one newline-delimited buffer and parsed by
``pyarrow.json.read_json`` against the reader schema's Arrow type, in C++; properties the
reader schema lacks are ignored, missing ones are null. When the bulk parse fails (a body that is
not a JSON object, a value of another type than the schema's), the rows are parsed one by one to
find the bad ones, which are marked with the parser's reason; the others are parsed in bulk again.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa

from .avro import DecodedColumn, _combine
from .avro.decode import indices
from .framing import HEADER_SIZE, PAD, column_bytes, schema_ids


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


class JsonColumnDecoder:
    """Decodes columns of JSON documents (wire format when ``framed``) into the reader schema's
    struct. The writer's schema id is read but not needed: JSON carries its field names."""

    def __init__(self, reader_schema: str, framed: bool):
        self.type, _ = json_types(reader_schema)
        if not pa.types.is_struct(self.type):
            raise JsonSchemaError("the reader schema of a JSON column must be an object")
        self.framed = framed
        self._options = None

    def _parse(self, docs: list[bytes], newlines: bool) -> pa.Array:
        import pyarrow.json as pj

        options = pj.ParseOptions(explicit_schema=pa.schema(list(self.type)),
                                  unexpected_field_behavior="ignore",
                                  newlines_in_values=newlines)
        table = pj.read_json(io.BytesIO(b"\n".join(docs) + b"\n"), parse_options=options,
                             read_options=pj.ReadOptions(use_threads=False))
        if table.num_rows != len(docs):
            raise ValueError(f"{table.num_rows} rows for {len(docs)} documents")
        batch = table.combine_chunks().to_batches()
        if not batch:
            return pa.nulls(0, self.type)
        return pa.StructArray.from_arrays(batch[0].columns, fields=list(self.type))

    def decode(self, values: pa.Array) -> DecodedColumn:
        n = len(values)
        offsets, data, nulls = column_bytes(values)
        skip = HEADER_SIZE if self.framed else 0
        ids = None
        if self.framed:
            ids, unframed = schema_ids(offsets, data, nulls)
        else:
            unframed = np.zeros(n, dtype=bool)
        bad = unframed.copy()
        reasons = {int(r): "not in the Schema Registry wire format (no magic byte 0 and "
                           "schema id: was it written without a registry serializer?)"
                   for r in np.flatnonzero(unframed)}
        rows = np.flatnonzero(~nulls & ~unframed)
        raw = data[:data.size - PAD].tobytes()
        docs = [raw[offsets[r] + skip:offsets[r + 1]].strip() for r in rows]
        for i, doc in enumerate(docs):
            if not (doc.startswith(b"{") and doc.endswith(b"}")):
                bad[rows[i]] = True
                reasons[int(rows[i])] = "not a JSON object"
        keep = [i for i in range(len(docs)) if not bad[rows[i]]]
        good_rows = rows[keep]
        good_docs = [docs[i] for i in keep]
        newlines = any(b"\n" in d for d in good_docs)
        try:
            parsed = self._parse(good_docs, newlines) if good_docs else pa.nulls(0, self.type)
        except (pa.ArrowInvalid, ValueError):
            ok = []
            for r, doc in zip(good_rows, good_docs):
                try:
                    self._parse([doc], newlines=b"\n" in doc)
                    ok.append((r, doc))
                except (pa.ArrowInvalid, ValueError) as e:
                    bad[r] = True
                    reasons[int(r)] = f"the JSON does not match the reader schema: {e}"
            good_rows = np.array([r for r, _ in ok], dtype=np.int64)
            parsed = (self._parse([d for _, d in ok], newlines) if ok
                      else pa.nulls(0, self.type))
        return DecodedColumn(_combine([(good_rows, parsed)], bad, n, self.type), bad, reasons,
                             ids)
