"""What the installed PySpark's Python Data Source API offers, found by feature, not by version.

The connector runs on every PySpark from 4.0. What it is built on is in all of them: the
``DataSource`` with batch and stream readers that yield Arrow record batches, Arrow batch writers,
the row stream writer, ``pyspark_*`` auto-discovery and Spark Connect. What came later is looked
for here, once, by importing it (Databricks back-ports features into its runtimes, so a version
string would lie), and the rest of the package asks this module:

``ADMISSION_CONTROL``
    ``pyspark.sql.streaming.datasource`` (PySpark 4.2, SPARK-55304): Spark calls a stream
    reader's ``latestOffset(start, limit)`` with the read limit, and
    ``prepareForTriggerAvailableNow``, ``getDefaultReadLimit`` and ``reportLatestOffset``.
    Without it (4.0, 4.1) Spark calls ``latestOffset()`` with no arguments, once per trigger, and
    runs ``Trigger.AvailableNow`` as one batch (SPARK-45178); the stream reader then keeps its own
    start and applies the rate limits itself (:mod:`kafka_source.read.stream`). Where the module
    is missing, :class:`ReadLimit` and its kinds are stand-ins with the same names and fields,
    so that the reader has one code path for the limits.
``STREAM_ARROW_WRITER``
    ``DataSourceStreamArrowWriter`` (PySpark 4.1). On 4.0 a stream writer that is both a
    ``DataSourceStreamWriter`` and a ``DataSourceArrowWriter`` gets Arrow batches the same way
    (``pyspark/sql/worker/write_into_data_source.py`` checks for the Arrow writer):
    :data:`StreamArrowWriter` is whichever base fits.

Registering over an auto-discovered source (``kafka_source.register``) is done by trying it:
PySpark 4.0 refuses it with ``DATA_SOURCE_ALREADY_EXISTS``, 4.1 and later replace the source
(SPARK-51919); see :func:`kafka_source.register`.

Filter pushdown (``pushFilters``, PySpark 4.1) is not used yet; when it is, it is looked for
here too.

A PySpark older than 4.0 has no Python Data Source API with Arrow batches at all: importing the
package's Spark side then fails at once with an error that says so (:data:`MINIMUM_PYSPARK`),
as ``pip`` would have (``pyspark>=4.0``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The oldest PySpark the connector runs on, and why.
MINIMUM_PYSPARK = "4.0"
_WHY = ("the Python Data Source API with stream readers that yield Arrow record batches and "
        "Arrow writers, which came with PySpark 4.0")

try:
    from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter
except ImportError as exc:  # pragma: no cover - PySpark < 4.0 cannot be installed with the package
    try:
        import pyspark
        found = getattr(pyspark, "__version__", "unknown")
    except ImportError:
        found = "none"
    raise ImportError(f"pykafka needs PySpark {MINIMUM_PYSPARK} or later ({_WHY}); the "
                      f"installed PySpark is {found}. Install a newer one: pip install "
                      f"'pyspark>={MINIMUM_PYSPARK}'.") from exc

try:
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  ReadMinRows, SupportsTriggerAvailableNow)
    ADMISSION_CONTROL = True
except ImportError:
    ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-in for PySpark 4.2's ``ReadLimit``: how much one micro-batch may take."""

    @dataclass
    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        """Everything available."""

    @dataclass
    class ReadMinRows(ReadLimit):  # type: ignore[no-redef]
        """Wait until at least ``min_rows`` records are there."""

        min_rows: int

    @dataclass
    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        """At most ``max_rows`` records."""

        max_rows: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in for the 4.2 mixin: PySpark 4.0 and 4.1 never call
        ``prepareForTriggerAvailableNow``."""

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
    STREAM_ARROW_WRITER = True
    StreamArrowWriter: tuple[type, ...] = (DataSourceStreamArrowWriter,)
except ImportError:
    STREAM_ARROW_WRITER = False
    StreamArrowWriter = (DataSourceStreamWriter, DataSourceArrowWriter)

__all__ = ["ADMISSION_CONTROL", "MINIMUM_PYSPARK", "STREAM_ARROW_WRITER", "ReadAllAvailable",
           "ReadLimit", "ReadMaxRows", "ReadMinRows", "StreamArrowWriter",
           "SupportsTriggerAvailableNow"]
