"""kafka_source.wire.format.fast_decode.decode_to_arrow against the reference path.

The reference is ``records.decode_records`` followed by ``arrow.records_to_batch``: for every
input both must give the same rows (schema included), the same ``next_offset`` and ``truncated``,
or raise the same error (same type and message, so the same batch is blamed). Inputs come from the
independent encoder in ``record_builder``: every codec, null / empty keys and values, headers
(repeated keys, null values, invalid UTF-8 keys), control and transactional batches, legacy
magic 0/1 message sets, LogAppendTime, offset windows cutting batches, truncation at every byte,
corrupted bytes with and without CRC checks, and malformed record sections whose CRC is valid.
"""

from __future__ import annotations

import contextlib
import os
import struct

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_source.wire.format import fast_decode as fd
from kafka_source.wire.format.arrow import records_to_batch
from kafka_source.errors import CorruptRecordError
from kafka_source.wire.format.fast_decode import ArrowDecodeResult, decode_to_arrow
from kafka_source.wire.net.fetch_protocol import parse_fetch_response, response_header_size
from kafka_source.wire.format.records import decode_records
from kafka_source.schema import arrow_schema

from . import record_builder as rb
from .record_builder import R
from .response_builder import encode_response

pytestmark = pytest.mark.pyspark_free

BIG = 1 << 62
TOPIC = "events-é"
PARTITION = 7


@pytest.fixture(autouse=True, params=["c", "numpy"])
def walk(request, monkeypatch):
    """Every test runs with both record walks: the C one (``_recwalk.c``, what an installed
    package uses) and the numpy one (its fallback where no compiler was at hand)."""
    if request.param == "numpy":
        monkeypatch.setattr(fd, "_recwalk", None)
    elif fd._recwalk is None:
        pytest.fail("kafka_source/wire/format/_recwalk.c is not built: `make install` builds it "
                    "(a C compiler and the Python headers are needed)")
    return request.param


def spy_walks(monkeypatch) -> list[str]:
    """The name of the walk (``_walk_native`` or ``_walk_numpy``) of every chunk decoded."""
    calls: list[str] = []
    for name in ("_walk_native", "_walk_numpy"):
        real = getattr(fd, name)
        monkeypatch.setattr(fd, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
    return calls


def test_the_c_walk_is_used_when_built(walk, monkeypatch):
    calls = spy_walks(monkeypatch)
    check(b"".join(simple(30, 30 * i).data for i in range(4)))
    assert set(calls) == {"_walk_native" if walk == "c" else "_walk_numpy"}


# -- the differential check ------------------------------------------------------------------------

def _outcome(fn):
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
        return "raised", exc


def reference(data, include_headers, **kw):
    res = decode_records(data, **kw)
    batch = records_to_batch(res.records, TOPIC, PARTITION, include_headers)
    return pa.Table.from_batches([batch]), res.next_offset, res.truncated


def fast(data, include_headers, **kw):
    res = decode_to_arrow(data, topic=TOPIC, partition=PARTITION,
                          include_headers=include_headers, **kw)
    schema = arrow_schema(include_headers)
    for b in res.batches:
        assert b.schema.equals(schema), (b.schema, schema)
        assert b.num_rows > 0
        b.validate(full=True)
    assert res.count == sum(b.num_rows for b in res.batches)
    return pa.Table.from_batches(res.batches, schema=schema), res.next_offset, res.truncated


# What surrounds a partition's records in a fetch response buffer: other partitions' bytes
# (here: bytes that look like record lengths and zero attributes, the worst for lane seeds),
# then the padding the fetch connection writes after every response, then stale bytes.
_BEFORE = bytes(range(7, 90))
_AFTER = b"\x0c\x00\x02" * 120
_STALE = b"\x0c\x00" * 64


def in_place(data) -> tuple[fd.PaddedBuffer, memoryview]:
    """``data`` inside a receive buffer the way the fetch connection hands it to the decoder."""
    raw = bytes(data)
    buf = fd.PaddedBuffer(_BEFORE + raw + _AFTER + fd.RECORDS_PADDING + _STALE)
    return buf, memoryview(buf)[len(_BEFORE):len(_BEFORE) + len(raw)]


def fast_in_place(data, include_headers, **kw):
    """:func:`fast` on a view into a :class:`PaddedBuffer`; the result must not change when the
    buffer is overwritten afterwards (the connection reuses it for the next response)."""
    buf, view = in_place(data)
    table, next_offset, truncated = fast(view, include_headers, **kw)
    before = _pylist(table)
    view.release()
    buf[:] = b"\xa5" * len(buf)
    assert _pylist(table) == before
    return table, next_offset, truncated


def check(data, *, start=0, end=BIG, read_committed=False, aborted=(), check_crcs=True,
          headers=(False, True)):
    """Assert both decoders agree on ``data`` -- the fast one on a copy of the bytes and in
    place in a receive buffer; returns the reference outcome."""
    kw = dict(start_offset=start, end_offset=end, read_committed=read_committed,
              aborted_transactions=list(aborted), check_crcs=check_crcs)
    for include_headers in headers:
        want = _outcome(lambda: reference(data, include_headers, **kw))
        for path in (fast, fast_in_place):
            got = _outcome(lambda: path(data, include_headers, **kw))
            if want[0] == "raised":
                assert got[0] == "raised", \
                    f"reference raised {want[1]!r}, {path.__name__} returned {got[1]}"
                assert type(got[1]) is type(want[1]) and str(got[1]) == str(want[1]), \
                    (path.__name__, want[1], got[1])
                continue
            assert got[0] == "ok", f"{path.__name__} raised {got[1]!r}"
            want_table, want_next, want_trunc = want[1]
            got_table, got_next, got_trunc = got[1]
            assert got_table.schema.equals(want_table.schema)
            assert _pylist(got_table) == _pylist(want_table), path.__name__
            assert got_table.equals(want_table)
            assert (got_next, got_trunc) == (want_next, want_trunc)
    return want


def _pylist(table):
    """Rows as Python values; timestamps as int64 micros (datetime cannot hold every value)."""
    i = table.schema.get_field_index("timestamp")
    return table.set_column(i, "timestamp", table.column(i).cast(pa.int64())).to_pylist()


def rows(data, **kw):
    """The rows both decoders return (after checking they agree)."""
    outcome = check(data, **kw)
    assert outcome[0] == "ok", outcome
    return outcome[1][0].to_pylist()


@pytest.fixture(autouse=True, scope="module")
def _vectorise_small_inputs():
    """The inputs here are small; make them take the vectorised path, not the small-input
    shortcut to the reference decoder (tested on its own below)."""
    saved = fd._SMALL_CHUNK
    fd._SMALL_CHUNK = 0
    yield
    fd._SMALL_CHUNK = saved


@contextlib.contextmanager
def tuning(chunk_bytes=None, min_lanes=None, seg_records=None):
    """Shrink the chunk size, the lockstep threshold and the lane length so that small inputs
    take every code path."""
    saved = fd.CHUNK_BYTES, fd._MIN_LANES, fd._SEG_RECORDS
    if chunk_bytes is not None:
        fd.CHUNK_BYTES = chunk_bytes
    if min_lanes is not None:
        fd._MIN_LANES = min_lanes
    if seg_records is not None:
        fd._SEG_RECORDS = seg_records
    try:
        yield
    finally:
        fd.CHUNK_BYTES, fd._MIN_LANES, fd._SEG_RECORDS = saved


# -- building inputs -------------------------------------------------------------------------------

def raw_batch(recs, base_offset=0, *, codec=rb.NONE, last_offset_delta=None, records_count=None,
              base_timestamp=1_600_000_000_000, **kw) -> rb.Batch:
    """A v2 batch from (offset_delta, timestamp_delta, key, value, headers) tuples; header keys
    may be bytes that are not UTF-8 (which ``rb.v2_batch``'s expectations cannot express)."""
    raw = b"".join(rb.encode_record(*r) for r in recs)
    if last_offset_delta is None:
        last_offset_delta = max((r[0] for r in recs), default=0)
    return rb.v2_batch([], base_offset, codec=codec, raw_records=raw,
                       records_count=len(recs) if records_count is None else records_count,
                       last_offset_delta=last_offset_delta, base_timestamp=base_timestamp, **kw)


def simple(n, base=0, *, codec=rb.NONE, value_size=20, **kw) -> rb.Batch:
    recs = [R(key=b"k%d" % (base + i), value=(b"v%d-" % (base + i)).ljust(value_size, b"x"))
            for i in range(n)]
    return rb.v2_batch(recs, base, codec=codec, **kw)


# -- basic shapes ----------------------------------------------------------------------------------

def test_empty_input_and_empty_window():
    for data in (b"", bytearray(), memoryview(b"")):
        res = decode_to_arrow(data, start_offset=5, end_offset=9, read_committed=False,
                              aborted_transactions=(), check_crcs=True, topic=TOPIC,
                              partition=PARTITION, include_headers=True)
        assert res == ArrowDecodeResult([], 5, False)
        batches, next_offset, truncated = res
        assert (batches, next_offset, truncated, res.count) == ([], 5, False, 0)
    b = simple(3, 0)
    check(b.data, start=2, end=2)
    check(b.data, start=3, end=1)
    check(b"")


@pytest.mark.parametrize("codec", rb.CODECS)
def test_every_codec_nulls_and_empties(codec):
    recs = rb.nulls_and_empties()
    b = rb.v2_batch(recs, 1000, codec=codec)
    got = rows(b.data, start=1000)
    assert [r["offset"] for r in got] == list(range(1000, 1006))
    assert [(r["key"], r["value"]) for r in got] == [(x[3], x[4]) for x in b.records]
    assert {r["topic"] for r in got} == {TOPIC} and {r["partition"] for r in got} == {PARTITION}
    assert all(r["headers"] is None for r in got)


def test_the_numpy_walk_says_once_per_process_that_the_c_walk_is_missing(walk, monkeypatch,
                                                                          caplog):
    monkeypatch.setattr(fd, "_said_numpy_walk", False)
    data = b"".join(simple(30, 30 * i).data for i in range(4))
    with caplog.at_level("WARNING", logger=fd.__name__):
        check(data)
        check(data, start=5)
    said = [r for r in caplog.records if "_recwalk.c) is not built" in r.getMessage()]
    assert len(said) == (1 if walk == "numpy" else 0)


def test_small_chunks_take_the_reference_path(monkeypatch):
    monkeypatch.setattr(fd, "_SMALL_CHUNK", 64)
    chunks = spy_walks(monkeypatch)
    small = simple(5, 0).data + raw_batch([(0, 0, b"k", b"v", (("h", None),))], 5).data
    check(small)
    check(small + rb.legacy_message(6, b"x") + simple(3, 7).data, start=2)
    assert chunks == []
    big = b"".join(simple(30, 30 * i).data for i in range(4))
    check(big)
    assert len(chunks) == 4   # once per include_headers, for bytes and in place


def test_result_is_independent_of_the_input_buffer():
    b = simple(50, 10, value_size=100)
    buf = bytearray(b"\x00" * 7 + b.data + b"\x00" * 3)
    view = memoryview(buf)[7:7 + len(b.data)]
    res = decode_to_arrow(view, start_offset=10, end_offset=BIG, topic=TOPIC,
                          partition=PARTITION, include_headers=False)
    before = pa.Table.from_batches(res.batches).to_pylist()
    buf[:] = b"\xff" * len(buf)
    assert pa.Table.from_batches(res.batches).to_pylist() == before
    assert [r["offset"] for r in before] == list(range(10, 60))


def test_fixed_width_columns():
    b = rb.v2_batch([R(key=b"k", value=b"v", timestamp=1_700_000_000_123)], 42,
                    base_timestamp=1_700_000_000_000)
    res = decode_to_arrow(b.data, start_offset=0, end_offset=BIG, topic="t", partition=3,
                          include_headers=False)
    (batch,) = res.batches
    row = batch.to_pylist()[0]
    assert row["offset"] == 42 and row["partition"] == 3 and row["timestampType"] == 0
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000]
    check(b.data)


def test_well_formed_batches_never_need_the_reference_decoder(monkeypatch):
    """Guards the differential tests against passing because everything fell back."""
    def reference_used(*args, **kwargs):
        raise AssertionError("the reference decoder was used")

    general_calls = []
    real_general = fd._fields_general

    def general(*args):
        general_calls.append(len(args[3]))  # (buf, u16, u32, starts, ends)
        return real_general(*args)

    monkeypatch.setattr(fd, "_reference_v2", reference_used)
    monkeypatch.setattr(fd, "_fields_general", general)
    base = 0
    parts = []
    for i in range(30):
        b = simple(1 + i % 9, base, codec=rb.CODECS[i % 5], value_size=100,
                   timestamp_type=rb.LOG_APPEND_TIME if i == 7 else rb.CREATE_TIME)
        parts.append(b.data)
        base = b.last_offset + 1
    data = b"".join(parts)
    # uncompressed only: decoded in place when in a receive buffer
    plain = b"".join(simple(1 + i % 9, 9 * i, value_size=100).data for i in range(30))
    for min_lanes in (1, 6, 1000):
        with tuning(min_lanes=min_lanes):
            check(data)
            check(data, start=5, end=base - 5)
            check(plain)
            check(plain, start=5, end=200)
    assert general_calls == []
    with_headers = rb.v2_batch([R(key=b"k", value=b"v" * 9000, headers=(("h", None),)),
                                R(key=None, value=b"w")], base, codec=rb.LZ4)
    check(data + with_headers.data)
    # only the header record, once per include_headers, for bytes and in place
    assert general_calls == [1] * 4


def test_uncompressed_batches_in_a_receive_buffer_are_decoded_in_place(monkeypatch):
    """Guards the in-place path: uncompressed sections in a PaddedBuffer are not copied into a
    chunk first; compressed ones (decompressed into new buffers) and plain bytes are."""
    seen = []
    real = fd._in_place

    def spy(payloads):
        result = real(payloads)
        seen.append(result[0] is not None)
        return result

    monkeypatch.setattr(fd, "_in_place", spy)
    plain = b"".join(simple(40, 40 * i, value_size=30).data for i in range(5))
    _buf, view = in_place(plain)
    assert decode_to_arrow(view, start_offset=0, end_offset=BIG, topic=TOPIC,
                           partition=PARTITION, include_headers=False).count == 200
    assert seen == [True]
    decode_to_arrow(plain, start_offset=0, end_offset=BIG, topic=TOPIC, partition=PARTITION,
                    include_headers=False)
    _buf, view = in_place(simple(40, 0, codec=rb.LZ4).data)
    decode_to_arrow(view, start_offset=0, end_offset=BIG, topic=TOPIC, partition=PARTITION,
                    include_headers=False)
    assert seen == [True, False, False]


# -- offsets, windows, truncation ------------------------------------------------------------------

@pytest.mark.parametrize("codec", rb.CODECS)
def test_windows_cutting_batches(codec):
    data = b"".join(simple(10, base, codec=codec).data for base in (0, 10, 20))
    for start in (0, 3, 9, 10, 15, 29, 30, 31):
        for end in (start, start + 1, 12, 20, 25, 30, BIG):
            check(data, start=start, end=end)


def test_compacted_gaps_and_retained_last_offset():
    recs = [R(value=b"a", offset_delta=0), R(value=b"b", offset_delta=3),
            R(value=b"c", offset_delta=7)]
    data = rb.v2_batch(recs, 100, last_offset_delta=9).data + simple(2, 110).data
    for start, end in ((100, BIG), (101, 108), (104, 111), (110, 111)):
        check(data, start=start, end=end)
    empty = rb.v2_batch([], 40, last_offset_delta=4, producer_id=9, producer_epoch=0)
    check(empty.data + simple(1, 45).data, start=40)


@pytest.mark.parametrize("codec", [rb.NONE, rb.GZIP, rb.ZSTD])
def test_truncated_last_batch_at_every_byte(codec):
    b1 = simple(4, 0, codec=codec)
    b2 = rb.v2_batch([R(key=b"k", value=b"v" * 30, headers=(("h", b"x"),)), R(value=None)], 4,
                     codec=codec)
    for cut in range(0, len(b2.data) + 1):
        check(b1.data + b2.data[:cut], headers=(True,))
    for cut in range(1, len(b1.data)):
        check(b1.data[:cut], headers=(False,))


def test_truncated_legacy_message():
    m1 = rb.legacy_message(0, b"one")
    m2 = rb.legacy_message(1, b"two")
    for cut in range(len(m2) + 1):
        check(m1 + m2[:cut])


def test_stop_after_the_batch_reaching_end_offset():
    b1, b2 = simple(5, 0), simple(5, 5)
    check(b1.data + rb.corrupt(b2.data, len(b2.data) - 2), start=0, end=5)
    check(b1.data + b2.data[:30], start=0, end=5)


# -- CRCs and corruption ---------------------------------------------------------------------------

def test_bad_crc_in_each_batch_raises_for_that_batch():
    batches = [simple(3, 3 * i, codec=rb.CODECS[i % 5]) for i in range(6)]
    for bad in range(6):
        parts = [b.data for b in batches]
        parts[bad] = rb.corrupt(parts[bad], 17)  # the stored CRC
        data = b"".join(parts)
        with pytest.raises(CorruptRecordError, match=rf"offset {3 * bad}\b"):
            decode_to_arrow(data, start_offset=0, end_offset=BIG, topic=TOPIC,
                            partition=PARTITION, include_headers=False)
        check(data)
        check(data, check_crcs=False)


def test_payload_byte_flips_with_and_without_crc_checks():
    b1 = rb.v2_batch([R(key=b"k%d" % i, value=b"hello world %d" % i,
                        headers=(("h", b"%d" % i),) if i % 2 else ()) for i in range(6)], 0)
    b2 = simple(4, 6)
    data = b1.data + b2.data
    for index in range(len(data)):
        bad = rb.corrupt(data, index)
        if index % 5 == 0:
            check(bad, headers=(True,))
        check(bad, check_crcs=False, headers=(index % 2 == 0,))


def test_errors_in_order_record_error_before_later_crc_error():
    # Batch 0 is malformed inside its records (valid CRC); batch 1 has a bad CRC; the reference
    # blames batch 0.
    b0 = rb.v2_batch([R(key=b"k", value=b"v")] * 3, 0, records_count=4)
    b1 = simple(2, 3)
    data = b0.data + rb.corrupt(b1.data, 30)
    with pytest.raises(CorruptRecordError, match=r"offset 0\b"):
        decode_to_arrow(data, start_offset=0, end_offset=BIG, topic=TOPIC, partition=PARTITION,
                        include_headers=False)
    check(data)


def test_malformed_record_sections():
    good = rb.encode_record(0, 0, b"k", b"value", ())
    key_overrun = b"\x00" + rb.zigzag_varint(0) * 2 + rb.zigzag_varint(50) + b"kk"
    neg_header_key = (b"\x00" + rb.zigzag_varint(0) * 2 + rb.zigzag_varint(-1) * 2
                      + rb.zigzag_varint(1) + rb.zigzag_varint(-1) * 2)
    raws = [
        rb.zigzag_varint(len(good) - 1 + 2) + good[1:] + b"\x00\x00",   # length disagrees
        rb.zigzag_varint(len(key_overrun)) + key_overrun,
        rb.zigzag_varint(len(neg_header_key)) + neg_header_key,
        rb.zigzag_varint(-3) + good[1:],                                 # negative length
        good + b"\x01",                                                  # leftover byte
        good[:-1],                                                       # short
        b"\xff" * 12,                                                    # varint too long
        good + rb.zigzag_varint(1 << 40) + b"abc",                       # huge length
        b"",
    ]
    # Header counts with no headers behind them (the record length agrees): the reference reads
    # past the record and fails; a fast path that only skipped the count would not.
    body = b"\x00" + rb.zigzag_varint(0) * 2 + rb.zigzag_varint(-1) * 2
    for hc in (1, 2, 63, 64, 1 << 20, 1 << 40):
        bad_record = rb.zigzag_varint(len(body) + len(rb.zigzag_varint(hc))) + body \
            + rb.zigzag_varint(hc)
        raws += [bad_record, good + bad_record, bad_record + good, good * 3 + bad_record + good]
    for raw in raws:
        for count in (0, 1, 2):
            b = rb.v2_batch([R()], 5, raw_records=raw, records_count=count)
            for start in (0, 6):
                check(b.data, start=start)
                check(simple(2, 3).data + b.data + simple(2, 6).data, start=start)
    # A record count far beyond what the bytes can hold (the reference fails on it) must not
    # make the decoder allocate per declared record.
    for count in ((1 << 31) - 1, 1 << 24, 10_000):
        check(rb.v2_batch([R(value=b"x")] * 3, 0, records_count=count).data)
        check(simple(3, 0).data + rb.v2_batch([R(value=b"x")] * 3, 3, records_count=count).data,
              check_crcs=False)
    check(rb.v2_batch([R()] * 2, 0, records_count=3).data)
    check(rb.v2_batch([R(value=b"x")] * 3, 0, records_count=2).data)


def test_unknown_codec_magic_and_tiny_lengths():
    check(simple(2, 77, attributes_extra=5).data, start=77)
    b = simple(2, 88)
    for magic in (3, 7, -1, 127):
        bad = b.data[:16] + struct.pack(">b", magic) + b.data[17:]
        check(bad, start=88, check_crcs=False)
    for length in (-5, 0, 13, 20):
        check(simple(1, 0).data + struct.pack(">qi", 1, length) + bytes(60))


def test_structural_errors_found_by_the_batch_walk():
    v2_too_short = struct.pack(">qi", 0, 30) + bytes(4) + b"\x02" + bytes(25)
    legacy_too_short = struct.pack(">qi", 0, 20) + bytes(4) + b"\x01" + bytes(15)
    # A control batch whose record section is empty: the reference fails reading its key.
    empty_control = rb.v2_batch([R()], 2, raw_records=b"", records_count=1, control=True,
                                transactional=True, producer_id=3, producer_epoch=0)
    for bad in (v2_too_short, legacy_too_short, empty_control.data):
        for committed in (False, True):
            check(bad, read_committed=committed)
            check(simple(2, 0).data + bad, read_committed=committed)


def test_non_byte_memoryview_input():
    data = simple(3, 0).data + simple(4, 3, codec=rb.GZIP).data
    if len(data) % 2:
        data += b"\x00"  # a trailing partial batch: truncated
    check(memoryview(bytearray(data)).cast("H"))


# -- record contents -------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [rb.NONE, rb.SNAPPY, rb.LZ4])
def test_headers(codec):
    headers = (
        ("a", b"1"),
        ("a", b"2"),
        ("ключ", None),
        ("", b""),
        ("emoji😀", b"\x00\xff\x80"),
        (b"bad\xff\xfe utf8", b"v"),
        (b"\xed\xa0\x80surrogate", None),
        (b"\xc0\xafoverlong", b""),
        ("a", b"3"),
    )
    only_empty_keys = (("", b"x"), ("", None))
    recs = [(0, 0, b"k", b"v", headers), (1, 0, b"k2", b"v2", ()),
            (2, 5, None, None, (("only", None),)), (3, 0, b"", b"", ()),
            (4, 0, b"k", b"v", only_empty_keys)]
    b = raw_batch(recs, 3, codec=codec)
    got = rows(b.data, start=3)
    assert got[0]["headers"][0] == {"key": "a", "value": b"1"}
    assert got[0]["headers"][5]["key"] == "bad\ufffd\ufffd utf8"
    assert got[1]["headers"] is None and got[3]["headers"] is None
    for start, end in ((3, 4), (4, 6), (5, BIG), (7, BIG)):
        check(b.data, start=start, end=end)


def test_many_headers_and_long_fields_need_multibyte_varints():
    headers = tuple((f"h{i}" * 30, os.urandom(i * 10) if i % 3 else None) for i in range(200))
    recs = [R(key=os.urandom(20_000), value=b"x" * 70_000, headers=headers),
            R(key=b"small", value=b"y" * 9000), R(key=None, value=b"z" * 8191),
            R(key=b"k" * 8192, value=None), R(key=b"a", value=b"b")]
    for base in (0, 1 << 40):
        b = rb.v2_batch(recs, base)
        got = rows(b.data, start=base)
        assert len(got) == 5 and got[0]["value"] == b"x" * 70_000
        assert len(got[0]["headers"]) == 200


def test_timestamps():
    base = 1_700_000_000_000
    recs = [R(value=b"a", timestamp=base + 5), R(value=b"b", timestamp=base - 1234),
            R(value=b"c", timestamp=base), R(value=b"d", timestamp=base + 10**9),
            R(value=b"e", timestamp=base + 2**45), R(value=b"f", timestamp=-base)]
    for ts_type in (rb.CREATE_TIME, rb.LOG_APPEND_TIME):
        for codec in (rb.NONE, rb.LZ4):
            b = rb.v2_batch(recs, 0, base_timestamp=base, timestamp_type=ts_type, codec=codec,
                            max_timestamp=base + 777_777)
            got = rows(b.data)
            assert {r["timestampType"] for r in got} == {ts_type}


@pytest.mark.parametrize("delta", [1 << 45, -(1 << 45), (1 << 52) - 1, 1 << 52, -(1 << 52),
                                   (1 << 53) + 7, -(1 << 54), (1 << 55) - 1, 1 << 62])
def test_huge_timestamp_deltas(delta):
    for base_ts in (0, 1_600_000_000_000, -1_600_000_000_000):
        recs = [(0, 0, b"k", b"v", ()), (1, delta, None, b"w", ()), (2, 3, b"", b"", ())]
        for ts_type in (rb.CREATE_TIME, rb.LOG_APPEND_TIME):
            check(raw_batch(recs, 0, base_timestamp=base_ts, max_timestamp=base_ts,
                            timestamp_type=ts_type).data)


@pytest.mark.parametrize("base_ts", [-(1 << 63), (1 << 63) - 1, 9_223_372_036_854_775,
                                     9_223_372_036_854_776, -9_223_372_036_854_776,
                                     fd._TS_SAFE, fd._TS_SAFE + 1])
def test_timestamps_at_the_edge_of_int64(base_ts):
    # Far outside Arrow's range the reference path raises while building the batch; the fast
    # path must raise the same way (or, in range, return the same rows).
    recs = [(0, 0, b"k", b"v", ()), (1, -1, None, b"w", ())]
    for ts_type in (rb.CREATE_TIME, rb.LOG_APPEND_TIME):
        b = raw_batch(recs, 0, base_timestamp=base_ts, max_timestamp=base_ts,
                      timestamp_type=ts_type)
        check(b.data)


def test_offsets_at_the_edge_of_int64():
    for base in ((1 << 62) - 5, (1 << 62), (1 << 63) - 3, -(1 << 63), -5):
        b = raw_batch([(0, 0, b"k", b"v", ()), (2, 0, None, b"w", ())], base)
        check(b.data, start=-(1 << 63))
        check(b.data, start=min(base + 1, (1 << 63) - 1), end=1 << 64)


# -- transactions and control batches --------------------------------------------------------------

class Log:
    """Appends batches at consecutive offsets, like a partition leader."""

    def __init__(self, start: int = 0):
        self.next = start
        self.data = b""

    def txn(self, pid, n, *, codec=rb.NONE):
        recs = [R(key=b"p%d" % pid, value=b"%d" % (self.next + i)) for i in range(n)]
        self._add(rb.v2_batch(recs, self.next, codec=codec, transactional=True, producer_id=pid,
                              producer_epoch=0, base_sequence=0))

    def plain(self, n, pid=-1):
        self._add(simple(n, self.next, producer_id=pid, producer_epoch=0 if pid >= 0 else -1))

    def marker(self, pid, *, abort):
        self._add(rb.control_batch(self.next, pid, abort=abort))

    def _add(self, b):
        self.data += b.data
        self.next = b.last_offset + 1


def test_transactions_and_markers():
    log = Log()
    log.txn(1, 2)                   # 0-1  committed
    log.txn(2, 2)                   # 2-3  aborted
    log.txn(1, 1)                   # 4    committed
    log.txn(2, 1, codec=rb.GZIP)    # 5    aborted
    log.marker(1, abort=False)      # 6
    log.marker(2, abort=True)       # 7
    log.plain(1)                    # 8
    log.txn(2, 2, codec=rb.ZSTD)    # 9-10 committed
    log.marker(2, abort=False)      # 11
    log.plain(2, pid=2)             # 12-13 idempotent, same pid
    for committed in (False, True):
        for aborted in ([(2, 2)], [(2, 2), (9, 1000)], [(2, 2), (2, 9)], []):
            for start, end in ((0, BIG), (3, 9), (6, 8), (7, 12), (11, 12)):
                check(log.data, start=start, end=end, read_committed=committed,
                      aborted=aborted)
    got = rows(log.data, read_committed=True, aborted=[(2, 2)])
    assert [r["offset"] for r in got] == [0, 1, 4, 8, 9, 10, 12, 13]


def test_malformed_control_batch():
    # A control record key shorter than 4 bytes.
    bad = raw_batch([(0, 0, b"\x00", b"", ())], 0, transactional=True, control=True,
                    producer_id=3, producer_epoch=0)
    check(bad.data, read_committed=True)
    check(bad.data, read_committed=False)
    check(simple(2, 0).data + raw_batch([(0, 0, b"\xff\xff\x00\x00", b"", ())], 2,
                                        transactional=True, control=True, producer_id=3,
                                        producer_epoch=0).data, read_committed=True)


# -- legacy message sets ---------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [rb.NONE, rb.GZIP, rb.SNAPPY, rb.LZ4])
@pytest.mark.parametrize("magic", [0, 1])
def test_legacy(magic, codec):
    inner = [(200 + i, b"k%d" % i if i % 2 else None, b"v%d" % i if i != 3 else None, 5000 + i)
             for i in range(5)]
    if codec == rb.NONE:
        data = b"".join(rb.legacy_message(o, v, k, magic=magic, timestamp=t,
                                          attributes=0x08 if (magic and o % 2) else 0)
                        for o, k, v, t in inner)
    else:
        data = rb.legacy_wrapper(inner, magic=magic, codec=codec, wrapper_offset=204,
                                 timestamp_type=rb.LOG_APPEND_TIME if magic else rb.CREATE_TIME)
    for start, end in ((200, BIG), (202, 204), (204, 205)):
        check(data, start=start, end=end)
    check(rb.corrupt(data, 20), start=200)
    check(rb.corrupt(data, 20), start=200, check_crcs=False)


def test_legacy_then_v2_then_more():
    data = (rb.legacy_message(0, b"old0", magic=0)
            + rb.legacy_wrapper([(1, None, b"old1", 7), (2, None, b"old2", 8)], magic=1,
                                codec=rb.LZ4, wrapper_offset=2))
    data += rb.v2_batch([R(value=b"new3"), R(value=b"new4")], 3, codec=rb.ZSTD).data
    data += rb.legacy_message(5, b"odd5", magic=1)
    data += simple(3, 6).data + simple(3, 9, codec=rb.GZIP).data
    got = rows(data)
    assert [r["offset"] for r in got] == list(range(12))
    for start, end in ((1, 4), (2, 7), (5, 6), (4, 11)):
        check(data, start=start, end=end)
    with tuning(chunk_bytes=1, min_lanes=1):
        check(data)


# -- the vectorised machinery: many batches, chunks, lockstep --------------------------------------

@pytest.mark.parametrize("min_lanes", [1, 2, 6, 1000])
@pytest.mark.parametrize("chunk_bytes", [1, 700, 1 << 20])
def test_many_batches_lockstep_and_chunks(min_lanes, chunk_bytes):
    parts = []
    base = 0
    for i in range(40):
        n = [1, 5, 30, 2, 17, 3][i % 6]
        recs = [R(key=None if j % 5 == 0 else b"k%d" % j,
                  value=None if j % 7 == 3 else os.urandom((i * 37 + j * 11) % 190),
                  headers=(("h", b"%d" % j),) if (i % 9 == 4 and j % 2) else ())
                for j in range(n)]
        b = rb.v2_batch(recs, base, codec=rb.CODECS[i % 5] if i % 3 == 0 else rb.NONE,
                        timestamp_type=rb.LOG_APPEND_TIME if i % 11 == 5 else rb.CREATE_TIME)
        parts.append(b.data)
        base = b.last_offset + 1
    data = b"".join(parts)
    with tuning(chunk_bytes, min_lanes):
        check(data)
        check(data, start=13, end=base - 9)
        bad = parts[:]
        bad[21] = rb.v2_batch([R(value=b"x")] * 4, 0, records_count=5).data  # malformed batch
        check(b"".join(bad))
        big = parts[:]
        big[10] = rb.v2_batch([R(value=b"q" * 9000), R(value=b"r" * 20)], 0).data
        check(b"".join(big))


def test_one_large_batch_and_stalls():
    recs = [R(key=b"%d" % i, value=os.urandom(i % 300)) for i in range(3000)]
    b = rb.v2_batch(recs, 0, codec=rb.LZ4)
    for min_lanes in (1, 6):
        with tuning(min_lanes=min_lanes):
            check(b.data, start=1000, end=2500)
    # A batch whose records need 3-byte length varints among many short batches: the lockstep
    # walk stalls on it and hands it to the Python walk.
    long_first = rb.v2_batch([R(value=b"L" * 10_000)] + [R(value=b"s")] * 40, 0)
    shorts = [simple(40, 41 + 40 * i) for i in range(10)]
    with tuning(min_lanes=2):
        check(long_first.data + b"".join(s.data for s in shorts))
        check(b"".join(s.data for s in shorts[:5]) + rb.v2_batch(
            [R(value=b"s")] * 30 + [R(value=b"L" * 10_000)] * 20, 241).data
            + b"".join(s.data for s in shorts[5:]))


def _values(kind, i):
    if kind == "text":
        return b'{"id":%d,"pad":"%s"}' % (i, b"x" * (i * 7919 % 300))
    if kind == "zeros":   # mostly zero bytes: many places look like record starts
        v = bytearray(40 + i * 31 % 150)
        v[7::8] = bytes((i * 13 + k) % 256 for k in range(len(v[7::8])))
        return bytes(v)
    return os.urandom(i * 37 % 200)


@pytest.mark.parametrize("kind", ["text", "zeros", "random"])
@pytest.mark.parametrize("seg_records", [2, 5, 64])
def test_long_batches_split_into_lanes(kind, seg_records, monkeypatch):
    """Long batches are walked as many lanes seeded at guessed record starts; wrong guesses must
    be repaired (or the batch walked whole) without ever changing the result."""
    def reference_used(*args, **kwargs):
        raise AssertionError("the reference decoder was used")

    parts = []
    base = 1000
    for b in range(6):
        n = [300, 40, 700, 3, 150, 90][b]
        recs = [R(key=struct.pack(">q", base + i) if i % 3 else None, value=_values(kind, i),
                  timestamp=1_600_000_000_000 + i * 3)
                for i in range(n)]
        if b == 2:   # records of 8 KiB and more inside a split batch: 3-byte lengths
            recs[100] = R(key=b"big", value=b"B" * 9000)
            recs[450] = R(key=b"big2", value=os.urandom(20_000))
        if b == 4:   # headers: the byte before the next record is not a zero header count
            for i in range(0, n, 3):
                recs[i] = R(key=b"h", value=_values(kind, i), headers=(("k", b"v%d" % i),))
        batch = rb.v2_batch(recs, base, codec=rb.CODECS[b % 5])
        parts.append(batch.data)
        base = batch.last_offset + 1
    gaps = rb.v2_batch([R(value=_values(kind, i), offset_delta=3 * i) for i in range(200)], base)
    parts.append(gaps.data)
    data = b"".join(parts)
    monkeypatch.setattr(fd, "_reference_v2", reference_used)
    with tuning(seg_records=seg_records):
        for min_lanes in (1, 6):
            fd._MIN_LANES = min_lanes
            check(data, start=1000)
            check(data, start=1200, end=base + 100)


def test_lane_seeds_that_are_not_record_starts():
    """A value crafted so that the byte before a record start looks like a record start whose
    chain runs into the real one (the false seed and the true chain meet)."""
    recs = []
    for i in range(400):
        # record i+1 is 59 bytes long; a value ending in b"x" (0x78: length 60) placed right
        # before it makes a position that "looks" like a record of 61 bytes.
        recs.append(R(key=None, value=(b"%d" % i).ljust(53, b"x")))
    data = rb.v2_batch(recs, 0).data
    for seg in (2, 3, 7, 64):
        with tuning(seg_records=seg):
            check(data)


# -- properties ------------------------------------------------------------------------------------

header_key_st = st.one_of(st.text(max_size=6), st.binary(max_size=6))
headers_st = st.one_of(
    st.just(()), st.just(()),
    st.lists(st.tuples(header_key_st, st.none() | st.binary(max_size=8)), min_size=1,
             max_size=3).map(tuple))
value_st = st.one_of(st.none(), st.binary(max_size=60), st.binary(min_size=8185, max_size=8200))
ts_delta_st = st.one_of(st.integers(-3, 3), st.integers(-(1 << 13), 1 << 13),
                        st.integers(-(1 << 45), 1 << 45))


@st.composite
def v2_batches(draw, base_offset):
    n = draw(st.integers(0, 8))
    gaps = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    deltas = []
    d = -1
    for g in gaps:
        d += 1 + (g if draw(st.booleans()) else 0)
        deltas.append(d)
    recs = [(delta, draw(ts_delta_st), draw(st.none() | st.binary(max_size=12)), draw(value_st),
             draw(headers_st)) for delta in deltas]
    last = max(deltas, default=0) + draw(st.sampled_from([0, 0, 0, 2]))
    pid = draw(st.sampled_from([-1, 1, 2, 3]))
    b = raw_batch(recs, base_offset, codec=draw(st.sampled_from(rb.CODECS)),
                  last_offset_delta=last,
                  timestamp_type=draw(st.sampled_from([rb.CREATE_TIME, rb.LOG_APPEND_TIME])),
                  base_timestamp=draw(st.sampled_from([1_600_000_000_000, 0, -5])),
                  max_timestamp=draw(st.sampled_from([1_600_000_000_777, 3])),
                  transactional=pid >= 0 and draw(st.booleans()),
                  producer_id=pid, producer_epoch=0 if pid >= 0 else -1)
    return b.data, last + 1, pid


@st.composite
def logs(draw):
    """(data, first offset, next offset, producer ids, transactional first offsets)."""
    first = draw(st.integers(0, 2**40))
    nxt = first
    parts = []
    txn_starts = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["v2", "v2", "v2", "v2", "marker", "legacy"]))
        if kind == "v2":
            data, span, pid = draw(v2_batches(nxt))
            if pid >= 0:
                txn_starts.append((pid, nxt))
        elif kind == "marker":
            pid = draw(st.sampled_from([1, 2, 3]))
            b = rb.control_batch(nxt, pid, abort=draw(st.booleans()))
            data, span = b.data, 1
        else:
            magic = draw(st.sampled_from([0, 1]))
            codec = draw(st.sampled_from([rb.NONE, rb.GZIP, rb.SNAPPY, rb.LZ4]))
            msgs = draw(st.lists(st.tuples(st.none() | st.binary(max_size=8),
                                           st.none() | st.binary(max_size=20)),
                                 min_size=1, max_size=3))
            if codec == rb.NONE:
                data = b"".join(rb.legacy_message(nxt + i, v, k, magic=magic, timestamp=nxt + i)
                                for i, (k, v) in enumerate(msgs))
            else:
                data = rb.legacy_wrapper([(nxt + i, k, v, i) for i, (k, v) in enumerate(msgs)],
                                         magic=magic, codec=codec,
                                         wrapper_offset=nxt + len(msgs) - 1)
            span = len(msgs)
        parts.append(data)
        nxt += span
    return b"".join(parts), first, nxt, txn_starts


@st.composite
def windows(draw, first, nxt):
    start = draw(st.integers(first - 2, nxt + 2))
    end = draw(st.one_of(st.just(BIG), st.integers(start - 1, nxt + 3)))
    return start, end


tuning_st = st.sampled_from([(None, None, None), (None, 1, None), (1, 1, 2), (300, 2, 3),
                             (None, None, 2), (None, 3, 4)])


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(log=logs(), data=st.data())
def test_random_logs(log, data):
    raw, first, nxt, txn_starts = log
    start, end = data.draw(windows(first, nxt))
    committed = data.draw(st.booleans())
    aborted = data.draw(st.lists(st.sampled_from(txn_starts), unique=True)) if txn_starts else []
    aborted += data.draw(st.lists(st.tuples(st.integers(1, 4), st.integers(first, nxt + 1)),
                                  max_size=2))
    with tuning(*data.draw(tuning_st)):
        check(raw, start=start, end=end, read_committed=committed, aborted=aborted)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(log=logs(), data=st.data())
def test_random_logs_truncated_or_corrupted(log, data):
    raw, first, nxt, _txn = log
    if raw:
        if data.draw(st.booleans()):
            raw = raw[:data.draw(st.integers(0, len(raw)))]
        for _ in range(data.draw(st.integers(0, 2))):
            index = data.draw(st.integers(0, len(raw) - 1)) if raw else 0
            if raw:
                raw = rb.corrupt(raw, index)
    start, end = data.draw(windows(first, nxt))
    with tuning(*data.draw(tuning_st)):
        check(raw, start=start, end=end, check_crcs=data.draw(st.booleans()),
              read_committed=data.draw(st.booleans()), aborted=[(1, first), (2, first + 3)])


def _mutate(raw: bytes, draw) -> bytes:
    op = draw(st.sampled_from(["flip", "insert", "delete", "replace", "random"]))
    if op == "random" or not raw:
        return draw(st.binary(max_size=80))
    i = draw(st.integers(0, len(raw) - 1))
    if op == "flip":
        return raw[:i] + bytes((raw[i] ^ draw(st.integers(1, 255)),)) + raw[i + 1:]
    if op == "insert":
        return raw[:i] + draw(st.binary(min_size=1, max_size=3)) + raw[i:]
    if op == "delete":
        return raw[:i] + raw[i + draw(st.integers(1, 3)):]
    return raw[:i] + draw(st.sampled_from([b"\x01", b"\x7f", b"\xff\x7f", b"\xff" * 9,
                                           b"\x80\x00", b"\x81\x80\x80\x00"])) + raw[i + 1:]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_malformed_records_with_valid_crcs(data):
    """Record sections that break the format in every way, inside batches with valid CRCs:
    either both decoders raise the same error or both return the same rows."""
    n = data.draw(st.integers(1, 6))
    recs = [(i, data.draw(st.integers(-2, 2)), data.draw(st.none() | st.binary(max_size=5)),
             data.draw(st.none() | st.binary(max_size=12)), data.draw(headers_st))
            for i in range(n)]
    raw = b"".join(rb.encode_record(*r) for r in recs)
    for _ in range(data.draw(st.integers(1, 3))):
        raw = _mutate(raw, data.draw)
    count = data.draw(st.sampled_from([n, n, n - 1, n + 1, 0]))
    codec = data.draw(st.sampled_from([rb.NONE, rb.NONE, rb.ZSTD]))
    bad = rb.v2_batch([R()], 10, raw_records=raw, records_count=count, codec=codec,
                      last_offset_delta=n)
    neighbours = data.draw(st.sampled_from(["alone", "between", "many"]))
    if neighbours == "alone":
        payload = bad.data
    elif neighbours == "between":
        payload = simple(3, 7).data + bad.data + simple(2, 10 + n + 1).data
    else:
        payload = (b"".join(simple(2, 2 * i).data for i in range(5)) + bad.data
                   + b"".join(simple(3, 20 + 3 * i).data for i in range(8)))
    start = data.draw(st.sampled_from([0, 10, 11, 12]))
    with tuning(*data.draw(tuning_st)):
        check(payload, start=start)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.tuples(st.integers(1, 40), st.sampled_from(rb.CODECS)),
                        min_size=1, max_size=30),
       value_size=st.sampled_from([0, 10, 100, 200, 9000]),
       tune=tuning_st, data=st.data())
def test_many_lanes_property(batches, value_size, tune, data):
    parts = []
    base = data.draw(st.integers(0, 2**40))
    first = base
    for n, codec in batches:
        recs = [R(key=b"k%d" % i if i % 4 else None, value=os.urandom((value_size + i) % 9000))
                for i in range(n)]
        b = rb.v2_batch(recs, base, codec=codec)
        parts.append(b.data)
        base = b.last_offset + 1
    raw = b"".join(parts)
    start, end = data.draw(windows(first, base))
    with tuning(*tune):
        check(raw, start=start, end=end, headers=(data.draw(st.booleans()),))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_split_batches_with_malformed_records(data):
    """Long batches walked as lanes, with a few bytes of their records changed (CRC still
    valid): lanes meet garbage lengths, stalls, overruns; results must match the reference."""
    kind = data.draw(st.sampled_from(["text", "zeros", "random"]))
    n = data.draw(st.integers(20, 120))
    recs = [(i, 0, None if i % 4 == 0 else b"k%d" % i, _values(kind, i)[:60], ()) for i in range(n)]
    raw = b"".join(rb.encode_record(*r) for r in recs)
    for _ in range(data.draw(st.integers(1, 3))):
        raw = _mutate(raw, data.draw)
    count = data.draw(st.sampled_from([n, n, n - 1, n + 1]))
    batch = rb.v2_batch([R()], 50, raw_records=raw, records_count=count, last_offset_delta=n - 1)
    payload = simple(5, 45).data + batch.data + simple(3, 50 + n).data
    with tuning(seg_records=data.draw(st.sampled_from([2, 3, 8])),
                min_lanes=data.draw(st.sampled_from([1, 6]))):
        check(payload, start=45, headers=(False,))


# -- a second encoder ------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", rb.CODECS)
def test_kafka_python_builder(codec):
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(50):
        key = None if i % 4 == 0 else b"key%d" % i
        value = None if i % 7 == 3 else os.urandom(i * 3)
        headers = [("h", b"%d" % i), ("h", None), ("ü", b"")] if i % 2 else []
        builder.append(i, timestamp=1_650_000_000_000 + 10 * i, key=key, value=value,
                       headers=headers)
    data = bytes(builder.build())
    check(data)
    check(data, start=10, end=30)


# -- multi-partition Fetch responses ---------------------------------------------------------------

def response_buffer(partitions: dict, version: int = 12):
    """A Fetch response with these partitions' records, received the way the fetch connection
    receives it (one PaddedBuffer: size, frame, padding) and parsed in place."""

    topics: dict = {}
    for (topic, partition), (raw, aborted) in partitions.items():
        topics.setdefault(topic, {})[partition] = dict(
            error=0, hw=1 << 40, lso=1 << 40, start=0, records=raw,
            aborted=[(pid, first) for pid, first in aborted] or None)
    frame = encode_response(version, topics=topics)
    buf = fd.PaddedBuffer(frame + fd.RECORDS_PADDING + b"\x0c\x00" * 50)
    body = memoryview(buf)[4:len(frame)]
    result = parse_fetch_response(body[response_header_size(version, body):], version)
    return buf, result


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(parts=st.lists(logs(), min_size=1, max_size=4), version=st.sampled_from([4, 7, 11, 12]),
       data=st.data())
def test_multi_partition_responses_decode_in_place_like_the_reference(parts, version, data):
    committed = data.draw(st.booleans())
    spec = {}
    for i, (raw, first, nxt, txn_starts) in enumerate(parts):
        aborted = data.draw(st.lists(st.sampled_from(txn_starts), unique=True)) \
            if txn_starts else []
        spec[("events" if i % 2 else "clicks", i)] = (raw, aborted, data.draw(windows(first, nxt)))
    buf, result = response_buffer({tp: (raw, aborted) for tp, (raw, aborted, _) in spec.items()},
                                  version)
    with tuning(*data.draw(tuning_st)):
        for tp, (raw, aborted, (start, end)) in spec.items():
            got = result.partitions[tp]
            assert bytes(got.records) == raw and got.records.obj is buf
            kw = dict(start_offset=start, end_offset=end, read_committed=committed,
                      aborted_transactions=got.aborted if version >= 4 else [],
                      check_crcs=True)
            for include_headers in (False, True):
                want = _outcome(lambda: reference(raw, include_headers, **kw))
                have = _outcome(lambda: fast(got.records, include_headers, **kw))
                assert want[0] == have[0], (want, have)
                if want[0] == "raised":
                    assert str(want[1]) == str(have[1])
                    continue
                assert _pylist(have[1][0]) == _pylist(want[1][0])
                assert have[1][1:] == want[1][1:]


def test_multi_partition_response_of_uncompressed_batches_is_decoded_without_copies(monkeypatch):
    calls = []
    real = fd._in_place
    monkeypatch.setattr(fd, "_in_place", lambda p: calls.append(1) or real(p))
    spec = {("t", p): (b"".join(simple(30, 30 * i + 1000 * p, value_size=40).data
                                for i in range(4)), []) for p in range(3)}
    buf, result = response_buffer(spec)
    tables = []
    for (topic, partition), data in sorted(result.partitions.items()):
        res = decode_to_arrow(data.records, start_offset=0, end_offset=BIG, topic=topic,
                              partition=partition, include_headers=False)
        tables.append(pa.Table.from_batches(res.batches))
    before = [t.to_pylist() for t in tables]
    buf[:] = b"\x00" * len(buf)               # the connection reuses the buffer
    assert [t.to_pylist() for t in tables] == before
    assert [len(t) for t in tables] == [120, 120, 120] and len(calls) == 3
    assert before[2][0]["offset"] == 2000 and before[2][0]["partition"] == 2


def test_string_column_of_header_keys_without_bytes():
    # No keys, or only empty ones: an empty string column, or one of empty strings.
    assert fd._string_column(pa.nulls(0, pa.binary())).to_pylist() == []
    keys = pa.array([b"", b"", b""], pa.binary())
    assert fd._string_column(keys).to_pylist() == ["", "", ""]
    assert fd._string_column(keys).type == pa.string()
