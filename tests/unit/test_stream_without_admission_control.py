"""The stream reader as PySpark 4.0 and 4.1 drive it: no admission control for Python sources.

There Spark calls ``latestOffset()`` with no arguments, asks ``initialOffset()`` only after the
first ``latestOffset()``, hands a restarted reader the end of the checkpoint's last batch as
``partitions(end, end)`` before anything else, and runs ``Trigger.AvailableNow`` as one batch.
These call sequences were measured on PySpark 4.0.5 and 4.1.4 (kafka_source/read/stream.py's
module docstring); :class:`Spark40` replays them against a real reader whose cluster and group
member are the fakes of test_stream_planning.py, next to :class:`Spark` (the 4.2+ loop) where the
two must agree. The reader takes the path by how it is called (``latestOffset()`` without a
start), so these tests run on any installed PySpark.
"""

from __future__ import annotations

import logging

import pytest

import kafka_source.read.stream as stream_module
from kafka_source.errors import OptionError

from .test_stream_planning import (T0, T1, Cluster, FakeMember, Spark, make_reader, o,  # noqa: F401
                                   ranges)


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    from .test_stream_planning import Clock

    c = Clock()
    monkeypatch.setattr(stream_module, "_now_ms", c)
    return c


class Spark40:
    """PySpark 4.0/4.1's micro-batch loop as the source sees it (measured call sequences)."""

    def __init__(self, reader, restart_end=None, replay_start=None):
        self.reader = reader
        self.calls: list[str] = []
        self.start = None
        self.batches = 0
        if restart_end is not None:
            # setLatestSeenOffset: the checkpoint's last batch end, before anything else
            assert reader.partitions(restart_end, restart_end) == []
            self.calls.append("P(x,x)")
            if replay_start is not None:            # that batch was not committed: run again
                self.replayed = ranges(reader, replay_start, restart_end)
                self.calls.append("P(replay)")
            self.start = restart_end

    def trigger(self):
        """One trigger: the ranges read, or None when no batch runs."""
        end = self.reader.latestOffset()
        self.calls.append("L()")
        if self.start is None:                     # a new query: initialOffset after latest
            self.start = self.reader.initialOffset()
            self.calls.append("I()")
        if end == self.start:
            return None
        if self.batches > 0:
            self.reader.commit(self.start)         # the previous batch's end, once planned
            self.calls.append("C()")
        read = ranges(self.reader, self.start, end)
        self.calls.append("P()")
        self.start, self.batches = end, self.batches + 1
        return read


def both(partitions, **options):
    """A 4.2+ and a 4.0 reader over the same logs, each with its own cluster and member."""
    out = []
    for _ in range(2):
        cluster = Cluster(partitions)
        member = FakeMember(sorted(partitions))
        out.append((cluster, member, make_reader(cluster, member, startingOffsets="earliest",
                                                 **options)))
    return out


def test_rate_limits_make_the_same_batches_as_with_admission_control():
    (c42, m42, r42), (c40, m40, r40) = both({T0: 100, T1: 7}, maxOffsetsPerTrigger="30")
    new, old = Spark(r42), Spark40(r40)
    seen42, seen40 = [], []
    for step in range(8):
        if step == 3:                                    # more arrives meanwhile
            for c in (c42, c40):
                c.set(T1, 50)
        seen42.append(new.trigger())
        seen40.append(old.trigger())
    assert seen40 == seen42
    assert [r for r in seen40 if r] and sum(e - s for b in seen40 if b for _, _, s, e in b) == 150
    assert old.calls[:3] == ["L()", "I()", "P()"]
    assert r40.initialOffset() == o(t={0: 0, 1: 0})      # asked again: the same start
    # the group follows the batches that completed (each committed at the next trigger)
    assert m40.group == m42.group


def test_min_offsets_and_max_trigger_delay_hold_back_the_same(clock):
    (c42, _, r42), (c40, _, r40) = both({T0: 0}, minOffsetsPerTrigger="10",
                                        maxTriggerDelay="1m")
    new, old = Spark(r42), Spark40(r40)
    script = [(5, 0), (8, 30_000), (15, 0), (16, 59_999), (16, 1)]
    for end, advance in script:
        for c in (c42, c40):
            c.set(T0, end)
        clock.advance(advance)
        a = new.trigger()
        b = old.trigger()
        assert a == b, (end, advance)
    assert new.batches == old.batches == 3


def test_a_restart_continues_from_the_checkpoint_and_commits_it():
    cluster = Cluster({T0: 50, T1: 50})
    member = FakeMember([T0, T1], committed={T0: 10, T1: 10})
    reader = make_reader(cluster, member, **{"kafka.group.id": "g"})
    spark = Spark40(reader, restart_end=o(t={0: 20, 1: 30}))
    assert spark.trigger() == [("t", 0, 20, 50), ("t", 1, 30, 50)]
    assert member.commits[0] == {T0: 20, T1: 30}         # the checkpoint's end: completed
    assert spark.calls == ["P(x,x)", "L()", "P()"]
    cluster.set(T0, 60)
    assert spark.trigger() == [("t", 0, 50, 60)]
    assert member.group == {T0: 50, T1: 50}


def test_a_restart_runs_the_uncommitted_batch_again_first():
    cluster = Cluster({T0: 40})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, **{"kafka.group.id": "g"})
    spark = Spark40(reader, restart_end=o(t={0: 20}), replay_start=o(t={0: 10}))
    assert spark.replayed == [("t", 0, 10, 20)]
    assert member.commits == []                          # nothing committed before it ran
    assert spark.trigger() == [("t", 0, 20, 40)]
    assert member.commits == [{T0: 20}]


def test_the_available_now_wrapper_is_refused_before_anything_is_committed():
    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, startingOffsets="earliest")
    # measured with spark.sql.streaming.triggerAvailableNowWrapper.enabled on a new query:
    # L()=10 I() L()=20 I() P(0,10)
    target = reader.latestOffset()
    start = reader.initialOffset()
    cluster.set(T0, 20)
    reader.latestOffset()
    assert reader.initialOffset() == start
    with pytest.raises(OptionError, match="triggerAvailableNowWrapper.enabled"):
        reader.partitions(start, target)
    assert member.commits == []


def test_one_capped_batch_then_stop_says_what_was_left(caplog):
    cluster = Cluster({T0: 100})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, startingOffsets="earliest", maxOffsetsPerTrigger="30")
    spark = Spark40(reader)
    assert spark.trigger() == [("t", 0, 0, 30)]          # AvailableNow: Spark stops here
    with caplog.at_level(logging.WARNING):
        reader.stop()
    assert "70 record(s) beyond this micro-batch's end offsets" in caplog.text
    assert "'maxOffsetsPerTrigger'" in caplog.text and "Trigger.AvailableNow" in caplog.text


def test_one_whole_batch_then_stop_says_nothing(caplog):
    cluster = Cluster({T0: 100})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, startingOffsets="earliest")
    spark = Spark40(reader)
    assert spark.trigger() == [("t", 0, 0, 100)]
    with caplog.at_level(logging.WARNING):
        reader.stop()
    assert "beyond this micro-batch" not in caplog.text


def test_a_restart_with_admission_control_is_told_its_start_by_spark_as_before():
    # PySpark 4.2+ pass the start to latestOffset(start, limit); a partitions(end, end) first
    # (a restart) plans nothing, and the reader follows the start Spark passes.
    cluster = Cluster({T0: 10})
    member = FakeMember([T0])
    reader = make_reader(cluster, member, **{"kafka.group.id": "g"})
    assert reader.partitions(o(t={0: 5}), o(t={0: 5})) == []
    spark = Spark(reader, start=o(t={0: 5}))
    assert spark.trigger() == [("t", 0, 5, 10)]
    assert member.commits == [{T0: 5}]
