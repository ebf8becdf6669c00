"""parse_stream_options: defaults and errors of ``spark.readStream.format("pykafka")``."""

import logging

import pytest

from kafka_source.errors import OptionError
from kafka_source.config.options import (DEFAULT_GROUP_ID_PREFIX, GroupOptions, StreamOptions,
                                  parse_stream_options)

pytestmark = pytest.mark.pyspark_free

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "events"}


def stream(**extra) -> StreamOptions:
    return parse_stream_options({**BASE, **extra})


def opts(**extra):
    """Options with dotted keys: opts(**{"kafka.group.id": "g"})."""
    return {**BASE, **extra}


def error_of(options) -> str:
    with pytest.raises(OptionError) as info:
        parse_stream_options(options)
    return str(info.value)


# --- defaults ------------------------------------------------------------------------------------

def test_defaults_without_group_id():
    o = stream()
    assert isinstance(o.group, GroupOptions)
    assert o.source.starting.kind == "latest"
    assert o.source.ending is None
    g = o.group
    assert g.group_id_given is False
    assert g.group_id.startswith(DEFAULT_GROUP_ID_PREFIX + "-")
    assert g.assignor == "range"
    assert g.commit_offsets is True
    assert g.session_timeout_ms == 45_000
    assert g.heartbeat_interval_ms == 3_000
    assert g.rebalance_timeout_ms == 300_000
    assert g.api_timeout_ms == 60_000
    assert g.auto_offset_reset == "latest"
    assert o.max_offsets_per_trigger is None and o.min_offsets_per_trigger is None
    assert o.max_trigger_delay_ms == 15 * 60_000
    assert o.source.fail_on_data_loss is True


def test_generated_group_ids_are_unique_and_use_the_prefix():
    a, b = stream(groupIdPrefix="etl"), stream(groupIdPrefix="etl")
    assert a.group.group_id.startswith("etl-") and b.group.group_id.startswith("etl-")
    assert a.group.group_id != b.group.group_id


def test_group_id_given_defaults_to_the_groups_committed_offsets():
    o = parse_stream_options(opts(**{"kafka.group.id": " orders "}))
    assert o.group.group_id == "orders" and o.group.group_id_given is True
    assert o.source.starting.kind == "group"
    assert o.source.starting.option == "startingOffsets"


@pytest.mark.parametrize("value", ["group", "GROUP", " Group "])
def test_starting_offsets_group_explicit(value):
    o = parse_stream_options(opts(**{"kafka.group.id": "g", "startingOffsets": value}))
    assert o.source.starting.kind == "group"


def test_starting_offsets_can_override_the_group_default():
    o = parse_stream_options(opts(**{"kafka.group.id": "g", "startingOffsets": "earliest"}))
    assert o.source.starting.kind == "earliest"
    o = parse_stream_options(opts(**{"kafka.group.id": "g",
                                     "startingOffsets": '{"events":{"0":5,"1":-2}}'}))
    assert o.source.starting.kind == "offsets"
    assert o.source.starting.per_partition == {("events", 0): 5, ("events", 1): -2}


def test_starting_timestamp_takes_precedence_over_the_group_default():
    o = parse_stream_options(opts(**{"kafka.group.id": "g", "startingTimestamp": "1000"}))
    assert o.source.starting.kind == "timestamp" and o.source.starting.global_timestamp == 1000


def test_heartbeat_default_follows_a_short_session_timeout():
    o = parse_stream_options(opts(**{"kafka.session.timeout.ms": "6000"}))
    assert o.group.session_timeout_ms == 6000 and o.group.heartbeat_interval_ms == 2000


def test_group_settings_are_read():
    o = parse_stream_options(opts(**{
        "kafka.group.id": "g", "assignor": "roundrobin", "commitOffsets": "false",
        "kafka.session.timeout.ms": "10000", "kafka.heartbeat.interval.ms": "1000",
        "kafka.max.poll.interval.ms": "60000", "kafka.auto.offset.reset": "EARLIEST",
        "kafka.default.api.timeout.ms": "20000"}))
    g = o.group
    assert (g.assignor, g.commit_offsets, g.session_timeout_ms, g.heartbeat_interval_ms,
            g.rebalance_timeout_ms, g.auto_offset_reset, g.api_timeout_ms) == (
        "roundrobin", False, 10_000, 1_000, 60_000, "earliest", 20_000)


@pytest.mark.parametrize("value", ["earliest", "latest", "none"])
def test_auto_offset_reset_values(value):
    assert stream(**{"kafka.auto.offset.reset": value}).group.auto_offset_reset == value


def test_admission_options_are_read_case_insensitively():
    o = parse_stream_options({**BASE, "MAXOFFSETSPERTRIGGER": "1000",
                              "minoffsetspertrigger": "1000", "MaxTriggerDelay": "30s"})
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (
        1000, 1000, 30_000)


@pytest.mark.parametrize("value, ms", [("15m", 900_000), ("30s", 30_000), ("500ms", 500),
                                       ("1h", 3_600_000), ("2min", 120_000), ("1d", 86_400_000),
                                       ("250", 250), (" 5 s ", 5_000), ("10SEC", 10_000)])
def test_max_trigger_delay_durations(value, ms):
    assert stream(minOffsetsPerTrigger="1", maxTriggerDelay=value).max_trigger_delay_ms == ms


def test_max_trigger_delay_without_min_offsets_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="kafka_source.config.options"):
        stream(maxTriggerDelay="1m")
    assert "maxTriggerDelay" in caplog.text and "minOffsetsPerTrigger" in caplog.text


def test_auto_offset_reset_is_allowed_for_streams():
    # (batch reads refuse it; a stream uses it for partitions without a committed offset)
    assert stream(**{"kafka.auto.offset.reset": "earliest"}).group.auto_offset_reset == "earliest"


# --- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [("endingOffsets", "latest"),
                                        ("endingOffsetsByTimestamp", '{"events":{"0":1}}'),
                                        ("endingTimestamp", "1000"),
                                        ("ENDINGOFFSETS", "latest")])
def test_ending_options_are_refused_in_a_stream(key, value):
    message = error_of(opts(**{key: value}))
    name = {"ENDINGOFFSETS": "endingOffsets"}.get(key, key)
    assert f"'{name}'" in message and "AvailableNow" in message


def test_starting_offsets_group_needs_a_group_id():
    message = error_of(opts(startingOffsets="group"))
    assert "'startingOffsets'" in message and "'kafka.group.id'" in message


def test_empty_group_id_and_prefix():
    assert "'kafka.group.id'" in error_of(opts(**{"kafka.group.id": "  "}))
    assert "'groupIdPrefix'" in error_of(opts(groupIdPrefix=" "))


@pytest.mark.parametrize("heartbeat, session", [("3000", "3000"), ("5000", "3000")])
def test_heartbeat_must_be_below_session_timeout(heartbeat, session):
    message = error_of(opts(**{"kafka.heartbeat.interval.ms": heartbeat,
                               "kafka.session.timeout.ms": session}))
    assert "'kafka.heartbeat.interval.ms'" in message and "'kafka.session.timeout.ms'" in message


@pytest.mark.parametrize("key", ["kafka.session.timeout.ms", "kafka.heartbeat.interval.ms",
                                 "kafka.max.poll.interval.ms", "kafka.default.api.timeout.ms"])
@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_group_timeouts_must_be_positive_integers(key, value):
    assert f"'{key}'" in error_of(opts(**{key: value}))


@pytest.mark.parametrize("value", ["smallest", "", "earliest,latest"])
def test_bad_auto_offset_reset(value):
    message = error_of(opts(**{"kafka.auto.offset.reset": value}))
    assert "'kafka.auto.offset.reset'" in message and "'none'" in message


def test_min_offsets_above_max_offsets():
    message = error_of(opts(minOffsetsPerTrigger="101", maxOffsetsPerTrigger="100"))
    assert "'minOffsetsPerTrigger'" in message and "'maxOffsetsPerTrigger'" in message
    assert "101" in message and "100" in message
    o = stream(minOffsetsPerTrigger="100", maxOffsetsPerTrigger="100")
    assert o.min_offsets_per_trigger == o.max_offsets_per_trigger == 100


@pytest.mark.parametrize("value", ["soon", "-5s", "1.5s", "15 minutes", "m", "", "10x"])
def test_bad_max_trigger_delay(value):
    message = error_of(opts(minOffsetsPerTrigger="1", maxTriggerDelay=value))
    assert "'maxTriggerDelay'" in message and f"'{value}'" in message


@pytest.mark.parametrize("key", ["maxOffsetsPerTrigger", "minOffsetsPerTrigger"])
@pytest.mark.parametrize("value", ["0", "-10", "many", "1e3"])
def test_offsets_per_trigger_must_be_positive_integers(key, value):
    message = error_of(opts(**{key: value}))
    assert f"'{key}'" in message and "positive integer" in message


def test_commit_offsets_must_be_boolean():
    assert "'commitOffsets'" in error_of(opts(commitOffsets="yes"))


def test_empty_assignor():
    assert "'assignor'" in error_of(opts(assignor=" "))


def test_enable_auto_commit_is_refused():
    assert "'kafka.enable.auto.commit'" in error_of(opts(**{"kafka.enable.auto.commit": "true"}))


def test_starting_offsets_json_outside_assign_is_refused():
    o = {"kafka.bootstrap.servers": "h:1", "assign": '{"events":[0,1]}',
         "startingOffsets": '{"events":{"0":1,"2":5}}'}
    message = error_of(o)
    assert "'startingOffsets'" in message and "events-2" in message


def test_starting_offsets_bad_word():
    message = error_of(opts(startingOffsets="beginning"))
    assert "'startingOffsets'" in message and "'beginning'" in message


# --- static membership: kafka.group.instance.id ---------------------------------------------------

def test_group_instance_id_is_read_and_unset_by_default():
    assert stream().group.group_instance_id is None
    o = parse_stream_options(opts(**{"kafka.group.id": "g",
                                     "kafka.group.instance.id": " etl-A.1_x "}))
    assert o.group.group_instance_id == "etl-A.1_x"


@pytest.mark.parametrize("value, what", [
    ("  ", "is empty"),
    ("query 1", "letters, digits"),
    ("q/1", "letters, digits"),
    ("x" * 250, "1 to 249"),
    ("..", "not '.' or '..'"),
])
def test_bad_group_instance_id_names_the_option_and_what_is_valid(value, what):
    message = error_of(opts(**{"kafka.group.id": "g", "kafka.group.instance.id": value}))
    assert "'kafka.group.instance.id'" in message and what in message


def test_group_instance_id_needs_a_group_id_and_a_subscription():
    message = error_of(opts(**{"kafka.group.instance.id": "q1"}))
    assert "'kafka.group.instance.id'" in message and "'kafka.group.id'" in message
    message = error_of({"kafka.bootstrap.servers": "h:1", "assign": '{"events":[0]}',
                        "kafka.group.id": "g", "kafka.group.instance.id": "q1"})
    assert "'kafka.group.instance.id'" in message and "'subscribe'" in message
