"""The benchmark's workloads and their topics: one topic per workload, value kind and broker,
filled with exactly the workload's records by confluent-kafka's producer, or reused when a topic
of that name already holds exactly those records (``run.py``, ``profile_read.py``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from payloads import value_pool
from report import MB, log
import write_bench



def count_label(n: int) -> str:
    for unit, div in (("m", 1_000_000), ("k", 1_000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


@dataclass
class Workload:
    name: str               # "none", "lz4", ..., "memory"
    codec: str              # librdkafka compression.type
    records: int
    size: int
    partitions: int
    values: str = "random"  # payloads.VALUE_KINDS
    broker: str = ""        # the broker's label ("4.0", "2.2", ...)
    topic: str = ""
    counts: dict[int, int] = field(default_factory=dict)   # partition -> records
    produced_s: float | None = None                          # None: topic reused
    log_bytes: int | None = None                             # size on disk (DescribeLogDirs)

    @property
    def base_topic(self) -> str:
        kind = "" if self.values == "random" else f"-{self.values}"
        return (f"bench-{count_label(self.records)}-{self.size}b-{self.partitions}p-"
                f"{self.codec}{kind}")

    @property
    def value_bytes(self) -> int:
        return self.records * self.size

    def ending_offsets(self) -> str:
        return json.dumps({self.topic: {str(p): n for p, n in self.counts.items()}})


def topic_matches(bootstrap: str, w: Workload, topic: str) -> tuple[bool, str]:
    """Does ``topic`` exist with exactly ``w``'s partitions and records (offsets 0..n-1)?

    Checks the partition count, that each partition's log starts at 0, that the record at
    offset n-1 exists with a value of ``w.size`` bytes, and that the high watermark of the fetch
    response is n (Tansu's ListOffsets(latest) is wrong for multi-record batches, its fetch high
    watermark is right)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "pykafka-bench-verify",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return False, f"not readable ({getattr(meta, 'error', None)})"
        if sorted(meta.partitions) != list(range(w.partitions)):
            return False, f"has {len(meta.partitions)} partitions, want {w.partitions}"
        tps = []
        for p, n in w.counts.items():
            low, _high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if low != 0:
                return False, f"partition {p} starts at {low}"
            if n > 0:
                tps.append(TopicPartition(topic, p, n - 1))
        if not tps:
            return True, "empty"
        consumer.assign(tps)
        seen: dict[int, object] = {}
        deadline = time.monotonic() + 30
        while len(seen) < len(tps) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=len(tps), timeout=1.0):
                if m.error() is None:
                    seen.setdefault(m.partition(), m)
        for tp in tps:
            m = seen.get(tp.partition)
            if m is None or m.offset() != tp.offset or len(m.value() or b"") != w.size:
                return False, f"partition {tp.partition}: no {w.size}-byte record at {tp.offset}"
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                        cached=True)
            if high != tp.offset + 1:
                return False, f"partition {tp.partition} ends at {high}, want {tp.offset + 1}"
        return True, "ok"
    finally:
        consumer.close()


def existing_topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def produce(bootstrap: str, w: Workload) -> float:
    """Write exactly ``w.counts[p]`` records to each partition p; returns seconds."""
    from confluent_kafka import Producer

    pool = value_pool(w.values, w.size, min(w.records, max(1, (16 << 20) // w.size), 16_384))
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "compression.type": w.codec,
        "linger.ms": 50,
        "batch.num.messages": 100_000,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "acks": "all",
        "enable.idempotence": False,
        "message.send.max.retries": 0,   # a retried batch could be written twice
    })
    t0 = time.perf_counter()
    parts, topic, produce_ = w.partitions, w.topic, producer.produce
    npool = len(pool)
    for i in range(w.records):
        while True:
            try:
                produce_(topic, pool[i % npool], partition=i % parts, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 20_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - t0
    del producer
    if remaining or errors:
        raise RuntimeError(f"producing to {topic}: {remaining} undelivered, "
                           f"{len(errors)} failed ({errors[:3]})")
    return elapsed


def prepare_topic(bootstrap: str, w: Workload, existing: set[str]) -> None:
    from kafka_source.testing import create_topic

    w.counts = {p: w.records // w.partitions + (1 if p < w.records % w.partitions else 0)
                for p in range(w.partitions)}
    for attempt in range(1, 50):
        name = w.base_topic if attempt == 1 else f"{w.base_topic}-{attempt}"
        if name in existing:
            ok, why = topic_matches(bootstrap, w, name)
            if ok:
                w.topic = name
                w.log_bytes = topic_log_bytes(bootstrap, w)
                log(f"topic {name}: exists with {w.records:,} records, reused")
                return
            log(f"topic {name}: exists but does not match ({why}); trying another name")
            continue
        w.topic = name
        create_topic(bootstrap, name, partitions=w.partitions)
        log(f"topic {name}: producing {w.records:,} x {w.size} B ({w.codec}) ...")
        w.produced_s = produce(bootstrap, w)
        ok, why = topic_matches(bootstrap, w, name)
        if not ok:
            raise RuntimeError(f"topic {name} after producing: {why}")
        w.log_bytes = topic_log_bytes(bootstrap, w)
        log(f"topic {name}: produced in {w.produced_s:.1f} s "
            f"({w.records / w.produced_s:,.0f} records/s), {compression_text(w)}")
        return
    raise RuntimeError(f"no usable topic name for {w.base_topic}")


def topic_log_bytes(bootstrap: str, w: Workload) -> int | None:
    """The topic's size on the broker's disk, or None when the broker does not say."""
    try:
        return write_bench.topic_facts(bootstrap, w.topic, w.partitions)["log_bytes"]
    except Exception:  # noqa: BLE001 - informative only
        return None


def compression_text(w: Workload) -> str:
    if not w.log_bytes:
        return "size on disk unknown"
    return (f"{w.value_bytes / MB:,.1f} MB of values, {w.log_bytes / MB:,.1f} MB on disk "
            f"({w.value_bytes / w.log_bytes:.1f}x)")
