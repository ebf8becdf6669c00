"""One producer per Python worker and settings (:mod:`kafka_source.write.producer_pool`),
against the scripted cluster: write tasks in a row share one producer id and continue its
sequence numbers; a failed task's producer is never handed on; idle producers are closed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from kafka_source.config.producer_settings import ProducerSettings
from kafka_source.config.sink_options import parse_sink_options
from kafka_source.errors import ProduceError
from kafka_source.write.columns import Columns
from kafka_source.write.producer import Producer
from kafka_source.write.producer_pool import ProducerPool
from kafka_source.write.task import write_task

from .fake_produce_cluster import TOPIC_AUTHORIZATION_FAILED, FakeProduceCluster

T = "events"


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def pool_on(cluster, clock=None):
    made = []

    def factory(config, settings):
        producer = Producer(config, settings, client=cluster, clock=cluster.clock)
        made.append(producer)
        return producer

    return ProducerPool(factory, clock=clock or Clock(), timers=False), made


def options(**extra):
    return parse_sink_options({"kafka.bootstrap.servers": "fake:9092", "topic": T,
                               "kafka.linger.ms": "0", **extra}, streaming=True)


def batches(start, n):
    values = pa.array([f"{i:06d}".encode() for i in range(start, start + n)], pa.binary())
    return [pa.RecordBatch.from_arrays([values], names=["value"])]


def inits(cluster) -> int:
    return sum(1 for kind, _ in cluster.txn_requests if kind == "init")


def test_tasks_in_a_row_share_one_producer_id_and_continue_its_sequences():
    cluster = FakeProduceCluster({T: 2})
    pool, made = pool_on(cluster)
    opts, columns = options(), Columns(value="value")
    messages = [write_task(opts, columns, iter(batches(100 * k, 100)), k, pool=pool)
                for k in range(5)]
    assert len(made) == 1 and inits(cluster) == 1
    # Each task reports its own records, not the producer's running total.
    assert [m.total for m in messages] == [100] * 5
    assert all(sum(n for _, p, n in m.records if p == 0) == 50 for m in messages)
    # The fake broker checks sequences as Kafka does: continued ones are appended in order,
    # nothing is a duplicate, nothing out of order.
    written = sorted(cluster.values((T, 0)) + cluster.values((T, 1)))
    assert written == [f"{i:06d}".encode() for i in range(500)]
    assert all(code == 0 for _, code in cluster.answers)
    assert pool.idle_count() == 1


def test_a_failed_task_closes_its_producer_and_the_next_task_gets_a_new_one():
    cluster = FakeProduceCluster({T: 1})
    pool, made = pool_on(cluster)
    opts, columns = options(), Columns(value="value")
    write_task(opts, columns, iter(batches(0, 10)), 0, pool=pool)

    def failing():
        yield from batches(10, 10)
        raise RuntimeError("the task's input failed")

    with pytest.raises(RuntimeError):
        write_task(opts, columns, failing(), 1, pool=pool)
    assert made[0].reusable is False and pool.idle_count() == 0
    write_task(opts, columns, iter(batches(20, 10)), 2, pool=pool)
    assert len(made) == 2 and inits(cluster) == 2


def test_a_producer_that_failed_is_not_handed_on():
    cluster = FakeProduceCluster({T: 1})
    pool, made = pool_on(cluster)
    opts, columns = options(), Columns(value="value")
    cluster.fail_next((T, 0), TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(ProduceError, match="not authorized"):
        write_task(opts, columns, iter(batches(0, 10)), 0, pool=pool)
    assert pool.idle_count() == 0
    write_task(opts, columns, iter(batches(10, 10)), 1, pool=pool)
    assert len(made) == 2


def test_unsent_records_are_never_handed_to_the_next_task():
    # A task whose block ends without an error but with records not acknowledged (it did not
    # flush) gives nothing back: the producer is closed.
    cluster = FakeProduceCluster({T: 1})
    pool, made = pool_on(cluster)
    cluster.hold(1)
    with pool.lease({}, ProducerSettings(linger_ms=0)) as producer:
        producer.send(T, np.zeros(5, np.int32), pa.array([b"x"] * 5, pa.binary()))
    assert made[0].reusable is False and pool.idle_count() == 0


def test_other_settings_get_other_producers():
    cluster = FakeProduceCluster({T: 1})
    pool, made = pool_on(cluster)
    columns = Columns(value="value")
    write_task(options(), columns, iter(batches(0, 10)), 0, pool=pool)
    write_task(options(**{"kafka.compression.type": "lz4"}), columns, iter(batches(10, 10)), 1,
               pool=pool)
    write_task(options(), columns, iter(batches(20, 10)), 2, pool=pool)
    assert len(made) == 2 and pool.idle_count() == 2


def test_idle_producers_are_closed_after_the_idle_time():
    cluster = FakeProduceCluster({T: 1})
    clock = Clock()
    pool, made = pool_on(cluster, clock)
    columns = Columns(value="value")
    write_task(options(), columns, iter(batches(0, 10)), 0, pool=pool)
    short = options(**{"kafka.connections.max.idle.ms": "60000"})
    write_task(short, columns, iter(batches(10, 10)), 1, pool=pool)
    clock.t += 59
    assert pool.reap() == 0
    clock.t += 2                          # past kafka.connections.max.idle.ms of the second
    assert pool.reap() == 1 and made[1].reusable is False and made[0].reusable is True
    clock.t += 600                        # past the default 10 minutes
    assert pool.reap() == 1 and made[0].reusable is False
    write_task(options(), columns, iter(batches(20, 10)), 2, pool=pool)
    assert len(made) == 3


def test_transactional_producers_are_not_pooled():
    cluster = FakeProduceCluster({T: 1})
    pool, made = pool_on(cluster)
    with pool.lease({}, ProducerSettings(transactional_id="tx-1")) as producer:
        producer.send(T, np.zeros(1, np.int32), pa.array([b"x"], pa.binary()))
        producer.flush()
    assert pool.idle_count() == 0 and made[0].reusable is False
