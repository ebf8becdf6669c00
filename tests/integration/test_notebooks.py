"""notebooks/quickstart.ipynb runs top to bottom against the session's broker, as Jupyter runs it;
and ``make demo`` (notebooks/demo.py), the README's first command, runs as on a fresh machine.

nbclient (what ``jupyter nbconvert --execute`` runs on) executes every cell in an ipykernel on
this interpreter, with ``KAFKA_BOOTSTRAP_SERVERS`` set to the test broker: the notebook reads it
and starts no broker of its own; ``SCHEMA_REGISTRY_URL`` is set to a real registry where one
can run (section 7, Avro). Any cell error fails the test (``CellExecutionError`` names the
cell and shows its traceback). The committed copy's outputs come from a run on real Kafka; this
test never writes the notebook back.
"""

from __future__ import annotations

import re
import subprocess
import sys

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from nbclient import NotebookClient

from .fresh_process import REPO_ROOT, _tail, fresh_env

NOTEBOOK = REPO_ROOT / "notebooks" / "quickstart.ipynb"
CELL_TIMEOUT_S = 300      # the longest cell waits at most 180 s for the stream itself
KERNEL = "pykafka-test"


def outputs(nb, output_type: str):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == output_type:
                yield out


# Two minutes of its own timeline: 'once' keeps it out of the Kafka 2.2 and embedded passes. CI
# runs it twice on Kafka 4.0, on purpose: on the newest PySpark (pass 1) and on the oldest (lane
# B's groups pass, GROUP_FILES in .ci/run), since the notebook must run on 4.0 too (issue 36).
@pytest.mark.once
def test_quickstart_notebook_runs_top_to_bottom(bootstrap_servers, tmp_path, monkeypatch,
                                                request):
    for key, value in fresh_env().items():
        monkeypatch.setenv(key, value)
    if "PYTHONPATH" not in fresh_env():
        monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers)
    # Section 7 runs against a real registry where one can run (a Kafka broker and
    # SCHEMA_REGISTRY_HOME, as in CI), and says it was skipped elsewhere.
    try:
        registry = request.getfixturevalue("schema_registry")
    except pytest.skip.Exception:
        registry = None
    if registry:
        monkeypatch.setenv("SCHEMA_REGISTRY_URL", registry)
    else:
        monkeypatch.delenv("SCHEMA_REGISTRY_URL", raising=False)
    # A kernel on this very interpreter, whatever kernels the machine has installed.
    write_kernel_spec(tmp_path / "jupyter" / "kernels" / KERNEL, overrides={
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": KERNEL})
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))

    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    text = "".join(out.text for out in outputs(nb, "stream") if out.name == "stdout")
    assert f"Kafka: external broker at {bootstrap_servers}" in text
    produced, distinct = map(int, re.search(r"(\d+) produced; (\d+) distinct events read",
                                            text).groups())
    assert distinct == produced, "an event produced in the notebook was never read"
    assert "lag 0: everything committed" in text
    if registry:
        assert "200 Avro orders read as columns" in text
        assert ("200 orders in 3 city totals written as Avro by the sink, read back by "
                "confluent-kafka's AvroDeserializer") in text
    else:
        assert "No Schema Registry: set SCHEMA_REGISTRY_URL" in text
    plots = [o for kind in ("display_data", "execute_result") for o in outputs(nb, kind)
             if "image/png" in o.data]
    assert len(plots) == 1, "the notebook draws one figure (records per batch, lag over time)"


# The README promises `make demo` on a fresh machine: notebooks/demo.py on the embedded broker
# (no Docker, no KAFKA_HOME), ending with "demo OK". Nothing else ran it. About 45 s; 'once', so
# it runs on the newest PySpark and, in lane B's groups pass, on the oldest, whose AvailableNow
# path it takes too (one micro-batch, committed by the checkpoint's next run).
@pytest.mark.once
def test_the_readme_demo_runs_on_the_embedded_broker(tmp_path):
    env = fresh_env()
    for key in ("KAFKA_BOOTSTRAP_SERVERS", "KAFKA_HOME", "KAFKA_ZK_HOME"):
        env.pop(key, None)
    env["PYKAFKA_TEST_BROKER"] = "embedded"
    try:
        done = subprocess.run([sys.executable, str(REPO_ROOT / "notebooks" / "demo.py")],
                              cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the demo did not finish within 300 s:\n{_tail(exc.stdout)}\n"
                             f"{_tail(exc.stderr)}") from None
    assert done.returncode == 0, f"{_tail(done.stdout)}\n{_tail(done.stderr)}"
    assert "broker: embedded at " in done.stdout
    ok = re.search(r"demo OK in \d+ s: (\d+) events produced, each counted exactly once; "
                   r"query 2 resumed exactly where query 1 committed", done.stdout)
    assert ok and int(ok.group(1)) > 0, _tail(done.stdout)
