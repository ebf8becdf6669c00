"""Makes PySpark (and py4j) unimportable in this interpreter and, through ``PYTHONPATH``, in
every Python process it starts: pytest's xdist workers and the interpreters tests spawn.

``PYKAFKA_TEST_WITHOUT_PYSPARK=1`` turns it on (tests/conftest.py puts this directory first on
``PYTHONPATH``). The test files marked ``pytest.mark.pyspark_free`` run once that way, and so are
known not to depend on which PySpark is installed; CI then runs only the other unit tests on each
PySpark release (.ci/run).
"""

import os
import subprocess
import sys

_BLOCKED = ("pyspark", "py4j")
_HERE = os.path.dirname(os.path.abspath(__file__))


class PySparkBlocker:
    """A meta path finder that refuses PySpark with a message saying why."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in _BLOCKED:
            raise ImportError(
                f"import of {name!r} refused: this test run is without PySpark "
                "(PYKAFKA_TEST_WITHOUT_PYSPARK=1), for the test files marked "
                "pytest.mark.pyspark_free, which CI runs once instead of on every PySpark "
                "release. A test that needs PySpark, even in a process it starts, belongs in a "
                "file without that mark.", name=name)
        return None


def _with_blocker_on_path(env):
    # Appended, not prepended: one sitecustomize runs per interpreter, and an environment made
    # with a sitecustomize of its own (pip's isolated build environments) keeps that one.
    env = dict(env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _HERE not in paths:
        env["PYTHONPATH"] = os.pathsep.join(paths + [_HERE])
    return env


def install() -> None:
    """Refuse PySpark here, and in the processes started from here: through the inherited
    ``PYTHONPATH`` and, for a process given an environment of its own (``subprocess`` with
    ``env=``, e.g. a bare one to test an installation), by adding this directory to that
    environment's ``PYTHONPATH``. (An interpreter started with ``-I`` or ``-E`` ignores
    ``PYTHONPATH``; no test does that.)"""
    if any(type(f).__name__ == "PySparkBlocker" for f in sys.meta_path):
        return
    sys.meta_path.insert(0, PySparkBlocker())
    init = subprocess.Popen.__init__

    def __init__(self, *args, **kwargs):
        if kwargs.get("env") is not None:
            kwargs["env"] = _with_blocker_on_path(kwargs["env"])
        init(self, *args, **kwargs)

    subprocess.Popen.__init__ = __init__


install()
