"""Unsigned varints of Kafka's flexible protocol versions and of the sink's marker
(:mod:`kafka_source.wire.varint`), against the byte strings Kafka's own ByteUtils writes."""

from __future__ import annotations

import pytest

from kafka_source.wire.varint import read_uvarint, uvarint

pytestmark = pytest.mark.pyspark_free

# value -> bytes, as org.apache.kafka.common.utils.ByteUtils.writeUnsignedVarint writes them
KNOWN = {0: b"\x00", 1: b"\x01", 127: b"\x7f", 128: b"\x80\x01", 300: b"\xac\x02",
         16_383: b"\xff\x7f", 16_384: b"\x80\x80\x01", 2**31 - 1: b"\xff\xff\xff\xff\x07",
         2**32 - 1: b"\xff\xff\xff\xff\x0f"}


@pytest.mark.parametrize("value,encoded", KNOWN.items())
def test_known_encodings_both_ways(value, encoded):
    assert uvarint(value) == encoded
    assert read_uvarint(b"\xaa" + encoded + b"\xbb", 1) == (value, 1 + len(encoded))


def test_sixty_four_bit_values_round_trip():
    for value in (2**63 - 1, 2**64 - 1, 123_456_789_012_345):
        encoded = uvarint(value)
        assert read_uvarint(encoded, 0) == (value, len(encoded))


def test_bounds_and_bad_input():
    with pytest.raises(ValueError, match="longer than 5 bytes"):
        read_uvarint(b"\x80\x80\x80\x80\x80\x01", 0, 5)      # no int32 takes six bytes
    with pytest.raises(IndexError):
        read_uvarint(b"\x80\x80", 0)                          # cut off
    with pytest.raises(ValueError, match="cannot hold -1"):
        uvarint(-1)
