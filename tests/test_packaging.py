"""What ``pip install`` ships for PySpark's data source auto-discovery (``pyspark_pykafka``).

PySpark's lookup worker (``pyspark/sql/worker/lookup_data_sources.py``) imports every top-level
``pyspark_*`` module on ``sys.path`` and sends each ``DefaultSource``, pickled, to the JVM. These
tests run that very function in a fresh process, and check that the wheel carries the module.
The end-to-end check through Spark is tests/integration/test_auto_registration.py.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

LOOKUP = r"""
import io, pickle, sys
import pyspark.sql.datasource                 # the lookup worker has it imported already
before = set(sys.modules)
try:
    from pyspark.sql.worker.lookup_data_sources import _main
except ImportError:
    # PySpark 4.0: main() reads Spark's worker prelude from its socket before the lookup; the
    # lookup itself is this loop, as in 4.0.5's lookup_data_sources.main
    from importlib import import_module
    from pkgutil import iter_modules
    from pyspark.sql.datasource import DataSource
    from pyspark.serializers import write_int, write_with_length
    from pyspark.worker_util import pickleSer as _ser

    def _main(infile, outfile):
        infos = {}
        for info in iter_modules():
            if info.name.startswith("pyspark_"):
                mod = import_module(info.name)
                if hasattr(mod, "DefaultSource") and issubclass(mod.DefaultSource, DataSource):
                    infos[mod.DefaultSource.name()] = mod.DefaultSource
        write_int(len(infos), outfile)
        for name, source in infos.items():
            write_with_length(name.encode("utf-8"), outfile)
            _ser._write_with_length(source, outfile)
from pyspark.serializers import UTF8Deserializer, read_int
from pyspark.worker_util import pickleSer

out = io.BytesIO()
_main(io.BytesIO(), out)
out.seek(0)
found = {}
for _ in range(read_int(out)):
    name = UTF8Deserializer().loads(out)
    found[name] = pickleSer._read_with_length(out)
cls = found["pykafka"]
print("class=" + f"{cls.__module__}.{cls.__qualname__}")
print("pickled by reference=" + str(len(pickle.dumps(cls)) < 200))
print("loaded=" + " ".join(sorted(m for m in set(sys.modules) - before
                                if m.split(".")[0] in ("pyarrow", "kafka", "numpy", "pandas"))))
"""


def test_pyspark_lookup_finds_the_source_and_imports_little(tmp_path):
    # A bare environment (no PYTHONPATH): the module must be found through the installation.
    done = subprocess.run([sys.executable, "-c", LOOKUP], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    lines = dict(line.partition("=")[::2] for line in done.stdout.splitlines())
    assert lines["class"] == "kafka_source.datasource.KafkaDataSource"
    assert lines["pickled by reference"] == "True"     # executors import it, nothing is copied
    # Every session's lookup imports the module: no pyarrow, kafka-python, numpy or pandas.
    assert lines["loaded"].strip() == ""


def test_the_wheel_ships_the_discovery_module_beside_the_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "--disable-pip-version-check", "-w", str(tmp_path), str(REPO_ROOT)],
                   check=True, timeout=300, capture_output=True)
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"kafka_source", "pyspark_pykafka.py"}
    # The decoder's record walk in C is built into it (a compiler is at hand wherever the suite
    # runs; without one the install still succeeds, with numpy's walk).
    assert any(n.startswith("kafka_source/wire/format/_recwalk.") and n.endswith((".so", ".pyd"))
               for n in names), sorted(n for n in names if "wire/format" in n)
    assert "kafka_source/group/status.py" in names
