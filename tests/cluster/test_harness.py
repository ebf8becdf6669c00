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


def test_a_request_on_an_ended_sasl_session_is_counted_and_named(whole_cluster):
    """The evidence the rolling-restart scenario relies on: a connection whose SASL session
    ended (``REAUTH_MS``) and that sends a request without re-authenticating first is closed by
    the broker, counted in its ``expired-connections-killed-count``, and named, with the
    request's API and client id, in the node's expired-session log. The client here skips the
    re-authentication on purpose: its timer is cancelled and the request goes under the check
    every connection of the connector has (``kafka_source.wire.net.reauth``)."""
    from kafka.protocol.metadata import MetadataRequest

    from kafka_source.config.client_config import client_config_from_options
    from kafka_source.wire.net.client import BrokerClient

    from .conftest import REAUTH_MS

    c = whole_cluster
    client_id = f"expired-{unique_topic_name('probe')}"
    config = client_config_from_options({**c.client_options(), "kafka.client.id": client_id})
    node = c.running_nodes()[0]
    before = c.socket_server_metrics(node, "SECURE")["expired-connections-killed-count"]
    with BrokerClient(config) as client:
        client.send(node, MetadataRequest(topics=[], min_version=4))
        conn = client._net._manager._conns[node]
        reauth = conn._reauth
        assert reauth.session_lifetime_ms == REAUTH_MS
        conn.net.cancel(reauth.task)
        reauth._task = None
        time.sleep(REAUTH_MS / 1000 + 1)
        conn._send_request(MetadataRequest(topics=[], min_version=4))
        # The broker closes the connection; kafka-python 3 does not always notice at once
        # (Kafka 2.2 over TLS), so the broker's own counter is what is waited for.
        deadline = time.monotonic() + 15
        while True:
            client._net._net.poll(timeout_ms=500)
            after = c.socket_server_metrics(node, "SECURE")["expired-connections-killed-count"]
            if after > before or time.monotonic() > deadline:
                break
    assert after == before + 1
    named = [line for line in c.expired_sessions(node) if f"clientId={client_id}" in line]
    assert len(named) == 1 and "apiKey=METADATA" in named[0], c.expired_sessions(node)
