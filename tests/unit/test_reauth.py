"""SASL sessions re-authenticated by the connector's own clock (kafka_source.wire.net.reauth),
on fake kafka-python connections: when the clock starts, when a request must re-authenticate
first, and how the re-authentication is started. Against a real broker, with kafka-python's
timer made late: tests/integration/test_security.py
(test_requests_reauthenticate_in_time_when_the_timer_is_late)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kafka_source.wire.net.reauth import (REAUTH_AT, reauthenticate_at, reauthentication_due,
                                          session_clock, start_reauthentication,
                                          track_sessions)


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
        self._reauth = SimpleNamespace(session_lifetime_ms=0, is_reauthenticating=False,
                                       task=None, _task=None, _run=object())

    def _send_request(self, request, future=None, timeout_at=None):
        self.sent.append(type(request).__name__)
        return request

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
