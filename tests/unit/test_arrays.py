"""Arrow arrays without pandas (:mod:`kafka_source.wire.format.arrays`): the columns the
decoder and the sink build, and that a new Python worker encoding, routing, sending and
decoding records never imports pandas (0.25-0.35 s of CPU in every new worker)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from kafka_source.wire.format.arrays import EMPTY_BINARY, from_numpy, strings, to_numpy, valid_mask

ROOT = Path(__file__).resolve().parents[2]


def test_from_numpy_keeps_type_values_and_memory():
    for dtype, arrow in ((np.int32, pa.int32()), (np.int64, pa.int64()), (np.uint8, pa.uint8()),
                         (np.float64, pa.float64())):
        values = np.arange(5, dtype=dtype)
        array = from_numpy(values)
        assert array.type == arrow and array.null_count == 0
        assert array.to_pylist() == values.tolist()
    values = np.arange(1000, dtype=np.int64)
    assert from_numpy(values).buffers()[1].address == values.ctypes.data   # no copy


def test_from_numpy_copies_a_strided_array_and_rejects_what_is_not_numbers():
    assert from_numpy(np.arange(10, dtype=np.int64)[::3]).to_pylist() == [0, 3, 6, 9]
    for bad in (np.zeros(3, dtype=bool), np.zeros((2, 2), dtype=np.int32),
                np.array(["a"], dtype=object)):
        with pytest.raises(TypeError, match="1-D array of numbers"):
            from_numpy(bad)


def test_strings_and_the_empty_binary_scalar():
    items = ["", "a", "é", "x" * 300]
    array = strings(items)
    assert array.type == pa.string() and array.to_pylist() == items
    assert strings([]).equals(pa.array([], pa.string()))
    assert EMPTY_BINARY.as_py() == b"" and EMPTY_BINARY.type == pa.binary()


def test_to_numpy_and_valid_mask_agree_with_pyarrow_on_slices_nulls_and_booleans():
    values = [None if i % 5 == 0 else i - 20 for i in range(43)]
    for arrow in (pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.float64()):
        full = pa.array([None if v is None else abs(v) for v in values], arrow)
        for array in (full, full.slice(3), full.slice(7, 20), full.slice(10, 0)):
            expected = array.to_pylist()
            assert valid_mask(array).tolist() == [v is not None for v in expected]
            fill = 7 if pa.types.is_unsigned_integer(arrow) else -1
            got = to_numpy(array, null=fill)
            assert got.dtype == array.type.to_pandas_dtype()
            assert got.tolist() == [fill if v is None else v for v in expected]
    flags = pa.array([None if i % 4 == 0 else i % 3 == 0 for i in range(37)])
    for array in (flags, flags.slice(5), flags.slice(9, 11)):
        expected = array.to_pylist()
        assert to_numpy(array, null=False).tolist() == [bool(v) for v in expected]
        assert valid_mask(array).tolist() == [v is not None for v in expected]
    assert to_numpy(pa.chunked_array([pa.array([1, 2]), pa.array([3])])).tolist() == [1, 2, 3]
    assert valid_mask(pa.nulls(3)).tolist() == [False] * 3
    no_nulls = pa.array(np.arange(4, dtype=np.int32))
    assert to_numpy(no_nulls).base is not None          # over the Arrow memory
    with pytest.raises(TypeError, match="integer, floating point or boolean"):
        to_numpy(pa.array(["a"]))


_NEW_WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import pyarrow as pa
    from kafka_source.wire.format.arrays import from_numpy, strings
    from kafka_source.config.producer_settings import ProducerSettings
    from kafka_source.wire.format.encode import encode_record_batch
    from kafka_source.wire.format.fast_decode import decode_to_arrow
    from kafka_source.write.columns import Columns
    from kafka_source.write.partitioner import partitions_for_keys
    from kafka_source.write.producer import Producer
    from kafka_source.write.task import send_batches
    from tests.unit.fake_produce_cluster import FakeProduceCluster

    n = 200
    values = strings([f"value {i}" for i in range(n)]).view(pa.binary())
    keys = strings([f"key {i % 7}" for i in range(n)]).view(pa.binary())
    counts = np.arange(n, dtype=np.int32) % 3            # 0, 1 or 2 headers per record
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    entries = pa.StructArray.from_arrays(
        [strings([("é" if j % 2 else "h") for j in range(total)]),
         strings([str(j) for j in range(total)]).view(pa.binary())], names=["key", "value"])
    headers = pa.ListArray.from_arrays(from_numpy(offsets), entries)

    # the sink: routing by key, grouping by partition, batching, encoding, sending
    cluster = FakeProduceCluster({"t": 4})
    producer = Producer({}, ProducerSettings(compression_type="lz4"), client=cluster,
                        clock=cluster.clock)
    batch = pa.RecordBatch.from_arrays([keys, values, headers], names=["key", "value", "h"])
    sent = send_batches([batch], producer, Columns(key="key", headers="h"), "t",
                        partitions_for_keys)
    producer.flush()
    # the decoder: a batch with keys and headers, back to Arrow
    data = encode_record_batch(values, keys, headers, timestamp_ms=1_700_000_000_000,
                               compression="lz4")
    decoded = decode_to_arrow(data, start_offset=0, end_offset=n, topic="t", partition=3,
                              include_headers=True).batches
    pandas = "pandas" in sys.modules
    rows = [r for b in decoded for r in b.to_pylist()]
    logged = sum(len(log.records) for log in cluster.logs.values())
    print(json.dumps({"pandas": pandas, "sent": sent, "logged": logged, "decoded": len(rows),
                      "first": [rows[2]["value"].decode(), rows[2]["partition"],
                                [[h["key"], h["value"].decode()] for h in rows[2]["headers"]]]}))
""")


def test_a_new_worker_sending_and_decoding_records_does_not_import_pandas():
    pytest.importorskip("pandas")       # installed: pa.array would import it
    out = subprocess.run([sys.executable, "-c", _NEW_WORKER], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sent"] == result["logged"] == result["decoded"] == 200
    assert result["first"] == ["value 2", 3, [["é", "1"], ["h", "2"]]]
    assert result["pandas"] is False
