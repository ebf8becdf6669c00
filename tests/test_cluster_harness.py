"""Tests of the multi-node cluster harness (kafka_source.testing.cluster) that start nothing:
configuration of both generations, the distribution tools' command lines, the raw Metadata and
FindCoordinator round trips (against a fake broker socket), and what a failed wait says.

That it really starts, kills and restarts nodes is tested on real clusters in
``tests/cluster/test_harness.py`` (``-m cluster``).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading

import pytest

from kafka_source.testing import cluster as harness
from kafka_source.testing.brokers import BrokerStartError
from kafka_source.testing.certs import keytool_available
from kafka_source.testing.cluster import (KRAFT, ZOOKEEPER, ClusterError, KafkaCluster,
                                          SecureListener)

pytestmark = pytest.mark.pyspark_free

KRAFT_SCRIPTS = ("kafka-server-start.sh", "kafka-storage.sh", "kafka-leader-election.sh",
                 "kafka-reassign-partitions.sh")
ZK_SCRIPTS = ("kafka-server-start.sh", "zookeeper-server-start.sh",
              "kafka-preferred-replica-election.sh", "kafka-reassign-partitions.sh")


def fake_home(tmp_path, scripts) -> str:
    (tmp_path / "bin").mkdir(parents=True)
    for script in scripts:
        (tmp_path / "bin" / script).write_text("#!/bin/sh\nexit 1\n")
    return str(tmp_path)


@pytest.fixture
def laid_out(tmp_path):
    """A cluster of each mode with its directory, ports and configuration files written, and no
    process started; removed afterwards."""
    made = []

    def make(mode, **kwargs):
        home = fake_home(tmp_path / mode, KRAFT_SCRIPTS if mode == KRAFT else ZK_SCRIPTS)
        c = KafkaCluster(home, mode, start=False, **kwargs)
        c._layout()
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def read_properties(path) -> dict[str, str]:
    with open(path) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def test_a_distribution_without_the_tools_of_its_mode_is_refused(tmp_path):
    zk_only = fake_home(tmp_path / "zk", ZK_SCRIPTS)
    with pytest.raises(BrokerStartError, match="KRaft-capable.*kafka-storage.sh"):
        KafkaCluster.kraft(zk_only, start=False)
    kraft_only = fake_home(tmp_path / "kraft", KRAFT_SCRIPTS)
    with pytest.raises(BrokerStartError, match="ZooKeeper.*zookeeper-server-start.sh"):
        KafkaCluster.zookeeper(kraft_only, start=False)
    with pytest.raises(ValueError, match="mode"):
        KafkaCluster(kraft_only, "raft", start=False)
    assert KafkaCluster.kraft(kraft_only, start=False).mode == KRAFT
    assert KafkaCluster.zookeeper(zk_only, start=False).kind == "zookeeper-cluster"


def test_kraft_nodes_are_voters_of_one_quorum_with_replicated_defaults(laid_out):
    c = laid_out(KRAFT)
    assert sorted(c.nodes) == [1, 2, 3]
    ports = {n.port for n in c.nodes.values()} | {n.controller_port for n in c.nodes.values()}
    assert len(ports) == 6, "every listener on its own port"
    assert c.bootstrap_servers == ",".join(f"127.0.0.1:{c.nodes[i].port}" for i in (1, 2, 3))
    voters = ",".join(f"{i}@127.0.0.1:{c.nodes[i].controller_port}" for i in (1, 2, 3))
    for node_id, node in c.nodes.items():
        props = read_properties(node.config_path)
        assert props["node.id"] == str(node_id)
        assert props["process.roles"] == "broker,controller"
        assert props["controller.quorum.voters"] == voters
        assert props["listeners"] == (f"PLAINTEXT://127.0.0.1:{node.port},"
                                      f"CONTROLLER://127.0.0.1:{node.controller_port}")
        assert props["log.dirs"].startswith(node.dir)
        for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                    "default.replication.factor"):
            assert props[key] == "3", key
        assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
        assert props["group.initial.rebalance.delay.ms"] == "0"
        assert props["group.min.session.timeout.ms"] == "1000"
        assert props["delete.topic.enable"] == "true"
        assert int(props["offsets.topic.num.partitions"]) <= 10
        assert "zookeeper.connect" not in props and "broker.id" not in props


def test_zookeeper_nodes_share_one_zookeeper(laid_out):
    c = laid_out(ZOOKEEPER, nodes=3, properties={"min.insync.replicas": "1", "x.y": "z"})
    assert c.zookeeper_port and all(n.controller_port is None for n in c.nodes.values())
    for node_id, node in c.nodes.items():
        props = read_properties(node.config_path)
        assert props["broker.id"] == str(node_id)
        assert props["zookeeper.connect"] == f"127.0.0.1:{c.zookeeper_port}"
        assert props["listeners"] == f"PLAINTEXT://127.0.0.1:{node.port}"
        assert props["offsets.topic.replication.factor"] == "3"
        assert props["min.insync.replicas"] == "1" and props["x.y"] == "z"   # overrides win
        assert props["controlled.shutdown.enable"] == "true"
        assert "process.roles" not in props and "node.id" not in props
    zk = read_properties(os.path.join(c.dir, "zookeeper", "zookeeper.properties"))
    assert zk["clientPort"] == str(c.zookeeper_port) and zk["admin.enableServer"] == "false"


def test_tools_are_called_as_each_generation_needs(laid_out):
    kraft, zk = laid_out(KRAFT), laid_out(ZOOKEEPER)
    for node in kraft.nodes.values():      # tools only get the running nodes' addresses
        node.process = type("Alive", (), {"poll": lambda self: None})()
    kraft.nodes[2].process = None
    live = f"127.0.0.1:{kraft.nodes[1].port},127.0.0.1:{kraft.nodes[3].port}"
    assert kraft.election_command("/x.json") == [
        "kafka-leader-election.sh", "--bootstrap-server", live, "--election-type", "PREFERRED",
        "--path-to-json-file", "/x.json"]
    assert kraft.reassign_command("/r.json") == [
        "kafka-reassign-partitions.sh", "--bootstrap-server", live,
        "--reassignment-json-file", "/r.json", "--execute"]
    zk_address = f"127.0.0.1:{zk.zookeeper_port}"
    assert zk.election_command("/x.json") == [
        "kafka-preferred-replica-election.sh", "--zookeeper", zk_address,
        "--path-to-json-file", "/x.json"]
    assert zk.reassign_command("/r.json")[:3] == ["kafka-reassign-partitions.sh", "--zookeeper",
                                                  zk_address]
    path = zk._json_file("reassign", {"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [2, 3]}]})
    with open(path) as f:
        assert json.load(f)["partitions"][0]["replicas"] == [2, 3]
    for node in kraft.nodes.values():
        node.process = None


@pytest.mark.skipif(not keytool_available(), reason="needs the JDK's keytool")
@pytest.mark.parametrize("mode", [KRAFT, ZOOKEEPER])
def test_a_secure_cluster_gives_clients_a_sasl_ssl_listener(laid_out, mode):
    """Every node: a SECURE (SASL_SSL, SCRAM) listener of its own, advertised; PLAINTEXT stays
    the brokers' own listener; sessions end after reauth_ms on SECURE only; the user is made
    when KRaft storage is formatted; clients' options name the SECURE addresses only."""
    c = laid_out(mode, secure=SecureListener(reauth_ms=7000))
    secure_ports = {n.secure_port for n in c.nodes.values()}
    assert len(secure_ports | {n.port for n in c.nodes.values()}) == 6
    assert os.path.isfile(c.secure.keystore) and os.path.isfile(c.secure.ca_pem)
    for node in c.nodes.values():
        props = read_properties(node.config_path)
        served = f"PLAINTEXT://127.0.0.1:{node.port},SECURE://127.0.0.1:{node.secure_port}"
        assert props["advertised.listeners"] == served
        assert props["listeners"].startswith(served)
        assert props["listener.security.protocol.map"].startswith(
            "PLAINTEXT:PLAINTEXT,SECURE:SASL_SSL")
        assert props["inter.broker.listener.name"] == "PLAINTEXT"
        assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
        assert props["listener.name.secure.ssl.keystore.location"] == c.secure.keystore
        assert props["listener.name.secure.scram-sha-512.connections.max.reauth.ms"] == "7000"
        assert "ScramLoginModule" in props["listener.name.secure.scram-sha-512.sasl.jaas.config"]
        assert "connections.max.reauth.ms" not in props   # PLAINTEXT: nothing to renew
    assert c.secure.format_args() == [
        "--add-scram", f"SCRAM-SHA-512=[name={c.secure.user},password={c.secure.password}]"]
    options = c.client_options()
    assert options["kafka.bootstrap.servers"] == ",".join(
        f"127.0.0.1:{n.secure_port}" for n in c.nodes.values())
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.ssl.truststore.location"] == c.secure.ca_pem
    assert f'username="{c.secure.user}"' in options["kafka.sasl.jaas.config"]
    with pytest.raises(ClusterError, match="without a secure listener"):
        KafkaCluster(c.kafka_home, mode, start=False).client_options()
    with pytest.raises(ValueError, match="SCRAM-SHA-256 or SCRAM-SHA-512"):
        SecureListener(mechanism="PLAIN")


def test_socket_server_counters_are_summed_over_a_listeners_threads(laid_out, monkeypatch):
    """The JMX tool's lines, summed per attribute; Kafka 2.x's tool is given the listener's
    thread ids (it fails on patterns): num.network.threads per listener, in listener order."""
    c = laid_out(ZOOKEEPER)
    tool = os.path.join(c.kafka_home, "bin", "kafka-run-class.sh")
    with open(tool, "w") as f:
        f.write("#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/args\"\n"
                "echo time=1\n"
                "p=kafka.server:type=socket-server-metrics,listener=PLAINTEXT,networkProcessor\n"
                "echo \"$p=0:successful-reauthentication-total=2.0\"\n"
                "echo \"$p=1:successful-reauthentication-total=3.0\"\n"
                "echo \"$p=1:expired-connections-killed-count=0.0\"\n")
    os.chmod(tool, 0o755)
    got = c.socket_server_metrics(1, "PLAINTEXT", ["successful-reauthentication-total",
                                                   "expired-connections-killed-count"])
    assert got == {"successful-reauthentication-total": 5.0,
                   "expired-connections-killed-count": 0.0}
    with open(os.path.join(c.kafka_home, "bin", "args")) as f:
        args = f.read().split()
    assert args[0] == "kafka.tools.JmxTool"
    names = [args[i + 1] for i, a in enumerate(args) if a == "--object-name"]
    assert [n.rsplit("=", 1)[1] for n in names] == ["0", "1"]     # 2 threads, first listener
    assert f"rmi://127.0.0.1:{c.nodes[1].jmx_port}/jmxrmi" in " ".join(args)
    with pytest.raises(ClusterError, match="found no failed-reauthentication-total"):
        c.socket_server_metrics(1, "PLAINTEXT", ["failed-reauthentication-total"])
    with pytest.raises(ClusterError, match="no listener SECURE"):
        c.socket_server_metrics(1, "SECURE")


def test_a_failed_tool_is_an_error_with_its_output(laid_out):
    c = laid_out(KRAFT)
    script = os.path.join(c.kafka_home, "bin", "kafka-reassign-partitions.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\necho 'There is an existing assignment running.'\nexit 1\n")
    os.chmod(script, 0o755)
    with pytest.raises(ClusterError, match="(?s)exit code 1.*existing assignment"):
        c._tool("kafka-reassign-partitions.sh", "--execute")


def test_a_wait_that_times_out_names_what_it_waited_for_with_the_log_tail(laid_out):
    c = laid_out(KRAFT)
    log = os.path.join(c.nodes[2].dir, "logs", "server.log")
    with open(log, "w") as f:
        f.write("".join(f"line {i}\n" for i in range(100)) + "ERROR the reason\n")
    with pytest.raises(ClusterError) as info:
        c._wait(lambda: 1 / 0, 0.3, "node 2 to do something", last=lambda: "state X",
                tails=lambda: c._tails([c.nodes[2]]))
    message = str(info.value)
    assert "waiting for node 2 to do something: timed out" in message
    assert "state X" in message and "ZeroDivisionError" in message
    assert "ERROR the reason" in message and "line 50" not in message   # the tail only
    with pytest.raises(ClusterError, match="process exited"):
        c._wait(lambda: False, 30, "a dead node", alive=lambda: False)


def test_unknown_nodes_are_named(laid_out):
    c = laid_out(ZOOKEEPER)
    with pytest.raises(ValueError, match=r"no node 7 .*\[1, 2, 3\]"):
        c.kill(7)


class FakeBroker:
    """A socket that answers each request with ``answer(request_bytes, correlation_id)``."""

    def __init__(self, answer):
        self.answer = answer
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.server.accept()
        with conn:
            size = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))[0]
            body = conn.recv(size, socket.MSG_WAITALL)
            correlation_id = struct.unpack(">i", body[4:8])[0]
            conn.sendall(self.answer(body, correlation_id))

    def close(self):
        self.server.close()


def metadata_answer(correlation_id):
    from kafka.protocol.metadata import MetadataResponse as R

    P = R.MetadataResponseTopic.MetadataResponsePartition
    response = R(throttle_time_ms=0, cluster_id="c", controller_id=2, brokers=[
        R.MetadataResponseBroker(node_id=n, host="127.0.0.1", port=9000 + n, rack=None)
        for n in (1, 2)], topics=[
        R.MetadataResponseTopic(error_code=0, name="t", is_internal=False, partitions=[
            P(error_code=0, partition_index=0, leader_id=2, leader_epoch=4,
              replica_nodes=[1, 2, 3], isr_nodes=[2, 1], offline_replicas=[3]),
            P(error_code=5, partition_index=1, leader_id=-1, leader_epoch=4,
              replica_nodes=[3, 1, 2], isr_nodes=[], offline_replicas=[])]),
        R.MetadataResponseTopic(error_code=3, name="gone", is_internal=False, partitions=[])])
    response.API_VERSION = 7
    response.with_header(correlation_id=correlation_id)
    return response.encode(header=True, framed=True)


def test_metadata_is_asked_of_one_node_and_read_as_its_view():
    from kafka.protocol.metadata import MetadataRequest

    asked = []

    def answer(body, correlation_id):
        asked.append(MetadataRequest.decode(body, version=7, header=True))
        return metadata_answer(correlation_id)

    broker = FakeBroker(answer)
    try:
        view = harness.fetch_metadata(broker.address, node_id=1)
    finally:
        broker.close()
    assert asked[0].header.request_api_version == 7 and asked[0].topics is None
    assert asked[0].allow_auto_topic_creation is False
    assert view.node_id == 1 and view.brokers == {1, 2} and view.controller_id == 2
    assert view.partition("t", 0) == harness.PartitionState(2, (1, 2, 3), (2, 1), 0)
    assert view.partition("t", 1).leader == -1
    assert view.topic_errors == {"gone": 3} and "gone" not in view.topics


def test_an_answer_to_another_request_is_refused():
    broker = FakeBroker(lambda body, correlation_id: metadata_answer(correlation_id + 1))
    try:
        with pytest.raises(ConnectionError, match="correlation id"):
            harness.fetch_metadata(broker.address, node_id=1)
    finally:
        broker.close()


def test_find_coordinator_reads_error_and_node():
    from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

    keys = []

    def answer(body, correlation_id):
        keys.append(FindCoordinatorRequest.decode(body, version=2, header=True).key)
        response = FindCoordinatorResponse(throttle_time_ms=0, error_code=15, error_message=None,
                                           node_id=-1, host="", port=-1)
        response.API_VERSION = 2
        response.with_header(correlation_id=correlation_id)
        return response.encode(header=True, framed=True)

    broker = FakeBroker(answer)
    try:
        assert harness.find_coordinator(broker.address, "my-group") == (15, -1)
    finally:
        broker.close()
    assert keys == ["my-group"]
