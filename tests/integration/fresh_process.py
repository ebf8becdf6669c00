"""Run the scripts in ``scripts/`` in fresh Python processes, bounded in time.

The environment is the test run's, except that the repository root is taken off PYTHONPATH (the
``spark`` fixture puts it there): a fresh process must find the package the way a user's would,
through its installation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"
REPO_ROOT = Path(__file__).resolve().parents[2]


def fresh_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and Path(p).resolve() != REPO_ROOT]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    return env


def script_command(name: str, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / name), *args]


def run_script(name: str, *args: str, cwd, timeout_s: float = 300) -> dict[str, str]:
    """Run ``scripts/name`` and return its ``key value`` output lines as a dict (the last word
    of each line is the value); fail with the output's tail if it fails or times out."""
    try:
        done = subprocess.run(script_command(name, *args), cwd=cwd, env=fresh_env(),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{name} did not finish within {timeout_s} s; output:\n"
                             f"{_tail(exc.stdout)}\n{_tail(exc.stderr)}") from None
    if done.returncode != 0:
        raise AssertionError(f"{name} exited with {done.returncode}:\n{_tail(done.stdout)}\n"
                             f"first error: {_first_error(done.stderr)}\n{_tail(done.stderr)}")
    result = {}
    for line in done.stdout.splitlines():
        key, _, value = line.rpartition(" ")
        if key:
            result[key.rstrip(":")] = value
    return result


def _first_error(text: str) -> str:
    """The first line naming an error: Spark's error class line, or a Python exception."""
    for line in (text or "").splitlines():
        if "Error" in line or "Exception" in line or line.startswith("["):
            return line.strip()
    return "(none found)"


def _tail(text, lines: int = 40) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return "\n".join((text or "").splitlines()[-lines:])
