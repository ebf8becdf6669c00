"""Columns written as JSON Schema documents (kafka_source/formats/jsonschema/encode.py and
schema.json_schema_of): every document parses with Python's json and validates with the
``jsonschema`` library against the schema the sink registers; what the schema does not allow
is an error naming field and row, never a document the schema rejects."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pytest

pa = pytest.importorskip("pyarrow")
jsonschema = pytest.importorskip("jsonschema")
T = pytest.importorskip("pyspark.sql.types")

from kafka_source.formats.encoded import EncodeError  # noqa: E402
from kafka_source.formats.jsonschema import JsonColumnDecoder  # noqa: E402
from kafka_source.formats.jsonschema.encode import JsonEncoder  # noqa: E402
from kafka_source.formats.jsonschema.schema import json_schema_of  # noqa: E402
from kafka_source.formats.sink import spark_arrow_type  # noqa: E402

UTC = dt.timezone.utc

ORDER = T.StructType([
    T.StructField("id", T.LongType(), False),
    T.StructField("name", T.StringType()),
    T.StructField("qty", T.IntegerType()),
    T.StructField("price", T.DoubleType()),
    T.StructField("ok", T.BooleanType()),
    T.StructField("tags", T.ArrayType(T.StringType(), True)),
    T.StructField("attrs", T.MapType(T.StringType(), T.LongType(), True)),
    T.StructField("at", T.TimestampType()),
    T.StructField("local", T.TimestampNTZType()),
    T.StructField("day", T.DateType()),
    T.StructField("blob", T.BinaryType()),
    T.StructField("amount", T.DecimalType(12, 3)),
    T.StructField("ship", T.StructType([T.StructField("city", T.StringType(), False),
                                        T.StructField("zip", T.IntegerType())])),
])

ROWS = [
    {"id": 1, "name": 'quote " backslash \\ newline \n tab \t bell \x07 é 日本', "qty": 3,
     "price": 0.1, "ok": True, "tags": ["a", None, ""], "attrs": {"k": 1, "é\"": -2},
     "at": dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
     "local": dt.datetime(2024, 5, 1, 12, 0, 1), "day": dt.date(1999, 12, 31),
     "blob": b"\x00\xff\x10", "amount": decimal.Decimal("-12.340"),
     "ship": {"city": "Oslo", "zip": None}},
    None,
    {"id": -(2 ** 63), "name": None, "qty": None, "price": 1e300, "ok": False, "tags": [],
     "attrs": {}, "at": None, "local": None, "day": None, "blob": b"", "amount": None,
     "ship": None},
    {"id": 2 ** 63 - 1, "name": "", "qty": -(2 ** 31), "price": -0.0, "ok": None, "tags": None,
     "attrs": None, "at": dt.datetime(1970, 1, 1, tzinfo=UTC), "local": None, "day": None,
     "blob": None, "amount": decimal.Decimal("0.001"), "ship": {"city": "", "zip": 7}},
]


def expected(row):
    """What a document says for ``row``: Python's view of the JSON."""
    if row is None:
        return None
    out = dict(row)
    out["at"] = None if row["at"] is None else \
        row["at"].strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"
    out["local"] = None if row["local"] is None else row["local"].strftime("%Y-%m-%dT%H:%M:%S.%f")
    out["day"] = None if row["day"] is None else row["day"].isoformat()
    import base64

    out["blob"] = None if row["blob"] is None else base64.b64encode(row["blob"]).decode()
    out["amount"] = None if row["amount"] is None else float(row["amount"])
    return out


def encode(schema_text, arrow_type, array):
    body, valid = JsonEncoder(schema_text, arrow_type).encode(array)
    return body.to_arrow(valid).to_pylist()


def test_documents_validate_against_the_derived_schema_and_say_what_the_rows_say():
    schema = json_schema_of(ORDER, "shop.Order")
    assert schema["title"] == "shop.Order" and schema["additionalProperties"] is False
    assert schema["required"] == ["id"]
    assert schema["properties"]["ship"]["oneOf"][1]["required"] == ["city"]
    arrow = spark_arrow_type(ORDER)
    array = pa.array(ROWS, arrow)
    for start, stop in ((0, 4), (1, 4), (2, 3)):             # slices, too
        docs = encode(json.dumps(schema), arrow, array[start:stop])
        assert len(docs) == stop - start
        for doc, row in zip(docs, ROWS[start:stop]):
            if row is None:
                assert doc is None
                continue
            value = json.loads(doc)
            jsonschema.validate(value, schema)
            want = expected(row)
            assert value.keys() == want.keys()
            for k in want:
                assert value[k] == want[k], k
    # compact, as Confluent's serializer writes: no spaces between tokens
    assert encode(json.dumps(schema), arrow, array[3:4])[0].startswith(
        b'{"id":9223372036854775807,"name":"","qty":-2147483648,"price":-0,')


def test_what_the_sink_writes_reads_back_through_the_reader():
    st = T.StructType([T.StructField("id", T.LongType(), False),
                       T.StructField("name", T.StringType()),
                       T.StructField("price", T.DoubleType()),
                       T.StructField("tags", T.ArrayType(T.StringType())),
                       T.StructField("at", T.TimestampType()),
                       T.StructField("ship", T.StructType([T.StructField("city",
                                                                         T.StringType())]))])
    schema = json.dumps(json_schema_of(st))
    rows = [{"id": i, "name": f"n\"{i}\n", "price": i / 3, "tags": [str(i)] * (i % 3),
             "at": dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=i * 1001),
             "ship": None if i % 4 == 0 else {"city": "c" * i}} for i in range(50)]
    arrow = spark_arrow_type(st)
    body, valid = JsonEncoder(schema, arrow).encode(pa.array(rows, arrow))
    decoded = JsonColumnDecoder(schema, framed=False).decode(body.to_arrow(valid))
    assert not decoded.bad.any()
    assert decoded.array.to_pylist() == rows


def test_a_given_schema_is_checked_against_the_column_when_the_encoder_is_built():
    st = T.StructType([T.StructField("id", T.LongType(), False),
                       T.StructField("note", T.StringType())])
    arrow = spark_arrow_type(st)
    closed = {"type": "object", "properties": {"id": {"type": "integer"}},
              "additionalProperties": False}
    with pytest.raises(EncodeError, match="'value.note' is not a property of the schema"):
        JsonEncoder(json.dumps(closed), arrow)
    # an open object takes the extra field, with the type the column has
    open_ = dict(closed, additionalProperties=True)
    assert json.loads(encode(json.dumps(open_), arrow, pa.array(
        [{"id": 1, "note": "x"}], arrow))[0]) == {"id": 1, "note": "x"}
    needs = {"type": "object", "properties": {"id": {"type": "integer"},
                                              "sku": {"type": "string"}},
             "required": ["sku"]}
    with pytest.raises(EncodeError, match="requires 'sku' in 'value'"):
        JsonEncoder(json.dumps(needs), arrow)
    wrong = {"type": "object", "properties": {"id": {"type": "string"}}}
    with pytest.raises(EncodeError, match="'value.id' is int64 .JSON integer. but the schema "
                                          "allows string"):
        JsonEncoder(json.dumps(wrong), arrow)
    # integer columns fit "number"; a $ref is followed
    ref = {"type": "object", "definitions": {"n": {"type": "number"}},
           "properties": {"id": {"$ref": "#/definitions/n"}, "note": {"type": "string"}}}
    assert encode(json.dumps(ref), arrow, pa.array([{"id": 5, "note": "a"}], arrow)) == \
        [b'{"id":5,"note":"a"}']


def test_nulls_are_written_left_out_or_refused_as_the_schema_says():
    st = T.StructType([T.StructField("a", T.StringType()), T.StructField("b", T.StringType()),
                       T.StructField("c", T.StringType())])
    arrow = spark_arrow_type(st)
    schema = {"type": "object", "properties": {
        "a": {"type": ["string", "null"]},                  # null allowed: written
        "b": {"type": "string"},                            # optional: left out
        "c": {"type": "string"}}, "required": ["c"]}        # required: refused
    rows = pa.array([{"a": None, "b": None, "c": "x"}, {"a": "y", "b": "z", "c": "w"}], arrow)
    docs = [json.loads(d) for d in encode(json.dumps(schema), arrow, rows)]
    assert docs == [{"a": None, "c": "x"}, {"a": "y", "b": "z", "c": "w"}]
    for d in docs:
        jsonschema.validate(d, schema)
    with pytest.raises(EncodeError, match="'value.c' is null in row 1, and the schema requires"):
        encode(json.dumps(schema), arrow, pa.array([{"a": "1", "b": "2", "c": "3"},
                                                    {"a": "1", "b": "2", "c": None}], arrow))
    # all the properties left out: an empty object
    only_b = spark_arrow_type(T.StructType([T.StructField("b", T.StringType())]))
    assert encode(json.dumps({"type": "object", "properties": {"b": {"type": "string"}}}),
                  only_b, pa.array([{"b": None}], only_b)) == [b"{}"]


def test_values_json_cannot_hold_are_errors_naming_field_and_row():
    st = T.StructType([T.StructField("x", T.DoubleType()), T.StructField("s", T.StringType())])
    arrow = spark_arrow_type(st)
    schema = json.dumps(json_schema_of(st))
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(EncodeError, match=r"'value.x' is .* in row 1: JSON has no NaN"):
            encode(schema, arrow, pa.array([{"x": 1.0, "s": None}, {"x": bad, "s": None}],
                                           arrow))
    enum = {"type": "object", "properties": {"x": {"type": "number"},
                                             "s": {"enum": ["NEW", "PAID"]}}}
    assert encode(json.dumps(enum), arrow, pa.array([{"x": 1.0, "s": "PAID"}], arrow)) == \
        [b'{"x":1,"s":"PAID"}']
    with pytest.raises(EncodeError, match="'value.s' is 'LOST' in row 0, which is not one of"):
        encode(json.dumps(enum), arrow, pa.array([{"x": 1.0, "s": "LOST"}], arrow))
    with pytest.raises(ValueError, match="has no JSON object type"):
        json_schema_of(T.StructType([T.StructField("m", T.MapType(T.DoubleType(),
                                                                   T.StringType()))]))
