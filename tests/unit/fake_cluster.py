"""A scripted stand-in for :class:`kafka_source.wire.net.client.BrokerClient`.

It holds, per partition, a log of record batches (bytes crafted by ``record_builder``), a log
start offset and aborted-transaction entries, and answers ``fetch``/``list_offsets``/``leaders``
the way a broker would, so the fetch loop and offset planning can be tested without a broker and
on things the embedded broker cannot show (transactions, log truncation, leader moves).

``fetch_connections()`` hands the fetch loop fake Fetch connections (the interface of
:mod:`kafka_source.wire.net.fetch_connection`) that answer through ``fetch``. With ``sessions=True``
they also play the broker's side of fetch sessions (KIP-227: the session keeps partitions and
offsets; incremental responses leave out partitions with nothing new), driven by the real
client-side :class:`~kafka_source.wire.net.fetch_session.FetchSession`. With
``strict_batch_limit=True`` a record batch larger than a partition's byte limit is returned
only for the first partition that returns data, as Kafka does; otherwise always.
"""

from __future__ import annotations

import time

from dataclasses import dataclass, field
from types import SimpleNamespace

from kafka_source.errors import TopicNotFoundError
from kafka_source.wire.net.client import BrokerClient, PartitionInfo, RetriableBrokerError, TopicInfo
from kafka_source.wire.net.fetch_protocol import FetchResult, PartitionData
from kafka_source.wire.net.fetch_session import FetchSession
from kafka_source.wire.net.metadata_view import MetadataView

OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75


@dataclass
class FakeLog:
    batches: list = field(default_factory=list)     # record_builder.Batch objects, in order
    log_start: int = 0
    aborted: list = field(default_factory=list)     # (producer_id, first_offset)
    high_watermark: int | None = None               # default: last batch's last offset + 1
    timestamps: dict = field(default_factory=dict)  # timestamp -> offset for ListOffsets
    last_stable: int | None = None                  # default: the high watermark
    # The leader's epoch cache (KIP-320): (leader epoch, its first offset), ascending. Empty:
    # one epoch, the partition's current one, from offset 0.
    epoch_starts: list = field(default_factory=list)


class FakeCluster:
    def __init__(self, logs: dict, *, leader: int = 1, sessions: bool = False,
                 strict_batch_limit: bool = False):
        self.logs = logs
        self.leader = leader
        self.sessions = sessions
        self.strict_batch_limit = strict_batch_limit
        self.leaders_by_partition: dict = {}    # per-partition leader overrides
        # Leader epochs (KIP-320): what metadata says per partition (none: -1, a broker before
        # Kafka 2.1), and a broker's own epoch where it differs (a broker behind, or one that
        # still thinks it leads an older epoch). A Fetch with another epoch than the serving
        # broker's is answered FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH, as Kafka does.
        self.epochs: dict = {}
        self.broker_epochs: dict = {}            # (node, tp) -> epoch
        self.fetches: list[tuple[int, dict]] = []   # (node, {tp: offset}) the broker served
        self.requests: list = []                     # (node, SessionRequest) as sent
        self.opened: list = []                       # node of every connection opened
        self._connections = None
        self.script: list = []   # queued partition error codes / exceptions for the next fetches
        self.bootstrap_servers = "fake:9092"
        self.metadata_calls: list = []
        self.topic_errors: dict[str, list[int]] = {}   # topic -> queued error codes
        # topic -> its id (KIP-516, 16 bytes), as Kafka 2.8+ answers; absent: none, as older
        self.topic_ids: dict[str, bytes] = {}
        self.metadata_failures: list[Exception] = []    # raised by the next metadata() calls
        # What BrokerClient keeps of the answers; vanished partitions are believed after two
        # answers (no waiting: the time bound is tested with BrokerClient in test_client.py).
        self.view = MetadataView(confirm_ms=0)
        self.last_metadata_node = self.leader
        # OffsetsForLeaderEpoch: False plays brokers without its v2 (before Kafka 2.1);
        # epoch_requests records each call's {tp: epoch asked}.
        self.epoch_api = True
        self.epoch_requests: list[dict] = []
        self._leader_cache: dict = {}     # BrokerClient's, filled by leaders() as it fills it
        self.leader_lookups: list[list] = []           # the partitions of each leaders() call
        self.kraft = False                # see kraft_broker()

    def hw(self, tp) -> int:
        log = self.logs[tp]
        if log.high_watermark is not None:
            return log.high_watermark
        return log.batches[-1].last_offset + 1 if log.batches else log.log_start

    # --- BrokerClient API used by fetcher/offsets -------------------------------------------

    def metadata(self, topics, *, node=None):
        """Metadata as a broker answers it, without auto-creating topics; a topic with queued
        codes in ``topic_errors`` answers the next one instead. Queued exceptions in
        ``metadata_failures`` are raised first, one per call (e.g. a broker restarting)."""
        self.metadata_calls.append(None if topics is None else sorted(topics))
        if self.metadata_failures:
            raise self.metadata_failures.pop(0)
        names = sorted({t for t, _ in self.logs} | {"__consumer_offsets"}) if topics is None \
            else sorted(set(topics))
        result = {}
        for topic in names:
            queued = self.topic_errors.get(topic)
            if queued:
                result[topic] = TopicInfo(topic, queued.pop(0), {})
                continue
            parts = {p: PartitionInfo(self.leaders_by_partition.get((t, p), self.leader), 0,
                                      self.epochs.get((t, p), -1))
                     for t, p in self.logs if t == topic}
            if topic == "__consumer_offsets":
                parts = {0: PartitionInfo(self.leader, 0)}
            # What a broker answers for a topic that does not exist (no auto-creation).
            result[topic] = TopicInfo(topic, 0 if parts else UNKNOWN_TOPIC_OR_PARTITION, parts,
                                      self.topic_ids.get(topic) if parts else None)
        self.view.check_topic_ids(self.leader, {t: i.topic_id for t, i in result.items()
                                                if not i.error_code})
        self.view.seen(result)
        now = time.monotonic()       # BrokerClient keeps each answered topic's leaders too
        for topic, info in result.items():
            if not info.error_code:
                self._leader_cache[topic] = (now, {p: i.leader for p, i in info.partitions.items()})
        return result

    # The real retry loop around ``metadata`` (it only uses ``metadata``, ``view``,
    # ``bootstrap_servers`` and ``kraft_broker``), so planning is tested with the retries it
    # really has.
    topic_metadata = BrokerClient.topic_metadata
    checked_metadata = BrokerClient.checked_metadata
    _check_unknown = BrokerClient._check_unknown

    def kraft_broker(self, node) -> bool:
        """False: the fake plays a ZooKeeper-mode broker, whose unknown topics are checked
        against its whole topic list (``kraft`` True plays a KRaft one)."""
        return self.kraft

    def leaders(self, tps):
        for topic, partition in tps:
            if (topic, partition) not in self.logs:   # as BrokerClient.leaders answers it
                raise TopicNotFoundError(f"Topic '{topic}' does not exist on the Kafka cluster "
                                         f"at '{self.bootstrap_servers}'.")
        self.leader_lookups.append(list(tps))
        result = {tp: self.leaders_by_partition.get(tp, self.leader) for tp in tps}
        self.view.check_epochs(self.leader, {tp: self.epochs.get(tp, -1) for tp in tps})
        now = time.monotonic()
        for topic in {t for t, _ in tps}:
            self._leader_cache[topic] = (now, {p: self.leaders_by_partition.get((t, p), self.leader)
                                               for t, p in self.logs if t == topic})
        return result

    # The real cache over what leaders() answered (a worker's later tasks start from it).
    cached_leaders = BrokerClient.cached_leaders
    forget_leaders = BrokerClient.forget_leaders

    def fetch_connections(self):
        if self._connections is None:
            self._connections = FakeConnections(self)
        return self._connections

    def list_offsets(self, targets, *, read_committed, retries=None, epochs=None):
        """As a broker answers ListOffsets v4+: with ``epochs``, the leader's current epoch
        for latest, else the epoch of the record found."""
        out = {}
        for tp, target in targets.items():
            log = self.logs[tp]
            if target == -2:
                out[tp] = (log.log_start, -1)
            elif target == -1:
                lso = log.last_stable if read_committed else None
                out[tp] = (self.hw(tp) if lso is None else lso, -1)
            else:
                hits = sorted(o for ts, o in log.timestamps.items() if ts >= target)
                out[tp] = (hits[0] if hits else -1, target)
            if epochs is not None:
                epochs[tp] = self.epochs.get(tp, -1) if target == -1 \
                    else self.epoch_at(tp, out[tp][0])
        return out

    def epoch_at(self, tp, offset) -> int:
        """The leader epoch of the record at ``offset`` (-1: unknown)."""
        starts = self.logs[tp].epoch_starts or [(self.epochs.get(tp, -1), 0)]
        found = -1
        for epoch, start in starts:
            if start <= offset:
                found = epoch
        return found

    def epoch_end_offsets(self, epochs, *, retries=None):
        """OffsetsForLeaderEpoch as Kafka's leader answers it from its epoch cache
        (``LeaderEpochFileCache.endOffsetFor``): the current epoch ends at the log end; an
        older one where the next epoch the leader knows starts, reported with the largest
        epoch it knows not above the one asked; an epoch below all it knows ends where its
        first one starts; nothing known: (-1, -1)."""
        self.epoch_requests.append(dict(epochs))
        if not self.epoch_api:
            return None
        self.leaders(list(epochs))
        out = {}
        for tp, asked in epochs.items():
            log = self.logs[tp]
            starts = log.epoch_starts or [(self.epochs.get(tp, -1), 0)]
            latest = starts[-1][0]
            if asked < 0 or latest < 0:
                out[tp] = (-1, -1)
            elif asked >= latest:
                out[tp] = (latest, self.hw(tp)) if asked == latest else (-1, -1)
            else:
                higher = next(start for epoch, start in starts if epoch > asked)
                floor = [epoch for epoch, _ in starts if epoch <= asked]
                out[tp] = (floor[-1] if floor else asked, higher)
        return out

    def truncate(self, tp, at, *, new_epoch, new_end):
        """An unclean leader election: the new leader's log ends at ``at`` (it had nothing
        later), it leads ``new_epoch`` from there and has written up to ``new_end`` since."""
        log = self.logs[tp]
        starts = log.epoch_starts or [(self.epochs.get(tp, 0), 0)]
        log.epoch_starts = [(e, s) for e, s in starts if s < at or (e, s) == starts[0]]
        log.epoch_starts.append((new_epoch, at))
        log.high_watermark = new_end
        self.epochs[tp] = new_epoch

    def fetch(self, node_id, positions, *, epochs=None, **kw):
        """One Fetch served by broker ``node_id``: ``partition_max_bytes`` is an int or a dict
        per partition. Scripted steps (an error code for every partition, or an exception to
        raise) come first."""
        self.fetches.append((node_id, dict(positions)))
        limits = kw.get("partition_max_bytes", 1 << 20)
        if self.script:
            step = self.script.pop(0)
            if isinstance(step, Exception):
                raise step
            return self._response(positions, errors={tp: step for tp in positions})
        errors = {tp: NOT_LEADER_OR_FOLLOWER for tp in positions
                  if self.leaders_by_partition.get(tp, self.leader) != node_id}
        for tp, asked in (epochs or {}).items():
            own = self.broker_epochs.get((node_id, tp), self.epochs.get(tp, -1))
            if tp not in errors and asked >= 0 and own >= 0 and asked != own:
                errors[tp] = FENCED_LEADER_EPOCH if asked < own else UNKNOWN_LEADER_EPOCH
        return self._response(positions, errors=errors, max_bytes=limits)

    def _response(self, positions, *, errors, max_bytes=1 << 20):
        topics = {}
        first = True   # Kafka returns an oversized batch only for the first partition with data
        for (topic, partition), offset in positions.items():
            tp = (topic, partition)
            log = self.logs.get(tp)
            if log is None:                   # deleted: what a broker answers for it
                topics.setdefault(topic, []).append(SimpleNamespace(
                    partition_index=partition, error_code=UNKNOWN_TOPIC_OR_PARTITION,
                    high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
                    aborted_transactions=[], records=b""))
                continue
            error = errors.get(tp, 0)
            limit = max_bytes.get(tp, 1 << 20) if isinstance(max_bytes, dict) else max_bytes
            data = b""
            if not error:
                if offset < log.log_start or offset > self.hw(tp):
                    error = OFFSET_OUT_OF_RANGE
                else:
                    for b in log.batches:
                        if b.last_offset >= offset and b.base_offset < self.hw(tp):
                            if len(data) + len(b.data) > limit:
                                if data:   # the byte limit cuts the last batch
                                    data += b.data[: max(0, limit - len(data))]
                                    break
                                if self.strict_batch_limit and not first:
                                    break
                                # an oversized first batch is returned whole (KIP-74)
                            data += b.data
                if data:
                    first = False
            aborted = [SimpleNamespace(producer_id=p, first_offset=f) for p, f in log.aborted]
            topics.setdefault(topic, []).append(SimpleNamespace(
                partition_index=partition, error_code=error,
                high_watermark=self.hw(tp), last_stable_offset=-1,
                log_start_offset=log.log_start, aborted_transactions=aborted,
                records=data))
        return SimpleNamespace(responses=[SimpleNamespace(topic=t, partitions=ps)
                                          for t, ps in topics.items()])


class FakeConnections:
    """The pool of fake Fetch connections (:class:`kafka_source.wire.net.fetch_connection.FetchConnections`)."""

    def __init__(self, cluster: FakeCluster):
        self.cluster = cluster
        self.size_hints: dict = {}
        self._conns: dict = {}

    def get(self, node_id):
        conn = self._conns.get(node_id)
        if conn is None or conn.closed:
            conn = self._conns[node_id] = FakeFetchConnection(self.cluster, node_id)
            self.cluster.opened.append(node_id)
        return conn

    def discard(self, node_id):
        conn = self._conns.pop(node_id, None)
        if conn is not None:
            conn.close()

    def discard_in_flight(self):
        for node_id, conn in list(self._conns.items()):
            if conn.in_flight or conn.closed:
                self.discard(node_id)

    def close(self):
        for node_id in list(self._conns):
            self.discard(node_id)


_session_ids = iter(range(1000, 1 << 30))


class FakeFetchConnection:
    """A Fetch connection to one fake broker, with the broker's side of a fetch session."""

    expired = False

    def __init__(self, cluster: FakeCluster, node_id):
        self.cluster = cluster
        self.node_id = node_id
        self.session = FetchSession(cluster.sessions)
        self.closed = False
        self._pending = None
        # broker side: session id -> {tp: FetchPartitionRequest}, and the last high watermark
        # reported per partition (an incremental response includes a partition when it changed)
        self._broker = None
        self._reported: dict = {}

    @property
    def in_flight(self):
        return self._pending is not None

    def send(self, wanted, *, max_wait_ms, min_bytes, max_bytes, read_committed):
        assert self._pending is None, "one request in flight per connection"
        assert not self.closed
        request = self.session.build(wanted)
        self.cluster.requests.append((self.node_id, request))
        self._pending = request

    def receive(self):
        request, self._pending = self._pending, None
        assert request is not None, "receive without a request in flight"
        if not self.cluster.sessions:
            fetching, session_id = dict(request.partitions), 0
        elif request.full:
            self._broker = dict(request.partitions)
            self._reported = {}
            fetching, session_id = self._broker, next(_session_ids)
        else:
            for tp in request.forgotten:
                self._broker.pop(tp, None)
            self._broker.update(request.partitions)
            fetching, session_id = self._broker, self.session.session_id
        try:
            response = self.cluster.fetch(
                self.node_id, {tp: p.offset for tp, p in fetching.items()},
                epochs={tp: p.leader_epoch for tp, p in fetching.items()},
                partition_max_bytes={tp: p.max_bytes for tp, p in fetching.items()})
        except Exception:
            self.close()
            raise
        result = FetchResult(0, session_id)
        for t in response.responses:
            for p in t.partitions:
                tp = (t.topic, p.partition_index)
                if not request.full and not p.records and not p.error_code \
                        and self._reported.get(tp) == p.high_watermark:
                    continue   # incremental: nothing new for this partition
                self._reported[tp] = p.high_watermark
                result.partitions[tp] = PartitionData(
                    p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
                    [(a.producer_id, a.first_offset) for a in p.aborted_transactions],
                    memoryview(bytes(p.records)))
        self.session.done(0, session_id)
        result.requested = request.wanted
        result.full = request.full
        return result

    def close(self):
        if self._pending is not None:
            self.session.abandon()
        self._pending = None
        self.closed = True


def unreachable(message="connection refused"):
    return RetriableBrokerError(message)
