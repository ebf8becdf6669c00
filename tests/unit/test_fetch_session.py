"""The client side of fetch sessions (KIP-227): what each request carries."""

from __future__ import annotations

import pytest

from kafka_source.wire.net.fetch_protocol import FetchPartitionRequest as F
from kafka_source.wire.net.fetch_session import (FETCH_SESSION_ID_NOT_FOUND, FINAL_EPOCH,
                                             INITIAL_EPOCH, INVALID_FETCH_SESSION_EPOCH,
                                             FetchSession)

pytestmark = pytest.mark.pyspark_free

A, B, C = ("t", 0), ("t", 1), ("u", 0)


def test_first_request_is_full_and_opens_a_session():
    s = FetchSession(True)
    r = s.build({A: F(0, 100), B: F(5, 100)})
    assert (r.session_id, r.epoch, r.full) == (0, INITIAL_EPOCH, True)
    assert r.partitions == {A: F(0, 100), B: F(5, 100)} and r.forgotten == ()
    s.done(0, 77)
    assert (s.session_id, s.epoch) == (77, 1)


def test_incremental_requests_carry_changes_and_forgotten_partitions():
    s = FetchSession(True)
    s.build({A: F(0, 100), B: F(5, 100)})
    s.done(0, 77)
    r = s.build({A: F(10, 100), B: F(5, 100), C: F(0, 50)})   # A moved, C new, B unchanged
    assert (r.session_id, r.epoch, r.full) == (77, 1, False)
    assert r.partitions == {A: F(10, 100), C: F(0, 50)} and r.forgotten == ()
    s.done(0, 77)
    r = s.build({C: F(0, 80)})                                 # A, B done; C's limit changed
    assert (r.epoch, r.partitions, set(r.forgotten)) == (2, {C: F(0, 80)}, {A, B})
    s.done(0, 77)
    r = s.build({C: F(0, 80)})                                 # nothing changed
    assert (r.epoch, r.partitions, r.forgotten) == (3, {}, ())


def test_epochs_wrap_to_one():
    s = FetchSession(True)
    s.build({A: F(0, 1)})
    s.done(0, 5)
    s.epoch = (1 << 31) - 1
    s.build({A: F(0, 1)})
    s.done(0, 5)
    assert s.epoch == 1


def test_no_session_created_means_full_requests_again():
    s = FetchSession(True)
    s.build({A: F(0, 1)})
    s.done(0, 0)                      # the broker's session cache is full
    r = s.build({A: F(3, 1)})
    assert (r.session_id, r.epoch, r.full, r.partitions) == (0, INITIAL_EPOCH, True, {A: F(3, 1)})


def test_session_errors_start_over_with_a_full_request():
    s = FetchSession(True)
    s.build({A: F(0, 1)})
    s.done(0, 9)
    s.build({A: F(4, 1)})
    s.done(FETCH_SESSION_ID_NOT_FOUND, 0)          # evicted: ask for a new one
    r = s.build({A: F(4, 1)})
    assert (r.session_id, r.epoch, r.full, r.partitions) == (0, INITIAL_EPOCH, True, {A: F(4, 1)})
    s.done(0, 10)
    s.build({A: F(8, 1)})
    s.done(INVALID_FETCH_SESSION_EPOCH, 0)         # close the old one while opening a new one
    r = s.build({A: F(8, 1)})
    assert (r.session_id, r.epoch, r.full) == (10, INITIAL_EPOCH, True)


def test_without_session_support_every_request_is_full_and_sessionless():
    s = FetchSession(False)
    for offset in (0, 5):
        r = s.build({A: F(offset, 1)})
        assert (r.session_id, r.epoch, r.full, r.partitions) == (0, FINAL_EPOCH, True,
                                                                 {A: F(offset, 1)})
        s.done(0, 0)


def test_one_request_in_flight():
    s = FetchSession(True)
    s.build({A: F(0, 1)})
    with pytest.raises(RuntimeError, match="in flight"):
        s.build({A: F(0, 1)})
    s.abandon()                        # the connection closed before the answer came
    assert not s.in_flight and s.session_id == 0
    with pytest.raises(RuntimeError, match="no fetch-session request"):
        s.done(0, 1)
