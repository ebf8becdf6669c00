"""Protobuf payloads: descriptors from the registry (:mod:`.schema`), the columnar decoder
(:mod:`.decode`), and for the sink the schema of a Spark type (:mod:`.derive`) and the columnar
encoder (:mod:`.encode`)."""

from .decode import ProtobufColumnDecoder
from .schema import ProtobufSchemaError, message_descriptor, protobuf_types, schema_text

__all__ = ["ProtobufColumnDecoder", "ProtobufSchemaError", "message_descriptor",
           "protobuf_types", "schema_text"]
