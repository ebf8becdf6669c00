"""Batch and stream reads with ``format("pykafka")`` in a brand-new SparkSession that never
called ``kafka_source.register``: run in a fresh Python process by test_auto_registration.py
(classic Spark) and test_connect.py (Spark Connect).

    fresh_session_reads.py BOOTSTRAP TOPIC STREAM_OPTIONS_JSON [sc://host:port]

Prints ``imported kafka_source before register: <bool>``, ``batch <rows>``, ``stream <rows>``,
``registered batch <rows>`` (after an explicit ``kafka_source.register``, which must not clash
with the auto-registered source), ``session <class name>``.
"""

import json
import sys
import tempfile

from pyspark.sql import SparkSession

bootstrap, topic, stream_options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
remote = sys.argv[4] if len(sys.argv) > 4 else None

if remote:
    spark = SparkSession.builder.remote(remote).getOrCreate()
else:
    spark = (SparkSession.builder.master("local[2]").appName("fresh-session")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
print("session", type(spark).__module__ + "." + type(spark).__name__, flush=True)


def batch_rows() -> int:
    return (spark.read.format("pykafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).load().count())


print("batch", batch_rows(), flush=True)

reader = spark.readStream.format("pykafka")
for key, value in stream_options.items():
    reader = reader.option(key, value)
query = (reader.load().selectExpr("partition", "offset").writeStream.format("memory")
         .queryName("fresh_stream").option("checkpointLocation", tempfile.mkdtemp())
         .trigger(availableNow=True).start())
if not query.awaitTermination(180):
    query.stop()
    sys.exit("the AvailableNow query did not finish within 180 s")
if query.exception() is not None:
    sys.exit(f"the stream failed: {query.exception()}")
print("stream", spark.sql("SELECT count(*) FROM fresh_stream").collect()[0][0], flush=True)

# Nothing above imported the package in this process: the source came from auto-discovery.
print("imported kafka_source before register:", "kafka_source" in sys.modules, flush=True)

import kafka_source  # noqa: E402

kafka_source.register(spark)
print("registered batch", batch_rows(), flush=True)
spark.stop()
