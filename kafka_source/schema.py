"""The output schema: exactly Spark's Kafka source schema, as a Spark type and as an Arrow schema.

The two must agree field for field, nullability included, or Spark rejects the Arrow batches that
``read()`` yields.
"""

from __future__ import annotations

from functools import cache

import pyarrow as pa

# Spark's types are imported when the Spark schema is asked for (the planner, the writer), not
# with this module: the executors' decode path (kafka_source.wire.format) needs only the Arrow
# schema, and with it the whole wire layer imports without PySpark, which is what lets its unit
# tests run once rather than on every PySpark release (tests/conftest.py, ``pyspark_free``).


@cache
def _spark_types():
    from pyspark.sql import types as t

    header = t.StructType([
        t.StructField("key", t.StringType(), True),
        t.StructField("value", t.BinaryType(), True),
    ])
    base = [
        t.StructField("key", t.BinaryType(), True),
        t.StructField("value", t.BinaryType(), True),
        t.StructField("topic", t.StringType(), True),
        t.StructField("partition", t.IntegerType(), True),
        t.StructField("offset", t.LongType(), True),
        t.StructField("timestamp", t.TimestampType(), True),
        t.StructField("timestampType", t.IntegerType(), True),
    ]
    return header, base


def __getattr__(name: str):
    # HEADER_TYPE: the headers' element type as a Spark StructType (PEP 562, so that it too is
    # built only when asked for).
    if name == "HEADER_TYPE":
        return _spark_types()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spark_schema(include_headers: bool, formats=None):
    """Spark's Kafka schema; with ``formats`` (:class:`kafka_source.formats.options.Formats`)
    the formatted key/value columns are structs of the reader schema's type, and in PERMISSIVE
    mode each has a string column of reasons at the end (``valueError``, ``keyError``)."""
    from pyspark.sql.types import ArrayType, StringType, StructField, StructType

    header_type, base_fields = _spark_types()
    fields = list(base_fields)
    if include_headers:
        fields.append(StructField("headers", ArrayType(header_type, True), True))
    if formats is not None and formats.any:
        from .formats.columns import error_column
        from .formats.options import format_columns_spark

        typed = format_columns_spark(formats)
        fields = [StructField(f.name, typed[f.name], True) if f.name in typed else f
                  for f in fields]
        if formats.mode == "PERMISSIVE":
            fields += [StructField(error_column(c.column), StringType(), True)
                       for c in formats.columns()]
    return StructType(fields)


ARROW_HEADER_TYPE = pa.struct([
    pa.field("key", pa.string(), nullable=True),
    pa.field("value", pa.binary(), nullable=True),
])

_ARROW_BASE = [
    pa.field("key", pa.binary(), nullable=True),
    pa.field("value", pa.binary(), nullable=True),
    pa.field("topic", pa.string(), nullable=True),
    pa.field("partition", pa.int32(), nullable=True),
    pa.field("offset", pa.int64(), nullable=True),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=True),
    pa.field("timestampType", pa.int32(), nullable=True),
]


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = list(_ARROW_BASE)
    if include_headers:
        fields.append(pa.field("headers", pa.list_(pa.field("element", ARROW_HEADER_TYPE,
                                                            nullable=True)), nullable=True))
    return pa.schema(fields)
