"""Driver side: log truncation after an unclean leader election (KIP-320), found before the
next micro-batch is planned.

Why. Kafka's leader for a partition writes records, its in-sync followers copy them, and the
high watermark -- the end offset a reader is shown -- only covers what every in-sync replica
has. A clean leader change therefore never takes away records a reader has seen. An *unclean*
one does: with ``unclean.leader.election.enable=true`` a replica that was not in sync (it was
down, or behind) can become leader when no in-sync one is left, and its log ends before records
the old leader had acknowledged (``acks=1``, or ``min.insync.replicas=1``) and readers had
read. The followers truncate their logs to the new leader's, and the new leader writes *other*
records at those offsets. A reader that simply goes on from its position then either skips the
new records silently (the log has grown past its position again by its next trigger) or finds
its position beyond the log end, with nothing to say what happened.

How. Kafka's Java consumer validates its position after each leader change with
OffsetsForLeaderEpoch, and so does the stream reader here, with the same rule:

* Every offset of a partition is written by the leader of some *leader epoch*, and a new leader
  always has a higher epoch. ListOffsets (v4+, Kafka 2.1+) answers the latest offset together
  with the leader's current epoch, so each planned end offset ``P`` (at most that latest
  offset) is paired with the epoch ``E`` the log was in when ``P`` was listed (:meth:`note`).
* At the next trigger, when this trigger's ListOffsets gives a *different* epoch -- a leader
  change happened since -- the current leader is asked where epoch ``E`` ends in its log
  (:meth:`kafka_source.wire.net.client.BrokerClient.epoch_end_offsets`). A log that still holds
  everything up to ``P`` has epoch ``E`` (or the last epoch it knows below ``E``) ending at or
  after ``P``. An end ``D < P`` is the divergence point: offsets ``[D, P)``, which the query
  already read (or planned), were truncated away, and from ``D`` on the log holds records the
  query has never seen (:meth:`check`). Without a leader change nothing is asked: a leader never
  truncates its own log below the high watermark. A partition this member lost and adopts again
  at the same offset (after its group fenced it, the offset where it was) keeps its pair and is
  validated the same way.

What then (``failOnDataLoss``):

* ``true`` (default, as Spark): the query fails with :class:`~kafka_source.errors.DataLossError`
  naming the partition, the lost offsets and the cause.
* ``false``: a warning, and the partition continues from ``D``: the micro-batch ends it at ``D``
  (it reads nothing of it this time), so the next reads the new leader's records from ``D`` on
  -- nothing new is skipped. The records the query read at ``[D, P)`` before stay in its
  output: they are the ones Kafka lost. Going through an end offset below the start, rather than
  reading from ``D`` at once, keeps every micro-batch's ranges determined by its start and end
  offsets alone, also when Spark plans a batch again after a restart.

Between planning and reading, the executors check too: each range carries the epoch its end
was paired with (:attr:`kafka_source.read.offsets.OffsetRange.epoch`; during
Trigger.AvailableNow, whose triggers ask the brokers nothing, the epoch listed with the run's
target), and a record of a newer epoch below its end is the same truncation
(:func:`kafka_source.read.fetcher.newer_epoch`): the task fails, or ends the range there, and
the driver's check at the next trigger that lists offsets moves the partition back to the
divergence.

Across restarts: the pairs live in the driver's planning process, and they travel with the
group's commits -- each committed offset carries the leader epoch it was paired with
(OffsetCommit v6+, as Kafka's Java consumer commits; :mod:`kafka_source.group.commits`). A query
restarted from its checkpoint pairs each checkpoint offset that equals the group's committed one
with that epoch (:meth:`remember`), as does a member adopting a partition at its committed
offset (committed by this query, another query, or a Java consumer), so a truncation that
happened while nobody read is found at the first trigger like one while the query runs. Without
such a commit (commits off, the group's offset elsewhere, a committer without epochs) a
truncation while the query was down is found only as before: a log that ends before the
position.

Limits: an answer without an epoch (a broker before 2.1, or an epoch older than the leader still
remembers: ``(-1, -1)``) skips the check for that partition; brokers without
OffsetsForLeaderEpoch v2 skip it altogether.
"""

from __future__ import annotations

import logging
from typing import Mapping

from ..wire.net.client import BrokerClient, Retries, TopicPartition
from .offsets import on_data_loss

log = logging.getLogger(__name__)

Offsets = dict[TopicPartition, int]


class TruncationCheck:
    """Per partition, the (offset, leader epoch) of the last planned end offset; validated
    against the current leader when its epoch changed. One per stream reader."""

    def __init__(self) -> None:
        self.marks: dict[TopicPartition, tuple[int, int]] = {}
        self.supported = True          # False once the brokers lacked OffsetsForLeaderEpoch v2

    def note(self, ends: Mapping[TopicPartition, int],
             listed: Mapping[TopicPartition, tuple[int, int]]) -> None:
        """Remember the end offsets of the batch just planned, each with the leader epoch
        listed with this trigger's latest offset (``listed``: tp -> (latest offset, epoch)).
        An end at or below that latest offset lies in the log of that epoch; one beyond it (a
        committed offset held back by open transactions) or without an epoch is not paired."""
        marks = self.marks
        for tp, end in ends.items():
            latest, epoch = listed.get(tp, (-1, -1))
            if epoch >= 0 and 0 <= end <= latest:
                mark = marks.get(tp)
                # A new pair only where it changed: over thousands of partitions most stay,
                # and every pair made is work for Python's collector.
                if mark is None or mark[0] != end or mark[1] != epoch:
                    marks[tp] = (end, epoch)
            else:
                marks.pop(tp, None)

    def remember(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        """Pair ``offset`` with ``epoch`` as if this process had planned it: a committed offset
        of the group with the epoch its committer gave (OffsetCommit v6+), where the query
        resumes -- after a restart from a checkpoint at that offset, or adopting a partition.
        An offset without an epoch (-1: an older committer or broker) changes nothing."""
        if epoch >= 0 and offset >= 0:
            self.marks[tp] = (offset, epoch)

    def check(self, client: BrokerClient, start: Mapping[TopicPartition, int],
              listed: Mapping[TopicPartition, tuple[int, int]], *, fail_on_data_loss: bool,
              retries: Retries) -> Offsets:
        """Validate the positions ``start`` whose leader epoch changed since they were planned
        (``listed``: this trigger's latest offsets and epochs). Returns the divergence offset of
        each partition whose log was truncated below its position (failOnDataLoss false); fails
        with :class:`DataLossError` for the first one under failOnDataLoss true."""
        if not self.supported:
            return {}
        asked = {}
        for tp, position in start.items():
            mark = self.marks.get(tp)
            epoch_now = listed.get(tp, (-1, -1))[1]
            # Same epoch: no leader change, nothing to validate. A lower one: the topic was
            # recreated (epochs start again), which the log-end checks report.
            if mark is None or mark[0] != position or epoch_now < 0 or epoch_now <= mark[1]:
                continue
            asked[tp] = mark[1]
        if not asked:
            return {}
        answers = client.epoch_end_offsets(asked, retries=retries)
        if answers is None:
            self.supported = False
            return {}
        result: Offsets = {}
        for tp, epoch in sorted(asked.items()):
            position = start[tp]
            found_epoch, end = answers.get(tp, (-1, -1))
            if found_epoch < 0 or end < 0:
                log.info("%s-%d: the leader has no record of leader epoch %d any more; offset "
                         "%d is not validated", tp[0], tp[1], epoch, position)
                continue
            if end >= position:
                log.info("%s-%d: leader epoch %d -> %d; offset %d validated (epoch %d ends at "
                         "%d in the leader's log)", tp[0], tp[1], epoch, listed[tp][1],
                         position, found_epoch, end)
                continue
            topic, partition = tp
            message = (
                f"{topic}-{partition}: offsets {end} to {position - 1} ([{end}, {position})), "
                f"which the query already read, are no longer in Kafka: the partition's log "
                f"was truncated at offset {end} after an unclean leader election (a replica "
                f"that was not in sync became leader; leader epoch {epoch} -> "
                f"{listed[tp][1]}). The new leader's records from offset {end} on are "
                f"different ones.")
            on_data_loss(fail_on_data_loss, message,
                         remedy=f"Set the option 'failOnDataLoss' to 'false' to go on from "
                                f"offset {end}, reading the new leader's records from there "
                                f"(what the query read before at [{end}, {position}) stays in "
                                "its output).",
                         action=f"Continuing from offset {end}", logger=log)
            result[tp] = end
        return result
