"""Arrow columns -> one Kafka record batch (magic 2), without a Python object per record.

The sink's producer hands this module the rows of one batch as Arrow arrays (values, optional
keys, optional headers) and gets back the bytes of a complete ``RecordBatch`` v2, ready to go
into a ProduceRequest. :mod:`kafka_source.wire.format.records` is the specification of the format (its
decoder must read back exactly what was encoded, and ``tests/unit/test_encode.py`` also holds the
output byte for byte to kafka-python's ``DefaultRecordBatchBuilder``).

Layout of a record (all varints zigzag, as Kafka writes them)::

    length | attributes 0 | timestampDelta 0 | offsetDelta i | keyLength (-1 null) | key |
    valueLength (-1 null) | value | headerCount | [keyLength | key | valueLength | value]...

How it works
------------

Every record is the same sequence of *pieces*: short runs of varints and constant bytes ("meta")
alternating with bytes that are already in Arrow buffers (key, value, the record's headers)::

    [meta A] key [meta B] value [meta C] headers

1. **Sizes**: the lengths of keys, values, header keys and values come from the Arrow offsets
   (``np.diff``), nulls from the validity bitmaps; every varint's size and every record's length
   follow with a few whole-array numpy operations.
2. **Meta pieces**: the varint bytes of every field are computed column by column into an
   ``(records, bytes)`` matrix (at most 5 columns per varint, only as many as the largest value
   needs) with a mask of the bytes in use; ``matrix[mask]`` is then every record's meta piece,
   back to back - a ``BinaryArray`` without a copy.
3. **Assembly**: Arrow's ``binary_join_element_wise`` concatenates, row by row in C++, the meta
   pieces with the key and value arrays as they are (sliced arrays included; a null key or value
   contributes no bytes, its ``-1`` length is in the meta). The result's data buffer is the
   records section. Headers are assembled the same way one level down (one row per header,
   then one piece per record over those bytes, cut at the list offsets).
   When no record of the batch has headers, the header count that closes every record is the
   constant ``0x00``: it is written at the start of the *next* record's meta piece (and once
   after the last record), so that such batches need no third meta piece.
4. **Batch**: the 61-byte header is packed with ``struct``, the CRC-32C is computed over the
   header's tail and the records section without joining them first, and the pieces are joined
   once into the returned ``bytes``. Compression (:func:`kafka_source.wire.format.codecs.compress`)
   replaces the records section as a whole, as Kafka requires.

:func:`encode_record_batches` encodes several batches (consecutive row ranges) in one such
pass; only the batch headers, checksums and compression are then done per batch.

Speed (``benchmarks/encode.py``, one core of the shared 2-core development machine, 100-byte
values, uncompressed, 10,000 records per batch): 10M records/s with 10-byte keys, 13M without
keys, 3.4M with one header per record. The fixed cost is about 0.1 ms per call, so batches of
100 records encode at about 1M records/s one by one, and at 8M records/s through
:func:`encode_record_batches`. Arrow's row-wise join (about 10 ns per piece and record) is most
of the time; compression, when on, dominates everything else.
"""

from __future__ import annotations

import functools
import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrays import EMPTY_BINARY, to_numpy, valid_mask
from .codecs import CODEC_NAMES, CODEC_NONE, compress

__all__ = ["BATCH_OVERHEAD", "COMPRESSION_TYPES", "encode_record_batch", "encode_record_batches",
           "record_sizes"]

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_OVERHEAD = _HEADER.size          # 61 bytes before the first record
_LENGTH_END = 12                       # batchLength counts from here
_CRC_POS = 17                          # the CRC field
_CRC_START = 21                        # the CRC covers attributes .. end of batch
_MAGIC = 2
_NO_PARTITION_LEADER_EPOCH = -1        # what Java's producer writes; the broker sets its own
_TRANSACTIONAL_BIT = 0x10

COMPRESSION_TYPES = {name: codec for codec, name in CODEC_NAMES.items()}  # "none" -> 0, ...

_INT32_MAX = (1 << 31) - 1

try:  # ICRAR's crc32c (a dependency): hardware CRC-32C that can continue a running value
    from .records import icrar_crc32c

    _crc32c_update = icrar_crc32c()

    def _crc_of(parts) -> int:
        crc = 0
        for part in parts:
            crc = _crc32c_update(part, crc)
        return crc
except ImportError:  # pragma: no cover - only without the dependency
    from .records import crc32c as _crc32c_whole

    def _crc_of(parts) -> int:
        return _crc32c_whole(b"".join(bytes(p) for p in parts))


# ------------------------------------------------------------------------------------------------
# Input columns
# ------------------------------------------------------------------------------------------------

def _as_binary(arr, what: str) -> pa.Array:
    """``arr`` as a ``pa.binary()`` array over the same data buffer (int32 offsets: no batch
    can hold 2 GiB). String columns are accepted too: their bytes are their UTF-8."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    if not isinstance(arr, pa.Array):
        raise TypeError(f"{what} must be a pyarrow Array, not {type(arr).__name__}")
    t = arr.type
    if t == pa.binary():
        return arr
    if (pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary_view(t) or pa.types.is_string_view(t)):
        try:
            return arr.cast(pa.binary())
        except pa.ArrowInvalid as exc:
            raise ValueError(f"{what} holds more than 2 GiB, more than a record batch can "
                             f"hold: {exc}") from None
    raise TypeError(f"{what} must be binary or string (pa.binary(), pa.large_binary(), "
                    f"pa.string(), pa.large_string()), not {t}")


def _lengths(arr: pa.Array) -> np.ndarray:
    """Byte length of every element of a binary array (int64), -1 for a null."""
    n = len(arr)
    offsets = arr.buffers()[1]
    if offsets is None or n == 0:
        lengths = np.zeros(n, dtype=np.int64)
    else:
        o = np.frombuffer(offsets, dtype=np.int32, count=arr.offset + n + 1)[arr.offset:]
        lengths = (o[1:] - o[:-1]).astype(np.int64)
    if arr.null_count:
        lengths[~valid_mask(arr)] = -1
    return lengths


def _zigzag(x: np.ndarray) -> np.ndarray:
    """Zigzag encoding of int64 values >= -1 (lengths, counts, deltas): 2x, and 1 for -1."""
    z = x << 1
    if x.size and x.min() < 0:
        z[x < 0] = 1
    return z


def _varint_size(z: np.ndarray) -> np.ndarray:
    """Bytes of the varint of every (already zigzagged, < 2**35) value."""
    size = np.ones(z.shape, dtype=np.int64)
    top = int(z.max()) if z.size else 0
    shift = 7
    while top >> shift:
        size += z >= (1 << shift)
        shift += 7
    return size


class _Field:
    """One varint field of every record: zigzag values and their sizes; or a constant byte
    (``z`` and ``size`` plain ints)."""
    __slots__ = ("z", "size", "max_size", "min_size")

    def __init__(self, z, size):
        self.z = z
        self.size = size
        if isinstance(size, int):
            self.max_size = self.min_size = size
        else:
            self.max_size = int(size.max()) if size.size else 0
            self.min_size = int(size.min()) if size.size else 0


def _field(values: np.ndarray) -> _Field:
    z = _zigzag(values)
    return _Field(z, _varint_size(z))


_ZERO = _Field(0, 1)       # attributes, timestampDelta, the header count of a headerless record
_NULL = _Field(1, 1)       # the length -1 of an absent key


def _meta(fields: list[_Field], n: int) -> pa.Array:
    """Every record's run of ``fields`` (varints) as one binary array.

    The bytes go into an ``(n, columns)`` matrix, one column per byte position a field can use
    (only as many as its largest value needs); a column is masked where a record's varint is
    shorter. ``matrix[mask]`` (row-major) is then all the runs back to back.
    """
    ncols = sum(f.max_size for f in fields)
    matrix = np.empty((n, ncols), dtype=np.uint8)
    mask = None
    lengths = 0
    col = 0
    for f in fields:
        lengths = lengths + f.size
        z = f.z
        if isinstance(z, int):
            matrix[:, col] = z
            col += 1
            continue
        for b in range(f.max_size):
            if b:
                z = z >> 7
            byte = z & 0x7F
            if b + 1 < f.max_size:
                byte |= (f.size > b + 1).astype(np.int64) << 7
            matrix[:, col] = byte
            if b >= f.min_size:  # some records' varints are shorter than b + 1 bytes
                if mask is None:
                    mask = np.ones((n, ncols), dtype=bool)
                mask[:, col] = f.size > b
            col += 1
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    if isinstance(lengths, int):
        data = matrix.reshape(-1)
        offsets[1:] = np.arange(lengths, (n + 1) * lengths, lengths, dtype=np.int32)
    else:
        data = matrix.reshape(-1) if mask is None else matrix[mask]
        np.cumsum(lengths, out=offsets[1:])
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])


_JOIN = pc.get_function("binary_join_element_wise")
_JOIN_OPTIONS = pc.JoinOptions(null_handling="replace", null_replacement="")
_NO_SEPARATOR = EMPTY_BINARY


def _join(pieces: list[pa.Array]) -> tuple[pa.Buffer, np.ndarray]:
    """Row-wise concatenation of ``pieces`` (nulls contribute nothing): the data buffer of the
    result and its ``n + 1`` row offsets."""
    joined = _JOIN.call([*pieces, _NO_SEPARATOR], _JOIN_OPTIONS)
    o = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=joined.offset + len(joined) + 1)
    return joined.buffers()[2], o[joined.offset:]


# ------------------------------------------------------------------------------------------------
# Headers
# ------------------------------------------------------------------------------------------------

class _Headers:
    """The headers column of a batch: per record the header count and the byte size of its
    headers, and (when built) ``piece``, a binary array whose element ``i`` is the bytes of
    record ``i``'s headers."""
    __slots__ = ("count_field", "nbytes", "piece")

    def __init__(self, count_field, nbytes, piece):
        self.count_field = count_field
        self.nbytes = nbytes
        self.piece = piece


def _headers(headers, n: int, *, build: bool) -> _Headers | None:
    """None when no record has a header."""
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.chunk(0) if headers.num_chunks == 1 else headers.combine_chunks()
    if not isinstance(headers, pa.Array):
        raise TypeError(f"headers must be a pyarrow Array, not {type(headers).__name__}")
    t = headers.type
    if not ((pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type)
            and t.value_type.get_field_index("key") >= 0
            and t.value_type.get_field_index("value") >= 0):
        raise TypeError("headers must be a list<struct<key: string, value: binary>> array, "
                        f"not {t}")
    if len(headers) != n:
        raise ValueError(f"headers has {len(headers)} rows, values has {n}")
    counts = to_numpy(pc.list_value_length(headers)).astype(np.int64)   # 0 for a null list
    total = int(counts.sum()) if n else 0
    if total == 0:
        return None
    entries = headers.flatten()               # the slice's entries, null lists skipped
    st = entries.type
    children = entries.flatten()              # struct nulls merged into the children
    hkeys = _as_binary(children[st.get_field_index("key")], "header keys")
    hvalues = _as_binary(children[st.get_field_index("value")], "header values")
    if hkeys.null_count:
        first = int(np.flatnonzero(~valid_mask(hkeys))[0])
        row = int(np.searchsorted(np.cumsum(counts), first, side="right"))
        raise ValueError(f"row {row} has a header with a null key (or a null header): Kafka "
                         "header keys cannot be null")
    hk = _field(_lengths(hkeys))
    hvl = _lengths(hvalues)
    hv = _field(hvl)
    entry_ends = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(hk.size + (hk.z >> 1) + hv.size + np.maximum(hvl, 0), out=entry_ends[1:])
    record_ends = entry_ends[np.cumsum(counts)]          # where each record's headers end
    nbytes = np.diff(record_ends, prepend=0)
    piece = None
    if build:
        data, rows = _join([_meta([hk], total), hkeys, _meta([hv], total), hvalues])
        offsets = np.empty(n + 1, dtype=np.int32)
        offsets[0] = rows[0]
        offsets[1:] = record_ends + int(rows[0])
        piece = pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), data])
    return _Headers(_field(counts), nbytes, piece)


# ------------------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------------------

def _index_field(n: int) -> _Field:
    """Offset deltas 0..n-1 (the same for every batch of n records; cached for batch sizes up
    to 64 Ki records)."""
    if n <= _CACHED_INDEX_FIELDS:
        return _cached_index_field(n)
    return _field(np.arange(n, dtype=np.int64))


_CACHED_INDEX_FIELDS = 1 << 16


@functools.lru_cache(maxsize=16)
def _cached_index_field(n: int) -> _Field:
    f = _field(np.arange(n, dtype=np.int64))
    f.z.flags.writeable = False
    f.size.flags.writeable = False
    return f


class _Layout:
    """Sizes of every field of every record, and the columns that hold the bytes. ``starts``:
    the first row of every batch (record ``i``'s offset delta counts from its batch's start)."""

    def __init__(self, values, keys, headers, starts, *, build: bool):
        self.values = _as_binary(values, "values")
        n = self.n = len(self.values)
        self.keys = None if keys is None else _as_binary(keys, "keys")
        if self.keys is not None and len(self.keys) != n:
            raise ValueError(f"keys has {len(self.keys)} rows, values has {n}")
        self.headers = None if headers is None else _headers(headers, n, build=build)
        vlen = _lengths(self.values)
        self.value_len = _field(vlen)
        if starts is None:
            self.offset_delta = _index_field(n)
        else:
            counts = np.diff(starts, append=n)
            self.offset_delta = _field(np.arange(n, dtype=np.int64)
                                       - np.repeat(starts, counts))
        body = 2 + self.offset_delta.size + self.value_len.size + np.maximum(vlen, 0)
        if self.keys is not None:
            klen = _lengths(self.keys)
            self.key_len = _field(klen)
            body += self.key_len.size + np.maximum(klen, 0)
        else:
            self.key_len = None
            body += 1                               # keyLength -1
        if self.headers is not None:
            body += self.headers.count_field.size + self.headers.nbytes
        else:
            body += 1                               # header count 0
        self.body = body
        self.length = _field(body)

    def sizes(self) -> np.ndarray:
        return self.length.size + self.body

    def records(self) -> tuple[pa.Buffer, np.ndarray, bool]:
        """All records back to back: (buffer, row offsets, shifted). Record ``i`` is
        ``buffer[rows[i]:rows[i + 1]]``, or with ``shifted`` ``buffer[rows[i] + 1:rows[i + 1] +
        1]``, the last one followed by a 0x00 that is not in the buffer."""
        n = self.n
        h = self.headers
        # meta A: [0x00 closing the previous headerless record] length attributes timestampDelta
        #         offsetDelta keyLength [valueLength when there are no keys]
        a = [self.length, _ZERO, _ZERO, self.offset_delta]
        if h is None:
            a.insert(0, _ZERO)
        if self.keys is None:
            a += [_NULL, self.value_len]
            pieces = [_meta(a, n), self.values]
        else:
            a.append(self.key_len)
            pieces = [_meta(a, n), self.keys, _meta([self.value_len], n), self.values]
        if h is not None:
            pieces += [_meta([h.count_field], n), h.piece]
        data, rows = _join(pieces)
        return data, rows, h is None


def _compression_codec(compression: str) -> int:
    codec = COMPRESSION_TYPES.get(compression)
    if codec is None:
        raise ValueError(f"unknown compression type {compression!r}; valid: "
                         f"{', '.join(COMPRESSION_TYPES)}")
    return codec


def _batch(parts: list, codec: int, n: int, *, base_offset: int, timestamp_ms: int,
           producer_id: int, producer_epoch: int, base_sequence: int,
           attributes: int) -> bytes:
    if codec != CODEC_NONE:
        parts = [compress(codec, parts[0] if len(parts) == 1 else b"".join(parts))]
    size = sum(len(p) for p in parts)
    if BATCH_OVERHEAD + size - _LENGTH_END > _INT32_MAX:
        raise ValueError(f"a record batch of {size} bytes of records exceeds 2 GiB")
    header = bytearray(_HEADER.pack(
        base_offset, BATCH_OVERHEAD - _LENGTH_END + size, _NO_PARTITION_LEADER_EPOCH, _MAGIC, 0,
        attributes, n - 1, timestamp_ms, timestamp_ms, producer_id, producer_epoch,
        base_sequence, n))
    struct.pack_into(">I", header, _CRC_POS, _crc_of([memoryview(header)[_CRC_START:], *parts]))
    return b"".join([header, *parts])


def record_sizes(values, keys=None, headers=None) -> np.ndarray:
    """Encoded size in bytes of every record (int64), its length varint included, when record
    ``i`` has offset delta ``i``: the sizes of a batch of exactly these rows, which add up to the
    batch's size minus :data:`BATCH_OVERHEAD` (uncompressed). A record placed earlier in a batch
    (smaller offset delta) is never larger, so the sizes are upper bounds for the records of any
    batch cut from these rows."""
    return _Layout(values, keys, headers, None, build=False).sizes()


def encode_record_batch(values, keys=None, headers=None, *, timestamp_ms: int,
                        base_offset: int = 0, producer_id: int = -1, producer_epoch: int = -1,
                        base_sequence: int = -1, transactional: bool = False,
                        compression: str = "none") -> bytes:
    """One record batch (magic 2) holding a record per row of ``values``.

    ``values`` / ``keys``: binary (or large binary, string) arrays, sliced arrays welcome; a null
    value is a tombstone, a null key a record without key. ``headers``: a
    ``list<struct<key: string, value: binary>>`` array; a null or empty list is no headers, a
    null header value is allowed, a null header key is not. Every record gets CreateTime
    ``timestamp_ms`` (timestamp delta 0) and offset delta ``0..n-1``; ``compression`` is one of
    ``none``, ``gzip``, ``snappy``, ``lz4``, ``zstd`` (always applied, as Java's producer does,
    even when it does not make the batch smaller). The batch's partition leader epoch is -1 (the
    broker sets it), as Java's producer writes it.
    """
    codec = _compression_codec(compression)
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id (InitProducerId)")
    if len(values) == 0:
        raise ValueError("a record batch needs at least one record (values is empty)")
    layout = _Layout(values, keys, headers, None, build=True)
    data, rows, shifted = layout.records()
    view = memoryview(data)
    parts = ([view[int(rows[0]) + 1:int(rows[-1])], b"\x00"] if shifted
             else [view[int(rows[0]):int(rows[-1])]])
    return _batch(parts, codec, layout.n, base_offset=base_offset, timestamp_ms=timestamp_ms,
                  producer_id=producer_id, producer_epoch=producer_epoch,
                  base_sequence=base_sequence,
                  attributes=codec | (_TRANSACTIONAL_BIT if transactional else 0))


def encode_record_batches(values, keys=None, headers=None, *, batch_starts,
                          timestamp_ms, base_sequences=None, producer_id: int = -1,
                          producer_epoch: int = -1, transactional: bool = False,
                          compression: str = "none") -> list[bytes]:
    """Several record batches from one set of columns, in one vectorised pass: batch ``b`` holds
    rows ``batch_starts[b]`` up to the next start (the last one up to the end), exactly as
    :func:`encode_record_batch` would encode those rows alone.

    For a producer with many small batches (many partitions, small ``batch.size``): the numpy
    and Arrow work is done once for all rows, only the batch headers, checksums and compression
    are per batch. ``batch_starts``: strictly increasing row indices starting at 0;
    ``timestamp_ms``: one int for all batches or one per batch; ``base_sequences``: None (-1,
    no idempotence) or one per batch.
    """
    codec = _compression_codec(compression)
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id (InitProducerId)")
    n = len(values)
    starts = np.asarray(batch_starts, dtype=np.int64).reshape(-1)
    nb = len(starts)
    if nb == 0 or starts[0] != 0 or (nb > 1 and (np.diff(starts) <= 0).any()) or starts[-1] >= n:
        raise ValueError(f"batch_starts must be strictly increasing row indices from 0 below "
                         f"{n} (the number of rows), got {starts[:10].tolist()}"
                         f"{'...' if nb > 10 else ''}")
    timestamps = _per_batch(timestamp_ms, nb, "timestamp_ms")
    sequences = [-1] * nb if base_sequences is None else _per_batch(base_sequences, nb,
                                                                    "base_sequences")
    layout = _Layout(values, keys, headers, starts, build=True)
    data, rows, shifted = layout.records()
    view = memoryview(data)
    bounds = rows[np.append(starts, n)].tolist()
    attributes = codec | (_TRANSACTIONAL_BIT if transactional else 0)
    ends = starts.tolist()[1:] + [n]
    out = []
    for b, first in enumerate(starts.tolist()):
        lo, hi = bounds[b], bounds[b + 1]
        if shifted:
            parts = [view[lo + 1:hi + 1]] if b + 1 < nb else [view[lo + 1:hi], b"\x00"]
        else:
            parts = [view[lo:hi]]
        out.append(_batch(parts, codec, ends[b] - first, base_offset=0,
                          timestamp_ms=timestamps[b], producer_id=producer_id,
                          producer_epoch=producer_epoch, base_sequence=sequences[b],
                          attributes=attributes))
    return out


def _per_batch(value, nb: int, what: str) -> list[int]:
    if isinstance(value, (int, np.integer)):
        return [int(value)] * nb
    out = [int(v) for v in value]
    if len(out) != nb:
        raise ValueError(f"{what} has {len(out)} entries for {nb} batches")
    return out
