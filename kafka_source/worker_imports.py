"""Spark's Python workers on PySpark 4.0 and 4.1: stop re-reading zip archives before every task.

Measured on PySpark 4.0.5, Python 3.11 (strace of a reused planning worker, 2026-11-29): before
every task and every planning call (a ``spark.read...load()``, the planning of each read), the
worker runs ``importlib.invalidate_caches()`` (``pyspark/worker_util.py``,
``setup_spark_files``), whether or not Spark added a file to ``sys.path``. That asks every cached
path finder to forget what it knows, and on Python 3.10 and 3.11 a ``zipimport.zipimporter``
answers by reading its archive's whole central directory again, in pure Python, at once: one
importer per package imported from a zip (``pyspark.zip`` and its subpackages, py4j's zip, the
``spark-core`` jar that Spark puts on the workers' path), each reading thousands of entries. A
``load()`` then took 150-230 ms instead of 20 ms, the planning and running of a 100-record batch
read 450-760 ms instead of 250 ms, and a micro-batch of 20,000 records about 450 ms instead of
150 ms (``make bench``'s 20,000-record stream ran at 0.46-0.61 of Spark's JVM source). PySpark 4.2
calls ``invalidate_caches()`` only when the path changed; Python 3.12 re-reads lazily, once per
archive, at the next import from it, which a worker still does.

:func:`keep_zip_directories` replaces ``zipimporter.invalidate_caches`` in such a worker with one
that keeps the directory it read while the archive on disk is the same file (same inode, size
and modification time); an archive that did change is read again, as before, and so is one seen
for the first time. Nothing else changes: a zip or directory Spark adds to ``sys.path`` gets a
new importer as always. It is done once per process, in Spark's Python workers only
(``PYTHON_WORKER_FACTORY_SECRET`` in the environment, as :mod:`kafka_source.worker_heap`), when
the connector's code first runs there: the data source in a planning worker, a reader or writer
unpickled in an executor's worker. The first call in each worker pays the old cost once. It
helps every later task in that worker, the connector's and any other.
"""

from __future__ import annotations

import os
import zipimport

from .worker_heap import _SPARK_WORKER_VAR

_done = False


def keep_zip_directories(environ=None) -> bool:
    """In a Spark Python worker, make ``zipimporter.invalidate_caches`` keep the directories of
    archives that did not change (module docstring). Once per process; returns whether the
    importer is (now) patched. Never raises."""
    global _done
    env = os.environ if environ is None else environ
    if _SPARK_WORKER_VAR not in env:
        return False
    if _done:
        return True
    try:
        patch_zipimporter()
    except Exception:  # noqa: BLE001 - an optimisation: never fail a task over it
        return False
    _done = True
    return True


def patch_zipimporter(importer_class=zipimport.zipimporter, cache=None) -> None:
    """Replace ``importer_class.invalidate_caches`` by one that skips archives whose file is
    unchanged since it last read them (``cache``: zipimport's directory cache)."""
    directories = zipimport._zip_directory_cache if cache is None else cache
    original = importer_class.invalidate_caches
    if getattr(original, "_keeps_unchanged_archives", False):
        return
    read_as: dict[str, tuple[int, int, int]] = {}   # archive -> its file when last read

    def invalidate_caches(self):
        stamp = _stamp(self.archive)
        files = directories.get(self.archive)
        if stamp is not None and files is not None and read_as.get(self.archive) == stamp:
            if hasattr(self, "_files"):
                self._files = files       # Python 3.10/3.11 importers hold their own reference
            return
        original(self)
        if stamp is not None:
            read_as[self.archive] = stamp

    invalidate_caches._keeps_unchanged_archives = True
    invalidate_caches.__doc__ = original.__doc__
    importer_class.invalidate_caches = invalidate_caches


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
