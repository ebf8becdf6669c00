"""Driver side: how much of the backlog one micro-batch takes (Spark's admission control).

Given where each partition's next batch starts and where its log ends, these functions decide the
batch's end offsets, with the semantics of Spark's own Kafka source:

* ``maxOffsetsPerTrigger`` caps the records of a batch. The cap is shared out in proportion to
  each partition's backlog; a partition whose share is below one record gets one (so small
  partitions are never starved), the others get the share rounded down.
* ``minOffsetsPerTrigger`` holds a batch back until that many records are waiting, but never for
  longer than ``maxTriggerDelay`` since the last batch ran.

Pure functions of their inputs (the clock is passed in), so the arithmetic is unit-tested alone.
"""

from __future__ import annotations

import math
from typing import Mapping

from ..wire.net.client import TopicPartition

Offsets = Mapping[TopicPartition, int]


def backlog(start: Offsets, latest: Offsets) -> dict[TopicPartition, int]:
    """Records waiting in each partition that has any (partitions without a start are skipped)."""
    sizes = {}
    for tp, end in latest.items():
        begin = start.get(tp)
        if begin is not None and end > begin:
            sizes[tp] = end - begin
    return sizes


def rate_limit(max_records: int, start: Offsets, latest: Offsets) -> dict[TopicPartition, int]:
    """End offsets that take at most about ``max_records`` from the backlog, shared by size."""
    sizes = backlog(start, latest)
    total = sum(sizes.values())
    if total <= max_records:
        return dict(latest)
    ends = {}
    for tp, end in latest.items():
        size = sizes.get(tp)
        if size is None:
            ends[tp] = end
            continue
        share = max_records * (size / total)
        take = math.ceil(share) if share < 1 else math.floor(share)
        ends[tp] = min(end, start[tp] + take)
    return ends


def hold_back(min_records: int, start: Offsets, latest: Offsets, *, now_ms: int,
              last_batch_ms: int, max_delay_ms: int) -> bool:
    """True when the batch should wait for more data (``minOffsetsPerTrigger``)."""
    if now_ms - last_batch_ms >= max_delay_ms:
        return False
    return sum(backlog(start, latest).values()) < min_records
