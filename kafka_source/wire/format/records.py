"""Reference decoder for the record bytes of a Kafka FetchResponse partition.

This is the straightforward, obviously-right decoder: it walks the batches one by one with
``struct`` and plain Python. A faster vectorised decoder may replace it on the hot path; it must
agree with :func:`decode_records` on every input (differential tests), so behaviour here is the
specification. Formats handled (see the Kafka documentation, "Message Format"):

* record batches, magic 2 (Kafka >= 0.11), compressed or not, transactional and control batches;
* legacy message sets, magic 0 and 1, including compressed wrapper messages.

Semantics, in the order they apply to each complete batch of ``data``:

1. Parsing stops at a trailing partial batch (``truncated=True``); brokers cut fetch responses at
   the byte limit, so this is normal. The partial batch is not looked at beyond its length field.
2. With ``check_crcs`` the batch CRC (CRC-32C for magic 2, CRC-32 for legacy wrapper and inner
   messages) is verified; a mismatch raises :class:`CorruptRecordError` naming the base offset.
3. With ``read_committed``, aborted transactions (``(producer_id, first_offset)`` pairs from the
   FetchResponse) whose first offset is <= the batch's last offset are moved, in first-offset
   order, into a set of aborted producer ids before a batch with a producer id is handled;
   transactional data batches of a producer in the set are skipped whole; an ABORT control marker
   removes its producer from the set (this is what the Java consumer does).
4. Control batches are never returned. Records with offsets outside
   ``[start_offset, end_offset)`` are not returned.
5. ``next_offset`` becomes ``max(next_offset, last_offset + 1)`` of the batch, whatever was
   returned from it. Once ``next_offset >= end_offset`` decoding stops: no later batch can hold a
   wanted record, so the rest of ``data`` is neither decoded nor CRC-checked and ``truncated``
   stays False.

Timestamps: magic 2 and magic 1 records carry ``timestamp_type`` 0 (CreateTime) or 1
(LogAppendTime); for LogAppendTime batches the timestamp is the batch's max timestamp (magic 2) or
the wrapper message's timestamp (magic 1 compressed). Magic 0 messages have no timestamp: like the
Java client, they are returned with ``timestamp=-1`` and ``timestamp_type=-1``.

Header keys are decoded as UTF-8 with invalid sequences replaced by U+FFFD (what Java's
``new String(bytes, UTF_8)`` does); header values, keys and values stay bytes.
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from .codecs import decompress
from ...errors import CorruptRecordError

__all__ = [
    "Record", "DecodeResult", "decode_records", "scan_batches", "crc32c", "CRC32C_IMPLEMENTATION",
    "CONTROL_ABORT", "CONTROL_COMMIT",
]

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

NO_TIMESTAMP = -1
NO_TIMESTAMP_TYPE = -1


class Record(NamedTuple):
    offset: int
    timestamp: int          # ms since epoch, as stored (batch max timestamp for LogAppendTime)
    timestamp_type: int     # 0 CreateTime, 1 LogAppendTime (-1 for magic 0 messages)
    key: bytes | None       # None = null key; b"" = empty
    value: bytes | None     # None = tombstone
    headers: tuple[tuple[str, bytes | None], ...]   # order preserved, repeated keys kept


@dataclass
class DecodeResult:
    records: list[Record]
    next_offset: int
    truncated: bool


# ------------------------------------------------------------------------------------------------
# CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by record batches v2.
# A C implementation is used when one is installed (the ``crc32c`` or ``google-crc32c``
# packages); otherwise a numpy implementation that runs many lanes of the table-driven algorithm
# side by side and combines them with the "advance over zero bytes" operator (as zlib's
# crc32_combine does); tiny inputs use the plain table loop.
# ------------------------------------------------------------------------------------------------

_CRC32C_POLY = 0x82F63B78


def _crc32c_tables() -> list[tuple[int, ...]]:
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_CRC32C_POLY if c & 1 else 0)
        t0.append(c)
    tables = [t0]
    for _ in range(3):  # tables[k][i]: register after byte i followed by k zero bytes
        prev = tables[-1]
        tables.append([(prev[i] >> 8) ^ t0[prev[i] & 0xFF] for i in range(256)])
    return [tuple(t) for t in tables]


_CRC_TABLES = _crc32c_tables()
_CRC_T0 = _CRC_TABLES[0]


def _crc32c_table(data) -> int:
    crc = 0xFFFFFFFF
    t0 = _CRC_T0
    for b in bytes(data):
        crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _apply_op(op: tuple[int, ...], v: int) -> int:
    """Apply a GF(2)-linear map on 32-bit values, given as the images of the 32 basis bits."""
    r = 0
    i = 0
    while v:
        if v & 1:
            r ^= op[i]
        v >>= 1
        i += 1
    return r


@functools.lru_cache(maxsize=None)
def _zeros_op(log2n: int) -> tuple[int, ...]:
    """The map advancing a raw CRC register over 2**log2n zero bytes."""
    if log2n == 0:
        return tuple(_CRC_T0[(1 << i) & 0xFF] ^ ((1 << i) >> 8) for i in range(32))
    half = _zeros_op(log2n - 1)
    return tuple(_apply_op(half, half[i]) for i in range(32))


@functools.lru_cache(maxsize=None)
def _zeros_np_tables(log2n: int):
    """``_zeros_op(log2n)`` as four byte-indexed numpy lookup tables."""
    import numpy as np

    op = _zeros_op(log2n)
    out = []
    for k in range(4):
        table = [0] * 256
        for v in range(1, 256):
            low = v & -v
            table[v] = table[v ^ low] ^ op[8 * k + low.bit_length() - 1]
        out.append(np.array(table, dtype=np.uint32))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _np_tables():
    import numpy as np

    return tuple(np.array(t, dtype=np.uint32) for t in _CRC_TABLES)


def _crc32c_numpy(data) -> int:
    import numpy as np

    src = np.frombuffer(data, dtype=np.uint8)
    n = src.shape[0]
    if n < 4:
        return _crc32c_table(data)
    # Split the input into K lanes of W little-endian 32-bit words. Zero bytes are prepended to
    # fill the grid: a raw (init 0) CRC register stays 0 over leading zeros, so they change
    # nothing. The standard init value 0xFFFFFFFF is folded in by inverting the first 4 real
    # bytes (the register is xored with the first word before anything else happens).
    words = (n + 3) // 4
    w = 2 if n < 16384 else 4 if n < 65536 else 8 if n < 524288 else 32
    lanes = -(-words // w)
    total = lanes * w * 4
    buf = np.zeros(total, dtype=np.uint8)
    start = total - n
    buf[start:] = src
    buf[start:start + 4] ^= 0xFF
    grid = np.ascontiguousarray(buf.view("<u4").reshape(lanes, w).T)  # (w, lanes)
    t0, t1, t2, t3 = _np_tables()
    regs = np.zeros(lanes, dtype=np.uint32)
    for j in range(w):  # slicing-by-4 step on every lane at once
        x = regs ^ grid[j]
        xb = x.view(np.uint8)
        regs = t3[xb[0::4]] ^ t2[xb[1::4]] ^ t1[xb[2::4]] ^ t0[xb[3::4]]
    # Combine neighbouring lanes pairwise: crc(A || B) = advance(crc(A), len(B)) ^ crc(B).
    log2len = (w * 4).bit_length() - 1
    while regs.shape[0] > 1:
        if regs.shape[0] & 1:  # an all-zero lane in front stands for more leading zeros
            regs = np.concatenate((np.zeros(1, dtype=np.uint32), regs))
        a = np.ascontiguousarray(regs[0::2])
        s0, s1, s2, s3 = _zeros_np_tables(log2len)
        ab = a.view(np.uint8)
        regs = s0[ab[0::4]] ^ s1[ab[1::4]] ^ s2[ab[2::4]] ^ s3[ab[3::4]] ^ regs[1::2]
        log2len += 1
    return int(regs[0]) ^ 0xFFFFFFFF


_NUMPY_MIN_BYTES = 512


def _crc32c_fallback(data) -> int:
    if len(data) < _NUMPY_MIN_BYTES:
        return _crc32c_table(data)
    return _crc32c_numpy(data)


def icrar_crc32c():
    """ICRAR's ``crc32c(data, value=0)`` (the ``crc32c`` package: hardware accelerated, and it
    can continue a running value), or ImportError.

    Taken from its extension module ``crc32c._crc32c`` where it has one (2.4 and later): the
    package's ``__init__`` asks ``importlib.metadata`` for its own version, which on a Spark
    worker's path reads the central directory of every zip and jar there (100-165 ms per
    worker), and a Spark worker imports the package without running that ``__init__``
    (:mod:`kafka_source.worker_imports`)."""
    try:
        from crc32c._crc32c import crc32c as function
    except ImportError:
        from crc32c import crc32c as function
    return function


def _pick_crc32c():
    try:
        function = icrar_crc32c()
        if function(b"123456789") == 0xE3069283:
            return function, "crc32c package"
    except Exception:
        pass
    try:
        import google_crc32c as _g

        if _g.value(b"123456789") == 0xE3069283:
            return _g.value, "google-crc32c package"
    except Exception:
        pass
    try:
        import numpy  # noqa: F401

        return _crc32c_fallback, "numpy lanes"
    except ImportError:
        return _crc32c_table, "pure Python table"


_crc32c_impl, CRC32C_IMPLEMENTATION = _pick_crc32c()


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C of ``data`` as an unsigned 32-bit int."""
    return _crc32c_impl(data)


# ------------------------------------------------------------------------------------------------
# Wire layouts
# ------------------------------------------------------------------------------------------------

# baseOffset, batchLength | partitionLeaderEpoch, magic, crc | attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_V2_HEADER_SIZE = _V2_HEADER.size                 # 61
_V2_CRC_START = 21                                # attributes onwards is CRC-covered
_V2_LAST_DELTA_POS = 23                           # lastOffsetDelta
_LOG_OVERHEAD = 12                                # offset int64 + length int32, every format
_MAGIC_POS = 16                                   # magic byte position, every format
# offset, messageSize | crc, magic, attributes
_LEGACY_HEADER = struct.Struct(">qiIbb")
_LEGACY_HEADER_SIZE = _LEGACY_HEADER.size         # 18
_LEGACY_MIN_SIZE = {0: 14, 1: 22}                 # messageSize minimum (crc .. value length)
_OFFSET_LENGTH = struct.Struct(">qi")
_MIN_ENTRY_SIZE = _LEGACY_MIN_SIZE[0]             # smallest length field of any format
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_CONTROL_KEY = struct.Struct(">hh")               # version, type

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20


class _Malformed(Exception):
    """Internal: a structural problem inside one batch; re-raised with the batch offset."""


def _decompress(codec: int, data, magic: int, base_offset: int) -> bytes:
    try:
        return decompress(codec, data, magic=magic)
    except CorruptRecordError as exc:
        raise CorruptRecordError(f"magic {magic} batch at offset {base_offset}: {exc}") from exc


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Read a zigzag varint (varint or varlong) at ``pos``; return (value, new position)."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos + 1
        shift += 7
        if shift > 63:
            raise _Malformed(f"varint longer than 10 bytes at {pos}")


# ------------------------------------------------------------------------------------------------
# Magic 2
# ------------------------------------------------------------------------------------------------

def _v2_records(buf: bytes, count: int, base_offset: int, base_timestamp: int,
                timestamp_type: int, max_timestamp: int, lo: int, hi: int,
                out: list[Record]) -> None:
    """Parse ``count`` records from ``buf`` (the uncompressed records section of one batch) and
    append those with ``lo <= offset < hi`` to ``out``."""
    varint = _varint
    log_append = timestamp_type == 1
    end = len(buf)
    pos = 0
    for _ in range(count):
        length, pos = varint(buf, pos)
        rec_end = pos + length
        if length < 0 or rec_end > end:
            raise _Malformed(f"record length {length} at byte {pos} overruns the {end}-byte "
                             f"records section")
        pos += 1  # record attributes (unused)
        ts_delta, pos = varint(buf, pos)
        off_delta, pos = varint(buf, pos)
        offset = base_offset + off_delta
        if offset < lo or offset >= hi:
            pos = rec_end
            continue
        klen, pos = varint(buf, pos)
        if klen < 0:
            key = None
        else:
            key = buf[pos:pos + klen]
            pos += klen
        vlen, pos = varint(buf, pos)
        if vlen < 0:
            value = None
        else:
            value = buf[pos:pos + vlen]
            pos += vlen
        nheaders, pos = varint(buf, pos)
        if nheaders < 0:
            raise _Malformed(f"negative header count {nheaders} in record at offset {offset}")
        if nheaders:
            hs = []
            for _ in range(nheaders):
                hklen, pos = varint(buf, pos)
                if hklen < 0:
                    raise _Malformed(f"negative header key length in record at offset {offset}")
                hkey = buf[pos:pos + hklen].decode("utf-8", "replace")
                pos += hklen
                hvlen, pos = varint(buf, pos)
                if hvlen < 0:
                    hvalue = None
                else:
                    hvalue = buf[pos:pos + hvlen]
                    pos += hvlen
                hs.append((hkey, hvalue))
            headers = tuple(hs)
        else:
            headers = ()
        if pos != rec_end:
            raise _Malformed(f"record at offset {offset} declares {length} bytes but its fields "
                             f"take {pos - (rec_end - length)}")
        out.append(Record(offset, max_timestamp if log_append else base_timestamp + ts_delta,
                          timestamp_type, key, value, headers))
    if pos != end:
        raise _Malformed(f"{end - pos} bytes left over after the {count} declared records")


def _control_type(buf: bytes, count: int) -> int | None:
    """Type of the first control record of a control batch (None if the batch is empty)."""
    if count <= 0:
        return None
    recs: list[Record] = []
    # Only the first record decides (as in the Java client); parse it alone.
    length, pos = _varint(buf, 0)
    _v2_records(buf[:pos + length], 1, 0, 0, 0, 0, -(1 << 63), 1 << 63, recs)
    key = recs[0].key
    if key is None or len(key) < 4:
        raise _Malformed("control record key shorter than 4 bytes")
    version, ctype = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise _Malformed(f"control record key version {version} is negative")
    return ctype


# ------------------------------------------------------------------------------------------------
# Magic 0 / 1
# ------------------------------------------------------------------------------------------------

def _legacy_message(buf, pos: int, end: int, check_crcs: bool):
    """Parse one legacy message whose bytes are ``buf[pos:end]`` (offset and size included).

    Returns (offset, magic, attributes, timestamp, key, value)."""
    offset, size, crc, magic, attrs = _LEGACY_HEADER.unpack_from(buf, pos)
    if magic not in _LEGACY_MIN_SIZE:
        raise _Malformed(f"unknown magic {magic} in legacy message at offset {offset}")
    if size < _LEGACY_MIN_SIZE[magic]:
        raise _Malformed(f"legacy message at offset {offset} has size {size}, below the "
                         f"minimum {_LEGACY_MIN_SIZE[magic]}")
    if check_crcs:
        computed = zlib.crc32(buf[pos + _LOG_OVERHEAD + 4:end]) & 0xFFFFFFFF
        if computed != crc:
            raise CorruptRecordError(
                f"message at offset {offset} failed its CRC-32 check "
                f"(stored 0x{crc:08x}, computed 0x{computed:08x})")
    p = pos + _LEGACY_HEADER_SIZE
    if magic == 1:
        (timestamp,) = _INT64.unpack_from(buf, p)
        p += 8
    else:
        timestamp = NO_TIMESTAMP
    (klen,) = _INT32.unpack_from(buf, p)
    p += 4
    if klen < 0:
        key = None
    else:
        if p + klen > end:
            raise _Malformed(f"key of message at offset {offset} overruns the message")
        key = bytes(buf[p:p + klen])
        p += klen
    if p + 4 > end:
        raise _Malformed(f"message at offset {offset} ends inside its value length")
    (vlen,) = _INT32.unpack_from(buf, p)
    p += 4
    if vlen < 0:
        value = None
    else:
        if p + vlen > end:
            raise _Malformed(f"value of message at offset {offset} overruns the message")
        value = bytes(buf[p:p + vlen])
        p += vlen
    if p != end:
        raise _Malformed(f"message at offset {offset} has {end - p} bytes after its value")
    return offset, magic, attrs, timestamp, key, value


def _legacy_entry(view, pos: int, end: int, lo: int, hi: int, check_crcs: bool,
                  out: list[Record]) -> int:
    """Decode one top-level legacy message (plain or compressed wrapper); return its offset,
    which is the last offset it covers."""
    offset, magic, attrs, timestamp, key, value = _legacy_message(view, pos, end, check_crcs)
    ts_type = ((attrs & _TIMESTAMP_TYPE_BIT) >> 3) if magic == 1 else NO_TIMESTAMP_TYPE
    codec = attrs & _COMPRESSION_MASK
    if codec == 0:
        if lo <= offset < hi:
            out.append(Record(offset, timestamp, ts_type, key, value, ()))
        return offset
    if offset < lo:  # every inner message is at or before the wrapper's offset
        return offset
    if value is None:
        raise _Malformed(f"compressed wrapper message at offset {offset} has a null value")
    inner = _decompress(codec, value, magic, offset)
    messages = []
    ipos = 0
    iend = len(inner)
    while ipos < iend:
        if iend - ipos < _LOG_OVERHEAD:
            raise _Malformed(f"inner message set of wrapper at offset {offset} ends in a "
                             f"partial message header")
        (isize,) = _INT32.unpack_from(inner, ipos + 8)
        mend = ipos + _LOG_OVERHEAD + isize
        if isize < _LEGACY_MIN_SIZE[0] or mend > iend:
            raise _Malformed(f"inner message of size {isize} in wrapper at offset {offset} "
                             f"overruns the decompressed message set")
        msg = _legacy_message(inner, ipos, mend, check_crcs)
        if msg[2] & _COMPRESSION_MASK:
            raise _Malformed(f"wrapper message at offset {offset} holds a compressed message")
        messages.append(msg)
        ipos = mend
    if not messages:
        return offset
    # Magic 1 wrappers store inner offsets relative to the first inner message, and the wrapper
    # carries the absolute offset of the last one; magic 0 inner offsets are absolute.
    delta = offset - messages[-1][0] if magic >= 1 else 0
    log_append = magic == 1 and ts_type == 1
    for ioffset, _imagic, _iattrs, its, ikey, ivalue in messages:
        absolute = ioffset + delta
        if lo <= absolute < hi:
            out.append(Record(absolute, timestamp if log_append else its, ts_type, ikey, ivalue,
                              ()))
    return offset


# ------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------

class V2Batch(NamedTuple):
    """A magic-2 data batch the walk keeps: its records section, decompressed, and header fields."""

    payload: bytes | memoryview  # uncompressed batches: a slice of the input, not a copy
    count: int
    base_offset: int
    base_ts: int
    ts_type: int
    max_ts: int
    last_delta: int


@dataclass
class WalkEnd:
    """How :func:`walk_batches` ended (filled in when the walk finishes without an error)."""

    next_offset: int = 0
    truncated: bool = False


def walk_batches(view: memoryview, *, start_offset: int, end_offset: int, read_committed: bool,
                 aborted_transactions: Sequence[tuple[int, int]], check_crcs: bool,
                 end_state: WalkEnd):
    """The batch loop shared by both decoders: rules 1-3 and 5 of the module docstring.

    Yields, in log order, a :class:`V2Batch` for each magic-2 data batch that may hold wanted
    records (not control, not aborted, overlapping the offset window), and the list of wanted
    records of each legacy entry. Raises :class:`CorruptRecordError` at the first bad batch,
    after yielding everything before it. Decoding the records of a V2Batch is the caller's.
    """
    n = len(view)
    next_offset = start_offset
    truncated = False
    pending = sorted(((int(first), int(pid)) for pid, first in aborted_transactions)
                     if read_committed else ())
    pending_i = 0
    aborted_pids: set[int] = set()
    header = _V2_HEADER.unpack_from
    offset_length = _OFFSET_LENGTH.unpack_from

    pos = 0
    while pos < n:
        if n - pos < _LOG_OVERHEAD:
            truncated = True
            break
        base_offset, length = offset_length(view, pos)
        if length < _MIN_ENTRY_SIZE:
            raise CorruptRecordError(
                f"batch at offset {base_offset} (byte {pos}) declares length {length}, below the "
                f"minimum of any format")
        end = pos + _LOG_OVERHEAD + length
        if end > n:
            truncated = True
            break
        magic = view[pos + _MAGIC_POS]
        if magic >= 128:
            magic -= 256
        kept = None
        try:
            if magic == 2:
                if length < _V2_HEADER_SIZE - _LOG_OVERHEAD:
                    raise _Malformed(f"batch length {length} is below the v2 minimum")
                (_bo, _len, _epoch, _magic, crc, attrs, last_delta, base_ts, max_ts,
                 producer_id, _pepoch, _bseq, count) = header(view, pos)
                if check_crcs:
                    computed = crc32c(view[pos + _V2_CRC_START:end])
                    if computed != crc:
                        raise CorruptRecordError(
                            f"record batch at offset {base_offset} failed its CRC-32C check "
                            f"(stored 0x{crc:08x}, computed 0x{computed:08x})")
                if count < 0:
                    raise _Malformed(f"negative record count {count}")
                last_offset = base_offset + last_delta
                codec = attrs & _COMPRESSION_MASK
                is_control = bool(attrs & _CONTROL_BIT)
                skip = is_control
                payload = None
                if read_committed and producer_id >= 0:
                    while pending_i < len(pending) and pending[pending_i][0] <= last_offset:
                        aborted_pids.add(pending[pending_i][1])
                        pending_i += 1
                    if is_control:
                        payload = _decompress(codec, view[pos + _V2_HEADER_SIZE:end], 2,
                                              base_offset)
                        if _control_type(payload, count) == CONTROL_ABORT:
                            aborted_pids.discard(producer_id)
                    elif attrs & _TRANSACTIONAL_BIT and producer_id in aborted_pids:
                        skip = True
                if (not skip and count > 0 and last_offset >= start_offset
                        and base_offset < end_offset):
                    if payload is None:
                        section = view[pos + _V2_HEADER_SIZE:end]
                        payload = section if codec == 0 else _decompress(codec, section, 2,
                                                                         base_offset)
                    kept = V2Batch(payload, count, base_offset, base_ts, (attrs >> 3) & 1,
                                   max_ts, last_delta)
            elif magic == 0 or magic == 1:
                if length < _LEGACY_MIN_SIZE[magic]:
                    raise _Malformed(f"message size {length} is below the magic {magic} minimum")
                kept = []
                last_offset = _legacy_entry(view, pos, end, start_offset, end_offset,
                                            check_crcs, kept)
            else:
                raise CorruptRecordError(
                    f"unknown magic byte {magic} in batch at offset {base_offset}")
        except _Malformed as exc:
            raise CorruptRecordError(
                f"malformed magic {magic} batch at offset {base_offset}: {exc}") from None
        except (IndexError, struct.error) as exc:
            raise CorruptRecordError(
                f"malformed magic {magic} batch at offset {base_offset}: {exc}") from exc
        if kept:
            yield kept
        if last_offset >= next_offset:
            next_offset = last_offset + 1
        pos = end
        if next_offset >= end_offset:
            break
    end_state.next_offset = next_offset
    end_state.truncated = truncated


@dataclass(frozen=True)
class Scan:
    """What :func:`scan_batches` found from the batch headers alone."""

    next_offset: int   # what walk_batches' next_offset is for well-formed data
    batches: int       # complete batches (entries) looked at
    nbytes: int        # their bytes


def scan_batches(view: memoryview, *, start_offset: int, end_offset: int) -> Scan:
    """Rule 5 of the module docstring over the batch headers only: no CRC check, no
    decompression, no record parsing. For well-formed data ``next_offset`` equals the
    ``next_offset`` of :func:`walk_batches` (and so of both decoders); the fetch loop uses it to
    send the next Fetch request before the records are decoded, and checks it against the
    decoder's answer."""
    n = len(view)
    next_offset = start_offset
    offset_length = _OFFSET_LENGTH.unpack_from
    last_delta = _INT32.unpack_from
    pos = 0
    batches = 0
    while n - pos >= _LOG_OVERHEAD and next_offset < end_offset:
        base_offset, length = offset_length(view, pos)
        end = pos + _LOG_OVERHEAD + length
        if length < _MIN_ENTRY_SIZE or end > n:
            break
        last = base_offset
        if view[pos + _MAGIC_POS] == 2 and length >= _V2_HEADER_SIZE - _LOG_OVERHEAD:
            last += last_delta(view, pos + _V2_LAST_DELTA_POS)[0]
        if last >= next_offset:
            next_offset = last + 1
        batches += 1
        pos = end
    return Scan(next_offset, batches, pos)


def v2_batch_records(batch: V2Batch, start_offset: int, end_offset: int,
                     out: list[Record]) -> None:
    """Append the records of ``batch`` within ``[start_offset, end_offset)`` to ``out``."""
    try:
        _v2_records(bytes(batch.payload), batch.count, batch.base_offset, batch.base_ts,
                    batch.ts_type, batch.max_ts, start_offset, end_offset, out)
    except _Malformed as exc:
        raise CorruptRecordError(
            f"malformed magic 2 batch at offset {batch.base_offset}: {exc}") from None
    except (IndexError, struct.error) as exc:
        raise CorruptRecordError(
            f"malformed magic 2 batch at offset {batch.base_offset}: {exc}") from exc


def decode_records(data: bytes | memoryview, *, start_offset: int, end_offset: int,
                   read_committed: bool = False,
                   aborted_transactions: Sequence[tuple[int, int]] = (),
                   check_crcs: bool = True) -> DecodeResult:
    """Decode the records section of one partition of a FetchResponse.

    Returns the data records with ``start_offset <= offset < end_offset`` in offset order, the
    offset the next fetch should start at and whether a trailing partial batch was present.
    See the module docstring for the exact rules.
    """
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    records: list[Record] = []
    if start_offset >= end_offset:
        return DecodeResult(records, start_offset, False)
    end = WalkEnd()
    for kept in walk_batches(view, start_offset=start_offset, end_offset=end_offset,
                             read_committed=read_committed,
                             aborted_transactions=aborted_transactions, check_crcs=check_crcs,
                             end_state=end):
        if isinstance(kept, V2Batch):
            v2_batch_records(kept, start_offset, end_offset, records)
        else:
            records.extend(kept)
    return DecodeResult(records, end.next_offset, end.truncated)
