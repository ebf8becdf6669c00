"""Executor side: the fetch loop that reads one offset range from its partition leader.

For each range it finds the leader, sends Fetch requests from the current position, decodes the
returned record batches and hands the records on, until the position reaches the range's end:
as Arrow batches straight from the bytes (:func:`kafka_source.wire.fast_decode.decode_to_arrow`, the
executors' path), or as Python records (:func:`kafka_source.wire.records.decode_records`, the
reference decoder it is tested against). Along the way it:

* follows leader changes and retriable errors (a broker out of reach included) with bounded
  exponential backoff, for at most ``kafkaConsumer.pollTimeoutMs`` without progress;
* treats offsets that vanished (OFFSET_OUT_OF_RANGE below the log start) as data loss: fail, or
  with ``failOnDataLoss=false`` warn and continue from the log start;
* finishes a range whose last offsets hold no data records (transaction markers, compaction):
  the decoder's ``next_offset`` moves past them;
* waits at most ``kafkaConsumer.pollTimeoutMs`` for offsets that are not in the log yet.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import kafka.errors as Errors
import pyarrow as pa

from ..wire.client import (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, BrokerClient, RetriableBrokerError,
                     error_for)
from ..errors import BrokerUnavailableError, DataLossError, KafkaSourceError, TopicError
from .offsets import OffsetRange
from ..wire.fast_decode import decode_to_arrow
from ..wire.records import Record, decode_records

log = logging.getLogger(__name__)

_MAX_BACKOFF_MS = 5_000


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
        )


class _Deadline:
    """How long a range may go without progress before we give up on it."""

    def __init__(self, ms: int):
        self.ms = ms
        self.reset()

    def reset(self) -> None:
        self.at = time.monotonic() + self.ms / 1000

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.at


class RangeFetcher:
    """Reads offset ranges through one :class:`BrokerClient`."""

    def __init__(self, client: BrokerClient, settings: FetchSettings):
        self.client = client
        self.settings = settings
        self._leaders: dict[tuple[str, int], int] = {}

    def read(self, r: OffsetRange) -> Iterator[list[Record]]:
        """Yield lists of records of ``r`` in offset order; every offset of r is accounted for.

        Decodes with the reference decoder (:mod:`kafka_source.wire.records`).
        """
        s = self.settings

        def decode(data, position, aborted):
            result = decode_records(data, start_offset=position, end_offset=r.end,
                                    read_committed=s.read_committed,
                                    aborted_transactions=aborted, check_crcs=s.check_crcs)
            return result.records, result.next_offset, result.truncated

        return self._read(r, decode)

    def read_arrow(self, r: OffsetRange, include_headers: bool) -> Iterator[pa.RecordBatch]:
        """Yield Arrow batches of ``r``'s records (Spark's schema), decoded without a Python
        object per record (:mod:`kafka_source.wire.fast_decode`); otherwise exactly :meth:`read`."""
        s = self.settings

        def decode(data, position, aborted):
            return decode_to_arrow(data, start_offset=position, end_offset=r.end,
                                   read_committed=s.read_committed,
                                   aborted_transactions=aborted, check_crcs=s.check_crcs,
                                   topic=r.topic, partition=r.partition,
                                   include_headers=include_headers)

        for batches in self._read(r, decode):
            yield from batches

    def _read(self, r: OffsetRange, decode: Callable) -> Iterator[list]:
        """The fetch loop; ``decode(data, position, aborted)`` -> (items, next_offset,
        truncated) turns one partition's record bytes into a list of output items."""
        s = self.settings
        tp = r.topic_partition
        position = r.start
        deadline = _Deadline(s.poll_timeout_ms)
        failures = 0
        partition_max_bytes = s.partition_max_bytes
        while position < r.end:
            try:
                leader = self._leader(tp)
                response = self.client.fetch(
                    leader, {tp: position}, partition_max_bytes=partition_max_bytes,
                    max_bytes=max(s.max_bytes, partition_max_bytes), max_wait_ms=s.max_wait_ms,
                    min_bytes=s.min_bytes, read_committed=s.read_committed)
                data = _partition_data(response, tp)
                if data.error_code:
                    position, finished = self._handle_error(r, position, data.error_code)
                    if finished:
                        return
                    failures = 0
                    continue
            except (RetriableBrokerError, BrokerUnavailableError) as exc:
                # BrokerUnavailableError: no broker reachable at all (a fresh client cannot
                # bootstrap while the broker restarts) -- as transient here as a lost leader.
                self._leaders.pop(tp, None)
                failures += 1
                if deadline.passed:
                    raise KafkaSourceError(
                        f"Could not fetch {r.topic}-{r.partition} from offset {position}: {exc}; "
                        f"gave up after {s.poll_timeout_ms} ms (option "
                        "'kafkaConsumer.pollTimeoutMs').") from exc
                self._backoff(failures, f"{r.topic}-{r.partition}: {exc}")
                continue
            failures = 0
            aborted = [(a.producer_id, a.first_offset) for a in (data.aborted_transactions or ())]
            items, next_offset, truncated = decode(data.records or b"", position, aborted)
            if items:
                yield items
            if next_offset > position:
                position = next_offset
                deadline.reset()
                continue
            if truncated:
                # A single batch larger than the per-partition limit (only old brokers return a
                # truncated first batch): ask for more bytes next time.
                partition_max_bytes *= 2
                log.info("%s-%d: record batch at %d exceeds %d bytes; fetching with %d",
                         r.topic, r.partition, position, partition_max_bytes // 2,
                         partition_max_bytes)
                continue
            # No data at this position yet: the range ends beyond what the log holds now.
            available = data.high_watermark
            if s.read_committed and data.last_stable_offset is not None \
                    and data.last_stable_offset >= 0:
                available = data.last_stable_offset
            if deadline.passed:
                message = (f"{r.topic}-{r.partition}: offsets {position} to {r.end - 1} of the "
                           f"range [{r.start}, {r.end}) are not in Kafka; the log ends at "
                           f"{available}" + (" (last stable offset)" if s.read_committed else "")
                           + f". Waited {s.poll_timeout_ms} ms (option "
                           "'kafkaConsumer.pollTimeoutMs').")
                if s.fail_on_data_loss:
                    raise DataLossError(message + " Set 'failOnDataLoss' to 'false' to end the "
                                                  "range early instead.")
                log.warning("%s Ending the range early because failOnDataLoss is false.",
                            message)
                return
            time.sleep(min(0.1, max(0.0, deadline.at - time.monotonic())))

    def _leader(self, tp: tuple[str, int]) -> int:
        leader = self._leaders.get(tp)
        if leader is None:
            leader = self.client.leaders([tp])[tp]
            self._leaders[tp] = leader
        return leader

    def _backoff(self, failures: int, why: str) -> None:
        delay_ms = min(self.settings.retry_backoff_ms * (2 ** (failures - 1)), _MAX_BACKOFF_MS)
        log.warning("Retrying fetch in %d ms: %s", delay_ms, why)
        time.sleep(delay_ms / 1000)

    def _handle_error(self, r: OffsetRange, position: int, code: int) -> tuple[int, bool]:
        """React to a partition-level fetch error; returns (new position, range finished)."""
        err = error_for(code)
        if err is Errors.OffsetOutOfRangeError:
            return self._out_of_range(r, position)
        if getattr(err, "retriable", False) or err in (Errors.NotLeaderForPartitionError,
                                                       Errors.UnknownTopicOrPartitionError):
            raise RetriableBrokerError(f"{err.__name__}")
        raise TopicError(f"Fetching {r.topic}-{r.partition} at offset {position} failed: "
                         f"{err.__name__} ({getattr(err, 'description', '')}).")

    def _out_of_range(self, r: OffsetRange, position: int) -> tuple[int, bool]:
        tp = r.topic_partition
        bounds = self.client.list_offsets({tp: EARLIEST_TIMESTAMP},
                                          read_committed=self.settings.read_committed)
        log_start = bounds[tp][0]
        if position < log_start:
            message = (f"Offsets {position} to {min(log_start, r.end) - 1} of {r.topic}-"
                       f"{r.partition} are no longer in Kafka (the log now starts at {log_start}):"
                       " they were deleted by retention or compaction while the query ran.")
            if self.settings.fail_on_data_loss:
                raise DataLossError(message + " Set the option 'failOnDataLoss' to 'false' to "
                                              "read what is still available instead.")
            log.warning("%s Skipping them because failOnDataLoss is false.", message)
            return log_start, log_start >= r.end
        latest = self.client.list_offsets({tp: LATEST_TIMESTAMP},
                                          read_committed=self.settings.read_committed)[tp][0]
        message = (f"Offset {position} of {r.topic}-{r.partition} is beyond the end of the log "
                   f"({latest}): the log was truncated or the topic was recreated.")
        if self.settings.fail_on_data_loss:
            raise DataLossError(message + " Set the option 'failOnDataLoss' to 'false' to skip "
                                          "the missing offsets instead.")
        log.warning("%s Ending the range because failOnDataLoss is false.", message)
        return position, True


def _partition_data(response, tp):
    topic, partition = tp
    for t in response.responses:
        if t.topic != topic:
            continue
        for p in t.partitions:
            if p.partition_index == partition:
                return p
    raise RetriableBrokerError(f"fetch response has no data for {topic}-{partition}")
