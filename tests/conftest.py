"""Session fixtures shared by the whole suite.

Broker (``kafka_broker``, ``bootstrap_servers``, ``broker_kind``): one per session, chosen by
:func:`kafka_source.testing.select_broker` -- ``KAFKA_BOOTSTRAP_SERVERS`` if set, else Kafka in
Docker via testcontainers if a Docker engine answers, else a local Kafka distribution if
``KAFKA_HOME`` is set, else the embedded Tansu broker. If it cannot be started the tests that need
it ERROR (they are never skipped for that).

Tansu deviates from Kafka in a few places (see ``kafka_source.testing.brokers``). A test that depends on
exact Kafka behaviour there skips on the embedded broker only, in one of these ways::

    @pytest.mark.skip_on_embedded("needs exact end offsets")
    def test_a(bootstrap_servers): ...

    def test_b(bootstrap_servers, requires_exact_end_offsets): ...

    def test_c(bootstrap_servers, skip_on_embedded):
        skip_on_embedded("read_committed does not hide aborted records on Tansu")

A test that needs a feature of a later Kafka release than the broker's (the suite also runs on
Kafka 2.2 in ZooKeeper mode, the oldest release the connector supports) skips on older brokers
only, naming the feature and the release that brought it::

    @pytest.mark.requires_broker((2, 5), "KIP-447 (TxnOffsetCommit with the group's metadata)")
    def test_d(bootstrap_servers): ...

    def test_e(bootstrap_servers, requires_broker):
        requires_broker((2, 3), "KIP-345 static membership")

The broker's release and mode are ``kafka_broker.version`` ((major, minor)) and
``kafka_broker.zookeeper_mode``. Tests that start a broker of their own (TLS and SASL listeners,
restarts) use :func:`kafka_source.testing.start_local_broker`: a KRaft broker from ``KAFKA_HOME``,
or a ZooKeeper-mode one from ``KAFKA_ZK_HOME`` when ``PYKAFKA_TEST_BROKER=local-kafka-zk``.

Tests that use the broker fixtures are marked ``integration`` and tests that use ``spark`` are
marked ``spark`` automatically, so ``pytest -m "not integration and not spark"`` runs the fast
unit tests only.

Test files whose tests never import PySpark, not even in a process they start, say so with
``pytestmark = pytest.mark.pyspark_free`` (written that way: the run without PySpark finds these
files by that text before importing them). ``PYKAFKA_TEST_WITHOUT_PYSPARK=1`` runs those files
only, with PySpark unimportable in every Python process of the run
(``tests/without_pyspark/sitecustomize.py``): a test there that needs PySpark fails with an
ImportError saying so. CI runs them once that way and the other unit tests
(``-m "not pyspark_free"``) on each PySpark release, since nothing in the first set can see which
PySpark is installed.

Tests marked ``cluster`` (``tests/cluster/``: production-failure scenarios on three-node Kafka
clusters of both generations, several minutes) are left out unless asked for: by a ``-m``
expression that names the marker (``pytest -m cluster``) or by naming a path under
``tests/cluster``. So ``make test`` takes as long as without them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# The run without PySpark (see the module docstring): PySpark is refused from here on in this
# process, and through PYTHONPATH in every Python process it starts (xdist's workers, spawned
# interpreters).
WITHOUT_PYSPARK = os.environ.get("PYKAFKA_TEST_WITHOUT_PYSPARK") == "1"
_PYSPARK_FREE_MARK = "pytest.mark.pyspark_free"
if WITHOUT_PYSPARK:
    _loaded = sorted(m for m in sys.modules if m.split(".", 1)[0] in ("pyspark", "py4j"))
    if _loaded:
        raise RuntimeError(f"PYKAFKA_TEST_WITHOUT_PYSPARK=1, but {_loaded[:3]} were imported "
                           "before tests/conftest.py (by a pytest plugin?): the run cannot "
                           "show that its tests do without PySpark")
    _blocker_dir = REPO_ROOT / "tests" / "without_pyspark"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_blocker_dir), os.environ.get("PYTHONPATH", "")) if p)
    _spec = importlib.util.spec_from_file_location(
        "_pykafka_without_pyspark", _blocker_dir / "sitecustomize.py")
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))

_BROKER_FIXTURES = {"kafka_broker", "bootstrap_servers", "broker_kind",
                    "requires_exact_end_offsets", "requires_read_committed_isolation",
                    "skip_on_embedded", "requires_broker"}
_BROKER_KEY = pytest.StashKey[object]()
_SPARK_KEY = pytest.StashKey[bool]()
_SUMMARY_KEY = pytest.StashKey[list]()


# ---------------------------------------------------------------------------------------------
# Markers
# ---------------------------------------------------------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject.toml; repeated so that the suite works with another rootdir.
    config.addinivalue_line("markers", "integration: needs a Kafka broker")
    config.addinivalue_line("markers", "spark: needs a SparkSession (Java 17+)")
    config.addinivalue_line(
        "markers", "skip_on_embedded(reason): skip only on the embedded Tansu broker")
    config.addinivalue_line(
        "markers", "requires_broker(version, feature): skip on brokers older than the Kafka "
        "release version=(major, minor), which brought feature")
    config.addinivalue_line(
        "markers", "cluster: a scenario on three-node Kafka clusters (tests/cluster); run only "
        "when asked for (-m cluster)")
    config.addinivalue_line(
        "markers", "smoke: one of the few integration tests `make check` runs on one broker")
    config.addinivalue_line("markers", "once: a long test that CI runs on Kafka 4.0 only, not in "
                            "the Kafka 2.2 and embedded passes")
    config.addinivalue_line(
        "markers", "pyspark_free: the file's tests never import PySpark (the run with "
        "PYKAFKA_TEST_WITHOUT_PYSPARK=1 shows it); CI runs them once, not on every PySpark")
    config.addinivalue_line(
        "markers", "requires_spark(feature, what): skip where the installed PySpark lacks the "
        "feature of kafka_source.spark_features (e.g. ADMISSION_CONTROL), naming what it is")
    # Every JVM the run starts (Spark, brokers, ZooKeeper, Kafka's tools) compiles with C1 only
    # and collects with the serial collector: a third less CPU (kafka_source/testing/jvm.py).
    from kafka_source.testing import jvm, timing

    jvm.apply()

    timing.register(config)


def _cluster_tests_asked_for(config: pytest.Config) -> bool:
    """``-m`` names the ``cluster`` marker, or a path under tests/cluster is on the command
    line."""
    if "cluster" in (config.getoption("markexpr", "") or ""):
        return True
    cluster_dir = REPO_ROOT / "tests" / "cluster"
    for arg in config.invocation_params.args:
        arg = str(arg)
        if arg.startswith("-"):
            continue
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == cluster_dir or cluster_dir in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config):
    """Without PySpark, test files not marked ``pyspark_free`` are not even imported (their
    imports would fail)."""
    if (WITHOUT_PYSPARK and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")
            and _PYSPARK_FREE_MARK not in collection_path.read_text(encoding="utf-8")):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if WITHOUT_PYSPARK:
        others = [item for item in items if not item.get_closest_marker("pyspark_free")]
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = [item for item in items if item.get_closest_marker("pyspark_free")]
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if (names & _BROKER_FIXTURES or item.get_closest_marker("skip_on_embedded")
                or item.get_closest_marker("requires_broker")):
            item.add_marker(pytest.mark.integration)
        if "spark" in names:
            item.add_marker(pytest.mark.spark)
        for marker in item.iter_markers("requires_spark"):
            _skip_without_spark_feature(item, *marker.args)
    if not _cluster_tests_asked_for(config):
        left_out = [item for item in items if item.get_closest_marker("cluster")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("cluster")]


def _skip_without_spark_feature(item: pytest.Item, feature: str, what: str) -> None:
    """``@pytest.mark.requires_spark("ADMISSION_CONTROL", "...")``: skip where the installed
    PySpark lacks that feature of :mod:`kafka_source.spark_features`, naming it, as
    ``requires_broker`` does for Kafka releases."""
    import pyspark

    from kafka_source import spark_features

    if not getattr(spark_features, feature):
        item.add_marker(pytest.mark.skip(
            reason=f"needs {what}; PySpark {pyspark.__version__} has not got it"))


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    broker = config.stash.get(_BROKER_KEY, None)
    if broker is not None:
        terminalreporter.write_line(
            f"kafka broker: {broker.kind} at {broker.bootstrap_servers}")
    if config.stash.get(_SPARK_KEY, False):
        terminalreporter.write_line(f"spark master: {SPARK_MASTER}")
    for line in config.stash.get(_SUMMARY_KEY, []):
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def summary_lines(request: pytest.FixtureRequest) -> list:
    """A list whose lines are printed at the end of the run (e.g. figures a test measured)."""
    return request.config.stash.setdefault(_SUMMARY_KEY, [])


# ---------------------------------------------------------------------------------------------
# Broker
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest):
    """The session's broker handle (``.bootstrap_servers``, ``.kind``, ``.exact_end_offsets``,
    ``.read_committed_hides_aborted``). Started on first use, stopped at the end of the session."""
    from kafka_source.testing import select_broker

    broker = select_broker()
    request.addfinalizer(broker.stop)
    request.config.stash[_BROKER_KEY] = broker
    return broker


@pytest.fixture(scope="session")
def bootstrap_servers(kafka_broker) -> str:
    return kafka_broker.bootstrap_servers


@pytest.fixture(scope="session")
def broker_kind(kafka_broker) -> str:
    """``"external"``, ``"testcontainers"``, ``"local-kafka"``, ``"local-kafka-zk"`` or
    ``"embedded"``."""
    return kafka_broker.kind


def _skip_unless_broker_has(broker, version, feature: str) -> None:
    version = tuple(version)
    if tuple(broker.version) < version:
        mode = " in ZooKeeper mode" if broker.zookeeper_mode else ""
        pytest.skip(f"{broker.kind} broker is Kafka {'.'.join(map(str, broker.version))}{mode}: "
                    f"{feature} came with Kafka {'.'.join(map(str, version))}")


@pytest.fixture(scope="session")
def schema_registry(kafka_broker) -> str:
    """The URL of a real Schema Registry (Karapace, Confluent's REST API) on the session's
    broker, started on first use. Skips without ``SCHEMA_REGISTRY_HOME`` and on the embedded
    broker (the registry's consumer group needs Kafka's group coordination)."""
    from kafka_source.testing.registry import registry_home, start_registry

    if registry_home() is None:
        pytest.skip("no Schema Registry: set SCHEMA_REGISTRY_HOME to the folder of "
                    "run-registry (../shared/schema-registry; .ci/run and make test do)")
    if kafka_broker.is_tansu:
        pytest.skip(f"{kafka_broker.kind} Tansu broker: the registry runs on Kafka")
    handle = start_registry(kafka_broker.bootstrap_servers)
    yield handle.url
    handle.stop()


@pytest.fixture
def requires_broker(kafka_broker):
    """A function ``requires_broker((major, minor), feature)`` that skips the test on a broker
    older than that Kafka release, which brought ``feature``."""

    def _require(version, feature: str) -> None:
        _skip_unless_broker_has(kafka_broker, version, feature)

    return _require


@pytest.fixture
def skip_on_embedded(kafka_broker):
    """A function ``skip_on_embedded(reason)`` that skips the test on the embedded broker only
    (or on an external broker that is Tansu too)."""

    def _skip(reason: str) -> None:
        if kafka_broker.is_tansu:
            pytest.skip(f"{kafka_broker.kind} Tansu broker: {reason}")

    return _skip


@pytest.fixture
def requires_exact_end_offsets(kafka_broker) -> None:
    """Skip on a broker whose ListOffsets(latest) is not the offset after the last record."""
    if not kafka_broker.exact_end_offsets:
        pytest.skip(f"{kafka_broker.kind} broker: ListOffsets(latest) is the base offset of the "
                    "last batch + 1, not the offset after the last record")


@pytest.fixture
def requires_read_committed_isolation(kafka_broker) -> None:
    """Skip on a broker whose read_committed consumers still see aborted records."""
    if not kafka_broker.read_committed_hides_aborted:
        pytest.skip(f"{kafka_broker.kind} broker: read_committed does not hide aborted records")


@pytest.fixture(autouse=True)
def _each_test_sees_its_own_warnings() -> None:
    """The sink's option and column warnings are logged once per process (a stream makes a
    writer per micro-batch); each test starts as a new process would."""
    from kafka_source.config.sink_options import OncePerProcess

    OncePerProcess.forget_all()


@pytest.fixture(autouse=True)
def _skip_on_embedded_marker(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("skip_on_embedded")
    if marker is None:
        return
    reason = (marker.args[0] if marker.args
              else marker.kwargs.get("reason", "not supported by the embedded broker"))
    broker = request.getfixturevalue("kafka_broker")
    if broker.is_tansu:
        pytest.skip(f"{broker.kind} Tansu broker: {reason}")


@pytest.fixture(autouse=True)
def _requires_broker_marker(request: pytest.FixtureRequest) -> None:
    markers = list(request.node.iter_markers("requires_broker"))
    if not markers:
        return
    broker = request.getfixturevalue("kafka_broker")
    for marker in markers:
        _skip_unless_broker_has(broker, *marker.args, **marker.kwargs)


# ---------------------------------------------------------------------------------------------
# Spark
# ---------------------------------------------------------------------------------------------

SPARK_MASTER = os.environ.get("PYKAFKA_TEST_SPARK_MASTER", "local[2]")


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest):
    """A SparkSession (``local[2]``, or ``PYKAFKA_TEST_SPARK_MASTER``, e.g.
    ``local-cluster[2,1,1024]`` for executors in separate JVMs, so that nothing can rely on
    driver memory) with the ``pykafka`` Python data source registered."""
    # Spark's Python workers must be this interpreter, and must import kafka_source even when
    # the package is not installed (they inherit the environment of the JVM started below);
    # they import PySpark from its installation, not from Spark's zip (spark_workers.py).
    from integration.spark_workers import spark_worker_env

    os.environ.update(spark_worker_env())
    paths = [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    warehouse = tempfile.mkdtemp(prefix="pykafka-spark-warehouse-")
    # local-cluster workers keep their files under SPARK_HOME/work unless told otherwise.
    os.environ.setdefault("SPARK_WORKER_DIR", os.path.join(warehouse, "work"))
    session = (
        SparkSession.builder.master(SPARK_MASTER)
        .appName("pykafka-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.python.worker.faulthandler.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    request.config.stash[_SPARK_KEY] = True

    def _stop() -> None:
        session.stop()
        import shutil

        shutil.rmtree(warehouse, ignore_errors=True)

    request.addfinalizer(_stop)

    import kafka_source

    kafka_source.register(session)
    return session
