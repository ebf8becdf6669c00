"""The columnar Avro decoder (kafka_source/formats/avro) against fastavro, Avro's reference for
Python: every type spark-avro maps, schema resolution by the specification's rules, and bad
bodies, which must be marked bad with a reason and never disturb the records beside them."""

from __future__ import annotations

import datetime as dt
import decimal
import inspect
import io
import json
import random
import struct

import numpy as np
import pyarrow as pa
import pytest

fastavro = pytest.importorskip("fastavro")

from kafka_source.formats.avro import AvroColumnDecoder, arrow_type, parse_schema, spark_type  # noqa: E402
from kafka_source.formats.avro.decode import (ResolutionError, body_cursor,  # noqa: E402
                                              compile_step)
from kafka_source.formats.avro.schema import AvroSchemaError  # noqa: E402
from kafka_source.formats.registry import RegistryError  # noqa: E402

EVERYTHING = {"type": "record", "name": "Event", "namespace": "x", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "score", "type": "double"}, {"name": "ratio", "type": "float"},
    {"name": "ok", "type": "boolean"}, {"name": "n", "type": "int"},
    {"name": "opt", "type": ["null", "string"], "default": None},
    {"name": "opt_last", "type": ["long", "null"]},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "matrix", "type": {"type": "array", "items": {"type": "array", "items": "int"}}},
    {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
    {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [
        {"name": "a", "type": "int"}, {"name": "b", "type": "bytes"}]}},
    {"name": "inners", "type": {"type": "array", "items": "Inner"}},
    {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "d", "type": {"type": "int", "logicalType": "date"}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                             "scale": 2}},
    {"name": "fdec", "type": {"type": "fixed", "name": "F8", "size": 8,
                              "logicalType": "decimal", "precision": 18, "scale": 4}},
    {"name": "uuid", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
    {"name": "u", "type": ["int", "string", "null"]},
    {"name": "il", "type": ["int", "long"]},
    {"name": "nothing", "type": "null"},
]}
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def everything(i: int, rnd: random.Random) -> dict:
    return {"id": rnd.randint(-2**63, 2**63 - 1), "name": "nä%d" % i * rnd.randint(0, 3),
            "score": rnd.random(), "ratio": 0.5 * (i % 5), "ok": i % 2 == 0,
            "n": rnd.randint(-2**31, 2**31 - 1), "opt": None if i % 3 else "o%d" % i,
            "opt_last": None if i % 2 else i, "tags": ["t%d" % j for j in range(i % 5)],
            "matrix": [[j] * (i % 3) for j in range(i % 4)],
            "attrs": {"k%d" % j: (None if j == 1 else j) for j in range(i % 4)},
            "inner": {"a": i, "b": b"\x00\x01" * (i % 3)},
            "inners": [{"a": j, "b": b"z"} for j in range(i % 3)],
            "color": "GREEN" if i % 2 else "RED",
            "ts": T0 + dt.timedelta(milliseconds=i), "ts_us": T0 + dt.timedelta(microseconds=i),
            "local": dt.datetime(2024, 1, 1) + dt.timedelta(milliseconds=7 * i),
            "d": dt.date(2024, 1, 1) + dt.timedelta(days=i),
            "dec": decimal.Decimal("%d.%02d" % (i - 500, i % 100)),
            "fdec": decimal.Decimal(i * 37 - 9999).scaleb(-4),
            "uuid": "123e4567-e89b-12d3-a456-%012d" % i, "fx": b"abcd",
            "u": [i, "s%d" % i, None][i % 3], "il": i if i % 2 else (1 << 40) + i,
            "nothing": None}


def body(schema, record) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def framed(schema_id: int, data: bytes) -> bytes:
    return b"\x00" + struct.pack(">i", schema_id) + data


def as_spark_returns(record: dict) -> dict:
    """What the decoded Arrow row holds for a fastavro record of EVERYTHING."""
    exp = dict(record)
    exp["attrs"] = list(record["attrs"].items())
    exp["u"] = None if record["u"] is None else {
        "member0": record["u"] if isinstance(record["u"], int) else None,
        "member1": record["u"] if isinstance(record["u"], str) else None}
    return exp


def decode_all(schema, bodies, reader=None):
    node = parse_schema(json.dumps(schema))
    step = compile_step(node, parse_schema(json.dumps(reader)) if reader else node)
    cursor, _ = body_cursor(pa.array(bodies, pa.binary()))
    return step(cursor, np.arange(len(bodies))), cursor


def test_every_type_decodes_as_fastavro_reads_it():
    rnd = random.Random(1)
    records = [everything(i, rnd) for i in range(1500)]
    out, cursor = decode_all(EVERYTHING, [body(EVERYTHING, r) for r in records])
    assert not cursor.bad.any()
    assert out.type == arrow_type(parse_schema(json.dumps(EVERYTHING)))
    for i, (got, rec) in enumerate(zip(out.to_pylist(), records)):
        want = as_spark_returns(rec)
        for k in want:
            assert got[k] == want[k], (i, k, got[k], want[k])
    assert (cursor.pos == cursor.end).all()      # every body read to its end


def test_arrow_types_are_the_ones_pyspark_makes_of_the_spark_types():
    from pyspark.sql.pandas.types import to_arrow_type

    node = parse_schema(json.dumps(EVERYTHING))
    kw = {"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_type).parameters else {}
    assert to_arrow_type(spark_type(node), **kw) == arrow_type(node)


def test_spark_types_follow_spark_avro():
    from pyspark.sql import types as T

    st = spark_type(parse_schema(json.dumps(EVERYTHING)))
    f = {x.name: x for x in st.fields}
    assert f["id"].dataType == T.LongType() and not f["id"].nullable
    assert f["opt"].dataType == T.StringType() and f["opt"].nullable
    assert f["opt_last"].dataType == T.LongType() and f["opt_last"].nullable
    assert f["color"].dataType == T.StringType()
    assert f["ts"].dataType == T.TimestampType() and f["local"].dataType == T.TimestampNTZType()
    assert f["d"].dataType == T.DateType() and f["dec"].dataType == T.DecimalType(10, 2)
    assert f["fx"].dataType == T.BinaryType() and f["uuid"].dataType == T.StringType()
    assert f["u"].dataType == T.StructType([T.StructField("member0", T.IntegerType()),
                                            T.StructField("member1", T.StringType())])
    assert f["il"].dataType == T.LongType() and f["nothing"].dataType == T.NullType()
    assert f["attrs"].dataType == T.MapType(T.StringType(), T.LongType(), True)
    assert f["tags"].dataType == T.ArrayType(T.StringType(), False)


V1 = {"type": "record", "name": "User", "namespace": "a", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": "string"},
    {"name": "gone", "type": {"type": "array", "items": "string"}},
    {"name": "old_name", "type": "string"},
    {"name": "f", "type": "float"}, {"name": "s", "type": "string"},
    {"name": "color", "type": {"type": "enum", "name": "C", "symbols": ["R", "G", "B"]}},
    {"name": "opt", "type": "string"}, {"name": "either", "type": ["null", "int"]}]}
V2 = {"type": "record", "name": "b.User", "aliases": ["a.User"], "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]},
    {"name": "email", "type": "string", "default": "none"},
    {"name": "new_name", "aliases": ["old_name"], "type": "string"},
    {"name": "f", "type": "double"}, {"name": "s", "type": "bytes"},
    {"name": "color", "type": {"type": "enum", "name": "C", "symbols": ["G", "R"],
                               "default": "R"}},
    {"name": "opt", "type": ["null", "string"]}, {"name": "either", "type": ["null", "long"]},
    {"name": "tags", "type": {"type": "array", "items": "int"}, "default": [1, 2]},
    {"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"},
     "default": 1000}]}


def test_schema_resolution_as_fastavro_resolves():
    records = [{"id": i, "name": f"u{i}", "gone": ["x"] * (i % 3), "old_name": f"o{i}",
                "f": 0.5, "s": f"s{i}", "color": "RGB"[i % 3], "opt": f"p{i}",
                "either": None if i % 2 else i} for i in range(300)]
    bodies = [body(V1, r) for r in records]
    out, cursor = decode_all(V1, bodies, reader=V2)
    assert not cursor.bad.any()
    reader = fastavro.parse_schema(V2)
    writer = fastavro.parse_schema(V1)
    for got, b in zip(out.to_pylist(), bodies):
        want = fastavro.schemaless_reader(io.BytesIO(b), writer, reader)
        want["when"] = dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc)
        want["s"] = want["s"] if isinstance(want["s"], bytes) else want["s"].encode()
        assert got == want


def test_unresolvable_schemas_are_refused_at_compile_time():
    reader = dict(V1, fields=V1["fields"] + [{"name": "must", "type": "int"}])
    with pytest.raises(ResolutionError, match="'must' is not in the writer's schema"):
        compile_step(parse_schema(json.dumps(V1)), parse_schema(json.dumps(reader)))
    narrower = dict(V2, fields=[{"name": "id", "type": "int"}])
    with pytest.raises(ResolutionError, match="long cannot be read as int"):
        compile_step(parse_schema(json.dumps(V2)), parse_schema(json.dumps(narrower)))


def test_enum_symbol_the_reader_lacks_marks_only_its_records_bad():
    w = {"type": "enum", "name": "C", "symbols": ["R", "G", "B"]}
    r = {"type": "enum", "name": "C", "symbols": ["R", "G"]}
    out, cursor = decode_all(w, [body(w, s) for s in "RGBR"], reader=r)
    assert out.to_pylist()[:2] == ["R", "G"] and list(cursor.bad) == [False, False, True, False]
    assert "lacks" in cursor.reasons[0][1]


def test_writer_union_branch_the_reader_cannot_take():
    w = ["null", "string"]
    out, cursor = decode_all(w, [body(w, "a"), body(w, None)], reader="string")
    assert out.to_pylist()[0] == "a" and list(cursor.bad) == [False, True]
    assert "cannot be null" in cursor.reasons[0][1]


@pytest.mark.parametrize("cut", [1, 3, 7])
def test_truncated_and_corrupt_bodies_are_bad_and_leave_the_others_alone(cut):
    rnd = random.Random(cut)
    records = [everything(i, rnd) for i in range(40)]
    bodies = [body(EVERYTHING, r) for r in records]
    broken = {5: bodies[5][:-cut], 17: bodies[17][:cut], 23: b"\xff" * 20,
              31: bodies[31][:10] + b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01" + bodies[31][21:]}
    bodies = [broken.get(i, b) for i, b in enumerate(bodies)]
    out, cursor = decode_all(EVERYTHING, bodies)
    bad = set(np.flatnonzero(cursor.bad))
    assert {5, 17, 23} <= bad and bad <= set(broken)
    good = [i for i in range(len(records)) if i not in broken]
    # A bad record's values are whatever was read (the column decoder nulls the record).
    got = out.take(pa.array(good)).to_pylist()
    for g, i in zip(got, good):
        want = as_spark_returns(records[i])
        assert {k: g[k] for k in want} == want, i


def test_random_garbage_never_raises_or_reads_past_a_record():
    rnd = random.Random(5)
    garbage = [bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 60))) for _ in range(500)]
    out, cursor = decode_all(EVERYTHING, garbage)
    assert len(out) == 500
    assert (cursor.pos <= cursor.end).all()


def test_column_decoder_groups_rows_by_schema_id_and_keeps_row_order():
    schemas = {1: json.dumps(V1), 2: json.dumps(V2)}

    def lookup(i):
        if i not in schemas:
            raise RegistryError("HTTP 404 (error 40403: Schema not found)", status=404, code=40403)
        return schemas[i]

    v1 = {"id": 1, "name": "a", "gone": [], "old_name": "o", "f": 1.0, "s": "s", "color": "G",
          "opt": "p", "either": 3}
    v2 = {"id": 1 << 40, "name": None, "email": "e", "new_name": "n", "f": 2.0, "s": b"b",
          "color": "R", "opt": None, "either": None, "tags": [], "when": T0}
    values = [framed(2, body(V2, v2)), framed(1, body(V1, v1)), None, b"\x01abcdef",
              framed(9, b""), b"\x00\x00", framed(1, body(V1, v1)[:-2]), framed(2, body(V2, v2))]
    decoded = AvroColumnDecoder(json.dumps(V2), lookup).decode(pa.array(values, pa.binary()))
    rows = decoded.array.to_pylist()
    assert rows[0]["id"] == 1 << 40 and rows[1]["id"] == 1 and rows[1]["email"] == "none"
    assert rows[7] == rows[0] and rows[1]["new_name"] == "o"
    assert [r is None for r in rows] == [False, False, True, True, True, True, True, False]
    assert list(np.flatnonzero(decoded.bad)) == [3, 4, 5, 6]
    assert "wire format" in decoded.reasons[3] and "wire format" in decoded.reasons[5]
    assert "not in the registry" in decoded.reasons[4]
    assert "record ends" in decoded.reasons[6]
    assert list(decoded.schema_ids) == [2, 1, -1, -1, 9, -1, 1, 2]


def test_plain_bodies_without_a_registry():
    decoded = AvroColumnDecoder(json.dumps(V1), None).decode(pa.array(
        [body(V1, {"id": 7, "name": "n", "gone": [], "old_name": "o", "f": 0.0, "s": "",
                   "color": "B", "opt": "", "either": None}), None], pa.binary()))
    assert decoded.array.to_pylist()[0]["color"] == "B" and decoded.array[1].as_py() is None
    assert not decoded.bad.any()


@pytest.mark.parametrize("schema,match", [
    ('{"type": "record", "name": "R", "fields": [{"name": "me", "type": "R"}]}', "recursive"),
    ('{"type": "record", "name": "R", "fields": [{"name": "x", "type": "Nope"}]}',
     "unknown type name"),
    ("not json", "not an Avro schema"),
    ('{"type": "record", "fields": []}', "needs a name"),
])
def test_bad_schemas_are_named(schema, match):
    with pytest.raises(AvroSchemaError, match=match):
        parse_schema(schema)


def test_defaults_of_every_kind_as_fastavro_fills_them():
    writer = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "int"}]}
    reader = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "int"},
        {"name": "rec", "type": {"type": "record", "name": "In", "fields": [
            {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"]}]},
         "default": {"a": 5, "b": None}},
        {"name": "arr", "type": {"type": "array", "items": "int"}, "default": [1, 2]},
        {"name": "empty", "type": {"type": "array", "items": "string"}, "default": []},
        {"name": "m", "type": {"type": "map", "values": "double"}, "default": {"a": 1.5}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6,
                                 "scale": 2}, "default": "\u0001\u0000"},
        {"name": "raw", "type": "bytes", "default": "\u00ff\u0000"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]},
         "default": "Y"},
        {"name": "first", "type": ["string", "null"], "default": "dflt"},
        {"name": "members", "type": ["int", "string"], "default": 7},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"},
         "default": 1500},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}, "default": 3},
        {"name": "ok", "type": "boolean", "default": True},
        {"name": "f", "type": "float", "default": 0.5}]}
    bodies = [body(writer, {"id": i}) for i in range(3)]
    out, cursor = decode_all(writer, bodies, reader=reader)
    assert not cursor.bad.any()
    want = fastavro.schemaless_reader(io.BytesIO(bodies[1]), fastavro.parse_schema(writer),
                                      fastavro.parse_schema(reader))
    got = out.to_pylist()[1]
    want["m"] = list(want["m"].items())
    want["members"] = {"member0": 7, "member1": None}
    # fastavro hands out the JSON defaults of logical and bytes types as they are written
    assert (want["day"], want["ts"], want["dec"], want["raw"]) == (3, 1500, "\x01\x00",
                                                                   "\xff\x00")
    want.update(day=dt.date(1970, 1, 4), ts=dt.datetime(1970, 1, 1, 0, 0, 1, 500000,
                                                          tzinfo=dt.timezone.utc),
                dec=decimal.Decimal("2.56"), raw=b"\xff\x00")
    assert got == want


def test_decoding_in_a_new_process_does_not_import_pandas():
    """Executors build these columns in fresh Python workers: pa.array would import pandas
    there (0.17-0.35 s each), so the decoder never calls it."""
    import subprocess
    import sys

    pytest.importorskip("pandas")
    # Build the column without pa.array: the test's own encoding must not import pandas either.
    code = f"""
import io, json, random, sys
sys.path.insert(0, {str(__import__('pathlib').Path(__file__).resolve().parents[2])!r})
import fastavro, numpy as np, pyarrow as pa
from tests.unit.test_avro_decode import EVERYTHING, everything
from kafka_source.formats.avro import AvroColumnDecoder
parsed = fastavro.parse_schema(EVERYTHING)
bodies = []
for i in range(50):
    b = io.BytesIO()
    fastavro.schemaless_writer(b, parsed, everything(i, random.Random(i)))
    bodies.append(b"\\x00\\x00\\x00\\x00\\x01" + b.getvalue())
bodies[3] = b"junk"
offsets = np.zeros(51, dtype=np.int32)
np.cumsum([len(b) for b in bodies], out=offsets[1:])
col = pa.Array.from_buffers(pa.binary(), 50, [None, pa.py_buffer(offsets),
                                              pa.py_buffer(b"".join(bodies))])
out = AvroColumnDecoder(json.dumps(EVERYTHING), lambda i: json.dumps(EVERYTHING)).decode(col)
assert out.bad.sum() == 1 and out.array.null_count == 1, out.reasons
print("pandas" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_registry_down_mid_run_fails_the_batch_but_known_ids_keep_decoding():
    """Known ids are cached in the decoder; an unseen id while the registry is unreachable is
    the registry's bounded error (the task fails naming the URL), not a bad record."""
    from kafka_source.formats.registry import RegistryUnavailableError

    up = {"on": True}

    def lookup(i):
        if not up["on"]:
            raise RegistryUnavailableError("Schema Registry http://r:8081 did not answer")
        return json.dumps(V1)

    decoder = AvroColumnDecoder(json.dumps(V1), lookup)
    v1 = framed(1, body(V1, {"id": 1, "name": "a", "gone": [], "old_name": "o", "f": 1.0,
                             "s": "s", "color": "G", "opt": "p", "either": 3}))
    assert decoder.decode(pa.array([v1], pa.binary())).array[0]["id"].as_py() == 1
    up["on"] = False
    assert decoder.decode(pa.array([v1, v1], pa.binary())).array.null_count == 0
    with pytest.raises(RegistryUnavailableError, match="did not answer"):
        decoder.decode(pa.array([v1, b"\x00\x00\x00\x00\x02xyz"], pa.binary()))
