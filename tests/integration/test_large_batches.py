"""A record batch of 120 MB from a real Kafka, read with ``spark.read.format("pykafka")``.

Kafka returns the first record batch of a Fetch response whole even when it is larger than the
request's byte limits (KIP-74), so a response can be as large as the largest batch a topic takes
(its ``max.message.bytes``). The fetch connection accepts a response of at most its receive limit
(100 MB by default) or twice what the request asked for; a larger one fails the read at once,
naming the partition, the size and the options that raise the limit
(:mod:`kafka_source.wire.net.fetch_connection`).

This module starts a Kafka of its own (``KAFKA_HOME``; ``KAFKA_ZK_HOME`` in ZooKeeper mode on the
Kafka 2.2 pass, see ``start_local_broker``) that takes batches of up to ~170 MB, makes a topic
with ``max.message.bytes`` 160 MB and produces a small record, one record of 120 MB (a batch of
its own) and another small one. With the default options the read fails at once; with
``kafka.receive.message.max.bytes`` raised it returns the three records, the big value's length
and SHA-256 computed in Spark (so that the 120 MB never travel to the driver's Python), while the
peak RSS of the executors' Python workers is measured (``benchmarks/procmon.py``) and bounded.
The figures are printed at the end of the run. It skips without a distribution and on the
embedded-broker CI pass (it has already run in the real-Kafka pass).
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kafka_source.testing import (create_topic, local_distribution, start_local_broker,
                                   unique_topic_name)

pytestmark = pytest.mark.skip_on_embedded(
    "starts a real Kafka of its own from KAFKA_HOME to take 120 MB record batches; it ran in "
    "the real-Kafka pass")

REPO_ROOT = Path(__file__).resolve().parents[2]
BIG = 120_000_000                  # bytes of the big record's value: one batch of ~120 MB
TOPIC_MAX = 160_000_000            # the topic's max.message.bytes
POLL_TIMEOUT_MS = 120_000          # what a retried failure would wait out (the default)
# Peak RSS of an executor's Python worker reading the 120 MB batch: the receive buffer and the
# Arrow value column hold one copy each, plus the interpreter with pyspark, pyarrow and numpy
# and the small rows. A copy more than that is a regression worth a look.
PEAK_RSS_LIMIT_MB = 3 * BIG / 1e6 + 250


def _procmon():
    spec = importlib.util.spec_from_file_location("procmon", REPO_ROOT / "benchmarks" /
                                                  "procmon.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def big_batch():
    """(bootstrap servers, topic, SHA-256 of the 120 MB value) on a broker of this module's."""
    if local_distribution() is None:
        pytest.skip("needs a local Apache Kafka distribution (KAFKA_HOME, or KAFKA_ZK_HOME) to "
                    "start a broker that takes 120 MB record batches")
    broker = start_local_broker(properties={
        "message.max.bytes": "170000000",
        "replica.fetch.max.bytes": "170000000",
        "socket.request.max.bytes": "200000000",      # the Produce request of the batch
    })
    try:
        topic = unique_topic_name("big-batch")
        create_topic(broker.bootstrap_servers, topic, partitions=1,
                     config={"max.message.bytes": str(TOPIC_MAX)})
        value = random.Random(17).randbytes(BIG)
        produce_one_per_batch(broker.bootstrap_servers, topic, [b"before", value, b"after"])
        yield SimpleNamespace(bootstrap=broker.bootstrap_servers, topic=topic,
                              sha256=hashlib.sha256(value).hexdigest())
    finally:
        broker.stop()


def produce_one_per_batch(bootstrap, topic, values):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0,
                             max_request_size=TOPIC_MAX,
                             request_timeout_ms=120_000)
    try:
        for value in values:
            producer.send(topic, value=value, partition=0).get(timeout=120)
    finally:
        producer.close(timeout=30)


def read(spark, big_batch, **options):
    reader = (spark.read.format("pykafka")
              .option("kafka.bootstrap.servers", big_batch.bootstrap)
              .option("subscribe", big_batch.topic)
              .option("kafkaConsumer.pollTimeoutMs", str(POLL_TIMEOUT_MS)))
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load().selectExpr("offset", "length(value) AS n", "sha2(value, 256) AS h")
    return sorted(tuple(r) for r in df.collect())


def test_a_batch_larger_than_the_receive_limit_fails_at_once_naming_partition_and_options(
        spark, big_batch, summary_lines):
    # The first record alone (its own batch) reads: Spark is warm before the clock starts.
    endings = f'{{"{big_batch.topic}": {{"0": 1}}}}'
    assert read(spark, big_batch, endingOffsets=endings) == \
        [(0, 6, hashlib.sha256(b"before").hexdigest())]
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        read(spark, big_batch)
    elapsed = time.monotonic() - start
    summary_lines.append(f"large batch: the read with the default receive limit failed after "
                         f"{elapsed:.1f} s")
    message = str(info.value)
    assert f"{big_batch.topic}-0 at offset 1: " in message, message[-3000:]
    assert "more than the 105,906,176 accepted" in message, message[-3000:]
    for option in ("'kafka.receive.message.max.bytes'", "'kafka.fetch.max.bytes'",
                   "'kafka.max.partition.fetch.bytes'"):
        assert option in message
    assert "kafkaConsumer.pollTimeoutMs" not in message
    # Not retried until kafkaConsumer.pollTimeoutMs: the first response decides.
    assert elapsed < POLL_TIMEOUT_MS / 2000, f"failed only after {elapsed:.0f} s"


def test_a_120_mb_batch_is_read_with_the_receive_limit_raised(spark, big_batch, summary_lines):
    monitor = _procmon().ProcessMonitor(interval=0.05)
    monitor.reset()
    start = time.monotonic()
    with monitor:
        rows = read(spark, big_batch, **{"kafka.receive.message.max.bytes": str(TOPIC_MAX)})
    elapsed = time.monotonic() - start
    peak_mb = monitor.peaks_mb().get("executor", 0.0)
    summary_lines.append(f"large batch: read a {BIG:,}-byte record batch in {elapsed:.1f} s; "
                         f"executor Python worker peak RSS {peak_mb:.0f} MB")
    assert rows == [(0, 6, hashlib.sha256(b"before").hexdigest()),
                    (1, BIG, big_batch.sha256),
                    (2, 5, hashlib.sha256(b"after").hexdigest())]
    assert 0 < peak_mb < PEAK_RSS_LIMIT_MB, f"executor peak RSS {peak_mb:.0f} MB"
