"""The sink's Kafka producer: Arrow columns in, acknowledged record batches out.

It does what Kafka's Java producer does, for whole Arrow columns instead of one record at a
time, so that a Spark write task costs Python work per *batch*, not per record:

Accumulating
    :meth:`Producer.send` gets rows of one topic with their partitions (chosen by the writer).
    It groups them by partition -- stably, so each partition keeps the rows' order -- and
    appends them to that partition's open batch as Arrow slices (no copy). A batch is cut when
    the next row would make it larger than ``batch_size`` (sizes from
    :func:`~kafka_source.wire.encode.record_sizes`, the exact encoded size of each record,
    uncompressed); a row larger than that gets a batch of its own. A cut batch is encoded at
    once (:func:`~kafka_source.wire.encode.encode_record_batch`, with the producer id, epoch and
    base sequence when idempotent) and the bytes are kept until the broker acknowledged them:
    a retry resends exactly the same bytes, which is what lets the broker recognise a duplicate.
    An open batch is cut when it is ``linger_ms`` old, when :meth:`Producer.flush` is called,
    and when the memory bound is reached.

Sending
    One Produce request per broker carries at most one batch per partition led by that broker
    (Kafka rejects a request with two batches for one partition), up to ``max_request_size``
    bytes. Up to ``max_in_flight`` requests are in flight per broker: the next one is sent
    without waiting for the previous response, as the Java client does. The I/O runs in the
    caller's thread, in non-blocking polls at every :meth:`Producer.send` and in
    :meth:`Producer.flush`; see "Why no sender thread" below.

Following leaders
    As the Java producer does, metadata is asked for again when a request fails or an answer
    says the leader moved, when connecting to a leader fails (a crashed or restarting broker:
    without asking, its partitions' batches would wait for it until ``delivery_timeout_ms``),
    and every ``metadata_max_age_ms`` (a preferred-leader election, partitions added).

Idempotence (default, needs acks=all)
    InitProducerId once per producer, then every batch carries the partition's next sequence
    number. On a retriable error (leader moved, not enough replicas, timeout, a broken
    connection...) the batch goes back to its place in the partition's queue, metadata is
    refreshed, and once nothing of that partition is in flight any more its unacknowledged
    batches are resent in sequence order -- nothing is reordered and the broker drops what it
    already has (DUPLICATE_SEQUENCE_NUMBER, or success with the first offset, counts as written).
    OUT_OF_ORDER_SEQUENCE_NUMBER for a batch that is not the partition's oldest unacknowledged
    one just means an earlier batch failed first, so it is retried as well; for the oldest one,
    and UNKNOWN_PRODUCER_ID or INVALID_PRODUCER_EPOCH, the producer fails: resetting the
    sequences the way the Java client may would risk duplicates, and Spark retries the task.
    A batch not acknowledged ``delivery_timeout_ms`` after it was created fails the producer
    with an error naming topic, partition and the last error.

Memory
    Bytes of open batches (estimated from the record sizes), plus encoded batches not yet
    acknowledged, stay at most ``buffer_memory``; :meth:`Producer.send` blocks -- driving the
    network -- while more would be needed, at most ``max_block_ms`` without progress.

Transactions
    With ``transactional_id`` the producer finds the transaction coordinator and calls
    InitProducerId for the id when it is created (which fences older producers of that id and
    aborts their open transaction), adds every partition to the transaction
    (AddPartitionsToTxn) before writing to it, and marks its batches transactional.
    :meth:`Producer.transaction` flushes and returns a :class:`TransactionHandle`; nothing is
    committed here: the handle travels to the Spark driver, which commits or aborts with
    :func:`end_transaction` once every task succeeded.

Protocol versions are negotiated (kafka-python's ApiVersions) and capped at what the producer
understands: Produce v3-v9 (record batches v2; v12 would switch on Kafka 4's new transaction
protocol, KIP-890, whose epoch bumps this producer does not follow), InitProducerId up to v4,
AddPartitionsToTxn up to v3, EndTxn up to v4. Kafka 2.2 has all of those (Produce v7,
InitProducerId v1, AddPartitionsToTxn v1, EndTxn v1).

Why no sender thread
    Measured with ``benchmarks/produce_loop.py`` (1M values of 100 bytes, 4 partitions, Kafka
    4.0 on the same 2-core machine): writing them takes 0.38 s of wall time and 0.37 s of CPU
    time of the calling thread uncompressed, 0.47 s and 0.49 s with lz4. The thread is busy
    for all of it -- encoding, compressing, copying into socket buffers -- and never waits for
    the broker, which keeps up; a sender thread could only take some of that work to another
    core, and in Spark the other cores run the other tasks. Between two :meth:`Producer.send`
    calls the kernel keeps sending what was written and the broker keeps working on up to
    ``max_in_flight`` requests (5 x up to 1 MiB per broker), so the writer's own work between
    calls does not stall the pipeline. Without a thread there is no locking and no second
    place where an error can happen, and every wait is bounded where it is.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping

import kafka.errors as Errors
import numpy as np
import pyarrow as pa
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import (AddPartitionsToTxnRequest, EndTxnRequest,
                                     InitProducerIdRequest, ProduceRequest)

from ..errors import BrokerUnavailableError, OptionError, ProduceError, TopicError
from ..wire.client import BrokerClient, RetriableBrokerError, TopicInfo, error_for
from ..wire.encode import BATCH_OVERHEAD, encode_record_batch, record_sizes

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_BATCH_SIZE", "Producer", "ProducerSettings", "TransactionFencedError",
           "TransactionHandle", "abort_stale_transaction", "end_transaction", "end_transactions"]

TopicPartition = tuple[str, int]

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

# Protocol version caps (see the module docstring).
_PRODUCE_MIN_VERSION = 3
_PRODUCE_MAX_VERSION = 9
_INIT_PRODUCER_ID_MAX_VERSION = 4
_ADD_PARTITIONS_MAX_VERSION = 3
_END_TXN_MAX_VERSION = 4
_API_VERSIONS_MAX_VERSION = 3

# The broker keeps the last 5 batches of each producer and partition for duplicate detection,
# so more than 5 unacknowledged batches in flight per partition could not be deduplicated.
_MAX_IN_FLIGHT_IDEMPOTENT = 5
_SEQUENCE_MODULUS = 1 << 31      # sequence numbers wrap after Integer.MAX_VALUE, as in Kafka
_TXN_RETRY_BACKOFF_S = 0.02      # CONCURRENT_TRANSACTIONS clears within milliseconds (Java: 20 ms)
_MAX_POLL_WAIT_MS = 50           # longest single network wait while blocked (re-checks timers)

_NONE = Errors.NoError.errno
_DUPLICATE_SEQUENCE = Errors.DuplicateSequenceNumberError.errno
_OUT_OF_ORDER_SEQUENCE = Errors.OutOfOrderSequenceNumberError.errno
_FENCED = (Errors.InvalidProducerEpochError, Errors.ProducerFencedError,
           Errors.TransactionCoordinatorFencedError)
_COORDINATOR_MOVED = (Errors.CoordinatorNotAvailableError, Errors.NotCoordinatorError,
                      Errors.CoordinatorLoadInProgressError)


# --------------------------------------------------------------------------------------------
# Settings and the transaction handle
# --------------------------------------------------------------------------------------------

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
            if self.max_in_flight > _MAX_IN_FLIGHT_IDEMPOTENT:
                raise OptionError(
                    "Option 'kafka.max.in.flight.requests.per.connection' must be at most 5 with "
                    f"'kafka.enable.idempotence' (true); got {self.max_in_flight}.")
        if self.transactional_id is not None:
            if not self.transactional_id:
                raise OptionError("The transactional id must not be empty.")
            if not self.enable_idempotence:
                raise OptionError("Transactions need 'kafka.enable.idempotence' = true.")


@dataclass(frozen=True)
class TransactionHandle:
    """An open transaction, as the executor leaves it for the driver to commit or abort.

    Picklable (plain fields): it travels to the Spark driver in a commit message.
    ``partitions`` are the partitions written in it; empty when nothing was written, and then
    there is nothing to commit (:func:`end_transaction` does nothing)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]


class TransactionFencedError(ProduceError):
    """The transaction can no longer be committed: its producer epoch is not the current one of
    its transactional id. Either a newer producer of the same id initialised (a retried or
    speculative task, or :func:`abort_stale_transaction`), or the broker aborted the transaction
    because it stayed open longer than ``kafka.transaction.timeout.ms``. Either way its records
    are not (and will never be) committed."""


# --------------------------------------------------------------------------------------------
# Internal state
# --------------------------------------------------------------------------------------------

class _Clock:
    """Time as the producer sees it; unit tests substitute a simulated one."""

    now = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    @staticmethod
    def wall_ms() -> int:
        return int(time.time() * 1000)


class _OpenBatch:
    """Rows appended to a partition and not yet cut into a record batch."""

    __slots__ = ("values", "keys", "headers", "count", "nbytes", "created", "timestamp_ms")

    def __init__(self, created: float, timestamp_ms: int):
        self.values: list[pa.Array] = []
        self.keys: list[pa.Array | None] = []
        self.headers: list[pa.Array | None] = []
        self.count = 0
        self.nbytes = 0          # sum of the records' encoded sizes (batch header excluded)
        self.created = created
        self.timestamp_ms = timestamp_ms


class _Batch:
    """An encoded record batch of one partition, kept until acknowledged."""

    __slots__ = ("tp", "order", "data", "count", "base_sequence", "created", "in_flight",
                 "attempts", "last_error")

    def __init__(self, tp, order, data, count, base_sequence, created):
        self.tp = tp
        self.order = order                  # position in the partition's sequence of batches
        self.data = data
        self.count = count
        self.base_sequence = base_sequence
        self.created = created
        self.in_flight = False
        self.attempts = 0
        self.last_error: str | None = None


class _Partition:
    __slots__ = ("tp", "open", "queue", "unacked", "in_flight", "next_sequence", "next_order",
                 "acked", "confirmed", "retrying", "retry_at")

    def __init__(self, tp):
        self.tp = tp
        self.open: _OpenBatch | None = None
        self.queue: list[_Batch] = []        # to send, in order (a retried batch goes back in)
        self.unacked: deque[_Batch] = deque()  # every encoded, unacknowledged batch, in order
        self.in_flight = 0
        self.next_sequence = 0
        self.next_order = 0
        self.acked = 0
        self.confirmed = False               # a batch of it was acknowledged
        # After a retriable failure: send nothing until nothing is in flight and the backoff has
        # passed, then resend from the oldest unacknowledged batch (keeps the order).
        self.retrying = False
        self.retry_at = 0.0


class _Request:
    __slots__ = ("node", "batches", "future", "sent_at")

    def __init__(self, node, batches: dict, future, sent_at: float):
        self.node = node
        self.batches = batches
        self.future = future
        self.sent_at = sent_at


# --------------------------------------------------------------------------------------------
# The producer
# --------------------------------------------------------------------------------------------

class Producer:
    """Kafka's producer for Arrow columns (see the module docstring). Not thread-safe: one per
    writer (Spark task)."""

    def __init__(self, client_config: Mapping[str, object], settings: ProducerSettings, *,
                 client=None, clock=None):
        """``client_config``: the connection settings that options parsing makes
        (:func:`kafka_source.config.client_config.client_config_from_options`). ``client``
        (tests) replaces the :class:`BrokerClient` made from it; ``clock`` (tests) the time.

        A transactional producer initialises its transactional id here (fencing older
        producers of it and aborting their open transaction), even if it never writes."""
        settings.check()
        self.settings = settings
        self._clock = clock or _Clock()
        self._owns_client = client is None
        self._client = client if client is not None else BrokerClient(client_config)
        self._client.set_max_in_flight(settings.max_in_flight + 2)
        self._idempotent = settings.enable_idempotence
        self._transactional_id = settings.transactional_id
        self._limit = min(settings.batch_size, settings.max_request_size)
        self._producer_id = -1
        self._producer_epoch = -1
        self._counts: dict[str, int] = {}            # topic -> partition count
        self._leaders: dict[TopicPartition, int] = {}
        self._parts: dict[TopicPartition, _Partition] = {}
        self._open: set[TopicPartition] = set()      # partitions with an open batch
        self._sendable: set[TopicPartition] = set()  # partitions with batches queued to send
        self._in_flight: dict[object, deque[_Request]] = {}
        self._node_errors: dict[object, str] = {}
        self._unacked = 0                            # encoded batches not acknowledged
        self._buffered = 0                           # bytes held (see the module docstring)
        self._force_ready = False                    # flush / memory exhausted: cut open batches
        self._metadata_wanted = False
        self._metadata_retry_at = 0.0
        self._metadata_backoff = self._first_metadata_backoff()
        self._metadata_at = self._clock.now()        # the last metadata answer taken
        self._metadata_error: str | None = None
        self._unconfirmed: dict[object, set[TopicPartition]] = {}   # acks=0: see flush()
        self._txn_partitions: set[TopicPartition] = set()
        self._txn_node = None
        self._error: ProduceError | None = None
        self._closed = False
        self._rotation = 0
        if self._transactional_id is not None:
            try:
                self._init_producer_id()
            except BaseException:
                self.close()
                raise

    # --- public API --------------------------------------------------------------------------

    def partition_count(self, topic: str) -> int:
        """The number of partitions of ``topic``; :class:`TopicError` naming it if it does not
        exist (the sink never creates topics: Metadata without auto-creation)."""
        count = self._counts.get(topic)
        if count is None:
            self._load_topic(topic)
            count = self._counts[topic]
        return count

    def send(self, topic: str, partitions, values: pa.Array, keys: pa.Array | None = None,
             headers: pa.Array | None = None) -> None:
        """Queue rows of ``topic``, each for its partition in ``partitions`` (ints >= 0, one per
        row, chosen by the writer), and send what is ready.

        Validates everything first -- the partitions exist, no record is larger than
        ``max_request_size`` (or ``buffer_memory``) -- so a bad row raises
        (:class:`TopicError` / :class:`ProduceError`) before any row of this call is queued.
        Blocks while the memory bound is reached (see the module docstring). A failure of an
        earlier batch is raised here as :class:`ProduceError`."""
        self._check_usable()
        n = len(values)
        parts = np.asarray(partitions)
        if parts.shape != (n,):
            raise ValueError(f"send(): {n} values but partitions of shape {parts.shape}")
        for name, column in (("keys", keys), ("headers", headers)):
            if column is not None and len(column) != n:
                raise ValueError(f"send(): {n} values but {len(column)} {name}")
        if n == 0:
            self._pump(0)
            return
        parts = parts.astype(np.int64, copy=False)
        self._check_partitions(topic, parts)
        # Each record's size without its offset delta and length (both varints that depend on
        # the record's place in its batch): record_sizes gives it at offset delta i.
        sizes = _bare_sizes(np.asarray(record_sizes(values, keys, headers), dtype=np.int64))
        self._check_sizes(topic, parts, sizes)
        groups = _group_by_partition(parts)
        if self._transactional_id is not None:
            self._add_to_transaction([(topic, p) for p, _ in groups])
        elif self._idempotent and self._producer_id < 0:
            self._init_producer_id()
        for partition, rows in groups:
            if isinstance(rows, slice):
                v, k, h = values[rows], _slice(keys, rows), _slice(headers, rows)
                s = sizes[rows]
            else:
                index = pa.array(rows)
                v, k, h = values.take(index), _take(keys, index), _take(headers, index)
                s = sizes[rows]
            self._append((topic, partition), v, k, h, s)
        self._pump(0)
        self._check_usable()

    def flush(self) -> None:
        """Send everything queued (ignoring linger) and return once every record sent so far is
        acknowledged (as ``acks`` asks), or raise :class:`ProduceError` naming topic, partition
        and the broker's error.

        With acks=0 the broker answers nothing, so a record counts as sent once written to the
        socket; flush() then also waits until each broker written to answered one more request
        on the same connection (ApiVersions). A broker handles a connection's requests in
        order, so that answer means it has handled every Produce request before it. And a Kafka
        broker reports a failed acks=0 Produce request the only way it can, by closing the
        connection: if the connection fails instead of answering, records may be lost, and
        flush() says so (ProduceError) rather than pretend they were written."""
        self._check_usable()
        settings = self.settings
        # Every batch is acknowledged or fails within delivery.timeout.ms of its creation; this
        # outer bound only guards against a bug leaving something pending forever.
        deadline = self._clock.now() + (settings.delivery_timeout_ms
                                        + 2 * settings.request_timeout_ms) / 1000
        self._force_ready = True
        try:
            while self._pending():
                self._pump(self._wait_ms())
                self._check_usable()
                if self._clock.now() > deadline:
                    tp = self._oldest_pending()
                    raise self._fail(tp, "flush() timed out with records still unacknowledged"
                                         f"{self._last_error_of(tp)}")
        finally:
            self._force_ready = False
        if self._unconfirmed:
            self._confirm_unacknowledged()

    def acked(self) -> dict[TopicPartition, int]:
        """Records acknowledged so far, per partition written to."""
        return {tp: st.acked for tp, st in self._parts.items()}

    def transaction(self) -> TransactionHandle | None:
        """With a transactional id: flush, then the open transaction's handle (not committed;
        see :func:`end_transaction`). None for a producer without transactional id."""
        if self._transactional_id is None:
            return None
        self.flush()
        return TransactionHandle(self._transactional_id, self._producer_id,
                                 self._producer_epoch, tuple(sorted(self._txn_partitions)))

    @property
    def reusable(self) -> bool:
        """Whether another task may go on with this producer: not closed, never failed, and
        nothing sent but unacknowledged or queued (a failed or interrupted task's records must
        not be sent by the next task). Its id, epoch and sequences then continue."""
        return not self._closed and self._error is None and not self._pending() \
            and not self._unconfirmed and self._transactional_id is None

    @property
    def producer_id(self) -> int:
        """The producer id (-1 until InitProducerId, and without idempotence)."""
        return self._producer_id

    @property
    def producer_epoch(self) -> int:
        return self._producer_epoch

    def close(self) -> None:
        """Close the connections. Does not flush: records not acknowledged by a successful
        :meth:`flush` may or may not have been written. A transaction is left as it is (the
        driver ends it, or the next producer of the id aborts it)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- validation ------------------------------------------------------------------------

    def _check_usable(self) -> None:
        error = self._error
        if error is not None:
            # A fresh exception each time (no growing traceback), with the same fields.
            raise _produce_error((error.topic, error.partition)
                                 if error.topic is not None else None, str(error),
                                 type(error)) from None
        if self._closed:
            raise ProduceError("The producer is closed.")

    def _check_partitions(self, topic: str, parts: np.ndarray) -> None:
        count = self.partition_count(topic)
        low, high = int(parts.min()), int(parts.max())
        if high >= count:
            # The topic may have grown since its metadata was read.
            self._load_topic(topic)
            count = self._counts[topic]
        if low < 0 or high >= count:
            bad = low if low < 0 else high
            raise TopicError(f"Partition {bad} of topic '{topic}' does not exist: the topic has "
                             f"{count} partition{'s' if count != 1 else ''} (0 to {count - 1}).")

    def _check_sizes(self, topic: str, parts: np.ndarray, sizes: np.ndarray) -> None:
        """``sizes``: see :func:`_bare_sizes`."""
        row = int(np.argmax(sizes))
        size = int(_sizes_at(sizes[row:row + 1], 0)[0]) + BATCH_OVERHEAD   # alone in a batch
        for limit, option in ((self.settings.max_request_size, "kafka.max.request.size"),
                              (self.settings.buffer_memory, "kafka.buffer.memory")):
            if size > limit:
                raise _produce_error(
                    (topic, int(parts[row])),
                    f"A record for topic '{topic}' partition {int(parts[row])} is {size} bytes "
                    f"when encoded in a record batch, larger than option '{option}' ({limit} "
                    "bytes); none of the rows given with it were written. Raise the option "
                    "(and the topic's 'max.message.bytes' if needed) or write smaller records.")

    # --- accumulating ----------------------------------------------------------------------

    def _partition(self, tp: TopicPartition) -> _Partition:
        st = self._parts.get(tp)
        if st is None:
            st = self._parts[tp] = _Partition(tp)
        return st

    def _append(self, tp, values, keys, headers, sizes: np.ndarray) -> None:
        """Append rows of one partition, cutting batches at the batch size limit. ``sizes``:
        see :func:`_bare_sizes`."""
        st = self._partition(tp)
        n = len(sizes)
        smallest = max(1, int(sizes.min()) + 2)
        pos = 0
        while pos < n:
            used = st.open.nbytes if st.open is not None else 0
            first = st.open.count if st.open is not None else 0
            room = self._limit - BATCH_OVERHEAD - used
            # Exact sizes of the next rows at their places in this batch (at most as many rows
            # as could fit are looked at).
            window = min(n - pos, max(room, 0) // smallest + 1)
            cumulative = np.cumsum(_sizes_at(sizes[pos:pos + window], first))
            take = int(np.searchsorted(cumulative, room, side="right"))
            if take <= 0:
                if used:                   # the next row does not fit: cut the open batch
                    self._cut(st)
                    continue
                take = 1                   # a row larger than the batch size: a batch of its own
            nbytes = int(cumulative[take - 1])
            self._reserve(nbytes)
            if st.open is None:            # new, or the wait in _reserve cut it
                st.open = _OpenBatch(self._clock.now(), self._clock.wall_ms())
                self._open.add(tp)
                if first:                  # the rows now start the batch: a little smaller
                    exact = int(_sizes_at(sizes[pos:pos + take], 0).sum())
                    self._buffered -= nbytes - exact
                    nbytes = exact
            ob = st.open
            ob.values.append(values.slice(pos, take))
            ob.keys.append(None if keys is None else keys.slice(pos, take))
            ob.headers.append(None if headers is None else headers.slice(pos, take))
            ob.count += take
            ob.nbytes += nbytes
            pos += take
            if pos < n:                    # more rows follow: this batch is full
                self._cut(st)

    def _reserve(self, nbytes: int) -> None:
        """Count ``nbytes`` more held; first wait (driving the network) while that would exceed
        ``buffer_memory``, at most ``max_block_ms`` without the bound being met."""
        limit = self.settings.buffer_memory
        if self._buffered + nbytes > limit and self._buffered > 0:
            deadline = self._clock.now() + self.settings.max_block_ms / 1000
            self._force_ready = True       # as Java's accumulator when memory is exhausted
            try:
                while self._buffered + nbytes > limit and self._buffered > 0:
                    self._check_usable()
                    now = self._clock.now()
                    if now >= deadline:
                        tp = self._oldest_pending()
                        raise _produce_error(tp, (
                            f"Waited {self.settings.max_block_ms} ms (option 'kafka.max.block.ms')"
                            f" for buffer space: {self._buffered} bytes (option "
                            f"'kafka.buffer.memory' = {limit}) are not yet acknowledged by "
                            "Kafka" + (f", the oldest for topic '{tp[0]}' partition {tp[1]}"
                                       f"{self._last_error_of(tp)}" if tp else "") + "."))
                    self._pump(min(self._wait_ms(), (deadline - now) * 1000))
            finally:
                self._force_ready = False
        self._buffered += nbytes

    def _cut(self, st: _Partition) -> None:
        """Encode the partition's open batch and queue it for sending."""
        ob = st.open
        st.open = None
        self._open.discard(st.tp)
        if ob is None or ob.count == 0:
            return
        values = _concat(ob.values)
        keys = None if all(k is None for k in ob.keys) else _concat_nullable(ob.keys, ob.values)
        headers = None if all(h is None for h in ob.headers) else \
            _concat_nullable(ob.headers, ob.values)
        sequence = -1
        if self._idempotent:
            sequence = st.next_sequence
            st.next_sequence = (sequence + ob.count) % _SEQUENCE_MODULUS
        data = encode_record_batch(
            values, keys, headers, timestamp_ms=ob.timestamp_ms,
            producer_id=self._producer_id, producer_epoch=self._producer_epoch,
            base_sequence=sequence, transactional=self._transactional_id is not None,
            compression=self.settings.compression_type)
        batch = _Batch(st.tp, st.next_order, data, ob.count, sequence, ob.created)
        st.next_order += 1
        self._buffered += len(data) - ob.nbytes
        st.queue.append(batch)
        st.unacked.append(batch)
        self._unacked += 1
        self._sendable.add(st.tp)

    # --- driving the network ---------------------------------------------------------------

    def _pending(self) -> bool:
        return bool(self._unacked or self._open)

    def _pump(self, wait_ms: float) -> None:
        """One round: handle responses, cut lingering batches, send what can be sent, do the
        network I/O (waiting at most ``wait_ms`` for some), handle what came back."""
        now = self._clock.now()
        self._collect(now)
        self._linger(now)
        if now - self._metadata_at >= self.settings.metadata_max_age_ms / 1000 and self._counts:
            self._metadata_wanted = True          # kafka.metadata.max.age.ms, as in Java
        self._refresh_metadata_if_wanted(now)
        self._send_ready(now)
        self._client.poll(wait_ms)
        now = self._clock.now()
        self._collect(now)
        self._send_ready(now)

    def _wait_ms(self) -> float:
        """How long the network may be waited on before a timer of ours is due."""
        now = self._clock.now()
        due = now + _MAX_POLL_WAIT_MS / 1000
        if not self._force_ready:
            for tp in self._open:
                due = min(due, self._parts[tp].open.created + self.settings.linger_ms / 1000)
        for tp in self._sendable:
            st = self._parts[tp]
            if st.retrying and not st.in_flight:
                due = min(due, st.retry_at)
        if self._metadata_wanted:
            due = min(due, self._metadata_retry_at)
        return max(0.0, (due - now) * 1000)

    def _linger(self, now: float) -> None:
        if not self._open:
            return
        linger = self.settings.linger_ms / 1000
        for tp in list(self._open):
            st = self._parts[tp]
            if self._force_ready or now - st.open.created >= linger:
                self._cut(st)

    def _send_ready(self, now: float) -> None:
        if not self._sendable or self._error is not None:
            return
        settings = self.settings
        by_node: dict[object, list[_Partition]] = {}
        for tp in list(self._sendable):
            st = self._parts[tp]
            if not st.queue:
                self._sendable.discard(tp)
                continue
            head = st.queue[0]
            if now - head.created > settings.delivery_timeout_ms / 1000 and not st.in_flight:
                self._fail(tp, f"not acknowledged within {settings.delivery_timeout_ms} ms "
                               f"(option 'kafka.delivery.timeout.ms'){self._last_error_of(tp)}")
                return
            if st.retrying:
                if st.in_flight or now < st.retry_at:
                    continue
                st.retrying = False
            if not self._may_send_another(st):
                continue
            leader = self._leaders.get(tp, -1)
            if leader < 0:
                self._metadata_wanted = True
                continue
            by_node.setdefault(leader, []).append(st)
        for node, parts in by_node.items():
            if not self._node_ready(node):
                if self._client.node_failing(node):
                    # Connecting to the leader failed: it is down or restarting, and its
                    # partitions have (or soon get) another leader. Without asking, the
                    # batches would wait for it until kafka.delivery.timeout.ms.
                    self._metadata_wanted = True
                continue
            queue = self._in_flight.setdefault(node, deque())
            self._rotation += 1
            shift = self._rotation % len(parts)
            parts = parts[shift:] + parts[:shift]
            while parts and len(queue) < settings.max_in_flight:
                parts = self._send_request(node, parts, now)

    def _send_request(self, node, parts: list[_Partition], now: float) -> list[_Partition]:
        """Send one Produce request to ``node`` with the next batch of each of ``parts`` that
        fits; returns the partitions that still have batches to send to it."""
        limit = self.settings.max_request_size
        batches: dict[TopicPartition, _Batch] = {}
        size = 0
        rest = []
        for st in parts:
            batch = st.queue[0]
            if batches and size + len(batch.data) > limit:
                rest.append(st)
                continue
            batches[st.tp] = batch
            size += len(batch.data)
            st.queue.pop(0)
            st.in_flight += 1
            batch.in_flight = True
            batch.attempts += 1
            if not st.queue:
                self._sendable.discard(st.tp)
            elif self._may_send_another(st):
                rest.append(st)
        topics: dict[str, list] = {}
        T = ProduceRequest.TopicProduceData
        P = T.PartitionProduceData
        for (topic, partition), batch in batches.items():
            topics.setdefault(topic, []).append(P(index=partition, records=batch.data))
        request = ProduceRequest(
            transactional_id=self._transactional_id, acks=self.settings.acks,
            timeout_ms=self.settings.request_timeout_ms,
            topic_data=[T(name=t, partition_data=ps) for t, ps in topics.items()],
            min_version=_PRODUCE_MIN_VERSION, max_version=_PRODUCE_MAX_VERSION)
        future = self._client.send_async(node, request, self.settings.request_timeout_ms)
        self._in_flight[node].append(_Request(node, batches, future, now))
        if self.settings.acks == 0:
            self._unconfirmed.setdefault(node, set()).update(batches)
        return rest

    def _may_send_another(self, st: _Partition) -> bool:
        """Whether another batch of the partition may go out while ``st.in_flight`` are in
        flight. With idempotence: at most 5 (the broker deduplicates the last 5 batches of a
        producer), and only one until the partition acknowledged a first batch -- a broker that
        knows nothing of this producer yet accepts *any* sequence number (it cannot tell a new
        producer from one whose state was cleaned up), so a second batch could be written
        before a first one that failed with a retriable error, and the first one's retry would
        then be out of order."""
        if not self._idempotent:
            return True
        if not st.confirmed:
            return st.in_flight == 0
        return st.in_flight < _MAX_IN_FLIGHT_IDEMPOTENT

    def _node_ready(self, node) -> bool:
        if self._client.node_ready(node):
            self._node_errors.pop(node, None)
            return True
        self._node_errors.setdefault(node, f"broker {node} is not reachable")
        return False

    def _first_metadata_backoff(self) -> float:
        return self.settings.retry_backoff_ms / 1000

    def _confirm_unacknowledged(self) -> None:
        """acks=0: one answered request per broker written to (see :meth:`flush`)."""
        for node, tps in sorted(self._unconfirmed.items(), key=lambda item: str(item[0])):
            try:
                self._client.send(node, ApiVersionsRequest(
                    client_software_name="pykafka", client_software_version="0",
                    max_version=_API_VERSIONS_MAX_VERSION))
            except RetriableBrokerError as exc:
                tp = min(tps)
                raise self._fail(tp, (
                    f"the connection to broker {node} failed after records for {len(tps)} "
                    f"partition(s) were sent to it with acks=0 ({exc}). With acks=0 the broker "
                    "acknowledges nothing, so some of them may be lost; set 'kafka.acks' to 1 "
                    "or all to have every record acknowledged.")) from None
            del self._unconfirmed[node]

    # --- responses ---------------------------------------------------------------------------

    def _collect(self, now: float) -> None:
        for node, queue in self._in_flight.items():
            if not queue:
                continue
            if self.settings.acks == 0:
                self._collect_unacknowledged(node, queue, now)
                continue
            while queue and queue[0].future.is_done:
                self._complete(queue.popleft(), now)
            if queue and any(r.future.is_done for r in queue):
                # Responses come in order on a connection; a request done out of order was on
                # a connection that failed (or on a new one): handle every finished one.
                for request in [r for r in queue if r.future.is_done]:
                    queue.remove(request)
                    self._complete(request, now)

    def _collect_unacknowledged(self, node, queue: deque, now: float) -> None:
        """acks=0: a request counts as done once its bytes left for the socket; if the
        connection closed before, its batches are sent again."""
        failed = [r for r in queue if r.future.failed()]
        for request in failed:
            queue.remove(request)
            self._complete(request, now)
        if not queue:
            return
        unsent = self._client.unsent_bytes(node)
        if unsent == 0:
            while queue:
                request = queue.popleft()
                for batch in request.batches.values():
                    self._acknowledged(batch)
        elif unsent < 0:
            while queue:
                request = queue.popleft()
                for batch in request.batches.values():
                    self._retry(batch, f"connection to broker {node} closed", now, refresh=True)

    def _complete(self, request: _Request, now: float) -> None:
        future = request.future
        if future.failed():
            exc = future.exception
            if isinstance(exc, _FATAL_NETWORK_ERRORS):
                tp = next(iter(request.batches))
                self._fail(tp, f"{type(exc).__name__}: {exc}")
                return
            why = f"request to broker {request.node} failed: {type(exc).__name__}: {exc}"
            self._node_errors[request.node] = why
            for batch in request.batches.values():
                self._retry(batch, why, now, refresh=True)
            return
        response = future.value
        seen = set()
        for topic in response.responses:
            for answer in topic.partition_responses:
                tp = (topic.name, answer.index)
                batch = request.batches.get(tp)
                if batch is None or tp in seen:
                    continue
                seen.add(tp)
                self._partition_result(batch, answer, now)
        for tp, batch in request.batches.items():
            if tp not in seen:
                self._retry(batch, f"broker {request.node} answered without this partition",
                            now, refresh=True)

    def _partition_result(self, batch: _Batch, answer, now: float) -> None:
        code = answer.error_code
        if code == _NONE or code == _DUPLICATE_SEQUENCE:
            self._acknowledged(batch)
            return
        error = error_for(code)
        what = _describe(error, getattr(answer, "error_message", None),
                         getattr(answer, "record_errors", None))
        st = self._parts[batch.tp]
        if code == _OUT_OF_ORDER_SEQUENCE and self._idempotent and st.unacked \
                and st.unacked[0] is not batch:
            # An earlier batch of the partition failed first; this one is resent after it.
            self._retry(batch, what, now, refresh=False)
        elif getattr(error, "retriable", False):
            self._retry(batch, what, now, refresh=getattr(error, "invalid_metadata", False))
        else:
            self._fail(batch.tp, _fatal_produce_message(error, what, batch, self.settings,
                                                        self._transactional_id),
                       fenced=error in _FENCED)

    def _acknowledged(self, batch: _Batch) -> None:
        self._metadata_backoff = self._first_metadata_backoff()   # the leaders answer again
        st = self._parts[batch.tp]
        st.in_flight -= 1
        batch.in_flight = False
        try:
            st.unacked.remove(batch)
        except ValueError:
            return                          # acknowledged twice (a retry of a duplicate)
        st.acked += batch.count
        st.confirmed = True
        self._unacked -= 1
        self._buffered -= len(batch.data)
        batch.data = b""

    def _retry(self, batch: _Batch, why: str, now: float, *, refresh: bool) -> None:
        st = self._parts[batch.tp]
        st.in_flight -= 1
        batch.in_flight = False
        batch.last_error = why
        if self._error is not None:
            return
        log.warning("Retrying a record batch of %s-%s (attempt %d): %s", batch.tp[0],
                    batch.tp[1], batch.attempts, why)
        if now - batch.created > self.settings.delivery_timeout_ms / 1000:
            self._fail(batch.tp, f"not acknowledged within {self.settings.delivery_timeout_ms} "
                                 f"ms (option 'kafka.delivery.timeout.ms'); last error: {why}")
            return
        index = len(st.queue)
        while index > 0 and st.queue[index - 1].order > batch.order:
            index -= 1
        st.queue.insert(index, batch)
        st.retrying = True
        st.retry_at = now + self.settings.retry_backoff_ms / 1000
        self._sendable.add(batch.tp)
        if refresh:
            self._metadata_wanted = True

    def _fail(self, tp: TopicPartition | None, why: str, *, fenced: bool = False
              ) -> ProduceError:
        """Record the producer's (first) failure; every later call raises it (a
        :class:`TransactionFencedError` if ``fenced``)."""
        if self._error is None:
            where = f" topic '{tp[0]}' partition {tp[1]}" if tp is not None else ""
            self._error = _produce_error(tp, f"Could not write to Kafka{where}: {why}",
                                         TransactionFencedError if fenced else ProduceError)
            log.error("%s", self._error)
        return self._error

    def _oldest_pending(self) -> TopicPartition | None:
        oldest = None
        for st in self._parts.values():
            if st.unacked and (oldest is None or st.unacked[0].created < oldest[0]):
                oldest = (st.unacked[0].created, st.tp)
            elif st.open is not None and (oldest is None or st.open.created < oldest[0]):
                oldest = (st.open.created, st.tp)
        return oldest[1] if oldest else None

    def _last_error_of(self, tp: TopicPartition | None) -> str:
        if tp is None:
            return ""
        st = self._parts.get(tp)
        errors = [b.last_error for b in (st.unacked if st else ()) if b.last_error]
        if errors:
            return f"; last error: {errors[-1]}"
        leader = self._leaders.get(tp, -1)
        if leader < 0:
            return "; it has no leader" + (f" ({self._metadata_error})"
                                          if self._metadata_error else "")
        if leader in self._node_errors:
            return f"; {self._node_errors[leader]}"
        return ""

    # --- metadata ----------------------------------------------------------------------------

    def _load_topic(self, topic: str) -> None:
        """Metadata of ``topic`` (retried while the cluster answers with transient errors, at
        most ``max_block_ms``); :class:`TopicError` if it does not exist."""
        deadline = self._clock.now() + self.settings.max_block_ms / 1000
        while True:
            try:
                info = self._client.metadata([topic]).get(topic)
                code = info.error_code if info is not None else \
                    Errors.UnknownTopicOrPartitionError.errno
                if code == _NONE:
                    self._update_topic(info)
                    self._metadata_at = self._clock.now()
                    return
                error = error_for(code)
                if error is Errors.UnknownTopicOrPartitionError:
                    raise TopicError(
                        f"Topic '{topic}' does not exist on the Kafka cluster at "
                        f"'{self._client.bootstrap_servers}'. The sink does not create topics "
                        "(and does not ask the broker to): create it first, e.g. with "
                        "kafka-topics.sh --create, or write to an existing topic.")
                if not getattr(error, "retriable", False):
                    raise TopicError(f"Cannot write to topic '{topic}': {error.__name__} "
                                     f"({getattr(error, 'description', '')}).")
                last = f"topic '{topic}': {error.__name__}"
            except RetriableBrokerError as exc:
                last = str(exc)
            if self._clock.now() >= deadline:
                raise BrokerUnavailableError(
                    f"Could not get the metadata of topic '{topic}' from Kafka at "
                    f"'{self._client.bootstrap_servers}' within {self.settings.max_block_ms} ms "
                    f"(option 'kafka.max.block.ms'). Last error: {last}")
            self._clock.sleep(self.settings.retry_backoff_ms / 1000)

    def _update_topic(self, info: TopicInfo) -> None:
        if info.partitions:
            self._counts[info.name] = max(info.partitions) + 1
        for partition, part in info.partitions.items():
            self._leaders[(info.name, partition)] = part.leader

    def _refresh_metadata_if_wanted(self, now: float) -> None:
        """Refresh the leaders of the topics written to when they may have moved: after an
        error that says so, while a leader cannot be connected to, and every
        ``metadata_max_age_ms`` (a blocking Metadata request; responses of Produce requests in
        flight are handled meanwhile).

        Refreshes follow each other after ``retry_backoff_ms``, doubling up to 1 s while
        nothing is acknowledged, as the Java client's (``retry.backoff.max.ms``): the cluster
        may name a dead broker as leader for a while (a KRaft controller until the broker's
        session times out, about 9 s; a ZooKeeper-mode broker until the controller's news
        reaches it). An older answer than one seen is not taken (leader epochs, KIP-320:
        :meth:`BrokerClient.metadata`)."""
        if not self._metadata_wanted or now < self._metadata_retry_at:
            return
        topics = sorted(self._counts)
        self._metadata_retry_at = now + self._metadata_backoff
        self._metadata_backoff = min(2 * self._metadata_backoff,
                                     max(1.0, self._first_metadata_backoff()))
        try:
            infos = self._client.metadata(topics)
        except RetriableBrokerError as exc:
            self._metadata_error = str(exc)
            return
        self._metadata_wanted = False
        self._metadata_error = None
        self._metadata_at = self._clock.now()
        for topic in topics:
            info = infos.get(topic)
            if info is None or info.error_code != _NONE:
                code = info.error_code if info is not None else \
                    Errors.UnknownTopicOrPartitionError.errno
                self._metadata_error = f"topic '{topic}': {error_for(code).__name__}"
                self._metadata_wanted = True
                continue
            self._update_topic(info)
            if any(p.leader < 0 for p in info.partitions.values()):
                self._metadata_wanted = True

    # --- idempotence and transactions ----------------------------------------------------------

    def _init_producer_id(self) -> None:
        deadline = self._clock.now() + self.settings.max_block_ms / 1000
        self._producer_id, self._producer_epoch = _init_producer_id(
            self._client, self._transactional_id, self.settings.transaction_timeout_ms,
            deadline=deadline, backoff_s=self.settings.retry_backoff_ms / 1000,
            clock=self._clock, deadline_option="kafka.max.block.ms")
        log.debug("producer id %d epoch %d%s", self._producer_id, self._producer_epoch,
                  f" for transactional id '{self._transactional_id}'"
                  if self._transactional_id else "")

    def _add_to_transaction(self, tps: Iterable[TopicPartition]) -> None:
        """AddPartitionsToTxn for the partitions not yet in the transaction (before any batch
        of theirs is sent, as the broker requires)."""
        new = sorted(set(tps) - self._txn_partitions)
        if not new:
            return
        tid = self._transactional_id
        deadline = self._clock.now() + self.settings.max_block_ms / 1000
        by_topic: dict[str, list[int]] = {}
        for topic, partition in new:
            by_topic.setdefault(topic, []).append(partition)
        Topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        last = None
        while True:
            retry_s = self.settings.retry_backoff_ms / 1000
            try:
                if self._txn_node is None:
                    self._txn_node = self._client.find_transaction_coordinator(tid)
                request = AddPartitionsToTxnRequest(
                    v3_and_below_transactional_id=tid,
                    v3_and_below_producer_id=self._producer_id,
                    v3_and_below_producer_epoch=self._producer_epoch,
                    v3_and_below_topics=[Topic(name=t, partitions=ps)
                                         for t, ps in by_topic.items()],
                    max_version=_ADD_PARTITIONS_MAX_VERSION)
                response = self._client.send(self._txn_node, request)
                errors = {}
                for topic in response.results_by_topic_v3_and_below:
                    for result in topic.results_by_partition:
                        if result.partition_error_code != _NONE:
                            errors[(topic.name, result.partition_index)] = \
                                error_for(result.partition_error_code)
                if not errors:
                    self._txn_partitions.update(new)
                    return
                kinds = set(errors.values()) - {Errors.OperationNotAttemptedError}
                first_tp, first = min(((tp, e) for tp, e in errors.items()
                                       if e in kinds), default=next(iter(errors.items())))
                last = f"{first.__name__} for topic '{first_tp[0]}' partition {first_tp[1]}"
                if any(e in _FENCED for e in kinds):
                    raise TransactionFencedError(
                        f"Transactional id '{tid}' was fenced while adding partitions to its "
                        "transaction: a newer producer with the same transactional id was "
                        "started (a retried or speculative task?).")
                if kinds & set(_COORDINATOR_MOVED):
                    self._txn_node = None
                elif Errors.ConcurrentTransactionsError in kinds:
                    retry_s = _TXN_RETRY_BACKOFF_S
                elif not all(getattr(e, "retriable", False) for e in kinds):
                    raise _produce_error(first_tp, (
                        f"Could not add topic '{first_tp[0]}' partition {first_tp[1]} to the "
                        f"transaction of transactional id '{tid}': {first.__name__} "
                        f"({getattr(first, 'description', '')})."))
            except RetriableBrokerError as exc:
                last = str(exc)
                self._txn_node = None
            if self._clock.now() >= deadline:
                raise _produce_error(new[0], (
                    f"Could not add {len(new)} partition(s) to the transaction of transactional "
                    f"id '{tid}' within {self.settings.max_block_ms} ms (option "
                    f"'kafka.max.block.ms'). Last error: {last}"))
            self._clock.sleep(retry_s)


# --------------------------------------------------------------------------------------------
# Driver side: ending and aborting transactions
# --------------------------------------------------------------------------------------------

def end_transaction(client_config: Mapping[str, object], handle: TransactionHandle,
                    commit: bool, *, timeout_ms: int | None = None, client=None,
                    clock=None) -> None:
    """Commit (``commit=True``) or abort the transaction of ``handle`` (EndTxn on the
    transaction coordinator), retrying coordinator moves and CONCURRENT_TRANSACTIONS for at
    most ``timeout_ms`` (default ``kafka.request.timeout.ms``).

    Committing a transaction that is already committed succeeds (the driver may retry a commit
    after a crash), as does aborting one already aborted; a handle without partitions has
    nothing to end. :class:`TransactionFencedError` when the transaction can no longer be
    ended as asked (see there); :class:`ProduceError` naming the transactional id otherwise."""
    if not handle.partitions:
        return
    clock = clock or _Clock()
    own = client is None
    client = client if client is not None else BrokerClient(client_config)
    try:
        timeout_ms = client.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = clock.now() + timeout_ms / 1000
        tid = handle.transactional_id
        action = "commit" if commit else "abort"
        node = None
        last = None
        while True:
            pause = 0.1
            try:
                if node is None:
                    node = client.find_transaction_coordinator(tid)
                response = client.send(node, EndTxnRequest(
                    transactional_id=tid, producer_id=handle.producer_id,
                    producer_epoch=handle.producer_epoch, committed=commit,
                    max_version=_END_TXN_MAX_VERSION))
                error = error_for(response.error_code)
                if error is Errors.NoError:
                    return
                last = error.__name__
                if error in _FENCED:
                    raise TransactionFencedError(
                        f"Could not {action} the transaction of transactional id '{tid}' "
                        f"(producer id {handle.producer_id}, epoch {handle.producer_epoch}): "
                        f"{error.__name__}. A newer producer with this transactional id was "
                        "started, or the broker aborted the transaction because it was open "
                        "longer than 'kafka.transaction.timeout.ms'; its records are not "
                        "committed.")
                if error is Errors.InvalidTxnStateError:
                    # What Kafka answers for a commit of an aborted transaction (and an abort of
                    # a committed one): it cannot be ended the other way any more.
                    raise TransactionFencedError(
                        f"Could not {action} the transaction of transactional id '{tid}' "
                        f"(producer id {handle.producer_id}, epoch {handle.producer_epoch}): "
                        "INVALID_TXN_STATE -- it was already "
                        f"{'aborted' if commit else 'committed'} (or never begun).")
                if error in _COORDINATOR_MOVED:
                    node = None
                elif error is Errors.ConcurrentTransactionsError:
                    pause = _TXN_RETRY_BACKOFF_S
                elif not getattr(error, "retriable", False):
                    raise ProduceError(
                        f"Could not {action} the transaction of transactional id '{tid}': "
                        f"{error.__name__} ({getattr(error, 'description', '')}).")
            except RetriableBrokerError as exc:
                last = str(exc)
                node = None
            if clock.now() >= deadline:
                raise ProduceError(
                    f"Could not {action} the transaction of transactional id '{tid}' within "
                    f"{timeout_ms} ms. Last error: {last}")
            clock.sleep(pause)
    finally:
        if own:
            client.close()


def end_transactions(client_config: Mapping[str, object], handles: Iterable[TransactionHandle],
                     commit: bool, *, timeout_ms: int | None = None) -> None:
    """:func:`end_transaction` for each of ``handles`` in turn, over one connection to the
    cluster (the driver ends one transaction per write task). The first failure is raised; the
    handles after it are not ended."""
    handles = [h for h in handles if h.partitions]
    if not handles:
        return
    with BrokerClient(client_config) as client:
        for handle in handles:
            end_transaction(client_config, handle, commit, timeout_ms=timeout_ms, client=client)


def abort_stale_transaction(client_config: Mapping[str, object], transactional_id: str,
                            timeout_ms: int, *, transaction_timeout_ms: int = 60_000,
                            client=None, clock=None) -> None:
    """Fence every producer of ``transactional_id`` and abort its open transaction, if any:
    InitProducerId for the id, retried (the coordinator answers CONCURRENT_TRANSACTIONS until
    the abort is done) for at most ``timeout_ms``. Afterwards no earlier handle of the id can
    commit. ``transaction_timeout_ms`` is what the id is registered with (no transaction is
    begun, so it hardly matters)."""
    clock = clock or _Clock()
    own = client is None
    client = client if client is not None else BrokerClient(client_config)
    try:
        _init_producer_id(client, transactional_id, transaction_timeout_ms,
                          deadline=clock.now() + timeout_ms / 1000, backoff_s=0.1, clock=clock,
                          deadline_option=None)
    finally:
        if own:
            client.close()


def _init_producer_id(client, transactional_id: str | None, transaction_timeout_ms: int, *,
                      deadline: float, backoff_s: float, clock, deadline_option: str | None
                      ) -> tuple[int, int]:
    """InitProducerId (on the transaction coordinator when transactional, else any broker),
    retried until ``deadline``; returns (producer id, epoch)."""
    node = None
    last = None
    subject = f"transactional id '{transactional_id}'" if transactional_id else \
        "an idempotent producer"
    while True:
        pause = backoff_s
        try:
            if transactional_id is not None and node is None:
                node = client.find_transaction_coordinator(transactional_id)
            response = client.send(node, InitProducerIdRequest(
                transactional_id=transactional_id, transaction_timeout_ms=transaction_timeout_ms,
                max_version=_INIT_PRODUCER_ID_MAX_VERSION))
            error = error_for(response.error_code)
            if error is Errors.NoError:
                return response.producer_id, response.producer_epoch
            last = error.__name__
            if error in _COORDINATOR_MOVED:
                node = None
            elif error is Errors.ConcurrentTransactionsError:
                pause = _TXN_RETRY_BACKOFF_S
            elif not getattr(error, "retriable", False):
                raise ProduceError(_init_error_message(error, subject, transaction_timeout_ms))
        except RetriableBrokerError as exc:
            last = str(exc)
            node = None
        except (Errors.TransactionalIdAuthorizationFailedError,
                Errors.ClusterAuthorizationFailedError) as exc:   # from FindCoordinator
            raise ProduceError(_init_error_message(type(exc), subject,
                                                   transaction_timeout_ms)) from None
        if clock.now() >= deadline:
            bound = f" (option '{deadline_option}')" if deadline_option else ""
            raise ProduceError(f"Could not get a producer id for {subject} from Kafka at "
                               f"'{client.bootstrap_servers}' in time{bound}. Last error: {last}")
        clock.sleep(pause)


def _init_error_message(error, subject: str, transaction_timeout_ms: int) -> str:
    if error is Errors.TransactionalIdAuthorizationFailedError:
        return (f"Not authorized to use {subject}: the principal needs the Write permission "
                "on that TransactionalId (ACL).")
    if error is Errors.ClusterAuthorizationFailedError:
        return (f"Not authorized to get a producer id for {subject}: brokers before Kafka 2.8 "
                "need the IdempotentWrite permission on the cluster for idempotence; grant it, "
                "or set 'kafka.enable.idempotence' to false.")
    if error is Errors.InvalidTransactionTimeoutError:
        return (f"The broker rejected the transaction timeout of {subject}: option "
                f"'kafka.transaction.timeout.ms' ({transaction_timeout_ms}) is larger than the "
                "broker's 'transaction.max.timeout.ms'.")
    return (f"Could not get a producer id for {subject}: {error.__name__} "
            f"({getattr(error, 'description', '')}).")


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

# Network failures that no retry can fix (a TLS or SASL failure is raised by node_ready).
_FATAL_NETWORK_ERRORS = (Errors.IncompatibleBrokerVersion, Errors.UnsupportedVersionError)


def _produce_error(tp: TopicPartition | None, message: str, kind=ProduceError) -> ProduceError:
    """A :class:`ProduceError` (or ``kind``) with ``topic`` and ``partition`` attributes."""
    error = kind(message)
    error.topic, error.partition = tp if tp is not None else (None, None)
    return error


def _describe(error, message: str | None, record_errors) -> str:
    text = error.__name__
    details = [message] if message else []
    for item in record_errors or ():
        detail = getattr(item, "batch_index_error_message", None)
        details.append(f"record {getattr(item, 'batch_index', '?')}"
                       + (f": {detail}" if detail else ""))
    return text + (f" ({'; '.join(details[:3])})" if details else "")


def _fatal_produce_message(error, what: str, batch: _Batch, settings: ProducerSettings,
                           transactional_id: str | None) -> str:
    if error in (Errors.MessageSizeTooLargeError, Errors.RecordListTooLargeError):
        return (f"{what}: the broker rejected a record batch of {len(batch.data)} bytes as too "
                "large. The topic's 'max.message.bytes' (or the broker's 'message.max.bytes') "
                f"is smaller; lower 'kafka.batch.size' ({settings.batch_size}) or raise that "
                "limit.")
    if error in _FENCED:
        return (f"{what}: this producer was fenced" + (
            f" -- a newer producer with transactional id '{transactional_id}' was started"
            if transactional_id else "") + ".")
    if error is Errors.OutOfOrderSequenceNumberError or error is Errors.UnknownProducerIdError:
        return (f"{what}: the broker lost track of this idempotent producer's sequence numbers "
                "(its state for the producer expired or was truncated). The task fails rather "
                "than risk duplicates; a retry starts a new producer.")
    if error is Errors.TopicAuthorizationFailedError:
        return f"{what}: not authorized to write to this topic (ACL: Write on the topic)."
    if error is Errors.CorruptRecordError:
        return f"{what}: the broker found the record batch corrupt (CRC mismatch)."
    return f"{what} ({getattr(error, 'description', '')})"


def _group_by_partition(parts: np.ndarray) -> list[tuple[int, slice | np.ndarray]]:
    """Rows of each partition, in row order: a slice when they are contiguous (the common case
    of a writer that already grouped them), else their indices."""
    first = int(parts[0])
    if (parts == first).all():
        return [(first, slice(0, len(parts)))]
    order = np.argsort(parts, kind="stable")
    ordered = parts[order]
    bounds = np.flatnonzero(np.diff(ordered)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(parts)]))
    groups = []
    for start, end in zip(starts.tolist(), ends.tolist()):
        rows = order[start:end]
        partition = int(ordered[start])
        if int(rows[-1]) - int(rows[0]) == end - start - 1:
            groups.append((partition, slice(int(rows[0]), int(rows[-1]) + 1)))
        else:
            groups.append((partition, rows))
    return groups


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of the zigzag varint of each value (>= 0), as records write their length and
    offset delta."""
    z = values * 2
    return (1 + (z >= 1 << 7) + (z >= 1 << 14) + (z >= 1 << 21) + (z >= 1 << 28)
            + (z >= 1 << 35)).astype(np.int64)


def _bare_sizes(sizes: np.ndarray) -> np.ndarray:
    """From record ``i``'s encoded size at offset delta ``i`` (:func:`record_sizes`), its size
    without the length and offset delta varints -- what does not depend on where the record
    ends up in a batch (:func:`_sizes_at` adds them back)."""
    body = sizes - 1                      # the record without its length varint ...
    for width in (2, 3, 4, 5):            # ... whose size is the one width that fits
        candidate = sizes - width
        body = np.where(_varint_sizes(candidate) == width, candidate, body)
    return body - _varint_sizes(np.arange(len(sizes), dtype=np.int64))


def _sizes_at(bare: np.ndarray, first: int) -> np.ndarray:
    """Encoded sizes of records of ``bare`` sizes (:func:`_bare_sizes`) placed at offset deltas
    ``first``, ``first + 1``, ..."""
    body = bare + _varint_sizes(np.arange(first, first + len(bare), dtype=np.int64))
    return body + _varint_sizes(body)


def _slice(column: pa.Array | None, rows: slice) -> pa.Array | None:
    return None if column is None else column[rows]


def _take(column: pa.Array | None, index: pa.Array) -> pa.Array | None:
    return None if column is None else column.take(index)


_BINARY_TYPES = (pa.binary(), pa.large_binary(), pa.string(), pa.large_string())


def _concat(chunks: list[pa.Array]) -> pa.Array:
    if len(chunks) == 1:
        return chunks[0]
    types = {c.type for c in chunks}
    if len(types) > 1 and types <= set(_BINARY_TYPES):
        # binary and large_binary chunks from different send() calls
        chunks = [c.cast(pa.large_binary()) for c in chunks]
    return pa.concat_arrays(chunks)


def _concat_nullable(chunks: list[pa.Array | None], values: list[pa.Array]) -> pa.Array:
    """Concatenate a column of which some chunks are absent (all null there)."""
    kind = next(c.type for c in chunks if c is not None)
    filled = [c if c is not None else pa.nulls(len(v), kind) for c, v in zip(chunks, values)]
    return _concat(filled)
