"""Planning Spark tasks from offset ranges: Spark's splitting (minPartitions,
maxRecordsPerPartition), then packing small ranges into about as many tasks as cores."""

import itertools
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_source.config.options import parse_batch_options
from kafka_source.errors import OptionError
from kafka_source.read.offsets import OffsetRange
from kafka_source.read.planning import (MIN_TASK_RECORDS, KafkaInputPartition, ReadSettings,
                                        input_partitions, pack_ranges, plan_input_partitions,
                                        split_ranges, task_count)


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


# --- how many tasks, and packing ranges into them ----------------------------------------------

def test_task_count_follows_the_work_and_the_cores():
    small = [MIN_TASK_RECORDS // 4] * 8                  # 8 ranges, 2 x MIN_TASK_RECORDS
    assert task_count(small, max_partitions=4) == 2      # as many tasks as the work is worth
    assert task_count([1] * 8, max_partitions=4) == 1
    big = [10 * MIN_TASK_RECORDS] * 8
    assert task_count(big, max_partitions=4) == 4        # the cores
    assert task_count(big, max_partitions=None) == 8     # cores unknown: one per range
    assert task_count(big, max_partitions=64) == 8       # never more tasks than ranges
    assert task_count([], max_partitions=4) == 0


def test_task_count_keeps_min_partitions_and_max_records_per_partition():
    assert task_count([10] * 8, max_partitions=2, min_partitions=5) == 5
    # at most 25 records per task: 8 ranges of 10 need 4 tasks whatever the cores
    assert task_count([10] * 8, max_partitions=1, max_records_per_partition=25) == 4
    assert task_count([10] * 3, max_partitions=1, min_partitions=10) == 3


def test_pack_makes_exactly_that_many_balanced_groups_in_leader_order():
    pieces = [r(p, 0, 10) for p in range(6)]
    leaders = {("t", p): 1 + p % 2 for p in range(6)}          # leaders 1 and 2 alternate
    groups = pack_ranges(pieces, 2, leaders)
    assert [[x.partition for x in g] for g in groups] == [[0, 2, 4], [1, 3, 5]]
    # balance comes first: unequal sizes may put partitions of two leaders in one task
    pieces = [r(p, 0, 10 * (p + 1)) for p in range(6)]
    groups = pack_ranges(pieces, 3)
    assert [[x.partition for x in g] for g in groups] == [[0, 1, 2], [3, 4], [5]]
    assert max(sum(x.size for x in g) for g in groups) == 90


def test_pack_merges_adjacent_pieces_of_a_partition():
    pieces = split_ranges([r(0, 0, 100)], max_records_per_partition=10)
    groups = pack_ranges(pieces, 2)
    assert groups == [[r(0, 0, 50)], [r(0, 50, 100)]]


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 1000), min_size=1, max_size=25), data=st.data())
def test_pack_covers_every_offset_once_with_the_smallest_largest_task(sizes, data):
    pieces = [r(p, 7, 7 + n) for p, n in enumerate(sizes)]
    tasks = data.draw(st.integers(1, len(pieces)))
    groups = pack_ranges(pieces, tasks)
    assert len(groups) == tasks and all(groups)
    assert covered([x for g in groups for x in g]) == covered(pieces)
    # no way of cutting the sequence into `tasks` consecutive groups has a smaller largest one
    best = min(max(sum(sizes[a:b]) for a, b in zip((0,) + cut, cut + (len(sizes),)))
               for cut in itertools.combinations(range(1, len(sizes)), tasks - 1)) \
        if len(sizes) <= 12 else None
    if best is not None:
        assert max(sum(x.size for x in g) for g in groups) == best


def options(**kw):
    return parse_batch_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t", **kw})


def test_plan_packs_a_small_read_into_one_task_and_a_big_one_by_cores():
    small = [r(p, 0, 1000) for p in range(8)]
    parts = plan_input_partitions(small, options(), parallelism=2)
    assert len(parts) == 1 and len(parts[0].ranges) == 8
    big = [r(p, 0, 4 * MIN_TASK_RECORDS) for p in range(8)]
    parts = plan_input_partitions(big, options(), parallelism=2)
    assert [len(p.ranges) for p in parts] == [4, 4]
    assert [p.index for p in parts] == [0, 1]
    # maxPartitions overrides the parallelism Spark reported
    assert len(plan_input_partitions(big, options(maxPartitions="8"), parallelism=2)) == 8
    # Spark's options keep their meaning: at least minPartitions tasks ...
    parts = plan_input_partitions(small, options(minPartitions="16"), parallelism=2)
    assert len(parts) == 16 and covered([x for p in parts for x in p.ranges]) == covered(small)
    # ... and at most maxRecordsPerPartition records in each
    parts = plan_input_partitions(small, options(maxRecordsPerPartition="300"), parallelism=2)
    assert all(sum(x.size for x in p.ranges) <= 300 for p in parts)
    assert covered([x for p in parts for x in p.ranges]) == covered(small)


def test_max_partitions_option_is_checked():
    assert options(maxPartitions="3").max_partitions == 3
    with pytest.raises(OptionError, match="'maxPartitions' must be a positive integer"):
        options(maxPartitions="0")
    with pytest.raises(OptionError, match=r"'minPartitions' \(5\) can't be greater than "
                                          r"'maxPartitions' \(2\)"):
        options(minPartitions="5", maxPartitions="2")
