"""Executor side: the fetch loop that reads a task's offset ranges from their partition leaders.

A task holds one or more offset ranges (:mod:`kafka_source.read.planning` packs small ones
together). The ranges are grouped by partition leader and each leader gets one Fetch request for
all of its partitions, again and again, until every range is read, over a dedicated connection
with a fetch session (:mod:`kafka_source.wire.net.fetch_connection`). The returned record batches are
decoded and handed on: as Arrow batches straight from the bytes
(:func:`kafka_source.wire.format.fast_decode.decode_to_arrow`, the executors' path), or as Python
records (:func:`kafka_source.wire.format.records.decode_records`, the reference decoder it is tested
against). Records of one partition come out in offset order; partitions interleave.

Fetch and decode overlap: as soon as a response is in, the next request is sent, at the
positions its batch headers say the decoder will reach (:func:`kafka_source.wire.format.records.scan_batches`),
and only then is the response decoded. So the broker reads and sends the next chunk while this
one is decoded. A partition whose decoded position differs from that (it cannot for well-formed
data) or that reported an error ignores its part of the next response and is fetched again from
its real position. The request for the last stretch of a range asks for about the bytes the
range still needs (learned per partition from earlier responses), not a full
``kafka.max.partition.fetch.bytes``. The first request of a range asks for 1 MiB of each
partition and every next one for twice as much, up to that limit: Spark's JVM gets the first
records after a small response and works on them while the larger ones arrive and are decoded,
instead of waiting for a full response and its decoding.

Along the way, per partition, it:

* follows leader changes and retriable errors (a broker out of reach included) with bounded
  exponential backoff; each request carries the partition's leader epoch from the newest
  metadata (KIP-320), so a broker that is no longer (or not yet) the leader of that epoch
  answers FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH rather than records of its own log, for at most ``kafkaConsumer.pollTimeoutMs`` without progress (a
  partition that backs off does not hold up the others);
* treats offsets that vanished (OFFSET_OUT_OF_RANGE below the log start) as data loss: fail, or
  with ``failOnDataLoss=false`` warn and continue from the log start;
* finishes a range whose last offsets hold no data records (transaction markers, compaction):
  the decoder's ``next_offset`` moves past them;
* treats OFFSET_OUT_OF_RANGE at an offset the log holds (as its leader lists it now) as a
  leader change, not as loss: the leader is looked up again;
* treats a record batch of a newer leader epoch than the range was planned in
  (:attr:`OffsetRange.epoch <kafka_source.read.offsets.OffsetRange>`), below the range's end, as
  a log truncated and written again after an unclean leader election (:func:`newer_epoch`):
  data loss -- fail, or with ``failOnDataLoss=false`` warn and end the range there, so that
  records the new leader wrote are never passed off as the planned ones (a stream reads them
  in its next micro-batch: :mod:`kafka_source.read.truncation`);
* before offsets that have not appeared in ``kafkaConsumer.pollTimeoutMs`` are called missing,
  looks the leader up again and fetches once more (the broker taken for the leader may be one
  an election left behind);
* waits at most ``kafkaConsumer.pollTimeoutMs`` without progress, for offsets that are not in
  the log yet or for a broker that does not answer;
* fails at once on a response larger than its connection accepts (a record batch above every
  limit: :class:`~kafka_source.wire.net.fetch_connection.FetchResponseTooLargeError` names the
  partition and the options to raise), since fetching it again would only bring it again.
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping

import kafka.errors as Errors
import pyarrow as pa

from ..errors import (BrokerUnavailableError, KafkaSourceError, TopicError,
                      TopicNotFoundError)
from ..wire.net.client import (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, BrokerClient,
                           RetriableBrokerError, error_for)
from ..wire.format.fast_decode import decode_to_arrow
from ..wire.net.fetch_protocol import FetchPartitionRequest, FetchResult, PartitionData
from ..wire.net.fetch_session import FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH
from ..wire.format.records import Record, decode_records, scan_batches
from .offsets import OffsetRange, on_data_loss

log = logging.getLogger(__name__)

# Failures the loop retries within kafkaConsumer.pollTimeoutMs. BrokerUnavailableError: no
# broker reachable at all (a fresh client cannot bootstrap while the broker restarts) -- as
# transient here as a lost leader. TLS and SASL failures (BrokerSecurityError) are not retried.
_TRANSIENT = (RetriableBrokerError, BrokerUnavailableError)

_MAX_BACKOFF_MS = 5_000
_IDLE_SLEEP_S = 0.1              # a round without progress anywhere: wait this long at most
_MIN_REQUEST_BYTES = 64 << 10    # never ask for less than this for a partition
_SESSION_ERRORS = (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH)
_RECHECK_MS = 2_000              # one more look, at a freshly looked-up leader, before loss
# The first request of a range asks for this much of the partition, each next one twice as
# much, up to kafka.max.partition.fetch.bytes: the first records reach Spark after a small
# response, and Spark's JVM works on them while the larger ones come in and are decoded.
_FIRST_REQUEST_BYTES = 1 << 20


# Arrow batches smaller than this are put together before they go to Spark (``coalesce``).
_COALESCE_BYTES = 1 << 20
# What the fetch loop yields, for read_arrow only, before it waits for the network: what
# coalesce holds goes to Spark then, not after the wait.
_WAITING: list = []


def coalesce(batches: Iterable[pa.RecordBatch],
             max_bytes: int | None = None) -> Iterator[pa.RecordBatch]:
    """The same rows in the same order, with runs of small batches joined into one; ``None``
    in ``batches`` hands on what is held (the fetch loop is about to wait for the network).

    A task over many partitions that each got a few records (a trickle over hundreds of
    partitions) decodes one small batch per partition and response. Spark pays for every
    batch it receives from a Python worker (an Arrow IPC message, and a conversion per batch
    on its side), so a micro-batch of 200 records over 100 partitions cost about 230 ms in
    ``addBatch`` as 100 batches. Small batches are held until they add up to ``max_bytes``
    (or the task's records end) and go as one; a batch of ``max_bytes`` or more goes as it is,
    after what was held. Nothing is held beyond ``max_bytes`` (default ``_COALESCE_BYTES``):
    a read's large batches (a response's worth of a partition) go to Spark as soon as they
    are decoded, as before."""
    if max_bytes is None:
        max_bytes = _COALESCE_BYTES
    held: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        if batch is None:
            if held:
                yield _joined(held)
                held, size = [], 0
            continue
        if batch.nbytes >= max_bytes:
            if held:
                yield _joined(held)
                held, size = [], 0
            yield batch
            continue
        held.append(batch)
        size += batch.nbytes
        if size >= max_bytes:
            yield _joined(held)
            held, size = [], 0
    if held:
        yield _joined(held)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    if hasattr(pa, "concat_batches"):            # pyarrow 19+
        return pa.concat_batches(batches)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


@dataclass(frozen=True)
class FetchSettings:
    read_committed: bool
    check_crcs: bool
    partition_max_bytes: int
    max_bytes: int
    max_wait_ms: int
    min_bytes: int
    retry_backoff_ms: int
    poll_timeout_ms: int
    fail_on_data_loss: bool
    # kafka.metadata.max.age.ms: leaders an earlier task of this worker looked up are used
    # for at most this long (BrokerClient.cached_leaders)
    leader_max_age_ms: int = 300_000

    @classmethod
    def from_config(cls, config: Mapping[str, object], *, poll_timeout_ms: int,
                    fail_on_data_loss: bool) -> "FetchSettings":
        return cls(
            read_committed=config["isolation_level"] == "read_committed",
            check_crcs=bool(config["check_crcs"]),
            partition_max_bytes=int(config["max_partition_fetch_bytes"]),
            max_bytes=int(config["fetch_max_bytes"]),
            max_wait_ms=int(config["fetch_max_wait_ms"]),
            min_bytes=int(config["fetch_min_bytes"]),
            retry_backoff_ms=int(config["retry_backoff_ms"]),
            poll_timeout_ms=poll_timeout_ms,
            fail_on_data_loss=fail_on_data_loss,
            leader_max_age_ms=int(config.get("metadata_max_age_ms", 300_000)),
        )


class _Deadline:
    """How long a partition may go without progress before we give up on it."""

    def __init__(self, ms: int):
        self.ms = ms
        self.reset()

    def reset(self) -> None:
        self.at = time.monotonic() + self.ms / 1000

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.at


@dataclass(eq=False)
class _Partition:
    """The fetch state of one range of a task."""

    r: OffsetRange
    position: int
    max_bytes: int
    deadline: _Deadline
    failures: int = 0
    retry_at: float = 0.0          # backing off until then
    available: int | None = None   # the log end (LSO for read_committed) last reported
    use_hint: bool = True          # size the last request from the learned record sizes
    starved: bool = False          # data exists but the last response brought none
    rechecked: bool = False        # the leader was looked up again before declaring loss
    progressed: bool = field(default=False, repr=False)
    # the byte limit of the next request, while below max_bytes
    ramp: int = field(default_factory=lambda: _FIRST_REQUEST_BYTES)

    @property
    def tp(self) -> tuple[str, int]:
        return self.r.topic_partition


Decode = Callable[[memoryview, int, list, OffsetRange], tuple[list, int, bool]]


class RangeFetcher:
    """Reads offset ranges through one client and its fetch connections."""

    def __init__(self, client: BrokerClient, settings: FetchSettings, connections=None):
        self.client = client
        self.settings = settings
        self.connections = connections if connections is not None \
            else client.fetch_connections()
        self._leaders: dict[tuple[str, int], object] = {}

    # --- the two decoders ------------------------------------------------------------------

    def read(self, ranges: OffsetRange | Iterable[OffsetRange]) -> Iterator[list[Record]]:
        """Yield lists of records of ``ranges`` (each range's in offset order); every offset of
        every range is accounted for. Decodes with the reference decoder
        (:mod:`kafka_source.wire.format.records`)."""
        s = self.settings

        def decode(data, position, aborted, r):
            result = decode_records(data, start_offset=position, end_offset=r.end,
                                    read_committed=s.read_committed,
                                    aborted_transactions=aborted, check_crcs=s.check_crcs)
            return result.records, result.next_offset, result.truncated

        return self._read(_as_list(ranges), decode)

    def read_arrow(self, ranges: OffsetRange | Iterable[OffsetRange],
                   include_headers: bool) -> Iterator[pa.RecordBatch]:
        """Yield Arrow batches of the ranges' records (Spark's schema), decoded without a Python
        object per record (:mod:`kafka_source.wire.format.fast_decode`); otherwise exactly :meth:`read`."""
        s = self.settings

        def decode(data, position, aborted, r):
            return decode_to_arrow(data, start_offset=position, end_offset=r.end,
                                   read_committed=s.read_committed,
                                   aborted_transactions=aborted, check_crcs=s.check_crcs,
                                   topic=r.topic, partition=r.partition,
                                   include_headers=include_headers)

        yield from coalesce(batch for batches in self._read(_as_list(ranges), decode,
                                                            mark_waits=True)
                            for batch in ((None,) if batches is _WAITING else batches))

    # --- the loop --------------------------------------------------------------------------

    def _read(self, ranges: list[OffsetRange], decode: Decode,
              mark_waits: bool = False) -> Iterator[list]:
        """A Fetch request carries a partition once: ranges of the same partition (which the
        planner never puts in one task unless they are adjacent, and then merges) are read one
        after the other."""
        try:
            for wave in _waves(ranges):
                yield from self._read_wave(wave, decode, mark_waits)
        finally:
            # A response that will never be read (an error, or Spark stopped early) makes its
            # connection unusable: close it rather than hand it to the next task.
            self.connections.discard_in_flight()

    def _read_wave(self, ranges: list[OffsetRange], decode: Decode,
                   mark_waits: bool) -> Iterator[list]:
        """``mark_waits``: yield ``_WAITING`` before each wait for the network (read_arrow)."""
        s = self.settings
        parts = {r.topic_partition: _Partition(r, r.start, s.partition_max_bytes,
                                               _Deadline(s.poll_timeout_ms))
                 for r in ranges}
        while parts:
            for st in parts.values():
                st.progressed = False
            by_leader = self._by_leader(parts)
            for leader, group in by_leader.items():
                try:
                    conn = self.connections.get(leader)
                    if not conn.in_flight:
                        self._send(conn, group)
                        if not conn.in_flight:
                            continue          # nothing of this group is left to fetch
                    if mark_waits:
                        yield _WAITING
                    result = conn.receive()
                    yield from self._handle(conn, leader, result, parts, decode)
                except _TRANSIENT as exc:
                    self.connections.discard(leader)
                    self._failed([p for p in group if p.tp in parts], f"{exc}")
            if parts and not any(st.progressed for st in parts.values()):
                if mark_waits:
                    yield _WAITING
                self._idle(parts)

    def _by_leader(self, parts: dict) -> dict[object, list[_Partition]]:
        """The partitions that may be fetched now, by leader (looking up unknown leaders)."""
        now = time.monotonic()
        ready = [st for st in parts.values() if st.retry_at <= now]
        missing = [st for st in ready if st.tp not in self._leaders]
        if missing:
            # Leaders an earlier task of this worker looked up (until one proves wrong).
            known = self.client.cached_leaders([st.tp for st in missing],
                                               self.settings.leader_max_age_ms)
            self._leaders.update(known)
            missing = [st for st in missing if st.tp not in known]
        if missing:
            try:
                self._leaders.update(self.client.leaders([st.tp for st in missing]))
            except _TRANSIENT + (TopicNotFoundError,):
                # One partition without a leader must not hold up the others: one by one.
                for st in missing:
                    try:
                        self._leaders.update(self.client.leaders([st.tp]))
                    except _TRANSIENT as exc:
                        self._failed([st], str(exc))
                    except TopicNotFoundError as exc:
                        self._vanished(st, parts, str(exc))
        groups: dict[object, list[_Partition]] = {}
        for st in ready:
            if st.tp not in parts:
                continue
            leader = self._leaders.get(st.tp)
            if leader is not None and st.retry_at <= now:
                groups.setdefault(leader, []).append(st)
        return groups

    def _send(self, conn, group: Iterable[_Partition], positions: Mapping | None = None) -> None:
        """One Fetch request for ``group`` (at ``positions``, default: their positions)."""
        s = self.settings
        wanted = {}
        # Partitions that got nothing although data is there go first: a broker returns an
        # oversized first batch only for the first partition of a response.
        for st in sorted(group, key=lambda p: not p.starved):
            position = st.position if positions is None else positions.get(st.tp, st.position)
            if position >= st.r.end:
                continue
            wanted[st.tp] = FetchPartitionRequest(position, self._request_bytes(st, position),
                                                  self.client.view.epoch(st.tp))
            st.ramp = min(2 * st.ramp, st.max_bytes)
        if wanted:
            conn.send(wanted, max_wait_ms=s.max_wait_ms, min_bytes=s.min_bytes,
                      max_bytes=max(s.max_bytes, max(p.max_bytes for p in wanted.values())),
                      read_committed=s.read_committed)

    def _request_bytes(self, st: _Partition, position: int) -> int:
        """The partition byte limit: ``kafka.max.partition.fetch.bytes`` (grown when a batch did
        not fit), less while the range's requests ramp up to it, or less for the last stretch
        of a range, from the sizes seen so far."""
        limit = min(st.max_bytes, st.ramp)
        hint = self.connections.size_hints.get(st.tp) if st.use_hint else None
        if hint is None:
            return limit
        per_offset, per_batch = hint
        need = int((st.r.end - position) * per_offset * 1.1 + 2 * per_batch) + 4096
        return min(limit, max(need, _MIN_REQUEST_BYTES))

    def _handle(self, conn, leader, result: FetchResult, parts: dict,
                decode: Decode) -> Iterator[list]:
        """Decode one response; send the next request to this leader first if all is well."""
        s = self.settings
        if result.error_code:
            err = error_for(result.error_code)
            if result.error_code in _SESSION_ERRORS:
                log.info("Fetch session with broker %s ended (%s); starting a new one", leader,
                         err.__name__)
                return
            raise RetriableBrokerError(f"Fetch from broker {leader} failed: {err.__name__}")
        current: list[tuple[_Partition, PartitionData]] = []
        for tp, data in result.partitions.items():
            st = parts.get(tp)
            asked = result.requested.get(tp)
            # Not asked for, finished meanwhile, or fetched at a guessed position that proved
            # wrong: ignore (the partition is fetched again from where it really is).
            if st is not None and asked is not None and asked.offset == st.position:
                current.append((st, data))
        scans = {}
        for st, data in current:
            if data.error_code == 0:
                scans[st.tp] = scan_batches(data.records, start_offset=st.position,
                                            end_offset=st.r.end)
        send_error = None
        if len(scans) == len(current) and not conn.expired:
            group = [st for st in parts.values() if self._leaders.get(st.tp) == leader
                     and st.retry_at <= time.monotonic()]
            try:
                self._send(conn, group, {tp: sc.next_offset for tp, sc in scans.items()})
            except RetriableBrokerError as exc:
                send_error = exc   # decode what is here first; the loop reconnects after
        for st, data in current:
            if data.error_code:
                self._partition_error(st, data.error_code, parts)
                continue
            st.failures = 0
            aborted = data.aborted if s.read_committed else []
            diverged = newer_epoch(data.records, start_offset=st.position, end_offset=st.r.end,
                                   epoch=st.r.epoch)
            r = st.r if diverged is None else OffsetRange(
                st.r.topic, st.r.partition, st.r.start, diverged[0], st.r.epoch)
            items, next_offset, truncated = decode(data.records, st.position, aborted, r)
            if items:
                yield items
            if diverged is not None:
                self._diverged(st, *diverged, parts)
                continue
            self._after_decode(st, data, scans[st.tp], next_offset, truncated, parts)
        if send_error is not None:
            raise send_error

    def _after_decode(self, st: _Partition, data: PartitionData, scan, next_offset: int,
                      truncated: bool, parts: dict) -> None:
        s = self.settings
        available = data.high_watermark
        if s.read_committed and data.last_stable_offset is not None \
                and data.last_stable_offset >= 0:
            available = data.last_stable_offset
        st.available = available
        st.starved = False
        if next_offset > st.position:
            if scan.batches and scan.next_offset > st.position:
                self.connections.size_hints[st.tp] = (
                    scan.nbytes / (scan.next_offset - st.position), scan.nbytes / scan.batches)
            st.position = next_offset
            st.progressed = True
            st.deadline.reset()
            if st.position >= st.r.end:
                del parts[st.tp]
            return
        if truncated or st.position < available:
            # Data is there but none came: a batch larger than the byte limit (brokers return an
            # oversized batch only as the first of a response), or the response was full. A
            # grown limit also raises the largest response its connection accepts.
            st.starved = True
            if st.ramp < st.max_bytes:
                st.ramp = st.max_bytes
            elif st.use_hint:
                st.use_hint = False
            else:
                st.max_bytes = min(2 * st.max_bytes, 1 << 30)
                log.info("%s-%d: no record batch at %d fits in %d bytes; fetching with %d",
                         st.r.topic, st.r.partition, st.position, st.max_bytes // 2,
                         st.max_bytes)

    # --- errors and waiting ----------------------------------------------------------------

    def _partition_error(self, st: _Partition, code: int, parts: dict) -> None:
        """React to a partition-level fetch error."""
        err = error_for(code)
        r = st.r
        if err is Errors.OffsetOutOfRangeError:
            outcome = self._out_of_range(r, st.position)
            if outcome is None:
                # The position is inside the log as its leader lists it now: the broker that
                # answered was not (or no longer) the leader with that log. Look it up again.
                self._failed([st], f"OFFSET_OUT_OF_RANGE at offset {st.position}, which the "
                                   "partition's log holds (a leader change?)")
                return
            position, finished = outcome
            st.position = position
            st.progressed = True
            st.deadline.reset()
            if finished:
                del parts[st.tp]
            return
        if getattr(err, "retriable", False) or err in (Errors.NotLeaderForPartitionError,
                                                       Errors.UnknownTopicOrPartitionError):
            self._failed([st], err.__name__)
            return
        raise TopicError(f"Fetching {r.topic}-{r.partition} at offset {st.position} failed: "
                         f"{err.__name__} ({getattr(err, 'description', '')}).")

    def _forget_leader(self, st: _Partition) -> None:
        """Look ``st``'s leader up before it is fetched again (not from the worker's cache)."""
        self._leaders.pop(st.tp, None)
        self.client.forget_leaders([st.r.topic])

    def _failed(self, group: list[_Partition], why: str) -> None:
        """A retriable failure for these partitions: look their leader up again and back off;
        give up on a partition that has made no progress for ``pollTimeoutMs``."""
        s = self.settings
        for st in group:
            self._forget_leader(st)
            st.failures += 1
            if st.deadline.passed:
                raise KafkaSourceError(
                    f"Could not fetch {st.r.topic}-{st.r.partition} from offset {st.position}: "
                    f"{why}; gave up after {s.poll_timeout_ms} ms (option "
                    "'kafkaConsumer.pollTimeoutMs').")
            delay_ms = min(s.retry_backoff_ms * (2 ** (st.failures - 1)), _MAX_BACKOFF_MS)
            st.retry_at = time.monotonic() + delay_ms / 1000
            log.warning("Retrying fetch of %s-%d in %d ms: %s", st.r.topic, st.r.partition,
                        delay_ms, why)

    def _diverged(self, st: _Partition, offset: int, epoch: int, parts: dict) -> None:
        """The log holds a record of a newer leader epoch than the range was planned in, at
        ``offset`` below the range's end: it was truncated and written again after an unclean
        leader election (:func:`newer_epoch`). The range ends there, or the task fails."""
        r = st.r
        message = (f"{r.topic}-{r.partition}: from offset {offset} on, the log holds records of "
                   f"leader epoch {epoch}, newer than epoch {r.epoch} in which offsets "
                   f"[{r.start}, {r.end}) were planned: the log was truncated after an unclean "
                   f"leader election (a replica that was not in sync became leader), and offsets "
                   f"{offset} to {r.end - 1} now hold other records than when they were "
                   "planned.")
        on_data_loss(self.settings.fail_on_data_loss, message,
                     remedy=f"Set the option 'failOnDataLoss' to 'false' to end the range at "
                            f"offset {offset} instead (a stream goes on from where the log "
                            "diverged at its next micro-batch).",
                     action=f"Ending the range at offset {offset}", logger=log)
        del parts[st.tp]

    def _vanished(self, st: _Partition, parts: dict, why: str) -> None:
        """The partition of a planned range is gone from the cluster (its topic was deleted
        after the read was planned): data loss, as Spark treats a partition that disappears."""
        r = st.r
        message = (f"{r.topic}-{r.partition} no longer exists ({why}); offsets {st.position} "
                   f"to {r.end - 1} of the range [{r.start}, {r.end}) cannot be read.")
        on_data_loss(self.settings.fail_on_data_loss, message,
                     remedy="Set the option 'failOnDataLoss' to 'false' to skip them.",
                     action="Skipping them", logger=log)
        del parts[st.tp]

    def _idle(self, parts: dict) -> None:
        """Nothing progressed this round: end or fail partitions that waited too long for
        offsets the log does not have, then wait a little (bounded by the nearest deadline)."""
        s = self.settings
        for st in list(parts.values()):
            if st.available is None or st.position < st.available or not st.deadline.passed:
                continue
            if not st.rechecked:
                # The log end came from the broker taken for the leader; after an election that
                # broker may be behind the new leader. Ask for the leader again and fetch once
                # more, for a short while, before the offsets are called missing.
                st.rechecked = True
                self._forget_leader(st)
                st.deadline.at = time.monotonic() + min(s.poll_timeout_ms, _RECHECK_MS) / 1000
                continue
            r = st.r
            message = (f"{r.topic}-{r.partition}: offsets {st.position} to {r.end - 1} of the "
                       f"range [{r.start}, {r.end}) are not in Kafka; the log ends at "
                       f"{st.available}" + (" (last stable offset)" if s.read_committed else "")
                       + f". Waited {s.poll_timeout_ms} ms (option "
                       "'kafkaConsumer.pollTimeoutMs').")
            on_data_loss(s.fail_on_data_loss, message,
                         remedy="Set 'failOnDataLoss' to 'false' to end the range early "
                                "instead.",
                         action="Ending the range early", logger=log)
            del parts[st.tp]
        for st in parts.values():
            if st.starved and st.deadline.passed:
                raise KafkaSourceError(
                    f"{st.r.topic}-{st.r.partition}: no records came from offset {st.position} "
                    f"for {s.poll_timeout_ms} ms although the log holds offsets up to "
                    f"{st.available} (option 'kafkaConsumer.pollTimeoutMs').")
        if not parts:
            return
        now = time.monotonic()
        until = min(min(st.deadline.at for st in parts.values()), now + _IDLE_SLEEP_S)
        waiting = [st.retry_at for st in parts.values() if st.retry_at > now]
        if len(waiting) == len(parts):
            until = min(until, min(waiting))   # everyone backs off: until the first may retry
        time.sleep(max(0.0, until - now))

    def _out_of_range(self, r: OffsetRange, position: int) -> tuple[int, bool] | None:
        """Where to go on after OFFSET_OUT_OF_RANGE at ``position``: (position, finished) after
        data loss below the log start or past its end; None when the log, as listed now, holds
        ``position`` (the answer came from a broker whose log was not the leader's)."""
        tp = r.topic_partition
        bounds = self.client.list_offsets({tp: EARLIEST_TIMESTAMP},
                                          read_committed=self.settings.read_committed)
        log_start = bounds[tp][0]
        if position < log_start:
            message = (f"Offsets {position} to {min(log_start, r.end) - 1} of {r.topic}-"
                       f"{r.partition} are no longer in Kafka (the log now starts at {log_start}):"
                       " they were deleted by retention or compaction while the query ran.")
            on_data_loss(self.settings.fail_on_data_loss, message,
                         remedy="Set the option 'failOnDataLoss' to 'false' to read what is "
                                "still available instead.",
                         action="Skipping them", logger=log)
            return log_start, log_start >= r.end
        latest = self.client.list_offsets({tp: LATEST_TIMESTAMP},
                                          read_committed=self.settings.read_committed)[tp][0]
        if position <= latest:
            return None
        message = (f"Offset {position} of {r.topic}-{r.partition} is beyond the end of the log "
                   f"({latest}): the log was truncated or the topic was recreated.")
        on_data_loss(self.settings.fail_on_data_loss, message,
                     remedy="Set the option 'failOnDataLoss' to 'false' to skip the missing "
                            "offsets instead.",
                     action="Ending the range", logger=log)
        return position, True


_BATCH_HEAD = struct.Struct(">qii")        # base offset, length, partition leader epoch
_LAST_DELTA = struct.Struct(">i")
_V2_HEAD_BYTES = 27                        # through lastOffsetDelta


def newer_epoch(records, *, start_offset: int, end_offset: int,
                epoch: int) -> tuple[int, int] | None:
    """The first offset in ``[start_offset, end_offset)`` of a whole record batch (magic 2)
    in ``records`` whose partition leader epoch is newer than ``epoch``, and that epoch; None if
    there is none or ``epoch`` is unknown (-1).

    A range's epoch is the leader's when its end was listed: every record below the end was
    written by that leader or an older one. A newer epoch there is a new leader's record at an
    offset it had to write again -- its log was truncated below the range's end (an unclean
    leader election). Only batch headers are read."""
    if epoch < 0:
        return None
    view = records if isinstance(records, memoryview) else memoryview(records)
    n = len(view)
    pos = 0
    while n - pos >= _V2_HEAD_BYTES:
        base, length, batch_epoch = _BATCH_HEAD.unpack_from(view, pos)
        end = pos + 12 + length
        if length <= 0 or end > n or base >= end_offset:
            break
        if view[pos + 16] == 2 and batch_epoch > epoch:
            last = base + _LAST_DELTA.unpack_from(view, pos + 23)[0]
            if last >= start_offset:
                return max(base, start_offset), batch_epoch
        pos = end
    return None


def _as_list(ranges) -> list[OffsetRange]:
    return [ranges] if isinstance(ranges, OffsetRange) else list(ranges)


def _waves(ranges: list[OffsetRange]) -> Iterator[list[OffsetRange]]:
    """Non-empty ranges in groups that hold each partition at most once, adjacent ranges of a
    partition merged."""
    merged: list[OffsetRange] = []
    for r in ranges:
        if r.size <= 0:
            continue
        last = merged[-1] if merged else None
        if last is not None and last.topic_partition == r.topic_partition and last.end == r.start:
            merged[-1] = OffsetRange(r.topic, r.partition, last.start, r.end, r.epoch)
        else:
            merged.append(r)
    while merged:
        wave, rest, seen = [], [], set()
        for r in merged:
            (rest if r.topic_partition in seen else wave).append(r)
            seen.add(r.topic_partition)
        yield wave
        merged = rest
