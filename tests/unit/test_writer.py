"""The sink's column checks, partition choice and task loop, without a broker.

Column rules are Spark's Kafka sink's (KafkaWriter.validateQuery): ``value`` required and
string/binary, ``key`` string/binary, ``topic`` string unless the option is set, ``partition``
int, ``headers`` array<struct<key:string,value:binary>>; other columns ignored.
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

from kafka_source.errors import TopicError
from kafka_source.schema import HEADER_TYPE, spark_schema
from kafka_source.write.columns import (ColumnError, Columns, as_binary, check_schema,
                                        normalize_headers)
from kafka_source.write.routing import Spreader, choose_partitions, split_by_topic
from kafka_source.write.task import SinkCommitMessage, send_batches


def schema(**cols) -> StructType:
    return StructType([StructField(n, t, True) for n, t in cols.items()])


HEADERS = ArrayType(HEADER_TYPE, True)


# --- schema checks ------------------------------------------------------------------------------

def test_all_columns_found():
    c = check_schema(schema(key=BinaryType(), value=StringType(), topic=StringType(),
                            partition=IntegerType(), headers=HEADERS), None)
    assert c == Columns(value="value", key="key", topic="topic", partition="partition",
                        headers="headers")


def test_topic_option_overrides_and_skips_the_column():
    # As in Spark, the column is not even looked at when the option is set (any type).
    c = check_schema(schema(value=BinaryType(), topic=IntegerType()), "t")
    assert c.topic is None and c.key is None and c.partition is None and c.headers is None


def test_the_source_schema_can_be_written_back():
    # offset, timestamp, timestampType are extra columns: ignored, as Spark does.
    c = check_schema(spark_schema(include_headers=True), None)
    assert (c.key, c.topic, c.partition, c.headers) == ("key", "topic", "partition", "headers")


def test_timestamp_column_is_ignored_with_a_warning(caplog):
    check_schema(schema(value=BinaryType(), timestamp=TimestampType()), "t")
    assert "Column 'timestamp' is ignored" in caplog.text


def error(s: StructType, topic="t") -> str:
    with pytest.raises(ColumnError) as info:
        check_schema(s, topic)
    return str(info.value)


def test_value_required():
    msg = error(schema(key=BinaryType()))
    assert "'value' column" in msg and "key" in msg
    assert "'VALUE'" in error(schema(VALUE=BinaryType())) and "case-sensitive" in \
        error(schema(VALUE=BinaryType()))


@pytest.mark.parametrize("name,dtype,shown,accepted", [
    ("value", IntegerType(), "int", "string or binary"),
    ("key", LongType(), "bigint", "string or binary"),
    ("partition", LongType(), "bigint", "int"),
    ("partition", StringType(), "string", "int"),
    ("headers", ArrayType(StringType()), "array<string>", "array<struct<key:string,value:binary>>"),
    ("headers", ArrayType(StructType([StructField("key", StringType()),
                                      StructField("value", StringType())])),
     "array<struct<key:string,value:string>>", "array<struct<key:string,value:binary>>"),
])
def test_wrong_types_name_column_type_and_accepted(name, dtype, shown, accepted):
    cols = {"value": BinaryType()}
    cols[name] = dtype
    msg = error(schema(**cols))
    assert f"Column '{name}' has type {shown}" in msg and accepted in msg


def test_topic_column_type_and_missing_topic():
    assert "Column 'topic' has type int" in error(schema(value=BinaryType(),
                                                         topic=IntegerType()), None)
    msg = error(schema(value=BinaryType()), None)
    assert "option 'topic'" in msg and "'topic' column" in msg


def test_duplicate_names_use_the_first_column_as_spark():
    s = StructType([StructField("value", BinaryType()), StructField("value", IntegerType())])
    assert check_schema(s, "t").value == "value"


# --- Arrow columns ------------------------------------------------------------------------------

def test_strings_become_binary_without_copy():
    a = pa.array(["a", None, "ccc"])
    b = as_binary(a)
    assert b.type == pa.binary() and b.to_pylist() == [b"a", None, b"ccc"]
    assert b.buffers()[2].address == a.buffers()[2].address
    big = as_binary(pa.array(["x"], pa.large_string()))
    assert big.type == pa.large_binary()
    raw = pa.array([b"k"])
    assert as_binary(raw) is raw


def test_headers_normalized():
    canonical = pa.array([[{"key": "a", "value": b"1"}], None, []],
                         pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    assert normalize_headers(canonical) is canonical
    renamed = canonical.view(pa.list_(pa.struct([("Key", pa.string()), ("VALUE", pa.binary())])))
    assert normalize_headers(renamed).equals(canonical)
    assert normalize_headers(canonical.slice(1)).equals(canonical.slice(1))
    assert normalize_headers(renamed.slice(1)).to_pylist() == [None, []]
    large = canonical.cast(pa.large_list(pa.struct([("key", pa.large_string()),
                                                    ("value", pa.large_binary())])))
    assert normalize_headers(large).equals(canonical)


# --- partition choice ---------------------------------------------------------------------------

def fake_hash(keys, n):
    """Stands for murmur2: the first byte of the key mod n; -1 for a null key."""
    return np.array([-1 if k is None else k[0] % n for k in keys.to_pylist()], dtype=np.int32)


def test_explicit_partition_wins_then_key_then_spread():
    keys = pa.array([b"\x05", b"\x05", None, None, b"\x07"])
    explicit = pa.array([2, None, 1, None, None], pa.int32())
    sp = Spreader(random.Random(0))
    parts = choose_partitions("t", 4, keys, explicit, sp, fake_hash)
    assert parts.dtype == np.int32
    assert parts[0] == 2           # explicit, although the key says 1
    assert parts[1] == 1           # key 5 % 4
    assert parts[2] == 1           # explicit for a null key
    assert 0 <= parts[3] < 4       # no partition, no key: spread
    assert parts[4] == 3           # key 7 % 4


def test_spread_is_even_and_rotates_across_batches():
    sp = Spreader(random.Random(1))
    counts = np.zeros(3, dtype=int)
    for size in (1, 2, 5, 7, 1000, 1):
        np.add.at(counts, sp.spread("t", size, 3), 1)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 1016
    # per topic: a second topic has its own rotation and partition count
    assert set(sp.spread("u", 5, 5)) == {0, 1, 2, 3, 4}


def test_many_tasks_do_not_all_start_at_partition_zero():
    firsts = {int(Spreader().spread("t", 1, 8)[0]) for _ in range(200)}
    assert len(firsts) > 1


@pytest.mark.parametrize("value,expect", [(5, "is 5 in row 1, but topic 't' has 3 partitions"),
                                          (-1, "is -1 in row 1")])
def test_partition_out_of_range_names_row_topic_and_count(value, expect):
    with pytest.raises(TopicError, match=expect):
        choose_partitions("t", 3, None, pa.array([0, value], pa.int32()), Spreader(), fake_hash)


def test_split_by_topic():
    assert split_by_topic(pa.array(["a", "a"])) == [("a", None)]
    groups = split_by_topic(pa.array(["b", "a", "b", "c", "a"]))
    assert [(t, list(r)) for t, r in groups] == [("b", [0, 2]), ("a", [1, 4]), ("c", [3])]
    with pytest.raises(ColumnError, match="null in row 12 "):
        split_by_topic(pa.array(["a", "b", None]), row_offset=10)


# --- the task loop ------------------------------------------------------------------------------

class FakeProducer:
    def __init__(self, partitions):
        self.partitions = partitions
        self.sent = []

    def partition_count(self, topic):
        if topic not in self.partitions:
            raise TopicError(f"Topic '{topic}' does not exist")
        return self.partitions[topic]

    def send(self, topic, partitions, values, keys, headers):
        assert values.type == pa.binary() and (keys is None or keys.type == pa.binary())
        assert len(partitions) == len(values)
        for i in range(len(values)):
            self.sent.append((topic, int(partitions[i]), values[i].as_py(),
                              None if keys is None else keys[i].as_py(),
                              None if headers is None else headers[i].as_py()))


def test_rows_routed_by_topic_column_and_key():
    p = FakeProducer({"a": 2, "b": 3})
    cols = Columns(value="value", key="key", topic="topic", headers="headers")
    hdr = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.record_batch({
        "value": pa.array(["v0", "v1", None, "v3"]),
        "key": pa.array([b"\x01", None, b"\x02", b"\x04"]),
        "topic": pa.array(["a", "b", "b", "a"]),
        "headers": pa.array([None, [{"key": "h", "value": b"x"}], [], None], hdr),
        "offset": pa.array([1, 2, 3, 4], pa.int64()),  # extra column: ignored
    })
    rows = send_batches([batch, batch.slice(0, 0)], p, cols, None, fake_hash, Spreader())
    assert rows == 4
    by_value = {s[2]: s for s in p.sent}
    assert by_value[b"v0"][:2] == ("a", 1) and by_value[b"v3"][:2] == ("a", 0)
    assert by_value[None][:2] == ("b", 2) and by_value[None][3] == b"\x02"  # tombstone, keyed
    assert by_value[b"v1"][0] == "b" and by_value[b"v1"][4] == [{"key": "h", "value": b"x"}]


def test_topic_option_overrides_column_and_unknown_topic_fails():
    p = FakeProducer({"opt": 1})
    batch = pa.record_batch({"value": pa.array([b"x"]), "topic": pa.array(["other"])})
    send_batches([batch], p, Columns(), "opt", fake_hash)
    assert p.sent == [("opt", 0, b"x", None, None)]
    with pytest.raises(TopicError, match="'nope'"):
        send_batches([batch], FakeProducer({}), Columns(), "nope", fake_hash)


def test_null_topic_row_counted_across_batches():
    p = FakeProducer({"a": 1})
    cols = Columns(topic="topic")
    b1 = pa.record_batch({"value": pa.array([b"1", b"2"]), "topic": pa.array(["a", "a"])})
    b2 = pa.record_batch({"value": pa.array([b"3"]), "topic": pa.array([None], pa.string())})
    with pytest.raises(ColumnError, match="null in row 2 "):
        send_batches([b1, b2], p, cols, None, fake_hash)


def test_commit_message_pickles_small():
    m = SinkCommitMessage(task=3, records=(("t", 0, 10), ("t", 1, 5)))
    again = pickle.loads(pickle.dumps(m))
    assert again == m and again.total == 15 and len(pickle.dumps(m)) < 400


# --- the exactly-once marker --------------------------------------------------------------------

def test_marker_round_trips_and_stays_small():
    from kafka_source.write.exactly_once import MarkerEntry, decode_marker, encode_marker

    entries = [(0, 1000, 3), (1, 1001, 3), (5, 999, 4), (6, 2 ** 40, 32767)]
    assert decode_marker(encode_marker(7, entries)) == (7, [MarkerEntry(*e) for e in entries])
    assert decode_marker(encode_marker(0, [])) == (0, [])
    # With digests, and a repair round whose tasks repeat task numbers of the first run.
    rng = random.Random(3)
    mixed = [MarkerEntry(0, 1000, 3, rng.randbytes(8)), MarkerEntry(2, 1002, 3, None),
             MarkerEntry(0, 2000, 0, rng.randbytes(8), 1), MarkerEntry(2, 1999, 0, rng.randbytes(8), 1),
             MarkerEntry(1, 2001, 1, rng.randbytes(8), 2)]
    assert decode_marker(encode_marker(9, reversed(mixed))) == (9, mixed)
    # Producer ids of one query's tasks are close together (the broker hands them out in
    # blocks) and the epochs equal: a few bytes per task plus its digest, so 200 tasks (Spark's
    # default shuffle partitions) fit the broker's default offset.metadata.max.bytes (4096);
    # without digests, 700 do.
    many = [MarkerEntry(t, 50_000 + rng.randrange(2000), 1000 + rng.randrange(3),
                        rng.randbytes(8)) for t in range(200)]
    text = encode_marker(123_456, many)
    assert len(text) < 4096 and decode_marker(text) == (123_456, many)
    bare = [e._replace(task=t, digest=None) for t, e in enumerate(many * 4)][:700]
    text = encode_marker(123_456, bare)
    assert len(text) < 4096 and decode_marker(text) == (123_456, bare)
    with pytest.raises(ValueError):
        decode_marker("something else")


def test_marker_of_the_first_version_is_read():
    # A query upgraded while its last micro-batch's commit was recorded by the version before.
    import base64
    import zlib

    from kafka_source.write.exactly_once import MarkerEntry, decode_marker

    raw = bytes([7, 0, 0xd0, 0x0f, 6, 3, 2, 2])   # batch 7; tasks 0 and 4; pid 1000, 1001
    assert decode_marker("pk1:" + base64.b64encode(b"r" + raw).decode()) == \
        (7, [MarkerEntry(0, 1000, 3), MarkerEntry(4, 1001, 4)])
    packed = base64.b64encode(b"z" + zlib.compress(raw)).decode()
    assert decode_marker("pk1:" + packed)[1][1] == MarkerEntry(4, 1001, 4)


def _digest_of(*groups):
    from kafka_source.write.digest import RowsDigest

    d = RowsDigest()
    for g in groups:
        d.update(*g)
    return d.digest()


def test_rows_digest_knows_the_same_rows_again_and_nothing_else():
    import pyarrow as pa

    from kafka_source.write.columns import as_binary

    values = pa.array([b"a", None, b"ccc", b""], pa.binary())
    keys = pa.array(["k1", "k2", None, "k4"])
    same = _digest_of(("t", values, as_binary(keys)))
    # Rebuilt, sliced out of a larger array, or as large binary: the same rows.
    wider = pa.array([b"zz", b"a", None, b"ccc", b"", b"yy"], pa.binary()).slice(1, 4)
    assert _digest_of(("t", wider, pa.array([b"k1", b"k2", None, b"k4"]))) == same
    assert _digest_of(("t", values.cast(pa.large_binary()),
                       keys.cast(pa.large_string()).view(pa.large_binary()))) == same
    # Any change of a value, a key, a null, the topic, the order: another digest.
    others = [
        ("t", pa.array([b"a", None, b"ccd", b""]), as_binary(keys)),
        ("t", pa.array([b"a", b"", b"ccc", b""]), as_binary(keys)),
        ("t", values, pa.array([b"k1", b"k2", b"", b"k4"])),
        ("t", values, None),
        ("u", values, as_binary(keys)),
        ("t", pa.array([b"", b"ccc", None, b"a"]), pa.array([b"k4", None, b"k2", b"k1"])),
        ("t", pa.array([b"a", None, b"cc", b"c"]), as_binary(keys)),   # bytes moved across rows
    ]
    digests = {_digest_of(g) for g in others}
    assert same not in digests and len(digests) == len(others)
    # Headers and an explicit partition column count too.
    headers = pa.array([[{"key": "h", "value": b"1"}], None, [], [{"key": "h", "value": None}]],
                       pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    with_headers = _digest_of(("t", values, None, headers))
    assert with_headers != _digest_of(("t", values, None))
    longer = pa.array([[{"key": "x", "value": b"y"}]] + headers.to_pylist(), headers.type)
    assert with_headers == _digest_of(("t", values, None, longer.slice(1)))
    assert with_headers != _digest_of(("t", values, None, longer.slice(0, 4)))
    assert _digest_of(("t", values, None, None, pa.array([0, 1, 0, None], pa.int32()))) != \
        _digest_of(("t", values, None, None, pa.array([0, 1, 0, 1], pa.int32())))


def test_exactly_once_repair_writes_again_exactly_the_rows_not_committed():
    from kafka_source.write.exactly_once import MarkerEntry, _outstanding, _Repair

    d = [bytes([i]) * 8 for i in range(6)]
    first = [MarkerEntry(0, 10, 0, d[0]), MarkerEntry(1, 11, 0, d[1]), MarkerEntry(2, 12, 0, d[2]),
             MarkerEntry(3, 13, 0, d[3])]
    fates = [True, False, True, False]
    assert _outstanding(first, fates) == [first[1], first[3]]
    r = _Repair(first, fates, task=0)
    assert r.round == 1
    assert r.committed(d[0]) and not r.committed(d[1]) and r.committed(d[2])
    assert not r.committed(d[5])                          # rows never seen: write them
    # A task holding what another task number wrote: recognised by the digest alone.
    assert _Repair(first, fates, task=3).committed(d[2])
    assert not _Repair(first, fates, task=3).committed(d[3])
    # The same rows committed in one slot and aborted in another (two tasks with identical
    # rows): the slot that was aborted writes them again, another one too rather than lose them.
    twins = [MarkerEntry(0, 10, 0, d[4]), MarkerEntry(1, 11, 0, d[4])]
    assert _Repair(twins, [True, False], task=0).committed(d[4])
    assert not _Repair(twins, [True, False], task=1).committed(d[4])
    assert not _Repair(twins, [True, False], task=2).committed(d[4])
    # After a repair round: task 1's rows were written again and committed; task 3's again
    # aborted. The next round writes task 3's rows only.
    second = first + [MarkerEntry(1, 21, 0, d[1], 1), MarkerEntry(3, 23, 0, d[3], 1)]
    fates2 = fates + [True, False]
    assert _outstanding(second, fates2) == [second[5]]
    assert _Repair(second, fates2, task=1).committed(d[1])
    assert not _Repair(second, fates2, task=3).committed(d[3])
    assert _Repair(second, fates2, task=3).round == 2
    # A repair that committed everything: nothing is outstanding, the batch is complete.
    assert _outstanding(second, fates + [True, True]) == []
    # Without digests nothing can be recognised: every row is written again.
    bare = [e._replace(digest=None) for e in first]
    assert not _Repair(bare, fates, task=0).committed(d[0])


def test_transactional_ids_and_marker_group_follow_from_prefix_query_and_task():
    from kafka_source.write.exactly_once import marker_group, transactional_id

    assert transactional_id("app", "q-1", 3) == "app-q-1-3"
    assert marker_group("app", "q-1") == "app-q-1"


# --- a writer per micro-batch (issue 18 item 5) --------------------------------------------------

def test_a_writer_per_micro_batch_checks_the_topic_and_warns_once(monkeypatch, caplog):
    # A streaming query makes a new writer for every micro-batch and its commit: the topic is
    # looked up once (not once a trigger), and a warning about an option or a column is
    # logged once.
    import kafka_source.wire.net.client as client_module
    from kafka_source.write import writer as writer_module
    from kafka_source.wire.net.client import PartitionInfo, TopicInfo

    asked = []

    class Client:
        bootstrap_servers = "h:1"
        request_timeout_ms = 1000

        def __init__(self, config):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def topic_metadata(self, topics, retries):
            asked.append(list(topics))
            return {t: TopicInfo(t, 0, {0: PartitionInfo(1, 0)}) for t in topics}

    monkeypatch.setattr(client_module, "BrokerClient", Client)
    monkeypatch.setattr(writer_module, "_TOPICS_SEEN", {})
    options = {"kafka.bootstrap.servers": "h:1", "topic": "out", "kafka.group.id": "g"}
    s = schema(value=BinaryType(), timestamp=TimestampType())
    for _ in range(3):
        writer_module.make_writer(options, s, False, streaming=True)
    assert asked == [["out"]]
    assert caplog.text.count("have no effect on a write") == 1
    assert caplog.text.count("Column 'timestamp' is ignored") == 1
    writer_module.make_writer({**options, "topic": "other"}, s, False, streaming=True)
    assert asked == [["out"], ["other"]]


# --- exactly-once and speculative execution (issue 18 item 3) -----------------------------------

class FakeTaskContext:
    def __init__(self, **local):
        self.local = {"sql.streaming.queryId": "q-1", "streaming.sql.batchId": "0", **local}

    def getLocalProperty(self, key):
        return self.local.get(key)

    def partitionId(self):
        return 0


@pytest.mark.parametrize("speculation,rejected", [
    ("true", True), (" TRUE ", True), ("false", False), (None, False)])
def test_exactly_once_task_rejects_speculative_execution(monkeypatch, speculation, rejected):
    # The driver's Python worker has no SparkSession; the task sees the session's SQL conf
    # (with every spark.* setting of the SparkConf) as local properties.
    from kafka_source.config.sink_options import parse_sink_options
    from kafka_source.errors import OptionError
    from kafka_source.write import exactly_once
    from kafka_source.write import writer as writer_module

    local = {} if speculation is None else {"spark.speculation": speculation}
    monkeypatch.setattr(writer_module, "_task_context", lambda: FakeTaskContext(**local))
    written = []
    monkeypatch.setattr(exactly_once, "write_exactly_once",
                        lambda *a, **kw: written.append(kw) or "message")
    options = parse_sink_options({"kafka.bootstrap.servers": "h:1", "topic": "out",
                                  "exactlyOnce": "true"})
    w = writer_module.KafkaStreamWriter(options, Columns())
    if not rejected:
        assert w.write(iter([])) == "message"
        assert written == [{"query_id": "q-1", "batch_id": 0, "task": 0}]
        return
    with pytest.raises(OptionError) as info:
        w.write(iter([]))
    assert "spark.speculation" in str(info.value) and "'exactlyOnce'" in str(info.value)
    assert written == []            # nothing touched Kafka
    # At-least-once writes do not care: a speculative copy just writes its rows again.
    at_least_once = writer_module.KafkaStreamWriter(
        parse_sink_options({"kafka.bootstrap.servers": "h:1", "topic": "out"}), Columns())
    monkeypatch.setattr("kafka_source.write.task.write_task", lambda *a: "plain")
    assert at_least_once.write(iter([])) == "plain"


# --- exactly-once on an ACL-secured cluster (issue 18 item 3) -----------------------------------

class AclCluster:
    """A BrokerClient stand-in with Kafka's authorization of FindCoordinator (DESCRIBE on the
    group, implied by READ), OffsetCommit (READ on the group, then READ on each topic, then
    UNKNOWN_TOPIC_OR_PARTITION for partitions the topic does not have) and Metadata."""

    group_prefixes: tuple = ()
    readable_topics: tuple = ()
    sent: list = []

    def __init__(self, config):
        pass

    bootstrap_servers = "h:1"
    request_timeout_ms = 1000

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def close(self):
        pass

    def topic_metadata(self, topics, retries):
        from kafka_source.wire.net.client import PartitionInfo, TopicInfo

        return {t: TopicInfo(t, 0, {0: PartitionInfo(1, 0)}) for t in topics}

    def _group_ok(self, group):
        return any(group.startswith(p) for p in self.group_prefixes)

    def find_coordinator(self, group):
        import kafka.errors as Errors

        if not self._group_ok(group):
            raise Errors.GroupAuthorizationFailedError(f"FindCoordinator for group '{group}'")
        return 1

    def send(self, node, request):
        from types import SimpleNamespace as NS

        AclCluster.sent.append(request)
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                code = (30 if not self._group_ok(request.group_id)          # GROUP_AUTH...
                        else 29 if t.name not in self.readable_topics       # TOPIC_AUTH...
                        else 3 if p.partition_index not in (0,) else 0)      # UNKNOWN_TOPIC...
                parts.append(NS(partition_index=p.partition_index, error_code=code))
            topics.append(NS(name=t.name, partitions=parts))
        return NS(topics=topics)


@pytest.fixture
def acl_cluster(monkeypatch):
    import kafka_source.wire.net.client as client_module
    from kafka_source.write import writer as writer_module

    monkeypatch.setattr(client_module, "BrokerClient", AclCluster)
    monkeypatch.setattr(writer_module, "_TOPICS_SEEN", {})
    monkeypatch.setattr(writer_module, "_MARKER_ACCESS_SEEN", {})
    monkeypatch.setattr(AclCluster, "sent", [])
    return AclCluster


EOS = {"kafka.bootstrap.servers": "h:1", "topic": "out", "exactlyOnce": "true",
       "kafka.transactional.id": "app"}


def test_exactly_once_writer_checks_read_on_the_topic_the_marker_is_committed_on(acl_cluster):
    # Kafka authorizes the marker's OffsetCommit with READ on the topic too: checked when the
    # writer is made, naming the missing ACL, instead of failing every micro-batch's commit.
    from kafka_source.write.exactly_once import MarkerAccessError
    from kafka_source.write.writer import make_writer

    acl_cluster.group_prefixes = ("app",)
    acl_cluster.readable_topics = ()
    with pytest.raises(MarkerAccessError) as info:
        make_writer(EOS, schema(value=BinaryType()), False, streaming=True)
    text = str(info.value)
    assert "Missing ACL: READ on Topic 'out'" in text and "--operation Read --topic 'out'" in text
    assert (info.value.operation, info.value.resource_type, info.value.resource_name) == \
        ("READ", "Topic", "out")
    # What was sent commits nothing: partition -1 of the topic, for a stand-in of the group.
    [probe] = acl_cluster.sent
    assert probe.group_id == "app-00000000-0000-0000-0000-000000000000"
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in probe.topics] == \
        [("out", [-1])]

    acl_cluster.readable_topics = ("out",)
    make_writer(EOS, schema(value=BinaryType()), False, streaming=True)
    assert len(acl_cluster.sent) == 2
    make_writer(EOS, schema(value=BinaryType()), False, streaming=True)   # next micro-batch
    assert len(acl_cluster.sent) == 2                                    # checked once
    # At-least-once writes commit no marker: nothing to check.
    make_writer({"kafka.bootstrap.servers": "h:1", "topic": "other"},
                schema(value=BinaryType()), False, streaming=True)
    assert len(acl_cluster.sent) == 2


def test_exactly_once_writer_only_warns_when_the_stand_in_group_is_not_readable(acl_cluster,
                                                                               caplog):
    # READ on this query's own group only (a literal ACL) would make the query work: the
    # check, which does not know the query id, does not fail it for that.
    from kafka_source.write.writer import make_writer

    acl_cluster.group_prefixes = ()
    make_writer(EOS, schema(value=BinaryType()), False, streaming=True)
    assert "Could not check that this principal may commit the exactly-once marker on topic " \
           "'out'" in caplog.text
    assert "READ on Group 'app-00000000-0000-0000-0000-000000000000'" in caplog.text


def test_marker_commit_without_read_on_the_topic_names_the_missing_acl(acl_cluster):
    # A topic column: the marker's topic is known at the commit only.
    from kafka_source.write.exactly_once import MarkerAccessError, MarkerStore

    acl_cluster.group_prefixes = ("app",)
    acl_cluster.readable_topics = ("a",)
    with MarkerStore({}, "app-q") as store:
        store.commit({("a", 0): (1, "m")})
        with pytest.raises(MarkerAccessError, match="Missing ACL: READ on Topic 'b'"):
            store.commit({("b", 0): (1, "m")})


# --- a checkpoint older than the marker (issue 18 item 3, D) ------------------------------------

@pytest.mark.parametrize("committed,batch,outcome", [
    (5, 4, "skipped"),           # the normal re-run of the last batch after a crash
    (5, 5, "written"),           # the next batch
    (0, 0, "written"),
    (5, 3, "behind"),            # an older checkpoint: batches 3 and 4 would be skipped
    (9, 0, "behind")])
def test_exactly_once_task_refuses_a_checkpoint_older_than_the_marker(monkeypatch, committed,
                                                                      batch, outcome):
    from kafka_source.config.sink_options import parse_sink_options
    from kafka_source.write import exactly_once, producer

    class Store:
        group = "app-q"
        client = None

        def __init__(self, config, group):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def fetch(self):
            # The marker of batch committed - 1, with no transaction (nothing was written).
            return {("out", 0): (committed, exactly_once.encode_marker(committed - 1, []))} \
                if committed else {}

        def committed_batches(self, offsets):
            return committed

    class Written(Exception):
        pass

    def no_producer(*a, **kw):
        raise Written()

    monkeypatch.setattr(exactly_once, "MarkerStore", Store)
    monkeypatch.setattr(producer, "Producer", no_producer)
    options = parse_sink_options({"kafka.bootstrap.servers": "h:1", "topic": "out",
                                  "exactlyOnce": "true", "kafka.transactional.id": "app"})
    run = lambda: exactly_once.write_exactly_once(  # noqa: E731
        options, Columns(), iter([]), query_id="q", batch_id=batch, task=0)
    if outcome == "skipped":
        assert run().skipped
    elif outcome == "written":
        with pytest.raises(Written):
            run()
    else:
        with pytest.raises(exactly_once.CheckpointBehindMarkerError) as info:
            run()
        text = str(info.value)
        assert f"micro-batches {batch} to {committed - 1} would be skipped" in text
        assert "'app-q'" in text and "'kafka.transactional.id'" in text
        assert "new checkpoint location" in text
