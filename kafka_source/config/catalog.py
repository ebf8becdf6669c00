"""Every option the connector knows, in one table: the parsers' vocabulary and the docs' reference.

The parsers (:mod:`~kafka_source.config.options`, :mod:`~kafka_source.config.client_config`,
:mod:`~kafka_source.config.sink_options`) read and check the values; this module says which names
exist, where each applies, what it defaults to and means, and which Spark or Kafka option it
mirrors. Both sides of the source use it:

* :func:`warn_about_names` runs in every parse and warns about a name that is in no entry (with
  the nearest known names: ``startingOffset`` is a typo, not an option), or that belongs to
  another kind of query (``maxOffsetsPerTrigger`` on a batch read). Spark's own source ignores
  both silently; a typo in an option name is a classic way to read from the wrong place.
* :func:`render_markdown` writes the documentation's option reference (``docs/hooks.py`` calls
  it while the site is built), so the reference cannot drift from the code.

``tests/unit/test_option_reference.py`` holds the two together: every name a parser reads or
accepts has an entry here, and every entry is read or accepted by the parsers where it says.

Defaults are shown from the parsers' own constants wherever they have one (evaluated when the
reference is rendered), so a changed default changes the reference.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from . import client_config as _client
from . import oauthbearer as _oauth
from . import options as _options

#: The three kinds of query: ``spark.read``, ``spark.readStream``, ``df.write``/``df.writeStream``.
SCOPES = ("read", "stream", "write")
SCOPE_WORDS = {"read": "a batch read (spark.read)", "stream": "a stream (spark.readStream)",
               "write": "a write (df.write / df.writeStream)"}

USED, IGNORED, REFUSED = "used", "ignored", "refused"

# Spark's own options that reach a data source among the user's (DataStreamWriter passes
# checkpointLocation through, and queryName(...) as an option 'queryName'; load(path) and
# save(path) pass path): never warned about.
_SPARK_PASS_THROUGH = frozenset({"path", "checkpointlocation", "queryname"})


@dataclass(frozen=True)
class Option:
    """One option name, as users write it, in the scopes where it behaves as ``status`` says."""

    name: str
    scopes: tuple[str, ...]
    default: str | Callable[[], str]
    meaning: str
    mirrors: str
    section: str
    status: str = USED        # used | ignored (accepted, no effect) | refused (an error)
    example: str = ""         # a valid value, for the tests
    requires: Mapping[str, str] = field(default_factory=dict)   # options it needs beside it
    secret: bool = False

    @property
    def key(self) -> str:
        return self.name.lower()

    def default_text(self) -> str:
        return self.default() if callable(self.default) else self.default


def _kp(name: str) -> Callable[[], str]:
    """kafka-python's default for a connection setting (its KafkaConnectionManager's)."""
    def default() -> str:
        from kafka.net.manager import KafkaConnectionManager

        return f"`{KafkaConnectionManager.DEFAULT_CONFIG[name]}`"
    return default


def _producer(name: str) -> Callable[[], str]:
    """The sink's default for a producer setting (its ``ProducerSettings``)."""
    def default() -> str:
        from .producer_settings import ProducerSettings

        value = getattr(ProducerSettings(), name)
        if name == "acks":
            return "`all`"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        return f"`{value}`"
    return default


def _login(name: str) -> str:
    """The OAUTHBEARER login's default for one of its settings."""
    return f"`{getattr(_oauth.OAuthBearerLogin(), name)}`"


def _fetch(name: str) -> str:
    value = _client.DEFAULT_FETCH_SETTINGS[name]
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


R, S, W = ("read",), ("stream",), ("write",)
RS, RSW = ("read", "stream"), ("read", "stream", "write")
_JC, _JP, _J, _SP, _PK = ("Java consumer", "Java producer", "Java client", "Spark",
                          "pykafka's own")
_TLS_MODULE = "kafka_source.wire.net.tls"
_FMT = "Formats and the Schema Registry"
# A FileDescriptorSet (base64) of shop.proto: messages shop.Order and shop.Key, each a string id.
_SHOP_PROTO = ("CkIKCnNob3AucHJvdG8SBHNob3AiEwoFT3JkZXISCgoCaWQYASABKAkiEQoDS2V5EgoKAmlkGAEgASgJYg"
               "Zwcm90bzM=")

# Sections, in the order the reference shows them.
SECTIONS = (
    ("Subscription", "Which topics or partitions a read takes. Exactly one is required."),
    ("Offsets", "Where a read starts and ends. A checkpoint always wins over these on a "
                "stream's restart."),
    ("Tasks and retries", "How ranges become Spark tasks, and how long the planning and the "
                          "tasks wait for Kafka."),
    ("Streams: rate limits", "How much each micro-batch takes."),
    ("Streams: the consumer group", "The stream joins a consumer group and commits each "
                                    "completed micro-batch's end offsets."),
    ("Connection", "Reads and writes take the same connection options."),
    ("TLS", f"Trust and key stores, PKCS12 or PEM (read by `{_TLS_MODULE}`)."),
    ("SASL", "PLAIN, SCRAM-SHA-256/512, OAUTHBEARER and GSSAPI, with the Java client's names."),
    ("SASL/OAUTHBEARER", "The Java client's OAUTHBEARER login options (OIDC client "
                         "credentials, KIP-768; unsecured tokens)."),
    ("Fetching", "The executors' fetch loop."),
    ("Formats and the Schema Registry", "Keys and values decoded into columns (Avro, JSON "
     "Schema, Protobuf) and columns written in the same formats, in Confluent's wire format, "
     "the schemas from a Schema Registry (Confluent's REST API). Each `value...` option has a `key...` "
     "twin for the key."),
    ("Writing", "The sink (`df.write`, `df.writeStream`)."),
    ("Producer", "The sink's producer, with the Java producer's names, defaults and rules "
                 "between them."),
    ("Accepted without effect", "Names Spark's JVM source and the Java clients accept that "
                                "mean nothing here: accepted quietly (or with one warning, "
                                "where the user may expect an effect)."),
    ("Refused", "Names that would change what is read or written and cannot be honoured "
                "here: an error that says what to use instead."),
)

OPTIONS: tuple[Option, ...] = (
    # --- Subscription ----------------------------------------------------------------------
    Option("subscribe", RS, "(one of the three)", "Comma-separated topic names.", _SP,
           "Subscription", example="t1,t2"),
    Option("subscribePattern", RS, "(one of the three)",
           "A regex over topic names (whole-name match); topics created later join on the next "
           "trigger.", _SP, "Subscription", example="events-.*"),
    Option("assign", RS, "(one of the three)",
           "JSON of topic to partitions, `{\"topicA\":[0,1]}`. A stream with `assign` joins no "
           "group (its commits still go to `kafka.group.id`).", _SP, "Subscription",
           example='{"t1":[0,1]}'),
    # --- Offsets -----------------------------------------------------------------------------
    Option("startingOffsets", R, "`earliest`",
           "`earliest` or JSON `{\"t\":{\"0\":23,\"1\":-2}}` (-2 earliest, -1 latest); `latest` "
           "is invalid for batch reads.", _SP, "Offsets", example="earliest"),
    Option("startingOffsets", S, "`group` with `kafka.group.id`, else `latest`",
           "`group` (the group's committed offsets; partitions without one use "
           "`kafka.auto.offset.reset`), `latest`, `earliest` or JSON. Only for a new query: a "
           "checkpoint always wins on restart.", _SP, "Offsets", example="earliest"),
    Option("endingOffsets", R, "`latest`",
           "`latest` or JSON with -1 for latest; `earliest` is invalid (and any ending option "
           "is an error on a stream).", _SP, "Offsets", example="latest"),
    Option("startingTimestamp", RS, "(unset)",
           "Start every partition at the first offset whose timestamp is at least this many ms "
           "since the epoch. Precedence: `startingTimestamp` > `startingOffsetsByTimestamp` > "
           "`startingOffsets`.", _SP, "Offsets", example="1700000000000"),
    Option("startingOffsetsByTimestamp", RS, "(unset)",
           "The same per partition: JSON `{\"t\":{\"0\":1700000000000}}`.", _SP, "Offsets",
           example='{"t1":{"0":1700000000000}}', requires={"subscribe": "t1"}),
    Option("startingOffsetsByTimestampStrategy", RS, "`error`",
           "`error` or `latest`: what to do when no record of a partition is that recent.", _SP,
           "Offsets", example="latest"),
    Option("endingTimestamp", R, "(unset)",
           "End every partition at the first offset whose timestamp is at least this (no match "
           "means latest).", _SP, "Offsets", example="1700000000000"),
    Option("endingOffsetsByTimestamp", R, "(unset)", "The same per partition, as JSON.", _SP,
           "Offsets", example='{"t1":{"0":1700000000000}}', requires={"subscribe": "t1"}),
    Option("failOnDataLoss", RS, "`true`",
           "Fail when requested offsets are gone from Kafka (retention, compaction, a recreated "
           "topic, a log truncated by an unclean leader election); `false`: warn and read what "
           "is left.", _SP, "Offsets", example="false"),
    Option("includeHeaders", RS, "`false`", "Add the `headers` column.", _SP, "Offsets",
           example="true"),
    # --- Tasks and retries -------------------------------------------------------------------
    Option("minPartitions", RS, "(unset)",
           "Split large offset ranges into at least this many Spark tasks, as Spark does.", _SP,
           "Tasks and retries", example="4"),
    Option("maxRecordsPerPartition", RS, "(unset)",
           "At most this many records in one Spark task.", _SP, "Tasks and retries",
           example="100000"),
    Option("maxPartitions", RS,
           "Spark's default parallelism after `kafka_source.register(spark)`; unset with "
           "auto-registration",
           "At most this many Spark tasks when small ranges are packed together (there is "
           "always at most one task per 100,000 records and per partition piece); "
           "`minPartitions` and `maxRecordsPerPartition` win over it.", _PK,
           "Tasks and retries", example="8"),
    Option("fetchOffset.numRetries", RS, f"`{_options.DEFAULT_FETCH_OFFSET_NUM_RETRIES}`",
           "Retries of Metadata and ListOffsets while a query is planned; they go on for at "
           "least `kafka.request.timeout.ms`, so that a restarting broker does not fail the "
           "query.", _SP, "Tasks and retries", example="5"),
    Option("fetchOffset.retryIntervalMs", RS,
           f"`{_options.DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS}`",
           "The longest pause between those retries (ms): the first comes after "
           "`kafka.retry.backoff.ms`, each next one after twice as long, up to this.", _SP,
           "Tasks and retries", example="500"),
    Option("kafkaConsumer.pollTimeoutMs", RS, f"`{_options.DEFAULT_POLL_TIMEOUT_MS}`",
           "How long a task waits without progress before it fails (ms).", _SP,
           "Tasks and retries", example="60000"),
    # --- Streams: rate limits ------------------------------------------------------------------
    Option("maxOffsetsPerTrigger", S, "(unset)",
           "At most this many records per micro-batch, shared across partitions by backlog, as "
           "Spark does.", _SP, "Streams: rate limits", example="1000"),
    Option("minOffsetsPerTrigger", S, "(unset)",
           "Hold a micro-batch back until this many records wait, but not longer than "
           "`maxTriggerDelay`; ignored by `Trigger.AvailableNow`.", _SP,
           "Streams: rate limits", example="10"),
    Option("maxTriggerDelay", S,
           f"`{_options.DEFAULT_MAX_TRIGGER_DELAY_MS // 60_000}m`",
           "The longest a micro-batch is held back by `minOffsetsPerTrigger` (a duration: "
           "`15m`, `30s`, `500ms`).", _SP, "Streams: rate limits", example="30s",
           requires={"minOffsetsPerTrigger": "10"}),
    # --- Streams: the consumer group ----------------------------------------------------------
    Option("kafka.group.id", S, "`groupIdPrefix` + a random UUID",
           "The consumer group the query joins and commits to (a new group per query unless "
           "set).", _JC, "Streams: the consumer group", example="orders-etl"),
    Option("groupIdPrefix", S, f"`{_options.DEFAULT_GROUP_ID_PREFIX}`",
           "The prefix of the generated group id.", _SP, "Streams: the consumer group",
           example="etl"),
    Option("assignor", S, "`range`",
           "`range`, `roundrobin`, `sticky`, `cooperative-sticky`, or `package.module:ClassName` "
           "of your own; the names are Kafka's, so Java and Python consumers with the same "
           "assignor share the group (Java's default list, `[range, cooperative-sticky]`, "
           "included). Classic protocol only.", _PK, "Streams: the consumer group",
           example="cooperative-sticky"),
    Option("commitOffsets", S, "`true`",
           "`false` joins the group but never commits.", _PK, "Streams: the consumer group",
           example="false"),
    Option("kafka.group.instance.id", S, "(unset: a dynamic member)",
           "Static membership (KIP-345, brokers 2.3+): the query's own stable member name; a "
           "restart within `kafka.session.timeout.ms` gets its partitions back without a "
           "rebalance. Needs `kafka.group.id` and `subscribe`/`subscribePattern`; one id per "
           "running query.", _JC, "Streams: the consumer group", example="etl-1",
           requires={"kafka.group.id": "g"}),
    Option("kafka.group.protocol", S, "`classic`",
           "`classic` (JoinGroup/SyncGroup, any broker) or `consumer` (KIP-848, Kafka 4.0+: the "
           "brokers assign partitions incrementally). With `consumer`, `assignor`, "
           "`kafka.session.timeout.ms` and `kafka.heartbeat.interval.ms` are refused, as Java's "
           "consumer refuses them.", _JC, "Streams: the consumer group", example="consumer"),
    Option("kafka.group.remote.assignor", S, "the brokers' default (`uniform`)",
           "With `kafka.group.protocol` `consumer`: the brokers' assignor, `uniform` or "
           "`range`.", _JC, "Streams: the consumer group", example="range",
           requires={"kafka.group.protocol": "consumer"}),
    Option("kafka.auto.offset.reset", S, "`latest`",
           "`latest`, `earliest`, or `none` (an error) for partitions the group has no "
           "committed offset for. Refused on batch reads (use `startingOffsets`).", _JC,
           "Streams: the consumer group", example="earliest"),
    Option("kafka.session.timeout.ms", S, f"`{_options.DEFAULT_SESSION_TIMEOUT_MS}`",
           "The group session: a member silent this long is removed.", _JC,
           "Streams: the consumer group", example="30000"),
    Option("kafka.heartbeat.interval.ms", S,
           f"`{_options.DEFAULT_HEARTBEAT_INTERVAL_MS}` (at most a third of the session)",
           "How often the member heartbeats; must be below the session timeout.", _JC,
           "Streams: the consumer group", example="1000"),
    Option("kafka.max.poll.interval.ms", S, f"`{_options.DEFAULT_MAX_POLL_INTERVAL_MS}`",
           "The rebalance timeout: how long a rebalance waits for members to rejoin.", _JC,
           "Streams: the consumer group", example="120000"),
    Option("kafka.default.api.timeout.ms", S, f"`{_options.DEFAULT_API_TIMEOUT_MS}`",
           "How long an offset fetch is retried before the query fails, and a commit before a "
           "rejoin or on leaving (on leaving at most 30 s, as Java's `close()`); per-trigger "
           "commits are best effort.", _JC, "Streams: the consumer group", example="30000"),
    # --- Connection ----------------------------------------------------------------------------
    Option("kafka.bootstrap.servers", RSW, "(required)", "`host:port,...` of some brokers.", _J,
           "Connection", example="broker1:9092,broker2:9092"),
    Option("kafka.client.id", RSW, "`pykafka`", "The client id the brokers log and quota by.",
           _J, "Connection", example="etl"),
    Option("kafka.request.timeout.ms", RSW, _kp("request_timeout_ms"),
           "The bound of every Kafka request, and of reaching `kafka.bootstrap.servers`; on "
           "writes also the producer's request timeout.", _J, "Connection", example="20000"),
    Option("kafka.socket.connection.setup.timeout.ms", RSW,
           _kp("socket_connection_setup_timeout_ms"),
           "How long one connection attempt may take.", _J, "Connection", example="5000"),
    Option("kafka.socket.connection.setup.timeout.max.ms", RSW,
           _kp("socket_connection_setup_timeout_max_ms"),
           "The ceiling the attempt timeout grows to on repeated failures.", _J, "Connection",
           example="20000"),
    Option("kafka.reconnect.backoff.ms", RSW, _kp("reconnect_backoff_ms"),
           "The first pause before reconnecting to a broker.", _J, "Connection", example="100"),
    Option("kafka.reconnect.backoff.max.ms", RSW,
           f"`{_client.RECONNECT_BACKOFF_MAX_MS}` (Java's; kafka-python's is 30000)",
           "The longest pause before reconnecting (the pause doubles per failed attempt up to "
           "this), so a restarted broker is reached within a second of being back.", _J,
           "Connection", example="10000"),
    Option("kafka.connections.max.idle.ms", RSW, _kp("connections_max_idle_ms"),
           "Idle connections are closed after this long.", _J, "Connection", example="60000"),
    Option("kafka.metadata.max.age.ms", RSW, _kp("metadata_max_age_ms"),
           "Metadata is refreshed at least this often.", _J, "Connection", example="60000"),
    Option("kafka.client.dns.lookup", RSW, _kp("client_dns_lookup"),
           "`use_all_dns_ips` or `resolve_canonical_bootstrap_servers_only`.", _J, "Connection",
           example="use_all_dns_ips"),
    Option("kafka.receive.message.max.bytes", RSW,
           f"`{_client.DEFAULT_RECEIVE_MESSAGE_MAX_BYTES}`",
           "The largest response accepted (never less than twice the fetch sizes plus 1 MiB): "
           "Kafka sends a record batch larger than the fetch sizes whole, so topics with larger "
           "batches (up to their `max.message.bytes`) need it raised; a read that meets one "
           "fails at once, naming the partition and the size.", "kafka-python", "Connection",
           example="200000000"),
    # --- Formats and the Schema Registry ----------------------------------------------------------
    Option("valueFormat", RSW, "`binary`",
           "`binary` (the bytes, as Spark's source), `avro`, `json` (JSON Schema) or "
           "`protobuf`: the value becomes a struct of the reader schema's fields (for Avro "
           "spark-avro's types, each record resolved from the schema that wrote it). On a "
           "write, `avro`, `json` or `protobuf`: the `value` column is written as Avro, as "
           "JSON documents checked against the JSON Schema, or as Protobuf messages, in the "
           "wire format.", _PK, _FMT,
           example="avro",
           requires={"valueSchema": '{"type": "string"}'}),
    Option("keyFormat", RSW, "`binary`", "The same for the key.", _PK, _FMT, example="avro",
           requires={"keySchema": '{"type": "string"}'}),
    Option("mode", RS, "`FAILFAST`",
           "`FAILFAST`: a record that cannot be decoded fails the task, naming topic, "
           "partition, offset and schema id. `PERMISSIVE`: its column is null and the reason "
           "is in `valueError` (`keyError`), columns added at the end.", _PK, _FMT,
           example="PERMISSIVE"),
    Option("schema.registry.url", RSW, "(unset)",
           "The registry's URL (several: comma-separated, tried in turn). Values are then "
           "expected in the wire format (magic byte, schema id, body).", "Confluent client",
           _FMT, example="http://registry:8081"),
    Option("schema.registry.basic.auth.user.info", RSW, "(unset)",
           "`user:password` for HTTP basic authentication.", "Confluent client", _FMT,
           example="user:secret", secret=True, requires={"schema.registry.url": "http://r:8081"}),
    Option("schema.registry.ssl.ca.location", RSW, "(unset: the system's CAs)",
           "CA certificates for an `https://` registry, a PEM file.", "Confluent client", _FMT,
           example="/etc/ca.pem", requires={"schema.registry.url": "http://r:8081"}),
    Option("schema.registry.ssl.certificate.location", RSW, "(unset)",
           "The client's certificate (mutual TLS), a PEM file.", "Confluent client", _FMT,
           example="/etc/client.pem", requires={"schema.registry.url": "http://r:8081"}),
    Option("schema.registry.ssl.key.location", RSW, "(unset)",
           "The client's private key, a PEM file.", "Confluent client", _FMT,
           example="/etc/client.key", requires={"schema.registry.url": "http://r:8081"}),
    Option("schema.registry.request.timeout.ms", RSW, "`10000`",
           "How long one registry request may take (ms).", _PK, _FMT, example="5000",
           requires={"schema.registry.url": "http://r:8081"}),
    Option("schema.registry.retry.ms", RSW, "`30000`",
           "How long an unreachable registry is retried before the query or task fails (ms).",
           _PK, _FMT, example="60000", requires={"schema.registry.url": "http://r:8081"}),
    Option("valueSchema", RSW, "(unset: from the registry)",
           "The reader schema inline: Avro JSON, a JSON Schema, or for Protobuf a "
           "FileDescriptorSet in base64 (`protoc --include_imports --descriptor_set_out`, as "
           "`from_protobuf` takes it). Without a registry the values are plain Avro "
           "bodies written with it (as spark-avro's `from_avro` takes them). On a write, the "
           "writer schema (else derived from the column's type).", _PK, _FMT,
           example='{"type": "string"}', requires={"valueFormat": "avro"}),
    Option("keySchema", RSW, "(unset: from the registry)", "The same for the key.", _PK, _FMT,
           example='{"type": "string"}', requires={"keyFormat": "avro"}),
    Option("valueSchemaId", RSW, "(unset)", "Read (write) with the schema of this registry id.",
           _PK, _FMT, example="7", requires={"valueFormat": "avro",
                                        "schema.registry.url": "http://r:8081"}),
    Option("keySchemaId", RSW, "(unset)", "The same for the key.", _PK, _FMT, example="7",
           requires={"keyFormat": "avro", "schema.registry.url": "http://r:8081"}),
    Option("valueSchemaVersion", RSW, "`latest` (when the query is defined)",
           "Read (write) with this version of the subject.", _PK, _FMT, example="3",
           requires={"valueFormat": "avro", "schema.registry.url": "http://r:8081"}),
    Option("keySchemaVersion", RSW, "`latest`", "The same for the key.", _PK, _FMT,
           example="3", requires={"keyFormat": "avro", "schema.registry.url": "http://r:8081"}),
    Option("valueSubject", RSW, "(from the strategy)", "The subject, named outright.", _PK, _FMT,
           example="orders-value",
           requires={"valueFormat": "avro", "schema.registry.url": "http://r:8081"}),
    Option("keySubject", RSW, "(from the strategy)", "The same for the key.", _PK, _FMT,
           example="orders-key",
           requires={"keyFormat": "avro", "schema.registry.url": "http://r:8081"}),
    Option("valueSubjectNameStrategy", RSW, "`TopicNameStrategy`",
           "`TopicNameStrategy` (`<topic>-value`), `RecordNameStrategy` (the record's full "
           "name) or `TopicRecordNameStrategy` (`<topic>-<record>`), as Confluent's "
           "serializers name subjects.", "Confluent client", _FMT,
           example="RecordNameStrategy",
           requires={"valueFormat": "avro", "schema.registry.url": "http://r:8081",
                     "valueRecordName": "com.example.Order"}),
    Option("keySubjectNameStrategy", RSW, "`TopicNameStrategy`", "The same for the key.",
           "Confluent client", _FMT, example="RecordNameStrategy",
           requires={"keyFormat": "avro", "schema.registry.url": "http://r:8081",
                     "keyRecordName": "com.example.Key"}),
    Option("valueRecordName", RSW, "(unset)",
           "The record's full name, for the record name strategies; on a write, the name of "
           "the record derived from the column's type (Avro: default `topLevelRecord`; JSON "
           "Schema: its `title`; Protobuf: the message and package, default "
           "`TopLevelRecord`).", _PK, _FMT,
           example="com.example.Order",
           requires={"valueFormat": "avro", "schema.registry.url": "http://r:8081",
                     "valueSubjectNameStrategy": "RecordNameStrategy"}),
    Option("keyRecordName", RSW, "(unset)", "The same for the key.", _PK, _FMT,
           example="com.example.Key",
           requires={"keyFormat": "avro", "schema.registry.url": "http://r:8081",
                     "keySubjectNameStrategy": "RecordNameStrategy"}),
    Option("valueMessageName", RSW, "(the file's first message)",
           "For `valueFormat` protobuf: the message to read (write), by full name, when the "
           "schema's file defines several.", _PK, _FMT, example="shop.Order",
           requires={"valueFormat": "protobuf", "valueSchema": _SHOP_PROTO}),
    Option("keyMessageName", RSW, "(the file's first message)", "The same for the key.", _PK,
           _FMT, example="shop.Key",
           requires={"keyFormat": "protobuf", "keySchema": _SHOP_PROTO}),
    Option("auto.register.schemas", W, "`true`",
           "A write registers its writer schema under the subject (an incompatible schema is "
           "an error quoting the registry); `false`: the schema must be registered already.",
           "Confluent client", _FMT, example="false",
           requires={"valueFormat": "avro", "schema.registry.url": "http://r:8081"}),
    Option("use.latest.version", W, "`false`",
           "A write uses the subject's latest registered schema, the column's fields matched "
           "to it by name (fields it lacks take their defaults).", "Confluent client", _FMT,
           example="true",
           requires={"valueFormat": "avro", "schema.registry.url": "http://r:8081"}),
    # --- TLS -----------------------------------------------------------------------------------
    Option("kafka.security.protocol", RSW, "`PLAINTEXT`",
           "`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.", _J, "TLS", example="SSL"),
    Option("kafka.ssl.truststore.location", RSW, "(unset: the system's CAs)",
           "A trust store file: PKCS12 (Java's default) or PEM; JKS is refused with the "
           "`keytool` command that converts it.", _J, "TLS", example="/etc/kafka/ca.p12"),
    Option("kafka.ssl.truststore.type", RSW, "(unset: told by the file's content)",
           "`PKCS12` or `PEM` (`JKS` is refused with the `keytool` command that converts "
           "it).", _J, "TLS",
           example="PEM"),
    Option("kafka.ssl.truststore.password", RSW, "(unset)", "The trust store's password.", _J,
           "TLS", example="secret", secret=True),
    Option("kafka.ssl.truststore.certificates", RSW, "(unset)",
           "CA certificates inline, PEM (with type `PEM`).", _J, "TLS", example="-----BEGIN",
           secret=True),
    Option("kafka.ssl.keystore.location", RSW, "(unset)",
           "A key store with the client's certificate and key (mutual TLS), PKCS12 or PEM.", _J,
           "TLS", example="/etc/kafka/client.p12"),
    Option("kafka.ssl.keystore.type", RSW, "(unset: told by the file's content)",
           "`PKCS12` or `PEM` (`JKS` is refused with the `keytool` command that converts "
           "it).", _J, "TLS",
           example="PEM"),
    Option("kafka.ssl.keystore.password", RSW, "(unset)", "The key store's password.", _J,
           "TLS", example="secret", secret=True),
    Option("kafka.ssl.keystore.key", RSW, "(unset)", "The client's private key inline, PEM.", _J,
           "TLS", example="-----BEGIN", secret=True),
    Option("kafka.ssl.keystore.certificate.chain", RSW, "(unset)",
           "The client's certificate chain inline, PEM.", _J, "TLS", example="-----BEGIN",
           secret=True),
    Option("kafka.ssl.key.password", RSW, "(unset)", "The password of the private key.", _J,
           "TLS", example="secret", secret=True),
    Option("kafka.ssl.password", RSW, "(unset)",
           "kafka-python's name for `kafka.ssl.key.password`.", "kafka-python", "TLS",
           example="secret", secret=True),
    Option("kafka.ssl.cafile", RSW, "(unset)", "CA certificates, a PEM file.", "kafka-python",
           "TLS", example="/etc/kafka/ca.pem"),
    Option("kafka.ssl.certfile", RSW, "(unset)", "The client's certificate, a PEM file.",
           "kafka-python", "TLS", example="/etc/kafka/client.pem"),
    Option("kafka.ssl.keyfile", RSW, "(unset)", "The client's key, a PEM file.", "kafka-python",
           "TLS", example="/etc/kafka/client.key"),
    Option("kafka.ssl.crlfile", RSW, "(unset)", "A certificate revocation list, PEM.",
           "kafka-python", "TLS", example="/etc/kafka/crl.pem"),
    Option("kafka.ssl.endpoint.identification.algorithm", RSW, "`https`",
           "`https` checks that the broker's certificate names its host; empty turns the check "
           "off.", _J, "TLS", example="https"),
    # --- SASL ----------------------------------------------------------------------------------
    Option("kafka.sasl.mechanism", RSW, "(required with SASL_*)",
           "`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`, `OAUTHBEARER` or `GSSAPI`.", _J, "SASL",
           example="PLAIN"),
    Option("kafka.sasl.jaas.config", RSW, "(unset)",
           "A Java JAAS line: `PlainLoginModule` or `ScramLoginModule` with `username` and "
           "`password`, or `OAuthBearerLoginModule` with `clientId`, `clientSecret`, `scope` and "
           "`extension_*`. Never logged.", _J, "SASL",
           example='org.apache.kafka.common.security.plain.PlainLoginModule required '
                   'username="u" password="p";', secret=True),
    Option("kafka.sasl.kerberos.service.name", RSW, "`kafka`",
           "The brokers' Kerberos service name (GSSAPI).", _J, "SASL", example="kafka"),
    Option("kafka.sasl.username", RSW, "(unset)",
           "A username without a JAAS line (PLAIN, SCRAM).", _PK, "SASL", example="alice"),
    Option("kafka.sasl.password", RSW, "(unset)", "Its password.", _PK, "SASL",
           example="secret", secret=True),
    # --- SASL/OAUTHBEARER ----------------------------------------------------------------------
    Option("kafka.sasl.login.callback.handler.class", RSW,
           "Kafka's unsecured-token handler",
           "Kafka's OIDC handler (`org.apache.kafka.common.security.oauthbearer."
           "OAuthBearerLoginCallbackHandler`, or its 3.1-3.3 `secured.` name) or its default "
           "unsecured-token handler, both done in Python; any other class is refused.", _J,
           "SASL/OAUTHBEARER",
           example="org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"),
    Option("kafka.sasl.oauthbearer.token.endpoint.url", RSW, "(unset)",
           "The OAuth token endpoint (`https:`), or a `file:` URL of a file holding the token "
           "(read again at each refresh).", _J, "SASL/OAUTHBEARER",
           example="https://idp.example.com/oauth2/token"),
    Option("kafka.sasl.login.connect.timeout.ms", RSW, _login("connect_timeout_ms"),
           "Connecting to the token endpoint.", _J, "SASL/OAUTHBEARER", example="5000"),
    Option("kafka.sasl.login.read.timeout.ms", RSW, _login("read_timeout_ms"),
           "Reading the token endpoint's answer.", _J, "SASL/OAUTHBEARER", example="5000"),
    Option("kafka.sasl.login.retry.backoff.ms", RSW, _login("retry_backoff_ms"),
           "The first pause between token requests that failed.", _J, "SASL/OAUTHBEARER",
           example="200"),
    Option("kafka.sasl.login.retry.backoff.max.ms", RSW, _login("retry_backoff_max_ms"),
           "The longest such pause.", _J, "SASL/OAUTHBEARER", example="5000"),
    Option("kafka.sasl.login.refresh.window.factor", RSW, _login("refresh_window_factor"),
           "A token is refreshed when this share of its lifetime has passed (0.5 to 1.0).", _J,
           "SASL/OAUTHBEARER", example="0.75"),
    Option("kafka.sasl.login.refresh.window.jitter", RSW, _login("refresh_window_jitter"),
           "Plus a random share of up to this much (0 to 0.25), so that the job's processes do "
           "not all ask the token endpoint at once.", _J, "SASL/OAUTHBEARER", example="0.1"),
    Option("kafka.sasl.login.refresh.buffer.seconds", RSW, _login("refresh_buffer_s"),
           "But at least this long before the token expires (0 to 3600).", _J,
           "SASL/OAUTHBEARER", example="600"),
    Option("kafka.sasl.login.refresh.min.period.seconds", RSW, _login("refresh_min_period_s"),
           "And no sooner than this long after the token came (0 to 900). A token too short-"
           "lived for both bounds is refreshed at the window's share of what is left.", _J,
           "SASL/OAUTHBEARER", example="30"),
    # --- Fetching ------------------------------------------------------------------------------
    Option("kafka.isolation.level", RS, _fetch("isolation_level"),
           "`read_committed` leaves out records of aborted and open transactions.", _JC,
           "Fetching", example="read_committed"),
    Option("kafka.check.crcs", RS, _fetch("check_crcs"),
           "Verify each record batch's CRC-32C.", _JC, "Fetching", example="false"),
    Option("kafka.max.partition.fetch.bytes", RS, _fetch("max_partition_fetch_bytes"),
           "Bytes fetched per partition and request (8 MiB, not Java's 1 MiB: measured, half "
           "the CPU per GB).", _JC, "Fetching", example="1048576"),
    Option("kafka.fetch.max.bytes", RS, _fetch("fetch_max_bytes"),
           "Bytes fetched per request.", _JC, "Fetching", example="10485760"),
    Option("kafka.fetch.max.wait.ms", RS, _fetch("fetch_max_wait_ms"),
           "How long a broker may hold a Fetch for `kafka.fetch.min.bytes`.", _JC, "Fetching",
           example="100"),
    Option("kafka.fetch.min.bytes", RS, _fetch("fetch_min_bytes"),
           "The bytes a broker waits for before it answers a Fetch.", _JC, "Fetching",
           example="1"),
    Option("kafka.retry.backoff.ms", RSW, _fetch("retry_backoff_ms"),
           "The first pause before retrying a failed request (on writes: a failed send). "
           "Fetches double it at each next retry up to 5 s, planning up to "
           "`fetchOffset.retryIntervalMs`.", _J,
           "Fetching", example="200"),
    # --- Writing -------------------------------------------------------------------------------
    Option("topic", W, "(unset)",
           "The topic of every row; overrides the `topic` column. One of the two is required.",
           _SP, "Writing", example="out"),
    Option("exactlyOnce", W, "`false`",
           "Streams only: commit each micro-batch in Kafka transactions, atomically with its "
           "checkpoint; an error on `df.write`.", _PK, "Writing", example="true"),
    Option("kafka.transactional.id", W, lambda: f"`{_sink().DEFAULT_TRANSACTIONAL_ID_PREFIX}`",
           "With `exactlyOnce`: the *prefix* of the query's transactional ids and marker group "
           "(one id per task); an error without it.", _JP, "Writing", example="etl",
           requires={"exactlyOnce": "true"}),
    Option("kafka.transaction.timeout.ms", W,
           lambda: f"`{_sink().DEFAULT_EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS}` with `exactlyOnce`",
           "With `exactlyOnce`: must cover a whole micro-batch (at most the brokers' "
           "`transaction.max.timeout.ms`); an error without it.", _JP, "Writing",
           example="600000", requires={"exactlyOnce": "true"}),
    # --- Producer ------------------------------------------------------------------------------
    Option("kafka.acks", W, _producer("acks"), "`all` (`-1`), `1` or `0`.", _JP, "Producer",
           example="all"),
    Option("kafka.enable.idempotence", W, _producer("enable_idempotence"),
           "Retries neither duplicate nor reorder; switched off when not set and `kafka.acks` is "
           "not `all` (as Java); `true` with `acks` 0 or 1 is an error.", _JP, "Producer",
           example="true"),
    Option("kafka.compression.type", W, _producer("compression_type"),
           "`none`, `gzip`, `snappy`, `lz4` or `zstd`.", _JP, "Producer", example="zstd"),
    Option("kafka.batch.size", W, _producer("batch_size"),
           "Bytes of one record batch per partition (Java's default is 16 KiB: measured, "
           "256 KiB writes 3x faster from Python).", _JP, "Producer", example="65536"),
    Option("kafka.linger.ms", W, _producer("linger_ms"),
           "How long a partly filled batch waits for more records.", _JP, "Producer",
           example="10"),
    Option("kafka.buffer.memory", W, _producer("buffer_memory"),
           "Bytes a task may hold unacknowledged; past it the task waits (back-pressure).", _JP,
           "Producer", example="67108864"),
    Option("kafka.max.block.ms", W, _producer("max_block_ms"),
           "How long a task waits for buffer space before it fails.", _JP, "Producer",
           example="30000"),
    Option("kafka.max.request.size", W, _producer("max_request_size"),
           "The largest Produce request; a larger record is an error naming it.", _JP,
           "Producer", example="2097152"),
    Option("kafka.delivery.timeout.ms", W, _producer("delivery_timeout_ms"),
           "How long a record is retried before the task fails; at least `kafka.linger.ms` + "
           "`kafka.request.timeout.ms`.", _JP, "Producer", example="60000"),
    Option("kafka.max.in.flight.requests.per.connection", W, _producer("max_in_flight"),
           "Produce requests in flight per broker (at most 5 with idempotence).", _JP,
           "Producer", example="5"),
    # --- Accepted without effect ----------------------------------------------------------------
    Option("kafka.retries", W, "(unset)",
           "Not used: the sink retries a failed send until `kafka.delivery.timeout.ms` has "
           "passed (one warning says so).", _JP, "Accepted without effect", status=IGNORED,
           example="3"),
    *(Option(f"kafka.{name}", RS, "", "Meaningful to Spark's JVM consumers, not to a Python "
             "reader.", _JC, "Accepted without effect", status=IGNORED, example="1")
      for name in ("max.poll.records", "receive.buffer.bytes", "send.buffer.bytes",
                   "allow.auto.create.topics", "partition.assignment.strategy")),
    Option("kafka.client.rack", RS, "", "Not used yet: reads fetch from each partition's "
           "leader, not from a replica in the client's rack or zone (KIP-392, which Spark's "
           "JVM source gets from the Java consumer); a warning says so.", _JC,
           "Accepted without effect", status=IGNORED, example="use1-az1"),
    *(Option(f"kafka.{name}", RS, "", "Java's client-side checks of the token's claims (the "
             "broker validates the token).", _J,
             "Accepted without effect", status=IGNORED, example="1")
      for name in sorted(_oauth.IGNORED)),
    *(Option(f"kafka.{name}", W, "", "A JVM metrics, socket buffer or adaptive-partitioning "
             "setting of the Java producer.", _JP, "Accepted without effect", status=IGNORED,
             example="1")
      for name in ("send.buffer.bytes", "receive.buffer.bytes", "metadata.max.idle.ms",
                   "metric.reporters", "metrics.num.samples", "metrics.recording.level",
                   "metrics.sample.window.ms", "enable.metrics.push",
                   "auto.include.jmx.reporter", "partitioner.adaptive.partitioning.enable",
                   "partitioner.availability.timeout.ms")),
    # --- Refused -------------------------------------------------------------------------------
    Option("kafka.key.deserializer", RS, "", "Keys are always binary; cast or decode them in a "
           "DataFrame expression.", _JC, "Refused", status=REFUSED, example="x"),
    Option("kafka.value.deserializer", RS, "", "Values are always binary; cast or decode them in "
           "a DataFrame expression.", _JC, "Refused", status=REFUSED, example="x"),
    Option("kafka.enable.auto.commit", RS, "", "The source decides when offsets are committed "
           "(`commitOffsets`).", _JC, "Refused", status=REFUSED, example="true"),
    Option("kafka.interceptor.classes", RSW, "", "Java interceptors cannot run in Python.", _J,
           "Refused", status=REFUSED, example="x"),
    Option("kafka.sasl.client.callback.handler.class", RSW, "", "Java callback handlers cannot "
           "run in Python.", _J, "Refused", status=REFUSED, example="x"),
    Option("kafka.key.serializer", W, "", "Keys are written as the bytes of the `key` column; "
           "serialize them in a DataFrame expression.", _JP, "Refused", status=REFUSED,
           example="x"),
    Option("kafka.value.serializer", W, "", "Values are written as the bytes of the `value` "
           "column; serialize them in a DataFrame expression.", _JP, "Refused", status=REFUSED,
           example="x"),
    Option("kafka.partitioner.class", W, "", "Java partitioners cannot run in Python; records "
           "go to the `partition` column's partition, else murmur2 of the key (as Java's "
           "default partitioner), else spread evenly.", _JP, "Refused", status=REFUSED,
           example="x"),
)


def _sink():
    from . import sink_options

    return sink_options


def entries(scope: str | None = None, status: str | None = None) -> list[Option]:
    """The entries for ``scope`` (any when None) with ``status`` (any when None)."""
    return [o for o in OPTIONS if (scope is None or scope in o.scopes)
            and (status is None or o.status == status)]


def names(scope: str | None = None, status: str | None = None) -> dict[str, str]:
    """Lower-cased name -> name as users write it, for ``entries(scope, status)``."""
    return {o.key: o.name for o in entries(scope, status)}


def warn_about_names(opts: Iterable[str], scope: str, log: logging.Logger) -> None:
    """Warn about each option in ``opts`` (lower-cased keys) that is in no entry, or whose
    entries are all for other scopes. ``kafka.*`` names are left to the client settings'
    parsers, which know the Java clients' names; Spark's own pass-through options are quiet."""
    known_here = names(scope)
    known = names()
    unknown, elsewhere = [], []
    for key in opts:
        if key.startswith(("kafka.", "spark.")) or key in _SPARK_PASS_THROUGH \
                or key in known_here:
            continue
        if key in known:
            elsewhere.append(known[key])
        else:
            unknown.append(key)
    for key in sorted(unknown):
        close = difflib.get_close_matches(key, list(known), n=2, cutoff=0.75)
        hint = (" Did you mean " + " or ".join(f"'{known[c]}'" for c in close) + "?"
                if close else "")
        log.warning("Option '%s' is not an option of pykafka and is ignored.%s", key, hint)
    if elsewhere:
        scopes = sorted({s for name in elsewhere for s in _scopes_of(name)} - {scope},
                        key=SCOPES.index)
        log.warning("Option(s) %s have no effect on %s and are ignored: they are for %s.",
                    ", ".join(f"'{n}'" for n in sorted(elsewhere)), SCOPE_WORDS[scope],
                    " and ".join(SCOPE_WORDS[s] for s in scopes))


def _scopes_of(name: str) -> set[str]:
    return {s for o in OPTIONS if o.name == name for s in o.scopes}


# --- the reference page ------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """The option reference as Markdown: one table per section, in :data:`SECTIONS` order."""
    out: list[str] = []
    for title, intro in SECTIONS:
        rows = [o for o in OPTIONS if o.section == title]
        if not rows:
            continue
        out += [f"## {title}", "", intro, ""]
        if title in ("Accepted without effect", "Refused"):
            out += ["| option | applies to | mirrors | why |", "|---|---|---|---|"]
            for o in rows:
                out.append(f"| `{o.name}` | {', '.join(o.scopes)} | {o.mirrors} | "
                           f"{_cell(o.meaning)} |")
        else:
            out += ["| option | applies to | default | meaning | mirrors |",
                    "|---|---|---|---|---|"]
            for o in rows:
                meaning = o.meaning + (" *Secret: never logged or shown.*" if o.secret else "")
                out.append(f"| `{o.name}` | {', '.join(o.scopes)} | {_cell(o.default_text())} | "
                           f"{_cell(meaning)} | {o.mirrors} |")
        out.append("")
    return "\n".join(out)
