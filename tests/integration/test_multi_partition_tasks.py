"""Tasks that read several Kafka partitions: exactly the right rows, batch and stream.

The planner packs small ranges into about as many tasks as Spark has cores
(:mod:`kafka_source.read.planning`); each task fetches its partitions together, one Fetch
request per leader and round, with a fetch session (:mod:`kafka_source.read.fetcher`). Small
byte limits force many rounds per range, ranges ending mid-batch, batches cut by the limit and
the last-request sizing; the rows must equal what a plain consumer reads.
"""

from __future__ import annotations

import json
import math

from pyspark.sql.functions import countDistinct, spark_partition_id

from kafka_source.testing import create_topic, unique_topic_name

from .spark_features import AVAILABLE_NOW_IN_MICRO_BATCHES
from .test_batch_read import (consume_all, end_offsets_json, produce, reader, spark_rows,
                              varied_records)
from .test_stream import (data_batches, expected_rows, group_timeouts,  # noqa: F401 - fixture
                          load_stream, produce_counts, stream_options)


def test_batch_tasks_of_several_partitions_read_exactly(spark, bootstrap_servers):
    topic = unique_topic_name("multi")
    create_topic(bootstrap_servers, topic, partitions=6)
    records = varied_records(1800)
    # partitions 0-2 lz4-compressed batches, 3-5 uncompressed ones
    produce(bootstrap_servers, topic, records[:900], partition_of=lambda i: i % 3,
            compression="lz4")
    produce(bootstrap_servers, topic, records[900:], partition_of=lambda i: 3 + i % 3)
    expected = consume_all(bootstrap_servers, topic, range(6), len(records))
    ends = json.loads(end_offsets_json(topic, expected, range(6)))
    # Slices: start inside the log and end before its end for some partitions.
    starts = {"0": 17, "1": -2, "2": 100, "3": 0, "4": 250, "5": 3}
    ends[topic].update({"0": 290, "4": 299, "5": 4})
    want = [row for row in expected
            if (starts[str(row[0])] if starts[str(row[0])] >= 0 else 0) <= row[1]
            < ends[topic][str(row[0])]]
    df = reader(spark, bootstrap_servers, subscribe=topic, includeHeaders="true",
                startingOffsets=json.dumps({topic: starts}), endingOffsets=json.dumps(ends),
                minPartitions="2", **{"kafka.max.partition.fetch.bytes": "3000"})
    assert df.rdd.getNumPartitions() == 2     # 1,500 records: the 2 minPartitions ask for
    assert spark_rows(df) == want
    per_task = df.groupBy(spark_partition_id().alias("task")).agg(
        countDistinct("partition")).collect()
    # the six partitions are shared out by records: each task reads several of them
    counts = [r[1] for r in per_task]
    assert len(counts) == 2 and sum(counts) == 6 and min(counts) >= 2, counts


@AVAILABLE_NOW_IN_MICRO_BATCHES
def test_stream_micro_batches_of_several_partitions_exactly_once(spark, bootstrap_servers,
                                                                  group_timeouts, tmp_path):
    topic = unique_topic_name("multi-stream")
    create_topic(bootstrap_servers, topic, partitions=5)
    counts = {p: 30 + 7 * p for p in range(5)}
    produce_counts(bootstrap_servers, topic, counts)
    tasks_per_batch: list[int] = []
    rows: list[tuple] = []

    def sink(batch_df, _batch_id):
        tasks_per_batch.append(batch_df.rdd.getNumPartitions())
        rows.extend((r.partition, r.offset, r.value) for r in batch_df.collect())

    opts = stream_options(bootstrap_servers, topic, group_timeouts,
                          startingOffsets="earliest", maxOffsetsPerTrigger=60,
                          **{"kafka.max.partition.fetch.bytes": "200"})
    query = (load_stream(spark, opts)
             .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
             .writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "AvailableNow query did not finish within 180 s"
    assert query.exception() is None, query.exception()
    assert sorted(rows) == expected_rows(counts)            # no loss, no duplicates
    batches = data_batches(query)
    assert len(batches) >= math.ceil(sum(counts.values()) / 60)
    # each micro-batch read all five partitions in one task (60 records are not worth more)
    assert tasks_per_batch and max(tasks_per_batch) == 1
