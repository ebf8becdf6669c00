"""Driver side: membership of a consumer group through the consumer group protocol (KIP-848).

``kafka.group.protocol=consumer`` (Kafka 4.0+). There is no JoinGroup, SyncGroup or group
leader: the member sends ConsumerGroupHeartbeat to the coordinator, and the coordinator runs
the assignor (``kafka.group.remote.assignor``, ``uniform`` or ``range``) and answers each
heartbeat with the member's epoch and, when it changed, the member's whole assignment::

    FindCoordinator -> Heartbeat(epoch 0: join, subscription, assignor, owned [])
                    -> Heartbeat(epoch N, owned partitions) every heartbeat_interval_ms ...
                    ... OffsetFetch v9 / OffsetCommit v9 (member id and epoch)
                    -> Heartbeat(epoch -1: leave; a static member -2)

:class:`ConsumerProtocolMember` offers the stream reader the interface of
:class:`kafka_source.group.member.GroupMember` (``ensure_active``, ``assignment``, ``stable``,
``assignment_is_current``, ``generations_lost``, commits, ``leave``); how the reader uses it is
unchanged. Two threads share it, as with the classic member:

* the **planning thread** joins (epoch 0), and at the start of every trigger
  (:meth:`ConsumerProtocolMember.ensure_active`, after the reader committed what completed
  batches processed) takes over the assignment the coordinator sent meanwhile. Assignment is
  incremental: partitions are added and revoked one change at a time, never all at once.
  A partition the coordinator took away is given up only there, after its commit was settled
  (the rebalance-listener contract of the classic member), and the next heartbeat -- sent at
  once -- acknowledges it by leaving it out of the owned partitions; the coordinator gives it
  to another member only then. New partitions are adopted by the reader from the group's
  committed offsets (the coordinator never hands out a partition another member still owns).
* a daemon **heartbeat thread** sends the heartbeats, every ``heartbeat_interval_ms`` the
  coordinator asked for (its ``group.consumer.heartbeat.interval.ms``; the session timeout is
  the brokers' ``group.consumer.session.timeout.ms``), carrying the subscription and the owned
  partitions; it stores the new epoch and assignment it is answered with.

Topics travel as topic ids: the owned partitions and the assignment name topic ids, resolved
to names with Metadata v10+ on the planning thread.

Commits: OffsetCommit v9 carries the member id and the member epoch (Kafka 4.0 refuses older
versions from a member of such a group with UNSUPPORTED_VERSION). A commit made with an epoch
that changed meanwhile is answered STALE_MEMBER_EPOCH and made again with the new one.

Fencing: UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH (the session expired; the member did not
revoke within the rebalance timeout, ``kafka.max.poll.interval.ms``) means the group went on
without this member. It counts in :attr:`ConsumerProtocolMember.generations_lost`, commits
nothing more, and rejoins with epoch 0 and the same member id; the reader adopts what it gets
again from the group's committed offsets, so a committed offset never moves backwards.

Brokers without the protocol (Kafka before 4.0, or 3.7-3.9 without it enabled) do not list
API 68: the first join fails naming ``kafka.group.protocol`` and saying to use ``classic``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Callable, Iterable, Mapping

import kafka.errors as Errors
from kafka.protocol.metadata import MetadataRequest

from .commits import COORDINATOR_MOVED, GroupCommits
from .member import Generation, _describe, join_gave_up
from ..config.options import GroupOptions
from ..errors import BrokerSecurityError, KafkaSourceError, OptionError
from ..wire.net.client import BrokerClient, RetriableBrokerError, TopicPartition, error_for
from ..wire.net.group_protocol import ConsumerGroupHeartbeatRequest

log = logging.getLogger("kafka_source.group.member")

PROTOCOL = "consumer"
_JOIN_EPOCH = 0
_LEAVE_EPOCH = -1
_LEAVE_STATIC_EPOCH = -2
_LEAVE_TIMEOUT_MS = 5_000
_DEFAULT_INTERVAL_MS = 5_000
# Errors after which the heartbeat (or join) is simply sent again.
_RETRY = COORDINATOR_MOVED + (Errors.CoordinatorLoadInProgressError,)
_FENCED = (Errors.UnknownMemberIdError, Errors.FencedMemberEpochError)


def _no_protocol_error(group_id: str, detail: str) -> OptionError:
    return OptionError(
        f"Option 'kafka.group.protocol' = 'consumer' needs brokers with the consumer group "
        f"protocol (KIP-848: Kafka 4.0+, or 3.7-3.9 with it enabled): the coordinator of "
        f"consumer group '{group_id}' does not support ConsumerGroupHeartbeat ({detail}). Use "
        f"'kafka.group.protocol' = 'classic' (the default) with these brokers.")


class ConsumerProtocolMember(GroupCommits):
    """One membership of ``options.group_id`` in the consumer group protocol; see the module
    docstring. Offsets are :class:`~kafka_source.group.commits.GroupCommits`' (v9)."""

    # OffsetCommit/OffsetFetch versions that carry the member id and epoch (commits.py).
    offset_commit_versions = (9, 9)
    offset_fetch_versions = (9, 9)
    manual = ()

    def __init__(self, client: BrokerClient, client_factory: Callable[[], BrokerClient],
                 options: GroupOptions, *, request_timeout_ms: int = 30_000,
                 retry_backoff_ms: int = 100):
        self.group_id = options.group_id
        self.instance_id = options.group_instance_id
        self.options = options
        self.pattern = options.pattern
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self._client_factory = client_factory
        self._client = client
        self._node: str | int | None = None
        self._lock = threading.Lock()
        # KIP-1082 (ConsumerGroupHeartbeat v1): the client makes the member id, and keeps it.
        self.member_id = str(uuid.uuid4())
        self._epoch = _JOIN_EPOCH           # 0: not in the group (join next)
        self._generation = Generation()     # what commits are made in (epoch -1: none)
        self._joined = False
        self._rejoin_reason: str | None = "first join"
        self._fatal: Exception | None = None
        self._assignment: tuple[TopicPartition, ...] = ()  # adopted by the planning thread
        self._owned_ids: list[tuple[object, list[int]]] = []  # the same, by topic id
        self._target: list[tuple[object, list[int]]] | None = None  # received, not yet adopted
        self._target_seq = 0                # bumped for every assignment received
        self._adopted_seq = 0
        self._interval_ms = _DEFAULT_INTERVAL_MS
        self._topics: frozenset[str] = frozenset()
        self._names: dict[object, str] = {}  # topic id -> name (Metadata v10+)
        self._heartbeat: _Heartbeats | None = None
        self._init_commits()
        self.rebalances = 0                 # assignments adopted
        self._generations_lost = 0
        self._lost_at_assignment = 0

    # --- state (GroupMember's interface) ------------------------------------------------------

    @property
    def generation(self) -> Generation:
        with self._lock:
            return self._generation

    @property
    def epoch(self) -> int:
        with self._lock:
            return self._epoch

    @property
    def assignment(self) -> tuple[TopicPartition, ...]:
        return self._assignment

    @property
    def stable(self) -> bool:
        with self._lock:
            return self._joined

    @property
    def generations_lost(self) -> int:
        """How many times the coordinator fenced this member (UNKNOWN_MEMBER_ID,
        FENCED_MEMBER_EPOCH): see :attr:`GroupMember.generations_lost`."""
        with self._lock:
            return self._generations_lost

    @property
    def generations_lost_at_assignment(self) -> int:
        with self._lock:
            return self._lost_at_assignment

    def rejoin_reason(self) -> str | None:
        with self._lock:
            return self._rejoin_reason

    def assignment_is_current(self) -> bool:
        """Whether :attr:`assignment` holds as it is: joined, no new assignment received that
        is not adopted yet, not fenced. Raises what the heartbeat thread found fatal."""
        self._raise_fatal()
        with self._lock:
            return (self._joined and self._rejoin_reason is None
                    and self._target_seq == self._adopted_seq)

    def request_rejoin(self, reason: str) -> None:
        """The consumer protocol has no rejoin short of fencing; a commit refused for a
        rebalance only means the next heartbeat brings the news."""
        log.info("Group '%s': %s", self.group_id, reason)

    def _reset(self, *, keep_member_id: bool = True, reason: str, fenced: bool = True,
               only_if: int | None = None) -> None:
        """Leave the epoch: join again with epoch 0 (same member id). ``only_if``: unless the
        epoch changed meanwhile. ``fenced``: counted in :attr:`generations_lost`."""
        with self._lock:
            if only_if is not None and self._epoch != only_if:
                return
            old = self._epoch
            self._epoch = _JOIN_EPOCH
            self._generation = Generation(member_id=self.member_id)
            self._joined = False
            self._target = None
            self._target_seq = self._adopted_seq
            self._rejoin_reason = self._rejoin_reason or reason
            if fenced:
                self._generations_lost += 1
                log.warning("Group '%s': member '%s' lost epoch %d (%s); it rejoins with epoch 0, "
                            "and the partitions it gets are adopted again from the group's "
                            "committed offsets", self.group_id, self.member_id, old, reason)

    def _set_fatal(self, error: Exception) -> Exception:
        with self._lock:
            if self._fatal is None:
                self._fatal = error
            return self._fatal

    def _instance_fenced(self, what: str) -> OptionError:
        return self._set_fatal(OptionError(
            f"Consumer group '{self.group_id}': another member uses this query's "
            f"'kafka.group.instance.id' = '{self.instance_id}' ({what} answered "
            "FENCED_INSTANCE_ID). Give each query its own 'kafka.group.instance.id'."))

    # --- membership ---------------------------------------------------------------------------

    def ensure_active(self, topics: Iterable[str],
                      partition_counts: Mapping[str, int] | None = None
                      ) -> tuple[TopicPartition, ...]:
        """Join if needed, take over the assignment received since the last call, and return
        this member's partitions. Called by the reader after it committed what completed
        batches processed: revoked partitions are given up here, once that commit is settled,
        and the heartbeat that acknowledges them goes out at once. ``partition_counts`` is not
        needed: the coordinator watches partition counts itself."""
        self._raise_fatal()
        topics = frozenset(topics)
        if topics != self._topics:
            self._topics = topics             # the next heartbeat carries it
            if self.pattern is None and self.stable:
                self._wake()
        if self.rejoin_reason() is not None:
            self._join()
        self._adopt_target()
        return self._assignment

    def _subscription_fields(self) -> dict:
        if self.pattern is not None:
            return {"subscribed_topic_regex": self.pattern, "subscribed_topic_names": None}
        return {"subscribed_topic_names": sorted(self._topics)}

    def heartbeat_request(self, epoch: int, owned) -> ConsumerGroupHeartbeatRequest:
        """A full heartbeat: every field is sent each time (the coordinator compares them with
        what it has; a null would mean 'unchanged'), so that nothing depends on which earlier
        heartbeat arrived."""
        return ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=epoch,
            instance_id=self.instance_id, rack_id=None,
            rebalance_timeout_ms=self.options.rebalance_timeout_ms,
            server_assignor=self.options.remote_assignor,
            topic_partitions=[ConsumerGroupHeartbeatRequest.TopicPartitions(
                topic_id=tid, partitions=sorted(ps)) for tid, ps in owned],
            # The regex needs v1 (Kafka 4.0); names work from v0 (3.7+ with the protocol on).
            min_version=1 if self.pattern is not None else None, max_version=1,
            **self._subscription_fields())

    def _join(self) -> None:
        """Heartbeat with epoch 0 until the coordinator takes the member in, within
        ``kafka.max.poll.interval.ms`` + ``kafka.request.timeout.ms``."""
        self.settle_commits(retry_ms=min(self.options.api_timeout_ms,
                                         self.options.rebalance_timeout_ms // 2))
        budget_ms = self.options.rebalance_timeout_ms + self.request_timeout_ms
        deadline = time.monotonic() + budget_ms / 1000
        failures = 0
        last_error: str | RetriableBrokerError = "none"
        while True:
            self._raise_fatal()
            try:
                error = self._join_once()
                if error is None:
                    self._await_pattern_resolution()
                    return
                last_error = error
            except RetriableBrokerError as exc:
                self._node = None
                last_error = exc
            failures += 1
            if time.monotonic() >= deadline:
                raise join_gave_up(
                    f"Could not join consumer group '{self.group_id}' (consumer protocol) within "
                    f"{budget_ms / 1000:.0f} s (kafka.max.poll.interval.ms + "
                    f"kafka.request.timeout.ms)", last_error)
            self._backoff(failures)

    def _await_pattern_resolution(self) -> None:
        """With ``subscribePattern`` the brokers match the regex against the topics in the
        background after the join (Kafka 4.0 answers the join with an empty assignment and
        has the partitions a few hundred milliseconds later). Heartbeat at once, a few times,
        for at most one heartbeat interval (and 3 s), so that the first trigger starts with the
        partitions, as with topic names, instead of adopting them a trigger later."""
        if self.pattern is None:
            return
        with self._lock:
            wait_s = min(self._interval_ms / 1000, 3.0)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._joined or (self._target is not None and any(
                        ps for _, ps in self._target)):
                    return
            self._wake()
            time.sleep(0.1)
        log.info("Group '%s': no partitions match pattern '%s' yet (or other members own them); "
                 "they are taken when the brokers assign them", self.group_id, self.pattern)

    def _join_once(self) -> str | None:
        """One join heartbeat; None when joined, else why not (to retry). Raises for errors no
        retry can fix."""
        node = self._coordinator()
        request = self.heartbeat_request(_JOIN_EPOCH, [])
        log.info("Group '%s': joining with the consumer protocol (member '%s'%s, %s)",
                 self.group_id, self.member_id, self._static_note(),
                 f"pattern '{self.pattern}'" if self.pattern is not None
                 else f"topics {sorted(self._topics)}")
        try:
            response = self._client.send(node, request)
        except Errors.IncompatibleBrokerVersion as exc:
            raise self._set_fatal(self._no_protocol(exc)) from None
        err = error_for(response.error_code)
        if err is not Errors.NoError:
            return self._on_error(err, response.error_message, "ConsumerGroupHeartbeat (join)")
        with self._lock:
            if response.member_id:            # v0: the coordinator made it
                self.member_id = response.member_id
            self._epoch = response.member_epoch
            self._generation = Generation(response.member_epoch, self.member_id, PROTOCOL)
            self._joined = True
            self._rejoin_reason = None
            self._interval_ms = response.heartbeat_interval_ms or _DEFAULT_INTERVAL_MS
            self._assignment = ()
            self._owned_ids = []
            self._take_assignment(response)
            self._lost_at_assignment = self._generations_lost
        log.info("Group '%s': member '%s'%s joined with epoch %d (heartbeat every %d ms)",
                 self.group_id, self.member_id, self._static_note(), response.member_epoch,
                 self._interval_ms)
        self._start_heartbeat()
        return None

    def _no_protocol(self, exc) -> OptionError:
        if self.pattern is not None:
            return OptionError(
                f"Option 'kafka.group.protocol' = 'consumer' with 'subscribePattern' needs "
                f"ConsumerGroupHeartbeat v1 (Kafka 4.0+; the pattern is sent to the brokers), "
                f"which the coordinator of consumer group '{self.group_id}' lacks ({exc}). Use "
                f"'kafka.group.protocol' = 'classic' (the default) with these brokers, or "
                f"'subscribe' with topic names on Kafka 3.7-3.9.")
        return _no_protocol_error(self.group_id, str(exc))

    def _take_assignment(self, response) -> None:
        """Store the assignment of a heartbeat answer (under the lock); None: unchanged."""
        if response.assignment is None:
            return
        self._target = [(tp.topic_id, list(tp.partitions))
                        for tp in response.assignment.topic_partitions]
        self._target_seq += 1

    def _adopt_target(self) -> None:
        """Take over the assignment received since the last trigger (planning thread)."""
        with self._lock:
            target, seq = self._target, self._target_seq
            if seq == self._adopted_seq or target is None:
                return
        names = self._topic_names([tid for tid, _ in target])
        partitions = sorted({(names[tid], p) for tid, ps in target if tid in names for p in ps})
        unresolved = [tid for tid, _ in target if tid not in names]
        revoked = sorted(set(self._assignment) - set(partitions))
        added = sorted(set(partitions) - set(self._assignment))
        if revoked:
            # Their processed offsets were committed by the reader just before this call; the
            # answer is awaited (and a failed commit made again) before they are given up.
            self.settle_commits(retry_ms=min(self.options.api_timeout_ms,
                                             self.options.rebalance_timeout_ms // 2))
        with self._lock:
            if not self._joined:
                return                        # fenced meanwhile: the rejoin brings the rest
            self._assignment = tuple(partitions)
            self._owned_ids = [(tid, sorted(ps)) for tid, ps in target if tid in names]
            self._adopted_seq = seq
            self._lost_at_assignment = self._generations_lost
        if revoked or added:
            self.rebalances += 1
            log.info("Group '%s': epoch %d, member '%s': assigned %s%s%s", self.group_id,
                     self.epoch, self.member_id, _describe(partitions),
                     f"; new {_describe(added)}" if added else "",
                     f"; revoked {_describe(revoked)}" if revoked else "")
        if unresolved:
            # A topic created a moment ago: taken at a later trigger, once metadata has it.
            log.warning("Group '%s': the assignment names topic ids %s that metadata does not "
                        "know yet; their partitions are taken at a later trigger",
                        self.group_id, ", ".join(str(t) for t in unresolved))
            with self._lock:
                if self._adopted_seq == seq:
                    self._adopted_seq = seq - 1
        if revoked:
            self._wake()                      # acknowledge the revocation at once

    def _topic_names(self, topic_ids) -> dict:
        """Topic id -> name for ``topic_ids``: Metadata v10+ of the subscribed topics, and of all
        topics for ids still unknown (a pattern's topic this query has not matched yet)."""
        for names in (sorted(self._topics), None):   # the subscribed topics first, then all
            if all(t in self._names for t in topic_ids) or names == []:
                continue
            response = self._client.send(None, MetadataRequest(
                topics=None if names is None else [
                    MetadataRequest.MetadataRequestTopic(name=n) for n in names],
                allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False, min_version=10))
            for topic in response.topics:
                if topic.error_code == 0 and topic.topic_id is not None:
                    self._names[topic.topic_id] = topic.name
        return {t: self._names[t] for t in topic_ids if t in self._names}

    def _on_error(self, err, message: str | None, what: str) -> str:
        """React to a heartbeat error during the join: retry (returns why) or raise."""
        detail = f"{what}: {err.__name__}" + (f" ({message})" if message else "")
        if err in COORDINATOR_MOVED:
            self._node = None
            return detail
        if err in _RETRY or err in _FENCED:
            return detail
        if err is Errors.UnreleasedInstanceIdError:
            # A static member of this instance id that has not left: its session expiring
            # (or its leave) releases the id; the join budget covers that.
            log.info("Group '%s': instance '%s' is still held by a member that has not left "
                     "(UNRELEASED_INSTANCE_ID); retrying until its session expires",
                     self.group_id, self.instance_id)
            return (f"{detail}; another member holds 'kafka.group.instance.id' = "
                    f"'{self.instance_id}'")
        if err is Errors.UnsupportedVersionError:
            raise self._set_fatal(_no_protocol_error(self.group_id, detail))
        if err is Errors.UnsupportedAssignorError:
            raise self._set_fatal(OptionError(
                f"The coordinator of consumer group '{self.group_id}' does not offer option "
                f"'kafka.group.remote.assignor' = '{self.options.remote_assignor}' "
                f"({message}). Use one it offers, or leave the option out for the brokers' "
                "default."))
        if err.errno == 128:                  # INVALID_REGULAR_EXPRESSION (kafka-python lacks it)
            raise self._set_fatal(OptionError(
                f"The brokers refused option 'subscribePattern' = '{self.pattern}' as the "
                f"consumer protocol's regular expression (RE2/J syntax): {message}. Fix the "
                "pattern, or use 'kafka.group.protocol' = 'classic', where the pattern is "
                "matched by this query."))
        if err is Errors.FencedInstanceIdError:
            raise self._instance_fenced(what)
        if err is Errors.GroupAuthorizationFailedError:
            raise self._set_fatal(KafkaSourceError(
                f"Not authorized to use consumer group '{self.group_id}' (option "
                "'kafka.group.id'): grant READ on the group."))
        if err is Errors.GroupMaxSizeReachedError:
            raise self._set_fatal(KafkaSourceError(
                f"Consumer group '{self.group_id}' is full (the brokers' "
                f"group.consumer.max.size): {message}."))
        if err is Errors.GroupIdNotFoundError:
            raise self._set_fatal(KafkaSourceError(
                f"Consumer group '{self.group_id}' cannot take a member of the consumer protocol "
                f"({err.__name__}: {message}); it may be a classic group the brokers do not "
                "convert (group.consumer.migration.policy). Use 'kafka.group.protocol' = "
                "'classic', or another 'kafka.group.id'."))
        raise self._set_fatal(KafkaSourceError(
            f"{what} for consumer group '{self.group_id}' failed: {err.__name__} "
            f"({message or getattr(err, 'description', '')})."))

    # --- heartbeats (called from the heartbeat thread) ----------------------------------------

    def heartbeat_target(self):
        """(epoch, owned topic ids and partitions) to heartbeat with; None while not joined."""
        with self._lock:
            if not self._joined:
                return None
            return self._epoch, list(self._owned_ids)

    def on_heartbeat(self, epoch: int, response) -> None:
        """Apply a heartbeat answer sent with ``epoch``."""
        err = error_for(response.error_code)
        with self._lock:
            if self._epoch != epoch or not self._joined:
                return          # about an epoch already left (fenced, rejoined, left)
            if err is Errors.NoError:
                if response.member_epoch != self._epoch:
                    self._epoch = response.member_epoch
                    self._generation = Generation(response.member_epoch, self.member_id,
                                                  PROTOCOL)
                if response.heartbeat_interval_ms:
                    self._interval_ms = response.heartbeat_interval_ms
                self._take_assignment(response)
                return
        if err in _FENCED:
            self._reset(reason=f"the heartbeat was answered {err.__name__}", only_if=epoch)
        elif err is Errors.FencedInstanceIdError:
            self._instance_fenced("ConsumerGroupHeartbeat")
        elif err is Errors.GroupAuthorizationFailedError:
            self._set_fatal(KafkaSourceError(f"Heartbeat for consumer group '{self.group_id}' "
                                             f"failed: {err.__name__}."))
        elif err is Errors.UnsupportedAssignorError or err.errno == 128:
            try:
                self._on_error(err, response.error_message, "ConsumerGroupHeartbeat")
            except KafkaSourceError:
                pass                          # stored as fatal: raised at the next trigger
        else:
            log.warning("Group '%s': heartbeat answered %s (%s)", self.group_id, err.__name__,
                        response.error_message)

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or not self._heartbeat.is_alive():
            self._heartbeat = _Heartbeats(self)
            self._heartbeat.start()

    def _stop_heartbeat(self) -> None:
        thread, self._heartbeat = self._heartbeat, None
        if thread is not None:
            thread.stop()
            thread.join(timeout=self.request_timeout_ms / 1000 + 1)

    def _wake(self) -> None:
        thread = self._heartbeat
        if thread is not None:
            thread.wake()

    # --- leaving ------------------------------------------------------------------------------

    def leave(self, reason: str = "the query stopped", *, retry_commit: bool = True) -> None:
        """Settle the last commit, stop heartbeating and leave: epoch -1, or -2 for a static
        member (``kafka.group.instance.id``), which keeps its assignment for a restart with the
        same instance id within the brokers' session timeout. ``retry_commit``: as in
        :meth:`kafka_source.group.member.GroupMember.leave`."""
        self._settle_before_leaving(retry_commit)
        self._stop_heartbeat()
        with self._lock:
            joined = self._joined
        self._reset(reason="it left the group", fenced=False)
        self._assignment = ()
        self._owned_ids = []
        if not joined:
            return
        epoch = _LEAVE_EPOCH if self.instance_id is None else _LEAVE_STATIC_EPOCH
        request = ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=epoch,
            instance_id=self.instance_id, max_version=1)
        try:
            timeout_ms = min(self.request_timeout_ms, _LEAVE_TIMEOUT_MS)
            response = self._client.send(self._coordinator(), request, timeout_ms=timeout_ms)
            log.info("Group '%s': member '%s'%s left with epoch %d (%s; %s)", self.group_id,
                     self.member_id, self._static_note(), epoch,
                     error_for(response.error_code).__name__, reason)
        except Exception as exc:              # best effort: the session timeout covers it
            log.warning("Group '%s': leaving failed (%s); the coordinator drops the member "
                        "after its session timeout", self.group_id, exc)

    def close(self, *, retry_commit: bool = True) -> None:
        self.leave(retry_commit=retry_commit)


class _Heartbeats(threading.Thread):
    """Sends ConsumerGroupHeartbeat every interval the coordinator asked for, or at once when
    woken (an acknowledged revocation, a changed subscription)."""

    def __init__(self, member: ConsumerProtocolMember):
        super().__init__(name=f"pykafka-heartbeat-{member.group_id}", daemon=True)
        self.member = member
        self._stopped = threading.Event()
        self._woken = threading.Event()
        self._client: BrokerClient | None = None
        self._node = None

    def stop(self) -> None:
        self._stopped.set()
        self._woken.set()

    def wake(self) -> None:
        self._woken.set()

    def run(self) -> None:
        m = self.member
        try:
            while not self._stopped.is_set():
                with m._lock:
                    interval = m._interval_ms / 1000
                self._woken.wait(interval)
                self._woken.clear()
                if self._stopped.is_set():
                    return
                target = m.heartbeat_target()
                if target is None:
                    continue
                epoch, owned = target
                try:
                    response = self._beat(epoch, owned)
                except RetriableBrokerError as exc:
                    self._node = None
                    log.info("Group '%s': heartbeat failed (%s); retrying", m.group_id, exc)
                    continue
                except BrokerSecurityError as exc:
                    m._set_fatal(exc)
                    return
                except Exception as exc:      # never let the thread die silently
                    log.warning("Group '%s': heartbeat error: %s", m.group_id, exc)
                    self._node = None
                    continue
                if self._stopped.is_set():
                    return
                if error_for(response.error_code) in COORDINATOR_MOVED:
                    self._node = None
                    continue
                m.on_heartbeat(epoch, response)
                with m._lock:
                    if m._fatal is not None:
                        return
        finally:
            if self._client is not None:
                self._client.close()

    def _beat(self, epoch: int, owned):
        m = self.member
        if self._client is None:
            self._client = m._client_factory()
        if self._node is None:
            self._node = self._client.find_coordinator(m.group_id)
        return self._client.send(self._node, m.heartbeat_request(epoch, owned),
                                 timeout_ms=m.request_timeout_ms)
