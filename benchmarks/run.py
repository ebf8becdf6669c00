"""Benchmark: pykafka against Spark's own JVM Kafka source and plain Kafka client loops, on the
same broker and topics, in one run.

    make bench                                  # default sizes (see --help)
    make bench BENCH_ARGS="--quick"             # a small smoke run
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/run.py --codecs none,lz4 --runs 5

What it does:

1. Selects a broker (:func:`select_bench_broker`): ``KAFKA_BOOTSTRAP_SERVERS``; else a real
   Apache Kafka started from ``KAFKA_HOME`` or ``../shared/kafka``; else what
   ``kafka_source.testing.select_broker()`` finds (Docker, or the embedded Tansu broker, whose
   figures are indicative only -- said loudly in the report).
2. Creates one topic per workload (``bench-1m-100b-4p-lz4`` ...) and fills it with exactly
   ``--records`` records of ``--size`` bytes, spread evenly over ``--partitions`` partitions, using
   confluent-kafka's producer with the workload's compression codec. A topic that already exists
   with exactly those records is reused; one that does not match is left alone and a new name
   (``...-2``) is used.
3. Measures per workload, each reader as the median of ``--runs`` runs after one warm-up:
   pykafka at ``local[1]`` and ``local[2]`` (``count(*), sum(length(value))``; wall time of
   ``load()`` + the action, session already running), a plain confluent-kafka consumer loop
   (``queued.min.messages=1000000``) and a plain kafka-python consumer loop (in a fresh process
   each; consumer creation included).
4. Memory: one partition of ~1 GB (``--memory-records`` x ``--memory-size``) read by pykafka at
   ``local[1]``; peak RSS of the executor's Python worker processes, against 512 MB.
5. Against Spark's JVM Kafka source (``../shared/anchors/spark-jvm-kafka/run``, when it is
   there; the report says so when it is not), at ``local[2]``, plain and tuned, on the same
   topics: batch reads of the ``lz4`` and ``none`` workloads and of the 1 GB partition, and
   AvailableNow streams into the noop sink with ``maxOffsetsPerTrigger`` 20,000 and 100,000 over
   the ``none`` workload (the issue's five workloads); ratios pykafka / JVM.
6. Idle trigger: the driver-side cost of a micro-batch trigger with no new data
   (``latestOffset`` + ``partitions``), against 50 ms.
7. Write throughput (``write_bench.py``): pykafka's sink (``df.write.format("pykafka")``) at
   ``local[2]`` against a plain confluent-kafka producer loop (plain and idempotent) and a
   kafka-python producer loop, ``--records`` x ``--size`` B to a fresh ``--partitions`` topic per
   run, codecs ``--write-codecs`` (none, lz4); every run's records counted from the topic's end
   offsets and read back. ``--only write`` runs just this part, ``--only read`` skips it.
8. Prints a table and PASS/FAIL lines for the targets, writes JSON to
   ``benchmarks/results/<timestamp>.json`` (and ``--json PATH``).

Exit status is non-zero only on a correctness failure (a reader returned the wrong number of
records or bytes, or failed; a writer lost, duplicated or altered records, or failed). Targets
are measurements: they print PASS/FAIL but do not fail the run. Figures from the embedded Tansu
broker are indicative only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(1, str(HERE))

from procmon import ProcessMonitor  # noqa: E402
import jvm_anchor  # noqa: E402
import write_bench  # noqa: E402
from report import fmt, print_grouped_table  # noqa: E402

RATIO_TARGET = 1.0          # pykafka local[2] records/s over confluent-kafka's
# Issue 9's targets against the best of Spark's JVM source (plain, tuned), per workload: batch
# reads >= 1.2x, streams >= 1.0x at maxOffsetsPerTrigger=20,000 and >= 1.2x at 100,000.
JVM_TARGETS = {"batch-lz4": 1.2, "batch-none": 1.2, "batch-1partition": 1.2,
               "stream-20k": 1.0, "stream-100k": 1.2}
RATIO_CODECS = ("none", "lz4")
RSS_TARGET_MB = 512.0       # executor-side Python, one 1 GB partition
IDLE_TARGET_MS = 50.0       # driver side, one idle micro-batch trigger
MB = 1_000_000              # MB/s are 10^6 value bytes per second

CONFLUENT = "confluent-kafka"
KAFKA_PYTHON = "kafka-python"
SPARK_MASTERS = ("local[1]", "local[2]")
ANCHOR_MASTER = "local[2]"
TANSU_NOTE = ("INDICATIVE ONLY: the embedded Tansu broker shares the cores with Spark and the "
              "clients and is not Kafka; set KAFKA_BOOTSTRAP_SERVERS or KAFKA_HOME for real figures")
STREAM_LIMITS = (20_000, 100_000)     # maxOffsetsPerTrigger of the stream workloads


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Workloads and topics
# ---------------------------------------------------------------------------------------------

def count_label(n: int) -> str:
    for unit, div in (("m", 1_000_000), ("k", 1_000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


@dataclass
class Workload:
    name: str               # "none", "lz4", ..., "memory"
    codec: str              # librdkafka compression.type
    records: int
    size: int
    partitions: int
    topic: str = ""
    counts: dict[int, int] = field(default_factory=dict)   # partition -> records
    produced_s: float | None = None                          # None: topic reused

    @property
    def base_topic(self) -> str:
        return (f"bench-{count_label(self.records)}-{self.size}b-{self.partitions}p-"
                f"{self.codec}")

    @property
    def value_bytes(self) -> int:
        return self.records * self.size

    def ending_offsets(self) -> str:
        return json.dumps({self.topic: {str(p): n for p, n in self.counts.items()}})


def payload_pool(size: int, count: int, seed: int = 20260101) -> list[bytes]:
    """``count`` distinct JSON-like values of exactly ``size`` bytes: random numbers and words,
    so that codecs compress them about as well as real event data (not all zeros)."""
    rnd = random.Random(seed)
    words = ("view click cart buy search home product checkout login logout mobile web "
             "desktop promo email banner organic paid referral direct sale return refund "
             "gift card shipped pending delivered cancelled premium basic trial").split()
    pool = []
    for i in range(count):
        head = ('{"id":%d,"user":"u%06d","amount":%d.%02d,"kind":"%s","sid":"%012x","note":"'
                % (i, rnd.randrange(1_000_000), rnd.randrange(10_000), rnd.randrange(100),
                   rnd.choice(words), rnd.getrandbits(48)))
        body = [head]
        length = len(head)
        while length < size:
            w = rnd.choice(words) if rnd.random() < 0.7 else str(rnd.randrange(100_000))
            body.append(w + " ")
            length += len(w) + 1
        value = "".join(body).encode()[: max(0, size - 2)] + b'"}'
        pool.append(value[-size:] if len(value) > size else value.ljust(size, b" "))
    return pool


def topic_matches(bootstrap: str, w: Workload, topic: str) -> tuple[bool, str]:
    """Does ``topic`` exist with exactly ``w``'s partitions and records (offsets 0..n-1)?

    Checks the partition count, that each partition's log starts at 0, that the record at
    offset n-1 exists with a value of ``w.size`` bytes, and that the high watermark of the fetch
    response is n (Tansu's ListOffsets(latest) is wrong for multi-record batches, its fetch high
    watermark is right)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pykafka-bench-verify",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return False, f"not readable ({getattr(meta, 'error', None)})"
        if sorted(meta.partitions) != list(range(w.partitions)):
            return False, f"has {len(meta.partitions)} partitions, want {w.partitions}"
        tps = []
        for p, n in w.counts.items():
            low, _high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if low != 0:
                return False, f"partition {p} starts at {low}"
            if n > 0:
                tps.append(TopicPartition(topic, p, n - 1))
        if not tps:
            return True, "empty"
        consumer.assign(tps)
        seen: dict[int, object] = {}
        deadline = time.monotonic() + 30
        while len(seen) < len(tps) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=len(tps), timeout=1.0):
                if m.error() is None:
                    seen.setdefault(m.partition(), m)
        for tp in tps:
            m = seen.get(tp.partition)
            if m is None or m.offset() != tp.offset or len(m.value() or b"") != w.size:
                return False, f"partition {tp.partition}: no {w.size}-byte record at {tp.offset}"
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                        cached=True)
            if high != tp.offset + 1:
                return False, f"partition {tp.partition} ends at {high}, want {tp.offset + 1}"
        return True, "ok"
    finally:
        consumer.close()


def existing_topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def produce(bootstrap: str, w: Workload) -> float:
    """Write exactly ``w.counts[p]`` records to each partition p; returns seconds."""
    from confluent_kafka import Producer

    pool = payload_pool(w.size, min(w.records, max(1, (16 << 20) // w.size), 16_384))
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "compression.type": w.codec,
        "linger.ms": 50,
        "batch.num.messages": 100_000,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "acks": "all",
        "enable.idempotence": False,
        "message.send.max.retries": 0,   # a retried batch could be written twice
    })
    t0 = time.perf_counter()
    parts, topic, produce_ = w.partitions, w.topic, producer.produce
    npool = len(pool)
    for i in range(w.records):
        while True:
            try:
                produce_(topic, pool[i % npool], partition=i % parts, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 20_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - t0
    del producer
    if remaining or errors:
        raise RuntimeError(f"producing to {topic}: {remaining} undelivered, "
                           f"{len(errors)} failed ({errors[:3]})")
    return elapsed


def prepare_topic(bootstrap: str, w: Workload, existing: set[str]) -> None:
    from kafka_source.testing import create_topic

    w.counts = {p: w.records // w.partitions + (1 if p < w.records % w.partitions else 0)
                for p in range(w.partitions)}
    for attempt in range(1, 50):
        name = w.base_topic if attempt == 1 else f"{w.base_topic}-{attempt}"
        if name in existing:
            ok, why = topic_matches(bootstrap, w, name)
            if ok:
                w.topic = name
                log(f"topic {name}: exists with {w.records:,} records, reused")
                return
            log(f"topic {name}: exists but does not match ({why}); trying another name")
            continue
        w.topic = name
        create_topic(bootstrap, name, partitions=w.partitions)
        log(f"topic {name}: producing {w.records:,} x {w.size} B ({w.codec}) ...")
        w.produced_s = produce(bootstrap, w)
        ok, why = topic_matches(bootstrap, w, name)
        if not ok:
            raise RuntimeError(f"topic {name} after producing: {why}")
        log(f"topic {name}: produced in {w.produced_s:.1f} s "
            f"({w.records / w.produced_s:,.0f} records/s)")
        return
    raise RuntimeError(f"no usable topic name for {w.base_topic}")


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------

class CorrectnessError(AssertionError):
    pass


def check(w: Workload, reader: str, records: int, nbytes: int | None) -> None:
    if records != w.records or (nbytes is not None and nbytes != w.value_bytes):
        raise CorrectnessError(
            f"{reader} on {w.topic}: read {records:,} records / {nbytes} value bytes, "
            f"expected {w.records:,} / {w.value_bytes:,}")


def summarize(reader: str, w: Workload, warmup: list[float], runs: list[float],
              rss: list[float], **extra) -> dict:
    median = statistics.median(runs)
    return {
        "reader": reader, "workload": w.name, "topic": w.topic, "codec": w.codec,
        "records": w.records, "record_size": w.size, "partitions": w.partitions,
        "value_bytes": w.value_bytes,
        "warmup_s": [round(s, 4) for s in warmup], "runs_s": [round(s, 4) for s in runs],
        "median_s": round(median, 4),
        "records_per_s": round(w.records / median, 1),
        "mb_per_s": round(w.value_bytes / MB / median, 2),
        "peak_rss_mb": round(max(rss), 1) if rss else None,
        **extra,
    }


def run_client(client: str, bootstrap: str, w: Workload, timeout_s: float) -> dict:
    spec = {"client": client, "bootstrap": bootstrap, "topic": w.topic,
            "partitions": sorted(w.counts), "records": w.records, "timeout_s": timeout_s}
    proc = subprocess.run([sys.executable, str(HERE / "clients.py"), json.dumps(spec)],
                          capture_output=True, text=True, timeout=timeout_s * 4 + 120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{client} loop failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    out = json.loads(lines[-1])
    check(w, client, out["records"], out["bytes"])
    return out


def measure_client(client: str, bootstrap: str, w: Workload, runs: int, warmups: int,
                   timeout_s: float) -> dict:
    outs = [run_client(client, bootstrap, w, timeout_s) for _ in range(warmups + runs)]
    times = [o["seconds"] for o in outs]
    return summarize(client, w, times[:warmups], times[warmups:],
                     [o["peak_rss_mb"] for o in outs[warmups:]], rss_of="client process")


def start_spark(master: str):
    from pyspark.sql import SparkSession

    import kafka_source

    warehouse = tempfile.mkdtemp(prefix="pykafka-bench-warehouse-")
    spark = (SparkSession.builder.master(master)
             .appName(f"pykafka-bench-{master}")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.default.parallelism", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.warehouse.dir", warehouse)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    kafka_source.register(spark)
    return spark


def spark_read_once(spark, bootstrap: str, w: Workload, extra_options: dict) -> float:
    t0 = time.perf_counter()
    reader = (spark.read.format("pykafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", w.topic)
              .option("startingOffsets", "earliest")
              .option("endingOffsets", w.ending_offsets()))
    for k, v in extra_options.items():
        reader = reader.option(k, v)
    row = reader.load().selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0]
    elapsed = time.perf_counter() - t0
    check(w, "pykafka", row["n"], row["b"])
    return elapsed


def measure_spark(spark, master: str, monitor: ProcessMonitor, bootstrap: str, w: Workload,
                  runs: int, warmups: int, extra_options: dict) -> dict:
    times, rss, total, jvm = [], [], [], []
    reset_ok = True
    for _ in range(warmups + runs):
        reset_ok = monitor.reset() and reset_ok
        times.append(spark_read_once(spark, bootstrap, w, extra_options))
        peaks = monitor.peaks_mb()
        rss.append(peaks.get("executor", 0.0))
        total.append(peaks.get("executor_total", 0.0))
        jvm.append(peaks.get("jvm", 0.0))
    return summarize(f"pykafka {master}", w, times[:warmups], times[warmups:], rss[warmups:],
                     rss_of="largest executor Python worker (pyspark.daemon and its forks)",
                     executor_sum_of_peaks_mb=round(max(total[warmups:]), 1),
                     jvm_peak_rss_mb=round(max(jvm[warmups:]), 1),
                     rss_reset_ok=reset_ok, options=extra_options or None)


# ---------------------------------------------------------------------------------------------
# Streams, and Spark's JVM Kafka source on the same topics
# ---------------------------------------------------------------------------------------------

def spark_stream_once(spark, bootstrap: str, w: Workload, max_offsets: int) -> tuple[float, int]:
    """An AvailableNow stream over the whole topic into the noop sink, as the JVM anchor runs
    it: (seconds from start() to termination, micro-batches with data)."""
    checkpoint = tempfile.mkdtemp(prefix="pykafka-bench-ckpt-")
    t0 = time.perf_counter()
    query = (spark.readStream.format("pykafka")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", w.topic)
             .option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(max_offsets))
             .load().selectExpr("length(value) AS n")
             .writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = query.recentProgress
    records = sum(p["numInputRows"] for p in progress)
    check(w, f"pykafka stream (maxOffsetsPerTrigger={max_offsets})", records, None)
    return elapsed, len([p for p in progress if p["numInputRows"] > 0])


def measure_spark_stream(spark, bootstrap: str, w: Workload, max_offsets: int, runs: int,
                         warmups: int) -> dict:
    times, batches = [], []
    for _ in range(warmups + runs):
        elapsed, n = spark_stream_once(spark, bootstrap, w, max_offsets)
        times.append(elapsed)
        batches.append(n)
    return summarize(f"pykafka {ANCHOR_MASTER}", w, times[:warmups], times[warmups:], [],
                     micro_batches=batches[-1], max_offsets_per_trigger=max_offsets)


@dataclass
class AnchorWorkload:
    """One of the issue's five workloads, read by pykafka and by Spark's JVM source."""

    name: str                      # "batch-lz4", "stream-20k", ...
    mode: str                      # "batch" | "stream"
    workload: Workload             # its topic
    max_offsets: int | None = None

    @property
    def label(self) -> str:
        w = self.workload
        what = (f"{count_label(w.records)} x {w.size} B, {w.partitions} partition"
                f"{'s' if w.partitions > 1 else ''}, {w.codec}")
        if self.mode == "stream":
            return f"stream, AvailableNow, maxOffsetsPerTrigger={self.max_offsets:,} ({what})"
        return f"batch, {what}"


def anchor_workloads(workloads: list[Workload], big: Workload | None,
                     limits: tuple[int, ...]) -> list[AnchorWorkload]:
    by_codec = {w.codec: w for w in workloads}
    out = [AnchorWorkload(f"batch-{c}", "batch", by_codec[c]) for c in ("lz4", "none")
           if c in by_codec]
    if big is not None:
        out.append(AnchorWorkload("batch-1partition", "batch", big))
    if "none" in by_codec:
        out += [AnchorWorkload(f"stream-{count_label(n)}", "stream", by_codec["none"], n)
                for n in limits]
    return out


def compare_with_jvm(spark, bootstrap: str, todo: list[AnchorWorkload], results: list[dict],
                     args, guarded) -> list[dict]:
    """pykafka's figures for the anchor workloads (reusing the codec runs at local[2])."""
    rows = []
    for a in todo:
        if a.mode == "batch":
            row = next((r for r in results if r["reader"] == f"pykafka {ANCHOR_MASTER}"
                        and r["topic"] == a.workload.topic and r.get("median_s")), None)
            if row is not None:
                log(f"pykafka {ANCHOR_MASTER}: {a.name}: the {a.workload.name} runs above")
            else:
                log(f"pykafka {ANCHOR_MASTER}: {a.name} ({args.warmups} warm-up + {args.runs} "
                    "runs)")
                row = guarded(f"pykafka {a.name}", measure_spark, spark, ANCHOR_MASTER,
                              _NoMonitor(), bootstrap, a.workload, args.runs, args.warmups,
                              args.extra_options)
        else:
            log(f"pykafka {ANCHOR_MASTER}: {a.name} ({args.warmups} warm-up + {args.runs} runs)")
            row = guarded(f"pykafka {a.name}", measure_spark_stream, spark, bootstrap,
                          a.workload, a.max_offsets, args.runs, args.warmups)
        if row:
            log(f"  {row['records_per_s']:,.0f} records/s, median {row['median_s']:.3f} s")
        else:
            row = failed_row(f"pykafka {ANCHOR_MASTER}", a.workload, "see the log")
        rows.append({"workload": a.name, "label": a.label, "mode": a.mode,
                     "topic": a.workload.topic, "max_offsets_per_trigger": a.max_offsets,
                     "pykafka": row})
    return rows


def run_jvm(path, bootstrap: str, todo: list[AnchorWorkload], rows: list[dict], args,
            guarded) -> None:
    """The JVM source, plain and tuned, on the same topics (after pykafka's session stopped)."""
    for a, row in zip(todo, rows):
        for tuned in (False, True):
            key = "jvm_tuned" if tuned else "jvm"
            log(f"Spark JVM Kafka source{' (tuned)' if tuned else ''}: {a.name}")
            out = guarded(f"JVM {key} {a.name}", jvm_anchor.run_anchor, path,
                          bootstrap=bootstrap, topic=a.workload.topic, mode=a.mode,
                          runs=args.runs, master=ANCHOR_MASTER,
                          max_offsets_per_trigger=a.max_offsets, tuned=tuned)
            if out is not None and out.get("records") != a.workload.records:
                guarded(f"JVM {key} {a.name}", check, a.workload, f"JVM {key}",
                        out.get("records") or 0, None)
                out = None
            row[key] = out
            if out:
                log(f"  {out['records_per_s']:,.0f} records/s, median "
                    f"{out['seconds_median']:.3f} s")


def add_jvm_ratios(rows: list[dict]) -> None:
    for row in rows:
        mine = (row.get("pykafka") or {}).get("records_per_s")
        for key in ("jvm", "jvm_tuned"):
            theirs = (row.get(key) or {}).get("records_per_s")
            row[f"ratio_vs_{key}"] = round(mine / theirs, 3) if mine and theirs else None


class _NoMonitor:
    """ProcessMonitor's interface when memory is not what is measured."""

    def reset(self) -> bool:
        return True

    def peaks_mb(self) -> dict:
        return {}


def print_jvm_table(rows: list[dict], note: str | None) -> None:
    print(f"pykafka vs Spark's JVM Kafka source (spark-sql-kafka-0-10 4.0.0), {ANCHOR_MASTER}, "
          "same broker and topics, records/s (MB/s):")
    if note:
        print(f"  {note}")
        return
    header = ("workload", "pykafka", "JVM", "JVM tuned", "vs JVM", "vs tuned")

    def cell(r, mb=None):
        if not r or r.get("records_per_s") is None:
            return "FAILED" if r is not None else "-"
        text = f"{r['records_per_s']:,.0f}"
        return text + (f" ({mb:.0f})" if mb else "")

    table = []
    for row in rows:
        w_bytes = row["pykafka"]["value_bytes"] if row.get("pykafka") else None
        def mbps(r):
            return (w_bytes / MB / (r.get("median_s") or r.get("seconds_median"))
                    if r and w_bytes and (r.get("median_s") or r.get("seconds_median")) else None)
        p = row.get("pykafka")
        table.append((row["label"], cell(p, mbps(p) if row["mode"] == "batch" else None),
                       cell(row.get("jvm")), cell(row.get("jvm_tuned")),
                       fmt(row.get("ratio_vs_jvm"), ".2f"),
                       fmt(row.get("ratio_vs_jvm_tuned"), ".2f")))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    line = "  ".join("{:<%d}" % w if i == 0 else "{:>%d}" % w for i, w in enumerate(widths))
    print(line.format(*header))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print(line.format(*t))


# ---------------------------------------------------------------------------------------------
# Idle micro-batch trigger (driver side): the stream reader driven the way Spark drives it.
# ---------------------------------------------------------------------------------------------

# Stream options: read from the start; a short session timeout, because a group join on the
# embedded broker waits about half of it (the steady-state idle trigger does not depend on it).
STREAM_OPTIONS = {"startingOffsets": "earliest", "kafka.session.timeout.ms": "10000"}


def idle_trigger(bootstrap: str, topic: str, calls: int) -> dict:
    """Driver-side cost of a micro-batch trigger that finds no new data: ``latestOffset(start,
    limit)`` with ``start`` at the end of the data, plus ``partitions(start, latest)``, called on
    the stream reader the way Spark's planner process calls it (no Spark involved)."""
    from kafka_source.datasource import KafkaDataSource

    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **STREAM_OPTIONS}
    source = KafkaDataSource(options)
    t_setup = time.perf_counter()
    reader = source.streamReader(source.schema())
    limit = reader.getDefaultReadLimit()
    lat_ms, part_ms, total_ms = [], [], []
    moved = planned = 0
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, limit)          # first batch: all that is there
        reader.partitions(start, end)
        end = reader.latestOffset(end, limit)            # warm-up of the idle path
        setup_s = time.perf_counter() - t_setup
        for _ in range(calls):
            t0 = time.perf_counter()
            latest = reader.latestOffset(end, limit)
            t1 = time.perf_counter()
            parts = reader.partitions(end, latest)
            t2 = time.perf_counter()
            lat_ms.append((t1 - t0) * 1000)
            part_ms.append((t2 - t1) * 1000)
            total_ms.append((t2 - t0) * 1000)
            planned += len(parts)
            moved += latest != end
    finally:
        stop = getattr(reader, "stop", None)
        if stop is not None:
            stop()

    def p95(values):
        values = sorted(values)
        return round(values[min(len(values) - 1, int(len(values) * 0.95))], 3)

    return {"calls": calls, "median_ms": round(statistics.median(total_ms), 3),
            "p95_ms": p95(total_ms), "max_ms": round(max(total_ms), 3),
            "latestOffset_median_ms": round(statistics.median(lat_ms), 3),
            "partitions_median_ms": round(statistics.median(part_ms), 3),
            "setup_s": round(setup_s, 3), "non_idle_calls": moved,
            "partitions_planned": planned,
            "measured": "latestOffset(end, limit) + partitions(end, latest), no new data",
            "options": STREAM_OPTIONS, "topic": topic}


def select_bench_broker():
    """A real Kafka when there is one: ``KAFKA_BOOTSTRAP_SERVERS``; else one started from
    ``KAFKA_HOME`` or ``../shared/kafka``; else ``select_broker()`` (Docker or the embedded
    broker). ``PYKAFKA_TEST_BROKER`` forces ``select_broker()``'s choice."""
    from kafka_source.testing import LocalKafkaBroker, select_broker

    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or os.environ.get("PYKAFKA_TEST_BROKER"):
        return select_broker()
    home = os.environ.get("KAFKA_HOME", "").strip()
    shared = REPO_ROOT.parent / "shared" / "kafka"
    if not home and (shared / "bin" / "kafka-server-start.sh").is_file():
        home = str(shared)
    if home:
        return LocalKafkaBroker(home)
    return select_broker()


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def machine_info() -> dict:
    info = {"nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
        info["loadavg_at_start"] = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        pass
    return info


def versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("pyspark", "pyarrow", "kafka-python", "confluent-kafka",
                 "pykafka-spark-source"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        import confluent_kafka

        out["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    try:
        out["java"] = subprocess.run(["java", "-version"], capture_output=True, text=True,
                                     timeout=20).stderr.splitlines()[0]
    except Exception:  # noqa: BLE001
        out["java"] = None
    return out


def failed_row(reader: str, w: Workload, error: str) -> dict:
    return {"reader": reader, "workload": w.name, "topic": w.topic, "codec": w.codec,
            "records": w.records, "record_size": w.size, "partitions": w.partitions,
            "value_bytes": w.value_bytes, "median_s": None, "records_per_s": None,
            "mb_per_s": None, "peak_rss_mb": None, "error": error}


def add_ratios(results: list[dict]) -> None:
    base = {r["workload"]: r["records_per_s"] for r in results if r["reader"] == CONFLUENT}
    for r in results:
        b, v = base.get(r["workload"]), r["records_per_s"]
        r["ratio_vs_confluent"] = round(v / b, 3) if b and v is not None else None


def sort_results(results: list[dict], codecs: list[str]) -> list[dict]:
    readers = [CONFLUENT, KAFKA_PYTHON] + [f"pykafka {m}" for m in SPARK_MASTERS]

    def key(r):
        w = codecs.index(r["workload"]) if r["workload"] in codecs else len(codecs)
        k = readers.index(r["reader"]) if r["reader"] in readers else len(readers)
        return (w, k, r["reader"])

    return sorted(results, key=key)


def print_table(results: list[dict]) -> None:
    header = ("workload", "reader", "median s", "records/s", "MB/s", "peak RSS MB",
              "vs confluent")
    rows = [(r["workload"], r["reader"], fmt(r["median_s"], ".3f"),
             "FAILED" if r.get("error") else fmt(r["records_per_s"], ",.0f"),
             fmt(r["mb_per_s"], ".1f"),
             fmt(r["peak_rss_mb"], ".0f"), fmt(r.get("ratio_vs_confluent"), ".2f"))
            for r in results]
    print_grouped_table(header, rows, left=2)


def targets(results: list[dict], memory: dict | None, idle: dict | None,
            jvm_rows: list[dict] = ()) -> list[dict]:
    """The issues' targets; a reader that failed fails its target (value "error")."""
    out = []
    for row in jvm_rows:
        best = max(((row.get(k) or {}).get("records_per_s") or 0 for k in ("jvm", "jvm_tuned")),
                   default=0)
        mine = (row.get("pykafka") or {}).get("records_per_s")
        ratio = round(mine / best, 3) if mine and best else None
        goal = JVM_TARGETS.get(row.get("workload"), RATIO_TARGET)
        out.append({"target": f"pykafka / best of Spark's JVM source (plain, tuned) >= "
                              f"{goal:.1f}x: {row['label']}",
                    "value": "error" if ratio is None else ratio,
                    "pass": ratio is not None and ratio >= goal})
    for codec in RATIO_CODECS:
        r = next((r for r in results
                  if r["reader"] == "pykafka local[2]" and r["workload"] == codec), None)
        base = next((r for r in results
                     if r["reader"] == CONFLUENT and r["workload"] == codec), None)
        if r is None or base is None:
            continue
        ratio = r.get("ratio_vs_confluent")
        out.append({"target": f"pykafka local[2] / confluent-kafka ({codec}) >= "
                              f"{RATIO_TARGET:.1f}x",
                    "value": "error" if ratio is None else ratio,
                    "pass": ratio is not None and ratio >= RATIO_TARGET})
    if memory is not None:
        rss = memory.get("peak_rss_mb")
        out.append({"target": f"executor Python peak RSS reading one "
                              f"{memory['value_bytes'] / 1e9:.2f} GB partition "
                              f"< {RSS_TARGET_MB:.0f} MB",
                    "value": "error" if rss is None else rss,
                    "pass": rss is not None and rss < RSS_TARGET_MB})
    if idle is not None:
        out.append({"target": f"idle micro-batch trigger on the driver < {IDLE_TARGET_MS:.0f} ms "
                              "(median)",
                    "value": idle["median_ms"], "pass": idle["median_ms"] < IDLE_TARGET_MS})
    return out


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=None,
                    help="records per workload topic (default 1,000,000; --quick 100,000)")
    ap.add_argument("--size", type=int, default=100, help="bytes per record value (default 100)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions per workload topic (default 4)")
    ap.add_argument("--runs", type=int, default=None,
                    help="measured runs per reader and workload, after --warmups "
                         "(default 3; --quick 2)")
    ap.add_argument("--warmups", type=int, default=1, help="warm-up runs, not counted (default 1)")
    ap.add_argument("--codecs", default="none,lz4,zstd,gzip",
                    help="comma-separated compression codecs, one workload each "
                         "(default none,lz4,zstd,gzip)")
    ap.add_argument("--readers", default="pykafka,confluent-kafka,kafka-python",
                    help="comma-separated subset of pykafka, confluent-kafka, kafka-python "
                         "(default: all)")
    ap.add_argument("--masters", default=",".join(SPARK_MASTERS),
                    help="comma-separated Spark masters for the pykafka runs "
                         "(default local[1],local[2])")
    ap.add_argument("--memory-records", type=int, default=None,
                    help="records in the one-partition memory test (default 1,000,000; "
                         "--quick 100,000)")
    ap.add_argument("--memory-size", type=int, default=1000,
                    help="bytes per record in the memory test (default 1000)")
    ap.add_argument("--skip-memory", action="store_true", help="skip the memory test")
    ap.add_argument("--jvm", choices=("auto", "off"), default="auto",
                    help="compare with Spark's JVM Kafka source when "
                         "../shared/anchors/spark-jvm-kafka/run is there (default auto)")
    ap.add_argument("--stream-limits", default=",".join(str(n) for n in STREAM_LIMITS),
                    help="maxOffsetsPerTrigger of the stream workloads against the JVM source "
                         "(default 20000,100000)")
    ap.add_argument("--idle-calls", type=int, default=50, help="idle trigger calls timed (default 50)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra pykafka reader option, repeatable (default: none, i.e. "
                         "default options)")
    ap.add_argument("--quick", action="store_true",
                    help="small smoke run: 100k records, 100 MB memory test, 2 runs")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="client loops give up after this many seconds without progress "
                         "(default 300)")
    ap.add_argument("--json", metavar="PATH", help="also write the JSON report here")
    ap.add_argument("--only", choices=("read", "write"), default=None,
                    help="run only the read benchmarks or only the write benchmark "
                         "(default: both)")
    ap.add_argument("--writers", default=",".join(write_bench.WRITERS),
                    help="write benchmark: comma-separated subset of pykafka, confluent-kafka, "
                         "'confluent-kafka idempotent' (or confluent-kafka-idempotent), "
                         "kafka-python (default: all)")
    ap.add_argument("--write-codecs", default=",".join(write_bench.WRITE_CODECS),
                    help="write benchmark: compression codecs (default none,lz4)")
    ap.add_argument("--write-masters", default=",".join(write_bench.WRITE_MASTERS),
                    help="write benchmark: Spark masters for pykafka (default local[2])")
    ap.add_argument("--write-tasks", type=int, default=None,
                    help="write benchmark: partitions of the DataFrame written (default: the "
                         "session's default parallelism, one task per core)")
    ap.add_argument("--write-keyed", action="store_true",
                    help="write benchmark: keyed records (keys user-000000..user-099999)")
    ap.add_argument("--write-option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra pykafka sink option, repeatable (default: none)")
    ap.add_argument("--write-verify", choices=("content", "count"), default="content",
                    help="write benchmark: check each run by reading every record back "
                         "(content, default) or only by the topic's end offsets (count)")
    args = ap.parse_args(argv)
    if args.records is None:
        args.records = 100_000 if args.quick else 1_000_000
    if args.memory_records is None:
        args.memory_records = 100_000 if args.quick else 1_000_000
    if args.runs is None:
        args.runs = 2 if args.quick else 3
    args.codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    args.readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    args.masters = [m.strip() for m in args.masters.split(",") if m.strip()]
    args.extra_options = dict(o.split("=", 1) for o in args.option)
    args.stream_limits = tuple(int(n) for n in args.stream_limits.split(",") if n.strip())
    bad = set(args.readers) - {"pykafka", CONFLUENT, KAFKA_PYTHON}
    if bad:
        ap.error(f"unknown reader(s): {sorted(bad)}")
    args.writers = [write_bench.WRITER_ALIASES.get(w.strip(), w.strip())
                    for w in args.writers.split(",") if w.strip()]
    bad = set(args.writers) - set(write_bench.WRITERS)
    if bad:
        ap.error(f"unknown writer(s): {sorted(bad)}; valid: {', '.join(write_bench.WRITERS)}")
    args.write_codecs = [c.strip() for c in args.write_codecs.split(",") if c.strip()]
    args.write_masters = [m.strip() for m in args.write_masters.split(",") if m.strip()]
    args.write_options = dict(o.split("=", 1) for o in args.write_option)
    if args.only == "write":          # nothing of the read benchmarks runs
        args.readers, args.codecs = [], []
    if args.runs < 1 or args.records < 1 or args.size < 1 or args.partitions < 1:
        ap.error("--runs, --records, --size and --partitions must be >= 1")
    return args


def short_error(exc: BaseException) -> str:
    """One line: the exception type and the last line of its message (for a Python worker's
    exception that is the original error, not Spark's wrapper)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else repr(exc)}"[:500]


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    paths = [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))

    report: dict = {"started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                    "machine": machine_info(), "versions": versions(),
                    "config": {k: v for k, v in vars(args).items() if k not in ("json",)}}
    failures: list[str] = []      # correctness: wrong counts, readers that fail
    errors: list[str] = []        # non-fatal: the idle-trigger measurement failed
    results: list[dict] = []
    memory = idle = write = None

    def guarded(what: str, fn, *a, fatal: bool = True, **kw):
        """Run one measurement; a wrong count or a reader that fails is recorded and makes the
        exit status non-zero (``fatal=False``: recorded and printed only)."""
        try:
            return fn(*a, **kw)
        except CorrectnessError as exc:
            failures.append(str(exc))
            last_error[0] = str(exc)
            log(f"CORRECTNESS FAILURE: {exc}")
        except Exception as exc:  # noqa: BLE001 - report and go on with the other readers
            (failures if fatal else errors).append(f"{what}: {short_error(exc)}")
            last_error[0] = short_error(exc)
            log(f"FAILED: {what}: {short_error(exc)}\n{traceback.format_exc()}")
        return None

    last_error = [""]

    log("selecting a broker ...")
    broker = select_bench_broker()
    is_tansu = bool(getattr(broker, "is_tansu", False))
    report["broker"] = {"kind": broker.kind, "bootstrap_servers": broker.bootstrap_servers,
                        "is_tansu": is_tansu}
    if is_tansu:
        report["broker"]["note"] = TANSU_NOTE
        log("!" * 96)
        log(f"!!! {TANSU_NOTE}")
        log("!" * 96)
    log(f"kafka broker: {broker.kind} at {broker.bootstrap_servers}")
    bootstrap = broker.bootstrap_servers
    anchor = jvm_anchor.anchor_path() if args.jvm == "auto" and "pykafka" in args.readers \
        else None
    jvm_note = None
    if args.only == "write":
        jvm_note = "not run (--only write)"
    elif args.jvm == "off":
        jvm_note = "not run (--jvm off)"
    elif anchor is None:
        jvm_note = (f"not run: Spark's JVM Kafka source anchor is not on this machine "
                    f"({jvm_anchor.DEFAULT_ANCHOR}; see ../shared/README.md)")
    jvm_rows: list[dict] = []
    try:
        workloads = [Workload(c, c, args.records, args.size, args.partitions)
                     for c in args.codecs]
        mem_w = None
        if "pykafka" in args.readers and (not args.skip_memory or anchor is not None):
            mem_w = Workload("memory", "none", args.memory_records, args.memory_size, 1)
        jvm_todo = anchor_workloads(workloads, mem_w, args.stream_limits) \
            if anchor is not None else []
        existing = existing_topics(bootstrap)
        for w in workloads + ([mem_w] if mem_w else []):
            prepare_topic(bootstrap, w, existing)
        report["topics"] = {w.name: {"topic": w.topic, "records": w.records, "size": w.size,
                                     "partitions": w.partitions, "codec": w.codec,
                                     "produced_s": None if w.produced_s is None
                                     else round(w.produced_s, 2)}
                            for w in workloads + ([mem_w] if mem_w else [])}

        for client in (CONFLUENT, KAFKA_PYTHON):
            if client not in args.readers:
                continue
            for w in workloads:
                log(f"{client}: {w.name} ({args.warmups} warm-up + {args.runs} runs)")
                r = guarded(f"{client} {w.name}", measure_client, client, bootstrap, w,
                            args.runs, args.warmups, args.timeout)
                if r:
                    results.append(r)
                    log(f"  {r['records_per_s']:,.0f} records/s, median {r['median_s']:.3f} s")
                else:
                    results.append(failed_row(client, w, last_error[0]))

        if "pykafka" in args.readers:
            for master in args.masters:
                log(f"starting Spark {master} ...")
                spark = start_spark(master)
                try:
                    with ProcessMonitor() as monitor:
                        for w in workloads:
                            log(f"pykafka {master}: {w.name} ({args.warmups} warm-up + "
                                f"{args.runs} runs)")
                            r = guarded(f"pykafka {master} {w.name}", measure_spark, spark,
                                        master, monitor, bootstrap, w, args.runs, args.warmups,
                                        args.extra_options)
                            if r:
                                results.append(r)
                                log(f"  {r['records_per_s']:,.0f} records/s, median "
                                    f"{r['median_s']:.3f} s, worker peak RSS "
                                    f"{r['peak_rss_mb']:.0f} MB")
                            else:
                                results.append(failed_row(f"pykafka {master}", w,
                                                          last_error[0]))
                        if mem_w is not None and master == "local[1]" \
                                and not args.skip_memory:
                            log(f"memory: pykafka local[1] reading one partition of "
                                f"{mem_w.value_bytes / 1e9:.2f} GB ...")
                            memory = guarded("memory test", measure_spark, spark, master,
                                             monitor, bootstrap, mem_w, 1, 0,
                                             args.extra_options)
                            if memory:
                                memory["processes"] = monitor.processes()
                                log(f"  peak executor Python RSS {memory['peak_rss_mb']:.0f} MB"
                                    f", {memory['mb_per_s']:.1f} MB/s")
                            else:
                                memory = failed_row("pykafka local[1]", mem_w, last_error[0])
                    if jvm_todo and master == ANCHOR_MASTER:
                        jvm_rows = compare_with_jvm(spark, bootstrap, jvm_todo, results, args,
                                                    guarded)
                finally:
                    spark.stop()
            if jvm_todo and ANCHOR_MASTER not in args.masters:
                log(f"starting Spark {ANCHOR_MASTER} for the comparison with the JVM source ...")
                spark = start_spark(ANCHOR_MASTER)
                try:
                    jvm_rows = compare_with_jvm(spark, bootstrap, jvm_todo, results, args,
                                                guarded)
                finally:
                    spark.stop()
        if jvm_todo:
            # After pykafka's SparkSession stopped: the JVM source gets the machine to itself.
            run_jvm(anchor, bootstrap, jvm_todo, jvm_rows, args, guarded)
            add_jvm_ratios(jvm_rows)

        if workloads:
            log("idle trigger ...")
            idle = guarded("idle trigger", idle_trigger, bootstrap, workloads[0].topic,
                           args.idle_calls, fatal=False)

        if args.only != "read" and args.writers and args.write_codecs:
            cfg = write_bench.WriteConfig(
                records=args.records, size=args.size, partitions=args.partitions,
                codecs=tuple(args.write_codecs), writers=tuple(args.writers),
                masters=tuple(args.write_masters), runs=args.runs, warmups=args.warmups,
                tasks=args.write_tasks, keyed=args.write_keyed, timeout_s=args.timeout,
                options=args.write_options, fetch_hw=is_tansu,
                verify_content=args.write_verify == "content")
            write = guarded("write benchmark", write_bench.run_write_bench, cfg, bootstrap,
                            start_spark)
            if write:
                failures.extend(write["failures"])
    finally:
        broker.stop()

    add_ratios(results)
    results = sort_results(results, args.codecs)
    checks = targets(results, memory, idle, jvm_rows) + (write["targets"] if write else [])
    report.update({"results": results, "memory": memory, "idle_trigger": idle,
                   "vs_spark_jvm_kafka": {"rows": jvm_rows, "note": jvm_note,
                                          "anchor": str(anchor) if anchor else None,
                                          "master": ANCHOR_MASTER},
                   "write": write, "targets": checks, "correctness_failures": failures,
                   "errors": errors,
                   "duration_s": round(time.time() - started, 1)})

    print()
    print(f"broker: {broker.kind} at {bootstrap}")
    if is_tansu:
        print(f"!!! {TANSU_NOTE}")
    m = report["machine"]
    print(f"machine: {m.get('nproc')} CPUs ({m.get('cpu_model', '?')}), {m.get('ram_gb', '?')} GB"
          f" RAM, load {m.get('loadavg_at_start')}")
    if args.only != "write":
        print(f"workloads: {args.records:,} records x {args.size} B, {args.partitions} "
              f"partitions; median of {args.runs} runs after {args.warmups} warm-up; "
              "query count(*), sum(length(value)); MB = 10^6 value bytes")
        print()
        print_table(results)
        print()
    if "pykafka" in args.readers:
        print_jvm_table(jvm_rows, jvm_note)
        print()
    if memory and memory.get("error"):
        print(f"memory: FAILED ({memory['error']})")
    elif memory:
        print(f"memory: one partition, {mem_w.records:,} x {mem_w.size} B "
              f"({mem_w.value_bytes / 1e9:.2f} GB), pykafka local[1]: executor Python peak RSS "
              f"{memory['peak_rss_mb']:.0f} MB, {memory['mb_per_s']:.1f} MB/s")
    if idle:
        print(f"idle trigger: median {idle['median_ms']:.2f} ms, p95 {idle['p95_ms']:.2f} ms "
              f"over {idle['calls']} calls (latestOffset + partitions, no new data)")
    if write:
        print()
        write_bench.print_write_report(write)
        print()
    for c in checks:
        print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['target']}: {c['value']}")
    for e in errors:
        print(f"ERROR (not counted as a correctness failure): {e}")
    for f in failures:
        print(f"CORRECTNESS FAILURE: {f}")

    out_dir = HERE / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps(report, indent=2, default=str)
    path.write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    print(f"\nJSON: {path}" + (f" and {args.json}" if args.json else "")
          + f"; took {report['duration_s']:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
