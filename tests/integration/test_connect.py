"""Batch and stream reads through Spark Connect (``SparkSession.builder.remote(...)``).

A local Connect server runs in its own process, as ``start-connect-server.sh`` would run it; its
Python workers run the package (found by data source auto-discovery, so the client registers
nothing). The client is a fresh process too: one process cannot hold a classic session and a
Connect session at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from kafka_source.testing import create_topic, unique_topic_name
from kafka_source.testing.brokers import _free_port

from .fresh_process import fresh_env, run_script, script_command
from .test_stream import group_timeouts, produce_counts, stream_options  # noqa: F401 (fixture)

SERVER_START_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("connect") / "server.log"
    log = open(log_path, "w")
    server = subprocess.Popen(script_command("connect_server.py", str(port)), env=fresh_env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                              text=True, start_new_session=True)
    ready = threading.Event()
    threading.Thread(target=lambda: ready.set() if server.stdout.readline().strip() == "READY"
                     else None, daemon=True).start()
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not ready.wait(0.5):
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Spark Connect server not ready (exit code {server.poll()})"
                                     f":\n{log_path.read_text()[-4000:]}")
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.stdin.close()          # the server stops its session when stdin closes
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()


@pytest.mark.once     # a Spark Connect server of its own: CI's first pass only
def test_batch_and_stream_reads_through_spark_connect(connect_url, bootstrap_servers,
                                                      group_timeouts, tmp_path):
    topic = unique_topic_name("connect")
    create_topic(bootstrap_servers, topic, partitions=3)
    produce_counts(bootstrap_servers, topic, {0: 4, 1: 5, 2: 6})
    options = stream_options(bootstrap_servers, topic, group_timeouts,
                             **{"kafka.group.id": unique_topic_name("g-connect"),
                                "startingOffsets": "earliest"})

    out = run_script("fresh_session_reads.py", bootstrap_servers, topic, json.dumps(options),
                     connect_url, cwd=tmp_path)

    assert out["session"] == "pyspark.sql.connect.session.SparkSession"
    assert out["batch"] == "15"
    assert out["stream"] == "15"
    assert out["imported kafka_source before register"] == "False"
    assert out["registered batch"] == "15"
