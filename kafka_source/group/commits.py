"""The offsets half of a consumer-group member: OffsetFetch and OffsetCommit at the coordinator.

:class:`GroupCommits` is mixed into :class:`kafka_source.group.member.GroupMember`, which keeps
the membership (JoinGroup, SyncGroup, heartbeats, LeaveGroup); see that module's docstring for
the threading and for why commits are best effort. A commit is made in the member's current
generation (manual assignment: outside any, generation -1); the coordinator's answer decides
whether the member was fenced (it then rejoins), must retry, or has hit an error no retry can
fix (raised).

The mixin uses these of the member: ``group_id``, ``instance_id``, ``options``, ``manual``,
``request_timeout_ms``, ``generation``, ``_client`` (the planning thread's connection),
``_node`` (the coordinator, None: look it up again), ``_lock``, ``_fatal``, ``retry_backoff_ms``,
``_reset()``, ``request_rejoin()``, ``_instance_fenced()``, and the commit state it initialises
with :meth:`GroupCommits._init_commits`. It also holds what the classic member
(:mod:`~kafka_source.group.member`) and the consumer-protocol member
(:mod:`~kafka_source.group.consumer_protocol`) do alike: finding the coordinator, backing off,
raising a fatal error.

Leader epochs (KIP-320). A commit carries, per partition, the leader epoch the committed offset
was read in when the caller knows it (OffsetCommit v6+, Kafka 2.1+; -1 otherwise), and
:meth:`GroupCommits.committed_positions` returns it with the offset (OffsetFetch v5+). Kafka's
Java consumer does the same: whoever resumes from a committed offset -- this query after a
restart, another member after a rebalance -- can then ask the current leader whether the log
still holds that offset in that epoch, and so notice a truncation (an unclean leader election)
that happened while nobody was reading (:mod:`kafka_source.read.truncation`).

Stable reads (OffsetFetch ``RequireStable``, v7+, Kafka 2.5+). Offsets are asked for with it,
where the broker takes it, so that a read returns every commit the coordinator has acknowledged.
Without it, Kafka 4's group coordinator answers from its state as of the offsets partition's
high watermark, and a coordinator that has just taken over loads that partition with the
watermark it had as a follower, which can lag the commits its predecessor acknowledged: for a
moment after a coordinator move the group's offsets read older than they are (seen in a rolling
restart of a 3-broker KRaft cluster: 116 acknowledged, 104 read back). A member that starts
from them would read those records again and commit an offset behind the group's. With the flag
the coordinator first waits for its watermark to cover everything it has loaded or written (Kafka
2.5-3.x's coordinator answers UNSTABLE_OFFSET_COMMIT instead while a transaction's offsets are
pending); both are retried here like a coordinator that is still loading.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import kafka.errors as Errors
from kafka.protocol.consumer import OffsetCommitRequest, OffsetFetchRequest

from ..wire.net.client import RetriableBrokerError, TopicPartition, error_for
from ..errors import BrokerUnavailableError, KafkaSourceError

# The member's logger: one name for everything the group member logs.
log = logging.getLogger("kafka_source.group.member")

# Errors after which the request is simply sent again (after rediscovery where it applies).
COORDINATOR_MOVED = (Errors.NotCoordinatorError, Errors.CoordinatorNotAvailableError)
RETRY = COORDINATOR_MOVED + (Errors.CoordinatorLoadInProgressError,
                             Errors.RebalanceInProgressError, Errors.UnstableOffsetCommitError)
# The longest pause between two attempts at the coordinator.
_MAX_BACKOFF_S = 1.0
# How long leaving may retry a failed last commit, at most: Java's KafkaConsumer.close() bounds
# its last commit and LeaveGroup by 30 s (its default close timeout). kafka.default.api.timeout.ms
# (a minute by default) would hold a query.stop() that long against a cluster that is gone.
CLOSE_COMMIT_TIMEOUT_MS = 30_000
# What one OffsetCommit request may hold, in bytes of the records the coordinator writes for it.
# The coordinator writes a request's offsets to __consumer_offsets as one record batch, and a
# batch larger than that topic's max.message.bytes (1 MiB by default) fails the whole commit:
# Kafka 4.0 answers UNKNOWN_SERVER_ERROR for every partition, Kafka 2.x
# INVALID_COMMIT_OFFSET_SIZE. Measured on Kafka 4.0: a query over a pattern matching 10,000
# topics failed so at its second trigger (19-byte topic names, a 42-byte group id, about 105
# bytes a record); kafka-python's commit of the same 10,000 partitions failed too, of 9,000 not.
# Larger commits go in several requests of at most this much (:func:`commit_chunks`): each
# partition's offset stands on its own, so a commit split in parts keeps its meaning.
COMMIT_REQUEST_BYTES = 512 * 1024
# Per partition, besides the group id and the topic name: the record's own fields (length,
# attributes, offset and timestamp deltas, key and value lengths, headers) and the offset
# key's and value's fields (versions, partition, offset, leader epoch, metadata length,
# commit timestamp).
_COMMIT_RECORD_OVERHEAD = 48


def commit_chunks(group_id: str, offsets: Mapping[TopicPartition, int],
                  budget: int | None = None) -> list[dict[TopicPartition, int]]:
    """``offsets`` in parts whose records stay under ``budget`` bytes each (default
    :data:`COMMIT_REQUEST_BYTES`: one part for any commit of a few thousand partitions or
    fewer), in partition order."""
    budget = COMMIT_REQUEST_BYTES if budget is None else budget
    group_bytes = len(group_id.encode())
    parts: list[dict[TopicPartition, int]] = []
    current: dict[TopicPartition, int] = {}
    size = 0
    for tp, offset in sorted(offsets.items()):
        record = _COMMIT_RECORD_OVERHEAD + group_bytes + len(tp[0].encode())
        if current and size + record > budget:
            parts.append(current)
            current, size = {}, 0
        current[tp] = offset
        size += record
    if current:
        parts.append(current)
    return parts

@dataclass
class _PendingCommit:
    """A commit :meth:`GroupCommits.commit_async` sent: ``parts``, one per OffsetCommit request
    (:func:`commit_chunks`), each ``(offsets, future, error)`` (``future`` None: it could not be
    sent, for the reason in ``error``)."""
    offsets: dict
    parts: list
    on_done: Callable[[bool], None]
    sent_at: float = 0.0               # time.monotonic()
    epochs: dict = field(default_factory=dict)   # leader epoch per partition (KIP-320)
    generation: object = None          # the member's generation it was made in


class GroupCoordinatorTimeoutError(KafkaSourceError):
    """A request to the group's coordinator (OffsetFetch, OffsetCommit) failed for retriable
    reasons for its whole time budget, ``kafka.default.api.timeout.ms``. Commits that run out of
    time are logged and made again at the next trigger; an offset fetch that does fails the
    query with this error, which names the option and the last error seen."""


class GroupCommits:
    """OffsetFetch and OffsetCommit for :class:`kafka_source.group.member.GroupMember`."""

    # --- what both members (classic and consumer protocol) do alike -----------------------------

    def _backoff(self, failures: int) -> None:
        """Exponential backoff from ``kafka.retry.backoff.ms``, at most _MAX_BACKOFF_S."""
        time.sleep(min(self.retry_backoff_ms / 1000 * 2 ** min(failures - 1, 6), _MAX_BACKOFF_S))

    def _coordinator(self):
        if self._node is None:
            self._node = self._find_coordinator_on(self._client)
        return self._node

    def _find_coordinator_on(self, client):
        """The group's coordinator as ``client`` finds it; a refusal names the option."""
        try:
            return client.find_coordinator(self.group_id)
        except Errors.GroupAuthorizationFailedError:
            raise KafkaSourceError(f"Not authorized to use consumer group '{self.group_id}' "
                                   "(option 'kafka.group.id'): grant DESCRIBE and READ on "
                                   "the group.") from None

    def _static_note(self) -> str:
        return "" if self.instance_id is None else f", instance '{self.instance_id}'"

    def _raise_fatal(self) -> None:
        """Raise the error no retry can fix that the member ran into, if any: it stays fatal."""
        with self._lock:
            fatal = self._fatal
        if fatal is not None:
            raise fatal

    # --- offsets ---------------------------------------------------------------------------------

    def _init_commits(self) -> None:
        self._pending_commit: _PendingCommit | None = None   # sent by commit_async
        self._failed_commits = 0         # commits failed in a row (retriable errors)
        self._commits_failing_since = 0.0
        self._commit_warned_at = 0.0

    def _with_coordinator(self, what: str, attempt: Callable[[object], object], *,
                          budget_ms: int | None = None, errors: list | None = None):
        """Run ``attempt(node)`` until it returns non-None, rediscovering the coordinator, for
        at most ``budget_ms`` (default ``kafka.default.api.timeout.ms``, as the Java consumer's
        commitSync and committed): one request that timed out (``kafka.request.timeout.ms``) is
        retried. ``attempt`` may append why it failed to ``errors``. Raises
        :class:`GroupCoordinatorTimeoutError` when the budget is spent."""
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
                raise GroupCoordinatorTimeoutError(f"{what} for consumer group '{self.group_id}' did not "
                                        f"succeed within {budget_ms} ms (option "
                                        f"'kafka.default.api.timeout.ms'); last error: "
                                        f"{last_error}.")
            self._backoff(failures)

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None where there is none)."""
        return {tp: None if position is None else position[0]
                for tp, position in self.committed_positions(partitions).items()}

    def committed_positions(self, partitions: Iterable[TopicPartition]
                            ) -> dict[TopicPartition, tuple[int, int] | None]:
        """The group's committed (offset, leader epoch) of each partition (None where there is
        none; the epoch is -1 when the committer gave none or the broker predates OffsetFetch
        v5)."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(set(partitions)):
            by_topic.setdefault(topic, []).append(partition)
        if not by_topic:
            return {}
        T = OffsetFetchRequest.OffsetFetchRequestTopic
        G = OffsetFetchRequest.OffsetFetchRequestGroup
        low, high = getattr(self, "offset_fetch_versions", (None, 8))
        stale: list = []

        def request():
            # The consumer protocol (v9) names the member and its epoch. After a
            # STALE_MEMBER_EPOCH answer the offsets are asked for as an admin client does (no
            # member: only reading, nothing to fence), rather than waiting for the new epoch.
            member = {}
            if high >= 9 and not stale:
                generation = self.generation
                if generation.generation_id >= 0:   # else as an admin client: no member
                    member = {"member_id": generation.member_id,
                              "member_epoch": generation.generation_id}
            return OffsetFetchRequest(
                group_id=self.group_id,
                topics=[T(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
                groups=[G(group_id=self.group_id, topics=[
                    G.OffsetFetchRequestTopics(name=t, partition_indexes=ps)
                    for t, ps in by_topic.items()], **member)],
                require_stable=True,   # stable reads: module docstring
                min_version=low, max_version=high)

        def attempt(node):
            response = self._client.send(node, request())
            if response.version >= 8:
                group = response.groups[0]
                code, topics = group.error_code, group.topics
            else:
                code = response.error_code if response.version >= 2 else 0
                topics = response.topics
            if response.version >= 9 and error_for(code) in (Errors.UnknownMemberIdError,
                                                             Errors.FencedMemberEpochError):
                # Consumer protocol: the member was fenced. It rejoins at the next trigger;
                # the offsets are asked for again without a member meanwhile.
                self._reset(keep_member_id=True, reason=f"OffsetFetch answered "
                                                        f"{error_for(code).__name__}")
                return None
            if error_for(code) is Errors.StaleMemberEpochError:
                stale.append(code)
                return None
            if not self._offset_error_ok(error_for(code), "OffsetFetch"):
                return None
            result: dict[TopicPartition, tuple[int, int] | None] = {
                (t, p): None for t, ps in by_topic.items() for p in ps}
            for topic in topics:
                for p in topic.partitions:
                    err = error_for(p.error_code)
                    if err is Errors.UnknownTopicOrPartitionError:
                        continue
                    if not self._offset_error_ok(err, "OffsetFetch"):
                        return None
                    if p.committed_offset >= 0:
                        epoch = getattr(p, "committed_leader_epoch", -1)   # v5+
                        result[(topic.name, p.partition_index)] = (
                            p.committed_offset, -1 if epoch is None else epoch)
            return result

        return self._with_coordinator("OffsetFetch", attempt)

    def commit(self, offsets: Mapping[TopicPartition, int],
               epochs: Mapping[TopicPartition, int] | None = None) -> bool:
        """Commit ``offsets`` in this member's generation and wait; False if the member was
        fenced (it then rejoins at the next :meth:`ensure_active`). ``epochs``: the leader
        epoch of each offset, where known (module docstring).

        Only partitions this member owns may be committed (the caller filters). In manual
        assignment mode the commit is made outside any generation, as Kafka allows.
        """
        self.settle_commits()                 # commits apply in the order they were made
        return self._commit_sync(offsets, epochs=epochs)

    def _commit_sync(self, offsets: Mapping[TopicPartition, int], *,
                     budget_ms: int | None = None,
                     epochs: Mapping[TopicPartition, int] | None = None) -> bool:
        """Commit ``offsets`` and wait, in as many requests as their size needs
        (:func:`commit_chunks`); False once one part is refused or fails (the rest is not
        sent: the caller commits all of it again)."""
        if not offsets or self._commit_identity() is None:
            return not offsets
        return all(self._commit_sync_part(part, budget_ms, epochs)
                   for part in commit_chunks(self.group_id, offsets))

    def _commit_sync_part(self, offsets: Mapping[TopicPartition, int],
                          budget_ms: int | None,
                          epochs: Mapping[TopicPartition, int] | None) -> bool:
        if self._commit_identity() is None:   # the generation was lost after an earlier part
            return False
        fenced: list = []
        errors: list = []
        sent: list = [None]

        def attempt(node):
            # Made anew each attempt: under the consumer protocol the member epoch it carries
            # may have changed since the last one (STALE_MEMBER_EPOCH).
            sent[0] = self.generation
            request = self._commit_request(offsets, epochs, sent[0])
            if request is None:               # the generation was lost meanwhile (and reset)
                fenced.append(None)
                return False
            return self._commit_outcome(self._client.send(node, request), fenced, errors)

        ok = self._with_coordinator("OffsetCommit", attempt, budget_ms=budget_ms, errors=errors)
        return self._commit_done(offsets, ok, fenced, sent[0])

    def commit_async(self, offsets: Mapping[TopicPartition, int],
                     on_done: Callable[[bool], None] | None = None,
                     epochs: Mapping[TopicPartition, int] | None = None) -> None:
        """Send an OffsetCommit of ``offsets`` (with the leader ``epochs`` where known) without
        waiting for the answer; several, one after the other on the coordinator's connection,
        when the offsets are too many for one (:func:`commit_chunks`).

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
        generation = self.generation
        if not offsets or self._commit_identity(generation) is None:
            if on_done is not None:
                on_done(not offsets)
            return
        parts = []
        for part in commit_chunks(self.group_id, offsets):
            error = ""
            try:
                future = self._client.send_now(self._coordinator(),
                                               self._commit_request(part, epochs, generation))
            except (RetriableBrokerError, BrokerUnavailableError, Errors.KafkaError) as exc:
                log.debug("Group '%s': OffsetCommit not sent (%s)", self.group_id, exc)
                self._node = None
                future, error = None, f"not sent: {exc}"
            parts.append((part, future, error))
        self._pending_commit = _PendingCommit(dict(offsets), parts,
                                              on_done or (lambda accepted: None),
                                              sent_at=time.monotonic(),
                                              epochs=dict(epochs or {}),
                                              generation=generation)

    def settle_commits(self, *, retry_ms: int | None = None) -> None:
        """Wait for the answer to a commit :meth:`commit_async` sent and apply it; the answer
        is awaited until ``kafka.request.timeout.ms`` after the commit was sent, no longer.

        ``retry_ms``: a commit that failed for a retriable reason is made again synchronously,
        for at most that long (before a rejoin, on leaving); its failure is logged, not raised.
        0: not made again, and its failure is final (leaving a cluster that could not be
        reached). Without it the failure is only logged (the caller commits again later)."""
        pending, self._pending_commit = self._pending_commit, None
        if pending is None:
            return
        accepted = False
        try:
            accepted = self._settle(pending, retry_ms)
        finally:                              # also when it raises: the commit did not happen
            pending.on_done(accepted)

    def _settle_before_leaving(self, retry_commit: bool) -> None:
        """Settle the commit in flight before leaving the group: made again if it failed, within
        ``kafka.default.api.timeout.ms`` but no longer than Java's consumer retries on close
        (:data:`CLOSE_COMMIT_TIMEOUT_MS`), unless ``retry_commit`` is False (the cluster could
        not be reached: :meth:`kafka_source.group.member.GroupMember.leave`). Best effort:
        whatever goes wrong is logged, and the member leaves anyway."""
        retry_ms = min(self.options.api_timeout_ms, CLOSE_COMMIT_TIMEOUT_MS)
        try:
            self.settle_commits(retry_ms=retry_ms if retry_commit else 0)
        except Exception as exc:
            log.warning("Group '%s': the last commit failed while leaving: %s", self.group_id, exc)

    def _settle(self, pending: "_PendingCommit", retry_ms: int | None) -> bool:
        """Each part of ``pending`` in turn; False at the first one refused or failed (the rest
        is not waited for: the caller commits all of it again)."""
        return all(self._settle_part(pending, offsets, future, error, retry_ms)
                   for offsets, future, error in pending.parts)

    def _settle_part(self, pending: "_PendingCommit", offsets: dict, future, error: str,
                     retry_ms: int | None) -> bool:
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
                    return self._commit_done(offsets, ok, fenced, pending.generation)
                error = errors[-1]
                if error.startswith(Errors.StaleMemberEpochError.__name__) and retry_ms is None:
                    # Consumer protocol: the member epoch moved on while the commit was on its
                    # way (a new assignment); made again at once with the new epoch.
                    retry_ms = self.request_timeout_ms
            else:
                self._node = None             # a network failure: rediscover the coordinator
                error = (str(future.exception) if future.failed() else
                         f"no answer within {self.request_timeout_ms} ms "
                         "('kafka.request.timeout.ms')")
        if not retry_ms:
            self._commit_failed(offsets, error, final=retry_ms is not None)
            return False
        # Before a rejoin or leaving: once more, synchronously, within retry_ms.
        try:
            return self._commit_sync(offsets, budget_ms=retry_ms,
                                     epochs=pending.epochs)
        except GroupCoordinatorTimeoutError as exc:
            self._commit_failed(offsets, str(exc), final=True)
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

    def _commit_identity(self, generation=None) -> tuple[int, str] | None:
        """(generation id or member epoch, member id) a commit is made with: ``generation``'s
        (default the member's now), outside any generation in manual assignment (-1, no member
        id); None while the member has no generation to commit in."""
        if self.manual:
            return -1, ""
        generation = generation or self.generation
        if generation.generation_id < 0:
            return None
        return generation.generation_id, generation.member_id

    def _commit_request(self, offsets: Mapping[TopicPartition, int],
                        epochs: Mapping[TopicPartition, int] | None = None,
                        generation=None):
        """The OffsetCommit request for ``offsets`` in this member's generation (None: nothing
        to send, or no generation to send it in; ``generation``: the one to send it in, default
        the member's now). Each partition's leader epoch from ``epochs`` (-1 where absent) is
        sent from v6 on; older versions drop it."""
        identity = self._commit_identity(generation) if offsets else None
        if identity is None:
            return None
        generation_id, member_id = identity
        by_topic: dict[str, list] = {}
        P = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(P(
                partition_index=partition, committed_offset=offset,
                committed_leader_epoch=(epochs or {}).get((topic, partition), -1),
                commit_timestamp=-1, committed_metadata=""))
        return OffsetCommitRequest(
            group_id=self.group_id, generation_id_or_member_epoch=generation_id,
            member_id=member_id, group_instance_id=self.instance_id, retention_time_ms=-1,
            topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=ps)
                    for t, ps in by_topic.items()],
            # The consumer protocol needs v9 (member epoch); the classic one stays at v8.
            min_version=getattr(self, "offset_commit_versions", (None, 8))[0],
            max_version=getattr(self, "offset_commit_versions", (None, 8))[1])

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
                           Errors.RebalanceInProgressError, Errors.FencedMemberEpochError):
                    fenced.append(err)
                    return False
                if err is Errors.StaleMemberEpochError:
                    # Consumer protocol: the epoch moved on since the request was made (a new
                    # assignment); made again with the current one.
                    errors.append(f"{err.__name__} for {topic.name}-{p.partition_index}")
                    return None
                if not self._offset_error_ok(err, "OffsetCommit"):
                    errors.append(f"{err.__name__} for {topic.name}-{p.partition_index}")
                    return None
        return True

    def _commit_done(self, offsets: Mapping[TopicPartition, int], ok: bool,
                     fenced: list, sent=None) -> bool:
        """Log the outcome of a commit; a fenced member forgets what the error says is stale.

        ``sent``: the generation the commit was made in. One a rebalance of the member's own
        overtook -- REBALANCE_IN_PROGRESS or ILLEGAL_GENERATION while the member rejoins in the
        background (:mod:`.rejoin`), or after it got a new generation since -- is not fencing:
        it is made again at the next trigger, in the generation the member then holds."""
        if not ok and self.manual:
            log.warning("Group '%s': commit of %s refused (%s): the group has active members, "
                        "and Kafka accepts commits from a query using 'assign' only while it has "
                        "none. Use another 'kafka.group.id', or 'subscribe' to join the group.",
                        self.group_id, _describe_offsets(offsets), fenced[0].__name__)
            return False
        if not ok and fenced[0] is None:
            log.warning("Group '%s': commit of %s not made: the member lost its generation "
                        "meanwhile; rejoining", self.group_id, _describe_offsets(offsets))
            return False
        if not ok and fenced[0] in (Errors.RebalanceInProgressError,
                                    Errors.IllegalGenerationError) and sent is not None and (
                sent != self.generation or getattr(self, "_rejoiner", None) is not None):
            log.info("Group '%s': commit of %s in generation %d overtaken by the member's "
                     "rejoin (%s); made again at the next trigger", self.group_id,
                     _describe_offsets(offsets), sent.generation_id, fenced[0].__name__)
            return False
        if not ok:
            err = fenced[0]
            log.warning("Group '%s': commit of %s refused (%s); rejoining", self.group_id,
                        _describe_offsets(offsets), err.__name__)
            if err is Errors.FencedMemberEpochError:
                self._reset(keep_member_id=True, reason="the member epoch is fenced")
            elif err is Errors.UnknownMemberIdError:
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
        if err in COORDINATOR_MOVED:
            self._node = None
            return False
        if err in RETRY or getattr(err, "retriable", False) or \
                err is Errors.StaleMemberEpochError:
            return False
        if err is Errors.FencedInstanceIdError:
            raise self._instance_fenced(what)
        if err is Errors.GroupAuthorizationFailedError:
            raise KafkaSourceError(f"Not authorized to use consumer group '{self.group_id}' "
                                   "(option 'kafka.group.id'): grant READ on the group.")
        raise KafkaSourceError(f"{what} for consumer group '{self.group_id}' failed: "
                               f"{err.__name__} ({getattr(err, 'description', '')}).")


_DESCRIBED = 12      # partitions a log line names, at most


def _describe_offsets(offsets: Mapping[TopicPartition, int]) -> str:
    """``t-0@5, t-1@7``; past a dozen partitions the first ten and how many more (a commit
    of 10,000 partitions would otherwise be a log line of a few hundred kilobytes)."""
    items = sorted(offsets.items())
    shown = items if len(items) <= _DESCRIBED else items[:_DESCRIBED - 2]
    text = ", ".join(f"{t}-{p}@{o}" for (t, p), o in shown)
    if len(shown) < len(items):
        topics = len({t for (t, _p), _o in items})
        text += (f" and {len(items) - len(shown)} more partition(s) ({len(items)} in all, of "
                 f"{topics} topic(s))")
    return text
