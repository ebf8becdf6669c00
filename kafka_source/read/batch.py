"""``spark.read.format("pykafka")``: the batch reader.

``partitions()`` runs on the driver: it resolves the offset ranges (:mod:`kafka_source.read.offsets`)
and splits or packs them into tasks (:mod:`kafka_source.read.planning`). ``read()`` runs in an executor's Python
worker for one task: it fetches and decodes the task's ranges (:mod:`kafka_source.read.fetcher`) and
yields Arrow batches (:mod:`kafka_source.wire.format.arrow`).
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from .executor import read_input_partition
from ..config.options import SourceOptions
from .planning import LEADERS_MAX_AGE_MS, plan_input_partitions
from ..worker_socket import AcksJvmOnUnpickle


class KafkaBatchReader(AcksJvmOnUnpickle, DataSourceReader):
    def __init__(self, options: SourceOptions, parallelism: int | None = None):
        self.options = options
        self.parallelism = parallelism    # Spark's default parallelism, if known

    def partitions(self) -> list[InputPartition]:
        from ..wire.net.client import BrokerClient
        from .offsets import plan_batch_ranges

        opts = self.options
        with BrokerClient(opts.client_config) as client:
            ranges = plan_batch_ranges(client, opts)
            # The leaders of the Metadata answer that routed its ListOffsets: a task's
            # ranges then come from as few brokers as possible.
            leaders = client.cached_leaders([r.topic_partition for r in ranges],
                                           LEADERS_MAX_AGE_MS)
        parts = plan_input_partitions(ranges, opts, parallelism=self.parallelism,
                                      leaders=leaders)
        # Nothing to read: one empty task, so the query still runs and returns no rows.
        return parts or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if getattr(partition, "ranges", None) is None:
            return iter(())
        return read_input_partition(partition)
