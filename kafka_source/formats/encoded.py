"""Encoded rows: per-row byte ranges over one buffer, built a whole column at a time, and put
together once per row -- what the sink's encoders (:mod:`.avro.encode`, :mod:`.protobuf.encode`,
:mod:`.jsonschema.encode`) share.

An :class:`Encoded` is a column of byte strings as numpy arrays (offsets and data), so that an
encoder makes every row's bytes of one field in one numpy pass, never a Python object per row;
:func:`join` interleaves several such parts row by row with one copy of each byte, and
:meth:`Encoded.to_arrow` hands the result to the sink as a binary column without copying.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa


# Rows or offsets from here on need large_binary (64-bit offsets); a module value so that tests
# can take that path without 2 GiB of data.
WIDE = 2**31


class EncodeError(ValueError):
    """A column, or a value in it, that cannot be written with the writer schema."""


@dataclass
class Encoded:
    """Per-row byte ranges ``data[offsets[i]:offsets[i + 1]]`` over one buffer, in row order."""

    offsets: np.ndarray      # int64, n + 1; offsets[0] may be > 0 (a range of a larger buffer)
    data: np.ndarray         # uint8

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def to_arrow(self, valid: np.ndarray | None = None, wide: bool = False) -> pa.Array:
        """A binary array of the rows (null where ``valid`` is False); large_binary when
        ``wide`` or when the rows hold 2 GiB or more."""
        start = int(self.offsets[0])
        offsets = self.offsets - start if start else self.offsets
        # the bytes are not copied: the array keeps the (contiguous) numpy buffer alive
        data = np.ascontiguousarray(self.data[start:int(self.offsets[-1])])
        wide = wide or offsets[-1] >= WIDE
        kind = pa.large_binary() if wide else pa.binary()
        offsets = offsets.astype(np.int64 if wide else np.int32)
        mask = None
        if valid is not None and not valid.all():
            mask = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
        return pa.Array.from_buffers(kind, len(offsets) - 1,
                                     [mask, pa.py_buffer(offsets), pa.py_buffer(data)])


def const(piece: bytes, n: int) -> Encoded:
    """The same bytes on every one of ``n`` rows."""
    width = len(piece)
    return Encoded(np.arange(n + 1, dtype=np.int64) * width,
                   np.tile(np.frombuffer(piece, dtype=np.uint8), n) if width else
                   np.zeros(0, dtype=np.uint8))


def join(parts: list[Encoded]) -> Encoded:
    """Row ``i`` of the result is row ``i`` of each part, concatenated in order.

    Done by Arrow, one copy of each row's part: the parts are laid end to end as one binary
    array (part 0's rows, then part 1's, ...) and taken row by row (row 0 of every part, then
    row 1 ...); the taken array's bytes are the joined rows, and every ``len(parts)``-th of its
    offsets is where a row starts. Parts of no bytes (a null-typed field, a record of no fields)
    are left out. A numpy scatter of each part's bytes (an index per byte) cost about twice
    as much; merging runs of fixed-width parts first (fewer rows to take) saved no time, the
    strided copy costing what the take saved."""
    if len(parts) == 1:
        return parts[0]
    n = len(parts[0].offsets) - 1
    parts = [p for p in parts if p.offsets[-1] != p.offsets[0]] or parts[:1]   # no bytes
    total = sum(int(p.offsets[-1]) - int(p.offsets[0]) for p in parts)
    if n == 0 or total == 0:
        return Encoded(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.uint8))
    if len(parts) == 1:
        return parts[0]
    count = len(parts)
    wide = total >= WIDE or n * count >= WIDE
    laid = pa.concat_arrays([p.to_arrow(wide=wide) for p in parts])
    kind = np.int64 if wide else np.int32
    taken = laid.take((_cached_order if n * count <= 1 << 22 else _order)(n, count, wide))
    _, off_buf, data_buf = taken.buffers()
    offsets = np.frombuffer(off_buf, dtype=kind, count=n * count + 1,
                            offset=taken.offset * np.dtype(kind).itemsize)[::count]
    return Encoded(offsets.astype(np.int64), np.frombuffer(data_buf, dtype=np.uint8))


def _order(n: int, count: int, wide: bool) -> pa.Array:
    """Where row ``i``'s part ``j`` is when parts are laid end to end: ``j * n + i``, row-major."""
    kind = np.int64 if wide else np.int32
    order = np.arange(count, dtype=kind) * kind(n) + np.arange(n, dtype=kind)[:, None]
    return pa.array(order.reshape(-1))


# Batches come in few sizes (Spark's maxRecordsPerBatch, a task's last batch), with the same
# parts each time: the order is kept for the last few, when small.
_cached_order = functools.lru_cache(maxsize=8)(_order)


def expand(enc: Encoded, valid: np.ndarray) -> Encoded:
    """``enc`` holds the rows where ``valid``; the others become empty."""
    lens = np.zeros(len(valid), dtype=np.int64)
    lens[valid] = enc.lengths
    offsets = np.empty(len(valid) + 1, dtype=np.int64)
    offsets[0] = enc.offsets[0]
    offsets[1:] = enc.offsets[0] + np.cumsum(lens)
    return Encoded(offsets, enc.data)


def uvarints(values: np.ndarray) -> Encoded:
    """Unsigned base-128 varints, 7 bits a byte, low first: Avro's ``int``/``long`` after the
    zig-zag (:func:`zigzag`), Protobuf's varints (negative ``int64`` as their two's
    complement), the wire format's lengths.

    Built a byte column at a time (``width`` passes over the values, for the widest value's
    byte count). When every value takes the same number of bytes -- string lengths and counts
    under 64, union tags, timestamps of one era -- the bytes are all of them, in order: no
    selecting of bytes, no continuation mask per value."""
    zz = values.astype(np.uint64, copy=False)
    n = len(zz)
    if n == 0:
        return Encoded(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8))
    top = zz.max()
    if top < 0x80:                                  # one byte each: the value is the byte
        return Encoded(np.arange(n + 1, dtype=np.int64), zz.astype(np.uint8))
    width = 1
    while width < 10 and top >= np.uint64(1) << np.uint64(7 * width):
        width += 1
    floor = zz.min()
    narrowest = 1
    while narrowest < 10 and floor >= np.uint64(1) << np.uint64(7 * narrowest):
        narrowest += 1
    groups = np.empty((n, width), dtype=np.uint8)
    for k in range(width):
        byte = zz >> np.uint64(7 * k) if k else zz
        groups[:, k] = byte & np.uint64(0x7F)
    if narrowest == width:                          # the same byte count for every value
        groups[:, :width - 1] |= np.uint8(0x80)
        return Encoded(np.arange(n + 1, dtype=np.int64) * width, groups.reshape(-1))
    nbytes = np.full(n, narrowest, dtype=np.int64)
    for k in range(narrowest, width):
        nbytes += zz >= np.uint64(1) << np.uint64(7 * k)
    cols = np.arange(width)
    groups |= np.where(cols[None, :] < (nbytes - 1)[:, None], np.uint8(0x80), np.uint8(0))
    data = groups[cols[None, :] < nbytes[:, None]]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nbytes, out=offsets[1:])
    return Encoded(offsets, data)


def zigzag(values: np.ndarray) -> np.ndarray:
    """Signed integers as the unsigned ones varints carry: 0, -1, 1, -2 ... as 0, 1, 2, 3 ...
    (Avro's ``int``/``long``, Protobuf's ``sint32``/``sint64``)."""
    v = values.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def fixed_width(values: np.ndarray) -> Encoded:
    """Each element's bytes as they are in memory (little-endian numbers: Avro's float,
    double; or rows of a 2-D uint8 array)."""
    raw = np.ascontiguousarray(values)
    n = raw.shape[0]
    data = raw.view(np.uint8).reshape(-1)
    width = data.size // n if n else 0
    return Encoded(np.arange(n + 1, dtype=np.int64) * width, data)


def binary_bodies(array: pa.Array) -> Encoded:
    """The bytes of a binary/string array without nulls, zero-copy where possible."""
    t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        array = array.view(pa.binary() if pa.types.is_string(t) else pa.large_binary())
    elif not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        array = array.cast(pa.binary())
    wide = pa.types.is_large_binary(array.type)
    _, off_buf, data_buf = array.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64 if wide else np.int32,
                            count=len(array) + 1, offset=array.offset * (8 if wide else 4)
                            ).astype(np.int64)
    data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
            else np.zeros(0, dtype=np.uint8))
    return Encoded(offsets, data)


class ColumnEncoder:
    """What the three encoders share: a column's null rows are Kafka nulls, not values, so only
    the other rows are encoded. A subclass sets ``_encode``: rows of the column without nulls ->
    the parts of each row's body (:func:`join` puts them together)."""

    _encode: "Callable[[pa.Array], list[Encoded]]"

    def encode(self, array: pa.Array) -> tuple[Encoded, np.ndarray]:
        """The bodies of the non-null rows of ``array`` (null rows empty), and which rows those
        are."""
        parts, valid = self.encode_parts(array)
        return join(parts), valid

    def encode_parts(self, array: pa.Array) -> tuple[list[Encoded], np.ndarray]:
        """:meth:`encode` before the parts are joined: for a caller that puts more before each
        body (the sink's framing) and joins once."""
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        valid = valid_mask(array)
        if not valid.all():
            parts = self._encode(array.filter(pa.array(valid)))
            return [expand(p, valid) for p in parts], valid
        return self._encode(array), valid


def valid_mask(array: pa.Array) -> np.ndarray:
    """Which rows of ``array`` are not null."""
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
