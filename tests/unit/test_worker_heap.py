"""kafka_source.worker_heap: the first reader or writer unpickled in a reused Spark worker
freezes the heap the worker started with, so PySpark's gc.collect() after each task skips it.

Each case runs in a fresh interpreter: freezing is once per process and would otherwise change
the test process's own collector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PROBE = textwrap.dedent("""
    import gc, json, pickle, sys
    from kafka_source.config.options import parse_batch_options
    from kafka_source.read.batch import KafkaBatchReader

    reader = KafkaBatchReader(parse_batch_options({
        "kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}))
    before = gc.get_freeze_count()
    pickle.loads(pickle.dumps(reader))            # what a Spark worker does with the command
    first = gc.get_freeze_count()
    class Cycle:                                  # garbage made after the freeze
        pass
    c = Cycle(); c.me = c; del c
    collected = gc.collect()
    pickle.loads(pickle.dumps(reader))            # a later task in the same worker
    print(json.dumps({"before": before, "first": first, "later": gc.get_freeze_count(),
                      "collected": collected}))
""")


def probe(reuse: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REUSE_WORKER"}
    if reuse is not None:
        env["SPARK_REUSE_WORKER"] = reuse
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_reused_worker_freezes_its_heap_once_at_the_first_unpickled_reader():
    seen = probe("1")
    assert seen["before"] == 0
    assert seen["first"] > 10_000                 # pyarrow, kafka-python, this package ...
    assert seen["later"] == seen["first"]         # not again: each task's cycles stay collectable
    assert seen["collected"] >= 1                 # garbage made afterwards is still collected


@pytest.mark.parametrize("reuse", [None, ""])
def test_any_other_process_is_left_as_it_is(reuse):
    seen = probe(reuse)
    assert seen["first"] == seen["later"] == 0
