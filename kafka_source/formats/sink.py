"""Writing formatted columns: ``valueFormat``/``keyFormat`` on ``df.write`` and ``writeStream``.

The sink's side of the layer. A ``value`` (``key``) column is written as Avro (``avro``), JSON
Schema documents (``json``) or Protobuf messages (``protobuf``) in Confluent's wire format, as
confluent-kafka's serializers write them -- a zero byte, the schema's registry id, for Protobuf
the message's indexes, the body -- so that Confluent's deserializers, Kafka's tools and
pykafka's reader all read it back. The writer schema is, in this order:

* ``valueSchemaId``: the registered schema of that id;
* ``valueSchemaVersion``, or ``use.latest.version``: that (the latest) version of the subject,
  whose fields the column's are matched to by name;
* ``valueSchema``: the schema given inline;
* else derived from the column's Spark type: for Avro by :func:`.avro.schema.avro_schema_of`,
  the top-level record named by ``valueRecordName`` (``topLevelRecord`` as in spark-avro); for
  JSON Schema by :func:`.jsonschema.schema.json_schema_of`, titled ``valueRecordName``; for
  Protobuf by :func:`.protobuf.derive.protobuf_schema_of`, the message named by it.

A Protobuf schema is kept as its serialized files (as the reader keeps it), registered as the
message's file in base64, as confluent-kafka's ``ProtobufSerializer`` registers it, and read
from the registry serialized: no ``.proto`` text is parsed or printed here.

Given or derived, a schema is registered under its subject when ``auto.register.schemas`` is
true (the default, as Confluent's serializer), else looked up there. The subject follows the
naming strategy as for reading, the record's name taken from the schema. The registry's
refusal (an incompatible schema under the subject's compatibility level, an invalid schema, a
schema not registered) is an error naming the subject and what the registry said.

On the driver (:func:`plan`): the options are checked, the schema derived, and -- when the
``topic`` option names the one topic -- the subject's schema id settled, so that an
incompatible schema fails the query before any task runs. On the executors
(:class:`BatchEncoder`): each topic's id is settled once per process (a ``topic`` column may
name topics the driver never saw), and each batch's column is encoded at once
(:mod:`.avro.encode`, :mod:`.jsonschema.encode`, :mod:`.protobuf.encode`). Without a registry,
bodies are written bare (as spark-avro's ``to_avro``, plain JSON, a bare message), readable
with ``valueSchema``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Mapping

import numpy as np
import pyarrow.compute as pc

from ..errors import ColumnError, OptionError
from .options import (NAMES, SCHEMA_TYPES, STRATEGIES, inline_protobuf, option_of,
                      registry_protobuf)
from .registry import (RegistryError, RegistrySettings, RegistryUnavailableError, client_for,
                       registry_settings)

WRITE_FORMATS = ("binary", "avro", "json", "protobuf")
DEFAULT_RECORD_NAME = "topLevelRecord"


@dataclass(frozen=True)
class ColumnEncoding:
    """How the sink writes one column (``key`` or ``value``). Plain, picklable data."""

    column: str
    format: str                               # "avro", "json", "protobuf"
    registry: RegistrySettings | None
    inline_schema: str | None = None
    record_name: str | None = None            # valueRecordName: the derived record's full name
    message_name: str | None = None           # valueMessageName (Protobuf): which message
    subject: str | None = None                # valueSubject
    strategy: str = "TopicNameStrategy"
    schema_id: int | None = None              # valueSchemaId
    version: int | None = None                # valueSchemaVersion
    auto_register: bool = True
    use_latest: bool = False
    # settled on the driver by plan():
    writer_schema: str | None = None          # inline or derived (None: the registry's)
    settled: tuple[tuple[str, int, str], ...] = ()   # (topic, schema id, schema text)

    def describe_source(self) -> str:
        if self.schema_id is not None:
            return f"schema id {self.schema_id}"
        if self.version is not None:
            return f"version {self.version} of the subject"
        if self.use_latest:
            return "the subject's latest version (use.latest.version)"
        if self.inline_schema is not None:
            return f"'{self.column}Schema'"
        return f"derived from the '{self.column}' column's type"


@dataclass(frozen=True)
class SinkFormats:
    value: ColumnEncoding | None = None
    key: ColumnEncoding | None = None

    @property
    def any(self) -> bool:
        return self.value is not None or self.key is not None

    def columns(self) -> tuple[ColumnEncoding, ...]:
        return tuple(c for c in (self.key, self.value) if c is not None)

    def formatted(self) -> set[str]:
        return {c.column for c in self.columns()}


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"Option '{key}' must be true or false, got {raw!r}.")
    return value == "true"


def parse_sink_formats(opts: Mapping[str, str]) -> SinkFormats:
    """The format options of a write (lower-cased keys), checked without asking the registry."""
    registry = registry_settings(opts, also=("auto.register.schemas", "use.latest.version"))
    auto_register = _bool(opts, "auto.register.schemas", True)
    use_latest = _bool(opts, "use.latest.version", False)
    found = {}
    for column in ("key", "value"):
        raw = option_of(opts, column, "Format")
        fmt = "binary" if raw is None else raw.strip().lower()
        given = {s: option_of(opts, column, s) for s in ("Schema", "SchemaId", "SchemaVersion",
                                                         "Subject", "SubjectNameStrategy",
                                                         "RecordName", "MessageName")}
        given = {s: v for s, v in given.items() if v is not None}
        if fmt not in WRITE_FORMATS:
            if fmt in NAMES:
                raise OptionError(f"Option '{column}Format': writing {fmt} is not supported "
                                  f"yet; a write takes {', '.join(WRITE_FORMATS)} (reads also "
                                  f"take {', '.join(n for n in NAMES if n not in WRITE_FORMATS)}"
                                  ").")
            raise OptionError(f"Option '{column}Format' must be one of "
                              f"{', '.join(WRITE_FORMATS)}, got {raw!r}.")
        if fmt == "binary":
            if given:
                raise OptionError(f"Option '{column}{next(iter(given))}' is set but "
                                  f"'{column}Format' is binary (the default): set "
                                  f"'{column}Format' to {', '.join(WRITE_FORMATS[1:])}.")
            continue
        needs_registry = [s for s in ("SchemaId", "SchemaVersion", "Subject",
                                      "SubjectNameStrategy") if s in given]
        if registry is None and needs_registry:
            raise OptionError(f"Option '{column}{needs_registry[0]}' needs "
                              "'schema.registry.url'.")
        if "SchemaId" in given and ("SchemaVersion" in given or "Schema" in given):
            other = "SchemaVersion" if "SchemaVersion" in given else "Schema"
            raise OptionError(f"Options '{column}SchemaId' and '{column}{other}' both name the "
                              "writer schema: set one of them.")
        if "SchemaVersion" in given and "Schema" in given:
            raise OptionError(f"Options '{column}SchemaVersion' and '{column}Schema' both name "
                              "the writer schema: set one of them.")
        schema_id = version = None
        if "SchemaId" in given:
            try:
                schema_id = int(given["SchemaId"])
            except ValueError:
                raise OptionError(f"Option '{column}SchemaId' must be a schema id (a number), "
                                  f"got {given['SchemaId']!r}.") from None
        if "SchemaVersion" in given:
            v = given["SchemaVersion"].strip().lower()
            if v != "latest":
                try:
                    version = int(v)
                except ValueError:
                    raise OptionError(f"Option '{column}SchemaVersion' must be a version number "
                                      f"or 'latest', got {given['SchemaVersion']!r}.") from None
        use_latest_here = use_latest or given.get("SchemaVersion", "").strip().lower() == "latest"
        strategy_raw = given.get("SubjectNameStrategy", "TopicNameStrategy")
        strategy = STRATEGIES.get(strategy_raw.rsplit(".", 1)[-1].lower())
        if strategy is None:
            raise OptionError(f"Option '{column}SubjectNameStrategy' must be one of "
                              f"{', '.join(STRATEGIES.values())}, got {strategy_raw!r}.")
        record_name = given.get("RecordName")
        if record_name is not None and not all(p.isidentifier() for p in record_name.split(".")):
            raise OptionError(f"Option '{column}RecordName' must be a full name such as "
                              f"'com.example.Order', got {record_name!r}.")
        if "MessageName" in given and fmt != "protobuf":
            raise OptionError(f"Option '{column}MessageName' is for Protobuf, and "
                              f"'{column}Format' is {fmt}.")
        inline = given.get("Schema")
        if inline is not None:
            if fmt == "protobuf":
                inline = inline_protobuf(inline, given.get("MessageName"), column)
            try:
                _parse(fmt, inline)
            except ValueError as e:
                raise OptionError(f"Option '{column}Schema' ({NAMES[fmt]}): {e}") from None
        found[column] = ColumnEncoding(
            column=column, format=fmt, registry=registry, inline_schema=inline,
            record_name=record_name, message_name=given.get("MessageName"),
            subject=given.get("Subject"), strategy=strategy,
            schema_id=schema_id, version=version, auto_register=auto_register,
            use_latest=use_latest_here and schema_id is None and version is None)
    return SinkFormats(value=found.get("value"), key=found.get("key"))


# --- the driver: derive, check, settle -----------------------------------------------------------

def spark_arrow_type(dt):
    """The Arrow type Spark hands a Python writer for a column of Spark type ``dt``."""
    import pyarrow as pa
    from pyspark.sql import types as T

    simple = {T.BooleanType: pa.bool_(), T.ByteType: pa.int8(), T.ShortType: pa.int16(),
              T.IntegerType: pa.int32(), T.LongType: pa.int64(), T.FloatType: pa.float32(),
              T.DoubleType: pa.float64(), T.StringType: pa.string(), T.BinaryType: pa.binary(),
              T.DateType: pa.date32(), T.TimestampNTZType: pa.timestamp("us"),
              T.TimestampType: pa.timestamp("us", tz="UTC"), T.NullType: pa.null()}
    for kind, arrow in simple.items():
        if type(dt) is kind:
            return arrow
    if isinstance(dt, (T.VarcharType, T.CharType)):
        return pa.string()
    if isinstance(dt, T.DecimalType):
        return pa.decimal128(dt.precision, dt.scale)
    if isinstance(dt, T.ArrayType):
        return pa.list_(pa.field("element", spark_arrow_type(dt.elementType), dt.containsNull))
    if isinstance(dt, T.MapType):
        return pa.map_(pa.field("key", spark_arrow_type(dt.keyType), False),
                       pa.field("value", spark_arrow_type(dt.valueType), dt.valueContainsNull))
    if isinstance(dt, T.StructType):
        return pa.struct([pa.field(f.name, spark_arrow_type(f.dataType), f.nullable)
                          for f in dt.fields])
    raise ColumnError(f"Spark type {dt.simpleString()} can't be written in a format here.")


def _parse(fmt: str, text: str):
    """Checks a writer schema's text (raises ValueError saying what is wrong)."""
    if fmt == "protobuf":
        from .protobuf import message_descriptor

        return message_descriptor(text)
    if fmt == "json":
        from .jsonschema import parse_json_schema

        return parse_json_schema(text)
    from .avro import parse_schema

    return parse_schema(text)


def _derive(fmt: str, dt, record_name: str | None) -> str:
    """The writer schema of a column of Spark type ``dt``."""
    if fmt == "protobuf":
        from .protobuf.derive import protobuf_schema_of

        return protobuf_schema_of(dt, record_name)
    if fmt == "json":
        from .jsonschema.schema import json_schema_of

        return json.dumps(json_schema_of(dt, record_name))
    from .avro.schema import avro_schema_of

    name, _, space = (record_name or DEFAULT_RECORD_NAME).rpartition(".")[::-1]
    return json.dumps(avro_schema_of(dt, name, space))


def make_encoder(fmt: str, text: str, arrow_type, column: str, framed: bool = False):
    """The encoder of ``fmt`` for columns of ``arrow_type`` with writer schema ``text``: its
    ``encode(array)`` returns (the non-null rows' bodies, which rows are non-null); building it
    checks the column against the schema (raises :class:`.encoded.EncodeError`, or the
    format's schema error). ``framed``: the bodies go into the wire format, whose Protobuf
    bodies begin with the message's indexes."""
    if fmt == "protobuf":
        from .protobuf import message_descriptor
        from .protobuf.encode import ProtobufEncoder, index_bytes

        desc = message_descriptor(text)
        return ProtobufEncoder(desc, arrow_type, column,
                               prefix=index_bytes(desc) if framed else b"")
    if fmt == "json":
        from .jsonschema.encode import JsonEncoder

        return JsonEncoder(text, arrow_type, column)
    from .avro import parse_schema
    from .avro.encode import AvroEncoder

    return AvroEncoder(parse_schema(text), arrow_type, column)


def plan(formats: SinkFormats, schema, topic_option: str | None) -> SinkFormats:
    """On the driver, with the DataFrame's Spark ``schema``: each formatted column's writer
    schema derived (or checked), and its id settled for the ``topic`` option's topic."""
    fields = {}
    for f in schema.fields:
        fields.setdefault(f.name, f)
    planned = {}
    for enc in formats.columns():
        label = NAMES[enc.format]
        field = fields.get(enc.column)
        if field is None:
            if enc.column == "key":
                raise ColumnError("Option 'keyFormat' is set but the DataFrame has no 'key' "
                                  "column.")
            continue            # check_schema says that 'value' is missing
        writer = enc.inline_schema
        if writer is None and enc.schema_id is None and enc.version is None \
                and not enc.use_latest:
            try:
                writer = _derive(enc.format, field.dataType, enc.record_name)
            except ValueError as e:       # AvroSchemaError, JsonSchemaError
                raise ColumnError(f"Column '{enc.column}' can't be written as {label}: {e}.") \
                    from None
        enc = replace(enc, writer_schema=writer)
        arrow = spark_arrow_type(field.dataType)
        known: tuple = ()
        if enc.registry is not None and topic_option is not None:
            sid, text = settled(enc, topic_option)
            known = ((topic_option, sid, text),)
            writer = text
        if writer is not None:
            try:
                make_encoder(enc.format, writer, arrow, enc.column, enc.registry is not None)
            except ValueError as e:       # EncodeError, the format's schema errors
                raise ColumnError(f"Column '{enc.column}' ({field.dataType.simpleString()}) "
                                  f"can't be written with the {label} schema "
                                  f"({enc.describe_source()}): {e}.") from None
        planned[enc.column] = replace(enc, settled=known)
    return SinkFormats(value=planned.get("value"), key=planned.get("key"))


def record_full_name(schema_text: str, fmt: str = "avro") -> str | None:
    """The record name that RecordNameStrategy takes: an Avro record's full name; a JSON
    Schema's ``title``; a Protobuf message's full name -- as Confluent's serializers take
    them."""
    try:
        raw = json.loads(schema_text)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    if fmt == "json":
        return raw.get("title") if isinstance(raw.get("title"), str) else None
    if fmt == "protobuf":
        from .protobuf import message_descriptor

        try:
            return message_descriptor(schema_text).full_name
        except ValueError:
            return None
    if isinstance(raw.get("name"), str):
        name, space = raw["name"], raw.get("namespace")
        return name if "." in name or not space else f"{space}.{name}"
    return None


def subject_of(enc: ColumnEncoding, topic: str, schema_text: str | None) -> str:
    if enc.subject:
        return enc.subject
    if enc.strategy == "TopicNameStrategy":
        return f"{topic}-{enc.column}"
    record = (record_full_name(schema_text, enc.format) if schema_text else None) \
        or enc.record_name
    if not record:
        raise OptionError(f"'{enc.column}SubjectNameStrategy' {enc.strategy} names the subject "
                          "by the record's full name, and the writer schema names no record "
                          f"(an Avro record's name, a JSON Schema's title, a Protobuf "
                          f"message's name): set "
                          f"'{enc.column}RecordName' or '{enc.column}Subject'.")
    return record if enc.strategy == "RecordNameStrategy" else f"{topic}-{record}"


def settle(enc: ColumnEncoding, topic: str) -> tuple[int, str]:
    """(schema id, writer schema text) of the column written to ``topic``: asks the registry."""
    client = client_for(enc.registry)
    subject = None
    try:
        if enc.schema_id is not None:
            found = client.schema_by_id(enc.schema_id)
            _check_type(found.schema_type, enc, f"schema id {enc.schema_id}")
            return enc.schema_id, _writer_text(client, enc, enc.schema_id, found.schema)
        if enc.version is not None or enc.use_latest:
            subject = subject_of(enc, topic, None)
            found = client.version(subject, enc.version if enc.version is not None
                                   else "latest")
            _check_type(found.schema_type, enc, f"subject {subject!r}")
            return found.id, _writer_text(client, enc, found.id, found.schema)
        subject = subject_of(enc, topic, enc.writer_schema)
        kind = SCHEMA_TYPES[enc.format]
        registered = _registered_form(enc)
        if enc.auto_register:
            return client.register(subject, registered, kind), enc.writer_schema
        return client.lookup(subject, registered, kind), enc.writer_schema
    except RegistryError as e:
        raise OptionError(_refusal(enc, topic, subject, e)) from None
    except RegistryUnavailableError as e:
        raise OptionError(f"'{enc.column}Format' {enc.format}, writing to topic '{topic}': "
                          f"{e}") from None


def _writer_text(client, enc: ColumnEncoding, schema_id: int, text: str) -> str:
    """The writer schema text of a registered schema: for Protobuf its file and imports,
    serialized (the registry keeps ``.proto`` text, which is not parsed here)."""
    if enc.format != "protobuf":
        return text
    return registry_protobuf(client, schema_id, enc.message_name)


def _registered_form(enc: ColumnEncoding) -> str:
    """What a derived or inline schema is registered as: its text; for Protobuf the message's
    file, a serialized FileDescriptorProto in base64, as confluent-kafka's ProtobufSerializer
    registers it (Confluent's registry and Karapace keep it as ``.proto`` text)."""
    if enc.format != "protobuf":
        return enc.writer_schema
    import base64

    from google.protobuf import descriptor_pb2

    from .protobuf import message_descriptor

    desc = message_descriptor(enc.writer_schema)
    imports = [d.name for d in desc.file.dependencies
               if not d.name.startswith("google/protobuf/")]
    if imports:
        raise OptionError(f"'{enc.column}Schema' imports {', '.join(imports)}: a schema with "
                          "references is not registered by the sink. Register it (and the "
                          f"files it imports) first, then write with '{enc.column}SchemaId' or "
                          "'use.latest.version'.")
    proto = descriptor_pb2.FileDescriptorProto()
    desc.file.CopyToProto(proto)
    return base64.b64encode(proto.SerializeToString()).decode()


def _check_type(schema_type: str, enc: ColumnEncoding, where: str) -> None:
    if (schema_type or "AVRO").upper() != SCHEMA_TYPES[enc.format]:
        raise RegistryError(f"{where} is a {schema_type} schema, not {NAMES[enc.format]}")


def _refusal(enc: ColumnEncoding, topic: str, subject: str | None, e: RegistryError) -> str:
    where = f"'{enc.column}Format' {enc.format}, writing to topic '{topic}'"
    if subject:
        where += f" (subject '{subject}')"
    if e.status == 409:
        return (f"{where}: the Schema Registry refused the writer schema "
                f"({enc.describe_source()}) as incompatible with the subject's registered "
                f"versions under its compatibility level: {e}. Change the column to a compatible "
                "type (e.g. new fields nullable, which gives them a null default), change the "
                "subject's compatibility, or write with 'use.latest.version'.")
    if e.status == 404 and not enc.auto_register and enc.schema_id is None \
            and enc.version is None and not enc.use_latest:
        return (f"{where}: the writer schema ({enc.describe_source()}) is not registered "
                f"under the subject, and 'auto.register.schemas' is false: {e}. Register it, set "
                "'auto.register.schemas' to true, or write with 'use.latest.version'.")
    return f"{where}: {e}"


_SETTLED: dict[tuple, tuple[int, str]] = {}
_SETTLED_LOCK = threading.Lock()


def settled(enc: ColumnEncoding, topic: str) -> tuple[int, str]:
    """:func:`settle`, once per process for the same column settings and topic: a stream's
    driver makes a writer every micro-batch, and each executor meets each topic in every task
    (Confluent's serializers keep what the registry answered too)."""
    key = (enc.registry, enc.column, topic, enc.writer_schema, enc.schema_id, enc.version,
           enc.use_latest, enc.auto_register, enc.subject, enc.strategy, enc.record_name,
           enc.message_name)
    with _SETTLED_LOCK:
        found = _SETTLED.get(key)
    if found is None:
        found = settle(enc, topic)
        with _SETTLED_LOCK:
            _SETTLED[key] = found
    return found


# --- the executors: encode batches -------------------------------------------------------------


class BatchEncoder:
    """Replaces the formatted columns of each Arrow batch with their encoded bytes."""

    def __init__(self, formats: SinkFormats, topic_option: str | None,
                 topic_column: str | None):
        self.formats = formats
        self.topic_option = topic_option
        self.topic_column = topic_column
        self._encoders: dict[tuple, object] = {}

    def _writer(self, enc: ColumnEncoding, topic: str) -> tuple[int | None, str]:
        if enc.registry is None:
            return None, enc.writer_schema
        for t, sid, text in enc.settled:
            if t == topic:
                return sid, text
        return settled(enc, topic)

    def _encoder(self, fmt: str, text: str, arrow_type, column: str, framed: bool):
        key = (fmt, text, arrow_type, framed)
        found = self._encoders.get(key)
        if found is None:
            found = self._encoders[key] = make_encoder(fmt, text, arrow_type, column, framed)
        return found

    def encode_batches(self, batches: Iterable) -> Iterator:
        for batch in batches:
            yield self.encode(batch)

    def encode(self, batch):
        import pyarrow as pa

        from .encoded import EncodeError

        if batch.num_rows == 0:
            return batch
        if self.topic_option is not None:
            topics = None
            groups = {self.topic_option: np.arange(batch.num_rows)}
        else:
            topics = batch.column(self.topic_column)
            uniques = topics.unique().drop_null().to_pylist()
            groups = {}
            for t in uniques:
                rows = np.flatnonzero(np.asarray(
                    pc.equal(topics, t).fill_null(False).to_numpy(
                        zero_copy_only=False)))
                groups[t] = rows
        columns = {}
        for enc in self.formats.columns():
            if enc.column not in batch.schema.names:
                continue
            array = batch.column(enc.column)
            out = None
            ids = np.full(batch.num_rows, -1, dtype=np.int64)
            texts = {}
            for topic, rows in groups.items():
                sid, text = self._writer(enc, topic)
                texts.setdefault(text, []).append(rows)
                if sid is not None:
                    ids[rows] = sid
            pieces = []
            for text, row_sets in texts.items():
                rows = np.sort(np.concatenate(row_sets))
                part = array if len(rows) == batch.num_rows else array.take(pa.array(rows))
                try:
                    body, valid = self._encoder(enc.format, text, array.type, enc.column,
                                                enc.registry is not None).encode_parts(part)
                except (EncodeError, ValueError) as e:
                    where = (f"topic '{self.topic_option}'" if self.topic_option
                             else "the batch's topics")
                    raise ColumnError(f"Column '{enc.column}' can't be written as "
                                      f"{NAMES[enc.format]} to {where}: {e}.") from None
                pieces.append((rows, body, valid))
            out = _assemble(pieces, ids, batch.num_rows, framed=enc.registry is not None)
            columns[enc.column] = out
        if not columns:
            return batch
        arrays = [columns.get(name, batch.column(i)) for i, name in
                  enumerate(batch.schema.names)]
        return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _headers(ids: np.ndarray, valid: np.ndarray):
    """The 5-byte Confluent header (a zero byte, the big-endian schema id) of each valid row,
    as one part."""
    from .encoded import expand, fixed_width

    n = len(ids)
    header = np.zeros((n, 5), dtype=np.uint8)
    header[:, 1:] = ids.astype(">i4").view(np.uint8).reshape(n, 4)
    if valid.all():
        return fixed_width(header)
    return expand(fixed_width(header[valid]), valid)


def _assemble(pieces, ids: np.ndarray, n: int, framed: bool):
    """One binary column from the encoded rows of each writer schema (each piece's body is the
    encoder's parts, not yet joined), framed with each row's schema id. Rows whose topic is null
    are left null (the sink names them).

    With one writer schema for the whole batch (the usual case), the header is one more part
    before the body's, and every byte is copied once, to its place in the column."""
    from .encoded import Encoded, join

    if len(pieces) == 1 and len(pieces[0][0]) == n:
        _, parts, valid = pieces[0]
        if framed:
            parts = [_headers(ids, valid), *parts]
        return join(parts).to_arrow(valid)
    # Put each piece's rows at their places: rows of one piece are in order.
    pieces = [(rows, join(parts), v) for rows, parts, v in pieces]
    lens = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    data_parts = []
    order = np.concatenate([rows for rows, _, _ in pieces]) if pieces else np.zeros(0, int)
    cat_lens = np.concatenate([b.lengths for _, b, _ in pieces]) if pieces else \
        np.zeros(0, int)
    for rows, body, v in pieces:
        data_parts.append(body.data[int(body.offsets[0]):int(body.offsets[-1])])
        valid[rows] = v
    data = np.concatenate(data_parts) if data_parts else np.zeros(0, np.uint8)
    starts = np.concatenate([[0], np.cumsum(cat_lens)])[:-1]
    # gather the rows back into row order
    present = np.zeros(n, dtype=bool)
    present[order] = True
    lens[order] = cat_lens
    src_start = np.zeros(n, dtype=np.int64)
    src_start[order] = starts
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    total = int(offsets[-1])
    index = (np.repeat(src_start - offsets[:-1], lens) + np.arange(total)) if total else \
        np.zeros(0, dtype=np.int64)
    whole = Encoded(offsets, data[index] if total else np.zeros(0, np.uint8))
    valid &= present
    if framed:
        return join([_headers(ids, valid), whole]).to_arrow(valid)
    return whole.to_arrow(valid)
