"""The columnar Protobuf encoder: an Arrow column -> one serialized message per row, for the sink.

A Protobuf message is its fields' encodings one after the other, each a tag (the field's number
and wire type, a varint) then the value: a varint, 4 or 8 little-endian bytes, or a length and
that many bytes (strings, bytes, nested messages, packed repeated numbers). So, as the Avro
encoder does (:mod:`..avro.encode`), each field is encoded for the *whole column* at once into
per-row byte ranges and the fields are interleaved row by row; a repeated field's elements are
encoded once for the whole flattened column, and each row takes its elements' range. No Python
object is made per record.

The column's fields are matched to the message's by name. Errors, raised when the encoder is
built (the column against the schema) or for a row (the data), name the field:

* a column field the message lacks (it would be dropped); a column type that the field's type
  cannot hold without changing a value (a double into ``float``, a string into ``int64``);
* a value out of the field's range (a long into ``int32``, a negative into ``uint64``), a string
  that names no value of an enum, a null element in a repeated field or a null map value
  (Protobuf has no null there).

A null field is left out of the row's message, as an unset field: a nullable column derived by
:mod:`.derive` is ``optional``, so it reads back as null. A message field the column lacks is
left out too (its default). Repeated numbers are packed (proto3's default; readers accept both).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..encoded import (ColumnEncoder, EncodeError, Encoded, binary_bodies, const, expand, fixed_width, join,
                       uvarints, valid_mask, zigzag)
from .schema import TIMESTAMP, is_map, repeated

VARINT, I64, LEN, I32 = 0, 1, 2, 5

Values = Callable[[pa.Array], Encoded]    # non-null values -> their encodings (no tag)


def _varint(value: int) -> bytes:
    return bytes(uvarints(np.array([value], dtype=np.uint64)).data)


def _tag(number: int, wire: int) -> bytes:
    """A field's key: its number and wire type, as a varint."""
    return _varint((number << 3) | wire)


def _length_prefixed(body: Encoded) -> Encoded:
    return join([uvarints(body.lengths), body])


def _np(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def _first_row(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


class ProtobufEncoder(ColumnEncoder):
    """Encodes Arrow columns of one type as one message type; built once, used per batch.
    ``prefix`` is written before each body (the wire format's message indexes)."""

    def __init__(self, desc, arrow: pa.DataType, what: str = "value", prefix: bytes = b""):
        if not pa.types.is_struct(arrow):
            raise EncodeError(f"'{what}' is {arrow}, and a Protobuf value is a message: write "
                              "a struct column")
        self.desc = desc
        message = self._message(desc, arrow, what)
        if prefix:
            self._encode = lambda rows: [const(prefix, len(rows)), message(rows)]
        else:
            self._encode = lambda rows: [message(rows)]

    # --- compiling the message against the column's type ---------------------------------------

    def _message(self, desc, t: pa.StructType, path: str) -> Callable[[pa.Array], Encoded]:
        """Rows of a struct array (no null rows) -> each row's message body."""
        by_name = {f.name: f for f in desc.fields}
        parts = []
        for i in range(t.num_fields):
            name = t.field(i).name
            field = by_name.get(name)
            if field is None:
                raise EncodeError(f"the column's field '{path}.{name}' is not a field of "
                                  f"message {desc.full_name} (it would be lost)")
            parts.append((i, self._field(field, t.field(i).type, f"{path}.{name}")))

        def message(a: pa.Array) -> Encoded:
            n = len(a)
            if not parts:
                return const(b"", n)
            return join([encode(a.field(i)) for i, encode in parts])
        return message

    def _field(self, field, t: pa.DataType, path: str) -> Callable[[pa.Array], Encoded]:
        """A field's column (nulls: the field left out) -> its tag and value on each row."""
        if is_map(field):
            return self._repeated(field, t, path, map_field=True)
        if repeated(field):
            return self._repeated(field, t, path)
        values, wire = self._values(field, t, path)
        tag = _tag(field.number, wire)

        def single(a: pa.Array) -> Encoded:
            valid = valid_mask(a)
            present = a if valid.all() else a.filter(pa.array(valid))
            body = join([const(tag, len(present)), values(present)])
            return body if valid.all() else expand(body, valid)
        return single

    def _repeated(self, field, t: pa.DataType, path: str, map_field: bool = False):
        if map_field:
            if not pa.types.is_map(t):
                raise EncodeError(f"field '{path}' is a map in the schema but {t} in the column")
            entry = field.message_type
            entry_type = pa.struct([pa.field("key", t.key_type, False),
                                    pa.field("value", t.item_type, t.item_field.nullable)])
            inner = self._message(entry, entry_type, f"{path}{{}}")

            def elements(values: pa.Array) -> Encoded:
                if values.field(1).null_count:
                    raise EncodeError(f"a value of map '{path}' is null; Protobuf maps hold no "
                                      "nulls")
                return _length_prefixed(inner(values))
            packed, tag = False, _tag(field.number, LEN)
        else:
            if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
                raise EncodeError(f"field '{path}' is repeated in the schema but {t} in the "
                                  "column (write an array)")
            values, wire = self._values(field, t.value_type, f"{path}[]")
            packed = wire != LEN
            tag = _tag(field.number, LEN if packed else wire)

            def elements(items: pa.Array) -> Encoded:
                if items.null_count:
                    raise EncodeError(f"an element of '{path}' is null; a repeated field holds "
                                      "no nulls")
                return values(items)

        def rows(a: pa.Array) -> Encoded:
            n = len(a)
            if a.null_count:
                a = _nulls_emptied(a)
            offsets = np.asarray(_np(a.offsets), dtype=np.int64)
            start, stop = int(offsets[0]), int(offsets[-1])
            items = a.values.slice(start, stop - start)
            each = elements(items) if stop > start else Encoded(np.zeros(1, np.int64),
                                                                 np.zeros(0, np.uint8))
            if not packed:
                # each element: the tag, then the element (its length first for LEN)
                each = join([const(tag, stop - start), each])
            per_row = Encoded(each.offsets[offsets - start], each.data)
            if not packed:
                return per_row
            has = np.diff(offsets) > 0
            body = _length_prefixed(per_row)
            with_tag = join([const(tag, n), body])
            if has.all():
                return with_tag
            return _select(with_tag, has)
        return rows

    def _values(self, field, t: pa.DataType, path: str) -> tuple[Values, int]:
        """(non-null values -> their encodings, the wire type) of one value of ``field``."""
        F = field
        kind = field.type
        if kind == F.TYPE_MESSAGE:
            m = field.message_type
            if m.full_name == TIMESTAMP:
                if not pa.types.is_timestamp(t):
                    raise EncodeError(f"field '{path}' is a {TIMESTAMP} but {t} in the column")
                return (lambda a: _length_prefixed(_timestamp(a)), LEN)
            if not pa.types.is_struct(t):
                raise EncodeError(f"field '{path}' is message {m.full_name} but {t} in the "
                                  "column (write a struct)")
            inner = self._message(m, t, path)
            return (lambda a: _length_prefixed(inner(a)), LEN)
        if kind == F.TYPE_ENUM:
            return self._enum(field, t, path), VARINT
        if kind in (F.TYPE_STRING, F.TYPE_BYTES):
            ok = (pa.types.is_string(t) or pa.types.is_large_string(t)
                  or (kind == F.TYPE_BYTES and (pa.types.is_binary(t)
                                                or pa.types.is_large_binary(t)))
                  or (kind == F.TYPE_STRING and pa.types.is_decimal(t)))
            if not ok:
                name = "string" if kind == F.TYPE_STRING else "bytes"
                raise EncodeError(f"field '{path}' is {name} but {t} in the column")
            if pa.types.is_decimal(t):
                return (lambda a: _length_prefixed(binary_bodies(pc.cast(a, pa.string()))), LEN)
            return (lambda a: _length_prefixed(binary_bodies(a)), LEN)
        if kind == F.TYPE_BOOL:
            if not pa.types.is_boolean(t):
                raise EncodeError(f"field '{path}' is bool but {t} in the column")
            return (lambda a: fixed_width(_np(a).astype(np.uint8)), VARINT)
        if kind in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            double = kind == F.TYPE_DOUBLE
            fits = pa.types.is_float32(t) or (double and (pa.types.is_float64(t) or (
                pa.types.is_integer(t) and t.bit_width <= 32)))
            if not fits:
                raise EncodeError(f"field '{path}' is {'double' if double else 'float'} but {t} "
                                  "in the column: a value could change")
            dtype = "<f8" if double else "<f4"
            return (lambda a: fixed_width(_np(a).astype(dtype)), I64 if double else I32)
        return self._integer(field, t, path)

    def _integer(self, field, t: pa.DataType, path: str) -> tuple[Values, int]:
        F = field
        kind = field.type
        if not (pa.types.is_integer(t) or pa.types.is_date32(t)):
            raise EncodeError(f"field '{path}' is an integer but {t} in the column")
        bits = 32 if kind in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_UINT32, F.TYPE_FIXED32,
                              F.TYPE_SFIXED32) else 64
        unsigned = kind in (F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_FIXED32, F.TYPE_FIXED64)
        low = 0 if unsigned else -(1 << (bits - 1))
        high = (1 << bits) - 1 if unsigned else (1 << (bits - 1)) - 1
        type_name = {v: k for k, v in vars(type(field)).items()
                     if k.startswith("TYPE_")}.get(kind, "integer")[5:].lower()

        def checked(a: pa.Array) -> np.ndarray:
            v = (_np(a.cast(pa.int32())) if pa.types.is_date32(t) else _np(a)).astype(np.int64)
            if len(v) and (v.min() < low or v.max() > high):
                bad = (v < low) | (v > high)
                row = _first_row(bad)
                raise EncodeError(f"field '{path}' is {v[row]} in row {row}, out of the range of "
                                  f"{type_name} ({low}..{high})")
            return v

        if kind in (F.TYPE_SINT32, F.TYPE_SINT64):
            def zigzagged(a: pa.Array) -> Encoded:
                return uvarints(zigzag(checked(a)))
            return zigzagged, VARINT
        if kind in (F.TYPE_FIXED32, F.TYPE_SFIXED32):
            dtype = "<u4" if unsigned else "<i4"
            return (lambda a: fixed_width(checked(a).astype(dtype))), I32
        if kind in (F.TYPE_FIXED64, F.TYPE_SFIXED64):
            dtype = "<u8" if unsigned else "<i8"
            return (lambda a: fixed_width(checked(a).astype(dtype))), I64
        # int32, int64, uint32, uint64: two's complement as 64 bits (a negative int32 takes ten
        # bytes, as the Protobuf encoding says)
        return (lambda a: uvarints(checked(a).astype(np.int64).view(np.uint64))), VARINT

    def _enum(self, field, t: pa.DataType, path: str) -> Values:
        enum = field.enum_type
        numbers = {v.name: v.number for v in enum.values}
        if pa.types.is_integer(t):
            known = np.array(sorted(v.number for v in enum.values), dtype=np.int64)
            closed = getattr(enum, "is_closed", False)

            def by_number(a: pa.Array) -> Encoded:
                v = _np(a).astype(np.int64)
                if closed and len(v) and not np.isin(v, known).all():
                    row = _first_row(~np.isin(v, known))
                    raise EncodeError(f"field '{path}' is {v[row]} in row {row}, no value of "
                                      f"enum {enum.full_name}")
                return uvarints(v.view(np.uint64))
            return by_number
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise EncodeError(f"field '{path}' is enum {enum.full_name} but {t} in the column "
                              "(write its names as strings, or its numbers)")
        names = pa.array(list(numbers), pa.string())
        values = np.array(list(numbers.values()), dtype=np.int64)

        def by_name(a: pa.Array) -> Encoded:
            index = _np(pc.index_in(a.cast(pa.string()), value_set=names).fill_null(-1))
            if len(index) and (index < 0).any():
                row = _first_row(index < 0)
                raise EncodeError(f"field '{path}' is {a[row].as_py()!r} in row {row}, no value "
                                  f"of enum {enum.full_name} ({', '.join(numbers)})")
            return uvarints(values[index].view(np.uint64))
        return by_name


def index_bytes(desc) -> bytes:
    """The message indexes that Confluent's wire format puts between the schema id and a
    Protobuf body: the count, then each index, as zig-zag varints; ``[0]`` (the file's first
    message, the usual case) as the single byte 0."""
    from .schema import message_index

    path = message_index(desc)
    if path == [0]:
        return b"\x00"
    return b"".join(_varint(v << 1) for v in [len(path)] + path)


def _timestamp(a: pa.Array) -> Encoded:
    """``google.protobuf.Timestamp`` bodies: seconds (1, int64), nanos (2, int32, 0..999999999),
    each left out when 0."""
    micros = _np(a.cast(pa.timestamp("us", tz=a.type.tz)).cast(pa.int64())).astype(np.int64)
    seconds = np.floor_divide(micros, 1_000_000)
    nanos = (micros - seconds * 1_000_000) * 1000
    n = len(micros)
    s_part = join([const(_tag(1, VARINT), n), uvarints(seconds.view(np.uint64))])
    n_part = join([const(_tag(2, VARINT), n), uvarints(nanos.view(np.uint64))])
    return join([_select(s_part, seconds != 0), _select(n_part, nanos != 0)])


def _select(enc: Encoded, keep: np.ndarray) -> Encoded:
    """``enc`` with the rows where ``keep`` is False made empty."""
    if keep.all():
        return enc
    lens = enc.lengths[keep]
    starts = enc.offsets[:-1][keep]
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lens)
    total = int(offsets[-1])
    index = np.repeat(starts - offsets[:-1], lens) + np.arange(total)
    return expand(Encoded(offsets, enc.data[index]), keep)


def _nulls_emptied(a: pa.Array) -> pa.Array:
    """A list or map array whose null rows span no values (Arrow lets a null row keep a
    range; Spark writes none, but this encoder must not take its values as elements)."""
    starts = np.asarray(_np(a.offsets), dtype=np.int64)
    valid = valid_mask(a)
    lens = np.diff(starts)
    if (lens[~valid] == 0).all():
        return a
    lens = np.where(valid, lens, 0)
    offsets = np.zeros(len(a) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lens)
    take = np.repeat(starts[:-1] - offsets[:-1], lens) + np.arange(int(offsets[-1]))
    values = a.values.take(pa.array(take))
    offsets = pa.array(offsets.astype(np.int32))
    mask = pa.array(~valid)
    if pa.types.is_map(a.type):
        return pa.MapArray.from_arrays(offsets, values.field(0), values.field(1), mask=mask)
    return pa.ListArray.from_arrays(offsets, values, mask=mask)
