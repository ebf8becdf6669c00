"""kafka_source.group.status: the group view's arithmetic and DescribeGroups handling, without a
broker (tests/integration/test_group_status.py runs it against one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kafka_source.errors import KafkaSourceError
from kafka_source.group import status
from kafka_source.group.assignors import Assignment
from kafka_source.group.status import GroupStatus, MemberStatus, PartitionStatus
from kafka_source.wire.net.client import BrokerClient, RetriableBrokerError

pytestmark = pytest.mark.pyspark_free

NO_ERROR, COORDINATOR_LOADING, GROUP_ID_NOT_FOUND, GROUP_AUTH_FAILED = 0, 14, 69, 30


def group_status(*partitions, members=()):
    return GroupStatus("g", "Stable", "range", tuple(members), tuple(partitions))


def test_lag_is_end_minus_committed_and_unknown_without_a_commit():
    assert PartitionStatus("t", 0, 40, 50, None).lag == 10
    assert PartitionStatus("t", 0, 50, 50, None).lag == 0
    assert PartitionStatus("t", 0, None, 50, None).lag is None


def test_total_lag_sums_known_lags_and_is_none_before_any_commit():
    assert group_status(PartitionStatus("t", 0, None, 5, None)).total_lag is None
    assert group_status(PartitionStatus("t", 0, 3, 5, None),
                        PartitionStatus("t", 1, None, 9, None),
                        PartitionStatus("t", 2, 1, 8, None)).total_lag == 9
    assert group_status().total_lag is None


def test_rows_and_committed_name_each_partition_and_its_member():
    member = MemberStatus("m-1", "query-A", "/127.0.0.1", (("t", 0),))
    static = MemberStatus("m-2", "query-B", "/127.0.0.1", (("t", 2),), instance_id="etl-B")
    s = group_status(PartitionStatus("t", 0, 3, 5, "m-1"), PartitionStatus("t", 1, None, 2, None),
                     PartitionStatus("t", 2, 1, 1, "m-2"), members=[member, static])
    assert s.rows() == [
        {"topic": "t", "partition": 0, "committed": 3, "end": 5, "lag": 2, "member": "m-1",
         "client": "query-A", "instance": None},
        {"topic": "t", "partition": 1, "committed": None, "end": 2, "lag": None, "member": None,
         "client": None, "instance": None},
        {"topic": "t", "partition": 2, "committed": 1, "end": 1, "lag": 0, "member": "m-2",
         "client": "query-B", "instance": "etl-B"}]
    assert s.committed == {("t", 0): 3, ("t", 2): 1}
    assert s.assignment() == {"m-1": (("t", 0),), "m-2": (("t", 2),)}


class FakeCoordinator:
    """find_coordinator/send as BrokerClient has them, answering from a script."""

    request_timeout_ms = 2_000

    def __init__(self, *answers):
        self.answers = list(answers)   # error codes, exceptions, or ("ok", members)
        self.sent = []

    def find_coordinator(self, group_id):
        return 1

    def send(self, node, request):
        self.sent.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        code, members = answer if isinstance(answer, tuple) else (answer, [])
        group = SimpleNamespace(error_code=code, group_state="Stable", protocol_type="consumer",
                                protocol_data="range", members=members)
        return SimpleNamespace(groups=[group])


def member(member_id, client_id, partitions, instance_id=None):
    return SimpleNamespace(member_id=member_id, client_id=client_id, client_host="/10.0.0.1",
                           group_instance_id=instance_id,
                           member_assignment=Assignment(tuple(partitions)).encode())


def test_describe_decodes_assignments_and_asks_for_no_authorized_operations():
    client = FakeCoordinator((NO_ERROR, [member("b-2", "query-B", [("t", 2), ("t", 3)], "etl-B"),
                                         member("a-1", "query-A", [("t", 0), ("t", 1)])]))
    node, (state, assignor, members) = status._describe(client, "g")
    assert node == 1   # the coordinator: OffsetFetch goes there next
    assert (state, assignor) == ("Stable", "range")
    assert [(m.client_id, m.partitions, m.instance_id) for m in members] == [
        ("query-A", (("t", 0), ("t", 1)), None), ("query-B", (("t", 2), ("t", 3)), "etl-B")]
    assert client.sent[0].include_authorized_operations is False


def test_describe_retries_while_the_coordinator_loads_or_is_unreachable(monkeypatch):
    monkeypatch.setattr(status.time, "sleep", lambda s: None)
    client = FakeCoordinator(COORDINATOR_LOADING, RetriableBrokerError("connection reset"),
                             (NO_ERROR, []))
    assert status._describe(client, "g") == (1, ("Stable", "range", []))
    assert len(client.sent) == 3


def test_describe_gives_up_after_the_request_timeout(monkeypatch):
    clock = iter(range(0, 1000, 1))
    monkeypatch.setattr(status.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(status.time, "sleep", lambda s: None)
    client = FakeCoordinator(*[COORDINATOR_LOADING] * 10)
    with pytest.raises(KafkaSourceError, match=r"consumer group 'g' within 2000 ms"):
        status._describe(client, "g")


def test_a_group_that_does_not_exist_is_dead_and_a_refusal_is_an_error():
    assert status._describe(FakeCoordinator(GROUP_ID_NOT_FOUND), "g") == (1, ("Dead", "", []))
    with pytest.raises(KafkaSourceError, match="GroupAuthorizationFailedError"):
        status._describe(FakeCoordinator(GROUP_AUTH_FAILED), "g")


class FakeOffsets:
    """Answers OffsetFetch like a coordinator of the given response version (the client's own
    response parsing, BrokerClient.group_offsets, is used on it)."""

    group_offsets = BrokerClient.group_offsets

    def __init__(self, version, code, partitions):
        self.version, self.code, self.partitions, self.sent = version, code, partitions, []

    def send(self, node, request):
        self.sent.append((node, request))
        topics = {}
        for (t, p), (offset, err) in self.partitions.items():
            topics.setdefault(t, []).append(SimpleNamespace(partition_index=p,
                                                            committed_offset=offset,
                                                            metadata="", error_code=err))
        found = [SimpleNamespace(name=t, partitions=ps) for t, ps in topics.items()]
        if self.version >= 8:
            return SimpleNamespace(version=8, groups=[SimpleNamespace(error_code=self.code,
                                                                      topics=found)])
        return SimpleNamespace(version=self.version, error_code=self.code, topics=found)


@pytest.mark.parametrize("version", [5, 8])
def test_committed_asks_for_all_partitions_and_keeps_real_offsets(version):
    client = FakeOffsets(version, NO_ERROR, {("t", 0): (7, 0), ("t", 1): (-1, 0),
                                             ("u", 0): (3, 0), ("u", 1): (9, 3)})
    assert status._committed(client, 4, "g") == {("t", 0): 7, ("u", 0): 3}
    node, request = client.sent[0]
    assert node == 4 and request.topics is None and request.groups[0].topics is None


def test_committed_of_an_unknown_group_is_empty_and_a_refusal_is_an_error():
    assert status._committed(FakeOffsets(8, GROUP_ID_NOT_FOUND, {}), 1, "g") == {}
    with pytest.raises(KafkaSourceError, match="OffsetFetch for consumer group 'g' failed: "
                                               "GroupAuthorizationFailedError"):
        status._committed(FakeOffsets(5, GROUP_AUTH_FAILED, {}), 1, "g")
