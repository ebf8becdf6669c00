"""kafka_source.write.partitioner against Java's murmur2 and kafka-python's port of it.

Java's ``UtilsTest.testMurmur2`` vectors pin the hash itself; kafka-python's
``kafka.partitioner.default.murmur2`` (a line-by-line port of ``Utils.murmur2``) is the oracle
for everything hypothesis generates: every key length (blocks and 1-3 trailing bytes), bytes
>= 0x80, empty keys, nulls, sliced, large and string arrays.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from kafka_source.write.partitioner import murmur2, partitions_for_keys

pytestmark = pytest.mark.pyspark_free

# org.apache.kafka.common.utils.UtilsTest.testMurmur2
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def signed(h: int) -> int:
    return h - (1 << 32) if h >= 1 << 31 else h


def oracle(key: bytes) -> int:
    return signed(kafka_python_murmur2(key) & 0xFFFFFFFF)


def oracle_partition(key: bytes | None, n: int) -> int:
    return -1 if key is None else (oracle(key) & 0x7FFFFFFF) % n


def test_java_vectors():
    got = murmur2(pa.array(list(JAVA_VECTORS), type=pa.binary()))
    assert got.dtype == np.int32
    assert got.tolist() == list(JAVA_VECTORS.values())


def test_java_vectors_one_at_a_time_and_in_other_orders():
    # the lanes finish at different block positions: order and company must not matter
    for key, expected in JAVA_VECTORS.items():
        assert murmur2(pa.array([key])).tolist() == [expected]
    keys = sorted(JAVA_VECTORS, key=len, reverse=True)
    assert murmur2(pa.array(keys)).tolist() == [JAVA_VECTORS[k] for k in keys]


def test_empty_key_and_partition_of_known_keys():
    # kafka-python and Java agree: the empty key hashes to seed-derived 275646681
    assert murmur2(pa.array([b""])).tolist() == [oracle(b"")] == [275646681]
    # toPositive(-790332482) = 1357151166; % 50 = 16
    assert partitions_for_keys(pa.array([b"foobar"]), 50).tolist() == [16]


def test_high_bytes_in_blocks_and_tails():
    # Java bytes are signed; murmur2 masks them with 0xff: a byte >= 0x80 must not sign-extend
    keys = [b"\xff", b"\x80\x81", b"\xfe\xfd\xfc", b"\xff\xff\xff\xff", b"\x00\xff\x80\x7f\xc3",
            bytes(range(256)), bytes(range(255, -1, -1))[:7]]
    assert murmur2(pa.array(keys)).tolist() == [oracle(k) for k in keys]


def test_nulls():
    keys = pa.array([b"a", None, b"", None, b"abcde"], type=pa.binary())
    assert partitions_for_keys(keys, 7).tolist() == [
        oracle_partition(k, 7) for k in [b"a", None, b"", None, b"abcde"]]
    # murmur2 itself hashes a null like an empty key
    assert murmur2(keys).tolist()[1] == oracle(b"")


def test_null_slot_spanning_bytes_is_ignored():
    # Arrow allows a null element to span data bytes; it is still a null key
    offsets = np.array([0, 3, 8, 9], dtype=np.int32)
    validity = pa.array([True, False, True]).buffers()[1]
    arr = pa.Array.from_buffers(pa.binary(), 3, [validity, pa.py_buffer(offsets),
                                                 pa.py_buffer(b"abcdefghi")], null_count=1)
    assert partitions_for_keys(arr, 5).tolist() == [oracle_partition(b"abc", 5), -1,
                                                    oracle_partition(b"i", 5)]


def test_string_large_and_chunked_keys():
    words = ["", "é", "naïve", "日本語のキー", "0123456789abcdef"]
    raw = [w.encode("utf-8") for w in words]
    expected = [oracle(k) for k in raw]
    for arr in (pa.array(words, pa.string()), pa.array(words, pa.large_string()),
                pa.array(raw, pa.large_binary()), pa.array(raw, pa.binary_view()),
                pa.chunked_array([pa.array(raw[:2]), pa.array(raw[2:])])):
        assert murmur2(arr).tolist() == expected, arr.type


def test_empty_array():
    assert murmur2(pa.array([], type=pa.binary())).tolist() == []
    assert partitions_for_keys(pa.array([], type=pa.binary()), 3).tolist() == []


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_bad_partition_count(bad):
    with pytest.raises(ValueError, match="num_partitions"):
        partitions_for_keys(pa.array([b"a"]), bad)


def test_bad_key_type():
    with pytest.raises(TypeError, match="keys must be binary or string"):
        murmur2(pa.array([1, 2]))
    with pytest.raises(TypeError, match="pyarrow Array"):
        murmur2([b"a"])


keys_st = st.lists(st.one_of(st.none(), st.binary(max_size=70)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(keys=keys_st, n=st.integers(1, 1000), cut=st.data())
def test_matches_kafka_python(keys, n, cut):
    arr = pa.array(keys, type=pa.binary())
    assert murmur2(arr).tolist() == [oracle(k or b"") for k in keys]
    assert partitions_for_keys(arr, n).tolist() == [oracle_partition(k, n) for k in keys]
    # a slice with a non-zero offset, as binary and as large binary
    lo = cut.draw(st.integers(0, len(keys)))
    hi = cut.draw(st.integers(lo, len(keys)))
    for typ in (pa.binary(), pa.large_binary()):
        part = pa.array(keys, type=typ).slice(lo, hi - lo)
        assert partitions_for_keys(part, n).tolist() == [
            oracle_partition(k, n) for k in keys[lo:hi]]


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=40),
       seed=st.integers(0, 2**32 - 1))
def test_mixed_long_keys(lengths, seed):
    # long and short keys together: lanes drop out of the block loop at different positions
    rng = np.random.default_rng(seed)
    keys = [rng.integers(0, 256, size=k, dtype=np.uint8).tobytes() for k in lengths]
    assert murmur2(pa.array(keys, type=pa.binary())).tolist() == [oracle(k) for k in keys]
