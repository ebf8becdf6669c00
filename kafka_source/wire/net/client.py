"""A small Kafka protocol client shared by the driver (planning) and the executors (fetching):
what they ask the cluster. Metadata for named topics without auto-creating them, partition
leaders, coordinators, a group's committed offsets, ListOffsets grouped by partition leader,
OffsetsForLeaderEpoch, and the executors' dedicated Fetch connections, which kafka-python sets
up (TLS, SASL) and the fetch loop then reads from directly
(:mod:`kafka_source.wire.net.fetch_connection`). The connections and the sending of requests
are :mod:`kafka_source.wire.net.transport`'s.

Brokers restart (upgrades, rolling restarts, crashes), and for a while they give answers that
look final but are not. Measured on Kafka 4.0 (KRaft): during a controlled shutdown Metadata
lists the topics with no partition leader (LEADER_NOT_AVAILABLE), then answers with *no brokers
and no controller*, then connections are reset and refused until the restarted broker is back
(it opens its listeners only once it has caught up with the cluster's metadata). A ZooKeeper-mode
broker (Kafka 2.x and 3.x) opens its listeners *before* the controller sent it the cluster's
metadata and meanwhile answers Metadata with no brokers and UNKNOWN_TOPIC_OR_PARTITION for every
topic (KAFKA-15161) -- the "Topic does not exist" of a batch read planned during a bounce.
Hence, as Kafka's Java client does, a Metadata answer without any broker is not an answer about
the cluster: :meth:`BrokerClient.metadata` raises :class:`RetriableBrokerError` for it. Then the
ZooKeeper-mode broker learns the brokers, and for a while longer still not the partitions: it
answers *with* brokers and UNKNOWN_TOPIC_OR_PARTITION (measured on Kafka 2.2). So an answer that
lacks a topic or partition that was there is doubted, and one from a ZooKeeper-mode broker that
calls a new topic unknown is checked against the broker's whole topic list, before either is
believed (a KRaft broker does not serve before it knows the topics); answers with older
leader epochs than seen are stale (:mod:`kafka_source.wire.net.metadata_view`). :class:`Retries` is the one
bounded retry policy the driver's planning uses for all of this (``fetchOffset.numRetries``,
``fetchOffset.retryIntervalMs``, at least ``kafka.request.timeout.ms``).
"""

from __future__ import annotations

import logging
import operator
import time
from dataclasses import dataclass
from itertools import groupby, repeat
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple, TypeVar

import kafka.errors as Errors
from kafka.protocol.consumer import OffsetForLeaderEpochRequest
from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest

from ...errors import BrokerUnavailableError, RetriableBrokerError, TopicError, TopicNotFoundError
from .metadata_view import MetadataView, UnconfirmedAnswer, confirm_ms_for
from .planning_protocol import LeanListOffsetsRequest, LeanMetadataRequest, brokers_only
from .transport import BrokerTransport

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

# ListOffsets special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


class PartitionInfo(NamedTuple):
    """One partition of a Metadata answer (a tuple: a pattern's answer makes thousands)."""

    leader: int  # -1 while no leader is available
    error_code: int
    leader_epoch: int = -1   # Metadata v7+ (Kafka 2.1+); -1 when the broker gives none


@dataclass(frozen=True)
class TopicInfo:
    name: str
    error_code: int
    partitions: Mapping[int, PartitionInfo]
    # The topic's id (KIP-516; Metadata v10+, Kafka 2.8+), 16 bytes; None from older brokers
    topic_id: bytes | None = None


_FIRST, _SECOND, _THIRD, _FOURTH, _FIFTH = map(operator.itemgetter, range(5))


class UnsettledMetadata(RetriableBrokerError):
    """A Metadata answer not believed yet (:mod:`kafka_source.wire.net.metadata_view`): stale, or
    lacking topics or partitions that existed. ``infos`` is what it said: when the retries run
    out, that is the answer after all (see :meth:`BrokerClient.topic_metadata`)."""

    def __init__(self, message: str, infos=None):
        super().__init__(message)
        self.infos = infos


def error_for(code: int) -> type[Errors.KafkaError]:
    return Errors.for_code(code)


T = TypeVar("T")
_MIN_PAUSE_MS = 100
# ListOffsets routed by a Metadata answer at most this old (:meth:`BrokerClient._cached_routes`).
_FRESH_LEADERS_MS = 1_000
#: How many Metadata questions (sets of topics) keep their last answer for the next one
_METADATA_MEMOS = 4


@dataclass(frozen=True)
class Retries:
    """How long the driver keeps asking a cluster that answers with transient errors.

    At least ``count`` retries ``interval_ms`` apart (``fetchOffset.numRetries``,
    ``fetchOffset.retryIntervalMs``), and retries go on until ``window_ms`` have passed since the
    first attempt (``kafka.request.timeout.ms``): a restarting broker is back within seconds, but
    more than the 3 x 1 s of the defaults. Each attempt is itself bounded by the request timeout,
    so the whole is bounded.

    ``quick_ms`` (``kafka.retry.backoff.ms``, for planning): the first retry comes after that
    long, each next one after twice as long as the one before, up to ``interval_ms``. Most
    retriable errors are over at once: a leader moved by a controlled shutdown, a preferred
    election or a reassignment (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH), a connection
    dropped by a broker that is stopping -- new metadata names the new leader. Spark's JVM source
    asks through Kafka's Java clients, which retry those after ``retry.backoff.ms`` (100 ms,
    growing to ``retry.backoff.max.ms``, 1 s: KIP-580) before Spark's own ``retryIntervalMs``
    pause ever comes into play; with a flat 1 s pause every leader move cost a trigger a second.
    """

    count: int = 3
    interval_ms: int = 1000
    window_ms: int = 0
    quick_ms: int | None = None

    def run(self, attempt: Callable[[], T], *, what: str, where: str) -> T:
        """``attempt()`` until it does not raise :class:`RetriableBrokerError`; then
        :class:`BrokerUnavailableError` saying what failed (``what``) against ``where``."""
        started = time.monotonic()
        tries = 0
        while True:
            try:
                return attempt()
            except RetriableBrokerError as exc:
                tries += 1
                elapsed_ms = (time.monotonic() - started) * 1000
                pause_ms = self.interval_ms
                if self.quick_ms is not None:       # growing from quick_ms (above)
                    pause_ms = min(pause_ms, self.quick_ms * 2 ** min(tries - 1, 30))
                if tries > self.count:
                    # Past the counted retries only the window keeps us going: never spin.
                    pause_ms = max(pause_ms, _MIN_PAUSE_MS)
                if tries > self.count and elapsed_ms + pause_ms > self.window_ms:
                    raise BrokerUnavailableError(
                        f"Could not {what} from Kafka at '{where}': still failing after "
                        f"{tries} attempts in {elapsed_ms / 1000:.1f} s (options "
                        f"'fetchOffset.numRetries' = {self.count}, 'fetchOffset.retryIntervalMs'"
                        f" = {self.interval_ms} and 'kafka.request.timeout.ms' = "
                        f"{self.window_ms} bound the retries). Last error: {exc}") from exc
                log.warning("Could not %s (%s); retry %d in %d ms", what, exc, tries, pause_ms)
                time.sleep(pause_ms / 1000)


class _Failures:
    """The retriable failures of one attempt over several leaders (a broker that could not be
    reached, a partition whose leader moved), gathered while the other answers are taken in;
    then one :class:`RetriableBrokerError` naming the first of them and how many partitions
    are left for the retry."""

    __slots__ = ("errors",)

    def __init__(self):
        self.errors: list[str] = []

    def add(self, error: str) -> None:
        self.errors.append(error)

    def answered(self, responses: list) -> Iterator:
        """The answers among ``responses`` (:meth:`BrokerTransport.send_all` with
        ``partial``); the brokers that failed instead are noted."""
        for response in responses:
            if isinstance(response, RetriableBrokerError):
                self.add(str(response))
            else:
                yield response

    def raise_if_any(self, asked: Mapping, found: Mapping) -> None:
        if not self.errors:
            return
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        left = sum(1 for tp in asked if tp not in found)
        raise RetriableBrokerError(f"{self.errors[0]}{more}; {left} of the {len(asked)} "
                                   "partitions asked still to ask")


def readable_topic(topic: str, info: TopicInfo | None, bootstrap_servers: str) -> TopicInfo:
    """``info`` (Metadata of ``topic``) if the topic can be read; else a clear TopicError, or
    RetriableBrokerError for a transient error (e.g. LEADER_NOT_AVAILABLE while it is created).

    Only for answers that were believed (:meth:`BrokerClient.topic_metadata`,
    :meth:`BrokerClient.leaders`): there UNKNOWN_TOPIC_OR_PARTITION means the topic does not
    exist.
    """
    code = info.error_code if info else Errors.UnknownTopicOrPartitionError.errno
    if code == 0:
        return info
    err = error_for(code)
    if err is Errors.UnknownTopicOrPartitionError:
        raise TopicNotFoundError(f"Topic '{topic}' does not exist on the Kafka cluster at "
                         f"'{bootstrap_servers}'.")
    if getattr(err, "retriable", False):
        raise RetriableBrokerError(f"topic '{topic}': {err.__name__}")
    raise TopicError(f"Topic '{topic}' cannot be read: {err.__name__} "
                     f"({getattr(err, 'description', '')}).")


class BrokerClient(BrokerTransport):
    """A client of one Kafka cluster (:class:`~kafka_source.wire.net.transport.BrokerTransport`
    for its connections and requests) that asks what planning and the group need. Not
    thread-safe: use one per thread."""

    def __init__(self, config: Mapping[str, object]):
        super().__init__(config)
        self._fetch_connections = None       # the executors' own (:meth:`fetch_connections`)
        # Leader epochs and partitions seen; how far to believe the next answer.
        self.view = MetadataView(confirm_ms_for(self.request_timeout_ms))
        self.last_metadata_node = None       # the broker that gave the last Metadata answer
        # The leaders of every partition of each topic in the last Metadata answer that named
        # it: topic -> (monotonic time, {partition: leader}) (:meth:`cached_leaders`).
        self._leader_cache: dict[str, tuple[float, dict[int, int]]] = {}
        # The last Metadata answers, per question (the topics asked for): their bytes, the
        # answer and what metadata() took from it (see LeanMetadataRequest's ``same_as``).
        self._metadata_memo: dict[tuple[str, ...] | None, tuple] = {}

    def close(self) -> None:
        try:
            if self._fetch_connections is not None:
                self._fetch_connections.close()
        except Exception:  # closing must never mask the real outcome
            log.debug("error closing Kafka fetch connections", exc_info=True)
        super().close()

    # --- metadata --------------------------------------------------------------------------

    def metadata(self, topics: Iterable[str] | None, *, node=None) -> dict[str, TopicInfo]:
        """Metadata of the named topics (all topics when None), from ``node`` (default: a broker
        other than one whose answer was doubted last, else the least loaded). Never creates
        topics; the answer is taken as it is, apart from the two checks below. What it says of
        missing topics is for :meth:`topic_metadata` and :meth:`leaders` to weigh.

        RetriableBrokerError when no broker answers, or when the answer lists no brokers: the
        broker that gave it does not know the cluster's state (starting or shutting down, see
        the module docstring), so its topic errors mean nothing. :class:`UnsettledMetadata` when
        it has an older leader epoch for a partition than seen before.
        """
        names = None if topics is None else sorted(set(topics))
        key = None if names is None else tuple(names)
        memo = self._metadata_memo.get(key)
        # :mod:`.planning_protocol`: grows with partitions; an answer the same as the last one
        # to the same question is not decoded again
        request = LeanMetadataRequest(names, None if memo is None else memo[:2])
        if node is None:
            node = self._metadata_node()
        try:
            response = self.send(node, request)
        except RetriableBrokerError:
            self.view.avoid = self.last_node        # unreachable: ask another broker next
            raise
        node = self.last_node
        if not response.brokers:
            self.view.avoid = node
            raise RetriableBrokerError(
                "a broker answered Metadata without any broker (controller "
                f"{getattr(response, 'controller_id', -1)}): it does not know the cluster's state "
                "yet (restarting?)")
        if getattr(response, "error_code", 0):
            # Metadata v13+ (KIP-1102): the whole answer failed, e.g. REBOOTSTRAP_REQUIRED
            self.view.avoid = node
            raise RetriableBrokerError(f"broker {node} answered Metadata with "
                                       f"{error_for(response.error_code).__name__}")
        if memo is not None and response is memo[1]:
            # The same bytes as the last answer to this question: what was taken from it then
            # (nothing below changes it). The checks against the view still run: another
            # answer may have shown newer epochs or ids since.
            result, ids, epochs, leaders = memo[2]
        else:
            result, ids, epochs, leaders = self._take_in(response)
            if isinstance(request.body, bytes):
                self._metadata_memo.pop(key, None)
                while len(self._metadata_memo) >= _METADATA_MEMOS:
                    del self._metadata_memo[next(iter(self._metadata_memo))]
                self._metadata_memo[key] = (request.body, response,
                                            (result, ids, epochs, leaders))
        try:
            self.view.check_topic_ids(node, ids)
            self.view.check_epochs(node, epochs)
        except UnconfirmedAnswer as exc:
            raise UnsettledMetadata(str(exc)) from None
        # kafka-python's cluster needs the brokers (to connect), not the partitions: the
        # connector routes its requests itself, and taking them in cost as much as decoding
        self._net.cluster.update_metadata(brokers_only(response))
        self.view.seen(result)
        self.last_metadata_node = node
        now = time.monotonic()
        for topic, led in leaders.items():
            self._leader_cache[topic] = (now, led)
        return dict(result)

    @staticmethod
    def _take_in(response) -> tuple[dict, dict, dict, dict]:
        """What :meth:`metadata` takes from an answer: the topics' :class:`TopicInfo`, the ids
        of those without error, every partition's leader epoch, and each topic's leaders."""
        # One pass over the answer builds everything taken from it: with a pattern over
        # thousands of topics each pass cost about as much as decoding the answer.
        result, ids, epochs, leaders = {}, {}, {}, {}
        for topic in response.topics:
            name, error_code = topic.name, topic.error_code
            parts, led = {}, {}
            for p in topic.partitions:
                index, leader = p.partition_index, p.leader_id
                epoch = getattr(p, "leader_epoch", -1)
                parts[index] = PartitionInfo(leader, p.error_code, epoch)
                epochs[(name, index)] = epoch
                if leader >= 0:
                    led[index] = leader
            topic_id = getattr(topic, "topic_id", None)
            result[name] = TopicInfo(name, error_code, parts, topic_id)
            if not error_code:
                ids[name] = topic_id
                leaders[name] = led
        return result, ids, epochs, leaders

    def _metadata_node(self):
        """Where to send Metadata: after a doubted answer or a failure, each of the other known
        brokers in turn; otherwise None, the least loaded broker (:meth:`send`'s choice)."""
        avoid, self.view.avoid = self.view.avoid, None
        if avoid is not None:
            ids = sorted((b.node_id for b in self._net.cluster.brokers()), key=str)
            others = [i for i in ids if i != avoid]
            if others:   # the next one after ``avoid``, round the ring
                later = [i for i in others if str(i) > str(avoid)]
                return (later or others)[0]
        return None

    def topic_metadata(self, topics: Iterable[str] | None, retries: Retries, *,
                       expected: Iterable[str] | None = None) -> dict[str, TopicInfo]:
        """:meth:`metadata`, retried under ``retries`` while it fails, while a topic has a
        transient error other than UNKNOWN_TOPIC_OR_PARTITION (e.g. LEADER_NOT_AVAILABLE right
        after the topic was created), and while the answer is not believed
        (:mod:`kafka_source.wire.net.metadata_view`):

        * partitions seen before of the ``expected`` topics (default: of the named topics) that
          the answer lacks are doubted, for a bounded time, asking other brokers;
        * a named topic never seen that a ZooKeeper-mode broker calls unknown is believed
          missing only if that broker lists other topics; one that lists none is starting
          (:meth:`_check_unknown`). A KRaft broker's answer is believed.

        A topic that does not exist comes back with its error code, for the caller to report
        (:func:`readable_topic`). If the retries run out while an answer is doubted, that
        answer is taken."""
        names = None if topics is None else sorted(set(topics))
        expect = names if expected is None else sorted(set(expected))

        def attempt():
            infos = self.checked_metadata(names, self.view.known_partitions(expect or ()))
            node = self.last_metadata_node
            unknown = [t for t in names or () if infos.get(t) is None
                       or infos[t].error_code == Errors.UnknownTopicOrPartitionError.errno]
            if unknown and not self.kraft_broker(node):
                self._check_unknown(node, unknown, infos)
            troubled = sorted(t for t, i in infos.items()
                              if i.error_code not in (0, Errors.UnknownTopicOrPartitionError.errno)
                              and getattr(error_for(i.error_code), "retriable", False))
            if troubled:
                raise RetriableBrokerError("topic(s) " + ", ".join(
                    f"'{t}': {error_for(infos[t].error_code).__name__}" for t in troubled))
            return infos

        try:
            return retries.run(attempt, what="get topic metadata", where=self.bootstrap_servers)
        except BrokerUnavailableError as exc:
            doubted = exc.__cause__
            if isinstance(doubted, UnsettledMetadata) and doubted.infos is not None:
                log.warning("Taking the last Metadata answer although it is doubted: %s",
                            doubted)
                return doubted.infos
            raise

    def _check_unknown(self, node, unknown: list[str], infos: dict[str, TopicInfo]) -> None:
        """Raise :class:`UnsettledMetadata` unless the ZooKeeper-mode broker ``node``, which
        called the never-seen topics ``unknown`` unknown in ``infos``, has learnt the cluster's
        partitions: asked for its whole list, it must list some topic, and none of those.

        Not asked of a KRaft broker (:meth:`kraft_broker`), which opens its listeners only
        once it has caught up with the cluster's metadata: its "unknown" is the cluster's,
        reported at once, also on a cluster without any topic yet (where the doubt used to
        last until the planning retries ran out, ``kafka.request.timeout.ms``), and without
        listing every topic of a large cluster for a misspelt name."""
        listed = self.metadata(None, node=node)
        if not any(info.error_code == 0 for info in listed.values()):
            self.view.avoid = node
            raise UnsettledMetadata(
                f"broker {node} lists no topic at all, so its 'unknown topic' for "
                f"{', '.join(repr(t) for t in unknown)} means nothing yet (it has not "
                "learnt the cluster's partitions: starting?)", infos)
        learnt = [t for t in unknown if t in listed and listed[t].error_code == 0]
        if learnt:
            # Asked next for its whole list, the broker has the topic: it learnt the
            # cluster's partitions in between (a ZooKeeper-mode broker just (re)started).
            # Neither answer is taken for the other's topics: ask for the named ones again.
            raise UnsettledMetadata(
                f"broker {node} called {', '.join(repr(t) for t in learnt)} unknown, then "
                "listed it among its topics (it was learning the cluster's partitions)",
                infos)

    def checked_metadata(self, topics: Iterable[str] | None,
                         expected: Iterable[TopicPartition]) -> dict[str, TopicInfo]:
        """:meth:`metadata`, raising :class:`UnsettledMetadata` while the answer lacks one of
        the ``expected`` partitions (ones that existed) and that is still doubted
        (:meth:`MetadataView.confirm_present`)."""
        infos = self.metadata(topics)
        try:
            self.view.confirm_present(self.last_metadata_node, infos, expected)
        except UnconfirmedAnswer as exc:
            raise UnsettledMetadata(str(exc), infos) from None
        return infos

    def leaders(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The current leader of each partition; RetriableBrokerError while one has none, and
        while an answer lacking one of them is doubted (they are all taken to have existed:
        they come from metadata or from a planned range); then TopicNotFoundError."""
        partitions = list(partitions)
        infos = self.checked_metadata({t for t, _ in partitions}, partitions)
        result = {}
        for topic, partition in partitions:
            info = readable_topic(topic, infos.get(topic), self.bootstrap_servers)
            part = info.partitions.get(partition)
            if part is None:
                raise TopicNotFoundError(f"Topic '{topic}' has no partition {partition} (it has "
                                 f"partitions {sorted(info.partitions)}).")
            if part.leader < 0:
                raise RetriableBrokerError(f"{topic}-{partition} has no leader")
            result[(topic, partition)] = part.leader
        return result

    def cached_leaders(self, partitions: Iterable[TopicPartition],
                       max_age_ms: int) -> dict[TopicPartition, int]:
        """The leaders of those ``partitions`` that a Metadata answer at most ``max_age_ms``
        old named (for the whole topic, whatever partitions it was asked for).

        For ListOffsets right after a trigger's Metadata (:meth:`_cached_routes`), and for an
        executor's fetch loop (:class:`kafka_source.read.fetcher.RangeFetcher`): a
        Python worker runs task after task on the same client, and looking the leaders up
        again for each one cost a Metadata request for every topic read -- at 10,000
        partitions about 200 ms of decoding per task for a trickle of records. Java's consumer
        likewise fetches from its cached metadata (``metadata.max.age.ms``). A leader that
        moved answers NOT_LEADER_OR_FOLLOWER (or a broker that went is unreachable); the loop
        then drops the topic here (:meth:`forget_leaders`) and looks it up."""
        now = time.monotonic()
        result = {}
        for topic, partition in partitions:
            entry = self._leader_cache.get(topic)
            if entry is None or (now - entry[0]) * 1000 > max_age_ms:
                continue
            leader = entry[1].get(partition)
            if leader is not None:
                result[(topic, partition)] = leader
        return result

    def forget_leaders(self, topics: Iterable[str]) -> None:
        """Stop :meth:`cached_leaders` from answering for these topics."""
        for topic in topics:
            self._leader_cache.pop(topic, None)

    # --- group coordinator -------------------------------------------------------------------

    def find_coordinator(self, group_id: str) -> str | int:
        """The node id to send ``group_id``'s group requests to (a dedicated connection).

        Raises :class:`RetriableBrokerError` while the coordinator is unknown or moving, and
        ``kafka.errors`` exceptions for fatal answers (e.g. GroupAuthorizationFailedError).
        """
        return self._find_coordinator(group_id, CoordinatorType.GROUP, "group")

    def find_transaction_coordinator(self, transactional_id: str) -> str | int:
        """The node id to send ``transactional_id``'s transaction requests to (InitProducerId,
        AddPartitionsToTxn, EndTxn): FindCoordinator with key type 1. Errors as
        :meth:`find_coordinator` (e.g. TransactionalIdAuthorizationFailedError)."""
        return self._find_coordinator(transactional_id, CoordinatorType.TRANSACTION,
                                      "transactional id")

    def _find_coordinator(self, key: str, key_type: CoordinatorType, what: str) -> str | int:
        # key/key_type serve v0-v3, coordinator_keys v4+; the connection picks the version.
        request = FindCoordinatorRequest(key=key, key_type=int(key_type), coordinator_keys=[key])
        response = self.send(None, request)
        result = response.coordinators[0] if response.coordinators else response
        err = error_for(result.error_code)
        if err is not Errors.NoError:
            if getattr(err, "retriable", False) or err in (Errors.CoordinatorNotAvailableError,
                                                           Errors.NotCoordinatorError):
                raise RetriableBrokerError(f"FindCoordinator for {what} '{key}': "
                                           f"{err.__name__}")
            raise err(f"FindCoordinator for {what} '{key}'")
        return self._net.cluster.add_coordinator(result, key_type, key)

    def group_offsets(self, node: str | int, group_id: str, *, require_stable: bool
                      ) -> tuple[type[Errors.KafkaError], dict[TopicPartition, tuple[int, str]]]:
        """Every committed offset of ``group_id`` (OffsetFetch v2+ without topics), asked of its
        coordinator ``node``: the group-level error class (NoError, GroupIdNotFoundError, ...)
        and (topic, partition) -> (offset, metadata) for the partitions answered without error
        with an offset. Partition errors other than UNKNOWN_TOPIC_OR_PARTITION (a deleted topic)
        are raised, retriable ones (UNSTABLE_OFFSET_COMMIT while a transaction commits offsets)
        and network failures as :class:`RetriableBrokerError` (see :meth:`send`)."""
        from kafka.protocol.consumer import OffsetFetchRequest

        G = OffsetFetchRequest.OffsetFetchRequestGroup
        response = self.send(node, OffsetFetchRequest(
            group_id=group_id, topics=None, groups=[G(group_id=group_id, topics=None)],
            require_stable=require_stable, max_version=8))
        if response.version >= 8:
            code, found = response.groups[0].error_code, response.groups[0].topics
        else:
            code, found = response.error_code, response.topics
        offsets = {}
        for t in found:
            for p in t.partitions:
                err = error_for(p.error_code)
                if err is Errors.UnknownTopicOrPartitionError:
                    continue
                if getattr(err, "retriable", False):  # e.g. UNSTABLE_OFFSET_COMMIT
                    raise RetriableBrokerError(f"OffsetFetch of group '{group_id}', "
                                               f"{t.name}-{p.partition_index}: {err.__name__}")
                if err is not Errors.NoError:
                    raise err(f"OffsetFetch of group '{group_id}', {t.name}-{p.partition_index}")
                if p.committed_offset >= 0:
                    offsets[(t.name, p.partition_index)] = (p.committed_offset, p.metadata or "")
        return error_for(code), offsets

    # --- offsets ---------------------------------------------------------------------------

    def list_offsets(self, targets: Mapping[TopicPartition, int], *, read_committed: bool,
                     retries: Retries | None = None,
                     epochs: dict | None = None) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets for each partition: target -2 earliest, -1 latest, else a timestamp (ms).

        Returns ``(offset, timestamp)``; offset is -1 when no record has a timestamp >= target.
        Retries retriable errors (no leader, a broker restarting) under ``retries`` (default:
        3 retries 1 s apart, at least the request timeout).

        ``epochs``, if given, receives the leader epoch the leader gave with each offset
        (ListOffsets v4+, Kafka 2.1+; -1 from older brokers): for latest, the leader's current
        epoch; else the epoch of the record found. The pair is what truncation detection
        validates later (:mod:`kafka_source.read.truncation`).
        """
        if retries is None:
            retries = Retries(window_ms=self.request_timeout_ms)
        found: dict[TopicPartition, tuple[int, int]] = {}
        return retries.run(
            lambda: self._list_offsets_once(targets, read_committed, epochs, found),
            what="fetch offsets", where=self.bootstrap_servers)

    def _by_leader(self, tps: Iterable[TopicPartition]) -> dict[int, list[TopicPartition]]:
        """``tps`` grouped by their current leader (:meth:`leaders`): one request per leader."""
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp, leader in self.leaders(list(tps)).items():
            by_leader.setdefault(leader, []).append(tp)
        return by_leader

    def _cached_routes(self, targets: Mapping[TopicPartition, int]
                       ) -> dict[int, dict[str, list[tuple[int, int, int]]]] | None:
        """ListOffsets' requests, ``{leader: {topic: [(partition, current leader epoch,
        target)]}}``, routed by a Metadata answer at most ``_FRESH_LEADERS_MS`` old
        (:meth:`cached_leaders`), as Java's consumer routes ListOffsets by its cached metadata;
        None when that answer names no leader for one of them. A stream's trigger asks for its
        topics' metadata and then for their latest offsets: asking for the same metadata twice
        cost a second round trip and a second parse of every partition (about 11 ms at 1,000
        partitions, growing with them).

        Each run of partitions of one topic is taken in passes that run in C (``map``,
        ``zip``, a sort by leader): at 10,000 partitions a Python loop over them, looking each
        one's leader up and appending its row, took 7-13 ms a trigger."""
        now = time.monotonic()
        epoch = self.view.epochs.get
        cache = self._leader_cache
        keys, values = list(targets), list(targets.values())
        routes: dict[int, dict[str, list]] = {}
        at = 0
        for topic, run in groupby(keys, _FIRST):
            tps = list(run)
            entry = cache.get(topic)
            if entry is None or (now - entry[0]) * 1000 > _FRESH_LEADERS_MS:
                return None
            partitions = list(map(_SECOND, tps))
            leaders = list(map(entry[1].get, partitions))
            if None in leaders:
                return None
            rows = list(zip(partitions, map(epoch, tps, repeat(-1)), values[at:at + len(tps)]))
            at += len(tps)
            if leaders.count(leaders[0]) == len(leaders):       # one leader for all of them
                groups = ((leaders[0], rows),)
            else:                   # by leader, each in the order asked (the sort is stable)
                order = sorted(range(len(rows)), key=leaders.__getitem__)
                groups = ((leader, list(map(rows.__getitem__, run)))
                          for leader, run in groupby(order, leaders.__getitem__))
            for leader, led in groups:
                routes.setdefault(leader, {}).setdefault(topic, []).extend(led)
        return routes

    def _list_offsets_once(self, targets, read_committed, epochs, found):
        """One attempt: asks for the partitions of ``targets`` not yet in ``found`` (the
        answers of earlier attempts), adds what the leaders answer to it; ``found`` once it
        has them all, else :class:`RetriableBrokerError`.

        A retry asks again only the partitions that failed, as Java's consumer does: a leader
        that moved, or one broker that is restarting, does not cost the answers of the other
        leaders -- on a new topic of thousands of partitions whose leaders take over one after
        the other, asking all of them again could fail on a different one every time."""
        rest = targets if not found else {tp: t for tp, t in targets.items() if tp not in found}
        if rest:
            try:
                self._list_offsets_by_leader(rest, read_committed, epochs, found)
            except RetriableBrokerError:
                # A leader moved, or a broker went: look them up again.
                self.forget_leaders({tp[0] for tp in rest if tp not in found})
                raise
        return found

    def _list_offsets_by_leader(self, targets, read_committed, epochs, found):
        # Each partition goes with the newest leader epoch seen (KIP-320): a broker with
        # another epoch answers FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH (retriable)
        # instead of its own log's offsets.
        routes = self._cached_routes(targets)
        if routes is None:
            epoch = self.view.epoch
            routes = {}
            for leader, tps in self._by_leader(targets).items():
                topics = routes.setdefault(leader, {})
                for tp in tps:
                    topics.setdefault(tp[0], []).append((tp[1], epoch(tp), targets[tp]))
        # One request per leader, all in flight together (BrokerTransport.send_all); what the
        # leaders that answered say is kept when another one fails.
        responses = self.send_all([
            (leader, LeanListOffsetsRequest(topics, read_committed=read_committed,
                                            timeout_ms=self.request_timeout_ms))
            for leader, topics in routes.items()], partial=True)
        failed = _Failures()
        for response in failed.answered(responses):
            for topic in response.topics:
                # Rows are (partition, error code, timestamp, offset, leader epoch, ...)
                name, rows = topic.name, topic.rows     # (planning_protocol.OffsetsTopic)
                if any(map(_SECOND, rows)):             # errors: rare
                    for r in rows:
                        if r[1]:
                            err = error_for(r[1])
                            if not getattr(err, "retriable", False):
                                raise TopicError(f"Could not list offsets of {name}-{r[0]}: "
                                                 f"{err.__name__}")
                            failed.add(f"{name}-{r[0]}: {err.__name__}")
                    rows = [r for r in rows if not r[1]]
                # Taken in passes that run in C, as in _cached_routes
                tps = list(zip(repeat(name), map(_FIRST, rows)))
                found.update(zip(tps, zip(map(_FOURTH, rows), map(_THIRD, rows))))
                if epochs is not None:
                    epochs.update(zip(tps, map(_FIFTH, rows)))
        failed.raise_if_any(targets, found)

    def epoch_end_offsets(self, epochs: Mapping[TopicPartition, int], *,
                          retries: Retries | None = None
                          ) -> dict[TopicPartition, tuple[int, int]] | None:
        """OffsetsForLeaderEpoch (API 23, v2+: Kafka 2.1+), asked of each partition's current
        leader: for leader epoch ``epochs[tp]``, ``(epoch, end_offset)`` -- the largest epoch
        not above it that the leader's log has, and where that epoch ends in the leader's log
        (the first offset of the next epoch; the log end for the current epoch). This is how
        Kafka's consumers find where a log diverged from the one they read (KIP-320):
        ``end_offset`` below a position read in that epoch means the log was truncated there.
        ``(-1, -1)`` when the leader has no record of an epoch that old.

        Each request carries the partition's current leader epoch from the newest metadata, so
        a broker that is not the leader of that epoch answers FENCED_LEADER_EPOCH or
        UNKNOWN_LEADER_EPOCH; those, NOT_LEADER_OR_FOLLOWER and no leader are retried under
        ``retries``, the leaders looked up again each time. None when the brokers do not have
        the API's version 2 (before Kafka 2.1): the caller then skips the validation.
        """
        if not epochs:
            return {}
        if retries is None:
            retries = Retries(window_ms=self.request_timeout_ms)
        found: dict[TopicPartition, tuple[int, int]] = {}
        try:
            return retries.run(lambda: self._epoch_end_offsets_once(epochs, found),
                               what="validate offsets (OffsetsForLeaderEpoch)",
                               where=self.bootstrap_servers)
        except (Errors.IncompatibleBrokerVersion, Errors.UnsupportedVersionError) as exc:
            log.info("The brokers at '%s' do not support OffsetsForLeaderEpoch v2+ (Kafka "
                     "2.1+): log truncation is not checked (%s)", self.bootstrap_servers, exc)
            return None

    def _epoch_end_offsets_once(self, epochs: Mapping[TopicPartition, int], found: dict):
        """One attempt over the partitions of ``epochs`` not yet in ``found``; as
        :meth:`_list_offsets_once`, a retry asks again only what failed."""
        rest = [tp for tp in epochs if tp not in found]
        by_leader = self._by_leader(rest)
        T = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
        P = T.OffsetForLeaderPartition
        requests = []
        for leader, tps in by_leader.items():
            topics: dict[str, list] = {}
            for topic, partition in sorted(tps):
                topics.setdefault(topic, []).append(P(
                    partition=partition, leader_epoch=epochs[(topic, partition)],
                    current_leader_epoch=self.view.epoch((topic, partition))))
            requests.append((leader, OffsetForLeaderEpochRequest(
                replica_id=-1, topics=[T(topic=t, partitions=ps) for t, ps in topics.items()],
                min_version=2)))
        failed = _Failures()
        for response in failed.answered(self.send_all(requests, partial=True)):   # all at once
            for topic in response.topics:
                for p in topic.partitions:
                    tp = (topic.topic, p.partition)
                    if p.error_code != 0:
                        err = error_for(p.error_code)
                        if getattr(err, "retriable", False) or err in (
                                Errors.NotLeaderForPartitionError,
                                Errors.UnknownTopicOrPartitionError):
                            failed.add(f"OffsetsForLeaderEpoch of {tp[0]}-{tp[1]}: "
                                       f"{err.__name__}")
                            continue
                        raise TopicError(f"Could not validate the position in "
                                         f"{tp[0]}-{tp[1]} (OffsetsForLeaderEpoch): "
                                         f"{err.__name__}")
                    found[tp] = (p.leader_epoch, p.end_offset)
        failed.raise_if_any(rest, found)     # the retry looks the leaders up (:meth:`leaders`)
        return found

    # --- fetch ---------------------------------------------------------------------------

    def fetch_connections(self):
        """This client's dedicated Fetch connections, one per broker
        (:mod:`kafka_source.wire.net.fetch_connection`); closed with the client."""
        if self._fetch_connections is None:
            from .fetch_connection import FetchConnections  # noqa: PLC0415 - executor-only

            self._fetch_connections = FetchConnections(self.open_fetch_connection)
        return self._fetch_connections

    def open_fetch_connection(self, node_id: int):
        """A new Fetch connection to broker ``node_id``, set up by kafka-python with this
        client's settings (TLS, SASL), its socket then owned by the fetch loop."""
        from .fetch_connection import FetchConnection  # noqa: PLC0415 - executor-only

        self.bootstrap()
        broker = self._net.cluster.broker_metadata(node_id)
        if broker is None:
            self.metadata([])
            broker = self._net.cluster.broker_metadata(node_id)
        if broker is None:
            raise RetriableBrokerError(f"broker {node_id} is not in the cluster metadata")
        net, manager = self._network({**self._settings,
                                      "bootstrap_servers": f"{broker.host}:{broker.port}"})
        return FetchConnection.open(net, manager, self._settings, node_id, broker.host,
                                    broker.port, timeout_ms=self.request_timeout_ms)
