"""Protobuf payloads: descriptors from the registry (:mod:`.schema`) and the columnar decoder
(:mod:`.decode`)."""

from .decode import ProtobufColumnDecoder
from .schema import ProtobufSchemaError, message_descriptor, protobuf_types, schema_text

__all__ = ["ProtobufColumnDecoder", "ProtobufSchemaError", "message_descriptor",
           "protobuf_types", "schema_text"]
