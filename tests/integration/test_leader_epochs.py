"""Leader epochs on a real broker (KIP-320): what truncation detection is built on.

ListOffsets (v4+) gives the leader's epoch with the latest offset; OffsetsForLeaderEpoch (v2+)
says where an epoch ends in the leader's log; a range planned with that epoch reads a real
broker's record batches without a false alarm (their ``partition_leader_epoch`` is not newer).
Both APIs exist from Kafka 2.1, so this runs on Kafka 4.0 and 2.2 alike. The truncation itself
needs an unclean leader election, i.e. several brokers: ``tests/cluster/test_scenarios.py``
(``test_unclean_leader_election_truncates_the_log``); the reactions to it are unit-tested on
the fake cluster (``tests/unit/test_stream_planning.py``, ``tests/unit/test_fetcher.py``).
"""

from __future__ import annotations

import pytest
from kafka import KafkaProducer

from kafka_source.config.client_config import client_config_from_options
from kafka_source.read.fetcher import FetchSettings, RangeFetcher
from kafka_source.read.offsets import OffsetRange
from kafka_source.testing import create_topic, unique_topic_name
from kafka_source.wire.net.client import BrokerClient

pytestmark = pytest.mark.skip_on_embedded(
    "checks Apache Kafka's leader epochs (KIP-320 replication); on Tansu, reads with epochs in "
    "their ranges are covered by the batch and stream tests")


def test_latest_offset_comes_with_the_leader_epoch_that_ends_there(bootstrap_servers):
    topic = unique_topic_name("epochs")
    create_topic(bootstrap_servers, topic, 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5)
    try:
        for i in range(25):
            producer.send(topic, f"v{i}".encode(), partition=0)
        producer.flush(30)
    finally:
        producer.close(10)
    tp = (topic, 0)
    config = client_config_from_options({"kafka.bootstrap.servers": bootstrap_servers})
    with BrokerClient(config) as client:
        epochs = {}
        assert client.list_offsets({tp: -1}, read_committed=False, epochs=epochs)[tp][0] == 25
        epoch = epochs[tp]
        assert epoch >= 0
        # The current epoch ends at the log end; nothing was truncated below 25.
        assert client.epoch_end_offsets({tp: epoch}) == {tp: (epoch, 25)}
        # The range's records carry that epoch: read whole, no truncation reported.
        settings = FetchSettings.from_config(config, poll_timeout_ms=30_000,
                                             fail_on_data_loss=True)
        fetcher = RangeFetcher(client, settings)
        offsets = [o for batch in fetcher.read_arrow(OffsetRange(topic, 0, 0, 25, epoch),
                                                     include_headers=False)
                   for o in batch.column("offset").to_pylist()]
        assert offsets == list(range(25))


def test_a_streams_commits_carry_the_leader_epoch_and_a_restart_pairs_it(bootstrap_servers):
    """The stream's group commits carry the leader epoch of each committed offset, as Kafka's
    Java consumer commits (OffsetCommit v6+, Kafka 2.1+): kafka-python's admin client reads it
    back, and a reader restarted from a checkpoint at that offset pairs the offset with it --
    what its first trigger validates against the current leader, so that a truncation while
    the query was down is found (the truncation itself: tests/cluster, the reaction:
    tests/unit/test_stream_planning.py)."""
    from kafka import KafkaAdminClient, TopicPartition
    from kafka_source.spark_features import ReadAllAvailable

    from kafka_source.config.options import parse_stream_options
    from kafka_source.read.stream import KafkaStreamReader, decode_offsets

    topic = unique_topic_name("epoch-commits")
    create_topic(bootstrap_servers, topic, 2)
    group = unique_topic_name("g-epoch-commits")
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all")
    try:
        for i in range(30):
            producer.send(topic, f"v{i}".encode(), partition=i % 2)
        producer.flush(30)
    finally:
        producer.close(10)
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic,
               "kafka.group.id": group, "startingOffsets": "earliest"}
    config = client_config_from_options({"kafka.bootstrap.servers": bootstrap_servers})
    with BrokerClient(config) as client:
        epochs: dict = {}
        client.list_offsets({(topic, p): -1 for p in range(2)}, read_committed=False,
                            epochs=epochs)
    assert sorted(epochs) == [(topic, 0), (topic, 1)] and min(epochs.values()) >= 0

    reader = KafkaStreamReader(parse_stream_options(options))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert decode_offsets(end) == {(topic, 0): 15, (topic, 1): 15}
        reader.commit(end)                 # Spark: the batch up to ``end`` is done
        reader.latestOffset(end, ReadAllAvailable())   # settles the commit
    finally:
        reader.stop()

    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        committed = admin.list_group_offsets(group)[group]
    finally:
        admin.close()
    assert {(tp.partition, om.offset, om.leader_epoch) for tp, om in committed.items()} == {
        (p, 15, epochs[(topic, p)]) for p in range(2)}

    restarted = KafkaStreamReader(parse_stream_options(options))
    try:
        assert restarted.latestOffset(end, ReadAllAvailable()) == end   # nothing new
        assert restarted._truncation.marks == {(topic, p): (15, epochs[(topic, p)])
                                               for p in range(2)}
    finally:
        restarted.stop()
