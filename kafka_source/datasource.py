"""The Spark data source ``pykafka``: schema and readers, built from the user's options."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from .config.options import (_lower_keys, parse_batch_options, parse_bool, parse_stream_options,
                      validate_common_options)


class KafkaDataSource(DataSource):
    """Reads Kafka topics: ``spark.read.format("pykafka")`` / ``spark.readStream.format(...)``.

    Options and output schema are those of Spark's built-in ``format("kafka")`` source.
    """

    @classmethod
    def name(cls) -> str:
        return "pykafka"

    def schema(self) -> StructType:
        # Spark asks for the schema when the DataFrame is defined: fail there on bad options.
        validate_common_options(self.options)
        # Imported here, not at the top: pyspark_pykafka imports this module in every session's
        # data source lookup, and the schema module loads pyarrow.
        from .schema import spark_schema

        return spark_schema(parse_bool(_lower_keys(self.options), "includeHeaders", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        from .read.batch import KafkaBatchReader

        return KafkaBatchReader(parse_batch_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .read.stream import KafkaStreamReader

        return KafkaStreamReader(parse_stream_options(self.options))
