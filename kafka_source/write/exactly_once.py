"""Exactly-once streaming writes: one Kafka transaction per task, committed by the driver.

Why it works
------------
Spark runs micro-batch N's write tasks, then calls the sink's ``commit(messages, N)`` on the
driver, then records N in the checkpoint's commit log. A retried task, a failed batch or a
restarted query makes Spark write rows again; Kafka transactions make the first, failed write
invisible to ``read_committed`` readers, and a *marker* makes sure a batch whose transactions
were committed is not written again.

Per task (partition p of batch N, on an executor)
  1. The marker: consumer group ``{prefix}-{queryId}``. Its committed offset is the number of
     batches whose commit was recorded (N + 1 once batch N's is). If it already covers N, batch
     N was committed before the driver crashed and Spark re-runs it: see *Re-runs* below. If
     it covers N + 1 too, the checkpoint is older than the marker (an older copy restored):
     Spark plans batches again that the marker calls written, maybe over other offsets, so the
     task fails, saying what to do, rather than skip them.
  2. Else it writes everything in one transaction with the transactional id
     ``{prefix}-{queryId}-{p}``, flushes, and returns the open transaction's handle
     (transactional id, producer id, epoch) and the digest of the rows it wrote
     (:mod:`.digest`). The id is stable per task slot, so a retried attempt's InitProducerId
     fences the failed attempt and aborts its transaction at once.

On the driver, ``commit(messages, N)``
  1. Records the commit: OffsetCommit of the marker group, one partition of a topic written,
     offset N + 1, and as metadata each transaction, compactly: task, producer id, epoch and
     the digest (the transactional ids follow from the prefix, query id and task numbers).
  2. Commits each transaction (EndTxn). A commit repeated on a committed transaction succeeds.
  3. If the broker aborted some of them (the batch took longer than
     ``kafka.transaction.timeout.ms`` from its first record to the commit), it still commits
     the others -- the marker records them as committed -- and fails the query, saying so:
     the restart repairs the batch.

Re-runs (the marker covers N: the driver crashed between step 1 and Spark's commit log)
  The task *settles* every transaction the marker records: EndTxn(commit) of each, which
  finishes a commit the crashed driver began, and tells which of them the broker aborted
  meanwhile (a fenced epoch). If none was, the batch is whole: the task writes nothing, and the
  driver's commit settles them once more. This is the usual case.

  If some were aborted -- a driver that died between two EndTxn calls and came back after the
  transaction timeout, or step 3 -- the batch is committed in part, and writing it all again
  would put the committed transactions' records in Kafka twice. So each task writes its rows
  in a transaction of a *repair round* (the id ``{prefix}-{queryId}-{p}.r{round}``: the ids
  being settled are never re-initialised, so their fate stays readable), and compares the
  digest of what it wrote with the recorded ones: rows of a committed transaction (its own
  task number's first, else any other's) are thrown away (the transaction aborted, the task
  reports them matched); the others are kept. The driver records the repair's transactions in
  the marker beside the first ones and commits them. A repair that fails in turn is repaired
  by the next re-run, in the next round; the aborted transactions of earlier rounds are covered
  by the rounds after them, since a round writes every row it does not find committed.

  Spark gives a re-run's tasks the same rows as the first run's when its plan reads the same
  input the same way, as a re-run from the checkpoint does; a task whose rows are grouped or
  ordered otherwise (a source that groups partitions by leader after a leader moved, a
  shuffle without order) is not recognised and writes its rows again -- records of the
  committed transactions may then be in Kafka twice, and a warning says so. Nothing is lost
  either way. Without digests (a marker too large for them, see Limits) nothing is recognised.

``abort(messages, N)`` aborts the transactions of the tasks that succeeded, and fences the task
slots that failed (InitProducerId aborts their transactions now rather than at the timeout) --
unless the marker shows that N's commit was recorded: then the transactions are left for the
restart to commit.

Limits
  * Readers must use ``kafka.isolation.level=read_committed``.
  * The marker's metadata must fit the broker's ``offset.metadata.max.bytes`` (4096 by
    default): about 4 to 6 bytes per task that wrote records, plus 9 for its digest, i.e.
    about 230 tasks with digests; without them (recorded so, with a warning, when they do not
    fit) several hundred. More fails the commit with an error saying so (nothing is
    committed, the batch is retried).
  * Every transaction of a micro-batch stays open from its first record to the driver's
    commit, so ``kafka.transaction.timeout.ms`` (default here 15 minutes, the broker's default
    ceiling) must cover a whole micro-batch. A transaction the broker aborts in between fails
    the query; the restart repairs the batch (above). But a batch too slow for the timeout is
    as slow when it runs again: micro-batches must be bounded on the source
    (``maxOffsetsPerTrigger``), which the sink cannot see -- it warns when the query starts
    (:mod:`kafka_source.config.sink_options`).
  * Keep ``kafka.transactional.id`` (the prefix) unchanged across restarts of a query.
  * No speculative execution: two attempts of a task would fence each other and the batch
    would fail, so a write task of a session with ``spark.speculation=true`` fails at once,
    before it touches Kafka, saying so (the setting reaches the tasks as a local property;
    the driver's Python worker that makes the writer has no SparkSession to read it from).
  * A batch write (``df.write``) cannot be exactly-once: it has no checkpoint to resume from.
  * On a cluster with an authorizer the marker's OffsetCommit needs READ on the marker group
    and READ on the topic it is committed on (a written topic), besides the WRITE that the
    records and transactions need: the README lists the ACLs. The driver checks the topic's
    when the query starts (:func:`check_marker_access`), so that a missing ACL fails the query
    then, named, rather than every micro-batch at its commit.
"""

from __future__ import annotations

import base64
import logging
import time
import zlib
from typing import TYPE_CHECKING, Iterable, Mapping, NamedTuple, Sequence

import kafka.errors as Errors

from ..errors import KafkaSourceError, ProduceError

if TYPE_CHECKING:
    from ..wire.net.client import BrokerClient

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

_MARKER_PREFIX = "pk2:"      # with digests and repair rounds
_MARKER_PREFIX_V1 = "pk1:"
# Coordinator answers worth retrying while a group's coordinator starts or moves.
_COORDINATOR_RETRY = (Errors.CoordinatorLoadInProgressError, Errors.CoordinatorNotAvailableError,
                      Errors.NotCoordinatorError)


class TransactionCommitError(ProduceError):
    """The transactions of an exactly-once micro-batch could not all be committed."""


class CheckpointBehindMarkerError(KafkaSourceError):
    """The query runs a micro-batch older than the one before the last the marker records as
    committed: its checkpoint is older than the marker (an older copy was restored)."""


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


def transactional_id(prefix: str, query_id: str, task: int) -> str:
    return f"{prefix}-{query_id}-{task}"


# --- the marker's metadata ----------------------------------------------------------------------

def _uvarint(out: bytearray, value: int) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _zigzag(value: int) -> int:
    return (value << 1) if value >= 0 else ((-value << 1) - 1)


def _unzigzag(value: int) -> int:
    return (value >> 1) if not value & 1 else -((value + 1) >> 1)


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


class MarkerEntry(NamedTuple):
    """One transaction of a micro-batch, as the marker records it. ``digest`` is that of the
    rows written in it (:mod:`.digest`; None when the marker had no room for digests or was
    written by an older version); ``round`` 0 is the batch's first run, ``round`` r > 0 the
    r-th repair of a partly committed batch, whose transactions have ids of their own
    (:func:`entry_transactional_id`)."""

    task: int
    producer_id: int
    epoch: int
    digest: bytes | None = None
    round: int = 0


def entry_transactional_id(prefix: str, query_id: str, entry: MarkerEntry) -> str:
    """The transactional id of a marker entry: the task slot's for the first run, another per
    repair round (so that a repair never re-initialises -- and so fences -- an id whose
    transaction's fate the next repair still has to read from EndTxn)."""
    tid = transactional_id(prefix, query_id, entry.task)
    return tid if entry.round == 0 else f"{tid}.r{entry.round}"


def encode_marker(batch_id: int, entries: Iterable[tuple]) -> str:
    """The metadata of batch ``batch_id``'s marker: its entries (:class:`MarkerEntry`, or
    (task, producer id, epoch)) as varint deltas (tasks ascend, producer ids and epochs are
    close to each other) with each digest, deflated if that is shorter, base64: a few bytes
    per task plus 8 per digest."""
    raw = bytearray()
    _uvarint(raw, batch_id)
    prev_task, prev_round, prev_pid, prev_epoch = 0, 0, 0, 0
    for e in sorted((MarkerEntry(*e) for e in entries), key=lambda e: (e.round, e.task)):
        _uvarint(raw, e.round - prev_round)
        _uvarint(raw, e.task - (prev_task if e.round == prev_round else 0))
        _uvarint(raw, _zigzag(e.producer_id - prev_pid))
        _uvarint(raw, _zigzag(e.epoch - prev_epoch))
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
    batch_id, pos = _read_uvarint(raw, 0)
    entries = []
    task, rnd, pid, epoch = (-1 if version == _MARKER_PREFIX_V1 else 0), 0, 0, 0
    while pos < len(raw):
        digest = None
        if version == _MARKER_PREFIX_V1:
            delta, pos = _read_uvarint(raw, pos)
            task += delta + 1
        else:
            drnd, pos = _read_uvarint(raw, pos)
            dtask, pos = _read_uvarint(raw, pos)
            task = (task if drnd == 0 else 0) + dtask
            rnd += drnd
        dpid, pos = _read_uvarint(raw, pos)
        depoch, pos = _read_uvarint(raw, pos)
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


# --- executor side ------------------------------------------------------------------------------

def write_exactly_once(options, columns, batches, *, query_id: str, batch_id: int, task: int):
    """One exactly-once write task (see the module docstring). Returns a SinkCommitMessage."""
    from .digest import RowsDigest
    from .partitioner import partitions_for_keys
    from .producer import Producer
    from .task import SinkCommitMessage, acked_records, send_batches

    prefix = options.transactional_id_prefix
    with MarkerStore(options.client_config, marker_group(prefix, query_id)) as store:
        offsets = store.fetch()
        done = store.committed_batches(offsets)
        if done > batch_id + 1:
            raise CheckpointBehindMarkerError(
                f"Exactly-once micro-batch {batch_id} comes from a checkpoint older than this "
                f"query's marker in Kafka: consumer group '{store.group}' records micro-batches "
                f"up to {done - 1} as committed, so micro-batches {batch_id} to {done - 1} would "
                "be skipped as written, although Spark plans them again from the older "
                "checkpoint, possibly over other source offsets (records lost or written "
                "twice). Was an older copy of the checkpoint restored? Nothing was written. To "
                "go on where the query stopped, restore its newest checkpoint. To write from "
                "this checkpoint anyway (records the later run wrote will then be in Kafka "
                "twice), restart it with another 'kafka.transactional.id' (a new marker group), "
                "or start the query on a new checkpoint location (a new query).")
        repair = None
        if done > batch_id:
            entries = _recorded_entries(offsets, batch_id, store.group)
            fates = _settle(options, store.client, prefix, query_id, entries)
            if not _outstanding(entries, fates):
                log.info("Exactly-once batch %d was committed before the restart: task %d "
                         "writes nothing.", batch_id, task)
                for _ in batches:  # Spark feeds the rows anyway; take them and drop them
                    pass
                return SinkCommitMessage(task=task, query_id=query_id, skipped=True)
            repair = _Repair(entries, fates, task)
            log.warning("Exactly-once batch %d was recorded as committed before a restart, but "
                        "%d of its %d transaction(s) were aborted by the broker: task %d writes "
                        "its rows again unless they are those of a committed transaction.",
                        batch_id, len(_outstanding(entries, fates)), len(fates), task)
    # Creating the producer initialises the transactional id: that fences any earlier attempt
    # of this task slot (a failed task, a run before a crash) and aborts its open transaction
    # at once -- also when this attempt has nothing to write. A repair writes under an id of
    # its round, leaving the ids of the transactions it settled alone.
    tid = transactional_id(prefix, query_id, task) if repair is None else \
        entry_transactional_id(prefix, query_id, MarkerEntry(task, 0, 0, None, repair.round))
    producer = Producer(options.client_config, options.transactional_settings(tid))
    digest = RowsDigest()
    try:
        send_batches(batches, producer, columns, options.topic, partitions_for_keys,
                     digest=digest)
        handle = producer.transaction()  # flushes
        records = acked_records(producer)
    finally:
        producer.close()
    if handle is not None and not handle.partitions:
        handle = None  # nothing written: nothing to commit
    written = digest.digest()
    if repair is not None and handle is not None and repair.committed(written):
        log.info("Exactly-once batch %d, task %d: its rows are those of a committed "
                 "transaction; the rewrite is aborted.", batch_id, task)
        _end_txn(options.client_config, handle, commit=False)
        return SinkCommitMessage(task=task, query_id=query_id, skipped=True, matched=written)
    return SinkCommitMessage(task=task, records=records, query_id=query_id, transaction=handle,
                             digest=written if handle is not None else None,
                             repair_round=0 if repair is None else repair.round)


def _outstanding(entries: Sequence[MarkerEntry], fates: Sequence[bool]) -> list[MarkerEntry]:
    """The recorded transactions whose rows are not in Kafka: the aborted ones of the latest
    round. (A repair round writes again every row it does not find committed, so the aborted
    transactions of the rounds before it are covered by its own.)"""
    last = max((e.round for e in entries), default=0)
    return [e for e, ok in zip(entries, fates) if not ok and e.round == last]


class _Repair:
    """A re-run task's view of a batch recorded as committed whose transactions were not all
    committed: which rows to write again."""

    def __init__(self, entries: Sequence[MarkerEntry], fates: Sequence[bool], task: int):
        self.round = max(e.round for e in entries) + 1
        self._committed = {e.digest for e, ok in zip(entries, fates) if ok and e.digest}
        self._aborted = {e.digest for e in _outstanding(entries, fates) if e.digest}
        own = sorted((e.round, ok, e) for e, ok in zip(entries, fates) if e.task == task)
        self._own = (own[-1][2], own[-1][1]) if own else None

    def committed(self, digest: bytes) -> bool:
        """Whether rows of this ``digest`` are in a committed transaction and in no aborted
        one that nothing wrote again (then they must be written again, which may duplicate a
        committed copy of the same rows: never lose them). The task number's own latest
        transaction decides first: rows equal to what this task wrote then are skipped exactly
        when that was committed."""
        if self._own is not None and self._own[0].digest == digest:
            return self._own[1]
        return digest in self._committed and digest not in self._aborted


def _recorded_entries(offsets, batch_id: int, group: str) -> list[MarkerEntry]:
    """The entries of batch ``batch_id``'s marker among the marker group's ``offsets``."""
    recorded = [m for o, m in offsets.values() if o == batch_id + 1]
    if not recorded:
        return []
    stored_batch, entries = decode_marker(recorded[0])
    if stored_batch != batch_id:
        raise TransactionCommitError(
            f"The exactly-once marker of group '{group}' is for batch {stored_batch}, not "
            f"{batch_id}: it was written by another query or another version of this one. Use "
            "a new checkpoint or another 'kafka.transactional.id'.")
    return entries


def _settle(options, client, prefix: str, query_id: str,
            entries: Sequence[MarkerEntry]) -> list[bool]:
    """Commit every transaction the marker records (EndTxn; committing a committed one
    succeeds, and one still open is committed, as the marker says); per entry, True if it is
    committed, False if it cannot be (the broker aborted it). Any other failure is raised."""
    from .producer import TransactionFencedError, TransactionHandle

    fates = []
    for e in entries:
        # EndTxn needs no partitions; a handle without any would be skipped as empty.
        handle = TransactionHandle(entry_transactional_id(prefix, query_id, e), e.producer_id,
                                   e.epoch, (("", 0),))
        try:
            _end_txn(options.client_config, handle, commit=True, client=client)
            fates.append(True)
        except TransactionFencedError:
            fates.append(False)
    return fates


def _end_txn(client_config, handle, commit: bool, client=None) -> None:
    from .producer import end_transaction

    end_transaction(client_config, handle, commit, client=client)


# --- driver side --------------------------------------------------------------------------------

# The marker group's query id when the query's own is not known: the driver makes the writer
# without it (Spark gives the sink its options only; the tasks get the id).
_STAND_IN_QUERY_ID = "00000000-0000-0000-0000-000000000000"


def check_marker_access(options) -> None:
    """When an exactly-once query starts: :class:`MarkerAccessError` naming the missing ACL
    unless the principal may commit the marker on the ``topic`` option's topic (READ on it),
    instead of failing every micro-batch at its commit.

    The check commits nothing (:meth:`MarkerStore.check_commit_access`) for a stand-in of the
    marker group -- the prefix and a query id of zeros -- which READ on groups with the
    prefix covers, as the README asks. A principal whose READ is on this query's own group
    only (a literal ACL) is not denied for that: then only a warning says the topic could not
    be checked."""
    prefix = options.transactional_id_prefix
    with MarkerStore(options.client_config, marker_group(prefix, _STAND_IN_QUERY_ID)) as store:
        try:
            store.check_commit_access(options.topic)
        except MarkerAccessError as exc:
            if exc.resource_type != "Group":
                raise
            log.warning("Could not check that this principal may commit the exactly-once "
                        "marker on topic '%s' (READ on it): %s If READ is granted on this "
                        "query's own group only, this warning is expected.", options.topic, exc)

def _written(messages) -> list:
    """(task, handle) of every task that left a transaction to commit, by task."""
    return sorted(((m.task, m.transaction) for m in messages
                   if m is not None and m.transaction is not None), key=lambda e: e[0])


def _query_id(messages) -> str | None:
    for m in messages:
        if m is not None and m.query_id:
            return m.query_id
    return None


class _Ends:
    """EndTxn through one connection set for all of a batch's transactions."""

    def __init__(self, client: "BrokerClient"):
        self.client = client

    def end(self, options, handle, commit: bool) -> None:
        from .producer import end_transaction

        end_transaction(options.client_config, handle, commit, client=self.client)

    def end_quietly(self, options, handle, commit: bool) -> None:
        try:
            self.end(options, handle, commit)
        except Exception:  # noqa: BLE001 - best effort: the broker aborts it at the timeout
            log.warning("Could not %s transaction '%s'", "commit" if commit else "abort",
                        handle.transactional_id, exc_info=True)


def commit_batch(options, messages: Sequence, batch_id: int) -> None:
    """The driver's commit of exactly-once micro-batch ``batch_id`` (module docstring)."""
    query_id = _query_id(messages)
    if query_id is None:
        return  # no task ran
    prefix = options.transactional_id_prefix
    written = _written(messages)
    with MarkerStore(options.client_config, marker_group(prefix, query_id)) as store:
        ends = _Ends(store.client)
        offsets = store.fetch()
        if store.committed_batches(offsets) > batch_id:
            _commit_rerun(options, messages, batch_id, store, offsets, ends)
            return
        if not written:
            log.info("Exactly-once batch %d: no records written.", batch_id)
            return
        by_task = {m.task: m for m in messages if m is not None}
        entries = [MarkerEntry(task, h.producer_id, h.producer_epoch, by_task[task].digest)
                   for task, h in written]
        topic = min(t for _, h in written for t, _ in h.partitions)
        _record(store, topic, batch_id, entries)
        _end_all(options, ends, written, store, batch_id)


def _record(store: "MarkerStore", topic: str, batch_id: int,
            entries: Sequence[MarkerEntry]) -> None:
    """Commit the marker of ``batch_id`` with ``entries``; without their digests if the
    broker's offset.metadata.max.bytes has no room for them (a repair then cannot tell the
    rows of committed transactions from others, and writes them all again)."""
    try:
        store.commit({(topic, 0): (batch_id + 1, encode_marker(batch_id, entries))})
        return
    except TransactionCommitError:
        if not any(e.digest for e in entries):
            raise
    log.warning("The exactly-once marker of batch %d has no room for the digests of its %d "
                "transactions (broker setting offset.metadata.max.bytes): it is recorded "
                "without them. Should the batch be committed only in part, its restart writes "
                "all its rows again, so the records of its committed transactions would be "
                "in Kafka twice.", batch_id, len(entries))
    store.commit({(topic, 0): (batch_id + 1, encode_marker(
        batch_id, [e._replace(digest=None) for e in entries]))})


def _commit_rerun(options, messages: Sequence, batch_id: int, store: "MarkerStore", offsets,
                  ends: "_Ends") -> None:
    """The commit of a re-run of ``batch_id``, whose commit was recorded before a restart:
    finish that commit (EndTxn of every recorded transaction). If the broker had aborted some
    of them, the re-run's tasks wrote those rows again (:class:`_Repair`): record their
    transactions in the marker beside the first ones, then commit them."""
    prefix = options.transactional_id_prefix
    query_id = _query_id(messages)
    written = _written(messages)
    entries = _recorded_entries(offsets, batch_id, store.group)
    fates = _settle(options, store.client, prefix, query_id, entries)
    if not _outstanding(entries, fates):
        # Every task saw the marker complete and wrote nothing; what one wrote anyway would be
        # a duplicate.
        for _, h in written:
            ends.end_quietly(options, h, commit=False)
        if entries:
            log.warning("Exactly-once batch %d was recorded as committed before a restart: "
                        "completed the commit of its %d transaction(s).", batch_id,
                        len(entries))
        else:
            log.info("Exactly-once batch %d: committed before.", batch_id)
        return
    aborted = len(_outstanding(entries, fates))
    if not written:
        raise TransactionCommitError(
            f"Exactly-once batch {batch_id}: {aborted} of its {len(entries)} recorded "
            "transaction(s) were aborted by the broker, and the re-run's tasks found all their "
            "rows in committed transactions -- which cannot be. Nothing more is committed; "
            "report this, with the query's logs.")
    by_task = {m.task: m for m in messages if m is not None}
    new = [MarkerEntry(task, h.producer_id, h.producer_epoch, by_task[task].digest,
                       by_task[task].repair_round) for task, h in written]
    matched = {m.matched for m in messages if m is not None and m.matched}
    unrecognised = [e for e, ok in zip(entries, fates) if ok and e.digest not in matched]
    records = sum(by_task[t].total for t, _ in written)
    log.warning("Exactly-once batch %d was recorded as committed before a restart, but the "
                "broker had aborted %d of its %d transaction(s): committing the %d record(s) "
                "the re-run wrote again in %d task(s).", batch_id, aborted, len(entries),
                records, len(written))
    if unrecognised:
        log.warning("Exactly-once batch %d: the rows of %d committed transaction(s) were not "
                    "found again in the re-run's tasks (the re-run grouped its rows "
                    "otherwise); some of them may now be in Kafka twice.", batch_id,
                    len(unrecognised))
    topic = min(t for _, h in written for t, _ in h.partitions)
    _record(store, topic, batch_id, list(entries) + new)
    _end_all(options, ends, written, store, batch_id)


def _end_all(options, ends: _Ends, written, store: MarkerStore, batch_id: int) -> None:
    """EndTxn(commit) every handle. If the broker aborted some (transaction timeout), commit
    the others all the same -- the marker records them as committed -- and fail: the restart
    writes the rows of the aborted ones again (:class:`_Repair`)."""
    from .producer import TransactionFencedError

    committed = 0
    failed = []
    for task, h in written:
        try:
            ends.end(options, h, commit=True)
            committed += 1
        except TransactionFencedError as exc:
            failed.append((task, h, exc))
        except Exception as exc:
            raise TransactionCommitError(
                f"Could not commit the transaction '{h.transactional_id}' of exactly-once "
                f"batch {batch_id}: {exc} The batch is recorded as committed (group "
                f"'{store.group}'): restarting the query completes its commit.") from exc
    if failed:
        task, h, exc = failed[0]
        raise TransactionCommitError(
            f"Exactly-once batch {batch_id} was committed only in part: {len(failed)} of its "
            f"{len(written)} transaction(s) can no longer be committed, the first the "
            f"transaction '{h.transactional_id}' of task {task} ({exc}) -- most likely the "
            "broker aborted them because the batch took longer than "
            "'kafka.transaction.timeout.ms' from its first record to its commit. The "
            f"{committed} other(s) are committed. When the query restarts, the batch runs "
            "again and its tasks write the rows of the aborted transactions only (rows of "
            "committed transactions are recognised by their digest, as long as the re-run "
            "gives each task the same rows as this run did; rows it groups otherwise are "
            "written again, never lost). Raise 'kafka.transaction.timeout.ms' (up to the "
            "broker's transaction.max.timeout.ms) or make micro-batches smaller.") from exc
    log.info("Exactly-once batch %d: committed %d transaction(s).", batch_id, committed)


def abort_batch(options, messages: Sequence, batch_id: int) -> None:
    """The driver's abort of exactly-once micro-batch ``batch_id`` (module docstring)."""
    from .producer import abort_stale_transaction

    query_id = _query_id(messages)
    if query_id is None:
        return  # no task got far enough to say which query it is: restarts fence the slots
    prefix = options.transactional_id_prefix
    with MarkerStore(options.client_config, marker_group(prefix, query_id)) as store:
        if store.committed_batches() > batch_id:
            log.warning("Exactly-once batch %d failed after its commit was recorded: its "
                        "transactions are committed when the query restarts.", batch_id)
            # A failed repair's own transactions are not in the marker: abort them now
            # rather than hold read_committed readers up until the broker times them out.
            ends = _Ends(store.client)
            for m in messages:
                if m is not None and m.transaction is not None and m.repair_round:
                    ends.end_quietly(options, m.transaction, commit=False)
            return
        ends = _Ends(store.client)
        for _, h in _written(messages):
            ends.end_quietly(options, h, commit=False)
        # Tasks that failed may have left a transaction open: fence their slots now, so that
        # read_committed readers are not held up until the transaction timeout.
        for task, m in enumerate(messages):
            if m is None:
                tid = transactional_id(prefix, query_id, task)
                try:
                    abort_stale_transaction(
                        options.client_config, tid, store.client.request_timeout_ms,
                        transaction_timeout_ms=options.producer.transaction_timeout_ms,
                        client=store.client)
                except Exception:  # noqa: BLE001
                    log.warning("Could not fence transactional id '%s'", tid, exc_info=True)
