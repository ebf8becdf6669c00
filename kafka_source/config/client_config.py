"""Translate Spark-style ``kafka.*`` options into Kafka client settings.

Users copy ``kafka.*`` options from Spark's JVM source, so they arrive with Java consumer names
(``kafka.security.protocol``, ``kafka.sasl.jaas.config``, ``kafka.max.partition.fetch.bytes``).
This module strips the prefix, maps each name to the kafka-python connection setting or to a
setting of our own fetch loop, and rejects what cannot work in Python with a message that says
what to use instead. Unknown names are logged and ignored, as the Java consumer does.

Security options keep their Java names and meanings: ``kafka.sasl.jaas.config`` (Plain and SCRAM
login modules; the OAuthBearer login module with the OAUTHBEARER options, read by
:mod:`kafka_source.config.oauthbearer`), ``kafka.ssl.truststore.*`` and ``kafka.ssl.keystore.*``
(PKCS12 and PEM stores, PEM inline), ``kafka.ssl.key.password``, plus kafka-python's PEM file
names (``kafka.ssl.cafile``, ``certfile``, ``keyfile``). Passwords and key material are wrapped in
:class:`~kafka_source.config.secrets.Secret` here, the moment they are read, so that no later
``repr`` can show them. The SASL settings are checked for consistency here (mechanism against
login module, credentials present); the TLS settings name files, which are read and checked by
:mod:`kafka_source.wire.net.tls` where a connection is made.
"""

from __future__ import annotations

import logging
import re
from typing import Mapping

from ..errors import OptionError
from . import oauthbearer
from .secrets import Secret
from .values import convert

log = logging.getLogger(__name__)

# The longest pause before reconnecting to a broker, unless 'kafka.reconnect.backoff.max.ms' says
# otherwise: Java's clients' default. kafka-python's is 30 s, and a pause doubles with every
# refused connection, so a broker that was down for 20 s (a KRaft broker's restart) was asked
# again only after its next pause of up to 30 s: a batch read planned during a restart waited
# past the restart, or failed with ECONNREFUSED long after the broker was back.
RECONNECT_BACKOFF_MAX_MS = 1000

# Settings of the network client (kafka-python's connection manager), by Java name.
_CONNECTION_SETTINGS = {
    "bootstrap.servers": ("bootstrap_servers", str),
    "client.id": ("client_id", str),
    "request.timeout.ms": ("request_timeout_ms", int),
    "socket.connection.setup.timeout.ms": ("socket_connection_setup_timeout_ms", int),
    "socket.connection.setup.timeout.max.ms": ("socket_connection_setup_timeout_max_ms", int),
    "reconnect.backoff.ms": ("reconnect_backoff_ms", int),
    "reconnect.backoff.max.ms": ("reconnect_backoff_max_ms", int),
    "connections.max.idle.ms": ("connections_max_idle_ms", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
    "client.dns.lookup": ("client_dns_lookup", str),
    "security.protocol": ("security_protocol", str),
    "sasl.mechanism": ("sasl_mechanism", str),
    "sasl.kerberos.service.name": ("sasl_kerberos_service_name", str),
    # non-standard but convenient Python-side names
    "sasl.username": ("sasl_plain_username", str),
    "sasl.password": ("sasl_plain_password", Secret),
    # kafka-python's name (the Java consumer has no such limit): the largest response accepted,
    # never below what the fetch sizes need (see receive_message_max_bytes below)
    "receive.message.max.bytes": ("receive_message_max_bytes", int),
}

# TLS settings, read by kafka_source.wire.net.tls into an ssl.SSLContext (not by kafka-python).
# Java's names; ssl.cafile/certfile/keyfile/password/crlfile are kafka-python's PEM file names.
_TLS_SETTINGS = {
    "ssl.truststore.location": ("ssl_truststore_location", str),
    "ssl.truststore.type": ("ssl_truststore_type", str),
    "ssl.truststore.password": ("ssl_truststore_password", Secret),
    "ssl.truststore.certificates": ("ssl_truststore_certificates", Secret),
    "ssl.keystore.location": ("ssl_keystore_location", str),
    "ssl.keystore.type": ("ssl_keystore_type", str),
    "ssl.keystore.password": ("ssl_keystore_password", Secret),
    "ssl.keystore.key": ("ssl_keystore_key", Secret),
    "ssl.keystore.certificate.chain": ("ssl_keystore_certificate_chain", Secret),
    "ssl.key.password": ("ssl_key_password", Secret),
    "ssl.password": ("ssl_key_password", Secret),
    "ssl.cafile": ("ssl_cafile", str),
    "ssl.certfile": ("ssl_certfile", str),
    "ssl.keyfile": ("ssl_keyfile", str),
    "ssl.crlfile": ("ssl_crlfile", str),
}

#: The client settings that name a secret (their values are :class:`Secret`).
SECRET_SETTINGS = frozenset(target for table in (_CONNECTION_SETTINGS, _TLS_SETTINGS)
                            for target, kind in table.values() if kind is Secret)
#: The options whose values are secrets, by option name (``kafka.`` prefix, lower case).
SECRET_OPTIONS = frozenset(["kafka.sasl.jaas.config"] + [
    f"kafka.{name}" for table in (_CONNECTION_SETTINGS, _TLS_SETTINGS)
    for name, (_, kind) in table.items() if kind is Secret])
TLS_SETTINGS = frozenset(target for target, _ in _TLS_SETTINGS.values()) | {"ssl_check_hostname"}

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# SASL mechanisms whose credentials can be given as options (GSSAPI takes them from a Kerberos
# ticket cache; kafka-python needs the 'gssapi' package for it).
_PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_MECHANISMS = _PASSWORD_MECHANISMS + ("OAUTHBEARER", "GSSAPI")
_LOGIN_MODULE_MECHANISMS = {"PlainLoginModule": ("PLAIN",),
                            "ScramLoginModule": ("SCRAM-SHA-256", "SCRAM-SHA-512"),
                            "OAuthBearerLoginModule": ("OAUTHBEARER",)}

# Settings of our own fetch loop (executor side), by Java consumer name.
_FETCH_SETTINGS = {
    "isolation.level": ("isolation_level", str),
    "check.crcs": ("check_crcs", bool),
    "fetch.max.bytes": ("fetch_max_bytes", int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", int),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", int),
    "fetch.min.bytes": ("fetch_min_bytes", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
}

# The consumer-group settings of a stream, read by config/options.py (GroupOptions), not by the
# client: a stream's group member uses them; batch reads and the sink ignore them.
_GROUP_SETTINGS = {"group.id", "group.instance.id", "auto.offset.reset", "session.timeout.ms",
                   "heartbeat.interval.ms", "max.poll.interval.ms", "default.api.timeout.ms",
                   "group.protocol", "group.remote.assignor"}

# Accepted and meaningful for Spark's JVM source, irrelevant to a Python reader: ignored quietly.
_IGNORED = _GROUP_SETTINGS | {
    "max.poll.records", "receive.buffer.bytes", "send.buffer.bytes", "allow.auto.create.topics",
    "partition.assignment.strategy", "client.rack"}

_JVM_ONLY = {
    "sasl.client.callback.handler.class": "Java callback handlers can't run in Python",
}

DEFAULT_FETCH_SETTINGS = {
    "isolation_level": "read_uncommitted",
    "check_crcs": True,
    "fetch_max_bytes": 52_428_800,
    # 8 MiB, not the Java consumer's 1 MiB: each Fetch round costs the fetch loop a fixed amount
    # of Python work, and the decoder handles a partition's records in chunks of up to 8 MiB.
    # Measured on a 1 GB partition of 1000-byte records: 0.40 CPU-seconds per GB with 8 MiB
    # against 0.80 with 1 MiB. The last request of a range asks for less (see read/fetcher.py).
    "max_partition_fetch_bytes": 8 << 20,
    "fetch_max_wait_ms": 500,
    "fetch_min_bytes": 1,
    "retry_backoff_ms": 100,
}

# key="value" or key='value' (Kafka's JAAS parser takes both quotes)
_JAAS = re.compile(r"""([\w.]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')""")


def _parse_jaas(text: str) -> dict[str, object]:
    """Username, password and login module of a Java JAAS line (Plain or SCRAM login module),
    or the fields of an OAuthBearerLoginModule line (``sasl_oauth_jaas``, turned into the
    OAUTHBEARER login by :func:`_check_sasl`).

    Never puts any part of ``text`` into an error message: it holds a password.
    """
    modules = [m for m in _LOGIN_MODULE_MECHANISMS if m in text]
    if len(modules) != 1:
        raise OptionError("Option 'kafka.sasl.jaas.config' is only understood for "
                          "PlainLoginModule and ScramLoginModule (username/password) and "
                          "OAuthBearerLoginModule; for GSSAPI set 'kafka.sasl.mechanism' and "
                          "'kafka.sasl.kerberos.service.name'.")
    fields = {k: (dq if dq or not sq else sq).replace('\\"', '"').replace("\\'", "'")
              for k, dq, sq in _JAAS.findall(text)}
    if modules[0] == "OAuthBearerLoginModule":
        return {"sasl_oauth_jaas": fields, "sasl_login_module": modules[0]}
    if "username" not in fields or "password" not in fields:
        raise OptionError("Option 'kafka.sasl.jaas.config' must contain username=\"...\" and "
                          "password=\"...\".")
    return {"sasl_plain_username": fields["username"],
            "sasl_plain_password": Secret(fields["password"]),
            "sasl_login_module": modules[0]}


def _check_sasl(config: dict[str, object], oauth_options: Mapping[str, object]) -> None:
    """The SASL settings fit together: a mechanism we can speak, credentials it can use.
    ``oauth_options``: the OAUTHBEARER login options given (Java names, no ``kafka.``)."""
    protocol = config["security_protocol"]
    mechanism = config.get("sasl_mechanism")
    module = config.pop("sasl_login_module", None)
    oauth_jaas = config.pop("sasl_oauth_jaas", None)
    if oauth_options and str(mechanism or "").upper() != "OAUTHBEARER":
        oauthbearer.check_handler(oauth_options.get("sasl.login.callback.handler.class"))
        log.warning("%s: only for 'kafka.sasl.mechanism' OAUTHBEARER, ignored.",
                    ", ".join(f"'kafka.{n}'" for n in sorted(oauth_options)))
    if not protocol.startswith("SASL_"):
        given = [n for n, v in (("kafka.sasl.mechanism", mechanism),
                                ("kafka.sasl.jaas.config", module)) if v]
        if given:
            log.warning("%s %s set but 'kafka.security.protocol' is %s, so no SASL "
                        "authentication takes place; use SASL_SSL or SASL_PLAINTEXT to "
                        "authenticate.", " and ".join(f"'{n}'" for n in given),
                        "are" if len(given) > 1 else "is", protocol)
        return
    if not mechanism:
        hint = (f" ({' or '.join(_LOGIN_MODULE_MECHANISMS[module])} for the {module} in "
                "'kafka.sasl.jaas.config')" if module else "")
        raise OptionError(f"Option 'kafka.sasl.mechanism' is required with "
                          f"'kafka.security.protocol' {protocol}: one of "
                          f"{', '.join(SASL_MECHANISMS)}{hint}.")
    mechanism = str(mechanism).upper()
    if mechanism not in SASL_MECHANISMS:
        raise OptionError(f"Option 'kafka.sasl.mechanism' is '{config['sasl_mechanism']}'; "
                          f"supported are {', '.join(SASL_MECHANISMS)}.")
    config["sasl_mechanism"] = mechanism
    if module and mechanism not in _LOGIN_MODULE_MECHANISMS[module]:
        raise OptionError(f"Option 'kafka.sasl.jaas.config' uses {module}, which does not go with "
                          f"'kafka.sasl.mechanism' {mechanism}: {module} is for "
                          f"{' or '.join(_LOGIN_MODULE_MECHANISMS[module])}.")
    if mechanism in _PASSWORD_MECHANISMS and not (config.get("sasl_plain_username")
                                                  and config.get("sasl_plain_password")):
        raise OptionError(f"SASL mechanism {mechanism} needs a username and password: set "
                          "'kafka.sasl.jaas.config', e.g. org.apache.kafka.common.security."
                          + ("plain.PlainLoginModule" if mechanism == "PLAIN"
                             else "scram.ScramLoginModule")
                          + ' required username="..." password="...";')
    if mechanism == "OAUTHBEARER":
        config["sasl_oauthbearer"] = oauthbearer.oauthbearer_login(
            oauth_jaas, oauth_options, tls=_jaas_tls(oauth_jaas or {}))


def _jaas_tls(fields: Mapping[str, str]) -> tuple[tuple[str, object], ...]:
    """The TLS settings for the OAuth token endpoint: ``ssl.*`` options inside the JAAS line,
    as Java's OAuthBearerLoginCallbackHandler takes them (a private CA's trust store, ...)."""
    out: list[tuple[str, object]] = []
    for name, text in fields.items():
        if not name.startswith("ssl."):
            continue
        if name == "ssl.endpoint.identification.algorithm":
            out.append(("ssl_check_hostname", text.strip().lower() == "https"))
            continue
        if name not in _TLS_SETTINGS:
            raise OptionError(f"Option 'kafka.sasl.jaas.config' has {name}, which is not a TLS "
                              "setting pykafka knows for the token endpoint: use "
                              "ssl.truststore.location, ssl.truststore.type, "
                              "ssl.truststore.password, ssl.truststore.certificates or "
                              "ssl.endpoint.identification.algorithm (and ssl.keystore.* for "
                              "a client certificate).")
        target, kind = _TLS_SETTINGS[name]
        out.append((target, convert(name, text, kind)))
    return tuple(sorted(out, key=lambda item: item[0]))


def client_config_from_options(opts: Mapping[str, str]) -> dict[str, object]:
    """Return the client settings for the lower-cased option map ``opts``."""
    servers = str(opts.get("kafka.bootstrap.servers", "")).strip()
    if not servers:
        raise OptionError("Option 'kafka.bootstrap.servers' is required: a comma-separated list "
                          "of host:port, for example 'broker1:9092,broker2:9092'.")
    for server in servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit():
            raise OptionError(f"Option 'kafka.bootstrap.servers' has '{server.strip()}', which is "
                              "not host:port.")
    config: dict[str, object] = dict(DEFAULT_FETCH_SETTINGS)
    config["client_id"] = "pykafka"
    oauth_options: dict[str, object] = {}
    for key, raw in opts.items():
        if not key.startswith("kafka."):
            continue
        name = key[len("kafka."):]
        if name in _JVM_ONLY:
            raise OptionError(f"Option 'kafka.{name}' is not supported: {_JVM_ONLY[name]}.")
        if name == "sasl.jaas.config":
            config.update(_parse_jaas(str(raw)))
        elif name == "ssl.endpoint.identification.algorithm":
            config["ssl_check_hostname"] = str(raw).strip().lower() == "https"
        elif name in _CONNECTION_SETTINGS or name in _TLS_SETTINGS:
            target, kind = _CONNECTION_SETTINGS.get(name) or _TLS_SETTINGS[name]
            config[target] = convert(name, raw, kind)
        elif name in _FETCH_SETTINGS:
            target, kind = _FETCH_SETTINGS[name]
            config[target] = convert(name, raw, kind)
        elif name in oauthbearer.OPTIONS:
            oauth_options[name] = raw
        elif name in _IGNORED or name in oauthbearer.IGNORED:
            continue
        else:
            log.warning("Kafka option 'kafka.%s' is not known to pykafka and is ignored.", name)
    level = str(config["isolation_level"]).lower()
    if level not in ("read_uncommitted", "read_committed"):
        raise OptionError("Option 'kafka.isolation.level' must be 'read_uncommitted' or "
                          f"'read_committed', got '{config['isolation_level']}'.")
    config["isolation_level"] = level
    protocol = str(config.get("security_protocol", "PLAINTEXT")).upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise OptionError("Option 'kafka.security.protocol' must be one of PLAINTEXT, SSL, "
                          f"SASL_PLAINTEXT, SASL_SSL; got '{config['security_protocol']}'.")
    config["security_protocol"] = protocol
    _check_sasl(config, oauth_options)
    tls_given = sorted(k for k in config if k in TLS_SETTINGS and k != "ssl_check_hostname")
    if tls_given and not uses_tls(config):
        log.warning("TLS options are set but 'kafka.security.protocol' is %s, so they are not "
                    "used; use SSL or SASL_SSL for TLS.", protocol)
    return config


def uses_tls(config: Mapping[str, object]) -> bool:
    return config.get("security_protocol") in ("SSL", "SASL_SSL")


# The largest response the network layer accepts (kafka-python's own default is 1,000,000 bytes,
# less than one full 1 MiB partition fetch). A limit at all guards against garbage read as a size
# (a TLS alert read by a plaintext client announces some 350 MB) that would allocate and wait for
# that many bytes. It is 100 MB by default, as in kafka-python's consumer, or what the option
# 'kafka.receive.message.max.bytes' says; and never below what a Fetch asks for: twice the larger
# of fetch.max.bytes and max.partition.fetch.bytes, plus headroom. Twice, because Kafka returns the
# first record batch of a response whole even when it is larger than both (KIP-74): a response
# can be as large as the largest batch a topic allows (its max.message.bytes). The fetch
# connection applies the same rule per request, so a partition byte limit the fetcher grew
# raises the limit of the responses to it (kafka_source/wire/net/fetch_connection.py).
DEFAULT_RECEIVE_MESSAGE_MAX_BYTES = 100_000_000
_RESPONSE_HEADROOM = 1 << 20


def fetch_response_limit(asked_bytes: int, receive_max_bytes: int) -> int:
    """The largest response accepted to a Fetch that asks for up to ``asked_bytes`` (its
    ``max_bytes`` or a partition's byte limit, whichever is larger) on a connection whose
    receive limit is ``receive_max_bytes``."""
    return max(receive_max_bytes, 2 * asked_bytes + _RESPONSE_HEADROOM)


def fetch_size_for_response(size: int) -> int:
    """The fetch size (max.partition.fetch.bytes or fetch.max.bytes) that makes a response of
    ``size`` bytes acceptable whatever the receive limit: the inverse of
    :func:`fetch_response_limit`."""
    return max(0, -(-(size - _RESPONSE_HEADROOM) // 2))


def receive_message_max_bytes(config: Mapping[str, object]) -> int:
    """The receive limit of the connections of ``config``: 'kafka.receive.message.max.bytes'
    (default 100 MB), but at least what a Fetch with the configured sizes needs."""
    fetch_max = int(config.get("fetch_max_bytes", DEFAULT_FETCH_SETTINGS["fetch_max_bytes"]))
    partition_max = int(config.get("max_partition_fetch_bytes",
                                   DEFAULT_FETCH_SETTINGS["max_partition_fetch_bytes"]))
    given = config.get("receive_message_max_bytes")
    floor = DEFAULT_RECEIVE_MESSAGE_MAX_BYTES if given is None else int(given)
    return fetch_response_limit(max(fetch_max, partition_max), floor)


def connection_settings(config: Mapping[str, object]) -> dict[str, object]:
    """The subset of ``config`` that configures connections: kafka-python's network client
    settings and the TLS settings (:mod:`kafka_source.wire.net.tls`). Secrets stay wrapped."""
    names = ({target for target, _ in _CONNECTION_SETTINGS.values()} | TLS_SETTINGS
             | {"sasl_oauthbearer"})
    settings = {k: v for k, v in config.items() if k in names}
    settings["receive_message_max_bytes"] = receive_message_max_bytes(config)
    settings.setdefault("reconnect_backoff_max_ms", RECONNECT_BACKOFF_MAX_MS)
    return settings
