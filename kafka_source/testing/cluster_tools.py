"""What a test cluster's operators do with Kafka's own tools: create topics, elect preferred
leaders, force an unclean election, reassign partitions.

:class:`ClusterTools` is a part of :class:`~.cluster.KafkaCluster` (which runs the nodes and
waits for their state); it calls each generation's tool the way that generation needs (Kafka
2.2's talk to ZooKeeper, 4.0's to the brokers) and waits until every running node sees the
outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from itertools import count
from typing import Iterable, Mapping

from .brokers import create_topic
from .cluster_view import KRAFT, ClusterError, ClusterMetadata

__all__ = ["ClusterTools"]

_files = count(1)


class ClusterTools:
    """Topic creation, elections and reassignments of a :class:`~.cluster.KafkaCluster`, which
    provides the nodes (``mode``, ``dir``, ``zookeeper_port``, ``live_bootstrap_servers``), the
    waits (``_wait``, ``_all_views``, ``views``, ``metadata``) and the tools' environment
    (``_bin``, ``_tool_env``)."""

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3,
                     config: Mapping[str, str] | None = None,
                     timeout_s: float | None = None) -> None:
        """Create ``name`` and wait until every running node knows it with a leader and a full
        ISR for each partition (a client may bootstrap from any of them)."""
        timeout_s = timeout_s or self.state_timeout_s
        create_topic(self.live_bootstrap_servers(), name, partitions, timeout_s=timeout_s,
                     replication_factor=replication_factor, config=dict(config or {}))

        def check(view: ClusterMetadata) -> str | None:
            parts = view.topics.get(name)
            if parts is None or len(parts) < partitions:
                return f"knows {len(parts or ())} partition(s) of {name}"
            for p, st in parts.items():
                if st.leader < 0 or len(st.isr) < replication_factor:
                    return f"{name}-{p} leader {st.leader} isr {list(st.isr)}"
            return None

        self._wait(self._all_views(check), timeout_s, f"topic {name} on every node",
                   last=lambda: self._last_problem)

    def _tool(self, script: str, *args: str, timeout_s: float = 120.0) -> str:
        """Run one of the distribution's tools; its output, or :class:`ClusterError`."""
        cmd = [self._bin(script), *args]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                 env=self._tool_env(), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{' '.join(cmd)} did not finish within {timeout_s:.0f} s: "
                               f"{exc.stdout}{exc.stderr}") from None
        if out.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)} failed (exit code {out.returncode}):\n"
                               f"{out.stdout}{out.stderr}")
        return out.stdout + out.stderr

    def _json_file(self, name: str, content: object) -> str:
        path = os.path.join(self.dir, f"{name}-{next(_files)}.json")
        with open(path, "w") as f:
            json.dump(content, f)
        return path

    def election_command(self, json_path: str) -> list[str]:
        """The preferred-leader election command of this distribution."""
        if self.mode == KRAFT:
            return ["kafka-leader-election.sh", "--bootstrap-server",
                    self.live_bootstrap_servers(), "--election-type", "PREFERRED",
                    "--path-to-json-file", json_path]
        return ["kafka-preferred-replica-election.sh", "--zookeeper",
                f"127.0.0.1:{self.zookeeper_port}", "--path-to-json-file", json_path]

    def reassign_command(self, json_path: str) -> list[str]:
        """The reassignment command of this distribution (2.2 talks to ZooKeeper)."""
        where = (["--bootstrap-server", self.live_bootstrap_servers()] if self.mode == KRAFT
                 else ["--zookeeper", f"127.0.0.1:{self.zookeeper_port}"])
        return ["kafka-reassign-partitions.sh", *where, "--reassignment-json-file", json_path,
                "--execute"]

    def preferred_leader_election(self, topic: str, partitions: Iterable[int] | None = None, *,
                                  wait: bool = True, timeout_s: float | None = None) -> str:
        """Move leadership of ``topic``'s partitions (all, or ``partitions``) back to their
        preferred replica (the first of the replica list), with the distribution's tool; wait
        (``wait``) until every running node sees the preferred replicas lead. Returns the tool's
        output."""
        if partitions is None:
            partitions = sorted(self.metadata().topics.get(topic, {}))
        partitions = list(partitions)
        path = self._json_file("election", {"partitions": [
            {"topic": topic, "partition": p} for p in partitions]})
        cmd = self.election_command(path)
        try:
            output = self._tool(cmd[0], *cmd[1:])
        except ClusterError as exc:
            # Kafka 4.0's tool exits 1 when no partition needed an election.
            if "already elected" not in str(exc) and "ElectionNotNeeded" not in str(exc):
                raise
            output = str(exc)
        if wait:
            def check(view: ClusterMetadata) -> str | None:
                for p in partitions:
                    st = view.partition(topic, p)
                    if st is None or st.leader != st.replicas[0]:
                        return f"{topic}-{p}: {st}"
                return None

            self._wait(self._all_views(check), timeout_s or self.state_timeout_s,
                       f"preferred leaders of {topic} {partitions}",
                       last=lambda: self._last_problem)
        return output

    def wait_unclean_leader(self, topic: str, partition: int, node: int, *,
                            timeout_s: float | None = None) -> str:
        """Wait until ``node`` leads ``topic``-``partition`` after an *unclean* leader election:
        ``node`` is a replica that was out of the ISR (stopped while the leader went on alone)
        and was started again after the last in-sync replica died. The topic must allow it
        (``unclean.leader.election.enable=true``; the cluster's default is false).

        ZooKeeper mode (Kafka 2.2, which has no tool for unclean elections): the controller
        elects ``node`` by itself when it starts and the partition has no live in-sync replica.
        KRaft (Kafka 4.0): the controller may do the same when it unfences ``node``; if
        ``node`` does not lead within 10 s, ``kafka-leader-election.sh --election-type UNCLEAN``
        asks for it. Returns how the election came about."""
        timeout_s = timeout_s or self.state_timeout_s

        def leads() -> bool:
            views = self.views()
            return bool(views) and all(view.partition(topic, partition) is not None
                                       and view.partition(topic, partition).leader == node
                                       for view in views)

        how = "by the controller"
        deadline = time.monotonic() + (10 if self.mode == KRAFT else timeout_s)
        while time.monotonic() < deadline and not leads():
            time.sleep(0.5)
        if not leads() and self.mode == KRAFT:
            how = "with kafka-leader-election.sh --election-type UNCLEAN"
            try:
                self._tool("kafka-leader-election.sh", "--bootstrap-server",
                           self.live_bootstrap_servers(), "--election-type", "UNCLEAN",
                           "--topic", topic, "--partition", str(partition))
            except ClusterError as exc:
                if "ElectionNotNeeded" not in str(exc) and "already" not in str(exc):
                    raise
        self._wait(leads, timeout_s, f"node {node} to lead {topic}-{partition} after an unclean "
                   "election", tails=lambda: self._tails([self._node(node)]),
                   last=lambda: self.describe())
        return how

    def reassign(self, topic: str, partition: int, replicas: Iterable[int], *, wait: bool = True,
                 timeout_s: float | None = None) -> str:
        """Reassign ``topic``-``partition`` to ``replicas`` (in preference order) with
        kafka-reassign-partitions.sh; wait (``wait``) until every running node lists exactly
        those replicas, all in sync, with one of them leading. Returns the tool's output."""
        replicas = [int(r) for r in replicas]
        path = self._json_file("reassign", {"version": 1, "partitions": [
            {"topic": topic, "partition": partition, "replicas": replicas}]})
        cmd = self.reassign_command(path)
        output = self._tool(cmd[0], *cmd[1:])
        if wait:
            def check(view: ClusterMetadata) -> str | None:
                st = view.partition(topic, partition)
                if st is None or list(st.replicas) != replicas or set(st.isr) != set(replicas) \
                        or st.leader not in replicas:
                    return f"{topic}-{partition}: {st}"
                return None

            self._wait(self._all_views(check), timeout_s or self.state_timeout_s,
                       f"{topic}-{partition} reassigned to {replicas}",
                       last=lambda: self._last_problem)
        return output
