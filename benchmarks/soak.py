"""Soak (issue 38 item 3): a query with an exactly-once sink runs for hours through group churn,
query restarts and broker restarts, and nothing it holds may grow.

    make soak DURATION=1h                          # Kafka 4.0 (KRaft), then Kafka 2.2 (ZooKeeper)
    make soak DURATION=20m SOAK_BROKERS=2.2
    .venv/bin/python benchmarks/soak.py --broker 4.0 --duration 1h --out DIR

Starts a three-node cluster of the generation (``KAFKA_HOME``, else ``../shared/kafka`` for 4.0;
``KAFKA_ZK_HOME``, else ``../shared/kafka22`` for 2.2), every topic replicated three times with
``min.insync.replicas=2``. A kafka-python producer (idempotent, ``acks=all``) writes ``--rate``
unique values per second round-robin over ``--partitions`` partitions of the input topic, and
two pykafka queries read it, each in a consumer group of its own, each with a 1 s
processing-time trigger into ``format("pykafka")`` with ``exactlyOnce`` (Kafka transactions)
writing ``"<partition>:<offset>:<value>"`` to an output topic of its own:

* **steady** runs throughout. Kafka's own Java consumer (``kafka-console-consumer.sh`` of the
  same distribution) joins its group and leaves it again: the group rebalances twice. The Java
  consumer commits nothing (``enable.auto.commit=false``, as a consumer that only watches), so
  the partitions come back to the query at the query's own last commit and it reads what the
  Java consumer read again.
* **restarted** is stopped and started again from its checkpoint.

Every ``--every`` seconds (default 60) the next of three events happens in turn, so that each
comes every ``3 * --every`` seconds: the Java consumer joins the steady group (and leaves
``--every / 2`` seconds later), the restarted query is restarted, a broker is restarted (nodes
1, 2, 3 in turn, controlled shutdowns and SIGKILLs alternating; the next event waits until the
node is back in every ISR). Every ``--sample`` seconds (default 60) one row of figures is kept:

* the driver JVM's old generation and metaspace in use (``jstat -gc``: its RSS grows with the
  heap up to its maximum, leak or not);
* memory (PSS and RSS, MB), open file descriptors and threads, summed per kind of process: the
  Spark driver JVM; the driver-side Python processes that hold the stream readers (Spark's
  streaming source runner, one per query: the group members); the driver-side planners Spark's
  daemon forks (``pyspark.sql.worker.*``); the executors' Python workers;
* connections from those processes to each broker (ESTABLISHED sockets in ``/proc/net/tcp``
  whose owner is one of them);
* producer ids: how many different ones have written batches to the output topics so far
  (read from the batches themselves: Kafka keeps state per producer id and partition for
  ``transactional.id.expiration.ms``, 7 days, so ids that grow with time are a leak on the
  brokers);
* each group's lag (end offsets minus committed offsets over the input topic) and the records
  produced so far.

At the end the producer stops, both queries catch up to the input's end offsets, and the
output topics are read with ``read_committed``: every input record must be in each query's
output exactly once (what the Java consumer read too is counted as re-read across members: the
group's guarantee between members is at-least-once, ``docs/groups.md``). For each figure the slope after ``--warmup`` (least squares, per hour) is
reported. Output in ``--out`` (default ``benchmarks/results/soak-<broker>-<time>/``):
``samples.csv``, ``summary.json`` and ``soak.png`` (one panel per figure, the events marked).
Exit status 1 when a record was lost or written twice, or a query failed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(1, str(HERE))

from procmon import _read, descendants, status_values  # noqa: E402  (benchmarks/ on the path)
from queryproc import spark_session  # noqa: E402

BROKERS = {"4.0": ("kraft", "KAFKA_HOME", REPO_ROOT.parent / "shared" / "kafka"),
           "2.2": ("zookeeper", "KAFKA_ZK_HOME", REPO_ROOT.parent / "shared" / "kafka22")}
EVENTS = ("java-consumer", "query-restart", "broker-restart")
#: The processes whose figures are sampled, by what :func:`process_kind` calls them.
KINDS = ("driver-jvm", "source-runner", "planner", "executor")
#: Spark's own start-up failing on a loaded machine (its Python process is given 10 s to connect
#: back to the JVM), before the connector runs: such a start is tried again, at most 3 times.
SPARK_START_FAILURE = "Python worker failed to connect back"
FIGURES = ("pss_mb", "rss_mb", "fds", "threads")


def log(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)


def parse_duration(text: str) -> float:
    """Seconds from ``3600``, ``90s``, ``20m``, ``1h`` or ``1h30m``."""
    text = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise argparse.ArgumentTypeError(
            f"duration {text!r}: give seconds (3600) or a number with h, m or s (1h, 20m, 1h30m)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[unit] for n, unit in parts)


# --------------------------------------------------------------------------------------------
# What the processes hold, from /proc
# --------------------------------------------------------------------------------------------

def process_kind(cmdline: bytes) -> str | None:
    """Which of :data:`KINDS` a process below this one is, by its command line; None for the
    others (brokers, ZooKeeper, the Java consumer, tools)."""
    argv = cmdline.split(b"\0")
    if any(b"python_streaming_source_runner" in a for a in argv):
        return "source-runner"
    if b"pyspark.daemon" in argv or b"pyspark.worker" in argv:
        # the daemon's driver-side workers ("pyspark.sql.worker.plan_data_source_read" and
        # the like) plan batches; the others read and write
        return "planner" if any(a.startswith(b"pyspark.sql.worker.") for a in argv) else "executor"
    if argv and os.path.basename(argv[0]) == b"java" and any(
            b"org.apache.spark.deploy.SparkSubmit" in a for a in argv):
        return "driver-jvm"
    return None


def process_figures(pid: int) -> dict | None:
    """{pss_mb, rss_mb, fds, threads, sockets (inodes)} of ``pid``; None when it is gone.

    PSS (proportional set size, ``/proc/PID/smaps_rollup``) shares each page among the
    processes that map it, so the PSS of a kind's processes adds up to what they hold together;
    their RSS counts a page as often as processes map it, which for the workers Spark's daemon
    forks (sharing the daemon's pages copy-on-write) is several times as much."""
    status = status_values(pid, "VmRSS", "Threads")
    if status is None:
        return None
    rss_kb, threads = status["VmRSS"], status["Threads"]
    pss_kb = rss_kb
    for line in (_read(f"/proc/{pid}/smaps_rollup") or b"").splitlines():
        if line.startswith(b"Pss:"):
            pss_kb = int(line.split()[1])
            break
    sockets = set()
    fds = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            fds += 1
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                sockets.add(int(target[8:-1]))
    except OSError:
        return None
    return {"pss_mb": pss_kb / 1024.0, "rss_mb": rss_kb / 1024.0, "fds": fds, "threads": threads, "sockets": sockets}


def established_to(ports: set[int], tables=("/proc/net/tcp", "/proc/net/tcp6")) -> dict[int, int]:
    """{socket inode: remote port} of the ESTABLISHED TCP connections to one of ``ports``."""
    out = {}
    for table in tables:
        text = _read(table)
        if not text:
            continue
        for line in text.decode().splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "01":          # 01: ESTABLISHED
                continue
            port = int(fields[2].rsplit(":", 1)[1], 16)
            if port in ports:
                out[int(fields[9])] = port
    return out


def jvm_heap(pid: int) -> dict:
    """The driver JVM's old generation and metaspace in use (MB), from ``jstat -gc``: its RSS
    grows until the heap reaches its maximum whether or not anything leaks; what survives
    into the old generation, sampled over hours, is what tells. {} when jstat cannot say."""
    import shutil
    import subprocess

    jstat = shutil.which("jstat") or os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "jstat")
    try:
        return parse_jstat_gc(subprocess.run([jstat, "-gc", str(pid)], capture_output=True,
                                             text=True, timeout=30).stdout)
    except (OSError, subprocess.SubprocessError):
        return {}


def parse_jstat_gc(text: str) -> dict:
    """``jstat -gc``'s header and row -> old generation (OU) and metaspace (MU) in use, MB."""
    lines = text.split("\n")
    try:
        fields = dict(zip(lines[0].split(), lines[1].split()))
        return {"driver-jvm_old_mb": round(float(fields["OU"]) / 1024, 1),
                "driver-jvm_metaspace_mb": round(float(fields["MU"]) / 1024, 1)}
    except (IndexError, KeyError, ValueError):
        return {}


def sample_processes(broker_ports: dict[int, int], root: int | None = None) -> dict:
    """Per kind (:data:`KINDS`): summed RSS, fds, threads and the count of processes; and the
    connections of all of them to each broker (``conn_<node>``), keyed by node id."""
    totals = {kind: {"pss_mb": 0.0, "rss_mb": 0.0, "fds": 0, "threads": 0, "processes": 0}
              for kind in KINDS}
    sockets: set[int] = set()
    heap: dict = {}
    for pid in sorted(descendants(root or os.getpid())):
        kind = process_kind(_read(f"/proc/{pid}/cmdline") or b"")
        if kind is None:
            continue
        if kind == "driver-jvm":
            heap = jvm_heap(pid)
        figures = process_figures(pid)
        if figures is None:
            continue
        for key in FIGURES:
            totals[kind][key] += figures[key]
        totals[kind]["processes"] += 1
        sockets |= figures["sockets"]
    remote = established_to(set(broker_ports))
    node_of_port = {port: node for port, node in broker_ports.items()}
    connections = Counter(node_of_port[remote[inode]] for inode in sockets if inode in remote)
    row = {f"{kind}_{key}": (round(v, 1) if isinstance(v, float) else v)
           for kind, figs in totals.items() for key, v in figs.items()}
    row.update(heap)
    row.update({f"conn_{node}": connections.get(node, 0) for node in sorted(broker_ports.values())})
    return row


# --------------------------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------------------------

def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per hour; None for fewer than 3."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if sxx == 0:
        return None
    return sum((t - mx) * (v - my) for t, v in points) / sxx * 3600.0


def slopes(samples: list[dict], warmup_s: float, keys: list[str]) -> dict[str, dict]:
    """For each key: its slope per hour after ``warmup_s``, the mean there, and the slope as a
    share of the mean (``pct_per_hour``)."""
    out = {}
    for key in keys:
        points = [(s["t_s"], float(s[key])) for s in samples
                  if s["t_s"] >= warmup_s and s.get(key) not in (None, "")]
        slope = slope_per_hour(points)
        mean = sum(v for _, v in points) / len(points) if points else None
        pct = (100.0 * slope / mean) if slope is not None and mean else None
        out[key] = {"slope_per_hour": None if slope is None else round(slope, 3),
                    "mean": None if mean is None else round(mean, 2),
                    "pct_per_hour": None if pct is None else round(pct, 2),
                    "points": len(points)}
    return out


def parse_output(values) -> Counter:
    """``"<partition>:<offset>:<value>"`` strings -> Counter of (partition, offset, value)."""
    out = Counter()
    for text in values:
        partition, offset, value = text.split(":", 2)
        out[(int(partition), int(offset), value)] += 1
    return out


def check_output(truth: dict, written: Counter, also_read: dict | None = None) -> dict:
    """``written`` (Counter of (partition, offset, value)) against ``truth``
    {(partition, offset): value}: each record must be there exactly once, with its value.
    ``also_read``: {(partition, offset): count} that another member of the group read (the Java
    consumer, which never commits): those records must be in ``written`` all the same, and are
    counted as re-read across members. Returns counts and a few examples of each problem."""
    got: Counter = Counter()
    wrong = []
    for (p, o, v), n in written.items():
        if truth.get((p, o)) != v:
            wrong.append((p, o, v))
        else:
            got[(p, o)] += n
    also_read = also_read or {}
    lost = [k for k in truth if k not in got]
    twice = [k for k, n in got.items() if n > 1]
    reread = [k for k in got if k in also_read]
    return {"records": len(truth), "written": sum(got.values()), "lost": len(lost),
            "duplicated": sum(got[k] - 1 for k in twice), "wrong": len(wrong),
            "read_by_other_member": len(also_read), "reread_across_members": len(reread),
            "examples": {"lost": sorted(lost)[:5], "duplicated": sorted(twice)[:5],
                         "wrong": sorted(wrong)[:5]}}


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------

class ProducerIds:
    """The producer ids of the record batches written to some topics, read incrementally (each
    call fetches only what was written since the last one)."""

    def __init__(self, bootstrap: str, topics: dict[str, int]):
        from kafka_source.config.client_config import client_config_from_options

        self.config = client_config_from_options({"kafka.bootstrap.servers": bootstrap})
        self.positions = {(t, p): 0 for t, n in topics.items() for p in range(n)}
        self.ids: set[int] = set()
        self.batches = 0

    def update(self) -> int:
        from kafka.protocol.consumer import FetchRequest
        from kafka.record.memory_records import MemoryRecords

        from kafka_source.wire.net.client import BrokerClient

        FT = FetchRequest.FetchTopic
        with BrokerClient(self.config) as client:
            leaders = client.leaders(list(self.positions))
            for tp, position in self.positions.items():
                while True:
                    request = FetchRequest(
                        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=8 << 20,
                        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
                        forgotten_topics_data=[], topics=[FT(topic=tp[0], partitions=[
                            FT.FetchPartition(partition=tp[1], current_leader_epoch=-1,
                                              fetch_offset=position, last_fetched_epoch=-1,
                                              log_start_offset=-1, partition_max_bytes=8 << 20)])],
                        max_version=12)
                    answer = client.send(leaders[tp], request).responses[0].partitions[0]
                    records = MemoryRecords(bytes(answer.records))
                    moved = False
                    while records.has_next():
                        batch = records.next_batch()
                        if batch is None:
                            break
                        self.ids.add(batch.producer_id)
                        self.batches += 1
                        position = batch.next_offset
                        moved = True
                    self.positions[tp] = position
                    if not moved or position >= answer.high_watermark:
                        break
        return len(self.ids)


def group_lag(bootstrap: str, group: str, topic: str) -> tuple[int | None, dict[int, int]]:
    """The group's lag over ``topic`` and the topic's end offsets, as the brokers report them
    (:func:`kafka_source.describe_group`, what ``kafka-consumer-groups.sh --describe`` shows)."""
    from kafka_source import describe_group

    status = describe_group(bootstrap, group, [topic])
    ends = {p.partition: p.end for p in status.partitions if p.topic == topic}
    return status.total_lag, ends


class SoakQuery:
    """``readStream.format("pykafka")`` in ``group`` -> ``"<partition>:<offset>:<value>"``
    -> ``writeStream.format("pykafka")`` with ``exactlyOnce`` into ``out``, checkpointed."""

    def __init__(self, spark, bootstrap: str, topic: str, group: str, out: str, checkpoint: str,
                 max_per_trigger: int):
        self.spark, self.bootstrap, self.topic, self.group = spark, bootstrap, topic, group
        self.out, self.checkpoint, self.max_per_trigger = out, checkpoint, max_per_trigger
        self.query = None
        self.starts = 0
        self.spark_start_retries = 0

    def start(self) -> None:
        rows = (self.spark.readStream.format("pykafka")
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("subscribe", self.topic).option("kafka.group.id", self.group)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(self.max_per_trigger))
                .load()
                .selectExpr("CONCAT(CAST(partition AS STRING), ':', CAST(offset AS STRING), ':', "
                            "CAST(value AS STRING)) AS value"))
        self.query = (rows.writeStream.format("pykafka")
                      .option("kafka.bootstrap.servers", self.bootstrap)
                      .option("topic", self.out).option("exactlyOnce", "true")
                      .option("checkpointLocation", self.checkpoint)
                      .queryName(self.group).trigger(processingTime="1 second").start())
        self.starts += 1

    def failure(self) -> str | None:
        if self.query is None:
            return None
        exc = self.query.exception()
        return None if exc is None else str(exc)[:3000]

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()

    def end_offsets(self) -> dict[int, int]:
        from kafka_source.testing.progress import source_offsets

        progress = self.query.lastProgress if self.query is not None else None
        if not progress or not progress.get("sources"):
            return {}
        end = source_offsets(progress["sources"][0].get("endOffset"))
        return {int(p): int(o) for p, o in end.get(self.topic, {}).items()}


def read_committed(bootstrap: str, topic: str, partitions: int) -> list[str]:
    """Every committed value of ``topic`` (``read_committed``), up to its last stable offsets."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             isolation_level="read_committed", request_timeout_ms=30_000)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)      # the last stable offsets, under read_committed
        values = []
        deadline = time.monotonic() + 300
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not read {topic} to {ends} in 300 s")
            for batch in consumer.poll(timeout_ms=500).values():
                values.extend(m.value.decode() for m in batch)
        return values
    finally:
        consumer.close()


def plot(samples: list[dict], events: list[dict], path: str, title: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot")
        return False
    minutes = [s["t_s"] / 60 for s in samples]
    conn_keys = sorted(k for k in samples[0] if k.startswith("conn_"))
    panels = [("memory, PSS (MB); driver JVM's old generation in use",
               [(k, f"{k}_pss_mb") for k in KINDS] + [("driver-jvm old gen", "driver-jvm_old_mb")]),
              ("open file descriptors", [(k, f"{k}_fds") for k in KINDS]),
              ("threads", [(k, f"{k}_threads") for k in KINDS]),
              ("connections to each broker", [(f"node {k[5:]}", k) for k in conn_keys]),
              ("producer ids written (output topics)", [("distinct ids", "producer_ids")]),
              ("group lag (records)", [("steady", "lag_steady"), ("restarted", "lag_restarted")])]
    fig, axes = plt.subplots(3, 2, figsize=(12, 10), sharex=True)
    colours = {"java-consumer": "tab:green", "query-restart": "tab:orange",
               "broker-restart": "tab:red"}
    for ax, (name, series) in zip(axes.flat, panels):
        for label, key in series:
            ax.plot(minutes, [s.get(key) if s.get(key) not in ("", None) else float("nan")
                              for s in samples], label=label, linewidth=1.2)
        for event in events:
            ax.axvline(event["t_s"] / 60, color=colours[event["kind"]], alpha=0.25, linewidth=0.8)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel("minutes (vertical lines: green Java consumer joins, orange query "
                      "restart, red broker restart)", fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def run(args) -> int:
    from kafka_source.testing.cluster import KafkaCluster

    mode, variable, default = BROKERS[args.broker]
    home = os.environ.get(variable, "").strip() or str(default)
    if not os.path.isdir(home):
        log(f"no Kafka {args.broker} distribution: set {variable} (or put it at {default})")
        return 2
    # the Java consumer is the distribution's own console consumer
    os.environ["KAFKA_HOME"] = home
    from tests.cluster.scenario import Feed
    from tests.integration.java_consumer import JavaConsumer

    out_dir = Path(args.out or REPO_ROOT / "benchmarks" / "results" /
                   f"soak-{args.broker}-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="pykafka-soak-")
    log(f"Kafka {args.broker} ({mode}, {home}), {args.duration:.0f} s, events every "
        f"{args.every:.0f} s, samples every {args.sample:.0f} s -> {out_dir}")
    started = time.monotonic()
    cluster = KafkaCluster(home, mode, nodes=3)
    java = None
    spark = None
    status = 1
    try:
        bootstrap = cluster.bootstrap_servers
        broker_ports = {int(n.address.rsplit(":", 1)[1]): node
                        for node, n in cluster.nodes.items()}
        log(f"cluster up in {time.monotonic() - started:.0f} s: {bootstrap}")
        topic, outs = "soak-in", {"steady": "soak-out-steady", "restarted": "soak-out-restarted"}
        cluster.create_topic(topic, partitions=args.partitions)
        for out in outs.values():
            cluster.create_topic(out, partitions=args.partitions)
        spark, _ = spark_session("pykafka-soak", progress_kept=20)
        per_trigger = max(100, args.rate * 4)
        queries = {name: SoakQuery(spark, bootstrap, topic, f"soak-{name}", out,
                                   os.path.join(work, f"checkpoint-{name}"), per_trigger)
                   for name, out in outs.items()}
        feed = Feed(bootstrap, topic, args.partitions, per_tick=max(1, round(args.rate / 10)),
                    tick_s=0.1, prefix="s")
        feed.start()
        for query in queries.values():
            query.start()
        pids = ProducerIds(bootstrap, {out: args.partitions for out in outs.values()})
        samples: list[dict] = []
        events: list[dict] = []
        java_runs: list[list[str]] = []
        java_until = None
        next_event = args.every
        next_sample = 0.0
        event_no = 0
        restarts = {"hard": 0, "controlled": 0}
        t0 = time.monotonic()
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        failure = None
        while not stop.is_set() and failure is None:
            now = time.monotonic() - t0
            for name, query in queries.items():
                failed = query.failure()
                if failed and SPARK_START_FAILURE in failed and query.spark_start_retries < 3:
                    # Spark's own start-up on a loaded machine, before the connector runs
                    # (tests/cluster/scenario.py's Stream does the same)
                    log(f"query {name}: {SPARK_START_FAILURE}: started again")
                    query.spark_start_retries += 1
                    query.start()
                elif failed:
                    failure = f"query {name} failed after {now:.0f} s: {failed}"
            if failure is not None:
                break
            if java is not None and now >= java_until:
                java_runs.append(java.values())
                java.close()
                java = None
                events.append({"t_s": round(now, 1), "kind": "java-consumer", "what": "left"})
                log(f"Java consumer left the steady group ({len(java_runs[-1])} records read)")
            if now >= next_sample:
                row = {"t_s": round(now, 1), "produced": feed.sent,
                       "load1": round(os.getloadavg()[0], 2)}
                row.update(sample_processes(broker_ports))
                try:
                    row["producer_ids"] = pids.update()
                except Exception as exc:  # noqa: BLE001 - a leader moving: counted next time
                    log(f"producer ids: {exc!r}")
                    row["producer_ids"] = None
                for name, query in queries.items():
                    try:
                        row[f"lag_{name}"] = group_lag(bootstrap, query.group, topic)[0]
                    except Exception as exc:  # noqa: BLE001 - a broker restarting: no lag
                        log(f"lag of {query.group}: {exc!r}")
                        row[f"lag_{name}"] = None
                samples.append(row)
                log("sample " + ", ".join(f"{k}={v}" for k, v in row.items()
                                          if k.endswith(("pss_mb", "lag_steady", "lag_restarted",
                                                         "producer_ids", "fds"))))
                next_sample += args.sample
            if now >= args.duration:
                break
            if now >= next_event:
                kind = EVENTS[event_no % len(EVENTS)]
                event_no += 1
                if kind == "java-consumer":
                    # it never commits: what it read, the query reads again when the
                    # partitions come back (Kafka's console consumer commits on close the
                    # position after the records it fetched, printed or not, so its output
                    # would not say which records it took from the query)
                    java = JavaConsumer(bootstrap, topic, "soak-steady",
                                        client_id=f"soak-java-{event_no}",
                                        session_timeout_ms=10_000,
                                        **{"enable.auto.commit": "false"})
                    java_until = time.monotonic() - t0 + args.every / 2
                    what = "joined"
                elif kind == "query-restart":
                    query = queries["restarted"]
                    query.stop()
                    time.sleep(2)
                    query.start()
                    what = f"start {query.starts}"
                else:
                    node = (restarts["hard"] + restarts["controlled"]) % 3 + 1
                    hard = (restarts["hard"] + restarts["controlled"]) % 2 == 1
                    restarts["hard" if hard else "controlled"] += 1
                    cluster.restart(node, hard=hard)
                    what = f"node {node} {'SIGKILL' if hard else 'controlled'}"
                events.append({"t_s": round(now, 1), "kind": kind, "what": what})
                log(f"event {event_no}: {kind} ({what})")
                # the next one a whole interval after this one ended (a broker restart takes
                # 10-40 s), so that the query has time between two events
                next_event = time.monotonic() - t0 + args.every
            time.sleep(1.0)
        # -- the end: stop producing, let both queries catch up, check every record ---------
        if java is not None:
            java_runs.append(java.values())
            java.close()
            java = None
        feed.stop()
        results, unacked_lost = {}, None
        if failure is None:
            try:
                results, unacked_lost = finish(bootstrap, topic, outs, queries, feed, java_runs,
                                               args.partitions)
            except Exception as exc:  # noqa: BLE001 - reported with the figures sampled
                failure = f"{type(exc).__name__}: {exc}"[:3000]
        warmup = args.warmup if args.warmup is not None else min(600.0, args.duration / 4)
        keys = [k for k in samples[0] if k not in ("t_s", "produced", "load1")] if samples else []
        summary = {
            "broker": args.broker, "mode": mode, "distribution": home,
            "machine": f"{socket.gethostname()}, {os.cpu_count()} cores",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "duration_s": round(time.monotonic() - t0), "rate": args.rate,
            "partitions": args.partitions, "every_s": args.every,
            "events": Counter(e["kind"] for e in events if e.get("what") != "left"),
            "broker_restarts": restarts, "java_consumer_runs": len(java_runs),
            "restarted_query_starts": queries["restarted"].starts,
            "spark_start_retries": {n: q.spark_start_retries for n, q in queries.items()},
            "produced": feed.sent, "acknowledged": len(feed.acked),
            "producer_failures": len(feed.failed), "acknowledged_but_missing": unacked_lost,
            "failure": failure, "results": results, "warmup_s": warmup,
            "load1_mean": round(sum(s["load1"] for s in samples) / len(samples), 2)
            if samples else None,
            "slopes": slopes(samples, warmup, keys)}
        with open(out_dir / "samples.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(samples[0]) if samples else ["t_s"])
            writer.writeheader()
            writer.writerows(samples)
        with open(out_dir / "events.json", "w") as f:
            json.dump(events, f, indent=1)
        with open(out_dir / "summary.json", "w") as f:
            json.dump(summary, f, indent=1, default=str)
        plot(samples, events, str(out_dir / "soak.png"),
             f"pykafka soak, Kafka {args.broker} ({mode}), 3 nodes, {args.rate} records/s, "
             f"{summary['duration_s'] / 60:.0f} min")
        report(summary)
        clean = (failure is None and unacked_lost == 0 and not feed.failed and all(
            r["lost"] == 0 and r["duplicated"] == 0 and r["wrong"] == 0
            for r in results.values()))
        status = 0 if clean else 1
    finally:
        if java is not None:
            java.close()
        if spark is not None:
            for q in spark.streams.active:
                try:
                    q.stop()
                except Exception:  # noqa: BLE001
                    pass
            spark.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return status


def finish(bootstrap: str, topic: str, outs: dict, queries: dict, feed, java_runs: list,
           partitions: int) -> tuple[dict, int]:
    """Wait until both queries have read to the input's end offsets, stop them and check their
    outputs record by record (:func:`check_output`); also the producer's acknowledged records
    against the input topic. Raises when a query failed or did not get there in 10 min."""
    from tests.cluster.scenario import read_topic

    ends = group_lag(bootstrap, queries["steady"].group, topic)[1]
    log(f"produced {feed.sent}, acknowledged {len(feed.acked)}; waiting for the queries to "
        f"reach {ends}")
    deadline = time.monotonic() + 600
    for name, query in queries.items():
        while True:
            failed = query.failure()
            if failed:
                raise RuntimeError(f"query {name} failed: {failed}")
            done = query.end_offsets()
            if all(done.get(p, 0) >= o for p, o in ends.items()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"query {name} did not reach {ends} in 600 s (at {done})")
            time.sleep(1)
    for query in queries.values():
        query.stop()
    truth = read_topic(bootstrap, topic, partitions, ends, timeout_s=600)
    by_value = {v: k for k, v in truth.items()}
    java_read: Counter = Counter()
    for values in java_runs:
        java_read.update(by_value[v] for v in values if v in by_value)
    results = {
        "steady": check_output(truth, parse_output(
            read_committed(bootstrap, outs["steady"], partitions)), java_read),
        "restarted": check_output(truth, parse_output(
            read_committed(bootstrap, outs["restarted"], partitions)))}
    return results, len(feed.acked - set(truth.values()))


def report(summary: dict) -> None:
    if summary["failure"]:
        log(f"FAILED: {summary['failure']}")
    log(f"Kafka {summary['broker']}: {summary['duration_s']} s, events {dict(summary['events'])}, "
        f"broker restarts {summary['broker_restarts']}; produced {summary['produced']}, "
        f"acknowledged {summary['acknowledged']}, acknowledged but missing "
        f"{summary['acknowledged_but_missing']}")
    for name, r in summary["results"].items():
        log(f"  {name:9}: records {r['records']}, lost {r['lost']}, duplicated {r['duplicated']}, "
            f"wrong {r['wrong']}; read by the Java consumer {r['read_by_other_member']}, re-read "
            f"across members {r['reread_across_members']}")
    log(f"  slopes after {summary['warmup_s']:.0f} s (per hour; % of the mean per hour):")
    for key, s in summary["slopes"].items():
        log(f"    {key:28} {s['slope_per_hour']!s:>10}  ({s['pct_per_hour']!s} %, mean {s['mean']})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=sorted(BROKERS), default="4.0")
    parser.add_argument("--duration", type=parse_duration, default=3600.0,
                        help="how long the traffic and the events run (3600, 20m, 1h)")
    parser.add_argument("--every", type=parse_duration, default=60.0,
                        help="seconds between events (each kind comes every 3 of these)")
    parser.add_argument("--sample", type=parse_duration, default=60.0)
    parser.add_argument("--warmup", type=parse_duration, default=None,
                        help="samples before this are left out of the slopes "
                             "(default: a quarter of the duration, at most 10 min)")
    parser.add_argument("--rate", type=int, default=200, help="records produced per second")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.every < 20:
        parser.error("--every: at least 20 s (a broker restart takes 10-30 s)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
