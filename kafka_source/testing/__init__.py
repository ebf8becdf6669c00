"""Kafka brokers for the tests, the demo and the benchmarks (see :mod:`.brokers`); a
fault-injecting proxy to put in front of one (:mod:`.proxy`, imported on its own); three-node
clusters of both Kafka generations for the failure scenarios (:mod:`.cluster`, imported on its
own)."""

from .brokers import *  # noqa: F401,F403
from .brokers import __all__  # noqa: F401
