"""The columnar Protobuf encoder (kafka_source/formats/protobuf/encode.py) and the schema the sink
derives (derive.py): every body parses with Google's protobuf runtime into the values of its
row, and reads back through pykafka's Protobuf decoder as the column was."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("google.protobuf")
T = pytest.importorskip("pyspark.sql.types")

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

from kafka_source.formats.encoded import EncodeError  # noqa: E402
from kafka_source.formats.protobuf import ProtobufColumnDecoder, message_descriptor  # noqa: E402
from kafka_source.formats.protobuf.derive import protobuf_file_of, protobuf_schema_of  # noqa: E402
from kafka_source.formats.protobuf.encode import ProtobufEncoder, index_bytes  # noqa: E402
from kafka_source.formats.protobuf.schema import repeated, schema_text  # noqa: E402
from kafka_source.formats.sink import spark_arrow_type  # noqa: E402

UTC = dt.timezone.utc
F = descriptor_pb2.FieldDescriptorProto

ORDER = T.StructType([
    T.StructField("id", T.LongType(), False),
    T.StructField("name", T.StringType()),
    T.StructField("qty", T.IntegerType()),
    T.StructField("small", T.ShortType()),
    T.StructField("price", T.DoubleType()),
    T.StructField("ratio", T.FloatType()),
    T.StructField("ok", T.BooleanType()),
    T.StructField("tags", T.ArrayType(T.StringType(), False)),
    T.StructField("nums", T.ArrayType(T.LongType(), False)),
    T.StructField("attrs", T.MapType(T.StringType(), T.LongType(), False)),
    T.StructField("lines", T.ArrayType(T.StructType([T.StructField("sku", T.StringType()),
                                                     T.StructField("n", T.IntegerType())]),
                                       False)),
    T.StructField("at", T.TimestampType()),
    T.StructField("day", T.DateType()),
    T.StructField("blob", T.BinaryType()),
    T.StructField("amount", T.DecimalType(12, 3)),
    T.StructField("ship_to", T.StructType([T.StructField("city", T.StringType(), False),
                                           T.StructField("zip", T.IntegerType())])),
])


def row(i: int):
    if i % 9 == 4:
        return None
    return {"id": (-1) ** i * i ** 7, "name": None if i % 5 == 0 else f"n-{i}-é",
            "qty": None if i % 3 == 0 else i - 20, "small": i % 300 - 150,
            "price": None if i % 7 == 0 else i / 3, "ratio": 0.5 * i, "ok": i % 2 == 0,
            "tags": [f"t{j}" for j in range(i % 4)], "nums": list(range(-i, i, 7)),
            "attrs": None if i % 6 == 0 else {f"k{j}": j * i for j in range(i % 3)},
            "lines": [{"sku": f"s{j}", "n": j} for j in range(i % 3)],
            "at": None if i % 8 == 0 else dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)
            + dt.timedelta(microseconds=i * 123_457),
            "day": dt.date(2024, 1, 1) + dt.timedelta(days=i - 30),
            "blob": bytes(range(i % 5)), "amount": decimal.Decimal(i * 1001 - 7000) / 1000,
            "ship_to": None if i % 4 == 0 else {"city": "Oslo" * (i % 3), "zip": i}}


def message_class(text: str):
    desc = message_descriptor(text)
    pool = descriptor_pool.DescriptorPool()
    from google.protobuf import timestamp_pb2

    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(
        timestamp_pb2.DESCRIPTOR.serialized_pb))
    proto = descriptor_pb2.FileDescriptorProto()
    desc.file.CopyToProto(proto)
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(desc.full_name))


def as_row(message) -> dict:
    """What Google's runtime parsed, in the row's terms (absent optional fields: None)."""
    out = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            out[f.name] = dict(value)
        elif repeated(f):
            out[f.name] = [as_row(v) if f.message_type else v for v in value]
        elif f.has_presence and not message.HasField(f.name):
            out[f.name] = None
        elif f.message_type is not None and f.message_type.full_name == \
                "google.protobuf.Timestamp":
            out[f.name] = value.seconds * 1_000_000 + value.nanos // 1000
        elif f.message_type is not None:
            out[f.name] = as_row(value)
        else:
            out[f.name] = value
    return out


def expected(r: dict) -> dict:
    out = dict(r)
    out["attrs"] = r["attrs"] or {}                     # Protobuf: no null map, no null list
    out["at"] = None if r["at"] is None else \
        (r["at"] - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
    out["day"] = (r["day"] - dt.date(1970, 1, 1)).days
    out["amount"] = f"{r['amount']:.3f}"                # the column's scale: decimal(12, 3)
    return out


def test_the_derived_message_parses_with_googles_runtime_row_for_row():
    text = protobuf_schema_of(ORDER, "shop.Order")
    file, name = protobuf_file_of(ORDER, "shop.Order")
    assert name == "shop.Order" and file.package == "shop"
    assert list(file.dependency) == ["google/protobuf/timestamp.proto"]
    fields = {f.name: f for f in file.message_type[0].field}
    assert fields["name"].proto3_optional and not fields["id"].proto3_optional
    assert fields["tags"].label == F.LABEL_REPEATED
    cls = message_class(text)
    arrow = spark_arrow_type(ORDER)
    rows = [row(i) for i in range(40)]
    array = pa.array(rows, arrow)
    encoder = ProtobufEncoder(message_descriptor(text), arrow)
    for start, stop in ((0, 40), (5, 23), (4, 5)):        # slices too
        body, valid = encoder.encode(array[start:stop])
        bodies = body.to_arrow(valid).to_pylist()
        for got, want in zip(bodies, rows[start:stop]):
            if want is None:
                assert got is None
                continue
            parsed = as_row(cls.FromString(got))
            exp = expected(want)
            for k in exp:
                if k in ("ratio",):
                    assert parsed[k] == pytest.approx(exp[k]), k
                elif k == "ship_to" and exp[k] is not None:
                    assert parsed[k] == {"city": exp[k]["city"], "zip": exp[k]["zip"]}
                else:
                    assert parsed[k] == exp[k], (k, parsed[k], exp[k])


def test_what_the_sink_writes_reads_back_through_the_reader():
    st = T.StructType([T.StructField("id", T.LongType(), False),
                       T.StructField("name", T.StringType()),
                       T.StructField("tags", T.ArrayType(T.StringType(), False)),
                       T.StructField("at", T.TimestampType()),
                       T.StructField("ship", T.StructType([T.StructField("city",
                                                                         T.StringType())]))])
    text = protobuf_schema_of(st, "x.Y")
    arrow = spark_arrow_type(st)
    rows = [{"id": i, "name": None if i % 3 == 0 else f"n{i}", "tags": [str(i)] * (i % 3),
             "at": dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=i * 1001),
             "ship": None if i % 4 == 0 else {"city": "c" * i}} for i in range(60)]
    body, valid = ProtobufEncoder(message_descriptor(text), arrow, prefix=b"").encode(
        pa.array(rows, arrow))
    decoded = ProtobufColumnDecoder(text, framed=False).decode(body.to_arrow(valid))
    assert not decoded.bad.any()
    assert decoded.array.to_pylist() == rows


def given_schema():
    """shop.Order with the field kinds a hand-written .proto uses: sint32, fixed64, uint32,
    an enum, a message defined at the top level after Order, packed repeated numbers."""
    file = descriptor_pb2.FileDescriptorProto(name="given.proto", package="shop",
                                              syntax="proto3")
    status = file.enum_type.add(name="Status")
    for i, n in enumerate(["NEW", "PAID"]):
        status.value.add(name=n, number=i)
    msg = file.message_type.add(name="Order")
    addr = file.message_type.add(name="Address")
    addr.field.add(name="city", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    for number, (name, kind, type_name, label) in enumerate([
            ("delta", F.TYPE_SINT32, None, F.LABEL_OPTIONAL),
            ("big", F.TYPE_FIXED64, None, F.LABEL_OPTIONAL),
            ("count", F.TYPE_UINT32, None, F.LABEL_OPTIONAL),
            ("status", F.TYPE_ENUM, ".shop.Status", F.LABEL_OPTIONAL),
            ("address", F.TYPE_MESSAGE, ".shop.Address", F.LABEL_OPTIONAL),
            ("scores", F.TYPE_SINT64, None, F.LABEL_REPEATED),
            ("unused", F.TYPE_STRING, None, F.LABEL_OPTIONAL)], 1):
        f = msg.field.add(name=name, number=number, type=kind, label=label)
        if type_name:
            f.type_name = type_name
    import base64

    return schema_text([base64.b64encode(file.SerializeToString()).decode()], "shop.Order")


def test_a_given_schema_takes_its_field_kinds_and_names_what_does_not_fit():
    text = given_schema()
    cls = message_class(text)
    st = T.StructType([T.StructField("delta", T.IntegerType()),
                       T.StructField("big", T.LongType()),
                       T.StructField("count", T.LongType()),
                       T.StructField("status", T.StringType()),
                       T.StructField("address", T.StructType([T.StructField("city",
                                                                            T.StringType())])),
                       T.StructField("scores", T.ArrayType(T.LongType(), False))])
    arrow = spark_arrow_type(st)
    rows = [{"delta": -3, "big": 2 ** 40, "count": 4_000_000_000, "status": "PAID",
             "address": {"city": "Rome"}, "scores": [-1, 0, 2 ** 40]},
            {"delta": None, "big": None, "count": 0, "status": "NEW", "address": None,
             "scores": []}]
    body, valid = ProtobufEncoder(message_descriptor(text), arrow).encode(pa.array(rows, arrow))
    got = [cls.FromString(b) for b in body.to_arrow(valid).to_pylist()]
    assert (got[0].delta, got[0].big, got[0].count, got[0].status, got[0].address.city,
            list(got[0].scores)) == (-3, 2 ** 40, 4_000_000_000, 1, "Rome", [-1, 0, 2 ** 40])
    assert not got[1].HasField("address") and list(got[1].scores) == [] and got[1].status == 0
    desc = message_descriptor(text)
    with pytest.raises(EncodeError, match="'value.count' is -1 in row 0, out of the range of "
                                          "uint32"):
        ProtobufEncoder(desc, arrow).encode(pa.array([{**rows[0], "count": -1}], arrow))
    with pytest.raises(EncodeError, match="'value.status' is 'LOST' in row 1, no value of enum "
                                          "shop.Status .NEW, PAID."):
        ProtobufEncoder(desc, arrow).encode(pa.array([rows[0], {**rows[1], "status": "LOST"}],
                                                     arrow))
    extra = T.StructType(list(st.fields) + [T.StructField("note", T.StringType())])
    with pytest.raises(EncodeError, match="'value.note' is not a field of message shop.Order"):
        ProtobufEncoder(desc, spark_arrow_type(extra))
    wrong = T.StructType([T.StructField("delta", T.DoubleType())])
    with pytest.raises(EncodeError, match="'value.delta' is an integer but double"):
        ProtobufEncoder(desc, spark_arrow_type(wrong))
    nulls = T.StructType([T.StructField("scores", T.ArrayType(T.LongType(), True))])
    with pytest.raises(EncodeError, match="an element of 'value.scores' is null"):
        ProtobufEncoder(desc, spark_arrow_type(nulls)).encode(
            pa.array([{"scores": [1, None]}], spark_arrow_type(nulls)))


def test_message_indexes_and_what_protobuf_cannot_say():
    text = given_schema()
    assert index_bytes(message_descriptor(text)) == b"\x00"
    address = message_descriptor(text.replace("shop.Order", "shop.Address"))
    assert address.full_name == "shop.Address"
    assert index_bytes(address) == b"\x02\x02"         # one index, 1: zig-zag 1, 2
    with pytest.raises(ValueError, match="'TopLevelRecord.m' is an array of arrays"):
        protobuf_file_of(T.StructType([T.StructField("m", T.ArrayType(T.ArrayType(
            T.LongType())))]))
    with pytest.raises(ValueError, match="double keys"):
        protobuf_file_of(T.StructType([T.StructField("m", T.MapType(T.DoubleType(),
                                                                     T.LongType()))]))
    with pytest.raises(ValueError, match="not a struct"):
        protobuf_file_of(T.LongType())


def test_a_served_file_without_the_synthetic_oneofs_of_optional_fields_loads():
    """Karapace 5.0.3 serializes a proto3 'optional' field without its synthetic oneof, which
    Google's descriptor pool refuses; the schema loader puts it back, so the field keeps its
    presence (a null reads back as null)."""
    import base64

    file = descriptor_pb2.FileDescriptorProto(name="served.proto", package="p", syntax="proto3")
    msg = file.message_type.add(name="M")
    msg.field.add(name="a", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL,
                  proto3_optional=True)                       # no oneof_index, as served
    msg.field.add(name="b", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    text = schema_text([base64.b64encode(file.SerializeToString()).decode()], "p.M")
    desc = message_descriptor(text)
    assert desc.fields_by_name["a"].has_presence and not desc.fields_by_name["b"].has_presence
    assert [o.name for o in desc.oneofs] == ["_a"]


def test_a_served_file_with_maps_written_as_text_loads_with_their_entries():
    """Karapace 5.0.3 serializes a schema registered as .proto text with each map field typed
    by the text 'map<K, V>' and no entry message; the loader builds the entries as protoc
    would, so the field is a map (read and written as one)."""
    import base64

    file = descriptor_pb2.FileDescriptorProto(name="schema-1.proto", package="shop",
                                              syntax="proto3")
    msg = file.message_type.add(name="Order")
    msg.field.add(name="id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    msg.field.add(name="attrs", number=5, label=F.LABEL_OPTIONAL,
                  type_name="map<string, int64>")                # as served
    msg.field.add(name="ships", number=6, label=F.LABEL_OPTIONAL,
                  type_name="map<int32, Address>")
    addr = msg.nested_type.add(name="Address")
    addr.field.add(name="city", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    text = schema_text([base64.b64encode(file.SerializeToString()).decode()], "")
    st = T.StructType([T.StructField("id", T.StringType()),
                       T.StructField("attrs", T.MapType(T.StringType(), T.LongType(), False)),
                       T.StructField("ships", T.MapType(T.IntegerType(), T.StructType(
                           [T.StructField("city", T.StringType())]), False))])
    from kafka_source.formats.protobuf import protobuf_types

    assert protobuf_types(text)[1].simpleString() == \
        "struct<id:string,attrs:map<string,bigint>,ships:map<int,struct<city:string>>>"
    arrow = spark_arrow_type(st)
    rows = [{"id": "a", "attrs": {"x": 1, "y": -2}, "ships": {3: {"city": "Oslo"}}},
            {"id": "b", "attrs": {}, "ships": {}}]
    body, valid = ProtobufEncoder(message_descriptor(text), arrow).encode(pa.array(rows, arrow))
    decoded = ProtobufColumnDecoder(text, framed=False).decode(body.to_arrow(valid))
    assert not decoded.bad.any()
    got = decoded.array.to_pylist()
    assert [dict(r["attrs"]) for r in got] == [{"x": 1, "y": -2}, {}]
    assert [dict(r["ships"]) for r in got] == [{3: {"city": "Oslo"}}, {}]
