"""A fault-injecting TCP proxy between Kafka clients and one broker listener, for tests.

Faults that matter to a connector happen *between* requests and responses: a connection reset
after the broker applied an OffsetCommit but before the client heard so, a Fetch response cut off
half way, a JoinGroup answer that never arrives, a broker that is gone for a while. A real broker
cannot be told to do these at a chosen moment; a proxy that understands Kafka's framing can.

Every Kafka request is a 4-byte big-endian size, then a header that starts with ``api_key``
(int16), ``api_version`` (int16) and ``correlation_id`` (int32); every response is a size, then
the ``correlation_id`` of its request. So the proxy reads whole frames in both directions, knows
which API each response answers, and applies :class:`Fault` rules to chosen requests:

``reset``         forward the request, then cut the connection in the middle of the response
                  (part of its bytes, then a TCP reset): the broker acted, the client never
                  learns how it went
``reset_request`` cut the connection instead of forwarding the request (the broker never sees it)
``stall``         hold the response back for ``seconds``, then deliver it (late, or to a client
                  that gave up and closed the connection meanwhile)
``drop``          never deliver the response; the connection stays open
``answer``        answer with ``answer(request_frame)`` (a complete response frame) instead of
                  the broker, e.g. :func:`restarting_broker_metadata`
``observe``       change nothing, only count (and remember who sent) the matching requests

:meth:`FaultProxy.outage` makes the broker look gone: open connections are reset and new ones
are reset as soon as they are accepted, for a number of seconds.

For clients to stay behind the proxy, the broker must advertise the proxy's address: start
:class:`~kafka_source.testing.brokers.LocalKafkaBroker` with a listener whose advertised port is
the proxy's (``advertised_ports``) and point the proxy at that listener's real port.

Loopback only and bounded in time: the proxy listens on and connects to 127.0.0.1 / ::1 only;
every socket operation has a timeout; a stall or an outage lasts at most ``max_fault_s``; the
proxy closes itself after ``max_lifetime_s``; :meth:`FaultProxy.close` joins its threads with a
bound. Counters (:attr:`FaultProxy.requests`, :meth:`FaultProxy.injected`) say what happened, so
tests can assert on behaviour ("Metadata was asked once") instead of on timing.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from kafka.protocol.api_key import ApiKey

__all__ = ["Fault", "FaultProxy", "restarting_broker_metadata", "pid_of_client", "ApiKey"]

log = logging.getLogger(__name__)

ACTIONS = ("reset", "reset_request", "stall", "drop", "answer", "observe")
_LOOPBACK = ("127.0.0.1", "::1", "localhost")
_POLL_S = 0.2              # how often blocked threads look at the closed flag
_MAX_FRAME = 512 << 20     # larger frames are not Kafka: give up on the connection


@dataclass
class Fault:
    """A rule: what to do to requests of ``api_key`` (an :class:`ApiKey` or int).

    ``skip`` matching requests pass untouched first, then the next ``times`` are hit (requests
    an earlier armed fault took are not counted: arm a reset then a stall for the same API, and
    the stall hits the request after the reset's).
    ``match(request_frame) -> bool`` narrows the requests further (e.g. to a topic name in the
    frame). After the fault fired, :attr:`fired` is set and :attr:`peers` holds the client
    address ``(host, port)`` of the (last 100) connections it hit -- the socket of the process
    mid-request. A request triggers at most one fault, the first armed one that matches;
    observers (:meth:`observer`) count every request they match besides.
    """

    api_key: int
    action: str
    times: int = 1
    skip: int = 0
    seconds: float = 0.0
    match: Callable[[bytes], bool] | None = None
    answer: Callable[[bytes], bytes] | None = None
    injected: int = 0
    seen: int = 0
    peers: list = field(default_factory=list)
    fired: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}; one of {ACTIONS}")
        if self.action == "answer" and self.answer is None:
            raise ValueError("an 'answer' fault needs answer=callable(request_frame) -> frame")
        self.api_key = int(self.api_key)

    @classmethod
    def observer(cls, api_key: int, match: Callable[[bytes], bool] | None = None) -> "Fault":
        """A rule that only counts matching requests (:attr:`injected`), however many."""
        return cls(api_key, "observe", times=1 << 62, match=match)

    @property
    def kind(self) -> str:
        return f"{_api_name(self.api_key)}:{self.action}"

    @property
    def done(self) -> bool:
        return self.injected >= self.times


def _api_name(key: int) -> str:
    try:
        return ApiKey(key).name
    except ValueError:
        return f"api{key}"


def _recv_exactly(sock: socket.socket, n: int, closed: threading.Event) -> bytes | None:
    """``n`` bytes from ``sock`` (None at EOF, error or proxy close)."""
    chunks, got = [], 0
    while got < n:
        if closed.is_set():
            return None
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except socket.timeout:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_frame(sock: socket.socket, closed: threading.Event) -> bytes | None:
    """One Kafka frame, size prefix included (None at EOF, error or a size no frame has)."""
    head = _recv_exactly(sock, 4, closed)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    if size < 0 or size > _MAX_FRAME:
        return None
    body = _recv_exactly(sock, size, closed)
    return None if body is None else head + body


def _reset(sock: socket.socket | None) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed or restarted peer would."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Connection:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, proxy: "FaultProxy", client: socket.socket, peer):
        self.proxy = proxy
        self.client = client
        self.peer = peer[:2]
        self.upstream: socket.socket | None = None
        self.closed = threading.Event()
        self.pending: dict[int, tuple[int, Fault | None]] = {}   # correlation id -> (api, fault)
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        try:
            self.upstream = socket.create_connection(self.proxy.upstream,
                                                     timeout=self.proxy.connect_timeout_s)
            self.upstream.settimeout(_POLL_S)
            self.client.settimeout(_POLL_S)
        except OSError as exc:
            log.info("proxy: upstream %s unreachable (%s); resetting client %s",
                     self.proxy.upstream, exc, self.peer)
            self.abort()
            return
        for name, target in (("requests", self._requests), ("responses", self._responses)):
            t = threading.Thread(target=target, name=f"fault-proxy-{name}-{self.peer[1]}",
                                 daemon=True)
            self.threads.append(t)
            t.start()

    def abort(self) -> None:
        """Reset both sides."""
        if not self.closed.is_set():
            self.closed.set()
            _reset(self.client)
            _reset(self.upstream)
            self.proxy._forget(self)

    def _send_client(self, data: bytes) -> bool:
        with self.send_lock:
            try:
                self.client.sendall(data)
                return True
            except OSError:
                return False

    # client -> broker
    def _requests(self) -> None:
        while not self.closed.is_set():
            frame = _read_frame(self.client, self.closed)
            if frame is None or len(frame) < 12:
                break
            api_key, _version, correlation_id = struct.unpack(">hhi", frame[4:12])
            fault = self.proxy._match(api_key, frame, self.peer)
            self.proxy._count_request(api_key)
            if fault is not None and fault.action == "reset_request":
                self.abort()
                return
            if fault is not None and fault.action == "answer":
                try:
                    answer = fault.answer(frame)
                except Exception:  # a broken answer must not leave the client hanging
                    log.exception("proxy: %s could not build its answer", fault.kind)
                    break
                if not self._send_client(answer):
                    break
                continue
            with self.lock:
                self.pending[correlation_id] = (api_key, fault)
            try:
                self.upstream.sendall(frame)
            except OSError:
                break
        self.abort()

    # broker -> client
    def _responses(self) -> None:
        while not self.closed.is_set():
            frame = _read_frame(self.upstream, self.closed)
            if frame is None or len(frame) < 8:
                break
            (correlation_id,) = struct.unpack(">i", frame[4:8])
            with self.lock:
                _api, fault = self.pending.pop(correlation_id, (None, None))
            if fault is None or fault.action == "observe":
                if not self._send_client(frame):
                    break
            elif fault.action == "reset":
                # Part of the response (never less than its size prefix), then a reset.
                self._send_client(frame[: max(4, len(frame) // 2)])
                break
            elif fault.action == "stall":
                # Ends early when the connection is reset (an outage) or the proxy closes.
                if self.closed.wait(min(fault.seconds, self.proxy.max_fault_s)):
                    break
                if not self._send_client(frame):
                    break
            elif fault.action == "drop":
                continue
        self.abort()


class FaultProxy:
    """A TCP proxy on loopback in front of one broker listener; see the module docstring.

    The listening socket is bound in the constructor, so :attr:`port` is known before the broker
    starts (it must advertise it); :meth:`start` needs the upstream address.
    """

    def __init__(self, upstream: str | tuple[str, int] | None = None, *, port: int = 0,
                 max_fault_s: float = 120.0, max_lifetime_s: float = 1800.0,
                 connect_timeout_s: float = 5.0):
        self.max_fault_s = max_fault_s
        self.max_lifetime_s = max_lifetime_s
        self.connect_timeout_s = connect_timeout_s
        self.upstream: tuple[str, int] | None = None
        if upstream is not None:
            self.set_upstream(upstream)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(128)
        self._listener.settimeout(_POLL_S)
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._faults: list[Fault] = []
        self._history: list[Fault] = []      # cleared faults, still counted by injected()
        self._refuse_until = 0.0
        self._thread: threading.Thread | None = None
        self._started_at = 0.0
        #: requests seen per API name; connections accepted; connections refused (outage)
        self.requests: Counter = Counter()
        self.connections_accepted = 0
        self.connections_refused = 0
        self._outages: list[float] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_upstream(self, upstream: str | tuple[str, int]) -> None:
        if isinstance(upstream, str):
            host, _, port = upstream.rpartition(":")
            upstream = (host, int(port))
        host = upstream[0].strip("[]")
        if host not in _LOOPBACK:
            raise ValueError(f"the fault proxy only forwards to loopback, not {host!r}")
        self.upstream = (host, int(upstream[1]))

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> "FaultProxy":
        if self.upstream is None:
            raise ValueError("set the upstream broker address first (set_upstream)")
        if self._thread is None:
            self._started_at = time.monotonic()
            self._thread = threading.Thread(target=self._accept_loop, name="fault-proxy-accept",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        self._closed.set()
        for conn in self._snapshot():
            conn.abort()
        try:
            self._listener.close()
        except OSError:
            pass
        deadline = time.monotonic() + timeout_s
        threads = [self._thread] if self._thread else []
        for conn in self._snapshot():
            threads.extend(conn.threads)
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- faults -----------------------------------------------------------------------------

    def add(self, fault: Fault) -> Fault:
        """Arm ``fault`` (faults are tried in the order they were added; one per request)."""
        with self._lock:
            self._faults.append(fault)
        return fault

    def inject(self, api_key: int, action: str, **kwargs) -> Fault:
        return self.add(Fault(api_key, action, **kwargs))

    def clear(self) -> None:
        """Disarm every fault (their counters stay readable on the Fault objects)."""
        with self._lock:
            self._history.extend(self._faults)
            self._faults = []

    def outage(self, seconds: float) -> None:
        """The broker is gone for ``seconds``: reset every connection now and every new one
        until then (clients see resets, as from a crashed host or a dead broker)."""
        seconds = min(seconds, self.max_fault_s)
        with self._lock:
            self._refuse_until = time.monotonic() + seconds
            self._outages.append(seconds)
        self.reset_connections()

    @property
    def in_outage(self) -> bool:
        """True while :meth:`outage` makes the broker look gone."""
        with self._lock:
            return time.monotonic() < self._refuse_until

    def end_outage(self) -> None:
        with self._lock:
            self._refuse_until = 0.0

    def reset_connections(self) -> int:
        """Reset every open connection now; returns how many there were."""
        conns = self._snapshot()
        for conn in conns:
            conn.abort()
        return len(conns)

    def injected(self) -> dict[str, int]:
        """Faults that fired, by ``"Api:action"``, plus ``"outage"`` (outages started) and
        ``"refused"`` (connections reset during outages)."""
        with self._lock:
            faults = self._faults + self._history
            result: Counter = Counter()
            for f in faults:
                if f.injected and f.action != "observe":
                    result[f.kind] += f.injected
            if self._outages:
                result["outage"] = len(self._outages)
            if self.connections_refused:
                result["refused"] = self.connections_refused
        return dict(result)

    # --- internals --------------------------------------------------------------------------

    def _snapshot(self) -> list[_Connection]:
        with self._lock:
            return list(self._connections)

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _count_request(self, api_key: int) -> None:
        with self._lock:
            self.requests[_api_name(api_key)] += 1

    def _match(self, api_key: int, frame: bytes, peer) -> Fault | None:
        """The first armed fault this request triggers (observers count it and look on)."""
        hit = None
        with self._lock:
            for fault in self._faults:
                if fault.api_key != api_key or fault.done:
                    continue
                if fault.action != "observe" and hit is not None:
                    continue
                if fault.match is not None and not fault.match(frame):
                    continue
                fault.seen += 1
                if fault.seen <= fault.skip:
                    continue
                fault.injected += 1
                fault.peers = fault.peers[-99:] + [peer]
                fault.fired.set()
                if fault.action != "observe":
                    log.info("proxy: %s on a request from %s (%d of %d)", fault.kind, peer,
                             fault.injected, fault.times)
                    hit = fault
        return hit

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            if time.monotonic() - self._started_at > self.max_lifetime_s:
                log.warning("proxy: closing after its maximum lifetime of %.0f s",
                            self.max_lifetime_s)
                threading.Thread(target=self.close, daemon=True).start()
                return
            try:
                client, peer = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                refusing = time.monotonic() < self._refuse_until
                if refusing:
                    self.connections_refused += 1
                else:
                    self.connections_accepted += 1
            if refusing:
                _reset(client)
                continue
            conn = _Connection(self, client, peer)
            with self._lock:
                self._connections.add(conn)
            conn.start()


def restarting_broker_metadata(request_frame: bytes) -> bytes:
    """The Metadata answer of a broker that has not learnt the cluster's state yet.

    A ZooKeeper-mode broker (Kafka 2.x and 3.x) opens its listeners before the controller has
    sent it the cluster's metadata: until then it answers Metadata with no brokers, no controller
    (-1) and UNKNOWN_TOPIC_OR_PARTITION for every named topic (KAFKA-15161). A KRaft broker in a
    controlled shutdown answers with no brokers and no controller too (measured on Kafka 4.0).
    The answer has the request's version and correlation id.
    """
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    api_key, version, correlation_id = struct.unpack(">hhi", request_frame[4:12])
    if api_key != ApiKey.Metadata:
        raise ValueError(f"not a Metadata request (api key {api_key})")
    request = MetadataRequest.decode(request_frame[4:], version=version, header=True)
    T = MetadataResponse.MetadataResponseTopic
    topics = [T(error_code=3, name=t.name, is_internal=False, partitions=[])
              for t in (request.topics or [])]
    response = MetadataResponse(version=version, throttle_time_ms=0, brokers=[],
                                cluster_id=None, controller_id=-1, topics=topics)
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


def broker_without_partitions_metadata(node_id: int, host: str, port: int):
    """An ``answer`` for Metadata requests: what a ZooKeeper-mode broker answers after it has
    learnt the live brokers from the controller but not yet the partitions (measured on Kafka
    2.2 for about a second after a restart): brokers listed (here one, ``node_id`` at
    ``host:port``, e.g. the proxy's address), UNKNOWN_TOPIC_OR_PARTITION for every named topic
    and no topic at all when every topic is asked for. The answer has the request's version
    and correlation id; use :func:`is_metadata_of` to match the requests it is for."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    def answer(request_frame: bytes) -> bytes:
        api_key, version, correlation_id = struct.unpack(">hhi", request_frame[4:12])
        if api_key != ApiKey.Metadata:
            raise ValueError(f"not a Metadata request (api key {api_key})")
        request = MetadataRequest.decode(request_frame[4:], version=version, header=True)
        R = MetadataResponse
        topics = [R.MetadataResponseTopic(error_code=3, name=t.name, is_internal=False,
                                          partitions=[])
                  for t in (request.topics or [])]
        response = R(version=version, throttle_time_ms=0, cluster_id=None,
                     controller_id=node_id, topics=topics,
                     brokers=[R.MetadataResponseBroker(node_id=node_id, host=host, port=port,
                                                       rack=None)])
        response.with_header(correlation_id=correlation_id)
        return bytes(response.encode(header=True, framed=True))

    return answer


def is_metadata_of(topic: str, *, or_all_topics: bool = True):
    """A ``match`` for Metadata requests naming ``topic`` (and, with ``or_all_topics``, those
    asking for every topic)."""
    from kafka.protocol.metadata import MetadataRequest

    name = topic.encode()

    def match(request_frame: bytes) -> bool:
        api_key, version = struct.unpack(">hh", request_frame[4:8])
        if api_key != ApiKey.Metadata:
            return False
        if name in request_frame:
            return True
        if not or_all_topics:
            return False
        request = MetadataRequest.decode(request_frame[4:], version=version, header=True)
        return request.topics is None

    return match


def pid_of_client(peer: tuple[str, int], proxy_port: int) -> int | None:
    """The id of the local process that owns the client end ``peer`` of a connection to the
    proxy (Linux: /proc), e.g. the Spark Python worker whose Fetch a fault holds; None if gone.
    """
    inode = None
    wanted = (f"0100007F:{peer[1]:04X}", f"0100007F:{proxy_port:04X}")
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if (fields[1], fields[2]) == wanted:
                    inode = fields[9]
                    break
    except OSError:
        return None
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fd_dir = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    return int(pid)
        except OSError:   # gone meanwhile, or not ours to look at
            continue
    return None
