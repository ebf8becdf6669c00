"""A scripted Kafka cluster for the producer's unit tests (:mod:`kafka_source.write.producer`).

:class:`FakeProduceCluster` stands in for the :class:`~kafka_source.wire.net.client.BrokerClient`
calls the producer makes -- ``metadata``, ``node_ready``, ``send_async``, ``poll``,
``unsent_bytes`` for Produce, and the blocking ``send`` for InitProducerId, AddPartitionsToTxn
and EndTxn -- and the ones that end many transactions at once
(:mod:`kafka_source.write.ending`): ``any_node``, ``api_version``, ``in_flight_limit``,
``coordinator_node`` and ``send_async`` for FindCoordinator and EndTxn. It plays the brokers'
side the way Kafka does:

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
* Transaction coordinators: each transactional id has one broker (spread over ``brokers`` by
  the id's CRC-32, or set with :meth:`move_txn_coordinator`); a transaction request sent to
  another broker's coordinator connection (``coordinator-{broker}``) is answered
  NOT_COORDINATOR, as Kafka does. FindCoordinator carries every key of the request from v4 on
  (KIP-699) and one key before (``versions`` caps the broker's versions: Kafka 2.2 has v2).
  Per id, :attr:`lookup_script` scripts its FindCoordinator answers (an error code, or
  ``("node", broker)``: a stale answer naming another broker) and :attr:`end_script` its EndTxn
  answers (error codes, or an exception for a failed connection).
* Round trips are counted (:attr:`round_trips`): each blocking ``send`` (and
  ``find_transaction_coordinator``, which is one FindCoordinator) is one, and so is each
  ``poll`` that answers requests in flight -- all of them at once, as brokers answering
  requests sent together do. More than ``in_flight_limit`` requests in flight to one node fail
  at once (NodeNotReadyError, counted in :attr:`refused`), as kafka-python fails them;
  :attr:`in_flight_peak` is the most requests that were in flight to each node,
  :attr:`txn_in_flight_peak` the most FindCoordinator and EndTxn requests in flight together.
* Time is simulated (:class:`SimClock`): a poll with nothing to deliver advances it by its
  timeout, so linger, backoff and timeouts are exercised without waiting. Held requests fail
  with RequestTimedOutError once their timeout passes, as kafka-python fails them.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass, field

import kafka.errors as Errors
from kafka.future import Future
from kafka.protocol.metadata import (ApiVersionsRequest, FindCoordinatorRequest,
                                     FindCoordinatorResponse)
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
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53

# What a Kafka 4.0 broker supports at most.
BROKER_MAX_VERSIONS = {ProduceRequest: 12, InitProducerIdRequest: 5, AddPartitionsToTxnRequest: 5,
                       EndTxnRequest: 5, FindCoordinatorRequest: 6}
# What a Kafka 2.2 broker supports at most.
KAFKA_2_2_VERSIONS = {ProduceRequest: 7, InitProducerIdRequest: 1, AddPartitionsToTxnRequest: 1,
                      EndTxnRequest: 1, FindCoordinatorRequest: 2}
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


def _wire(request, cls, versions=None):
    """``request`` as a broker sees it: encoded at the negotiated version and decoded."""
    version = min(request._max_version if request._max_version is not None else cls.max_version,
                  (versions or BROKER_MAX_VERSIONS)[cls])
    assert (request._min_version or 0) <= version
    data = request.encode(version=version)
    return cls.decode(bytes(data), version=version), version


def _respond(cls, version, **fields):
    """A response object as the client would decode it at ``version``."""
    response = cls(version=version, **fields)
    return cls.decode(bytes(response.encode(version=version)), version=version)


class FakeProduceCluster:
    def __init__(self, topics: dict[str, int], *, brokers=(1,), clock: SimClock | None = None,
                 versions: dict | None = None):
        self.clock = clock or SimClock()
        self.versions = dict(versions or BROKER_MAX_VERSIONS)
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
        self.txn_coordinators: dict = {}        # tid -> broker, where not by the id's hash
        self.lookup_script: dict = {}           # tid -> deque of codes / ("node", broker)
        self.end_script: dict = {}              # tid -> deque of codes / exceptions
        self.lookups: list = []                 # (version, [keys]) of every FindCoordinator
        self.ends: list = []                    # (node, tid, code) of every EndTxn answered
        self.round_trips = 0
        self.txn_in_flight_peak = 0
        self.refused = 0                        # requests past in_flight_limit

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

    def txn_coordinator(self, tid: str):
        """The broker coordinating transactional id ``tid``."""
        if tid in self.txn_coordinators:
            return self.txn_coordinators[tid]
        return self.brokers[zlib.crc32(tid.encode()) % len(self.brokers)]

    def move_txn_coordinator(self, tid: str, broker) -> None:
        self.txn_coordinators[tid] = broker

    def _transaction(self, tid: str) -> dict:
        """The state of transactional id ``tid``, new (a new producer id, no epoch yet) if the
        coordinator has not seen it."""
        txn = self.transactions.get(tid)
        if txn is None:
            self.next_producer_id += 1
            txn = self.transactions[tid] = {"pid": self.next_producer_id, "epoch": -1,
                                            "state": "Empty", "partitions": set()}
        return txn

    def begin(self, tid: str, partitions=(("t", 0),)):
        """An open transaction of ``tid`` with a new epoch, as a producer leaves it: what
        InitProducerId and AddPartitionsToTxn make of it here, without their requests. Returns
        (producer id, epoch)."""
        txn = self._transaction(tid)
        txn["epoch"] += 1
        txn["state"] = "Ongoing"
        txn["partitions"] = set(partitions)
        return txn["pid"], txn["epoch"]

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

    def any_node(self):
        return min(self.brokers, key=self.in_flight)

    def in_flight_limit(self, node) -> int:
        return self.max_in_flight_setting or 5

    def api_version(self, request_class) -> int:
        return min(request_class.max_version, self.versions[request_class])

    def coordinator_node(self, answer, key_type, key):
        return f"coordinator-{answer.node_id}"

    def send_async(self, node, request, timeout_ms=None):
        future = Future()
        if self.in_flight(node) >= self.in_flight_limit(node):
            self.refused += 1
            return future.failure(Errors.NodeNotReadyError(f"Node paused: {node}"))
        cls = type(request)
        decoded, version = _wire(request, cls, self.versions)
        if cls is ProduceRequest and decoded.acks == 0:
            future.success(None)
        self._pending.append(_Pending(node, (decoded, version), future,
                                      self.clock.now() + (timeout_ms or 30_000) / 1000))
        self.in_flight_peak[node] = max(self.in_flight_peak.get(node, 0), self.in_flight(node))
        if cls is not ProduceRequest:
            self.txn_in_flight_peak = max(self.txn_in_flight_peak, sum(
                1 for p in self._pending if not isinstance(p.request[0], ProduceRequest)))
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
            if isinstance(pending.request[0], ProduceRequest):
                self._serve(pending)
            else:
                self._serve_txn(pending)
            delivered = True
        if delivered:
            self.round_trips += 1
        else:
            self.clock.sleep(timeout_ms / 1000)

    def find_transaction_coordinator(self, transactional_id):
        """One FindCoordinator round trip for one id, as BrokerClient makes it."""
        self.round_trips += 1
        request = FindCoordinatorRequest(key=transactional_id, key_type=1,
                                         coordinator_keys=[transactional_id])
        decoded, version = _wire(request, FindCoordinatorRequest, self.versions)
        self.lookups.append((version, [transactional_id]))
        code, broker = self._coordinator_answer(transactional_id)
        if code:
            error = Errors.for_code(code)
            if not getattr(error, "retriable", False):
                raise error(f"FindCoordinator for transactional id '{transactional_id}'")
            raise RetriableBrokerError(f"FindCoordinator for transactional id "
                                       f"'{transactional_id}': {error.__name__}")
        return f"coordinator-{broker}"

    def send(self, node, request, timeout_ms=None):
        self.round_trips += 1
        if isinstance(request, ApiVersionsRequest):
            self.api_versions_calls.append(node)
            if self.unsent.get(node, 0) < 0:
                raise RetriableBrokerError(f"broker {node}: connection closed")
            return None
        for cls, handler in ((InitProducerIdRequest, self._init_producer_id),
                             (AddPartitionsToTxnRequest, self._add_partitions),
                             (EndTxnRequest, self._end_txn)):
            if isinstance(request, cls):
                decoded, version = _wire(request, cls, self.versions)
                try:
                    return handler(decoded, version, node)
                except Errors.KafkaConnectionError as exc:   # as BrokerClient.send raises it
                    raise RetriableBrokerError(f"broker {node}: {exc}") from exc
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

    def _serve_txn(self, pending: _Pending) -> None:
        """An answer to a FindCoordinator or EndTxn request sent with ``send_async``."""
        request, version = pending.request
        script = self._node_script.get(pending.node)
        if script:
            pending.future.failure(script.popleft()[0])
            return
        try:
            if isinstance(request, FindCoordinatorRequest):
                response = self._find_coordinator(request, version)
            else:
                response = self._end_txn(request, version, pending.node)
        except Exception as exc:  # a scripted network failure
            pending.future.failure(exc)
            return
        pending.future.success(response)

    def _coordinator_answer(self, tid: str):
        """(error code, broker) of a FindCoordinator answer for ``tid``."""
        script = self.lookup_script.get(tid)
        step = script.popleft() if script else None
        if isinstance(step, tuple):
            return 0, step[1]
        if step:
            return step, -1
        return 0, self.txn_coordinator(tid)

    def _find_coordinator(self, request, version):
        keys = request.coordinator_keys if version >= 4 else [request.key]
        self.lookups.append((version, list(keys)))
        answers = [(key, *self._coordinator_answer(key)) for key in keys]
        if version >= 4:
            C = FindCoordinatorResponse.Coordinator
            return _respond(FindCoordinatorResponse, version, throttle_time_ms=0, coordinators=[
                C(key=key, node_id=broker, host="fake", port=9092, error_code=code,
                  error_message=None) for key, code, broker in answers])
        _, code, broker = answers[0]
        return _respond(FindCoordinatorResponse, version, throttle_time_ms=0, error_code=code,
                        error_message=None, node_id=broker, host="fake", port=9092)

    def _misdirected(self, tid, node) -> bool:
        """A transaction request for ``tid`` sent to a coordinator connection of another
        broker (the node None is the producer's own path, always right here)."""
        return node is not None and tid is not None and \
            node != f"coordinator-{self.txn_coordinator(tid)}"

    def _scripted(self, kind):
        script = self.txn_script[kind]
        if script:
            step = script.popleft()
            if isinstance(step, Exception):
                raise step
            return step
        return None

    def _init_producer_id(self, request, version, node=None):
        self.txn_requests.append(("init", request))
        code = self._scripted("init")
        if not code and self._misdirected(request.transactional_id, node):
            code = NOT_COORDINATOR
        if code:
            return _respond(InitProducerIdResponse, version, error_code=code, producer_id=-1,
                            producer_epoch=-1)
        tid = request.transactional_id
        if tid is None:
            self.next_producer_id += 1
            return _respond(InitProducerIdResponse, version, error_code=0,
                            producer_id=self.next_producer_id, producer_epoch=0)
        txn = self._transaction(tid)
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

    def _add_partitions(self, request, version, node=None):
        self.txn_requests.append(("add", request))
        code = self._scripted("add") or 0
        if not code and self._misdirected(request.v3_and_below_transactional_id, node):
            code = NOT_COORDINATOR
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

    def _end_txn(self, request, version, node=None):
        self.txn_requests.append(("end", request))
        tid = request.transactional_id
        code = self._scripted("end")
        own = self.end_script.get(tid)
        if not code and own:
            step = own.popleft()
            if isinstance(step, Exception):
                raise step
            code = step
        if not code and self._misdirected(tid, node):
            code = NOT_COORDINATOR
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
        self.ends.append((node, tid, code))
        return _respond(EndTxnResponse, version, throttle_time_ms=0, error_code=code)


__all__ = ["FakeProduceCluster", "KAFKA_2_2_VERSIONS", "SimClock", "RetriableBrokerError"]
