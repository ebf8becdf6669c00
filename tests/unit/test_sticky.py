"""The sticky assignors (:mod:`kafka_source.group.sticky`): Kafka's byte layouts, and the
assignment's properties -- every partition to exactly one subscribed member, balanced, sticky, and
under the cooperative protocol never given to a member while another still owns it."""

from __future__ import annotations

import random
import struct

import pytest

from kafka_source.group.assignors import Subscription, validate_assignment
from kafka_source.group.sticky import (CooperativeStickyAssignor, StickyAssignor,
                                       decode_generation, decode_sticky_user_data,
                                       encode_generation, encode_sticky_user_data, sticky_assign)

pytestmark = pytest.mark.pyspark_free


def java_sticky_user_data(assignment: dict[str, list[int]], generation: int | None) -> bytes:
    """The bytes Java's StickyAssignor writes (Struct of STICKY_ASSIGNOR_USER_DATA_V1, or V0
    without the generation), built by hand from the schema."""
    out = struct.pack(">i", len(assignment))
    for topic, partitions in assignment.items():
        raw = topic.encode()
        out += struct.pack(">h", len(raw)) + raw + struct.pack(">i", len(partitions))
        out += b"".join(struct.pack(">i", p) for p in partitions)
    return out + (struct.pack(">i", generation) if generation is not None else b"")


def test_sticky_user_data_is_kafkas_layout_both_ways():
    data = java_sticky_user_data({"a": [0, 2], "b": [1]}, 7)
    assert decode_sticky_user_data(data) == ((("a", 0), ("a", 2), ("b", 1)), 7)
    assert encode_sticky_user_data([("b", 1), ("a", 2), ("a", 0)], 7) == data
    # v0 (Kafka 2.0 and older): no generation
    assert decode_sticky_user_data(java_sticky_user_data({"a": [1]}, None)) == ((("a", 1),), -1)
    assert decode_sticky_user_data(None) == ((), -1)
    assert decode_sticky_user_data(b"\x00\x00") == ((), -1)          # garbage: owns nothing
    assert decode_generation(encode_generation(12)) == 12 and decode_generation(b"") == -1


def check(result, counts, members):
    """Every partition of a subscribed topic assigned exactly once, to a subscribed member, and
    balanced in Kafka's sense: no partition could move to a member holding two fewer."""
    subs = {m: Subscription(tuple(topics)) for m, (topics, _, _) in members.items()}
    validate_assignment(result, counts, subs, "test")
    assigned = sorted(tp for tps in result.values() for tp in tps)
    wanted = sorted((t, p) for t, n in counts.items() for p in range(n)
                    if any(t in topics for topics, _, _ in members.values()))
    assert assigned == wanted
    for donor, tps in result.items():
        for tp in tps:
            for taker, topics in ((m, members[m][0]) for m in result):
                assert not (tp[0] in topics and len(result[taker]) + 2 <= len(tps)), \
                    (tp, donor, taker, {m: len(v) for m, v in result.items()})


def test_a_new_group_is_balanced():
    counts = {"t": 10}
    members = {m: (["t"], [], -1) for m in ("c", "a", "b")}
    result = sticky_assign(counts, members, cooperative=False)
    check(result, counts, members)
    assert sorted(len(v) for v in result.values()) == [3, 3, 4]


def test_a_member_that_leaves_moves_only_its_partitions():
    counts = {"t": 9}
    before = sticky_assign(counts, {m: (["t"], [], -1) for m in "abc"}, cooperative=False)
    members = {m: (["t"], before[m], 1) for m in "ab"}          # c left
    after = sticky_assign(counts, members, cooperative=True)
    check(after, counts, members)
    for m in "ab":
        assert set(before[m]) <= set(after[m])                   # nothing taken from a or b


def test_a_member_that_joins_cooperatively_gets_its_share_in_a_second_round():
    counts = {"t": 8, "u": 4}
    first = sticky_assign(counts, {m: (["t", "u"], [], -1) for m in "ab"}, cooperative=True)
    # c joins: a and b keep reading what they keep; what moves is assigned to nobody yet.
    members = {"a": (["t", "u"], first["a"], 1), "b": (["t", "u"], first["b"], 1),
               "c": (["t", "u"], [], -1)}
    second = sticky_assign(counts, members, cooperative=True)
    assert second["c"] == []
    for m in "ab":
        assert set(second[m]) <= set(first[m])
    moving = set(first["a"]) | set(first["b"])
    moving -= set(second["a"]) | set(second["b"])
    assert len(moving) == 4                                      # 12 / 3 members: 4 for c
    # a and b revoke what they lost and rejoin: now nobody owns those, and c gets them.
    members = {"a": (["t", "u"], second["a"], 2), "b": (["t", "u"], second["b"], 2),
               "c": (["t", "u"], [], -1)}
    third = sticky_assign(counts, members, cooperative=True)
    check(third, counts, members)
    assert set(third["c"]) == moving
    assert third["a"] == second["a"] and third["b"] == second["b"]


def test_an_owner_of_an_older_generation_loses_the_partition_and_equal_claims_are_void():
    counts = {"t": 4}
    members = {"a": (["t"], [("t", 0), ("t", 1)], 5),
               "b": (["t"], [("t", 1), ("t", 2)], 4),      # b missed a rebalance: t-1 is a's
               "c": (["t"], [("t", 3)], 5)}
    result = sticky_assign(counts, members, cooperative=False)
    assert ("t", 1) in result["a"] and ("t", 1) not in result["b"]
    check(result, counts, members)
    members = {"a": (["t"], [("t", 0)], 5), "b": (["t"], [("t", 0)], 5)}
    result = sticky_assign(counts, members, cooperative=True)
    # Neither keeps t-0 (no current owner), so it is free to be assigned this round.
    check(result, counts, members)


def test_partitions_of_topics_a_member_left_or_that_are_gone_are_not_owned():
    counts = {"t": 2}
    members = {"a": (["t"], [("t", 0), ("old", 0), ("t", 5)], 3), "b": (["t"], [], -1)}
    result = sticky_assign(counts, members, cooperative=True)
    assert result == {"a": [("t", 0)], "b": [("t", 1)]}


@pytest.mark.parametrize("seed", range(40))
def test_random_groups_stay_valid_balanced_and_sticky(seed):
    rng = random.Random(seed)
    topics = [f"t{i}" for i in range(rng.randint(1, 4))]
    counts = {t: rng.randint(1, 12) for t in topics}
    names = [f"m{i}" for i in range(rng.randint(1, 6))]
    same = rng.random() < 0.5
    subs = {m: (topics if same else rng.sample(topics, rng.randint(1, len(topics))))
            for m in names}
    owned = sticky_assign(counts, {m: (subs[m], [], -1) for m in names}, cooperative=False)
    check(owned, counts, {m: (subs[m], [], -1) for m in names})
    # Churn: one member leaves, one joins; the cooperative rounds never hand out a partition
    # that another member still owns, and settle in two rounds.
    leaving = rng.choice(names)
    members = {m: (subs[m], owned[m], 1) for m in names if m != leaving}
    members["new"] = (topics if same else rng.sample(topics, rng.randint(1, len(topics))), [],
                      -1)
    first = sticky_assign(counts, members, cooperative=True)
    for m, tps in first.items():
        for tp in tps:
            assert all(tp not in members[o][1] for o in members if o != m)
    members = {m: (members[m][0], first[m], 2) for m in members}
    second = sticky_assign(counts, members, cooperative=True)
    check(second, counts, members)
    for m in members:                       # a second round takes nothing from anyone
        assert set(first[m]) <= set(second[m])
    if same:
        kept = sum(len(set(owned[m]) & set(second[m])) for m in names if m != leaving)
        # Stickiness: with one subscription for all, a member keeps min(its old share, new
        # quota) partitions -- every partition that moves has to.
        quota = sum(counts.values()) // len(members)
        assert kept >= sum(min(len(owned[m]), quota) for m in names if m != leaving)


def test_the_assignors_report_ownership_as_kafka_clients_read_it():
    coop = CooperativeStickyAssignor()
    coop.remember([("t", 1), ("t", 0)], 9)
    assert coop.owned == (("t", 0), ("t", 1)) and coop.generation == 9
    assert decode_generation(coop.subscription_user_data({"t"})) == 9
    sticky = StickyAssignor()
    sticky.remember([("t", 2)], 4)
    assert decode_sticky_user_data(sticky.subscription_user_data({"t"})) == ((("t", 2),), 4)
    # The leader reads a Java member's ownership from either place.
    subs = {"java-coop": Subscription(("t",), encode_generation(3), (("t", 0),), 3),
            "java-sticky": Subscription(("t",), java_sticky_user_data({"t": [1]}, 3))}
    assert CooperativeStickyAssignor().assign({"t": 2}, {"java-coop": subs["java-coop"]}) == \
        {"java-coop": [("t", 0), ("t", 1)]}
    result = StickyAssignor().assign({"t": 3}, subs)
    assert ("t", 0) in result["java-coop"] and ("t", 1) in result["java-sticky"]
