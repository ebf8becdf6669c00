"""pykafka: a Kafka source for Apache Spark on the Python Data Source API.

    import kafka_source
    kafka_source.register(spark)
    df = (spark.read.format("pykafka")
          .option("kafka.bootstrap.servers", "broker:9092")
          .option("subscribe", "events")
          .load())

How a record travels, module by module:

    options, client_config  parse and validate the user's options (driver)
    offsets, planning       resolve offset ranges and split them into Spark tasks (driver)
    client                  Kafka protocol requests: Metadata, ListOffsets, Fetch
    executor, fetcher       the fetch loop for a task's ranges (executor)
    records, codecs         decode record batches: codecs, control records, transactions
    arrow, schema           records -> Arrow batches with Spark's Kafka schema
    batch, datasource       the Spark DataSource / DataSourceReader glue

Importing this package starts nothing and opens no socket.
"""

from .datasource import KafkaDataSource

__all__ = ["KafkaDataSource", "register"]
__version__ = "0.1.0"


def register(spark) -> None:
    """Register the ``pykafka`` format with ``spark``."""
    spark.dataSource.register(KafkaDataSource)
