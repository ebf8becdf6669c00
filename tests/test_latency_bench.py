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


def test_rounds_give_each_reader_its_medians_and_the_paired_ratios_per_round():
    def row(reader, round_no, p50, p99, p999, rate=1000):
        return {"reader": reader, "rate": rate, "trigger_ms": 0, "round": round_no,
                "records": 60_000, "p50_ms": p50, "p99_ms": p99, "p999_ms": p999}

    rows = [row("pykafka", 1, 250, 600, 800), row("jvm", 1, 300, 500, 1000),
            row("jvm", 2, 310, 700, 1100), row("pykafka", 2, 240, 630, 820),
            row("pykafka", 3, 260, 900, 900), row("jvm", 3, 280, 650, 1200),
            {"reader": "jvm", "rate": 1000, "trigger_ms": 0, "round": 4, "error": "no report"},
            row("pykafka", 1, 100, 200, 300, rate=10_000)]
    summary = latency.over_rounds(rows)
    assert [(p["rate"], p["trigger_ms"]) for p in summary] == [(1000, 0), (10_000, 0)]
    first = summary[0]
    assert first["readers"]["pykafka"] == {"rounds": 3, "p50_ms": 250, "p99_ms": 630,
                                           "p999_ms": 820}
    assert first["readers"]["jvm"]["rounds"] == 3 and first["readers"]["jvm"]["p99_ms"] == 650
    p99 = first["paired"]["pykafka/jvm"]["p99_ms"]
    assert p99["ratios"] == [1.2, 0.9, 1.385]                  # each round against its own
    assert p99["median"] == 1.2
    assert summary[1]["paired"] == {}                          # no JVM row at that point
