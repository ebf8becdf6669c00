"""One write task: the Arrow batches of a Spark partition -> records on Kafka.

For each Arrow batch: the columns are read as binary (:mod:`.columns`), the rows are grouped by
topic when the topic comes from a column, each row's partition is chosen (:mod:`.routing`), and
the rows go to the producer, which batches, compresses and sends them per partition. At the end
the producer is flushed: the task returns only when every record it wrote is acknowledged (per
``kafka.acks``), and any failure fails the task, so that Spark's task retry gives at-least-once.

The commit message that travels back to the driver is small: how many records went to each
partition, and for exactly-once writes the task's open transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
from pyspark.sql.datasource import WriterCommitMessage

from ..wire.format.arrays import from_numpy
from .columns import Columns, as_binary, normalize_headers
from .routing import Spreader, choose_partitions, split_by_topic

__all__ = ["SinkCommitMessage", "acked_records", "digest_batches", "send_batches", "write_task"]


@dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """What a write task tells the driver. Picklable, small."""

    task: int                                        # Spark's partition id of the task
    records: tuple[tuple[str, int, int], ...] = ()   # (topic, partition, records written)
    # exactly-once writes only:
    query_id: str | None = None
    transaction: object | None = None                # producer.TransactionHandle, not committed
    skipped: bool = False                            # the batch was committed before: no write
    digest: bytes | None = None                      # of the rows written (.digest.RowsDigest)
    repair_round: int = 0                            # > 0: a re-run's transaction (.exactly_once)
    matched: bytes | None = None                     # skipped: the committed digest it matched

    @property
    def total(self) -> int:
        return sum(n for _, _, n in self.records)


class _RowNumbers:
    """Task row number of each row of a slice, for error messages (computed only if asked)."""

    def __init__(self, offset: int, rows: np.ndarray | None):
        self.offset, self.rows = offset, rows

    def __getitem__(self, i: int) -> int:
        return self.offset + (int(self.rows[i]) if self.rows is not None else int(i))


def send_batches(batches: Iterable, producer, columns: Columns, topic_option: str | None,
                 partitions_for_keys, spreader: Spreader | None = None, digest=None) -> int:
    """Send every row of ``batches`` (pyarrow RecordBatches) through ``producer``; return the
    number of rows. Does not flush. ``digest`` (a :class:`.digest.RowsDigest`), if given, is fed
    every group of rows sent."""
    spreader = spreader or Spreader()
    counts: dict[str, int] = {}

    def partition_count(topic: str) -> int:
        if topic not in counts:
            counts[topic] = producer.partition_count(topic)
        return counts[topic]

    total = 0
    for topic, v, k, h, e, row_numbers in row_groups(batches, columns, topic_option):
        if k is None and e is None:
            parts = spreader.spread(topic, len(v), partition_count(topic))
        else:
            parts = choose_partitions(topic, partition_count(topic), k, e, spreader,
                                      partitions_for_keys, row_numbers)
        producer.send(topic, parts, v, k, h)
        if digest is not None:
            digest.update(topic, v, k, h, e)
        total += len(v)
    return total


def digest_batches(batches: Iterable, columns: Columns, topic_option: str | None):
    """The :class:`.digest.RowsDigest` that :func:`send_batches` would compute over
    ``batches``, without sending them."""
    from .digest import RowsDigest

    digest = RowsDigest()
    for topic, v, k, h, e, _ in row_groups(batches, columns, topic_option):
        digest.update(topic, v, k, h, e)
    return digest


def row_groups(batches: Iterable, columns: Columns, topic_option: str | None):
    """Per batch and topic, the rows to send: ``(topic, values, keys, headers, explicit
    partitions, row numbers)``, the columns as binary (:mod:`.columns`) or None when absent."""
    row_offset = 0
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        values = as_binary(batch.column(columns.value))
        keys = as_binary(batch.column(columns.key)) if columns.key else None
        headers = normalize_headers(batch.column(columns.headers)) if columns.headers else None
        explicit = batch.column(columns.partition) if columns.partition else None
        if topic_option is not None:
            groups = [(topic_option, None)]
        else:
            groups = split_by_topic(batch.column(columns.topic), row_offset)
        for topic, rows in groups:
            v, k, h, e = values, keys, headers, explicit
            if rows is not None:
                index = from_numpy(rows)
                v = v.take(index)
                k = k.take(index) if k is not None else None
                h = h.take(index) if h is not None else None
                e = e.take(index) if e is not None else None
            yield topic, v, k, h, e, _RowNumbers(row_offset, rows)
        row_offset += n


def acked_records(producer, before: dict | None = None) -> tuple[tuple[str, int, int], ...]:
    """Records acknowledged per partition, since the ``before`` snapshot of
    ``producer.acked()`` if given (a pooled producer counts every task's)."""
    before = before or {}
    return tuple(sorted((t, p, int(n - before.get((t, p), 0)))
                        for (t, p), n in producer.acked().items() if n - before.get((t, p), 0)))


def write_task(options, columns: Columns, batches: Iterator, task: int, *,
               pool=None) -> SinkCommitMessage:
    """At-least-once: write everything, flush, report the records acknowledged. The producer
    is this Python worker's for these settings, kept for the next task
    (:mod:`.producer_pool`)."""
    from .partitioner import partitions_for_keys
    from .producer_pool import POOL

    with (pool or POOL).lease(options.client_config, options.producer) as producer:
        before = producer.acked()
        send_batches(batches, producer, columns, options.topic, partitions_for_keys)
        producer.flush()
        return SinkCommitMessage(task=task, records=acked_records(producer, before))
