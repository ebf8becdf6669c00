"""Secret values: never shown by repr/str/format, yet usable where they are handed over."""

import copy
import logging
import pickle

from kafka_source.config.options import parse_batch_options, parse_stream_options
from kafka_source.config.secrets import Secret, reveal
from kafka_source.read.offsets import OffsetRange
from kafka_source.read.planning import KafkaInputPartition, ReadSettings

PASSWORD = "pw-Recognisable-4711"


def test_a_secret_is_never_shown():
    s = Secret(PASSWORD)
    shown = [repr(s), str(s), f"{s}", f"{s!r}", f"{s:>30}", "%s" % s, "%r" % (s,),
             repr([s]), repr({"p": s}), str((s,))]
    assert all(PASSWORD not in text for text in shown)
    assert s.reveal() == PASSWORD and reveal(s) == PASSWORD and reveal("plain") == "plain"


def test_a_secret_compares_hashes_pickles_and_copies_by_value():
    s = Secret(PASSWORD)
    assert s == Secret(PASSWORD) and s != Secret(PASSWORD + "x") and s != PASSWORD
    assert hash(s) == hash(Secret(PASSWORD)) and len({s, Secret(PASSWORD)}) == 1
    assert pickle.loads(pickle.dumps(s)).reveal() == PASSWORD
    assert copy.deepcopy(s).reveal() == PASSWORD and Secret(s).reveal() == PASSWORD
    assert bool(s) and not Secret("")


def test_logging_a_secret_shows_no_value(caplog):
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("test").warning("password is %s (%r)", Secret(PASSWORD),
                                          Secret(PASSWORD))
    assert "password is" in caplog.text and PASSWORD not in caplog.text


SECRET_OPTIONS = {
    "kafka.bootstrap.servers": "127.0.0.1:9093",
    "subscribe": "t",
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule '
                              f'required username="u" password="{PASSWORD}-jaas";',
    "kafka.ssl.truststore.location": "/t.p12",
    "kafka.ssl.truststore.password": f"{PASSWORD}-trust",
    "kafka.ssl.keystore.location": "/k.p12",
    "kafka.ssl.keystore.password": f"{PASSWORD}-keystore",
    "kafka.ssl.key.password": f"{PASSWORD}-key",
}


def test_parsed_options_and_what_travels_to_executors_show_no_secret():
    batch = parse_batch_options(SECRET_OPTIONS)
    stream = parse_stream_options(SECRET_OPTIONS)
    settings = ReadSettings.from_options(batch)
    partition = KafkaInputPartition(0, [OffsetRange("t", 0, 0, 5)], settings)
    for obj in (batch, stream, settings, partition, batch.client_config, settings.client_config):
        assert PASSWORD not in repr(obj) and PASSWORD not in str(obj)
    # ... and the executor still gets every value back
    config = pickle.loads(pickle.dumps(partition)).settings.client_config
    assert config["sasl_plain_password"].reveal() == f"{PASSWORD}-jaas"
    assert config["ssl_truststore_password"].reveal() == f"{PASSWORD}-trust"
    assert config["ssl_keystore_password"].reveal() == f"{PASSWORD}-keystore"
    assert config["ssl_key_password"].reveal() == f"{PASSWORD}-key"


def test_py4j_debug_log_of_option_calls_shows_no_secret_value(caplog):
    from kafka_source.config.client_config import SECRET_OPTIONS
    from kafka_source.config.secrets import redact_py4j_option_logs

    redact_py4j_option_logs(SECRET_OPTIONS)
    redact_py4j_option_logs(SECRET_OPTIONS)  # idempotent
    logger = logging.getLogger("py4j.clientserver")
    assert len(logger.filters) == 1
    jaas = f'org.apache.kafka.common.security.plain.PlainLoginModule required password="{PASSWORD}";'
    with caplog.at_level(logging.DEBUG, logger="py4j"):
        # py4j formats the command before logging it, as here
        for key, value in [("kafka.sasl.jaas.config", jaas), ("kafka.SSL.keystore.password",
                                                               PASSWORD),
                           ("my.token", PASSWORD), ("subscribe", "topic-a")]:
            logger.debug("Command to send: {0}".format(f"c\no42\noption\ns{key}\ns{value}\ne\n"))
        logging.getLogger("py4j.java_gateway").debug(
            "Command to send: c\no7\noption\nskafka.ssl.key.password\ns" + PASSWORD + "\ne\n")
    assert PASSWORD not in caplog.text
    assert "skafka.sasl.jaas.config\ns*****" in caplog.text
    assert "ssubscribe\nstopic-a" in caplog.text  # everything else is logged as it was


def test_executor_connection_cache_tells_passwords_apart_without_showing_them():
    from kafka_source.read.executor import _client_key

    keys = [_client_key(parse_batch_options({**SECRET_OPTIONS,
                                             "kafka.ssl.truststore.password": p}).client_config)
            for p in (PASSWORD + "-a", PASSWORD + "-b", PASSWORD + "-a")]
    assert keys[0] != keys[1] and keys[0] == keys[2] and hash(keys[0]) == hash(keys[2])
    assert PASSWORD not in repr(keys)
