"""Static checks of docker/: there is no Docker engine where the suite runs, so nothing is built
or started here. What this proves: the compose file parses, has the services the quickstart
notebook needs, pins every image, builds the Jupyter image from this repository and points the
notebook at the compose Kafka through an address that broker advertises. What it cannot prove:
that the images pull and build, that the containers start, or that the notebook runs in them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.pyspark_free

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKER = REPO_ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yml"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def jupyter_dockerfile() -> tuple[Path, str]:
    build = compose()["services"]["jupyter"]["build"]
    context = (DOCKER / build["context"]).resolve()
    path = context / build["dockerfile"]
    return path, path.read_text()


def pinned(image: str) -> bool:
    """``name:tag`` with a version-like tag (not ``latest``), or a digest."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag != "latest" and bool(re.search(r"\d", tag))


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_compose_has_kafka_and_jupyter():
    services = compose()["services"]
    assert {"kafka", "jupyter"} <= set(services)
    assert services["jupyter"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "healthcheck" in services["kafka"]


def test_every_image_is_pinned():
    images = [s["image"] for s in compose()["services"].values() if "image" in s]
    _, dockerfile = jupyter_dockerfile()
    images += re.findall(r"^FROM\s+(\S+)", dockerfile, flags=re.MULTILINE)
    assert images
    assert [i for i in images if not pinned(i)] == []


def test_kafka_runs_in_kraft_mode():
    env = environment(compose()["services"]["kafka"])
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "CONTROLLER" in env["KAFKA_CONTROLLER_LISTENER_NAMES"]


def test_notebook_env_points_at_an_advertised_kafka_listener():
    services = compose()["services"]
    bootstrap = environment(services["jupyter"])["KAFKA_BOOTSTRAP_SERVERS"]
    kafka = environment(services["kafka"])
    advertised = {a.split("://", 1)[1] for a in kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    listened_ports = {a.rsplit(":", 1)[1] for a in kafka["KAFKA_LISTENERS"].split(",")}
    for server in bootstrap.split(","):
        host, port = server.rsplit(":", 1)
        assert host == "kafka", "containers reach the broker by its compose service name"
        assert server in advertised and port in listened_ports


def test_jupyter_image_installs_this_repository_and_opens_the_quickstart():
    path, dockerfile = jupyter_dockerfile()
    assert path.is_file()
    context = (DOCKER / compose()["services"]["jupyter"]["build"]["context"]).resolve()
    assert context == REPO_ROOT
    copied = re.findall(r"^COPY\s+(?:--\S+\s+)*(.+?)\s+\S+$", dockerfile, flags=re.MULTILINE)
    sources = {src for line in copied for src in line.split()}
    assert {"pyproject.toml", "pyspark_pykafka.py", "kafka_source",
            "notebooks/quickstart.ipynb"} <= sources
    for src in sources:
        assert (context / src).exists(), f"the Dockerfile copies {src}, which is not in the repo"
    assert re.search(r'pip install [^\n]*"\.\[notebook\]"', dockerfile), \
        "the image installs the package from the repository with the notebook extra"
    assert "openjdk-17-jre-headless" in dockerfile
    assert "quickstart.ipynb" in dockerfile.split("CMD", 1)[1]


def test_build_context_leaves_out_the_venv():
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert ".venv/" in ignored and ".git/" in ignored
