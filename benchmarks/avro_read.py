"""Avro values through a Schema Registry: pykafka's ``valueFormat`` avro against the user's usual
path today, on one real broker and registry, in one run.

    .venv/bin/python benchmarks/avro_read.py [--records 1000000] [--runs 3] [--brokers 4.0,2.2]

On each Kafka of ``--brokers`` in turn (4.0 in KRaft mode, 2.2 in ZooKeeper mode, from their
distributions as ``run.py`` finds them) with a registry on it (``SCHEMA_REGISTRY_HOME`` or
../shared/schema-registry): produces ``--records`` Avro records of about 12 fields (strings,
longs, doubles, an int, a timestamp, optional fields, a nested record, an array) with
confluent-kafka's ``AvroSerializer`` into a 4-partition topic, then times batch reads of the
whole topic, each ending in the same aggregate over decoded fields:

* ``pykafka avro``: ``valueFormat`` avro;
* ``binary + mapInArrow``: ``format("pykafka")`` binary values, decoded in ``mapInArrow`` by
  confluent-kafka's ``AvroDeserializer`` record by record, the rows turned into Arrow batches
  (what a PySpark user writes today: there is no registry-aware ``from_avro`` in PySpark);
* ``raw read``: binary values, ``sum(length(value))`` (the read alone).

Reported: records/s (median of ``--runs`` after a warm-up), the ratio of the first two, and the
decode cost per record (time above the raw read, per record). Also the decoder alone, in this
process, against fastavro's ``schemaless_reader`` per record.

Then the same for writing, from the decoded records cached in memory, each path to its own
topic: ``pykafka avro`` (``valueFormat`` avro on ``df.write``, the schema registered from the
column's type), ``mapInArrow + binary`` (confluent-kafka's ``AvroSerializer`` per record in
``mapInArrow``, then a binary write), and ``raw write`` (the already-encoded values written as
binary); the encode cost per record above the raw write; the write's floor (the struct and
the binary column handed to Python and dropped, and the struct encoded without a send); the
encoder alone against fastavro's ``schemaless_writer`` per record.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

ORDER = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "order_id", "type": "string"}, {"name": "customer_id", "type": "long"},
    {"name": "amount", "type": "double"}, {"name": "quantity", "type": "int"},
    {"name": "currency", "type": "string"}, {"name": "status", "type": "string"},
    {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "discount", "type": ["null", "double"], "default": None},
    {"name": "address", "type": {"type": "record", "name": "Addr", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": "string"},
        {"name": "lat", "type": "double"}]}},
    {"name": "items", "type": {"type": "array", "items": "string"}},
    {"name": "priority", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": None}]}


def record(i: int) -> dict:
    return {"order_id": f"o-{i:09d}", "customer_id": (i * 7919) % 10_000_019,
            "amount": (i % 10_000) / 7, "quantity": i % 9 + 1, "currency": "EUR",
            "status": ("NEW", "PAID", "SHIPPED")[i % 3], "created": 1_700_000_000_000 + i,
            "discount": None if i % 2 else 0.1,
            "address": {"city": ("Paris", "Lyon", "Nice")[i % 3], "zip": f"{i % 99_999:05d}",
                        "lat": 45.0 + (i % 100) / 100},
            "items": [f"sku-{j}" for j in range(i % 4)], "priority": i % 5,
            "note": None if i % 3 else "fragile"}


def produce(bootstrap: str, registry: str, topic: str, n: int) -> int:
    import fastavro
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(ORDER))
    first = ser(record(0), SerializationContext(topic, MessageField.VALUE))
    schema_id = struct.unpack(">i", first[1:5])[0]
    parsed = fastavro.parse_schema(ORDER)      # the same bytes, without the per-call overhead
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                         "batch.size": 1_000_000, "compression.type": "lz4",
                         "queue.buffering.max.messages": 1_000_000})
    header = b"\x00" + struct.pack(">i", schema_id)
    for i in range(n):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, record(i))
        while True:
            try:
                producer.produce(topic, header + out.getvalue(), partition=i % 4)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0
    return schema_id


def compare(what: str, cost: str, paths, args) -> None:
    """Time each of three (name, fn): pykafka's, the usual path, the raw baseline; print
    records/s, the ratio of the first two, and each one's cost per record above the third."""
    results = {}
    for name, fn in paths:
        med, times = timed(fn, args.runs)
        results[name] = med
        print(f"{what} {name:22s} {args.records / med:>12,.0f} records/s  median {med:.2f} s  "
              f"runs {', '.join(f'{x:.2f}' for x in times)}")
    (ours, _), (usual, _), (raw, _) = paths
    print(f"{what}: {ours} / {usual}: {results[usual] / results[ours]:.2f}x")
    for name in (ours, usual):
        per = (results[name] - results[raw]) / args.records * 1e9
        print(f"{cost} cost above the {raw}, {name}: {per:,.0f} ns/record (2 cores)")


def timed(fn, runs: int) -> tuple[float, list[float]]:
    fn()    # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--brokers", default="4.0,2.2",
                    help="Kafka releases to run on, in turn (default 4.0,2.2)")
    args = ap.parse_args()
    os.environ.setdefault("SCHEMA_REGISTRY_HOME",
                          str(HERE.parent.parent / "shared" / "schema-registry"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.path.insert(0, str(HERE))
    from run import find_distribution

    from kafka_source.testing.brokers import LocalKafkaBroker, LocalZkKafkaBroker
    from kafka_source.testing.registry import start_registry

    for version in args.brokers.split(","):
        home = find_distribution(version)
        if home is None:
            print(f"Kafka {version}: not run, no distribution of it found")
            continue
        zookeeper = tuple(int(x) for x in version.split(".")[:2]) < (3, 3)
        broker = (LocalZkKafkaBroker if zookeeper else LocalKafkaBroker)(home)
        broker.start()
        print(f"== Kafka {version} ({'ZooKeeper' if zookeeper else 'KRaft'}) at "
              f"{broker.bootstrap_servers}")
        registry = start_registry(broker.bootstrap_servers)
        try:
            run(broker.bootstrap_servers, registry.url, args)
        finally:
            registry.stop()
            broker.stop()


def run(bootstrap: str, registry: str, args) -> None:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from kafka_source.testing.brokers import create_topic

    topic = "bench-avro-orders"
    create_topic(bootstrap, topic, partitions=4)
    t = time.perf_counter()
    schema_id = produce(bootstrap, registry, topic, args.records)
    print(f"produced {args.records:,} Avro records (schema id {schema_id}) in "
          f"{time.perf_counter() - t:.1f} s")

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def load(**options):
        reader = (spark.read.format("pykafka").option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic))
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    agg = [F.sum("amount"), F.sum(F.length("order_id")), F.sum("quantity"),
           F.sum(F.size("items")), F.count("note")]

    def pykafka_avro():
        return load(valueFormat="avro", **{"schema.registry.url": registry}) \
            .select("value.*").agg(*agg).collect()

    schema_ddl = (load(valueFormat="avro", **{"schema.registry.url": registry})
                  .select("value.*").schema)

    from kafka_source.formats.avro import arrow_type, parse_schema

    struct = arrow_type(parse_schema(json.dumps(ORDER)))
    arrow_schema = pa.schema([struct.field(i) for i in range(struct.num_fields)])

    def udf_path():
        def decode(batches):
            from confluent_kafka.schema_registry import SchemaRegistryClient
            from confluent_kafka.schema_registry.avro import AvroDeserializer
            from confluent_kafka.serialization import MessageField, SerializationContext

            de = AvroDeserializer(SchemaRegistryClient({"url": registry}))
            ctx = SerializationContext(topic, MessageField.VALUE)
            for batch in batches:
                rows = [de(v, ctx) for v in batch.column(0).to_pylist()]
                yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)

        return load().select("value").mapInArrow(decode, schema_ddl).agg(*agg).collect()

    def raw():
        return load().agg(F.sum(F.length("value"))).collect()

    assert pykafka_avro() == udf_path(), "the two paths disagree"
    compare("read", "decode", (("pykafka avro", pykafka_avro),
                               ("binary + mapInArrow", udf_path), ("raw read", raw)), args)
    decoder_alone(args)
    writes(spark, load, bootstrap, registry, args)
    spark.stop()


def writes(spark, load, bootstrap: str, registry: str, args) -> None:
    import pyarrow as pa
    from pyspark.sql import functions as F

    from kafka_source.testing.brokers import create_topic

    decoded = (load(valueFormat="avro", **{"schema.registry.url": registry})
               .select("value").repartition(2).cache())
    encoded = load().select("value").repartition(2).cache()
    assert decoded.count() == encoded.count() == args.records
    topics = {name: f"bench-avro-write-{name}" for name in ("pykafka", "udf", "raw")}
    for t in topics.values():
        create_topic(bootstrap, t, partitions=4)

    def write(df, topic, **options):
        w = (df.write.format("pykafka").mode("append")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
             .option("kafka.linger.ms", "20"))
        for k, v in options.items():
            w = w.option(k, v)
        w.save()

    def pykafka_avro():
        write(decoded, topics["pykafka"], valueFormat="avro", valueRecordName="bench.Order",
              **{"schema.registry.url": registry})

    def udf_path():
        subject_topic = topics["udf"]

        def encode(batches):
            from confluent_kafka.schema_registry import SchemaRegistryClient
            from confluent_kafka.schema_registry.avro import AvroSerializer
            from confluent_kafka.serialization import MessageField, SerializationContext

            ser = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(ORDER))
            ctx = SerializationContext(subject_topic, MessageField.VALUE)
            for batch in batches:
                rows = batch.column(0).to_pylist()
                yield pa.RecordBatch.from_arrays(
                    [pa.array([ser(r, ctx) for r in rows], pa.binary())], names=["value"])

        write(decoded.mapInArrow(encode, "value binary"), topics["udf"])

    def raw():
        write(encoded, topics["raw"])

    compare("write", "encode", (("pykafka avro", pykafka_avro),
                                ("mapInArrow + binary", udf_path), ("raw write", raw)), args)
    written = (spark.read.format("pykafka").option("kafka.bootstrap.servers", bootstrap)
               .option("subscribe", topics["pykafka"]).option("valueFormat", "avro")
               .option("schema.registry.url", registry).load()
               .agg(F.count("value.order_id")).collect()[0][0])
    assert written == args.records * (args.runs + 1), written     # a warm-up, then the runs
    print(f"pykafka avro: {written:,} records written read back as Avro")
    write_floor(decoded, encoded, args)
    encoder_alone(args)


def write_floor(decoded, encoded, args) -> None:
    """What the write costs before the sink does anything: Spark handing the cached struct
    column to Python (in ``mapInArrow``, the same JVM-to-Arrow path as the sink's writer) and
    dropping it, against the same for the encoded binary column; then the struct handed over
    and encoded by the sink's :class:`BatchEncoder` (no send). The first minus the second is
    what the struct's conversion costs above the raw write's; the third minus the first is the
    encoder's share of the write."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    writer = json.dumps(_derived_schema(decoded))

    def drop(batches):
        n = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], names=["n"])

    def encode(batches):
        from kafka_source.formats.sink import BatchEncoder, ColumnEncoding, SinkFormats

        enc = ColumnEncoding(column="value", format="avro", registry=object(),
                             writer_schema=writer, settled=(("t", 1, writer),))
        encoder = BatchEncoder(SinkFormats(value=enc), "t", None)
        yield from drop(encoder.encode(b) for b in batches)

    for name, df, fn in (("struct column to Python", decoded, drop),
                         ("binary column to Python", encoded, drop),
                         ("struct column to Python, encoded", decoded, encode)):
        med, _ = timed(lambda: df.mapInArrow(fn, "n long").agg(F.sum("n")).collect(),
                       args.runs)
        print(f"write floor: {name:34s} {med / args.records * 1e9:>7,.0f} ns/record "
              "(2 cores, no send)")


def _derived_schema(df):
    from kafka_source.formats.avro.schema import avro_schema_of

    return avro_schema_of(df.schema["value"].dataType, "Order", "bench")


def encoder_alone(args) -> None:
    import fastavro
    import pyarrow as pa

    from kafka_source.formats.avro import arrow_type, parse_schema
    from kafka_source.formats.avro.encode import AvroEncoder

    n = min(args.records, 200_000)
    rows = [record(i) for i in range(n)]
    node = parse_schema(json.dumps(ORDER))
    t = arrow_type(node)
    import datetime as dt

    column = pa.array([{**r, "created": dt.datetime.fromtimestamp(r["created"] / 1000,
                                                                   dt.timezone.utc)}
                       for r in rows], type=t)
    encoder = AvroEncoder(node, t)
    med, _ = timed(lambda: encoder.encode(column)[0].to_arrow(), args.runs)
    parsed = fastavro.parse_schema(ORDER)

    def per_record():
        for r in rows:
            out = io.BytesIO()
            fastavro.schemaless_writer(out, parsed, r)
    fmed, _ = timed(per_record, args.runs)
    body, _ = encoder.encode(column)
    first = body.to_arrow()[0].as_py()
    assert fastavro.schemaless_reader(io.BytesIO(first), parsed, parsed)["order_id"] == \
        rows[0]["order_id"]
    print(f"encoder alone (one core, {n:,} records): {med / n * 1e9:,.0f} ns/record; fastavro "
          f"schemaless_writer per record: {fmed / n * 1e9:,.0f} ns/record ({fmed / med:.1f}x)")


def decoder_alone(args) -> None:
    import fastavro
    import pyarrow as pa

    from kafka_source.formats.avro import AvroColumnDecoder

    n = min(args.records, 200_000)
    parsed = fastavro.parse_schema(ORDER)
    bodies = []
    for i in range(n):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, record(i))
        bodies.append(out.getvalue())
    column = pa.array([b"\x00\x00\x00\x00\x01" + b for b in bodies], pa.binary())
    decoder = AvroColumnDecoder(json.dumps(ORDER), lambda i: json.dumps(ORDER))
    med, _ = timed(lambda: decoder.decode(column), args.runs)
    fmed, _ = timed(lambda: [fastavro.schemaless_reader(io.BytesIO(b), parsed, parsed)
                             for b in bodies], args.runs)
    print(f"decoder alone (one core, {n:,} records): {med / n * 1e9:,.0f} ns/record; fastavro "
          f"schemaless_reader per record: {fmed / n * 1e9:,.0f} ns/record ({fmed / med:.1f}x)")


if __name__ == "__main__":
    main()
