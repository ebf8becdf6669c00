"""Kafka brokers for the tests, the demo and the benchmarks (see :mod:`.brokers`)."""

from .brokers import *  # noqa: F401,F403
from .brokers import __all__  # noqa: F401
