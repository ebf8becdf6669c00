"""Executor side: decode the formatted columns of every batch the fetch loop yields.

One :class:`BatchDecoder` per task, built from the :class:`~.options.Formats` pickled in the
input partition; its column decoders (and the registry client behind them, with its cache of
writer schemas by id) are kept per process, so an executor asks the registry once per schema id.

``mode``: FAILFAST (the default) fails the task at the first record that cannot be decoded,
naming topic, partition, offset, schema id and what is wrong; PERMISSIVE makes that record's
column null and puts the reason in ``valueError`` (``keyError``), as Spark's ``from_avro`` nulls
it (the reason column is this connector's). Nothing is skipped: the record's row is still there.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from ..errors import PayloadError
from .avro import AvroColumnDecoder
from .avro.decode import optional_strings
from .options import NAMES, ColumnFormat, Formats, column_types
from .registry import RegistryUnavailableError, client_for

_DECODERS: dict[ColumnFormat, object] = {}
_LOCK = threading.Lock()


def error_column(column: str) -> str:
    return f"{column}Error"


def _decoder(fmt: ColumnFormat):
    """The process's decoder of a column format (Avro's keeps its compiled writer schemas)."""
    with _LOCK:
        found = _DECODERS.get(fmt)
        if found is None and fmt.format == "protobuf":
            from .protobuf import ProtobufColumnDecoder

            found = _DECODERS[fmt] = ProtobufColumnDecoder(fmt.reader_schema,
                                                           framed=fmt.registry is not None)
        if found is None and fmt.format == "json":
            from .jsonschema import JsonColumnDecoder

            found = _DECODERS[fmt] = JsonColumnDecoder(fmt.reader_schema,
                                                       framed=fmt.registry is not None)
        if found is None:
            lookup = _writer_schemas(fmt) if fmt.registry is not None else None
            found = _DECODERS[fmt] = AvroColumnDecoder(fmt.reader_schema, lookup)
        return found


def _writer_schemas(fmt):
    """Schema id -> Avro schema text, from ``fmt``'s registry: the reader schema's own ids
    without a request, other ids asked once each (the client caches them); a schema of another
    type than Avro is a :class:`RegistryError`."""
    client = client_for(fmt.registry)
    known = dict.fromkeys(fmt.reader_ids, fmt.reader_schema)

    def lookup(schema_id: int) -> str:
        if schema_id in known:      # the reader schema's own id: no request
            return known[schema_id]
        found_schema = client.schema_by_id(schema_id)
        if (found_schema.schema_type or "AVRO").upper() != "AVRO":
            from .registry import RegistryError
            raise RegistryError(f"it is a {found_schema.schema_type} schema, not Avro")
        return found_schema.schema

    return lookup


def formatted_arrow_schema(base: pa.Schema, formats: Formats) -> pa.Schema:
    """``base`` (the Kafka columns) with the formatted columns typed, and in PERMISSIVE mode
    their reason columns at the end."""
    schema = base
    for fmt in formats.columns():
        i = schema.get_field_index(fmt.column)
        schema = schema.set(i, pa.field(fmt.column, column_types(fmt.format,
                                                                 fmt.reader_schema)[0],
                                        nullable=True))
    if formats.mode == "PERMISSIVE":
        for fmt in formats.columns():
            schema = schema.append(pa.field(error_column(fmt.column), pa.string(),
                                            nullable=True))
    return schema


class BatchDecoder:
    def __init__(self, formats: Formats, base: pa.Schema):
        self.formats = formats
        self.schema = formatted_arrow_schema(base, formats)
        self._decoders = [(fmt, _decoder(fmt)) for fmt in formats.columns()]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        columns = dict(zip(batch.schema.names, batch.columns))
        reasons_columns = {}
        for fmt, decoder in self._decoders:
            try:
                decoded = decoder.decode(columns[fmt.column])
            except RegistryUnavailableError as e:
                raise RegistryUnavailableError(
                    f"Could not decode the {fmt.column}s of {self._where(batch)}: a writer "
                    f"schema is not known yet and {e}") from None
            if decoded.bad.any():
                if self.formats.mode == "FAILFAST":
                    raise self._error(batch, fmt, decoded)
                texts = [None] * batch.num_rows
                for row, reason in decoded.reasons.items():
                    if decoded.bad[row]:
                        texts[row] = self._describe(fmt, decoded, row, reason)
                reasons_columns[error_column(fmt.column)] = optional_strings(texts)
            elif self.formats.mode == "PERMISSIVE":
                reasons_columns[error_column(fmt.column)] = pa.nulls(batch.num_rows, pa.string())
            columns[fmt.column] = decoded.array
        columns.update(reasons_columns)
        return pa.RecordBatch.from_arrays([columns[f.name] for f in self.schema],
                                          schema=self.schema)

    @staticmethod
    def _where(batch: pa.RecordBatch) -> str:
        topic = batch.column(batch.schema.get_field_index("topic"))[0].as_py()
        partition = batch.column(batch.schema.get_field_index("partition"))[0].as_py()
        offsets = batch.column(batch.schema.get_field_index("offset"))
        return (f"topic {topic!r} partition {partition} (offsets {offsets[0].as_py()} to "
                f"{offsets[len(offsets) - 1].as_py()})")

    @staticmethod
    def _describe(fmt: ColumnFormat, decoded, row: int, reason: str) -> str:
        sid = None if decoded.schema_ids is None else int(decoded.schema_ids[row])
        return (f"{fmt.column}: " + (f"schema id {sid}: " if sid is not None and sid >= 0
                                     else "") + reason)

    def _error(self, batch: pa.RecordBatch, fmt: ColumnFormat, decoded) -> PayloadError:
        bad = np.flatnonzero(decoded.bad)
        row = int(bad[0])
        topic = batch.column(batch.schema.get_field_index("topic"))[row].as_py()
        partition = batch.column(batch.schema.get_field_index("partition"))[row].as_py()
        offset = batch.column(batch.schema.get_field_index("offset"))[row].as_py()
        reason = decoded.reasons.get(row, "unknown")
        sid = None if decoded.schema_ids is None else int(decoded.schema_ids[row])
        more = f" ({bad.size - 1} more in this batch)" if bad.size > 1 else ""
        return PayloadError(
            f"Could not decode the {fmt.column} of the record at offset {offset} of topic "
            f"{topic!r} partition {partition} as {NAMES[fmt.format]}"
            + (f" (schema id {sid})" if sid is not None and sid >= 0 else "")
            + f": {reason}{more}. The reader schema is {fmt.source}. Option 'mode' "
            f"PERMISSIVE reads such records with a null '{fmt.column}' and the reason in "
            f"'{error_column(fmt.column)}' instead of failing.")
