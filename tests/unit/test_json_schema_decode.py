"""JSON Schema columns (kafka_source/formats/jsonschema.py): the schema's types, and bodies
decoded in bulk by Arrow's JSON reader, bad ones found and named without touching the others."""

from __future__ import annotations

import datetime as dt
import json
import struct

import numpy as np
import pyarrow as pa
import pytest

from kafka_source.formats.jsonschema import JsonColumnDecoder, JsonSchemaError, json_types

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer"}, "name": {"type": ["string", "null"]},
    "score": {"type": ["integer", "number"]}, "ok": {"type": "boolean"},
    "at": {"type": "string", "format": "date-time"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "addr": {"$ref": "#/$defs/Addr"},
    "kind": {"enum": ["a", "b"]},
    "maybe": {"oneOf": [{"type": "null"}, {"type": "integer"}]}},
    "$defs": {"Addr": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def framed(doc) -> bytes:
    return b"\x00" + struct.pack(">i", 1) + json.dumps(doc).encode()


def test_types_of_a_json_schema():
    from pyspark.sql import types as T

    arrow, spark = json_types(json.dumps(SCHEMA))
    f = {x.name: x.dataType for x in spark.fields}
    assert f["id"] == T.LongType() and f["score"] == T.DoubleType()
    assert f["at"] == T.TimestampType() and f["kind"] == T.StringType()
    assert f["tags"] == T.ArrayType(T.StringType(), True)
    assert f["addr"] == T.StructType([T.StructField("city", T.StringType(), True)])
    assert f["maybe"] == T.LongType()
    assert all(x.nullable for x in spark.fields)
    assert arrow.field("at").type == pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize("schema,match", [
    ({"type": "object", "additionalProperties": {"type": "string"}}, "without properties"),
    ({"type": "object", "properties": {"x": {"type": ["string", "integer"]}}},
     "no single Spark type"),
    ({"type": "object", "properties": {"x": {"$ref": "#"}}}, "recursive"),
    ({"type": "object", "properties": {"x": {}}}, "no type"),
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/Nope"}}}, "names nothing"),
])
def test_schemas_without_a_spark_type_are_named(schema, match):
    with pytest.raises(JsonSchemaError, match=match):
        json_types(json.dumps(schema))


def test_bulk_decode_with_bad_documents_found_one_by_one():
    docs = [{"id": 1, "name": "x", "score": 2, "ok": True, "at": "2025-01-02T03:04:05Z",
             "tags": ["t"], "addr": {"city": "Paris"}, "kind": "a", "maybe": None,
             "extra": {"ignored": 1}},
            {"id": 2, "name": "multi\nline"}]
    values = [framed(docs[0]), framed(docs[1]), None, b"\x00\x00\x00\x00\x01[1]",
              framed({"id": "not a number"}), b"plain", framed(docs[0])]
    out = JsonColumnDecoder(json.dumps(SCHEMA), framed=True).decode(pa.array(values, pa.binary()))
    rows = out.array.to_pylist()
    assert rows[0]["addr"] == {"city": "Paris"} and rows[0]["score"] == 2.0
    assert rows[0]["at"] == dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert rows[1]["name"] == "multi\nline" and rows[1]["tags"] is None
    assert rows[6] == rows[0]
    assert list(np.flatnonzero(out.bad)) == [3, 4, 5]
    assert "not a JSON object" in out.reasons[3]
    assert "does not match the reader schema" in out.reasons[4]
    assert "wire format" in out.reasons[5]
    assert [r is None for r in rows] == [False, False, True, True, True, True, False]


def test_plain_json_without_a_registry():
    out = JsonColumnDecoder(json.dumps(SCHEMA), framed=False).decode(
        pa.array([b'{"id": 5}', b' {"id": 6} '], pa.binary()))
    assert [r["id"] for r in out.array.to_pylist()] == [5, 6] and not out.bad.any()
