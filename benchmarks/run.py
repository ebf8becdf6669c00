"""Benchmark: pykafka against a Python source without Kafka (the floor), Spark's own JVM Kafka
source and plain Kafka client loops, on the same brokers (Kafka 4.0 and 2.2) and topics, in one
run.

    make bench                                  # default sizes (see --help)
    make bench BENCH_ARGS="--quick"             # a small smoke run
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/run.py --codecs none,lz4 --runs 5

What it does:

1. Starts each Kafka of ``--brokers`` (default ``4.0,2.2``) in turn from a local distribution
   (:func:`broker_plan`): 4.0 in KRaft mode from ``KAFKA_HOME`` or ``../shared/kafka``, 2.2 in
   ZooKeeper mode from ``KAFKA_ZK_HOME`` or ``../shared/kafka22``; everything below runs on each,
   one after the other, and every figure says which broker it is from. ``KAFKA_BOOTSTRAP_SERVERS``
   (or ``PYKAFKA_TEST_BROKER``) instead runs once on that broker; with no distribution at all,
   ``kafka_source.testing.select_broker()`` (Docker, or the embedded Tansu broker, whose figures
   are indicative only -- said loudly in the report).
2. Creates one topic per workload and value kind (``topics.py``; ``bench-1m-100b-4p-lz4``,
   ``bench-1m-100b-4p-lz4-json`` ...) and fills it with exactly ``--records`` records of ``--size``
   bytes, spread evenly over ``--partitions`` partitions, using confluent-kafka's producer with the
   workload's compression codec. ``--values`` (default ``random,json``): the poorly-compressible
   JSON-like text with random numbers and words, and JSON events that lz4 shrinks 6-9x
   (``payloads.py``). A topic that already exists with exactly those records is reused; one that
   does not match is left alone and a new name (``...-2``) is used. The report lists each topic's
   size on disk.
3. Measures per workload, each reader as the median of ``--runs`` runs after one warm-up:
   pykafka at ``local[1]`` and ``local[2]`` (``count(*), sum(length(value))``; wall time of
   ``load()`` + the action, session already running), a plain confluent-kafka consumer loop
   (``queued.min.messages=1000000``) and a plain kafka-python consumer loop (in a fresh process
   each; consumer creation included).
4. Memory: one partition of ~1 GB (``--memory-records`` x ``--memory-size``) read by pykafka at
   ``local[1]``; peak RSS of the executor's Python worker processes, against 512 MB.
5. The comparison table, at ``local[2]``, on the issue's five workloads (``--workloads``): batch
   reads of the ``lz4`` and ``none`` workloads and of the 1 GB partition, AvailableNow streams into
   the noop sink with ``maxOffsetsPerTrigger`` 20,000 and 100,000 over the ``none`` workload. Side
   by side: the floor (``floor_source.py``: a Python data source without Kafka that yields
   pykafka's schema and rows in as many input partitions, read with the same query: PySpark's own
   cost of a Python source), pykafka, and Spark's JVM Kafka source
   (``../shared/anchors/spark-jvm-kafka/run``, when it is there; the report says so when it is
   not) plain and tuned (``--jvm-variants``), run after pykafka's session stopped; ratios
   pykafka / floor and pykafka / JVM. For batch reads, also ``--floor-pairs`` paired rounds (one
   floor read, then one pykafka read, back to back; with ``--fetch-floor`` the fetch floor, the
   floor's batches as pykafka's fetch loop brings the ranges undecoded, in between): the median
   of the rounds' ratios is what the floor target (>= 0.9x) is judged on, since the machine's
   load moves both alike within a round but by tens of percent between measurements minutes
   apart; likewise streams get ``--jvm-pairs`` paired rounds with the JVM source (one pykafka
   stream, then one anchor run), on which the stream targets are judged. Streams also report
   their start-up: from ``start()`` to the end of the first trigger (pykafka and the floor; the
   JVM anchor does not report it).
6. Idle trigger: the driver-side cost of a micro-batch trigger with no new data
   (``latestOffset`` + ``partitions``), against 50 ms, on each broker.
7. Write throughput (``write_bench.py``): on the first broker, pykafka's sink
   (``df.write.format("pykafka")``) at ``local[2]`` against a plain confluent-kafka producer loop
   (plain and idempotent) and a kafka-python producer loop, ``--records`` x ``--size`` B to a
   fresh ``--partitions`` topic per run, codecs ``--write-codecs`` (none, lz4); on every broker,
   pykafka's sink against Spark's JVM Kafka sink (the anchor's ``--mode write``, plain and tuned,
   ``--jvm-variants``) on the same generated rows; every run's records counted from the topic's
   end offsets (pykafka's also read back). ``--only write`` runs just this part, ``--only read``
   skips it.
8. Prints the tables and PASS/FAIL lines for the targets, writes JSON to
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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(1, str(HERE))

from procmon import ProcessMonitor, cpu_by_kind, cpu_delta  # noqa: E402
import floor_source  # noqa: E402
import jvm_anchor  # noqa: E402
from payloads import VALUE_KINDS  # noqa: E402
import write_bench  # noqa: E402
from report import MB, fmt, log, print_grouped_table  # noqa: E402
from topics import (Workload, count_label, existing_topics,  # noqa: E402
                    prepare_topic)

RATIO_TARGET = 1.0          # pykafka local[2] records/s over confluent-kafka's
# Issue 9's targets against the best of Spark's JVM source (plain, tuned), per workload: batch
# reads >= 1.2x, streams >= 1.0x at maxOffsetsPerTrigger=20,000 and >= 1.2x at 100,000.
JVM_TARGETS = {"batch-lz4": 1.2, "batch-none": 1.2, "batch-1partition": 1.2,
               "stream-20k": 1.0, "stream-100k": 1.2,
               # issue 38 item 5: the same streams over an lz4 topic of repeating values
               "stream-lz4-20k": 1.0, "stream-lz4-100k": 1.2}
RATIO_CODECS = ("none", "lz4")
FLOOR_TARGET = 0.9          # batch reads: pykafka / the floor (median of paired rounds)
RSS_TARGET_MB = 512.0       # executor-side Python, one 1 GB partition
IDLE_TARGET_MS = 50.0       # driver side, one idle micro-batch trigger

CONFLUENT = "confluent-kafka"
KAFKA_PYTHON = "kafka-python"
SPARK_MASTERS = ("local[1]", "local[2]")
ANCHOR_MASTER = "local[2]"
TANSU_NOTE = ("INDICATIVE ONLY: the embedded Tansu broker shares the cores with Spark and the "
              "clients and is not Kafka; set KAFKA_BOOTSTRAP_SERVERS or KAFKA_HOME for real figures")
STREAM_LIMITS = (20_000, 100_000)     # maxOffsetsPerTrigger of the stream workloads
ANCHOR_WORKLOADS = ("batch-lz4", "batch-none", "batch-1partition", "stream-20k", "stream-100k")
# Value kinds that measure one thing only: ``repeat`` (values lz4 shrinks tens of times) is there
# for the lz4 streams of issue 38 item 5, so by default it fills only the lz4 topic and runs the
# lz4 streams and the lz4 batch read (``--workloads`` / ``--codecs`` given explicitly win).
KIND_DEFAULTS = {"repeat": {"codecs": ("lz4",),
                            "workloads": ("batch-lz4", "stream-lz4-20k", "stream-lz4-100k")}}
JVM_VARIANTS = ("plain", "tuned")
FLOOR = "floor"
# The brokers of --brokers: version -> (where its distribution is looked for, ZooKeeper mode).
BROKER_VERSIONS = ("4.0", "2.2")
SHARED = REPO_ROOT.parent / "shared"
STARTUP_NOTE = ("Spark's JVM source: not reported (the anchor prints only its total times, "
                "../shared/anchors/spark-jvm-kafka/read.py)")


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
        **workload_fields(reader, w),
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
             # A stream's records and start-up are read from its progress reports: keep them all.
             .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    kafka_source.register(spark)
    # The floor, in this session only (its module is on the workers' PYTHONPATH, see main()).
    spark.dataSource.register(floor_source.FloorDataSource)
    return spark


def pykafka_options(bootstrap: str, w: Workload, extra_options: dict) -> dict:
    return {**pykafka_stream_options(bootstrap, w, {}), "endingOffsets": w.ending_offsets(),
            **extra_options}


def pykafka_stream_options(bootstrap: str, w: Workload, extra_options: dict) -> dict:
    """pykafka's options for a stream over all of ``w``'s topic (a batch read adds its end)."""
    return {"kafka.bootstrap.servers": bootstrap, "subscribe": w.topic,
            "startingOffsets": "earliest", **extra_options}


def floor_options(spark, w: Workload, args) -> dict:
    return floor_source.floor_options(w.topic, w.counts, w.size,
                                      spark.sparkContext.defaultParallelism,
                                      args.floor_batch_bytes, args.extra_options)


def scan_tasks(spark, group: str) -> int | None:
    """Input partitions of the query run in job group ``group``: the tasks of its largest stage
    (the scan; the final aggregation has one)."""
    tracker = spark.sparkContext.statusTracker()
    tasks = []
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in (info.stageIds if info else ()):
            stage_info = tracker.getStageInfo(stage)
            if stage_info is not None:
                tasks.append(stage_info.numTasks)
    return max(tasks) if tasks else None


def spark_read_once(spark, source_format: str, options: dict, w: Workload,
                    reader: str) -> tuple[float, int | None]:
    """``count(*), sum(length(value))`` of a batch read: (seconds of load() + the action, its
    input partitions)."""
    sc = spark.sparkContext
    group = f"bench-{uuid.uuid4().hex[:12]}"
    sc.setJobGroup(group, reader)
    try:
        t0 = time.perf_counter()
        row = (spark.read.format(source_format).options(**options).load()
               .selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0])
        elapsed = time.perf_counter() - t0
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    check(w, reader, row["n"], row["b"])
    return elapsed, scan_tasks(spark, group)


def measure_spark(spark, master: str, monitor: ProcessMonitor, bootstrap: str, w: Workload,
                  runs: int, warmups: int, extra_options: dict) -> dict:
    times, rss, total, jvm = [], [], [], []
    reset_ok = True
    options = pykafka_options(bootstrap, w, extra_options)
    for _ in range(warmups + runs):
        reset_ok = monitor.reset() and reset_ok
        elapsed, tasks = spark_read_once(spark, "pykafka", options, w, "pykafka")
        times.append(elapsed)
        peaks = monitor.peaks_mb()
        rss.append(peaks.get("executor", 0.0))
        total.append(peaks.get("executor_total", 0.0))
        jvm.append(peaks.get("jvm", 0.0))
    return summarize(f"pykafka {master}", w, times[:warmups], times[warmups:], rss[warmups:],
                     rss_of="largest executor Python worker (pyspark.daemon and its forks)",
                     executor_sum_of_peaks_mb=round(max(total[warmups:]), 1),
                     jvm_peak_rss_mb=round(max(jvm[warmups:]), 1),
                     rss_reset_ok=reset_ok, options=extra_options or None,
                     input_partitions=tasks)


# After a timed read, before its CPU is read: Python workers finish their post-task collection
# and the broker its last responses (not part of the timing, only of the CPU accounting).
CPU_SETTLE_S = 0.2


def floor_pairs(spark, bootstrap: str, w: Workload, rounds: int,
                args) -> tuple[list[float], dict, dict | None]:
    """pykafka's records/s over the floor's in each of ``rounds`` paired rounds: one floor read,
    then one pykafka read of the same rows, back to back (both already warm); and the CPU
    seconds of each read by process kind (:func:`procmon.cpu_by_kind`: ``jvm`` Spark's JVM,
    ``executor`` its Python workers, ``planner``, ``broker``, ``machine`` all of it), medians
    over the rounds, ``{"floor": {...}, "pykafka": {...}}``.

    With ``--fetch-floor on`` each round reads the fetch floor too (the floor's batches, yielded
    as pykafka's fetch loop brings the same ranges from the broker, undecoded; see
    ``floor_source``), between the two; the third result is then its per-round ratios
    ``{"fetch_vs_floor": [...], "pykafka_vs_fetch": [...]}`` (else None), and its CPU is under
    ``"fetch"`` in the second."""
    floor_opts = floor_options(spark, w, args)
    fetch_opts = {**floor_opts, "fetchFrom": bootstrap} if args.fetch_floor == "on" else None
    mine = pykafka_options(bootstrap, w, args.extra_options)
    ratios = []
    fetch_ratios: dict[str, list[float]] = {"fetch_vs_floor": [], "pykafka_vs_fetch": []}
    cpu: dict[str, list[dict]] = {"floor": [], "fetch": [], "pykafka": []}

    def timed(fmt_: str, options: dict, reader: str, who: str) -> float:
        before = cpu_by_kind()
        seconds, _ = spark_read_once(spark, fmt_, options, w, reader)
        time.sleep(CPU_SETTLE_S)
        cpu[who].append(cpu_delta(before, cpu_by_kind()))
        return seconds

    for _ in range(rounds):
        floor_s = timed(floor_source.FLOOR_NAME, floor_opts, FLOOR, "floor")
        fetch_s = None
        if fetch_opts is not None:
            fetch_s = timed(floor_source.FLOOR_NAME, fetch_opts, FLOOR, "fetch")
        pykafka_s = timed("pykafka", mine, "pykafka", "pykafka")
        ratios.append(round(floor_s / pykafka_s, 3))
        if fetch_s is not None:
            fetch_ratios["fetch_vs_floor"].append(round(floor_s / fetch_s, 3))
            fetch_ratios["pykafka_vs_fetch"].append(round(fetch_s / pykafka_s, 3))
    medians = {who: {k: round(statistics.median(d.get(k, 0.0) for d in runs), 3)
                     for k in sorted({k for d in runs for k in d})}
               for who, runs in cpu.items() if runs}
    return ratios, medians, (fetch_ratios if fetch_opts is not None else None)


def cpu_text(cpu: dict) -> str:
    """``machine 0.75 / 1.02, jvm 0.61 / 0.59, ...``: floor / pykafka CPU seconds per read
    (floor / fetch floor / pykafka when the rounds had the fetch floor)."""
    readers = [cpu.get(who) or {} for who in ("floor", "fetch", "pykafka")
               if who != "fetch" or cpu.get("fetch")]
    kinds = [k for k in ("machine", "jvm", "executor", "broker", "planner", "bench")
             if any(k in r for r in readers)]
    return ", ".join(f"{k} " + " / ".join(f"{r.get(k, 0.0):.2f}" for r in readers)
                     for k in kinds)


def measure_floor(spark, w: Workload, runs: int, warmups: int, args) -> dict:
    """The floor's batch read of ``w``'s rows (no Kafka), timed as pykafka's."""
    options = floor_options(spark, w, args)
    times = []
    for _ in range(warmups + runs):
        elapsed, tasks = spark_read_once(spark, floor_source.FLOOR_NAME, options, w, FLOOR)
        times.append(elapsed)
    return summarize(f"{FLOOR} {ANCHOR_MASTER}", w, times[:warmups], times[warmups:], [],
                     input_partitions=tasks, batch_bytes=args.floor_batch_bytes)


# ---------------------------------------------------------------------------------------------
# Streams; the comparison with the floor and Spark's JVM Kafka source on the same topics
# ---------------------------------------------------------------------------------------------

def progress_time(progress: dict, key: str = "triggerExecution") -> float:
    """Wall-clock time (epoch seconds) at which a progress report's trigger ended."""
    started = dt.datetime.strptime(progress["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    return (started.replace(tzinfo=dt.timezone.utc).timestamp()
            + progress["durationMs"].get(key, 0) / 1000)


def spark_stream_once(spark, source_format: str, options: dict, w: Workload, max_offsets: int,
                      reader: str) -> dict:
    """An AvailableNow stream over the whole topic into the noop sink, as the JVM anchor runs
    it: seconds from load() to termination, micro-batches with data, and the start-up: from
    ``start()`` to the end of the first trigger (from Spark's progress report of batch 0).

    On a PySpark without admission control for Python sources (4.0, 4.1:
    ``kafka_source.spark_features.ADMISSION_CONTROL``) Spark runs ``Trigger.AvailableNow`` as
    one micro-batch, which ``maxOffsetsPerTrigger`` cuts short. There the stream runs with the
    default trigger (each micro-batch starts when the last ended, as AvailableNow's do), the
    source applying ``maxOffsetsPerTrigger`` itself, until Spark's progress reports have counted
    every record; the time is taken to the end of the trigger that read the last of them (from
    its progress report), and the query is stopped after that."""
    from kafka_source.spark_features import ADMISSION_CONTROL

    checkpoint = tempfile.mkdtemp(prefix="pykafka-bench-ckpt-")
    try:
        t0 = time.perf_counter()
        writer = (spark.readStream.format(source_format).options(**options)
                  .option("maxOffsetsPerTrigger", str(max_offsets))
                  .load().selectExpr("length(value) AS n")
                  .writeStream.format("noop").option("checkpointLocation", checkpoint))
        if ADMISSION_CONTROL:
            writer = writer.trigger(availableNow=True)
        started = time.time()
        before_start = time.perf_counter() - t0
        query = writer.start()
        if ADMISSION_CONTROL:
            query.awaitTermination()
            elapsed = time.perf_counter() - t0
        else:
            elapsed = _until_all_read(query, w, before_start, started)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = query.recentProgress
    records = sum(p["numInputRows"] for p in progress)
    check(w, f"{reader} stream (maxOffsetsPerTrigger={max_offsets})", records, None)
    first = next((p for p in progress if p["batchId"] == 0), None)
    return {"seconds": elapsed, "batches": len([p for p in progress if p["numInputRows"] > 0]),
            "startup_s": None if first is None else progress_time(first) - started}


def _until_all_read(query, w: Workload, before_start: float, started: float,
                    timeout_s: float = 600.0) -> float:
    """Wait for a running stream's progress reports to count ``w.records``, stop it, and return
    the seconds from load() to the end of the trigger that read the last record."""
    deadline = time.monotonic() + timeout_s
    while True:
        progress = query.recentProgress
        if sum(p["numInputRows"] for p in progress) >= w.records:
            break
        if query.exception() is not None or not query.isActive:
            break
        if time.monotonic() > deadline:
            query.stop()
            raise CorrectnessError(f"stream on {w.topic}: not every record read after "
                                   f"{timeout_s:.0f} s")
        # Seldom: each look is a py4j call on the driver, and the time is taken from the
        # progress reports, not from when this loop saw them.
        time.sleep(0.25)
    query.stop()
    last = max((p for p in progress if p["numInputRows"] > 0), key=lambda p: p["batchId"],
               default=None)
    return before_start + (0.0 if last is None else progress_time(last) - started)


def measure_stream(spark, source_format: str, options: dict, w: Workload, max_offsets: int,
                   runs: int, warmups: int, reader: str) -> dict:
    outs = [spark_stream_once(spark, source_format, options, w, max_offsets, reader)
            for _ in range(warmups + runs)]
    times = [o["seconds"] for o in outs]
    startups = [o["startup_s"] for o in outs[warmups:] if o["startup_s"] is not None]
    return summarize(f"{reader} {ANCHOR_MASTER}", w, times[:warmups], times[warmups:], [],
                     micro_batches=outs[-1]["batches"], max_offsets_per_trigger=max_offsets,
                     startup_s=round(statistics.median(startups), 3) if startups else None,
                     startup_runs_s=[round(s, 3) for s in startups],
                     startup_measured="start() to the end of the first trigger")


@dataclass
class AnchorWorkload:
    """One of the issue's five workloads, read by the floor, pykafka and Spark's JVM source."""

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

    @property
    def floor_key(self) -> tuple:
        """The floor's rows do not depend on the codec, the values or the broker."""
        w = self.workload
        return (self.mode, tuple(sorted(w.counts.items())), w.size, self.max_offsets)


def stream_names(limits: tuple[int, ...]) -> tuple[str, ...]:
    """``stream-N`` reads the uncompressed topic, ``stream-lz4-N`` the lz4 one."""
    return tuple(f"stream-{prefix}{count_label(n)}" for prefix in ("", "lz4-") for n in limits)


def anchor_workloads(workloads: list[Workload], big: Workload | None,
                     limits: tuple[int, ...], only: tuple[str, ...] | None = None
                     ) -> list[AnchorWorkload]:
    """The comparison's workloads over these topics; ``only`` None: the default set (the five
    of issue 9)."""
    by_codec = {w.codec: w for w in workloads}
    out = [AnchorWorkload(f"batch-{c}", "batch", by_codec[c]) for c in ("lz4", "none")
           if c in by_codec]
    if big is not None:
        out.append(AnchorWorkload("batch-1partition", "batch", big))
    for codec, prefix in (("none", ""), ("lz4", "lz4-")):
        if codec in by_codec:
            out += [AnchorWorkload(f"stream-{prefix}{count_label(n)}", "stream", by_codec[codec],
                                   n) for n in limits]
    chosen = ANCHOR_WORKLOADS[:3] + stream_names(limits)[:len(limits)] if only is None else only
    return [a for a in out if a.name in chosen]


def compare_with_jvm(spark, bootstrap: str, todo: list[AnchorWorkload], results: list[dict],
                     args, guarded, floors: dict) -> list[dict]:
    """The floor's and pykafka's figures for the anchor workloads (reusing pykafka's codec runs
    at local[2]; one floor measurement per distinct set of rows, in ``floors``)."""
    rows = []
    for a in todo:
        w = a.workload
        floor = None
        if args.floor == "on":
            floor = floors.get(a.floor_key)
            if floor is not None:
                log(f"floor {ANCHOR_MASTER}: {a.name}: the same rows as its {floor['workload']} "
                    "runs above")
                floor = {**floor, "same_rows_as": f"{floor['values']} {floor['workload']}"}
            else:
                log(f"floor {ANCHOR_MASTER}: {a.name} ({args.warmups} warm-up + {args.runs} "
                    "runs)")
                if a.mode == "batch":
                    floor = guarded(f"floor {a.name}", measure_floor, spark, w, args.runs,
                                    args.warmups, args)
                else:
                    floor = guarded(f"floor {a.name}", measure_stream, spark,
                                    floor_source.FLOOR_NAME, floor_options(spark, w, args), w,
                                    a.max_offsets, args.runs, args.warmups, FLOOR)
                if floor:
                    log(f"  {floor['records_per_s']:,.0f} records/s, median "
                        f"{floor['median_s']:.3f} s")
                    floors[a.floor_key] = floor
                else:
                    floor = failed_row(f"{FLOOR} {ANCHOR_MASTER}", w, "see the log")
        if a.mode == "batch":
            row = next((r for r in results if r["reader"] == f"pykafka {ANCHOR_MASTER}"
                        and r["topic"] == w.topic and r["broker"] == w.broker
                        and r.get("median_s")), None)
            if row is not None:
                log(f"pykafka {ANCHOR_MASTER}: {a.name} ({w.values}): the {w.name} runs above")
            else:
                log(f"pykafka {ANCHOR_MASTER}: {a.name} ({w.values}, {args.warmups} warm-up + "
                    f"{args.runs} runs)")
                row = guarded(f"pykafka {a.name}", measure_spark, spark, ANCHOR_MASTER,
                              _NoMonitor(), bootstrap, w, args.runs, args.warmups,
                              args.extra_options)
        else:
            log(f"pykafka {ANCHOR_MASTER}: {a.name} ({w.values}, {args.warmups} warm-up + "
                f"{args.runs} runs)")
            options = pykafka_stream_options(bootstrap, w, args.extra_options)
            row = guarded(f"pykafka {a.name}", measure_stream, spark, "pykafka", options, w,
                          a.max_offsets, args.runs, args.warmups, "pykafka")
        if row:
            log(f"  {row['records_per_s']:,.0f} records/s, median {row['median_s']:.3f} s"
                + (f", start-up {row['startup_s']:.2f} s" if row.get("startup_s") else ""))
        else:
            row = failed_row(f"pykafka {ANCHOR_MASTER}", w, "see the log")
        pairs = pair_cpu = fetch_pairs = None
        if (a.mode == "batch" and args.floor_pairs and (floor or {}).get("records_per_s")
                and row.get("records_per_s")):
            log(f"floor and pykafka {ANCHOR_MASTER}: {a.name} ({w.values}), "
                f"{args.floor_pairs} paired rounds")
            paired = guarded(f"paired floor {a.name}", floor_pairs, spark, bootstrap, w,
                             args.floor_pairs, args)
            if paired:
                pairs, pair_cpu, fetch_pairs = paired
                log(f"  pykafka / floor per round: {' '.join(f'{r:.2f}' for r in pairs)}")
                if fetch_pairs:
                    for k, label in (("fetch_vs_floor", "fetch floor / floor"),
                                     ("pykafka_vs_fetch", "pykafka / fetch floor")):
                        log(f"  {label} per round: "
                            f"{' '.join(f'{r:.2f}' for r in fetch_pairs[k])}")
                log(f"  CPU seconds per read, floor / {'fetch floor / ' if fetch_pairs else ''}"
                    f"pykafka (medians): {cpu_text(pair_cpu)}")
        rows.append({"broker": w.broker, "values": w.values, "workload": a.name,
                     "label": a.label, "mode": a.mode, "topic": w.topic,
                     "max_offsets_per_trigger": a.max_offsets, "floor": floor, "pykafka": row,
                     "paired_ratios_vs_floor": pairs,
                     "paired_cpu_s": pair_cpu,
                     "paired_ratio_vs_floor": (round(statistics.median(pairs), 3) if pairs
                                               else None),
                     "paired_fetch_floor": ({k: {"rounds": v,
                                                 "median": round(statistics.median(v), 3)}
                                             for k, v in fetch_pairs.items()}
                                            if fetch_pairs and fetch_pairs["fetch_vs_floor"]
                                            else None)})
    return rows


def run_jvm(path, bootstrap: str, todo: list[AnchorWorkload], rows: list[dict], args,
            guarded) -> None:
    """The JVM source (``--jvm-variants``: plain, tuned) on the same topics, after pykafka's
    session stopped."""
    for a, row in zip(todo, rows):
        if args.jvm_workloads is not None and a.name not in args.jvm_workloads:
            continue
        for variant in args.jvm_variants:
            tuned = variant == "tuned"
            key = "jvm_tuned" if tuned else "jvm"
            log(f"Spark JVM Kafka source{' (tuned)' if tuned else ''}: {a.name} "
                f"({a.workload.values})")
            out = guarded(f"JVM {key} {a.workload.broker} {a.workload.values} {a.name}",
                          jvm_anchor.run_anchor, path,
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


def jvm_stream_pairs(path, spark, bootstrap: str, todo: list[AnchorWorkload], rows: list[dict],
                     args, guarded) -> None:
    """Streams in paired rounds with Spark's JVM source: per round one pykafka stream in this
    (warm) session, then one anchor invocation (its own warm-up, ``--jvm-pair-runs`` timed
    runs; the last is paired) of the variant ``--jvm-variants`` names last (tuned, when it is
    there). Their times are minutes apart otherwise, and this machine's speed moves by tens of
    percent in that time. Sets ``paired_ratios_vs_jvm`` and ``paired_ratio_vs_jvm`` (pykafka /
    JVM, per round and median), ``paired_jvm_variant`` and ``paired_jvm_runs`` on the stream
    rows.

    The paired run is not the anchor's first timed one by default: a fresh JVM is still
    compiling Spark's and the Kafka client's hot code then. Measured 2026-12-03 (Kafka 2.2, the
    lz4 stream of 100,000 records per trigger, three fresh anchors): its first timed runs took
    2.47, 2.01 and 2.22 s, the second 2.14, 1.72 and 1.98 s, the third 2.17, 1.79 and 1.91 s,
    where pykafka's session has run many streams before."""
    variant = args.jvm_variants[-1]
    for a, row in zip(todo, rows):
        if a.mode != "stream" or (args.jvm_workloads is not None
                                  and a.name not in args.jvm_workloads):
            continue
        log(f"pykafka and the JVM source ({variant}) {ANCHOR_MASTER}: {a.name} "
            f"({a.workload.values}), {args.jvm_pairs} paired rounds")
        options = pykafka_stream_options(bootstrap, a.workload, args.extra_options)

        def rounds():
            ratios = []
            for _ in range(args.jvm_pairs):
                mine = spark_stream_once(spark, "pykafka", options, a.workload, a.max_offsets,
                                         "pykafka")["seconds"]
                theirs = jvm_anchor.run_anchor(
                    path, bootstrap=bootstrap, topic=a.workload.topic, mode=a.mode,
                    runs=args.jvm_pair_runs, master=ANCHOR_MASTER,
                    max_offsets_per_trigger=a.max_offsets, tuned=variant == "tuned")
                check(a.workload, f"JVM {variant} (paired)", theirs.get("records") or 0, None)
                ratios.append(round(paired_anchor_seconds(theirs) / mine, 3))
            return ratios

        pairs = guarded(f"paired JVM {a.workload.broker} {a.workload.values} {a.name}", rounds)
        if pairs:
            log(f"  pykafka / JVM per round: {' '.join(f'{r:.2f}' for r in pairs)}")
            row.update(paired_ratios_vs_jvm=pairs, paired_jvm_variant=variant,
                       paired_jvm_runs=args.jvm_pair_runs,
                       paired_ratio_vs_jvm=round(statistics.median(pairs), 3))


def paired_anchor_seconds(result: dict) -> float:
    """The seconds of an anchor invocation's last timed run (its JSON's ``runs``), the one a
    paired round compares with."""
    runs = result.get("runs") or []
    if not runs:
        raise RuntimeError(f"the JVM anchor reported no timed runs: {result}")
    return float(runs[-1])


def add_jvm_ratios(rows: list[dict]) -> None:
    for row in rows:
        mine = (row.get("pykafka") or {}).get("records_per_s")
        for key in ("floor", "jvm", "jvm_tuned"):
            theirs = (row.get(key) or {}).get("records_per_s")
            row[f"ratio_vs_{key}"] = round(mine / theirs, 3) if mine and theirs else None


class _NoMonitor:
    """ProcessMonitor's interface when memory is not what is measured."""

    def reset(self) -> bool:
        return True

    def peaks_mb(self) -> dict:
        return {}


def print_row_lines(rows: list[dict], key: str, title: str, text) -> None:
    """A titled list, a line per row that has ``key``: where the row is, then ``text(row[key])``."""
    chosen = [row for row in rows if row.get(key)]
    if chosen:
        print()
        print(title)
        for row in chosen:
            print(f"  {row['broker']} {row['values']} {row['workload']}: {text(row[key])}")


def print_jvm_table(rows: list[dict], note: str | None, floor_note: str | None) -> None:
    print(f"pykafka vs the floor (a Python source without Kafka, {floor_source.FLOOR_NAME}) and "
          f"Spark's JVM Kafka source (spark-sql-kafka-0-10 4.0.0), {ANCHOR_MASTER}, the same "
          "topics on each broker; records/s (MB/s):")
    for text in (note, floor_note):
        if text:
            print(f"  {text}")
    if not rows:
        return
    header = ("broker", "values", "workload", "floor", "pykafka", "JVM", "JVM tuned",
              "pk/floor", "paired", "pk/JVM", "pk/tuned", "paired")

    def cell(r, mb: bool):
        if not r or r.get("records_per_s") is None:
            return "FAILED" if r is not None else "-"
        seconds = r.get("median_s") or r.get("seconds_median")
        text = f"{r['records_per_s']:,.0f}"
        if not (mb and seconds):
            return text
        mbps = r["records"] * size / MB / seconds
        return text + f" ({mbps:.{0 if mbps >= 10 else 1}f})"

    table = []
    for row in rows:
        size = (row.get("pykafka") or {}).get("record_size") or 0
        batch = row["mode"] == "batch"
        table.append((row["broker"], row["values"], row["workload"],
                      cell(row.get("floor"), batch), cell(row.get("pykafka"), batch),
                      cell(row.get("jvm"), batch), cell(row.get("jvm_tuned"), batch),
                      fmt(row.get("ratio_vs_floor"), ".2f"),
                      fmt(row.get("paired_ratio_vs_floor"), ".2f"),
                      fmt(row.get("ratio_vs_jvm"), ".2f"),
                      fmt(row.get("ratio_vs_jvm_tuned"), ".2f"),
                      fmt(row.get("paired_ratio_vs_jvm"), ".2f")))
    print_grouped_table(header, table, left=3, group=2)
    labels = {row["workload"]: row["label"] for row in rows}
    print("workloads: " + "; ".join(f"{k} = {v}" for k, v in labels.items()))
    print("pk/floor, pk/JVM, pk/tuned: ratios of the medians; the first paired (batch reads): "
          "the median of pykafka / floor over paired rounds, each one floor read then one "
          "pykafka read; the second (streams): the median of pykafka / JVM source over paired "
          "rounds, each one pykafka stream then one anchor invocation of the last "
          "--jvm-variants (after its warm-up, the last of --jvm-pair-runs timed runs)")
    print_row_lines(
        rows, "paired_fetch_floor",
        "the fetch floor (the floor's batches as pykafka's fetch loop brings the ranges from the "
        "broker, undecoded), paired rounds, medians: fetch floor / floor (what Kafka's transport "
        "costs any reader here), pykafka / fetch floor (what decoding costs):",
        lambda f: f"{f['fetch_vs_floor']['median']:.2f}, {f['pykafka_vs_fetch']['median']:.2f}")
    print_row_lines(
        rows, "paired_cpu_s",
        "CPU seconds per batch read in the paired rounds, floor / pykafka, or floor / fetch "
        "floor / pykafka (medians; machine: all cores; jvm: Spark's JVM; executor: its Python "
        "workers; broker: the Kafka broker, which the floor does not use):", cpu_text)
    streams = [row for row in rows if row["mode"] == "stream"]
    if streams:
        print()
        print("stream start-up: from start() to the end of the first trigger (batch 0), median s; "
              + STARTUP_NOTE)
        table = [(row["broker"], row["values"], row["workload"],
                  fmt((row.get("floor") or {}).get("startup_s"), ".2f"),
                  fmt((row.get("pykafka") or {}).get("startup_s"), ".2f"),
                  fmt((row.get("pykafka") or {}).get("median_s"), ".2f"),
                  fmt((row.get("jvm") or {}).get("seconds_median"), ".2f"))
                 for row in streams]
        print_grouped_table(("broker", "values", "workload", "floor", "pykafka",
                             "pykafka total", "JVM total"), table, left=3, group=2)


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


@dataclass
class BrokerSpec:
    """One broker of the run: how to start it and what to call it in the report."""

    label: str          # "4.0", "2.2"; "" until started for a broker of the environment
    start: object       # () -> BrokerHandle
    where: str          # its distribution, or where it comes from


def find_distribution(version: str) -> str | None:
    """A local Kafka distribution of release ``version`` ("4.0"): ``KAFKA_HOME``,
    ``KAFKA_ZK_HOME``, ``../shared/kafka`` or ``../shared/kafka22``, whichever is that release."""
    from kafka_source.testing import distribution_version

    want = tuple(int(x) for x in version.split(".")[:2])
    for home in (os.environ.get("KAFKA_HOME", "").strip(),
                 os.environ.get("KAFKA_ZK_HOME", "").strip(),
                 str(SHARED / "kafka"), str(SHARED / "kafka22")):
        if home and distribution_version(home) == want:
            return home
    return None


def broker_plan(versions: list[str]) -> tuple[list[BrokerSpec], list[str]]:
    """The brokers to run on, in order, and notes on those that cannot run. Each version of
    ``--brokers`` is started from its distribution (:func:`find_distribution`): in ZooKeeper mode
    before Kafka 3.3, else in KRaft mode. ``KAFKA_BOOTSTRAP_SERVERS`` or ``PYKAFKA_TEST_BROKER``:
    that one broker only; no distribution at all: :func:`select_bench_broker`'s choice."""
    from kafka_source.testing import LocalKafkaBroker, LocalZkKafkaBroker

    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or os.environ.get("PYKAFKA_TEST_BROKER"):
        return [BrokerSpec("", select_bench_broker, "the environment")], [
            "--brokers not used: KAFKA_BOOTSTRAP_SERVERS or PYKAFKA_TEST_BROKER chose the broker"]
    specs, notes = [], []
    for version in versions:
        home = find_distribution(version)
        if home is None:
            notes.append(f"Kafka {version}: not run, no distribution of it found (KAFKA_HOME, "
                         f"KAFKA_ZK_HOME, {SHARED / 'kafka'}, {SHARED / 'kafka22'})")
            continue
        zookeeper = tuple(int(x) for x in version.split(".")[:2]) < (3, 3)
        broker_class = LocalZkKafkaBroker if zookeeper else LocalKafkaBroker
        specs.append(BrokerSpec(version, lambda c=broker_class, h=home: c(h),
                                f"{home} ({'ZooKeeper' if zookeeper else 'KRaft'} mode)"))
    if not specs:
        specs.append(BrokerSpec("", select_bench_broker, "no local distribution"))
    return specs, notes


def broker_label(broker) -> str:
    """``major.minor`` of a broker the environment chose, else its kind."""
    try:
        major, minor = broker.version
        return f"{major}.{minor}"
    except Exception:  # noqa: BLE001 - a broker that does not say
        return broker.kind


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


def workload_fields(reader: str, w: Workload) -> dict:
    """What every result row says of its reader and workload."""
    return {"reader": reader, "broker": w.broker, "values": w.values, "workload": w.name,
            "topic": w.topic, "codec": w.codec, "records": w.records, "record_size": w.size,
            "partitions": w.partitions, "value_bytes": w.value_bytes}


def failed_row(reader: str, w: Workload, error: str) -> dict:
    return {**workload_fields(reader, w), "median_s": None, "records_per_s": None,
            "mb_per_s": None, "peak_rss_mb": None, "error": error}


def _pass_key(r: dict) -> tuple:
    return (r.get("broker", ""), r.get("values", ""), r["workload"])


def add_ratios(results: list[dict]) -> None:
    base = {_pass_key(r): r["records_per_s"] for r in results if r["reader"] == CONFLUENT}
    for r in results:
        b, v = base.get(_pass_key(r)), r["records_per_s"]
        r["ratio_vs_confluent"] = round(v / b, 3) if b and v is not None else None


def sort_results(results: list[dict], codecs: list[str], brokers: list[str],
                 values: list[str]) -> list[dict]:
    readers = [CONFLUENT, KAFKA_PYTHON] + [f"pykafka {m}" for m in SPARK_MASTERS]

    def index(seq, item):
        return seq.index(item) if item in seq else len(seq)

    def key(r):
        return (index(brokers, r.get("broker")), index(values, r.get("values")),
                index(codecs, r["workload"]), index(readers, r["reader"]), r["reader"])

    return sorted(results, key=key)


def print_table(results: list[dict]) -> None:
    header = ("broker", "values", "workload", "reader", "median s", "records/s", "MB/s",
              "peak RSS MB", "vs confluent")
    rows = [(r["broker"], r["values"], r["workload"], r["reader"], fmt(r["median_s"], ".3f"),
             "FAILED" if r.get("error") else fmt(r["records_per_s"], ",.0f"),
             fmt(r["mb_per_s"], ".1f"),
             fmt(r["peak_rss_mb"], ".0f"), fmt(r.get("ratio_vs_confluent"), ".2f"))
            for r in results]
    print_grouped_table(header, rows, left=4, group=3)


def print_topics(topics: list[dict]) -> None:
    print("topics (MB = 10^6 bytes; on disk: the broker's log size, DescribeLogDirs):")
    rows = [(t["broker"], t["values"], t["codec"], t["topic"],
             f"{t['records']:,} x {t['size']} B", fmt(t["value_bytes"] / MB, ",.1f"),
             fmt(t["log_bytes"] / MB if t["log_bytes"] else None, ",.1f"),
             fmt(t["value_bytes"] / t["log_bytes"] if t["log_bytes"] else None, ".1f"))
            for t in topics]
    print_grouped_table(("broker", "values", "codec", "topic", "records", "values MB",
                         "on disk MB", "ratio"), rows, left=5, group=1)


def _where(r: dict) -> str:
    return f"Kafka {r.get('broker')}, {r.get('values')} values"


def targets(results: list[dict], memory: list[dict], idle: list[dict],
            jvm_rows: list[dict] = ()) -> list[dict]:
    """The issues' targets, per broker and value kind; a reader that failed fails its target
    (value "error")."""
    out = []
    for row in jvm_rows:
        if row.get("mode") == "batch" and row.get("floor") is not None:
            ratio = row.get("paired_ratio_vs_floor") or row.get("ratio_vs_floor")
            how = "median of paired rounds" if row.get("paired_ratio_vs_floor") else \
                "ratio of the medians"
            out.append({"target": f"pykafka / the floor >= {FLOOR_TARGET:.1f}x ({how}): "
                                  f"{row['label']} ({_where(row)})",
                        "value": "error" if ratio is None else ratio,
                        "pass": ratio is not None and ratio >= FLOOR_TARGET})
    for row in jvm_rows:
        if "jvm" not in row and "jvm_tuned" not in row:
            continue                  # the JVM source did not run (--jvm off, no anchor)
        best = max(((row.get(k) or {}).get("records_per_s") or 0 for k in ("jvm", "jvm_tuned")),
                   default=0)
        mine = (row.get("pykafka") or {}).get("records_per_s")
        ratio = round(mine / best, 3) if mine and best else None
        goal = JVM_TARGETS.get(row.get("workload"), RATIO_TARGET)
        which = "best of Spark's JVM source (plain, tuned)"
        if row.get("paired_ratio_vs_jvm") is not None:
            ratio = row["paired_ratio_vs_jvm"]
            which = (f"Spark's JVM source ({row['paired_jvm_variant']}, median of paired "
                     "rounds)")
        out.append({"target": f"pykafka / {which} >= "
                              f"{goal:.1f}x: {row['label']} ({_where(row)})",
                    "value": "error" if ratio is None else ratio,
                    "pass": ratio is not None and ratio >= goal})
    for r in results:
        if r["reader"] != "pykafka local[2]" or r["workload"] not in RATIO_CODECS or not any(
                b["reader"] == CONFLUENT and _pass_key(b) == _pass_key(r) for b in results):
            continue
        ratio = r.get("ratio_vs_confluent")
        out.append({"target": f"pykafka local[2] / confluent-kafka ({r['workload']}) >= "
                              f"{RATIO_TARGET:.1f}x ({_where(r)})",
                    "value": "error" if ratio is None else ratio,
                    "pass": ratio is not None and ratio >= RATIO_TARGET})
    for m in memory:
        rss = m.get("peak_rss_mb")
        out.append({"target": f"executor Python peak RSS reading one "
                              f"{m['value_bytes'] / 1e9:.2f} GB partition "
                              f"< {RSS_TARGET_MB:.0f} MB ({_where(m)})",
                    "value": "error" if rss is None else rss,
                    "pass": rss is not None and rss < RSS_TARGET_MB})
    for i in idle:
        out.append({"target": f"idle micro-batch trigger on the driver < {IDLE_TARGET_MS:.0f} ms "
                              f"(median, Kafka {i['broker']})",
                    "value": i["median_ms"], "pass": i["median_ms"] < IDLE_TARGET_MS})
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
    ap.add_argument("--codecs", default=None,
                    help="comma-separated compression codecs, one workload each "
                         "(default none,lz4,zstd,gzip; --quick none,lz4)")
    ap.add_argument("--brokers", default=",".join(BROKER_VERSIONS),
                    help="Kafka releases to run on, one after the other, each started from its "
                         "local distribution: 4.0 (KRaft; KAFKA_HOME or ../shared/kafka), 2.2 "
                         "(ZooKeeper mode; KAFKA_ZK_HOME or ../shared/kafka22) (default 4.0,2.2; "
                         "not used with KAFKA_BOOTSTRAP_SERVERS)")
    ap.add_argument("--values", default=",".join(VALUE_KINDS),
                    help="kinds of record values, a set of topics each: random (JSON-like text "
                         "with random numbers and words, lz4 ~2x), json (JSON events with "
                         "repeated fields and few distinct values, lz4 ~6-9x), repeat (four "
                         "such events cycled, ~19x: only the lz4 topic and its batch read and "
                         "streams, unless --codecs / --workloads are given) "
                         "(default random,json,repeat)")
    ap.add_argument("--workloads", default=None,
                    help="the comparison's workloads (floor, pykafka, JVM source), a subset of "
                         + ",".join(ANCHOR_WORKLOADS) + ",stream-lz4-20k,stream-lz4-100k "
                         "(stream-N and stream-lz4-N follow --stream-limits; stream-lz4-N reads "
                         "the lz4 topic) (default: the five before stream-lz4, and for the "
                         "repeat values batch-lz4 and stream-lz4-N; --quick batch-lz4,stream-20k)")
    ap.add_argument("--floor", choices=("on", "off"), default="on",
                    help="measure the floor, a Python data source without Kafka yielding "
                         "pykafka's rows (default on)")
    ap.add_argument("--floor-pairs", type=int, default=None,
                    help="paired rounds of the floor and pykafka per batch workload, after "
                         "their own runs; 0: none (default --runs)")
    ap.add_argument("--fetch-floor", choices=("on", "off"), default="on",
                    help="in the paired rounds, also read the fetch floor: the floor's batches "
                         "yielded as pykafka's fetch loop brings the same ranges from the broker, "
                         "undecoded (default on)")
    ap.add_argument("--jvm-pairs", type=int, default=None,
                    help="paired rounds of pykafka and Spark's JVM source (the last of "
                         "--jvm-variants) per stream workload; 0: none (default --runs)")
    ap.add_argument("--jvm-pair-runs", type=int, default=2,
                    help="timed runs of the anchor in each paired round, after its warm-up; "
                         "the last is paired (default 2: a fresh JVM's first timed run is "
                         "still warming up)")
    ap.add_argument("--floor-batch-bytes", type=int, default=floor_source.DEFAULT_BATCH_BYTES,
                    help="value bytes per Arrow batch the floor yields (default 8 MiB, about "
                         "what pykafka's decoder yields)")
    ap.add_argument("--jvm-workloads", default=None,
                    help="the comparison's workloads that Spark's JVM source runs too "
                         "(default: all of --workloads; --quick batch-lz4)")
    ap.add_argument("--jvm-variants", default=None,
                    help="Spark JVM source runs: plain, tuned (default plain,tuned; --quick "
                         "plain)")
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
                    help="small smoke run: 100k records, 100 MB memory test, 1 run after the "
                         "warm-up, codecs none,lz4, comparison workloads batch-lz4 and "
                         "stream-20k, the JVM source plain and on batch-lz4 only; both brokers, "
                         "both value kinds and the floor as in a full run")
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
        args.runs = 1 if args.quick else 3
    args.codecs_given = args.codecs is not None
    args.workloads_given = args.workloads is not None
    if args.codecs is None:
        args.codecs = "none,lz4" if args.quick else "none,lz4,zstd,gzip"
    if args.workloads is None:
        args.workloads = "batch-lz4,stream-20k" if args.quick else "all"
    if args.jvm_variants is None:
        args.jvm_variants = "plain" if args.quick else ",".join(JVM_VARIANTS)
    if args.jvm_workloads is None:
        args.jvm_workloads = "batch-lz4" if args.quick else "all"
    args.codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    args.brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    args.values = [v.strip() for v in args.values.split(",") if v.strip()]
    args.workloads, args.jvm_workloads = (
        None if names.strip() == "all" else tuple(w.strip() for w in names.split(",") if w.strip())
        for names in (args.workloads, args.jvm_workloads))
    args.jvm_variants = [v.strip() for v in args.jvm_variants.split(",") if v.strip()]
    bad = set(args.values) - set(VALUE_KINDS)
    if bad or not args.values:
        ap.error(f"--values: unknown kind(s) {sorted(bad)}; valid: {', '.join(VALUE_KINDS)}")
    bad = set(args.jvm_variants) - set(JVM_VARIANTS)
    if bad:
        ap.error(f"--jvm-variants: unknown {sorted(bad)}; valid: {', '.join(JVM_VARIANTS)}")
    for b in args.brokers:
        if not all(part.isdigit() for part in b.split(".")):
            ap.error(f"--brokers: {b!r} is not a Kafka release such as 4.0 or 2.2")
    if not args.brokers:
        ap.error("--brokers: at least one Kafka release")
    if args.floor_batch_bytes < 1:
        ap.error("--floor-batch-bytes must be >= 1")
    if args.floor_pairs is None:
        args.floor_pairs = 0 if args.floor == "off" else args.runs
    if args.floor_pairs < 0:
        ap.error("--floor-pairs must be >= 0")
    if args.jvm_pairs is None:
        args.jvm_pairs = 0 if args.quick else args.runs
    if args.jvm_pairs < 0:
        ap.error("--jvm-pairs must be >= 0")
    if args.jvm_pair_runs < 1:
        ap.error("--jvm-pair-runs must be >= 1")
    args.readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    args.masters = [m.strip() for m in args.masters.split(",") if m.strip()]
    args.extra_options = dict(o.split("=", 1) for o in args.option)
    args.stream_limits = tuple(int(n) for n in args.stream_limits.split(",") if n.strip())
    valid = ANCHOR_WORKLOADS[:3] + stream_names(args.stream_limits)
    for option, names in (("--workloads", args.workloads),
                          ("--jvm-workloads", args.jvm_workloads)):
        bad = set(names or ()) - set(valid)
        if bad:
            ap.error(f"{option}: unknown {sorted(bad)}; valid: {', '.join(valid)}")
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


class Bench:
    """One run: the brokers one after the other, and everything measured on them."""

    def __init__(self, args):
        self.args = args
        self.failures: list[str] = []    # correctness: wrong counts, readers that fail
        self.errors: list[str] = []      # non-fatal: e.g. the idle-trigger measurement failed
        self.last_error = ""
        self.brokers: list[dict] = []
        self.topics: list[dict] = []
        self.results: list[dict] = []
        self.jvm_rows: list[dict] = []
        self.memory: list[dict] = []
        self.idle: list[dict] = []
        self.write: dict | None = None
        self.write_jvm: list[dict] = []  # per broker: pykafka's sink against Spark's JVM sink
        # The write benchmark's JVM sink: the anchor's --mode write, whatever --readers says.
        self.write_anchor = jvm_anchor.anchor_path() if args.jvm == "auto" else None
        self.write_jvm_note = None
        if args.jvm == "off":
            self.write_jvm_note = "Spark's JVM sink: not run (--jvm off)"
        elif self.write_anchor is None:
            self.write_jvm_note = (f"Spark's JVM sink: not run, its anchor is not on this machine "
                                   f"({jvm_anchor.DEFAULT_ANCHOR}; see ../shared/README.md)")
        self.anchor = self.write_anchor if "pykafka" in args.readers else None
        self.jvm_note = None
        if args.only == "write":
            self.jvm_note = "not run (--only write)"
        elif args.jvm == "off":
            self.jvm_note = "Spark's JVM source: not run (--jvm off)"
        elif self.anchor is None:
            self.jvm_note = (f"Spark's JVM source: not run, its anchor is not on this machine "
                             f"({jvm_anchor.DEFAULT_ANCHOR}; see ../shared/README.md)")
        elif args.jvm_workloads is not None:
            self.jvm_note = (f"Spark's JVM source: on {', '.join(args.jvm_workloads)} only "
                             "(--jvm-workloads)")
        self.floor_note = "the floor: not run (--floor off)" if args.floor == "off" else None
        # The comparison table: the floor and pykafka, and the JVM source when it is there.
        self.compare = ("pykafka" in args.readers and args.only != "write"
                        and (self.anchor is not None or args.floor == "on"))

    def guarded(self, what: str, fn, *a, fatal: bool = True, **kw):
        """Run one measurement; a wrong count or a reader that fails is recorded and makes the
        exit status non-zero (``fatal=False``: recorded and printed only)."""
        try:
            return fn(*a, **kw)
        except CorrectnessError as exc:
            self.failures.append(str(exc))
            self.last_error = str(exc)
            log(f"CORRECTNESS FAILURE: {exc}")
        except Exception as exc:  # noqa: BLE001 - report and go on with the other readers
            (self.failures if fatal else self.errors).append(f"{what}: {short_error(exc)}")
            self.last_error = short_error(exc)
            log(f"FAILED: {what}: {short_error(exc)}\n{traceback.format_exc()}")
        return None

    def run_broker(self, spec: BrokerSpec, first: bool) -> None:
        log(f"starting Kafka {spec.label or ''} ({spec.where}) ...")
        broker = self.guarded(f"starting Kafka {spec.label} ({spec.where})", spec.start)
        if broker is None:
            return
        try:
            label = spec.label or broker_label(broker)
            is_tansu = bool(getattr(broker, "is_tansu", False))
            entry = {"label": label, "kind": broker.kind,
                     "bootstrap_servers": broker.bootstrap_servers, "where": spec.where,
                     "is_tansu": is_tansu}
            if is_tansu:
                entry["note"] = TANSU_NOTE
                log("!" * 96)
                log(f"!!! {TANSU_NOTE}")
                log("!" * 96)
            self.brokers.append(entry)
            log(f"Kafka {label}: {broker.kind} at {broker.bootstrap_servers}")
            self.measure_on(broker.bootstrap_servers, label, first, is_tansu)
        finally:
            broker.stop()

    def kind_defaults(self, values: str) -> tuple[list[str], tuple[str, ...] | None]:
        """The codecs and comparison workloads of a value kind: ``KIND_DEFAULTS`` unless
        ``--codecs`` / ``--workloads`` were given."""
        args, defaults = self.args, KIND_DEFAULTS.get(values, {})
        codecs = args.codecs
        if "codecs" in defaults and not args.codecs_given:
            codecs = [c for c in args.codecs if c in defaults["codecs"]] or list(defaults["codecs"])
        only = args.workloads
        if "workloads" in defaults and not args.workloads_given:
            only = defaults["workloads"]
        return codecs, only

    def workload_sets(self, bootstrap: str, label: str) -> dict:
        """Per value kind: the codec workloads, the one-partition workload (or None) and the
        comparison's workloads, with their topics ready."""
        args = self.args
        need_big = "pykafka" in args.readers and (
            not args.skip_memory or (self.compare and "batch-1partition" in (
                args.workloads or ANCHOR_WORKLOADS)))
        existing = existing_topics(bootstrap)
        sets = {}
        for values in args.values:
            codecs, only = self.kind_defaults(values)
            workloads = [Workload(c, c, args.records, args.size, args.partitions, values, label)
                         for c in codecs]
            big = Workload("memory", "none", args.memory_records, args.memory_size, 1, values,
                           label) if need_big and values not in KIND_DEFAULTS else None
            todo = anchor_workloads(workloads, big, args.stream_limits, only) \
                if self.compare else []
            for w in workloads + ([big] if big else []):
                prepare_topic(bootstrap, w, existing)
                self.topics.append({"broker": label, "values": values, "workload": w.name,
                                    "topic": w.topic, "records": w.records, "size": w.size,
                                    "partitions": w.partitions, "codec": w.codec,
                                    "value_bytes": w.value_bytes, "log_bytes": w.log_bytes,
                                    "produced_s": None if w.produced_s is None
                                    else round(w.produced_s, 2)})
            sets[values] = (workloads, big, todo)
        return sets

    def measure_on(self, bootstrap: str, label: str, first: bool, is_tansu: bool) -> None:
        args = self.args
        sets = self.workload_sets(bootstrap, label) if args.only != "write" else {}

        for client in (CONFLUENT, KAFKA_PYTHON):
            if client not in args.readers:
                continue
            for workloads, _big, _todo in sets.values():
                for w in workloads:
                    log(f"{client}: {w.name} ({w.values}, Kafka {label}; {args.warmups} warm-up "
                        f"+ {args.runs} runs)")
                    r = self.guarded(f"{client} {label} {w.values} {w.name}", measure_client,
                                     client, bootstrap, w, args.runs, args.warmups, args.timeout)
                    if r:
                        self.results.append(r)
                        log(f"  {r['records_per_s']:,.0f} records/s, median {r['median_s']:.3f} s")
                    else:
                        self.results.append(failed_row(client, w, self.last_error))

        rows_by_set: dict[str, list[dict]] = {}
        if "pykafka" in args.readers and sets:
            floors: dict = {}
            masters = list(args.masters)
            if self.compare and ANCHOR_MASTER not in masters:
                masters.append(ANCHOR_MASTER)     # for the comparison only
            for master in masters:
                log(f"Kafka {label}: starting Spark {master} ...")
                spark = start_spark(master)
                try:
                    if master in args.masters:
                        self.pykafka_runs(spark, master, bootstrap, label, sets)
                    if self.compare and master == ANCHOR_MASTER:
                        for values, (_w, _big, todo) in sets.items():
                            rows_by_set[values] = compare_with_jvm(
                                spark, bootstrap, todo, self.results, args, self.guarded, floors)
                        if self.anchor is not None and args.jvm_pairs:
                            for values, (_w, _big, todo) in sets.items():
                                if values in rows_by_set:
                                    jvm_stream_pairs(self.anchor, spark, bootstrap, todo,
                                                     rows_by_set[values], args, self.guarded)
                finally:
                    spark.stop()
        if self.anchor is not None:
            # After pykafka's SparkSession stopped: the JVM source gets the machine to itself.
            for values, (_w, _big, todo) in sets.items():
                if todo and values in rows_by_set:
                    run_jvm(self.anchor, bootstrap, todo, rows_by_set[values], args,
                            self.guarded)
        for rows in rows_by_set.values():
            add_jvm_ratios(rows)
            self.check_floor_tasks(rows)
            self.jvm_rows.extend(rows)

        if sets:
            workloads = next(iter(sets.values()))[0]
            if workloads:
                log(f"idle trigger (Kafka {label}) ...")
                idle = self.guarded(f"idle trigger {label}", idle_trigger, bootstrap,
                                    workloads[0].topic, args.idle_calls, fatal=False)
                if idle:
                    self.idle.append({"broker": label, **idle})

        if first and args.only != "read" and args.writers and args.write_codecs:
            cfg = write_bench.WriteConfig(
                records=args.records, size=args.size, partitions=args.partitions,
                codecs=tuple(args.write_codecs), writers=tuple(args.writers),
                masters=tuple(args.write_masters), runs=args.runs, warmups=args.warmups,
                tasks=args.write_tasks, keyed=args.write_keyed, timeout_s=args.timeout,
                options=args.write_options, fetch_hw=is_tansu,
                verify_content=args.write_verify == "content")
            self.write = self.guarded("write benchmark", write_bench.run_write_bench, cfg,
                                      bootstrap, start_spark)
            if self.write:
                self.write["broker"] = label
                self.failures.extend(self.write["failures"])
        if (args.only != "read" and write_bench.PYKAFKA in args.writers and args.write_codecs
                and self.write_anchor is not None):
            # On every broker: pykafka's sink against Spark's JVM sink, the same generated rows
            # (without the anchor, write_jvm_note says why it did not run).
            cfg = write_bench.WriteConfig(
                records=args.records, partitions=args.partitions,
                codecs=tuple(args.write_codecs), runs=args.runs, warmups=args.warmups,
                timeout_s=args.timeout, options=args.write_options, fetch_hw=is_tansu,
                verify_content=args.write_verify == "content")
            section = self.guarded(f"write vs Spark's JVM sink ({label})",
                                   write_bench.run_jvm_compare, cfg, bootstrap, start_spark,
                                   self.write_anchor, variants=args.jvm_variants, broker=label)
            if section:
                self.write_jvm.append(section)
                self.failures.extend(section["failures"])

    def check_floor_tasks(self, rows: list[dict]) -> None:
        """The floor must run as many input partitions as pykafka (batch reads; streams use the
        same planner per micro-batch)."""
        for row in rows:
            mine = (row.get("pykafka") or {}).get("input_partitions")
            floor = (row.get("floor") or {}).get("input_partitions")
            if mine and floor and mine != floor:
                self.errors.append(f"floor {row['workload']} ({row['broker']}, {row['values']}): "
                                   f"{floor} input partitions, pykafka {mine}: not comparable")

    def pykafka_runs(self, spark, master: str, bootstrap: str, label: str, sets: dict) -> None:
        """pykafka on every codec workload at ``master``, and the memory test at local[1]."""
        args = self.args
        with ProcessMonitor() as monitor:
            for workloads, big, _todo in sets.values():
                for w in workloads:
                    log(f"pykafka {master}: {w.name} ({w.values}, Kafka {label}; "
                        f"{args.warmups} warm-up + {args.runs} runs)")
                    r = self.guarded(f"pykafka {master} {label} {w.values} {w.name}",
                                     measure_spark, spark, master, monitor, bootstrap, w,
                                     args.runs, args.warmups, args.extra_options)
                    if r:
                        self.results.append(r)
                        log(f"  {r['records_per_s']:,.0f} records/s, median "
                            f"{r['median_s']:.3f} s, worker peak RSS {r['peak_rss_mb']:.0f} MB")
                    else:
                        self.results.append(failed_row(f"pykafka {master}", w, self.last_error))
                if big is not None and master == "local[1]" and not args.skip_memory:
                    log(f"memory: pykafka local[1] reading one partition of "
                        f"{big.value_bytes / 1e9:.2f} GB ({big.values}, Kafka {label}) ...")
                    memory = self.guarded(f"memory test {label} {big.values}", measure_spark,
                                          spark, master, monitor, bootstrap, big, 1, 0,
                                          args.extra_options)
                    if memory:
                        memory["processes"] = monitor.processes()
                        log(f"  peak executor Python RSS {memory['peak_rss_mb']:.0f} MB, "
                            f"{memory['mb_per_s']:.1f} MB/s")
                    else:
                        memory = failed_row("pykafka local[1]", big, self.last_error)
                    self.memory.append(memory)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Spark's Python workers import pykafka from the repository and the floor from here.
    paths = [str(REPO_ROOT), str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))

    report: dict = {"started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                    "machine": machine_info(), "versions": versions(),
                    "config": {k: v for k, v in vars(args).items() if k not in ("json",)}}
    bench = Bench(args)
    specs, broker_notes = broker_plan(args.brokers)
    for note in broker_notes:
        log(note)
        if not note.startswith("--brokers not used"):
            bench.errors.append(note)
    for i, spec in enumerate(specs):
        bench.run_broker(spec, first=i == 0)

    labels = [b["label"] for b in bench.brokers]
    add_ratios(bench.results)
    results = sort_results(bench.results, args.codecs, labels, args.values)
    checks = targets(results, bench.memory, bench.idle, bench.jvm_rows) + (
        bench.write["targets"] if bench.write else []) + [
        t for section in bench.write_jvm for t in section["targets"]]
    report.update({
        "brokers": bench.brokers, "broker_notes": broker_notes, "topics": bench.topics,
        "results": results, "memory": bench.memory, "idle_trigger": bench.idle,
        "floor": {"format": floor_source.FLOOR_NAME, "enabled": args.floor == "on",
                  "batch_bytes": args.floor_batch_bytes,
                  "what": "a Python data source without Kafka yielding pykafka's schema and "
                          "rows in pykafka's input partitions (floor_source.py)"},
        "vs_spark_jvm_kafka": {"rows": bench.jvm_rows, "note": bench.jvm_note,
                               "anchor": str(bench.anchor) if bench.anchor else None,
                               "master": ANCHOR_MASTER, "variants": args.jvm_variants,
                               "startup_note": STARTUP_NOTE},
        "write": bench.write,
        "write_vs_spark_jvm_kafka": {"sections": bench.write_jvm, "note": bench.write_jvm_note,
                                     "anchor": str(bench.write_anchor) if bench.write_anchor
                                     else None},
        "targets": checks, "correctness_failures": bench.failures,
        "errors": bench.errors, "duration_s": round(time.time() - started, 1)})

    print()
    for b in bench.brokers:
        print(f"Kafka {b['label']}: {b['kind']} at {b['bootstrap_servers']} ({b['where']})")
        if b["is_tansu"]:
            print(f"!!! {TANSU_NOTE}")
    for note in broker_notes:
        print(note)
    m = report["machine"]
    print(f"machine: {m.get('nproc')} CPUs ({m.get('cpu_model', '?')}), {m.get('ram_gb', '?')} GB"
          f" RAM, load {m.get('loadavg_at_start')}")
    if args.only != "write":
        print(f"workloads: {args.records:,} records x {args.size} B, {args.partitions} "
              f"partitions; median of {args.runs} runs after {args.warmups} warm-up; "
              "query count(*), sum(length(value)); MB = 10^6 value bytes")
        print()
        if bench.topics:
            print_topics(bench.topics)
            print()
        print_table(results)
        print()
    if "pykafka" in args.readers and args.only != "write":
        print_jvm_table(bench.jvm_rows, bench.jvm_note, bench.floor_note)
        print()
    for mem in bench.memory:
        where = f"Kafka {mem['broker']}, {mem['values']} values"
        if mem.get("error"):
            print(f"memory ({where}): FAILED ({mem['error']})")
        else:
            print(f"memory ({where}): one partition, {mem['records']:,} x {mem['record_size']} B "
                  f"({mem['value_bytes'] / 1e9:.2f} GB), pykafka local[1]: executor Python peak "
                  f"RSS {mem['peak_rss_mb']:.0f} MB, {mem['mb_per_s']:.1f} MB/s")
    for idle in bench.idle:
        print(f"idle trigger (Kafka {idle['broker']}): median {idle['median_ms']:.2f} ms, p95 "
              f"{idle['p95_ms']:.2f} ms over {idle['calls']} calls (latestOffset + partitions, "
              "no new data)")
    if bench.write:
        print()
        print(f"write benchmark on Kafka {bench.write['broker']}:")
        write_bench.print_write_report(bench.write)
        print()
    if bench.write_jvm or (bench.write_jvm_note and args.only != "read"):
        write_bench.print_jvm_write_report(bench.write_jvm, bench.write_jvm_note)
        print()
    for c in checks:
        print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['target']}: {c['value']}")
    for e in bench.errors:
        print(f"ERROR (not counted as a correctness failure): {e}")
    for f in bench.failures:
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
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
