"""The Protobuf schema of a Spark type, for the sink: a proto3 file with one message.

The file is built as a ``FileDescriptorProto`` (no ``.proto`` text is parsed or printed) and
registered in its serialized form, base64, as confluent-kafka's ``ProtobufSerializer`` registers
schemas; Confluent's registry and Karapace both take that form and keep it as ``.proto`` text.

The mapping is the reverse of the reader's (:mod:`.schema`, Spark's ``from_protobuf``), so that a
column written and read back keeps its type where Protobuf has one:

* byte, short, int -- ``int32``; long -- ``int64``; float; double; boolean -- ``bool``;
  string; binary -- ``bytes``; timestamp (and timestamp_ntz) -- ``google.protobuf.Timestamp``;
  date -- ``int32``, the days since 1970-01-01 (Protobuf has no date; Spark's ``to_protobuf``
  takes none either); decimal -- ``string``, its exact digits;
* a nullable scalar field is ``optional`` (proto3's explicit presence), so that a null is an
  absent field, read back as null, not as 0 or "";
* struct -- a nested message named after the field (``ship_to`` -- ``ShipTo``); array --
  ``repeated``; map (string, integer or boolean keys) -- ``map<K, V>``.

What Protobuf cannot say is an error naming the field: an array of arrays or of maps, a map of
arrays or maps (they need a wrapper message), map keys of other types.
"""

from __future__ import annotations

import base64

from .schema import ProtobufSchemaError, schema_text

DEFAULT_MESSAGE = "TopLevelRecord"


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_") if p) or "Field"


def protobuf_file_of(dt, full_name: str | None = None):
    """(``FileDescriptorProto``, the message's full name) of a column of Spark type ``dt``;
    ``full_name`` (``valueRecordName``) names the message and its package."""
    from google.protobuf import descriptor_pb2
    from pyspark.sql import types as T

    package, _, name = (full_name or DEFAULT_MESSAGE).rpartition(".")
    if not isinstance(dt, T.StructType):
        raise ProtobufSchemaError(f"a Protobuf value is a message: the column is "
                                  f"{dt.simpleString()}, not a struct (wrap it: "
                                  "F.struct(col))")
    file = descriptor_pb2.FileDescriptorProto(
        name=(package.replace(".", "/") + "/" if package else "") + f"{name}.proto",
        package=package, syntax="proto3")
    message = file.message_type.add(name=name)
    imports: set[str] = set()
    _fill(message, dt, f".{package}.{name}" if package else f".{name}", imports, name)
    file.dependency.extend(sorted(imports))
    return file, (f"{package}.{name}" if package else name)


def protobuf_schema_of(dt, full_name: str | None = None) -> str:
    """The writer schema text (the serialized file and the message's name, as
    :func:`.schema.schema_text` keeps a reader schema) of a column of Spark type ``dt``."""
    file, message = protobuf_file_of(dt, full_name)
    return schema_text([base64.b64encode(file.SerializeToString()).decode()], message)


def _fill(message, struct, scope: str, imports: set, where: str) -> None:
    from google.protobuf import descriptor_pb2
    from pyspark.sql import types as T

    F = descriptor_pb2.FieldDescriptorProto
    taken = {f.name for f in struct.fields}
    for number, field in enumerate(struct.fields, start=1):
        path = f"{where}.{field.name}"
        dt = field.dataType
        proto = message.field.add(name=field.name, number=number, label=F.LABEL_OPTIONAL)
        if isinstance(dt, T.ArrayType):
            if isinstance(dt.elementType, (T.ArrayType, T.MapType)):
                raise ProtobufSchemaError(f"field '{path}' is an array of "
                                          f"{dt.elementType.typeName()}s, which Protobuf has no "
                                          "type for (wrap the element in a struct)")
            proto.label = F.LABEL_REPEATED
            _element(message, proto, dt.elementType, scope, imports, path, taken)
            continue
        if isinstance(dt, T.MapType):
            key_types = (T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType,
                         T.BooleanType)
            if not isinstance(dt.keyType, key_types):
                raise ProtobufSchemaError(f"field '{path}' is a map with "
                                          f"{dt.keyType.simpleString()} keys; Protobuf map keys "
                                          "are integers, strings or booleans")
            if isinstance(dt.valueType, (T.ArrayType, T.MapType)):
                raise ProtobufSchemaError(f"field '{path}' is a map of "
                                          f"{dt.valueType.typeName()}s, which Protobuf has no "
                                          "type for (wrap the value in a struct)")
            entry_name = _camel(field.name) + "Entry"
            entry = message.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            key = entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL)
            _element(message, key, dt.keyType, scope, imports, path, taken)
            value = entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL)
            # a struct value's message is the parent's (an entry holds no nested types)
            _element(message, value, dt.valueType, scope, imports, path, taken)
            proto.label = F.LABEL_REPEATED
            proto.type = F.TYPE_MESSAGE
            proto.type_name = f"{scope}.{entry_name}"
            continue
        _element(message, proto, dt, scope, imports, path, taken)
        if field.nullable and proto.type != F.TYPE_MESSAGE:
            # proto3 'optional': a synthetic oneof holding the one field
            proto.proto3_optional = True
            proto.oneof_index = len(message.oneof_decl)
            message.oneof_decl.add(name=f"_{field.name}")


def _element(message, proto, dt, scope: str, imports: set, path: str, taken: set) -> None:
    """Sets the type of ``proto`` (a field, or a map entry's key or value) for Spark type
    ``dt``; a struct becomes a message nested in ``message``."""
    from google.protobuf import descriptor_pb2
    from pyspark.sql import types as T

    F = descriptor_pb2.FieldDescriptorProto
    scalars = [((T.ByteType, T.ShortType, T.IntegerType, T.DateType), F.TYPE_INT32),
               ((T.LongType,), F.TYPE_INT64), ((T.FloatType,), F.TYPE_FLOAT),
               ((T.DoubleType,), F.TYPE_DOUBLE), ((T.BooleanType,), F.TYPE_BOOL),
               ((T.StringType, T.VarcharType, T.CharType, T.DecimalType), F.TYPE_STRING),
               ((T.BinaryType,), F.TYPE_BYTES)]
    for kinds, proto_type in scalars:
        if isinstance(dt, kinds):
            proto.type = proto_type
            return
    if isinstance(dt, (T.TimestampType, T.TimestampNTZType)):
        proto.type = F.TYPE_MESSAGE
        proto.type_name = ".google.protobuf.Timestamp"
        imports.add("google/protobuf/timestamp.proto")
        return
    if isinstance(dt, T.StructType):
        name = _camel(proto.name if proto.name not in ("key", "value") else path.rsplit(".", 1)[-1]
                      + "_" + proto.name)
        while name in taken or any(n.name == name for n in message.nested_type):
            name += "_"
        nested = message.nested_type.add(name=name)
        _fill(nested, dt, f"{scope}.{name}", imports, path)
        proto.type = F.TYPE_MESSAGE
        proto.type_name = f"{scope}.{name}"
        return
    raise ProtobufSchemaError(f"field '{path}' is {dt.simpleString()}, which has no Protobuf "
                              "type here")
