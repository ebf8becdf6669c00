"""The option catalog (kafka_source/config/catalog.py) against the parsers that read the options.

The documentation's option reference is rendered from the catalog, so these tests hold the
reference to the code: every name a parser reads or accepts has an entry, and every entry is
read (or accepted, or refused) by the parsers in each scope its entry names.
"""

from __future__ import annotations

import logging

import pytest

from kafka_source.config import catalog, client_config, oauthbearer
from kafka_source.config import options as options_module
from kafka_source.config import sink_options
from kafka_source.errors import OptionError

pytestmark = pytest.mark.pyspark_free

BASE = {"read": {"kafka.bootstrap.servers": "h:1", "subscribe": "t1"},
        "stream": {"kafka.bootstrap.servers": "h:1", "subscribe": "t1"},
        "write": {"kafka.bootstrap.servers": "h:1"}}
SUBSCRIPTIONS = {"subscribe", "subscribepattern", "assign"}
# What a parser says of a name it does not take: none may be said of an entry in its scopes.
NOT_TAKEN = ("not known to pykafka", "not an option of pykafka", "have no effect on")


class Recording(dict):
    """A dict that remembers every key looked up in it."""

    def __init__(self, *args, seen: set[str]):
        super().__init__(*args)
        self.seen = seen

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


@pytest.fixture
def looked_up(monkeypatch):
    """The keys the parsers look up, by parse."""
    seen: set[str] = set()

    def lower(options):
        return Recording({str(k).lower(): v for k, v in options.items()}, seen=seen)

    monkeypatch.setattr(options_module, "_lower_keys", lower)
    monkeypatch.setattr(sink_options, "_lower_keys", lower)
    return seen


def parse(scope: str, opts: dict[str, str]):
    if scope == "read":
        return options_module.parse_batch_options(opts)
    if scope == "stream":
        return options_module.parse_stream_options(opts)
    return sink_options.parse_sink_options(opts, streaming=True)


def options_for(entry: catalog.Option, scope: str) -> dict[str, str]:
    base = dict(BASE[scope])
    if entry.key in SUBSCRIPTIONS:
        base.pop("subscribe")
    return {**base, **entry.requires, entry.name: entry.example}


CASES = [pytest.param(e, s, id=f"{s}-{e.name}") for e in catalog.OPTIONS for s in e.scopes]


@pytest.mark.parametrize("entry,scope", CASES)
def test_each_entry_behaves_in_its_scopes_as_the_reference_says(entry, scope, looked_up,
                                                                caplog):
    sink_options.OncePerProcess.forget_all()
    opts = options_for(entry, scope)
    with caplog.at_level(logging.WARNING):
        if entry.status == catalog.REFUSED:
            with pytest.raises(OptionError, match=f"'{entry.name}'"):
                parse(scope, opts)
            return
        parse(scope, opts)
    said = [r.getMessage() for r in caplog.records
            if any(phrase in r.getMessage() for phrase in NOT_TAKEN)]
    assert not [m for m in said if f"'{entry.name}'" in m or f"'{entry.key}'" in m], said
    if not entry.name.startswith("kafka."):
        # The source's own options are read by name: the parser must have looked it up.
        assert entry.key in looked_up


@pytest.mark.parametrize("scope", catalog.SCOPES)
def test_every_name_the_parsers_look_up_is_in_the_catalog(scope, looked_up):
    for entry in catalog.entries(scope):
        if entry.status != catalog.REFUSED:
            parse(scope, options_for(entry, scope))
    known = set(catalog.names())
    assert looked_up, "the parsers looked nothing up: the recording is not in their path"
    assert sorted(looked_up - known) == []


def test_every_kafka_name_the_client_parsers_know_is_in_the_catalog():
    tables = {
        "connection": client_config._CONNECTION_SETTINGS, "tls": client_config._TLS_SETTINGS,
        "fetch": client_config._FETCH_SETTINGS, "group": client_config._GROUP_SETTINGS,
        "ignored": client_config._IGNORED, "jvm only": client_config._JVM_ONLY,
        "oauthbearer": oauthbearer.OPTIONS, "oauthbearer ignored": oauthbearer.IGNORED,
        "source refused": options_module._UNSUPPORTED_KAFKA_PARAMS,
        "producer": sink_options._PRODUCER_INTS, "producer other": sink_options._PRODUCER_OTHER,
        "producer refused": sink_options._UNSUPPORTED,
        "producer ignored": sink_options._IGNORED_PRODUCER,
        # read by name in client_config_from_options
        "special": ("sasl.jaas.config", "ssl.endpoint.identification.algorithm"),
    }
    known = set(catalog.names())
    missing = {table: sorted(f"kafka.{n}" for n in names if f"kafka.{n}" not in known)
               for table, names in tables.items()}
    assert {t: m for t, m in missing.items() if m} == {}


def test_names_are_unique_per_scope_and_every_section_is_known():
    seen = set()
    sections = {title for title, _ in catalog.SECTIONS}
    for entry in catalog.OPTIONS:
        assert entry.section in sections, entry.name
        assert entry.status in (catalog.USED, catalog.IGNORED, catalog.REFUSED)
        assert set(entry.scopes) <= set(catalog.SCOPES) and entry.scopes, entry.name
        assert entry.meaning.strip(), entry.name
        for scope in entry.scopes:
            assert (entry.key, scope) not in seen, f"{entry.name} twice for {scope}"
            seen.add((entry.key, scope))


def test_the_reference_shows_every_entry_with_its_default_from_the_code():
    text = catalog.render_markdown()
    for entry in catalog.OPTIONS:
        assert f"| `{entry.name}` |" in text
    for title, _ in catalog.SECTIONS:
        assert f"## {title}" in text
    lines = {line.split("|")[1].strip(): line for line in text.splitlines()
             if line.startswith("| `")}
    # defaults come from the parsers' and clients' own definitions
    assert f"`{options_module.DEFAULT_SESSION_TIMEOUT_MS}`" in lines["`kafka.session.timeout.ms`"]
    assert "`5`" in lines["`kafka.linger.ms`"]
    assert "`8388608`" in lines["`kafka.max.partition.fetch.bytes`"]
    assert f"`{client_config.RECONNECT_BACKOFF_MAX_MS}`" in \
        lines["`kafka.reconnect.backoff.max.ms`"]
    assert "`pykafka-sink`" in lines["`kafka.transactional.id`"]
    assert "<function" not in text


def test_a_misspelt_option_warns_with_the_nearest_names(caplog):
    with caplog.at_level(logging.WARNING):
        options_module.parse_batch_options({**BASE["read"], "startingOffset": "earliest",
                                            "zzz": "1"})
    assert ("Option 'startingoffset' is not an option of pykafka and is ignored. Did you mean "
            "'startingOffsets'") in caplog.text
    assert "Option 'zzz' is not an option of pykafka and is ignored." in caplog.text


def test_kafka_client_rack_is_accepted_but_says_it_has_no_effect(caplog):
    # A query moved from format("kafka") with follower fetching set keeps working, and is
    # told that its reads still go to the leaders (cross-zone traffic it may pay for).
    with caplog.at_level(logging.WARNING):
        options_module.parse_batch_options({**BASE["read"], "kafka.client.rack": "use1-az1"})
        options_module.parse_stream_options({**BASE["stream"], "kafka.client.rack": "a"})
    said = [r.getMessage() for r in caplog.records if "kafka.client.rack" in r.getMessage()]
    assert len(said) == 2 and all("has no effect" in m and "KIP-392" in m for m in said)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        options_module.parse_batch_options(dict(BASE["read"]))
    assert "client.rack" not in caplog.text


def test_an_option_of_another_kind_of_query_warns_and_spark_pass_through_is_quiet(caplog):
    with caplog.at_level(logging.WARNING):
        options_module.parse_batch_options({**BASE["read"], "maxOffsetsPerTrigger": "5",
                                            "path": "x"})
        sink_options.OncePerProcess.forget_all()
        sink_options.parse_sink_options({**BASE["write"], "checkpointLocation": "/tmp/c",
                                         "queryName": "q", "topic": "t"}, streaming=True)
    assert ("Option(s) 'maxOffsetsPerTrigger' have no effect on a batch read (spark.read) and "
            "are ignored: they are for a stream (spark.readStream).") in caplog.text
    assert "checkpointlocation" not in caplog.text.lower()
    assert "queryname" not in caplog.text.lower()   # writeStream.queryName(...) passes it
    assert "'path'" not in caplog.text
