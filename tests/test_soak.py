"""benchmarks/soak.py's verdict and its readings of /proc: what decides whether an hour-long run
lost or duplicated anything, and whether a curve grows, must be right on its own (the soak itself
runs for hours and is not part of CI)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.pyspark_free

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import soak  # noqa: E402


@pytest.mark.parametrize("text, seconds", [("3600", 3600), ("90s", 90), ("20m", 1200),
                                           ("1h", 3600), ("1h30m", 5400), ("2.5m", 150)])
def test_durations(text, seconds):
    assert soak.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1d", "h", "10 m", "1h-5m"])
def test_a_duration_it_cannot_read_names_what_would_do(text):
    with pytest.raises(argparse.ArgumentTypeError, match="1h, 20m"):
        soak.parse_duration(text)


def test_slope_of_a_line_per_hour():
    # 2 units per minute is 120 per hour, whatever the offset
    points = [(t, 50 + 2 * t / 60) for t in range(0, 1800, 60)]
    assert soak.slope_per_hour(points) == pytest.approx(120.0)
    assert soak.slope_per_hour([(t, 7.0) for t in range(0, 600, 60)]) == pytest.approx(0.0)
    assert soak.slope_per_hour([(0, 1.0), (60, 2.0)]) is None       # too few points
    assert soak.slope_per_hour([(60, 1.0)] * 4) is None              # no time between them


def test_slopes_leave_out_the_warmup_and_missing_samples():
    samples = [{"t_s": t, "rss": (10 * t if t < 600 else 6000 + t / 3600), "lag": ""}
               for t in range(0, 3600, 60)]
    samples[20]["rss"] = None
    out = soak.slopes(samples, 600, ["rss", "lag"])
    assert out["rss"]["slope_per_hour"] == pytest.approx(1.0, abs=1e-6)   # not the warm-up's
    assert out["rss"]["points"] == 49
    assert out["rss"]["pct_per_hour"] == pytest.approx(100 / 6000, abs=0.01)
    assert out["lag"] == {"slope_per_hour": None, "mean": None, "pct_per_hour": None,
                          "points": 0}


def test_output_values_keep_colons_in_the_value():
    assert soak.parse_output(["0:5:a:b", "0:5:a:b", "2:0:x"]) == Counter(
        {(0, 5, "a:b"): 2, (2, 0, "x"): 1})


TRUTH = {(0, 0): "s0", (0, 1): "s2", (1, 0): "s1", (1, 1): "s3"}


def test_every_record_once_is_clean():
    result = soak.check_output(TRUTH, Counter({(p, o, v): 1 for (p, o), v in TRUTH.items()}))
    assert (result["lost"], result["duplicated"], result["wrong"]) == (0, 0, 0)
    assert result["written"] == 4


def test_lost_duplicated_and_wrong_records_are_counted_and_named():
    written = Counter({(0, 0, "s0"): 3, (1, 0, "s1"): 1, (1, 1, "other"): 1})
    result = soak.check_output(TRUTH, written)
    assert result["lost"] == 2                       # (0, 1) and (1, 1): a wrong value is no copy
    assert result["duplicated"] == 2                 # (0, 0) twice too many
    assert result["wrong"] == 1
    assert result["examples"]["lost"] == [(0, 1), (1, 1)]
    assert result["examples"]["duplicated"] == [(0, 0)]
    assert result["examples"]["wrong"] == [(1, 1, "other")]


def test_what_another_member_read_is_counted_and_must_still_be_written():
    written = Counter({(0, 0, "s0"): 1, (1, 0, "s1"): 1, (1, 1, "s3"): 1})
    java = {(0, 1): 1, (1, 1): 1}                    # the Java consumer held partitions a while
    result = soak.check_output(TRUTH, written, java)
    assert result["read_by_other_member"] == 2
    assert result["reread_across_members"] == 1      # (1, 1): read by both members
    # the Java consumer commits nothing: (0, 1) should have come back to the query
    assert (result["lost"], result["duplicated"]) == (1, 0)
    assert result["examples"]["lost"] == [(0, 1)]


@pytest.mark.parametrize("argv, kind", [
    ([b"/usr/lib/jvm/java-17/bin/java", b"-cp", b"x", b"org.apache.spark.deploy.SparkSubmit",
      b"pyspark-shell"], "driver-jvm"),
    ([b"/v/bin/python", b"-m", b"pyspark.sql.streaming.python_streaming_source_runner"],
     "source-runner"),
    ([b"/v/bin/python", b"-m", b"pyspark.daemon", b"pyspark.sql.worker.plan_data_source_read"],
     "planner"),
    ([b"/v/bin/python", b"-m", b"pyspark.daemon", b"pyspark.worker"], "executor"),
    ([b"/v/bin/python", b"-m", b"pyspark.daemon"], "executor"),
    ([b"/usr/bin/java", b"-cp", b"y", b"kafka.Kafka", b"server.properties"], None),
    ([b"/usr/bin/java", b"kafka.tools.ConsoleConsumer"], None),
])
def test_process_kinds(argv, kind):
    assert soak.process_kind(b"\0".join(argv) + b"\0") == kind


def test_established_connections_to_the_brokers_ports_only(tmp_path):
    # /proc/net/tcp's layout: local and remote address as hex ip:port, state 01 = ESTABLISHED
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n"
        "   0: 0100007F:D431 0100007F:2382 01 00000000:00000000 00:00000000 00000000 0 0 111 1\n"
        "   1: 0100007F:D432 0100007F:2382 06 00000000:00000000 00:00000000 00000000 0 0 112 1\n"
        "   2: 0100007F:D433 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 0 0 113 1\n"
        "   3: 0100007F:2382 0100007F:D434 0A 00000000:00000000 00:00000000 00000000 0 0 114 1\n")
    # 0x2382 = 9090 (a broker), 0x1F90 = 8080 (not one); state 06 TIME_WAIT, 0A LISTEN
    assert soak.established_to({9090}, tables=(str(table),)) == {111: 9090}


def test_a_process_connection_to_a_broker_is_found_through_its_socket():
    # a real connection from a child process, found as sample_processes finds it: the socket
    # inodes among its file descriptors, ESTABLISHED to the port in /proc/net/tcp
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    connected_r, connected_w = os.pipe()      # child -> parent: connected
    done_r, done_w = os.pipe()                # parent -> child: looked, you may go
    pid = os.fork()
    if pid == 0:   # the child: connect, say so, wait
        try:
            client = socket.create_connection(("127.0.0.1", port))
            os.write(connected_w, b"x")
            os.read(done_r, 1)
            client.close()
        finally:
            os._exit(0)
    try:
        os.read(connected_r, 1)
        accepted, _ = server.accept()
        child = soak.process_figures(pid)
        assert child is not None and child["fds"] >= 3 and child["threads"] >= 1
        assert soak.established_to({port}).values() and any(
            inode in soak.established_to({port}) for inode in child["sockets"])
        accepted.close()
    finally:
        os.write(done_w, b"x")
        os.waitpid(pid, 0)
        server.close()
        for fd in (connected_r, connected_w, done_r, done_w):
            os.close(fd)


def test_jstat_gc_gives_the_old_generation_and_metaspace_in_use():
    text = ("    S0C         S1C         S0U         S1U          EC           EU           OC  "
            "         OU          MC         MU       CCSC      CCSU     YGC     YGCT     FGC  "
            "  FGCT     CGC    CGCT       GCT   \n"
            "        0.0      7168.0         0.0      7168.0     322560.0      53248.0     "
            "193536.0     133257.9   150336.0   149000.1   18368.0   17655.5    503    30.150  "
            "   1     0.440   142    10.717    41.307\n")
    assert soak.parse_jstat_gc(text) == {"driver-jvm_old_mb": 130.1,
                                         "driver-jvm_metaspace_mb": 145.5}
    assert soak.parse_jstat_gc("") == {}
    assert soak.parse_jstat_gc("12345 not found\n") == {}
