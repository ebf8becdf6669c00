"""Driver side: turn the user's subscription and offset options into concrete offset ranges.

Which topic-partitions does the subscription cover, and where does each range start and end?
Answers come from the cluster (Metadata and ListOffsets), then are checked: an ending offset before
its starting offset is an error, and a starting offset below the log start is data loss, which
fails the query or (``failOnDataLoss=false``) moves the start up with a warning.

Batch and stream planning ask the cluster through the same bounded retries
(:func:`planning_retries`), so a broker restarting while a query is planned costs a few seconds,
not the job; a topic that does not exist on a cluster that otherwise answers normally is still
reported at once (see :mod:`kafka_source.wire.net.client`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

from ..wire.net.client import (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, BrokerClient, Retries,
                           TopicPartition, readable_topic)
from ..errors import DataLossError, OptionError, TopicError
from ..config.client_config import DEFAULT_FETCH_SETTINGS
from ..config.options import EARLIEST, LATEST, OffsetSpec, SourceOptions, Subscription

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one topic-partition.

    ``epoch``: the partition's leader epoch when ``end`` (or a later offset) was listed as the
    latest, -1 if not known. Every record below ``end`` was then written by a leader of that
    epoch or an older one, so a record there with a *newer* epoch means the log was truncated
    and written again after an unclean leader election (the executor's check, see
    :mod:`kafka_source.read.fetcher`). Not part of the range's identity (equality, order).
    """

    topic: str
    partition: int
    start: int
    end: int
    epoch: int = field(default=-1, compare=False)

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)


def planning_retries(options: SourceOptions) -> Retries:
    """The driver's retries against a cluster that answers with transient errors: the
    ``fetchOffset.*`` options, for at least ``kafka.request.timeout.ms``; the first after
    ``kafka.retry.backoff.ms``, the next ones twice as long each time, up to
    ``fetchOffset.retryIntervalMs`` (:class:`Retries`)."""
    config = options.client_config
    return Retries(count=options.fetch_offset_num_retries,
                   interval_ms=options.fetch_offset_retry_interval_ms,
                   window_ms=int(config.get("request_timeout_ms", 30_000)),
                   quick_ms=int(config.get("retry_backoff_ms",
                                           DEFAULT_FETCH_SETTINGS["retry_backoff_ms"])))


def subscription_topics(sub: Subscription) -> set[str] | None:
    """The topics to ask Metadata about for ``sub`` (None: all of them, for a pattern)."""
    if sub.kind == "subscribePattern":
        return None
    return set(sub.topics) if sub.kind == "subscribe" else {t for t, _ in sub.assignment}


def partitions_in_metadata(client: BrokerClient, sub: Subscription, infos: Mapping, *,
                           strict: bool, previous: tuple[list[TopicPartition], dict[str, int]]
                           | None = None) -> tuple[list[TopicPartition], dict[str, int]]:
    """The partitions ``sub`` covers in ``infos`` (Metadata of :func:`subscription_topics`,
    from :meth:`BrokerClient.topic_metadata`), sorted, and the partition count of each topic read.

    ``strict``: a topic that is missing or unreadable, a pattern that matches nothing and an
    assigned partition the topic lacks are errors; otherwise they are left out.

    ``previous``: what this returned for the last answer of the same subscription. When not
    ``strict`` (whose checks run in full), every topic still has partitions 0 to its count - 1,
    and the counts are the same, its list is returned again: a stream asks every trigger, and
    at 10,000 partitions building and sorting the list took about 6% of a trigger's planning
    (and its tuples woke the collector).
    """
    if sub.kind == "subscribePattern":
        topics = sorted(t for t, i in infos.items()
                        if i.error_code == 0 and not t.startswith("__") and sub.matches(t))
        if strict and not topics:
            raise TopicError(f"Option 'subscribePattern' ('{sub.pattern}') matches no topic on "
                             f"the Kafka cluster at '{client.bootstrap_servers}'.")
    else:
        topics = []
        for t in sorted(subscription_topics(sub)):
            info = infos.get(t)
            if info is not None and info.error_code == 0:
                topics.append(t)
            elif strict:
                readable_topic(t, info, client.bootstrap_servers)  # raises the clear error
    counts = {t: len(infos[t].partitions) for t in topics}
    if previous is not None and not strict and previous[1] == counts and all(
            _numbered_from_zero(infos[t].partitions) for t in topics):
        return previous[0], counts
    result = sorted((t, p) for t in topics for p in infos[t].partitions)
    if sub.kind == "assign":
        if strict:
            for topic, partition in sorted(set(sub.assignment) - set(result)):
                raise TopicError(f"Option 'assign' names {topic}-{partition}, but topic "
                                 f"'{topic}' has partitions "
                                 f"{sorted(p for t, p in result if t == topic)}.")
        result = sorted(set(result) & set(sub.assignment))
    return result, counts


def _numbered_from_zero(partitions: Mapping[int, object]) -> bool:
    """Whether the (distinct) partition numbers are exactly 0 to len - 1, as Kafka numbers a
    topic's partitions: then the count alone says which they are."""
    return not partitions or (min(partitions) == 0 and max(partitions) == len(partitions) - 1)


def subscribed_partitions(client: BrokerClient, options: SourceOptions) -> list[TopicPartition]:
    """Every topic-partition the subscription covers right now, sorted."""
    sub = options.subscription
    infos = client.topic_metadata(subscription_topics(sub), planning_retries(options))
    return partitions_in_metadata(client, sub, infos, strict=True)[0]


def _check_spec_partitions(spec: OffsetSpec, partitions: list[TopicPartition]) -> None:
    """A per-partition JSON spec must name exactly the partitions being read (as in Spark)."""
    have = set(partitions)
    named = set(spec.per_partition)
    unknown = sorted(named - have)
    if unknown:
        topic, partition = unknown[0]
        topic_parts = sorted(p for t, p in have if t == topic)
        if topic_parts:
            raise TopicError(f"Option '{spec.option}' names {topic}-{partition}, but topic "
                             f"'{topic}' has partitions {topic_parts}.")
        raise OptionError(f"Option '{spec.option}' names topic '{topic}', which this query does "
                          "not read (check 'subscribe', 'subscribePattern' or 'assign').")
    missing = sorted(have - named)
    if missing:
        shown = ", ".join(f"{t}-{p}" for t, p in missing[:10]) + (" ..." if len(missing) > 10
                                                                  else "")
        hint = ("Use -2 for earliest and -1 for latest." if spec.kind == "offsets"
                else "Give a timestamp in milliseconds for each.")
        raise OptionError(f"Option '{spec.option}' must give a value for every partition read; "
                          f"missing: {shown}. {hint}")


class OffsetResolver:
    """Resolves offset specs for a set of partitions against one cluster, caching bounds."""

    def __init__(self, client: BrokerClient, options: SourceOptions,
                 partitions: list[TopicPartition], *,
                 all_partitions: list[TopicPartition] | None = None):
        self.client = client
        self.options = options
        self.partitions = partitions
        # JSON specs must name every partition of the subscription, also when only some of
        # them are resolved here (a stream reads the share its consumer group assigns it).
        self.all_partitions = partitions if all_partitions is None else all_partitions
        self._earliest: dict[TopicPartition, int] | None = None
        self._latest: dict[TopicPartition, int] | None = None
        #: The leader epoch given with each latest offset (ListOffsets v4+; -1 unknown).
        self.latest_epochs: dict[TopicPartition, int] = {}

    def _list(self, targets: Mapping[TopicPartition, int],
              epochs: dict | None = None) -> dict[TopicPartition, tuple[int, int]]:
        return self.client.list_offsets(targets, read_committed=self.options.read_committed,
                                        retries=planning_retries(self.options), epochs=epochs)

    @property
    def earliest(self) -> dict[TopicPartition, int]:
        if self._earliest is None:
            listed = self._list({tp: EARLIEST_TIMESTAMP for tp in self.partitions})
            self._earliest = {tp: off for tp, (off, _) in listed.items()}
        return self._earliest

    @property
    def latest(self) -> dict[TopicPartition, int]:
        if self._latest is None:
            listed = self._list({tp: LATEST_TIMESTAMP for tp in self.partitions},
                                self.latest_epochs)
            self._latest = {tp: off for tp, (off, _) in listed.items()}
        return self._latest

    @property
    def latest_if_listed(self) -> dict[TopicPartition, int] | None:
        """The latest offsets if they were listed already, else None (no request)."""
        return self._latest

    def resolve(self, spec: OffsetSpec, *, is_start: bool) -> dict[TopicPartition, int]:
        if spec.kind == "earliest":
            return dict(self.earliest)
        if spec.kind == "latest":
            return dict(self.latest)
        if spec.kind == "offsets":
            _check_spec_partitions(spec, self.all_partitions)
            result = {}
            for tp in self.partitions:
                value = spec.per_partition[tp]
                if value == EARLIEST:
                    value = self.earliest[tp]
                elif value == LATEST:
                    value = self.latest[tp]
                result[tp] = value
            return result
        if spec.kind == "timestamps":
            _check_spec_partitions(spec, self.all_partitions)
            targets = {tp: spec.per_partition[tp] for tp in self.partitions}
        else:
            targets = {tp: spec.global_timestamp for tp in self.partitions}
        listed = self._list(targets)
        result = {}
        for tp in self.partitions:
            offset = listed[tp][0]
            if offset < 0:  # no record at or after the timestamp
                if is_start and self.options.starting_by_timestamp_strategy == "error":
                    raise OptionError(
                        f"No offset of {tp[0]}-{tp[1]} matches timestamp {targets[tp]} (option "
                        f"'{spec.option}'): no record has a timestamp at or after it. Set "
                        "'startingOffsetsByTimestampStrategy' to 'latest' to start from the "
                        "latest offset instead.")
                offset = self.latest[tp]
            result[tp] = offset
        return result


def plan_batch_ranges(client: BrokerClient, options: SourceOptions) -> list[OffsetRange]:
    """The offset range of every partition a batch query reads, checked for data loss."""
    partitions = subscribed_partitions(client, options)
    resolver = OffsetResolver(client, options, partitions)
    starts = resolver.resolve(options.starting, is_start=True)
    ends = resolver.resolve(options.ending, is_start=False)
    ranges = []
    for tp in partitions:
        start, end = starts[tp], ends[tp]
        if end < start:
            raise OptionError(
                f"Ending offset {end} of {tp[0]}-{tp[1]} is before its starting offset {start} "
                f"(options '{options.starting.option}' and '{options.ending.option}').")
        start = check_start_for_data_loss(tp, start, resolver.earliest[tp], options)
        # The end's leader epoch, if the latest offsets were listed anyway (no extra request).
        listed = resolver.latest_epochs.get(tp, -1), (resolver.latest_if_listed or {}).get(tp, -1)
        epoch = listed[0] if 0 <= end <= listed[1] else -1
        ranges.append(OffsetRange(tp[0], tp[1], start, max(start, end), epoch))
    return ranges


def on_data_loss(fail: bool, message: str, *, remedy: str, action: str,
                 logger: logging.Logger = log) -> None:
    """``failOnDataLoss`` in one place: with ``fail``, a DataLossError saying ``message`` and
    ``remedy`` (how to go on with 'failOnDataLoss' false); else a warning on ``logger`` that
    ``action`` is taken instead."""
    if fail:
        raise DataLossError(f"{message} {remedy}")
    logger.warning("%s %s because failOnDataLoss is false.", message, action)


def check_start_for_data_loss(tp: TopicPartition, start: int, log_start: int,
                              options: SourceOptions) -> int:
    """Where reading of ``tp`` can really start; fails or warns when ``start`` is gone."""
    if start >= log_start:
        return start
    message = (f"Offsets {start} to {log_start - 1} of {tp[0]}-{tp[1]} are no longer in Kafka "
               f"(the log now starts at {log_start}): the data was deleted by retention or "
               "compaction, or the topic was recreated.")
    on_data_loss(options.fail_on_data_loss, message,
                 remedy="Set the option 'failOnDataLoss' to 'false' to read what is still "
                        "available instead.",
                 action=f"Continuing from offset {log_start}")
    return log_start
