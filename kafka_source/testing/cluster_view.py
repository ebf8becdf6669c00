"""A test cluster's generations, its error, and the cluster as one node sees it.

:class:`~.cluster.KafkaCluster` reads the cluster's state with small Metadata (v7) and
FindCoordinator (v2) requests sent straight to one node's socket on a fresh connection, with
kafka-python's protocol classes and no client behaviour in between: the harness must be able to
ask *a given node* what it believes (a ZooKeeper-mode broker that has just started believes
less than the others), and must not depend on the connector under test. Both versions are
understood by Kafka 2.2 and 4.0 alike.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from itertools import count
from typing import Iterable

from .brokers import BrokerStartError

__all__ = ["ClusterError", "ClusterMetadata", "KRAFT", "PartitionState", "ZOOKEEPER",
           "fetch_metadata", "find_coordinator", "parse_metadata"]

KRAFT = "kraft"
ZOOKEEPER = "zookeeper"


class ClusterError(BrokerStartError):
    """A cluster operation or wait did not complete; the message has the node logs' tails."""


@dataclass(frozen=True)
class PartitionState:
    leader: int                 # -1: no leader
    replicas: tuple[int, ...]   # in preference order: replicas[0] is the preferred leader
    isr: tuple[int, ...]
    error_code: int = 0


@dataclass(frozen=True)
class ClusterMetadata:
    """What one node answered to Metadata (v7: understood by Kafka 2.2 and 4.0 alike)."""

    node_id: int                                   # the node that answered
    brokers: frozenset[int]
    controller_id: int
    topics: dict[str, dict[int, PartitionState]]   # topics answered without error
    topic_errors: dict[str, int] = field(default_factory=dict)

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        return self.topics.get(topic, {}).get(partition)


_correlation = count(1)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def _roundtrip(address: str, request, response_class, version: int, timeout_s: float = 5.0):
    """Send one request to ``address`` on a fresh connection and decode its answer."""
    host, _, port = address.rpartition(":")
    correlation_id = next(_correlation) & 0x7FFFFFFF
    request.with_header(correlation_id=correlation_id, client_id="pykafka-cluster-harness")
    payload = request.encode(version=version, header=True, framed=True)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(payload)
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        body = _recv_exactly(sock, size)
    response = response_class.decode(body, version=version, header=True)
    if response.header.correlation_id != correlation_id:
        raise ConnectionError(f"correlation id {response.header.correlation_id} from {address}, "
                              f"expected {correlation_id}")
    return response


def fetch_metadata(address: str, node_id: int, topics: Iterable[str] | None = None,
                   timeout_s: float = 5.0) -> ClusterMetadata:
    """Metadata v7 from the node at ``address`` (all topics unless ``topics``)."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    names = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t)
                                         for t in topics]
    response = _roundtrip(address, MetadataRequest(topics=names, allow_auto_topic_creation=False),
                          MetadataResponse, 7, timeout_s)
    return parse_metadata(response, node_id)


def parse_metadata(response, node_id: int) -> ClusterMetadata:
    topics: dict[str, dict[int, PartitionState]] = {}
    errors: dict[str, int] = {}
    for t in response.topics:
        if t.error_code:
            errors[t.name] = t.error_code
            continue
        topics[t.name] = {p.partition_index: PartitionState(
            p.leader_id, tuple(p.replica_nodes), tuple(p.isr_nodes), p.error_code)
            for p in t.partitions}
    return ClusterMetadata(node_id, frozenset(b.node_id for b in response.brokers),
                           response.controller_id, topics, errors)


def find_coordinator(address: str, group_id: str, timeout_s: float = 5.0) -> tuple[int, int]:
    """(error code, coordinator node id) of ``group_id`` asked of the node at ``address``
    (FindCoordinator v2: Kafka 2.2's newest, still served by 4.0)."""
    from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

    response = _roundtrip(address, FindCoordinatorRequest(key=group_id, key_type=0),
                          FindCoordinatorResponse, 2, timeout_s)
    return response.error_code, response.node_id
