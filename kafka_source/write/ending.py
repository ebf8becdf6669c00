"""Ending transactions: EndTxn for one transaction or for many at once, on the driver and in
the tasks of a re-run (:mod:`kafka_source.write.exactly_once`).

Why many at once
    An exactly-once micro-batch leaves one open transaction per write task, and the driver
    commits them all before the next micro-batch can start; a re-run after a crash commits
    every transaction the marker records, in every one of its tasks. Ended one after another,
    each costs two round trips that wait for each other -- FindCoordinator for its
    transactional id, then EndTxn -- so n tasks cost 2n round trips per micro-batch. Here all
    of them are in flight together:

    * Coordinators are looked up for all transactional ids at once: one FindCoordinator
      request carries every id from version 4 on (KIP-699, Kafka 3.0+); older brokers
      (Kafka 2.2 has version 2) take one id per request, and those requests are in flight
      together.
    * Each EndTxn goes out as soon as its coordinator is known, several in flight per
      coordinator (up to the connection's limit, kafka-python's
      ``max_in_flight_requests_per_connection``: a request past it would fail at once). The
      transactions of a micro-batch are spread over the brokers by their ids, so each
      coordinator gets its share. A broker handles the requests of one connection one after
      another, so a coordinator still writes its EndTxns in turn; what goes is the wait of a
      round trip between two of them and the lookup before each.

    With the project's fake cluster (``tests/unit/test_ending.py``), 50 transactions of one
    coordinator took 100 round trips one after another, and take 11 now (one FindCoordinator,
    then ten rounds of five EndTxns in flight); from a Kafka 2.2, whose FindCoordinator takes
    one id, as many.

What each transaction gets is what ending it alone gets (:func:`end_transaction` is this with
one handle): coordinator moves (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
COORDINATOR_NOT_AVAILABLE), network failures and CONCURRENT_TRANSACTIONS are retried within
the timeout, the coordinator looked up again after a move or a failure;
:class:`~kafka_source.write.transactions.TransactionFencedError` when it can no longer be
ended as asked; :class:`~kafka_source.errors.ProduceError` naming its transactional id
otherwise. One transaction's failure never stops the others: every one is ended or has failed
by the time :func:`end_each` returns, because a transaction left open is one that a
``read_committed`` reader waits for until the broker aborts it, and, for a micro-batch whose
commit is recorded, rows lost until a restart repairs them.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, Sequence

import kafka.errors as Errors
from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest
from kafka.protocol.producer import EndTxnRequest

from ..errors import BrokerSecurityError, ProduceError, RetriableBrokerError
from ..wire.net.client import BrokerClient, error_for
from .clock import Clock
from .produce_errors import FENCED
from .transactions import (COORDINATOR_MOVED, TXN_RETRY_BACKOFF_S, TransactionFencedError,
                           TransactionHandle)

log = logging.getLogger("kafka_source.write.producer")

__all__ = ["end_each", "end_transaction", "end_transactions"]

_END_TXN_MAX_VERSION = 4        # see kafka_source.write.producer's docstring
_BATCHED_LOOKUP_VERSION = 4     # FindCoordinator carries many keys from here (KIP-699)

_RETRY_S = 0.1                  # after a coordinator move or a network failure
# A request that could not reach a broker, or whose connection failed: worth another go at a
# coordinator looked up again. (UnknownBrokerIdError: a coordinator no longer in the metadata.)
_NETWORK = (RetriableBrokerError, Errors.KafkaConnectionError, Errors.NodeNotReadyError,
            Errors.KafkaTimeoutError, Errors.RequestTimedOutError, Errors.Cancelled,
            Errors.UnknownBrokerIdError)


def end_transaction(client_config: Mapping[str, object], handle: TransactionHandle,
                    commit: bool, *, timeout_ms: int | None = None, client=None,
                    clock=None) -> None:
    """Commit (``commit=True``) or abort the transaction of ``handle`` (EndTxn on the
    transaction coordinator), retrying coordinator moves and CONCURRENT_TRANSACTIONS for at
    most ``timeout_ms`` (default ``kafka.request.timeout.ms``).

    Committing a transaction that is already committed succeeds (the driver may retry a commit
    after a crash), as does aborting one already aborted; a handle without partitions has
    nothing to end. :class:`TransactionFencedError` when the transaction can no longer be
    ended as asked (see there); :class:`ProduceError` naming the transactional id otherwise."""
    if not handle.partitions:
        return
    error = _with_client(client_config, client, lambda c: end_each(
        c, [handle], commit, timeout_ms=timeout_ms, clock=clock))[0]
    if error is not None:
        raise error


def end_transactions(client_config: Mapping[str, object], handles: Iterable[TransactionHandle],
                     commit: bool, *, timeout_ms: int | None = None, client=None,
                     clock=None) -> None:
    """End every transaction of ``handles`` at once (:func:`end_each`), over one set of
    connections, within ``timeout_ms`` (default ``kafka.request.timeout.ms``) for all of them.

    Every handle is attempted, also when some fail: a failure of one transaction (fenced, or
    its coordinator unreachable) does not leave the others open. (Stopping at the first
    failure, as ending them one after another did, left the rest open: ``read_committed``
    readers of their partitions then wait until the broker aborts them, after
    ``kafka.transaction.timeout.ms``, and records that could have been committed are lost.)
    Afterwards the failure of the first failed handle (in the order given) is raised, of its
    own type (:class:`TransactionFencedError` or :class:`ProduceError`), its message naming
    how many others failed and the first of their transactional ids; each failure is logged
    too. The handles not named there are ended as asked."""
    handles = [h for h in handles if h.partitions]
    if not handles:
        return
    errors = _with_client(client_config, client, lambda c: end_each(
        c, handles, commit, timeout_ms=timeout_ms, clock=clock))
    failed = [(h, e) for h, e in zip(handles, errors) if e is not None]
    if not failed:
        return
    for h, e in failed:
        log.warning("Could not %s the transaction of transactional id '%s': %s",
                    "commit" if commit else "abort", h.transactional_id, e)
    first = failed[0][1]
    if len(failed) == 1:
        raise first
    others = ", ".join(f"'{h.transactional_id}'" for h, _ in failed[1:6]) + (
        ", ..." if len(failed) > 6 else "")
    raise type(first)(
        f"{first} ({len(failed) - 1} other transaction(s) of the {len(handles)} failed too: "
        f"{others}; the others were {'committed' if commit else 'aborted'}.)") from first


def _with_client(client_config, client, work):
    if client is not None:
        return work(client)
    with BrokerClient(client_config) as own:
        return work(own)


class _Txn:
    """One handle's way through :func:`end_each`."""

    __slots__ = ("handle", "node", "ready_at", "future", "looking", "last", "error", "done")

    def __init__(self, handle: TransactionHandle, now: float):
        self.handle = handle
        self.node = None            # its coordinator, once looked up
        self.ready_at = now         # when it may be sent (again): retries wait a little
        self.future = None          # its EndTxn in flight
        self.looking = False        # its FindCoordinator in flight
        self.last = None            # the last retriable failure, for the timeout's message
        self.error = None
        self.done = False


def end_each(client, handles: Sequence[TransactionHandle], commit: bool, *,
             timeout_ms: int | None = None, clock=None) -> list[Exception | None]:
    """End the transactions of ``handles`` concurrently (the module docstring); per handle, in
    their order, None if it was ended as asked, else its failure
    (:class:`TransactionFencedError` or :class:`ProduceError`, not raised). Every handle has
    the same ``timeout_ms`` (default ``kafka.request.timeout.ms``) from the call on; a handle
    without partitions has nothing to end (None). ``client`` is a
    :class:`~kafka_source.wire.net.client.BrokerClient` (or the unit tests' fake), not touched
    when there is nothing to end."""
    if not any(h.partitions for h in handles):
        return [None] * len(handles)
    return _Ending(client, handles, commit, timeout_ms, clock or Clock()).run()


class _Ending:
    def __init__(self, client, handles, commit: bool, timeout_ms, clock):
        self.client = client
        self.commit = commit
        self.action = "commit" if commit else "abort"
        self.timeout_ms = client.request_timeout_ms if timeout_ms is None else timeout_ms
        self.clock = clock
        now = clock.now()
        self.deadline = now + self.timeout_ms / 1000
        self.txns = [_Txn(h, now) for h in handles]
        for t in self.txns:
            if not t.handle.partitions:
                t.done = True
        self.lookups: list = []                 # (node, {tid: [_Txn]}, request key, future)
        self.one_key = False                    # a broker answered a lookup of many for one
        self.in_flight: dict = {}               # node -> requests of ours in flight to it

    def run(self) -> list[Exception | None]:
        while True:
            now = self.clock.now()
            self._look_up(now)
            self._send(now)
            busy = bool(self.lookups) or any(t.future is not None for t in self.txns)
            waiting = [t.ready_at for t in self.txns if not t.done and t.future is None
                       and not t.looking]
            if not busy and not waiting:
                return [t.error for t in self.txns]
            # Whatever could go out went out; what is left waits for a retry's backoff, or
            # for answers to make room on a connection (then the poll wakes it up).
            later = [r for r in waiting if r > now]
            pause = min(min(later, default=now + _RETRY_S) - now, _RETRY_S)
            if busy:
                self.client.poll(pause * 1000)
            else:
                self.clock.sleep(pause)
            now = self.clock.now()
            self._collect_lookups(now)
            self._collect_ends(now)
            self._expire(now)

    # --- FindCoordinator ----------------------------------------------------------------------

    def _look_up(self, now: float) -> None:
        wanted: dict[str, list[_Txn]] = {}
        for t in self.txns:
            if not t.done and t.node is None and not t.looking and t.ready_at <= now:
                wanted.setdefault(t.handle.transactional_id, []).append(t)
        if not wanted:
            return
        try:
            batched = not self.one_key and \
                self.client.api_version(FindCoordinatorRequest) >= _BATCHED_LOOKUP_VERSION
        except Exception as exc:  # noqa: BLE001 - no broker reached within the request timeout
            for tid, txns in wanted.items():
                for t in txns:
                    self._fail(t, ProduceError(f"{self._could_not(tid)}: {exc}"))
            return
        ids = list(wanted)
        groups = [ids] if batched else [[tid] for tid in ids]
        for group in groups:
            # One id a request: they go to the least loaded brokers, each up to its limit.
            node = self.client.any_node()
            if node is None or self.in_flight.get(node, 0) >= self.client.in_flight_limit(node):
                break                               # the rest go when answers come back
            request = FindCoordinatorRequest(key=group[0],
                                             key_type=int(CoordinatorType.TRANSACTION),
                                             coordinator_keys=group)
            future = self._send_request(node, request)
            self.lookups.append((node, {tid: wanted[tid] for tid in group}, group[0], future))
            for tid in group:
                for t in wanted[tid]:
                    t.looking = True

    def _collect_lookups(self, now: float) -> None:
        for lookup in [lk for lk in self.lookups if lk[3].is_done]:
            self.lookups.remove(lookup)
            node, by_id, key, future = lookup
            self.in_flight[node] -= 1
            for txns in by_id.values():
                for t in txns:
                    t.looking = False
            if future.failed():
                why = f"FindCoordinator to broker {node}: {future.exception}"
                for txns in by_id.values():
                    for t in txns:
                        self._network_failure(t, future.exception, why, now)
                continue
            response = future.value
            if response.version >= _BATCHED_LOOKUP_VERSION:
                answers = {c.key: c for c in response.coordinators}
            else:
                answers = {key: response}
                # A broker older than the others (a cluster being upgraded) answered for the
                # first id only: from now on, one id a request.
                self.one_key = self.one_key or len(by_id) > 1
            for tid, txns in by_id.items():
                answer = answers.get(tid)
                if answer is None:
                    for t in txns:
                        self._retry(t, "FindCoordinator answered without it", now, pause=0)
                    continue
                error = error_for(answer.error_code)
                if error is Errors.NoError:
                    node_id = self.client.coordinator_node(answer, CoordinatorType.TRANSACTION,
                                                           tid)
                    for t in txns:
                        t.node = node_id
                elif error in COORDINATOR_MOVED or getattr(error, "retriable", False):
                    for t in txns:
                        self._retry(t, f"FindCoordinator: {error.__name__}", now)
                else:
                    for t in txns:
                        self._fail(t, ProduceError(
                            f"{self._could_not(tid)}: FindCoordinator answered {error.__name__} "
                            f"({getattr(error, 'description', '')})."))

    # --- EndTxn ---------------------------------------------------------------------------------

    def _send(self, now: float) -> None:
        busy_ids = {t.handle.transactional_id for t in self.txns if t.future is not None}
        for t in self.txns:
            if t.done or t.node is None or t.future is not None or t.ready_at > now:
                continue
            tid = t.handle.transactional_id
            if tid in busy_ids:
                continue        # two handles of one id (never in a micro-batch): one at a time
            if self.in_flight.get(t.node, 0) >= self.client.in_flight_limit(t.node):
                continue
            h = t.handle
            t.future = self._send_request(t.node, EndTxnRequest(
                transactional_id=tid, producer_id=h.producer_id,
                producer_epoch=h.producer_epoch, committed=self.commit,
                max_version=_END_TXN_MAX_VERSION))
            busy_ids.add(tid)

    def _collect_ends(self, now: float) -> None:
        for t in self.txns:
            if t.future is None or not t.future.is_done:
                continue
            future, t.future = t.future, None
            self.in_flight[t.node] -= 1
            if future.failed():
                self._network_failure(t, future.exception,
                                      f"EndTxn to {t.node}: {future.exception}", now)
                continue
            self._answered(t, error_for(future.value.error_code), now)

    def _answered(self, t: _Txn, error, now: float) -> None:
        h = t.handle
        tid = h.transactional_id
        if error is Errors.NoError:
            t.done = True
            return
        if error in FENCED:
            self._fail(t, TransactionFencedError(
                f"{self._could_not(tid)} (producer id {h.producer_id}, epoch "
                f"{h.producer_epoch}): {error.__name__}. A newer producer with this "
                "transactional id was started, or the broker aborted the transaction because it "
                "was open longer than 'kafka.transaction.timeout.ms'; its records are not "
                "committed."))
        elif error is Errors.InvalidTxnStateError:
            # What Kafka answers for a commit of an aborted transaction (and an abort of a
            # committed one): it cannot be ended the other way any more.
            self._fail(t, TransactionFencedError(
                f"{self._could_not(tid)} (producer id {h.producer_id}, epoch "
                f"{h.producer_epoch}): INVALID_TXN_STATE -- it was already "
                f"{'aborted' if self.commit else 'committed'} (or never begun)."))
        elif error in COORDINATOR_MOVED:
            t.node = None
            self._retry(t, error.__name__, now)
        elif error is Errors.ConcurrentTransactionsError:
            self._retry(t, error.__name__, now, pause=TXN_RETRY_BACKOFF_S)
        elif getattr(error, "retriable", False):
            self._retry(t, error.__name__, now)
        else:
            self._fail(t, ProduceError(
                f"{self._could_not(tid)}: {error.__name__} "
                f"({getattr(error, 'description', '')})."))

    # --- the parts both share ---------------------------------------------------------------

    def _could_not(self, tid: str) -> str:
        """The start of every failure's message: what could not be done, to which id."""
        return f"Could not {self.action} the transaction of transactional id '{tid}'"

    def _send_request(self, node, request):
        self.in_flight[node] = self.in_flight.get(node, 0) + 1
        try:
            return self.client.send_async(node, request)
        except Exception as exc:  # noqa: BLE001 - as a request that failed at once
            from kafka.future import Future

            return Future().failure(exc)

    def _network_failure(self, t: _Txn, exc, why: str, now: float) -> None:
        if isinstance(exc, BrokerSecurityError):     # a TLS or SASL failure: no retry helps
            self._fail(t, ProduceError(f"{self._could_not(t.handle.transactional_id)}: {exc}"))
        elif isinstance(exc, _NETWORK) or getattr(exc, "retriable", False):
            t.node = None
            self._retry(t, why, now)
        else:                                           # e.g. IncompatibleBrokerVersion
            self._fail(t, ProduceError(f"{self._could_not(t.handle.transactional_id)}: "
                                       f"{type(exc).__name__}: {exc}"))

    def _expire(self, now: float) -> None:
        """Past the deadline, what waits to be sent again (for a connection or a broker to
        ask) has failed: nothing waits longer than the timeout."""
        if now < self.deadline:
            return
        for t in self.txns:
            if not t.done and t.future is None and not t.looking:
                self._retry(t, t.last or "no broker took the request", now)

    def _retry(self, t: _Txn, why: str, now: float, *, pause: float = _RETRY_S) -> None:
        t.last = why
        if now >= self.deadline:
            self._fail(t, ProduceError(
                f"{self._could_not(t.handle.transactional_id)} within {self.timeout_ms} ms. "
                f"Last error: {why}"))
            return
        t.ready_at = now + pause

    @staticmethod
    def _fail(t: _Txn, error: Exception) -> None:
        t.error = error
        t.done = True
