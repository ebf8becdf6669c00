"""Batch reads through Spark compared with what a plain kafka-python consumer reads.

Runs on the selected broker (external, testcontainers or the embedded Tansu broker). Where Tansu
deviates from Kafka (end offsets of multi-record batches, deleting records) the affected test skips
on the embedded broker only; the behaviour itself is also covered by unit tests.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from kafka_source.testing import create_topic, unique_topic_name

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
# Record timestamps an hour back, on a whole second: real Kafka deletes records older than the
# topic's retention (7 days by default) and rejects ones over an hour ahead of its clock.
BASE_TS = (int(time.time()) - 3600) * 1000


def varied_records(n: int, seed: int = 7):
    """Keys (some null), values (some null or empty), headers (repeated, unicode, empty)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        key = None if i % 7 == 0 and i % 11 else f"key-{i % 13}".encode()
        if i % 11 == 0:
            value = None  # tombstone
        elif i % 5 == 0:
            value = b""
        else:
            value = json.dumps({"i": i, "pad": "x" * rnd.randint(0, 300)}).encode()
        headers = []
        if i % 3 == 0:
            headers = [("trace", f"t{i}".encode()), ("trace", b"again"), ("ключ", "значение".encode()),
                       ("empty", b"")]
        out.append((key, value, headers, BASE_TS + i * 10))
    return out


def produce(bootstrap, topic, records, *, partition_of=lambda i: 0, compression=None,
            one_per_batch=False):
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=compression,
                             linger_ms=0 if one_per_batch else 20, acks="all")
    try:
        for i, (key, value, headers, ts) in enumerate(records):
            future = producer.send(topic, key=key, value=value, headers=headers or None,
                                   partition=partition_of(i), timestamp_ms=ts)
            if one_per_batch:
                future.get(timeout=30)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)


def consume_all(bootstrap, topic, partitions, expected_count, timeout_s=60):
    """What a plain kafka-python consumer reads from the start of the given partitions."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        rows = []
        deadline = time.monotonic() + timeout_s
        while len(rows) < expected_count and time.monotonic() < deadline:
            for _tp, msgs in consumer.poll(timeout_ms=500).items():
                for m in msgs:
                    rows.append((m.partition, m.offset, m.key, m.value,
                                 tuple((k, v) for k, v in m.headers) or None, m.timestamp,
                                 m.timestamp_type))
        assert len(rows) == expected_count, f"plain consumer read {len(rows)} of {expected_count}"
        return sorted(rows, key=lambda r: (r[0], r[1]))
    finally:
        consumer.close()


def spark_rows(df):
    rows = []
    for r in df.collect():
        ts = r.timestamp
        if ts.tzinfo is None:  # Spark returns session-local naive datetimes
            ts = ts.astimezone(dt.timezone.utc)
        millis = round(ts.timestamp() * 1000)
        headers = None if r.headers is None else tuple((h.key, bytes(h.value) if h.value is not None else None)
                                                       for h in r.headers)
        rows.append((r.partition, r.offset, None if r.key is None else bytes(r.key),
                     None if r.value is None else bytes(r.value), headers, millis,
                     r.timestampType))
    return sorted(rows, key=lambda r: (r[0], r[1]))


def reader(spark, bootstrap, **options):
    rd = spark.read.format("pykafka").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        rd = rd.option(k, v)
    return rd.load()


def end_offsets_json(topic, rows, partitions):
    ends = {str(p): 0 for p in partitions}
    for row in rows:
        ends[str(row[0])] = max(ends[str(row[0])], row[1] + 1)
    return json.dumps({topic: ends})


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c or "none")
def test_each_codec_matches_plain_consumer(spark, bootstrap_servers, codec):
    topic = unique_topic_name(f"codec-{codec or 'none'}")
    create_topic(bootstrap_servers, topic, partitions=3)
    records = varied_records(600)
    produce(bootstrap_servers, topic, records, partition_of=lambda i: i % 3, compression=codec)
    expected = consume_all(bootstrap_servers, topic, [0, 1, 2], len(records))
    # Explicit ends: multi-record batches, whose end offsets the embedded broker misreports.
    df = reader(spark, bootstrap_servers, subscribe=topic, includeHeaders="true",
                endingOffsets=end_offsets_json(topic, expected, [0, 1, 2]))
    got = spark_rows(df)
    assert got == expected
    assert {r[1] for r in got if r[0] == 0} == set(range(200))


@pytest.mark.smoke      # make check's smoke test
def test_schema_is_sparks_kafka_schema(spark, bootstrap_servers):
    topic = unique_topic_name("schema")
    create_topic(bootstrap_servers, topic)
    df = reader(spark, bootstrap_servers, subscribe=topic)
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,"
                                        "partition:int,offset:bigint,timestamp:timestamp,"
                                        "timestampType:int>")
    df = reader(spark, bootstrap_servers, subscribe=topic, includeHeaders="true")
    assert df.schema.simpleString().endswith(",headers:array<struct<key:string,value:binary>>>")
    assert df.count() == 0


@pytest.mark.smoke      # make check's smoke test
def test_default_range_reads_everything_single_record_batches(spark, bootstrap_servers):
    topic = unique_topic_name("whole")
    create_topic(bootstrap_servers, topic, partitions=2)
    records = varied_records(60)
    produce(bootstrap_servers, topic, records, partition_of=lambda i: i % 2, one_per_batch=True)
    expected = consume_all(bootstrap_servers, topic, [0, 1], len(records))
    got = spark_rows(reader(spark, bootstrap_servers, subscribe=topic, includeHeaders="true"))
    assert got == expected


def test_default_range_reads_everything_multi_record_batches(spark, bootstrap_servers,
                                                             requires_exact_end_offsets):
    topic = unique_topic_name("whole-batched")
    create_topic(bootstrap_servers, topic, partitions=2)
    records = varied_records(500)
    produce(bootstrap_servers, topic, records, partition_of=lambda i: i % 2, compression="lz4")
    expected = consume_all(bootstrap_servers, topic, [0, 1], len(records))
    got = spark_rows(reader(spark, bootstrap_servers, subscribe=topic, includeHeaders="true"))
    assert got == expected


def test_partition_larger_than_one_fetch_response(spark, bootstrap_servers):
    # Responses of more than kafka-python's default frame limit (1,000,000 bytes) must be
    # accepted: one full max.partition.fetch.bytes (1 MiB) fetch is already larger.
    topic = unique_topic_name("large")
    create_topic(bootstrap_servers, topic, partitions=1)
    n, size = 3000, 1000
    produce(bootstrap_servers, topic,
            [(None, (b"%06d" % i) * (size // 6), [], BASE_TS + i) for i in range(n)])
    df = reader(spark, bootstrap_servers, subscribe=topic,
                endingOffsets=json.dumps({topic: {"0": n}}))
    row = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes",
                        "count(DISTINCT offset) AS offsets", "max(offset) AS last").first()
    assert (row.n, row.offsets, row.last) == (n, n, n - 1)
    assert row.bytes == n * (size // 6) * 6


@pytest.fixture(scope="module")
def sliced_topic(bootstrap_servers):
    topic = unique_topic_name("slices")
    create_topic(bootstrap_servers, topic, partitions=3)
    records = varied_records(90)
    produce(bootstrap_servers, topic, records, partition_of=lambda i: i % 3, one_per_batch=True)
    return topic


def offsets_of(df):
    return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())


def test_assign_with_json_offset_slices(spark, bootstrap_servers, sliced_topic):
    t = sliced_topic
    df = reader(spark, bootstrap_servers, assign=json.dumps({t: [0, 2]}),
                startingOffsets=json.dumps({t: {"0": 5, "2": -2}}),
                endingOffsets=json.dumps({t: {"0": 9, "2": 3}}))
    assert offsets_of(df) == [(0, o) for o in range(5, 9)] + [(2, o) for o in range(0, 3)]
    # -1 means latest for the end
    df = reader(spark, bootstrap_servers, assign=json.dumps({t: [1]}),
                startingOffsets=json.dumps({t: {"1": 28}}), endingOffsets=json.dumps({t: {"1": -1}}))
    assert offsets_of(df) == [(1, 28), (1, 29)]
    # values come back intact through a slice
    row = reader(spark, bootstrap_servers, assign=json.dumps({t: [0]}),
                 startingOffsets=json.dumps({t: {"0": 1}}),
                 endingOffsets=json.dumps({t: {"0": 2}})).collect()
    assert len(row) == 1 and json.loads(bytes(row[0].value))["i"] == 3


def test_subscribe_pattern(spark, bootstrap_servers):
    prefix = unique_topic_name("pattern")
    for suffix, n in (("a", 3), ("b", 4)):
        create_topic(bootstrap_servers, f"{prefix}-{suffix}")
        produce(bootstrap_servers, f"{prefix}-{suffix}", varied_records(n), one_per_batch=True)
    create_topic(bootstrap_servers, f"other-{prefix}")
    produce(bootstrap_servers, f"other-{prefix}", varied_records(5), one_per_batch=True)
    df = reader(spark, bootstrap_servers, subscribePattern=f"{prefix}-.*")
    counts = {r["topic"]: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {f"{prefix}-a": 3, f"{prefix}-b": 4}


NO_TIMESTAMP_SEARCH = ("it does not implement ListOffsets by timestamp (it answers offset 0 for "
                       "every timestamp); tests/unit/test_offsets.py covers the resolution")


def test_record_timestamps(spark, bootstrap_servers, sliced_topic):
    t = sliced_topic
    # partition 0 holds records i = 0, 3, 6, ... with timestamps BASE_TS + i*10 at offsets i/3
    rows = reader(spark, bootstrap_servers, assign=json.dumps({t: [0]})).collect()
    assert len(rows) == 30
    for r in rows:
        assert round(r.timestamp.timestamp() * 1000) == BASE_TS + r.offset * 3 * 10
        assert r.timestampType == 0


@pytest.mark.skip_on_embedded(NO_TIMESTAMP_SEARCH)
def test_offsets_by_timestamp(spark, bootstrap_servers, sliced_topic):
    t = sliced_topic
    # startingTimestamp: first offset whose timestamp >= the given one
    df = reader(spark, bootstrap_servers, assign=json.dumps({t: [0]}),
                startingTimestamp=str(BASE_TS + 12 * 10 - 5),
                endingTimestamp=str(BASE_TS + 21 * 10))
    assert offsets_of(df) == [(0, 4), (0, 5), (0, 6)]
    df = reader(spark, bootstrap_servers, assign=json.dumps({t: [0, 1]}),
                startingOffsetsByTimestamp=json.dumps({t: {"0": BASE_TS + 27 * 10,
                                                           "1": BASE_TS}}),
                endingOffsetsByTimestamp=json.dumps({t: {"0": BASE_TS + 33 * 10,
                                                         "1": BASE_TS + 4 * 10}}))
    assert offsets_of(df) == [(0, 9), (0, 10), (1, 0)]


@pytest.mark.skip_on_embedded(NO_TIMESTAMP_SEARCH)
def test_timestamp_after_last_record(spark, bootstrap_servers, sliced_topic):
    t = sliced_topic
    late = str(BASE_TS + 10_000_000)
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        reader(spark, bootstrap_servers, assign=json.dumps({t: [0]}),
               startingTimestamp=late).collect()
    df = reader(spark, bootstrap_servers, assign=json.dumps({t: [0]}), startingTimestamp=late,
                startingOffsetsByTimestampStrategy="latest")
    assert df.count() == 0


def test_min_partitions_splits_tasks_without_changing_rows(spark, bootstrap_servers, sliced_topic):
    t = sliced_topic
    plain = reader(spark, bootstrap_servers, subscribe=t)
    split = reader(spark, bootstrap_servers, subscribe=t, minPartitions="10")
    capped = reader(spark, bootstrap_servers, subscribe=t, maxRecordsPerPartition="4")
    assert plain.rdd.getNumPartitions() == 1   # 90 records are not worth more than one task
    # three equal ranges: each gets round(30 / 90 * 10) = 3 tasks, as in Spark ("approximately")
    assert split.rdd.getNumPartitions() == 9
    assert capped.rdd.getNumPartitions() == 24  # 3 partitions x ceil(30 / 4)
    expected = offsets_of(plain)
    assert len(expected) == 90
    assert offsets_of(split) == expected and offsets_of(capped) == expected


def test_errors_name_the_topic_or_partition(spark, bootstrap_servers, sliced_topic):
    t = sliced_topic
    with pytest.raises(Exception, match=r"Topic 'no-such-topic-[0-9a-f]+' does not exist"):
        reader(spark, bootstrap_servers, subscribe=unique_topic_name("no-such-topic")).collect()
    with pytest.raises(Exception, match=rf"{t}-7.*has partitions \[0, 1, 2\]"):
        reader(spark, bootstrap_servers, assign=json.dumps({t: [7]})).collect()
    with pytest.raises(Exception, match=rf"{t}-5.*has partitions \[0, 1, 2\]"):
        reader(spark, bootstrap_servers, subscribe=t,
               startingOffsets=json.dumps({t: {"0": 0, "1": 0, "2": 0, "5": 0}})).collect()
    with pytest.raises(Exception, match=rf"Ending offset 2 of {t}-0 is before its starting offset 5"):
        reader(spark, bootstrap_servers, assign=json.dumps({t: [0]}),
               startingOffsets=json.dumps({t: {"0": 5}}),
               endingOffsets=json.dumps({t: {"0": 2}})).collect()
    with pytest.raises(Exception, match="startingOffsets.*latest"):
        reader(spark, bootstrap_servers, subscribe=t, startingOffsets="latest").collect()


def test_unreachable_bootstrap_fails_in_bounded_time_naming_address(spark):
    started = time.monotonic()
    with pytest.raises(Exception, match=r"127\.0\.0\.1:9.*kafka\.bootstrap\.servers"):
        reader(spark, "127.0.0.1:9", subscribe="x",
               **{"kafka.request.timeout.ms": "3000"}).collect()
    assert time.monotonic() - started < 60


def test_data_loss_fails_or_reads_what_is_left(spark, bootstrap_servers, skip_on_embedded):
    skip_on_embedded("it does not implement DeleteRecords, so the log start cannot be moved; "
                     "tests/unit/test_offsets.py and test_fetcher.py cover both behaviours")
    topic = unique_topic_name("dataloss")
    create_topic(bootstrap_servers, topic)
    produce(bootstrap_servers, topic, varied_records(20), one_per_batch=True)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        admin.delete_records({TopicPartition(topic, 0): 8})
    finally:
        admin.close()
    start = json.dumps({topic: {"0": 2}})
    with pytest.raises(Exception, match=rf"Offsets 2 to 7 of {topic}-0 are no longer in Kafka"):
        reader(spark, bootstrap_servers, subscribe=topic, startingOffsets=start).collect()
    df = reader(spark, bootstrap_servers, subscribe=topic, startingOffsets=start,
                failOnDataLoss="false")
    assert offsets_of(df) == [(0, o) for o in range(8, 20)]


def test_bad_options_fail_when_the_dataframe_is_defined(spark, bootstrap_servers):
    with pytest.raises(Exception, match=r"Only one of .*'subscribe' and 'assign'"):
        reader(spark, bootstrap_servers, subscribe="a", assign='{"a":[0]}')
    with pytest.raises(Exception, match=r"'assign' is not valid JSON"):
        reader(spark, bootstrap_servers, assign="{a:[0]}")


@pytest.fixture(scope="module")
def transactional_topic(bootstrap_servers):
    """Committed 0-4, aborted 5-7, committed 8-9 (record numbers), with markers in between."""
    topic = unique_topic_name("txn")
    create_topic(bootstrap_servers, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers,
                             transactional_id=unique_topic_name("txn-id"), linger_ms=0)
    try:
        producer.init_transactions()
        for numbers, commit in ((range(0, 5), True), (range(5, 8), False), (range(8, 10), True)):
            producer.begin_transaction()
            for i in numbers:
                producer.send(topic, key=b"k", value=f"r{i}".encode(), partition=0).get(timeout=30)
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close(timeout=10)
    return topic


def values_of(df):
    return [bytes(r.value).decode() for r in df.orderBy("offset").collect()]


def test_transaction_markers_are_never_records(spark, bootstrap_servers, transactional_topic):
    df = reader(spark, bootstrap_servers, subscribe=transactional_topic)
    assert values_of(df) == [f"r{i}" for i in range(10)]
    offsets = [r.offset for r in df.orderBy("offset").collect()]
    # three markers sit between/after the data records, so the offsets have gaps
    assert offsets[:5] == [0, 1, 2, 3, 4] and offsets[5] == 6 and offsets[8] == 10


def test_read_committed_hides_aborted_records(spark, bootstrap_servers, transactional_topic,
                                              requires_read_committed_isolation):
    df = reader(spark, bootstrap_servers, subscribe=transactional_topic,
                **{"kafka.isolation.level": "read_committed"})
    assert values_of(df) == [f"r{i}" for i in (0, 1, 2, 3, 4, 8, 9)]
