"""The interpreter Spark's Python workers run in the tests.

Spark starts each Python worker with PySpark's own ``python/lib/pyspark.zip`` (and py4j's zip)
first on ``PYTHONPATH``. Python compiles modules it imports from a zip from source, in every
process, so a worker that Spark starts without its forking daemon spends about 1 s of CPU
compiling PySpark before it connects back to the JVM: the driver's stream source runner and the
data source planning workers. Spark gives such a process 10 s (a constant in
``PythonWorkerFactory``) and fails the query or the read with "Python worker failed to connect
back" after that. CI runs two passes side by side on two cores, with brokers and Spark JVMs
busy, and a start once took longer.

The tests therefore run Spark's workers through ``spark-python`` (beside this file), which takes
those two zips off ``PYTHONPATH`` when they lie inside the interpreter's own PySpark installation
-- the same release, whose modules pip compiled at install -- and runs the interpreter. Nothing
else changes: the same PySpark, connector and environment. Tests that check what a user's fresh
process does (``fresh_process.py``) keep Spark's default.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyspark

#: The wrapper Spark runs as ``PYSPARK_PYTHON``.
SPARK_PYTHON = Path(__file__).resolve().with_name("spark-python")
#: Where the interpreter's PySpark keeps the zips Spark puts on its workers' ``PYTHONPATH``.
PYSPARK_LIB = Path(pyspark.__file__).resolve().parent / "python" / "lib"


def spark_worker_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment, copied) with Spark's Python workers and
    the driver's Python set up as described above."""
    env = dict(os.environ if env is None else env)
    env["PYKAFKA_TEST_PYTHON"] = sys.executable
    env["PYKAFKA_TEST_PYSPARK_LIB"] = str(PYSPARK_LIB)
    env["PYSPARK_PYTHON"] = str(SPARK_PYTHON)
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env
