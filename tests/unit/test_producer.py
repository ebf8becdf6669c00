"""Unit tests of the sink's producer (:mod:`kafka_source.write.producer`) against a scripted
cluster (:mod:`tests.unit.fake_produce_cluster`) with simulated time."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from .fake_produce_cluster import (CONCURRENT_TRANSACTIONS, DUPLICATE_SEQUENCE,
                                   INVALID_PRODUCER_EPOCH, MESSAGE_TOO_LARGE, NOT_COORDINATOR,
                                   NOT_ENOUGH_REPLICAS, NOT_LEADER_OR_FOLLOWER,
                                   OUT_OF_ORDER_SEQUENCE, REQUEST_TIMED_OUT,
                                   TOPIC_AUTHORIZATION_FAILED, UNKNOWN_PRODUCER_ID,
                                   FakeProduceCluster, RetriableBrokerError)
from kafka_source.config.producer_settings import ProducerSettings
from kafka_source.errors import OptionError, ProduceError, TopicError
from kafka_source.wire.format.encode import BATCH_OVERHEAD, record_sizes
from kafka_source.write.producer import (Producer, TransactionFencedError, TransactionHandle,
                                         abort_stale_transaction, end_transaction)

pytestmark = pytest.mark.pyspark_free

T = "events"


def values(n, start=0, size=10):
    return pa.array([f"{i:0{size}d}".encode() for i in range(start, start + n)], pa.binary())


def make(cluster=None, topics=None, **kw):
    cluster = cluster or FakeProduceCluster(topics or {T: 4})
    producer = Producer({}, ProducerSettings(**kw), client=cluster, clock=cluster.clock)
    return cluster, producer


def per_partition(n, parts):
    return np.arange(n, dtype=np.int32) % parts


# --- writing and batching -----------------------------------------------------------------------

def test_rows_reach_their_partitions_in_order_with_keys_and_headers():
    cluster, producer = make()
    n = 1000
    keys = pa.array([None if i % 7 == 0 else f"k{i}".encode() for i in range(n)], pa.binary())
    htype = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    headers = pa.array([None if i % 3 else [{"key": "h", "value": str(i).encode()},
                                            {"key": "n", "value": None}] for i in range(n)],
                       htype)
    parts = per_partition(n, 4)
    producer.send(T, parts, values(n), keys, headers)
    producer.flush()
    for p in range(4):
        log = cluster.logs[(T, p)].records
        rows = [i for i in range(n) if i % 4 == p]
        assert [r.value for r in log] == [f"{i:010d}".encode() for i in rows]
        assert [r.key for r in log] == [None if i % 7 == 0 else f"k{i}".encode() for i in rows]
        assert [r.headers for r in log] == [
            [] if i % 3 else [("h", str(i).encode()), ("n", None)] for i in rows]
    assert producer.acked() == {(T, p): n // 4 for p in range(4)}


def test_order_is_kept_across_calls_and_null_values_are_tombstones():
    cluster, producer = make()
    producer.send(T, np.zeros(3, np.int32), pa.array([b"a", None, b"c"]), None, None)
    producer.send(T, np.zeros(2, np.int32), pa.array([b"d", b"e"], pa.large_binary()),
                  pa.array([b"k1", b"k2"]), None)
    producer.flush()
    assert cluster.values((T, 0)) == [b"a", None, b"c", b"d", b"e"]
    assert [r.key for r in cluster.logs[(T, 0)].records] == [None, None, None, b"k1", b"k2"]


def test_batches_are_cut_at_batch_size():
    batch_size = 1000
    cluster, producer = make(batch_size=batch_size, linger_ms=1000)
    n = 500
    v = values(n)
    largest = int(record_sizes(v).max())       # 10-byte values: 17 or 18 bytes a record
    producer.send(T, np.zeros(200, np.int32), v[:200], None, None)  # two calls, one stream
    producer.send(T, np.zeros(n - 200, np.int32), v[200:], None, None)
    producer.flush()
    sizes = [len(data) for _, _, _, parts in cluster.produce_requests for data in parts.values()]
    assert len(sizes) > 5
    # every batch is as full as it can be: one more record would not have fitted
    assert all(batch_size - largest < size <= batch_size for size in sizes[:-1])
    assert sum(b.count for b in cluster.logs[(T, 0)].batches) == n
    assert cluster.values((T, 0)) == v.to_pylist()


def test_record_sizes_are_exact_at_any_place_in_a_batch():
    from kafka_source.write.batches import bare_sizes, sizes_at
    # lengths around the varint boundaries of the record length (64, 8192 bytes)
    v = pa.array([b"y" * n for n in (0, 1, 55, 56, 57, 58, 60, 61, 62, 63, 64, 8180, 8185,
                                     8190, 8191, 8192, 20000)] * 3)
    k = pa.array([None if i % 3 else b"k" * (i % 70) for i in range(len(v))])
    bare = bare_sizes(record_sizes(v, k))
    for start, first in ((0, 0), (5, 0), (5, 63), (10, 64), (20, 8191), (30, 100_000)):
        pad = pa.nulls(first, pa.binary())
        placed = record_sizes(pa.concat_arrays([pad, v.slice(start, 8)]),
                              pa.concat_arrays([pad, k.slice(start, 8)]))[first:]
        assert sizes_at(bare[start:start + 8], first).tolist() == placed.tolist()


def test_rows_of_interleaved_and_grouped_partitions_keep_their_order():
    cluster, producer = make()
    parts = np.array([2, 2, 0, 0, 1, 2, 3, 3], np.int32)
    producer.send(T, parts, values(8), None, None)
    producer.flush()
    assert {p: cluster.values((T, p)) for p in range(4)} == {
        p: [f"{i:010d}".encode() for i in range(8) if parts[i] == p] for p in range(4)}


def test_a_record_larger_than_the_batch_size_gets_a_batch_of_its_own():
    cluster, producer = make(batch_size=200, linger_ms=0)
    v = pa.array([b"a", b"x" * 500, b"b"])
    producer.send(T, np.zeros(3, np.int32), v, None, None)
    producer.flush()
    assert [b.count for b in cluster.logs[(T, 0)].batches] == [1, 1, 1]
    assert cluster.values((T, 0)) == [b"a", b"x" * 500, b"b"]


def test_linger_holds_a_partial_batch_until_it_is_due():
    cluster, producer = make(linger_ms=1000)
    producer.send(T, np.zeros(5, np.int32), values(5), None, None)
    assert cluster.produce_requests == []           # not full, not due
    producer.send(T, np.zeros(5, np.int32), values(5, 5), None, None)
    assert cluster.produce_requests == []
    cluster.clock.sleep(1.0)
    producer.send(T, np.ones(1, np.int32), values(1, 10), None, None)
    # partition 0's batch is due and went out with all ten rows; partition 1's is not yet due
    assert [list(parts) for _, _, _, parts in cluster.produce_requests] == [[(T, 0)]]
    producer.flush()
    assert [b.count for b in cluster.logs[(T, 0)].batches] == [10]
    assert cluster.values((T, 1)) == [b"0000000010"]


def test_one_request_per_broker_with_one_batch_per_partition():
    cluster = FakeProduceCluster({T: 4}, brokers=(1, 2))
    cluster, producer = make(cluster, batch_size=300, linger_ms=0)
    n = 200
    producer.send(T, per_partition(n, 4), values(n), None, None)
    producer.flush()
    for node, version, acks, parts in cluster.produce_requests:
        assert {cluster.leaders[tp] for tp in parts} == {node}
    # partitions 0, 2 on broker 1 and 1, 3 on broker 2: a request carries both of a broker's
    assert any(len(parts) == 2 for _, _, _, parts in cluster.produce_requests)
    assert sum(len(cluster.values((T, p))) for p in range(4)) == n


def confirm(producer, *partitions):
    """Write one record to each partition, so that the producer pipelines from then on."""
    for p in partitions:
        producer.send(T, np.array([p], np.int32), pa.array([b"first"]), None, None)
    producer.flush()


def test_requests_are_pipelined_up_to_max_in_flight():
    cluster, producer = make(batch_size=200, linger_ms=0, max_in_flight=3)
    confirm(producer, 0)
    cluster.hold(1)
    producer.send(T, np.zeros(100, np.int32), values(100), None, None)
    assert cluster.in_flight(1) == 3                 # sent without waiting for answers
    cluster.release(1)
    producer.flush()
    assert cluster.in_flight_peak[1] == 3
    assert cluster.values((T, 0)) == [b"first"] + [f"{i:010d}".encode() for i in range(100)]
    assert cluster.max_in_flight_setting >= 3 + 1   # room for a Metadata request besides


def test_max_request_size_bounds_a_request():
    cluster, producer = make(batch_size=1000, max_request_size=2500, linger_ms=0)
    n = 400
    producer.send(T, per_partition(n, 4), values(n), None, None)
    producer.flush()
    for _, _, _, parts in cluster.produce_requests:
        assert sum(len(d) for d in parts.values()) <= 2500
    assert max(len(parts) for _, _, _, parts in cluster.produce_requests) >= 2


# --- idempotence --------------------------------------------------------------------------------

def test_idempotent_batches_carry_producer_id_and_consecutive_sequences():
    cluster, producer = make(batch_size=300, linger_ms=0)
    producer.send(T, per_partition(100, 2), values(100), None, None)
    producer.flush()
    assert producer.producer_id > 0
    for p in range(2):
        batches = cluster.logs[(T, p)].batches
        assert {b.producer_id for b in batches} == {producer.producer_id}
        expected = 0
        for b in batches:
            assert b.base_sequence == expected
            expected += b.count
    assert [kind for kind, _ in cluster.txn_requests] == ["init"]


def test_without_idempotence_no_producer_id_is_asked_for():
    cluster, producer = make(enable_idempotence=False, acks=1)
    producer.send(T, np.zeros(10, np.int32), values(10), None, None)
    producer.flush()
    assert cluster.txn_requests == []
    assert {b.producer_id for b in cluster.logs[(T, 0)].batches} == {-1}


@pytest.mark.parametrize("code", [NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT])
def test_a_retriable_error_resends_in_order_without_duplicates(code):
    cluster, producer = make(batch_size=200, linger_ms=0, max_in_flight=5)
    cluster.hold(1)
    producer.send(T, np.zeros(60, np.int32), values(60), None, None)
    # the second batch fails after the broker appended it (a timeout waiting for replicas):
    # the later ones in flight are then out of order for the broker, and all are resent.
    cluster.fail_next((T, 0), 0)
    cluster.fail_next((T, 0), code, append_first=(code == REQUEST_TIMED_OUT))
    cluster.release(1)
    producer.flush()
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(60)]
    assert producer.acked() == {(T, 0): 60}
    if code != REQUEST_TIMED_OUT:      # (written after all: the later ones were in order)
        assert ((T, 0), OUT_OF_ORDER_SEQUENCE) in cluster.answers  # the later ones were resent


def test_a_partition_sends_one_batch_until_its_first_is_acknowledged():
    # A broker accepts any sequence from a producer it knows nothing of: had the second batch
    # been in flight, it would have been written before the first one's retry.
    cluster, producer = make(batch_size=200, linger_ms=0)
    cluster.hold(1)
    producer.send(T, np.zeros(40, np.int32), values(40), None, None)
    assert cluster.in_flight(1) == 1
    cluster.fail_next((T, 0), NOT_LEADER_OR_FOLLOWER)
    cluster.release(1)
    producer.flush()
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(40)]
    assert cluster.in_flight_peak[1] > 1                 # pipelined once confirmed


def test_a_leader_move_is_followed_after_a_metadata_refresh():
    cluster = FakeProduceCluster({T: 2}, brokers=(1, 2))
    cluster, producer = make(cluster, batch_size=200, linger_ms=0)
    producer.send(T, np.zeros(10, np.int32), values(10), None, None)
    producer.flush()
    calls = cluster.metadata_calls
    cluster.move_leader((T, 0), 2)
    producer.send(T, np.zeros(10, np.int32), values(10, 10), None, None)
    producer.flush()
    assert cluster.metadata_calls > calls
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(20)]
    assert cluster.produce_requests[-1][0] == 2


# --- leaders that cannot be reached (issue 18, item 1) -------------------------------------------
# The Java producer asks for metadata on every disconnect and failed connection; a producer that
# only asked after a failed request waited for a dead leader until kafka.delivery.timeout.ms.

def _moved_away_from(cluster, dead, to):
    """Broker ``dead`` crashed: nothing connects to it, and its partitions have leader ``to``."""
    cluster.unreachable.add(dead)
    for tp, node in list(cluster.leaders.items()):
        if node == dead:
            cluster.move_leader(tp, to)


def test_a_leader_dead_before_the_write_is_left_for_the_new_one():
    # The producer's metadata (taken when the topic was looked up) names broker 1; it dies
    # before anything is sent to it, and its partitions move to broker 2.
    cluster = FakeProduceCluster({T: 2}, brokers=(1, 2))
    cluster, producer = make(cluster, batch_size=200, linger_ms=0)
    assert producer.partition_count(T) == 2
    start, calls = cluster.clock.now(), cluster.metadata_calls
    _moved_away_from(cluster, 1, 2)
    producer.send(T, np.zeros(30, np.int32), values(30), None, None)
    producer.flush()
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(30)]
    assert all(r[0] == 2 for r in cluster.produce_requests)
    assert cluster.metadata_calls == calls + 1
    assert cluster.clock.now() - start < 1          # not kafka.delivery.timeout.ms (120 s)


def test_a_leader_dead_between_writes_is_left_for_the_new_one():
    # Nothing in flight when broker 1 dies: the next write finds it unreachable.
    cluster = FakeProduceCluster({T: 2}, brokers=(1, 2))
    cluster, producer = make(cluster, batch_size=200, linger_ms=0)
    producer.send(T, np.zeros(10, np.int32), values(10), None, None)
    producer.flush()
    start = cluster.clock.now()
    _moved_away_from(cluster, 1, 2)
    producer.send(T, np.zeros(10, np.int32), values(10, 10), None, None)
    producer.flush()
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(20)]
    assert cluster.produce_requests[-1][0] == 2
    assert cluster.clock.now() - start < 1


def test_a_leader_dead_mid_request_is_left_for_the_new_one_without_duplicates():
    # Broker 1 appended the batch, then the connection broke before the answer; the retry goes
    # to the new leader, which has the batch (replicated) and recognises it as a duplicate.
    cluster = FakeProduceCluster({T: 2}, brokers=(1, 2))
    cluster, producer = make(cluster, batch_size=200, linger_ms=0)
    producer.partition_count(T)
    cluster.break_next(1, append_first=True)
    producer.send(T, np.zeros(10, np.int32), values(10), None, None)
    _moved_away_from(cluster, 1, 2)
    start = cluster.clock.now()
    producer.flush()
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(10)]
    assert cluster.produce_requests[-1][0] == 2
    assert cluster.clock.now() - start < 1


def test_metadata_naming_a_dead_leader_is_asked_again_with_a_growing_backoff():
    # The cluster keeps naming the dead broker for 9 s (a KRaft controller until the broker's
    # session times out): the producer asks again, at most about once a second, and writes
    # to the new leader as soon as it is named.
    cluster = FakeProduceCluster({T: 1}, brokers=(1, 2))
    cluster, producer = make(cluster, batch_size=200, linger_ms=0, retry_backoff_ms=100)
    producer.partition_count(T)
    cluster.unreachable.add(1)
    start = cluster.clock.now()
    producer.send(T, np.zeros(10, np.int32), values(10), None, None)
    while cluster.clock.now() - start < 9:
        producer._pump(producer._wait_ms())
    asked = [t - start for t in cluster.metadata_times if t >= start]
    assert 5 <= len(asked) <= 14, asked
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert all(g <= 1.06 for g in gaps), gaps
    assert gaps[-1] >= 0.9, gaps              # grown to the 1 s cap
    cluster.move_leader((T, 0), 2)
    producer.flush()
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(10)]
    assert cluster.clock.now() - start < 11


def test_metadata_is_refreshed_every_metadata_max_age_ms():
    cluster = FakeProduceCluster({T: 2}, brokers=(1, 2))
    cluster, producer = make(cluster, batch_size=200, linger_ms=0, metadata_max_age_ms=60_000)
    producer.send(T, np.zeros(10, np.int32), values(10), None, None)
    producer.flush()
    calls = cluster.metadata_calls
    cluster.clock.sleep(30)
    producer.send(T, np.zeros(10, np.int32), values(10, 10), None, None)
    producer.flush()
    assert cluster.metadata_calls == calls            # younger than metadata.max.age.ms
    cluster.move_leader((T, 0), 2)                    # e.g. a preferred-leader election
    cluster.clock.sleep(31)
    producer.send(T, np.zeros(10, np.int32), values(10, 20), None, None)
    producer.flush()
    assert cluster.metadata_calls == calls + 1
    assert cluster.produce_requests[-1][0] == 2       # sent to the new leader at once


def test_a_broken_connection_after_the_write_does_not_duplicate():
    cluster, producer = make(batch_size=200, linger_ms=0)
    cluster.break_next(1, append_first=True)
    producer.send(T, np.zeros(30, np.int32), values(30), None, None)
    producer.flush()
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(30)]


def test_a_broken_connection_before_the_write_is_retried():
    cluster, producer = make(batch_size=200, linger_ms=0)
    cluster.break_next(1, append_first=False)
    producer.send(T, np.zeros(30, np.int32), values(30), None, None)
    producer.flush()
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(30)]


def test_duplicate_sequence_number_counts_as_written():
    cluster, producer = make()
    cluster.fail_next((T, 0), DUPLICATE_SEQUENCE, append_first=True)
    producer.send(T, np.zeros(5, np.int32), values(5), None, None)
    producer.flush()
    assert producer.acked() == {(T, 0): 5}
    assert len(cluster.values((T, 0))) == 5


@pytest.mark.parametrize("code,phrase", [
    (OUT_OF_ORDER_SEQUENCE, "OutOfOrderSequenceNumberError"),
    (UNKNOWN_PRODUCER_ID, "UnknownProducerIdError"),
    (INVALID_PRODUCER_EPOCH, "fenced"),
    (TOPIC_AUTHORIZATION_FAILED, "not authorized"),
    (MESSAGE_TOO_LARGE, "max.message.bytes"),
])
def test_fatal_errors_name_topic_and_partition(code, phrase):
    cluster, producer = make()
    producer.send(T, np.zeros(5, np.int32), values(5), None, None)
    cluster.fail_next((T, 0), code)
    with pytest.raises(ProduceError, match=phrase) as info:
        producer.flush()
    assert f"topic '{T}' partition 0" in str(info.value)
    assert (info.value.topic, info.value.partition) == (T, 0)
    with pytest.raises(ProduceError):         # the producer stays failed
        producer.send(T, np.zeros(1, np.int32), values(1), None, None)


def test_out_of_order_for_a_later_batch_is_retried_not_fatal():
    cluster, producer = make(batch_size=200, linger_ms=0)
    cluster.hold(1)
    producer.send(T, np.zeros(40, np.int32), values(40), None, None)
    cluster.fail_next((T, 0), 0)
    cluster.fail_next((T, 0), NOT_ENOUGH_REPLICAS)     # the second batch: the rest is out of order
    cluster.release(1)
    producer.flush()
    assert cluster.values((T, 0)) == [f"{i:010d}".encode() for i in range(40)]
    assert ((T, 0), OUT_OF_ORDER_SEQUENCE) in cluster.answers


def test_delivery_timeout_names_partition_and_last_error():
    cluster, producer = make(delivery_timeout_ms=40_000, request_timeout_ms=30_000)
    cluster.fail_next((T, 2), NOT_ENOUGH_REPLICAS, times=10_000)
    producer.send(T, np.full(5, 2, np.int32), values(5), None, None)
    with pytest.raises(ProduceError) as info:
        producer.flush()
    message = str(info.value)
    assert f"topic '{T}' partition 2" in message
    assert "kafka.delivery.timeout.ms" in message and "NotEnoughReplicasError" in message


def test_an_unreachable_leader_fails_after_the_delivery_timeout():
    cluster, producer = make(delivery_timeout_ms=31_000, request_timeout_ms=30_000)
    cluster.unreachable.add(1)
    producer.send(T, np.zeros(5, np.int32), values(5), None, None)
    with pytest.raises(ProduceError, match="broker 1 is not reachable"):
        producer.flush()


def test_a_request_without_answer_times_out_and_is_retried():
    cluster, producer = make()
    cluster.hold(1)
    producer.send(T, np.zeros(5, np.int32), values(5), None, None)
    producer._pump(0)
    cluster.clock.sleep(31)               # past the request timeout: kafka-python fails it
    cluster.poll(0)
    cluster.release(1)
    producer.flush()
    assert len(cluster.values((T, 0))) == 5


# --- acks ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("acks", [0, 1])
def test_acks_0_and_1_write_without_idempotence(acks):
    cluster, producer = make(acks=acks, enable_idempotence=False)
    producer.send(T, per_partition(40, 4), values(40), None, None)
    producer.flush()
    assert {a for _, _, a, _ in cluster.produce_requests} == {acks}
    assert sum(len(cluster.values((T, p))) for p in range(4)) == 40
    assert producer.acked() == {(T, p): 10 for p in range(4)}


def test_acks_0_waits_for_the_bytes_to_leave_and_resends_after_a_lost_connection():
    cluster, producer = make(acks=0, enable_idempotence=False, linger_ms=0)
    cluster.unsent[1] = 100
    producer.send(T, np.zeros(5, np.int32), values(5), None, None)
    producer._pump(0)
    assert producer.acked() == {(T, 0): 0}           # still in the socket buffer
    cluster.unsent[1] = -1                           # the connection closed with it
    producer._pump(0)
    cluster.unsent[1] = 0
    producer.flush()
    assert producer.acked() == {(T, 0): 5}
    assert len(cluster.produce_requests) == 2
    assert cluster.api_versions_calls == [1]         # the broker handled what came before


def test_acks_0_flush_says_when_the_connection_failed_after_writing():
    cluster, producer = make(acks=0, enable_idempotence=False, linger_ms=0)
    producer.send(T, np.zeros(5, np.int32), values(5), None, None)
    producer._pump(0)
    cluster.unsent[1] = -1                           # closed after the bytes left
    with pytest.raises(ProduceError, match="acks=0.*may be lost.*kafka.acks") as info:
        producer.flush()
    assert (info.value.topic, info.value.partition) == (T, 0)


# --- memory bound -------------------------------------------------------------------------------

def test_send_blocks_while_the_buffer_is_full_and_held_bytes_stay_bounded():
    cluster, producer = make(batch_size=500, buffer_memory=2000, linger_ms=0)
    confirm(producer, 0)
    cluster.hold(1)
    peaks = []
    original = cluster.poll

    def poll(timeout_ms):
        peaks.append(producer._buffered)
        if cluster.in_flight(1) >= 3:
            cluster.release(1)      # the broker answers once several requests wait
        original(timeout_ms)
        cluster.hold(1)

    cluster.poll = poll
    producer.send(T, np.zeros(300, np.int32), values(300), None, None)
    cluster.release(1)
    cluster.poll = original
    producer.flush()
    assert max(peaks) <= 2000
    assert cluster.values((T, 0)) == [b"first"] + [f"{i:010d}".encode() for i in range(300)]


def test_send_gives_up_after_max_block_ms():
    cluster, producer = make(batch_size=500, buffer_memory=1000, linger_ms=0, max_block_ms=5000)
    cluster.hold(1)
    with pytest.raises(ProduceError, match="kafka.max.block.ms") as info:
        producer.send(T, np.zeros(300, np.int32), values(300), None, None)
    assert "kafka.buffer.memory" in str(info.value)


# --- bad input ----------------------------------------------------------------------------------

def test_a_record_larger_than_max_request_size_is_rejected_before_anything_is_sent():
    cluster, producer = make(max_request_size=1000)
    v = pa.array([b"small", b"x" * 2000, b"small"])
    with pytest.raises(ProduceError) as info:
        producer.send(T, np.array([0, 3, 1], np.int32), v, None, None)
    message = str(info.value)
    assert "kafka.max.request.size" in message and f"topic '{T}' partition 3" in message
    assert str(2000 + BATCH_OVERHEAD) in message or "bytes" in message
    producer.flush()
    assert cluster.produce_requests == []
    assert producer.acked() == {}


def test_a_partition_the_topic_does_not_have():
    cluster, producer = make()
    with pytest.raises(TopicError, match=r"Partition 4 of topic 'events' does not exist.*4 "
                                         r"partitions"):
        producer.send(T, np.array([0, 4], np.int32), values(2), None, None)
    with pytest.raises(TopicError, match="Partition -1"):
        producer.send(T, np.array([-1], np.int32), values(1), None, None)


def test_a_topic_that_grew_is_looked_up_again():
    cluster, producer = make()
    assert producer.partition_count(T) == 4
    cluster.topics[T] = 6
    cluster.leaders[(T, 4)] = cluster.leaders[(T, 5)] = 1
    producer.send(T, np.array([5], np.int32), values(1), None, None)
    producer.flush()
    assert cluster.values((T, 5)) == [b"0000000000"]


def test_an_unknown_topic_is_a_topic_error_and_not_created():
    cluster, producer = make()
    with pytest.raises(TopicError, match="'nope' does not exist.*does not create topics"):
        producer.partition_count("nope")
    assert "nope" not in cluster.topics


def test_metadata_failures_are_retried_within_max_block_ms():
    cluster, producer = make()
    cluster.metadata_failures = [RetriableBrokerError("broker restarting")] * 3
    assert producer.partition_count(T) == 4


@pytest.mark.parametrize("kw,option", [
    ({"acks": 1}, "kafka.acks"),
    ({"max_in_flight": 6}, "kafka.max.in.flight.requests.per.connection"),
    ({"compression_type": "brotli"}, "kafka.compression.type"),
    ({"acks": 2, "enable_idempotence": False}, "kafka.acks"),
    ({"delivery_timeout_ms": 1000}, "kafka.delivery.timeout.ms"),
    ({"batch_size": 0}, "kafka.batch.size"),
])
def test_settings_that_cannot_work_name_the_option(kw, option):
    with pytest.raises(OptionError, match=option.replace(".", r"\.")):
        ProducerSettings(**kw).check()


# --- transactions -------------------------------------------------------------------------------

def test_a_transactional_producer_adds_partitions_and_leaves_the_transaction_open():
    cluster = FakeProduceCluster({T: 4})
    cluster, producer = make(cluster, transactional_id="app-0", batch_size=200, linger_ms=0)
    assert [k for k, _ in cluster.txn_requests] == ["init"]      # fenced at creation
    producer.send(T, np.array([0, 2, 2], np.int32), values(3), None, None)
    producer.send(T, np.array([2, 3], np.int32), values(2, 3), None, None)
    handle = producer.transaction()
    assert handle == TransactionHandle("app-0", producer.producer_id, producer.producer_epoch,
                                       ((T, 0), (T, 2), (T, 3)))
    assert pickle.loads(pickle.dumps(handle)) == handle
    adds = [r for k, r in cluster.txn_requests if k == "add"]
    assert [sorted((t.name, p) for t in r.v3_and_below_topics for p in t.partitions)
            for r in adds] == [[(T, 0), (T, 2)], [(T, 3)]]
    assert all(b.transactional for p in (0, 2, 3) for b in cluster.logs[(T, p)].batches)
    assert cluster.transactions["app-0"]["state"] == "Ongoing"    # nothing committed here
    end_transaction({}, handle, True, client=cluster, clock=cluster.clock)
    assert cluster.transactions["app-0"]["state"] == "CompleteCommit"
    end_transaction({}, handle, True, client=cluster, clock=cluster.clock)   # a retried commit


def test_end_transaction_retries_concurrent_transactions_and_a_moved_coordinator():
    cluster, producer = make(transactional_id="app-1")
    producer.send(T, np.zeros(2, np.int32), values(2), None, None)
    handle = producer.transaction()
    cluster.txn_script["end"].extend([CONCURRENT_TRANSACTIONS, NOT_COORDINATOR,
                                      RetriableBrokerError("broker restarting")])
    end_transaction({}, handle, True, client=cluster, clock=cluster.clock)
    assert cluster.transactions["app-1"]["state"] == "CompleteCommit"


def test_a_fenced_transaction_cannot_be_committed():
    cluster, producer = make(transactional_id="app-2")
    producer.send(T, np.zeros(2, np.int32), values(2), None, None)
    handle = producer.transaction()
    abort_stale_transaction({}, "app-2", 5000, client=cluster, clock=cluster.clock)
    assert cluster.transactions["app-2"]["state"] == "CompleteAbort"
    with pytest.raises(TransactionFencedError, match="'app-2'"):
        end_transaction({}, handle, True, client=cluster, clock=cluster.clock)


def test_committing_an_aborted_transaction_says_so():
    cluster, producer = make(transactional_id="app-3")
    producer.send(T, np.zeros(2, np.int32), values(2), None, None)
    handle = producer.transaction()
    end_transaction({}, handle, False, client=cluster, clock=cluster.clock)
    with pytest.raises(TransactionFencedError, match="already aborted"):
        end_transaction({}, handle, True, client=cluster, clock=cluster.clock)


def test_an_empty_transaction_has_nothing_to_end():
    cluster, producer = make(transactional_id="app-4")
    handle = producer.transaction()
    assert handle.partitions == ()
    end_transaction({}, handle, True, client=cluster, clock=cluster.clock)
    assert [k for k, _ in cluster.txn_requests] == ["init"]


def test_a_second_producer_of_the_id_fences_the_first():
    cluster = FakeProduceCluster({T: 1})
    _, first = make(cluster, transactional_id="app-5")
    first.send(T, np.zeros(2, np.int32), values(2), None, None)
    first.flush()
    _, second = make(cluster, transactional_id="app-5")
    assert second.producer_epoch == first.producer_epoch + 1
    first.send(T, np.zeros(2, np.int32), values(2), None, None)
    with pytest.raises(TransactionFencedError, match="fenced"):
        first.flush()


def test_init_producer_id_retries_concurrent_transactions():
    cluster = FakeProduceCluster({T: 1})
    cluster.txn_script["init"].extend([CONCURRENT_TRANSACTIONS] * 3 + [NOT_COORDINATOR])
    _, producer = make(cluster, transactional_id="app-6")
    assert producer.producer_id > 0


def test_a_transaction_timeout_the_broker_rejects_names_option_and_broker_setting():
    # Issue 18 item 4: INVALID_TRANSACTION_TIMEOUT (50) at InitProducerId.
    cluster = FakeProduceCluster({T: 1})
    cluster.txn_script["init"].append(50)
    with pytest.raises(ProduceError) as info:
        make(cluster, transactional_id="app-9", transaction_timeout_ms=3_600_000)
    text = str(info.value)
    assert "'app-9'" in text and "'kafka.transaction.timeout.ms' (3600000 ms" in text
    assert "at most the brokers' transaction.max.timeout.ms" in text
    assert "raise transaction.max.timeout.ms on every broker" in text


def test_end_transaction_gives_up_naming_the_transactional_id():
    cluster, producer = make(transactional_id="app-7")
    producer.send(T, np.zeros(2, np.int32), values(2), None, None)
    handle = producer.transaction()
    cluster.txn_script["end"].extend([CONCURRENT_TRANSACTIONS] * 100_000)
    with pytest.raises(ProduceError, match="'app-7'.*ConcurrentTransactionsError"):
        end_transaction({}, handle, True, timeout_ms=2000, client=cluster, clock=cluster.clock)
