"""kafka_source.wire.format.codecs: every Kafka codec, the framings the Java client writes, and failures."""

import gzip
import os
import struct
import zlib

import pytest

from kafka_source.wire.format.codecs import decompress, xxh32
from kafka_source.errors import CorruptRecordError, KafkaSourceError

from . import record_builder as rb

pytestmark = pytest.mark.pyspark_free

PAYLOADS = {
    "empty": b"",
    "one-byte": b"x",
    "text": b"the quick brown fox jumps over the lazy dog " * 50,
    "random-100k": os.urandom(100_000),
    "zeros-300k": bytes(300_000),
}


@pytest.mark.parametrize("name", list(PAYLOADS))
@pytest.mark.parametrize("codec", rb.CODECS)
def test_round_trip_every_codec(codec, name):
    data = PAYLOADS[name]
    packed = rb.compress(codec, data)
    if codec != rb.NONE and len(data) > 1000 and name != "random-100k":
        assert len(packed) < len(data)  # really compressed, not stored
    assert decompress(codec, packed) == data
    assert decompress(codec, memoryview(packed)) == data
    assert decompress(codec, bytearray(packed)) == data


def test_none_returns_bytes():
    out = decompress(0, memoryview(b"abc"))
    assert out == b"abc" and isinstance(out, bytes)


# -- gzip -----------------------------------------------------------------------------------------

def test_gzip_concatenated_members():
    data = gzip.compress(b"first,") + gzip.compress(b"second")
    assert decompress(1, data) == b"first,second"


def test_gzip_accepts_zlib_stream():
    assert decompress(1, zlib.compress(b"zlib wrapped" * 10)) == b"zlib wrapped" * 10


def test_gzip_truncated_raises():
    packed = gzip.compress(os.urandom(5000))
    with pytest.raises(CorruptRecordError, match="gzip"):
        decompress(1, packed[:-20])


# -- snappy ---------------------------------------------------------------------------------------

def test_snappy_xerial_many_blocks():
    data = os.urandom(10_000) + b"abc" * 20_000
    packed = rb.snappy_xerial(data, block_size=4096)
    assert packed.count(b"\x82SNAPPY") == 1
    assert decompress(2, packed) == data


def test_snappy_xerial_little_endian_version_fields():
    # Some producers write the xerial version fields little-endian; they carry no information.
    data = b"redpanda style " * 100
    packed = rb.snappy_xerial(data, version=b"\x01\x00\x00\x00")
    assert decompress(2, packed) == data


def test_snappy_raw_block():
    data = b"plain raw snappy block " * 100
    assert decompress(2, rb.snappy_raw(data)) == data


def test_snappy_xerial_block_overrun_raises():
    packed = rb.snappy_xerial(b"hello world" * 100)
    bad = packed[:16] + struct.pack(">i", 10_000) + packed[20:]
    with pytest.raises(CorruptRecordError, match="snappy"):
        decompress(2, bad)


def test_snappy_garbage_raises():
    with pytest.raises(CorruptRecordError):
        decompress(2, b"\xff\xff\xff\xff\xff\x00garbage")


# -- lz4 ------------------------------------------------------------------------------------------

def test_lz4_magic0_broken_header_checksum_is_accepted():
    data = b"kafka 0.8 lz4 " * 200
    broken = rb.lz4_broken_header_checksum(rb.lz4_frame(data))
    assert decompress(3, broken, magic=0) == data


def test_lz4_broken_header_checksum_rejected_for_magic_1_and_2():
    # Only magic 0 was written with the bug; for newer formats it is real corruption.
    broken = rb.lz4_broken_header_checksum(rb.lz4_frame(b"abc" * 100))
    for magic in (1, 2):
        with pytest.raises(CorruptRecordError, match="lz4"):
            decompress(3, broken, magic=magic)


def test_lz4_magic0_with_correct_header_checksum_still_works():
    data = b"written by a fixed client " * 50
    assert decompress(3, rb.lz4_frame(data), magic=0) == data


def test_lz4_magic0_fix_with_content_size_in_header():
    import lz4.frame

    data = os.urandom(2000) * 3
    frame = lz4.frame.compress(data, store_size=True)
    assert frame[4] & 0x08  # content size present: header checksum covers 9 more bytes
    broken = rb.lz4_broken_header_checksum(frame)
    assert broken != frame
    assert decompress(3, broken, magic=0) == data


def test_lz4_concatenated_frames():
    assert decompress(3, rb.lz4_frame(b"one ") + rb.lz4_frame(b"two")) == b"one two"


def test_lz4_truncated_raises():
    packed = rb.lz4_frame(os.urandom(5000))
    with pytest.raises(CorruptRecordError):
        decompress(3, packed[:-10])


def test_lz4_trailing_garbage_raises():
    with pytest.raises(CorruptRecordError, match="trailing"):
        decompress(3, rb.lz4_frame(b"abc") + b"junk")


def test_xxh32_known_vectors():
    assert xxh32(b"") == 0x02CC5D05
    assert xxh32(b"a") == 0x550D7456
    assert xxh32(b"abc") == 0x32D153FF
    assert xxh32(b"", seed=1) == rb.xxh32_short(b"", seed=1)


@pytest.mark.parametrize("n", [0, 1, 3, 4, 7, 15, 16, 17, 31, 32, 33, 100, 1023])
def test_xxh32_matches_lz4_content_checksum(n):
    # An LZ4 frame with a content checksum ends with xxh32(content) little-endian: an
    # independent oracle for every input length (including the >= 16 byte stripe loop).
    import lz4.frame

    data = os.urandom(n)
    frame = lz4.frame.compress(data, content_checksum=True)
    assert xxh32(data) == int.from_bytes(frame[-4:], "little")
    if n < 16:
        assert rb.xxh32_short(data) == xxh32(data)


def test_builder_xxh32_matches_lz4_header_checksum():
    frame = rb.lz4_frame(b"header checksum check")
    flg = frame[4]
    hc_pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    assert frame[hc_pos] == (rb.xxh32_short(frame[4:hc_pos]) >> 8) & 0xFF


# -- zstd -----------------------------------------------------------------------------------------

def test_zstd_without_content_size_and_several_frames():
    import zstandard

    data = os.urandom(3000) + b"z" * 100_000
    packed = rb.zstd_frames(data, nframes=3)
    with pytest.raises(zstandard.ZstdError):  # what a one-shot decompress would do
        zstandard.ZstdDecompressor().decompress(packed)
    assert decompress(4, packed) == data


def test_zstd_truncated_raises():
    packed = rb.zstd_frames(os.urandom(5000))
    with pytest.raises(CorruptRecordError, match="zstd"):
        decompress(4, packed[:-5])


def test_zstd_garbage_raises():
    with pytest.raises(CorruptRecordError):
        decompress(4, b"\x28\xb5\x2f\xfd garbage that is not zstd")


# -- unknown codec --------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [5, 6, 7, -1, 99])
def test_unknown_codec_raises(codec):
    with pytest.raises(CorruptRecordError, match=f"unknown compression codec id {codec}"):
        decompress(codec, b"whatever")


def test_corrupt_record_error_is_a_source_error():
    assert issubclass(CorruptRecordError, KafkaSourceError)
