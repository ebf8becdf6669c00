"""The sink's Kafka producer: Arrow columns in, acknowledged record batches out.

It does what Kafka's Java producer does, for whole Arrow columns instead of one record at a
time, so that a Spark write task costs Python work per *batch*, not per record. Its parts are
modules of their own, each with the why of its part in its docstring:

:mod:`~kafka_source.write.batches` -- accumulating
    :meth:`Producer.send` groups the rows by partition and appends them to the partition's
    open batch as Arrow slices; a batch is cut at ``batch_size``, after ``linger_ms``, by
    :meth:`Producer.flush` and when ``buffer_memory`` is reached, encoded at once, and kept
    until acknowledged.
:mod:`~kafka_source.write.sending` -- sending and in-flight requests
    One Produce request per broker with at most one batch per partition, up to
    ``max_in_flight`` of them in flight per broker; the answers, and retries that keep each
    partition's batches in sequence order.
:mod:`~kafka_source.write.transactions` -- idempotence and transactions
    InitProducerId, AddPartitionsToTxn, and the :class:`TransactionHandle` that the driver
    commits or aborts.
:mod:`~kafka_source.write.ending` -- ending transactions
    :func:`end_transaction`, and :func:`end_transactions` for many at once (EndTxn).
:mod:`~kafka_source.write.produce_errors` -- what the producer's failures say.
:mod:`~kafka_source.write.clock` -- the time, simulated in unit tests.

This module has :class:`Producer`, whose methods for those parts come from mixins in their
modules: here are its public API, the checks of what is sent, the network loop
(``Producer._pump``) and the metadata of the topics written to. Its settings,
:class:`ProducerSettings`, are configuration (:mod:`kafka_source.config.producer_settings`).
The public names of the parts, and the settings, are importable from here too.

Following leaders
    As the Java producer does, metadata is asked for again when a request fails or an answer
    says the leader moved, when connecting to a leader fails (a crashed or restarting broker:
    without asking, its partitions' batches would wait for it until ``delivery_timeout_ms``),
    and every ``metadata_max_age_ms`` (a preferred-leader election, partitions added).

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
from collections import deque
from typing import Mapping

import kafka.errors as Errors
import numpy as np
import pyarrow as pa

from ..config.producer_settings import DEFAULT_BATCH_SIZE, ProducerSettings
from ..errors import BrokerUnavailableError, ProduceError, TopicError
from ..wire.net.client import BrokerClient, RetriableBrokerError, TopicInfo, error_for
from ..wire.format.arrays import from_numpy
from ..wire.format.encode import BATCH_OVERHEAD, record_sizes
from .batches import (Accumulator, Partition, TopicPartition, bare_sizes, group_by_partition,
                      sizes_at, slice_column, take_column)
from .clock import Clock
from .produce_errors import NONE, produce_error
from .sending import Request, Sender
from .ending import end_transaction, end_transactions
from .transactions import (TransactionFencedError, TransactionHandle, Transactional,
                           abort_stale_transaction)

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_BATCH_SIZE", "Producer", "ProducerSettings", "TransactionFencedError",
           "TransactionHandle", "abort_stale_transaction", "end_transaction", "end_transactions"]

_MAX_POLL_WAIT_MS = 50           # longest single network wait while blocked (re-checks timers)


# --------------------------------------------------------------------------------------------
# The producer
# --------------------------------------------------------------------------------------------

class Producer(Accumulator, Sender, Transactional):
    """Kafka's producer for Arrow columns (see the module docstring). Not thread-safe: one per
    writer (Spark task).

    Accumulating, sending and the producer id and transaction are methods of the mixins
    :class:`~kafka_source.write.batches.Accumulator`,
    :class:`~kafka_source.write.sending.Sender` and
    :class:`~kafka_source.write.transactions.Transactional`; they share the state that
    :meth:`__init__` sets up."""

    def __init__(self, client_config: Mapping[str, object], settings: ProducerSettings, *,
                 client=None, clock=None):
        """``client_config``: the connection settings that options parsing makes
        (:func:`kafka_source.config.client_config.client_config_from_options`). ``client``
        (tests) replaces the :class:`BrokerClient` made from it; ``clock`` (tests) the time.

        A transactional producer initialises its transactional id here (fencing older
        producers of it and aborting their open transaction), even if it never writes."""
        settings.check()
        self.settings = settings
        self._clock = clock or Clock()
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
        self._parts: dict[TopicPartition, Partition] = {}
        self._open: set[TopicPartition] = set()      # partitions with an open batch
        self._sendable: set[TopicPartition] = set()  # partitions with batches queued to send
        self._in_flight: dict[object, deque[Request]] = {}
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
        sizes = bare_sizes(np.asarray(record_sizes(values, keys, headers), dtype=np.int64))
        self._check_sizes(topic, parts, sizes)
        groups = group_by_partition(parts)
        if self._transactional_id is not None:
            self._add_to_transaction([(topic, p) for p, _ in groups])
        elif self._idempotent and self._producer_id < 0:
            self._init_producer_id()
        for partition, rows in groups:
            if isinstance(rows, slice):
                v, k, h = values[rows], slice_column(keys, rows), slice_column(headers, rows)
                s = sizes[rows]
            else:
                index = from_numpy(rows)
                v, k, h = values.take(index), take_column(keys, index), take_column(headers, index)
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
            raise produce_error((error.topic, error.partition)
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
        """``sizes``: see :func:`bare_sizes`."""
        row = int(np.argmax(sizes))
        size = int(sizes_at(sizes[row:row + 1], 0)[0]) + BATCH_OVERHEAD   # alone in a batch
        for limit, option in ((self.settings.max_request_size, "kafka.max.request.size"),
                              (self.settings.buffer_memory, "kafka.buffer.memory")):
            if size > limit:
                raise produce_error(
                    (topic, int(parts[row])),
                    f"A record for topic '{topic}' partition {int(parts[row])} is {size} bytes "
                    f"when encoded in a record batch, larger than option '{option}' ({limit} "
                    "bytes); none of the rows given with it were written. Raise the option "
                    "(and the topic's 'max.message.bytes' if needed) or write smaller records.")

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

    # --- failures --------------------------------------------------------------------------

    def _fail(self, tp: TopicPartition | None, why: str, *, fenced: bool = False
              ) -> ProduceError:
        """Record the producer's (first) failure; every later call raises it (a
        :class:`TransactionFencedError` if ``fenced``)."""
        if self._error is None:
            where = f" topic '{tp[0]}' partition {tp[1]}" if tp is not None else ""
            self._error = produce_error(tp, f"Could not write to Kafka{where}: {why}",
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

    def _first_metadata_backoff(self) -> float:
        return self.settings.retry_backoff_ms / 1000

    def _load_topic(self, topic: str) -> None:
        """Metadata of ``topic`` (retried while the cluster answers with transient errors, at
        most ``max_block_ms``); :class:`TopicError` if it does not exist."""
        deadline = self._clock.now() + self.settings.max_block_ms / 1000
        while True:
            try:
                info = self._client.metadata([topic]).get(topic)
                code = info.error_code if info is not None else \
                    Errors.UnknownTopicOrPartitionError.errno
                if code == NONE:
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
            if info is None or info.error_code != NONE:
                code = info.error_code if info is not None else \
                    Errors.UnknownTopicOrPartitionError.errno
                self._metadata_error = f"topic '{topic}': {error_for(code).__name__}"
                self._metadata_wanted = True
                continue
            self._update_topic(info)
            if any(p.leader < 0 for p in info.partitions.values()):
                self._metadata_wanted = True
