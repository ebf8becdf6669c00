"""Cost as partitions grow (issue 38 item 1): a trickle stream over 100 to 10,000 partitions.

    make bench-scale                                   # Kafka 4.0; 100, 1000, 10000 partitions
    .venv/bin/python benchmarks/scale.py --partitions 100,1000 --pattern-topics 0 --triggers 10

Starts a Kafka 4.0 broker (``KAFKA_HOME``, else ``../shared/kafka``; or ``KAFKA_BOOTSTRAP_SERVERS``),
creates one topic per partition count (and, with ``--pattern-topics N``, N topics of
``--pattern-partitions`` (4) partitions read through ``subscribePattern``), and keeps a trickle
of ``--rate`` records/s going to every partition in turn. For each point, each reader runs the
same query in a fresh process: a stream
from ``latest`` with a ``processingTime`` trigger of ``--trigger`` into the ``noop`` sink, for
``--warmup`` triggers not counted and then ``--triggers`` measured (``--timeout`` at most):

* ``pykafka``: ``readStream.format("pykafka")`` (it joins a consumer group and commits every
  micro-batch's end offsets), in this venv's PySpark;
* ``floor`` (not run unless asked for): the same query on ``floor_source.py``, a Python source
  with no Kafka whose partitions start empty and get ``--rate`` records/s in turn, as the
  trickle's do, planned by pykafka's planner: what PySpark alone costs at that partition count
  (single-topic points only);
* ``jvm``: Spark's own ``format("kafka")`` (spark-sql-kafka-0-10 4.0.0 on PySpark 4.0.0, the venv
  and jars of ``../shared/anchors/spark-jvm-kafka``), which neither joins a group nor commits.

With ``--rounds N`` every point and reader runs N times, the order of points and readers
reversed every other round, and each reader's growth (the median trigger at the most
partitions over the one at the fewest, from the same round) is reported per round and as the
median over rounds.

Per point and reader it reports, from Spark's progress reports of the measured triggers, the
median and p95 of the trigger's steps (``triggerExecution``; ``latestOffset``; ``walCommit``,
which on Spark 4 includes the source's ``commit()`` of the batch before; ``queryPlanning``;
``addBatch``, where the tasks run), the tasks per trigger, the driver JVM's peak RSS and, for
pykafka, the peak RSS of the driver-side Python process that holds the stream reader (its group
member and planning). The JoinGroup and SyncGroup exchange is the size of pykafka's consumer
protocol Subscription and Assignment for the point, encoded as the group sends them (the JVM
source has none). Results are printed as a table and written as JSON (``--json``); ``--plot``
writes a PNG of the trigger time against the partition count when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE))

from queryproc import (default_kafka_home, drop_missing_jvm, interpreter,  # noqa: E402
                       spark_session)

STEPS = ("triggerExecution", "latestOffset", "walCommit", "queryPlanning", "addBatch",
         "commitOffsets")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# The query, in its own process (``scale.py query ...``), for either reader
# ---------------------------------------------------------------------------------------------

def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _children(root: int) -> list[int]:
    from procmon import descendants
    return sorted(descendants(root))


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class _Sampler(threading.Thread):
    """Peak RSS of the driver JVM and of the stream reader's Python process, every 0.5 s."""

    def __init__(self):
        super().__init__(daemon=True)
        self.jvm = 0.0
        self.reader = 0.0
        self.stop_flag = threading.Event()

    def run(self):
        while not self.stop_flag.wait(0.5):
            for pid in _children(os.getpid()):
                cmd = _cmdline(pid)
                rss = _rss_mb(pid) or 0.0
                if "java" in cmd.split(" ", 1)[0]:
                    self.jvm = max(self.jvm, rss)
                elif "python_streaming_source_runner" in cmd or "streaming" in cmd and "python" in cmd:
                    self.reader = max(self.reader, rss)


def _progress_count(query) -> int:
    """How many progress reports the query has, asked of the JVM without fetching them.

    ``query.recentProgress`` has the JVM write every report as JSON and this process parse it;
    each report carries the start, end and latest offsets of every partition, about 1 MB over
    10,000 topics. Polled every 0.5 s, that took a core of this 2-core machine away from the
    query being measured. The reports themselves are fetched once, after the last trigger."""
    try:
        return len(query._jsq.recentProgress())
    except Exception:                     # not py4j (Spark Connect): the public way
        return len(query.recentProgress)


def query_main(args) -> None:
    floor = args.reader == "floor"
    spark, fmt = spark_session("pykafka-scale", master=args.master,
                               reader="pykafka" if floor else args.reader)
    extra = {"groupIdPrefix": "scale"} if fmt == "pykafka" else {"kafka.retry.backoff.ms": "1"}
    source = {"subscribePattern": args.pattern} if args.pattern else {"subscribe": args.topic}
    if floor:
        # The same query on a Python source with no Kafka whose partitions grow as the
        # trickle's do (floor_source.py): what PySpark itself costs at this partition count.
        import floor_source

        spark.dataSource.register(floor_source.FloorDataSource)
        fmt, extra = floor_source.FLOOR_NAME, {}
        source = {"topic": args.topic, "valueSize": "100", "rate": str(args.rate),
                  "counts": json.dumps({str(p): 0 for p in range(args.count)})}
    sampler = _Sampler()
    sampler.start()
    checkpoint = tempfile.mkdtemp(prefix="pykafka-scale-")
    t0 = time.perf_counter()
    bootstrap = {} if floor else {"kafka.bootstrap.servers": args.bootstrap}
    query = (spark.readStream.format(fmt).options(**bootstrap, **source)
             .option("startingOffsets", "latest").options(**extra).load()
             .selectExpr("length(value) AS n").writeStream.format("noop")
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=f"{args.trigger} seconds").start())
    started = None
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if query.exception() is not None:
            break
        reports = _progress_count(query)
        if reports and started is None:
            started = time.perf_counter() - t0
        if reports >= args.warmup + args.triggers:
            break
        time.sleep(0.5)
    progress = query.recentProgress
    run_id = str(query.runId)
    error = None if query.exception() is None else str(query.exception())[:2000]
    query.stop()
    sampler.stop_flag.set()
    tracker = spark.sparkContext.statusTracker()
    tasks = []
    for job in tracker.getJobIdsForGroup(run_id):
        info = tracker.getJobInfo(job)
        for stage in (info.stageIds if info else ()):
            s = tracker.getStageInfo(stage)
            if s is not None:
                tasks.append(s.numTasks)
    spark.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)     # one per query: do not leave them in /tmp
    first_ts = progress[0]["timestamp"] if progress else None
    print(json.dumps({"reader": args.reader, "progress": [
        {"batchId": p["batchId"], "timestamp": p["timestamp"], "rows": p["numInputRows"],
         "durationMs": p["durationMs"]} for p in progress],
        "first_timestamp": first_ts, "startup_s": started, "tasks": tasks,
        "jvm_rss_mb": round(sampler.jvm, 1), "reader_rss_mb": round(sampler.reader, 1),
        "error": error}))


# ---------------------------------------------------------------------------------------------
# The driver of the benchmark
# ---------------------------------------------------------------------------------------------

class Trickle(threading.Thread):
    """``rate`` records/s of 100 bytes to every partition of ``targets`` in turn."""

    def __init__(self, bootstrap: str, rate: int):
        super().__init__(daemon=True)
        from confluent_kafka import Producer
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.rate = rate
        self.targets: list[tuple[str, int]] = []
        self.stop_flag = threading.Event()
        self.sent = 0

    def run(self):
        i, tick = 0, 0.05
        per_tick = max(1, round(self.rate * tick))
        next_at = time.monotonic()
        while not self.stop_flag.is_set():
            targets = self.targets
            if targets:
                for _ in range(per_tick):
                    topic, p = targets[i % len(targets)]
                    self.producer.produce(topic, b"x" * 100, partition=p)
                    i += 1
                    self.sent += 1
            self.producer.poll(0)
            next_at += tick
            time.sleep(max(0.0, next_at - time.monotonic()))
        self.producer.flush(10)


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from confluent_kafka.admin import NewPartitions

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=30).topics)
    # A KRaft controller refuses a request that makes more than 10,000 records ("excessively
    # large batch operation"): a topic's partitions beyond 5,000 are added 5,000 at a time.
    step = 5000
    new = [NewTopic(t, min(n, step), 1) for t, n in topics.items() if t not in existing]
    for start in range(0, len(new), 200):
        futures = admin.create_topics(new[start:start + 200], operation_timeout=120)
        for f in futures.values():
            f.result()
    for t, n in topics.items():
        have = step
        while t not in existing and have < n:
            have = min(n, have + step)
            admin.create_partitions([NewPartitions(t, have)], operation_timeout=120)[t].result()
    # Every partition must have a leader before the readers look.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=30).topics
        if all(t in md and len(md[t].partitions) == n and all(
                p.leader >= 0 for p in md[t].partitions.values()) for t, n in topics.items()):
            return
        time.sleep(1)
    raise RuntimeError("topics did not get their leaders in 300 s")


def exchange_bytes(topics: dict[str, int]) -> dict:
    """pykafka's consumer protocol Subscription and (one member) Assignment for these topics."""
    from kafka_source.group.assignors import Assignment, Subscription

    sub = Subscription(sorted(topics)).encode()
    assignment = Assignment([(t, p) for t, n in sorted(topics.items())
                             for p in range(n)]).encode()
    return {"subscription_bytes": len(sub), "assignment_bytes": len(assignment)}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summarize(out: dict, warmup: int) -> dict:
    progress = out.get("progress") or []
    if not progress:
        return {"triggers": 0, "error": out.get("error")}
    measured = progress[warmup:] or progress[-1:]
    row = {"triggers": len(measured), "rows_median": statistics.median(p["rows"] for p in measured),
           "startup_s": out.get("startup_s"), "first_trigger": progress[0]["durationMs"],
           "tasks_median": statistics.median(out["tasks"]) if out.get("tasks") else None,
           "jvm_rss_mb": out.get("jvm_rss_mb"), "reader_rss_mb": out.get("reader_rss_mb"),
           "error": out.get("error")}
    for step in STEPS:
        values = [p["durationMs"].get(step, 0) for p in measured]
        row[f"{step}_p50"] = statistics.median(values)
        row[f"{step}_p95"] = pct(values, 0.95)
    return row


def run_query(reader: str, bootstrap: str, what: dict, args) -> dict:
    # Spark's JVM source runs a task per partition with new records, so its triggers grow with
    # the partitions: it gets fewer triggers (the first one is counted) and its own bound.
    jvm = reader == "jvm"
    timeout = args.jvm_timeout if jvm else args.timeout
    cmd = ["query", "--reader", reader, "--bootstrap", bootstrap,
           "--triggers", str(args.jvm_triggers if jvm else args.triggers),
           "--warmup", str(0 if jvm else args.warmup), "--trigger", str(args.trigger),
           "--timeout", str(timeout)]
    cmd += ["--pattern", what["pattern"]] if what.get("pattern") else ["--topic", what["topic"]]
    cmd += ["--count", str(what["partitions"]), "--rate", str(args.rate)]
    python, env = interpreter("jvm" if jvm else "pykafka")
    proc = subprocess.run([python, str(Path(__file__).resolve()), *cmd], capture_output=True,
                          text=True, env=env, timeout=timeout + 300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
    return json.loads(lines[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", default="100,1000,10000",
                    help="partition counts of the single-topic points (default 100,1000,10000)")
    ap.add_argument("--pattern-topics", type=int, default=1000,
                    help="topics read by subscribePattern (default 1000; 0: none)")
    ap.add_argument("--pattern-partitions", type=int, default=4,
                    help="partitions of each of those topics (default 4)")
    ap.add_argument("--readers", default="pykafka,jvm")
    ap.add_argument("--rate", type=int, default=200, help="records/s of the trickle (default 200)")
    ap.add_argument("--trigger", type=float, default=1.0, help="processingTime seconds (default 1)")
    ap.add_argument("--triggers", type=int, default=20, help="measured triggers per query")
    ap.add_argument("--warmup", type=int, default=3, help="first triggers, not counted")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per query at most")
    ap.add_argument("--jvm-triggers", type=int, default=4,
                    help="triggers of Spark's JVM source, the first counted (default 4)")
    ap.add_argument("--jvm-timeout", type=float, default=300.0,
                    help="seconds per JVM query at most (default 300): its trigger grows with "
                         "the partitions that got records (a task each)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every point and reader this many times, alternating their order "
                         "(default 1): the growth of the trigger is reported per round and as "
                         "the median over rounds")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--plot", help="write a PNG of the trigger time against partitions here")
    args = ap.parse_args(argv)
    readers = [r for r in args.readers.split(",") if r]
    readers = drop_missing_jvm(readers, log)

    from kafka_source.testing.brokers import LocalKafkaBroker

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        log("starting Kafka 4.0 ...")
        default_kafka_home()
        broker = LocalKafkaBroker(properties={"num.partitions": "1",
                                              "group.initial.rebalance.delay.ms": "0"})
        bootstrap = broker.bootstrap_servers
    points = [{"name": f"1 topic, {n} partitions", "partitions": n, "topic": f"scale-{n}",
               "topics": {f"scale-{n}": n}} for n in
              (int(x) for x in args.partitions.split(",") if x.strip())]
    if args.pattern_topics:
        t, per = args.pattern_topics, args.pattern_partitions
        prefix = f"scalep{t}" if per == 4 else f"scalep{t}x{per}"
        points.append({"name": f"subscribePattern, {t} topics x {per} partitions",
                       "partitions": per * t, "pattern": rf"{prefix}-\d+",
                       "topics": {f"{prefix}-{i:05d}": per for i in range(t)}})
    trickle = Trickle(bootstrap, args.rate)
    trickle.start()
    rows = []
    try:
        for point in points:
            log(f"{point['name']}: creating topics ...")
            t = time.perf_counter()
            create_topics(bootstrap, point["topics"])
            log(f"  ready in {time.perf_counter() - t:.1f} s")
            point["sizes"] = exchange_bytes(point["topics"])
        for round_no in range(1, args.rounds + 1):
            # Later rounds alternate the order of points and readers, so that neither the
            # machine's drift nor the previous query's leftovers favour one side.
            turn = -1 if round_no % 2 == 0 else 1
            for point in points[::turn]:
                trickle.targets = [(topic, p) for topic, n in sorted(point["topics"].items())
                                   for p in range(n)]
                for reader in readers[::turn]:
                    if reader == "floor" and point.get("pattern"):
                        log(f"{point['name']}: the floor reads one topic only: skipped")
                        continue
                    log(f"{point['name']}: {reader} (round {round_no} of {args.rounds}) ...")
                    out = run_query(reader, bootstrap, point, args)
                    row = {"point": point["name"], "partitions": point["partitions"],
                           "reader": reader, "round": round_no,
                           **summarize(out, 0 if reader == "jvm" else args.warmup)}
                    if reader == "pykafka":
                        row.update(point["sizes"])
                    rows.append(row)
                    log("  " + json.dumps({k: v for k, v in row.items() if k not in ("point",)}))
    finally:
        trickle.stop_flag.set()
        trickle.join(15)
        if broker is not None:
            broker.stop()
    print_table(rows)
    growth = growth_by_round(rows)
    print_growth(growth)
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": os.uname().nodename,
              "cpus": os.cpu_count(), "rate": args.rate, "trigger_s": args.trigger,
              "triggers": args.triggers, "rounds": args.rounds, "growth": growth, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(rows, args.plot)
    return 1 if any(r.get("error") for r in rows) else 0


def growth_by_round(rows: list[dict]) -> dict:
    """Per reader: the median trigger of the largest single-topic point over that of the
    smallest, in each round (both measured in the same round), and their median. On a small
    machine the smallest point's trigger moves by tens of ms between runs, more than some
    readers' growth: one round is a direction, several a figure."""
    single = [r for r in rows if r.get("triggers") and "topic," in r["point"]]
    out: dict[str, dict] = {}
    for reader in dict.fromkeys(r["reader"] for r in single):
        ratios = []
        for round_no in sorted({r["round"] for r in single if r["reader"] == reader}):
            mine = [r for r in single if r["reader"] == reader and r["round"] == round_no]
            if len({r["partitions"] for r in mine}) < 2:
                continue
            low = min(mine, key=lambda r: r["partitions"])
            high = max(mine, key=lambda r: r["partitions"])
            ratios.append(round(high["triggerExecution_p50"] / low["triggerExecution_p50"], 3))
        if ratios:
            out[reader] = {"ratios": ratios, "median": statistics.median(ratios)}
    return out


def print_growth(growth: dict) -> None:
    for reader, g in growth.items():
        print(f"{reader}: trigger at the most partitions / at the fewest, per round "
              f"{', '.join(f'{x:.2f}' for x in g['ratios'])}; median {g['median']:.2f}")


def print_table(rows: list[dict]) -> None:
    head = ("point", "reader", "round", "triggers", "p50 ms", "p95 ms", "latestOffset", "walCommit",
            "planning", "addBatch", "tasks", "JVM MB", "reader MB", "sub/asg B")
    print("  ".join(head))
    for r in rows:
        if not r.get("triggers"):
            print(f"{r['point']}  {r['reader']}  "
                  + (f"ERROR {r['error'][:300]}" if r.get("error") else
                     "no trigger finished within its --timeout / --jvm-timeout"))
            continue
        print("  ".join(str(x) for x in (
            r["point"], r["reader"], r.get("round", 1), r["triggers"], r["triggerExecution_p50"],
            r["triggerExecution_p95"], r["latestOffset_p50"], r["walCommit_p50"],
            r["queryPlanning_p50"], r["addBatch_p50"], r["tasks_median"], r["jvm_rss_mb"],
            r["reader_rss_mb"] or "-",
            f"{r.get('subscription_bytes', '-')}/{r.get('assignment_bytes', '-')}")))


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for reader in sorted({r["reader"] for r in rows}):
        pts = sorted((r["partitions"], r["triggerExecution_p50"]) for r in rows
                     if r["reader"] == reader and r.get("triggers") and "pattern" not in r["point"]
                     and "subscribePattern" not in r["point"])
        if pts:
            ax.plot(*zip(*pts), marker="o", label=reader)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("partitions")
    ax.set_ylabel("median trigger (ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "query":
        qp = argparse.ArgumentParser()
        qp.add_argument("--reader", required=True)
        qp.add_argument("--bootstrap", required=True)
        qp.add_argument("--topic")
        qp.add_argument("--pattern")
        qp.add_argument("--count", type=int, default=0)       # the topic's partitions (floor)
        qp.add_argument("--rate", type=float, default=200)    # records/s arriving (floor)
        qp.add_argument("--triggers", type=int, default=20)
        qp.add_argument("--warmup", type=int, default=3)
        qp.add_argument("--trigger", type=float, default=1)
        qp.add_argument("--timeout", type=float, default=600)
        qp.add_argument("--master", default="local[2]")
        query_main(qp.parse_args(sys.argv[2:]))
    else:
        sys.exit(main())
