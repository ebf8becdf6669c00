"""The fetch connection's socket handling against a scripted broker on a socket pair.

Framing (responses larger than the buffer, arriving in dribs and drabs), the padding the decoder
relies on, bounded waits for stalled or vanished brokers, and wrong answers. Opening a connection
through kafka-python's setup (TLS, SASL) needs a broker: tests/integration/test_fetch_connection.py.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from kafka.protocol.consumer import FetchRequest

from kafka_source.wire.client import RetriableBrokerError
from kafka_source.wire.fast_decode import RECORDS_PADDING, PaddedBuffer
from kafka_source.wire.fetch_connection import FetchConnection, FetchConnections
from kafka_source.wire.fetch_protocol import FetchPartitionRequest as F

from .response_builder import encode_response

VERSION = 12
TP = ("t", 0)


class Broker:
    """The other end of a socket pair: reads request frames, answers with ``script`` steps, each
    a function (request, sock) -> None."""

    def __init__(self, sock):
        self.sock = sock
        self.requests = []
        self.script = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _recv_exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def _run(self):
        try:
            while True:
                size = struct.unpack(">i", self._recv_exact(4))[0]
                frame = self._recv_exact(size)
                request = FetchRequest.decode(memoryview(frame), version=VERSION, header=True)
                self.requests.append(request)
                step = self.script.pop(0)
                step(request, self.sock)
        except (EOFError, OSError, IndexError):
            pass


def answer(records=b"abc", *, error=0, session_id=0, pieces=1, delay=0.0, correlation=None):
    def step(request, sock):
        frame = encode_response(VERSION, topics={"t": {0: dict(
            error=error, hw=10, lso=10, start=0, aborted=None, records=records)}},
            session_id=session_id,
            correlation_id=request.header.correlation_id if correlation is None else correlation)
        size = -(-len(frame) // pieces)
        for i in range(0, len(frame), size):
            sock.sendall(frame[i:i + size])
            time.sleep(delay)
    return step


def send_raw(data):
    def step(request, sock):
        sock.sendall(data)
    return step


def stall(request, sock):
    sock.sendall(b"\x00\x00\x10\x00\x00")   # a 4 KiB frame announced, one byte of it sent


def hang_up(request, sock):
    sock.sendall(b"\x00\x00\x10\x00\x00\x00")
    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    broker = Broker(theirs)
    conn = FetchConnection(ours, node_id=1, version=VERSION, client_id="test",
                           max_frame_bytes=100 << 20, request_timeout_ms=2000)
    yield conn, broker
    conn.close()
    theirs.close()


def fetch(conn, offset=0, max_bytes=1 << 20):
    conn.send({TP: F(offset, max_bytes)}, max_wait_ms=0, min_bytes=1, max_bytes=50 << 20,
              read_committed=False)
    return conn.receive()


def test_a_large_response_in_small_pieces_lands_in_one_padded_buffer(pair):
    conn, broker = pair
    records = bytes(range(256)) * 12_000                   # 3 MB: larger than the buffer
    broker.script = [answer(records, pieces=300, delay=0.0002), answer(b"xyz")]
    result = fetch(conn)
    data = result.partitions[TP].records
    assert bytes(data) == records
    base = data.obj
    assert isinstance(base, PaddedBuffer)
    end = 4 + struct.unpack_from(">i", base, 0)[0]        # the frame, then the padding
    assert bytes(base).index(records) + len(records) <= end
    assert bytes(base[end:end + len(RECORDS_PADDING)]) == RECORDS_PADDING
    assert result.requested == {TP: F(0, 1 << 20)} and result.full
    assert bytes(fetch(conn, 3).partitions[TP].records) == b"xyz"
    assert [r.topics[0].partitions[0].fetch_offset for r in broker.requests] == [0, 3]


def test_fetch_sessions_ride_on_the_connection(pair):
    conn, broker = pair
    broker.script = [answer(session_id=55), answer(session_id=55)]
    fetch(conn, 0)
    fetch(conn, 3)
    first, second = broker.requests
    assert (first.session_id, first.session_epoch) == (0, 0)
    assert (second.session_id, second.session_epoch) == (55, 1)


def test_one_request_at_a_time(pair):
    conn, broker = pair
    broker.script = [answer()]
    conn.send({TP: F(0, 1)}, max_wait_ms=0, min_bytes=1, max_bytes=1, read_committed=False)
    with pytest.raises(RuntimeError, match="already in flight"):
        conn.send({TP: F(0, 1)}, max_wait_ms=0, min_bytes=1, max_bytes=1, read_committed=False)
    conn.receive()
    with pytest.raises(RuntimeError, match="no Fetch request in flight"):
        conn.receive()


@pytest.mark.parametrize("step,message", [
    (stall, "no complete Fetch response within 2000 ms"),
    (hang_up, "closed by the broker"),
    (answer(correlation=999), "response to request 999"),
    (send_raw(b"\xff\xff\xff\xff"), "invalid response frame size -1"),
    (send_raw(b"\x00\x00\x00\x06\x00\x00\x00\x01\x00\x00"), "malformed Fetch"),
])
def test_broken_answers_fail_within_the_request_timeout_and_close(pair, step, message):
    conn, broker = pair
    broker.script = [step]
    t0 = time.monotonic()
    with pytest.raises(Exception, match=message) as info:
        fetch(conn)
    assert time.monotonic() - t0 < 6.0       # the 2 s request timeout, on a busy machine
    assert isinstance(info.value, RetriableBrokerError) or "malformed" in message
    assert conn.closed and not conn.in_flight
    with pytest.raises(RetriableBrokerError, match="closed"):
        fetch(conn)


def test_pool_reuses_connections_and_replaces_expired_or_broken_ones():
    opened = []

    class Conn:
        def __init__(self, node):
            self.node, self.closed, self.in_flight, self.expired = node, False, False, False
            opened.append(self)

        def close(self):
            self.closed = True

    pool = FetchConnections(Conn)
    a = pool.get(1)
    assert pool.get(1) is a and pool.get(2) is not a
    a.expired = True                          # SASL session about to expire: reconnect
    b = pool.get(1)
    assert b is not a and a.closed
    b.in_flight = True                        # a response nobody will read
    pool.discard_in_flight()
    assert b.closed and pool.get(1) is not b
    pool.close()
    assert all(c.closed for c in opened)
