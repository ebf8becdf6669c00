"""The broker client's answers to a restarting broker, and its one retry policy, without a broker.

``BrokerClient.send`` is replaced by a stub that returns scripted Metadata answers (kafka-python
response objects); what a restarting Kafka really answers is in the module docstring of
:mod:`kafka_source.wire.net.client` and is exercised for real in ``tests/integration/test_faults.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kafka.protocol.broker_version_data import BROKER_API_VERSIONS, BrokerVersionData
from kafka.protocol.metadata import MetadataResponse

from kafka_source.errors import BrokerUnavailableError, TopicError
from kafka_source.wire.net.client import BrokerClient, Retries, RetriableBrokerError, readable_topic
from kafka_source.wire.net.planning_protocol import LeanListOffsetsRequest

pytestmark = pytest.mark.pyspark_free

UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_FOR_PARTITION = 6
TOPIC_AUTHORIZATION_FAILED = 29

THREE_BROKERS = ((1, "127.0.0.1", 9092), (2, "127.0.0.1", 9093), (3, "127.0.0.1", 9094))


def answer(topics: dict[str, int], *, brokers=((1, "127.0.0.1", 9092),), epoch=0,
           partitions=1, wire=False):
    """A Metadata response (v9): ``topics`` maps name -> error code; partitions 0.. led by 1
    with leader epoch ``epoch``."""
    R = MetadataResponse
    P = R.MetadataResponseTopic.MetadataResponsePartition
    response = R(version=9, throttle_time_ms=0, cluster_id="c", controller_id=1 if brokers else -1,
             brokers=[R.MetadataResponseBroker(node_id=n, host=h, port=p, rack=None)
                      for n, h, p in brokers],
             topics=[R.MetadataResponseTopic(
                 error_code=code, name=t, is_internal=False, partitions=[] if code else [
                     P(error_code=0, partition_index=i, leader_id=1, leader_epoch=epoch,
                       replica_nodes=[1], isr_nodes=[1], offline_replicas=[])
                     for i in range(partitions)])
                 for t, code in topics.items()])
    if wire:
        return response.encode(version=9)           # its body's bytes
    return R.decode(response.encode(), version=9)   # as it comes off the wire


class Scripted(BrokerClient):
    """A BrokerClient whose requests get the scripted answers (or raise scripted errors)."""

    def __init__(self, *answers):
        super().__init__({"bootstrap_servers": "broker:9092", "request_timeout_ms": 0})
        self.answers = list(answers)
        self.sent = 0
        self.nodes: list = []          # the node each request was sent to (None: any)

    def send(self, node_id, request, timeout_ms=None):
        self.sent += 1
        self.nodes.append(node_id)
        self.last_node = 1 if node_id is None else node_id   # as if broker 1 were least loaded
        step = self.answers.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def send_all(self, requests, timeout_ms=None, *, partial=False):
        """The answers in order (BrokerTransport.send_all has them in flight together:
        tests/unit/test_transport.py); with ``partial``, a scripted RetriableBrokerError in
        its place."""
        answers = []
        for node_id, request in requests:
            try:
                answers.append(self.send(node_id, request, timeout_ms))
            except RetriableBrokerError as exc:
                if not partial:
                    raise
                answers.append(exc)
        return answers

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


NO_WAIT = Retries(count=3, interval_ms=0, window_ms=0)


# --- Metadata of a broker that does not know the cluster ------------------------------------------

def test_an_answer_without_brokers_is_retriable_whatever_it_says_about_topics():
    # What a ZooKeeper-mode broker answers before the controller told it the cluster's state
    # (UNKNOWN_TOPIC_OR_PARTITION for every topic), and a KRaft broker shutting down (no brokers).
    with Scripted(answer({"t": UNKNOWN_TOPIC_OR_PARTITION}, brokers=())) as client:
        with pytest.raises(RetriableBrokerError, match="without any broker"):
            client.metadata(["t"])


def test_topic_metadata_retries_a_restarting_broker_then_answers():
    with Scripted(RetriableBrokerError("connection refused"),
                  answer({"t": UNKNOWN_TOPIC_OR_PARTITION}, brokers=()),
                  answer({"t": 0})) as client:
        infos = client.topic_metadata(["t"], NO_WAIT)
    assert infos["t"].error_code == 0 and infos["t"].partitions[0].leader == 1
    assert client.sent == 3


def test_topic_metadata_reports_a_missing_topic_at_once_when_the_cluster_answers_normally():
    # One look at the broker's whole topic list: it knows topics, so it knows the cluster.
    with Scripted(answer({"t": 0, "nope": UNKNOWN_TOPIC_OR_PARTITION}),
                  answer({"t": 0, "other": 0})) as client:
        infos = client.topic_metadata(["t", "nope"], NO_WAIT)
    assert infos["nope"].error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert client.sent == 2 and client.nodes == [None, 1]   # the list from the same broker


def test_topic_metadata_waits_for_a_broker_that_knows_the_brokers_but_no_partitions():
    # A ZooKeeper-mode broker just after a restart (measured on Kafka 2.2): brokers listed,
    # every topic unknown, and its whole topic list empty, until the controller sends the
    # partitions.
    with Scripted(answer({"t": UNKNOWN_TOPIC_OR_PARTITION}), answer({}),
                  answer({"t": 0})) as client:
        infos = client.topic_metadata(["t"], NO_WAIT)
    assert infos["t"].error_code == 0 and client.sent == 3


def broker_versions(client, *, zookeeper: bool, node=None):
    """Give ``client`` the ApiVersions of a Kafka 3.9 broker in ZooKeeper mode (which lists
    UpdateMetadata, api key 6) or in KRaft mode (which does not): the bootstrap's, or those of
    its connection to ``node``."""
    api_keys = dict(BROKER_API_VERSIONS[(3, 9)])
    if not zookeeper:
        for key in (4, 5, 6, 7):          # LeaderAndIsr .. ControlledShutdown: zkBroker only
            del api_keys[key]
    versions = BrokerVersionData(api_versions=api_keys)
    if node is None:
        client._connections.broker_version_data = versions
    else:
        client._connections._conns[node] = SimpleNamespace(broker_version_data=versions)


def test_a_kraft_brokers_unknown_topic_is_believed_at_once_on_a_cluster_without_topics():
    # A new KRaft cluster has no topic at all; its brokers serve only once they have caught up
    # with the cluster's metadata. A misspelt topic there used to be doubted (as a starting
    # ZooKeeper-mode broker's answer) until the planning retries ran out: 30 s by default.
    retries = Retries(count=30, interval_ms=1000, window_ms=30_000)
    with Scripted(answer({"nope": UNKNOWN_TOPIC_OR_PARTITION}), answer({})) as client:
        broker_versions(client, zookeeper=False)
        infos = client.topic_metadata(["nope"], retries)
        with pytest.raises(TopicError, match="'nope' does not exist"):
            readable_topic("nope", infos["nope"], client.bootstrap_servers)
    assert client.sent == 1            # nor is a large cluster asked for its whole topic list


def test_a_zookeeper_mode_brokers_unknown_topic_on_an_empty_list_is_still_doubted():
    with Scripted(answer({"t": UNKNOWN_TOPIC_OR_PARTITION}), answer({}),
                  answer({"t": 0})) as client:
        broker_versions(client, zookeeper=True)
        infos = client.topic_metadata(["t"], NO_WAIT)
    assert infos["t"].error_code == 0 and client.sent == 3


def test_what_the_answering_broker_said_at_its_own_connection_decides():
    # Bootstrapped from a KRaft broker, answered by one still in ZooKeeper mode (a cluster
    # being migrated to KRaft has both): that broker's answer is doubted as before.
    with Scripted(answer({"t": UNKNOWN_TOPIC_OR_PARTITION}), answer({}),
                  answer({"t": 0})) as client:
        broker_versions(client, zookeeper=False)
        broker_versions(client, zookeeper=True, node=1)
        assert client.topic_metadata(["t"], NO_WAIT)["t"].error_code == 0
    assert client.sent == 3


def test_topic_metadata_doubts_a_topic_it_has_seen_until_answers_agree_for_the_bound(
        monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("kafka_source.wire.net.metadata_view.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("kafka_source.wire.net.client.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("kafka_source.wire.net.client.time.sleep",
                        lambda s: clock.__setitem__(0, clock[0] + s))
    gone = answer({"t": UNKNOWN_TOPIC_OR_PARTITION}, brokers=THREE_BROKERS)
    with Scripted(answer({"t": 0}, brokers=THREE_BROKERS, partitions=2),
                  *[gone] * 4, answer({"other": 0})) as client:
        client.view = type(client.view)(confirm_ms=3_000, clock=lambda: clock[0])
        assert client.topic_metadata(["t"], NO_WAIT)["t"].error_code == 0
        retries = Retries(count=3, interval_ms=1000, window_ms=30_000)
        infos = client.topic_metadata(["t"], retries)
    assert infos["t"].error_code == UNKNOWN_TOPIC_OR_PARTITION
    # Believed after 3 s (4 answers 1 s apart); each doubting answer sends the next question
    # to the next broker, and the whole topic list then comes from the last one.
    assert client.nodes[1:] == [None, 2, 3, 1, 1]
    assert 3.0 <= clock[0] < 4.5


def test_a_doubted_topic_that_one_broker_still_has_is_there():
    with Scripted(answer({"t": 0}), answer({"t": UNKNOWN_TOPIC_OR_PARTITION}),
                  answer({"t": 0})) as client:
        client.topic_metadata(["t"], NO_WAIT)
        assert client.topic_metadata(["t"], NO_WAIT)["t"].error_code == 0
    assert client.sent == 3


def test_a_partition_that_was_there_is_doubted_too():
    with Scripted(answer({"t": 0}, partitions=2), answer({"t": 0}, partitions=1),
                  answer({"t": 0}, partitions=2)) as client:
        client.topic_metadata(["t"], NO_WAIT)
        assert sorted(client.topic_metadata(["t"], NO_WAIT)["t"].partitions) == [0, 1]
    assert client.sent == 3


def test_when_the_retries_run_out_the_doubted_answer_is_taken():
    with Scripted(answer({"t": 0}), *[answer({"t": UNKNOWN_TOPIC_OR_PARTITION})] * 3) as client:
        client.view = type(client.view)(confirm_ms=60_000)
        client.topic_metadata(["t"], NO_WAIT)
        infos = client.topic_metadata(["t"], Retries(count=1, interval_ms=0, window_ms=0))
    assert infos["t"].error_code == UNKNOWN_TOPIC_OR_PARTITION and client.sent == 3


def test_an_answer_with_an_older_leader_epoch_is_stale(monkeypatch):
    clock = [0.0]
    with Scripted(answer({"t": 0}, epoch=5, brokers=THREE_BROKERS),
                  answer({"t": 0}, epoch=4, brokers=THREE_BROKERS),
                  answer({"t": 0}, epoch=6, brokers=THREE_BROKERS),
                  *[answer({"t": 0}, epoch=0, brokers=THREE_BROKERS)] * 2) as client:
        client.view = type(client.view)(confirm_ms=5_000, clock=lambda: clock[0])
        client.leaders([("t", 0)])
        with pytest.raises(RetriableBrokerError, match="older view.*t-0 epoch 4 < 5"):
            client.leaders([("t", 0)])
        assert client.leaders([("t", 0)]) == {("t", 0): 1}
        assert client.nodes[2] in (2, 3)               # asked another broker after that
        with pytest.raises(RetriableBrokerError, match="epoch 0 < 6"):
            client.metadata(["t"])
        clock[0] = 6.0                                  # recreated: epochs start again
        assert client.metadata(["t"])["t"].partitions[0].leader_epoch == 0


def test_topic_metadata_retries_transient_topic_errors():
    with Scripted(answer({"t": LEADER_NOT_AVAILABLE}), answer({"t": 0})) as client:
        assert client.topic_metadata(["t"], NO_WAIT)["t"].error_code == 0
    assert client.sent == 2


def test_topic_metadata_gives_up_within_its_bounds_naming_the_options():
    with Scripted(*[answer({"t": LEADER_NOT_AVAILABLE})] * 3) as client:
        with pytest.raises(BrokerUnavailableError) as info:
            client.topic_metadata(["t"], Retries(count=2, interval_ms=0, window_ms=0))
    message = str(info.value)
    assert "'fetchOffset.numRetries' = 2" in message and "'kafka.request.timeout.ms'" in message
    assert "'t': LeaderNotAvailableError" in message and "broker:9092" in message
    assert client.sent == 3


def test_leaders_of_a_missing_topic_is_a_clear_error_and_unauthorized_is_not_retried():
    # The partitions asked for existed (planned ranges): a second answer must agree.
    with Scripted(*[answer({"nope": UNKNOWN_TOPIC_OR_PARTITION})] * 2) as client:
        with pytest.raises(RetriableBrokerError, match="does not know nope-0"):
            client.leaders([("nope", 0)])
        with pytest.raises(TopicError, match="'nope' does not exist.*broker:9092"):
            client.leaders([("nope", 0)])
    with Scripted(answer({"secret": TOPIC_AUTHORIZATION_FAILED})) as client:
        info = client.topic_metadata(["secret"], NO_WAIT)["secret"]
        with pytest.raises(TopicError, match="'secret' cannot be read: TopicAuthorizationFailed"):
            readable_topic("secret", info, client.bootstrap_servers)
    assert client.sent == 1


# --- Retries ------------------------------------------------------------------------------------------

def test_retries_count_and_interval(monkeypatch):
    sleeps = []
    monkeypatch.setattr("kafka_source.wire.net.client.time.sleep", sleeps.append)
    calls = []

    def attempt():
        calls.append(1)
        raise RetriableBrokerError("down")

    with pytest.raises(BrokerUnavailableError, match="after 4 attempts"):
        Retries(count=3, interval_ms=250, window_ms=0).run(attempt, what="x", where="b:1")
    assert len(calls) == 4 and sleeps == [0.25] * 3


def test_retries_go_on_for_the_window(monkeypatch):
    # A restarting broker takes longer than 3 x 1 s: the window (the request timeout) decides.
    clock = [0.0]
    monkeypatch.setattr("kafka_source.wire.net.client.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("kafka_source.wire.net.client.time.sleep",
                        lambda s: clock.__setitem__(0, clock[0] + s))
    calls = []

    def attempt():
        calls.append(clock[0])
        if clock[0] < 12:           # back after 12 s
            raise RetriableBrokerError("connection refused")
        return "ok"

    assert Retries(count=3, interval_ms=1000, window_ms=30_000).run(
        attempt, what="x", where="b:1") == "ok"
    assert len(calls) == 13
    calls.clear()
    clock[0] = -100.0              # now down for 112 s: more than the window
    with pytest.raises(BrokerUnavailableError, match="30.0 s"):
        Retries(count=3, interval_ms=1000, window_ms=30_000).run(attempt, what="x", where="b:1")
    assert calls[-1] - calls[0] <= 30


def test_quick_retries_double_from_the_retry_backoff_up_to_the_interval(monkeypatch):
    """A leader moved (controlled shutdown, election): the next Metadata answer names the new
    one, so the first retry comes after kafka.retry.backoff.ms, as in Kafka's Java clients under
    Spark's own source, and the pauses grow to fetchOffset.retryIntervalMs for a broker that
    stays away. The window bounds them all the same."""
    clock = [0.0]
    sleeps = []
    monkeypatch.setattr("kafka_source.wire.net.client.time.monotonic", lambda: clock[0])

    def sleep(s):
        sleeps.append(round(s, 3))
        clock[0] += s

    monkeypatch.setattr("kafka_source.wire.net.client.time.sleep", sleep)
    failures = [2]

    def attempt():
        if failures[0]:
            failures[0] -= 1
            raise RetriableBrokerError("t-0: NotLeaderForPartitionError")
        return "ok"

    retries = Retries(count=3, interval_ms=1000, window_ms=30_000, quick_ms=100)
    assert retries.run(attempt, what="x", where="b:1") == "ok"
    assert sleeps == [0.1, 0.2]
    sleeps.clear()
    failures[0] = 10 ** 6
    with pytest.raises(BrokerUnavailableError, match="30.0 s|29.|after"):
        retries.run(attempt, what="x", where="b:1")
    assert sleeps[:6] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0] and set(sleeps[4:]) == {1.0}
    assert 29 <= sum(sleeps) <= 30


def test_retries_let_other_errors_through():
    def attempt():
        raise TopicError("no such topic")

    with pytest.raises(TopicError):
        Retries(count=5, interval_ms=0, window_ms=10_000).run(attempt, what="x", where="b:1")


def test_retries_never_spin_while_only_the_window_keeps_them_going(monkeypatch):
    clock = [0.0]
    sleeps = []
    monkeypatch.setattr("kafka_source.wire.net.client.time.monotonic", lambda: clock[0])

    def sleep(s):
        sleeps.append(s)
        clock[0] += s

    monkeypatch.setattr("kafka_source.wire.net.client.time.sleep", sleep)

    def attempt():
        raise RetriableBrokerError("down")

    with pytest.raises(BrokerUnavailableError):
        Retries(count=1, interval_ms=0, window_ms=1000).run(attempt, what="x", where="b:1")
    assert sleeps[0] == 0 and all(s >= 0.1 for s in sleeps[1:]) and len(sleeps) <= 11


# --- leader epochs: ListOffsets v4+ and OffsetsForLeaderEpoch (KIP-320) -------------------------

def epoch_end_answer(*partitions, version=2):
    """An OffsetsForLeaderEpoch response: (partition, error code, epoch, end offset) of t."""
    from kafka.protocol.consumer import OffsetForLeaderEpochResponse as R

    T = R.OffsetForLeaderTopicResult
    response = R(version=version, throttle_time_ms=0, topics=[T(topic="t", partitions=[
        T.EpochEndOffset(error_code=e, partition=p, leader_epoch=ep, end_offset=o)
        for p, e, ep, o in partitions])])
    return R.decode(response.encode(), version=version)


def list_offsets_answer(offset, epoch, version=4, error=0):
    from kafka.protocol.consumer import ListOffsetsResponse as R

    T = R.ListOffsetsTopicResponse
    response = R(version=version, throttle_time_ms=0, topics=[T(name="t", partitions=[
        T.ListOffsetsPartitionResponse(partition_index=0, error_code=error, timestamp=-1,
                                       offset=offset, leader_epoch=epoch)])])
    # as it comes off the wire, decoded by the request the client sends
    return LeanListOffsetsRequest.decode_body(memoryview(response.encode(version=version)),
                                              version)


def test_list_offsets_gives_the_leader_epoch_of_each_offset():
    client = Scripted(answer({"t": 0}, epoch=6), list_offsets_answer(42, 6))
    epochs = {}
    assert client.list_offsets({("t", 0): -1}, read_committed=False, epochs=epochs) == {
        ("t", 0): (42, -1)}
    assert epochs == {("t", 0): 6}


def test_list_offsets_right_after_metadata_routes_by_that_answer():
    # A trigger: the topics' metadata, then their latest offsets -- one Metadata request, not two.
    client = Scripted(answer({"t": 0}, epoch=6), list_offsets_answer(42, 6))
    client.topic_metadata(["t"], NO_WAIT)
    assert client.list_offsets({("t", 0): -1}, read_committed=False) == {("t", 0): (42, -1)}
    assert client.sent == 2
    assert client.nodes[1] == 1                        # the partition's leader in that answer


def test_list_offsets_looks_the_leaders_up_when_the_answer_is_old(monkeypatch):
    from kafka_source.wire.net import client as client_module

    client = Scripted(answer({"t": 0}), answer({"t": 0}), list_offsets_answer(42, 0))
    client.topic_metadata(["t"], NO_WAIT)
    monkeypatch.setattr(client_module, "_FRESH_LEADERS_MS", -1)
    assert client.list_offsets({("t", 0): -1}, read_committed=False) == {("t", 0): (42, -1)}
    assert client.sent == 3


def test_list_offsets_after_not_leader_looks_the_leaders_up_before_retrying():
    client = Scripted(answer({"t": 0}, epoch=6),
                      list_offsets_answer(-1, -1, error=NOT_LEADER_FOR_PARTITION),
                      answer({"t": 0}, epoch=7), list_offsets_answer(42, 7))
    client.topic_metadata(["t"], NO_WAIT)
    assert client.list_offsets({("t", 0): -1}, read_committed=False, retries=NO_WAIT) == {
        ("t", 0): (42, -1)}
    assert client.sent == 4                            # metadata, refused, metadata, answer


def test_epoch_end_offsets_asks_the_leader_with_the_current_epoch():
    client = Scripted(answer({"t": 0}, epoch=9, partitions=2),
                      epoch_end_answer((0, 0, 4, 20), (1, 0, -1, -1)))
    sent = []
    send = client.send
    client.send = lambda node, request, timeout_ms=None: (sent.append(request),
                                                          send(node, request))[1]
    assert client.epoch_end_offsets({("t", 0): 4, ("t", 1): 2}) == {("t", 0): (4, 20),
                                                                    ("t", 1): (-1, -1)}
    request = sent[-1]
    assert request._min_version == 2       # v2+: with the current leader epoch
    parts = {p.partition: (p.leader_epoch, p.current_leader_epoch)
             for p in request.topics[0].partitions}
    assert parts == {0: (4, 9), 1: (2, 9)}


@pytest.mark.parametrize("code", [6, 74, 75], ids=["not-leader", "fenced", "unknown-epoch"])
def test_epoch_end_offsets_retries_a_leader_change_with_new_metadata(code):
    client = Scripted(answer({"t": 0}, epoch=3), epoch_end_answer((0, code, -1, -1)),
                      answer({"t": 0}, epoch=4), epoch_end_answer((0, 0, 3, 17)))
    retries = Retries(count=3, interval_ms=0, window_ms=0)
    assert client.epoch_end_offsets({("t", 0): 3}, retries=retries) == {("t", 0): (3, 17)}
    assert client.sent == 4


def test_epoch_end_offsets_on_brokers_without_the_api_is_none():
    import kafka.errors as Errors

    client = Scripted(answer({"t": 0}),
                      Errors.IncompatibleBrokerVersion("no OffsetForLeaderEpoch v2"))
    assert client.epoch_end_offsets({("t", 0): 1}) is None


def test_epoch_end_offsets_unauthorized_is_a_clear_error():
    client = Scripted(answer({"t": 0}), epoch_end_answer((0, TOPIC_AUTHORIZATION_FAILED, -1, -1)))
    with pytest.raises(TopicError, match="t-0"):
        client.epoch_end_offsets({("t", 0): 1})


# --- a stream's trigger over many partitions: answers as they come off the wire -----------------

class OffTheWire(Scripted):
    """Answers scripted as the bytes of their body, decoded by the request as kafka-python's
    parser has it decode them (:meth:`LeanRequest.decode_answer`)."""

    def send(self, node_id, request, timeout_ms=None):
        step = super().send(node_id, request, timeout_ms)
        request.API_VERSION = VERSIONS[request.name]
        return request.decode_answer(memoryview(step), request.API_VERSION)


VERSIONS = {"Metadata": 9, "ListOffsets": 6}


def wire_metadata(topics: dict[str, int], **kwargs) -> bytes:
    """The body of :func:`answer` (Metadata v9) as a broker sends it."""
    return answer(topics, wire=True, **kwargs)


def wire_offsets(rows: dict[str, list[tuple[int, int, int, int]]]) -> bytes:
    """A ListOffsets v6 answer: topic -> (partition, error code, offset, leader epoch)."""
    from kafka.protocol.consumer import ListOffsetsResponse as R

    T = R.ListOffsetsTopicResponse
    return R(version=6, throttle_time_ms=0, topics=[T(name=t, partitions=[
        T.ListOffsetsPartitionResponse(partition_index=p, error_code=e, timestamp=-1, offset=o,
                                       leader_epoch=ep) for p, e, o, ep in parts])
        for t, parts in rows.items()]).encode(version=6)


def test_an_unchanged_metadata_answer_is_not_decoded_again(monkeypatch):
    from kafka_source.wire.net.planning_protocol import LeanMetadataRequest

    decoded = []
    original = LeanMetadataRequest.decode_body.__func__
    monkeypatch.setattr(LeanMetadataRequest, "decode_body", classmethod(
        lambda cls, buf, version: decoded.append(version) or original(cls, buf, version)))
    same = wire_metadata({"t": 0}, epoch=3, partitions=3)
    with OffTheWire(same, same, wire_metadata({"t": 0}, epoch=4, partitions=3), same) as client:
        client.view = type(client.view)(confirm_ms=5_000)
        first = client.metadata(["t"])
        again = client.metadata(["t"])
        assert len(decoded) == 1 and again == first
        assert [p.leader_epoch for p in again["t"].partitions.values()] == [3, 3, 3]
        # Other bytes (a leader election): decoded, and taken in
        moved = client.metadata(["t"])
        assert len(decoded) == 2 and moved["t"].partitions[0].leader_epoch == 4
        assert client.view.epoch(("t", 0)) == 4
        # The first bytes again are not the last answer any more: decoded, and doubted
        with pytest.raises(RetriableBrokerError, match="older view.*t-0 epoch 3 < 4"):
            client.metadata(["t"])
        assert len(decoded) == 3


def test_a_reused_metadata_answer_is_still_checked_against_what_was_seen_since():
    # The answer to ["t"] is kept; an answer to another question shows a newer leader epoch;
    # the same bytes for ["t"] again are not decoded, but still doubted.
    old = wire_metadata({"t": 0}, epoch=3)
    with OffTheWire(old, wire_metadata({"t": 0, "u": 0}, epoch=4), old) as client:
        client.view = type(client.view)(confirm_ms=5_000)
        client.metadata(["t"])
        client.metadata(["t", "u"])
        with pytest.raises(RetriableBrokerError, match="older view.*t-0 epoch 3 < 4"):
            client.metadata(["t"])


def test_a_reused_metadata_answer_can_be_changed_by_its_caller_without_harm():
    same = wire_metadata({"t": 0})
    with OffTheWire(same, same) as client:
        client.metadata(["t"]).clear()
        assert list(client.metadata(["t"])) == ["t"]


def wire_two_brokers(topics: dict[str, list[tuple[int, int]]]) -> bytes:
    """A Metadata v9 answer naming brokers 1 and 2: topic -> (leader, leader epoch) of each
    partition, numbered from 0."""
    from kafka.protocol.metadata import MetadataResponse as R

    P = R.MetadataResponseTopic.MetadataResponsePartition
    return R(version=9, throttle_time_ms=0, cluster_id="c", controller_id=1,
             brokers=[R.MetadataResponseBroker(node_id=n, host="h", port=n, rack=None)
                      for n in (1, 2)],
             topics=[R.MetadataResponseTopic(error_code=0, name=t, is_internal=False, partitions=[
                 P(error_code=0, partition_index=i, leader_id=leader, leader_epoch=epoch,
                   replica_nodes=[1, 2], isr_nodes=[1, 2], offline_replicas=[])
                 for i, (leader, epoch) in enumerate(parts)]) for t, parts in topics.items()]
             ).encode(version=9)


class Recording(OffTheWire):
    """Also keeps each ListOffsets request: (broker, {topic: [(partition, epoch, target)]})."""

    def __init__(self, *steps):
        super().__init__(*steps)
        self.asked = []

    def send(self, node_id, request, timeout_ms=None):
        if request.name == "ListOffsets":
            self.asked.append((node_id, {t: list(p) for t, p in request.partitions.items()}))
        return super().send(node_id, request, timeout_ms)


def test_list_offsets_routes_partitions_of_interleaved_topics_to_their_leaders():
    # Metadata: t-0, u-0 led by 1; t-1, u-1 led by 2. The offsets asked for interleave the
    # topics; each leader gets one request with its own partitions, each with its epoch.
    body = wire_two_brokers({"t": [(1, 5), (2, 6)], "u": [(1, 5), (2, 6)]})
    with Recording(body, wire_offsets({"t": [(0, 0, 10, 5)], "u": [(0, 0, 30, 5)]}),
                   wire_offsets({"u": [(1, 0, 40, 6)], "t": [(1, 0, 20, 6)]})) as client:
        client.topic_metadata(["t", "u"], NO_WAIT)
        epochs = {}
        got = client.list_offsets({("t", 0): -1, ("u", 1): -1, ("t", 1): -2, ("u", 0): 7},
                                  read_committed=False, epochs=epochs)
    assert client.asked == [(1, {"t": [(0, 5, -1)], "u": [(0, 5, 7)]}),
                     (2, {"u": [(1, 6, -1)], "t": [(1, 6, -2)]})]
    assert got == {("t", 0): (10, -1), ("u", 0): (30, -1), ("u", 1): (40, -1),
                   ("t", 1): (20, -1)}
    assert epochs == {("t", 0): 5, ("u", 0): 5, ("u", 1): 6, ("t", 1): 6}


@pytest.mark.parametrize("code, error", [(NOT_LEADER_FOR_PARTITION, BrokerUnavailableError),
                                         (29, TopicError)])   # TOPIC_AUTHORIZATION_FAILED
def test_a_partition_error_in_a_list_offsets_answer_off_the_wire_names_the_partition(code, error):
    with OffTheWire(wire_metadata({"t": 0}, partitions=3),
                    wire_offsets({"t": [(0, 0, 1, 0), (1, 0, 2, 0), (2, code, -1, -1)]})) as client:
        client.topic_metadata(["t"], NO_WAIT)
        with pytest.raises(error, match="t-2"):
            client.list_offsets({("t", p): -1 for p in range(3)}, read_committed=False,
                                retries=Retries(count=0, interval_ms=0, window_ms=0))


def test_list_offsets_splits_one_topic_between_its_leaders_in_the_order_asked():
    # v-0 and v-2 led by 1, v-1 and v-3 by 2, asked for as 3, 0, 1, 2 in one run
    body = wire_two_brokers({"v": [(1, 0), (2, 1), (1, 2), (2, 3)]})
    with Recording(body, wire_offsets({"v": [(0, 0, 10, 0), (2, 0, 12, 2)]}),
                   wire_offsets({"v": [(3, 0, 13, 3), (1, 0, 11, 1)]})) as client:
        client.topic_metadata(["v"], NO_WAIT)
        got = client.list_offsets({("v", 3): -1, ("v", 0): -1, ("v", 1): -2, ("v", 2): 5},
                                  read_committed=False)
    assert client.asked == [(1, {"v": [(0, 0, -1), (2, 2, 5)]}),
                            (2, {"v": [(3, 3, -1), (1, 1, -2)]})]
    assert got == {("v", 0): (10, -1), ("v", 2): (12, -1), ("v", 3): (13, -1),
                   ("v", 1): (11, -1)}


# --- a retry asks again only what failed (as Java's consumer keeps the offsets it has) ----------

def test_a_retry_asks_again_only_the_partition_whose_leader_moved():
    # v-0 and v-2 led by 1, v-1 and v-3 by 2; v-1's leadership moves to 1 (a controlled
    # shutdown of 2, a preferred election): broker 2 answers NOT_LEADER_OR_FOLLOWER for it.
    before = wire_two_brokers({"v": [(1, 0), (2, 0), (1, 0), (2, 0)]})
    after = wire_two_brokers({"v": [(1, 0), (1, 1), (1, 0), (2, 0)]})
    with Recording(before,
                   wire_offsets({"v": [(0, 0, 10, 0), (2, 0, 12, 0)]}),
                   wire_offsets({"v": [(1, NOT_LEADER_FOR_PARTITION, -1, -1), (3, 0, 13, 0)]}),
                   after, wire_offsets({"v": [(1, 0, 11, 1)]})) as client:
        client.topic_metadata(["v"], NO_WAIT)
        epochs = {}
        got = client.list_offsets({("v", p): -1 for p in range(4)}, read_committed=False,
                                  retries=NO_WAIT, epochs=epochs)
    assert client.asked == [(1, {"v": [(0, 0, -1), (2, 0, -1)]}),
                            (2, {"v": [(1, 0, -1), (3, 0, -1)]}),
                            (1, {"v": [(1, 1, -1)]})]       # only v-1, to its new leader
    assert got == {("v", 0): (10, -1), ("v", 1): (11, -1), ("v", 2): (12, -1),
                   ("v", 3): (13, -1)}
    assert epochs == {("v", 0): 0, ("v", 1): 1, ("v", 2): 0, ("v", 3): 0}


def test_a_broker_that_cannot_be_reached_costs_only_its_own_partitions():
    from kafka_source.errors import BrokerUnreachableError

    body = wire_two_brokers({"v": [(1, 0), (2, 0)]})
    with Recording(body, wire_offsets({"v": [(0, 0, 10, 0)]}),
                   BrokerUnreachableError("broker 2: connection refused"),
                   body, wire_offsets({"v": [(1, 0, 11, 0)]})) as client:
        client.topic_metadata(["v"], NO_WAIT)
        got = client.list_offsets({("v", 0): -1, ("v", 1): -1}, read_committed=False,
                                  retries=NO_WAIT)
    assert [node for node, _ in client.asked] == [1, 2, 2]
    assert client.asked[-1] == (2, {"v": [(1, 0, -1)]})
    assert got == {("v", 0): (10, -1), ("v", 1): (11, -1)}


def test_offsets_still_failing_when_the_retries_run_out_name_the_partition_and_what_is_left():
    from kafka_source.errors import BrokerUnreachableError

    body = wire_two_brokers({"v": [(1, 0), (2, 0), (2, 0)]})
    with Recording(body, wire_offsets({"v": [(0, 0, 10, 0)]}),
                   BrokerUnreachableError("broker 2: connection refused")) as client:
        client.topic_metadata(["v"], NO_WAIT)
        with pytest.raises(BrokerUnavailableError,
                           match=r"broker 2: connection refused; 2 of the 3 partitions"):
            client.list_offsets({("v", p): -1 for p in range(3)}, read_committed=False,
                                retries=Retries(count=0, interval_ms=0, window_ms=0))


def test_epoch_end_offsets_retries_only_the_partition_that_failed():
    client = Scripted(answer({"t": 0}, epoch=3, partitions=2),
                      epoch_end_answer((0, 0, 3, 20), (1, NOT_LEADER_FOR_PARTITION, -1, -1)),
                      answer({"t": 0}, epoch=4, partitions=2),
                      epoch_end_answer((1, 0, 3, 17)))
    sent = []
    send = client.send
    client.send = lambda node, request, timeout_ms=None: (sent.append(request),
                                                          send(node, request))[1]
    assert client.epoch_end_offsets({("t", 0): 3, ("t", 1): 3}, retries=NO_WAIT) == {
        ("t", 0): (3, 20), ("t", 1): (3, 17)}
    asked = [[p.partition for p in r.topics[0].partitions] for r in sent
             if r.API_KEY == 23]                      # OffsetsForLeaderEpoch
    assert asked == [[0, 1], [1]]
