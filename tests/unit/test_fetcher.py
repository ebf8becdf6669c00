"""The executor fetch loop against a scripted cluster: ranges, gaps, transactions, data loss."""

from __future__ import annotations

import pytest

from kafka_source.errors import BrokerUnavailableError, DataLossError, KafkaSourceError
from kafka_source.read import fetcher as fetcher_module
from kafka_source.read.fetcher import FetchSettings, RangeFetcher
from kafka_source.read.offsets import OffsetRange

from .fake_cluster import (NOT_LEADER_OR_FOLLOWER, OFFSET_OUT_OF_RANGE, FakeCluster, FakeLog,
                           unreachable)
from .record_builder import R, control_batch, v2_batch

pytestmark = pytest.mark.pyspark_free

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


def test_out_of_range_inside_the_log_is_a_leader_change_not_loss():
    # A broker that is no longer the leader (or a new leader still catching up) may answer
    # OFFSET_OUT_OF_RANGE for an offset the partition's log holds: it used to end the range
    # as "beyond the end of the log" (issue 17, item 5).
    cluster = FakeCluster({TP: FakeLog(batches=[v2_batch(values(4), 0)])})
    cluster.script = [OFFSET_OUT_OF_RANGE, OFFSET_OUT_OF_RANGE]
    assert read_offsets(cluster, OffsetRange("t", 0, 0, 4)) == [0, 1, 2, 3]
    assert len(cluster.fetches) == 3


def test_the_leader_is_looked_up_again_before_offsets_are_called_missing():
    # The broker taken for the leader lists a shorter log (an election left it behind); the
    # leader looked up again has the offsets: they are read, not declared lost.
    log = FakeLog(batches=[v2_batch(values(5), 0)])
    cluster = FakeCluster({TP: log})
    lookups = []
    leaders = cluster.leaders

    def leaders_then_catch_up(tps):
        lookups.append(list(tps))
        if len(lookups) == 2:
            log.batches.append(v2_batch(values(5, 5), 5))
        return leaders(tps)

    cluster.leaders = leaders_then_catch_up
    assert read_offsets(cluster, OffsetRange("t", 0, 0, 10), poll_timeout_ms=100) == \
        list(range(10))
    assert len(lookups) == 2


# --- several partitions per task ----------------------------------------------------------------

def multi_cluster(n_partitions=4, batches=5, per_batch=10, **kw):
    logs = {("t", p): FakeLog(batches=[v2_batch(values(per_batch, per_batch * i, f"p{p}-"),
                                                per_batch * i) for i in range(batches)])
            for p in range(n_partitions)}
    return FakeCluster(logs, **kw)


def read_all(cluster, ranges, **kw):
    """(topic, partition, offset) of everything read, checking per-partition offset order."""
    fetcher = RangeFetcher(cluster, settings(**kw))
    if _PATH["name"] == "arrow":
        got = [(t, p, o) for batch in fetcher.read_arrow(ranges, include_headers=False)
               for t, p, o in zip(batch.column("topic").to_pylist(),
                                  batch.column("partition").to_pylist(),
                                  batch.column("offset").to_pylist())]
    else:
        got = []
        for chunk in fetcher.read(ranges):
            got.extend(("t", None, rec.offset) for rec in chunk)
    return got


def offsets_by_partition(got):
    out = {}
    for _t, p, o in got:
        out.setdefault(p, []).append(o)
    return out


@pytest.mark.parametrize("sessions", [False, True])
def test_several_partitions_are_fetched_together_and_read_exactly(sessions):
    cluster = multi_cluster(sessions=sessions)
    ranges = [OffsetRange("t", 0, 3, 47), OffsetRange("t", 1, 0, 50), OffsetRange("t", 2, 10, 11),
              OffsetRange("t", 3, 49, 50)]
    got = read_all(cluster, ranges, partition_max_bytes=300)  # a few batches per fetch
    if _PATH["name"] == "arrow":
        assert offsets_by_partition(got) == {0: list(range(3, 47)), 1: list(range(50)),
                                             2: [10], 3: [49]}
    else:
        assert sorted(o for *_, o in got) == sorted(list(range(3, 47)) + list(range(50))
                                                    + [10, 49])
    first = cluster.fetches[0][1]
    assert set(first) == {("t", p) for p in range(4)}      # one request for all of them
    # every request asks only for unfinished partitions, at positions that moved forward
    for _node, positions in cluster.fetches:
        for tp, offset in positions.items():
            r = ranges[tp[1]]
            assert r.start <= offset < r.end


def test_incremental_fetch_sessions_list_only_what_changed():
    cluster = multi_cluster(sessions=True)
    ranges = [OffsetRange("t", p, 0, 50) for p in range(3)] + [OffsetRange("t", 3, 0, 10)]
    got = read_all(cluster, ranges, partition_max_bytes=300)
    assert len(got) == 160
    requests = [r for _node, r in cluster.requests]
    assert requests[0].full and set(requests[0].partitions) == {("t", p) for p in range(4)}
    assert not any(r.full for r in requests[1:])
    # partition 3 is done after its first responses and is forgotten, never asked for again
    forgotten_at = next(i for i, r in enumerate(requests) if ("t", 3) in r.forgotten)
    assert all(("t", 3) not in r.wanted for r in requests[forgotten_at:])
    # after the first request, each one lists only partitions whose position moved
    for before, after in zip(requests, requests[1:]):
        assert all(before.wanted.get(tp) != p for tp, p in after.partitions.items())


def test_partitions_without_news_are_left_out_of_incremental_responses():
    # partition 1's range ends beyond its log: it waits (omitted from responses) while the
    # others are read; then, with failOnDataLoss=false, it ends early.
    cluster = multi_cluster(n_partitions=2, sessions=True)
    got = read_all(cluster, [OffsetRange("t", 0, 0, 50), OffsetRange("t", 1, 40, 60)],
                   poll_timeout_ms=200, fail_on_data_loss=False)
    assert len(got) == 60


def test_next_request_is_sent_before_decoding_and_no_request_is_left_over():
    cluster = multi_cluster(n_partitions=2)
    fetcher = RangeFetcher(cluster, settings(partition_max_bytes=300))
    ranges = [OffsetRange("t", 0, 0, 50), OffsetRange("t", 1, 0, 50)]
    it = fetcher.read(ranges) if _PATH["name"] == "reference" \
        else fetcher.read_arrow(ranges, include_headers=False)
    next(it)                                   # the first decoded output ...
    assert len(cluster.requests) == 2          # ... comes after the second request went out
    for _ in it:
        pass
    conns = cluster.fetch_connections()
    assert conns._conns and not any(c.in_flight for c in conns._conns.values())
    assert len(cluster.fetches) == len(cluster.requests)   # nothing sent that was not needed


def test_a_task_stopped_early_closes_the_connection_with_a_request_in_flight():
    cluster = multi_cluster(n_partitions=2)
    fetcher = RangeFetcher(cluster, settings(partition_max_bytes=300))
    it = fetcher.read([OffsetRange("t", 0, 0, 50), OffsetRange("t", 1, 0, 50)])
    next(it)
    conn = cluster.fetch_connections()._conns[1]
    assert conn.in_flight
    it.close()                                 # Spark stopped reading (e.g. a limit)
    assert conn.closed and not cluster.fetch_connections()._conns


def test_a_wrong_guess_of_the_next_position_is_ignored(monkeypatch):
    """Well-formed batches never make the header scan and the decoder disagree; if they did,
    the part of the next response fetched at the guessed position is ignored."""
    import kafka_source.read.fetcher as fetcher_module

    real = fetcher_module.scan_batches

    def off_by_two(view, *, start_offset, end_offset):
        scan = real(view, start_offset=start_offset, end_offset=end_offset)
        return type(scan)(scan.next_offset + 2, scan.batches, scan.nbytes)

    monkeypatch.setattr(fetcher_module, "scan_batches", off_by_two)
    cluster = multi_cluster(n_partitions=2)
    got = read_all(cluster, [OffsetRange("t", 0, 0, 50), OffsetRange("t", 1, 5, 30)],
                   partition_max_bytes=300)
    if _PATH["name"] == "arrow":
        assert offsets_by_partition(got) == {0: list(range(50)), 1: list(range(5, 30))}
    else:
        assert sorted(o for *_, o in got) == sorted(list(range(50)) + list(range(5, 30)))


def test_one_partition_moving_its_leader_does_not_hold_up_the_others():
    cluster = multi_cluster(n_partitions=3)
    cluster.leaders_by_partition[("t", 1)] = 2      # partition 1 is led by broker 2
    got = read_all(cluster, [OffsetRange("t", p, 0, 50) for p in range(3)],
                   partition_max_bytes=300)
    assert len(got) == 150
    served = {(node, tp) for node, positions in cluster.fetches for tp in positions}
    assert served == {(1, ("t", 0)), (1, ("t", 2)), (2, ("t", 1))}
    assert sorted(set(cluster.opened)) == [1, 2]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_deleted_while_its_range_is_read_is_data_loss(fail_on_data_loss, caplog):
    cluster = multi_cluster(n_partitions=1)
    cluster.logs[("gone", 0)] = FakeLog(batches=[v2_batch(values(10, 10 * i), 10 * i)
                                                 for i in range(5)])
    fetch = cluster.fetch

    def deleting_after_first_fetch(node_id, positions, **kw):
        response = fetch(node_id, positions, **kw)
        cluster.logs.pop(("gone", 0), None)      # the topic is deleted meanwhile
        return response

    cluster.fetch = deleting_after_first_fetch
    ranges = [OffsetRange("t", 0, 0, 50), OffsetRange("gone", 0, 0, 50)]
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=r"gone-0 no longer exists \(Topic 'gone' does "
                                                r"not exist.*offsets 10 to 49.*failOnDataLoss"):
            read_all(cluster, ranges, partition_max_bytes=300)
        return
    got = read_all(cluster, ranges, partition_max_bytes=300, fail_on_data_loss=False)
    offsets = [o for _, _, o in got]
    assert len(got) == 60                         # all of t-0, and what gone-0 gave before
    assert sorted(offsets) == sorted(list(range(50)) + list(range(10)))
    assert "gone-0 no longer exists" in caplog.text and "Skipping" in caplog.text


def test_partition_errors_back_off_that_partition_only():
    cluster = multi_cluster(n_partitions=2)
    orig = cluster.fetch
    failures = {"left": 3}

    def flaky(node_id, positions, **kw):
        response = orig(node_id, positions, **kw)
        for t in response.responses:
            for p in t.partitions:
                if p.partition_index == 1 and failures["left"]:
                    failures["left"] -= 1
                    p.error_code, p.records = NOT_LEADER_OR_FOLLOWER, b""
        return response

    cluster.fetch = flaky
    got = read_all(cluster, [OffsetRange("t", 0, 0, 50), OffsetRange("t", 1, 0, 50)],
                   partition_max_bytes=300, retry_backoff_ms=20)
    assert len(got) == 100 and failures["left"] == 0


def _spy_limits(cluster) -> list[dict]:
    """The per-partition byte limits of every Fetch the cluster gets, as a list to look at."""
    limits = []
    orig = cluster.fetch

    def spy(node_id, positions, **kw):
        limits.append(dict(kw["partition_max_bytes"]))
        return orig(node_id, positions, **kw)

    cluster.fetch = spy
    return limits


def test_the_last_request_of_a_range_asks_for_about_what_it_needs():
    cluster = multi_cluster(n_partitions=1, batches=40, per_batch=10)
    read_all(cluster, [OffsetRange("t", 0, 0, 400)], partition_max_bytes=2000)
    batch_bytes = len(cluster.logs[("t", 0)].batches[0].data)
    # learned sizes carry over to the next task on this worker: a 15-record range
    limits = _spy_limits(cluster)
    assert len(read_all(cluster, [OffsetRange("t", 0, 100, 115)],
                        partition_max_bytes=1 << 20)) == 15
    assert limits and limits[0][("t", 0)] <= max(64 << 10, 4 * batch_bytes + 4096) < 1 << 20


def test_the_requests_of_a_range_ramp_up_to_the_partition_limit(monkeypatch):
    """The first request of a range asks for _FIRST_REQUEST_BYTES, each next one twice as much,
    up to kafka.max.partition.fetch.bytes: Spark gets the first records after a small response."""
    monkeypatch.setattr(fetcher_module, "_FIRST_REQUEST_BYTES", 500)
    cluster = multi_cluster(n_partitions=1, batches=60, per_batch=10)
    limits = _spy_limits(cluster)
    assert len(read_all(cluster, [OffsetRange("t", 0, 0, 600)], partition_max_bytes=4000)) == 600
    asked = [lim[("t", 0)] for lim in limits]
    assert asked[:4] == [500, 1000, 2000, 4000], asked
    assert max(asked) == 4000 and len(asked) > 5


def test_a_batch_larger_than_the_ramp_limit_is_fetched_at_the_partition_limit(monkeypatch, caplog):
    """A partition behind another in the response gets no batch larger than its limit (KIP-74):
    its ramp ends at once, and the configured limit is not raised for it."""
    monkeypatch.setattr(fetcher_module, "_FIRST_REQUEST_BYTES", 200)
    logs = {("t", 0): FakeLog(batches=[v2_batch(values(5, 5 * i), 5 * i) for i in range(10)]),
            ("t", 1): FakeLog(batches=[v2_batch(values(10, 0, "x" * 60), 0)])}
    assert 400 < len(logs[("t", 1)].batches[0].data) < 2000
    cluster = FakeCluster(logs, strict_batch_limit=True)
    limits = _spy_limits(cluster)
    with caplog.at_level("INFO", logger="kafka_source.read.fetcher"):
        got = read_all(cluster, [OffsetRange("t", 0, 0, 50), OffsetRange("t", 1, 0, 10)],
                       partition_max_bytes=2000)
    assert len(got) == 60
    # 400: the request already in flight when the first response showed the batch did not fit
    assert [lim[("t", 1)] for lim in limits if ("t", 1) in lim][:3] == [200, 400, 2000]
    assert "fits in" not in caplog.text


def test_an_oversized_batch_behind_another_partition_is_still_read():
    # Kafka returns a batch larger than the partition limit only for the first partition with
    # data in a response; the starved partition goes first next time and gets more room.
    big = {("t", 0): FakeLog(batches=[v2_batch(values(20, 0, "x" * 200), 0)]),
           ("t", 1): FakeLog(batches=[v2_batch(values(5, 5 * i), 5 * i) for i in range(10)])}
    cluster = FakeCluster(big, strict_batch_limit=True)
    ranges = [OffsetRange("t", 1, 0, 50), OffsetRange("t", 0, 0, 20)]
    got = read_all(cluster, ranges, partition_max_bytes=500)
    assert len(got) == 70


# --- leader epochs (KIP-320) ------------------------------------------------------------------

def test_each_fetch_carries_the_leader_epoch_of_the_newest_metadata():
    cluster = FakeCluster({TP: FakeLog(batches=[v2_batch(values(4), 0)])}, sessions=True)
    cluster.epochs[TP] = 7
    assert read_offsets(cluster, OffsetRange("t", 0, 0, 4)) == [0, 1, 2, 3]
    sent = [p.leader_epoch for _, request in cluster.requests
            for tp, p in request.partitions.items() if tp == TP]
    assert sent and set(sent) == {7}


def test_a_fenced_leader_epoch_makes_the_leader_looked_up_again():
    # The leader was re-elected (epoch 3 -> 4) after this task looked it up: the broker refuses
    # epoch 3, the task asks for the leader again and reads on with epoch 4.
    log = FakeLog(batches=[v2_batch(values(2), 0), v2_batch(values(2, 2), 2)])
    cluster = FakeCluster({TP: log})
    cluster.epochs[TP] = 3
    fetcher = RangeFetcher(cluster, settings())
    cluster.view.check_epochs(1, {TP: 3})
    cluster.epochs[TP] = 4                        # the broker leads epoch 4 now
    got = [rec.offset for chunk in fetcher.read(OffsetRange("t", 0, 0, 4)) for rec in chunk]
    assert got == [0, 1, 2, 3]
    assert cluster.view.epoch(TP) == 4


def test_a_broker_behind_the_leader_epoch_is_retried_until_it_caught_up():
    # Metadata already names broker 1 leader of epoch 5, but broker 1 has not applied it yet:
    # UNKNOWN_LEADER_EPOCH, retried (not read from its log of epoch 4, not an error).
    cluster = FakeCluster({TP: FakeLog(batches=[v2_batch(values(4), 0)])})
    cluster.epochs[TP] = 5
    cluster.broker_epochs[(1, TP)] = 4
    answers = []
    serve = cluster.fetch

    def fetch(node_id, positions, **kw):
        response = serve(node_id, positions, **kw)
        answers.append([p.error_code for t in response.responses for p in t.partitions])
        if len(answers) == 2:
            del cluster.broker_epochs[(1, TP)]    # caught up
        return response

    cluster.fetch = fetch
    assert read_offsets(cluster, OffsetRange("t", 0, 0, 4)) == [0, 1, 2, 3]
    assert answers[:2] == [[75], [75]] and answers[2] == [0]


# --- truncation after an unclean leader election, seen by the executor (KIP-320) ---------------

def truncated_log():
    """Offsets 0-9 written in leader epoch 3; then an unclean election: the new leader's log
    ended at 6 and it wrote offsets 6-14 in epoch 5 (other records than the old 6-9)."""
    return FakeLog(batches=[v2_batch(values(6), 0, partition_leader_epoch=3),
                            v2_batch(values(9, 6, prefix="new"), 6, partition_leader_epoch=5)])


def test_records_of_a_newer_epoch_inside_a_planned_range_are_data_loss():
    """The range [2, 10) was planned while the log was in epoch 3; the log now holds epoch-5
    records from 6: the task fails naming the partition, the offsets and the cause (it used to
    read the new records 6-9 as if they were the planned ones)."""
    cluster = FakeCluster({TP: truncated_log()})
    with pytest.raises(DataLossError) as info:
        read_offsets(cluster, OffsetRange("t", 0, 2, 10, epoch=3))
    message = str(info.value)
    for part in ("t-0", "from offset 6", "epoch 5", "unclean leader election", "failOnDataLoss"):
        assert part in message


def test_fail_on_data_loss_false_ends_the_range_where_the_log_diverged():
    cluster = FakeCluster({TP: truncated_log()})
    assert read_offsets(cluster, OffsetRange("t", 0, 2, 10, epoch=3),
                        fail_on_data_loss=False) == [2, 3, 4, 5]
    # A range starting past the divergence reads nothing of the new records.
    assert read_offsets(cluster, OffsetRange("t", 0, 7, 10, epoch=3),
                        fail_on_data_loss=False) == []


def test_ranges_planned_in_the_new_epoch_or_without_one_read_as_before():
    cluster = FakeCluster({TP: truncated_log()})
    assert read_offsets(cluster, OffsetRange("t", 0, 2, 12, epoch=5)) == list(range(2, 12))
    assert read_offsets(cluster, OffsetRange("t", 0, 2, 12)) == list(range(2, 12))
    # Records of the planned epoch and older only: nothing to report.
    assert read_offsets(cluster, OffsetRange("t", 0, 0, 6, epoch=3)) == list(range(6))


# --- coalesce: small Arrow batches go to Spark together ------------------------------------

def _arrow_batches(sizes, width=10):
    import pyarrow as pa

    schema = pa.schema([pa.field("offset", pa.int64(), nullable=False),
                        pa.field("value", pa.binary(), nullable=True)])
    out, start = [], 0
    for n in sizes:
        out.append(pa.RecordBatch.from_arrays(
            [pa.array(range(start, start + n), pa.int64()),
             pa.array([b"x" * width] * n, pa.binary())], schema=schema))
        start += n
    return out


def test_coalesce_joins_runs_of_small_batches_in_order_and_keeps_the_schema():
    batches = _arrow_batches([2] * 100)
    out = list(fetcher_module.coalesce(batches, max_bytes=1 << 20))
    assert len(out) == 1
    assert out[0].schema.equals(batches[0].schema)          # nullability included
    assert out[0].column("offset").to_pylist() == list(range(200))


def test_coalesce_flushes_at_the_limit_and_passes_large_batches_through_after_the_held_ones():
    small = _arrow_batches([3] * 10)
    limit = 4 * small[0].nbytes
    out = list(fetcher_module.coalesce(small, max_bytes=limit))
    assert [b.num_rows for b in out] == [12, 12, 6]
    assert [o for b in out for o in b.column("offset").to_pylist()] == list(range(30))
    mixed = _arrow_batches([1, 1, 500, 1])
    big = mixed[2]
    out = list(fetcher_module.coalesce(mixed, max_bytes=big.nbytes))
    assert [b.num_rows for b in out] == [2, 500, 1]
    assert out[1] is big                                       # not copied
    assert [o for b in out for o in b.column("offset").to_pylist()] == list(range(503))


def test_coalesce_without_pyarrow_concat_batches(monkeypatch):
    import pyarrow as pa

    monkeypatch.delattr(pa, "concat_batches", raising=False)
    batches = _arrow_batches([2, 3, 4])
    out = list(fetcher_module.coalesce(batches, max_bytes=1 << 20))
    assert len(out) == 1 and out[0].num_rows == 9
    assert out[0].column("offset").to_pylist() == list(range(9))


def test_a_task_over_many_partitions_yields_one_batch_of_every_record():
    cluster = multi_cluster(n_partitions=40, batches=1, per_batch=2)
    fetcher = RangeFetcher(cluster, settings())
    ranges = [OffsetRange("t", p, 0, 2) for p in range(40)]
    out = list(fetcher.read_arrow(ranges, include_headers=False))
    assert len(out) == 1
    got = sorted(zip(out[0].column("partition").to_pylist(), out[0].column("offset").to_pylist()))
    assert got == [(p, o) for p in range(40) for o in range(2)]


# --- a worker's later tasks start from the leaders its client looked up -------------------

def test_a_later_task_on_the_same_client_does_not_look_the_leaders_up_again():
    cluster = multi_cluster(n_partitions=4)
    got = read_all(cluster, [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 10)])
    assert len(got) == 20 and len(cluster.leader_lookups) == 1
    # Partitions the first task did not read are known too: the answer covered the topic.
    got = read_all(cluster, [OffsetRange("t", 2, 0, 10), OffsetRange("t", 3, 10, 20)])
    assert len(got) == 20 and len(cluster.leader_lookups) == 1


def test_a_leader_that_moved_since_an_earlier_task_is_looked_up_and_the_range_read_whole():
    cluster = multi_cluster(n_partitions=2)
    read_all(cluster, [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 10)])
    cluster.leaders_by_partition[("t", 1)] = 2        # an election since
    got = read_all(cluster, [OffsetRange("t", 0, 10, 30), OffsetRange("t", 1, 10, 30)])
    assert offsets_by_partition(got) == {0: list(range(10, 30)), 1: list(range(10, 30))} \
        if _PATH["name"] == "arrow" else len(got) == 40
    assert (1, {("t", 0): 10, ("t", 1): 10}) in cluster.fetches   # the old leader, cached ...
    assert any(node == 2 for node, _ in cluster.fetches)   # ... then the new one
    assert len(cluster.leader_lookups) == 2


def test_cached_leaders_older_than_metadata_max_age_are_looked_up():
    cluster = multi_cluster(n_partitions=1)
    read_all(cluster, [OffsetRange("t", 0, 0, 10)])
    read_all(cluster, [OffsetRange("t", 0, 10, 20)], leader_max_age_ms=-1)
    assert len(cluster.leader_lookups) == 2


def test_small_batches_held_for_spark_go_out_before_the_loop_waits_for_the_network():
    # A slow consumer must get the first response's records before the next one is awaited
    # (what lets a SASL session expire mid-read, and Spark work while the broker sends).
    cluster = multi_cluster(n_partitions=1, batches=5, per_batch=10)
    fetcher = RangeFetcher(cluster, settings(partition_max_bytes=300))
    it = fetcher.read_arrow([OffsetRange("t", 0, 0, 50)], include_headers=False)
    first = next(it)
    assert first.num_rows < 50
    assert len(cluster.fetches) <= 2           # the first response and the one in flight
    rest = [o for b in it for o in b.column("offset").to_pylist()]
    assert first.column("offset").to_pylist() + rest == list(range(50))


def test_coalesce_hands_on_what_it_holds_at_a_wait_marker():
    batches = _arrow_batches([2, 3, 4])
    out = list(fetcher_module.coalesce([batches[0], None, batches[1], batches[2], None],
                                       max_bytes=1 << 20))
    assert [b.num_rows for b in out] == [2, 7]
