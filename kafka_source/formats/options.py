"""``valueFormat`` / ``keyFormat`` and their settings: parsed and resolved on the driver.

The reader schema of a formatted column is settled when the query is defined (the DataFrame's
columns must be known then): an inline schema (``valueSchema``), a pinned schema id
(``valueSchemaId``) or subject version (``valueSchemaVersion``), or else the subject's latest
version at that moment. The subject follows ``valueSubjectNameStrategy`` as Confluent's
serializers name it: ``TopicNameStrategy`` (``<topic>-value``, the default),
``RecordNameStrategy`` (``<record name>``, given as ``valueRecordName``) or
``TopicRecordNameStrategy`` (``<topic>-<record name>``); ``valueSubject`` names one outright.
Every subscribed topic must come to the same reader schema: the DataFrame has one type.

The result (:class:`Formats`) is plain, picklable data: the reader schema's text travels inside
every input partition, so executors never ask the registry which schema to *read* with -- only
which schema *wrote* an id they have not seen yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import OptionError
from .registry import (RegistryError, RegistrySettings, RegistryUnavailableError, client_for,
                       registry_settings)

FORMATS = ("binary", "avro", "json", "protobuf")
NOT_YET: dict[str, str] = {}
# The registry's schemaType of each format's schemas, and the format's name in messages.
SCHEMA_TYPES = {"avro": "AVRO", "json": "JSON", "protobuf": "PROTOBUF"}
NAMES = {"avro": "Avro", "json": "JSON Schema", "protobuf": "Protobuf"}
MODES = ("FAILFAST", "PERMISSIVE")
STRATEGIES = {"topicnamestrategy": "TopicNameStrategy",
              "recordnamestrategy": "RecordNameStrategy",
              "topicrecordnamestrategy": "TopicRecordNameStrategy"}


@dataclass(frozen=True)
class ColumnFormat:
    """How one column (``key`` or ``value``) is decoded."""

    column: str
    format: str                       # "avro" | "json"
    reader_schema: str                # the Avro schema text
    registry: RegistrySettings | None  # None: plain Avro bodies, no wire-format header
    source: str                       # where the reader schema came from, for messages
    # Registry ids of the reader schema itself: records written with it are decoded without
    # asking the registry (which may be down by then), as most records of a topic are.
    reader_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Formats:
    value: ColumnFormat | None = None
    key: ColumnFormat | None = None
    mode: str = "FAILFAST"

    @property
    def any(self) -> bool:
        return self.value is not None or self.key is not None

    def columns(self) -> tuple[ColumnFormat, ...]:
        return tuple(c for c in (self.key, self.value) if c is not None)


def option_of(opts: Mapping[str, str], column: str, suffix: str) -> str | None:
    return opts.get(f"{column}{suffix}".lower())


def parse_format(opts: Mapping[str, str], column: str) -> str:
    raw = option_of(opts, column, "Format")
    if raw is None:
        return "binary"
    fmt = raw.strip().lower()
    if fmt in NOT_YET:
        raise OptionError(f"Option '{column}Format': {NOT_YET[fmt]} ('{fmt}') is not supported "
                          f"yet; supported: {', '.join(FORMATS)}.")
    if fmt not in FORMATS:
        raise OptionError(f"Option '{column}Format' must be one of {', '.join(FORMATS)}, got "
                          f"{raw!r}.")
    return fmt


def parse_mode(opts: Mapping[str, str]) -> str:
    raw = opts.get("mode")
    if raw is None:
        return "FAILFAST"
    mode = raw.strip().upper()
    if mode not in MODES:
        raise OptionError(f"Option 'mode' must be FAILFAST or PERMISSIVE, got {raw!r}.")
    return mode


def subjects_for(opts: Mapping[str, str], column: str, topics: Sequence[str] | None
                 ) -> list[str]:
    """The registry subjects whose schemas the column is read with, one per topic (or one)."""
    subject = option_of(opts, column, "Subject")
    if subject:
        return [subject]
    raw = option_of(opts, column, "SubjectNameStrategy") or "TopicNameStrategy"
    strategy = STRATEGIES.get(raw.rsplit(".", 1)[-1].lower())
    if strategy is None:
        raise OptionError(f"Option '{column}SubjectNameStrategy' must be one of "
                          f"{', '.join(STRATEGIES.values())}, got {raw!r}.")
    record = option_of(opts, column, "RecordName")
    if strategy != "TopicNameStrategy" and not record:
        raise OptionError(f"Option '{column}SubjectNameStrategy' {strategy} names subjects by "
                          f"the record's full name: set '{column}RecordName' (e.g. "
                          "'com.example.Order'), or '{column}Subject'.")
    if strategy == "RecordNameStrategy":
        return [record]
    if not topics:
        raise OptionError(f"'{column}Format' with a registry and {strategy}: the subject "
                          "depends on the topic, and 'subscribePattern' names no topics when "
                          f"the query is defined. Set '{column}Subject' or '{column}Schema', or "
                          "use 'subscribe'/'assign'.")
    suffix = column if strategy == "TopicNameStrategy" else record
    return [f"{t}-{suffix}" for t in topics]


_COLUMN_SUFFIXES = ("Schema", "SchemaId", "SchemaVersion", "Subject", "SubjectNameStrategy",
                    "RecordName", "MessageName")


def check_format_options(options: Mapping[str, str]) -> dict[str, str]:
    """Check the format options (lower-cased keys) without asking the registry; return each
    column's format. Called by every parse of source options, so that a bad value fails when
    the query is defined, like any other option."""
    parse_mode(options)
    registry = registry_settings(options)
    formats = {}
    for column in ("key", "value"):
        fmt = formats[column] = parse_format(options, column)
        given = [s for s in _COLUMN_SUFFIXES if option_of(options, column, s) is not None]
        if fmt == "binary":
            if given:
                raise OptionError(f"Option '{column}{given[0]}' is set but '{column}Format' is "
                                  f"binary (the default): set '{column}Format' to avro or "
                                  "json.")
            continue
        if option_of(options, column, "MessageName") is not None and fmt != "protobuf":
            raise OptionError(f"Option '{column}MessageName' is for '{column}Format' protobuf.")
        if option_of(options, column, "Schema") is None and registry is None:
            raise OptionError(f"'{column}Format' {fmt} needs the reader schema: set "
                              "'schema.registry.url' (the schema then comes from the registry) "
                              f"or '{column}Schema' (the {NAMES[fmt]} schema, JSON).")
        if registry is None and set(given) - {"Schema", "MessageName"}:
            raise OptionError(f"Option '{column}"
                              f"{[g for g in given if g not in ('Schema', 'MessageName')][0]}' "
                              "needs 'schema.registry.url'.")
        if option_of(options, column, "SchemaId") is not None and \
                option_of(options, column, "SchemaVersion") is not None:
            raise OptionError(f"Options '{column}SchemaId' and '{column}SchemaVersion' pin the "
                              "reader schema twice: set one of them.")
        if option_of(options, column, "SubjectNameStrategy") is not None:
            subjects_for(options, column, ["t"])      # checks the strategy and record name
    return formats


def resolve_formats(options: Mapping[str, str], topics: Sequence[str] | None) -> Formats:
    """Parse the format options (lower-cased keys) and settle each column's reader schema,
    asking the registry when needed. ``topics``: the subscribed topics, if known."""
    formats = check_format_options(options)
    mode = parse_mode(options)
    registry = RegistrySettings.from_options(options)
    resolved = {}
    for column in ("key", "value"):
        fmt = formats[column]
        if fmt == "binary":
            continue
        inline = option_of(options, column, "Schema")
        ids: tuple[int, ...] = ()
        if inline:
            text, source = inline, f"'{column}Schema'"
            if fmt == "protobuf":
                text = inline_protobuf(inline, option_of(options, column, "MessageName"), column)
        else:
            text, source, ids = _from_registry(options, column, topics, registry, fmt)
        try:
            column_types(fmt, text)
        except ValueError as e:      # AvroSchemaError, JsonSchemaError
            raise OptionError(f"The reader schema of '{column}' ({source}): {e}") from None
        resolved[column] = ColumnFormat(column, fmt, text, registry, source, ids)
    return Formats(value=resolved.get("value"), key=resolved.get("key"), mode=mode)


def column_types(fmt: str, text: str):
    """(Arrow type, Spark type) of a column read with reader schema ``text`` in format
    ``fmt``; raises a ValueError naming what has no type."""
    if fmt == "json":
        from .jsonschema import json_types

        return json_types(text)
    if fmt == "protobuf":
        from .protobuf import protobuf_types

        return protobuf_types(text)
    from .avro import arrow_type, parse_schema, spark_type

    node = parse_schema(text)
    return arrow_type(node), spark_type(node)


def _from_registry(options: Mapping[str, str], column: str, topics: Sequence[str] | None,
                   registry: RegistrySettings, fmt: str) -> tuple[str, str, tuple[int, ...]]:
    """(reader schema text, where it came from, the registry ids it has)."""
    client = client_for(registry)
    schema_id = option_of(options, column, "SchemaId")
    version = option_of(options, column, "SchemaVersion")
    try:
        if schema_id is not None:
            try:
                sid = int(schema_id)
            except ValueError:
                raise OptionError(f"Option '{column}SchemaId' must be a schema id (a number), got "
                                  f"{schema_id!r}.") from None
            found = client.schema_by_id(sid)
            _check_type(found.schema_type, column, fmt, f"schema id {sid}")
            text = found.schema
            if fmt == "protobuf":
                text = registry_protobuf(client, sid, option_of(options, column, "MessageName"))
            return text, f"schema id {sid}", (sid,)
        if version is not None and version != "latest":
            try:
                int(version)
            except ValueError:
                raise OptionError(f"Option '{column}SchemaVersion' must be a version number or "
                                  f"'latest', got {version!r}.") from None
        subjects = subjects_for(options, column, topics)
        texts = {}
        for subject in subjects:
            found = client.version(subject, version or "latest")
            _check_type(found.schema_type, column, fmt, f"subject {subject!r}")
            text = found.schema
            if fmt == "protobuf":
                text = registry_protobuf(client, found.id,
                                         option_of(options, column, "MessageName"))
            texts[subject] = (text, found.id, found.version)
    except RegistryError as e:
        raise OptionError(f"'{column}Format' {fmt}: the reader schema could not be read from the "
                          f"Schema Registry: {e}") from None
    except RegistryUnavailableError as e:
        raise OptionError(f"'{column}Format' {fmt}: {e}") from None
    first_subject, (text, sid, ver) = next(iter(texts.items()))
    want = column_types(fmt, text)[0]
    for subject, (other, osid, over) in texts.items():
        if other != text and column_types(fmt, other)[0] != want:
            raise OptionError(
                f"'{column}Format' {fmt}: the subscribed topics' schemas differ, and a DataFrame "
                f"has one type: subject {first_subject!r} (id {sid}, version {ver}) and "
                f"{subject!r} (id {osid}, version {over}). Read them in separate queries, or set "
                f"'{column}Subject', '{column}SchemaId' or '{column}Schema' to read all of them "
                "with one schema.")
    ids = tuple(sorted({i for other, i, _ in texts.values() if other == text}))
    return text, f"subject {first_subject!r} version {ver} (id {sid})", ids


def registry_protobuf(client, schema_id: int, message: str | None) -> str:
    """A Protobuf reader schema from the registry: the schema's file and the files it imports
    (its references, fetched the same way), serialized, and the message to read."""
    from .protobuf import schema_text

    import base64

    from google.protobuf import descriptor_pb2

    files: list[str] = []
    seen: set[int] = set()

    def add(sid: int, name: str) -> None:
        if sid in seen:
            return
        seen.add(sid)
        encoded, references = client.serialized(sid)
        for ref in references:
            add(client.version(ref["subject"], ref.get("version", "latest")).id, ref["name"])
        # The registry's serialized file may have no name; an importing file names it.
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(encoded))
        if not proto.name:
            proto.name = name
            encoded = base64.b64encode(proto.SerializeToString()).decode()
        files.append(encoded)

    add(schema_id, f"schema-{schema_id}.proto")
    return schema_text(files, message or "")


def inline_protobuf(inline: str, message: str | None, column: str) -> str:
    """``valueSchema`` for Protobuf: a FileDescriptorSet (``protoc --include_imports
    --descriptor_set_out``), base64, as Spark's ``from_protobuf`` takes a descriptor file."""
    import base64
    import binascii

    from google.protobuf import descriptor_pb2

    from .protobuf import schema_text

    try:
        fds = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(inline,
                                                                           validate=True))
    except (binascii.Error, ValueError, Exception):  # noqa: BLE001 - protobuf's DecodeError
        raise OptionError(f"Option '{column}Schema' for Protobuf must be a FileDescriptorSet, "
                          "base64 (protoc --include_imports --descriptor_set_out=FILE, then "
                          "base64 FILE).") from None
    if not fds.file:
        raise OptionError(f"Option '{column}Schema': the FileDescriptorSet has no file.")
    return schema_text([base64.b64encode(f.SerializeToString()).decode() for f in fds.file],
                       message or "")


def _check_type(schema_type: str, column: str, fmt: str, where: str) -> None:
    if (schema_type or "AVRO").upper() != SCHEMA_TYPES[fmt]:
        raise OptionError(f"'{column}Format' is {fmt} but {where} in the Schema Registry is a "
                          f"{schema_type or 'AVRO'} schema.")


def format_columns_spark(formats: Formats):
    """(column name, Spark type) for each formatted column."""
    return {c.column: column_types(c.format, c.reader_schema)[1] for c in formats.columns()}
