"""End-to-end latency (issue 38 item 2): from a record's produce time to its arrival in the
output topic, for a Kafka-to-Kafka stream through pykafka and through Spark's JVM source and sink.

    make bench-latency                                    # Kafka 4.0; 1,000 and 10,000 records/s
    .venv/bin/python benchmarks/latency.py --rates 1000 --triggers 0 --seconds 20

Starts a Kafka 4.0 broker (``KAFKA_HOME``, else ``../shared/kafka``; or
``KAFKA_BOOTSTRAP_SERVERS``). For every rate (``--rates``), trigger (``--triggers``: the
``processingTime`` interval in ms, 0 as fast as Spark goes) and reader, a fresh input topic and
a fresh output topic (``message.timestamp.type=LogAppendTime``: the broker stamps each record
when it arrives), both of ``--partitions`` partitions. The same query then runs in a process of
its own, from ``latest``, passing ``value`` through:

* ``pykafka``: ``readStream.format("pykafka")`` -> ``writeStream.format("pykafka")`` in this
  venv's PySpark (it joins a consumer group and commits each micro-batch);
* ``jvm``: Spark's ``format("kafka")`` both ways (spark-sql-kafka-0-10 4.0.0 on PySpark 4.0.0,
  the venv and jars of ``../shared/anchors/spark-jvm-kafka``).

Once the query has completed a trigger, a confluent-kafka producer (``linger.ms`` 1) writes the
rate for ``--warmup`` + ``--seconds`` seconds, each value starting with its send time in
microseconds; a consumer reads the output topic as it fills. A record's latency is its
LogAppendTime in the output topic minus its send time; records sent during the warm-up are not
counted. Reported per point: p50, p99, p99.9 and max latency, records counted and missing, and
from Spark's progress reports the median trigger and its steps (``latestOffset``,
``queryPlanning``, ``walCommit``, ``addBatch`` -- where the tasks read and write --,
``commitOffsets``) with the rows per trigger: where a record waits; and each step's 95th
percentile, where the tail comes from. ``--rounds N`` measures every point N times, the readers'
order reversed every other round, and adds each reader's medians over the rounds and the ratios
of the first reader to the others per round. ``--json`` writes it all.
"""

from __future__ import annotations

import argparse
import json
import os
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

STEPS = ("triggerExecution", "latestOffset", "queryPlanning", "walCommit", "addBatch",
         "commitOffsets")
VALUE_BYTES = 100


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by the nearest rank of the sorted values; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


def encode_value(sent_us: int, seq: int) -> bytes:
    head = f"{sent_us:016d}:{seq:010d}:".encode()
    return head + b"x" * (VALUE_BYTES - len(head))


def decode_value(value: bytes) -> tuple[int, int]:
    """(send time in microseconds, sequence number) of a value :func:`encode_value` made."""
    sent, seq, _ = value.split(b":", 2)
    return int(sent), int(seq)


def latencies(arrivals: list[tuple[int, bytes]], counted_from_us: int) -> dict:
    """``arrivals`` ((LogAppendTime in ms, value), ...) -> latency figures in ms of the records
    sent at or after ``counted_from_us``, and how often a sequence number came twice."""
    seen: dict[int, int] = {}
    lat = []
    for appended_ms, value in arrivals:
        sent_us, seq = decode_value(value)
        seen[seq] = seen.get(seq, 0) + 1
        if sent_us >= counted_from_us and seen[seq] == 1:
            lat.append(appended_ms - sent_us / 1000.0)
    return {"records": len(lat), "duplicates": sum(n - 1 for n in seen.values()),
            "p50_ms": percentile(lat, 0.50), "p99_ms": percentile(lat, 0.99),
            "p999_ms": percentile(lat, 0.999), "max_ms": max(lat) if lat else None,
            "mean_ms": statistics.fmean(lat) if lat else None}


# ---------------------------------------------------------------------------------------------
# The query, in its own process (``latency.py query ...``), for either reader
# ---------------------------------------------------------------------------------------------

def query_main(args) -> None:
    spark, fmt = spark_session("pykafka-latency", reader=args.reader)
    checkpoint = tempfile.mkdtemp(prefix="pykafka-latency-")
    query = (spark.readStream.format(fmt).option("kafka.bootstrap.servers", args.bootstrap)
             .option("subscribe", args.topic).option("startingOffsets", "latest").load()
             .select("value").writeStream.format(fmt)
             .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.out)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=f"{args.trigger_ms} milliseconds").start())
    deadline = time.monotonic() + 180
    while not query.recentProgress and query.exception() is None \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    print("READY" if query.exception() is None and query.recentProgress else "FAILED",
          flush=True)
    sys.stdin.readline()                 # the benchmark says when: a line, or its end
    progress = query.recentProgress
    error = None if query.exception() is None else str(query.exception())[:2000]
    query.stop()
    spark.stop()
    import shutil
    shutil.rmtree(checkpoint, ignore_errors=True)
    print(json.dumps({"progress": [{"rows": p["numInputRows"], "durationMs": p["durationMs"]}
                                   for p in progress], "error": error}), flush=True)


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------

def start_query(reader: str, bootstrap: str, topic: str, out: str, trigger_ms: int):
    cmd = ["query", "--reader", reader, "--bootstrap", bootstrap, "--topic", topic,
           "--out", out, "--trigger-ms", str(trigger_ms)]
    python, env = interpreter(reader)
    return subprocess.Popen([python, str(Path(__file__).resolve()), *cmd], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


class OutputReader(threading.Thread):
    """Reads ``topic`` from its start as it fills: (LogAppendTime ms, value) of each record."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        super().__init__(daemon=True)
        from confluent_kafka import Consumer, TopicPartition

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{topic}",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.arrivals: list[tuple[int, bytes]] = []
        self.stop_flag = threading.Event()

    def run(self):
        while not self.stop_flag.is_set():
            for msg in self.consumer.consume(10_000, timeout=0.1):
                if msg.error() is None:
                    self.arrivals.append((msg.timestamp()[1], msg.value()))
        self.consumer.close()


def produce(bootstrap: str, topic: str, rate: int, seconds: float) -> tuple[int, int]:
    """``rate`` records/s for ``seconds``, round-robin over the partitions the producer picks;
    returns (records sent, the send time in microseconds of the first one)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all"})
    tick = 0.01
    per_tick = rate * tick
    sent, owed = 0, 0.0
    start = time.monotonic()
    first_us = None
    while time.monotonic() - start < seconds:
        owed += per_tick
        while owed >= 1:
            now_us = time.time_ns() // 1000
            first_us = first_us or now_us
            producer.produce(topic, encode_value(now_us, sent))
            sent += 1
            owed -= 1
        producer.poll(0)
        time.sleep(max(0.0, start + (sent / rate) - time.monotonic()))
    producer.flush(30)
    return sent, first_us or 0


def run_point(reader: str, bootstrap: str, rate: int, trigger_ms: int, args, n: int) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, out = f"lat-in-{n}", f"lat-out-{n}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([
            NewTopic(topic, args.partitions, 1),
            NewTopic(out, args.partitions, 1,
                     config={"message.timestamp.type": "LogAppendTime"})]).values():
        f.result()
    row = {"reader": reader, "rate": rate, "trigger_ms": trigger_ms}
    proc = start_query(reader, bootstrap, topic, out, trigger_ms)
    try:
        ready = proc.stdout.readline().strip()
        if ready != "READY":
            row["error"] = f"the query did not start ({ready or 'no answer'})"
            return row
        output = OutputReader(bootstrap, out, args.partitions)
        output.start()
        sent, first_us = produce(bootstrap, topic, rate, args.warmup + args.seconds)
        deadline = time.monotonic() + 120
        while len(output.arrivals) < sent and time.monotonic() < deadline:
            time.sleep(0.2)
        output.stop_flag.set()
        output.join(10)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        tail = [ln for ln in proc.communicate(timeout=120)[0].splitlines() if ln.startswith("{")]
        result = json.loads(tail[-1]) if tail else {"progress": [], "error": "no report"}
    finally:
        if proc.poll() is None:
            proc.kill()
    figures = latencies(output.arrivals, first_us + int(args.warmup * 1_000_000))
    row.update(figures, sent=sent, arrived=len(output.arrivals),
               missing=sent - len({decode_value(v)[1] for _, v in output.arrivals}),
               error=result.get("error"))
    row.update(step_figures(result["progress"]))
    return row


def step_figures(progress: list[dict]) -> dict:
    """From the query's progress reports ({"rows", "durationMs"}), over the triggers that read
    rows: their count, the median rows, and each step's median (``<step>_ms``) and 95th
    percentile (``<step>_p95_ms``, nearest rank): a latency's tail follows the long triggers."""
    triggers = [p for p in progress if p["rows"] > 0]
    out: dict = {"triggers": len(triggers)}
    if triggers:
        out["rows_per_trigger"] = statistics.median(p["rows"] for p in triggers)
        for step in STEPS:
            values = [p["durationMs"].get(step, 0) for p in triggers]
            out[f"{step}_ms"] = statistics.median(values)
            out[f"{step}_p95_ms"] = percentile(values, 0.95)
    return out


def print_table(rows: list[dict]) -> None:
    head = ("rate", "trigger", "reader", "round", "p50", "p99", "p99.9", "max", "records",
            "missing", "dup", "trigger ms", "latestOffset", "planning", "walCommit", "addBatch",
            "commit", "rows/trigger", "trigger p95", "addBatch p95")
    print(" | ".join(head))
    for r in rows:
        if r.get("error") and not r.get("records"):
            print(f"{r['rate']} | {r['trigger_ms']} | {r['reader']} | {r.get('round', 1)} | "
                  f"ERROR {r['error'][:300]}")
            continue
        cells = [r["rate"], r["trigger_ms"], r["reader"], r.get("round", 1)]
        cells += [None if r.get(k) is None else round(r[k]) for k in
                  ("p50_ms", "p99_ms", "p999_ms", "max_ms")]
        cells += [r.get("records"), r.get("missing"), r.get("duplicates")]
        cells += [r.get(f"{s}_ms") for s in STEPS] + [r.get("rows_per_trigger")]
        cells += [r.get("triggerExecution_p95_ms"), r.get("addBatch_p95_ms")]
        print(" | ".join(str(c) for c in cells))


QUANTILES = ("p50_ms", "p99_ms", "p999_ms")


def over_rounds(rows: list[dict]) -> list[dict]:
    """Per point (rate, trigger): each reader's median p50, p99 and p99.9 over its rounds, and
    for the first reader against each other, the ratio of each quantile in every round (both
    measured in that round) with the median of those ratios. A p99 over 60,000 records moves by
    10% between runs of the same reader on a small machine: one round is a direction."""
    out = []
    points = dict.fromkeys((r["rate"], r["trigger_ms"]) for r in rows)
    for rate, trigger_ms in points:
        mine = [r for r in rows if (r["rate"], r["trigger_ms"]) == (rate, trigger_ms)
                and r.get("records") and r.get(QUANTILES[0]) is not None]
        readers = list(dict.fromkeys(r["reader"] for r in mine))
        point = {"rate": rate, "trigger_ms": trigger_ms, "readers": {}, "paired": {}}
        for reader in readers:
            theirs = [r for r in mine if r["reader"] == reader]
            point["readers"][reader] = {"rounds": len(theirs), **{
                q: statistics.median(r[q] for r in theirs) for q in QUANTILES}}
        for other in readers[1:]:
            by_round = {r.get("round", 1): r for r in mine if r["reader"] == other}
            pairs = [(r, by_round[r.get("round", 1)]) for r in mine
                     if r["reader"] == readers[0] and r.get("round", 1) in by_round]
            if not pairs:
                continue
            point["paired"][f"{readers[0]}/{other}"] = {q: {
                "ratios": [round(a[q] / b[q], 3) for a, b in pairs],
                "median": round(statistics.median(a[q] / b[q] for a, b in pairs), 3)}
                for q in QUANTILES}
        out.append(point)
    return out


def print_over_rounds(summary: list[dict]) -> None:
    for point in summary:
        head = f"{point['rate']} records/s, trigger {point['trigger_ms']} ms"
        for reader, f in point["readers"].items():
            print(f"{head}: {reader} over {f['rounds']} rounds, median p50 {f['p50_ms']:.0f}, "
                  f"p99 {f['p99_ms']:.0f}, p99.9 {f['p999_ms']:.0f} ms")
        for pair, ratios in point["paired"].items():
            print(f"{head}: {pair} per round " + "; ".join(
                f"{q[:-3]} {', '.join(f'{x:.2f}' for x in r['ratios'])} (median "
                f"{r['median']:.2f})" for q, r in ratios.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1000,10000", help="records/s (default 1000,10000)")
    ap.add_argument("--triggers", default="0,100",
                    help="processingTime intervals in ms (default 0,100)")
    ap.add_argument("--readers", default="pykafka,jvm")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds not counted, first")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds per point, the readers' order reversed every other round; "
                         "each reader's median p50/p99/p99.9 over the rounds and the paired "
                         "ratios (default 1)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be 1 or more, not {args.rounds}")
    readers = [r for r in args.readers.split(",") if r]
    readers = drop_missing_jvm(readers, log)

    from kafka_source.testing.brokers import LocalKafkaBroker

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        log("starting Kafka 4.0 ...")
        default_kafka_home()
        broker = LocalKafkaBroker(properties={"group.initial.rebalance.delay.ms": "0"})
        bootstrap = broker.bootstrap_servers
    rows = []
    n = 0
    try:
        for rate in (int(x) for x in args.rates.split(",") if x.strip()):
            for trigger_ms in (int(x) for x in args.triggers.split(",") if x.strip()):
                for round_no in range(1, args.rounds + 1):
                    # Alternated, so neither reader always runs on the machine the other
                    # left behind (its page cache, the broker's warm segments).
                    for reader in (readers if round_no % 2 else readers[::-1]):
                        n += 1
                        log(f"{rate} records/s, trigger {trigger_ms} ms: {reader}"
                            + (f", round {round_no}" if args.rounds > 1 else "") + " ...")
                        row = run_point(reader, bootstrap, rate, trigger_ms, args, n)
                        row["round"] = round_no
                        rows.append(row)
                        log("  " + json.dumps(row))
    finally:
        if broker is not None:
            broker.stop()
    print_table(rows)
    summary = over_rounds(rows)
    if args.rounds > 1:
        print_over_rounds(summary)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": os.uname().nodename,
            "cpus": os.cpu_count(), "seconds": args.seconds, "warmup": args.warmup,
            "partitions": args.partitions, "rounds": args.rounds, "over_rounds": summary,
            "rows": rows}, indent=2))
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "query":
        qp = argparse.ArgumentParser()
        qp.add_argument("--reader", required=True)
        qp.add_argument("--bootstrap", required=True)
        qp.add_argument("--topic", required=True)
        qp.add_argument("--out", required=True)
        qp.add_argument("--trigger-ms", type=int, default=0)
        query_main(qp.parse_args(sys.argv[2:]))
    else:
        sys.exit(main())
