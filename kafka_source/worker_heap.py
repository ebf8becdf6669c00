"""Spark's Python workers: what the connector's readers and writers do for the process they run in.

The collector: keep the full garbage collection after every task short
----------------------------------------------------------------------

PySpark's daemon runs ``gc.collect()`` in a reused worker after every task it ran
(``pyspark/daemon.py``). A full collection walks every object the cyclic collector tracks, and
an executor worker that has read Kafka holds PySpark, pyarrow, numpy, pandas (PySpark's Arrow
path imports it), kafka-python and this package: about 95,000 such objects, 35-60 ms of CPU per
collection on this project's 2-core machine (PySpark and pandas alone: about 75,000 and 35-45
ms). Measured in Spark (a 1M-record batch read in 2 tasks): the executors' Python workers used
0.37 CPU-seconds per query, 0.26 with the heap frozen. On two cores those are seconds taken from
Spark's JVM and the broker; in a stream, every micro-batch's task pays it again.

So a worker freezes what the process holds (``gc.freeze``: moved to a permanent generation that
collections skip) once the connector's object for its job exists: a reader or writer unpickled
for a task, and in Spark's planning workers the reader or writer the data source builds
(``pyspark.sql.worker.write_into_data_source`` builds the stream writer again for every
micro-batch, and ``python_streaming_sink_runner`` builds it for the batch's commit; both are
reused workers the daemon collects after every call). What is frozen is mostly modules, classes
and functions, which live as long as the process anyway. Frozen objects are still freed by
reference counting; only a reference cycle among them, made garbage later, would stay (a few
objects of the job that froze). Everything created afterwards is collected as before.

It freezes again only when the process has imported modules since (``len(sys.modules)`` grew:
a codec, the group's client, the exactly-once path, first used by a later job), and then
collects first, so no garbage is frozen; as a process imports each module once, that happens a
few times in its life at most. Freezing at every task would keep each task's cycles. Only where
the daemon collects: a worker it reuses (``SPARK_REUSE_WORKER``, Spark's default
``spark.python.worker.reuse``); a process that is not one (a worker used once, a test
unpickling a reader, the user's own driver) is left as it is.

Measured on PySpark 4.3 (a Kafka-to-Kafka stream at 1,000 records/s, trigger 0, Kafka 4.0, CPU
time per process over 20 s of the query): the write and the commit workers took 2.2 and 2.1
CPU-seconds when only an unpickled reader or writer froze the heap (py-spy: three quarters of
their samples in the daemon's ``gc.collect()``), 0.18 and 0.10 after this; the two executor
workers 3.6 together, 1.3 after (they now also freeze what their first task imported). The
micro-batch went from 368 to 226 ms, its ``commitOffsets`` step from 109 to 57 ms: on two cores,
Spark's commit log waited for the collections.

The driver's side of a stream is the other long-lived Spark Python process: its stream reader
lives in ``pyspark.sql.streaming.python_streaming_source_runner`` for the whole query, started
directly (no daemon, no ``SPARK_REUSE_WORKER``). Nobody calls ``gc.collect()`` there, but
Python's own collector does: each trigger's planning makes and keeps tens of thousands of objects
per 10,000 partitions (the Metadata and ListOffsets answers, the offsets, the view of leader
epochs), and every few triggers that starts a full collection over the same heap of PySpark,
pyarrow and pandas. Measured at 10,000 partitions (Kafka 4.0, ``latestOffset`` in a loop): about
70 ms of a trigger's 300-450 ms went to it, 1-4 ms with the heap frozen. So the first stream
reader the data source builds in that process freezes it too, and again when a later trigger
imported modules (the group's client on the first trigger); what the reader makes afterwards is
collected as before.

The C library's allocator: keep freed chunk buffers for the next chunk
------------------------------------------------------------------------
Decoding allocates a few buffers of megabytes per chunk of records (a decompressed records
section, the key and value columns) and frees them when the chunk has gone to the JVM. glibc's
``malloc`` serves a block of at least its *mmap threshold* with a fresh ``mmap`` and returns it
to the kernel when freed, and hands free memory at the top of its heap back once there is more
than its *trim threshold*. Both thresholds start low (128 KiB) and adapt to the largest block
freed so far, up to 32 MiB and 64 MiB. A decoder freeing 8 MiB blocks leaves them at 8 and 16
MiB, so the 25-30 MiB a chunk needs in all is given back and taken again for every chunk: each
page of it is zeroed by the kernel and faulted in again. Measured on an lz4 fetch response of
250,000 100-byte values in 1 MB batches, on one core: 12,500 page faults per 25 MB of values and
half of the decoder's CPU in the kernel; 195 ms per 100 MB of values before, 90 ms with the
thresholds pinned, and no page fault after the first chunk.

So a Spark Python worker (``PYTHON_WORKER_FACTORY_SECRET`` in its environment, set by Spark for
its daemon and workers) pins both thresholds at those upper limits when the first reader or
writer is unpickled in it (``mallopt``: ``M_MMAP_THRESHOLD`` 32 MiB, ``M_TRIM_THRESHOLD`` 64
MiB). That is no more than glibc itself would keep after freeing one 32 MiB block: at most 64
MiB of free memory stays at the top of a heap, and blocks of 32 MiB or more are still mapped
and unmapped on their own. Left as it is: a C library other than glibc (``mallopt`` is
glibc's), a process that is not a Spark worker, and a worker whose environment already sets
either threshold (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES``,
e.g. through ``spark.executorEnv.*``): the operator's choice stands.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import sys

from . import _SPARK_WORKER_VAR

#: glibc's mallopt parameters (malloc.h) and the values pinned: glibc's own upper limits for its
#: adaptive thresholds on 64-bit platforms (DEFAULT_MMAP_THRESHOLD_MAX and twice that).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20

_OPERATOR_MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_pinned = False
#: ``len(sys.modules)`` when the heap was last frozen; -1 before the first freeze.
_frozen_at = -1


def prepare() -> None:
    """What the connector does for a Spark Python process whenever its object for a job exists
    (a reader or writer unpickled, or built by the data source): the first time, pin the
    allocator's thresholds (:func:`pin_malloc_thresholds`); every time, freeze the heap if the
    process imported modules since it last did (:func:`freeze_heap`). Costs a dictionary's
    length when nothing changed. Never raises."""
    global _pinned
    if not _pinned:
        _pinned = True
        pin_malloc_thresholds()
    freeze_heap()


#: The module Spark runs a stream reader's driver side in (``python -m``), PySpark 4.0+.
STREAMING_SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def freeze_heap() -> None:
    """Freeze the process's tracked objects if it is a reused Spark worker or the driver's
    streaming source runner (module docstring) and it has imported modules since the last
    freeze; a later freeze collects first. In any other process do nothing. Never raises."""
    global _frozen_at
    modules = len(sys.modules)
    if modules == _frozen_at:
        return
    if not (os.environ.get("SPARK_REUSE_WORKER") or streaming_source_runner()):
        return
    freeze = getattr(gc, "freeze", None)    # CPython 3.7+; absent on other interpreters
    if freeze is None:
        return
    if _frozen_at >= 0:
        gc.collect()                        # freeze no garbage made since the last freeze
    freeze()
    _frozen_at = modules


def streaming_source_runner() -> bool:
    """Is this process Spark's runner of a stream reader's driver side (a Spark Python worker
    started as ``python -m`` :data:`STREAMING_SOURCE_RUNNER`)?"""
    if _SPARK_WORKER_VAR not in os.environ:
        return False
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == STREAMING_SOURCE_RUNNER


def pin_malloc_thresholds(environ=None) -> bool:
    """In a Spark Python worker on glibc whose environment leaves the allocator's thresholds
    alone, set the mmap threshold to :data:`MMAP_THRESHOLD` and the trim threshold to
    :data:`TRIM_THRESHOLD` (module docstring). Returns whether it did. Never raises."""
    env = os.environ if environ is None else environ
    if _SPARK_WORKER_VAR not in env or any(v in env for v in _OPERATOR_MALLOC_VARS):
        return False
    if not on_glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; setting the mmap threshold first, as the trim threshold
    # alone would switch the adaptive mmap threshold off at its 128 KiB start.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def on_glibc() -> bool:
    """Is the process's C library glibc (the one with ``mallopt``)?"""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
