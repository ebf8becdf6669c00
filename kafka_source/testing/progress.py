"""Spark's streaming progress reports as the tests, the demo and the benchmarks read them.

A source's ``startOffset``/``endOffset`` in ``query.lastProgress`` and ``query.recentProgress``
is JSON text on PySpark 4.2 and later, but on 4.0 and 4.1 the text of a Python dict
(``{'topic': {'0': 5}}``): their ``SourceProgress.fromJson`` applies ``str()`` to the parsed
JSON (``pyspark/sql/streaming/listener.py``; 4.2 turns it back into JSON).
"""

from __future__ import annotations

import ast
import json

__all__ = ["source_offsets"]


def source_offsets(value) -> dict:
    """A source's offsets from a progress report, ``{topic: {partition: offset}}`` as strings
    and ints: from JSON text, from PySpark 4.0/4.1's Python-literal text, or a dict as it is;
    ``{}`` for ``None`` or an empty string."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = ast.literal_eval(value)
    if not isinstance(parsed, dict):
        raise ValueError(f"not a source's offsets: {value!r}")
    return parsed
