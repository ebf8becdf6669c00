"""What the cluster scenarios share: traffic that keeps running while a fault happens, and the
record-by-record checks afterwards.

Traffic (each a thread, started before the fault and stopped after the cluster is whole again;
it runs for as long as the scenario takes, so a fault that passes sooner -- a broker JVM that
restarts faster -- leaves fewer repeated batch reads and fewer records checked, never a fault
window without traffic):

* :class:`Feed` -- a kafka-python producer (``acks=all``, idempotent) writing unique values
  ``<prefix><seq>`` round-robin over a topic's partitions, remembering what was acknowledged.
* :class:`Stream` -- ``spark.readStream.format("pykafka")`` in a consumer group with
  ``maxOffsetsPerTrigger``, a processing-time trigger, into parquet with a checkpoint.
* :class:`BatchLoop` -- ``spark.read.format("pykafka")`` of fixed offset ranges, again and again.
* :class:`SinkLoop` -- ``df.write.format("pykafka")`` of unique values, job after job.
* :class:`CommitWatch` -- the group's committed offsets polled (OffsetFetch through kafka-python's
  admin client, not through the connector) throughout: stable reads where the broker takes them
  (:func:`stable_group_offsets`).

The truth is what Kafka holds at the end, read with a plain kafka-python consumer
(:func:`read_topic`): every ``(partition, offset, value)`` there must have been read exactly once
by each reader whose range covers it, and every acknowledged value must be there. Whether the
group's committed offsets ever moved backwards is judged twice: from the polls, and from the
group's every commit in ``__consumer_offsets`` itself (:func:`commit_history`), which misses
nothing a poll could fall between.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from kafka_source.testing.progress import source_offsets

#: Stream group timeouts: Kafka's session default before 3.0 (10 s), heartbeats every second.
#: Shorter sessions (6 s) got the member dropped by its coordinator during broker failures when
#: the shared 2-core machine was loaded (load average 12-14): fencing is tested on purpose by
#: test_stream_planner_frozen_past_the_session_timeout instead. Everything else is the
#: connector's default.
SESSION_MS = 10_000
HEARTBEAT_MS = 1_000


def short(exc: BaseException | str, limit: int = 400) -> str:
    """An error's first line and its Java cause, not a whole py4j stack trace."""
    text = str(exc)
    lines = [line for line in text.splitlines() if line.strip()]
    head = lines[0] if lines else repr(exc)
    # A Python worker's traceback: its last "SomeError: message" line says what happened.
    raised = next((line.strip() for line in reversed(lines)
                   if not line.startswith((" ", "\t")) and "Error" in line.split(":")[0]
                   and line is not head), "")
    cause = next((line.strip() for line in lines if line.startswith("Caused by")), "")
    extra = " ... ".join(x[:limit] for x in (raised, cause) if x)
    return (head[:limit] + (f" ... {extra}" if extra else "")).strip()


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------

@dataclass
class Figures:
    """What one scenario did and found; printed as one line at the end of the run."""

    faults: Counter = field(default_factory=Counter)
    checked: int = 0
    lost: int = 0
    duplicated: int = 0
    backwards: int = 0
    commits: int = 0          # commits seen in __consumer_offsets
    polls: int = 0            # reads of the group's offsets by the commit watch
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)   # other counts worth the summary line

    def fault(self, kind: str, n: int = 1) -> None:
        self.faults[kind] += n

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def line(self, generation: str, scenario: str, outcome: str, seconds: float) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "-"
        return (f"cluster {generation:9} {scenario:48} faults {sum(self.faults.values())} "
                f"({kinds}); records checked {self.checked}, lost {self.lost}, duplicated "
                f"{self.duplicated}; commits {self.commits} (polled {self.polls}), backwards "
                f"{self.backwards}; "
                + "".join(f"{note}; " for note in self.notes)
                + f"{outcome} in {seconds:.0f} s")

    def assert_clean(self) -> None:
        assert not self.problems and self.lost == 0 and self.duplicated == 0 \
            and self.backwards == 0, (
            f"lost {self.lost}, duplicated {self.duplicated}, commits backwards "
            f"{self.backwards}:\n- " + "\n- ".join(self.problems))


def check_reads(figures: Figures, what: str, truth: dict, rows, *, complete: bool = True) -> None:
    """``rows`` ((partition, offset, value), ...) against ``truth`` {(partition, offset): value}:
    every truth record exactly once, nothing else. Counted into ``figures``. A reader that did
    not finish (``complete=False``: a failed stream) is only checked for duplicates and wrong
    rows; what it did not get to is not counted as lost."""
    seen = Counter((int(p), int(o)) for p, o, _ in rows)
    values = {(int(p), int(o)): v for p, o, v in rows}
    lost = [k for k in truth if k not in seen] if complete else []
    duplicated = {k: n for k, n in seen.items() if n > 1}
    extra = [k for k in seen if k not in truth]
    wrong = [k for k in truth if k in values and values[k] != truth[k]]
    figures.checked += len(truth) if complete else len(seen)
    figures.lost += len(lost)
    figures.duplicated += sum(n - 1 for n in duplicated.values())
    if lost:
        figures.problem(f"{what}: {len(lost)} of {len(truth)} records never read, e.g. "
                        f"{sorted(lost)[:5]}")
    if duplicated:
        figures.problem(f"{what}: {sum(n - 1 for n in duplicated.values())} duplicates, e.g. "
                        f"{sorted(duplicated.items())[:5]}")
    if extra:
        figures.problem(f"{what}: {len(extra)} rows outside the range, e.g. {sorted(extra)[:5]}")
    if wrong:
        figures.problem(f"{what}: {len(wrong)} rows with the wrong value, e.g. "
                        f"{[(k, values[k], truth[k]) for k in sorted(wrong)[:3]]}")


def check_sink_values(figures: Figures, what: str, rows: int, values, *,
                      complete: bool = True) -> None:
    """The values ``s00000000`` .. ``s{rows-1}`` a sink wrote, against what Kafka holds: each
    exactly once. Rows of a failed write may be partly written (at-least-once): with
    ``complete=False`` missing ones are not counted as lost."""
    in_kafka = Counter(values)
    want = {f"s{n:08d}" for n in range(rows)}
    lost = [v for v in want if v not in in_kafka] if complete else []
    duplicated = {v: n for v, n in in_kafka.items() if n > 1}
    figures.checked += len(want)
    figures.lost += len(lost)
    figures.duplicated += sum(n - 1 for n in duplicated.values())
    if lost:
        figures.problem(f"{what}: {len(lost)} of {len(want)} written values not in Kafka, e.g. "
                        f"{sorted(lost)[:5]}")
    if duplicated:
        figures.problem(f"{what}: {len(duplicated)} values in Kafka more than once, e.g. "
                        f"{sorted(duplicated.items())[:5]}")


def check_acknowledged(figures: Figures, what: str, acked, truth: dict) -> None:
    """Every value a producer saw acknowledged is in Kafka, once (else the cluster, not the
    reader, lost or duplicated it: reported, counted as lost/duplicated)."""
    in_kafka = Counter(truth.values())
    missing = [v for v in acked if v not in in_kafka]
    twice = {v: n for v, n in in_kafka.items() if n > 1}
    figures.lost += len(missing)
    figures.duplicated += sum(n - 1 for n in twice.values())
    if missing:
        figures.problem(f"{what}: {len(missing)} acknowledged values not in Kafka, e.g. "
                        f"{sorted(missing)[:5]}")
    if twice:
        figures.problem(f"{what}: {len(twice)} values in Kafka more than once, e.g. "
                        f"{sorted(twice.items())[:5]}")


# --------------------------------------------------------------------------------------------
# Kafka, seen with plain kafka-python clients
# --------------------------------------------------------------------------------------------

def _retrying(what: str, call, timeout_s: float = 60):
    """``call()``, again after a retriable kafka-python error until ``timeout_s``. kafka-python
    3.x raises a refused connection to a node its metadata still names (a broker a scenario has
    just killed) out of ``position``/``poll``/``end_offsets`` instead of trying another node; the
    scenarios' ground truth must not fail on that."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except KafkaError as e:
            if not getattr(e, "retriable", False) or time.monotonic() > deadline:
                raise AssertionError(f"{what}: {e!r} (retried for {timeout_s} s)") from e
            time.sleep(0.5)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = _retrying(f"end offsets of {topic}", lambda: consumer.end_offsets(tps))
        return {tp.partition: o for tp, o in ends.items()}
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, partitions: int,
               ends: dict[int, int] | None = None, timeout_s: float = 90) -> dict:
    """{(partition, offset): value} of ``topic`` from the start to ``ends`` (default: the end
    offsets now), read with kafka-python's consumer."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             request_timeout_ms=30_000)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        if ends is None:
            ends = {tp.partition: o for tp, o in
                    _retrying(f"end offsets of {topic}", lambda: consumer.end_offsets(tps)).items()}
        out = {}
        deadline = time.monotonic() + timeout_s

        def behind() -> bool:
            return any(consumer.position(tp) < ends[tp.partition] for tp in tps)

        while _retrying(f"positions in {topic}", behind):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} up to {ends} in {timeout_s} s "
                                     f"(got {len(out)} records)")
            polled = _retrying(f"poll of {topic}", lambda: consumer.poll(timeout_ms=500))
            for batch in polled.values():
                for m in batch:
                    if m.offset < ends[m.partition]:
                        out[(m.partition, m.offset)] = m.value.decode()
        return out
    finally:
        consumer.close()


def stable_group_offsets(admin: KafkaAdminClient, group: str) -> dict:
    """``admin.list_group_offsets(group)[group]``, asked with OffsetFetch's ``RequireStable``
    (v7+, Kafka 2.5+; older brokers ignore it). kafka-python's admin client does not set it, and
    without it Kafka 4's coordinator answers as of the offsets partition's high watermark, which
    lags for a moment on a coordinator that has just taken over: a poll then sees the group's
    offsets older than a commit already acknowledged, which is the broker's view catching up,
    not a commit moving backwards (``kafka_source.group.commits``' docstring)."""
    from kafka.protocol.consumer import OffsetFetchRequest

    G = OffsetFetchRequest.OffsetFetchRequestGroup

    async def fetch():
        node = (await admin._find_coordinator_ids([group]))[group]
        request = OffsetFetchRequest(group_id=group, topics=None,
                                     groups=[G(group_id=group, topics=None)],
                                     require_stable=True, min_version=2, max_version=8)
        response = await admin._manager.send(request, node_id=node)
        return admin._list_group_offsets_process_response(response, group_id=group)[group]

    return admin._manager.run(fetch)


class CommitWatch(threading.Thread):
    """Polls the group's committed offsets for ``topic`` every ``interval_s`` and remembers each
    move backwards (partition, before, after)."""

    def __init__(self, bootstrap: str, group: str, topic: str, interval_s: float = 0.25):
        super().__init__(daemon=True, name=f"commit-watch-{group}")
        self.bootstrap, self.group, self.topic, self.interval_s = bootstrap, group, topic, interval_s
        self.last: dict[int, int] = {}
        self.backwards: list[tuple[int, int, int]] = []
        self.polls = 0
        self.errors = 0
        self._stop_event = threading.Event()

    def _admin(self):
        return KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5_000,
                                client_id="commit-watch")

    def run(self) -> None:
        admin = None
        while not self._stop_event.is_set():
            try:
                admin = admin or self._admin()
                offsets = stable_group_offsets(admin, self.group)
                self.polls += 1
                for tp, om in offsets.items():
                    if tp.topic != self.topic or om.offset < 0:
                        continue
                    before = self.last.get(tp.partition)
                    if before is not None and om.offset < before:
                        self.backwards.append((tp.partition, before, om.offset))
                    self.last[tp.partition] = om.offset
            except Exception:  # noqa: BLE001 - brokers come and go; the next poll retries
                self.errors += 1
                if admin is not None:
                    try:
                        admin.close()
                    except Exception:  # noqa: BLE001
                        pass
                admin = None
            self._stop_event.wait(self.interval_s)
        if admin is not None:
            admin.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)

    def committed(self) -> dict[int, int]:
        return dict(self.last)


def _read_str(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">h", buf, pos)
    return buf[pos + 2:pos + 2 + n].decode(), pos + 2 + n


def commit_history(bootstrap: str, group: str, partitions: int = 5) -> dict[tuple[str, int], list]:
    """Every offset commit of ``group`` in ``__consumer_offsets``, in log order, per
    (topic, partition). Offset-commit keys are versions 0 and 1 (group, topic, partition); every
    value version starts with the offset after its version; a null value deletes the offset."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             request_timeout_ms=30_000)
    history: dict[tuple[str, int], list] = defaultdict(list)
    try:
        tps = [TopicPartition("__consumer_offsets", p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "could not read __consumer_offsets to its end"
            for batch in consumer.poll(timeout_ms=500).values():
                for m in batch:
                    key = m.key
                    if key is None or m.value is None:
                        continue
                    (version,) = struct.unpack_from(">h", key, 0)
                    if version not in (0, 1):
                        continue
                    g, pos = _read_str(key, 2)
                    if g != group:
                        continue
                    topic, pos = _read_str(key, pos)
                    (partition,) = struct.unpack_from(">i", key, pos)
                    (offset,) = struct.unpack_from(">q", m.value, 2)
                    history[(topic, partition)].append(offset)
        return dict(history)
    finally:
        consumer.close()


def audit_commits(figures: Figures, bootstrap: str, group: str, watch: CommitWatch | None) -> None:
    """Count commits and moves backwards (from the log, and from the polls) into ``figures``."""
    history = commit_history(bootstrap, group)
    moves = [(tp, a, b) for tp, offsets in history.items()
             for a, b in zip(offsets, offsets[1:]) if b < a]
    figures.commits += sum(len(v) for v in history.values())
    polled = watch.backwards if watch is not None else []
    figures.backwards += max(len(moves), len(polled))
    figures.polls += watch.polls if watch is not None else 0
    if watch is not None and watch.polls == 0:
        figures.problem(f"group {group}: the commit watch never read the group's offsets "
                        f"({watch.errors} failed polls), so the polls judged nothing")
    if moves:
        figures.problem(f"group {group}: committed offsets moved backwards {len(moves)} times in "
                        f"__consumer_offsets, e.g. {moves[:5]}")
    if polled:
        figures.problem(f"group {group}: polls saw committed offsets move backwards "
                        f"{len(polled)} times, e.g. {polled[:5]}")


# --------------------------------------------------------------------------------------------
# Traffic
# --------------------------------------------------------------------------------------------

class Feed(threading.Thread):
    """Produces ``per_tick`` unique values every ``tick_s`` into ``topic``, round-robin over its
    partitions, with ``acks=all`` and idempotence, until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, per_tick: int = 6,
                 tick_s: float = 0.1, prefix: str = "v"):
        super().__init__(daemon=True, name=f"feed-{topic}")
        self.topic, self.partitions, self.per_tick, self.tick_s = topic, partitions, per_tick, tick_s
        self.prefix = prefix
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                      enable_idempotence=True, request_timeout_ms=30_000,
                                      delivery_timeout_ms=120_000)
        self.sent = 0
        self.acked: set[str] = set()
        self.failed: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stop_event = threading.Event()

    def _ok(self, value):
        def cb(_metadata):
            with self._lock:
                self.acked.add(value)
        return cb

    def _err(self, value):
        def cb(exc):
            with self._lock:
                self.failed.append((value, repr(exc)))
        return cb

    def send_some(self, n: int) -> None:
        with self._send_lock:
            for _ in range(n):
                value = f"{self.prefix}{self.sent:08d}"
                future = self.producer.send(self.topic, value=value.encode(),
                                            partition=self.sent % self.partitions)
                future.add_callback(self._ok(value)).add_errback(self._err(value))
                self.sent += 1

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.send_some(self.per_tick)
            self._stop_event.wait(self.tick_s)

    def stop(self, timeout_s: float = 150) -> None:
        """Stop producing and wait until every record is acknowledged or failed."""
        self._stop_event.set()
        self.join(30)
        self.producer.flush(timeout=timeout_s)
        self.producer.close(timeout=10)

    def check(self, figures: Figures) -> None:
        if self.failed:
            figures.problem(f"producer: {len(self.failed)} of {self.sent} records failed, e.g. "
                            f"{self.failed[:3]}")


def stream_options(bootstrap: str, topic: str, group: str, group_protocol: str = "classic",
                   **extra) -> dict[str, str]:
    """The scenarios' stream options. ``group_protocol="consumer"`` (KIP-848): without the
    classic group's session timeout and heartbeat interval, which such a query refuses (as
    Java's consumer does): the brokers' own apply (group.consumer.session.timeout.ms and
    group.consumer.heartbeat.interval.ms, Kafka 4.0's defaults of 45 s and 5 s)."""
    opts = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "kafka.group.id": group,
            "startingOffsets": "earliest", "maxOffsetsPerTrigger": "300",
            "kafka.max.poll.interval.ms": str(5 * SESSION_MS),
            "fetchOffset.retryIntervalMs": "500"}
    if group_protocol == "classic":
        opts.update({"kafka.session.timeout.ms": str(SESSION_MS),
                     "kafka.heartbeat.interval.ms": str(HEARTBEAT_MS)})
    else:
        opts["kafka.group.protocol"] = group_protocol
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


class Stream:
    """A checkpointed parquet stream from a pykafka source in consumer group ``group``."""

    #: Spark gives the Python process that plans a stream 10 s to connect back to the JVM; on
    #: this shared 2-core machine a fresh interpreter importing PySpark sometimes takes longer
    #: ("Python worker failed to connect back"). That is Spark's start-up, before the
    #: connector runs and before any fault: the query is started again, a few times.
    START_ATTEMPTS = 3

    def __init__(self, spark, options: dict, tmp_path, trigger: str = "500 milliseconds",
                 transform=None, *, may_fail_at_start: bool = False):
        """Started (again, from its checkpoint, with the same ``tmp_path``) and waited for until
        its first trigger completed; ``may_fail_at_start``: only started -- a stream whose first
        trigger is expected to fail (:meth:`failure` reports it)."""
        self.spark = spark
        self.options = options
        self.trigger = trigger
        self.transform = transform or (lambda df: df)
        self.group = options["kafka.group.id"]
        self.out = str(tmp_path / "stream-out")
        self.checkpoint = str(tmp_path / "stream-ck")
        self.restarts = 0
        if may_fail_at_start:
            self.query = self._start()
            return
        for attempt in range(self.START_ATTEMPTS):
            self.query = self._start()
            started = self._first_trigger(90)
            if started is None:
                return
            if "Python worker failed to connect back" not in started \
                    or attempt == self.START_ATTEMPTS - 1:
                raise AssertionError(f"the stream did not start: {short(started, 2000)}")
            self.restarts += 1

    def _start(self):
        reader = self.spark.readStream.format("pykafka")
        for k, v in self.options.items():
            reader = reader.option(k, v)
        rows = reader.load().selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        return (self.transform(rows)
                .writeStream.format("parquet").option("path", self.out)
                .option("checkpointLocation", self.checkpoint)
                .trigger(processingTime=self.trigger).start())

    def _first_trigger(self, timeout_s: float) -> str | None:
        """None once the query has completed a trigger; the error if it failed before."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            failed = self.query.exception()
            if failed is not None:
                return str(failed)
            if self.query.lastProgress is not None:
                return None
            time.sleep(0.2)
        raise AssertionError(f"the stream made no trigger within {timeout_s:.0f} s")

    def failure(self):
        return self.query.exception()

    def rows(self) -> list[tuple[int, int, str]]:
        try:
            return [(r.partition, r.offset, r.value)
                    for r in self.spark.read.parquet(self.out).collect()]
        except Exception as exc:  # nothing written yet
            if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
                return []
            raise

    def _alive(self) -> None:
        failed = self.failure()
        if failed is not None:
            raise AssertionError(f"the stream failed: {short(failed, 2000)}")

    def wait_for_rows(self, n: int, timeout_s: float) -> None:
        """Until the stream has put ``n`` rows into its sink. Counted from Spark's progress
        reports (a micro-batch's ``numInputRows`` is reported once its rows are in the sink),
        which costs no Spark job, unlike reading the sink, while the stream shares the cores;
        from the sink itself once the reports no longer reach back to the query's start."""
        def enough():
            self._alive()
            progress = self.query.recentProgress
            if not progress:
                return False
            if progress[0].get("batchId") == 0:  # every batch since the sink was empty
                return sum(p.get("numInputRows", 0) for p in progress) >= n
            return len(self.rows()) >= n

        wait_until(enough, timeout_s, f"{n} rows in the stream's sink", interval_s=1.0)

    def progress_end(self, topic: str) -> dict[int, int]:
        """The end offsets of the last completed micro-batch (from Spark's progress reports:
        no Spark job, unlike reading the sink)."""
        progress = self.query.lastProgress
        if not progress or not progress.get("sources"):
            return {}
        end = source_offsets(progress["sources"][0].get("endOffset"))
        return {int(p): int(o) for p, o in end.get(topic, {}).items()}

    def drain(self, truth: dict, ends: dict[int, int], watch: CommitWatch, topic: str,
              timeout_s: float = 180) -> list[tuple[int, int, str]]:
        """Wait until the stream has completed a micro-batch ending at ``ends`` and the group
        committed ``ends``, then until its sink holds every record of ``truth``; raises if the
        stream failed or any of it does not happen in time. Returns the sink's rows as last
        read, after the commits were seen: what the checks judge (one read of the sink, not
        one to wait and another to check)."""
        def caught_up():
            self._alive()
            done = self.progress_end(topic)
            return all(done.get(p, 0) >= o for p, o in ends.items())

        wait_until(caught_up, timeout_s, f"the stream to reach {ends} (progress: "
                   f"{self.progress_end(topic)})", interval_s=0.5)

        def committed():
            self._alive()
            return all(watch.last.get(p) == o for p, o in ends.items() if o > 0)

        wait_until(committed, 60, f"the group's commits to reach {ends} (last seen "
                   f"{watch.last})")
        rows: list[tuple[int, int, str]] = []

        def complete():
            self._alive()
            rows[:] = self.rows()
            return set(truth) <= {(p, o) for p, o, _ in rows}

        wait_until(complete, 30, f"all {len(truth)} records in the stream's sink",
                   interval_s=3.0)
        return list(rows)

    def stop(self) -> None:
        try:
            self.query.stop()
        except Exception:  # noqa: BLE001 - a failed query may refuse to stop cleanly
            pass


def batch_rows(spark, bootstrap: str, topic: str, ends: dict[int, int], **options):
    reader = (spark.read.format("pykafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("endingOffsets", json.dumps({topic: {str(p): o for p, o in ends.items()}}))
              .option("fetchOffset.retryIntervalMs", "500"))
    for k, v in options.items():
        reader = reader.option(k, str(v))
    df = reader.load().selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
    return [(r.partition, r.offset, r.value) for r in df.collect()]


class BatchLoop(threading.Thread):
    """Batch-reads ``topic`` from the start to its end offsets as of each read's start, read
    after read, until stopped; each read's rows are kept with its range for the checks."""

    def __init__(self, spark, bootstrap: str, topic: str, partitions: int, **options):
        super().__init__(daemon=True, name=f"batch-loop-{topic}")
        self.spark, self.bootstrap, self.topic, self.partitions = spark, bootstrap, topic, partitions
        self.options = dict(options)
        self.reads: list[tuple[dict, list]] = []
        self.failures: list[str] = []
        self.pause_s = 1.0        # between reads: the machine is shared
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                ends = end_offsets(self.bootstrap, self.topic, self.partitions)
            except Exception:  # noqa: BLE001 - the harness's own lookup; try again
                time.sleep(0.5)
                continue
            try:
                self.reads.append((ends, batch_rows(self.spark, self.bootstrap, self.topic, ends,
                                                    **self.options)))
            except Exception as exc:  # noqa: BLE001 - a failed read is a finding
                self.failures.append(f"{ends}: {short(exc)}")
            self._stop_event.wait(self.pause_s)

    def stop(self, timeout_s: float = 180) -> None:
        self._stop_event.set()
        self.join(timeout_s)
        if self.is_alive():
            self.failures.append(f"a batch read was still running {timeout_s:.0f} s after the "
                                 "loop was stopped")

    def check(self, figures: Figures, truth: dict) -> None:
        for ends, rows in self.reads:
            want = {k: v for k, v in truth.items() if k[1] < ends.get(k[0], 0)}
            check_reads(figures, f"batch read up to {ends}", want, rows)
        for failure in self.failures[:3]:
            figures.problem(f"batch read failed: {failure}")
        if len(self.failures) > 3:
            figures.problem(f"... and {len(self.failures) - 3} more batch reads failed")
        if not self.reads and not self.failures:
            figures.problem("no batch read completed")


class SinkLoop(threading.Thread):
    """``df.write.format("pykafka")`` of ``rows_per_job`` unique values (``s<n>``) into
    ``topic``, job after job, until stopped. A record is given 30 s
    (``kafka.delivery.timeout.ms``; the default is 120 s): a leader moves within seconds, and a
    write that hangs on a dead broker fails sooner."""

    def __init__(self, spark, bootstrap: str, topic: str, rows_per_job: int = 2000, **options):
        super().__init__(daemon=True, name=f"sink-loop-{topic}")
        self.spark, self.bootstrap, self.topic = spark, bootstrap, topic
        self.rows_per_job = rows_per_job
        self.options = {"kafka.request.timeout.ms": 10_000, "kafka.delivery.timeout.ms": 30_000,
                        **options}
        self.written = 0           # values s0 .. s{written-1} were written by jobs that succeeded
        self.attempted = 0
        self.jobs = 0
        self.failures: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        # Spark looks Python data sources up for df.write in the JVM thread's *active* session,
        # which a Python thread's JVM thread does not have (measured: DATA_SOURCE_NOT_FOUND
        # for "pykafka" in a thread, while reads in a thread work); set it, as the main thread has.
        jvm = self.spark._jvm
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(self.spark._jsparkSession)
        while not self._stop_event.is_set():
            start, end = self.attempted, self.attempted + self.rows_per_job
            self.attempted = end
            df = self.spark.range(start, end, numPartitions=2).selectExpr(
                "CONCAT('s', LPAD(CAST(id AS STRING), 8, '0')) AS value")
            writer = (df.write.format("pykafka").mode("append")
                      .option("kafka.bootstrap.servers", self.bootstrap)
                      .option("topic", self.topic))
            for k, v in self.options.items():
                writer = writer.option(k, str(v))
            try:
                writer.save()
                self.jobs += 1
                if not self.failures:
                    self.written = end
            except Exception as exc:  # noqa: BLE001 - a failed write is a finding
                self.failures.append(f"rows {start}..{end}: {short(exc)}")
            self._stop_event.wait(1.0)

    def stop(self, timeout_s: float = 180) -> None:
        self._stop_event.set()
        self.join(timeout_s)
        if self.is_alive():
            self.failures.append(f"a write was still running {timeout_s:.0f} s after the loop "
                                 "was stopped")

    def check(self, figures: Figures, partitions: int) -> None:
        """Every value of every job, in Kafka exactly once (read back with kafka-python)."""
        values = list(read_topic(self.bootstrap, self.topic, partitions).values())
        check_sink_values(figures, "sink", self.attempted, values, complete=not self.failures)
        for failure in self.failures[:3]:
            figures.problem(f"sink write failed: {failure}")
        if len(self.failures) > 3:
            figures.problem(f"... and {len(self.failures) - 3} more sink writes failed")
        if self.jobs == 0:
            figures.problem("no sink write completed")


# --------------------------------------------------------------------------------------------
# One scenario's traffic and checks
# --------------------------------------------------------------------------------------------

class Run:
    """The traffic of one scenario on ``cluster``: a topic of its own with a feed, a stream, a
    batch loop and a sink loop as the scenario asks, all stopped on exit whatever happens.

    ``finish()`` stops the traffic, reads the truth from Kafka, waits until the stream has read
    and committed everything, and counts what each reader lost or duplicated, and the moves
    backwards of the group's commits, into ``figures``; then asserts that all are zero.
    """

    def __init__(self, cluster, spark, figures: Figures, tmp_path, name: str,
                 partitions: int = 3):
        from kafka_source.testing import unique_topic_name

        self.cluster, self.spark, self.figures, self.tmp_path = cluster, spark, figures, tmp_path
        self.bootstrap = cluster.bootstrap_servers
        self.partitions = partitions
        self.topic = unique_topic_name(name)
        self.group = unique_topic_name(f"g-{name}")
        cluster.create_topic(self.topic, partitions)
        self.feed: Feed | None = None
        self.stream: Stream | None = None
        self.watch: CommitWatch | None = None
        self.batches: BatchLoop | None = None
        self.sink: SinkLoop | None = None
        self.sink_partitions = 3
        self.started = time.monotonic()

    def log(self, what: str) -> None:
        """A timestamped line on stdout (shown with a failure, or with -s)."""
        print(f"[{time.monotonic() - self.started:6.1f} s] {self.topic}: {what}", flush=True)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.stop_traffic(quiet=True)
        if self.stream is not None:
            self.stream.stop()
        if self.watch is not None:
            self.watch.stop()

    def start_feed(self, **kwargs) -> Feed:
        self.feed = Feed(self.bootstrap, self.topic, self.partitions, **kwargs)
        self.feed.start()
        return self.feed

    def start_stream(self, trigger: str = "500 milliseconds", transform=None,
                     group_protocol: str = "classic", **options) -> Stream:
        """The stream, into parquet, in a group of ``group_protocol``; ``transform`` (DataFrame
        -> DataFrame, same columns) is applied to its rows on the way. Once it has made its
        first trigger it is a member: the brokers must describe the group as one of that
        protocol (else a consumer-protocol variant would quietly test the classic one)."""
        from kafka_source import describe_group

        self.watch = CommitWatch(self.bootstrap, self.group, self.topic)
        self.watch.start()
        self.stream = Stream(self.spark, stream_options(self.bootstrap, self.topic, self.group,
                                                        group_protocol, **options),
                             self.tmp_path, trigger, transform)
        if group_protocol != "classic":
            status = describe_group(self.bootstrap, self.group)
            assert status.protocol == group_protocol and len(status.members) == 1, status
        return self.stream

    def start_batch_loop(self, **options) -> BatchLoop:
        self.batches = BatchLoop(self.spark, self.bootstrap, self.topic, self.partitions,
                                 **options)
        self.batches.start()
        return self.batches

    def start_sink_loop(self, **options) -> SinkLoop:
        from kafka_source.testing import unique_topic_name

        sink_topic = unique_topic_name(f"{self.topic}-sink")
        self.cluster.create_topic(sink_topic, self.sink_partitions)
        self.sink = SinkLoop(self.spark, self.bootstrap, sink_topic, **options)
        self.sink.start()
        return self.sink

    def wait_until_busy(self, rows: int = 300, timeout_s: float = 120) -> None:
        """Every reader and writer of the scenario has made progress: the fault hits them
        while they work, not before they started."""
        self.log("waiting for traffic")
        if self.stream is not None:
            self.stream.wait_for_rows(rows, timeout_s)
        if self.batches is not None:
            wait_until(lambda: self.batches.reads or self.batches.failures, timeout_s,
                       "a first batch read")
        if self.sink is not None:
            wait_until(lambda: self.sink.jobs or self.sink.failures, timeout_s,
                       "a first sink write")
        self.log("traffic is flowing")

    def stop_traffic(self, quiet: bool = False) -> None:
        for part in (self.feed, self.batches, self.sink):
            if part is None or getattr(part, "_stopped", False):
                continue
            part._stopped = True
            try:
                part.stop()
            except Exception as exc:  # noqa: BLE001
                if not quiet:
                    self.figures.problem(f"stopping {type(part).__name__}: {exc!r}")

    def finish(self) -> None:
        """Stop the traffic, check everything record by record, assert that nothing was lost
        or duplicated and that no commit moved backwards."""
        figures = self.figures
        self.log("stopping the traffic")
        self.stop_traffic()
        try:
            self.log("reading the truth")
            ends = end_offsets(self.bootstrap, self.topic, self.partitions)
            truth = read_topic(self.bootstrap, self.topic, self.partitions, ends)
            self.log(f"{len(truth)} records in Kafka; draining the stream")
            if self.feed is not None:
                self.feed.check(figures)
                check_acknowledged(figures, "feed", self.feed.acked, truth)
            if self.stream is not None:
                rows = None
                try:
                    rows = self.stream.drain(truth, ends, self.watch, self.topic)
                except AssertionError as exc:
                    figures.problem(str(exc))
                failed = self.stream.failure() is not None
                self.log("checking the stream")
                check_reads(figures, "stream", truth,
                            rows if rows is not None else self.stream.rows(),
                            complete=not failed)
            if self.batches is not None:
                self.log(f"checking {len(self.batches.reads)} batch reads")
                self.batches.check(figures, truth)
            if self.sink is not None:
                self.log(f"checking {self.sink.jobs} sink writes")
                self.sink.check(figures, self.sink_partitions)
        finally:
            if self.stream is not None:
                self.stream.stop()
            if self.watch is not None:
                self.watch.stop()
        if self.stream is not None:
            self.log("auditing the commits")
            audit_commits(figures, self.bootstrap, self.group, self.watch)
        self.log(f"done: {figures.problems or 'no problem'}")
        figures.assert_clean()
