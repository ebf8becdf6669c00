"""TLS and SASL end to end through Spark, on a real Apache Kafka with secured listeners.

One broker for the whole module (started from ``KAFKA_HOME``, or in ZooKeeper mode from
``KAFKA_ZK_HOME`` on the Kafka 2.2 pass: see ``start_local_broker``) has a listener for each case:
SASL_PLAINTEXT and SASL_SSL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), SSL, SSL requiring a client
certificate (mutual TLS), SSL with a certificate for another host name, SSL with a self-signed
certificate, and SASL_PLAINTEXT with only PLAIN enabled. SASL_PLAINTEXT and SASL_SSL take
OAUTHBEARER too, with the brokers' default validator of unsigned tokens: tokens come from a local
OAuth token endpoint (``kafka_source.testing.oauth``, the client-credentials grant) or are made
by the client (unsecured login); the brokers end OAUTHBEARER sessions when their token expires
(``connections.max.reauth.ms``, KIP-368), so a token's expiry is felt as in production.
The CA, the certificates and the stores
(PEM, PKCS12 written by cryptography and by Java's keytool, JKS) are made here. The broker's own
stores are PKCS12, which every supported Kafka reads (PEM stores came with Kafka 2.7, KIP-651).

* Batch reads and streams (Trigger.AvailableNow as a consumer-group member, so the group
  coordinator's connection is secured too) work with each way of configuring security.
* What cannot work fails at once -- far sooner than ``kafka.request.timeout.ms`` -- with the real
  cause and the option that fixes it.
* No secret shows up in logs, exceptions, ``explain()``, query progress, offsets or checkpoints:
  a child process (tests/integration/leak_probe.py) runs reads and streams with DEBUG logging in
  every Python process, Spark's INFO log and event log, and prints every channel; the tests
  below look for the secrets in all of it.

The embedded Tansu broker has no TLS or SASL listeners to configure: without a Kafka distribution
(``KAFKA_HOME``, ``KAFKA_ZK_HOME``) these tests skip, and they do not run again in CI's
embedded-broker pass.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import random
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import kafka.net.connection as kafka_connection
import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import MetadataRequest

from kafka_source import spark_features
from kafka_source.config.client_config import client_config_from_options
from kafka_source.errors import BrokerSecurityError
from kafka_source.read.executor import read_input_partition
from kafka_source.read.offsets import OffsetRange
from kafka_source.read.planning import KafkaInputPartition, ReadSettings
from kafka_source.testing import (create_topic, local_distribution, start_local_broker,
                                   unique_topic_name)
from kafka_source.testing.certs import (CertificateAuthority, java_keystore, java_truststore,
                                        keytool_available)
from kafka_source.testing.oauth import TokenEndpoint
from kafka_source.wire.net.client import BrokerClient

from .spark_workers import spark_worker_env
from .test_stream import committed, produce_counts, run_available_now, sink_rows

pytestmark = pytest.mark.integration

PER_PARTITION = {0: 7, 1: 5}
EXPECTED = sorted((p, i, f"p{p}-{i}") for p, n in PER_PARTITION.items() for i in range(n))
USER, USER_PASSWORD = "alice", "LeakCanary-alice-7c1f"        # PLAIN and SCRAM-SHA-256/512
ONLY_256, ONLY_256_PASSWORD = "bob", "LeakCanary-bob-2e9d"   # SCRAM-SHA-256 credentials only
STORE_PASSWORD = "LeakCanary-store-51b0"
BROKER_STORE_PASSWORD = "broker-store-secret"                # the broker's own stores
KEY_PASSWORD = "LeakCanary-key-88a4"
CLIENT_ID, CLIENT_SECRET = "spark-etl", "LeakCanary-oauth-client-4b7e"   # the token endpoint's
OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required"
OIDC_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
# Far longer than any of these tests may take: a failure must not wait it out.
LONG_TIMEOUT_MS = 300_000


def _skip_reason() -> str | None:
    if os.environ.get("PYKAFKA_TEST_BROKER", "").strip().lower() == "embedded":
        return ("the embedded Tansu broker has no TLS or SASL listeners; these tests start a real "
                "Kafka from KAFKA_HOME and run in the real-Kafka pass")
    if local_distribution() is None:
        return ("needs KAFKA_HOME (an Apache Kafka distribution; or KAFKA_ZK_HOME for ZooKeeper "
                "mode): these tests start their own broker with SASL and TLS listeners")
    if not keytool_available():
        return "needs the JDK's keytool to write Java key stores"
    return None


def jaas(mechanism: str, user: str = USER, password: str = USER_PASSWORD) -> str:
    if mechanism == "OAUTHBEARER":  # client credentials for the token endpoint
        return f'{OAUTH_MODULE} clientId="{user}" clientSecret="{password}" scope="kafka";'
    module = ("plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule")
    return (f"org.apache.kafka.common.security.{module} required username=\"{user}\" "
            f"password=\"{password}\";")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """The secured broker, its CA and stores, and a topic with records (produced in clear)."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    d = tmp_path_factory.mktemp("security")
    ca = CertificateAuthority()
    files = {"ca.pem": ca.write_pem(str(d / "ca.pem"))}
    broker_stores = {}
    for name, identity in {
            "broker": ca.issue("broker", dns=("localhost",), ips=("127.0.0.1",)),
            "badname": ca.issue("elsewhere", dns=("kafka.example.invalid",)),
            "selfsigned": CertificateAuthority.self_signed("broker", dns=("localhost",),
                                                           ips=("127.0.0.1",))}.items():
        source = identity.write_pkcs12(str(d / f"{name}-crypto.p12"), BROKER_STORE_PASSWORD,
                                       name=name)
        broker_stores[name] = java_keystore(str(d / f"{name}.p12"), source,
                                            BROKER_STORE_PASSWORD, BROKER_STORE_PASSWORD)
    broker_trust = java_truststore(str(d / "broker-truststore.p12"), files["ca.pem"],
                                   BROKER_STORE_PASSWORD)
    client = ca.issue("client", client=True)
    files["client-key.pem"] = client.write_pem(str(d / "client-key.pem"),
                                               key_password=KEY_PASSWORD)
    crypto_p12 = client.write_pkcs12(str(d / "client-crypto.p12"), STORE_PASSWORD)
    files["keystore.p12"] = java_keystore(str(d / "keystore.p12"), crypto_p12, STORE_PASSWORD,
                                          STORE_PASSWORD)
    files["truststore.p12"] = java_truststore(str(d / "truststore.p12"), files["ca.pem"],
                                              STORE_PASSWORD)
    files["truststore.jks"] = java_truststore(str(d / "truststore.jks"), files["ca.pem"],
                                              STORE_PASSWORD, store_type="JKS")
    files["client"] = client
    listeners = {"SASL_PLAINTEXT": "SASL_PLAINTEXT", "SASL_SSL": "SASL_SSL", "SSL": "SSL",
                 "MTLS": "SSL", "BADNAME": "SSL", "SELFSIGNED": "SSL",
                 "PLAINONLY": "SASL_PLAINTEXT"}
    props = {"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
             "ssl.keystore.type": "PKCS12", "ssl.keystore.location": broker_stores["broker"],
             "ssl.keystore.password": BROKER_STORE_PASSWORD,
             "ssl.key.password": BROKER_STORE_PASSWORD,
             "listener.name.mtls.ssl.client.auth": "required",
             "listener.name.mtls.ssl.truststore.type": "PKCS12",
             "listener.name.mtls.ssl.truststore.location": broker_trust,
             "listener.name.mtls.ssl.truststore.password": BROKER_STORE_PASSWORD,
             "listener.name.badname.ssl.keystore.location": broker_stores["badname"],
             "listener.name.selfsigned.ssl.keystore.location": broker_stores["selfsigned"],
             "listener.name.plainonly.sasl.enabled.mechanisms": "PLAIN"}
    plain = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
             f'user_{USER}="{USER_PASSWORD}";')
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    for listener in ("sasl_plaintext", "sasl_ssl", "plainonly"):
        props[f"listener.name.{listener}.plain.sasl.jaas.config"] = plain
        for mechanism in ("scram-sha-256", "scram-sha-512"):
            props[f"listener.name.{listener}.{mechanism}.sasl.jaas.config"] = scram
    for listener in ("sasl_plaintext", "sasl_ssl"):
        # no sasl.server.callback.handler.class: the default validator, of unsigned tokens
        props[f"listener.name.{listener}.oauthbearer.sasl.jaas.config"] = f"{OAUTH_MODULE};"
        # end a session when its token expires (Kafka's default, 0, never does)
        props[f"listener.name.{listener}.oauthbearer.connections.max.reauth.ms"] = "3600000"
    scram_users = [("SCRAM-SHA-256", USER, USER_PASSWORD), ("SCRAM-SHA-512", USER, USER_PASSWORD),
                   ("SCRAM-SHA-256", ONLY_256, ONLY_256_PASSWORD)]
    idp = TokenEndpoint({CLIENT_ID: CLIENT_SECRET})
    broker = start_local_broker(listeners=listeners, properties=props, scram_users=scram_users)
    try:
        topic = unique_topic_name("secured")
        create_topic(broker.bootstrap_servers, topic, partitions=2)
        produce_counts(broker.bootstrap_servers, topic, PER_PARTITION)
        yield {"broker": broker, "topic": topic, "dir": d, "ca": ca, "idp": idp, **files}
    finally:
        broker.stop()
        idp.close()


def security_options(s, setup: str) -> dict[str, str]:
    """The kafka.* options of one way of configuring security against ``secured`` ``s``."""
    b = s["broker"]
    client = s["client"]
    ca_pem = open(s["ca.pem"]).read()
    sasl = lambda listener, mechanism, protocol="SASL_PLAINTEXT", **more: {  # noqa: E731
        "kafka.bootstrap.servers": b.address(listener), "kafka.security.protocol": protocol,
        "kafka.sasl.mechanism": mechanism, "kafka.sasl.jaas.config": jaas(mechanism), **more}
    tls = lambda listener, **more: {  # noqa: E731
        "kafka.bootstrap.servers": b.address(listener), "kafka.security.protocol": "SSL", **more}
    p12_trust = {"kafka.ssl.truststore.location": s["truststore.p12"],
                 "kafka.ssl.truststore.type": "PKCS12",
                 "kafka.ssl.truststore.password": STORE_PASSWORD}
    oidc = {"kafka.sasl.login.callback.handler.class": OIDC_HANDLER,
            "kafka.sasl.oauthbearer.token.endpoint.url": s["idp"].url}
    return {
        "sasl-plain": lambda: sasl("SASL_PLAINTEXT", "PLAIN"),
        "sasl-oauthbearer-unsecured": lambda: sasl("SASL_PLAINTEXT", "OAUTHBEARER", **{
            "kafka.sasl.jaas.config": f'{OAUTH_MODULE} unsecuredLoginStringClaim_sub="{USER}";'}),
        "sasl-ssl-oauthbearer-client-credentials": lambda: {
            **sasl("SASL_SSL", "OAUTHBEARER", "SASL_SSL", **p12_trust, **oidc),
            "kafka.sasl.jaas.config": jaas("OAUTHBEARER", CLIENT_ID, CLIENT_SECRET)},
        "sasl-scram-sha-256": lambda: sasl("SASL_PLAINTEXT", "SCRAM-SHA-256"),
        "sasl-scram-sha-512": lambda: sasl("SASL_PLAINTEXT", "SCRAM-SHA-512"),
        "sasl-ssl-scram-sha-512": lambda: sasl("SASL_SSL", "SCRAM-SHA-512", "SASL_SSL",
                                               **p12_trust),
        "tls-pem-cafile": lambda: tls("SSL", **{"kafka.ssl.cafile": s["ca.pem"]}),
        "tls-pkcs12-truststore": lambda: tls("SSL", **p12_trust),
        "tls-pem-truststore": lambda: tls("SSL", **{
            "kafka.ssl.truststore.location": s["ca.pem"], "kafka.ssl.truststore.type": "PEM"}),
        "mtls-pkcs12-keystore": lambda: tls("MTLS", **p12_trust, **{
            "kafka.ssl.keystore.location": s["keystore.p12"],
            "kafka.ssl.keystore.type": "PKCS12", "kafka.ssl.keystore.password": STORE_PASSWORD}),
        "mtls-pem-keystore": lambda: tls("MTLS", **{
            "kafka.ssl.truststore.location": s["ca.pem"], "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.keystore.location": s["client-key.pem"], "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.key.password": KEY_PASSWORD}),
        "mtls-inline-pem": lambda: tls("MTLS", **{
            "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.certificates": ca_pem,
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.keystore.key": client.key_pem(KEY_PASSWORD).decode(),
            "kafka.ssl.keystore.certificate.chain": client.chain_pem().decode(),
            "kafka.ssl.key.password": KEY_PASSWORD}),
    }[setup]()


SETUPS = ["sasl-plain", "sasl-scram-sha-256", "sasl-scram-sha-512", "sasl-ssl-scram-sha-512",
          "sasl-oauthbearer-unsecured", "sasl-ssl-oauthbearer-client-credentials",
          "tls-pem-cafile", "tls-pkcs12-truststore", "tls-pem-truststore",
          "mtls-pkcs12-keystore", "mtls-pem-keystore", "mtls-inline-pem"]


def read_batch(spark, options):
    reader = spark.read.format("pykafka")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


@pytest.mark.parametrize("setup", SETUPS)
def test_batch_read(spark, secured, setup):
    options = {**security_options(secured, setup), "subscribe": secured["topic"]}
    rows = read_batch(spark, options).selectExpr(
        "partition", "offset", "CAST(value AS STRING) AS value").collect()
    assert sorted((r.partition, r.offset, r.value) for r in rows) == EXPECTED


@pytest.mark.parametrize("setup", SETUPS)
def test_stream_as_a_group_member(spark, secured, setup, tmp_path):
    group = f"secured-{setup}-{uuid.uuid4().hex[:6]}"
    options = {**security_options(secured, setup), "subscribe": secured["topic"],
               "kafka.group.id": group, "startingOffsets": "earliest",
               "kafka.session.timeout.ms": "6000", "kafka.heartbeat.interval.ms": "1000"}
    run_available_now(spark, options, str(tmp_path / "chk"), str(tmp_path / "out"))
    assert sorted(sink_rows(spark, str(tmp_path / "out"))) == EXPECTED
    if not spark_features.ADMISSION_CONTROL:
        # PySpark 4.0/4.1: an AvailableNow run's one batch is committed when the next run of
        # the checkpoint starts (docs/platforms.md): that run commits it, reading nothing new
        run_available_now(spark, options, str(tmp_path / "chk"), str(tmp_path / "out"))
    # the group's offsets were committed over the secured coordinator connection
    assert committed(secured["broker"].bootstrap_servers, group, secured["topic"]) == {
        p: n for p, n in PER_PARTITION.items()}


# --- failures: at once, with the cause and the fix -----------------------------------------------

FAILURES = {
    # name: (listener, options, fragments the message must hold)
    "self-signed broker, no CA configured": (
        "SELFSIGNED", {"kafka.security.protocol": "SSL"},
        ["certificate verification failed", "self-signed", "'kafka.ssl.truststore.location'",
         "'kafka.ssl.cafile'"]),
    "CA not trusted": (
        "SSL", {"kafka.security.protocol": "SSL"},
        ["certificate verification failed", "'kafka.ssl.truststore.location'"]),
    "host name mismatch": (
        "BADNAME", {"kafka.security.protocol": "SSL", "kafka.ssl.cafile": "{ca_pem}"},
        ["not valid for the name '127.0.0.1'", "'kafka.ssl.endpoint.identification.algorithm'"]),
    "mutual TLS without a client certificate": (
        "MTLS", {"kafka.security.protocol": "SSL", "kafka.ssl.cafile": "{ca_pem}"},
        ["requires a client certificate", "'kafka.ssl.keystore.location'"]),
    "mechanism the listener does not enable": (
        "PLAINONLY", {"kafka.security.protocol": "SASL_PLAINTEXT",
                      "kafka.sasl.mechanism": "SCRAM-SHA-512",
                      "kafka.sasl.jaas.config": jaas("SCRAM-SHA-512")},
        ["does not enable the mechanism SCRAM-SHA-512", "'kafka.sasl.mechanism'"]),
    "user without credentials for that SCRAM mechanism": (
        "SASL_PLAINTEXT", {"kafka.security.protocol": "SASL_PLAINTEXT",
                           "kafka.sasl.mechanism": "SCRAM-SHA-512",
                           "kafka.sasl.jaas.config": jaas("SCRAM-SHA-512", ONLY_256,
                                                          ONLY_256_PASSWORD)},
        [f"rejected SCRAM-SHA-512 authentication as user '{ONLY_256}'",
         "SCRAM-SHA-512 credentials"]),
    "wrong PLAIN password": (
        "SASL_PLAINTEXT", {"kafka.security.protocol": "SASL_PLAINTEXT",
                           "kafka.sasl.mechanism": "PLAIN",
                           "kafka.sasl.jaas.config": jaas("PLAIN", password="LeakCanary-wrong")},
        [f"rejected PLAIN authentication as user '{USER}'", "Invalid username or password",
         "'kafka.sasl.jaas.config'"]),
    "wrong SCRAM password": (
        "SASL_SSL", {"kafka.security.protocol": "SASL_SSL", "kafka.ssl.cafile": "{ca_pem}",
                     "kafka.sasl.mechanism": "SCRAM-SHA-256",
                     "kafka.sasl.jaas.config": jaas("SCRAM-SHA-256", password="LeakCanary-wrong")},
        ["rejected SCRAM-SHA-256 authentication", "invalid credentials"]),
    "OAUTHBEARER client the token endpoint refuses": (
        "SASL_PLAINTEXT", {"kafka.security.protocol": "SASL_PLAINTEXT",
                           "kafka.sasl.mechanism": "OAUTHBEARER",
                           "kafka.sasl.login.callback.handler.class": OIDC_HANDLER,
                           "kafka.sasl.oauthbearer.token.endpoint.url": "{idp}",
                           "kafka.sasl.jaas.config": jaas("OAUTHBEARER", CLIENT_ID,
                                                          "LeakCanary-wrong")},
        ["refused the token request (HTTP 401: invalid_client", f"clientId '{CLIENT_ID}'",
         "clientSecret", "'kafka.sasl.jaas.config'"]),
    "OAUTHBEARER token the broker rejects": (
        # the brokers' validator takes the principal from "sub"; this token has none
        "SASL_PLAINTEXT", {"kafka.security.protocol": "SASL_PLAINTEXT",
                           "kafka.sasl.mechanism": "OAUTHBEARER",
                           "kafka.sasl.jaas.config": (
                               f'{OAUTH_MODULE} unsecuredLoginPrincipalClaimName="user" '
                               'unsecuredLoginStringClaim_user="bob";')},
        ["rejected the OAUTHBEARER token from unsecured tokens for 'bob'",
         "'kafka.sasl.oauthbearer.token.endpoint.url'"]),
    "SASL client on a plaintext listener": (
        "PLAINTEXT", {"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
                      "kafka.sasl.jaas.config": jaas("PLAIN")},
        ["does not expect SASL", "'kafka.security.protocol'"]),
    "plaintext client on a TLS listener": (
        "SSL", {}, ["answered in TLS", "'kafka.security.protocol' is PLAINTEXT"]),
}


def failing_options(s, name: str) -> tuple[dict[str, str], list[str]]:
    listener, extra, fragments = FAILURES[name]
    options = {"kafka.bootstrap.servers": s["broker"].address(listener),
               "subscribe": s["topic"], "kafka.request.timeout.ms": str(LONG_TIMEOUT_MS)}
    options.update({k: v.replace("{ca_pem}", s["ca.pem"]).replace("{idp}", s["idp"].url)
                    for k, v in extra.items()})
    return options, fragments


def assert_fails_at_once(action, fragments, elapsed_limit_s=LONG_TIMEOUT_MS / 2000):
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        action()
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert all(f in message for f in fragments), message
    assert "LeakCanary" not in message
    # not after waiting out kafka.request.timeout.ms (300 s): the first attempt decides
    assert elapsed < elapsed_limit_s, f"failed only after {elapsed:.0f} s"
    return info.value


@pytest.mark.parametrize("name", list(FAILURES))
def test_batch_read_fails_at_once_with_the_cause(spark, secured, name):
    options, fragments = failing_options(secured, name)
    assert_fails_at_once(lambda: read_batch(spark, options).collect(), fragments)


@pytest.mark.parametrize("name", list(FAILURES))
def test_stream_fails_at_once_with_the_cause(spark, secured, name, tmp_path):
    options, fragments = failing_options(secured, name)

    def run():
        run_available_now(spark, {**options, "kafka.group.id": f"g-{uuid.uuid4().hex[:6]}"},
                          str(tmp_path / "chk"), str(tmp_path / "out"))

    assert_fails_at_once(run, fragments)


@pytest.mark.parametrize("name", ["wrong PLAIN password", "host name mismatch",
                                  "OAUTHBEARER client the token endpoint refuses"])
def test_executor_connections_fail_at_once_too(secured, name):
    options, fragments = failing_options(secured, name)
    settings = ReadSettings(client_config=client_config_from_options(options),
                            include_headers=False, fail_on_data_loss=True,
                            poll_timeout_ms=LONG_TIMEOUT_MS)
    partition = KafkaInputPartition(0, [OffsetRange(secured["topic"], 0, 0, 7)], settings)
    error = assert_fails_at_once(lambda: list(read_input_partition(partition)), fragments)
    assert isinstance(error, BrokerSecurityError)


def test_sink_writes_with_oauthbearer_client_credentials(spark, secured):
    options = security_options(secured, "sasl-ssl-oauthbearer-client-credentials")
    topic = unique_topic_name("oauth-sink")
    create_topic(secured["broker"].bootstrap_servers, topic, partitions=2)
    rows = [(f"k{i}", f"v{i}") for i in range(40)]
    writer = (spark.createDataFrame(rows, "key string, value string").write.format("pykafka")
              .mode("append").option("topic", topic))
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save()
    read = read_batch(spark, {**options, "subscribe": topic}).selectExpr(
        "CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v").collect()
    assert sorted((r.k, r.v) for r in read) == sorted(rows)


def test_oauthbearer_connections_outlive_their_tokens(secured, caplog):
    """Tokens of 4 s; the brokers end a session when its token expires. For 14 s the driver's
    requests and an executor's fetches keep working, on connections that re-authenticate (or,
    for fetch connections, reconnect) with a fresh token; no request fails. The client is idle
    between its requests, as a driver is between micro-batches: before BrokerClient started an
    overdue re-authentication itself, the next request reached the broker first and the broker
    closed the connection."""
    caplog.set_level(logging.DEBUG, logger="kafka.net.connection")
    lifetime_s, run_s = 4, 14
    with TokenEndpoint({CLIENT_ID: CLIENT_SECRET}, lifetime_s=lifetime_s) as idp:
        options = {**security_options(secured, "sasl-ssl-oauthbearer-client-credentials"),
                   "kafka.sasl.oauthbearer.token.endpoint.url": idp.url}
        config = client_config_from_options(options)
        settings = ReadSettings(client_config=config, include_headers=False,
                                fail_on_data_loss=True, poll_timeout_ms=30_000)
        partition = KafkaInputPartition(0, [OffsetRange(secured["topic"], 0, 0, 7)], settings)
        reads = metadata_calls = 0
        with BrokerClient(config) as client:
            deadline = time.monotonic() + run_s
            while time.monotonic() < deadline:
                assert secured["topic"] in client.metadata([secured["topic"]])
                metadata_calls += 1
                rows = sum(b.num_rows for b in read_input_partition(partition))
                assert rows == 7
                reads += 1
                time.sleep(0.5)
        # a token this short is refreshed at 0.8 to 0.85 (the jitter) of its lifetime (Java's
        # buffers do not fit in it): at least one per 3.4 s of the run
        assert len(idp.issued) >= run_s // (0.85 * lifetime_s), idp.issued
        assert reads >= 10 and metadata_calls >= 10
    assert "Beginning SASL re-authentication" in caplog.text
    assert "re-authentication failed" not in caplog.text


def test_requests_reauthenticate_in_time_when_the_timer_is_late(secured, caplog, monkeypatch):
    """The driver's pattern: a request sent without waiting (the commit at the end of a
    micro-batch), an idle spell, then the wait for its answer (at the next micro-batch), and a
    request that waits. kafka-python's re-authentication timer is made late, as a response
    processed late makes it (see kafka_source.wire.net.reauth): 120% of the session's lifetime
    instead of 85-95%. Requests must still re-authenticate before the broker's end of the
    session, by the connector's own clock. Without it, the first request after the end closed
    the connection ('socket disconnected')."""
    monkeypatch.setattr(kafka_connection, "random", types.SimpleNamespace(uniform=lambda a, b: 1.2))
    caplog.set_level(logging.DEBUG, logger="kafka.net.connection")
    lifetime_s, run_s = 6, 18
    idle = random.Random(7)
    failures, sent = [], 0
    with TokenEndpoint({CLIENT_ID: CLIENT_SECRET}, lifetime_s=lifetime_s) as idp:
        options = {**security_options(secured, "sasl-ssl-oauthbearer-client-credentials"),
                   "kafka.sasl.oauthbearer.token.endpoint.url": idp.url}
        with BrokerClient(client_config_from_options(options)) as client:
            client.metadata([secured["topic"]])
            node = client.last_node
            deadline = time.monotonic() + run_s
            while time.monotonic() < deadline:
                request = MetadataRequest(
                    topics=[MetadataRequest.MetadataRequestTopic(name=secured["topic"])],
                    allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                    include_topic_authorized_operations=False)
                future = client.send_now(node, request)
                sent += 1
                time.sleep(idle.uniform(0.1, 0.9))
                settle_by = time.monotonic() + 10
                while not future.is_done and time.monotonic() < settle_by:
                    client.poll(100)
                if not future.succeeded():
                    failures.append(f"request {sent}: {future.exception!r}")
                try:
                    client.metadata([secured["topic"]], node=node)
                except Exception as exc:  # noqa: BLE001 - counted and reported below
                    failures.append(f"metadata after request {sent}: {exc!r}")
    reauthentications = caplog.text.count("Beginning SASL re-authentication")
    assert not failures, failures
    assert sent >= 10
    # sessions of at most 4 s (a token's rest), re-authenticated at 80% by the connector's clock
    assert reauthentications >= run_s // lifetime_s, reauthentications
    assert "re-authentication failed" not in caplog.text


def test_a_request_behind_a_waiting_fetch_is_read_within_its_session(secured, caplog):
    """A broker reads a connection's next request only after answering the one before. Here a
    Fetch at the end of a partition waits at the broker for records (8 s, its max wait), sent
    in the first seconds of a session of at most 6 s (the token's rest), and a Metadata request
    is sent right behind it, when no re-authentication is due. The broker answers the Fetch
    after the session's end; written behind it, the Metadata request was read then and the
    broker closed the connection for it ("Disconnecting expired channel"), failing both. Held
    by the connection until the Fetch is answered, it waits for a re-authentication instead."""
    caplog.set_level(logging.DEBUG, logger="kafka.net.connection")
    lifetime_s, wait_ms = 6, 8000
    topic = secured["topic"]
    with TokenEndpoint({CLIENT_ID: CLIENT_SECRET}, lifetime_s=lifetime_s) as idp:
        options = {**security_options(secured, "sasl-ssl-oauthbearer-client-credentials"),
                   "kafka.sasl.oauthbearer.token.endpoint.url": idp.url}
        with BrokerClient(client_config_from_options(options)) as client:
            client.metadata([topic])
            node = client.last_node
            started = time.monotonic()
            version = min(client.api_version(FetchRequest), 12)   # topics by name up to v12
            partition = FetchRequest.FetchTopic.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=PER_PARTITION[0],
                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
            fetch = FetchRequest(
                version=version, replica_id=-1, max_wait_ms=wait_ms, min_bytes=1 << 20,
                max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
                forgotten_topics_data=[], rack_id="")
            waiting = client.send_now(node, fetch, timeout_ms=wait_ms + 10_000)
            behind = client.send_now(node, MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False))
            sent_s = time.monotonic() - started
            settle_by = time.monotonic() + wait_ms / 1000 + 15
            while not (waiting.is_done and behind.is_done) and time.monotonic() < settle_by:
                client.poll(100)
            answered_s = time.monotonic() - started
    assert sent_s < 1.5, sent_s                 # both handed over early in the session
    assert waiting.succeeded(), waiting.exception
    assert behind.succeeded(), behind.exception
    assert answered_s >= wait_ms / 1000 > lifetime_s     # the Fetch waited past the session
    assert "Beginning SASL re-authentication" in caplog.text
    assert "re-authentication failed" not in caplog.text


def test_jks_store_is_refused_when_the_dataframe_is_defined(spark, secured):
    path = secured["truststore.jks"]
    options = {**security_options(secured, "tls-pkcs12-truststore"), "subscribe": secured["topic"],
               "kafka.ssl.truststore.location": path, "kafka.ssl.truststore.type": "JKS"}
    with pytest.raises(Exception) as info:
        read_batch(spark, options)
    message = str(info.value)
    assert (f"keytool -importkeystore -srckeystore {path} -srcstoretype JKS -destkeystore "
            f"{path[:-4]}.p12 -deststoretype PKCS12") in message
    assert STORE_PASSWORD not in message


def test_wrong_store_password_is_named_when_the_dataframe_is_defined(spark, secured):
    options = {**security_options(secured, "mtls-pkcs12-keystore"), "subscribe": secured["topic"],
               "kafka.ssl.keystore.password": "LeakCanary-not-it"}
    with pytest.raises(Exception) as info:
        read_batch(spark, options)
    assert "'kafka.ssl.keystore.password' is wrong" in str(info.value)
    assert "LeakCanary" not in str(info.value)


# --- secrets never show ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def leak_run(secured, tmp_path_factory):
    """Run tests/integration/leak_probe.py in a child process against the secured broker; return
    what it printed and wrote, and the secrets it used."""
    d = tmp_path_factory.mktemp("leak")
    tokens_before = len(secured["idp"].issued)
    client = secured["client"]
    inline_key = client.key_pem(KEY_PASSWORD).decode()
    spec = {
        "topic": secured["topic"], "checkpoint": str(d / "checkpoint"),
        "event_log": str(d / "events"), "out": str(d / "out"),
        "sasl_ssl": {**security_options(secured, "sasl-ssl-scram-sha-512"),
                     "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.jaas.config": jaas("PLAIN"),
                     "kafka.ssl.keystore.location": secured["keystore.p12"],
                     "kafka.ssl.keystore.password": STORE_PASSWORD,
                     "kafka.ssl.key.password": STORE_PASSWORD},
        "mtls_inline": security_options(secured, "mtls-inline-pem"),
        "wrong_password": {**security_options(secured, "sasl-plain"),
                           "kafka.sasl.jaas.config": jaas("PLAIN", password="LeakCanary-wrong1")},
        "wrong_store_password": {**security_options(secured, "tls-pkcs12-truststore"),
                                 "kafka.ssl.truststore.password": "LeakCanary-wrong2"},
        "oauth": security_options(secured, "sasl-ssl-oauthbearer-client-credentials"),
        "oauth_wrong_secret": {
            **security_options(secured, "sasl-ssl-oauthbearer-client-credentials"),
            "kafka.sasl.jaas.config": jaas("OAUTHBEARER", CLIENT_ID, "LeakCanary-wrong3")},
    }
    (d / "events").mkdir()
    site = d / "site"  # DEBUG logging in the driver and in every Python worker Spark starts
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import logging, os, sys\n"
        "logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, force=True,\n"
        "    format='PYLOG pid=' + str(os.getpid()) + ' %(name)s %(levelname)s %(message)s')\n")
    env = {**spark_worker_env(), "PYTHONPATH": os.pathsep.join(
        [str(site), str(Path(__file__).resolve().parents[2])]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    spec_path = d / "spec.json"
    spec_path.write_text(json.dumps(spec))
    probe = Path(__file__).with_name("leak_probe.py")
    run = subprocess.run([sys.executable, str(probe), str(spec_path)], env=env,
                         capture_output=True, text=True, timeout=600)
    (d / "stdout.txt").write_text(run.stdout)  # for a look after a failure
    (d / "stderr.txt").write_text(run.stderr)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    body = "".join(inline_key.splitlines()[1:-1])
    issued = secured["idp"].issued[tokens_before:]  # the probe's processes' bearer tokens
    assert issued, "the probe got no OAUTHBEARER token"
    secrets = [USER_PASSWORD, STORE_PASSWORD, KEY_PASSWORD, "LeakCanary-wrong1",
               "LeakCanary-wrong2", CLIENT_SECRET, "LeakCanary-wrong3"] + issued + [
        body[i:i + 24] for i in range(0, len(body) - 24, 24)]
    sections: dict[str, str] = {}
    for block in ("\n" + run.stdout).split("\n=== ")[1:]:
        title, _, text = block.partition("\n")
        sections[title.strip()] = text
    return {"stdout": run.stdout, "stderr": run.stderr, "sections": sections,
            "secrets": secrets, "checkpoint": spec["checkpoint"], "events": spec["event_log"]}


def assert_no_secret(text: str, secrets, where: str) -> None:
    leaked = [s for s in secrets if s in text]
    if leaked:
        at = text.index(leaked[0])
        context = text[max(0, at - 300):at + 100].replace(leaked[0], "<SECRET>")
        pytest.fail(f"{len(leaked)} secret(s) found in {where}, e.g. here: ...{context}...")


def test_no_secret_in_logs(leak_run):
    err = leak_run["stderr"]
    # the channel was really exercised: DEBUG records of kafka-python and of pykafka from Python
    # processes other than the probe's own (Spark's workers), and Spark's own INFO log
    pids = {line.split()[1] for line in err.splitlines() if line.startswith("PYLOG pid=")}
    assert len(pids) >= 2, "no Python worker logged anything"
    assert "kafka.net.connection DEBUG" in err and "SaslAuthenticateRequest" in err
    assert "kafka_source.read.stream INFO" in err
    assert " INFO " in err and "MicroBatchExecution" in err
    events = "".join(open(f, errors="replace").read()
                     for f in glob.glob(os.path.join(leak_run["events"], "**"), recursive=True)
                     if os.path.isfile(f))
    assert "SparkListenerSQLExecutionStart" in events
    assert_no_secret(err, leak_run["secrets"], "the logs")
    assert_no_secret(events, leak_run["secrets"], "Spark's event log")


def test_no_secret_in_exceptions(leak_run):
    text = leak_run["sections"]["exceptions"]
    assert "rejected PLAIN authentication as user 'alice'" in text
    assert "'kafka.ssl.truststore.password' is wrong" in text
    assert "refused the token request (HTTP 401: invalid_client" in text
    assert text.count("Traceback") >= 4
    assert_no_secret(text, leak_run["secrets"], "exceptions")


def test_no_secret_in_explain(leak_run):
    text = leak_run["sections"]["explain"]
    assert "BatchScan pykafka" in text and "MicroBatchScan" in text
    assert "== Physical Plan ==" in text
    assert_no_secret(text, leak_run["secrets"], "explain() output")


def test_no_secret_in_query_progress(leak_run):
    text = leak_run["sections"]["progress"]
    progress = json.loads(text.splitlines()[0])
    assert sum(p["numInputRows"] for p in progress) == sum(PER_PARTITION.values())
    assert all(p["sources"] for p in progress)
    assert_no_secret(text, leak_run["secrets"], "query progress")


def test_no_secret_in_offsets_or_checkpoints(leak_run):
    files = [f for f in glob.glob(os.path.join(leak_run["checkpoint"], "**"), recursive=True)
             if os.path.isfile(f)]
    names = {os.path.relpath(f, leak_run["checkpoint"]).split(os.sep)[0] for f in files}
    assert {"offsets", "commits", "metadata"} <= names
    offsets = open(os.path.join(leak_run["checkpoint"], "offsets", "0")).read()
    assert leak_run["sections"]["offsets"].strip() and '"0":' in offsets
    for f in files:
        assert_no_secret(open(f, "rb").read().decode("utf-8", "replace"), leak_run["secrets"],
                         f"checkpoint file {os.path.relpath(f, leak_run['checkpoint'])}")
    assert_no_secret(leak_run["sections"]["offsets"], leak_run["secrets"], "offsets")
