"""benchmarks/latency.py's arithmetic: what a latency is and which records count."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pyspark_free

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import latency  # noqa: E402


def test_values_carry_their_send_time_and_sequence_in_100_bytes():
    value = latency.encode_value(1_764_000_000_123_456, 42)
    assert len(value) == latency.VALUE_BYTES
    assert latency.decode_value(value) == (1_764_000_000_123_456, 42)


def test_nearest_rank_percentiles():
    values = list(range(1, 1001))            # 1..1000
    assert latency.percentile(values, 0.5) == 500
    assert latency.percentile(values, 0.99) == 990
    assert latency.percentile(values, 0.999) == 999
    assert latency.percentile([7], 0.999) == 7
    assert latency.percentile([], 0.5) is None


def test_latency_is_log_append_time_minus_send_time_after_the_warmup():
    start_us = 1_000_000_000                 # 1,000,000 ms
    arrivals = [
        (1_000_050, latency.encode_value(start_us, 0)),               # warm-up: not counted
        (1_002_030, latency.encode_value(start_us + 2_000_000, 1)),   # 30 ms
        (1_003_010, latency.encode_value(start_us + 3_000_000, 2)),   # 10 ms
        (1_003_500, latency.encode_value(start_us + 3_000_000, 2)),   # the same record again
        (1_004_100, latency.encode_value(start_us + 4_000_000, 3)),   # 100 ms
    ]
    figures = latency.latencies(arrivals, counted_from_us=start_us + 1_000_000)
    assert figures["records"] == 3 and figures["duplicates"] == 1
    assert figures["p50_ms"] == pytest.approx(30)
    assert figures["max_ms"] == pytest.approx(100)
    assert figures["mean_ms"] == pytest.approx(140 / 3)


def test_steps_are_taken_from_the_triggers_that_read_rows_with_their_tail():
    def report(rows, trigger, add):
        return {"rows": rows, "durationMs": {"triggerExecution": trigger, "addBatch": add}}

    progress = [report(0, 5_000, 0)]                       # an empty trigger: not counted
    progress += [report(100, 200 + i, 80 + i) for i in range(19)] + [report(100, 900, 700)]
    figures = latency.step_figures(progress)
    assert figures["triggers"] == 20 and figures["rows_per_trigger"] == 100
    assert figures["triggerExecution_ms"] == pytest.approx(209.5)
    assert figures["triggerExecution_p95_ms"] == 218           # 19th of 20 by nearest rank
    assert figures["addBatch_p95_ms"] == 98
    assert figures["walCommit_ms"] == 0                        # a step Spark did not report
    assert latency.step_figures([progress[0]]) == {"triggers": 0}
