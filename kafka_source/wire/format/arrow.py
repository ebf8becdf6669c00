"""Decoded records -> an Arrow record batch of the source's exact schema, one Python object at a
time: the reference for :mod:`kafka_source.wire.format.fast_decode` (which builds the columns straight from
the record bytes on the executors) and its fallback for legacy and malformed batches."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from .records import Record
from ...schema import arrow_schema

_SCHEMAS = {False: arrow_schema(False), True: arrow_schema(True)}
_HEADERS_TYPE = _SCHEMAS[True].field("headers").type


def records_to_batch(records: Sequence[Record], topic: str, partition: int,
                     include_headers: bool) -> pa.RecordBatch:
    n = len(records)
    columns = [
        pa.array([r.key for r in records], type=pa.binary()),
        pa.array([r.value for r in records], type=pa.binary()),
        pa.array([topic] * n, type=pa.string()),
        pa.array([partition] * n, type=pa.int32()),
        pa.array([r.offset for r in records], type=pa.int64()),
        pa.array([r.timestamp * 1000 for r in records], type=pa.int64())
          .cast(pa.timestamp("us", tz="UTC")),
        pa.array([r.timestamp_type for r in records], type=pa.int32()),
    ]
    if include_headers:
        columns.append(pa.array(
            [[{"key": k, "value": v} for k, v in r.headers] if r.headers else None
             for r in records],
            type=_HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=_SCHEMAS[include_headers])
