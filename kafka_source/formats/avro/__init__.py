"""Avro: schemas and their Spark types (:mod:`.schema`), the columnar decoder (:mod:`.decode`),
and :class:`AvroColumnDecoder`, which decodes one column of a batch whatever schemas wrote it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from .decode import Cursor, ResolutionError, Step, body_cursor, compile_step, indices
from .schema import AvroSchemaError, Node, arrow_type, parse_schema, spark_type
from ..framing import HEADER_SIZE, column_bytes, schema_ids

__all__ = ["AvroColumnDecoder", "DecodedColumn", "AvroSchemaError", "ResolutionError",
           "parse_schema", "spark_type", "arrow_type"]


@dataclass
class DecodedColumn:
    """A decoded column (the reader schema's Arrow type; null where the value was null or bad),
    which rows were bad, and why (``reasons[i]`` for each bad row ``i``)."""

    array: pa.Array
    bad: np.ndarray
    reasons: dict[int, str]
    schema_ids: np.ndarray | None = None


class AvroColumnDecoder:
    """Decodes columns of Avro values into the reader schema.

    ``writer_schema(id)`` returns the Avro schema text registered under an id (None: the values
    are plain Avro bodies written with the reader schema, as spark-avro's ``from_avro`` takes
    them). Steps are compiled once per writer schema id and kept."""

    def __init__(self, reader_schema: str, writer_schema: Callable[[int], str] | None):
        self.reader: Node = parse_schema(reader_schema)
        self.type: pa.DataType = arrow_type(self.reader)
        self._writer_schema = writer_schema
        self._steps: dict[int, Step | str] = {}
        self._plain: Step | None = None

    def _step(self, schema_id: int) -> Step | str:
        """The step for data written with schema ``schema_id``, or why there is none."""
        found = self._steps.get(schema_id)
        if found is None:
            from ..registry import RegistryError

            try:
                text = self._writer_schema(schema_id)
                found = compile_step(parse_schema(text), self.reader)
            except RegistryError as e:   # 404, or not allowed (401/403), or not Avro
                why = "is not in the registry" if e.status == 404 else "cannot be used"
                found = f"schema id {schema_id} {why} ({e})"
            except (AvroSchemaError, ResolutionError) as e:
                found = (f"the writer schema (id {schema_id}) cannot be read with the reader "
                         f"schema: {e}")
            self._steps[schema_id] = found
        return found

    def decode(self, values: pa.Array) -> DecodedColumn:
        n = len(values)
        if self._writer_schema is None:
            if self._plain is None:
                self._plain = compile_step(self.reader, self.reader)
            cursor, nulls = body_cursor(values)
            rows = np.flatnonzero(~nulls)
            out = self._plain(cursor, rows) if rows.size else pa.nulls(0, self.type)
            parts = [(rows, out)]
            bad = cursor.bad.copy()
            reasons = {int(r): reason for rs, reason in cursor.reasons for r in rs}
            return DecodedColumn(_combine(parts, bad, n, self.type), bad, reasons)
        offsets, data, nulls = column_bytes(values)
        ids, unframed = schema_ids(offsets, data, nulls)
        bad = unframed.copy()
        reasons = {int(r): "not in the Schema Registry wire format (no magic byte 0 and "
                           "schema id: was it written without a registry serializer?)"
                   for r in np.flatnonzero(unframed)}
        cursor = Cursor(data, offsets[:-1] + HEADER_SIZE, offsets[1:])
        parts = []
        for schema_id in np.unique(ids[ids >= 0]):
            rows = np.flatnonzero(ids == schema_id)
            step = self._step(int(schema_id))
            if isinstance(step, str):
                bad[rows] = True
                reasons.update((int(r), step) for r in rows)
                continue
            parts.append((rows, step(cursor, rows)))
        if cursor.reasons:
            bad |= cursor.bad
            for rs, reason in cursor.reasons:
                for r in rs:
                    reasons.setdefault(int(r), f"a corrupt or truncated body: {reason}")
        return DecodedColumn(_combine(parts, bad, n, self.type), bad, reasons, ids)


def _combine(parts: list[tuple[np.ndarray, pa.Array]], bad: np.ndarray, n: int,
             typ: pa.DataType) -> pa.Array:
    """The parts (arrays over subsets of the rows) in row order; null for rows in no part and
    for bad rows."""
    where = np.full(n, -1, dtype=np.int64)
    arrays, start = [], 0
    for rows, arr in parts:
        if rows.size:
            where[rows] = np.arange(start, start + rows.size)
            start += rows.size
            arrays.append(arr)
    where[bad] = -1
    if not arrays:
        return pa.nulls(n, typ)
    values = pa.concat_arrays(arrays) if len(arrays) > 1 else arrays[0]
    if start == n and not bad.any() and len(arrays) == 1:
        return values
    return values.take(indices(where))
