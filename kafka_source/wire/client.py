"""A small Kafka protocol client shared by the driver (planning) and the executors (fetching).

It wraps kafka-python's network layer (connections, TLS/SASL, API version negotiation) and its
protocol message classes, and adds what this source needs on top: a bootstrap that fails within a
bounded time naming the address, metadata for named topics without auto-creating them, ListOffsets
grouped by partition leader, and the executors' dedicated Fetch connections, which kafka-python
sets up (TLS, SASL) and the fetch loop then reads from directly
(:mod:`kafka_source.wire.fetch_connection`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterable, Mapping

import kafka.errors as Errors
from kafka.net.compat import KafkaNetClient
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest, MetadataRequest

from ..config.client_config import connection_settings
from ..errors import BrokerUnavailableError, TopicError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

# ListOffsets special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

_RETRIABLE_NETWORK_ERRORS = (Errors.KafkaConnectionError, Errors.NodeNotReadyError,
                             Errors.KafkaTimeoutError, Errors.RequestTimedOutError)


@dataclass(frozen=True)
class PartitionInfo:
    leader: int  # -1 while no leader is available
    error_code: int


@dataclass(frozen=True)
class TopicInfo:
    name: str
    error_code: int
    partitions: Mapping[int, PartitionInfo]


class RetriableBrokerError(Exception):
    """A failure worth retrying after refreshing metadata (leader moved, broker restarting)."""


def error_for(code: int) -> type[Errors.KafkaError]:
    return Errors.for_code(code)


class BrokerClient:
    """Connections to one Kafka cluster. Not thread-safe: use one per thread."""

    def __init__(self, config: Mapping[str, object]):
        settings = connection_settings(config)
        self.bootstrap_servers = str(settings["bootstrap_servers"])
        self.request_timeout_ms = int(settings.get("request_timeout_ms", 30_000))
        self._settings = settings
        self._net = KafkaNetClient(**settings)
        self._bootstrapped = False
        self._fetch_connections = None
        # The leader of every partition looked up so far (planning orders tasks by it).
        self.known_leaders: dict[TopicPartition, int] = {}

    # --- lifecycle ------------------------------------------------------------------------

    def bootstrap(self, timeout_ms: int | None = None) -> None:
        if self._bootstrapped:
            return
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        try:
            self._net._manager.bootstrap(timeout_ms)
        except Errors.KafkaTimeoutError:
            raise BrokerUnavailableError(
                f"Could not reach any Kafka broker at '{self.bootstrap_servers}' (option "
                f"'kafka.bootstrap.servers') within {timeout_ms / 1000:.0f} s. Check the "
                "host:port list, that the brokers are up and reachable from this machine, and "
                "'kafka.security.protocol' if they need TLS or SASL.") from None
        except Errors.KafkaError as exc:
            raise BrokerUnavailableError(
                f"Could not connect to Kafka at '{self.bootstrap_servers}' (option "
                f"'kafka.bootstrap.servers'): {exc}") from exc
        self._bootstrapped = True

    def close(self) -> None:
        try:
            if self._fetch_connections is not None:
                self._fetch_connections.close()
            self._net.close()
        except Exception:  # closing must never mask the real outcome
            log.debug("error closing Kafka client", exc_info=True)

    def __enter__(self) -> "BrokerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- raw requests ----------------------------------------------------------------------

    def send(self, node_id: int | None, request, timeout_ms: int | None = None):
        """Send ``request`` to ``node_id`` (any broker when None) and wait for the response.

        Network failures are raised as :class:`RetriableBrokerError`.
        """
        self.bootstrap()
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        if node_id is None:
            node_id = self._net.least_loaded_node(bootstrap_fallback=True)
        try:
            return self._net.send_and_receive(node_id, request, timeout_ms=timeout_ms)
        except _RETRIABLE_NETWORK_ERRORS as exc:
            raise RetriableBrokerError(f"broker {node_id}: {exc}") from exc

    # --- metadata --------------------------------------------------------------------------

    def metadata(self, topics: Iterable[str] | None) -> dict[str, TopicInfo]:
        """Metadata of the named topics (all topics when None). Never creates topics."""
        names = None if topics is None else sorted(set(topics))
        request = MetadataRequest(
            topics=None if names is None else [MetadataRequest.MetadataRequestTopic(name=t)
                                               for t in names],
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        response = self.send(None, request)
        self._net.cluster.update_metadata(response)
        result = {}
        for topic in response.topics:
            parts = {p.partition_index: PartitionInfo(p.leader_id, p.error_code)
                     for p in topic.partitions}
            result[topic.name] = TopicInfo(topic.name, topic.error_code, parts)
        return result

    def partitions_of(self, topics: Iterable[str]) -> dict[str, list[int]]:
        """Partition ids of each topic; a clear error for topics that do not exist."""
        wanted = sorted(set(topics))
        infos = self.metadata(wanted)
        result = {}
        for topic in wanted:
            result[topic] = sorted(self._readable(topic, infos.get(topic)).partitions)
        return result

    def _readable(self, topic: str, info: TopicInfo | None) -> TopicInfo:
        """``info`` if the topic can be read; else TopicError, or RetriableBrokerError."""
        code = info.error_code if info else Errors.UnknownTopicOrPartitionError.errno
        if code == 0:
            return info
        err = error_for(code)
        if err is Errors.UnknownTopicOrPartitionError:
            raise TopicError(f"Topic '{topic}' does not exist on the Kafka cluster at "
                             f"'{self.bootstrap_servers}'.")
        if getattr(err, "retriable", False):
            raise RetriableBrokerError(f"topic '{topic}': {err.__name__}")
        raise TopicError(f"Topic '{topic}' cannot be read: {err.__name__} "
                         f"({getattr(err, 'description', '')}).")

    def leaders(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The current leader of each partition; RetriableBrokerError while one has none."""
        partitions = list(partitions)
        infos = self.metadata({t for t, _ in partitions})
        result = {}
        for topic, partition in partitions:
            info = self._readable(topic, infos.get(topic))
            part = info.partitions.get(partition)
            if part is None:
                raise TopicError(f"Topic '{topic}' has no partition {partition} (it has "
                                 f"partitions {sorted(info.partitions)}).")
            if part.leader < 0:
                raise RetriableBrokerError(f"{topic}-{partition} has no leader")
            result[(topic, partition)] = part.leader
        self.known_leaders.update(result)
        return result

    # --- group coordinator -------------------------------------------------------------------

    def find_coordinator(self, group_id: str) -> str | int:
        """The node id to send ``group_id``'s group requests to (a dedicated connection).

        Raises :class:`RetriableBrokerError` while the coordinator is unknown or moving, and
        ``kafka.errors`` exceptions for fatal answers (e.g. GroupAuthorizationFailedError).
        """
        # key/key_type serve v0-v3, coordinator_keys v4+; the connection picks the version.
        request = FindCoordinatorRequest(key=group_id, key_type=0, coordinator_keys=[group_id])
        response = self.send(None, request)
        result = response.coordinators[0] if response.coordinators else response
        err = error_for(result.error_code)
        if err is not Errors.NoError:
            if getattr(err, "retriable", False) or err in (Errors.CoordinatorNotAvailableError,
                                                           Errors.NotCoordinatorError):
                raise RetriableBrokerError(f"FindCoordinator for group '{group_id}': "
                                           f"{err.__name__}")
            raise err(f"FindCoordinator for group '{group_id}'")
        return self._net.cluster.add_coordinator(result, CoordinatorType.GROUP, group_id)

    # --- offsets ---------------------------------------------------------------------------

    def list_offsets(self, targets: Mapping[TopicPartition, int], *, read_committed: bool,
                     retries: int = 3, retry_interval_ms: int = 1000
                     ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets for each partition: target -2 earliest, -1 latest, else a timestamp (ms).

        Returns ``(offset, timestamp)``; offset is -1 when no record has a timestamp >= target.
        Retries retriable errors ``retries`` times, ``retry_interval_ms`` apart.
        """
        attempt = 0
        while True:
            try:
                return self._list_offsets_once(targets, read_committed)
            except RetriableBrokerError as exc:
                attempt += 1
                if attempt > retries:
                    raise BrokerUnavailableError(
                        f"Could not fetch offsets from Kafka at '{self.bootstrap_servers}' after "
                        f"{retries} retries (option 'fetchOffset.numRetries'): {exc}") from exc
                log.warning("Fetching offsets failed (%s); retry %d of %d in %d ms", exc, attempt,
                            retries, retry_interval_ms)
                time.sleep(retry_interval_ms / 1000)

    def _list_offsets_once(self, targets, read_committed):
        if not targets:
            return {}
        leaders = self.leaders(targets)
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp, leader in leaders.items():
            by_leader.setdefault(leader, []).append(tp)
        LT = ListOffsetsRequest.ListOffsetsTopic
        LP = LT.ListOffsetsPartition
        result = {}
        for leader, tps in by_leader.items():
            topics: dict[str, list] = {}
            for topic, partition in tps:
                topics.setdefault(topic, []).append(LP(
                    partition_index=partition, current_leader_epoch=-1,
                    timestamp=targets[(topic, partition)], max_num_offsets=1))
            request = ListOffsetsRequest(
                replica_id=-1, isolation_level=1 if read_committed else 0,
                topics=[LT(name=t, partitions=ps) for t, ps in topics.items()],
                timeout_ms=self.request_timeout_ms)
            response = self.send(leader, request)
            for topic in response.topics:
                for p in topic.partitions:
                    if p.error_code != 0:
                        err = error_for(p.error_code)
                        if getattr(err, "retriable", False):
                            raise RetriableBrokerError(f"{topic.name}-{p.partition_index}: "
                                                       f"{err.__name__}")
                        raise TopicError(f"Could not list offsets of {topic.name}-"
                                         f"{p.partition_index}: {err.__name__}")
                    offset = p.offset if response.version >= 1 else (
                        p.old_style_offsets[0] if p.old_style_offsets else -1)
                    result[(topic.name, p.partition_index)] = (offset, p.timestamp)
        return result

    # --- fetch ---------------------------------------------------------------------------

    def fetch_connections(self):
        """This client's dedicated Fetch connections, one per broker
        (:mod:`kafka_source.wire.fetch_connection`); closed with the client."""
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
        return FetchConnection.open(self._settings, node_id, broker.host, broker.port,
                                    timeout_ms=self.request_timeout_ms)
