"""Lean JVMs for test runs: the just-in-time compiler's first tier only, and the serial collector.

A test run starts many short-lived JVMs on a 2-core machine: a Spark driver per pass (and a few
in subprocesses), a broker or a three-node cluster (started and restarted dozens of times in the
failure scenarios), ZooKeeper, and Kafka's command-line tools. Most of what such a JVM spends on
the CPU is its own start: loading classes and compiling hot methods with both compilers, C1 and
then C2, whose optimising compilations are the dearest and only pay off after minutes of steady
load that a test never gives. Measured here (2026-11-29, CPU-seconds in a cgroup of its own):

* one Kafka 4.0 broker, formatted, started, 2,000 records, 20 s idle: 17.6 s with the
  distribution's flags, about 9 s with ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``;
* ``test_batch_read.py`` and ``test_multi_partition_tasks.py`` on the embedded broker (the Spark
  driver is the only JVM): 84 s; 58 s with C1 only; 74 s with the serial collector only; 53 s
  with both, and 90 s instead of 142 s on the clock.

None of this changes what a JVM does, only how fast its code is compiled and its memory
collected, so no test asserts less. Benchmarks and the demo never get these flags: only
``tests/conftest.py`` applies them (:func:`apply`), to the environment every JVM of the run
inherits:

``KAFKA_JVM_PERFORMANCE_OPTS``
    read by the distributions' ``kafka-run-class.sh`` (Kafka 2.2 and 4.0 alike) for brokers,
    ZooKeeper, the Java console consumer and every tool (``kafka-storage.sh``,
    ``kafka-configs.sh``, JmxTool...);
``PYSPARK_SUBMIT_ARGS``
    read by PySpark when it starts a driver JVM, in the pytest process and in every subprocess
    that starts a Spark of its own (Spark Connect's server, the notebook's kernel, the retry and
    leak jobs); executors in separate JVMs (``local-cluster``) get the same options.

``PYKAFKA_TEST_JVM_OPTS`` replaces the options (empty: the JVMs' own defaults, e.g. to compare),
and a variable that is already set is left as it is.
"""

from __future__ import annotations

import os
import shlex
from typing import MutableMapping

ENV_OPTIONS = "PYKAFKA_TEST_JVM_OPTS"
#: C1 only (no C2 compilations), the serial collector (no parallel GC threads on 2 cores).
DEFAULT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def options(environ: MutableMapping[str, str] | None = None) -> str:
    """The JVM options of a test run: ``PYKAFKA_TEST_JVM_OPTS`` if set, else the default."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV_OPTIONS, DEFAULT_OPTIONS).strip()


def environment(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The variables :func:`apply` sets: those of ``KAFKA_JVM_PERFORMANCE_OPTS`` and
    ``PYSPARK_SUBMIT_ARGS`` that ``environ`` does not set already."""
    environ = os.environ if environ is None else environ
    opts = options(environ)
    if not opts:
        return {}
    out = {}
    if "KAFKA_JVM_PERFORMANCE_OPTS" not in environ:
        # What kafka-run-class.sh puts there by default, with our collector and compiler.
        out["KAFKA_JVM_PERFORMANCE_OPTS"] = f"-server {opts} -Djava.awt.headless=true"
    if "PYSPARK_SUBMIT_ARGS" not in environ:
        quoted = shlex.quote(opts)
        out["PYSPARK_SUBMIT_ARGS"] = (f"--driver-java-options {quoted} "
                                      f"--conf spark.executor.extraJavaOptions={quoted} "
                                      "pyspark-shell")
    return out


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :func:`environment` in ``environ`` (the process's own by default); returns what was
    set."""
    environ = os.environ if environ is None else environ
    added = environment(environ)
    environ.update(added)
    return added
