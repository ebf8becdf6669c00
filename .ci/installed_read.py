"""Run by .ci/release-check with the interpreter of a clean venv that has only the built package
(and its dependencies) installed, from a directory outside the repository: writes 1,000 records
with df.write.format("pykafka") into a new topic of a Kafka broker started from KAFKA_HOME (the
harness ships in the package), reads them back with spark.read.format("pykafka") -- found by
PySpark's auto-discovery, no register() -- and checks every key and value.

    python installed_read.py --c-walk yes|no

--c-walk says whether the decoder's C record walk must be there (a wheel built with a compiler)
or must not (installed where no C compiler is).
"""

import argparse
import os
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--c-walk", choices=("yes", "no"), required=True)
args = parser.parse_args()

import kafka_source

here = Path(kafka_source.__file__).resolve()
assert "site-packages" in here.parts, f"kafka_source imported from {here}, not the install"
try:
    import kafka_source.wire.format._recwalk  # noqa: F401
    c_walk = "yes"
except ImportError:
    c_walk = "no"
assert c_walk == args.c_walk, f"C record walk present: {c_walk}, expected {args.c_walk}"

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
from pyspark.sql import SparkSession  # noqa: E402

from kafka_source.testing.brokers import LocalKafkaBroker, create_topic  # noqa: E402

N = 1000
with LocalKafkaBroker(os.environ["KAFKA_HOME"]) as broker:
    create_topic(broker.bootstrap_servers, "installed", partitions=3)
    spark = (SparkSession.builder.master("local[2]").appName("pykafka-installed")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    try:
        rows = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(N)]
        (spark.createDataFrame(rows, "key binary, value binary").write.format("pykafka")
         .option("kafka.bootstrap.servers", broker.bootstrap_servers)
         .option("topic", "installed").mode("append").save())
        df = (spark.read.format("pykafka")
              .option("kafka.bootstrap.servers", broker.bootstrap_servers)
              .option("subscribe", "installed").load())
        got = sorted((bytes(r.key), bytes(r.value)) for r in df.select("key", "value").collect())
        assert got == sorted(rows), (f"read back {len(got)} records, "
                                     f"{len(set(got) & set(rows))} of them written")
        partitions = {r.partition for r in df.select("partition").distinct().collect()}
    finally:
        spark.stop()
print(f"installed package {kafka_source.__version__} from {here.parent}: wrote and read back "
      f"{N} records over partitions {sorted(partitions)}; C record walk: {c_walk}")
