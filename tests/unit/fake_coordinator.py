"""An in-process Kafka group coordinator, and a fake ``BrokerClient`` that talks to it.

:class:`FakeCoordinator` keeps the classic (eager) consumer-group state machine of Kafka's
``GroupCoordinator`` for any number of groups -- ``Empty`` -> ``PreparingRebalance`` ->
``CompletingRebalance`` -> ``Stable`` -- closely enough to test
:class:`kafka_source.group.member.GroupMember` against it:

* JoinGroup blocks until every known member has (re)joined or the rebalance timeout (the largest
  ``rebalance_timeout_ms`` of the members) has passed; members that did not rejoin are removed.
  The leader is the first member to join (kept while it stays in the group); the protocol is
  chosen by vote among the assignor names every member offers (none in common:
  INCONSISTENT_GROUP_PROTOCOL). A known follower that rejoins a Stable group with unchanged
  metadata gets the current generation back without a rebalance, as in Kafka.
* With ``require_member_id`` a first JoinGroup (v4+) is answered MEMBER_ID_REQUIRED with a new id
  (KIP-394); the member must join again with it.
* SyncGroup from a follower waits for the leader's; REBALANCE_IN_PROGRESS if a new rebalance
  starts meanwhile. Heartbeat: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS
  while PreparingRebalance. Sessions expire in :meth:`FakeCoordinator.expire_sessions` (driven by
  ``clock``; or on every request with ``auto_expire=True``).
* OffsetCommit is validated as Kafka's ``ClassicGroup.validateOffsetCommit`` does; OffsetFetch
  answers with the committed offsets (-1 where there is none).
* Static membership (KIP-345; JoinGroup v5+, SyncGroup and Heartbeat v3+, OffsetCommit v7+): a
  member joining with a ``group_instance_id`` and no member id never gets MEMBER_ID_REQUIRED; if
  the instance id is known it replaces the old member id (whose requests are then answered
  FENCED_INSTANCE_ID) and, in a Stable group whose protocol stays, gets the current generation and
  its stored assignment with no rebalance. The leader's replacement learns it leads, with the
  members and ``skip_assignment``, only from JoinGroup v9 (KIP-814); before that it is answered
  the old leader id, as a follower. A request whose ``min_version`` the broker's
  :attr:`FakeCoordinator.api_versions` lack fails as kafka-python fails it
  (IncompatibleBrokerVersion), e.g. JoinGroup v5 on a Kafka 2.2 (``api_versions={JOIN: 4}``).

Requests go through the wire format: each one is encoded at the version a real client would
negotiate (the request's ``max_version`` capped by :attr:`FakeCoordinator.api_versions`) and
decoded back, and responses are real kafka-python response objects, encoded and decoded too. So a
field that does not exist in the negotiated version is invisible to the fake, as to a broker.

Failures are scripted per request kind with :meth:`FakeCoordinator.script` (error codes, kafka
error classes, or exceptions raised by ``send``, e.g. ``RetriableBrokerError`` for a network
failure); the coordinator can move (:meth:`move_coordinator`: requests to the old node get
NOT_COORDINATOR) or be unavailable (``available = False``), or be unable to write offsets only
(``commit_error``, e.g. COORDINATOR_NOT_AVAILABLE as when the offsets topic lacks in-sync
replicas: OffsetCommit fails, everything else works). Every request is recorded
(:attr:`FakeCoordinator.requests`, :meth:`FakeCoordinator.sent`).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable

import kafka.errors as Errors
from kafka.future import Future
from kafka.protocol.consumer import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
                                     JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
                                     OffsetCommitRequest, OffsetCommitResponse,
                                     OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest,
                                     SyncGroupResponse)

from kafka_source.wire.net.client import (BrokerClient, PartitionInfo, RetriableBrokerError,
                                     TopicInfo)
from kafka_source.wire.net.metadata_view import MetadataView

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = Errors.UnknownTopicOrPartitionError.errno
COORDINATOR_LOAD_IN_PROGRESS = Errors.CoordinatorLoadInProgressError.errno
COORDINATOR_NOT_AVAILABLE = Errors.CoordinatorNotAvailableError.errno
NOT_COORDINATOR = Errors.NotCoordinatorError.errno
ILLEGAL_GENERATION = Errors.IllegalGenerationError.errno
INCONSISTENT_GROUP_PROTOCOL = Errors.InconsistentGroupProtocolError.errno
UNKNOWN_MEMBER_ID = Errors.UnknownMemberIdError.errno
INVALID_SESSION_TIMEOUT = Errors.InvalidSessionTimeoutError.errno
REBALANCE_IN_PROGRESS = Errors.RebalanceInProgressError.errno
GROUP_AUTHORIZATION_FAILED = Errors.GroupAuthorizationFailedError.errno
MEMBER_ID_REQUIRED = Errors.MemberIdRequiredError.errno
FENCED_INSTANCE_ID = Errors.FencedInstanceIdError.errno

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"

JOIN, SYNC, HEARTBEAT, LEAVE = "join", "sync", "heartbeat", "leave"
OFFSET_FETCH, OFFSET_COMMIT = "offset_fetch", "offset_commit"
FIND_COORDINATOR, METADATA = "find_coordinator", "metadata"

_KINDS = {JoinGroupRequest: JOIN, SyncGroupRequest: SYNC, HeartbeatRequest: HEARTBEAT,
          LeaveGroupRequest: LEAVE, OffsetFetchRequest: OFFSET_FETCH,
          OffsetCommitRequest: OFFSET_COMMIT}

# Highest versions a Kafka 3.7 broker supports.
BROKER_API_VERSIONS = {JOIN: 9, SYNC: 5, HEARTBEAT: 4, LEAVE: 5, OFFSET_FETCH: 9,
                       OFFSET_COMMIT: 9}

_POLL_S = 0.005  # how often blocked requests re-check deadlines


class CoordinatorShutDown(RuntimeError):
    """Raised by every request once the test is over (not retriable, so nothing retries)."""


def _code(error) -> int:
    """An error code from an int or a kafka error class."""
    if isinstance(error, int):
        return error
    if isinstance(error, type) and issubclass(error, Errors.KafkaError):
        return error.errno
    raise TypeError(f"not an error code or kafka error class: {error!r}")


@dataclass
class Member:
    member_id: str
    client_id: str
    protocol_type: str
    protocols: list                  # [(assignor name, subscription bytes)] in preference order
    session_timeout_ms: int
    rebalance_timeout_ms: int
    last_seen: float
    awaiting_join: bool = False
    joined_generation: int | None = None  # set when the join it waits in completes
    assignment: bytes = b""
    heartbeats: int = 0
    instance_id: str | None = None   # group.instance.id of a static member

    def metadata(self, protocol: str) -> bytes:
        return dict(self.protocols)[protocol]

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict = field(default_factory=dict)   # member id -> Member, in join order
    pending: dict = field(default_factory=dict)   # member id -> time (KIP-394)
    rebalance_deadline: float | None = None
    initial_delay_until: float = 0.0                  # group.initial.rebalance.delay.ms
    offsets: dict = field(default_factory=dict)   # (topic, partition) -> offset
    epochs: dict = field(default_factory=dict)    # (topic, partition) -> committed leader epoch
    completed_rebalances: int = 0                 # generations that reached Stable
    static_members: dict = field(default_factory=dict)   # instance id -> member id

    def remove(self, member_id: str) -> None:
        """Drop a member (and its instance id, if static)."""
        member = self.members.pop(member_id)
        if member.instance_id is not None and \
                self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]

    def validate_member(self, member_id: str, instance_id: str | None) -> int:
        """Kafka's ``ClassicGroup.validateMember``: a static member is known by its instance
        id, and a request with it from another member id is fenced."""
        if instance_id is not None:
            existing = self.static_members.get(instance_id)
            if existing is None:
                return UNKNOWN_MEMBER_ID
            return NONE if existing == member_id else FENCED_INSTANCE_ID
        return NONE if member_id in self.members else UNKNOWN_MEMBER_ID

    def gone(self, member_id: str, instance_id: str | None) -> int:
        """What a request of a member no longer in the group is answered: FENCED_INSTANCE_ID
        if another member took its instance id, else UNKNOWN_MEMBER_ID."""
        other = self.static_members.get(instance_id) if instance_id is not None else None
        return FENCED_INSTANCE_ID if other not in (None, member_id) else UNKNOWN_MEMBER_ID

    def assignment_of(self, member_id: str):
        from kafka_source.group.assignors import Assignment
        return Assignment.decode(self.members[member_id].assignment)


@dataclass(frozen=True)
class Sent:
    """One request as the coordinator received it (decoded at ``version``)."""
    kind: str
    client_id: str
    node: object
    request: object
    version: int
    thread: str
    at: float


UNKNOWN_SERVER_ERROR = -1


def _commit_batch_bytes(wire) -> int:
    """The record batch Kafka would write to __consumer_offsets for an OffsetCommit: the batch
    header (61 bytes) and per partition a record of about 10 bytes of framing, the key (version,
    group, topic, partition) and the value (version, offset, leader epoch, metadata, commit
    timestamp). Against Kafka 4.0's default 1,048,588 bytes this puts the limit where Kafka 4.0
    put it (kafka-python's commit of partition 0 of 19-byte topics under a 42-byte group id:
    10,000 partitions failed with UNKNOWN_SERVER_ERROR, 9,000 were committed)."""
    group = len(wire.group_id.encode())
    total = 61
    for t in wire.topics:
        for p in t.partitions:
            key = 2 + 2 + group + 2 + len(t.name.encode()) + 4
            value = 2 + 8 + 4 + 2 + len((p.committed_metadata or "").encode()) + 8
            total += 10 + key + value
    return total


class FakeCoordinator:
    """Topics (name -> partition count), one coordinator node and its consumer groups."""

    def __init__(self, topics: dict[str, int] | None = None, *, node_id: int = 1,
                 require_member_id: bool = False, min_session_timeout_ms: int = 6_000,
                 max_session_timeout_ms: int = 1_800_000,
                 api_versions: dict[str, int] | None = None,
                 member_id_factory: Callable[[str], str] | None = None,
                 clock: Callable[[], float] = time.monotonic, auto_expire: bool = False,
                 validate_commit_topics: bool = True, initial_rebalance_delay_ms: int = 0):
        self.topics = dict(topics or {})
        self.node_id = node_id
        self.available = True
        self.commit_error: int | None = None   # every OffsetCommit answers it while set
        # Kafka writes an OffsetCommit's offsets as one record batch in __consumer_offsets and
        # fails the whole commit when it exceeds that topic's max.message.bytes (Kafka 4.0:
        # UNKNOWN_SERVER_ERROR for every partition): the batch's bytes, from the offset key
        # (v1) and value (v3) schemas, when set.
        self.max_commit_batch_bytes: int | None = None
        self.require_member_id = require_member_id
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.api_versions = dict(BROKER_API_VERSIONS, **(api_versions or {}))
        self.member_id_factory = member_id_factory or (lambda cid: f"{cid}-{uuid.uuid4()}")
        self.clock = clock
        self.auto_expire = auto_expire
        self.validate_commit_topics = validate_commit_topics
        # group.initial.rebalance.delay.ms: the first join of an empty group completes no
        # sooner (Kafka also extends it while more members join; the fake does not).
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        # (topic, partition) -> error code OffsetFetch reports for it
        self.fetch_partition_errors: dict[tuple[str, int], int] = {}
        self.groups: dict[str, Group] = {}
        self.requests: list[Sent] = []
        self.find_coordinator_calls: list[tuple[str, str]] = []   # (client id, group id)
        self.metadata_calls: list[tuple[str, tuple[str, ...]]] = []  # (client id, topics)
        self.clients: list[FakeClient] = []
        self._scripts: list[list] = []   # [kind, item, member_id]
        self._cond = threading.Condition(threading.RLock())
        self._shut_down = False

    # --- test API ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Make every blocked and later request fail with :class:`CoordinatorShutDown` (a test's
        teardown: threads still waiting in JoinGroup/SyncGroup end at once)."""
        with self._cond:
            self._shut_down = True
            self._cond.notify_all()

    def _check_running(self) -> None:
        if self._shut_down:
            raise CoordinatorShutDown("the fake coordinator was shut down")

    def _wait(self, deadline: float, request: str) -> None:
        """Wait (holding the condition) for the group to change, or time the request out."""
        self._check_running()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RetriableBrokerError(f"{self.coordinator_node}: {request} request timed out "
                                       "(client side)")
        self._cond.wait(min(remaining, _POLL_S))

    def client(self, client_id: str = "fake-client", request_timeout_ms: int = 30_000
               ) -> "FakeClient":
        c = FakeClient(self, client_id, request_timeout_ms)
        with self._cond:
            self.clients.append(c)
        return c

    def group(self, group_id: str) -> Group:
        with self._cond:
            if group_id not in self.groups:
                self.groups[group_id] = Group(group_id)
            return self.groups[group_id]

    def script(self, kind: str, *items, member_id: str | None = None) -> None:
        """Queue outcomes for the next requests of ``kind`` (one per request, in order): an error
        code or kafka error class to answer with (OFFSET_COMMIT/OFFSET_FETCH also take a dict
        (topic, partition) -> code), or an exception for ``send`` (or ``find_coordinator`` /
        ``metadata``) to raise. ``member_id`` restricts an item to that member's requests."""
        with self._cond:
            for item in items:
                self._scripts.append([kind, item, member_id])

    def pending_scripts(self, kind: str | None = None) -> int:
        with self._cond:
            return sum(1 for k, _, _ in self._scripts if kind is None or k == kind)

    def sent(self, kind: str | None = None, *, client_id: str | None = None) -> list:
        """The requests received, optionally of one kind / from one client."""
        with self._cond:
            return [s.request for s in self.requests
                    if (kind is None or s.kind == kind)
                    and (client_id is None or s.client_id == client_id)]

    def records(self, kind: str | None = None) -> list[Sent]:
        with self._cond:
            return [s for s in self.requests if kind is None or s.kind == kind]

    def count(self, kind: str, **match) -> int:
        """Requests of ``kind`` whose attributes equal ``match``."""
        return sum(1 for r in self.sent(kind)
                   if all(getattr(r, k) == v for k, v in match.items()))

    def move_coordinator(self, node_id: int) -> None:
        """The group coordinator moves to ``node_id`` (group state moves with it)."""
        with self._cond:
            self.node_id = node_id
            self._cond.notify_all()

    @property
    def coordinator_node(self) -> str:
        return f"coordinator-{self.node_id}"

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 3.0) -> bool:
        """Wait (at most ``timeout`` s) until ``predicate()`` holds; evaluated under the lock."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._tick()
                if predicate():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.02))

    def state(self, group_id: str) -> str:
        with self._cond:
            return self.group(group_id).state

    def members(self, group_id: str) -> list[str]:
        with self._cond:
            return list(self.group(group_id).members)

    def awaiting_join(self, group_id: str) -> list[str]:
        with self._cond:
            return [m for m, x in self.group(group_id).members.items() if x.awaiting_join]

    def expire_sessions(self, now: float | None = None) -> list[str]:
        """Remove members (and pending member ids) whose session timed out; their ids."""
        with self._cond:
            removed = self._expire(self.clock() if now is None else now)
            self._cond.notify_all()
            return removed

    def remove_member(self, group_id: str, member_id: str) -> None:
        """Drop a member as a session expiry would."""
        with self._cond:
            g = self.group(group_id)
            g.remove(member_id)
            self._after_removal(g)
            self._cond.notify_all()

    def trigger_rebalance(self, group_id: str) -> None:
        """Start a rebalance (as a metadata change seen by the coordinator would)."""
        with self._cond:
            g = self.group(group_id)
            if g.state in (STABLE, COMPLETING_REBALANCE):
                self._prepare_rebalance(g)
            self._cond.notify_all()

    def commit_offsets(self, group_id: str, offsets: dict) -> None:
        """Store committed offsets directly (as an admin would)."""
        with self._cond:
            self.group(group_id).offsets.update(offsets)

    # --- entry points of FakeClient -----------------------------------------------------------

    def _find_coordinator(self, client: "FakeClient", group_id: str):
        with self._cond:
            self._check_running()
            self.find_coordinator_calls.append((client.client_id, group_id))
            item = self._take_script(FIND_COORDINATOR, None)
            available = self.available
            node = self.coordinator_node
        if item is not None:
            if isinstance(item, BaseException):
                raise item
            err = Errors.for_code(_code(item))
            if err.retriable or err in (Errors.CoordinatorNotAvailableError,
                                        Errors.NotCoordinatorError):
                raise RetriableBrokerError(f"FindCoordinator for group '{group_id}': "
                                           f"{err.__name__}")
            raise err(f"FindCoordinator for group '{group_id}'")
        if not available:
            raise RetriableBrokerError(f"FindCoordinator for group '{group_id}': "
                                       "CoordinatorNotAvailableError")
        return node

    def _metadata(self, client: "FakeClient", topics) -> dict[str, TopicInfo]:
        with self._cond:
            self._check_running()
            names = tuple(sorted(set(self.topics if topics is None else topics)))
            self.metadata_calls.append((client.client_id, names))
            item = self._take_script(METADATA, None)
            counts = dict(self.topics)
        if isinstance(item, BaseException):
            raise item
        result = {}
        for name in names:
            if item is not None:
                result[name] = TopicInfo(name, _code(item), {})
            elif name in counts:
                result[name] = TopicInfo(name, NONE, {p: PartitionInfo(self.node_id, NONE)
                                                      for p in range(counts[name])})
            else:
                result[name] = TopicInfo(name, UNKNOWN_TOPIC_OR_PARTITION, {})
        return result

    def _send(self, client: "FakeClient", node, request, timeout_ms: int):
        kind = next((k for cls, k in _KINDS.items() if isinstance(request, cls)), None)
        if kind is None:
            raise NotImplementedError(f"the fake coordinator does not answer {request!r}")
        version = min(request._max_version if request._max_version is not None
                      else type(request).max_version, self.api_versions[kind])
        min_version = request._min_version or 0
        if min_version > self.api_versions[kind]:
            # As kafka-python's BrokerVersionData.api_version fails the request's future.
            name = type(request).__name__.removesuffix("Request")
            client_max = request._max_version or type(request).max_version
            raise Errors.IncompatibleBrokerVersion(
                f"No version of the '{name}' Kafka protocol is supported by both the client "
                f"[{min_version}-{client_max}] and broker [0-{self.api_versions[kind]}].")
        wire = type(request).decode(request.encode(version=version), version=version)
        deadline = time.monotonic() + timeout_ms / 1000
        with self._cond:
            self._check_running()
            self.requests.append(Sent(kind, client.client_id, node, wire, version,
                                      threading.current_thread().name, self.clock()))
            item = self._take_script(kind, _member_of(kind, wire))
            self._tick()
            try:
                if isinstance(item, BaseException):
                    raise item
                if self.auto_expire:
                    self._expire(self.clock())
                if item is not None and not isinstance(item, dict):
                    response = self._scripted(kind, wire, version, client, item)
                elif not self.available:
                    response = self._error(kind, wire, version, COORDINATOR_NOT_AVAILABLE)
                elif kind == OFFSET_COMMIT and self.commit_error is not None:
                    response = self._error(kind, wire, version, self.commit_error)
                elif kind == OFFSET_COMMIT and self.max_commit_batch_bytes is not None and \
                        _commit_batch_bytes(wire) > self.max_commit_batch_bytes:
                    response = self._error(kind, wire, version, UNKNOWN_SERVER_ERROR)
                elif node != self.coordinator_node:
                    response = self._error(kind, wire, version, NOT_COORDINATOR)
                else:
                    handler = getattr(self, f"_handle_{kind}")
                    if kind in (OFFSET_COMMIT, OFFSET_FETCH):
                        response = handler(wire, version, item or {})
                    else:
                        response = handler(wire, version, client, deadline)
            finally:
                self._cond.notify_all()
        return type(response).decode(response.encode(version=version), version=version)

    # --- scripting ----------------------------------------------------------------------------

    def _take_script(self, kind: str, member_id):
        for i, (k, item, only) in enumerate(self._scripts):
            if k == kind and (only is None or only == member_id):
                del self._scripts[i]
                return item
        return None

    def _scripted(self, kind, wire, version, client, item):
        code = _code(item)
        if kind == JOIN and code == MEMBER_ID_REQUIRED:
            g = self.group(wire.group_id)
            new_id = self.member_id_factory(client.client_id)
            g.pending[new_id] = self.clock()
            return _join_response(version, MEMBER_ID_REQUIRED, member_id=new_id)
        return self._error(kind, wire, version, code)

    def _error(self, kind, wire, version, code):
        if kind == JOIN:
            return _join_response(version, code, member_id=wire.member_id)
        if kind == SYNC:
            return SyncGroupResponse(version=version, throttle_time_ms=0, error_code=code,
                                     protocol_type=None, protocol_name=None, assignment=b"")
        if kind == HEARTBEAT:
            return HeartbeatResponse(version=version, throttle_time_ms=0, error_code=code)
        if kind == LEAVE:
            return LeaveGroupResponse(version=version, throttle_time_ms=0, error_code=code,
                                      members=[])
        if kind == OFFSET_COMMIT:
            return _commit_response(version, [(t.name, p.partition_index, code)
                                              for t in wire.topics for p in t.partitions])
        if kind == OFFSET_FETCH:
            group_id, requested = _fetch_request(wire, version)
            if version >= 8:
                G = OffsetFetchResponse.OffsetFetchResponseGroup
                return OffsetFetchResponse(version=version, throttle_time_ms=0, groups=[
                    G(group_id=group_id, topics=[], error_code=code)])
            if version >= 2:
                return OffsetFetchResponse(version=version, throttle_time_ms=0, topics=[],
                                           error_code=code)
            # v0/v1 carry group errors in every partition
            return _fetch_response(version, group_id, [(t, p, -1, code)
                                                       for t, ps in requested for p in ps])
        raise AssertionError(kind)

    # --- JoinGroup ----------------------------------------------------------------------------

    def _handle_join(self, wire, version, client, deadline):
        g = self.group(wire.group_id)
        now = self.clock()
        protocols = [(p.name, bytes(p.metadata)) for p in wire.protocols]
        if not (self.min_session_timeout_ms <= wire.session_timeout_ms
                <= self.max_session_timeout_ms):
            return _join_response(version, INVALID_SESSION_TIMEOUT, member_id=wire.member_id)
        if not protocols or not self._supports(g, wire.member_id, wire.protocol_type,
                                               [n for n, _ in protocols]):
            return _join_response(version, INCONSISTENT_GROUP_PROTOCOL,
                                  member_id=wire.member_id)
        rebalance_timeout = wire.rebalance_timeout_ms if version >= 1 else \
            wire.session_timeout_ms
        member_id = wire.member_id
        instance_id = wire.group_instance_id if version >= 5 else None
        if instance_id is not None and member_id == "" and instance_id in g.static_members:
            new_id = self.member_id_factory(client.client_id)
            answer = self._replace_static_member(g, instance_id, new_id, client, wire, version,
                                                 protocols, rebalance_timeout)
            if answer is not None:
                return answer
            member_id = new_id
        elif member_id == "" or member_id in g.pending:
            if member_id == "":
                member_id = self.member_id_factory(client.client_id)
                # KIP-394 is for dynamic members: a static one is known by its instance id.
                if self.require_member_id and version >= 4 and instance_id is None:
                    g.pending[member_id] = now
                    return _join_response(version, MEMBER_ID_REQUIRED, member_id=member_id)
            else:
                del g.pending[member_id]
            member = Member(member_id, client.client_id, wire.protocol_type, protocols,
                            wire.session_timeout_ms, rebalance_timeout, now, awaiting_join=True,
                            instance_id=instance_id)
            g.members[member_id] = member
            if instance_id is not None:
                g.static_members[instance_id] = member_id
            if g.leader is None:
                g.leader = member_id
            if g.state != PREPARING_REBALANCE:
                self._prepare_rebalance(g)
        elif (code := g.validate_member(member_id, instance_id)) != NONE:
            return _join_response(version, code, member_id=member_id)
        else:
            member = g.members[member_id]
            changed = member.protocols != protocols
            member.protocols = protocols
            member.session_timeout_ms = wire.session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout
            member.last_seen = now
            if g.state == PREPARING_REBALANCE:
                member.awaiting_join = True
            elif not changed and (g.state == COMPLETING_REBALANCE
                                  or (g.state == STABLE and member_id != g.leader)):
                # The member lost the JoinGroup response, or is a follower rejoining with the
                # same subscription: it gets the current generation without a rebalance.
                return self._join_success(g, member_id, version)
            else:
                member.awaiting_join = True
                self._prepare_rebalance(g)
        self._cond.notify_all()
        while True:
            self._maybe_complete_join(g)
            if member_id not in g.members:
                return _join_response(version, g.gone(member_id, instance_id),
                                      member_id=member_id)
            member = g.members[member_id]
            if member.joined_generation is not None:
                member.joined_generation = None
                return self._join_success(g, member_id, version)
            self._wait(deadline, "JoinGroup")

    def _replace_static_member(self, g: Group, instance_id: str, new_id: str, client, wire,
                               version: int, protocols, rebalance_timeout: int):
        """A known static member joins again without its member id (a restart): Kafka's
        ``updateStaticMemberAndRebalance``. It takes the old member's place (and leadership) under
        ``new_id``; the old id is fenced. In a Stable group whose protocol stays, the answer is the
        current generation at once (None: the member waits for a rebalance like any other)."""
        old_id = g.static_members[instance_id]
        old_leader = g.leader
        old = g.members[old_id]
        member = Member(new_id, client.client_id, wire.protocol_type, protocols,
                        wire.session_timeout_ms, rebalance_timeout, self.clock(),
                        assignment=old.assignment, instance_id=instance_id)
        g.members = {(new_id if mid == old_id else mid): (member if mid == old_id else m)
                     for mid, m in g.members.items()}
        g.static_members[instance_id] = new_id
        if g.leader == old_id:
            g.leader = new_id
        if g.state == STABLE and self._select_protocol(g) == g.protocol:
            leads = g.leader == new_id
            M = JoinGroupResponse.JoinGroupResponseMember
            # KIP-814 (v9): the new leader learns that it leads but must not assign; before v9
            # it is given the old leader id, so that it does not assign.
            skip = leads and version >= 9
            return JoinGroupResponse(
                version=version, throttle_time_ms=0, error_code=NONE,
                generation_id=g.generation, protocol_type=g.protocol_type,
                protocol_name=g.protocol, leader=g.leader if version >= 9 else old_leader,
                skip_assignment=skip, member_id=new_id,
                members=[M(member_id=m.member_id, group_instance_id=m.instance_id,
                           metadata=m.metadata(g.protocol)) for m in g.members.values()]
                if skip else [])
        member.awaiting_join = True
        if g.state != PREPARING_REBALANCE:
            self._prepare_rebalance(g)
        return None

    def _supports(self, g: Group, member_id: str, protocol_type: str, names: list[str]) -> bool:
        others = [m for mid, m in g.members.items() if mid != member_id]
        if not others:
            return bool(protocol_type)
        if any(m.protocol_type != protocol_type for m in others):
            return False
        common = set(names)
        for m in others:
            common &= set(m.protocol_names())
        return bool(common)

    def _prepare_rebalance(self, g: Group) -> None:
        if g.state == EMPTY:
            g.initial_delay_until = self.clock() + self.initial_rebalance_delay_ms / 1000
        if g.state == COMPLETING_REBALANCE:
            for m in g.members.values():
                m.assignment = b""
        g.state = PREPARING_REBALANCE
        timeout_ms = max((m.rebalance_timeout_ms for m in g.members.values()), default=0)
        g.rebalance_deadline = self.clock() + timeout_ms / 1000

    def _tick(self) -> None:
        """What Kafka's timers do: complete joins whose rebalance timeout passed."""
        for g in self.groups.values():
            self._maybe_complete_join(g)

    def _maybe_complete_join(self, g: Group) -> None:
        if g.state != PREPARING_REBALANCE:
            return
        everyone = all(m.awaiting_join for m in g.members.values()) and not g.pending
        if not everyone and self.clock() < g.rebalance_deadline:
            return
        if self.clock() < g.initial_delay_until:
            return
        for member_id in [mid for mid, m in g.members.items() if not m.awaiting_join]:
            g.remove(member_id)
        g.generation += 1
        if not g.members:
            g.state, g.leader, g.protocol, g.protocol_type = EMPTY, None, None, None
            self._cond.notify_all()
            return
        first = next(iter(g.members.values()))
        g.protocol_type = first.protocol_type
        g.protocol = self._select_protocol(g)
        if g.leader not in g.members:
            g.leader = first.member_id
        g.state = COMPLETING_REBALANCE
        now = self.clock()
        for m in g.members.values():
            m.awaiting_join = False
            m.joined_generation = g.generation
            m.assignment = b""
            m.last_seen = now
        self._cond.notify_all()

    @staticmethod
    def _select_protocol(g: Group) -> str:
        members = list(g.members.values())
        candidates = [n for n in members[0].protocol_names()
                      if all(n in m.protocol_names() for m in members)]
        votes = {n: 0 for n in candidates}
        for m in members:
            votes[next(n for n in m.protocol_names() if n in votes)] += 1
        return max(candidates, key=lambda n: votes[n])

    def _join_success(self, g: Group, member_id: str, version: int):
        M = JoinGroupResponse.JoinGroupResponseMember
        members = ([M(member_id=m.member_id, group_instance_id=m.instance_id,
                      metadata=m.metadata(g.protocol)) for m in g.members.values()]
                   if member_id == g.leader else [])
        return JoinGroupResponse(
            version=version, throttle_time_ms=0, error_code=NONE, generation_id=g.generation,
            protocol_type=g.protocol_type, protocol_name=g.protocol, leader=g.leader,
            skip_assignment=False, member_id=member_id, members=members)

    # --- SyncGroup ----------------------------------------------------------------------------

    def _handle_sync(self, wire, version, client, deadline):
        g = self.groups.get(wire.group_id)
        member_id, generation = wire.member_id, wire.generation_id
        instance_id = wire.group_instance_id if version >= 3 else None

        def answer(code, assignment=b""):
            return SyncGroupResponse(version=version, throttle_time_ms=0, error_code=code,
                                     protocol_type=g.protocol_type if g else None,
                                     protocol_name=g.protocol if g else None,
                                     assignment=assignment)

        if g is None:
            return answer(UNKNOWN_MEMBER_ID)
        if (code := g.validate_member(member_id, instance_id)) != NONE:
            return answer(code)
        if generation != g.generation:
            return answer(ILLEGAL_GENERATION)
        if version >= 5 and ((wire.protocol_type is not None
                              and wire.protocol_type != g.protocol_type)
                             or (wire.protocol_name is not None
                                 and wire.protocol_name != g.protocol)):
            return answer(INCONSISTENT_GROUP_PROTOCOL)
        g.members[member_id].last_seen = self.clock()
        if g.state == PREPARING_REBALANCE:
            return answer(REBALANCE_IN_PROGRESS)
        if g.state == COMPLETING_REBALANCE and member_id == g.leader:
            given = {a.member_id: bytes(a.assignment) for a in wire.assignments}
            for m in g.members.values():
                m.assignment = given.get(m.member_id, b"")
            g.state = STABLE
            g.completed_rebalances += 1
            self._cond.notify_all()
        while True:
            if member_id not in g.members:
                return answer(g.gone(member_id, instance_id))
            if g.generation != generation or g.state == PREPARING_REBALANCE:
                return answer(REBALANCE_IN_PROGRESS)
            if g.state == STABLE:
                return answer(NONE, g.members[member_id].assignment)
            self._wait(deadline, "SyncGroup")

    # --- Heartbeat / LeaveGroup -----------------------------------------------------------------

    def _handle_heartbeat(self, wire, version, client, deadline):
        g = self.groups.get(wire.group_id)

        def answer(code):
            return HeartbeatResponse(version=version, throttle_time_ms=0, error_code=code)

        if g is None:
            return answer(UNKNOWN_MEMBER_ID)
        instance_id = wire.group_instance_id if version >= 3 else None
        if (code := g.validate_member(wire.member_id, instance_id)) != NONE:
            return answer(code)
        if wire.generation_id != g.generation:
            return answer(ILLEGAL_GENERATION)
        member = g.members[wire.member_id]
        member.last_seen = self.clock()
        member.heartbeats += 1
        if g.state == EMPTY:
            return answer(UNKNOWN_MEMBER_ID)
        if g.state == PREPARING_REBALANCE:
            return answer(REBALANCE_IN_PROGRESS)
        return answer(NONE)

    def _handle_leave(self, wire, version, client, deadline):
        g = self.groups.get(wire.group_id)
        ids = [(m.member_id, m.group_instance_id) for m in wire.members] if version >= 3 \
            else [(wire.member_id, None)]
        results = []
        removed = False
        for member_id, instance_id in ids:
            if instance_id is not None:
                # A static member leaves by its instance id (the member id may be unknown: an
                # admin removing it); another member's id with it is fenced.
                existing = g.static_members.get(instance_id) if g is not None else None
                if existing is None:
                    results.append((member_id, UNKNOWN_MEMBER_ID))
                elif member_id not in ("", existing):
                    results.append((member_id, FENCED_INSTANCE_ID))
                else:
                    g.remove(existing)
                    removed = True
                    results.append((existing, NONE))
            elif g is not None and member_id in g.members:
                g.remove(member_id)
                removed = True
                results.append((member_id, NONE))
            elif g is not None and member_id in g.pending:
                del g.pending[member_id]
                removed = True
                results.append((member_id, NONE))
            else:
                results.append((member_id, UNKNOWN_MEMBER_ID))
        if removed:
            self._after_removal(g)
        R = LeaveGroupResponse.MemberResponse
        if version >= 3:
            return LeaveGroupResponse(version=version, throttle_time_ms=0, error_code=NONE,
                                      members=[R(member_id=m, group_instance_id=None,
                                                 error_code=c) for m, c in results])
        return LeaveGroupResponse(version=version, throttle_time_ms=0,
                                  error_code=results[0][1], members=[])

    def _after_removal(self, g: Group) -> None:
        if g.leader not in g.members:
            g.leader = next(iter(g.members), None)
        if g.state in (STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(g)
        self._maybe_complete_join(g)

    def _expire(self, now: float) -> list[str]:
        removed = []
        for g in self.groups.values():
            dropped = [mid for mid, m in g.members.items()
                       if not m.awaiting_join and now - m.last_seen > m.session_timeout_ms / 1000]
            for mid in dropped:
                g.remove(mid)
            stale = [mid for mid, t in g.pending.items() if now - t > 10.0]
            for mid in stale:
                del g.pending[mid]
            if dropped or stale:
                self._after_removal(g)
            removed += dropped + stale
        return removed

    # --- offsets ------------------------------------------------------------------------------

    def _handle_offset_commit(self, wire, version, partition_errors):
        g = self.groups.get(wire.group_id)
        generation = wire.generation_id_or_member_epoch if version >= 1 else -1
        member_id = wire.member_id if version >= 1 else ""
        code = NONE
        if g is None:
            if generation < 0 and not member_id:
                g = self.group(wire.group_id)   # a "simple" group that only stores offsets
            else:
                code = ILLEGAL_GENERATION
        elif generation >= 0 or member_id:
            instance_id = wire.group_instance_id if version >= 7 else None
            if (code := g.validate_member(member_id, instance_id)) != NONE:
                pass
            elif generation != g.generation:
                code = ILLEGAL_GENERATION
            elif g.state == COMPLETING_REBALANCE:
                code = REBALANCE_IN_PROGRESS
        elif g.state != EMPTY:
            code = UNKNOWN_MEMBER_ID
        results = []
        for topic in wire.topics:
            for p in topic.partitions:
                tp = (topic.name, p.partition_index)
                c = partition_errors.get(tp, code)
                if c == NONE and self.validate_commit_topics and not (
                        0 <= tp[1] < self.topics.get(tp[0], 0)):
                    c = UNKNOWN_TOPIC_OR_PARTITION
                if c == NONE:
                    g.offsets[tp] = p.committed_offset
                    # KIP-320: the leader epoch from v6 on (older versions carry none).
                    g.epochs[tp] = p.committed_leader_epoch if version >= 6 else -1
                results.append((tp[0], tp[1], c))
        if code == NONE and member_id in (g.members if g else {}):
            g.members[member_id].last_seen = self.clock()
        return _commit_response(version, results)

    def _handle_offset_fetch(self, wire, version, partition_errors):
        group_id, requested = _fetch_request(wire, version)
        g = self.groups.get(group_id)
        offsets = dict(g.offsets) if g else {}
        epochs = dict(g.epochs) if g else {}
        if requested is None:   # all topics
            by_topic: dict[str, list[int]] = {}
            for t, p in sorted(offsets):
                by_topic.setdefault(t, []).append(p)
            requested = list(by_topic.items())
        errors = dict(self.fetch_partition_errors)
        errors.update(partition_errors)
        rows = []
        for topic, partitions in requested:
            for p in partitions:
                code = errors.get((topic, p), NONE)
                rows.append((topic, p, offsets.get((topic, p), -1) if code == NONE else -1,
                             code, epochs.get((topic, p), -1) if code == NONE else -1))
        return _fetch_response(version, group_id, rows)


def _member_of(kind: str, wire) -> str | None:
    if kind in (JOIN, SYNC, HEARTBEAT, OFFSET_COMMIT):
        return wire.member_id
    if kind == LEAVE:
        return wire.members[0].member_id if wire.version >= 3 and wire.members \
            else wire.member_id
    return None


def _join_response(version: int, code: int, *, member_id: str = ""):
    return JoinGroupResponse(
        version=version, throttle_time_ms=0, error_code=code, generation_id=-1,
        protocol_type=None, protocol_name=None if version >= 7 else "", leader="",
        skip_assignment=False, member_id=member_id, members=[])


def _commit_response(version: int, rows):
    T = OffsetCommitResponse.OffsetCommitResponseTopic
    P = T.OffsetCommitResponsePartition
    by_topic: dict[str, list] = {}
    for topic, partition, code in rows:
        by_topic.setdefault(topic, []).append(P(partition_index=partition, error_code=code))
    return OffsetCommitResponse(version=version, throttle_time_ms=0,
                                topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()])


def _fetch_request(wire, version):
    """(group id, [(topic, [partitions])] or None for all) of an OffsetFetch request."""
    if version >= 8:
        group = wire.groups[0]
        topics = group.topics
        group_id = group.group_id
    else:
        topics = wire.topics
        group_id = wire.group_id
    if topics is None:
        return group_id, None
    return group_id, [(t.name, list(t.partition_indexes)) for t in topics]


def _fetch_response(version: int, group_id: str, rows):
    by_topic: dict[str, list] = {}
    if version >= 8:
        G = OffsetFetchResponse.OffsetFetchResponseGroup
        T = G.OffsetFetchResponseTopics
        P = T.OffsetFetchResponsePartitions
    else:
        T = OffsetFetchResponse.OffsetFetchResponseTopic
        P = T.OffsetFetchResponsePartition
    for topic, partition, offset, code, *epoch in rows:   # epoch: OffsetFetch v5+
        by_topic.setdefault(topic, []).append(P(
            partition_index=partition, committed_offset=offset,
            committed_leader_epoch=epoch[0] if epoch else -1,
            metadata="", error_code=code))
    topics = [T(name=t, partitions=ps) for t, ps in by_topic.items()]
    if version >= 8:
        return OffsetFetchResponse(version=version, throttle_time_ms=0, groups=[
            G(group_id=group_id, topics=topics, error_code=NONE)])
    return OffsetFetchResponse(version=version, throttle_time_ms=0, topics=topics,
                               error_code=NONE)


class FakeClient:
    """One connection's view of :class:`FakeCoordinator`: the ``BrokerClient`` API that
    :class:`kafka_source.group.member.GroupMember` uses."""

    def __init__(self, coordinator: FakeCoordinator, client_id: str, request_timeout_ms: int):
        self.coordinator = coordinator
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.bootstrap_servers = "fake:9092"
        self.closed = False
        self._answers: list = []           # (future, answer or exception, failed) not yet polled
        self.hold_answers = False
        self.polls = 0
        # What BrokerClient keeps of Metadata answers (partitions seen, doubts).
        self.view = MetadataView(confirm_ms=0)
        self.last_metadata_node = 1

    def _check_open(self):
        if self.closed:
            raise RuntimeError(f"fake client {self.client_id!r} used after close()")

    def find_coordinator(self, group_id: str):
        self._check_open()
        return self.coordinator._find_coordinator(self, group_id)

    def send(self, node_id, request, timeout_ms: int | None = None):
        self._check_open()
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        return self.coordinator._send(self, node_id, request, timeout_ms)

    def metadata(self, topics: Iterable[str] | None) -> dict[str, TopicInfo]:
        self._check_open()
        infos = self.coordinator._metadata(self, topics)
        self.view.seen(infos)
        return infos

    checked_metadata = BrokerClient.checked_metadata

    def send_now(self, node_id, request, timeout_ms: int | None = None) -> Future:
        """The request reaches the coordinator now; its answer (or the exception ``send``
        would raise) completes the returned future only at a later :meth:`poll` -- or never,
        while :attr:`hold_answers` is set (then :meth:`poll` waits as a socket would)."""
        self._check_open()
        future = Future()
        try:
            answer = self.send(node_id, request, timeout_ms)
        except Exception as exc:  # what a failed connection does to the request's future
            self._answers.append((future, exc, True))
        else:
            self._answers.append((future, answer, False))
        return future

    def poll(self, timeout_ms: float) -> None:
        self._check_open()
        self.polls += 1
        if self.hold_answers:
            time.sleep(min(timeout_ms, 50) / 1000)
            return
        answers, self._answers = self._answers, []
        for future, value, failed in answers:
            if failed:
                future.failure(value)
            else:
                future.success(value)

    def close(self) -> None:
        self.closed = True


class RawMember:
    """A consumer of another client library (Java, kafka-python), driven by hand with raw
    JoinGroup / SyncGroup / Heartbeat / LeaveGroup requests and its own Subscription bytes."""

    _ids = itertools.count()

    def __init__(self, coordinator: FakeCoordinator, group_id: str, protocols: list, *,
                 client_id: str | None = None, session_timeout_ms: int = 10_000,
                 rebalance_timeout_ms: int = 10_000, protocol_type: str = "consumer",
                 instance_id: str | None = None):
        self.client = coordinator.client(client_id or f"raw-{next(self._ids)}")
        self.group_id = group_id
        self.protocols = protocols   # [(assignor name, subscription bytes)]
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.protocol_type = protocol_type
        self.instance_id = instance_id   # group.instance.id: a static member
        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        self.join_response = None

    @property
    def node(self):
        return self.client.coordinator.coordinator_node

    def join(self, timeout_ms: int = 5_000):
        """JoinGroup (again with the assigned id after MEMBER_ID_REQUIRED); the response."""
        while True:
            response = self.client.send(self.node, JoinGroupRequest(
                group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=self.rebalance_timeout_ms, member_id=self.member_id,
                group_instance_id=self.instance_id, protocol_type=self.protocol_type,
                protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name=n, metadata=m)
                           for n, m in self.protocols]), timeout_ms=timeout_ms)
            if response.error_code == MEMBER_ID_REQUIRED:
                self.member_id = response.member_id
                continue
            if response.error_code == NONE:
                self.member_id = response.member_id
                self.generation = response.generation_id
                self.protocol = response.protocol_name
            self.join_response = response
            return response

    def sync(self, assignments: dict[str, bytes] | None = None, timeout_ms: int = 5_000):
        """SyncGroup (the leader passes member id -> Assignment bytes); the response."""
        A = SyncGroupRequest.SyncGroupRequestAssignment
        return self.client.send(self.node, SyncGroupRequest(
            group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance_id, protocol_type=self.protocol_type,
            protocol_name=self.protocol,
            assignments=[A(member_id=m, assignment=a) for m, a in (assignments or {}).items()]),
            timeout_ms=timeout_ms)

    def commit(self, offsets: dict) -> list:
        """OffsetCommit of ``offsets`` ((topic, partition) -> offset) in this member's
        generation; the error code of each partition, in order."""
        T = OffsetCommitRequest.OffsetCommitRequestTopic
        P = T.OffsetCommitRequestPartition
        by_topic: dict[str, list] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(P(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                commit_timestamp=-1, committed_metadata=""))
        response = self.client.send(self.node, OffsetCommitRequest(
            group_id=self.group_id, generation_id_or_member_epoch=self.generation,
            member_id=self.member_id, group_instance_id=self.instance_id, retention_time_ms=-1,
            topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()]))
        return [p.error_code for t in response.topics for p in t.partitions]

    def heartbeat(self) -> int:
        return self.client.send(self.node, HeartbeatRequest(
            group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance_id)).error_code

    def leave(self) -> None:
        self.client.send(self.node, LeaveGroupRequest(
            group_id=self.group_id, member_id=self.member_id,
            members=[LeaveGroupRequest.MemberIdentity(member_id=self.member_id,
                                                      group_instance_id=self.instance_id,
                                                      reason="bye")]))


class Background:
    """Runs ``fn(*args)`` in a daemon thread; :meth:`result` waits a bounded time for it."""

    def __init__(self, fn, *args, name: str = "background", **kwargs):
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), name=name,
                                        daemon=True)
        self._thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self._future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to result()
            self._future.set_exception(exc)

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float = 5.0):
        return self._future.result(timeout)
