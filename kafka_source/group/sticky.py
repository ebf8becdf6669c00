"""Kafka's sticky assignors: ``"sticky"`` (KIP-54, eager) and ``"cooperative-sticky"`` (KIP-429).

Why: with ``range`` or ``roundrobin`` every rebalance may hand every partition to another member,
and under the eager protocol every member stops reading all of its partitions until the group
has settled. The sticky assignors give each member back what it owned as far as a balanced
assignment allows; the cooperative one also lets members keep reading what they keep, because
only the partitions that move are revoked. ``cooperative-sticky`` is the second entry of the
Java consumer's default ``partition.assignment.strategy`` (``[range, cooperative-sticky]``) and
the only one in many deployments: a group of such consumers can take a query only if the query
offers it too.

What a member tells the leader (Kafka's layouts, so that Java and librdkafka members mix in):

* ``cooperative-sticky``: the partitions it owns and its generation in the Subscription itself
  (``owned_partitions``, v1; ``generation_id``, v2), and the generation again as the user data
  (an int32, for leaders that read Subscription v1 only).
* ``sticky``: the previous assignment and its generation as user data
  (``StickyAssignorUserData`` v1: ``[topic [partition]] generation``, no version prefix; v0 has
  no generation). Eager members revoke everything before they join, so the Subscription's owned
  partitions are empty: the user data is what makes it sticky.

The assignment (the leader's job, the same for both):

1. Ownership claims are checked: a partition that no longer exists, or whose topic the member no
   longer subscribes to, is not owned. Two members claiming one partition (one of them missed
   a rebalance): the claim of the higher generation wins; equal generations: neither (as Java).
2. Every member keeps what it owns; partitions nobody owns go, one by one in (topic, partition)
   order, to the subscribed member holding the fewest.
3. Balance: while a member holds two or more partitions more than another member that could
   take one of them, one moves (a partition it got in step 2 first, then one it owned). The
   result is balanced in Kafka's sense -- no partition can move to a member holding at least two
   fewer -- with as few of the owned partitions moved as that needs.
4. ``cooperative-sticky`` only: a partition that moves from one current member to another is
   left out of this round's assignment. Its owner revokes it (it is not in its new assignment)
   and rejoins at once; in that second rebalance nobody owns it and it goes to its new member.
   So no partition is ever read by two members at a time, and members stop reading only the
   partitions that move.

The result need not equal Java's assignment for the same input -- only the leader's assignor
runs -- but it has the properties members rely on: balanced, sticky, and under the cooperative
protocol never giving a member a partition another member still owns.
"""

from __future__ import annotations

import logging
import struct
from typing import Iterable, Mapping

from .assignors import (Assignment, PartitionAssignor, Subscription, TopicPartition, _Reader,
                        _encode_string, _sorted_members)

log = logging.getLogger(__name__)

_INT32 = struct.Struct(">i")
NO_GENERATION = -1


# --- user data ----------------------------------------------------------------------------------

def encode_sticky_user_data(owned: Iterable[TopicPartition], generation: int) -> bytes:
    """``StickyAssignorUserData`` v1: ``[topic [partition]] generation``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(owned):
        by_topic.setdefault(topic, []).append(partition)
    parts = [_INT32.pack(len(by_topic))]
    for topic, partitions in by_topic.items():
        parts.append(_encode_string(topic))
        parts.append(_INT32.pack(len(partitions)))
        parts.extend(_INT32.pack(p) for p in partitions)
    parts.append(_INT32.pack(generation))
    return b"".join(parts)


def decode_sticky_user_data(data: bytes | None) -> tuple[tuple[TopicPartition, ...], int]:
    """(previous assignment, generation) of ``StickyAssignorUserData`` v1 or v0 (no generation:
    -1); empty, or undecodable bytes (logged): nothing owned."""
    if not data:
        return (), NO_GENERATION
    reader = _Reader(data, "sticky assignor user data")
    try:
        owned = []
        for _ in range(reader.array_length("previous_assignment")):
            topic = reader.string("topic")
            for _ in range(reader.array_length("partitions")):
                owned.append((topic, reader.int32("partition")))
        generation = NO_GENERATION if reader.at_end() else reader.int32("generation")
    except ValueError as exc:
        log.warning("Ignoring a member's sticky assignor data: %s", exc)
        return (), NO_GENERATION
    return tuple(owned), generation


def encode_generation(generation: int) -> bytes:
    """``cooperative-sticky``'s user data: the generation, an int32."""
    return _INT32.pack(generation)


def decode_generation(data: bytes | None) -> int:
    if not data or len(data) < 4:
        return NO_GENERATION
    return _INT32.unpack_from(data)[0]


# --- the assignment -----------------------------------------------------------------------------

def sticky_assign(partitions_per_topic: Mapping[str, int],
                  members: Mapping[str, tuple[Iterable[str], Iterable[TopicPartition], int]],
                  *, cooperative: bool) -> dict[str, list[TopicPartition]]:
    """Steps 1-4 of the module docstring. ``members``: member id -> (subscribed topics, owned
    partitions, generation of that ownership)."""
    order = _sorted_members(members)
    subscribed = {m: set(members[m][0]) for m in order}
    exists = {(t, p) for t, n in partitions_per_topic.items() for p in range(n)}

    # 1. claims
    claims: dict[TopicPartition, list[tuple[int, str]]] = {}
    for m in order:
        _, owned, generation = members[m]
        for tp in set(owned):
            if tp in exists and tp[0] in subscribed[m]:
                claims.setdefault(tp, []).append((generation, m))
    owner: dict[TopicPartition, str] = {}
    for tp, claimants in claims.items():
        best = max(g for g, _ in claimants)
        winners = [m for g, m in claimants if g == best]
        if len(winners) == 1:
            owner[tp] = winners[0]
        else:
            log.warning("%s-%d is claimed by %d members of generation %d (%s): assigned anew",
                        tp[0], tp[1], len(winners), best, ", ".join(winners))

    # 2. keep what is owned; the rest to the subscribed member holding the fewest
    held: dict[str, list[TopicPartition]] = {m: [] for m in order}
    for tp in sorted(owner):
        held[owner[tp]].append(tp)
    rank = {m: i for i, m in enumerate(order)}
    for tp in sorted(exists - set(owner)):
        eligible = [m for m in order if tp[0] in subscribed[m]]
        if eligible:
            held[min(eligible, key=lambda m: (len(held[m]), rank[m]))].append(tp)

    # 3. balance: move from the fullest member to one holding two fewer that may take it
    moves_left = sum(len(v) for v in held.values()) * max(1, len(order))
    while moves_left > 0:
        moves_left -= 1
        move = None
        for donor in sorted(order, key=lambda m: (-len(held[m]), rank[m])):
            # Partitions the donor got in step 2 go first: they cost no stickiness.
            candidates = sorted(held[donor], key=lambda tp: (owner.get(tp) == donor, tp))
            for tp in candidates:
                takers = [m for m in order if m != donor and tp[0] in subscribed[m]
                          and len(held[m]) + 2 <= len(held[donor])]
                if takers:
                    move = (donor, tp, min(takers, key=lambda m: (len(held[m]), rank[m])))
                    break
            if move is not None:
                break
        if move is None:
            break
        donor, tp, taker = move
        held[donor].remove(tp)
        held[taker].append(tp)

    # 4. cooperative: what moves between current members waits for its owner to revoke it
    if cooperative:
        for m in order:
            held[m] = [tp for tp in held[m] if owner.get(tp, m) == m]
    return {m: sorted(held[m]) for m in order}


class _StickyAssignor(PartitionAssignor):
    """What both sticky assignors share: what this member owns, and the assignment."""

    cooperative = False

    def __init__(self):
        self.owned: tuple[TopicPartition, ...] = ()
        self.generation = NO_GENERATION

    def remember(self, partitions: Iterable[TopicPartition], generation: int) -> None:
        """What this member owns now (its member calls this after each assignment)."""
        self.owned = tuple(sorted(partitions))
        self.generation = generation

    def on_assignment(self, assignment: Assignment) -> None:
        self.owned = tuple(sorted(assignment.partitions))

    def assign(self, partitions_per_topic, subscriptions):
        members = {m: (s.topics, *self._ownership(s)) for m, s in subscriptions.items()}
        return sticky_assign(partitions_per_topic, members, cooperative=self.cooperative)

    def _ownership(self, s: Subscription) -> tuple[tuple[TopicPartition, ...], int]:
        raise NotImplementedError


class StickyAssignor(_StickyAssignor):
    """Kafka's ``StickyAssignor`` (``"sticky"``, eager protocol)."""

    name = "sticky"

    def subscription_user_data(self, topics: set[str]) -> bytes | None:
        return encode_sticky_user_data(self.owned, self.generation)

    def _ownership(self, s):
        if s.owned_partitions:                    # a member that reports them itself
            return s.owned_partitions, s.generation_id
        return decode_sticky_user_data(s.user_data)


class CooperativeStickyAssignor(_StickyAssignor):
    """Kafka's ``CooperativeStickyAssignor`` (``"cooperative-sticky"``, cooperative protocol)."""

    name = "cooperative-sticky"
    cooperative = True

    def subscription_user_data(self, topics: set[str]) -> bytes | None:
        return encode_generation(self.generation)

    def _ownership(self, s):
        generation = s.generation_id if s.generation_id != NO_GENERATION \
            else decode_generation(s.user_data)
        return s.owned_partitions, generation
