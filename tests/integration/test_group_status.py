"""kafka_source.describe_group against a broker: a plain kafka-python consumer commits known
offsets, and the group view must show them, the log ends, the lag and the member. On a local
Apache Kafka the view is also compared with Kafka's own ``kafka-consumer-groups.sh --describe``.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from kafka_source import describe_group
from kafka_source.testing import create_topic, unique_topic_name

from .plain_consumer import group_consumer
from .test_stream import group_timeouts, produce_counts, wait_until  # noqa: F401 (fixture)


@pytest.fixture
def committed_group(bootstrap_servers, group_timeouts):
    """(topic, group, consumer): 10 records in each of 3 partitions; a subscribed consumer
    holding all of them has committed 10 on partition 0, 4 on partition 1, nothing on 2."""
    topic, group = unique_topic_name("status"), unique_topic_name("g-status")
    create_topic(bootstrap_servers, topic, partitions=3)
    produce_counts(bootstrap_servers, topic, {0: 10, 1: 10, 2: 10})
    session, heartbeat = group_timeouts
    consumer = group_consumer(topic, bootstrap_servers=bootstrap_servers, group_id=group,
                              client_id="status-probe", enable_auto_commit=False,
                              session_timeout_ms=session, heartbeat_interval_ms=heartbeat,
                              max_poll_interval_ms=60_000)
    try:
        # Long polls: the embedded broker holds a JoinGroup for about half the session, and a
        # poll that ends in the middle of a join costs a rejoin (see group_consumer).
        wait_until(lambda: consumer.poll(5_000) is not None and len(consumer.assignment()) == 3,
                   60, "the consumer's assignment")
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(10, "", -1),
                         TopicPartition(topic, 1): OffsetAndMetadata(4, "", -1)})
        yield topic, group, consumer
    finally:
        consumer.close(autocommit=False)


def test_describe_group_shows_commits_ends_lag_and_members(committed_group, bootstrap_servers,
                                                           kafka_broker):
    topic, group, _ = committed_group
    status = describe_group({"kafka.bootstrap.servers": bootstrap_servers}, group, [topic])

    assert [(p.partition, p.committed, p.end, p.lag) for p in status.partitions] == [
        (0, 10, 10, 0), (1, 4, 10, 6), (2, None, 10, None)]
    assert status.total_lag == 6
    assert status.committed == {(topic, 0): 10, (topic, 1): 4}
    assert status.state == "Stable" and len(status.members) == 1
    if not kafka_broker.is_tansu:  # Tansu describes members without client id or assignment
        (member,) = status.members
        assert member.client_id == "status-probe" and status.assignor == "range"
        assert member.partitions == ((topic, 0), (topic, 1), (topic, 2))
        assert {p.member_id for p in status.partitions} == {member.member_id}


def test_without_topics_only_committed_and_assigned_partitions_show(committed_group,
                                                                     bootstrap_servers,
                                                                     kafka_broker):
    topic, group, _ = committed_group
    status = describe_group(bootstrap_servers, group)
    shown = {p.partition for p in status.partitions}
    assert shown == ({0, 1} if kafka_broker.is_tansu else {0, 1, 2})


def test_a_group_that_never_existed(bootstrap_servers):
    topic = unique_topic_name("status-none")
    create_topic(bootstrap_servers, topic, partitions=2)
    status = describe_group(bootstrap_servers, unique_topic_name("g-none"), [topic])
    assert status.members == () and status.committed == {} and status.total_lag is None
    assert status.state in ("Dead", "Empty")


def test_matches_kafka_consumer_groups_describe(committed_group, bootstrap_servers,
                                                kafka_broker):
    if kafka_broker.kind not in ("local-kafka", "local-kafka-zk"):
        pytest.skip("needs Kafka's kafka-consumer-groups.sh: runs where the broker is a local "
                    "Kafka distribution (KAFKA_HOME, KAFKA_ZK_HOME)")
    topic, group, _ = committed_group
    tool = os.path.join(kafka_broker.kafka_home, "bin", "kafka-consumer-groups.sh")
    out = subprocess.run([tool, "--bootstrap-server", bootstrap_servers, "--describe",
                          "--group", group], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    header, *lines = [line.split() for line in out.splitlines() if line.strip()]
    rows = [dict(zip(header, line)) for line in lines if len(line) == len(header)]
    # Kafka 2.4+ starts each row with a GROUP column; older tools print TOPIC first.
    rows = [r for r in rows if r["TOPIC"] == topic and r.get("GROUP", group) == group]
    theirs = {int(r["PARTITION"]): (r["CURRENT-OFFSET"], r["LOG-END-OFFSET"], r["LAG"],
                                    r["CONSUMER-ID"], r["CLIENT-ID"]) for r in rows}

    status = describe_group(bootstrap_servers, group, [topic])
    clients = {m.member_id: m.client_id for m in status.members}
    ours = {p.partition: ("-" if p.committed is None else str(p.committed), str(p.end),
                          "-" if p.lag is None else str(p.lag), p.member_id,
                          clients[p.member_id]) for p in status.partitions}
    assert ours == theirs
