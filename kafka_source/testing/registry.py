"""A real Schema Registry for tests: Karapace (Confluent's REST API) started on a test broker.

``SCHEMA_REGISTRY_HOME`` names the folder of ``run-registry`` (``../shared/schema-registry``
next to a clone: ``.ci/run`` and the Makefile set it). The registry keeps its schemas in the
broker's ``_schemas`` topic, as Confluent's does; :func:`start_registry` waits until it is the
primary and accepts writes (5-7 s; the first start on a machine also installs its venv, ~40 s).
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
    port = _free_port()
    directory = tempfile.mkdtemp(prefix="pykafka-registry-")
    env = dict(os.environ)
    if group_id:
        env.setdefault("KARAPACE_GROUP_ID", group_id)
    done = subprocess.run([os.path.join(home, "run-registry"), bootstrap_servers, str(port),
                           directory], capture_output=True, text=True, timeout=180, env=env,
                          check=False)
    if done.returncode != 0:
        log = ""
        try:
            with open(os.path.join(directory, "registry.log"), encoding="utf-8",
                      errors="replace") as f:
                log = f.read()[-2000:]
        except OSError:
            pass
        shutil.rmtree(directory, ignore_errors=True)
        raise RegistryStartError(f"run-registry failed ({done.returncode}): "
                                 f"{done.stderr.strip()[-1000:]}\n{log}")
    return RegistryHandle(f"http://127.0.0.1:{port}", directory, home)
