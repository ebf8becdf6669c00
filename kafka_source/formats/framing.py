"""Confluent's wire format, for a whole column: a zero magic byte, then the writer schema's id
(4 bytes, big-endian), then the body (for Protobuf, message indexes come first)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..wire.format.arrays import valid_mask

HEADER_SIZE = 5
PAD = 16    # zero bytes after a column's data: a read may run past a value's end harmlessly


def column_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A binary column as numpy: its offsets (int64, n + 1), its data followed by :data:`PAD`
    zero bytes (a copy), and which values are null."""
    if values.offset or not isinstance(values, pa.BinaryArray):
        values = pa.concat_arrays([values.cast(pa.binary())])
    n = len(values)
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1).astype(np.int64)
    data = np.zeros(int(offsets[-1]) + PAD, dtype=np.uint8)
    if data_buf is not None and offsets[-1]:
        data[:offsets[-1]] = np.frombuffer(data_buf, dtype=np.uint8, count=int(offsets[-1]))
    return offsets, data, ~valid_mask(values)


def schema_ids(offsets: np.ndarray, data: np.ndarray, nulls: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """For each value of a column (:func:`column_bytes`): the schema id (-1 where there is
    none), and whether it is not in the wire format (shorter than the header, or a magic byte
    other than 0)."""
    start = offsets[:-1]
    short = (offsets[1:] - start) < HEADER_SIZE
    header = data[np.minimum(start, data.size - PAD)[:, None] + np.arange(HEADER_SIZE)]
    unframed = ~nulls & (short | (header[:, 0] != 0))
    ids = (header[:, 1].astype(np.int64) << 24 | header[:, 2].astype(np.int64) << 16
           | header[:, 3].astype(np.int64) << 8 | header[:, 4].astype(np.int64))
    return np.where(nulls | unframed, -1, ids), unframed
