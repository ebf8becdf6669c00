"""``format("pykafka")`` without ``kafka_source.register``, in a fresh process and session.

PySpark's data source lookup imports the top-level ``pyspark_pykafka`` module that ``pip
install`` puts next to the package and registers its ``DefaultSource``. The script checks that
the driver never imported the package before registering it explicitly, and that an explicit
``register`` afterwards works too.
"""

from __future__ import annotations

import json

import pytest

from kafka_source.testing import create_topic, unique_topic_name

from .fresh_process import run_script
from .test_stream import group_timeouts, produce_counts, stream_options  # noqa: F401 (fixture)


@pytest.mark.once     # a Spark of its own (~40-60 s): what it checks is Spark's, not the broker's
def test_batch_and_stream_in_a_fresh_session_without_register(bootstrap_servers, group_timeouts,
                                                              tmp_path):
    topic = unique_topic_name("autoreg")
    create_topic(bootstrap_servers, topic, partitions=2)
    produce_counts(bootstrap_servers, topic, {0: 7, 1: 5})
    options = stream_options(bootstrap_servers, topic, group_timeouts,
                             **{"kafka.group.id": unique_topic_name("g-autoreg"),
                                "startingOffsets": "earliest"})

    out = run_script("fresh_session_reads.py", bootstrap_servers, topic, json.dumps(options),
                     cwd=tmp_path)

    assert out["session"] == "pyspark.sql.session.SparkSession"   # classic, not Connect
    assert out["batch"] == "12"
    assert out["stream"] == "12"
    assert out["imported kafka_source before register"] == "False"
    assert out["registered batch"] == "12"
