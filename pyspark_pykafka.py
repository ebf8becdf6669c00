"""``format("pykafka")`` with no registration step: PySpark's data source auto-discovery.

When a SparkSession meets a format name that no JVM source claims, PySpark starts one Python
worker (``pyspark/sql/worker/lookup_data_sources.py``) that imports every top-level module whose
name starts with ``pyspark_`` and registers its ``DefaultSource`` (a ``DataSource`` subclass)
under ``DefaultSource.name()``. ``pip install`` puts this module next to the ``kafka_source``
package (``py-modules`` in pyproject.toml), so ``spark.read.format("pykafka")`` and
``spark.readStream.format("pykafka")`` work in any fresh session, Spark Connect's included.
``kafka_source.register(spark)`` remains for sessions that want it explicit; registering the same
class again is harmless.

This module is imported by *every* session's lookup, whatever format it asks for, and an
exception here would break the lookup of all Python data sources. So it imports only the
``DataSource`` class, whose module loads option parsing and nothing else (no pyarrow, no
kafka-python, no socket): readers load when a query is planned.
"""

from kafka_source.datasource import KafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
