"""Arrow arrays from numpy arrays and constants, without importing pandas.

Why not ``pa.array``, ``pa.scalar``, ``Array.to_numpy`` or ``pc.fill_null(array, 0)``: each
asks pyarrow's pandas shim whether its argument is a pandas object, and the shim imports pandas
the first time it is asked, whenever pandas is installed (it is wherever PySpark's pandas APIs
are used). That import costs 0.17-0.35 s of CPU and about 34 MB in every new Python process.
PySpark's workers that read a Python data source, plan reads and streams, make writers and
commit never import pandas themselves (its write tasks do, for their commit message), so the
connector would pay it alone: in each new executor Python worker (the first task of each, and
every task after Spark has ended a worker that ran no Python task for a minute, as it does
between micro-batches more than a minute apart) and in the driver's planning workers. The
decoder and the sink build their columns from numpy buffers and read Spark's columns as numpy
arrays; these functions wrap and read those buffers as they are, without a copy where none is
needed, and without the shim.
``tests/unit/test_arrays.py`` checks, in a new process, that encoding and decoding batches
leaves pandas unimported.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["EMPTY_BINARY", "from_numpy", "strings", "to_numpy", "valid_mask"]


def from_numpy(values: np.ndarray) -> pa.Array:
    """A 1-D numpy array of integers or floats as an Arrow array of the same type, over the same
    memory (a non-contiguous array is copied first). No nulls."""
    values = np.ascontiguousarray(values)
    if values.ndim != 1 or values.dtype.kind not in "iuf":
        raise TypeError(f"from_numpy takes a 1-D array of numbers, not {values.dtype} with "
                        f"{values.ndim} dimensions")
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values),
                                 [None, pa.py_buffer(values)])


def strings(items: list[str]) -> pa.Array:
    """A ``pa.string()`` array of ``items`` (no nulls)."""
    encoded = [s.encode("utf-8") for s in items]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"{len(items)} strings of {int(offsets[-1])} bytes do not fit one "
                         "string array (2 GiB at most)")
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [None, pa.py_buffer(offsets.astype(np.int32)),
                                  pa.py_buffer(b"".join(encoded))])


#: The empty byte string as a ``pa.binary()`` scalar (a join's separator, say).
EMPTY_BINARY = pa.BinaryArray.from_buffers(
    pa.binary(), 1, [None, pa.py_buffer(np.zeros(2, dtype=np.int32)), pa.py_buffer(b"")])[0]


_NUMPY_TYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32,
                pa.int64(): np.int64, pa.uint8(): np.uint8, pa.uint16(): np.uint16,
                pa.uint32(): np.uint32, pa.uint64(): np.uint64, pa.float32(): np.float32,
                pa.float64(): np.float64}


def _bits(buffer, offset: int, n: int) -> np.ndarray:
    """Bits ``offset .. offset + n`` of an Arrow bitmap (least significant bit first)."""
    raw = np.frombuffer(buffer, dtype=np.uint8, count=(offset + n + 7) // 8)
    return np.unpackbits(raw, bitorder="little")[offset:offset + n].astype(bool)


def valid_mask(array: pa.Array) -> np.ndarray:
    """True where ``array`` (any type) is not null."""
    n = len(array)
    if array.null_count == 0:
        return np.ones(n, dtype=bool)
    if array.null_count == n or array.buffers()[0] is None:    # a null-type array
        return np.zeros(n, dtype=bool)
    return _bits(array.buffers()[0], array.offset, n)


def to_numpy(array: pa.Array, null=0) -> np.ndarray:
    """The values of an integer, floating point or boolean ``array`` as a numpy array of the same
    type, ``null`` where it is null (read-only, over the Arrow memory, when there are no nulls
    and it is not boolean)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else pa.concat_arrays(array.chunks)
    n = len(array)
    if pa.types.is_boolean(array.type):
        values = (_bits(array.buffers()[1], array.offset, n) if n and array.buffers()[1]
                  else np.zeros(n, dtype=bool))
    else:
        dtype = _NUMPY_TYPES.get(array.type)
        if dtype is None:
            raise TypeError(f"to_numpy takes integer, floating point or boolean arrays, not "
                            f"{array.type}")
        if n == 0 or array.buffers()[1] is None:
            return np.full(n, null, dtype=dtype)
        values = np.frombuffer(array.buffers()[1], dtype=dtype, count=array.offset + n)[
            array.offset:]
    if array.null_count:
        values = values.copy()
        values[~valid_mask(array)] = null
    return values
