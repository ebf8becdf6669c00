"""The sink's producer settings: :class:`ProducerSettings`, the Java producer's options as the
producer (:class:`kafka_source.write.producer.Producer`) takes them, and their defaults.

Pure configuration -- no numpy, no pyarrow, no network -- so that parsing the sink's options
(:mod:`kafka_source.config.sink_options`) on the driver makes them without loading the producer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OptionError

__all__ = ["COMPRESSION_TYPES", "DEFAULT_BATCH_SIZE", "MAX_IN_FLIGHT_IDEMPOTENT",
           "ProducerSettings"]

#: Default ``kafka.batch.size``: 256 KiB, not Java's 16 KiB. Measured with
#: ``benchmarks/produce_loop.py --grid`` (1M x 100 B, 4 partitions, linger 5 ms, median of 3,
#: Kafka 4.0 on the same 2-core machine), records/s uncompressed / lz4: 16 KiB 0.83M / 0.86M,
#: 64 KiB 1.96M / 1.71M, 128 KiB 2.14M / 2.06M, 256 KiB 3.3M / 2.4M, 512 KiB 2.8M / 2.4M,
#: 1 MiB 2.7M / 2.6M. Every Produce request costs a fixed amount of Python work and carries at
#: most one batch per partition, so small batches mean many requests; from 256 KiB on the
#: figures are flat within the machine's noise, and a smaller batch holds less memory per
#: partition and stays far below brokers' ``max.message.bytes`` (1 MiB by default).
#: ``linger.ms`` 0, 5 and 20 made no measurable difference (the sink hands over thousands of
#: rows per call), so it keeps Java's default of 5 ms.
DEFAULT_BATCH_SIZE = 256 * 1024

COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")

# The broker keeps the last 5 batches of each producer and partition for duplicate detection,
# so more than 5 unacknowledged batches in flight per partition could not be deduplicated.
MAX_IN_FLIGHT_IDEMPOTENT = 5


@dataclass(frozen=True)
class ProducerSettings:
    """The producer's settings, each the Java producer option of the same meaning
    (``kafka.acks``, ``kafka.linger.ms``, ...; the sink's options parsing makes them)."""

    acks: int = -1                     # kafka.acks: "all"/-1, 0, 1
    linger_ms: int = 5                 # Java 4.0 default
    batch_size: int = DEFAULT_BATCH_SIZE   # kafka.batch.size (bytes of one record batch)
    compression_type: str = "none"
    enable_idempotence: bool = True
    buffer_memory: int = 32 * 1024 * 1024
    max_request_size: int = 1024 * 1024
    max_block_ms: int = 60_000
    delivery_timeout_ms: int = 120_000
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    metadata_max_age_ms: int = 300_000   # kafka.metadata.max.age.ms: refresh at least this often
    max_in_flight: int = 5             # kafka.max.in.flight.requests.per.connection
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000

    def check(self) -> None:
        """Raise :class:`OptionError` for settings that cannot work together, naming the
        options, as the Java producer's ConfigException does."""
        if self.acks not in (-1, 0, 1):
            raise OptionError(f"Option 'kafka.acks' must be all (-1), 0 or 1; got {self.acks}.")
        if self.compression_type not in COMPRESSION_TYPES:
            raise OptionError(f"Option 'kafka.compression.type' must be one of "
                              f"{', '.join(COMPRESSION_TYPES)}; got '{self.compression_type}'.")
        for name, value, low in (("batch.size", self.batch_size, 1),
                                 ("buffer.memory", self.buffer_memory, 1),
                                 ("max.request.size", self.max_request_size, 1),
                                 ("max.in.flight.requests.per.connection", self.max_in_flight, 1),
                                 ("linger.ms", self.linger_ms, 0),
                                 ("max.block.ms", self.max_block_ms, 0),
                                 ("request.timeout.ms", self.request_timeout_ms, 1),
                                 ("retry.backoff.ms", self.retry_backoff_ms, 0),
                                 ("metadata.max.age.ms", self.metadata_max_age_ms, 0),
                                 ("transaction.timeout.ms", self.transaction_timeout_ms, 1)):
            if int(value) < low:
                raise OptionError(f"Option 'kafka.{name}' must be at least {low}; got {value}.")
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise OptionError(
                f"Option 'kafka.delivery.timeout.ms' ({self.delivery_timeout_ms}) must be at "
                f"least 'kafka.linger.ms' + 'kafka.request.timeout.ms' ({self.linger_ms} + "
                f"{self.request_timeout_ms}), as in the Java producer.")
        if self.enable_idempotence:
            if self.acks != -1:
                raise OptionError(
                    f"Option 'kafka.enable.idempotence' (true) needs 'kafka.acks' = all; got "
                    f"{self.acks}. Set 'kafka.enable.idempotence' to false to use acks "
                    f"{self.acks}.")
            if self.max_in_flight > MAX_IN_FLIGHT_IDEMPOTENT:
                raise OptionError(
                    "Option 'kafka.max.in.flight.requests.per.connection' must be at most 5 with "
                    f"'kafka.enable.idempotence' (true); got {self.max_in_flight}.")
        if self.transactional_id is not None:
            if not self.transactional_id:
                raise OptionError("The transactional id must not be empty.")
            if not self.enable_idempotence:
                raise OptionError("Transactions need 'kafka.enable.idempotence' = true.")
