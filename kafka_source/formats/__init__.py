"""Payload formats: the layer between Kafka's record values and typed Arrow columns.

Most production topics carry Avro (and Protobuf, JSON Schema) payloads in Confluent's wire
format: a zero magic byte, the 4-byte big-endian id of the writer's schema in a Schema Registry,
then the body. The read path hands this layer whole Arrow batches of ``key``/``value`` binaries;
it returns them as struct columns typed from the *reader* schema, decoding every batch column by
column (numpy over the batch's bytes), never one Python object per record.

* :mod:`.registry` -- the Schema Registry client (Confluent's REST API), with the settings
  confluent-kafka's ``SchemaRegistryClient`` takes, caching schemas by id.
* :mod:`.framing` -- Confluent's framing of a value: magic byte and schema id, for a whole column.
* :mod:`.encoded` -- the sink's encoded rows: per-row byte ranges built a column at a time and put
  together once per row, shared by the three encoders.
* :mod:`.avro` -- Avro schemas, their Spark and Arrow types (as spark-avro maps them), schema
  resolution and the columnar decoder.
* :mod:`.protobuf` -- Protobuf descriptors from the registry, their Spark and Arrow types, the
  columnar decoder (every message of a batch read in rounds of tags), and the encoder.
* :mod:`.jsonschema` -- JSON Schemas' types; a batch's documents parsed by Arrow's JSON reader,
  and columns written as JSON documents.
* :mod:`.options` -- ``valueFormat``/``keyFormat`` and their settings, parsed on the driver and
  pickled into the input partitions.
* :mod:`.columns` -- what an executor runs on every batch: decode the formatted columns.
* :mod:`.sink` -- the write side: writer schemas derived, registered or looked up, and each
  batch's formatted columns encoded (Avro, JSON Schema, Protobuf) and framed with their
  schema ids.
"""
