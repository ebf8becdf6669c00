"""Kafka's own Java consumer as another member of a query's group, for the group tests.

``kafka-console-consumer.sh`` of the distribution in ``KAFKA_HOME`` (the Java client of that
release), run as a subprocess that prints each record's value on a line of its own; its
consumer settings are Java's (``partition.assignment.strategy``, ``group.protocol``...), passed
with ``--consumer-property``. Tests that use it skip when no distribution is at hand.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time

import pytest

ASSIGNORS = {
    "range": "org.apache.kafka.clients.consumer.RangeAssignor",
    "roundrobin": "org.apache.kafka.clients.consumer.RoundRobinAssignor",
    "sticky": "org.apache.kafka.clients.consumer.StickyAssignor",
    "cooperative-sticky": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
}


def kafka_home() -> str:
    home = os.environ.get("KAFKA_HOME")
    if not home or not os.path.exists(os.path.join(home, "bin", "kafka-console-consumer.sh")):
        pytest.skip("no Kafka distribution (KAFKA_HOME) for Kafka's Java console consumer")
    return home


class JavaConsumer:
    """A running ``kafka-console-consumer.sh`` in ``group`` on ``topic``, reading from the
    earliest offset when the group has none, committing automatically every 200 ms.

    ``track_arrivals``: a thread also reads its output as it grows (every 20 ms) and notes when
    each line arrived (:meth:`arrivals`), for measuring how long it read nothing."""

    def __init__(self, bootstrap: str, topic: str, group: str, *, assignors: list[str] = (),
                 session_timeout_ms: int = 45_000, client_id: str = "java-consumer",
                 track_arrivals: bool = False, **properties):
        home = kafka_home()
        strategy = ",".join(ASSIGNORS.get(a, a) for a in assignors)
        props = {"partition.assignment.strategy": strategy,
                 "session.timeout.ms": str(session_timeout_ms),
                 "heartbeat.interval.ms": str(max(100, session_timeout_ms // 5)),
                 "auto.commit.interval.ms": "200", "client.id": client_id,
                 **{k: str(v) for k, v in properties.items()}}
        if not strategy:
            # No assignors given: Java's defaults (RangeAssignor, CooperativeStickyAssignor), as
            # a consumer configured with nothing has them; an empty list is not the default.
            props.pop("partition.assignment.strategy")
        if props.get("group.protocol") == "consumer":
            # The consumer protocol (KIP-848): the brokers assign and keep the session; Java's
            # consumer refuses these settings with it.
            for key in ("partition.assignment.strategy", "session.timeout.ms",
                        "heartbeat.interval.ms"):
                props.pop(key, None)
        args = [os.path.join(home, "bin", "kafka-console-consumer.sh"),
                "--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
                "--from-beginning"]
        for key, value in props.items():
            args += ["--consumer-property", f"{key}={value}"]
        self._out = tempfile.NamedTemporaryFile("w+", prefix="java-consumer-", suffix=".out",
                                                delete=False)
        self._err = tempfile.NamedTemporaryFile("w+", prefix="java-consumer-", suffix=".err",
                                                delete=False)
        env = {**os.environ, "KAFKA_HEAP_OPTS": "-Xmx256m", "LOG_DIR": tempfile.gettempdir()}
        self.process = subprocess.Popen(args, stdout=self._out, stderr=self._err, env=env)
        self._arrivals: list[tuple[float, str]] = []
        self._tail_stop = threading.Event()
        self._tail = None
        if track_arrivals:
            self._tail = threading.Thread(target=self._follow, daemon=True,
                                          name=f"java-consumer-tail-{group}")
            self._tail.start()

    def _follow(self) -> None:
        with open(self._out.name, "rb") as f:
            pending = b""
            while True:
                stopping = self._tail_stop.is_set()
                chunk = f.read()
                if chunk:
                    now = time.time()
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    self._arrivals.extend(
                        (now, line.decode("utf-8", "replace")) for line in lines)
                if stopping:
                    return
                self._tail_stop.wait(0.02)

    def arrivals(self) -> list[tuple[float, str]]:
        """(epoch seconds when the line was first seen, value) of the complete lines so far;
        only with ``track_arrivals``."""
        return list(self._arrivals)

    def values(self) -> list[str]:
        """The values printed so far (complete lines only)."""
        with open(self._out.name, encoding="utf-8", errors="replace") as f:
            text = f.read()
        return text.split("\n")[:-1]

    def stderr(self) -> str:
        with open(self._err.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def close(self) -> None:
        """Stop it as Ctrl-C does: it commits, leaves the group and exits."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._tail is not None:
            self._tail_stop.set()
            self._tail.join(10)
        for f in (self._out, self._err):
            f.close()
            os.unlink(f.name)
