"""kafka_source.wire.format.encode: Arrow columns -> record batch v2 bytes.

Three independent oracles:

* kafka-python's ``DefaultRecordBatchBuilder`` (a per-record Python writer): uncompressed batches
  must be byte-identical (after setting its partition leader epoch to -1, which is what Java's
  producer writes; kafka-python writes 0), for any mix of null / empty / long keys and values,
  headers, producer id / epoch / sequence and the transactional bit;
* the project's decoders (``records.decode_records``, the reference, which also checks the
  CRC-32C, and ``fast_decode.decode_to_arrow``) and kafka-python's ``DefaultRecordBatch`` reader
  must read every codec's batches back to the input rows;
* ``record_sizes`` must equal kafka-python's ``size_in_bytes`` and the batch's actual size.
"""

from __future__ import annotations

import gzip
import math
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kafka_source.wire.format import codecs
from kafka_source.wire.format.encode import (
    BATCH_OVERHEAD,
    encode_record_batch,
    encode_record_batches,
    record_sizes,
)
from kafka_source.wire.format.fast_decode import decode_to_arrow
from kafka_source.wire.format.records import decode_records

pytestmark = pytest.mark.pyspark_free

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
BIG = 1 << 62

# A row is (key, value, headers); headers None = a null list, [] = an empty one (both: none)


# -- building inputs ---------------------------------------------------------------------------

PAD_ROW = (b"PAD-KEY", b"PAD-VALUE" * 3, [("pad", b"pad-value")])


def columns(rows, *, keys: bool, headers: bool, value_type=pa.binary(), pad=(0, 0)):
    """Arrow columns for ``rows``; with ``pad`` = (before, after) the columns are slices (non-zero
    offset) of longer arrays whose extra rows must not leak into the batch."""
    before, after = pad
    full = [PAD_ROW] * before + list(rows) + [PAD_ROW] * after
    n = len(rows)
    v = pa.array([r[1] for r in full], type=value_type).slice(before, n)
    k = pa.array([r[0] for r in full], type=pa.binary()).slice(before, n) if keys else None
    h = None
    if headers:
        h = pa.array([None if r[2] is None else [{"key": a, "value": b} for a, b in r[2]]
                      for r in full], type=HEADER_TYPE).slice(before, n)
    return v, k, h


def kafka_python_batch(rows, *, keys: bool, headers: bool, timestamp_ms: int,
                       producer_id=-1, producer_epoch=-1, base_sequence=-1,
                       transactional=False) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=transactional, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, batch_size=1 << 31)
    for i, (key, value, hdrs) in enumerate(rows):
        meta = builder.append(i, timestamp=timestamp_ms, key=key if keys else None, value=value,
                              headers=list(hdrs or []) if headers else [])
        assert meta is not None
    out = bytearray(builder.build())
    out[12:16] = struct.pack(">i", -1)  # partitionLeaderEpoch (not covered by the CRC)
    return bytes(out)


def expected_records(rows, *, keys: bool, headers: bool, timestamp_ms: int):
    return [(i, timestamp_ms, key if keys else None, value,
             tuple(hdrs or ()) if headers else ())
            for i, (key, value, hdrs) in enumerate(rows)]


# -- reading batches back ------------------------------------------------------------------------

def via_reference(data: bytes):
    res = decode_records(data, start_offset=0, end_offset=BIG)  # checks the CRC
    assert not res.truncated
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in res.records]


def via_fast_decode(data: bytes):
    res = decode_to_arrow(data, start_offset=0, end_offset=BIG, topic="t", partition=0,
                          include_headers=True)
    out = []
    for b in res.batches:
        cols = b.to_pydict()
        millis = (b.column("timestamp").cast(pa.int64()).to_numpy() // 1000).tolist()
        for off, ms, key, value, hdrs in zip(cols["offset"], millis, cols["key"], cols["value"],
                                             cols["headers"]):
            out.append((off, ms, key, value,
                        tuple((h["key"], h["value"]) for h in hdrs) if hdrs else ()))
    return out


def via_kafka_python(data: bytes):
    batch = DefaultRecordBatch(bytes(data))
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]


def batch_fields(data: bytes) -> dict:
    (base_offset, length, epoch, magic, crc, attributes, last_delta, base_ts, max_ts, pid,
     p_epoch, seq, count) = struct.unpack_from(">qiibIhiqqqhii", data)
    return dict(base_offset=base_offset, length=length, epoch=epoch, magic=magic, crc=crc,
                attributes=attributes, last_delta=last_delta, base_ts=base_ts, max_ts=max_ts,
                producer_id=pid, producer_epoch=p_epoch, base_sequence=seq, count=count)


# -- strategies ---------------------------------------------------------------------------------

header_st = st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=12)))
row_st = st.tuples(
    st.one_of(st.none(), st.binary(max_size=20), st.binary(min_size=60, max_size=140)),
    st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=60, max_size=300)),
    st.one_of(st.none(), st.lists(header_st, max_size=4)),
)
rows_st = st.lists(row_st, min_size=1, max_size=30)
producer_st = st.one_of(
    st.just((-1, -1, -1, False)),
    st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1),
              st.booleans()),
)
layout_st = st.fixed_dictionaries({
    "keys": st.booleans(),
    "headers": st.booleans(),
    "value_type": st.sampled_from([pa.binary(), pa.large_binary()]),
    "pad": st.tuples(st.integers(0, 3), st.integers(0, 2)),
})


# -- differential: byte-identical to kafka-python -------------------------------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_st, layout=layout_st, producer=producer_st,
       timestamp_ms=st.integers(0, 2**42))
def test_identical_to_kafka_python(rows, layout, producer, timestamp_ms):
    pid, epoch, seq, txn = producer
    v, k, h = columns(rows, **layout)
    mine = encode_record_batch(v, k, h, timestamp_ms=timestamp_ms, producer_id=pid,
                               producer_epoch=epoch, base_sequence=seq, transactional=txn)
    theirs = kafka_python_batch(rows, keys=layout["keys"], headers=layout["headers"],
                                timestamp_ms=timestamp_ms, producer_id=pid,
                                producer_epoch=epoch, base_sequence=seq, transactional=txn)
    assert mine == theirs
    sizes = record_sizes(v, k, h)
    assert sizes.dtype == np.int64
    assert int(sizes.sum()) + BATCH_OVERHEAD == len(mine)
    assert sizes.tolist() == [
        DefaultRecordBatchBuilder.size_in_bytes(
            i, 0, key if layout["keys"] else None, value,
            list(hdrs or []) if layout["headers"] else [])
        for i, (key, value, hdrs) in enumerate(rows)]


# -- round trips through every decoder, every codec ------------------------------------------------

@pytest.mark.parametrize("compression", CODECS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_st, layout=layout_st, producer=producer_st)
def test_round_trip(compression, rows, layout, producer):
    pid, epoch, seq, txn = producer
    # at least 70 records, so that fast_decode takes its vectorised path (not its fallback)
    rows = (rows * math.ceil(70 / len(rows)))[:max(70, len(rows))]
    v, k, h = columns(rows, **layout)
    data = encode_record_batch(v, k, h, timestamp_ms=1_700_000_000_123, producer_id=pid,
                               producer_epoch=epoch, base_sequence=seq, transactional=txn,
                               compression=compression)
    expected = expected_records(rows, keys=layout["keys"], headers=layout["headers"],
                                timestamp_ms=1_700_000_000_123)
    assert via_reference(data) == expected
    assert via_fast_decode(data) == expected
    assert via_kafka_python(data) == expected
    f = batch_fields(data)
    assert f["attributes"] & 0x07 == CODECS.index(compression)
    assert bool(f["attributes"] & 0x10) == txn
    assert f["attributes"] & ~0x17 == 0            # CreateTime, not a control batch
    assert (f["base_offset"], f["epoch"], f["magic"]) == (0, -1, 2)
    assert f["length"] == len(data) - 12
    assert (f["last_delta"], f["count"]) == (len(rows) - 1, len(rows))
    assert f["base_ts"] == f["max_ts"] == 1_700_000_000_123
    assert (f["producer_id"], f["producer_epoch"], f["base_sequence"]) == (pid, epoch, seq)


# -- several batches in one pass -------------------------------------------------------------------

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(row_st, min_size=1, max_size=40), layout=layout_st, data=st.data(),
       compression=st.sampled_from(CODECS))
def test_batches_equal_single_batches(rows, layout, data, compression):
    n = len(rows)
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=6)) if n > 1 else set())
    starts = [0] + cuts
    nb = len(starts)
    timestamps = data.draw(st.one_of(st.integers(0, 2**41),
                                     st.lists(st.integers(0, 2**41), min_size=nb, max_size=nb)))
    sequences = data.draw(st.one_of(st.none(), st.lists(st.integers(0, 2**31 - 1), min_size=nb,
                                                         max_size=nb)))
    v, k, h = columns(rows, **layout)
    got = encode_record_batches(v, k, h, batch_starts=np.array(starts), timestamp_ms=timestamps,
                                base_sequences=sequences, producer_id=5 if sequences else -1,
                                producer_epoch=2 if sequences else -1, compression=compression)
    assert len(got) == nb
    ends = starts[1:] + [n]
    for b, (lo, hi) in enumerate(zip(starts, ends)):
        one = encode_record_batch(
            v.slice(lo, hi - lo), None if k is None else k.slice(lo, hi - lo),
            None if h is None else h.slice(lo, hi - lo),
            timestamp_ms=timestamps if isinstance(timestamps, int) else timestamps[b],
            base_sequence=-1 if sequences is None else sequences[b],
            producer_id=5 if sequences else -1, producer_epoch=2 if sequences else -1,
            compression=compression)
        assert got[b] == one, b


def test_batches_argument_errors():
    v = pa.array([b"a", b"b", b"c"])
    for starts in ([], [1], [0, 0], [0, 2, 1], [0, 3]):
        with pytest.raises(ValueError, match="batch_starts"):
            encode_record_batches(v, batch_starts=starts, timestamp_ms=0)
    with pytest.raises(ValueError, match="timestamp_ms has 1 entries for 2 batches"):
        encode_record_batches(v, batch_starts=[0, 1], timestamp_ms=[5])
    with pytest.raises(ValueError, match="base_sequences has 3 entries for 2 batches"):
        encode_record_batches(v, batch_starts=[0, 1], timestamp_ms=0, base_sequences=[1, 2, 3],
                              producer_id=1, producer_epoch=0)


# -- edge cases ------------------------------------------------------------------------------------

def check_all(rows, *, keys=True, headers=True, compare_kafka_python=True, **layout):
    """Encode ``rows`` with every codec and read them back; uncompressed also byte-compared."""
    v, k, h = columns(rows, keys=keys, headers=headers, **layout)
    expected = expected_records(rows, keys=keys, headers=headers, timestamp_ms=42)
    for compression in CODECS:
        data = encode_record_batch(v, k, h, timestamp_ms=42, compression=compression)
        assert via_reference(data) == expected, compression
        assert via_fast_decode(data) == expected, compression
        assert via_kafka_python(data) == expected, compression
        if compression == "none":
            assert int(record_sizes(v, k, h).sum()) + BATCH_OVERHEAD == len(data)
            if compare_kafka_python:
                assert data == kafka_python_batch(rows, keys=keys, headers=headers,
                                                  timestamp_ms=42)


def test_one_record():
    check_all([(None, None, None)])
    check_all([(b"k", b"v", [("h", None)])])
    check_all([(None, b"v", None)], keys=False, headers=False)


def test_empty_values_keys_and_header_parts():
    check_all([(b"", b"", [("", b"")])] * 5)
    check_all([(b"", b"", [])] * 100)


def test_values_larger_than_64k():
    # 3-byte length varints; several LZ4 (64 KiB) and xerial snappy (32 KiB) blocks
    rng = np.random.default_rng(7)
    big = rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    text = b"the quick brown fox " * 5000
    check_all([(b"k1", big, None), (None, text, [("h", big[:70_000])]), (b"k3", b"small", [])])


def test_long_keys_and_many_headers():
    many = [(f"header-{i}", None if i % 7 == 0 else bytes([i % 256]) * (i % 50))
            for i in range(1000)]
    check_all([(b"K" * 9000, b"v", many), (None, None, many[:3]), (b"k", b"", None)])


def test_ten_thousand_records():
    # offset deltas >= 8192 need 3-byte varints
    rows = [(None if i % 11 == 0 else b"key-%d" % i, b"value-%d" % i * (i % 4),
             [("i", b"%d" % i)] if i % 3 == 0 else None) for i in range(10_000)]
    check_all(rows)


def test_no_header_in_any_row_equals_no_headers_column():
    rows = [(b"k", b"v", None), (b"k2", None, []), (None, b"x", None)]
    v, k, h = columns(rows, keys=True, headers=True)
    assert encode_record_batch(v, k, h, timestamp_ms=1) == encode_record_batch(v, k,
                                                                               timestamp_ms=1)


def test_sliced_string_and_chunked_inputs():
    rows = [(b"k%d" % i, ("välue-%d" % i).encode(), [("ké", b"v")]) for i in range(20)]
    reference = encode_record_batch(*columns(rows[5:15], keys=True, headers=True),
                                    timestamp_ms=9)
    # string values and keys, sliced at an offset
    sv = pa.array([r[1].decode() for r in rows], type=pa.large_string()).slice(5, 10)
    sk = pa.array([r[0].decode() for r in rows], type=pa.string()).slice(5, 10)
    _, _, h = columns(rows, keys=True, headers=True)
    assert encode_record_batch(sv, sk, h.slice(5, 10), timestamp_ms=9) == reference
    # chunked columns
    v, k, h = columns(rows[5:15], keys=True, headers=True)
    chunked = [pa.chunked_array([a.slice(0, 4), a.slice(4)]) for a in (v, k, h)]
    assert encode_record_batch(*chunked, timestamp_ms=9) == reference
    # large list / large binary / large string headers, children in another order
    large_type = pa.large_list(pa.struct([("value", pa.large_binary()),
                                          ("key", pa.large_string())]))
    lh = pa.array([[{"key": "ké", "value": b"v"}]] * 10, type=large_type)
    assert encode_record_batch(v, k, lh, timestamp_ms=9) == reference


def test_null_slots_that_span_bytes():
    # Arrow allows a null element to cover data bytes; it must still be encoded as null
    validity = pa.array([True, False, True]).buffers()[1]
    offsets = pa.py_buffer(np.array([0, 2, 6, 7], dtype=np.int32))
    data = pa.py_buffer(b"abXXXXc")
    values = pa.Array.from_buffers(pa.binary(), 3, [validity, offsets, data], null_count=1)
    keys = pa.Array.from_buffers(pa.binary(), 3, [validity, offsets, data], null_count=1)
    rows = [(b"ab", b"ab", None), (None, None, None), (b"c", b"c", None)]
    assert encode_record_batch(values, keys, timestamp_ms=3) == kafka_python_batch(
        rows, keys=True, headers=False, timestamp_ms=3)
    # a null header list whose slot spans entries: no headers for that row
    entries = pa.array([{"key": "a", "value": b"1"}, {"key": "SKIP", "value": b"x"},
                        {"key": "b", "value": None}], type=HEADER_TYPE.value_type)
    lists = pa.ListArray.from_arrays(pa.array([0, 1, 2, 3], type=pa.int32()), entries,
                                     mask=pa.array([False, True, False]))
    assert encode_record_batch(values, keys, lists, timestamp_ms=3) == kafka_python_batch(
        [(b"ab", b"ab", [("a", b"1")]), (None, None, None), (b"c", b"c", [("b", None)])],
        keys=True, headers=True, timestamp_ms=3)


# -- what each codec writes ----------------------------------------------------------------------

def records_section(data: bytes) -> bytes:
    return data[BATCH_OVERHEAD:]


def test_codec_framing_is_javas():
    text = b"".join(b"record %d of a compressible batch; " % i for i in range(20_000))
    v = pa.array([text[i:i + 1000] for i in range(0, len(text), 1000)])
    plain = records_section(encode_record_batch(v, timestamp_ms=0))

    gz = records_section(encode_record_batch(v, timestamp_ms=0, compression="gzip"))
    assert gz[:3] == b"\x1f\x8b\x08" and gzip.decompress(gz) == plain

    sn = records_section(encode_record_batch(v, timestamp_ms=0, compression="snappy"))
    # xerial framing: magic, version 1, compatible version 1, then [int32 length][raw block]
    # with at most 32 KiB of input per block, as snappy-java's SnappyOutputStream writes
    assert sn[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    import snappy  # python-snappy: another implementation than the encoder's cramjam

    pos, out = 16, []
    while pos < len(sn):
        (size,) = struct.unpack_from(">i", sn, pos)
        block = snappy.uncompress(sn[pos + 4:pos + 4 + size])
        assert len(block) <= 32 * 1024
        out.append(block)
        pos += 4 + size
    assert pos == len(sn) and b"".join(out) == plain and len(out) > 1

    lz = records_section(encode_record_batch(v, timestamp_ms=0, compression="lz4"))
    # Java's KafkaLZ4BlockOutputStream: FLG 0x60 (version 1, independent blocks, no checksums,
    # no content size), BD 0x40 (64 KiB blocks)
    assert lz[:4] == b"\x04\x22\x4d\x18" and lz[4] == 0x60 and lz[5] == 0x40
    assert lz[6] == (codecs.xxh32(lz[4:6]) >> 8) & 0xFF
    import lz4.frame

    assert lz4.frame.decompress(lz) == plain

    zs = records_section(encode_record_batch(v, timestamp_ms=0, compression="zstd"))
    assert zs[:4] == b"\x28\xb5\x2f\xfd"
    import zstandard

    assert zstandard.ZstdDecompressor().decompressobj().decompress(zs) == plain

    for section in (gz, sn, lz, zs):
        assert len(section) < len(plain) // 4       # it did compress


def test_incompressible_data_is_still_compressed():
    # Java compresses whatever the outcome; kafka-python would fall back to none
    v = pa.array([np.random.default_rng(1).integers(0, 256, 300, dtype=np.uint8).tobytes()])
    for compression in CODECS[1:]:
        data = encode_record_batch(v, timestamp_ms=0, compression=compression)
        assert batch_fields(data)["attributes"] & 7 == CODECS.index(compression)
        assert via_reference(data)[0][3] == v[0].as_py()


def test_compress_roundtrips_through_decompress():
    payloads = [b"", b"x", bytes(range(256)) * 700, b"abc" * 100_000]
    for codec in (codecs.CODEC_GZIP, codecs.CODEC_SNAPPY, codecs.CODEC_LZ4, codecs.CODEC_ZSTD):
        for p in payloads:
            assert codecs.decompress(codec, codecs.compress(codec, p)) == p
            assert codecs.decompress(codec, codecs.compress(codec, memoryview(p))) == p
    assert codecs.compress(codecs.CODEC_NONE, b"ab") == b"ab"
    with pytest.raises(ValueError, match="unknown compression codec id 9"):
        codecs.compress(9, b"")


def test_crc_covers_the_records():
    data = bytearray(encode_record_batch(pa.array([b"hello"] * 3), timestamp_ms=0))
    data[-3] ^= 1
    from kafka_source.errors import CorruptRecordError

    with pytest.raises(CorruptRecordError, match="CRC"):
        decode_records(bytes(data), start_offset=0, end_offset=BIG)


# -- bad input -----------------------------------------------------------------------------------

def test_record_sizes_of_nothing():
    assert record_sizes(pa.array([], type=pa.binary())).tolist() == []


def test_errors():
    v = pa.array([b"a", b"b"])
    with pytest.raises(ValueError, match="at least one record"):
        encode_record_batch(pa.array([], type=pa.binary()), timestamp_ms=0)
    with pytest.raises(ValueError, match="keys has 1 rows, values has 2"):
        encode_record_batch(v, pa.array([b"k"]), timestamp_ms=0)
    with pytest.raises(ValueError, match="headers has 3 rows, values has 2"):
        encode_record_batch(v, None, pa.array([None] * 3, type=HEADER_TYPE), timestamp_ms=0)
    with pytest.raises(ValueError, match="unknown compression type 'brotli'; valid: none, gzip"):
        encode_record_batch(v, timestamp_ms=0, compression="brotli")
    with pytest.raises(ValueError, match="transactional batch needs a producer id"):
        encode_record_batch(v, timestamp_ms=0, transactional=True)
    with pytest.raises(TypeError, match="values must be binary or string"):
        encode_record_batch(pa.array([1, 2]), timestamp_ms=0)
    with pytest.raises(TypeError, match="keys must be binary or string"):
        encode_record_batch(v, pa.array([1.0, 2.0]), timestamp_ms=0)
    with pytest.raises(TypeError, match="values must be a pyarrow Array"):
        encode_record_batch([b"a"], timestamp_ms=0)
    with pytest.raises(TypeError, match=r"headers must be a list<struct<key: string, value"):
        encode_record_batch(v, None, pa.array([["a"], ["b"]]), timestamp_ms=0)
    # a null header key, or a null header entry: Kafka header keys are never null
    for bad in ([[{"key": "a", "value": b"1"}], [{"key": None, "value": b"2"}]],
                [[{"key": "a", "value": b"1"}], [None]]):
        with pytest.raises(ValueError, match="row 1 has a header with a null key"):
            encode_record_batch(v, None, pa.array(bad, type=HEADER_TYPE), timestamp_ms=0)
        with pytest.raises(ValueError, match="row 1 has a header with a null key"):
            record_sizes(v, None, pa.array(bad, type=HEADER_TYPE))
