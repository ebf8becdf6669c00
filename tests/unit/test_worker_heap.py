"""kafka_source.worker_heap: the first reader or writer unpickled in a reused Spark worker, or
built by the data source in one of Spark's planning workers, freezes the heap, so PySpark's
gc.collect() after each call skips it (again only after new imports, collecting first);
in any Spark worker on glibc it pins the allocator's thresholds, so a decoder's freed chunk
buffers are reused instead of being given back to the kernel and faulted in again.

Each case runs in a fresh interpreter: both are once per process and would otherwise change
the test process's own collector and allocator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from kafka_source import worker_heap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PROBE = textwrap.dedent("""
    import gc, json, pickle, sys
    from kafka_source.config.options import parse_batch_options
    from kafka_source.read.batch import KafkaBatchReader

    reader = KafkaBatchReader(parse_batch_options({
        "kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}))
    before = gc.get_freeze_count()
    pickle.loads(pickle.dumps(reader))            # what a Spark worker does with the command
    first = gc.get_freeze_count()
    class Cycle:                                  # garbage made after the freeze
        pass
    c = Cycle(); c.me = c; del c
    collected = gc.collect()
    pickle.loads(pickle.dumps(reader))            # a later task in the same worker
    print(json.dumps({"before": before, "first": first, "later": gc.get_freeze_count(),
                      "collected": collected}))
""")


def in_fresh_interpreter(script: str, env_extra: dict) -> dict:
    """Run ``script`` in a new interpreter whose environment has none of the variables the
    module looks at, plus ``env_extra``; returns the JSON of its last output line."""
    drop = ("SPARK_REUSE_WORKER", worker_heap._SPARK_WORKER_VAR,
            *worker_heap._OPERATOR_MALLOC_VARS)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe(reuse: str | None) -> dict:
    return in_fresh_interpreter(_PROBE, {} if reuse is None else {"SPARK_REUSE_WORKER": reuse})


def test_a_reused_worker_freezes_its_heap_once_at_the_first_unpickled_reader():
    seen = probe("1")
    assert seen["before"] == 0
    assert seen["first"] > 10_000                 # pyarrow, kafka-python, this package ...
    assert seen["later"] == seen["first"]         # not again: each task's cycles stay collectable
    assert seen["collected"] >= 1                 # garbage made afterwards is still collected


@pytest.mark.parametrize("reuse", [None, ""])
def test_any_other_process_is_left_as_it_is(reuse):
    seen = probe(reuse)
    assert seen["first"] == seen["later"] == 0


_RUNNER_PROBE = textwrap.dedent("""
    import gc, json, pickle, runpy, sys, types
    from kafka_source.config.options import parse_stream_options
    from kafka_source.read.stream import KafkaStreamReader

    # What `python -m pyspark.sql.streaming.python_streaming_source_runner` makes __main__
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=sys.argv[1])
    sys.modules["__main__"] = main
    reader = KafkaStreamReader(parse_stream_options({
        "kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}))
    before = gc.get_freeze_count()
    pickle.loads(pickle.dumps(reader))
    print(json.dumps({"before": before, "first": gc.get_freeze_count()}))
""")


@pytest.mark.parametrize("main, spark_worker, frozen", [
    (worker_heap.STREAMING_SOURCE_RUNNER, True, True),
    (worker_heap.STREAMING_SOURCE_RUNNER, False, False),     # not started by Spark
    ("pyspark.sql.worker.plan_data_source_read", True, False),
])
def test_the_drivers_streaming_source_runner_freezes_its_heap_too(main, spark_worker, frozen):
    """The driver side of a stream lives in its own long-lived process, started without the
    daemon (no SPARK_REUSE_WORKER): its first stream reader freezes the heap as a reused
    worker's first reader does; Spark's other Python processes are left as they are."""
    env = {worker_heap._SPARK_WORKER_VAR: "secret"} if spark_worker else {}
    script = _RUNNER_PROBE.replace("sys.argv[1]", repr(main))
    seen = in_fresh_interpreter(script, env)
    assert seen["before"] == 0
    assert (seen["first"] > 10_000) is frozen


_PLANNING_PROBE = textwrap.dedent("""
    import gc, json, pickle, sys, types
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType
    from kafka_source.datasource import KafkaDataSource

    case = json.loads(CASE)
    if case["main"]:                              # as `python -m <module>` makes __main__
        main = types.ModuleType("__main__")
        main.__spec__ = types.SimpleNamespace(name=case["main"])
        sys.modules["__main__"] = main
    ds = KafkaDataSource({"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"})
    schema = StructType([StructField("topic", StringType()), StructField("value", BinaryType())])
    job = pickle.dumps(ds)                        # what Spark sends the worker for each call
    counts = [gc.get_freeze_count()]
    for _ in range(2):                            # two calls to the same reused worker
        getattr(pickle.loads(job), case["method"])(schema, *case["args"])
        counts.append(gc.get_freeze_count())
    print(json.dumps({"counts": counts}))
""")

_REUSED = {"SPARK_REUSE_WORKER": "1"}


@pytest.mark.parametrize("method, args, main, env, frozen", [
    # pyspark.sql.worker.write_into_data_source: the stream writer, again every micro-batch;
    # python_streaming_sink_runner: the same, for the batch's commit
    ("streamWriter", [False], None, _REUSED, True),
    ("writer", [False], None, _REUSED, True),
    # pyspark.sql.worker.plan_data_source_read: a batch read's reader
    ("reader", [], None, _REUSED, True),
    # the driver's streaming source process builds its reader, never unpickles one
    ("streamReader", [], worker_heap.STREAMING_SOURCE_RUNNER,
     {worker_heap._SPARK_WORKER_VAR: "secret"}, True),
    # the user's own driver process
    ("streamWriter", [False], None, {}, False),
    ("streamReader", [], None, {}, False),
])
def test_the_planning_workers_freeze_once_the_data_source_built_their_object(
        method, args, main, env, frozen):
    """Spark's planning workers unpickle the data source and call it: the daemon collects after
    every call (the stream writer is built for every micro-batch), so the object the data
    source builds freezes the heap, once."""
    case = json.dumps({"method": method, "args": args, "main": main})
    script = _PLANNING_PROBE.replace("CASE", repr(case))
    before, first, second = in_fresh_interpreter(script, env)["counts"]
    assert before == 0
    if frozen:
        assert first > 10_000                     # pyspark, pyarrow, this package ...
        assert second == first                    # nothing new imported: not again
    else:
        assert first == second == 0


_REFREEZE_PROBE = textwrap.dedent("""
    import gc, json, pickle, sys, weakref
    from kafka_source.config.options import parse_batch_options
    from kafka_source.read.batch import KafkaBatchReader

    reader = KafkaBatchReader(parse_batch_options({
        "kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}))
    job = pickle.dumps(reader)
    pickle.loads(job)                             # the first task freezes
    first = gc.get_freeze_count()
    class Cycle:                                  # a task's garbage, waiting for a collection
        pass
    c = Cycle(); c.me = c; gone = weakref.ref(c); del c
    import xml.dom.minidom                        # a module first imported by a later task
    pickle.loads(job)                             # the next task
    print(json.dumps({"first": first, "second": gc.get_freeze_count(),
                      "garbage_collected": gone() is None}))
""")


def test_new_imports_are_frozen_at_the_next_task_and_garbage_never_is():
    seen = in_fresh_interpreter(_REFREEZE_PROBE, {"SPARK_REUSE_WORKER": "1"})
    assert seen["second"] > seen["first"] > 10_000
    assert seen["garbage_collected"]              # collected before the second freeze


# -- the allocator's thresholds ---------------------------------------------------------------

_CHURN = textwrap.dedent("""
    import json, pickle, resource
    from kafka_source.config.options import parse_batch_options
    from kafka_source.read.batch import KafkaBatchReader

    reader = KafkaBatchReader(parse_batch_options({
        "kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}))
    pickle.loads(pickle.dumps(reader))            # what a Spark worker does with the command

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    # An lz4 fetch response of 20 MB of values in 1 MB batches, decoded again and again.
    import struct
    import pyarrow as pa
    from kafka_source.wire.format.encode import encode_record_batches
    from kafka_source.wire.format.fast_decode import decode_to_arrow
    n, per = 200_000, 10_000
    values = pa.array([(b"id=%07d kind=view note=" % i).ljust(100, b"abcdefg"[i % 7:][:1])
                       for i in range(n)], pa.binary())
    batches = encode_record_batches(values, batch_starts=range(0, n, per), timestamp_ms=1,
                                    compression="lz4")
    response = bytearray()
    for b, first in zip(batches, range(0, n, per)):
        b = bytearray(b)
        struct.pack_into(">q", b, 0, first)       # base offsets one after the other
        response += b
    seen = []
    for _ in range(6):
        before = faults()
        result = decode_to_arrow(response, start_offset=0, end_offset=n, topic="t",
                                 partition=0, include_headers=False)
        assert result.count == n
        del result
        seen.append(faults() - before)
    print(json.dumps({"faults": seen}))
""")


def churn(env_extra: dict) -> list[int]:
    return in_fresh_interpreter(_CHURN, env_extra)["faults"]


PAGES_OF_VALUES = 20_000_000 // 4096    # the 200,000 100-byte values of one decode

glibc = pytest.mark.skipif(not worker_heap.on_glibc(), reason="mallopt is glibc's")


@glibc
def test_a_spark_worker_keeps_freed_chunk_memory_for_the_next_chunk():
    faults = churn({"PYTHON_WORKER_FACTORY_SECRET": "s"})
    # The first decode faults its buffers in; the later ones reuse them (seen: 0 or 1 faults).
    assert sum(faults[1:]) < PAGES_OF_VALUES // 10, faults


@glibc
@pytest.mark.parametrize("env", [{}, {"PYTHON_WORKER_FACTORY_SECRET": "s",
                                      "MALLOC_TRIM_THRESHOLD_": "131072"}],
                         ids=["not-a-spark-worker", "operator-set-threshold"])
def test_other_processes_keep_the_allocators_own_behaviour(env):
    faults = churn(env)
    # glibc gives the chunks' buffers back and takes them again: faulted in at every decode
    # (seen: 8,700 and 25,500 faults per decode after the first).
    assert min(faults[1:]) > PAGES_OF_VALUES // 2, faults


def test_pinning_needs_a_spark_worker_and_no_operator_setting():
    assert not worker_heap.pin_malloc_thresholds({})
    operator = {"PYTHON_WORKER_FACTORY_SECRET": "s",
                "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}
    assert not worker_heap.pin_malloc_thresholds(operator)
