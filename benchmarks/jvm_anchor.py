"""Spark's own JVM Kafka source, the reader pykafka is measured against, run on the same topics.

The anchor is a tool beside the repository (``../shared/anchors/spark-jvm-kafka/run``, see
``../shared/README.md``): spark-sql-kafka-0-10 4.0.0 on PySpark 4.0.0 in its own venv (the 4.0.0
connector jars do not link against the PySpark pykafka runs on), started as a separate process.
It times ``spark.read.format("kafka")`` (``count(*)``, ``sum(length(value))``) or an AvailableNow
stream into the noop sink, after one warm-up run, and prints one JSON line. "Tuned" adds
``kafka.max.poll.records=20000`` and ``kafka.max.partition.fetch.bytes=4 MiB``.
``mode="write"`` times Spark's JVM Kafka sink instead: ``records`` generated rows (``WRITE_SOURCE``
in ``read.py``) written with ``df.write.format("kafka")`` and ``kafka.compression.type=codec``
into the existing topics ``TOPIC-0`` .. ``TOPIC-RUNS`` (one per run, warm-up included); "tuned"
there is ``kafka.batch.size=256 KiB``, ``kafka.linger.ms=5``.
``SPARK_JVM_KAFKA_ANCHOR`` points at another copy of the tool.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_ANCHOR = HERE.parent.parent / "shared" / "anchors" / "spark-jvm-kafka" / "run"


def anchor_path() -> Path | None:
    """The anchor's ``run`` script, or None when it is not on this machine."""
    path = Path(os.environ.get("SPARK_JVM_KAFKA_ANCHOR", DEFAULT_ANCHOR))
    return path if path.is_file() and os.access(path, os.X_OK) else None


def run_anchor(path: Path, *, bootstrap: str, topic: str, mode: str, runs: int, master: str,
               max_offsets_per_trigger: int | None = None, tuned: bool = False,
               records: int | None = None, codec: str | None = None,
               timeout_s: float = 1800) -> dict:
    """One anchor invocation (warm-up + ``runs`` timed runs); its JSON result."""
    cmd = [str(path), "--bootstrap", bootstrap, "--topic", topic, "--mode", mode,
           "--runs", str(runs), "--master", master]
    if max_offsets_per_trigger:
        cmd += ["--max-offsets-per-trigger", str(max_offsets_per_trigger)]
    if records is not None:
        cmd += ["--records", str(records)]
    if codec is not None:
        cmd += ["--codec", codec]
    if tuned:
        cmd.append("--tuned")
    # Its own venv and PySpark: none of this process's Spark settings may leak into it.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_HOME", "PYTHONPATH"))}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"JVM anchor failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1])
