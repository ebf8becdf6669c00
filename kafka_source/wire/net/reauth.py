"""SASL sessions that end (KIP-368): re-authenticate before the broker's deadline, by our clock.

A broker ends each SASL session a fixed time after it authenticated the client: after
``connections.max.reauth.ms`` on the listener, or at an OAUTHBEARER token's ``exp``. A
re-authentication is accepted after that; any other request the broker reads after it makes the
broker close the connection (its ``expired-connections-killed-count``), and whatever was in
flight on that connection fails: a commit, a Produce, a Fetch.

kafka-python re-authenticates on a timer of its event loop, set to 85-95% of the session's
lifetime counted from the moment it *processed* the last SaslAuthenticate response. For a client
like this connector's, that timer can be late twice over:

* The loop runs only while the client polls. The driver is idle between micro-batches, so an
  overdue timer fires only at the next poll, and the request that poll is for may go out first.
* The count starts late when the response was processed late: a response that arrived while
  nobody polled (the driver's commit goes out at the end of one micro-batch and is settled at the
  next), or a broker slowed by a rolling restart on busy machines, leaves the client believing its
  session began later than it did. With 10 s sessions the timer's 5-15% margin is 0.5-1.5 s, and
  one such delay used it up: 1 in 10 runs of the rolling-restart scenario lost the driver's
  coordinator connection this way (an OffsetCommit read after the session's end).

Java's client does not meet the first (its network thread always polls) and re-authenticates
before a request too. So each connection here gets a :class:`SessionClock` (:func:`track_sessions`,
installed by the connection manager before the connection authenticates). It notes when the last
SaslAuthenticate request of each exchange was *sent*: the broker begins the session only after it
has read that request, so the note is never late, whatever delays the response. Before each
request, the client starts the re-authentication once :data:`REAUTH_AT` of the lifetime has
passed by that clock (:func:`reauthentication_due`), or kafka-python's own timer is due.
kafka-python then holds the request until the re-authentication is done and sends it after,
which the broker accepts.

The check is made by the connection itself, on every request handed to it
(:func:`track_sessions` wraps its ``send_request``), not only by the connector's own callers:
kafka-python sends requests of its own. Each client runs kafka-python's metadata refresh loop,
which after any lost connection -- every broker restart -- sends Metadata to the least loaded
broker, preferring an idle connection, from inside the event loop. An idle connection is the
one whose session has most likely ended, and on a client that polls seldom (the consumer
protocol's heartbeat thread polls only at its heartbeats, every 5 s by the brokers' default)
kafka-python's timer for it runs seconds after that end, or is not even due yet: a connection
the refresh loop opened in the background finishes its SASL exchange at the next poll, and the
timer counts from then. Checked only in :class:`~kafka_source.wire.net.client.BrokerClient`,
that Metadata request could go out on the ended session, and the broker closed the connection
for it: the likely cause of the one expired connection the rolling-restart scenario with the
consumer protocol counted in about 1 run of 3.

A request checked in time can still be read late, in two ways, and both are closed here:

* kafka-python's transport only queues a request's bytes; a task of its event loop writes them.
  When the process stops polling right after -- a Python worker idle between two tasks, with
  the sink's client in it -- they wait there. In the rolling-restart scenario (tests/cluster,
  10 s sessions) a Metadata request of kafka-python's refresh loop, queued 40 ms into a session
  at the end of a poll, was written at the worker's next poll 14 s later, and the broker closed
  the connection for it (its request log: the request before answered at once, this one read
  14.4 s later). Every request now goes to the socket when it is sent (:func:`write_now`).
* A broker reads one request of a connection at a time: the next only after it has answered
  the one before (it mutes the channel meanwhile, which keeps the answers in order). A request
  written behind others is read when they are done, and some wait on purpose: a Produce with
  acks=all until the replicas have the records, a Fetch for up to its max wait, a JoinGroup for
  the rebalance. Behind a Fetch that waited past the session's end, a Metadata request made the
  broker close the connection (tests/integration/test_security.py). So while a request in
  flight may still be unanswered when the session reaches :data:`REAUTH_AT` (its timeout is
  later: :func:`read_late`), the next requests are held in the connection's own buffer, where
  kafka-python keeps requests during a re-authentication, and let out one by one as the answers
  come (:func:`release_held`), each checked again as if it were sent then. The broker would not
  have read them sooner, so holding costs a round trip at most; with sessions of an hour it
  happens only in the last request timeout before each re-authentication, and never where
  sessions do not end.

Starting exchanges early must respect what a broker accepts, and never start two at once:

* A broker begins at most one re-authentication a second on a connection, and answers a sooner
  SaslHandshake ILLEGAL_SASL_STATE. A session begun on an OAUTHBEARER token in its last seconds
  (whose ``exp`` is a whole second, as identity providers issue it) lasted 1.1 s, due at 0.79 s
  by this clock: the broker refused the exchange and the connection was closed (Kafka 4.0,
  tests/integration/test_security.py). No exchange starts before
  :func:`earliest_reauthentication`, kafka-python's timer included.
* After an exchange whose last answer was processed late, the new session is due by this
  clock already, and the held requests kafka-python lets out at its end start the next
  exchange at once; kafka-python then scheduled its timer over that pending run, leaving a
  timer nobody could cancel, which could fire in the middle of a later exchange and write a
  second SaslHandshake into it (tests/unit/test_reauth.py, on kafka-python's event loop). So
  kafka-python's ``schedule`` adds no timer while a run is pending (:func:`pending_run`), and a
  run that finds an exchange in progress ends at once.

This relies on a few private parts of kafka-python 3's connection (``_send_request``,
``_sasl_authenticate``, ``_reauth`` with its ``schedule`` and ``_do_reauth``,
``in_flight_requests``, ``_request_buffer``); where they are
missing, connections work as kafka-python makes them and only this early start is lost (logged
at DEBUG for each connection).
"""

from __future__ import annotations

import logging
import time

from kafka.future import Future
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslBytesRequest

log = logging.getLogger(__name__)

# Share of a session's lifetime after which a request first re-authenticates. Java's client and
# kafka-python re-authenticate at 85-95%, jittered so that many connections do not all do it at
# once; requests check earlier, by a clock that is never late, and leave 30% (3 s of a 10 s
# session, 18 minutes of an hour) for the request to reach the broker and be read by it. 20%
# was not always enough on a loaded machine: in CI's rolling restart of a Kafka 2.2 cluster
# with 10 s sessions, a Metadata request checked in time was read by a restarted broker after
# its session's end (2 connections closed as expired, 1 run in about 10).
REAUTH_AT = 0.7

# A broker begins a re-authentication at most once a second per connection
# (KafkaChannel.maybeBeginServerReauthentication, since KIP-368 in Kafka 2.2); a SaslHandshake
# sooner is answered as a request out of place, ILLEGAL_SASL_STATE, and the client's exchange
# fails. Sessions that short are those begun on a token in its last seconds: a token of a few
# seconds' lifetime, whose exp is a whole second, re-authenticated at REAUTH_AT of a session of
# 1.1 s (Kafka 4.0, tests/integration/test_security.py).
MIN_REAUTH_INTERVAL_S = 1.0

_AUTH_REQUESTS = (SaslAuthenticateRequest, SaslBytesRequest)
_ATTRIBUTE = "_pykafka_session_clock"


class SessionClock:
    """When a connection's current SASL session began, at the latest by the broker's clock:
    the time its last SaslAuthenticate request was sent (``began``, ``time.monotonic()``; None
    before the first successful exchange)."""

    __slots__ = ("began", "_sent", "exchanging")

    def __init__(self):
        self.began: float | None = None
        self._sent: float | None = None
        self.exchanging = False       # a re-authentication exchange is in progress


def track_sessions(conn) -> None:
    """Give the kafka-python connection ``conn`` a :class:`SessionClock`, before it
    authenticates: every SASL exchange on it (the first and each re-authentication) sets the
    clock when it succeeds."""
    clock = SessionClock()
    try:
        send_request = conn._send_request
        authenticate = conn._sasl_authenticate
        public_send = conn.send_request
        reauth = conn._reauth
        response_processed = reauth.on_response_processed
        unpause = conn.unpause
        schedule = reauth.schedule
        exchange = reauth._do_reauth
        reauth._run                             # noqa: B018 - what start_reauthentication uses
        conn.in_flight_requests, conn._request_buffer, conn._timeout_at  # noqa: B018 - holding
    except AttributeError as exc:
        log.debug("kafka-python's connection has no %s: SASL sessions are re-authenticated on "
                  "kafka-python's own timer only", exc)
        return

    def timed_send(request, *args, **kwargs):
        if isinstance(request, _AUTH_REQUESTS):
            clock._sent = time.monotonic()
        result = send_request(request, *args, **kwargs)
        write_now(conn)
        return result

    async def timed_authenticate(*args, **kwargs):
        clock._sent = None
        result = await authenticate(*args, **kwargs)
        if clock._sent is not None:
            clock.began = clock._sent
        return result

    def checked_send(request, request_timeout_ms=None):
        # Every request handed to the connection, whoever sends it (kafka-python's metadata
        # refresh loop too): the re-authentication first when it is due, and this request held
        # until it is done; or held behind requests in flight that may be answered too late.
        # The exchange's own requests go through _send_request, not here.
        if reauthentication_due(conn):
            start_reauthentication(conn)
        elif _may_hold(conn) and (conn._request_buffer or read_late(conn)):
            future = Future()
            conn._request_buffer.append(
                (request, future, conn._timeout_at(timeout_ms=request_timeout_ms)))
            return future
        return public_send(request, request_timeout_ms=request_timeout_ms)

    def answered():
        response_processed()
        release_held(conn)

    def unpaused(reason):
        unpause(reason)
        write_now(conn)
        release_held(conn)

    def schedule_unless_pending():
        # kafka-python schedules the next run after each exchange, over whatever run is
        # pending. One is when the exchange's answer came late: the held requests it lets out
        # find the new session due already, and release_held starts the next exchange first.
        # Scheduled over, that run's timer is lost to cancelling and fires later on its own.
        if pending_run(conn):
            return
        schedule()
        task = reauth.task
        earliest = earliest_reauthentication(conn)
        if task is not None and getattr(task, "scheduled_at", None) is not None \
                and task.scheduled_at < earliest:
            conn.net.reschedule(earliest, task)     # not before the broker accepts it

    async def one_exchange_at_a_time():
        # A run that fires while an exchange is in progress (a timer that escaped
        # cancelling) would write a second SaslHandshake into it, or let held requests out in
        # the middle of it; the broker answers either with ILLEGAL_SASL_STATE and closes the
        # connection. The exchange in progress schedules the next one when it is done.
        if clock.exchanging:
            log.debug("%s: a SASL re-authentication is in progress; not starting another", conn)
            return None
        clock.exchanging = True
        try:
            return await exchange()
        finally:
            clock.exchanging = False

    conn._send_request = timed_send
    conn._sasl_authenticate = timed_authenticate
    conn.send_request = checked_send
    conn.send_buffered = lambda: release_held(conn)
    reauth.on_response_processed = answered
    conn.unpause = unpaused
    reauth.schedule = schedule_unless_pending
    reauth._do_reauth = one_exchange_at_a_time
    setattr(conn, _ATTRIBUTE, clock)


def write_now(conn) -> None:
    """Hand ``conn``'s queued bytes to the socket now, as far as it takes them, instead of at
    the event loop's next turn, so that a request checked now is on its way now. kafka-python's
    transport only queues what it is given and writes it from a task of the event loop; when
    the process then stops polling -- a Python worker idle between two tasks, with the sink's
    client cached in it -- the bytes wait there. Seen in the rolling-restart scenario
    (tests/cluster): kafka-python's metadata refresh queued a Metadata request at the end of a
    poll, 40 ms into a session; the worker's next poll, 14 s later, wrote it, and the broker
    closed the connection as expired.
    Bytes the socket does not take (a large Produce under back-pressure) stay queued for the
    event loop, which writes them as before."""
    transport = getattr(conn, "transport", None)
    try:
        if transport is None or not transport._write_buffer or transport._sock is None:
            return
        sent, error = transport._sock_send()
    except AttributeError:
        return
    if error is not None:
        transport.abort(error=error)
    elif sent:
        transport.last_write = time.monotonic()


def _may_hold(conn) -> bool:
    """Whether requests may be held, or let out, by :func:`checked_send` and
    :func:`release_held`: the connection is up and neither setting up nor re-authenticating
    (kafka-python holds requests itself then, in the same buffer, and lets them out through
    :func:`release_held` when it is done)."""
    return (not conn.closed and getattr(conn, "connected", False)
            and not getattr(conn, "initializing", False)
            and not conn._reauth.is_reauthenticating)


def read_late(conn) -> bool:
    """Whether a request written to ``conn`` now might be read by the broker only after the
    session has reached :func:`reauthenticate_at`: a request in flight might be answered only
    then (its timeout is that late), and the broker reads the next request of a connection only
    after answering the one before. False for a connection whose sessions do not end."""
    at = reauthenticate_at(conn)
    return at != float("inf") and any(entry[3] >= at for entry in conn.in_flight_requests)


def release_held(conn) -> None:
    """Let out the requests held in ``conn``'s buffer, in order, for as long as each may go:
    none while a re-authentication is due (it is started, and lets them out when it is done),
    and none more once one in flight may be answered too late (:func:`read_late`; the next
    answer calls this again). Replaces kafka-python's ``send_buffered``, which wrote them all at
    once after the connection's set-up and each re-authentication."""
    buffer = conn._request_buffer
    while buffer and _may_hold(conn) and not conn.paused:
        if reauthentication_due(conn):
            start_reauthentication(conn)
            return
        if read_late(conn):
            return
        request, future, timeout_at = buffer.popleft()
        conn._send_request(request, future=future, timeout_at=timeout_at)


def pending_run(conn) -> bool:
    """Whether a re-authentication of ``conn`` is scheduled and has not started yet (kafka-
    python's timer, or a run :func:`start_reauthentication` put on the event loop): a run
    clears the handle when it starts."""
    task = conn._reauth.task
    return task is not None and not getattr(task, "is_done", False)


def session_clock(conn) -> SessionClock | None:
    return getattr(conn, _ATTRIBUTE, None)


def reauthenticate_at(conn, now: float | None = None) -> float:
    """When ``conn`` should re-authenticate (a fetch connection: be replaced), as
    ``time.monotonic()``: at :data:`REAUTH_AT` of its session's lifetime by its
    :class:`SessionClock`, counted from ``now`` when the clock has seen no exchange (a
    kafka-python without the hooks). Infinity for a connection without SASL or whose broker does
    not end sessions."""
    lifetime_ms = getattr(getattr(conn, "_reauth", None), "session_lifetime_ms", 0) or 0
    if not lifetime_ms:
        return float("inf")
    began = getattr(session_clock(conn), "began", None)
    if began is None:
        began = time.monotonic() if now is None else now
    return began + REAUTH_AT * lifetime_ms / 1000


def reauthentication_due(conn, now: float | None = None) -> bool:
    """Whether a request on ``conn`` should wait for a re-authentication started now: the
    session has reached :func:`reauthenticate_at`, or kafka-python's own timer is overdue. False
    for a connection without SASL, whose broker does not end sessions, that is closed, or that
    is re-authenticating already."""
    reauth = getattr(conn, "_reauth", None)
    if reauth is None or getattr(conn, "closed", True) or reauth.is_reauthenticating:
        return False
    now = time.monotonic() if now is None else now
    if now < earliest_reauthentication(conn):
        return False
    scheduled_at = getattr(reauth.task, "scheduled_at", None)
    if scheduled_at is not None and scheduled_at <= now:
        return True
    return now >= reauthenticate_at(conn, now)


def earliest_reauthentication(conn) -> float:
    """The first moment (``time.monotonic()``) at which a broker accepts ``conn``'s next
    re-authentication: :data:`MIN_REAUTH_INTERVAL_S` after the last exchange's last
    SaslAuthenticate request was sent, which the broker read after the SaslHandshake it counts
    from. Minus infinity before the first exchange."""
    began = getattr(session_clock(conn), "began", None)
    return float("-inf") if began is None else began + MIN_REAUTH_INTERVAL_S


def start_reauthentication(conn) -> None:
    """Run ``conn``'s re-authentication at the event loop's next turn instead of at its timer
    (which is cancelled: the exchange schedules the next one when it is done), and hold every
    request sent from now until it is done, as kafka-python does while it re-authenticates:
    this may be called from inside the event loop (a request kafka-python sends itself), where
    nobody can poll to start the exchange before the request is written."""
    reauth = conn._reauth
    task = reauth.task
    if task is not None:
        conn.net.cancel(task)
    reauth._task = conn.net.call_soon(reauth._run)
    if hasattr(reauth, "_reauthenticating"):
        # kafka-python's flag (set again by the exchange, cleared when it ends or the
        # connection is lost): send_request buffers while it is set.
        reauth._reauthenticating = True
