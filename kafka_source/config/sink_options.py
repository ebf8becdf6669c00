"""Sink options: parse and validate the ``.option(...)`` of ``df.write`` / ``df.writeStream``.

Users come from Spark's ``format("kafka")`` sink, so the options keep its names: ``topic`` (the
default topic; it overrides a ``topic`` column, as in Spark) and ``kafka.*`` settings with the
Java producer's names. Keys are case-insensitive. Everything is read here, once, on the driver,
into :class:`SinkOptions`: plain immutable values, pickled to the executors with the writer.

Three kinds of ``kafka.*`` option:

* connection and security settings (``kafka.bootstrap.servers``, ``kafka.security.protocol``,
  ``kafka.sasl.jaas.config``, ``kafka.ssl.*``, ...): the source's own machinery
  (:func:`~kafka_source.config.client_config.client_config_from_options`) maps them, wraps
  secrets and checks SASL, so reads and writes understand exactly the same security options;
* producer settings (``kafka.acks``, ``kafka.linger.ms``, ``kafka.compression.type``, ...):
  mapped here to :class:`~kafka_source.config.producer_settings.ProducerSettings`, with the Java
  producer's defaults and its rules between them (idempotence needs ``acks=all`` and at most 5
  requests in flight; ``delivery.timeout.ms`` covers ``linger.ms`` + ``request.timeout.ms``);
* consumer settings (``kafka.group.id``, ``kafka.isolation.level``, ...) and read options
  (``subscribe``, ``startingOffsets``, ...): they mean nothing to a write. Spark's sink hands
  them to the Java producer, which logs that they are unknown; here each is named in one
  warning, so a user who expected it to do something learns that it does not.

Settings that would change what is written and cannot be honoured are errors: serializer
classes (as in Spark: keys and values are written as the bytes of the columns), a Java
partitioner or interceptors, and transactional settings outside exactly-once writes.

Exactly-once streaming writes (``exactlyOnce``, see :mod:`kafka_source.write.exactly_once`)
use ``kafka.transactional.id`` as the *prefix* of the transactional ids, since one query needs
one id per task; the default prefix is ``pykafka-sink``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Mapping

from ..errors import OptionError
from . import catalog
from .client_config import _FETCH_SETTINGS, _IGNORED, client_config_from_options
from .options import _lower_keys, parse_bool
from .producer_settings import ProducerSettings

if TYPE_CHECKING:  # formats.sink loads numpy and pyarrow: imported where it is used
    from ..formats.sink import SinkFormats

log = logging.getLogger(__name__)


class OncePerProcess(logging.Filter):
    """Lets each distinct message through once per Python process. A streaming query makes a
    new writer -- and parses its options and checks its columns again -- for every micro-batch:
    a warning about an option or a column is worth reading once, not once a trigger."""

    _all: list["OncePerProcess"] = []

    def __init__(self):
        super().__init__()
        self._seen: set[tuple[int, str]] = set()
        OncePerProcess._all.append(self)

    @classmethod
    def forget_all(cls) -> None:
        """Let every message through once more (tests: each looks at its own warnings)."""
        for once in cls._all:
            once._seen.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        if key in self._seen:
            return False
        if len(self._seen) < 1000:                  # bounded, whatever a process writes
            self._seen.add(key)
        return True


log.addFilter(OncePerProcess())

DEFAULT_TRANSACTIONAL_ID_PREFIX = "pykafka-sink"
# Exactly-once writes keep each task's transaction open from its first record until the driver
# commits the micro-batch, so the transaction timeout must cover a whole micro-batch. The Java
# producer's 60 s fails any batch that takes longer, again on every restart; 15 minutes is the
# broker's default ceiling (transaction.max.timeout.ms). A crashed attempt's transaction is
# aborted at once by the retry's fencing, so the long timeout costs nothing in the normal case.
DEFAULT_EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS = 900_000

ACKS = {"all": -1, "-1": -1, "0": 0, "1": 1}
COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")
MAX_IN_FLIGHT_WITH_IDEMPOTENCE = 5

# Producer settings by Java name (after "kafka."): (ProducerSettings field, minimum value).
_PRODUCER_INTS = {
    "linger.ms": ("linger_ms", 0),
    "batch.size": ("batch_size", 1),
    "buffer.memory": ("buffer_memory", 1),
    "max.request.size": ("max_request_size", 1),
    "max.block.ms": ("max_block_ms", 0),
    "delivery.timeout.ms": ("delivery_timeout_ms", 1),
    "request.timeout.ms": ("request_timeout_ms", 1),
    "retry.backoff.ms": ("retry_backoff_ms", 0),
    "metadata.max.age.ms": ("metadata_max_age_ms", 0),
    "max.in.flight.requests.per.connection": ("max_in_flight", 1),
    "transaction.timeout.ms": ("transaction_timeout_ms", 1),
}
_PRODUCER_OTHER = {"acks", "compression.type", "enable.idempotence", "transactional.id",
                   "retries"}
# Also connection settings of the network client: given to both.
_SHARED = {"request.timeout.ms", "retry.backoff.ms", "metadata.max.age.ms"}

# Producer settings that cannot be honoured: what is written would differ from what was asked.
_UNSUPPORTED = {
    "key.serializer": "keys are written as the bytes of the 'key' column (Spark's sink uses "
                      "ByteArraySerializer too); serialize them in a DataFrame expression",
    "value.serializer": "values are written as the bytes of the 'value' column (Spark's sink "
                        "uses ByteArraySerializer too); serialize them in a DataFrame expression",
    "partitioner.class": "Java partitioners can't run in Python; records go to the 'partition' "
                         "column's partition, else the default partitioner's (murmur2 of the "
                         "key), else spread evenly",
    "interceptor.classes": "Java producer interceptors can't run in Python",
}
# Java producer settings with nothing to do here (JVM metrics, socket buffers, adaptive
# partitioning tuned by broker latency): accepted quietly, as Spark's sink would pass them on.
_IGNORED_PRODUCER = {
    "send.buffer.bytes", "receive.buffer.bytes", "metadata.max.idle.ms", "metric.reporters",
    "metrics.num.samples", "metrics.recording.level", "metrics.sample.window.ms",
    "enable.metrics.push", "auto.include.jmx.reporter", "partitioner.adaptive.partitioning.enable",
    "partitioner.availability.timeout.ms",
}
# Consumer settings, meaningless on a write (the source's client config knows them).
_CONSUMER_ONLY = ({name for name in _FETCH_SETTINGS if name not in _SHARED} | set(_IGNORED)
                  | {"key.deserializer", "value.deserializer", "enable.auto.commit",
                     "auto.commit.interval.ms", "exclude.internal.topics"}) - _IGNORED_PRODUCER
@dataclass(frozen=True)
class SinkOptions:
    """The validated options of one write. Picklable; contains no live objects."""

    client_config: Mapping[str, object]   # connection/security settings (client_config)
    producer: ProducerSettings
    topic: str | None = None               # option 'topic': overrides the 'topic' column
    exactly_once: bool = False
    transactional_id_prefix: str = DEFAULT_TRANSACTIONAL_ID_PREFIX
    # valueFormat/keyFormat (kafka_source.formats.sink); None when both are binary
    formats: "SinkFormats | None" = None

    @property
    def bootstrap_servers(self) -> str:
        return str(self.client_config["bootstrap_servers"])

    def transactional_settings(self, transactional_id: str) -> ProducerSettings:
        """The producer settings of one exactly-once task (its own transactional id)."""
        return replace(self.producer, transactional_id=transactional_id)


def parse_sink_options(options: Mapping[str, str], *, streaming: bool = True) -> SinkOptions:
    """Validate the options of ``df.write`` (``streaming=False``) or ``df.writeStream``."""
    opts = _lower_keys(options)
    _reject_unsupported(opts)
    _warn_meaningless(opts)
    # Connection and security settings through the source's machinery; the producer settings
    # are not given to it (it would log each as unknown), except the two it also uses.
    connection = {k: v for k, v in opts.items()
                  if not (k.startswith("kafka.") and k[6:] in (set(_PRODUCER_INTS)
                                                               | _PRODUCER_OTHER
                                                               | _IGNORED_PRODUCER
                                                               | _CONSUMER_ONLY) - _SHARED)}
    client_config = client_config_from_options(connection)

    topic = opts.get("topic")
    if topic is not None:
        topic = str(topic).strip()
        if not topic:
            raise OptionError("Option 'topic' is empty: give the topic to write to, or leave "
                              "the option out and give each row's topic in a 'topic' column.")

    exactly_once = parse_bool(opts, "exactlyOnce", False)
    if exactly_once and not streaming:
        raise OptionError("Option 'exactlyOnce' is for streaming writes (df.writeStream) only: "
                          "it commits each micro-batch atomically with its checkpoint. A batch "
                          "write (df.write) is at-least-once: a retried task writes its rows "
                          "again. Remove 'exactlyOnce' or write with writeStream.")
    prefix = DEFAULT_TRANSACTIONAL_ID_PREFIX
    if "kafka.transactional.id" in opts:
        prefix = str(opts["kafka.transactional.id"]).strip()
        if not exactly_once:
            raise OptionError("Option 'kafka.transactional.id' is only used by exactly-once "
                              "streaming writes (option 'exactlyOnce' = 'true'), as the prefix "
                              "of each task's transactional id; set 'exactlyOnce' or remove it.")
        if not prefix:
            raise OptionError("Option 'kafka.transactional.id' is empty: give a prefix for the "
                              "transactional ids of this query's tasks, or leave it out for "
                              f"'{DEFAULT_TRANSACTIONAL_ID_PREFIX}'.")

    settings = _producer_settings(opts, ProducerSettings, exactly_once=exactly_once)
    if exactly_once:
        _warn_transaction_timeout(settings.transaction_timeout_ms)
    from ..formats.sink import parse_sink_formats

    formats = parse_sink_formats(opts)
    return SinkOptions(client_config=client_config, producer=settings, topic=topic,
                       exactly_once=exactly_once, transactional_id_prefix=prefix,
                       formats=formats if formats.any else None)


def _reject_unsupported(opts: Mapping[str, str]) -> None:
    for name, why in _UNSUPPORTED.items():
        if f"kafka.{name}" in opts:
            raise OptionError(f"Kafka option 'kafka.{name}' is not supported: {why}.")


def _warn_meaningless(opts: Mapping[str, str]) -> None:
    consumer = sorted(f"kafka.{k[6:]}" for k in opts
                      if k.startswith("kafka.") and k[6:] in _CONSUMER_ONLY)
    if consumer:
        log.warning("Kafka consumer option(s) %s have no effect on a write (the sink is a "
                    "producer) and are ignored.", ", ".join(f"'{n}'" for n in consumer))
    # the source's own options (subscribe, startingOffsets, ...) and names that are no option
    catalog.warn_about_names(opts, "write", log)
    if "kafka.retries" in opts:
        log.warning("Kafka option 'kafka.retries' is not used: the sink retries a failed send "
                    "until 'kafka.delivery.timeout.ms' has passed, then fails the task.")


def _warn_transaction_timeout(timeout_ms: int) -> None:
    """When an exactly-once query starts (once per process): a micro-batch must be written
    and committed within the transaction timeout. The sink cannot see the source, so it cannot
    tell whether micro-batches are bounded; it says what to bound."""
    log.warning(
        "Option 'exactlyOnce': each micro-batch is written in Kafka transactions that stay open "
        "from its first record to its commit, and the broker aborts those open longer than "
        "'kafka.transaction.timeout.ms' (%d ms here; at most the brokers' "
        "transaction.max.timeout.ms). A micro-batch that takes longer fails the query, and again "
        "after every restart, since a restart writes the same micro-batch. Bound the size of "
        "micro-batches on the source -- 'maxOffsetsPerTrigger' for a Kafka source, "
        "'maxFilesPerTrigger' or 'maxBytesPerTrigger' for files -- so that one is written well "
        "within that time. A query already failing so needs a larger "
        "'kafka.transaction.timeout.ms' to get past that micro-batch (its size is fixed in the "
        "checkpoint).", timeout_ms)


def _int(opts: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = opts.get(f"kafka.{name}")
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"Option 'kafka.{name}' must be an integer, got '{raw}'.") from None
    if value < minimum:
        raise OptionError(f"Option 'kafka.{name}' must be an integer >= {minimum}, got '{raw}'.")
    return value


def _producer_settings(opts: Mapping[str, str], settings_type, *, exactly_once: bool):
    fields: dict[str, object] = {}
    for name, (field, minimum) in _PRODUCER_INTS.items():
        value = _int(opts, name, minimum)
        if value is not None:
            fields[field] = value
    defaults = settings_type()

    raw_acks = opts.get("kafka.acks")
    if raw_acks is not None:
        key = str(raw_acks).strip().lower()
        if key not in ACKS:
            raise OptionError(f"Option 'kafka.acks' must be 'all', '-1', '0' or '1', got "
                              f"'{raw_acks}'.")
        fields["acks"] = ACKS[key]
    acks = fields.get("acks", defaults.acks)

    raw_codec = opts.get("kafka.compression.type")
    if raw_codec is not None:
        codec = str(raw_codec).strip().lower()
        if codec not in COMPRESSION_TYPES:
            raise OptionError(f"Option 'kafka.compression.type' must be one of "
                              f"{', '.join(COMPRESSION_TYPES)}; got '{raw_codec}'.")
        fields["compression_type"] = codec

    # Java's rules: idempotence is on by default, but only when the other settings allow it;
    # asked for explicitly, a conflicting setting is an error naming both.
    in_flight = fields.get("max_in_flight", defaults.max_in_flight)
    explicit = "kafka.enable.idempotence" in opts
    if explicit:
        idempotence = parse_bool(opts, "kafka.enable.idempotence", True)
        if idempotence and acks != -1:
            raise OptionError(f"Option 'kafka.enable.idempotence' is 'true' but 'kafka.acks' is "
                              f"'{opts['kafka.acks']}': the idempotent producer needs "
                              "'kafka.acks' = 'all'. Set acks to 'all' or disable idempotence.")
        if idempotence and in_flight > MAX_IN_FLIGHT_WITH_IDEMPOTENCE:
            raise OptionError(
                "Option 'kafka.enable.idempotence' is 'true' but "
                f"'kafka.max.in.flight.requests.per.connection' is {in_flight}: the idempotent "
                f"producer allows at most {MAX_IN_FLIGHT_WITH_IDEMPOTENCE}.")
    else:
        idempotence = (defaults.enable_idempotence and acks == -1
                       and in_flight <= MAX_IN_FLIGHT_WITH_IDEMPOTENCE)
    fields["enable_idempotence"] = idempotence

    if exactly_once:
        if not idempotence:
            why = ("'kafka.enable.idempotence' is 'false'" if explicit else
                   f"'kafka.acks' is '{opts.get('kafka.acks')}'" if acks != -1 else
                   f"'kafka.max.in.flight.requests.per.connection' is {in_flight}")
            raise OptionError(f"Option 'exactlyOnce' needs the idempotent, transactional "
                              f"producer, but {why}: use 'kafka.acks' = 'all', at most "
                              f"{MAX_IN_FLIGHT_WITH_IDEMPOTENCE} requests in flight and leave "
                              "idempotence on.")
        fields.setdefault("transaction_timeout_ms", DEFAULT_EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS)
    elif "kafka.transaction.timeout.ms" in opts:
        raise OptionError("Option 'kafka.transaction.timeout.ms' is only used by exactly-once "
                          "streaming writes (option 'exactlyOnce' = 'true'); set 'exactlyOnce' "
                          "or remove it.")

    # Java's rule: a record may wait linger.ms and then a request, all within delivery.timeout.
    linger = fields.get("linger_ms", defaults.linger_ms)
    request = fields.get("request_timeout_ms", defaults.request_timeout_ms)
    if "delivery_timeout_ms" in fields:
        if fields["delivery_timeout_ms"] < linger + request:
            raise OptionError(
                f"Option 'kafka.delivery.timeout.ms' ({fields['delivery_timeout_ms']}) must be "
                f"at least 'kafka.linger.ms' + 'kafka.request.timeout.ms' ({linger} + {request} "
                f"= {linger + request}).")
    elif defaults.delivery_timeout_ms < linger + request:
        log.warning("'kafka.delivery.timeout.ms' is raised to %d, 'kafka.linger.ms' + "
                    "'kafka.request.timeout.ms', as the Java producer does.", linger + request)
        fields["delivery_timeout_ms"] = linger + request

    if "max_request_size" in fields or "buffer_memory" in fields:
        max_request = fields.get("max_request_size", defaults.max_request_size)
        memory = fields.get("buffer_memory", defaults.buffer_memory)
        if max_request > memory:
            raise OptionError(f"Option 'kafka.max.request.size' ({max_request}) can't exceed "
                              f"'kafka.buffer.memory' ({memory}): a record that size could "
                              "never be buffered.")
    settings = settings_type(**fields)
    settings.check()  # the producer's own consistency checks, here on the driver
    return settings

