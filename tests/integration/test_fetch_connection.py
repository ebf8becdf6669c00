"""The executors' dedicated Fetch connections over TLS and SASL, on a real Kafka broker.

kafka-python sets each fetch connection up (TLS handshake, SASL authentication) and the fetch
loop then reads its socket directly (:mod:`kafka_source.wire.net.fetch_connection`). This module
starts its own Apache Kafka from ``KAFKA_HOME`` (``KAFKA_ZK_HOME`` in ZooKeeper mode on the Kafka 2.2
pass, see ``start_local_broker``) with SASL_PLAINTEXT, SSL and SASL_SSL listeners (PLAIN and
SCRAM-SHA-256, a test CA made with ``openssl``, SASL re-authentication every few seconds) and
reads through every listener. Without a distribution it skips, saying so (CI sets one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from kafka_source.config.client_config import client_config_from_options
from kafka_source.read.fetcher import FetchSettings, RangeFetcher
from kafka_source.read.offsets import OffsetRange
from kafka_source.testing import (create_topic, local_distribution, start_local_broker,
                                   unique_topic_name)
from kafka_source.wire.net.client import BrokerClient

from .test_batch_read import produce, varied_records

pytestmark = pytest.mark.skip_on_embedded(
    "starts a real Kafka of its own from KAFKA_HOME with TLS and SASL listeners; it ran in the "
    "real-Kafka pass (the embedded broker has no such listeners)")

PASSWORD = "keystore-secret"
REAUTH_MS = 3000
JAAS_PLAIN = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
              'username="admin" password="admin-secret" user_admin="admin-secret" '
              'user_alice="alice-secret";')
JAAS_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def make_certificates(directory: str) -> tuple[str, str]:
    """A test CA (PEM) and a PKCS12 keystore for a broker at 127.0.0.1 signed by it."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True,
                       timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=pykafka test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", "/CN=127.0.0.1")
    with open(os.path.join(directory, "san.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "broker.pem", "-days", "2", "-extfile", "san.cnf")
    run("pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key", "-out", "broker.p12",
        "-passout", f"pass:{PASSWORD}", "-name", "broker")
    return os.path.join(directory, "ca.pem"), os.path.join(directory, "broker.p12")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """(broker, CA file) with SASL_PLAINTEXT, SSL and SASL_SSL listeners."""
    if local_distribution() is None:
        pytest.skip("needs a local Apache Kafka for TLS/SASL listeners: set KAFKA_HOME "
                    "(CI uses ../shared/kafka) or KAFKA_ZK_HOME")
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")

    cafile, keystore = make_certificates(str(tmp_path_factory.mktemp("certs")))
    properties = {
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "connections.max.reauth.ms": str(REAUTH_MS),
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": keystore,
        "ssl.keystore.password": PASSWORD,
        "ssl.key.password": PASSWORD,
    }
    for listener in ("sasl_plaintext", "sasl_ssl"):
        properties[f"listener.name.{listener}.plain.sasl.jaas.config"] = JAAS_PLAIN
        properties[f"listener.name.{listener}.scram-sha-256.sasl.jaas.config"] = JAAS_SCRAM
    broker = start_local_broker(
        listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT", "SSL": "SSL", "SASL_SSL": "SASL_SSL"},
        properties=properties, scram_users=[("SCRAM-SHA-256", "alice", "alice-secret")])
    try:
        yield broker, cafile
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def topic(secured):
    broker, _ = secured
    name = unique_topic_name("secured")
    create_topic(broker.bootstrap_servers, name, partitions=3)
    produce(broker.bootstrap_servers, name, varied_records(900), partition_of=lambda i: i % 3,
            compression="lz4")
    return name


def config(secured, listener, mechanism=None, password=None):
    broker, cafile = secured
    opts = {"kafka.bootstrap.servers": broker.address(listener),
            "kafka.security.protocol": listener}
    if "SSL" in listener:
        opts["kafka.ssl.cafile"] = cafile
    if mechanism == "PLAIN":
        opts["kafka.sasl.mechanism"] = "PLAIN"
        opts["kafka.sasl.jaas.config"] = (
            'org.apache.kafka.common.security.plain.PlainLoginModule required '
            f'username="alice" password="{password or "alice-secret"}";')
    elif mechanism:
        opts["kafka.sasl.mechanism"] = mechanism
        opts["kafka.sasl.jaas.config"] = (
            'org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="alice" password="{password or "alice-secret"}";')
    return client_config_from_options(opts)


def read_offsets(config_, ranges, **kw):
    settings = FetchSettings.from_config(config_, poll_timeout_ms=kw.pop("poll_timeout_ms", 30_000),
                                         fail_on_data_loss=True)
    with BrokerClient(config_) as client:
        fetcher = RangeFetcher(client, settings)
        rows = sorted((b, o) for batch in fetcher.read_arrow(ranges, include_headers=True)
                      for b, o in zip(batch.column("partition").to_pylist(),
                                      batch.column("offset").to_pylist()))
        return rows, list(client.fetch_connections()._conns.values())


@pytest.mark.parametrize("listener,mechanism", [
    ("PLAINTEXT", None), ("SASL_PLAINTEXT", "PLAIN"), ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SSL", None), ("SASL_SSL", "SCRAM-SHA-256"),
])
def test_fetch_connections_work_over_every_security_protocol(secured, topic, listener,
                                                             mechanism):
    ranges = [OffsetRange(topic, p, 0, 300) for p in range(3)]
    rows, conns = read_offsets(config(secured, listener, mechanism), ranges)
    assert rows == [(p, o) for p in range(3) for o in range(300)]
    (conn,) = conns                        # one leader: one connection for all partitions
    assert conn.version >= 7 and conn.session.session_id != 0      # a fetch session
    if mechanism:                          # the broker's SASL session lifetime is known
        assert conn.expires_at < time.monotonic() + REAUTH_MS / 1000


def test_sasl_sessions_expiring_mid_read_are_replaced_by_new_connections(secured, topic):
    cfg = config(secured, "SASL_SSL", "PLAIN")
    settings = FetchSettings.from_config({**cfg, "max_partition_fetch_bytes": 2048},
                                         poll_timeout_ms=30_000, fail_on_data_loss=True)
    opened = []
    with BrokerClient(cfg) as client:
        real_open = client.open_fetch_connection

        def counting_open(node_id):
            opened.append(node_id)
            return real_open(node_id)

        client.open_fetch_connection = counting_open
        fetcher = RangeFetcher(client, settings)
        offsets = []
        for batch in fetcher.read_arrow([OffsetRange(topic, 0, 0, 300)], include_headers=False):
            if not offsets:                # a slow consumer: outlive the SASL session
                time.sleep(REAUTH_MS / 1000)
            offsets.extend(batch.column("offset").to_pylist())
    assert offsets == list(range(300))
    assert len(opened) >= 2                # reconnected (and re-authenticated) on the way


def test_spark_batch_read_over_sasl_ssl(spark, secured, topic):
    broker, cafile = secured
    df = (spark.read.format("pykafka")
          .option("kafka.bootstrap.servers", broker.address("SASL_SSL"))
          .option("kafka.security.protocol", "SASL_SSL")
          .option("kafka.ssl.cafile", cafile)
          .option("kafka.sasl.mechanism", "SCRAM-SHA-256")
          .option("kafka.sasl.jaas.config",
                  'org.apache.kafka.common.security.scram.ScramLoginModule required '
                  'username="alice" password="alice-secret";')
          .option("subscribe", topic).load())
    row = df.selectExpr("count(*) AS n", "count(DISTINCT partition, offset) AS d").first()
    assert (row.n, row.d) == (900, 900)
