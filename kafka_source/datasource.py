"""The Spark data source ``pykafka``: schema, readers and writers, built from the user's options."""

from __future__ import annotations

import dataclasses

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from .config.options import (_lower_keys, parse_batch_options, parse_bool, parse_stream_options,
                      validate_common_options)


class KafkaDataSource(DataSource):
    """Reads and writes Kafka topics: ``spark.read.format("pykafka")`` /
    ``spark.readStream.format(...)``, ``df.write.format("pykafka")`` / ``df.writeStream...``.

    Options, schema and input columns are those of Spark's built-in ``format("kafka")``.
    """

    # Spark's default parallelism (the cores), for planning how many tasks to make. The planner
    # runs in a Python worker that cannot ask Spark, so :func:`kafka_source.register` registers
    # a subclass that carries the value it saw in the user's session (see for_session).
    default_parallelism: int | None = None

    # Spark builds the data source in a planning worker for every load() and unpickles it in
    # one for every read it plans: on PySpark 4.0/4.1 each of those calls re-read every zip on
    # the path first (kafka_source.worker_imports). Once per process, in Spark's workers only.
    def __init__(self, options):
        super().__init__(options)
        _keep_zip_directories()

    def __setstate__(self, state):
        self.__dict__.update(state)
        _keep_zip_directories()

    @classmethod
    def for_session(cls, spark) -> type["KafkaDataSource"]:
        """This class, or a subclass carrying ``spark``'s default parallelism if it is known."""
        parallelism = _default_parallelism(spark)
        if parallelism is None:
            return cls
        return type(cls.__name__, (cls,), {"default_parallelism": parallelism,
                                           "__module__": cls.__module__,
                                           "__doc__": cls.__doc__})

    @classmethod
    def name(cls) -> str:
        return "pykafka"

    def schema(self) -> StructType:
        # Spark asks for the schema when the DataFrame is defined: fail there on bad options.
        validate_common_options(self.options)
        # Imported here, not at the top: pyspark_pykafka imports this module in every session's
        # data source lookup, and the schema module loads pyarrow.
        from .schema import spark_schema

        return spark_schema(parse_bool(_lower_keys(self.options), "includeHeaders", False),
                            self._formats())

    def _formats(self):
        """The key/value formats, their reader schemas settled (asking the Schema Registry)
        once: in ``schema()``, when the query is defined. Spark pickles this object after that
        call, so the readers planned from it read with the same schemas."""
        found = self.__dict__.get("_resolved_formats")
        if found is None:
            from .formats.options import resolve_formats

            opts = _lower_keys(self.options)
            found = self._resolved_formats = resolve_formats(opts, _topics_of(opts))
        return found

    def _with_formats(self, source):
        formats = self._formats()
        return dataclasses.replace(source, formats=formats) if formats.any else source

    def reader(self, schema: StructType) -> DataSourceReader:
        from .read.batch import KafkaBatchReader

        return _built(KafkaBatchReader(self._with_formats(parse_batch_options(self.options)),
                                       parallelism=self.default_parallelism))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .read.stream import KafkaStreamReader

        options = parse_stream_options(self.options)
        options = dataclasses.replace(options, source=self._with_formats(options.source))
        return _built(KafkaStreamReader(options, parallelism=self.default_parallelism))

    def writer(self, schema: StructType, overwrite: bool):
        """``df.write.format("pykafka").mode("append")``: see :mod:`kafka_source.write`."""
        from .write.writer import make_writer

        return _built(make_writer(self.options, schema, overwrite, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool):
        """``df.writeStream.format("pykafka")``: see :mod:`kafka_source.write`."""
        from .write.writer import make_writer

        return _built(make_writer(self.options, schema, overwrite, streaming=True))


def _topics_of(opts) -> list[str] | None:
    """The topics a subscription names when the query is defined (None for a pattern)."""
    from .config.options import parse_subscription

    sub = parse_subscription(opts)
    if sub.kind == "subscribe":
        return list(sub.topics)
    if sub.kind == "assign":
        return sorted({topic for topic, _ in sub.assignment})
    return None


def _built(obj):
    """``obj``, a reader or writer just built in the process that will use it: in Spark's
    planning workers, which the daemon collects after every call, freeze the heap now that the
    job's modules are imported (:func:`kafka_source.worker_heap.prepare`)."""
    from .worker_heap import prepare

    prepare()
    return obj


def _keep_zip_directories() -> None:
    from .worker_imports import keep_zip_directories

    keep_zip_directories()


def _default_parallelism(spark) -> int | None:
    """Spark's default parallelism of a session: ``sparkContext.defaultParallelism`` (classic
    Spark), else the ``spark.default.parallelism`` conf (e.g. Spark Connect), else None."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
        pass
    try:
        value = spark.conf.get("spark.default.parallelism", None)
        return max(1, int(value)) if value else None
    except Exception:  # noqa: BLE001
        return None
