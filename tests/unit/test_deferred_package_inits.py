"""kafka_source.worker_imports.defer_package_inits: in Spark's Python workers, kafka-python's and
crc32c's package ``__init__`` runs only when something asks for a name only it defines, so the
connector's imports skip kafka-python's consumer, producer and admin client and crc32c's version
lookup, and everything else that imports those packages sees them as usual."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from kafka_source import worker_imports

WORKER_ENV = {"PYTHON_WORKER_FACTORY_SECRET": "x"}


def _run(code: str, worker: bool) -> dict:
    """Run ``code`` in a fresh interpreter (as a Spark worker or not); it prints one JSON line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_WORKER_FACTORY_SECRET"}
    if worker:
        env.update(WORKER_ENV)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


_CONNECTOR_IMPORTS = """
    import json, logging, sys
    import kafka_source.read.stream, kafka_source.read.executor, kafka_source.write.producer
    import kafka_source.group.member
    unused = sorted(m for m in sys.modules
                    if m.split(".")[:2] in (["kafka", "consumer"], ["kafka", "producer"],
                                            ["kafka", "admin"], ["kafka", "record"],
                                            ["crc32c", "_cli"]))
    handlers = [type(h).__name__ for h in logging.getLogger("kafka").handlers]
"""


def test_a_worker_imports_the_connector_without_kafka_pythons_clients():
    result = _run(_CONNECTOR_IMPORTS + """
    from kafka_source.wire.format.records import CRC32C_IMPLEMENTATION
    print(json.dumps({"unused": unused, "handlers": handlers, "crc": CRC32C_IMPLEMENTATION,
                      "lazy": "__getattr__" in vars(sys.modules["kafka"])}))
    """, worker=True)
    assert result == {"unused": [], "handlers": ["NullHandler"], "crc": "crc32c package",
                      "lazy": True}


def test_outside_a_worker_the_packages_are_imported_as_usual():
    result = _run(_CONNECTOR_IMPORTS + """
    print(json.dumps({"unused": unused, "handlers": handlers,
                      "lazy": "__getattr__" in vars(sys.modules["kafka"])}))
    """, worker=False)
    assert "kafka.consumer" in result["unused"] and "kafka.admin" in result["unused"]
    assert result["handlers"] == ["NullHandler"] and result["lazy"] is False


def test_in_a_worker_user_code_still_sees_the_whole_packages():
    result = _run(_CONNECTOR_IMPORTS + """
    from kafka import KafkaConsumer, TopicPartition, errors
    import kafka, kafka.version, crc32c
    namespace = {}
    exec("from kafka import *", namespace)
    try:
        kafka.NoSuchName
        missing = None
    except AttributeError as e:
        missing = str(e)
    print(json.dumps({
        "consumer": KafkaConsumer.__module__, "tp": TopicPartition("t", 1).partition,
        "errors": errors.__name__, "version": kafka.__version__ == kafka.version.__version__,
        "admin": kafka.KafkaAdminClient.__name__, "producer": hasattr(kafka, "KafkaProducer"),
        "star": sorted(set(kafka.__all__) - set(namespace)), "missing": missing,
        "handlers": [type(h).__name__ for h in logging.getLogger("kafka").handlers],
        "crc32c": [crc32c.crc32c(b"123456789"), bool(crc32c.__version__),
                   hasattr(crc32c, "CRC32CHash")],
    }))
    """, worker=True)
    assert result == {
        "consumer": "kafka.consumer.group", "tp": 1, "errors": "kafka.errors", "version": True,
        "admin": "KafkaAdminClient", "producer": True, "star": [],
        "missing": "module 'kafka' has no attribute 'NoSuchName'",
        "handlers": ["NullHandler"],     # its own, once: the stand-in was removed
        "crc32c": [0xE3069283, True, True],
    }


def test_a_package_already_imported_is_left_alone():
    result = _run("""
    import json, sys, kafka
    import kafka_source.read.stream
    print(json.dumps({"same": sys.modules["kafka"] is kafka,
                      "lazy": "__getattr__" in vars(kafka)}))
    """, worker=True)
    assert result == {"same": True, "lazy": False}


def test_nothing_is_deferred_outside_spark_workers():
    assert worker_imports.defer_package_inits(environ={}) == []


# A package of our own, to see what the deferred __init__ does when it runs, fails, or is asked
# for from several threads at once.

@pytest.fixture
def package(tmp_path, monkeypatch):
    name = f"deferred_pkg_{os.getpid()}_{threading.get_ident()}"
    root = tmp_path / name
    root.mkdir()
    (root / "part.py").write_text("VALUE = 'part'\n")
    (root / "other.py").write_text("VALUE = 'other'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(worker_imports, "DEFERRED_PACKAGES", (name,))
    yield name, root
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def _write_init(root, body: str) -> None:
    (root / "__init__.py").write_text(textwrap.dedent(body))


def test_a_submodule_is_imported_without_the_init(package):
    name, root = package
    _write_init(root, "raise RuntimeError('the __init__ ran')\n")
    assert worker_imports.defer_package_inits(environ=WORKER_ENV) == [name]
    assert worker_imports.defer_package_inits(environ=WORKER_ENV) == []   # already there
    part = __import__(f"{name}.part", fromlist=["VALUE"])
    assert part.VALUE == "part"
    namespace = {}
    exec(f"from {name} import other", namespace)
    assert namespace["other"].VALUE == "other"


def test_the_init_runs_once_when_first_asked_from_many_threads(package):
    name, root = package
    _write_init(root, """
        import time, builtins
        builtins.deferred_init_runs = getattr(builtins, "deferred_init_runs", 0) + 1
        from . import part           # the __init__ importing its own submodule
        import sys
        PARTIAL = hasattr(sys.modules[__name__], "LATER")   # asked while it runs
        time.sleep(0.2)
        LATER = part.VALUE
    """)
    import builtins

    builtins.deferred_init_runs = 0
    try:
        worker_imports.defer_package_inits(environ=WORKER_ENV)
        module = sys.modules[name]
        seen = []
        threads = [threading.Thread(target=lambda: seen.append(module.LATER)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert seen == ["part"] * 8
        assert builtins.deferred_init_runs == 1
        assert module.PARTIAL is False
        assert "__getattr__" not in vars(module)
        with pytest.raises(AttributeError, match=f"module '{name}' has no attribute 'NOPE'"):
            module.NOPE
    finally:
        del builtins.deferred_init_runs


def test_an_init_that_fails_raises_its_error_and_runs_again_next_time(package):
    name, root = package
    _write_init(root, """
        import os
        if not os.path.exists(os.path.join(os.path.dirname(__file__), "ok")):
            raise ImportError("the package's own import error")
        READY = True
    """)
    worker_imports.defer_package_inits(environ=WORKER_ENV)
    module = sys.modules[name]
    with pytest.raises(ImportError, match="the package's own import error"):
        module.READY
    (root / "ok").write_text("")
    assert module.READY is True
