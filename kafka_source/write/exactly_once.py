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
  2. Commits each transaction (EndTxn), all at once (:mod:`.ending`). A commit repeated on a
     committed transaction succeeds.
  3. If the broker aborted some of them (the batch took longer than
     ``kafka.transaction.timeout.ms`` from its first record to the commit), it still commits
     the others -- the marker records them as committed -- and fails the query, saying so:
     the restart repairs the batch.

Re-runs (the marker covers N: the driver crashed between step 1 and Spark's commit log)
  The task *settles* every transaction the marker records: EndTxn(commit) of each, all at
  once, which finishes a commit the crashed driver began, and tells which of them the broker
  aborted meanwhile (a fenced epoch). If none was, the batch is whole: the task writes
  nothing, and the driver's commit settles them once more. This is the usual case. A Python
  worker settles a batch once: its later tasks of the re-run reuse the fates (final, either
  way), so a re-run costs EndTxn per worker and transaction, not per task and transaction.

  If some were aborted -- a driver that died between two EndTxn calls and came back after the
  transaction timeout, or step 3 -- the batch is committed in part, and writing it all again
  would put the committed transactions' records in Kafka twice. So each task writes its rows
  in a transaction of a *repair round* (the id ``{prefix}-{queryId}-{p}.r{round}``: the ids
  being settled are never re-initialised, so their fate stays readable), and compares the
  digest of its rows with the recorded ones: rows of a committed transaction (its own task
  number's first, else any other's) are not written again (the task reports them matched);
  the others are. The task holds its rows and compares before writing anything
  (:mod:`.held_rows`: up to ``_REPAIR_HOLD_BYTES``, 64 MiB of Arrow, in memory, the rest on
  the executor's local disk), so committed rows are not written again at all, not even as
  aborted records.
  The driver records the repair's transactions in the marker beside the first ones and
  commits them. A repair that fails in turn is repaired by the next re-run, in the next
  round; the aborted transactions of earlier rounds are covered by the rounds after them,
  since a round writes every row it does not find committed.

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
    records and transactions need: docs/writing.md lists the ACLs. The driver checks the topic's
    when the query starts (:func:`check_marker_access`), so that a missing ACL fails the query
    then, named, rather than every micro-batch at its commit.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

from ..errors import KafkaSourceError
from .held_rows import HeldRows
from .marker import (MarkerAccessError, MarkerEntry, MarkerStore, TransactionCommitError,
                     decode_marker, encode_marker, marker_group, transactional_id)

if TYPE_CHECKING:
    from ..wire.net.client import BrokerClient

log = logging.getLogger(__name__)

__all__ = ["CheckpointBehindMarkerError", "MarkerAccessError", "MarkerEntry", "MarkerStore",
           "TransactionCommitError", "abort_batch", "check_marker_access", "commit_batch",
           "decode_marker", "encode_marker", "marker_group", "transactional_id",
           "write_exactly_once"]


class CheckpointBehindMarkerError(KafkaSourceError):
    """The query runs a micro-batch older than the one before the last the marker records as
    committed: its checkpoint is older than the marker (an older copy was restored)."""


# EndTxn, for the tasks of a re-run and for the driver

class _Ends:
    """EndTxn through one connection set for all of a batch's transactions, all of them at
    once (:mod:`.ending`): the driver commits one transaction per write task before the next
    micro-batch can start, and each task of a re-run settles every one the marker records."""

    def __init__(self, client: "BrokerClient"):
        self.client = client

    def end_each(self, handles: Sequence, commit: bool) -> list:
        """Per handle, in order: None if it was ended as asked, else its failure (every one
        is attempted, see :func:`.ending.end_each`)."""
        from .ending import end_each

        return end_each(self.client, list(handles), commit)

    def end_quietly(self, handles: Sequence, commit: bool) -> None:
        """End them all, logging failures: best effort, the broker aborts what is left open
        at the transaction timeout."""
        try:
            errors = self.end_each(handles, commit)
        except Exception:  # noqa: BLE001
            log.warning("Could not %s %d transaction(s)", "commit" if commit else "abort",
                        len(handles), exc_info=True)
            return
        for h, error in zip(handles, errors):
            if error is not None:
                log.warning("Could not %s transaction '%s': %s",
                            "commit" if commit else "abort", h.transactional_id, error)


# --- executor side ------------------------------------------------------------------------------

def write_exactly_once(options, columns, batches, *, query_id: str, batch_id: int, task: int):
    """One exactly-once write task (see the module docstring). Returns a SinkCommitMessage."""
    from .digest import RowsDigest
    from .partitioner import partitions_for_keys
    from .producer import Producer
    from .task import SinkCommitMessage, acked_records, digest_batches, send_batches

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
            fates = _settle_once(_Ends(store.client), options, query_id, entries)
            outstanding = _outstanding(entries, fates)
            if not outstanding:
                log.info("Exactly-once batch %d was committed before the restart: task %d "
                         "writes nothing.", batch_id, task)
                for _ in batches:  # Spark feeds the rows anyway; take them and drop them
                    pass
                return SinkCommitMessage(task=task, query_id=query_id, skipped=True)
            repair = _Repair(entries, fates, task)
            log.warning("Exactly-once batch %d was recorded as committed before a restart, but "
                        "%d of its %d transaction(s) were aborted by the broker: task %d writes "
                        "its rows again unless they are those of a committed transaction.",
                        batch_id, len(outstanding), len(fates), task)
    # Creating the producer initialises the transactional id: that fences any earlier attempt
    # of this task slot (a failed task, a run before a crash) and aborts its open transaction
    # at once -- also when this attempt has nothing to write. A repair writes under an id of
    # its round, leaving the ids of the transactions it settled alone.
    tid = transactional_id(prefix, query_id, task, 0 if repair is None else repair.round)
    with contextlib.ExitStack() as stack:
        known = None
        if repair is not None:
            # The rows are recognised before anything is written (module docstring).
            held = stack.enter_context(HeldRows(batches, _REPAIR_HOLD_BYTES))
            if held.path is not None:
                log.info("Exactly-once batch %d, task %d: %d bytes of its rows past the first "
                         "%d are held on local disk (%s) to be compared before writing.",
                         batch_id, task, held.spilled_bytes, _REPAIR_HOLD_BYTES, held.path)
            known = digest_batches(held, columns, options.topic).digest()
            batches = held
        producer = Producer(options.client_config, options.transactional_settings(tid))
        if known is not None and repair.committed(known):
            producer.close()     # made anyway: it fenced any earlier attempt of this task slot
            log.info("Exactly-once batch %d, task %d: its rows are those of a committed "
                     "transaction; nothing is written again.", batch_id, task)
            return SinkCommitMessage(task=task, query_id=query_id, skipped=True, matched=known)
        digest = RowsDigest() if known is None else None     # held rows: known already
        try:
            send_batches(batches, producer, columns, options.topic, partitions_for_keys,
                         digest=digest)
            handle = producer.transaction()  # flushes
            records = acked_records(producer)
        finally:
            producer.close()
    if handle is not None and not handle.partitions:
        handle = None  # nothing written: nothing to commit
    written = known if digest is None else digest.digest()
    return SinkCommitMessage(task=task, records=records, query_id=query_id, transaction=handle,
                             digest=written if handle is not None else None,
                             repair_round=0 if repair is None else repair.round)


#: How many bytes of Arrow rows a task of a repair holds in memory (the rest on local disk) to
#: recognise them before writing.
_REPAIR_HOLD_BYTES = 64 << 20


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
        self._own = max(((e, ok) for e, ok in zip(entries, fates) if e.task == task),
                        key=lambda own: own[0].round, default=None)

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


# Fates of settled batches, per Python worker. Every task of a re-run settles all of the
# batch's recorded transactions, and a worker runs its share of the tasks one after another. A
# fate is final -- a committed transaction stays committed, an aborted one aborted -- so the
# tasks after the first in a worker take it from here: n tasks on w workers send w x n EndTxn
# instead of n x n (40,000 for a batch of 200 tasks). Failures other than fencing are raised,
# not kept: the next task tries again.
_SETTLED: "OrderedDict[tuple, tuple[bool, ...]]" = OrderedDict()
_SETTLED_LOCK = threading.Lock()
_SETTLED_KEPT = 16


def _settle_once(ends: "_Ends", options, query_id: str,
                 entries: Sequence[MarkerEntry]) -> list[bool]:
    """:func:`_settle`, once per Python worker for the same cluster, query and entries."""
    prefix = options.transactional_id_prefix
    key = (str(options.client_config.get("bootstrap_servers")), prefix, query_id,
           tuple(entries))
    with _SETTLED_LOCK:
        fates = _SETTLED.get(key)
    if fates is None:
        fates = tuple(_settle(ends, prefix, query_id, entries))
        with _SETTLED_LOCK:
            _SETTLED[key] = fates
            while len(_SETTLED) > _SETTLED_KEPT:
                _SETTLED.popitem(last=False)
    return list(fates)


def _settle(ends: "_Ends", prefix: str, query_id: str,
            entries: Sequence[MarkerEntry]) -> list[bool]:
    """Commit every transaction the marker records (EndTxn; committing a committed one
    succeeds, and one still open is committed, as the marker says), all at once; per entry, in
    the entries' order, True if it is committed, False if it cannot be (the broker aborted
    it). Any other failure is raised -- the first in the entries' order -- once every entry
    was attempted, so that no transaction the marker calls committed stays open for it."""
    from .producer import TransactionFencedError, TransactionHandle

    # EndTxn needs no partitions; a handle without any would be skipped as empty.
    handles = [TransactionHandle(transactional_id(prefix, query_id, e.task, e.round),
                                 e.producer_id, e.epoch, (("", 0),)) for e in entries]
    errors = ends.end_each(handles, commit=True)
    for error in errors:
        if error is not None and not isinstance(error, TransactionFencedError):
            raise error
    return [error is None for error in errors]


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
    prefix covers, as docs/writing.md asks. A principal whose READ is on this query's own group
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
            _commit_rerun(options, messages, written, query_id, batch_id, store, offsets, ends)
            return
        if not written:
            log.info("Exactly-once batch %d: no records written.", batch_id)
            return
        _record(store, written, batch_id, _entries_of(messages, written))
        _end_all(ends, written, store, batch_id)


def _entries_of(messages, written) -> list[MarkerEntry]:
    """The marker entries of the transactions ``written`` (:func:`_written`) by ``messages``."""
    by_task = {m.task: m for m in messages if m is not None}
    return [MarkerEntry(task, h.producer_id, h.producer_epoch, by_task[task].digest,
                        by_task[task].repair_round) for task, h in written]


def _record(store: "MarkerStore", written, batch_id: int,
            entries: Sequence[MarkerEntry]) -> None:
    """Commit the marker of ``batch_id`` with ``entries``, on partition 0 of a topic
    ``written`` to; without their digests if the broker's offset.metadata.max.bytes has no
    room for them (a repair then cannot tell the rows of committed transactions from others,
    and writes them all again)."""
    topic = min(t for _, h in written for t, _ in h.partitions)
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


def _commit_rerun(options, messages: Sequence, written, query_id: str, batch_id: int,
                  store: "MarkerStore", offsets, ends: "_Ends") -> None:
    """The commit of a re-run of ``batch_id``, whose commit was recorded before a restart:
    finish that commit (EndTxn of every recorded transaction). If the broker had aborted some
    of them, the re-run's tasks wrote those rows again (:class:`_Repair`): record their
    transactions in the marker beside the first ones, then commit them."""
    entries = _recorded_entries(offsets, batch_id, store.group)
    fates = _settle(ends, options.transactional_id_prefix, query_id, entries)
    aborted = len(_outstanding(entries, fates))
    if not aborted:
        # Every task saw the marker complete and wrote nothing; what one wrote anyway would be
        # a duplicate.
        ends.end_quietly([h for _, h in written], commit=False)
        if entries:
            log.warning("Exactly-once batch %d was recorded as committed before a restart: "
                        "completed the commit of its %d transaction(s).", batch_id,
                        len(entries))
        else:
            log.info("Exactly-once batch %d: committed before.", batch_id)
        return
    if not written:
        raise TransactionCommitError(
            f"Exactly-once batch {batch_id}: {aborted} of its {len(entries)} recorded "
            "transaction(s) were aborted by the broker, and the re-run's tasks found all their "
            "rows in committed transactions -- which cannot be. Nothing more is committed; "
            "report this, with the query's logs.")
    matched = {m.matched for m in messages if m is not None and m.matched}
    unrecognised = [e for e, ok in zip(entries, fates) if ok and e.digest not in matched]
    records = sum(m.total for m in messages if m is not None and m.transaction is not None)
    log.warning("Exactly-once batch %d was recorded as committed before a restart, but the "
                "broker had aborted %d of its %d transaction(s): committing the %d record(s) "
                "the re-run wrote again in %d task(s).", batch_id, aborted, len(entries),
                records, len(written))
    if unrecognised:
        log.warning("Exactly-once batch %d: the rows of %d committed transaction(s) were not "
                    "found again in the re-run's tasks (the re-run grouped its rows "
                    "otherwise); some of them may now be in Kafka twice.", batch_id,
                    len(unrecognised))
    _record(store, written, batch_id, list(entries) + _entries_of(messages, written))
    _end_all(ends, written, store, batch_id)


def _end_all(ends: _Ends, written, store: MarkerStore, batch_id: int) -> None:
    """EndTxn(commit) every handle, all at once. If the broker aborted some (transaction
    timeout), commit the others all the same -- the marker records them as committed -- and
    fail: the restart writes the rows of the aborted ones again (:class:`_Repair`). Any other
    failure (a coordinator unreachable within the request timeout) fails the batch too, after
    every other transaction was committed: the restart completes the commit."""
    from .producer import TransactionFencedError

    errors = ends.end_each([h for _, h in written], commit=True)
    committed = sum(1 for e in errors if e is None)
    failed = [(task, h, e) for (task, h), e in zip(written, errors)
              if isinstance(e, TransactionFencedError)]
    other = [(task, h, e) for (task, h), e in zip(written, errors)
             if e is not None and not isinstance(e, TransactionFencedError)]
    if other:
        task, h, exc = other[0]
        more = len(other) + len(failed) - 1
        raise TransactionCommitError(
            f"Could not commit the transaction '{h.transactional_id}' of exactly-once "
            f"batch {batch_id}: {exc}"
            + (f" ({more} other transaction(s) of the batch failed too; {committed} of its "
               f"{len(written)} are committed.)" if more else "")
            + f" The batch is recorded as committed (group '{store.group}'): restarting the "
            "query completes its commit.") from exc
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
        ends = _Ends(store.client)
        if store.committed_batches() > batch_id:
            log.warning("Exactly-once batch %d failed after its commit was recorded: its "
                        "transactions are committed when the query restarts.", batch_id)
            # A failed repair's own transactions are not in the marker: abort them now
            # rather than hold read_committed readers up until the broker times them out.
            ends.end_quietly([m.transaction for m in messages if m is not None
                              and m.transaction is not None and m.repair_round], commit=False)
            return
        ends.end_quietly([h for _, h in _written(messages)], commit=False)
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
