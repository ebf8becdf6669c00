"""kafka_source.worker_socket: TCP_QUICKACK on the worker's loopback TCP sockets, nothing else."""

from __future__ import annotations

import pickle
import socket

import pytest

from kafka_source import worker_socket
from kafka_source.read.batch import KafkaBatchReader
from kafka_source.worker_socket import AcksJvmOnUnpickle, ack_jvm_now

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="Linux only")


@pytest.fixture
def recorded(monkeypatch):
    """The (family, peer, option) of every setsockopt ack_jvm_now makes."""
    calls = []

    class Recording(socket.socket):
        def setsockopt(self, level, option, value):
            calls.append((self.family, self.getpeername()[0], level, option, value,
                          self.getsockname()[:2]))
            return super().setsockopt(level, option, value)

    monkeypatch.setattr(worker_socket.socket, "socket", Recording)
    return calls


def _tcp_pair(host: str = "127.0.0.1"):
    server = socket.create_server((host, 0))
    client = socket.create_connection(server.getsockname()[:2])
    accepted, _ = server.accept()
    return server, client, accepted


def test_quickack_is_set_on_connected_loopback_tcp_sockets_only(recorded):
    server, client, accepted = _tcp_pair()
    a, b = socket.socketpair()  # Unix domain: left alone
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ack_jvm_now()
        # Other loopback connections of this process (a broker, Spark's gateway) may be among
        # them too; every call is TCP_QUICKACK on a loopback TCP socket.
        assert all(c[0] in (socket.AF_INET, socket.AF_INET6) and worker_socket._loopback(c[1])
                   for c in recorded)
        assert {c[2:5] for c in recorded} == {(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)}
        ends = [c[5] for c in recorded]
        # both ends of the connection, once each; not the listener (same address as the
        # accepted end, so counted by address), not the UDP socket
        assert ends.count(client.getsockname()[:2]) == 1
        assert ends.count(accepted.getsockname()[:2]) == 1
        assert udp.getsockname()[:2] not in ends
        # the sockets still work, and no descriptor was left open or closed
        client.sendall(b"x")
        assert accepted.recv(1) == b"x"
    finally:
        for s in (server, client, accepted, a, b, udp):
            s.close()


def test_descriptors_are_neither_leaked_nor_closed():
    import os

    server, client, accepted = _tcp_pair()
    try:
        before = sorted(os.listdir("/proc/self/fd"))
        ack_jvm_now()
        assert sorted(os.listdir("/proc/self/fd")) == before
        assert client.fileno() >= 0 and accepted.fileno() >= 0
    finally:
        for s in (server, client, accepted):
            s.close()


def test_loopback_addresses():
    assert worker_socket._loopback("127.0.0.1") and worker_socket._loopback("::1")
    assert worker_socket._loopback("::ffff:127.0.0.1")
    assert not worker_socket._loopback("10.1.2.3") and not worker_socket._loopback("fe80::1%eth0")


def test_unpickling_a_reader_acks_and_restores_its_state(monkeypatch):
    calls = []
    monkeypatch.setattr(worker_socket, "ack_jvm_now", lambda: calls.append(1))
    reader = KafkaBatchReader(options="opts", parallelism=3)
    assert isinstance(reader, AcksJvmOnUnpickle) and calls == []
    copy = pickle.loads(pickle.dumps(reader))
    assert calls == [1]
    assert (copy.options, copy.parallelism) == ("opts", 3)
