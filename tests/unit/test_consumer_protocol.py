"""The consumer group protocol (KIP-848): options, wire specs, and ConsumerProtocolMember against
an in-process coordinator (tests/unit/fake_consumer_group.py). Every wait is bounded."""

from __future__ import annotations

import dataclasses
import time
import uuid

import kafka.errors as Errors
import pytest

from kafka_source.config.options import GroupOptions, parse_stream_options
from kafka_source.errors import (BrokerUnavailableError, BrokerUnreachableError, KafkaSourceError,
                                 OptionError)
from kafka_source.group.consumer_protocol import ConsumerProtocolMember
from kafka_source.wire.net.client import RetriableBrokerError
from kafka_source.wire.net.group_protocol import (ConsumerGroupDescribeRequest,
                                                  ConsumerGroupDescribeResponse,
                                                  ConsumerGroupHeartbeatRequest,
                                                  ConsumerGroupHeartbeatResponse)

from .fake_consumer_group import (FENCED_MEMBER_EPOCH, GROUP_AUTHORIZATION_FAILED, HEARTBEAT,
                                  INVALID_REQUEST, NOT_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH,
                                  STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, UNSUPPORTED_VERSION,
                                  FakeConsumerGroupCoordinator)

TOPICS = {"t0": 2, "t1": 2}


def opts(**changes) -> GroupOptions:
    base = GroupOptions(group_id="g", group_id_given=True, assignor="range",
                        commit_offsets=True, session_timeout_ms=45_000,
                        heartbeat_interval_ms=3_000, rebalance_timeout_ms=2_000,
                        auto_offset_reset="latest", api_timeout_ms=2_000, protocol="consumer",
                        remote_assignor="uniform")
    return dataclasses.replace(base, **changes)


def member(fake, **changes) -> ConsumerProtocolMember:
    return ConsumerProtocolMember(fake.client(), fake.client, opts(**changes),
                                  request_timeout_ms=1_000, retry_backoff_ms=5)


def wait_until(condition, timeout: float = 3.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


ALL = [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)]


@pytest.fixture
def fake():
    return FakeConsumerGroupCoordinator(TOPICS)


@pytest.fixture
def members():
    made = []
    yield made
    for m in made:
        m._stop_heartbeat()


# --- options ----------------------------------------------------------------------------------

BASE = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "kafka.group.id": "g"}


def test_protocol_defaults_to_classic():
    group = parse_stream_options(BASE).group
    assert (group.protocol, group.remote_assignor) == ("classic", None)


def test_consumer_protocol_options():
    group = parse_stream_options({**BASE, "kafka.group.protocol": "CONSUMER",
                                  "kafka.group.remote.assignor": "Range",
                                  "kafka.max.poll.interval.ms": "60000"}).group
    assert (group.protocol, group.remote_assignor, group.rebalance_timeout_ms) == \
        ("consumer", "range", 60_000)
    pattern = parse_stream_options({"kafka.bootstrap.servers": "b:9092", "kafka.group.id": "g",
                                    "subscribePattern": "t.*", "kafka.group.protocol": "consumer"})
    assert pattern.group.pattern == "t.*"


@pytest.mark.parametrize("changes, words", [
    ({"kafka.group.protocol": "new"}, ["'kafka.group.protocol'", "'classic'", "'consumer'"]),
    ({"kafka.group.protocol": "consumer", "kafka.group.remote.assignor": "sticky"},
     ["'kafka.group.remote.assignor'", "'uniform'", "'range'"]),
    ({"kafka.group.remote.assignor": "uniform"},
     ["'kafka.group.remote.assignor'", "'kafka.group.protocol' = 'consumer'"]),
    ({"kafka.group.protocol": "consumer", "assignor": "roundrobin"},
     ["'assignor'", "'kafka.group.remote.assignor'"]),
    ({"kafka.group.protocol": "consumer", "kafka.session.timeout.ms": "10000"},
     ["'kafka.session.timeout.ms'", "group.consumer.session.timeout.ms"]),
    ({"kafka.group.protocol": "consumer", "kafka.heartbeat.interval.ms": "1000"},
     ["'kafka.heartbeat.interval.ms'", "group.consumer.heartbeat.interval.ms"]),
])
def test_invalid_protocol_options(changes, words):
    with pytest.raises(OptionError) as info:
        parse_stream_options({**BASE, **changes})
    for word in words:
        assert word in str(info.value)


# --- the wire specs ---------------------------------------------------------------------------

def test_specs_round_trip_at_both_versions():
    tid = uuid.uuid4()
    for version in (0, 1):
        request = ConsumerGroupHeartbeatRequest(
            group_id="g", member_id="m", member_epoch=3, instance_id="i", rack_id=None,
            rebalance_timeout_ms=1000, subscribed_topic_names=["a"],
            server_assignor="uniform", topic_partitions=[
                ConsumerGroupHeartbeatRequest.TopicPartitions(topic_id=tid, partitions=[0, 2])])
        back = ConsumerGroupHeartbeatRequest.decode(request.encode(version=version),
                                                    version=version)
        assert (back.member_epoch, back.topic_partitions[0].topic_id,
                list(back.topic_partitions[0].partitions)) == (3, tid, [0, 2])
    regex = ConsumerGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=0,
                                          subscribed_topic_regex="t.*", topic_partitions=[])
    assert ConsumerGroupHeartbeatRequest.decode(regex.encode(version=1), version=1) \
        .subscribed_topic_regex == "t.*"
    assert (ConsumerGroupHeartbeatRequest.API_KEY, ConsumerGroupDescribeRequest.API_KEY) == \
        (68, 69)
    assert ConsumerGroupHeartbeatResponse.max_version == ConsumerGroupDescribeResponse.max_version \
        == 1


# --- joining and assignment -------------------------------------------------------------------

def test_join_sends_the_subscription_and_gets_every_partition(fake, members):
    m = member(fake, group_instance_id=None)
    members.append(m)
    assert m.ensure_active(["t0", "t1"]) == tuple(ALL)
    join = fake.sent(HEARTBEAT)[0]
    assert join.member_epoch == 0 and join.version == 1
    assert str(uuid.UUID(join.member_id)) == join.member_id == m.member_id   # KIP-1082
    assert (list(join.subscribed_topic_names), join.server_assignor,
            join.rebalance_timeout_ms, list(join.topic_partitions)) == \
        (["t0", "t1"], "uniform", 2_000, [])
    assert m.stable and m.epoch > 0 and m.assignment_is_current()
    # Heartbeats follow at the interval the coordinator asked for, with the owned partitions.
    wait_until(lambda: len(fake.sent(HEARTBEAT)) >= 3, what="heartbeats")
    beat = fake.sent(HEARTBEAT)[-1]
    assert beat.member_epoch == m.epoch
    assert sorted((t, p) for tp in beat.topic_partitions for t in [
        {v: k for k, v in fake.topic_ids.items()}[tp.topic_id]] for p in tp.partitions) == ALL


def test_static_member_sends_instance_id_and_leaves_with_minus_two(fake, members):
    m = member(fake, group_instance_id="query-1")
    members.append(m)
    m.ensure_active(["t0"])
    assert fake.sent(HEARTBEAT)[0].instance_id == "query-1"
    m.leave()
    last = fake.sent(HEARTBEAT)[-1]
    assert (last.member_epoch, last.instance_id) == (-2, "query-1")
    # A restart with the instance id takes its place and its partitions.
    again = member(fake, group_instance_id="query-1")
    members.append(again)
    assert again.ensure_active(["t0"]) == (("t0", 0), ("t0", 1))


def test_dynamic_member_leaves_with_minus_one(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    m.leave()
    assert fake.sent(HEARTBEAT)[-1].member_epoch == -1
    assert m.member_id not in fake.members and not m.stable and m.assignment == ()


def test_leaving_a_cluster_that_is_gone_does_not_make_the_failed_commit_again(fake, members):
    m = member(fake)                                  # kafka.default.api.timeout.ms: 2 s
    members.append(m)
    m.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, *[Errors.CoordinatorNotAvailableError.errno] * 50)
    done = []
    m.commit_async({("t0", 1): 6}, done.append)
    started = time.monotonic()
    m.leave(retry_commit=False)
    assert time.monotonic() - started < 1.0
    assert done == [False] and len(fake.sent(OFFSET_COMMIT)) == 1
    assert fake.sent(HEARTBEAT)[-1].member_epoch == -1 and m.member_id not in fake.members


def test_revocation_waits_for_the_commit_and_is_acknowledged(fake, members):
    """Another member joins: this one gets the revocation by heartbeat, keeps the partitions
    until the planning thread's next ensure_active (after the commit of what it processed),
    and the next heartbeat acknowledges it; only then does the other member get them."""
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0", "t1"])
    other = fake.add_member(["t0", "t1"])
    assert fake.assigned(other) == []                   # all still owned by m
    wait_until(lambda: not m.assignment_is_current(), what="the revocation to arrive")
    assert m.assignment == tuple(ALL)                   # not given up yet
    keep = set(fake.assigned(m.member_id))
    revoked = sorted(set(ALL) - keep)
    assert len(revoked) == 2
    # the reader commits what it processed of every partition it owns, then ensure_active
    settled = []
    m.commit_async({tp: 7 for tp in ALL}, settled.append)
    assert fake.members[m.member_id].owned == set(ALL)  # not acknowledged before the trigger
    owned = m.ensure_active(["t0", "t1"])
    assert set(owned) == keep and settled == [True]     # the commit was settled first
    assert {tp for _, tp, off, _ in fake.history} == set(ALL)
    commit = fake.sent(OFFSET_COMMIT)[-1]
    assert commit.version == 9 and commit.member_id == m.member_id
    # The acknowledgement is sent at once (not a heartbeat interval later), after the commit;
    # then the other member gets the partitions.
    wait_until(lambda: fake.members[m.member_id].owned == keep, what="the acknowledgement")
    kinds = [k for k, r, _ in fake.requests
             if k == OFFSET_COMMIT or (k == HEARTBEAT and r.member_id == m.member_id)]
    assert OFFSET_COMMIT in kinds[:-1]
    _, epoch, got = fake.beat(other, fake.members[other].epoch, topics=["t0", "t1"], owned=[])
    assert got == revoked
    assert m.assignment_is_current()


def test_new_partitions_arrive_incrementally(fake, members):
    other = fake.add_member(["t0"])
    assert fake.assigned(other) == [("t0", 0), ("t0", 1)]
    m = member(fake)
    members.append(m)
    assert m.ensure_active(["t0"]) == ()                 # the other member owns both
    fake.beat(other, fake.members[other].epoch, owned=[])   # it revokes them
    wait_until(lambda: not m.assignment_is_current(), what="an assignment")
    assert len(m.ensure_active(["t0"])) == 1
    lost = m.generations_lost_at_assignment
    assert lost == m.generations_lost == 0


def test_fenced_member_rejoins_with_epoch_zero_and_owns_nothing(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    old_epoch = m.epoch
    fake.fence(m.member_id)
    wait_until(lambda: m.generations_lost == 1, what="fencing noticed")
    assert not m.stable and not m.assignment_is_current()
    m.commit_async({("t0", 0): 5})                       # nothing is committed while fenced
    m.settle_commits()
    assert fake.history == []
    assert m.ensure_active(["t0"]) == (("t0", 0), ("t0", 1))
    join = [r for r in fake.sent(HEARTBEAT) if r.member_epoch == 0][-1]
    assert join.member_id == m.member_id and list(join.topic_partitions) == []
    assert m.epoch != old_epoch and m.generations_lost_at_assignment == 1


def test_unknown_member_rejoins(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    fake.expire(m.member_id)
    wait_until(lambda: m.generations_lost == 1, what="UNKNOWN_MEMBER_ID noticed")
    assert m.ensure_active(["t0"]) == (("t0", 0), ("t0", 1))
    assert m.stable


# --- commits ----------------------------------------------------------------------------------

def test_commit_and_fetch_carry_member_id_and_epoch(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    assert m.commit({("t0", 0): 3})
    commit = fake.sent(OFFSET_COMMIT)[-1]
    assert (commit.version, commit.member_id, commit.generation_id_or_member_epoch) == \
        (9, m.member_id, m.epoch)
    assert m.committed([("t0", 0), ("t0", 1)]) == {("t0", 0): 3, ("t0", 1): None}
    fetch = fake.sent(OFFSET_FETCH)[-1]
    assert (fetch.version, fetch.groups[0].member_id, fetch.groups[0].member_epoch) == \
        (9, m.member_id, m.epoch)


def test_stale_member_epoch_is_retried_with_the_new_epoch(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, STALE_MEMBER_EPOCH)
    assert m.commit({("t0", 0): 4})
    assert fake.offsets[("t0", 0)] == 4


def test_fenced_commit_is_refused_and_the_member_rejoins(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, FENCED_MEMBER_EPOCH)
    assert not m.commit({("t0", 0): 4})
    assert m.generations_lost == 1 and ("t0", 0) not in fake.offsets


def test_commit_refused_below_v9_is_an_error_not_a_silent_success(fake, members):
    fake.api_versions[OFFSET_COMMIT] = 8
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    with pytest.raises(Errors.IncompatibleBrokerVersion):
        m.commit({("t0", 0): 4})


# --- errors -----------------------------------------------------------------------------------

def test_broker_without_the_protocol_names_the_option():
    fake = FakeConsumerGroupCoordinator(TOPICS, api_versions={HEARTBEAT: None})
    m = member(fake)
    with pytest.raises(OptionError) as info:
        m.ensure_active(["t0"])
    assert "'kafka.group.protocol'" in str(info.value) and "'classic'" in str(info.value)
    with pytest.raises(OptionError):                     # and stays failed
        m.ensure_active(["t0"])


def test_unsupported_version_answer_names_the_option(fake):
    fake.script(HEARTBEAT, UNSUPPORTED_VERSION)
    with pytest.raises(OptionError, match="'kafka.group.protocol' = 'classic'"):
        member(fake).ensure_active(["t0"])


def test_pattern_needs_heartbeat_v1():
    fake = FakeConsumerGroupCoordinator(TOPICS, api_versions={HEARTBEAT: 0})
    with pytest.raises(OptionError, match="subscribePattern"):
        member(fake, pattern="t.*").ensure_active(["t0"])


def test_pattern_is_sent_as_the_regex(fake, members):
    m = member(fake, pattern="t.*")
    members.append(m)
    m.ensure_active(["t0", "t1"])
    join = fake.sent(HEARTBEAT)[0]
    assert (join.subscribed_topic_regex, join.subscribed_topic_names) == ("t.*", None)


def test_unsupported_assignor_names_the_option(fake):
    with pytest.raises(OptionError) as info:
        member(fake, remote_assignor="sticky").ensure_active(["t0"])
    assert "'kafka.group.remote.assignor' = 'sticky'" in str(info.value)
    assert "uniform, range" in str(info.value)


def test_authorization_and_invalid_request_fail_clearly(fake):
    fake.script(HEARTBEAT, GROUP_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaSourceError, match="grant READ"):
        member(fake).ensure_active(["t0"])
    fake.script(HEARTBEAT, INVALID_REQUEST)
    with pytest.raises(KafkaSourceError, match="InvalidRequestError"):
        member(fake).ensure_active(["t0"])


def test_retriable_join_errors_are_retried(fake, members):
    fake.script(HEARTBEAT, NOT_COORDINATOR, RetriableBrokerError("down"), UNKNOWN_MEMBER_ID)
    m = member(fake)
    members.append(m)
    assert m.ensure_active(["t0"]) == (("t0", 0), ("t0", 1))


@pytest.mark.parametrize("unreachable", [False, True], ids=["not-coordinator", "unreachable"])
def test_join_gives_up_within_its_budget(fake, unreachable):
    error = BrokerUnreachableError("broker 1: no connection") if unreachable else NOT_COORDINATOR
    fake.script(HEARTBEAT, *([error] * 10_000))
    m = member(fake, rebalance_timeout_ms=200)
    started = time.monotonic()
    with pytest.raises(KafkaSourceError, match="Could not join") as info:
        m.ensure_active(["t0"])
    assert time.monotonic() - started < 5
    assert isinstance(info.value, BrokerUnavailableError) is unreachable, info.value


def test_async_commit_answered_stale_is_made_again_with_the_new_epoch(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    fake.script(OFFSET_COMMIT, STALE_MEMBER_EPOCH)
    done = []
    m.commit_async({("t0", 1): 6}, done.append)
    m.settle_commits()
    assert done == [True] and fake.offsets[("t0", 1)] == 6


def test_commit_after_the_epoch_was_lost_is_not_made(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    m._reset(reason="test")
    assert not m.commit({("t0", 0): 9})
    assert fake.history == [] and m.generations_lost == 1


# --- describe_group ---------------------------------------------------------------------------

def test_describe_group_uses_consumer_group_describe_for_consumer_groups():
    from kafka_source.group import status

    tid = uuid.uuid4()
    R = ConsumerGroupDescribeResponse
    G = R.DescribedGroup
    A = G.Member.Assignment
    answer = R(version=1, throttle_time_ms=0, groups=[G(
        error_code=0, error_message=None, group_id="g", group_state="Stable", group_epoch=3,
        assignment_epoch=3, assignor_name="uniform", authorized_operations=-2147483648,
        members=[G.Member(member_id="m1", instance_id="q1", rack_id=None, member_epoch=3,
                          client_id="pykafka", client_host="/h", subscribed_topic_names=["t"],
                          subscribed_topic_regex=None, member_type=1,
                          assignment=A(topic_partitions=[A.TopicPartitions(
                              topic_id=tid, topic_name="t", partitions=[1, 0])]),
                          target_assignment=A(topic_partitions=[]))])])
    answer = R.decode(answer.encode(version=1), version=1)

    class Client:
        def send(self, node, request, timeout_ms=None):
            assert isinstance(request, ConsumerGroupDescribeRequest)
            assert list(request.group_ids) == ["g"]
            return answer

    state, assignor, members_ = status._describe_consumer_group(Client(), 1, "g")
    assert (state, assignor) == ("Stable", "uniform")
    assert members_ == [status.MemberStatus("m1", "pykafka", "/h", (("t", 0), ("t", 1)), "q1")]

    class Old:
        def send(self, node, request, timeout_ms=None):
            raise Errors.IncompatibleBrokerVersion("no API 69")

    assert status._describe_consumer_group(Old(), 1, "g") is None


# --- the stream reader with this member ---------------------------------------------------------

def test_the_stream_reader_makes_a_consumer_protocol_member_only_for_subscriptions():
    from kafka_source.group.member import GroupMember
    from kafka_source.read.stream import KafkaStreamReader

    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "kafka.group.id": "g",
            "kafka.group.protocol": "consumer"}
    reader = KafkaStreamReader(parse_stream_options({**base, "subscribe": "t"}))
    assert isinstance(reader.member, ConsumerProtocolMember)
    reader = KafkaStreamReader(parse_stream_options({**base, "assign": '{"t": [0]}'}))
    assert isinstance(reader.member, GroupMember) and reader.member.manual == (("t", 0),)


def test_a_query_gives_up_partitions_after_committing_and_never_commits_backwards(fake):
    """Driven as Spark drives the reader: the query reads all four partitions; another member
    joins; the query commits what it processed, gives up two partitions and acknowledges; the
    other member gets them at the query's committed offsets, reads further and commits; the
    query is fenced and rejoins: it adopts what it gets from the group's commits, never
    committing its own older offsets over them."""
    from .test_stream_planning import Cluster, Spark, make_reader

    fake = FakeConsumerGroupCoordinator({"t": 4})
    cluster = Cluster({("t", p): 500 for p in range(4)})
    reader = make_reader(cluster, None, **{"kafka.group.id": "g",
                                           "kafka.group.protocol": "consumer",
                                           "kafka.max.poll.interval.ms": "2000",
                                           "startingOffsets": "earliest",
                                           "maxOffsetsPerTrigger": "400"})
    reader._member = ConsumerProtocolMember(fake.client(), fake.client, reader.options.group,
                                            request_timeout_ms=1_000, retry_backoff_ms=1)
    try:
        spark = Spark(reader)
        assert spark.trigger() == [("t", p, 0, 100) for p in range(4)]
        assert spark.trigger() == [("t", p, 100, 200) for p in range(4)]
        member = reader.member
        other = fake.add_member(["t"])
        wait_until(lambda: not member.assignment_is_current(), what="the revocation")
        read = spark.trigger()                       # commits 200, then gives up two
        keep = sorted(fake.assigned(member.member_id))
        assert len(keep) == 2 and member.assignment == tuple(keep)
        assert read == [("t", p, 200, 400) for _, p in keep]   # 400 per trigger over two
        gone = sorted(set(("t", p) for p in range(4)) - set(keep))
        assert all(fake.offsets[tp] == 200 for tp in gone)
        wait_until(lambda: fake.members[member.member_id].owned == set(keep),
                   what="the acknowledgement")
        _, epoch, got = fake.beat(other, fake.members[other].epoch, topics=["t"], owned=[])
        assert got == gone
        # The other member reads them at the query's commits and goes on to 450.
        fake.members[other].owned = set(gone)
        fake.offsets.update({tp: 450 for tp in gone})

        # The query is fenced; when it rejoins the other member has left: it gets all four,
        # adopting the other member's two at 450 (not its stale 200).
        fake.fence(member.member_id)
        fenced_at = len(fake.history)
        wait_until(lambda: member.generations_lost == 1, what="the fencing")
        del fake.members[other]
        spark.trigger()
        spark.trigger()
        assert sorted(member.assignment) == [("t", p) for p in range(4)]
        for tp in gone:
            offsets = [off for _, t, off, _ in fake.history if t == tp]
            assert offsets == sorted(offsets), (tp, offsets)
            later = [off for _, t, off, _ in fake.history[fenced_at:] if t == tp]
            assert later and min(later) >= 450, (tp, later)     # never back below the group's
    finally:
        reader.stop()


def test_a_pattern_the_brokers_refuse_names_the_option(fake):
    fake.script(HEARTBEAT, 128)                   # INVALID_REGULAR_EXPRESSION (Kafka 4.0)
    with pytest.raises(OptionError) as info:
        member(fake, pattern="(?=t)").ensure_active(["t0"])
    assert "'subscribePattern' = '(?=t)'" in str(info.value)
    assert "RE2/J" in str(info.value) and "'classic'" in str(info.value)


def test_the_acknowledgement_does_not_wait_for_the_heartbeat_interval(members):
    fake = FakeConsumerGroupCoordinator(TOPICS, heartbeat_interval_ms=60_000)
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0", "t1"])
    fake.add_member(["t0", "t1"])
    m._wake()                                         # the heartbeat that brings the revocation
    wait_until(lambda: not m.assignment_is_current(), what="the revocation")
    beats = len(fake.sent(HEARTBEAT))
    started = time.monotonic()
    keep = set(m.ensure_active(["t0", "t1"]))
    wait_until(lambda: fake.members[m.member_id].owned == keep, timeout=2.0,
               what="the acknowledgement, long before the 60 s interval")
    assert len(fake.sent(HEARTBEAT)) == beats + 1 and time.monotonic() - started < 2


def test_offset_fetch_answered_stale_is_asked_again_without_the_member(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    m.commit({("t0", 0): 8})
    m._stop_heartbeat()                               # the new epoch never reaches the member
    fake.members[m.member_id].epoch += 1
    assert m.committed([("t0", 0)]) == {("t0", 0): 8}
    first, second = fake.sent(OFFSET_FETCH)[-2:]
    assert first.groups[0].member_id == m.member_id
    assert (second.groups[0].member_id, second.groups[0].member_epoch) == (None, -1)
    assert m.generations_lost == 0


def test_offset_fetch_of_a_removed_member_is_asked_again_without_the_member(fake, members):
    m = member(fake)
    members.append(m)
    m.ensure_active(["t0"])
    m.commit({("t0", 0): 8})
    m._stop_heartbeat()
    fake.expire(m.member_id)                          # the fetch notices first
    assert m.committed([("t0", 0)]) == {("t0", 0): 8}
    assert fake.sent(OFFSET_FETCH)[-1].groups[0].member_id is None
    assert m.generations_lost == 1 and not m.stable


def test_a_changed_subscription_is_carried_by_the_next_heartbeat(fake, members):
    m = member(fake)
    members.append(m)
    assert m.ensure_active(["t0"]) == (("t0", 0), ("t0", 1))
    m.ensure_active(["t0", "t1"])
    wait_until(lambda: fake.members[m.member_id].topics == ("t0", "t1"), what="the new names")
    wait_until(lambda: not m.assignment_is_current(), what="the grown assignment")
    assert m.ensure_active(["t0", "t1"]) == tuple(ALL)
