"""Idempotence and transactions: the producer's id and epoch, and the transactions that the
Spark driver commits or aborts.

Idempotence (default, needs acks=all)
    InitProducerId once per producer, then every batch carries the partition's next sequence
    number (given when a batch is cut, :mod:`kafka_source.write.batches`); how retries keep the
    sequences in order is in :mod:`kafka_source.write.sending`.

Transactions
    With ``transactional_id`` the producer finds the transaction coordinator and calls
    InitProducerId for the id when it is created (which fences older producers of that id and
    aborts their open transaction), adds every partition to the transaction
    (AddPartitionsToTxn) before writing to it, and marks its batches transactional.
    ``Producer.transaction`` flushes and returns a :class:`TransactionHandle`; nothing is
    committed there: the handle travels to the Spark driver, which commits or aborts it with
    those of the other tasks once every task succeeded (:mod:`kafka_source.write.ending`).

The executor's side is :class:`Transactional`, methods of
:class:`~kafka_source.write.producer.Producer` (a mixin, for the reason given in
:mod:`kafka_source.write.batches`). The driver's side -- :func:`abort_stale_transaction` here,
and ending transactions, many at once (:mod:`kafka_source.write.ending`) -- needs no producer,
only a connection. Both get producer ids with :func:`_init_producer_id`: a new producer fences
the older ones of its id just as :func:`abort_stale_transaction` does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Mapping

import kafka.errors as Errors
from kafka.protocol.producer import AddPartitionsToTxnRequest, InitProducerIdRequest

from ..config.sink_options import DEFAULT_EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS
from ..errors import ProduceError
from ..wire.net.client import BrokerClient, RetriableBrokerError, error_for
from .batches import TopicPartition
from .clock import Clock
from .produce_errors import FENCED, NONE, produce_error

# Logged under the producer's name, so that logging set up for kafka_source.write.producer
# covers its messages too.
log = logging.getLogger("kafka_source.write.producer")

__all__ = ["COORDINATOR_MOVED", "TXN_RETRY_BACKOFF_S", "TransactionFencedError",
           "TransactionHandle", "Transactional", "abort_stale_transaction"]

# Protocol version caps (see the docstring of kafka_source.write.producer).
_INIT_PRODUCER_ID_MAX_VERSION = 4
_ADD_PARTITIONS_MAX_VERSION = 3

TXN_RETRY_BACKOFF_S = 0.02       # CONCURRENT_TRANSACTIONS clears within milliseconds (Java: 20 ms)
COORDINATOR_MOVED = (Errors.CoordinatorNotAvailableError, Errors.NotCoordinatorError,
                     Errors.CoordinatorLoadInProgressError)


@dataclass(frozen=True)
class TransactionHandle:
    """An open transaction, as the executor leaves it for the driver to commit or abort.

    Picklable (plain fields): it travels to the Spark driver in a commit message.
    ``partitions`` are the partitions written in it; empty when nothing was written, and then
    there is nothing to commit (:func:`~kafka_source.write.ending.end_transaction` does
    nothing)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]


class TransactionFencedError(ProduceError):
    """The transaction can no longer be committed: its producer epoch is not the current one of
    its transactional id. Either a newer producer of the same id initialised (a retried or
    speculative task, or :func:`abort_stale_transaction`), or the broker aborted the transaction
    because it stayed open longer than ``kafka.transaction.timeout.ms``. Either way its records
    are not (and will never be) committed."""


# --------------------------------------------------------------------------------------------
# Executor side: the producer's id and its transaction
# --------------------------------------------------------------------------------------------

class Transactional:
    """The :class:`~kafka_source.write.producer.Producer` methods that get its producer id and
    epoch and add partitions to its transaction (see the module docstring).

    A mixin of the producer: they set its ``_producer_id`` and ``_producer_epoch`` and keep
    ``_txn_partitions`` and ``_txn_node``."""

    def _init_producer_id(self) -> None:
        deadline = self._clock.now() + self.settings.max_block_ms / 1000
        self._producer_id, self._producer_epoch = _init_producer_id(
            self._client, self._transactional_id, self.settings.transaction_timeout_ms,
            deadline=deadline, backoff_s=self.settings.retry_backoff_ms / 1000,
            clock=self._clock, deadline_option="kafka.max.block.ms")
        log.debug("producer id %d epoch %d%s", self._producer_id, self._producer_epoch,
                  f" for transactional id '{self._transactional_id}'"
                  if self._transactional_id else "")

    def _add_to_transaction(self, tps: Iterable[TopicPartition]) -> None:
        """AddPartitionsToTxn for the partitions not yet in the transaction (before any batch
        of theirs is sent, as the broker requires)."""
        new = sorted(set(tps) - self._txn_partitions)
        if not new:
            return
        tid = self._transactional_id
        deadline = self._clock.now() + self.settings.max_block_ms / 1000
        by_topic: dict[str, list[int]] = {}
        for topic, partition in new:
            by_topic.setdefault(topic, []).append(partition)
        Topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        last = None
        while True:
            retry_s = self.settings.retry_backoff_ms / 1000
            try:
                if self._txn_node is None:
                    self._txn_node = self._client.find_transaction_coordinator(tid)
                request = AddPartitionsToTxnRequest(
                    v3_and_below_transactional_id=tid,
                    v3_and_below_producer_id=self._producer_id,
                    v3_and_below_producer_epoch=self._producer_epoch,
                    v3_and_below_topics=[Topic(name=t, partitions=ps)
                                         for t, ps in by_topic.items()],
                    max_version=_ADD_PARTITIONS_MAX_VERSION)
                response = self._client.send(self._txn_node, request)
                errors = {}
                for topic in response.results_by_topic_v3_and_below:
                    for result in topic.results_by_partition:
                        if result.partition_error_code != NONE:
                            errors[(topic.name, result.partition_index)] = \
                                error_for(result.partition_error_code)
                if not errors:
                    self._txn_partitions.update(new)
                    return
                kinds = set(errors.values()) - {Errors.OperationNotAttemptedError}
                first_tp, first = min(((tp, e) for tp, e in errors.items()
                                       if e in kinds), default=next(iter(errors.items())))
                last = f"{first.__name__} for topic '{first_tp[0]}' partition {first_tp[1]}"
                if any(e in FENCED for e in kinds):
                    raise TransactionFencedError(
                        f"Transactional id '{tid}' was fenced while adding partitions to its "
                        "transaction: a newer producer with the same transactional id was "
                        "started (a retried or speculative task?).")
                if kinds & set(COORDINATOR_MOVED):
                    self._txn_node = None
                elif Errors.ConcurrentTransactionsError in kinds:
                    retry_s = TXN_RETRY_BACKOFF_S
                elif not all(getattr(e, "retriable", False) for e in kinds):
                    raise produce_error(first_tp, (
                        f"Could not add topic '{first_tp[0]}' partition {first_tp[1]} to the "
                        f"transaction of transactional id '{tid}': {first.__name__} "
                        f"({getattr(first, 'description', '')})."))
            except RetriableBrokerError as exc:
                last = str(exc)
                self._txn_node = None
            if self._clock.now() >= deadline:
                raise produce_error(new[0], (
                    f"Could not add {len(new)} partition(s) to the transaction of transactional "
                    f"id '{tid}' within {self.settings.max_block_ms} ms (option "
                    f"'kafka.max.block.ms'). Last error: {last}"))
            self._clock.sleep(retry_s)


# --------------------------------------------------------------------------------------------
# Driver side: fencing an id and aborting its transaction (ending them: .ending)
# --------------------------------------------------------------------------------------------

def abort_stale_transaction(client_config: Mapping[str, object], transactional_id: str,
                            timeout_ms: int, *, transaction_timeout_ms: int = 60_000,
                            client=None, clock=None) -> None:
    """Fence every producer of ``transactional_id`` and abort its open transaction, if any:
    InitProducerId for the id, retried (the coordinator answers CONCURRENT_TRANSACTIONS until
    the abort is done) for at most ``timeout_ms``. Afterwards no earlier handle of the id can
    commit. ``transaction_timeout_ms`` is what the id is registered with (no transaction is
    begun, so it hardly matters)."""
    clock = clock or Clock()
    own = client is None
    client = client if client is not None else BrokerClient(client_config)
    try:
        _init_producer_id(client, transactional_id, transaction_timeout_ms,
                          deadline=clock.now() + timeout_ms / 1000, backoff_s=0.1, clock=clock,
                          deadline_option=None)
    finally:
        if own:
            client.close()


def _init_producer_id(client, transactional_id: str | None, transaction_timeout_ms: int, *,
                      deadline: float, backoff_s: float, clock, deadline_option: str | None
                      ) -> tuple[int, int]:
    """InitProducerId (on the transaction coordinator when transactional, else any broker),
    retried until ``deadline``; returns (producer id, epoch)."""
    node = None
    last = None
    subject = f"transactional id '{transactional_id}'" if transactional_id else \
        "an idempotent producer"
    while True:
        pause = backoff_s
        try:
            if transactional_id is not None and node is None:
                node = client.find_transaction_coordinator(transactional_id)
            response = client.send(node, InitProducerIdRequest(
                transactional_id=transactional_id, transaction_timeout_ms=transaction_timeout_ms,
                max_version=_INIT_PRODUCER_ID_MAX_VERSION))
            error = error_for(response.error_code)
            if error is Errors.NoError:
                return response.producer_id, response.producer_epoch
            last = error.__name__
            if error in COORDINATOR_MOVED:
                node = None
            elif error is Errors.ConcurrentTransactionsError:
                pause = TXN_RETRY_BACKOFF_S
            elif not getattr(error, "retriable", False):
                raise ProduceError(_init_error_message(error, subject, transaction_timeout_ms))
        except RetriableBrokerError as exc:
            last = str(exc)
            node = None
        except (Errors.TransactionalIdAuthorizationFailedError,
                Errors.ClusterAuthorizationFailedError) as exc:   # from FindCoordinator
            raise ProduceError(_init_error_message(type(exc), subject,
                                                   transaction_timeout_ms)) from None
        if clock.now() >= deadline:
            bound = f" (option '{deadline_option}')" if deadline_option else ""
            raise ProduceError(f"Could not get a producer id for {subject} from Kafka at "
                               f"'{client.bootstrap_servers}' in time{bound}. Last error: {last}")
        clock.sleep(pause)


def _init_error_message(error, subject: str, transaction_timeout_ms: int) -> str:
    if error is Errors.TransactionalIdAuthorizationFailedError:
        return (f"Not authorized to use {subject}: the principal needs the Write permission "
                "on that TransactionalId (ACL).")
    if error is Errors.ClusterAuthorizationFailedError:
        return (f"Not authorized to get a producer id for {subject}: brokers before Kafka 2.8 "
                "need the IdempotentWrite permission on the cluster for idempotence; grant it, "
                "or set 'kafka.enable.idempotence' to false.")
    if error is Errors.InvalidTransactionTimeoutError:
        return (f"The broker rejected the transaction timeout of {subject} "
                "(INVALID_TRANSACTION_TIMEOUT): option 'kafka.transaction.timeout.ms' "
                f"({transaction_timeout_ms} ms; exactly-once writes use "
                f"{DEFAULT_EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS} unless it is set) is larger than "
                "the broker setting transaction.max.timeout.ms (900000 by default). Set 'kafka.transaction.timeout.ms' to at most the brokers' "
                "transaction.max.timeout.ms, or raise transaction.max.timeout.ms on every "
                "broker.")
    return (f"Could not get a producer id for {subject}: {error.__name__} "
            f"({getattr(error, 'description', '')}).")
