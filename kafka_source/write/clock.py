"""The producer's clock: time as :class:`~kafka_source.write.producer.Producer` and the
driver-side transaction functions of :mod:`kafka_source.write.transactions` and
:mod:`kafka_source.write.ending` see it.

A module of its own because all of them take it as their ``clock`` argument: the unit tests
pass a simulated clock (``tests/unit/fake_produce_cluster.py``), so that timeouts of minutes
(``kafka.delivery.timeout.ms``, ``kafka.max.block.ms``, retry backoffs) run in no time.
"""

from __future__ import annotations

import time

__all__ = ["Clock"]


class Clock:
    """Time as the producer sees it; unit tests substitute a simulated one."""

    now = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    @staticmethod
    def wall_ms() -> int:
        return int(time.time() * 1000)
