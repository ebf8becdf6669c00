"""kafka_source.wire.format._recwalk (the C record walk) on its own: what it reads and where it
refuses. Its results on real record batches are checked against the reference decoder in
test_fast_decode.py, which runs every case through both walks."""

from __future__ import annotations

import numpy as np
import pytest

from kafka_source.wire.format import fast_decode as fd

from . import record_builder as rb
from .record_builder import R

pytestmark = pytest.mark.pyspark_free

walk = fd._recwalk
if walk is None:
    pytest.fail("kafka_source/wire/format/_recwalk.c is not built: `make install` builds it",
                pytrace=False)


def outputs(n, nb):
    ints = [np.zeros(n, dtype=np.int64) for _ in range(8)]
    flags = [np.zeros(n, dtype=bool) for _ in range(3)]
    return ints, flags, np.zeros(nb, dtype=bool)


def run(buf, sections, counts):
    n = sum(counts)
    ints, flags, batch_ok = outputs(n, len(counts))
    ss = np.array([s for s, _ in sections], dtype=np.int64)
    se = np.array([e for _, e in sections], dtype=np.int64)
    st, en, tsd, od, ks, ke, vs, ve = ints
    knull, vnull, ok = flags
    walk.walk(buf, ss, se, np.array(counts, dtype=np.int64),
              st, en, tsd, od, ks, ke, knull, vs, ve, vnull, ok, batch_ok)
    return dict(st=st, en=en, tsd=tsd, od=od, ks=ks, ke=ke, knull=knull, vs=vs, ve=ve,
                vnull=vnull, ok=ok, batch_ok=batch_ok)


def records_section(recs, base=0):
    """The records section of a v2 batch (the bytes after its 61-byte header)."""
    return rb.v2_batch(recs, base).data[61:]


def test_fields_of_plain_records():
    recs = [R(key=b"k1", value=b"value-1"), R(key=None, value=b""), R(key=b"", value=None)]
    sec = records_section(recs)
    got = run(sec, [(0, len(sec))], [3])
    assert got["batch_ok"].tolist() == [True] and got["ok"].all()
    assert got["st"][0] == 0 and got["en"][-1] == len(sec)
    assert [sec[s:e] for s, e in zip(got["ks"], got["ke"])] == [b"k1", b"", b""]
    assert got["knull"].tolist() == [False, True, False]
    assert [sec[s:e] for s, e in zip(got["vs"], got["ve"])] == [b"value-1", b"", b""]
    assert got["vnull"].tolist() == [False, False, True]
    assert got["od"].tolist() == [0, 1, 2]


def test_records_with_headers_are_left_to_the_general_path():
    recs = [R(key=b"a", value=b"b"), R(key=b"c", value=b"d", headers=(("h", b"v"),))]
    sec = records_section(recs)
    got = run(sec, [(0, len(sec))], [2])
    assert got["batch_ok"].all()
    assert got["ok"].tolist() == [True, False]
    assert got["en"][1] == len(sec)       # its bounds are still known


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_a_truncated_or_miscounted_section_is_a_bad_batch(cut):
    recs = [R(key=b"k%d" % i, value=b"v" * 30) for i in range(4)]
    sec = records_section(recs)
    short = run(sec, [(0, len(sec) - cut)], [4])
    assert short["batch_ok"].tolist() == [False]
    assert short["ok"].all() and (short["st"] == 0).all() and (short["ve"] == 0).all()
    extra = run(sec, [(0, len(sec))], [3])    # a record left over
    assert extra["batch_ok"].tolist() == [False]
    fewer = run(sec, [(0, len(sec))], [5])    # a record missing
    assert fewer["batch_ok"].tolist() == [False]


def test_a_negative_or_overrunning_length_is_a_bad_batch_and_the_next_batch_is_walked():
    good = records_section([R(key=b"x", value=b"y")])
    bad = b"\x01" + good[1:]                   # length -1
    over = b"\x7e" + good[1:]                  # length 63, past the section
    buf = bad + over + good
    a, b, c = len(bad), len(bad) + len(over), len(buf)
    got = run(buf, [(0, a), (a, b), (b, c)], [1, 1, 1])
    assert got["batch_ok"].tolist() == [False, False, True]
    assert got["st"][2] == b and got["ok"][2]


@pytest.mark.parametrize("bad", ["section past the buffer", "negative count", "start after end"])
def test_arguments_outside_the_buffer_are_refused(bad):
    sec = records_section([R(key=b"x", value=b"y")])
    sections, counts = [(0, len(sec))], [1]
    if bad == "section past the buffer":
        sections = [(0, len(sec) + 1)]
    elif bad == "negative count":
        counts = [-1]
    else:
        sections = [(3, 2)]
    ints, flags, batch_ok = outputs(1, 1)
    with pytest.raises(ValueError, match="bad section"):
        walk.walk(sec, np.array([sections[0][0]], dtype=np.int64),
                  np.array([sections[0][1]], dtype=np.int64), np.array(counts, dtype=np.int64),
                  *ints[:6], flags[0], *ints[6:], flags[1], flags[2], batch_ok)


def test_outputs_too_small_are_refused():
    recs = [R(key=b"k", value=b"v")] * 3
    sec = records_section(recs)
    ints, flags, batch_ok = outputs(2, 1)          # 3 records, room for 2
    with pytest.raises(ValueError, match="needs"):
        walk.walk(sec, np.array([0], dtype=np.int64), np.array([len(sec)], dtype=np.int64),
                  np.array([3], dtype=np.int64), *ints[:6], flags[0], *ints[6:], flags[1],
                  flags[2], batch_ok)


def test_its_limits_are_fast_decodes():
    """The C walk mirrors two of fast_decode's limits (MAX_VARINT_BYTES, TS_SAFE): a timestamp
    delta of 2**52 and a varint of 9 bytes are left to the general path, one less is decoded."""
    assert fd._TS_SAFE == 1 << 52 and fd._VARINT_MAX_BYTES == 8
    # (offset delta, timestamp delta): a records section as the record encoder writes it
    fields = [(0, 0), (1, (1 << 52) - 1), (2, 1 << 52),
              ((1 << 55) - 1, 0),            # zigzag: 8 bytes
              (1 << 55, 0)]                  # zigzag: 9 bytes
    sec = b"".join(rb.encode_record(od, tsd, None, b"v", ()) for od, tsd in fields)
    got = run(sec, [(0, len(sec))], [5])
    assert got["batch_ok"].all()
    assert got["ok"].tolist() == [True, True, False, True, False]
    assert got["tsd"][1] == (1 << 52) - 1 and got["od"][3] == (1 << 55) - 1


# ------------------------------------------------------------------------------------------------
# gather: a binary column's bytes and offsets
# ------------------------------------------------------------------------------------------------

def gathered(buf, starts, ends, sel=None):
    m = len(starts) if sel is None else len(sel)
    offsets = np.full(m + 1, -7, dtype=np.int32)
    data = walk.gather(buf, np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
                       None if sel is None else np.asarray(sel, dtype=np.int64), offsets)
    return bytes(data), offsets.tolist()


@pytest.mark.parametrize("seed", range(5))
def test_gather_copies_each_records_bytes_in_order(seed):
    rng = np.random.default_rng(seed)
    buf = rng.integers(0, 256, 5000, dtype=np.uint8).tobytes()
    n = int(rng.integers(1, 60))
    starts = rng.integers(0, 5000, n)
    ends = np.minimum(starts + rng.integers(0, 200, n), 5000)
    empty = rng.random(n) < 0.25               # null or zero-length fields take no bytes
    ends[empty] = starts[empty]
    for sel in (None, np.sort(rng.choice(n, size=max(1, n // 2), replace=False)),
                np.array([], dtype=np.int64)):
        picked = range(n) if sel is None else sel.tolist()
        want = [buf[starts[j]:ends[j]] for j in picked]
        data, offsets = gathered(buf, starts, ends, sel)
        assert data == b"".join(want)
        assert offsets == [0] + np.cumsum([len(w) for w in want], dtype=np.int64).tolist()


@pytest.mark.parametrize("starts, ends, sel, message", [
    ([0, 5], [4, 11], None, "not inside"),          # past the end of a 10-byte buffer
    ([-1], [3], None, "not inside"),
    ([6], [5], None, "not inside"),                # ends before it starts
    ([0, 2], [1, 3], [2], "is not a record"),
    ([0, 2], [1, 3], [-1], "is not a record"),
])
def test_gather_refuses_positions_outside_the_buffer(starts, ends, sel, message):
    with pytest.raises(ValueError, match=message):
        gathered(b"0123456789", starts, ends, sel)


def test_gather_refuses_offsets_too_small():
    with pytest.raises(ValueError, match="offsets holds 8 bytes, needs 12"):
        walk.gather(b"0123456789", np.array([0, 1], dtype=np.int64),
                    np.array([1, 2], dtype=np.int64), None, np.zeros(2, dtype=np.int32))
