"""Driver-side offset resolution against a scripted cluster."""

from __future__ import annotations

import json

import pytest

from kafka_source.errors import BrokerUnavailableError, DataLossError, OptionError, TopicError
from kafka_source.read.offsets import OffsetRange, plan_batch_ranges
from kafka_source.config.options import parse_batch_options

from .fake_cluster import UNKNOWN_TOPIC_OR_PARTITION, FakeCluster, FakeLog, unreachable
from .record_builder import R, v2_batch

pytestmark = pytest.mark.pyspark_free


def cluster():
    logs = {}
    for p in range(2):
        batches = [v2_batch([R(value=b"x")], o) for o in range(10, 30)]
        logs[("t", p)] = FakeLog(batches=batches, log_start=10,
                                 timestamps={1000 + 10 * o: o for o in range(10, 30)})
    logs[("u", 0)] = FakeLog(batches=[v2_batch([R(value=b"y")], 0)])
    return FakeCluster(logs)


def plan(fake=None, **options):
    opts = parse_batch_options({"kafka.bootstrap.servers": "h:1", **options})
    return plan_batch_ranges(fake or cluster(), opts)


def test_earliest_to_latest():
    assert plan(subscribe="t,u") == [OffsetRange("t", 0, 10, 30), OffsetRange("t", 1, 10, 30),
                                     OffsetRange("u", 0, 0, 1)]


def test_json_offsets_with_special_values():
    got = plan(subscribe="t", startingOffsets=json.dumps({"t": {"0": 12, "1": -2}}),
               endingOffsets=json.dumps({"t": {"0": -1, "1": 20}}))
    assert got == [OffsetRange("t", 0, 12, 30), OffsetRange("t", 1, 10, 20)]


def test_batch_ranges_carry_the_leader_epoch_of_their_end():
    """A batch read's ranges carry the leader epoch listed with the latest offsets, for the
    executors' truncation check; an end from JSON below the latest offset too, and none when
    the latest offsets were never listed (no extra request for it)."""
    fake = cluster()
    fake.epochs.update({("t", 0): 4, ("t", 1): 7})
    got = plan(fake, subscribe="t", startingOffsets="earliest",
               endingOffsets=json.dumps({"t": {"0": -1, "1": 20}}))
    assert [(r.partition, r.end, r.epoch) for r in got] == [(0, 30, 4), (1, 20, 7)]
    got = plan(fake, subscribe="t", startingOffsets="earliest",
               endingOffsets=json.dumps({"t": {"0": 25, "1": 20}}))
    assert [r.epoch for r in got] == [-1, -1]


def test_json_offsets_must_cover_every_partition():
    with pytest.raises(OptionError, match=r"startingOffsets.*missing: t-1.*-2 for earliest"):
        plan(subscribe="t", startingOffsets=json.dumps({"t": {"0": 12}}))


def test_partition_the_topic_does_not_have():
    with pytest.raises(TopicError, match=r"names t-5, but topic 't' has partitions \[0, 1\]"):
        plan(subscribe="t", startingOffsets=json.dumps({"t": {"0": 1, "1": 1, "5": 1}}))
    with pytest.raises(TopicError, match=r"assign' names t-3, but topic 't' has partitions"):
        plan(assign=json.dumps({"t": [3]}))
    with pytest.raises(OptionError, match=r"names topic 'u', which this query does not read"):
        plan(subscribe="t", endingOffsets=json.dumps({"t": {"0": 1, "1": 1}, "u": {"0": 1}}))


def test_unknown_topic_and_pattern_without_match():
    with pytest.raises(TopicError, match="Topic 'nope' does not exist"):
        plan(subscribe="t,nope")
    with pytest.raises(TopicError, match=r"subscribePattern' \('zz.\*'\) matches no topic"):
        plan(subscribePattern="zz.*")
    assert [r.topic for r in plan(subscribePattern="[tu]")] == ["t", "t", "u"]


def test_planning_outlasts_a_restarting_broker():
    # Refused connections and answers of a broker that does not know the cluster yet: retried.
    fake = cluster()
    fake.metadata_failures = [unreachable(), unreachable("an answer without brokers")]
    got = plan(fake, subscribe="t,u", **{"fetchOffset.retryIntervalMs": "0"})
    assert [(r.topic, r.partition, r.size) for r in got] == [("t", 0, 20), ("t", 1, 20),
                                                            ("u", 0, 1)]
    assert len(fake.metadata_calls) == 3


def test_a_topic_reported_unknown_that_the_broker_then_lists_is_asked_for_again():
    # One answer says 'u' is unknown, the broker's whole topic list (asked next) has it: the
    # broker learnt the cluster's partitions in between (a ZooKeeper-mode broker that just
    # started). 'u' is asked for again and read, never left out.
    fake = cluster()
    fake.topic_errors["u"] = [UNKNOWN_TOPIC_OR_PARTITION]
    got = plan(fake, subscribe="t,u", **{"fetchOffset.retryIntervalMs": "0"})
    assert {r.topic for r in got} == {"t", "u"}
    assert fake.metadata_calls[:3] == [["t", "u"], None, ["t", "u"]]


def test_a_topic_the_broker_does_not_list_is_an_error_at_once():
    # The broker knows other topics and not 'nope': the topic does not exist, after one look at
    # the whole list.
    fake = cluster()
    with pytest.raises(TopicError, match="Topic 'nope' does not exist"):
        plan(fake, subscribe="t,nope")
    assert fake.metadata_calls == [["nope", "t"], None]


def test_a_kraft_broker_is_not_asked_for_its_whole_topic_list_about_a_missing_topic():
    # It serves only once it knows the cluster: its "unknown" is final, whatever else it lists.
    fake = cluster()
    fake.kraft = True
    with pytest.raises(TopicError, match="Topic 'nope' does not exist"):
        plan(fake, subscribe="t,nope")
    assert fake.metadata_calls == [["nope", "t"]]


def test_planning_gives_up_on_a_broker_gone_for_longer_than_the_retries():
    fake = cluster()
    fake.metadata_failures = [unreachable()] * 5
    with pytest.raises(BrokerUnavailableError, match="still failing after 2 attempts"):
        plan(fake, subscribe="t", **{"fetchOffset.retryIntervalMs": "0",
                                     "fetchOffset.numRetries": "1",
                                     "kafka.request.timeout.ms": "0"})


def test_ending_before_starting():
    with pytest.raises(OptionError, match=r"Ending offset 15 of t-0 is before its starting "
                                          r"offset 20.*startingOffsets.*endingOffsets"):
        plan(assign=json.dumps({"t": [0]}), startingOffsets=json.dumps({"t": {"0": 20}}),
             endingOffsets=json.dumps({"t": {"0": 15}}))


def test_start_below_log_start_is_data_loss():
    start = json.dumps({"t": {"0": 3}})
    with pytest.raises(DataLossError, match=r"Offsets 3 to 9 of t-0 are no longer in Kafka.*"
                                            "failOnDataLoss"):
        plan(assign=json.dumps({"t": [0]}), startingOffsets=start)
    got = plan(assign=json.dumps({"t": [0]}), startingOffsets=start, failOnDataLoss="false")
    assert got == [OffsetRange("t", 0, 10, 30)]


def test_timestamps_resolve_to_first_offset_at_or_after():
    got = plan(assign=json.dumps({"t": [0, 1]}), startingTimestamp="1125",
               endingOffsetsByTimestamp=json.dumps({"t": {"0": 1200, "1": 1245}}))
    # start: first ts >= 1125 is 1130 at offset 13; ends: 1200 -> offset 20, 1245 -> offset 25
    assert got == [OffsetRange("t", 0, 13, 20), OffsetRange("t", 1, 13, 25)]


def test_timestamp_without_match():
    with pytest.raises(OptionError, match=r"No offset of t-0 matches timestamp 99999.*"
                                          "startingOffsetsByTimestampStrategy"):
        plan(assign=json.dumps({"t": [0]}), startingTimestamp="99999")
    got = plan(assign=json.dumps({"t": [0]}), startingTimestamp="99999",
               startingOffsetsByTimestampStrategy="latest")
    assert got == [OffsetRange("t", 0, 30, 30)]
    # an ending timestamp after the last record means the latest offset
    assert plan(assign=json.dumps({"t": [0]}), endingTimestamp="99999") == [
        OffsetRange("t", 0, 10, 30)]


def _metadata(counts: dict[str, list[int]]):
    from kafka_source.wire.net.client import PartitionInfo, TopicInfo
    return {t: TopicInfo(t, 0, {p: PartitionInfo(1, 0, 0) for p in parts})
            for t, parts in counts.items()}


def test_partitions_in_metadata_reuses_its_last_list_only_while_nothing_changed():
    from kafka_source.config.options import parse_subscription
    from kafka_source.read.offsets import partitions_in_metadata

    sub = parse_subscription({"subscribepattern": "t.*"})
    first = partitions_in_metadata(None, sub, _metadata({"ta": [0, 1], "tb": [0]}), strict=False)
    assert first == ([("ta", 0), ("ta", 1), ("tb", 0)], {"ta": 2, "tb": 1})
    again = partitions_in_metadata(None, sub, _metadata({"tb": [0], "ta": [1, 0]}),
                                   strict=False, previous=first)
    assert again == first and again[0] is first[0]       # the same list, not built again
    grown = partitions_in_metadata(None, sub, _metadata({"ta": [0, 1, 2], "tb": [0]}),
                                   strict=False, previous=first)
    assert grown[0] == [("ta", 0), ("ta", 1), ("ta", 2), ("tb", 0)]
    other = partitions_in_metadata(None, sub, _metadata({"ta": [0, 1], "tc": [0]}),
                                   strict=False, previous=first)
    assert other[0] == [("ta", 0), ("ta", 1), ("tc", 0)]
    # The same counts but other numbers (never so in Kafka): not taken for the same partitions.
    gapped = partitions_in_metadata(None, sub, _metadata({"ta": [0, 5], "tb": [0]}),
                                    strict=False, previous=first)
    assert gapped[0] == [("ta", 0), ("ta", 5), ("tb", 0)]
    assign = parse_subscription({"assign": json.dumps({"ta": [1, 2]})})
    mine = partitions_in_metadata(None, assign, _metadata({"ta": [0, 1, 2]}), strict=False)
    assert mine[0] == [("ta", 1), ("ta", 2)]
    assert partitions_in_metadata(None, assign, _metadata({"ta": [2, 1, 0]}), strict=False,
                                  previous=mine)[0] is mine[0]
    # A strict call checks in full: an assigned partition the topic lacks is an error even
    # when a lenient call before left it out with the same counts.
    lacking = partitions_in_metadata(None, assign, _metadata({"ta": [0, 1]}), strict=False)
    assert lacking[0] == [("ta", 1)]
    with pytest.raises(TopicError, match="names ta-2"):
        partitions_in_metadata(None, assign, _metadata({"ta": [0, 1]}), strict=True,
                               previous=lacking)


def test_planning_retries_start_at_the_retry_backoff_and_grow_to_the_retry_interval():
    from kafka_source.read.offsets import planning_retries

    def retries(**options):
        return planning_retries(parse_batch_options(
            {"kafka.bootstrap.servers": "b:1", "subscribe": "t", **options}))

    r = retries()
    assert (r.count, r.quick_ms, r.interval_ms, r.window_ms) == (3, 100, 1000, 30_000)
    r = retries(**{"kafka.retry.backoff.ms": "250", "fetchOffset.retryIntervalMs": "4000",
                   "fetchOffset.numRetries": "5", "kafka.request.timeout.ms": "60000"})
    assert (r.count, r.quick_ms, r.interval_ms, r.window_ms) == (5, 250, 4000, 60_000)
