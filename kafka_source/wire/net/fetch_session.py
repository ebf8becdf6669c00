"""The client side of a Kafka fetch session (KIP-227, Fetch v7+).

A task that reads many partitions from one leader sends one Fetch request for all of them, again
and again. Without a session each request lists every partition and each response answers for
every partition, also those with nothing new. With a session the broker remembers the partitions
and their fetch offsets: after the first (full) request, an *incremental* request lists only the
partitions whose fetch offset or byte limit changed and those to drop ("forgotten"), and the
response leaves out partitions with nothing new. This is what the Java consumer does
(``FetchSessionHandler``); the rules kept here are the same:

* The first request of a connection is full, with session id 0 and epoch 0 (INITIAL): the
  broker answers with a new session id, or 0 if it did not create one (its session cache is
  full, or sessions are disabled). Without a session every request is full again (and asks for
  a session again).
* Each incremental request carries the session id and the next epoch (1, 2, ... wrapping to 1).
* A top-level error ends the session: the next request is full. After FETCH_SESSION_ID_NOT_FOUND
  (the broker evicted it) it asks for a new session; after any other error (e.g.
  INVALID_FETCH_SESSION_EPOCH) it carries the old session id with epoch 0, which closes that
  session on the broker and opens a new one.
* A partition left out of an incremental request is still fetched by the broker at its cached
  offset, so a partition whose range is done must be *forgotten*, not just left out.

One request is in flight per session at a time (the fetch loop pipelines one request ahead), so
the bookkeeping is a simple sequence: :meth:`FetchSession.build` then :meth:`FetchSession.done`.
The session lives as long as its connection; a connection that breaks drops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .fetch_protocol import FetchPartitionRequest, TopicPartition

INITIAL_EPOCH = 0
FINAL_EPOCH = -1          # also "no session" in a sessionless full request
_MAX_EPOCH = (1 << 31) - 1

FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


@dataclass(frozen=True)
class SessionRequest:
    """What one Fetch request must carry."""

    session_id: int
    epoch: int
    partitions: Mapping[TopicPartition, FetchPartitionRequest]   # to send (all, if full)
    forgotten: tuple[TopicPartition, ...]
    wanted: Mapping[TopicPartition, FetchPartitionRequest]       # the session's state after it

    @property
    def full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


class FetchSession:
    """Fetch-session state for one connection; ``supported`` is False below Fetch v7."""

    def __init__(self, supported: bool):
        self.supported = supported
        self.session_id = 0
        self.epoch = INITIAL_EPOCH
        # What the broker's session holds, as of the last answered request.
        self.partitions: dict[TopicPartition, FetchPartitionRequest] = {}
        self._pending: SessionRequest | None = None

    def build(self, wanted: Mapping[TopicPartition, FetchPartitionRequest]) -> SessionRequest:
        """The request that makes the broker fetch exactly ``wanted`` (in ``wanted``'s order
        for a full request)."""
        if self._pending is not None:
            raise RuntimeError("a fetch-session request is already in flight")
        wanted = dict(wanted)
        if not self.supported:
            request = SessionRequest(0, FINAL_EPOCH, wanted, (), wanted)
        elif self.epoch == INITIAL_EPOCH:
            request = SessionRequest(self.session_id, INITIAL_EPOCH, wanted, (), wanted)
        else:
            changed = {tp: p for tp, p in wanted.items() if self.partitions.get(tp) != p}
            forgotten = tuple(tp for tp in self.partitions if tp not in wanted)
            request = SessionRequest(self.session_id, self.epoch, changed, forgotten, wanted)
        self._pending = request
        return request

    def done(self, error_code: int, session_id: int) -> None:
        """The response to the pending request arrived with this top-level error code and
        session id."""
        request, self._pending = self._pending, None
        if request is None:
            raise RuntimeError("no fetch-session request is in flight")
        if not self.supported:
            return
        if error_code != 0:
            # Evicted: ask for a new one. Otherwise close the old one while opening a new one.
            self.session_id = 0 if error_code == FETCH_SESSION_ID_NOT_FOUND else self.session_id
            self.epoch = INITIAL_EPOCH
            self.partitions = {}
            return
        if request.full:
            if session_id != 0:
                self.session_id = session_id
                self.epoch = 1
                self.partitions = dict(request.wanted)
            else:
                self.reset()   # no session was created: the next request is full again
            return
        self.epoch = 1 if self.epoch >= _MAX_EPOCH else self.epoch + 1
        self.partitions = dict(request.wanted)

    def abandon(self) -> None:
        """The pending request's answer will never be read (the connection is being closed)."""
        self._pending = None
        self.reset()

    def reset(self) -> None:
        self.session_id = 0
        self.epoch = INITIAL_EPOCH
        self.partitions = {}

    @property
    def in_flight(self) -> bool:
        return self._pending is not None
