"""How long each member of a group of one query and two Java consumers reads nothing while the
query restarts and while a Java member joins, with each of the connector's ways of sharing a
group (issue 19): the goal is no pause for a member whose partitions do not move.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/rebalance_pause.py
    ... --modes eager,cooperative,static,consumer --runs 2 --json /tmp/pause.json

``--java-members 1`` measures a group of the query and one Java consumer instead (the joining
one), as the figures before 2026-11-26 evening were.

Modes (the query's options; Kafka's Java console consumer gets the matching settings):

* ``eager``: ``assignor`` ``range`` (Java's RangeAssignor), the classic eager protocol: every
  rebalance takes every partition from every member first.
* ``cooperative``: ``cooperative-sticky`` on both (KIP-429): only moving partitions stop.
* ``static``: ``range`` with ``kafka.group.instance.id`` on the query and ``group.instance.id``
  on the Java consumer (KIP-345). The query's session is 30 s (its restart fits in it); the
  Java member's stays 6 s, since a static member that stops does not leave the group: the
  group waits out its session before the query gets its partitions (the leave phase).
* ``consumer``: the consumer group protocol (KIP-848) on both: ``kafka.group.protocol=consumer``
  and ``group.protocol=consumer``. The brokers assign (their default ``uniform`` assignor) and
  keep the sessions with their defaults (heartbeats every 5 s, sessions of 45 s): neither
  member may set a session timeout, a heartbeat interval or an assignor.

Per run and mode, on one Kafka 4.0 broker (``KAFKA_HOME`` or ``../shared/kafka``), ``local[2]``:

1. A topic of 4 partitions; a producer thread writes one record to each partition every 50 ms
   (values ``p{partition}-{n}``) for the whole run.
2. A pykafka query (``processingTime`` 200 ms, parquet sink) joins the group alone and reads
   all four partitions; the next phase waits until it has completed two micro-batches. The
   first micro-batch of a Spark session starts its Python workers and took 9-22 s on a machine
   of 2 cores (later ones well under 1 s). A Java member joining meanwhile waits in JoinGroup
   until the query's next trigger: the query rejoins between micro-batches, once it has
   committed what it processed, as Java's consumer rejoins in ``poll()``. Without this wait the
   first run of a session measured that cold batch as the join's pause (8.8-18.8 s, in
   whichever mode ran first; about 1 s in every later run).
3. **Join**: the first Java console consumer joins and the group settles on two partitions
   each (not measured); then the second one joins -- measured -- and the group settles on
   three members: two partitions for one of them, one for each of the others.
4. **Restart**: the query is stopped (``query.stop()``) and started again at once from the same
   checkpoint, the Java consumers reading on; the group settles on three members again.
5. **Leave**: the Java consumers stop (Ctrl-C: each commits, and leaves unless static) and the
   query takes all four back.

Measured, from the query's progress reports (the end offset of every partition after every
micro-batch), the times at which the Java consumer's lines arrive (read from its output every
20 ms), the group as the brokers describe it (every 200 ms through the restart) and a watcher
that reads the group's committed offsets every 100 ms:

* at the join: the **pause of kept partitions** (the longest time a partition the query kept
  went without its end offset moving; records arrive every 50 ms, so a steady query moves it
  every trigger), the same for the Java member already in the group (the partitions it had
  before and after, from the records it printed), the longest **gap between micro-batches**,
  and the time until the group settled; and, from the group's states sampled every 50 ms, the
  **rebalance** itself (from the first state other than ``Stable`` to ``Stable`` again) and the
  kept partitions' longest pause inside it -- the window above also holds the Java consumer's
  JVM start, which loads a small machine before the member even joins;
* at the restart: the **query's gap** (from ``query.stop()`` to the end of the restarted
  query's first micro-batch), the longest pause of the partitions it had before and after
  (none when they all moved), the **Java members' gap** (the longest time one of the partitions
  a Java member had before and after went without a new record printed, from the stop until the
  group has been settled for the ``--settle`` time; compare their steady gap before the stop),
  and **whether a Java member's assignment changed** (every assignment the brokers reported for
  each and the group's states: a static restart should show one assignment each and ``Stable``
  only);
* the longest gap between micro-batches at the leave and when nothing changes;
* **records checked, lost, read twice by the query, read by both members** (a handover between
  the two members is at-least-once on the Java side: its auto-commit runs every 200 ms; and a
  query restarted from its checkpoint reads from the checkpoint, so what the Java member read of
  the query's partitions while it was away is read again, by design), and
  **committed offsets that moved backwards** (must be 0).

The figures are measurements, printed as a table (median and range over the runs); the script
fails only when a record is lost, the query reads one twice, or a committed offset moves
backwards. The machine's load matters: Spark, the broker and the JVM consumer share its cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(1, str(HERE))

from queryproc import default_kafka_home  # noqa: E402

PARTITIONS = 4
PRODUCE_EVERY_S = 0.05
TRIGGER = "200 milliseconds"
SESSION_MS, HEARTBEAT_MS = 6_000, 1_000
STATIC_SESSION_MS = 30_000      # the static query's: its restart must fit in it


def _progress_points(query):
    """[(epoch seconds at the batch's end, {partition: end offset})] of every micro-batch."""
    from datetime import datetime

    from kafka_source.testing.progress import source_offsets

    points = []
    for p in query.recentProgress:
        if not p.get("sources"):
            continue
        end = source_offsets(p["sources"][0].get("endOffset"))
        offsets = {int(k): int(v) for t in end.values() for k, v in t.items()}
        ts = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        took = p.get("durationMs", {}).get("triggerExecution", 0) / 1000
        points.append((ts + took, offsets))
    return points


def _first_batch_s(query):
    """How long the query's first micro-batch took (Spark's triggerExecution), in seconds."""
    for p in query.recentProgress:
        if p.get("sources"):
            return round(p.get("durationMs", {}).get("triggerExecution", 0) / 1000, 2)
    return None


def _stall(points, partitions, start, end):
    """The longest time in [start, end] that any of ``partitions`` went without its end offset
    moving, from the batches' end times."""
    worst = 0.0
    for part in partitions:
        last_move, last = start, None
        for ts, offsets in points:
            if part not in offsets:
                continue
            if last is not None and offsets[part] > last:
                if ts >= start:
                    worst = max(worst, min(ts, end) - max(last_move, start))
                last_move = ts
            last = offsets[part]
        if last_move < end:
            worst = max(worst, end - max(last_move, start))
    return worst


def _gap(points, start, end):
    """The longest time between two micro-batches' ends within [start, end]."""
    times = [start] + [ts for ts, _ in points if start <= ts <= end] + [end]
    return max(b - a for a, b in zip(times, times[1:]))


class _Producer(threading.Thread):
    def __init__(self, bootstrap, topic):
        super().__init__(daemon=True)
        from kafka import KafkaProducer

        self.topic = topic
        self.sent = {p: 0 for p in range(PARTITIONS)}
        self.stop_event = threading.Event()
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)

    def run(self):
        while not self.stop_event.is_set():
            for p in range(PARTITIONS):
                n = self.sent[p]
                self.producer.send(self.topic, key=f"k{p}".encode(), value=f"p{p}-{n}".encode(),
                                   partition=p)
                self.sent[p] = n + 1
            self.producer.flush(30)
            time.sleep(PRODUCE_EVERY_S)

    def stop(self):
        self.stop_event.set()
        self.join(30)
        self.producer.close(10)


def _group(bootstrap, group):
    """(state, {member id: (client id, instance id, sorted partitions)}) as the brokers describe
    the group (DescribeGroups, or ConsumerGroupDescribe for a group of the consumer protocol);
    ("", {}) while the coordinator cannot answer."""
    from kafka_source import describe_group
    from kafka_source.wire.net.client import RetriableBrokerError

    try:
        status = describe_group(bootstrap, group)
    except (RetriableBrokerError, OSError):
        return "", {}
    return status.state, {m.member_id: (m.client_id, m.instance_id,
                                        sorted(p for _, p in m.partitions))
                          for m in status.members}


def _is_java(member):
    return member[0].startswith("java-consumer")


def _java_name(n):
    """The client id of the ``n``-th Java member (1, 2, ...)."""
    return f"java-consumer-{n}"


def _alone(bootstrap, group):
    state, members = _group(bootstrap, group)
    return state == "Stable" and len(members) == 1 and \
        next(iter(members.values()))[2] == list(range(PARTITIONS))


def _split(bootstrap, group, java_members):
    """{client id: partitions} when the group is stable with the query and ``java_members``
    Java members, every member holding a balanced share of the partitions (none empty)."""
    state, members = _group(bootstrap, group)
    sizes = [len(m[2]) for m in members.values()]
    if state == "Stable" and len(members) == java_members + 1 and sum(sizes) == PARTITIONS \
            and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1 and \
            sum(map(_is_java, members.values())) == java_members:
        return {("query" if not _is_java(m) else m[0]): m[2] for m in members.values()}
    return None


class _GroupSampler(threading.Thread):
    """Describes the group every 200 ms: the states it went through and every assignment each
    Java member had."""

    def __init__(self, bootstrap, group, interval_s=0.2):
        super().__init__(daemon=True)
        self.bootstrap, self.group, self.interval_s = bootstrap, group, interval_s
        self.states: list[str] = []
        self.changes: list[tuple[float, str]] = []   # (time, state) at each change
        self.java: dict[str, list] = {}      # each Java member's partitions, each change
        self.stop_event = threading.Event()

    def run(self):
        while not self.stop_event.is_set():
            state, members = _group(self.bootstrap, self.group)
            if state and (not self.states or self.states[-1] != state):
                self.states.append(state)
                self.changes.append((time.time(), state))
            if state:
                for client, _, parts in (m for m in members.values() if _is_java(m)):
                    seen = self.java.setdefault(client, [])
                    if not seen or seen[-1] != parts:
                        seen.append(parts)
            self.stop_event.wait(self.interval_s)

    def rebalance_window(self):
        """(first time seen rebalancing, first time seen Stable after it), or None."""
        start = next((ts for ts, st in self.changes if st != "Stable"), None)
        if start is None:
            return None
        end = next((ts for ts, st in self.changes if ts > start and st == "Stable"), None)
        return None if end is None else (start, end)

    def stop(self):
        self.stop_event.set()
        self.join(30)


def _java_gap(arrivals, partitions, start, end):
    """The longest time in [start, end] that any of ``partitions`` went without the Java consumer
    printing a new record of it (its values are ``p{partition}-{n}``)."""
    worst = 0.0
    for part in partitions:
        prefix = f"p{part}-"
        times = [start] + [ts for ts, v in arrivals
                           if start <= ts <= end and v.startswith(prefix)] + [end]
        worst = max(worst, max(b - a for a, b in zip(times, times[1:])))
    return worst


def _wait(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")


MODES = ("eager", "cooperative", "static", "consumer")


def _mode_settings(mode, bootstrap, topic, group):
    """(the query's options, the Java consumers' keyword arguments) of a mode."""
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "kafka.group.id": group,
               "startingOffsets": "earliest",
               "kafka.max.poll.interval.ms": str(4 * SESSION_MS)}
    java = {"session_timeout_ms": SESSION_MS}
    if mode == "consumer":
        # KIP-848: the brokers assign and keep the sessions (their defaults: heartbeats every
        # 5 s, sessions of 45 s); neither member may set them or name an assignor.
        options["kafka.group.protocol"] = "consumer"
        java["group.protocol"] = "consumer"
        return options, java
    assignor = "cooperative-sticky" if mode == "cooperative" else "range"
    options.update({"assignor": assignor, "kafka.session.timeout.ms": str(SESSION_MS),
                    "kafka.heartbeat.interval.ms": str(HEARTBEAT_MS)})
    java["assignors"] = [assignor]
    if mode == "static":
        # KIP-345: the query's restart must fit in its session; the Java member's session stays
        # short, since a static member that stops does not leave: the group waits that long.
        options["kafka.group.instance.id"] = "pause-query"
        options["kafka.session.timeout.ms"] = str(STATIC_SESSION_MS)
        java["group.instance.id"] = "pause-java"     # + the member's number
    return options, java


def _start_query(spark, options, work):
    reader = spark.readStream.format("pykafka")
    for k, v in options.items():
        reader = reader.option(k, v)
    return (reader.load().selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
            .writeStream.format("parquet").option("path", os.path.join(work, "out"))
            .option("checkpointLocation", os.path.join(work, "ck"))
            .trigger(processingTime=TRIGGER).start())


def _java_member(bootstrap, topic, group, n, settings):
    """The ``n``-th Java console consumer of the run, with the mode's ``settings``."""
    from tests.integration.java_consumer import JavaConsumer

    settings = dict(settings)
    if "group.instance.id" in settings:
        settings["group.instance.id"] += f"-{n}"
    return JavaConsumer(bootstrap, topic, group, track_arrivals=True, client_id=_java_name(n),
                        **settings)


def one_run(spark, bootstrap, mode, settle_s, java_members=2):
    from kafka_source.testing import create_topic, unique_topic_name
    from tests.cluster.scenario import CommitWatch

    topic = unique_topic_name(f"pause-{mode}")
    group = unique_topic_name("g-pause")
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    work = tempfile.mkdtemp(prefix="pykafka-pause-")
    out = os.path.join(work, "out")
    producer = _Producer(bootstrap, topic)
    watcher = CommitWatch(bootstrap, group, topic, interval_s=0.1)
    sampler = _GroupSampler(bootstrap, group)
    producer.start()
    options, java_settings = _mode_settings(mode, bootstrap, topic, group)
    query = _start_query(spark, options, work)
    points = []
    javas = {}                      # client id -> JavaConsumer
    try:
        _wait(lambda: _alone(bootstrap, group), 90, "the query alone with all four partitions")
        # Past the query's cold start (step 2 of the module docstring): a join during its first
        # micro-batch would measure that batch, not the rebalance.
        _wait(lambda: len(_progress_points(query)) >= 2, 180,
              "the query's first two micro-batches")
        first_batch_s = _first_batch_s(query)
        watcher.start()
        # The Java members already there when the measured one joins (not measured).
        for n in range(1, java_members):
            javas[_java_name(n)] = _java_member(bootstrap, topic, group, n, java_settings)
            _wait(lambda: _split(bootstrap, group, len(javas)), 120,
                  f"the query and {len(javas)} Java member(s), balanced")
        time.sleep(settle_s)
        before_join = _split(bootstrap, group, len(javas))

        # (b) A Java member joins. Its JVM's start loads the machine before it joins, so the
        # group is watched closely too: the rebalance itself is the window its states show.
        joining = _GroupSampler(bootstrap, group, interval_s=0.05)
        joining.start()
        t_join = time.time()
        javas[_java_name(java_members)] = _java_member(bootstrap, topic, group, java_members,
                                                       java_settings)
        members = _wait(lambda: _split(bootstrap, group, java_members), 120,
                        f"the query and {java_members} Java members, balanced")
        t_split = time.time()
        joining.stop()
        window = joining.rebalance_window() or (t_join, t_split)
        kept = members["query"]
        # What the Java members already there kept through the join, each.
        java_kept_at_join = {c: sorted(set(ps) & set(members[c]))
                             for c, ps in (before_join or {}).items() if c != "query"}
        java_before = {c: ps for c, ps in members.items() if c != "query"}
        time.sleep(settle_s)

        # (a) The query restarts from its checkpoint while the Java members read on.
        sampler.start()
        t_stop = time.time()
        points += _progress_points(query)
        query.stop()
        t_stopped = time.time()
        query = _start_query(spark, options, work)
        t_started = time.time()
        first = _wait(lambda: next((ts for ts, _ in _progress_points(query)), None), 120,
                      "the restarted query's first micro-batch")
        members = _wait(lambda: _split(bootstrap, group, java_members), 120,
                        "the query and the Java members, balanced, after the restart")
        t_resplit = time.time()
        time.sleep(settle_s)
        sampler.stop()
        java_after = {c: ps for c, ps in members.items() if c != "query"}
        query_after = members["query"]
        t_restarted = time.time()

        t_leave = time.time()
        for java in javas.values():
            java.process.terminate()      # as Ctrl-C: it commits and leaves the group
        for java in javas.values():
            java.process.wait(30)
        time.sleep(0.1)
        # everything each printed, now that it has stopped
        arrivals = {c: java.arrivals() for c, java in javas.items()}
        java_values = [v for java in javas.values() for v in java.values()]
        for java in javas.values():
            java.close()
        javas = {}
        _wait(lambda: _alone(bootstrap, group), 120, "the query alone again with all four")
        t_back = time.time()
        time.sleep(settle_s)
        producer.stop()
        sent = dict(producer.sent)
        total = sum(sent.values())

        def read_by_query():
            try:
                return [r.value for r in spark.read.parquet(out).select("value").collect()]
            except Exception:  # noqa: BLE001 - nothing written yet
                return []

        query_values = _wait(lambda: (lambda v: v if len(set(v) | set(java_values)) >= total
                                      else None)(read_by_query()), 120,
                             f"all {total} records read by the members")
        time.sleep(1)                           # anything read twice would show up by now
        query_values = read_by_query()
        points += _progress_points(query)
    finally:
        for java in javas.values():
            java.close()
        producer.stop_event.set()
        query.stop()
        watcher.stop()
        sampler.stop_event.set()

    def java_gap(partitions_of, start, end):
        """The longest gap of any Java member on its partitions in ``partitions_of``."""
        gaps = [_java_gap(arrivals[c], ps, start, end) for c, ps in partitions_of.items() if ps]
        return round(max(gaps), 2) if gaps else None

    java_kept_at_restart = {c: sorted(set(java_before[c]) & set(java_after.get(c, ())))
                            for c in java_before}
    expected = {f"p{p}-{n}" for p, c in sent.items() for n in range(c)}
    got = set(query_values) | set(java_values)
    return {
        "mode": mode,
        "java_members": java_members,
        "records": total,
        "lost": len(expected - got),
        "read_twice_by_query": len(query_values) - len(set(query_values)),
        "read_by_both": len(set(query_values) & set(java_values)),
        "java_read_twice": len(java_values) - len(set(java_values)),
        "committed_backwards": len(watcher.backwards),
        "commit_reads": watcher.polls,
        "kept_partitions": kept,
        "first_batch_s": first_batch_s,
        "join_to_split_s": round(t_split - t_join, 2),
        "kept_pause_at_join_s": round(_stall(points, kept, t_join, t_split + 1.0), 2),
        "rebalance_at_join_s": round(window[1] - window[0], 2),
        "kept_pause_in_rebalance_s": round(_stall(points, kept, *window), 2),
        # the Java member(s) already in the group: the longest pause of what they kept
        "java_kept_at_join": java_kept_at_join,
        "java_kept_pause_at_join_s": java_gap(java_kept_at_join, t_join, t_split + 1.0),
        "java_kept_pause_in_rebalance_s": java_gap(java_kept_at_join, *window),
        "batch_gap_at_join_s": round(_gap(points, t_join, t_split + 1.0), 2),
        "java_gap_steady_s": java_gap(java_before, t_split + 1.0, t_stop),
        "stop_s": round(t_stopped - t_stop, 2),
        "start_s": round(t_started - t_stopped, 2),
        "query_gap_at_restart_s": round(first - t_stop, 2),
        "restart_to_split_s": round(t_resplit - t_stop, 2),
        # the partitions each Java member had before and after
        "java_gap_at_restart_s": java_gap(java_kept_at_restart, t_stop, t_restarted),
        # the partitions the query had before and after: how long the longest of them waited
        "query_kept_pause_at_restart_s": round(_stall(
            points, sorted(set(kept) & set(query_after)), t_stop, t_restarted), 2)
        if set(kept) & set(query_after) else None,
        "java_partitions": [java_before, java_after],
        "query_partitions": [kept, query_after],
        "java_assignments_at_restart": sampler.java,
        "java_moved_at_restart": int(any(len(seen) > 1 for seen in sampler.java.values())
                                     or java_after != java_before),
        "group_states_at_restart": sampler.states,
        "batch_gap_at_leave_s": round(_gap(points, t_leave, t_back + 1.0), 2),
        "batch_gap_steady_s": round(_gap(points, t_back + 1.0, t_back + settle_s), 2),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated, of " + ", ".join(MODES) + " (default: all)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between the phases")
    ap.add_argument("--java-members", type=int, default=2,
                    help="Java consumers in the group with the query (default 2; the last to "
                         "join is the measured join)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}: choose among {', '.join(MODES)}")
    if args.java_members < 1:
        ap.error(f"--java-members must be 1 or more, not {args.java_members}")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p]))
    default_kafka_home()
    from pyspark.sql import SparkSession

    import kafka_source
    from kafka_source.testing import LocalKafkaBroker

    results = []
    with LocalKafkaBroker(os.environ["KAFKA_HOME"]) as broker:
        spark = (SparkSession.builder.master("local[2]").appName("pykafka-rebalance-pause")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        kafka_source.register(spark)
        try:
            for run in range(args.runs):
                for mode in modes:
                    r = one_run(spark, broker.bootstrap_servers, mode, args.settle,
                                args.java_members)
                    r["run"] = run + 1
                    print(json.dumps(r), flush=True)
                    results.append(r)
        finally:
            spark.stop()
    counts = ["records", "lost", "read_twice_by_query", "read_by_both", "committed_backwards",
              "java_moved_at_restart"]
    times = ["kept_pause_at_join_s", "rebalance_at_join_s", "kept_pause_in_rebalance_s",
             "java_kept_pause_at_join_s", "java_kept_pause_in_rebalance_s",
             "batch_gap_at_join_s", "join_to_split_s",
             "query_gap_at_restart_s", "query_kept_pause_at_restart_s", "java_gap_at_restart_s",
             "java_gap_steady_s", "batch_gap_at_leave_s", "batch_gap_steady_s"]
    cols = counts + times
    print("\n| mode | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for mode in modes:
        rows = [r for r in results if r["mode"] == mode]
        cells = []
        for c in cols:
            values = [r[c] for r in rows if r[c] is not None]
            if not values:
                cells.append("-")
            elif c.endswith("_s"):
                cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
            else:
                cells.append(str(sum(values)))
        print(f"| {mode} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    bad = [r for r in results if r["lost"] or r["read_twice_by_query"] or r["committed_backwards"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
