"""A real Schema Registry for tests: Karapace (Confluent's REST API) started on a test broker.

``SCHEMA_REGISTRY_HOME`` names the folder of ``run-registry`` (``../shared/schema-registry``
next to a clone: ``.ci/run`` and the Makefile set it). The registry keeps its schemas in the
broker's ``_schemas`` topic, as Confluent's does; :func:`start_registry` waits until it is the
primary and accepts writes (5-7 s; the first start on a machine also installs its venv, ~40 s).

Karapace 5.0.3 creates its schemas topic when it does not exist and reads it at once; when the
broker's metadata does not have the new topic yet, its reader stops on
UNKNOWN_TOPIC_OR_PARTITION and never becomes ready, so the registry never serves writes (seen
once in five starts on a fresh Kafka 4.0). The topic is therefore created here first, compacted
as Karapace creates it, and waited for until it has a leader; a start that still fails is tried
once more.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

ENV_SCHEMA_REGISTRY_HOME = "SCHEMA_REGISTRY_HOME"


class RegistryStartError(RuntimeError):
    pass


def registry_home() -> str | None:
    home = os.environ.get(ENV_SCHEMA_REGISTRY_HOME, "").strip()
    if home and os.access(os.path.join(home, "run-registry"), os.X_OK):
        return home
    return None


@dataclass
class RegistryHandle:
    url: str
    directory: str
    home: str

    def stop(self) -> None:
        subprocess.run([os.path.join(self.home, "run-registry"), "stop", self.directory],
                       capture_output=True, timeout=60, check=False)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_registry(bootstrap_servers: str, *, group_id: str | None = None) -> RegistryHandle:
    """Start a registry on ``bootstrap_servers`` (its own ``_schemas`` topic and group, so that
    several can share a broker when ``group_id`` and the topic differ)."""
    from .brokers import _free_port

    home = registry_home()
    if home is None:
        raise RegistryStartError(f"no Schema Registry: set {ENV_SCHEMA_REGISTRY_HOME} to the "
                                 "folder of run-registry (../shared/schema-registry)")
    from .brokers import create_topic

    env = dict(os.environ)
    if group_id:
        env.setdefault("KARAPACE_GROUP_ID", group_id)
    topic = env.get("KARAPACE_TOPIC_NAME", "_schemas")
    create_topic(bootstrap_servers, topic, partitions=1, exist_ok=True,
                 config={"cleanup.policy": "compact"})
    failures = []
    for _ in range(2):
        port = _free_port()
        directory = tempfile.mkdtemp(prefix="pykafka-registry-")
        done = subprocess.run([os.path.join(home, "run-registry"), bootstrap_servers, str(port),
                               directory], capture_output=True, text=True, timeout=180,
                              env=env, check=False)
        if done.returncode == 0:
            return RegistryHandle(f"http://127.0.0.1:{port}", directory, home)
        failures.append(f"run-registry failed ({done.returncode}): "
                        f"{done.stderr.strip()[-1000:]}\n{_log_problems(directory)}")
        subprocess.run([os.path.join(home, "run-registry"), "stop", directory],
                       capture_output=True, timeout=60, check=False)
        shutil.rmtree(directory, ignore_errors=True)
    raise RegistryStartError("\n---\n".join(failures))


def _log_problems(directory: str) -> str:
    """The registry log's warnings and errors, without its polling noise."""
    try:
        with open(os.path.join(directory, "registry.log"), encoding="utf-8",
                  errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    noise = ("GET /", "No master set", "isn't ready", "are master", "Topic does not yet exist")
    kept = [ln for ln in lines if (" WARNING " in ln or " ERROR " in ln)
            and not any(n in ln for n in noise)]
    return "\n".join(kept[-20:])
