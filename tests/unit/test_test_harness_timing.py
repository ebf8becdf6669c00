"""The test run's own instruments: where a pass's time goes (kafka_source.testing.timing) and the
lean JVMs of a test run (kafka_source.testing.jvm)."""

from __future__ import annotations

import json
import textwrap

import pytest

from kafka_source.testing import jvm, timing

pytestmark = pytest.mark.pyspark_free


def test_sleeps_in_loops_are_told_from_fixed_ones(tmp_path):
    source = tmp_path / "waits.py"
    source.write_text(textwrap.dedent("""\
        import time

        def fixed():
            time.sleep(1)

        def polling(ready):
            while not ready():
                time.sleep(0.1)

        def pacing():
            for _ in range(3):
                if True:
                    time.sleep(0.1)
            time.sleep(2)

        def nested_function_in_a_loop():
            for _ in range(2):
                def inner():
                    time.sleep(1)
        """))
    loops = timing._LoopLines()
    lines = source.read_text().splitlines()

    def line_of(text, nth=0):
        return [i + 1 for i, line in enumerate(lines) if line.strip() == text][nth]

    path = str(source)
    assert not loops.in_loop(path, line_of("time.sleep(1)", 0))
    assert loops.in_loop(path, line_of("time.sleep(0.1)", 0))
    assert loops.in_loop(path, line_of("time.sleep(0.1)", 1))
    assert not loops.in_loop(path, line_of("time.sleep(2)"))
    # a function defined in a loop does not loop its own body
    assert not loops.in_loop(path, line_of("time.sleep(1)", 1))


def test_the_report_adds_up_each_pass_and_names_the_slowest_tests(tmp_path):
    path = tmp_path / "timing.jsonl"
    records = [
        {"pass": "one", "test": "a", "wall": 10.0, "cpu": 10.0, "spark": 2.0, "brokers": 3.0,
         "sleep_fixed": 1.0, "sleep_loop": 0.5, "work": 3.5},
        {"pass": "one", "test": "b", "wall": 4.0, "cpu": 2.0, "spark": 0.0, "brokers": 0.0,
         "sleep_fixed": 0.0, "sleep_loop": 0.0, "work": 4.0},
        {"pass": "one", "test": timing.SESSION, "wall": 20.0},
        {"pass": "two", "test": "c", "wall": 30.0, "cpu": 0.0, "spark": 0.0, "brokers": 0.0,
         "sleep_fixed": 30.0, "sleep_loop": 0.0, "work": 0.0},
        {"pass": "two", "test": timing.SESSION, "wall": 31.0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    table = timing.report(str(path), slowest=2).splitlines()
    one = next(row for row in table if row.startswith("| one |"))
    cells = [c.strip() for c in one.strip("|").split("|")]
    # tests, wall, Spark, brokers, fixed, polling, work, outside tests
    assert cells[1:9] == ["2", "20", "2", "3", "1", "0", "8", "6"]
    total = next(row for row in table if row.startswith("| all |"))
    assert [c.strip() for c in total.strip("|").split("|")][2] == "51"
    slowest = [row for row in table if row.startswith("| `")]
    assert [row.split("`")[1] for row in slowest] == ["c", "a"]


def test_the_lean_jvm_options_reach_kafka_scripts_and_pyspark_unless_set():
    env = jvm.environment({})
    assert env["KAFKA_JVM_PERFORMANCE_OPTS"] == \
        "-server -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true"
    import shlex

    args = shlex.split(env["PYSPARK_SUBMIT_ARGS"])
    assert args[:2] == ["--driver-java-options", jvm.DEFAULT_OPTIONS]
    assert "spark.executor.extraJavaOptions=" + jvm.DEFAULT_OPTIONS in args
    assert args[-1] == "pyspark-shell"
    # a variable the caller set is left alone; an empty option string turns it all off
    assert "KAFKA_JVM_PERFORMANCE_OPTS" not in jvm.environment(
        {"KAFKA_JVM_PERFORMANCE_OPTS": "-server"})
    assert jvm.environment({jvm.ENV_OPTIONS: ""}) == {}
    environ = {jvm.ENV_OPTIONS: "-Xint"}
    assert jvm.apply(environ)["KAFKA_JVM_PERFORMANCE_OPTS"] == "-server -Xint -Djava.awt.headless=true"
    assert environ["PYSPARK_SUBMIT_ARGS"].startswith("--driver-java-options -Xint ")
