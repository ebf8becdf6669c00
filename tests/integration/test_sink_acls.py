"""Exactly-once streaming writes on an ACL-secured Kafka, with exactly the ACLs docs/writing.md
documents (issue 18 item 3).

One broker for the module (from ``KAFKA_HOME``, or in ZooKeeper mode from ``KAFKA_ZK_HOME`` on
the Kafka 2.2 pass: see ``start_local_broker``) with an authorizer and a SASL/SCRAM listener for
the user ``eos``, whose only ACLs are the documented ones: WRITE on transactional ids and READ
on groups with the prefix of ``kafka.transactional.id``, WRITE and READ on the output topic.
The PLAINTEXT listener's principal (ANONYMOUS; also the broker's own, between broker and
controller) is a super user: the test creates topics and ACLs, feeds the stream and reads back
through it.

* With the documented ACLs an exactly-once stream writes every record once.
* Without READ on the output topic -- which the marker's OffsetCommit needs, writing does not
  -- the query fails when it starts, naming the missing ACL, before any record is written.

The embedded Tansu broker has no SASL listener or authorizer: without a Kafka distribution
these tests skip.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

from kafka_source import spark_features
from kafka_source.testing import (create_topic, local_distribution, start_local_broker,
                                   unique_topic_name)
from kafka_source.testing.brokers import BrokerStartError, LocalZkKafkaBroker, distribution_version

from .test_sink import _produce, read_back

pytestmark = pytest.mark.integration

USER, PASSWORD = "eos", "eos-acl-secret-3b71"
PREFIX = "eos-app"


def _authorizer() -> str:
    broker_class, home = local_distribution()
    if broker_class is not LocalZkKafkaBroker:
        return "org.apache.kafka.metadata.authorizer.StandardAuthorizer"   # KRaft
    if (distribution_version(home) or (0, 0)) < (2, 4):
        return "kafka.security.auth.SimpleAclAuthorizer"
    return "kafka.security.authorizer.AclAuthorizer"


@pytest.fixture(scope="module")
def acl_broker():
    if os.environ.get("PYKAFKA_TEST_BROKER", "").strip().lower() == "embedded":
        pytest.skip("the embedded Tansu broker has no SASL listener or authorizer; these tests "
                    "start a real Kafka from KAFKA_HOME and run in the real-Kafka pass")
    if local_distribution() is None:
        pytest.skip("needs KAFKA_HOME (an Apache Kafka distribution; or KAFKA_ZK_HOME for "
                    "ZooKeeper mode): these tests start their own broker with a SASL/SCRAM "
                    "listener and an authorizer")
    props = {"sasl.enabled.mechanisms": "SCRAM-SHA-256",
             "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
                 "org.apache.kafka.common.security.scram.ScramLoginModule required;",
             "authorizer.class.name": _authorizer(),
             "super.users": "User:ANONYMOUS"}
    try:
        broker = start_local_broker(listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT"},
                                    properties=props,
                                    scram_users=[("SCRAM-SHA-256", USER, PASSWORD)])
    except BrokerStartError as exc:
        pytest.skip(f"could not start a Kafka broker with a SASL/SCRAM listener and an "
                    f"authorizer: {str(exc)[:2000]}")
    try:
        yield broker
    finally:
        broker.stop()


def grant(broker, *acls) -> None:
    """ALLOW ``USER`` each (resource type, name, pattern type, operation), and wait until the
    broker's authorizer shows them."""
    from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType,
                             ACLResourcePatternType, KafkaAdminClient, ResourcePattern,
                             ResourcePatternFilter, ResourceType)

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        bindings = [ACL(principal=f"User:{USER}", host="*", operation=ACLOperation[op],
                        permission_type=ACLPermissionType.ALLOW,
                        resource_pattern=ResourcePattern(ResourceType[rtype], name,
                                                         ACLResourcePatternType[pattern]))
                    for rtype, name, pattern, op in acls]
        result = admin.create_acls(bindings)
        assert not result["failed"], result["failed"]
        deadline = time.monotonic() + 30
        for rtype, name, pattern, op in acls:
            wanted = ACLFilter(principal=f"User:{USER}", host="*", operation=ACLOperation[op],
                               permission_type=ACLPermissionType.ALLOW,
                               resource_pattern=ResourcePatternFilter(
                                   ResourceType[rtype], name, ACLResourcePatternType[pattern]))
            while not admin.describe_acls(wanted)[0]:
                assert time.monotonic() < deadline, f"ACL {rtype} {name} {op} not in effect"
                time.sleep(0.1)
    finally:
        admin.close()


def documented_acls(topic: str, *, topic_read: bool = True) -> list[tuple[str, str, str, str]]:
    """The ACLs docs/writing.md gives for an exactly-once query with prefix ``PREFIX`` writing
    ``topic``."""
    acls = [("TRANSACTIONAL_ID", PREFIX, "PREFIXED", "WRITE"),
            ("GROUP", PREFIX, "PREFIXED", "READ"),
            ("TOPIC", topic, "LITERAL", "WRITE")]
    if topic_read:
        acls.append(("TOPIC", topic, "LITERAL", "READ"))
    return acls


def run_stream(spark, broker, source: str, out: str, checkpoint: str):
    """Copy ``source`` (read through PLAINTEXT) to ``out`` exactly-once as ``USER``; the
    query's exception (None if it succeeded)."""
    reader = (spark.readStream.format("pykafka")
              .option("kafka.bootstrap.servers", broker.bootstrap_servers)
              .option("subscribe", source).option("startingOffsets", "earliest"))
    if spark_features.ADMISSION_CONTROL:
        # several micro-batches, each its own transactions; on PySpark 4.0/4.1 AvailableNow is
        # one micro-batch, which a limit would cut short (docs/platforms.md)
        reader = reader.option("maxOffsetsPerTrigger", "10")
    stream = reader.load().select("key", "value")
    query = (stream.writeStream.format("pykafka")
             .option("kafka.bootstrap.servers", broker.address("SASL_PLAINTEXT"))
             .option("kafka.security.protocol", "SASL_PLAINTEXT")
             .option("kafka.sasl.mechanism", "SCRAM-SHA-256")
             .option("kafka.sasl.jaas.config",
                     "org.apache.kafka.common.security.scram.ScramLoginModule required "
                     f'username="{USER}" password="{PASSWORD}";')
             .option("exactlyOnce", "true").option("kafka.transactional.id", PREFIX)
             .option("topic", out).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120), "the stream did not finish"
    except AssertionError:
        query.stop()
        raise
    except Exception:  # noqa: BLE001 - the query failed: query.exception() says why
        pass
    return query.exception()


def test_exactly_once_stream_with_the_documented_acls(spark, acl_broker, tmp_path):
    source, out = unique_topic_name("acl-src"), unique_topic_name("acl-out")
    create_topic(acl_broker.bootstrap_servers, source, 2)
    create_topic(acl_broker.bootstrap_servers, out, 2)
    values = [f"v{i}" for i in range(25)]
    _produce(acl_broker.bootstrap_servers, source, values)
    grant(acl_broker, *documented_acls(out))

    error = run_stream(spark, acl_broker, source, out, str(tmp_path / "checkpoint"))

    assert error is None, error
    got = read_back(acl_broker.bootstrap_servers, out, committed_only=True)
    assert Counter(r.value.decode() for r in got) == Counter(values)


def test_exactly_once_stream_without_read_on_the_output_topic_fails_at_start(
        spark, acl_broker, tmp_path):
    source, out = unique_topic_name("acl-src"), unique_topic_name("acl-noread")
    create_topic(acl_broker.bootstrap_servers, source, 1)
    create_topic(acl_broker.bootstrap_servers, out, 1)
    _produce(acl_broker.bootstrap_servers, source, ["a", "b", "c"])
    grant(acl_broker, *documented_acls(out, topic_read=False))

    error = run_stream(spark, acl_broker, source, out, str(tmp_path / "checkpoint"))

    assert error is not None, "the query should have failed"
    text = " ".join(str(error).split())
    assert f"Missing ACL: READ on Topic '{out}'" in text, text[-3000:]
    assert read_back(acl_broker.bootstrap_servers, out) == []     # no task wrote anything
