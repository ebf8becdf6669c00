"""The cluster harness on real clusters: nodes really die, come back on their ports with their
data, and the cluster state the harness reports follows (both generations)."""

from __future__ import annotations

import os
import time

import pytest

from kafka_source.testing import unique_topic_name
from kafka_source.testing.brokers import _tcp_open

pytestmark = pytest.mark.cluster


def test_nodes_are_killed_stopped_and_started_for_real(whole_cluster, figures):
    c = whole_cluster
    topic = unique_topic_name("harness")
    c.create_topic(topic, partitions=3)
    assert c.running_nodes() == [1, 2, 3]
    views = c.views()
    assert len(views) == 3 and all(v.brokers == {1, 2, 3} for v in views)

    victim = c.leader(topic, 0)
    node = c.nodes[victim]
    pid, port = node.process.pid, node.port
    c.kill(victim)
    figures.fault("SIGKILL")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not node.running and not _tcp_open("127.0.0.1", port)
    assert c.running_nodes() == [n for n in (1, 2, 3) if n != victim]
    killed = time.monotonic()
    c.wait_noticed_down(victim)
    noticed = time.monotonic() - killed
    assert c.leader(topic, 0) in c.running_nodes()
    assert all(victim not in v.brokers for v in c.views())

    c.start(victim)
    assert node.running and node.process.pid != pid and node.port == port and node.starts == 2
    c.wait_in_sync(victim)
    assert all(victim in c.partition(topic, p).isr for p in range(3))

    # A controlled shutdown hands leadership over before the node is gone: no session timeout.
    leader = c.leader(topic, 1)
    c.stop(leader)
    figures.fault("controlled shutdown")
    assert not c.nodes[leader].running
    moved = time.monotonic()
    c.wait_for_leaders([topic], timeout_s=noticed + 5)
    handed_over = time.monotonic() - moved
    assert c.leader(topic, 1) != leader
    assert handed_over < noticed, (handed_over, noticed)
    c.start(leader)     # back in the ISR: the next test's whole_cluster waits for it
    assert c.coordinator(unique_topic_name("g-harness")) in c.running_nodes()
