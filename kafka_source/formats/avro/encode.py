"""The columnar Avro encoder: an Arrow column -> one Avro binary body per row, for the sink.

Avro's binary encoding is a concatenation: a record is its fields' encodings one after the
other, an array is blocks of (count, items), a union is the branch's index then the value. So
each part of a schema is encoded for the *whole column* at once -- every row's ``amount`` as
8-byte doubles, every row's ``order_id`` as a length varint and its UTF-8 bytes, ... -- into an
:class:`Encoded`: per-row byte ranges over one buffer, in row order. No Python object is made
per record, and the cost per record is a few numpy passes per field.

The parts are not interleaved as they are made: a record's encoding is the *list* of its
fields' parts (a string is two: its lengths and its bytes; a union its tags and its branch's
parts), nested records' lists spliced in, and the whole row is put together once, at the end
(:func:`join`), each byte copied straight to its final place. Interleaving at every level
instead (a string, then the record holding it, then the framing) copied every byte once per
level, and those copies were most of the encoder's time. Only arrays and maps join their
items' parts early, since an item's bytes are then grouped by row.

The encoder follows the *writer schema* (derived from the column's Spark type, given inline or
registered): the Arrow column's fields are matched to the schema's by name. What cannot be
written as the schema says is an :class:`EncodeError` naming the field, and for data (a null in
a field whose type has no null branch, a string that is no symbol of an enum) the row too:

* a schema field the column lacks is written with the field's default, or is an error;
* a column field the schema lacks is an error (it would be dropped silently otherwise);
* numbers are written as the schema's type when no value can change: int8-int32 as ``int``,
  any integer as ``long``, float32 as ``float``, float32/float64 and integers as ``double``;
* ``[null, T]`` unions take nullable columns; a union of several non-null branches takes a
  column whose type is one branch's.
"""

from __future__ import annotations

import json
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .schema import Node, arrow_type, non_null_branches
from ..encoded import (ColumnEncoder, EncodeError, Encoded, binary_bodies, const, expand, fixed_width, join,
                       uvarints, valid_mask, zigzag)


def varints(values: np.ndarray) -> Encoded:
    """Avro ``int``/``long``: zig-zag, then 7 bits a byte, low first."""
    return uvarints(zigzag(values))


def length_prefixed(array: pa.Array) -> list[Encoded]:
    """Avro ``bytes``/``string``: the length, then the bytes (two parts, see :func:`join`)."""
    body = binary_bodies(array)
    return [varints(body.lengths), body]


def _ints(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


# An encoder gives the parts of each row's encoding, in order (all with the array's rows), for
# join to put together once.
Encoder = Callable[[pa.Array], list[Encoded]]


class AvroEncoder(ColumnEncoder):
    """Encodes Arrow columns of one type with one writer schema; built once, used per batch."""

    def __init__(self, node: Node, arrow: pa.DataType, what: str = "value"):
        self.node = node
        self.what = what
        self._encode = self._compile(node, arrow, what)

    # --- compiling the schema against the column's type ---------------------------------------

    def _compile(self, node: Node, t: pa.DataType, path: str) -> Encoder:
        if node.kind == "union":
            return self._union(node, t, path)
        inner = self._plain(node, t, path)

        def no_nulls(array: pa.Array) -> Encoded:
            if array.null_count:
                row = int(np.flatnonzero(~valid_mask(array))[0])
                raise EncodeError(f"{path} is null (in the {row + 1}th row given to it), but its "
                                  f"Avro type {node.describe()} has no null branch: make the "
                                  "field's type a union with null, or fill the nulls.")
            return inner(array)
        return no_nulls

    def _union(self, node: Node, t: pa.DataType, path: str) -> Encoder:
        null_index = next((i for i, b in enumerate(node.branches) if b.kind == "null"), None)
        others = [(i, b) for i, b in enumerate(node.branches) if b.kind != "null"]
        if pa.types.is_null(t):
            if null_index is None:
                raise EncodeError(f"{path}: a column of nulls for Avro {node.describe()}, "
                                  "which has no null branch")
            tag = varints(np.array([null_index])).data.tobytes()
            return lambda array: [const(tag, len(array))]
        chosen = None
        if len(others) == 1:
            chosen = others[0]
        else:
            for i, b in others:
                try:
                    self._plain(b, t, path)
                except EncodeError:
                    continue
                chosen = (i, b)
                break
        if chosen is None:
            raise EncodeError(f"{path}: a column of type {t} fits no branch of the Avro union "
                              f"{node.describe()}")
        index, branch = chosen
        body = self._plain(branch, t, f"{path}")
        tag_value = varints(np.array([index])).data.tobytes()

        def union(array: pa.Array) -> Encoded:
            valid = valid_mask(array)
            if valid.all():
                return [const(tag_value, len(array)), *body(array)]
            if null_index is None:
                raise EncodeError(f"{path} is null, but its Avro type {node.describe()} has "
                                  "no null branch")
            tags = varints(np.where(valid, index, null_index))
            if not valid.any():
                return [tags]
            return [tags, *(expand(p, valid) for p in body(array.filter(pa.array(valid))))]
        return union

    def _plain(self, node: Node, t: pa.DataType, path: str) -> Encoder:
        k, logical = node.kind, node.logical
        wrong = EncodeError(f"{path}: a column of type {t} can't be written as Avro "
                            f"{node.describe()}")
        if k == "null":
            if not pa.types.is_null(t):
                raise wrong
            return lambda array: [const(b"", len(array))]
        if k == "boolean":
            if not pa.types.is_boolean(t):
                raise wrong
            return lambda array: [fixed_width(
                array.to_numpy(zero_copy_only=False).astype(np.uint8))]
        if k in ("int", "long"):
            return self._integer(node, t, path, wrong)
        if k == "float":
            if not (pa.types.is_float32(t) or pa.types.is_float16(t)):
                raise wrong
            return lambda array: [fixed_width(_ints(array).astype("<f4"))]
        if k == "double":
            if not (pa.types.is_floating(t) or pa.types.is_integer(t)):
                raise wrong
            return lambda array: [fixed_width(_ints(array).astype("<f8"))]
        if k == "string" or (k == "enum"):
            if not (pa.types.is_string(t) or pa.types.is_large_string(t)
                    or pa.types.is_string_view(t)):
                raise wrong
            if k == "enum":
                return self._enum(node, path)
            return length_prefixed
        if k in ("bytes", "fixed") and logical == "decimal":
            return self._decimal(node, t, path, wrong)
        if k == "bytes":
            if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)
                    or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t)):
                raise wrong
            return length_prefixed
        if k == "fixed":
            return self._fixed(node, t, path, wrong)
        if k == "record":
            return self._record(node, t, path, wrong)
        if k == "array":
            if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
                raise wrong
            items = self._compile(node.items, t.value_type, f"{path}[]")
            return self._blocks(lambda values: items(values))
        if k == "map":
            if not pa.types.is_map(t):
                raise wrong
            if not (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)):
                raise EncodeError(f"{path}: an Avro map has string keys; the column's map has "
                                  f"{t.key_type} keys")
            values = self._compile(node.values, t.item_type, f"{path}{{}}")

            def entries(structs: pa.Array) -> list[Encoded]:
                return [*length_prefixed(structs.field(0)), *values(structs.field(1))]
            return self._blocks(entries)
        raise wrong

    def _integer(self, node: Node, t: pa.DataType, path: str, wrong: EncodeError) -> Encoder:
        logical = node.logical
        if logical == "date":
            if not pa.types.is_date32(t):
                raise wrong
            return lambda array: [varints(array.cast(pa.int32()).to_numpy(
                zero_copy_only=False))]
        if logical and "timestamp" in logical:
            if not pa.types.is_timestamp(t):
                raise wrong
            if (logical.startswith("local-")) != (t.tz is None):
                raise EncodeError(f"{path}: a timestamp {'with' if t.tz else 'without'} time "
                                  f"zone can't be written as Avro {logical} (timestamp-* is an "
                                  "instant: Spark's timestamp; local-timestamp-* has no zone: "
                                  "Spark's timestamp_ntz)")
            unit = logical.rsplit("-", 1)[-1]
            target = {"millis": "ms", "micros": "us", "nanos": "ns"}[unit]
            bare = pa.timestamp(t.unit)

            def stamps(array: pa.Array) -> list[Encoded]:
                a = array.cast(bare)
                if t.unit != target:
                    if target == "ms" and t.unit in ("us", "ns"):
                        # floor, as Avro writers do: a time before 1970 stays before it
                        per = 1000 if t.unit == "us" else 1_000_000
                        raw = a.cast(pa.int64()).to_numpy(zero_copy_only=False)
                        return [varints(np.floor_divide(raw, per))]
                    a = a.cast(pa.timestamp(target))
                return [varints(a.cast(pa.int64()).to_numpy(zero_copy_only=False))]
            return stamps
        if not pa.types.is_integer(t):
            raise wrong
        if node.kind == "int":
            if t.bit_width > 32 or (pa.types.is_unsigned_integer(t) and t.bit_width == 32):
                raise EncodeError(f"{path}: a column of type {t} can't be written as Avro int "
                                  "(32 bits) without losing values: cast it to int, or make "
                                  "the field a long")
        elif pa.types.is_uint64(t):
            raise EncodeError(f"{path}: uint64 can't be written as Avro long (signed 64 bits)")
        return lambda array: [varints(_ints(array))]

    def _enum(self, node: Node, path: str) -> Encoder:
        symbols = pa.array(node.symbols, type=pa.string())

        def enum(array: pa.Array) -> list[Encoded]:
            index = pc.index_in(array.cast(pa.string()), value_set=symbols)
            if index.null_count:
                row = int(np.flatnonzero(~valid_mask(index))[0])
                raise EncodeError(f"{path}: {array[row].as_py()!r} is not a symbol of Avro "
                                  f"enum {node.name} ({', '.join(node.symbols)})")
            return [varints(_ints(index))]
        return enum

    def _decimal(self, node: Node, t: pa.DataType, path: str, wrong: EncodeError) -> Encoder:
        if not pa.types.is_decimal(t):
            raise wrong
        if t.scale != node.scale or t.precision > node.precision:
            raise EncodeError(f"{path}: decimal({t.precision},{t.scale}) can't be written as "
                              f"Avro decimal({node.precision},{node.scale}) without changing "
                              "values: cast the column to the schema's decimal type")
        fixed = node.size if node.kind == "fixed" else 0

        def decimal(array: pa.Array) -> list[Encoded]:
            a = array.cast(pa.decimal128(38, t.scale)) if t.bit_width != 128 else array
            raw = np.frombuffer(a.buffers()[1], dtype=np.uint8,
                                count=16 * (len(a) + a.offset))[16 * a.offset:]
            be = raw.reshape(-1, 16)[:, ::-1]                      # big-endian rows
            if fixed:
                return [fixed_width(np.ascontiguousarray(be[:, 16 - fixed:]))]
            fill = np.where(be[:, 0] & 0x80, 0xFF, 0x00).astype(np.uint8)
            lead = np.cumprod(be == fill[:, None], axis=1).sum(axis=1)
            keep = 16 - lead
            first = be[np.arange(len(be)), np.minimum(lead, 15)]
            keep = np.where((keep == 0) | ((first & 0x80) != (fill & 0x80)), keep + 1, keep)
            keep = np.minimum(keep, 16)
            mask = np.arange(16)[None, :] >= (16 - keep)[:, None]
            body = Encoded(np.concatenate([[0], np.cumsum(keep)]).astype(np.int64), be[mask])
            return [varints(keep), body]
        return decimal

    def _fixed(self, node: Node, t: pa.DataType, path: str, wrong: EncodeError) -> Encoder:
        size = node.size
        if pa.types.is_fixed_size_binary(t):
            if t.byte_width != size:
                raise wrong
        elif not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            raise wrong

        def fixed(array: pa.Array) -> list[Encoded]:
            body = binary_bodies(array)
            bad = np.flatnonzero(body.lengths != size)
            if bad.size:
                raise EncodeError(f"{path}: a value of {int(body.lengths[bad[0]])} bytes for "
                                  f"Avro fixed {node.name} of {size} bytes")
            return [body]
        return fixed

    def _record(self, node: Node, t: pa.DataType, path: str, wrong: EncodeError) -> Encoder:
        if not pa.types.is_struct(t):
            raise wrong
        names = [t.field(i).name for i in range(t.num_fields)]
        known = {f.name for f in node.fields}
        extra = [n for n in names if n not in known]
        if extra:
            raise EncodeError(f"{path}: the column has field(s) {', '.join(extra)} that Avro "
                              f"record {node.name} does not (they would not be written): drop "
                              "them, or write with a schema that has them")
        steps: list[tuple[int | None, Encoder | bytes]] = []
        for f in node.fields:
            sub = f"{path}.{f.name}"
            if f.name in names:
                i = names.index(f.name)
                steps.append((i, self._compile(f.type, t.field(i).type, sub)))
            elif f.has_default:
                steps.append((None, default_bytes(f.type, f.default, sub)))
            else:
                raise EncodeError(f"{sub}: Avro record {node.name} has field {f.name!r} with no "
                                  "default, and the column has no such field")

        def record(array: pa.Array) -> list[Encoded]:
            n = len(array)
            parts = []
            for i, step in steps:
                if i is None:
                    parts.append(const(step, n))
                else:
                    parts.extend(step(array.field(i)))
            return parts or [const(b"", n)]
        return record

    @staticmethod
    def _blocks(items: Encoder) -> Encoder:
        """Arrays and maps: one block of all the row's items, then the 0 that ends them."""
        def blocks(array: pa.Array) -> list[Encoded]:
            offsets = np.asarray(array.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
            counts = np.diff(offsets)
            values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
            enc = join(items(values))          # the items' bytes, then grouped by row
            inner = Encoded(enc.offsets[offsets - offsets[0]], enc.data)
            count = expand(varints(counts[counts > 0]), counts > 0)
            return [count, inner, const(b"\x00", len(array))]
        return blocks


def default_bytes(node: Node, value, path: str) -> bytes:
    """The encoding of a field's default (JSON, as the schema gives it), for a field the column
    does not have. Per Avro, a union's default is of its first branch."""
    target = node.branches[0] if node.kind == "union" else node
    if target.kind == "null":
        body = b""
    else:
        if target.kind in ("bytes", "fixed") and isinstance(value, str):
            value = value.encode("latin-1")       # Avro's JSON form of bytes
        try:
            t = arrow_type(target)
            array = pa.array([value], type=t)
            enc = join(AvroEncoder(target, t, path)._encode(array))
        except (pa.ArrowException, EncodeError, ValueError, TypeError) as e:
            raise EncodeError(f"{path}: the default {json.dumps(value)[:100]} can't be written "
                              f"as Avro {target.describe()}: {e}") from None
        body = enc.data[int(enc.offsets[0]):int(enc.offsets[-1])].tobytes()
    if node.kind == "union":
        return varints(np.array([0])).data.tobytes() + body
    return body


def non_null(node: Node) -> Node:
    """``T`` of a ``[null, T]`` union, else the node."""
    if node.kind == "union":
        others = non_null_branches(node)
        if len(others) == 1:
            return others[0]
    return node
