"""Certificates and key stores for TLS tests, made on the spot.

Tests of TLS and mutual TLS need a certificate authority, broker certificates (one valid for
``127.0.0.1``/``localhost``, one for another name, one self-signed) and client certificates, in
the formats Spark users hold them: PEM files, PKCS12 key stores, and Java's JKS. Everything is
generated with ``cryptography`` (a runtime dependency of the package) into a directory the caller
owns; JKS files and Java-written PKCS12 stores come from the JDK's ``keytool``, the tool that
makes them in real life (a JVM is needed for a real Kafka broker anyway).

Keys are EC P-256: generating them takes microseconds, and Java, OpenSSL and Kafka accept them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass, field

__all__ = ["CertificateAuthority", "Identity", "certificates_pem", "java_keystore",
           "java_truststore", "keytool", "keytool_available"]


@dataclass(frozen=True)
class Identity:
    """A private key and its certificate chain (leaf first)."""

    key: object
    chain: tuple = field(default_factory=tuple)

    @property
    def certificate(self):
        return self.chain[0]

    def key_pem(self, password: str | None = None) -> bytes:
        """The key as PKCS#8 PEM (what Java's PEM key stores need), encrypted with ``password``."""
        from cryptography.hazmat.primitives import serialization

        encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                      else serialization.NoEncryption())
        return self.key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8, encryption)

    def chain_pem(self) -> bytes:
        return certificates_pem(self.chain)

    def write_pem(self, path: str, *, key_password: str | None = None) -> str:
        """Key and chain in one PEM file (a PEM key store, ``ssl.keystore.type=PEM``)."""
        return _write(path, self.key_pem(key_password) + self.chain_pem())

    def write_pkcs12(self, path: str, password: str, *, name: str = "client") -> str:
        """A PKCS12 key store holding the key and its chain, protected by ``password``."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.serialization import pkcs12

        data = pkcs12.serialize_key_and_certificates(
            name.encode(), self.key, self.chain[0], list(self.chain[1:]) or None,
            serialization.BestAvailableEncryption(password.encode()))
        return _write(path, data)


def certificates_pem(certificates) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def _write(path: str, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer, public_key, days: int):
    from cryptography import x509

    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder()
            .subject_name(_name(subject))
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, common_name: str = "pykafka test CA", days: int = 30):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes

        self.key = _new_key()
        self.certificate = (
            _builder(common_name, _name(common_name), self.key.public_key(), days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256()))

    def pem(self) -> bytes:
        return certificates_pem([self.certificate])

    def write_pem(self, path: str) -> str:
        return _write(path, self.pem())

    def issue(self, common_name: str, *, dns: tuple[str, ...] = (), ips: tuple[str, ...] = (),
              client: bool = False, days: int = 30) -> Identity:
        """A certificate signed by this CA for a server (``dns``/``ips`` as subject alternative
        names) or, with ``client=True``, for a client."""
        return _leaf(common_name, self.key, self.certificate, dns=dns, ips=ips, client=client,
                     days=days)

    @staticmethod
    def self_signed(common_name: str, *, dns: tuple[str, ...] = (), ips: tuple[str, ...] = (),
                    days: int = 30) -> Identity:
        """A server certificate nobody vouches for (it signs itself)."""
        return _leaf(common_name, None, None, dns=dns, ips=ips, client=False, days=days)


def _leaf(common_name, ca_key, ca_cert, *, dns, ips, client, days) -> Identity:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _new_key()
    issuer = ca_cert.subject if ca_cert is not None else _name(common_name)
    builder = _builder(common_name, issuer, key.public_key(), days)
    names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i))
                                              for i in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (builder
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    cert = builder.sign(ca_key if ca_key is not None else key, hashes.SHA256())
    chain = (cert,) if ca_cert is None else (cert, ca_cert)
    return Identity(key, chain)


# --------------------------------------------------------------------------------------------
# Java's keytool
# --------------------------------------------------------------------------------------------

def keytool_available() -> bool:
    return _keytool_path() is not None


def _keytool_path() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "keytool"), os.X_OK):
        return os.path.join(java_home, "bin", "keytool")
    return shutil.which("keytool")


def keytool(*args: str) -> None:
    """Run the JDK's ``keytool`` with ``args``; raises with its output when it fails."""
    path = _keytool_path()
    if path is None:
        raise RuntimeError("keytool (from a JDK) is not on PATH and JAVA_HOME/bin has none")
    result = subprocess.run([path, *args], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise RuntimeError(f"keytool {args[0]} failed: {result.stdout}{result.stderr}")


def java_truststore(path: str, ca_pem_path: str, password: str, *,
                    store_type: str = "PKCS12") -> str:
    """A Java trust store (``PKCS12`` or ``JKS``) holding the CA in ``ca_pem_path``, as
    ``keytool -importcert`` writes it."""
    keytool("-importcert", "-noprompt", "-alias", "ca", "-file", ca_pem_path,
            "-keystore", path, "-storetype", store_type, "-storepass", password)
    return path


def java_keystore(path: str, source_pkcs12: str, source_password: str, password: str, *,
                  store_type: str = "PKCS12") -> str:
    """A Java key store (``PKCS12`` or ``JKS``) rewritten by ``keytool -importkeystore`` from a
    PKCS12 file, as a Java user converting their key would get it."""
    keytool("-importkeystore", "-noprompt", "-srckeystore", source_pkcs12,
            "-srcstoretype", "PKCS12", "-srcstorepass", source_password,
            "-destkeystore", path, "-deststoretype", store_type, "-deststorepass", password,
            "-destkeypass", password)
    return path
