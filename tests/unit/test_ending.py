"""Unit tests of ending many transactions at once (:mod:`kafka_source.write.ending`) and of the
exactly-once sink's use of it -- the driver's commit of a micro-batch (``_end_all``) and a
re-run's settling of the recorded transactions (``_settle``) -- against the scripted cluster of
:mod:`tests.unit.fake_produce_cluster`, which counts round trips and requests in flight.

The counts are the point: ended one after another, n transactions cost 2n round trips (a
FindCoordinator, then an EndTxn, each waiting for the one before).
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import kafka.errors as Errors
import pytest

from .fake_produce_cluster import (CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS,
                                   COORDINATOR_NOT_AVAILABLE, KAFKA_2_2_VERSIONS,
                                   NOT_COORDINATOR, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                   FakeProduceCluster)
from kafka_source.errors import ProduceError
from kafka_source.write import exactly_once
from kafka_source.write.exactly_once import (MarkerEntry, TransactionCommitError, _end_all,
                                             _Ends, _settle, _settle_once, transactional_id)
from kafka_source.write.producer import (TransactionFencedError, TransactionHandle,
                                         end_transactions)

pytestmark = pytest.mark.pyspark_free

N = 50
STORE = SimpleNamespace(group="app-q")


def open_transactions(cluster, n=N, prefix="app-q"):
    """(task, handle) of ``n`` open transactions, one per task, as a micro-batch leaves them."""
    written = []
    for task in range(n):
        tid = f"{prefix}-{task}"
        pid, epoch = cluster.begin(tid, [("out", task % 4)])
        written.append((task, TransactionHandle(tid, pid, epoch, (("out", task % 4),))))
    return written


def states(cluster, handles):
    return [cluster.transactions[h.transactional_id]["state"] for h in handles]


def end_txn_count(cluster, tid):
    return sum(1 for _, t, _ in cluster.ends if t == tid)


# --- the driver's commit of a micro-batch -----------------------------------------------------

def test_the_driver_commits_fifty_transactions_in_a_bounded_number_of_round_trips():
    cluster = FakeProduceCluster({"out": 4})
    written = open_transactions(cluster)
    _end_all(_Ends(cluster), written, STORE, 7)
    assert states(cluster, [h for _, h in written]) == ["CompleteCommit"] * N
    # One FindCoordinator for all 50 ids (v4, KIP-699), then the EndTxns five at a time --
    # the connection's limit -- on the one coordinator: 1 + 10 round trips, not 2 x 50.
    assert cluster.lookups == [(6, [h.transactional_id for _, h in written])]
    assert cluster.round_trips == 1 + N // 5
    assert cluster.txn_in_flight_peak == 5
    assert cluster.refused == 0                   # never past the connection's limit
    assert all(end_txn_count(cluster, h.transactional_id) == 1 for _, h in written)


def test_from_a_kafka_2_2_coordinators_are_looked_up_one_id_a_request_but_together():
    cluster = FakeProduceCluster({"out": 4}, versions=KAFKA_2_2_VERSIONS)
    written = open_transactions(cluster)
    _end_all(_Ends(cluster), written, STORE, 7)
    assert states(cluster, [h for _, h in written]) == ["CompleteCommit"] * N
    # FindCoordinator v2 has one key: 50 requests, five in flight to the broker, each id's
    # EndTxn sent as soon as its coordinator is known (beside the next lookups).
    assert sorted(keys[0] for _, keys in cluster.lookups) == \
        sorted(h.transactional_id for _, h in written)
    assert {(version, len(keys)) for version, keys in cluster.lookups} == {(2, 1)}
    assert cluster.round_trips <= N // 5 + 2
    assert cluster.txn_in_flight_peak == 10       # five lookups beside five EndTxns
    assert cluster.refused == 0


def test_each_coordinator_gets_its_share_in_flight():
    cluster = FakeProduceCluster({"out": 4}, brokers=(1, 2, 3))
    written = open_transactions(cluster)
    per_broker = {}
    for _, h in written:
        b = cluster.txn_coordinator(h.transactional_id)
        per_broker[b] = per_broker.get(b, 0) + 1
    assert len(per_broker) == 3                   # the ids spread over the three brokers
    _end_all(_Ends(cluster), written, STORE, 7)
    assert states(cluster, [h for _, h in written]) == ["CompleteCommit"] * N
    assert {node for node, _, _ in cluster.ends} == {f"coordinator-{b}" for b in per_broker}
    assert all(cluster.in_flight_peak.get(f"coordinator-{b}", 0) == 5 for b in per_broker)
    assert cluster.txn_in_flight_peak == 15
    assert cluster.round_trips == 1 + -(-max(per_broker.values()) // 5)
    assert cluster.refused == 0


def test_coordinator_moves_and_concurrent_transactions_are_retried_while_the_others_commit():
    cluster = FakeProduceCluster({"out": 4}, brokers=(1, 2))
    written = open_transactions(cluster)
    tid = {task: h.transactional_id for task, h in written}
    for task in (3, 7):                           # the coordinator is still completing
        cluster.end_script[tid[task]] = deque([CONCURRENT_TRANSACTIONS] * 3)
    moved = 10                                    # a stale answer: EndTxn to the wrong broker
    right = cluster.txn_coordinator(tid[moved])
    cluster.lookup_script[tid[moved]] = deque([("node", 3 - right)])
    cluster.end_script[tid[11]] = deque([COORDINATOR_LOAD_IN_PROGRESS])
    cluster.lookup_script[tid[12]] = deque([COORDINATOR_NOT_AVAILABLE])
    cluster.end_script[tid[13]] = deque([Errors.KafkaConnectionError("socket disconnected")])
    _end_all(_Ends(cluster), written, STORE, 7)
    assert states(cluster, [h for _, h in written]) == ["CompleteCommit"] * N
    assert end_txn_count(cluster, tid[3]) == end_txn_count(cluster, tid[7]) == 4
    assert [(node, code) for node, t, code in cluster.ends if t == tid[moved]] == [
        (f"coordinator-{3 - right}", NOT_COORDINATOR), (f"coordinator-{right}", 0)]
    assert end_txn_count(cluster, tid[11]) == 2
    assert end_txn_count(cluster, tid[12]) == 1   # sent once its coordinator was found
    looked_up = [k for _, keys in cluster.lookups for k in keys]
    assert looked_up.count(tid[12]) == 2 and looked_up.count(tid[moved]) == 2
    assert looked_up.count(tid[11]) == 2 and looked_up.count(tid[13]) == 2
    others = [h.transactional_id for task, h in written if task not in (3, 7, 10, 11, 12, 13)]
    assert all(end_txn_count(cluster, t) == 1 for t in others)
    # The retries of one id follow each other (four EndTxns of id 3; two lookups and two
    # EndTxns of id 10), beside the others' EndTxns: far from 2 x 50 round trips.
    assert cluster.round_trips <= 20


def test_a_failure_other_than_fencing_fails_the_batch_after_every_other_is_committed():
    cluster = FakeProduceCluster({"out": 4})
    written = open_transactions(cluster)
    broken = written[4][1].transactional_id
    cluster.lookup_script[broken] = deque([TRANSACTIONAL_ID_AUTHORIZATION_FAILED])
    with pytest.raises(TransactionCommitError) as info:
        _end_all(_Ends(cluster), written, STORE, 7)
    text = str(info.value)
    assert f"'{broken}'" in text and "TransactionalIdAuthorizationFailedError" in text
    assert "restarting the query completes its commit" in text
    assert states(cluster, [h for _, h in written]) == \
        ["CompleteCommit"] * 4 + ["Ongoing"] + ["CompleteCommit"] * (N - 5)


def test_fenced_transactions_fail_the_batch_as_committed_in_part_naming_the_first():
    cluster = FakeProduceCluster({"out": 4})
    written = open_transactions(cluster)
    for task in (5, 30):                          # aborted by the broker: a newer epoch
        cluster.begin(written[task][1].transactional_id)
    with pytest.raises(TransactionCommitError) as info:
        _end_all(_Ends(cluster), written, STORE, 7)
    text = str(info.value)
    assert "committed only in part: 2 of its 50" in text
    assert f"'{written[5][1].transactional_id}' of task 5" in text
    assert "The 48 other(s) are committed" in text
    committed = [t for t, h in written if cluster.transactions[h.transactional_id]["state"]
                 == "CompleteCommit"]
    assert committed == [t for t in range(N) if t not in (5, 30)]


# --- end_transactions, the public function --------------------------------------------------

def test_end_transactions_reports_a_fenced_one_by_its_id_and_still_ends_the_others():
    cluster = FakeProduceCluster({"out": 4})
    handles = [h for _, h in open_transactions(cluster, 10)]
    fenced = handles[2]
    cluster.begin(fenced.transactional_id)
    with pytest.raises(TransactionFencedError, match=f"'{fenced.transactional_id}'"):
        end_transactions({}, handles, True, client=cluster, clock=cluster.clock)
    assert states(cluster, handles) == ["CompleteCommit"] * 2 + ["Ongoing"] + \
        ["CompleteCommit"] * 7


def test_end_transactions_raises_the_first_failure_in_handle_order_and_names_the_others():
    cluster = FakeProduceCluster({"out": 4})
    handles = [h for _, h in open_transactions(cluster, 10)]
    # The first to fail in handle order is the last to fail in time: its coordinator is busy
    # until the others have failed.
    cluster.end_script[handles[1].transactional_id] = deque(
        [CONCURRENT_TRANSACTIONS] * 5 + [TRANSACTIONAL_ID_AUTHORIZATION_FAILED])
    for i in (6, 8):
        cluster.begin(handles[i].transactional_id)
    with pytest.raises(ProduceError) as info:
        end_transactions({}, handles, True, client=cluster, clock=cluster.clock)
    assert type(info.value) is ProduceError       # the first one's type, not the fenced ones'
    text = str(info.value)
    assert text.startswith(f"Could not commit the transaction of transactional id "
                           f"'{handles[1].transactional_id}'")
    assert "2 other transaction(s) of the 10 failed too" in text
    assert f"'{handles[6].transactional_id}', '{handles[8].transactional_id}'" in text
    assert [s for i, s in enumerate(states(cluster, handles)) if i not in (1, 6, 8)] == \
        ["CompleteCommit"] * 7


def test_one_that_stays_busy_times_out_by_its_id_while_the_others_commit():
    cluster = FakeProduceCluster({"out": 4})
    handles = [h for _, h in open_transactions(cluster, 10)]
    cluster.end_script[handles[0].transactional_id] = deque([CONCURRENT_TRANSACTIONS] * 100_000)
    with pytest.raises(ProduceError, match=f"'{handles[0].transactional_id}' within 2000 ms.*"
                                           "ConcurrentTransactionsError"):
        end_transactions({}, handles, True, timeout_ms=2000, client=cluster,
                         clock=cluster.clock)
    assert states(cluster, handles[1:]) == ["CompleteCommit"] * 9


def test_aborting_many_aborts_them_all():
    cluster = FakeProduceCluster({"out": 4})
    handles = [h for _, h in open_transactions(cluster, 12)]
    end_transactions({}, handles, False, client=cluster, clock=cluster.clock)
    assert states(cluster, handles) == ["CompleteAbort"] * 12
    assert cluster.round_trips == 1 + 3


# --- a re-run's settling of the recorded transactions -----------------------------------------

def _recorded(cluster, entries_spec, prefix="app", query="q"):
    """Marker entries (task, round), each with its transaction open in the cluster."""
    entries = []
    for task, round_ in entries_spec:
        pid, epoch = cluster.begin(transactional_id(prefix, query, task, round_))
        entries.append(MarkerEntry(task, pid, epoch, None, round_))
    return entries


def test_settle_keeps_the_entries_order_of_fates_and_ends_them_together():
    cluster = FakeProduceCluster({"out": 4}, brokers=(1, 2))
    spec = [(t, 0) for t in range(19, -1, -1)] + [(3, 1), (0, 1), (7, 2)]
    entries = _recorded(cluster, spec)
    tids = [transactional_id("app", "q", e.task, e.round) for e in entries]
    aborted = {1, 4, 20}                          # the broker aborted these meanwhile
    for i in aborted:
        cluster.begin(tids[i])
    for i in (0, 2):                              # the first entries answer last
        cluster.end_script[tids[i]] = deque([CONCURRENT_TRANSACTIONS] * 4)
    fates = _settle(_Ends(cluster), "app", "q", entries)
    assert fates == [i not in aborted for i in range(len(entries))]
    assert [cluster.transactions[t]["state"] == "CompleteCommit" for t in tids] == fates
    # 23 transactions on two coordinators, five in flight on each: not 2 x 23 round trips.
    assert cluster.round_trips <= 12
    assert cluster.txn_in_flight_peak == 10


def test_settle_raises_a_failure_other_than_fencing_after_settling_every_entry():
    cluster = FakeProduceCluster({"out": 4})
    entries = _recorded(cluster, [(t, 0) for t in range(8)])
    tids = [transactional_id("app", "q", e.task) for e in entries]
    cluster.end_script[tids[2]] = deque([TRANSACTIONAL_ID_AUTHORIZATION_FAILED])
    with pytest.raises(ProduceError, match=f"'{tids[2]}'"):
        _settle(_Ends(cluster), "app", "q", entries)
    assert [cluster.transactions[t]["state"] for i, t in enumerate(tids) if i != 2] == \
        ["CompleteCommit"] * 7


def sink_options(bootstrap):
    """What _settle_once reads of the sink's options."""
    return SimpleNamespace(transactional_id_prefix="app",
                           client_config={"bootstrap_servers": bootstrap})


def test_a_worker_settles_a_batch_once_for_all_of_its_tasks(monkeypatch):
    # A re-run's tasks each settle every recorded transaction; a worker's later tasks reuse the
    # first one's fates (final either way) instead of sending every EndTxn again.
    monkeypatch.setattr(exactly_once, "_SETTLED", exactly_once.OrderedDict())
    cluster = FakeProduceCluster({"out": 4})
    entries = _recorded(cluster, [(t, 0) for t in range(6)])
    tids = [transactional_id("app", "q", e.task) for e in entries]
    cluster.begin(tids[4])                                # aborted by the broker meanwhile
    options = sink_options("b1:9092")
    first = _settle_once(_Ends(cluster), options, "q", entries)
    assert first == [True, True, True, True, False, True]
    sent = len(cluster.ends)
    assert sent >= 6
    for _ in range(5):                                    # the worker's next five tasks
        assert _settle_once(_Ends(cluster), options, "q", entries) == first
    assert len(cluster.ends) == sent
    # Other entries (a repair recorded) or another cluster: settled anew.
    more = entries + _recorded(cluster, [(4, 1)])
    assert _settle_once(_Ends(cluster), options, "q", more) == first + [True]
    assert len(cluster.ends) > sent
    sent = len(cluster.ends)
    _settle_once(_Ends(cluster), sink_options("b2:9092"), "q", entries)
    assert len(cluster.ends) > sent


def test_a_failed_settle_is_not_kept_the_next_task_settles_again(monkeypatch):
    monkeypatch.setattr(exactly_once, "_SETTLED", exactly_once.OrderedDict())
    cluster = FakeProduceCluster({"out": 4})
    entries = _recorded(cluster, [(t, 0) for t in range(3)])
    tids = [transactional_id("app", "q", e.task) for e in entries]
    cluster.end_script[tids[1]] = deque([TRANSACTIONAL_ID_AUTHORIZATION_FAILED])
    options = sink_options("b1:9092")
    with pytest.raises(ProduceError, match=f"'{tids[1]}'"):
        _settle_once(_Ends(cluster), options, "q", entries)
    assert _settle_once(_Ends(cluster), options, "q", entries) == [True, True, True]
    assert end_txn_count(cluster, tids[1]) == 2


def test_a_broker_that_answers_a_lookup_of_many_for_one_id_gets_one_id_a_request():
    # A cluster being upgraded: the versions known at bootstrap have FindCoordinator v4+, the
    # broker asked answers at v2, for the request's first id only.
    cluster = FakeProduceCluster({"out": 4}, versions=KAFKA_2_2_VERSIONS)
    cluster.api_version = lambda request_class: 6
    handles = [h for _, h in open_transactions(cluster, 12)]
    end_transactions({}, handles, True, client=cluster, clock=cluster.clock)
    assert states(cluster, handles) == ["CompleteCommit"] * 12
    assert [len(keys) for _, keys in cluster.lookups] == [1] * 12
    assert cluster.lookups[0][1] == [handles[0].transactional_id]
