"""Metadata and ListOffsets as :mod:`kafka_source.wire.net.planning_protocol` writes and reads
them, checked against kafka-python's own codec (generated from Kafka's message schemas) at every
version each side has: what we send decodes there to the same request, and what its encoder
makes of a broker's answer decodes here to the same fields. Then the requests go through a real
kafka-python connection's parser, as the client sends them."""

from __future__ import annotations

import struct
import uuid

import pytest
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from kafka_source.wire.net.planning_protocol import (LeanListOffsetsRequest, LeanMetadataRequest,
                                                    brokers_only)

pytestmark = pytest.mark.pyspark_free

METADATA_VERSIONS = range(4, 14)
LIST_OFFSETS_VERSIONS = range(1, 12)
UUID = "a1b2c3d4-0000-4000-8000-00000000abcd"


def _encoded(request, version, correlation_id=7, client_id="pykafka-test"):
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return request.encode(framed=True, header=True)


@pytest.mark.parametrize("version", METADATA_VERSIONS)
@pytest.mark.parametrize("topics", [None, [], ["orders", "payments-é"]])
def test_metadata_requests_decode_as_kafka_writes_them(version, topics):
    data = _encoded(LeanMetadataRequest(topics), version)
    assert struct.unpack(">i", data[:4])[0] == len(data) - 4
    theirs = MetadataRequest.decode(data[4:], version=version, header=True)
    header = theirs.header
    assert (header.request_api_key, header.request_api_version, header.correlation_id,
            header.client_id) == (3, version, 7, "pykafka-test")
    if topics is None:
        assert theirs.topics is None
    else:
        assert [t.name for t in theirs.topics] == topics
    assert theirs.allow_auto_topic_creation is False
    if version >= 8:
        assert theirs.include_topic_authorized_operations is False


def _only(version, **fields):
    """``fields`` less those the message has not at ``version``: kafka-python refuses them."""
    since = {"topic_id": (10, 99), "error_code": (13, 99), "leader_epoch": (7, 99),
             "offline_replicas": (5, 99)}
    return {name: value for name, value in fields.items()
            if since.get(name, (0, 99))[0] <= version <= since.get(name, (0, 99))[1]}


def _metadata_answer(version, *, topics=3, partitions=4):
    R = MetadataResponse
    T = R.MetadataResponseTopic
    P = T.MetadataResponsePartition
    return R(version=version, throttle_time_ms=5, cluster_id="cluster-1", controller_id=2,
             brokers=[R.MetadataResponseBroker(node_id=n, host=f"b{n}.example", port=9090 + n,
                                               rack="r1" if n == 1 else None)
                      for n in (1, 2, 3)],
             topics=[T(error_code=3 if t == 2 else 0, name=f"topic-{t}", is_internal=t == 1,
                       **_only(version, topic_id=UUID),
                       partitions=[] if t == 2 else [
                           P(error_code=5 if p == 3 else 0, partition_index=p,
                             leader_id=-1 if p == 3 else 1 + (p % 3),
                             replica_nodes=[1, 2, 3], isr_nodes=[1, 2][:p % 3],
                             **_only(version, leader_epoch=10 + p,
                                     offline_replicas=[3] if p == 3 else []))
                           for p in range(partitions)])
                     for t in range(topics)],
             **_only(version, error_code=0))


@pytest.mark.parametrize("version", METADATA_VERSIONS)
def test_metadata_answers_decode_to_kafkas_fields(version):
    theirs = _metadata_answer(version)
    ours = LeanMetadataRequest.decode_body(memoryview(theirs.encode(version=version)), version)
    assert ours.version == version and ours.throttle_time_ms == 5
    assert ours.brokers == [(1, "b1.example", 9091, "r1"), (2, "b2.example", 9092, None),
                            (3, "b3.example", 9093, None)]
    assert ours.brokers[0].node_id == 1 and ours.brokers[0].rack == "r1"
    assert ours.cluster_id == "cluster-1" and ours.controller_id == 2 and ours.error_code == 0
    assert [(t.name, t.error_code, t.is_internal) for t in ours.topics] == [
        ("topic-0", 0, False), ("topic-1", 0, True), ("topic-2", 3, False)]
    # the topic id (KIP-516) as its 16 bytes, from v10 on
    expected_id = uuid.UUID(UUID).bytes if version >= 10 else None
    assert [t.topic_id for t in ours.topics] == [expected_id] * 3
    for t_ours, t_theirs in zip(ours.topics, theirs.topics):
        assert [(p.partition_index, p.error_code, p.leader_id, p.leader_epoch)
                for p in t_ours.partitions] == [
            (p.partition_index, p.error_code, p.leader_id,
             p.leader_epoch if version >= 7 else -1) for p in t_theirs.partitions]


def test_a_topic_without_an_id_has_none():
    theirs = _metadata_answer(12)
    for topic in theirs.topics:
        topic.topic_id = uuid.UUID(int=0)          # Kafka's Uuid.ZERO_UUID
    ours = LeanMetadataRequest.decode_body(memoryview(theirs.encode(version=12)), 12)
    assert [t.topic_id for t in ours.topics] == [None] * 3


def test_metadata_v13_answer_keeps_its_top_level_error():
    theirs = _metadata_answer(13)
    theirs.error_code = 129            # REBOOTSTRAP_REQUIRED
    ours = LeanMetadataRequest.decode_body(memoryview(theirs.encode(version=13)), 13)
    assert ours.error_code == 129


def test_a_metadata_answer_at_scale_decodes_whole():
    theirs = _metadata_answer(12, topics=5, partitions=2000)
    ours = LeanMetadataRequest.decode_body(memoryview(theirs.encode(version=12)), 12)
    assert sum(len(t.partitions) for t in ours.topics) == 8000
    assert ours.topics[4].partitions[1999].partition_index == 1999


@pytest.mark.parametrize("version", [7, 12])
def test_a_metadata_answer_cut_short_or_too_long_is_refused(version):
    body = _metadata_answer(version).encode(version=version)
    for broken in (body[:-3], body + b"\x00"):
        with pytest.raises((ValueError, IndexError, struct.error)):
            LeanMetadataRequest.decode_body(memoryview(broken), version)


def test_kafka_pythons_cluster_takes_the_brokers_only():
    from kafka.cluster import ClusterMetadata

    answer = LeanMetadataRequest.decode_body(
        memoryview(_metadata_answer(12).encode(version=12)), 12)
    cluster = ClusterMetadata(bootstrap_servers="b1.example:9091")
    cluster.update_metadata(brokers_only(answer))
    assert sorted(b.node_id for b in cluster.brokers()) == [1, 2, 3]
    assert cluster.broker_metadata(2).host == "b2.example"
    assert cluster.controller.node_id == 2 and cluster.cluster_id == "cluster-1"
    # kafka-python's own response objects too (the client's tests script those)
    cluster.update_metadata(brokers_only(_metadata_answer(7)))
    assert sorted(b.node_id for b in cluster.brokers()) == [1, 2, 3]


@pytest.mark.parametrize("version", LIST_OFFSETS_VERSIONS)
@pytest.mark.parametrize("read_committed", [False, True])
def test_list_offsets_requests_decode_as_kafka_writes_them(version, read_committed):
    asked = {"orders": [(0, 7, -1), (5, -1, -2)], "payments": [(2, 3, 1_700_000_000_000)]}
    data = _encoded(LeanListOffsetsRequest(asked, read_committed=read_committed,
                                           timeout_ms=4321), version, correlation_id=99)
    theirs = ListOffsetsRequest.decode(data[4:], version=version, header=True)
    assert (theirs.header.request_api_key, theirs.header.request_api_version,
            theirs.header.correlation_id) == (2, version, 99)
    assert theirs.replica_id == -1
    if version >= 2:
        assert theirs.isolation_level == (1 if read_committed else 0)
    if version >= 10:
        assert theirs.timeout_ms == 4321
    got = {t.name: [(p.partition_index, p.current_leader_epoch if version >= 4 else None,
                     p.timestamp) for p in t.partitions] for t in theirs.topics}
    assert got == {name: [(p, e if version >= 4 else None, ts) for p, e, ts in parts]
                   for name, parts in asked.items()}


@pytest.mark.parametrize("version", LIST_OFFSETS_VERSIONS)
def test_list_offsets_answers_decode_to_kafkas_fields(version):
    R = ListOffsetsResponse
    T = R.ListOffsetsTopicResponse
    P = T.ListOffsetsPartitionResponse
    theirs = R(version=version, throttle_time_ms=9, topics=[
        T(name="orders", partitions=[P(partition_index=0, error_code=0, timestamp=-1,
                                       offset=1_234_567_890_123, leader_epoch=4),
                                     P(partition_index=5, error_code=74, timestamp=-1,
                                       offset=-1, leader_epoch=-1)]),
        T(name="payments", partitions=[P(partition_index=2, error_code=0,
                                         timestamp=1_700_000_000_000, offset=42,
                                         leader_epoch=0)])])
    ours = LeanListOffsetsRequest.decode_body(memoryview(theirs.encode(version=version)),
                                              version)
    assert ours.version == version and ours.throttle_time_ms == (9 if version >= 2 else 0)
    assert [(t.name, [(p.partition_index, p.error_code, p.timestamp, p.offset, p.leader_epoch)
                      for p in t.partitions]) for t in ours.topics] == [
        ("orders", [(0, 0, -1, 1_234_567_890_123, 4 if version >= 4 else -1),
                    (5, 74, -1, -1, -1)]),
        ("payments", [(2, 0, 1_700_000_000_000, 42, 0 if version >= 4 else -1)])]
    # What the client reads: the same fields, first in each row
    assert [[r[:5] for r in t.rows] for t in ours.topics] == [
        [(p.partition_index, p.error_code, p.timestamp, p.offset, p.leader_epoch)
         for p in t.partitions] for t in ours.topics]


# Names of 126 bytes and arrays of 126 entries are the longest with a one-byte compact length
# (the shared readers' and uvarint's fast path); one more takes two bytes (the general path).
BOUNDARY_NAMES = ["t", "é" * 63, "n" * 126, "n" * 127, "x" * 300, ""]
BOUNDARY_COUNTS = [0, 1, 126, 127, 300]


@pytest.mark.parametrize("version", [7, 9, 12])
def test_metadata_answers_decode_across_the_one_byte_length_boundary(version):
    R = MetadataResponse
    T = R.MetadataResponseTopic
    P = T.MetadataResponsePartition
    topics = [(name, count) for name in BOUNDARY_NAMES for count in BOUNDARY_COUNTS[:3]] + [
        ("c", count) for count in BOUNDARY_COUNTS[3:]]
    theirs = R(version=version, throttle_time_ms=0, cluster_id=None, controller_id=1,
               brokers=[R.MetadataResponseBroker(node_id=1, host="h", port=1, rack=None)],
               topics=[T(error_code=0, name=name, is_internal=False,
                         **_only(version, topic_id=UUID),
                         partitions=[P(error_code=0, partition_index=p, leader_id=1,
                                       replica_nodes=[1], isr_nodes=[1],
                                       **_only(version, leader_epoch=p, offline_replicas=[]))
                                     for p in range(count)])
                       for name, count in topics],
               **_only(version, error_code=0))
    ours = LeanMetadataRequest.decode_body(memoryview(theirs.encode(version=version)), version)
    assert [(t.name, len(t.partitions)) for t in ours.topics] == topics
    assert all(t.partitions[-1].partition_index == len(t.partitions) - 1
               for t in ours.topics if t.partitions)


@pytest.mark.parametrize("version", [5, 6, 9])
def test_list_offsets_cross_the_one_byte_length_boundary_both_ways(version):
    cases = [(name, 2) for name in BOUNDARY_NAMES] + [
        (f"c{count}", count) for count in BOUNDARY_COUNTS] + [("n" * 126, 126)]
    asked = {name: [(p, 0, -1) for p in range(count)] for name, count in cases}
    data = _encoded(LeanListOffsetsRequest(asked, read_committed=False, timeout_ms=1), version)
    theirs = ListOffsetsRequest.decode(data[4:], version=version, header=True)
    assert {t.name: len(t.partitions) for t in theirs.topics} == \
        {name: len(parts) for name, parts in asked.items()}
    R = ListOffsetsResponse
    T = R.ListOffsetsTopicResponse
    P = T.ListOffsetsPartitionResponse
    answer = R(version=version, throttle_time_ms=0, topics=[
        T(name=name, partitions=[P(partition_index=p, error_code=0, timestamp=-1, offset=p,
                                   leader_epoch=0) for p, _, _ in parts])
        for name, parts in asked.items()])
    ours = LeanListOffsetsRequest.decode_body(memoryview(answer.encode(version=version)),
                                              version)
    assert {t.name: [p.offset for p in t.partitions] for t in ours.topics} == \
        {name: [p for p, _, _ in parts] for name, parts in asked.items()}


def test_versions_outside_those_written_here_are_refused():
    request = LeanMetadataRequest(["t"])
    with pytest.raises(ValueError, match="v3 is not one pykafka writes"):
        request.API_VERSION = 3
    with pytest.raises(ValueError, match="v0 is not one pykafka writes"):
        LeanListOffsetsRequest({}, read_committed=False, timeout_ms=1).API_VERSION = 0


@pytest.mark.parametrize("header_tags", [b"\x00", b"\x01\x05\x02ab"])   # none; one of 2 bytes
@pytest.mark.parametrize("broker_max, expected", [(7, 7), (12, 12), (99, 13)])
def test_a_connection_sends_the_highest_version_both_sides_have(broker_max, expected,
                                                                header_tags):
    """Through kafka-python's own version choice and protocol parser, as a connection does:
    the version is the broker's highest up to ours, the bytes are the request's, and the answer
    read back by the parser (flexible header included) is this module's decoding."""
    from kafka.protocol.broker_version_data import BrokerVersionData
    from kafka.protocol.parser import KafkaProtocol

    versions = BrokerVersionData(api_versions={3: (0, broker_max), 2: (0, 9)})
    request = LeanMetadataRequest(["topic-0"])
    request.API_VERSION = versions.api_version(request)
    assert request.API_VERSION == expected
    protocol = KafkaProtocol(client_id="pykafka-test")
    correlation_id = protocol.send_request(request)
    sent = protocol.send_bytes()
    assert MetadataRequest.decode(sent[4:], version=expected, header=True).topics[0].name == \
        "topic-0"
    answer = _metadata_answer(expected)
    body = answer.encode(version=expected)
    header = struct.pack(">i", correlation_id) + (header_tags if expected >= 9 else b"")
    frame = struct.pack(">i", len(header) + len(body)) + header + body
    ((got_id, response),) = protocol.receive_bytes(frame)
    assert got_id == correlation_id
    assert [t.name for t in response.topics] == ["topic-0", "topic-1", "topic-2"]
    assert response.version == expected


def test_a_malformed_answer_is_a_protocol_error_of_the_parser():
    import kafka.errors as Errors
    from kafka.protocol.parser import KafkaProtocol

    protocol = KafkaProtocol(client_id="pykafka-test")
    request = LeanListOffsetsRequest({"t": [(0, -1, -1)]}, read_committed=False, timeout_ms=1)
    request.API_VERSION = 7
    correlation_id = protocol.send_request(request)
    body = b"\x00\x00\x00\x00\x02\x02t"       # throttle, one topic "t", then nothing
    header = struct.pack(">i", correlation_id) + b"\x00"
    with pytest.raises(Errors.KafkaProtocolError):
        protocol.receive_bytes(struct.pack(">i", len(header) + len(body)) + header + body)


def _flexible_offsets_answer(rows, tagged_at=(), cut=0, extra=b""):
    """A ListOffsets v9 answer written by hand: one topic 't', ``rows`` of (partition, error,
    timestamp, offset, epoch); the partitions at ``tagged_at`` carry an unknown tagged field."""
    body = struct.pack(">i", 0) + bytes([2]) + bytes([2]) + b"t" + bytes([len(rows) + 1])
    for i, row in enumerate(rows):
        body += struct.pack(">ihqqi", *row)
        body += b"\x01\x07\x03abc" if i in tagged_at else b"\x00"   # tag 7, 3 bytes
    body += b"\x00\x00" + extra                  # the topic's and the answer's tagged fields
    return memoryview(body[:len(body) - cut] if cut else body)


@pytest.mark.parametrize("tagged_at", [(), (0,), (1,), (2,), (0, 2)])
def test_list_offsets_answers_with_tagged_fields_on_partitions_decode_the_same(tagged_at):
    rows = [(0, 0, -1, 100, 3), (1, 0, -1, 200, 3), (2, 6, -1, -1, -1)]
    ours = LeanListOffsetsRequest.decode_body(_flexible_offsets_answer(rows, tagged_at), 9)
    assert [(p.partition_index, p.error_code, p.timestamp, p.offset, p.leader_epoch)
            for p in ours.topics[0].partitions] == rows


@pytest.mark.parametrize("broken", [dict(cut=1), dict(cut=20), dict(extra=b"\x00")])
def test_a_list_offsets_answer_cut_short_or_too_long_is_refused(broken):
    rows = [(p, 0, -1, 10 * p, 1) for p in range(50)]
    assert len(LeanListOffsetsRequest.decode_body(_flexible_offsets_answer(rows), 9)
               .topics[0].partitions) == 50
    with pytest.raises((ValueError, IndexError, struct.error)):
        LeanListOffsetsRequest.decode_body(_flexible_offsets_answer(rows, **broken), 9)
