"""Sink options: Spark's names, the Java producer's defaults and rules, clear errors."""

from __future__ import annotations

import logging
import pickle

import pytest

from kafka_source.config.producer_settings import DEFAULT_BATCH_SIZE, ProducerSettings
from kafka_source.config.secrets import Secret
from kafka_source.config.sink_options import (DEFAULT_EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS,
                                              parse_sink_options)
from kafka_source.errors import OptionError

pytestmark = pytest.mark.pyspark_free

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def sink(streaming=True, **extra):
    return parse_sink_options({**BASE, **extra}, streaming=streaming)


def error_of(streaming=True, **extra) -> str:
    with pytest.raises(OptionError) as info:
        sink(streaming, **extra)
    return str(info.value)


def test_defaults_are_the_java_producers():
    o = sink()
    p = o.producer
    assert p == ProducerSettings()
    assert (p.acks, p.linger_ms, p.batch_size, p.compression_type) == (-1, 5, DEFAULT_BATCH_SIZE,
                                                                       "none")
    assert p.enable_idempotence is True and p.transactional_id is None
    assert (p.buffer_memory, p.max_request_size, p.max_block_ms) == (32 << 20, 1 << 20, 60_000)
    assert (p.delivery_timeout_ms, p.request_timeout_ms, p.retry_backoff_ms,
            p.max_in_flight) == (120_000, 30_000, 100, 5)
    assert o.topic is None and o.exactly_once is False
    assert o.transactional_id_prefix == "pykafka-sink"
    assert o.bootstrap_servers == "127.0.0.1:9092"


def test_every_producer_setting_by_java_name_case_insensitive():
    o = parse_sink_options({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "Topic": " t ",
                            "kafka.ACKS": "1", "kafka.linger.ms": "20", "kafka.batch.size": "1000",
                            "kafka.compression.type": "ZSTD", "kafka.buffer.memory": "9999999",
                            "kafka.max.request.size": "2000000", "kafka.max.block.ms": "7",
                            "kafka.delivery.timeout.ms": "200000",
                            "kafka.request.timeout.ms": "15000", "kafka.retry.backoff.ms": "50",
                            "kafka.max.in.flight.requests.per.connection": "9"})
    p = o.producer
    assert o.topic == "t"
    assert (p.acks, p.linger_ms, p.batch_size, p.compression_type) == (1, 20, 1000, "zstd")
    assert (p.buffer_memory, p.max_request_size, p.max_block_ms) == (9999999, 2000000, 7)
    assert (p.delivery_timeout_ms, p.request_timeout_ms, p.retry_backoff_ms,
            p.max_in_flight) == (200000, 15000, 50, 9)
    assert p.enable_idempotence is False  # acks=1, not asked for: off, as in Java
    # the connection settings see the shared ones too
    assert o.client_config["request_timeout_ms"] == 15000


@pytest.mark.parametrize("acks,value", [("all", -1), ("-1", -1), ("0", 0), ("1", 1)])
def test_acks(acks, value):
    p = sink(**{"kafka.acks": acks, "kafka.enable.idempotence": "false"}).producer
    assert p.acks == value


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_codecs(codec):
    assert sink(**{"kafka.compression.type": codec}).producer.compression_type == codec


@pytest.mark.parametrize("key,raw,expect", [
    ("kafka.acks", "2", "'kafka.acks' must be 'all', '-1', '0' or '1', got '2'"),
    ("kafka.compression.type", "brotli", "none, gzip, snappy, lz4, zstd; got 'brotli'"),
    ("kafka.linger.ms", "soon", "'kafka.linger.ms' must be an integer, got 'soon'"),
    ("kafka.linger.ms", "-1", "'kafka.linger.ms' must be an integer >= 0"),
    ("kafka.batch.size", "0", "'kafka.batch.size' must be an integer >= 1"),
    ("kafka.max.in.flight.requests.per.connection", "0", ">= 1"),
    ("kafka.enable.idempotence", "yes", "'kafka.enable.idempotence' must be 'true' or 'false'"),
    ("topic", "  ", "Option 'topic' is empty"),
])
def test_bad_values_name_option_and_valid_values(key, raw, expect):
    assert expect in error_of(**{key: raw})


def test_idempotence_rules_as_java():
    msg = error_of(**{"kafka.enable.idempotence": "true", "kafka.acks": "1"})
    assert "'kafka.enable.idempotence'" in msg and "'kafka.acks'" in msg
    msg = error_of(**{"kafka.enable.idempotence": "true",
                      "kafka.max.in.flight.requests.per.connection": "6"})
    assert "'kafka.max.in.flight.requests.per.connection' is 6" in msg and "at most 5" in msg
    assert sink(**{"kafka.max.in.flight.requests.per.connection": "6"}
                ).producer.enable_idempotence is False
    assert sink(**{"kafka.acks": "0"}).producer.enable_idempotence is False
    assert sink(**{"kafka.enable.idempotence": "false"}).producer.enable_idempotence is False


def test_delivery_timeout_covers_linger_and_request_timeout():
    msg = error_of(**{"kafka.delivery.timeout.ms": "1000", "kafka.linger.ms": "500",
                      "kafka.request.timeout.ms": "600"})
    assert "'kafka.delivery.timeout.ms' (1000)" in msg and "500 + 600" in msg
    # not set: raised to fit, as the Java producer does
    p = sink(**{"kafka.request.timeout.ms": "200000"}).producer
    assert p.delivery_timeout_ms == 200_005


def test_max_request_size_within_buffer_memory():
    msg = error_of(**{"kafka.max.request.size": "5000", "kafka.buffer.memory": "4000"})
    assert "'kafka.max.request.size' (5000)" in msg and "'kafka.buffer.memory' (4000)" in msg


def test_bootstrap_servers_required():
    with pytest.raises(OptionError, match="kafka.bootstrap.servers' is required"):
        parse_sink_options({"topic": "t"})


def test_serializers_and_java_classes_rejected_as_spark():
    for name in ("key.serializer", "value.serializer", "partitioner.class",
                 "interceptor.classes"):
        msg = error_of(**{f"kafka.{name}": "x"})
        assert f"'kafka.{name}' is not supported" in msg


def test_consumer_and_read_options_warn_and_are_ignored(caplog):
    with caplog.at_level(logging.WARNING):
        o = sink(**{"kafka.group.id": "g", "kafka.isolation.level": "read_committed",
                    "kafka.fetch.max.bytes": "5", "subscribe": "x", "startingOffsets": "earliest",
                    "kafka.retries": "3"})
    assert "'kafka.fetch.max.bytes', 'kafka.group.id', 'kafka.isolation.level'" in caplog.text
    assert "'startingOffsets', 'subscribe'" in caplog.text
    assert "'kafka.retries' is not used" in caplog.text
    assert "not known to pykafka" not in caplog.text  # producer settings are known
    assert o.producer == ProducerSettings()


def test_security_options_shared_with_the_source_and_secrets_wrapped():
    o = sink(**{"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN",
                "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule'
                                          ' required username="u" password="hunter2-secret";'})
    assert o.client_config["security_protocol"] == "SASL_SSL"
    assert isinstance(o.client_config["sasl_plain_password"], Secret)
    assert "hunter2" not in repr(o) and "hunter2" not in repr(pickle.loads(pickle.dumps(o)))


def test_options_pickle():
    o = sink(topic="t", **{"kafka.compression.type": "lz4"})
    assert pickle.loads(pickle.dumps(o)) == o


def test_exactly_once():
    o = sink(exactlyOnce="true", **{"kafka.transactional.id": "app"})
    assert o.exactly_once and o.transactional_id_prefix == "app"
    assert o.producer.transaction_timeout_ms == DEFAULT_EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS
    assert o.transactional_settings("app-q-3").transactional_id == "app-q-3"
    assert sink(exactlyOnce="true", **{"kafka.transaction.timeout.ms": "30000"}
                ).producer.transaction_timeout_ms == 30000
    assert "streaming writes (df.writeStream) only" in error_of(False, exactlyOnce="true")
    msg = error_of(exactlyOnce="true", **{"kafka.acks": "1"})
    assert "'exactlyOnce'" in msg and "'kafka.acks' is '1'" in msg
    assert "'kafka.enable.idempotence' is 'false'" in error_of(
        exactlyOnce="true", **{"kafka.enable.idempotence": "false"})
    assert "only used by exactly-once" in error_of(**{"kafka.transactional.id": "app"})
    assert "only used by exactly-once" in error_of(**{"kafka.transaction.timeout.ms": "5"})
    assert "is empty" in error_of(exactlyOnce="true", **{"kafka.transactional.id": " "})
    assert "'exactlyOnce' must be 'true' or 'false'" in error_of(exactlyOnce="1")


def test_exactly_once_warns_once_to_bound_micro_batches_within_the_transaction_timeout(caplog):
    # Issue 18 item 4: a micro-batch longer than the transaction timeout fails on every restart.
    # The sink cannot see the source: it says what to bound, once per process.
    caplog.set_level(logging.WARNING)
    sink(topic="t")
    assert "kafka.transaction.timeout.ms" not in caplog.text      # at-least-once: no word
    for _ in range(3):                                              # a writer per micro-batch
        sink(topic="t", exactlyOnce="true")
    assert caplog.text.count("'kafka.transaction.timeout.ms' (900000 ms here") == 1
    assert "'maxOffsetsPerTrigger'" in caplog.text and "transaction.max.timeout.ms" in caplog.text
    sink(topic="t", exactlyOnce="true", **{"kafka.transaction.timeout.ms": "60000"})
    assert "'kafka.transaction.timeout.ms' (60000 ms here" in caplog.text
