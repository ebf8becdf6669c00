"""Consumer-group assignors and the ConsumerProtocol wire format (no broker needed)."""

from __future__ import annotations

import logging
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_source.group.sticky import CooperativeStickyAssignor, StickyAssignor
from kafka_source.group.assignors import (
    Assignment,
    PartitionAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    Subscription,
    assign_group,
    load_assignor,
    to_assignments,
    validate_assignment,
)
from kafka_source.errors import KafkaSourceError, OptionError

pytestmark = pytest.mark.pyspark_free


def subs(**topics_by_member: str) -> dict[str, Subscription]:
    """subs(C0="t0 t1") -> {"C0": Subscription(("t0", "t1"))}"""
    return {m: Subscription(tuple(t.split())) for m, t in topics_by_member.items()}


def tp(spec: str) -> list[tuple[str, int]]:
    """tp("t0p0 t1p2") -> [("t0", 0), ("t1", 2)]"""
    result = []
    for item in spec.split():
        topic, partition = item.rsplit("p", 1)
        result.append((topic, int(partition)))
    return result


# ------------------------------------------------------------------------------------------
# RangeAssignor
# ------------------------------------------------------------------------------------------

def test_range_kafka_documented_example():
    result = RangeAssignor().assign({"t0": 3, "t1": 3}, subs(C0="t0 t1", C1="t0 t1"))
    assert result == {"C0": tp("t0p0 t0p1 t1p0 t1p1"), "C1": tp("t0p2 t1p2")}


def test_range_uneven_subscriptions():
    result = RangeAssignor().assign({"t0": 5, "t1": 2},
                                    subs(A="t0", B="t0 t1", C="t1"))
    # t0 over A, B: 3 + 2; t1 over B, C: 1 + 1
    assert result == {"A": tp("t0p0 t0p1 t0p2"), "B": tp("t0p3 t0p4 t1p0"), "C": tp("t1p1")}


def test_range_more_members_than_partitions():
    result = RangeAssignor().assign({"t": 2}, subs(m1="t", m2="t", m3="t", m4="t"))
    assert result == {"m1": tp("tp0"), "m2": tp("tp1"), "m3": [], "m4": []}


def test_range_sorts_members_by_id_not_insertion_order():
    subscriptions = subs(c="t", a="t", b="t")
    result = RangeAssignor().assign({"t": 4}, subscriptions)
    assert result == {"a": tp("tp0 tp1"), "b": tp("tp2"), "c": tp("tp3")}
    # and "10" < "9" as strings, as in Kafka
    result = RangeAssignor().assign({"t": 3}, subs(**{"9": "t", "10": "t"}))
    assert result == {"10": tp("tp0 tp1"), "9": tp("tp2")}
    # Java's String order (UTF-16 code units): U+1F600 (surrogates D83D DE00) < U+FFFD,
    # although Python's code-point order says the opposite
    result = RangeAssignor().assign({"t": 3}, subs(**{"\uFFFD": "t", "\U0001F600": "t"}))
    assert result == {"\U0001F600": tp("tp0 tp1"), "\uFFFD": tp("tp2")}


def test_range_topic_with_no_subscriber_and_subscribed_topic_missing():
    # "orphan" exists but nobody subscribes; "ghost" is subscribed but does not exist
    result = RangeAssignor().assign({"t": 2, "orphan": 3}, subs(A="t ghost", B="t"))
    assert result == {"A": tp("tp0"), "B": tp("tp1")}


def test_range_no_members():
    assert RangeAssignor().assign({"t": 3}, {}) == {}


# ------------------------------------------------------------------------------------------
# RoundRobinAssignor
# ------------------------------------------------------------------------------------------

def test_roundrobin_kafka_documented_example():
    result = RoundRobinAssignor().assign({"t0": 3, "t1": 3}, subs(C0="t0 t1", C1="t0 t1"))
    assert result == {"C0": tp("t0p0 t0p2 t1p1"), "C1": tp("t0p1 t1p0 t1p2")}


def test_roundrobin_kafka_uneven_subscriptions_example():
    result = RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3},
                                         subs(C0="t0", C1="t0 t1", C2="t0 t1 t2"))
    assert result == {"C0": tp("t0p0"), "C1": tp("t1p0"), "C2": tp("t1p1 t2p0 t2p1 t2p2")}


def test_roundrobin_sorts_members_and_partitions():
    # members given out of order; topics given out of order
    result = RoundRobinAssignor().assign({"b": 2, "a": 2}, subs(z="a b", y="a b", x="a b"))
    assert result == {"x": tp("ap0 bp1"), "y": tp("ap1"), "z": tp("bp0")}


def test_roundrobin_more_members_than_partitions_and_unsubscribed_topics():
    result = RoundRobinAssignor().assign({"t": 2, "orphan": 4}, subs(a="t", b="t ghost", c="t"))
    assert result == {"a": tp("tp0"), "b": tp("tp1"), "c": []}


# ------------------------------------------------------------------------------------------
# Properties of both assignors
# ------------------------------------------------------------------------------------------

@st.composite
def groups(draw):
    """(partitions_per_topic, subscriptions) with random topics, counts and subscriptions;
    some subscriptions name topics that do not exist."""
    topics = draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), unique=True, max_size=5))
    partitions_per_topic = {t: draw(st.integers(0, 12)) for t in topics}
    member_ids = draw(st.lists(st.text("xyz019-Ω\U0001F600\uFFFD", min_size=1, max_size=4),
                               unique=True, max_size=7))
    subscribable = topics + ["missing"]
    subscriptions = {
        m: Subscription(tuple(draw(st.lists(st.sampled_from(subscribable), unique=True))))
        for m in member_ids
    }
    return partitions_per_topic, subscriptions


def check_complete_and_exclusive(result, partitions_per_topic, subscriptions):
    assert set(result) == set(subscriptions)
    owners: dict[tuple[str, int], list[str]] = {}
    for member, partitions in result.items():
        for topic, partition in partitions:
            assert topic in subscriptions[member].topics
            owners.setdefault((topic, partition), []).append(member)
    subscribed = {t for s in subscriptions.values() for t in s.topics}
    expected = {(t, p) for t, n in partitions_per_topic.items() if t in subscribed
                for p in range(n)}
    assert set(owners) == expected
    assert all(len(members) == 1 for members in owners.values())


@settings(max_examples=300, deadline=None)
@given(groups())
def test_range_property(group):
    partitions_per_topic, subscriptions = group
    result = RangeAssignor().assign(partitions_per_topic, subscriptions)
    check_complete_and_exclusive(result, partitions_per_topic, subscriptions)
    # per topic: sizes differ by at most one, larger shares first, contiguous ranges in
    # member id order (Java string order, i.e. UTF-16 code units)
    for topic, count in partitions_per_topic.items():
        members = sorted((m for m, s in subscriptions.items() if topic in s.topics),
                         key=lambda m: m.encode("utf-16-be", "surrogatepass"))
        shares = [[p for t, p in result[m] if t == topic] for m in members]
        sizes = [len(s) for s in shares]
        if sizes:
            assert max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)
        assert [p for share in shares for p in share] == list(range(count if members else 0))


@settings(max_examples=300, deadline=None)
@given(groups())
def test_roundrobin_property(group):
    partitions_per_topic, subscriptions = group
    result = RoundRobinAssignor().assign(partitions_per_topic, subscriptions)
    check_complete_and_exclusive(result, partitions_per_topic, subscriptions)
    # each member's list is in (topic, partition) order
    assert all(partitions == sorted(partitions) for partitions in result.values())


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from("abcd"), st.integers(0, 9)),
       st.lists(st.text("mn0", min_size=1, max_size=3), unique=True, min_size=1, max_size=6))
def test_roundrobin_balanced_when_everyone_subscribes_to_everything(partitions_per_topic, ids):
    subscriptions = {m: Subscription(tuple(partitions_per_topic)) for m in ids}
    result = RoundRobinAssignor().assign(partitions_per_topic, subscriptions)
    check_complete_and_exclusive(result, partitions_per_topic, subscriptions)
    sizes = [len(result[m]) for m in sorted(ids)]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the first members (by id) get the extras


@pytest.mark.parametrize("assignor", [RangeAssignor(), RoundRobinAssignor()])
def test_builtin_results_pass_validation(assignor):
    partitions_per_topic = {"t0": 1, "t1": 2, "t2": 3}
    subscriptions = subs(C0="t0", C1="t0 t1", C2="t0 t1 t2")
    result = assignor.assign(partitions_per_topic, subscriptions)
    assert validate_assignment(result, partitions_per_topic, subscriptions,
                               assignor.name) == result


# ------------------------------------------------------------------------------------------
# Wire format
# ------------------------------------------------------------------------------------------

def s16(text):
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def int32s(*values):
    return struct.pack(f">{len(values)}i", *values)


def test_subscription_v0_by_hand():
    data = struct.pack(">h", 0) + int32s(2) + s16("t0") + s16("t1") + int32s(3) + b"abc"
    assert Subscription.decode(data) == Subscription(("t0", "t1"), b"abc")
    assert Subscription(("t0", "t1"), b"abc").encode() == data


def test_subscription_v0_null_user_data():
    data = struct.pack(">h", 0) + int32s(1) + s16("t") + int32s(-1)
    assert Subscription.decode(data) == Subscription(("t",), None)
    assert Subscription(("t",)).encode() == data


def test_subscription_v1_by_hand():
    data = (struct.pack(">h", 1) + int32s(1) + s16("t0") + int32s(0)
            + int32s(2) + s16("t0") + int32s(2, 0, 3) + s16("t9") + int32s(1, 7))
    sub = Subscription.decode(data)
    assert sub == Subscription(("t0",), b"", (("t0", 0), ("t0", 3), ("t9", 7)))
    assert sub.user_data == b""
    assert sub.encode() == data  # owned partitions are encoded as v1


def test_subscription_v3_by_hand_with_owned_generation_rack():
    data = (struct.pack(">h", 3) + int32s(2) + s16("a") + s16("b") + int32s(-1)
            + int32s(1) + s16("a") + int32s(1, 4) + int32s(42) + s16("rack-1"))
    sub = Subscription.decode(data)
    assert sub.topics == ("a", "b")
    assert sub.user_data is None
    assert sub.owned_partitions == (("a", 4),)
    assert sub.generation_id == 42
    assert sub.rack_id == "rack-1"
    assert Subscription.decode(sub.encode()) == sub


def test_subscription_v3_null_rack():
    data = (struct.pack(">h", 3) + int32s(0) + int32s(-1) + int32s(0) + int32s(-1)
            + struct.pack(">h", -1))
    assert Subscription.decode(data) == Subscription(())


def test_subscription_newer_version_trailing_fields_ignored():
    data = (struct.pack(">h", 7) + int32s(1) + s16("t") + int32s(-1) + int32s(0) + int32s(5)
            + s16("r") + b"\x01\x02future fields")
    sub = Subscription.decode(data)
    assert (sub.topics, sub.generation_id, sub.rack_id) == (("t",), 5, "r")


def test_subscription_missing_fields_take_defaults():
    # a v1+ field missing altogether takes its default; so does a missing user_data
    data = struct.pack(">h", 2) + int32s(1) + s16("t") + int32s(-1)
    assert Subscription.decode(data) == Subscription(("t",))
    assert Subscription.decode(struct.pack(">h", 0) + int32s(1) + s16("t")) == Subscription(("t",))


@pytest.mark.parametrize("sub", [
    Subscription(()),
    Subscription(("t",), b""),
    Subscription(("a", "b", "ünïcode"), b"\x00\xff" * 100),
    Subscription(["x"], bytearray(b"ud"), [("x", 1), ("x", 2), ("y", 0)]),
    Subscription(("x",), None, (), generation_id=3),
])
def test_subscription_round_trip(sub):
    assert Subscription.decode(sub.encode()) == sub


def test_subscription_normalizes_to_tuples():
    sub = Subscription(["t"], bytearray(b"x"), [["t", 1]])
    assert sub.topics == ("t",) and sub.user_data == b"x" and sub.owned_partitions == (("t", 1),)
    hash(sub)
    with pytest.raises(TypeError, match="not the string 'topic'"):
        Subscription("topic")


def test_assignment_v0_by_hand():
    data = (struct.pack(">h", 0) + int32s(2) + s16("t0") + int32s(2, 0, 1) + s16("t1")
            + int32s(1, 2) + int32s(2) + b"ud")
    assert Assignment.decode(data) == Assignment(tp("t0p0 t0p1 t1p2"), b"ud")
    assert Assignment(tp("t0p0 t0p1 t1p2"), b"ud").encode() == data


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_assignment_other_versions_same_layout(version):
    data = struct.pack(">h", version) + int32s(1) + s16("t") + int32s(1, 5) + int32s(-1)
    assert Assignment.decode(data + b"trailing") == Assignment((("t", 5),))


def test_assignment_empty_bytes_is_empty_assignment():
    assert Assignment.decode(b"") == Assignment(())
    assert Assignment.decode(b"").partitions == ()


def test_assignment_without_user_data_field():
    # some clients stop after the partitions
    data = struct.pack(">h", 0) + int32s(1) + s16("t") + int32s(1, 0)
    assert Assignment.decode(data) == Assignment((("t", 0),))


@pytest.mark.parametrize("assignment", [
    Assignment(()),
    Assignment((), b""),
    Assignment(tp("ap3 ap1 bp0"), b"x" * 300),
])
def test_assignment_round_trip(assignment):
    assert Assignment.decode(assignment.encode()) == assignment


@pytest.mark.parametrize("data, fragment", [
    (b"\x00", "truncated version"),
    (struct.pack(">h", -1), "unsupported version -1"),
    (struct.pack(">h", 0) + int32s(1), "topic"),
    (struct.pack(">h", 0) + int32s(1_000_000), "count 1000000"),
    (struct.pack(">h", 0) + int32s(-1), "null"),
    (struct.pack(">h", 0) + int32s(1) + struct.pack(">h", -1) + int32s(-1), "topic is null"),
    (struct.pack(">h", 0) + int32s(1) + b"\x00\x02\xff\xfe" + int32s(-1), "UTF-8"),
    (struct.pack(">h", 0) + int32s(0) + int32s(10) + b"abc", "truncated user_data"),
    (struct.pack(">h", 1) + int32s(0) + int32s(-1) + int32s(1) + s16("t") + int32s(3, 1),
     "owned_partitions"),
])
def test_subscription_garbage(data, fragment):
    with pytest.raises(ValueError, match="Subscription") as info:
        Subscription.decode(data)
    assert fragment in str(info.value)


def test_empty_subscription_bytes_is_an_error():
    with pytest.raises(ValueError, match="Subscription"):
        Subscription.decode(b"")


@pytest.mark.parametrize("data", [
    b"\x00",
    struct.pack(">h", 0) + int32s(5),
    struct.pack(">h", 0) + int32s(1) + s16("t") + int32s(2, 0),
    b"garbage!",
])
def test_assignment_garbage(data):
    with pytest.raises(ValueError, match="cannot decode consumer protocol Assignment"):
        Assignment.decode(data)


# Cross-check against kafka-python's own ConsumerProtocol classes.

def test_kafka_python_decodes_our_encoding():
    from kafka.protocol.consumer.metadata import (
        ConsumerProtocolAssignment, ConsumerProtocolSubscription)

    theirs = ConsumerProtocolSubscription.decode(Subscription(("t0", "t1"), b"ud").encode())
    assert (theirs.version, list(theirs.topics), theirs.user_data) == (0, ["t0", "t1"], b"ud")

    owned = Subscription(("t0",), None, tp("t0p1 t0p2 t1p0")).encode()
    theirs = ConsumerProtocolSubscription.decode(owned)
    assert theirs.version == 1
    assert [(o.topic, list(o.partitions)) for o in theirs.owned_partitions] == [
        ("t0", [1, 2]), ("t1", [0])]

    theirs = ConsumerProtocolAssignment.decode(Assignment(tp("t0p0 t0p2 t1p1"), b"u").encode())
    assert sorted((t.topic, t.partition) for t in theirs.partitions()) == tp("t0p0 t0p2 t1p1")
    assert theirs.user_data == b"u"


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_we_decode_kafka_python_subscriptions(version):
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as S

    fields = dict(topics=["a", "b"], user_data=b"x")
    if version >= 1:
        fields["owned_partitions"] = [S.TopicPartition(topic="a", partitions=[1, 2])]
    if version >= 2:
        fields["generation_id"] = 9
    if version >= 3:
        fields["rack_id"] = "r1"
    data = S(version=version, **fields).encode()
    ours = Subscription.decode(data)
    assert ours.topics == ("a", "b") and ours.user_data == b"x"
    assert ours.owned_partitions == (tuple(tp("ap1 ap2")) if version >= 1 else ())
    assert ours.generation_id == (9 if version >= 2 else -1)
    assert ours.rack_id == ("r1" if version >= 3 else None)
    assert ours.encode() == data  # we pick the same (lowest sufficient) version


def test_we_decode_kafka_python_assignment_and_builtin_metadata():
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment

    data = ConsumerProtocolAssignment(0, [("t0", [0, 1]), ("t1", [2])], b"").encode()
    assert Assignment.decode(data) == Assignment(tp("t0p0 t0p1 t1p2"), b"")
    # protocol names and JoinGroup metadata match kafka-python's assignors
    for theirs, ours in [(RangePartitionAssignor, RangeAssignor()),
                         (RoundRobinPartitionAssignor, RoundRobinAssignor())]:
        assert theirs.name == ours.name
        assert Subscription.decode(theirs.metadata({"t"}).encode()) == Subscription(("t",), b"")


# ------------------------------------------------------------------------------------------
# load_assignor
# ------------------------------------------------------------------------------------------

class MyAssignor(PartitionAssignor):
    name = "everything-to-first"

    def assign(self, partitions_per_topic, subscriptions):
        result = {m: [] for m in subscriptions}
        for topic, count in partitions_per_topic.items():
            members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
            if members:
                result[members[0]].extend((topic, p) for p in range(count))
        return result


class DuckAssignor:
    name = "duck"

    def assign(self, partitions_per_topic, subscriptions):
        return {m: [] for m in subscriptions}


class NotAnAssignor:
    name = "nope"


class NamelessAssignor(PartitionAssignor):
    def assign(self, partitions_per_topic, subscriptions):
        return {}


class BlankNameAssignor(NamelessAssignor):
    name = "  "


class NeedsArguments(PartitionAssignor):
    name = "args"

    def __init__(self, required):
        self.required = required

    def assign(self, partitions_per_topic, subscriptions):
        return {}


class Abstract(PartitionAssignor):
    name = "abstract"


def not_a_class():
    return MyAssignor()


@pytest.mark.parametrize("spec, cls", [
    ("range", RangeAssignor), ("RANGE", RangeAssignor), (" Range ", RangeAssignor),
    ("roundrobin", RoundRobinAssignor), ("RoundRobin", RoundRobinAssignor),
    ("kafka_source.group.assignors:RangeAssignor", RangeAssignor),
    ("sticky", StickyAssignor), ("Cooperative-Sticky", CooperativeStickyAssignor),
])
def test_load_builtin(spec, cls):
    assignor = load_assignor(spec)
    assert type(assignor) is cls
    assert assignor.name == cls.name


def test_load_custom_class_by_this_modules_name():
    assignor = load_assignor(f"{__name__}:MyAssignor")
    assert type(assignor) is MyAssignor
    assert assignor.name == "everything-to-first"


def test_load_custom_class_as_tests_unit_test_assignors():
    assignor = load_assignor("tests.unit.test_assignors:MyAssignor")
    # pytest may have imported this file under another module name: compare by behaviour
    assert isinstance(assignor, PartitionAssignor)
    assert type(assignor).__qualname__ == "MyAssignor" and assignor.name == "everything-to-first"
    result = assign_group(assignor, {"t": 2}, subs(b="t", a="t"))
    assert result == {"a": Assignment(tp("tp0 tp1")), "b": Assignment(())}


def test_load_duck_typed_class_is_wrapped():
    assignor = load_assignor(f"{__name__}:DuckAssignor")
    assert isinstance(assignor, PartitionAssignor)
    assert assignor.name == "duck"
    assert assignor.subscription_user_data({"t"}) is None
    assignor.on_assignment(Assignment(()))  # no such method on the class: a no-op
    assert assignor.assign({"t": 1}, subs(a="t")) == {"a": []}


@pytest.mark.parametrize("spec, fragment", [
    ("", "empty"),
    ("   ", "empty"),
    ("some.module.Class", "unknown assignor"),
    (":Class", "unknown assignor"),
    ("module:", "unknown assignor"),
    ("no_such_module_for_assignors:X", "cannot import module 'no_such_module_for_assignors'"),
    (f"{__name__}:Missing", "has no class 'Missing'"),
    (f"{__name__}:NotAnAssignor", "not a partition assignor"),
    (f"{__name__}:not_a_class", "is not a class"),
    (f"{__name__}:NamelessAssignor", "non-empty string"),
    (f"{__name__}:BlankNameAssignor", "non-empty string"),
    (f"{__name__}:NeedsArguments", "cannot instantiate NeedsArguments() with no arguments"),
    (f"{__name__}:Abstract", "cannot instantiate Abstract()"),
])
def test_load_errors(spec, fragment):
    with pytest.raises(OptionError) as info:
        load_assignor(spec)
    message = str(info.value)
    assert fragment in message
    assert "assignor" in message and repr(spec) in message
    assert ('"range", "roundrobin", "sticky", "cooperative-sticky", or '
            '"package.module:ClassName"') in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, KafkaSourceError)


def test_load_non_string():
    with pytest.raises(OptionError, match="assignor"):
        load_assignor(None)


# ------------------------------------------------------------------------------------------
# validate_assignment / assign_group
# ------------------------------------------------------------------------------------------

PPT = {"t": 3, "u": 1}
SUBS = subs(a="t", b="t u")


def test_validate_fills_missing_members_and_normalizes():
    result = validate_assignment({"a": (("t", 0), ("t", 1)), "b": [["t", 2], ["u", 0]]},
                                 PPT, SUBS, "mine")
    assert result == {"a": tp("tp0 tp1"), "b": tp("tp2 up0")}
    result = validate_assignment({"b": tp("tp0 tp1 tp2 up0")}, PPT, SUBS, "mine")
    assert result == {"a": [], "b": tp("tp0 tp1 tp2 up0")}


@pytest.mark.parametrize("result, fragment", [
    ({"a": [], "zed": []}, "['zed'] are not in the group"),
    ({"a": tp("tp3")}, "t-3, which does not exist"),
    ({"a": [("t", -1)]}, "does not exist"),
    ({"b": tp("vp0")}, "v-0, which does not exist"),
    ({"a": tp("tp0"), "b": tp("tp0")}, "t-0 is assigned twice (to 'a' and 'b')"),
    ({"a": tp("tp1 tp1")}, "t-1 is assigned twice (to 'a' and 'a')"),
    ({"a": tp("up0")}, "member 'a' got u-0 but is not subscribed to 'u'"),
    ({"a": [("t",)]}, "not a (topic, partition) pair"),
    ({"a": [("t", "0")]}, "not a (str topic, int partition) pair"),
    ({"a": [("t", True)]}, "not a (str topic, int partition) pair"),
    ([("a", [])], "expected a dict"),
])
def test_validate_errors(result, fragment):
    with pytest.raises(KafkaSourceError) as info:
        validate_assignment(result, PPT, SUBS, "mine")
    assert fragment in str(info.value)
    assert "assignor 'mine'" in str(info.value)


def test_validate_warns_about_unassigned_partitions(caplog):
    with caplog.at_level(logging.WARNING, logger="kafka_source.group.assignors"):
        result = validate_assignment({"a": tp("tp0")}, {**PPT, "orphan": 2}, SUBS, "mine")
    assert result == {"a": tp("tp0"), "b": []}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "'mine' left 3 subscribed partition(s) unassigned: t-1, t-2, u-0" in messages[0]
    assert "orphan" not in messages[0]  # nobody subscribed to it


def test_validate_no_warning_when_complete(caplog):
    with caplog.at_level(logging.WARNING, logger="kafka_source.group.assignors"):
        validate_assignment(RangeAssignor().assign(PPT, SUBS), PPT, SUBS, "range")
    assert not caplog.records


def test_assign_group_and_to_assignments():
    assignments = assign_group(RoundRobinAssignor(), {"t0": 3, "t1": 3},
                               subs(C1="t0 t1", C0="t0 t1"))
    assert assignments == {"C0": Assignment(tp("t0p0 t0p2 t1p1")),
                           "C1": Assignment(tp("t0p1 t1p0 t1p2"))}
    assert {m: Assignment.decode(a.encode()) for m, a in assignments.items()} == assignments

    wrapped = to_assignments({"m": tp("bp1 ap2 ap0")}, {"m": b"ud"})
    assert wrapped == {"m": Assignment(tp("ap0 ap2 bp1"), b"ud")}


def test_assign_group_rejects_a_bad_user_assignor():
    class Greedy(PartitionAssignor):
        name = "greedy"

        def assign(self, partitions_per_topic, subscriptions):
            return {m: [("t", 0)] for m in subscriptions}

    with pytest.raises(KafkaSourceError, match="assignor 'greedy'.*assigned twice"):
        assign_group(Greedy(), {"t": 1}, subs(a="t", b="t"))


def test_subscription_user_data_and_on_assignment_defaults():
    assignor = RangeAssignor()
    assert assignor.subscription_user_data({"t"}) is None
    assert assignor.on_assignment(Assignment(())) is None
    assert repr(assignor) == "RangeAssignor(name='range')"
