"""The executor fetch loop against a scripted cluster: ranges, gaps, transactions, data loss."""

from __future__ import annotations

import pytest

from kafka_source.errors import BrokerUnavailableError, DataLossError, KafkaSourceError
from kafka_source.read.fetcher import FetchSettings, RangeFetcher
from kafka_source.read.offsets import OffsetRange

from .fake_cluster import NOT_LEADER_OR_FOLLOWER, FakeCluster, FakeLog, unreachable
from .record_builder import R, control_batch, v2_batch

TP = ("t", 0)


def settings(**kw):
    base = dict(read_committed=False, check_crcs=True, partition_max_bytes=1 << 20,
                max_bytes=50 << 20, max_wait_ms=10, min_bytes=1, retry_backoff_ms=1,
                poll_timeout_ms=300, fail_on_data_loss=True)
    base.update(kw)
    return FetchSettings(**base)


def values(n, start=0, prefix="v"):
    return [R(key=None, value=f"{prefix}{start + i}".encode()) for i in range(n)]


_PATH = {"name": "reference"}


@pytest.fixture(autouse=True, params=["reference", "arrow"])
def decode_path(request):
    """Run every test through both decoders: the reference one and the executors' Arrow one."""
    _PATH["name"] = request.param
    yield request.param
    _PATH["name"] = "reference"


def read_offsets(cluster, r, **kw):
    fetcher = RangeFetcher(cluster, settings(**kw))
    if _PATH["name"] == "arrow":
        return [o for batch in fetcher.read_arrow(r, include_headers=False)
                for o in batch.column("offset").to_pylist()]
    return [rec.offset for chunk in fetcher.read(r) for rec in chunk]


def test_reads_exactly_the_range_across_batches_and_mid_batch_starts():
    log = FakeLog(batches=[v2_batch(values(10), 0), v2_batch(values(10, 10), 10),
                           v2_batch(values(5, 20), 20)])
    cluster = FakeCluster({TP: log})
    assert read_offsets(cluster, OffsetRange("t", 0, 3, 17)) == list(range(3, 17))
    assert read_offsets(cluster, OffsetRange("t", 0, 0, 25)) == list(range(25))
    assert read_offsets(cluster, OffsetRange("t", 0, 24, 25)) == [24]


def test_small_fetch_size_pages_through_the_log():
    log = FakeLog(batches=[v2_batch(values(3, 3 * i), 3 * i) for i in range(20)])
    cluster = FakeCluster({TP: log})
    size = len(log.batches[0].data) * 2 + 5  # two whole batches and a truncated third per fetch
    got = read_offsets(cluster, OffsetRange("t", 0, 0, 60), partition_max_bytes=size)
    assert got == list(range(60))
    positions = [pos[TP] for _, pos in cluster.fetches]
    assert positions == sorted(set(positions))  # every fetch made progress
    assert len(positions) < 20                  # and some fetches carried several batches


def test_range_ending_in_transaction_markers_finishes():
    # offsets 0-4 data of producer 7, 5 commit marker; the range's last offset is the marker
    log = FakeLog(batches=[v2_batch(values(5), 0, transactional=True, producer_id=7,
                                    producer_epoch=0),
                           control_batch(5, 7, abort=False)])
    cluster = FakeCluster({TP: log})
    assert read_offsets(cluster, OffsetRange("t", 0, 0, 6)) == [0, 1, 2, 3, 4]
    assert read_offsets(cluster, OffsetRange("t", 0, 5, 6)) == []


def test_offset_gaps_from_compaction_end_the_range():
    # compacted log: offsets 0, 1, 7, 9 survive; range [2, 9) holds only offset 7
    log = FakeLog(batches=[v2_batch([R(value=b"a"), R(value=b"b")], 0),
                           v2_batch([R(value=b"c", offset_delta=0), R(value=b"d", offset_delta=2)],
                                    7)])
    cluster = FakeCluster({TP: log})
    assert read_offsets(cluster, OffsetRange("t", 0, 2, 9)) == [7]


def test_read_committed_drops_aborted_records_from_fetch_response():
    log = FakeLog(
        batches=[v2_batch(values(3), 0, transactional=True, producer_id=1, producer_epoch=0),
                 v2_batch(values(2, 3), 3, transactional=True, producer_id=2, producer_epoch=0),
                 control_batch(5, 1, abort=True),
                 control_batch(6, 2, abort=False),
                 v2_batch(values(2, 7), 7)],
        aborted=[(1, 0)])
    cluster = FakeCluster({TP: log})
    r = OffsetRange("t", 0, 0, 9)
    assert read_offsets(cluster, r, read_committed=True) == [3, 4, 7, 8]
    assert read_offsets(cluster, r, read_committed=False) == [0, 1, 2, 3, 4, 7, 8]


def test_follows_leader_change_and_retries_network_errors():
    log = FakeLog(batches=[v2_batch(values(4), 0)])
    cluster = FakeCluster({TP: log})
    cluster.script = [NOT_LEADER_OR_FOLLOWER, unreachable(), NOT_LEADER_OR_FOLLOWER]
    assert read_offsets(cluster, OffsetRange("t", 0, 0, 4)) == [0, 1, 2, 3]
    assert len(cluster.fetches) == 4


def test_gives_up_on_an_unreachable_leader_within_poll_timeout():
    cluster = FakeCluster({TP: FakeLog(batches=[v2_batch(values(4), 0)])})
    cluster.script = [unreachable() for _ in range(10_000)]
    with pytest.raises(KafkaSourceError, match=r"t-0 from offset 0.*kafkaConsumer.pollTimeoutMs"):
        read_offsets(cluster, OffsetRange("t", 0, 0, 4), poll_timeout_ms=200)


def test_a_broker_out_of_reach_is_retried_within_poll_timeout_not_failed_at_once():
    # A task that starts while the broker is gone (Spark's retry of a task that just failed,
    # say) cannot even bootstrap its client: BrokerUnavailableError after the request timeout.
    # Like any other unreachable broker that is retried until kafkaConsumer.pollTimeoutMs.
    gone = BrokerUnavailableError("Could not reach any Kafka broker at 'b:1' within 5 s")
    cluster = FakeCluster({TP: FakeLog(batches=[v2_batch(values(4), 0)])})
    cluster.script = [gone, gone]
    assert read_offsets(cluster, OffsetRange("t", 0, 0, 4)) == [0, 1, 2, 3]
    cluster.script = [gone for _ in range(10_000)]
    with pytest.raises(KafkaSourceError, match=r"Could not reach.*kafkaConsumer.pollTimeoutMs"):
        read_offsets(cluster, OffsetRange("t", 0, 0, 4), poll_timeout_ms=200)


def test_data_loss_below_log_start_fails_by_default():
    log = FakeLog(batches=[v2_batch(values(10, 10), 10)], log_start=10)
    cluster = FakeCluster({TP: log})
    with pytest.raises(DataLossError, match=r"Offsets 2 to 9 of t-0 are no longer in Kafka.*"
                                            r"failOnDataLoss"):
        read_offsets(cluster, OffsetRange("t", 0, 2, 15))


def test_data_loss_below_log_start_skips_with_fail_on_data_loss_false(caplog):
    log = FakeLog(batches=[v2_batch(values(10, 10), 10)], log_start=10)
    cluster = FakeCluster({TP: log})
    got = read_offsets(cluster, OffsetRange("t", 0, 2, 15), fail_on_data_loss=False)
    assert got == [10, 11, 12, 13, 14]
    assert "no longer in Kafka" in caplog.text
    # a range entirely deleted ends with nothing
    assert read_offsets(cluster, OffsetRange("t", 0, 2, 8), fail_on_data_loss=False) == []


def test_range_beyond_the_log_end_waits_then_fails_or_ends():
    cluster = FakeCluster({TP: FakeLog(batches=[v2_batch(values(5), 0)])})
    with pytest.raises(DataLossError, match=r"offsets 5 to 9 of the range \[0, 10\).*log ends at 5"):
        read_offsets(cluster, OffsetRange("t", 0, 0, 10), poll_timeout_ms=100)
    got = read_offsets(cluster, OffsetRange("t", 0, 0, 10), poll_timeout_ms=100,
                       fail_on_data_loss=False)
    assert got == [0, 1, 2, 3, 4]
