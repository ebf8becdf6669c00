"""The sink's producer alone (no Spark) against plain producer loops, in one run.

    .venv/bin/python benchmarks/produce_loop.py --bootstrap localhost:19092
    .venv/bin/python benchmarks/produce_loop.py --grid      # batch.size x linger.ms (tuning)

Workload as ``write_bench.py`` (whose topic handling, payload and client loops it reuses):
``--records`` (1,000,000) values of ``--size`` (100) bytes, unkeyed, ``--partitions`` (4), codecs
``none`` and ``lz4``, a fresh topic per run, checked afterwards (end offsets must add up to
exactly ``--records``). pykafka's :class:`~kafka_source.write.producer.Producer` runs in this
process, fed the way the sink's writer feeds it: Arrow chunks of 10,000 rows (Spark's
``maxRecordsPerBatch``), each chunk to one partition in turn (unkeyed records spread by chunk);
timed from producer creation to the end of ``flush()``, the payload built before. The
confluent-kafka and kafka-python loops run in fresh processes (``clients.py``), timed the same
way. Runs are interleaved; the median of ``--runs`` is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import write_bench  # noqa: E402
from write_bench import (CONFLUENT, CONFLUENT_IDEMPOTENT, KAFKA_PYTHON, WriteConfig,  # noqa: E402
                         check_topic, delete_topic, new_topic, payload_table, run_client_writer)

CHUNK = 10_000


def pykafka_run(bootstrap: str, topic: str, table, partitions: int, codec: str,
                **settings) -> float:
    import numpy as np

    from kafka_source.config.client_config import client_config_from_options
    from kafka_source.config.producer_settings import ProducerSettings
    from kafka_source.write.producer import Producer

    values = table.column("value").combine_chunks()
    config = client_config_from_options({"kafka.bootstrap.servers": bootstrap})
    chunks = [(values.slice(lo, CHUNK), np.full(min(CHUNK, len(values) - lo), (lo // CHUNK)
                                                % partitions, np.int32))
              for lo in range(0, len(values), CHUNK)]
    t0 = time.perf_counter()
    with Producer(config, ProducerSettings(compression_type=codec, **settings)) as producer:
        for chunk, parts in chunks:
            producer.send(topic, parts, chunk, None, None)
        producer.flush()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS",
                                                          "localhost:19092"))
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--codecs", default="none,lz4")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--writers", default=f"pykafka,{CONFLUENT},{CONFLUENT_IDEMPOTENT},"
                                         f"{KAFKA_PYTHON}".replace(" ", "_"),
                    help="comma-separated: pykafka, confluent-kafka, confluent-kafka_idempotent,"
                         " kafka-python")
    ap.add_argument("--grid", action="store_true",
                    help="pykafka only, every --grid-batch-kib x --grid-linger-ms")
    ap.add_argument("--grid-batch-kib", default="16,64,256,1024")
    ap.add_argument("--grid-linger-ms", default="0,5,20")
    args = ap.parse_args()
    codecs = args.codecs.split(",")
    table = payload_table(args.records, args.size, keyed=False)
    cfg = WriteConfig(records=args.records, size=args.size, partitions=args.partitions)
    variants: list[tuple[str, dict]] = []
    if args.grid:
        for kib in map(int, args.grid_batch_kib.split(",")):
            for linger in map(int, args.grid_linger_ms.split(",")):
                variants.append((f"pykafka b={kib}K l={linger}",
                                 {"batch_size": kib * 1024, "linger_ms": linger}))
        writers = []
    else:
        writers = [w.replace("_", " ") for w in args.writers.split(",")]
        if "pykafka" in writers:
            variants.append(("pykafka (defaults)", {}))
            writers.remove("pykafka")
    results: dict[tuple[str, str], list[float]] = {}
    for run in range(args.runs + 1):             # round 0 warms up
        for codec in codecs:
            for name, settings in variants + [(w, None) for w in writers]:
                topic = new_topic(args.bootstrap, codec, name.split()[0], args.partitions)
                try:
                    if settings is None:
                        seconds = run_client_writer(name, args.bootstrap, topic, cfg,
                                                    codec)["seconds"]
                    else:
                        seconds = pykafka_run(args.bootstrap, topic, table, args.partitions,
                                              codec, **settings)
                    check_topic(args.bootstrap, topic, args.partitions, args.records, name)
                finally:
                    delete_topic(args.bootstrap, topic)
                load = os.getloadavg()[0]
                write_bench.log(f"{'warm-up' if run == 0 else f'run {run}'} {codec:5} "
                                f"{name:28} {args.records / seconds:>10,.0f} records/s "
                                f"({seconds:.2f} s, load {load:.1f})")
                if run:
                    results.setdefault((codec, name), []).append(seconds)
    print(f"\n{args.records:,} records x {args.size} B, {args.partitions} partitions, "
          f"median of {args.runs}:")
    for (codec, name), times in results.items():
        median = statistics.median(times)
        print(f"  {codec:5} {name:28} {args.records / median:>10,.0f} records/s "
              f"{args.records * args.size / median / 1e6:>7.1f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
