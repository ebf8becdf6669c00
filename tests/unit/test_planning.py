"""Splitting offset ranges into Spark tasks (minPartitions, maxRecordsPerPartition)."""

import pickle

from kafka_source.read.offsets import OffsetRange
from kafka_source.read.planning import (KafkaInputPartition, ReadSettings, input_partitions,
                                   split_ranges)


def r(partition, start, end, topic="t"):
    return OffsetRange(topic, partition, start, end)


def covered(ranges):
    """Every (topic, partition, offset) covered, with multiplicity."""
    return sorted((x.topic, x.partition, o) for x in ranges for o in range(x.start, x.end))


def test_no_options_is_one_task_per_partition_and_drops_empty():
    ranges = [r(0, 0, 10), r(1, 5, 5), r(2, 3, 4)]
    assert split_ranges(ranges) == [r(0, 0, 10), r(2, 3, 4)]


def test_min_partitions_not_above_partition_count_changes_nothing():
    ranges = [r(0, 0, 100), r(1, 0, 1)]
    assert split_ranges(ranges, min_partitions=2) == ranges


def test_min_partitions_splits_in_proportion_to_size():
    # Spark's documented example shape: one skewed partition gets most of the tasks.
    ranges = [r(0, 0, 1000), r(1, 0, 100), r(2, 0, 100)]
    out = split_ranges(ranges, min_partitions=8)
    assert covered(out) == covered(ranges)
    by_partition = {p: [x for x in out if x.partition == p] for p in range(3)}
    assert len(by_partition[1]) == 1 and len(by_partition[2]) == 1
    assert len(by_partition[0]) == 6  # the two small ones are left alone: 8 - 2 pieces
    sizes = [x.size for x in by_partition[0]]
    assert max(sizes) - min(sizes) <= 1
    # pieces are contiguous and in order
    assert [(x.start, x.end) for x in by_partition[0]][0][0] == 0
    assert all(a.end == b.start for a, b in zip(by_partition[0], by_partition[0][1:]))


def test_min_partitions_rounds_half_up_like_spark():
    # partition 1: 5/30 * 3 = 0.5 -> 1 part, left alone; partition 0 then gets 2 of the 3 tasks
    out = split_ranges([r(0, 0, 25), r(1, 0, 5)], min_partitions=3)
    assert [(x.partition, x.start, x.end) for x in out] == [(0, 0, 12), (0, 12, 25), (1, 0, 5)]
    out = split_ranges([r(0, 0, 50), r(1, 0, 50)], min_partitions=5)
    # each range: 50/100 * 5 = 2.5 -> 3 parts with half-up rounding
    assert len(out) == 6
    assert covered(out) == covered([r(0, 0, 50), r(1, 0, 50)])


def test_max_records_per_partition_caps_each_task():
    ranges = [r(0, 10, 35), r(1, 0, 3)]
    out = split_ranges(ranges, max_records_per_partition=10)
    assert all(x.size <= 10 for x in out)
    assert covered(out) == covered(ranges)
    assert len([x for x in out if x.partition == 0]) == 3


def test_max_records_then_min_partitions():
    ranges = [r(0, 0, 20)]
    out = split_ranges(ranges, max_records_per_partition=10, min_partitions=4)
    assert len(out) == 4 and covered(out) == covered(ranges)


def test_small_ranges_never_split_below_one_record():
    out = split_ranges([r(0, 0, 2)], min_partitions=10)
    assert covered(out) == covered([r(0, 0, 2)])
    assert all(x.size > 0 for x in out)


def test_input_partitions_pickle_with_everything_an_executor_needs():
    settings = ReadSettings({"bootstrap_servers": "h:1"}, True, False, 5000)
    parts = input_partitions([[r(0, 0, 5)], [r(1, 2, 9)]], settings)
    assert [p.index for p in parts] == [0, 1]
    back = pickle.loads(pickle.dumps(parts[1]))
    assert isinstance(back, KafkaInputPartition)
    assert back.ranges == (r(1, 2, 9),) and back.settings == settings
