"""What restarting a query over a Python streaming source leaves in Spark's driver JVM, without
Kafka and without pykafka: a trivial source (one row per micro-batch) into the noop sink,
started and stopped ``N`` times in one session.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/python_source_restarts.py 6

After each start it prints the driver JVM's "Idle Worker Monitor" threads, all its threads,
its sockets, its epoll instances and all its file descriptors (from ``/proc``). The soak
(``soak.py``) saw the JVM's descriptors and threads grow with the restarts of one of its
queries; this tells Spark's share apart from the connector's. Linux only.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


class TrivialSource(DataSource):
    @classmethod
    def name(cls):
        return "trivial"

    def schema(self):
        return "v long"

    def streamReader(self, schema):
        return TrivialReader()


class TrivialReader(DataSourceStreamReader):
    def initialOffset(self):
        return {"o": 0}

    def latestOffset(self, *args):          # 4.0/4.1: no arguments; 4.2+: start and limit
        return {"o": int(time.time())}

    def partitions(self, start, end):
        return [InputPartition(0)]

    def read(self, partition):
        yield (1,)

    def commit(self, end):
        pass


def jvm_figures(pid: int) -> dict:
    names = []
    for path in glob.glob(f"/proc/{pid}/task/*/comm"):
        try:
            with open(path) as f:
                names.append(f.read().strip())
        except OSError:
            pass                                # a thread that ended meanwhile
    fds = []
    for path in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            fds.append(os.readlink(path))
        except OSError:
            pass
    return {"idle_worker_monitors": sum(n.startswith("Idle Worker Mon") for n in names),
            "threads": len(names), "sockets": sum(f.startswith("socket:") for f in fds),
            "epolls": sum("eventpoll" in f for f in fds), "fds": len(fds)}


def main(starts: int) -> None:
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(TrivialSource)
    pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    checkpoint = tempfile.mkdtemp(prefix="python-source-restarts-")
    print("before the first start:", jvm_figures(pid), flush=True)
    for i in range(starts):
        query = (spark.readStream.format("trivial").load().writeStream.format("noop")
                 .option("checkpointLocation", checkpoint)
                 .trigger(processingTime="1 second").start())
        while len(query.recentProgress) < 2:
            time.sleep(0.2)
        query.stop()
        time.sleep(1)
        print(f"after start {i + 1}:", jvm_figures(pid), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
