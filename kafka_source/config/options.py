"""Source options: parse and validate what the user passed to ``.option(...)``.

Everything a data engineer can set is read here, once, on the driver, into plain immutable
values (:class:`SourceOptions`) that are cheap to pickle into input partitions. Option names and
meanings follow Spark's built-in ``format("kafka")`` source; keys are case-insensitive.

Nothing in this module talks to Kafka: anything that needs the cluster (which partitions a topic
has, what "latest" is) is resolved later by :mod:`kafka_source.read.offsets`.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Mapping

from .client_config import client_config_from_options, uses_tls
from ..errors import OptionError

log = logging.getLogger(__name__)

# Offsets in JSON offset specs, as in Spark: -2 means earliest, -1 means latest.
EARLIEST = -2
LATEST = -1

DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_FETCH_OFFSET_NUM_RETRIES = 3
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS = 1_000

# kafka.* settings that make no sense for this source, with what to use instead.
_UNSUPPORTED_KAFKA_PARAMS = {
    "key.deserializer": "keys are always returned as binary; cast or decode them in a DataFrame "
                        "expression instead",
    "value.deserializer": "values are always returned as binary; cast or decode them in a "
                          "DataFrame expression instead",
    "enable.auto.commit": "the source decides when offsets are committed",
    "interceptor.classes": "Java consumer interceptors do not apply to this source",
}


@dataclass(frozen=True)
class OffsetSpec:
    """Where a range starts or ends, before it is resolved against the cluster.

    kind is one of:
      ``earliest`` / ``latest``  -- the same bound for every partition;
      ``offsets``     -- ``per_partition`` maps (topic, partition) -> offset, -2/-1 allowed;
      ``timestamp``   -- one timestamp (ms) for every partition (``global_timestamp``);
      ``timestamps``  -- ``per_partition`` maps (topic, partition) -> timestamp (ms);
      ``group``       -- the consumer group's committed offsets (streams only).
    """

    kind: str
    per_partition: Mapping[tuple[str, int], int] = field(default_factory=dict)
    global_timestamp: int | None = None
    option: str = ""  # the option it came from, for error messages

    def describe(self) -> str:
        return f"{self.option}={self.kind}"


@dataclass(frozen=True)
class Subscription:
    """Which topics (or partitions) to read: exactly one of the three Spark strategies."""

    kind: str  # "subscribe" | "subscribePattern" | "assign"
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assignment: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        return "assign=" + json.dumps(_group_partitions(self.assignment))

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assignment)


@dataclass(frozen=True)
class SourceOptions:
    """The validated options of one read. Picklable; contains no live objects."""

    subscription: Subscription
    client_config: Mapping[str, object]  # kafka-python client settings (from kafka.* options)
    starting: OffsetSpec
    ending: OffsetSpec | None  # None for streams
    starting_by_timestamp_strategy: str = "error"
    include_headers: bool = False
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_partitions: int | None = None   # None: Spark's default parallelism (see planning)
    fetch_offset_num_retries: int = DEFAULT_FETCH_OFFSET_NUM_RETRIES
    fetch_offset_retry_interval_ms: int = DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    # valueFormat/keyFormat with their reader schemas (kafka_source.formats.options.Formats),
    # settled by the data source when the query is defined; None: binary key and value.
    formats: object = None

    @property
    def read_committed(self) -> bool:
        return self.client_config.get("isolation_level") == "read_committed"

    @property
    def bootstrap_servers(self) -> str:
        return str(self.client_config["bootstrap_servers"])


def _lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in options.items()}


def _group_partitions(pairs) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for topic, partition in pairs:
        grouped.setdefault(topic, []).append(partition)
    return grouped


def parse_bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise OptionError(f"Option '{key}' must be 'true' or 'false', got '{raw}'.")


def parse_int(opts: Mapping[str, str], key: str, default: int | None, *, minimum: int | None = None,
              what: str = "an integer") -> int | None:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"Option '{key}' must be {what}, got '{raw}'.") from None
    if minimum is not None and value < minimum:
        raise OptionError(f"Option '{key}' must be {what}, got '{raw}'.")
    return value


# --- subscription -------------------------------------------------------------------------------

def parse_subscription(opts: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    names = {"subscribe": "subscribe", "subscribepattern": "subscribePattern", "assign": "assign"}
    if len(given) > 1:
        raise OptionError(
            "Only one of the options 'subscribe', 'subscribePattern' and 'assign' may be set, got "
            + " and ".join(f"'{names[k]}'" for k in given) + ".")
    if not given:
        raise OptionError(
            "One of the options 'subscribe' (comma-separated topics), 'subscribePattern' (a Java "
            "regex over topic names) or 'assign' (JSON like {\"topicA\":[0,1]}) must be set.")
    key = given[0]
    raw = str(opts[key])
    if key == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError(f"Option 'subscribe' names no topics: '{raw}'. Give a comma-separated "
                              "list of topic names.")
        return Subscription("subscribe", topics=tuple(dict.fromkeys(topics)))
    if key == "subscribepattern":
        if not raw.strip():
            raise OptionError("Option 'subscribePattern' is empty. Give a regex over topic names, "
                              "for example 'events-.*'.")
        try:
            re.compile(raw)
        except re.error as exc:
            raise OptionError(f"Option 'subscribePattern' is not a valid regex ('{raw}'): {exc}.") \
                from None
        return Subscription("subscribePattern", pattern=raw)
    return Subscription("assign", assignment=_parse_assign(raw))


def _parse_json_object(raw: str, option: str, example: str) -> dict:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, TypeError) as exc:
        raise OptionError(f"Option '{option}' is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc}): "
                          f"'{raw}'. Expected something like {example}.") from None
    if not isinstance(value, dict):
        raise OptionError(f"Option '{option}' must be a JSON object like {example}, got '{raw}'.")
    return value


def _check_partition(value, option: str, topic: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionError(f"Option '{option}': partition {value!r} of topic '{topic}' is not a "
                          "non-negative integer.")
    return value


def _parse_assign(raw: str) -> tuple[tuple[str, int], ...]:
    example = '{"topicA":[0,1],"topicB":[2,4]}'
    obj = _parse_json_object(raw, "assign", example)
    pairs: list[tuple[str, int]] = []
    for topic, partitions in obj.items():
        if not isinstance(partitions, list):
            raise OptionError(f"Option 'assign': topic '{topic}' must map to a list of partitions, "
                              f"like {example}; got {json.dumps(partitions)}.")
        for p in partitions:
            pairs.append((topic, _check_partition(p, "assign", topic)))
    if not pairs:
        raise OptionError(f"Option 'assign' names no partitions: '{raw}'. Expected something like "
                          f"{example}.")
    return tuple(dict.fromkeys(pairs))


# --- offsets ----------------------------------------------------------------------------------

def _parse_partition_map(raw: str, option: str, example: str, *, allow_special: bool
                         ) -> dict[tuple[str, int], int]:
    obj = _parse_json_object(raw, option, example)
    result: dict[tuple[str, int], int] = {}
    for topic, parts in obj.items():
        if not isinstance(parts, dict):
            raise OptionError(f"Option '{option}': topic '{topic}' must map to an object of "
                              f"partition -> value, like {example}; got {json.dumps(parts)}.")
        for p, value in parts.items():
            try:
                partition = int(p)
            except ValueError:
                raise OptionError(f"Option '{option}': partition '{p}' of topic '{topic}' is not "
                                  "an integer.") from None
            _check_partition(partition, option, topic)
            if isinstance(value, bool) or not isinstance(value, int):
                raise OptionError(f"Option '{option}': value for {topic}-{partition} must be an "
                                  f"integer, got {json.dumps(value)}.")
            lowest = -2 if allow_special else 0
            if value < lowest:
                valid = ("an offset >= 0, -2 (earliest) or -1 (latest)" if allow_special
                         else "a timestamp in milliseconds >= 0")
                raise OptionError(f"Option '{option}': value {value} for {topic}-{partition} is "
                                  f"invalid; use {valid}.")
            result[(topic, partition)] = value
    if not result:
        raise OptionError(f"Option '{option}' names no partitions: '{raw}'. Expected something "
                          f"like {example}.")
    return result


def parse_offset_spec(opts: Mapping[str, str], *, which: str, default: str,
                      allowed_words: tuple[str, ...]) -> OffsetSpec:
    """Parse ``{which}Offsets``, ``{which}OffsetsByTimestamp`` and ``{which}Timestamp``.

    Spark's precedence: ``{which}Timestamp`` > ``{which}OffsetsByTimestamp`` > ``{which}Offsets``.
    """
    ts_key, by_ts_key, off_key = (f"{which}Timestamp", f"{which}OffsetsByTimestamp",
                                  f"{which}Offsets")
    if ts_key.lower() in opts:
        ts = parse_int(opts, ts_key, None, minimum=0, what="a timestamp in milliseconds (>= 0)")
        return OffsetSpec("timestamp", global_timestamp=ts, option=ts_key)
    if by_ts_key.lower() in opts:
        example = '{"topicA":{"0":1700000000000,"1":1700000000000}}'
        per = _parse_partition_map(str(opts[by_ts_key.lower()]), by_ts_key, example,
                                   allow_special=False)
        return OffsetSpec("timestamps", per_partition=per, option=by_ts_key)
    raw = str(opts.get(off_key.lower(), default)).strip()
    word = raw.lower()
    if word in ("earliest", "latest"):
        if word not in allowed_words:
            raise OptionError(f"Option '{off_key}' can't be '{word}' for this query; valid values "
                              f"are {' or '.join(repr(w) for w in allowed_words)} or a JSON object "
                              "of offsets per partition.")
        return OffsetSpec(word, option=off_key)
    if not raw.startswith("{"):
        raise OptionError(f"Option '{off_key}' must be {' or '.join(repr(w) for w in allowed_words)} "
                          f"or JSON like {{\"topicA\":{{\"0\":23,\"1\":-2}}}}, got '{raw}'.")
    example = '{"topicA":{"0":23,"1":-2},"topicB":{"0":-1}}'
    per = _parse_partition_map(raw, off_key, example, allow_special=True)
    for (topic, partition), value in per.items():
        if value == EARLIEST and "earliest" not in allowed_words:
            raise OptionError(f"Option '{off_key}': {topic}-{partition} can't be -2 (earliest) "
                              "here; use an offset or -1 (latest).")
        if value == LATEST and "latest" not in allowed_words:
            raise OptionError(f"Option '{off_key}': {topic}-{partition} can't be -1 (latest) "
                              "here; use an offset or -2 (earliest).")
    return OffsetSpec("offsets", per_partition=per, option=off_key)


def _warn_about_names(opts: Mapping[str, str], scope: str) -> None:
    """Names that are no option (a typo) or for another kind of query: one warning each,
    from the option catalog (imported here: it imports this module for its defaults)."""
    from .catalog import warn_about_names

    warn_about_names(opts, scope, log)
    if opts.get("kafka.client.rack", "").strip():
        # Accepted (a query moved from format("kafka") keeps working), but not silently: with
        # Spark's source it makes the Java consumer fetch from a replica in the same rack or
        # zone (KIP-392), and without that, reads cross zones wherever the leaders are.
        log.warning("Option 'kafka.client.rack' has no effect: pykafka fetches from each "
                    "partition's leader and does not fetch from the closest replica (KIP-392) "
                    "yet, so records from leaders in other racks or zones cross them.")


def _check_unsupported_kafka_params(opts: Mapping[str, str], *, streaming: bool) -> None:
    for name, instead in _UNSUPPORTED_KAFKA_PARAMS.items():
        if f"kafka.{name}" in opts:
            raise OptionError(f"Kafka option 'kafka.{name}' is not supported: {instead}.")
    if not streaming and "kafka.auto.offset.reset" in opts:
        raise OptionError("Kafka option 'kafka.auto.offset.reset' is not supported for batch "
                          "reads; set 'startingOffsets' to 'earliest' or an offset JSON instead.")


def _check_offsets_within_subscription(spec: OffsetSpec, sub: Subscription) -> None:
    if sub.kind != "assign":
        return
    assigned = set(sub.assignment)
    for tp in spec.per_partition:
        if tp not in assigned:
            raise OptionError(f"Option '{spec.option}' names {tp[0]}-{tp[1]}, which is not in "
                              f"'assign' ({sub.describe()[7:]}).")


def validate_common_options(options: Mapping[str, str]) -> None:
    """Checks that hold for batch and streaming reads alike; run when the DataFrame is defined.

    With TLS, the trust and key stores are opened too, so that a missing file or a wrong
    password fails here, naming the option, rather than in the first task."""
    opts = _lower_keys(options)
    parse_subscription(opts)
    config = client_config_from_options(opts)
    if uses_tls(config):
        from ..wire.net.tls import ssl_context

        ssl_context(config)
    parse_bool(opts, "includeHeaders", False)


def parse_batch_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the options of ``spark.read.format("pykafka")``."""
    opts = _lower_keys(options)
    _warn_about_names(opts, "read")
    sub = parse_subscription(opts)
    _check_unsupported_kafka_params(opts, streaming=False)
    starting = parse_offset_spec(opts, which="starting", default="earliest",
                                 allowed_words=("earliest",))
    ending = parse_offset_spec(opts, which="ending", default="latest", allowed_words=("latest",))
    for spec in (starting, ending):
        _check_offsets_within_subscription(spec, sub)
    return _common(opts, sub, starting, ending)


# --- streams ------------------------------------------------------------------------------------

DEFAULT_GROUP_ID_PREFIX = "spark-kafka-source"
DEFAULT_SESSION_TIMEOUT_MS = 45_000     # Java consumer default since Kafka 3.0
DEFAULT_HEARTBEAT_INTERVAL_MS = 3_000
DEFAULT_MAX_POLL_INTERVAL_MS = 300_000  # the rebalance timeout sent in JoinGroup
DEFAULT_API_TIMEOUT_MS = 60_000         # Java consumer: how long commitSync/committed retry
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000
_AUTO_OFFSET_RESET = ("earliest", "latest", "none")
# What Kafka accepts as a group.instance.id (JoinGroupRequest.validateGroupInstanceId).
_INSTANCE_ID = re.compile(r"[A-Za-z0-9._-]{1,249}")
_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000,
                  "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True)
class GroupOptions:
    """How the driver takes part in the consumer group (see :mod:`kafka_source.group.member`)."""

    group_id: str
    group_id_given: bool          # True when 'kafka.group.id' was set (else a generated id)
    assignor: str     # 'range' | 'roundrobin' | 'sticky' | 'cooperative-sticky' | 'pkg.mod:Class'
    commit_offsets: bool
    session_timeout_ms: int
    heartbeat_interval_ms: int
    rebalance_timeout_ms: int     # kafka.max.poll.interval.ms
    auto_offset_reset: str        # 'earliest' | 'latest' | 'none'
    api_timeout_ms: int = DEFAULT_API_TIMEOUT_MS   # kafka.default.api.timeout.ms
    group_instance_id: str | None = None   # kafka.group.instance.id: static membership (KIP-345)
    protocol: str = "classic"     # kafka.group.protocol: 'classic' | 'consumer' (KIP-848)
    remote_assignor: str | None = None     # kafka.group.remote.assignor (consumer protocol)
    pattern: str | None = None    # subscribePattern, sent as the member's regex (consumer)


@dataclass(frozen=True)
class StreamOptions:
    """The validated options of ``spark.readStream.format("pykafka")``."""

    source: SourceOptions
    group: GroupOptions
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS


def parse_duration_ms(opts: Mapping[str, str], key: str, default: int) -> int:
    """A Spark time string ('15m', '30s', '500ms', '1h'; a bare number is milliseconds)."""
    raw = opts.get(key.lower())
    if raw is None:
        return default
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", str(raw).lower())
    if not match or match.group(2) not in ("", *_TIME_UNITS_MS):
        raise OptionError(f"Option '{key}' must be a duration like '15m', '30s' or '500ms' "
                          f"(units: {', '.join(_TIME_UNITS_MS)}), got '{raw}'.")
    return int(int(match.group(1)) * _TIME_UNITS_MS.get(match.group(2) or "ms", 1))


def _parse_group(opts: Mapping[str, str], sub: Subscription) -> GroupOptions:
    group_id = opts.get("kafka.group.id")
    if group_id is not None and not str(group_id).strip():
        raise OptionError("Option 'kafka.group.id' is empty; give a consumer group name or leave "
                          "it out to use a generated one ('groupIdPrefix').")
    prefix = str(opts.get("groupidprefix", DEFAULT_GROUP_ID_PREFIX)).strip()
    if not prefix:
        raise OptionError("Option 'groupIdPrefix' is empty.")
    assignor = str(opts.get("assignor", "range")).strip()
    if not assignor:
        raise OptionError("Option 'assignor' is empty; valid values are 'range', 'roundrobin', "
                          "'sticky', 'cooperative-sticky' or 'package.module:ClassName' of your "
                          "own assignor class.")
    session = parse_int(opts, "kafka.session.timeout.ms", DEFAULT_SESSION_TIMEOUT_MS, minimum=1,
                        what="milliseconds (> 0)")
    heartbeat = parse_int(opts, "kafka.heartbeat.interval.ms",
                          min(DEFAULT_HEARTBEAT_INTERVAL_MS, max(session // 3, 1)), minimum=1,
                          what="milliseconds (> 0)")
    if heartbeat >= session:
        raise OptionError(f"Option 'kafka.heartbeat.interval.ms' ({heartbeat}) must be lower "
                          f"than 'kafka.session.timeout.ms' ({session}); Kafka recommends at most "
                          "a third of it.")
    rebalance = parse_int(opts, "kafka.max.poll.interval.ms", DEFAULT_MAX_POLL_INTERVAL_MS,
                          minimum=1, what="milliseconds (> 0)")
    api_timeout = parse_int(opts, "kafka.default.api.timeout.ms", DEFAULT_API_TIMEOUT_MS,
                            minimum=1, what="milliseconds (> 0)")
    reset = str(opts.get("kafka.auto.offset.reset", "latest")).strip().lower()
    if reset not in _AUTO_OFFSET_RESET:
        raise OptionError(f"Option 'kafka.auto.offset.reset' must be 'earliest', 'latest' or "
                          f"'none', got '{opts['kafka.auto.offset.reset']}'.")
    return GroupOptions(
        group_id=(str(group_id).strip() if group_id is not None
                  else f"{prefix}-{uuid.uuid4()}"),
        group_instance_id=_parse_group_instance_id(opts, sub,
                                                   group_id_given=group_id is not None),
        group_id_given=group_id is not None,
        assignor=assignor,
        commit_offsets=parse_bool(opts, "commitOffsets", True),
        session_timeout_ms=session,
        heartbeat_interval_ms=heartbeat,
        rebalance_timeout_ms=rebalance,
        auto_offset_reset=reset,
        api_timeout_ms=api_timeout,
        **_parse_group_protocol(opts, sub),
    )


# The server-side assignors Kafka 4.0 brokers offer (group.consumer.assignors).
_REMOTE_ASSIGNORS = ("uniform", "range")
# Settings of the classic protocol that the consumer protocol (KIP-848) moves to the brokers or
# drops; Java's consumer refuses them with group.protocol=consumer, and so do we.
_CLASSIC_ONLY = {
    "assignor": "the brokers assign the partitions: use 'kafka.group.remote.assignor' "
                "('uniform' or 'range')",
    "kafka.session.timeout.ms": "the brokers' group.consumer.session.timeout.ms applies",
    "kafka.heartbeat.interval.ms": "the brokers' group.consumer.heartbeat.interval.ms applies",
}


def _parse_group_protocol(opts: Mapping[str, str], sub: Subscription) -> dict:
    """``kafka.group.protocol`` and ``kafka.group.remote.assignor`` (KIP-848), as Java's
    consumer names and checks them: ``classic`` (JoinGroup/SyncGroup, the default) or
    ``consumer`` (ConsumerGroupHeartbeat, Kafka 4.0+; see
    :mod:`kafka_source.group.consumer_protocol`)."""
    raw = opts.get("kafka.group.protocol")
    protocol = "classic" if raw is None else str(raw).strip().lower()
    if protocol not in ("classic", "consumer"):
        raise OptionError(f"Option 'kafka.group.protocol' must be 'classic' (JoinGroup and "
                          f"SyncGroup, any broker) or 'consumer' (KIP-848, Kafka 4.0+), got "
                          f"'{raw}'.")
    raw_assignor = opts.get("kafka.group.remote.assignor")
    remote = None if raw_assignor is None else str(raw_assignor).strip().lower()
    if protocol == "classic":
        if remote is not None:
            raise OptionError("Option 'kafka.group.remote.assignor' needs "
                              "'kafka.group.protocol' = 'consumer' (the brokers assign "
                              "partitions only in that protocol); with 'classic' use 'assignor'.")
        return {}
    if remote is not None and remote not in _REMOTE_ASSIGNORS:
        raise OptionError(f"Option 'kafka.group.remote.assignor' must be one of "
                          f"{', '.join(repr(a) for a in _REMOTE_ASSIGNORS)} (the assignors "
                          f"Kafka's brokers offer), got '{raw_assignor}'.")
    for key, why in _CLASSIC_ONLY.items():
        if key in opts:
            raise OptionError(f"Option '{key}' belongs to the classic group protocol and cannot "
                              f"be set with 'kafka.group.protocol' = 'consumer': {why}.")
    return {"protocol": protocol, "remote_assignor": remote,
            "pattern": sub.pattern if sub.kind == "subscribePattern" else None}


def _parse_group_instance_id(opts: Mapping[str, str], sub: Subscription, *,
                             group_id_given: bool) -> str | None:
    """``kafka.group.instance.id``: the query is a static member of its group (KIP-345)."""
    raw = opts.get("kafka.group.instance.id")
    if raw is None:
        return None
    value = str(raw).strip()
    if not value:
        raise OptionError("Option 'kafka.group.instance.id' is empty; give this query's own "
                          "static member name, or leave it out for a dynamic member.")
    if not _INSTANCE_ID.fullmatch(value) or value in (".", ".."):
        raise OptionError(f"Option 'kafka.group.instance.id' = '{raw}' is not a valid group "
                          "instance id: Kafka accepts 1 to 249 ASCII letters, digits, '.', '_' "
                          "and '-' (not '.' or '..' alone).")
    if sub.kind == "assign":
        raise OptionError("Option 'kafka.group.instance.id' makes the query a static member of "
                          "its consumer group, but with 'assign' it does not join the group. "
                          "Use 'subscribe' or 'subscribePattern', or leave the option out.")
    if not group_id_given:
        raise OptionError("Option 'kafka.group.instance.id' needs 'kafka.group.id': a static "
                          "member keeps its place in a group across restarts, and without "
                          "'kafka.group.id' every run of the query has a new, generated group.")
    return value


def parse_stream_options(options: Mapping[str, str]) -> StreamOptions:
    """Validate the options of ``spark.readStream.format("pykafka")``."""
    opts = _lower_keys(options)
    _warn_about_names(opts, "stream")
    sub = parse_subscription(opts)
    _check_unsupported_kafka_params(opts, streaming=True)
    for key in ("endingoffsets", "endingoffsetsbytimestamp", "endingtimestamp"):
        if key in opts:
            name = {"endingoffsets": "endingOffsets",
                    "endingoffsetsbytimestamp": "endingOffsetsByTimestamp",
                    "endingtimestamp": "endingTimestamp"}[key]
            raise OptionError(f"Option '{name}' is for batch reads (spark.read) only; a stream "
                              "has no end. Use Trigger.AvailableNow to read what is there and "
                              "stop, or a batch read with 'endingOffsets'.")
    group = _parse_group(opts, sub)
    default_start = "group" if group.group_id_given else "latest"
    raw_start = str(opts.get("startingoffsets", default_start)).strip()
    if raw_start.lower() == "group" and not any(
            k in opts for k in ("startingtimestamp", "startingoffsetsbytimestamp")):
        if not group.group_id_given:
            raise OptionError("Option 'startingOffsets' is 'group' but 'kafka.group.id' is not "
                              "set: a generated group has no committed offsets. Set "
                              "'kafka.group.id', or use 'earliest', 'latest' or offset JSON.")
        starting = OffsetSpec("group", option="startingOffsets")
    else:
        starting = parse_offset_spec(opts, which="starting", default=default_start,
                                     allowed_words=("earliest", "latest"))
    _check_offsets_within_subscription(starting, sub)
    max_per = parse_int(opts, "maxOffsetsPerTrigger", None, minimum=1, what="a positive integer")
    min_per = parse_int(opts, "minOffsetsPerTrigger", None, minimum=1, what="a positive integer")
    if max_per is not None and min_per is not None and min_per > max_per:
        raise OptionError(f"Option 'minOffsetsPerTrigger' ({min_per}) can't be greater than "
                          f"'maxOffsetsPerTrigger' ({max_per}).")
    if "maxtriggerdelay" in opts and min_per is None:
        log.warning("Option 'maxTriggerDelay' has no effect without 'minOffsetsPerTrigger'.")
    return StreamOptions(
        source=_common(opts, sub, starting, None),
        group=group,
        max_offsets_per_trigger=max_per,
        min_offsets_per_trigger=min_per,
        max_trigger_delay_ms=parse_duration_ms(opts, "maxTriggerDelay",
                                               DEFAULT_MAX_TRIGGER_DELAY_MS),
    )


def _common(opts: dict[str, str], sub: Subscription, starting: OffsetSpec,
            ending: OffsetSpec | None) -> SourceOptions:
    strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError("Option 'startingOffsetsByTimestampStrategy' must be 'error' or "
                          f"'latest', got '{opts['startingoffsetsbytimestampstrategy']}'.")
    from ..formats.options import check_format_options

    check_format_options(opts)
    min_partitions = parse_int(opts, "minPartitions", None, minimum=1, what="a positive integer")
    max_partitions = parse_int(opts, "maxPartitions", None, minimum=1, what="a positive integer")
    if min_partitions is not None and max_partitions is not None \
            and min_partitions > max_partitions:
        raise OptionError(f"Option 'minPartitions' ({min_partitions}) can't be greater than "
                          f"'maxPartitions' ({max_partitions}).")
    return SourceOptions(
        subscription=sub,
        client_config=client_config_from_options(opts),
        starting=starting,
        ending=ending,
        starting_by_timestamp_strategy=strategy,
        include_headers=parse_bool(opts, "includeHeaders", False),
        fail_on_data_loss=parse_bool(opts, "failOnDataLoss", True),
        min_partitions=min_partitions,
        max_records_per_partition=parse_int(opts, "maxRecordsPerPartition", None, minimum=1,
                                            what="a positive integer"),
        max_partitions=max_partitions,
        fetch_offset_num_retries=parse_int(opts, "fetchOffset.numRetries",
                                           DEFAULT_FETCH_OFFSET_NUM_RETRIES, minimum=0,
                                           what="an integer >= 0"),
        fetch_offset_retry_interval_ms=parse_int(opts, "fetchOffset.retryIntervalMs",
                                                 DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS,
                                                 minimum=0, what="milliseconds (>= 0)"),
        poll_timeout_ms=parse_int(opts, "kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS,
                                  minimum=1, what="milliseconds (> 0)"),
    )
