"""The columnar Avro encoder (kafka_source/formats/avro/encode.py) and the sink's format
options (kafka_source/formats/sink.py): every body checked against fastavro's reader."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json

import numpy as np
import pyarrow as pa
import pytest

fastavro = pytest.importorskip("fastavro")

from kafka_source.errors import ColumnError, OptionError  # noqa: E402
from kafka_source.formats.avro import parse_schema  # noqa: E402
from kafka_source.formats.avro.encode import AvroEncoder, EncodeError, varints  # noqa: E402
from kafka_source.formats.avro.schema import avro_schema_of, minimum_fixed_size  # noqa: E402
from kafka_source.formats.registry import RegistryError, RegistrySettings  # noqa: E402
from kafka_source.formats.sink import (BatchEncoder, ColumnEncoding, SinkFormats,  # noqa: E402
                                       _refusal, parse_sink_formats, plan)

SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "a", "type": "long"},
    {"name": "s", "type": ["null", "string"], "default": None},
    {"name": "d", "type": "double"}, {"name": "f", "type": "float"},
    {"name": "b", "type": "boolean"},
    {"name": "arr", "type": {"type": "array", "items": "int"}},
    {"name": "m", "type": {"type": "map", "values": ["null", "long"]}},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}},
    {"name": "n", "type": ["null", {"type": "record", "name": "N",
                                    "fields": [{"name": "x", "type": "string"}]}]},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "tm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                             "scale": 2}},
    {"name": "fdec", "type": {"type": "fixed", "name": "FD", "size": 5, "logicalType": "decimal",
                              "precision": 10, "scale": 2}},
    {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 3}},
    {"name": "dflt", "type": "string", "default": "hello"},
    {"name": "dnum", "type": ["long", "null"], "default": 42},
]}
ARROW = pa.struct([
    ("a", pa.int64()), ("s", pa.string()), ("d", pa.float64()), ("f", pa.float32()),
    ("b", pa.bool_()), ("arr", pa.list_(pa.int32())), ("m", pa.map_(pa.string(), pa.int64())),
    ("e", pa.string()), ("n", pa.struct([("x", pa.string())])),
    ("ts", pa.timestamp("us", tz="UTC")), ("tm", pa.timestamp("us", tz="UTC")),
    ("day", pa.date32()), ("dec", pa.decimal128(10, 2)), ("fdec", pa.decimal128(10, 2)),
    ("fx", pa.binary())])
UTC = dt.timezone.utc


def row(i: int) -> dict:
    return {"a": (-1) ** i * i ** 7 * 1000, "s": None if i % 3 == 0 else f"s{i}é",
            "d": i / 3, "f": i / 4, "b": i % 2 == 0, "arr": list(range(i % 4)),
            "m": {f"k{j}": (None if j == 1 else j * i) for j in range(i % 3)},
            "e": ["X", "Y"][i % 2], "n": None if i % 2 else {"x": f"x{i}"},
            "ts": dt.datetime(2020, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=i * 123457
                                                                      - 10 ** 7),
            "tm": dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)
            + dt.timedelta(microseconds=i * 1001),
            "day": dt.date(2020, 1, 1) + dt.timedelta(days=i - 20000),
            "dec": decimal.Decimal((-1) ** i * i ** 5) / 100,
            "fdec": decimal.Decimal(i * 12345 - 300000) / 100, "fx": bytes([i, i, i])}


def arrow_rows(rows):
    return pa.array([None if r is None else {**r, "m": list(r["m"].items())} for r in rows],
                    type=ARROW)


def read_back(array: pa.Array, schema) -> list:
    parsed = fastavro.parse_schema(schema)
    return [None if v is None else fastavro.schemaless_reader(io.BytesIO(v), parsed, parsed)
            for v in array.to_pylist()]


def encode(schema, arrow_type, array):
    body, valid = AvroEncoder(parse_schema(json.dumps(schema)), arrow_type).encode(array)
    return body.to_arrow(valid)


def test_every_type_reads_back_with_fastavro_sliced_and_with_null_rows():
    rows = [row(i) for i in range(60)]
    array = arrow_rows([None] + rows + [None]).slice(1, 61)   # an offset, a null row at the end
    got = read_back(encode(SCHEMA, ARROW, array), SCHEMA)
    assert got[-1] is None                     # a null value is a Kafka null, not an Avro value
    for i, (g, want) in enumerate(zip(got, rows)):
        want = {**want, "dflt": "hello", "dnum": 42,
                "tm": want["tm"].replace(microsecond=want["tm"].microsecond // 1000 * 1000)}
        assert g == want, i


@pytest.mark.parametrize("values", [[0, 1, -1, 63, -64, 64, -65, 2 ** 31 - 1, -2 ** 31],
                                    [2 ** 63 - 1, -2 ** 63, 2 ** 62, -2 ** 62 - 1]])
def test_varints_are_avro_zigzag(values):
    enc = varints(np.array(values, dtype=np.int64))
    buf = io.BytesIO(enc.data.tobytes())
    assert [fastavro.schemaless_reader(buf, "long") for _ in values] == values


def test_empty_arrays_maps_and_records_with_no_rows():
    schema = {"type": "array", "items": {"type": "map", "values": "string"}}
    t = pa.list_(pa.map_(pa.string(), pa.string()))
    array = pa.array([[], [[]], [[("a", "b")], []]], type=t)
    assert read_back(encode(schema, t, array), schema) == [[], [{}], [{"a": "b"}, {}]]
    assert len(encode(SCHEMA, ARROW, arrow_rows([]))) == 0


def test_a_union_of_several_branches_takes_the_columns_branch():
    schema = ["null", "long", "string"]
    assert read_back(encode(schema, pa.string(), pa.array(["a", "b"])), schema) == ["a", "b"]
    assert read_back(encode(schema, pa.int32(), pa.array([7, -1])), schema) == [7, -1]


@pytest.mark.parametrize("schema,t,values,match", [
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]},
     pa.struct([("a", pa.int64())]), [{"a": None}], "value.a is null .* no null branch"),
    ({"type": "enum", "name": "E", "symbols": ["X"]}, pa.string(), ["Z"],
     "'Z' is not a symbol of Avro enum E"),
    ({"type": "fixed", "name": "F", "size": 2}, pa.binary(), [b"abc"], "3 bytes .* 2 bytes"),
])
def test_bad_values_are_named(schema, t, values, match):
    with pytest.raises(EncodeError, match=match):
        encode(schema, t, pa.array(values, type=t))


@pytest.mark.parametrize("schema,t,match", [
    ("int", pa.int64(), "int64 can't be written as Avro int"),
    ("float", pa.float64(), "can't be written as Avro float"),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]},
     pa.struct([("a", pa.int64()), ("b", pa.int64())]), "field\\(s\\) b that Avro record R"),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"},
                                                {"name": "b", "type": "long"}]},
     pa.struct([("b", pa.int64())]), "field 'a' with no default"),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us", tz="UTC"),
     "with time zone can't be written as Avro local-timestamp-micros"),
    ({"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 1},
     pa.decimal128(5, 2), "decimal\\(5,2\\) can't be written as Avro decimal\\(5,1\\)"),
])
def test_columns_that_do_not_fit_the_schema_are_named(schema, t, match):
    with pytest.raises(EncodeError, match=match):
        AvroEncoder(parse_schema(json.dumps(schema)), t)


def test_derived_schema_follows_spark_avro_with_optional_fields_defaulting_to_null():
    from pyspark.sql import types as T

    spark_type = T.StructType([
        T.StructField("id", T.LongType(), False), T.StructField("n", T.ShortType(), False),
        T.StructField("price", T.DecimalType(12, 2), True),
        T.StructField("at", T.TimestampType(), True),
        T.StructField("local", T.TimestampNTZType(), False),
        T.StructField("day", T.DateType(), False),
        T.StructField("tags", T.ArrayType(T.StringType(), False), False),
        T.StructField("kv", T.MapType(T.StringType(), T.DoubleType(), True), False),
        T.StructField("inner", T.StructType([T.StructField("x", T.BinaryType(), False)]), True)])
    schema = avro_schema_of(spark_type, "Order", "com.example")
    assert schema["name"] == "Order" and schema["namespace"] == "com.example"
    fields = {f["name"]: f for f in schema["fields"]}
    assert fields["id"] == {"name": "id", "type": "long"}
    assert fields["n"]["type"] == "int"
    assert fields["price"]["type"][1] == {
        "type": "fixed", "name": "price", "namespace": "com.example.Order", "size": 6,
        "logicalType": "decimal", "precision": 12, "scale": 2}
    assert fields["price"]["default"] is None and fields["price"]["type"][0] == "null"
    assert fields["at"]["type"] == ["null", {"type": "long", "logicalType": "timestamp-micros"}]
    assert fields["local"]["type"] == {"type": "long", "logicalType": "local-timestamp-micros"}
    assert fields["day"]["type"] == {"type": "int", "logicalType": "date"}
    assert fields["tags"]["type"] == {"type": "array", "items": "string"}
    assert fields["kv"]["type"] == {"type": "map", "values": ["null", "double"]}
    assert fields["inner"]["type"][1]["namespace"] == "com.example.Order"
    fastavro.parse_schema(schema)                      # valid Avro
    assert [minimum_fixed_size(p) for p in (1, 2, 3, 9, 10, 18, 19, 38)] == \
        [1, 1, 2, 4, 5, 8, 9, 16]


def test_sink_format_options_are_checked_when_the_write_is_defined():
    url = {"schema.registry.url": "http://r:8081"}
    assert parse_sink_formats({}).any is False
    f = parse_sink_formats({"valueformat": "avro", **url, "auto.register.schemas": "false"})
    assert f.value.auto_register is False and f.key is None
    assert parse_sink_formats({"valueformat": "json", **url}).value.format == "json"
    assert parse_sink_formats({"valueformat": "protobuf", **url}).value.format == "protobuf"
    cases = [({"valueformat": "avro", "valuemessagename": "a.B"}, "'valueMessageName' is for "
              "Protobuf"),
             ({"valueformat": "protobuf", "valueschema": "not base64!"}, "must be a "
              "FileDescriptorSet"),
             ({"valueformat": "xml"}, "must be one of binary, avro, json, protobuf"),
             ({"valueformat": "json", "valueschema": "[1]"}, "'valueSchema' .JSON Schema.*"
              "a JSON Schema is a JSON object"),
             ({"valueschemaid": "3"}, "'valueFormat' is binary"),
             ({"valueformat": "avro", "valueschemaid": "3"}, "needs 'schema.registry.url'"),
             ({"valueformat": "avro", **url, "valueschemaid": "x"}, "must be a schema id"),
             ({"valueformat": "avro", **url, "valueschemaid": "3", "valueschema": '"long"'},
              "both name the writer schema"),
             ({"valueformat": "avro", "valueschema": '{"type": "nope"}'}, "'valueSchema'"),
             ({"valueformat": "avro", **url, "use.latest.version": "yes"}, "true or false"),
             ({"valueformat": "avro", "auto.register.schemas": "true"},
              "'schema.registry.url' is not"),
             ({"valueformat": "avro", "valuerecordname": "not a name"}, "a full name")]
    for opts, match in cases:
        with pytest.raises(OptionError, match=match):
            parse_sink_formats(opts)


def test_plan_derives_the_schema_and_checks_an_inline_one():
    from pyspark.sql import types as T

    df_schema = T.StructType([T.StructField("value", T.StructType(
        [T.StructField("a", T.LongType(), False)]), True)])
    planned = plan(parse_sink_formats({"valueformat": "avro", "valuerecordname": "x.Y"}),
                   df_schema, "t")
    assert json.loads(planned.value.writer_schema) == {
        "type": "record", "name": "Y", "namespace": "x",
        "fields": [{"name": "a", "type": "long"}]}
    with pytest.raises(ColumnError, match="'valueSchema'.*value.a.*Avro int"):
        plan(parse_sink_formats({"valueformat": "avro", "valueschema": json.dumps(
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})}),
            df_schema, "t")
    with pytest.raises(ColumnError, match="no 'key' column"):
        plan(parse_sink_formats({"keyformat": "avro"}), df_schema, "t")


def test_batches_to_several_topics_are_framed_with_each_topics_schema_id():
    schema = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": "long"}]})
    registry = RegistrySettings(urls=("http://127.0.0.1:9",))
    enc = ColumnEncoding(column="value", format="avro", registry=registry,
                         writer_schema=schema, settled=(("t1", 7, schema), ("t2", 300, schema)))
    values = pa.array([{"a": i} if i != 3 else None for i in range(6)],
                      type=pa.struct([("a", pa.int64())]))
    topics = pa.array(["t1", "t2", "t2", "t1", None, "t1"])
    batch = pa.RecordBatch.from_arrays([values, topics], names=["value", "topic"])
    out = BatchEncoder(SinkFormats(value=enc), None, "topic").encode(batch).column("value")
    got = out.to_pylist()
    assert got[3] is None and got[4] is None   # a null value; a row with no topic (named later)
    for i in (0, 1, 2, 5):
        framed = got[i]
        assert framed[0] == 0
        assert int.from_bytes(framed[1:5], "big") == (300 if i in (1, 2) else 7)
        assert fastavro.schemaless_reader(io.BytesIO(framed[5:]), json.loads(schema)) == {"a": i}


def test_the_registrys_refusals_are_explained():
    enc = ColumnEncoding(column="value", format="avro", registry=None, auto_register=False)
    text = _refusal(enc, "orders", "orders-value", RegistryError(
        "HTTP 409 (error 409: Incompatible schema)", status=409))
    assert "subject 'orders-value'" in text and "incompatible" in text
    assert "not registered" in _refusal(enc, "orders", "orders-value",
                                        RegistryError("HTTP 404", status=404))


def test_plan_settles_the_topic_options_schema_once_per_process(monkeypatch):
    """With a registry and the topic option, the driver settles the subject's id when the write
    is defined (a refusal fails it there), and a stream's next writers reuse it."""
    from pyspark.sql import types as T

    from kafka_source.formats import sink

    asked = []

    def settle(enc, topic):
        asked.append((enc.column, topic))
        return 7, enc.writer_schema

    monkeypatch.setattr(sink, "settle", settle)
    monkeypatch.setattr(sink, "_SETTLED", {})
    df_schema = T.StructType([T.StructField("value", T.StructType(
        [T.StructField("a", T.LongType(), False)]), True)])
    opts = {"valueformat": "avro", "schema.registry.url": "http://127.0.0.1:9"}
    for _ in range(3):
        planned = plan(parse_sink_formats(opts), df_schema, "orders")
    assert planned.value.settled == (("orders", 7, planned.value.writer_schema),)
    assert asked == [("value", "orders")]


def _fastavro_bytes(schema, values) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for v in values:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, v)
        out.append(buf.getvalue())
    return out


def _rows(enc) -> list[bytes]:
    return [enc.data[int(a):int(b)].tobytes() for a, b in zip(enc.offsets[:-1], enc.offsets[1:])]


@pytest.mark.parametrize("values", [
    [0, 1, -1, 63, -64, 5],                                      # one byte each
    [1_700_000_000_000_000 + i for i in range(5)],               # timestamps of one era: 8 each
    [2 ** 63 - 1, -2 ** 63, -2 ** 62 - 1],                       # the widest (10), all alike
    [64, -65, 8191, -8192],                                      # 2 each
    [200, 2 ** 40, 300],                                         # 2 to 6 bytes
    [0, 64, 2 ** 31 - 1, -2 ** 31, 2 ** 63 - 1, -2 ** 63],       # 1 to 10 bytes
    [],
])
def test_varints_match_fastavro_byte_for_byte_in_each_shape(values):
    from kafka_source.formats.avro.encode import varints

    enc = varints(np.array(values, dtype=np.int64))
    assert _rows(enc) == _fastavro_bytes("long", values)


@pytest.mark.parametrize("wide", [False, True])
def test_join_puts_parts_of_every_shape_together_row_by_row(monkeypatch, wide):
    from kafka_source.formats import encoded as E

    if wide:
        monkeypatch.setattr(E, "WIDE", 16)          # large_binary, without 2 GiB of data
    n = 7
    rows = [bytes([65 + i]) * (i % 3) for i in range(n)]
    variable = E.binary_bodies(pa.array([b"zz"] + rows, pa.binary()).slice(1))   # offsets > 0
    fixed = E.fixed_width(np.arange(n * 3, dtype=np.uint8).reshape(n, 3))
    valid = np.array([i % 2 == 0 for i in range(n)])
    sparse = E.expand(E.uvarints(E.zigzag(np.arange(int(valid.sum())) * 1000)), valid)
    empty = E.const(b"", n)
    parts = [fixed, variable, empty, sparse, E.const(b"\x00", n), variable]
    got = _rows(E.join(parts))
    assert got == [b"".join(_rows(p)[i] for p in parts) for i in range(n)]
    assert E.join(parts).to_arrow().to_pylist() == got
    assert _rows(E.join([empty, empty])) == [b""] * n
    assert _rows(E.join([E.const(b"a", 0), E.const(b"", 0)])) == []


def test_the_sinks_framed_rows_match_fastavro_with_nulls_and_uniform_strings():
    from pyspark.sql import types as T

    spark_type = T.StructType([
        T.StructField("id", T.StringType(), False), T.StructField("n", T.LongType(), False),
        T.StructField("x", T.DoubleType(), True), T.StructField("tags", T.ArrayType(
            T.StringType(), False), False),
        T.StructField("at", T.StructType([T.StructField("city", T.StringType(), False)]), True)])
    schema = avro_schema_of(spark_type, "R", "t")
    t = pa.struct([("id", pa.string()), ("n", pa.int64()), ("x", pa.float64()),
                   ("tags", pa.list_(pa.string())), ("at", pa.struct([("city", pa.string())]))])
    values = [None if i == 3 else
              {"id": f"o-{i:05d}", "n": 1_700_000_000_000 + i * (1 if i % 2 else 10 ** 9),
               "x": None if i % 3 == 0 else i / 7, "tags": [f"t{j}" for j in range(i % 3)],
               "at": None if i % 4 == 1 else {"city": "Nice"}} for i in range(12)]
    enc = ColumnEncoding(column="value", format="avro", registry=object(),
                         writer_schema=json.dumps(schema),
                         settled=(("t", 258, json.dumps(schema)),))
    batch = pa.RecordBatch.from_arrays([pa.array(values, type=t)], names=["value"])
    got = BatchEncoder(SinkFormats(value=enc), "t", None).encode(batch).column(0).to_pylist()
    want = _fastavro_bytes(schema, [v for v in values if v is not None])
    want = [b"\x00\x00\x00\x01\x02" + w for w in want]
    assert got == want[:3] + [None] + want[3:]
