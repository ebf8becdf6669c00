"""Connections to one Kafka cluster and the requests sent on them: the layer under
:class:`kafka_source.wire.net.client.BrokerClient` (which asks the cluster what planning and
the group need: metadata, leaders, coordinators, offsets).

It wraps kafka-python's network layer (connections, TLS/SASL, API version negotiation): a
bootstrap that fails within a bounded time naming the address, requests that wait for their
answer (:meth:`BrokerTransport.send`, with their own timeout) and pipelined ones for the
producer (:meth:`BrokerTransport.send_async`).

Every connection of a client -- the driver's planning, an executor's fetch connections, the
group member's coordinator and heartbeat connections -- is made here, so this is where the TLS
context is built from the client settings (:mod:`kafka_source.wire.net.tls`), where secrets are
revealed to kafka-python (and nowhere else), and where a TLS or SASL failure that no retry can
fix surfaces at once as :class:`~kafka_source.errors.BrokerSecurityError`
(:mod:`kafka_source.wire.net.handshake`). A broker that cannot be reached, or that the
cluster's metadata no longer names, is :class:`~kafka_source.errors.BrokerUnreachableError`
(retriable).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Mapping

import kafka.errors as Errors
from kafka.net.compat import KafkaNetClient
from kafka.net.selector import NetworkSelector
from kafka.protocol.metadata import CoordinatorType

from ...config.client_config import TLS_SETTINGS, connection_settings, uses_tls
from ...config.secrets import reveal
from ...errors import (BrokerSecurityError, BrokerUnavailableError, BrokerUnreachableError,
                       RetriableBrokerError)
from .handshake import ConnectionManager
from .oauth import token_provider
from .reauth import reauthentication_due, start_reauthentication
from .tls import ssl_context

log = logging.getLogger(__name__)

_RETRIABLE_NETWORK_ERRORS = (Errors.KafkaConnectionError, Errors.NodeNotReadyError,
                             Errors.KafkaTimeoutError, Errors.RequestTimedOutError)
#: UpdateMetadata, which only a ZooKeeper-mode broker lists in its ApiVersions
#: (:func:`zookeeper_mode`).
_UPDATE_METADATA = 6


def zookeeper_mode(api_versions) -> bool:
    """Whether a broker whose ApiVersions answer is ``api_versions`` (api key -> versions)
    runs in ZooKeeper mode (Kafka 2.x, 3.x, and during a migration to KRaft): such a broker
    lists the requests its controller sends it, UpdateMetadata (api key 6) among them; a KRaft
    broker (3.3+, every 4.x) lists only what clients may send, never that one (Kafka's request
    definitions give it the listener ``zkBroker`` alone; 4.0 removed it)."""
    return _UPDATE_METADATA in api_versions


class BrokerTransport:
    """Connections to one Kafka cluster, and requests sent on them. Not thread-safe: use one
    per thread."""

    def __init__(self, config: Mapping[str, object]):
        settings = connection_settings(config)
        tls = {k: settings.pop(k) for k in list(settings) if k in TLS_SETTINGS}
        oauth = settings.pop("sasl_oauthbearer", None)
        settings = {k: reveal(v) for k, v in settings.items()}
        settings["ssl_context"] = ssl_context(tls) if uses_tls(config) else None
        if oauth is not None:
            settings["sasl_oauth_token_provider"] = token_provider(oauth)
        self.bootstrap_servers = str(settings["bootstrap_servers"])
        self.request_timeout_ms = int(settings.get("request_timeout_ms", 30_000))
        self._settings = settings
        self._tls = tls
        self._net, self._connections = self._network(settings)
        self._bootstrapped = False
        self.last_node = None                # the broker the last request went to

    def _network(self, settings: Mapping[str, object]):
        """kafka-python's network client for ``settings`` with our connection manager (TLS
        from the trust/key stores, failures diagnosed: :mod:`kafka_source.wire.net.handshake`)."""
        selector = NetworkSelector(**settings)
        manager = ConnectionManager(selector, tls_settings=self._tls, **settings)
        return KafkaNetClient(net=selector, manager=manager), manager

    # --- lifecycle ------------------------------------------------------------------------

    def bootstrap(self, timeout_ms: int | None = None) -> None:
        if self._bootstrapped:
            return
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        try:
            self._connections.bootstrap(timeout_ms)
        except BrokerSecurityError as exc:
            raise BrokerSecurityError(str(exc)) from None  # a fresh one: no stacked tracebacks
        except Errors.KafkaTimeoutError:
            last = self._connections.last_failure
            raise BrokerUnavailableError(
                f"Could not reach any Kafka broker at '{self.bootstrap_servers}' (option "
                f"'kafka.bootstrap.servers') within {timeout_ms / 1000:.0f} s. Check the "
                "host:port list, that the brokers are up and reachable from this machine, and "
                "'kafka.security.protocol' if they need TLS or SASL."
                + (f" Last error: {last}." if last else "")) from None
        except Errors.KafkaError as exc:
            raise BrokerUnavailableError(
                f"Could not connect to Kafka at '{self.bootstrap_servers}' (option "
                f"'kafka.bootstrap.servers'): {exc}") from exc
        self._bootstrapped = True

    def close(self) -> None:
        try:
            self._net.close()
        except Exception:  # closing must never mask the real outcome
            log.debug("error closing Kafka client", exc_info=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- raw requests ----------------------------------------------------------------------

    def send(self, node_id: int | None, request, timeout_ms: int | None = None):
        """Send ``request`` to ``node_id`` (any broker when None) and wait for the response,
        at most ``timeout_ms`` (default ``kafka.request.timeout.ms``).

        The timeout is the request's own, also on the connection: kafka-python would otherwise
        time every request out after the client-wide request timeout, cutting short a JoinGroup
        that the coordinator rightly holds for up to the rebalance timeout.
        Network failures, and a ``node_id`` that the cluster's metadata no longer lists, are
        raised as :class:`RetriableBrokerError`.
        """
        self.bootstrap()
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        if node_id is None:
            node_id = self._net.least_loaded_node(bootstrap_fallback=True)
        self.last_node = node_id
        # Connecting and the answer each get the whole timeout, as before send_all: a JoinGroup
        # that the coordinator holds for the rebalance timeout is not cut short by a slow
        # reconnect.
        future = self._start(node_id, request, timeout_ms,
                             time.monotonic() + timeout_ms / 1000)
        return self._answer(node_id, future, timeout_ms, time.monotonic() + timeout_ms / 1000)

    def send_all(self, requests, timeout_ms: int | None = None, *,
                 partial: bool = False) -> list:
        """Send each ``(node_id, request)`` of ``requests`` and wait for every response; the
        responses in the order of ``requests``.

        All of them are on the wire before the first answer is waited for, so the brokers work
        on them at the same time: asking each partition's leader (ListOffsets,
        OffsetsForLeaderEpoch) costs one round trip to the slowest of them, not one round trip
        per leader, which on a cluster of N brokers was N round trips per trigger. The
        Java consumer does the same (its offset lookups go to every leader before it waits).
        ``timeout_ms`` bounds the whole exchange.

        Errors as :meth:`send`'s: the first request that failed, in the order given, raises,
        and what the others answered is dropped. With ``partial``, a request whose broker could
        not be reached or did not answer in time (:class:`RetriableBrokerError`) takes its
        place in the list as that error, and the other brokers' answers are kept: a caller that
        retries asks again only what failed (one broker restarting does not cost the answers
        of the others). Errors no retry can mend (TLS, SASL) raise either way."""
        if len(requests) == 1:
            node_id, request = requests[0]
            return [self._kept(partial, self.send, node_id, request, timeout_ms)]
        self.bootstrap()
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        futures = []
        for node_id, request in requests:
            self.last_node = node_id
            futures.append(self._kept(partial, self._start, node_id, request, timeout_ms,
                                      deadline))
        return [future if isinstance(future, RetriableBrokerError) else
                self._kept(partial, self._answer, node_id, future, timeout_ms, deadline)
                for (node_id, _), future in zip(requests, futures)]

    @staticmethod
    def _kept(partial: bool, step, *args):
        """``step(*args)``; with ``partial``, a :class:`RetriableBrokerError` it raises is
        returned instead (:meth:`send_all`)."""
        try:
            return step(*args)
        except RetriableBrokerError as exc:
            if not partial:
                raise
            return exc

    def _start(self, node_id, request, timeout_ms: int, deadline: float):
        """``request`` handed to ``node_id``'s connection (connecting first, at most until
        ``deadline``); kafka-python's Future of its answer."""
        net = self._net
        started = time.monotonic()
        with self._broker_errors(node_id):
            try:
                net.await_ready(node_id, timeout_ms=max(0.0, (deadline - started) * 1000))
            except Errors.KafkaConnectionError:
                raise Errors.KafkaConnectionError(self._not_connected(node_id, started)) from None
            self._reauthenticate_if_due(node_id)
            return net._manager.send(request, node_id=node_id, request_timeout_ms=timeout_ms)

    def _answer(self, node_id, future, timeout_ms: int, deadline: float):
        """The response ``future`` brings, polling the network at most until ``deadline``."""
        with self._broker_errors(node_id):
            if not future.is_done:
                self._net._net.poll(timeout_ms=max(0.0, (deadline - time.monotonic()) * 1000),
                                    future=future)
            if future.failed():
                raise future.exception
            if not future.succeeded():
                raise Errors.KafkaTimeoutError(f"no response within {timeout_ms} ms")
            return future.value

    @contextmanager
    def _broker_errors(self, node_id):
        """kafka-python's errors for a request to ``node_id`` as this package raises them."""
        try:
            yield
        except BrokerSecurityError as exc:  # kafka-python re-raises the one it keeps per node
            raise BrokerSecurityError(str(exc)) from None
        except Errors.UnknownBrokerIdError:
            # The request was routed by an answer that named ``node_id`` (a leader, a
            # coordinator), and a later Metadata answer no longer lists it: a broker that died
            # and left the cluster in between (in ZooKeeper mode, once its session expired).
            # Its partitions have other leaders by now: retriable, with the leaders looked up.
            raise BrokerUnreachableError(
                f"broker {node_id}: no longer in the cluster's metadata (it left the cluster; "
                "the request was routed by an older answer)") from None
        except _RETRIABLE_NETWORK_ERRORS as exc:
            fatal = self._connections.auth_failure(node_id)
            if fatal is not None:
                raise BrokerSecurityError(str(fatal)) from None
            raise BrokerUnreachableError(f"broker {node_id}: {exc}") from exc

    def _reauthenticate_if_due(self, node_id) -> None:
        """Start the SASL re-authentication of ``node_id``'s connection first when it is due.

        A broker ends a SASL session when its credential expires (an OAUTHBEARER token's
        ``exp``, or ``connections.max.reauth.ms``; KIP-368): a request that arrives after that
        makes it close the connection, while a re-authentication is still accepted.
        kafka-python re-authenticates on a timer of its event loop, which runs only while this
        client polls, and which can be late (:mod:`kafka_source.wire.net.reauth`); a client
        idle between micro-batches would otherwise send its next request first and lose the
        connection. Java's client re-authenticates before sending for the same reason. Running
        the loop once starts the exchange, and kafka-python holds the request until it is
        done. (The connection checks again for every request handed to it, kafka-python's own
        included: :func:`kafka_source.wire.net.reauth.track_sessions`.)"""
        conn = self._connections._conns.get(node_id)
        if conn is not None and reauthentication_due(conn):
            start_reauthentication(conn)
            self._net._net.poll(timeout_ms=0)

    def _not_connected(self, node_id, started: float) -> str:
        """Why ``node_id`` could not be used, truthfully timed. kafka-python says "not ready
        after <the timeout> ms" also when a refused connection failed at once, or when it did
        not try at all because the node is in its reconnect backoff after a failed attempt --
        which is what a fault's log would otherwise show for every request to a dead broker."""
        manager = self._connections
        text = f"no connection after {(time.monotonic() - started) * 1000:.0f} ms"
        failure = manager.failures.get(node_id)
        if failure is not None and failure[0] >= started - 60:
            text += f"; last failure {time.monotonic() - failure[0]:.1f} s ago: {failure[1]}"
        delay_s = manager.connection_delay(node_id)
        if delay_s > 0:
            text += f"; next attempt in {delay_s * 1000:.0f} ms (reconnect backoff)"
        return text

    # --- pipelined requests (the sink's producer) -------------------------------------------
    #
    # :meth:`send` waits for each response. The producer instead keeps several Produce requests
    # in flight per broker and drives the network between the writer's calls, so it sends
    # without waiting (:meth:`send_async`), asks whether a broker can take a request now
    # (:meth:`node_ready`) and polls the network itself (:meth:`poll`).

    def set_max_in_flight(self, requests: int) -> None:
        """Allow ``requests`` requests in flight per connection on connections opened from now
        on (kafka-python's default is 5). The producer keeps its own, lower, limit on Produce
        requests, so that a Metadata or InitProducerId request always finds room."""
        self._connections.config["max_in_flight_requests_per_connection"] = int(requests)

    def node_ready(self, node_id) -> bool:
        """Whether a request to broker ``node_id`` can be written now; if it is not connected,
        starts connecting (a later call answers True once connected). Raises
        :class:`BrokerSecurityError` for a TLS or SASL failure that no retry can fix."""
        self.bootstrap()
        fatal = self._connections.auth_failure(node_id)
        if fatal is not None:
            raise BrokerSecurityError(str(fatal))
        if self._net.is_ready(node_id):
            return True
        try:
            self._net.maybe_connect(node_id)
        except Errors.KafkaError as exc:        # e.g. a broker id no longer in the metadata
            log.debug("cannot connect to broker %s yet: %s", node_id, exc)
        return False

    def node_failing(self, node_id) -> bool:
        """Whether connecting to broker ``node_id`` failed since it last succeeded (the client
        waits out a reconnect backoff before trying again): a broker that is down, restarting
        or gone. The producer then asks for new metadata, as Kafka's Java client does on every
        disconnect: the broker's partitions have other leaders by now."""
        return node_id in self._connections._backoff

    def send_async(self, node_id, request, timeout_ms: int | None = None):
        """Send ``request`` to ``node_id`` without waiting: returns kafka-python's Future, which
        :meth:`poll` completes with the response, or fails with a network error or after
        ``timeout_ms`` (default ``kafka.request.timeout.ms``; the connection is then closed, as
        in every Kafka client, which fails the other requests in flight on it too). A request
        that expects no response (Produce with acks=0) succeeds with None once queued."""
        self.bootstrap()
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        self._reauthenticate_if_due(node_id)
        return self._net._manager.send(request, node_id=node_id, request_timeout_ms=timeout_ms)

    def send_now(self, node_id, request, timeout_ms: int | None = None):
        """:meth:`send_async`, with the request handed to the socket before returning: writing
        is a task of kafka-python's event loop, which takes a poll or two to run. A few polls
        that do not wait; bytes a full socket buffer did not take go out at the next poll."""
        future = self.send_async(node_id, request, timeout_ms)
        for _ in range(4):
            if future.is_done or self.unsent_bytes(node_id) <= 0:
                break
            self.poll(0)
        return future

    def any_node(self):
        """A broker for a request that any broker answers (FindCoordinator, Metadata): the
        least loaded one, as :meth:`send` picks it for ``node_id`` None. For callers of
        :meth:`send_async`, which need to know where their requests are in flight."""
        self.bootstrap()
        return self._net.least_loaded_node(bootstrap_fallback=True)

    def in_flight_limit(self, node_id) -> int:
        """How many requests may be in flight on the connection to ``node_id`` (kafka-python's
        ``max_in_flight_requests_per_connection``, as it was when the connection opened): one
        more sent with :meth:`send_async` fails at once (NodeNotReadyError, "Node paused"), so
        callers that pipeline keep below it."""
        conn = self._net._manager._conns.get(node_id)
        config = conn.config if conn is not None else self._connections.config
        return int(config.get("max_in_flight_requests_per_connection", 5))

    def api_version(self, request_class) -> int:
        """The version of ``request_class`` requests are sent with: the highest that both
        kafka-python and the brokers support (ApiVersions at bootstrap); -1 if the brokers
        have none. For a caller whose request takes another shape from some version on
        (FindCoordinator with many keys from v4)."""
        self.bootstrap()
        versions = self._connections.broker_version_data
        if versions is None:
            return -1
        try:
            return versions.api_version(request_class)
        except Errors.IncompatibleBrokerVersion:
            return -1

    def kraft_broker(self, node_id) -> bool:
        """Whether ``node_id`` is known to be a KRaft broker (Kafka 3.3+, every 4.x), from the
        ApiVersions it answered on this client's connection to it (else at bootstrap): not
        :func:`zookeeper_mode`. What the difference matters for: only a ZooKeeper-mode broker
        serves clients before it has learnt the cluster's topics
        (:meth:`kafka_source.wire.net.client.BrokerClient.topic_metadata`). False when nothing
        is known, the cautious answer."""
        conn = self._connections._conns.get(node_id)
        versions = getattr(conn, "broker_version_data", None) or \
            self._connections.broker_version_data
        api_keys = getattr(versions, "api_versions", None)
        return bool(api_keys) and not zookeeper_mode(api_keys)

    def coordinator_node(self, answer, key_type: CoordinatorType, key: str) -> str | int:
        """The node id to send ``key``'s requests to, from a FindCoordinator ``answer`` without
        error (the response before v4, one of its ``coordinators`` from v4): a coordinator
        connection of its own, as kafka-python keeps it."""
        return self._net.cluster.add_coordinator(answer, key_type, key)

    def poll(self, timeout_ms: float) -> None:
        """Do the network I/O that is possible now, waiting at most ``timeout_ms`` for some."""
        self._net._net.poll(timeout_ms=max(0, timeout_ms))

    def unsent_bytes(self, node_id) -> int:
        """Bytes of requests to ``node_id`` not yet handed to the socket (plus one for each
        request still waiting for the connection to be set up): 0 once everything was written,
        -1 when there is no open connection to it (what was queued on a closed one is lost).
        With acks=0 this is how the producer knows its records have at least left the
        process."""
        conn = self._net._manager._conns.get(node_id)
        if conn is None or conn.closed:
            return -1
        pending = len(conn._request_buffer)
        transport = conn.transport
        if transport is not None:
            pending += sum(len(chunk) for chunk in transport._write_buffer)
        return pending
