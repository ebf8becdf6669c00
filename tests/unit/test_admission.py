"""Admission control arithmetic (maxOffsetsPerTrigger / minOffsetsPerTrigger), Spark's semantics.

``rate_limit`` shares ``maxOffsetsPerTrigger`` out in proportion to each partition's backlog:
``share = limit * backlog / total_backlog``; a share below one record is rounded *up* to one (a
small partition is never starved), every other share is rounded *down*; no end passes the latest
offset; partitions without backlog keep their latest offset; and when the whole backlog fits
(``total <= limit``) the latest offsets are returned unchanged.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_source.read.admission import backlog, hold_back, rate_limit

pytestmark = pytest.mark.pyspark_free


def tp(p, topic="t"):
    return (topic, p)


def offsets(*values, topic="t"):
    return {tp(i, topic): v for i, v in enumerate(values)}


def taken(start, ends):
    return {k: ends[k] - start[k] for k in start}


# --- backlog -------------------------------------------------------------------------------------

def test_backlog_counts_only_partitions_with_records_waiting():
    start = {tp(0): 10, tp(1): 5, tp(2): 7}
    latest = {tp(0): 15, tp(1): 5, tp(2): 3, tp(3): 100}   # 1 empty, 2 behind, 3 has no start
    assert backlog(start, latest) == {tp(0): 5}


# --- rate_limit: hand-computed examples ----------------------------------------------------------

def test_equal_backlogs_share_the_limit_equally():
    # limit 100 over 4 x 250 (total 1000): each share is 100 * 250/1000 = 25 exactly.
    start = offsets(0, 1000, 5, 0)
    latest = offsets(250, 1250, 255, 250)
    ends = rate_limit(100, start, latest)
    assert taken(start, ends) == {tp(0): 25, tp(1): 25, tp(2): 25, tp(3): 25}


def test_small_partitions_get_one_record_not_zero():
    # Backlogs 1000 / 10 / 1, total 1011, limit 100:
    #   100 * 1000/1011 = 98.91 -> rounded down to 98
    #   100 *   10/1011 =  0.99 -> below one: rounded UP to 1 (not starved)
    #   100 *    1/1011 =  0.10 -> below one: rounded UP to 1
    # 98 + 1 + 1 = 100.
    start = offsets(0, 0, 0)
    latest = offsets(1000, 10, 1)
    assert taken(start, rate_limit(100, start, latest)) == {tp(0): 98, tp(1): 1, tp(2): 1}


def test_shares_above_one_are_rounded_down_so_a_batch_may_take_less_than_the_limit():
    # 3 x 5 (total 15), limit 10: each share is 3.33 -> 3; the batch takes 9, not 10.
    start = offsets(0, 0, 0)
    latest = offsets(5, 5, 5)
    assert taken(start, rate_limit(10, start, latest)) == {tp(0): 3, tp(1): 3, tp(2): 3}


def test_rounding_up_small_shares_may_exceed_the_limit_by_their_count():
    # limit 2 over backlogs 1000 and five partitions of 1 (total 1005):
    #   2 * 1000/1005 = 1.99 -> 1;  2 * 1/1005 = 0.002 -> 1 (five times).
    # 6 records in all: the limit (2) plus at most one per partition whose share was below 1.
    start = offsets(0, 0, 0, 0, 0, 0)
    latest = offsets(1000, 1, 1, 1, 1, 1)
    got = taken(start, rate_limit(2, start, latest))
    assert got == {tp(0): 1, tp(1): 1, tp(2): 1, tp(3): 1, tp(4): 1, tp(5): 1}
    assert sum(got.values()) == 6


def test_uneven_backlogs_across_topics():
    # Backlogs 300 (a-0), 100 (a-1), 50 (b-0): total 450, limit 90:
    #   90 * 300/450 = 60;  90 * 100/450 = 20;  90 * 50/450 = 10.
    start = {("a", 0): 1000, ("a", 1): 0, ("b", 0): 7}
    latest = {("a", 0): 1300, ("a", 1): 100, ("b", 0): 57}
    assert rate_limit(90, start, latest) == {("a", 0): 1060, ("a", 1): 20, ("b", 0): 17}


def test_whole_backlog_within_the_limit_returns_latest():
    start = offsets(0, 10)
    latest = offsets(30, 80)          # total 100
    assert rate_limit(100, start, latest) == latest
    assert rate_limit(1000, start, latest) == latest


def test_partitions_without_backlog_keep_their_latest_offset():
    # Only a-0 has a backlog (200 > limit 50); b-0 is caught up, c-0 went backwards (data loss is
    # reported elsewhere), d-0 has no start: all three keep latest.
    start = {("a", 0): 0, ("b", 0): 40, ("c", 0): 90}
    latest = {("a", 0): 200, ("b", 0): 40, ("c", 0): 60, ("d", 0): 5}
    assert rate_limit(50, start, latest) == {("a", 0): 50, ("b", 0): 40, ("c", 0): 60,
                                              ("d", 0): 5}


def test_no_backlog_at_all_returns_latest():
    start = offsets(5, 6)
    assert rate_limit(1, start, dict(start)) == start


def test_limit_of_one_still_moves_every_partition_with_data():
    start = offsets(0, 0, 0)
    latest = offsets(10, 10, 10)      # shares 1/3 each -> rounded up to 1
    assert taken(start, rate_limit(1, start, latest)) == {tp(0): 1, tp(1): 1, tp(2): 1}


# --- rate_limit: properties ----------------------------------------------------------------------

@st.composite
def positions(draw, min_size=1, max_size=8):
    n = draw(st.integers(min_size, max_size))
    start, latest = {}, {}
    for i in range(n):
        begin = draw(st.integers(0, 10**6))
        start[tp(i)] = begin
        latest[tp(i)] = begin + draw(st.one_of(st.just(0), st.integers(0, 5000)))
    return start, latest


limits = st.integers(1, 10_000)


@settings(max_examples=150, deadline=None)
@given(positions(), limits)
def test_ends_stay_between_start_and_latest(pos, limit):
    start, latest = pos
    ends = rate_limit(limit, start, latest)
    assert ends.keys() == latest.keys()
    for k in latest:
        assert start[k] <= ends[k] <= latest[k]


@settings(max_examples=150, deadline=None)
@given(positions(), limits)
def test_batch_size_is_at_most_the_limit_plus_the_small_shares(pos, limit):
    start, latest = pos
    sizes = backlog(start, latest)
    total = sum(sizes.values())
    got = sum(taken(start, rate_limit(limit, start, latest)).values())
    small = sum(1 for s in sizes.values() if limit * s / total < 1) if total else 0
    assert got <= limit + small
    if total <= limit:
        assert got == total
    else:
        # Rounding down loses less than one record per partition whose share is >= 1.
        assert got > limit - len(sizes)
        # Every partition with a backlog moves.
        ends = rate_limit(limit, start, latest)
        assert all(ends[k] > start[k] for k in sizes)


@settings(max_examples=100, deadline=None)
@given(positions(), limits)
def test_repeated_batches_drain_the_backlog_in_bounded_steps(pos, limit):
    start, latest = pos
    sizes = backlog(start, latest)
    total, n = sum(sizes.values()), len(sizes)
    # Each step over the limit takes > limit - n records (and >= 1), the last takes the rest.
    per_step = max(limit - n + 1, 1)
    bound = math.ceil(max(total - limit, 0) / per_step) + 1
    steps, current = 0, dict(start)
    while current != latest:
        nxt = rate_limit(limit, current, latest)
        assert sum(nxt.values()) > sum(current.values())   # progress every step
        current, steps = nxt, steps + 1
        assert steps <= bound
    assert steps <= bound


@settings(max_examples=100, deadline=None)
@given(positions(min_size=2), limits)
def test_bigger_backlog_never_gets_a_smaller_share(pos, limit):
    start, latest = pos
    sizes = backlog(start, latest)
    got = taken(start, rate_limit(limit, start, latest))
    for a in sizes:
        for b in sizes:
            if sizes[a] >= sizes[b]:
                assert got[a] >= got[b]


# --- hold_back (minOffsetsPerTrigger / maxTriggerDelay) ------------------------------------------

def test_hold_back_while_backlog_below_minimum_and_delay_not_reached():
    start, latest = offsets(0, 0), offsets(3, 4)      # 7 waiting
    assert hold_back(10, start, latest, now_ms=5_000, last_batch_ms=0, max_delay_ms=60_000)


def test_no_hold_back_once_minimum_reached():
    start, latest = offsets(0, 0), offsets(6, 4)      # exactly 10 waiting
    assert not hold_back(10, start, latest, now_ms=5_000, last_batch_ms=0, max_delay_ms=60_000)


@pytest.mark.parametrize("elapsed, held", [(59_999, True), (60_000, False), (3_600_000, False)])
def test_max_trigger_delay_releases_a_small_batch(elapsed, held):
    start, latest = offsets(0), offsets(1)
    assert hold_back(10, start, latest, now_ms=1_000 + elapsed, last_batch_ms=1_000,
                     max_delay_ms=60_000) is held


def test_hold_back_ignores_partitions_behind_or_without_start():
    # c-0 went backwards (-50) and d-0 has no start: neither counts, so 5 waiting < 10.
    start = {("a", 0): 0, ("c", 0): 100}
    latest = {("a", 0): 5, ("c", 0): 50, ("d", 0): 1000}
    assert hold_back(10, start, latest, now_ms=0, last_batch_ms=0, max_delay_ms=100)
    assert not hold_back(5, start, latest, now_ms=0, last_batch_ms=0, max_delay_ms=100)


def test_zero_delay_never_holds_back():
    assert not hold_back(10**9, offsets(0), offsets(0), now_ms=0, last_batch_ms=0,
                         max_delay_ms=0)
