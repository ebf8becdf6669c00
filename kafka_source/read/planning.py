"""Driver side: turn offset ranges into Spark input partitions (tasks), by the work.

Spark's own Kafka source makes one task per Kafka partition. Every Python task costs Spark about
28 ms whatever it reads, so a micro-batch of 20,000 records over 8 partitions would spend most
of its time starting tasks. Here the number of tasks follows the cores and the size of the work:

1. **Split** large ranges as Spark does (:func:`split_ranges`): ``maxRecordsPerPartition`` cuts
   a range into pieces of at most that many records, ``minPartitions`` asks for at least that
   many pieces, the larger ranges split in proportion to their size. Unchanged Spark semantics.
2. **Count** the tasks (:func:`task_count`): as many as the work is worth -- one per
   :data:`MIN_TASK_RECORDS` records -- but no more than ``maxPartitions`` (default: Spark's
   default parallelism, i.e. the cores, as seen by ``kafka_source.register(spark)``), never more
   than there are pieces, never fewer than ``minPartitions``, and enough that no task holds more
   than ``maxRecordsPerPartition`` records.
3. **Pack** the pieces into that many tasks (:func:`pack_ranges`): the pieces, ordered by
   partition leader, topic, partition and offset, are cut into consecutive groups with the
   largest group as small as possible. So tasks are balanced by records and a task's partitions
   mostly share a leader, which the executor then fetches in one Fetch request per round
   (:mod:`kafka_source.read.fetcher`).

A big read therefore keeps one task per partition or piece, as in Spark, unless there are more
pieces than cores; a small micro-batch becomes one or a few tasks. Each range is still read
exactly, in offset order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from pyspark.sql.datasource import InputPartition

from .offsets import OffsetRange
from ..config.options import SourceOptions


@dataclass(frozen=True)
class ReadSettings:
    """What an executor needs to read its ranges: everything travels inside the partition."""

    client_config: Mapping[str, object]
    include_headers: bool
    fail_on_data_loss: bool
    poll_timeout_ms: int
    formats: object = None          # kafka_source.formats.options.Formats, or None (binary)

    @classmethod
    def from_options(cls, options: SourceOptions) -> "ReadSettings":
        return cls(client_config=dict(options.client_config),
                   include_headers=options.include_headers,
                   fail_on_data_loss=options.fail_on_data_loss,
                   poll_timeout_ms=options.poll_timeout_ms,
                   formats=options.formats)


class KafkaInputPartition(InputPartition):
    """One Spark task: one or more offset ranges and how to read them. Pickled to executors."""

    def __init__(self, index: int, ranges: Sequence[OffsetRange], settings: ReadSettings):
        super().__init__(index)
        self.index = index
        self.ranges = tuple(ranges)
        self.settings = settings

    def __repr__(self) -> str:
        shown = ", ".join(f"{r.topic}-{r.partition}[{r.start},{r.end})" for r in self.ranges[:4])
        return f"KafkaInputPartition({self.index}: {shown}{' ...' if len(self.ranges) > 4 else ''})"


def _split_evenly(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``parts`` contiguous pieces of ``r``; the later pieces take the rounding remainder."""
    pieces = []
    remaining, start = r.size, r.start
    for part in range(parts):
        length = remaining // (parts - part)
        remaining -= length
        pieces.append(OffsetRange(r.topic, r.partition, start, start + length, r.epoch))
        start += length
    return [p for p in pieces if p.size > 0]


def _part_count(size: int, total: int, wanted: int) -> int:
    # Spark rounds half up (Scala's math.round); Python's round() would round half to even.
    return max(int(size / total * wanted + 0.5), 1)


def split_ranges(ranges: Sequence[OffsetRange], *, min_partitions: int | None = None,
                 max_records_per_partition: int | None = None) -> list[OffsetRange]:
    """Split ranges for parallelism; empty ranges are dropped.

    1. With ``max_records_per_partition``, a range is cut into ceil(size / max) even pieces.
    2. If that leaves fewer than ``min_partitions`` pieces, the larger pieces are split further:
       each gets round(size / total_of_split_pieces * (min_partitions - unsplit_count)) parts,
       where pieces that would get a single part anyway are left alone (Spark's algorithm).
    """
    result = [r for r in ranges if r.size > 0]
    if max_records_per_partition:
        result = [piece for r in result
                  for piece in _split_evenly(r, -(-r.size // max_records_per_partition))]
    if not min_partitions or len(result) >= min_partitions:
        return result
    total = sum(r.size for r in result)
    unsplit = [r for r in result if _part_count(r.size, total, min_partitions) == 1]
    split_total = total - sum(r.size for r in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    unsplit_ids = {id(r) for r in unsplit}
    out = []
    for r in result:
        parts = 1 if id(r) in unsplit_ids else _part_count(r.size, split_total, split_min)
        out.extend(_split_evenly(r, parts))
    return out


# Work below this many records is not worth a task of its own. A Python task costs Spark ~28 ms
# and a second task on the same cores saves less than that on small work. Measured at local[2]
# with 100-byte records: 100,000-record micro-batches ran 25 ms faster per batch as one task than
# as two, 20,000-record ones 10-30 ms; a 1,000,000-record batch read was fastest as two tasks
# (0.45 s against 0.53 s for one and 0.55 s for four).
MIN_TASK_RECORDS = 100_000


def task_count(sizes: Sequence[int], *, max_partitions: int | None,
               min_partitions: int | None = None,
               max_records_per_partition: int | None = None) -> int:
    """How many tasks to make of pieces with these record counts (rule 2 above)."""
    if not sizes:
        return 0
    total = sum(sizes)
    tasks = max(1, math.ceil(total / MIN_TASK_RECORDS))
    if max_partitions:
        tasks = min(tasks, max_partitions)
    if min_partitions:
        tasks = max(tasks, min_partitions)
    if max_records_per_partition:
        tasks = max(tasks, _greedy_groups(sizes, max_records_per_partition))
    return min(tasks, len(sizes))


def _greedy_groups(sizes: Sequence[int], cap: int) -> int:
    """Consecutive groups needed so that none exceeds ``cap`` (every size is at most cap)."""
    groups, load = 0, cap + 1
    for size in sizes:
        if load + size > cap:
            groups, load = groups + 1, 0
        load += size
    return groups


def pack_ranges(pieces: Sequence[OffsetRange], tasks: int,
                leaders: Mapping[tuple[str, int], object] | None = None
                ) -> list[list[OffsetRange]]:
    """``pieces`` in exactly ``tasks`` (<= len(pieces)) groups of consecutive pieces, in
    (leader, topic, partition, offset) order, whose largest record count is as small as
    possible; adjacent pieces of one partition in a group are merged back into one range."""
    leaders = leaders or {}
    order = sorted(pieces, key=lambda r: (str(leaders.get(r.topic_partition, "")), r.topic,
                                          r.partition, r.start))
    if tasks >= len(order):
        return [[r] for r in order]
    sizes = [r.size for r in order]
    # The smallest cap under which greedy grouping needs at most `tasks` groups.
    lo, hi = max(sizes), sum(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        if _greedy_groups(sizes, mid) <= tasks:
            hi = mid
        else:
            lo = mid + 1
    groups: list[list[OffsetRange]] = []
    current: list[OffsetRange] = []
    load = 0
    n = len(order)
    for i, r in enumerate(order):
        # Close the group when it would exceed the cap, or when the pieces left are only just
        # enough to give every remaining task one.
        if current and (load + r.size > lo or n - i < tasks - len(groups)):
            groups.append(current)
            current, load = [], 0
        current.append(r)
        load += r.size
    groups.append(current)
    return [_merge_adjacent(g) for g in groups]


def _merge_adjacent(group: list[OffsetRange]) -> list[OffsetRange]:
    out: list[OffsetRange] = []
    for r in group:
        last = out[-1] if out else None
        if last is not None and last.topic_partition == r.topic_partition and last.end == r.start:
            out[-1] = OffsetRange(r.topic, r.partition, last.start, r.end, r.epoch)
        else:
            out.append(r)
    return out


#: The leaders a planner groups ranges by (``leaders``) come from a Metadata answer at most
#: this old (``BrokerClient.cached_leaders``): the one that routed the ListOffsets of the
#: stream's trigger or the batch read, which is older than that by the time Spark asks for
#: partitions.
LEADERS_MAX_AGE_MS = 60_000


def plan_input_partitions(ranges: Sequence[OffsetRange], options: SourceOptions, *,
                          parallelism: int | None,
                          leaders: Mapping[tuple[str, int], object] | None = None
                          ) -> list[KafkaInputPartition]:
    """Rules 1-3 of the module docstring: the tasks that read ``ranges``. ``parallelism`` is
    Spark's default parallelism when known; the ``maxPartitions`` option overrides it."""
    pieces = split_ranges(ranges, min_partitions=options.min_partitions,
                          max_records_per_partition=options.max_records_per_partition)
    tasks = task_count([r.size for r in pieces],
                       max_partitions=options.max_partitions or parallelism,
                       min_partitions=options.min_partitions,
                       max_records_per_partition=options.max_records_per_partition)
    return input_partitions(pack_ranges(pieces, tasks, leaders),
                            ReadSettings.from_options(options))


def input_partitions(groups: Sequence[Sequence[OffsetRange]], settings: ReadSettings
                     ) -> list[KafkaInputPartition]:
    """One input partition per group of ranges."""
    return [KafkaInputPartition(i, g, settings) for i, g in enumerate(groups)]
