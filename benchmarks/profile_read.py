"""Where an executor's time goes: pykafka's read path without Spark, under cProfile.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/profile_read.py --codec lz4

Fills (or reuses) the same topic as ``run.py`` for the workload (``topics.py``), plans the read
on the driver side (``KafkaDataSource(options).reader(schema).partitions()``) and runs ``read()``
of every input partition in this process, one after the other, consuming the Arrow batches the
way Spark would (only their sizes are touched). Prints the records/s of that loop (no Spark, no
Arrow transfer to the JVM, one core) and the top functions by cumulative and own time.
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
import topics  # noqa: E402


def read_all(bootstrap: str, w: "topics.Workload") -> tuple[int, int, float]:
    from kafka_source.datasource import KafkaDataSource

    source = KafkaDataSource({"kafka.bootstrap.servers": bootstrap, "subscribe": w.topic,
                              "startingOffsets": "earliest",
                              "endingOffsets": w.ending_offsets()})
    reader = source.reader(source.schema())
    t0 = time.perf_counter()
    rows = nbytes = 0
    for partition in reader.partitions():
        for batch in reader.read(partition):
            rows += batch.num_rows
            nbytes += batch.column(1).buffers()[2].size if batch.num_rows else 0
    return rows, nbytes, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec", default="none")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()

    broker = run.select_bench_broker()
    try:
        w = topics.Workload(args.codec, args.codec, args.records, args.size, args.partitions)
        topics.prepare_topic(broker.bootstrap_servers, w,
                             topics.existing_topics(broker.bootstrap_servers))
        rows, _, seconds = read_all(broker.bootstrap_servers, w)      # warm-up, unprofiled
        print(f"unprofiled: {rows:,} rows in {seconds:.2f} s = {rows / seconds:,.0f} records/s "
              f"(one process, no Spark)")
        profiler = cProfile.Profile()
        profiler.enable()
        rows, _, seconds = read_all(broker.bootstrap_servers, w)
        profiler.disable()
        print(f"profiled:   {rows:,} rows in {seconds:.2f} s")
        for order in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(args.top)
            print(out.getvalue())
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
