"""Columnar Avro decoding: a whole column of Avro bodies into one Arrow array, numpy over bytes.

Avro's binary encoding has no lengths or offsets to jump by: a record is its fields one after the
other, each a zigzag varint, a length-prefixed string, a union's branch index and the branch, an
array's blocks of items. So a record can only be read front to back -- but every record of a
batch can be read *at the same time*: a cursor holds one read position per record, and each step
of the schema (read this long, this string) is one numpy operation over all the records that take
that step. A union splits the records by branch and reads each branch over its own records; an
array reads its items in rounds, the first item of every record that has one, then the second,
and puts them back in record order at the end. Python runs once per schema step and round, not
once per record or value.

Schema resolution (the Avro specification's rules) is compiled into the steps, once per pair of
writer and reader schema: fields the reader lacks are read and dropped, fields the writer lacks
take the reader's default, ``int`` is promoted to ``long``/``float``/``double`` (and so on),
enum symbols are mapped by name, union branches matched by type and name. Whatever the writer
schema, the output has the reader schema's Arrow type (:func:`.schema.arrow_type`).

Every read is bounds-checked against its record's end. A record that breaks off, holds an
impossible length, count or branch index, or a symbol or branch the reader cannot take, is
marked bad with the reason, and its reads go on harmlessly (lengths zero, position at the end),
so one bad record never stops or corrupts the others: the caller fails or nulls it
(``mode``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from .schema import Field, Node, arrow_type, non_null_branches, union_shape
from ..framing import column_bytes
from ...wire.format.arrays import from_numpy, strings, to_numpy

# A corrupt count must not make a round loop run on: arrays whose items may take no bytes
# (null, empty records) hold at most this many items per block.
MAX_ZERO_SIZE_ITEMS = 10_000_000


class ResolutionError(ValueError):
    """A writer schema whose data cannot be read with the reader schema."""


class Cursor:
    """Read positions into a column of Avro bodies: one per row, with each row's end, and the
    rows found bad with the first reason for each."""

    def __init__(self, data: np.ndarray, pos: np.ndarray, end: np.ndarray):
        self.data = data            # uint8, framing.PAD zero bytes past the last body
        self.pos = pos.astype(np.int64, copy=True)
        self.end = end.astype(np.int64, copy=False)
        self.bad = np.zeros(len(pos), dtype=bool)
        self.reasons: list[tuple[np.ndarray, str]] = []

    def fail(self, rows: np.ndarray, reason: str) -> None:
        rows = rows[~self.bad[rows]]
        if rows.size:
            self.bad[rows] = True
            self.reasons.append((rows, reason))
            self.pos[rows] = self.end[rows]

    # --- primitives -------------------------------------------------------------------------

    def read_long(self, rows: np.ndarray, what: str = "long") -> np.ndarray:
        """Zigzag varints at the rows' positions, as int64."""
        value = self.read_varint(rows, what)
        return (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)

    def read_varint(self, rows: np.ndarray, what: str = "long") -> np.ndarray:
        """Varints at the rows' positions, as uint64 (Protobuf's, and Avro's before zig-zag)."""
        n = rows.size
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        limit = self.data.size - 1
        p = self.pos[rows]
        value = np.zeros(n, dtype=np.uint64)
        active = np.arange(n)
        at = p.copy()
        for k in range(10):
            b = self.data[np.minimum(at[active], limit)].astype(np.uint64)
            value[active] |= (b & np.uint64(0x7F)) << np.uint64(7 * k)
            at[active] += 1
            active = active[b >= 0x80]
            if not active.size:
                break
        if active.size:
            self.fail(rows[active], f"a {what} varint longer than 10 bytes")
        over = at > self.end[rows]
        if over.any():
            self.fail(rows[over], f"the record ends inside a {what}")
        # A bad row stays at its end, whatever its reads would have taken.
        self.pos[rows] = np.where(self.bad[rows], self.end[rows], at)
        return value

    def read_fixed_width(self, rows: np.ndarray, width: int, what: str) -> np.ndarray:
        """``width`` bytes per row, as an (n, width) uint8 array."""
        p = self.pos[rows]
        over = p + width > self.end[rows]
        if over.any():
            self.fail(rows[over], f"the record ends inside a {what}")
            p = self.pos[rows]
        out = self.data[np.minimum(p[:, None] + np.arange(width), self.data.size - 1)]
        self.pos[rows] = np.where(self.bad[rows], self.pos[rows], p + width)
        return out

    def read_bytes(self, rows: np.ndarray, what: str, size: int | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Length-prefixed (or ``size``-byte) values: Arrow offsets (int64) and the bytes."""
        if size is None:
            lengths = self.read_long(rows, f"{what} length")
        else:
            lengths = np.full(rows.size, size, dtype=np.int64)
        p = self.pos[rows]
        negative = lengths < 0
        if negative.any():
            self.fail(rows[negative], f"a {what} of negative length")
        beyond = lengths > self.end[rows] - p
        if beyond.any():
            self.fail(rows[beyond], f"the record ends inside a {what}")
        if negative.any() or beyond.any():
            lengths = np.where(self.bad[rows], 0, lengths)
            p = self.pos[rows]
        offsets = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total:
            gather = np.repeat(p - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
            values = self.data[gather]
        else:
            values = np.zeros(0, dtype=np.uint8)
        self.pos[rows] = np.where(self.bad[rows], self.end[rows], p + lengths)
        return offsets, values


# ------------------------------------------------------------------------------------------------
# Steps
# ------------------------------------------------------------------------------------------------

Step = Callable[[Cursor, np.ndarray], pa.Array]

# Arrays are built from numpy buffers, never with pa.array: that asks pyarrow's pandas shim about
# its argument, which imports pandas (0.17-0.35 s in every new worker: wire/format/arrays.py).


def bool_array(values: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), len(values),
                                 [None, pa.py_buffer(np.packbits(values, bitorder="little"))])


def indices(where: np.ndarray) -> pa.Array:
    """``where`` as int64 take-indices, null where it is negative."""
    where = np.asarray(where, dtype=np.int64)
    valid = where >= 0
    if valid.all():
        return from_numpy(where)
    return pa.Array.from_buffers(pa.int64(), len(where),
                                 [pa.py_buffer(np.packbits(valid, bitorder="little")),
                                  pa.py_buffer(np.where(valid, where, 0))])


def optional_strings(items: list) -> pa.Array:
    """A string array of ``items``, None as null."""
    valid = np.array([i is not None for i in items], dtype=bool)
    arr = strings([i if i is not None else "" for i in items])
    if valid.all():
        return arr
    return pa.Array.from_buffers(pa.string(), len(items),
                                 [pa.py_buffer(np.packbits(valid, bitorder="little")),
                                  *arr.buffers()[1:]])


def _binary_array(offsets: np.ndarray, values: np.ndarray, typ: pa.DataType) -> pa.Array:
    n = offsets.size - 1
    if offsets[-1] < (1 << 31) - 1:
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                              pa.py_buffer(values)])
    large = pa.large_string() if typ == pa.string() else pa.large_binary()
    return pa.Array.from_buffers(large, n, [None, pa.py_buffer(offsets),
                                            pa.py_buffer(values)]).cast(typ)


def _checked_strings(cur: Cursor, rows: np.ndarray, arr: pa.Array) -> pa.Array:
    """``arr`` of strings, the rows whose bytes are not UTF-8 marked bad (and emptied)."""
    try:
        arr.validate(full=True)
        return arr
    except pa.ArrowInvalid:
        pass
    as_bytes = pa.Array.from_buffers(pa.binary(), len(arr), arr.buffers())
    wrong = []
    for i, v in enumerate(as_bytes.to_pylist()):
        try:
            v.decode("utf-8")
        except UnicodeDecodeError:
            wrong.append(i)
    wrong = np.asarray(wrong, dtype=np.int64)
    cur.fail(rows[wrong], "a string that is not UTF-8")
    values = as_bytes.to_pylist()
    for i in wrong:
        values[i] = b""
    return strings([v.decode("utf-8") for v in values])


def _primitive_reader(kind: str) -> Step:
    if kind == "null":
        return lambda cur, rows: pa.nulls(rows.size)
    if kind == "boolean":
        def read_bool(cur, rows):
            return bool_array(cur.read_fixed_width(rows, 1, "boolean")[:, 0] != 0)
        return read_bool
    if kind in ("int", "long"):
        def read_int(cur, rows):
            v = cur.read_long(rows, kind)
            if kind == "int":
                wrong = (v < -(1 << 31)) | (v >= (1 << 31))
                if wrong.any():
                    cur.fail(rows[wrong], "an int out of range")
                    v = np.where(wrong, 0, v)
            return from_numpy(v)
        return read_int
    if kind in ("float", "double"):
        width, dtype = (4, "<f4") if kind == "float" else (8, "<f8")

        def read_float(cur, rows):
            raw = np.ascontiguousarray(cur.read_fixed_width(rows, width, kind))
            return from_numpy(raw.view(dtype).reshape(-1))
        return read_float
    if kind in ("bytes", "string"):
        def read_bytes(cur, rows):
            offsets, values = cur.read_bytes(rows, kind)
            return _binary_array(offsets, values, pa.binary())
        return read_bytes
    raise ResolutionError(f"not a primitive: {kind}")


def _convert(arr: pa.Array, writer: Node, reader: Node, cur: Cursor, rows: np.ndarray
             ) -> pa.Array:
    """A decoded primitive or fixed column (int64 for int/long, float32/64, binary) as the
    reader's Arrow type: promotions and logical types."""
    target = arrow_type(reader)
    logical = reader.logical
    if logical == "decimal":
        return _decimals(arr, reader)
    if logical == "date":
        return arr.cast(pa.int32()).view(pa.date32())
    if logical in ("timestamp-millis", "local-timestamp-millis"):
        return from_numpy(to_numpy(arr).astype(np.int64) * 1000).view(target)
    if logical in ("timestamp-micros", "local-timestamp-micros"):
        return arr.cast(pa.int64()).view(target)
    if logical in ("timestamp-nanos", "local-timestamp-nanos"):
        return from_numpy(np.floor_divide(to_numpy(arr).astype(np.int64), 1000)).view(target)
    if target == pa.string():
        if arr.type == pa.binary():
            arr = pa.Array.from_buffers(pa.string(), len(arr), arr.buffers())
            return _checked_strings(cur, rows, arr)
        return arr.cast(pa.string())
    if target == pa.int32():
        return arr.cast(pa.int32())
    return arr.cast(target, safe=False) if arr.type != target else arr


def _decimals(arr: pa.Array, reader: Node) -> pa.Array:
    """Two's-complement big-endian unscaled values (bytes or fixed) as decimal128: the same
    unscaled integer, 16 bytes little-endian."""
    return decimal_array([None if raw is None else int.from_bytes(raw, "big", signed=True)
                          for raw in arr.to_pylist()], reader.precision, reader.scale)


def decimal_array(unscaled: list, precision: int, scale: int) -> pa.Array:
    """decimal128(precision, scale) from unscaled integers (None: null). A value beyond the
    precision is stored as it is: Spark's own check then nulls or fails it, as for spark-avro."""
    valid = np.array([u is not None for u in unscaled], dtype=bool)
    raw = b"".join((u if u is not None else 0).to_bytes(16, "little", signed=True)
                   if -(1 << 127) <= (u or 0) < (1 << 127) else bytes(16) for u in unscaled)
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.decimal128(precision, scale), len(unscaled),
                                 [validity, pa.py_buffer(raw)])


def _names_match(writer: Node, reader: Node) -> bool:
    if writer.name is None or reader.name is None:
        return True
    names = {reader.name, reader.short_name, *reader.aliases,
             *(a.rsplit(".", 1)[-1] for a in reader.aliases)}
    return writer.name in names or writer.short_name in names


_PROMOTIONS = {"int": ("long", "float", "double"), "long": ("float", "double"),
               "float": ("double",), "string": ("bytes",), "bytes": ("string",)}


def _matches(writer: Node, reader: Node, *, exact: bool) -> bool:
    """Whether a (non-union) writer type can be read as a (non-union) reader type."""
    if writer.kind == reader.kind:
        if writer.kind in ("record", "enum", "fixed"):
            return _names_match(writer, reader) and (writer.kind != "fixed"
                                                      or writer.size == reader.size)
        return True
    return not exact and reader.kind in _PROMOTIONS.get(writer.kind, ())


def _pick_branch(writer: Node, reader: Node) -> int | None:
    """The reader union's branch that a writer (non-union) type resolves to: the first exact
    match, else the first promotion (the Avro specification's order)."""
    for exact in (True, False):
        for i, b in enumerate(reader.branches):
            if _matches(writer, b, exact=exact):
                return i
    return None


def compile_step(writer: Node, reader: Node, where: str = "") -> Step:
    """The step that reads data written with ``writer`` into ``reader``'s Arrow type.
    Raises :class:`ResolutionError` when no data of ``writer`` can be read as ``reader``."""
    where = where or (reader.name or reader.kind)
    if reader.kind == "union":
        return _to_union(writer, reader, where)
    if writer.kind == "union":
        return _from_union(writer, reader, where)
    if not _matches(writer, reader, exact=False):
        raise ResolutionError(f"{where}: the writer's {writer.describe()} cannot be read as "
                              f"{reader.describe()}")
    if reader.kind == "record":
        return _record(writer, reader, where)
    if reader.kind == "enum":
        return _enum(writer, reader, where)
    if reader.kind == "array":
        return _array(writer, reader, where)
    if reader.kind == "map":
        return _map(writer, reader, where)
    if reader.kind == "fixed":
        size = writer.size

        def read_fixed(cur, rows):
            offsets, values = cur.read_bytes(rows, f"fixed {writer.name}", size=size)
            return _convert(_binary_array(offsets, values, pa.binary()), writer, reader, cur,
                            rows)
        return read_fixed
    if reader.kind == "null":
        return lambda cur, rows: pa.nulls(rows.size)
    read = _primitive_reader(writer.kind)

    def read_primitive(cur, rows):
        return _convert(read(cur, rows), writer, reader, cur, rows)
    return read_primitive


def _record(writer: Node, reader: Node, where: str) -> Step:
    by_name: dict[str, int] = {}
    for i, f in enumerate(reader.fields):
        by_name.setdefault(f.name, i)
        for a in f.aliases:
            by_name.setdefault(a, i)
    steps: list[tuple[int | None, Step]] = []
    seen: set[int] = set()
    for wf in writer.fields:
        i = by_name.get(wf.name)
        if i is None or i in seen:
            steps.append((None, compile_step(wf.type, wf.type, f"{where}.{wf.name}")))
        else:
            seen.add(i)
            steps.append((i, compile_step(wf.type, reader.fields[i].type,
                                          f"{where}.{wf.name}")))
    defaults: dict[int, Field] = {}
    for i, rf in enumerate(reader.fields):
        if i not in seen:
            if not rf.has_default:
                raise ResolutionError(f"{where}: the reader's field {rf.name!r} is not in the "
                                      "writer's schema and has no default")
            defaults[i] = rf
    struct_type = arrow_type(reader)
    fields = [struct_type.field(i) for i in range(struct_type.num_fields)]

    def read_record(cur, rows):
        out: list[pa.Array | None] = [None] * len(reader.fields)
        for i, step in steps:
            arr = step(cur, rows)
            if i is not None:
                out[i] = arr
        for i, rf in defaults.items():
            out[i] = default_array(rf.type, rf.default, rows.size)
        if not fields:
            return pa.array([{}] * rows.size, pa.struct([]))
        return pa.StructArray.from_arrays(out, fields=fields)
    return read_record


def _enum(writer: Node, reader: Node, where: str) -> Step:
    index = {s: i for i, s in enumerate(reader.symbols)}
    fallback = index.get(reader.default_symbol) if reader.default_symbol is not None else None
    mapping = np.array([index.get(s, -1 if fallback is None else fallback)
                        for s in writer.symbols] or [-1], dtype=np.int64)
    symbols = strings(list(reader.symbols) or [""])
    count = len(writer.symbols)

    def read_enum(cur, rows):
        i = cur.read_long(rows, f"enum {writer.name} index")
        wrong = (i < 0) | (i >= count)
        if wrong.any():
            cur.fail(rows[wrong], f"enum {writer.name}: symbol index out of range")
            i = np.where(wrong, 0, i)
        mapped = mapping[i] if count else np.zeros(rows.size, dtype=np.int64)
        unknown = mapped < 0
        if unknown.any():
            cur.fail(rows[unknown], f"{where}: a symbol of the writer's enum that the reader's "
                                    "enum lacks, and the reader's has no default")
            mapped = np.where(unknown, 0, mapped)
        return symbols.take(from_numpy(mapped))
    return read_enum


def _min_size(node: Node) -> int:
    if node.kind in ("null",):
        return 0
    if node.kind == "record":
        return sum(_min_size(f.type) for f in node.fields)
    if node.kind == "fixed":
        return node.size
    return 1


def _rounds(cur: Cursor, rows: np.ndarray, what: str, zero_size: bool, read_item
            ) -> tuple[np.ndarray, list, list, list]:
    """Read Avro blocks of items for every row, one item per row and round. Returns the item
    counts per row and, per round, what ``read_item`` returned, the owning row indices (into
    ``rows``) and the item ordinals."""
    n = rows.size
    counts = np.zeros(n, dtype=np.int64)
    remaining = np.zeros(n, dtype=np.int64)
    done = np.zeros(n, dtype=bool)
    pieces, owners, ordinals = [], [], []
    active = np.arange(n)
    while active.size:
        need = active[remaining[active] == 0]
        if need.size:
            c = cur.read_long(rows[need], f"{what} block count")
            negative = c < 0
            if negative.any():
                cur.read_long(rows[need[negative]], f"{what} block size")
                c = np.abs(c)
            room = cur.end[rows[need]] - cur.pos[rows[need]]
            wrong = (c > MAX_ZERO_SIZE_ITEMS) if zero_size else (c > room)
            if wrong.any():
                cur.fail(rows[need[wrong]], f"an {what} block count that is impossible")
            c = np.where(cur.bad[rows[need]], 0, c)
            remaining[need] = c
            done[need[c == 0]] = True
        active = active[~done[active] & ~cur.bad[rows[active]]]
        if not active.size:
            break
        pieces.append(read_item(rows[active]))
        owners.append(active)
        ordinals.append(counts[active].copy())
        counts[active] += 1
        remaining[active] -= 1
    return counts, pieces, owners, ordinals


def _in_row_order(arrays: list[pa.Array], owners: list, ordinals: list, empty: pa.DataType
                  ) -> pa.Array:
    if not arrays:
        return pa.nulls(0, empty)
    values = pa.concat_arrays(arrays) if len(arrays) > 1 else arrays[0]
    if len(arrays) == 1:
        return values
    order = np.lexsort((np.concatenate(ordinals), np.concatenate(owners)))
    return values.take(from_numpy(order.astype(np.int64)))


def _list_offsets(counts: np.ndarray) -> pa.Array:
    offsets = np.zeros(counts.size + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return from_numpy(offsets)


def _array(writer: Node, reader: Node, where: str) -> Step:
    item = compile_step(writer.items, reader.items, f"{where}[]")
    out_type = arrow_type(reader)
    item_type = arrow_type(reader.items)
    zero_size = _min_size(writer.items) == 0

    def read_array(cur, rows):
        counts, pieces, owners, ordinals = _rounds(cur, rows, "array", zero_size,
                                                   lambda r: item(cur, r))
        values = _in_row_order(pieces, owners, ordinals, item_type)
        return pa.ListArray.from_arrays(_list_offsets(counts), values, type=out_type)
    return read_array


def _map(writer: Node, reader: Node, where: str) -> Step:
    value = compile_step(writer.values, reader.values, f"{where}{{}}")
    out_type = arrow_type(reader)
    value_type = arrow_type(reader.values)
    key_step = compile_step(Node("string"), Node("string"), f"{where} key")

    def read_map(cur, rows):
        def read_entry(r):
            return key_step(cur, r), value(cur, r)
        counts, pieces, owners, ordinals = _rounds(cur, rows, "map", False, read_entry)
        keys = _in_row_order([p[0] for p in pieces], owners, ordinals, pa.string())
        values = _in_row_order([p[1] for p in pieces], owners, ordinals, value_type)
        return pa.MapArray.from_arrays(_list_offsets(counts), keys, values, type=out_type)
    return read_map


def _scatter(parts: list[tuple[np.ndarray, pa.Array]], n: int, typ: pa.DataType) -> pa.Array:
    """Arrays for subsets of ``range(n)`` (index arrays), combined in row order; rows in no
    subset are null."""
    present = [(idx, arr) for idx, arr in parts if idx.size]
    if not present:
        return pa.nulls(n, typ)
    if len(present) == 1 and present[0][0].size == n:
        return present[0][1]
    values = pa.concat_arrays([arr for _, arr in present])
    where = np.full(n, -1, dtype=np.int64)
    start = 0
    for idx, arr in present:
        where[idx] = np.arange(start, start + idx.size)
        start += idx.size
    return values.take(indices(where))


def _branch_index(cur: Cursor, rows: np.ndarray, writer: Node) -> np.ndarray:
    i = cur.read_long(rows, "union branch index")
    wrong = (i < 0) | (i >= len(writer.branches))
    if wrong.any():
        cur.fail(rows[wrong], "a union branch index out of range")
    return np.where(cur.bad[rows], -1, i)


def _to_union(writer: Node, reader: Node, where: str) -> Step:
    """Into a reader union (nullable T, long, double or member struct)."""
    shape = union_shape(reader)
    out_type = arrow_type(reader)
    others = non_null_branches(reader)

    def wrap(branch: int | None, step: Step | None) -> Step | None:
        """A step producing the reader union's representation for one reader branch."""
        if branch is None or step is None:
            return None
        target = reader.branches[branch]
        if target.kind == "null":
            return None         # rows become null
        if shape in ("optional", "long", "double"):
            if shape == "optional":
                return step
            return lambda cur, rows: step(cur, rows).cast(out_type, safe=False)
        member = others.index(target)

        def as_member(cur, rows):
            arr = step(cur, rows)
            children = [arr if m == member else pa.nulls(rows.size, out_type.field(m).type)
                        for m in range(out_type.num_fields)]
            return pa.StructArray.from_arrays(
                children, fields=[out_type.field(m) for m in range(out_type.num_fields)])
        return as_member

    def resolve(w: Node) -> tuple[Step | None, str | None]:
        j = _pick_branch(w, reader)
        if j is None:
            return None, (f"{where}: the writer's {w.describe()} matches no branch of the "
                          f"reader's {reader.describe()}")
        if reader.branches[j].kind == "null":
            return None, None
        return wrap(j, compile_step(w, reader.branches[j], where)), None

    if writer.kind != "union":
        step, error = resolve(writer)
        if error:
            raise ResolutionError(error)
        if step is None:
            return lambda cur, rows: pa.nulls(rows.size, out_type)
        return step
    resolved = [resolve(w) for w in writer.branches]
    if all(error for _, error in resolved):
        raise ResolutionError(resolved[0][1])
    return _union_reader(writer, resolved, out_type)


def _from_union(writer: Node, reader: Node, where: str) -> Step:
    """A writer union into a reader type that is not a union: each branch resolved on its own;
    a branch that cannot be (null, say) makes its records bad."""
    resolved = []
    for w in writer.branches:
        try:
            resolved.append((compile_step(w, reader, where), None))
        except ResolutionError as e:
            resolved.append((None, str(e) if w.kind != "null" else
                             f"{where}: the writer wrote null, the reader's "
                             f"{reader.describe()} cannot be null"))
    if all(error for _, error in resolved):
        raise ResolutionError(resolved[0][1])
    return _union_reader(writer, resolved, arrow_type(reader))


def _union_reader(writer: Node, resolved: list[tuple[Step | None, str | None]],
                  out_type: pa.DataType) -> Step:
    def read_union(cur, rows):
        branch = _branch_index(cur, rows, writer)
        parts = []
        for b, (step, error) in enumerate(resolved):
            local = np.flatnonzero(branch == b)
            if not local.size:
                continue
            if error:
                cur.fail(rows[local], error)
                continue
            if step is not None:
                parts.append((local, step(cur, rows[local])))
        return _scatter(parts, rows.size, out_type)
    return read_union


# ------------------------------------------------------------------------------------------------
# Defaults
# ------------------------------------------------------------------------------------------------

def default_array(node: Node, value, n: int) -> pa.Array:
    """``n`` copies of an Avro JSON default, as ``arrow_type(node)``."""
    typ = arrow_type(node)
    k = node.kind
    if k == "union":
        first = node.branches[0]
        if first.kind == "null":
            return pa.nulls(n, typ)
        arr = default_array(first, value, n)
        if union_shape(node) == "members":
            others = non_null_branches(node)
            return pa.StructArray.from_arrays(
                [arr if b is first else pa.nulls(n, typ.field(i).type)
                 for i, b in enumerate(others)],
                fields=[typ.field(i) for i in range(typ.num_fields)])
        return arr.cast(typ) if arr.type != typ else arr
    if k == "null" or value is None:
        return pa.nulls(n, typ)
    if node.logical == "decimal":
        raw = value.encode("latin-1") if isinstance(value, str) else bytes(value)
        return decimal_array([int.from_bytes(raw, "big", signed=True) if raw else 0] * n,
                             node.precision, node.scale)
    if node.logical in ("timestamp-millis", "local-timestamp-millis"):
        return from_numpy(np.full(n, int(value) * 1000, dtype=np.int64)).view(typ)
    if node.logical in ("timestamp-micros", "local-timestamp-micros"):
        return from_numpy(np.full(n, int(value), dtype=np.int64)).view(typ)
    if node.logical in ("timestamp-nanos", "local-timestamp-nanos"):
        return from_numpy(np.full(n, int(value) // 1000, dtype=np.int64)).view(typ)
    if node.logical == "date":
        return from_numpy(np.full(n, int(value), dtype=np.int32)).view(typ)
    if k == "boolean":
        return bool_array(np.full(n, bool(value)))
    if k in ("int", "long", "float", "double"):
        dtype = {"int": np.int32, "long": np.int64, "float": np.float32, "double": np.float64}[k]
        return from_numpy(np.full(n, value, dtype=dtype))
    if k in ("string", "enum"):
        return _repeat(strings([str(value)]), n)
    if k in ("bytes", "fixed"):
        raw = value.encode("latin-1") if isinstance(value, str) else bytes(value)
        one = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(
            np.array([0, len(raw)], dtype=np.int32)), pa.py_buffer(raw)])
        return _repeat(one, n)
    if k == "record":
        value = value or {}
        return pa.StructArray.from_arrays(
            [default_array(f.type, value.get(f.name, f.default), n) for f in node.fields],
            fields=[typ.field(i) for i in range(typ.num_fields)])
    if k == "array":
        items = [default_array(node.items, v, 1) for v in value]
        each = (pa.concat_arrays(items) if items else pa.nulls(0, arrow_type(node.items)))
        offsets = from_numpy((np.arange(n + 1) * len(items)).astype(np.int32))
        return pa.ListArray.from_arrays(offsets, _tile(each, n), type=typ)
    if k == "map":
        keys = _tile(strings(list(value)), n) if value else pa.nulls(0, pa.string())
        vals = [default_array(node.values, v, 1) for v in value.values()]
        each = pa.concat_arrays(vals) if vals else pa.nulls(0, arrow_type(node.values))
        offsets = from_numpy((np.arange(n + 1) * len(vals)).astype(np.int32))
        return pa.MapArray.from_arrays(offsets, keys, _tile(each, n), type=typ)
    raise ResolutionError(f"no default for {node.describe()}")


def _repeat(one: pa.Array, n: int) -> pa.Array:
    return one.take(from_numpy(np.zeros(n, dtype=np.int64)))


def _tile(values: pa.Array, n: int) -> pa.Array:
    if len(values) == 0:
        return values
    return values.take(from_numpy(np.tile(np.arange(len(values), dtype=np.int64), n)))


# ------------------------------------------------------------------------------------------------
# A column
# ------------------------------------------------------------------------------------------------

def body_cursor(values: pa.Array, skip: int = 0) -> tuple[Cursor, np.ndarray]:
    """A cursor over a binary column's values, each read from byte ``skip`` on (past a wire
    format header), and the rows that are null."""
    offsets, data, nulls = column_bytes(values)
    return Cursor(data, offsets[:-1] + skip, offsets[1:]), nulls
