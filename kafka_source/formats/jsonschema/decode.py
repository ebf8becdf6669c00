"""A column of JSON Schema payloads decoded with Arrow's JSON reader.

Confluent's JSON Schema serializer writes a compact JSON document per record (after the wire
format's magic byte and schema id). The bodies of a column are joined into one newline-delimited
buffer and parsed by ``pyarrow.json.read_json`` against the reader schema's Arrow type
(:func:`.schema.json_types`), in C++; properties the reader schema lacks are ignored, missing ones
are null. When the bulk parse fails (a body that is not a JSON object, a value of another type
than the schema's), the rows are parsed one by one to find the bad ones, which are marked with
the parser's reason; the others are parsed in bulk again.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa

from ..avro import DecodedColumn, _combine
from ..framing import HEADER_SIZE, PAD, column_bytes, schema_ids
from .schema import JsonSchemaError, json_types


class JsonColumnDecoder:
    """Decodes columns of JSON documents (wire format when ``framed``) into the reader schema's
    struct. The writer's schema id is read but not needed: JSON carries its field names."""

    def __init__(self, reader_schema: str, framed: bool):
        self.type, _ = json_types(reader_schema)
        if not pa.types.is_struct(self.type):
            raise JsonSchemaError("the reader schema of a JSON column must be an object")
        self.framed = framed
        self._options = None

    def _parse(self, docs: list[bytes], newlines: bool) -> pa.Array:
        import pyarrow.json as pj

        options = pj.ParseOptions(explicit_schema=pa.schema(list(self.type)),
                                  unexpected_field_behavior="ignore",
                                  newlines_in_values=newlines)
        table = pj.read_json(io.BytesIO(b"\n".join(docs) + b"\n"), parse_options=options,
                             read_options=pj.ReadOptions(use_threads=False))
        if table.num_rows != len(docs):
            raise ValueError(f"{table.num_rows} rows for {len(docs)} documents")
        batch = table.combine_chunks().to_batches()
        if not batch:
            return pa.nulls(0, self.type)
        return pa.StructArray.from_arrays(batch[0].columns, fields=list(self.type))

    def decode(self, values: pa.Array) -> DecodedColumn:
        n = len(values)
        offsets, data, nulls = column_bytes(values)
        skip = HEADER_SIZE if self.framed else 0
        ids = None
        if self.framed:
            ids, unframed = schema_ids(offsets, data, nulls)
        else:
            unframed = np.zeros(n, dtype=bool)
        bad = unframed.copy()
        reasons = {int(r): "not in the Schema Registry wire format (no magic byte 0 and "
                           "schema id: was it written without a registry serializer?)"
                   for r in np.flatnonzero(unframed)}
        rows = np.flatnonzero(~nulls & ~unframed)
        raw = data[:data.size - PAD].tobytes()
        docs = [raw[offsets[r] + skip:offsets[r + 1]].strip() for r in rows]
        for i, doc in enumerate(docs):
            if not (doc.startswith(b"{") and doc.endswith(b"}")):
                bad[rows[i]] = True
                reasons[int(rows[i])] = "not a JSON object"
        keep = [i for i in range(len(docs)) if not bad[rows[i]]]
        good_rows = rows[keep]
        good_docs = [docs[i] for i in keep]
        newlines = any(b"\n" in d for d in good_docs)
        try:
            parsed = self._parse(good_docs, newlines) if good_docs else pa.nulls(0, self.type)
        except (pa.ArrowInvalid, ValueError):
            ok = []
            for r, doc in zip(good_rows, good_docs):
                try:
                    self._parse([doc], newlines=b"\n" in doc)
                    ok.append((r, doc))
                except (pa.ArrowInvalid, ValueError) as e:
                    bad[r] = True
                    reasons[int(r)] = f"the JSON does not match the reader schema: {e}"
            good_rows = np.array([r for r, _ in ok], dtype=np.int64)
            parsed = (self._parse([d for _, d in ok], newlines) if ok
                      else pa.nulls(0, self.type))
        return DecodedColumn(_combine([(good_rows, parsed)], bad, n, self.type), bad, reasons,
                             ids)
