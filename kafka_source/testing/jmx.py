"""A test broker's own counters, read over JMX with the distribution's ``JmxTool``.

Some outcomes are visible only on the broker's side: whether a client re-authenticated its SASL
session in time or had its connection closed for an expired one (KIP-368), for example. Kafka
counts them per listener and network thread in ``kafka.server:type=socket-server-metrics``.
Nodes of a :class:`~.cluster.KafkaCluster` listen for JMX on loopback
(``ClusterNode.jmx_port``); :func:`socket_server_metrics` sums a listener's counters over its
network threads. The tool is the one each distribution ships (``kafka.tools.JmxTool`` in 2.x,
``org.apache.kafka.tools.JmxTool`` from 3.5), run once (``--one-time``).
"""

from __future__ import annotations

import os
import subprocess
from typing import Iterable

__all__ = ["jmx_options", "socket_server_metrics"]

#: The socket server's counters of SASL sessions (KIP-368; Kafka 2.2+).
REAUTHENTICATION_METRICS = ("successful-authentication-total", "successful-reauthentication-total",
                            "failed-reauthentication-total", "expired-connections-killed-count")


def jmx_options(port: int) -> str:
    """``KAFKA_JMX_OPTS`` of a node that serves JMX on ``127.0.0.1:port`` only, without
    authentication (registry and RMI objects on the same port, so one free port is enough)."""
    return ("-Dcom.sun.management.jmxremote -Dcom.sun.management.jmxremote.authenticate=false "
            "-Dcom.sun.management.jmxremote.ssl=false "
            "-Dcom.sun.management.jmxremote.host=127.0.0.1 "
            f"-Dcom.sun.management.jmxremote.port={port} "
            f"-Dcom.sun.management.jmxremote.rmi.port={port} -Djava.rmi.server.hostname=127.0.0.1")


def _tool_class(kafka_home: str) -> str:
    # kafka-jmx.sh (3.5+) runs the tool's new home; 2.x has it in the core jar
    if os.path.isfile(os.path.join(kafka_home, "bin", "kafka-jmx.sh")):
        return "org.apache.kafka.tools.JmxTool"
    return "kafka.tools.JmxTool"


def socket_server_metrics(kafka_home: str, jmx_port: int, listener: str,
                          attributes: Iterable[str] = REAUTHENTICATION_METRICS, *,
                          processors: Iterable[int] | None = None,
                          env: dict[str, str] | None = None,
                          timeout_s: float = 60.0) -> dict[str, float]:
    """``attributes`` of ``listener``'s network threads on the broker serving JMX at
    ``jmx_port``, each summed over the threads: ``processors`` (their ids), else every one
    (a pattern, which Kafka 2.x's tool fails on: give 2.x brokers' ids, see
    :meth:`~.cluster.KafkaCluster.socket_server_metrics`). Raises ``RuntimeError`` with the
    tool's output when it fails or an attribute is missing (a broker too old for it, a wrong
    listener name or thread id)."""
    attributes = list(attributes)
    base = f"kafka.server:type=socket-server-metrics,listener={listener},networkProcessor="
    names = [f"{base}*"] if processors is None else [f"{base}{i}" for i in processors]
    cmd = [os.path.join(kafka_home, "bin", "kafka-run-class.sh"), _tool_class(kafka_home),
           "--jmx-url", f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{jmx_port}/jmxrmi",
           *(arg for name in names for arg in ("--object-name", name)),
           "--attributes", ",".join(attributes), "--one-time", "true",
           "--report-format", "properties"]
    tool_env = {**(env if env is not None else os.environ), "KAFKA_HEAP_OPTS": "-Xmx64m"}
    for key in ("JMX_PORT", "KAFKA_JMX_OPTS", "KAFKA_OPTS"):
        tool_env.pop(key, None)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                            env=tool_env, stdin=subprocess.DEVNULL)
    # one "<object name>:<attribute>=<value>" line per thread and attribute, after "time=..."
    sums: dict[str, float] = {}
    for line in result.stdout.splitlines():
        if not line.startswith(base):
            continue
        key, _, value = line.rpartition("=")
        attribute = key.rsplit(":", 1)[-1]
        try:
            sums[attribute] = sums.get(attribute, 0.0) + float(value)
        except ValueError:
            continue
    missing = [a for a in attributes if a not in sums]
    if result.returncode != 0 or missing:
        raise RuntimeError(f"JmxTool on 127.0.0.1:{jmx_port} found no {', '.join(missing)} in "
                           f"{' '.join(names)} (exit code {result.returncode}):\n"
                           f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return sums
