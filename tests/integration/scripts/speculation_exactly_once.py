"""An exactly-once stream in a SparkSession started with ``spark.speculation=true``: run in a
fresh Python process by test_sink.py (the setting can only be given when the SparkContext
starts, and a process has one).

    speculation_exactly_once.py BOOTSTRAP TOPIC

Writes one micro-batch of ``rate-micro-batch`` rows to TOPIC with ``exactlyOnce``, writes the
query's exception to ``error.txt`` in the working directory and prints ``failed <bool>``.
"""

import sys
import tempfile

from pyspark.sql import SparkSession

bootstrap, topic = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[2]").appName("speculation")
         .config("spark.speculation", "true").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
rows = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
        .selectExpr("CAST(value AS STRING) AS value"))
query = (rows.writeStream.format("pykafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic).option("exactlyOnce", "true")
         .option("checkpointLocation", tempfile.mkdtemp(prefix="speculation-"))
         .trigger(availableNow=True).start())
try:
    query.awaitTermination(120)
except Exception:  # noqa: BLE001 - the query's failure, also in query.exception()
    pass
error = query.exception()
with open("error.txt", "w") as f:
    f.write(str(error or ""))
print("failed", error is not None, flush=True)
spark.stop()
