"""Option parsing and validation: every bad input gets an error naming the option at fault."""

import pytest

from kafka_source.errors import OptionError
from kafka_source.config.options import parse_batch_options

pytestmark = pytest.mark.pyspark_free

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def batch(**extra):
    return parse_batch_options({**BASE, **extra})


def error_of(**extra) -> str:
    with pytest.raises(OptionError) as info:
        batch(**extra)
    return str(info.value)


def test_defaults_match_spark():
    o = batch(subscribe="a")
    assert o.subscription.kind == "subscribe" and o.subscription.topics == ("a",)
    assert o.starting.kind == "earliest"
    assert o.ending.kind == "latest"
    assert o.include_headers is False
    assert o.fail_on_data_loss is True
    assert o.min_partitions is None and o.max_records_per_partition is None
    assert o.fetch_offset_num_retries == 3 and o.fetch_offset_retry_interval_ms == 1000
    assert o.poll_timeout_ms == 120_000
    assert o.client_config["isolation_level"] == "read_uncommitted"
    assert o.client_config["bootstrap_servers"] == "127.0.0.1:9092"


def test_option_keys_are_case_insensitive():
    o = parse_batch_options({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "SubScribe": "a, b ,a",
                             "INCLUDEHEADERS": "TRUE", "minpartitions": "7",
                             "FailOnDataLoss": "false"})
    assert o.subscription.topics == ("a", "b")
    assert o.include_headers is True and o.min_partitions == 7 and o.fail_on_data_loss is False


def test_bootstrap_servers_required_and_checked():
    with pytest.raises(OptionError, match="kafka.bootstrap.servers' is required"):
        parse_batch_options({"subscribe": "a"})
    assert "not host:port" in error_of(**{"kafka.bootstrap.servers": "nohostport"},
                                       subscribe="a")


def test_exactly_one_subscription_strategy():
    msg = error_of(subscribe="a", assign='{"a":[0]}')
    assert "'subscribe'" in msg and "'assign'" in msg and "Only one" in msg
    assert "'subscribePattern'" in error_of(subscribe="a", subscribePattern="a.*")
    msg = error_of()
    assert "subscribe" in msg and "subscribePattern" in msg and "assign" in msg
    assert "names no topics" in error_of(subscribe=" , ")
    assert "not a valid regex" in error_of(subscribePattern="a[")


def test_assign_json():
    o = batch(assign='{"t1":[0,2],"t2":[1]}')
    assert o.subscription.assignment == (("t1", 0), ("t1", 2), ("t2", 1))
    assert "not valid JSON" in error_of(assign="{t1:[0]}")
    assert "list of partitions" in error_of(assign='{"t1":0}')
    assert "non-negative integer" in error_of(assign='{"t1":[-1]}')
    assert "names no partitions" in error_of(assign="{}")


def test_starting_offsets_json_and_words():
    o = batch(assign='{"t":[0,1]}', startingOffsets='{"t":{"0":23,"1":-2}}',
              endingOffsets='{"t":{"0":50,"1":-1}}')
    assert o.starting.kind == "offsets"
    assert dict(o.starting.per_partition) == {("t", 0): 23, ("t", 1): -2}
    assert dict(o.ending.per_partition) == {("t", 0): 50, ("t", 1): -1}
    assert batch(subscribe="t", startingOffsets=" EARLIEST ").starting.kind == "earliest"


def test_latest_is_invalid_as_batch_start():
    msg = error_of(subscribe="t", startingOffsets="latest")
    assert "startingOffsets" in msg and "latest" in msg
    msg = error_of(subscribe="t", startingOffsets='{"t":{"0":-1}}')
    assert "startingOffsets" in msg and "t-0" in msg and "-1 (latest)" in msg


def test_earliest_is_invalid_as_batch_end():
    msg = error_of(subscribe="t", endingOffsets="earliest")
    assert "endingOffsets" in msg and "earliest" in msg
    msg = error_of(subscribe="t", endingOffsets='{"t":{"0":-2}}')
    assert "endingOffsets" in msg and "t-0" in msg and "-2 (earliest)" in msg


@pytest.mark.parametrize("raw,fragment", [
    ("{not json", "not valid JSON"),
    ("[1,2]", "must be 'earliest' or JSON"),
    ('{"t":[0]}', "must map to an object"),
    ('{"t":{"x":1}}', "partition 'x'"),
    ('{"t":{"0":"5"}}', "must be an integer"),
    ('{"t":{"0":-3}}', "invalid"),
    ("{}", "names no partitions"),
    ("sometimes", "must be 'earliest' or JSON"),
])
def test_malformed_offset_json(raw, fragment):
    msg = error_of(subscribe="t", startingOffsets=raw)
    assert "startingOffsets" in msg and fragment in msg


def test_offsets_json_must_stay_inside_assign():
    msg = error_of(assign='{"t":[0]}', startingOffsets='{"t":{"1":5}}')
    assert "t-1" in msg and "assign" in msg


def test_timestamp_precedence():
    o = batch(subscribe="t", startingTimestamp="1000", startingOffsetsByTimestamp='{"t":{"0":5}}',
              startingOffsets='{"t":{"0":3}}')
    assert o.starting.kind == "timestamp" and o.starting.global_timestamp == 1000
    o = batch(subscribe="t", startingOffsetsByTimestamp='{"t":{"0":5}}',
              startingOffsets='{"t":{"0":3}}', endingOffsetsByTimestamp='{"t":{"0":9}}',
              endingOffsets='{"t":{"0":30}}')
    assert o.starting.kind == "timestamps" and dict(o.starting.per_partition) == {("t", 0): 5}
    assert o.ending.kind == "timestamps" and dict(o.ending.per_partition) == {("t", 0): 9}
    assert batch(subscribe="t", endingTimestamp="7").ending.global_timestamp == 7
    assert "startingTimestamp" in error_of(subscribe="t", startingTimestamp="soon")
    assert "startingOffsetsByTimestamp" in error_of(subscribe="t",
                                                     startingOffsetsByTimestamp='{"t":{"0":-1}}')


def test_timestamp_strategy():
    assert batch(subscribe="t", startingOffsetsByTimestampStrategy="LATEST") \
        .starting_by_timestamp_strategy == "latest"
    msg = error_of(subscribe="t", startingOffsetsByTimestampStrategy="skip")
    assert "startingOffsetsByTimestampStrategy" in msg and "'error' or 'latest'" in msg


@pytest.mark.parametrize("key,value", [("minPartitions", "0"), ("minPartitions", "x"),
                                       ("maxRecordsPerPartition", "-5"),
                                       ("fetchOffset.numRetries", "-1"),
                                       ("fetchOffset.retryIntervalMs", "soon"),
                                       ("kafkaConsumer.pollTimeoutMs", "0"),
                                       ("includeHeaders", "yes"), ("failOnDataLoss", "1")])
def test_numeric_and_boolean_options(key, value):
    assert key in error_of(subscribe="t", **{key: value})


def test_kafka_options_pass_to_the_client():
    o = batch(subscribe="t", **{"kafka.isolation.level": "read_committed",
                                "kafka.client.id": "me", "kafka.request.timeout.ms": "1234",
                                "kafka.security.protocol": "sasl_ssl",
                                "kafka.sasl.mechanism": "PLAIN",
                                "kafka.sasl.jaas.config":
                                    'org.apache.kafka.common.security.plain.PlainLoginModule '
                                    'required username="alice" password="s\\"cret";',
                                "kafka.ssl.cafile": "/ca.pem",
                                "kafka.max.partition.fetch.bytes": "2097152",
                                "kafka.check.crcs": "false"})
    c = o.client_config
    assert o.read_committed
    assert c["client_id"] == "me" and c["request_timeout_ms"] == 1234
    assert c["security_protocol"] == "SASL_SSL" and c["sasl_mechanism"] == "PLAIN"
    assert c["sasl_plain_username"] == "alice" and c["sasl_plain_password"].reveal() == 's"cret'
    assert c["ssl_cafile"] == "/ca.pem"
    assert c["max_partition_fetch_bytes"] == 2097152 and c["check_crcs"] is False


@pytest.mark.parametrize("key,value,fragment", [
    ("kafka.isolation.level", "serializable", "read_committed"),
    ("kafka.security.protocol", "TLS", "SASL_SSL"),
    ("kafka.request.timeout.ms", "fast", "integer"),
    ("kafka.sasl.login.callback.handler.class", "com.example.H", "Java callback handlers"),
    ("kafka.key.deserializer", "x", "binary"),
    ("kafka.enable.auto.commit", "true", "not supported"),
    ("kafka.auto.offset.reset", "earliest", "startingOffsets"),
    ("kafka.sasl.jaas.config", "com.sun.security.auth.module.Krb5LoginModule required;",
     "PlainLoginModule"),
])
def test_bad_kafka_options(key, value, fragment):
    msg = error_of(subscribe="t", **{key: value})
    assert key in msg and fragment in msg
