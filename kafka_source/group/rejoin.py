"""Driver side: where a classic group member's joins run, and cooperative rejoins in the
background.

A rebalance holds JoinGroup open until every member of the group has rejoined: for as long as
the slowest member takes, up to ``kafka.max.poll.interval.ms``. An eager member (``range``,
``roundrobin``) has given up all its partitions before it joins, so it has nothing to read
meanwhile and joins on the planning thread (:meth:`GroupMember._join`), which waits.

A cooperative member (``cooperative-sticky``, ``sticky``; KIP-429) keeps its partitions
through the rebalance, so the query need not stop reading them. It rejoins as Java's consumer
does from ``poll()``, without waiting: a :class:`BackgroundRejoin` thread runs JoinGroup and
SyncGroup on its own connection while the planning thread goes on planning micro-batches of
the partitions the member holds, and committing them in the generation it holds (the
coordinator accepts commits of the current generation while the group prepares a rebalance;
one the rebalance overtakes is refused and made again at the next trigger, without fencing
the member). The thread starts when the heartbeat thread hears of the rebalance -- the group
need not wait for the micro-batch running to end -- or at the next trigger.

The outcome is taken over by the planning thread only (:meth:`GroupMember._take_rejoin`), at
the start of a trigger, after it committed the batch that just completed: the partitions the
new assignment lacks were read up to that batch's end, their offsets are committed, and only
then does the member rejoin for the second round that hands them to their new owner (its
commit settled first). So nothing is read twice by the group, and the partitions the member
keeps are read on throughout -- no pause for them.

A member that was fenced holds nothing, and one whose subscription changed must give up the
topics it left before joining: both join on the planning thread, which waits for a background
rejoin running to end first.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ..wire.net.client import BrokerClient

if TYPE_CHECKING:
    from .member import GroupMember

log = logging.getLogger("kafka_source.group.member")


class JoinLink:
    """The connection a join runs on. Without ``client``: the planning thread's, sharing the
    member's coordinator node with its commits; with one: a background rejoin's own."""

    def __init__(self, member: "GroupMember", client: BrokerClient | None = None):
        self.member = member
        self.background = client is not None
        self.client = client or member._client
        self._node = None
        self.cancelled = False            # the member left: nothing is taken over

    def coordinator(self):
        if not self.background:
            return self.member._coordinator()
        if self._node is None:
            self._node = self.member._find_coordinator_on(self.client)
        return self._node

    def lost_coordinator(self) -> None:
        if self.background:
            self._node = None
        else:
            self.member._node = None


class BackgroundRejoin(threading.Thread):
    """One cooperative rejoin on its own connection (module docstring). What it ends with --
    an assignment in the member's ``_joined``, or :attr:`error` -- is taken over by the
    planning thread; :meth:`cancel` (the member leaves) makes it take nothing over."""

    def __init__(self, member: "GroupMember", topics: frozenset[str]):
        super().__init__(name=f"pykafka-rejoin-{member.group_id}", daemon=True)
        self.member = member
        self.topics = topics
        self.error: Exception | None = None
        self.link = JoinLink(member, member._rejoin_client())

    def cancel(self) -> None:
        self.link.cancelled = True

    def run(self) -> None:
        try:
            self.member.join_rounds(self.topics, self.link)
        except Exception as exc:          # raised on the planning thread by _take_rejoin
            if not self.link.cancelled:
                log.warning("Group '%s': rejoining in the background failed: %s",
                            self.member.group_id, exc)
            self.error = exc
