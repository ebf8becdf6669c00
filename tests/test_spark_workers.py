"""The interpreter wrapper the tests give Spark for its Python workers
(``tests/integration/spark-python``, see ``spark_workers.py``): it takes only PySpark's own zips
off PYTHONPATH, and only those inside the interpreter's PySpark installation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from integration.spark_workers import PYSPARK_LIB, SPARK_PYTHON, spark_worker_env

PRINT_PATH = "import json, os, sys; print(json.dumps([os.environ.get('PYTHONPATH'), sys.path]))"


def run_wrapper(pythonpath: str, **extra: str) -> tuple[str | None, list[str]]:
    env = spark_worker_env({"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **extra})
    env["PYTHONPATH"] = pythonpath
    done = subprocess.run([str(SPARK_PYTHON), "-c", PRINT_PATH], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return tuple(json.loads(done.stdout))


def test_spark_zips_of_the_interpreters_pyspark_are_taken_off_and_the_rest_kept_in_order(tmp_path):
    zips = [str(PYSPARK_LIB / "pyspark.zip"), str(PYSPARK_LIB / "py4j-0.10.9.9-src.zip")]
    mine = [str(tmp_path / "a dir with spaces"), str(tmp_path / "b*"), "/repo"]
    pythonpath, path = run_wrapper(os.pathsep.join([zips[0], mine[0], zips[1], mine[1], mine[2]]))
    assert pythonpath == os.pathsep.join(mine)
    assert not set(zips) & set(path)
    positions = [path.index(p) for p in mine]
    assert positions == sorted(positions)
    # PySpark then comes from its installation, where pip compiled it.
    done = subprocess.run([str(SPARK_PYTHON), "-c", "import pyspark; print(pyspark.__file__)"],
                          env={**spark_worker_env(), "PYTHONPATH": os.pathsep.join(zips)},
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == str(PYSPARK_LIB.parent.parent / "__init__.py")


def test_zips_of_another_spark_and_other_jars_stay(tmp_path):
    other = [str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip"),
             str(PYSPARK_LIB.parent.parent / "jars" / "spark-core.jar"),
             str(PYSPARK_LIB / "not-py4j.zip")]
    pythonpath, _ = run_wrapper(os.pathsep.join(other))
    assert pythonpath == os.pathsep.join(other)


def test_without_the_interpreter_set_it_fails_naming_the_variable():
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    done = subprocess.run([str(SPARK_PYTHON), "-c", "pass"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "PYKAFKA_TEST_PYTHON" in done.stderr


@pytest.mark.parametrize("key", ["PYSPARK_PYTHON", "PYKAFKA_TEST_PYTHON"])
def test_the_environment_names_the_wrapper_and_this_interpreter(key):
    env = spark_worker_env({})
    assert env["PYSPARK_PYTHON"] == str(SPARK_PYTHON)
    assert env["PYKAFKA_TEST_PYTHON"] == sys.executable
    assert os.access(env[key], os.X_OK)
