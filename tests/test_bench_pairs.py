"""benchmarks/run.py: which of the JVM anchor's runs a paired stream round compares with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import run  # noqa: E402


def test_a_paired_round_takes_the_anchors_last_timed_run():
    # The anchor prints its median and every timed run (warm-up left out); a fresh JVM's first
    # timed run is still warming up, so the round compares with the last.
    result = {"seconds_median": 2.3, "runs": [2.47, 2.14]}
    assert run.paired_anchor_seconds(result) == 2.14
    assert run.paired_anchor_seconds({"runs": [1.9]}) == 1.9
    with pytest.raises(RuntimeError, match="no timed runs"):
        run.paired_anchor_seconds({"seconds_median": 2.0})


def test_jvm_pair_runs_defaults_to_two_and_refuses_less_than_one(capsys):
    assert run.parse_args([]).jvm_pair_runs == 2
    assert run.parse_args(["--jvm-pair-runs", "1"]).jvm_pair_runs == 1
    with pytest.raises(SystemExit):
        run.parse_args(["--jvm-pair-runs", "0"])
    assert "--jvm-pair-runs must be >= 1" in capsys.readouterr().err
