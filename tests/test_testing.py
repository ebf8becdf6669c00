"""Tests of the broker utilities in kafka_source.testing.brokers (used by the suite, demo and benchmarks)."""

from __future__ import annotations

import os
import re
import socket
import time

import pytest

from kafka_source.testing import brokers as testing

pytestmark = pytest.mark.pyspark_free


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

    class FakeLocalZkKafka(_Started):
        kind = "local-kafka-zk"

    _Started.instances = []
    monkeypatch.setattr(testing, "EmbeddedBroker", FakeEmbedded)
    monkeypatch.setattr(testing, "TestcontainersBroker", FakeContainers)
    monkeypatch.setattr(testing, "LocalKafkaBroker", FakeLocalKafka)
    monkeypatch.setattr(testing, "LocalZkKafkaBroker", FakeLocalZkKafka)
    monkeypatch.delenv(testing.ENV_KAFKA_HOME, raising=False)
    monkeypatch.delenv(testing.ENV_KAFKA_ZK_HOME, raising=False)
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


def test_select_takes_kafka_zk_home_only_when_asked(no_real_brokers):
    no_real_brokers.setenv(testing.ENV_KAFKA_ZK_HOME, "/opt/kafka-2.2")
    _docker(no_real_brokers, False)
    assert testing.select_broker().kind == "embedded"
    no_real_brokers.setenv(testing.ENV_KAFKA_HOME, "/opt/kafka")
    assert testing.select_broker().kind == "local-kafka"
    no_real_brokers.setenv(testing.ENV_FORCE_KIND, "local-kafka-zk")
    assert testing.select_broker().kind == "local-kafka-zk"


def test_local_distribution_follows_the_forced_kind(no_real_brokers):
    """Tests that start brokers of their own start them from the session's distribution."""
    assert testing.local_distribution() is None
    with pytest.raises(testing.BrokerStartError, match="KAFKA_HOME.*KAFKA_ZK_HOME"):
        testing.start_local_broker()
    no_real_brokers.setenv(testing.ENV_KAFKA_ZK_HOME, "/opt/kafka-2.2")
    assert testing.local_distribution() is None
    no_real_brokers.setenv(testing.ENV_KAFKA_HOME, "/opt/kafka")
    assert testing.local_distribution() == (testing.LocalKafkaBroker, "/opt/kafka")
    no_real_brokers.setenv(testing.ENV_FORCE_KIND, "local-kafka-zk")
    assert testing.local_distribution() == (testing.LocalZkKafkaBroker, "/opt/kafka-2.2")
    assert testing.start_local_broker(listeners={"X": "SSL"}).kind == "local-kafka-zk"
    no_real_brokers.delenv(testing.ENV_KAFKA_ZK_HOME)
    assert testing.local_distribution() is None  # not KAFKA_HOME's KRaft Kafka instead
    no_real_brokers.setenv(testing.ENV_FORCE_KIND, "embedded")
    assert testing.local_distribution() == (testing.LocalKafkaBroker, "/opt/kafka")


def test_local_zk_kafka_needs_a_distribution_with_zookeeper(tmp_path, monkeypatch):
    monkeypatch.delenv(testing.ENV_KAFKA_ZK_HOME, raising=False)
    with pytest.raises(testing.BrokerStartError, match="KAFKA_ZK_HOME"):
        testing.LocalZkKafkaBroker()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kafka-server-start.sh").write_text("")
    with pytest.raises(testing.BrokerStartError, match="zookeeper-server-start.sh.*3.x or earlier"):
        testing.LocalZkKafkaBroker(str(tmp_path))


def test_distribution_version_is_read_from_the_core_jar(tmp_path):
    assert testing.distribution_version(str(tmp_path)) is None
    (tmp_path / "libs").mkdir()
    for name in ("kafka-clients-2.2.0.jar", "kafka_2.12-2.2.0-test.jar", "kafka_2.12-2.2.0.jar",
                 "kafka-streams-2.2.0.jar"):
        (tmp_path / "libs" / name).write_text("")
    assert testing.distribution_version(str(tmp_path)) == (2, 2)
    (tmp_path / "libs" / "kafka_2.12-2.2.0.jar").unlink()
    (tmp_path / "libs" / "kafka_2.13-4.0.0.jar").write_text("")
    assert testing.distribution_version(str(tmp_path)) == (4, 0)


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


@pytest.fixture
def offered_ports(monkeypatch, tmp_path):
    """The list of ports the kernel's probe sockets will offer ``_free_port``, in order (fill
    it); nothing handed out yet, and the ports held in a directory of the test's own."""
    from kafka_source.testing import brokers

    offered: list[int] = []

    class Probe:
        def __init__(self, *args):
            self.port = offered.pop(0)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(brokers, "_PORTS_DIR", str(tmp_path / "ports"))
    monkeypatch.setattr(brokers, "_handed_out_ports", set())
    monkeypatch.setattr(brokers, "_port_locks", {})
    monkeypatch.setattr(brokers.socket, "socket", Probe)
    monkeypatch.setattr(brokers, "_private_ports", lambda: (0, 0))   # the kernel's offers
    yield offered
    for fd in brokers._port_locks.values():
        os.close(fd)


def test_free_ports_come_from_below_the_ephemeral_range(monkeypatch, tmp_path):
    """Outgoing connections take their local ports from the kernel's ephemeral range: a port
    picked there can be taken before the broker binds it. Picked below it, a port that is in
    use is skipped."""
    import socket

    from kafka_source.testing import brokers

    low, high = brokers._private_ports()
    if (low, high) == (0, 0):
        pytest.skip("no ip_local_port_range on this system")
    monkeypatch.setattr(brokers, "_PORTS_DIR", str(tmp_path / "ports"))
    monkeypatch.setattr(brokers, "_handed_out_ports", set())
    monkeypatch.setattr(brokers, "_port_locks", {})
    with socket.socket() as in_use:
        in_use.bind(("127.0.0.1", low + 17))
        in_use.listen()
        offers = iter([low + 17, low + 18])
        monkeypatch.setattr(brokers.random, "randrange", lambda a, b: next(offers))
        assert brokers._free_port() == low + 18            # low + 17 is in use: skipped
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        assert high == int(f.read().split()[0])            # below the ephemeral range
    for fd in brokers._port_locks.values():
        os.close(fd)


def test_free_ports_are_never_handed_out_twice(offered_ports):
    """A broker's listeners are picked one after the other; the kernel may offer a just-closed
    probe port again, and two listeners on one port stop the broker from starting."""
    from kafka_source.testing import brokers

    offered_ports.extend([50001, 50001, 50002, 50001, 50002, 50003])
    assert [brokers._free_port() for _ in range(3)] == [50001, 50002, 50003]


def test_a_port_another_process_holds_is_not_handed_out(offered_ports, monkeypatch, tmp_path):
    """CI runs two passes side by side: a port that another process picked (and holds) is
    skipped, even when the kernel offers it again before that process binds it; once that
    process is gone the port can be had again."""
    import subprocess
    import sys

    from kafka_source.testing import brokers

    os.makedirs(brokers._PORTS_DIR)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)",
         os.path.join(brokers._PORTS_DIR, "50001")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        offered_ports.extend([50001, 50002])
        assert brokers._free_port() == 50002
    finally:
        holder.kill()
        holder.wait()
    monkeypatch.setattr(brokers, "_handed_out_ports", set())
    offered_ports.append(50001)
    assert brokers._free_port() == 50001


def test_free_ports_are_distinct_and_free():
    ports = [testing._free_port() for _ in range(200)]
    assert len(set(ports)) == 200
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


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
@pytest.mark.once     # starts a broker of its own, whatever the pass's broker: once is enough
def test_local_kafka_broker_start_restart_stop():
    broker = testing.LocalKafkaBroker(_kafka_home())
    try:
        assert broker.kind == "local-kafka" and broker.running and not broker.is_tansu
        assert not broker.zookeeper_mode
        assert broker.version == testing.distribution_version(broker.kafka_home)
        assert testing.probe_broker_version(broker.bootstrap_servers) == (broker.version, False)
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


def _kafka_zk_home() -> str:
    home = os.environ.get(testing.ENV_KAFKA_ZK_HOME, "")
    if not home:
        pytest.skip("KAFKA_ZK_HOME is not set (no local ZooKeeper-mode Kafka distribution)")
    return home


@pytest.mark.integration
@pytest.mark.once     # starts brokers of its own, whatever the pass's broker: once is enough
def test_local_zk_kafka_broker_start_restart_stop():
    user, password = "alice", "alice-secret"
    broker = testing.LocalZkKafkaBroker(
        _kafka_zk_home(), listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT"},
        properties={"sasl.enabled.mechanisms": "SCRAM-SHA-512",
                    "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config":
                        "org.apache.kafka.common.security.scram.ScramLoginModule required;"},
        scram_users=[("SCRAM-SHA-512", user, password)])
    try:
        assert broker.kind == "local-kafka-zk" and broker.running and broker.zookeeper_mode
        assert broker.version == testing.distribution_version(broker.kafka_home)
        assert testing.probe_broker_version(broker.bootstrap_servers) == (broker.version, True)
        topic = testing.unique_topic_name("local-zk")
        testing.create_topic(broker.bootstrap_servers, topic, partitions=2)
        assert _produce_and_consume(broker.bootstrap_servers, topic, partition=1) == [
            (b"k", b"hello")]
        # the SCRAM user written to ZooKeeper before the broker started can log in
        from kafka import KafkaProducer
        producer = KafkaProducer(bootstrap_servers=broker.address("SASL_PLAINTEXT"),
                                 security_protocol="SASL_PLAINTEXT",
                                 sasl_mechanism="SCRAM-SHA-512", sasl_plain_username=user,
                                 sasl_plain_password=password)
        try:
            assert producer.send(topic, b"scram", partition=0).get(timeout=30).offset == 0
        finally:
            producer.close()
        port, pid, zk_pid = broker.ports["PLAINTEXT"], broker.process.pid, broker.zookeeper.pid
        broker.restart(hard=True)  # killed; waits out its ZooKeeper session; same port and data
        assert broker.ports["PLAINTEXT"] == port and broker.process.pid != pid
        assert broker.zookeeper.pid == zk_pid
        assert _produce_and_consume(broker.bootstrap_servers, topic, partition=1)[0] == (
            b"k", b"hello")
        tmpdir, zookeeper = broker.dir, broker.zookeeper
    finally:
        broker.stop()
    assert not broker.running and zookeeper.poll() is not None and not os.path.exists(tmpdir)
    assert not testing._tcp_open("127.0.0.1", port)


@pytest.mark.integration
def test_embedded_broker_context_manager():
    with testing.EmbeddedBroker() as broker:
        testing.wait_for_broker(broker.bootstrap_servers, timeout_s=5)
        process = broker.process
    assert process.poll() is not None


def test_session_broker_create_topic_and_round_trip(kafka_broker, bootstrap_servers, broker_kind):
    from kafka.errors import TopicAlreadyExistsError

    assert broker_kind in {"external", "testcontainers", "local-kafka", "local-kafka-zk",
                           "embedded"}
    assert len(kafka_broker.version) == 2 and isinstance(kafka_broker.zookeeper_mode, bool)
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


def test_random_cluster_ids_look_like_kafkas_and_never_start_with_a_dash(monkeypatch):
    """KRaft storage is formatted with an id made here, as `kafka-storage.sh random-uuid` would
    make it (no JVM started for it)."""
    import base64

    from kafka_source.testing import brokers

    ids = {brokers.random_cluster_id() for _ in range(300)}
    assert len(ids) == 300
    for cluster_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id) and not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    # an id that would start with "-" (first byte 0xf8..0xfb) or a reserved one is drawn again
    draws = iter([b"\xf8" + bytes(15), bytes(16), bytes(15) + b"\x01", b"\x01" * 16])
    monkeypatch.setattr(brokers.os, "urandom", lambda n: next(draws))
    assert brokers.random_cluster_id() == base64.urlsafe_b64encode(b"\x01" * 16).decode()[:22]
