"""The Spark side of the sink: ``df.write`` and ``df.writeStream`` with ``format("pykafka")``.

Spark makes the writer on the driver (in a Python worker), pickles it to the executors, calls
``write(iterator of Arrow batches)`` once per task there, then ``commit`` (or ``abort``) on the
driver with the tasks' messages. So the writer is made of plain values: the parsed options
(:mod:`kafka_source.config.sink_options`) and which columns the DataFrame has
(:mod:`.columns`), both checked when it is made, before any task runs -- as is the ``topic``
option's topic, which must exist (the sink never creates topics).

Batch writes and default streaming writes are at-least-once: a task returns only when Kafka
acknowledged all it wrote, and a failed task is retried by Spark and writes its rows again.
Streaming writes with ``exactlyOnce`` commit each micro-batch in Kafka transactions
(:mod:`.exactly_once`).

A streaming query's commit runs in a Python worker of its own with a writer made afresh for it
(PySpark 4.3), so nothing is kept on the writer between ``write`` and ``commit``: what the
commit needs travels in the commit messages.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator, Mapping

from pyspark.sql.datasource import DataSourceArrowWriter

from ..config.sink_options import SinkOptions, parse_sink_options
from ..errors import OptionError
from ..spark_features import StreamArrowWriter
from ..worker_heap import prepare
from ..worker_socket import AcksJvmOnUnpickle
from .columns import Columns, check_schema

log = logging.getLogger(__name__)

__all__ = ["KafkaBatchWriter", "KafkaStreamWriter", "make_writer"]


# Topics found to exist, by cluster and topic, with when (time.monotonic()). A streaming query
# makes a new writer for every micro-batch (and its commit): without this, each one would ask
# the cluster again. A topic deleted meanwhile still fails the tasks that write to it.
_TOPICS_SEEN: dict[tuple[str, str], float] = {}
_TOPIC_CHECK_VALID_S = 300.0      # as the producer's kafka.metadata.max.age.ms default


def _check_topic_exists(options: SinkOptions) -> None:
    """TopicError now, on the driver, if the ``topic`` option names a topic that does not
    exist (a bad topic then fails the query before any task runs). Asked once per
    :data:`_TOPIC_CHECK_VALID_S` per cluster and topic in this Python process."""
    if options.topic is None:
        return
    from ..wire.net.client import BrokerClient, Retries, readable_topic

    seen_key = (str(options.client_config.get("bootstrap_servers")), options.topic)
    seen = _TOPICS_SEEN.get(seen_key)
    if seen is not None and time.monotonic() - seen < _TOPIC_CHECK_VALID_S:
        return
    with BrokerClient(options.client_config) as client:
        infos = client.topic_metadata([options.topic],
                                      Retries(window_ms=client.request_timeout_ms))
        readable_topic(options.topic, infos.get(options.topic), client.bootstrap_servers)
    _TOPICS_SEEN[seen_key] = time.monotonic()


# Exactly-once sinks whose marker commit was found to be authorized, by cluster, principal,
# transactional id prefix and topic, with when (as _TOPICS_SEEN).
_MARKER_ACCESS_SEEN: dict[tuple[str, str, str, str], float] = {}


def _check_marker_access(options: SinkOptions) -> None:
    """MarkerAccessError now, on the driver, if the principal may not commit the exactly-once
    marker on the ``topic`` option's topic (:func:`.exactly_once.check_marker_access`): Kafka
    wants READ on that topic, which writing alone does not need. With a ``topic`` column the
    marker's topic is one of those a micro-batch writes, known at its commit only: a missing
    ACL then fails that commit, naming it."""
    if not options.exactly_once or options.topic is None:
        return
    from .exactly_once import check_marker_access

    config = options.client_config
    key = (str(config.get("bootstrap_servers")), str(config.get("sasl_plain_username")),
           options.transactional_id_prefix, options.topic)
    seen = _MARKER_ACCESS_SEEN.get(key)
    if seen is not None and time.monotonic() - seen < _TOPIC_CHECK_VALID_S:
        return
    check_marker_access(options)
    _MARKER_ACCESS_SEEN[key] = time.monotonic()


def make_writer(options: Mapping[str, str], schema, overwrite: bool, *, streaming: bool):
    """The writer of ``DataSource.writer`` / ``streamWriter``; every check that needs no task."""
    if overwrite and not streaming:
        raise OptionError("Kafka topics can't be overwritten (mode 'overwrite'): records are only "
                          "ever appended. Write with .mode(\"append\").")
    parsed = parse_sink_options(options, streaming=streaming)
    formatted = frozenset(parsed.formats.formatted()) if parsed.formats else frozenset()
    columns = check_schema(schema, parsed.topic, formatted)
    _check_topic_exists(parsed)
    if parsed.formats is not None:
        from dataclasses import replace

        from ..formats.sink import plan

        # the writer schemas derived from the columns' types, ids settled for the topic option
        parsed = replace(parsed, formats=plan(parsed.formats, schema, parsed.topic))
    if streaming:
        _check_marker_access(parsed)
        # overwrite here is Spark's "complete" output mode: as in Spark's Kafka sink, every row
        # of each micro-batch is appended (a topic can't be truncated).
        return KafkaStreamWriter(parsed, columns)
    return KafkaBatchWriter(parsed, columns)


def _task_context():
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the Kafka writer's write() runs in a Spark task only")
    return ctx


def _reject_speculation(ctx) -> None:
    """OptionError if Spark runs this query with speculative execution, which exactly-once
    writes cannot have: a speculative copy of a task has the same transactional id as the
    original, so each attempt's InitProducerId fences the other and the micro-batch fails.

    Checked in the write task, before it touches Kafka, because that is where the setting can
    be read: the driver makes the writer in a Python worker without a SparkSession (and Spark
    passes it only the sink's options), while every task of a query gets the session's SQL
    configuration -- which holds each ``spark.*`` entry of the SparkConf, ``spark.speculation``
    included -- as local properties."""
    value = ctx.getLocalProperty("spark.speculation")
    if value is not None and value.strip().lower() == "true":
        raise OptionError(
            "Option 'exactlyOnce' can't be used with speculative execution "
            "(spark.speculation=true): a speculative copy of a write task has the same "
            "transactional id as the task, so the two attempts fence each other and the "
            "micro-batch fails. Start the SparkSession with spark.speculation="
            "false (it can't be changed at runtime) for this query, or write without "
            "'exactlyOnce' (at-least-once).")


def _encoded(options: SinkOptions, columns: Columns, iterator: Iterator) -> Iterator:
    """The batches with the formatted columns (valueFormat/keyFormat) encoded to bytes."""
    if options.formats is None:
        return iterator
    from ..formats.sink import BatchEncoder

    return BatchEncoder(options.formats, options.topic, columns.topic).encode_batches(iterator)


def _log_totals(messages, what: str) -> None:
    done = [m for m in messages if m is not None]
    total = sum(getattr(m, "total", 0) for m in done)
    log.info("%s: %d record(s) written by %d task(s).", what, total, len(done))


class KafkaBatchWriter(AcksJvmOnUnpickle, DataSourceArrowWriter):
    """``df.write.format("pykafka").mode("append")``: at-least-once."""

    def __init__(self, options: SinkOptions, columns: Columns):
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator):
        from .task import write_task

        batches = _encoded(self.options, self.columns, iterator)
        return write_task(self.options, self.columns, batches, _task_context().partitionId())

    def commit(self, messages) -> None:
        _log_totals(messages, "Kafka write committed")
        prepare()

    def abort(self, messages) -> None:
        # Records are visible as soon as they are acknowledged: there is nothing to take back.
        done = [m for m in messages if m is not None]
        log.warning("Kafka write failed; %d task(s) had written %d record(s), which stay in "
                    "Kafka (at-least-once).", len(done), sum(m.total for m in done))


class KafkaStreamWriter(AcksJvmOnUnpickle, *StreamArrowWriter):
    """``df.writeStream.format("pykafka")``: at-least-once, or exactly-once with
    ``exactlyOnce`` (Kafka transactions committed per micro-batch)."""

    def __init__(self, options: SinkOptions, columns: Columns):
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator):
        ctx = _task_context()
        iterator = _encoded(self.options, self.columns, iterator)
        if not self.options.exactly_once:
            from .task import write_task

            return write_task(self.options, self.columns, iterator, ctx.partitionId())
        from .exactly_once import write_exactly_once

        _reject_speculation(ctx)
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RuntimeError("exactly-once Kafka write: Spark did not give the task its "
                               "streaming query id and batch id (task local properties "
                               "'sql.streaming.queryId', 'streaming.sql.batchId')")
        return write_exactly_once(self.options, self.columns, iterator, query_id=query_id,
                                  batch_id=int(batch_id), task=ctx.partitionId())

    def commit(self, messages, batchId: int) -> None:
        if self.options.exactly_once:
            from .exactly_once import commit_batch

            commit_batch(self.options, messages, batchId)
        _log_totals(messages, f"Kafka micro-batch {batchId} committed")
        prepare()     # Spark's commit worker, reused: freeze what the commit imported

    def abort(self, messages, batchId: int) -> None:
        if self.options.exactly_once:
            from .exactly_once import abort_batch

            abort_batch(self.options, messages, batchId)
        else:
            done = [m for m in messages if m is not None]
            log.warning("Kafka micro-batch %d failed; %d task(s) had written %d record(s), "
                        "which stay in Kafka (at-least-once).", batchId, len(done),
                        sum(m.total for m in done))
