"""Tests of the broker utilities in kafka_source.testing.brokers (used by the suite, demo and benchmarks)."""

from __future__ import annotations

import os
import re
import time

import pytest

from kafka_source.testing import brokers as testing


# ---------------------------------------------------------------------------------------------
# Selection logic: nothing is started here
# ---------------------------------------------------------------------------------------------

class _Started:
    """Stands in for a broker class; records that it was started."""

    instances: list = []

    def __init__(self, *args, **kwargs):
        _Started.instances.append(self)
        self.bootstrap_servers = "fake:1"

    def stop(self):
        pass


@pytest.fixture
def no_real_brokers(monkeypatch):
    """Make select_broker unable to start or contact anything real."""

    class FakeEmbedded(_Started):
        kind = "embedded"

    class FakeContainers(_Started):
        kind = "testcontainers"

    class FakeLocalKafka(_Started):
        kind = "local-kafka"

    _Started.instances = []
    monkeypatch.setattr(testing, "EmbeddedBroker", FakeEmbedded)
    monkeypatch.setattr(testing, "TestcontainersBroker", FakeContainers)
    monkeypatch.setattr(testing, "LocalKafkaBroker", FakeLocalKafka)
    monkeypatch.delenv(testing.ENV_KAFKA_HOME, raising=False)
    monkeypatch.setattr(testing, "wait_for_broker", lambda *a, **k: {})
    monkeypatch.delenv(testing.ENV_BOOTSTRAP, raising=False)
    monkeypatch.delenv(testing.ENV_FORCE_KIND, raising=False)
    return monkeypatch


def _docker(monkeypatch, answer: bool, calls: list | None = None):
    def fake(*a, **k):
        if calls is not None:
            calls.append(1)
        return answer

    monkeypatch.setattr(testing, "docker_available", fake)


def test_select_honours_kafka_bootstrap_servers(no_real_brokers):
    calls: list = []
    _docker(no_real_brokers, True, calls)
    no_real_brokers.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka.example:9092")
    broker = testing.select_broker()
    assert broker.kind == "external"
    assert broker.bootstrap_servers == "kafka.example:9092"
    broker.stop()  # a no-op for an external broker
    assert calls == [] and _Started.instances == []


def test_select_uses_testcontainers_when_docker_answers(no_real_brokers):
    _docker(no_real_brokers, True)
    assert testing.select_broker().kind == "testcontainers"


def test_select_falls_back_to_embedded_without_docker(no_real_brokers):
    _docker(no_real_brokers, False)
    assert testing.select_broker().kind == "embedded"


def test_select_can_be_forced_to_embedded(no_real_brokers):
    calls: list = []
    _docker(no_real_brokers, True, calls)
    no_real_brokers.setenv(testing.ENV_FORCE_KIND, "embedded")
    assert testing.select_broker().kind == "embedded"
    assert calls == []


def test_select_uses_kafka_home_after_docker_before_embedded(no_real_brokers):
    no_real_brokers.setenv(testing.ENV_KAFKA_HOME, "/opt/kafka")
    _docker(no_real_brokers, False)
    assert testing.select_broker().kind == "local-kafka"
    _docker(no_real_brokers, True)
    assert testing.select_broker().kind == "testcontainers"
    no_real_brokers.setenv(testing.ENV_FORCE_KIND, "embedded")
    assert testing.select_broker().kind == "embedded"
    no_real_brokers.setenv(testing.ENV_FORCE_KIND, "local-kafka")
    assert testing.select_broker().kind == "local-kafka"


def test_local_kafka_needs_a_kraft_distribution(tmp_path, monkeypatch):
    monkeypatch.delenv(testing.ENV_KAFKA_HOME, raising=False)
    with pytest.raises(testing.BrokerStartError, match="KAFKA_HOME"):
        testing.LocalKafkaBroker()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kafka-server-start.sh").write_text("")
    with pytest.raises(testing.BrokerStartError, match="kafka-storage.sh.*3.3 or later"):
        testing.LocalKafkaBroker(str(tmp_path))


def test_select_rejects_unknown_forced_kind(no_real_brokers):
    no_real_brokers.setenv(testing.ENV_FORCE_KIND, "zookeeper")
    with pytest.raises(testing.BrokerStartError, match="zookeeper"):
        testing.select_broker()


def test_external_tansu_is_recognised_by_its_cluster_id():
    assert testing.ExternalBroker("h:1", cluster_id="tansu_cluster").is_tansu
    assert not testing.ExternalBroker("h:1", cluster_id="tansu_cluster").exact_end_offsets
    kafka = testing.ExternalBroker("h:1", cluster_id="MkU3OEVBNTcwNTJENDM2Qk")
    assert not kafka.is_tansu and kafka.exact_end_offsets and kafka.read_committed_hides_aborted


def test_unreachable_external_broker_fails_fast_and_clearly(monkeypatch):
    port = testing._free_port()  # nothing listens there
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(testing.BrokerStartError, match="KAFKA_BOOTSTRAP_SERVERS"):
        testing.select_broker(timeout_s=1)
    assert time.monotonic() - start < 10


def test_unique_topic_name():
    names = {testing.unique_topic_name("my topic/x") for _ in range(100)}
    assert len(names) == 100
    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name) and name.startswith("my-topic-x-")


def test_split_bootstrap():
    assert testing._split_bootstrap("a:1, PLAINTEXT://b:2,[::1]:3,c") == [
        ("a", 1), ("b", 2), ("::1", 3), ("c", 9092)]


def test_tansu_binary_is_found_and_executable():
    path = testing.find_tansu_binary()
    assert os.path.isfile(path) and os.access(path, os.X_OK)


def test_embedded_start_failure_reports_log_tail(tmp_path):
    fake = tmp_path / "tansu"
    fake.write_text("#!/bin/sh\necho 'fake tansu refuses to start'\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(testing.BrokerStartError) as info:
        testing.EmbeddedBroker(binary=str(fake), timeout_s=10)
    message = str(info.value)
    assert "fake tansu refuses to start" in message and "exit code 3" in message


# ---------------------------------------------------------------------------------------------
# Real brokers
# ---------------------------------------------------------------------------------------------

def _produce_and_consume(bootstrap: str, topic: str, partition: int = 0) -> list:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    try:
        meta = producer.send(topic, key=b"k", value=b"hello", partition=partition).get(timeout=30)
        assert meta.partition == partition
        producer.flush(timeout=30)
    finally:
        producer.close()

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        records: list = []
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=500).get(tp, []))
        return [(r.key, r.value) for r in records]
    finally:
        consumer.close()


@pytest.mark.integration
def test_embedded_broker_start_produce_consume_stop():
    broker = testing.EmbeddedBroker()
    try:
        assert broker.kind == "embedded" and broker.running
        assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
        assert broker.is_tansu
        assert not broker.exact_end_offsets and not broker.read_committed_hides_aborted
        topic = testing.unique_topic_name("embedded")
        testing.create_topic(broker.bootstrap_servers, topic, partitions=3)
        assert _produce_and_consume(broker.bootstrap_servers, topic, partition=2) == [
            (b"k", b"hello")]
        pid, tmpdir = broker.process.pid, broker._tmpdir
    finally:
        broker.stop()
    assert not broker.running
    with pytest.raises(ProcessLookupError):  # gone, and reaped: no process is left behind
        os.kill(pid, 0)
    assert not testing._tcp_open("127.0.0.1", broker.port)
    assert not os.path.exists(tmpdir)
    broker.stop()  # stopping twice is fine


def _kafka_home() -> str:
    home = os.environ.get(testing.ENV_KAFKA_HOME, "")
    if not home:
        pytest.skip("KAFKA_HOME is not set (no local Kafka distribution)")
    return home


@pytest.mark.integration
def test_local_kafka_broker_start_restart_stop():
    broker = testing.LocalKafkaBroker(_kafka_home())
    try:
        assert broker.kind == "local-kafka" and broker.running and not broker.is_tansu
        topic = testing.unique_topic_name("local")
        testing.create_topic(broker.bootstrap_servers, topic, partitions=2)
        assert _produce_and_consume(broker.bootstrap_servers, topic, partition=1) == [
            (b"k", b"hello")]
        port, pid = broker.ports["PLAINTEXT"], broker.process.pid
        broker.restart(hard=True)  # killed; same port, same data
        assert broker.ports["PLAINTEXT"] == port and broker.process.pid != pid
        assert _produce_and_consume(broker.bootstrap_servers, topic, partition=1)[0] == (
            b"k", b"hello")
        tmpdir = broker.dir
    finally:
        broker.stop()
    assert not broker.running and not os.path.exists(tmpdir)
    assert not testing._tcp_open("127.0.0.1", port)


@pytest.mark.integration
def test_embedded_broker_context_manager():
    with testing.EmbeddedBroker() as broker:
        testing.wait_for_broker(broker.bootstrap_servers, timeout_s=5)
        process = broker.process
    assert process.poll() is not None


def test_session_broker_create_topic_and_round_trip(kafka_broker, bootstrap_servers, broker_kind):
    from kafka.errors import TopicAlreadyExistsError

    assert broker_kind in {"external", "testcontainers", "local-kafka", "embedded"}
    topic = testing.unique_topic_name("session")
    testing.create_topic(bootstrap_servers, topic, partitions=2)
    with pytest.raises(TopicAlreadyExistsError):
        testing.create_topic(bootstrap_servers, topic, partitions=2)
    testing.create_topic(bootstrap_servers, topic, partitions=2, exist_ok=True)
    assert _produce_and_consume(bootstrap_servers, topic, partition=1) == [(b"k", b"hello")]


@pytest.mark.skip_on_embedded("demonstrates the marker; runs on real Kafka only")
def test_skip_on_embedded_marker_runs_on_real_kafka(kafka_broker):
    assert kafka_broker.kind != "embedded" and not kafka_broker.is_tansu
    assert kafka_broker.exact_end_offsets


def test_end_offsets_flags_match_broker(kafka_broker, bootstrap_servers):
    """exact_end_offsets says whether a multi-record batch moves 'latest' past its last record."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = testing.unique_topic_name("hwm")
    testing.create_topic(bootstrap_servers, topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=500)
    try:
        futures = [producer.send(topic, value=b"v%d" % i, partition=0) for i in range(3)]
        producer.flush(timeout=30)
        assert [f.get(timeout=30).offset for f in futures] == [0, 1, 2]
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers)
    try:
        end = consumer.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
    finally:
        consumer.close()
    if kafka_broker.exact_end_offsets:
        assert end == 3
    else:
        assert end in (1, 3)  # Tansu: base offset of the last batch + 1
