"""pykafka: a Kafka source and sink for Apache Spark on the Python Data Source API.

    df = (spark.read.format("pykafka")          # no registration step: see pyspark_pykafka.py
          .option("kafka.bootstrap.servers", "broker:9092")
          .option("subscribe", "events")
          .load())
    stream = spark.readStream.format("pykafka").option(...).option("kafka.group.id", "g").load()

    import kafka_source
    kafka_source.register(spark)                 # optional: the same, explicitly
    kafka_source.describe_group({"kafka.bootstrap.servers": "broker:9092"}, "g").total_lag

How a record travels, folder by folder:

    config/   options, client_config   parse and validate the user's options (driver)
    read/     offsets, planning        resolve offset ranges and split them into Spark tasks
              stream, admission        streams: each trigger's end offsets, rate limits
    group/    member, assignors        streams: consumer-group membership and commits (driver)
              status                   a group's members, committed offsets and lag (any side)
    read/     executor, fetcher        the fetch loop for a task's ranges (executor)
    wire/     client                   Kafka protocol requests: Metadata, ListOffsets, groups, ...
              fetch_connection,        the executors' Fetch connections: responses read into one
              fetch_protocol,          buffer and parsed in place, fetch sessions
              fetch_session
              records, fast_decode,    record batches -> Arrow columns: codecs, control records,
              codecs, arrow            transactions
    write/    writer, columns          the sink: df.write / df.writeStream (driver: checks, commit)
              task, routing,           a write task: each row's topic and partition (explicit,
              partitioner              murmur2 of the key as Java's producer, round-robin)
              producer                 batching, pipelined Produce, idempotence, transactions
              exactly_once             exactly-once streaming writes through transactions
    config/   sink_options,            the sink's options, and the producer's settings
              producer_settings
    wire/     encode                   Arrow columns -> record batches (the reverse of fast_decode)
    schema, datasource                 Spark's Kafka schema; the DataSource glue
    testing/                           brokers for the tests, the demo and the benchmarks

Importing this package starts nothing and opens no socket.
"""

__all__ = ["KafkaDataSource", "describe_group", "register"]
__version__ = "0.1.0"


# Spark sets it in the environment of every Python worker it starts (PythonWorkerFactory), and
# nowhere else: how kafka_source.worker_heap and .worker_imports know they run in one. Named here,
# in the module that imports nothing, so that the check below costs no import.
_SPARK_WORKER_VAR = "PYTHON_WORKER_FACTORY_SECRET"


def _in_spark_worker() -> bool:
    import os

    return _SPARK_WORKER_VAR in os.environ


# In Spark's Python workers only, before any of the connector's modules imports them: kafka-python's
# package __init__ imports its consumer, producer and admin client, which the connector never
# uses, and crc32c's looks up its own version on a path of large zips, in every worker that plans
# or runs a query (kafka_source.worker_imports).
if _in_spark_worker():
    from .worker_imports import defer_package_inits

    defer_package_inits()
    del defer_package_inits


def __getattr__(name):
    # Loaded on first use, so that importing a submodule (kafka_source.testing in a test
    # helper, the executor modules in a Python worker) does not pull in the Spark glue.
    if name == "KafkaDataSource":
        from .datasource import KafkaDataSource

        return KafkaDataSource
    if name == "describe_group":
        from .group.status import describe_group

        return describe_group
    raise AttributeError(f"module 'kafka_source' has no attribute {name!r}")


def register(spark) -> None:
    """Register the ``pykafka`` format with ``spark`` (remembering the session's default
    parallelism, which decides how many tasks small reads are packed into).

    Also keeps the values of secret options (``kafka.sasl.jaas.config``, passwords, keys) out of
    py4j's DEBUG log of this driver process (:mod:`kafka_source.config.secrets`).

    Harmless where the source was already found by auto-discovery and the session refuses to
    register over it (PySpark 4.0: ``DATA_SOURCE_ALREADY_EXISTS``; 4.1 and later replace it):
    ``format("pykafka")`` then goes on working as discovered, and only the default parallelism
    is not passed on (``maxPartitions`` then has no default)."""
    import logging

    from .config.client_config import SECRET_OPTIONS
    from .config.secrets import redact_py4j_option_logs
    from .datasource import KafkaDataSource

    from .formats.registry import SECRET_SETTINGS as REGISTRY_SECRETS

    redact_py4j_option_logs(SECRET_OPTIONS | set(REGISTRY_SECRETS))
    try:
        spark.dataSource.register(KafkaDataSource.for_session(spark))
    except Exception as exc:
        error_class = getattr(exc, "getErrorClass", lambda: None)()
        if error_class != "DATA_SOURCE_ALREADY_EXISTS" and \
                "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
        logging.getLogger(__name__).info(
            "format('pykafka') is already registered by PySpark's data source auto-discovery, "
            "and this Spark does not register over it (PySpark 4.0); it is used as discovered, "
            "without the session's default parallelism (set 'maxPartitions' to bound the "
            "number of tasks).")
