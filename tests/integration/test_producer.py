"""The sink's producer (:mod:`kafka_source.write.producer`) against a real broker, read back with
kafka-python's consumer (an independent implementation of the format and of read_committed).

Runs on the selected broker; what the embedded Tansu broker does not do like Kafka
(read_committed filtering, last stable offsets) skips there only.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.protocol.consumer import FetchRequest
from kafka.record.memory_records import MemoryRecords

from kafka_source.config.client_config import client_config_from_options
from kafka_source.config.producer_settings import ProducerSettings
from kafka_source.errors import ProduceError, TopicError
from kafka_source.testing import create_topic, unique_topic_name
from kafka_source.wire.net.client import BrokerClient
from kafka_source.write.producer import (Producer, TransactionFencedError,
                                         abort_stale_transaction, end_transaction,
                                         end_transactions)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


@pytest.fixture
def config(bootstrap_servers):
    return client_config_from_options({"kafka.bootstrap.servers": bootstrap_servers})


def rows(n: int, start: int = 0):
    """Values (some null, some empty), keys (some null), headers (some absent, a null value)."""
    idx = range(start, start + n)
    values = pa.array([None if i % 101 == 0 else (b"" if i % 13 == 0 else
                       f"value-{i:08d}-".encode() + b"x" * (i % 90)) for i in idx], pa.binary())
    keys = pa.array([None if i % 7 == 0 else f"key-{i % 1000}".encode() for i in idx],
                    pa.binary())
    headers = pa.array([[{"key": "n", "value": str(i).encode()}, {"key": "nil", "value": None}]
                        if i % 3 == 0 else None for i in idx], HEADER_TYPE)
    return values, keys, headers


def expected(i: int):
    value = None if i % 101 == 0 else (b"" if i % 13 == 0 else
                                       f"value-{i:08d}-".encode() + b"x" * (i % 90))
    key = None if i % 7 == 0 else f"key-{i % 1000}".encode()
    headers = [("n", str(i).encode()), ("nil", None)] if i % 3 == 0 else []
    return key, value, headers


def consume(bootstrap, topic, partitions, count, *, read_committed=False, timeout_s=120):
    """Every record of ``topic`` (up to ``count`` of them) as {partition: [records]}."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             isolation_level="read_committed" if read_committed
                             else "read_uncommitted", max_partition_fetch_bytes=8 << 20)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out = {p: [] for p in range(partitions)}
        got = 0
        deadline = time.monotonic() + timeout_s
        while got < count and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=1000).items():
                out[tp.partition].extend(records)
                got += len(records)
        return out
    finally:
        consumer.close()


def end_offsets(bootstrap, topic, partitions, *, read_committed=False):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed"
                             if read_committed else "read_uncommitted")
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: o for tp, o in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def raw_batches(config, topic, partition):
    """The record batches of a partition as stored (kafka-python's batch reader)."""
    with BrokerClient(config) as client:
        leader = client.leaders([(topic, partition)])[(topic, partition)]
        FT = FetchRequest.FetchTopic
        request = FetchRequest(
            replica_id=-1, max_wait_ms=1000, min_bytes=1, max_bytes=50 << 20, isolation_level=0,
            session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
            topics=[FT(topic=topic, partitions=[FT.FetchPartition(
                partition=partition, current_leader_epoch=-1, fetch_offset=0,
                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=50 << 20)])],
            max_version=12)
        response = client.send(leader, request)
    records = MemoryRecords(bytes(response.responses[0].partitions[0].records))
    batches = []
    while records.has_next():
        batches.append(records.next_batch())
    return batches


def write(config, topic, n, partitions, settings, *, chunk=10_000, start=0):
    with Producer(config, settings) as producer:
        for lo in range(start, start + n, chunk):
            size = min(chunk, start + n - lo)
            values, keys, headers = rows(size, lo)
            parts = (np.arange(lo, lo + size) % partitions).astype(np.int32)
            producer.send(topic, parts, values, keys, headers)
        producer.flush()
        return producer.acked(), producer.producer_id


@pytest.mark.parametrize("codec", CODECS)
def test_100k_records_arrive_complete_and_in_order_with_each_codec(bootstrap_servers, config,
                                                                   codec):
    topic = unique_topic_name(f"producer-{codec}")
    create_topic(bootstrap_servers, topic, partitions=4)
    n = 100_000
    acked, _ = write(config, topic, n, 4, ProducerSettings(compression_type=codec))
    assert acked == {(topic, p): n // 4 for p in range(4)}
    got = consume(bootstrap_servers, topic, 4, n)
    assert sum(len(r) for r in got.values()) == n
    for p, records in got.items():
        assert [r.offset for r in records] == list(range(n // 4))
        for j, r in enumerate(records):
            key, value, headers = expected(p + 4 * j)
            assert (r.key, r.value, list(r.headers)) == (key, value, headers), (p, j)


def test_idempotent_batches_carry_the_producer_id_and_sequences(bootstrap_servers, config):
    topic = unique_topic_name("producer-idempotent")
    create_topic(bootstrap_servers, topic, partitions=2)
    acked, producer_id = write(config, topic, 20_000, 2, ProducerSettings(batch_size=16_384))
    assert producer_id >= 0
    for p in range(2):
        batches = raw_batches(config, topic, p)
        assert len(batches) > 5
        sequence = 0
        for batch in batches:
            assert batch.producer_id == producer_id
            assert batch.base_sequence == sequence
            sequence += batch.last_offset_delta + 1
        assert sequence == acked[(topic, p)] == 10_000


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_each_acks_setting_writes_everything(bootstrap_servers, config, acks, skip_on_embedded):
    if acks == 0:
        skip_on_embedded("Tansu answers Produce requests with acks=0 (Kafka never does), and a "
                         "client then gets answers to requests it did not expect")
    topic = unique_topic_name(f"producer-acks{acks}")
    create_topic(bootstrap_servers, topic, partitions=4)
    n = 20_000
    settings = ProducerSettings(acks=acks, enable_idempotence=acks == -1)
    acked, producer_id = write(config, topic, n, 4, settings)
    assert sum(acked.values()) == n
    assert (producer_id >= 0) == (acks == -1)
    got = consume(bootstrap_servers, topic, 4, n)
    assert sum(len(r) for r in got.values()) == n
    batches = raw_batches(config, topic, 0)
    assert {b.producer_id for b in batches} == ({producer_id} if acks == -1 else {-1})


def test_a_transaction_is_invisible_until_committed(bootstrap_servers, config,
                                                    skip_on_embedded):
    skip_on_embedded("read_committed does not hide open transactions on Tansu")
    topic = unique_topic_name("producer-txn")
    create_topic(bootstrap_servers, topic, partitions=2)
    tid = unique_topic_name("txn")
    with Producer(config, ProducerSettings(transactional_id=tid)) as producer:
        values, keys, headers = rows(1000)
        producer.send(topic, (np.arange(1000) % 2).astype(np.int32), values, keys, headers)
        handle = producer.transaction()
    assert handle.partitions == ((topic, 0), (topic, 1))
    # written, but the last stable offset stays before it while the transaction is open
    assert end_offsets(bootstrap_servers, topic, 2) == {0: 500, 1: 500}
    assert end_offsets(bootstrap_servers, topic, 2, read_committed=True) == {0: 0, 1: 0}
    end_transactions(config, [handle], commit=True)
    end_transaction(config, handle, commit=True)     # a retried commit succeeds too
    got = consume(bootstrap_servers, topic, 2, 1000, read_committed=True)
    assert sorted(r.value for rs in got.values() for r in rs if r.value) == sorted(
        v for v in values.to_pylist() if v)
    assert sum(len(r) for r in got.values()) == 1000


def test_an_aborted_transaction_is_never_visible(bootstrap_servers, config, skip_on_embedded):
    skip_on_embedded("read_committed does not hide aborted records on Tansu")
    topic = unique_topic_name("producer-abort")
    create_topic(bootstrap_servers, topic, partitions=1)
    tid = unique_topic_name("txn")
    handles = []
    for commit, start in ((False, 0), (True, 1000)):
        with Producer(config, ProducerSettings(transactional_id=tid)) as producer:
            values, keys, headers = rows(1000, start)
            producer.send(topic, np.zeros(1000, np.int32), values, keys, headers)
            handles.append(producer.transaction())
        end_transaction(config, handles[-1], commit=commit)
    with pytest.raises(TransactionFencedError):     # the aborted one cannot be committed now
        end_transaction(config, handles[0], commit=True)
    got = consume(bootstrap_servers, topic, 1, 1000, read_committed=True)[0]
    assert [r.value for r in got] == rows(1000, 1000)[0].to_pylist()
    # both transactions' records and their two markers are in the log
    assert end_offsets(bootstrap_servers, topic, 1) == {0: 2002}


def test_ending_a_transaction_twice(bootstrap_servers, config, skip_on_embedded):
    skip_on_embedded("Tansu's transaction coordinator answers differently")
    topic = unique_topic_name("producer-end-twice")
    create_topic(bootstrap_servers, topic, partitions=1)
    tid = unique_topic_name("txn")
    with Producer(config, ProducerSettings(transactional_id=tid)) as producer:
        producer.send(topic, np.zeros(3, np.int32), pa.array([b"a", b"b", b"c"]), None, None)
        handle = producer.transaction()
    end_transaction(config, handle, commit=False)
    end_transaction(config, handle, commit=False)    # aborting again is fine
    with pytest.raises(TransactionFencedError, match="already aborted"):
        end_transaction(config, handle, commit=True)


def test_abort_stale_transaction_fences_an_open_transaction(bootstrap_servers, config,
                                                            skip_on_embedded):
    skip_on_embedded("read_committed / last stable offsets are not tracked on Tansu")
    topic = unique_topic_name("producer-stale")
    create_topic(bootstrap_servers, topic, partitions=1)
    tid = unique_topic_name("txn")
    with Producer(config, ProducerSettings(transactional_id=tid)) as producer:
        values, keys, headers = rows(100)
        producer.send(topic, np.zeros(100, np.int32), values, keys, headers)
        handle = producer.transaction()
    assert end_offsets(bootstrap_servers, topic, 1, read_committed=True) == {0: 0}
    abort_stale_transaction(config, tid, 30_000)
    # the abort marker follows the 100 records: everything is stable now, nothing committed
    assert end_offsets(bootstrap_servers, topic, 1, read_committed=True) == {0: 101}
    assert consume(bootstrap_servers, topic, 1, 1, read_committed=True, timeout_s=5)[0] == []
    with pytest.raises(TransactionFencedError, match=tid):
        end_transaction(config, handle, commit=True)


def test_a_transaction_the_broker_timed_out_cannot_be_committed(bootstrap_servers, config,
                                                                skip_on_embedded, kafka_broker):
    skip_on_embedded("last stable offsets are not tracked on Tansu")
    topic = unique_topic_name("producer-txn-timeout")
    create_topic(bootstrap_servers, topic, partitions=1)
    tid = unique_topic_name("txn")
    with Producer(config, ProducerSettings(transactional_id=tid,
                                           transaction_timeout_ms=1000)) as producer:
        producer.send(topic, np.zeros(3, np.int32), pa.array([b"a", b"b", b"c"]), None, None)
        handle = producer.transaction()
    # The broker aborts it at its next check for expired transactions (every 10 s by default):
    # the abort marker moves the last stable offset past the records.
    deadline = time.monotonic() + 90
    while end_offsets(bootstrap_servers, topic, 1, read_committed=True) == {0: 0}:
        assert time.monotonic() < deadline, "the broker never aborted the transaction"
        time.sleep(1)
    # The abort bumped the producer epoch: Kafka 4.0 answers PRODUCER_FENCED (an error code
    # KIP-588 brought in Kafka 2.7); Kafka 2.2 answers INVALID_PRODUCER_EPOCH, its name for it.
    fenced = ("ProducerFencedError" if kafka_broker.version >= (2, 7)
              else "InvalidProducerEpochError")
    with pytest.raises(TransactionFencedError, match=fenced):
        end_transaction(config, handle, commit=True)


def test_a_new_producer_of_a_transactional_id_aborts_the_open_transaction(
        bootstrap_servers, config, skip_on_embedded):
    skip_on_embedded("read_committed does not hide aborted records on Tansu")
    topic = unique_topic_name("producer-fence")
    create_topic(bootstrap_servers, topic, partitions=1)
    tid = unique_topic_name("txn")
    first = Producer(config, ProducerSettings(transactional_id=tid))
    values, keys, headers = rows(10)
    first.send(topic, np.zeros(10, np.int32), values, keys, headers)
    first.flush()
    with Producer(config, ProducerSettings(transactional_id=tid)) as second:   # a retried task
        assert second.producer_epoch > first.producer_epoch
        second.send(topic, np.zeros(10, np.int32), *rows(10, 100))
        end_transaction(config, second.transaction(), commit=True)
    with pytest.raises(TransactionFencedError):
        first.send(topic, np.zeros(10, np.int32), values, keys, headers)
        first.flush()
    first.close()
    got = consume(bootstrap_servers, topic, 1, 10, read_committed=True)[0]
    assert [r.value for r in got] == rows(10, 100)[0].to_pylist()


def test_bad_input_is_rejected_with_the_name_of_what_is_wrong(bootstrap_servers, config):
    topic = unique_topic_name("producer-bad")
    create_topic(bootstrap_servers, topic, partitions=2)
    with Producer(config, ProducerSettings(max_request_size=10_000)) as producer:
        with pytest.raises(TopicError, match="does not exist.*does not create"):
            producer.partition_count(unique_topic_name("missing"))
        with pytest.raises(TopicError, match=f"Partition 2 of topic '{topic}'.*2 partitions"):
            producer.send(topic, np.array([0, 2], np.int32), pa.array([b"a", b"b"]), None, None)
        with pytest.raises(ProduceError, match="kafka.max.request.size"):
            producer.send(topic, np.array([1], np.int32), pa.array([b"x" * 20_000]), None, None)
        producer.send(topic, np.array([1], np.int32), pa.array([b"ok"]), None, None)
        producer.flush()
        assert producer.acked() == {(topic, 1): 1}
    assert end_offsets(bootstrap_servers, topic, 2) == {0: 0, 1: 1}
