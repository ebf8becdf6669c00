"""JSON Schema payloads: schemas and their types (:mod:`.schema`), the column decoder
(:mod:`.decode`) and the column encoder (:mod:`.encode`)."""

from .decode import JsonColumnDecoder
from .schema import JsonSchemaError, json_types, parse_json_schema

__all__ = ["JsonColumnDecoder", "JsonSchemaError", "json_types", "parse_json_schema"]
