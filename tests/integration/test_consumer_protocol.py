"""The consumer group protocol (KIP-848), ``kafka.group.protocol=consumer``, on a real broker,
through Spark (:mod:`kafka_source.group.consumer_protocol`).

On Kafka 4.0+: a query alone in its group reads every record once and its commits are what the
brokers report for the group (``describe_group``, which describes it with ConsumerGroupDescribe);
a query and Kafka's Java console consumer with ``group.protocol=consumer`` share a group -- the
brokers split the partitions between them incrementally (the query gives up half of them, after
committing) -- with nothing read twice or lost, and the group's committed offsets never moving
backwards; a query and Java's console consumer on the *classic* protocol share a group of the
consumer protocol too (a mixed group, which Kafka 4.0 allows: the brokers assign for both), and
when the classic member leaves the query gets every partition back. On a broker without the
protocol (Kafka 2.2) the query fails at start, naming the option and saying to use 'classic'.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from kafka_source import describe_group
from kafka_source.testing import create_topic, unique_topic_name
from kafka_source.wire.net.client import RetriableBrokerError

from cluster.scenario import CommitWatch  # tests/ is on sys.path (rootdir of both packages)
from .java_consumer import JavaConsumer, kafka_home
from .test_stream import expected_rows, produce_counts, sink_rows, start_stream, wait_until

KIP_848 = "KIP-848 consumer group protocol (ConsumerGroupHeartbeat)"
EMBEDDED = "the embedded Tansu broker has no consumer group protocol (ConsumerGroupHeartbeat)"


def consumer_options(bootstrap, topic, group, **extra):
    """A stream in ``group`` with the consumer protocol: no session timeout, heartbeat interval
    or assignor of its own (the brokers' settings apply)."""
    return {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "kafka.group.id": group,
            "kafka.group.protocol": "consumer", "kafka.max.poll.interval.ms": "30000",
            "startingOffsets": "earliest", **{k: str(v) for k, v in extra.items()}}


def start_commit_watch(bootstrap, group, topic):
    """The cluster scenarios' watcher of the group's committed offsets, sampling every 100 ms."""
    watch = CommitWatch(bootstrap, group, topic, interval_s=0.1)
    watch.start()
    return watch


def kafka_consumer_groups(kafka_broker, bootstrap, group, topic):
    """partition -> (CURRENT-OFFSET, LOG-END-OFFSET, CONSUMER-ID) from Kafka's
    ``kafka-consumer-groups.sh --describe``."""
    tool = os.path.join(kafka_broker.kafka_home, "bin", "kafka-consumer-groups.sh")
    out = subprocess.run([tool, "--bootstrap-server", bootstrap, "--describe", "--group", group],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    header, *lines = [line.split() for line in out.splitlines() if line.strip()]
    rows = [dict(zip(header, line)) for line in lines if len(line) == len(header)]
    return {int(r["PARTITION"]): (r["CURRENT-OFFSET"], r["LOG-END-OFFSET"], r["CONSUMER-ID"])
            for r in rows if r["TOPIC"] == topic and r.get("GROUP", group) == group}


def status_now(bootstrap, group):
    try:
        return describe_group(bootstrap, group)
    except RetriableBrokerError:
        return None


@pytest.mark.skip_on_embedded(EMBEDDED)
@pytest.mark.requires_broker((4, 0), KIP_848)
def test_a_query_alone_reads_once_and_commits(spark, bootstrap_servers, kafka_broker,
                                              tmp_path):
    topic = unique_topic_name("cgp-alone")
    create_topic(bootstrap_servers, topic, partitions=3)
    group = unique_topic_name("g-cgp-alone")
    counts = {p: 10 for p in range(3)}
    produce_counts(bootstrap_servers, topic, counts)
    out = str(tmp_path / "out")
    watcher = start_commit_watch(bootstrap_servers, group, topic)
    query = start_stream(spark, consumer_options(bootstrap_servers, topic, group,
                                                 **{"kafka.group.remote.assignor": "range"}),
                         str(tmp_path / "ck"), out)
    try:
        wait_until(lambda: len(sink_rows(spark, out)) >= 30, 90, "the first 30 records")
        produce_counts(bootstrap_servers, topic, counts, start=counts)
        wait_until(lambda: len(sink_rows(spark, out)) >= 60, 90, "all 60 records")
        # Committed at the trigger after each batch: every partition at 20.
        status = wait_until(lambda: (lambda s: s if s is not None and s.committed == {
            (topic, p): 20 for p in range(3)} else None)(status_now(bootstrap_servers, group)),
            60, "the group's commits of all 60 records")
        assert status.protocol == "consumer", status
        assert (status.state, status.assignor) == ("Stable", "range"), status
        assert [m.partitions for m in status.members] == [tuple((topic, p) for p in range(3))]
        assert query.isActive and query.exception() is None
        assert sorted(sink_rows(spark, out)) == expected_rows({p: 20 for p in range(3)})
        if kafka_broker.kind == "local-kafka":
            # Kafka's own tool (Admin.describeConsumerGroups) sees the same group.
            assert kafka_consumer_groups(kafka_broker, bootstrap_servers, group, topic) == {
                p.partition: (str(p.committed), str(p.end), p.member_id)
                for p in describe_group(bootstrap_servers, group, [topic]).partitions}
    finally:
        query.stop()
        watcher.stop()
    print(f"\nconsumer protocol, query alone: {len(sink_rows(spark, out))} records read, 60 "
          f"expected, each once; {watcher.polls} samples of the group's commits, "
          f"{len(watcher.backwards)} moved backwards")
    assert watcher.polls > 0 and watcher.backwards == []
    # The query left the group when it stopped (epoch -1): no member is left.
    status = wait_until(lambda: (lambda s: s if s is not None and not s.members else None)(
        status_now(bootstrap_servers, group)), 30, "the query to leave the group")
    assert status.state == "Empty", status


def query_alone(spark, bootstrap, tmp_path, name):
    """A topic of four partitions with 10 records each, and a consumer-protocol query alone in
    its group that has read and committed all 40: (topic, group, sink path, commit watch,
    query)."""
    topic = unique_topic_name(name)
    create_topic(bootstrap, topic, partitions=4)
    group = unique_topic_name(f"g-{name}")
    out = str(tmp_path / "out")
    produce_counts(bootstrap, topic, {p: 10 for p in range(4)})
    watcher = start_commit_watch(bootstrap, group, topic)
    query = start_stream(spark, consumer_options(bootstrap, topic, group), str(tmp_path / "ck"),
                         out)
    try:
        wait_until(lambda: len(sink_rows(spark, out)) >= 40, 90, "the query's first 40 records")
        wait_until(lambda: watcher.last == {p: 10 for p in range(4)}, 60,
                   "the query's commits of the first 40 records")
    except BaseException:
        query.stop()
        watcher.stop()
        raise
    return topic, group, out, watcher, query


def split_two_and_two(bootstrap, group, java):
    """The group's description once it has two members with two partitions each."""
    return wait_until(
        lambda: (lambda s: s if s is not None and len(s.members) == 2
                 and sorted(len(m.partitions) for m in s.members) == [2, 2] else None)(
            status_now(bootstrap, group)),
        90, f"two members with two partitions each ({java.stderr()})")


def stop_all(query, java, watcher):
    query.stop()
    if java is not None:
        java.close()
    watcher.stop()


def assert_commits_never_moved_back(watcher):
    print(f"{watcher.polls} samples of the group's commits, {len(watcher.backwards)} moved "
          f"backwards")
    assert watcher.polls > 0 and watcher.backwards == []


def java_rows(java):
    """(partition, offset, value) of what the Java consumer printed (values ``p{p}-{offset}``)."""
    return [(int(v[1:v.index("-")]), int(v[v.index("-") + 1:]), v) for v in java.values()]


@pytest.mark.once      # a JVM consumer and an incremental rebalance: about half a minute
@pytest.mark.skip_on_embedded(EMBEDDED)
@pytest.mark.requires_broker((4, 0), KIP_848)
def test_a_query_and_a_java_consumer_share_a_group_with_the_consumer_protocol(
        spark, bootstrap_servers, tmp_path):
    kafka_home()
    # The query alone: all four partitions, the first 40 records read and committed.
    topic, group, out, watcher, query = query_alone(spark, bootstrap_servers, tmp_path,
                                                    "cgp-java")
    first = {p: 10 for p in range(4)}
    java = None
    try:
        java = JavaConsumer(bootstrap_servers, topic, group,
                            **{"group.protocol": "consumer"})
        # The brokers move two partitions to the Java consumer once the query gave them up.
        status = split_two_and_two(bootstrap_servers, group, java)
        assert status.protocol == "consumer", status
        java_parts = sorted(p for m in status.members if m.client_id.startswith("java-consumer")
                            for _, p in m.partitions)
        assert len(java_parts) == 2, status

        second = {p: 10 for p in range(4)}
        produce_counts(bootstrap_servers, topic, second, start=first)
        wait_until(lambda: len(java.values()) + len(sink_rows(spark, out)) >= 80, 90,
                   f"all 80 records read by the two members ({java.stderr()})")
        time.sleep(1)                         # anything read twice would show up by now
        query_rows, java_read = sink_rows(spark, out), java_rows(java)
        # The Java consumer started at the query's commits: it read only the second half of
        # its partitions, the query everything else.
        assert sorted({p for p, _, _ in java_read}) == java_parts
        assert all(offset >= 10 for _, offset, _ in java_read)
        assert sorted(query_rows + java_read) == expected_rows({p: 20 for p in range(4)})
        assert query.isActive and query.exception() is None
        wait_until(lambda: watcher.last == {p: 20 for p in range(4)}, 60,
                   "both members' commits of all 80 records")
        print(f"\nconsumer protocol, query and Java consumer: {len(query_rows)} records read by "
              f"the query, {len(java_read)} by the Java consumer (partitions {java_parts}), 80 "
              f"expected, each once")
    finally:
        stop_all(query, java, watcher)
    assert_commits_never_moved_back(watcher)


CLASSIC_MEMBER, CONSUMER_MEMBER = 0, 1      # ConsumerGroupDescribe v1's MemberType (KIP-1099)


def member_types(bootstrap, group) -> dict[str, int]:
    """{client id: MemberType} of the group's members, from ConsumerGroupDescribe v1 sent
    directly (``describe_group`` does not report it): which protocol each member speaks, as the
    coordinator sees it."""
    from kafka_source.config.client_config import client_config_from_options
    from kafka_source.wire.net.client import BrokerClient
    from kafka_source.wire.net.group_protocol import ConsumerGroupDescribeRequest

    config = client_config_from_options({"kafka.bootstrap.servers": bootstrap})
    with BrokerClient(config) as client:
        response = client.send(client.find_coordinator(group), ConsumerGroupDescribeRequest(
            group_ids=[group], include_authorized_operations=False, min_version=1))
    (described,) = [g for g in response.groups if g.group_id == group]
    return {m.client_id: m.member_type for m in described.members}


def member_partitions(status, topic):
    """{member id: sorted partitions of ``topic``} of a described group."""
    return {m.member_id: sorted(p for t, p in m.partitions if t == topic)
            for m in status.members}


@pytest.mark.once      # a JVM consumer, two rebalances of a mixed group: about a minute
@pytest.mark.skip_on_embedded(EMBEDDED)
@pytest.mark.requires_broker((4, 0), KIP_848)
def test_a_query_and_a_classic_java_consumer_share_a_consumer_protocol_group(
        spark, bootstrap_servers, kafka_broker, tmp_path):
    """A mixed group (KIP-848, "upgrade and downgrade"): Kafka 4.0 takes members of the classic
    protocol (JoinGroup/SyncGroup/Heartbeat) into a group of the consumer protocol, and its
    own assignor splits the partitions among both kinds. A classic member learns of a change
    by rejoining (its heartbeat is answered REBALANCE_IN_PROGRESS), the query from its
    ConsumerGroupHeartbeat answers; the partitions the brokers move from the query to the
    Java consumer must reach it only after the query committed and gave them up, so that
    nothing is read twice. When the classic member leaves (LeaveGroup), the brokers give its
    partitions back to the query, which adopts them from the Java consumer's commits."""
    kafka_home()
    # The query alone: all four partitions, the first 40 records read and committed.
    topic, group, out, watcher, query = query_alone(spark, bootstrap_servers, tmp_path,
                                                    "cgp-mixed")
    counts = {p: 10 for p in range(4)}
    java = None
    try:
        # Java's classic consumer with its default assignors (range, cooperative-sticky).
        java = JavaConsumer(bootstrap_servers, topic, group, **{"group.protocol": "classic"})
        status = split_two_and_two(bootstrap_servers, group, java)
        # Still a group of the consumer protocol, described by ConsumerGroupDescribe: the
        # classic member joined it, it did not turn the group into a classic one.
        assert status.protocol == "consumer", status
        java_member = [m for m in status.members if m.client_id.startswith("java-consumer")]
        assert len(java_member) == 1, status
        java_parts = sorted(p for _, p in java_member[0].partitions)
        types = member_types(bootstrap_servers, group)
        assert types.get(java_member[0].client_id) == CLASSIC_MEMBER, types
        assert sorted(types.values()) == [CLASSIC_MEMBER, CONSUMER_MEMBER], types
        query_parts = sorted(set(range(4)) - set(java_parts))

        produce_counts(bootstrap_servers, topic, counts, start={p: 10 for p in range(4)})
        wait_until(lambda: len(java.values()) + len(sink_rows(spark, out)) >= 80, 90,
                   f"all 80 records read by the two members ({java.stderr()})")
        wait_until(lambda: watcher.last == {p: 20 for p in range(4)}, 60,
                   "both members' commits of all 80 records")
        time.sleep(1)                         # anything read twice would show up by now
        query_rows = sink_rows(spark, out)
        java_read = java_rows(java)
        # The Java consumer started at the query's commits: it read only the second half of
        # the partitions the brokers gave it, the query everything else.
        assert sorted({p for p, _, _ in java_read}) == java_parts
        assert all(offset >= 10 for _, offset, _ in java_read)
        assert sorted({p for p, o, _ in query_rows if o >= 10}) == query_parts
        assert sorted(query_rows + java_read) == expected_rows({p: 20 for p in range(4)})
        assert query.isActive and query.exception() is None
        status = status_now(bootstrap_servers, group)
        assert status is not None and sorted(
            map(sorted, member_partitions(status, topic).values())) == sorted(
            [java_parts, query_parts]), status
        if kafka_broker.kind == "local-kafka":
            # Kafka's own tool sees the same split and the same commits.
            assert kafka_consumer_groups(kafka_broker, bootstrap_servers, group, topic) == {
                p.partition: (str(p.committed), str(p.end), p.member_id)
                for p in describe_group(bootstrap_servers, group, [topic]).partitions}
        print(f"\nmixed group, consumer-protocol query and classic Java consumer: "
              f"{len(query_rows)} records read by the query (partitions {query_parts} after "
              f"the split), {len(java_read)} by the Java consumer (partitions {java_parts}), "
              f"80 expected, each once")

        # The classic member leaves: the query gets all four partitions back.
        java.close()
        java = None
        status = wait_until(
            lambda: (lambda s: s if s is not None and len(s.members) == 1
                     and member_partitions(s, topic) and list(member_partitions(s, topic)
                                                              .values())[0] == [0, 1, 2, 3]
                     else None)(status_now(bootstrap_servers, group)),
            90, "the query alone with all four partitions again")
        assert status.protocol == "consumer" and status.state == "Stable", status
        produce_counts(bootstrap_servers, topic, counts, start={p: 20 for p in range(4)})
        wait_until(lambda: len(sink_rows(spark, out)) >= len(query_rows) + 40, 90,
                   "the query's 40 records after the Java consumer left")
        wait_until(lambda: watcher.last == {p: 30 for p in range(4)}, 60,
                   "the query's commits of all 120 records")
        time.sleep(1)
        final_rows = sink_rows(spark, out)
        assert sorted(final_rows + java_read) == expected_rows({p: 30 for p in range(4)})
        assert query.isActive and query.exception() is None
        print(f"after the Java consumer left: the query read {len(final_rows) - len(query_rows)} "
              f"more records of all four partitions; 120 records in all, each read once")
    finally:
        stop_all(query, java, watcher)
    assert_commits_never_moved_back(watcher)


def test_the_consumer_protocol_on_a_broker_without_it_is_a_clear_error(
        spark, bootstrap_servers, kafka_broker, tmp_path):
    if kafka_broker.is_tansu:
        pytest.skip(f"{kafka_broker.kind} Tansu broker: {EMBEDDED}; the error is measured on "
                    "Kafka 2.2")
    if tuple(kafka_broker.version) >= (4, 0):
        pytest.skip(f"the broker is Kafka {'.'.join(map(str, kafka_broker.version))}, which has "
                    "the consumer group protocol: the error is for brokers before Kafka 4.0")
    topic = unique_topic_name("cgp-old")
    create_topic(bootstrap_servers, topic, partitions=1)
    started = time.monotonic()
    query = start_stream(spark, consumer_options(bootstrap_servers, topic,
                                                 unique_topic_name("g-cgp-old")),
                         str(tmp_path / "ck"), str(tmp_path / "out"))
    try:
        with pytest.raises(Exception) as info:
            query.awaitTermination(60)
            raise AssertionError(f"the query did not fail: {query.exception()}")
    finally:
        query.stop()
    message = str(info.value)
    assert "'kafka.group.protocol' = 'consumer'" in message, message
    assert "'kafka.group.protocol' = 'classic'" in message, message
    assert "ConsumerGroupHeartbeat" in message, message
    assert time.monotonic() - started < 30          # at start, not after retries
