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
     N was committed before the driver crashed and Spark re-runs it: the task writes nothing
     and reports "skipped". If it covers N + 1 too, the checkpoint is older than the marker
     (an older copy restored): Spark plans batches again that the marker calls written, maybe
     over other offsets, so the task fails, saying what to do, rather than skip them.
  2. Else it writes everything in one transaction with the transactional id
     ``{prefix}-{queryId}-{p}``, flushes, and returns the open transaction's handle
     (transactional id, producer id, epoch). The id is stable per task slot, so a retried
     attempt's InitProducerId fences the failed attempt and aborts its transaction at once.

On the driver, ``commit(messages, N)``
  1. Records the commit: OffsetCommit of the marker group, one partition of a topic written,
     offset N + 1, and as metadata the handles, compactly (the transactional ids follow from
     the prefix, query id and task numbers, so only task, producer id and epoch are stored).
  2. Commits each transaction (EndTxn). A commit repeated on a committed transaction succeeds.
  3. If the marker already covered N (a re-run after a crash anywhere between step 1 and
     Spark's commit log): commits the handles stored in the marker again -- finishing what the
     crashed driver began -- and aborts whatever the re-run wrote (normally nothing).
  If a transaction cannot be committed because the broker aborted it (the batch took longer
  than ``kafka.transaction.timeout.ms`` from its first record to the commit), the batch cannot
  be made whole: the remaining transactions are aborted, the marker is set back to N so that a
  restart writes batch N again, and the query fails saying so -- records of the transactions
  already committed are then written twice, never lost.

``abort(messages, N)`` aborts the transactions of the tasks that succeeded, and fences the task
slots that failed (InitProducerId aborts their transactions now rather than at the timeout) --
unless the marker shows that N's commit was recorded: then the transactions are left for the
restart to commit.

Limits
  * Readers must use ``kafka.isolation.level=read_committed``.
  * The marker's metadata must fit the broker's ``offset.metadata.max.bytes`` (4096 by
    default): about 4 to 6 bytes per task that wrote records, i.e. several hundred tasks; more
    fails the commit with an error saying so (nothing is committed, the batch is retried).
  * Every transaction of a micro-batch stays open from its first record to the driver's
    commit, so ``kafka.transaction.timeout.ms`` (default here 15 minutes, the broker's default
    ceiling) must cover a whole micro-batch. A transaction the broker aborts in between makes
    the batch be written again after the restart: records of the batch's transactions
    committed before the failure are then in Kafka twice (never lost). The restart writes the
    same rows, so only a larger timeout gets past it: micro-batches must be bounded on the
    source (``maxOffsetsPerTrigger``), which the sink cannot see -- it warns when the query
    starts (:mod:`kafka_source.config.sink_options`).
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
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import kafka.errors as Errors

from ..errors import KafkaSourceError, ProduceError

if TYPE_CHECKING:
    from ..wire.net.client import BrokerClient

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

_MARKER_PREFIX = "pk1:"
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


def encode_marker(batch_id: int, entries: Iterable[tuple[int, int, int]]) -> str:
    """The metadata of batch ``batch_id``'s marker: its (task, producer id, epoch) entries as
    varint deltas (tasks ascend, producer ids and epochs are close to each other), deflated if
    that is shorter, base64: a few bytes per task."""
    raw = bytearray()
    _uvarint(raw, batch_id)
    prev_task, prev_pid, prev_epoch = -1, 0, 0
    for task, pid, epoch in sorted(entries):
        _uvarint(raw, task - prev_task - 1)
        _uvarint(raw, _zigzag(pid - prev_pid))
        _uvarint(raw, _zigzag(epoch - prev_epoch))
        prev_task, prev_pid, prev_epoch = task, pid, epoch
    packed = zlib.compress(bytes(raw), 9)
    body = b"z" + packed if len(packed) < len(raw) else b"r" + bytes(raw)
    return _MARKER_PREFIX + base64.b64encode(body).decode("ascii")


def decode_marker(text: str) -> tuple[int, list[tuple[int, int, int]]]:
    if not text or not text.startswith(_MARKER_PREFIX):
        raise ValueError(f"not an exactly-once marker: {text[:40]!r}")
    body = base64.b64decode(text[len(_MARKER_PREFIX):])
    raw = zlib.decompress(body[1:]) if body[:1] == b"z" else body[1:]
    batch_id, pos = _read_uvarint(raw, 0)
    entries = []
    task, pid, epoch = -1, 0, 0
    while pos < len(raw):
        delta, pos = _read_uvarint(raw, pos)
        dpid, pos = _read_uvarint(raw, pos)
        depoch, pos = _read_uvarint(raw, pos)
        task, pid, epoch = task + delta + 1, pid + _unzigzag(dpid), epoch + _unzigzag(depoch)
        entries.append((task, pid, epoch))
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
    from .partitioner import partitions_for_keys
    from .producer import Producer
    from .task import SinkCommitMessage, acked_records, send_batches

    prefix = options.transactional_id_prefix
    with MarkerStore(options.client_config, marker_group(prefix, query_id)) as store:
        done = store.committed_batches()
    if done > batch_id + 1:
        raise CheckpointBehindMarkerError(
            f"Exactly-once micro-batch {batch_id} comes from a checkpoint older than this "
            f"query's marker in Kafka: consumer group '{store.group}' records micro-batches up "
            f"to {done - 1} as committed, so micro-batches {batch_id} to {done - 1} would be "
            "skipped as written, although Spark plans them again from the older checkpoint, "
            "possibly over other source offsets (records lost or written twice). Was an older "
            "copy of the checkpoint restored? Nothing was written. To go on where the query "
            "stopped, restore its newest checkpoint. To write from this checkpoint anyway "
            "(records the later run wrote will then be in Kafka twice), restart it with another "
            "'kafka.transactional.id' (a new marker group), or start the query on a new "
            "checkpoint location (a new query).")
    if done > batch_id:
        log.info("Exactly-once batch %d was committed before the restart: task %d writes "
                 "nothing.", batch_id, task)
        for _ in batches:  # Spark feeds the rows anyway; take them and drop them
            pass
        return SinkCommitMessage(task=task, query_id=query_id, skipped=True)
    # Creating the producer initialises the transactional id: that fences any earlier attempt
    # of this task slot (a failed task, a run before a crash) and aborts its open transaction
    # at once -- also when this attempt has nothing to write.
    producer = Producer(options.client_config,
                        options.transactional_settings(transactional_id(prefix, query_id, task)))
    try:
        send_batches(batches, producer, columns, options.topic, partitions_for_keys)
        handle = producer.transaction()  # flushes
        records = acked_records(producer)
    finally:
        producer.close()
    if handle is not None and not handle.partitions:
        handle = None  # nothing written: nothing to commit
    return SinkCommitMessage(task=task, records=records, query_id=query_id, transaction=handle)


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
    from .producer import TransactionHandle

    query_id = _query_id(messages)
    if query_id is None:
        return  # no task ran
    prefix = options.transactional_id_prefix
    written = _written(messages)
    with MarkerStore(options.client_config, marker_group(prefix, query_id)) as store:
        ends = _Ends(store.client)
        offsets = store.fetch()
        if store.committed_batches(offsets) > batch_id:
            # A re-run of a batch whose commit was recorded: finish that commit. What this run
            # wrote (normally nothing: every task saw the marker) would be a duplicate.
            for _, h in written:
                ends.end_quietly(options, h, commit=False)
            recorded = [(tp, m) for tp, (o, m) in offsets.items() if o == batch_id + 1]
            if not recorded:
                log.info("Exactly-once batch %d: committed before.", batch_id)
                return
            tp, text = recorded[0]
            stored_batch, entries = decode_marker(text)
            if stored_batch != batch_id:
                raise TransactionCommitError(
                    f"The exactly-once marker of group '{store.group}' is for batch "
                    f"{stored_batch}, not {batch_id}: it was written by another query or "
                    "another version of this one. Use a new checkpoint or another "
                    "'kafka.transactional.id'.")
            log.warning("Exactly-once batch %d was recorded as committed before a restart: "
                        "completing the commit of its %d transaction(s).", batch_id,
                        len(entries))
            # EndTxn needs no partitions; a handle without any would be skipped as empty.
            _end_all(options, ends, [
                (task, TransactionHandle(transactional_id(prefix, query_id, task), pid, epoch,
                                         (tp,)))
                for task, pid, epoch in entries], store, batch_id)
            return
        if not written:
            log.info("Exactly-once batch %d: no records written.", batch_id)
            return
        entries = [(task, h.producer_id, h.producer_epoch) for task, h in written]
        topic = min(t for _, h in written for t, _ in h.partitions)
        store.commit({(topic, 0): (batch_id + 1, encode_marker(batch_id, entries))})
        _end_all(options, ends, written, store, batch_id)


def _end_all(options, ends: _Ends, written, store: MarkerStore, batch_id: int) -> None:
    """EndTxn(commit) every handle. If the broker aborted one (transaction timeout), abort the
    rest, set the marker back to ``batch_id`` and fail: a restart writes the batch again."""
    from .producer import TransactionFencedError

    committed = 0
    for i, (task, h) in enumerate(written):
        try:
            ends.end(options, h, commit=True)
            committed += 1
            continue
        except TransactionFencedError as exc:
            failed = exc
        except Exception as exc:
            raise TransactionCommitError(
                f"Could not commit the transaction '{h.transactional_id}' of exactly-once "
                f"batch {batch_id}: {exc} The batch is recorded as committed (group "
                f"'{store.group}'): restarting the query completes its commit.") from exc
        for _, rest in written[i + 1:]:
            ends.end_quietly(options, rest, commit=False)
        rewind = {tp: (batch_id, "") for tp, (o, _) in store.fetch().items() if o > batch_id}
        if rewind:
            store.commit(rewind)
        raise TransactionCommitError(
            f"Exactly-once batch {batch_id} could not be committed: the transaction "
            f"'{h.transactional_id}' of task {task} can no longer be committed ({failed}) -- "
            "most likely the broker aborted it because the batch took longer than "
            "'kafka.transaction.timeout.ms' from its first record to its commit. "
            f"{committed} of {len(written)} transaction(s) were committed before it; the batch "
            "is written again when the query restarts, so their records will be in Kafka "
            "twice (none is lost). Raise 'kafka.transaction.timeout.ms' (up to the broker's "
            "transaction.max.timeout.ms) or make micro-batches smaller.") from failed
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
