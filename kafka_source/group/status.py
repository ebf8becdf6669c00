"""A consumer group as Kafka's tools see it: members, their partitions, committed offsets, lag.

What ``kafka-consumer-groups.sh --describe --group G`` prints, from Python and without a Kafka
distribution, for notebooks, the demo and tests::

    from kafka_source import describe_group

    status = describe_group({"kafka.bootstrap.servers": "broker:9092"}, "clicks-to-lake")
    status.total_lag
    pandas.DataFrame(status.rows())   # topic, partition, committed, end, lag, member, client,
                                      # instance (group.instance.id of static members)

The options are the query's own Spark options (``kafka.*`` security settings included), or just
the bootstrap servers. Nothing here reads the connector's state: the answer comes from the
brokers, so it shows what any other Kafka tool would show, and it serves as an independent check
of what a streaming query committed.

* Committed offsets (OffsetFetch of all the group's partitions at its coordinator) and log end
  offsets (ListOffsets, latest) are the requests Kafka's own tool sends; lag is end minus
  committed, unknown (None) for a partition the group never committed.
* Members and their assignments come from DescribeGroups, sent without authorized operations:
  kafka-python 3.0's ``describe_groups`` always asks for them and fails on operation codes it
  does not know (the embedded Tansu broker sends some). The assignments are decoded as Kafka's
  ConsumerProtocol (:class:`~kafka_source.group.assignors.Assignment`), so plain Java or Python
  consumers in the group show up as well. Static members (KIP-345: a query with
  ``kafka.group.instance.id``, a consumer with ``group.instance.id``) show their instance id
  (DescribeGroups v4+, Kafka 2.3+), as ``kafka-consumer-groups.sh --describe --members`` does.
* A group of the consumer protocol (KIP-848, ``kafka.group.protocol=consumer``; Kafka 4.0+),
  which DescribeGroups does not describe, comes from ConsumerGroupDescribe: its state, the
  brokers' assignor and each member's current assignment (``GroupStatus.protocol`` says which).
* Every request goes through the connector's :class:`~kafka_source.wire.net.client.BrokerClient`, so
  TLS and SASL work exactly as in a query (trust and key stores, secrets never shown) and
  transient errors are retried within ``kafka.request.timeout.ms``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Mapping

import kafka.errors as Errors

from ..errors import KafkaSourceError
from .assignors import Assignment, TopicPartition

__all__ = ["GroupStatus", "MemberStatus", "PartitionStatus", "describe_group"]


@dataclass(frozen=True)
class MemberStatus:
    """One member of the group: its id, client id, host and the partitions it owns."""

    member_id: str
    client_id: str
    host: str
    partitions: tuple[TopicPartition, ...]
    instance_id: str | None = None   # group.instance.id of a static member; None: dynamic


@dataclass(frozen=True)
class PartitionStatus:
    """One partition the group reads: its committed offset, log end, lag and owner."""

    topic: str
    partition: int
    committed: int | None     # the group's committed offset; None: never committed
    end: int                  # the log end offset (next offset to be written)
    member_id: str | None     # the member the partition is assigned to, if any

    @property
    def lag(self) -> int | None:
        return None if self.committed is None else max(0, self.end - self.committed)


@dataclass(frozen=True)
class GroupStatus:
    """A consumer group as the brokers report it (:func:`describe_group`): what
    ``kafka-consumer-groups.sh --describe`` shows, for pykafka queries, Java and Python
    consumers alike."""

    group_id: str
    state: str                # Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    assignor: str             # the protocol (assignor) the group agreed on; "" when empty
    members: tuple[MemberStatus, ...]
    partitions: tuple[PartitionStatus, ...]
    # 'classic' (JoinGroup/SyncGroup; also a group that does not exist) or 'consumer' (the
    # consumer group protocol, KIP-848: kafka.group.protocol=consumer, group.protocol=consumer)
    protocol: str = "classic"

    @property
    def total_lag(self) -> int | None:
        """The sum of the known lags; None while the group has committed nothing."""
        known = [p.lag for p in self.partitions if p.lag is not None]
        return sum(known) if known else None

    @property
    def committed(self) -> dict[TopicPartition, int]:
        return {(p.topic, p.partition): p.committed for p in self.partitions
                if p.committed is not None}

    def assignment(self) -> dict[str, tuple[TopicPartition, ...]]:
        """member id -> its partitions."""
        return {m.member_id: m.partitions for m in self.members}

    def rows(self) -> list[dict]:
        """One dict per partition, the columns of ``kafka-consumer-groups.sh --describe``, and
        the member's instance id (``instance``; None for a dynamic member or no member)."""
        members = {m.member_id: m for m in self.members}
        rows = []
        for p in self.partitions:
            member = members.get(p.member_id)
            rows.append({"topic": p.topic, "partition": p.partition, "committed": p.committed,
                         "end": p.end, "lag": p.lag, "member": p.member_id,
                         "client": member.client_id if member else None,
                         "instance": member.instance_id if member else None})
        return rows


def describe_group(options: Mapping[str, str] | str, group_id: str,
                   topics: Iterable[str] | None = None) -> GroupStatus:
    """The group's state, members, committed offsets and lag, as the brokers report them.

    ``options``: the Spark options of the query (``kafka.bootstrap.servers`` and any
    ``kafka.*`` connection and security settings), or a bootstrap servers string. Partitions
    reported: those the group committed or a member is assigned, plus every partition of
    ``topics`` when given (so that lag shows before the first commit).
    """
    from ..config.client_config import client_config_from_options
    from ..config.options import _lower_keys
    from ..wire.net.client import LATEST_TIMESTAMP, BrokerClient, Retries, readable_topic

    if isinstance(options, str):
        options = {"kafka.bootstrap.servers": options}
    config = client_config_from_options(_lower_keys(options))
    with BrokerClient(config) as client:
        retries = Retries(window_ms=client.request_timeout_ms)
        node, (state, assignor, members) = _describe(client, group_id)
        protocol = "classic"
        if state == "Dead" and not members:
            # Kafka 4 answers DescribeGroups for a group of the consumer protocol (KIP-848)
            # with GROUP_ID_NOT_FOUND ("not a classic group"): ConsumerGroupDescribe has it.
            described = _describe_consumer_group(client, node, group_id)
            if described is not None:
                (state, assignor, members), protocol = described, "consumer"
        partitions: set[TopicPartition] = set()
        wanted = list(topics or ())
        if wanted:
            infos = client.topic_metadata(wanted, retries)
            for topic in wanted:
                info = readable_topic(topic, infos.get(topic), client.bootstrap_servers)
                partitions.update((topic, p) for p in info.partitions)
        committed = _committed(client, node, group_id)
        partitions.update(committed)
        for member in members:
            partitions.update(member.partitions)
        ends = {tp: offset for tp, (offset, _) in client.list_offsets(
            {tp: LATEST_TIMESTAMP for tp in partitions}, read_committed=False,
            retries=retries).items()} if partitions else {}
    owner = {tp: m.member_id for m in members for tp in m.partitions}
    return GroupStatus(group_id, state, assignor, tuple(members), tuple(
        PartitionStatus(t, p, committed.get((t, p)), ends[(t, p)], owner.get((t, p)))
        for t, p in sorted(partitions)), protocol)


def _describe(client, group_id: str) -> tuple[object, tuple[str, str, list[MemberStatus]]]:
    """The group coordinator's node, and (state, assignor, members) from DescribeGroups there,
    retried (within ``kafka.request.timeout.ms``) while the coordinator is unknown, loading or
    moving: a fresh cluster answers CoordinatorNotAvailable until its offsets topic exists."""
    from kafka.protocol.admin import DescribeGroupsRequest

    from ..wire.net.client import RetriableBrokerError

    retriable = (Errors.CoordinatorLoadInProgressError, Errors.CoordinatorNotAvailableError,
                 Errors.NotCoordinatorError)
    deadline = time.monotonic() + client.request_timeout_ms / 1000
    while True:
        try:
            node = client.find_coordinator(group_id)
            response = client.send(node, DescribeGroupsRequest(
                groups=[group_id], include_authorized_operations=False))
            group = response.groups[0]
            err = Errors.for_code(group.error_code)
            if err in retriable:
                raise RetriableBrokerError(f"DescribeGroups: {err.__name__}")
            break
        except RetriableBrokerError as exc:
            if time.monotonic() >= deadline:
                raise KafkaSourceError(
                    f"Could not describe consumer group '{group_id}' within "
                    f"{client.request_timeout_ms} ms (kafka.request.timeout.ms): {exc}") from exc
            time.sleep(0.2)
    if err is Errors.GroupIdNotFoundError:  # Kafka 4's coordinator; older ones answer "Dead"
        return node, ("Dead", "", [])
    if err is not Errors.NoError:
        raise KafkaSourceError(f"DescribeGroups for consumer group '{group_id}' failed: "
                               f"{err.__name__} ({getattr(err, 'description', '')}).")
    members = []
    for m in group.members:
        assignment = (Assignment.decode(bytes(m.member_assignment or b""))
                      if group.protocol_type in ("consumer", "") else Assignment(()))
        members.append(MemberStatus(m.member_id, m.client_id, m.client_host,
                                    assignment.partitions,
                                    getattr(m, "group_instance_id", None) or None))
    members.sort(key=lambda m: (m.client_id, m.member_id))
    return node, (group.group_state, group.protocol_data or "", members)


def _describe_consumer_group(client, node, group_id: str):
    """(state, assignor, members) of a consumer-protocol group from ConsumerGroupDescribe, or
    None: no such group, or a broker without the API (before Kafka 4.0). One group per request
    (Kafka 4.0 repeats entries when asked for several)."""
    from ..wire.net.group_protocol import ConsumerGroupDescribeRequest

    from ..wire.net.client import RetriableBrokerError

    try:
        response = client.send(node, ConsumerGroupDescribeRequest(
            group_ids=[group_id], include_authorized_operations=False))
    except (Errors.IncompatibleBrokerVersion, RetriableBrokerError):
        return None          # no such API (or no answer): the DescribeGroups answer stands
    group = next((g for g in response.groups if g.group_id == group_id), None)
    if group is None:
        return None
    err = Errors.for_code(group.error_code)
    if err is Errors.GroupAuthorizationFailedError:
        raise KafkaSourceError(f"ConsumerGroupDescribe for consumer group '{group_id}' failed: "
                               f"{err.__name__} ({group.error_message or ''}): grant DESCRIBE "
                               "on the group.")
    if err is not Errors.NoError:   # GROUP_ID_NOT_FOUND: no group of this protocol either
        return None
    members = [MemberStatus(m.member_id, m.client_id, m.client_host,
                            tuple(sorted((tp.topic_name, p)
                                         for tp in m.assignment.topic_partitions
                                         for p in tp.partitions)),
                            m.instance_id or None)
               for m in group.members]
    members.sort(key=lambda m: (m.client_id, m.member_id))
    return group.group_state, group.assignor_name or "", members


def _committed(client, node, group_id: str) -> dict[TopicPartition, int]:
    """All of the group's committed offsets (OffsetFetch v2+ without topics: every partition)."""
    err, found = client.group_offsets(node, group_id, require_stable=False)
    if err is Errors.GroupIdNotFoundError:
        return {}
    if err is not Errors.NoError:
        raise KafkaSourceError(f"OffsetFetch for consumer group '{group_id}' failed: "
                               f"{err.__name__} ({getattr(err, 'description', '')}).")
    return {tp: offset for tp, (offset, _) in found.items()}


