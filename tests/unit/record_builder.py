"""Test-side encoder for Kafka record batches (magic 2) and legacy message sets (magic 0/1).

Written from the Kafka protocol documentation ("Message Format", "Message Sets"), independently
of ``kafka_source``: nothing here imports the package under test, and the checksums and
compressors are different implementations from the ones the decoder uses (a bit-at-a-time
CRC-32C, python-snappy rather than cramjam for snappy, cramjam rather than python-lz4 for lz4,
cramjam / zstandard without content size for zstd).

The main entry points:

* :func:`v2_batch` - one record batch, any codec, transactional / control / LogAppendTime.
* :func:`control_batch` - a COMMIT or ABORT transaction marker batch.
* :func:`legacy_message` / :func:`legacy_wrapper` - magic 0/1 messages, plain or compressed.
* :func:`expected` - the records a correct decoder returns for a :class:`R` list.
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from dataclasses import dataclass, field

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODECS = (NONE, GZIP, SNAPPY, LZ4, ZSTD)
CREATE_TIME, LOG_APPEND_TIME = 0, 1
ABORT, COMMIT = 0, 1


# -- checksums ------------------------------------------------------------------------------------

def crc32c_bitwise(data: bytes) -> int:
    """CRC-32C (Castagnoli), one bit at a time: slow but obviously the textbook definition."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


_CRC32C_TABLE: list[int] = []


def crc32c(data: bytes) -> int:
    """Table version of :func:`crc32c_bitwise` (checked against it in the tests)."""
    if not _CRC32C_TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC32C_TABLE.append(c)
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def xxh32_short(data: bytes, seed: int = 0) -> int:
    """xxHash32 for inputs shorter than 16 bytes (all an LZ4 frame descriptor ever needs)."""
    assert len(data) < 16
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    mask = 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & mask

    h = (seed + p5 + len(data)) & mask
    i = 0
    while i + 4 <= len(data):
        h = (rotl((h + int.from_bytes(data[i:i + 4], "little") * p3) & mask, 17) * p4) & mask
        i += 4
    for byte in data[i:]:
        h = (rotl((h + byte * p5) & mask, 11) * p1) & mask
    h ^= h >> 15
    h = (h * p2) & mask
    h ^= h >> 13
    h = (h * p3) & mask
    h ^= h >> 16
    return h


# -- compression ------------------------------------------------------------------------------------

def snappy_xerial(data: bytes, block_size: int = 32 * 1024, version: bytes = b"\x00\x00\x00\x01"
                  ) -> bytes:
    """Snappy in the xerial block framing the Java client writes."""
    out = [b"\x82SNAPPY\x00", version, version]
    for i in range(0, max(len(data), 1), block_size):
        block = snappy_raw(data[i:i + block_size])
        out.append(struct.pack(">i", len(block)))
        out.append(block)
    return b"".join(out)


def snappy_raw(data: bytes) -> bytes:
    try:
        import snappy  # python-snappy: a different implementation from the decoder's cramjam
    except ImportError:  # pragma: no cover - only when python-snappy is not installed
        import cramjam

        return bytes(cramjam.snappy.compress_raw(data))
    return snappy.compress(data)


def lz4_frame(data: bytes) -> bytes:
    import cramjam

    return bytes(cramjam.lz4.compress(data))


def lz4_broken_header_checksum(frame: bytes) -> bytes:
    """Rewrite an LZ4 frame's header checksum the way Kafka 0.8/0.9 computed it (KAFKA-3160):
    over the magic number as well as the frame descriptor."""
    flg = frame[4]
    hc_pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    broken = (xxh32_short(frame[:hc_pos]) >> 8) & 0xFF
    good = (xxh32_short(frame[4:hc_pos]) >> 8) & 0xFF
    assert frame[hc_pos] == good, "input frame must carry a correct header checksum"
    if broken == good:  # astronomically unlikely; make sure the test exercises the fix-up
        raise ValueError("broken and correct header checksums coincide for this frame")
    return frame[:hc_pos] + bytes((broken,)) + frame[hc_pos + 1:]


def zstd_frames(data: bytes, nframes: int = 1) -> bytes:
    """zstd without a content size in the frame header, split over ``nframes`` frames."""
    import zstandard

    cctx = zstandard.ZstdCompressor(write_content_size=False)
    step = -(-len(data) // nframes) if data else 0
    parts = [data[i * step:(i + 1) * step] for i in range(nframes)] if step else [data]
    out = io.BytesIO()
    for part in parts:
        with cctx.stream_writer(out, closefd=False) as w:
            w.write(part)
    return out.getvalue()


def compress(codec: int, data: bytes, *, legacy_magic0: bool = False) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data)
    if codec == SNAPPY:
        return snappy_xerial(data)
    if codec == LZ4:
        frame = lz4_frame(data)
        return lz4_broken_header_checksum(frame) if legacy_magic0 else frame
    if codec == ZSTD:
        import cramjam

        return bytes(cramjam.zstd.compress(data))
    raise ValueError(codec)


# -- record batch v2 --------------------------------------------------------------------------------

def zigzag_varint(value: int) -> bytes:
    z = (value << 1) ^ (value >> 63)
    z &= (1 << 64) - 1
    out = bytearray()
    while True:
        if z < 0x80:
            out.append(z)
            return bytes(out)
        out.append((z & 0x7F) | 0x80)
        z >>= 7


def _bytes_field(b: bytes | None) -> bytes:
    return zigzag_varint(-1) if b is None else zigzag_varint(len(b)) + b


@dataclass
class R:
    """One record to encode. ``offset_delta``/``timestamp`` default to position / base ts."""
    key: bytes | None = None
    value: bytes | None = b""
    headers: tuple = ()
    timestamp: int | None = None
    offset_delta: int | None = None


def nulls_and_empties() -> list[R]:
    """Keys and values that are set, null, empty, tombstones, and large random ones."""
    import os

    return [
        R(key=b"key-0", value=b"value-0"),
        R(key=None, value=b"null key"),
        R(key=b"", value=b""),
        R(key=b"tomb", value=None),
        R(key=None, value=None),
        R(key=os.urandom(300), value=os.urandom(5000)),
    ]


def encode_record(offset_delta: int, timestamp_delta: int, key, value, headers) -> bytes:
    body = bytearray()
    body.append(0)  # attributes
    body += zigzag_varint(timestamp_delta)
    body += zigzag_varint(offset_delta)
    body += _bytes_field(key)
    body += _bytes_field(value)
    body += zigzag_varint(len(headers))
    for hkey, hvalue in headers:
        hk = hkey.encode("utf-8") if isinstance(hkey, str) else hkey
        body += zigzag_varint(len(hk)) + hk
        body += _bytes_field(hvalue)
    return zigzag_varint(len(body)) + bytes(body)


@dataclass
class Batch:
    """The bytes of one batch plus facts a test wants to assert on."""
    data: bytes
    base_offset: int
    last_offset: int
    records: list = field(default_factory=list)  # (offset, timestamp, ts_type, key, value, headers)


def v2_batch(records: list[R], base_offset: int = 0, *, codec: int = NONE,
             timestamp_type: int = CREATE_TIME, base_timestamp: int = 1_600_000_000_000,
             max_timestamp: int | None = None, transactional: bool = False,
             control: bool = False, producer_id: int = -1, producer_epoch: int = -1,
             base_sequence: int = -1, partition_leader_epoch: int = 0,
             last_offset_delta: int | None = None, attributes_extra: int = 0,
             records_count: int | None = None, raw_records: bytes | None = None) -> Batch:
    encoded = []
    expect = []
    ts_max = base_timestamp
    for i, r in enumerate(records):
        delta = i if r.offset_delta is None else r.offset_delta
        ts = base_timestamp if r.timestamp is None else r.timestamp
        ts_max = max(ts_max, ts)
        encoded.append(encode_record(delta, ts - base_timestamp, r.key, r.value, r.headers))
        headers = tuple((k if isinstance(k, str) else k.decode("utf-8"), v) for k, v in r.headers)
        expect.append([base_offset + delta, ts, timestamp_type, r.key, r.value, headers])
    if max_timestamp is None:
        max_timestamp = ts_max
    if timestamp_type == LOG_APPEND_TIME:
        for e in expect:
            e[1] = max_timestamp
    if last_offset_delta is None:
        last_offset_delta = max((e[0] - base_offset for e in expect), default=0)
    payload = b"".join(encoded) if raw_records is None else raw_records
    payload = compress(codec, payload)
    attributes = (codec | (timestamp_type << 3) | (0x10 if transactional else 0)
                  | (0x20 if control else 0) | attributes_extra)
    count = len(records) if records_count is None else records_count
    after_crc = struct.pack(">hiqqqhii", attributes, last_offset_delta, base_timestamp,
                            max_timestamp, producer_id, producer_epoch, base_sequence,
                            count) + payload
    crc = crc32c(after_crc)
    body = struct.pack(">ibI", partition_leader_epoch, 2, crc) + after_crc
    data = struct.pack(">qi", base_offset, len(body)) + body
    return Batch(data, base_offset, base_offset + last_offset_delta,
                 [tuple(e) for e in expect])


def control_batch(base_offset: int, producer_id: int, *, abort: bool, producer_epoch: int = 0,
                  coordinator_epoch: int = 0, timestamp: int = 1_600_000_000_000) -> Batch:
    """A transaction marker: key = version int16 (0), type int16; value = version int16,
    coordinator epoch int32."""
    key = struct.pack(">hh", 0, ABORT if abort else COMMIT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    b = v2_batch([R(key=key, value=value)], base_offset, transactional=True, control=True,
                 producer_id=producer_id, producer_epoch=producer_epoch,
                 base_timestamp=timestamp)
    b.records = []  # control records are never returned
    return b


def corrupt(data: bytes, index: int) -> bytes:
    """Flip all bits of one byte."""
    return data[:index] + bytes((data[index] ^ 0xFF,)) + data[index + 1:]


# -- legacy message sets (magic 0 / 1) -------------------------------------------------------------

def legacy_message(offset: int, value: bytes | None, key: bytes | None = None, *, magic: int = 1,
                   timestamp: int = 1_500_000_000_000, attributes: int = 0,
                   bad_crc: bool = False) -> bytes:
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    body += struct.pack(">i", -1) if key is None else struct.pack(">i", len(key)) + key
    body += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    crc = zlib.crc32(body) & 0xFFFFFFFF
    if bad_crc:
        crc ^= 0x5A5A5A5A
    msg = struct.pack(">I", crc) + body
    return struct.pack(">qi", offset, len(msg)) + msg


def legacy_wrapper(inner: list[tuple[int, bytes | None, bytes | None, int]], *, magic: int,
                   codec: int, wrapper_offset: int, timestamp: int = 1_500_000_000_000,
                   timestamp_type: int = CREATE_TIME, inner_offsets: str = "broker") -> bytes:
    """A compressed wrapper message holding ``inner`` = [(absolute offset, key, value, ts)].

    Like a broker: magic 1 inner offsets are written relative (0..n-1 for consecutive offsets,
    i.e. absolute - first absolute) and the wrapper carries the last absolute offset; magic 0
    inner offsets are absolute.
    """
    first = inner[0][0]
    parts = []
    for absolute, key, value, ts in inner:
        off = absolute - first if magic == 1 else absolute
        # Inner messages keep their producer-side attributes (CreateTime, no codec): the
        # wrapper's timestamp type is the one that counts.
        parts.append(legacy_message(off, value, key, magic=magic, timestamp=ts))
    payload = compress(codec, b"".join(parts), legacy_magic0=(magic == 0))
    attrs = codec | ((timestamp_type << 3) if magic == 1 else 0)
    return legacy_message(wrapper_offset, payload, None, magic=magic, timestamp=timestamp,
                          attributes=attrs)


def expected(batch_records, start: int = 0, end: int = 1 << 62):
    return [tuple(r) for r in batch_records if start <= r[0] < end]
