"""Driver side: the query's membership of a Kafka consumer group.

The stream reader's planning methods run in one long-lived Python process on the driver; that
process is a member of the consumer group, speaking the protocol the way Kafka's own consumer does
(protocol type ``consumer``; eager rebalancing, or cooperative with ``cooperative-sticky``, see
below):

    FindCoordinator -> JoinGroup(subscription, assignor) -> [leader: run the assignor over every
    member's subscription] -> SyncGroup -> Heartbeat ... OffsetFetch / OffsetCommit ... LeaveGroup

Two threads share a :class:`GroupMember`:

* the **planning thread** (Spark's calls into the stream reader) joins and syncs (a cooperative
  member's rejoins run on a thread of their own, below), fetches and commits offsets. It calls
  :meth:`GroupMember.ensure_active` at the start of every trigger, after committing what
  completed batches processed; a pending rebalance is served there, so partitions
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

Static membership (KIP-345, brokers 2.3+): with ``kafka.group.instance.id`` the member joins
with that instance id (JoinGroup v5+; SyncGroup, Heartbeat and OffsetCommit carry it too), and
the coordinator knows it by it rather than by its member id. Like Java's consumer it does not
send LeaveGroup when the query stops: its partitions stay assigned to it, unread, until
``kafka.session.timeout.ms`` passes without a heartbeat. A restart within that time joins
without a member id and takes the old member's place -- a new member id, the same generation
and the stored assignment, with no rebalance; the other members never hear of it. A returning
leader is told so from JoinGroup v9 on (KIP-814, brokers 3.2+), with ``skip_assignment``: it
does not assign (the stored assignment stands) but watches the partition counts as leader;
before v9 it is answered as a follower. A second member joining with the same instance id takes
the place of the first the same way; the first is then answered FENCED_INSTANCE_ID, which is
fatal (:meth:`GroupMember._instance_fenced`): rejoining would fence the other one in turn.

Cooperative rebalancing (KIP-429, assignor ``cooperative-sticky``): the member's Subscription
says which partitions it owns and in which generation, and it keeps them through the rebalance;
the leader gives nobody a partition another member still owns. So the member does not stop
reading for a rebalance: it rejoins in the background, on its own connection, as soon as the
heartbeat thread hears of it, while the planning thread goes on planning and committing the
partitions it holds (:mod:`.rejoin`). A new assignment that lacks some of them is taken over at
the start of a trigger, once what the last micro-batch read of them is committed; the member
then rejoins at once, so that the round that follows assigns them to their new member.

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
                                     SyncGroupRequest)

from .assignors import Assignment, PartitionAssignor, Subscription, validate_assignment
from .commits import COORDINATOR_MOVED, RETRY, GroupCommits
from .rejoin import BackgroundRejoin, JoinLink
from ..wire.net.client import BrokerClient, RetriableBrokerError, TopicPartition, error_for
from ..errors import (BrokerSecurityError, BrokerUnavailableError, BrokerUnreachableError,
                      KafkaSourceError, OptionError)
from ..config.options import GroupOptions

log = logging.getLogger(__name__)

# A JoinGroup that took this long with the member alone in its group is explained in the log
# (GroupMember._say_initial_delay): on brokers with Kafka's defaults it is the initial delay.
_SLOW_FIRST_JOIN_S = 1.0

# How long LeaveGroup may take when a query stops; after it the session timeout covers it.
_LEAVE_TIMEOUT_MS = 5_000

PROTOCOL_TYPE = "consumer"
_NO_GENERATION = -1


@dataclass(frozen=True)
class Generation:
    generation_id: int = _NO_GENERATION
    member_id: str = ""
    protocol: str | None = None


class GroupMember(GroupCommits):
    """One membership of ``options.group_id``; see the module docstring for the threading.
    Offsets (OffsetFetch, OffsetCommit) are :class:`~kafka_source.group.commits.GroupCommits`'."""

    def __init__(self, client: BrokerClient, client_factory: Callable[[], BrokerClient],
                 options: GroupOptions,
                 assignor: PartitionAssignor, *, manual_assignment: Iterable[TopicPartition] = (),
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100):
        self.group_id = options.group_id
        self.instance_id = options.group_instance_id    # None: a dynamic member
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
        # Cooperative rejoins in the background (.rejoin): the one running, if any; the outcome
        # of the last one, until the planning thread takes it over; the lock under which either
        # thread starts one and the planning thread takes an outcome over.
        self._rejoiner: BackgroundRejoin | None = None
        self._joined: tuple[tuple[TopicPartition, ...], int] | None = None
        self._rejoin_lock = threading.Lock()
        self._rejoin_conn: BrokerClient | None = None   # the background rejoins' connection
        self._init_commits()
        self.rebalances = 0
        self._generations_lost = 0       # see generations_lost
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
        """Whether the member holds its partitions in a generation: joined and synced, or
        rejoining cooperatively in the background, which it does keeping them (its commits are
        then made in the generation it holds; one the rebalance overtakes is made again)."""
        with self._lock:
            return self._stable or (self._rejoiner is not None
                                    and self._generation.generation_id != _NO_GENERATION)

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
            return (self._stable and self._rejoin_reason is None and self._rejoiner is None
                    and self._joined is None)

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

    # --- membership ---------------------------------------------------------------------------

    def ensure_active(self, topics: Iterable[str],
                      partition_counts: Mapping[str, int] | None = None
                      ) -> tuple[TopicPartition, ...]:
        """Join (or rejoin) if needed and return this member's assigned partitions.

        ``topics`` is the subscription now; ``partition_counts`` the partition count of those
        topics as just seen in metadata. A different topic set, or (for the leader) a partition
        count that changed since the assignment, triggers a rebalance.

        With a cooperative assignor a member that holds its generation rejoins in the
        background (:mod:`.rejoin`) and this returns at once with the partitions it holds; the
        outcome is taken over by a later call, after the caller committed what the batches
        before it processed (module docstring).
        """
        if self.manual:
            return self.manual
        self._raise_fatal()
        topics = frozenset(topics)
        with self._rejoin_lock:
            self._take_rejoin(wait=False)
            self._check_subscription(topics, partition_counts)
            if self.rejoin_reason() is None:
                return self._assignment
            if self._may_rejoin_in_background(topics):
                self._start_rejoin(topics, settle=True)
                return self._assignment
            if self._rejoiner is not None:
                # Fenced meanwhile, or the subscription changed: what the member holds is not
                # its own any more; wait for the rejoin running, then see again.
                self._take_rejoin(wait=True)
                self._check_subscription(topics, partition_counts)
                if self.rejoin_reason() is None:
                    return self._assignment
            self._join(topics)
        return self._assignment

    def _check_subscription(self, topics: frozenset[str],
                            partition_counts: Mapping[str, int] | None) -> None:
        if topics != self._topics:
            self.request_rejoin(f"the subscription changed to {sorted(topics)}")
        elif partition_counts is not None and self._leader_counts is not None:
            for topic, count in partition_counts.items():
                # A topic the leader's metadata lacked when it assigned counts as changed.
                if self._leader_counts.get(topic) != count:
                    self.request_rejoin(f"topic '{topic}' now has {count} partitions")
                    break

    # --- cooperative rejoins in the background (.rejoin) --------------------------------------

    def _may_rejoin_in_background(self, topics: frozenset[str]) -> bool:
        """Cooperative, holding a generation (not fenced: a fenced member holds nothing), with
        the subscription it joined with, and nothing of a finished rejoin left to take over."""
        with self._lock:
            return (getattr(self.assignor, "cooperative", False) and topics == self._topics
                    and self._generation.generation_id != _NO_GENERATION
                    and self._joined is None and self._fatal is None)

    def _start_rejoin(self, topics: frozenset[str], *, settle: bool) -> None:
        """Start a background rejoin unless one runs (the caller holds ``_rejoin_lock``).
        ``settle``: the planning thread first settles its commit in flight -- with it what the
        partitions given up in the last round processed, which nobody else may read before it
        is committed (KIP-429's second round)."""
        if self._rejoiner is not None:
            return
        if settle:
            self._settle_before_joining()
        log.info("Group '%s': rejoining in the background (cooperative), reading %s meanwhile",
                 self.group_id, _describe(self._assignment))
        rejoiner = BackgroundRejoin(self, topics)
        with self._lock:
            self._rejoiner = rejoiner
            self._stable = False          # no heartbeats while JoinGroup is open
        rejoiner.start()

    def rejoin_on_rebalance(self) -> None:
        """Called by the heartbeat thread when the group rebalances: a cooperative member joins
        at once in the background, instead of at the next trigger -- the group, Java members
        too, then need not wait for the micro-batch running to end. Nothing is given up in this
        round, so no commit needs settling first."""
        if not self._rejoin_lock.acquire(blocking=False):
            return                            # the planning thread is on it
        try:
            if self._may_rejoin_in_background(self._topics) and self._topics:
                self._start_rejoin(self._topics, settle=False)
        finally:
            self._rejoin_lock.release()

    def _take_rejoin(self, *, wait: bool) -> None:
        """Take over what a background rejoin ended with (``wait``: wait for it to end): its
        error, raised here; or its assignment. Partitions it lacks are given up here, after
        the caller committed what they processed, and rejoined for at once (KIP-429)."""
        rejoiner = self._rejoiner
        if rejoiner is not None:
            if wait:
                rejoiner.join()
            if rejoiner.is_alive():
                return
            self._rejoiner = None
            if rejoiner.error is not None:
                raise rejoiner.error
        with self._lock:
            joined, self._joined = self._joined, None
            if joined is None:
                return
            revoked = set(self._assignment) - set(joined[0])
            self._assignment, self._lost_at_assignment = joined
        self._rejoin_for_second_round(revoked)

    def _rejoin_for_second_round(self, revoked: set) -> None:
        """KIP-429's second round: what this member gave up is assigned to nobody until it
        says it no longer owns it, so it rejoins at once (its processed offsets committed)."""
        if revoked:
            self.request_rejoin(f"it gave up {_describe(sorted(revoked))} in a cooperative "
                                "rebalance")

    def _rejoin_client(self) -> BrokerClient:
        if self._rejoin_conn is None:
            self._rejoin_conn = self._client_factory()
        return self._rejoin_conn

    def _settle_before_joining(self) -> None:
        # What was processed of the partitions this member may now lose is committed first --
        # within half the rebalance timeout, so that the member still rejoins in time if the
        # commit cannot be made (its partitions are then read again from the last commit).
        self.settle_commits(retry_ms=min(self.options.api_timeout_ms,
                                         self.options.rebalance_timeout_ms // 2))

    def _join(self, topics: frozenset[str]) -> None:
        self._settle_before_joining()
        with self._lock:
            self._stable = False
        self.join_rounds(topics, JoinLink(self))

    def join_rounds(self, topics: frozenset[str], link: "JoinLink") -> None:
        """JoinGroup + SyncGroup until the member is in a stable generation, within the
        rebalance's budget; over ``link``'s connection. On the planning thread's link the
        assignment is taken over at once, and a cooperative member gives up what it lost and
        joins the second round here; a background link leaves both to :meth:`_take_rejoin`."""
        budget_ms = (self.options.rebalance_timeout_ms + self.options.session_timeout_ms
                     + self.request_timeout_ms)
        deadline = time.monotonic() + budget_ms / 1000
        failures = 0
        last_error: str | RetriableBrokerError = "none"
        while True:
            self._raise_fatal()
            if link.cancelled:
                return
            try:
                if self._join_once(topics, link):
                    if link.background or self.rejoin_reason() is None or \
                            not getattr(self.assignor, "cooperative", False):
                        return
                    continue                  # the second round of a cooperative rebalance
                last_error = self._last_join_error
            except RetriableBrokerError as exc:
                link.lost_coordinator()
                last_error = exc
            failures += 1
            if time.monotonic() >= deadline:
                raise join_gave_up(
                    f"Could not join consumer group '{self.group_id}' within {budget_ms / 1000:.0f}"
                    f" s (kafka.max.poll.interval.ms + kafka.session.timeout.ms + "
                    f"kafka.request.timeout.ms)", last_error)
            self._backoff(failures)

    def _join_once(self, topics: frozenset[str], link: "JoinLink") -> bool:
        """One JoinGroup + SyncGroup round; True when the member is in a stable generation."""
        node = link.coordinator()
        current = self.generation
        member_id = current.member_id
        cooperative = getattr(self.assignor, "cooperative", False)
        # Cooperative (KIP-429): the member keeps its partitions through the rebalance and says
        # which it owns, in which generation; after fencing it owns nothing (it lost them).
        owned = self._assignment if cooperative and current.generation_id != _NO_GENERATION \
            else ()
        subscription = Subscription(
            tuple(sorted(topics)), user_data=self.assignor.subscription_user_data(set(topics)),
            owned_partitions=owned,
            generation_id=current.generation_id if cooperative else _NO_GENERATION)
        request = JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=self.options.session_timeout_ms,
            rebalance_timeout_ms=self.options.rebalance_timeout_ms, member_id=member_id,
            group_instance_id=self.instance_id, protocol_type=PROTOCOL_TYPE,
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
                name=self.assignor.name, metadata=subscription.encode())],
            reason=self.rejoin_reason(),
            # A static member needs v5 (a broker without it would drop the instance id).
            min_version=5 if self.instance_id is not None else None, max_version=9)
        # The coordinator holds JoinGroup open until every member has joined (at most the
        # rebalance timeout), so the request may take that long.
        timeout = max(self.request_timeout_ms, self.options.rebalance_timeout_ms + 5_000)
        log.info("Group '%s': joining (member '%s'%s, topics %s)", self.group_id,
                 member_id or "-", self._static_note(), sorted(topics))
        sent = time.monotonic()
        try:
            response = link.client.send(node, request, timeout_ms=timeout)
        except Errors.IncompatibleBrokerVersion as exc:
            raise self._no_static_membership(exc) from None
        waited = time.monotonic() - sent
        err = error_for(response.error_code)
        if err is Errors.MemberIdRequiredError:
            # KIP-394: the coordinator assigns the member id; join again with it at once.
            with self._lock:
                self._generation = Generation(member_id=response.member_id)
            self._last_join_error = err.__name__
            return self._join_once(topics, link)
        if err is not Errors.NoError:
            self._on_group_error(err, "JoinGroup", link)
            return False
        generation = Generation(response.generation_id, response.member_id,
                                response.protocol_name)
        with self._lock:
            self._generation = generation
        leader = response.leader == response.member_id
        if leader and len(response.members) == 1 and waited >= _SLOW_FIRST_JOIN_S:
            self._say_initial_delay(waited)
        if leader and response.skip_assignment:
            # KIP-814: a static leader that came back within its session; the group is stable
            # and its assignment stands. It only watches the partition counts from now on.
            topics_of_all = {t for m in response.members
                             for t in Subscription.decode(bytes(m.metadata)).topics}
            self._leader_counts = self.partition_counts(sorted(topics_of_all), link.client)
            assignments = []
        else:
            assignments = self._assign(response.members, generation, link.client) \
                if leader else []
        sync = link.client.send(node, SyncGroupRequest(
            group_id=self.group_id, generation_id=generation.generation_id,
            member_id=generation.member_id, group_instance_id=self.instance_id,
            protocol_type=PROTOCOL_TYPE, protocol_name=generation.protocol,
            assignments=assignments, max_version=5))
        err = error_for(sync.error_code)
        if err is not Errors.NoError:
            self._on_group_error(err, "SyncGroup", link)
            return False
        assignment = Assignment.decode(bytes(sync.assignment or b""))
        self.assignor.on_assignment(assignment)
        remember = getattr(self.assignor, "remember", None)   # the sticky assignors
        if remember is not None:
            remember(assignment.partitions, generation.generation_id)
        partitions = tuple(sorted(set(assignment.partitions)))
        with self._lock:
            if self._generation != generation:  # fenced by the heartbeat thread meanwhile
                self._last_join_error = "the generation changed during SyncGroup"
                return False
            if link.cancelled:                # the member left meanwhile
                return True
            revoked = set()
            if link.background:               # taken over by the planning thread
                self._joined = (partitions, self._generations_lost)
            else:
                revoked = set(self._assignment) - set(partitions)
                self._assignment = partitions
                self._lost_at_assignment = self._generations_lost
            self._topics = topics
            self._stable = True
            self._rejoin_reason = None
            self._leader_counts = self._leader_counts if leader else None
        self.rebalances += 1
        log.info("Group '%s': generation %d, member '%s'%s%s, assigned %s", self.group_id,
                 generation.generation_id, generation.member_id, self._static_note(),
                 " (leader, assignment kept)" if leader and response.skip_assignment else
                 " (leader)" if leader else "", _describe(partitions))
        self._start_heartbeat()
        if cooperative:
            # Its processed offsets were committed before the join, nothing was read since.
            self._rejoin_for_second_round(revoked)
        return True

    def _say_initial_delay(self, waited: float) -> None:
        """Why a query's start took seconds: the member was alone in its group and the JoinGroup
        took ``waited`` s. The usual cause is the brokers' ``group.initial.rebalance.delay.ms``
        (3 s by default), for which a coordinator holds the first member of an *empty* group
        -- a new group, the generated one of every query without ``kafka.group.id``, or one all
        members left -- so that members starting together join in one rebalance. Java's
        consumer waits the same; measured on Kafka 4.0 with the default: 3.0-3.5 s, against
        0.04 s at 0 (docs/groups.md, "Group semantics and guarantees")."""
        log.info("Group '%s': joining took %.1f s with this member alone in the group: brokers "
                 "hold the first member of an empty group for group.initial.rebalance.delay.ms "
                 "(3 s by default) so that members starting together join in one rebalance. "
                 "kafka.group.protocol=consumer (Kafka 4.0+) has no such delay, and a static "
                 "member (kafka.group.instance.id) restarted within kafka.session.timeout.ms "
                 "rejoins at once.", self.group_id, waited)

    def _assign(self, members, generation: Generation, client: BrokerClient) -> list:
        """The leader's job: run the assignor over every member's subscription."""
        if generation.protocol != self.assignor.name:
            raise KafkaSourceError(
                f"Consumer group '{self.group_id}' chose assignor '{generation.protocol}', which "
                f"this query does not offer (option 'assignor' = '{self.assignor.name}').")
        subscriptions = {m.member_id: Subscription.decode(bytes(m.metadata)) for m in members}
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        counts = self.partition_counts(topics, client)
        result = self.assignor.assign(counts, subscriptions)
        result = validate_assignment(result, counts, subscriptions, self.assignor.name) or result
        self._leader_counts = counts
        Item = SyncGroupRequest.SyncGroupRequestAssignment
        return [Item(member_id=member_id,
                     assignment=Assignment(tuple(result.get(member_id, ()))).encode())
                for member_id in subscriptions]

    def partition_counts(self, topics: Iterable[str],
                         client: BrokerClient | None = None) -> dict[str, int]:
        """Partition count of each topic that exists (absent topics are left out). A topic
        this client has seen that the answer lacks is doubted first (RetriableBrokerError: the
        join is tried again), so that the leader does not assign without the partitions of a
        topic a just-started broker does not know yet (:mod:`kafka_source.wire.net.metadata_view`)."""
        topics = list(topics)
        if not topics:
            return {}
        client = client or self._client
        infos = client.checked_metadata(topics, client.view.known_partitions(topics))
        return {t: len(i.partitions) for t, i in infos.items() if i.error_code == 0}

    def _on_group_error(self, err, what: str, link: "JoinLink") -> None:
        """React to a JoinGroup/SyncGroup error: reset what it says is stale, or fail."""
        self._last_join_error = f"{what}: {err.__name__}"
        if err is Errors.UnknownMemberIdError:
            self._reset(keep_member_id=False, reason="the coordinator forgot this member")
        elif err is Errors.IllegalGenerationError:
            self._reset(keep_member_id=True, reason="the generation is stale")
        elif err in COORDINATOR_MOVED:
            link.lost_coordinator()
        elif err in RETRY:
            pass
        elif err is Errors.FencedInstanceIdError:
            raise self._instance_fenced(what)
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

    # --- static membership --------------------------------------------------------------------

    def _instance_fenced(self, what: str) -> OptionError:
        """The error of a static member whose instance id another member joined with: the
        coordinator answered ``what`` with FENCED_INSTANCE_ID. It is fatal and stays so (every
        later call raises it): a rejoin would take the instance id back and fence the other
        member, which would do the same -- two queries taking turns, neither reading."""
        error = OptionError(
            f"Consumer group '{self.group_id}': another member joined with this query's "
            f"'kafka.group.instance.id' = '{self.instance_id}' and took its place (the "
            f"coordinator answered {what} with FENCED_INSTANCE_ID). Two running queries or "
            "consumers must not share an instance id: give each query its own "
            "'kafka.group.instance.id', or leave it out for dynamic membership. This query "
            "stops; the other member keeps the partitions.")
        with self._lock:
            if self._fatal is None:
                self._fatal = error
            error = self._fatal
        return error

    def _no_static_membership(self, exc: Exception) -> OptionError:
        """The group coordinator has no JoinGroup v5: a broker older than Kafka 2.3."""
        error = OptionError(
            f"Option 'kafka.group.instance.id' (static membership, KIP-345) needs Kafka 2.3 or "
            f"later: the coordinator of consumer group '{self.group_id}' does not support "
            f"JoinGroup v5 ({exc}). Leave the option out for a dynamic member, or upgrade the "
            "brokers.")
        with self._lock:
            self._fatal = error
        return error

    # --- leaving ------------------------------------------------------------------------------

    def leave(self, reason: str = "the query stopped", *, retry_commit: bool = True) -> None:
        """Leave the group now (so the others rebalance at once) and stop heartbeating; a
        commit still in flight is waited for first, and made again if it failed (bounded by
        ``kafka.default.api.timeout.ms``, and best effort here). ``retry_commit=False``: the
        cluster could not be reached just now, and the query fails for it; the commit is then
        not made again, so that retries against a cluster that is gone (for up to a minute, by
        default) do not hold back the query's error.

        A static member (``kafka.group.instance.id``) only stops heartbeating, as Java's
        consumer does on close: it keeps its partitions until ``kafka.session.timeout.ms``
        passes, so that a restart within that time gets them back without a rebalance."""
        self._settle_before_leaving(retry_commit)
        self._stop_heartbeat()
        with self._lock:
            rejoiner, self._rejoiner, self._joined = self._rejoiner, None, None
        if rejoiner is not None:
            rejoiner.cancel()    # its JoinGroup is answered once LeaveGroup removed the member
        generation = self.generation
        self._reset(keep_member_id=False, reason="it left the group", fenced=False)
        self._assignment = ()
        if self.manual or not generation.member_id:
            return
        if self.instance_id is not None:
            log.info("Group '%s': static member '%s' (instance '%s') stops without leaving (%s): "
                     "its partitions stay assigned to it until kafka.session.timeout.ms (%d ms) "
                     "passes; a restart with the same kafka.group.instance.id within it gets "
                     "them back without a rebalance", self.group_id, generation.member_id,
                     self.instance_id, reason, self.options.session_timeout_ms)
            return
        request = LeaveGroupRequest(
            group_id=self.group_id, member_id=generation.member_id,
            members=[LeaveGroupRequest.MemberIdentity(member_id=generation.member_id,
                                                      group_instance_id=self.instance_id,
                                                      reason=reason)])
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

    def close(self, *, retry_commit: bool = True) -> None:
        """Leave the group (:meth:`leave`); the planning connection belongs to the caller."""
        self.leave(retry_commit=retry_commit)
        conn, self._rejoin_conn = self._rejoin_conn, None
        if conn is not None:
            conn.close()

    # --- heartbeats ---------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or not self._heartbeat.is_alive():
            # Started before it is published: a background rejoin starts heartbeats while
            # another thread may stop them (and whoever stopped one may join it).
            thread = _HeartbeatThread(self)
            thread.start()
            self._heartbeat = thread

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
            # Keep heartbeating (it keeps the session alive) until the planning thread rejoins;
            # a cooperative member rejoins at once, in the background (.rejoin).
            self.request_rejoin("the group is rebalancing")
            self.rejoin_on_rebalance()
        elif err is Errors.IllegalGenerationError:
            self._reset(keep_member_id=True, reason="the generation is stale",
                        only_if=generation)
        elif err is Errors.UnknownMemberIdError:
            self._reset(keep_member_id=False, reason="the coordinator forgot this member",
                        only_if=generation)
        elif err is Errors.FencedInstanceIdError:
            self._instance_fenced("Heartbeat")
        elif err is Errors.GroupAuthorizationFailedError:
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
                if err in COORDINATOR_MOVED:
                    self._node = None
                    continue
                m.on_heartbeat(generation, err)
                with m._lock:
                    if m._fatal is not None:      # the query fails: nothing left to keep alive
                        return
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
            member_id=generation.member_id, group_instance_id=m.instance_id),
            timeout_ms=m.request_timeout_ms)
        return error_for(response.error_code)


def join_gave_up(message: str, last_error: "str | RetriableBrokerError") -> KafkaSourceError:
    """The error of a join that ran out of time, ``message`` plus its last error. When that
    attempt could not reach a broker at all (:class:`BrokerUnreachableError`) it is a
    :class:`BrokerUnavailableError`: the stream reader then does not make its last commit again
    against a coordinator that is gone while it leaves, which would hold the query's error back
    by ``kafka.default.api.timeout.ms`` (:mod:`kafka_source.read.stream`)."""
    kind = BrokerUnavailableError if isinstance(last_error, BrokerUnreachableError) \
        else KafkaSourceError
    return kind(f"{message}; last error: {last_error}.")


def _describe(partitions) -> str:
    grouped: dict[str, list[int]] = {}
    for topic, partition in partitions:
        grouped.setdefault(topic, []).append(partition)
    return ", ".join(f"{t}{sorted(ps)}" for t, ps in sorted(grouped.items())) or "nothing"
