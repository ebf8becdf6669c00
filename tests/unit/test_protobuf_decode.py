"""The columnar Protobuf decoder (kafka_source/formats/protobuf): every message checked against
Google's own parser, and the reader schema's types and options."""

from __future__ import annotations

import base64
import datetime as dt

import pyarrow as pa
import pytest

pytest.importorskip("google.protobuf")

from google.protobuf import (descriptor_pb2, descriptor_pool, message_factory,  # noqa: E402
                             timestamp_pb2)

from kafka_source.errors import OptionError  # noqa: E402
from kafka_source.formats.options import resolve_formats  # noqa: E402
from kafka_source.formats.protobuf import (ProtobufColumnDecoder,  # noqa: E402
                                           ProtobufSchemaError, protobuf_types, schema_text)

F = descriptor_pb2.FieldDescriptorProto


def order_file(extra_field: bool = False) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop",
                                             syntax="proto3")
    fdp.dependency.append("google/protobuf/timestamp.proto")
    addr = fdp.message_type.add(name="Address")
    addr.field.add(name="city", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    addr.field.add(name="zip", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    status = fdp.enum_type.add(name="Status")
    for i, name in enumerate(["NEW", "PAID", "SHIPPED"]):
        status.value.add(name=name, number=i)
    m = fdp.message_type.add(name="Order")
    for name, number, kind, rep, type_name in [
            ("order_id", 1, F.TYPE_STRING, False, None), ("customer", 2, F.TYPE_INT64, False, None),
            ("qty", 3, F.TYPE_INT32, False, None), ("amount", 4, F.TYPE_DOUBLE, False, None),
            ("ratio", 5, F.TYPE_FLOAT, False, None), ("paid", 6, F.TYPE_BOOL, False, None),
            ("delta", 7, F.TYPE_SINT64, False, None),
            ("status", 8, F.TYPE_ENUM, False, ".shop.Status"),
            ("address", 9, F.TYPE_MESSAGE, False, ".shop.Address"),
            ("items", 10, F.TYPE_STRING, True, None), ("scores", 11, F.TYPE_INT32, True, None),
            ("created", 12, F.TYPE_MESSAGE, False, ".google.protobuf.Timestamp"),
            ("raw", 13, F.TYPE_BYTES, False, None), ("fx", 14, F.TYPE_SFIXED32, False, None),
            ("addrs", 15, F.TYPE_MESSAGE, True, ".shop.Address"),
            ("big", 17, F.TYPE_UINT64, False, None), ("f64", 18, F.TYPE_FIXED64, False, None)]:
        f = m.field.add(name=name, number=number, type=kind,
                        label=F.LABEL_REPEATED if rep else F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name
    entry = m.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    m.field.add(name="attrs", number=16, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                type_name=".shop.Order.AttrsEntry")
    if extra_field:
        m.field.add(name="channel", number=40, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    return fdp


def message_class(fdp):
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(
        timestamp_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def orders(cls, n: int, channel: bool = False) -> list:
    out = []
    for i in range(n):
        o = cls(order_id=f"o-{i}", customer=(-1) ** i * i ** 5, qty=-i if i % 3 == 0 else i,
                amount=i / 3, ratio=i / 4, paid=i % 2 == 0, delta=-i * 1000, status=i % 3,
                raw=bytes([i % 256]) * (i % 3), fx=-i, big=2 ** 63 + i, f64=i * 7)
        if i % 4:
            o.address.city = ["Paris", "東京"][i % 2]
            o.address.zip = f"{i:05d}"
        o.items.extend(f"sku-{j}" for j in range(i % 4))
        o.scores.extend(range(-2, i % 5))
        o.created.seconds = 1_700_000_000 - 5 * i
        o.created.nanos = i * 1000
        for j in range(i % 3):
            o.addrs.add(city=f"c{j}")
            o.attrs[f"k{j}"] = j * i
        if channel:
            o.channel = "web"
        out.append(o)
    return out


def text_of(fdp, message="shop.Order") -> str:
    return schema_text([base64.b64encode(fdp.SerializeToString()).decode()], message)


def expected(o) -> dict:
    def opt(v):
        return v if v else None
    return {"order_id": o.order_id, "customer": opt(o.customer), "qty": opt(o.qty),
            "amount": opt(o.amount), "ratio": opt(o.ratio), "paid": True if o.paid else None,
            "delta": opt(o.delta), "status": ["NEW", "PAID", "SHIPPED"][o.status] if o.status
            else None,
            "address": {"city": o.address.city, "zip": o.address.zip}
            if o.HasField("address") else None,
            "items": list(o.items), "scores": list(o.scores),
            "created": dt.datetime.fromtimestamp(o.created.seconds, dt.timezone.utc)
            + dt.timedelta(microseconds=o.created.nanos // 1000),
            "raw": opt(o.raw), "fx": opt(o.fx), "addrs": [{"city": a.city, "zip": None}
                                                          for a in o.addrs],
            "big": opt(o.big - 2 ** 64 if o.big >= 2 ** 63 else o.big), "f64": opt(o.f64),
            "attrs": sorted(dict(o.attrs).items())}


def decoded(decoder, values):
    out = decoder.decode(pa.array(values, pa.binary()))
    rows = out.array.to_pylist()
    for r in rows:
        if r is not None:
            r["attrs"] = sorted(r["attrs"])
    return out, rows


def test_every_field_kind_reads_as_googles_parser_reads_it():
    fdp = order_file()
    msgs = orders(message_class(fdp), 200)
    # The Order is the file's second message: message indexes [1] (zig-zag: 02 02).
    framed = [b"\x00\x00\x00\x00\x07\x02\x02" + o.SerializeToString() for o in msgs] + [None]
    out, rows = decoded(ProtobufColumnDecoder(text_of(fdp)), framed)
    assert not out.bad.any() and rows[-1] is None
    assert out.array.type == protobuf_types(text_of(fdp))[0]   # what Spark was told, exactly
    for o, row in zip(msgs, rows):
        assert row == expected(o), o.order_id


def test_a_newer_writers_fields_are_skipped_and_an_older_writers_missing_fields_are_null():
    old, new = order_file(), order_file(extra_field=True)
    newer = orders(message_class(new), 20, channel=True)
    out, rows = decoded(ProtobufColumnDecoder(text_of(old), framed=False),
                        [o.SerializeToString() for o in newer])
    assert not out.bad.any() and [r["order_id"] for r in rows] == [o.order_id for o in newer]
    older = orders(message_class(old), 5)
    out, rows = decoded(ProtobufColumnDecoder(text_of(new), framed=False),
                        [o.SerializeToString() for o in older])
    assert [r["channel"] for r in rows] == [None] * 5


def test_unpacked_repeated_numbers_and_a_repeated_singular_field():
    fdp = order_file()
    # scores as three unpacked varints (tag 11 wire 0), then qty twice: the last one wins
    body = bytes([0x58, 1, 0x58, 2, 0x58, 3, 0x18, 5, 0x18, 9])
    packed_empty = bytes([0x5A, 0])                 # scores packed, zero bytes: no scores
    packed_then_not = bytes([0x5A, 2, 7, 8, 0x58, 9])
    out, rows = decoded(ProtobufColumnDecoder(text_of(fdp), framed=False),
                        [body, packed_empty, packed_then_not])
    assert not out.bad.any()
    assert rows[0]["scores"] == [1, 2, 3] and rows[0]["qty"] == 9
    assert rows[1]["scores"] == [] and rows[2]["scores"] == [7, 8, 9]


@pytest.mark.parametrize("body,reason", [
    (b"\x0a\x05ab", "ends inside a order_id"),             # a string longer than the message
    (b"\x0b", "wire type 3"),                              # a group
    (b"\x10", "ends inside a customer"),
    (b"\x0a\x02\xff\xfe", "not UTF-8"),
])
def test_corrupt_messages_are_marked_with_the_reason(body, reason):
    decoder = ProtobufColumnDecoder(text_of(order_file()), framed=False)
    good = orders(message_class(order_file()), 1)[0].SerializeToString()
    out, rows = decoded(decoder, [good, body, good])
    assert out.bad.tolist() == [False, True, False]
    assert reason in out.reasons[1] and rows[1] is None and rows[0]["order_id"] == "o-0"


def test_another_message_of_the_schema_is_named_not_misread():
    decoder = ProtobufColumnDecoder(text_of(order_file()))
    out, _ = decoded(decoder, [b"\x00\x00\x00\x00\x07\x00\x0a\x01x"])      # indexes [0]
    assert out.bad.all() and "Address" not in out.reasons[0]
    assert "message indexes differ" in out.reasons[0]


def test_types_follow_from_protobuf_and_recursion_is_an_error():
    spark_type = protobuf_types(text_of(order_file()))[1]
    assert spark_type.simpleString().startswith(
        "struct<order_id:string,customer:bigint,qty:int,amount:double,ratio:float,"
        "paid:boolean,delta:bigint,status:string,address:struct<city:string,zip:string>,"
        "items:array<string>,scores:array<int>,created:timestamp,raw:binary,fx:int,")
    assert spark_type["attrs"].dataType.simpleString() == "map<string,bigint>"
    node = descriptor_pb2.FileDescriptorProto(name="n.proto", package="t", syntax="proto3")
    m = node.message_type.add(name="Node")
    m.field.add(name="child", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                type_name=".t.Node")
    with pytest.raises(ProtobufSchemaError, match="contains itself"):
        protobuf_types(text_of(node, "t.Node"))
    with pytest.raises(ProtobufSchemaError, match="no message 't.Nope'"):
        protobuf_types(text_of(node, "t.Nope"))


def test_inline_descriptor_set_and_message_name_options():
    fds = descriptor_pb2.FileDescriptorSet()
    fds.file.append(descriptor_pb2.FileDescriptorProto.FromString(
        timestamp_pb2.DESCRIPTOR.serialized_pb))
    fds.file.append(order_file())
    inline = base64.b64encode(fds.SerializeToString()).decode()
    f = resolve_formats({"valueformat": "protobuf", "valueschema": inline,
                         "valuemessagename": "shop.Address"}, ["t"])
    assert protobuf_types(f.value.reader_schema)[1].simpleString() == \
        "struct<city:string,zip:string>"
    with pytest.raises(OptionError, match="FileDescriptorSet, base64"):
        resolve_formats({"valueformat": "protobuf", "valueschema": "{not base64"}, ["t"])
    with pytest.raises(OptionError, match="'valueMessageName' is for 'valueFormat' protobuf"):
        resolve_formats({"valueformat": "avro", "valueschema": '"long"',
                         "valuemessagename": "x"}, ["t"])


def test_empty_messages_and_columns_have_the_declared_type():
    text = text_of(order_file())
    decoder = ProtobufColumnDecoder(text)
    want = protobuf_types(text)[0]
    for values in ([], [None], [b"\x00\x00\x00\x00\x07\x02\x02"]):   # the last: all absent
        out = decoder.decode(pa.array(values, pa.binary()))
        assert out.array.type == want and not out.bad.any()
    row = out.array.to_pylist()[0]
    assert row["items"] == [] and row["attrs"] == [] and row["address"] is None
    assert row["order_id"] is None


def test_message_indexes_in_either_form():
    fdp = descriptor_pb2.FileDescriptorProto(name="a.proto", package="a", syntax="proto3")
    m = fdp.message_type.add(name="First")
    m.field.add(name="x", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    decoder = ProtobufColumnDecoder(text_of(fdp, "a.First"))
    header = b"\x00\x00\x00\x00\x01"
    out = decoder.decode(pa.array([header + b"\x00\x08\x05",          # [0] as a lone 0
                                   header + b"\x02\x00\x08\x06",      # [0] written out
                                   header + b"\x02\x02\x08\x07",      # [1]: another message
                                   header + b"\xfe\xff\xff\xff\x0f"],  # a count of 2^31-1
                                  pa.binary()))
    assert out.bad.tolist() == [False, False, True, True]
    assert [r and r["x"] for r in out.array.to_pylist()] == [5, 6, None, None]
    assert "impossible message index count" in out.reasons[3]


def test_a_map_without_the_map_entry_option_is_still_a_map():
    """Karapace serializes a schema from its .proto text without the entry's map_entry option:
    the entry's shape (AttrsEntry of key 1 and value 2, nested in the message) says map."""
    fdp = order_file()
    for nested in fdp.message_type[1].nested_type:
        nested.ClearField("options")
    spark_type = protobuf_types(text_of(fdp))[1]
    assert spark_type["attrs"].dataType.simpleString() == "map<string,bigint>"
    msgs = orders(message_class(order_file()), 6)
    _, rows = decoded(ProtobufColumnDecoder(text_of(fdp), framed=False),
                      [o.SerializeToString() for o in msgs])
    assert [r["attrs"] for r in rows] == [sorted(dict(o.attrs).items()) for o in msgs]
