"""kafka_source.spark_features: what the installed PySpark offers, found by import; a PySpark
without the Python Data Source API refused at import, naming the minimum; register() on 4.0."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kafka_source
from kafka_source import spark_features

ROOT = Path(__file__).resolve().parents[2]


def test_features_are_what_the_installed_pyspark_can_import():
    has_module = importlib.util.find_spec("pyspark.sql.streaming.datasource") is not None
    assert spark_features.ADMISSION_CONTROL == has_module
    import pyspark.sql.datasource as ds

    assert spark_features.STREAM_ARROW_WRITER == hasattr(ds, "DataSourceStreamArrowWriter")
    if spark_features.STREAM_ARROW_WRITER:
        assert spark_features.StreamArrowWriter == (ds.DataSourceStreamArrowWriter,)
    else:   # PySpark 4.0: the row stream writer that is also an Arrow writer
        assert spark_features.StreamArrowWriter == (ds.DataSourceStreamWriter,
                                                    ds.DataSourceArrowWriter)
    from kafka_source.write.writer import KafkaStreamWriter

    assert all(issubclass(KafkaStreamWriter, base) for base in spark_features.StreamArrowWriter)
    # the limits have the fields the reader reads, on every version
    assert spark_features.ReadMaxRows(5).max_rows == 5
    assert spark_features.ReadMinRows(3).min_rows == 3


def test_a_pyspark_without_the_data_source_api_is_refused_at_import(tmp_path):
    stub = tmp_path / "pyspark"
    (stub / "sql").mkdir(parents=True)
    (stub / "__init__.py").write_text("__version__ = '3.5.1'\n")
    (stub / "sql" / "__init__.py").write_text("")
    code = textwrap.dedent("""
        import sys
        sys.path[:0] = [sys.argv[1], sys.argv[2]]
        try:
            import kafka_source.spark_features
        except ImportError as exc:
            print(exc)
        else:
            print("imported")
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    assert out.startswith("pykafka needs PySpark 4.0 or later"), out
    assert "the installed PySpark is 3.5.1" in out and "pip install 'pyspark>=4.0'" in out


class _Refused(Exception):
    def __init__(self, error_class):
        super().__init__(f"[{error_class}] ...")
        self._error_class = error_class

    def getErrorClass(self):
        return self._error_class


class _Session:
    def __init__(self, error=None):
        self.registered = []
        self.error = error
        self.dataSource = self
        self.sparkContext = None

    def register(self, cls):
        if self.error is not None:
            raise self.error
        self.registered.append(cls)


def test_register_where_spark_refuses_to_register_over_the_discovered_source(caplog):
    # PySpark 4.0: DATA_SOURCE_ALREADY_EXISTS when auto-discovery found the source first
    with caplog.at_level(logging.INFO):
        kafka_source.register(_Session(_Refused("DATA_SOURCE_ALREADY_EXISTS")))
    assert "used as discovered" in caplog.text
    with pytest.raises(_Refused):
        kafka_source.register(_Session(_Refused("SOMETHING_ELSE")))
    session = _Session()
    kafka_source.register(session)
    assert [c.name() for c in session.registered] == ["pykafka"]
