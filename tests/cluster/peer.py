"""Another member of a scenario's consumer group: a :class:`~kafka_source.group.member.
GroupMember` of the connector's own, driven by a thread as a query's planner drives one, that
takes partitions from the stream and gives them back, reading and committing nothing.

A scenario uses peers to make the group rebalance while a fault happens. A peer can be *held*:
it stops heartbeating and joining, so that a rebalance waits for it -- as a group waits for a
slow member, up to the rebalance timeout -- until it is released.
"""

from __future__ import annotations

import threading

#: The peers' group timeouts: a held peer must not be dropped by its coordinator during a
#: scenario (its session is long), and a rebalance may wait for it that long.
PEER_SESSION_MS = 30_000
PEER_REBALANCE_MS = 60_000


class Peer(threading.Thread):
    """A member of ``group`` subscribed to ``topic`` with ``assignor``; ``ensure_active`` every
    ``interval_s`` (a planner's trigger) until :meth:`close`, which leaves the group. Errors of
    a join (expected while a coordinator is down) are kept in :attr:`errors` and the join is
    tried again at the next turn."""

    def __init__(self, bootstrap: str, topic: str, group: str, name: str, *,
                 assignor: str = "cooperative-sticky", interval_s: float = 0.5):
        from kafka_source.config.options import parse_stream_options
        from kafka_source.group.assignors import load_assignor
        from kafka_source.group.member import GroupMember
        from kafka_source.wire.net.client import BrokerClient

        super().__init__(name=f"peer-{name}", daemon=True)
        options = parse_stream_options({
            "kafka.bootstrap.servers": bootstrap, "subscribe": topic, "kafka.group.id": group,
            "assignor": assignor, "kafka.client.id": name,
            "kafka.session.timeout.ms": str(PEER_SESSION_MS),
            "kafka.heartbeat.interval.ms": "1000",
            "kafka.max.poll.interval.ms": str(PEER_REBALANCE_MS)})
        config = options.source.client_config
        self.topic = topic
        self.interval_s = interval_s
        self.member = GroupMember(BrokerClient(config), lambda: BrokerClient(config),
                                  options.group, load_assignor(assignor))
        self.errors: list[str] = []
        self.joins = 0
        self._held = threading.Event()
        self._closing = threading.Event()

    @property
    def member_id(self) -> str:
        return self.member.generation.member_id

    def run(self) -> None:
        while not self._closing.is_set():
            if not self._held.is_set():
                try:
                    self.member.ensure_active([self.topic])
                    self.joins += 1
                except Exception as exc:  # noqa: BLE001 - kept, tried again next turn
                    self.errors.append(repr(exc)[:300])
            self._closing.wait(self.interval_s)

    def hold(self) -> None:
        """Stop heartbeating and joining: a rebalance that starts now waits for this member."""
        self._held.set()
        self.member._stop_heartbeat()

    def release(self) -> None:
        """Rejoin at the next turn (the member has not heard of the rebalance: it is told)."""
        self.member.request_rejoin("the scenario releases it")
        self._held.clear()

    def close(self) -> None:
        self._closing.set()
        self.join(60)
        self.member.close()
