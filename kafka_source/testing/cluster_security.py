"""A client listener with authentication and encryption on every node of a test cluster.

Production clusters give clients a SASL_SSL listener (SCRAM on Confluent Platform, MSK and
Strimzi) and keep another one for the brokers' own traffic. A :class:`~.cluster.KafkaCluster`
started with ``secure=SecureListener()`` has both:

* ``PLAINTEXT`` stays the inter-broker listener and the one the harness and the scenarios' ground
  truth use, so that checking a scenario does not depend on the security code under test;
* ``SECURE`` (SASL_SSL, one SCRAM user) is the clients' one. Metadata asked on a listener names
  the brokers' addresses on that listener, so a client given :meth:`SecureListener.client_options`
  reaches every node, the new leader after a fault included, only through ``SECURE``.

``reauth_ms`` sets ``connections.max.reauth.ms`` on that listener (KIP-368, Kafka 2.2+): the
brokers then end every SASL session after that long, and a client must re-authenticate on the
open connection before its next request or lose the connection. Kafka's default (0) never
ends a session, which is why clients that never re-authenticate look fine until a cluster
sets it. The brokers count both outcomes (``socket-server-metrics``:
``successful-reauthentication-total``, ``expired-connections-killed-count``); see
:func:`kafka_source.testing.jmx.socket_server_metrics`.

The certificate authority, the brokers' key store (valid for ``127.0.0.1`` and ``localhost``,
shared by the nodes) and the CA's PEM file for clients are made by :meth:`SecureListener.prepare`
in the cluster's directory. SCRAM users live in the cluster's metadata: KRaft nodes get them when
their storage is formatted (``kafka-storage.sh format --add-scram``), a ZooKeeper-mode cluster
from ``kafka-configs.sh --zookeeper`` once its ZooKeeper runs.

The counters say only *that* a connection was closed for an expired session. Which request came
too late, and from which client, is in the broker's DEBUG line "Disconnect(ed|ing) expired channel:
<channel> : RequestHeader(apiKey=..., clientId=...)". So with ``reauth_ms`` every node also
writes those lines, and only those, to ``logs/expired-sessions.log``
(:meth:`SecureListener.log_options`; read back by :func:`expired_sessions`), and a scenario that
finds the counter above zero names the late request in its failure.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

__all__ = ["SecureListener", "expired_sessions"]

EXPIRED_LOG = "expired-sessions.log"
_EXPIRED_LINE = "expired channel: "  # "Disconnected ..." (Kafka 2.x), "Disconnecting ..." (4.x)

# Kafka 2.x-3.x (log4j 1): the distribution's file, its two INFO appenders kept at INFO, and the
# socket server's DEBUG lines about expired sessions in a file of their own.
_LOG4J1_ADDED = f"""
log4j.appender.stdout.Threshold=INFO
log4j.appender.kafkaAppender.Threshold=INFO
log4j.appender.expiredSessions=org.apache.log4j.FileAppender
log4j.appender.expiredSessions.File=${{kafka.logs.dir}}/{EXPIRED_LOG}
log4j.appender.expiredSessions.layout=org.apache.log4j.PatternLayout
log4j.appender.expiredSessions.layout.ConversionPattern=[%d] %m%n
log4j.appender.expiredSessions.filter.1=org.apache.log4j.varia.StringMatchFilter
log4j.appender.expiredSessions.filter.1.StringToMatch={_EXPIRED_LINE}
log4j.appender.expiredSessions.filter.1.AcceptOnMatch=true
log4j.appender.expiredSessions.filter.2=org.apache.log4j.varia.DenyAllFilter
log4j.logger.kafka.network.Processor=DEBUG, expiredSessions
"""

# Kafka 4 (log4j 2): merged into the distribution's log4j2.yaml (a composite configuration).
# The socket server's logger goes on to the server log at INFO and to its own file for the
# expired-session lines.
_LOG4J2_ADDED = f"""
appender.expiredSessions.type = File
appender.expiredSessions.name = ExpiredSessions
appender.expiredSessions.fileName = ${{sys:kafka.logs.dir}}/{EXPIRED_LOG}
appender.expiredSessions.layout.type = PatternLayout
appender.expiredSessions.layout.pattern = [%d] %m%n
appender.expiredSessions.filter.match.type = StringMatchFilter
appender.expiredSessions.filter.match.text = {_EXPIRED_LINE}
appender.expiredSessions.filter.match.onMatch = ACCEPT
appender.expiredSessions.filter.match.onMismatch = DENY
logger.processor.name = kafka.network.Processor
logger.processor.level = DEBUG
logger.processor.additivity = false
logger.processor.appenderRef.expired.ref = ExpiredSessions
logger.processor.appenderRef.server.ref = KafkaAppender
logger.processor.appenderRef.server.level = INFO
logger.processor.appenderRef.stdout.ref = STDOUT
logger.processor.appenderRef.stdout.level = INFO
"""


def expired_sessions(log_dir: str) -> list[str]:
    """The expired-session lines a node wrote to ``log_dir`` (see the module docstring)."""
    try:
        with open(os.path.join(log_dir, EXPIRED_LOG), encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f if _EXPIRED_LINE in line]
    except FileNotFoundError:
        return []

_STORE_PASSWORD = "cluster-store-secret"


@dataclass
class SecureListener:
    """The ``SECURE`` listener's settings; ``prepare(dir)`` makes its certificates."""

    user: str = "spark-etl"
    password: str = "scram-secret-for-tests"
    mechanism: str = "SCRAM-SHA-512"
    reauth_ms: int = 0
    name: str = "SECURE"
    ca_pem: str | None = None
    keystore: str | None = None

    def __post_init__(self) -> None:
        if self.mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ValueError(f"mechanism must be SCRAM-SHA-256 or SCRAM-SHA-512, not "
                             f"{self.mechanism!r}")
        if self.reauth_ms < 0:
            raise ValueError(f"reauth_ms must be 0 (sessions never end) or more, not "
                             f"{self.reauth_ms}")

    def prepare(self, directory: str) -> None:
        """The CA (``ca.pem``, for clients) and the brokers' PKCS12 key store, in ``directory``."""
        from .certs import CertificateAuthority, java_keystore

        os.makedirs(directory, exist_ok=True)
        ca = CertificateAuthority("pykafka cluster CA")
        self.ca_pem = ca.write_pem(os.path.join(directory, "ca.pem"))
        broker = ca.issue("kafka-broker", dns=("localhost",), ips=("127.0.0.1",))
        source = broker.write_pkcs12(os.path.join(directory, "broker-crypto.p12"),
                                     _STORE_PASSWORD, name="broker")
        # rewritten by keytool, as a Java user's store is (Kafka 2.2 reads it on Java 17)
        self.keystore = java_keystore(os.path.join(directory, "broker.p12"), source,
                                      _STORE_PASSWORD, _STORE_PASSWORD)

    @property
    def protocol_entry(self) -> str:
        """This listener's entry in ``listener.security.protocol.map``."""
        return f"{self.name}:SASL_SSL"

    def broker_properties(self) -> dict[str, str]:
        """What every node adds to its settings (besides the listener in ``listeners``)."""
        if self.keystore is None:
            raise RuntimeError("SecureListener.prepare() has not made the key store yet")
        prefix = f"listener.name.{self.name.lower()}."
        mechanism = self.mechanism.lower()
        props = {
            "sasl.enabled.mechanisms": self.mechanism,
            f"{prefix}ssl.keystore.type": "PKCS12",
            f"{prefix}ssl.keystore.location": self.keystore,
            f"{prefix}ssl.keystore.password": _STORE_PASSWORD,
            f"{prefix}ssl.key.password": _STORE_PASSWORD,
            f"{prefix}{mechanism}.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        }
        if self.reauth_ms:
            props[f"{prefix}{mechanism}.connections.max.reauth.ms"] = str(self.reauth_ms)
        return props

    def log_options(self, kafka_home: str, directory: str) -> str | None:
        """``KAFKA_LOG4J_OPTS`` for a node whose logs go to ``directory``: the distribution's
        log configuration plus the expired-session file, when sessions end (``reauth_ms``);
        None to keep the distribution's own."""
        if not self.reauth_ms:
            return None
        config = os.path.join(kafka_home, "config")
        os.makedirs(directory, exist_ok=True)
        log4j2 = os.path.join(config, "log4j2.yaml")
        if os.path.exists(log4j2):
            added = os.path.join(directory, "expired-sessions-log4j2.properties")
            with open(added, "w", encoding="utf-8") as f:
                f.write(_LOG4J2_ADDED)
            return f"-Dlog4j2.configurationFile={log4j2},{added}"
        with open(os.path.join(config, "log4j.properties"), encoding="utf-8") as f:
            base = f.read()
        merged = os.path.join(directory, "log4j-expired-sessions.properties")
        with open(merged, "w", encoding="utf-8") as f:
            f.write(base + _LOG4J1_ADDED)
        return f"-Dlog4j.configuration=file:{merged}"

    def format_args(self) -> list[str]:
        """``kafka-storage.sh format`` arguments that create the user (KRaft)."""
        return ["--add-scram", f"{self.mechanism}=[name={self.user},password={self.password}]"]

    def add_user_in_zookeeper(self, kafka_home: str, zookeeper_connect: str,
                              env: dict[str, str]) -> None:
        """Create the user in a ZooKeeper-mode cluster's ZooKeeper (before or after the brokers
        start: they watch it)."""
        result = subprocess.run(
            [os.path.join(kafka_home, "bin", "kafka-configs.sh"), "--zookeeper",
             zookeeper_connect, "--alter", "--entity-type", "users", "--entity-name", self.user,
             "--add-config", f"{self.mechanism}=[password={self.password}]"],
            capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise RuntimeError(f"kafka-configs.sh could not add the SCRAM user {self.user!r}: "
                               f"{result.stdout}{result.stderr}")

    def client_options(self, bootstrap_servers: str) -> dict[str, str]:
        """The connector's ``kafka.*`` options for this listener, as a Spark job on
        ``format("kafka")`` sets them (the CA as a PEM trust store, Kafka 2.7+'s form)."""
        return {
            "kafka.bootstrap.servers": bootstrap_servers,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": self.mechanism,
            "kafka.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{self.user}" password="{self.password}";',
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": self.ca_pem or "",
        }
