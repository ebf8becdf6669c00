"""Plain Kafka client read loops, the baselines pykafka is compared with.

Each loop runs in a fresh process started by ``run.py`` (``python clients.py SPEC_JSON``), so its
peak RSS is its own and nothing of the SparkSession in the parent competes for the GIL. It prints
one JSON line: seconds (from consumer creation to the last record, imports excluded), records,
value bytes and the process's peak RSS.

Both loops assign every partition from offset 0 (no consumer group, no commits), read until the
expected number of records has arrived, and touch every record's value (``len(value)``).

The producer loops (``confluent-kafka-producer``, ``kafka-python-producer``, used by
``write_bench.py``) write ``records`` values of ``size`` bytes (``write_bench.producer_payload``:
the same values the pykafka DataFrame holds, built before the clock starts) to a topic that
``write_bench`` created beforehand, with the client's default settings except the compression
codec (and, for confluent-kafka, ``enable.idempotence`` when the spec asks for it): one
``produce``/``send`` per record, then ``flush()``. Timed from producer creation to the end of
``flush()``. They print the records handed to the client, the ones it reports undelivered, and the
producer settings that matter for the comparison (acks, idempotence, linger, batch size) as the
client resolved them. Whether exactly ``records`` arrived is checked by ``write_bench`` from the
topic's end offsets, not trusted to the client.
"""

from __future__ import annotations

import json
import sys
import time
import uuid


def confluent_loop(spec: dict) -> dict:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    expected, deadline_s = spec["records"], spec["timeout_s"]
    t0 = time.perf_counter()
    consumer = Consumer({
        "bootstrap.servers": spec["bootstrap"],
        "group.id": f"pykafka-bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "queued.min.messages": 1_000_000,
    })
    consumer.assign([TopicPartition(spec["topic"], p, 0) for p in spec["partitions"]])
    n = nbytes = 0
    last_progress = time.perf_counter()
    while n < expected:
        # consume() waits until it has num_messages or the timeout passed: never ask for more
        # than are still to come, or the last call would sit out the timeout.
        msgs = consumer.consume(num_messages=min(10_000, expected - n), timeout=1.0)
        if msgs:
            last_progress = time.perf_counter()
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == err._PARTITION_EOF:  # only with enable.partition.eof
                    continue
                raise KafkaException(err)
            n += 1
            nbytes += len(m.value())
        if time.perf_counter() - last_progress > deadline_s:
            break
    elapsed = time.perf_counter() - t0
    consumer.close()
    return {"seconds": elapsed, "records": n, "bytes": nbytes}


def kafka_python_loop(spec: dict) -> dict:
    from kafka import KafkaConsumer, TopicPartition

    expected, deadline_s = spec["records"], spec["timeout_s"]
    t0 = time.perf_counter()
    consumer = KafkaConsumer(bootstrap_servers=spec["bootstrap"], group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    tps = [TopicPartition(spec["topic"], p) for p in spec["partitions"]]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    n = nbytes = 0
    last_progress = time.perf_counter()
    while n < expected:
        polled = consumer.poll(timeout_ms=1000)
        if polled:
            last_progress = time.perf_counter()
        for msgs in polled.values():
            for m in msgs:
                n += 1
                nbytes += len(m.value)
        if time.perf_counter() - last_progress > deadline_s:
            break
    elapsed = time.perf_counter() - t0
    consumer.close()
    return {"seconds": elapsed, "records": n, "bytes": nbytes}


def confluent_producer_loop(spec: dict) -> dict:
    """A plain librdkafka producer loop: ``produce(topic, value)`` + ``poll(0)`` per record, a
    full local queue (BufferError) waits in ``poll``, then ``flush()``. librdkafka's defaults:
    acks=all, linger.ms=5, batch.size=1000000, sticky partitioning of unkeyed records,
    enable.idempotence=false unless the spec says otherwise. No per-record delivery callback
    (a user loop after throughput would not add one); failures show as undelivered (flush's
    remainder), as client errors (``error_cb``) and in the end-offset check."""
    from confluent_kafka import Producer

    import write_bench

    values, keys = write_bench.producer_payload(spec["records"], spec["size"], spec["keyed"])
    client_errors: list[str] = []
    config = {"bootstrap.servers": spec["bootstrap"], "compression.type": spec["codec"],
              "error_cb": lambda err: client_errors.append(str(err))}
    if spec.get("idempotence") is not None:
        config["enable.idempotence"] = bool(spec["idempotence"])
    topic, n, timeout_s = spec["topic"], len(values), spec["timeout_s"]
    t0 = time.perf_counter()
    producer = Producer(config)
    produce, poll = producer.produce, producer.poll
    for i in range(n):
        while True:
            try:
                if keys is None:
                    produce(topic, values[i])
                else:
                    produce(topic, values[i], keys[i])
                break
            except BufferError:
                poll(0.01)
        poll(0)
    undelivered = producer.flush(timeout_s)
    elapsed = time.perf_counter() - t0
    settings = {"acks": "all (librdkafka default)",
                "enable.idempotence": config.get("enable.idempotence", False),
                "linger.ms": 5, "batch.size": 1_000_000, "compression.type": spec["codec"]}
    del producer
    return {"seconds": elapsed, "sent": n, "undelivered": undelivered,
            "client_errors": client_errors[:5], "settings": settings}


def kafka_python_producer_loop(spec: dict) -> dict:
    """A plain kafka-python producer loop: ``send(topic, value)`` per record, then ``flush()``.
    kafka-python 3.0's defaults: acks=all, enable_idempotence=True, linger_ms=0,
    batch_size=16384; the codec as ``compression_type`` (None for "none")."""
    from kafka import KafkaProducer

    import write_bench

    values, keys = write_bench.producer_payload(spec["records"], spec["size"], spec["keyed"])
    codec = spec["codec"]
    topic, n, timeout_s = spec["topic"], len(values), spec["timeout_s"]
    t0 = time.perf_counter()
    producer = KafkaProducer(bootstrap_servers=spec["bootstrap"],
                             compression_type=None if codec == "none" else codec)
    send = producer.send
    futures = []
    keep = futures.append
    for i in range(n):
        # Keep every 10,000th future: each batch's futures fail together, so these sample every
        # batch that failed without holding a million futures.
        f = send(topic, values[i]) if keys is None else send(topic, values[i], keys[i])
        if i % 10_000 == 0:
            keep(f)
    producer.flush(timeout=timeout_s)
    elapsed = time.perf_counter() - t0
    failed = [repr(f.exception) for f in futures if f.failed()]
    cfg = producer.config
    settings = {k: cfg.get(k) for k in ("acks", "enable_idempotence", "linger_ms", "batch_size",
                                        "compression_type",
                                        "max_in_flight_requests_per_connection")}
    producer.close(timeout=10)
    return {"seconds": elapsed, "sent": n, "undelivered": None,
            "client_errors": failed[:5], "settings": settings}


LOOPS = {"confluent-kafka": confluent_loop, "kafka-python": kafka_python_loop,
         "confluent-kafka-producer": confluent_producer_loop,
         "kafka-python-producer": kafka_python_producer_loop}


def main() -> int:
    import resource

    spec = json.loads(sys.argv[1])
    result = LOOPS[spec["client"]](spec)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
