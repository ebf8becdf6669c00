"""`make demo`: a streaming query that is a member of a Kafka consumer group, start to finish.

1. Starts the embedded broker (or uses ``KAFKA_BOOTSTRAP_SERVERS``) and creates a topic.
2. A producer emits click events (JSON values, user-id keys) for ``PRODUCE_S`` seconds.
3. Query 1, ``spark.readStream.format("pykafka")`` in consumer group ``clicks-demo-*`` with
   ``maxOffsetsPerTrigger``, aggregates each micro-batch (events and revenue per kind) and prints
   it with the group's lag as the broker reports it (``kafka_source.describe_group``).
4. Once the producer is done and the group's lag is 0 (every batch read is committed),
   ``query.stop()``. More events arrive while no query runs: the lag grows.
5. Query 2, ``Trigger.AvailableNow`` in the same group with a new checkpoint, starts at the
   group's committed offsets, reads the rest, commits and leaves the group. On a PySpark without
   admission control for Python sources (4.0, 4.1: ``kafka_source.spark_features``) Spark runs
   AvailableNow as one micro-batch and calls ``commit`` for it only in the checkpoint's next run:
   query 2 leaves ``maxOffsetsPerTrigger`` unset there, so that its one batch reads everything,
   and its checkpoint runs once more, which commits the batch (docs/platforms.md).
6. Checks that every event was counted exactly once over both queries, and says so.

There is no ``kafka_source.register(spark)``: ``pip install`` (``make install``) puts the
``pyspark_pykafka`` module where PySpark's data source auto-discovery finds it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter

from kafka import KafkaProducer

from kafka_source import describe_group
from kafka_source.spark_features import ADMISSION_CONTROL
from kafka_source.testing import create_topic, select_broker, unique_topic_name

PARTITIONS = 3
PRODUCE_S = 30           # how long the producer emits while query 1 runs
EVENTS_PER_S = 40
LATE_EVENTS = 500        # produced while no query runs; query 2 picks them up
MAX_OFFSETS_PER_TRIGGER = 200
KINDS = ["view", "view", "view", "click", "add_to_cart", "purchase"]
PAGES = ["/", "/search", "/product/42", "/product/7", "/cart", "/checkout"]
EVENT_SCHEMA = "event_id long, user string, kind string, page string, amount double, ts long"


class ClickProducer:
    """Click events with ids 0, 1, 2, ... One record per request: the embedded broker misreports
    the end offset of multi-record batches (see kafka_source/testing/brokers.py)."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.sent = 0
        self._rnd = random.Random(2026)
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1)

    def send(self, count: int, *, per_second: float | None = None,
             stop: threading.Event | None = None) -> None:
        started = time.monotonic()
        for i in range(count):
            if stop is not None and stop.is_set():
                return
            user = f"user-{self._rnd.randint(1, 40):03d}"
            event = {"event_id": self.sent, "user": user, "kind": self._rnd.choice(KINDS),
                     "page": self._rnd.choice(PAGES), "amount": round(self._rnd.uniform(5, 120), 2),
                     "ts": int(time.time() * 1000)}
            self._producer.send(self.topic, key=user.encode(),
                                value=json.dumps(event).encode()).get(timeout=30)
            self.sent += 1
            if per_second:
                time.sleep(max(0.0, started + (i + 1) / per_second - time.monotonic()))

    def close(self) -> None:
        self._producer.close()


class Tally:
    """What the queries counted: each micro-batch's aggregate, printed, and every event id."""

    def __init__(self, options: dict, group: str):
        self.options, self.group = options, group
        self.seen: Counter[int] = Counter()
        self.first_offsets: dict[str, dict] = {}   # query -> {(topic, partition): first offset}
        self.lock = threading.Lock()

    def for_query(self, name: str):
        from pyspark.sql import functions as F

        def on_batch(batch_df, batch_id: int) -> None:
            events = batch_df.select("topic", "partition", "offset", F.from_json(
                F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
            rows = events.select("topic", "partition", "offset", "e.event_id", "e.kind",
                                 "e.amount").collect()
            with self.lock:
                self.seen.update(r["event_id"] for r in rows)
                firsts = self.first_offsets.setdefault(name, {})
                for r in rows:
                    tp = (r["topic"], r["partition"])
                    firsts[tp] = min(firsts.get(tp, r["offset"]), r["offset"])
            per_kind = Counter(r["kind"] for r in rows)
            revenue = sum(r["amount"] for r in rows if r["kind"] == "purchase")
            per_partition = Counter(r["partition"] for r in rows)
            lag = describe_group(self.options, self.group).total_lag
            lag = "- (nothing committed yet)" if lag is None else lag
            print(f"  {name} batch {batch_id:2d} | {len(rows):3d} events "
                  f"({' '.join(f'p{p}:{n}' for p, n in sorted(per_partition.items()))}) | "
                  + ", ".join(f"{k} {per_kind[k]}" for k in ("view", "click", "add_to_cart",
                                                              "purchase"))
                  + f" | revenue {revenue:8.2f} | group lag {lag}", flush=True)

        return on_batch


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def start_query(spark, options: dict, tally: Tally, name: str, checkpoint: str, **trigger):
    reader = spark.readStream.format("pykafka")   # found by auto-discovery: no register() call
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().writeStream.queryName(name).foreachBatch(tally.for_query(name))
            .option("checkpointLocation", checkpoint).trigger(**trigger).start())


def run_available_now(spark, options: dict, tally: Tally, name: str, checkpoint: str) -> None:
    query = start_query(spark, options, tally, name, checkpoint, availableNow=True)
    try:
        if not query.awaitTermination(180):
            raise TimeoutError(f"{name} (AvailableNow) did not finish within 180 s")
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"{name} failed: {query.exception()}")


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    started = time.monotonic()
    broker = select_broker()
    print(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    workdir = tempfile.mkdtemp(prefix="pykafka-demo-")
    spark = producer = query = None
    stop_producing = threading.Event()
    try:
        topic, group = unique_topic_name("clicks"), unique_topic_name("clicks-demo")
        create_topic(broker.bootstrap_servers, topic, partitions=PARTITIONS)
        producer = ClickProducer(broker.bootstrap_servers, topic)
        background = threading.Thread(
            target=producer.send, args=(PRODUCE_S * EVENTS_PER_S,),
            kwargs={"per_second": EVENTS_PER_S, "stop": stop_producing}, daemon=True)
        background.start()
        print(f"producing {EVENTS_PER_S} click events/s to '{topic}' ({PARTITIONS} partitions) "
              f"for {PRODUCE_S} s")

        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").appName("pykafka-demo")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")

        options = {
            "kafka.bootstrap.servers": broker.bootstrap_servers,
            "subscribe": topic,
            "kafka.group.id": group,              # startingOffsets defaults to "group"
            "kafka.auto.offset.reset": "earliest",  # where a partition without a commit starts
            "maxOffsetsPerTrigger": str(MAX_OFFSETS_PER_TRIGGER),
            # Shorter than Kafka's 45 s default so that joins and leaves show quickly.
            "kafka.session.timeout.ms": "6000",
            "kafka.heartbeat.interval.ms": "1000",
        }
        tally = Tally(options, group)

        print(f"\nquery 1: readStream in consumer group '{group}', at most "
              f"{MAX_OFFSETS_PER_TRIGGER} records per micro-batch, a trigger every 2 s")
        query = start_query(spark, options, tally, "query1", os.path.join(workdir, "ck1"),
                            processingTime="2 seconds")
        background.join(PRODUCE_S + 120)
        produced_early = producer.sent
        print(f"producer done: {produced_early} events")
        # Stop only once every batch query 1 ran is committed: the group then holds exactly
        # what it counted (a batch that completes just before stop() is committed at the next
        # trigger, which a stopped query never runs; see docs/groups.md, group semantics).
        at_stop = wait_for(lambda: caught_up(options, group, topic, produced_early), 120,
                           "query 1 to catch up and commit everything")
        query.stop()
        query = None
        counted_1 = sum(tally.seen.values())
        print(f"query 1 stopped after counting {counted_1} events; the group's committed "
              f"offsets: {format_offsets(at_stop)}")

        producer.send(LATE_EVENTS)
        late = describe_group(options, group, [topic])
        print(f"\n{LATE_EVENTS} more events while no query runs: group '{group}' is "
              f"{late.state}, lag {late.total_lag}")

        print("\nquery 2: Trigger.AvailableNow in the same group, a new checkpoint")
        options_2 = dict(options)
        if not ADMISSION_CONTROL:
            import pyspark

            del options_2["maxOffsetsPerTrigger"]
            print(f"  (PySpark {pyspark.__version__} has no admission control for Python "
                  "sources: Spark runs AvailableNow as one micro-batch, so maxOffsetsPerTrigger "
                  "is left unset for it, and the group gets the batch's offsets when the "
                  "checkpoint runs next, which it does below)")
        checkpoint_2 = os.path.join(workdir, "ck2")
        run_available_now(spark, options_2, tally, "query2", checkpoint_2)
        if not ADMISSION_CONTROL:
            run_available_now(spark, options_2, tally, "query2-again", checkpoint_2)
        query = None
        resumed_at = tally.first_offsets.get("query2", {})
        final = describe_group(options, group, [topic])
        print(f"query 2 read from {format_offsets(resumed_at)} on, finished; group '{group}' is "
              f"{final.state}, lag {final.total_lag}")

        return check(tally.seen, producer.sent, at_stop, resumed_at, final.total_lag,
                     time.monotonic() - started)
    finally:
        stop_producing.set()
        if query is not None:
            query.stop()
        if producer is not None:
            producer.close()
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def caught_up(options: dict, group: str, topic: str, produced: int) -> dict | None:
    """The group's committed offsets once they cover all ``produced`` events, else None."""
    committed = describe_group(options, group, [topic]).committed
    return committed if sum(committed.values()) == produced else None


def format_offsets(offsets) -> str:
    return ", ".join(f"p{p}@{o}" for (_, p), o in sorted(offsets.items()))


def check(seen: Counter, produced: int, committed_at_stop: dict, resumed_at: dict,
          final_lag: int, elapsed_s: float) -> int:
    missing = [i for i in range(produced) if seen[i] == 0]
    twice = sorted(i for i, n in seen.items() if n > 1)
    unknown = sorted(i for i in seen if not 0 <= i < produced)
    problems = []
    if missing:
        problems.append(f"{len(missing)} events never counted (first ids {missing[:5]})")
    if twice:
        problems.append(f"{len(twice)} events counted more than once (first ids {twice[:5]})")
    if unknown:
        problems.append(f"ids never produced: {unknown[:5]}")
    if resumed_at != committed_at_stop:
        problems.append(f"query 2 started at {resumed_at}, not at the committed {committed_at_stop}")
    if final_lag != 0:
        problems.append(f"the group's lag is {final_lag} after query 2, not 0")
    if problems:
        for problem in problems:
            print(f"ERROR: {problem}", file=sys.stderr)
        return 1
    print(f"\ndemo OK in {elapsed_s:.0f} s: {produced} events produced, each counted exactly "
          "once; query 2 resumed exactly where query 1 committed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
