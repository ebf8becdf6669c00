"""kafka_source.worker_imports: zip archives' directories kept across Spark's per-task
``importlib.invalidate_caches()`` (PySpark 4.0/4.1), and read again when the archive changes."""

from __future__ import annotations

import os
import zipfile
import zipimport

import pytest

from kafka_source import worker_imports

pytestmark = pytest.mark.pyspark_free


def _write_zip(path, modules):
    with zipfile.ZipFile(path, "w") as z:
        for name in modules:
            z.writestr(f"{name}.py", f"NAME = {name!r}\n")


@pytest.fixture
def importer_class():
    """A subclass of zipimporter to patch, so that the test process's own importer is left be."""
    class Importer(zipimport.zipimporter):
        pass

    worker_imports.patch_zipimporter(Importer)
    return Importer


@pytest.fixture
def reads(monkeypatch):
    """How often zipimport reads an archive's central directory."""
    count = {"n": 0}
    original = zipimport._read_directory

    def counting(archive):
        count["n"] += 1
        return original(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counting)
    return count


def test_an_unchanged_archive_is_not_read_again_on_every_invalidation(tmp_path, importer_class,
                                                                        reads):
    archive = tmp_path / "lib.zip"
    _write_zip(archive, ["mod_a"])
    importer = importer_class(str(archive))
    importer.invalidate_caches()
    assert importer.find_spec("mod_a") is not None
    settled = reads["n"]
    assert settled >= 1
    for _ in range(5):                  # what PySpark 4.0 does before every task
        importer.invalidate_caches()
        assert importer.find_spec("mod_a") is not None
    assert reads["n"] == settled
    # Another importer of the same archive (one per package imported from a zip) too.
    other = importer_class(str(archive))
    other.invalidate_caches()
    assert other.find_spec("mod_a") is not None
    assert reads["n"] == settled


def test_a_changed_archive_is_read_again(tmp_path, importer_class, reads):
    archive = tmp_path / "lib.zip"
    _write_zip(archive, ["mod_a"])
    importer = importer_class(str(archive))
    importer.invalidate_caches()
    assert importer.find_spec("mod_b") is None
    before = reads["n"]
    _write_zip(archive, ["mod_a", "mod_b"])   # a new file: another inode, size and mtime
    importer.invalidate_caches()
    assert importer.find_spec("mod_b") is not None
    assert reads["n"] == before + 1


def test_an_archive_gone_from_disk_is_handled_as_zipimport_does(tmp_path, importer_class):
    archive = tmp_path / "lib.zip"
    _write_zip(archive, ["mod_a"])
    importer = importer_class(str(archive))
    importer.invalidate_caches()
    os.remove(archive)
    importer.invalidate_caches()            # no stat: the original decides, as without the patch
    assert importer.find_spec("mod_a") is None


def test_patching_twice_wraps_once(importer_class):
    patched = importer_class.invalidate_caches
    worker_imports.patch_zipimporter(importer_class)
    assert importer_class.invalidate_caches is patched


def test_nothing_changes_outside_spark_workers(monkeypatch):
    monkeypatch.setattr(worker_imports, "_done", False)
    original = zipimport.zipimporter.invalidate_caches
    assert worker_imports.keep_zip_directories(environ={}) is False
    assert zipimport.zipimporter.invalidate_caches is original


def test_a_spark_worker_patches_zipimporter_once(monkeypatch):
    monkeypatch.setattr(worker_imports, "_done", False)
    calls = []
    monkeypatch.setattr(worker_imports, "patch_zipimporter", lambda: calls.append(1))
    env = {"PYTHON_WORKER_FACTORY_SECRET": "x"}
    assert worker_imports.keep_zip_directories(environ=env) is True
    assert worker_imports.keep_zip_directories(environ=env) is True
    assert calls == [1]
