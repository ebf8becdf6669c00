"""Static membership (KIP-345): ``kafka.group.instance.id`` on a real broker, through Spark.

A query with an instance id that is stopped and restarted within ``kafka.session.timeout.ms``
gets its partitions back with no rebalance: the other member of the group, a kafka-python
consumer, keeps its assignment and is never revoked. The same restart without an instance id is
measured for comparison (the query leaves, the group rebalances; it joins, the group rebalances
again). Two running queries with one instance id: the older one fails, naming the option. On a
broker older than Kafka 2.3 (no JoinGroup v5) the option is a clear error at start.
"""

from __future__ import annotations

import threading
import time

import pytest
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.range import RangePartitionAssignor

from kafka_source import describe_group
from kafka_source.testing import create_topic, unique_topic_name

from .plain_consumer import group_consumer
from .test_stream import (committed, end_offsets, produce_counts, sink_rows, start_stream,
                          stream_options, wait_until)

KIP_345 = "KIP-345 static membership (group.instance.id)"
EMBEDDED = ("the embedded Tansu broker ignores group.instance.id (measured: a second query with "
            "the same instance id does not fence the first; DescribeGroups shows no instance ids)")
SESSION_MS = 30_000       # the restart must fit in it; the other member never waits for it


class OtherMember(ConsumerRebalanceListener):
    """A kafka-python member of the group (dynamic, range assignor) polling in a thread: what
    it reads, and every assignment and revocation the coordinator makes it go through."""

    def __init__(self, bootstrap, topic, group):
        self.rows: list[tuple[int, int, str]] = []
        self.assigned: list[list[int]] = []        # one entry per rebalance it took part in
        self.revoked: list[list[int]] = []
        self.generations: list[int] = []           # as its coordinator reports them
        self.consumer = group_consumer(
            bootstrap_servers=bootstrap, group_id=group, client_id="other-member",
            auto_offset_reset="earliest", enable_auto_commit=True, auto_commit_interval_ms=200,
            session_timeout_ms=10_000, heartbeat_interval_ms=1_000, max_poll_interval_ms=60_000,
            partition_assignment_strategy=[RangePartitionAssignor])
        self.consumer.subscribe([topic], listener=self)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def on_partitions_revoked(self, revoked):
        if revoked:
            self.revoked.append(sorted(tp.partition for tp in revoked))

    def on_partitions_assigned(self, assigned):
        self.assigned.append(sorted(tp.partition for tp in assigned))

    def _run(self):
        while not self._stop.is_set():
            for _tp, msgs in self.consumer.poll(timeout_ms=200).items():
                self.rows.extend((m.partition, m.offset, m.value.decode()) for m in msgs)
            generation = self.consumer.group_metadata().generation_id
            if generation >= 0 and (not self.generations or self.generations[-1] != generation):
                self.generations.append(generation)

    def assignment(self) -> list[int]:
        return sorted(tp.partition for tp in self.consumer.assignment())

    def close(self):
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()


def group_members(bootstrap, group):
    """(state, [(instance id, partitions)]) as the brokers describe the group."""
    status = describe_group(bootstrap, group)
    return status.state, sorted((m.instance_id or "", sorted(p for _, p in m.partitions))
                                for m in status.members)


def read_exactly(spark, out, other, produced) -> bool:
    seen = [(p, o) for p, o, _ in sink_rows(spark, out)] + [(p, o) for p, o, _ in other.rows]
    return set(seen) == {(p, o) for p, n in produced.items() for o in range(n)}


def produce_more(bootstrap, topic, produced, count):
    produce_counts(bootstrap, topic, {p: count for p in produced}, start=produced)
    for p in produced:
        produced[p] += count


@pytest.mark.requires_broker((2, 3), KIP_345)
@pytest.mark.skip_on_embedded(EMBEDDED)
@pytest.mark.parametrize("static", [True, pytest.param(False, marks=pytest.mark.once)],
                         ids=["static", "dynamic"])
def test_restarted_query_rejoins_without_a_rebalance(spark, bootstrap_servers, tmp_path,
                                                     summary_lines, static):
    topic = unique_topic_name("static-restart")
    create_topic(bootstrap_servers, topic, partitions=4)
    group = unique_topic_name("g-static")
    extra = {"kafka.group.id": group, "startingOffsets": "earliest"}
    if static:
        extra["kafka.group.instance.id"] = "restarting-query"
    options = stream_options(bootstrap_servers, topic, (SESSION_MS, 1_000), **extra)
    options["kafka.max.poll.interval.ms"] = "20000"
    checkpoint, out = str(tmp_path / "ck"), str(tmp_path / "out")
    produced = {p: 0 for p in range(4)}
    produce_more(bootstrap_servers, topic, produced, 5)

    query = start_stream(spark, options, checkpoint, out)      # first: the group's leader
    other = None
    try:
        wait_until(lambda: group_members(bootstrap_servers, group)[0] == "Stable", 60,
                   "the query to join")
        other = OtherMember(bootstrap_servers, topic, group)
        wait_until(lambda: len(other.assignment()) == 2 and group_members(
            bootstrap_servers, group)[0] == "Stable", 90, "a stable group of two members")
        wait_until(lambda: read_exactly(spark, out, other, produced), 60, "the first records")
        rebalances, revocations = len(other.assigned), len(other.revoked)
        generations = len(other.generations)
        kept = other.assignment()
        if static:
            assert group_members(bootstrap_servers, group)[1] == sorted(
                [("", kept), ("restarting-query", sorted({0, 1, 2, 3} - set(kept)))])

        query.stop()
        stopped = time.monotonic()
        produce_more(bootstrap_servers, topic, produced, 5)     # written while it is down
        if static:
            # Still a member: its partitions wait for it, read by nobody.
            time.sleep(2)
            state, members = group_members(bootstrap_servers, group)
            assert state == "Stable" and len(members) == 2, (state, members)
            assert other.assignment() == kept
        query = start_stream(spark, options, checkpoint, out)  # the same checkpoint
        wait_until(lambda: read_exactly(spark, out, other, produced), 90,
                   "the records written while the query was down")
        produce_more(bootstrap_servers, topic, produced, 5)
        wait_until(lambda: read_exactly(spark, out, other, produced), 60,
                   "the records written after the restart")
        restart_s = time.monotonic() - stopped
        wait_until(lambda: committed(bootstrap_servers, group, topic) == end_offsets(
            bootstrap_servers, topic, 4), 60, "both members' commits")
        assert query.exception() is None

        new_rebalances = len(other.assigned) - rebalances
        new_revocations = len(other.revoked) - revocations
        new_generations = len(other.generations) - generations
        rows = [(p, o) for p, o, _ in sink_rows(spark, out)] + \
            [(p, o) for p, o, _ in other.rows]
        duplicates = len(rows) - len(set(rows))
        summary_lines.append(
            f"static membership: restart of a query {'with' if static else 'without'} "
            f"kafka.group.instance.id next to a kafka-python member, which saw "
            f"{new_generations} rebalance(s) (new generations), {new_revocations} revocation(s) "
            f"and {new_rebalances} new assignment(s); {duplicates} record(s) read twice, "
            f"{restart_s:.1f} s from stop to caught up")
        if static:
            # No rebalance at all: the other member kept its partitions all along and was never
            # revoked; the restarted query resumed where it stopped, reading nothing twice.
            assert (new_rebalances, new_revocations, new_generations) == (0, 0, 0)
            assert other.assignment() == kept
            assert duplicates == 0
            assert group_members(bootstrap_servers, group)[1] == sorted(
                [("", kept), ("restarting-query", sorted({0, 1, 2, 3} - set(kept)))])
        else:
            # Leaving and joining again: one rebalance, or two when the restarted query joins
            # before the other member completed the first; the other member gives up all its
            # partitions (eager protocol). Nothing is lost.
            assert new_generations >= 1 and new_revocations >= 1
    finally:
        query.stop()
        if other is not None:
            other.close()


@pytest.mark.requires_broker((2, 3), KIP_345)
@pytest.mark.skip_on_embedded(EMBEDDED)
def test_a_second_query_with_the_same_instance_id_fails_the_first(spark, bootstrap_servers,
                                                                  tmp_path):
    topic = unique_topic_name("static-fenced")
    create_topic(bootstrap_servers, topic, partitions=2)
    group = unique_topic_name("g-fenced-instance")
    options = stream_options(bootstrap_servers, topic, (10_000, 1_000), **{
        "kafka.group.id": group, "kafka.group.instance.id": "shared-id",
        "startingOffsets": "earliest"})
    produce_counts(bootstrap_servers, topic, {0: 3, 1: 3})
    first_out, second_out = str(tmp_path / "out1"), str(tmp_path / "out2")
    first = start_stream(spark, options, str(tmp_path / "ck1"), first_out)
    second = None
    try:
        wait_until(lambda: len(sink_rows(spark, first_out)) == 6, 90, "the first query to read")
        second = start_stream(spark, options, str(tmp_path / "ck2"), second_out)
        with pytest.raises(Exception) as info:          # StreamingQueryException
            first.awaitTermination(60)
            raise AssertionError("the first query did not fail within 60 s")
        message = str(info.value)
        assert "'kafka.group.instance.id' = 'shared-id'" in message, message
        assert "FENCED_INSTANCE_ID" in message and "another member" in message, message

        # The second one has the partitions and goes on; the group never had two members.
        produce_counts(bootstrap_servers, topic, {0: 2, 1: 2}, start={0: 3, 1: 3})
        wait_until(lambda: {(p, o) for p, o, _ in sink_rows(spark, second_out)} >=
                   {(p, o) for p in (0, 1) for o in (3, 4)}, 90, "the second query to read")
        assert second.isActive and second.exception() is None
        assert group_members(bootstrap_servers, group) == ("Stable", [("shared-id", [0, 1])])
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_static_membership_on_a_broker_before_2_3_is_a_clear_error(spark, bootstrap_servers,
                                                                   kafka_broker, tmp_path):
    if tuple(kafka_broker.version) >= (2, 3):
        pytest.skip(f"the broker is Kafka {'.'.join(map(str, kafka_broker.version))}, which has "
                    "static membership: the error is for brokers before Kafka 2.3")
    topic = unique_topic_name("static-old")
    create_topic(bootstrap_servers, topic, partitions=1)
    options = stream_options(bootstrap_servers, topic, (6_000, 1_000), **{
        "kafka.group.id": unique_topic_name("g-static-old"),
        "kafka.group.instance.id": "query-1"})
    started = time.monotonic()
    query = start_stream(spark, options, str(tmp_path / "ck"), str(tmp_path / "out"))
    try:
        with pytest.raises(Exception) as info:
            query.awaitTermination(60)
            raise AssertionError(f"the query did not fail: {query.exception()}")
    finally:
        query.stop()
    message = str(info.value)
    assert "'kafka.group.instance.id'" in message and "Kafka 2.3" in message, message
    assert "JoinGroup v5" in message, message
    assert time.monotonic() - started < 30          # at start, not after retries
