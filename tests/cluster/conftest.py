"""Fixtures of the cluster scenarios: one three-node cluster per Kafka generation, per session.

``cluster`` is parametrized over ``kraft`` (Kafka 4.0, KRaft) and ``zookeeper`` (Kafka 2.2,
ZooKeeper mode); pytest runs all tests of one generation, then stops that cluster before the
other starts, so at most one cluster runs at a time. Distributions: ``KAFKA_HOME`` (KRaft-capable,
as for the rest of the suite) and ``KAFKA_ZK_HOME`` (ZooKeeper mode), else ``../shared/kafka`` and
``../shared/kafka22`` beside the repository; a generation whose distribution is missing is
skipped with a reason.

These tests are marked ``cluster`` and left out of the default run (``tests/conftest.py``):
``pytest -m cluster`` runs them (``-m cluster -k kraft`` one generation), as does naming a file
or folder under ``tests/cluster``.

Scenarios parametrized with ``group_protocol`` run the stream in a group of the classic protocol
(JoinGroup/SyncGroup, the default) and of the consumer protocol (KIP-848,
``kafka.group.protocol=consumer``); the latter only on the ``kraft`` cluster: Kafka 2.2 has no
consumer protocol, so that combination is skipped at collection, before any cluster starts.

Each cluster also has a SASL_SSL client listener (SCRAM-SHA-512; :mod:`kafka_source.testing.
cluster_security`) whose brokers end every SASL session after ``REAUTH_MS`` (KIP-368): the
scenarios that pass ``cluster.client_options()`` reach the cluster only through it; the others,
and every check, use PLAINTEXT.

Every test gets ``figures`` (:class:`~.scenario.Figures`): what it injected and checked is
printed as one line per scenario and generation at the end of the run. Each test is bounded by
``PYKAFKA_CLUSTER_TEST_TIMEOUT_S`` (default 420 s): past it the test's stacks are dumped and it
fails with :class:`ScenarioTimeout` (a SIGALRM in the main thread, as pytest-timeout's signal
method does, so that a hung Spark call is interrupted too).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from kafka_source.testing.cluster import KRAFT, ZOOKEEPER, KafkaCluster, SecureListener

from .scenario import Figures

REPO_ROOT = Path(__file__).resolve().parents[2]
HOMES = {KRAFT: ("KAFKA_HOME", REPO_ROOT.parent / "shared" / "kafka"),
         ZOOKEEPER: ("KAFKA_ZK_HOME", REPO_ROOT.parent / "shared" / "kafka22")}
TEST_TIMEOUT_S = float(os.environ.get("PYKAFKA_CLUSTER_TEST_TIMEOUT_S", "420"))
_REPORT_KEY = pytest.StashKey[dict]()
#: The SASL_SSL listener's session lifetime (``connections.max.reauth.ms``): short enough that
#: a scenario's long-lived connections outlive several sessions, long enough for a loaded
#: 2-core machine (a client renews at 85-95 % of it).
REAUTH_MS = 10_000


def distribution(generation: str) -> str | None:
    variable, default = HOMES[generation]
    home = os.environ.get(variable, "").strip() or (str(default) if default.is_dir() else "")
    return home or None


#: Why the consumer-protocol variant of a scenario does not run on the ZooKeeper-mode cluster.
NO_CONSUMER_PROTOCOL = ("Kafka 2.2 (the zookeeper cluster) has no consumer group protocol: "
                        "KIP-848 (ConsumerGroupHeartbeat) came with Kafka 4.0, and a query with "
                        "kafka.group.protocol=consumer fails at start there by design")


def pytest_collection_modifyitems(config, items):
    """Skip the consumer-protocol variant on the ZooKeeper-mode cluster. A skip marker is
    evaluated before the test's fixtures are set up, so that a run of only such variants does
    not start (and stop) a Kafka 2.2 cluster for nothing."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("cluster") == ZOOKEEPER and params.get("group_protocol") == "consumer":
            item.add_marker(pytest.mark.skip(reason=NO_CONSUMER_PROTOCOL))


@pytest.fixture(scope="session", params=[KRAFT, ZOOKEEPER])
def cluster(request) -> KafkaCluster:
    """A running three-node cluster of this generation, shared by the session's tests."""
    generation = request.param
    home = distribution(generation)
    if home is None:
        pytest.skip(f"no Kafka distribution for the {generation} cluster: set "
                    f"{HOMES[generation][0]} (or put it at {HOMES[generation][1]})")
    started = time.monotonic()
    cluster = KafkaCluster(home, generation, secure=SecureListener(reauth_ms=REAUTH_MS))
    request.addfinalizer(cluster.stop)
    summary = request.getfixturevalue("summary_lines")
    summary.append(f"cluster {generation:9} started from {home} in "
                   f"{time.monotonic() - started:.0f} s ({cluster.bootstrap_servers})")
    return cluster


@pytest.fixture
def whole_cluster(cluster) -> KafkaCluster:
    """The cluster with every node up and in sync: a test that left a node down (a scenario
    whose broker never comes back, or a failure) is repaired before the next one starts."""
    for node in cluster.nodes:
        if node not in cluster.running_nodes():
            cluster.start(node)
    cluster.wait_in_sync()
    return cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    item.stash.setdefault(_REPORT_KEY, {})[report.when] = report


def _outcome(item) -> str:
    reports = item.stash.get(_REPORT_KEY, {})
    for when in ("setup", "call"):
        report = reports.get(when)
        if report is None:
            continue
        if hasattr(report, "wasxfail"):
            return "xfailed (known bug)" if report.skipped else "XPASS"
        if report.failed:
            return "FAILED" if when == "call" else "ERROR in setup"
        if report.skipped:
            return "skipped"
    return "passed"


@pytest.fixture
def figures(request, cluster, summary_lines):
    """This scenario's :class:`Figures`; its line is added to the end-of-run summary."""
    fig = Figures()
    started = time.monotonic()
    yield fig
    name = request.node.originalname.removeprefix("test_").replace("_", "-")
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    # Each variant of a scenario (group_protocol, streams_were, ...) gets a line of its own.
    name += "".join(f" ({k}={v})" for k, v in sorted(params.items()) if k != "cluster")
    summary_lines.append(fig.line(cluster.mode, name, _outcome(request.node),
                                  time.monotonic() - started))


class ScenarioTimeout(Exception):
    """A cluster test ran longer than PYKAFKA_CLUSTER_TEST_TIMEOUT_S."""


@pytest.fixture(autouse=True)
def _bounded(request):
    """Fail the test (not the session) once it has run TEST_TIMEOUT_S."""
    def expire(signum, frame):
        sys.stderr.write(f"\n=== {request.node.nodeid} ran {TEST_TIMEOUT_S:.0f} s: stacks ===\n")
        faulthandler.dump_traceback(all_threads=True)
        raise ScenarioTimeout(f"{request.node.nodeid} exceeded {TEST_TIMEOUT_S:.0f} s "
                              "(PYKAFKA_CLUSTER_TEST_TIMEOUT_S)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
