"""The output schema: exactly Spark's Kafka source schema, as a Spark type and as an Arrow schema.

The two must agree field for field, nullability included, or Spark rejects the Arrow batches that
``read()`` yields.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

HEADER_TYPE = StructType([
    StructField("key", StringType(), True),
    StructField("value", BinaryType(), True),
])

_BASE_FIELDS = [
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
]


def spark_schema(include_headers: bool, formats=None) -> StructType:
    """Spark's Kafka schema; with ``formats`` (:class:`kafka_source.formats.options.Formats`)
    the formatted key/value columns are structs of the reader schema's type, and in PERMISSIVE
    mode each has a string column of reasons at the end (``valueError``, ``keyError``)."""
    fields = list(_BASE_FIELDS)
    if include_headers:
        fields.append(StructField("headers", ArrayType(HEADER_TYPE, True), True))
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
