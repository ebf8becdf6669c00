"""A Spark job run in its own process by ``test_faults.py``'s task-retry test.

Spark in local mode retries a failed task only when the master says so (``local[N,F]``, F = the
attempts a task gets; ``spark.task.maxFailures`` is ignored there, measured on PySpark 4.3), and a
process has one SparkSession, so the test runs this job in a subprocess with such a master while
it kills a Python worker that is in the middle of a read. The job:

1. reads ``--batch-topic`` with ``spark.read.format("pykafka")`` and writes the rows it got
   (partition, offset, value) as JSON lines to ``OUT/batch.jsonl``;
2. streams ``--stream-topic`` with ``Trigger.AvailableNow`` (several micro-batches) into a
   checkpointed parquet sink ``OUT/stream`` as a member of ``--group``.

Progress goes to stdout, one line per step; the test reads the output and the group's commits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--batch-topic", required=True)
    parser.add_argument("--stream-topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-per-trigger", type=int, default=100)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    import kafka_source

    spark = (SparkSession.builder.master(args.master).appName("pykafka-task-retry")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.python.worker.faulthandler.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    kafka_source.register(spark)
    common = {"kafka.bootstrap.servers": args.bootstrap, "kafka.request.timeout.ms": "30000"}
    try:
        batch = (spark.read.format("pykafka").options(**common)
                 .option("subscribe", args.batch_topic).option("minPartitions", "4").load()
                 .selectExpr("partition", "offset", "CAST(value AS STRING) AS value"))
        rows = batch.collect()
        with open(os.path.join(args.out, "batch.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps([r.partition, r.offset, r.value]) + "\n")
        print(f"JOB batch read {len(rows)} rows", flush=True)

        stream = (spark.readStream.format("pykafka").options(**common)
                  .option("subscribe", args.stream_topic).option("kafka.group.id", args.group)
                  .option("startingOffsets", "earliest")
                  .option("kafka.session.timeout.ms", "6000")
                  .option("kafka.heartbeat.interval.ms", "1000")
                  .option("maxOffsetsPerTrigger", str(args.max_per_trigger)).load()
                  .selectExpr("partition", "offset", "CAST(value AS STRING) AS value"))
        query = (stream.writeStream.format("parquet")
                 .option("path", os.path.join(args.out, "stream"))
                 .option("checkpointLocation", os.path.join(args.out, "checkpoint"))
                 .trigger(availableNow=True).start())
        if not query.awaitTermination(240):
            query.stop()
            print("JOB stream did not finish within 240 s", flush=True)
            return 2
        if query.exception() is not None:
            print(f"JOB stream failed: {query.exception()}", flush=True)
            return 3
        batches = [p["numInputRows"] for p in query.recentProgress]
        print(f"JOB stream done: rows per micro-batch {batches}", flush=True)
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
