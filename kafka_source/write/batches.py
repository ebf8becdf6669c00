"""Accumulating: the producer's per-partition batches, from Arrow rows to encoded record batches.

:meth:`Producer.send <kafka_source.write.producer.Producer.send>` gets rows of one topic with
their partitions (chosen by the writer). It groups them by partition -- stably, so each
partition keeps the rows' order -- and appends them to that partition's open batch as Arrow
slices (no copy). A batch is cut when the next row would make it larger than ``batch_size``
(sizes from :func:`~kafka_source.wire.format.encode.record_sizes`, the exact encoded size of each
record, uncompressed); a row larger than that gets a batch of its own. A cut batch is encoded
at once (:func:`~kafka_source.wire.format.encode.encode_record_batch`, with the producer id, epoch and
base sequence when idempotent) and the bytes are kept until the broker acknowledged them: a
retry resends exactly the same bytes, which is what lets the broker recognise a duplicate. An
open batch is cut when it is ``linger_ms`` old, when ``Producer.flush`` is called, and when the
memory bound is reached.

Memory
    Bytes of open batches (estimated from the record sizes), plus encoded batches not yet
    acknowledged, stay at most ``buffer_memory``; ``Producer.send`` blocks -- driving the
    network -- while more would be needed, at most ``max_block_ms`` without progress.

A record's encoded size depends on its place in its batch (its length and offset delta are
varints), so sizes are computed once per row without those (:func:`bare_sizes`) and placed at
their offsets as rows are appended (:func:`sizes_at`).

Here are each partition's state (:class:`Partition`: its open batch, the encoded batches
queued to send and those not yet acknowledged, its next sequence number), the Arrow and size
helpers, and :class:`Accumulator`, the producer's methods that fill the batches. Those are a
mixin of :class:`~kafka_source.write.producer.Producer` (as are the sending and transaction
methods, in :mod:`kafka_source.write.sending` and :mod:`kafka_source.write.transactions`), not
an object of their own, because accumulating and sending share that state at every step -- a
full buffer makes :meth:`Accumulator._reserve` drive the network until acknowledgements free
memory -- and the producer's logic is kept as it was, not rewritten around a new interface.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pyarrow as pa

from ..wire.format.encode import BATCH_OVERHEAD, encode_record_batch
from .produce_errors import produce_error

__all__ = ["Accumulator", "Batch", "Partition", "TopicPartition", "bare_sizes",
           "group_by_partition", "sizes_at", "slice_column", "take_column"]

TopicPartition = tuple[str, int]

_SEQUENCE_MODULUS = 1 << 31      # sequence numbers wrap after Integer.MAX_VALUE, as in Kafka


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


class Batch:
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


class Partition:
    __slots__ = ("tp", "open", "queue", "unacked", "in_flight", "next_sequence", "next_order",
                 "acked", "confirmed", "retrying", "retry_at")

    def __init__(self, tp):
        self.tp = tp
        self.open: _OpenBatch | None = None
        self.queue: list[Batch] = []         # to send, in order (a retried batch goes back in)
        self.unacked: deque[Batch] = deque()   # every encoded, unacknowledged batch, in order
        self.in_flight = 0
        self.next_sequence = 0
        self.next_order = 0
        self.acked = 0
        self.confirmed = False               # a batch of it was acknowledged
        # After a retriable failure: send nothing until nothing is in flight and the backoff has
        # passed, then resend from the oldest unacknowledged batch (keeps the order).
        self.retrying = False
        self.retry_at = 0.0


class Accumulator:
    """The :class:`~kafka_source.write.producer.Producer` methods that append rows to the open
    batches and cut them into encoded record batches (see the module docstring).

    A mixin of the producer: they work on its state (``_parts``, ``_open``, ``_sendable``,
    ``_buffered``, ``_unacked``, ``_force_ready``, its producer id and epoch), and while memory
    is short drive the network with its ``_pump``."""

    def _partition(self, tp: TopicPartition) -> Partition:
        st = self._parts.get(tp)
        if st is None:
            st = self._parts[tp] = Partition(tp)
        return st

    def _append(self, tp, values, keys, headers, sizes: np.ndarray) -> None:
        """Append rows of one partition, cutting batches at the batch size limit. ``sizes``:
        see :func:`bare_sizes`."""
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
            cumulative = np.cumsum(sizes_at(sizes[pos:pos + window], first))
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
                    exact = int(sizes_at(sizes[pos:pos + take], 0).sum())
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
                        raise produce_error(tp, (
                            f"Waited {self.settings.max_block_ms} ms (option 'kafka.max.block.ms')"
                            f" for buffer space: {self._buffered} bytes (option "
                            f"'kafka.buffer.memory' = {limit}) are not yet acknowledged by "
                            "Kafka" + (f", the oldest for topic '{tp[0]}' partition {tp[1]}"
                                       f"{self._last_error_of(tp)}" if tp else "") + "."))
                    self._pump(min(self._wait_ms(), (deadline - now) * 1000))
            finally:
                self._force_ready = False
        self._buffered += nbytes

    def _cut(self, st: Partition) -> None:
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
        batch = Batch(st.tp, st.next_order, data, ob.count, sequence, ob.created)
        st.next_order += 1
        self._buffered += len(data) - ob.nbytes
        st.queue.append(batch)
        st.unacked.append(batch)
        self._unacked += 1
        self._sendable.add(st.tp)

    def _linger(self, now: float) -> None:
        if not self._open:
            return
        linger = self.settings.linger_ms / 1000
        for tp in list(self._open):
            st = self._parts[tp]
            if self._force_ready or now - st.open.created >= linger:
                self._cut(st)


# --------------------------------------------------------------------------------------------
# Arrow and size helpers
# --------------------------------------------------------------------------------------------

def group_by_partition(parts: np.ndarray) -> list[tuple[int, slice | np.ndarray]]:
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


def bare_sizes(sizes: np.ndarray) -> np.ndarray:
    """From record ``i``'s encoded size at offset delta ``i`` (:func:`record_sizes`), its size
    without the length and offset delta varints -- what does not depend on where the record
    ends up in a batch (:func:`sizes_at` adds them back)."""
    body = sizes - 1                      # the record without its length varint ...
    for width in (2, 3, 4, 5):            # ... whose size is the one width that fits
        candidate = sizes - width
        body = np.where(_varint_sizes(candidate) == width, candidate, body)
    return body - _varint_sizes(np.arange(len(sizes), dtype=np.int64))


def sizes_at(bare: np.ndarray, first: int) -> np.ndarray:
    """Encoded sizes of records of ``bare`` sizes (:func:`bare_sizes`) placed at offset deltas
    ``first``, ``first + 1``, ..."""
    body = bare + _varint_sizes(np.arange(first, first + len(bare), dtype=np.int64))
    return body + _varint_sizes(body)


def slice_column(column: pa.Array | None, rows: slice) -> pa.Array | None:
    return None if column is None else column[rows]


def take_column(column: pa.Array | None, index: pa.Array) -> pa.Array | None:
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
