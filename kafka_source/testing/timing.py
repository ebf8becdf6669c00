"""Where a test run's time goes: a pytest plugin, on when ``PYKAFKA_TEST_TIMING`` names a file.

CI's passes take most of the time CI may take, and what to cut depends on where that time goes.
For every test (setup, call and teardown together) this plugin splits the wall-clock time of the
pytest process into:

``spark``
    creating and stopping SparkSessions (``SparkSession.Builder.getOrCreate`` when it creates
    one, ``SparkSession.stop``);
``brokers``
    starting, restarting and stopping brokers, ZooKeepers and clusters (the ``start``, ``stop``
    and ``restart`` of every :class:`~kafka_source.testing.brokers.BrokerHandle`), including the
    waits inside them;
``sleep_fixed``
    ``time.sleep`` called from a line that is in no loop of its function: a fixed pause;
``sleep_loop``
    ``time.sleep`` called from inside a ``for`` or ``while`` loop: polling for a condition, or
    pacing;
``work``
    the rest: the test itself, Spark jobs, Kafka requests, waits on streams and threads.

Only the pytest process's main thread is measured (Spark's Python workers and the brokers are
other processes; threads a test starts overlap with its main thread). Time inside one category
is not counted again in another (a sleep inside a broker start is ``brokers``). Each test also
gets ``cpu``: the whole machine's busy core-seconds over the test (``/proc/stat``), so that the
share of the cores a test leaves idle can be read off (``cpu / (wall * cores)``).

Each test is one JSON line in the file (appended, so that several passes can share one file,
each line naming its ``pass``: ``PYKAFKA_TEST_TIMING_PASS``). ``python -m
kafka_source.testing.timing FILE`` prints the table per pass and the slowest tests.
"""

from __future__ import annotations

import ast
import functools
import json
import linecache
import os
import sys
import threading
import time
from collections import defaultdict
from typing import Any, Callable

ENV_FILE = "PYKAFKA_TEST_TIMING"
ENV_PASS = "PYKAFKA_TEST_TIMING_PASS"

CATEGORIES = ("spark", "brokers", "sleep_fixed", "sleep_loop")
#: The record of a whole pytest session (its wall-clock time), beside the tests' records.
SESSION = "(session)"
_OLD_OUTSIDE = "(outside tests)"  # the first version's record of the time outside tests


def _machine_busy_s() -> float:
    """Busy core-seconds of the whole machine since boot (everything in /proc/stat's ``cpu`` line
    but idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class _LoopLines:
    """Which lines of a source file are inside a ``for``/``while`` loop of their function."""

    def __init__(self) -> None:
        self._files: dict[str, set[int]] = {}

    def in_loop(self, filename: str, lineno: int) -> bool:
        lines = self._files.get(filename)
        if lines is None:
            lines = self._files[filename] = self._parse(filename)
        return lineno in lines

    @staticmethod
    def _parse(filename: str) -> set[int]:
        source = "".join(linecache.getlines(filename))
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return set()
        lines: set[int] = set()

        def visit(node: ast.AST, looped: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, False)  # a loop outside a function does not loop its body
                    continue
                inner = looped or isinstance(child, (ast.For, ast.While, ast.AsyncFor,
                                                     ast.comprehension))
                if inner and hasattr(child, "lineno"):
                    end = getattr(child, "end_lineno", child.lineno) or child.lineno
                    if looped or not isinstance(child, (ast.For, ast.While, ast.AsyncFor)):
                        lines.update(range(child.lineno, end + 1))
                visit(child, inner)

        visit(tree, False)
        return lines


class TimingPlugin:
    """Registered by ``tests/conftest.py`` when ``PYKAFKA_TEST_TIMING`` is set."""

    def __init__(self, path: str, pass_name: str) -> None:
        self.path = path
        self.pass_name = pass_name
        self._main = threading.main_thread()
        self._depth = 0  # > 0 while inside a measured category (no double counting)
        self._current: dict[str, float] = defaultdict(float)
        self._loops = _LoopLines()
        self._undo: list[Callable[[], None]] = []
        self._test_start = 0.0
        self._cpu_start = 0.0
        self._session_start = time.monotonic()
        self._records: list[dict[str, Any]] = []

    # -- instrumentation ---------------------------------------------------------------------

    def _measured(self, category: str, fn: Callable) -> Callable:
        plugin = self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if threading.current_thread() is not plugin._main or plugin._depth:
                return fn(*args, **kwargs)
            plugin._depth += 1
            t0 = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                plugin._current[category] += time.monotonic() - t0
                plugin._depth -= 1

        wrapper.__pykafka_timed__ = True
        return wrapper

    def _patch(self, owner: Any, name: str, category: str) -> None:
        fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if fn is None or getattr(fn, "__pykafka_timed__", False):
            return
        setattr(owner, name, self._measured(category, fn))
        self._undo.append(lambda: setattr(owner, name, fn))

    def _sleep(self, real_sleep: Callable[[float], None]) -> Callable[[float], None]:
        plugin = self

        @functools.wraps(real_sleep)
        def sleep(seconds: float) -> None:
            if threading.current_thread() is not plugin._main or plugin._depth:
                return real_sleep(seconds)
            frame = sys._getframe(1)
            category = ("sleep_loop" if plugin._loops.in_loop(frame.f_code.co_filename,
                                                              frame.f_lineno)
                        else "sleep_fixed")
            t0 = time.monotonic()
            try:
                return real_sleep(seconds)
            finally:
                plugin._current[category] += time.monotonic() - t0

        return sleep

    def install(self) -> None:
        real_sleep = time.sleep
        time.sleep = self._sleep(real_sleep)
        self._undo.append(lambda: setattr(time, "sleep", real_sleep))
        try:
            from pyspark.sql import SparkSession

            self._patch(SparkSession.Builder, "getOrCreate", "spark")
            self._patch(SparkSession, "stop", "spark")
        except Exception:  # pragma: no cover - no pyspark
            pass
        from . import brokers

        handles = [brokers.BrokerHandle, brokers.EmbeddedBroker, brokers.ExternalBroker,
                   brokers._LocalDistributionBroker, brokers.LocalKafkaBroker,
                   brokers.LocalZkKafkaBroker, brokers.TestcontainersBroker]
        try:
            from . import cluster

            handles.append(cluster.KafkaCluster)
        except Exception:  # pragma: no cover
            pass
        for cls in handles:
            for name in ("start", "stop", "restart"):
                self._patch(cls, name, "brokers")
        self._patch(brokers, "select_broker", "brokers")

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    # -- pytest hooks ------------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self._current = defaultdict(float)
        self._test_start = time.monotonic()
        self._cpu_start = _machine_busy_s()

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        wall = time.monotonic() - self._test_start
        record: dict[str, Any] = {"pass": self.pass_name, "test": nodeid, "wall": round(wall, 3),
                                  "cpu": round(_machine_busy_s() - self._cpu_start, 3)}
        for category in CATEGORIES:
            record[category] = round(self._current.get(category, 0.0), 3)
        record["work"] = round(max(0.0, wall - sum(self._current.values())), 3)
        self._records.append(record)

    def pytest_sessionfinish(self, session) -> None:
        total = time.monotonic() - self._session_start
        worker = hasattr(session.config, "workerinput")  # a pytest-xdist worker process
        controller = not worker and bool(getattr(session.config.option, "numprocesses", None))
        with open(self.path, "a") as f:
            import fcntl

            fcntl.flock(f, fcntl.LOCK_EX)  # passes side by side append to one file
            if not controller:  # the controller of -n N runs no test: its workers say
                for record in self._records:
                    f.write(json.dumps(record) + "\n")
            if not worker:
                # The pass on the clock, collection and session ends included.
                f.write(json.dumps({"pass": self.pass_name, "test": SESSION,
                                    "wall": round(total, 3)}) + "\n")
        self.uninstall()

    def pytest_terminal_summary(self, terminalreporter) -> None:
        config = terminalreporter.config
        if not self._records or (not hasattr(config, "workerinput")
                                 and getattr(config.option, "numprocesses", None)):
            return  # the controller of -n N only hears of its workers' tests
        sums = {c: sum(r[c] for r in self._records) for c in (*CATEGORIES, "work", "wall")}
        terminalreporter.write_line(
            "time per category (s): " + ", ".join(f"{c} {sums[c]:.0f}" for c in sums)
            + f" -> {self.path}")


def register(config) -> None:
    """Called from ``pytest_configure``: installs the plugin when ``PYKAFKA_TEST_TIMING`` is set."""
    path = os.environ.get(ENV_FILE)
    if not path:
        return
    plugin = TimingPlugin(os.path.abspath(path), os.environ.get(ENV_PASS, "pytest"))
    plugin.install()
    config.pluginmanager.register(plugin, "pykafka-timing")


# -- the report ------------------------------------------------------------------------------

def report(path: str, slowest: int = 25) -> str:
    """The markdown tables for a timing file: one row per pass, then the slowest tests.

    A pass's *wall* is its pytest session on the clock; the other columns add up its tests
    (setup, call and teardown), so where tests ran in parallel processes (``-n 2``) they can
    add up to more than the wall; *outside tests* is the wall that no test held (collection,
    imports, the end of the session), or nothing for a parallel pass."""
    by_pass: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                by_pass[record["pass"]].append(record)
    cores = os.cpu_count() or 1
    cols = ("spark", "brokers", "sleep_fixed", "sleep_loop", "work")
    out = ["| pass | tests | wall s | Spark sessions | brokers, clusters | fixed sleeps "
           "| polling sleeps | work | outside tests | machine busy |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    grand: dict[str, float] = defaultdict(float)
    for name, records in by_pass.items():
        tests = [r for r in records if r["test"] not in (SESSION, _OLD_OUTSIDE)]
        wall = sum(r["wall"] for r in records if r["test"] == SESSION) or sum(
            r["wall"] for r in records)  # files of the first version: tests + outside them
        sums = {c: sum(r[c] for r in tests) for c in cols}
        test_wall = sum(r["wall"] for r in tests)
        outside = max(0.0, wall - test_wall)
        busy = sum(r["cpu"] for r in tests) / (max(test_wall, 1e-9) * cores)
        out.append(f"| {name} | {len(tests)} | {wall:.0f} | "
                   + " | ".join(f"{sums[c]:.0f}" for c in cols)
                   + f" | {outside:.0f} | {busy:.0%} |")
        grand["wall"] += wall
        grand["outside"] += outside
        for c in cols:
            grand[c] += sums[c]
    out.append(f"| all | | {grand['wall']:.0f} | " + " | ".join(f"{grand[c]:.0f}" for c in cols)
               + f" | {grand['outside']:.0f} | |")
    out.append("")
    out.append(f"| the {slowest} slowest tests | pass | wall s | Spark | brokers | fixed sleeps "
               "| polling sleeps | work | machine busy |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    everything = [r for records in by_pass.values() for r in records
                  if r["test"] not in (SESSION, _OLD_OUTSIDE)]
    for r in sorted(everything, key=lambda r: -r["wall"])[:slowest]:
        busy = r["cpu"] / (max(r["wall"], 1e-9) * cores)
        out.append(f"| `{r['test']}` | {r['pass']} | {r['wall']:.1f} | "
                   + " | ".join(f"{r[c]:.1f}" for c in cols) + f" | {busy:.0%} |")
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover - a command
    import argparse

    parser = argparse.ArgumentParser(description="Where a test run's time went (PYKAFKA_TEST_TIMING).")
    parser.add_argument("file")
    parser.add_argument("--slowest", type=int, default=25)
    args = parser.parse_args()
    print(report(args.file, args.slowest))
