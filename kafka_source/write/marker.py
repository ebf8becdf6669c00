"""The marker of exactly-once writes: which micro-batches' commits were recorded, and how.

The marker is the committed offset of a consumer group, ``{prefix}-{queryId}``, on a partition of
a topic the query writes: the offset is the number of micro-batches whose commit was recorded,
and its metadata lists the transactions of the last one (:class:`MarkerEntry`), compactly, so
that a driver restarted after a crash can finish -- or repair -- that commit. What the marker
means for the protocol, and why, is in :mod:`.exactly_once`; this module is its format and the
OffsetFetch / OffsetCommit calls that read and write it.

Format ``pk2:`` + base64 of ``z`` + deflated bytes (or ``r`` + the bytes when deflating does not
shorten them): the batch id, then per entry, sorted by (round, task), varint deltas of round,
task, producer id and epoch, and the digest prefixed by its length (0: none). ``pk1:``, the
format before digests and repair rounds (task deltas, producer id and epoch), is still read.
"""

from __future__ import annotations

import base64
import time
import zlib
from typing import Iterable, Mapping, NamedTuple

import kafka.errors as Errors

from ..errors import KafkaSourceError, ProduceError
from ..wire.varint import read_uvarint, uvarint

__all__ = ["MarkerAccessError", "MarkerEntry", "MarkerStore", "TransactionCommitError",
           "decode_marker", "encode_marker", "marker_group", "transactional_id"]

TopicPartition = tuple[str, int]

_MARKER_PREFIX = "pk2:"      # with digests and repair rounds
_MARKER_PREFIX_V1 = "pk1:"
# Coordinator answers worth retrying while a group's coordinator starts or moves.
_COORDINATOR_RETRY = (Errors.CoordinatorLoadInProgressError, Errors.CoordinatorNotAvailableError,
                      Errors.NotCoordinatorError)


class TransactionCommitError(ProduceError):
    """The transactions of an exactly-once micro-batch could not all be committed."""


class MarkerAccessError(KafkaSourceError):
    """The principal lacks an ACL that the marker's OffsetCommit needs: READ on the marker
    group, or READ on the topic the marker is committed on. ``operation``, ``resource_type``
    and ``resource_name`` name the missing ACL as ``kafka-acls.sh`` does."""

    def __init__(self, message: str, *, operation: str, resource_type: str, resource_name: str):
        super().__init__(message)
        self.operation = operation
        self.resource_type = resource_type
        self.resource_name = resource_name


def marker_group(prefix: str, query_id: str) -> str:
    return f"{prefix}-{query_id}"


def transactional_id(prefix: str, query_id: str, task: int, round: int = 0) -> str:
    """The transactional id of task slot ``task``: the same in every run of a micro-batch,
    another per repair ``round`` (so that a repair never re-initialises -- and so fences -- an
    id whose transaction's fate the next repair still has to read from EndTxn)."""
    tid = f"{prefix}-{query_id}-{task}"
    return tid if round == 0 else f"{tid}.r{round}"


# --- the marker's metadata ----------------------------------------------------------------------

def _zigzag(value: int) -> int:
    return (value << 1) if value >= 0 else ((-value << 1) - 1)


def _unzigzag(value: int) -> int:
    return (value >> 1) if not value & 1 else -((value + 1) >> 1)


class MarkerEntry(NamedTuple):
    """One transaction of a micro-batch, as the marker records it. ``digest`` is that of the
    rows written in it (:mod:`.digest`; None when the marker had no room for digests or was
    written by an older version); ``round`` 0 is the batch's first run, ``round`` r > 0 the
    r-th repair of a partly committed batch, whose transactions have ids of their own
    (:func:`transactional_id`)."""

    task: int
    producer_id: int
    epoch: int
    digest: bytes | None = None
    round: int = 0


def encode_marker(batch_id: int, entries: Iterable[tuple]) -> str:
    """The metadata of batch ``batch_id``'s marker: its entries (:class:`MarkerEntry`, or
    (task, producer id, epoch)) as varint deltas (tasks ascend, producer ids and epochs are
    close to each other) with each digest, deflated if that is shorter, base64: a few bytes
    per task plus 8 per digest."""
    raw = bytearray()
    raw += uvarint(batch_id)
    prev_task, prev_round, prev_pid, prev_epoch = 0, 0, 0, 0
    for e in sorted((MarkerEntry(*e) for e in entries), key=lambda e: (e.round, e.task)):
        raw += uvarint(e.round - prev_round)
        raw += uvarint(e.task - (prev_task if e.round == prev_round else 0))
        raw += uvarint(_zigzag(e.producer_id - prev_pid))
        raw += uvarint(_zigzag(e.epoch - prev_epoch))
        if e.digest is None:
            raw.append(0)
        else:
            raw.append(len(e.digest))
            raw += e.digest
        prev_task, prev_round, prev_pid, prev_epoch = e.task, e.round, e.producer_id, e.epoch
    packed = zlib.compress(bytes(raw), 9)
    body = b"z" + packed if len(packed) < len(raw) else b"r" + bytes(raw)
    return _MARKER_PREFIX + base64.b64encode(body).decode("ascii")


def decode_marker(text: str) -> tuple[int, list[MarkerEntry]]:
    """(batch id, entries) of a marker's metadata; also reads the first version's ("pk1:",
    without digests or rounds)."""
    version = text[:4] if text else ""
    if version not in (_MARKER_PREFIX, _MARKER_PREFIX_V1):
        raise ValueError(f"not an exactly-once marker: {text[:40]!r}")
    body = base64.b64decode(text[4:])
    raw = zlib.decompress(body[1:]) if body[:1] == b"z" else body[1:]
    batch_id, pos = read_uvarint(raw, 0)
    entries = []
    task, rnd, pid, epoch = (-1 if version == _MARKER_PREFIX_V1 else 0), 0, 0, 0
    while pos < len(raw):
        digest = None
        if version == _MARKER_PREFIX_V1:
            delta, pos = read_uvarint(raw, pos)
            task += delta + 1
        else:
            drnd, pos = read_uvarint(raw, pos)
            dtask, pos = read_uvarint(raw, pos)
            task = (task if drnd == 0 else 0) + dtask
            rnd += drnd
        dpid, pos = read_uvarint(raw, pos)
        depoch, pos = read_uvarint(raw, pos)
        pid, epoch = pid + _unzigzag(dpid), epoch + _unzigzag(depoch)
        if version != _MARKER_PREFIX_V1:
            size = raw[pos]
            pos += 1
            if size:
                digest = bytes(raw[pos:pos + size])
                pos += size
        entries.append(MarkerEntry(task, pid, epoch, digest, rnd))
    return batch_id, entries


# --- the marker group -----------------------------------------------------------------------------

class MarkerStore:
    """OffsetFetch / OffsetCommit of the marker group at its coordinator, retried while the
    coordinator loads or moves, within ``kafka.request.timeout.ms``."""

    def __init__(self, client_config: Mapping[str, object], group: str):
        from ..wire.net.client import BrokerClient

        self.group = group
        self.client = BrokerClient(client_config)
        self._node = None

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "MarkerStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, what: str, attempt):
        from ..wire.net.client import RetriableBrokerError

        timeout_ms = self.client.request_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        pause = 0.05
        while True:
            try:
                if self._node is None:
                    self._node = self.client.find_coordinator(self.group)
                return attempt(self._node)
            except RetriableBrokerError as exc:
                self._node = None
                last = exc
            except Errors.GroupAuthorizationFailedError:
                raise MarkerAccessError(
                    f"Not authorized to use consumer group '{self.group}', which exactly-once "
                    "writes use to record committed micro-batches (the marker). Missing ACL: "
                    f"READ on Group '{self.group}' -- grant READ on groups with the prefix of "
                    "option 'kafka.transactional.id' (kafka-acls.sh --add --allow-principal "
                    "User:NAME --operation Read --group PREFIX --resource-pattern-type "
                    "prefixed).", operation="READ", resource_type="Group",
                    resource_name=self.group) from None
            if time.monotonic() >= deadline:
                raise KafkaSourceError(f"{what} for group '{self.group}' (the exactly-once "
                                       f"marker) did not succeed within {timeout_ms} ms "
                                       f"(kafka.request.timeout.ms): {last}")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def fetch(self) -> dict[TopicPartition, tuple[int, str]]:
        """Every committed offset of the group: (topic, partition) -> (offset, metadata)."""

        def attempt(node):
            err, offsets = self.client.group_offsets(node, self.group, require_stable=True)
            if err is Errors.GroupIdNotFoundError:
                return {}
            self._check(err, "OffsetFetch")
            return offsets

        return self._call("OffsetFetch", attempt)

    def _commit_request(self, offsets: Mapping[TopicPartition, tuple[int, str]]):
        """OffsetCommit of ``offsets`` outside any group generation, as a consumer using
        assign() does."""
        from kafka.protocol.consumer import OffsetCommitRequest

        T = OffsetCommitRequest.OffsetCommitRequestTopic
        P = T.OffsetCommitRequestPartition
        by_topic: dict[str, list] = {}
        for (topic, partition), (offset, metadata) in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(P(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                commit_timestamp=-1, committed_metadata=metadata))
        return OffsetCommitRequest(
            group_id=self.group, generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None, retention_time_ms=-1,
            topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()], max_version=8)

    def check_commit_access(self, topic: str) -> None:
        """:class:`MarkerAccessError` unless this principal may commit the marker on ``topic``;
        commits nothing. Kafka authorizes an OffsetCommit -- READ on the group, READ on each
        topic -- before it looks at the partitions, and answers UNKNOWN_TOPIC_OR_PARTITION
        for one the topic does not have without passing anything to the group coordinator: so
        this commits partition -1, which no topic has."""
        request = self._commit_request({(topic, -1): (0, "")})

        def attempt(node):
            response = self.client.send(node, request)
            for t in response.topics:
                for p in t.partitions:
                    err = Errors.for_code(p.error_code)
                    if err not in (Errors.NoError, Errors.UnknownTopicOrPartitionError):
                        self._check(err, "OffsetCommit", t.name)
            return True

        self._call("OffsetCommit", attempt)

    def commit(self, offsets: Mapping[TopicPartition, tuple[int, str]]) -> None:
        """Commit ``offsets`` ((topic, partition) -> (offset, metadata)) outside any group
        generation, as a consumer using assign() does."""
        request = self._commit_request(offsets)

        def attempt(node):
            response = self.client.send(node, request)
            for t in response.topics:
                for p in t.partitions:
                    err = Errors.for_code(p.error_code)
                    if err is Errors.OffsetMetadataTooLargeError:
                        size = max(len(m) for _, m in offsets.values())
                        raise TransactionCommitError(
                            f"The exactly-once marker of this micro-batch ({size} bytes, listing "
                            "the transaction of every task that wrote records) is larger than "
                            "the broker allows (broker setting offset.metadata.max.bytes, 4096 "
                            "by default): write with fewer tasks (coalesce or repartition the "
                            "DataFrame before writeStream) or raise offset.metadata.max.bytes.")
                    self._check(err, "OffsetCommit", t.name)
            return True

        self._call("OffsetCommit", attempt)

    def _check(self, err, what: str, topic: str | None = None) -> None:
        from ..wire.net.client import RetriableBrokerError

        if err is Errors.NoError:
            return
        if err in _COORDINATOR_RETRY or getattr(err, "retriable", False) \
                or err is Errors.UnstableOffsetCommitError:
            self._node = None
            raise RetriableBrokerError(f"{what}: {err.__name__}")
        if err is Errors.GroupAuthorizationFailedError:
            raise err()
        if err is Errors.TopicAuthorizationFailedError and topic is not None:
            raise MarkerAccessError(
                f"Not authorized to commit the exactly-once marker (an offset of consumer group "
                f"'{self.group}') on topic '{topic}': Kafka authorizes OffsetCommit with READ on "
                f"the topic as well as on the group. Missing ACL: READ on Topic '{topic}', "
                "besides the WRITE that its records need (kafka-acls.sh --add "
                f"--allow-principal User:NAME --operation Read --topic '{topic}').",
                operation="READ", resource_type="Topic", resource_name=topic)
        raise KafkaSourceError(f"{what} for group '{self.group}' (the exactly-once marker) "
                               f"failed: {err.__name__} ({getattr(err, 'description', '')}).")

    # --- what the offsets mean ----------------------------------------------------------------

    def committed_batches(self, offsets=None) -> int:
        """How many batches' commits were recorded: 1 + the last batch id, 0 if none."""
        offsets = self.fetch() if offsets is None else offsets
        return max((o for o, _ in offsets.values()), default=0)
