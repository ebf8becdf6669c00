"""benchmarks/scale.py's arithmetic: how the trigger's growth with partitions is taken."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pyspark_free

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scale  # noqa: E402


def _row(reader, partitions, round_no, p50, point=None):
    return {"point": point or f"1 topic, {partitions} partitions", "partitions": partitions,
            "reader": reader, "round": round_no, "triggers": 20, "triggerExecution_p50": p50}


def test_growth_is_the_largest_point_over_the_smallest_within_each_round():
    rows = [_row("pykafka", 100, 1, 300), _row("pykafka", 10000, 1, 420),
            _row("floor", 100, 1, 250), _row("floor", 10000, 1, 300),
            _row("pykafka", 10000, 2, 400), _row("pykafka", 100, 2, 200),
            _row("pykafka", 1000, 2, 390),
            # a pattern point is not a single-topic point, even with more partitions
            _row("pykafka", 4000, 2, 999, point="subscribePattern, 1000 topics x 4 partitions"),
            _row("pykafka", 100, 3, 250), _row("pykafka", 10000, 3, 375)]
    growth = scale.growth_by_round(rows)
    assert growth["pykafka"] == {"ratios": [1.4, 2.0, 1.5], "median": 1.5}
    assert growth["floor"] == {"ratios": [1.2], "median": 1.2}


def test_a_round_without_both_ends_or_a_finished_query_is_left_out():
    rows = [_row("pykafka", 100, 1, 300), _row("pykafka", 10000, 1, 450),
            _row("pykafka", 100, 2, 300),
            {**_row("pykafka", 10000, 2, 0), "triggers": 0, "error": "timeout"},
            _row("jvm", 100, 1, 500)]
    assert scale.growth_by_round(rows) == {"pykafka": {"ratios": [1.5], "median": 1.5}}
