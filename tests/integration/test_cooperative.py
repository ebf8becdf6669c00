"""The sticky assignors with Kafka's own Java consumer in the query's group
(:mod:`kafka_source.group.sticky`): a group of Java consumers whose only assignor is
``cooperative-sticky`` -- the second of the Java consumer's defaults, and the only one in many
deployments -- takes a query that offers it, and the two split the partitions with nothing read
twice or lost."""

from __future__ import annotations

import threading
import time

import pytest

from kafka_source.testing import create_topic, unique_topic_name
from kafka_source.testing.progress import source_offsets
from kafka_source.wire.net.client import RetriableBrokerError

from .java_consumer import JavaConsumer, kafka_home
from .test_stream import (describe_group, expected_rows, produce_counts, sink_rows,
                          start_stream, stream_options, wait_until)


def group_now(bootstrap, group):
    """(state, members), or ("", {}) while the coordinator is not there yet (a new broker
    creates the offsets topic on the first FindCoordinator)."""
    try:
        return describe_group(bootstrap, group)
    except RetriableBrokerError:
        return "", {}


def end_offsets_of(progress: dict, topic: str) -> dict:
    """The end offsets of ``topic`` in a query progress report, by partition (as strings)."""
    return source_offsets(progress["sources"][0]["endOffset"])[topic]


@pytest.mark.once      # a JVM consumer and two rebalances: about half a minute
@pytest.mark.parametrize("assignor", ["cooperative-sticky", "sticky"])
def test_a_query_shares_a_group_with_java_consumers_on_a_sticky_assignor(
        spark, bootstrap_servers, kafka_broker, tmp_path, assignor):
    kafka_home()
    timeouts = (2_000, 400) if kafka_broker.is_tansu else (6_000, 1_000)
    topic = unique_topic_name(f"share-{assignor}")
    create_topic(bootstrap_servers, topic, partitions=4)
    group = unique_topic_name("g-sticky")
    java = JavaConsumer(bootstrap_servers, topic, group, assignors=[assignor],
                        session_timeout_ms=timeouts[0])
    query = None
    try:
        wait_until(lambda: (lambda s, m: s == "Stable" and len(m) == 1 and all(m.values()))(
            *group_now(bootstrap_servers, group)), 90,
            f"the Java consumer alone in the group ({java.stderr()})")
        query = start_stream(spark, stream_options(
            bootstrap_servers, topic, timeouts,
            **{"kafka.group.id": group, "assignor": assignor, "startingOffsets": "earliest"}),
            str(tmp_path / "ck"), str(tmp_path / "out"))
        # Two members, two partitions each (cooperative-sticky may take two rebalances).
        state, members = wait_until(
            lambda: (lambda s, m: (s, m) if s == "Stable" and len(m) == 2
                     and sorted(len(ps) for ps in m.values()) == [2, 2] else None)(
                *group_now(bootstrap_servers, group)),
            90, "a stable group of the query and the Java consumer, two partitions each")
        java_id = next(m for m in members if m.startswith("java-consumer"))
        java_parts = sorted(p for _, p in members[java_id])

        counts = {p: 10 for p in range(4)}
        produce_counts(bootstrap_servers, topic, counts)
        out = str(tmp_path / "out")
        wait_until(lambda: len(java.values()) + len(sink_rows(spark, out)) >= 40, 90,
                   "all 40 records read by the two members")
        query_rows = sink_rows(spark, out)
        java_rows = [(int(v[1:v.index("-")]), int(v[v.index("-") + 1:]), v)
                     for v in java.values()]
        assert sorted({p for p, _, _ in java_rows}) == java_parts
        assert sorted({p for p, _, _ in query_rows}) == \
            sorted(set(range(4)) - set(java_parts))
        assert sorted(query_rows + java_rows) == expected_rows(counts)     # once each
    finally:
        if query is not None:
            query.stop()
        java.close()


@pytest.mark.once      # a held rebalance of about 8 s, and the group settling around it
@pytest.mark.skip_on_embedded("the embedded Tansu broker does not hold JoinGroup open for a "
                              "member that has not rejoined yet")
def test_a_query_reads_on_while_a_cooperative_rebalance_waits_for_another_member(
        spark, bootstrap_servers, tmp_path):
    """A rebalance lasts until the group's slowest member rejoins. A cooperative query keeps
    its partitions through it, so it must keep running micro-batches meanwhile -- before its
    rejoin ran in the background, its planning call waited in JoinGroup for as long as the
    rebalance lasted -- and give up only partitions whose processed offsets it committed."""
    from kafka_source.config.options import parse_stream_options
    from kafka_source.group.member import GroupMember
    from kafka_source.group.sticky import CooperativeStickyAssignor
    from kafka_source.wire.net.client import BrokerClient

    from .test_stream import committed

    topic = unique_topic_name("coop-held")
    create_topic(bootstrap_servers, topic, partitions=4)
    # A backlog of 200 per partition, then a trickle (5 records a second to each partition)
    # until M and N leave: whatever the machine's speed, the partitions the query owns have
    # new records in every micro-batch of the held rebalance, and the query has little left to
    # read once it owns everything again (a 6,000-record backlog took 120 batches, 70 s, here).
    counts = {p: 200 for p in range(4)}
    produce_counts(bootstrap_servers, topic, counts)
    trickling = threading.Event()
    trickle_failed: list[BaseException] = []

    def trickle():
        try:
            while not trickling.wait(1.0):
                produce_counts(bootstrap_servers, topic, {p: 5 for p in counts},
                               start=dict(counts))
                for p in counts:
                    counts[p] += 5
        except BaseException as exc:      # said by the test, not lost with the thread
            trickle_failed.append(exc)

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    group = unique_topic_name("g-coop-held")
    out = str(tmp_path / "out")
    query = start_stream(spark, stream_options(
        bootstrap_servers, topic, (6_000, 1_000),
        **{"kafka.group.id": group, "assignor": "cooperative-sticky",
           "startingOffsets": "earliest", "maxOffsetsPerTrigger": 40}),
        str(tmp_path / "ck"), out, trigger="200 milliseconds")

    # Two members of the test's own on cooperative-sticky, joining and rejoining only when
    # told (neither reads anything); M may take up to 60 s to rejoin a rebalance.
    def member(name):
        options = parse_stream_options({
            "kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic,
            "kafka.group.id": group, "assignor": "cooperative-sticky",
            "kafka.client.id": name, "kafka.session.timeout.ms": "30000",
            "kafka.heartbeat.interval.ms": "1000", "kafka.max.poll.interval.ms": "60000"})
        config = options.source.client_config
        return GroupMember(BrokerClient(config), lambda: BrokerClient(config), options.group,
                           CooperativeStickyAssignor())

    backwards = []
    watching = threading.Event()

    def watch_commits():
        last: dict[int, int] = {}
        while not watching.is_set():
            try:
                now = committed(bootstrap_servers, group, topic)
            except Exception:
                now = {}
            backwards.extend((p, last[p], o) for p, o in now.items() if o < last.get(p, -1))
            last.update(now)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch_commits, daemon=True)
    m = n = None
    try:
        wait_until(lambda: query.lastProgress and query.lastProgress["batchId"] >= 2, 120,
                   "the query's first micro-batches")
        watcher.start()
        m = member("held-m")
        wait_until(lambda: len(m.ensure_active([topic])) == 2, 60, "M with two partitions")
        _, members = wait_until(lambda: (lambda s, ms: (s, ms) if s == "Stable" and all(
            len(ps) == 2 for ps in ms.values()) and len(ms) == 2 else None)(
                *group_now(bootstrap_servers, group)), 60, "a stable group of two")
        kept = {p for mid, ps in members.items() if mid != m.generation.member_id
                for _, p in ps}
        assert len(kept) == 2

        # M stops hearing of rebalances; a third member joins: the group waits for M.
        m._stop_heartbeat()
        n = member("held-n")
        n_joining = threading.Thread(target=lambda: n.ensure_active([topic]), daemon=True)
        n_joining.start()
        wait_until(lambda: group_now(bootstrap_servers, group)[0] == "PreparingRebalance", 30,
                   "the rebalance to start")
        time.sleep(1.5)                   # the query's heartbeat hears of it
        first = query.lastProgress
        time.sleep(8)
        last = query.lastProgress
        assert not trickle_failed, f"the trickle producer failed: {trickle_failed[0]!r}"
        assert group_now(bootstrap_servers, group)[0] == "PreparingRebalance", \
            "the rebalance was not held for the whole window"
        batches = last["batchId"] - first["batchId"]
        source_start, source_end = end_offsets_of(first, topic), end_offsets_of(last, topic)
        moved = {int(p) for p in kept if source_end.get(str(p), -1) > source_start.get(str(p), -1)}
        assert batches >= 3 and moved == kept, (batches, source_start, source_end)

        # M rejoins; the group settles on three members (one of the four partitions moves to
        # N). What the query keeps of `kept` was in every micro-batch since the rebalance began
        # (each one's end offsets name the partitions the query owned when planning it).
        m.request_rejoin("the test lets M rejoin")

        def settled():
            # M and N take part as their planning threads would: once per "trigger".
            m.ensure_active([topic])
            if not n_joining.is_alive():
                n.ensure_active([topic])
            state, ms = group_now(bootstrap_servers, group)
            return (state, ms) if state == "Stable" and len(ms) == 3 and sum(
                len(ps) for ps in ms.values()) == 4 else None

        _, members = wait_until(settled, 60, "a stable group of three")
        stays = kept & {p for mid, ps in members.items()
                        if mid not in (m.generation.member_id, n.generation.member_id)
                        for _, p in ps}
        assert stays, members
        for progress in query.recentProgress:
            if progress["batchId"] >= first["batchId"]:
                assert stays <= {int(p) for p in end_offsets_of(progress, topic)}, \
                    progress["batchId"]
        # M and N leave without reading: the query takes every partition back, from where the
        # group's commits say, and reads every record exactly once.
        trickling.set()
        trickler.join(timeout=60)
        assert not trickler.is_alive(), "the trickle did not stop"
        assert not trickle_failed, f"the trickle producer failed: {trickle_failed[0]!r}"
        m.close()
        n.close()
        m = n = None
        wait_until(lambda: len(sink_rows(spark, out)) >= sum(counts.values()), 180,
                   "every record in the query's sink")
        rows = sink_rows(spark, out)
        assert sorted(rows) == expected_rows(counts)          # none lost, none twice
        assert backwards == []
    finally:
        watching.set()
        trickling.set()
        for x in (m, n):
            if x is not None:
                x.close()
        query.stop()
