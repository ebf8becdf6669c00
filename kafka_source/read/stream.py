"""``spark.readStream.format("pykafka")``: the stream reader, a member of a consumer group.

Spark calls the planning methods (``initialOffset``, ``latestOffset``, ``partitions``,
``commit``) in one long-lived Python process on the driver; ``read`` runs on executors and is the
batch reader's (:func:`kafka_source.read.executor.read_input_partition`).

One trigger, as seen from here (``latestOffset(start, limit)``):

1. ``start`` is the end of the last micro-batch, and Spark plans a new batch only after the
   previous one completed. So every offset in ``start`` is processed: it is committed to the
   group now (:meth:`KafkaStreamReader._commit_completed`). This is what makes the group's
   committed offsets follow the query, including the last batch of an AvailableNow run and an
   idle stream -- Spark's own ``commit(end)`` comes a batch later and not at all at the end.
   The OffsetCommit is sent without waiting for its answer, which is applied at the next
   trigger, or before a rejoin or leaving the group if they come first
   (:meth:`kafka_source.group.member.GroupMember.commit_async`). Commits are best effort: one
   that failed for a retriable reason (coordinator unavailable or moving, no answer) is logged
   and its partitions are committed again, at their newest completed offsets, at the next
   trigger; the query goes on reading meanwhile.
2. Metadata is refreshed and the membership checked (:class:`kafka_source.group.member.GroupMember`):
   a rebalance the heartbeat thread noticed, a new topic matching ``subscribePattern`` or new
   partitions make the member rejoin -- after step 1 committed what it processed of the
   partitions it may lose.
3. Partitions this member keeps continue from ``start``. Newly assigned partitions are adopted:
   they start at the group's committed offset (else ``kafka.auto.offset.reset``; partitions
   created after the query started begin at their log start). An adopted partition enters the
   offsets with an empty range first, so that every batch's ranges follow from its start and end
   offsets alone, also when Spark re-plans a batch after a restart. A partition in ``start`` that
   this member did not keep -- it came back from another member, or the member was fenced since
   the last trigger (:attr:`kafka_source.group.member.GroupMember.generations_lost`), when it
   keeps none -- is dropped for one trigger and adopted at the next; its offset in ``start`` is
   stale and is never committed (another member may have committed newer offsets meanwhile).
4. The end offsets come from ListOffsets(latest), capped by the AvailableNow target and the
   admission control options (:mod:`kafka_source.read.admission`). When a partition's leader
   epoch changed since the last trigger, its position is first validated with
   OffsetsForLeaderEpoch: a log truncated below it by an unclean leader election is data loss
   (:mod:`kafka_source.read.truncation`).

Trigger.AvailableNow reads up to the end offsets listed when the run began
(``prepareForTriggerAvailableNow``), as Spark's own source does. While the member keeps the same
partitions -- a stable generation, no rebalance noticed by the heartbeat thread -- a trigger
therefore asks the brokers nothing: steps 2 to 4 are skipped, the end offsets follow from
``start``, that target and the read limit, and only the commit of step 1 goes out. Partitions
and topics that appear during the run are not read in it, as in Spark; a run that began before
a topic was deleted or truncated finds out when it reads (``failOnDataLoss``).

PySpark 4.0 and 4.1 (no admission control for Python sources: :mod:`kafka_source.spark_features`)
call ``latestOffset()`` with no arguments, once per trigger, never ``prepareForTriggerAvailableNow``
and ``getDefaultReadLimit``, and ask ``initialOffset()`` only after the first ``latestOffset()``
(measured on 4.0.5 and 4.1.4). The reader then keeps its own start: the query's initial offsets,
then the end of each batch Spark plans (``partitions(start, end)``: the next ``latestOffset()``
comes after that batch completed), and after a restart the end of the checkpoint's last batch,
which Spark hands over as ``partitions(end, end)`` before anything else. It applies
``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger`` and ``maxTriggerDelay`` itself, with the same
code as on 4.2, so the same backlog gives the same micro-batches. ``Trigger.AvailableNow`` runs as
one micro-batch there (SPARK-45178) that the reader cannot tell from any other trigger: the rate
limits apply to it, and a run that they cut short says so when it stops (the next run goes on
from there). Spark calls ``commit`` for that batch only in the next run; the group gets its
offsets at the next run's first trigger, as the checkpoint does. With
``spark.sql.streaming.triggerAvailableNowWrapper.enabled`` Spark calls ``latestOffset()`` for
other purposes too, so a planned batch no longer ends where the last call said: the reader
refuses that with an error naming the configuration, before committing anything from it.

Offsets are Spark's Kafka source JSON, ``{"topic": {"partition": next_offset}}``, holding the
partitions this member read in that batch.

Restarting from a checkpoint: Spark calls ``latestOffset`` with the checkpoint's offsets and
never ``initialOffset``. The partitions this reader knew before are then the checkpoint's, not
those of the first metadata this process sees: a partition created while the query was down (a
topic grown, a topic matching ``subscribePattern`` created) is new to the query, and starts at its
log start, as in Spark, unless the group has committed an offset for it -- not at
``kafka.auto.offset.reset`` (``latest`` would skip the records written to it meanwhile).

Leaving the group on ``query.stop()``: Spark ends the planning process by closing its socket and
sending it SIGTERM at once (measured on PySpark 4.3). Python's default SIGTERM action kills the
process before PySpark's runner reaches ``stop()``, so the member stayed in the group until
``kafka.session.timeout.ms`` passed and the other members waited that long for its partitions.
Once this process has joined a group, SIGTERM instead unwinds the runner (``SystemExit``), whose
``finally`` calls :meth:`KafkaStreamReader.stop`: LeaveGroup goes out, the group rebalances at
once. Further SIGTERMs are ignored meanwhile, so that they cannot cut the LeaveGroup short; a
SIGTERM that comes when the runner, having seen the closed socket first, is already in
``stop()`` is held back until ``stop()`` is done. The LeaveGroup itself is bounded
(:meth:`kafka_source.group.member.GroupMember.leave`). A static
member (``kafka.group.instance.id``) sends no LeaveGroup, as Java's consumer: the group keeps its
partitions for it until ``kafka.session.timeout.ms``, and the query restarted within that time
gets them back with no rebalance, restarting from its checkpoint as always.

Leaving when the query fails because Kafka could not be reached (a planning call gave up:
:class:`~kafka_source.errors.BrokerUnavailableError`): PySpark's runner calls ``stop()`` before it
hands the error to Spark, so whatever ``stop()`` waits for holds the query's failure back. The
commit sent at the start of that trigger is then waited for (bounded by
``kafka.request.timeout.ms``) but not made again: retried for ``kafka.default.api.timeout.ms`` (a
minute by default) against a cluster that is gone, it kept the query looking alive for that
minute after the error that names the bounds the user set. A commit left out is made by the next
member or the restarted query; the checkpoint holds the query's own position.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import signal
import threading
import time
from itertools import repeat
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from .admission import hold_back, rate_limit
from ..wire.net.client import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, BrokerClient, TopicPartition
from ..wire.net.metadata_view import topic_id_text
from ..errors import BrokerUnavailableError, KafkaSourceError, OptionError
from .offsets import (OffsetRange, OffsetResolver, check_start_for_data_loss, on_data_loss,
                      partitions_in_metadata, planning_retries, subscription_topics)
from ..config.options import StreamOptions
from ..spark_features import (ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows,
                              SupportsTriggerAvailableNow)
from .offset_json import Offsets, OffsetsJson, decode_offsets, encode_offsets
from .planning import LEADERS_MAX_AGE_MS, plan_input_partitions
from .truncation import TruncationCheck
from ..worker_heap import prepare
from ..worker_socket import AcksJvmOnUnpickle

log = logging.getLogger(__name__)

def _planning_call(method):
    """A planning method of :class:`KafkaStreamReader`: whether it gave up on reaching Kafka is
    remembered for ``stop()`` (module docstring, "Leaving when the query fails ..."). The
    first calls import the group's and the client's modules: in Spark's streaming source
    process those are frozen with the rest of its heap (:func:`kafka_source.worker_heap.prepare`;
    a dictionary's length once nothing new is imported)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            result = method(self, *args, **kwargs)
        except BrokerUnavailableError:
            self._unreachable = True
            raise
        self._unreachable = False
        prepare()
        return result
    return call


class KafkaStreamReader(AcksJvmOnUnpickle, DataSourceStreamReader,
                        SupportsTriggerAvailableNow):
    def __init__(self, options: StreamOptions, parallelism: int | None = None):
        self.options = options
        self.parallelism = parallelism                   # Spark's default parallelism, if known
        self._client: BrokerClient | None = None
        self._member = None
        # Partitions of the last trigger's end offsets: owned then, their offsets trusted.
        self._previous: frozenset[TopicPartition] | None = None
        # member.generations_lost_at_assignment at the last trigger (None: no trigger yet).
        self._lost_seen: int | None = None
        self._known: set[TopicPartition] | None = None  # partitions when this reader began
        # Each topic's id as of the last trigger (Kafka 2.8+): a new one means the topic was
        # deleted and created again under its name (_recreated).
        self._topic_ids: dict[str, bytes] = {}
        # Their old positions (offsets of the deleted log), until Spark's commits are past them
        self._replaced: Offsets = {}
        self._initial: Offsets | None = None
        self._planned = False                            # initialOffset/latestOffset ran
        # After a restart: the group's committed offsets ahead of the checkpoint, not to be
        # committed over (see _group_floor).
        self._floor: Offsets = {}
        # Positions of the partitions dropped after fencing, for their adoption (see _adopt).
        self._fenced_at: Offsets = {}
        self._committed: Offsets = {}                    # what this process last committed
        self._latest: Offsets | None = None              # for reportLatestOffset
        self._target: Offsets | None = None              # Trigger.AvailableNow
        # When the last batch with records was planned (maxTriggerDelay); as in Spark, the first
        # trigger is never held back.
        self._last_batch_ms = -(1 << 62)
        self._counts: dict[str, int] = {}                # partition count per subscribed topic
        self._partition_list = None      # the last (partitions, counts) of _current_partitions
        # Truncation after an unclean leader election (KIP-320, :mod:`.truncation`): the
        # latest offsets and their leader epochs listed in this trigger, and the check itself.
        self._listed: dict[TopicPartition, tuple[int, int]] = {}
        self._target_listed: dict[TopicPartition, tuple[int, int]] = {}
        self._truncation = TruncationCheck()
        self._json = OffsetsJson()       # the offsets Spark gets and hands back
        self._unreachable = False    # the last planning call gave up on reaching Kafka
        # PySpark without admission control (4.0, 4.1; module docstring, "PySpark 4.0 and
        # 4.1"): the start of the next batch (the end of the last batch Spark planned, or where
        # a restart left off), the end the last latestOffset() returned, and whether the rate
        # limits held that end back from the latest offsets.
        self._own_start: Offsets | None = None
        self._returned: Offsets | None = None
        self._capped: str | None = None
        self._batches_planned = 0
        self._on_its_own = False     # Spark called latestOffset() without a start

    # --- connections --------------------------------------------------------------------------

    @property
    def client(self) -> BrokerClient:
        if self._client is None:
            self._client = BrokerClient(self.options.source.client_config)
        return self._client

    @property
    def member(self):
        if self._member is None:
            from ..group.assignors import load_assignor
            from ..group.member import GroupMember

            src = self.options.source
            config = src.client_config
            manual = src.subscription.assignment if src.subscription.kind == "assign" else ()
            timeouts = dict(request_timeout_ms=int(config.get("request_timeout_ms", 30_000)),
                            retry_backoff_ms=int(config.get("retry_backoff_ms", 100)))
            if self.options.group.protocol == "consumer" and not manual:
                # KIP-848: the same interface, another protocol (group/consumer_protocol.py).
                from ..group.consumer_protocol import ConsumerProtocolMember
                self._member = ConsumerProtocolMember(
                    self.client, lambda: BrokerClient(config), self.options.group, **timeouts)
            else:
                self._member = GroupMember(
                    self.client, lambda: BrokerClient(config), self.options.group,
                    load_assignor(self.options.group.assignor), manual_assignment=manual,
                    **timeouts)
            _exit_on_sigterm()
        return self._member

    # --- Spark's planning calls ---------------------------------------------------------------

    @_planning_call
    def initialOffset(self) -> dict:
        if self._initial is not None:
            # PySpark 4.0/4.1 ask after their first latestOffset(), which already started here.
            return self._json.encode(self._initial)
        partitions = self._current_partitions(strict=True)
        owned = self._assignment(partitions)
        src = self.options.source
        spec = src.starting
        if spec.kind == "group":
            positions = self._adopt(owned, new_partitions=False)
        else:
            resolver = OffsetResolver(self.client, src, list(owned), all_partitions=partitions)
            starts = resolver.resolve(spec, is_start=True)
            positions = {tp: check_start_for_data_loss(tp, starts[tp], resolver.earliest[tp], src)
                         for tp in owned}
        self._previous = frozenset(owned)
        self._lost_seen = self.member.generations_lost_at_assignment
        self._initial = dict(positions)
        self._planned = True
        encoded = self._json.encode(positions)
        log.info("Query starts at %s (startingOffsets=%s, group '%s')",
                 encoded, spec.kind, self.options.group.group_id)
        return encoded

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    @_planning_call
    def prepareForTriggerAvailableNow(self) -> None:
        partitions = self._current_partitions(strict=True)
        self._target = self._list(partitions, LATEST_TIMESTAMP)
        # Each target with its leader epoch: every end of the run lies at or below it, so the
        # executors check what they read against it even on triggers that ask the brokers
        # nothing (.truncation; the driver validates only when it lists offsets).
        self._target_listed = {tp: self._listed[tp] for tp in self._target if tp in self._listed}
        log.info("Trigger.AvailableNow: reading up to %s", encode_offsets(self._target))

    @_planning_call
    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        if start is None:
            # PySpark 4.0/4.1: no start and no limit from Spark (module docstring).
            return self._latest_offset_on_its_own()
        return self._latest_offset(start, limit)

    def _latest_offset_on_its_own(self) -> dict:
        self._on_its_own = True
        if self._own_start is not None:
            start = self._json.encode(self._own_start)
        elif self._initial is not None:
            start = self._json.encode(self._initial)
        else:
            start = self.initialOffset()      # a new query: Spark asks initialOffset() next
        end = self._latest_offset(start, self.getDefaultReadLimit())
        self._returned = self._json.decode(end)
        left = sum(max(0, self._latest.get(tp, off) - off)
                   for tp, off in self._returned.items()) if self._latest else 0
        held = self._returned == self._json.decode(start)
        self._capped = (None if not left else
                        f"{left} record(s) beyond this micro-batch's end offsets were not "
                        "admitted ("
                        + ("'minOffsetsPerTrigger' held the batch back" if held and
                           self.options.min_offsets_per_trigger else
                           "'maxOffsetsPerTrigger'") + ")")
        return end

    def _latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        start_pos = self._json.decode(start)
        if not self._planned:
            # Restored from a checkpoint (module docstring): the partitions known before are
            # the checkpoint's, even if prepareForTriggerAvailableNow saw the metadata first.
            self._planned = True
            self._known = set(start_pos)
            log.info("Restarting from a checkpoint with %s; partitions not in it start at "
                     "their log start unless group '%s' has committed offsets for them",
                     _describe(sorted(start_pos)) or "no partitions",
                     self.options.group.group_id)
            self._floor = self._group_floor(start_pos)
        member = self.member
        # The last trigger's commit: answered long ago (a micro-batch ran since); a refusal
        # (fenced member) is known before this trigger decides anything.
        member.settle_commits()
        self._listed = {}
        if self._available_now_unchanged(start_pos):
            # Nothing to ask the brokers (module docstring, "Trigger.AvailableNow").
            self._commit_completed(start_pos)
            kept = start_pos
            latest = {tp: max(off, self._target.get(tp, off)) for tp, off in kept.items()}
            self._latest = latest
            end = self._admit(kept, latest, limit)
        else:
            partitions = self._current_partitions(strict=False)
            # Positions in a topic created again since: not the new topic's, never committed
            recreated = self._recreated(start_pos)
            if recreated:
                start_pos = {tp: off for tp, off in start_pos.items() if tp not in recreated}
            if member.stable:
                self._commit_completed(start_pos)  # before a rebalance can take partitions away
            self._check_vanished(start_pos, partitions)
            owned = self._assignment(partitions)
            self._commit_completed(start_pos)
            previous = self._previous
            fenced = self._fenced()
            if fenced:
                previous = frozenset()
                stale = sorted(set(start_pos) & set(owned))
                # Where this query itself was: what it adopts next trigger never lies before
                # that (its sink holds everything up to there), whatever the group says.
                self._fenced_at = {tp: start_pos[tp] for tp in stale}
                if stale:
                    log.warning("Group '%s' fenced this member since the last trigger: its "
                                "offsets of %s may be stale (another member may have read and "
                                "committed them meanwhile). Dropping them for this trigger; the "
                                "next adopts them at the group's committed offset or where the "
                                "query was, whichever is later.",
                                self.options.group.group_id, _describe(stale))
            kept = self._trusted(start_pos, owned, previous)
            new = [tp for tp in owned if tp not in start_pos]
            adopted = self._adopt(new, new_partitions=True)
            if not fenced:
                self._fenced_at = {}       # adopted now, or no longer this member's
            self._previous = frozenset(kept) | frozenset(adopted)
            self._lost_seen = member.generations_lost_at_assignment
            latest = self._list(list(kept), LATEST_TIMESTAMP)
            # A leader change since the last trigger: validate the positions (module docstring
            # of .truncation), also of partitions adopted where this query was (after fencing);
            # a truncated partition's batch ends at the divergence.
            src = self.options.source
            rewound = self._truncation.check(self.client, {**kept, **adopted}, self._listed,
                                             fail_on_data_loss=src.fail_on_data_loss,
                                             retries=planning_retries(src))
            adopted.update({tp: off for tp, off in rewound.items() if tp in adopted})
            self._latest = {**latest, **adopted}
            admitted, unrewound = kept, latest
            if rewound:
                admitted = {tp: off for tp, off in kept.items() if tp not in rewound}
                unrewound = {tp: off for tp, off in latest.items() if tp not in rewound}
            end = self._admit(admitted, self._check_latest(admitted, unrewound), limit)
            end.update({tp: off for tp, off in rewound.items() if tp in kept})
            end.update(adopted)
            self._truncation.note(end, self._listed)
        if any(off > kept[tp] for tp, off in end.items() if tp in kept):
            self._last_batch_ms = _now_ms()
        if end == start_pos and self._target is not None and all(
                off >= self._target.get(tp, off) for tp, off in end.items()):
            # AvailableNow has nothing left: Spark ends the query after this call, and may never
            # call stop(). Everything is committed (step 1), so leave the group now.
            log.info("Trigger.AvailableNow finished; leaving group '%s'",
                     self.options.group.group_id)
            member.leave("Trigger.AvailableNow finished")
            self._previous = None
        return self._json.encode(end)

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else self._json.encode(self._latest)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        start_pos, end_pos = self._json.decode(start), self._json.decode(end)
        if not self._planned_by_spark(start_pos, end_pos):
            return []
        ranges = []
        for tp in sorted(end_pos):          # keys only: no (partition, offset) pair to collect
            until = end_pos[tp]
            begin = start_pos.get(tp, until)   # not in start: adopted with an empty range
            if until > begin:
                # The executors' check of the range against a truncated log (.truncation).
                ranges.append(OffsetRange(tp[0], tp[1], begin, until, self._epoch_of(tp, until)))
        # Leaders as of this trigger's Metadata answer, which routed its ListOffsets (no
        # request of its own): a task's ranges then come from as few brokers as possible.
        leaders = {}
        if self._client is not None and ranges:
            leaders = self._client.cached_leaders([r.topic_partition for r in ranges],
                                                  LEADERS_MAX_AGE_MS)
        return plan_input_partitions(ranges, self.options.source, parallelism=self.parallelism,
                                     leaders=leaders)

    def _planned_by_spark(self, start: Offsets, end: Offsets) -> bool:
        """Note the batch Spark planned, whose end is the next batch's start (what PySpark
        4.0/4.1 do not pass to ``latestOffset()``). False for the call that tells a restarted
        reader where the checkpoint's last batch ended, which plans nothing."""
        if (self._own_start is None and not self._planned and self._returned is None
                and start == end):
            # A restart (Spark's setLatestSeenOffset): the next batch starts here. The batch
            # ending here may be run again first (partitions(its start, here)), before any
            # latestOffset(); either way it has completed when latestOffset() comes.
            self._own_start = dict(end)
            log.info("Restarting from a checkpoint whose last micro-batch ends at %s",
                     encode_offsets(end))
            return False
        expected = self._returned if self._returned is not None else self._own_start
        if self._on_its_own and expected is not None and end != expected:
            raise OptionError(
                "Spark planned a micro-batch ending at "
                f"{encode_offsets(end)}, but pykafka's last latestOffset() returned "
                f"{encode_offsets(expected)}. On this PySpark (no admission control for Python "
                "streaming sources, before 4.2) that happens when "
                "'spark.sql.streaming.triggerAvailableNowWrapper.enabled' is true: the wrapper "
                "calls latestOffset() for other purposes, and pykafka then cannot know which "
                "offsets a micro-batch read, or commit them to its consumer group. Set that "
                "configuration to false (the default): Trigger.AvailableNow then runs as one "
                "micro-batch, which pykafka supports.")
        self._own_start = dict(end)
        self._returned = None
        self._batches_planned += 1
        return True

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Imported here: the planning process, which imports this module, never reads.
        from .executor import read_input_partition

        return read_input_partition(partition)

    @_planning_call
    def commit(self, end: dict) -> None:
        # Spark says batches up to ``end`` are done; latestOffset normally committed them already.
        self._commit_completed(self._json.decode(end))

    def stop(self) -> None:
        # Nothing is committed here: the last planned batch may not have completed.
        if self._capped and self._returned is None and self._batches_planned == 1:
            # PySpark 4.0/4.1 (module docstring): the query ends after one batch, which the
            # limits cut short -- as a Trigger.AvailableNow run does on those versions.
            log.warning("The query stopped after a micro-batch that read less than was there: "
                        "%s. If this was a Trigger.AvailableNow run: on this PySpark (before "
                        "4.2) Spark runs Trigger.AvailableNow as one micro-batch, and the rate "
                        "limits apply to it as to any trigger, since the source cannot tell the "
                        "trigger. The next run continues where this one ended. To read "
                        "everything in one such run, leave 'maxOffsetsPerTrigger' and "
                        "'minOffsetsPerTrigger' unset for it.", self._capped)
        with _sigterm_held_back():
            try:
                if self._member is not None:
                    self._member.close(retry_commit=not self._unreachable)
            finally:
                if self._client is not None:
                    self._client.close()
                    self._client = None

    # --- steps of a trigger -------------------------------------------------------------------

    def _current_partitions(self, *, strict: bool) -> list[TopicPartition]:
        """Every partition the subscription covers now (strict: missing topics are errors).

        A topic or partition read at the last trigger that an answer lacks is doubted before
        it is taken as deleted (:mod:`kafka_source.wire.net.metadata_view`): a broker that has
        just started may not know it yet. With ``subscribePattern`` those are the topics read
        at the last trigger; with named topics, the named ones."""
        sub = self.options.source.subscription
        expected = self._counts.keys() if sub.kind == "subscribePattern" else None
        infos = self.client.topic_metadata(subscription_topics(sub),
                                           planning_retries(self.options.source),
                                           expected=expected)
        result, self._counts = partitions_in_metadata(self.client, sub, infos, strict=strict,
                                                      previous=self._partition_list)
        self._partition_list = (result, self._counts)
        if self._known is None:
            self._known = set(result)
        return result

    def _assignment(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        existing = set(partitions)
        owned = self.member.ensure_active(self._counts.keys(), self._counts)
        return sorted(tp for tp in owned if tp in existing)

    def _epoch_of(self, tp: TopicPartition, offset: int) -> int:
        """The leader epoch ``offset`` of ``tp`` lies in, as far as this process knows it (-1:
        unknown): the epoch listed with it when it was planned or adopted here
        (:mod:`.truncation`), else, under Trigger.AvailableNow, the one listed with the run's
        target. What a planned range carries to the executors, and what a commit of the offset
        carries to the group (KIP-320: whoever resumes from it can validate it)."""
        mark = self._truncation.marks.get(tp)
        if mark is not None and mark[0] == offset:
            return mark[1]
        target = self._target_listed.get(tp, (-1, -1))
        return target[1] if 0 <= offset <= target[0] else -1

    def _commit_completed(self, completed: Offsets) -> None:
        """Commit offsets Spark has completed, for the partitions this member owns."""
        if not self.options.group.commit_offsets or not completed:
            return
        if self._initial is not None and completed == self._initial:
            return  # the query's starting point, not the end of a batch
        # After fencing nothing is trusted: a partition is committed again only once adopted.
        previous = frozenset() if self._fenced() else self._previous
        if self._replaced:
            # Spark's commit of the batch before a topic was created again names offsets of
            # the deleted log: not the new topic's (_recreated)
            for tp, old in list(self._replaced.items()):
                if tp in completed and completed[tp] != old:
                    del self._replaced[tp]
            completed = {tp: off for tp, off in completed.items()
                         if self._replaced.get(tp) != off}
        # Only what changed since this process last committed it: over thousands of partitions
        # a trickle moves a few per trigger, and this runs twice a trigger.
        committed = self._committed.get
        changed = {tp: off for tp, off in completed.items() if committed(tp) != off}
        if not changed:
            return
        todo = {tp: off for tp, off in self._trusted(changed, self.member.assignment,
                                                      previous).items()
                if off >= self._floor.get(tp, off)}
        if not todo:
            return
        self._committed.update(todo)

        def on_done(accepted: bool) -> None:
            # Refused (the member was fenced) or failed (the coordinator could not write it):
            # commit them again at the next trigger, if this member still may.
            if not accepted:
                for tp, off in todo.items():
                    if self._committed.get(tp) == off:
                        del self._committed[tp]

        epochs = {tp: self._epoch_of(tp, off) for tp, off in todo.items()}
        self.member.commit_async(todo, on_done, epochs)

    def _group_floor(self, start: Offsets) -> Offsets:
        """The group's committed offsets that are ahead of a restored checkpoint's.

        While the query was down another member of the group (a consumer, another query) may
        have read its partitions and committed further. The query still reads from its
        checkpoint -- that is what makes its sink exactly-once -- but committing its older
        offsets would move the group's backwards (and make every member that takes the
        partitions later read them again). So a partition is committed again only once the
        query has passed the group's offset.

        A committed offset equal to the checkpoint's, with the leader epoch it was committed
        with, is what the first trigger validates against the current leader: a truncation
        while the query was down (:mod:`.truncation`) is found like one while it runs."""
        if not self.options.group.commit_offsets or not start:
            return {}
        try:
            positions = self.member.committed_positions(sorted(start))
        except KafkaSourceError as exc:       # reading must not wait for the coordinator
            log.warning("Group '%s': could not fetch its committed offsets at restart (%s); "
                        "committing the checkpoint's", self.options.group.group_id, exc)
            return {}
        committed = {tp: pos[0] for tp, pos in positions.items() if pos is not None}
        for tp, (offset, epoch) in sorted((tp, pos) for tp, pos in positions.items()
                                          if pos is not None and pos[0] == start[tp]):
            self._truncation.remember(tp, offset, epoch)
        floor = {tp: off for tp, off in committed.items() if off > start[tp]}
        for (topic, partition), off in sorted(floor.items()):
            log.info("Group '%s' has committed %d for %s-%d, ahead of the checkpoint's %d: the "
                     "query reads from its checkpoint and commits the partition once past %d",
                     self.options.group.group_id, off, topic, partition, start[(topic, partition)],
                     off)
        return floor

    def _available_now_unchanged(self, start: Offsets) -> bool:
        """Trigger.AvailableNow, and the member owns the partitions of ``start``, as at the last
        trigger, with nothing noticed since that could change it."""
        return (self._target is not None and self._previous is not None
                and frozenset(start) == self._previous
                and self.member.assignment_is_current() and not self._fenced()
                and frozenset(self.member.assignment) == self._previous)

    def _fenced(self) -> bool:
        """Whether the member lost its generation (was fenced) after it received the assignment
        the last trigger used: then no offset of that trigger is trusted any more, for any
        partition (:attr:`kafka_source.group.member.GroupMember.generations_lost`)."""
        return self._lost_seen is not None and self.member.generations_lost != self._lost_seen

    @staticmethod
    def _trusted(offsets: Offsets, owned, previous: frozenset | None) -> Offsets:
        """The offsets of partitions this member owns now and whose offsets the last trigger
        trusted -- or, at the first trigger after a restart, of every owned one (the
        checkpoint's). A partition that came back after another member had it is not among
        them, nor is any partition after the member was fenced: its offset is stale."""
        keep = offsets.keys() & owned                 # any iterable; the set is built in C
        if previous is not None:
            keep &= previous
        if len(keep) == len(offsets):
            return dict(offsets)           # the usual case, without a lookup per partition
        return {tp: off for tp, off in offsets.items() if tp in keep}

    def _adopt(self, partitions: list[TopicPartition], *,
               new_partitions: bool) -> Offsets:
        """Starting offsets of partitions this member just got: committed, else reset."""
        if not partitions:
            return {}
        group = self.options.group
        positions = self.member.committed_positions(partitions)
        earliest = self._list(partitions, EARLIEST_TIMESTAMP)
        latest = self._list(partitions, LATEST_TIMESTAMP)
        result = {}
        fenced_at = self._fenced_at
        for tp in partitions:
            offset, epoch = positions.get(tp) or (None, -1)
            if tp in self._replaced:
                # The topic was created again (_recreated): a committed offset may still be the
                # old log's (Kafka drops a deleted topic's offsets, not every broker does, and a
                # member may have committed one late); the new log is read from its start.
                offset = None
            if tp in fenced_at and (offset is None or offset < fenced_at[tp]):
                # Dropped after fencing: nobody committed past where this query was (its commit
                # of the last batch was refused, or never made): go on from there, neither
                # reading into the sink again nor skipping by the reset policy.
                offset = max(fenced_at[tp], earliest[tp])
                how = "where the query was before it was fenced"
            elif offset is not None:
                committed = offset
                offset = check_start_for_data_loss(tp, offset, earliest[tp], self.options.source)
                if offset == committed:
                    # Validated at the next trigger if the leader changed since the commit.
                    self._truncation.remember(tp, offset, epoch)
                if offset > latest[tp] and not self._within_open_transactions(tp, offset):
                    self._data_loss(f"The committed offset {offset} of {tp[0]}-{tp[1]} in group "
                                    f"'{group.group_id}' is beyond the end of the log "
                                    f"({latest[tp]}): the topic was recreated or truncated.",
                                    f"Continuing from {latest[tp]}")
                    offset = latest[tp]
                how = "committed offset"
            elif new_partitions and self._known is not None and tp not in self._known:
                offset = earliest[tp]
                how = "new partition, from its start"
                if offset != 0:
                    self._data_loss(f"New partition {tp[0]}-{tp[1]} starts at offset {offset} "
                                    "instead of 0: records were deleted before the query "
                                    "could read them.", f"Reading from {offset}")
            elif group.auto_offset_reset == "none":
                raise OptionError(
                    f"Consumer group '{group.group_id}' has no committed offset for {tp[0]}-"
                    f"{tp[1]} and 'kafka.auto.offset.reset' is 'none'. Set it to 'earliest' or "
                    "'latest', or 'startingOffsets' to 'earliest', 'latest' or offset JSON.")
            else:
                offset = (earliest if group.auto_offset_reset == "earliest" else latest)[tp]
                how = f"no committed offset: kafka.auto.offset.reset={group.auto_offset_reset}"
            log.info("Adopting %s-%d at offset %d (%s)", tp[0], tp[1], offset, how)
            result[tp] = offset
        return result

    def _recreated(self, start: Offsets) -> Offsets:
        """The positions of ``start`` in topics whose id changed since the last trigger: each
        was deleted and created again under its name (KIP-516 topic ids, Kafka 2.8+; on older
        brokers only the log-end checks can notice, when the new log ends before the
        position). Such a position is an offset of the old log: reading on from it would skip
        the new topic's first records, or, where the new log is shorter, wait for offsets the
        old one had. Data loss (``failOnDataLoss``); with ``false`` its partitions are read
        from the new topic's log start, as partitions new to the query."""
        view = getattr(self.client, "view", None)
        changed = {}
        for topic in sorted(set(map(_FIRST, start)) | set(self._counts)):
            now = view.topic_id(topic) if view is not None else None
            if now is None:
                continue
            before = self._topic_ids.get(topic)
            self._topic_ids[topic] = now
            if before is not None and before != now:
                changed[topic] = (before, now)
        positions = {tp: off for tp, off in start.items() if tp[0] in changed}
        if not positions:
            return {}
        topics = ", ".join(f"'{t}' (id {topic_id_text(a)}, now {topic_id_text(b)})"
                           for t, (a, b) in sorted(changed.items()))
        self._data_loss(f"Topic(s) {topics} were deleted and created again while the query read "
                        "them: records of the old topic not yet read "
                        f"({_describe(sorted(positions))}) are lost, and the new topic's offsets "
                        "are not the old ones.",
                        "Reading the new topic from its log start")
        for tp in positions:
            if self._known is not None:
                self._known.discard(tp)          # adopted as a partition new to the query
            self._truncation.marks.pop(tp, None)
            self._committed.pop(tp, None)
            self._floor.pop(tp, None)
        self._replaced.update(positions)
        return positions

    def _check_vanished(self, start: Offsets, partitions: list[TopicPartition]) -> None:
        gone = sorted(start.keys() - set(partitions))
        if gone:
            shown = ", ".join(f"{t}-{p}" for t, p in gone[:10])
            self._data_loss(f"Partitions {shown} no longer exist (topic deleted?); records not "
                            "yet read from them are lost.", "Dropping them")

    def _check_latest(self, start: Offsets, latest: Offsets) -> Offsets:
        """Latest offsets, after checking none went backwards (topic recreated or truncated).

        With ``read_committed`` the latest offset is the last stable offset, which an open
        transaction holds back: a start past it (a committed offset of a read_uncommitted
        member of the group, or a timestamp's offset) waits there while the log goes on past
        it; only a start past the log's end is data loss."""
        latest = dict(latest)
        for tp, offset in start.items():
            end = latest.get(tp, offset)
            if end >= offset:
                continue
            if self._within_open_transactions(tp, offset):
                latest[tp] = offset
                continue
            self._data_loss(f"{tp[0]}-{tp[1]}'s log now ends at {end}, before offset "
                            f"{offset} where the query was: the topic was recreated or its "
                            "log truncated.", f"Continuing from {end}")
        return latest

    def _within_open_transactions(self, tp: TopicPartition, offset: int) -> bool:
        """With ``read_committed``: whether ``offset``, past the last stable offset, is still
        within the log (its high watermark), i.e. held back by open transactions."""
        if not self.options.source.read_committed:
            return False
        high_watermark = self._list([tp], LATEST_TIMESTAMP, read_committed=False)[tp]
        if offset <= high_watermark:
            log.info("%s-%d: offset %d is past the last stable offset (open transactions) but "
                     "within the log (it ends at %d): waiting there", tp[0], tp[1], offset,
                     high_watermark)
            return True
        return False

    def _admit(self, start: Offsets, latest: Offsets, limit: ReadLimit) -> Offsets:
        """End offsets of the next batch under the trigger's read limit."""
        if self._target is not None:
            # Never past the AvailableNow target (a partition created since has none: stay).
            latest = {tp: off if off < start[tp] else
                      max(start[tp], min(off, self._target.get(tp, start[tp])))
                      for tp, off in latest.items()}
        if isinstance(limit, ReadAllAvailable):
            return dict(latest)
        opts = self.options
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) \
            else opts.max_offsets_per_trigger
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) \
            else opts.min_offsets_per_trigger
        # AvailableNow ignores minOffsetsPerTrigger: waiting for data that will never be read
        # would end the run with records left behind.
        if min_rows and self._target is None and hold_back(
                min_rows, start, latest, now_ms=_now_ms(), last_batch_ms=self._last_batch_ms,
                max_delay_ms=opts.max_trigger_delay_ms):
            return dict(start)
        if max_rows:
            return rate_limit(max_rows, start, latest)
        return dict(latest)

    def _list(self, partitions, target: int, *, read_committed: bool | None = None) -> Offsets:
        if not partitions:
            return {}
        src = self.options.source
        if read_committed is None:
            read_committed = src.read_committed
        epochs: dict[TopicPartition, int] = {}
        listed = self.client.list_offsets({tp: target for tp in partitions},
                                          read_committed=read_committed,
                                          retries=planning_retries(src), epochs=epochs)
        if target == LATEST_TIMESTAMP:
            # The lowest latest offset of this trigger (the LSO with read_committed) with the
            # leader's epoch: what an end offset is paired with (.truncation).
            if not self._listed:        # the trigger's first listing: of every partition
                # (passes that run in C: at 10,000 partitions a comprehension took 2-4 ms)
                self._listed = dict(zip(listed, zip(map(_FIRST, listed.values()),
                                                    map(epochs.get, listed, repeat(-1)))))
            else:
                for tp, (off, _) in listed.items():
                    prev = self._listed.get(tp)
                    self._listed[tp] = (off if prev is None else min(off, prev[0]),
                                        epochs.get(tp, -1))
        return dict(zip(listed, map(_FIRST, listed.values())))

    def _data_loss(self, message: str, action: str) -> None:
        on_data_loss(self.options.source.fail_on_data_loss, message,
                     remedy="Set the option 'failOnDataLoss' to 'false' to go on with what is "
                            "still available.",
                     action=action, logger=log)


_FIRST = operator.itemgetter(0)       # a (topic, partition)'s topic; an (offset, time)'s offset


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _describe(partitions) -> str:
    shown = ", ".join(f"{t}-{p}" for t, p in partitions[:10])
    return shown + (f" and {len(partitions) - 10} more" if len(partitions) > 10 else "")


__all__ = ["KafkaStreamReader", "encode_offsets", "decode_offsets"]


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # the next one must not cut stop() short
    raise SystemExit(128 + signum)


def _exit_on_sigterm() -> None:
    """Make SIGTERM unwind this process (``SystemExit``) instead of killing it, so that the
    runner's ``finally`` calls ``stop()`` and the member leaves the group (module docstring).
    Only in the main thread (Python's rule for signal handlers) and only while SIGTERM has its
    default action: a handler someone else installed is left alone."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def _sigterm_held_back():
    """A SIGTERM that arrives while ``stop()`` runs takes effect when it has finished.

    Spark closes the planning process's socket and then SIGTERMs it. Usually the signal wins
    and unwinds the runner into ``stop()``; but when the runner saw the closed socket first, it
    was already in ``stop()`` when the signal came, and ``SystemExit`` cut the leave short
    (found in CI on a loaded machine: a consumer-protocol member still in its group 30 s after
    ``query.stop()``, until its session timeout). Only where :func:`_exit_on_sigterm` installed
    its handler; the handler runs afterwards, so the process still exits."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        yield
        return
    received: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, _on_sigterm)
        if received:
            _on_sigterm(received[0], None)
