"""Spark's Python workers: what imports cost there, and two costs the connector avoids.

Zip archives read again before every task (PySpark 4.0 and 4.1)
---------------------------------------------------------------

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

Package ``__init__`` files that import what the connector never uses (every version)
-----------------------------------------------------------------------------------

Three Python workers of a stream each import the connector's reading side when a query starts
(the planning worker, the one that runs the stream reader's planning methods, and an executor's
worker that unpickles the reader for its first task), and each paid for two package
``__init__`` files beyond what the connector uses of their packages:

- kafka-python's ``kafka/__init__.py`` imports its ``KafkaConsumer``, ``KafkaProducer`` and
  ``KafkaAdminClient`` (and with them its record format, its coordinator, ``crc32c``), so that
  ``from kafka import KafkaConsumer`` works. The connector uses its errors, protocol classes and
  network layer, never those clients.
- ICRAR's ``crc32c/__init__.py`` asks ``importlib.metadata`` for its own version; on a worker's
  ``sys.path`` (``pyspark.zip``, py4j's zip, Spark's jars) that reads the central directory of
  every archive before site-packages, in pure Python: 75-165 ms of one worker's start.

Measured with ``PYTHONPROFILEIMPORTTIME`` in every worker of a one-trigger stream (Kafka 4.0,
local[2], 2 cores, 2026-12-02): ``kafka_source.read.stream`` took 448-550 ms to import in each of
the three workers on PySpark 4.0.5 and 518-748 ms on 4.3, and 189-289 and 190-308 ms with the
two ``__init__`` files deferred as below; the executor's ``kafka_source.read.executor`` stayed at
62-98 ms (its ``crc32c`` moved there from kafka-python's import and costs nothing more). On two
cores, those workers start one after another on the query's path to its first micro-batch.

So in Spark's workers only (``PYTHON_WORKER_FACTORY_SECRET``), :func:`defer_package_inits` puts
such a package in ``sys.modules`` as its module object created from its spec without running the
``__init__``, with a module ``__getattr__`` (PEP 562). ``import kafka.errors`` and
``from kafka import errors`` then import just that submodule; the first name asked for that is
not a submodule (``from kafka import KafkaConsumer``, ``kafka.__version__``, ``crc32c.crc32c``,
``from kafka import *``) runs the real ``__init__`` once, under a lock, and everything is as it
would have been: user code in the same worker sees the whole package. It is done when
``kafka_source`` is first imported in the process, before any of its modules imports those
packages; one already imported is left as it is, and so is one that is not a package (``crc32c``
before 2.4 was a plain extension module). The connector takes ``crc32c``'s function from its
extension module ``crc32c._crc32c`` (:func:`kafka_source.wire.format.records.icrar_crc32c`).
Outside Spark's workers (the user's driver, tests) nothing changes.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
import zipimport

from . import _SPARK_WORKER_VAR

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


# Packages whose __init__ imports much more than the connector uses of them (module docstring).
DEFERRED_PACKAGES = ("kafka", "crc32c")


def defer_package_inits(environ=None) -> list[str]:
    """In a Spark Python worker, put each of :data:`DEFERRED_PACKAGES` that is installed and not
    imported yet in ``sys.modules`` without running its ``__init__`` (module docstring, second
    part). Returns the names it did that for. Never raises."""
    env = os.environ if environ is None else environ
    if _SPARK_WORKER_VAR not in env:
        return []
    return [name for name in DEFERRED_PACKAGES if _defer_init(name)]


def _defer_init(name: str) -> bool:
    if name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not spec.submodule_search_locations:
            return False                  # not installed, or a plain module (crc32c before 2.4)
        package = importlib.util.module_from_spec(spec)
    except Exception:  # noqa: BLE001 - an optimisation: a plain import does the rest
        return False
    _make_lazy(package, spec)
    sys.modules[name] = package
    return True


def _make_lazy(package, spec) -> None:
    """Give ``package`` (created from ``spec``, its ``__init__`` not run) what its ``__init__``
    would have done at once that must not wait, and a module ``__getattr__`` that runs that
    ``__init__`` the first time a name is asked for that is neither set nor a submodule."""
    name = spec.name
    # kafka-python's __init__ gives its loggers a NullHandler, so that its warnings are not
    # printed by logging's last-resort handler where nobody configured logging: keep that.
    null_handler = logging.NullHandler() if name == "kafka" else None
    if null_handler is not None:
        logging.getLogger(name).addHandler(null_handler)
    lock = threading.RLock()
    state = {"running": False, "done": False}

    def __getattr__(attribute):
        if not (attribute.startswith("__") and attribute.endswith("__")) \
                and _is_submodule(attribute):
            importlib.import_module(f"{name}.{attribute}")  # ``from kafka import errors``
            return package.__dict__[attribute]
        with lock:
            if state["running"]:   # asked by __init__ itself, in this thread: as Python would
                raise AttributeError(f"partially initialized module {name!r} has no attribute "
                                     f"{attribute!r}")
            if not state["done"]:
                state["running"] = True
                try:
                    spec.loader.exec_module(package)
                finally:
                    state["running"] = False
                state["done"] = True
                if null_handler is not None:                  # the __init__ added its own
                    logging.getLogger(name).removeHandler(null_handler)
                if package.__dict__.get("__getattr__") is __getattr__:
                    del package.__dict__["__getattr__"]
        try:
            return package.__dict__[attribute]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}") from None

    def _is_submodule(attribute):
        try:
            return importlib.util.find_spec(f"{name}.{attribute}") is not None
        except (ImportError, ValueError):
            return False

    package.__getattr__ = __getattr__
