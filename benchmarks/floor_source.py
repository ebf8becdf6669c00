"""The floor: a Python data source with no Kafka at all, for PySpark's own cost of a Python source.

``run.py`` registers :class:`FloorDataSource` under :data:`FLOOR_NAME` in its own session only
(``spark.dataSource.register``) and reads it with the same query as pykafka, on the same rows:

* the schema is pykafka's own (``kafka_source.schema``: key, value, topic, partition, offset,
  timestamp, timestampType, with the same nullability), taken from the source, not copied;
* the rows: per Kafka partition of the workload as many records as the topic holds
  (``counts``), every value ``valueSize`` bytes, key null, the topic's name, offsets from 0;
* the input partitions: planned by pykafka's own planner (``plan_input_partitions`` with the
  same parallelism, and ``maxOffsetsPerTrigger`` shared out by pykafka's admission control for
  streams), so the floor runs as many tasks with as many records each as pykafka does;
* ``read()`` builds its Arrow record batches in the executor from a few integers (no data is
  pickled): one template of up to ``batchBytes`` of values (8 MiB, about what pykafka's decoder
  yields per batch) made once per task, and per batch only a new offset column on slices of it.

So a floor figure is what Spark spends on a Python source that yields exactly pykafka's output at
no cost of its own: planning in the Python planner process, task start-up, Arrow transfer from
the Python worker to the JVM, the query. The same applies to streams (an AvailableNow stream over
the same offsets, start-up included).

Options (all strings): ``topic``, ``counts`` (JSON ``{"partition": records}``), ``valueSize``,
``parallelism`` (Spark's default parallelism, as ``kafka_source.register`` gives pykafka),
``batchBytes``, ``maxOffsetsPerTrigger`` (streams), ``rate`` (streams: records/s arriving
over the partitions, :class:`FloorStreamReader`), and ``pykafka.<option>`` for pykafka planning
options (``minPartitions``, ``maxRecordsPerPartition``, ``maxPartitions``) given to both.

With ``fetchFrom`` (bootstrap servers) it is the *fetch floor*: the same batches, yielded as
pykafka's own fetch loop brings the task's ranges from the broker, whose bytes are not decoded
(:func:`fetched_floor_batches`). Between the floor and it lies what any Kafka reader pays on the
machine (the broker's sending, the kernel's receiving); between it and pykafka, the decoding.
"""

from __future__ import annotations

import json
import time
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, \
    InputPartition
from kafka_source.spark_features import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                         SupportsTriggerAvailableNow)

FLOOR_NAME = "pykafka_floor"
DEFAULT_BATCH_BYTES = 8 << 20
_PLANNING_OPTIONS = ("minpartitions", "maxrecordsperpartition", "maxpartitions")


class FloorPartition(InputPartition):
    """One task: ``ranges`` of (kafka partition, start offset, end offset); a few integers."""

    def __init__(self, index: int, topic: str, ranges: tuple, size: int, batch_rows: int,
                 fetch_from: str | None = None):
        super().__init__(index)
        self.topic, self.ranges, self.size, self.batch_rows = topic, ranges, size, batch_rows
        self.fetch_from = fetch_from


class _Spec:
    """The floor's options, parsed."""

    def __init__(self, options):
        opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
        self.topic = opts["topic"]
        self.counts = {int(p): int(n) for p, n in json.loads(opts["counts"]).items()}
        self.size = int(opts["valuesize"])
        self.parallelism = int(opts["parallelism"]) if opts.get("parallelism") else None
        self.batch_rows = max(1, int(opts.get("batchbytes", DEFAULT_BATCH_BYTES)) // self.size)
        self.max_offsets = int(opts["maxoffsetspertrigger"]) \
            if opts.get("maxoffsetspertrigger") else None
        self.fetch_from = opts.get("fetchfrom") or None
        # records/s arriving over the partitions in turn (scale.py's trickle); None: all there
        self.rate = float(opts["rate"]) if opts.get("rate") else None
        self.pykafka = {k[len("pykafka."):]: v for k, v in opts.items()
                        if k.startswith("pykafka.") and k[len("pykafka."):] in _PLANNING_OPTIONS}

    def plan(self, start: dict[int, int], end: dict[int, int], *, stream: bool) -> list:
        """pykafka's input partitions for these offsets (its planner, its options)."""
        from kafka_source.config.options import parse_batch_options, parse_stream_options
        from kafka_source.read.offsets import OffsetRange
        from kafka_source.read.planning import plan_input_partitions

        opts = {"kafka.bootstrap.servers": "floor.invalid:9092", "subscribe": self.topic,
                **self.pykafka}
        source = parse_stream_options(opts).source if stream else parse_batch_options(opts)
        ranges = [OffsetRange(self.topic, p, start[p], end[p]) for p in sorted(end)
                  if end[p] > start[p]]
        planned = plan_input_partitions(ranges, source, parallelism=self.parallelism)
        return [FloorPartition(part.index, self.topic,
                               tuple((r.partition, r.start, r.end) for r in part.ranges),
                               self.size, self.batch_rows, self.fetch_from)
                for part in planned]


def _template(partition: FloorPartition):
    """``make(kafka_partition, first, end)``: the batches of those offsets, sliced from a
    template of up to ``batch_rows`` rows made once per task (None when the task is empty)."""
    import numpy as np
    import pyarrow as pa

    from kafka_source.schema import arrow_schema

    ranges = partition.ranges
    n = min(partition.batch_rows, max((end - start for _p, start, end in ranges), default=0))
    if n <= 0:
        return None
    size, name = partition.size, partition.topic.encode()
    schema = arrow_schema(False)

    def fixed_width(type_, width: int, data) -> pa.Array:
        offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    values = fixed_width(pa.binary(), size, np.full(n * size, ord("x"), dtype=np.uint8))
    topics = fixed_width(pa.string(), len(name), name * n)
    keys = pa.nulls(n, pa.binary())
    stamp = pa.array(np.full(n, int(time.time() * 1e6), dtype=np.int64),
                     pa.timestamp("us", tz="UTC"))
    types = pa.array(np.zeros(n, dtype=np.int32))
    parts = {}

    def make(kafka_partition: int, start: int, end: int) -> Iterator:
        if kafka_partition not in parts:
            parts[kafka_partition] = pa.array(np.full(n, kafka_partition, dtype=np.int32))
        column = parts[kafka_partition]
        for first in range(start, end, n):
            k = min(n, end - first)
            offsets = pa.array(np.arange(first, first + k, dtype=np.int64))
            yield pa.RecordBatch.from_arrays(
                [keys.slice(0, k), values.slice(0, k), topics.slice(0, k), column.slice(0, k),
                 offsets, stamp.slice(0, k), types.slice(0, k)], schema=schema)

    return make


def floor_batches(partition: FloorPartition) -> Iterator:
    """The task's records as Arrow batches of pykafka's schema, made here from a template (or,
    with ``fetchFrom``, as the fetch goes: :func:`fetched_floor_batches`)."""
    if partition.fetch_from:
        yield from fetched_floor_batches(partition, partition.fetch_from)
        return
    make = _template(partition)
    if make is None:
        return
    for kafka_partition, start, end in partition.ranges:
        yield from make(kafka_partition, start, end)


def fetched_floor_batches(partition: FloorPartition, bootstrap: str) -> Iterator:
    """The floor with Kafka's transport: the task's ranges are fetched from the broker by
    pykafka's own fetch loop (its connections, requests, fetch sessions and request sizes), and
    each response's bytes are thrown away unread past the batch headers: instead of decoding
    them the task yields the floor's template batches for the offsets the response covered.
    What this costs over the floor is what any Kafka reader pays on this machine (the broker
    sending, the kernel receiving); what pykafka costs over this is its decoding."""
    from kafka_source.config.options import parse_batch_options
    from kafka_source.read.executor import worker_client
    from kafka_source.read.fetcher import FetchSettings, RangeFetcher
    from kafka_source.read.offsets import OffsetRange
    from kafka_source.wire.format.records import scan_batches

    make = _template(partition)
    if make is None:
        return
    options = parse_batch_options({"kafka.bootstrap.servers": bootstrap,
                                   "subscribe": partition.topic})
    config = options.client_config
    settings = FetchSettings.from_config(config, poll_timeout_ms=options.poll_timeout_ms,
                                         fail_on_data_loss=True)

    def skip(data, position, aborted, r):
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        scan = scan_batches(view, start_offset=position, end_offset=r.end)
        return list(make(r.partition, position, min(scan.next_offset, r.end))), \
            scan.next_offset, False

    ranges = [OffsetRange(partition.topic, p, start, end) for p, start, end in partition.ranges]
    with worker_client(config) as client:
        for batches in RangeFetcher(client, settings)._read(ranges, skip):
            yield from batches


class FloorBatchReader(DataSourceReader):
    def __init__(self, spec: _Spec):
        self.spec = spec

    def partitions(self) -> list:
        counts = self.spec.counts
        return self.spec.plan({p: 0 for p in counts}, counts, stream=False) or \
            [InputPartition(None)]

    def read(self, partition) -> Iterator:
        if not isinstance(partition, FloorPartition):
            return iter(())
        return floor_batches(partition)


class FloorStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """All of ``counts`` is there from the start; ``maxOffsetsPerTrigger`` is shared out over
    the partitions by pykafka's own admission control (``rate_limit``). With ``rate``, the
    partitions of ``counts`` start empty and records arrive at that rate, to every partition in
    turn from the reader's construction on, as ``scale.py``'s trickle writes them to Kafka."""

    def __init__(self, spec: _Spec):
        self.spec = spec
        self._next: dict | None = None    # PySpark 4.0/4.1: the next batch's start
        self._started = time.monotonic()
        self._order = sorted(spec.counts)

    def initialOffset(self) -> dict:
        return {str(p): 0 for p in self.spec.counts}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.spec.max_offsets is not None:
            return ReadMaxRows(self.spec.max_offsets)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        pass            # the data never grows: the end is always ``counts``

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        from kafka_source.read.admission import rate_limit

        if start is None:   # PySpark 4.0/4.1 (kafka_source.spark_features): as pykafka's reader
            start = self._next if self._next is not None else self.initialOffset()
            limit = self.getDefaultReadLimit()
        begin = {int(p): int(o) for p, o in start.items()}
        end = dict(self.spec.counts) if self.spec.rate is None else self._arrived()
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(limit.max_rows, begin, end)
        return {str(p): o for p, o in end.items()}

    def _arrived(self) -> dict[int, int]:
        """Each partition's end offset under ``rate`` (records so far, dealt out in turn)."""
        total = int(self.spec.rate * (time.monotonic() - self._started))
        each, extra = divmod(total, len(self._order))
        return {p: each + (i < extra) for i, p in enumerate(self._order)}

    def partitions(self, start: dict, end: dict) -> list:
        self._next = end
        return self.spec.plan({int(p): int(o) for p, o in start.items()},
                              {int(p): int(o) for p, o in end.items()}, stream=True)

    def read(self, partition) -> Iterator:
        return floor_batches(partition)

    def commit(self, end: dict) -> None:
        pass


class FloorDataSource(DataSource):
    """``spark.read.format("pykafka_floor")`` / ``readStream``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return FLOOR_NAME

    def schema(self):
        from kafka_source.schema import spark_schema

        return spark_schema(False)

    def reader(self, schema) -> DataSourceReader:
        return FloorBatchReader(_Spec(self.options))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return FloorStreamReader(_Spec(self.options))


def floor_options(topic: str, counts: dict[int, int], size: int, parallelism: int | None,
                  batch_bytes: int, pykafka_options: dict[str, str]) -> dict[str, str]:
    """The floor's options for a workload (``pykafka_options``: those of the pykafka read that
    change its planning are passed on)."""
    out = {"topic": topic, "counts": json.dumps({str(p): n for p, n in counts.items()}),
           "valueSize": str(size), "batchBytes": str(batch_bytes)}
    if parallelism:
        out["parallelism"] = str(parallelism)
    out.update({f"pykafka.{k}": v for k, v in pykafka_options.items()
                if k.lower() in _PLANNING_OPTIONS})
    return out
