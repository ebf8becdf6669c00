"""Spark's reused Python workers: keep the full garbage collection after every task short.

PySpark's daemon runs ``gc.collect()`` in a reused worker after every task it ran
(``pyspark/daemon.py``). A full collection walks every object the cyclic collector tracks, and
an executor worker that has read Kafka holds PySpark, pyarrow, numpy, pandas (PySpark's Arrow
path imports it), kafka-python and this package: about 95,000 such objects, 35-60 ms of CPU per
collection on this project's 2-core machine (PySpark and pandas alone: about 75,000 and 35-45
ms). Measured in Spark (a 1M-record batch read in 2 tasks): the executors' Python workers used
0.37 CPU-seconds per query, 0.26 with the heap frozen. On two cores those are seconds taken from
Spark's JVM and the broker; in a stream, every micro-batch's task pays it again.

So the first reader or writer unpickled in a worker freezes what the process holds at that
moment (``gc.freeze``: moved to a permanent generation that collections skip). What is frozen
is mostly modules, classes and functions, which live as long as the process anyway. Frozen
objects are still freed by reference counting; only a reference cycle among them, made garbage
later, would stay (a few objects of that first task's command, once per process). Everything
created afterwards is collected as before. Once per process, never again: freezing at every
task would keep each task's cycles. Only where the daemon collects: a worker it reuses
(``SPARK_REUSE_WORKER``, Spark's default ``spark.python.worker.reuse``); a process that is not
one (a worker used once, a test unpickling a reader) is left as it is.
"""

from __future__ import annotations

import gc
import os

_frozen = False


def freeze_once() -> None:
    """Freeze the process's tracked objects the first time it is called in a reused Spark
    worker; later calls, and calls in any other process, do nothing. Never raises."""
    global _frozen
    if _frozen or not os.environ.get("SPARK_REUSE_WORKER"):
        return
    _frozen = True
    freeze = getattr(gc, "freeze", None)    # CPython 3.7+; absent on other interpreters
    if freeze is not None:
        freeze()
