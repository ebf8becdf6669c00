"""An exactly-once streaming write run in its own process by ``test_sink.py``.

Spark in local mode retries a failed task only with a ``local[N,F]`` master (F attempts per
task), and a process has one SparkSession, so this runs as a subprocess with such a master. It
copies ``--source`` to ``--out`` with ``format("pykafka")`` on both sides, ``exactlyOnce`` on the
sink and ``Trigger.AvailableNow``, three times on one checkpoint:

1. with a UDF in the query that kills its Python worker (``os._exit``) in the first attempt of
   the first task that reaches row ``KILL_AT_ROW`` -- once records of that attempt are on the
   broker, uncommitted -- so Spark retries the task while its transaction is open (the source
   values are :func:`padded`, for the reason given there);
2. after ``--more`` new source records were produced: a plain restart;
3. after the last entry of the checkpoint's commit log was deleted: Spark runs that micro-batch
   again, as after a driver crash between the sink's commit and Spark's commit log.

It prints ``JOB {json}`` lines; the test reads the output topic back.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

KILL_AT_ROW = 250
# A Python worker sends its UDF results back in a buffered stream (64 KiB) that it flushes when
# full: rows this large make the rows before KILL_AT_ROW reach the writer before the UDF blocks.
PADDING = 1500


def padded(name: str) -> bytes:
    """A record value: ``name`` and a separator, padded (the tests compare the names)."""
    return name.encode() + b":" + b"x" * PADDING


def make_udf(out_topic: str, bootstrap: str, flag: str):
    from pyspark import TaskContext
    from pyspark.sql.functions import udf

    seen = {"rows": 0}

    def pass_or_die(value):
        ctx = TaskContext.get()
        if ctx.attemptNumber() == 0 and not os.path.exists(flag):
            seen["rows"] += 1
            if seen["rows"] == KILL_AT_ROW:
                try:
                    fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    return value
                os.close(fd)
                _wait_for_uncommitted_records(out_topic, bootstrap)
                os._exit(17)
        return value

    return udf(pass_or_die, "binary")


def _wait_for_uncommitted_records(topic: str, bootstrap: str) -> None:
    """Until the writer's (open) transaction has records on the broker, at most 30 s."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if sum(consumer.end_offsets(tps).values()) > 0:
                print("UDF: records seen", file=sys.stderr, flush=True)
                return
            time.sleep(0.1)
        print("UDF: no records seen", file=sys.stderr, flush=True)
    finally:
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--more", type=int, required=True)
    parser.add_argument("--per-trigger", type=int, default=400)
    args = parser.parse_args()

    from kafka import KafkaProducer
    from pyspark.sql import SparkSession

    import kafka_source

    spark = (SparkSession.builder.master(args.master).appName("pykafka-sink-retry")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             # small Arrow batches, so that the writer sends records before the UDF kills
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    kafka_source.register(spark)
    checkpoint = os.path.join(args.work, "checkpoint")
    die = make_udf(args.out, args.bootstrap, os.path.join(args.work, "killed"))

    def run(phase: str) -> bool:
        stream = (spark.readStream.format("pykafka")
                  .option("kafka.bootstrap.servers", args.bootstrap)
                  .option("subscribe", args.source).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", str(args.per_trigger)).load()
                  .select("key", die("value").alias("value")))
        query = (stream.writeStream.format("pykafka")
                 .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.out)
                 .option("exactlyOnce", "true").option("kafka.batch.size", "512")
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        if not query.awaitTermination(180):
            query.stop()
            print(f"JOB {json.dumps({'phase': phase, 'error': 'not done within 180 s'})}",
                  flush=True)
            return False
        error = query.exception()
        rows = [p["numInputRows"] for p in query.recentProgress]
        print("JOB " + json.dumps({"phase": phase, "rows": rows,
                                   "error": None if error is None else str(error)[:2000]}),
              flush=True)
        return error is None

    try:
        if not run("killed task"):
            return 2
        producer = KafkaProducer(bootstrap_servers=args.bootstrap)
        for i in range(args.more):
            producer.send(args.source, key=b"more-%d" % i, value=padded(f"more-{i}"))
        producer.flush()
        producer.close()
        if not run("restart"):
            return 3
        last = max(glob.glob(os.path.join(checkpoint, "commits", "[0-9]*")),
                   key=lambda f: int(os.path.basename(f)))
        os.remove(last)
        crc = os.path.join(os.path.dirname(last), f".{os.path.basename(last)}.crc")
        if os.path.exists(crc):
            os.remove(crc)
        if not run("commit log lost"):
            return 4
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
