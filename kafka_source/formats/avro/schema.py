"""Avro schemas: parsed into a small tree, and mapped to Spark and Arrow types.

The mapping is spark-avro's (``SchemaConverters.toSqlType``), so a DataFrame read here has the
types ``from_avro`` would give it:

* ``boolean``, ``int``, ``long``, ``float``, ``double``, ``string``, ``bytes`` -- the matching
  Spark type; ``enum`` -- string; ``fixed`` -- binary;
* logical types: ``date`` -- date; ``timestamp-millis``/``-micros``/``-nanos`` -- timestamp;
  ``local-timestamp-*`` -- timestamp without time zone; ``decimal`` (on bytes or fixed) --
  decimal(precision, scale); ``uuid`` -- string;
* ``record`` -- struct, its fields in order, each nullable only if its type is;
* ``array`` -- array, ``map`` -- map of string keys;
* unions: ``[null, T]`` (either order) -- T, nullable; ``[int, long]`` -- long; ``[float,
  double]`` -- double; any other union -- a struct ``member0``, ``member1``, ... with one
  nullable field per non-null branch, of which the record's branch is set.

Named types may be referenced by (full) name after their definition. A recursive record cannot
become a Spark type (spark-avro refuses it too) and is an error naming the type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")


class AvroSchemaError(ValueError):
    """A schema that is not valid Avro, or that has no Spark type."""


@dataclass(eq=False)
class Node:
    """One type of a parsed schema. ``kind`` is a primitive name or record/enum/fixed/array/
    map/union; ``logical`` the logical type, if any, that this module supports."""

    kind: str
    name: str | None = None               # full name of a named type
    aliases: tuple[str, ...] = ()
    fields: list["Field"] = field(default_factory=list)      # record
    symbols: tuple[str, ...] = ()         # enum
    default_symbol: str | None = None     # enum
    size: int = 0                         # fixed
    items: "Node | None" = None           # array
    values: "Node | None" = None          # map
    branches: list["Node"] = field(default_factory=list)     # union
    logical: str | None = None
    precision: int = 0
    scale: int = 0

    @property
    def short_name(self) -> str | None:
        return None if self.name is None else self.name.rsplit(".", 1)[-1]

    def describe(self) -> str:
        if self.kind == "union":
            return "[" + ", ".join(b.describe() for b in self.branches) + "]"
        if self.name:
            return f"{self.kind} {self.name}"
        return self.logical or self.kind


@dataclass(eq=False)
class Field:
    name: str
    type: Node
    default: Any = None
    has_default: bool = False
    aliases: tuple[str, ...] = ()


def parse_schema(text: str | dict | list) -> Node:
    """Parse an Avro schema (JSON text or the decoded JSON) into a :class:`Node` tree."""
    if isinstance(text, str):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError:
            raw = text.strip()   # a bare primitive name, e.g. string
            if raw not in PRIMITIVES:
                raise AvroSchemaError(f"not an Avro schema (neither JSON nor a primitive type "
                                      f"name): {text[:200]!r}") from None
    else:
        raw = text
    return _Parser().parse(raw, namespace=None)


class _Parser:
    def __init__(self) -> None:
        self.named: dict[str, Node] = {}
        self.defining: set[str] = set()

    def _full(self, name: str, namespace: str | None) -> str:
        if "." in name or not namespace:
            return name
        return f"{namespace}.{name}"

    def parse(self, raw: Any, namespace: str | None) -> Node:
        if isinstance(raw, str):
            if raw in PRIMITIVES:
                return Node(raw)
            for candidate in (self._full(raw, namespace), raw):
                if candidate in self.named:
                    if candidate in self.defining:
                        raise AvroSchemaError(
                            f"the schema is recursive (record {candidate} contains itself); "
                            "a recursive Avro type has no Spark type")
                    return self.named[candidate]
            raise AvroSchemaError(f"unknown type name {raw!r} in the schema (named types must be "
                                  "defined before they are used)")
        if isinstance(raw, list):
            branches = [self.parse(b, namespace) for b in raw]
            if any(b.kind == "union" for b in branches):
                raise AvroSchemaError("a union directly inside a union is not valid Avro")
            return Node("union", branches=branches)
        if not isinstance(raw, dict) or "type" not in raw:
            raise AvroSchemaError(f"not an Avro schema: {json.dumps(raw)[:200]}")
        kind = raw["type"]
        if isinstance(kind, (dict, list)) or (kind in PRIMITIVES and "logicalType" not in raw):
            if isinstance(kind, (dict, list)):
                return self.parse(kind, namespace)
            return Node(kind)
        if kind in PRIMITIVES:
            return self._logical(Node(kind), raw)
        if kind in ("record", "error", "enum", "fixed"):
            return self._named(kind, raw, namespace)
        if kind == "array":
            return Node("array", items=self.parse(raw.get("items"), namespace))
        if kind == "map":
            return Node("map", values=self.parse(raw.get("values"), namespace))
        return self.parse(kind, namespace)    # {"type": "some.Named"}

    def _named(self, kind: str, raw: dict, namespace: str | None) -> Node:
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise AvroSchemaError(f"a {kind} needs a name: {json.dumps(raw)[:200]}")
        space = raw.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
        full = self._full(name, space)
        aliases = tuple(self._full(a, space) for a in raw.get("aliases", ()))
        if kind == "enum":
            node = Node("enum", name=full, aliases=aliases, symbols=tuple(raw.get("symbols", ())),
                        default_symbol=raw.get("default"))
        elif kind == "fixed":
            node = self._logical(Node("fixed", name=full, aliases=aliases,
                                      size=int(raw.get("size", 0))), raw)
        else:
            node = Node("record", name=full, aliases=aliases)
        self.named[full] = node
        if kind in ("record", "error"):
            self.defining.add(full)
            for f in raw.get("fields", ()):
                if not isinstance(f, dict) or "name" not in f or "type" not in f:
                    raise AvroSchemaError(f"record {full}: a field needs a name and a type: "
                                          f"{json.dumps(f)[:200]}")
                node.fields.append(Field(f["name"], self.parse(f["type"], space),
                                         default=f.get("default"), has_default="default" in f,
                                         aliases=tuple(f.get("aliases", ()))))
            self.defining.discard(full)
        return node

    @staticmethod
    def _logical(node: Node, raw: dict) -> Node:
        logical = raw.get("logicalType")
        ok = {
            "int": ("date",),
            "long": ("timestamp-millis", "timestamp-micros", "timestamp-nanos",
                     "local-timestamp-millis", "local-timestamp-micros", "local-timestamp-nanos"),
            "string": ("uuid",),
            "bytes": ("decimal",),
            "fixed": ("decimal",),
        }.get(node.kind, ())
        if logical in ok:          # anything else is read as the underlying type, as Avro says
            node.logical = logical
            if logical == "decimal":
                node.precision = int(raw.get("precision", 0))
                node.scale = int(raw.get("scale", 0))
                if not 0 < node.precision <= 38 or not 0 <= node.scale <= node.precision:
                    node.logical = None    # invalid decimal: the underlying type (Avro spec)
        return node


# ------------------------------------------------------------------------------------------------
# Spark and Arrow types
# ------------------------------------------------------------------------------------------------

def non_null_branches(node: Node) -> list[Node]:
    return [b for b in node.branches if b.kind != "null"]


def union_shape(node: Node) -> str:
    """How a union maps: 'null' (only null), 'optional' ([null, T]), 'long' ([int, long]),
    'double' ([float, double]), or 'members' (a struct of member0...)."""
    others = non_null_branches(node)
    if not others:
        return "null"
    if len(others) == 1:
        return "optional"
    kinds = sorted(b.kind for b in others if b.logical is None)
    if len(kinds) == len(others) and kinds == ["int", "long"]:
        return "long"
    if len(kinds) == len(others) and kinds == ["double", "float"]:
        return "double"
    return "members"


def is_nullable(node: Node) -> bool:
    return node.kind == "null" or (node.kind == "union" and any(b.kind == "null"
                                                                for b in node.branches))


def spark_type(node: Node):
    """The Spark SQL type of ``node`` (spark-avro's mapping)."""
    from pyspark.sql import types as T

    k = node.kind
    if k == "union":
        shape = union_shape(node)
        if shape == "null":
            return T.NullType()
        if shape == "optional":
            return spark_type(non_null_branches(node)[0])
        if shape == "long":
            return T.LongType()
        if shape == "double":
            return T.DoubleType()
        return T.StructType([T.StructField(f"member{i}", spark_type(b), True)
                             for i, b in enumerate(non_null_branches(node))])
    if node.logical == "decimal":
        return T.DecimalType(node.precision, node.scale)
    if node.logical == "date":
        return T.DateType()
    if node.logical in ("timestamp-millis", "timestamp-micros", "timestamp-nanos"):
        return T.TimestampType()
    if node.logical and node.logical.startswith("local-timestamp"):
        return T.TimestampNTZType()
    simple = {"null": T.NullType, "boolean": T.BooleanType, "int": T.IntegerType,
              "long": T.LongType, "float": T.FloatType, "double": T.DoubleType,
              "bytes": T.BinaryType, "string": T.StringType, "enum": T.StringType,
              "fixed": T.BinaryType}
    if k in simple:
        return simple[k]()
    if k == "record":
        return T.StructType([T.StructField(f.name, spark_type(f.type), is_nullable(f.type))
                             for f in node.fields])
    if k == "array":
        return T.ArrayType(spark_type(node.items), is_nullable(node.items))
    if k == "map":
        return T.MapType(T.StringType(), spark_type(node.values), is_nullable(node.values))
    raise AvroSchemaError(f"no Spark type for Avro {node.describe()}")


def arrow_type(node: Node) -> pa.DataType:
    """The Arrow type Spark expects for :func:`spark_type` of ``node`` (as PySpark's
    ``to_arrow_type`` makes it: list items named ``element``, maps ``key``/``value``)."""
    k = node.kind
    if k == "union":
        shape = union_shape(node)
        if shape == "null":
            return pa.null()
        if shape == "optional":
            return arrow_type(non_null_branches(node)[0])
        if shape == "long":
            return pa.int64()
        if shape == "double":
            return pa.float64()
        return pa.struct([pa.field(f"member{i}", arrow_type(b), nullable=True)
                          for i, b in enumerate(non_null_branches(node))])
    if node.logical == "decimal":
        return pa.decimal128(node.precision, node.scale)
    if node.logical == "date":
        return pa.date32()
    if node.logical in ("timestamp-millis", "timestamp-micros", "timestamp-nanos"):
        return pa.timestamp("us", tz="UTC")
    if node.logical and node.logical.startswith("local-timestamp"):
        return pa.timestamp("us")
    simple = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
              "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(),
              "string": pa.string(), "enum": pa.string(), "fixed": pa.binary()}
    if k in simple:
        return simple[k]
    if k == "record":
        return pa.struct([pa.field(f.name, arrow_type(f.type), nullable=is_nullable(f.type))
                          for f in node.fields])
    if k == "array":
        return pa.list_(pa.field("element", arrow_type(node.items),
                                 nullable=is_nullable(node.items)))
    if k == "map":
        return pa.map_(pa.field("key", pa.string(), nullable=False),
                       pa.field("value", arrow_type(node.values),
                                nullable=is_nullable(node.values)))
    raise AvroSchemaError(f"no Arrow type for Avro {node.describe()}")


# ------------------------------------------------------------------------------------------------
# From a Spark type: the writer schema of a column the sink writes
# ------------------------------------------------------------------------------------------------

def minimum_fixed_size(precision: int) -> int:
    """The fewest bytes that hold every unscaled value of ``precision`` digits, signed (as
    spark-avro sizes a decimal's fixed)."""
    size = 1
    while 2 ** (8 * size - 1) < 10 ** precision:
        size += 1
    return size


def avro_schema_of(data_type, name: str = "topLevelRecord", namespace: str = "") -> object:
    """The Avro schema (decoded JSON) of a column of Spark type ``data_type``.

    As spark-avro's ``to_avro`` derives it (``SchemaConverters.toAvroType``: nested records
    named after their field, in the namespace of their path; decimals as ``fixed`` of the fewest
    bytes; timestamps as ``timestamp-micros``, timestamp_ntz as ``local-timestamp-micros``;
    byte and short as ``int``), with one difference: a nullable field is ``["null", T]`` with
    the default ``null`` (spark-avro writes ``[T, "null"]`` with no default), which is how
    Confluent's tools write optional fields and what lets a new optional field be BACKWARD
    compatible in the registry."""
    from pyspark.sql import types as T

    def of(dt, name: str, space: str) -> object:
        if isinstance(dt, T.BooleanType):
            return "boolean"
        if isinstance(dt, (T.ByteType, T.ShortType, T.IntegerType)):
            return "int"
        if isinstance(dt, T.LongType):
            return "long"
        if isinstance(dt, T.FloatType):
            return "float"
        if isinstance(dt, T.DoubleType):
            return "double"
        if isinstance(dt, (T.StringType, T.VarcharType, T.CharType)):
            return "string"
        if isinstance(dt, T.BinaryType):
            return "bytes"
        if isinstance(dt, T.DateType):
            return {"type": "int", "logicalType": "date"}
        if isinstance(dt, T.TimestampNTZType):
            return {"type": "long", "logicalType": "local-timestamp-micros"}
        if isinstance(dt, T.TimestampType):
            return {"type": "long", "logicalType": "timestamp-micros"}
        if isinstance(dt, T.DecimalType):
            fixed = {"type": "fixed", "name": name, "size": minimum_fixed_size(dt.precision),
                     "logicalType": "decimal", "precision": dt.precision, "scale": dt.scale}
            if space:
                fixed["namespace"] = space
            return fixed
        if isinstance(dt, T.ArrayType):
            return {"type": "array", "items": optional(of(dt.elementType, name, space),
                                                       dt.containsNull)}
        if isinstance(dt, T.MapType):
            if not isinstance(dt.keyType, T.StringType):
                raise AvroSchemaError(f"{name}: an Avro map has string keys; a map with "
                                      f"{dt.keyType.simpleString()} keys has no Avro type")
            return {"type": "map", "values": optional(of(dt.valueType, name, space),
                                                      dt.valueContainsNull)}
        if isinstance(dt, T.StructType):
            inner = f"{space}.{name}" if space else name
            record: dict = {"type": "record", "name": name}
            if space:
                record["namespace"] = space
            fields = []
            for f in dt.fields:
                field = {"name": f.name, "type": optional(of(f.dataType, f.name, inner),
                                                          f.nullable)}
                if f.nullable:
                    field["default"] = None
                fields.append(field)
            record["fields"] = fields
            return record
        raise AvroSchemaError(f"{name}: Spark type {dt.simpleString()} has no Avro type")

    def optional(schema, nullable: bool):
        return ["null", schema] if nullable else schema

    return of(data_type, name, namespace)
