"""What a client has seen of the cluster, and how far to believe a new Metadata answer.

One Metadata answer comes from one broker, and a broker's view can be behind the cluster's:

* A ZooKeeper-mode broker (Kafka 2.x, 3.x) that has just started first learns the live brokers
  from the controller and only then, in a later UpdateMetadata, the partitions. In between it
  answers Metadata *with* brokers and UNKNOWN_TOPIC_OR_PARTITION for every topic (measured on
  Kafka 2.2: about a second after a restart with 60 topics, longer on a loaded machine or a larger
  cluster). A running stream that took that answer as proof of deletion died with "no longer
  exists"; a batch read planned then failed with "does not exist". In a cluster the same answer
  can come from any broker that has just started.
* Any broker can lag the controller for a moment after a leader election, and a client that asks
  two brokers in turn can see a partition's leadership go backwards.

So, as Kafka's Java client does with leader epochs (KIP-320), this view keeps per partition the
newest leader epoch seen (Metadata v7+, Kafka 2.1+) and calls an answer with an older epoch
*stale*: the caller asks again, preferably another broker. And a topic or partition that was
there -- seen by this client, or named by a range already planned -- is believed gone only when
answers go on lacking it for :attr:`MetadataView.confirm_ms` and for at least two answers, asked
of other brokers where there are others; an answer that has it ends the doubt. A topic or
partition that really was deleted is still reported, within that bound, with the same clear
message as before (data loss, subject to ``failOnDataLoss``, or "does not exist").

A topic deleted and created again under the same name keeps the name, not its id (KIP-516:
Metadata v10+, Kafka 2.8+). An answer with a new id for a topic replaces the old one at once:
its leader epochs, which start anew, and its partitions are forgotten, so that the new topic is
not doubted as a stale view of the old one. An answer that names an id seen replaced comes
from a broker behind: stale, asked again. Brokers older than 2.8 give no topic id to tell the
two apart: a stale view there that persists beyond the bound above is accepted after all.

A topic this client has never seen that an answer calls unknown is reported at once, unless the
broker that answered is in ZooKeeper mode and lists no topic at all (asked once, only then):
that is the broker above that knows the brokers but not yet the partitions, not a cluster
without the topic. A KRaft broker opens its listeners only once it has caught up with the
cluster's metadata, so its answer is taken as it is (a new cluster has no topic at all).
"""

from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import kafka.errors as Errors

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
UNKNOWN_TOPIC_OR_PARTITION = Errors.UnknownTopicOrPartitionError.errno

#: The longest a vanished topic or partition is doubted (the bound is also at most half of
#: ``kafka.request.timeout.ms``, so that the planning retries outlast it).
MAX_CONFIRM_MS = 10_000
#: Answers that must lack it, at the least.
MIN_ANSWERS = 2


class UnconfirmedAnswer(Exception):
    """A Metadata answer that is not believed yet (stale, or lacking what was there); the
    caller asks again. ``infos`` is what it said, for when the caller's retries run out."""

    def __init__(self, message: str, infos: Mapping | None = None):
        super().__init__(message)
        self.infos = infos


@dataclass
class _Absence:
    since: float
    answers: int = 0
    brokers: set = field(default_factory=set)


def topic_id_text(topic_id: bytes | None) -> str:
    """A topic id as Kafka's tools print it (``kafka-topics.sh --describe``: Uuid.toString(),
    URL-safe base64 without padding)."""
    if topic_id is None:
        return "none"
    return base64.urlsafe_b64encode(topic_id).decode().rstrip("=")


def confirm_ms_for(request_timeout_ms: int) -> int:
    """How long absence is doubted under ``kafka.request.timeout.ms``."""
    return max(0, min(MAX_CONFIRM_MS, request_timeout_ms // 2))


class MetadataView:
    """Leader epochs and readable partitions seen so far; doubts about what went missing.

    Not thread-safe (one per client, as the client)."""

    def __init__(self, confirm_ms: int = MAX_CONFIRM_MS, min_answers: int = MIN_ANSWERS,
                 clock=time.monotonic):
        self.confirm_ms = confirm_ms
        self.min_answers = min_answers
        self._clock = clock
        self._epochs: dict[TopicPartition, int] = {}
        self._stale_since: dict[TopicPartition, float] = {}
        self._partitions: dict[str, set[int]] = {}       # readable topics -> partitions seen
        self._absent: dict[TopicPartition, _Absence] = {}
        self._topic_ids: dict[str, bytes] = {}            # the newest id seen per topic
        self._replaced_ids: dict[str, set[bytes]] = {}    # ids a topic had before
        #: The broker whose answer was doubted last: ask another one next (None: any).
        self.avoid: object = None

    # --- topic ids ----------------------------------------------------------------------------

    def topic_id(self, topic: str) -> bytes | None:
        """The id of ``topic`` as last seen (None: none seen, a broker before Kafka 2.8). It
        never goes back to an id it replaced."""
        return self._topic_ids.get(topic)

    def check_topic_ids(self, node, ids: Mapping[str, bytes | None]) -> None:
        """Raise :class:`UnconfirmedAnswer` when ``node`` names a topic by an id that was
        replaced (a broker behind the deletion); else take the ids in. A topic whose id
        changed was deleted and created again: what was seen of the old one is forgotten."""
        stale = sorted(t for t, i in ids.items()
                       if i is not None and i in self._replaced_ids.get(t, ()))
        if stale:
            self.avoid = node
            raise UnconfirmedAnswer(f"broker {node} answered Metadata with the id that topic(s) "
                                    f"{', '.join(stale[:5])} had before they were created "
                                    "again; asking again")
        for topic, topic_id in ids.items():
            if topic_id is None:
                continue
            known = self._topic_ids.get(topic)
            if known is not None and known != topic_id:
                log.warning("Topic '%s' was deleted and created again: its id changed from %s "
                            "to %s", topic, topic_id_text(known), topic_id_text(topic_id))
                self._replaced_ids.setdefault(topic, set()).add(known)
                self._forget(topic)
            self._topic_ids[topic] = topic_id

    def _forget(self, topic: str) -> None:
        for table in (self._epochs, self._stale_since, self._absent):
            for tp in [tp for tp in table if tp[0] == topic]:
                del table[tp]
        self._partitions.pop(topic, None)

    # --- leader epochs ------------------------------------------------------------------------

    def epoch(self, tp: TopicPartition) -> int:
        """The newest leader epoch seen for ``tp``; -1 if none (a broker before Kafka 2.1)."""
        return self._epochs.get(tp, -1)

    @property
    def epochs(self) -> Mapping[TopicPartition, int]:
        """Every newest leader epoch seen (read only): :meth:`epoch` for many partitions."""
        return self._epochs

    def check_epochs(self, node, epochs: Mapping[TopicPartition, int]) -> None:
        """Raise :class:`UnconfirmedAnswer` when ``node`` answered an older leader epoch than
        one already seen (for no longer than :attr:`confirm_ms`); else remember the epochs."""
        now = self._clock()
        stale = []
        for tp, epoch in epochs.items():
            known = self._epochs.get(tp)
            if epoch < 0 or known is None or epoch >= known:
                self._stale_since.pop(tp, None)
                continue
            since = self._stale_since.setdefault(tp, now)
            if (now - since) * 1000 < self.confirm_ms:
                stale.append((tp, epoch, known))
            else:
                log.warning("%s-%d: leader epoch %d is older than %d seen before, for %.1f s: "
                            "taking it (the topic was recreated?)", tp[0], tp[1], epoch, known,
                            now - since)
                self._epochs[tp] = epoch
                self._stale_since.pop(tp, None)
        if stale:
            self.avoid = node
            shown = ", ".join(f"{t}-{p} epoch {e} < {k}" for (t, p), e, k in stale[:5])
            raise UnconfirmedAnswer(f"broker {node} answered Metadata from an older view of the "
                                    f"cluster ({shown}); asking again")
        for tp, epoch in epochs.items():
            if epoch >= 0:
                self._epochs[tp] = epoch

    # --- topics and partitions ----------------------------------------------------------------

    def seen(self, infos: Mapping) -> None:
        """Remember the partitions of every readable topic of an answer."""
        for name, info in infos.items():
            if info.error_code == 0 and info.partitions:
                self._partitions.setdefault(name, set()).update(info.partitions)

    def known_partitions(self, topics: Iterable[str]) -> set[TopicPartition]:
        return {(t, p) for t in topics for p in self._partitions.get(t, ())}

    def confirm_present(self, node, infos: Mapping, expected: Iterable[TopicPartition]) -> None:
        """Check an answer against ``expected`` (partitions that were there). Those it has end
        any doubt; those it lacks are doubted: :class:`UnconfirmedAnswer` until they have been
        missing for :attr:`confirm_ms` and :attr:`min_answers` answers. Once confirmed they
        are forgotten, and the caller reports them as gone."""
        now = self._clock()
        doubted, confirmed = [], []
        for tp in set(expected):        # sorted below where it matters (the log and error)
            info = infos.get(tp[0])
            if info is not None and info.error_code == 0 and tp[1] in info.partitions:
                self._absent.pop(tp, None)
                continue
            if info is not None and info.error_code not in (0, UNKNOWN_TOPIC_OR_PARTITION):
                continue     # another error (no leader, authorization): not an absence
            absence = self._absent.setdefault(tp, _Absence(now))
            absence.answers += 1
            absence.brokers.add(node)
            if (now - absence.since) * 1000 < self.confirm_ms \
                    or absence.answers < self.min_answers:
                doubted.append(tp)
            else:
                confirmed.append(tp)
        doubted.sort()
        for tp in sorted(confirmed):
            absence = self._absent.pop(tp)
            log.warning("%s-%d is missing from every Metadata answer for %.1f s (%d answers, "
                        "brokers %s): it is gone", tp[0], tp[1], now - absence.since,
                        absence.answers, sorted(map(str, absence.brokers)))
            self._partitions.get(tp[0], set()).discard(tp[1])
            self._epochs.pop(tp, None)
        if doubted:
            self.avoid = node
            shown = ", ".join(f"{t}-{p}" for t, p in doubted[:10])
            raise UnconfirmedAnswer(
                f"broker {node} does not know {shown}, which existed; asking again (for up to "
                f"{self.confirm_ms / 1000:.0f} s) before taking it as deleted", infos)
