"""Fetch requests and responses on the wire, without copying the record bytes.

kafka-python decodes a FetchResponse into Python objects and copies every partition's records out
of the received frame (after its network layer has already copied them a few times on the way
in). The executors' hot loop instead receives each response frame into one preallocated buffer
(:mod:`kafka_source.wire.net.fetch_connection`) and parses it here: the per-partition fields are read
with ``struct`` and each partition's records stay a ``memoryview`` into that buffer, which the
decoders read in place.

Versions 4 to 12 are understood: v4 (Kafka 0.11) is the first with ``isolation_level`` and
aborted transactions, v7 (Kafka 1.1) adds fetch sessions (KIP-227), v11 the preferred read
replica, v12 (Kafka 2.7) the flexible encoding (compact lengths, tagged fields). v13 would
address topics by id, which this source does not track, so 12 is the cap. Kafka 4 removed
versions below 4 (KIP-896); Kafka 2.2, the oldest broker this source supports, speaks up to v10.

Requests are small and built with kafka-python's own ``FetchRequest`` encoder.

A response larger than the connection accepts is not received; :func:`records_sizes` reads the
partition headers at its start, so that the error can name the partition whose record batch made
it that large.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from kafka.protocol.consumer import FetchRequest

from ...errors import KafkaSourceError
from ..varint import read_uvarint

TopicPartition = tuple[str, int]

MIN_FETCH_VERSION = 4
MAX_FETCH_VERSION = 12
SESSION_VERSION = 7        # fetch sessions (KIP-227)
_FLEXIBLE_VERSION = 12

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I32_I16_I32 = struct.Struct(">ihi")     # throttle_time_ms, error_code, session_id (v7+)
# partition_index, error_code, high_watermark, last_stable_offset
_PART_HEAD = struct.Struct(">ihqq")
_I64 = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")


class FetchProtocolError(KafkaSourceError):
    """A Fetch response that does not parse: the connection it came from is not trusted again."""


@dataclass(frozen=True)
class FetchPartitionRequest:
    """One partition of a Fetch request. ``leader_epoch``: the partition's leader epoch as the
    latest metadata gives it (KIP-320, Fetch v9+), or -1. A broker whose epoch differs answers
    FENCED_LEADER_EPOCH (ours is older: look the leader up again) or UNKNOWN_LEADER_EPOCH (the
    broker has not caught up yet) instead of serving records from a log that is not, or not
    yet, the leader's."""

    offset: int
    max_bytes: int
    leader_epoch: int = -1


@dataclass
class PartitionData:
    """One partition of a Fetch response. ``records`` is a view into the response buffer: valid
    until the connection receives its next response."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: list[tuple[int, int]]    # (producer_id, first_offset)
    records: memoryview


@dataclass
class FetchResult:
    """A parsed Fetch response: top-level error and session id (v7+), and the partitions it
    holds. An incremental fetch-session response leaves out partitions with nothing new."""

    error_code: int
    session_id: int
    partitions: dict[TopicPartition, PartitionData] = field(default_factory=dict)
    # Filled in by the connection: what the request asked for, and whether it was full (then
    # every requested partition is in ``partitions``).
    requested: Mapping[TopicPartition, FetchPartitionRequest] = field(default_factory=dict)
    full: bool = True


def encode_fetch_request(*, version: int, correlation_id: int, client_id: str,
                         partitions: Mapping[TopicPartition, FetchPartitionRequest],
                         forgotten: Sequence[TopicPartition] = (), session_id: int = 0,
                         session_epoch: int = -1, max_wait_ms: int, min_bytes: int,
                         max_bytes: int, read_committed: bool) -> bytes:
    """The framed bytes (size, header, body) of one Fetch request."""
    FT = FetchRequest.FetchTopic
    FP = FT.FetchPartition
    topics: dict[str, list] = {}
    for (topic, partition), p in partitions.items():
        topics.setdefault(topic, []).append(FP(
            partition=partition, current_leader_epoch=p.leader_epoch, fetch_offset=p.offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=p.max_bytes))
    gone: dict[str, list[int]] = {}
    for topic, partition in forgotten:
        gone.setdefault(topic, []).append(partition)
    request = FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
        isolation_level=1 if read_committed else 0, session_id=session_id,
        session_epoch=session_epoch, topics=[FT(topic=t, partitions=ps) for t, ps in topics.items()],
        forgotten_topics_data=[FetchRequest.ForgottenTopic(topic=t, partitions=ps)
                               for t, ps in gone.items()],
        rack_id="")
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return request.encode(framed=True, header=True)


def response_header_size(version: int, frame: memoryview) -> int:
    """Bytes of the response header at the start of ``frame`` (the correlation id, plus a tagged
    field section in flexible versions)."""
    if version < _FLEXIBLE_VERSION:
        return 4
    return _skip_tags(frame, 4)


def parse_fetch_response(frame: memoryview, version: int) -> FetchResult:
    """Parse a Fetch response body of ``version`` (the frame after the response header).

    ``frame`` must be a 1-D byte memoryview; the records of every partition are views into it.
    Raises :class:`FetchProtocolError` if the bytes are not a well-formed response.
    """
    try:
        return _parse(frame, version)
    except (struct.error, IndexError, ValueError) as exc:
        raise FetchProtocolError(f"malformed Fetch v{version} response: {exc}") from exc


def records_sizes(body: memoryview, version: int) -> dict[TopicPartition, int]:
    """The size of the records each partition of a Fetch response declares, for the partitions
    whose headers are within ``body``: the start of a response body (after the response header)
    that is too large to receive. The partition whose records run past ``body`` is included:
    it is the one that made the response that large (a record batch above the fetch sizes,
    which Kafka returns whole as the first of a response, KIP-74). -1 means no records."""
    sizes: dict[TopicPartition, int] = {}
    try:
        _parse(body, version, sizes)
    except (struct.error, IndexError, ValueError):
        pass                                  # body ends within the response, as expected
    return sizes


def _parse(buf: memoryview, version: int,
           sizes: dict[TopicPartition, int] | None = None) -> FetchResult:
    """Parse a whole response body, or with ``sizes`` the start of one, collecting each
    partition's records size there until the bytes end (see :func:`records_sizes`)."""
    flexible = version >= _FLEXIBLE_VERSION
    n = len(buf)
    if version >= SESSION_VERSION:
        _throttle, error_code, session_id = _I32_I16_I32.unpack_from(buf, 0)
        pos = 10
    else:
        error_code, session_id = 0, 0
        pos = 4
    result = FetchResult(error_code, session_id)
    parts = result.partitions
    topics, pos = _array_len(buf, pos, flexible)
    for _ in range(topics):
        topic, pos = _string(buf, pos, flexible)
        count, pos = _array_len(buf, pos, flexible)
        for _ in range(count):
            partition, code, hw, lso = _PART_HEAD.unpack_from(buf, pos)
            pos += _PART_HEAD.size
            log_start = -1
            if version >= 5:
                (log_start,) = _I64.unpack_from(buf, pos)
                pos += 8
            aborted_n, pos = _array_len(buf, pos, flexible, nullable=True)
            aborted = []
            for _ in range(max(aborted_n, 0)):
                aborted.append(_ABORTED.unpack_from(buf, pos))
                pos += 16
                if flexible:
                    pos = _skip_tags(buf, pos)
            if version >= 11:
                pos += 4                      # preferred_read_replica
            size, pos = _length(buf, pos, flexible)
            if sizes is not None:
                sizes[(topic, partition)] = size
            if size < 0:
                records = buf[pos:pos]
            else:
                if pos + size > n:
                    raise ValueError(f"records of {topic}-{partition} run past the frame end")
                records = buf[pos:pos + size]
                pos += size
            if flexible:
                pos = _skip_tags(buf, pos)
            parts[(topic, partition)] = PartitionData(code, hw, lso, log_start, aborted, records)
        if flexible:
            pos = _skip_tags(buf, pos)
    if flexible:
        pos = _skip_tags(buf, pos)
    if pos != n:
        raise ValueError(f"{n - pos} unexpected bytes after the response")
    return result


def _skip_tags(buf, pos: int) -> int:
    if buf[pos] == 0:             # no tagged fields: the rule, and one byte
        return pos + 1
    count, pos = read_uvarint(buf, pos, 5)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos, 5)
        size, pos = read_uvarint(buf, pos, 5)
        pos += size
    if pos > len(buf):
        raise ValueError("tagged field runs past the frame end")
    return pos


def _length(buf, pos: int, flexible: bool, fixed: struct.Struct = _I32) -> tuple[int, int]:
    """A length prefix: in flexible versions an unsigned varint of length + 1, else a signed
    big-endian int of ``fixed``'s width; -1 means null."""
    if flexible:
        k = buf[pos]
        if k < 0x80:              # one byte: every length below 127, read without a call
            return k - 1, pos + 1
        n, pos = read_uvarint(buf, pos, 5)
        return n - 1, pos
    (n,) = fixed.unpack_from(buf, pos)
    return n, pos + fixed.size


def _array_len(buf, pos: int, flexible: bool, nullable: bool = False) -> tuple[int, int]:
    n, pos = _length(buf, pos, flexible)
    if n < 0 and not nullable:
        raise ValueError("null array where one is required")
    return n, pos


def _string(buf, pos: int, flexible: bool, *, nullable: bool = False,
            what: str = "topic name") -> tuple[str | None, int]:
    """A string field (``what`` names it in errors); None for a null one where it may be null
    (``nullable``). Also :mod:`.planning_protocol`'s."""
    n, pos = _length(buf, pos, flexible, _I16)
    if n < 0:
        if nullable:
            return None, pos
        raise ValueError(f"null {what}")
    if pos + n > len(buf):
        raise ValueError(f"{what} runs past the frame end")
    return str(buf[pos:pos + n], "utf-8"), pos + n
