"""GroupMember (kafka_source.group.member) against an in-process fake group coordinator.

The fake (tests/unit/fake_coordinator.py) keeps Kafka's classic group state machine, so most
scenarios here are driven the way they happen on a broker (another member joins, a member is
dropped, the coordinator moves); scripted errors cover the rest. Every wait is bounded.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import kafka.errors as Errors
import pytest

from kafka_source.group.assignors import (Assignment, PartitionAssignor, RangeAssignor,
                                    RoundRobinAssignor, Subscription)
from kafka_source.wire.net.client import RetriableBrokerError
from kafka_source.errors import (BrokerSecurityError, BrokerUnavailableError,
                                 BrokerUnreachableError, KafkaSourceError, OptionError)
from kafka_source.group import commits, member as member_module
from kafka_source.group.commits import commit_chunks
from kafka_source.group.member import GroupMember
from kafka_source.config.options import GroupOptions

from .fake_coordinator import (COMPLETING_REBALANCE, COORDINATOR_LOAD_IN_PROGRESS,
                               COORDINATOR_NOT_AVAILABLE, EMPTY, FENCED_INSTANCE_ID,
                               FIND_COORDINATOR,
                               GROUP_AUTHORIZATION_FAILED, HEARTBEAT, ILLEGAL_GENERATION,
                               INCONSISTENT_GROUP_PROTOCOL, JOIN, LEAVE, METADATA, NONE,
                               NOT_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH,
                               PREPARING_REBALANCE, REBALANCE_IN_PROGRESS, STABLE, SYNC,
                               UNKNOWN_MEMBER_ID, UNKNOWN_TOPIC_OR_PARTITION, Background,
                               FakeCoordinator, RawMember, _commit_batch_bytes)

pytestmark = pytest.mark.pyspark_free

GROUP = "test-group"
TOPICS = {"t0": 3, "t1": 3, "t2": 2}


def opts(**changes) -> GroupOptions:
    base = GroupOptions(group_id=GROUP, group_id_given=True, assignor="range",
                        commit_offsets=True, session_timeout_ms=10_000, heartbeat_interval_ms=20,
                        rebalance_timeout_ms=2_000, auto_offset_reset="latest")
    return dataclasses.replace(base, **changes)


def wait_until(condition, timeout: float = 3.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)


def tps(spec: str) -> tuple:
    """tps("t0p0 t1p2") -> (("t0", 0), ("t1", 2))"""
    out = []
    for item in spec.split():
        topic, partition = item.rsplit("p", 1)
        out.append((topic, int(partition)))
    return tuple(out)


def _counter():
    n = iter(range(1, 1_000_000))
    return lambda client_id: f"{client_id}-{next(n)}"


@pytest.fixture
def fake():
    coordinator = FakeCoordinator(TOPICS, member_id_factory=_counter())
    yield coordinator
    coordinator.shutdown()


@pytest.fixture
def make_member(request):
    """make_member(fake, client_id, ...) -> a GroupMember on its own fake connection; its
    heartbeat thread is stopped (and joined) after the test."""
    made: list[GroupMember] = []

    def make(fake, client_id="C0", *, assignor: PartitionAssignor | None = None, manual=(),
             request_timeout_ms=2_000, **option_changes) -> GroupMember:
        member = GroupMember(fake.client(client_id),
                             lambda: fake.client(f"{client_id}-heartbeat"),
                             opts(**option_changes), assignor or RangeAssignor(),
                             manual_assignment=manual, request_timeout_ms=request_timeout_ms,
                             retry_backoff_ms=1)
        made.append(member)
        return member

    yield make
    for member in made:
        thread = member._heartbeat
        member._stop_heartbeat()
        if thread is not None:
            thread.join(2)


def heartbeats(fake, member: GroupMember) -> int:
    return fake.count(HEARTBEAT, member_id=member.generation.member_id)


def heartbeat_alive(member: GroupMember) -> bool:
    return member._heartbeat is not None and member._heartbeat.is_alive()


def wait_rebalance_noticed(member: GroupMember) -> None:
    wait_until(lambda: member.rejoin_reason() is not None, what="the heartbeat to notice")


def form_group(fake, make_member, topics=("t0",), **option_changes):
    """Two GroupMembers, C0 (leader) and C1 (follower), both stable in generation 2."""
    x = make_member(fake, "C0", **option_changes)
    y = make_member(fake, "C1", **option_changes)
    x.ensure_active(topics)
    joining = Background(y.ensure_active, topics, name="C1-join")
    assert fake.wait_for(lambda: any(m.startswith("C1") for m in fake.awaiting_join(GROUP)))
    wait_rebalance_noticed(x)
    x.ensure_active(topics)
    joining.result(5)
    assert x.generation.generation_id == y.generation.generation_id == 2
    return x, y


# ------------------------------------------------------------------------------------------
# Joining
# ------------------------------------------------------------------------------------------

def test_single_member_gets_every_partition_of_its_topics(fake, make_member):
    member = make_member(fake, "C0")
    assigned = member.ensure_active(["t1", "t0"], {"t0": 3, "t1": 3})

    assert assigned == tps("t0p0 t0p1 t0p2 t1p0 t1p1 t1p2")
    join, = fake.sent(JOIN)
    assert join.group_id == GROUP
    assert join.protocol_type == "consumer"
    assert join.member_id == ""
    assert join.session_timeout_ms == 10_000 and join.rebalance_timeout_ms == 2_000
    (protocol,) = join.protocols
    assert protocol.name == "range"
    assert Subscription.decode(bytes(protocol.metadata)).topics == ("t0", "t1")

    generation = member.generation
    group = fake.group(GROUP)
    assert generation.generation_id == group.generation == 1
    assert generation.member_id == group.leader and generation.protocol == "range"
    assert member.stable and member.rejoin_reason() is None
    assert member.assignment == assigned
    sync, = fake.sent(SYNC)
    assert (sync.generation_id, sync.member_id) == (1, generation.member_id)
    assert sync.protocol_type == "consumer" and sync.protocol_name == "range"
    assert [a.member_id for a in sync.assignments] == [generation.member_id]
    assert group.state == STABLE
    assert group.assignment_of(generation.member_id).partitions == assigned
    # the leader looked up the partition counts itself
    assert ("C0", ("t0", "t1")) in fake.metadata_calls


def test_member_id_required_rejoins_with_the_assigned_id(make_member):
    fake = FakeCoordinator(TOPICS, require_member_id=True, member_id_factory=_counter())
    try:
        member = make_member(fake, "C0")
        assert member.ensure_active(["t2"]) == tps("t2p0 t2p1")
        first, second = fake.sent(JOIN)
        assert first.member_id == ""
        assert second.member_id == "C0-1" == member.generation.member_id
        assert fake.members(GROUP) == ["C0-1"] and not fake.group(GROUP).pending
    finally:
        fake.shutdown()


def test_roundrobin_member_offers_roundrobin(fake, make_member):
    member = make_member(fake, "C0", assignor=RoundRobinAssignor())
    assert member.ensure_active(["t2"]) == tps("t2p0 t2p1")
    assert [p.name for p in fake.sent(JOIN)[0].protocols] == ["roundrobin"]
    assert member.generation.protocol == "roundrobin"


@pytest.mark.parametrize("assignor, partition_counts, subscriptions, expected", [
    # Kafka's RangeAssignor example (C0, C1 on t0 and t1 with 3 partitions each), plus a
    # topic only the foreign member subscribes to
    pytest.param(RangeAssignor, {"t0": 3, "t1": 3, "t2": 2},
                 {"C0": "t0 t1", "C1": "t0 t1", "C2": "t2"},
                 {"C0": "t0p0 t0p1 t1p0 t1p1", "C1": "t0p2 t1p2", "C2": "t2p0 t2p1"},
                 id="range"),
    # Kafka's RoundRobinAssignor example with unequal subscriptions
    pytest.param(RoundRobinAssignor, {"t0": 1, "t1": 2, "t2": 3},
                 {"C0": "t0", "C1": "t0 t1", "C2": "t0 t1 t2"},
                 {"C0": "t0p0", "C1": "t1p0", "C2": "t1p1 t2p0 t2p1 t2p2"},
                 id="roundrobin"),
])
def test_leader_assigns_for_every_member_including_a_foreign_one(
        make_member, assignor, partition_counts, subscriptions, expected):
    fake = FakeCoordinator(partition_counts, member_id_factory=lambda client_id: client_id)
    try:
        topics = {m: s.split() for m, s in subscriptions.items()}
        x = make_member(fake, "C0", assignor=assignor())
        y = make_member(fake, "C1", assignor=assignor())
        foreign = RawMember(fake, GROUP, [(assignor.name, Subscription(topics["C2"]).encode())],
                            client_id="C2")

        x.ensure_active(topics["C0"])   # generation 1: C0 alone, so C0 leads
        y_joining = Background(y.ensure_active, topics["C1"], name="C1-join")
        assert fake.wait_for(lambda: "C1" in fake.awaiting_join(GROUP))
        foreign_joining = Background(foreign.join, name="C2-join")
        assert fake.wait_for(lambda: "C2" in fake.awaiting_join(GROUP))
        wait_rebalance_noticed(x)
        x_assigned = x.ensure_active(topics["C0"])

        joined = foreign_joining.result(5)
        assert (joined.error_code, joined.generation_id, joined.leader) == (NONE, 2, "C0")
        assert joined.protocol_name == assignor.name and joined.members == []
        synced = foreign.sync()
        assert synced.error_code == NONE
        y_assigned = y_joining.result(5)

        assert x_assigned == tps(expected["C0"])
        assert y_assigned == tps(expected["C1"])
        assert Assignment.decode(bytes(synced.assignment)).partitions == tps(expected["C2"])
        # the leader fetched metadata for every topic of the group, t2 included
        assert ("C0", ("t0", "t1", "t2")) in fake.metadata_calls
        # the follower neither fetched metadata nor sent assignments
        assert not [c for c in fake.metadata_calls if c[0] == "C1"]
        assert all(s.assignments == [] for s in fake.sent(SYNC, client_id="C1"))
        leader_sync = fake.sent(SYNC, client_id="C0")[-1]
        assert sorted(a.member_id for a in leader_sync.assignments) == ["C0", "C1", "C2"]
        assert fake.group(GROUP).generation == 2 and fake.state(GROUP) == STABLE
        # C0 rejoined under its member id
        assert fake.sent(JOIN, client_id="C0")[-1].member_id == "C0"
    finally:
        fake.shutdown()


def test_group_whose_members_use_another_assignor_fails_naming_the_option(fake, make_member):
    foreign = RawMember(fake, GROUP, [("roundrobin", Subscription(["t0"]).encode())])
    foreign.join()
    foreign.sync({foreign.member_id: Assignment(tps("t0p0 t0p1 t0p2")).encode()})
    member = make_member(fake, "C0")   # offers only "range"

    with pytest.raises(KafkaSourceError) as info:
        member.ensure_active(["t0"])
    message = str(info.value)
    assert "'assignor'" in message and GROUP in message and "range" in message
    assert len(fake.sent(JOIN, client_id="C0")) == 1   # not retried
    assert fake.members(GROUP) == [foreign.member_id]


# ------------------------------------------------------------------------------------------
# JoinGroup / SyncGroup errors
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [JOIN, SYNC])
@pytest.mark.parametrize("error, member_id_kept, rediscovers", [
    pytest.param(UNKNOWN_MEMBER_ID, False, False, id="unknown-member"),
    pytest.param(ILLEGAL_GENERATION, True, False, id="illegal-generation"),
    pytest.param(REBALANCE_IN_PROGRESS, True, False, id="rebalance-in-progress"),
    pytest.param(NOT_COORDINATOR, True, True, id="not-coordinator"),
    pytest.param(COORDINATOR_NOT_AVAILABLE, True, True, id="coordinator-not-available"),
    pytest.param(COORDINATOR_LOAD_IN_PROGRESS, True, False, id="coordinator-loading"),
])
def test_retriable_join_and_sync_errors_are_retried(fake, make_member, kind, error,
                                                    member_id_kept, rediscovers):
    # a short rebalance timeout: a member id given up leaves the group quickly
    member = make_member(fake, "C0", rebalance_timeout_ms=200)
    member.ensure_active(["t0"])
    member_id = member.generation.member_id
    finds = len(fake.find_coordinator_calls)
    fake.script(kind, error)

    assert member.ensure_active(["t0", "t1"]) == tps("t0p0 t0p1 t0p2 t1p0 t1p1 t1p2")

    joins = fake.sent(JOIN, client_id="C0")
    assert len(joins) == 3
    assert joins[1].member_id == member_id
    assert (joins[2].member_id == member_id) is member_id_kept
    if not member_id_kept:
        assert joins[2].member_id == ""
    planning_finds = [c for c in fake.find_coordinator_calls[finds:] if c[0] == "C0"]
    assert bool(planning_finds) is rediscovers
    assert member.stable and member.rejoin_reason() is None
    assert fake.members(GROUP) == [member.generation.member_id]


def test_network_failure_during_join_is_retried_after_rediscovery(fake, make_member):
    member = make_member(fake, "C0")
    fake.script(JOIN, RetriableBrokerError("connection reset"))
    fake.script(FIND_COORDINATOR, RetriableBrokerError("no broker"))
    assert member.ensure_active(["t2"]) == tps("t2p0 t2p1")
    assert len(fake.sent(JOIN)) == 2
    assert [c for c in fake.find_coordinator_calls if c[0] == "C0"] == [("C0", GROUP)] * 3


def test_inconsistent_group_protocol_is_fatal(fake, make_member):
    member = make_member(fake, "C0")
    fake.script(JOIN, INCONSISTENT_GROUP_PROTOCOL)
    with pytest.raises(KafkaSourceError) as info:
        member.ensure_active(["t0"])
    assert "'assignor'" in str(info.value) and GROUP in str(info.value)
    assert len(fake.sent(JOIN)) == 1


def test_session_timeout_the_broker_refuses_names_the_option(fake, make_member):
    member = make_member(fake, "C0", session_timeout_ms=1_000)   # broker minimum: 6000
    with pytest.raises(OptionError, match="kafka.session.timeout.ms"):
        member.ensure_active(["t0"])
    assert len(fake.sent(JOIN)) == 1


@pytest.mark.parametrize("where", [JOIN, SYNC, FIND_COORDINATOR])
def test_group_authorization_failure_names_the_group(fake, make_member, where):
    member = make_member(fake, "C0")
    fake.script(where, Errors.GroupAuthorizationFailedError if where == FIND_COORDINATOR
                else GROUP_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaSourceError, match=GROUP) as info:
        member.ensure_active(["t0"])
    assert "authorized" in str(info.value)


def test_unexpected_join_error_fails_with_its_name(fake, make_member):
    member = make_member(fake, "C0")
    fake.script(JOIN, Errors.GroupMaxSizeReachedError)
    with pytest.raises(KafkaSourceError, match="GroupMaxSizeReachedError"):
        member.ensure_active(["t0"])


@pytest.mark.parametrize("delay_ms", [0, 400], ids=["no-delay", "initial-delay"])
def test_a_first_join_held_by_the_initial_delay_says_why_in_the_log(make_member, caplog,
                                                                    monkeypatch, delay_ms):
    # Brokers hold the first member of an empty group for group.initial.rebalance.delay.ms
    # (3 s by default; 0 on the test brokers): a query's start then takes seconds, and its log
    # says why and what avoids it.
    monkeypatch.setattr(member_module, "_SLOW_FIRST_JOIN_S", 0.3)
    fake = FakeCoordinator(TOPICS, member_id_factory=_counter(),
                           initial_rebalance_delay_ms=delay_ms)
    try:
        first = make_member(fake, "C0")
        with caplog.at_level(logging.INFO, logger=member_module.__name__):
            started = time.monotonic()
            first.ensure_active(["t0"])
            took = time.monotonic() - started
            explained = [r.getMessage() for r in caplog.records
                         if "group.initial.rebalance.delay.ms" in r.getMessage()]
    finally:
        fake.shutdown()
    if delay_ms:
        assert took >= 0.4 and len(explained) == 1, (took, explained)
        assert f"'{GROUP}'" in explained[0] and "kafka.group.protocol=consumer" in explained[0]
        assert "kafka.group.instance.id" in explained[0]
    else:
        assert took < 0.3 and explained == [], (took, explained)


@pytest.mark.parametrize("failure", ["coordinator unavailable", "loading forever",
                                     "coordinator unreachable", "unreachable, then answering"])
def test_join_that_cannot_succeed_gives_up_within_its_budget(fake, make_member, failure):
    member = make_member(fake, "C0", session_timeout_ms=60, rebalance_timeout_ms=60,
                         request_timeout_ms=60)   # budget: 180 ms
    unreachable = [BrokerUnreachableError("broker 1: no connection after 3 ms (refused)")]
    if failure == "coordinator unavailable":
        fake.available = False
    elif failure == "loading forever":
        fake.script(JOIN, *[COORDINATOR_LOAD_IN_PROGRESS] * 10_000)
    elif failure == "coordinator unreachable":
        fake.script(JOIN, *unreachable * 10_000)
    else:                        # only the last attempt's error says what the cluster is like
        fake.script(JOIN, *unreachable * 3, *[COORDINATOR_LOAD_IN_PROGRESS] * 10_000)
    start = time.monotonic()
    with pytest.raises(KafkaSourceError, match=f"Could not join consumer group '{GROUP}'") \
            as info:
        member.ensure_active(["t0"])
    assert time.monotonic() - start < 2.0
    assert not member.stable
    # Only a coordinator that cannot be reached makes it a BrokerUnavailableError, on which the
    # stream reader leaves without retrying its commit (test_stream_planning.py).
    gone = failure == "coordinator unreachable"
    assert isinstance(info.value, BrokerUnavailableError) is gone, info.value
    assert ("no connection" in str(info.value)) is gone


def test_member_dropped_for_not_rejoining_in_time_rejoins_with_a_new_id(fake, make_member):
    # C0 does not rejoin within its rebalance timeout (a long micro-batch): the coordinator
    # drops it; its heartbeats then get UNKNOWN_MEMBER_ID and it joins again as a new member
    a = make_member(fake, "C0", rebalance_timeout_ms=150)
    a.ensure_active(["t0"])
    old_id = a.generation.member_id
    b = RawMember(fake, GROUP, [("range", Subscription(["t0"]).encode())],
                  rebalance_timeout_ms=150)
    response = b.join()
    assert response.error_code == NONE and response.leader == b.member_id
    assert fake.members(GROUP) == [b.member_id]
    b.sync({b.member_id: Assignment(tps("t0p0 t0p1 t0p2")).encode()})
    wait_until(lambda: a.generation.member_id == "", what="UNKNOWN_MEMBER_ID from heartbeat")
    assert a.rejoin_reason() is not None

    joining = Background(a.ensure_active, ["t0"])
    assert fake.wait_for(lambda: fake.state(GROUP) == PREPARING_REBALANCE)
    b.join()    # b rejoins, as its heartbeat would tell it to
    assert b.join_response.error_code == NONE
    assert b.join_response.leader == b.member_id   # b led the previous generation
    members = {m.member_id: Subscription.decode(bytes(m.metadata)) for m in b.join_response.members}
    result = RangeAssignor().assign({"t0": 3}, members)
    b.sync({m: Assignment(ps).encode() for m, ps in result.items()})
    assigned = joining.result(5)
    assert a.generation.member_id not in ("", old_id)
    assert assigned == tuple(result[a.generation.member_id])


# ------------------------------------------------------------------------------------------
# The heartbeat thread
# ------------------------------------------------------------------------------------------

def test_heartbeats_flow_while_stable_on_their_own_connection(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    start = time.monotonic()
    wait_until(lambda: heartbeats(fake, member) >= 5, what="5 heartbeats")
    elapsed = time.monotonic() - start
    records = fake.records(HEARTBEAT)
    assert all(r.client_id == "C0-heartbeat" for r in records)
    assert all((r.request.generation_id, r.request.member_id)
               == (1, member.generation.member_id) for r in records)
    assert all(r.thread.startswith("pykafka-heartbeat") for r in records)
    assert elapsed >= 4 * 0.020 * 0.9   # one per heartbeat interval, not a busy loop
    assert member.rejoin_reason() is None and member.stable
    time.sleep(0.1)
    assert heartbeats(fake, member) <= (time.monotonic() - start) / 0.020 + 3


def test_heartbeats_keep_the_session_alive(make_member):
    fake = FakeCoordinator(TOPICS, min_session_timeout_ms=10, auto_expire=True)
    try:
        member = make_member(fake, "C0", session_timeout_ms=150)
        member.ensure_active(["t0"])
        time.sleep(0.45)   # three session timeouts
        assert fake.expire_sessions() == []
        assert fake.members(GROUP) == [member.generation.member_id]
        assert member.stable and member.rejoin_reason() is None
    finally:
        fake.shutdown()


def test_heartbeat_connection_failing_tls_or_sasl_fails_the_query(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    fake.script(HEARTBEAT, BrokerSecurityError("SASL: the broker rejected PLAIN authentication"))
    wait_until(lambda: not heartbeat_alive(member), what="the heartbeat thread to stop")
    with pytest.raises(BrokerSecurityError, match="rejected PLAIN authentication"):
        member.ensure_active(["t0"])


def test_heartbeat_sees_rebalance_requests_rejoin_and_keeps_beating(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    other = RawMember(fake, GROUP, [("range", Subscription(["t0"]).encode())])
    joining = Background(other.join)
    wait_rebalance_noticed(member)
    assert fake.state(GROUP) == PREPARING_REBALANCE
    seen = heartbeats(fake, member)
    # the heartbeat goes on (keeping the session) until the planning thread rejoins
    wait_until(lambda: heartbeats(fake, member) >= seen + 3, what="more heartbeats")
    assert member.generation.generation_id == 1 and member.stable
    assert not joining.done()

    assert member.ensure_active(["t0"]) == tps("t0p0 t0p1")
    assert joining.result(5).generation_id == 2
    assert other.sync().error_code == NONE
    assert member.generation.generation_id == 2 and member.rejoin_reason() is None
    wait_until(lambda: fake.count(HEARTBEAT, generation_id=2) >= 2, what="heartbeats of gen 2")


def test_heartbeat_illegal_generation_resets_generation_but_keeps_member_id(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    member_id = member.generation.member_id
    fake.script(HEARTBEAT, ILLEGAL_GENERATION)
    wait_until(lambda: member.generation.generation_id == -1, what="the generation reset")
    assert member.generation.member_id == member_id
    assert not member.stable and member.rejoin_reason() is not None
    # no heartbeats without a generation
    count = len(fake.sent(HEARTBEAT))
    time.sleep(0.1)
    assert len(fake.sent(HEARTBEAT)) <= count + 1

    assert member.ensure_active(["t0"]) == tps("t0p0 t0p1 t0p2")
    assert fake.sent(JOIN)[-1].member_id == member_id
    assert member.generation.generation_id == 2
    wait_until(lambda: fake.count(HEARTBEAT, generation_id=2) >= 1, what="heartbeats resume")


def test_heartbeat_unknown_member_id_resets_member_id(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    old_id = member.generation.member_id
    fake.remove_member(GROUP, old_id)   # e.g. its session expired while the driver stalled
    wait_until(lambda: member.generation.member_id == "", what="the member id reset")
    assert member.generation.generation_id == -1
    assert not member.stable and member.rejoin_reason() is not None

    assert member.ensure_active(["t0"]) == tps("t0p0 t0p1 t0p2")
    assert fake.sent(JOIN)[-1].member_id == ""
    assert member.generation.member_id not in ("", old_id)
    assert fake.members(GROUP) == [member.generation.member_id]


def test_heartbeat_follows_the_coordinator_when_it_moves(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    wait_until(lambda: heartbeats(fake, member) >= 1)
    fake.move_coordinator(2)
    wait_until(lambda: any(r.node == "coordinator-2" for r in fake.records(HEARTBEAT)),
               what="heartbeats to the new coordinator")
    hb_finds = [c for c in fake.find_coordinator_calls if c[0] == "C0-heartbeat"]
    assert len(hb_finds) == 2
    assert member.stable and member.rejoin_reason() is None
    assert member.generation.generation_id == 1
    count = heartbeats(fake, member)
    wait_until(lambda: heartbeats(fake, member) >= count + 2)


@pytest.mark.parametrize("error", [NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE],
                         ids=["not-coordinator", "coordinator-not-available"])
def test_heartbeat_rediscovers_the_coordinator(fake, make_member, error):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    wait_until(lambda: heartbeats(fake, member) >= 1)
    fake.script(HEARTBEAT, error)
    wait_until(lambda: len([c for c in fake.find_coordinator_calls
                            if c[0] == "C0-heartbeat"]) == 2, what="rediscovery")
    count = heartbeats(fake, member)
    wait_until(lambda: heartbeats(fake, member) >= count + 2, what="heartbeats to continue")
    assert member.stable and member.rejoin_reason() is None


def test_heartbeat_thread_survives_network_errors(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    wait_until(lambda: heartbeats(fake, member) >= 1)
    fake.script(HEARTBEAT, RetriableBrokerError("connection reset"),
                RetriableBrokerError("timed out"), RuntimeError("unexpected"))
    fake.script(FIND_COORDINATOR, RetriableBrokerError("no broker answers"))
    wait_until(lambda: fake.pending_scripts() == 0, what="the scripted failures")
    count = heartbeats(fake, member)
    wait_until(lambda: heartbeats(fake, member) >= count + 3, what="heartbeats to continue")
    assert heartbeat_alive(member)
    assert member.stable and member.rejoin_reason() is None


def test_fatal_heartbeat_error_fails_the_next_ensure_active(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    fake.script(HEARTBEAT, GROUP_AUTHORIZATION_FAILED)
    wait_until(lambda: fake.pending_scripts() == 0)
    wait_until(lambda: member._fatal is not None)
    with pytest.raises(KafkaSourceError, match=GROUP):
        member.ensure_active(["t0"])


# ------------------------------------------------------------------------------------------
# ensure_active: when to rejoin
# ------------------------------------------------------------------------------------------

def test_no_rejoin_while_nothing_changes(fake, make_member):
    member = make_member(fake, "C0")
    first = member.ensure_active(["t0"], {"t0": 3})
    for _ in range(3):
        assert member.ensure_active(["t0"], {"t0": 3}) == first
    assert len(fake.sent(JOIN)) == 1


def test_rejoin_when_the_topic_set_changes(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    assert member.ensure_active(["t0", "t2"]) == tps("t0p0 t0p1 t0p2 t2p0 t2p1")
    joins = fake.sent(JOIN)
    assert len(joins) == 2
    assert Subscription.decode(bytes(joins[1].protocols[0].metadata)).topics == ("t0", "t2")
    assert member.ensure_active(["t2"]) == tps("t2p0 t2p1")
    assert len(fake.sent(JOIN)) == 3


def test_leader_rejoins_when_a_partition_count_changes(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"], {"t0": 3})
    fake.topics["t0"] = 5
    assert member.ensure_active(["t0"], {"t0": 5}) == tps("t0p0 t0p1 t0p2 t0p3 t0p4")
    assert len(fake.sent(JOIN)) == 2
    member.ensure_active(["t0"], {"t0": 5})
    assert len(fake.sent(JOIN)) == 2


def test_leader_does_not_assign_without_a_topic_a_just_started_broker_does_not_know(
        fake, make_member):
    # A ZooKeeper-mode broker just after a restart calls every topic unknown (issue 17): the
    # leader must not take that for the truth and assign the group nothing of the topic.
    member = make_member(fake, "C0")
    assert member.ensure_active(["t0"], {"t0": 3}) == tps("t0p0 t0p1 t0p2")
    fake.script(METADATA, Errors.UnknownTopicOrPartitionError)
    member.request_rejoin("test")
    assert member.ensure_active(["t0"], {"t0": 3}) == tps("t0p0 t0p1 t0p2")


def test_leader_rejoins_when_a_topic_missing_at_assignment_appears(fake, make_member):
    # the leader's metadata did not show t0 when it assigned (e.g. leader not yet elected),
    # so nobody got t0; once the metadata shows it, the leader must rebalance
    member = make_member(fake, "C0")
    fake.script(METADATA, Errors.LeaderNotAvailableError)
    assert member.ensure_active(["t0"], {"t0": 3}) == ()
    assert member.ensure_active(["t0"], {"t0": 3}) == tps("t0p0 t0p1 t0p2")
    assert len(fake.sent(JOIN)) == 2


def test_follower_does_not_rejoin_for_partition_counts(fake, make_member):
    x, y = form_group(fake, make_member, ("t0",))
    joins = len(fake.sent(JOIN))
    fake.topics["t0"] = 6
    assert y.ensure_active(["t0"], {"t0": 6}) == tps("t0p2")
    assert len(fake.sent(JOIN)) == joins
    # the leader notices and rebalances; the follower follows via its heartbeat
    leader_joining = Background(x.ensure_active, ["t0"], {"t0": 6})
    wait_rebalance_noticed(y)
    assert y.ensure_active(["t0"], {"t0": 6}) == tps("t0p3 t0p4 t0p5")
    assert leader_joining.result(5) == tps("t0p0 t0p1 t0p2")


# ------------------------------------------------------------------------------------------
# commit()
# ------------------------------------------------------------------------------------------

def test_commit_in_the_current_generation(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0", "t1"])
    assert member.commit({("t0", 0): 10, ("t1", 2): 7, ("t0", 1): 0})
    assert fake.group(GROUP).offsets == {("t0", 0): 10, ("t0", 1): 0, ("t1", 2): 7}
    request, = fake.sent(OFFSET_COMMIT)
    assert request.generation_id_or_member_epoch == 1
    assert request.member_id == member.generation.member_id
    assert member.commit({}) is True
    assert len(fake.sent(OFFSET_COMMIT)) == 1


def test_commits_carry_leader_epochs_and_the_offsets_come_back_with_them(fake, make_member):
    """KIP-320: each committed offset goes with the leader epoch the caller gives (OffsetCommit
    v6+) and :meth:`committed_positions` returns it (OffsetFetch v5+); without one, -1."""
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    assert member.commit({("t0", 0): 10, ("t0", 1): 4}, {("t0", 0): 3})
    request, = fake.sent(OFFSET_COMMIT)
    assert request.version >= 6
    assert {(t.name, p.partition_index): p.committed_leader_epoch
            for t in request.topics for p in t.partitions} == {("t0", 0): 3, ("t0", 1): -1}
    assert member.committed_positions([("t0", 0), ("t0", 1), ("t0", 2)]) == {
        ("t0", 0): (10, 3), ("t0", 1): (4, -1), ("t0", 2): None}
    assert member.committed([("t0", 0), ("t0", 2)]) == {("t0", 0): 10, ("t0", 2): None}
    # An asynchronous commit keeps its epochs, also when it is made again (before a rejoin,
    # on leaving) after its first attempt failed.
    member.commit_async({("t0", 0): 12}, epochs={("t0", 0): 5})
    member.settle_commits()
    assert member.committed_positions([("t0", 0)]) == {("t0", 0): (12, 5)}
    fake.commit_error = COORDINATOR_NOT_AVAILABLE
    member.commit_async({("t0", 0): 14}, epochs={("t0", 0): 6})
    time.sleep(0.1)
    fake.commit_error = None
    member.settle_commits(retry_ms=5_000)
    assert member.committed_positions([("t0", 0)]) == {("t0", 0): (14, 6)}
    assert len(fake.sent(OFFSET_COMMIT)) == 4


def test_commit_before_joining_sends_nothing(fake, make_member):
    member = make_member(fake, "C0")
    assert member.commit({("t0", 0): 1}) is False
    assert fake.sent(OFFSET_COMMIT) == []


def test_commit_with_a_stale_generation_is_refused_and_rejoins(fake, make_member):
    # no heartbeats here: the commit itself must find out about the new generation
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    member_id = member.generation.member_id
    other = RawMember(fake, GROUP, [("range", Subscription(["t0"]).encode())])
    other_joining = Background(other.join)
    assert fake.wait_for(lambda: fake.state(GROUP) == PREPARING_REBALANCE)
    # C0's own JoinGroup reaches the coordinator, but its answer is lost
    ghost = RawMember(fake, GROUP, [(p.name, bytes(p.metadata))
                                    for p in fake.sent(JOIN)[-1].protocols])
    ghost.member_id = member_id
    assert ghost.join().generation_id == 2
    assert other_joining.result(5).generation_id == 2

    assert member.commit({("t0", 0): 5}) is False
    assert fake.sent(OFFSET_COMMIT)[-1].generation_id_or_member_epoch == 1
    assert fake.group(GROUP).offsets == {}
    assert member.generation.generation_id == -1
    assert member.generation.member_id == member_id
    assert member.rejoin_reason() is not None

    assert member.ensure_active(["t0"]) == tps("t0p0 t0p1")   # C0 sorts before raw-*
    assert member.generation.generation_id == 2
    assert other.sync().error_code == NONE


def test_commit_during_completing_rebalance_is_refused_and_requests_rejoin(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    generation = member.generation
    fake.script(OFFSET_COMMIT, REBALANCE_IN_PROGRESS)
    assert member.commit({("t0", 0): 5}) is False
    assert member.rejoin_reason() is not None
    assert member.generation == generation   # nothing is reset: only a rejoin is due
    assert fake.group(GROUP).offsets == {}
    member.ensure_active(["t0"])
    assert len(fake.sent(JOIN)) == 2 and member.rejoin_reason() is None


def test_commit_unknown_member_resets_member_id(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, UNKNOWN_MEMBER_ID)
    assert member.commit({("t0", 0): 5}) is False
    assert member.generation.member_id == "" and member.rejoin_reason() is not None


def test_commit_follows_a_moved_coordinator(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    fake.move_coordinator(7)
    assert member.commit({("t0", 1): 3}) is True
    first, second = fake.records(OFFSET_COMMIT)
    assert (first.node, second.node) == ("coordinator-1", "coordinator-7")
    assert [c for c in fake.find_coordinator_calls if c[0] == "C0"] == [("C0", GROUP)] * 2
    assert fake.group(GROUP).offsets == {("t0", 1): 3}


@pytest.mark.parametrize("failure", [NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
                                     COORDINATOR_LOAD_IN_PROGRESS,
                                     RetriableBrokerError("connection reset")],
                         ids=["not-coordinator", "not-available", "loading", "network"])
def test_commit_retries_retriable_failures(fake, make_member, failure):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, failure)
    assert member.commit({("t0", 2): 9}) is True
    assert len(fake.sent(OFFSET_COMMIT)) == 2
    assert fake.group(GROUP).offsets == {("t0", 2): 9}
    assert member.rejoin_reason() is None


def test_commit_gives_up_after_the_api_timeout(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000, request_timeout_ms=100,
                         api_timeout_ms=300)
    member.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, *[COORDINATOR_LOAD_IN_PROGRESS] * 10_000)
    start = time.monotonic()
    with pytest.raises(KafkaSourceError, match="within 300 ms.*kafka.default.api.timeout.ms"):
        member.commit({("t0", 0): 1})
    assert time.monotonic() - start < 2.0


def test_a_commit_or_fetch_whose_request_timed_out_is_retried(fake, make_member):
    # A response that never comes costs a whole request timeout; that alone must not fail the
    # query (it used to: the retry budget was the request timeout itself).
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000, request_timeout_ms=100,
                         api_timeout_ms=5_000)
    member.ensure_active(["t0"])
    send = member._client.send
    timed_out = []

    def first_times_out(node, request, timeout_ms=None):
        if type(request).__name__ in ("OffsetCommitRequest", "OffsetFetchRequest") and \
                type(request).__name__ not in timed_out:
            timed_out.append(type(request).__name__)
            time.sleep(member.request_timeout_ms / 1000)
            raise RetriableBrokerError("request timed out after 100 ms")
        return send(node, request, timeout_ms)

    member._client.send = first_times_out
    assert member.commit({("t0", 0): 7}) is True
    assert member.committed([("t0", 0)]) == {("t0", 0): 7}
    assert timed_out == ["OffsetCommitRequest", "OffsetFetchRequest"]


def test_manual_assignment_commits_outside_any_generation_and_never_joins(fake, make_member):
    manual = [("t1", 1), ("t0", 2)]
    member = make_member(fake, "C0", manual=manual)
    assert member.ensure_active(["t0", "t1"], {"t0": 3, "t1": 3}) == (("t0", 2), ("t1", 1))
    assert member.assignment == (("t0", 2), ("t1", 1))
    assert member.rejoin_reason() is None
    assert member.commit({("t0", 2): 11, ("t1", 1): 4}) is True
    request, = fake.sent(OFFSET_COMMIT)
    assert request.generation_id_or_member_epoch == -1 and request.member_id == ""
    assert fake.group(GROUP).offsets == {("t0", 2): 11, ("t1", 1): 4}
    assert member.committed(manual) == {("t0", 2): 11, ("t1", 1): 4}
    member.leave()
    assert [r.kind for r in fake.records()] == [OFFSET_COMMIT, OFFSET_FETCH]
    assert member._heartbeat is None


def test_manual_assignment_commit_refused_while_the_group_has_members(fake, make_member):
    active = RawMember(fake, GROUP, [("range", Subscription(["t0"]).encode())])
    active.join()
    member = make_member(fake, "C0", manual=[("t0", 0)])
    assert member.commit({("t0", 0): 1}) is False   # Kafka: UNKNOWN_MEMBER_ID
    assert fake.group(GROUP).offsets == {}
    assert member.rejoin_reason() is None


# ------------------------------------------------------------------------------------------
# commit_async() / settle_commits()
# ------------------------------------------------------------------------------------------

def test_commit_async_sends_at_once_and_applies_the_answer_when_settled(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    outcomes = []
    member.commit_async({("t0", 0): 5, ("t0", 1): 2}, outcomes.append)
    # The coordinator has it (the request left at once); the answer is not awaited.
    assert fake.group(GROUP).offsets == {("t0", 0): 5, ("t0", 1): 2}
    assert outcomes == []
    member.settle_commits()
    assert outcomes == [True]
    member.settle_commits()                      # nothing pending: nothing happens
    assert outcomes == [True] and len(fake.sent(OFFSET_COMMIT)) == 1


def test_commit_async_before_joining_sends_nothing_and_reports_it(fake, make_member):
    member = make_member(fake, "C0")
    outcomes = []
    member.commit_async({("t0", 0): 1}, outcomes.append)
    assert outcomes == [False] and fake.sent(OFFSET_COMMIT) == []


def test_commit_async_refused_for_a_stale_generation_is_not_retried(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    member_id = member.generation.member_id
    fake.script(OFFSET_COMMIT, ILLEGAL_GENERATION)
    outcomes = []
    member.commit_async({("t0", 0): 5}, outcomes.append)
    assert member.rejoin_reason() is None        # not known before the answer is applied
    member.settle_commits()
    assert outcomes == [False]
    assert member.generation.generation_id == -1 and member.generation.member_id == member_id
    assert member.rejoin_reason() is not None
    assert len(fake.sent(OFFSET_COMMIT)) == 1 and fake.group(GROUP).offsets == {}


@pytest.mark.parametrize("failure, named", [
    (NOT_COORDINATOR, "NotCoordinatorError"), (COORDINATOR_LOAD_IN_PROGRESS, "LoadInProgress"),
    (RetriableBrokerError("connection reset"), "connection reset")],
    ids=["not-coordinator", "loading", "network"])
def test_commit_async_with_a_retriable_failure_is_logged_not_made_again(fake, make_member,
                                                                        caplog, failure, named):
    # At a trigger, a failed commit must not hold the trigger up: the caller commits the
    # newest offsets at its next trigger instead. (It used to be made again synchronously,
    # for up to kafka.default.api.timeout.ms, and then failed the query.)
    caplog.set_level(logging.INFO, logger="kafka_source.group.member")
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, failure)
    outcomes = []
    member.commit_async({("t0", 2): 9}, outcomes.append)
    assert fake.group(GROUP).offsets == {}
    member.settle_commits()
    assert outcomes == [False]
    assert len(fake.sent(OFFSET_COMMIT)) == 1 and fake.group(GROUP).offsets == {}
    warning, = [r for r in caplog.records if r.levelname == "WARNING"]
    assert GROUP in warning.message and "t0-2@9" in warning.message
    assert named in warning.message
    assert member.stable and member.rejoin_reason() is None
    member.commit_async({("t0", 2): 11}, outcomes.append)    # the next trigger's
    member.settle_commits()
    assert outcomes == [False, True] and fake.group(GROUP).offsets == {("t0", 2): 11}
    assert "works again" in caplog.text


@pytest.mark.parametrize("failure", [NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
                                     RetriableBrokerError("connection reset")],
                         ids=["not-coordinator", "loading", "network"])
def test_commit_async_with_a_retriable_failure_is_made_again_before_a_rejoin(fake, make_member,
                                                                             failure):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, failure)
    outcomes = []
    member.commit_async({("t0", 2): 9}, outcomes.append)
    member.request_rejoin("a test")
    member.ensure_active(["t0"])
    assert outcomes == [True]
    assert len(fake.sent(OFFSET_COMMIT)) == 2
    assert fake.group(GROUP).offsets == {("t0", 2): 9}


def test_commit_async_whose_answer_never_comes_is_given_up_within_bounds(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000, request_timeout_ms=100)
    member.ensure_active(["t0"])
    outcomes = []
    member._client.hold_answers = True           # a connection that went quiet
    member.commit_async({("t0", 0): 4}, outcomes.append)
    start = time.monotonic()
    member.settle_commits()
    assert time.monotonic() - start < 3.0
    assert outcomes == [False] and len(fake.sent(OFFSET_COMMIT)) == 1
    # Before a rejoin (or leaving) it is made again, synchronously.
    member.commit_async({("t0", 0): 5}, outcomes.append)
    member.settle_commits(retry_ms=1_000)
    assert outcomes == [False, True] and len(fake.sent(OFFSET_COMMIT)) == 3


def test_a_commit_of_ten_thousand_partitions_goes_in_requests_kafka_can_write():
    """Kafka writes one OffsetCommit's offsets as one record batch and fails the whole commit
    when that batch exceeds the offsets topic's max.message.bytes (1 MiB by default; Kafka 4.0
    answers UNKNOWN_SERVER_ERROR). Seen on Kafka 4.0: a query over a pattern matching 10,000
    topics failed at its second trigger so. Such a commit now goes in several requests, each
    written, asynchronously and synchronously; a few partitions still go in one request."""
    topics = {f"scalep10000x1-{i:05d}": 1 for i in range(10_000)}
    fake = FakeCoordinator(topics, member_id_factory=_counter())
    fake.max_commit_batch_bytes = 1_048_588        # Kafka's default message.max.bytes
    group = "scale-ad1fdf84-ac36-405a-b8dd-540053f5bb4b"
    member = GroupMember(fake.client("C0"), lambda: fake.client("C0-heartbeat"),
                         opts(group_id=group, heartbeat_interval_ms=60_000),
                         RangeAssignor(), request_timeout_ms=2_000, retry_backoff_ms=1)
    try:
        member.ensure_active(sorted(topics))
        everything = {(t, 0): 7 for t in topics}
        outcomes = []
        member.commit_async(everything, outcomes.append)
        member.settle_commits()
        assert outcomes == [True]
        assert fake.group(group).offsets == everything
        sent = fake.sent(OFFSET_COMMIT)
        assert len(sent) == 3                              # about 1 MiB in 512 KiB parts
        assert all(_commit_batch_bytes(r) <= 600_000 for r in sent)
        assert member.commit({tp: 9 for tp in everything}) is True
        assert fake.group(group).offsets == {tp: 9 for tp in everything}
        assert len(fake.sent(OFFSET_COMMIT)) == 6
        assert member.commit({("scalep10000x1-00003", 0): 11}) is True
        assert len(fake.sent(OFFSET_COMMIT)) == 7
    finally:
        member._stop_heartbeat()
        fake.shutdown()


def test_commit_chunks_keep_every_offset_once_in_partition_order():
    offsets = {(f"t{i % 7}", i): i * 3 for i in range(5_000)}
    parts = commit_chunks("g", offsets, budget=10_000)
    assert len(parts) > 1 and [tp for part in parts for tp in part] == sorted(offsets)
    assert {tp: o for part in parts for tp, o in part.items()} == offsets
    assert commit_chunks("g", {}) == []
    assert commit_chunks("g", {("t", 0): 1}, budget=1) == [{("t", 0): 1}]  # never empty parts


def test_commit_async_answered_during_a_micro_batch_longer_than_the_request_timeout(
        fake, make_member):
    # The answer came long ago and waits unread: it is read, not taken for a lost commit.
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000, request_timeout_ms=100)
    member.ensure_active(["t0"])
    outcomes = []
    member.commit_async({("t0", 0): 4}, outcomes.append)
    member._pending_commit.sent_at -= 60                # sent a minute ago
    member.settle_commits()
    assert outcomes == [True] and len(fake.sent(OFFSET_COMMIT)) == 1


def test_commits_failing_for_longer_than_the_api_timeout_do_not_fail_the_member(fake,
                                                                                make_member,
                                                                                caplog):
    # The offsets topic lacks in-sync replicas: every OffsetCommit answers
    # COORDINATOR_NOT_AVAILABLE, for longer than kafka.default.api.timeout.ms, while heartbeats
    # and everything else work. Triggers go on committing (one commit each, never waiting).
    member = make_member(fake, "C0", request_timeout_ms=500, api_timeout_ms=200)
    member.ensure_active(["t0"])
    fake.commit_error = COORDINATOR_NOT_AVAILABLE
    outcomes = []
    start = time.monotonic()
    offset = 0
    while time.monotonic() - start < 0.6:
        offset += 1
        began = time.monotonic()
        member.settle_commits()                  # what each trigger begins with
        member.commit_async({("t0", 0): offset, ("t0", 1): offset}, outcomes.append)
        assert time.monotonic() - began < 0.3
        time.sleep(0.05)
    member.settle_commits()
    assert outcomes == [False] * offset and fake.group(GROUP).offsets == {}
    assert member.stable and member.rejoin_reason() is None
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert 1 <= len(warnings) < offset       # not one per trigger
    assert GROUP in warnings[0].message and "t0-0@1, t0-1@1" in warnings[0].message
    assert "CoordinatorNotAvailableError" in warnings[0].message

    fake.commit_error = None                     # it recovers: the newest offsets go out
    member.commit_async({("t0", 0): offset + 1, ("t0", 1): offset + 1}, outcomes.append)
    member.settle_commits()
    assert outcomes[-1] is True
    assert fake.group(GROUP).offsets == {("t0", 0): offset + 1, ("t0", 1): offset + 1}


@pytest.mark.parametrize("error, message", [
    (GROUP_AUTHORIZATION_FAILED, "Not authorized to use consumer group 'test-group'"),
    (Errors.OffsetMetadataTooLargeError.errno, "OffsetMetadataTooLarge")])
def test_commit_error_no_retry_can_fix_still_fails(fake, make_member, error, message):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, error)
    outcomes = []
    member.commit_async({("t0", 0): 3}, outcomes.append)
    with pytest.raises(KafkaSourceError, match=message):
        member.settle_commits()
    assert outcomes == [False]


def test_commit_that_cannot_be_made_before_a_rejoin_is_logged_and_the_member_rejoins(
        fake, make_member, caplog):
    # Bounded by half the rebalance timeout (here below kafka.default.api.timeout.ms), so that
    # the member still rejoins in time.
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000, request_timeout_ms=500,
                         api_timeout_ms=5_000, rebalance_timeout_ms=600)
    member.ensure_active(["t0"])
    fake.commit_error = COORDINATOR_NOT_AVAILABLE
    outcomes = []
    member.commit_async({("t0", 1): 7}, outcomes.append)
    member.request_rejoin("a test")
    start = time.monotonic()
    assert member.ensure_active(["t0"]) == tps("t0p0 t0p1 t0p2")
    assert 0.3 <= time.monotonic() - start < 2.0
    assert outcomes == [False] and member.generation.generation_id == 2
    assert len(fake.sent(OFFSET_COMMIT)) > 2             # made again, synchronously
    assert "within 300 ms" in caplog.text and "t0-1@7" in caplog.text


@pytest.mark.parametrize("retry_commit, api_timeout_ms, close_bound_ms", [
    (True, 200, 30_000), (True, 5_000, 300), (False, 5_000, 30_000)],
    ids=["retried", "retried-within-the-close-bound", "cluster-gone"])
def test_leaving_with_a_commit_that_cannot_be_made(fake, make_member, caplog, monkeypatch,
                                                   retry_commit, api_timeout_ms, close_bound_ms):
    # retry_commit=False: the query fails because the cluster could not be reached; the failed
    # commit is not made again, so that retries do not hold the query's error back. Retried,
    # it is for kafka.default.api.timeout.ms but no longer than Java's close() (30 s; here the
    # bound is shortened to 300 ms to see it).
    monkeypatch.setattr(commits, "CLOSE_COMMIT_TIMEOUT_MS", close_bound_ms)
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000, request_timeout_ms=500,
                         api_timeout_ms=api_timeout_ms)
    member.ensure_active(["t0"])
    fake.commit_error = COORDINATOR_NOT_AVAILABLE
    outcomes = []
    member.commit_async({("t0", 1): 7}, outcomes.append)
    started = time.monotonic()
    member.leave(retry_commit=retry_commit)
    assert outcomes == [False]
    assert [r.kind for r in fake.records()][-1] == LEAVE and fake.members(GROUP) == []
    assert "t0-1@7" in caplog.text
    if retry_commit:
        bound = min(api_timeout_ms, close_bound_ms)
        assert f"within {bound} ms" in caplog.text and len(fake.sent(OFFSET_COMMIT)) > 1
        assert time.monotonic() - started < 2.0
    else:           # not kafka.default.api.timeout.ms (5 s)
        assert time.monotonic() - started < 2.0 and len(fake.sent(OFFSET_COMMIT)) == 1
        assert "read again from their last committed offset" in caplog.text


def test_commits_apply_in_order_and_one_waits_for_the_one_before(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    outcomes = []
    member.commit_async({("t0", 0): 5}, lambda ok: outcomes.append(("first", ok)))
    member.commit_async({("t0", 0): 8}, lambda ok: outcomes.append(("second", ok)))
    assert outcomes == [("first", True)]
    assert member.commit({("t0", 0): 9}) is True
    assert outcomes == [("first", True), ("second", True)]
    assert [r.topics[0].partitions[0].committed_offset for r in fake.sent(OFFSET_COMMIT)] == [
        5, 8, 9]


def test_a_rejoin_first_applies_the_commit_in_flight(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    joins_when_settled = []
    member.commit_async({("t0", 0): 5}, lambda ok: joins_when_settled.append(
        (ok, len(fake.sent(JOIN)))))
    member.request_rejoin("a test")
    member.ensure_active(["t0"])
    assert joins_when_settled == [(True, 1)]     # before the second JoinGroup went out
    assert len(fake.sent(JOIN)) == 2


def test_leaving_first_applies_the_commit_in_flight(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    member.ensure_active(["t0"])
    outcomes = []
    member.commit_async({("t0", 1): 3}, outcomes.append)
    member.leave()
    assert outcomes == [True]
    assert [r.kind for r in fake.records()][-2:] == [OFFSET_COMMIT, LEAVE]


def test_assignment_is_current_until_something_needs_the_coordinator(fake, make_member):
    member = make_member(fake, "C0", heartbeat_interval_ms=60_000)
    assert not member.assignment_is_current()    # not joined yet
    member.ensure_active(["t0"])
    assert member.assignment_is_current()
    member.request_rejoin("a rebalance the heartbeat thread noticed")
    assert not member.assignment_is_current()
    member.ensure_active(["t0"])
    assert member.assignment_is_current()
    manual = make_member(fake, "C1", manual=[("t0", 0)])
    assert manual.assignment_is_current()


# ------------------------------------------------------------------------------------------
# generations_lost: fencing, as opposed to rebalances the member takes part in
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["heartbeat-illegal-generation", "session-expired",
                                 "commit-illegal-generation", "commit-unknown-member",
                                 "join-unknown-member", "sync-illegal-generation"])
def test_fencing_counts_as_a_lost_generation(fake, make_member, how):
    # (A short rebalance timeout: a member id the coordinator still holds is dropped sooner.)
    member = make_member(fake, "C0", rebalance_timeout_ms=200)
    member.ensure_active(["t0"])
    assert member.generations_lost == member.generations_lost_at_assignment == 0
    if how == "heartbeat-illegal-generation":
        fake.script(HEARTBEAT, ILLEGAL_GENERATION)
    elif how == "session-expired":
        fake.remove_member(GROUP, member.generation.member_id)
    elif how.startswith("commit-"):
        fake.script(OFFSET_COMMIT, ILLEGAL_GENERATION if "illegal" in how else UNKNOWN_MEMBER_ID)
        assert member.commit({("t0", 0): 5}) is False
    else:
        # A rebalance it takes part in, but the coordinator no longer knows the generation.
        member.request_rejoin("a test")
        fake.script(JOIN if how.startswith("join") else SYNC,
                    UNKNOWN_MEMBER_ID if "unknown" in how else ILLEGAL_GENERATION)
        member.ensure_active(["t0"])
    wait_until(lambda: member.generations_lost == 1, what="the loss to be counted")
    member.ensure_active(["t0"])
    assert member.assignment == tps("t0p0 t0p1 t0p2")
    assert member.generations_lost == member.generations_lost_at_assignment == 1


def test_rebalances_the_member_takes_part_in_and_leaving_are_not_fencing(fake, make_member):
    x, y = form_group(fake, make_member, ("t0",))          # x rejoined for y's join
    y.leave()
    wait_rebalance_noticed(x)
    x.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, REBALANCE_IN_PROGRESS)
    assert x.commit({("t0", 0): 1}) is False
    x.ensure_active(["t0"])
    assert x.assignment == tps("t0p0 t0p1 t0p2") and x.generation.generation_id == 4
    assert x.generations_lost == y.generations_lost == 0
    assert x.generations_lost_at_assignment == 0


def test_generations_lost_at_assignment_tells_a_loss_after_the_assignment(fake, make_member):
    member = make_member(fake, "C0")
    member.ensure_active(["t0"])
    fake.script(HEARTBEAT, UNKNOWN_MEMBER_ID)
    wait_until(lambda: member.generations_lost == 1, what="the heartbeat's fencing")
    # The assignment the member still reports is from before the loss.
    assert member.generations_lost_at_assignment == 0
    manual = make_member(fake, "C1", manual=[("t0", 0)])
    assert manual.generations_lost == manual.generations_lost_at_assignment == 0


# ------------------------------------------------------------------------------------------
# committed()
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("broker_version, expected_version", [(9, 8), (7, 7), (3, 3), (1, 1)])
def test_committed_offsets(make_member, broker_version, expected_version):
    fake = FakeCoordinator(TOPICS, api_versions={OFFSET_FETCH: broker_version})
    try:
        fake.commit_offsets(GROUP, {("t0", 0): 42, ("t1", 2): 7, ("t2", 0): 0, ("t2", 1): 5})
        fake.fetch_partition_errors[("t2", 1)] = UNKNOWN_TOPIC_OR_PARTITION
        member = make_member(fake, "C0")
        result = member.committed([("t1", 2), ("t0", 0), ("t0", 1), ("t2", 0), ("t2", 1),
                                   ("t0", 0)])
        assert result == {("t0", 0): 42, ("t0", 1): None, ("t1", 2): 7, ("t2", 0): 0,
                          ("t2", 1): None}
        record, = fake.records(OFFSET_FETCH)
        assert record.version == expected_version
        if expected_version >= 7:   # a stable read (commits.py's docstring)
            assert record.request.require_stable is True
        if expected_version >= 8:
            group, = record.request.groups
            assert group.group_id == GROUP
            asked = {t.name: list(t.partition_indexes) for t in group.topics}
        else:
            assert record.request.group_id == GROUP
            asked = {t.name: list(t.partition_indexes) for t in record.request.topics}
        assert asked == {"t0": [0, 1], "t1": [2], "t2": [0, 1]}
        assert member.committed([]) == {}
        assert len(fake.sent(OFFSET_FETCH)) == 1
    finally:
        fake.shutdown()


@pytest.mark.parametrize("broker_version", [9, 5, 1])
def test_committed_retries_coordinator_errors(make_member, broker_version):
    fake = FakeCoordinator(TOPICS, api_versions={OFFSET_FETCH: broker_version})
    try:
        fake.commit_offsets(GROUP, {("t0", 1): 3})
        member = make_member(fake, "C0")
        fake.script(OFFSET_FETCH, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR,
                    RetriableBrokerError("connection reset"))
        assert member.committed([("t0", 1)]) == {("t0", 1): 3}
        assert len(fake.sent(OFFSET_FETCH)) == 4
        assert len([c for c in fake.find_coordinator_calls if c[0] == "C0"]) == 3
    finally:
        fake.shutdown()


@pytest.mark.parametrize("broker_version", [9, 7])
def test_committed_waits_out_an_unstable_offset_commit(make_member, broker_version):
    """A stable read answered UNSTABLE_OFFSET_COMMIT (Kafka 2.5-3.x: a transaction's offsets
    for the group are pending) is asked again, and the answer after it is used."""
    fake = FakeCoordinator(TOPICS, api_versions={OFFSET_FETCH: broker_version})
    try:
        fake.commit_offsets(GROUP, {("t0", 1): 3})
        member = make_member(fake, "C0")
        fake.script(OFFSET_FETCH, {("t0", 1): Errors.UnstableOffsetCommitError.errno})
        assert member.committed([("t0", 1)]) == {("t0", 1): 3}
        assert len(fake.sent(OFFSET_FETCH)) == 2
    finally:
        fake.shutdown()


@pytest.mark.parametrize("broker_version", [9, 5])
def test_committed_group_authorization_failure_names_the_group(make_member, broker_version):
    fake = FakeCoordinator(TOPICS, api_versions={OFFSET_FETCH: broker_version})
    try:
        member = make_member(fake, "C0")
        fake.script(OFFSET_FETCH, GROUP_AUTHORIZATION_FAILED)
        with pytest.raises(KafkaSourceError, match=GROUP):
            member.committed([("t0", 0)])
    finally:
        fake.shutdown()


def test_committed_partition_error_that_a_retry_cannot_fix_fails(fake, make_member):
    member = make_member(fake, "C0")
    fake.script(OFFSET_FETCH, {("t0", 0): Errors.UnsupportedForMessageFormatError.errno})
    with pytest.raises(KafkaSourceError, match="OffsetFetch"):
        member.committed([("t0", 0), ("t0", 1)])


# ------------------------------------------------------------------------------------------
# leave()
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("broker_version", [5, 2])
def test_leave_then_rejoin(make_member, broker_version):
    fake = FakeCoordinator(TOPICS, api_versions={LEAVE: broker_version},
                           member_id_factory=_counter())
    try:
        member = make_member(fake, "C0")
        member.ensure_active(["t0"])
        member_id = member.generation.member_id
        wait_until(lambda: heartbeats(fake, member) >= 1)
        thread = member._heartbeat

        member.leave("test over")
        leave, = fake.sent(LEAVE)
        if broker_version >= 3:
            assert [(m.member_id, m.reason) for m in leave.members] == [(member_id,
                                                                         "test over")]
        else:
            assert leave.member_id == member_id
        assert fake.members(GROUP) == [] and fake.state(GROUP) == EMPTY
        thread.join(1)
        assert not thread.is_alive()
        count = len(fake.sent(HEARTBEAT))
        time.sleep(0.08)
        assert len(fake.sent(HEARTBEAT)) == count
        assert member.generation.member_id == "" and member.assignment == ()
        assert member.rejoin_reason() is not None and not member.stable

        assert member.ensure_active(["t0"]) == tps("t0p0 t0p1 t0p2")
        assert fake.sent(JOIN)[-1].member_id == ""
        assert member.generation.member_id not in ("", member_id)
        assert heartbeat_alive(member)
    finally:
        fake.shutdown()


def test_leave_before_joining_sends_nothing(fake, make_member):
    member = make_member(fake, "C0")
    member.leave()
    assert fake.requests == []


def test_leaving_member_triggers_a_rebalance_for_the_others(fake, make_member):
    x, y = form_group(fake, make_member, ("t0",))
    assert x.assignment == tps("t0p0 t0p1") and y.assignment == tps("t0p2")
    y.leave()
    wait_rebalance_noticed(x)
    assert x.ensure_active(["t0"]) == tps("t0p0 t0p1 t0p2")
    assert fake.members(GROUP) == [x.generation.member_id]


# ------------------------------------------------------------------------------------------
# Static membership (KIP-345): kafka.group.instance.id
# ------------------------------------------------------------------------------------------

INSTANCE = "query-1"


@pytest.mark.parametrize("instance_id", [None, INSTANCE])
def test_the_instance_id_goes_with_every_request_of_the_member(make_member, instance_id):
    fake = FakeCoordinator(TOPICS, member_id_factory=_counter(), require_member_id=True)
    try:
        member = make_member(fake, "C0", group_instance_id=instance_id)
        assert member.ensure_active(["t0"]) == tps("t0p0 t0p1 t0p2")
        wait_until(lambda: heartbeats(fake, member) >= 1)
        assert member.commit({("t0", 0): 5}) is True
        records = [fake.records(kind)[-1] for kind in (JOIN, SYNC, HEARTBEAT, OFFSET_COMMIT)]
        assert [r.request.group_instance_id for r in records] == [instance_id] * 4
        # The versions that carry it (KIP-345): JoinGroup 5, SyncGroup/Heartbeat 3, OffsetCommit 7
        assert [r.version >= v for r, v in zip(records, (5, 3, 3, 7))] == [True] * 4
        joins = fake.sent(JOIN)
        if instance_id is None:       # KIP-394: a dynamic member asks for its member id first
            assert [j.member_id for j in joins] == ["", "C0-1"]
            assert fake.group(GROUP).static_members == {}
        else:                         # a static member is known by its instance id
            assert [j.member_id for j in joins] == [""]
            assert fake.group(GROUP).static_members == {INSTANCE: member.generation.member_id}
    finally:
        fake.shutdown()


def test_stopped_static_member_sends_no_leave_group_and_keeps_its_partitions(fake,
                                                                            make_member):
    other = make_member(fake, "java-consumer")             # dynamic, the leader
    query = make_member(fake, "query", group_instance_id=INSTANCE)
    other.ensure_active(["t0"])
    joining = Background(query.ensure_active, ["t0"], name="query-join")
    wait_rebalance_noticed(other)
    other.ensure_active(["t0"])
    assert joining.result(5) == tps("t0p2") and other.assignment == tps("t0p0 t0p1")
    stopped_id = query.generation.member_id

    query.leave("the query stopped")
    assert fake.sent(LEAVE) == []
    assert fake.state(GROUP) == STABLE and stopped_id in fake.members(GROUP)
    assert not heartbeat_alive(query)
    beats = heartbeats(fake, other)
    wait_until(lambda: heartbeats(fake, other) >= beats + 3, what="the other's heartbeats")
    assert other.assignment_is_current()             # it never heard of a rebalance


@pytest.mark.parametrize("join_version", [9, 8])
@pytest.mark.parametrize("query_leads", [False, True])
def test_restart_within_the_session_timeout_gets_the_partitions_back_without_a_rebalance(
        make_member, join_version, query_leads):
    fake = FakeCoordinator(TOPICS, member_id_factory=_counter(),
                           api_versions={JOIN: join_version})
    try:
        other = make_member(fake, "java-consumer")
        query = make_member(fake, "query", group_instance_id=INSTANCE)
        first, second = (query, other) if query_leads else (other, query)
        first.ensure_active(["t0"])
        joining = Background(second.ensure_active, ["t0"], name="second-join")
        wait_rebalance_noticed(first)
        first.ensure_active(["t0"])
        joining.result(5)
        before = (query.assignment, other.assignment)
        generation = query.generation.generation_id
        rebalances = fake.group(GROUP).completed_rebalances
        other_joins = len(fake.sent(JOIN, client_id="java-consumer"))
        old_id = query.generation.member_id
        query.leave("the query stopped")

        restarted = make_member(fake, "query-restarted", group_instance_id=INSTANCE)
        assert restarted.ensure_active(["t0"]) == before[0]
        assert restarted.generation.generation_id == generation          # no rebalance
        assert fake.group(GROUP).completed_rebalances == rebalances
        assert restarted.generation.member_id not in ("", old_id)        # a new member id
        assert fake.members(GROUP) == ([restarted.generation.member_id, other.generation.member_id]
                                       if query_leads else
                                       [other.generation.member_id, restarted.generation.member_id])
        # The other member's assignment never changed and it never had to rejoin.
        beats = heartbeats(fake, other)
        wait_until(lambda: heartbeats(fake, other) >= beats + 3, what="the other's heartbeats")
        assert other.assignment_is_current() and other.assignment == before[1]
        assert len(fake.sent(JOIN, client_id="java-consumer")) == other_joins
        sync = fake.sent(SYNC, client_id="query-restarted")[-1]
        assert sync.assignments == []       # the stored assignment, not a new one
        # The replaced member id is fenced (what a still-running old query would be told).
        old = RawMember(fake, GROUP, [], instance_id=INSTANCE)
        old.member_id, old.generation = old_id, generation
        assert old.heartbeat() == FENCED_INSTANCE_ID

        # KIP-814 (JoinGroup v9): a returning static leader is told it leads but must not
        # assign; it watches the partition counts as leader. Before v9 it is told the old
        # leader's id: no member watches them until the next rebalance (as in Java).
        join = fake.records(JOIN)[-1]
        assert join.request.member_id == "" and join.request.group_instance_id == INSTANCE
        fake.topics["t0"] = 4
        restarted.ensure_active(["t0"], {"t0": 4})
        watches = query_leads and join_version >= 9
        assert (restarted.generation.generation_id > generation) == watches
    finally:
        fake.shutdown()


def test_a_second_member_with_the_instance_id_fences_the_first_for_good(fake, make_member):
    first = make_member(fake, "query-A", group_instance_id=INSTANCE)
    assert first.ensure_active(["t0"]) == tps("t0p0 t0p1 t0p2")
    second = make_member(fake, "query-B", group_instance_id=INSTANCE)
    assert second.ensure_active(["t0"]) == tps("t0p0 t0p1 t0p2")   # first's place, same
    assert second.generation.generation_id == first.generation.generation_id  # generation

    for _ in range(3):                  # the same error every time: no rejoin, no retry loop
        with pytest.raises(OptionError) as info:
            wait_until(lambda: first.ensure_active(["t0"]) is None, what="the fencing")
        message = str(info.value)
        assert "'kafka.group.instance.id'" in message and f"'{INSTANCE}'" in message
        assert "FENCED_INSTANCE_ID" in message and "another" in message
    assert len(fake.sent(JOIN, client_id="query-A")) == 1
    thread = first._heartbeat
    wait_until(lambda: thread is None or not thread.is_alive(), what="A's heartbeats to stop")
    with pytest.raises(OptionError, match="kafka.group.instance.id"):
        first.commit({("t0", 0): 1})
    assert second.assignment_is_current() and fake.state(GROUP) == STABLE
    assert fake.members(GROUP) == [second.generation.member_id]


@pytest.mark.parametrize("kind", [JOIN, SYNC, HEARTBEAT, OFFSET_COMMIT])
def test_fenced_instance_id_from_any_request_fails_the_member(fake, make_member, kind):
    member = make_member(fake, "C0", group_instance_id=INSTANCE)
    if kind in (HEARTBEAT, OFFSET_COMMIT):
        member.ensure_active(["t0"])
    fake.script(kind, FENCED_INSTANCE_ID)
    joins = len(fake.sent(JOIN))
    if kind == OFFSET_COMMIT:
        member.commit_async({("t0", 0): 3})
        with pytest.raises(OptionError, match="FENCED_INSTANCE_ID"):
            member.settle_commits()
    elif kind == HEARTBEAT:
        wait_until(lambda: member._fatal is not None, what="the heartbeat's answer")
    with pytest.raises(OptionError, match=r"'kafka.group.instance.id' = 'query-1'"):
        member.ensure_active(["t0"])
    assert len(fake.sent(JOIN)) == joins + (1 if kind in (JOIN, SYNC) else 0)


def test_static_membership_on_a_broker_without_join_group_v5_names_option_and_version(
        make_member):
    fake = FakeCoordinator(TOPICS, api_versions={JOIN: 4})      # Kafka 2.2
    try:
        member = make_member(fake, "C0", group_instance_id=INSTANCE)
        started = time.monotonic()
        with pytest.raises(OptionError) as info:
            member.ensure_active(["t0"])
        message = str(info.value)
        assert "'kafka.group.instance.id'" in message and "Kafka 2.3" in message
        assert "broker [0-4]" in message
        assert fake.sent(JOIN) == [] and time.monotonic() - started < 1   # no retries
        # A dynamic member is fine on the same broker.
        assert make_member(fake, "C1").ensure_active(["t0"]) == tps("t0p0 t0p1 t0p2")
    finally:
        fake.shutdown()


# ------------------------------------------------------------------------------------------
# The rebalance-listener contract
# ------------------------------------------------------------------------------------------

def test_owner_commits_during_the_rebalance_then_gives_partitions_up(make_member):
    fake = FakeCoordinator({"t": 4}, member_id_factory=lambda client_id: client_id)
    try:
        a = make_member(fake, "A")
        b = make_member(fake, "B")
        assert a.ensure_active(["t"]) == tps("tp0 tp1 tp2 tp3")

        b_joining = Background(b.ensure_active, ["t"], name="B-join")
        wait_rebalance_noticed(a)          # A's heartbeat: REBALANCE_IN_PROGRESS
        assert fake.state(GROUP) == PREPARING_REBALANCE
        # A commits what its last batches processed, in the generation it still has
        assert a.generation.generation_id == 1
        assert a.commit({("t", 0): 100, ("t", 1): 101, ("t", 2): 102, ("t", 3): 103}) is True
        assert fake.group(GROUP).offsets[("t", 3)] == 103
        assert not b_joining.done()

        assert a.ensure_active(["t"]) == tps("tp0 tp1")
        assert b_joining.result(5) == tps("tp2 tp3")
        assert a.generation.generation_id == b.generation.generation_id == 2
        # B starts from what A committed
        assert b.committed(b.assignment) == {("t", 2): 102, ("t", 3): 103}
        assert fake.state(GROUP) == STABLE
    finally:
        fake.shutdown()


# ------------------------------------------------------------------------------------------
# The fake coordinator itself (its answers are what the tests above rely on)
# ------------------------------------------------------------------------------------------

def _raw(fake, topics=("t0",), **kw):
    return RawMember(fake, GROUP, [("range", Subscription(list(topics)).encode())], **kw)


def test_fake_offset_commit_validation_follows_kafka(fake):
    def commit(member_id, generation):
        from kafka.protocol.consumer import OffsetCommitRequest
        T = OffsetCommitRequest.OffsetCommitRequestTopic
        request = OffsetCommitRequest(
            group_id=GROUP, generation_id_or_member_epoch=generation, member_id=member_id,
            group_instance_id=None, retention_time_ms=-1,
            topics=[T(name="t0", partitions=[T.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                commit_timestamp=-1, committed_metadata="")])], max_version=8)
        response = fake.client("admin").send(fake.coordinator_node, request)
        return response.topics[0].partitions[0].error_code

    assert commit("", -1) == NONE             # no members: a "simple" group
    a = _raw(fake)
    a.join()
    assert fake.state(GROUP) == COMPLETING_REBALANCE
    assert commit("", -1) == UNKNOWN_MEMBER_ID
    assert commit(a.member_id, 1) == REBALANCE_IN_PROGRESS
    assert commit(a.member_id, 0) == ILLEGAL_GENERATION
    assert commit("nobody", 1) == UNKNOWN_MEMBER_ID
    a.sync({a.member_id: b""})
    assert commit(a.member_id, 1) == NONE
    b = _raw(fake)
    joining = Background(b.join)
    assert fake.wait_for(lambda: fake.state(GROUP) == PREPARING_REBALANCE)
    assert commit(a.member_id, 1) == NONE     # PreparingRebalance, current generation
    assert a.heartbeat() == REBALANCE_IN_PROGRESS
    a.join()
    assert joining.result(5).generation_id == 2
    assert a.heartbeat() == NONE              # CompletingRebalance
    assert commit(a.member_id, 1) == ILLEGAL_GENERATION
    assert a.sync({}).error_code == NONE
    assert b.sync().error_code == NONE
    assert fake.state(GROUP) == STABLE


def test_fake_follower_sync_waits_for_the_leader_and_rebalance_timeout_drops_members(fake):
    a = _raw(fake, rebalance_timeout_ms=100)
    a.join()
    a.sync({a.member_id: Assignment(tps("t0p0")).encode()})
    b = _raw(fake, rebalance_timeout_ms=100)
    assert b.join().error_code == NONE          # a did not rejoin within 100 ms: dropped
    assert fake.members(GROUP) == [b.member_id]
    assert a.heartbeat() == UNKNOWN_MEMBER_ID
    assert b.join_response.leader == b.member_id

    c = _raw(fake)
    c_joining = Background(c.join)
    assert fake.wait_for(lambda: fake.state(GROUP) == PREPARING_REBALANCE)
    b.join()
    c_joining.result(5)
    c_syncing = Background(c.sync)
    time.sleep(0.03)
    assert not c_syncing.done()                  # waits for the leader
    b.sync({c.member_id: Assignment(tps("t0p1")).encode()})
    assert Assignment.decode(bytes(c_syncing.result(5).assignment)).partitions == tps("t0p1")


def test_fake_rejects_mismatched_protocols_and_bad_session_timeouts(fake):
    a = _raw(fake)
    a.join()
    other = RawMember(fake, GROUP, [("roundrobin", b"")])
    assert other.join().error_code == INCONSISTENT_GROUP_PROTOCOL
    short = _raw(fake, session_timeout_ms=10)
    assert short.join().error_code == Errors.InvalidSessionTimeoutError.errno



def test_fake_session_expiry_follows_its_clock():
    now = [100.0]
    fake = FakeCoordinator(TOPICS, clock=lambda: now[0])
    try:
        a = _raw(fake, session_timeout_ms=6_000)
        a.join()
        a.sync({a.member_id: b""})
        now[0] += 5
        assert a.heartbeat() == NONE
        now[0] += 5
        assert fake.expire_sessions() == []        # the heartbeat renewed the session
        now[0] += 1.5
        assert fake.expire_sessions() == [a.member_id]
        assert fake.state(GROUP) == EMPTY and fake.group(GROUP).generation == 2
        assert a.heartbeat() == UNKNOWN_MEMBER_ID
    finally:
        fake.shutdown()


# ------------------------------------------------------------------------------------------
# Cooperative rebalancing (KIP-429, assignor cooperative-sticky)
# ------------------------------------------------------------------------------------------

def _joins_of(fake, member_id: str) -> list:
    """The Subscriptions of every JoinGroup ``member_id`` sent, on whichever connection."""
    return [Subscription.decode(bytes(j.protocols[0].metadata)) for j in fake.sent(JOIN)
            if j.member_id == member_id]


def _cooperative_pair(make_member, **option_changes):
    """C0 and C1 on cooperative-sticky over topic t (6 partitions), settled on 3 each, each
    driven as the planning thread drives it (ensure_active once per trigger)."""
    from kafka_source.group.sticky import CooperativeStickyAssignor

    fake = FakeCoordinator({"t": 6}, member_id_factory=lambda client_id: client_id)
    x = make_member(fake, "C0", assignor=CooperativeStickyAssignor(), **option_changes)
    y = make_member(fake, "C1", assignor=CooperativeStickyAssignor(), **option_changes)
    assert x.ensure_active(["t"]) == tps("tp0 tp1 tp2 tp3 tp4 tp5")       # generation 1
    # C1's first join waits for C0, whose heartbeat hears of it and rejoins in the background.
    assert y.ensure_active(["t"]) == ()
    # Settled: each took its last rejoin's outcome over, and no rejoin is left running.
    wait_until(lambda: len(x.ensure_active(["t"])) == 3 and len(y.ensure_active(["t"])) == 3
               and fake.state(GROUP) == STABLE and x.generation.generation_id
               == y.generation.generation_id == fake.group(GROUP).generation
               and x._rejoiner is None and y._rejoiner is None
               and x._joined is None and y._joined is None,
               what="two members with three partitions each")
    return fake, x, y


def test_cooperative_member_reads_on_through_a_rebalance_and_gives_up_only_what_it_committed(
        make_member):
    from kafka_source.group.sticky import CooperativeStickyAssignor

    fake = FakeCoordinator({"t": 6}, member_id_factory=lambda client_id: client_id)
    try:
        everything = tps("tp0 tp1 tp2 tp3 tp4 tp5")
        x = make_member(fake, "C0", assignor=CooperativeStickyAssignor())
        y = make_member(fake, "C1", assignor=CooperativeStickyAssignor())
        assert x.ensure_active(["t"]) == everything                       # generation 1
        y_joining = Background(y.ensure_active, ["t"], name="C1-join")
        # C0's heartbeat hears of the rebalance and C0 rejoins in the background, with no call
        # from its planning thread: generation 2 gives C1 nothing yet and C0 three partitions.
        assert fake.wait_for(lambda: fake.group(GROUP).generation == 2
                             and fake.state(GROUP) == STABLE and x._joined is not None)
        assert y_joining.result(5) == ()
        # Until the planning thread takes the outcome over, C0 holds (and commits) all six:
        # the micro-batch running reads the three it gives up, and they are committed in
        # generation 2 once it completes.
        assert x.assignment == everything and x.stable
        x.commit_async({tp: 10 for tp in everything})
        kept = x.ensure_active(["t"])     # takes generation 2 over, starts the second round
        assert len(kept) == 3 and set(kept) < set(everything)
        # The second round's JoinGroup went out only after that commit was answered.
        def second_round_join():
            return next((i for i, r in enumerate(fake.records()) if r.kind == JOIN
                         and Subscription.decode(bytes(r.request.protocols[0].metadata))
                         .generation_id == 2), None)
        assert fake.wait_for(lambda: second_round_join() is not None)
        commit_at = next(i for i, r in enumerate(fake.records())
                         if r.kind == OFFSET_COMMIT and r.request.member_id == "C0")
        assert commit_at < second_round_join()
        assert fake.group(GROUP).offsets == {tp: 10 for tp in everything}
        # Generation 3: C1 hears of it by heartbeat, rejoins and gets the three C0 gave up.
        wait_until(lambda: len(y.ensure_active(["t"])) == 3 and x.ensure_active(["t"]) == kept
                   and fake.group(GROUP).generation == 3 and fake.state(GROUP) == STABLE,
                   what="generation 3 with three partitions each")
        assert set(y.assignment) == set(everything) - set(kept)
        # C0 said what it owned, and in which generation, each time it joined.
        owned = [(s.owned_partitions, s.generation_id) for s in _joins_of(fake, "C0")
                 if s.generation_id > 0]
        assert owned == [(everything, 1), (kept, 2)]
        # No member ever held a partition another one still owned.
        second = next(s for s in fake.sent(SYNC) if s.generation_id == 2 and s.assignments)
        given = {a.member_id: Assignment.decode(bytes(a.assignment)).partitions
                 for a in second.assignments}
        assert given["C1"] == () and set(given["C0"]) == set(kept)
        assert x.generations_lost == y.generations_lost == 0
    finally:
        fake.shutdown()


def test_cooperative_member_is_not_held_by_a_rebalance_that_waits_for_another_member(
        make_member):
    fake, x, y = _cooperative_pair(make_member, rebalance_timeout_ms=10_000)
    try:
        kept, theirs = x.assignment, y.assignment
        generation = fake.group(GROUP).generation
        y._stop_heartbeat()               # C1 is busy: it will not rejoin for a while
        fake.trigger_rebalance(GROUP)
        assert fake.wait_for(lambda: "C0" in fake.awaiting_join(GROUP))
        # The rebalance waits for C1; C0's planning thread is not held by it: it plans with
        # the partitions it keeps and commits them in the generation it holds.
        for n in range(3):
            assert x.ensure_active(["t"]) == kept and x.stable
            assert x.commit({tp: 20 + n for tp in kept})
        assert fake.state(GROUP) == PREPARING_REBALANCE
        assert fake.group(GROUP).offsets == {tp: 22 for tp in kept}
        # C1 rejoins (in the background too: it keeps its partitions); nothing moves.
        y.request_rejoin("test")
        assert y.ensure_active(["t"]) == theirs
        wait_until(lambda: fake.state(GROUP) == STABLE and x._joined is not None
                   and y._joined is not None, what="the rebalance to end")
        assert x.ensure_active(["t"]) == kept and y.ensure_active(["t"]) == theirs
        assert x.generation.generation_id == generation + 1
        assert x.generations_lost == y.generations_lost == 0
        assert x.assignment_is_current()
    finally:
        fake.shutdown()


def test_a_commit_the_members_own_rejoin_overtook_is_made_again_not_taken_for_fencing(
        make_member, caplog):
    fake, x, y = _cooperative_pair(make_member)
    try:
        kept = x.assignment
        done = []
        # Sent in the generation C0 holds, answered as if it arrived after the rebalance below.
        fake.script(OFFSET_COMMIT, ILLEGAL_GENERATION)
        x.commit_async({tp: 7 for tp in kept}, done.append)
        generation = fake.group(GROUP).generation
        fake.trigger_rebalance(GROUP)
        wait_until(lambda: fake.state(GROUP) == STABLE
                   and fake.group(GROUP).generation == generation + 1
                   and x._joined is not None, what="C0's rejoin")
        with caplog.at_level(logging.INFO, logger="kafka_source.group.member"):
            x.settle_commits()            # as the stream reader does at each trigger
        assert x.ensure_active(["t"]) == kept
        assert done == [False]
        assert "overtaken by the member's rejoin" in caplog.text
        assert x.generations_lost == 0 and x.rejoin_reason() is None
        assert x.commit({tp: 7 for tp in kept})             # made again, in the new generation
        assert all(fake.group(GROUP).offsets[tp] == 7 for tp in kept)
    finally:
        fake.shutdown()


def test_a_member_that_leaves_during_a_background_rejoin_takes_nothing_over(make_member):
    fake, x, y = _cooperative_pair(make_member, rebalance_timeout_ms=10_000)
    try:
        y._stop_heartbeat()
        fake.trigger_rebalance(GROUP)
        assert fake.wait_for(lambda: "C0" in fake.awaiting_join(GROUP))
        rejoiner = x._rejoiner
        assert rejoiner is not None and rejoiner.is_alive()
        x.leave()
        assert x.assignment == () and not x.stable
        rejoiner.join(5)
        assert not rejoiner.is_alive() and x._joined is None and x.assignment == ()
        assert "C0" not in fake.members(GROUP)
    finally:
        fake.shutdown()


def test_a_background_rejoin_that_fails_fails_the_next_trigger(make_member):
    fake, x, y = _cooperative_pair(make_member)
    try:
        fake.script(JOIN, GROUP_AUTHORIZATION_FAILED, member_id="C0")
        fake.trigger_rebalance(GROUP)
        errors = []

        def failed():             # the planning thread's triggers, until one fails
            try:
                x.ensure_active(["t"])
            except KafkaSourceError as exc:
                errors.append(exc)
            return bool(errors)

        wait_until(failed, what="a trigger to fail with the background rejoin's error")
        assert "Not authorized to use consumer group" in str(errors[0])
    finally:
        fake.shutdown()


def test_a_fenced_cooperative_member_rejoins_before_planning_again(make_member):
    fake, x, y = _cooperative_pair(make_member)
    try:
        fake.remove_member(GROUP, "C0")                      # its session expired
        wait_until(lambda: x.generations_lost == 1, what="C0's heartbeat to hear of it")
        # C0 holds nothing now: it does not plan with what it had, it joins first.
        owned = x.ensure_active(["t"])
        assert x.generation.generation_id == fake.group(GROUP).generation
        assert x.generations_lost_at_assignment == 1
        assert set(owned) <= set(tps("tp0 tp1 tp2 tp3 tp4 tp5"))
    finally:
        fake.shutdown()


def test_an_eager_member_says_it_owns_nothing(fake, make_member):
    x = make_member(fake, "C0")
    x.ensure_active(["t0"])
    x.request_rejoin("test")
    x.ensure_active(["t0"])
    subs = [Subscription.decode(bytes(j.protocols[0].metadata))
            for j in fake.sent(JOIN, client_id="C0")]
    assert all(s.owned_partitions == () and s.generation_id == -1 for s in subs)
