"""Connections and requests (:mod:`kafka_source.wire.net.transport`) against brokers that
refuse connections or left the cluster, without a broker: what the error says, and that it is
retriable."""

from __future__ import annotations

import pytest
from kafka.protocol.metadata import MetadataResponse

from kafka_source.errors import RetriableBrokerError
from kafka_source.wire.net.transport import BrokerTransport

pytestmark = pytest.mark.pyspark_free


def brokers_only_answer(*brokers):
    """A Metadata answer (v9, as decoded off the wire) naming ``brokers`` (id, host, port) and
    no topics: what kafka-python's cluster routes requests by."""
    R = MetadataResponse
    response = R(version=9, throttle_time_ms=0, cluster_id="c", controller_id=brokers[0][0],
                 brokers=[R.MetadataResponseBroker(node_id=n, host=h, port=p, rack=None)
                          for n, h, p in brokers], topics=[])
    return R.decode(response.encode(), version=9)


def test_a_request_to_a_broker_that_refuses_connections_says_what_failed_and_when():
    """kafka-python reports any node it cannot use as "not ready after <timeout> ms", also when
    the connection was refused at once or not tried (reconnect backoff): a dead broker's log
    then reads as if each request had waited the whole timeout. The error says what happened."""
    import socket
    import time

    from kafka.protocol.metadata import MetadataRequest

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()                                  # nothing listens there now
    client = BrokerTransport({"bootstrap_servers": f"127.0.0.1:{port}",
                           "request_timeout_ms": 20_000})
    client._bootstrapped = True                     # as if the cluster had answered before
    client._connections.cluster.update_metadata(brokers_only_answer((1, "127.0.0.1", port)))
    try:
        messages = []
        for _ in range(2):                          # refused, then in reconnect backoff
            started = time.monotonic()
            with pytest.raises(RetriableBrokerError) as failed:
                client.send(1, MetadataRequest(topics=[]))
            assert time.monotonic() - started < 5
            messages.append(str(failed.value))
    finally:
        client.close()
    for message in messages:
        assert "20000 ms" not in message and "not ready after" not in message, message
        assert message.startswith("broker 1: ") and f"127.0.0.1:{port}" in message, message
        assert "ECONNREFUSED" in message or "refused" in message.lower(), message
    assert any("reconnect backoff" in m for m in messages), messages


def test_a_request_to_a_broker_that_left_the_metadata_is_retriable():
    """A request routed by an older answer (leader 3) after a newer one stopped listing broker 3
    (in ZooKeeper mode, once a killed broker's session expired): kafka-python raises
    UnknownBrokerIdError, which is no reason to fail a query -- the retry looks the leaders up
    again. (It failed a stream in the SIGKILLed-leader cluster scenario on Kafka 2.2.)"""
    from kafka.protocol.metadata import MetadataRequest

    from kafka_source.errors import BrokerUnreachableError

    client = BrokerTransport({"bootstrap_servers": "127.0.0.1:9", "request_timeout_ms": 1_000})
    client._bootstrapped = True
    client._connections.cluster.update_metadata(brokers_only_answer((1, "127.0.0.1", 9)))
    try:
        with pytest.raises(BrokerUnreachableError) as failed:
            client.send(3, MetadataRequest(topics=[]))
    finally:
        client.close()
    assert str(failed.value).startswith("broker 3: no longer in the cluster's metadata")
