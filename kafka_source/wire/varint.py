"""Unsigned varints one value at a time (LEB128: seven bits a byte, low bits first, the high bit
set on every byte but the last), as Kafka's flexible protocol versions (KIP-482) write lengths,
array sizes and tagged fields, and as the sink's transaction marker stores its numbers.

The record format's signed (zigzag) varints of whole batches are decoded elsewhere, vectorised
(:mod:`kafka_source.wire.format`); this is for the few values of a request or a marker.
"""

from __future__ import annotations


def uvarint(value: int) -> bytes:
    """``value`` (>= 0) as an unsigned varint."""
    if value < 0x80:
        if value < 0:
            raise ValueError(f"an unsigned varint cannot hold {value}")
        return bytes((value,))    # one byte: the lengths and counts of nearly every request
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint(buf, pos: int, max_bytes: int = 10) -> tuple[int, int]:
    """The unsigned varint at ``buf[pos]`` and the position after it. ValueError past
    ``max_bytes`` bytes (Kafka's protocol: 5 for an int32), IndexError at the end of ``buf``."""
    value = shift = 0
    for _ in range(max_bytes):
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise ValueError(f"unsigned varint longer than {max_bytes} bytes")
