"""The sink against a real broker: ``df.write`` / ``df.writeStream`` with ``format("pykafka")``.

Everything written is read back with kafka-python's consumer (not with this package's source),
record by record: topic, partition, key, value, headers. Keyed records must be on the partition
kafka-python's DefaultPartitioner (murmur2, as Java's) picks. Exactly-once writes are read with
``isolation_level=read_committed`` and must show every record once, although the broker holds
aborted records of failed attempts too (checked with a read_uncommitted consumer). Transactions
and read_committed need real Kafka: those tests skip on the embedded broker.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.partitioner.default import murmur2
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StructField, StructType

from kafka_source.config.sink_options import parse_sink_options
from kafka_source.schema import HEADER_TYPE
from kafka_source.testing import create_topic, unique_topic_name
from kafka_source.write import exactly_once
from kafka_source.write.columns import Columns
from kafka_source.write.exactly_once import (MarkerEntry, MarkerStore, TransactionCommitError,
                                             abort_batch, commit_batch, decode_marker,
                                             encode_marker, marker_group, transactional_id,
                                             write_exactly_once)
from kafka_source.write.producer import abort_stale_transaction, end_transaction

from .sink_retry_job import padded
from .spark_features import AVAILABLE_NOW_IN_MICRO_BATCHES
from .spark_workers import spark_worker_env

REPO_ROOT = Path(__file__).resolve().parents[2]

SCHEMA = StructType([StructField("key", BinaryType()), StructField("value", BinaryType()),
                     StructField("partition", IntegerType()),
                     StructField("headers", ArrayType(HEADER_TYPE))])


def read_back(bootstrap: str, topic: str, *, committed_only: bool = False) -> list:
    """Every record of ``topic`` (all partitions, from the beginning up to the end offsets),
    ``read_committed`` if asked."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             isolation_level="read_committed" if committed_only
                             else "read_uncommitted")
    try:
        partitions = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        records = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"could not read {topic} up to {end}"
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def per_partition(records) -> dict:
    """partition -> (records, first offset, last offset): what an assertion message shows when
    records are missing, to tell a batch never written from one the read-back skipped."""
    seen: dict[int, list[int]] = {}
    for r in records:
        seen.setdefault(r.partition, []).append(r.offset)
    return {p: (len(o), min(o), max(o)) for p, o in sorted(seen.items())}


def default_partition(key: bytes, partitions: int) -> int:
    """kafka-python's DefaultPartitioner for a keyed record (Java's rule)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def writer(df, bootstrap, **options):
    w = df.write.format("pykafka").mode("append").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        w = w.option(k, v)
    return w


def error_text(exc_info) -> str:
    return str(exc_info.value)


# --- batch writes -------------------------------------------------------------------------------

@pytest.mark.smoke      # make check's smoke test
def test_keys_tombstones_headers_and_explicit_partitions(spark, bootstrap_servers):
    topic = unique_topic_name("sink-rows")
    create_topic(bootstrap_servers, topic, 3)
    rows = [
        (b"k1", b"v1", None, [("h1", b"x"), ("h2", None)]),
        (None, b"unkeyed", None, None),
        (b"k2", None, None, []),                      # tombstone
        (None, None, 2, None),                        # null key and value, explicit partition
        (b"k3", b"pinned", 0, [("h", b"")]),          # explicit partition beats the key
    ]
    df = spark.createDataFrame(rows, SCHEMA)
    writer(df, bootstrap_servers, topic=topic).save()

    got = read_back(bootstrap_servers, topic)
    assert len(got) == 5
    by_value = {r.value: r for r in got}
    assert set(by_value) == {b"v1", b"unkeyed", None, b"pinned"} and \
        Counter(r.value for r in got)[None] == 2
    assert by_value[b"v1"].key == b"k1"
    assert by_value[b"v1"].partition == default_partition(b"k1", 3)
    assert by_value[b"v1"].headers == [("h1", b"x"), ("h2", None)]
    assert by_value[b"unkeyed"].key is None and by_value[b"unkeyed"].headers == []
    nulls = {r.key: r for r in got if r.value is None}
    assert nulls[b"k2"].partition == default_partition(b"k2", 3)
    assert nulls[None].partition == 2
    assert by_value[b"pinned"].partition == 0 and by_value[b"pinned"].headers == [("h", b"")]


def test_keyed_rows_land_where_the_default_partitioner_puts_them(spark, bootstrap_servers):
    topic = unique_topic_name("sink-keyed")
    create_topic(bootstrap_servers, topic, 7)
    df = spark.range(2000).selectExpr("CONCAT('key-', CAST(id AS STRING)) AS key",
                                      "CAST(id AS STRING) AS value")
    writer(df, bootstrap_servers, topic=topic).save()
    got = read_back(bootstrap_servers, topic)
    ids = sorted(int(r.value) for r in got)
    assert ids == list(range(2000)), (sorted(set(range(2000)) - set(ids))[:20],
                                      per_partition(got))
    wrong = [(r.key, r.partition) for r in got if r.partition != default_partition(r.key, 7)]
    assert not wrong
    assert all(r.key == b"key-" + r.value for r in got)


def test_unkeyed_rows_spread_over_all_partitions(spark, bootstrap_servers):
    topic = unique_topic_name("sink-spread")
    create_topic(bootstrap_servers, topic, 5)
    df = spark.range(0, 1000, 1, 2).selectExpr("CAST(id AS STRING) AS value")
    writer(df, bootstrap_servers, topic=topic).save()
    counts = Counter(r.partition for r in read_back(bootstrap_servers, topic))
    assert sorted(counts) == [0, 1, 2, 3, 4] and sum(counts.values()) == 1000
    # round robin in each of the 2 tasks: each partition within 2 of the others
    assert max(counts.values()) - min(counts.values()) <= 2, counts


def test_topic_column_routes_rows_and_the_option_overrides_it(spark, bootstrap_servers):
    a, b, c = (unique_topic_name(f"sink-route-{x}") for x in "abc")
    for t, n in ((a, 2), (b, 3), (c, 1)):
        create_topic(bootstrap_servers, t, n)
    df = spark.createDataFrame([(a, "1"), (b, "2"), (a, "3"), (b, "4"), (b, "5")],
                               "topic string, value string")
    writer(df, bootstrap_servers).save()
    assert sorted(r.value for r in read_back(bootstrap_servers, a)) == [b"1", b"3"]
    assert sorted(r.value for r in read_back(bootstrap_servers, b)) == [b"2", b"4", b"5"]
    writer(df, bootstrap_servers, topic=c).save()
    assert sorted(r.value for r in read_back(bootstrap_servers, c)) == [b"1", b"2", b"3",
                                                                        b"4", b"5"]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_every_codec(spark, bootstrap_servers, codec):
    topic = unique_topic_name(f"sink-{codec}")
    create_topic(bootstrap_servers, topic, 2)
    df = spark.range(300).selectExpr("CAST(id % 10 AS STRING) AS key",
                                     "REPEAT(CAST(id AS STRING), 20) AS value")
    writer(df, bootstrap_servers, topic=topic, **{"kafka.compression.type": codec}).save()
    got = read_back(bootstrap_servers, topic)
    assert sorted(r.value for r in got) == sorted(str(i).encode() * 20 for i in range(300))


# --- bad input ----------------------------------------------------------------------------------

def test_bad_columns_fail_before_any_task(spark, bootstrap_servers):
    topic = unique_topic_name("sink-bad")
    create_topic(bootstrap_servers, topic, 1)
    with pytest.raises(Exception) as info:
        writer(spark.range(3).selectExpr("CAST(id AS STRING) AS key"), bootstrap_servers,
               topic=topic).save()
    assert "needs a 'value' column" in error_text(info)
    with pytest.raises(Exception) as info:
        writer(spark.range(3).selectExpr("id AS value"), bootstrap_servers, topic=topic).save()
    assert "Column 'value' has type bigint; it must be string or binary" in error_text(info)
    with pytest.raises(Exception) as info:
        writer(spark.range(3).selectExpr("'x' AS value", "CAST(id AS BIGINT) AS partition"),
               bootstrap_servers, topic=topic).save()
    assert "Column 'partition' has type bigint; it must be int" in error_text(info)
    with pytest.raises(Exception) as info:
        writer(spark.range(3).selectExpr("'x' AS value"), bootstrap_servers).save()
    assert "No topic to write to" in error_text(info)
    assert read_back(bootstrap_servers, topic) == []


def test_unknown_topic_and_overwrite_rejected(spark, bootstrap_servers):
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    missing = unique_topic_name("sink-missing")
    with pytest.raises(Exception) as info:
        writer(df, bootstrap_servers, topic=missing).save()
    assert f"Topic '{missing}' does not exist" in error_text(info)
    # from the topic column: found by the task, and not created either
    with pytest.raises(Exception) as info:
        writer(df.selectExpr("value", f"'{missing}' AS topic"), bootstrap_servers).save()
    assert f"'{missing}'" in error_text(info) and "does not exist" in error_text(info)
    with pytest.raises(Exception) as info:
        df.write.format("pykafka").mode("overwrite") \
            .option("kafka.bootstrap.servers", bootstrap_servers).option("topic", missing).save()
    assert "can't be overwritten" in error_text(info) and 'mode("append")' in error_text(info)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers)
    try:
        assert missing not in consumer.topics()
    finally:
        consumer.close()


def test_bad_rows_fail_the_task_naming_what_is_wrong(spark, bootstrap_servers):
    topic = unique_topic_name("sink-badrow")
    create_topic(bootstrap_servers, topic, 2)
    big = spark.range(1).selectExpr("REPEAT('x', 3000) AS value")
    with pytest.raises(Exception) as info:
        writer(big, bootstrap_servers, topic=topic, **{"kafka.max.request.size": "2000"}).save()
    text = error_text(info)
    assert topic in text and "kafka.max.request.size" in text
    with pytest.raises(Exception) as info:
        writer(spark.range(1).selectExpr("'x' AS value", "5 AS partition"), bootstrap_servers,
               topic=topic).save()
    assert f"topic '{topic}' has 2 partitions" in error_text(info)
    with pytest.raises(Exception) as info:
        writer(spark.createDataFrame([("x", None)], "value string, topic string"),
               bootstrap_servers).save()
    assert "Column 'topic' is null in row 0" in error_text(info)


# --- streaming ----------------------------------------------------------------------------------

def _produce(bootstrap: str, topic: str, values, pad: bool = False, one_by_one=False) -> None:
    """``one_by_one``: each record in a batch of its own (the embedded broker's end offsets are
    exact only then)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for v in values:
        sent = producer.send(topic, key=v.encode(), value=padded(v) if pad else v.encode())
        if one_by_one:
            sent.get(timeout=30)
    producer.flush()
    producer.close()


def _copy(spark, bootstrap, source, out, checkpoint, **sink_options):
    stream = (spark.readStream.format("pykafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "60").load().select("key", "value"))
    w = (stream.writeStream.format("pykafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", out).option("checkpointLocation", checkpoint))
    for k, v in sink_options.items():
        w = w.option(k, v)
    query = w.trigger(availableNow=True).start()
    assert query.awaitTermination(180), "the stream did not finish"
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress]


@AVAILABLE_NOW_IN_MICRO_BATCHES
def test_stream_topic_to_topic_with_checkpoint_restart(spark, bootstrap_servers, tmp_path):
    source, out = unique_topic_name("sink-src"), unique_topic_name("sink-copy")
    create_topic(bootstrap_servers, source, 2)
    create_topic(bootstrap_servers, out, 3)
    first = [f"a{i}" for i in range(100)]
    _produce(bootstrap_servers, source, first, one_by_one=True)
    checkpoint = str(tmp_path / "checkpoint")
    assert sum(_copy(spark, bootstrap_servers, source, out, checkpoint)) == 100
    assert sorted(r.value.decode() for r in read_back(bootstrap_servers, out)) == sorted(first)
    more = [f"b{i}" for i in range(50)]
    _produce(bootstrap_servers, source, more, one_by_one=True)
    assert sum(_copy(spark, bootstrap_servers, source, out, checkpoint)) == 50
    got = read_back(bootstrap_servers, out)
    assert sorted(r.value.decode() for r in got) == sorted(first + more)
    assert all(r.partition == default_partition(r.key, 3) for r in got)


@AVAILABLE_NOW_IN_MICRO_BATCHES
@pytest.mark.once     # about a minute: CI runs it in its first real-Kafka pass only
def test_a_stream_of_100_micro_batches_uses_one_producer_per_python_worker(
        spark, bootstrap_servers, tmp_path):
    # Issue 18 item 2: a producer per write task gave each task a new producer id, and brokers
    # keep state per producer id and partition for a day or a week. Counted where the broker
    # keeps it: the producer id of every record batch written. At least 100 micro-batches (of
    # at most 10 records each) of two write tasks each.
    from kafka_source.config.client_config import client_config_from_options

    from .test_producer import raw_batches

    source, out = unique_topic_name("sink-pool-src"), unique_topic_name("sink-pool")
    create_topic(bootstrap_servers, source, 2)
    create_topic(bootstrap_servers, out, 3)
    sent = [f"p{i:04d}" for i in range(1000)]
    _produce(bootstrap_servers, source, sent, one_by_one=True)
    stream = (spark.readStream.format("pykafka").option("kafka.bootstrap.servers",
                                                       bootstrap_servers)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "10").load().select("key", "value"))
    query = (stream.writeStream.format("pykafka")
             .option("kafka.bootstrap.servers", bootstrap_servers).option("topic", out)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300), "the stream did not finish"
    assert query.exception() is None, query.exception()
    commits = [f for f in os.listdir(tmp_path / "checkpoint" / "commits") if f.isdigit()]
    assert len(commits) >= 100, f"{len(commits)} micro-batches"
    got = read_back(bootstrap_servers, out)
    assert sorted(r.value.decode() for r in got) == sent          # none lost, none twice
    config = client_config_from_options({"kafka.bootstrap.servers": bootstrap_servers})
    batches = [b for p in range(3) for b in raw_batches(config, out, p)]
    ids = {b.producer_id for b in batches}
    assert -1 not in ids                                          # idempotent, as by default
    # local[2]: at most two Python workers write at a time; Spark may start a fresh one now
    # and then (a worker that died or was not reused), never one per task (200 or more).
    print(f"{len(ids)} producer id(s) for {2 * len(commits)} write tasks")
    assert len(ids) <= 4, f"{len(ids)} producer ids for {2 * len(commits)} write tasks"


def test_stream_complete_mode_appends_every_result_row(spark, bootstrap_servers, tmp_path):
    # As Spark's Kafka sink: a topic can't be truncated, so each micro-batch's whole result is
    # appended. (Spark itself refuses "update" mode for Python data sources.)
    source, out = unique_topic_name("sink-agg-src"), unique_topic_name("sink-agg")
    create_topic(bootstrap_servers, source, 1)
    create_topic(bootstrap_servers, out, 1)
    _produce(bootstrap_servers, source, [f"k{i % 3}" for i in range(30)], one_by_one=True)
    counts = (spark.readStream.format("pykafka")
              .option("kafka.bootstrap.servers", bootstrap_servers).option("subscribe", source)
              .option("startingOffsets", "earliest").load()
              .groupBy("key").count().selectExpr("key", "CAST(count AS STRING) AS value"))
    query = (counts.writeStream.format("pykafka").outputMode("complete")
             .option("kafka.bootstrap.servers", bootstrap_servers).option("topic", out)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180) and query.exception() is None
    got = {r.key: r.value for r in read_back(bootstrap_servers, out)}
    assert got == {b"k0": b"10", b"k1": b"10", b"k2": b"10"}


# --- exactly-once -------------------------------------------------------------------------------

@AVAILABLE_NOW_IN_MICRO_BATCHES
@pytest.mark.skip_on_embedded("transactions and read_committed need real Kafka")
def test_exactly_once_with_a_killed_task_a_restart_and_a_lost_commit_log(bootstrap_servers,
                                                                         tmp_path):
    source, out = unique_topic_name("sink-eos-src"), unique_topic_name("sink-eos")
    create_topic(bootstrap_servers, source, 2)
    create_topic(bootstrap_servers, out, 3)
    first = [f"a{i}" for i in range(1000)]
    _produce(bootstrap_servers, source, first, pad=True)
    env = {**spark_worker_env(),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    job = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("sink_retry_job.py")),
         "--master", "local[2,2]", "--bootstrap", bootstrap_servers, "--source", source,
         "--out", out, "--work", str(tmp_path), "--more", "300"],
        env=env, capture_output=True, text=True, timeout=480)
    log = job.stdout + job.stderr
    assert job.returncode == 0, log[-6000:]
    phases = {p["phase"]: p for p in (json.loads(line[4:]) for line in job.stdout.splitlines()
                                      if line.startswith("JOB "))}
    assert sum(phases["killed task"]["rows"]) == 1000
    assert sum(phases["restart"]["rows"]) == 300
    assert sum(phases["commit log lost"]["rows"]) > 0   # the last micro-batch ran again
    # The task was killed once, in its first attempt, and Spark retried it.
    lost = [line for line in log.splitlines()
            if "Lost task" in line and "Python worker exited unexpectedly" in line]
    assert len(lost) == 1, lost or log[-6000:]

    expected = Counter(first + [f"more-{i}" for i in range(300)])
    committed = read_back(bootstrap_servers, out, committed_only=True)
    assert Counter(r.value.split(b":")[0].decode() for r in committed) == expected
    # The killed attempt had written records: they are in the log, aborted.
    assert len(read_back(bootstrap_servers, out)) > sum(expected.values())


def _eos_options(bootstrap, topic, **extra):
    return parse_sink_options({"kafka.bootstrap.servers": bootstrap, "topic": topic,
                               "exactlyOnce": "true", "kafka.transactional.id": "pykafka-test",
                               **extra})


def _eos_setup(bootstrap, name, partitions=1, **extra):
    """A new topic, the exactly-once options that write to it, a new query id."""
    topic = unique_topic_name(name)
    create_topic(bootstrap, topic, partitions)
    return topic, _eos_options(bootstrap, topic, **extra), str(uuid.uuid4())


def _task(options, query_id, batch_id, task, values):
    batch = pa.record_batch({"value": pa.array(values, pa.binary())})
    return write_exactly_once(options, Columns(), iter([batch]), query_id=query_id,
                              batch_id=batch_id, task=task)


@pytest.mark.skip_on_embedded("transactions and read_committed need real Kafka")
def test_exactly_once_commit_recovers_after_a_crash_between_marker_and_end_txn(
        bootstrap_servers):
    topic, options, query = _eos_setup(bootstrap_servers, "sink-eos-marker", 2)
    messages = [_task(options, query, 0, t, [b"t%d-%d" % (t, i) for i in range(5)])
                for t in range(2)]
    assert all(m.transaction is not None and m.total == 5 for m in messages)
    # The driver recorded the commit, then crashed before any EndTxn.
    entries = [(m.task, m.transaction.producer_id, m.transaction.producer_epoch)
               for m in messages]
    with MarkerStore(options.client_config, marker_group("pykafka-test", query)) as store:
        store.commit({(topic, 0): (1, encode_marker(0, entries))})
    assert read_back(bootstrap_servers, topic, committed_only=True) == []
    # The restart runs batch 0 again: the tasks see the marker and write nothing...
    again = [_task(options, query, 0, t, [b"dup"]) for t in range(2)]
    assert all(m.skipped and m.transaction is None for m in again)
    # ...and the driver completes the recorded commit.
    commit_batch(options, again, 0)
    got = sorted(r.value for r in read_back(bootstrap_servers, topic, committed_only=True))
    assert got == sorted(b"t%d-%d" % (t, i) for t in range(2) for i in range(5))
    commit_batch(options, again, 0)  # once more: committing a committed batch changes nothing
    assert len(read_back(bootstrap_servers, topic, committed_only=True)) == 10

    # Batch 1 fails: abort() takes back what the tasks wrote; a slot whose task failed is fenced.
    done = _task(options, query, 1, 0, [b"aborted"])
    abort_batch(options, [done, None], 1)
    assert len(read_back(bootstrap_servers, topic, committed_only=True)) == 10
    with MarkerStore(options.client_config, marker_group("pykafka-test", query)) as store:
        assert store.committed_batches() == 1


def _values(bootstrap, topic) -> Counter:
    return Counter(r.value for r in read_back(bootstrap, topic, committed_only=True))


def _rows(batch, tasks=3, per_task=4):
    return {t: [b"b%d-t%d-%d" % (batch, t, i) for i in range(per_task)] for t in range(tasks)}


@pytest.mark.skip_on_embedded("transactions and read_committed need real Kafka")
@pytest.mark.parametrize("in_memory", [True, False],
                         ids=["rows-held-in-memory", "rows-held-on-disk"])
def test_exactly_once_batch_committed_in_part_writes_only_the_aborted_rows_again(
        bootstrap_servers, in_memory, monkeypatch, tmp_path, caplog):
    # Issue 18 item 4: the broker aborted one of a batch's transactions before the driver's
    # EndTxn (the batch outlasted kafka.transaction.timeout.ms). Before, the marker was set back
    # and the restart wrote the whole batch again: the committed tasks' records twice.
    if not in_memory:   # rows past the limit are held on local disk
        monkeypatch.setattr(exactly_once, "_REPAIR_HOLD_BYTES", 0)
        monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    topic, options, query = _eos_setup(bootstrap_servers, "sink-eos-fenced", 2)
    rows = _rows(4)
    messages = [_task(options, query, 4, t, rows[t]) for t in range(3)]
    assert all(m.digest and m.transaction for m in messages)
    # What the coordinator does to a transaction open longer than its timeout: fence and abort.
    abort_stale_transaction(options.client_config, transactional_id("pykafka-test", query, 1),
                            10_000)
    with pytest.raises(TransactionCommitError) as info:
        commit_batch(options, messages, 4)
    text = str(info.value)
    assert "batch 4 was committed only in part" in text and "task 1" in text, text
    assert "1 of its 3 transaction(s)" in text and "The 2 other(s) are committed" in text
    assert _values(bootstrap_servers, topic) == Counter(rows[0] + rows[2])
    with MarkerStore(options.client_config, marker_group("pykafka-test", query)) as store:
        assert store.committed_batches() == 5     # kept: the restart repairs the batch

    # The restart runs batch 4 again, with the same rows per task.
    with caplog.at_level(logging.INFO, logger=exactly_once.__name__):
        again = [_task(options, query, 4, t, rows[t]) for t in range(3)]
    spilled = [r for r in caplog.records if "held on local disk" in r.getMessage()]
    assert len(spilled) == (0 if in_memory else 3)
    assert all(str(tmp_path) in r.getMessage() for r in spilled)
    assert os.listdir(tmp_path) == []                       # each task deleted its file
    assert [m.skipped for m in again] == [True, False, True]
    assert again[0].matched == messages[0].digest and again[2].matched == messages[2].digest
    assert again[1].repair_round == 1 and again[1].digest == messages[1].digest
    assert again[1].transaction.transactional_id.endswith("-1.r1")
    commit_batch(options, again, 4)
    expected = Counter(rows[0] + rows[1] + rows[2])
    assert _values(bootstrap_servers, topic) == expected        # each record once
    # The log, aborted records included: task 1's first write (4 records) besides the 12.
    # Tasks 0 and 2 wrote nothing, wherever their rows were held.
    assert len(read_back(bootstrap_servers, topic)) == 16

    # Spark's commit log missed it once more: a third run writes nothing and changes nothing.
    third = [_task(options, query, 4, t, [b"other rows"]) for t in range(3)]
    assert all(m.skipped and m.transaction is None and m.matched is None for m in third)
    commit_batch(options, third, 4)
    # The next batch is written as always.
    commit_batch(options, [_task(options, query, 5, 1, [b"next"])], 5)
    assert _values(bootstrap_servers, topic) == expected + Counter([b"next"])


def _lso_reached_end(bootstrap, topic, deadline_s=90.0) -> float:
    """Seconds until read_committed's end offsets (the LSO) equal the log ends: no open
    transaction is left on ``topic``. The deadline covers a broker that looks for timed-out
    transactions once a minute (Kafka 2.2's default; the harness's brokers look every 10 s):
    the abort can come a whole interval after the timeout."""
    t0 = time.monotonic()
    plain = KafkaConsumer(bootstrap_servers=bootstrap)
    committed = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(plain.partitions_for_topic(topic))]
        while True:
            if committed.end_offsets(tps) == plain.end_offsets(tps):
                return time.monotonic() - t0
            assert time.monotonic() - t0 < deadline_s, "the broker did not abort the transactions"
            time.sleep(0.5)
    finally:
        plain.close()
        committed.close()


@pytest.mark.skip_on_embedded("transactions and read_committed need real Kafka")
def test_exactly_once_driver_dead_between_end_txns_past_the_timeout_loses_and_repeats_nothing(
        bootstrap_servers):
    # Issue 18 item 4: the driver recorded batch 0 in the marker, committed task 0's transaction
    # and died; it came back after kafka.transaction.timeout.ms, when the broker had aborted
    # the other two (really, by its timeout). Then the repair's driver died too, after
    # recording the repair and before its EndTxn, and its transactions were aborted as well.
    topic, options, query = _eos_setup(bootstrap_servers, "sink-eos-endtxn", 3,
                                       **{"kafka.transaction.timeout.ms": "2000"})
    rows = _rows(0)
    messages = [_task(options, query, 0, t, rows[t]) for t in range(3)]
    with MarkerStore(options.client_config, marker_group("pykafka-test", query)) as store:
        store.commit({(topic, 0): (1, encode_marker(0, [
            MarkerEntry(m.task, m.transaction.producer_id, m.transaction.producer_epoch,
                        m.digest) for m in messages]))})
    end_transaction(options.client_config, messages[0].transaction, commit=True)
    waited = _lso_reached_end(bootstrap_servers, topic)   # the broker's own abort
    assert _values(bootstrap_servers, topic) == Counter(rows[0]), waited

    again = [_task(options, query, 0, t, rows[t]) for t in range(3)]
    assert [m.skipped for m in again] == [True, False, False]
    # The repair is recorded, then its driver dies before EndTxn, and its transactions time
    # out too (done as the coordinator does it: Kafka 2.2 looks for timed-out transactions
    # once a minute, so waiting for it twice would make this test two minutes long there).
    with MarkerStore(options.client_config, marker_group("pykafka-test", query)) as store:
        text = next(m for o, m in store.fetch().values() if o == 1)
        _, first = decode_marker(text)
        store.commit({(topic, 0): (1, encode_marker(0, first + [
            MarkerEntry(m.task, m.transaction.producer_id, m.transaction.producer_epoch,
                        m.digest, m.repair_round) for m in again[1:]]))})
    for m in again[1:]:
        abort_stale_transaction(options.client_config, m.transaction.transactional_id, 10_000)
    assert _values(bootstrap_servers, topic) == Counter(rows[0])

    third = [_task(options, query, 0, t, rows[t]) for t in range(3)]
    assert [m.skipped for m in third] == [True, False, False]
    assert {m.repair_round for m in third[1:]} == {2}
    commit_batch(options, third, 0)
    assert _values(bootstrap_servers, topic) == Counter(rows[0] + rows[1] + rows[2])


@pytest.mark.skip_on_embedded("transactions and read_committed need real Kafka")
def test_exactly_once_repair_whose_rows_are_grouped_otherwise_loses_nothing(
        bootstrap_servers, caplog):
    # The limit of the repair: a re-run whose tasks hold other groups of rows than the first
    # run's cannot tell committed rows from the others, so it writes them all again: some
    # records twice, none lost, and a warning says so.
    topic, options, query = _eos_setup(bootstrap_servers, "sink-eos-regroup", 2)
    rows = _rows(2, tasks=2)
    messages = [_task(options, query, 2, t, rows[t]) for t in range(2)]
    abort_stale_transaction(options.client_config, transactional_id("pykafka-test", query, 1),
                            10_000)
    with pytest.raises(TransactionCommitError):
        commit_batch(options, messages, 2)
    regrouped = [_task(options, query, 2, 0, rows[0] + rows[1])]
    assert regrouped[0].transaction is not None
    with caplog.at_level("WARNING", logger="kafka_source.write.exactly_once"):
        commit_batch(options, regrouped, 2)
    assert "may now be in Kafka twice" in caplog.text
    assert _values(bootstrap_servers, topic) == Counter(rows[0] * 2 + rows[1])


@AVAILABLE_NOW_IN_MICRO_BATCHES
@pytest.mark.skip_on_embedded("transactions and read_committed need real Kafka")
def test_exactly_once_stream_outlasting_the_transaction_timeout_is_repaired_on_restart(
        spark, bootstrap_servers, tmp_path):
    # Issue 18 item 4, end to end: micro-batch 0 has two write tasks; task 1 is held up until
    # the broker has aborted task 0's transaction (kafka.transaction.timeout.ms 6 s), so the
    # commit commits task 1's only and fails the query. The restart (with a longer timeout)
    # writes task 0's rows again and not task 1's. Task 1's transaction must outlive the time
    # from its first record to the driver's commit: with 2 s, a CI run whose two lanes kept
    # both cores busy saw the broker abort it too ("2 of its 2 transaction(s)").
    from pyspark.errors import StreamingQueryException
    from pyspark.sql.functions import udf

    source, out = unique_topic_name("sink-eos-slow-src"), unique_topic_name("sink-eos-slow")
    create_topic(bootstrap_servers, source, 2)
    create_topic(bootstrap_servers, out, 2)
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers)
    for p in range(2):
        for i in range(10):
            producer.send(source, value=b"p%d-%d" % (p, i), partition=p)
    producer.close()
    checkpoint = str(tmp_path / "ck")
    held_up: list = []      # per Python worker (a copy each): wait once

    def run(timeout_ms: str, hold_up: bool):
        stream = (spark.readStream.format("pykafka")
                  .option("kafka.bootstrap.servers", bootstrap_servers)
                  .option("subscribe", source).option("startingOffsets", "earliest")
                  .option("minPartitions", "2").load())
        if hold_up:
            @udf("binary")
            def held(value, partition):
                # In the task of partition 1: block until the output topic has records and no
                # open transaction (the broker aborted task 0's). Defined here, not at module
                # level: the test module is not importable in Spark's Python workers.
                if partition == 1 and not held_up:
                    import time as clock

                    from kafka import KafkaConsumer as Consumer, TopicPartition as TP

                    plain = Consumer(bootstrap_servers=bootstrap_servers)
                    done = Consumer(bootstrap_servers=bootstrap_servers,
                                    isolation_level="read_committed")
                    tps = [TP(out, p) for p in range(2)]
                    t0 = clock.monotonic()
                    while clock.monotonic() - t0 < 150:
                        ends = plain.end_offsets(tps)
                        if sum(ends.values()) and done.end_offsets(tps) == ends:
                            break
                        clock.sleep(0.5)
                    plain.close()
                    done.close()
                    held_up.append(True)
                return value
            stream = stream.withColumn("value", held("value", "partition"))
        query = (stream.selectExpr("CAST(partition AS STRING) AS key", "value")
                 .writeStream.format("pykafka")
                 .option("kafka.bootstrap.servers", bootstrap_servers).option("topic", out)
                 .option("exactlyOnce", "true").option("kafka.transactional.id", "pykafka-slow")
                 .option("kafka.transaction.timeout.ms", timeout_ms)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(300), "the stream did not finish"
        except StreamingQueryException:
            pass    # query.exception() says what
        return query

    first = run("6000", hold_up=True)
    error = str(first.exception())
    assert "was committed only in part" in error, error[-3000:]
    assert _values(bootstrap_servers, out) == Counter(b"p1-%d" % i for i in range(10))

    again = run("60000", hold_up=False)
    assert again.exception() is None, again.exception()
    assert _values(bootstrap_servers, out) == \
        Counter(b"p%d-%d" % (p, i) for p in range(2) for i in range(10))
    # Aborted in the log: task 0's first write only. The re-run's task 1 knew its rows for
    # committed ones by their digest before writing them.
    assert len(read_back(bootstrap_servers, out)) == 30


@pytest.mark.once     # a Spark of its own (speculation is set at start): CI's first pass only
@pytest.mark.skip_on_embedded("transactions need real Kafka")
def test_exactly_once_stream_with_speculative_execution_fails_before_writing(
        bootstrap_servers, tmp_path):
    # Issue 18 item 3: speculation made two attempts of a task fence each other. The setting
    # is the SparkContext's, so the session runs in a fresh process.
    from .fresh_process import run_script

    topic = unique_topic_name("sink-eos-speculation")
    create_topic(bootstrap_servers, topic, 1)
    out = run_script("speculation_exactly_once.py", bootstrap_servers, topic, cwd=tmp_path,
                     timeout_s=240)
    error = (tmp_path / "error.txt").read_text()
    assert out["failed"] == "True"
    assert "spark.speculation=true" in error and "'exactlyOnce'" in error, error[-3000:]
    assert read_back(bootstrap_servers, topic) == []          # not even an aborted record


@pytest.mark.skip_on_embedded("transactions need real Kafka")
def test_exactly_once_transaction_timeout_above_the_brokers_maximum_names_both(
        bootstrap_servers):
    # Issue 18 item 4. The test brokers keep Kafka's default transaction.max.timeout.ms (15 min).
    _, options, query = _eos_setup(bootstrap_servers, "sink-eos-timeout",
                                   **{"kafka.transaction.timeout.ms": "900001"})
    with pytest.raises(Exception) as info:
        _task(options, query, 0, 0, [b"x"])
    text = str(info.value)
    assert "INVALID_TRANSACTION_TIMEOUT" in text and "(900001 ms" in text
    assert "at most the brokers' transaction.max.timeout.ms" in text


@pytest.mark.skip_on_embedded("transactions need real Kafka")
def test_exactly_once_task_of_a_checkpoint_older_than_the_marker_fails_without_writing(
        bootstrap_servers):
    # Issue 18 item 3 (D): the marker records batches 0-4, an older checkpoint runs batch 2.
    from kafka_source.write.exactly_once import CheckpointBehindMarkerError

    topic, options, query = _eos_setup(bootstrap_servers, "sink-eos-behind")
    with MarkerStore(options.client_config, marker_group("pykafka-test", query)) as store:
        store.commit({(topic, 0): (5, encode_marker(4, []))})
    with pytest.raises(CheckpointBehindMarkerError, match="micro-batches 2 to 4 would be skipped"):
        _task(options, query, 2, 0, [b"x"])
    assert _task(options, query, 4, 0, [b"x"]).skipped     # the normal re-run of the last one
    assert read_back(bootstrap_servers, topic) == []
