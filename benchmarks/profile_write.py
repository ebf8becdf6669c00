"""Where a write task's time goes: pykafka's sink without Spark, under cProfile.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/profile_write.py --codec lz4

Makes the writer the way Spark does on the driver (``KafkaDataSource(options).writer(schema,
False)``) and calls its ``write()`` in this process with the benchmark's payload
(``write_bench.payload_table``) cut into Arrow batches of 10,000 rows (Spark's
``spark.sql.execution.arrow.maxRecordsPerBatch``), to a fresh topic. This is one task writing
everything on one core: no Spark, no JVM-to-Python Arrow transfer. Prints the records/s of an
unprofiled and a profiled run, and the top functions by cumulative and own time. For the whole
job under Spark, use py-spy on the executor's Python workers instead (``py-spy record
--subprocesses -o write.svg -- .venv/bin/python benchmarks/run.py --only write ...``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE))

import run  # noqa: E402
import write_bench  # noqa: E402


class _Task:
    """What the writer asks of Spark's TaskContext in a batch write."""

    def partitionId(self) -> int:  # noqa: N802 - Spark's name
        return 0

    def attemptNumber(self) -> int:  # noqa: N802
        return 0

    def getLocalProperty(self, key: str):  # noqa: N802
        return None


def write_all(bootstrap: str, topic: str, codec: str, batches, schema, options: dict) -> float:
    from kafka_source.datasource import KafkaDataSource
    from kafka_source.write import writer as writer_module

    opts = {"kafka.bootstrap.servers": bootstrap, "topic": topic,
            "kafka.compression.type": codec, **options}
    writer = KafkaDataSource(opts).writer(schema, False)
    writer_module._task_context = _Task     # outside Spark: no TaskContext
    t0 = time.perf_counter()
    writer.write(iter(batches))
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec", default="none")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--keyed", action="store_true")
    ap.add_argument("--batch-rows", type=int, default=10_000)
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra sink option, repeatable")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    options = dict(o.split("=", 1) for o in args.option)

    from pyspark.sql.types import BinaryType, StructField, StructType

    table = write_bench.payload_table(args.records, args.size, args.keyed)
    batches = table.to_batches(max_chunksize=args.batch_rows)
    schema = StructType([StructField(name, BinaryType()) for name in table.column_names])
    broker = run.select_bench_broker()
    bootstrap = broker.bootstrap_servers
    try:
        for label, profiled in (("unprofiled", False), ("profiled", True)):
            topic = write_bench.new_topic(bootstrap, args.codec, "profile", args.partitions)
            try:
                profiler = cProfile.Profile() if profiled else None
                if profiler:
                    profiler.enable()
                seconds = write_all(bootstrap, topic, args.codec, batches, schema, options)
                if profiler:
                    profiler.disable()
                write_bench.check_topic(bootstrap, topic, args.partitions, args.records,
                                        "profile_write")
            finally:
                write_bench.delete_topic(bootstrap, topic)
            print(f"{label}: {args.records:,} records in {seconds:.2f} s = "
                  f"{args.records / seconds:,.0f} records/s (one task, one process, no Spark)")
        for order in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(args.top)
            print(out.getvalue())
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
