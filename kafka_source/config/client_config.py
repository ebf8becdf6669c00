"""Translate Spark-style ``kafka.*`` options into Kafka client settings.

Users copy ``kafka.*`` options from Spark's JVM source, so they arrive with Java consumer names
(``kafka.security.protocol``, ``kafka.sasl.jaas.config``, ``kafka.max.partition.fetch.bytes``).
This module strips the prefix, maps each name to the kafka-python connection setting or to a
setting of our own fetch loop, and rejects what cannot work in Python with a message that says
what to use instead. Unknown names are logged and ignored, as the Java consumer does.
"""

from __future__ import annotations

import logging
import re
from typing import Mapping

from ..errors import OptionError

log = logging.getLogger(__name__)

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
    "ssl.endpoint.identification.algorithm": ("ssl_check_hostname", None),  # special-cased
    "ssl.cafile": ("ssl_cafile", str),
    "ssl.certfile": ("ssl_certfile", str),
    "ssl.keyfile": ("ssl_keyfile", str),
    "ssl.password": ("ssl_password", str),
    "ssl.key.password": ("ssl_password", str),
    "ssl.crlfile": ("ssl_crlfile", str),
    # non-standard but convenient Python-side names
    "sasl.username": ("sasl_plain_username", str),
    "sasl.password": ("sasl_plain_password", str),
}

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

# Accepted and meaningful for Spark's JVM source, irrelevant to a Python reader: ignored quietly.
_IGNORED = {"group.id", "auto.offset.reset", "session.timeout.ms", "heartbeat.interval.ms",
            "max.poll.interval.ms", "max.poll.records", "receive.buffer.bytes",
            "send.buffer.bytes", "default.api.timeout.ms", "allow.auto.create.topics",
            "partition.assignment.strategy", "group.instance.id", "client.rack"}

_JVM_ONLY = {
    "ssl.truststore.location": "Java keystores can't be read from Python; export the CA "
                               "certificate to PEM and set 'kafka.ssl.cafile'",
    "ssl.keystore.location": "Java keystores can't be read from Python; export the client "
                             "certificate and key to PEM and set 'kafka.ssl.certfile' and "
                             "'kafka.ssl.keyfile'",
    "sasl.login.callback.handler.class": "Java callback handlers can't run in Python",
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

_JAAS = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _convert(name: str, raw: str, kind):
    text = str(raw).strip()
    if kind is int:
        try:
            value = int(text)
        except ValueError:
            raise OptionError(f"Option 'kafka.{name}' must be an integer, got '{raw}'.") from None
        if value < 0:
            raise OptionError(f"Option 'kafka.{name}' must not be negative, got '{raw}'.")
        return value
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise OptionError(f"Option 'kafka.{name}' must be 'true' or 'false', got '{raw}'.")
        return text.lower() == "true"
    return text


def _parse_jaas(text: str) -> dict[str, str]:
    """Pull username/password out of a Java JAAS line, e.g. PlainLoginModule or ScramLoginModule."""
    if "PlainLoginModule" not in text and "ScramLoginModule" not in text:
        raise OptionError("Option 'kafka.sasl.jaas.config' is only understood for "
                          "PlainLoginModule and ScramLoginModule (username/password); for other "
                          "mechanisms set 'kafka.sasl.mechanism' and the matching kafka.sasl.* "
                          "options.")
    fields = {k: v.replace('\\"', '"') for k, v in _JAAS.findall(text)}
    if "username" not in fields or "password" not in fields:
        raise OptionError("Option 'kafka.sasl.jaas.config' must contain username=\"...\" and "
                          "password=\"...\".")
    return {"sasl_plain_username": fields["username"], "sasl_plain_password": fields["password"]}


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
        elif name in _CONNECTION_SETTINGS:
            target, kind = _CONNECTION_SETTINGS[name]
            config[target] = _convert(name, raw, kind)
        elif name in _FETCH_SETTINGS:
            target, kind = _FETCH_SETTINGS[name]
            config[target] = _convert(name, raw, kind)
        elif name in _IGNORED:
            continue
        else:
            log.warning("Kafka option 'kafka.%s' is not known to pykafka and is ignored.", name)
    level = str(config["isolation_level"]).lower()
    if level not in ("read_uncommitted", "read_committed"):
        raise OptionError("Option 'kafka.isolation.level' must be 'read_uncommitted' or "
                          f"'read_committed', got '{config['isolation_level']}'.")
    config["isolation_level"] = level
    protocol = str(config.get("security_protocol", "PLAINTEXT")).upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise OptionError("Option 'kafka.security.protocol' must be one of PLAINTEXT, SSL, "
                          f"SASL_PLAINTEXT, SASL_SSL; got '{config['security_protocol']}'.")
    config["security_protocol"] = protocol
    return config


# The largest response frame the network layer accepts (kafka-python's own default is 1,000,000
# bytes, less than one full 1 MiB partition fetch). As kafka-python's consumer does, it is at
# least 100 MB and never below what a Fetch may return: fetch.max.bytes, or one partition's
# max.partition.fetch.bytes (a single record batch may exceed both, so there is headroom).
_MIN_RECEIVE_MESSAGE_MAX_BYTES = 100_000_000


def receive_message_max_bytes(config: Mapping[str, object]) -> int:
    fetch_max = int(config.get("fetch_max_bytes", DEFAULT_FETCH_SETTINGS["fetch_max_bytes"]))
    partition_max = int(config.get("max_partition_fetch_bytes",
                                   DEFAULT_FETCH_SETTINGS["max_partition_fetch_bytes"]))
    return max(_MIN_RECEIVE_MESSAGE_MAX_BYTES, 2 * max(fetch_max, partition_max) + (1 << 20))


def connection_settings(config: Mapping[str, object]) -> dict[str, object]:
    """The subset of ``config`` that configures the network client."""
    names = {target for target, _ in _CONNECTION_SETTINGS.values()}
    names.update({"ssl_check_hostname", "sasl_plain_username", "sasl_plain_password"})
    settings = {k: v for k, v in config.items() if k in names}
    settings["receive_message_max_bytes"] = receive_message_max_bytes(config)
    return settings
