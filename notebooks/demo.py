"""`make demo`: read a Kafka topic into Spark with spark.read.format("pykafka").

Starts the embedded broker (or uses KAFKA_BOOTSTRAP_SERVERS), creates a topic, produces a few
thousand click events (JSON values, user-id keys, headers), reads them back as a DataFrame,
shows a small aggregate, and stops everything it started.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka import KafkaProducer  # noqa: E402

from kafka_source.testing import create_topic, select_broker, unique_topic_name  # noqa: E402

EVENTS = 3000
PAGES = ["/", "/search", "/product/42", "/product/7", "/cart", "/checkout"]
KINDS = ["view", "view", "view", "click", "add_to_cart", "purchase"]


def produce_events(bootstrap: str, topic: str) -> None:
    rnd = random.Random(2026)
    # One record per request: the embedded broker misreports the end offset of multi-record
    # batches (see kafka_source/testing/brokers.py), and the demo reads up to "latest".
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1)
    started = time.time()
    for i in range(EVENTS):
        user = f"user-{rnd.randint(1, 40):03d}"
        event = {"event_id": i, "user": user, "kind": rnd.choice(KINDS),
                 "page": rnd.choice(PAGES), "amount": round(rnd.uniform(5, 120), 2),
                 "ts": int(time.time() * 1000)}
        producer.send(topic, key=user.encode(), value=json.dumps(event).encode(),
                      headers=[("source", b"web" if i % 4 else b"mobile"),
                               ("schema", b"click-v1")]).get(timeout=30)
    producer.close()
    print(f"produced {EVENTS} events to '{topic}' in {time.time() - started:.1f} s")


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    broker = select_broker()
    print(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    spark = None
    try:
        topic = unique_topic_name("clicks")
        create_topic(broker.bootstrap_servers, topic, partitions=3)
        produce_events(broker.bootstrap_servers, topic)

        from pyspark.sql import SparkSession, functions as F

        import kafka_source

        spark = (SparkSession.builder.master("local[2]").appName("pykafka-demo")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        kafka_source.register(spark)

        df = (spark.read.format("pykafka")
              .option("kafka.bootstrap.servers", broker.bootstrap_servers)
              .option("subscribe", topic)
              .option("includeHeaders", "true")
              .load())
        schema = "event_id long, user string, kind string, page string, amount double, ts long"
        events = df.select(
            F.col("key").cast("string").alias("user_key"), "partition", "offset",
            F.from_json(F.col("value").cast("string"), schema).alias("e"),
            F.expr("filter(headers, h -> h.key = 'source')[0].value").cast("string")
             .alias("source"))

        print("\nfirst rows:")
        events.select("partition", "offset", "user_key", "source", "e.kind", "e.page",
                      "e.amount").orderBy("partition", "offset").show(5, truncate=False)

        print("events per kind and source:")
        (events.groupBy("e.kind").pivot("source", ["web", "mobile"]).count()
         .orderBy(F.desc("web")).show())

        print("revenue by page (purchases):")
        (events.where("e.kind = 'purchase'").groupBy("e.page")
         .agg(F.count("*").alias("purchases"), F.round(F.sum("e.amount"), 2).alias("revenue"))
         .orderBy(F.desc("revenue")).show())

        total = df.count()
        per_partition = {r["partition"]: r["count"] for r in df.groupBy("partition").count().collect()}
        print(f"read {total} records from {len(per_partition)} partitions {per_partition}")
        if total != EVENTS:
            print(f"ERROR: produced {EVENTS} but read {total}", file=sys.stderr)
            return 1
        print("demo OK: every produced event was read exactly once")
        return 0
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
