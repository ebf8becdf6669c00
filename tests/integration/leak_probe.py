"""Child process of tests/integration/test_security.py: every channel a secret could leak to.

Run as ``python leak_probe.py SPEC.json`` with DEBUG logging already configured in every Python
process (the test puts a ``sitecustomize`` on PYTHONPATH). It starts its own SparkSession with
Spark's log at INFO and the event log on, reads and streams with secrets in the options, makes
reads fail on a wrong password or OAuth client secret, and prints each channel under a ``=== name`` heading on stdout:
``explain``, ``progress``, ``offsets``, ``exceptions``. Logs go to stderr; the checkpoint and
the event log to the directories the spec names. The test then looks for the secrets.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback

from pyspark.sql import SparkSession

import kafka_source


def load(spark, options, stream=False):
    reader = spark.readStream if stream else spark.read
    reader = reader.format("pykafka")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def explain(target, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        target.explain(*args)
    return out.getvalue()


def main(spec_path: str) -> None:
    spec = json.load(open(spec_path))
    topic = spec["topic"]
    spark = (SparkSession.builder.master("local[2]").appName("pykafka-leak-probe")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.eventLog.enabled", "true")
             .config("spark.eventLog.dir", spec["event_log"])
             .config("spark.eventLog.compress", "false")  # searchable as text
             .getOrCreate())
    spark.sparkContext.setLogLevel("INFO")
    kafka_source.register(spark)
    explained, exceptions = [], []

    # batch reads: SASL_SSL with PLAIN and PKCS12 stores; mutual TLS with an inline PEM key
    for name in ("sasl_ssl", "mtls_inline", "oauth"):
        df = load(spark, {**spec[name], "subscribe": topic})
        for mode in ("simple", "extended", "codegen", "cost", "formatted"):
            explained.append(explain(df, mode))
        assert df.count() > 0

    # a stream (a consumer-group member) with the same secrets, into a checkpoint
    sdf = load(spark, {**spec["sasl_ssl"], "subscribe": topic, "startingOffsets": "earliest",
                       "kafka.group.id": "leak-probe"}, stream=True)
    explained.append(explain(sdf, True))
    query = (sdf.writeStream.format("parquet").option("path", spec["out"])
             .option("checkpointLocation", spec["checkpoint"])
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    explained.append(explain(query, True))
    progress = [json.loads(p.json) for p in query.recentProgress]
    status = query.status

    # reads that fail: a wrong SASL password (batch and stream), a wrong store password, a
    # client secret the OAuth token endpoint refuses
    for action in (lambda: load(spark, {**spec["wrong_password"], "subscribe": topic}).collect(),
                   lambda: load(spark, {**spec["oauth_wrong_secret"], "subscribe": topic}
                                ).collect(),
                   lambda: load(spark, {**spec["wrong_store_password"], "subscribe": topic}),
                   lambda: load(spark, {**spec["wrong_password"], "subscribe": topic},
                                stream=True).writeStream.format("noop")
                   .trigger(availableNow=True).start().awaitTermination(240)):
        try:
            action()
            exceptions.append("NO EXCEPTION")
        except Exception as exc:  # noqa: BLE001 - every kind is printed
            exceptions.append(f"{exc!r}\n{exc}\n{traceback.format_exc()}")

    print("=== explain\n" + "\n".join(explained))
    last = query.lastProgress
    last = last.json if hasattr(last, "json") else json.dumps(last)
    print("=== progress\n" + json.dumps(progress) + "\n" + last + "\n" + json.dumps(status))
    print("=== offsets\n" + "\n".join(json.dumps(p["sources"]) for p in progress))
    print("=== exceptions\n" + "\n".join(exceptions))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
