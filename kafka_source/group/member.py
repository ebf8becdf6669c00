"""Driver side: the query's membership of a Kafka consumer group.

The stream reader's planning methods run in one long-lived Python process on the driver; that
process is a member of the consumer group, speaking the protocol the way Kafka's own consumer does
(eager rebalancing, protocol type ``consumer``):

    FindCoordinator -> JoinGroup(subscription, assignor) -> [leader: run the assignor over every
    member's subscription] -> SyncGroup -> Heartbeat ... OffsetFetch / OffsetCommit ... LeaveGroup

Two threads share a :class:`GroupMember`:

* the **planning thread** (Spark's calls into the stream reader) joins and syncs, fetches and
  commits offsets. It calls :meth:`GroupMember.ensure_active` at the start of every trigger, after
  committing what completed batches processed; a pending rebalance is served there, so partitions
  are given up only once their processed offsets are committed (the rebalance-listener contract).
* a daemon **heartbeat thread**, on its own connection, keeps the membership alive between and
  during micro-batches and notices rebalances (REBALANCE_IN_PROGRESS), fencing (ILLEGAL_GENERATION,
  UNKNOWN_MEMBER_ID) and coordinator moves (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE).

Retriable errors lead to rediscovery or a rejoin, never to a failed query; errors no retry can fix
(authorization, an assignor other members do not share, a session timeout the broker refuses) fail
with a message naming the option at fault. Commits in particular are best effort: one that cannot
be written (the coordinator unavailable for a long time, e.g. the offsets topic short of in-sync
replicas) is logged and made again later while the query goes on reading
(:meth:`GroupMember.commit_async`).

Fencing is not a rejoin like the others. A member that rejoins because the group is rebalancing
commits first and owns its partitions until it has rejoined; a fenced member (its session expired,
or it did not rejoin within ``kafka.max.poll.interval.ms`` because a micro-batch ran longer) lost
its generation, and the group went on without it: another member may have owned its partitions,
read them and committed newer offsets meanwhile. Getting the same partitions back proves nothing
about that, so :attr:`GroupMember.generations_lost` counts these losses, and the stream reader
adopts the partitions of a fenced member again from the group's committed offsets instead of
trusting (and committing) what it had.

With ``assign`` (manual assignment) the query does not join: it only reads and commits offsets
under the group id, as a Java consumer with ``assign()`` does (generation -1).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import kafka.errors as Errors
from kafka.protocol.consumer import (HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest,
                                     OffsetCommitRequest, OffsetFetchRequest, SyncGroupRequest)

from .assignors import Assignment, PartitionAssignor, Subscription, validate_assignment
from ..wire.client import BrokerClient, RetriableBrokerError, TopicPartition, error_for
from ..errors import (BrokerSecurityError, BrokerUnavailableError, KafkaSourceError,
                      OptionError)
from ..config.options import GroupOptions

log = logging.getLogger(__name__)

# How long LeaveGroup may take when a query stops; after it the session timeout covers it.
_LEAVE_TIMEOUT_MS = 5_000

PROTOCOL_TYPE = "consumer"
_NO_GENERATION = -1
_MAX_BACKOFF_S = 1.0
# Errors after which the request is simply sent again (after rediscovery where it applies).
_COORDINATOR_MOVED = (Errors.NotCoordinatorError, Errors.CoordinatorNotAvailableError)
_RETRY = _COORDINATOR_MOVED + (Errors.CoordinatorLoadInProgressError,
                               Errors.RebalanceInProgressError, Errors.UnstableOffsetCommitError)


@dataclass
class _PendingCommit:
    """A commit :meth:`GroupMember.commit_async` sent (``future`` None: it could not be sent,
    for the reason in ``error``)."""
    offsets: dict
    future: object
    on_done: Callable[[bool], None]
    sent_at: float = 0.0               # time.monotonic()
    error: str = ""


class _RetriesExhausted(KafkaSourceError):
    """A request to the coordinator failed for retriable reasons for its whole time budget."""


@dataclass(frozen=True)
class Generation:
    generation_id: int = _NO_GENERATION
    member_id: str = ""
    protocol: str | None = None


class GroupMember:
    """One membership of ``options.group_id``; see the module docstring for the threading."""

    def __init__(self, client: BrokerClient, client_factory: Callable[[], BrokerClient],
                 options: GroupOptions,
                 assignor: PartitionAssignor, *, manual_assignment: Iterable[TopicPartition] = (),
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100):
        self.group_id = options.group_id
        self.options = options
        self.assignor = assignor
        self.manual = tuple(sorted(manual_assignment))
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self._client_factory = client_factory    # makes the heartbeat thread's connection
        self._last_join_error = ""
        self._client = client                    # the planning thread's connection
        self._node: str | int | None = None
        self._lock = threading.Lock()
        self._generation = Generation()
        self._stable = False             # joined and synced; heartbeats flow
        self._rejoin_reason: str | None = "first join"
        self._fatal: Exception | None = None
        self._assignment: tuple[TopicPartition, ...] = ()
        self._topics: frozenset[str] = frozenset()
        self._leader_counts: dict[str, int] | None = None  # partition counts the leader assigned
        self._heartbeat: _HeartbeatThread | None = None
        self._pending_commit: _PendingCommit | None = None   # sent by commit_async
        self.rebalances = 0
        self._generations_lost = 0       # see generations_lost
        self._failed_commits = 0         # commits failed in a row (retriable errors)
        self._commits_failing_since = 0.0
        self._commit_warned_at = 0.0
        self._lost_at_assignment = 0     # _generations_lost when _assignment was received

    # --- state --------------------------------------------------------------------------------

    @property
    def generation(self) -> Generation:
        with self._lock:
            return self._generation

    @property
    def assignment(self) -> tuple[TopicPartition, ...]:
        return self.manual or self._assignment

    @property
    def stable(self) -> bool:
        with self._lock:
            return self._stable

    @property
    def generations_lost(self) -> int:
        """How many times this member has lost its generation by being fenced: a Heartbeat,
        OffsetCommit, JoinGroup or SyncGroup answered ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID
        (its session expired, or it did not rejoin within ``kafka.max.poll.interval.ms`` while
        a long micro-batch ran). The group went on without it: other members may have owned,
        read and committed its partitions meanwhile, so whatever it knew of their offsets is
        stale, even if it gets the same partitions back. A rejoin the member takes part in
        (REBALANCE_IN_PROGRESS: it commits first, and nobody else owns its partitions until it
        has rejoined) and leaving the group do not count."""
        with self._lock:
            return self._generations_lost

    @property
    def generations_lost_at_assignment(self) -> int:
        """:attr:`generations_lost` as it was when :attr:`assignment` was received: the member
        has held its assignment without being fenced exactly as long as the two are equal."""
        with self._lock:
            return 0 if self.manual else self._lost_at_assignment

    def rejoin_reason(self) -> str | None:
        """Why the member must rejoin before its assignment can be trusted (None: it need not)."""
        with self._lock:
            return None if self.manual else self._rejoin_reason

    def assignment_is_current(self) -> bool:
        """Whether :attr:`assignment` holds as it is, with no trip to the coordinator: manual
        assignment, or a stable generation in which no rebalance, fencing or coordinator move
        has been noticed since (by the heartbeat thread or a commit). Raises what the heartbeat
        thread found fatal."""
        if self.manual:
            return True
        self._raise_fatal()
        with self._lock:
            return self._stable and self._rejoin_reason is None

    def request_rejoin(self, reason: str) -> None:
        with self._lock:
            if self._rejoin_reason is None:
                log.info("Group '%s': rejoining because %s", self.group_id, reason)
                self._rejoin_reason = reason

    def _reset(self, *, keep_member_id: bool, reason: str, fenced: bool = True,
               only_if: Generation | None = None) -> None:
        """Forget the generation (and the member id); ``only_if``: unless it changed meanwhile.
        ``fenced``: the coordinator took the generation away (counted in
        :attr:`generations_lost`); False when the member leaves of its own accord."""
        with self._lock:
            if only_if is not None and self._generation != only_if:
                return
            old = self._generation
            self._generation = Generation(member_id=old.member_id if keep_member_id else "")
            self._stable = False
            self._rejoin_reason = self._rejoin_reason or reason
            if fenced:
                self._generations_lost += 1
                log.warning("Group '%s': member '%s' lost generation %d (%s); it rejoins, and "
                            "the partitions it gets are adopted again from the group's "
                            "committed offsets", self.group_id, old.member_id or "-",
                            old.generation_id, reason)

    def _raise_fatal(self) -> None:
        with self._lock:
            fatal = self._fatal
        if fatal is not None:
            raise fatal

    # --- membership ---------------------------------------------------------------------------

    def ensure_active(self, topics: Iterable[str],
                      partition_counts: Mapping[str, int] | None = None
                      ) -> tuple[TopicPartition, ...]:
        """Join (or rejoin) if needed and return this member's assigned partitions.

        ``topics`` is the subscription now; ``partition_counts`` the partition count of those
        topics as just seen in metadata. A different topic set, or (for the leader) a partition
        count that changed since the assignment, triggers a rebalance.
        """
        if self.manual:
            return self.manual
        self._raise_fatal()
        topics = frozenset(topics)
        if topics != self._topics:
            self.request_rejoin(f"the subscription changed to {sorted(topics)}")
        elif partition_counts is not None and self._leader_counts is not None:
            for topic, count in partition_counts.items():
                # A topic the leader's metadata lacked when it assigned counts as changed.
                if self._leader_counts.get(topic) != count:
                    self.request_rejoin(f"topic '{topic}' now has {count} partitions")
                    break
        if self.rejoin_reason() is not None:
            self._join(topics)
        return self._assignment

    def _join(self, topics: frozenset[str]) -> None:
        # What was processed of the partitions this member may now lose is committed first --
        # within half the rebalance timeout, so that the member still rejoins in time if the
        # commit cannot be made (its partitions are then read again from the last commit).
        self.settle_commits(retry_ms=min(self.options.api_timeout_ms,
                                         self.options.rebalance_timeout_ms // 2))
        budget_ms = (self.options.rebalance_timeout_ms + self.options.session_timeout_ms
                     + self.request_timeout_ms)
        deadline = time.monotonic() + budget_ms / 1000
        failures = 0
        last_error = "none"
        with self._lock:
            self._stable = False
        while True:
            self._raise_fatal()
            try:
                if self._join_once(topics):
                    return
                last_error = self._last_join_error
            except RetriableBrokerError as exc:
                self._node = None
                last_error = str(exc)
            failures += 1
            if time.monotonic() >= deadline:
                raise KafkaSourceError(
                    f"Could not join consumer group '{self.group_id}' within {budget_ms / 1000:.0f}"
                    f" s (kafka.max.poll.interval.ms + kafka.session.timeout.ms + "
                    f"kafka.request.timeout.ms); last error: {last_error}.")
            self._backoff(failures)

    def _join_once(self, topics: frozenset[str]) -> bool:
        """One JoinGroup + SyncGroup round; True when the member is in a stable generation."""
        node = self._coordinator()
        member_id = self.generation.member_id
        subscription = Subscription(tuple(sorted(topics)),
                                    user_data=self.assignor.subscription_user_data(set(topics)))
        request = JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=self.options.session_timeout_ms,
            rebalance_timeout_ms=self.options.rebalance_timeout_ms, member_id=member_id,
            group_instance_id=None, protocol_type=PROTOCOL_TYPE,
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
                name=self.assignor.name, metadata=subscription.encode())],
            max_version=7)
        # The coordinator holds JoinGroup open until every member has joined (at most the
        # rebalance timeout), so the request may take that long.
        timeout = max(self.request_timeout_ms, self.options.rebalance_timeout_ms + 5_000)
        log.info("Group '%s': joining (member '%s', topics %s)", self.group_id, member_id or "-",
                 sorted(topics))
        response = self._client.send(node, request, timeout_ms=timeout)
        err = error_for(response.error_code)
        if err is Errors.MemberIdRequiredError:
            # KIP-394: the coordinator assigns the member id; join again with it at once.
            with self._lock:
                self._generation = Generation(member_id=response.member_id)
            self._last_join_error = err.__name__
            return self._join_once(topics)
        if err is not Errors.NoError:
            self._on_group_error(err, "JoinGroup")
            return False
        generation = Generation(response.generation_id, response.member_id,
                                response.protocol_name)
        with self._lock:
            self._generation = generation
        leader = response.leader == response.member_id
        assignments = self._assign(response.members, generation) if leader else []
        sync = self._client.send(node, SyncGroupRequest(
            group_id=self.group_id, generation_id=generation.generation_id,
            member_id=generation.member_id, group_instance_id=None,
            protocol_type=PROTOCOL_TYPE, protocol_name=generation.protocol,
            assignments=assignments, max_version=5))
        err = error_for(sync.error_code)
        if err is not Errors.NoError:
            self._on_group_error(err, "SyncGroup")
            return False
        assignment = Assignment.decode(bytes(sync.assignment or b""))
        self.assignor.on_assignment(assignment)
        with self._lock:
            if self._generation != generation:  # fenced by the heartbeat thread meanwhile
                self._last_join_error = "the generation changed during SyncGroup"
                return False
            self._assignment = tuple(sorted(set(assignment.partitions)))
            self._lost_at_assignment = self._generations_lost
            self._topics = topics
            self._stable = True
            self._rejoin_reason = None
            self._leader_counts = self._leader_counts if leader else None
        self.rebalances += 1
        log.info("Group '%s': generation %d, member '%s'%s, assigned %s", self.group_id,
                 generation.generation_id, generation.member_id, " (leader)" if leader else "",
                 _describe(self._assignment))
        self._start_heartbeat()
        return True

    def _assign(self, members, generation: Generation) -> list:
        """The leader's job: run the assignor over every member's subscription."""
        if generation.protocol != self.assignor.name:
            raise KafkaSourceError(
                f"Consumer group '{self.group_id}' chose assignor '{generation.protocol}', which "
                f"this query does not offer (option 'assignor' = '{self.assignor.name}').")
        subscriptions = {m.member_id: Subscription.decode(bytes(m.metadata)) for m in members}
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        counts = self.partition_counts(topics)
        result = self.assignor.assign(counts, subscriptions)
        result = validate_assignment(result, counts, subscriptions, self.assignor.name) or result
        self._leader_counts = counts
        Item = SyncGroupRequest.SyncGroupRequestAssignment
        return [Item(member_id=member_id,
                     assignment=Assignment(tuple(result.get(member_id, ()))).encode())
                for member_id in subscriptions]

    def partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """Partition count of each topic that exists (absent topics are left out). A topic
        this client has seen that the answer lacks is doubted first (RetriableBrokerError: the
        join is tried again), so that the leader does not assign without the partitions of a
        topic a just-started broker does not know yet (:mod:`kafka_source.wire.metadata_view`)."""
        topics = list(topics)
        if not topics:
            return {}
        infos = self._client.checked_metadata(topics, self._client.view.known_partitions(topics))
        return {t: len(i.partitions) for t, i in infos.items() if i.error_code == 0}

    def _on_group_error(self, err, what: str) -> None:
        """React to a JoinGroup/SyncGroup error: reset what it says is stale, or fail."""
        self._last_join_error = f"{what}: {err.__name__}"
        if err is Errors.UnknownMemberIdError:
            self._reset(keep_member_id=False, reason="the coordinator forgot this member")
        elif err is Errors.IllegalGenerationError:
            self._reset(keep_member_id=True, reason="the generation is stale")
        elif err in _COORDINATOR_MOVED:
            self._node = None
        elif err in _RETRY:
            pass
        elif err is Errors.InconsistentGroupProtocolError:
            raise KafkaSourceError(
                f"Consumer group '{self.group_id}' (option 'kafka.group.id') has members that use "
                f"another protocol type or none of the assignors this query offers ('assignor' = "
                f"'{self.assignor.name}'). All members of a group must share an assignor: set "
                "'assignor' to the one the other consumers use ('range' or 'roundrobin'), or use "
                "another group.")
        elif err is Errors.InvalidSessionTimeoutError:
            raise OptionError(
                f"The broker refused 'kafka.session.timeout.ms' = {self.options.session_timeout_ms}:"
                " it must lie between the broker's group.min.session.timeout.ms (default 6000) "
                "and group.max.session.timeout.ms (default 1800000).")
        elif err is Errors.GroupAuthorizationFailedError:
            raise KafkaSourceError(f"Not authorized to use consumer group '{self.group_id}' "
                                   "(option 'kafka.group.id'): grant READ on the group.")
        else:
            raise KafkaSourceError(f"{what} for consumer group '{self.group_id}' failed: "
                                   f"{err.__name__} ({getattr(err, 'description', '')}).")

    def _backoff(self, failures: int) -> None:
        """Exponential backoff from ``kafka.retry.backoff.ms``, at most _MAX_BACKOFF_S."""
        time.sleep(min(self.retry_backoff_ms / 1000 * 2 ** min(failures - 1, 6), _MAX_BACKOFF_S))

    def _coordinator(self):
        if self._node is None:
            try:
                self._node = self._client.find_coordinator(self.group_id)
            except Errors.GroupAuthorizationFailedError:
                raise KafkaSourceError(f"Not authorized to use consumer group '{self.group_id}' "
                                       "(option 'kafka.group.id'): grant DESCRIBE and READ on "
                                       "the group.") from None
        return self._node

    # --- offsets ------------------------------------------------------------------------------

    def _with_coordinator(self, what: str, attempt: Callable[[object], object], *,
                          budget_ms: int | None = None, errors: list | None = None):
        """Run ``attempt(node)`` until it returns non-None, rediscovering the coordinator, for
        at most ``budget_ms`` (default ``kafka.default.api.timeout.ms``, as the Java consumer's
        commitSync and committed): one request that timed out (``kafka.request.timeout.ms``) is
        retried. ``attempt`` may append why it failed to ``errors``. Raises
        :class:`_RetriesExhausted` when the budget is spent."""
        budget_ms = self.options.api_timeout_ms if budget_ms is None else budget_ms
        deadline = time.monotonic() + budget_ms / 1000
        failures = 0
        errors = [] if errors is None else errors
        while True:
            try:
                result = attempt(self._coordinator())
                if result is not None:
                    return result
            except RetriableBrokerError as exc:
                self._node = None
                errors.append(str(exc))
                log.info("Group '%s': %s failed (%s); retrying", self.group_id, what, exc)
            failures += 1
            if time.monotonic() >= deadline:
                last_error = errors[-1] if errors else \
                    "the coordinator kept answering with retriable errors"
                raise _RetriesExhausted(f"{what} for consumer group '{self.group_id}' did not "
                                        f"succeed within {budget_ms} ms (option "
                                        f"'kafka.default.api.timeout.ms'); last error: "
                                        f"{last_error}.")
            self._backoff(failures)

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None where there is none)."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(set(partitions)):
            by_topic.setdefault(topic, []).append(partition)
        if not by_topic:
            return {}
        T = OffsetFetchRequest.OffsetFetchRequestTopic
        G = OffsetFetchRequest.OffsetFetchRequestGroup
        request = OffsetFetchRequest(
            group_id=self.group_id,
            topics=[T(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
            groups=[G(group_id=self.group_id, topics=[
                G.OffsetFetchRequestTopics(name=t, partition_indexes=ps)
                for t, ps in by_topic.items()])],
            require_stable=False, max_version=8)

        def attempt(node):
            response = self._client.send(node, request)
            if response.version >= 8:
                group = response.groups[0]
                code, topics = group.error_code, group.topics
            else:
                code = response.error_code if response.version >= 2 else 0
                topics = response.topics
            if not self._offset_error_ok(error_for(code), "OffsetFetch"):
                return None
            result: dict[TopicPartition, int | None] = {
                (t, p): None for t, ps in by_topic.items() for p in ps}
            for topic in topics:
                for p in topic.partitions:
                    err = error_for(p.error_code)
                    if err is Errors.UnknownTopicOrPartitionError:
                        continue
                    if not self._offset_error_ok(err, "OffsetFetch"):
                        return None
                    if p.committed_offset >= 0:
                        result[(topic.name, p.partition_index)] = p.committed_offset
            return result

        return self._with_coordinator("OffsetFetch", attempt)

    def commit(self, offsets: Mapping[TopicPartition, int]) -> bool:
        """Commit ``offsets`` in this member's generation and wait; False if the member was
        fenced (it then rejoins at the next :meth:`ensure_active`).

        Only partitions this member owns may be committed (the caller filters). In manual
        assignment mode the commit is made outside any generation, as Kafka allows.
        """
        self.settle_commits()                 # commits apply in the order they were made
        return self._commit_sync(offsets)

    def _commit_sync(self, offsets: Mapping[TopicPartition, int], *,
                     budget_ms: int | None = None) -> bool:
        request = self._commit_request(offsets)
        if request is None:
            return not offsets
        fenced: list = []
        errors: list = []
        ok = self._with_coordinator(
            "OffsetCommit", lambda node: self._commit_outcome(self._client.send(node, request),
                                                              fenced, errors),
            budget_ms=budget_ms, errors=errors)
        return self._commit_done(offsets, ok, fenced)

    def commit_async(self, offsets: Mapping[TopicPartition, int],
                     on_done: Callable[[bool], None] | None = None) -> None:
        """Send an OffsetCommit of ``offsets`` without waiting for the answer.

        The stream reader commits a completed micro-batch at the start of the next trigger; the
        coordinator takes a few milliseconds to answer (Kafka 4's coordinator batches its
        writes for ``group.coordinator.append.linger.ms``, 5 ms), which a synchronous commit
        would add to every trigger. The answer is applied by :meth:`settle_commits`, which every
        step that depends on it calls first -- the next commit, a rejoin (partitions are given
        up only once their commit was made or given up), :meth:`leave`; the stream reader also
        calls it at the start of each trigger -- and ``on_done(accepted)`` then runs.

        Commits are best effort while the member is stable: a commit that failed for a
        retriable reason (coordinator moving or unavailable -- e.g. the offsets topic lacks
        in-sync replicas --, network error, no answer) is logged and reported with
        ``on_done(False)``, and the caller commits the newest completed offsets again at its
        next trigger; reading goes on meanwhile (Spark's own Kafka source never depends on the
        coordinator). Before a rejoin and on :meth:`leave` it is made again synchronously,
        with bounded retries, and a failure is logged too: partitions whose commit failed are
        read again from their last committed offset (at least once), never skipped. A commit
        refused because the member was fenced is not made again (the caller commits once it
        owns the partitions in the new generation). Errors no retry can fix (authorization)
        raise.
        """
        self.settle_commits()
        request = self._commit_request(offsets)
        if request is None:
            if on_done is not None:
                on_done(not offsets)
            return
        error = ""
        try:
            future = self._client.send_now(self._coordinator(), request)
        except (RetriableBrokerError, BrokerUnavailableError, Errors.KafkaError) as exc:
            log.debug("Group '%s': OffsetCommit not sent (%s)", self.group_id, exc)
            self._node = None
            future, error = None, f"not sent: {exc}"
        self._pending_commit = _PendingCommit(dict(offsets), future,
                                              on_done or (lambda accepted: None),
                                              sent_at=time.monotonic(), error=error)

    def settle_commits(self, *, retry_ms: int | None = None) -> None:
        """Wait for the answer to a commit :meth:`commit_async` sent and apply it; the answer
        is awaited until ``kafka.request.timeout.ms`` after the commit was sent, no longer.

        ``retry_ms``: a commit that failed for a retriable reason is made again synchronously,
        for at most that long (before a rejoin, on leaving); its failure is logged, not raised.
        Without it the failure is only logged (the caller commits again later)."""
        pending, self._pending_commit = self._pending_commit, None
        if pending is None:
            return
        accepted = False
        try:
            accepted = self._settle(pending, retry_ms)
        finally:                              # also when it raises: the commit did not happen
            pending.on_done(accepted)

    def _settle(self, pending: "_PendingCommit", retry_ms: int | None) -> bool:
        future, error = pending.future, pending.error
        if future is not None:
            # Polled a little in any case: after a micro-batch longer than the request timeout
            # the answer may wait in the socket, read by nobody since.
            deadline = max(pending.sent_at + self.request_timeout_ms / 1000 + 1,
                           time.monotonic() + 0.2)
            try:
                while not future.is_done and time.monotonic() < deadline:
                    self._client.poll(100)
            except Exception as exc:
                log.debug("Group '%s': waiting for OffsetCommit failed (%s)", self.group_id, exc)
            if future.succeeded():
                fenced: list = []
                errors: list = []
                ok = self._commit_outcome(future.value, fenced, errors)
                if ok is not None:
                    return self._commit_done(pending.offsets, ok, fenced)
                error = errors[-1]
            else:
                self._node = None             # a network failure: rediscover the coordinator
                error = (str(future.exception) if future.failed() else
                         f"no answer within {self.request_timeout_ms} ms "
                         "('kafka.request.timeout.ms')")
        if retry_ms is None:
            self._commit_failed(pending.offsets, error)
            return False
        # Before a rejoin or leaving: once more, synchronously, within retry_ms.
        try:
            return self._commit_sync(pending.offsets, budget_ms=retry_ms)
        except _RetriesExhausted as exc:
            self._commit_failed(pending.offsets, str(exc), final=True)
            return False

    def _commit_failed(self, offsets: Mapping[TopicPartition, int], error: str, *,
                       final: bool = False) -> None:
        """Log a commit that failed for a retriable reason: a warning for the first failure in
        a row, and again each ``kafka.default.api.timeout.ms`` while they go on."""
        now = time.monotonic()
        if self._failed_commits == 0:
            self._commits_failing_since = now
        self._failed_commits += 1
        what = ("the partitions are read again from their last committed offset if they move "
                "to another member" if final else
                "the query goes on and commits the newest completed offsets at its next trigger")
        if self._failed_commits == 1 or final or \
                now - self._commit_warned_at >= self.options.api_timeout_ms / 1000:
            self._commit_warned_at = now
            log.warning("Group '%s': commit of %s failed (%s); %s (%d failed commit(s) in a "
                        "row, for %.1f s)", self.group_id, _describe_offsets(offsets), error,
                        what, self._failed_commits, now - self._commits_failing_since)
        else:
            log.info("Group '%s': commit of %s failed again (%s)", self.group_id,
                     _describe_offsets(offsets), error)

    def _commit_request(self, offsets: Mapping[TopicPartition, int]):
        """The OffsetCommit request for ``offsets`` in this member's generation (None: nothing
        to send, or no generation to send it in)."""
        if not offsets:
            return None
        generation = Generation() if self.manual else self.generation
        if not self.manual and generation.generation_id < 0:
            return None
        by_topic: dict[str, list] = {}
        P = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(P(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                commit_timestamp=-1, committed_metadata=""))
        return OffsetCommitRequest(
            group_id=self.group_id, generation_id_or_member_epoch=generation.generation_id,
            member_id=generation.member_id, group_instance_id=None, retention_time_ms=-1,
            topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=ps)
                    for t, ps in by_topic.items()],
            max_version=8)

    def _commit_outcome(self, response, fenced: list, errors: list) -> bool | None:
        """True: accepted; False: refused because the member was fenced (the error is appended
        to ``fenced``); None: retry (why is appended to ``errors``). Raises for errors no retry
        can fix."""
        for topic in response.topics:
            for p in topic.partitions:
                err = error_for(p.error_code)
                if err is Errors.UnknownTopicOrPartitionError:
                    # Deleted meanwhile: nothing to commit; the reader reports the loss.
                    log.warning("Group '%s': not committing %s-%d, which no longer exists",
                                self.group_id, topic.name, p.partition_index)
                    continue
                if err in (Errors.IllegalGenerationError, Errors.UnknownMemberIdError,
                           Errors.RebalanceInProgressError):
                    fenced.append(err)
                    return False
                if not self._offset_error_ok(err, "OffsetCommit"):
                    errors.append(f"{err.__name__} for {topic.name}-{p.partition_index}")
                    return None
        return True

    def _commit_done(self, offsets: Mapping[TopicPartition, int], ok: bool,
                     fenced: list) -> bool:
        """Log the outcome of a commit; a fenced member forgets what the error says is stale."""
        if not ok and self.manual:
            log.warning("Group '%s': commit of %s refused (%s): the group has active members, "
                        "and Kafka accepts commits from a query using 'assign' only while it has "
                        "none. Use another 'kafka.group.id', or 'subscribe' to join the group.",
                        self.group_id, _describe_offsets(offsets), fenced[0].__name__)
            return False
        if not ok:
            err = fenced[0]
            log.warning("Group '%s': commit of %s refused (%s); rejoining", self.group_id,
                        _describe_offsets(offsets), err.__name__)
            if err is Errors.UnknownMemberIdError:
                self._reset(keep_member_id=False, reason="the coordinator forgot this member")
            elif err is Errors.IllegalGenerationError:
                self._reset(keep_member_id=True, reason="the generation is stale")
            else:
                self.request_rejoin("the group is rebalancing")
            return False
        if self._failed_commits:
            log.info("Group '%s': committing works again (%s) after %d failed commit(s) in "
                     "%.1f s", self.group_id, _describe_offsets(offsets), self._failed_commits,
                     time.monotonic() - self._commits_failing_since)
            self._failed_commits = 0
        log.debug("Group '%s': committed %s", self.group_id, _describe_offsets(offsets))
        return True

    def _offset_error_ok(self, err, what: str) -> bool:
        """True for no error; False to retry; raises for errors a retry can't fix."""
        if err is Errors.NoError:
            return True
        if err in _COORDINATOR_MOVED:
            self._node = None
            return False
        if err in _RETRY or getattr(err, "retriable", False):
            return False
        if err is Errors.GroupAuthorizationFailedError:
            raise KafkaSourceError(f"Not authorized to use consumer group '{self.group_id}' "
                                   "(option 'kafka.group.id'): grant READ on the group.")
        raise KafkaSourceError(f"{what} for consumer group '{self.group_id}' failed: "
                               f"{err.__name__} ({getattr(err, 'description', '')}).")

    # --- leaving ------------------------------------------------------------------------------

    def leave(self, reason: str = "the query stopped") -> None:
        """Leave the group now (so the others rebalance at once) and stop heartbeating; a
        commit still in flight is waited for first, and made again if it failed (bounded by
        ``kafka.default.api.timeout.ms``, and best effort here)."""
        try:
            self.settle_commits(retry_ms=self.options.api_timeout_ms)
        except Exception as exc:
            log.warning("Group '%s': the last commit failed while leaving: %s", self.group_id, exc)
        self._stop_heartbeat()
        generation = self.generation
        self._reset(keep_member_id=False, reason="it left the group", fenced=False)
        self._assignment = ()
        if self.manual or not generation.member_id:
            return
        request = LeaveGroupRequest(
            group_id=self.group_id, member_id=generation.member_id,
            members=[LeaveGroupRequest.MemberIdentity(member_id=generation.member_id,
                                                      group_instance_id=None, reason=reason)])
        try:
            # Bounded: this runs while Spark stops the query (and may kill the process).
            timeout_ms = min(self.request_timeout_ms, _LEAVE_TIMEOUT_MS)
            # The coordinator may be unknown since a failed commit: ask once more.
            response = self._client.send(self._coordinator(), request, timeout_ms=timeout_ms)
            log.info("Group '%s': member '%s' left (%s)", self.group_id, generation.member_id,
                     error_for(response.error_code).__name__)
        except Exception as exc:  # leaving is best effort: the session timeout covers it
            log.warning("Group '%s': LeaveGroup failed (%s); the coordinator will drop the "
                        "member after kafka.session.timeout.ms", self.group_id, exc)

    def close(self) -> None:
        """Leave the group; the planning connection belongs to the caller."""
        self.leave()

    # --- heartbeats ---------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or not self._heartbeat.is_alive():
            self._heartbeat = _HeartbeatThread(self)
            self._heartbeat.start()

    def _stop_heartbeat(self) -> None:
        thread, self._heartbeat = self._heartbeat, None
        if thread is not None:
            thread.stop()

    def _heartbeat_target(self) -> Generation | None:
        with self._lock:
            return self._generation if self._stable else None

    def on_heartbeat(self, generation: Generation, err) -> None:
        """Apply a heartbeat answer (called from the heartbeat thread)."""
        with self._lock:
            if self._generation != generation:
                return  # an answer about a generation we already left
        if err is Errors.NoError:
            return
        if err is Errors.RebalanceInProgressError:
            # Keep heartbeating (it keeps the session alive) until the planning thread rejoins.
            self.request_rejoin("the group is rebalancing")
        elif err is Errors.IllegalGenerationError:
            self._reset(keep_member_id=True, reason="the generation is stale",
                        only_if=generation)
        elif err is Errors.UnknownMemberIdError:
            self._reset(keep_member_id=False, reason="the coordinator forgot this member",
                        only_if=generation)
        elif err in (Errors.GroupAuthorizationFailedError, Errors.FencedInstanceIdError):
            with self._lock:
                self._fatal = KafkaSourceError(f"Heartbeat for consumer group '{self.group_id}' "
                                               f"failed: {err.__name__}.")
        else:
            log.warning("Group '%s': heartbeat answered %s", self.group_id, err.__name__)


class _HeartbeatThread(threading.Thread):
    """Sends a Heartbeat every ``kafka.heartbeat.interval.ms`` while the member is stable."""

    def __init__(self, member: GroupMember):
        super().__init__(name=f"pykafka-heartbeat-{member.group_id}", daemon=True)
        self.member = member
        self._stopped = threading.Event()
        self._client: BrokerClient | None = None
        self._node = None

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        m = self.member
        interval = m.options.heartbeat_interval_ms / 1000
        try:
            while not self._stopped.wait(interval):
                generation = m._heartbeat_target()
                if generation is None:
                    continue
                try:
                    err = self._beat(generation)
                except RetriableBrokerError as exc:
                    self._node = None
                    log.info("Group '%s': heartbeat failed (%s); retrying", m.group_id, exc)
                    continue
                except BrokerSecurityError as exc:  # no retry can fix it: fail the query
                    with m._lock:
                        m._fatal = exc
                    return
                except Exception as exc:  # never let the thread die silently
                    log.warning("Group '%s': heartbeat error: %s", m.group_id, exc)
                    self._node = None
                    continue
                if err in _COORDINATOR_MOVED:
                    self._node = None
                    continue
                m.on_heartbeat(generation, err)
        finally:
            if self._client is not None:
                self._client.close()

    def _beat(self, generation: Generation):
        m = self.member
        if self._client is None:
            self._client = m._client_factory()
        if self._node is None:
            self._node = self._client.find_coordinator(m.group_id)
        response = self._client.send(self._node, HeartbeatRequest(
            group_id=m.group_id, generation_id=generation.generation_id,
            member_id=generation.member_id, group_instance_id=None),
            timeout_ms=m.request_timeout_ms)
        return error_for(response.error_code)


def _describe(partitions) -> str:
    grouped: dict[str, list[int]] = {}
    for topic, partition in partitions:
        grouped.setdefault(topic, []).append(partition)
    return ", ".join(f"{t}{sorted(ps)}" for t, ps in sorted(grouped.items())) or "nothing"


def _describe_offsets(offsets: Mapping[TopicPartition, int]) -> str:
    return ", ".join(f"{t}-{p}@{o}" for (t, p), o in sorted(offsets.items()))
