"""Columnar Protobuf decoding: a column of messages into one Arrow struct array, numpy over bytes.

A Protobuf message is a sequence of (tag, value) pairs in any order: a tag is a varint of the
field number and the wire type, a value a varint, 4 or 8 bytes, or a length and that many bytes
(strings, bytes, nested messages, packed repeated numbers). So every message of a column is read
at once, in rounds: each round reads the next tag of every message that has bytes left, then,
per field number found, that field's value for the messages that have it -- one numpy operation
over them. A message of 12 fields takes 12 rounds, whatever the number of messages. Nested
messages are decoded the same way, all of a field's occurrences together, after the round loop.

As the Protobuf specification says: fields the reader's message does not have (a newer writer's)
are skipped by their wire type, a singular field seen twice keeps its last value, repeated values
keep their order, and packed and unpacked encodings of a repeated field are both read. The
writer's schema is not needed: fields are matched by number.

Every read is bounds-checked against its message's end; a message that breaks off, holds a wire
type or length that cannot be, or a string that is not UTF-8 is marked bad with the reason, and
the caller fails or nulls it (``mode``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..avro.decode import Cursor, _binary_array, _checked_strings, bool_array
from ..framing import HEADER_SIZE, column_bytes, schema_ids
from .schema import (DURATION, TIMESTAMP, field_types, is_map, message_descriptor, message_index,
                     repeated)

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_WIDTH = {FIXED64: 8, FIXED32: 4}


def read_varints(cur: Cursor, rows: np.ndarray, what: str) -> np.ndarray:
    """Protobuf varints (no zig-zag) at the rows' positions, as uint64."""
    return cur.read_varint(rows, what)


def _lengths(cur: Cursor, rows: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """A length-delimited value: (start, length) of its bytes, the cursor moved past them."""
    lengths = read_varints(cur, rows, f"{what} length").astype(np.int64)
    start = cur.pos[rows].copy()
    beyond = (lengths < 0) | (lengths > cur.end[rows] - start)
    if beyond.any():
        cur.fail(rows[beyond], f"the message ends inside a {what}")
    lengths = np.where(cur.bad[rows], 0, lengths)
    cur.pos[rows] = np.where(cur.bad[rows], cur.end[rows], start + lengths)
    return start, lengths


def _fixed(cur: Cursor, rows: np.ndarray, width: int, what: str) -> np.ndarray:
    raw = cur.read_fixed_width(rows, width, what)
    return np.ascontiguousarray(raw).view("<u8" if width == 8 else "<u4").reshape(-1)


def _skip(cur: Cursor, rows: np.ndarray, wire: int) -> None:
    if wire == VARINT:
        read_varints(cur, rows, "skipped field")
    elif wire in _WIDTH:
        cur.read_fixed_width(rows, _WIDTH[wire], "skipped field")
    elif wire == LENGTH:
        _lengths(cur, rows, "skipped field")
    else:
        cur.fail(rows, f"wire type {wire} (groups and unknown wire types can't be read)")


class _Field:
    """What a message's rounds found of one field: per occurrence, the row and its value."""

    def __init__(self, field):
        self.field = field
        self.repeated = repeated(field)
        t = field.type
        F = field
        if t in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE):
            self.wire = LENGTH
        elif t in (F.TYPE_FIXED64, F.TYPE_SFIXED64, F.TYPE_DOUBLE):
            self.wire = FIXED64
        elif t in (F.TYPE_FIXED32, F.TYPE_SFIXED32, F.TYPE_FLOAT):
            self.wire = FIXED32
        else:
            self.wire = VARINT
        self.rows: list[np.ndarray] = []
        self.values: list[np.ndarray] = []      # raw uint64, or (start, length) pairs
        self.lengths: list[np.ndarray] = []

    def read(self, cur: Cursor, rows: np.ndarray, wire: int) -> None:
        name = self.field.name
        if wire == self.wire and self.wire != LENGTH:
            values = (read_varints(cur, rows, name) if wire == VARINT
                      else _fixed(cur, rows, _WIDTH[wire], name))
            self._add(rows, values.astype(np.uint64))
        elif wire == LENGTH and self.wire == LENGTH:
            start, lengths = _lengths(cur, rows, name)
            self.rows.append(rows)
            self.values.append(start)
            self.lengths.append(lengths)
        elif wire == LENGTH and self.repeated:          # packed numbers
            start, lengths = _lengths(cur, rows, name)
            packed = Cursor(cur.data, start, start + lengths)
            active = np.flatnonzero(lengths > 0)          # an empty packed field is valid
            while active.size:
                values = (read_varints(packed, active, name) if self.wire == VARINT
                          else _fixed(packed, active, _WIDTH[self.wire], name))
                self._add(rows[active], values.astype(np.uint64))
                active = active[packed.pos[active] < packed.end[active]]
            for bad_rows, reason in packed.reasons:
                cur.fail(rows[bad_rows], reason)
        else:
            _skip(cur, rows, wire)      # another wire type: unknown, as parsers treat it

    def _add(self, rows: np.ndarray, values: np.ndarray) -> None:
        self.rows.append(rows)
        self.values.append(values)

    def occurrences(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(rows, values, lengths) of every occurrence, in the order read."""
        if not self.rows:
            empty = np.zeros(0, dtype=np.int64)
            return empty, np.zeros(0, dtype=np.uint64), (empty if self.wire == LENGTH else None)
        rows = np.concatenate(self.rows)
        values = np.concatenate(self.values)
        lengths = np.concatenate(self.lengths) if self.lengths else None
        return rows, values, lengths


def decode_messages(data: np.ndarray, start: np.ndarray, end: np.ndarray, desc
                    ) -> tuple[pa.StructArray, np.ndarray, list]:
    """The messages ``data[start[i]:end[i]]`` of type ``desc``: (struct array, bad mask,
    [(rows, reason)])."""
    m = start.size
    cur = Cursor(data, start, end)
    fields = {f.number: _Field(f) for f in desc.fields}
    active = np.flatnonzero(cur.pos < cur.end)
    while active.size:
        tags = read_varints(cur, active, "tag")
        ok = ~cur.bad[active]
        active, tags = active[ok], tags[ok]
        numbers = (tags >> np.uint64(3)).astype(np.int64)
        wires = (tags & np.uint64(7)).astype(np.int64)
        zero = numbers == 0
        if zero.any():
            cur.fail(active[zero], "field number 0")
        keys = numbers * 8 + wires
        for key in np.unique(keys[~zero]):
            rows = active[keys == key]
            number, wire = int(key) // 8, int(key) % 8
            state = fields.get(number)
            if state is None:
                _skip(cur, rows, wire)
            else:
                state.read(cur, rows, wire)
        active = active[cur.pos[active] < cur.end[active]]
    arrays = [_column(cur, fields[f.number], m) for f in desc.fields]
    t = pa.struct([pa.field(f.name, a.type, nullable=True) for f, a in zip(desc.fields, arrays)])
    struct = pa.StructArray.from_arrays(arrays, fields=list(t))
    return struct, cur.bad, cur.reasons


def _scalars(field, raw: np.ndarray) -> pa.Array:
    """Raw varints or fixed-width values as the field's Arrow values."""
    F = field
    t = field.type
    if t in (F.TYPE_INT32, F.TYPE_UINT32, F.TYPE_FIXED32, F.TYPE_SFIXED32):
        return pa.array((raw & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32))
    if t in (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64):
        return pa.array(raw.view(np.int64))
    if t in (F.TYPE_SINT32, F.TYPE_SINT64):
        v = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
        return pa.array(v.astype(np.int32) if t == F.TYPE_SINT32 else v)
    if t == F.TYPE_FLOAT:
        return pa.array(raw.astype(np.uint32).view(np.float32))
    if t == F.TYPE_DOUBLE:
        return pa.array(raw.view(np.float64))
    if t == F.TYPE_BOOL:
        return bool_array(raw != 0)
    if t == F.TYPE_ENUM:
        enum = field.enum_type
        numbers = (raw & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
        names = {v.number: v.name for v in enum.values}
        uniq, inverse = np.unique(numbers, return_inverse=True)
        labels = pa.array([names.get(int(u), f"UNKNOWN_ENUM_VALUE_{enum.name}_{int(u)}")
                           for u in uniq], pa.string())
        return labels.take(pa.array(inverse.astype(np.int64)))
    raise AssertionError(field.type)


def _values(cur: Cursor, state: _Field, owners: np.ndarray, values: np.ndarray,
            lengths: np.ndarray | None) -> pa.Array:
    """The Arrow values of occurrences (owners: their rows), of the field's element type."""
    field = state.field
    F = field
    if field.type in (F.TYPE_STRING, F.TYPE_BYTES):
        start = values.astype(np.int64)
        offsets = np.zeros(start.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        gather = (np.repeat(start - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
                  if total else np.zeros(0, dtype=np.int64))
        data = cur.data[gather] if total else np.zeros(0, dtype=np.uint8)
        typ = pa.string() if field.type == F.TYPE_STRING else pa.binary()
        arr = _binary_array(offsets, data, typ)
        return _checked_strings(cur, owners, arr) if typ == pa.string() else arr
    if field.type == F.TYPE_MESSAGE:
        start = values.astype(np.int64)
        sub, bad, reasons = decode_messages(cur.data, start, start + lengths, field.message_type)
        for rows, reason in reasons:
            cur.fail(owners[rows], f"{field.name}: {reason}")
        return _well_known(field.message_type.full_name, sub)
    return _scalars(field, values)


def _well_known(name: str, sub: pa.StructArray) -> pa.Array:
    if name not in (TIMESTAMP, DURATION):
        return sub
    seconds = sub.field("seconds").fill_null(0).to_numpy(zero_copy_only=False)
    nanos = sub.field("nanos").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    micros = seconds.astype(np.int64) * 1_000_000 + nanos // 1000
    if name == TIMESTAMP:
        return pa.array(micros, pa.timestamp("us", tz="UTC"))
    return pa.array(micros, pa.duration("us"))


def _column(cur: Cursor, state: _Field, m: int) -> pa.Array:
    field = state.field
    arrow, _ = field_types(field)
    rows, values, lengths = state.occurrences()
    if state.repeated:
        order = np.argsort(rows, kind="stable")
        rows, values = rows[order], values[order]
        lengths = lengths[order] if lengths is not None else None
        counts = np.bincount(rows, minlength=m)
        offsets = np.zeros(m + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        items = _values(cur, state, rows, values, lengths)
        if is_map(field):
            keys, vals = items.field("key"), items.field("value")
            keys = keys.fill_null(_zero(keys.type))
            if vals.null_count and not pa.types.is_nested(vals.type):
                vals = vals.fill_null(_zero(vals.type))      # an entry without its value
            return pa.MapArray.from_arrays(pa.array(offsets), keys, vals).cast(arrow)
        return pa.ListArray.from_arrays(pa.array(offsets), items).cast(arrow)
    # singular: the last occurrence of each row wins
    last = np.full(m, -1, dtype=np.int64)
    last[rows] = np.arange(rows.size)          # rows in reading order: later rounds later
    present = last >= 0
    take = last[present]
    items = _values(cur, state, rows[take], values[take],
                    lengths[take] if lengths is not None else None)
    where = np.full(m, -1, dtype=np.int64)
    where[present] = np.arange(take.size)
    from ..avro.decode import indices

    return items.take(indices(where)).cast(arrow)


def _zero(t: pa.DataType):
    if pa.types.is_string(t):
        return ""
    if pa.types.is_binary(t):
        return b""
    if pa.types.is_boolean(t):
        return False
    return pa.array([0], pa.int64()).cast(t)[0]      # numbers, timestamps, durations


class ProtobufColumnDecoder:
    """Decodes columns of Protobuf messages in Confluent's wire format (magic byte, schema id,
    message indexes, message) into the reader message's struct."""

    def __init__(self, reader_schema: str, framed: bool = True):
        self.framed = framed
        self.desc = message_descriptor(reader_schema)
        self.index = message_index(self.desc)
        from .schema import message_types

        self.type = message_types(self.desc)[0]

    def decode(self, values: pa.Array):
        from ..avro import DecodedColumn, _combine

        n = len(values)
        offsets, data, nulls = column_bytes(values)
        if not self.framed:       # bare messages, as Spark's from_protobuf takes them
            rows = np.flatnonzero(~nulls)
            struct, bad_rows, sub_reasons = decode_messages(data, offsets[:-1][rows],
                                                            offsets[1:][rows], self.desc)
            bad = np.zeros(n, dtype=bool)
            bad[rows[bad_rows]] = True
            reasons = {int(rows[r]): f"a corrupt or truncated message: {reason}"
                       for rs, reason in sub_reasons for r in rs}
            parts = [(rows[~bad_rows], struct.filter(pa.array(~bad_rows)))]
            return DecodedColumn(_combine(parts, bad, n, self.type), bad, reasons)
        ids, unframed = schema_ids(offsets, data, nulls)
        bad = unframed.copy()
        reasons = {int(r): "not in the Schema Registry wire format (no magic byte 0 and "
                           "schema id: was it written without a registry serializer?)"
                   for r in np.flatnonzero(unframed)}
        rows = np.flatnonzero(~nulls & ~unframed)
        cur = Cursor(data, offsets[:-1][rows] + HEADER_SIZE, offsets[1:][rows])
        # The message indexes: a zig-zag count, then that many zig-zag indexes ([0] is 0 alone).
        every = np.arange(rows.size)
        count = cur.read_long(every, "message index count")
        impossible = (count < 0) | (count > 64)        # nesting that deep is no schema's
        if impossible.any():
            cur.fail(every[impossible], "an impossible message index count")
            count = np.where(impossible, 0, count)
        wrong = np.zeros(rows.size, dtype=bool)
        want = self.index
        for k in range(int(count.max()) if count.size else 0):
            has = every[count > k]
            got = cur.read_long(has, "message index")
            expected = want[k] if k < len(want) else -1
            wrong[has[got != expected]] = True
        # A lone 0 stands for [0], the file's first message; else the count must match.
        wrong |= np.where(count == 0, want != [0], count != len(want))
        wrong &= ~cur.bad
        for r in np.flatnonzero(wrong):
            reasons[int(rows[r])] = (f"written as another message of its schema (message "
                                     f"indexes differ from {self.desc.full_name}'s {self.index})")
        keep = every[~wrong & ~cur.bad]
        struct, sub_bad, sub_reasons = decode_messages(
            data, cur.pos[keep], cur.end[keep], self.desc)
        for bad_rows, reason in cur.reasons:
            for r in bad_rows:
                reasons.setdefault(int(rows[r]), f"a corrupt or truncated message: {reason}")
        for bad_rows, reason in sub_reasons:
            for r in bad_rows:
                reasons.setdefault(int(rows[keep[r]]), f"a corrupt or truncated message: "
                                                       f"{reason}")
        bad[rows[cur.bad | wrong]] = True
        bad[rows[keep[sub_bad]]] = True
        good = ~sub_bad
        parts = [(rows[keep[good]], struct.filter(pa.array(good)))]
        return DecodedColumn(_combine(parts, bad, n, self.type), bad, reasons, ids)
