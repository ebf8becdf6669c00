"""An in-process coordinator of the consumer group protocol (KIP-848), and a client for it.

:class:`FakeConsumerGroupCoordinator` keeps the rules of Kafka 4.0's coordinator that
:class:`kafka_source.group.consumer_protocol.ConsumerProtocolMember` relies on, closely enough to
test it:

* ConsumerGroupHeartbeat with epoch 0 joins (a member id the coordinator does not know is taken
  as the member's own, KIP-1082), -1 leaves, -2 leaves as a static member (its instance id and
  assignment are kept for the next member joining with it); any other epoch must be the
  member's current one (else FENCED_MEMBER_EPOCH; an unknown member id: UNKNOWN_MEMBER_ID).
* The coordinator assigns (``uniform`` or ``range`` offered; another server assignor is answered
  UNSUPPORTED_ASSIGNOR): every member's target is a round-robin share of the partitions of the
  topics it subscribes to. Assignment is incremental, as in Kafka: a partition goes to its new
  member only once its previous member's heartbeat no longer lists it as owned, and a member
  that still owns partitions it must revoke gets the revocation (its assignment without them, the
  same epoch) before anything new. A member whose assignment grew gets a new epoch. The
  assignment is sent only when it changed.
* OffsetCommit needs v9 from a member (UNSUPPORTED_VERSION before, as Kafka 4.0 answers); an
  unknown member gets UNKNOWN_MEMBER_ID, an epoch older than the member's STALE_MEMBER_EPOCH, a
  newer one FENCED_MEMBER_EPOCH. OffsetFetch v9 with a member id checks it the same way. Every
  commit is kept in :attr:`FakeConsumerGroupCoordinator.history`.
* ``api_versions`` says which APIs the broker has: ``{HEARTBEAT: None}`` is a broker without the
  protocol (Kafka 2.2): kafka-python fails such a request with IncompatibleBrokerVersion.
* :meth:`script` makes the next requests of a kind fail with an error code or an exception;
  :meth:`fence` and :meth:`expire` do what a missed rebalance timeout or session does.

Requests are encoded at the negotiated version and decoded back, as in ``fake_coordinator.py``,
so a field the version lacks is invisible here as on a broker. Metadata is answered with topic
ids only (the member asks for nothing else).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

import kafka.errors as Errors
from kafka.future import Future
from kafka.protocol.consumer import (OffsetCommitRequest, OffsetCommitResponse,
                                     OffsetFetchRequest, OffsetFetchResponse)
from kafka.protocol.metadata import MetadataRequest

from kafka_source.wire.net.group_protocol import (ConsumerGroupHeartbeatRequest,
                                                  ConsumerGroupHeartbeatResponse)

HEARTBEAT, OFFSET_COMMIT, OFFSET_FETCH, METADATA = "heartbeat", "offset_commit", \
    "offset_fetch", "metadata"
_KINDS = {ConsumerGroupHeartbeatRequest: HEARTBEAT, OffsetCommitRequest: OFFSET_COMMIT,
          OffsetFetchRequest: OFFSET_FETCH, MetadataRequest: METADATA}
NONE = 0
UNKNOWN_MEMBER_ID = Errors.UnknownMemberIdError.errno
FENCED_MEMBER_EPOCH = Errors.FencedMemberEpochError.errno
STALE_MEMBER_EPOCH = Errors.StaleMemberEpochError.errno
UNSUPPORTED_VERSION = Errors.UnsupportedVersionError.errno
UNSUPPORTED_ASSIGNOR = Errors.UnsupportedAssignorError.errno
UNRELEASED_INSTANCE_ID = Errors.UnreleasedInstanceIdError.errno
NOT_COORDINATOR = Errors.NotCoordinatorError.errno
GROUP_AUTHORIZATION_FAILED = Errors.GroupAuthorizationFailedError.errno
INVALID_REQUEST = Errors.InvalidRequestError.errno
ASSIGNORS = ("uniform", "range")


@dataclass
class Member:
    member_id: str
    epoch: int
    instance_id: str | None
    topics: tuple[str, ...]
    regex: str | None
    owned: set = field(default_factory=set)       # what its last heartbeat said it owns
    assigned: set = field(default_factory=set)    # what the coordinator last gave it
    left_static: bool = False                     # left with epoch -2


class FakeConsumerGroupCoordinator:
    def __init__(self, topics: dict[str, int], *, heartbeat_interval_ms: int = 20,
                 api_versions: dict | None = None):
        self.topics = dict(topics)
        self.topic_ids = {t: uuid.uuid4() for t in topics}
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.api_versions = {HEARTBEAT: 1, OFFSET_COMMIT: 9, OFFSET_FETCH: 9, METADATA: 12}
        self.api_versions.update(api_versions or {})
        self.members: dict[str, Member] = {}          # join order
        self.offsets: dict[tuple[str, int], int] = {}
        self.history: list[tuple[str, tuple[str, int], int, int]] = []  # member, tp, offset, epoch
        self.requests: list[tuple[str, object, int]] = []   # kind, decoded request, version
        self._scripts: list[tuple[str, object]] = []
        self._epoch = 0
        self._lock = threading.RLock()

    # --- test controls ------------------------------------------------------------------------

    def client(self) -> "FakeConsumerClient":
        return FakeConsumerClient(self)

    def script(self, kind: str, *items) -> None:
        with self._lock:
            self._scripts.extend((kind, item) for item in items)

    def sent(self, kind: str) -> list:
        with self._lock:
            return [r for k, r, _ in self.requests if k == kind]

    def fence(self, member_id: str) -> None:
        """The member missed its rebalance timeout: its epoch is no longer accepted."""
        with self._lock:
            self.members[member_id].epoch += 1000

    def expire(self, member_id: str) -> None:
        """The member's session expired: it is removed, its partitions are free."""
        with self._lock:
            del self.members[member_id]

    def add_member(self, topics, member_id: str | None = None) -> str:
        """Another member (e.g. a Java consumer) joins; it adopts what it is given at once."""
        member_id = member_id or str(uuid.uuid4())
        self.beat(member_id, 0, topics=list(topics), owned=[])
        return member_id

    def beat(self, member_id: str, epoch: int, *, topics=None, owned=()):
        """A heartbeat of a hand-driven member; returns (error, epoch, assignment as TPs)."""
        request = ConsumerGroupHeartbeatRequest(
            group_id="g", member_id=member_id, member_epoch=epoch, subscribed_topic_names=topics,
            rebalance_timeout_ms=30_000,
            topic_partitions=[ConsumerGroupHeartbeatRequest.TopicPartitions(
                topic_id=self.topic_ids[t], partitions=[p]) for t, p in sorted(owned)])
        response = self._send(None, request)
        assignment = None if response.assignment is None else sorted(self._names(
            response.assignment.topic_partitions))
        return response.error_code, response.member_epoch, assignment

    def assigned(self, member_id: str) -> list:
        with self._lock:
            return sorted(self.members[member_id].assigned)

    # --- the coordinator ----------------------------------------------------------------------

    def _names(self, topic_partitions) -> set:
        by_id = {v: k for k, v in self.topic_ids.items()}
        return {(by_id[tp.topic_id], p) for tp in topic_partitions for p in tp.partitions}

    def _send(self, node, request):
        kind = _KINDS[type(request)]
        broker_max = self.api_versions[kind]
        low = request._min_version or 0
        if broker_max is None or low > broker_max:
            name = type(request).__name__.removesuffix("Request")
            raise Errors.IncompatibleBrokerVersion(
                f"No version of the '{name}' Kafka protocol is supported by both the client "
                f"and broker [{'none' if broker_max is None else f'0-{broker_max}'}].")
        version = min(request._max_version if request._max_version is not None
                      else type(request).max_version, broker_max)
        if kind == METADATA:
            with self._lock:
                self.requests.append((kind, request, version))
                return SimpleNamespace(topics=[SimpleNamespace(
                    name=t, topic_id=self.topic_ids[t], error_code=0) for t in self.topics])
        wire = type(request).decode(request.encode(version=version), version=version)
        with self._lock:
            self.requests.append((kind, wire, version))
            item = next(((i, it) for i, (k, it) in enumerate(self._scripts) if k == kind), None)
            if item is not None:
                del self._scripts[item[0]]
                if isinstance(item[1], BaseException):
                    raise item[1]
                response = self._error(kind, wire, version, item[1])
            else:
                response = getattr(self, f"_handle_{kind}")(wire, version)
        return type(response).decode(response.encode(version=version), version=version)

    def _error(self, kind, wire, version, code):
        if kind == HEARTBEAT:
            return _heartbeat_response(version, code, message=f"scripted {code}")
        if kind == OFFSET_COMMIT:
            return _commit_response(version, [(t.name, p.partition_index, code)
                                              for t in wire.topics for p in t.partitions])
        return _fetch_response(version, [], code)

    def _target(self, member: Member) -> set:
        active = [m for m in self.members.values() if not m.left_static]
        partitions = sorted((t, p) for t in sorted(set(member.topics)) if t in self.topics
                            for p in range(self.topics[t]))
        result = set()
        for i, tp in enumerate(partitions):
            takers = [m for m in active if tp[0] in m.topics]
            if takers[i % len(takers)] is member:
                result.add(tp)
        return result

    def _handle_heartbeat(self, wire, version):
        member_id, epoch = wire.member_id, wire.member_epoch
        if wire.server_assignor is not None and wire.server_assignor not in ASSIGNORS:
            return _heartbeat_response(version, UNSUPPORTED_ASSIGNOR, message=(
                f"ServerAssignor {wire.server_assignor} is not supported. Supported assignors: "
                f"{', '.join(ASSIGNORS)}."))
        if epoch in (-1, -2):
            member = self.members.get(member_id)
            if member is None:
                return _heartbeat_response(version, UNKNOWN_MEMBER_ID)
            if epoch == -2 and member.instance_id is not None:
                member.left_static = True
            else:
                del self.members[member_id]
            return _heartbeat_response(version, NONE, member_id=member_id, epoch=epoch)
        if epoch == 0:
            member = self._join(wire)
            if isinstance(member, int):
                return _heartbeat_response(version, member)
        else:
            member = self.members.get(member_id)
            if member is None:
                return _heartbeat_response(version, UNKNOWN_MEMBER_ID, message=(
                    f"Member {member_id} is not a member of group {wire.group_id}."))
            if epoch != member.epoch:
                return _heartbeat_response(version, FENCED_MEMBER_EPOCH)
        if wire.subscribed_topic_names is not None:
            member.topics = tuple(wire.subscribed_topic_names)
        if wire.topic_partitions is not None:
            member.owned = self._names(wire.topic_partitions)
        changed = self._reconcile(member) or epoch == 0
        return _heartbeat_response(
            version, NONE, member_id=member.member_id, epoch=member.epoch,
            interval=self.heartbeat_interval_ms,
            assignment=self._assignment(member.assigned) if changed else None)

    def _join(self, wire):
        old = self.members.get(wire.member_id)
        if wire.instance_id is not None:
            holder = next((m for m in self.members.values()
                           if m.instance_id == wire.instance_id and m.member_id != wire.member_id),
                          None)
            if holder is not None and not holder.left_static:
                return UNRELEASED_INSTANCE_ID
            if holder is not None:           # takes the static member's place and partitions
                del self.members[holder.member_id]
                self._epoch += 1
                member = Member(wire.member_id, self._epoch, wire.instance_id,
                                tuple(wire.subscribed_topic_names or ()), None,
                                assigned=set(holder.assigned))
                self.members[member.member_id] = member
                return member
        self._epoch += 1
        if old is not None:                  # a fenced member rejoining: it owns nothing
            old.epoch, old.owned, old.assigned = self._epoch, set(), set()
            return old
        member = Member(wire.member_id, self._epoch, wire.instance_id,
                        tuple(wire.subscribed_topic_names or ()),
                        getattr(wire, "subscribed_topic_regex", None))
        self.members[member.member_id] = member
        return member

    def _reconcile(self, member: Member) -> bool:
        """Move ``member`` towards its target; True if its assignment changed."""
        target = self._target(member)
        keep = member.assigned & target
        if member.owned - target:            # revocation first, same epoch
            changed = keep != member.assigned
            member.assigned = keep
            return changed
        others = set()
        for m in self.members.values():
            if m is not member:
                others |= m.owned | m.assigned
        new = {tp for tp in target - keep if tp not in others}
        if keep == member.assigned and not new:
            return False
        member.assigned = keep | new
        if new:
            self._epoch += 1
            member.epoch = self._epoch
        return True

    def _assignment(self, partitions):
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(partitions):
            by_topic.setdefault(t, []).append(p)
        A = ConsumerGroupHeartbeatResponse.Assignment
        return A(topic_partitions=[A.TopicPartitions(topic_id=self.topic_ids[t], partitions=ps)
                                   for t, ps in by_topic.items()])

    def _member_check(self, member_id, epoch) -> int:
        member = self.members.get(member_id)
        if member is None:
            return UNKNOWN_MEMBER_ID
        if epoch < member.epoch:
            return STALE_MEMBER_EPOCH
        if epoch > member.epoch:
            return FENCED_MEMBER_EPOCH
        return NONE

    def _handle_offset_commit(self, wire, version):
        member_id, epoch = wire.member_id, wire.generation_id_or_member_epoch
        code = NONE
        if member_id or epoch >= 0:
            code = UNSUPPORTED_VERSION if version < 9 else self._member_check(member_id, epoch)
        rows = []
        for t in wire.topics:
            for p in t.partitions:
                tp = (t.name, p.partition_index)
                if code == NONE:
                    self.offsets[tp] = p.committed_offset
                    self.history.append((member_id, tp, p.committed_offset, epoch))
                rows.append((t.name, p.partition_index, code))
        return _commit_response(version, rows)

    def _handle_offset_fetch(self, wire, version):
        group = wire.groups[0]
        code = NONE
        if version >= 9 and group.member_id is not None:
            code = self._member_check(group.member_id, group.member_epoch)
        rows = [] if code else [(t.name, p, self.offsets.get((t.name, p), -1))
                                for t in group.topics for p in t.partition_indexes]
        return _fetch_response(version, rows, code)


def _heartbeat_response(version, code, *, member_id=None, epoch=0, interval=0, assignment=None,
                        message=None):
    return ConsumerGroupHeartbeatResponse(
        version=version, throttle_time_ms=0, error_code=code, error_message=message,
        member_id=member_id, member_epoch=epoch, heartbeat_interval_ms=interval,
        assignment=assignment)


def _commit_response(version, rows):
    T = OffsetCommitResponse.OffsetCommitResponseTopic
    P = T.OffsetCommitResponsePartition
    by_topic: dict[str, list] = {}
    for topic, partition, code in rows:
        by_topic.setdefault(topic, []).append(P(partition_index=partition, error_code=code))
    return OffsetCommitResponse(version=version, throttle_time_ms=0,
                                topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()])


def _fetch_response(version, rows, code):
    G = OffsetFetchResponse.OffsetFetchResponseGroup
    T = G.OffsetFetchResponseTopics
    P = T.OffsetFetchResponsePartitions
    by_topic: dict[str, list] = {}
    for topic, partition, offset in rows:
        by_topic.setdefault(topic, []).append(P(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
            metadata="", error_code=NONE))
    return OffsetFetchResponse(version=version, throttle_time_ms=0, groups=[
        G(group_id="g", topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()],
          error_code=code)])


class FakeConsumerClient:
    """The part of ``BrokerClient`` the member uses, talking to the fake coordinator."""

    def __init__(self, coordinator: FakeConsumerGroupCoordinator):
        self.coordinator = coordinator
        self.closed = False
        self._answers: list = []

    def find_coordinator(self, group_id: str):
        return 1

    def send(self, node_id, request, timeout_ms: int | None = None):
        if self.closed:
            raise RuntimeError("fake client used after close()")
        return self.coordinator._send(node_id, request)

    def send_now(self, node_id, request, timeout_ms: int | None = None) -> Future:
        future = Future()
        try:
            self._answers.append((future, self.send(node_id, request), False))
        except Exception as exc:
            self._answers.append((future, exc, True))
        return future

    def poll(self, timeout_ms: float) -> None:
        answers, self._answers = self._answers, []
        for future, value, failed in answers:
            future.failure(value) if failed else future.success(value)

    def close(self) -> None:
        self.closed = True
