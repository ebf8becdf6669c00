"""Faults that must not fail a job: broker restarts, connection faults, a broker gone, dead workers.

Each test runs Spark against a real Apache Kafka of its own (``KAFKA_HOME``; ``KAFKA_ZK_HOME`` in
ZooKeeper mode on the Kafka 2.2 pass, see ``start_local_broker``), started once for the
module with a second listener, ``PROXIED``, that advertises the port of a
:class:`~kafka_source.testing.proxy.FaultProxy`: a query bootstrapping from the proxy keeps every
connection behind it, so the proxy can reset, stall or drop chosen requests and responses (Fetch,
JoinGroup, SyncGroup, OffsetCommit, ...) or make the broker look gone. The harness itself
(creating topics, producing, checking commits) talks to the broker's own PLAINTEXT listener.

What is checked is behaviour, not timing: a batch read yields exactly the records of its range, or
fails with an error naming what to change, within bounds the options set; a stream into a
checkpointed parquet sink neither loses nor duplicates a record (the sink's (partition, offset)
pairs against what was produced), and the group's committed offsets end at the log end. The
figures (faults injected per kind, records checked, lost, duplicated) are printed at the end of
the module's run.

The broker must be restartable and must advertise the proxy, so these tests need a Kafka
distribution; they skip without one, and on the embedded-broker CI pass (they have already run in
the real-Kafka pass).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from kafka_source import spark_features
from kafka_source.config.options import parse_stream_options
from kafka_source.group.assignors import load_assignor
from kafka_source.group.member import GroupMember
from kafka_source.testing import (create_topic, local_distribution, start_local_broker,
                                   unique_topic_name)
from kafka_source.testing.proxy import (ApiKey, Fault, FaultProxy,
                                        broker_without_partitions_metadata, is_metadata_of,
                                        pid_of_client, restarting_broker_metadata)
from kafka_source.wire.net.client import BrokerClient, RetriableBrokerError

from .spark_features import AVAILABLE_NOW_IN_MICRO_BATCHES
from .spark_workers import spark_worker_env
from .test_stream import (committed, end_offsets, load_stream, produce_counts, sink_rows,
                          stream_options, wait_until)

pytestmark = pytest.mark.skip_on_embedded(
    "the fault tests start a real Kafka of their own from KAFKA_HOME; they ran in the real-Kafka "
    "pass")

REPO_ROOT = Path(__file__).resolve().parents[2]
GROUP_TIMEOUTS = (6_000, 1_000)          # session, heartbeat (ms); Kafka's minimum session is 6 s
REQUEST_TIMEOUT_MS = 5_000               # small, so that stalls longer than it are cheap

FIGURES: Counter = Counter()             # faults per kind, records checked / lost / duplicated


# --- the broker behind a proxy -------------------------------------------------------------------

@pytest.fixture(scope="module")
def faulty(request, summary_lines):
    if local_distribution() is None:
        pytest.skip("needs a local Apache Kafka distribution (KAFKA_HOME, or KAFKA_ZK_HOME) to "
                    "restart the broker and to put the fault proxy in front of it")
    proxy = FaultProxy(max_fault_s=90)
    broker = start_local_broker(listeners={"PROXIED": "PLAINTEXT"},
                                advertised_ports={"PROXIED": proxy.port})
    proxy.set_upstream(broker.address("PROXIED"))
    proxy.start()

    def report():
        proxy.close()
        broker.stop()
        if FIGURES:
            faults = {k[len("fault "):]: v for k, v in sorted(FIGURES.items())
                      if k.startswith("fault ") and k != "fault refused"}
            summary_lines.append(
                f"fault figures: faults injected {sum(faults.values())} {faults} (and "
                f"{FIGURES['fault refused']} connections reset during outages); records "
                f"checked {FIGURES['checked']}, lost {FIGURES['lost']}, duplicated "
                f"{FIGURES['duplicated']}")

    request.addfinalizer(report)
    return SimpleNamespace(broker=broker, proxy=proxy, direct=broker.bootstrap_servers,
                           via_proxy=proxy.address)


@pytest.fixture
def proxy(faulty):
    """The proxy, clean for each test; what it injected is added to the module's figures."""
    p = faulty.proxy
    p.clear()
    p.end_outage()
    before = Counter(p.injected())
    yield p
    p.clear()
    p.end_outage()
    for kind, n in (Counter(p.injected()) - before).items():
        FIGURES[f"fault {kind}"] += n


def topic_with(faulty, name, counts: dict[int, int]) -> str:
    """A new topic holding ``counts[p]`` records in partition p, values ``p{p}-{offset}``."""
    topic = unique_topic_name(name)
    create_topic(faulty.direct, topic, partitions=len(counts))
    produce_more(faulty, topic, counts)
    return topic


def produce_more(faulty, topic, counts: dict[int, int], start: dict[int, int] | None = None):
    produce_counts(faulty.direct, topic, counts, start, one_per_batch=False)


def expected(counts: dict[int, int]) -> set[tuple[int, int, str]]:
    return {(p, o, f"p{p}-{o}") for p, n in counts.items() for o in range(n)}


def check_exactly_once(rows, counts: dict[int, int]) -> None:
    """Every produced record once, nothing else; counted into the figures."""
    rows = [(int(p), int(o), v) for p, o, v in rows]
    seen = Counter(rows)
    want = expected(counts)
    lost = len(want - set(seen))
    duplicated = sum(n - 1 for n in seen.values() if n > 1)
    FIGURES.update(checked=len(rows), lost=lost, duplicated=duplicated)
    assert lost == 0, f"{lost} records lost, e.g. {sorted(want - set(seen))[:5]}"
    assert duplicated == 0, f"{duplicated} duplicates, e.g. " \
                            f"{[r for r, n in seen.items() if n > 1][:5]}"
    assert set(seen) == want, f"unexpected rows {sorted(set(seen) - want)[:5]}"


def batch_rows(spark, bootstrap, topic, **options):
    reader = (spark.read.format("pykafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("kafka.request.timeout.ms", str(REQUEST_TIMEOUT_MS))
              .option("fetchOffset.retryIntervalMs", "500"))
    for k, v in options.items():
        reader = reader.option(k, str(v))
    df = reader.load().selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
    return [(r.partition, r.offset, r.value) for r in df.collect()]


def matching(topic: str):
    name = topic.encode()
    return lambda frame: name in frame


def fault_stream_options(bootstrap, topic, group, **extra):
    return stream_options(bootstrap, topic, GROUP_TIMEOUTS, **{
        "kafka.group.id": group, "startingOffsets": "earliest",
        "kafka.request.timeout.ms": REQUEST_TIMEOUT_MS, "fetchOffset.retryIntervalMs": 500,
        **extra})


def start_parquet_stream(spark, options, tmp_path, trigger="500 milliseconds"):
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    query = (load_stream(spark, options)
             .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
             .trigger(processingTime=trigger).start())
    return query, out


def wait_for_rows(spark, query, out, total, timeout_s) -> None:
    def enough():
        if query.exception() is not None:
            raise AssertionError(f"the stream failed: {query.exception()}")
        return len(sink_rows(spark, out)) >= total

    wait_until(enough, timeout_s, f"{total} rows in the sink")


# --- a restarting broker while a query is planned ------------------------------------------------

def test_batch_read_outlasts_metadata_of_a_broker_that_does_not_know_the_cluster(
        spark, faulty, proxy):
    counts = {0: 40, 1: 35}
    topic = topic_with(faulty, "zk-restart", counts)
    # What a restarting ZooKeeper-mode broker answers until the controller has updated it (no
    # brokers, UNKNOWN_TOPIC_OR_PARTITION): it used to fail the read ("does not exist"), or,
    # when the next answer knew the topic, to read nothing of it.
    fault = proxy.inject(ApiKey.Metadata, "answer", answer=restarting_broker_metadata,
                         match=matching(topic), times=3)
    rows = batch_rows(spark, faulty.via_proxy, topic)
    assert fault.injected == 3
    check_exactly_once(rows, counts)


def without_partitions(faulty):
    """What a ZooKeeper-mode broker answers once it knows the brokers but not yet the
    partitions (measured on Kafka 2.2): brokers listed, every topic unknown, no topic at all
    when all are asked for."""
    return broker_without_partitions_metadata(1, "127.0.0.1", faulty.proxy.port)


def test_batch_read_outlasts_a_broker_that_knows_the_brokers_but_not_the_partitions(
        spark, faulty, proxy):
    if not faulty.broker.zookeeper_mode:
        pytest.skip("only a ZooKeeper-mode broker serves Metadata before it has learnt the "
                    "cluster's partitions; a KRaft broker's answer is final (the next test)")
    counts = {0: 30, 1: 45}
    topic = topic_with(faulty, "zk-no-partitions", counts)
    # It used to fail at once with "Topic ... does not exist" (issue 17).
    fault = proxy.inject(ApiKey.Metadata, "answer", answer=without_partitions(faulty),
                         match=is_metadata_of(topic), times=4)
    rows = batch_rows(spark, faulty.via_proxy, topic)
    assert fault.injected == 4
    check_exactly_once(rows, counts)


def test_a_kraft_broker_that_lists_no_topic_is_believed_about_a_missing_one(
        spark, faulty, proxy):
    if faulty.broker.zookeeper_mode:
        pytest.skip("a ZooKeeper-mode broker that lists no topic may not have learnt the "
                    "partitions yet: doubted (the test before)")
    # What a new KRaft cluster answers (its brokers serve only once they have caught up): the
    # topic unknown, and no topic at all. The read used to take this for a starting broker
    # and ask again until the planning retries ran out (30 s with the default options).
    missing = unique_topic_name("missing-on-empty")
    fault = proxy.inject(ApiKey.Metadata, "answer", answer=without_partitions(faulty),
                         match=is_metadata_of(missing), times=4)
    with pytest.raises(Exception, match=f"Topic '{missing}' does not exist"):
        batch_rows(spark, faulty.via_proxy, missing)
    assert fault.injected == 1      # the named topic's answer, believed; no whole list asked


def test_stream_outlasts_a_broker_that_knows_the_brokers_but_not_the_partitions(
        spark, faulty, proxy, tmp_path):
    counts = {0: 30, 1: 30}
    topic = topic_with(faulty, "zk-no-partitions-stream", counts)
    group = unique_topic_name("g-no-partitions")
    query, out = start_parquet_stream(spark, fault_stream_options(
        faulty.via_proxy, topic, group, maxOffsetsPerTrigger=20), tmp_path)
    try:
        wait_for_rows(spark, query, out, 60, 120)
        # Every Metadata about the topic (the driver's triggers, the executors' leader
        # look-ups) and every whole-topic list gets that answer, four times (about 2 s at
        # 'fetchOffset.retryIntervalMs' 500, under the 2.5 s the client doubts an absence with
        # 'kafka.request.timeout.ms' 5000): the stream used to die with "DataLossError: ... no
        # longer exists" at the first.
        fault = proxy.inject(ApiKey.Metadata, "answer", answer=without_partitions(faulty),
                             match=is_metadata_of(topic), times=4)
        produce_more(faulty, topic, {0: 25, 1: 35}, start=counts)
        wait_until(lambda: fault.injected == 4, 60, "four answers without partitions")
        wait_for_rows(spark, query, out, 120, 120)
        wait_until(lambda: committed(faulty.direct, group, topic) == {0: 55, 1: 65}, 60,
                   "the group's commits to reach the log end")
        check_exactly_once(sink_rows(spark, out), {0: 55, 1: 65})
    finally:
        query.stop()


def test_a_topic_that_does_not_exist_fails_at_once_when_the_cluster_answers_normally(
        spark, faulty, proxy):
    missing = unique_topic_name("missing")
    asked = proxy.add(Fault.observer(ApiKey.Metadata, match=matching(missing)))
    with pytest.raises(Exception, match=f"Topic '{missing}' does not exist"):
        batch_rows(spark, faulty.via_proxy, missing, **{"fetchOffset.numRetries": 5})
    assert asked.injected == 1      # no retries: the answer listed brokers, it is final


def test_a_read_and_a_write_started_during_a_restart_ride_it_out_with_default_options(
        spark, faulty, proxy, summary_lines):
    """A rolling restart's bounce, through the broker's real shutdown and start-up, no proxy
    between: a batch read and then a write started one second into a restart, with every option
    at its default, reach the restarted broker and are exact. (kafka-python's reconnect backoff
    grows to 30 s; on Kafka 4.0, whose broker is down about 20 s, the read used to reach it
    about 10 s after it was back, past the 30 s bound, failing with ECONNREFUSED.)"""
    counts = {0: 400, 1: 300}
    topic = topic_with(faulty, "restart-defaults", counts)
    timings = []

    def during_a_restart(action):
        marks = {}

        def bounce():
            marks["down"] = time.monotonic()
            faulty.broker.restart()
            marks["up"] = time.monotonic()

        bouncer = threading.Thread(target=bounce)
        bouncer.start()
        try:
            time.sleep(1.0)
            result = action()
            marks["done"] = time.monotonic()
        finally:
            bouncer.join()
        FIGURES["fault broker:restart"] += 1
        timings.append((marks["up"] - marks["down"], marks["done"] - marks["up"]))
        return result

    def read(name):
        df = (spark.read.format("pykafka").option("kafka.bootstrap.servers", faulty.direct)
              .option("subscribe", name).load()
              .selectExpr("partition", "offset", "CAST(value AS STRING) AS value"))
        return [(r.partition, r.offset, r.value) for r in df.collect()]

    check_exactly_once(during_a_restart(lambda: read(topic)), counts)

    out = unique_topic_name("restart-defaults-out")
    create_topic(faulty.direct, out, partitions=2)
    rows = spark.createDataFrame([(p, f"p{p}-{o}") for p, n in counts.items()
                                  for o in range(n)], "partition int, value string")
    during_a_restart(lambda: rows.write.format("pykafka").mode("append")
                     .option("kafka.bootstrap.servers", faulty.direct)
                     .option("topic", out).save())
    # Written with each row's partition, in order within a partition per task: the values are
    # the read's expectations when offsets are ignored.
    written = Counter((p, v) for p, _, v in read(out))
    assert written == Counter((p, f"p{p}-{o}") for p, n in counts.items() for o in range(n))
    summary_lines.append(
        "restart with default options: " + "; ".join(
            f"{what} (broker down {down:.1f} s) done {after:.1f} s after it was back"
            for what, (down, after) in zip(("batch read", "write"), timings)))


def test_broker_restart_while_a_batch_is_planned_and_a_stream_runs(spark, faulty, proxy,
                                                                   tmp_path):
    stream_topic = topic_with(faulty, "bounce-stream", {0: 30, 1: 30})
    batch_counts = {0: 60, 1: 40}
    batch_topic = topic_with(faulty, "bounce-batch", batch_counts)
    group = unique_topic_name("g-bounce")
    # The stream talks to the broker directly: during the restart it sees what clients see,
    # refused connections; the batch read goes through the proxy, which holds its first
    # ListOffsets so that the broker goes down while the read is being planned.
    query, out = start_parquet_stream(spark, fault_stream_options(
        faulty.direct, stream_topic, group, **{"kafka.request.timeout.ms": 60_000}), tmp_path)
    try:
        wait_for_rows(spark, query, out, 60, 90)
        held = proxy.inject(ApiKey.ListOffsets, "stall", seconds=2, match=matching(batch_topic))
        with ThreadPoolExecutor(1) as pool:
            read = pool.submit(batch_rows, spark, faulty.via_proxy, batch_topic,
                               **{"kafka.request.timeout.ms": 60_000})
            assert held.fired.wait(120), "the batch read never asked for offsets"
            pid = faulty.broker.process.pid
            faulty.broker.restart(hard=True)       # killed mid-planning; back ~10 s later
            assert faulty.broker.process.pid != pid
            check_exactly_once(read.result(timeout=180), batch_counts)
        FIGURES["fault broker:restart"] += 1
        produce_more(faulty, stream_topic, {0: 20, 1: 25}, start={0: 30, 1: 30})
        wait_for_rows(spark, query, out, 105, 120)
        wait_until(lambda: committed(faulty.direct, group, stream_topic) == {0: 50, 1: 55}, 60,
                   "the group's commits to reach the log end after the restart")
        check_exactly_once(sink_rows(spark, out), {0: 50, 1: 55})   # all batches are done
    finally:
        query.stop()


# --- connection faults ---------------------------------------------------------------------------

def test_batch_read_is_exact_through_connection_faults(spark, faulty, proxy):
    counts = {0: 300, 1: 250, 2: 200}
    topic = topic_with(faulty, "faulty-batch", counts)
    on = matching(topic)
    proxy.inject(ApiKey.Metadata, "reset", match=on)
    proxy.inject(ApiKey.ListOffsets, "reset", match=on)
    proxy.inject(ApiKey.Fetch, "reset", match=on, skip=1, times=3)      # cut mid-response
    proxy.inject(ApiKey.Fetch, "reset_request", match=on, times=2)
    proxy.inject(ApiKey.Fetch, "stall", match=on, seconds=REQUEST_TIMEOUT_MS / 1000 + 2)
    proxy.inject(ApiKey.Fetch, "drop", match=on)
    rows = batch_rows(spark, faulty.via_proxy, topic, maxRecordsPerPartition=100,
                      **{"kafka.max.partition.fetch.bytes": 2048})
    injected = proxy.injected()
    assert injected.get("Fetch:reset") == 3 and injected.get("Fetch:stall") == 1 \
        and injected.get("Fetch:drop") == 1, injected
    check_exactly_once(rows, counts)


def test_batch_read_fails_clearly_when_the_broker_is_gone_for_longer_than_the_bounds(
        spark, faulty, proxy):
    topic = topic_with(faulty, "gone-batch", {0: 50})
    # Gone while planning: every Metadata about the topic is cut.
    proxy.inject(ApiKey.Metadata, "reset_request", match=matching(topic), times=1 << 30)
    with pytest.raises(Exception) as info:
        batch_rows(spark, faulty.via_proxy, topic, **{"fetchOffset.numRetries": 1})
    message = str(info.value)
    assert "Could not get topic metadata" in message and "kafka.request.timeout.ms" in message
    proxy.clear()

    # Gone while the executors fetch: the broker vanishes while the first Fetch waits for its
    # answer and stays away for longer than kafkaConsumer.pollTimeoutMs. The task fails naming
    # that option, while the broker is still gone: the bound is the option's, not the broker's.
    first_fetch = proxy.inject(ApiKey.Fetch, "stall", seconds=60, match=matching(topic))

    def vanish():
        if first_fetch.fired.wait(120):
            proxy.outage(80)

    threading.Thread(target=vanish, daemon=True).start()
    with pytest.raises(Exception) as info:
        batch_rows(spark, faulty.via_proxy, topic, **{"kafkaConsumer.pollTimeoutMs": 8000})
    assert "kafkaConsumer.pollTimeoutMs" in str(info.value), str(info.value)[:2000]
    assert proxy.injected().get("refused", 0) > 0
    assert proxy.in_outage, "the read only failed after the outage ended"


def test_stream_is_exactly_once_through_connection_faults(spark, faulty, proxy, tmp_path):
    topic = topic_with(faulty, "faulty-stream", {0: 0, 1: 0, 2: 0})
    group = unique_topic_name("g-faults")
    on = matching(topic)
    grp = matching(group)
    stall_s = REQUEST_TIMEOUT_MS / 1000 + 2     # longer than a request may take
    # Armed before the query starts: its first JoinGroup is answered, then the connection cut
    # (the coordinator acted on it); then the SyncGroup; later commits, fetches, heartbeats ...
    proxy.inject(ApiKey.JoinGroup, "reset", match=grp)
    proxy.inject(ApiKey.SyncGroup, "reset", match=grp)
    proxy.inject(ApiKey.FindCoordinator, "reset_request", match=grp, skip=1)
    proxy.inject(ApiKey.OffsetCommit, "reset", match=grp, skip=1, times=2)
    # (The stalls hit the first commit and the second fetch that the resets let through: a
    # stream commits once per trigger with new data, and fetches once or twice per batch, so
    # later ones may never come.)
    proxy.inject(ApiKey.OffsetCommit, "stall", match=grp, skip=0, seconds=stall_s)
    proxy.inject(ApiKey.JoinGroup, "stall", match=grp, seconds=stall_s)   # the next ones
    proxy.inject(ApiKey.SyncGroup, "stall", match=grp, seconds=stall_s)
    proxy.inject(ApiKey.Heartbeat, "reset", match=grp, skip=2)
    proxy.inject(ApiKey.Metadata, "answer", answer=restarting_broker_metadata, match=on, skip=3)
    proxy.inject(ApiKey.ListOffsets, "reset", match=on, skip=4)
    proxy.inject(ApiKey.Fetch, "reset", match=on, skip=2, times=2)
    proxy.inject(ApiKey.Fetch, "stall", match=on, skip=1, seconds=stall_s)
    query, out = start_parquet_stream(spark, fault_stream_options(
        faulty.via_proxy, topic, group, maxOffsetsPerTrigger=90), tmp_path)
    produced = {0: 0, 1: 0, 2: 0}
    try:
        for round_ in range(8):
            batch = {0: 20, 1: 15, 2: 10}
            produce_more(faulty, topic, batch, start=produced)
            produced = {p: produced[p] + n for p, n in batch.items()}
            if round_ == 4:
                proxy.outage(3)     # gone for less than the bounds: nothing may fail
            time.sleep(0.7)
        wait_for_rows(spark, query, out, sum(produced.values()), 180)
        wait_until(lambda: committed(faulty.direct, group, topic) == produced, 60,
                   "the group's commits to reach the log end")
        check_exactly_once(sink_rows(spark, out), produced)   # all batches are done
        assert end_offsets(faulty.direct, topic, 3) == produced
        injected = proxy.injected()
        for kind in ("JoinGroup:reset", "SyncGroup:reset", "OffsetCommit:reset", "Fetch:reset",
                     "Fetch:stall", "OffsetCommit:stall", "JoinGroup:stall", "SyncGroup:stall",
                     "outage"):
            assert injected.get(kind), (kind, injected)
    finally:
        query.stop()


def test_stream_fails_clearly_when_the_broker_is_gone_then_resumes_exactly_once(
        spark, faulty, proxy, tmp_path):
    topic = topic_with(faulty, "gone-stream", {0: 40, 1: 40})
    group = unique_topic_name("g-gone")
    options = fault_stream_options(faulty.via_proxy, topic, group,
                                   **{"fetchOffset.numRetries": 1,
                                      "kafkaConsumer.pollTimeoutMs": 8000})
    query, out = start_parquet_stream(spark, options, tmp_path)
    try:
        wait_for_rows(spark, query, out, 80, 90)
        # A commit in flight when the broker goes (found in CI, where it happened by chance:
        # leaving the group made it again for kafka.default.api.timeout.ms, a minute, and the
        # query's error waited for that). The next commit of the group is held until then.
        held = proxy.inject(ApiKey.OffsetCommit, "stall", match=matching(group), seconds=60)
        produce_more(faulty, topic, {0: 5, 1: 5}, start={0: 40, 1: 40})
        assert held.fired.wait(60), "the query committed nothing after its next batch"
        proxy.outage(80)
        failed = wait_until(lambda: query.exception(), 60, "the query to fail")
        assert proxy.in_outage, "it failed only when the broker returned"
    finally:
        query.stop()
    message = str(failed)
    assert any(option in message for option in ("kafka.request.timeout.ms",
                                                "kafkaConsumer.pollTimeoutMs")), message[:2000]
    proxy.end_outage()
    produce_more(faulty, topic, {0: 20, 1: 25}, start={0: 45, 1: 45})
    # Restarted from its checkpoint once the broker is back: nothing lost, nothing twice.
    rerun = (load_stream(spark, options)
             .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
             .writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert rerun.awaitTermination(180), "the restarted query did not finish"
    assert rerun.exception() is None, rerun.exception()
    check_exactly_once(sink_rows(spark, out), {0: 65, 1: 70})
    if not spark_features.ADMISSION_CONTROL:
        # PySpark 4.0/4.1: an AvailableNow run's one batch is committed when the next run of
        # the checkpoint starts (docs/platforms.md): that run commits it, reading nothing new
        settle = (load_stream(spark, options)
                  .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
                  .writeStream.format("parquet").option("path", out)
                  .option("checkpointLocation", str(tmp_path / "ck"))
                  .trigger(availableNow=True).start())
        assert settle.awaitTermination(180) and settle.exception() is None
    wait_until(lambda: committed(faulty.direct, group, topic) == {0: 65, 1: 70}, 60,
               "the group's commits after the restart")


class RecordingClient(BrokerClient):
    """A BrokerClient that remembers which requests failed, and how."""

    def __init__(self, config):
        super().__init__(config)
        self.failures: list[tuple[str, str]] = []

    def send(self, node_id, request, timeout_ms=None):
        try:
            return super().send(node_id, request, timeout_ms)
        except RetriableBrokerError as exc:
            self.failures.append((type(request).__name__, str(exc)))
            raise


def test_group_member_waits_for_a_held_join_and_retries_timed_out_commits(faulty, proxy):
    topic = topic_with(faulty, "member", {0: 0, 1: 0})
    group = unique_topic_name("g-member")
    options = parse_stream_options(fault_stream_options(
        faulty.via_proxy, topic, group, **{"kafka.request.timeout.ms": 2000,
                                           "kafka.max.poll.interval.ms": 20_000}))
    config = options.source.client_config
    client = RecordingClient(config)
    member = GroupMember(client, lambda: BrokerClient(config), options.group,
                         load_assignor("range"), request_timeout_ms=2000)
    grp = matching(group)
    try:
        # The coordinator may hold a JoinGroup for up to the rebalance timeout (20 s here), far
        # longer than the request timeout (2 s): the member must wait, not time it out.
        proxy.inject(ApiKey.JoinGroup, "stall", match=grp, seconds=3)
        assert member.ensure_active([topic], {topic: 2}) == ((topic, 0), (topic, 1))
        assert not [f for f in client.failures if f[0] == "JoinGroupRequest"], client.failures
        # A commit or an offset fetch whose answer never comes is retried (within
        # kafka.default.api.timeout.ms), not failed after one request timeout.
        proxy.inject(ApiKey.OffsetCommit, "stall", match=grp, seconds=3)
        assert member.commit({(topic, 0): 0, (topic, 1): 0}) is True
        proxy.inject(ApiKey.OffsetFetch, "stall", match=grp, seconds=3)
        assert member.committed([(topic, 0), (topic, 1)]) == {(topic, 0): 0, (topic, 1): 0}
        timed_out = sorted({name for name, _ in client.failures})
        assert timed_out == ["OffsetCommitRequest", "OffsetFetchRequest"], client.failures
        # A SyncGroup that never answers: the member rejoins and gets its assignment.
        proxy.inject(ApiKey.SyncGroup, "drop", match=grp)
        member.request_rejoin("the test asks for it")
        assert member.ensure_active([topic], {topic: 2}) == ((topic, 0), (topic, 1))
        assert committed(faulty.direct, group, topic) == {0: 0, 1: 0}
    finally:
        member.close()
        client.close()


def test_group_member_async_commit_goes_out_at_once_and_outlives_a_lost_answer(faulty, proxy):
    topic = topic_with(faulty, "member-async", {0: 5, 1: 5})
    group = unique_topic_name("g-member-async")
    options = parse_stream_options(fault_stream_options(
        faulty.via_proxy, topic, group, **{"kafka.request.timeout.ms": 2000}))
    config = options.source.client_config
    client = BrokerClient(config)
    member = GroupMember(client, lambda: BrokerClient(config), options.group,
                         load_assignor("range"), request_timeout_ms=2000)
    try:
        assert member.ensure_active([topic], {topic: 2}) == ((topic, 0), (topic, 1))
        outcomes = []
        member.commit_async({(topic, 0): 3}, outcomes.append)
        # Nothing polls the member's connection from here on: the request left already.
        wait_until(lambda: committed(faulty.direct, group, topic).get(0) == 3, 10,
                   "the asynchronous commit at the broker")
        assert outcomes == []
        member.settle_commits()
        assert outcomes == [True]
        # An answer lost on its way back, at a trigger: commits are best effort there, the
        # request times out and the commit is reported failed, for the reader to make again at
        # the next trigger (with its newest offsets) -- reading never waits on the coordinator.
        lost = proxy.inject(ApiKey.OffsetCommit, "drop", match=matching(group), times=1)
        member.commit_async({(topic, 0): 4, (topic, 1): 2}, outcomes.append)
        member.settle_commits()
        assert lost.injected == 1 and outcomes == [True, False]
        member.commit_async({(topic, 0): 4, (topic, 1): 2}, outcomes.append)
        member.settle_commits()
        assert outcomes == [True, False, True]
        assert committed(faulty.direct, group, topic) == {0: 4, 1: 2}
        # Before a rejoin or on leaving, a lost answer is made again at once, synchronously.
        lost = proxy.inject(ApiKey.OffsetCommit, "drop", match=matching(group), times=1)
        member.commit_async({(topic, 0): 5}, outcomes.append)
        member.settle_commits(retry_ms=10_000)
        assert lost.injected == 1 and outcomes == [True, False, True, True]
        assert committed(faulty.direct, group, topic) == {0: 5, 1: 2}
    finally:
        member.close()
        client.close()


# --- task retry: a Python worker killed in the middle of a read ----------------------------------

def _kill_when_held(fault: Fault, proxy: FaultProxy, killed: list, timeout_s: float) -> None:
    """When ``fault`` holds a Fetch, SIGKILL the Spark Python worker that sent it."""
    if not fault.fired.wait(timeout_s):
        return
    pid = pid_of_client(fault.peers[0], proxy.port)
    if pid is None:
        return
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    os.kill(pid, signal.SIGKILL)
    killed.append((pid, cmdline))


@AVAILABLE_NOW_IN_MICRO_BATCHES    # the stream's worker is killed in its second micro-batch
def test_killed_python_worker_is_retried_exactly_once(spark, faulty, proxy, tmp_path):
    batch_counts = {0: 120, 1: 80, 2: 100}
    batch_topic = topic_with(faulty, "retry-batch", batch_counts)
    stream_counts = {0: 150, 1: 150}
    stream_topic = topic_with(faulty, "retry-stream", stream_counts)
    group = unique_topic_name("g-retry")
    # Each held Fetch keeps a worker waiting (well within the request timeout) until it is
    # killed; the retried task's fetches pass. The stream's is in its second micro-batch.
    held_batch = proxy.inject(ApiKey.Fetch, "stall", seconds=60, match=matching(batch_topic))
    held_stream = proxy.inject(ApiKey.Fetch, "stall", seconds=60, match=matching(stream_topic),
                               skip=2)
    killed: list = []
    killers = [threading.Thread(target=_kill_when_held, args=(f, proxy, killed, 240), daemon=True)
               for f in (held_batch, held_stream)]
    for k in killers:
        k.start()
    env = {**spark_worker_env(),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    # local[2,3]: two cores, and a task gets three attempts (local mode ignores
    # spark.task.maxFailures).
    job = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("task_retry_job.py")),
         "--master", "local[2,3]", "--bootstrap", faulty.via_proxy, "--batch-topic", batch_topic,
         "--stream-topic", stream_topic, "--group", group, "--out", str(tmp_path),
         "--max-per-trigger", "100"],
        env=env, capture_output=True, text=True, timeout=300)
    for k in killers:
        k.join(5)
    log = job.stdout + job.stderr
    assert job.returncode == 0, log[-5000:]
    assert len(killed) == 2 and all("pyspark" in cmd for _, cmd in killed), killed
    FIGURES["fault python-worker:SIGKILL"] += len(killed)
    # Spark saw each task fail because of the dead worker -- once in the batch read, once in a
    # micro-batch of the stream -- and retried it.
    lost = [line for line in log.splitlines()
            if "Lost task" in line and "Python worker exited unexpectedly" in line]
    assert len(lost) == 2 and sum("batchId" in line for line in lost) == 1, lost or log[-5000:]

    with open(tmp_path / "batch.jsonl") as f:
        check_exactly_once([tuple(json.loads(line)) for line in f], batch_counts)
    # Read as a user would: through the sink's log of committed files.
    check_exactly_once(sink_rows(spark, str(tmp_path / "stream")), stream_counts)
    assert committed(faulty.direct, group, stream_topic) == stream_counts
