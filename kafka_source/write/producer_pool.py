"""One producer per Python worker and connection settings, kept across write tasks.

Why: a broker keeps state for every producer id and partition written to (the last five
batches' sequence numbers, for idempotence) until the id expires -- 7 days before Kafka 3.4
(``transactional.id.expiration.ms``), 1 day after (``producer.id.expiration.ms``, KIP-854). A
producer made per write task takes a new id each time: a stream with 8 write tasks every 10 s
makes about 69,000 ids a day on every partition it writes, which brokers hold in memory and in
their snapshots. Spark's JVM sink keeps one producer per executor for the same reason
(``spark.kafka.producer.cache.timeout``, 10 minutes).

How: PySpark runs one task at a time in a Python worker and keeps the worker for the next task
(``spark.python.worker.reuse``, on by default), so a process-wide pool keyed by the connection
and producer settings hands each task the producer the previous task left. Its id, epoch and
sequence numbers continue, as do its connections and metadata (the producer follows leaders
that moved meanwhile: :mod:`.producer`, "Following leaders").

A producer goes back to the pool only when it is :attr:`~.producer.Producer.reusable`: the
task flushed it successfully, so nothing it queued is still to be sent. A task that failed, or
whose producer failed, closes it: the rows of a failed task must never be sent by the next one,
and Spark's retry gets a new producer. Transactional producers (exactly-once writes) are not
pooled: each task's transactional id is its own.

A producer idle for :data:`IDLE_CLOSE_S` (or ``kafka.connections.max.idle.ms``, if shorter) is
closed by a daemon timer, and every idle one when the worker exits. The worker itself may go
first: Spark ends an executor's idle Python workers once it has run no Python task for a minute
(``PythonWorkerFactory``, a fixed timeout), so the pool lasts across micro-batches only while
they come less than a minute apart.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import pickle
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

log = logging.getLogger(__name__)

__all__ = ["IDLE_CLOSE_S", "MAX_IDLE_PER_KEY", "POOL", "ProducerPool"]

IDLE_CLOSE_S = 600.0        # as Spark's spark.kafka.producer.cache.timeout
MAX_IDLE_PER_KEY = 2        # one is what a Python worker needs; threads may make a second


@dataclass
class _Idle:
    producer: object
    since: float


class ProducerPool:
    """Idle producers by settings. Thread-safe; a leased producer is its holder's alone."""

    def __init__(self, factory: Callable | None = None, clock: Callable[[], float] = time.monotonic,
                 timers: bool = True):
        """``factory(client_config, settings)`` makes a producer (default: :class:`Producer`);
        ``clock`` and ``timers`` (tests) replace the time and the daemon timer."""
        self._factory = factory
        self._clock = clock
        self._timers = timers
        self._lock = threading.Lock()
        self._idle: dict[bytes, list[_Idle]] = {}
        self._idle_s: dict[bytes, float] = {}
        self._timer: threading.Timer | None = None
        self.created = 0                 # producers made (tests and logs)

    @contextlib.contextmanager
    def lease(self, client_config: Mapping[str, object], settings) -> Iterator:
        """A producer for these settings, the pool's idle one if there is one. Given back when
        the block ends without an exception and the producer is reusable; closed otherwise."""
        key = _key(client_config, settings)
        producer = self._take(key)
        if producer is None:
            producer = self._make(client_config, settings)
            with self._lock:
                self._idle_s[key] = _idle_seconds(client_config)
        ok = False
        try:
            yield producer
            ok = True
        finally:
            if ok and producer.reusable:
                self._give_back(key, producer)
            else:
                producer.close()

    def reap(self) -> int:
        """Close each idle producer idle for longer than its settings allow."""
        now = self._clock()
        closing = []
        with self._lock:
            for key, entries in list(self._idle.items()):
                limit = self._idle_s.get(key, IDLE_CLOSE_S)
                keep = [e for e in entries if now - e.since < limit]
                closing += [e.producer for e in entries if now - e.since >= limit]
                if keep:
                    self._idle[key] = keep
                else:
                    del self._idle[key]
            self._timer = None
            if self._idle and self._timers:
                self._schedule_locked(now)
        for producer in closing:
            _close_quietly(producer)
        return len(closing)

    def idle_count(self) -> int:
        with self._lock:
            return sum(len(entries) for entries in self._idle.values())

    # --- inside ---------------------------------------------------------------------------

    def _make(self, client_config, settings):
        if self._factory is None:
            from .producer import Producer

            self._factory = Producer
        producer = self._factory(client_config, settings)
        self.created += 1
        return producer

    def _take(self, key: bytes):
        self.reap()
        with self._lock:
            entries = self._idle.get(key)
            while entries:
                producer = entries.pop().producer
                if not entries:
                    del self._idle[key]
                if producer.reusable:
                    return producer
                _close_quietly(producer)
                entries = self._idle.get(key)
        return None

    def _give_back(self, key: bytes, producer) -> None:
        extra = None
        with self._lock:
            entries = self._idle.setdefault(key, [])
            entries.append(_Idle(producer, self._clock()))
            if len(entries) > MAX_IDLE_PER_KEY:
                extra = entries.pop(0).producer
            if self._timers and self._timer is None:
                self._schedule_locked(self._clock())
        if extra is not None:
            _close_quietly(extra)

    def _schedule_locked(self, now: float) -> None:
        due = min(e.since + self._idle_s.get(key, IDLE_CLOSE_S)
                  for key, entries in self._idle.items() for e in entries)
        timer = threading.Timer(max(0.05, due - now + 0.05), self.reap)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def close_all(self) -> None:
        with self._lock:
            producers = [e.producer for entries in self._idle.values() for e in entries]
            self._idle.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for producer in producers:
            _close_quietly(producer)


def _key(client_config: Mapping[str, object], settings) -> bytes:
    """The pool key: every connection and producer setting (secrets included, hashed)."""
    raw = pickle.dumps((sorted(client_config.items(), key=lambda kv: kv[0]), settings),
                       protocol=4)
    return hashlib.sha256(raw).digest()


def _idle_seconds(client_config: Mapping[str, object]) -> float:
    idle_ms = client_config.get("connections_max_idle_ms")
    if idle_ms is None:
        return IDLE_CLOSE_S
    return min(IDLE_CLOSE_S, max(0.0, int(idle_ms) / 1000))


def _close_quietly(producer) -> None:
    try:
        producer.close()
    except Exception:  # closing must never fail a task or the worker's exit
        log.debug("error closing an idle producer", exc_info=True)


POOL = ProducerPool()
atexit.register(POOL.close_all)
