"""Vectorised decoder: the record bytes of one FetchResponse partition straight into Arrow.

:func:`decode_to_arrow` returns exactly what ``decode_records`` followed by
``arrow.records_to_batch`` would give (same rows, same schema, same ``next_offset`` /
``truncated``, a :class:`CorruptRecordError` for the same inputs), without building a Python object
per record. :mod:`kafka_source.wire.format.records` is the specification; the differential tests in
``tests/unit/test_fast_decode.py`` hold this module to it.

How it works
------------

1. **Batch walk** (Python, one iteration per *batch*): the loop ``decode_records`` runs too,
   :func:`kafka_source.wire.format.records.walk_batches` - truncation, CRC-32C, aborted transactions,
   control batches, the offset window and the early stop - but instead of parsing a kept
   magic-2 batch this module queues it (records section, base offset, timestamps, count). The section is decompressed once per batch; uncompressed ones are a
   zero-copy slice of the input. Legacy magic 0/1 entries are decoded by the reference code.
   An error found by the walk is held back until every batch before it has been decoded, so the
   error raised is the one the reference raises (the first bad batch wins).

2. **Chunks**: queued batches are grouped into chunks of about ``CHUNK_BYTES`` of records
   sections and decoded as soon as a chunk is full, while its bytes are still in cache. Each
   chunk becomes one ``pa.RecordBatch``. Uncompressed sections that are views into a
   :class:`PaddedBuffer` (the fetch connection's receive buffer) are decoded where they are,
   with positions into that buffer; other sections (decompressed ones, plain ``bytes`` input)
   are first concatenated into one padded buffer (one memcpy).

3-4. **The record walk in C** (``_recwalk.c``, built with the package where a C compiler is at
   hand; :func:`_walk_native`): record boundaries and fields (steps 3 and 4 below) in one pass
   over the bytes, record after record, at a few ns per record - a tenth of numpy's CPU. It
   decides nothing on its own: what it does not accept (headers, varints longer than 8 bytes,
   anything malformed) goes to the same general path and reference decoder as below, and the
   differential tests run every case through both walks. Without it (no compiler, or a package
   shipped as plain Python), the numpy walk of steps 3 and 4 (:func:`_walk_numpy`) is used.

3. **Record boundaries**: every record starts with its length (a zigzag varint), so the record
   starts of a batch form a chain, which is inherently serial. Chains are followed in lockstep
   with numpy - one step per record *index* for all lanes at once, via a 64 Ki-entry table over
   the two bytes at each cursor - where a lane is a whole batch or, for long batches, a stretch
   of about ``_SEG_RECORDS`` records starting at a position that *looks* like a record start
   (zero attributes byte, plausible lengths). Guesses are never trusted: a batch is accepted only
   if, starting from its first byte, every lane ends exactly where the next one starts and the
   last one on the batch end after ``count`` records. Wrong guesses are repaired from the exact
   neighbouring walk; whatever is left (records of 8 KiB or more, malformed lengths) is walked
   in a tight Python loop.

4. **Fields**: with the starts known, every field of every record is decoded with a handful of
   whole-array numpy operations (the same table trick; a 1-4 byte decoder for timestamp and
   offset deltas when the batch headers say they may be large). Longer varints, headers and
   anything odd send a record to a general vectorised path. A record is accepted only if its
   fields end exactly at its declared end and every varint and count is sane; a batch with any
   record that is not accepted is decoded by the reference code instead (which then raises the
   reference's error, or returns what the reference returns). This keeps malformed-input
   behaviour identical without re-implementing every corner.

5. **Arrow**: key and value columns are copied out of the chunk buffer by the C walk's
   ``gather`` (:func:`_gathered`: Arrow offsets from the positions the walk found, then one
   memcpy per record into a new buffer). Without the C walk they are cut out by Arrow in C++: one
   ``BinaryArray`` whose offsets are the (key start, key end, value start, value end) of every
   record, then a ``take`` of every 4th element, at about three times the CPU (47 against 11-15
   ms per million 100-byte values). Offsets, timestamps and the other columns are numpy arrays
   handed to Arrow without copies.

Memory: each output batch owns its data (nothing keeps the input buffer alive), so a receive
buffer can be reused as soon as :func:`decode_to_arrow` returns; the value bytes are copied once,
from the input into the value column.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from ...errors import CorruptRecordError
from .arrays import from_numpy, strings
from .records import (  # the reference decoder: its batch walk, and odd batches go through it
    Record,
    V2Batch,
    WalkEnd,
    v2_batch_records,
    walk_batches,
)
from ...schema import arrow_schema

try:    # the record walk in C, built with the package when a compiler was at hand (_recwalk.c)
    from . import _recwalk
    _RECWALK_MISSING = ""
except ImportError as exc:     # pragma: no cover - depends on the installation
    _recwalk = None
    _RECWALK_MISSING = str(exc)

log = logging.getLogger(__name__)
_said_numpy_walk = False

__all__ = ["ArrowDecodeResult", "decode_to_arrow", "CHUNK_BYTES", "PaddedBuffer",
           "RECORDS_PADDING"]

# Records-section bytes per chunk (and so roughly per output batch). The lockstep walk takes one
# numpy step per record index for all lanes of a chunk (a lane is ~64 records), so its fixed cost
# per step is shared by more lanes in bigger chunks: with 1000-byte records, 8 MiB chunks took half
# the CPU of 1 MiB ones (0.40 against 0.80 CPU-seconds per GB, read in place from 8 MiB fetches);
# with 100-byte records 15-20% less. The per-record arrays of a chunk stay small either way.
CHUNK_BYTES = 8 << 20

_SCHEMAS = {False: arrow_schema(False), True: arrow_schema(True)}
_HEADERS_TYPE = _SCHEMAS[True].field("headers").type
_HEADER_FIELDS = [_HEADERS_TYPE.value_type.field(0), _HEADERS_TYPE.value_type.field(1)]
_TIMESTAMP_TYPE = _SCHEMAS[False].field("timestamp").type

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
# Limits that keep every int64 computation exact (anything outside goes to the reference
# decoder): a varint is at most 8 bytes (|value| < 2**55); base offsets are below 2**62, so adding
# a delta fits; timestamps and timestamp deltas are below 2**52 ms, so a record's timestamp is below
# 2**53 ms and its value in microseconds fits in an int64.
_VARINT_MAX_BYTES = 8
_OFFSET_SAFE = 1 << 62
_TS_SAFE = 1 << 52
_MAX_CHUNK_BUFFER = (1 << 31) - 64   # int32 Arrow offsets index the chunk buffer
_BIG = 1 << 40                       # "advance" of an unusual varint: pushes a cursor past the end
_MIN_LANES = 6                       # below this many batches in lockstep, use the Python loop
_SMALL_CHUNK = 64                    # chunks of fewer records go to the reference decoder
_SEG_RECORDS = 64                    # records per lockstep lane when long batches are split
_SPLIT_MIN = 4                       # ... which are batches of at least this many lanes' worth
_MAX_WINDOW = 2048                   # bytes searched for a record start at a split point
_MAX_ZEROS = 32                      # zero bytes tried as attributes bytes per split point
# Padding after a chunk's records: reads near the end stay in bounds, and a record chain that
# runs past the end (malformed data, or a finished lockstep lane) lands in it - a chain step is at
# most 8193 bytes - and stalls there (0x01 is an odd varint: a negative length, step 0).
_PAD = b"\x01" * (8193 + _MAX_WINDOW + 64)
RECORDS_PADDING = _PAD


class PaddedBuffer(bytearray):
    """A buffer the decoder may read in place: its owner promises that after any slice of it
    handed to :func:`decode_to_arrow` the buffer goes on with readable bytes that include, before
    its end, :data:`RECORDS_PADDING` (what the fetch connection writes after every response it
    receives). Record chains that run past a slice then stall in the padding, as they do in the
    padding of a concatenated chunk."""

    __slots__ = ()


class ArrowDecodeResult(NamedTuple):
    """What :func:`decode_to_arrow` returns; unpacks as ``batches, next_offset, truncated``.

    ``batches`` are in offset order and have exactly the schema ``arrow_schema(include_headers)``;
    there is one per chunk of about ``CHUNK_BYTES`` of records (more when legacy or odd batches
    are interleaved), and none when no record was selected.
    """
    batches: list
    next_offset: int
    truncated: bool

    @property
    def count(self) -> int:
        return sum(b.num_rows for b in self.batches)


# ------------------------------------------------------------------------------------------------
# Lookup tables over the two bytes at a cursor (little-endian uint16 ``w``: b0 | b1 << 8).
# ------------------------------------------------------------------------------------------------

def _tables():
    w = np.arange(65536, dtype=np.int64)
    b0 = w & 0xFF
    b1 = w >> 8
    one = b0 < 0x80
    two = ~one & (b1 < 0x80)
    ok = one | two
    z = np.where(one, b0, (b0 & 0x7F) | (b1 << 7))
    size = np.where(one, 1, 2)
    val = np.where(ok, (z >> 1) ^ -(z & 1), 0)
    t = {
        # zigzag-decoded value of a 1- or 2-byte varint (0 for longer ones)
        "val": val,
        # bytes to skip for the varint; _BIG for 3+ bytes so the record fails the end check
        "size": np.where(ok, size, _BIG),
        # varint plus the bytes it counts (key / value); a negative length counts none
        "skip": np.where(ok, size + np.maximum(val, 0), _BIG),
        # the length varint plus the attributes byte that follows it
        "len_attr": np.where(ok, size + 1, _BIG),
        # header count: only 0 is accepted on the fast path
        "hdr0": np.where(ok & (val == 0), size, _BIG),
        # a negative length: a null key / value
        "neg": ok & (val < 0),
        # record chain step: varint size + record length; 0 (stall) for 3+ bytes or length < 0
        "chain": np.where(ok & ((z & 1) == 0), size + (z >> 1), 0),
    }
    for a in t.values():
        a.flags.writeable = False
    return t


_T = _tables()
_VAL, _SIZE, _SKIP, _LEN_ATTR, _HDR0, _NEG, _CHAIN = (
    _T["val"], _T["size"], _T["skip"], _T["len_attr"], _T["hdr0"], _T["neg"], _T["chain"])


# ------------------------------------------------------------------------------------------------
# Batch walk
# ------------------------------------------------------------------------------------------------

# Queue entries: (_FAST, payload, count, base_offset, base_ts, ts_type, max_ts, last_delta)
#                (_REF,  payload, count, base_offset, base_ts, ts_type, max_ts, last_delta)
#                (_RECS, records)
_FAST, _REF, _RECS = 0, 1, 2


@dataclass
class _WalkEnd(WalkEnd):
    error: CorruptRecordError | None = None


def _walk(view, start_offset, end_offset, read_committed, aborted_transactions, check_crcs,
          result: _WalkEnd):
    """The reference decoder's batch walk, as queue entries. Its error is not raised but left
    in ``result``, once the entries before it are yielded."""
    try:
        for kept in walk_batches(view, start_offset=start_offset, end_offset=end_offset,
                                 read_committed=read_committed,
                                 aborted_transactions=aborted_transactions,
                                 check_crcs=check_crcs, end_state=result):
            if not isinstance(kept, V2Batch):
                yield (_RECS, kept)
                continue
            # (Every record takes at least one byte: a larger count is malformed, and would
            # make the vectorised path allocate per declared record.)
            fast = (kept.count <= len(kept.payload)
                    and -_OFFSET_SAFE < kept.base_offset < _OFFSET_SAFE
                    and -_TS_SAFE < (kept.max_ts if kept.ts_type else kept.base_ts) < _TS_SAFE
                    and len(kept.payload) <= _MAX_CHUNK_BUFFER)
            yield (_FAST if fast else _REF,) + kept
    except CorruptRecordError as exc:
        result.error = exc


def _reference_v2(item, lo, hi) -> list[Record]:
    """Decode one queued magic-2 batch with the reference decoder (raising its errors)."""
    out: list[Record] = []
    v2_batch_records(V2Batch(*item[1:]), lo, hi, out)
    return out


# ------------------------------------------------------------------------------------------------
# Record chains
# ------------------------------------------------------------------------------------------------

def _chain_lane(buf: bytes, pos: int, end: int, count: int):
    """Starts of ``count`` records from ``pos``, which must end exactly at ``end``; None if the
    chain is not well formed (the reference decoder then has the last word)."""
    if pos >= end:
        return None
    starts = []
    app = starts.append
    for _ in range(count):
        app(pos)
        b = buf[pos]
        if b < 0x80:
            z = b
            pos += 1
        else:
            b1 = buf[pos + 1]
            if b1 < 0x80:
                z = (b & 0x7F) | (b1 << 7)
                pos += 2
            else:
                z = (b & 0x7F) | ((b1 & 0x7F) << 7)
                shift = 14
                pos += 2
                while True:
                    b = buf[pos]
                    pos += 1
                    z |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                    if shift >= 7 * _VARINT_MAX_BYTES:
                        return None
        if z & 1:
            return None
        pos += z >> 1
        if pos > end:
            return None
    return starts if pos == end else None


def _chains_by_batch(buf: bytes, u16, sec_start, sec_end, counts):
    """Record starts (batch-major) of whole batches, one lockstep lane per batch; and, per batch,
    whether its chain is well formed. When few batches are left, the rest go on in Python."""
    nb = len(counts)
    rec_base = np.cumsum(counts) - counts
    n = int(rec_base[-1] + counts[-1])
    order = np.argsort(-counts, kind="stable")
    cs = counts[order]
    maxc = int(cs[0])
    # k[i]: number of batches holding a record with index >= i (batches sorted by count, so the
    # ones still walking at step i are a prefix of the order).
    k = np.cumsum(np.bincount(cs, minlength=maxc + 2)[::-1])[::-1]
    rows = int(np.count_nonzero(k[1:maxc + 1] >= _MIN_LANES))   # lockstep steps 1..rows
    # Row i of f holds, for the k[i] first sorted batches, the start of record i (or, for a batch
    # of exactly i records, the end of its last record).
    row_off = np.zeros(maxc + 1, dtype=np.int64)
    row_off[1:rows + 1] = np.cumsum(k[:rows])
    kl = k.tolist()
    ro = row_off.tolist()
    f = np.empty(ro[rows] + kl[rows], dtype=np.int64)
    f[:nb] = sec_start[order]
    table = _CHAIN
    lane_ok = np.ones(nb, dtype=bool)
    python_lanes: list[tuple[int, int]] = []   # (batch, first record index to walk in Python)
    try:
        for i in range(1, rows + 1):
            prev = f[ro[i - 1]:ro[i - 1] + kl[i]]
            np.add(prev, table.take(u16[prev]), out=f[ro[i]:ro[i] + kl[i]])
    except IndexError:  # cannot happen with the padding sink; kept as a safety net
        rows = -1
    if rows <= 0:
        python_lanes = [(b, 0) for b in range(nb)]
        st = np.empty(n, dtype=np.int64)
    else:
        # Batches that finished in lockstep: their final position must be their section end.
        walking = kl[rows + 1]                 # sorted batches [0, walking) are not finished
        if walking < nb:
            j = np.arange(walking, nb)
            final = f[row_off[cs[walking:]] + j]
            bad = np.flatnonzero(final != sec_end[order[walking:]])
            python_lanes.extend((int(order[walking + x]), 0) for x in bad)
        for j in range(walking):               # the longest batches continue in Python
            b = int(order[j])
            if f[ro[rows] + j] == f[ro[rows - 1] + j]:
                python_lanes.append((b, 0))    # stalled on an unusual record: walk it whole
            else:
                python_lanes.append((b, rows))
        inv = np.empty(nb, dtype=np.int64)
        inv[order] = np.arange(nb)
        bid = np.repeat(np.arange(nb), counts)
        rec_index = np.arange(n, dtype=np.int64) - rec_base[bid]
        # Records past row `rows` (batches continued in Python) read row 0; replaced below.
        row_off[rows + 1:] = 0
        st = f[row_off[rec_index] + inv[bid]]
    for b, first in python_lanes:
        rb = int(rec_base[b])
        cnt = int(counts[b])
        pos = int(st[rb + first]) if first else int(sec_start[b])
        lane = _chain_lane(buf, pos, int(sec_end[b]), cnt - first)
        if lane is None:
            lane_ok[b] = False
            st[rb:rb + cnt] = sec_start[b]
        else:
            st[rb + first:rb + cnt] = lane
    return st, lane_ok


def _looks_like_records(buf8, u16, p, end):
    """Whether a record seems to start at each ``p``: it and the next two records have a 1-2
    byte length >= 6 and a zero attributes byte (or the section ends). Only a hint: seeds that
    pass are verified exactly afterwards."""
    ok = np.ones(len(p), dtype=bool)
    for _ in range(3):
        w = u16[p]
        t = _CHAIN.take(w)
        here = (t >= 7) & (buf8[p + 1 + ((w & 0x80) != 0)] == 0)
        at_end = p == end
        ok &= here | at_end
        p = np.where(at_end, p, np.minimum(p + t, end + 1))
        ok &= p <= end
    return ok


def _lanes(buf8, u16, sec_start, sec_end, counts):
    """Split long batches into lanes of about _SEG_RECORDS records, each starting at a position
    that looks like a record start. Returns (lane batch, lane start) sorted by position, or None
    if no batch is worth splitting."""
    nb = len(counts)
    size = sec_end - sec_start
    width = np.minimum(3 * (size // counts) + 16, _MAX_WINDOW)
    k = np.minimum(counts // _SEG_RECORDS, size // (2 * width))
    # Splitting pays off only for batches well above the lane length (finding seeds has a cost).
    k[(k < 2) | (counts < _SPLIT_MIN * _SEG_RECORDS)] = 1
    nwin = k - 1
    m = int(nwin.sum())
    if m == 0:
        return None
    wbatch = np.repeat(np.arange(nb), nwin)
    j = np.arange(1, m + 1) - np.repeat(np.cumsum(nwin) - nwin, nwin)
    q = sec_start[wbatch] + (j * size[wbatch]) // k[wbatch]
    wmax = int(width[nwin > 0].max())
    windows = np.lib.stride_tricks.sliding_window_view(buf8, wmax)[q]
    z = np.flatnonzero(windows == 0)           # zero bytes: possible attributes bytes
    zrow = z // wmax
    zcol = z - zrow * wmax
    # Only the first _MAX_ZEROS zero bytes of a window are tried (data full of zeros would
    # otherwise make this step expensive; a window without a seed just leaves a longer lane).
    boundary = np.ones(len(zrow), dtype=bool)
    boundary[1:] = zrow[1:] != zrow[:-1]
    index = np.arange(len(zrow))
    rank = index - np.maximum.accumulate(np.where(boundary, index, 0))
    keep = (zcol < width[wbatch[zrow]]) & (rank < _MAX_ZEROS)
    zrow = zrow[keep]
    zpos = q[zrow] + zcol[keep]
    b1 = buf8[zpos - 1]
    b2 = buf8[zpos - 2]
    one = b1 < 0x80                            # a 1-byte length before the zero ...
    two = one & (b2 >= 0x80)                   # ... or a 2-byte one
    cand_row = np.concatenate((zrow[one], zrow[two]))
    cand = np.concatenate((zpos[one] - 1, zpos[two] - 2))
    cand_end = sec_end[wbatch[cand_row]]
    ok = (cand >= q[cand_row]) & _looks_like_records(buf8, u16, cand, cand_end)
    cand_row = cand_row[ok]
    cand = cand[ok]
    # Per window, the first candidate right after a zero byte (the header count of the record
    # before, when it has no headers), else the first candidate.
    after_zero = buf8[cand - 1] == 0
    order = np.lexsort((cand, ~after_zero, cand_row))
    cand_row = cand_row[order]
    cand = cand[order]
    first = np.ones(len(cand_row), dtype=bool)
    first[1:] = cand_row[1:] != cand_row[:-1]
    seeds = cand[first]
    seed_batch = wbatch[cand_row[first]]
    lane_start = np.concatenate((sec_start, seeds))
    lane_batch = np.concatenate((np.arange(nb), seed_batch))
    order = np.argsort(lane_start, kind="stable")
    return lane_batch[order], lane_start[order]


def _chains(buf: bytes, buf8, u16, sec_start, sec_end, counts, bid, rec_base):
    """Start of every record (batch-major) and, per batch, whether its chain is well formed.

    Long batches are split into lanes at seeds found by :func:`_lanes`; all lanes are walked in
    lockstep until they reach the next lane's start. A batch is accepted only if every lane ends
    exactly on the next lane's start (the last on the section end) and the lanes hold ``count``
    records in total: then, by induction from the section start, the lanes are exactly the
    record chain. Batches that fail (a seed that was not a record start, a record of 8 KiB or
    more, malformed data) are walked whole by :func:`_chains_by_batch`.
    """
    lanes = _lanes(buf8, u16, sec_start, sec_end, counts)
    if lanes is None:
        return _chains_by_batch(buf, u16, sec_start, sec_end, counts)
    lane_batch, starts = lanes
    nl = len(starts)
    bounds = np.empty(nl, dtype=np.int64)
    bounds[:-1] = starts[1:]
    last = np.ones(nl, dtype=bool)
    last[:-1] = lane_batch[1:] != lane_batch[:-1]
    bounds[last] = sec_end
    # Walk all lanes; rows of p are steps. Finished lanes keep walking (into the next lane, or
    # into the padding, where they stall), which is harmless.
    avg = np.maximum((sec_end - sec_start) // counts, 1)
    est = int(((bounds - starts) // avg[lane_batch]).max())
    cap = est + est // 2 + 16
    p = np.empty((cap, nl), dtype=np.int64)
    p[0] = starts
    table = _CHAIN
    i = 0
    while True:
        for _ in range(8):
            i += 1
            if i == cap:
                grown = np.empty((2 * cap, nl), dtype=np.int64)
                grown[:cap] = p
                p = grown
                cap *= 2
            prev = p[i - 1]
            np.add(prev, table.take(u16[prev]), out=p[i])
        row = p[i]
        if ((row >= bounds) | (row == p[i - 1])).all():
            break
    p = p[:i + 1]
    below = p < bounds
    cnt = below.sum(axis=0)
    exits = p[np.minimum(cnt, i), np.arange(nl)]
    lane_ok = (cnt <= i) & (exits == bounds)
    first_lane = np.flatnonzero(np.concatenate(([True], lane_batch[1:] != lane_batch[:-1])))
    batch_ok = (np.logical_and.reduceat(lane_ok, first_lane)
                & (np.add.reduceat(cnt, first_lane) == counts))
    if batch_ok.all():
        return p.T[below.T], batch_ok
    st = np.empty(len(bid), dtype=np.int64)
    rec_ok = batch_ok[bid]
    st[rec_ok] = p.T[(below & batch_ok[lane_batch]).T]
    lane_ok_all = lane_ok
    lane_ok = batch_ok.copy()
    last_lane = np.append(first_lane[1:], nl)
    for b in np.flatnonzero(~batch_ok):
        r0 = int(rec_base[b])
        c = int(counts[b])
        chain = _resolve_batch(buf, p, below, lane_ok_all, starts, bounds,
                               int(first_lane[b]), int(last_lane[b]),
                               int(sec_start[b]), int(sec_end[b]), c)
        if chain is None:
            st[r0:r0 + c] = sec_start[b]
        else:
            st[r0:r0 + c] = chain
            lane_ok[b] = True
    return st, lane_ok


def _walked(column):
    """The part of a lane's walk that is a chain: up to the first stall (inclusive)."""
    stall = np.flatnonzero(column[1:] <= column[:-1])
    return column[:stall[0] + 1] if stall.size else column


def _resolve_batch(buf, p, below, closes, starts, bounds, lane0, lane1, sec_start, sec_end,
                   count):
    """Record starts of one batch whose lockstep lanes did not all check out; None if the batch
    is malformed.

    Walks the lanes in order, knowing the exact chain position ``pos`` at each lane's start
    bound. A lane whose start is ``pos`` walked the true chain. Otherwise its seed was not a
    record start: the exact chain is the previous lane's walk past its bound (the "tail"), until
    it meets this lane's walk (chains that meet stay together), and this lane's walk from there.
    If the tail ends first (a record of 8 KiB or more, or a malformed length), the rest of the
    batch is walked in Python from the last exact position.
    """
    out = []
    pos = sec_start
    tail = None
    lane = lane0
    while lane < lane1:
        if pos == starts[lane] and closes[lane]:
            # A run of lanes that each end on the next one's start: all exact.
            run = lane + 1
            while run < lane1 and closes[run]:
                run += 1
            block = p[:, lane:run]
            out.append(block.T[below[:, lane:run].T])
            pos = int(bounds[run - 1])
            tail = None
            lane = run
            continue
        walk = _walked(p[:, lane])
        if pos == starts[lane]:
            seq = walk
        elif tail is not None:
            meet = np.flatnonzero(np.isin(tail, walk))
            if meet.size:
                m = meet[0]
                seq = np.concatenate((tail[:m], walk[np.searchsorted(walk, tail[m]):]))
            else:
                seq = tail
        else:
            seq = np.array([pos], dtype=np.int64)   # only the position itself is known
        k = int(np.searchsorted(seq, bounds[lane]))
        if k == len(seq):   # the exact chain ends before the bound: Python from its last position
            out.append(seq[:-1])
            done = sum(len(x) for x in out)
            rest = _chain_lane(buf, int(seq[-1]), sec_end, count - done)
            if rest is None:
                return None
            out.append(np.array(rest, dtype=np.int64))
            pos = sec_end
            break
        out.append(seq[:k])
        pos = int(seq[k])
        tail = seq[k:]
        lane += 1
    chain = np.concatenate(out) if out else np.empty(0, dtype=np.int64)
    if pos != sec_end or len(chain) != count:
        return None
    return chain


# ------------------------------------------------------------------------------------------------
# Field decoding
# ------------------------------------------------------------------------------------------------

def _fields_fast(u16, u32, st, en, wide_ts=False, wide_offset=False, clamp=False):
    """Decode the fields of records whose varints are short and that have no headers.

    Key, value and header-count varints must be 1-2 bytes (the table); the timestamp and offset
    deltas too, unless ``wide_ts`` / ``wide_offset`` (set when the batch headers say deltas can be
    larger) select the 1-4 byte decoder. Returns (ts_delta, offset_delta, key_start, key_end,
    key_null, value_start, value_end, value_null, ok); records with ``ok`` False need the general
    path. A cursor that meets an unusual varint jumps by _BIG, past its record's end, so the record
    fails the final check; it can then run off the buffer (IndexError) unless ``clamp`` caps the
    cursors at the buffer end (a few more passes, so only done on a retry)."""
    if clamp:
        limit = len(u32) - 1

        def fix(a):
            return np.minimum(a, limit, out=a)
    else:
        def fix(a):
            return a

    def delta(c, wide):
        """(values, sizes) of the varints at cursors ``c``: 1-4 bytes if ``wide``, else 1-2."""
        if wide:
            return _varint_wide(u32, c)
        w = u16[c]
        return _VAL.take(w), _SIZE.take(w)

    c = fix(st + _LEN_ATTR.take(u16[st]))
    tsd, size = delta(c, wide_ts)
    c = fix(c + size)
    od, size = delta(c, wide_offset)
    c = fix(c + size)
    w = u16[c]
    knull = _NEG.take(w)
    ks = c + _SIZE.take(w)
    ke = fix(c + _SKIP.take(w))
    w = u16[ke]
    vnull = _NEG.take(w)
    vs = ke + _SIZE.take(w)
    ve = fix(ke + _SKIP.take(w))
    fin = ve + _HDR0.take(u16[ve])
    return tsd, od, ks, ke, knull, vs, ve, vnull, fin == en


# Size of a 1-4 byte varint from its lowest "stop" bit (0x80 << 8k) shifted down by 7, mod 11.
_WIDE_SIZE = np.full(11, _BIG, dtype=np.int64)
_WIDE_SIZE[[1, 3, 9, 5]] = [1, 2, 3, 4]
_WIDE_SIZE.flags.writeable = False


def _varint_wide(u32, c):
    """Zigzag varints of 1-4 bytes at positions ``c``: (value, size); size is _BIG (and the
    value meaningless) for longer ones."""
    w = u32[c].astype(np.int64)
    stop = ~w & 0x80808080                     # bytes without a continuation bit
    low = stop & -stop                         # the first of them
    size = _WIDE_SIZE.take((low >> 7) % 11)
    v = w & ((low << 1) - 1)                   # the varint's bytes
    z = (v & 0x7F) | ((v >> 1) & 0x3F80) | ((v >> 2) & 0x1FC000) | ((v >> 3) & 0xFE00000)
    return (z >> 1) ^ -(z & 1), size


def _varints(buf, u16, u32, c):
    """Zigzag varints at positions ``c`` of any size up to _VARINT_MAX_BYTES; positions may be
    anywhere (even past the buffer). Returns (value int64, size int64, too_long bool)."""
    c = np.minimum(c, len(u32) - 1)
    w = u16[c]
    value = _VAL.take(w)
    size = _SIZE.take(w)
    too_long = np.zeros(len(c), dtype=bool)
    longer = np.flatnonzero(size == _BIG)
    if longer.size:
        cl = c[longer]
        value[longer], size[longer] = _varint_wide(u32, cl)
        longer = longer[size[longer] == _BIG]
    if longer.size:
        cl = c[longer]
        b = buf.take(cl, mode="clip")
        z = (b & 0x7F).astype(np.int64)
        n = np.ones(len(cl), dtype=np.int64)
        more = np.flatnonzero(b & 0x80)
        shift = 7
        while more.size and shift < 7 * _VARINT_MAX_BYTES:
            b = buf.take(cl[more] + (shift // 7), mode="clip")
            z[more] |= (b & 0x7F).astype(np.int64) << shift
            n[more] += 1
            more = more[(b & 0x80) != 0]
            shift += 7
        value[longer] = (z >> 1) ^ -(z & 1)
        size[longer] = n
        too_long[longer[more]] = True
    return value, size, too_long


class _General(NamedTuple):
    tsd: np.ndarray
    od: np.ndarray
    ks: np.ndarray
    ke: np.ndarray
    knull: np.ndarray
    vs: np.ndarray
    ve: np.ndarray
    vnull: np.ndarray
    hc: np.ndarray
    bad: np.ndarray
    # header entries, ordered by (record, header index); h_rec indexes the subset
    h_rec: np.ndarray
    h_ks: np.ndarray
    h_ke: np.ndarray
    h_vs: np.ndarray
    h_ve: np.ndarray
    h_vnull: np.ndarray


def _fields_general(buf, u16, u32, st, en) -> _General:
    """Decode records of any shape (long varints, headers); ``bad`` marks the ones that are not
    well formed (their batch then goes to the reference decoder)."""
    _length, size, bad = _varints(buf, u16, u32, st)
    c = st + size + 1
    tsd, size, tl = _varints(buf, u16, u32, c)
    bad |= tl | (tsd <= -_TS_SAFE) | (tsd >= _TS_SAFE)
    c += size
    od, size, tl = _varints(buf, u16, u32, c)
    bad |= tl
    c += size
    kl, size, tl = _varints(buf, u16, u32, c)
    bad |= tl
    ks = c + size
    ke = ks + np.maximum(kl, 0)
    vl, size, tl = _varints(buf, u16, u32, ke)
    bad |= tl
    vs = ke + size
    ve = vs + np.maximum(vl, 0)
    hc, size, tl = _varints(buf, u16, u32, ve)
    bad |= tl
    c = ve + size
    np.minimum(c, en + 1, out=c)
    # Every header takes at least 2 bytes: a larger count cannot fit (and is not looped over).
    bad |= (hc < 0) | (hc * 2 > en - c)
    hc[bad] = 0
    active = np.flatnonzero(hc)
    hcount = hc[active]
    total = int(hcount.sum())
    h_ks = np.empty(total, dtype=np.int64)
    h_ke = np.empty(total, dtype=np.int64)
    h_vs = np.empty(total, dtype=np.int64)
    h_ve = np.empty(total, dtype=np.int64)
    h_vnull = np.empty(total, dtype=bool)
    if total:
        base = np.cumsum(hcount) - hcount
        idx = active
        j = 0
        while idx.size:
            cur = c[idx]
            hkl, size, tl = _varints(buf, u16, u32, cur)
            hbad = tl | (hkl < 0)
            hks = cur + size
            hke = hks + np.maximum(hkl, 0)
            hvl, size, tl = _varints(buf, u16, u32, hke)
            hbad |= tl
            hvs = hke + size
            hve = hvs + np.maximum(hvl, 0)
            c[idx] = np.minimum(hve, en[idx] + 1)
            flat = base + j
            h_ks[flat] = hks
            h_ke[flat] = hke
            h_vs[flat] = hvs
            h_ve[flat] = hve
            h_vnull[flat] = hvl < 0
            bad[idx[hbad]] = True
            j += 1
            keep = hcount > j
            idx = idx[keep]
            base = base[keep]
            hcount = hcount[keep]
        h_rec = np.repeat(active, hc[active])
    else:
        h_rec = np.empty(0, dtype=np.int64)
    bad |= c != en
    return _General(tsd, od, ks, ke, kl < 0, vs, ve, vl < 0, hc, bad,
                    h_rec, h_ks, h_ke, h_vs, h_ve, h_vnull)


# ------------------------------------------------------------------------------------------------
# Arrow building
# ------------------------------------------------------------------------------------------------

def _validity(valid: np.ndarray):
    """(bitmap buffer or None, null count) for a boolean validity array."""
    nulls = len(valid) - int(np.count_nonzero(valid))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def _pieces(pbuf, a, b, c, d):
    """A BinaryArray over the chunk buffer whose elements 4i..4i+3 are [a_i, b_i), [b_i, c_i),
    [c_i, d_i), [d_i, a_{i+1}) - the positions must be non-decreasing in that order."""
    m = len(a)
    p = np.empty(4 * m + 1, dtype=np.int32)
    p[0:4 * m:4] = a
    p[1::4] = b
    p[2::4] = c
    p[3::4] = d
    p[4 * m] = d[-1] if m else 0
    return pa.BinaryArray.from_buffers(pa.binary(), 4 * m, [None, pa.py_buffer(p), pbuf])


def _cut(pieces, index4, null):
    """Elements ``index4`` of ``pieces`` as a binary column, null where ``null``."""
    taken = pieces.take(from_numpy(index4))
    if null is None or not null.any():
        return taken
    validity, nulls = _validity(~null)
    _, offsets, data = taken.buffers()
    return pa.Array.from_buffers(pa.binary(), len(taken), [validity, offsets, data], nulls)


def _string_column(keys_bin: pa.Array) -> pa.Array:
    """Binary header keys as strings, invalid UTF-8 replaced by U+FFFD like the reference."""
    _, offsets, data = keys_bin.buffers()
    if data is None or len(keys_bin) == 0:
        return strings([""] * len(keys_bin))
    end = int(np.frombuffer(offsets, dtype=np.int32, count=len(keys_bin) + 1)[-1])
    if end == 0 or int(np.frombuffer(data, dtype=np.uint8, count=end).max()) < 0x80:
        return pa.Array.from_buffers(pa.string(), len(keys_bin), [None, offsets, data])
    return strings([k.decode("utf-8", "replace") for k in keys_bin.to_pylist()])


_topic_cache: dict = {}


def _topic_column(topic: str, n: int) -> pa.Array:
    raw = _topic_cache.get(topic)
    if raw is None:
        raw = topic.encode("utf-8")
        if len(_topic_cache) > 64:
            _topic_cache.clear()
        _topic_cache[topic] = raw
    size = len(raw)
    if n * size > _MAX_CHUNK_BUFFER:
        return pa.array([topic] * n, type=pa.string())
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32) if size else \
        np.zeros(n + 1, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(raw * n)])


# ------------------------------------------------------------------------------------------------
# One chunk of magic-2 batches
# ------------------------------------------------------------------------------------------------

def _decode_chunk(items, lo, hi, start_offset, end_offset, topic, partition, include_headers):
    """Decode queued _FAST batches; returns output pieces (RecordBatch or list of Records) in
    batch order."""
    nb = len(items)
    counts = np.fromiter((it[2] for it in items), dtype=np.int64, count=nb)
    if int(counts.sum()) < _SMALL_CHUNK:
        # A few records: numpy's fixed costs outweigh the per-record work it saves.
        return [recs for recs in (_reference_v2(it, start_offset, end_offset) for it in items)
                if recs]
    payloads = [it[1] for it in items]
    lengths = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=nb)
    raw, sec_start = _in_place(payloads)
    if raw is None:
        sec_end = np.cumsum(lengths)
        sec_start = sec_end - lengths
        payloads.append(_PAD)
        raw = b"".join(payloads)
    else:
        sec_end = sec_start + lengths
    buf = np.frombuffer(raw, dtype=np.uint8)
    size = len(raw) - 1
    u16 = np.ndarray((size,), dtype="<u2", buffer=raw, offset=0, strides=(1,))
    u32 = np.ndarray((size - 2,), dtype="<u4", buffer=raw, offset=0, strides=(1,))
    rec_base = np.cumsum(counts) - counts
    n = int(rec_base[-1] + counts[-1])
    bid = np.repeat(np.arange(nb), counts)

    walk = _recwalk
    if walk is not None:
        st, en, fields, batch_ok = _walk_native(walk, raw, sec_start, sec_end, counts, n)
    else:
        _say_numpy_walk()
        st, en, fields, batch_ok = _walk_numpy(raw, buf, u16, u32, items, sec_start, sec_end,
                                               counts, bid, rec_base, n)
    tsd, od, ks, ke, knull, vs, ve, vnull, ok = fields
    gidx = np.flatnonzero(~ok)
    hc = None
    gen = None
    if gidx.size:
        gen = _fields_general(buf, u16, u32, st[gidx], en[gidx])
        tsd[gidx] = gen.tsd
        od[gidx] = gen.od
        ks[gidx] = gen.ks
        ke[gidx] = gen.ke
        knull[gidx] = gen.knull
        vs[gidx] = gen.vs
        ve[gidx] = gen.ve
        vnull[gidx] = gen.vnull
        if gen.bad.any():
            batch_ok = batch_ok.copy()
            batch_ok[bid[gidx[gen.bad]]] = False
        if gen.hc.any():
            hc = np.zeros(n, dtype=np.int64)
            hc[gidx] = gen.hc

    all_ok = bool(batch_ok.all())
    if not all_ok:
        # Neutral positions for records of batches left to the reference decoder, so that the
        # positions of the records that are kept stay non-decreasing.
        for b in np.flatnonzero(~batch_ok):
            r0, r1 = rec_base[b], rec_base[b] + counts[b]
            ks[r0:r1] = ke[r0:r1] = vs[r0:r1] = ve[r0:r1] = sec_start[b]

    base_offset = np.fromiter((it[3] for it in items), dtype=np.int64, count=nb)
    offsets = base_offset[bid] + od
    ts_type = np.fromiter((it[5] for it in items), dtype=np.int32, count=nb)
    timestamps = np.fromiter((it[4] for it in items), dtype=np.int64, count=nb)[bid] + tsd
    if ts_type.any():
        max_ts = np.fromiter((it[6] for it in items), dtype=np.int64, count=nb)
        timestamps = np.where(ts_type.astype(bool)[bid], max_ts[bid], timestamps)

    if all_ok and int(offsets.min()) >= lo and int(offsets.max()) < hi:
        sel = None
        m = n
    else:
        keep = (offsets >= lo) & (offsets < hi)
        if not all_ok:
            keep &= batch_ok[bid]
        sel = np.flatnonzero(keep)
        m = len(sel)

    out = []
    if m:
        out_batch = _build_batch(raw, sel, m, offsets, timestamps, ts_type[bid], ks, ke, knull,
                                 vs, ve, vnull, hc, gen, gidx, topic, partition,
                                 include_headers)
    if all_ok:
        if m:
            out.append(out_batch)
        return out
    # Interleave the reference decoder's output for the batches it has to decode.
    rows = np.zeros(nb, dtype=np.int64)
    if m:
        rows = np.bincount(bid[sel], minlength=nb)
    row = 0
    first = 0
    for b in range(nb):
        if batch_ok[b]:
            row += int(rows[b])
            continue
        if row > first:
            out.append(out_batch.slice(first, row - first))
        first = row
        recs = _reference_v2(items[b], start_offset, end_offset)
        if recs:
            out.append(recs)
    if row > first:
        out.append(out_batch.slice(first, row - first))
    return out


def _say_numpy_walk() -> None:
    """Once per process: this installation has no C walk, so decoding takes more CPU."""
    global _said_numpy_walk
    if not _said_numpy_walk:
        _said_numpy_walk = True
        log.warning("kafka_source: the decoder's record walk in C (kafka_source/wire/format/"
                    "_recwalk.c) is not built in this installation%s; records are walked with "
                    "numpy, at about twice the decoder's CPU. Install the package where a C "
                    "compiler and the Python headers are at hand (e.g. gcc and python3-dev) "
                    "to build it.", f" ({_RECWALK_MISSING})" if _RECWALK_MISSING else "")


def _walk_numpy(raw, buf, u16, u32, items, sec_start, sec_end, counts, bid, rec_base, n):
    """Record starts and ends, fields (``_fields_fast``'s tuple) and per-batch chain health,
    with numpy: the lockstep chains, then the table-driven field decoder."""
    st, lane_ok = _chains(raw, buf, u16, sec_start, sec_end, counts, bid, rec_base)
    en = np.empty(n, dtype=np.int64)
    en[:-1] = st[1:]
    en[rec_base + counts - 1] = sec_end
    if not lane_ok.all():
        for b in np.flatnonzero(~lane_ok):
            en[rec_base[b]:rec_base[b] + counts[b]] = sec_start[b]
    # Deltas that need 3+ byte varints (batches of more than 8192 offsets or spanning more than
    # 8 s) are decoded with the wider decoder; anything unexpected fails the end check anyway.
    wide_offset = max(it[7] for it in items) > 8191
    wide_ts = any(it[6] - it[4] > 8191 or it[5] for it in items)
    try:
        fields = _fields_fast(u16, u32, st, en, wide_ts, wide_offset)
    except IndexError:
        fields = _fields_fast(u16, u32, st, en, wide_ts, wide_offset, clamp=True)
    return st, en, fields, lane_ok


def _walk_native(walk, raw, sec_start, sec_end, counts, n):
    """What :func:`_walk_numpy` returns, from the C walk (``_recwalk.c``): one pass over the
    bytes, record after record."""
    nb = len(counts)
    st, en, tsd, od, ks, ke, vs, ve = np.empty((8, n), dtype=np.int64)
    knull, vnull, ok = np.empty((3, n), dtype=bool)
    batch_ok = np.empty(nb, dtype=bool)
    walk.walk(raw, np.ascontiguousarray(sec_start, dtype=np.int64),
              np.ascontiguousarray(sec_end, dtype=np.int64),
              np.ascontiguousarray(counts, dtype=np.int64),
              st, en, tsd, od, ks, ke, knull, vs, ve, vnull, ok, batch_ok)
    return st, en, (tsd, od, ks, ke, knull, vs, ve, vnull, ok), batch_ok


def _in_place(payloads):
    """(buffer, section starts) when every payload is a view into the same
    :class:`PaddedBuffer` (uncompressed batches of a fetch response): the chunk is decoded there,
    without a copy. (None, None) otherwise."""
    first = payloads[0]
    base = first.obj if isinstance(first, memoryview) else None
    if not isinstance(base, PaddedBuffer) or len(base) > _MAX_CHUNK_BUFFER:
        return None, None
    for p in payloads:
        if not isinstance(p, memoryview) or p.obj is not base or not p.c_contiguous:
            return None, None
    origin = np.frombuffer(base, dtype=np.uint8).ctypes.data
    starts = np.fromiter((np.frombuffer(p, dtype=np.uint8).ctypes.data - origin if len(p)
                          else 0 for p in payloads), dtype=np.int64, count=len(payloads))
    if len(starts) > 1 and (np.diff(starts) < 0).any():
        return None, None
    return base, starts


def _gathered(walk, raw, starts, ends, sel, null):
    """A binary column of the bytes [starts[j], ends[j]) of ``raw`` for the records ``sel``
    (all when None), null where ``null`` (already selected): copied by the C walk's ``gather``,
    one memcpy per record, instead of :func:`_cut`'s ``take``."""
    m = len(starts) if sel is None else len(sel)
    offsets = np.empty(m + 1, dtype=np.int32)
    data = walk.gather(raw, starts, ends, sel, offsets)
    validity, nulls = _validity(~null)
    return pa.Array.from_buffers(pa.binary(), m, [validity, pa.py_buffer(offsets),
                                                  pa.py_buffer(data)], nulls)


def _build_batch(raw, sel, m, offsets, timestamps, ts_types, ks, ke, knull, vs, ve, vnull, hc,
                 gen, gidx, topic, partition, include_headers):
    n = len(offsets)
    pbuf = pa.py_buffer(raw)
    if sel is not None:
        offsets = offsets[sel]
        timestamps = timestamps[sel]
        ts_types = ts_types[sel]
        knull = knull[sel]
        vnull = vnull[sel]
    walk = _recwalk
    if walk is not None:
        key = _gathered(walk, raw, ks, ke, sel, knull)
        value = _gathered(walk, raw, vs, ve, sel, vnull)
    else:
        pieces = _pieces(pbuf, ks, ke, vs, ve)
        index4 = np.arange(0, 4 * n, 4, dtype=np.int64) if sel is None else sel * 4
        key = _cut(pieces, index4, knull)
        value = _cut(pieces, index4 + 2, vnull)
    timestamps *= 1000
    columns = [
        key,
        value,
        _topic_column(topic, m),
        from_numpy(np.full(m, partition, dtype=np.int32)),
        from_numpy(offsets),
        pa.Array.from_buffers(_TIMESTAMP_TYPE, m, [None, pa.py_buffer(timestamps)]),
        from_numpy(ts_types),
    ]
    if include_headers:
        columns.append(_headers_column(pbuf, sel, m, hc, gen, gidx))
    return pa.RecordBatch.from_arrays(columns, schema=_SCHEMAS[include_headers])


def _headers_column(pbuf, sel, m, hc, gen, gidx):
    if hc is None:
        return pa.nulls(m, type=_HEADERS_TYPE)
    rec = gidx[gen.h_rec]                      # chunk record of every header entry
    counts = hc if sel is None else hc[sel]
    if sel is not None:
        selected = np.zeros(len(hc), dtype=bool)
        selected[sel] = True
        entry_mask = selected[rec]
        hks, hke = gen.h_ks[entry_mask], gen.h_ke[entry_mask]
        hvs, hve = gen.h_vs[entry_mask], gen.h_ve[entry_mask]
        hvnull = gen.h_vnull[entry_mask]
    else:
        hks, hke, hvs, hve, hvnull = gen.h_ks, gen.h_ke, gen.h_vs, gen.h_ve, gen.h_vnull
    total = len(hks)
    list_offsets = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    if total:
        pieces = _pieces(pbuf, hks, hke, hvs, hve)
        index4 = np.arange(0, 4 * total, 4, dtype=np.int64)
        keys = _string_column(pieces.take(from_numpy(index4)))
        values = _cut(pieces, index4 + 2, hvnull)
    else:
        keys = pa.nulls(0, pa.string())
        values = pa.nulls(0, pa.binary())
    entries = pa.StructArray.from_arrays([keys, values], fields=_HEADER_FIELDS)
    validity, nulls = _validity(counts > 0)
    return pa.Array.from_buffers(_HEADERS_TYPE, m, [validity, pa.py_buffer(list_offsets)],
                                 nulls, children=[entries])


# ------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------

def decode_to_arrow(data, *, start_offset: int, end_offset: int, read_committed: bool = False,
                    aborted_transactions: Sequence[tuple[int, int]] = (),
                    check_crcs: bool = True, topic: str, partition: int,
                    include_headers: bool) -> ArrowDecodeResult:
    """Decode the records section of one FetchResponse partition into Arrow record batches.

    Same arguments and rules as :func:`kafka_source.wire.format.records.decode_records`, plus the topic,
    partition and header choice of the output. Returns an :class:`ArrowDecodeResult`
    ``(batches, next_offset, truncated)``: the batches hold the records with
    ``start_offset <= offset < end_offset`` in offset order, with schema
    ``arrow_schema(include_headers)``; the rows equal ``records_to_batch(decode_records(...)
    .records, topic, partition, include_headers)``. ``data`` (bytes, bytearray or memoryview) is
    not copied beyond what decoding needs and is not referenced by the result.
    """
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    if start_offset >= end_offset:
        return ArrowDecodeResult([], start_offset, False)
    lo = max(int(start_offset), _INT64_MIN)
    hi = min(int(end_offset), _INT64_MAX)
    end = _WalkEnd()
    pieces: list = []
    chunk: list = []
    chunk_bytes = 0

    def flush():
        pieces.extend(_decode_chunk(chunk, lo, hi, start_offset, end_offset, topic, partition,
                                    include_headers))
        chunk.clear()

    # Chunks are decoded as soon as they are full, while their bytes are still in cache. An error
    # they raise comes from a batch before any the walk has not reached yet, as required.
    for item in _walk(view, start_offset, end_offset, read_committed, aborted_transactions,
                      check_crcs, end):
        kind = item[0]
        if kind == _FAST:
            size = len(item[1])
            if chunk and chunk_bytes + size > CHUNK_BYTES:
                flush()
                chunk_bytes = 0
            chunk.append(item)
            chunk_bytes += size
            continue
        if chunk:
            flush()
            chunk_bytes = 0
        if kind == _RECS:
            pieces.append(item[1])
        else:
            recs = _reference_v2(item, start_offset, end_offset)
            if recs:
                pieces.append(recs)
    if chunk:
        flush()
    error, next_offset, truncated = end.error, end.next_offset, end.truncated
    if error is not None:
        raise error
    batches = []
    for piece in pieces:
        if isinstance(piece, list):
            from .arrow import records_to_batch  # noqa: PLC0415 - arrow may import this module
            piece = records_to_batch(piece, topic, partition, include_headers)
        batches.append(piece)
    return ArrowDecodeResult(batches, next_offset, truncated)
