"""Columns written as JSON documents, for the sink's ``valueFormat``/``keyFormat`` ``json``.

Confluent's JSON Schema serializer writes each record as a compact JSON document after the
wire format's magic byte and schema id; this writes the same documents for a whole Arrow column
at once with Arrow's string kernels, never one Python object per record: each part of the type
becomes a string column of JSON texts (numbers cast to text, strings escaped and quoted, a
struct's properties concatenated element-wise, a list's items joined per row), and the
top-level column's texts are the bodies.

The writer schema (derived from the column's Spark type by :func:`.schema.json_schema_of`,
given inline or registered) is checked against the column when the encoder is built, by the
parts of JSON Schema that decide what is written:

* a column field that the schema's object lacks, when the object allows no other properties
  (``additionalProperties: false``), is an error; so is a property the schema ``required``
  that the column lacks;
* each value's JSON type (``boolean``, ``integer``, ``number``, ``string``, ``array``,
  ``object``) must be one the schema allows there;
* a null goes where the schema allows ``null``; else, for a property that is not required, the
  property is left out of that document; else the row is an error naming the field and row;
* a string whose schema has an ``enum`` must be one of its values.

Constraints that decide nothing about the encoding (``minimum``, ``pattern``, ``format``,
``maxItems``, ...) are not checked: Confluent's serializer validates those too.

Values with no JSON counterpart: NaN and infinite doubles are errors naming field and row;
binary is written as base64 text (as Jackson writes ``byte[]``); dates as ``YYYY-MM-DD``;
timestamps as RFC 3339 in UTC with microseconds (``2024-05-01T12:00:00.000000Z``);
timestamps without a time zone as the same without the ``Z``; decimals as JSON numbers with
their scale's digits.
"""

from __future__ import annotations

import base64
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..encoded import ColumnEncoder, EncodeError, binary_bodies
from .schema import JsonSchemaError, _resolve, parse_json_schema

Texts = Callable[[pa.Array], pa.Array]      # an array -> its JSON texts (no nulls: "null")

_NULL = pa.scalar("null", pa.string())


def _cat(*parts) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _with_nulls(array: pa.Array, texts: pa.Array) -> pa.Array:
    if array.null_count == 0:
        return texts
    return pc.if_else(array.is_valid(), texts, _NULL)


def _escaped(strings: pa.Array) -> pa.Array:
    """Strings as JSON string literals: quoted, with backslash, quote and control characters
    escaped (the rest of Unicode is written as UTF-8, as JSON allows)."""
    s = pc.replace_substring(strings, "\\", "\\\\")
    s = pc.replace_substring(s, '"', '\\"')
    if pc.any(pc.match_substring_regex(s, "[\\x00-\\x1f]")).as_py():
        for code in range(32):
            s = pc.replace_substring(s, chr(code), f"\\u{code:04x}")
    return _cat('"', s, '"')


class _Node:
    """A (sub)schema resolved for checking: the JSON types it allows (None: any), whether null is
    one of them, its object properties and whether others are allowed, its items, its enum."""

    def __init__(self, schema, root: dict, where: str, seen: tuple = ()):
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise JsonSchemaError(f"{where}: a schema is a JSON object")
        schema, seen = _resolve(schema, root, where, seen)
        alternatives = schema.get("oneOf") or schema.get("anyOf")
        if alternatives:
            nodes = [_Node(s, root, where, seen) for s in alternatives]
            others = [n for n in nodes if n.types != {"null"}]
            if len(others) == 1:
                # the one non-null alternative, made nullable when another one is null
                vars(self).update(vars(others[0]))
                if any(n.types is not None and "null" in n.types for n in nodes):
                    self.allows_null = True
                if self.types is not None and self.allows_null:
                    self.types = self.types | {"null"}
                return
            raise JsonSchemaError(f"{where}: {len(others)} non-null alternatives: the writer "
                                  "can't tell which one a column's value is")
        t = schema.get("type")
        self.types = None if t is None else set(t if isinstance(t, list) else [t])
        self.allows_null = self.types is None or "null" in self.types
        self.enum = schema.get("enum")
        if "const" in schema:
            self.enum = [schema["const"]]
        if self.enum is not None and None in self.enum:
            self.allows_null = True
        props = schema.get("properties") or {}
        self.props = {name: (lambda s=s, name=name: _Node(s, root, f"{where}.{name}", seen))
                      for name, s in props.items()}
        extra = schema.get("additionalProperties", True)
        self.extra_ok = extra is not False
        self.extra = None if extra in (True, False) else \
            (lambda s=extra: _Node(s, root, f"{where}.*", seen))
        self.required = set(schema.get("required") or ())
        items = schema.get("items")
        self.items = None if not isinstance(items, dict) else \
            (lambda s=items: _Node(s, root, f"{where}[]", seen))

    def allows(self, json_type: str) -> bool:
        if self.types is None:
            return True
        return json_type in self.types or (json_type == "integer" and "number" in self.types)


def _json_type(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return "object"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "array"
    if pa.types.is_null(t):
        return "null"
    return "string"


class JsonEncoder(ColumnEncoder):
    """Writes Arrow columns of one type as JSON documents valid for one writer schema; built once
    (checking the column against the schema), used per batch."""

    def __init__(self, schema_text: str, arrow: pa.DataType, what: str = "value"):
        root = parse_json_schema(schema_text)
        self.what = what
        texts = self._compile(_Node(root, root, what), arrow, what)
        self._encode = lambda rows: [binary_bodies(texts(rows))]     # a document per row

    # --- compiling the schema against the column's type ---------------------------------------

    def _compile(self, node: _Node, t: pa.DataType, path: str) -> Texts:
        kind = _json_type(t)
        if kind != "null" and not node.allows(kind):
            raise EncodeError(f"field '{path}' is {t} (JSON {kind}) but the schema allows "
                              f"{', '.join(sorted(node.types))}")
        if pa.types.is_struct(t):
            return self._struct(node, t, path)
        if pa.types.is_map(t):
            return self._map(node, t, path)
        if kind == "array":
            return self._list(node, t, path)
        return self._scalar(node, t, path)

    def _scalar(self, node: _Node, t: pa.DataType, path: str) -> Texts:
        if pa.types.is_null(t):
            return lambda a: pa.array(["null"] * len(a), pa.string())
        if pa.types.is_boolean(t):
            return lambda a: _with_nulls(a, pc.if_else(a.fill_null(False), "true", "false"))
        if pa.types.is_integer(t) or pa.types.is_decimal(t):
            return lambda a: _with_nulls(a, pc.cast(a, pa.string()))
        if pa.types.is_floating(t):
            def floats(a: pa.Array) -> pa.Array:
                bad = pc.fill_null(pc.invert(pc.is_finite(a)), False)
                if pc.any(bad).as_py():
                    row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
                    raise EncodeError(f"field '{path}' is {a[row].as_py()} in row {row}: JSON "
                                      "has no NaN or infinite number")
                return _with_nulls(a, pc.cast(a, pa.string()))
            return floats
        if pa.types.is_timestamp(t):
            zone = "Z" if t.tz is not None else ""
            fmt = "%Y-%m-%dT%H:%M:%S"

            def stamps(a: pa.Array) -> pa.Array:
                a = a.cast(pa.timestamp("us", tz=t.tz))
                return _with_nulls(a, _cat('"', pc.strftime(a, format=fmt), zone + '"'))
            return stamps
        if pa.types.is_date(t):
            return lambda a: _with_nulls(a, _cat('"', pc.cast(a, pa.string()), '"'))
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or \
                pa.types.is_fixed_size_binary(t):
            return lambda a: pa.array(
                ["null" if v is None else '"' + base64.b64encode(v).decode("ascii") + '"'
                 for v in a.to_pylist()], pa.string())
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            enum = node.enum

            def strings(a: pa.Array) -> pa.Array:
                a = a.cast(pa.string())
                if enum is not None:
                    ok = pc.fill_null(pc.is_in(a, value_set=pa.array(
                        [e for e in enum if isinstance(e, str)], pa.string())), True)
                    if not pc.all(ok).as_py():
                        row = int(np.flatnonzero(~ok.to_numpy(zero_copy_only=False))[0])
                        raise EncodeError(f"field '{path}' is {a[row].as_py()!r} in row {row}, "
                                          f"which is not one of the schema's enum {enum}")
                return _with_nulls(a, _escaped(a.fill_null("")))
            return strings
        raise EncodeError(f"field '{path}' is {t}, which has no JSON value here")

    def _struct(self, node: _Node, t: pa.StructType, path: str) -> Texts:
        names = [t.field(i).name for i in range(t.num_fields)]
        missing = sorted(node.required - set(names))
        if missing:
            raise EncodeError(f"the schema requires {', '.join(repr(m) for m in missing)} in "
                              f"'{path}', which the column lacks")
        fields = []
        for i, name in enumerate(names):
            sub = f"{path}.{name}"
            if name in node.props:
                child = node.props[name]()
            elif node.extra is not None:
                child = node.extra()
            elif node.extra_ok:
                child = _Node({}, {}, sub)
            else:
                raise EncodeError(f"the column's field '{sub}' is not a property of the schema, "
                                  "which allows no other properties (additionalProperties: "
                                  "false)")
            texts = self._compile(child, t.field(i).type, sub)
            if child.allows_null or not t.field(i).nullable:
                null = "write"
            elif name in node.required:
                null = "error"
            else:
                null = "omit"
            key = _escaped(pa.array([name], pa.string()))[0].as_py()
            fields.append((i, sub, key, texts, null))

        def struct(a: pa.Array) -> pa.Array:
            if isinstance(a, pa.ChunkedArray):
                a = a.combine_chunks()
            parts = []
            for i, sub, key, texts, null in fields:
                child = a.field(i)
                piece = _cat("," + key + ":", texts(child))
                if child.null_count and null != "write":
                    is_null = child.is_null()
                    if null == "error":
                        hit = pc.and_(is_null, a.is_valid()) if a.null_count else is_null
                        if pc.any(hit).as_py():
                            row = int(np.flatnonzero(hit.to_numpy(zero_copy_only=False))[0])
                            raise EncodeError(f"field '{sub}' is null in row {row}, and the "
                                              "schema requires it and does not allow null")
                    else:
                        piece = pc.if_else(is_null, "", piece)
                parts.append(piece)
            if not parts:
                body = pa.array(["{}"] * len(a), pa.string())
            else:
                joined = _cat(*parts)
                body = _cat("{", pc.utf8_slice_codeunits(joined, 1), "}")
            return _with_nulls(a, body)
        return struct

    def _list(self, node: _Node, t: pa.DataType, path: str) -> Texts:
        child = node.items() if node.items is not None else _Node({}, {}, f"{path}[]")
        items = self._compile(child, t.value_type, f"{path}[]")
        if t.value_field.nullable and not child.allows_null:
            where = f"{path}[]"

            def check(values: pa.Array) -> None:
                if values.null_count:
                    raise EncodeError(f"an element of '{path}' is null, and the schema's items "
                                      f"({where}) do not allow null")
        else:
            def check(values: pa.Array) -> None:
                return None

        def lists(a: pa.Array) -> pa.Array:
            values = a.values
            check(values)
            rebuilt = pa.ListArray.from_arrays(a.offsets, items(values))
            return _with_nulls(a, _cat("[", pc.binary_join(rebuilt, ",").fill_null(""), "]"))
        return lists

    def _map(self, node: _Node, t: pa.MapType, path: str) -> Texts:
        if not (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)
                or pa.types.is_integer(t.key_type)):
            raise EncodeError(f"field '{path}' is a map with {t.key_type} keys; JSON object keys "
                              "are strings (write string or integer keys)")
        child = node.extra() if node.extra is not None else _Node({}, {}, f"{path}.*")
        if not node.extra_ok:
            raise EncodeError(f"field '{path}' is a map but the schema's object allows no "
                              "properties beyond its own (additionalProperties: false)")
        values_texts = self._compile(child, t.item_type, f"{path}.*")

        def maps(a: pa.Array) -> pa.Array:
            entries = a.values
            keys = _escaped(entries.field(0).cast(pa.string()))
            items = entries.field(1)
            if items.null_count and not child.allows_null:
                raise EncodeError(f"a value of map '{path}' is null, and the schema's "
                                  "additionalProperties do not allow null")
            rebuilt = pa.ListArray.from_arrays(a.offsets, _cat(keys, ":", values_texts(items)))
            return _with_nulls(a, _cat("{", pc.binary_join(rebuilt, ",").fill_null(""), "}"))
        return maps

