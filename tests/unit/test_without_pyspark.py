"""The run without PySpark (``tests/without_pyspark/sitecustomize.py``): what CI relies on to run
the ``pyspark_free`` test files once instead of on every PySpark release must really keep PySpark
out, of the process and of every Python process it starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

BLOCKER_DIR = Path(__file__).resolve().parent.parent / "without_pyspark"


def _python(code: str, blocked: bool, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and Path(p).resolve() != BLOCKER_DIR]
    if blocked:
        paths.insert(0, str(BLOCKER_DIR))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_pyspark_and_py4j_are_refused_with_the_reason():
    for module in ("pyspark", "pyspark.sql.types", "py4j.java_gateway"):
        done = _python(f"import {module}", blocked=True)
        assert done.returncode != 0
        assert "refused" in done.stderr and "pyspark_free" in done.stderr, done.stderr


def test_the_control_imports_pyspark():
    done = _python("import pyspark.sql.types; print('ok')", blocked=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_processes_started_from_a_blocked_one_are_blocked_too_even_with_an_env_of_their_own():
    done = _python("""
        import os, subprocess, sys
        for env in (None, {"PATH": "/usr/bin:/bin"}, {"PYTHONPATH": "/nowhere"}):
            child = subprocess.run([sys.executable, "-c", "import pyspark"], env=env,
                                   capture_output=True, text=True)
            print(child.returncode != 0 and "refused" in child.stderr)
        """, blocked=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]


def test_an_environment_with_a_sitecustomize_of_its_own_keeps_it(tmp_path):
    # pip's isolated build environments work through a sitecustomize on PYTHONPATH.
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.THEIRS = True\n")
    done = _python(f"""
        import subprocess, sys
        child = subprocess.run(
            [sys.executable, "-c", "import builtins; print(getattr(builtins, 'THEIRS', False))"],
            env={{"PYTHONPATH": {str(tmp_path)!r}}}, capture_output=True, text=True)
        print(child.stdout.strip())
        """, blocked=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
