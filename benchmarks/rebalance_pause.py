"""How long a running query stops reading when a Java consumer joins and leaves its group, with
eager (``range``) and cooperative (``cooperative-sticky``) rebalancing (issue 19).

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/rebalance_pause.py
    ... --assignors range,cooperative-sticky --runs 2 --json /tmp/pause.json

Per run, on one Kafka 4.0 broker (``KAFKA_HOME`` or ``../shared/kafka``), ``local[2]``:

1. A topic of 4 partitions; a producer thread writes one record to each partition every 50 ms
   (values ``p{partition}-{n}``) for the whole run.
2. A pykafka query (``processingTime`` 200 ms, parquet sink, the assignor under test) joins the
   group alone and reads all four partitions.
3. Kafka's Java console consumer joins with the same assignor (Java's class for it); the group
   settles on two partitions each. Later it stops (commits and leaves) and the query takes all
   four back.
4. From the query's progress reports (the end offset of every partition after every micro-batch)
   and a watcher that reads the group's committed offsets every 100 ms:

   * **pause of kept partitions**: around the join, the longest time a partition the query
     kept through the rebalance went without its end offset moving (records arrive every 50
     ms, so a steady query moves it every trigger);
   * **longest gap between micro-batches** around the join and around the leave;
   * **records checked, lost, read twice by the query, read by both members** (a handover
     between the two members is at-least-once on the Java side: its auto-commit runs every
     200 ms), and **committed offsets that moved backwards** (must be 0).

The figures are measurements, printed as a table; the script fails only when a record is lost,
the query reads one twice, or a committed offset moves backwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(REPO_ROOT))

PARTITIONS = 4
PRODUCE_EVERY_S = 0.05
TRIGGER = "200 milliseconds"
SESSION_MS, HEARTBEAT_MS = 6_000, 1_000


def _progress_points(query):
    """[(epoch seconds at the batch's end, {partition: end offset})] of every micro-batch."""
    from datetime import datetime

    points = []
    for p in query.recentProgress:
        if not p.get("sources"):
            continue
        end = p["sources"][0].get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        offsets = {int(k): int(v) for t in (end or {}).values() for k, v in t.items()}
        ts = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        took = p.get("durationMs", {}).get("triggerExecution", 0) / 1000
        points.append((ts + took, offsets))
    return points


def _stall(points, partitions, start, end):
    """The longest time in [start, end] that any of ``partitions`` went without its end offset
    moving, from the batches' end times."""
    worst = 0.0
    for part in partitions:
        last_move, last = start, None
        for ts, offsets in points:
            if part not in offsets:
                continue
            if last is not None and offsets[part] > last:
                if ts >= start:
                    worst = max(worst, min(ts, end) - max(last_move, start))
                last_move = ts
            last = offsets[part]
        if last_move < end:
            worst = max(worst, end - max(last_move, start))
    return worst


def _gap(points, start, end):
    """The longest time between two micro-batches' ends within [start, end]."""
    times = [start] + [ts for ts, _ in points if start <= ts <= end] + [end]
    return max(b - a for a, b in zip(times, times[1:]))


class _Producer(threading.Thread):
    def __init__(self, bootstrap, topic):
        super().__init__(daemon=True)
        from kafka import KafkaProducer

        self.topic = topic
        self.sent = {p: 0 for p in range(PARTITIONS)}
        self.stop_event = threading.Event()
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)

    def run(self):
        while not self.stop_event.is_set():
            for p in range(PARTITIONS):
                n = self.sent[p]
                self.producer.send(self.topic, key=f"k{p}".encode(), value=f"p{p}-{n}".encode(),
                                   partition=p)
                self.sent[p] = n + 1
            self.producer.flush(30)
            time.sleep(PRODUCE_EVERY_S)

    def stop(self):
        self.stop_event.set()
        self.join(30)
        self.producer.close(10)


def _group_state(bootstrap, group):
    from kafka_source.group.assignors import Assignment
    from kafka_source.wire.net.client import BrokerClient, RetriableBrokerError
    from kafka.protocol.admin import DescribeGroupsRequest

    try:
        with BrokerClient({"bootstrap_servers": bootstrap}) as client:
            node = client.find_coordinator(group)
            response = client.send(node, DescribeGroupsRequest(
                groups=[group], include_authorized_operations=False))
    except RetriableBrokerError:
        return "", {}
    g = response.groups[0]
    return g.group_state, {m.member_id: sorted(p for _, p in Assignment.decode(
        bytes(m.member_assignment or b"")).partitions) for m in g.members}


def _wait(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")


def one_run(spark, bootstrap, assignor, settle_s):
    from kafka_source.testing import create_topic, unique_topic_name
    from tests.cluster.scenario import CommitWatch
    from tests.integration.java_consumer import JavaConsumer

    topic = unique_topic_name(f"pause-{assignor}")
    group = unique_topic_name("g-pause")
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    work = tempfile.mkdtemp(prefix="pykafka-pause-")
    out = os.path.join(work, "out")
    producer = _Producer(bootstrap, topic)
    watcher = CommitWatch(bootstrap, group, topic, interval_s=0.1)
    producer.start()
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "kafka.group.id": group,
               "assignor": assignor, "startingOffsets": "earliest",
               "kafka.session.timeout.ms": str(SESSION_MS),
               "kafka.heartbeat.interval.ms": str(HEARTBEAT_MS),
               "kafka.max.poll.interval.ms": str(4 * SESSION_MS)}
    reader = spark.readStream.format("pykafka")
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (reader.load().selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
             .writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", os.path.join(work, "ck"))
             .trigger(processingTime=TRIGGER).start())
    java = None
    try:
        _wait(lambda: (lambda s, m: s == "Stable" and len(m) == 1
                       and next(iter(m.values())) == list(range(PARTITIONS)))(
            *_group_state(bootstrap, group)), 90, "the query alone with all four partitions")
        watcher.start()
        time.sleep(settle_s)
        t_join = time.time()
        java = JavaConsumer(bootstrap, topic, group, assignors=[assignor],
                            session_timeout_ms=SESSION_MS)
        _, members = _wait(lambda: (lambda s, m: (s, m) if s == "Stable" and len(m) == 2 and
                                    sorted(len(v) for v in m.values()) == [2, 2] else None)(
            *_group_state(bootstrap, group)), 120, "two members with two partitions each")
        t_split = time.time()
        kept = next(v for k, v in members.items() if not k.startswith("java-consumer"))
        time.sleep(settle_s)
        t_leave = time.time()
        java.process.terminate()          # as Ctrl-C: it commits and leaves the group
        java.process.wait(30)
        java_values = list(java.values())   # everything it printed, now that it has stopped
        java.close()
        java = None
        _wait(lambda: (lambda s, m: s == "Stable" and len(m) == 1
                       and next(iter(m.values())) == list(range(PARTITIONS)))(
            *_group_state(bootstrap, group)), 120, "the query alone again with all four")
        t_back = time.time()
        time.sleep(settle_s)
        producer.stop()
        sent = dict(producer.sent)
        total = sum(sent.values())

        def read_by_query():
            try:
                return [r.value for r in spark.read.parquet(out).select("value").collect()]
            except Exception:  # noqa: BLE001 - nothing written yet
                return []

        query_values = _wait(lambda: (lambda v: v if len(set(v) | set(java_values)) >= total
                                      else None)(read_by_query()), 120,
                             f"all {total} records read by the two members")
        points = _progress_points(query)
    finally:
        if java is not None:
            java.close()
        producer.stop_event.set()
        query.stop()
        watcher.stop()
    expected = {f"p{p}-{n}" for p, c in sent.items() for n in range(c)}
    got = set(query_values) | set(java_values)
    return {
        "assignor": assignor,
        "records": total,
        "lost": len(expected - got),
        "read_twice_by_query": len(query_values) - len(set(query_values)),
        "read_by_both": len(set(query_values) & set(java_values)),
        "committed_backwards": len(watcher.backwards),
        "commit_reads": watcher.polls,
        "kept_partitions": kept,
        "join_to_split_s": round(t_split - t_join, 2),
        "kept_pause_at_join_s": round(_stall(points, kept, t_join, t_split + 1.0), 2),
        "batch_gap_at_join_s": round(_gap(points, t_join, t_split + 1.0), 2),
        "batch_gap_at_leave_s": round(_gap(points, t_leave, t_back + 1.0), 2),
        "batch_gap_steady_s": round(_gap(points, t_back + 1.0, t_back + settle_s), 2),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assignors", default="range,cooperative-sticky")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between the phases")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p]))
    shared = REPO_ROOT.parent / "shared" / "kafka"
    if not os.environ.get("KAFKA_HOME") and (shared / "bin").is_dir():
        os.environ["KAFKA_HOME"] = str(shared)
    from pyspark.sql import SparkSession

    import kafka_source
    from kafka_source.testing import LocalKafkaBroker

    results = []
    with LocalKafkaBroker(os.environ["KAFKA_HOME"]) as broker:
        spark = (SparkSession.builder.master("local[2]").appName("pykafka-rebalance-pause")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        kafka_source.register(spark)
        try:
            for run in range(args.runs):
                for assignor in args.assignors.split(","):
                    r = one_run(spark, broker.bootstrap_servers, assignor, args.settle)
                    r["run"] = run + 1
                    print(json.dumps(r), flush=True)
                    results.append(r)
        finally:
            spark.stop()
    cols = ["records", "lost", "read_twice_by_query", "read_by_both", "committed_backwards",
            "join_to_split_s", "kept_pause_at_join_s", "batch_gap_at_join_s",
            "batch_gap_at_leave_s", "batch_gap_steady_s"]
    print("\n| assignor | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for assignor in args.assignors.split(","):
        rows = [r for r in results if r["assignor"] == assignor]
        cells = []
        for c in cols:
            values = [r[c] for r in rows]
            if c.endswith("_s"):
                cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
            else:
                cells.append(str(sum(values)))
        print(f"| {assignor} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    bad = [r for r in results if r["lost"] or r["read_twice_by_query"] or r["committed_backwards"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
