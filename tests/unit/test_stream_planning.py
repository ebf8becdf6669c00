"""The stream reader's driver side: offsets from trigger to trigger, commits, rebalances.

A real :class:`KafkaStreamReader` is driven the way Spark drives it (``initialOffset``, then
``latestOffset(start, limit)`` / ``partitions(start, end)`` / ``commit(end)`` per trigger), with
its broker client replaced by a :class:`FakeCluster` that also answers Metadata, and its group
member replaced by :class:`FakeMember`, whose assignment the test scripts -- or, where the
member's own handling of the coordinator's answers matters (fencing, failed commits), by a real
:class:`~kafka_source.group.member.GroupMember` talking to the in-process fake coordinator of
``fake_coordinator.py``.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from kafka_source.spark_features import ReadAllAvailable, ReadMaxRows, ReadMinRows

import kafka_source.read.stream as stream_module
from kafka_source.errors import BrokerUnavailableError, DataLossError, OptionError, TopicError
from kafka_source.config.options import parse_stream_options
from kafka_source.group.assignors import Assignment, RangeAssignor, Subscription
from kafka_source.group.member import GroupMember
from kafka_source.read.stream import KafkaStreamReader, decode_offsets, encode_offsets

from .fake_cluster import FakeCluster, FakeLog, unreachable
from .fake_coordinator import (COORDINATOR_NOT_AVAILABLE, JOIN, LEAVE, NONE, OFFSET_COMMIT,
                               STABLE, FakeCoordinator, RawMember)

LEADER_NOT_AVAILABLE = 5


# --- fakes ---------------------------------------------------------------------------------------

class Cluster(FakeCluster):
    """FakeCluster with Metadata; each log is described by its start and end offsets only."""

    def __init__(self, partitions: dict | None = None):
        super().__init__({})
        self.closed = False
        for tp, end in (partitions or {}).items():
            self.set(tp, end)

    def set(self, tp, end, *, log_start=None):
        """Create or change a partition: its log ends at ``end`` (and starts at ``log_start``)."""
        log = self.logs.setdefault(tp, FakeLog())
        log.high_watermark = end
        if log_start is not None:
            log.log_start = log_start

    def delete_topic(self, topic):
        for tp in [tp for tp in self.logs if tp[0] == topic]:
            del self.logs[tp]

    def close(self):
        self.closed = True


class FakeMember:
    """Stands in for :class:`kafka_source.group.member.GroupMember`.

    ``assign(...)`` scripts the assignment the next ``ensure_active`` (the next rejoin) returns;
    until then ``assignment`` is the old one, as with a rebalance the heartbeat thread noticed.
    ``group`` holds the group's committed offsets (other members may commit there too), and
    ``epochs`` the leader epoch committed with each (KIP-320; absent: -1).
    """

    def __init__(self, assignment=(), committed=None):
        self._next = tuple(sorted(assignment))
        self.assignment: tuple = ()
        self.stable = False
        self.group: dict = dict(committed or {})
        self.epochs: dict = {}
        self.commits: list[dict] = []
        self.committed_calls: list[list] = []
        self.ensure_calls: list = []
        self.left: list[str] = []
        self.closed = False
        self.refuse_commits = False
        self.settles = 0
        self.generations_lost = 0
        self.generations_lost_at_assignment = 0

    def assign(self, *tps):
        self._next = tuple(sorted(tps))

    def fence(self):
        """The coordinator took the generation away (session expired, rejoined too late)."""
        self.generations_lost += 1
        self.stable = False

    def ensure_active(self, topics, counts=None):
        self.ensure_calls.append((sorted(topics), dict(counts or {})))
        self.assignment = self._next
        self.stable = True
        self.generations_lost_at_assignment = self.generations_lost
        return self.assignment

    def committed_positions(self, tps):
        tps = sorted(tps)
        self.committed_calls.append(tps)
        return {tp: None if tp not in self.group else (self.group[tp], self.epochs.get(tp, -1))
                for tp in tps}

    def commit(self, offsets, epochs=None):
        if self.refuse_commits:
            return False
        self.commits.append(dict(offsets))
        self.group.update(offsets)
        for tp in offsets:
            self.epochs[tp] = (epochs or {}).get(tp, -1)
        return True

    def commit_async(self, offsets, on_done=None, epochs=None):
        # Answered at once: GroupMember's own asynchrony is tested in test_group.py.
        accepted = self.commit(offsets, epochs)
        if on_done is not None:
            on_done(accepted)

    def settle_commits(self):
        self.settles += 1

    def assignment_is_current(self):
        return self.stable and self._next == self.assignment

    def leave(self, reason=""):
        self.left.append(reason)
        self.assignment = ()
        self.stable = False

    def close(self, *, retry_commit=True):
        self.closed = True
        self.closed_retrying_commit = retry_commit
        self.leave("closed")


class Clock:
    def __init__(self):
        self.ms = 1_000_000

    def __call__(self):
        return self.ms

    def advance(self, ms):
        self.ms += ms


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(stream_module, "_now_ms", c)
    return c


def make_reader(cluster, member, **options) -> KafkaStreamReader:
    merged = {"kafka.bootstrap.servers": "fake:9092", **options}
    if not {"subscribePattern", "assign"} & options.keys():
        merged.setdefault("subscribe", "t")
    reader = KafkaStreamReader(parse_stream_options(merged))
    reader._client = cluster
    reader._member = member
    return reader


def o(**per_topic):
    """Offsets as Spark's JSON dict: o(t={0: 5, 1: 7}) -> {"t": {"0": 5, "1": 7}}."""
    return encode_offsets({(t, p): v for t, parts in per_topic.items() for p, v in parts.items()})


def ranges(reader, start, end):
    """(topic, partition, from, until) of every task ``partitions(start, end)`` plans."""
    return [(r.topic, r.partition, r.start, r.end)
            for part in reader.partitions(start, end) for r in part.ranges]


class Spark:
    """Spark's micro-batch loop, as far as the source sees it."""

    def __init__(self, reader, start=None, *, limit=None, call_commit=True):
        self.reader = reader
        self.start = reader.initialOffset() if start is None else start
        self.limit = limit
        self.call_commit = call_commit
        self.batches = 0

    def trigger(self):
        """One trigger: the ranges read, or None when Spark runs no batch (end == start)."""
        limit = self.limit if self.limit is not None else self.reader.getDefaultReadLimit()
        end = self.reader.latestOffset(self.start, limit)
        if end == self.start:
            return None
        read = ranges(self.reader, self.start, end)
        if self.call_commit and self.batches > 0:
            # Spark commits the previous batch's end once the next batch is planned.
            self.reader.commit(self.start)
        self.start, self.batches = end, self.batches + 1
        return read


T0, T1, T2 = ("t", 0), ("t", 1), ("t", 2)


# --- initialOffset -------------------------------------------------------------------------------

@pytest.fixture
def three():
    """Topic t: partitions 0-2, each log holding offsets [3, 10)."""
    c = Cluster()
    for tp in (T0, T1, T2):
        c.set(tp, 10, log_start=3)
    return c


@pytest.mark.parametrize("starting, expected", [
    ("earliest", {0: 3, 2: 3}),
    ("latest", {0: 10, 2: 10}),
    ('{"t":{"0":4,"1":5,"2":-1}}', {0: 4, 2: 10}),
    ('{"t":{"0":-2,"1":5,"2":7}}', {0: 3, 2: 7}),
])
def test_initial_offset_covers_the_assigned_partitions_only(three, starting, expected):
    member = FakeMember([T0, T2])
    reader = make_reader(three, member, startingOffsets=starting)
    assert reader.initialOffset() == o(t=expected)
    assert member.ensure_calls == [(["t"], {"t": 3})]
    assert member.commits == []


def test_initial_offset_json_must_name_unassigned_partitions_too(three):
    member = FakeMember([T0, T2])   # t-1 belongs to another member, but the JSON must name it
    reader = make_reader(three, member, startingOffsets='{"t":{"0":4,"2":5}}')
    with pytest.raises(OptionError) as info:
        reader.initialOffset()
    assert "'startingOffsets'" in str(info.value) and "t-1" in str(info.value)


def test_initial_offset_json_below_log_start(three, caplog):
    reader = make_reader(three, FakeMember([T0]), startingOffsets='{"t":{"0":1,"1":5,"2":5}}')
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        reader.initialOffset()
    reader = make_reader(three, FakeMember([T0]), startingOffsets='{"t":{"0":1,"1":5,"2":5}}',
                         failOnDataLoss="false")
    with caplog.at_level(logging.WARNING):
        assert reader.initialOffset() == o(t={0: 3})
    assert "t-0" in caplog.text


@pytest.mark.parametrize("reset, expected", [("earliest", {0: 7, 2: 3}),
                                             ("latest", {0: 7, 2: 10})])
def test_initial_offset_group_uses_committed_else_reset(three, reset, expected):
    member = FakeMember([T0, T2], committed={T0: 7, T1: 9})
    reader = make_reader(three, member, **{"kafka.group.id": "g",
                                           "kafka.auto.offset.reset": reset})
    assert reader.initialOffset() == o(t=expected)
    assert member.committed_calls == [[T0, T2]]   # only what this member owns
    assert member.commits == []


def test_initial_offset_group_without_commit_and_reset_none(three):
    member = FakeMember([T0, T2], committed={T0: 7})
    reader = make_reader(three, member, **{"kafka.group.id": "g",
                                           "kafka.auto.offset.reset": "none"})
    with pytest.raises(OptionError) as info:
        reader.initialOffset()
    assert "'kafka.auto.offset.reset'" in str(info.value) and "t-2" in str(info.value)
    assert "'g'" in str(info.value)


def test_initial_offset_group_committed_below_log_start(three, caplog):
    options = {"kafka.group.id": "g"}
    reader = make_reader(three, FakeMember([T0], committed={T0: 1}), **options)
    with pytest.raises(DataLossError):
        reader.initialOffset()
    reader = make_reader(three, FakeMember([T0], committed={T0: 1}), failOnDataLoss="false",
                         **options)
    with caplog.at_level(logging.WARNING):
        assert reader.initialOffset() == o(t={0: 3})


def test_initial_offset_group_committed_beyond_log_end(three):
    options = {"kafka.group.id": "g"}
    reader = make_reader(three, FakeMember([T0], committed={T0: 50}), **options)
    with pytest.raises(DataLossError, match="recreated"):
        reader.initialOffset()
    reader = make_reader(three, FakeMember([T0], committed={T0: 50}), failOnDataLoss="false",
                         **options)
    assert reader.initialOffset() == o(t={0: 10})


def test_read_committed_committed_offset_past_open_transactions_is_no_data_loss():
    # A read_uncommitted member of the group committed 15; transactions still open hold the
    # last stable offset at 10 while the log ends at 20. It used to be "recreated or
    # truncated" (issue 17, item 6); only past the log's end is it data loss.
    cluster = Cluster({T0: 20})
    cluster.logs[T0].last_stable = 10
    member = FakeMember([T0], committed={T0: 15})
    spark = Spark(make_reader(cluster, member, **{"kafka.group.id": "g",
                                                  "kafka.isolation.level": "read_committed"}))
    assert spark.start == o(t={0: 15})
    assert spark.trigger() is None                    # waits at 15 while the LSO is behind it
    assert spark.start == o(t={0: 15})
    cluster.logs[T0].last_stable = 20                 # the transactions ended
    assert spark.trigger() == [("t", 0, 15, 20)]
    beyond = FakeMember([T0], committed={T0: 25})
    with pytest.raises(DataLossError, match="recreated"):
        make_reader(cluster, beyond, **{"kafka.group.id": "g",
                                        "kafka.isolation.level": "read_committed"}
                    ).initialOffset()


def test_initial_offset_missing_topic_is_a_clear_error_at_once(three):
    # A broker that knows the cluster (its answer lists brokers, its whole topic list has
    # topics) answers UNKNOWN_TOPIC_OR_PARTITION: the topic does not exist, and retrying would
    # only delay saying so.
    reader = make_reader(three, FakeMember([T0]), subscribe="t,nope",
                         **{"fetchOffset.retryIntervalMs": "0", "fetchOffset.numRetries": "2"})
    with pytest.raises(TopicError, match="'nope' does not exist"):
        reader.initialOffset()
    assert three.metadata_calls == [["nope", "t"], None]


def test_planning_outlasts_a_restarting_broker(three):
    # Connections refused, then the answer of a broker that does not know the cluster yet
    # (client.metadata raises RetriableBrokerError for both): retried, at start and at triggers.
    three.metadata_failures = [unreachable(), unreachable("no brokers in the answer")]
    reader = make_reader(three, FakeMember([T0]), startingOffsets="earliest",
                         **{"fetchOffset.retryIntervalMs": "0"})
    assert reader.initialOffset() == o(t={0: 3})
    three.metadata_failures = [unreachable()] * 3
    assert reader.latestOffset(o(t={0: 3}), ReadAllAvailable()) == o(t={0: 10})
    assert len(three.metadata_calls) == 7


def test_planning_gives_up_on_a_broker_gone_for_longer_than_the_retries(three):
    three.metadata_failures = [unreachable()] * 3
    reader = make_reader(three, FakeMember([T0]), startingOffsets="earliest",
                         **{"fetchOffset.retryIntervalMs": "0", "fetchOffset.numRetries": "2",
                            "kafka.request.timeout.ms": "0"})
    with pytest.raises(BrokerUnavailableError, match=r"3 attempts.*'fetchOffset.numRetries' = 2"):
        reader.initialOffset()


def test_initial_offset_pattern_skips_internal_topics_and_needs_a_match(three):
    three.set(("tx", 0), 4)
    three.set(("other", 0), 4)
    member = FakeMember([T0, ("tx", 0)])
    reader = make_reader(three, member, subscribePattern="t.*|__.*", startingOffsets="earliest")
    assert reader.initialOffset() == o(t={0: 3}, tx={0: 0})
    assert member.ensure_calls == [(["t", "tx"], {"t": 3, "tx": 1})]

    nothing = make_reader(three, FakeMember(), subscribePattern="zzz.*")
    with pytest.raises(TopicError, match="'subscribePattern'"):
        nothing.initialOffset()


def test_initial_offset_assign_mode(three):
    member = FakeMember([T0, T2])       # the manual assignment comes back from the member
    reader = make_reader(three, member, assign='{"t":[0,2]}', startingOffsets="earliest")
    assert reader.initialOffset() == o(t={0: 3, 2: 3})

    reader = make_reader(three, FakeMember([T0, ("t", 7)]), assign='{"t":[0,7]}')
    with pytest.raises(TopicError) as info:
        reader.initialOffset()
    assert "'assign'" in str(info.value) and "t-7" in str(info.value)


def test_assigned_partitions_missing_from_metadata_are_ignored(three):
    # An assignment computed from older metadata may name a partition that is gone.
    member = FakeMember([T0, ("t", 9), ("gone", 0)])
    reader = make_reader(three, member, startingOffsets="earliest")
    assert reader.initialOffset() == o(t={0: 3})


def test_initial_offset_retries_transient_metadata_errors(three):
    three.topic_errors["t"] = [LEADER_NOT_AVAILABLE, LEADER_NOT_AVAILABLE]
    reader = make_reader(three, FakeMember([T0]), startingOffsets="earliest",
                         **{"fetchOffset.retryIntervalMs": "0"})
    assert reader.initialOffset() == o(t={0: 3})
    assert len(three.metadata_calls) == 3


# --- commits -------------------------------------------------------------------------------------

def test_commits_follow_completed_batches_once_each():
    cluster = Cluster({T0: 10, T1: 20})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, **{"kafka.group.id": "g",
                                             "kafka.auto.offset.reset": "earliest"})
    spark = Spark(reader)
    assert spark.start == o(t={0: 0, 1: 0})

    # Trigger 1: start is the query's starting point, not a completed batch: nothing committed.
    assert spark.trigger() == [("t", 0, 0, 10), ("t", 1, 0, 20)]
    assert member.commits == []

    # Trigger 2: batch 1 completed -> its end is committed, before anything else.
    cluster.set(T0, 15)
    assert spark.trigger() == [("t", 0, 10, 15)]
    assert member.commits == [{T0: 10, T1: 20}]
    # Spark's own commit of batch 1's end (made as batch 2 is planned) repeats nothing.
    assert len(member.commits) == 1

    # Idle triggers: batch 2's end is committed once, then nothing more.
    assert spark.trigger() is None
    assert spark.trigger() is None
    assert member.commits == [{T0: 10, T1: 20}, {T0: 15}]
    reader.commit(spark.start)
    assert member.commits == [{T0: 10, T1: 20}, {T0: 15}]
    # Every trigger first applies the answer to the commit before (an idle stream sends none).
    assert member.settles == 4


def test_idle_start_is_never_committed():
    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member))   # startingOffsets latest: 10
    for _ in range(3):
        assert spark.trigger() is None
    assert member.commits == []


def test_commit_offsets_false_never_commits():
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, startingOffsets="earliest", commitOffsets="false")
    spark = Spark(reader)
    spark.trigger()
    cluster.set(T0, 12)
    spark.trigger()
    spark.trigger()
    member.assign(T0)
    spark.trigger()
    reader.commit(spark.start)
    assert member.commits == []


def test_completed_offsets_of_a_partition_about_to_be_lost_are_committed_first():
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0, T1])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest"))
    spark.trigger()                      # batch 1 reads both to 10
    member.assign(T0)                    # a rebalance the heartbeat noticed: t-1 goes away
    cluster.set(T0, 12)
    cluster.set(T1, 30)
    assert spark.trigger() == [("t", 0, 10, 12)]
    # Batch 1's end of t-1 was committed while t-1 was still owned (the next owner starts there).
    assert member.commits[0] == {T0: 10, T1: 10}
    assert spark.start == o(t={0: 12})


def test_partitions_no_longer_owned_are_not_committed():
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, startingOffsets="earliest")
    spark = Spark(reader)
    spark.trigger()
    member.assign(T0)
    member.stable = False                # fenced: the member must rejoin before it may commit
    old_start = spark.start
    spark.trigger()
    assert member.commits == [{T0: 10}]
    # Spark's late commit of an end that still lists t-1 commits nothing for it either.
    reader.commit(encode_offsets({**decode_offsets(old_start), T1: 99}))
    assert all(T1 not in c for c in member.commits)


def test_refused_commit_is_retried_later():
    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest"))
    spark.trigger()
    member.refuse_commits = True
    assert spark.trigger() is None
    assert member.commits == []
    member.refuse_commits = False
    assert spark.trigger() is None
    assert member.commits == [{T0: 10}]


# --- rebalances ----------------------------------------------------------------------------------

def test_lost_partition_is_dropped_from_the_end_offsets():
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0, T1])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest"))
    spark.trigger()
    member.assign(T1)
    cluster.set(T0, 20)
    cluster.set(T1, 20)
    read = spark.trigger()
    assert spark.start == o(t={1: 20}) and read == [("t", 1, 10, 20)]


@pytest.mark.parametrize("committed, reset, adopted_at", [
    (6, "latest", 6),            # the group's committed offset
    (None, "latest", 10),        # no commit: kafka.auto.offset.reset
    (None, "earliest", 0),
])
def test_gained_partition_enters_with_an_empty_range(committed, reset, adopted_at):
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0], committed={T1: committed} if committed is not None else {})
    reader = make_reader(cluster, member, startingOffsets="earliest",
                         **{"kafka.auto.offset.reset": reset})
    spark = Spark(reader)
    spark.trigger()
    member.assign(T0, T1)
    cluster.set(T0, 12)
    start = spark.start
    read = spark.trigger()
    assert spark.start == o(t={0: 12, 1: adopted_at})
    assert read == [("t", 0, 10, 12)]          # nothing of t-1 in the batch that adopts it
    assert ranges(reader, start, spark.start) == read
    cluster.set(T1, 15)
    assert spark.trigger() == [("t", 1, adopted_at, 15)]


def test_gained_partition_without_commit_and_reset_none_fails():
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest",
                              **{"kafka.auto.offset.reset": "none"}))
    spark.trigger()
    member.assign(T0, T1)
    with pytest.raises(OptionError, match="'kafka.auto.offset.reset'"):
        spark.trigger()


def test_lost_then_regained_partition_starts_at_the_groups_committed_offset():
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0, T1])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest"))
    spark.trigger()                                   # both read to 10
    member.assign(T0)
    spark.trigger()                                   # t-1 dropped (10 committed before)
    assert spark.start == o(t={0: 10})
    cluster.set(T1, 40)
    member.group[T1] = 35                             # its other owner read on to 35
    member.assign(T0, T1)
    assert spark.trigger() == []                      # adopted: empty range
    assert spark.start == o(t={0: 10, 1: 35})
    assert spark.trigger() == [("t", 1, 35, 40)]


def test_start_listing_a_partition_not_owned_last_trigger_is_not_trusted():
    # The start still lists t-1 at 10, but this member did not own t-1 at the last trigger: the
    # offset is stale (another member may have read on). Dropped for one trigger, then adopted
    # from the group's committed offset.
    cluster = Cluster({T0: 10, T1: 40})
    member = FakeMember([T0], committed={T1: 35})
    reader = make_reader(cluster, member, startingOffsets='{"t":{"0":10,"1":10}}')
    assert reader.initialOffset() == o(t={0: 10})
    member.assign(T0, T1)
    stale = o(t={0: 10, 1: 10})
    end = reader.latestOffset(stale, ReadAllAvailable())
    assert end == o(t={0: 10})
    assert ranges(reader, stale, end) == []
    assert all(T1 not in c for c in member.commits)
    end2 = reader.latestOffset(end, ReadAllAvailable())
    assert end2 == o(t={0: 10, 1: 35})
    assert ranges(reader, end, end2) == []
    assert reader.latestOffset(end2, ReadAllAvailable()) == o(t={0: 10, 1: 40})


def test_after_restart_the_checkpoint_wins_for_owned_partitions():
    cluster = Cluster({T0: 50, T1: 50, T2: 50})
    # The group moved on (another query in the same group), but this query's checkpoint says 10.
    member = FakeMember([T0, T1], committed={T0: 30, T1: 30, T2: 7})
    reader = make_reader(cluster, member, **{"kafka.group.id": "g"})
    checkpoint = o(t={0: 10, 2: 10})               # t-2 is no longer ours, t-1 is new to us
    end = reader.latestOffset(checkpoint, ReadAllAvailable())
    assert end == o(t={0: 50, 1: 30})
    assert ranges(reader, checkpoint, end) == [("t", 0, 10, 50)]
    # The checkpoint's batch completed before the restart, but the group's 30 is ahead of it:
    # never committed backwards (issue 17); committed again once the query passes it.
    assert member.commits == []
    assert member.committed_calls == [[T0, T2], [T1]]
    assert reader.latestOffset(end, ReadAllAvailable()) == o(t={0: 50, 1: 50})
    assert member.commits == [{T0: 50, T1: 30}]


def test_after_restart_the_checkpoint_is_committed_when_the_group_is_behind_it():
    cluster = Cluster({T0: 50})
    member = FakeMember([T0], committed={T0: 5})
    reader = make_reader(cluster, member, **{"kafka.group.id": "g"})
    reader.latestOffset(o(t={0: 10}), ReadAllAvailable())
    assert member.commits == [{T0: 10}]


# --- fencing (a real GroupMember against the fake coordinator) ----------------------------------

GROUP = "g"
T4 = [("t", p) for p in range(4)]


@pytest.fixture
def coordinator():
    fake = FakeCoordinator({"t": 4})
    yield fake
    fake.shutdown()


@pytest.fixture
def member_reader(coordinator):
    """member_reader(cluster, **options): a reader whose member is a real GroupMember of group
    'g' on the fake coordinator (stopped after the test, which ends its heartbeat thread)."""
    made = []

    def make(cluster, **options):
        opts = {"kafka.group.id": GROUP, "kafka.session.timeout.ms": "10000",
                "kafka.heartbeat.interval.ms": "20", "kafka.max.poll.interval.ms": "2000",
                **options}
        reader = make_reader(cluster, None, **opts)
        reader._member = GroupMember(
            coordinator.client("query"), lambda: coordinator.client("query-heartbeat"),
            reader.options.group, RangeAssignor(), request_timeout_ms=2_000, retry_backoff_ms=1)
        made.append(reader)
        return reader

    yield make
    for reader in made:
        reader.stop()


def wait_until(condition, what, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def commits_of(coordinator, client_id) -> list[dict]:
    """The offsets of every OffsetCommit ``client_id`` sent, in order."""
    return [{(t.name, p.partition_index): p.committed_offset
             for t in r.request.topics for p in t.partitions}
            for r in coordinator.records(OFFSET_COMMIT) if r.client_id == client_id]


def test_fenced_member_neither_commits_nor_reads_its_stale_offsets(coordinator, member_reader):
    # As measured on Kafka 2.2: while the query's second micro-batch runs longer than
    # kafka.max.poll.interval.ms, another consumer joins; the coordinator drops the query's
    # member, gives the other one all four partitions, which it reads to the end, commits (500)
    # and leaves. The query rejoins and gets the same four partitions back: its offsets of them
    # (200) are stale. It used to commit them (the group went from 500 back to 200) and to read
    # 200..500 again.
    cluster = Cluster({tp: 500 for tp in T4})
    reader = member_reader(cluster, startingOffsets="earliest", maxOffsetsPerTrigger="400")
    spark = Spark(reader)
    assert spark.trigger() == [("t", p, 0, 100) for p in range(4)]
    assert spark.trigger() == [("t", p, 100, 200) for p in range(4)]   # the long batch
    assert coordinator.group(GROUP).offsets == {tp: 100 for tp in T4}
    member = reader.member
    assert member.generations_lost == 0

    coordinator.remove_member(GROUP, member.generation.member_id)   # dropped while it ran
    wait_until(lambda: member.generations_lost == 1, "the heartbeat to notice the fencing")
    other = RawMember(coordinator, GROUP, [("range", Subscription(("t",)).encode())])
    assert other.join().error_code == NONE
    assert other.sync({other.member_id: Assignment(tuple(T4)).encode()}).error_code == NONE
    assert other.commit({tp: 500 for tp in T4}) == [NONE] * 4
    other.leave()
    fenced_at = len(commits_of(coordinator, "query"))

    # The query comes back and gets all four partitions again: none of its offsets is trusted.
    assert spark.trigger() == []                     # dropped for a trigger (Spark's commit of
    assert reader.member.assignment == tuple(T4)     # the batch's end 200 commits nothing)...
    assert spark.trigger() == []                     # ... then adopted at the group's 500
    assert decode_offsets(spark.start) == {tp: 500 for tp in T4}
    for tp in T4:
        cluster.set(tp, 510)
    assert spark.trigger() == [("t", p, 500, 510) for p in range(4)]
    assert spark.trigger() is None
    assert coordinator.group(GROUP).offsets == {tp: 510 for tp in T4}
    after = commits_of(coordinator, "query")[fenced_at:]
    assert after and all(off >= 500 for c in after for off in c.values()), after


def test_fenced_member_that_nobody_replaced_goes_on_where_it_was(coordinator, member_reader):
    # Fenced while a batch ran (a GC pause, a frozen VM: found by the cluster scenarios), and
    # no other member read or committed meanwhile: the group still says 100, the query's sink
    # holds everything up to 200. Adopting at the group's 100 read 100..200 into the sink again.
    cluster = Cluster({tp: 500 for tp in T4})
    reader = member_reader(cluster, startingOffsets="earliest", maxOffsetsPerTrigger="400")
    spark = Spark(reader)
    assert spark.trigger() == [("t", p, 0, 100) for p in range(4)]
    assert spark.trigger() == [("t", p, 100, 200) for p in range(4)]   # the long batch
    member = reader.member
    coordinator.remove_member(GROUP, member.generation.member_id)
    wait_until(lambda: member.generations_lost == 1, "the heartbeat to notice the fencing")
    assert spark.trigger() == []                     # dropped for a trigger, then adopted ...
    assert spark.trigger() == []
    assert decode_offsets(spark.start) == {tp: 200 for tp in T4}    # ... where it was
    for begin in (200, 300, 400):
        assert spark.trigger() == [("t", p, begin, begin + 100) for p in range(4)]
    assert spark.trigger() is None
    assert coordinator.group(GROUP).offsets == {tp: 500 for tp in T4}


def test_fenced_member_keeps_the_partitions_of_the_generation_it_rejoined_in(coordinator,
                                                                             member_reader):
    # Once re-adopted in the new generation, the partitions are trusted again: no second drop.
    cluster = Cluster({tp: 50 for tp in T4})
    reader = member_reader(cluster, startingOffsets="earliest")
    spark = Spark(reader)
    assert spark.trigger() == [("t", p, 0, 50) for p in range(4)]
    member = reader.member
    coordinator.remove_member(GROUP, member.generation.member_id)
    wait_until(lambda: member.generations_lost == 1, "the heartbeat to notice the fencing")
    assert spark.trigger() == []                     # dropped: nothing was committed for them
    assert spark.trigger() == []                     # adopted: no commit -> reset (latest), 50
    assert coordinator.group(GROUP).offsets == {}
    for tp in T4:
        cluster.set(tp, 60)
    assert spark.trigger() == [("t", p, 50, 60) for p in range(4)]
    assert spark.trigger() is None
    assert coordinator.group(GROUP).offsets == {tp: 60 for tp in T4}
    assert member.generations_lost == 1


def test_fenced_member_commits_nothing_when_spark_commits_late():
    # Spark's commit(end) of the batch that ran while the member was fenced comes after the
    # trigger that learnt of it: the end's offsets are stale too.
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, startingOffsets="earliest")
    spark = Spark(reader, call_commit=False)
    spark.trigger()
    cluster.set(T0, 20)
    spark.trigger()                              # commits 10; reads 10..20 of t-0
    done = spark.start
    member.fence()
    reader.commit(done)                          # not yet known at a trigger: fenced already
    member.group.update({T0: 30, T1: 30})        # what another member read meanwhile
    cluster.set(T0, 30)
    cluster.set(T1, 30)
    assert reader.latestOffset(done, ReadAllAvailable()) == {}
    reader.commit(done)
    assert member.commits == [{T0: 10, T1: 10}]
    end = reader.latestOffset({}, ReadAllAvailable())
    assert end == o(t={0: 30, 1: 30})
    assert member.commits == [{T0: 10, T1: 10}]


# --- commits the coordinator cannot write (a real GroupMember against the fake coordinator) -------

def test_triggers_go_on_while_the_coordinator_cannot_write_commits(coordinator, member_reader,
                                                                   caplog):
    # The offsets topic lacks in-sync replicas: OffsetCommit answers COORDINATOR_NOT_AVAILABLE
    # for longer than kafka.default.api.timeout.ms, while every data partition is readable.
    # That used to fail the query (the commit was retried synchronously for the api timeout).
    cluster = Cluster({tp: 10 for tp in T4})
    reader = member_reader(cluster, startingOffsets="earliest",
                           **{"kafka.default.api.timeout.ms": "200"})
    spark = Spark(reader)
    assert spark.trigger() == [("t", p, 0, 10) for p in range(4)]
    history = []

    def trigger_with_new_records():
        for tp in T4:
            cluster.set(tp, decode_offsets(spark.start)[tp] + 5)
        began = time.monotonic()
        read = spark.trigger()
        assert time.monotonic() - began < 0.5            # never waits out the api timeout
        history.append(dict(coordinator.group(GROUP).offsets))
        return read

    assert trigger_with_new_records() == [("t", p, 10, 15) for p in range(4)]
    assert coordinator.group(GROUP).offsets == {tp: 10 for tp in T4}
    coordinator.commit_error = 15                        # COORDINATOR_NOT_AVAILABLE
    start = time.monotonic()
    triggers = 0
    while time.monotonic() - start < 0.6:                # three api timeouts
        end = decode_offsets(spark.start)[T0]
        assert trigger_with_new_records() == [("t", p, end, end + 5) for p in range(4)]
        triggers += 1
        time.sleep(0.03)
    assert coordinator.group(GROUP).offsets == {tp: 10 for tp in T4}   # the last one written
    assert reader.member.stable and reader.member.generations_lost == 0
    assert f"Group '{GROUP}': commit of t-0@15, t-1@15, t-2@15, t-3@15 failed " \
        "(CoordinatorNotAvailableError" in caplog.text

    coordinator.commit_error = None                      # it recovers
    assert spark.trigger() is None                       # idle: commits the newest end
    newest = decode_offsets(spark.start)
    assert spark.trigger() is None
    assert coordinator.group(GROUP).offsets == newest
    history.append(dict(coordinator.group(GROUP).offsets))
    for tp in T4:                                        # never backwards
        seen = [h[tp] for h in history if tp in h]
        assert seen == sorted(seen), seen
    assert triggers >= 3


# --- static membership (a real GroupMember against the fake coordinator) --------------------------

@pytest.mark.parametrize("instance_id", [None, "query-1"])
def test_restarted_static_query_resumes_its_partitions_without_a_rebalance(coordinator,
                                                                           member_reader,
                                                                           instance_id):
    cluster = Cluster({tp: 100 for tp in T4})
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "200"}
    if instance_id is not None:
        options["kafka.group.instance.id"] = instance_id
    reader = member_reader(cluster, **options)
    spark = Spark(reader)
    assert spark.trigger() == [("t", p, 0, 50) for p in range(4)]
    assert spark.trigger() == [("t", p, 50, 100) for p in range(4)]
    generation = reader.member.generation.generation_id
    rebalances = coordinator.group(GROUP).completed_rebalances
    reader.stop()                          # batch 1 completed; its end is not committed yet
    assert coordinator.group(GROUP).offsets == {tp: 50 for tp in T4}
    static = instance_id is not None
    # A static member stays in the group, its partitions unread by anyone, until its session
    # times out; a dynamic one leaves, and the group rebalances at once.
    assert (coordinator.sent(LEAVE) == []) == static
    assert (coordinator.state(GROUP) == STABLE) == static

    for tp in T4:
        cluster.set(tp, 150)
    restarted = member_reader(cluster, **options)
    again = Spark(restarted, start=spark.start)              # from its checkpoint
    assert again.trigger() == [("t", p, 100, 150) for p in range(4)]
    assert coordinator.group(GROUP).offsets == {tp: 100 for tp in T4}   # the checkpoint's end
    assert again.trigger() is None
    assert coordinator.group(GROUP).offsets == {tp: 150 for tp in T4}
    member = restarted.member
    if static:                             # the same generation: no rebalance at all
        assert member.generation.generation_id == generation
        assert coordinator.group(GROUP).completed_rebalances == rebalances
        assert coordinator.group(GROUP).static_members == {instance_id:
                                                          member.generation.member_id}
    else:                                  # left (a rebalance to Empty), joined (another)
        assert member.generation.generation_id == generation + 2
        assert coordinator.group(GROUP).completed_rebalances == rebalances + 1


def test_a_second_query_with_the_instance_id_fails_the_first_at_its_next_triggers(
        coordinator, member_reader):
    cluster = Cluster({tp: 100 for tp in T4})
    reader = member_reader(cluster, startingOffsets="earliest",
                           **{"kafka.group.instance.id": "query-1"})
    spark = Spark(reader)
    assert spark.trigger() == [("t", p, 0, 100) for p in range(4)]
    second = RawMember(coordinator, GROUP, [("range", Subscription(("t",)).encode())],
                       client_id="second-query", instance_id="query-1")
    assert second.join().error_code == NONE            # takes the first one's place
    synced = second.sync()
    assert synced.error_code == NONE
    assert Assignment.decode(bytes(synced.assignment)).partitions == tuple(T4)
    joins = len(coordinator.sent(JOIN, client_id="query"))

    with pytest.raises(OptionError) as info:
        for _ in range(400):                           # a trigger every 5 ms, at most 2 s
            spark.trigger()
            time.sleep(0.005)
    message = str(info.value)
    assert "'kafka.group.instance.id' = 'query-1'" in message
    assert "FENCED_INSTANCE_ID" in message and "another member" in message
    with pytest.raises(OptionError, match="FENCED_INSTANCE_ID"):       # and it stays failed
        reader.latestOffset(spark.start, ReadAllAvailable())
    assert len(coordinator.sent(JOIN, client_id="query")) == joins      # it never rejoined
    assert coordinator.group(GROUP).static_members == {"query-1": second.member_id}
    assert second.heartbeat() == NONE


# --- new partitions ------------------------------------------------------------------------------

def test_new_partition_starts_at_its_log_start():
    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member))            # latest; reset latest
    assert spark.start == o(t={0: 10})
    cluster.set(T1, 5)                                     # created after the query started
    member.assign(T0, T1)
    assert spark.trigger() == []
    assert spark.start == o(t={0: 10, 1: 0})               # not 5 (auto.offset.reset=latest)
    assert member.ensure_calls[-1] == (["t"], {"t": 2})
    assert spark.trigger() == [("t", 1, 0, 5)]


def test_new_partition_first_owned_elsewhere_is_still_read_from_its_start():
    # t-1 and t-2 are created after the query started; t-1 goes to another member, t-2 to this
    # one. The other member stops before completing a batch of t-1 (no commit). When t-1 comes
    # here it is still a partition created after the start: read from its log start, not
    # kafka.auto.offset.reset=latest (which would skip its first 8 records) -- the same as if
    # this member had not adopted t-2 in between.
    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member))
    cluster.set(T1, 5)
    cluster.set(T2, 5)
    member.assign(T0, T2)
    spark.trigger()
    assert spark.start == o(t={0: 10, 2: 0})
    cluster.set(T1, 8)
    member.assign(T0, T1, T2)
    spark.trigger()
    assert spark.start == o(t={0: 10, 1: 0, 2: 5})


T3 = ("t", 3)


@pytest.mark.parametrize("available_now", [True, False])
def test_partitions_created_while_the_query_was_down_start_at_their_log_start(available_now):
    # One checkpoint, two runs: t had partitions 0-1 at the first; 2-3 were created (and
    # written to) before the second. Without a committed offset they are new to the query:
    # from their log start, not kafka.auto.offset.reset=latest (which skipped their records).
    cluster = Cluster({T0: 10, T1: 10, T2: 7, T3: 5})
    member = FakeMember([T0, T1, T2, T3], committed={T0: 10, T1: 10})
    reader = make_reader(cluster, member, **{"kafka.group.id": "g"})
    if available_now:
        reader.prepareForTriggerAvailableNow()     # runs before the first latestOffset
    spark = Spark(reader, start=o(t={0: 10, 1: 10}))   # restored: no initialOffset
    assert spark.trigger() == []                   # adopted with an empty range ...
    assert spark.start == o(t={0: 10, 1: 10, 2: 0, 3: 0})
    assert spark.trigger() == [("t", 2, 0, 7), ("t", 3, 0, 5)]   # ... then read from 0
    assert spark.trigger() is None
    assert member.group == {T0: 10, T1: 10, T2: 7, T3: 5}


def test_topic_created_while_the_query_was_down_starts_at_its_log_start():
    cluster = Cluster({("a1", 0): 10, ("a2", 0): 4, ("a2", 1): 3})
    member = FakeMember([("a1", 0), ("a2", 0), ("a2", 1)], committed={("a2", 1): 2})
    reader = make_reader(cluster, member, subscribePattern="a.*")
    spark = Spark(reader, start=o(a1={0: 10}))
    assert spark.trigger() == []
    assert spark.start == o(a1={0: 10}, a2={0: 0, 1: 2})    # a committed offset still wins
    assert spark.trigger() == [("a2", 0, 0, 4), ("a2", 1, 2, 3)]


def test_partition_created_while_the_query_was_down_whose_records_were_deleted(caplog):
    for fail in ("true", "false"):
        cluster = Cluster({T0: 10, T1: 9})
        cluster.set(T1, 9, log_start=4)
        member = FakeMember([T0, T1])
        spark = Spark(make_reader(cluster, member, failOnDataLoss=fail), start=o(t={0: 10}))
        if fail == "true":
            with pytest.raises(DataLossError, match="New partition t-1 starts at offset 4"):
                spark.trigger()
        else:
            with caplog.at_level(logging.WARNING):
                spark.trigger()
            assert spark.start == o(t={0: 10, 1: 4})


def test_partition_of_the_checkpoint_without_a_commit_is_not_new_after_a_restart():
    # Lost to another member and back, without a commit: not created meanwhile, so the reset
    # policy applies (the checkpoint's partitions are the ones the query knew).
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, commitOffsets="false")
    spark = Spark(reader, start=o(t={0: 10, 1: 3}))
    assert spark.trigger() == [("t", 1, 3, 10)]
    member.assign(T0)
    spark.trigger()
    member.assign(T0, T1)
    spark.trigger()
    assert member.group == {} and spark.start == o(t={0: 10, 1: 10})   # latest, not 0


def test_new_partition_with_a_commit_uses_it():
    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member))
    cluster.set(T1, 5)
    member.group[T1] = 3
    member.assign(T0, T1)
    spark.trigger()
    assert spark.start == o(t={0: 10, 1: 3})


def test_new_partition_whose_log_does_not_start_at_zero(caplog):
    for fail in ("true", "false"):
        cluster = Cluster({T0: 10})
        member = FakeMember([T0])
        spark = Spark(make_reader(cluster, member, failOnDataLoss=fail))
        cluster.set(T1, 9, log_start=4)
        member.assign(T0, T1)
        if fail == "true":
            with pytest.raises(DataLossError, match="t-1"):
                spark.trigger()
        else:
            with caplog.at_level(logging.WARNING):
                spark.trigger()
            assert spark.start == o(t={0: 10, 1: 4})
            assert "New partition t-1 starts at offset 4" in caplog.text


def test_new_topic_matching_the_pattern_is_read_from_its_start():
    cluster = Cluster({("a1", 0): 10})
    member = FakeMember([("a1", 0)])
    spark = Spark(make_reader(cluster, member, subscribePattern="a.*"))
    cluster.set(("a2", 0), 3)
    member.assign(("a1", 0), ("a2", 0))
    spark.trigger()
    assert member.ensure_calls[-1] == (["a1", "a2"], {"a1": 1, "a2": 1})
    assert spark.trigger() == [("a2", 0, 0, 3)]


# --- data loss -----------------------------------------------------------------------------------

def test_deleted_topic_is_data_loss(caplog):
    for fail in ("true", "false"):
        cluster = Cluster({T0: 10, ("u", 0): 10})
        member = FakeMember([T0, ("u", 0)])
        spark = Spark(make_reader(cluster, member, subscribe="t,u", startingOffsets="earliest",
                                  failOnDataLoss=fail, **{"fetchOffset.retryIntervalMs": "0"}))
        spark.trigger()
        cluster.delete_topic("u")
        member.assign(T0)
        if fail == "true":
            with pytest.raises(DataLossError, match="u-0"):
                spark.trigger()
        else:
            cluster.set(T0, 11)
            with caplog.at_level(logging.WARNING):
                assert spark.trigger() == [("t", 0, 10, 11)]
            assert spark.start == o(t={0: 11})
            assert "u-0" in caplog.text
            cluster.set(T0, 12)
            assert spark.trigger() == [("t", 0, 11, 12)]      # goes on without 'u'


@pytest.mark.parametrize("subscription", [{"subscribe": "t,u"}, {"subscribePattern": "[tu]"}])
def test_a_broker_that_does_not_know_the_topics_yet_is_not_taken_for_a_deletion(subscription):
    # A ZooKeeper-mode broker just after a restart answers with brokers and every topic unknown
    # (measured on Kafka 2.2); a stream took that for a deleted topic and died (issue 17).
    cluster = Cluster({T0: 10, ("u", 0): 10})
    cluster.view.confirm_ms = 60_000                  # the client's bound: not reached here
    member = FakeMember([T0, ("u", 0)])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest",
                              **{"fetchOffset.retryIntervalMs": "0"}, **subscription))
    assert spark.trigger() == [("t", 0, 0, 10), ("u", 0, 0, 10)]
    cluster.set(T0, 12)
    cluster.set(("u", 0), 13)
    cluster.topic_errors.update(t=[3], u=[3, 3])          # UNKNOWN_TOPIC_OR_PARTITION, twice
    assert spark.trigger() == [("t", 0, 10, 12), ("u", 0, 10, 13)]
    assert all(topics == ["t", "u"] for topics, _ in member.ensure_calls)   # never resubscribed


def _recreate(cluster, topic, ends, topic_id):
    """``topic`` deleted and created again with logs ending at ``ends`` ({partition: end}) and
    a new id, as a Kafka 2.8+ broker answers then."""
    cluster.delete_topic(topic)
    for p, end in ends.items():
        cluster.set((topic, p), end, log_start=0)
    cluster.topic_ids[topic] = topic_id


OLD_ID, NEW_ID = bytes(range(1, 17)), bytes(range(101, 117))


def test_a_topic_created_again_with_a_longer_log_fails_naming_it():
    # The new log ends past the query's position: without topic ids the query would read on
    # from offset 10 of the new topic, skipping its first 10 records without a word.
    cluster = Cluster({T0: 10, ("u", 0): 5})
    cluster.topic_ids.update(t=OLD_ID, u=bytes(16))
    member = FakeMember([T0, ("u", 0)])
    spark = Spark(make_reader(cluster, member, subscribe="t,u", startingOffsets="earliest"))
    assert spark.trigger() == [("t", 0, 0, 10), ("u", 0, 0, 5)]
    _recreate(cluster, "t", {0: 25}, NEW_ID)
    with pytest.raises(DataLossError) as info:
        spark.trigger()
    message = str(info.value)
    # the ids as Kafka's tools print them (URL-safe base64)
    for part in ("'t'", "deleted and created again", "t-0", "failOnDataLoss",
                 "AQIDBAUGBwgJCgsMDQ4PEA", "ZWZnaGlqa2xtbm9wcXJzdA"):
        assert part in message
    assert member.commits == []            # nothing of the old log committed for the new


def test_a_topic_created_again_is_read_from_its_start_without_failing(caplog):
    cluster = Cluster({T0: 10, T1: 10})
    cluster.topic_ids["t"] = OLD_ID
    member = FakeMember([T0, T1])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest", failOnDataLoss="false"))
    assert spark.trigger() == [("t", 0, 0, 10), ("t", 1, 0, 10)]
    assert member.commits == []            # Spark commits batch 1 when it has planned batch 2
    _recreate(cluster, "t", {0: 25, 1: 3, 2: 4}, NEW_ID)     # longer, shorter, one more
    member.assign(T0, T1, ("t", 2))
    with caplog.at_level(logging.WARNING):
        assert spark.trigger() == []                       # a batch that moves to the new start
    assert "deleted and created again" in caplog.text and "t-0, t-1" in caplog.text
    assert spark.start == o(t={0: 0, 1: 0, 2: 0})
    assert member.commits == []            # batch 1's end, 10, is no offset of the new topic
    # every record of the new topic, from offset 0: none skipped (t-0), none waited for (t-1)
    assert spark.trigger() == [("t", 0, 0, 25), ("t", 1, 0, 3), ("t", 2, 0, 4)]
    assert spark.trigger() is None
    assert member.group == {T0: 25, T1: 3, ("t", 2): 4}


def test_a_committed_offset_of_the_old_topic_is_not_where_the_new_one_is_read_from():
    # A broker that keeps a deleted topic's committed offsets (Kafka drops them; the embedded
    # Tansu broker does not), or a member that committed one late: the group still says 10 for
    # the new topic. Adopting there would skip the new topic's first 10 records of t-0.
    cluster = Cluster({T0: 10, T1: 10})
    cluster.topic_ids["t"] = OLD_ID
    member = FakeMember([T0, T1])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest", failOnDataLoss="false"))
    assert spark.trigger() == [("t", 0, 0, 10), ("t", 1, 0, 10)]
    member.group.update({T0: 10, T1: 10})
    _recreate(cluster, "t", {0: 25, 1: 3}, NEW_ID)
    member.assign(T0, T1)
    assert spark.trigger() == []
    assert spark.start == o(t={0: 0, 1: 0})
    assert spark.trigger() == [("t", 0, 0, 25), ("t", 1, 0, 3)]


def test_a_topic_whose_id_stays_is_not_taken_for_a_new_one():
    cluster = Cluster({T0: 10})
    cluster.topic_ids["t"] = OLD_ID
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest"))
    assert spark.trigger() == [("t", 0, 0, 10)]
    cluster.set(T0, 12)
    assert spark.trigger() == [("t", 0, 10, 12)]


def test_a_broker_behind_the_new_topic_id_is_asked_again():
    # A broker that has not heard of the deletion yet names the old id after another broker
    # named the new one: a stale answer (asked again), never the old topic back.
    from kafka_source.wire.net.metadata_view import MetadataView, UnconfirmedAnswer

    view = MetadataView(confirm_ms=0)
    view.check_topic_ids(1, {"t": OLD_ID})
    view.check_epochs(1, {T0: 7})
    view.check_topic_ids(2, {"t": NEW_ID})
    assert view.topic_id("t") == NEW_ID
    view.check_epochs(2, {T0: 0})              # the new topic's epochs start again
    assert view.epoch(T0) == 0
    with pytest.raises(UnconfirmedAnswer, match="created again"):
        view.check_topic_ids(3, {"t": OLD_ID})
    assert view.avoid == 3 and view.topic_id("t") == NEW_ID
    view.check_topic_ids(1, {"t": None})       # a broker that gives none changes nothing
    assert view.topic_id("t") == NEW_ID


def test_vanished_partition_is_data_loss():
    cluster = Cluster({T0: 10, T1: 10})
    member = FakeMember([T0, T1])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest"))
    spark.trigger()
    del cluster.logs[T1]                     # the topic was recreated with one partition
    member.assign(T0)
    with pytest.raises(DataLossError, match="t-1"):
        spark.trigger()


def test_log_end_before_start_is_data_loss(caplog):
    cluster = Cluster({T0: 100})
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest"))
    spark.trigger()
    cluster.set(T0, 20)                      # topic recreated: the log now ends at 20
    with pytest.raises(DataLossError, match="recreated"):
        spark.trigger()

    reader = make_reader(cluster, FakeMember([T0]), failOnDataLoss="false")
    with caplog.at_level(logging.WARNING):
        end = reader.latestOffset(o(t={0: 100}), ReadAllAvailable())
    assert end == o(t={0: 20})               # continues from the new end
    assert ranges(reader, o(t={0: 100}), end) == []
    cluster.set(T0, 25)
    assert reader.latestOffset(end, ReadAllAvailable()) == o(t={0: 25})


# --- truncation after an unclean leader election (KIP-320) ------------------------------------------

def unclean_election(cluster, tp, *, diverged_at, written):
    """The partition's new leader was not in sync: its log ends at ``diverged_at``, it leads a
    new epoch from there and has written ``written`` records since (other ones than the old
    leader's at those offsets)."""
    cluster.truncate(tp, diverged_at, new_epoch=cluster.epochs[tp] + 1,
                     new_end=diverged_at + written)


@pytest.mark.parametrize("written", [3, 40], ids=["log-ends-before", "log-grew-past"])
def test_truncation_after_an_unclean_election_fails_naming_the_lost_offsets(written):
    """The query read up to 30; the new leader's log ended at 20 and got ``written`` new
    records: whether the log now ends before 30 or grew past it, offsets [20, 30) were lost and
    the query says so, naming the cause and the option (it used to read on from 30, skipping
    the new records at 20-29, or call it a recreated topic)."""
    cluster = Cluster({T0: 30})
    cluster.epochs[T0] = 4
    spark = Spark(make_reader(cluster, FakeMember([T0]), startingOffsets="earliest"))
    assert spark.trigger() == [("t", 0, 0, 30)]
    unclean_election(cluster, T0, diverged_at=20, written=written)
    with pytest.raises(DataLossError) as info:
        spark.trigger()
    message = str(info.value)
    for part in ("t-0", "[20, 30)", "unclean leader election", "truncated", "failOnDataLoss"):
        assert part in message
    assert cluster.epoch_requests == [{T0: 4}]


@pytest.mark.parametrize("written", [3, 40], ids=["log-ends-before", "log-grew-past"])
def test_truncation_with_fail_on_data_loss_false_reads_every_new_record(written, caplog):
    """failOnDataLoss=false: a warning, the batch ends the partition at the divergence (20),
    and the next one reads the new leader's records from 20 on: none is skipped."""
    cluster = Cluster({T0: 30, T1: 30})
    cluster.epochs.update({T0: 4, T1: 7})
    spark = Spark(make_reader(cluster, FakeMember([T0, T1]), startingOffsets="earliest",
                              failOnDataLoss="false"))
    spark.trigger()
    unclean_election(cluster, T0, diverged_at=20, written=written)
    cluster.set(T1, 35)                          # the other partition goes on as before
    with caplog.at_level(logging.WARNING):
        assert spark.trigger() == [("t", 1, 30, 35)]
    assert decode_offsets(spark.start) == {T0: 20, T1: 35}
    assert any("[20, 30)" in r.getMessage() and "Continuing from offset 20" in r.getMessage()
               for r in caplog.records)
    assert spark.trigger() == [("t", 0, 20, 20 + written)]
    assert cluster.epoch_requests == [{T0: 4}]   # only the partition whose leader changed
    cluster.set(T0, 20 + written + 5)
    assert spark.trigger() == [("t", 0, 20 + written, 25 + written)]
    assert cluster.epoch_requests == [{T0: 4}]   # no leader change since: nothing asked


def test_truncation_is_found_when_a_fenced_member_adopts_the_partition_where_it_was(caplog):
    """The group fenced the member while the partition's leaders changed (a broker outage does
    both): the partition is dropped for a trigger and adopted again where the query was (30);
    that offset is validated like a kept one, not taken as it is."""
    cluster = Cluster({T0: 30})
    cluster.epochs[T0] = 4
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest",
                              failOnDataLoss="false"))
    spark.trigger()
    member.fence()
    unclean_election(cluster, T0, diverged_at=20, written=40)
    spark.trigger()                                # dropped for this trigger
    assert T0 not in decode_offsets(spark.start)
    with caplog.at_level(logging.WARNING):
        spark.trigger()                            # adopted at 20, not at 30
    assert decode_offsets(spark.start) == {T0: 20}
    assert spark.trigger() == [("t", 0, 20, 60)]


def test_commits_carry_the_leader_epoch_of_the_committed_offset():
    """Each committed offset goes to the group with the leader epoch it was planned in
    (OffsetCommit v6+), as Kafka's Java consumer commits: whoever resumes from it can validate
    it against the current leader."""
    cluster = Cluster({T0: 30, T1: 10})
    cluster.epochs.update({T0: 4, T1: 9})
    member = FakeMember([T0, T1])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest"))
    spark.trigger()
    cluster.set(T0, 35)
    spark.trigger()
    assert member.group == {T0: 30, T1: 10} and member.epochs == {T0: 4, T1: 9}
    cluster.truncate(T0, 35, new_epoch=5, new_end=40)       # a clean leader change
    spark.trigger()
    assert member.group == {T0: 35, T1: 10} and member.epochs == {T0: 4, T1: 9}
    spark.trigger()
    assert member.group == {T0: 40, T1: 10} and member.epochs == {T0: 5, T1: 9}


def _read_and_commit_then_stop(cluster, member, **options):
    """A query reads t-0 to 30 in epoch 4 and commits it; returns its checkpoint's offsets."""
    cluster.epochs[T0] = 4
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest", **options))
    assert spark.trigger() == [("t", 0, 0, 30)]
    spark.reader.commit(spark.start)
    assert member.group == {T0: 30} and member.epochs == {T0: 4}
    return spark.start


@pytest.mark.parametrize("fail", ["true", "false"])
def test_truncation_while_the_query_was_down_is_found_at_restart(fail, caplog):
    """The query stopped at 30 (checkpoint and group commit agree, the commit with epoch 4);
    while it was down an unclean election truncated the log at 20 and the new leader wrote 40
    records. Restarted from its checkpoint, its first trigger validates 30 with the committed
    epoch: the loss of [20, 30) is reported (failOnDataLoss true), or the partition goes on
    from 20 (false) -- not from 30, which would skip the new records at 20-29 silently."""
    cluster = Cluster({T0: 30})
    member = FakeMember([T0])
    checkpoint = _read_and_commit_then_stop(cluster, member, failOnDataLoss=fail)
    unclean_election(cluster, T0, diverged_at=20, written=40)
    restarted = Spark(make_reader(cluster, member, failOnDataLoss=fail), start=checkpoint)
    if fail == "true":
        with pytest.raises(DataLossError, match=r"t-0: offsets 20 to 29 \(\[20, 30\)\)"):
            restarted.trigger()
    else:
        with caplog.at_level(logging.WARNING):
            assert restarted.trigger() == []       # the partition's batch ends at 20
        assert any("[20, 30)" in r.getMessage() for r in caplog.records)
        assert decode_offsets(restarted.start) == {T0: 20}
        assert restarted.trigger() == [("t", 0, 20, 60)]
    assert cluster.epoch_requests == [{T0: 4}]


def test_at_restart_an_offset_committed_without_an_epoch_is_not_validated():
    """The same outage, but the group's commit carries no epoch (a committer before KIP-320):
    nothing to ask the leader with, and the restart reads on from 30 as before -- the limit
    the epochs in commits remove."""
    cluster = Cluster({T0: 30})
    member = FakeMember([T0])
    checkpoint = _read_and_commit_then_stop(cluster, member)
    member.epochs.clear()
    unclean_election(cluster, T0, diverged_at=20, written=40)
    restarted = Spark(make_reader(cluster, member), start=checkpoint)
    assert restarted.trigger() == [("t", 0, 30, 60)]
    assert cluster.epoch_requests == []


def test_a_partition_adopted_at_a_committed_offset_is_validated_with_its_epoch():
    """Another member (a Java consumer) committed 30 in epoch 4 and left; the log was
    truncated at 20 since. The query starting from the group's offsets adopts 30 with that
    epoch and finds the loss at its first trigger instead of reading on from 30."""
    cluster = Cluster({T0: 30})
    cluster.epochs[T0] = 4
    member = FakeMember([T0], committed={T0: 30})
    member.epochs[T0] = 4
    unclean_election(cluster, T0, diverged_at=20, written=40)
    spark = Spark(make_reader(cluster, member, **{"kafka.group.id": "g"}, failOnDataLoss="false"))
    assert decode_offsets(spark.start) == {T0: 30}
    spark.trigger()
    assert decode_offsets(spark.start) == {T0: 20}
    assert spark.trigger() == [("t", 0, 20, 60)]
    assert cluster.epoch_requests == [{T0: 4}]


def test_a_partition_handed_over_in_a_rebalance_is_validated_with_its_committed_epoch():
    """The same, for a partition the query gets in a rebalance: the member that had it
    committed 30 in epoch 4; the log was truncated at 20 since. It is adopted at 20, the
    divergence, in the trigger that adopts it."""
    cluster = Cluster({T0: 10, T1: 30})
    cluster.epochs.update({T0: 1, T1: 4})
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member, startingOffsets="earliest",
                              failOnDataLoss="false"))
    assert spark.trigger() == [("t", 0, 0, 10)]
    member.group[T1], member.epochs[T1] = 30, 4
    unclean_election(cluster, T1, diverged_at=20, written=40)
    member.assign(T0, T1)
    spark.trigger()
    assert decode_offsets(spark.start) == {T0: 10, T1: 20}
    assert spark.trigger() == [("t", 1, 20, 60)]
    assert cluster.epoch_requests == [{T1: 4}]


def test_a_clean_leader_change_is_validated_and_goes_on():
    """A new leader with the whole log (a clean election): the position is validated with
    one OffsetsForLeaderEpoch and reading goes on where it was."""
    cluster = Cluster({T0: 30})
    cluster.epochs[T0] = 4
    spark = Spark(make_reader(cluster, FakeMember([T0]), startingOffsets="earliest"))
    spark.trigger()
    cluster.truncate(T0, 30, new_epoch=5, new_end=36)      # the log kept everything up to 30
    assert spark.trigger() == [("t", 0, 30, 36)]
    assert cluster.epoch_requests == [{T0: 4}]
    assert spark.trigger() is None
    assert cluster.epoch_requests == [{T0: 4}]


def test_a_rate_limited_end_is_validated_with_the_epoch_listed_with_it():
    """maxOffsetsPerTrigger: the end (10) is below the latest offset (30); a truncation at 25
    is above it and loses nothing the query read; one at 5 is found."""
    for diverged_at, lost in ((25, False), (5, True)):
        cluster = Cluster({T0: 30})
        cluster.epochs[T0] = 2
        spark = Spark(make_reader(cluster, FakeMember([T0]), startingOffsets="earliest",
                                  maxOffsetsPerTrigger="10"))
        assert spark.trigger() == [("t", 0, 0, 10)]
        unclean_election(cluster, T0, diverged_at=diverged_at, written=30)
        if lost:
            with pytest.raises(DataLossError, match=r"\[5, 10\)"):
                spark.trigger()
        else:
            assert spark.trigger() == [("t", 0, 10, 20)]


def test_planned_ranges_carry_the_leader_epoch_of_their_end():
    """The executors check what they read against the epoch each range was planned in
    (test_fetcher.py); a range re-planned by a new process (after a restart) has none."""
    cluster = Cluster({T0: 30})
    cluster.epochs[T0] = 6
    reader = make_reader(cluster, FakeMember([T0]), startingOffsets="earliest")
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert [(r.start, r.end, r.epoch) for p in reader.partitions(start, end)
            for r in p.ranges] == [(0, 30, 6)]
    fresh = make_reader(cluster, FakeMember([T0]))
    assert [r.epoch for p in fresh.partitions(start, end) for r in p.ranges] == [-1]


def test_brokers_without_offsets_for_leader_epoch_skip_the_check():
    """Brokers before Kafka 2.1 (no OffsetsForLeaderEpoch v2): asked once, then never again;
    planning goes on as before."""
    cluster = Cluster({T0: 30})
    cluster.epochs[T0] = 1
    cluster.epoch_api = False
    spark = Spark(make_reader(cluster, FakeMember([T0]), startingOffsets="earliest"))
    spark.trigger()
    cluster.truncate(T0, 30, new_epoch=2, new_end=40)
    assert spark.trigger() == [("t", 0, 30, 40)]
    cluster.truncate(T0, 40, new_epoch=3, new_end=45)
    assert spark.trigger() == [("t", 0, 40, 45)]
    assert len(cluster.epoch_requests) == 1


def test_without_leader_epochs_nothing_is_asked():
    """Answers without epochs (-1): nothing to validate with."""
    cluster = Cluster({T0: 30})
    spark = Spark(make_reader(cluster, FakeMember([T0]), startingOffsets="earliest"))
    spark.trigger()
    cluster.set(T0, 40)
    assert spark.trigger() == [("t", 0, 30, 40)]
    assert cluster.epoch_requests == []


def test_adopted_partition_committed_below_log_start(caplog):
    for fail in ("true", "false"):
        cluster = Cluster({T0: 10})
        cluster.set(T1, 50, log_start=20)
        member = FakeMember([T0], committed={T1: 5})
        spark = Spark(make_reader(cluster, member, startingOffsets="earliest",
                                  failOnDataLoss=fail))
        member.assign(T0, T1)
        if fail == "true":
            with pytest.raises(DataLossError, match="t-1"):
                spark.trigger()
        else:
            with caplog.at_level(logging.WARNING):
                spark.trigger()
            assert decode_offsets(spark.start)[T1] == 20


# --- admission control ---------------------------------------------------------------------------

def test_read_max_rows_splits_by_backlog():
    cluster = Cluster({T0: 0, T1: 0, T2: 0})
    member = FakeMember([T0, T1, T2])
    reader = make_reader(cluster, member, startingOffsets="earliest", maxOffsetsPerTrigger="100")
    assert reader.getDefaultReadLimit() == ReadMaxRows(100)
    spark = Spark(reader)
    cluster.set(T0, 1000)
    cluster.set(T1, 10)
    cluster.set(T2, 1)
    assert spark.trigger() == [("t", 0, 0, 98), ("t", 1, 0, 1), ("t", 2, 0, 1)]
    assert reader.reportLatestOffset() == o(t={0: 1000, 1: 10, 2: 1})
    # A limit Spark passes wins over the option.
    assert reader.latestOffset(spark.start, ReadMaxRows(10)) == o(t={0: 107, 1: 2, 2: 1})


def test_read_all_available_ignores_max_offsets_per_trigger():
    cluster = Cluster({T0: 1000, T1: 10})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, startingOffsets="earliest", maxOffsetsPerTrigger="5",
                         minOffsetsPerTrigger="5")
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == o(t={0: 1000, 1: 10})


def test_min_offsets_per_trigger_holds_back_until_enough_or_delay(clock):
    cluster = Cluster({T0: 0, T1: 0})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, startingOffsets="earliest", minOffsetsPerTrigger="10",
                         maxTriggerDelay="1m")
    assert reader.getDefaultReadLimit() == ReadMinRows(10)
    spark = Spark(reader)
    cluster.set(T0, 4)
    cluster.set(T1, 5)
    # As in Spark, the first trigger is never held back.
    assert spark.trigger() == [("t", 0, 0, 4), ("t", 1, 0, 5)]
    cluster.set(T1, 8)                          # 3 < 10 waiting
    clock.advance(30_000)
    assert spark.trigger() is None
    assert reader.reportLatestOffset() == o(t={0: 4, 1: 8})
    cluster.set(T0, 11)                         # 10 waiting
    assert spark.trigger() == [("t", 0, 4, 11), ("t", 1, 5, 8)]

    cluster.set(T0, 12)                         # 1 waiting; the delay counts from that batch
    clock.advance(59_999)
    assert spark.trigger() is None
    clock.advance(1)
    assert spark.trigger() == [("t", 0, 11, 12)]
    clock.advance(1_000)
    cluster.set(T0, 13)
    assert spark.trigger() is None


def test_min_and_max_offsets_together():
    cluster = Cluster({T0: 0})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, startingOffsets="earliest", minOffsetsPerTrigger="10",
                         maxOffsetsPerTrigger="20")
    assert reader.getDefaultReadLimit() == ReadMaxRows(20)
    spark = Spark(reader)
    cluster.set(T0, 5)
    assert spark.trigger() == [("t", 0, 0, 5)]  # the first trigger is never held back
    cluster.set(T0, 10)
    assert spark.trigger() is None              # min still applies under the ReadMaxRows limit
    cluster.set(T0, 50)
    assert spark.trigger() == [("t", 0, 5, 25)]


def test_default_read_limit_without_options():
    reader = make_reader(Cluster(), FakeMember())
    assert reader.getDefaultReadLimit() == ReadAllAvailable()


# --- Trigger.AvailableNow ------------------------------------------------------------------------

def test_available_now_stops_at_the_target_and_leaves():
    cluster = Cluster({T0: 30, T1: 5})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, startingOffsets="earliest", maxOffsetsPerTrigger="20")
    spark = Spark(reader)
    reader.prepareForTriggerAvailableNow()
    cluster.set(T0, 1000)                       # arrives after the run began: not read
    cluster.set(("t", 1), 500)
    cluster.set(T2, 7)                          # a partition created later: not read
    member.assign(T0, T1, T2)
    seen = []
    while (read := spark.trigger()) is not None:
        seen.extend(read)
        assert not member.left
    assert sum(b - a for _, _, a, b in seen) == 35
    assert ("t", 2) not in {(t, p) for t, p, _, _ in seen}
    assert decode_offsets(spark.start) == {T0: 30, T1: 5, T2: 0}
    assert len(member.left) == 1
    # Everything read was committed before leaving.
    assert member.group[T0] == 30 and member.group[T1] == 5


def _count_list_offsets(cluster) -> list:
    calls = []
    list_offsets = cluster.list_offsets

    def counted(targets, **kw):
        calls.append(dict(targets))
        return list_offsets(targets, **kw)

    cluster.list_offsets = counted
    return calls


def test_available_now_asks_the_brokers_nothing_while_the_assignment_holds():
    cluster = Cluster({T0: 30, T1: 5})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, startingOffsets="earliest", maxOffsetsPerTrigger="10")
    reader.prepareForTriggerAvailableNow()
    spark = Spark(reader)
    metadata_before = len(cluster.metadata_calls)
    listed = _count_list_offsets(cluster)
    cluster.set(T0, 1000)                        # arrives after the run began: not read
    seen, ends = [], []
    while (read := spark.trigger()) is not None:
        seen.extend(read)
        ends.append(decode_offsets(spark.start)[T0])
    assert sum(b - a for _, _, a, b in seen) == 35 and len(ends) == 4
    assert len(cluster.metadata_calls) == metadata_before and listed == []
    assert len(member.ensure_calls) == 1         # initialOffset's
    # Each completed batch was still committed, and everything before leaving.
    assert [c[T0] for c in member.commits if T0 in c] == ends
    assert member.group == {T0: 30, T1: 5} and len(member.left) == 1


def test_available_now_ranges_carry_the_epoch_listed_with_the_target():
    """Triggers of an AvailableNow run that ask the brokers nothing still give the executors
    the leader epoch to check their ranges against (the target's, listed when the run began)."""
    cluster = Cluster({T0: 30})
    cluster.epochs[T0] = 3
    reader = make_reader(cluster, FakeMember([T0]), startingOffsets="earliest",
                         maxOffsetsPerTrigger="10")
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    epochs = []
    while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) != start:
        epochs += [r.epoch for p in reader.partitions(start, end) for r in p.ranges]
        start = end
    assert epochs == [3, 3, 3]


def test_available_now_asks_again_after_a_rebalance_then_goes_quiet():
    cluster = Cluster({T0: 30, T1: 30})
    member = FakeMember([T0, T1])
    reader = make_reader(cluster, member, startingOffsets="earliest", maxOffsetsPerTrigger="10")
    reader.prepareForTriggerAvailableNow()
    spark = Spark(reader)
    spark.trigger()
    metadata_before = len(cluster.metadata_calls)
    listed = _count_list_offsets(cluster)
    member.assign(T0)                           # a rebalance the heartbeat thread noticed
    assert spark.trigger() == [("t", 0, 5, 15)]
    assert len(cluster.metadata_calls) == metadata_before + 1 and len(listed) == 1
    assert member.group[T1] == 5                # committed before the rebalance took it
    while spark.trigger() is not None:
        pass
    assert len(cluster.metadata_calls) == metadata_before + 1 and len(listed) == 1
    assert decode_offsets(spark.start) == {T0: 30}
    member.stable = False                       # fenced: the next trigger asks again
    assert spark.trigger() is None
    assert len(cluster.metadata_calls) == metadata_before + 2


def test_available_now_ignores_min_offsets_per_trigger():
    cluster = Cluster({T0: 3})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, startingOffsets="earliest",
                         minOffsetsPerTrigger="1000", maxTriggerDelay="1h")
    spark = Spark(reader)
    reader.prepareForTriggerAvailableNow()
    assert spark.trigger() == [("t", 0, 0, 3)]
    assert spark.trigger() is None
    assert member.left


def test_available_now_with_nothing_to_read_leaves_at_once():
    cluster = Cluster({T0: 3})
    member = FakeMember([T0])
    spark = Spark(make_reader(cluster, member))
    spark.reader.prepareForTriggerAvailableNow()
    assert spark.trigger() is None
    assert len(member.left) == 1


# --- partitions(start, end) ----------------------------------------------------------------------

def test_partitions_plans_the_nonempty_ranges_packed_by_the_work():
    reader = make_reader(Cluster(), FakeMember(), includeHeaders="true")
    start = o(t={0: 5, 1: 7, 2: 9}, a={0: 0})
    end = o(t={0: 8, 1: 7, 3: 4}, a={0: 2})     # t-1 empty, t-2 dropped, t-3 adopted
    parts = reader.partitions(start, end)
    assert [(r.topic, r.partition, r.start, r.end) for p in parts for r in p.ranges] == [
        ("a", 0, 0, 2), ("t", 0, 5, 8)]
    assert [p.index for p in parts] == [0]       # 5 records: one task
    assert all(p.settings.include_headers for p in parts)
    reader = make_reader(Cluster(), FakeMember(), minPartitions="2")
    assert [len(p.ranges) for p in reader.partitions(start, end)] == [1, 1]


def test_partitions_uses_at_most_the_parallelism_for_a_big_micro_batch():
    start = o(t={p: 0 for p in range(8)})
    end = o(t={p: 100_000 for p in range(8)})
    reader = make_reader(Cluster(), FakeMember())
    reader.parallelism = 2
    parts = reader.partitions(start, end)
    assert [len(p.ranges) for p in parts] == [4, 4]
    reader = make_reader(Cluster(), FakeMember(), maxPartitions="8")
    reader.parallelism = 2
    assert len(reader.partitions(start, end)) == 8


def test_partitions_gives_each_task_the_ranges_of_one_leader_as_this_trigger_found_them():
    # t-0 and t-2 led by broker 1, t-1 and t-3 by broker 2: two tasks, one per leader, as the
    # trigger's Metadata answer has them (no request of their own).
    tps = [("t", p) for p in range(4)]
    cluster = Cluster({tp: 100 for tp in tps})
    cluster.leaders_by_partition = {("t", 1): 2, ("t", 3): 2}
    reader = make_reader(cluster, FakeMember(tps), minPartitions="2")
    start = o(t={p: 0 for p in range(4)})
    end = reader.latestOffset(start, ReadAllAvailable())
    calls = len(cluster.metadata_calls)
    got = [sorted(r.partition for r in p.ranges) for p in reader.partitions(start, end)]
    assert got == [[0, 2], [1, 3]] and len(cluster.metadata_calls) == calls
    # Leaders since moved: the next trigger's answer decides
    cluster.leaders_by_partition = {("t", 2): 2, ("t", 3): 2}
    for tp in tps:
        cluster.set(tp, 200)
    later = reader.latestOffset(end, ReadAllAvailable())
    got = [sorted(r.partition for r in p.ranges) for p in reader.partitions(end, later)]
    assert got == [[0, 1], [2, 3]]


def test_partitions_applies_min_partitions_and_max_records_per_partition():
    start, end = o(t={0: 0, 1: 0}), o(t={0: 100, 1: 10})
    reader = make_reader(Cluster(), FakeMember(), minPartitions="4")
    got = ranges(reader, start, end)
    assert got == [("t", 0, 0, 33), ("t", 0, 33, 66), ("t", 0, 66, 100), ("t", 1, 0, 10)]
    reader = make_reader(Cluster(), FakeMember(), maxRecordsPerPartition="40")
    assert ranges(reader, start, end) == [("t", 0, 0, 33), ("t", 0, 33, 66), ("t", 0, 66, 100),
                                          ("t", 1, 0, 10)]


def test_offsets_json_is_sparks_shape_in_a_stable_order():
    offsets = {("b", 10): 1, ("b", 2): 2, ("a", 0): 3}
    encoded = encode_offsets(offsets)
    assert json.dumps(encoded) == '{"a": {"0": 3}, "b": {"2": 2, "10": 1}}'
    assert decode_offsets(encoded) == offsets
    assert decode_offsets(json.loads(json.dumps(encoded))) == offsets
    assert decode_offsets(None) == {} and encode_offsets({}) == {}


# --- reportLatestOffset, stop --------------------------------------------------------------------

def test_report_latest_offset():
    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, startingOffsets="earliest", maxOffsetsPerTrigger="3")
    assert reader.reportLatestOffset() is None
    start = reader.initialOffset()
    assert reader.reportLatestOffset() is None
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == o(t={0: 3})
    assert reader.reportLatestOffset() == o(t={0: 10})
    cluster.set(T0, 12)
    assert reader.reportLatestOffset() == o(t={0: 10})    # as seen at the last trigger


def test_stop_closes_member_and_client_without_committing():
    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, startingOffsets="earliest")
    spark = Spark(reader)
    spark.trigger()
    reader.stop()
    assert member.closed and cluster.closed and member.commits == []
    assert member.closed_retrying_commit       # nothing failed: a failed commit is retried


@pytest.mark.parametrize("gone", [True, False], ids=["kafka-gone", "kafka-back"])
def test_a_query_failing_because_kafka_is_gone_leaves_without_retrying_its_commit(
        coordinator, member_reader, gone):
    # Found in CI (Kafka 2.2 behind the fault proxy, the broker gone for good): the trigger that
    # gave up on the broker had just sent the commit of the last batch. PySpark's runner calls
    # stop() before it hands the error to Spark, and leaving made the failed commit again for
    # kafka.default.api.timeout.ms: the query looked alive for that long after it had failed.
    cluster = Cluster({tp: 100 for tp in T4})
    reader = member_reader(cluster, startingOffsets="earliest",
                           **{"fetchOffset.retryIntervalMs": "0", "fetchOffset.numRetries": "1",
                              "kafka.request.timeout.ms": "0",
                              "kafka.default.api.timeout.ms": "1500"})
    spark = Spark(reader)
    assert spark.trigger() == [("t", p, 0, 100) for p in range(4)]
    coordinator.commit_error = COORDINATOR_NOT_AVAILABLE     # the coordinator is gone too
    cluster.metadata_failures = [unreachable()] * 3
    with pytest.raises(BrokerUnavailableError):
        spark.trigger()                  # sends the commit of 100, then gives up on metadata
    if not gone:
        reader.latestOffset(spark.start, ReadAllAvailable())   # the next call reached Kafka
    sent = len(commits_of(coordinator, "query"))
    started = time.monotonic()
    reader.stop()
    took = time.monotonic() - started
    made_again = len(commits_of(coordinator, "query")) - sent
    assert coordinator.records()[-1].kind == LEAVE               # left in either case
    if gone:
        assert made_again == 0 and took < 1.0, (made_again, took)
    else:                                # retried until kafka.default.api.timeout.ms, as before
        assert made_again > 0 and took >= 1.4, (made_again, took)


def test_a_sigterm_during_stop_takes_effect_once_the_member_has_left():
    """Spark closes the planning process's socket, then SIGTERMs it. When the runner saw the
    closed socket first it is already in stop() when the signal comes; the SystemExit of the
    reader's SIGTERM handler cut the leave short there (CI: a consumer-protocol member still in
    its group 30 s after query.stop()). Now the leave finishes, the client is closed, and then
    the process exits as the signal asked."""
    import os
    import signal

    class SignalledWhileClosing(FakeMember):
        def close(self, *, retry_commit=True):
            os.kill(os.getpid(), signal.SIGTERM)     # delivered at the next bytecode
            for _ in range(1000):
                pass
            super().close(retry_commit=retry_commit)

    cluster = Cluster({T0: 10})
    member = SignalledWhileClosing([T0])
    reader = make_reader(cluster, member, startingOffsets="earliest")
    Spark(reader).trigger()
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        stream_module._exit_on_sigterm()
        assert signal.getsignal(signal.SIGTERM) is stream_module._on_sigterm
        with pytest.raises(SystemExit) as exited:
            reader.stop()
        assert exited.value.code == 128 + signal.SIGTERM
        assert member.closed and member.left == ["closed"] and cluster.closed
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN   # a second one: ignored
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stop_outside_the_planning_process_leaves_sigterm_alone():
    """No handler of the reader's installed (a test, a thread): stop() changes nothing."""
    import signal

    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, startingOffsets="earliest")
    previous = signal.getsignal(signal.SIGTERM)
    reader.stop()
    assert member.closed and signal.getsignal(signal.SIGTERM) is previous


def test_only_partitions_whose_offsets_moved_are_committed():
    cluster = Cluster({("t", p): 10 for p in range(6)})
    member = FakeMember([("t", p) for p in range(6)])
    reader = make_reader(cluster, member, startingOffsets="latest")
    spark = Spark(reader)
    cluster.set(("t", 1), 12)
    cluster.set(("t", 4), 15)
    assert spark.trigger() == [("t", 1, 10, 12), ("t", 4, 10, 15)]
    cluster.set(("t", 4), 16)
    assert spark.trigger() == [("t", 4, 15, 16)]
    spark.trigger()                               # nothing new: no batch, the last one committed
    # The first batch's end goes out whole (nothing was committed before; the query's start is
    # not a batch's end), then only what moved.
    assert member.commits == [{**{("t", p): 10 for p in range(6)}, ("t", 1): 12, ("t", 4): 15},
                              {("t", 4): 16}]
    assert member.group == {**{("t", p): 10 for p in range(6)}, ("t", 1): 12, ("t", 4): 16}
