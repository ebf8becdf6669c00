"""Protobuf schemas: descriptors from the registry, and their Spark and Arrow types.

Confluent's registry keeps a Protobuf schema as ``.proto`` text; asked for a schema id with
``?format=serialized`` (Confluent's registry and Karapace both answer it), it returns the file's
``FileDescriptorProto``, base64-encoded, which Google's ``protobuf`` package loads into a
descriptor pool without a ``.proto`` parser. Imports of other subjects (the schema's
``references``) are fetched the same way and loaded first; Google's well-known types
(``google/protobuf/timestamp.proto``, ...) come with the package.

A column's reader schema is kept as JSON text -- the serialized files, dependencies first, and
the message's full name -- so that it pickles into the input partitions like an Avro schema.

Types, as Spark's ``from_protobuf`` maps them: ``int32``, ``sint32``, ``sfixed32``, ``uint32``,
``fixed32`` -- int; the 64-bit integers -- long; ``float``, ``double``, ``bool``, ``string``,
``bytes`` -- the same; enums -- string (the value's name); messages -- struct;
``google.protobuf.Timestamp`` -- timestamp; ``google.protobuf.Duration`` -- interval day to
second; ``repeated`` -- array; ``map<K, V>`` -- map. Every field is nullable (an absent field is
null, as ``from_protobuf`` reads it by default); array elements and map values are not. A
recursive message has no Spark type (``from_protobuf`` refuses it by default) and is an error
naming the field.
"""

from __future__ import annotations

import base64
import json
from functools import lru_cache

import pyarrow as pa


class ProtobufSchemaError(ValueError):
    """A Protobuf schema that cannot be loaded, or has no Spark type."""


TIMESTAMP = "google.protobuf.Timestamp"
DURATION = "google.protobuf.Duration"


def schema_text(files: list[str], message: str) -> str:
    """The reader schema text of a column: base64 ``FileDescriptorProto`` s (dependencies
    first) and the message's full name."""
    return json.dumps({"files": files, "message": message})


@lru_cache(maxsize=64)
def message_descriptor(text: str):
    """The descriptor of the message a reader schema text names (cached per process)."""
    from google.protobuf import descriptor_pb2, descriptor_pool
    # Importing the well-known types puts their files in the default pool, whence
    # _add_well_known copies what a schema imports.
    from google.protobuf import duration_pb2, timestamp_pb2  # noqa: F401

    try:
        spec = json.loads(text)
        files, message = spec["files"], spec.get("message")
    except (ValueError, KeyError, TypeError):
        raise ProtobufSchemaError("a Protobuf reader schema is JSON with 'files' (base64 "
                                  "FileDescriptorProtos) and 'message'") from None
    pool = descriptor_pool.DescriptorPool()
    default = descriptor_pool.Default()
    last = None
    for encoded in files:
        proto = descriptor_pb2.FileDescriptorProto()
        try:
            proto.ParseFromString(base64.b64decode(encoded))
        except Exception as e:  # noqa: BLE001 - DecodeError and binascii.Error
            raise ProtobufSchemaError(f"not a serialized FileDescriptorProto: {e}") from None
        for dep in proto.dependency:
            _add_well_known(pool, default, dep)
        _restore_synthetic_oneofs(proto)
        _restore_map_entries(proto)
        try:
            last = pool.Add(proto) or pool.FindFileByName(proto.name)
        except TypeError as e:
            try:
                last = pool.FindFileByName(proto.name)
            except KeyError:
                raise ProtobufSchemaError(f"file {proto.name!r}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the pool's own errors
            raise ProtobufSchemaError(f"file {proto.name!r}: {e}") from None
    if last is None:
        raise ProtobufSchemaError("no Protobuf file in the schema")
    file = pool.FindFileByName(proto.name)
    if not message:
        if not file.message_types_by_name:
            raise ProtobufSchemaError(f"file {proto.name!r} defines no message")
        return next(iter(file.message_types_by_name.values()))
    try:
        return pool.FindMessageTypeByName(message)
    except KeyError:
        names = [m.full_name for m in file.message_types_by_name.values()]
        raise ProtobufSchemaError(f"no message {message!r} in the schema (it has "
                                  f"{', '.join(names) or 'none'})") from None


def _restore_synthetic_oneofs(proto) -> None:
    """A proto3 ``optional`` field sits in a synthetic oneof of its own (``_name``), declared
    after the message's real oneofs. Karapace 5.0.3 serializes such fields without it, which
    the descriptor pool refuses ("proto3_optional was not in a oneof"): put it back."""
    def fix(message) -> None:
        for field in message.field:
            if field.proto3_optional and not field.HasField("oneof_index"):
                field.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add(name=f"_{field.name}")
        for nested in message.nested_type:
            fix(nested)

    for message in proto.message_type:
        fix(message)


_SCALARS = ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
            "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes")


def _restore_map_entries(proto) -> None:
    """A ``map<K, V>`` field is repeated entries of a nested ``<Field>Entry`` message (key 1,
    value 2). Karapace 5.0.3 serializes a schema registered as ``.proto`` text with the field's
    type left as the text ``map<string, int64>`` and no entry message, which the descriptor pool
    cannot resolve: build the entry as protoc would."""
    import re

    from google.protobuf import descriptor_pb2

    F = descriptor_pb2.FieldDescriptorProto
    written = re.compile(r"^\s*map\s*<\s*([\w.]+)\s*,\s*([\w.]+)\s*>\s*$")

    def typed(field, name: str) -> None:
        if name in _SCALARS:
            field.type = getattr(F, f"TYPE_{name.upper()}")
        else:
            field.type_name = name          # a message or an enum, resolved by the pool

    def fix(message) -> None:
        for field in message.field:
            found = written.match(field.type_name) if field.type_name else None
            if found is None:
                continue
            entry_name = "".join(p[:1].upper() + p[1:] for p in field.name.split("_")) + "Entry"
            entry = message.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            typed(entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL), found[1])
            typed(entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL), found[2])
            field.label = F.LABEL_REPEATED
            field.type = F.TYPE_MESSAGE
            field.type_name = entry_name
        for nested in message.nested_type:
            fix(nested)

    for message in proto.message_type:
        fix(message)


def _add_well_known(pool, default, name: str) -> None:
    if not name.startswith("google/protobuf/"):
        return
    try:
        pool.FindFileByName(name)
        return
    except KeyError:
        pass
    from google.protobuf import descriptor_pb2

    try:
        found = default.FindFileByName(name)
    except KeyError:
        return      # the pool says which import is missing when the file is added
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    for dep in proto.dependency:
        _add_well_known(pool, default, dep)
    pool.Add(proto)


def message_index(desc) -> list[int]:
    """The message's indexes in its file, as Confluent's wire format writes them (the position
    of the top-level message, then of each nested one)."""
    path = []
    while desc is not None:
        parent = desc.containing_type
        siblings = parent.nested_types if parent is not None else list(
            desc.file.message_types_by_name.values())
        path.append([s.full_name for s in siblings].index(desc.full_name))
        desc = parent
    return path[::-1]


def repeated(field) -> bool:
    flag = getattr(field, "is_repeated", None)      # protobuf 6+; 'label' before (deprecated)
    return bool(flag) if flag is not None else field.label == field.LABEL_REPEATED


def is_map(field) -> bool:
    """A ``map<K, V>`` field: repeated entries of a nested ``<Field>Entry`` message of ``key`` (1)
    and ``value`` (2). protoc marks the entry ``map_entry``; a descriptor rebuilt from ``.proto``
    text may not (Karapace's serialized schemas lack the option), so the shape protoc gives every
    map entry counts too."""
    m = field.message_type
    if not repeated(field) or m is None:
        return False
    if m.GetOptions().map_entry:
        return True
    camel = "".join(p[:1].upper() + p[1:] for p in field.name.split("_"))
    numbers = {f.number: f.name for f in m.fields}
    return (m.containing_type is not None and m.containing_type is field.containing_type
            and m.name == f"{camel}Entry" and numbers == {1: "key", 2: "value"})


def _scalar_types(field):
    from pyspark.sql import types as T

    F = field
    t = field.type
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32, F.TYPE_UINT32, F.TYPE_FIXED32):
        return pa.int32(), T.IntegerType()
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64, F.TYPE_UINT64, F.TYPE_FIXED64):
        return pa.int64(), T.LongType()
    if t == F.TYPE_FLOAT:
        return pa.float32(), T.FloatType()
    if t == F.TYPE_DOUBLE:
        return pa.float64(), T.DoubleType()
    if t == F.TYPE_BOOL:
        return pa.bool_(), T.BooleanType()
    if t in (F.TYPE_STRING, F.TYPE_ENUM):
        return pa.string(), T.StringType()
    if t == F.TYPE_BYTES:
        return pa.binary(), T.BinaryType()
    raise ProtobufSchemaError(f"field {field.full_name}: a group (proto2) has no Spark type here")


def field_types(field, seen: tuple = ()):
    """(Arrow type, Spark type) of a field, repeated and map included."""
    from pyspark.sql import types as T

    if is_map(field):
        entry = field.message_type
        k, ks = _value_types(entry.fields_by_number[1], seen)
        v, vs = _value_types(entry.fields_by_number[2], seen)
        return (pa.map_(pa.field("key", k, nullable=False), pa.field("value", v, nullable=False)),
                T.MapType(ks, vs, valueContainsNull=False))
    a, s = _value_types(field, seen)
    if repeated(field):
        return pa.list_(pa.field("element", a, nullable=False)), T.ArrayType(s, False)
    return a, s


def _value_types(field, seen: tuple):
    from pyspark.sql import types as T

    if field.type != field.TYPE_MESSAGE:
        return _scalar_types(field)
    m = field.message_type
    if m.full_name == TIMESTAMP:
        return pa.timestamp("us", tz="UTC"), T.TimestampType()
    if m.full_name == DURATION:
        return pa.duration("us"), T.DayTimeIntervalType()
    if m.full_name in seen:
        raise ProtobufSchemaError(f"field {field.full_name}: message {m.full_name} contains "
                                  "itself; a recursive message has no Spark type")
    return message_types(m, seen + (m.full_name,))


def message_types(desc, seen: tuple = ()):
    """(Arrow struct, Spark struct) of a message: its fields in declaration order."""
    from pyspark.sql import types as T

    seen = seen or (desc.full_name,)
    pairs = [(f.name, field_types(f, seen)) for f in desc.fields]
    if not pairs:
        raise ProtobufSchemaError(f"message {desc.full_name} has no fields; an empty struct "
                                  "has no Spark type")
    return (pa.struct([pa.field(n, a, nullable=True) for n, (a, _) in pairs]),
            T.StructType([T.StructField(n, s, True) for n, (_, s) in pairs]))


def protobuf_types(text: str):
    """(Arrow type, Spark type) of a column read with reader schema ``text``."""
    return message_types(message_descriptor(text))
