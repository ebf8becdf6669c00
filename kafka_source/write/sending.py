"""Sending: the producer's Produce requests in flight, their answers, and retries.

One Produce request per broker carries at most one batch per partition led by that broker
(Kafka rejects a request with two batches for one partition), up to ``max_request_size`` bytes.
Up to ``max_in_flight`` requests are in flight per broker: the next one is sent without waiting
for the previous response, as the Java client does. The I/O runs in the caller's thread, in
non-blocking polls at every ``Producer.send`` and in ``Producer.flush`` (``Producer._pump``;
see "Why no sender thread" in :mod:`kafka_source.write.producer`).

Retries keep each partition's order (idempotence)
    On a retriable error (leader moved, not enough replicas, timeout, a broken connection...)
    the batch goes back to its place in the partition's queue, metadata is refreshed, and once
    nothing of that partition is in flight any more its unacknowledged batches are resent in
    sequence order -- nothing is reordered and the broker drops what it already has
    (DUPLICATE_SEQUENCE_NUMBER, or success with the first offset, counts as written).
    OUT_OF_ORDER_SEQUENCE_NUMBER for a batch that is not the partition's oldest unacknowledged
    one just means an earlier batch failed first, so it is retried as well; for the oldest one,
    and UNKNOWN_PRODUCER_ID or INVALID_PRODUCER_EPOCH, the producer fails: resetting the
    sequences the way the Java client may would risk duplicates, and Spark retries the task.
    A batch not acknowledged ``delivery_timeout_ms`` after it was created fails the producer
    with an error naming topic, partition and the last error.

:class:`Sender` has these methods of :class:`~kafka_source.write.producer.Producer`, a mixin
for the reason given in :mod:`kafka_source.write.batches`.
"""

from __future__ import annotations

import logging
from collections import deque

import kafka.errors as Errors
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceRequest

from ..config.producer_settings import MAX_IN_FLIGHT_IDEMPOTENT
from ..wire.net.client import RetriableBrokerError, error_for
from .batches import Batch, Partition, TopicPartition
from .produce_errors import FATAL_NETWORK_ERRORS, FENCED, NONE, describe, fatal_produce_message

# Logged under the producer's name, so that logging set up for kafka_source.write.producer
# covers its retries too.
log = logging.getLogger("kafka_source.write.producer")

__all__ = ["Request", "Sender"]

# Protocol version caps (see the docstring of kafka_source.write.producer).
_PRODUCE_MIN_VERSION = 3
_PRODUCE_MAX_VERSION = 9
_API_VERSIONS_MAX_VERSION = 3

_DUPLICATE_SEQUENCE = Errors.DuplicateSequenceNumberError.errno
_OUT_OF_ORDER_SEQUENCE = Errors.OutOfOrderSequenceNumberError.errno


class Request:
    __slots__ = ("node", "batches", "future", "sent_at")

    def __init__(self, node, batches: dict, future, sent_at: float):
        self.node = node
        self.batches = batches
        self.future = future
        self.sent_at = sent_at


class Sender:
    """The :class:`~kafka_source.write.producer.Producer` methods that send the queued batches
    in Produce requests and handle the answers (see the module docstring).

    A mixin of the producer: they work on its state (``_parts``, ``_sendable``, ``_leaders``,
    ``_in_flight``, ``_unconfirmed``, ``_node_errors``, ``_buffered``, ...), ask for metadata
    by setting its ``_metadata_wanted``, and fail through its ``_fail``."""

    def _send_ready(self, now: float) -> None:
        if not self._sendable or self._error is not None:
            return
        settings = self.settings
        by_node: dict[object, list[Partition]] = {}
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

    def _send_request(self, node, parts: list[Partition], now: float) -> list[Partition]:
        """Send one Produce request to ``node`` with the next batch of each of ``parts`` that
        fits; returns the partitions that still have batches to send to it."""
        limit = self.settings.max_request_size
        batches: dict[TopicPartition, Batch] = {}
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
        self._in_flight[node].append(Request(node, batches, future, now))
        if self.settings.acks == 0:
            self._unconfirmed.setdefault(node, set()).update(batches)
        return rest

    def _may_send_another(self, st: Partition) -> bool:
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
        return st.in_flight < MAX_IN_FLIGHT_IDEMPOTENT

    def _node_ready(self, node) -> bool:
        if self._client.node_ready(node):
            self._node_errors.pop(node, None)
            return True
        self._node_errors.setdefault(node, f"broker {node} is not reachable")
        return False

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

    def _complete(self, request: Request, now: float) -> None:
        future = request.future
        if future.failed():
            exc = future.exception
            if isinstance(exc, FATAL_NETWORK_ERRORS):
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

    def _partition_result(self, batch: Batch, answer, now: float) -> None:
        code = answer.error_code
        if code == NONE or code == _DUPLICATE_SEQUENCE:
            self._acknowledged(batch)
            return
        error = error_for(code)
        what = describe(error, getattr(answer, "error_message", None),
                        getattr(answer, "record_errors", None))
        st = self._parts[batch.tp]
        if code == _OUT_OF_ORDER_SEQUENCE and self._idempotent and st.unacked \
                and st.unacked[0] is not batch:
            # An earlier batch of the partition failed first; this one is resent after it.
            self._retry(batch, what, now, refresh=False)
        elif getattr(error, "retriable", False):
            self._retry(batch, what, now, refresh=getattr(error, "invalid_metadata", False))
        else:
            self._fail(batch.tp, fatal_produce_message(error, what, batch, self.settings,
                                                       self._transactional_id),
                       fenced=error in FENCED)

    def _acknowledged(self, batch: Batch) -> None:
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

    def _retry(self, batch: Batch, why: str, now: float, *, refresh: bool) -> None:
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
