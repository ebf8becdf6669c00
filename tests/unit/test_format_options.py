"""valueFormat/keyFormat options and the Schema Registry client, against a stub registry on
loopback (the real one, Karapace, runs in tests/integration/test_schema_registry.py)."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kafka_source.errors import OptionError
from kafka_source.formats.options import check_format_options, resolve_formats, subjects_for
from kafka_source.formats.registry import RegistryClient, RegistrySettings

STRING = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]})
LONG = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})


class StubRegistry:
    """Subjects -> [(id, schema)], answered as Confluent's registry answers."""

    def __init__(self, subjects: dict[str, list[tuple[int, str]]], fail_first: int = 0):
        self.subjects = subjects
        self.requests: list[tuple[str, str | None]] = []
        self.fail_first = fail_first
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                stub.requests.append((self.path, self.headers.get("Authorization")))
                if stub.fail_first > 0:
                    stub.fail_first -= 1
                    return self._answer(503, {"error_code": 50003, "message": "not ready"})
                parts = self.path.strip("/").split("/")
                if parts[:2] == ["schemas", "ids"]:
                    for versions in stub.subjects.values():
                        for sid, schema, *kind in versions:
                            if sid == int(parts[2]):
                                return self._answer(200, {"schema": schema, **(
                                    {"schemaType": kind[0]} if kind else {})})
                    return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
                if parts[0] == "subjects" and parts[2] == "versions":
                    versions = stub.subjects.get(parts[1])
                    if versions is None:
                        return self._answer(404, {"error_code": 40401,
                                                  "message": f"Subject '{parts[1]}' not found."})
                    v = len(versions) if parts[3] == "latest" else int(parts[3])
                    sid, schema, *_ = versions[v - 1]
                    return self._answer(200, {"subject": parts[1], "version": v, "id": sid,
                                              "schema": schema})
                return self._answer(404, {"error_code": 404, "message": "?"})

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = StubRegistry({"t1-value": [(1, STRING), (4, LONG)], "t2-value": [(2, STRING)],
                      "t3-value": [(3, LONG)], "com.x.R": [(5, STRING)],
                      "p-value": [(6, 'syntax = "proto3"; message M { int64 a = 1; }',
                                   "PROTOBUF")]})
    yield s
    s.close()


@pytest.mark.parametrize("opts,match", [
    ({"valueformat": "xml"}, "must be one of binary, avro"),
    ({"valueformat": "protobuf"}, "needs the reader schema"),
    ({"valueformat": "avro", "valuemessagename": "x.Y", "valueschema": "{}"},
     "'valueMessageName' is for 'valueFormat' protobuf"),
    ({"valueschema": "{}"}, "'valueSchema' is set but 'valueFormat' is binary"),
    ({"valueformat": "avro"}, "needs the reader schema"),
    ({"valueformat": "avro", "schema.registry.url": "registry:8081"}, "not an http"),
    ({"keyformat": "avro", "keyschemaid": "1", "keyschema": "{}"}, "needs 'schema.registry.url'"),
    ({"valueformat": "avro", "schema.registry.url": "http://r", "valueschemaid": "1",
      "valueschemaversion": "2"}, "pin the reader schema twice"),
    ({"valueformat": "avro", "schema.registry.url": "http://r",
      "valuesubjectnamestrategy": "RecordNameStrategy"}, "set 'valueRecordName'"),
    ({"valueformat": "avro", "schema.registry.url": "http://r",
      "valuesubjectnamestrategy": "Nope"}, "must be one of TopicNameStrategy"),
    ({"mode": "DROPMALFORMED"}, "FAILFAST or PERMISSIVE"),
    ({"schema.registry.basic.auth.user.info": "u:p"}, "'schema.registry.url' is not"),
    ({"schema.registry.url": "http://r", "schema.registry.basic.auth.user.info": "nopass"},
     "'user:password'"),
    ({"schema.registry.url": "http://r", "schema.registry.retry.ms": "-5"}, "positive"),
])
def test_bad_format_options_are_named(opts, match):
    with pytest.raises(OptionError, match=match):
        check_format_options(opts)


def test_subject_name_strategies():
    base = {"schema.registry.url": "http://r"}
    assert subjects_for(base, "value", ["a", "b"]) == ["a-value", "b-value"]
    assert subjects_for(base, "key", ["a"]) == ["a-key"]
    rec = {**base, "valuerecordname": "com.x.R"}
    assert subjects_for({**rec, "valuesubjectnamestrategy": "RecordNameStrategy"}, "value",
                        ["a", "b"]) == ["com.x.R"]
    assert subjects_for({**rec, "valuesubjectnamestrategy":
                         "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy"},
                        "value", ["a"]) == ["a-com.x.R"]
    assert subjects_for({**base, "valuesubject": "s"}, "value", None) == ["s"]
    with pytest.raises(OptionError, match="subscribePattern"):
        subjects_for(base, "value", None)


def test_reader_schema_latest_pinned_and_shared_across_topics(stub):
    base = {"valueformat": "avro", "schema.registry.url": stub.url}
    f = resolve_formats(base, ["t1"])
    assert f.value.reader_schema == LONG and "version 2 (id 4)" in f.value.source
    assert resolve_formats({**base, "valueschemaversion": "1"}, ["t1"]).value.reader_schema \
        == STRING
    assert resolve_formats({**base, "valueschemaid": "3"}, ["t1"]).value.reader_schema == LONG
    assert resolve_formats(base, ["t1", "t3"]).value.reader_schema == LONG   # same schema
    with pytest.raises(OptionError, match="schemas differ.*'t1-value'.*'t2-value'"):
        resolve_formats(base, ["t1", "t2"])
    with pytest.raises(OptionError, match="Subject 'nope-value' not found"):
        resolve_formats(base, ["nope"])
    rec = resolve_formats({**base, "valuesubjectnamestrategy": "RecordNameStrategy",
                           "valuerecordname": "com.x.R"}, None)
    assert rec.value.reader_schema == STRING and rec.key is None


def test_records_written_with_the_reader_schema_need_no_request(stub):
    """The reader schema's registry ids travel with it: an executor decodes records written
    with it without asking the registry (which may be down by then)."""
    import pyarrow as pa

    from kafka_source.formats.columns import _decoder

    base = {"valueformat": "avro", "schema.registry.url": stub.url}
    f = resolve_formats(base, ["t1", "t3"])       # the same LONG schema under ids 4 and 3
    assert f.value.reader_ids == (3, 4)
    assert resolve_formats({**base, "valueschemaid": "3"}, ["t1"]).value.reader_ids == (3,)
    stub.close()                                  # the registry is gone
    decoder = _decoder(f.value)
    body = bytes([0x54])                          # long 42, zig-zag
    values = pa.array([b"\x00" + i.to_bytes(4, "big") + body for i in (3, 4)])
    decoded = decoder.decode(values)
    assert not decoded.bad.any() and decoded.array.to_pylist() == [{"a": 42}, {"a": 42}]


def test_a_record_written_with_a_schema_of_another_type_is_a_clear_error(stub):
    """An Avro column whose record names a Protobuf schema's id (a producer that switched
    serializers): the row's reason says so, instead of parsing Protobuf text as Avro or
    calling the schema missing; an id the registry does not have is called missing."""
    import pyarrow as pa

    from kafka_source.formats.columns import _decoder

    f = resolve_formats({"valueformat": "avro", "schema.registry.url": stub.url}, ["t1"])
    decoder = _decoder(f.value)
    values = pa.array([b"\x00" + (i).to_bytes(4, "big") + bytes([0x54]) for i in (6, 9, 4)])
    decoded = decoder.decode(values)
    assert decoded.bad.tolist() == [True, True, False]
    assert decoded.reasons[0] == ("schema id 6 cannot be used (it is a PROTOBUF schema, not "
                                  "Avro)")
    assert decoded.reasons[1].startswith("schema id 9 is not in the registry (Schema Registry ")
    assert "HTTP 404" in decoded.reasons[1]
    assert decoded.array.to_pylist()[2] == {"a": 42}


def test_registry_retries_server_errors_then_answers(stub):
    stub.fail_first = 2
    client = RegistryClient(RegistrySettings.from_options({"schema.registry.url": stub.url}))
    assert client.schema_by_id(2).schema == STRING
    assert len(stub.requests) == 3
    client.schema_by_id(2)
    assert len(stub.requests) == 3        # by id: cached


def test_registry_down_is_a_bounded_error_naming_the_url():
    settings = RegistrySettings.from_options({"schema.registry.url": "http://127.0.0.1:9",
                                              "schema.registry.retry.ms": "300"})
    with pytest.raises(OptionError, match=r"http://127\.0\.0\.1:9 did not answer"):
        resolve_formats({"valueformat": "avro", "schema.registry.url": "http://127.0.0.1:9",
                         "schema.registry.retry.ms": "300"}, ["t"])
    assert settings.retry_ms == 300


def test_basic_auth_is_sent_and_never_shown(stub):
    opts = {"valueformat": "avro", "schema.registry.url": stub.url,
            "schema.registry.basic.auth.user.info": "alice:s3cr3t"}
    f = resolve_formats(opts, ["t2"])
    assert stub.requests[-1][1] == "Basic " + base64.b64encode(b"alice:s3cr3t").decode()
    assert "s3cr3t" not in repr(f) and "s3cr3t" not in str(f.value.registry)


def test_spark_schema_with_formats():
    from kafka_source.formats.options import ColumnFormat, Formats
    from kafka_source.schema import spark_schema

    fmt = ColumnFormat("value", "avro", STRING, None, "'valueSchema'")
    names = spark_schema(False, Formats(value=fmt, mode="PERMISSIVE")).names
    assert names[-1] == "valueError" and "keyError" not in names
    st = spark_schema(True, Formats(value=fmt))
    assert st["value"].dataType.names == ["a"] and st.names[-1] == "headers"
