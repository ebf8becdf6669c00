"""The sticky assignors with Kafka's own Java consumer in the query's group
(:mod:`kafka_source.group.sticky`): a group of Java consumers whose only assignor is
``cooperative-sticky`` -- the second of the Java consumer's defaults, and the only one in many
deployments -- takes a query that offers it, and the two split the partitions with nothing read
twice or lost."""

from __future__ import annotations

import pytest

from kafka_source.testing import create_topic, unique_topic_name
from kafka_source.wire.net.client import RetriableBrokerError

from .java_consumer import JavaConsumer, kafka_home
from .test_stream import (describe_group, expected_rows, produce_counts, sink_rows,
                          start_stream, stream_options, wait_until)


def group_now(bootstrap, group):
    """(state, members), or ("", {}) while the coordinator is not there yet (a new broker
    creates the offsets topic on the first FindCoordinator)."""
    try:
        return describe_group(bootstrap, group)
    except RetriableBrokerError:
        return "", {}


@pytest.mark.once      # a JVM consumer and two rebalances: about half a minute
@pytest.mark.parametrize("assignor", ["cooperative-sticky", "sticky"])
def test_a_query_shares_a_group_with_java_consumers_on_a_sticky_assignor(
        spark, bootstrap_servers, kafka_broker, tmp_path, assignor):
    kafka_home()
    timeouts = (2_000, 400) if kafka_broker.is_tansu else (6_000, 1_000)
    topic = unique_topic_name(f"share-{assignor}")
    create_topic(bootstrap_servers, topic, partitions=4)
    group = unique_topic_name("g-sticky")
    java = JavaConsumer(bootstrap_servers, topic, group, assignors=[assignor],
                        session_timeout_ms=timeouts[0])
    query = None
    try:
        wait_until(lambda: (lambda s, m: s == "Stable" and len(m) == 1 and all(m.values()))(
            *group_now(bootstrap_servers, group)), 90,
            f"the Java consumer alone in the group ({java.stderr()})")
        query = start_stream(spark, stream_options(
            bootstrap_servers, topic, timeouts,
            **{"kafka.group.id": group, "assignor": assignor, "startingOffsets": "earliest"}),
            str(tmp_path / "ck"), str(tmp_path / "out"))
        # Two members, two partitions each (cooperative-sticky may take two rebalances).
        state, members = wait_until(
            lambda: (lambda s, m: (s, m) if s == "Stable" and len(m) == 2
                     and sorted(len(ps) for ps in m.values()) == [2, 2] else None)(
                *group_now(bootstrap_servers, group)),
            90, "a stable group of the query and the Java consumer, two partitions each")
        java_id = next(m for m in members if m.startswith("java-consumer"))
        java_parts = sorted(p for _, p in members[java_id])

        counts = {p: 10 for p in range(4)}
        produce_counts(bootstrap_servers, topic, counts)
        out = str(tmp_path / "out")
        wait_until(lambda: len(java.values()) + len(sink_rows(spark, out)) >= 40, 90,
                   "all 40 records read by the two members")
        query_rows = sink_rows(spark, out)
        java_rows = [(int(v[1:v.index("-")]), int(v[v.index("-") + 1:]), v)
                     for v in java.values()]
        assert sorted({p for p, _, _ in java_rows}) == java_parts
        assert sorted({p for p, _, _ in query_rows}) == \
            sorted(set(range(4)) - set(java_parts))
        assert sorted(query_rows + java_rows) == expected_rows(counts)     # once each
    finally:
        if query is not None:
            query.stop()
        java.close()
