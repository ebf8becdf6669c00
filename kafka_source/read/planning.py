"""Driver side: split offset ranges into Spark input partitions.

By default each Kafka partition's range is one Spark task. ``maxRecordsPerPartition`` caps the
records in one task, and ``minPartitions`` asks for at least that many tasks: large ranges are
split in proportion to their size, the way Spark's own Kafka source does it.
"""

from __future__ import annotations

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

    @classmethod
    def from_options(cls, options: SourceOptions) -> "ReadSettings":
        return cls(client_config=dict(options.client_config),
                   include_headers=options.include_headers,
                   fail_on_data_loss=options.fail_on_data_loss,
                   poll_timeout_ms=options.poll_timeout_ms)


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
        pieces.append(OffsetRange(r.topic, r.partition, start, start + length))
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


def input_partitions(ranges: Sequence[OffsetRange], settings: ReadSettings
                     ) -> list[KafkaInputPartition]:
    return [KafkaInputPartition(i, [r], settings) for i, r in enumerate(ranges)]
