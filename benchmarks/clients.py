"""Plain Kafka client read loops, the baselines pykafka is compared with.

Each loop runs in a fresh process started by ``run.py`` (``python clients.py SPEC_JSON``), so its
peak RSS is its own and nothing of the SparkSession in the parent competes for the GIL. It prints
one JSON line: seconds (from consumer creation to the last record, imports excluded), records,
value bytes and the process's peak RSS.

Both loops assign every partition from offset 0 (no consumer group, no commits), read until the
expected number of records has arrived, and touch every record's value (``len(value)``).
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


LOOPS = {"confluent-kafka": confluent_loop, "kafka-python": kafka_python_loop}


def main() -> int:
    import resource

    spec = json.loads(sys.argv[1])
    result = LOOPS[spec["client"]](spec)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
