"""kafka_source.wire.format.records.decode_records against batches built from the protocol spec.

Inputs come from ``record_builder`` (an independent encoder) and, as a second source, from
kafka-python's own batch builders. Every assertion compares real decoded values.
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kafka_source.wire.format import records as records_module
from kafka_source.errors import CorruptRecordError
from kafka_source.wire.format.records import DecodeResult, Record, crc32c, decode_records

from . import record_builder as rb
from .record_builder import R

pytestmark = pytest.mark.pyspark_free

BIG = 1 << 62


def dec(data, start=0, end=BIG, **kw) -> DecodeResult:
    return decode_records(data, start_offset=start, end_offset=end, **kw)


def offsets(result: DecodeResult) -> list[int]:
    return [r.offset for r in result.records]


def sample_records(n=5, prefix=b"v"):
    return [R(key=b"k%d" % i, value=prefix + b"%d" % i) for i in range(n)]


# -- CRC-32C ----------------------------------------------------------------------------------------

def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283
    assert rb.crc32c_bitwise(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def test_builder_crc_table_matches_bitwise():
    for n in (0, 1, 2, 7, 64, 300):
        data = os.urandom(n)
        assert rb.crc32c(data) == rb.crc32c_bitwise(data)


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 8, 511, 512, 513, 1023, 1024, 1025, 4099, 16383, 16384, 65537,
                               524_295])
def test_crc32c_implementations_agree(n):
    data = os.urandom(n)
    want = rb.crc32c(data)
    assert crc32c(data) == want
    assert records_module._crc32c_table(data) == want
    if n >= 4:
        assert records_module._crc32c_numpy(data) == want
        assert records_module._crc32c_numpy(memoryview(b"xyz" + data)[3:]) == want
    assert crc32c(memoryview(data)) == want


def test_crc32c_numpy_on_structured_data():
    # Long runs of zeros and 0xff exercise the zero-padding and init folding.
    for data in (bytes(5000), b"\xff" * 5001, b"\x00" * 3 + b"\x01" + bytes(70000)):
        assert records_module._crc32c_numpy(data) == rb.crc32c(data)


# -- basic v2 decoding, every codec -----------------------------------------------------------------

@pytest.mark.parametrize("codec", rb.CODECS)
def test_v2_every_codec(codec):
    recs = rb.nulls_and_empties()
    b = rb.v2_batch(recs, base_offset=1000, codec=codec)
    res = dec(b.data, start=1000)
    assert res.records == b.records
    assert [r.offset for r in res.records] == list(range(1000, 1006))
    assert res.records[1].key is None and res.records[1].value == b"null key"
    assert res.records[2].key == b"" and res.records[2].value == b""
    assert res.records[3].value is None
    assert res.next_offset == 1006
    assert res.truncated is False


def test_v2_many_batches_mixed_codecs():
    data = b""
    want = []
    base = 0
    for i in range(12):
        codec = rb.CODECS[i % 5]
        b = rb.v2_batch(sample_records(i + 1, prefix=b"b%d-" % i), base, codec=codec)
        data += b.data
        want += b.records
        base = b.last_offset + 1
    res = dec(data)
    assert res.records == want
    assert res.next_offset == base


def test_result_types():
    b = rb.v2_batch([R(key=b"k", value=b"v", headers=(("h", b"x"),))], 7)
    res = dec(bytearray(b.data), start=7)
    rec = res.records[0]
    assert isinstance(rec, Record)
    assert type(rec.key) is bytes and type(rec.value) is bytes
    assert type(rec.headers) is tuple and type(rec.headers[0]) is tuple
    assert type(rec.headers[0][0]) is str and type(rec.headers[0][1]) is bytes


def test_memoryview_slice_input():
    b = rb.v2_batch(sample_records(4), 50, codec=rb.GZIP)
    buf = b"\x00" * 13 + b.data + b"\x00" * 5
    view = memoryview(buf)[13:13 + len(b.data)]
    assert dec(view, start=50).records == b.records


def test_empty_input():
    res = dec(b"", start=17, end=20)
    assert res == DecodeResult([], 17, False)


# -- record contents --------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [rb.NONE, rb.ZSTD])
def test_headers(codec):
    headers = (
        ("a", b"1"),
        ("a", b"2"),                       # repeated key kept, in order
        ("ключ", None),                    # unicode key, null value
        ("", b""),                         # empty key, empty value
        ("emoji😀", b"\x00\xff\x80"),
        ("a", b"3"),
    )
    b = rb.v2_batch([R(key=b"k", value=b"v", headers=headers), R(key=b"k2", value=b"v2")],
                    3, codec=codec)
    res = dec(b.data, start=3)
    assert res.records[0].headers == headers
    assert res.records[1].headers == ()


def test_many_headers_and_long_fields_need_multibyte_varints():
    headers = tuple((f"h{i}" * 30, os.urandom(i * 10) if i % 3 else None) for i in range(200))
    big_key = os.urandom(20_000)
    b = rb.v2_batch([R(key=big_key, value=b"x" * 70_000, headers=headers)], 1 << 40)
    rec = dec(b.data, start=1 << 40).records[0]
    assert rec.offset == 1 << 40
    assert rec.key == big_key and rec.value == b"x" * 70_000 and rec.headers == headers


def test_create_time_timestamps_with_negative_deltas():
    base = 1_700_000_000_000
    recs = [R(value=b"a", timestamp=base + 5), R(value=b"b", timestamp=base - 1234),
            R(value=b"c", timestamp=base), R(value=b"d", timestamp=base + 10**9)]
    b = rb.v2_batch(recs, 0, base_timestamp=base, timestamp_type=rb.CREATE_TIME)
    res = dec(b.data)
    assert [r.timestamp for r in res.records] == [base + 5, base - 1234, base, base + 10**9]
    assert {r.timestamp_type for r in res.records} == {0}


@pytest.mark.parametrize("codec", [rb.NONE, rb.LZ4])
def test_log_append_time_uses_batch_max_timestamp(codec):
    base = 1_700_000_000_000
    recs = [R(value=b"a", timestamp=base + 5), R(value=b"b", timestamp=base + 9)]
    b = rb.v2_batch(recs, 0, codec=codec, base_timestamp=base, max_timestamp=base + 777_777,
                    timestamp_type=rb.LOG_APPEND_TIME)
    res = dec(b.data)
    assert [r.timestamp for r in res.records] == [base + 777_777] * 2
    assert [r.timestamp_type for r in res.records] == [1, 1]


def test_compacted_batch_with_offset_gaps_and_retained_last_offset():
    recs = [R(value=b"a", offset_delta=0), R(value=b"b", offset_delta=3),
            R(value=b"c", offset_delta=7)]
    b = rb.v2_batch(recs, 100, last_offset_delta=9)
    res = dec(b.data, start=100)
    assert offsets(res) == [100, 103, 107]
    assert res.next_offset == 110


def test_empty_batch_advances_next_offset():
    # Compaction can leave a batch with no records (kept for producer state).
    b = rb.v2_batch([], 40, last_offset_delta=4, producer_id=9, producer_epoch=0)
    after = rb.v2_batch([R(value=b"after")], 45)
    res = dec(b.data + after.data, start=40)
    assert offsets(res) == [45]
    res = dec(b.data, start=40)
    assert res.records == [] and res.next_offset == 45 and not res.truncated


# -- offsets range ----------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", rb.CODECS)
def test_start_offset_mid_batch(codec):
    b = rb.v2_batch(sample_records(10), 20, codec=codec)
    res = dec(b.data, start=24)
    assert offsets(res) == list(range(24, 30))
    assert res.records == rb.expected(b.records, 24)
    assert res.next_offset == 30


def test_batch_entirely_before_start_is_skipped_but_next_offset_not_moved_back():
    old = rb.v2_batch(sample_records(3), 0)
    res = dec(old.data, start=10)
    assert res.records == [] and res.next_offset == 10
    new = rb.v2_batch(sample_records(3), 10)
    res = dec(old.data + new.data, start=10)
    assert offsets(res) == [10, 11, 12] and res.next_offset == 13


@pytest.mark.parametrize("codec", [rb.NONE, rb.SNAPPY])
def test_end_offset_cuts_a_batch(codec):
    b1 = rb.v2_batch(sample_records(5), 0, codec=codec)
    b2 = rb.v2_batch(sample_records(5), 5, codec=codec)
    res = dec(b1.data + b2.data, start=0, end=7)
    assert offsets(res) == [0, 1, 2, 3, 4, 5, 6]
    assert res.records == rb.expected(b1.records + b2.records, 0, 7)
    assert res.next_offset == 10  # the cut batch was seen whole; the caller is done (>= end)


def test_start_and_end_inside_one_batch():
    b = rb.v2_batch(sample_records(10), 0, codec=rb.GZIP)
    res = dec(b.data, start=3, end=6)
    assert offsets(res) == [3, 4, 5]
    assert res.next_offset == 10


def test_decoding_stops_after_the_batch_reaching_end_offset():
    b1 = rb.v2_batch(sample_records(5), 0)
    b2 = rb.v2_batch(sample_records(5), 5)
    # A batch past end_offset is not decoded, so even a corrupt one does no harm ...
    bad = rb.corrupt(b2.data, len(b2.data) - 2)
    res = dec(b1.data + bad, start=0, end=5)
    assert offsets(res) == [0, 1, 2, 3, 4] and res.next_offset == 5
    # ... and a partial one is not reported either.
    res = dec(b1.data + b2.data[:30], start=0, end=5)
    assert res.next_offset == 5 and res.truncated is False


def test_offset_gap_before_end_offset_moves_past_it():
    # Offsets 3..9 were compacted away: the batch at 10 is beyond end_offset=8, and the caller
    # learns it is done from next_offset.
    b1 = rb.v2_batch(sample_records(3), 0)
    b2 = rb.v2_batch(sample_records(3), 10)
    res = dec(b1.data + b2.data, start=0, end=8)
    assert offsets(res) == [0, 1, 2]
    assert res.next_offset == 13


def test_start_equal_end_returns_nothing():
    b = rb.v2_batch(sample_records(3), 0)
    assert dec(b.data, start=2, end=2) == DecodeResult([], 2, False)


# -- truncation -------------------------------------------------------------------------------------

def test_truncated_trailing_batch_at_every_cut():
    b1 = rb.v2_batch(sample_records(3), 0, codec=rb.ZSTD)
    b2 = rb.v2_batch(sample_records(4), 3, codec=rb.GZIP)
    for cut in range(1, len(b2.data)):
        res = dec(b1.data + b2.data[:cut])
        assert res.truncated is True, cut
        assert res.records == b1.records, cut
        assert res.next_offset == 3, cut
    res = dec(b1.data + b2.data)
    assert res.truncated is False and res.next_offset == 7


def test_truncated_only_batch():
    b = rb.v2_batch(sample_records(3), 500)
    for cut in (1, 11, 12, 17, 60, len(b.data) - 1):
        res = dec(b.data[:cut], start=500)
        assert res == DecodeResult([], 500, True), cut


def test_truncated_legacy_message():
    m1 = rb.legacy_message(0, b"one")
    m2 = rb.legacy_message(1, b"two")
    res = dec(m1 + m2[:-1])
    assert [r.value for r in res.records] == [b"one"]
    assert res.truncated is True and res.next_offset == 1


# -- CRC --------------------------------------------------------------------------------------------

def test_bad_crc_raises_naming_base_offset_and_passes_without_check():
    b = rb.v2_batch([R(key=b"k", value=b"hello world")], 4242)
    pos = b.data.index(b"hello world")
    bad = b.data[:pos] + b"J" + b.data[pos + 1:]
    with pytest.raises(CorruptRecordError, match="4242"):
        dec(bad, start=4242)
    res = dec(bad, start=4242, check_crcs=False)
    assert res.records[0].value == b"Jello world"


def test_bad_crc_in_second_batch():
    b1 = rb.v2_batch(sample_records(2), 0, codec=rb.LZ4)
    b2 = rb.v2_batch(sample_records(2), 2, codec=rb.LZ4)
    bad = rb.corrupt(b2.data, 17)  # the stored CRC itself
    with pytest.raises(CorruptRecordError, match=r"offset 2\b"):
        dec(b1.data + bad)
    assert len(dec(b1.data + bad, check_crcs=False).records) == 4


def test_bad_crc_in_header_fields_detected():
    b = rb.v2_batch(sample_records(2), 0)
    for index in range(21, 61):  # attributes .. record count are CRC-covered
        with pytest.raises(CorruptRecordError):
            dec(rb.corrupt(b.data, index))


def test_legacy_bad_crc():
    good = rb.legacy_message(9, b"value", b"key")
    bad = rb.legacy_message(9, b"value", b"key", bad_crc=True)
    assert dec(good).records[0].value == b"value"
    with pytest.raises(CorruptRecordError, match=r"offset 9\b"):
        dec(bad)
    assert dec(bad, check_crcs=False).records[0].value == b"value"


def test_legacy_wrapper_bad_crc():
    wrapper = rb.legacy_wrapper([(0, None, b"a", 1), (1, None, b"b", 2)], magic=1,
                                codec=rb.GZIP, wrapper_offset=1)
    with pytest.raises(CorruptRecordError, match=r"offset 1\b"):
        dec(rb.corrupt(wrapper, 20))


# -- malformed input --------------------------------------------------------------------------------

def test_unknown_codec_in_batch():
    b = rb.v2_batch(sample_records(2), 77, attributes_extra=5)  # codec bits = 5, CRC valid
    with pytest.raises(CorruptRecordError, match="codec"):
        dec(b.data, start=77)


def test_unknown_codec_in_legacy_wrapper():
    msg = rb.legacy_message(3, b"whatever", magic=1, attributes=6)
    with pytest.raises(CorruptRecordError, match="codec"):
        dec(msg)


@pytest.mark.parametrize("magic", [3, 7, -1, 127])
def test_unknown_magic(magic):
    b = rb.v2_batch(sample_records(2), 88)
    bad = b.data[:16] + struct.pack(">b", magic) + b.data[17:]
    with pytest.raises(CorruptRecordError, match="magic"):
        dec(bad, start=88, check_crcs=False)


def test_negative_or_tiny_batch_length():
    for length in (-5, 0, 13):
        with pytest.raises(CorruptRecordError):
            dec(struct.pack(">qi", 0, length) + bytes(40))


def test_record_count_larger_than_records():
    b = rb.v2_batch(sample_records(2), 0, records_count=3)
    with pytest.raises(CorruptRecordError, match="offset 0"):
        dec(b.data)


def test_record_count_smaller_than_records():
    b = rb.v2_batch(sample_records(3), 0, records_count=2)
    with pytest.raises(CorruptRecordError, match="left over"):
        dec(b.data)


def test_record_length_that_disagrees_with_fields():
    good = rb.encode_record(0, 0, b"k", b"value", ())
    bad_len = rb.zigzag_varint(len(good) - 1 + 2)  # claims two bytes more than it has
    raw = bad_len + good[1:] + b"\x00\x00"
    b = rb.v2_batch([R()], 0, raw_records=raw)
    with pytest.raises(CorruptRecordError):
        dec(b.data)


def test_key_overrunning_its_record():
    body = b"\x00" + rb.zigzag_varint(0) + rb.zigzag_varint(0) + rb.zigzag_varint(50) + b"kk"
    raw = rb.zigzag_varint(len(body)) + body
    b = rb.v2_batch([R()], 0, raw_records=raw)
    with pytest.raises(CorruptRecordError):
        dec(b.data)


def test_legacy_nested_compression_rejected():
    inner = rb.legacy_message(0, rb.compress(rb.GZIP, rb.legacy_message(0, b"x")),
                              attributes=rb.GZIP)
    outer = rb.legacy_message(0, rb.compress(rb.GZIP, inner), attributes=rb.GZIP)
    with pytest.raises(CorruptRecordError, match="compressed"):
        dec(outer)


# -- control batches and transactions ---------------------------------------------------------------

class Log:
    """Appends batches at consecutive offsets, like a partition leader."""

    def __init__(self, start: int = 0):
        self.next = start
        self.data = b""
        self.records: list[tuple] = []

    def txn(self, pid: int, n: int, *, codec: int = rb.NONE, tag: bytes = b"") -> rb.Batch:
        recs = [R(key=b"p%d" % pid, value=tag + b"%d" % (self.next + i)) for i in range(n)]
        b = rb.v2_batch(recs, self.next, codec=codec, transactional=True, producer_id=pid,
                        producer_epoch=0, base_sequence=0)
        return self._add(b)

    def plain(self, n: int, pid: int = -1) -> rb.Batch:
        recs = [R(value=b"plain%d" % (self.next + i)) for i in range(n)]
        return self._add(rb.v2_batch(recs, self.next, producer_id=pid,
                                     producer_epoch=0 if pid >= 0 else -1))

    def marker(self, pid: int, *, abort: bool) -> rb.Batch:
        return self._add(rb.control_batch(self.next, pid, abort=abort))

    def _add(self, b: rb.Batch) -> rb.Batch:
        self.data += b.data
        self.records += b.records
        self.next = b.last_offset + 1
        return b


def test_control_records_never_returned():
    log = Log()
    log.txn(1, 2)
    log.marker(1, abort=False)
    log.txn(1, 1)
    log.marker(1, abort=True)
    for committed in (False, True):
        res = dec(log.data, read_committed=committed, aborted_transactions=[(1, 3)])
        assert all(r.key == b"p1" for r in res.records)
        assert 2 not in offsets(res) and 4 not in offsets(res)
        assert res.next_offset == 5


def test_next_offset_passes_trailing_control_markers():
    log = Log()
    log.txn(3, 2)
    log.marker(3, abort=False)
    # The caller asked for [0, 3): offset 2 holds only a marker. next_offset must reach 3 so the
    # range is known to be finished.
    for committed in (False, True):
        res = dec(log.data, start=0, end=3, read_committed=committed)
        assert offsets(res) == [0, 1]
        assert res.next_offset == 3
    # A range that only covers markers.
    log.marker(3, abort=False)
    res = dec(log.data, start=2, end=4)
    assert res.records == [] and res.next_offset == 4


def test_control_batch_is_not_even_parsed_for_data():
    # A control batch's records are not data: its value is not bytes a user would see.
    b = rb.control_batch(0, 5, abort=True)
    assert dec(b.data).records == []
    assert dec(b.data, read_committed=True).next_offset == 1


def test_interleaved_producers_abort_and_commit():
    log = Log()
    log.txn(1, 2)                   # 0-1  committed
    log.txn(2, 2)                   # 2-3  aborted
    log.txn(1, 1)                   # 4    committed
    log.txn(2, 1, codec=rb.GZIP)    # 5    aborted
    log.marker(1, abort=False)      # 6
    log.marker(2, abort=True)       # 7
    log.plain(1)                    # 8
    aborted = [(2, 2)]
    res = dec(log.data, read_committed=True, aborted_transactions=aborted)
    assert offsets(res) == [0, 1, 4, 8]
    assert res.next_offset == 9
    res = dec(log.data, read_committed=False, aborted_transactions=aborted)
    assert offsets(res) == [0, 1, 2, 3, 4, 5, 8]
    assert res.records == [r for r in log.records]


def test_commit_then_abort_then_commit_from_the_same_producer():
    log = Log()
    log.txn(1, 2)                   # 0-1  txn A committed
    log.marker(1, abort=False)      # 2
    log.txn(1, 2, codec=rb.ZSTD)    # 3-4  txn B aborted
    log.marker(1, abort=True)       # 5
    log.txn(1, 1)                   # 6    txn C committed
    log.marker(1, abort=False)      # 7
    res = dec(log.data, read_committed=True, aborted_transactions=[(1, 3)])
    assert offsets(res) == [0, 1, 6]
    assert res.next_offset == 8
    assert offsets(dec(log.data, aborted_transactions=[(1, 3)])) == [0, 1, 3, 4, 6]


def test_aborted_txn_starting_later_does_not_hide_earlier_batches_of_that_producer():
    log = Log(100)
    log.txn(7, 2)                   # 100-101 pid 7, committed
    log.marker(7, abort=False)      # 102
    log.txn(5, 2)                   # 103-104 pid 5, committed later
    log.txn(7, 2)                   # 105-106 pid 7, aborted: first_offset 105
    log.marker(5, abort=False)      # 107
    log.marker(7, abort=True)       # 108
    log.txn(5, 1)                   # 109 committed
    log.marker(5, abort=False)      # 110
    res = dec(log.data, start=100, read_committed=True, aborted_transactions=[(7, 105)])
    assert offsets(res) == [100, 101, 103, 104, 109]
    assert res.next_offset == 111


def test_aborted_transactions_given_out_of_order():
    log = Log()
    log.txn(1, 1)                   # 0 aborted
    log.txn(2, 1)                   # 1 aborted
    log.marker(1, abort=True)       # 2
    log.marker(2, abort=True)       # 3
    log.txn(3, 1)                   # 4 aborted
    log.txn(1, 1)                   # 5 committed
    log.marker(3, abort=True)       # 6
    log.marker(1, abort=False)      # 7
    res = dec(log.data, read_committed=True,
              aborted_transactions=[(3, 4), (2, 1), (1, 0)])
    assert offsets(res) == [5]


def test_fetch_starting_inside_an_aborted_transaction():
    log = Log()
    first = log.txn(4, 3)           # 0-2 aborted
    log.txn(4, 3)                   # 3-5 same aborted txn
    log.txn(6, 1)                   # 6 committed
    log.marker(4, abort=True)       # 7
    log.marker(6, abort=False)      # 8
    tail = log.data[len(first.data):]
    # The broker returns the batch holding the fetch offset and the aborted txns overlapping it.
    res = dec(tail, start=4, read_committed=True, aborted_transactions=[(4, 0)])
    assert offsets(res) == [6]
    assert res.next_offset == 9
    assert offsets(dec(tail, start=4)) == [4, 5, 6]


def test_idempotent_non_transactional_batch_of_an_aborted_producer_id_is_kept():
    log = Log()
    log.txn(8, 1)                   # 0 aborted
    log.plain(1, pid=8)             # 1 non-transactional (idempotent) batch with the same pid
    log.marker(8, abort=True)       # 2
    res = dec(log.data, read_committed=True, aborted_transactions=[(8, 0)])
    assert offsets(res) == [1]


def test_open_aborted_list_without_markers_in_data():
    # Aborted transactions whose markers lie beyond the fetched bytes still hide their batches.
    log = Log()
    log.txn(1, 2)
    log.txn(2, 2)
    res = dec(log.data, read_committed=True, aborted_transactions=[(2, 2), (9, 1000)])
    assert offsets(res) == [0, 1]
    assert res.next_offset == 4


def test_read_committed_ignores_legacy_messages():
    data = rb.legacy_message(0, b"a") + rb.legacy_message(1, b"b")
    res = dec(data, read_committed=True, aborted_transactions=[(1, 0)])
    assert [r.value for r in res.records] == [b"a", b"b"]


# -- legacy message sets ----------------------------------------------------------------------------

def test_legacy_v0_plain():
    data = (rb.legacy_message(0, b"a", b"k", magic=0) + rb.legacy_message(1, None, magic=0)
            + rb.legacy_message(2, b"", b"", magic=0))
    res = dec(data)
    assert res.records == [
        (0, -1, -1, b"k", b"a", ()),
        (1, -1, -1, None, None, ()),
        (2, -1, -1, b"", b"", ()),
    ]
    assert res.next_offset == 3


def test_legacy_v1_plain_both_timestamp_types():
    data = (rb.legacy_message(10, b"ct", magic=1, timestamp=1111)
            + rb.legacy_message(11, b"lat", magic=1, timestamp=2222, attributes=0x08))
    res = dec(data, start=10)
    assert res.records == [(10, 1111, 0, None, b"ct", ()), (11, 2222, 1, None, b"lat", ())]


@pytest.mark.parametrize("codec", [rb.GZIP, rb.SNAPPY, rb.LZ4])
@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_compressed_wrapper(magic, codec):
    inner = [(200 + i, b"k%d" % i if i % 2 else None, b"v%d" % i, 5000 + i) for i in range(5)]
    wrapper = rb.legacy_wrapper(inner, magic=magic, codec=codec, wrapper_offset=204)
    res = dec(wrapper, start=200)
    ts = (lambda t: t) if magic == 1 else (lambda t: -1)
    tstype = 0 if magic == 1 else -1
    assert res.records == [(o, ts(t), tstype, k, v, ()) for o, k, v, t in inner]
    assert res.next_offset == 205


def test_legacy_v1_wrapper_log_append_time():
    inner = [(30 + i, None, b"v%d" % i, 1000 + i) for i in range(3)]
    wrapper = rb.legacy_wrapper(inner, magic=1, codec=rb.GZIP, wrapper_offset=32,
                                timestamp=99_999, timestamp_type=rb.LOG_APPEND_TIME)
    res = dec(wrapper, start=30)
    assert [(r.offset, r.timestamp, r.timestamp_type) for r in res.records] == [
        (30, 99_999, 1), (31, 99_999, 1), (32, 99_999, 1)]


def test_legacy_v1_wrapper_relative_offsets_after_compaction():
    # After compaction inner offsets are sparse: relative 0, 2, 5 with the wrapper at 105 give
    # absolute 100, 102, 105.
    inner = [(100, None, b"a", 1), (102, None, b"b", 2), (105, None, b"c", 3)]
    wrapper = rb.legacy_wrapper(inner, magic=1, codec=rb.SNAPPY, wrapper_offset=105)
    assert offsets(dec(wrapper, start=100)) == [100, 102, 105]


def test_legacy_wrapper_start_and_end_inside():
    inner = [(i, None, b"v%d" % i, i) for i in range(10)]
    for magic in (0, 1):
        wrapper = rb.legacy_wrapper(inner, magic=magic, codec=rb.GZIP, wrapper_offset=9)
        res = dec(wrapper, start=4, end=7)
        assert offsets(res) == [4, 5, 6]
        assert res.next_offset == 10


def test_legacy_then_v2_after_format_upgrade():
    data = (rb.legacy_message(0, b"old0", magic=0)
            + rb.legacy_wrapper([(1, None, b"old1", 7), (2, None, b"old2", 8)], magic=1,
                                codec=rb.LZ4, wrapper_offset=2))
    b = rb.v2_batch([R(value=b"new3"), R(value=b"new4")], 3, codec=rb.ZSTD)
    res = dec(data + b.data)
    assert [r.value for r in res.records] == [b"old0", b"old1", b"old2", b"new3", b"new4"]
    assert offsets(res) == [0, 1, 2, 3, 4]
    assert res.next_offset == 5


# -- cross-checks against kafka-python ---------------------------------------------------------------

def _set_base_offset(data: bytes, base: int) -> bytes:
    return struct.pack(">q", base) + data[8:]  # base offset is outside the CRC


@pytest.mark.parametrize("codec", rb.CODECS)
def test_kafka_python_v2_builder(codec):
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=True, producer_id=31,
        producer_epoch=2, base_sequence=0, batch_size=1 << 20)
    inputs = []
    for i in range(20):
        key = None if i % 4 == 0 else b"key%d" % i
        value = None if i % 7 == 3 else os.urandom(i * 3)
        headers = [("h", b"%d" % i), ("h", None), ("ü", b"")] if i % 2 else []
        builder.append(i, timestamp=1_650_000_000_000 + 10 * i, key=key, value=value,
                       headers=headers)
        inputs.append((i, key, value, tuple(headers)))
    data = _set_base_offset(bytes(builder.build()), 5000)
    res = dec(data, start=5000)
    assert res.records == [(5000 + i, 1_650_000_000_000 + 10 * i, 0, k, v, h)
                           for i, k, v, h in inputs]
    assert res.next_offset == 5020
    # kafka-python marks it transactional: a matching aborted txn hides it under read_committed.
    assert dec(data, start=5000, read_committed=True,
               aborted_transactions=[(31, 5000)]).records == []


@pytest.mark.parametrize("codec", [rb.NONE, rb.GZIP, rb.SNAPPY, rb.LZ4])
@pytest.mark.parametrize("magic", [0, 1])
def test_kafka_python_legacy_builder(magic, codec):
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    inputs = [(i, b"k%d" % i if i % 2 else None, b"value %d" % i if i != 2 else None)
              for i in range(6)]
    try:
        for i, key, value in inputs:
            builder.append(i, timestamp=1_400_000_000_000 + i, key=key, value=value)
        data = bytes(builder.build())
    except RuntimeError as exc:  # lz4 for magic 0 needs the optional xxhash module
        pytest.skip(str(exc))
    if codec != rb.NONE:
        # The producer leaves the wrapper offset for the broker to assign: the last offset.
        data = struct.pack(">q", 5) + data[8:]
    res = dec(data)
    want_ts = [1_400_000_000_000 + i if magic == 1 else -1 for i in range(6)]
    assert res.records == [(i, want_ts[i], 0 if magic == 1 else -1, k, v, ())
                           for i, k, v in inputs]
    assert res.next_offset == 6


@pytest.mark.parametrize("codec", rb.CODECS)
def test_builder_output_is_read_by_kafka_python(codec):
    # Validates the test encoder itself against a second implementation.
    from kafka.record.default_records import DefaultRecordBatch

    recs = [R(key=b"a", value=b"1", headers=(("x", b"y"), ("x", None))),
            R(key=None, value=None), R(key=b"", value=os.urandom(100))]
    b = rb.v2_batch(recs, 77, codec=codec, producer_id=12, producer_epoch=1, base_sequence=4,
                    transactional=True)
    batch = DefaultRecordBatch(bytearray(b.data))
    assert batch.validate_crc()
    assert batch.base_offset == 77 and batch.is_transactional and batch.producer_id == 12
    got = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]
    assert got == [(o, t, k, v, h) for o, t, _tt, k, v, h in b.records]


@pytest.mark.parametrize("codec", [rb.NONE, rb.GZIP, rb.SNAPPY])
def test_builder_legacy_output_is_read_by_kafka_python(codec):
    from kafka.record.legacy_records import LegacyRecordBatch

    inner = [(10 + i, b"k", b"v%d" % i, 700 + i) for i in range(3)]
    if codec == rb.NONE:
        data = rb.legacy_message(10, b"v0", b"k", magic=1, timestamp=700)
        want = [(10, b"v0")]
    else:
        data = rb.legacy_wrapper(inner, magic=1, codec=codec, wrapper_offset=12)
        want = [(o, v) for o, _k, v, _t in inner]
    batch = LegacyRecordBatch(bytearray(data), 1)
    assert batch.validate_crc()
    assert [(r.offset, r.value) for r in batch] == want


# -- properties ------------------------------------------------------------------------------------

headers_st = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=16)),
                      max_size=4).map(tuple)
record_st = st.builds(
    R,
    key=st.none() | st.binary(max_size=40),
    value=st.none() | st.binary(max_size=300),
    headers=headers_st,
    timestamp=st.none() | st.integers(1_600_000_000_000 - 10**6, 1_600_000_000_000 + 10**6),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(record_st, min_size=1, max_size=25),
       codec=st.sampled_from(rb.CODECS),
       base=st.integers(0, 2**48),
       ts_type=st.sampled_from([rb.CREATE_TIME, rb.LOG_APPEND_TIME]),
       window=st.tuples(st.integers(0, 30), st.integers(1, 30)))
def test_round_trip_property(recs, codec, base, ts_type, window):
    b = rb.v2_batch(recs, base, codec=codec, timestamp_type=ts_type)
    res = dec(b.data, start=base)
    assert res.records == b.records
    assert res.next_offset == base + len(recs) and not res.truncated
    start = base + min(window[0], len(recs))
    end = start + window[1]
    res = dec(b.data, start=start, end=end)
    assert res.records == rb.expected(b.records, start, end)
    assert res.next_offset == max(start, base + len(recs))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(legacy=st.lists(st.tuples(st.sampled_from([0, 1]), st.sampled_from([0, 1, 2, 3]),
                                 st.lists(st.tuples(st.none() | st.binary(max_size=20),
                                                    st.none() | st.binary(max_size=50)),
                                          min_size=1, max_size=6)),
                       min_size=1, max_size=6),
       first=st.integers(0, 2**40))
def test_legacy_round_trip_property(legacy, first):
    data = b""
    want = []
    offset = first
    for magic, codec, msgs in legacy:
        if codec == 0:
            for key, value in msgs:
                data += rb.legacy_message(offset, value, key, magic=magic, timestamp=offset % 999)
                want.append((offset, offset % 999 if magic else -1, 0 if magic else -1,
                             key, value, ()))
                offset += 1
        else:
            inner = []
            for key, value in msgs:
                inner.append((offset, key, value, offset % 777))
                want.append((offset, offset % 777 if magic else -1, 0 if magic else -1,
                             key, value, ()))
                offset += 1
            data += rb.legacy_wrapper(inner, magic=magic, codec=codec,
                                      wrapper_offset=offset - 1)
    res = dec(data, start=first)
    assert res.records == want
    assert res.next_offset == offset


@st.composite
def transactional_logs(draw):
    """A partition log written by a few producers, plus a fetch position into it.

    Returns (data, start, end, aborted list as the broker would send it, expected records
    under read_committed, expected under read_uncommitted, expected next_offset)."""
    n_events = draw(st.integers(1, 30))
    open_txn: dict[int, int] = {}          # pid -> first offset of its open transaction
    batches = []                           # (batch, pid, kind) kind: data/plain/marker
    pending_records: dict[int, list] = {}  # pid -> records of the open transaction
    committed: list = []
    uncommitted: list = []
    aborted: list = []                     # (pid, first_offset, marker offset)
    nxt = draw(st.integers(0, 1000))
    for _ in range(n_events):
        pid = draw(st.sampled_from([1, 2, 3]))
        action = draw(st.sampled_from(["data", "data", "end", "plain"]))
        codec = draw(st.sampled_from(rb.CODECS))
        if action == "data" or (action == "end" and pid not in open_txn):
            n = draw(st.integers(1, 3))
            recs = [R(key=b"p%d" % pid, value=b"%d" % (nxt + i)) for i in range(n)]
            b = rb.v2_batch(recs, nxt, codec=codec, transactional=True, producer_id=pid,
                            producer_epoch=0, base_sequence=0)
            open_txn.setdefault(pid, nxt)
            pending_records.setdefault(pid, []).extend(b.records)
            uncommitted.extend(b.records)
        elif action == "plain":
            b = rb.v2_batch([R(value=b"plain%d" % nxt)], nxt, codec=codec)
            committed.extend(b.records)
            uncommitted.extend(b.records)
        else:
            abort = draw(st.booleans())
            b = rb.control_batch(nxt, pid, abort=abort)
            first = open_txn.pop(pid)
            recs = pending_records.pop(pid)
            if abort:
                aborted.append((pid, first, nxt))
            else:
                committed.extend(recs)
        batches.append(b)
        nxt = b.last_offset + 1
    for pid in sorted(open_txn):  # close what is still open (read_committed stops at the LSO)
        b = rb.control_batch(nxt, pid, abort=False)
        committed.extend(pending_records[pid])
        batches.append(b)
        nxt += 1
    log_start = batches[0].base_offset
    start = draw(st.integers(log_start, nxt))
    end = draw(st.integers(start + 1, nxt + 2))
    # The broker returns batches from the one holding `start`, and the aborted transactions
    # that overlap the fetched range (marker at or after `start`).
    shown = [b for b in batches if b.last_offset >= start]
    data = b"".join(b.data for b in shown)
    aborted_list = [(pid, first) for pid, first, marker in aborted if marker >= start]
    aborted_list = draw(st.permutations(aborted_list))
    next_offset = start
    for b in shown:
        next_offset = max(next_offset, b.last_offset + 1)
        if next_offset >= end:
            break
    committed.sort()
    uncommitted.sort()
    return (data, start, end, aborted_list, rb.expected(committed, start, end),
            rb.expected(uncommitted, start, end), next_offset)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transactional_logs())
def test_transactions_property(case):
    data, start, end, aborted, want_committed, want_all, next_offset = case
    res = dec(data, start=start, end=end, read_committed=True, aborted_transactions=aborted)
    assert res.records == want_committed
    assert res.next_offset == next_offset and not res.truncated
    res = dec(data, start=start, end=end, read_committed=False, aborted_transactions=aborted)
    assert res.records == want_all
    assert res.next_offset == next_offset


@settings(max_examples=50, deadline=None)
@given(recs=st.lists(record_st, min_size=1, max_size=10), codec=st.sampled_from(rb.CODECS),
       cut=st.floats(0, 1, exclude_max=True))
def test_truncation_property(recs, codec, cut):
    b1 = rb.v2_batch(recs, 0, codec=codec)
    b2 = rb.v2_batch(recs, len(recs), codec=codec)
    k = int(cut * len(b2.data))
    assume(k > 0)
    res = dec(b1.data + b2.data[:k])
    assert res.records == b1.records
    assert res.truncated and res.next_offset == len(recs)


def test_invalid_utf8_header_key_is_replaced_not_fatal():
    raw = rb.encode_record(0, 0, b"k", b"v", ((b"ok\xff", b"1"),))
    b = rb.v2_batch([R()], 0, raw_records=raw)
    assert dec(b.data).records[0].headers == (("ok\ufffd", b"1"),)


def test_negative_header_key_length_rejected():
    body = (b"\x00" + rb.zigzag_varint(0) + rb.zigzag_varint(0) + rb.zigzag_varint(-1)
            + rb.zigzag_varint(-1) + rb.zigzag_varint(1) + rb.zigzag_varint(-1)
            + rb.zigzag_varint(-1))
    raw = rb.zigzag_varint(len(body)) + body
    b = rb.v2_batch([R()], 0, raw_records=raw)
    with pytest.raises(CorruptRecordError, match="header key"):
        dec(b.data)
