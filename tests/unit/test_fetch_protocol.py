"""Fetch requests and responses on the wire, against kafka-python's own encoder and decoder.

Responses of every version this source speaks (4-12) are encoded by kafka-python from random
contents and parsed by :func:`kafka_source.wire.net.fetch_protocol.parse_fetch_response`: the fields
must come back equal and the records must be views into the frame, not copies. Requests encoded
here are decoded by kafka-python.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest

from kafka_source.wire.net.fetch_protocol import (MAX_FETCH_VERSION, MIN_FETCH_VERSION,
                                              FetchPartitionRequest, FetchProtocolError,
                                              encode_fetch_request, parse_fetch_response,
                                              records_sizes, response_header_size)

from .response_builder import encode_response

pytestmark = pytest.mark.pyspark_free

VERSIONS = range(MIN_FETCH_VERSION, MAX_FETCH_VERSION + 1)
def parse(frame: bytes, version: int):
    view = memoryview(frame)[4:]          # after the size
    return parse_fetch_response(view[response_header_size(version, view):], version), view


partition_data = st.fixed_dictionaries({
    "error": st.sampled_from([0, 0, 0, 1, 6, 3]),
    "hw": st.integers(-1, 1 << 62),
    "lso": st.integers(-1, 1 << 62),
    "start": st.integers(-1, 1 << 62),
    "aborted": st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 1 << 62),
                                                       st.integers(0, 1 << 62)), max_size=3)),
    "records": st.one_of(st.none(), st.binary(max_size=300)),
})
topic_names = st.text(st.characters(min_codepoint=33, max_codepoint=0x4FF), min_size=1,
                      max_size=20)


@settings(max_examples=200, deadline=None)
@given(version=st.sampled_from(VERSIONS),
       topics=st.dictionaries(topic_names, st.dictionaries(st.integers(0, 1 << 20),
                                                           partition_data, max_size=4),
                              max_size=3),
       error_code=st.sampled_from([0, 70, 71]), session_id=st.integers(0, (1 << 31) - 1),
       leader_tags=st.booleans())
def test_parses_what_kafka_python_encodes(version, topics, error_code, session_id, leader_tags):
    frame = encode_response(version, topics=topics, error_code=error_code,
                            session_id=session_id, leader_tags=leader_tags and version >= 12)
    result, view = parse(frame, version)
    sessions = version >= 7
    assert result.error_code == (error_code if sessions else 0)
    assert result.session_id == (session_id if sessions else 0)
    want = {(t, p): d for t, parts in topics.items() for p, d in parts.items()}
    assert set(result.partitions) == set(want)
    for tp, d in want.items():
        got = result.partitions[tp]
        assert (got.error_code, got.high_watermark, got.last_stable_offset) == \
            (d["error"], d["hw"], d["lso"])
        assert got.log_start_offset == (d["start"] if version >= 5 else -1)
        assert got.aborted == [tuple(a) for a in d["aborted"] or ()]
        assert bytes(got.records) == (d["records"] or b"")
        assert got.records.obj is view.obj         # a view into the frame, not a copy


def test_records_are_views_into_the_receive_buffer():
    frame = bytearray(encode_response(12, topics={"t": {0: dict(
        error=0, hw=10, lso=10, start=0, aborted=None, records=b"abcdef")}}))
    result, _ = parse(frame, 12)
    at = frame.index(b"abcdef")
    frame[at:at + 6] = b"UVWXYZ"                # the records change with the buffer
    assert bytes(result.partitions[("t", 0)].records) == b"UVWXYZ"


@pytest.mark.parametrize("version", VERSIONS)
def test_truncated_or_padded_frames_are_protocol_errors(version):
    frame = encode_response(version, topics={"t": {0: dict(
        error=0, hw=1, lso=1, start=0, aborted=[(1, 2)], records=b"x" * 50)}})
    body_start = 4 + response_header_size(version, memoryview(frame)[4:])
    for cut in (1, 10, 30, len(frame) - body_start - 1):
        with pytest.raises(FetchProtocolError, match=f"Fetch v{version}"):
            parse_fetch_response(memoryview(frame)[body_start:len(frame) - cut], version)
    with pytest.raises(FetchProtocolError, match="unexpected bytes"):
        parse_fetch_response(memoryview(frame + b"\0")[body_start:], version)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_start_of_a_response_too_large_to_receive_names_its_records_sizes(version):
    frame = encode_response(version, topics={"a": {0: dict(
        error=0, hw=1, lso=1, start=0, aborted=[(1, 2)], records=None)}, "b": {3: dict(
            error=0, hw=1, lso=1, start=0, aborted=None, records=b"x" * 100_000)}})
    view = memoryview(frame)[4:]
    body = view[response_header_size(version, view):]
    # The partition headers are there, the records of the last run past the bytes read.
    assert records_sizes(body[:200], version) == {("a", 0): -1, ("b", 3): 100_000}
    assert records_sizes(body[:12], version) == {}       # not even the first header
    assert records_sizes(body, version) == {("a", 0): -1, ("b", 3): 100_000}


@pytest.mark.parametrize("version", VERSIONS)
def test_requests_decode_with_kafka_python(version):
    data = encode_fetch_request(
        version=version, correlation_id=42, client_id="pk",
        partitions={("a", 0): FetchPartitionRequest(5, 1000),
                    ("a", 3): FetchPartitionRequest(9, 2000),
                    ("b", 1): FetchPartitionRequest(0, 3000)},
        forgotten=[("c", 2), ("c", 4)], session_id=123, session_epoch=4, max_wait_ms=250,
        min_bytes=1, max_bytes=10_000, read_committed=True)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    request = FetchRequest.decode(memoryview(data)[4:], version=version, header=True)
    assert request.header.correlation_id == 42 and request.header.client_id == "pk"
    assert (request.max_wait_ms, request.min_bytes, request.max_bytes,
            request.isolation_level) == (250, 1, 10_000, 1)
    got = {(t.topic, p.partition): (p.fetch_offset, p.partition_max_bytes)
           for t in request.topics for p in t.partitions}
    assert got == {("a", 0): (5, 1000), ("a", 3): (9, 2000), ("b", 1): (0, 3000)}
    if version >= 7:
        assert (request.session_id, request.session_epoch) == (123, 4)
        assert {(t.topic, p) for t in request.forgotten_topics_data for p in t.partitions} == \
            {("c", 2), ("c", 4)}
