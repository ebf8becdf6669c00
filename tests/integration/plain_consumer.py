"""kafka-python group consumers for tests that put a plain consumer beside a query.

kafka-python 3.0.12 can leave a consumer in a rebalance forever. Its ``poll(timeout_ms)``
gives up waiting when the timeout ends during a JoinGroup/SyncGroup round trip and leaves the
round trip running, to be awaited by the next poll. But the next poll only awaits it while
``need_rejoin()`` is true, and that can already be false:

- the rebalance was asked for by a metadata change (the topic's partitions appeared after a
  first join that assigned nothing), not by the flag the coordinator clears on completion;
- as leader, the consumer has already taken its new metadata snapshot while assigning.

The SyncGroup answer then arrives with nobody to take it. The consumer stays REBALANCING, with
no assignment and no heartbeats, until its session expires and after. It was seen in CI
(120 s, Kafka 2.2) and reproduced here without Spark, once in 40 fresh groups with 200 ms polls.
Java's consumer keeps rejoining while a join is pending (``rejoinNeededOrPending()``);
:func:`group_consumer` gives kafka-python's coordinator the same rule.
"""

from __future__ import annotations

from kafka import KafkaConsumer


def group_consumer(*topics: str, **config) -> KafkaConsumer:
    """A ``KafkaConsumer(*topics, **config)`` whose coordinator also rejoins while a join it
    started is still pending (see the module's docstring)."""
    consumer = KafkaConsumer(*topics, **config)
    coordinator = consumer._coordinator
    if not hasattr(coordinator, "_join_task"):
        # Another kafka-python: let a test that needs the rule fail on its own, never hide it.
        return consumer
    need_rejoin = coordinator.need_rejoin

    def need_rejoin_or_pending() -> bool:
        return need_rejoin() or coordinator._join_task is not None

    coordinator.need_rejoin = need_rejoin_or_pending
    return consumer
