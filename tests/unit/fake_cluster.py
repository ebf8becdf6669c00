"""A scripted stand-in for :class:`kafka_source.wire.client.BrokerClient`.

It holds, per partition, a log of record batches (bytes crafted by ``record_builder``), a log
start offset and aborted-transaction entries, and answers ``fetch``/``list_offsets``/``leaders``
the way a broker would, so the fetch loop and offset planning can be tested without a broker and
on things the embedded broker cannot show (transactions, log truncation, leader moves).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from kafka_source.wire.client import BrokerClient, PartitionInfo, RetriableBrokerError, TopicInfo

OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6


@dataclass
class FakeLog:
    batches: list = field(default_factory=list)     # record_builder.Batch objects, in order
    log_start: int = 0
    aborted: list = field(default_factory=list)     # (producer_id, first_offset)
    high_watermark: int | None = None               # default: last batch's last offset + 1
    timestamps: dict = field(default_factory=dict)  # timestamp -> offset for ListOffsets


class FakeCluster:
    def __init__(self, logs: dict, *, leader: int = 1):
        self.logs = logs
        self.leader = leader
        self.fetches: list[tuple[int, dict]] = []
        self.script: list = []   # queued partition error codes / exceptions for the next fetches
        self.bootstrap_servers = "fake:9092"
        self.metadata_calls: list = []
        self.topic_errors: dict[str, list[int]] = {}   # topic -> queued error codes
        self.metadata_failures: list[Exception] = []    # raised by the next metadata() calls

    def hw(self, tp) -> int:
        log = self.logs[tp]
        if log.high_watermark is not None:
            return log.high_watermark
        return log.batches[-1].last_offset + 1 if log.batches else log.log_start

    # --- BrokerClient API used by fetcher/offsets -------------------------------------------

    def metadata(self, topics):
        """Metadata as a broker answers it, without auto-creating topics; a topic with queued
        codes in ``topic_errors`` answers the next one instead. Queued exceptions in
        ``metadata_failures`` are raised first, one per call (e.g. a broker restarting)."""
        self.metadata_calls.append(None if topics is None else sorted(topics))
        if self.metadata_failures:
            raise self.metadata_failures.pop(0)
        names = sorted({t for t, _ in self.logs} | {"__consumer_offsets"}) if topics is None \
            else sorted(set(topics))
        result = {}
        for topic in names:
            queued = self.topic_errors.get(topic)
            if queued:
                result[topic] = TopicInfo(topic, queued.pop(0), {})
                continue
            parts = {p: PartitionInfo(self.leader, 0) for t, p in self.logs if t == topic}
            if topic == "__consumer_offsets":
                parts = {0: PartitionInfo(self.leader, 0)}
            # What a broker answers for a topic that does not exist (no auto-creation).
            result[topic] = TopicInfo(topic, 0 if parts else UNKNOWN_TOPIC_OR_PARTITION, parts)
        return result

    # The real retry loop around ``metadata`` (it only uses ``metadata`` and
    # ``bootstrap_servers``), so planning is tested with the retries it really has.
    topic_metadata = BrokerClient.topic_metadata

    def leaders(self, tps):
        return {tp: self.leader for tp in tps}

    def list_offsets(self, targets, *, read_committed, retries=None):
        out = {}
        for tp, target in targets.items():
            log = self.logs[tp]
            if target == -2:
                out[tp] = (log.log_start, -1)
            elif target == -1:
                out[tp] = (self.hw(tp), -1)
            else:
                hits = sorted(o for ts, o in log.timestamps.items() if ts >= target)
                out[tp] = (hits[0] if hits else -1, target)
        return out

    def fetch(self, node_id, positions, **kw):
        self.fetches.append((node_id, dict(positions)))
        if self.script:
            step = self.script.pop(0)
            if isinstance(step, Exception):
                raise step
            return self._response(positions, error=step)
        if node_id != self.leader:
            return self._response(positions, error=NOT_LEADER_OR_FOLLOWER)
        return self._response(positions, error=0, max_bytes=kw.get("partition_max_bytes", 1 << 20))

    def _response(self, positions, *, error, max_bytes=1 << 20):
        topics = {}
        for (topic, partition), offset in positions.items():
            log = self.logs[(topic, partition)]
            data = b""
            if not error:
                if offset < log.log_start or offset > self.hw((topic, partition)):
                    error = OFFSET_OUT_OF_RANGE
                else:
                    for b in log.batches:
                        if b.last_offset >= offset and b.base_offset < self.hw((topic, partition)):
                            if data and len(data) + len(b.data) > max_bytes:
                                data += b.data[: max(0, max_bytes - len(data))]  # truncated tail
                                break
                            data += b.data
            aborted = [SimpleNamespace(producer_id=p, first_offset=f) for p, f in log.aborted]
            topics.setdefault(topic, []).append(SimpleNamespace(
                partition_index=partition, error_code=error,
                high_watermark=self.hw((topic, partition)), last_stable_offset=-1,
                log_start_offset=log.log_start, aborted_transactions=aborted,
                records=data))
        return SimpleNamespace(responses=[SimpleNamespace(topic=t, partitions=ps)
                                          for t, ps in topics.items()])


def unreachable(message="connection refused"):
    return RetriableBrokerError(message)
