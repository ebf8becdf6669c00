"""The input columns of a write: checked on the driver, read from Arrow on the executors.

The columns are Spark's Kafka sink's: ``value`` (string or binary, required), ``key`` (string or
binary), ``topic`` (string), ``partition`` (int) and ``headers``
(``array<struct<key: string, value: binary>>``). As in Spark, a column is found by its exact
name, the ``topic`` option overrides the ``topic`` column (which is then not even looked at),
and any other column is ignored -- so the DataFrame a Kafka read returns (with ``offset``,
``timestamp``, ``timestampType``) can be written back as it is. A known column of the wrong
type is an error naming the column, its type and the types accepted, raised when the writer is
made on the driver, before any task runs.

Spark's newest sink also reads a ``timestamp`` column as each record's timestamp; this sink
writes every record with the time it is sent (CreateTime), so a ``timestamp`` column is ignored
with a warning rather than silently.

On the executors, string columns are re-typed as binary (a view of the same buffers: UTF-8 is
what Kafka stores), which is what the record encoder takes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..config.sink_options import OncePerProcess
from ..errors import ColumnError

log = logging.getLogger(__name__)
log.addFilter(OncePerProcess())     # a stream checks its columns again every micro-batch

__all__ = ["ColumnError", "Columns", "check_schema", "as_binary", "normalize_headers"]


@dataclass(frozen=True)
class Columns:
    """Which of the sink's columns the DataFrame has (by name; None when absent). Picklable."""

    value: str = "value"
    key: str | None = None
    topic: str | None = None          # None when the 'topic' option is set or there is none
    partition: str | None = None
    headers: str | None = None


_STRING_OR_BINARY = ("string", "binary")


def check_schema(schema, topic_option: str | None, formatted: frozenset = frozenset()) -> Columns:
    """The sink's columns of Spark ``schema`` (a StructType); ColumnError if one is unusable.
    ``formatted``: the columns written with ``valueFormat``/``keyFormat``, of any type (the
    format's encoder checks them)."""
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

    fields = {}
    for f in schema.fields:
        fields.setdefault(f.name, f)  # Spark uses the first column of a name

    def kind(dt) -> str:
        return dt.simpleString()

    def find(name: str, accepted: tuple[str, ...], ok) -> str | None:
        field = fields.get(name)
        if field is None:
            return None
        if not ok(field.dataType):
            raise ColumnError(f"Column '{name}' has type {kind(field.dataType)}; it must be "
                              f"{' or '.join(accepted)}. Cast it, e.g. "
                              f"CAST({name} AS {accepted[0].upper()}).")
        return name

    def string_or_binary(dt) -> bool:
        return isinstance(dt, (StringType, BinaryType))

    def value_type(column: str):
        return (lambda dt: True) if column in formatted else string_or_binary

    value = find("value", _STRING_OR_BINARY, value_type("value"))
    if value is None:
        near = [n for n in fields if n.lower() == "value"]
        hint = f" (there is '{near[0]}': column names are case-sensitive)" if near else ""
        raise ColumnError("The DataFrame written to Kafka needs a 'value' column (string or "
                          f"binary){hint}; its columns are {', '.join(fields) or 'none'}.")
    key = find("key", _STRING_OR_BINARY, value_type("key"))
    partition = find("partition", ("int",), lambda dt: isinstance(dt, IntegerType))

    def headers_ok(dt) -> bool:
        if not isinstance(dt, ArrayType) or not isinstance(dt.elementType, StructType):
            return False
        inner = dt.elementType.fields
        return (len(inner) == 2 and [f.name.lower() for f in inner] == ["key", "value"]
                and isinstance(inner[0].dataType, StringType)
                and isinstance(inner[1].dataType, BinaryType))

    headers = find("headers", ("array<struct<key:string,value:binary>>",), headers_ok)
    topic = None
    if topic_option is None:
        topic = find("topic", ("string",), lambda dt: isinstance(dt, StringType))
        if topic is None:
            raise ColumnError("No topic to write to: set the option 'topic', or give each "
                              "row's topic in a 'topic' column (string).")
    if "timestamp" in fields:
        log.warning("Column 'timestamp' is ignored: records are written with the time they are "
                    "sent as their timestamp (CreateTime).")
    return Columns(value=value, key=key, topic=topic, partition=partition, headers=headers)


# --- executor side ---------------------------------------------------------------------------

def as_binary(array):
    """``array`` (Arrow string/binary, large or not) as binary of the same width, zero-copy."""
    import pyarrow as pa

    t = array.type
    if pa.types.is_string(t):
        return array.view(pa.binary())
    if pa.types.is_large_string(t):
        return array.view(pa.large_binary())
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return array.cast(pa.binary())
    return array


def _header_type():
    import pyarrow as pa

    return pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def normalize_headers(array):
    """Headers as ``list<struct<key: string, value: binary>>`` (names and widths as the encoder
    takes them); unchanged, without a copy, when they already are. Spark matches the struct's
    field names case-insensitively and may send large (64-bit offset) lists and strings."""
    import pyarrow as pa

    wanted = _header_type()
    if array.type.equals(wanted):
        return array
    if array.offset:  # a slice: rebuild from offset 0 (rare: Spark's batches are not slices)
        array = pa.concat_arrays([array])
    struct = array.values
    fields = [pa.field("key", pa.string()), pa.field("value", pa.binary())]
    entries = pa.StructArray.from_arrays(
        [struct.field(0).cast(pa.string()), struct.field(1).cast(pa.binary())], fields=fields,
        mask=struct.is_null() if struct.null_count else None)
    return pa.ListArray.from_arrays(array.offsets.cast(pa.int32()), entries,
                                    mask=array.is_null() if array.null_count else None)
