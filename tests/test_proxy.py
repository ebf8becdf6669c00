"""The fault proxy (kafka_source/testing/proxy.py) against a tiny framed echo server: no broker.

The echo server answers every Kafka-framed request with a response frame carrying the request's
correlation id and its api key, so each fault can be seen from the client side exactly.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from kafka_source.testing.proxy import (ApiKey, Fault, FaultProxy, pid_of_client,
                                        restarting_broker_metadata)

pytestmark = pytest.mark.pyspark_free


class EchoBroker:
    """Answers each request frame with (correlation id, b"echo", api key, body size)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[int] = []       # correlation ids that reached the broker
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        conn.settimeout(5)
        try:
            while True:
                head = conn.recv(4, socket.MSG_WAITALL)
                if len(head) < 4:
                    return
                body = conn.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
                api, _version, cid = struct.unpack(">hhi", body[:8])
                self.received.append(cid)
                payload = struct.pack(">i", cid) + b"echo" + struct.pack(">hi", api, len(body))
                payload += b"x" * 1000
                conn.sendall(struct.pack(">i", len(payload)) + payload)
        except OSError:
            return
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()
        self.thread.join(5)


def request(api: int, cid: int, body: bytes = b"") -> bytes:
    frame = struct.pack(">hhi", api, 0, cid) + body
    return struct.pack(">i", len(frame)) + frame


def exchange(sock, api, cid, body=b"", timeout=3.0):
    """Send one request; the response's (correlation id, api), or the error that ended it."""
    sock.settimeout(timeout)
    try:
        sock.sendall(request(api, cid, body))
        head = sock.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return "closed"
        size = struct.unpack(">i", head)[0]
        data = sock.recv(size, socket.MSG_WAITALL)
        if len(data) < size:
            return "cut"
        got_cid, = struct.unpack(">i", data[:4])
        api_back, = struct.unpack(">h", data[8:10])
        return got_cid, api_back
    except ConnectionResetError:
        return "reset"
    except socket.timeout:
        return "timeout"


@pytest.fixture
def proxy():
    broker = EchoBroker()
    p = FaultProxy(("127.0.0.1", broker.port), max_fault_s=5).start()
    p.broker = broker
    yield p
    p.close()
    broker.close()


def connect(p):
    return socket.create_connection(("127.0.0.1", p.port), timeout=3)


def test_forwards_frames_and_counts_requests(proxy):
    with connect(proxy) as s:
        assert [exchange(s, ApiKey.Fetch, i) for i in range(3)] == [(i, 1) for i in range(3)]
        assert exchange(s, ApiKey.Metadata, 7, b"m" * 100_000) == (7, 3)   # large frames too
    assert proxy.requests == {"Fetch": 3, "Metadata": 1}
    assert proxy.injected() == {}


def test_reset_mid_response_after_the_broker_saw_the_request(proxy):
    fault = proxy.inject(ApiKey.OffsetCommit, "reset", skip=1)
    with connect(proxy) as s:
        assert exchange(s, ApiKey.OffsetCommit, 1) == (1, 8)        # skipped
        assert exchange(s, ApiKey.OffsetCommit, 2) in ("reset", "cut", "closed")
    assert proxy.broker.received == [1, 2]                          # the broker acted on it
    assert fault.fired.is_set() and fault.injected == 1 and len(fault.peers) == 1
    with connect(proxy) as s:                                       # one time only
        assert exchange(s, ApiKey.OffsetCommit, 3) == (3, 8)
    assert proxy.injected() == {"OffsetCommit:reset": 1}


def test_reset_request_never_reaches_the_broker(proxy):
    proxy.inject(ApiKey.JoinGroup, "reset_request")
    with connect(proxy) as s:
        assert exchange(s, ApiKey.JoinGroup, 1) in ("reset", "closed")
    assert proxy.broker.received == []


def test_stall_delivers_late_and_drop_never(proxy):
    proxy.inject(ApiKey.SyncGroup, "stall", seconds=1.0)
    proxy.inject(ApiKey.Heartbeat, "drop")
    with connect(proxy) as s:
        started = time.monotonic()
        assert exchange(s, ApiKey.SyncGroup, 1) == (1, 14)
        assert time.monotonic() - started >= 0.9
        assert exchange(s, ApiKey.Heartbeat, 2, timeout=0.5) == "timeout"
    assert proxy.injected() == {"SyncGroup:stall": 1, "Heartbeat:drop": 1}


def test_match_narrows_and_observers_count_besides(proxy):
    seen = proxy.add(Fault.observer(ApiKey.Fetch, match=lambda f: b"topic-a" in f))
    proxy.inject(ApiKey.Fetch, "reset", match=lambda f: b"topic-a" in f, skip=1)
    with connect(proxy) as s:
        assert exchange(s, ApiKey.Fetch, 1, b"topic-b") == (1, 1)
        assert exchange(s, ApiKey.Fetch, 2, b"topic-a") == (2, 1)
        assert exchange(s, ApiKey.Fetch, 3, b"topic-a") in ("reset", "cut", "closed")
    assert seen.injected == 2
    assert proxy.injected() == {"Fetch:reset": 1}


def test_outage_resets_open_and_new_connections_for_its_duration(proxy):
    s = connect(proxy)
    assert exchange(s, ApiKey.Fetch, 1) == (1, 1)
    proxy.outage(1.0)
    assert exchange(s, ApiKey.Fetch, 2) in ("reset", "closed")
    s.close()
    try:
        with connect(proxy) as s2:      # the reset may come before connect() even returns
            assert exchange(s2, ApiKey.Fetch, 3) in ("reset", "closed")
    except ConnectionResetError:
        pass
    time.sleep(1.1)
    with connect(proxy) as s3:
        assert exchange(s3, ApiKey.Fetch, 4) == (4, 1)
    assert proxy.injected()["outage"] == 1 and proxy.injected()["refused"] >= 1


def test_answer_replaces_the_broker(proxy):
    proxy.inject(ApiKey.ApiVersions, "answer",
                 answer=lambda frame: struct.pack(">ii", 4, struct.unpack(">i", frame[8:12])[0]))
    with connect(proxy) as s:
        s.sendall(request(ApiKey.ApiVersions, 9))
        assert s.recv(8, socket.MSG_WAITALL) == struct.pack(">ii", 4, 9)
    assert proxy.broker.received == []


def test_loopback_only_and_bounded():
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy(("10.0.0.1", 9092))
    with pytest.raises(ValueError, match="unknown fault action"):
        Fault(ApiKey.Fetch, "explode")
    p = FaultProxy(("127.0.0.1", 9), max_fault_s=0.5).start()
    p.outage(3600)                                   # capped by max_fault_s
    started = time.monotonic()
    p.close(timeout_s=5)
    assert time.monotonic() - started < 5
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", p.port), timeout=1).close()


@pytest.mark.parametrize("version", [1, 7, 9, 12])
def test_restarting_broker_metadata_is_a_valid_answer_for_the_request(version):
    R = MetadataRequest
    req = R(version=version, topics=[R.MetadataRequestTopic(name="clicks")],
            allow_auto_topic_creation=False)
    req.with_header(correlation_id=42, client_id="me")
    frame = bytes(req.encode(header=True, framed=True))
    answer = restarting_broker_metadata(frame)
    assert struct.unpack(">i", answer[:4])[0] == len(answer) - 4
    response = MetadataResponse.decode(answer[4:], version=version, header=True)
    assert response.header.correlation_id == 42
    assert response.brokers == [] and response.controller_id == -1
    assert [(t.name, t.error_code) for t in response.topics] == [("clicks", 3)]


def test_pid_of_client_finds_the_process_behind_a_connection(proxy):
    fault = proxy.add(Fault.observer(ApiKey.Fetch))
    with connect(proxy) as s:
        assert exchange(s, ApiKey.Fetch, 1) == (1, 1)
        assert pid_of_client(fault.peers[0], proxy.port) == os.getpid()
    assert pid_of_client(("127.0.0.1", 1), proxy.port) is None
