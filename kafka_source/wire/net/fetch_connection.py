"""Executor side: a dedicated connection per broker for the Fetch hot loop.

Why not send Fetch through kafka-python's network layer like every other request? Its reader
takes 4 KB per ``recv`` call, joins the pieces, copies them into a frame buffer and then copies
each partition's records out of it again while decoding the response: for a 1 GB partition that
is ~250,000 system calls and several copies of every byte, all under the GIL. Here a response is
read with a few large ``recv_into`` calls straight into one preallocated buffer sized from the
frame header (the GIL is released while the kernel copies), parsed in place
(:mod:`kafka_source.wire.net.fetch_protocol`) and decoded in place
(:func:`kafka_source.wire.format.fast_decode.decode_to_arrow` reads a
:class:`~kafka_source.wire.format.fast_decode.PaddedBuffer`), so the value bytes are copied once, into
the Arrow column.

Connection setup is kafka-python's: :meth:`FetchConnection.open` has a private kafka-python
client (its own selector, never polled again afterwards) connect to the broker, which does the
TCP connect, TLS handshake, ApiVersions and SASL authentication with exactly the settings of
the :class:`~kafka_source.wire.net.client.BrokerClient` it is opened for. Once that connection is
ready, its reading is paused and its socket (an ``ssl.SSLSocket`` for TLS) is used directly with
blocking, deadline-bounded calls. Nothing else uses the socket afterwards: the private client's
selector is never polled again, so none of its timers (idle check, SASL re-authentication) can
fire on it. Re-authentication (KIP-368) is replaced by reconnecting: a connection whose SASL
session would expire is not used for another request (:attr:`FetchConnection.expired`) and the
pool opens a new, freshly authenticated one.

One request is in flight per connection at a time, and the fetch loop sends the next request as
soon as a response is received, before decoding it: the broker prepares the next response while
this one is decoded. Each connection carries its fetch session (:mod:`kafka_source.wire.net.fetch_session`).
Every wait is bounded: connecting by ``kafka.request.timeout.ms``, each response by
``kafka.request.timeout.ms`` + ``kafka.fetch.max.wait.ms``. A connection that fails or times
out is closed and reported as :class:`~kafka_source.wire.net.client.RetriableBrokerError`.

How large a response may be follows what its request asked for: twice the largest byte limit in
it (``max_bytes``, or a partition limit the fetcher grew for a batch that did not fit) plus
headroom, and at least the connection's receive limit (``kafka.receive.message.max.bytes``,
:func:`~kafka_source.config.client_config.receive_message_max_bytes`). Twice, because Kafka returns
the first record batch of a response whole even when it exceeds every limit (KIP-74). A frame
size beyond that is garbage (a TLS alert read by a plaintext client announces ~350 MB): retriable,
as above -- unless the frame goes on with the request's correlation id. Then it is a genuine
response whose record batch is larger than allowed, which no retry can fetch: the read fails at
once with :class:`FetchResponseTooLargeError`, naming the partition (from the partition headers at
the start of the response), the size and the options that raise the limit.

The receive buffer grows to the largest response and shrinks again after a run of much smaller
ones (:meth:`FetchConnection._fit`): a Python worker keeps its connections for many tasks, and one
huge record batch must not pin hundreds of MB in it for all of them. A new buffer replaces the
old one rather than resizing it: the previous response's views still point into the old one
when the next response is read (the fetch loop has decoded it by then, but its last
``FetchResult`` lives until the next replaces it); it is freed when they go.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import kafka.errors as Errors
from kafka.protocol.consumer import FetchRequest

from ...config.client_config import (DEFAULT_RECEIVE_MESSAGE_MAX_BYTES, fetch_response_limit,
                                    fetch_size_for_response)
from ...errors import (BrokerSecurityError, BrokerUnavailableError, KafkaSourceError,
                       RetriableBrokerError)
from ..format.fast_decode import RECORDS_PADDING, PaddedBuffer
from .fetch_protocol import (MAX_FETCH_VERSION, MIN_FETCH_VERSION, SESSION_VERSION,
                             FetchPartitionRequest, FetchResult, TopicPartition,
                             encode_fetch_request, parse_fetch_response, records_sizes,
                             response_header_size)
from .fetch_session import FetchSession
from .reauth import reauthenticate_at

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_INITIAL_BUFFER = 1 << 20
_SHRINK_AFTER = 8            # responses in a row that needed at most ...
_SHRINK_SHARE = 4            # ... a quarter of the buffer: it is replaced by a smaller one
_PEEK_BYTES = 64 << 10       # read of a too large response to name its partition


class FetchResponseTooLargeError(KafkaSourceError):
    """A genuine Fetch response (its correlation id is right) larger than the connection
    accepts for the request: a record batch above every limit. Retrying cannot help."""


@dataclass(frozen=True)
class _Pending:
    """The request in flight."""

    correlation_id: int
    wait_ms: int                 # how long to wait for the response
    requested: Mapping[TopicPartition, FetchPartitionRequest]
    full: bool                   # a full (not incremental) fetch-session request
    frame_limit: int             # the largest response accepted to it


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
        self._small_run = 0      # responses in a row that needed at most a quarter of the buffer
        self._small_need = 0     # the most one of them needed
        self._pending: _Pending | None = None
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
            # replaced before its SASL session ends, by the clock that is never late
            expires_at = reauthenticate_at(conn)
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
        log.debug("fetch connection to broker %s at %s:%d: Fetch v%d", node_id, host, port,
                  fetch_version)
        return cls(sock, node_id=node_id, version=fetch_version,
                   client_id=str(settings.get("client_id", "pykafka")),
                   max_frame_bytes=int(settings.get("receive_message_max_bytes",
                                                    DEFAULT_RECEIVE_MESSAGE_MAX_BYTES)),
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
        # What this request lets the broker send decides how large a response is believed:
        # its max_bytes and every partition limit the session holds (the fetcher grows the
        # limit of a partition whose batch did not fit), each of which a first record batch
        # may exceed (KIP-74), so twice that and headroom; max_frame_bytes at least.
        asked = max([max_bytes] + [p.max_bytes for p in request.wanted.values()])
        self._pending = _Pending(self._correlation_id, wait_ms, request.wanted, request.full,
                                 fetch_response_limit(asked, self.max_frame_bytes))
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
        pending = self._pending
        if pending is None:
            raise RuntimeError(f"broker {self.node_id}: no Fetch request in flight")
        # Bounded from now, not from the send: the loop may have decoded and yielded a lot
        # since (the response then waits in the socket buffers).
        deadline = time.monotonic() + pending.wait_ms / 1000
        try:
            frame = self._read_frame(deadline, pending)
            hsize = response_header_size(self.version, frame)
            (got,) = _SIZE.unpack_from(frame, 0)
            if got != pending.correlation_id:
                raise _retriable(self.node_id, f"response to request {got}, expected "
                                               f"{pending.correlation_id}")
            result = parse_fetch_response(frame[hsize:], self.version)
        except BaseException:
            self.close()
            raise
        self._pending = None
        self.session.done(result.error_code, result.session_id)
        result.requested = pending.requested
        result.full = pending.full
        return result

    def _read_frame(self, deadline: float, pending: _Pending) -> memoryview:
        """Receive one size-prefixed frame into the buffer; returns a view of the frame (after
        the size), followed in the buffer by :data:`RECORDS_PADDING`."""
        buf = self._buffer
        view = memoryview(buf)
        got = self._recv_into(view, 0, 4, len(buf), deadline)
        (size,) = _SIZE.unpack_from(buf, 0)
        if size < 4 or size > pending.frame_limit:
            raise self._bad_size(size, view, got, deadline, pending)
        end = 4 + size
        if got > end:
            raise _retriable(self.node_id, "more bytes than one response arrived")
        need = end + len(RECORDS_PADDING)
        fitted = self._fit(need)
        if fitted is not None:
            # A new buffer rather than a resized one: the views of the previous response (its
            # FetchResult, decoded by now but referenced until the fetch loop lets go of it)
            # still point into the old one, and a bytearray with views cannot be resized. They
            # keep it alive until then; the connection never writes to it again.
            fitted[:got] = view[:got]
            self._buffer = buf = fitted
            view = memoryview(buf)
        if got < end:
            self._recv_into(view, got, end, end, deadline)
        view[end:need] = RECORDS_PADDING
        return view[4:end]

    def _fit(self, need: int) -> PaddedBuffer | None:
        """A new buffer for a response that needs ``need`` bytes, or None to keep the current
        one. It grows to fit (at least doubling); after :data:`_SHRINK_AFTER` responses in a
        row that needed at most a 1/:data:`_SHRINK_SHARE` of it, it shrinks to twice the most
        they needed, so one huge record batch does not pin its buffer for as long as the
        executor's Python worker keeps this connection."""
        size = len(self._buffer)
        if need > size:
            self._small_run = self._small_need = 0
            return PaddedBuffer(max(need, 2 * size))
        if need * _SHRINK_SHARE > size:
            self._small_run = self._small_need = 0
            return None
        self._small_run += 1
        self._small_need = max(self._small_need, need)
        smaller = max(_INITIAL_BUFFER, 2 * self._small_need)
        if self._small_run < _SHRINK_AFTER or smaller >= size:
            return None
        self._small_run = self._small_need = 0
        log.debug("fetch connection to broker %s: receive buffer shrinks from %d to %d bytes",
                  self.node_id, size, smaller)
        return PaddedBuffer(smaller)

    def _bad_size(self, size: int, view: memoryview, got: int, deadline: float,
                  pending: _Pending) -> Exception:
        """The error for a frame size below 4 or above the request's limit. A real response
        (whose correlation id, next in the frame, is the request's) is too large: that fails
        the read at once, naming the partition and the options that raise the limits. Anything
        else is garbage read as a size (a TLS listener's alert read by a plaintext client, a
        stream out of step): the connection is not trusted, and that is retriable."""
        garbage = _retriable(self.node_id, f"invalid response frame size {size}")
        if size < 4:
            return garbage
        try:
            # The broker sends a genuine response at once: its start holds the header and the
            # partition headers up to the one with the oversized batch (partitions before it
            # in the response are empty: only the first batch of a response may be oversized).
            got = self._recv_into(view, got, min(4 + size, 4 + _PEEK_BYTES), len(view),
                                  deadline)
        except Exception as exc:  # noqa: BLE001 - _recv_into's retriable errors: not a response
            garbage.__cause__ = exc
            return garbage
        got = min(got, 4 + size)
        (correlation_id,) = _SIZE.unpack_from(view, 4)
        if correlation_id != pending.correlation_id:
            return garbage
        body = view[4:got]
        try:
            sizes = records_sizes(body[response_header_size(self.version, body):], self.version)
        except (IndexError, ValueError):      # the header's tagged fields are cut off
            sizes = {}
        return FetchResponseTooLargeError(_too_large_message(
            self.node_id, size, pending.frame_limit, pending.requested, sizes))

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


def _too_large_message(node_id, size: int, limit: int,
                       requested: Mapping[TopicPartition, FetchPartitionRequest],
                       sizes: Mapping[TopicPartition, int]) -> str:
    over = [(tp, n) for tp, n in sizes.items()
            if tp in requested and n > requested[tp].max_bytes]
    if over:
        where = "; ".join(f"{t}-{p} at offset {requested[(t, p)].offset}: {n:,} bytes of records"
                          for (t, p), n in over)
    else:
        listed = [f"{t}-{p} at offset {r.offset}" for (t, p), r in list(requested.items())[:5]]
        more = len(requested) - len(listed)
        where = ("one of " if len(requested) > 1 else "") + ", ".join(listed) + \
            (f" and {more} more" if more > 0 else "")
    return (f"The Fetch response from broker {node_id} is {size:,} bytes, more than the "
            f"{limit:,} accepted for it ({where}): a record batch larger than the fetch sizes, "
            "which Kafka sends whole. To read it, set the option "
            f"'kafka.receive.message.max.bytes' to at least {size} (the topic's "
            "max.message.bytes bounds its batches), or 'kafka.fetch.max.bytes' or "
            f"'kafka.max.partition.fetch.bytes' to at least {fetch_size_for_response(size)} "
            "(which lets every Fetch ask for that much).")


def _kafka_python_version() -> str:
    from kafka.version import __version__   # noqa: PLC0415

    return __version__


def _retriable(node_id, message: str):
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
