"""Connection failures no retry can fix fail on the first attempt, with the cause and the fix.

The TLS cases use real handshakes with a loopback TLS server (tests/unit/tls_server.py), through
the same BrokerClient the driver, the executors and the group member use; the server counts the
connections, so "at once" is checked without timing anything. SASL and protocol-mismatch
answers need a Kafka broker and are checked on a real one in tests/integration/test_security.py;
here :func:`diagnose` gets the exceptions kafka-python raises for them.
"""

from __future__ import annotations

import logging
import ssl

import kafka.errors as Errors
import pytest
from kafka.protocol.sasl import SaslAuthenticateRequest

from kafka_source.config.client_config import client_config_from_options
from kafka_source.errors import BrokerSecurityError
from kafka_source.read.executor import read_input_partition
from kafka_source.read.offsets import OffsetRange
from kafka_source.read.planning import KafkaInputPartition, ReadSettings
from kafka_source.testing.certs import CertificateAuthority
from kafka_source.wire.net.client import BrokerClient
from kafka_source.wire.net.handshake import _RedactSaslRequests, diagnose

from .tls_server import TlsServer, handshake

# Far longer than any test may take: a client that retried until it ran out would hang the test
# (and fail on the connection count) instead of passing.
TIMEOUT_MS = "120000"


@pytest.fixture(scope="module")
def ca():
    return CertificateAuthority()


@pytest.fixture(scope="module")
def ca_file(ca, tmp_path_factory):
    return ca.write_pem(str(tmp_path_factory.mktemp("ca") / "ca.pem"))


def config(server: TlsServer, **options):
    opts = {"kafka.bootstrap.servers": server.address, "kafka.security.protocol": "SSL",
            "kafka.request.timeout.ms": TIMEOUT_MS}
    opts.update({f"kafka.{k.replace('_', '.')}": v for k, v in options.items()})
    return client_config_from_options(opts)


def failure(server: TlsServer, **options) -> str:
    with BrokerClient(config(server, **options)) as client:
        with pytest.raises(BrokerSecurityError) as info:
            client.bootstrap()
    assert server.connections <= 2, "retried a connection that cannot succeed"
    return str(info.value)


def test_untrusted_broker_certificate_names_the_trust_options(ca):
    with TlsServer(CertificateAuthority.self_signed("broker", ips=("127.0.0.1",))) as server:
        message = failure(server)
    assert "certificate verification failed" in message and "self-signed" in message
    assert "'kafka.ssl.truststore.location'" in message and "'kafka.ssl.cafile'" in message
    assert "No trust store is configured" in message


def test_broker_certificate_from_a_ca_not_in_the_trust_store(ca, ca_file):
    other = CertificateAuthority("another CA")
    with TlsServer(other.issue("broker", ips=("127.0.0.1",))) as server:
        message = failure(server, ssl_cafile=ca_file)
    assert "does not hold the CA that signed the broker's certificate" in message


def test_host_name_mismatch_names_the_endpoint_identification_option(ca, ca_file):
    with TlsServer(ca.issue("broker", dns=("broker.example.invalid",))) as server:
        message = failure(server, ssl_cafile=ca_file)
    assert "not valid for the name '127.0.0.1'" in message
    assert "'kafka.ssl.endpoint.identification.algorithm'" in message


def test_listener_requiring_a_client_certificate(ca, ca_file):
    with TlsServer(ca.issue("broker", ips=("127.0.0.1",)), client_ca=ca) as server:
        message = failure(server, ssl_cafile=ca_file)
    assert "requires a client certificate" in message
    assert "'kafka.ssl.keystore.location'" in message


def test_a_rejection_an_old_broker_garbles_is_still_found(ca, ca_file, tmp_path):
    """Kafka 2.2 sends its first flight again and zeros before the alert: OpenSSL reports an
    unexpected message, and the alert behind it is the cause (not a retriable failure)."""
    with TlsServer(ca.issue("broker", ips=("127.0.0.1",)), client_ca=ca,
                   garble_rejection=True) as server:
        message = failure(server, ssl_cafile=ca_file)
        assert "requires a client certificate" in message
        assert "'kafka.ssl.keystore.location'" in message
        stranger = CertificateAuthority("stranger").issue("client", client=True)
        message = failure(server, ssl_cafile=ca_file,
                          ssl_keystore_location=stranger.write_pem(str(tmp_path / "c.pem")))
        assert "client certificate configured is not accepted" in message
        # a certificate it trusts completes the handshake
        ctx = ssl.create_default_context(cafile=ca_file)
        ctx.load_cert_chain(ca.issue("client", client=True).write_pem(str(tmp_path / "ok.pem")))
        handshake(ctx, server.port, "127.0.0.1")
        assert server.handshakes == 1


def test_client_certificate_the_broker_does_not_trust(ca, ca_file, tmp_path):
    stranger = CertificateAuthority("stranger").issue("client", client=True)
    with TlsServer(ca.issue("broker", ips=("127.0.0.1",)), client_ca=ca) as server:
        message = failure(server, ssl_cafile=ca_file,
                          ssl_keystore_location=stranger.write_pem(str(tmp_path / "c.pem")))
    assert "client certificate configured is not accepted" in message


def test_executor_reads_fail_the_same_way_at_once(ca):
    with TlsServer(CertificateAuthority.self_signed("broker", ips=("127.0.0.1",))) as server:
        settings = ReadSettings(client_config=config(server), include_headers=False,
                                fail_on_data_loss=True, poll_timeout_ms=120_000)
        partition = KafkaInputPartition(0, [OffsetRange("t", 0, 0, 10)], settings)
        with pytest.raises(BrokerSecurityError, match="kafka.ssl.truststore.location"):
            list(read_input_partition(partition))
        assert server.connections <= 2


# --- diagnose(): the answers only a Kafka broker gives ------------------------------------------

def diagnosis(exc, protocol="SASL_SSL", mechanism="SCRAM-SHA-512", **extra):
    settings = {"security_protocol": protocol, "sasl_mechanism": mechanism,
                "sasl_plain_username": "alice"}
    return diagnose(exc, address="b:9093", host="b", config=settings, **extra)


def test_sasl_answers_no_retry_can_change_are_fatal():
    fatal, _ = diagnosis(Errors.UnsupportedSaslMechanismError())
    assert "does not enable the mechanism SCRAM-SHA-512" in str(fatal)
    assert "'kafka.sasl.mechanism'" in str(fatal)
    fatal, _ = diagnosis(Errors.SaslAuthenticationFailedError(
        "SaslAuthenticationFailedError: Authentication failed during authentication due to "
        "invalid credentials with SASL mechanism SCRAM-SHA-512"))
    text = str(fatal)
    assert "rejected SCRAM-SHA-512 authentication as user 'alice'" in text
    assert "(Authentication failed during authentication" in text
    assert "'kafka.sasl.jaas.config'" in text and "SCRAM-SHA-512 credentials" in text
    fatal, _ = diagnosis(Errors.IllegalSaslStateError())
    assert "does not expect SASL" in str(fatal) and "'kafka.security.protocol'" in str(fatal)


def test_a_failed_reauthentication_says_nothing_of_the_port_and_is_retried():
    # ILLEGAL_SASL_STATE from a connection that authenticated on this port: not a PLAINTEXT
    # listener, whatever the same answer means to a new connection's SaslHandshake
    for error in (Errors.IllegalSaslStateError(), Errors.SaslAuthenticationFailedError("x"),
                  Errors.UnsupportedSaslMechanismError()):
        fatal, hint = diagnosis(error, during_setup=False)
        assert fatal is None
        assert "re-authentication failed" in hint and type(error).__name__ in hint


def test_a_tls_answer_to_a_plaintext_client_is_fatal():
    # kafka-python reads a TLS alert record (15 03 03 ..) as a frame size.
    fatal, _ = diagnosis(Errors.InvalidReceiveError("Invalid frame length: 352518912"),
                         protocol="PLAINTEXT")
    assert "answered in TLS" in str(fatal) and "set it to SSL" in str(fatal)
    fatal, _ = diagnosis(Errors.InvalidReceiveError("Invalid frame length: 352518912"),
                         protocol="SASL_PLAINTEXT")
    assert "set it to SASL_SSL" in str(fatal)
    fatal, hint = diagnosis(Errors.InvalidReceiveError("Invalid frame length: 200000000"),
                            protocol="PLAINTEXT")
    assert fatal is None and hint is None


def test_failures_a_retry_may_cure_stay_retriable_with_a_hint():
    eof = Errors.KafkaConnectionError("Handshake failed")
    eof.__context__ = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    fatal, hint = diagnosis(eof, protocol="SSL")
    assert fatal is None and "'kafka.security.protocol'" in hint
    fatal, hint = diagnosis(Errors.KafkaConnectionError("socket disconnected"),
                            protocol="PLAINTEXT", during_setup=False)
    assert fatal is None and "SASL_PLAINTEXT or SASL_SSL" in hint
    assert diagnosis(Errors.KafkaConnectionError("Connection refused")) == (None, None)


# --- logs ---------------------------------------------------------------------------------------

def test_kafka_python_debug_logs_do_not_show_sasl_credentials(caplog):
    secret = b"pw-Recognisable-9999"
    request = SaslAuthenticateRequest(b"\0alice\0alice\0" + secret)
    request.with_header(correlation_id=3, client_id="pykafka")
    frame = request.encode(version=1, framed=True, header=True)
    other = b"\x00\x00\x00\x06\x00\x03\x00\x0c\x00\x01"  # a Metadata request frame before it
    logger = logging.getLogger("kafka.protocol.parser")
    assert any(isinstance(f, _RedactSaslRequests) for f in logger.filters)
    with caplog.at_level(logging.DEBUG, logger="kafka"):
        logger.debug("%s Sending request %d %s", "node=1", 3, request)
        logger.debug("%s Send: %r", "node=1", bytearray(other + frame))
        logging.getLogger("kafka.net.connection").debug("%s Request %d: %s", "conn", 3, request)
        logger.debug("%s Send: %r", "node=1", other)
    assert secret.decode() not in caplog.text
    assert caplog.text.count("with SASL credentials: redacted") == 3
    assert repr(other) in caplog.text  # other requests are logged as they are


def test_each_bootstrap_attempt_is_bounded_by_the_connection_setup_timeout():
    """A broker that accepts connections and never answers (one restarting): kafka-python gives
    its bootstrap connection the whole bootstrap window; ours gives each attempt
    ``socket.connection.setup.timeout.ms``, so the window holds several attempts, as Java's."""
    import socket
    import threading

    import kafka.errors as Errors
    from kafka.net.selector import NetworkSelector

    from kafka_source.wire.net.handshake import ConnectionManager

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []

    def accept():
        while True:
            try:
                accepted.append(listener.accept()[0])    # held open, never answered
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    net = NetworkSelector()
    manager = ConnectionManager(
        net, bootstrap_servers=f"127.0.0.1:{listener.getsockname()[1]}",
        socket_connection_setup_timeout_ms=400, socket_connection_setup_timeout_max_ms=400,
        reconnect_backoff_ms=50, reconnect_backoff_max_ms=100)
    try:
        with pytest.raises(Errors.KafkaTimeoutError):
            manager.bootstrap(timeout_ms=3000)
        assert len(accepted) >= 3, f"{len(accepted)} attempt(s) in the bootstrap window"
    finally:
        listener.close()
        for s in accepted:
            s.close()
        net.close()
