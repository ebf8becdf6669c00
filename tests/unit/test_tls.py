"""The TLS context from trust and key store options, checked with real handshakes on loopback."""

from __future__ import annotations

import os
import ssl
import subprocess

import pytest

from kafka_source.config.client_config import client_config_from_options
from kafka_source.errors import OptionError
from kafka_source.testing.certs import (CertificateAuthority, java_keystore, java_truststore,
                                        keytool_available)
from kafka_source.wire.net.tls import ssl_context

from .tls_server import TlsServer, handshake

pytestmark = pytest.mark.pyspark_free

PASSWORD = "pw-Recognisable-1234"
needs_keytool = pytest.mark.skipif(not keytool_available(),
                                   reason="needs the JDK's keytool (Java stores)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority()
    client = ca.issue("client", client=True)
    files = {"dir": d, "ca": ca, "client": client,
             "server": ca.issue("broker", dns=("localhost",), ips=("127.0.0.1",)),
             "ca.pem": ca.write_pem(str(d / "ca.pem")),
             "client.p12": client.write_pkcs12(str(d / "client.p12"), PASSWORD),
             "client-enc.pem": client.write_pem(str(d / "client-enc.pem"),
                                                key_password=PASSWORD),
             "client.pem": client.write_pem(str(d / "client.pem"))}
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    data = pkcs12.serialize_key_and_certificates(
        b"ca", None, None, [ca.certificate],
        serialization.BestAvailableEncryption(PASSWORD.encode()))
    (d / "trust.p12").write_bytes(data)
    files["trust.p12"] = str(d / "trust.p12")
    return files


@pytest.fixture(scope="module")
def server(pki):
    with TlsServer(pki["server"]) as s:
        yield s


@pytest.fixture(scope="module")
def mtls_server(pki):
    with TlsServer(pki["server"], client_ca=pki["ca"]) as s:
        yield s


def context(**options) -> ssl.SSLContext:
    return ssl_context(tls_config(**options))


def tls_config(**options):
    opts = {"kafka.bootstrap.servers": "127.0.0.1:1", "kafka.security.protocol": "SSL"}
    opts.update({f"kafka.{k.replace('_', '.')}": v for k, v in options.items()})
    return client_config_from_options(opts)


def error_of(**options) -> str:
    with pytest.raises(OptionError) as info:
        context(**options)
    message = str(info.value)
    assert PASSWORD not in message
    return message


# --- trust ------------------------------------------------------------------------------------

def test_each_way_of_trusting_the_ca_verifies_the_broker(pki, server):
    pem = open(pki["ca.pem"]).read()
    for options in [dict(ssl_truststore_location=pki["trust.p12"],
                         ssl_truststore_password=PASSWORD),
                    dict(ssl_truststore_location=pki["trust.p12"],
                         ssl_truststore_password=PASSWORD, ssl_truststore_type="pkcs12"),
                    dict(ssl_truststore_location=pki["ca.pem"], ssl_truststore_type="PEM"),
                    dict(ssl_truststore_location=pki["ca.pem"]),
                    dict(ssl_truststore_certificates=pem),
                    dict(ssl_truststore_certificates=pem, ssl_truststore_type="PEM"),
                    dict(ssl_cafile=pki["ca.pem"])]:
        assert handshake(context(**options), server.port) == b"ok", options


@needs_keytool
def test_a_java_written_pkcs12_trust_store(pki, server):
    path = java_truststore(str(pki["dir"] / "java-trust.p12"), pki["ca.pem"], PASSWORD)
    ctx = context(ssl_truststore_location=path, ssl_truststore_password=PASSWORD,
                  ssl_truststore_type="PKCS12")
    assert handshake(ctx, server.port) == b"ok"


def test_without_a_trust_store_only_system_cas_are_trusted(server):
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(context(), server.port)


def test_the_host_name_is_checked_unless_switched_off(pki, server):
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(context(ssl_cafile=pki["ca.pem"]), server.port, server_hostname="other.name")
    ctx = context(ssl_cafile=pki["ca.pem"], ssl_endpoint_identification_algorithm="")
    assert handshake(ctx, server.port, server_hostname="other.name") == b"ok"


# --- client certificates (mutual TLS) -----------------------------------------------------------

def test_each_kind_of_key_store_gives_the_client_certificate(pki, mtls_server):
    client = pki["client"]
    trust = dict(ssl_cafile=pki["ca.pem"])
    for options in [dict(ssl_keystore_location=pki["client.p12"],
                         ssl_keystore_password=PASSWORD),
                    dict(ssl_keystore_location=pki["client.p12"], ssl_keystore_type="PKCS12",
                         ssl_keystore_password=PASSWORD, ssl_key_password=PASSWORD),
                    dict(ssl_keystore_location=pki["client-enc.pem"], ssl_keystore_type="PEM",
                         ssl_key_password=PASSWORD),
                    dict(ssl_keystore_location=pki["client.pem"]),
                    dict(ssl_keystore_key=client.key_pem(PASSWORD).decode(),
                         ssl_keystore_certificate_chain=client.chain_pem().decode(),
                         ssl_key_password=PASSWORD),
                    dict(ssl_keystore_key=client.key_pem().decode(),
                         ssl_keystore_certificate_chain=client.chain_pem().decode(),
                         ssl_keystore_type="PEM"),
                    dict(ssl_certfile=pki["client.pem"]),
                    dict(ssl_certfile=pki["client-enc.pem"], ssl_keyfile=pki["client-enc.pem"],
                         ssl_password=PASSWORD)]:
        assert handshake(context(**trust, **options), mtls_server.port) == b"ok", options
    with pytest.raises(ssl.SSLError):  # and without one the server refuses
        handshake(context(**trust), mtls_server.port)


@needs_keytool
def test_a_java_written_pkcs12_key_store(pki, mtls_server):
    path = java_keystore(str(pki["dir"] / "java-client.p12"), pki["client.p12"], PASSWORD,
                         PASSWORD + "2")
    ctx = context(ssl_cafile=pki["ca.pem"], ssl_keystore_location=path,
                  ssl_keystore_password=PASSWORD + "2")
    assert handshake(ctx, mtls_server.port) == b"ok"


def test_the_private_key_never_touches_the_disk_in_clear(pki, mtls_server, tmp_path,
                                                         monkeypatch):
    import tempfile

    client = pki["client"]
    plain_key = client.key_pem().decode()
    seen = []
    real = ssl.SSLContext.load_cert_chain

    def spy(self, certfile, keyfile=None, password=None):
        seen.append(open(certfile).read())
        return real(self, certfile, keyfile, password)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", spy)
    ctx = context(ssl_cafile=pki["ca.pem"], ssl_keystore_key=plain_key,
                  ssl_keystore_certificate_chain=client.chain_pem().decode())
    assert len(seen) == 1 and "ENCRYPTED PRIVATE KEY" in seen[0]
    body = "".join(plain_key.splitlines()[1:-1])
    assert body[:40] not in seen[0].replace("\n", "")
    assert os.listdir(tmp_path) == []  # removed as soon as OpenSSL read it
    monkeypatch.undo()
    assert handshake(ctx, mtls_server.port) == b"ok"


# --- Java key stores ----------------------------------------------------------------------------

@needs_keytool
def test_jks_is_refused_with_the_keytool_command_that_converts_it(pki, server):
    path = java_truststore(str(pki["dir"] / "trust.jks"), pki["ca.pem"], PASSWORD,
                           store_type="JKS")
    for store_type in ("JKS", None):
        options = dict(ssl_truststore_location=path, ssl_truststore_password=PASSWORD)
        if store_type:
            options["ssl_truststore_type"] = store_type
        message = error_of(**options)
    command = (f"keytool -importkeystore -srckeystore {path} -srcstoretype JKS "
               f"-destkeystore {path[:-4]}.p12 -deststoretype PKCS12")
    assert command in message and "'kafka.ssl.truststore.type' to PKCS12" in message
    # The command works as given (keytool asks for the passwords: answer on stdin).
    converted = path[:-4] + ".p12"
    run = subprocess.run(command.split(), input=f"{PASSWORD}\n{PASSWORD}\n{PASSWORD}\n",
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    ctx = context(ssl_truststore_location=converted, ssl_truststore_password=PASSWORD,
                  ssl_truststore_type="PKCS12")
    assert handshake(ctx, server.port) == b"ok"


def test_jceks_is_refused_too(tmp_path):
    path = tmp_path / "keys.jceks"
    path.write_bytes(b"\xce\xce\xce\xce" + b"\0" * 60)
    message = error_of(ssl_keystore_location=str(path), ssl_keystore_password="x")
    assert "-srcstoretype JCEKS" in message and "kafka.ssl.keystore.location" in message


# --- bad input ----------------------------------------------------------------------------------

def test_wrong_or_missing_passwords_name_the_option(pki):
    wrong = PASSWORD + "-wrong"
    m = error_of(ssl_truststore_location=pki["trust.p12"], ssl_truststore_password=wrong)
    assert "'kafka.ssl.truststore.password' is wrong" in m and pki["trust.p12"] in m
    assert wrong not in m
    m = error_of(ssl_truststore_location=pki["trust.p12"])
    assert "'kafka.ssl.truststore.password' is missing" in m
    m = error_of(ssl_keystore_location=pki["client.p12"], ssl_keystore_password=wrong)
    assert "'kafka.ssl.keystore.password' is wrong" in m and wrong not in m
    m = error_of(ssl_keystore_location=pki["client.p12"])
    assert "'kafka.ssl.keystore.password' is required" in m
    m = error_of(ssl_keystore_location=pki["client-enc.pem"], ssl_key_password=wrong)
    assert "'kafka.ssl.key.password' is wrong" in m and wrong not in m
    m = error_of(ssl_keystore_location=pki["client-enc.pem"])
    assert "encrypted: set 'kafka.ssl.key.password'" in m


def test_options_that_contradict_each_other(pki):
    pem = open(pki["ca.pem"]).read()
    cases = [
        (dict(ssl_truststore_location=pki["ca.pem"], ssl_truststore_certificates=pem),
         "exclude each other"),
        (dict(ssl_truststore_location=pki["ca.pem"], ssl_truststore_password=PASSWORD),
         "not used with a PEM trust store"),
        (dict(ssl_truststore_location=pki["trust.p12"], ssl_truststore_type="PEM",
              ssl_truststore_password=PASSWORD), "is a PKCS12 file"),
        (dict(ssl_truststore_certificates=pem, ssl_truststore_type="PKCS12"), "set it to PEM"),
        (dict(ssl_truststore_location=pki["ca.pem"], ssl_truststore_type="BCFKS"),
         "supported are PKCS12 and PEM"),
        (dict(ssl_keystore_location=pki["client.pem"], ssl_certfile=pki["client.pem"]),
         "set only one of them"),
        (dict(ssl_keystore_key=pki["client"].key_pem().decode()), "go together"),
        (dict(ssl_keystore_location=pki["client.pem"], ssl_keystore_password=PASSWORD),
         "not used with a PEM key store"),
        (dict(ssl_keystore_location=pki["trust.p12"], ssl_keystore_password=PASSWORD),
         "holds no private key"),
        (dict(ssl_keystore_password=PASSWORD), "'kafka.ssl.keystore.location' is not"),
        (dict(ssl_keystore_location=pki["ca.pem"]), "holds no PEM private key"),
        (dict(ssl_truststore_location=str(pki["dir"] / "missing.p12")),
         "cannot read '" + str(pki["dir"] / "missing.p12")),
    ]
    for options, fragment in cases:
        assert fragment in error_of(**options), options
