"""The fetch connection's socket handling against a scripted broker on a socket pair.

Framing (responses larger than the buffer, arriving in dribs and drabs), the padding the decoder
relies on, bounded waits for stalled or vanished brokers, and wrong answers; how large a response
may be (following its request) and the error for one that is larger; the receive buffer growing
and shrinking again. Opening a connection through kafka-python's setup (TLS, SASL) needs a
broker: tests/integration/test_fetch_connection.py; a record batch of 120 MB from a real Kafka:
tests/integration/test_large_batches.py.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time

import pytest
from kafka.protocol.consumer import FetchRequest

from kafka_source.wire.net.client import RetriableBrokerError
from kafka_source.wire.format.fast_decode import RECORDS_PADDING, PaddedBuffer, decode_to_arrow
from kafka_source.wire.net.fetch_connection import (FetchConnection, FetchConnections,
                                                FetchResponseTooLargeError)
from kafka_source.wire.net.fetch_protocol import FetchPartitionRequest as F

from .record_builder import R, v2_batch
from .response_builder import encode_response

pytestmark = pytest.mark.pyspark_free

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


def answer(records=b"abc", *, error=0, session_id=0, pieces=1, delay=0.0, correlation=None,
           partitions=None):
    """A Fetch response: ``records`` for t-0, or ``partitions`` {partition: records} of t."""
    def step(request, sock):
        parts = partitions if partitions is not None else {0: records}
        frame = encode_response(VERSION, topics={"t": {p: dict(
            error=error, hw=10, lso=10, start=0, aborted=None, records=r)
            for p, r in parts.items()}},
            session_id=session_id,
            correlation_id=request.header.correlation_id if correlation is None else correlation)
        size = -(-len(frame) // pieces)
        try:
            for i in range(0, len(frame), size):
                sock.sendall(frame[i:i + size])
                time.sleep(delay)
        except OSError:
            pass                              # the connection refused the rest of it
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


def tls_alert(request, sock):
    """What a TLS listener answers a plaintext client: an alert record, then it hangs up. Its
    first four bytes read as a frame size of 352,518,912."""
    sock.sendall(b"\x15\x03\x03\x00\x02\x02\x28")
    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def connect():
    """connect(max_frame_bytes) -> (FetchConnection, Broker) on a socket pair."""
    made = []

    def _connect(max_frame_bytes=100 << 20):
        ours, theirs = socket.socketpair()
        broker = Broker(theirs)
        conn = FetchConnection(ours, node_id=1, version=VERSION, client_id="test",
                               max_frame_bytes=max_frame_bytes, request_timeout_ms=2000)
        made.append((conn, theirs))
        return conn, broker

    yield _connect
    for conn, theirs in made:
        conn.close()
        theirs.close()


@pytest.fixture
def pair(connect):
    return connect()


def fetch(conn, offset=0, max_bytes=1 << 20, request_max_bytes=50 << 20, tps=(TP,)):
    conn.send({tp: F(offset, max_bytes) for tp in tps}, max_wait_ms=0, min_bytes=1,
              max_bytes=request_max_bytes, read_committed=False)
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
    (tls_alert, "invalid response frame size 352518912"),
    # A size beyond the request's limit that is no response to it (the correlation id is not
    # the request's): garbage too, not a record batch too large.
    (send_raw(struct.pack(">ii", 200 << 20, 0x4854) + bytes(70_000)),
     "invalid response frame size 209715200"),
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


MIB = 1 << 20


def test_the_frame_limit_follows_the_partition_limits_the_request_asked_for(connect):
    # A connection accepting 2 MiB by default (its receive limit) and a partition whose limit
    # the fetcher grew to 2 MiB because its record batch did not fit: a response of 3 MB (the
    # batch plus another partition's data) is what was asked for and is received.
    conn, broker = connect(max_frame_bytes=2 * MIB)
    big = bytes(range(256)) * (3_000_000 // 256)
    broker.script = [answer(big), answer(b"xyz")]
    result = fetch(conn, max_bytes=2 * MIB, request_max_bytes=2 * MIB)
    assert bytes(result.partitions[TP].records) == big
    # ... and the next, small request on the same connection is unaffected.
    assert bytes(fetch(conn, 3, max_bytes=64 << 10, request_max_bytes=64 << 10)
                 .partitions[TP].records) == b"xyz"


def test_a_response_larger_than_the_request_allows_fails_at_once_naming_partition_and_options(
        connect):
    conn, broker = connect(max_frame_bytes=2 * MIB)
    big = bytes(range(256)) * (3_000_000 // 256)
    # t-0 has nothing new; t-1's first record batch is larger than every limit (KIP-74).
    broker.script = [answer(partitions={0: b"", 1: big})]
    t0 = time.monotonic()
    with pytest.raises(FetchResponseTooLargeError) as info:
        fetch(conn, offset=5, max_bytes=256 << 10, request_max_bytes=256 << 10,
              tps=[("t", 0), ("t", 1)])
    assert time.monotonic() - t0 < 1.0        # not after a timeout, and it is not retriable
    assert not isinstance(info.value, RetriableBrokerError)
    message = str(info.value)
    size = len(encode_response(VERSION, topics={"t": {p: dict(
        error=0, hw=10, lso=10, start=0, aborted=None, records=r)
        for p, r in {0: b"", 1: big}.items()}})) - 4
    assert f"is {size:,} bytes, more than the {2 * MIB:,} accepted" in message
    assert f"t-1 at offset 5: {len(big):,} bytes of records" in message
    assert "t-0" not in message               # the partition at fault only
    assert f"'kafka.receive.message.max.bytes' to at least {size}" in message
    assert "'kafka.fetch.max.bytes'" in message and \
        "'kafka.max.partition.fetch.bytes'" in message
    assert conn.closed and not conn.in_flight


def test_the_receive_buffer_shrinks_after_a_run_of_small_responses(pair):
    conn, broker = pair
    # A 3 MB batch: the buffer grows to hold it.
    batch = v2_batch([R(value=bytes([i % 251]) * 3000) for i in range(1000)])
    small = [answer(b"s%d" % i) for i in range(8)]
    medium = answer(bytes(1_000_000))         # more than a quarter of the buffer
    broker.script = [answer(batch.data)] + small[:7] + [medium] + small + [answer(b"after")]
    first = fetch(conn)
    big_buffer = first.partitions[TP].records.obj
    assert len(big_buffer) >= len(batch.data)
    # Decoded in place, as the executors do; the next request goes out before decoding.
    decoded = decode_to_arrow(first.partitions[TP].records, start_offset=0, end_offset=1000,
                              topic="t", partition=0, include_headers=True)
    values = decoded.batches[0].column("value")
    del first
    # Seven small responses and one that needs more than a quarter of the buffer: it stays.
    assert all(fetch(conn, 1000 + i).partitions[TP].records.obj is big_buffer
               for i in range(8))
    results = [fetch(conn, 2000 + i) for i in range(7)]
    assert all(r.partitions[TP].records.obj is big_buffer for r in results)
    # The eighth response in a row that needs less than a quarter of the buffer lands in a
    # smaller one, while the previous response still points into the old one (as the fetch
    # loop's last FetchResult does until the next one replaces it) ...
    eighth = fetch(conn, 2007)
    assert eighth.partitions[TP].records.obj is not big_buffer
    assert len(eighth.partitions[TP].records.obj) < len(big_buffer) // 2
    assert bytes(eighth.partitions[TP].records) == b"s7"
    del results
    # ... and the old one is free as soon as that is dropped: nothing else holds it, not even
    # the Arrow columns decoded from it (a bytearray with views on it cannot be resized).
    big_buffer.append(0)
    assert sys.getrefcount(big_buffer) == 2   # this name and getrefcount's argument
    assert values.to_pylist()[:3] == [bytes([i]) * 3000 for i in range(3)]
    assert bytes(fetch(conn, 2008).partitions[TP].records) == b"after"


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
