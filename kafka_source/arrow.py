"""Executor side: turn decoded records into Arrow record batches of the source's exact schema."""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import pyarrow as pa

from .records import Record
from .schema import arrow_schema

# Flush a batch once it holds this many records or payload bytes, so a task's memory stays
# bounded however large its partition is.
MAX_BATCH_RECORDS = 65_536
MAX_BATCH_BYTES = 16 << 20

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


def batches(chunks: Iterable[list[Record]], topic: str, partition: int,
            include_headers: bool) -> Iterator[pa.RecordBatch]:
    """Regroup record chunks from the fetch loop into Arrow batches of bounded size."""
    pending: list[Record] = []
    pending_bytes = 0
    for chunk in chunks:
        for record in chunk:
            pending.append(record)
            pending_bytes += len(record.value or b"") + len(record.key or b"")
            if len(pending) >= MAX_BATCH_RECORDS or pending_bytes >= MAX_BATCH_BYTES:
                yield records_to_batch(pending, topic, partition, include_headers)
                pending, pending_bytes = [], 0
    if pending:
        yield records_to_batch(pending, topic, partition, include_headers)

