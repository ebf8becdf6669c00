"""Write throughput: pykafka's sink against plain Kafka producer loops (issue 10) and Spark's
JVM Kafka sink (issue 18), on the same broker, in one run.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/run.py --only write
    make bench BENCH_ARGS="--only write --write-codecs lz4 --runs 5"

Workload (per codec, ``none`` and ``lz4`` by default): ``--records`` (1,000,000) values of
``--size`` (100) bytes, unkeyed (``--write-keyed`` adds keys), written to a fresh topic of
``--partitions`` (4) partitions per run, created before the clock starts and deleted after the
run was checked. The values are ``payloads.payload_pool``'s JSON-like text, cycled, the same
values in the same order for every writer. Writers:

* ``pykafka local[2]`` (and ``local[1]`` with ``--write-masters``):
  ``df.write.format("pykafka").mode("append")`` with ``kafka.bootstrap.servers``, ``topic`` and
  ``kafka.compression.type`` only, i.e. the sink's defaults (acks=all, idempotent). The DataFrame
  is read from a Parquet file written once to a temporary directory, split into ``--write-tasks``
  partitions of equal size, each a contiguous run of the records in payload order (default: the
  session's default parallelism, one task per core), cached and counted before any timing, so the
  timing is the write, not making the data. Timed: ``save()``.
* ``confluent-kafka``: a plain librdkafka producer loop with its defaults (acks=all,
  enable.idempotence=false, linger.ms=5) and the codec; ``confluent-kafka idempotent`` is the same
  with ``enable.idempotence=true`` (pykafka's default guarantee). ``kafka-python``: a plain
  ``KafkaProducer`` loop with its defaults (3.0: acks=all, idempotent, linger_ms=0). Each in a
  fresh process (``clients.py``), its payload built before the clock starts; timed from producer
  creation to the end of ``flush()``.

Runs are interleaved (warm-up round, then ``--runs`` rounds; each round runs every writer once),
so a change in the machine's load during the benchmark hits all writers alike; each run records
the 1-minute load average when it started. The median of the rounds is reported.

Every run is checked: the topic's partitions must start at offset 0 and their end offsets must add
up to exactly ``--records``, and (unless ``--write-verify count``) every record is read back with
confluent-kafka's consumer and the multiset of records compared with the payload (count, value
bytes and a sum of CRC-32s): a record lost, duplicated or altered fails the run, and the
benchmark's exit status. The report also has each run's on-disk log size (DescribeLogDirs),
which shows that the codec was applied and how well the writer batched.

Against Spark's JVM Kafka sink (issue 18; :func:`run_jvm_compare`, on every broker of the run):
the anchor (``../shared/anchors/spark-jvm-kafka/run --mode write``, see ``jvm_anchor.py``) writes
``spark.range(N, numPartitions=2).selectExpr(*JVM_WRITE_SOURCE)`` (1000 string keys, 100-byte hex
values) with ``df.write.format("kafka")`` at ``local[2]``, plain and tuned (``kafka.batch.size``
256 KiB, ``kafka.linger.ms`` 5), into topics PREFIX-0 .. PREFIX-RUNS of ``--partitions``
partitions that this module creates before and deletes after (one warm-up run, the anchor's
median of the rest). ``pykafka local[2] (generated rows)`` writes the very same DataFrame the same
way, ``df.write.format("pykafka").mode("append")`` with the sink's defaults (plus bootstrap,
topic, codec): warm-up, then ``--runs`` paired rounds, each one pykafka write to a fresh topic,
checked as above (end offsets add up; the records read back and compared with the rows Spark
generates, recomputed here with hashlib), then one anchor invocation per JVM variant (its own
warm-up and three timed writes, the median counting, as its JIT warms over the first writes;
its topics checked by their end offsets). A change in the machine's load then hits both sides
of a round alike: the target is the median of the rounds' ratios. pykafka's session stays up,
idle, while the anchor runs; a 2,000-row write wakes its Python workers before each timed write.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from report import fmt, print_grouped_table

HERE = Path(__file__).resolve().parent

PYKAFKA = "pykafka"
CONFLUENT = "confluent-kafka"
CONFLUENT_IDEMPOTENT = "confluent-kafka idempotent"
KAFKA_PYTHON = "kafka-python"
WRITERS = (PYKAFKA, CONFLUENT, CONFLUENT_IDEMPOTENT, KAFKA_PYTHON)
WRITER_ALIASES = {"confluent-kafka-idempotent": CONFLUENT_IDEMPOTENT}
WRITE_CODECS = ("none", "lz4")
WRITE_MASTERS = ("local[2]",)
TARGET_MASTER = "local[2]"
RATIO_TARGET = 1.0            # pykafka local[2] records/s over the confluent-kafka loop's
KEY_CARDINALITY = 100_000     # distinct keys of the keyed variant
MB = 1_000_000
# The rows the JVM comparison writes: the anchor's WRITE_SOURCE (read.py), the same for both sinks.
JVM_WRITE_SOURCE = ("CAST(id % 1000 AS STRING) AS key",
                    "substr(concat(sha2(CAST(id AS STRING), 256), sha2(CAST(id * 7 AS STRING), "
                    "256)), 1, 100) AS value")
JVM_WRITE_SLICES = 2                 # spark.range(N, numPartitions=2), as the anchor
JVM_WRITE_SIZE = 100                 # bytes per generated value
JVM_VARIANTS = ("plain", "tuned")
JVM_TUNED = {"kafka.batch.size": str(256 << 10), "kafka.linger.ms": "5"}
GENERATED = f"{PYKAFKA} {TARGET_MASTER} (generated rows)"
JVM_RUNS_PER_ROUND = 3               # the anchor's timed writes per paired round (median)
JVM_RATIO_TARGET = 1.2               # issue 18: pykafka / Spark's tuned JVM sink, none and lz4


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# The payload: the same values, in the same order, for every writer
# ---------------------------------------------------------------------------------------------

def _pool(records: int, size: int) -> list[bytes]:
    from payloads import payload_pool

    return payload_pool(size, min(records, max(1, (16 << 20) // size), 16_384))


def producer_payload(records: int, size: int,
                     keyed: bool) -> tuple[list[bytes], list[bytes] | None]:
    """Values (and keys) of every record, as the client loops hand them to their producer."""
    pool = _pool(records, size)
    n = len(pool)
    values = [pool[i % n] for i in range(records)]
    keys = [b"user-%06d" % (i % KEY_CARDINALITY) for i in range(records)] if keyed else None
    return values, keys


def payload_table(records: int, size: int, keyed: bool):
    """The same records as an Arrow table (``value`` binary, and ``key`` binary when keyed)."""
    import numpy as np
    import pyarrow as pa

    pool = pa.array(_pool(records, size), pa.binary())
    values = pool.take(pa.array(np.arange(records) % len(pool)))
    columns = {"value": values}
    if keyed:
        keys = pa.array([b"user-%06d" % i for i in range(min(records, KEY_CARDINALITY))],
                        pa.binary())
        columns = {"key": keys.take(pa.array(np.arange(records) % len(keys))), **columns}
    return pa.table(columns)


# ---------------------------------------------------------------------------------------------
# Topics and the per-run check
# ---------------------------------------------------------------------------------------------

class WriteCorrectnessError(AssertionError):
    pass


def _admin(bootstrap: str):
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)


def new_topic(bootstrap: str, codec: str, writer: str, partitions: int) -> str:
    from kafka_source.testing import create_topic

    slug = "".join(c if c.isalnum() or c in "._" else "-" for c in writer.replace("[", "")
                   .replace("]", "").replace("(", "").replace(")", "")).strip("-")
    topic = f"bench-write-{codec}-{slug}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=partitions)
    return topic


def topic_facts(bootstrap: str, topic: str, partitions: int) -> dict:
    """Per-partition start and end offsets and the on-disk size of the topic's logs."""
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec

    admin = _admin(bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in tps})
        starts = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in tps})
        log_bytes = None
        try:
            dirs = admin.describe_log_dirs(topic_partitions={topic: list(range(partitions))})
            log_bytes = sum(p["partition_size"] for broker in dirs for d in broker["log_dirs"]
                            for t in d["topics"] if t["name"] == topic for p in t["partitions"])
        except Exception:  # noqa: BLE001 - informative only (an old broker, an ACL)
            pass
        return {"ends": {tp.partition: ends[tp].offset for tp in tps},
                "starts": {tp.partition: starts[tp].offset for tp in tps},
                "log_bytes": log_bytes}
    finally:
        admin.close()


def fetch_high_watermarks(bootstrap: str, topic: str, partitions: int,
                          timeout_s: float = 30) -> dict[int, int]:
    """End offsets as fetch responses report them (the high watermark), for the embedded Tansu
    broker, whose ListOffsets(latest) under-reports multi-record batches: one record is fetched
    from the start of each partition; a partition that yields none within the timeout counts
    as empty."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pykafka-bench-verify",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(seen) < partitions and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                if m.error() is None:
                    seen.add(m.partition())
                    consumer.pause([TopicPartition(topic, m.partition())])
        return {p: (consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
                    if p in seen else 0) for p in range(partitions)}
    finally:
        consumer.close()


def check_topic(bootstrap: str, topic: str, partitions: int, records: int, writer: str,
                fetch_hw: bool = False) -> dict:
    facts = topic_facts(bootstrap, topic, partitions)
    if fetch_hw:
        facts["ends"] = fetch_high_watermarks(bootstrap, topic, partitions)
    total = sum(facts["ends"].values())
    if total != records or any(facts["starts"].values()):
        raise WriteCorrectnessError(
            f"{writer} to {topic}: the topic holds {total:,} records (end offsets "
            f"{facts['ends']}, start offsets {facts['starts']}), expected exactly {records:,}")
    return facts


def fingerprint_of(values, keys) -> tuple[int, int, int]:
    """(records, value bytes, sum of CRC-32 of each record's key and value mod 2**64): equal for
    the same multiset of records, whatever their order and partitions."""
    crc = zlib.crc32
    total = nbytes = 0
    if keys is None:
        for v in values:
            nbytes += len(v)
            total += crc(v)
    else:
        for k, v in zip(keys, values):
            nbytes += len(v)
            total += crc(v, crc(k + b"\0"))
    return len(values), nbytes, total % (1 << 64)


def expected_fingerprint(cfg: "WriteConfig") -> tuple[int, int, int]:
    values, keys = producer_payload(cfg.records, cfg.size, cfg.keyed)
    return fingerprint_of(values, keys)


def read_back(bootstrap: str, topic: str, ends: dict[int, int], keyed: bool,
              timeout_s: float) -> tuple[int, int, int]:
    """Every record of the topic (offsets 0 .. end-1 of each partition), read with
    confluent-kafka's consumer; its fingerprint (:func:`fingerprint_of`). Gives up after
    ``timeout_s`` without progress."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pykafka-bench-verify",
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "queued.min.messages": 1_000_000})
    crc = zlib.crc32
    n = nbytes = total = 0
    expected = sum(ends.values())
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        last = time.monotonic()
        while n < expected and time.monotonic() - last < timeout_s:
            msgs = consumer.consume(num_messages=min(10_000, expected - n), timeout=1.0)
            if msgs:
                last = time.monotonic()
            for m in msgs:
                if m.error() is not None:
                    raise WriteCorrectnessError(f"reading {topic} back: {m.error()}")
                if m.offset() >= ends[m.partition()]:
                    continue
                v = m.value() or b""
                n += 1
                nbytes += len(v)
                total += crc(v, crc((m.key() or b"") + b"\0")) if keyed else crc(v)
    finally:
        consumer.close()
    return n, nbytes, total % (1 << 64)


def delete_topic(bootstrap: str, topic: str) -> None:
    try:
        admin = _admin(bootstrap)
        try:
            admin.delete_topics([topic], timeout_ms=30_000)
        finally:
            admin.close()
    except Exception as exc:  # noqa: BLE001 - a leftover topic is not a measurement error
        log(f"  (could not delete topic {topic}: {exc})")


# ---------------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------------

@dataclass
class WriteConfig:
    records: int = 1_000_000
    size: int = 100
    partitions: int = 4
    codecs: tuple[str, ...] = WRITE_CODECS
    writers: tuple[str, ...] = WRITERS
    masters: tuple[str, ...] = WRITE_MASTERS
    runs: int = 3
    warmups: int = 1
    tasks: int | None = None            # DataFrame partitions; None: default parallelism
    keyed: bool = False
    timeout_s: float = 300.0
    keep_topics: bool = False
    verify_content: bool = True         # read every run's records back and compare them
    expected: tuple | None = None       # fingerprint_of the payload (set by run_write_bench)
    fetch_hw: bool = False              # end offsets from fetch responses (embedded Tansu)
    options: dict = field(default_factory=dict)   # extra pykafka sink options


def run_client_writer(writer: str, bootstrap: str, topic: str, cfg: WriteConfig,
                      codec: str) -> dict:
    """One run of a plain producer loop in a fresh process; its JSON line."""
    spec = {"client": ("kafka-python-producer" if writer == KAFKA_PYTHON
                       else "confluent-kafka-producer"),
            "bootstrap": bootstrap, "topic": topic, "records": cfg.records, "size": cfg.size,
            "keyed": cfg.keyed, "codec": codec, "timeout_s": cfg.timeout_s,
            "idempotence": True if writer == CONFLUENT_IDEMPOTENT else None}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE)]
                                        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                           if p])
    proc = subprocess.run([sys.executable, str(HERE / "clients.py"), json.dumps(spec)],
                          capture_output=True, text=True, timeout=cfg.timeout_s * 2 + 120,
                          env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{writer} loop failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    out = json.loads(lines[-1])
    if out.get("undelivered") or out.get("client_errors"):
        raise WriteCorrectnessError(
            f"{writer} to {topic}: {out.get('undelivered')} undelivered, client errors "
            f"{out.get('client_errors')}")
    return out


def pykafka_settings() -> dict:
    """The sink's producer defaults, as its code says (for the report)."""
    try:
        from kafka_source.config.producer_settings import ProducerSettings

        s = ProducerSettings()
        return {"acks": "all" if s.acks == -1 else s.acks,
                "enable.idempotence": s.enable_idempotence, "linger.ms": s.linger_ms,
                "batch.size": s.batch_size, "buffer.memory": s.buffer_memory,
                "max.in.flight": s.max_in_flight}
    except Exception as exc:  # noqa: BLE001
        return {"unknown": short_error(exc)}


def cached_frame(spark, table, tasks: int | None, directory: str):
    """The payload (Arrow ``table``) as a cached DataFrame of ``tasks`` partitions of equal size,
    each a contiguous run of the records in payload order (so every writer sees the values in
    the same order); returns it and the rows of each partition.

    Each partition is a Parquet file of its own, read with ``spark.sql.files.openCostInBytes``
    set so high (for this read only) that Spark packs no two files into one partition. Not
    ``repartition(n)``: its round-robin sorts the rows by their hash first
    (``spark.sql.execution.sortBeforeRepartition``), which puts equal values side by side and
    lets a codec compress pykafka's batches far better than the client loops' (measured: lz4
    12 MB on disk against 49 MB for the same 1M records in payload order). Nor
    ``repartitionByRange``: its bounds come from a sample (measured: all rows in one of two
    partitions)."""
    import pyarrow.parquet as pq
    from pyspark.sql.functions import spark_partition_id

    n = tasks or spark.sparkContext.defaultParallelism
    records = table.num_rows
    path = os.path.join(directory, f"payload-{n}")
    if not os.path.isdir(path):
        os.makedirs(path)
        bounds = [records * i // n for i in range(n + 1)]
        for i in range(n):
            pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]),
                           os.path.join(path, f"part-{i:04d}.parquet"))
    key = "spark.sql.files.openCostInBytes"
    before = spark.conf.get(key, None)
    spark.conf.set(key, str(1 << 50))
    try:
        df = spark.read.parquet(path).cache()
        got = df.count()
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    rows = {r[0]: r[1] for r in df.groupBy(spark_partition_id()).count().collect()}
    sizes = [rows.get(i, 0) for i in range(df.rdd.getNumPartitions())]
    expected = sorted(records * (i + 1) // n - records * i // n for i in range(n))
    if got != records or sorted(sizes) != expected:
        raise RuntimeError(f"cached DataFrame: {got:,} rows in partitions of {sizes}, expected "
                           f"{records:,} in {n} partitions of {expected}")
    return df, sizes


def pykafka_write_once(df, bootstrap: str, topic: str, codec: str, options: dict) -> float:
    t0 = time.perf_counter()
    writer = (df.write.format("pykafka").mode("append")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("topic", topic)
              .option("kafka.compression.type", codec))
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save()
    return time.perf_counter() - t0


def short_error(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else repr(exc)}"[:500]


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------

@dataclass
class Series:
    """The runs of one writer on one codec."""

    writer: str
    codec: str
    times: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    log_bytes: list[int] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    error: str | None = None
    extra: dict = field(default_factory=dict)


def one_run(s: Series, bootstrap: str, cfg: WriteConfig, do_write) -> None:
    """Fresh topic, the timed write, the check; the topic is deleted afterwards."""
    topic = new_topic(bootstrap, s.codec, s.writer, cfg.partitions)
    try:
        load = os.getloadavg()[0]
        seconds, info = do_write(topic)
        facts = check_topic(bootstrap, topic, cfg.partitions, cfg.records, s.writer,
                            cfg.fetch_hw)
        s.times.append(seconds)
        s.loads.append(round(load, 2))
        if facts["log_bytes"] is not None:
            s.log_bytes.append(facts["log_bytes"])
        s.counts = facts["ends"]
        if cfg.verify_content:
            t0 = time.perf_counter()
            got = read_back(bootstrap, topic, facts["ends"], cfg.keyed, cfg.timeout_s)
            if got != cfg.expected:
                raise WriteCorrectnessError(
                    f"{s.writer} to {topic}: read back (records, value bytes, CRC sum) {got}, "
                    f"expected {cfg.expected}: the records are not the ones written")
            s.verify_s.append(round(time.perf_counter() - t0, 2))
        if info.get("settings"):
            s.settings = info["settings"]
        if info.get("peak_rss_mb") is not None:
            s.rss.append(info["peak_rss_mb"])
        log(f"  {s.writer:<28} {s.codec:<5} {cfg.records / seconds:>12,.0f} records/s "
            f"({seconds:.3f} s, load {load:.2f})")
    finally:
        if not cfg.keep_topics:
            delete_topic(bootstrap, topic)


def summarize(s: Series, cfg: WriteConfig) -> dict:
    row = {"writer": s.writer, "codec": s.codec, "records": cfg.records, "record_size": cfg.size,
           "partitions": cfg.partitions, "keyed": cfg.keyed, "settings": s.settings,
           "warmup_s": [round(t, 4) for t in s.times[:cfg.warmups]],
           "runs_s": [round(t, 4) for t in s.times[cfg.warmups:]],
           "load_1m": s.loads[cfg.warmups:], "median_s": None, "records_per_s": None,
           "mb_per_s": None, "log_bytes_median": None, "partition_counts_last_run": s.counts,
           "peak_rss_mb": round(max(s.rss), 1) if s.rss else None,
           "content_verified_runs": len(s.verify_s), "error": s.error, **s.extra}
    measured = s.times[cfg.warmups:]
    if s.error is None and len(measured) == cfg.runs:
        median = statistics.median(measured)
        row.update(median_s=round(median, 4), records_per_s=round(cfg.records / median, 1),
                   mb_per_s=round(cfg.records * cfg.size / MB / median, 2))
        if s.log_bytes:
            row["log_bytes_median"] = int(statistics.median(s.log_bytes))
    return row


def attempt(s: Series, bootstrap: str, cfg: WriteConfig, do_write, failures: list[str],
            where: str = "") -> None:
    """One run of ``s`` (:func:`one_run`) unless it failed before; a failure is recorded on
    ``s`` and in ``failures`` (``where``: e.g. the broker) and logged, and the others go on."""
    if s.error is not None:
        return
    try:
        one_run(s, bootstrap, cfg, do_write)
    except Exception as exc:  # noqa: BLE001 - record it, go on with the other writers
        s.error = short_error(exc)
        failures.append(f"write {s.writer} {s.codec}{where}: {s.error}")
        tag = "CORRECTNESS FAILURE" if isinstance(exc, WriteCorrectnessError) else "FAILED"
        log(f"{tag}: write {s.writer} {s.codec}: {s.error}\n{traceback.format_exc()}")


def pykafka_write(df, bootstrap: str, codec: str, options: dict):
    """A ``do_write`` for :func:`one_run`: ``df`` written by pykafka's sink, the executors'
    peak RSS monitored around it only (so the client loops run unobserved)."""
    from procmon import ProcessMonitor

    def do(topic):
        with ProcessMonitor(interval=0.1) as monitor:
            monitor.reset()
            seconds = pykafka_write_once(df, bootstrap, topic, codec, options)
            return seconds, {"peak_rss_mb": monitor.peaks_mb().get("executor")}
    return do


def run_write_bench(cfg: WriteConfig, bootstrap: str, start_spark) -> dict:
    """All writers on all codecs; ``start_spark(master)`` gives a SparkSession with pykafka
    registered. Returns the report section: rows, targets, failures."""
    started = time.time()
    failures: list[str] = []
    series: list[Series] = []
    clients = [w for w in cfg.writers if w != PYKAFKA]
    masters = list(cfg.masters) if PYKAFKA in cfg.writers else []
    if cfg.verify_content:
        cfg.expected = expected_fingerprint(cfg)
    tmp = tempfile.mkdtemp(prefix="pykafka-bench-write-")

    def client_write(writer: str, codec: str):
        def do(topic):
            out = run_client_writer(writer, bootstrap, topic, cfg, codec)
            return out["seconds"], out
        return do

    def client_entries(codec: str) -> list:
        out = []
        for w in clients:
            c = Series(w, codec, extra={"rss_of": "the client process (with its payload "
                                                  "of 1M values built before the clock)"})
            series.append(c)
            out.append((c, client_write(w, codec)))
        return out

    def rounds(entries) -> None:
        for i in range(cfg.warmups + cfg.runs):
            log(f"write round {i + 1}/{cfg.warmups + cfg.runs}"
                f"{' (warm-up)' if i < cfg.warmups else ''}")
            for s, do in entries:
                attempt(s, bootstrap, cfg, do, failures)

    try:
        table = payload_table(cfg.records, cfg.size, cfg.keyed) if masters else None
        clients_done: set[str] = set()     # codecs whose client loops ran
        for master in masters:
            log(f"starting Spark {master} for the write benchmark ...")
            spark = None
            try:
                spark = start_spark(master)
                df, task_rows = cached_frame(spark, table, cfg.tasks, tmp)
                tasks = len(task_rows)
                log(f"  DataFrame of {cfg.records:,} rows cached in {tasks} partition(s) of "
                    f"{', '.join(f'{n:,}' for n in task_rows)} rows")
                for codec in cfg.codecs:
                    s = Series(f"{PYKAFKA} {master}", codec, settings=pykafka_settings(),
                               extra={"tasks": tasks, "task_rows": task_rows,
                                      "options": cfg.options or None,
                                      "rss_of": "largest executor Python worker"})
                    series.append(s)
                    entries = [(s, pykafka_write(df, bootstrap, codec, cfg.options))]
                    if codec not in clients_done:   # interleaved with the first master's runs
                        entries += client_entries(codec)
                        clients_done.add(codec)
                    rounds(entries)
                df.unpersist()
            except Exception as exc:  # noqa: BLE001 - e.g. the DataFrame could not be cached
                failures.append(f"write pykafka {master}: {short_error(exc)}")
                log(f"FAILED: write pykafka {master}: {short_error(exc)}\n"
                    f"{traceback.format_exc()}")
            finally:
                if spark is not None:
                    spark.stop()
        for codec in cfg.codecs:
            if codec not in clients_done and clients:
                rounds(client_entries(codec))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows = sort_rows([summarize(s, cfg) for s in series], cfg.codecs)
    add_ratios(rows)
    return {"config": {k: v for k, v in vars(cfg).items()}, "rows": rows,
            "targets": write_targets(rows, cfg.codecs, cfg.keyed), "failures": failures,
            "duration_s": round(time.time() - started, 1)}


def sort_rows(rows: list[dict], codecs) -> list[dict]:
    order = [CONFLUENT, CONFLUENT_IDEMPOTENT, KAFKA_PYTHON] + \
        [f"{PYKAFKA} {m}" for m in ("local[1]", "local[2]")]

    def key(r):
        return (list(codecs).index(r["codec"]) if r["codec"] in codecs else 99,
                order.index(r["writer"]) if r["writer"] in order else 99, r["writer"])

    return sorted(rows, key=key)


def add_ratios(rows: list[dict]) -> None:
    for base, name in ((CONFLUENT, "ratio_vs_confluent"),
                       (CONFLUENT_IDEMPOTENT, "ratio_vs_confluent_idempotent")):
        ref = {r["codec"]: r["records_per_s"] for r in rows if r["writer"] == base}
        for r in rows:
            b, v = ref.get(r["codec"]), r["records_per_s"]
            r[name] = round(v / b, 3) if b and v is not None else None


def write_targets(rows: list[dict], codecs, keyed: bool = False) -> list[dict]:
    """The issue's target: pykafka local[2] >= 1.0x the (default) confluent-kafka loop, default
    options, per codec of none and lz4 that ran; a writer that failed fails it."""
    out = []
    for codec in WRITE_CODECS:
        if codec not in codecs:
            continue
        mine = next((r for r in rows if r["writer"] == f"{PYKAFKA} {TARGET_MASTER}"
                     and r["codec"] == codec), None)
        base = next((r for r in rows if r["writer"] == CONFLUENT and r["codec"] == codec), None)
        if mine is None or base is None:
            continue
        ratio = mine.get("ratio_vs_confluent")
        out.append({"target": f"write: pykafka {TARGET_MASTER} / confluent-kafka producer loop "
                              f"({codec}{', keyed' if keyed else ''}) >= {RATIO_TARGET:.1f}x",
                    "value": "error" if ratio is None else ratio,
                    "pass": ratio is not None and ratio >= RATIO_TARGET})
    return out


def _guarantee(r: dict) -> str:
    s = r.get("settings") or {}
    idem = s.get("enable.idempotence", s.get("enable_idempotence"))
    acks = s.get("acks")
    acks = "all" if acks in (-1, "all", "-1") or str(acks).startswith("all") else acks
    if idem is None and acks is None:
        return "?"
    return f"acks={acks}, {'idempotent' if idem else 'not idempotent'}"


def print_write_report(section: dict) -> None:
    cfg = section["config"]
    print(f"write throughput: {cfg['records']:,} records x {cfg['size']} B"
          f"{' (keyed)' if cfg['keyed'] else ' (unkeyed)'}, {cfg['partitions']} partitions, "
          f"a fresh topic per run; median of {cfg['runs']} interleaved rounds after "
          f"{cfg['warmups']} warm-up; each client's default settings except the codec; "
          "MB = 10^6 value bytes")
    header = ("codec", "writer", "guarantee", "median s", "records/s", "MB/s", "load",
              "log MB", "vs confluent", "vs conf. idem.")
    table = []
    for r in section["rows"]:
        table.append((r["codec"], r["writer"] + (f" ({r['tasks']} tasks)" if r.get("tasks")
                                                 else ""),
                       _guarantee(r), fmt(r["median_s"], ".3f"),
                       "FAILED" if r.get("error") else fmt(r["records_per_s"], ",.0f"),
                       fmt(r["mb_per_s"], ".1f"),
                       fmt(statistics.median(r["load_1m"]) if r["load_1m"] else None, ".2f"),
                       fmt(r["log_bytes_median"] / MB if r["log_bytes_median"] else None,
                            ".1f"),
                       fmt(r.get("ratio_vs_confluent"), ".2f"),
                       fmt(r.get("ratio_vs_confluent_idempotent"), ".2f")))
    print_grouped_table(header, table, left=3)
    for r in section["rows"]:
        if r.get("error"):
            print(f"  {r['writer']} {r['codec']}: {r['error']}")


# ---------------------------------------------------------------------------------------------
# Against Spark's JVM Kafka sink (issue 18): the same generated rows, the same broker, one run
# ---------------------------------------------------------------------------------------------

def generated_fingerprint(records: int) -> tuple[int, int, int]:
    """:func:`fingerprint_of` the rows ``JVM_WRITE_SOURCE`` generates for ids 0 .. records-1
    (Spark's ``sha2(s, 256)`` is the lower-case hex SHA-256 of the string's UTF-8)."""
    from hashlib import sha256

    crc = zlib.crc32
    nbytes = total = 0
    for i in range(records):
        v = (sha256(b"%d" % i).hexdigest() + sha256(b"%d" % (i * 7)).hexdigest())[
            :JVM_WRITE_SIZE].encode()
        nbytes += len(v)
        total += crc(v, crc(b"%d\0" % (i % 1000)))
    return records, nbytes, total % (1 << 64)


def generated_frame(spark, records: int):
    return spark.range(records, numPartitions=JVM_WRITE_SLICES).selectExpr(*JVM_WRITE_SOURCE)


def run_jvm_sink(anchor, bootstrap: str, cfg: WriteConfig, codec: str, variant: str,
                 master: str = TARGET_MASTER) -> dict:
    """One anchor invocation (a warm-up and ``cfg.runs`` timed writes into topics of its own,
    created here and deleted after their end offsets were checked); its JSON line plus the
    1-minute load average at its start and end."""
    import jvm_anchor
    from kafka_source.testing import create_topic

    prefix = f"bench-write-jvm-{codec}-{variant}-{uuid.uuid4().hex[:8]}"
    topics = [f"{prefix}-{i}" for i in range(cfg.runs + 1)]
    try:
        for t in topics:
            create_topic(bootstrap, t, partitions=cfg.partitions)
        load = os.getloadavg()[0]
        out = jvm_anchor.run_anchor(anchor, bootstrap=bootstrap, topic=prefix, mode="write",
                                    runs=cfg.runs, master=master, tuned=variant == "tuned",
                                    records=cfg.records, codec=codec)
        out["load_1m_start"], out["load_1m_end"] = round(load, 2), round(os.getloadavg()[0], 2)
        out["log_bytes"] = []
        for t in topics:
            facts = check_topic(bootstrap, t, cfg.partitions, cfg.records,
                                f"Spark's JVM sink ({variant})", cfg.fetch_hw)
            if facts["log_bytes"] is not None:
                out["log_bytes"].append(facts["log_bytes"])
        return out
    finally:
        if not cfg.keep_topics:
            for t in topics:
                delete_topic(bootstrap, t)


def run_jvm_compare(cfg: WriteConfig, bootstrap: str, start_spark, anchor,
                    variants=JVM_VARIANTS, broker: str = "") -> dict:
    """pykafka's sink and Spark's JVM sink (``variants`` of plain, tuned; ``anchor``: the
    anchor's path) on the same generated rows, per codec of ``cfg.codecs``, on one broker.
    Returns ``{"rows", "targets", "failures", ...}``.

    In paired rounds: after pykafka's warm-up, each round writes once with pykafka and then
    with each JVM variant (an anchor invocation: its own Spark, a warm-up write and
    :data:`JVM_RUNS_PER_ROUND` timed writes, of which the median counts), so that a change in
    the machine's load hits both sides of a round alike. The ratios are the median of the
    rounds' ratios (``paired``) and the ratio of the medians.
    pykafka's session stays up meanwhile, idle; a small write wakes its Python workers before
    each timed one (Spark ends workers idle for a minute, and an anchor invocation can take
    half of that)."""
    started = time.time()
    failures: list[str] = []
    # keyed: the read-back fingerprint covers the keys; size: the generated values' 100 bytes.
    gcfg = replace(cfg, keyed=True, size=JVM_WRITE_SIZE, warmups=max(1, cfg.warmups),
                   expected=generated_fingerprint(cfg.records) if cfg.verify_content else None)
    series = {codec: Series(GENERATED, codec, settings=pykafka_settings(),
                            extra={"tasks": JVM_WRITE_SLICES, "options": cfg.options or None,
                                   "rss_of": "largest executor Python worker"})
              for codec in cfg.codecs}
    jvm_runs = {(codec, v): [] for codec in cfg.codecs for v in variants}
    jvm_errors: dict = {}
    log(f"write vs Spark's JVM sink (Kafka {broker}): starting Spark {TARGET_MASTER} ...")
    spark = None
    wake_topic = None
    try:
        spark = start_spark(TARGET_MASTER)
        df = generated_frame(spark, cfg.records)
        wake = generated_frame(spark, 2_000)
        wake_topic = new_topic(bootstrap, "none", "wake", cfg.partitions)
        for i in range(gcfg.warmups + gcfg.runs):
            timed = i >= gcfg.warmups
            for codec, s in series.items():
                do = pykafka_write(df, bootstrap, codec, cfg.options)
                if timed:
                    pykafka_write_once(wake, bootstrap, wake_topic, codec, cfg.options or {})
                log(f"{GENERATED} {codec} run {i + 1}/{gcfg.warmups + gcfg.runs}"
                    f"{'' if timed else ' (warm-up)'}")
                attempt(s, bootstrap, gcfg, do, failures, f" (Kafka {broker})")
                if not timed:
                    continue
                for variant in variants:
                    if (codec, variant) in jvm_errors:
                        continue
                    try:
                        out = run_jvm_sink(anchor, bootstrap,
                                           replace(cfg, runs=JVM_RUNS_PER_ROUND), codec,
                                           variant)
                        jvm_runs[(codec, variant)].append(out)
                        log(f"  Spark's JVM sink ({variant}) {codec}: "
                            f"{out['records_per_s']:,.0f} records/s")
                    except Exception as exc:  # noqa: BLE001 - a JVM failure or a wrong count
                        jvm_errors[(codec, variant)] = short_error(exc)
                        failures.append(f"write: Spark's JVM sink {variant} {codec} (Kafka "
                                        f"{broker}): {short_error(exc)}")
                        log(f"FAILED: Spark's JVM sink {variant} {codec}: {short_error(exc)}")
    except Exception as exc:  # noqa: BLE001 - e.g. Spark did not start
        failures.append(f"write {GENERATED} (Kafka {broker}): {short_error(exc)}")
        log(f"FAILED: {GENERATED}: {short_error(exc)}\n{traceback.format_exc()}")
        for s in series.values():
            s.error = s.error or short_error(exc)
    finally:
        if spark is not None:
            spark.stop()
        if wake_topic is not None and not cfg.keep_topics:
            delete_topic(bootstrap, wake_topic)

    rows = []
    for codec, s in series.items():
        mine = summarize(s, gcfg)
        row = {"broker": broker, "codec": codec, "records": cfg.records,
               "partitions": cfg.partitions, "pykafka": mine}
        for variant in variants:
            key = "jvm_tuned" if variant == "tuned" else "jvm"
            outs = jvm_runs[(codec, variant)]
            if (codec, variant) in jvm_errors or not outs:
                row[key] = {"error": jvm_errors.get((codec, variant), "no run")}
                continue
            seconds = [o["seconds_median"] for o in outs]
            median = statistics.median(seconds)
            row[key] = {"runs_s": seconds, "seconds_median": median,
                        "records_per_s": round(cfg.records / median, 1),
                        "load_1m_start": min(o["load_1m_start"] for o in outs),
                        "load_1m_end": max(o["load_1m_end"] for o in outs),
                        "reader": outs[0].get("reader")}
        mine_rps = mine.get("records_per_s")
        for key in ("jvm", "jvm_tuned"):
            theirs = (row.get(key) or {}).get("records_per_s")
            row[f"ratio_vs_{key}"] = round(mine_rps / theirs, 3) if mine_rps and theirs else None
            pairs = list(zip(mine.get("runs_s") or [], (row.get(key) or {}).get("runs_s") or []))
            row[f"paired_ratios_vs_{key}"] = [round(j / p, 3) for p, j in pairs]
            row[f"paired_ratio_vs_{key}"] = (round(statistics.median(j / p for p, j in pairs), 3)
                                            if pairs and mine_rps else None)
        rows.append(row)

    targets = []
    if "tuned" in variants:
        for row in rows:
            if row["codec"] not in WRITE_CODECS:
                continue
            ratio = row["paired_ratio_vs_jvm_tuned"]
            targets.append({"target": f"write: pykafka {TARGET_MASTER} / Spark's tuned JVM sink "
                                      f"(generated rows, {row['codec']}, Kafka {broker}, median "
                                      f"of paired rounds) >= "
                                      f"{JVM_RATIO_TARGET:.1f}x",
                            "value": "error" if ratio is None else ratio,
                            "pass": ratio is not None and ratio >= JVM_RATIO_TARGET})
    return {"broker": broker, "rows": rows, "targets": targets, "failures": failures,
            "runs": cfg.runs,
            "variants": list(variants), "anchor": str(anchor),
            "source": f"spark.range(N, numPartitions={JVM_WRITE_SLICES}).selectExpr"
                      f"{JVM_WRITE_SOURCE}",
            "jvm_tuned_options": JVM_TUNED, "duration_s": round(time.time() - started, 1)}


def print_jvm_write_report(sections: list[dict], note: str | None) -> None:
    """One table for every broker: pykafka against the JVM sink on the generated rows."""
    if not sections:
        if note:
            print(f"write vs Spark's JVM Kafka sink: {note}")
        return
    table = []
    for sec in sections:
        for row in sec["rows"]:
            mine = row["pykafka"]

            def cell(d):
                if not d:
                    return "-"
                if d.get("error"):
                    return "FAILED"
                return fmt(d.get("records_per_s"), ",.0f")

            loads = list(mine.get("load_1m") or [])
            for key in ("jvm", "jvm_tuned"):
                d = row.get(key) or {}
                loads += [d[k] for k in ("load_1m_start", "load_1m_end") if k in d]
            table.append((row["broker"], row["codec"],
                          "FAILED" if mine.get("error") else fmt(mine.get("records_per_s"),
                                                                 ",.0f"),
                          cell(row.get("jvm")), cell(row.get("jvm_tuned")),
                          fmt(row.get("ratio_vs_jvm"), ".2f"),
                          fmt(row.get("ratio_vs_jvm_tuned"), ".2f"),
                          fmt(row.get("paired_ratio_vs_jvm_tuned"), ".2f"),
                          " ".join(fmt(r, ".2f") for r in
                                   row.get("paired_ratios_vs_jvm_tuned") or []) or "-",
                          f"{min(loads):.2f}-{max(loads):.2f}" if loads else "-"))
    print(f"write vs Spark's JVM Kafka sink: {sections[0]['rows'][0]['records']:,} generated rows"
          f" (spark.range(N, numPartitions=2), 1000 keys, 100-byte values) into a fresh "
          f"{sections[0]['rows'][0]['partitions']}-partition topic per run, local[2], each "
          f"sink's defaults + codec (JVM tuned: batch.size 256 KiB, linger.ms 5); records/s, "
          f"median of {sections[0]['runs']} paired rounds (each: one pykafka write, then each "
          f"JVM sink's median of {JVM_RUNS_PER_ROUND} after its warm-up) after pykafka's "
          f"warm-up; pk/JVM tuned: ratio of the medians, paired: median of the rounds' ratios "
          f"(each round's listed):")
    print_grouped_table(("broker", "codec", "pykafka", "JVM", "JVM tuned", "pk/JVM",
                         "pk/JVM tuned", "paired", "rounds", "load 1m"), table, left=2)
    for sec in sections:
        for row in sec["rows"]:
            for key in ("pykafka", "jvm", "jvm_tuned"):
                err = (row.get(key) or {}).get("error")
                if err:
                    print(f"  {key} {row['codec']} (Kafka {row['broker']}): {err}")
    if note:
        print(note)
