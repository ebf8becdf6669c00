"""Executor side: a dedicated connection per broker for the Fetch hot loop.

Why not send Fetch through kafka-python's network layer like every other request? Its reader
takes 4 KB per ``recv`` call, joins the pieces, copies them into a frame buffer and then copies
each partition's records out of it again while decoding the response: for a 1 GB partition that
is ~250,000 system calls and several copies of every byte, all under the GIL. Here a response is
read with a few large ``recv_into`` calls straight into one preallocated buffer sized from the
frame header (the GIL is released while the kernel copies), parsed in place
(:mod:`kafka_source.wire.fetch_protocol`) and decoded in place
(:func:`kafka_source.wire.fast_decode.decode_to_arrow` reads a
:class:`~kafka_source.wire.fast_decode.PaddedBuffer`), so the value bytes are copied once, into
the Arrow column.

Connection setup is kafka-python's: :meth:`FetchConnection.open` has a private kafka-python
client (its own selector, never polled again afterwards) connect to the broker, which does the
TCP connect, TLS handshake, ApiVersions and SASL authentication with exactly the settings of
the :class:`~kafka_source.wire.client.BrokerClient` it is opened for. Once that connection is
ready, its reading is paused and its socket (an ``ssl.SSLSocket`` for TLS) is used directly with
blocking, deadline-bounded calls. Nothing else uses the socket afterwards: the private client's
selector is never polled again, so none of its timers (idle check, SASL re-authentication) can
fire on it. Re-authentication (KIP-368) is replaced by reconnecting: a connection whose SASL
session would expire is not used for another request (:attr:`FetchConnection.expired`) and the
pool opens a new, freshly authenticated one.

One request is in flight per connection at a time, and the fetch loop sends the next request as
soon as a response is received, before decoding it: the broker prepares the next response while
this one is decoded. Each connection carries its fetch session (:mod:`kafka_source.wire.fetch_session`).
Every wait is bounded: connecting by ``kafka.request.timeout.ms``, each response by
``kafka.request.timeout.ms`` + ``kafka.fetch.max.wait.ms``. A connection that fails or times
out is closed and reported as :class:`~kafka_source.wire.client.RetriableBrokerError`.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
from typing import Callable, Mapping

import kafka.errors as Errors
from kafka.protocol.consumer import FetchRequest

from ..errors import BrokerSecurityError, BrokerUnavailableError, KafkaSourceError
from .fast_decode import RECORDS_PADDING, PaddedBuffer
from .fetch_protocol import (MAX_FETCH_VERSION, MIN_FETCH_VERSION, SESSION_VERSION,
                             FetchPartitionRequest, FetchResult, TopicPartition,
                             encode_fetch_request, parse_fetch_response, response_header_size)
from .fetch_session import FetchSession

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_INITIAL_BUFFER = 1 << 20
_REAUTH_FRACTION = 0.85      # reconnect at this share of the SASL session lifetime (as Java's 85-95%)


class FetchConnection:
    """A blocking, pipelined Fetch connection to one broker (see the module docstring)."""

    def __init__(self, sock, *, node_id, version: int, client_id: str, max_frame_bytes: int,
                 request_timeout_ms: int, expires_at: float = float("inf"),
                 on_close: Callable[[], None] | None = None):
        self.node_id = node_id
        self.version = version
        self.client_id = client_id
        self.max_frame_bytes = max_frame_bytes
        self.request_timeout_ms = request_timeout_ms
        self.expires_at = expires_at
        self.session = FetchSession(version >= SESSION_VERSION)
        self._sock = sock
        self._on_close = on_close
        self._correlation_id = 0
        self._buffer = PaddedBuffer(_INITIAL_BUFFER)
        # (correlation id, ms to wait for the response, what it asks for, full request)
        self._pending: tuple[int, int, Mapping[TopicPartition, FetchPartitionRequest], bool] \
            | None = None
        self.closed = False

    # --- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, net, manager, settings: Mapping[str, object], node_id, host: str, port: int,
             *, timeout_ms: int) -> "FetchConnection":
        """Connect to ``host:port`` (broker ``node_id``) with kafka-python's connection setup and
        take over its socket. ``net`` is a kafka-python network client bootstrapping from
        ``host:port`` only, ``manager`` its connection manager (which diagnoses TLS and SASL
        failures), ``settings`` the BrokerClient's kafka-python settings
        (:meth:`BrokerClient.open_fetch_connection` makes all three)."""
        try:
            boot = net.cluster.bootstrap_brokers()[0].node_id
            net.maybe_connect(boot)
            conn = net._manager._conns.get(boot)
            if conn is not None and not conn.init_future.is_done:
                net._net.poll(timeout_ms=timeout_ms, future=conn.init_future)
            if conn is None or not conn.connected:
                error = conn.init_future.exception if conn is not None and \
                    conn.init_future.failed() else None
                raise _connect_error(node_id, host, port, error, timeout_ms,
                                     manager.auth_failure(boot))
            conn.transport.pause_reading()
            sock = conn.transport._sock
            fetch_version = conn.broker_version_data.api_version(
                FetchRequest, max_version=MAX_FETCH_VERSION)
            lifetime_ms = getattr(getattr(conn, "_reauth", None), "session_lifetime_ms", 0) or 0
        except AttributeError as exc:
            # The few private parts of kafka-python 3's network layer used above moved.
            net.close()
            raise KafkaSourceError(
                f"This kafka-python version ({_kafka_python_version()}) is not supported by "
                f"pykafka's fetch connections ({exc}); install the kafka-python 3.0 release "
                "pykafka was tested with.") from exc
        except BaseException:
            net.close()
            raise
        if fetch_version < MIN_FETCH_VERSION:
            net.close()
            raise BrokerUnavailableError(
                f"Broker {node_id} at {host}:{port} supports Fetch only up to v{fetch_version}; "
                f"pykafka needs v{MIN_FETCH_VERSION} or later (Kafka 0.11+, 2.2+ supported).")
        expires_at = time.monotonic() + _REAUTH_FRACTION * lifetime_ms / 1000 if lifetime_ms \
            else float("inf")
        log.debug("fetch connection to broker %s at %s:%d: Fetch v%d", node_id, host, port,
                  fetch_version)
        return cls(sock, node_id=node_id, version=fetch_version,
                   client_id=str(settings.get("client_id", "pykafka")),
                   max_frame_bytes=int(settings.get("receive_message_max_bytes", 100_000_000)),
                   request_timeout_ms=int(settings.get("request_timeout_ms", 30_000)),
                   expires_at=expires_at, on_close=net.close)

    # --- requests ---------------------------------------------------------------------------

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    @property
    def expired(self) -> bool:
        """Whether the SASL session this connection authenticated is about to expire."""
        return time.monotonic() >= self.expires_at

    def send(self, wanted: Mapping[TopicPartition, FetchPartitionRequest], *, max_wait_ms: int,
             min_bytes: int, max_bytes: int, read_committed: bool) -> None:
        """Send one Fetch request that makes the broker fetch exactly ``wanted`` (through the
        fetch session: only what changed is listed)."""
        if self._pending is not None:
            raise RuntimeError(f"broker {self.node_id}: a Fetch request is already in flight")
        if self.closed:
            raise _retriable(self.node_id, "connection closed")
        request = self.session.build(wanted)
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        data = encode_fetch_request(
            version=self.version, correlation_id=self._correlation_id,
            client_id=self.client_id, partitions=request.partitions,
            forgotten=request.forgotten, session_id=request.session_id,
            session_epoch=request.epoch, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
            max_bytes=max_bytes, read_committed=read_committed)
        wait_ms = self.request_timeout_ms + max_wait_ms
        self._pending = (self._correlation_id, wait_ms, request.wanted, request.full)
        try:
            self._sock.settimeout(self.request_timeout_ms / 1000)
            self._sock.sendall(data)
        except (OSError, ValueError) as exc:
            self.close()
            raise _retriable(self.node_id, f"sending Fetch failed: {exc}") from exc

    def receive(self) -> FetchResult:
        """The response to the request in flight. Its ``requested`` holds what that request
        asked for; partition records are views into this connection's buffer, valid until the
        next :meth:`receive`."""
        if self._pending is None:
            raise RuntimeError(f"broker {self.node_id}: no Fetch request in flight")
        correlation_id, wait_ms, requested, full = self._pending
        # Bounded from now, not from the send: the loop may have decoded and yielded a lot
        # since (the response then waits in the socket buffers).
        deadline = time.monotonic() + wait_ms / 1000
        try:
            frame = self._read_frame(deadline)
            hsize = response_header_size(self.version, frame)
            (got,) = _SIZE.unpack_from(frame, 0)
            if got != correlation_id:
                raise _retriable(self.node_id, f"response to request {got}, expected "
                                               f"{correlation_id}")
            result = parse_fetch_response(frame[hsize:], self.version)
        except BaseException:
            self.close()
            raise
        self._pending = None
        self.session.done(result.error_code, result.session_id)
        result.requested = requested
        result.full = full
        return result

    def _read_frame(self, deadline: float) -> memoryview:
        """Receive one size-prefixed frame into the buffer; returns a view of the frame (after
        the size), followed in the buffer by :data:`RECORDS_PADDING`."""
        buf = self._buffer
        view = memoryview(buf)
        got = self._recv_into(view, 0, 4, len(buf), deadline)
        (size,) = _SIZE.unpack_from(buf, 0)
        if size < 4 or size > self.max_frame_bytes:
            raise _retriable(self.node_id, f"invalid response frame size {size}")
        end = 4 + size
        need = end + len(RECORDS_PADDING)
        if need > len(buf):
            grown = PaddedBuffer(max(need, 2 * len(buf)))
            grown[:got] = view[:got]
            self._buffer = buf = grown
            view = memoryview(buf)
        if got > end:
            raise _retriable(self.node_id, "more bytes than one response arrived")
        if got < end:
            self._recv_into(view, got, end, end, deadline)
        view[end:need] = RECORDS_PADDING
        return view[4:end]

    def _recv_into(self, view: memoryview, start: int, at_least: int, at_most: int,
                   deadline: float) -> int:
        """recv_into ``view[start:at_most]`` until at least ``at_least`` bytes are there."""
        sock = self._sock
        pos = start
        try:
            while pos < at_least:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                n = sock.recv_into(view[pos:at_most], at_most - pos)
                if n == 0:
                    raise _retriable(self.node_id, "connection closed by the broker")
                pos += n
        except (socket.timeout, TimeoutError) as exc:
            raise _retriable(self.node_id, "no complete Fetch response within "
                                           f"{self.request_timeout_ms} ms + fetch wait") from exc
        except ssl.SSLError as exc:
            raise _retriable(self.node_id, f"TLS error while reading: {exc}") from exc
        except OSError as exc:
            raise _retriable(self.node_id, f"reading failed: {exc}") from exc
        return pos

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._pending is not None:
            self._pending = None
            self.session.abandon()
        try:
            if self._on_close is not None:
                self._on_close()       # kafka-python closes the transport and its socket
            else:
                self._sock.close()
        except Exception:  # noqa: BLE001 - closing must never mask the real outcome
            log.debug("error closing fetch connection to broker %s", self.node_id, exc_info=True)


def _kafka_python_version() -> str:
    from kafka.version import __version__   # noqa: PLC0415

    return __version__


def _retriable(node_id, message: str):
    from .client import RetriableBrokerError   # noqa: PLC0415 - client imports this module

    return RetriableBrokerError(f"broker {node_id}: {message}")


def _connect_error(node_id, host, port, error, timeout_ms, security_error=None):
    """The exception for a fetch connection that could not be set up. ``security_error`` is
    what the connection manager diagnosed as a TLS or SASL failure no retry can fix."""
    if security_error is not None:
        return BrokerSecurityError(str(security_error))
    if isinstance(error, BrokerSecurityError):
        return BrokerSecurityError(str(error))
    where = f"broker {node_id} at {host}:{port}"
    if isinstance(error, (Errors.SaslAuthenticationFailedError, Errors.AuthorizationError,
                          Errors.UnsupportedSaslMechanismError, Errors.IllegalSaslStateError)):
        return BrokerSecurityError(f"Could not authenticate to {where}: {error} (check "
                                      "'kafka.sasl.mechanism' and 'kafka.sasl.jaas.config').")
    cause, seen = error, 0
    while cause is not None and seen < 10:
        if isinstance(cause, ssl.SSLCertVerificationError) or \
                "CERTIFICATE_VERIFY_FAILED" in str(cause):
            return BrokerSecurityError(
                f"TLS certificate verification failed for {where}: {cause} (check "
                "'kafka.ssl.cafile').")
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    if error is None:
        return _retriable(node_id, f"could not connect to {host}:{port} within {timeout_ms} ms")
    return _retriable(node_id, f"could not connect to {host}:{port}: {error}")


class FetchConnections:
    """The fetch connections of one executor process, one per broker, reused across tasks.

    ``opener(node_id)`` opens a connection (:meth:`BrokerClient.open_fetch_connection`)."""

    def __init__(self, opener: Callable[[object], FetchConnection]):
        self._opener = opener
        self._conns: dict[object, FetchConnection] = {}
        # Bytes per offset and per batch last seen for each partition: sizes the last request
        # of a range so that it does not ask for much more than the range needs.
        self.size_hints: dict[TopicPartition, tuple[float, float]] = {}

    def get(self, node_id) -> FetchConnection:
        conn = self._conns.get(node_id)
        if conn is not None and (conn.closed or (conn.expired and not conn.in_flight)):
            self.discard(node_id)
            conn = None
        if conn is None:
            conn = self._opener(node_id)
            self._conns[node_id] = conn
        return conn

    def discard(self, node_id) -> None:
        conn = self._conns.pop(node_id, None)
        if conn is not None:
            conn.close()

    def discard_in_flight(self) -> None:
        """Close connections whose response will not be read (a task ended early)."""
        for node_id, conn in list(self._conns.items()):
            if conn.in_flight or conn.closed:
                self.discard(node_id)

    def close(self) -> None:
        for node_id in list(self._conns):
            self.discard(node_id)
