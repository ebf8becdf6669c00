"""Compression and decompression of Kafka record batches (and decompression of legacy wrapper
messages).

Codec ids are those of the batch / message attributes (bits 0-2):

====  ======  ==========================================================================
 id   name    wire format accepted
====  ======  ==========================================================================
 0    none    the bytes as they are
 1    gzip    gzip member(s) (what Java's ``GZIPOutputStream`` writes); a zlib stream too
 2    snappy  xerial framing (``\\x82SNAPPY\\x00`` + two int32 + [int32 length][raw block]...)
              as written by the Java client, or one plain raw snappy block
 3    lz4     LZ4 frame(s); for magic 0 the frame header checksum is recomputed first,
              because Kafka < 0.10 wrote it wrongly (KAFKA-3160)
 4    zstd    zstd frame(s), content size optional
====  ======  ==========================================================================

Every failure (unknown codec, truncated or garbled input) raises
:class:`~kafka_source.errors.CorruptRecordError`.

:func:`compress` writes what Kafka's Java producer writes, so that every reader accepts it: gzip
members at the default level, snappy in xerial framing with 32 KiB blocks, LZ4 frames with
independent 64 KiB blocks and no checksums or content size (``KafkaLZ4BlockOutputStream``), zstd
frames at level 3 (the defaults of ``compression.gzip.level`` / ``compression.lz4.level`` /
``compression.zstd.level``).
"""

from __future__ import annotations

import struct
import zlib

from ...errors import CorruptRecordError

__all__ = [
    "CODEC_NONE", "CODEC_GZIP", "CODEC_SNAPPY", "CODEC_LZ4", "CODEC_ZSTD", "CODEC_NAMES",
    "compress", "decompress", "xxh32",
]

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_LEN = 16  # magic (8) + version int32 + compatible-version int32
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_INT32 = struct.Struct(">i")
# xerial's SnappyOutputStream: magic, version 1, minimum compatible version 1, 32 KiB blocks
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_ZSTD_LEVEL = 3        # Java's compression.zstd.level default


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress ``data`` with Kafka codec id ``codec`` (1-4) the way Kafka's Java producer does.

    ``data`` is the records section of a magic-2 batch; the result replaces it in the batch.
    An unknown codec id raises ValueError.
    """
    if codec == CODEC_GZIP:
        # One gzip member at zlib's default level (6), what GZIPOutputStream writes by default.
        c = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec == CODEC_SNAPPY:
        return _snappy_xerial(data)
    if codec == CODEC_LZ4:
        import lz4.frame

        # Java's KafkaLZ4BlockOutputStream: independent blocks (its reader cannot follow linked
        # ones), 64 KiB maximum block size, no block or content checksum, no content size.
        return lz4.frame.compress(data, compression_level=0,
                                  block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
                                  content_checksum=False, block_checksum=False, store_size=False)
    if codec == CODEC_ZSTD:
        import zstandard

        # A compressor per call: a ZstdCompressor must not be shared between threads.
        return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(data)
    if codec == CODEC_NONE:
        return bytes(data)
    raise ValueError(f"unknown compression codec id {codec} (valid: {sorted(CODEC_NAMES)})")


def _snappy_xerial(data) -> bytes:
    """Snappy in the xerial block framing of Java's ``SnappyOutputStream``: the 16-byte header,
    then for every 32 KiB of input a big-endian int32 length and one raw snappy block."""
    import cramjam

    view = memoryview(data).cast("B")
    out = [_XERIAL_HEADER]
    for pos in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[pos:pos + _XERIAL_BLOCK]))
        out.append(_INT32.pack(len(block)))
        out.append(block)
    return b"".join(out)


def decompress(codec: int, data: bytes | bytearray | memoryview, *, magic: int = 2) -> bytes:
    """Decompress ``data`` written with Kafka codec id ``codec``.

    ``magic`` is the message format version of the batch (or legacy wrapper message) the data
    came from; it only matters for lz4, whose header checksum Kafka wrote wrongly in magic 0.
    """
    if codec == CODEC_NONE:
        return bytes(data)
    try:
        if codec == CODEC_GZIP:
            return _gunzip(data)
        if codec == CODEC_SNAPPY:
            return _unsnappy(data)
        if codec == CODEC_LZ4:
            return _unlz4(data, fix_header_checksum=(magic == 0))
        if codec == CODEC_ZSTD:
            return _unzstd(data)
    except CorruptRecordError:
        raise
    except Exception as exc:  # each library has its own error types; report them uniformly
        name = CODEC_NAMES[codec]
        raise CorruptRecordError(f"cannot decompress {name} data ({len(data)} bytes): {exc}") from exc
    raise CorruptRecordError(f"unknown compression codec id {codec}")


# -- gzip ---------------------------------------------------------------------------------------

def _gunzip(data) -> bytes:
    out = []
    rest = bytes(data)
    while True:
        # wbits 32+15: accept a gzip or a zlib header.
        d = zlib.decompressobj(47)
        out.append(d.decompress(rest))
        if not d.eof:
            raise CorruptRecordError("gzip data is truncated")
        rest = d.unused_data
        # Concatenated members are legal (Java's GZIPInputStream reads them all); anything else
        # trailing must be padding zeros, which gzip readers tolerate as well.
        if not rest or not rest.strip(b"\x00"):
            return b"".join(out)


# -- snappy -------------------------------------------------------------------------------------

def _unsnappy(data) -> bytes:
    import cramjam

    view = memoryview(data)
    if len(view) >= _XERIAL_HEADER_LEN and view[:8] == _XERIAL_MAGIC:
        # The version / compatible-version fields are not checked: some producers write them
        # little-endian, and there has only ever been one xerial block format.
        out = []
        pos = _XERIAL_HEADER_LEN
        end = len(view)
        while pos < end:
            if pos + 4 > end:
                raise CorruptRecordError("snappy (xerial) block length is truncated")
            (block_len,) = _INT32.unpack_from(view, pos)
            pos += 4
            if block_len < 0 or pos + block_len > end:
                raise CorruptRecordError(
                    f"snappy (xerial) block of {block_len} bytes at {pos - 4} overruns the "
                    f"{end}-byte payload")
            out.append(bytes(cramjam.snappy.decompress_raw(view[pos:pos + block_len])))
            pos += block_len
        return b"".join(out)
    return bytes(cramjam.snappy.decompress_raw(view))


# -- lz4 ----------------------------------------------------------------------------------------

def _unlz4(data, *, fix_header_checksum: bool) -> bytes:
    import lz4.frame

    # lz4 reads the frames where they are (a view into the fetch buffer): no copy of the
    # compressed bytes, only the legacy magic-0 frame, whose header is mended, is copied.
    view = memoryview(data).cast("B")
    out = []
    pos = 0
    while True:
        frame = view[pos:] if pos else view
        if fix_header_checksum:
            frame = _fix_lz4_header_checksum(bytes(frame))
        chunk, used = lz4.frame.decompress(frame, return_bytes_read=True)
        out.append(chunk)
        if used <= 0:
            raise CorruptRecordError("lz4 frame consumed no input")
        pos += used
        if pos >= len(view):
            return out[0] if len(out) == 1 else b"".join(out)
        if view[pos:pos + 4] != _LZ4_MAGIC:
            raise CorruptRecordError(f"{len(view) - pos} trailing bytes after the lz4 frame")


def _fix_lz4_header_checksum(frame: bytes) -> bytes:
    """Return ``frame`` with its header checksum byte set to the correct value.

    The header checksum (HC) is the second byte of xxh32(frame descriptor), the descriptor being
    FLG, BD and the optional content-size (8) and dictionary-id (4) fields. Kafka's magic-0 LZ4
    writer hashed the 4-byte magic number too (KAFKA-3160), so its HC is wrong; recomputing it
    accepts both the broken and the correct form.
    """
    if len(frame) < 7 or frame[:4] != _LZ4_MAGIC:
        return frame  # let lz4 report the problem
    flg = frame[4]
    hc_pos = 6
    if flg & 0x08:
        hc_pos += 8  # content size
    if flg & 0x01:
        hc_pos += 4  # dictionary id
    if len(frame) <= hc_pos:
        return frame
    hc = (xxh32(frame[4:hc_pos]) >> 8) & 0xFF
    if frame[hc_pos] == hc:
        return frame
    return frame[:hc_pos] + bytes((hc,)) + frame[hc_pos + 1:]


_P1 = 2654435761
_P2 = 2246822519
_P3 = 3266489917
_P4 = 668265263
_P5 = 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 of ``data`` (pure Python; only used on a few header bytes)."""
    n = len(data)
    pos = 0
    if n >= 16:
        v1 = (seed + _P1 + _P2) & _M32
        v2 = (seed + _P2) & _M32
        v3 = seed & _M32
        v4 = (seed - _P1) & _M32
        while pos + 16 <= n:
            a, b, c, d = struct.unpack_from("<4I", data, pos)
            v1 = (_rotl((v1 + a * _P2) & _M32, 13) * _P1) & _M32
            v2 = (_rotl((v2 + b * _P2) & _M32, 13) * _P1) & _M32
            v3 = (_rotl((v3 + c * _P2) & _M32, 13) * _P1) & _M32
            v4 = (_rotl((v4 + d * _P2) & _M32, 13) * _P1) & _M32
            pos += 16
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while pos + 4 <= n:
        (w,) = struct.unpack_from("<I", data, pos)
        h = (_rotl((h + w * _P3) & _M32, 17) * _P4) & _M32
        pos += 4
    while pos < n:
        h = (_rotl((h + data[pos] * _P5) & _M32, 11) * _P1) & _M32
        pos += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


# -- zstd ---------------------------------------------------------------------------------------

def _unzstd(data) -> bytes:
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    out = []
    rest = bytes(data)
    while rest:
        # A decompressobj streams, so frames without a content size are fine; one object per
        # frame lets us notice a truncated frame (eof stays False) and walk concatenated frames.
        obj = dctx.decompressobj()
        out.append(obj.decompress(rest))
        if not obj.eof:
            raise CorruptRecordError("zstd data is truncated")
        rest = obj.unused_data
    return b"".join(out)
