"""The DataSource glue: what ``kafka_source.register`` hands Spark."""

from __future__ import annotations

import pickle

import pytest
from pyspark import cloudpickle   # what Spark pickles a registered data source with

import kafka_source
from kafka_source.datasource import KafkaDataSource


class Context:
    def __init__(self, parallelism):
        self.defaultParallelism = parallelism


class Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class Session:
    """A classic session (with a SparkContext) or a Connect one (conf only)."""

    def __init__(self, parallelism=None, conf=None):
        self.registered = []
        self.dataSource = self
        self._parallelism = parallelism
        self.conf = Conf(conf or {})

    @property
    def sparkContext(self):
        if self._parallelism is None:
            raise RuntimeError("no SparkContext in Spark Connect")
        return Context(self._parallelism)

    def register(self, cls):
        self.registered.append(cls)


OPTIONS = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}


def test_register_carries_the_sessions_default_parallelism_to_the_planner():
    spark = Session(parallelism=6)
    kafka_source.register(spark)
    (cls,) = spark.registered
    assert issubclass(cls, KafkaDataSource) and cls.name() == "pykafka"
    # Spark pickles the class with cloudpickle and builds it in a planner worker
    again = pickle.loads(cloudpickle.dumps(cls))
    assert again.default_parallelism == 6
    source = again(OPTIONS)
    assert source.reader(source.schema()).parallelism == 6
    assert source.streamReader(source.schema()).parallelism == 6


@pytest.mark.parametrize("session,expected", [
    (Session(conf={"spark.default.parallelism": "12"}), 12),   # Spark Connect with the conf
    (Session(), None),                                          # nothing known
])
def test_without_a_spark_context(session, expected):
    kafka_source.register(session)
    (cls,) = session.registered
    assert cls.default_parallelism == expected
    assert (cls is KafkaDataSource) == (expected is None)
