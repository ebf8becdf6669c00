"""The ``ssl.SSLContext`` of a connection, from Java-style trust and key store options.

Spark users hold their TLS material the way Java wants it: a trust store and a key store, PKCS12
(Java's default key store type since Java 9) or PEM, located by ``kafka.ssl.truststore.location``
/ ``kafka.ssl.keystore.location`` or given inline (``kafka.ssl.truststore.certificates``,
``kafka.ssl.keystore.key`` + ``kafka.ssl.keystore.certificate.chain``). Python's ``ssl`` module
reads neither PKCS12 nor keys held in memory, so this module reads the stores with
``cryptography`` and loads what they hold into the context: trusted certificates as PEM text
(``cadata``); the client key and chain through a temporary file that holds the key encrypted
with a random one-time password and is deleted as soon as OpenSSL has read it. kafka-python's own
PEM file options (``kafka.ssl.cafile``, ``certfile``, ``keyfile``, ``password``, ``crlfile``)
go into the same context.

The context is built where a connection is made (:class:`kafka_source.wire.net.client.BrokerClient`,
on the driver and in every executor) from the paths and passwords in the client settings, as the
Java client does: the files must exist on every node. The driver builds one when the DataFrame is
defined, so a missing file or a wrong password fails there, naming the option.

JKS (and JCEKS) files are Java's own format. No maintained Python reader exists (``pyjks`` has
had no release since 2020), so they are rejected with the ``keytool`` command that converts them
to PKCS12.
"""

from __future__ import annotations

import os
import secrets as _random
import shutil
import ssl
import tempfile
from typing import Mapping

from ...config.secrets import reveal
from ...errors import OptionError

# First bytes of a Java-only key store: JKS and JCEKS magic numbers.
_JAVA_MAGIC = {b"\xfe\xed\xfe\xed": "JKS", b"\xce\xce\xce\xce": "JCEKS"}
STORE_TYPES = ("PKCS12", "PEM", "JKS")


def ssl_context(config: Mapping[str, object]) -> ssl.SSLContext:
    """A client TLS context for the TLS settings in ``config`` (see the module docstring).

    Raises :class:`OptionError` naming the option for a missing or unreadable file, a wrong
    password, a JKS store or options that contradict each other. No message contains a secret.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # Java's ssl.endpoint.identification.algorithm: "https" (the default) checks the name.
    ctx.check_hostname = bool(config.get("ssl_check_hostname", True))
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_trust(ctx, config)
    identity = _client_identity(config)
    if identity is not None:
        _load_identity(ctx, *identity)
    return ctx


# --- trust ----------------------------------------------------------------------------------

def _load_trust(ctx: ssl.SSLContext, config: Mapping[str, object]) -> None:
    """Trusted CAs: the trust store, inline certificates and ``ssl.cafile`` together; the
    system's CAs when none is given (as Java uses the JDK's ``cacerts``)."""
    pem = b""
    location = config.get("ssl_truststore_location")
    inline = config.get("ssl_truststore_certificates")
    store_type = _store_type(config, "truststore")
    password = config.get("ssl_truststore_password")
    if location and inline:
        raise OptionError("Options 'kafka.ssl.truststore.location' and "
                          "'kafka.ssl.truststore.certificates' exclude each other: give the trust "
                          "store as a file or inline, not both.")
    if inline:
        if store_type not in (None, "PEM"):
            raise OptionError("Option 'kafka.ssl.truststore.certificates' holds PEM "
                              f"certificates, but 'kafka.ssl.truststore.type' is {store_type}; "
                              "set it to PEM or leave it out.")
        pem += _check_certificates(reveal(inline).encode(), "kafka.ssl.truststore.certificates")
    if location:
        data = _read(str(location), "kafka.ssl.truststore.location")
        kind = _detect(data, store_type, "truststore", str(location))
        if kind == "PEM":
            if password:
                raise OptionError("Option 'kafka.ssl.truststore.password' is not used with a PEM "
                                  "trust store (as in Kafka); leave it out.")
            pem += _check_certificates(data, "kafka.ssl.truststore.location")
        else:
            pem += _pkcs12_trusted(data, password, str(location))
    cafile = config.get("ssl_cafile")
    if cafile:
        pem += _check_certificates(_read(str(cafile), "kafka.ssl.cafile"), "kafka.ssl.cafile")
    if pem:
        ctx.load_verify_locations(cadata=pem.decode("ascii"))
    else:
        ctx.load_default_certs()
    crlfile = config.get("ssl_crlfile")
    if crlfile:
        _read(str(crlfile), "kafka.ssl.crlfile")
        try:
            ctx.load_verify_locations(cafile=str(crlfile))
        except ssl.SSLError as exc:
            raise OptionError(f"Option 'kafka.ssl.crlfile': '{crlfile}' is not a PEM certificate "
                              f"revocation list ({exc.reason}).") from None
        ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF


def _pkcs12_trusted(data: bytes, password, location: str) -> bytes:
    store = _load_pkcs12(data, password, location, "truststore")
    certs = [c.certificate for c in store.additional_certs]
    if store.cert is not None:
        certs.append(store.cert.certificate)
    if not certs:
        raise OptionError(f"Option 'kafka.ssl.truststore.location': the PKCS12 store '{location}' "
                          "holds no certificate.")
    return _pem(certs)


# --- the client's own certificate (mutual TLS) ------------------------------------------------

def _client_identity(config: Mapping[str, object]):
    """(private key, certificate chain) from the key store options, or None."""
    location = config.get("ssl_keystore_location")
    key = config.get("ssl_keystore_key")
    chain = config.get("ssl_keystore_certificate_chain")
    certfile, keyfile = config.get("ssl_certfile"), config.get("ssl_keyfile")
    key_password = config.get("ssl_key_password")
    store_password = config.get("ssl_keystore_password")
    store_type = _store_type(config, "keystore")
    ways = [name for name, given in (("kafka.ssl.keystore.location", location),
                                     ("kafka.ssl.keystore.key", key or chain),
                                     ("kafka.ssl.certfile", certfile or keyfile)) if given]
    if len(ways) > 1:
        raise OptionError(f"Options {' and '.join(repr(w) for w in ways)} each give the client "
                          "certificate; set only one of them.")
    if key or chain:
        if not (key and chain):
            raise OptionError("Options 'kafka.ssl.keystore.key' and "
                              "'kafka.ssl.keystore.certificate.chain' go together: the PEM "
                              "private key and its PEM certificate chain.")
        if store_type not in (None, "PEM"):
            raise OptionError("Options 'kafka.ssl.keystore.key' and "
                              "'kafka.ssl.keystore.certificate.chain' hold PEM, but "
                              f"'kafka.ssl.keystore.type' is {store_type}; set it to PEM or "
                              "leave it out.")
        return (_pem_key(reveal(key).encode(), key_password, "kafka.ssl.keystore.key"),
                _pem_chain(reveal(chain).encode(), "kafka.ssl.keystore.certificate.chain"))
    if certfile or keyfile:
        if not certfile:
            raise OptionError("Option 'kafka.ssl.keyfile' needs 'kafka.ssl.certfile' (the "
                              "client certificate).")
        cert_data = _read(str(certfile), "kafka.ssl.certfile")
        key_data = _read(str(keyfile), "kafka.ssl.keyfile") if keyfile else cert_data
        return (_pem_key(key_data, key_password, "kafka.ssl.keyfile" if keyfile
                         else "kafka.ssl.certfile"),
                _pem_chain(cert_data, "kafka.ssl.certfile"))
    if not location:
        if store_password:
            raise OptionError("Option 'kafka.ssl.keystore.password' is set but "
                              "'kafka.ssl.keystore.location' is not.")
        return None
    data = _read(str(location), "kafka.ssl.keystore.location")
    kind = _detect(data, store_type, "keystore", str(location))
    if kind == "PEM":
        if store_password:
            raise OptionError("Option 'kafka.ssl.keystore.password' is not used with a PEM key "
                              "store (as in Kafka); an encrypted key's password goes in "
                              "'kafka.ssl.key.password'.")
        return (_pem_key(data, key_password, "kafka.ssl.keystore.location"),
                _pem_chain(data, "kafka.ssl.keystore.location"))
    if not store_password:
        raise OptionError("Option 'kafka.ssl.keystore.password' is required with the PKCS12 key "
                          f"store '{location}' ('kafka.ssl.keystore.location').")
    store = _load_pkcs12(data, store_password, str(location), "keystore")
    if store.key is None or store.cert is None:
        raise OptionError(f"Option 'kafka.ssl.keystore.location': the PKCS12 store '{location}' "
                          "holds no private key with its certificate (a trust store? that goes "
                          "in 'kafka.ssl.truststore.location').")
    return store.key, [store.cert.certificate] + [c.certificate for c in store.additional_certs]


def _load_identity(ctx: ssl.SSLContext, key, chain) -> None:
    """Hand key and chain to OpenSSL, which reads them only from a file: a private temporary
    directory, the key encrypted with a random one-time password, removed at once."""
    from cryptography.hazmat.primitives import serialization

    one_time = _random.token_urlsafe(32)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.BestAvailableEncryption(one_time.encode()))
    directory = tempfile.mkdtemp(prefix="pykafka-tls-")  # mode 0700
    try:
        path = os.path.join(directory, "client.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem + _pem(chain))
        try:
            ctx.load_cert_chain(path, password=one_time)
        except ssl.SSLError as exc:
            raise OptionError("The client certificate does not match its private key "
                              f"({exc.reason}); check the key store options.") from None
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# --- reading stores ---------------------------------------------------------------------------

def _store_type(config: Mapping[str, object], store: str) -> str | None:
    raw = config.get(f"ssl_{store}_type")
    if raw is None or not str(raw).strip():
        return None
    kind = str(raw).strip().upper()
    if kind == "PKCS#12":
        kind = "PKCS12"
    if kind not in STORE_TYPES + ("JCEKS",):
        raise OptionError(f"Option 'kafka.ssl.{store}.type' is '{raw}'; supported are PKCS12 and "
                          "PEM (JKS files are converted to PKCS12 with keytool).")
    return kind


def _detect(data: bytes, declared: str | None, store: str, location: str) -> str:
    """What the file is, by its content: "PKCS12" or "PEM"; JKS and JCEKS are refused.

    Kafka's default store type is JKS, but Java reads PKCS12 files declared as JKS too, so the
    content decides; a declared type that contradicts it is an error.
    """
    java = _JAVA_MAGIC.get(data[:4])
    if java is not None:
        raise OptionError(_keytool_hint(store, location, java))
    if data.lstrip()[:10] == b"-----BEGIN":
        actual = "PEM"
    elif data[:1] == b"\x30":  # DER: a PKCS12 PFX is an ASN.1 SEQUENCE
        actual = "PKCS12"
    else:
        raise OptionError(f"Option 'kafka.ssl.{store}.location': '{location}' is neither a PKCS12 "
                          "nor a PEM file.")
    if declared == "PEM" and actual != "PEM" or declared == "PKCS12" and actual != "PKCS12":
        raise OptionError(f"Option 'kafka.ssl.{store}.type' is {declared}, but '{location}' "
                          f"('kafka.ssl.{store}.location') is a {actual} file; set the type to "
                          f"{actual} or leave it out.")
    return actual


def _keytool_hint(store: str, location: str, java_type: str) -> str:
    base, _ = os.path.splitext(location)
    target = base + ".p12"
    return (f"Option 'kafka.ssl.{store}.location': '{location}' is a {java_type} key store, which "
            f"Python cannot read. Convert it to PKCS12 with the JDK's keytool:\n"
            f"  keytool -importkeystore -srckeystore {location} -srcstoretype {java_type} "
            f"-destkeystore {target} -deststoretype PKCS12\n"
            f"(it asks for the passwords; keep the same one), then set "
            f"'kafka.ssl.{store}.location' to '{target}' and 'kafka.ssl.{store}.type' to PKCS12.")


def _load_pkcs12(data: bytes, password, location: str, store: str):
    from cryptography.hazmat.primitives.serialization import pkcs12

    secret = reveal(password)
    try:
        return pkcs12.load_pkcs12(data, secret.encode() if secret else None)
    except ValueError:
        # cryptography says "Invalid password or PKCS12 data" and nothing more.
        state = "wrong" if secret else "missing"
        raise OptionError(f"Could not open the PKCS12 {store[:-5]} store '{location}' "
                          f"('kafka.ssl.{store}.location'): 'kafka.ssl.{store}.password' is "
                          f"{state}, or the file is damaged.") from None


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise OptionError(f"Option '{option}': cannot read '{path}' ({exc.strerror}). The file "
                          "must exist on the driver and on every executor.") from None


def _pem(certificates) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def _pem_chain(data: bytes, option: str) -> list:
    from cryptography import x509

    try:
        chain = x509.load_pem_x509_certificates(data)
    except ValueError:
        chain = []
    if not chain:
        raise OptionError(f"Option '{option}' holds no PEM certificate "
                          "(-----BEGIN CERTIFICATE-----).")
    return chain


def _check_certificates(data: bytes, option: str) -> bytes:
    """``data``'s PEM certificates (other PEM blocks, e.g. a key, are left out)."""
    return _pem(_pem_chain(data, option))


def _pem_key(data: bytes, password, option: str):
    from cryptography.hazmat.primitives import serialization

    secret = reveal(password)
    start = data.find(b"-----BEGIN")
    while start >= 0:
        header_end = data.find(b"-----", start + 10)
        label = data[start + 11:header_end]
        if label.endswith(b"PRIVATE KEY"):
            end_marker = b"-----END " + label + b"-----"
            end = data.find(end_marker, header_end)
            block = data[start:end + len(end_marker)] if end >= 0 else data[start:]
            try:
                return serialization.load_pem_private_key(
                    block, secret.encode() if secret else None)
            except TypeError:  # encrypted without a password, or a password for a plain key
                raise OptionError(
                    f"The private key in '{option}' is "
                    + ("encrypted: set 'kafka.ssl.key.password'." if not secret else
                       "not encrypted: leave 'kafka.ssl.key.password' out.")) from None
            except ValueError:
                raise OptionError(f"Could not decrypt the private key in '{option}': "
                                  "'kafka.ssl.key.password' is wrong, or the key is damaged.") \
                    from None
        start = data.find(b"-----BEGIN", header_end)
    raise OptionError(f"Option '{option}' holds no PEM private key "
                      "(-----BEGIN PRIVATE KEY-----).")
