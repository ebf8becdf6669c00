"""A local Spark Connect server for test_connect.py, as ``start-connect-server.sh`` would run
one: a classic session with Spark's Connect plugin on the given loopback port.

    connect_server.py PORT

Prints ``READY`` once it serves, then runs until its standard input is closed.
"""

import sys

from pyspark.sql import SparkSession

port = int(sys.argv[1])
spark = (SparkSession.builder.master("local[2]").appName("pykafka-connect-server")
         .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
         .config("spark.connect.grpc.binding.address", "127.0.0.1")
         .config("spark.connect.grpc.binding.port", str(port))
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .getOrCreate())
print("READY", flush=True)
sys.stdin.read()
spark.stop()
