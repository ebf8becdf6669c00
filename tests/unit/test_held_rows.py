"""kafka_source.write.held_rows: a task's rows held in memory, then on local disk."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from kafka_source.write.held_rows import HeldRows, SpillError, spill_directory

pytestmark = pytest.mark.pyspark_free


def _batches(n: int, rows: int = 100, width: int = 50):
    return [pa.record_batch({"key": pa.array([b"k%d" % (i % 7) for i in range(rows)]),
                             "value": pa.array([b"%d-%d-" % (b, i) + b"x" * width
                                                for i in range(rows)])})
            for b in range(n)]


def _rows(batches):
    return [r for b in batches for r in b.to_pylist()]


@pytest.mark.parametrize("memory_batches", [0, 1, 3, 5])
def test_every_row_in_order_and_again(tmp_path, memory_batches):
    batches = _batches(5)
    limit = sum(b.nbytes for b in batches[:memory_batches])
    consumed = []

    def source():
        for b in batches:
            consumed.append(b)
            yield b

    with HeldRows(source(), limit, directory=str(tmp_path)) as held:
        assert len(consumed) == 5               # taken in full before anything else
        assert held.spilled_batches == 5 - memory_batches
        assert (held.path is not None) == (memory_batches < 5)
        assert held.spilled_bytes == sum(b.nbytes for b in batches[memory_batches:])
        if held.path is not None:
            assert os.path.dirname(held.path) == str(tmp_path)
            assert os.path.getsize(held.path) > 0
        first, second = _rows(held), _rows(held)
        assert first == second == _rows(batches)
        path = held.path
    assert held.path is None and (path is None or not os.path.exists(path))
    assert os.listdir(tmp_path) == []


def test_no_rows_hold_nothing(tmp_path):
    with HeldRows(iter([]), 0, directory=str(tmp_path)) as held:
        assert list(held) == [] and held.path is None


def test_spill_directory_is_sparks_first_existing_local_dir(tmp_path, monkeypatch):
    there = tmp_path / "local"
    there.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path / 'missing'},{there}")
    assert spill_directory() == str(there)
    with HeldRows(_batches(2), 0) as held:
        assert os.path.dirname(held.path) == str(there)
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    import tempfile
    assert spill_directory() == tempfile.gettempdir()


def test_a_directory_that_cannot_be_written_fails_naming_it(tmp_path):
    missing = str(tmp_path / "not-there")
    taken = []

    def source():
        for b in _batches(3):
            taken.append(b)
            yield b

    with pytest.raises(SpillError) as info:
        HeldRows(source(), 0, directory=missing)
    text = str(info.value)
    assert missing in text and "nothing was written" in text and "spark.local.dir" in text


def test_a_failing_disk_midway_leaves_no_file(tmp_path, monkeypatch):
    """The write fails after some batches (a full disk): an error naming the directory, and
    the partial file is deleted."""
    real = pa.ipc.RecordBatchStreamWriter.write_batch
    calls = []

    def failing(self, batch, *args, **kwargs):
        calls.append(batch)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, batch, *args, **kwargs)

    monkeypatch.setattr(pa.ipc.RecordBatchStreamWriter, "write_batch", failing)
    with pytest.raises(SpillError, match="No space left on device") as info:
        HeldRows(_batches(4), 0, directory=str(tmp_path))
    assert "after" in str(info.value) and str(tmp_path) in str(info.value)
    assert os.listdir(tmp_path) == []


def test_batches_of_another_schema_midway_fail(tmp_path):
    other = pa.record_batch({"value": pa.array([b"v"])})
    with pytest.raises(SpillError, match="changed their schema"):
        HeldRows(_batches(2) + [other], 0, directory=str(tmp_path))
    assert os.listdir(tmp_path) == []
