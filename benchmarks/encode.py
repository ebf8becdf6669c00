"""Micro-benchmark of the sink's pure building blocks: the record-batch encoder and the
partitioner (no broker, one thread).

    .venv/bin/python benchmarks/encode.py            # ~30 s
    .venv/bin/python benchmarks/encode.py --quick

Prints records (keys) per second, best of ``--runs`` timings, for 100-byte values (random
printable bytes), with and without 10-byte keys, at several batch sizes; compressed batches;
encode_record_batches with many small batches (what a producer writing many partitions does);
record_sizes; murmur2 / partitions_for_keys.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kafka_source.wire.format.encode import (  # noqa: E402
    encode_record_batch,
    encode_record_batches,
    record_sizes,
)
from kafka_source.write.partitioner import partitions_for_keys  # noqa: E402

_RNG = np.random.default_rng(1)
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def column(n: int, size: int) -> pa.Array:
    data = _RNG.integers(32, 127, n * size, dtype=np.uint8)
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])


def best(fn, reps: int, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    return min(times)


def report(label: str, count: int, seconds: float) -> None:
    print(f"{label:<58} {count / seconds / 1e6:7.2f} M/s  ({seconds * 1e3:8.3f} ms per call)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--value-size", type=int, default=100)
    args = ap.parse_args()
    runs = 2 if args.quick else args.runs
    scale = 0.2 if args.quick else 1.0
    vs = args.value_size

    def reps(n):
        return max(1, int(scale * 200_000 / n))

    print(f"encode_record_batch, {vs}-byte values, uncompressed")
    for n in (100, 1000, 10_000, 100_000):
        values, keys = column(n, vs), column(n, 10)
        report(f"  {n:>6} records per batch, no keys", n,
               best(lambda: encode_record_batch(values, timestamp_ms=1), reps(n), runs))
        report(f"  {n:>6} records per batch, 10-byte keys", n,
               best(lambda: encode_record_batch(values, keys, timestamp_ms=1), reps(n), runs))
    n = 10_000
    values, keys = column(n, vs), column(n, 10)
    headers = pa.array([[{"key": "trace-id", "value": b"0123456789abcdef"}]] * n,
                       type=HEADER_TYPE)
    report("  10000 records per batch, keys, one header each", n,
           best(lambda: encode_record_batch(values, keys, headers, timestamp_ms=1), reps(n), runs))

    print(f"encode_record_batch, 10000 records of {vs} bytes with 10-byte keys, compressed")
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        report(f"  {codec}", n, best(lambda: encode_record_batch(
            values, keys, timestamp_ms=1, compression=codec), max(1, reps(n) // 4), runs))

    print("encode_record_batches (many batches in one call), uncompressed, 10-byte keys")
    for per, nb in ((100, 100), (1000, 10)):
        total = per * nb
        values, keys = column(total, vs), column(total, 10)
        starts = np.arange(0, total, per)
        report(f"  {nb} batches of {per} records", total, best(
            lambda: encode_record_batches(values, keys, batch_starts=starts, timestamp_ms=1),
            reps(total), runs))

    print("record_sizes")
    n = 100_000
    values, keys = column(n, vs), column(n, 10)
    report("  100000 records, 10-byte keys", n,
           best(lambda: record_sizes(values, keys), reps(n), runs))

    print("partitions_for_keys (murmur2), 1,000,000 keys, 12 partitions")
    n = 1_000_000
    for label, arr in (("  'key-<i>' (5-10 bytes)", pa.array([b"key-%d" % i for i in range(n)])),
                       ("  36-byte UUID strings", column(n, 36))):
        report(label, n, best(lambda: partitions_for_keys(arr, 12), 1, runs))


if __name__ == "__main__":
    main()
