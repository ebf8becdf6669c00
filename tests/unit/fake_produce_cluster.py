"""A scripted Kafka cluster for the producer's unit tests (:mod:`kafka_source.write.producer`).

:class:`FakeProduceCluster` stands in for the :class:`~kafka_source.wire.net.client.BrokerClient`
calls the producer makes -- ``metadata``, ``node_ready``, ``send_async``, ``poll``,
``unsent_bytes`` for Produce, and the blocking ``send`` for InitProducerId, AddPartitionsToTxn
and EndTxn -- and plays the brokers' side the way Kafka does:

* Requests go through the wire format: each is encoded at the version a broker would negotiate
  (the request's ``max_version`` capped by :data:`BROKER_MAX_VERSIONS`) and decoded back, so a
  field missing at that version is invisible here too. Produce requests with more than one
  record batch for a partition are rejected (INVALID_RECORD), as Kafka does from v3 on.
* Record batches are decoded with kafka-python's reader and appended to per-partition logs.
  Idempotent batches are checked as Kafka's ProducerStateManager does: the first batch of a
  producer must have sequence 0, each next one the previous last sequence + 1, else
  OUT_OF_ORDER_SEQUENCE_NUMBER; a batch equal to one of the last five of the producer is a
  duplicate, answered with success and its original offset, and not appended again; a smaller
  epoch than the partition saw is INVALID_PRODUCER_EPOCH. As in Kafka, a partition that knows
  nothing of a producer accepts its batch whatever the sequence (Kafka cannot tell a new
  producer from one whose state was cleaned up). Every answer is recorded (:attr:`answers`).
* Failures are scripted: :meth:`fail_next` (an error code for the next batch of a partition,
  optionally *after* appending it, as a broker that timed out waiting for replicas does),
  :meth:`break_next` (the next request to a broker fails with a network error, before or after
  the broker appended it), :meth:`move_leader`, :meth:`hold` (responses of a broker wait until
  :meth:`release`; meanwhile requests pile up in flight, which is what pipelining tests look at).
* Time is simulated (:class:`SimClock`): a poll with nothing to deliver advances it by its
  timeout, so linger, backoff and timeouts are exercised without waiting. Held requests fail
  with RequestTimedOutError once their timeout passes, as kafka-python fails them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import kafka.errors as Errors
from kafka.future import Future
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
                                     EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
                                     InitProducerIdResponse, ProduceRequest, ProduceResponse)
from kafka.record.default_records import DefaultRecordBatch

from kafka_source.wire.net.client import PartitionInfo, RetriableBrokerError, TopicInfo

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
NOT_ENOUGH_REPLICAS = 19
TOPIC_AUTHORIZATION_FAILED = 29
OUT_OF_ORDER_SEQUENCE = 45
DUPLICATE_SEQUENCE = 46
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
CONCURRENT_TRANSACTIONS = 51
UNKNOWN_PRODUCER_ID = 59
INVALID_RECORD = 87
PRODUCER_FENCED = 90
NOT_COORDINATOR = 16

# What a Kafka 4.0 broker supports at most.
BROKER_MAX_VERSIONS = {ProduceRequest: 12, InitProducerIdRequest: 5, AddPartitionsToTxnRequest: 5,
                       EndTxnRequest: 5}
_RESPONSES = {ProduceRequest: ProduceResponse, InitProducerIdRequest: InitProducerIdResponse,
              AddPartitionsToTxnRequest: AddPartitionsToTxnResponse,
              EndTxnRequest: EndTxnResponse}


class SimClock:
    """Simulated time: ``now()`` only moves when something sleeps or waits."""

    def __init__(self, start: float = 1000.0):
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0)

    def wall_ms(self) -> int:
        return int(1_700_000_000_000 + self.t * 1000)


@dataclass
class Record:
    key: bytes | None
    value: bytes | None
    headers: list
    timestamp: int


@dataclass
class StoredBatch:
    base_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int
    transactional: bool
    compression: int


@dataclass
class PartitionLog:
    records: list = field(default_factory=list)
    batches: list = field(default_factory=list)


@dataclass
class _Pending:
    node: object
    request: object
    future: Future
    deadline: float


def _wire(request, cls):
    """``request`` as a broker sees it: encoded at the negotiated version and decoded."""
    version = min(request._max_version if request._max_version is not None else cls.max_version,
                  BROKER_MAX_VERSIONS[cls])
    assert (request._min_version or 0) <= version
    data = request.encode(version=version)
    return cls.decode(bytes(data), version=version), version


def _respond(cls, version, **fields):
    """A response object as the client would decode it at ``version``."""
    response = cls(version=version, **fields)
    return cls.decode(bytes(response.encode(version=version)), version=version)


class FakeProduceCluster:
    def __init__(self, topics: dict[str, int], *, brokers=(1,), clock: SimClock | None = None):
        self.clock = clock or SimClock()
        self.brokers = list(brokers)
        self.topics = dict(topics)
        self.leaders = {(t, p): self.brokers[p % len(self.brokers)]
                        for t, n in topics.items() for p in range(n)}
        self.logs: dict = {}
        self.bootstrap_servers = "fake:9092"
        self.request_timeout_ms = 30_000
        self.max_in_flight_setting = None
        self.unreachable: set = set()
        self.produce_requests: list = []        # (node, version, acks, {tp: batch bytes})
        self.answers: list = []                 # (tp, error code) of every batch answered
        self.in_flight_peak: dict = {}
        self.metadata_calls = 0
        self.metadata_times: list = []          # simulated time of each metadata call
        self.metadata_failures: list = []
        self.closed = False
        self._pending: list[_Pending] = []
        self._held: set = set()
        self._partition_script: dict = {}       # tp -> deque[(code, append_first)]
        self._node_script: dict = {}            # node -> deque[(exception, append_first)]
        self._producer_state: dict = {}         # (pid, tp) -> {"epoch", "batches": deque}
        self._epochs: dict = {}                 # tp -> {pid: epoch}
        self.unsent: dict = {}                  # node -> int (acks=0 tests)
        self.api_versions_calls: list = []      # nodes asked (acks=0 flush)
        # transaction coordinator
        self.next_producer_id = 1000
        self.transactions: dict = {}            # tid -> {"pid", "epoch", "state", "partitions"}
        self.txn_script: dict = {"init": deque(), "add": deque(), "end": deque()}
        self.txn_requests: list = []            # (kind, decoded request)

    # --- scripting ---------------------------------------------------------------------------

    def fail_next(self, tp, code: int, *, times: int = 1, append_first: bool = False) -> None:
        for _ in range(times):
            self._partition_script.setdefault(tp, deque()).append((code, append_first))

    def break_next(self, node, *, append_first: bool = False,
                   error: Exception | None = None) -> None:
        self._node_script.setdefault(node, deque()).append(
            (error or Errors.KafkaConnectionError("socket disconnected"), append_first))

    def move_leader(self, tp, node) -> None:
        self.leaders[tp] = node

    def hold(self, node) -> None:
        self._held.add(node)

    def release(self, node) -> None:
        self._held.discard(node)

    def in_flight(self, node) -> int:
        return sum(1 for p in self._pending if p.node == node)

    def values(self, tp) -> list:
        return [r.value for r in self.logs.get(tp, PartitionLog()).records]

    # --- the BrokerClient interface ---------------------------------------------------------

    def set_max_in_flight(self, n: int) -> None:
        self.max_in_flight_setting = n

    def metadata(self, topics):
        self.metadata_calls += 1
        self.metadata_times.append(self.clock.now())
        if self.metadata_failures:
            raise self.metadata_failures.pop(0)
        result = {}
        for topic in (sorted(self.topics) if topics is None else topics):
            if topic not in self.topics:
                result[topic] = TopicInfo(topic, UNKNOWN_TOPIC_OR_PARTITION, {})
                continue
            parts = {p: PartitionInfo(self.leaders[(topic, p)], 0)
                     for p in range(self.topics[topic])}
            result[topic] = TopicInfo(topic, 0, parts)
        return result

    def node_ready(self, node) -> bool:
        return node not in self.unreachable

    def node_failing(self, node) -> bool:
        return node in self.unreachable

    def send_async(self, node, request, timeout_ms=None):
        future = Future()
        decoded, version = _wire(request, ProduceRequest)
        if decoded.acks == 0:
            future.success(None)
        self._pending.append(_Pending(node, (decoded, version), future,
                                      self.clock.now() + (timeout_ms or 30_000) / 1000))
        self.in_flight_peak[node] = max(self.in_flight_peak.get(node, 0), self.in_flight(node))
        return future

    def unsent_bytes(self, node) -> int:
        return self.unsent.get(node, 0)

    def poll(self, timeout_ms) -> None:
        delivered = False
        for pending in list(self._pending):
            if pending not in self._pending:
                continue                    # failed with its broken connection meanwhile
            if pending.node in self._held:
                if self.clock.now() >= pending.deadline:
                    self._pending.remove(pending)
                    if not pending.future.is_done:
                        pending.future.failure(Errors.RequestTimedOutError("request timed out"))
                    delivered = True
                continue
            self._pending.remove(pending)
            self._serve(pending)
            delivered = True
        if not delivered:
            self.clock.sleep(timeout_ms / 1000)

    def find_transaction_coordinator(self, transactional_id):
        return "coordinator-1"

    def send(self, node, request, timeout_ms=None):
        if isinstance(request, ApiVersionsRequest):
            self.api_versions_calls.append(node)
            if self.unsent.get(node, 0) < 0:
                raise RetriableBrokerError(f"broker {node}: connection closed")
            return None
        for cls, handler in ((InitProducerIdRequest, self._init_producer_id),
                             (AddPartitionsToTxnRequest, self._add_partitions),
                             (EndTxnRequest, self._end_txn)):
            if isinstance(request, cls):
                decoded, version = _wire(request, cls)
                return handler(decoded, version)
        raise AssertionError(f"unexpected request {request}")

    def close(self) -> None:
        self.closed = True

    # --- the brokers' side of Produce ---------------------------------------------------------

    def _serve(self, pending: _Pending) -> None:
        request, version = pending.request
        node = pending.node
        script = self._node_script.get(node)
        broken = script.popleft() if script else None
        results = {}
        self.produce_requests.append((node, version, request.acks, {
            (t.name, p.index): p.records for t in request.topic_data for p in t.partition_data}))
        for topic in request.topic_data:
            for part in topic.partition_data:
                tp = (topic.name, part.index)
                if broken is not None and not broken[1]:
                    continue
                results[tp] = self._append(node, tp, bytes(part.records), request.acks)
                self.answers.append((tp, results[tp][0]))
        if broken is not None:
            pending.future.failure(broken[0])
            # a broken connection fails everything in flight on it
            for other in [p for p in self._pending if p.node == node]:
                self._pending.remove(other)
                if not other.future.is_done:
                    other.future.failure(broken[0])
            return
        if request.acks == 0:
            return
        topics: dict = {}
        T = ProduceResponse.TopicProduceResponse
        P = T.PartitionProduceResponse
        for (name, index), (code, offset) in results.items():
            topics.setdefault(name, []).append(P(index=index, error_code=code, base_offset=offset,
                                                 log_append_time_ms=-1, log_start_offset=0))
        response = _respond(ProduceResponse, version, throttle_time_ms=0, responses=[
            T(name=name, partition_responses=ps) for name, ps in topics.items()])
        pending.future.success(response)

    def _append(self, node, tp, data: bytes, acks: int) -> tuple[int, int]:
        if tp not in self.leaders:
            return UNKNOWN_TOPIC_OR_PARTITION, -1
        if self.leaders[tp] != node:
            return NOT_LEADER_OR_FOLLOWER, -1
        batch = DefaultRecordBatch(data)
        if batch.size_in_bytes != len(data):
            return INVALID_RECORD, -1     # more than one batch for the partition
        script = self._partition_script.get(tp)
        scripted = script.popleft() if script else None
        if scripted is not None and scripted[0] == NONE:
            scripted = None                 # a step that lets one batch through as usual
        if scripted is not None and not scripted[1]:
            return scripted[0], -1
        code, offset = self._write(tp, batch)
        if scripted is not None:
            return scripted[0], -1
        return code, offset

    def _write(self, tp, batch: DefaultRecordBatch) -> tuple[int, int]:
        log = self.logs.setdefault(tp, PartitionLog())
        records = list(batch)
        pid, epoch, seq = batch.producer_id, batch.producer_epoch, batch.base_sequence
        if pid >= 0:
            seen = self._epochs.setdefault(tp, {})
            if epoch < seen.get(pid, -1):
                return INVALID_PRODUCER_EPOCH, -1
            seen[pid] = epoch
            state = self._producer_state.get((pid, tp))
            if state is None or state["epoch"] != epoch:
                # nothing known of this producer (epoch): any sequence is accepted
                state = self._producer_state[(pid, tp)] = {"epoch": epoch,
                                                           "batches": deque(maxlen=5)}
                state["batches"].append((seq - 1, seq - 1, -1))
            last = len(records) - 1
            for first_seq, last_seq, base in state["batches"]:
                if first_seq == seq and last_seq == seq + last:
                    return NONE, base       # a duplicate: success with the original offset
            expected = (state["batches"][-1][1] + 1) % (1 << 31) if state["batches"] else 0
            if seq != expected:
                return OUT_OF_ORDER_SEQUENCE, -1
        base = len(log.records)
        for r in records:
            log.records.append(Record(r.key, r.value, list(r.headers), r.timestamp))
        log.batches.append(StoredBatch(base, pid, epoch, seq, len(records),
                                       batch.is_transactional, batch.compression_type))
        if pid >= 0:
            state["batches"].append((seq, seq + len(records) - 1, base))
        return NONE, base

    # --- the transaction coordinator ---------------------------------------------------------

    def _scripted(self, kind):
        script = self.txn_script[kind]
        if script:
            step = script.popleft()
            if isinstance(step, Exception):
                raise step
            return step
        return None

    def _init_producer_id(self, request, version):
        self.txn_requests.append(("init", request))
        code = self._scripted("init")
        if code:
            return _respond(InitProducerIdResponse, version, error_code=code, producer_id=-1,
                            producer_epoch=-1)
        tid = request.transactional_id
        if tid is None:
            self.next_producer_id += 1
            return _respond(InitProducerIdResponse, version, error_code=0,
                            producer_id=self.next_producer_id, producer_epoch=0)
        txn = self.transactions.get(tid)
        if txn is None:
            self.next_producer_id += 1
            txn = self.transactions[tid] = {"pid": self.next_producer_id, "epoch": -1,
                                            "state": "Empty", "partitions": set()}
        txn["epoch"] += 1
        if txn["state"] == "Ongoing":
            # the abort markers go to the transaction's partitions with the new epoch, which
            # fences the older producer there
            txn["state"] = "CompleteAbort"
            for tp in txn["partitions"]:
                self._epochs.setdefault(tp, {})[txn["pid"]] = txn["epoch"]
        txn["partitions"] = set()
        return _respond(InitProducerIdResponse, version, error_code=0, producer_id=txn["pid"],
                        producer_epoch=txn["epoch"])

    def _add_partitions(self, request, version):
        self.txn_requests.append(("add", request))
        code = self._scripted("add") or 0
        txn = self.transactions.get(request.v3_and_below_transactional_id)
        if not code and (txn is None or txn["epoch"] != request.v3_and_below_producer_epoch):
            code = PRODUCER_FENCED
        R = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
        PR = R.AddPartitionsToTxnPartitionResult
        results = [R(name=t.name, results_by_partition=[
            PR(partition_index=p, partition_error_code=code) for p in t.partitions])
            for t in request.v3_and_below_topics]
        if not code:
            txn["state"] = "Ongoing"
            txn["partitions"].update((t.name, p) for t in request.v3_and_below_topics
                                     for p in t.partitions)
        return _respond(AddPartitionsToTxnResponse, version, throttle_time_ms=0,
                        results_by_topic_v3_and_below=results)

    def _end_txn(self, request, version):
        self.txn_requests.append(("end", request))
        code = self._scripted("end")
        if not code:
            txn = self.transactions.get(request.transactional_id)
            want = "CompleteCommit" if request.committed else "CompleteAbort"
            if txn is None or txn["epoch"] != request.producer_epoch:
                code = PRODUCER_FENCED
            elif txn["state"] == "Ongoing":
                txn["state"] = want
                code = 0
            elif txn["state"] == want:
                code = 0
            else:
                code = INVALID_TXN_STATE
        return _respond(EndTxnResponse, version, throttle_time_ms=0, error_code=code)


__all__ = ["FakeProduceCluster", "SimClock", "RetriableBrokerError"]
