"""Connections and requests (:mod:`kafka_source.wire.net.transport`) against brokers that
refuse connections or left the cluster, without a broker: what the error says, and that it is
retriable."""

from __future__ import annotations

import kafka.errors as Errors
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


class _AnsweringTogether:
    """kafka-python's network client, as BrokerTransport uses it, for brokers that answer only
    once every request of the exchange has been handed over: a transport that waited for one
    answer before sending the next request would wait in vain."""

    def __init__(self, expected: int, fail: dict | None = None):
        self.expected = expected
        self.fail = fail or {}                      # node -> the error its request fails with
        self.handed: list[tuple[int, object]] = []
        self.futures: list = []
        self.polls_before_all_handed = 0
        self._manager = self
        self._net = self

    def await_ready(self, node_id, timeout_ms):
        return True

    def send(self, request, node_id, request_timeout_ms):
        from kafka.future import Future

        self.handed.append((node_id, request))
        future = Future()
        self.futures.append((node_id, future))
        return future

    def poll(self, timeout_ms, future=None):
        if len(self.handed) < self.expected:
            self.polls_before_all_handed += 1
            return                                  # nothing comes back yet: the timeout
        for node_id, f in self.futures:
            if not f.is_done:
                if node_id in self.fail:
                    f.failure(self.fail[node_id])
                else:
                    f.success(f"answer of broker {node_id}")


def _transport_over(net) -> BrokerTransport:
    client = BrokerTransport({"bootstrap_servers": "127.0.0.1:9", "request_timeout_ms": 1_000})
    client._bootstrapped = True
    client._net = net
    return client


def test_requests_to_several_brokers_are_all_in_flight_before_any_answer_is_awaited():
    """ListOffsets and OffsetsForLeaderEpoch go to each partition's leader: with one request
    after the other, a trigger waited one round trip per leader (three on a three-broker
    cluster); send_all puts them all on the wire first."""
    from kafka.protocol.metadata import MetadataRequest

    net = _AnsweringTogether(expected=3)
    client = _transport_over(net)
    requests = [(node, MetadataRequest(topics=[str(node)])) for node in (2, 1, 3)]
    assert client.send_all(requests) == ["answer of broker 2", "answer of broker 1",
                                         "answer of broker 3"]
    assert [node for node, _ in net.handed] == [2, 1, 3]
    assert net.polls_before_all_handed == 0


def test_a_failed_request_among_several_names_its_broker_and_is_retriable():
    from kafka.protocol.metadata import MetadataRequest

    from kafka_source.errors import BrokerUnreachableError

    net = _AnsweringTogether(expected=2, fail={
        3: Errors.KafkaConnectionError("socket disconnected")})
    client = _transport_over(net)
    with pytest.raises(BrokerUnreachableError) as failed:
        client.send_all([(1, MetadataRequest(topics=[])), (3, MetadataRequest(topics=[]))])
    assert str(failed.value).startswith("broker 3: ") and "socket disconnected" in str(
        failed.value)
    assert client.last_node == 3


def test_with_partial_a_failed_broker_keeps_its_place_and_the_others_answers_are_kept():
    """What a retry of ListOffsets needs: the leaders that answered are not asked again."""
    from kafka.protocol.metadata import MetadataRequest

    from kafka_source.errors import BrokerSecurityError, BrokerUnreachableError

    net = _AnsweringTogether(expected=3, fail={
        3: Errors.KafkaConnectionError("socket disconnected")})
    client = _transport_over(net)
    requests = [(node, MetadataRequest(topics=[])) for node in (1, 3, 2)]
    first, failed, last = client.send_all(requests, partial=True)
    assert (first, last) == ("answer of broker 1", "answer of broker 2")
    assert isinstance(failed, BrokerUnreachableError) and str(failed).startswith("broker 3: ")
    # An error no retry can mend raises all the same.
    net = _AnsweringTogether(expected=2, fail={2: BrokerSecurityError("SASL failed")})
    with pytest.raises(BrokerSecurityError, match="SASL failed"):
        _transport_over(net).send_all(requests[::2], partial=True)
