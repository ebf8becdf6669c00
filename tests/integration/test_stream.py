"""Streaming reads as a consumer-group member, end to end through Spark, on the selected broker.

Records are produced one per request: on the embedded broker ListOffsets(latest) is only exact
for single-record batches (see ``kafka_source/testing/brokers.py``), and these tests compare the group's committed
offsets with the log end. Session timeouts are small because the embedded broker holds a join
for about half of it; a real Kafka broker refuses less than 6 s (group.min.session.timeout.ms).
"""

from __future__ import annotations

import math
import threading
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import CoordinatorLoadInProgressError, CoordinatorNotAvailableError
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.protocol.admin import DescribeGroupsRequest

from kafka_source import spark_features
from kafka_source.group.assignors import Assignment, RangeAssignor, RoundRobinAssignor, Subscription
from kafka_source.read.admission import rate_limit
from kafka_source.wire.net.client import BrokerClient
from kafka_source.testing import create_topic, unique_topic_name

from .plain_consumer import group_consumer
from .spark_features import AVAILABLE_NOW_IN_MICRO_BATCHES
from .test_batch_read import BASE_TS, produce



@pytest.fixture(scope="module")
def group_timeouts(kafka_broker):
    """(session, heartbeat) in ms: small, within what the broker accepts."""
    return (2_000, 400) if kafka_broker.is_tansu else (6_000, 1_000)


def stream_options(bootstrap, topic, timeouts, **extra):
    session, heartbeat = timeouts
    opts = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
            "kafka.session.timeout.ms": str(session),
            "kafka.heartbeat.interval.ms": str(heartbeat),
            # a rebalance waits at most this long for members to rejoin
            "kafka.max.poll.interval.ms": str(4 * session)}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def produce_counts(bootstrap, topic, per_partition: dict[int, int], start: dict[int, int] | None
                   = None, *, one_per_batch: bool = True):
    """Produce ``per_partition[p]`` records to each partition (values ``p{p}-{offset}``), one
    per request unless ``one_per_batch`` is False."""
    start = start or {}
    records, parts = [], []
    for p, n in sorted(per_partition.items()):
        for i in range(start.get(p, 0), start.get(p, 0) + n):
            records.append((f"k{p}-{i}".encode(), f"p{p}-{i}".encode(), [], BASE_TS + i))
            parts.append(p)
    produce(bootstrap, topic, records, partition_of=lambda i: parts[i],
            one_per_batch=one_per_batch)


def committed(bootstrap, group, topic) -> dict[int, int]:
    """The group's committed offsets for ``topic``; nothing (``{}``) while the broker has no
    coordinator for the group yet (a fresh broker creates ``__consumer_offsets`` on the first
    FindCoordinator, and answers COORDINATOR_NOT_AVAILABLE meanwhile)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        try:
            offsets = admin.list_group_offsets(group).get(group, {})
        except (CoordinatorNotAvailableError, CoordinatorLoadInProgressError):
            return {}
        return {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == topic}
    finally:
        admin.close()


def end_offsets(bootstrap, topic, partitions) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        consumer.close()


def describe_group(bootstrap, group):
    """(state, {member_id: [(topic, partition), ...]}) straight from the coordinator."""
    with BrokerClient({"bootstrap_servers": bootstrap}) as client:
        node = client.find_coordinator(group)
        response = client.send(node, DescribeGroupsRequest(groups=[group],
                                                           include_authorized_operations=False))
    g = response.groups[0]
    members = {m.member_id: list(Assignment.decode(bytes(m.member_assignment or b"")).partitions)
               for m in g.members}
    return g.group_state, members


def wait_until(predicate, timeout_s, what, interval_s=0.2, explain=None):
    """``predicate()`` once it is truthy; else an AssertionError after ``timeout_s`` naming
    ``what`` and, if given, ``explain()`` (the state of whatever was waited on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    detail = f" ({explain()})" if explain is not None else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{detail}")


def load_stream(spark, options):
    reader = spark.readStream.format("pykafka")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def run_available_now(spark, options, checkpoint, out):
    query = (load_stream(spark, options).selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
             .writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    assert query.awaitTermination(180), "AvailableNow query did not finish within 180 s"
    assert query.exception() is None, query.exception()
    return query


def sink_rows(spark, out):
    try:
        return [(r.partition, r.offset, r.value) for r in spark.read.parquet(out).collect()]
    except Exception as exc:  # nothing written yet
        # PySpark 4.0 says "Unable to infer schema" without the error class
        if any(s in str(exc) for s in ("PATH_NOT_FOUND", "UNABLE_TO_INFER_SCHEMA",
                                       "Unable to infer schema")):
            return []
        raise


def expected_rows(per_partition: dict[int, int]):
    return sorted((p, i, f"p{p}-{i}") for p, n in per_partition.items() for i in range(n))


def data_batches(query):
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]


# ---------------------------------------------------------------------------------------------

@AVAILABLE_NOW_IN_MICRO_BATCHES
def test_available_now_rate_limited_exactly_once_then_commits(spark, bootstrap_servers,
                                                              group_timeouts, tmp_path):
    topic = unique_topic_name("avn")
    create_topic(bootstrap_servers, topic, partitions=3)
    counts = {0: 40, 1: 40, 2: 40}
    produce_counts(bootstrap_servers, topic, counts)
    group = unique_topic_name("g-avn")
    limit = 25
    query = run_available_now(spark, stream_options(
        bootstrap_servers, topic, group_timeouts, **{"kafka.group.id": group,
                                                     "startingOffsets": "earliest",
                                                     "maxOffsetsPerTrigger": limit}),
        str(tmp_path / "ck"), str(tmp_path / "out"))

    assert sorted(sink_rows(spark, str(tmp_path / "out"))) == expected_rows(counts)
    batches = data_batches(query)
    assert all(n <= limit for n in batches), batches
    assert len(batches) == math.ceil(120 / 24), batches  # 3 partitions x floor(25/3) = 24
    # The last batch's end offsets are committed although Spark never calls commit() for it.
    assert committed(bootstrap_servers, group, topic) == end_offsets(bootstrap_servers, topic, 3) \
        == counts
    # ... and the query left the group when it finished.
    state, members = describe_group(bootstrap_servers, group)
    assert members == {}, (state, members)


@pytest.mark.skipif(spark_features.ADMISSION_CONTROL,
                    reason="this PySpark has admission control for Python sources: AvailableNow "
                           "runs in several micro-batches (the test above)")
def test_available_now_without_admission_control(spark, bootstrap_servers, group_timeouts,
                                                  tmp_path):
    """PySpark 4.0/4.1: Trigger.AvailableNow is one micro-batch, which maxOffsetsPerTrigger
    caps; each run goes on from the checkpoint, nothing is lost or read twice, and the group
    gets a run's offsets when the next run of the checkpoint starts (docs/platforms.md)."""
    topic = unique_topic_name("an-legacy")
    create_topic(bootstrap_servers, topic, partitions=2)
    group = unique_topic_name("g-an-legacy")
    opts = stream_options(bootstrap_servers, topic, group_timeouts,
                          **{"kafka.group.id": group, "startingOffsets": "earliest",
                             "maxOffsetsPerTrigger": 16})
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    produce_counts(bootstrap_servers, topic, {0: 20, 1: 10})
    run_available_now(spark, opts, ck, out)
    first = sink_rows(spark, out)
    # One micro-batch, capped as on PySpark 4.2: 16 shared by backlog, rounded down per partition.
    assert sorted(first) == expected_rows(rate_limit(16, {0: 0, 1: 0}, {0: 20, 1: 10}))
    assert committed(bootstrap_servers, group, topic) == {}
    run_available_now(spark, opts, ck, out)       # goes on from the checkpoint
    assert sorted(sink_rows(spark, out)) == expected_rows({0: 20, 1: 10})
    # the first run's batch, committed at the second run's first trigger
    assert committed(bootstrap_servers, group, topic) == {
        p: 1 + max(o for q, o, _ in first if q == p) for p in (0, 1)}
    run_available_now(spark, opts, ck, out)       # nothing new: commits the second run's
    assert sorted(sink_rows(spark, out)) == expected_rows({0: 20, 1: 10})
    assert committed(bootstrap_servers, group, topic) == {0: 20, 1: 10}


@AVAILABLE_NOW_IN_MICRO_BATCHES
@pytest.mark.smoke      # make check's smoke test
def test_restart_from_checkpoint_neither_loses_nor_duplicates(spark, bootstrap_servers,
                                                              group_timeouts, tmp_path):
    topic = unique_topic_name("restart")
    create_topic(bootstrap_servers, topic, partitions=2)
    group = unique_topic_name("g-restart")
    opts = stream_options(bootstrap_servers, topic, group_timeouts,
                          **{"kafka.group.id": group, "startingOffsets": "earliest",
                             "maxOffsetsPerTrigger": 15})
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    produce_counts(bootstrap_servers, topic, {0: 20, 1: 10})
    run_available_now(spark, opts, ck, out)
    produce_counts(bootstrap_servers, topic, {0: 5, 1: 12}, start={0: 20, 1: 10})
    # Rewind the group: on restart the checkpoint wins over the group's committed offsets.
    rewind = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=group,
                           enable_auto_commit=False)
    try:
        from kafka.structs import OffsetAndMetadata
        rewind.commit({TopicPartition(topic, p): OffsetAndMetadata(0, "", -1) for p in (0, 1)})
    finally:
        rewind.close()
    run_available_now(spark, opts, ck, out)

    assert sorted(sink_rows(spark, out)) == expected_rows({0: 25, 1: 22})
    assert committed(bootstrap_servers, group, topic) == {0: 25, 1: 22}


@AVAILABLE_NOW_IN_MICRO_BATCHES
def test_new_checkpoint_in_same_group_resumes_from_committed_offsets(spark, bootstrap_servers,
                                                                     group_timeouts, tmp_path):
    topic = unique_topic_name("resume")
    create_topic(bootstrap_servers, topic, partitions=2)
    group = unique_topic_name("g-resume")
    produce_counts(bootstrap_servers, topic, {0: 10, 1: 10})
    first = stream_options(bootstrap_servers, topic, group_timeouts,
                           **{"kafka.group.id": group, "startingOffsets": "earliest"})
    run_available_now(spark, first, str(tmp_path / "ck1"), str(tmp_path / "out1"))
    produce_counts(bootstrap_servers, topic, {0: 3, 1: 4}, start={0: 10, 1: 10})
    # Default startingOffsets with kafka.group.id is 'group': resume where the group is.
    second = stream_options(bootstrap_servers, topic, group_timeouts, **{"kafka.group.id": group})
    run_available_now(spark, second, str(tmp_path / "ck2"), str(tmp_path / "out2"))

    rows = sorted(sink_rows(spark, str(tmp_path / "out2")))
    assert rows == [(0, i, f"p0-{i}") for i in range(10, 13)] + \
        [(1, i, f"p1-{i}") for i in range(10, 14)]
    assert committed(bootstrap_servers, group, topic) == {0: 13, 1: 14}


def grow_topic(bootstrap, topic, partitions, timeout_s=30):
    """Add partitions to ``topic`` (to ``partitions`` in all) and wait until a client sees them."""
    from kafka.admin import NewPartitions

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_partitions({topic: NewPartitions(total_count=partitions)})
    finally:
        admin.close()

    def seen():
        consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        try:
            return len(consumer.partitions_for_topic(topic) or ()) == partitions
        finally:
            consumer.close()

    wait_until(seen, timeout_s, f"{topic} to have {partitions} partitions")


@AVAILABLE_NOW_IN_MICRO_BATCHES
@pytest.mark.skip_on_embedded("the embedded Tansu broker does not support CreatePartitions "
                              "(IncompatibleBrokerVersion), so the topic cannot grow there")
def test_partitions_created_between_two_runs_of_a_checkpoint_are_read_from_their_start(
        spark, bootstrap_servers, group_timeouts, tmp_path):
    # Two Trigger.AvailableNow runs of one checkpoint; the topic grows from 2 to 4 partitions
    # between them and 400 records go to all four. The new partitions, which the group has no
    # commit for, used to start at kafka.auto.offset.reset (latest): their 200 records were
    # skipped. As in Spark, partitions new to the checkpoint start at their log start.
    topic = unique_topic_name("grow")
    create_topic(bootstrap_servers, topic, partitions=2)
    group = unique_topic_name("g-grow")
    opts = stream_options(bootstrap_servers, topic, group_timeouts,
                          **{"kafka.group.id": group, "startingOffsets": "earliest"})
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    produce_counts(bootstrap_servers, topic, {0: 10, 1: 10})
    run_available_now(spark, opts, ck, out)
    assert committed(bootstrap_servers, group, topic) == {0: 10, 1: 10}

    grow_topic(bootstrap_servers, topic, 4)
    second = {p: 100 for p in range(4)}
    produce_counts(bootstrap_servers, topic, second, start={0: 10, 1: 10}, one_per_batch=False)
    run_available_now(spark, opts, ck, out)

    rows = sink_rows(spark, out)
    assert len(rows) == 420 and len(set(rows)) == 420          # each record exactly once
    assert sorted(rows) == expected_rows({0: 110, 1: 110, 2: 100, 3: 100})
    assert committed(bootstrap_servers, group, topic) == {0: 110, 1: 110, 2: 100, 3: 100}


class PlainConsumer:
    """A kafka-python group member polling in a thread, recording what it reads."""

    def __init__(self, bootstrap, topic, group, timeouts, assignor):
        session, heartbeat = timeouts
        self.consumer = group_consumer(
            topic, bootstrap_servers=bootstrap, group_id=group, client_id="plain-consumer",
            auto_offset_reset="earliest", enable_auto_commit=True, auto_commit_interval_ms=200,
            session_timeout_ms=session, heartbeat_interval_ms=heartbeat,
            max_poll_interval_ms=4 * session, partition_assignment_strategy=[assignor],
            # A leader whose metadata lacks the just-created topic assigns nothing ("No
            # partition metadata for topic ..."); a quick refresh makes it rebalance soon.
            metadata_max_age_ms=500)
        self.topic = topic
        self.rows: list[tuple[int, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            for _tp, msgs in self.consumer.poll(timeout_ms=200).items():
                self.rows.extend((m.partition, m.offset, m.value.decode()) for m in msgs)

    def assignment(self):
        return sorted(tp.partition for tp in self.consumer.assignment())

    def state(self) -> str:
        """kafka-python's view of its membership, for a timeout's message."""
        c = self.consumer._coordinator
        return (f"plain consumer: coordinator {c.coordinator_id}, state {c.state}, generation "
                f"{c._generation}, {len(self.rows)} records read, partitions known "
                f"{self.consumer.partitions_for_topic(self.topic)}")

    def close(self):
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()  # commits and leaves the group


def start_stream(spark, options, checkpoint, out, trigger="300 milliseconds"):
    return (load_stream(spark, options).selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
            .writeStream.format("parquet").option("path", out)
            .option("checkpointLocation", checkpoint).trigger(processingTime=trigger).start())


@pytest.mark.parametrize("assignor,kafka_python_assignor,ours", [
    ("range", RangePartitionAssignor, RangeAssignor()),
    ("roundrobin", RoundRobinPartitionAssignor, RoundRobinAssignor()),
])
def test_query_and_plain_consumer_share_a_group(spark, bootstrap_servers, group_timeouts,
                                                tmp_path, assignor, kafka_python_assignor, ours):
    topic = unique_topic_name(f"share-{assignor}")
    create_topic(bootstrap_servers, topic, partitions=5)
    group = unique_topic_name("g-share")
    probe = KafkaConsumer(bootstrap_servers=bootstrap_servers)
    try:   # the plain consumer's leader assigns nothing while its metadata lacks the new topic
        wait_until(lambda: len(probe.partitions_for_topic(topic) or ()) == 5, 30,
                   f"metadata of the new topic {topic}")
    finally:
        probe.close()
    plain = PlainConsumer(bootstrap_servers, topic, group, group_timeouts, kafka_python_assignor)
    query = None
    try:
        # 120 s: on a loaded machine a Kafka 2.2 broker once took over 60 s here (CI, separate
        # executors); a query that has not started yet cannot be the cause.
        wait_until(plain.assignment, 120, "the plain consumer's first assignment",
                   explain=plain.state)
        query = start_stream(spark, stream_options(
            bootstrap_servers, topic, group_timeouts,
            **{"kafka.group.id": group, "assignor": assignor, "startingOffsets": "earliest"}),
            str(tmp_path / "ck"), str(tmp_path / "out"))
        state, members = wait_until(
            lambda: (lambda s, m: (s, m) if s == "Stable" and len(m) == 2 else None)(
                *describe_group(bootstrap_servers, group)),
            90, "a stable group of two members")
        # The leader (whichever it is) assigned as the assignor says, over both members' ids.
        expected = ours.assign({topic: 5}, {m: Subscription((topic,)) for m in members})
        plain_id = next(m for m in members if m.startswith("plain-consumer"))
        query_id = next(m for m in members if m != plain_id)
        plain_parts = sorted(p for _, p in expected[plain_id])
        query_parts = sorted(p for _, p in expected[query_id])
        wait_until(lambda: plain.assignment() == plain_parts, 30,
                   f"the plain consumer to hold {plain_parts}")
        if all(members.values()):  # brokers other than the embedded one describe assignments
            assert {m: sorted(ps) for m, ps in members.items()} == \
                {m: sorted(ps) for m, ps in expected.items()}

        counts = {p: 6 for p in range(5)}
        produce_counts(bootstrap_servers, topic, counts)
        out = str(tmp_path / "out")
        wait_until(lambda: len(plain.rows) + len(sink_rows(spark, out)) >= 30, 90,
                   "all 30 records read by the two members")
        query_rows = sink_rows(spark, out)
        assert sorted({r[0] for r in query_rows}) == query_parts
        assert sorted({r[0] for r in plain.rows}) == plain_parts
        assert sorted(query_rows + plain.rows) == expected_rows(counts)
        wait_until(lambda: committed(bootstrap_servers, group, topic) == counts, 30,
                   "both members' commits")
    finally:
        if query is not None:
            query.stop()
        plain.close()


def test_member_joining_and_leaving_mid_stream_loses_nothing(spark, bootstrap_servers,
                                                             group_timeouts, tmp_path):
    topic = unique_topic_name("rebalance")
    create_topic(bootstrap_servers, topic, partitions=4)
    group = unique_topic_name("g-rebalance")
    out = str(tmp_path / "out")
    query = start_stream(spark, stream_options(
        bootstrap_servers, topic, group_timeouts,
        **{"kafka.group.id": group, "startingOffsets": "earliest"}), str(tmp_path / "ck"), out)
    produced = {p: 0 for p in range(4)}
    stop = threading.Event()

    def producer_loop():
        while not stop.is_set():
            produce_counts(bootstrap_servers, topic, {p: 2 for p in range(4)}, start=produced)
            for p in produced:
                produced[p] += 2
            time.sleep(0.2)

    feeder = threading.Thread(target=producer_loop, daemon=True)
    plain = None
    try:
        wait_until(lambda: describe_group(bootstrap_servers, group)[0] == "Stable", 60,
                   "the query to join")
        feeder.start()
        time.sleep(2)
        plain = PlainConsumer(bootstrap_servers, topic, group, group_timeouts,
                              RangePartitionAssignor)
        wait_until(lambda: len(plain.assignment()) == 2, 90, "the join rebalance")
        wait_until(lambda: len(plain.rows) > 0, 60, "the plain consumer to read")
        plain.close()   # leaves the group: the query takes all partitions back
        time.sleep(2)
        stop.set()
        feeder.join(30)
        total = sum(produced.values())

        def everything_read():
            seen = {(p, o) for p, o, _ in sink_rows(spark, out) + plain.rows}
            return len(seen) == total

        wait_until(everything_read, 120, f"all {total} records read by query or consumer")
        rows = sink_rows(spark, out) + plain.rows
        assert {(p, o) for p, o, _ in rows} == {(p, o) for p, n in produced.items()
                                                for o in range(n)}
        assert all(v == f"p{p}-{o}" for p, o, v in rows)
        state, members = describe_group(bootstrap_servers, group)
        assert len(members) == 1, (state, members)
        if all(members.values()):  # brokers other than the embedded one describe assignments
            assert sorted(p for _, p in next(iter(members.values()))) == [0, 1, 2, 3]
        # Only the query is left in the group: these commits are its own, for all partitions.
        wait_until(lambda: committed(bootstrap_servers, group, topic) == produced, 30,
                   "the query's commits after taking everything back")
    finally:
        stop.set()
        query.stop()
        if plain is not None and plain._thread.is_alive():
            plain.close()


@pytest.mark.skip_on_embedded("needs Kafka's classic group coordinator, which drops a member "
                              "that does not rejoin within its rebalance timeout")
def test_fenced_query_neither_commits_backwards_nor_reads_again(spark, bootstrap_servers,
                                                                tmp_path):
    """Measured on Kafka 2.2 before the fix: the query's second micro-batch runs longer than
    kafka.max.poll.interval.ms; meanwhile a kafka-python consumer joins, gets all four
    partitions (the coordinator drops the query's member for not rejoining), reads to the end,
    commits 500 on each and leaves. The query came back with the same partitions, committed
    its old end (200) over the 500 and read 200..500 again. Now it adopts them from the group's
    committed offsets: committed offsets never go backwards, nothing is read twice."""
    topic = unique_topic_name("fenced")
    create_topic(bootstrap_servers, topic, partitions=4)
    group = unique_topic_name("g-fenced")
    produce_counts(bootstrap_servers, topic, {p: 500 for p in range(4)}, one_per_batch=False)
    slow_batch, other_done = threading.Event(), threading.Event()
    query_rows: list[tuple[int, int]] = []

    def sink(df, batch_id):
        query_rows.extend((r.partition, r.offset) for r in df.select("partition", "offset")
                          .collect())
        if batch_id == 1:                       # the long micro-batch
            slow_batch.set()
            other_done.wait(120)

    options = stream_options(bootstrap_servers, topic, (6_000, 1_000),
                             **{"kafka.group.id": group, "startingOffsets": "earliest",
                                "maxOffsetsPerTrigger": 400,
                                "kafka.max.poll.interval.ms": 10_000})
    history: list[dict[int, int]] = []
    watching = threading.Event()

    def watch_commits():
        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
        try:
            while not watching.is_set():
                try:
                    offsets = admin.list_group_offsets(group).get(group, {})
                except Exception:  # noqa: BLE001 - e.g. no coordinator yet: ask again
                    offsets = {}
                history.append({tp.partition: om.offset for tp, om in offsets.items()
                                if tp.topic == topic})
                time.sleep(0.1)
        finally:
            admin.close()

    watcher = threading.Thread(target=watch_commits, daemon=True)
    watcher.start()
    query = (load_stream(spark, options).writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="300 milliseconds").start())
    other_rows: list[tuple[int, int]] = []
    try:
        assert slow_batch.wait(120), "the query's second micro-batch did not start"
        other = group_consumer(
            topic, bootstrap_servers=bootstrap_servers, group_id=group,
            client_id="other-member", enable_auto_commit=False, auto_offset_reset="earliest",
            session_timeout_ms=6_000, heartbeat_interval_ms=1_000, max_poll_interval_ms=10_000,
            partition_assignment_strategy=[RangePartitionAssignor])
        try:
            deadline = time.monotonic() + 90
            while not (len(other.assignment()) == 4 and all(
                    other.position(tp) == 500 for tp in other.assignment())):
                assert time.monotonic() < deadline, "the other member did not read to the end"
                for _tp, msgs in other.poll(timeout_ms=500).items():
                    other_rows.extend((m.partition, m.offset) for m in msgs)
            other.commit()
        finally:
            other.close()                       # leaves the group
        assert committed(bootstrap_servers, group, topic) == {p: 500 for p in range(4)}
        other_done.set()

        # The query rejoins, gets the four partitions back and goes on from the group's 500.
        produce_counts(bootstrap_servers, topic, {p: 10 for p in range(4)},
                       start={p: 500 for p in range(4)}, one_per_batch=False)
        wait_until(lambda: sum(1 for _, o in query_rows if o >= 500) == 40, 120,
                   "the query to read the records produced after it came back")
        wait_until(lambda: committed(bootstrap_servers, group, topic) ==
                   {p: 510 for p in range(4)}, 60, "the query's commit of 510")
        assert query.exception() is None
    finally:
        other_done.set()
        watching.set()
        query.stop()
        watcher.join(10)

    assert not watcher.is_alive()
    # The watcher's last sample may predate the commit waited for above: one more, now.
    history.append(committed(bootstrap_servers, group, topic))
    assert history[-1] == {p: 510 for p in range(4)}, history[-1:]
    for p in range(4):
        seen = [h[p] for h in history if p in h]
        assert 500 in seen and seen == sorted(seen), \
            f"partition {p}'s committed offset went back: {seen}"
    assert len(query_rows) == len(set(query_rows))
    assert sorted(query_rows) == sorted((p, o) for p in range(4)
                                        for o in [*range(200), *range(500, 510)])
    assert min(o for _, o in other_rows) >= 100         # from the query's commit of batch 0


def test_idle_stream_keeps_membership_and_commits(spark, bootstrap_servers, group_timeouts,
                                                  tmp_path):
    topic = unique_topic_name("idle")
    create_topic(bootstrap_servers, topic, partitions=2)
    group = unique_topic_name("g-idle")
    out = str(tmp_path / "out")
    query = start_stream(spark, stream_options(
        bootstrap_servers, topic, group_timeouts,
        **{"kafka.group.id": group, "startingOffsets": "earliest"}), str(tmp_path / "ck"), out,
        trigger="1 second")
    try:
        produce_counts(bootstrap_servers, topic, {0: 7, 1: 5})
        # Spark calls commit() only when it plans another batch; the source commits anyway.
        wait_until(lambda: committed(bootstrap_servers, group, topic) == {0: 7, 1: 5}, 60,
                   "the committed offsets to reach the end while the stream is idle")
        _, before = describe_group(bootstrap_servers, group)
        time.sleep(3 * group_timeouts[0] / 1000)   # idle for three session timeouts
        state, after = describe_group(bootstrap_servers, group)
        assert state == "Stable" and list(after) == list(before) and len(after) == 1
        produce_counts(bootstrap_servers, topic, {0: 1}, start={0: 7})
        wait_until(lambda: len(sink_rows(spark, out)) == 13, 60, "the record sent after idling")
        assert query.exception() is None
    finally:
        query.stop()


def test_stopped_query_leaves_the_group_at_once(spark, bootstrap_servers, tmp_path):
    """query.stop() sends LeaveGroup: the group is Empty long before the session timeout.

    Spark SIGTERMs the planning process right after closing its socket; without the reader's
    SIGTERM handling the member stayed until the session timeout (measured: 20 s here)."""
    session_ms = 20_000
    topic = unique_topic_name("leave")
    create_topic(bootstrap_servers, topic, partitions=2)
    group = unique_topic_name("g-leave")
    query = start_stream(spark, stream_options(
        bootstrap_servers, topic, (session_ms, 1_000),
        **{"kafka.group.id": group, "startingOffsets": "earliest"}), str(tmp_path / "ck"),
        str(tmp_path / "out"), trigger="1 second")
    try:
        produce_counts(bootstrap_servers, topic, {0: 3, 1: 2})
        sink = str(tmp_path / "out")
        wait_until(lambda: len(sink_rows(spark, sink)) == 5, 90, "the query to read the records")
        wait_until(lambda: committed(bootstrap_servers, group, topic) == {0: 3, 1: 2}, 60,
                   "the query to commit")
        assert describe_group(bootstrap_servers, group)[0] == "Stable"
    finally:
        query.stop()
    stopped = time.monotonic()
    wait_until(lambda: describe_group(bootstrap_servers, group)[0] == "Empty",
               session_ms / 2000, "the group to be Empty after query.stop()")
    assert time.monotonic() - stopped < session_ms / 1000
    assert query.exception() is None


def test_stream_option_errors_name_the_option(spark, bootstrap_servers, tmp_path):
    opts = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": "whatever",
            "endingOffsets": "latest"}
    with pytest.raises(Exception, match="endingOffsets"):
        query = (load_stream(spark, opts).writeStream.format("noop")
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        query.awaitTermination(60)
        raise AssertionError(f"query did not fail: {query.exception()}")


def test_subscribe_pattern_picks_up_a_new_topic_mid_stream(spark, bootstrap_servers,
                                                           group_timeouts, tmp_path):
    prefix = unique_topic_name("pat")
    first, second = f"{prefix}-a", f"{prefix}-b"
    create_topic(bootstrap_servers, first, partitions=1)
    group = unique_topic_name("g-pat")
    out = str(tmp_path / "out")
    options = stream_options(bootstrap_servers, first, group_timeouts,
                             **{"kafka.group.id": group, "startingOffsets": "earliest"})
    del options["subscribe"]
    options["subscribePattern"] = f"{prefix}-.*"
    query = (load_stream(spark, options).selectExpr("topic", "CAST(value AS STRING) AS value")
             .writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="300 milliseconds").start())

    def read():
        try:
            return sorted((r.topic, r.value) for r in spark.read.parquet(out).collect())
        except Exception:
            return []

    try:
        produce_counts(bootstrap_servers, first, {0: 3})
        wait_until(lambda: len(read()) == 3, 60, "the first topic's records")
        # A topic created later that matches the pattern: seen at a trigger, group rejoined,
        # read from its start (it is a new partition).
        create_topic(bootstrap_servers, second, partitions=1)
        produce_counts(bootstrap_servers, second, {0: 4})
        wait_until(lambda: len(read()) == 7, 90, "the new topic's records")
        assert read() == sorted([(first, f"p0-{i}") for i in range(3)]
                                + [(second, f"p0-{i}") for i in range(4)])
        wait_until(lambda: committed(bootstrap_servers, group, second) == {0: 4}, 30,
                   "the commit for the new topic")
    finally:
        query.stop()


def _recreate_topic(bootstrap, topic, partitions, timeout_s=60):
    """Delete ``topic`` and create it again under the same name (a new topic id), once the
    brokers let the name be taken again."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                admin.create_topics([NewTopic(topic, partitions, 1)])
                break
            except TopicAlreadyExistsError:      # the deletion is still under way
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        admin.close()


@pytest.mark.skip_on_embedded("the new topic's records go in multi-record batches, whose end "
                              "offsets the embedded Tansu broker does not report as Kafka does "
                              "(with one record per batch the test passes there)")
@pytest.mark.requires_broker((2, 8), "KIP-516 topic ids in Metadata (v10+), which tell a topic "
                                     "created again under its name from the old one")
@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_topic_deleted_and_created_again_under_a_running_query(
        spark, bootstrap_servers, group_timeouts, tmp_path, fail_on_data_loss):
    # The new topic gets more records than the query had read of the old one: its offsets
    # alone cannot tell, and the query used to read on from offset 10, skipping the new
    # topic's first records without a word (issue 38 item 6).
    topic = unique_topic_name("recreated")
    create_topic(bootstrap_servers, topic, partitions=2)
    produce_counts(bootstrap_servers, topic, {0: 10, 1: 10})
    group = unique_topic_name("g-recreated")
    opts = stream_options(bootstrap_servers, topic, group_timeouts,
                          **{"kafka.group.id": group, "startingOffsets": "earliest",
                             "failOnDataLoss": fail_on_data_loss})
    out = str(tmp_path / "out")
    query = start_stream(spark, opts, str(tmp_path / "ck"), out)
    try:
        wait_until(lambda: len(sink_rows(spark, out)) == 20, 90, "the old topic's 20 records")
        _recreate_topic(bootstrap_servers, topic, 2)
        new = {0: 30, 1: 5}
        records = [(None, f"new-p{p}-{i}".encode(), [], BASE_TS + i)
                   for p, n in sorted(new.items()) for i in range(n)]
        produce(bootstrap_servers, topic, records, partition_of=lambda i: 0 if i < 30 else 1)
        if fail_on_data_loss == "true":
            failure = wait_until(query.exception, 90, "the query to fail")
            message = str(failure)
            assert "deleted and created again" in message and f"'{topic}'" in message, message
            assert f"{topic}-0" in message and "failOnDataLoss" in message
            rows = sink_rows(spark, out)
            assert sorted(rows) == expected_rows({0: 10, 1: 10})   # nothing of the new topic
        else:
            wait_until(lambda: query.exception() or len(sink_rows(spark, out)) >= 55, 90,
                       "the new topic's 35 records")
            assert query.exception() is None, query.exception()
            rows = sink_rows(spark, out)
            assert len(rows) == 55
            assert sorted(r for r in rows if r[2].startswith("new-")) == sorted(
                (p, i, f"new-p{p}-{i}") for p, n in new.items() for i in range(n))
            wait_until(lambda: committed(bootstrap_servers, group, topic) == new, 30,
                       f"the group's commits to reach {new}")
    finally:
        query.stop()


@pytest.mark.skip_on_embedded("the embedded Tansu broker does not support CreatePartitions "
                              "(IncompatibleBrokerVersion), so the topic cannot grow there")
def test_a_topic_growing_again_and_again_under_a_running_query_loses_nothing(
        spark, bootstrap_servers, group_timeouts, tmp_path):
    # A partition count that keeps changing while records keep coming (issue 38 item 6): each
    # new partition is adopted at the next trigger, from offset 0, and every record is read
    # exactly once, those written to a partition before the query saw it included.
    topic = unique_topic_name("growing")
    create_topic(bootstrap_servers, topic, partitions=1)
    group = unique_topic_name("g-growing")
    out = str(tmp_path / "out")
    query = start_stream(spark, stream_options(
        bootstrap_servers, topic, group_timeouts,
        **{"kafka.group.id": group, "startingOffsets": "earliest"}), str(tmp_path / "ck"), out)
    produced: dict[int, int] = {0: 0}
    try:
        for count in (1, 2, 4, 7, 8):
            if count > len(produced):
                grow_topic(bootstrap_servers, topic, count)
                produced.update({p: 0 for p in range(len(produced), count)})
            # at once into the new partitions: the query sees them only at its next trigger
            batch = {p: 5 for p in produced}
            produce_counts(bootstrap_servers, topic, batch, start=produced, one_per_batch=False)
            for p in batch:
                produced[p] += batch[p]
            total = sum(produced.values())
            wait_until(lambda: query.exception() or len(sink_rows(spark, out)) >= total, 90,
                       f"{total} records over {count} partitions")
            assert query.exception() is None, query.exception()
        rows = sink_rows(spark, out)
        assert len(rows) == len(set(rows)) == sum(produced.values())     # none twice
        assert sorted(rows) == expected_rows(produced)                   # none lost
        wait_until(lambda: committed(bootstrap_servers, group, topic) == produced, 30,
                   f"the group's commits to reach {produced}")
    finally:
        query.stop()
