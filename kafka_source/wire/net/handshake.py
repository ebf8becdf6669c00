"""Connection set-up with a broker: TLS and SASL failures reported on the first attempt.

kafka-python's connection manager treats every failed connection alike: it backs off and tries
again until the caller's timeout, and the caller learns only that no broker could be reached. For
a certificate nobody trusts, a certificate for another host name, a SASL mechanism the listener
does not enable, a rejected password or a client speaking TLS to a plaintext port (or the other
way round), every retry fails the same way: the user waits ``kafka.request.timeout.ms`` to be
told the wrong thing. :class:`ConnectionManager` looks at why each connection failed
(:func:`diagnose`) and, when no retry can help, records a :class:`BrokerSecurityError` that names
the option to fix. kafka-python keeps such "sticky" failures per node and raises them the next
time anyone asks for a connection to that node, so the bootstrap, the executors' fetches and the
group coordinator's connection all fail at once with the real cause. Failures a retry may cure
(the broker closed the connection during the handshake, a reset) stay retriable, and the last
one is kept for the timeout message (:attr:`ConnectionManager.last_failure`).

Three more things get in the way, handled here:

* When the broker rejects a SASL password it sends the error and closes the connection; if both
  arrive in one read, kafka-python's read loop drops the bytes and reports only "socket
  disconnected". Our transports deliver what was read before reporting the close.
* At DEBUG level kafka-python logs every request and the bytes it sends, and a SASL PLAIN
  ``SaslAuthenticateRequest`` holds the password in clear. :class:`_RedactSaslRequests` keeps
  those requests out of the log records of the two loggers that print requests.
* Old brokers garble the alert with which they reject a client's certificate. Measured on Kafka
  2.2 on Java 17 (TLS 1.2), a listener with ``ssl.client.auth=required`` answers a client without
  a certificate with its first handshake flight again, some 16 KB of zeros and only then the
  alert (bad_certificate): OpenSSL stops at the repeated flight ("unexpected message") and the
  real cause would be lost, retried until ``kafka.request.timeout.ms``. :class:`_SSLTransport`
  reads what the broker still sends and, when an alert rejecting the certificate is in it,
  reports that alert instead.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import time
from typing import Iterator, Mapping

import kafka.errors as Errors
from kafka.net.inet import create_connection
from kafka.net.manager import KafkaConnectionManager
from kafka.net.transport import KafkaSSLTransport, KafkaTCPTransport
from kafka.protocol.sasl import SaslAuthenticateRequest

from ...errors import BrokerSecurityError
from .reauth import track_sessions

log = logging.getLogger(__name__)

# OpenSSL verification codes (X509_V_ERR_*) that mean "this certificate is not for that name".
_NAME_MISMATCH = {62, 63, 64}
_NOT_VALID_NOW = {9, 10}  # not yet valid, expired
# Alerts a TLS server sends when it does not accept the client's certificate (or got none).
_CLIENT_CERT_REJECTED = {"SSLV3_ALERT_BAD_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED",
                         "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
                         "SSLV3_ALERT_CERTIFICATE_EXPIRED", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
                         "TLSV1_ALERT_ACCESS_DENIED", "SSLV3_ALERT_CERTIFICATE_REVOKED"}
_NO_COMMON_TLS = {"SSLV3_ALERT_HANDSHAKE_FAILURE", "TLSV1_ALERT_PROTOCOL_VERSION",
                  "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE", "NO_SHARED_CIPHER",
                  "TLSV1_ALERT_INSUFFICIENT_SECURITY"}
_NOT_TLS = {"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST",
            "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL"}
# First byte of a TLS record (change_cipher_spec, alert, handshake, application_data).
_TLS_RECORD_TYPES = {0x14, 0x15, 0x16, 0x17}
# A fatal alert record in the clear (TLS 1.0 to 1.2 record versions): 15 03 0x 00 02 02 <alert>.
_FATAL_ALERT = re.compile(rb"\x15\x03[\x01-\x03]\x00\x02\x02(.)", re.DOTALL)
# TLS alert descriptions that reject the client's certificate, by OpenSSL's names for them.
_CERT_ALERTS = {42: "SSLV3_ALERT_BAD_CERTIFICATE", 43: "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
                44: "SSLV3_ALERT_CERTIFICATE_REVOKED", 45: "SSLV3_ALERT_CERTIFICATE_EXPIRED",
                46: "SSLV3_ALERT_CERTIFICATE_UNKNOWN", 48: "TLSV1_ALERT_UNKNOWN_CA",
                49: "TLSV1_ALERT_ACCESS_DENIED", 116: "TLSV13_ALERT_CERTIFICATE_REQUIRED"}
# How long, and how much, to read after a garbled handshake for the alert that follows it.
_ALERT_WAIT_S = 2.0
_ALERT_READ_LIMIT = 1 << 20

_TRUST_FIX = ("trust the CA that signed the broker's certificate: set 'kafka.ssl.truststore.location' (a PKCS12 or PEM "
              "trust store, with 'kafka.ssl.truststore.type') or 'kafka.ssl.cafile' (PEM) to its "
              "certificate")
_KEYSTORE_FIX = ("'kafka.ssl.keystore.location' (PKCS12 or PEM key store) with "
                 "'kafka.ssl.keystore.password', or 'kafka.ssl.keystore.key' + "
                 "'kafka.ssl.keystore.certificate.chain'")


# --- transports --------------------------------------------------------------------------------

class _ReadBeforeClose:
    """A transport read loop that hands the bytes read to the protocol before the error that
    ended the read (see the module docstring). The close is reported one loop turn later, so
    the request waiting for those bytes sees its answer first."""

    async def _read_from_sock(self):
        while self._read and not self._closed:
            await self._net.wait_read(self._sock)
            data, err = self._sock_recv()
            if data:
                self.last_read = time.monotonic()
                try:
                    self._protocol.data_received(data)
                except Errors.KafkaProtocolError as exc:
                    return self.abort(error=exc)
            if err is not None:
                if data:
                    self._read = False
                    self._net.call_soon(lambda: self.abort(error=err))
                    return None
                return self.abort(error=err)


class _TCPTransport(_ReadBeforeClose, KafkaTCPTransport):
    pass


class _SSLTransport(_ReadBeforeClose, KafkaSSLTransport):
    async def handshake(self):
        try:
            await super().handshake()
        except ssl.SSLError as exc:
            if getattr(exc, "reason", None) != "UNEXPECTED_MESSAGE":
                raise
            alert = await self._alert_after_garbled_handshake()
            if alert is None:
                raise
            rejected = ssl.SSLError(exc.errno, f"[SSL: {alert}] the broker sent an unexpected "
                                    f"handshake message, then this alert")
            rejected.reason, rejected.library = alert, "SSL"
            raise rejected from exc

    async def _alert_after_garbled_handshake(self) -> str | None:
        """The OpenSSL name of the alert rejecting the client's certificate that the broker sent
        after a handshake message OpenSSL did not expect (see the module docstring), read from
        the socket under the TLS layer until the broker closes it; None without one."""
        data = b""
        deadline = time.monotonic() + _ALERT_WAIT_S
        while len(data) < _ALERT_READ_LIMIT and time.monotonic() < deadline:
            try:
                chunk = socket.socket.recv(self._sock, 65536)  # the raw bytes, not TLS records
            except (BlockingIOError, InterruptedError):
                try:
                    await self._net.wait_read(self._sock, timeout_at=deadline)
                except Exception:  # noqa: BLE001 - the wait timed out
                    break
                continue
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        found = [_CERT_ALERTS.get(m.group(1)[0]) for m in _FATAL_ALERT.finditer(data)]
        return found[-1] if found else None

    def _sock_send(self):
        sent, err = super()._sock_send()
        if err is not None and self._sock is not None:
            # A TLS 1.3 server checks the client certificate after the handshake and answers
            # with an alert and a close; the request written meanwhile may fail first. The alert
            # is the reason: read it if it is there.
            try:
                self._sock.recv(4096)
            except ssl.SSLError as alert:
                if getattr(alert, "reason", None) in _CLIENT_CERT_REJECTED:
                    err = Errors.KafkaConnectionError(alert)
            except (OSError, ValueError):
                pass
        return sent, err


# --- the connection manager -------------------------------------------------------------------

class ConnectionManager(KafkaConnectionManager):
    """kafka-python's connection manager, with our transports and failure diagnosis.

    ``ssl_context`` (a setting) is the TLS context of every connection when the security
    protocol is SSL or SASL_SSL (:func:`kafka_source.wire.net.tls.ssl_context`).
    """

    def __init__(self, net, *, tls_settings: Mapping[str, object] | None = None, **settings):
        super().__init__(net, **settings)
        # Which trust and key store options were given (for the diagnosis; values unused).
        self.tls_given = frozenset(k for k, v in (tls_settings or {}).items() if v)
        self.last_failure: str | None = None
        # node id -> (time.monotonic() of the failure, what failed), for the error of a
        # request that finds the node unreachable (BrokerClient.send).
        self.failures: dict[int, tuple[float, str]] = {}

    def get_connection(self, node_id, timeout_ms=None, **kwargs):
        """kafka-python's, with every attempt bounded by the node's connection set-up timeout
        (``socket.connection.setup.timeout.ms``, growing with failures to its max), as Java's
        clients bound it. kafka-python's bootstrap gives its first connection the whole
        bootstrap window instead: a connection that a restarting broker accepts and never
        answers (its ApiVersions) then used up the window -- measured on Kafka 2.2, a batch
        read started during a restart failed after 30 s with "Timeout during ApiVersions
        check" while the broker had long been back. Bounded, the attempt fails and the next
        one reaches the restarted broker."""
        bound = self.socket_connection_setup_timeout_ms(node_id)
        if timeout_ms is None or timeout_ms > bound:
            timeout_ms = bound
        return super().get_connection(node_id, timeout_ms=timeout_ms, **kwargs)

    async def _build_transport(self, node, timeout_at=None):
        sock = await create_connection(self._net, node.host, node.port,
                                       self.config["socket_options"],
                                       proxy_url=self.config["proxy_url"], timeout_at=timeout_at)
        if self.ssl_enabled:
            transport = _SSLTransport(self._net, sock, host=node.host,
                                      ssl_context=self.config["ssl_context"])
        else:
            transport = _TCPTransport(self._net, sock, host=node.host)
        try:
            await transport.handshake()
        except Exception as exc:
            transport.close()
            raise Errors.KafkaConnectionError(f"Handshake failed: {exc}") from exc
        return transport

    async def _connect(self, node, conn, *args, **kwargs):
        track_sessions(conn)    # before it authenticates: see kafka_source.wire.net.reauth
        fatal: list[BrokerSecurityError] = []

        def setup_failed(exc):
            error = self._failed(node, exc, during_setup=True)
            if error is not None:
                fatal.append(error)

        conn.init_future.add_errback(setup_failed)
        # A connection that fails while being set up fails both futures: diagnose it once.
        conn.close_future.add_errback(lambda exc: conn.init_future.succeeded() and self._failed(
            node, exc, during_setup=False))
        result = await super()._connect(node, conn, *args, **kwargs)
        if fatal:
            # kafka-python forgets a node's kept failure once the set-up coroutine returns,
            # which it also does after a failed SASL exchange or a TLS alert: keep ours.
            self._auth_failures[node.node_id] = fatal[-1]
        return result

    def _failed(self, node, exc: BaseException, *, during_setup: bool
                ) -> BrokerSecurityError | None:
        address = f"{node.host}:{node.port}"
        fatal, hint = diagnose(exc, address=address, host=node.host, config=self.config,
                               tls_given=self.tls_given, during_setup=during_setup)
        self.last_failure = f"{address}: {exc}" + (f" ({hint})" if hint else "")
        self.failures[node.node_id] = (time.monotonic(), self.last_failure)
        if fatal is not None:
            log.error("%s", fatal)
            self._auth_failures[node.node_id] = fatal
        return fatal


# --- diagnosis --------------------------------------------------------------------------------

def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and exceptions it carries as arguments."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend([e.__cause__, e.__context__])
        todo.extend(a for a in getattr(e, "args", ()) if isinstance(a, BaseException))


_SASL_ANSWERS = (Errors.UnsupportedSaslMechanismError, Errors.SaslAuthenticationFailedError,
                 Errors.IllegalSaslStateError)


def diagnose(exc: BaseException, *, address: str, host: str, config: Mapping[str, object],
             tls_given: frozenset[str] = frozenset(), during_setup: bool = True
             ) -> tuple[BrokerSecurityError | None, str | None]:
    """Why a connection to ``address`` failed: ``(fatal error, None)`` when no retry can help,
    else ``(None, hint or None)``. ``config`` is kafka-python's connection settings,
    ``tls_given`` the names of the TLS settings that were set (``ssl_keystore_location``, ...)."""
    protocol = config.get("security_protocol", "PLAINTEXT")
    mechanism = config.get("sasl_mechanism")
    for cause in _causes(exc):
        if isinstance(cause, BrokerSecurityError):  # the OAUTHBEARER token source refused us
            return cause, None
        if isinstance(cause, ssl.SSLCertVerificationError):
            return _untrusted_certificate(cause, address, host, tls_given), None
        if isinstance(cause, ssl.SSLError):
            reason = str(getattr(cause, "reason", "") or "")
            if reason in _CLIENT_CERT_REJECTED:
                has_identity = bool(tls_given & {"ssl_keystore_location", "ssl_keystore_key",
                                                 "ssl_certfile"})
                what = ("the client certificate configured is not accepted (it must be signed "
                        "by a CA the broker trusts, and be valid now)" if has_identity else
                        "the listener requires a client certificate (mutual TLS, "
                        "ssl.client.auth=required) and none is configured")
                return BrokerSecurityError(
                    f"TLS: the broker at {address} rejected this client ({reason}): {what}. "
                    f"Set {_KEYSTORE_FIX}."), None
            if reason in _NO_COMMON_TLS:
                return BrokerSecurityError(
                    f"TLS: the broker at {address} and this client have no TLS version or "
                    f"cipher in common ({reason}); this client speaks TLS 1.2 and 1.3."), None
            if reason in _NOT_TLS:
                return BrokerSecurityError(
                    f"TLS: the broker at {address} does not answer in TLS ({reason}), but "
                    f"'kafka.security.protocol' is {protocol}: the port is probably a PLAINTEXT "
                    "or SASL_PLAINTEXT listener. Check 'kafka.security.protocol' and the port "
                    "in 'kafka.bootstrap.servers'."), None
            if isinstance(cause, ssl.SSLEOFError) or "EOF" in reason:
                return None, ("the broker closed the connection during the TLS handshake; if "
                              "this port is a PLAINTEXT or SASL_PLAINTEXT listener, "
                              "'kafka.security.protocol' must say so")
        if isinstance(cause, Errors.InvalidReceiveError) and not protocol.endswith("SSL"):
            if _looks_like_tls(str(cause)):
                return BrokerSecurityError(
                    f"The broker at {address} answered in TLS, but 'kafka.security.protocol' is "
                    f"{protocol}: set it to {'SASL_SSL' if protocol.startswith('SASL') else 'SSL'}"
                    f" and {_TRUST_FIX}."), None
        if not during_setup and isinstance(cause, _SASL_ANSWERS):
            # A connection set up on this port authenticated on it: a SASL answer now is a
            # re-authentication's (KIP-368), and says nothing of the port or the credentials
            # for sure. The connection is made again, and its authentication is diagnosed.
            return None, (f"its SASL re-authentication failed ({type(cause).__name__}); a new "
                          "connection authenticates again")
        if isinstance(cause, Errors.UnsupportedSaslMechanismError):
            return BrokerSecurityError(
                f"SASL: the broker at {address} does not enable the mechanism {mechanism} "
                "('kafka.sasl.mechanism') on this listener. Use one its "
                "'sasl.enabled.mechanisms' lists (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or "
                "OAUTHBEARER with the matching login module in 'kafka.sasl.jaas.config')."), None
        if isinstance(cause, Errors.SaslAuthenticationFailedError) and mechanism == "OAUTHBEARER":
            provider = config.get("sasl_oauth_token_provider")
            source = getattr(getattr(provider, "login", None), "source", "the configured source")
            detail = _broker_message(cause)
            return BrokerSecurityError(
                f"SASL: the broker at {address} rejected the OAUTHBEARER token from {source}"
                + (f" ({detail})" if detail else "") + ". The listener's validation (its "
                "expected issuer, audience, scope and signing keys) must accept tokens of this "
                "client: check 'kafka.sasl.oauthbearer.token.endpoint.url' and the clientId and "
                "scope in 'kafka.sasl.jaas.config'."), None
        if isinstance(cause, Errors.SaslAuthenticationFailedError):
            user = config.get("sasl_plain_username")
            detail = _broker_message(cause)
            scram = (f"; for SCRAM, that the user has {mechanism} credentials on the cluster"
                     if str(mechanism).startswith("SCRAM") else "")
            return BrokerSecurityError(
                f"SASL: the broker at {address} rejected {mechanism} authentication"
                + (f" as user '{user}'" if user else "") + (f" ({detail})" if detail else "")
                + f". Check the username and password in 'kafka.sasl.jaas.config'{scram}."), None
        if isinstance(cause, Errors.IllegalSaslStateError):
            return BrokerSecurityError(
                f"SASL: the broker at {address} does not expect SASL authentication on this "
                f"port, but 'kafka.security.protocol' is {protocol}: the port is probably a "
                "PLAINTEXT or SSL listener. Check 'kafka.security.protocol' and the port in "
                "'kafka.bootstrap.servers'."), None
    if not during_setup and not protocol.startswith("SASL_"):
        return None, ("the broker closed the connection after it was set up; if this port is a "
                      "SASL listener, 'kafka.security.protocol' must be SASL_PLAINTEXT or "
                      "SASL_SSL")
    return None, None


def _untrusted_certificate(cause: ssl.SSLCertVerificationError, address: str, host: str,
                           tls_given: frozenset[str]) -> BrokerSecurityError:
    code = getattr(cause, "verify_code", None)
    message = (getattr(cause, "verify_message", None) or str(cause)).rstrip(".")
    if code in _NAME_MISMATCH:
        return BrokerSecurityError(
            f"TLS: the certificate of the broker at {address} is not valid for the name "
            f"'{host}' ({message}). Connect with a name the certificate holds (in "
            "'kafka.bootstrap.servers', and the broker's advertised.listeners must use it too), "
            "give the broker a certificate with that name among its subject alternative "
            "names, or, only if you accept the risk, switch the check off with "
            "'kafka.ssl.endpoint.identification.algorithm' set to '' (empty).")
    if code in _NOT_VALID_NOW:
        return BrokerSecurityError(
            f"TLS: the certificate of the broker at {address} is not valid now ({message}); "
            "renew it, or check the clocks of this machine and the broker.")
    configured = bool(tls_given & {"ssl_truststore_location", "ssl_truststore_certificates",
                                   "ssl_cafile"})
    given = (" The trust store configured does not hold the CA that signed the broker's "
             "certificate." if configured else
             " No trust store is configured, so only the system's CAs are trusted.")
    return BrokerSecurityError(
        f"TLS: certificate verification failed for the broker at {address} ({message}).{given} "
        f"To fix it, {_TRUST_FIX}.")


def _looks_like_tls(text: str) -> bool:
    """True for kafka-python's "Invalid frame length: N" when N's first bytes are a TLS record
    header (type, major version 3): a TLS server's answer read as a Kafka frame size."""
    try:
        size = int(text.rsplit(":", 1)[1].strip())
    except (IndexError, ValueError):
        return False
    return (size >> 24) & 0xFF in _TLS_RECORD_TYPES and (size >> 16) & 0xFF == 0x03


def _broker_message(exc: BaseException) -> str:
    """The broker's text of a SASL failure, without kafka-python's class-name prefixes."""
    text = str(exc)
    for prefix in ("[Error 58] SaslAuthenticationFailedError: ",
                   "SaslAuthenticationFailedError: "):
        while text.startswith(prefix):
            text = text[len(prefix):]
    return text.strip()


# --- logging ------------------------------------------------------------------------------------

# API key of SaslAuthenticate: its request carries the credentials (PLAIN: the password).
_SASL_AUTHENTICATE_KEY = SaslAuthenticateRequest.API_KEY


class _RedactSaslRequests(logging.Filter):
    """Keep SASL authentication requests out of log records: kafka-python logs each request
    object, and the raw bytes it sends, at DEBUG level. Records are only looked at when they
    are emitted, so this costs nothing unless DEBUG logging is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(_holds_sasl(a) for a in args):
            record.args = tuple(f"<{type(a).__name__} with SASL credentials: redacted>"
                                if _holds_sasl(a) else a for a in args)
        return True


def _holds_sasl(value) -> bool:
    if isinstance(value, SaslAuthenticateRequest):
        return True
    if not isinstance(value, (bytes, bytearray, memoryview)):
        return False
    data = bytes(value)  # whole size-prefixed request frames: size, api key, ...
    i = 0
    while i + 6 <= len(data):
        if int.from_bytes(data[i + 4:i + 6], "big") == _SASL_AUTHENTICATE_KEY:
            return True
        i += 4 + int.from_bytes(data[i:i + 4], "big")
    return False


_REDACT = _RedactSaslRequests()
for _name in ("kafka.net.connection", "kafka.protocol.parser"):
    _logger = logging.getLogger(_name)
    if not any(isinstance(f, _RedactSaslRequests) for f in _logger.filters):
        _logger.addFilter(_REDACT)
