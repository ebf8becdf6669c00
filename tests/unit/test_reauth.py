"""SASL sessions re-authenticated by the connector's own clock (kafka_source.wire.net.reauth),
on fake kafka-python connections: when the clock starts, when a request must re-authenticate
first, and how the re-authentication is started; then on kafka-python's real connection and
event loop, a request kafka-python sends itself (its metadata refresh). Against a real broker,
with kafka-python's timer made late: tests/integration/test_security.py
(test_requests_reauthenticate_in_time_when_the_timer_is_late)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections import deque
from types import SimpleNamespace

import pytest
from kafka.net.connection import KafkaConnection
from kafka.net.selector import NetworkSelector
from kafka.net.transport import KafkaTCPTransport
from kafka.protocol.broker_version_data import BrokerVersionData
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse,
                                 SaslHandshakeRequest, SaslHandshakeResponse)

from kafka_source.wire.net.handshake import ConnectionManager
from kafka_source.wire.net.reauth import (REAUTH_AT, read_late, reauthenticate_at,
                                          reauthentication_due, session_clock,
                                          start_reauthentication, track_sessions)

pytestmark = pytest.mark.pyspark_free


class FakeNet:
    def __init__(self):
        self.soon, self.cancelled = [], []

    def call_soon(self, fn):
        task = SimpleNamespace(fn=fn, scheduled_at=None)
        self.soon.append(task)
        return task

    def cancel(self, task):
        self.cancelled.append(task)


class FakeConnection:
    """The parts of kafka-python's KafkaConnection the module uses. ``delay_s`` is how long
    after the last SaslAuthenticate request was sent its response is processed."""

    def __init__(self, lifetime_ms=10_000, delay_s=0.0):
        self.net = FakeNet()
        self.closed = False
        self.sent = []
        self.delay_s = delay_s
        self.in_flight_requests, self._request_buffer, self.paused = deque(), deque(), set()
        self._reauth = SimpleNamespace(session_lifetime_ms=0, is_reauthenticating=False,
                                       task=None, _task=None, _run=object(),
                                       schedule=lambda: None, _do_reauth=None,
                                       on_response_processed=lambda: None)

    def _timeout_at(self, now=None, timeout_ms=None):
        return time.monotonic() + (timeout_ms or 30_000) / 1000

    def unpause(self, reason):
        self.paused.discard(reason)

    def _send_request(self, request, future=None, timeout_at=None):
        self.sent.append(type(request).__name__)
        return request

    def send_request(self, request, request_timeout_ms=None):
        return self._send_request(request)

    async def _sasl_authenticate(self, timeout_at=None):
        self._send_request(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"))
        self._send_request(SaslAuthenticateRequest(auth_bytes=b"first"))
        self._send_request(SaslAuthenticateRequest(auth_bytes=b"final"))
        time.sleep(self.delay_s)          # the final response, processed late
        self._reauth.session_lifetime_ms = 10_000


def authenticated(conn) -> tuple[float, float]:
    track_sessions(conn)
    before = time.monotonic()
    asyncio.run(conn._sasl_authenticate())
    return before, time.monotonic()


def test_the_session_begins_when_the_last_authenticate_request_was_sent():
    conn = FakeConnection(delay_s=0.3)
    before, after = authenticated(conn)
    began = session_clock(conn).began
    assert before <= began <= before + 0.1       # not when the late response was processed
    assert after - began >= 0.3
    assert conn.sent == ["SaslHandshakeRequest", "SaslAuthenticateRequest",
                         "SaslAuthenticateRequest"]


def test_other_requests_leave_the_clock_alone():
    conn = FakeConnection()
    authenticated(conn)
    began = session_clock(conn).began
    time.sleep(0.01)
    conn._send_request(MetadataRequest(topics=None))
    assert session_clock(conn).began == began


def test_a_failed_exchange_starts_no_session():
    conn = FakeConnection()

    async def rejected(timeout_at=None):
        conn._send_request(SaslAuthenticateRequest(auth_bytes=b"wrong"))
        raise RuntimeError("rejected")

    conn._sasl_authenticate = rejected
    track_sessions(conn)
    try:
        asyncio.run(conn._sasl_authenticate())
    except RuntimeError:
        pass
    assert session_clock(conn).began is None


def test_due_at_reauth_at_of_the_lifetime_by_our_clock_though_the_timer_is_later():
    conn = FakeConnection()
    authenticated(conn)
    began = session_clock(conn).began
    conn._reauth.task = SimpleNamespace(scheduled_at=began + 12.0)   # a late timer
    lifetime_s = 10
    assert not reauthentication_due(conn, now=began + REAUTH_AT * lifetime_s - 0.01)
    assert reauthentication_due(conn, now=began + REAUTH_AT * lifetime_s + 0.01)
    assert reauthentication_due(conn, now=began + lifetime_s + 5)


def test_when_to_reauthenticate_or_replace_a_connection():
    conn = FakeConnection()
    authenticated(conn)
    began = session_clock(conn).began
    assert reauthenticate_at(conn) == began + REAUTH_AT * 10     # 10 s sessions
    untracked = FakeConnection()                 # no exchange seen: counted from now
    untracked._reauth.session_lifetime_ms = 10_000
    assert reauthenticate_at(untracked, now=100.0) == 100.0 + REAUTH_AT * 10
    endless = FakeConnection()                   # no SASL, or sessions that do not end
    assert reauthenticate_at(endless) == float("inf")


def test_due_when_the_timer_is_overdue():
    conn = FakeConnection()
    authenticated(conn)
    now = session_clock(conn).began + 1
    conn._reauth.task = SimpleNamespace(scheduled_at=now - 0.001)
    assert reauthentication_due(conn, now=now)


def test_never_due_without_an_ending_session_or_while_it_cannot_help():
    plain = FakeConnection()
    track_sessions(plain)                        # never authenticated: no SASL
    assert not reauthentication_due(plain, now=time.monotonic() + 3600)

    endless = FakeConnection()
    authenticated(endless)
    endless._reauth.session_lifetime_ms = 0      # the broker does not end sessions
    assert not reauthentication_due(endless, now=time.monotonic() + 3600)

    later = time.monotonic() + 3600
    busy = FakeConnection()
    authenticated(busy)
    busy._reauth.is_reauthenticating = True
    assert not reauthentication_due(busy, now=later)
    closed = FakeConnection()
    authenticated(closed)
    closed.closed = True
    assert not reauthentication_due(closed, now=later)
    untracked = FakeConnection()                 # a kafka-python without the hooks: its timer
    untracked._reauth.session_lifetime_ms = 10_000
    assert not reauthentication_due(untracked, now=later)
    untracked._reauth.task = SimpleNamespace(scheduled_at=later - 1)
    assert reauthentication_due(untracked, now=later)


def test_starting_replaces_the_timer_with_a_run_at_the_next_turn():
    conn = FakeConnection()
    timer = SimpleNamespace(scheduled_at=time.monotonic() + 5)
    conn._reauth.task = timer
    start_reauthentication(conn)
    assert conn.net.cancelled == [timer]
    assert [t.fn for t in conn.net.soon] == [conn._reauth._run]
    assert conn._reauth._task is conn.net.soon[0]


def test_a_connection_without_the_private_hooks_is_left_as_it_is():
    conn = SimpleNamespace(closed=False)
    track_sessions(conn)
    assert session_clock(conn) is None
    assert not reauthentication_due(conn)


# --- requests kafka-python sends on its own --------------------------------------------------
#
# Every BrokerClient also runs kafka-python's metadata refresh loop (started by its bootstrap):
# after any connection of the client is lost -- every broker restart -- it sends a Metadata
# request to the least loaded broker, preferring an idle connection, through the connection
# manager, never through BrokerClient.send. On a client that polls rarely (the consumer
# protocol's heartbeat thread: every 5 s) such an idle connection's session can have ended while
# kafka-python's timer is not due yet (it counts from when the last SaslAuthenticate response
# was processed, which can be a poll, 5 s, after it arrived). Below: kafka-python's real
# connection, event loop and metadata refresh, the broker's side replaced by a transport that
# records the API key of each request written.

SASL_HANDSHAKE, METADATA, SASL_AUTHENTICATE = 17, 3, 36


class WireTransport:
    """Records the API key (and correlation id) of every request frame written."""

    host = "127.0.0.1"

    def __init__(self):
        self.api_keys = []
        self.versions = []
        self.correlation_ids = []

    def write(self, data):
        view, at = memoryview(data), 0
        while at < len(view):
            size, api_key, version, correlation_id = struct.unpack_from(">ihhi", view, at)
            self.api_keys.append(api_key)
            self.versions.append(version)
            self.correlation_ids.append(correlation_id)
            at += 4 + size

    def getPeer(self):
        return ("127.0.0.1", 9093)

    def host_port(self):
        return "127.0.0.1:9093"

    def abort(self, error=None):
        self.protocol.connection_lost(error)

    close = abort


@pytest.fixture
def net():
    """kafka-python's event loop, closed after the test."""
    selector = NetworkSelector()
    yield selector
    selector.close()


def authenticated_connection(net, *, age_s: float, timer_in_s: float) -> KafkaConnection:
    """A connected kafka-python connection whose 10 s SASL session began ``age_s`` ago by the
    connector's clock, with kafka-python's re-authentication timer due in ``timer_in_s``."""
    conn = KafkaConnection(net, node_id=1, broker_version_data=BrokerVersionData((4, 0)),
                           security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                           sasl_plain_username="u", sasl_plain_password="p")
    track_sessions(conn)
    conn.transport, conn.parser = WireTransport(), KafkaProtocol(client_id="test")
    conn.transport.protocol = conn
    conn.initializing, conn.connected = False, True
    conn._reauth.session_lifetime_ms = 10_000
    session_clock(conn).began = time.monotonic() - age_s
    conn._reauth._task = net.call_later(timer_in_s, conn._reauth._run)
    return conn


def test_kafka_pythons_own_metadata_refresh_reauthenticates_first_when_due(net):
    manager = ConnectionManager(net, bootstrap_servers="127.0.0.1:9093",
                                security_protocol="SASL_SSL", sasl_mechanism="PLAIN")
    try:
        # 9.5 s into a 10 s session; kafka-python's timer, counted late, 3 s away
        conn = authenticated_connection(net, age_s=9.5, timer_in_s=3.0)
        manager._conns[1] = conn
        refresh = manager.call_soon(manager.cluster.refresh_metadata, 1)
        for _ in range(3):
            net.poll(timeout_ms=0)
        # the re-authentication goes first; the Metadata request waits for it
        assert conn.transport.api_keys == [SASL_HANDSHAKE]
        assert conn._reauth.is_reauthenticating
        assert not refresh.is_done
    finally:
        manager.close()


def test_a_request_on_a_connection_whose_session_is_young_goes_out_at_once(net):
    conn = authenticated_connection(net, age_s=1.0, timer_in_s=7.5)
    conn.send_request(MetadataRequest(topics=[]))
    assert conn.transport.api_keys == [METADATA]
    assert not conn._reauth.is_reauthenticating


def test_any_request_sent_when_the_session_is_due_waits_for_the_reauthentication(net):
    """The connection itself checks, whoever sends: the request is held at once, before the
    event loop has run the re-authentication, and goes out after it."""
    conn = authenticated_connection(net, age_s=8.5, timer_in_s=3.0)
    conn.send_request(MetadataRequest(topics=[]))
    assert conn.transport.api_keys == []           # held
    assert conn._reauth.is_reauthenticating
    net.poll(timeout_ms=0)
    assert conn.transport.api_keys == [SASL_HANDSHAKE]
    conn.send_request(MetadataRequest(topics=[]))  # still held: no second exchange
    net.poll(timeout_ms=0)
    assert conn.transport.api_keys == [SASL_HANDSHAKE]

    answer(net, conn, SaslHandshakeResponse, error_code=0, mechanisms=["PLAIN"])
    assert conn.transport.api_keys == [SASL_HANDSHAKE, SASL_AUTHENTICATE]
    answer(net, conn, SaslAuthenticateResponse, error_code=0, error_message=None,
           auth_bytes=b"", session_lifetime_ms=10_000)
    # re-authenticated: the held requests go out, and the session starts again; the second
    # only once the first is answered (its 30 s timeout is past this 10 s session's end)
    assert conn.transport.api_keys == [SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA]
    assert not conn._reauth.is_reauthenticating
    assert not reauthentication_due(conn)
    assert time.monotonic() - session_clock(conn).began < 1
    answer(net, conn, MetadataResponse)
    assert conn.transport.api_keys == [SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA, METADATA]


def answer(net, conn, response_class, **fields) -> None:
    """The broker's answer to the oldest request in flight on ``conn``."""
    correlation_id = conn.in_flight_requests[0][0]
    version = conn.transport.versions[conn.transport.correlation_ids.index(correlation_id)]
    response = response_class(version=version, **fields)
    response.with_header(correlation_id=correlation_id)
    conn.data_received(bytes(response.encode(framed=True, header=True)))
    for _ in range(3):
        net.poll(timeout_ms=0)


# --- requests the broker would read late ------------------------------------------------------
#
# A broker reads a connection's next request only after answering the one before. A request
# written behind one that waits at the broker (a Produce with acks=all during a restart, a Fetch
# for its max wait) is read when that one is done, which can be after the session's end though
# the request was checked in time. Such requests are held by the connection and let out as the
# answers come, each checked again then.


def test_a_request_behind_one_that_may_be_answered_late_is_held_until_the_answer(net):
    # 2 s into a 10 s session: nothing due, but the first request may take its 30 s
    conn = authenticated_connection(net, age_s=2.0, timer_in_s=7.0)
    first = conn.send_request(MetadataRequest(topics=[]))
    assert read_late(conn)
    second = conn.send_request(MetadataRequest(topics=[]))
    third = conn.send_request(MetadataRequest(topics=[]))
    assert conn.transport.api_keys == [METADATA]            # the others held, in order
    assert len(conn._request_buffer) == 2
    answer(net, conn, MetadataResponse)
    assert first.succeeded()
    assert conn.transport.api_keys == [METADATA, METADATA]   # one more, behind nothing
    answer(net, conn, MetadataResponse)
    assert second.succeeded()
    assert conn.transport.api_keys == [METADATA] * 3
    answer(net, conn, MetadataResponse)
    assert third.succeeded() and not conn._request_buffer


def test_a_held_request_reauthenticates_first_when_the_answer_came_late(net):
    """The answer to the request in front came when the session was due: the held request is
    checked again as it would go out, and waits for the re-authentication."""
    conn = authenticated_connection(net, age_s=2.0, timer_in_s=7.0)
    conn.send_request(MetadataRequest(topics=[]))
    held = conn.send_request(MetadataRequest(topics=[]))
    session_clock(conn).began -= 6.0                         # the answer, 6 s later
    answer(net, conn, MetadataResponse)
    assert conn.transport.api_keys == [METADATA, SASL_HANDSHAKE]
    assert not held.is_done
    answer(net, conn, SaslHandshakeResponse, error_code=0, mechanisms=["PLAIN"])
    answer(net, conn, SaslAuthenticateResponse, error_code=0, error_message=None,
           auth_bytes=b"", session_lifetime_ms=10_000)
    assert conn.transport.api_keys == [METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA]
    answer(net, conn, MetadataResponse)
    assert held.succeeded()


def test_requests_are_pipelined_when_every_answer_is_due_in_time(net):
    # a young session and requests whose timeouts end long before it is due
    conn = authenticated_connection(net, age_s=1.0, timer_in_s=8.0)
    for _ in range(3):
        conn.send_request(MetadataRequest(topics=[]), request_timeout_ms=1000)
    assert conn.transport.api_keys == [METADATA] * 3
    assert not read_late(conn)
    # sessions that never end: never held, whatever the timeouts
    endless = authenticated_connection(net, age_s=1.0, timer_in_s=8.0)
    endless._reauth.session_lifetime_ms = 0
    for _ in range(3):
        endless.send_request(MetadataRequest(topics=[]))
    assert endless.transport.api_keys == [METADATA] * 3


def test_held_requests_fail_with_the_connection(net):
    conn = authenticated_connection(net, age_s=2.0, timer_in_s=7.0)
    first = conn.send_request(MetadataRequest(topics=[]))
    held = conn.send_request(MetadataRequest(topics=[]))
    assert conn.transport.api_keys == [METADATA]                 # the second never written
    conn.close(RuntimeError("lost"))
    for _ in range(3):
        net.poll(timeout_ms=0)
    assert first.failed() and held.failed()


def test_a_request_is_handed_to_the_socket_at_once_not_at_the_next_poll(net):
    """kafka-python's transport queues a request's bytes for a task of its event loop. A
    process that stops polling right after (a Python worker idle between tasks, with the sink's
    client in it) left them queued for as long: the request was checked in the session but
    read by the broker after its end. On a real socket, no poll in between."""
    ours, brokers = socket.socketpair()
    try:
        ours.setblocking(False)
        brokers.settimeout(0.5)
        conn = authenticated_connection(net, age_s=1.0, timer_in_s=8.0)
        conn.transport = KafkaTCPTransport(net, ours, host="127.0.0.1")
        conn.transport.set_protocol(conn)
        conn.send_request(MetadataRequest(topics=[]))
        size, api_key = struct.unpack(">ih", brokers.recv(6))
        assert api_key == METADATA and size > 0
        assert not conn.transport._write_buffer
    finally:
        brokers.close()


# --- one re-authentication at a time ----------------------------------------------------------
#
# After an exchange whose last answer came late (processed at a poll seconds after it arrived:
# the driver idles between micro-batches), the new session is due by the connector's clock
# already. The held requests kafka-python then lets out start the next exchange first, and
# kafka-python scheduled its timer after that, over the run already pending: a timer nobody
# could cancel, which fired during a later exchange. Its SaslHandshake, or the requests let out
# when it ended, reached the broker in the middle of that exchange, which answered
# ILLEGAL_SASL_STATE and closed the connection (Kafka 2.2, tokens of whole-second 'exp').


def reauth_runs(net) -> list:
    """The re-authentication runs waiting on ``net``'s timers."""
    return [task for _, task in net._scheduled
            if getattr(task._stack[0], "__name__", "") == "_run"
            or "_run" in getattr(getattr(task._stack[0], "cr_code", None), "co_name", "")]


def fire_timers(net) -> None:
    """Every timer of ``net`` fires now, as if their time had come."""
    for _, task in list(net._scheduled):
        net.reschedule(time.monotonic(), task)
    for _ in range(3):
        net.poll(timeout_ms=0)


def reauthenticate(net, conn, *, answered_after_s: float = 0.0) -> None:
    answer(net, conn, SaslHandshakeResponse, error_code=0, mechanisms=["PLAIN"])
    session_clock(conn)._sent -= answered_after_s
    answer(net, conn, SaslAuthenticateResponse, error_code=0, error_message=None,
           auth_bytes=b"", session_lifetime_ms=10_000)


def test_an_exchange_answered_late_leaves_one_run_scheduled_not_two(net):
    conn = authenticated_connection(net, age_s=8.5, timer_in_s=3.0)
    conn.send_request(MetadataRequest(topics=[]))
    net.poll(timeout_ms=0)
    # the last answer processed 8 s after its request was sent: the new 10 s session is past
    # 70% already, and the held Metadata request starts the next exchange
    reauthenticate(net, conn, answered_after_s=8.0)
    assert conn.transport.api_keys == [SASL_HANDSHAKE, SASL_AUTHENTICATE, SASL_HANDSHAKE]
    assert reauth_runs(net) == []                    # the pending run is the next, no timer
    reauthenticate(net, conn)
    assert conn.transport.api_keys[-2:] == [SASL_AUTHENTICATE, METADATA]
    assert len(reauth_runs(net)) == 1
    # when the timer fires, one exchange: one SaslHandshake, and nothing behind it
    answer(net, conn, MetadataResponse)
    fire_timers(net)
    assert conn.transport.api_keys[5:] == [SASL_HANDSHAKE]
    reauthenticate(net, conn)
    assert conn.transport.api_keys[5:] == [SASL_HANDSHAKE, SASL_AUTHENTICATE]
    assert len(reauth_runs(net)) == 1 and not conn.closed


def test_a_run_that_fires_during_an_exchange_does_not_start_another(net):
    conn = authenticated_connection(net, age_s=8.5, timer_in_s=3.0)
    stray = net.call_later(60, conn._reauth._run)     # a timer that escaped cancelling
    conn.send_request(MetadataRequest(topics=[]))
    net.poll(timeout_ms=0)
    assert conn.transport.api_keys == [SASL_HANDSHAKE]
    net.reschedule(time.monotonic(), stray)            # it fires mid-exchange
    for _ in range(3):
        net.poll(timeout_ms=0)
    assert stray.is_done
    assert conn.transport.api_keys == [SASL_HANDSHAKE]    # no second SaslHandshake
    reauthenticate(net, conn)
    assert conn.transport.api_keys == [SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA]
    assert not conn._reauth.is_reauthenticating and not conn.closed


# --- no sooner than a broker accepts ----------------------------------------------------------
#
# A broker begins a re-authentication at most once a second per connection; a SaslHandshake
# sooner is answered ILLEGAL_SASL_STATE. Seen on Kafka 4.0 with 6 s tokens whose exp is a whole
# second: a session of 1,133 ms, due at 70% (0.79 s) by the connector's clock.


def test_not_due_within_a_second_of_the_last_exchange_whatever_the_session():
    conn = FakeConnection()
    authenticated(conn)
    began = session_clock(conn).began
    conn._reauth.session_lifetime_ms = 1133
    assert not reauthentication_due(conn, now=began + 0.8)       # 70% passed, 1 s not
    conn._reauth.task = SimpleNamespace(scheduled_at=began + 0.9)  # nor kafka-python's timer
    assert not reauthentication_due(conn, now=began + 0.95)
    assert reauthentication_due(conn, now=began + 1.0)
    conn._reauth.session_lifetime_ms = 10_000                    # longer sessions: as before
    conn._reauth.task = None
    assert not reauthentication_due(conn, now=began + 6.9)
    assert reauthentication_due(conn, now=began + 7.1)


def test_kafka_pythons_timer_waits_until_the_broker_accepts_a_new_exchange(net):
    conn = authenticated_connection(net, age_s=0.0, timer_in_s=100)
    net.cancel(conn._reauth.task)
    conn._reauth._task = None
    conn._reauth.session_lifetime_ms = 1000        # kafka-python would fire at 0.85-0.95 s
    conn._reauth.schedule()
    began = session_clock(conn).began
    assert conn._reauth.task.scheduled_at >= began + 1.0
    assert reauth_runs(net) == [conn._reauth.task]
    conn._reauth.session_lifetime_ms = 10_000      # later than a second: left as it is
    net.cancel(conn._reauth.task)
    conn._reauth._task = None
    conn._reauth.schedule()
    assert began + 8.4 <= conn._reauth.task.scheduled_at <= began + 9.6
