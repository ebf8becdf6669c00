"""Multi-node Apache Kafka clusters on loopback, for the production-failure scenarios.

A single broker cannot show what a production cluster does when one of its machines fails:
leadership moves to another replica, the group coordinator moves with its offsets partition,
in-sync replica sets shrink and grow, and a client has to follow all of it. :class:`KafkaCluster`
runs three (by default) real Kafka nodes from a local distribution, on free loopback ports, with
their data and logs in a temporary directory, in either generation the connector supports:

``KafkaCluster.kraft(home)``
    Kafka 3.3+ in KRaft mode (here: Kafka 4.0). Every node is broker *and* controller in one JVM
    (``process.roles=broker,controller``, ``node.id`` 1..n, a static
    ``controller.quorum.voters`` naming all of them), the storage of each node formatted with
    one cluster id (without ``--standalone``: the quorum is static). The metadata quorum needs a
    majority of the nodes: with two of three nodes down nothing can change leadership any more
    (see :meth:`KafkaCluster.stop`).
``KafkaCluster.zookeeper(home)``
    Kafka 2.x in ZooKeeper mode (here: 2.2), ``broker.id`` 1..n sharing one ZooKeeper that the
    cluster starts itself and keeps out of every fault: ZooKeeper is the one component the
    scenarios never break.

Defaults are a small production cluster's (:data:`REPLICATED_DEFAULTS`): every internal topic
replicated three times, ``min.insync.replicas=2`` (so ``acks=all`` writes survive one lost node
and stop when two are gone), no unclean elections, no automatic leader rebalancing (a scenario
decides when leaders move, with :meth:`KafkaCluster.preferred_leader_election`). Timeouts that
only decide how fast a failure is *noticed* are shortened so that tests stay fast; each is
explained where it is set.

What a test does with it::

    cluster = KafkaCluster.kraft("/opt/kafka")          # started; stop() removes everything
    cluster.create_topic("clicks", partitions=3)        # replication factor 3
    leader = cluster.leader("clicks", 0)
    cluster.kill(leader)                                 # SIGKILL: a crash
    cluster.wait_noticed_down(leader)                    # the cluster noticed
    cluster.start(leader)                                # same ports, same data
    cluster.wait_in_sync(leader)                         # caught up: back in every ISR
    cluster.stop(cluster.coordinator("my-group"))        # SIGTERM: a controlled shutdown
    cluster.rolling_restart()                            # one node after the other
    cluster.reassign("clicks", 0, [2, 3])
    cluster.wait_unclean_leader("t", 0, 2)              # a topic that allows unclean elections
    cluster.stop()

Facts the waits are built on (measured on these machines):

* A ZooKeeper-mode broker opens its listener before the controller has sent it the cluster's
  metadata; until then it answers Metadata with no (or too few) brokers and
  UNKNOWN_TOPIC_OR_PARTITION for topics that exist. :meth:`KafkaCluster.start` of a node returns
  only once the node itself lists every running node and every topic the others know.
* A KRaft broker does not serve before it has caught up with the metadata log, but a SIGKILLed
  node stays named as partition leader until the controller fences it, after
  ``broker.session.timeout.ms``; a ZooKeeper-mode broker the same until its ZooKeeper session
  expires (``zookeeper.session.timeout.ms``). :meth:`KafkaCluster.wait_noticed_down` waits for
  that. A ZooKeeper-mode controller does not always take a crashed follower out of the ISRs
  (measured on Kafka 2.2: when the crashed node was the controller, its successor left it in
  the ISR of partitions it followed for more than 90 s, until their leaders shrank them and that
  change reached the other brokers); KRaft's controller does, at once.
* Metadata is answered from each broker's own cache, which lags the controller slightly (in
  ZooKeeper mode ISR changes reach the controller through ZooKeeper, seconds later). So every
  "the cluster is in state X" wait asks *every running node* and is satisfied only when all of
  them agree.

Every wait is bounded and fails with :class:`ClusterError`, naming what was waited for, the last
state seen, and the log tail of the node(s) concerned. Node processes are tracked like the
single brokers of :mod:`.brokers` and killed at interpreter exit at the latest.

Cluster state is read with small Metadata and FindCoordinator requests sent straight to one
node's socket (kafka-python's protocol classes, no client library behaviour in between): the
harness must be able to ask *a given node* what it believes, and must not depend on the
connector under test (:mod:`.cluster_view`). Topics, elections and reassignments go through
the distribution's tools (:mod:`.cluster_tools`); the SASL_SSL client listener of a cluster
started with ``secure`` is in :mod:`.cluster_security`, the brokers' JMX counters in
:mod:`.jmx`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, TypeVar

from .brokers import (BrokerHandle, BrokerStartError, _free_port, _live_brokers, _live_lock,
                      random_cluster_id,
                      _tcp_open, _track, wait_for_broker)
from .cluster_security import SecureListener, expired_sessions
from .cluster_tools import ClusterTools
# one node's view and the request helpers, also importable from here as before
from .cluster_view import (KRAFT, ZOOKEEPER, ClusterError, ClusterMetadata,
                           PartitionState, fetch_metadata, find_coordinator)
from .jmx import REAUTHENTICATION_METRICS, jmx_options, socket_server_metrics

__all__ = ["ClusterError", "ClusterMetadata", "ClusterNode", "KafkaCluster", "KRAFT",
           "PartitionState", "REPLICATED_DEFAULTS", "SecureListener", "ZOOKEEPER"]

#: Heap of each broker JVM. Three brokers, a ZooKeeper and Spark share a 2-core machine with
#: other test runs; 384 MB is plenty for test traffic.
DEFAULT_HEAP_OPTS = "-Xmx384m -Xms128m"
#: Heap of the distribution's command-line tools (kafka-storage.sh, kafka-reassign-partitions.sh...)
TOOL_HEAP_OPTS = "-Xmx128m -Xms32m"
ZOOKEEPER_HEAP_OPTS = "-Xmx128m -Xms32m"
#: Kafka 2.2's kafka-run-class.sh adds -XX:+ExplicitGCInvokesConcurrent; these are the flags the
#: shared run-zk script uses on Java 17.
LEGACY_JVM_PERFORMANCE_OPTS = ("-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 "
                               "-XX:InitiatingHeapOccupancyPercent=35 -Djava.awt.headless=true")

#: How long a node may take to start and know the cluster (JVM start, log recovery after a
#: crash, catching up). Three JVMs starting at once on two busy cores take ~20 s here.
NODE_START_TIMEOUT_S = 120.0
#: How long a controlled shutdown may take before the node is declared stuck (and killed).
NODE_STOP_TIMEOUT_S = 60.0
#: How long waits for cluster state (ISR, leaders, elections, reassignments) may take.
STATE_TIMEOUT_S = 90.0

#: Broker settings of every node, both generations: a small production cluster.
REPLICATED_DEFAULTS: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    # Few internal partitions: each is one more leader to move and to catch up on every fault.
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": "3",
    "unclean.leader.election.enable": "false",
    # Leaders move when a scenario says so (preferred_leader_election), not every 5 minutes.
    "auto.leader.rebalance.enable": "false",
    "delete.topic.enable": "true",
    # Topics are created explicitly; a typo must not create one.
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    # Groups form at once (no 3 s wait for more members); tests use short session timeouts.
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    # A follower that stopped fetching leaves the ISR after this long (Kafka 2.2's default is
    # 10 s, 4.0's 30 s): a crashed follower is also dropped by the controller at once, so this
    # only matters for a stalled one.
    "replica.lag.time.max.ms": "10000",
    # Small JVMs: the log cleaner's dedupe buffer is 128 MB by default.
    "log.cleaner.dedupe.buffer.size": "16777216",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.replica.fetchers": "1",
    "num.recovery.threads.per.data.dir": "1",
}

#: KRaft-only settings.
KRAFT_DEFAULTS: dict[str, str] = {
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    # A SIGKILLed broker stays leader of its partitions until the controller fences it after
    # this long without a heartbeat (default 9 s, heartbeats every 2 s). Shorter keeps the
    # scenarios fast; heartbeats every second leave room for a busy machine.
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1000",
}

#: ZooKeeper-mode-only settings.
ZOOKEEPER_MODE_DEFAULTS: dict[str, str] = {
    # A crashed broker is noticed when its ZooKeeper session expires (2.2's default: 6 s).
    "zookeeper.session.timeout.ms": "6000",
    "zookeeper.connection.timeout.ms": "60000",
    # A controlled shutdown that the controller cannot serve (e.g. no other broker left) is
    # retried this often, this far apart, before the broker shuts down anyway (default 3 x 5 s).
    "controlled.shutdown.enable": "true",
    "controlled.shutdown.max.retries": "2",
    "controlled.shutdown.retry.backoff.ms": "1000",
}

# Kafka error codes the waits look at.
_NONE = 0
_COORDINATOR_LOAD_IN_PROGRESS = 14
_COORDINATOR_NOT_AVAILABLE = 15
_NOT_COORDINATOR = 16

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Nodes
# --------------------------------------------------------------------------------------------

@dataclass
class ClusterNode:
    """One broker JVM: its id, ports (kept across restarts) and directory."""

    node_id: int
    port: int
    controller_port: int | None     # KRaft only
    dir: str
    process: subprocess.Popen | None = None
    starts: int = 0
    secure_port: int | None = None  # the SECURE client listener (clusters with ``secure``)
    jmx_port: int | None = None
    killed: bool = False            # SIGKILLed since its last start (ZooKeeper: session left)

    @property
    def secure_address(self) -> str | None:
        return f"127.0.0.1:{self.secure_port}" if self.secure_port else None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def config_path(self) -> str:
        return os.path.join(self.dir, "server.properties")

    def log_tail(self, lines: int = 30) -> str:
        return _tail(os.path.join(self.dir, "logs", "server.log"), lines,
                     fallback=os.path.join(self.dir, "stdout.log"))


def _tail(path: str, lines: int, fallback: str | None = None) -> str:
    if not os.path.exists(path) and fallback:
        path = fallback
    if not os.path.exists(path):
        return "(no log)"
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 64_000))
        data = f.read()
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:]) or "(empty log)"


def properties_text(props: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in props.items())


# --------------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------------

class KafkaCluster(ClusterTools, BrokerHandle):
    """``nodes`` Kafka nodes (ids 1..n) from the distribution at ``kafka_home`` in ``mode``
    (:data:`KRAFT` or :data:`ZOOKEEPER`); see the module docstring.

    ``properties`` are added to (or replace) every node's settings. ``secure`` adds a SASL_SSL
    client listener to every node (:mod:`.cluster_security`): :attr:`secure_bootstrap_servers`,
    :meth:`client_options`. Every node serves JMX on loopback (:meth:`socket_server_metrics`).
    ``start=False`` leaves the
    cluster unstarted (:meth:`start` starts it). :meth:`stop` without a node ends the cluster
    and removes its directory; with a node it is a controlled shutdown of that node only.
    """

    def __init__(self, kafka_home: str, mode: str = KRAFT, *, nodes: int = 3,
                 properties: Mapping[str, str] | None = None,
                 secure: SecureListener | None = None,
                 heap_opts: str = DEFAULT_HEAP_OPTS, start: bool = True,
                 start_timeout_s: float = NODE_START_TIMEOUT_S,
                 state_timeout_s: float = STATE_TIMEOUT_S):
        if mode not in (KRAFT, ZOOKEEPER):
            raise ValueError(f"mode must be {KRAFT!r} or {ZOOKEEPER!r}, not {mode!r}")
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.kafka_home = os.path.abspath(kafka_home)
        self.mode = mode
        self.kind = f"{mode}-cluster"
        needed = (["kafka-server-start.sh", "kafka-storage.sh", "kafka-leader-election.sh",
                   "kafka-reassign-partitions.sh"] if mode == KRAFT else
                  ["kafka-server-start.sh", "zookeeper-server-start.sh",
                   "kafka-preferred-replica-election.sh", "kafka-reassign-partitions.sh"])
        missing = [s for s in needed if not os.path.isfile(os.path.join(self.kafka_home, "bin", s))]
        if missing:
            what = ("a KRaft-capable Kafka (3.3 or later)" if mode == KRAFT
                    else "a Kafka distribution with ZooKeeper (2.x or 3.x)")
            raise BrokerStartError(f"{kafka_home!r} is not {what}: no bin/{', bin/'.join(missing)}")
        self.size = nodes
        self.properties = dict(properties or {})
        self.secure = secure
        self._secure_user_added = False
        self.secure_bootstrap_servers = ""
        self.heap_opts = heap_opts
        self.start_timeout_s = start_timeout_s
        self.state_timeout_s = state_timeout_s
        self.dir: str | None = None
        self.nodes: dict[int, ClusterNode] = {}
        self.zookeeper_port: int | None = None
        self.zookeeper_process: subprocess.Popen | None = None
        self.bootstrap_servers = ""
        if start:
            self.start()

    @classmethod
    def kraft(cls, kafka_home: str, **kwargs) -> "KafkaCluster":
        """A KRaft cluster (Kafka 3.3+): every node broker and controller."""
        return cls(kafka_home, KRAFT, **kwargs)

    @classmethod
    def zookeeper(cls, kafka_home: str, **kwargs) -> "KafkaCluster":
        """A ZooKeeper-mode cluster (Kafka 2.x/3.x) with its own ZooKeeper."""
        return cls(kafka_home, ZOOKEEPER, **kwargs)

    def __repr__(self) -> str:
        up = [n.node_id for n in self.nodes.values() if n.running]
        return f"<KafkaCluster {self.mode} nodes up {up} at {self.bootstrap_servers or '-'}>"

    # -- layout and configuration ------------------------------------------------------------

    def _layout(self) -> None:
        """Directory, ports and configuration files: once per cluster, kept across restarts."""
        self.dir = tempfile.mkdtemp(prefix=f"pykafka-{self.mode}-cluster-")
        for node_id in range(1, self.size + 1):
            node_dir = os.path.join(self.dir, f"node-{node_id}")
            os.makedirs(os.path.join(node_dir, "logs"))
            self.nodes[node_id] = ClusterNode(
                node_id, _free_port(), _free_port() if self.mode == KRAFT else None, node_dir,
                secure_port=_free_port() if self.secure else None, jmx_port=_free_port())
        if self.mode == ZOOKEEPER:
            self.zookeeper_port = _free_port()
            os.makedirs(os.path.join(self.dir, "zookeeper", "logs"))
            with open(os.path.join(self.dir, "zookeeper", "zookeeper.properties"), "w") as f:
                f.write(properties_text(self.zookeeper_properties()))
        self.bootstrap_servers = ",".join(n.address for n in self.nodes.values())
        if self.secure is not None:
            self.secure.prepare(os.path.join(self.dir, "tls"))
            self.secure_bootstrap_servers = ",".join(n.secure_address
                                                     for n in self.nodes.values())
        for node in self.nodes.values():
            with open(node.config_path, "w") as f:
                f.write(properties_text(self.node_properties(node.node_id)))

    def node_properties(self, node_id: int) -> dict[str, str]:
        """The server.properties of node ``node_id`` (the layout must exist)."""
        node = self.nodes[node_id]
        props: dict[str, str] = {"log.dirs": os.path.join(node.dir, "data")}
        # clients' listeners, advertised as they are; PLAINTEXT is also the brokers' own
        served = f"PLAINTEXT://{node.address}"
        protocols = "PLAINTEXT:PLAINTEXT"
        if self.secure is not None:
            served += f",{self.secure.name}://{node.secure_address}"
            protocols += f",{self.secure.protocol_entry}"
        if self.mode == KRAFT:
            voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}"
                              for n in self.nodes.values())
            props.update({
                "process.roles": "broker,controller",
                "node.id": str(node_id),
                "controller.quorum.voters": voters,
                "listeners": f"{served},CONTROLLER://127.0.0.1:{node.controller_port}",
                "advertised.listeners": served,
                "listener.security.protocol.map": f"{protocols},CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "PLAINTEXT",
                "controller.listener.names": "CONTROLLER",
                **REPLICATED_DEFAULTS, **KRAFT_DEFAULTS,
            })
        else:
            props.update({
                "broker.id": str(node_id),
                "listeners": served,
                "advertised.listeners": served,
                "listener.security.protocol.map": protocols,
                "inter.broker.listener.name": "PLAINTEXT",
                "zookeeper.connect": f"127.0.0.1:{self.zookeeper_port}",
                **REPLICATED_DEFAULTS, **ZOOKEEPER_MODE_DEFAULTS,
            })
        if self.secure is not None:
            props.update(self.secure.broker_properties())
        props.update(self.properties)
        return props

    def zookeeper_properties(self) -> dict[str, str]:
        return {"dataDir": os.path.join(self.dir, "zookeeper", "data"),
                "clientPort": str(self.zookeeper_port), "clientPortAddress": "127.0.0.1",
                "maxClientCnxns": "0", "admin.enableServer": "false", "tickTime": "2000"}

    def _env(self, log_dir: str, heap: str) -> dict[str, str]:
        env = {**os.environ, "LOG_DIR": log_dir, "KAFKA_HEAP_OPTS": heap}
        if self.mode == ZOOKEEPER and "KAFKA_JVM_PERFORMANCE_OPTS" not in os.environ:
            # unless the run chose its own (a test run's lean JVMs: kafka_source.testing.jvm)
            env["KAFKA_JVM_PERFORMANCE_OPTS"] = LEGACY_JVM_PERFORMANCE_OPTS
        # A caller's KAFKA_OPTS (agents, JMX) or log4j settings must not leak into the nodes.
        for key in ("KAFKA_OPTS", "KAFKA_JMX_OPTS", "JMX_PORT", "KAFKA_LOG4J_OPTS"):
            env.pop(key, None)
        return env

    def _tool_env(self) -> dict[str, str]:
        """The environment of the distribution's command-line tools (small heap, own logs)."""
        return self._env(os.path.join(self.dir or tempfile.gettempdir(), "tool-logs"),
                         TOOL_HEAP_OPTS)

    def _bin(self, script: str) -> str:
        return os.path.join(self.kafka_home, "bin", script)

    def _format_storage(self) -> None:
        """KRaft: one cluster id, every node's storage formatted with it (in parallel)."""
        env = self._tool_env()
        cluster_id = random_cluster_id()
        procs = {n.node_id: subprocess.Popen(
            [self._bin("kafka-storage.sh"), "format", "-t", cluster_id, "-c", n.config_path,
             *(self.secure.format_args() if self.secure is not None else ())],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            for n in self.nodes.values()}
        failed = []
        for node_id, proc in procs.items():
            try:
                output, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
            if proc.returncode != 0:
                failed.append(f"node {node_id}: {output}")
        if failed:
            raise ClusterError("kafka-storage.sh format failed:\n" + "\n".join(failed))

    # -- processes ---------------------------------------------------------------------------

    def _launch(self, node: ClusterNode) -> None:
        log_dir = os.path.join(node.dir, "logs")
        env = self._env(log_dir, self.heap_opts)
        env["KAFKA_JMX_OPTS"] = jmx_options(node.jmx_port)
        log_options = (self.secure.log_options(self.kafka_home, log_dir)
                       if self.secure is not None else None)
        if log_options:
            env["KAFKA_LOG4J_OPTS"] = log_options
        with open(os.path.join(node.dir, "stdout.log"), "ab") as out:
            node.process = subprocess.Popen(
                [self._bin("kafka-server-start.sh"), node.config_path],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, close_fds=True, start_new_session=True)
        node.starts += 1

    def _start_zookeeper(self) -> None:
        zk_dir = os.path.join(self.dir, "zookeeper")
        with open(os.path.join(zk_dir, "stdout.log"), "ab") as out:
            self.zookeeper_process = subprocess.Popen(
                [self._bin("zookeeper-server-start.sh"),
                 os.path.join(zk_dir, "zookeeper.properties")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self._env(os.path.join(zk_dir, "logs"), ZOOKEEPER_HEAP_OPTS),
                close_fds=True, start_new_session=True)
        self._wait(lambda: _tcp_open("127.0.0.1", self.zookeeper_port),
                   60, f"ZooKeeper to listen on 127.0.0.1:{self.zookeeper_port}",
                   alive=lambda: self.zookeeper_process.poll() is None,
                   tails=lambda: {"zookeeper": _tail(os.path.join(zk_dir, "stdout.log"), 30)})

    @staticmethod
    def _signal(proc: subprocess.Popen | None, sig: int, timeout_s: float) -> bool:
        """Send ``sig`` to the process (group); True if it exited within ``timeout_s``."""
        if proc is None or proc.poll() is not None:
            return True
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, node: int | None = None) -> "KafkaCluster":
        """Start the whole cluster (``node`` None), or one stopped node on its old ports and
        data. Returns once every started node answers and knows the whole running cluster: all
        running nodes as brokers and (ZooKeeper mode) every topic the other nodes know."""
        if node is not None:
            n = self._node(node)
            if not n.running:
                if n.killed and self.mode == ZOOKEEPER:
                    self._wait_session_gone(n.node_id)
                self._launch(n)
                n.killed = False
                self._wait_node_ready(n)
            return self
        if self.dir is None:
            self._layout()
            if self.mode == KRAFT:
                self._format_storage()
        _track(self)
        try:
            if self.mode == ZOOKEEPER and (self.zookeeper_process is None
                                           or self.zookeeper_process.poll() is not None):
                self._start_zookeeper()
            if self.mode == ZOOKEEPER and self.secure is not None and not self._secure_user_added:
                try:
                    self.secure.add_user_in_zookeeper(
                        self.kafka_home, f"127.0.0.1:{self.zookeeper_port}",
                        self._tool_env())
                except RuntimeError as exc:
                    raise ClusterError(str(exc)) from None
                self._secure_user_added = True
            # All at once: a KRaft quorum needs a majority of its voters before any node serves.
            for n in self.nodes.values():
                if not n.running:
                    self._launch(n)
            for n in self.nodes.values():
                self._wait_node_ready(n)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, node: int | None = None, *, timeout_s: float = NODE_STOP_TIMEOUT_S) -> None:
        """A controlled shutdown of ``node`` (SIGTERM: Kafka moves its leaderships to other
        replicas first, then exits), or, without ``node``, the end of the whole cluster.

        The whole cluster is SIGKILLed, not shut down in order, because its data is thrown away:
        a KRaft node waits for the controller quorum during its controlled shutdown, and once
        a majority of the nodes is gone there is none.

        Raises :class:`ClusterError` (after killing it) if the node has not exited within
        ``timeout_s``. With two of three KRaft nodes down the last one cannot be moved away
        from (no quorum): stop the second node *gracefully* while the quorum still exists.
        """
        if node is not None:
            n = self._node(node)
            if not self._signal(n.process, signal.SIGTERM, timeout_s):
                self._signal(n.process, signal.SIGKILL, 10)
                raise ClusterError(f"node {node} did not finish its controlled shutdown within "
                                   f"{timeout_s:.0f} s (killed)\n{self._tails([n])}")
            return
        for n in self.nodes.values():
            self._signal(n.process, signal.SIGKILL, 10)
        self._signal(self.zookeeper_process, signal.SIGKILL, 10)
        with _live_lock:
            _live_brokers.discard(self)
        if self.dir is not None and not os.environ.get("PYKAFKA_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
        self.nodes = {}

    def kill(self, node: int) -> None:
        """SIGKILL ``node``: a crash. Its partitions stay led by it, as far as the cluster knows,
        until the controller notices (see :meth:`wait_noticed_down`)."""
        n = self._node(node)
        if not self._signal(n.process, signal.SIGKILL, 30):
            raise ClusterError(f"node {node} (pid {n.process.pid}) survived SIGKILL for 30 s")
        n.killed = True

    def _wait_session_gone(self, node: int) -> None:
        """Before a SIGKILLed ZooKeeper-mode node starts again: wait until its old ZooKeeper
        session has expired, i.e. no running node lists it. Until then its registration
        (/brokers/ids/N) is still there, and Kafka 2.2 exits at start ("node already exists and
        owner ... does not match current session"): a supervisor would restart it until it
        stayed up; the harness waits instead (``zookeeper.session.timeout.ms``, 6 s here)."""
        self._wait(self._all_views(lambda view: f"lists broker {node}"
                                   if node in view.brokers else None),
                   self.state_timeout_s, f"node {node}'s ZooKeeper session to expire",
                   last=lambda: self._last_problem)

    def restart(self, node: int, *, hard: bool = False, down_s: float = 0.0,
                wait_in_sync: bool = True) -> None:
        """Stop ``node`` (controlled, or killed with ``hard``), keep it down ``down_s``, start
        it again and (``wait_in_sync``) wait until it is back in the ISR of all its partitions."""
        if hard:
            self.kill(node)
        else:
            self.stop(node)
        if down_s > 0:
            time.sleep(down_s)
        self.start(node)
        if wait_in_sync:
            self.wait_in_sync(node)

    def rolling_restart(self, *, hard: bool = False, down_s: float = 0.0,
                        order: Iterable[int] | None = None,
                        between: Callable[[int], None] | None = None) -> list[int]:
        """Restart every node in turn, as an upgrade does: the next one only goes down when the
        last one is back in the ISR of every partition it holds, so that ``min.insync.replicas``
        holds throughout. ``between(node)`` is called after each node is back. Returns the order."""
        done = []
        for node in list(order or self.nodes):
            self.restart(node, hard=hard, down_s=down_s, wait_in_sync=True)
            done.append(node)
            if between is not None:
                between(node)
        return done

    @property
    def running(self) -> bool:
        return bool(self.nodes) and all(n.running for n in self.nodes.values())

    def running_nodes(self) -> list[int]:
        return [n.node_id for n in self.nodes.values() if n.running]

    def address(self, node: int) -> str:
        return self._node(node).address

    def client_options(self) -> dict[str, str]:
        """The connector's ``kafka.*`` options to reach the cluster through its SASL_SSL
        listener (a cluster started with ``secure``)."""
        if self.secure is None:
            raise ClusterError(f"{self.mode} cluster: started without a secure listener")
        return self.secure.client_options(self.secure_bootstrap_servers)

    def expired_sessions(self, node: int) -> list[str]:
        """The requests node ``node`` read on an ended SASL session and closed the connection
        for, as its log names them (header: API, client id; a cluster started with ``secure``
        and ``reauth_ms``: :mod:`.cluster_security`), since the cluster was created."""
        return expired_sessions(os.path.join(self._node(node).dir, "logs"))

    def socket_server_metrics(self, node: int, listener: str = "PLAINTEXT",
                              attributes: Iterable[str] = REAUTHENTICATION_METRICS
                              ) -> dict[str, float]:
        """Node ``node``'s counters of ``listener`` (summed over its network threads), read
        over JMX (:mod:`.jmx`); they start from 0 at each start of the node."""
        n = self._node(node)
        processors = None
        if self.mode == ZOOKEEPER:
            # Kafka 2.x's JmxTool fails on patterns: the ids, numbered listener after listener
            # in the order of `listeners`, num.network.threads each
            props = self.node_properties(node)
            names = [entry.split("://")[0] for entry in props["listeners"].split(",")]
            if listener not in names:
                raise ClusterError(f"{self.mode} cluster: no listener {listener} ({names})")
            threads = int(props.get("num.network.threads", "3"))
            first = names.index(listener) * threads
            processors = range(first, first + threads)
        env = self._tool_env()
        try:
            return socket_server_metrics(self.kafka_home, n.jmx_port, listener, attributes,
                                         processors=processors, env=env)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(f"{self.mode} cluster, node {node}: {exc}") from None

    def live_bootstrap_servers(self) -> str:
        """The addresses of the running nodes only (for tools that stall on a dead address)."""
        return ",".join(n.address for n in self.nodes.values() if n.running)

    def _node(self, node: int) -> ClusterNode:
        try:
            return self.nodes[int(node)]
        except (KeyError, ValueError):
            raise ValueError(f"no node {node!r} in this cluster (nodes: {sorted(self.nodes)})") \
                from None

    # -- waits -------------------------------------------------------------------------------

    def _tails(self, nodes: Iterable[ClusterNode] | None = None, lines: int = 25) -> str:
        nodes = list(self.nodes.values()) if nodes is None else list(nodes)
        return "\n".join(f"--- node {n.node_id} ({'up' if n.running else 'down'}), last lines "
                         f"of {os.path.join(n.dir, 'logs', 'server.log')} ---\n{n.log_tail(lines)}"
                         for n in nodes)

    def _wait(self, predicate: Callable[[], T], timeout_s: float, what: str, *,
              alive: Callable[[], bool] | None = None,
              tails: Callable[[], object] | None = None,
              last: Callable[[], object] | None = None, interval_s: float = 0.25) -> T:
        """Poll ``predicate`` until it returns something true, for at most ``timeout_s``.

        Exceptions from the predicate count as "not yet" (a node may refuse connections while
        it starts). On timeout, or when ``alive()`` turns False, raises :class:`ClusterError`
        naming ``what``, the last state or exception seen (``last()``) and the log tails."""
        deadline = time.monotonic() + timeout_s
        error: BaseException | None = None
        while True:
            if alive is not None and not alive():
                reason = "the process exited"
                break
            try:
                value = predicate()
                if value:
                    return value
                error = None
            except Exception as exc:  # noqa: BLE001 - anything means "not yet"
                error = exc
            if time.monotonic() >= deadline:
                reason = f"timed out after {timeout_s:.0f} s"
                break
            time.sleep(interval_s)
        seen = last() if last is not None else None
        detail = f"; last saw: {seen}" if seen is not None else ""
        if error is not None:
            detail += f"; last error: {error!r}"
        if tails is None:
            tail_text = self._tails()
        else:
            got = tails()
            tail_text = got if isinstance(got, str) else "\n".join(
                f"--- {name} ---\n{text}" for name, text in dict(got).items())
        raise ClusterError(f"{self.mode} cluster: waiting for {what}: {reason}{detail}\n"
                           f"{tail_text}")

    def _wait_node_ready(self, n: ClusterNode, timeout_s: float | None = None) -> None:
        """The node answers Metadata itself, lists every running node, and knows every topic
        that the other running nodes know (a just-started ZooKeeper-mode broker does not)."""
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        try:
            wait_for_broker(n.address, timeout_s=timeout_s, is_alive=lambda: n.running)
        except BrokerStartError as exc:
            raise ClusterError(f"{self.mode} cluster: node {n.node_id} did not start: {exc}\n"
                               f"{self._tails([n], 40)}") from None
        seen: list = [None]

        def knows_cluster():
            own = fetch_metadata(n.address, n.node_id)
            running = {m.node_id for m in self.nodes.values() if m.running}
            others = set()
            for m in self.nodes.values():
                if m is not n and m.running:
                    try:
                        others |= set(fetch_metadata(m.address, m.node_id).topics)
                    except OSError:
                        pass   # starting too, or going down: its topics are checked on its own
            seen[0] = (f"node {n.node_id} lists brokers {sorted(own.brokers)} (running "
                       f"{sorted(running)}), misses topics {sorted(others - set(own.topics))}")
            return running <= own.brokers and others <= set(own.topics)

        self._wait(knows_cluster, max(1.0, deadline - time.monotonic()),
                   f"node {n.node_id} to know the cluster", alive=lambda: n.running,
                   tails=lambda: self._tails([n], 40), last=lambda: seen[0])

    def views(self) -> list[ClusterMetadata]:
        """Metadata from every running node that answers."""
        out = []
        for n in self.nodes.values():
            if n.running:
                try:
                    out.append(fetch_metadata(n.address, n.node_id))
                except OSError:
                    pass
        return out

    def metadata(self) -> ClusterMetadata:
        """Metadata from the first running node that answers."""
        for n in self.nodes.values():
            if n.running:
                try:
                    return fetch_metadata(n.address, n.node_id)
                except OSError:
                    continue
        raise ClusterError(f"{self.mode} cluster: no running node answers Metadata\n"
                           f"{self._tails()}")

    def _all_views(self, check: Callable[[ClusterMetadata], str | None]) -> Callable[[], bool]:
        """A predicate: every running node answers and ``check`` finds nothing wrong in each
        view (``check`` returns a description of what is wrong, or None)."""
        self._last_problem = None

        def predicate():
            running = self.running_nodes()
            views = self.views()
            if {v.node_id for v in views} != set(running):
                self._last_problem = (f"answers from nodes {sorted(v.node_id for v in views)} "
                                      f"of running {running}")
                return False
            for view in views:
                problem = check(view)
                if problem:
                    self._last_problem = f"node {view.node_id}: {problem}"
                    return False
            return True

        return predicate

    def wait_in_sync(self, node: int | None = None, timeout_s: float | None = None) -> None:
        """Wait until ``node`` (every running node, if None) is in the ISR of every partition of
        every topic it is a replica of, and every partition has a running leader, as all running
        nodes see it."""
        wanted = [node] if node is not None else self.running_nodes()
        running = set(self.running_nodes())

        def check(view: ClusterMetadata) -> str | None:
            for topic, parts in view.topics.items():
                for p, st in parts.items():
                    if st.leader not in running:
                        return f"{topic}-{p} has leader {st.leader}"
                    for w in wanted:
                        if w in st.replicas and w not in st.isr:
                            return f"{topic}-{p} replicas {list(st.replicas)} isr {list(st.isr)}"
            return None

        self._wait(self._all_views(check), timeout_s or self.state_timeout_s,
                   f"node(s) {wanted} in the ISR of all their partitions",
                   tails=lambda: self._tails([self._node(w) for w in wanted]),
                   last=lambda: self._last_problem)

    def wait_noticed_down(self, node: int, timeout_s: float | None = None) -> None:
        """Wait until the cluster has noticed that ``node`` is gone (a SIGKILLed node: after the
        session timeout): no running node lists it as a broker, every partition has a running
        leader and, in KRaft mode, ``node`` is in no ISR (KRaft's controller removes a fenced
        broker from every ISR; in ZooKeeper mode the ISRs lag, see the module docstring)."""
        strict_isr = self.mode == KRAFT

        def check(view: ClusterMetadata) -> str | None:
            if node in view.brokers:
                return f"lists broker {node}"
            running = set(self.running_nodes())
            for topic, parts in view.topics.items():
                for p, st in parts.items():
                    if st.leader not in running or (strict_isr and node in st.isr):
                        return f"{topic}-{p} leader {st.leader} isr {list(st.isr)}"
            return None

        self._wait(self._all_views(check), timeout_s or self.state_timeout_s,
                   f"the cluster to notice that node {node} is gone",
                   last=lambda: self._last_problem)

    def wait_for_leaders(self, topics: Iterable[str] | None = None,
                         timeout_s: float | None = None) -> None:
        """Every partition (of ``topics``, or all) has a running leader on every node's view."""
        names = None if topics is None else set(topics)

        def check(view: ClusterMetadata) -> str | None:
            running = set(self.running_nodes())
            for name in names or view.topics:
                parts = view.topics.get(name)
                if not parts:
                    return f"topic {name} unknown"
                for p, st in parts.items():
                    if st.leader not in running:
                        return f"{name}-{p} has leader {st.leader}"
            return None

        self._wait(self._all_views(check), timeout_s or self.state_timeout_s,
                   f"leaders for {sorted(names) if names else 'all partitions'}",
                   last=lambda: self._last_problem)

    # -- state -------------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> PartitionState:
        st = self.metadata().partition(topic, partition)
        if st is None:
            raise ClusterError(f"{self.mode} cluster: no partition {topic}-{partition} in the "
                               "metadata")
        return st

    def leader(self, topic: str, partition: int) -> int:
        """The leader of ``topic``-``partition`` (-1: none), as a running node sees it."""
        return self.partition(topic, partition).leader

    def partitions_led_by(self, node: int) -> list[tuple[str, int]]:
        view = self.metadata()
        return sorted((t, p) for t, parts in view.topics.items() for p, st in parts.items()
                      if st.leader == node)

    def coordinator(self, group_id: str, timeout_s: float = 30.0) -> int:
        """The node that coordinates ``group_id`` (the leader of its ``__consumer_offsets``
        partition); retried while the coordinator is loading or moving."""
        seen: list = [None]

        def ask():
            for n in self.nodes.values():
                if not n.running:
                    continue
                try:
                    error, node_id = find_coordinator(n.address, group_id)
                except OSError as exc:
                    seen[0] = exc
                    continue
                seen[0] = f"error code {error} from node {n.node_id}"
                if error == _NONE:
                    return node_id
                if error not in (_COORDINATOR_NOT_AVAILABLE, _COORDINATOR_LOAD_IN_PROGRESS,
                                 _NOT_COORDINATOR):
                    raise ClusterError(f"FindCoordinator for {group_id!r}: error code {error}")
            return None

        return self._wait(ask, timeout_s, f"the coordinator of group {group_id!r}",
                          last=lambda: seen[0])

    def describe(self) -> str:
        """A one-look summary for failure messages: nodes up/down, and each partition's leader,
        replicas and ISR as one running node sees them."""
        up = self.running_nodes()
        lines = [f"{self.mode} cluster, nodes up {up}, down "
                 f"{[n for n in self.nodes if n not in up]}"]
        try:
            view = self.metadata()
        except ClusterError:
            return lines[0] + " (no metadata)"
        for topic in sorted(view.topics):
            for p, st in sorted(view.topics[topic].items()):
                lines.append(f"  {topic}-{p}: leader {st.leader} replicas {list(st.replicas)} "
                             f"isr {list(st.isr)}")
        return "\n".join(lines)
