"""A Spark query in a process of its own, for benchmarks that run pykafka and Spark's JVM Kafka
source side by side on the same broker (``scale.py``, ``latency.py``; ``soak.py`` uses the
session builder in-process).

Why a process per query: the JVM source's jars (spark-sql-kafka-0-10 4.0.0) only link against
the PySpark they were built for, which lives in the anchor's own venv
(``../shared/anchors/spark-jvm-kafka``), and a fresh Spark per point keeps one reader's
leftovers (threads, caches, heap) out of the next one's figures. This module is imported by
both interpreters, the anchor's PySpark 4.0.0 included: only the standard library at the top.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ANCHOR_DIR = HERE.parent.parent / "shared" / "anchors" / "spark-jvm-kafka"


def default_kafka_home() -> None:
    """``KAFKA_HOME`` from ``../shared/kafka`` (Kafka 4.0) when it is unset and that
    distribution is there, so that a benchmark's own broker starts on a fresh machine as its
    docstring says; a ``KAFKA_HOME`` already set is left alone."""
    shared = HERE.parent.parent / "shared" / "kafka"
    if not os.environ.get("KAFKA_HOME", "").strip() and (shared / "bin").is_dir():
        os.environ["KAFKA_HOME"] = str(shared)


def jvm_reader_present() -> bool:
    """Whether Spark's JVM Kafka source (the anchor's jars) is on this machine."""
    return (ANCHOR_DIR / "jars").is_dir()


def drop_missing_jvm(readers: list[str], log) -> list[str]:
    """``readers`` without "jvm" when its jars are not on this machine (said through ``log``)."""
    if "jvm" in readers and not jvm_reader_present():
        log(f"Spark's JVM Kafka source is not on this machine ({ANCHOR_DIR}): pykafka only")
        return [r for r in readers if r != "jvm"]
    return readers


def interpreter(reader: str) -> tuple[str, dict[str, str]]:
    """The Python and environment that run a query of ``reader`` ("pykafka" or "jvm"):
    pykafka on this interpreter with the repository importable; the JVM source on the
    anchor's venv (made by the anchor's own script on first use), with none of this process's
    Spark settings leaking into it."""
    if reader == "pykafka":
        env = dict(os.environ)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE.parent), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        return sys.executable, env
    venv = Path(os.environ.get("SPARK_JVM_KAFKA_VENV", Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "spark-jvm-kafka-4.0.0"))
    if not (venv / "bin" / "python").exists():
        subprocess.run([str(ANCHOR_DIR / "run"), "--help"], capture_output=True, timeout=900)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_HOME", "PYTHONPATH"))}
    env["PYTHONPATH"] = str(HERE)
    return str(venv / "bin" / "python"), env


def spark_session(app: str, *, master: str = "local[2]", reader: str = "pykafka",
                  progress_kept: int = 100_000):
    """A quiet local Spark for a benchmark query: no UI, loopback only, two shuffle partitions,
    ``progress_kept`` progress reports kept (the figures come from them). For ``reader``
    "jvm", Spark's Kafka source's jars; for "pykafka", the source registered. Returns
    ``(spark, format name)``."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.streaming.numRecentProgressUpdates", str(progress_kept)))
    if reader == "jvm":
        builder = builder.config("spark.jars", ",".join(sorted(glob.glob(
            str(ANCHOR_DIR / "jars" / "*.jar")))))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if reader != "pykafka":
        return spark, "kafka"
    import kafka_source

    kafka_source.register(spark)
    return spark, "pykafka"
